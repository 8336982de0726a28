//! VMImages with `url` sources, end to end: the imagebuilder role downloads each into
//! its image cache from a real HTTP server (started here), verifies the declared sha256
//! and inspects it with qemu-img, and says so in the VMImage's `Fetched` condition; bad
//! sources get a condition naming the problem and leave nothing in the cache. On the
//! embedded server the roles run as their ServiceAccounts with `deploy/base/rbac.yaml`.

use anyhow::Context as _;
use std::collections::BTreeMap;

use banlieue_api::VMImage;
use banlieue_imagebuilder::Digest;
use banlieue_tests::control::{wait_for, ControlPlane};
use banlieue_tests::files::{Answer, FileServer};
use banlieue_tests::TestEnv;
use kube::api::{Api, DeleteParams};
use kube::ResourceExt as _;
use serde_json::json;
use sha2::Digest as _;

fn checksum(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

/// A real qcow2 disk of `mib` MiB (virtual) made by qemu-img.
fn qcow2(dir: &std::path::Path, mib: u32) -> anyhow::Result<Vec<u8>> {
    let path = dir.join("served.qcow2");
    let out = std::process::Command::new("qemu-img").args(["create", "-q", "-f", "qcow2"]).arg(&path).arg(format!("{mib}M")).output()?;
    anyhow::ensure!(out.status.success(), "qemu-img create: {}", String::from_utf8_lossy(&out.stderr));
    Ok(std::fs::read(path)?)
}

/// A VMImage named `<ns>-<name>` with one libvirt source `url` (and `checksum` when given).
async fn image(env: &TestEnv, name: &str, url: &str, checksum: Option<&str>) -> anyhow::Result<String> {
    let name = format!("{}-{name}", env.ns);
    let mut source = json!({"providerClass": env.libvirt_class(), "url": url});
    if let Some(c) = checksum {
        source["checksum"] = json!(c);
    }
    env.apply(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": name}, "spec": {"sources": [source]}})).await?;
    Ok(name)
}

/// Wait until `Fetched` has `status` and `reason`; its message.
async fn fetched(env: &TestEnv, name: &str, status: &str, reason: &str) -> anyhow::Result<String> {
    let images: Api<VMImage> = Api::all(env.client.clone());
    let cond = |i: &VMImage| i.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "Fetched").cloned());
    let i = wait_for(&images, name, 60, &format!("Fetched={status}/{reason}"), |i: Option<&VMImage>| {
        i.and_then(cond).is_some_and(|c| c.status == status && c.reason == reason)
    })
    .await?;
    Ok(cond(&i).map(|c| c.message).unwrap_or_default())
}

/// A libvirt ProviderClass `class` and Provider `kvm` on the shared libvirtd.
fn libvirt_provider(ns: &str, class: &str, lv: &banlieue_test_backends::libvirtd::Libvirtd) -> [serde_json::Value; 2] {
    [
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "ProviderClass", "metadata": {"name": class},
               "spec": {"component": {"source": "builtin:provider-libvirt"}, "infrastructureKind": "Libvirt", "capabilities": {"libvirt": true}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "kvm", "namespace": ns},
               "spec": {"providerClassRef": {"name": class}, "connection": {"endpoint": lv.uri},
                        "capabilities": {"storageClasses": {"standard": lv.pool}, "networkClasses": {"default": lv.network}}}}),
    ]
}

/// ProviderClasses `vsphere` (imageFormat vmdk) and `proxmox` (source), their credentials and
/// Providers `vcenter` (on vcsim) and `pve` (on fakepve); each Provider's first storage class
/// is where images land.
fn template_providers(ns: &str, vsphere: &str, proxmox: &str, vc: &banlieue_test_backends::vcsim::Vcsim, pve: &banlieue_test_backends::fakepve::FakePve) -> Vec<serde_json::Value> {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let class = |name: &str, component: &str, kind: &str, format: &str| {
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "ProviderClass", "metadata": {"name": name},
               "spec": {"component": {"source": format!("builtin:{component}")}, "infrastructureKind": kind,
                        "capabilities": {"http": true, "secrets": true}, "imageFormat": format}})
    };
    vec![
        class(vsphere, "provider-vsphere", "VSphere", "vmdk"),
        class(proxmox, "provider-proxmox", "Proxmox", "source"),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "vcenter", "namespace": ns},
               "data": {"username": b64(banlieue_test_backends::vcsim::USERNAME), "password": b64(banlieue_test_backends::vcsim::PASSWORD)}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pve", "namespace": ns},
               "data": {"username": b64(&pve.username), "password": b64(&pve.password)}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "vcenter", "namespace": ns},
               "spec": {"providerClassRef": {"name": vsphere},
                        "connection": {"endpoint": vc.url, "credentialsRef": {"kind": "Secret", "name": "vcenter", "keys": ["username", "password"]}},
                        "capabilities": {"storageClasses": {"standard": "LocalDS_0"}, "networkClasses": {"default": "VM Network"}}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "pve", "namespace": ns},
               "spec": {"providerClassRef": {"name": proxmox},
                        "connection": {"endpoint": pve.url, "caBundle": pve.ca_pem, "credentialsRef": {"kind": "Secret", "name": "pve", "keys": ["username", "password"]}},
                        "capabilities": {"storageClasses": {"standard": "shared-dir"}, "networkClasses": {"default": "vmbr0"}}}}),
    ]
}

