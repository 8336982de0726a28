//! The vSphere (vcsim) and Proxmox VE (fakepve) fixtures the end-to-end suites share:
//! per-test cluster-scoped names, the ProviderClass/VMClass/VMImage/Secret/Provider of
//! each backend, and VMs pinned to them.

use banlieue_test_backends::fakepve::{self, FakePve};
use banlieue_test_backends::libvirtd::Libvirtd;
use banlieue_test_backends::vcsim::{self, Vcsim};
use base64::Engine as _;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use serde_json::{json, Value};

use crate::TestEnv;

pub const VCENTER: &str = "vcenter";
pub const PVE: &str = "pve";
/// The libvirtd Provider.
pub const KVM: &str = "kvm";

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// Per-test names of the cluster-scoped objects (the suite also runs on a shared cluster).
pub struct Names {
    pub provider_class: String,
    pub vm_class: String,
    pub image: String,
}

pub fn names(env: &TestEnv, backend: &str) -> Names {
    let ns = &env.ns;
    Names { provider_class: format!("{ns}-{backend}"), vm_class: format!("{ns}-{backend}-small"), image: format!("{ns}-{backend}-os") }
}

pub fn secret(env: &TestEnv, name: &str, data: &[(&str, &str)]) -> Value {
    let data: serde_json::Map<String, Value> = data.iter().map(|(k, v)| (k.to_string(), json!(b64(v)))).collect();
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": env.ns}, "type": "Opaque", "data": data})
}

pub fn provider_class(name: &str, component: &str, kind: &str) -> Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "ProviderClass", "metadata": {"name": name},
           "spec": {"component": {"source": format!("builtin:{component}")}, "infrastructureKind": kind,
                    "capabilities": {"http": true, "secrets": true}}})
}

pub fn vm_class(name: &str, cpus: u32, memory_mib: u64, disk_gib: u64, storage_class: &str, power_off_timeout: u32) -> Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": name},
           "spec": {"cpus": cpus, "memoryMiB": memory_mib, "disks": [{"name": "root", "sizeGiB": disk_gib, "storageClass": storage_class}],
                    "nics": [{"name": "eth0", "networkClass": "default"}], "powerOffTimeoutSeconds": power_off_timeout}})
}

pub fn vm_image(name: &str, provider_class: &str, template: &str) -> Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": name},
           "spec": {"sources": [{"providerClass": provider_class, "template": template}]}})
}

/// The vSphere ProviderClass, a VMClass, a VMImage on vcsim's template, the credentials Secret
/// (with `password`) and Provider `vcenter` on vcsim. `standard` maps to vcsim's datastore;
/// `ghost` to a datastore vcsim does not have.
pub async fn vsphere_fixtures(env: &TestEnv, vc: &Vcsim, password: &str) -> anyhow::Result<Names> {
    vsphere_fixtures_at(env, &vc.url, password).await
}

/// [`vsphere_fixtures`] with the Provider's endpoint at `endpoint` (vcsim behind a proxy).
pub async fn vsphere_fixtures_at(env: &TestEnv, endpoint: &str, password: &str) -> anyhow::Result<Names> {
    let n = names(env, "vsphere");
    for object in [
        provider_class(&n.provider_class, "provider-vsphere", "VSphere"),
        vm_class(&n.vm_class, 2, 2048, 10, "standard", 10),
        vm_image(&n.image, &n.provider_class, vcsim::TEMPLATE),
        secret(env, "vcenter-credentials", &[("username", vcsim::USERNAME), ("password", password)]),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": VCENTER, "namespace": env.ns},
               "spec": {"providerClassRef": {"name": n.provider_class},
                        "connection": {"endpoint": endpoint,
                                       "credentialsRef": {"kind": "Secret", "name": "vcenter-credentials", "keys": ["username", "password"]}},
                        "capabilities": {"storageClasses": {"standard": "LocalDS_0", "ghost": "no-such-datastore"},
                                         "networkClasses": {"default": "VM Network"}}}}),
    ] {
        env.apply(object).await?;
    }
    Ok(n)
}