/// A condition `type_` of the VMImage with `status` (any when `None`) and `reason` (any when empty).
fn image_has(i: Option<&VMImage>, type_: &str, status: Option<&str>, reason: &str) -> bool {
    i.and_then(|i| i.status.as_ref())
        .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == type_ && status.is_none_or(|st| c.status == st) && (reason.is_empty() || c.reason == reason)))
}

fn vm_ready(v: Option<&banlieue_api::VirtualMachine>) -> bool {
    v.and_then(|v| v.status.as_ref()).is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// VM `name` of `image` on Provider `kvm` (class `<ns>-small`, made here) with a user-data
/// marker: wait until it is Ready and its guest prints the marker. Its libvirt domain.
async fn boot_on_kvm(env: &TestEnv, lv: &banlieue_test_backends::libvirtd::Libvirtd, image: &str, name: &str, marker: &str) -> anyhow::Result<String> {
    use base64::Engine;
    let ns = &env.ns;
    let user_data = base64::engine::general_purpose::STANDARD.encode(format!("#cloud-config\n#banlieue-marker: {marker}\n"));
    for object in [
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": format!("{ns}-small")},
               "spec": {"cpus": 1, "memoryMiB": 256, "disks": [{"name": "root", "sizeGiB": 2, "storageClass": "standard"}],
                        "nics": [{"name": "eth0", "networkClass": "default"}]}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": format!("{name}-user-data"), "namespace": ns}, "data": {"user-data": user_data}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name, "namespace": ns},
               "spec": {"classRef": {"name": format!("{ns}-small")}, "imageRef": {"name": image},
                        "placement": {"providerRef": {"name": "kvm"}}, "powerOffMode": "Hard",
                        "userData": {"name": format!("{name}-user-data"), "key": "user-data"}}}),
    ] {
        env.apply(object).await?;
    }
    let vms: Api<banlieue_api::VirtualMachine> = Api::namespaced(env.client.clone(), ns);
    wait_for(&vms, name, 180, "Ready", vm_ready).await?;
    let domain = format!("{ns}_{name}");
    let want = format!("banlieue-guest: marker={marker}");
    lv.await_serial(&domain, &want, 180).await?;
    Ok(domain)
}

#[tokio::test]
async fn url_images_are_fetched_verified_and_bad_ones_say_why() -> anyhow::Result<()> {
    let env = TestEnv::start("images").await?;
    env.install_crds().await?;
    let cp = ControlPlane::start_as_installed(&env).await?;
    let disk = qcow2(env.dir(), 64)?;
    let text = b"#!/bin/sh\necho this is no disk\n".to_vec();
    let server = FileServer::start(BTreeMap::from([
        ("/debian.qcow2".to_string(), Answer::Bytes(disk.clone())),
        ("/notes.txt".to_string(), Answer::Bytes(text.clone())),
        ("/huge.raw".to_string(), Answer::Announce(16 << 30)),
    ]))
    .await?;
    let cache = cp.ctx.images.clone().expect("tests configure an image cache");

    // A good source: downloaded, verified, inspected; the cache holds exactly those bytes.
    let good = image(&env, "debian", &server.url("/debian.qcow2"), Some(&checksum(&disk))).await?;
    let message = fetched(&env, &good, "True", "Fetched").await?;
    assert!(message.contains("qcow2") && message.contains(&format!("virtual size {}", 64 << 20)), "{message}");
    let entry = cache.get(&Digest::parse(&checksum(&disk))?)?.expect("the image is in the cache");
    let mut cached = Vec::new();
    std::io::Read::read_to_end(&mut cache.open_entry(&entry)?, &mut cached)?;
    assert_eq!(checksum(&cached), checksum(&disk));

    // The cache is content-addressed: another URL with the same checksum needs no download.
    let mirror = image(&env, "mirror", &server.url("/gone/debian.qcow2"), Some(&checksum(&disk))).await?;
    fetched(&env, &mirror, "True", "Fetched").await?;

    // Bad sources, each named in the condition; nothing of them is kept.
    let used = cache.usage()?;
    let cases = [
        ("wrong-sum", server.url("/debian.qcow2"), Some(checksum(b"another image")), "ChecksumMismatch", "not the declared"),
        ("missing", server.url("/missing.qcow2"), Some(checksum(b"missing")), "FetchFailed", "404"),
        ("ftp", "ftp://127.0.0.1/debian.qcow2".to_string(), Some(checksum(&disk)), "URLNotAllowed", "ftp"),
        ("no-sum", server.url("/debian.qcow2"), None, "InvalidSpec", "needs a checksum"),
        ("not-a-disk", server.url("/notes.txt"), Some(checksum(&text)), "NotADiskImage", "not whole 512-byte sectors"),
        ("huge", server.url("/huge.raw"), Some(checksum(b"huge")), "ImageTooLarge", "more than the image cache holds"),
    ];
    for (name, url, sum, reason, says) in cases {
        let name = image(&env, name, &url, sum.as_deref()).await?;
        let message = fetched(&env, &name, "False", reason).await?;
        assert!(message.contains(says) && message.contains(&url), "{name}: {message}");
    }
    // The text file was verified and kept (its checksum is right); nothing else was added.
    assert_eq!(cache.usage()?, used + text.len() as u64);

    // A fixed source recovers without a restart.
    let images: Api<VMImage> = Api::all(env.client.clone());
    let fixed = image(&env, "wrong-sum", &server.url("/debian.qcow2"), Some(&checksum(&disk))).await?;
    fetched(&env, &fixed, "True", "Fetched").await?;
    for i in images.list(&Default::default()).await?.items.into_iter().filter(|i| i.metadata.name.as_deref().is_some_and(|n| n.starts_with(&env.ns))) {
        images.delete(&i.metadata.name.unwrap_or_default(), &DeleteParams::default()).await?;
    }
    assert_eq!(cp.permissions_complete(), Ok(()));
    Ok(())
}