/// How the Proxmox Provider reaches fakepve.
pub enum PveEndpoint {
    /// Plain http through the fixture's counting proxy (logins are counted).
    Proxy,
    /// fakepve's own https with its certificate as the Provider's CA bundle.
    Https,
    /// A plain-http URL in front of the counting proxy (a fault proxy).
    At(String),
}

/// The Proxmox ProviderClass, a VMClass, a VMImage on fakepve's template (by VMID), the
/// credentials Secret (with `password`) and Provider `pve`.
pub async fn proxmox_fixtures(env: &TestEnv, pve: &FakePve, password: &str, endpoint: PveEndpoint) -> anyhow::Result<Names> {
    let n = names(env, "proxmox");
    let connection = match endpoint {
        PveEndpoint::Proxy => json!({"endpoint": pve.proxy_url}),
        PveEndpoint::Https => json!({"endpoint": pve.url, "caBundle": pve.ca_pem}),
        PveEndpoint::At(url) => json!({"endpoint": url}),
    };
    let mut connection = connection;
    connection["credentialsRef"] = json!({"kind": "Secret", "name": "pve-credentials", "keys": ["username", "password"]});
    for object in [
        provider_class(&n.provider_class, "provider-proxmox", "Proxmox"),
        vm_class(&n.vm_class, 2, 2048, 4, "standard", 5),
        vm_image(&n.image, &n.provider_class, &fakepve::TEMPLATE_VMID.to_string()),
        secret(env, "pve-credentials", &[("username", &pve.username), ("password", password)]),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": PVE, "namespace": env.ns},
               "spec": {"providerClassRef": {"name": n.provider_class}, "connection": connection,
                        "capabilities": {"storageClasses": {"standard": "local-lvm"}, "networkClasses": {"default": "vmbr0"}}}}),
    ] {
        env.apply(object).await?;
    }
    Ok(n)
}

pub fn vm(env: &TestEnv, name: &str, n: &Names, provider: &str, extra: Value) -> Value {
    let mut spec = json!({"classRef": {"name": n.vm_class}, "imageRef": {"name": n.image},
                          "placement": {"providerRef": {"name": provider}}});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name, "namespace": env.ns}, "spec": spec})
}

/// A Proxmox VM: pinned to node pve1, where the template's disk (on non-shared local-lvm) is.
pub fn pve_vm(env: &TestEnv, name: &str, n: &Names, extra: Value) -> Value {
    let mut v = vm(env, name, n, PVE, extra);
    v["spec"]["placement"]["failureDomainSelector"] = json!({"matchLabels": {"banlieue.io/failure-domain": "pve1"}});
    v
}

pub fn machines(env: &TestEnv, kind: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("infrastructure.banlieue.io", "v1alpha1", &format!("{kind}Machine"));
    Api::namespaced_with(env.client.clone(), &env.ns, &ApiResource::from_gvk_with_plural(&gvk, &format!("{}machines", kind.to_ascii_lowercase())))
}

pub fn libvirt_provider_class(name: &str) -> Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "ProviderClass", "metadata": {"name": name},
           "spec": {"component": {"source": "builtin:provider-libvirt"}, "infrastructureKind": "Libvirt", "capabilities": {"libvirt": true}}})
}

/// Provider `name` on the shared libvirtd: `standard` is its pool, `default` its DHCP network.
pub fn libvirtd_provider(env: &TestEnv, lv: &Libvirtd, name: &str, class: &str) -> Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": name, "namespace": env.ns},
           "spec": {"providerClassRef": {"name": class}, "connection": {"endpoint": lv.uri},
                    "capabilities": {"storageClasses": {"standard": lv.pool}, "networkClasses": {"default": lv.network}}}})
}