#[tokio::test]
async fn a_url_image_is_imported_into_a_libvirtd_provider_by_the_host_and_a_guest_boots_from_it() -> anyhow::Result<()> {
    use banlieue_api::class::ImportPhase;
    use banlieue_api::VirtualMachine;
    use banlieue_test_backends::libvirtd::Libvirtd;

    let env = TestEnv::start("image-import").await?;
    env.install_crds().await?;
    let lv = Libvirtd::shared()?;
    let cp = ControlPlane::start_as_installed(&env).await?;
    let ns = env.ns.clone();
    let disk = std::fs::read(lv.guest_disk())?;
    let sum = checksum(&disk);
    let server = FileServer::start(BTreeMap::from([("/guest.qcow2".to_string(), Answer::Bytes(disk.clone()))])).await?;
    let (class, image) = (format!("{ns}-lv"), format!("{ns}-guest"));
    let _leftovers = banlieue_test_backends::libvirtd::Leftovers { lv, prefix: format!("{ns}_"), volumes: vec![format!("image@{image}@")] };
    let vmimage = json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": image},
                         "spec": {"sources": [{"providerClass": class, "url": server.url("/guest.qcow2"), "checksum": sum}]}});
    for object in libvirt_provider(&ns, &class, &lv).into_iter().chain([vmimage]) {
        env.apply(object).await?;
    }

    // The VMImage says it is on the Provider, with the volume as the reference.
    let images: Api<VMImage> = Api::all(env.client.clone());
    let imported = wait_for(&images, &image, 120, "Ready (imported)", |i: Option<&VMImage>| image_has(i, "Ready", Some("True"), "")).await?;
    let on_kvm = imported.status.as_ref().map(|s| s.providers.clone()).unwrap_or_default();
    assert_eq!(on_kvm.len(), 1, "{on_kvm:?}");
    assert_eq!((on_kvm[0].provider.as_str(), on_kvm[0].phase, on_kvm[0].digest.as_deref()), (format!("{ns}/kvm").as_str(), ImportPhase::Ready, Some(sum.as_str())));
    // libvirtd's view: the volume exists, at the path reported, holding the qcow2 the cache made
    // of the download (the download was qcow2 already: the same image, virtual size and all).
    let volume = format!("image@{image}@{}", &sum[7..19]);
    let path = lv.virsh(&["vol-path", "--pool", &lv.pool, &volume])?.trim().to_string();
    assert_eq!(on_kvm[0].reference.as_deref(), Some(path.as_str()));
    let info = |p: &str| -> anyhow::Result<serde_json::Value> {
        let out = std::process::Command::new("qemu-img").args(["info", "--output=json", "-U", p]).output()?;
        Ok(serde_json::from_slice(&out.stdout)?)
    };
    assert_eq!(info(&path)?["virtual-size"], info(&lv.guest_disk())?["virtual-size"]);
    assert_eq!(info(&path)?["format"], "qcow2");

    // A VM of that image boots from the imported volume on that Provider.
    let domain = boot_on_kvm(&env, &lv, &image, "web", "booted-from-imported-image").await?;
    let root = lv.virsh(&["vol-dumpxml", "--pool", &lv.pool, &format!("{domain}_root.qcow2")])?;
    assert!(root.contains(&path), "the VM's disk is backed by the imported volume: {root}");
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &ns);

    // Deleting the VMImage is refused while the VM uses it; then the import goes with it.
    images.delete(&image, &DeleteParams::default()).await?;
    let held = wait_for(&images, &image, 60, "Ready=False/InUse", |i: Option<&VMImage>| image_has(i, "Ready", Some("False"), "InUse")).await?;
    let message = held.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready")).map(|c| c.message.clone()).unwrap_or_default();
    assert!(message.contains(&format!("{ns}/web")), "{message}");
    assert_eq!(lv.volumes(&format!("image@{image}@"))?, vec![volume.clone()], "nothing removed while in use");
    vms.delete("web", &DeleteParams::default()).await?;
    banlieue_tests::await_deleted(&vms, "web").await?;
    banlieue_tests::await_deleted(&images, &image).await?;
    assert!(lv.volumes(&format!("image@{image}@"))?.is_empty(), "the imported volume is gone from libvirt");
    assert_eq!(cp.permissions_complete(), Ok(()));
    Ok(())
}

/// One VMImage with a `url` source for a vSphere class and a Proxmox VE class: the image
/// builder converts it per class (`imageFormat` vmdk / source) and each driver imports it
/// as a template — on vcsim through an `ImportVApp` lease the host streams the VMDK to, on
/// fakepve through `download-url` + `import-from` — then a VM on each clones from it. A new
/// source is imported as a new revision; the old one stays until its VMs are gone. Deleting
/// the VMImage removes the templates. Checked on vcsim's and fakepve's own APIs.
#[tokio::test]
async fn a_url_image_becomes_a_template_on_vsphere_and_proxmox_revisions_stay_while_used() -> anyhow::Result<()> {
    use banlieue_api::class::ImportPhase;
    use banlieue_api::VirtualMachine;
    use banlieue_test_backends::fakepve::FakePve;
    use banlieue_test_backends::vcsim::Vcsim;

    let env = TestEnv::start("image-templates").await?;
    env.install_crds().await?;
    let vc = Vcsim::start().await?;
    let pve = FakePve::start().await?;
    let cp = ControlPlane::start_as_installed(&env).await?;
    let ns = env.ns.clone();
    let disk = qcow2(env.dir(), 64)?;
    let sum = checksum(&disk);
    let server = FileServer::start(BTreeMap::from([("/os.qcow2".to_string(), Answer::Bytes(disk.clone()))])).await?;
    let url = server.url("/os.qcow2");
    let (vsphere, proxmox, image, small) = (format!("{ns}-vsphere"), format!("{ns}-proxmox"), format!("{ns}-os"), format!("{ns}-small"));
    let vmimage = json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": image},
                         "spec": {"sources": [{"providerClass": vsphere, "url": url, "checksum": sum}, {"providerClass": proxmox, "url": url, "checksum": sum}]}});
    for object in template_providers(&ns, &vsphere, &proxmox, &vc, &pve).into_iter().chain([vmimage]) {
        env.apply(object).await?;
    }

    // Ready on both Providers, each reference the template the driver made.
    let images: Api<VMImage> = Api::all(env.client.clone());
    let imported = wait_for(&images, &image, 120, "Ready (imported on both)", |i: Option<&VMImage>| image_has(i, "Ready", Some("True"), "")).await?;
    let mut imports = imported.status.as_ref().map(|s| s.providers.clone()).unwrap_or_default();
    imports.sort_by(|a, b| a.provider.cmp(&b.provider));
    let template = format!("image-{image}-{}", &sum[7..19]);
    let seen: Vec<(String, ImportPhase, Option<String>)> = imports.iter().map(|i| (i.provider.clone(), i.phase, i.reference.clone())).collect();
    assert_eq!(seen, vec![(format!("{ns}/pve"), ImportPhase::Ready, Some(template.clone())), (format!("{ns}/vcenter"), ImportPhase::Ready, Some(template.clone()))]);

    // vcsim: the template exists, and its NFC handler received one stream-optimised VMDK of the
    // image (what qemu-img makes of it), sent by the host.
    assert_eq!(vc.is_template(&template).await?, Some(true));
    let vmdk = env.dir().join("expected.vmdk");
    let served = env.dir().join("served.qcow2");
    let out = std::process::Command::new("qemu-img").args(["convert", "-O", "vmdk", "-o", "subformat=streamOptimized"]).arg(&served).arg(&vmdk).output()?;
    anyhow::ensure!(out.status.success(), "qemu-img convert: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(vc.nfc_uploads()?.iter().map(|(_, n)| *n).collect::<Vec<_>>(), vec![std::fs::metadata(&vmdk)?.len()]);
    // fakepve: asked to download the URL, a template whose disk is imported from that file,
    // and the file removed again (fakepve does not fetch URLs: the bytes are not checked here).
    let templates: Vec<_> = pve.vms().await?.into_iter().filter(|v| v.name == template).collect();
    assert!(templates.len() == 1 && templates[0].template, "{templates:?}");
    let config = pve.vm_config(&templates[0].node, templates[0].vmid).await?;
    assert!(config["scsi0"].as_str().unwrap_or("").contains(&format!("import-from=local:import/{template}.qcow2")), "{config}");
    let mut downloads = Vec::new();
    for node in ["pve1", "pve2"] {
        for t in pve.tasks(node).await?.into_iter().filter(|t| t["type"] == "download") {
            downloads.push(pve.task_log(node, t["upid"].as_str().unwrap_or("")).await?.join("\n"));
        }
        assert!(pve.storage_content(node, "local", Some("import")).await?.is_empty(), "no downloaded file left on {node}");
    }
    assert!(downloads.len() == 1 && downloads[0].contains(&url), "{downloads:?}");

    // A VM on each Provider clones from the imported template.
    env.apply(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": small},
           "spec": {"cpus": 1, "memoryMiB": 512, "disks": [{"name": "root", "sizeGiB": 1, "storageClass": "standard"}],
                    "nics": [{"name": "eth0", "networkClass": "default"}]}})).await?;
    for provider in ["vcenter", "pve"] {
        env.apply(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": format!("on-{provider}"), "namespace": ns},
               "spec": {"classRef": {"name": small}, "imageRef": {"name": image}, "placement": {"providerRef": {"name": provider}}}})).await?;
    }
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &ns);
    for provider in ["vcenter", "pve"] {
        wait_for(&vms, &format!("on-{provider}"), 120, "Ready", vm_ready).await?;
    }
    assert!(vc.vm_names().await?.contains(&format!("{ns}_on-vcenter")), "vcsim has the clone");
    assert!(pve.vms().await?.iter().any(|v| v.name == format!("on-pve.{ns}") && !v.template), "fakepve has the clone");

    // Each VM says what it was made from: the template of the first digest.
    for provider in ["vcenter", "pve"] {
        let vm = vms.get(&format!("on-{provider}")).await?;
        assert_eq!(vm.status.and_then(|s| s.scheduled).and_then(|s| s.image).as_deref(), Some(template.as_str()), "on-{provider}");
    }

    // A new source: imported as a new revision beside the old one, which stays while VMs use it.
    let disk2 = {
        let path = env.dir().join("second.qcow2");
        let out = std::process::Command::new("qemu-img").args(["create", "-q", "-f", "qcow2"]).arg(&path).arg("32M").output()?;
        anyhow::ensure!(out.status.success(), "qemu-img create: {}", String::from_utf8_lossy(&out.stderr));
        std::fs::read(path)?
    };
    let sum2 = checksum(&disk2);
    let server2 = FileServer::start(BTreeMap::from([("/os-2.qcow2".to_string(), Answer::Bytes(disk2.clone()))])).await?;
    let url2 = server2.url("/os-2.qcow2");
    env.apply(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": image},
           "spec": {"sources": [{"providerClass": vsphere, "url": url2, "checksum": sum2}, {"providerClass": proxmox, "url": url2, "checksum": sum2}]}})).await?;
    let on_second = |i: Option<&VMImage>| {
        i.and_then(|i| i.status.as_ref()).is_some_and(|s| {
            s.providers.len() == 2 && s.providers.iter().all(|p| p.phase == ImportPhase::Ready && p.digest.as_deref() == Some(sum2.as_str()))
        })
    };
    let second = wait_for(&images, &image, 120, "both Providers on the second digest", on_second).await?;
    let template2 = format!("image-{image}-{}", &sum2[7..19]);
    let mut retired: Vec<(String, Option<String>)> = second.status.clone().unwrap_or_default().retired.iter().map(|r| (r.provider.clone(), r.reference.clone())).collect();
    retired.sort();
    assert_eq!(retired, vec![(format!("{ns}/pve"), Some(template.clone())), (format!("{ns}/vcenter"), Some(template.clone()))]);
    assert_eq!((vc.is_template(&template).await?, vc.is_template(&template2).await?), (Some(true), Some(true)), "both revisions on vCenter");
    let names: Vec<String> = pve.vms().await?.into_iter().filter(|v| v.template).map(|v| v.name).collect();
    assert!(names.contains(&template) && names.contains(&template2), "both revisions on Proxmox VE: {names:?}");

    // The VMs made from the first revision go: so does it, from both backends.
    for provider in ["vcenter", "pve"] {
        vms.delete(&format!("on-{provider}"), &DeleteParams::default()).await?;
    }
    for provider in ["vcenter", "pve"] {
        banlieue_tests::await_deleted(&vms, &format!("on-{provider}")).await?;
    }
    let released = |i: Option<&VMImage>| i.and_then(|i| i.status.as_ref()).is_some_and(|s| s.retired.is_empty());
    wait_for(&images, &image, 60, "the first revision released", released).await?;
    assert_eq!((vc.is_template(&template).await?, vc.is_template(&template2).await?), (None, Some(true)), "only the second revision is left on vCenter");
    let names: Vec<String> = pve.vms().await?.into_iter().map(|v| v.name).collect();
    assert!(!names.contains(&template) && names.contains(&template2), "only the second revision is left on Proxmox VE: {names:?}");

    // A new VM is made from the second revision; deleting the VMImage waits for it, then
    // removes the template from both backends.
    env.apply(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": "later", "namespace": ns},
           "spec": {"classRef": {"name": small}, "imageRef": {"name": image}, "placement": {"providerRef": {"name": "vcenter"}}}})).await?;
    let later = wait_for(&vms, "later", 120, "Ready", vm_ready).await?;
    assert_eq!(later.status.and_then(|s| s.scheduled).and_then(|s| s.image).as_deref(), Some(template2.as_str()));
    images.delete(&image, &DeleteParams::default()).await?;
    wait_for(&images, &image, 60, "Ready=False/InUse", |i: Option<&VMImage>| image_has(i, "Ready", Some("False"), "InUse")).await?;
    assert_eq!(vc.is_template(&template2).await?, Some(true), "nothing removed while in use");
    vms.delete("later", &DeleteParams::default()).await?;
    banlieue_tests::await_deleted(&vms, "later").await?;
    banlieue_tests::await_deleted(&images, &image).await?;
    assert_eq!(vc.is_template(&template2).await?, None, "the template is gone from vCenter");
    assert!(!pve.vms().await?.iter().any(|v| v.name.starts_with(&format!("image-{image}-"))), "the templates are gone from Proxmox VE");
    assert_eq!(cp.permissions_complete(), Ok(()));
    Ok(())
}