/// The libvirt ProviderClass, a VMClass for the test guest (1 CPU, 256 MiB), a VMImage on its
/// disk, and Provider `kvm` on libvirtd.
pub async fn libvirtd_fixtures(env: &TestEnv, lv: &Libvirtd) -> anyhow::Result<Names> {
    let n = names(env, "libvirt");
    for object in [
        libvirt_provider_class(&n.provider_class),
        vm_class(&n.vm_class, 1, 256, 2, "standard", 30),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": n.image},
               "spec": {"sources": [{"providerClass": n.provider_class, "backingFile": lv.guest_disk()}]}}),
        libvirtd_provider(env, lv, KVM, &n.provider_class),
    ] {
        env.apply(object).await?;
    }
    Ok(n)
}

/// Where a VM named `name` exists, asked of each backend's own API (vim25, the PVE API, virsh):
/// (vcsim, fakepve, libvirtd) counts.
pub async fn census(env: &TestEnv, vc: &Vcsim, pve: &FakePve, lv: &Libvirtd, name: &str) -> anyhow::Result<(usize, usize, usize)> {
    let on_vsphere = vc.vm_names().await?.iter().filter(|n| **n == format!("{}_{name}", env.ns)).count();
    let on_proxmox = pve.vms().await?.iter().filter(|v| v.name == format!("{name}.{}", env.ns)).count();
    let domain = format!("{}_{name}", env.ns);
    let on_libvirt = lv.domains(&domain)?.iter().filter(|d| **d == domain).count();
    Ok((on_vsphere, on_proxmox, on_libvirt))
}

/// ProviderClasses, a VMClass, one VMImage with a source per class, and a Provider on each of
/// vcsim (`VCENTER`), fakepve (`PVE`) and libvirtd (`KVM`): what lets one VM land anywhere.
/// The names of the vSphere class, the VMClass and the image.
pub async fn three_backends(env: &TestEnv, vc: &Vcsim, pve: &FakePve, lv: &Libvirtd) -> anyhow::Result<Names> {
    let ns = &env.ns;
    let (vsphere, proxmox, libvirt_class) = (format!("{ns}-vsphere"), format!("{ns}-proxmox"), format!("{ns}-libvirt"));
    let (class, image) = (format!("{ns}-any-small"), format!("{ns}-any-os"));
    for object in [
        provider_class(&vsphere, "provider-vsphere", "VSphere"),
        provider_class(&proxmox, "provider-proxmox", "Proxmox"),
        libvirt_provider_class(&libvirt_class),
        vm_class(&class, 1, 256, 4, "standard", 30),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": image},
               "spec": {"sources": [{"providerClass": vsphere, "template": vcsim::TEMPLATE},
                                    {"providerClass": proxmox, "template": fakepve::TEMPLATE_VMID.to_string()},
                                    {"providerClass": libvirt_class, "backingFile": lv.guest_disk()}]}}),
        secret(env, "vcenter-credentials", &[("username", vcsim::USERNAME), ("password", vcsim::PASSWORD)]),
        secret(env, "pve-credentials", &[("username", &pve.username), ("password", &pve.password)]),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": VCENTER, "namespace": ns},
               "spec": {"providerClassRef": {"name": vsphere},
                        "connection": {"endpoint": vc.url, "credentialsRef": {"kind": "Secret", "name": "vcenter-credentials", "keys": ["username", "password"]}},
                        "capabilities": {"storageClasses": {"standard": "LocalDS_0"}, "networkClasses": {"default": "VM Network"}}}}),
        // shared-dir is on every node, so the clone may land on either.
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": PVE, "namespace": ns},
               "spec": {"providerClassRef": {"name": proxmox},
                        "connection": {"endpoint": pve.url, "caBundle": pve.ca_pem,
                                       "credentialsRef": {"kind": "Secret", "name": "pve-credentials", "keys": ["username", "password"]}},
                        "capabilities": {"storageClasses": {"standard": "shared-dir"}, "networkClasses": {"default": "vmbr0"}}}}),
        libvirtd_provider(env, lv, KVM, &libvirt_class),
    ] {
        env.apply(object).await?;
    }
    Ok(Names { provider_class: vsphere, vm_class: class, image })
}