/// A VMImage built by kairos-operator, whose part the test plays as its API documents it:
/// the image builder creates the OSArtifact (owned by the VMImage, with banlieue's exporter
/// Job), the test moves its phase through Building and Exporting, acts as the exporter by
/// pushing a real bootable disk (`.raw`, as kairos builds them) to the registry reference
/// the Job names, then sets Ready; the image builder resolves the pushed layer, fetches and
/// verifies it, imports it into libvirtd, vcsim and fakepve, and a VM boots from it on
/// libvirtd. A build that ends in Error says why; deleting the VMImage removes its
/// OSArtifact and its imports everywhere.
#[tokio::test]
async fn a_built_image_goes_from_osartifact_to_every_backend_and_boots() -> anyhow::Result<()> {
    use banlieue_api::VirtualMachine;
    use banlieue_test_backends::fakepve::FakePve;
    use banlieue_test_backends::libvirtd::Libvirtd;
    use banlieue_test_backends::registry::Registry;
    use banlieue_test_backends::vcsim::Vcsim;
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};

    let env = TestEnv::start("image-build").await?;
    env.install_crds().await?;
    let crd = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("images/osartifact-crd.yaml");
    env.kubectl(&["apply", "--server-side", "-f", &crd.to_string_lossy()]).await?;
    let registry = Registry::start().await?;
    let lv = Libvirtd::shared()?;
    let repository = "banlieue/images";
    let build_registry = format!("{}/{repository}", registry.host);
    let cp = ControlPlane::start_as_installed_with(&env, |o| {
        o.image_build = Some(banlieue_controller::ImageBuildOptions { registry: build_registry.clone(), exporter_image: "oras:test".into() })
    })
    .await?;
    let vc = Vcsim::start().await?;
    let pve = FakePve::start().await?;
    let ns = env.ns.clone();
    let _leftovers = banlieue_test_backends::libvirtd::Leftovers { lv, prefix: format!("{ns}_"), volumes: vec![format!("image@{ns}-")] };
    let (class, vsphere, proxmox) = (format!("{ns}-lv"), format!("{ns}-vsphere"), format!("{ns}-proxmox"));
    let (image, broken) = (format!("{ns}-kairos"), format!("{ns}-broken"));
    let build = json!({"osArtifact": {"image": {"ref": "quay.io/kairos/ubuntu:24.04-core-amd64-generic-v3.5.0"},
                                      "artifacts": {"arch": "amd64", "cloudImage": true, "diskSize": "4096"}}});
    // Sources that name no location take the build, on all three backends.
    let sources = json!([{"providerClass": class}, {"providerClass": vsphere}, {"providerClass": proxmox}]);
    let vmimages = [image.clone(), broken.clone()].map(|name| {
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": name}, "spec": {"build": build, "sources": sources}})
    });
    for object in libvirt_provider(&ns, &class, &lv).into_iter().chain(template_providers(&ns, &vsphere, &proxmox, &vc, &pve)).chain(vmimages) {
        env.apply(object).await?;
    }

    // The OSArtifact, as kairos-operator would find it.
    let gvk = GroupVersionKind::gvk("build.kairos.io", "v1alpha2", "OSArtifact");
    let artifacts: Api<DynamicObject> = Api::namespaced_with(env.client.clone(), banlieue_tests::SYSTEM_NAMESPACE, &ApiResource::from_gvk_with_plural(&gvk, "osartifacts"));
    let name = format!("{image}-1");
    let artifact = match wait_for(&artifacts, &name, 60, "the OSArtifact", |a: Option<&DynamicObject>| a.is_some()).await {
        Ok(a) => a,
        Err(e) => anyhow::bail!("{e}; the VMImage: {:?}", Api::<VMImage>::all(env.client.clone()).get(&image).await?.status),
    };
    let owner = &artifact.metadata.owner_references.clone().unwrap_or_default();
    assert!(owner.iter().any(|o| o.kind == "VMImage" && o.name == image), "{owner:?}");
    assert_eq!(artifact.data["spec"]["image"]["ref"], "quay.io/kairos/ubuntu:24.04-core-amd64-generic-v3.5.0");
    assert_eq!(artifact.data["spec"]["artifacts"]["cloudImage"], true);
    let job = &artifact.data["spec"]["exporters"][0]["template"]["spec"]["containers"][0];
    let reference = job["env"].as_array().into_iter().flatten().find(|e| e["name"] == "BANLIEUE_IMAGE_REF").map(|e| e["value"].as_str().unwrap_or("").to_string());
    let tag = format!("{name}");
    assert_eq!(reference.as_deref(), Some(format!("{}/{repository}:{tag}", registry.host).as_str()), "{job}");
    assert_eq!(job["volumeMounts"][0]["mountPath"], "/artifacts", "{job}");

    let images: Api<VMImage> = Api::all(env.client.clone());
    let set_phase = |name: String, phase: &'static str, message: &'static str| {
        let artifacts = artifacts.clone();
        async move {
            let patch = json!({"status": {"phase": phase, "message": message}});
            artifacts.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await
        }
    };
    // The operator builds, then its exporter runs: the VMImage follows.
    set_phase(name.clone(), "Building", "building the disk").await?;
    let building = |i: Option<&VMImage>| {
        i.and_then(|i| i.status.as_ref())
            .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Built" && c.reason == "Building" && c.message.contains("is Building: building the disk")))
    };
    wait_for(&images, &image, 60, "Built=False/Building with the operator's message", building).await?;
    set_phase(name.clone(), "Exporting", "").await?;
    wait_for(&images, &image, 60, "phase Exporting", |i: Option<&VMImage>| {
        i.and_then(|i| i.status.as_ref()).and_then(|s| s.build.as_ref()).is_some_and(|b| b.phase == "Exporting")
    })
    .await?;
    // The exporter's work: the built disk (the bootable test guest, as raw) pushed where the Job says.
    let raw = env.dir().join(format!("{name}.raw"));
    let out = std::process::Command::new("qemu-img").args(["convert", "-O", "raw", &lv.guest_disk()]).arg(&raw).output()?;
    anyhow::ensure!(out.status.success(), "qemu-img convert: {}", String::from_utf8_lossy(&out.stderr));
    let disk = std::fs::read(&raw)?;
    registry.push_artifact(repository, &tag, "application/vnd.banlieue.disk.v1", "application/vnd.banlieue.disk.layer.v1", disk.clone()).await?;
    set_phase(name.clone(), "Ready", "").await?;

    // Built, fetched, imported everywhere: the checksum is the pushed layer's.
    let imported = wait_for(&images, &image, 120, "Ready (built and imported)", |i: Option<&VMImage>| image_has(i, "Ready", Some("True"), "")).await?;
    let st = imported.status.clone().unwrap_or_default();
    let b = st.build.clone().unwrap_or_default();
    let sum = checksum(&disk);
    assert_eq!(b.checksum.as_deref(), Some(sum.as_str()), "{b:?}");
    let blob_url = format!("http://{}/v2/{repository}/blobs/{sum}", registry.host);
    assert_eq!(b.url.as_deref(), Some(blob_url.as_str()));
    assert!(st.conditions.iter().any(|c| c.type_ == "Built" && c.status == "True"), "{st:?}");
    assert_eq!(st.providers.len(), 3, "{st:?}");
    // libvirtd holds the disk as a volume …
    let volume = format!("image@{image}@{}", &sum[7..19]);
    let path = lv.virsh(&["vol-path", "--pool", &lv.pool, &volume])?.trim().to_string();
    assert_eq!(st.providers.iter().find(|p| p.provider == format!("{ns}/kvm")).and_then(|p| p.reference.as_deref()), Some(path.as_str()));
    // … vcsim has the template, its NFC handler having received the VMDK the host streamed …
    let template = format!("image-{image}-{}", &sum[7..19]);
    assert_eq!(vc.is_template(&template).await?, Some(true));
    assert_eq!(vc.nfc_uploads()?.len(), 1);
    // … and Proxmox VE was asked to download the registry's blob, and has the template.
    assert!(pve.vms().await?.iter().any(|v| v.name == template && v.template));
    let mut logs = Vec::new();
    for node in ["pve1", "pve2"] {
        for t in pve.tasks(node).await?.into_iter().filter(|t| t["type"] == "download") {
            logs.push(pve.task_log(node, t["upid"].as_str().unwrap_or("")).await?.join("\n"));
        }
    }
    assert!(logs.len() == 1 && logs[0].contains(&blob_url), "{logs:?}");

    // A VM boots from the built image.
    boot_on_kvm(&env, &lv, &image, "node", "booted-from-built-image").await?;
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &ns);

    // A build that fails says why, and nothing is imported.
    wait_for(&artifacts, &format!("{broken}-1"), 60, "the second OSArtifact", |a: Option<&DynamicObject>| a.is_some()).await?;
    set_phase(format!("{broken}-1"), "Error", "mkfs failed: no space left on device").await?;
    let failed = wait_for(&images, &broken, 60, "Built=False/BuildFailed", |i: Option<&VMImage>| image_has(i, "Built", Some("False"), "BuildFailed")).await?;
    let st = failed.status.clone().unwrap_or_default();
    assert!(st.conditions.iter().any(|c| c.type_ == "Built" && c.message.contains("no space left on device")), "{st:?}");
    assert!(st.providers.is_empty(), "{st:?}");

    // Deleting: the VM first, then the VMImages take their OSArtifacts and import with them.
    vms.delete("node", &DeleteParams::default()).await?;
    banlieue_tests::await_deleted(&vms, "node").await.context("deleting VM node")?;
    for i in [&image, &broken] {
        images.delete(i, &DeleteParams::default()).await?;
        let left = || async { images.get_opt(i).await.ok().flatten().and_then(|i| i.status).map(|s| format!("{:?}", s.conditions)).unwrap_or_default() };
        if let Err(e) = banlieue_tests::await_deleted(&images, i).await {
            anyhow::bail!("deleting VMImage {i}: {e}; it says {}", left().await);
        }
    }
    assert!(artifacts.list(&Default::default()).await?.items.iter().all(|a| !a.name_any().starts_with(&ns)), "the OSArtifacts are gone");
    assert!(lv.volumes(&format!("image@{image}@"))?.is_empty(), "the imported volume is gone");
    assert_eq!(vc.is_template(&template).await?, None, "the vSphere template is gone");
    assert!(!pve.vms().await?.iter().any(|v| v.name == template), "the Proxmox VE template is gone");
    assert_eq!(cp.permissions_complete(), Ok(()));
    Ok(())
}

/// `examples/images/`: each is a VMImage the Rust type reads and the API server accepts
/// (dry run); the Kairos one builds for every class it lists.
#[tokio::test]
async fn the_image_examples_are_accepted() -> anyhow::Result<()> {
    use kube::api::{Patch, PatchParams};
    let env = TestEnv::start("image-examples").await?;
    env.install_crds().await?;
    let images: Api<VMImage> = Api::all(env.client.clone());
    for file in ["url-image.yaml", "kairos-image.yaml"] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/images").join(file);
        let image: VMImage = serde_yaml::from_str(&std::fs::read_to_string(&path)?)?;
        let classes: Vec<&str> = image.spec.sources.iter().map(|s| s.provider_class.as_str()).collect();
        assert_eq!(classes, ["libvirt", "vsphere", "proxmox"], "{file}");
        assert_eq!(image.spec.build.is_some(), file == "kairos-image.yaml");
        assert!(image.spec.sources.iter().all(|s| s.is_built() == image.spec.build.is_some()), "{file}");
        images
            .patch(&image.name_any(), &PatchParams::apply("image-examples").dry_run(), &Patch::Apply(&image))
            .await
            .map_err(|e| anyhow::anyhow!("examples/images/{file}: {e}"))?;
    }
    Ok(())
}
