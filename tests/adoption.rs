//! Brownfield: VMs made on a backend without banlieue (here with virsh; on vcsim over vim25,
//! on fakepve over the PVE API) are discovered with `kubectl vm discover`, adopted — the same
//! VM, never recreated, now carrying its Machine's mark — managed, let go of with
//! `kubectl vm release` (still there, mark gone), adopted again and deleted, each step checked
//! on the backend's own API.

use anyhow::Context as _;
use banlieue_api::VirtualMachine;
use banlieue_test_backends::fakepve::FakePve;
use banlieue_test_backends::libvirtd::{Leftovers, Libvirtd};
use banlieue_test_backends::vcsim::{self, Vcsim};
use banlieue_tests::backends::{libvirtd_fixtures, machines, proxmox_fixtures, vsphere_fixtures, PveEndpoint, KVM, PVE, VCENTER};
use banlieue_api::common::PowerState;
use banlieue_tests::control::{condition, is_powered, is_ready, kubectl_vm, wait_for, ControlPlane};
use banlieue_tests::{await_deleted, TestEnv};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::json;

/// Bound on a VM becoming Ready or changing power on libvirtd.
const SECS: u64 = 120;

/// A VirtualMachine adopting `backend_id` on Provider `provider`: no image, the class given.
fn adopting(env: &TestEnv, name: &str, class: &str, provider: &str, backend_id: &str, extra: serde_json::Value) -> serde_json::Value {
    let mut spec = json!({"classRef": {"name": class}, "placement": {"providerRef": {"name": provider}}, "adopt": {"backendId": backend_id}});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name, "namespace": env.ns}, "spec": spec})
}

/// A domain banlieue did not make: one qcow2 volume of the test pool, defined and started with
/// virsh (it runs its firmware, finding nothing to boot: running is all this needs). Its UUID,
/// and what removes it (and its volume) however the test ends.
fn define_by_hand(lv: &'static Libvirtd, env: &TestEnv, name: &str) -> anyhow::Result<(String, Leftovers)> {
    define_by_hand_with(lv, env, name, "64M")
}

/// [`define_by_hand`] with a disk of `size` (`virsh vol-create-as`'s, e.g. `3G`: qcow2 takes
/// no room for it).
fn define_by_hand_with(lv: &'static Libvirtd, env: &TestEnv, name: &str, size: &str) -> anyhow::Result<(String, Leftovers)> {
    let leftovers = Leftovers { lv, prefix: name.to_string(), volumes: vec![name.to_string()] };
    let volume = format!("{name}.qcow2");
    lv.virsh(&["vol-create-as", &lv.pool, &volume, size, "--format", "qcow2"])?;
    let xml = format!(
        "<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>\
         <os><type arch='x86_64'>hvm</type></os><devices>\
         <disk type='volume' device='disk'><driver name='qemu' type='qcow2'/><source pool='{}' volume='{volume}'/><target dev='vda' bus='virtio'/></disk>\
         </devices></domain>",
        lv.pool
    );
    let file = env.dir().join(format!("{name}.xml"));
    std::fs::write(&file, xml)?;
    lv.virsh(&["define", &file.display().to_string()])?;
    lv.virsh(&["start", name])?;
    Ok((lv.uuid(name)?, leftovers))
}

/// Adopt `backend_id` as `name` and wait until its Ready condition says `reason`; its message.
async fn refused(env: &TestEnv, name: &str, class: &str, provider: &str, backend_id: &str, reason: &str) -> anyhow::Result<String> {
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    env.apply(adopting(env, name, class, provider, backend_id, json!({}))).await?;
    let v = wait_for(&vms, name, SECS, reason, |v: Option<&VirtualMachine>| condition(v, "Ready").is_some_and(|(_, r, _)| r == reason)).await?;
    Ok(condition(Some(&v), "Ready").map(|(_, _, m)| m).unwrap_or_default())
}

/// Memory (KiB, the persistent definition's) and CPUs of a domain, as `virsh dominfo` says.
fn dominfo(lv: &Libvirtd, domain: &str) -> anyhow::Result<(u64, u64)> {
    let out = lv.virsh(&["dominfo", domain])?;
    let field = |key: &str| out.lines().find_map(|l| l.strip_prefix(key)).and_then(|v| v.split_whitespace().next()?.parse().ok()).with_context(|| format!("{key} in {out}"));
    Ok((field("Max memory:")?, field("CPU(s):")?))
}

/// Capacity in bytes of a volume of the test pool, as `virsh vol-info` says.
fn capacity(lv: &Libvirtd, volume: &str) -> anyhow::Result<u64> {
    let out = lv.virsh(&["vol-info", "--bytes", "--pool", &lv.pool, volume])?;
    out.lines().find_map(|l| l.strip_prefix("Capacity:")).and_then(|v| v.split_whitespace().next()?.parse().ok()).with_context(|| format!("capacity in {out}"))
}

/// The owner mark libvirt holds for the domain, as `virsh metadata` reads it (empty: none).
fn mark(lv: &Libvirtd, domain: &str) -> String {
    lv.virsh(&["metadata", domain, "https://banlieue.io/libvirt/owner/v1"]).unwrap_or_default()
}

#[tokio::test]
async fn a_domain_defined_with_virsh_is_discovered_adopted_managed_released_and_deleted() -> anyhow::Result<()> {
    let env = TestEnv::start("adopt-kvm").await?;
    env.install_crds().await?;
    let lv = Libvirtd::shared()?;
    let _cp = ControlPlane::start(&env)?;
    let n = libvirtd_fixtures(&env, lv).await?;
    let legacy = format!("legacy-{}", env.ns);
    let (uuid, _leftovers) = define_by_hand(lv, &env, &legacy)?;
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);

    // Discovered: listed as unmanaged, with what it has.
    let (code, out, err) = kubectl_vm(&env, &["discover", "-n", &env.ns, "--provider", KVM, "-o", "json"]).await?;
    anyhow::ensure!(code == 0, "kubectl vm discover: {code} {err}");
    let listed: serde_json::Value = serde_json::from_str(&out).context("discover -o json")?;
    let found = listed["items"].as_array().into_iter().flatten().find(|m| m["backendId"] == uuid.as_str()).with_context(|| format!("{uuid} not listed: {out}"))?;
    assert_eq!((found["name"].as_str(), found["powerState"].as_str(), found["memoryMiB"].as_u64()), (Some(legacy.as_str()), Some("PoweredOn"), Some(64)));
    assert!(found.get("owner").is_none(), "unmanaged: {found}");

    // Adopted: Ready, the same domain, still running, marked with the Machine's UID; nothing made.
    env.apply(adopting(&env, "web", &n.vm_class, KVM, &uuid, json!({"powerOffMode": "Hard"}))).await?;
    let web = wait_for(&vms, "web", SECS, "Ready, adopted", |v: Option<&VirtualMachine>| is_ready(v)).await?;
    let machine = machines(&env, "Libvirt").get("web").await?;
    let machine_uid = machine.uid().unwrap_or_default();
    assert_eq!(lv.uuid(&legacy)?, uuid, "the same domain");
    assert_eq!(lv.state(&legacy)?, "running", "left running, as it was");
    let marked = mark(lv, &legacy);
    assert!(marked.contains(&format!("machine-uid=\"{machine_uid}\"")) && marked.contains(&format!("machine=\"{}/web\"", env.ns)), "{marked}");
    assert!(lv.domains(&format!("{}_", env.ns))?.is_empty(), "no domain was made");
    let st = web.status.clone().unwrap_or_default();
    assert_eq!(st.hardware.as_ref().map(|h| (h.cpus, h.memory_mib)), Some((1, 64)), "what the domain has");
    let (matches, reason, message) = condition(Some(&web), "ConfigurationMatches").context("ConfigurationMatches")?;
    assert_eq!((matches.as_str(), reason.as_str()), ("False", "ConfigurationDiffers"));
    assert!(message.contains("64 MiB of memory, the class says 256"), "{message}");
    let (code, out, _) = kubectl_vm(&env, &["discover", "-n", &env.ns, "--provider", KVM]).await?;
    assert!(code == 0 && !out.contains(&uuid), "an adopted VM is no longer listed as unmanaged: {out}");
    let (_, out, _) = kubectl_vm(&env, &["discover", "-n", &env.ns, "--provider", KVM, "--all"]).await?;
    assert!(out.lines().any(|l| l.contains(&uuid) && l.contains(&format!("{}/web", env.ns))), "--all names its Machine: {out}");

    // A second VirtualMachine naming it is refused, and deleting that one leaves the domain.
    env.apply(adopting(&env, "thief", &n.vm_class, KVM, &uuid, json!({}))).await?;
    let thief = wait_for(&vms, "thief", SECS, "AlreadyManaged", |v: Option<&VirtualMachine>| condition(v, "Ready").is_some_and(|(_, r, _)| r == "AlreadyManaged")).await?;
    let (_, _, why) = condition(Some(&thief), "Ready").unwrap_or_default();
    assert!(why.contains(&format!("Machine {}/web", env.ns)), "{why}");
    vms.delete("thief", &DeleteParams::default()).await?;
    await_deleted(&vms, "thief").await?;
    assert_eq!((lv.uuid(&legacy)?, lv.state(&legacy)?), (uuid.clone(), "running".to_string()), "the refused VM's deletion left the domain alone");

    // Managed: powered off and on through banlieue.
    vms.patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"desiredPowerState": "PoweredOff"}}))).await?;
    wait_for(&vms, "web", SECS, "PoweredOff", is_powered(PowerState::PoweredOff)).await?;
    assert_eq!(lv.state(&legacy)?, "shut off");

    // Brought to its class while off (applyClass): 64 → 256 MiB, its disk grown to 2 GiB.
    assert_eq!(dominfo(lv, &legacy)?, (64 * 1024, 1));
    vms.patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"adopt": {"applyClass": true}}}))).await?;
    wait_for(&vms, "web", SECS, "ConfigurationMatches", |v: Option<&VirtualMachine>| condition(v, "ConfigurationMatches").is_some_and(|(s, _, _)| s == "True")).await?;
    assert_eq!(dominfo(lv, &legacy)?, (256 * 1024, 1), "libvirt holds the class's memory");
    assert_eq!(capacity(lv, &format!("{legacy}.qcow2"))?, 2 << 30, "the disk grown to the class's");
    assert_eq!(lv.uuid(&legacy)?, uuid, "the same domain, reconfigured");
    vms.patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"desiredPowerState": "PoweredOn"}}))).await?;
    wait_for(&vms, "web", SECS, "PoweredOn", is_powered(PowerState::PoweredOn)).await?;
    assert_eq!(lv.state(&legacy)?, "running");

    // Let go: the VirtualMachine goes, the domain stays as it is, without the mark.
    let (code, out, err) = kubectl_vm(&env, &["release", "web", "-n", &env.ns, "--wait", "--timeout", "120"]).await?;
    anyhow::ensure!(code == 0, "kubectl vm release: {code} {out} {err}");
    assert!(vms.get_opt("web").await?.is_none());
    assert_eq!((lv.uuid(&legacy)?, lv.state(&legacy)?), (uuid.clone(), "running".to_string()), "released, not deleted");
    assert!(!mark(lv, &legacy).contains("machine-uid"), "the mark is gone: {}", mark(lv, &legacy));
    assert!(lv.volumes(&legacy)?.contains(&format!("{legacy}.qcow2")));
    let (_, out, _) = kubectl_vm(&env, &["discover", "-n", &env.ns, "--provider", KVM]).await?;
    assert!(out.contains(&uuid), "discoverable again: {out}");

    // Adopted again with `kubectl vm adopt`, with a class made from the domain's hardware as
    // discovery reads it (256 MiB and a 2 GiB disk since applyClass), then deleted: the
    // domain and its volume are gone.
    let again = format!("{}-again", env.ns);
    let (code, out, err) = kubectl_vm(&env, &["adopt", &uuid, "--provider", KVM, "--name", &again, "-n", &env.ns, "--wait", "--timeout", "60"]).await?;
    anyhow::ensure!(code == 0, "kubectl vm adopt: {code} {out} {err}");
    let class = format!("adopted-{again}");
    assert!(out.contains(&format!("vmclass/{class} created from the VM's hardware")), "{out}");
    let v = vms.get(&again).await?;
    assert!(is_ready(Some(&v)), "--wait returned once Ready");
    assert_eq!(condition(Some(&v), "ConfigurationMatches").map(|(s, _, m)| (s, m.contains("has the CPUs, memory and disks"))), Some(("True".into(), true)), "its class fits it");
    assert_eq!(v.spec.desired_power_state, PowerState::PoweredOn, "the power state it has");
    assert_eq!((lv.uuid(&legacy)?, lv.state(&legacy)?), (uuid.clone(), "running".to_string()));
    // Hard off for the deletion (the domain runs no guest to answer ACPI), once its Machine says so.
    vms.patch(&again, &PatchParams::default(), &Patch::Merge(json!({"spec": {"powerOffMode": "Hard"}}))).await?;
    wait_for(&machines(&env, "Libvirt"), &again, SECS, "powerOffMode Hard on the Machine", |m: Option<&kube::api::DynamicObject>| {
        m.is_some_and(|m| m.data["spec"]["vm"]["powerOffMode"] == "Hard")
    })
    .await?;
    vms.delete(&again, &DeleteParams::default()).await?;
    await_deleted(&vms, &again).await?;
    Api::<banlieue_api::VMClass>::all(env.client.clone()).delete(&class, &DeleteParams::default()).await?;
    assert!(lv.domains(&legacy)?.is_empty(), "deleted with the default policy");
    assert!(!lv.volumes(&legacy)?.contains(&format!("{legacy}.qcow2")), "with its disk");
    Ok(())
}

/// banlieue killed as soon as the mark is on the domain (before, or just after, the Machine's
/// status says so): the rerun finishes the adoption with the same mark, and makes nothing.
#[tokio::test]
async fn a_kill_right_after_marking_finishes_the_adoption_on_rerun_with_one_mark() -> anyhow::Result<()> {
    let env = TestEnv::start("adopt-kill").await?;
    env.install_crds().await?;
    let lv = Libvirtd::shared()?;
    let mut cp = ControlPlane::start(&env)?;
    let n = libvirtd_fixtures(&env, lv).await?;
    let legacy = format!("legacy-{}", env.ns);
    let (uuid, _leftovers) = define_by_hand(lv, &env, &legacy)?;
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    env.apply(adopting(&env, "web", &n.vm_class, KVM, &uuid, json!({"powerOffMode": "Hard"}))).await?;
    // The backend's word, polled (libvirt has no event for a metadata change).
    banlieue_tests::within(SECS, async {
        while !mark(lv, &legacy).contains("machine-uid") {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
    .await
    .context("the mark never appeared")?;
    cp.kill_and_wait().await;
    let _cp = ControlPlane::start(&env)?;
    wait_for(&vms, "web", SECS, "Ready after the rerun", |v: Option<&VirtualMachine>| is_ready(v)).await?;
    let machine_uid = machines(&env, "Libvirt").get("web").await?.uid().unwrap_or_default();
    let xml = lv.virsh(&["dumpxml", &legacy])?;
    assert_eq!(xml.matches("machine-uid=").count(), 1, "one mark: {xml}");
    assert!(xml.contains(&format!("machine-uid=\"{machine_uid}\"")), "{xml}");
    assert_eq!((lv.uuid(&legacy)?, lv.state(&legacy)?), (uuid, "running".to_string()));
    assert!(lv.domains(&format!("{}_", env.ns))?.is_empty(), "nothing was made");
    vms.patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"deletionPolicy": "Orphan"}}))).await?;
    vms.delete("web", &DeleteParams::default()).await?;
    await_deleted(&vms, "web").await?;
    Ok(())
}

/// What cannot be adopted says so and changes nothing: an id no domain has, and a VM without
/// the Provider to find it on.
#[tokio::test]
async fn bad_adoptions_name_what_is_wrong_and_make_nothing() -> anyhow::Result<()> {
    let env = TestEnv::start("adopt-bad").await?;
    env.install_crds().await?;
    let lv = Libvirtd::shared()?;
    let _cp = ControlPlane::start(&env)?;
    let n = libvirtd_fixtures(&env, lv).await?;
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);

    let ghost = "6f1c2a3e-1111-4222-8333-000000000000";
    env.apply(adopting(&env, "ghost", &n.vm_class, KVM, ghost, json!({}))).await?;
    let v = wait_for(&vms, "ghost", SECS, "NotFound", |v: Option<&VirtualMachine>| condition(v, "Ready").is_some_and(|(_, r, _)| r == "NotFound")).await?;
    let (_, _, message) = condition(Some(&v), "Ready").unwrap_or_default();
    assert!(message.contains(ghost) && message.contains("adopting backend VM"), "{message}");

    let mut nowhere = adopting(&env, "nowhere", &n.vm_class, KVM, ghost, json!({}));
    nowhere["spec"]["placement"] = json!({});
    env.apply(nowhere).await?;
    let v = wait_for(&vms, "nowhere", SECS, "InvalidSpec", |v: Option<&VirtualMachine>| condition(v, "Scheduled").is_some_and(|(_, r, _)| r == "InvalidSpec")).await?;
    assert!(condition(Some(&v), "Scheduled").is_some_and(|(_, _, m)| m.contains("spec.placement.providerRef")));

    let mut imageless = adopting(&env, "imageless", &n.vm_class, KVM, ghost, json!({}));
    imageless["spec"].as_object_mut().map(|s| s.remove("adopt"));
    env.apply(imageless).await?;
    let v = wait_for(&vms, "imageless", SECS, "ImageNotFound", |v: Option<&VirtualMachine>| condition(v, "Scheduled").is_some_and(|(_, r, _)| r == "ImageNotFound")).await?;
    assert!(condition(Some(&v), "Scheduled").is_some_and(|(_, _, m)| m.contains("spec.imageRef is required")));

    // A class that would shrink the VM's disk (3 GiB; the class's 2): refused, nothing
    // changed — not its memory either, though it is off and the class asks for more.
    let big = format!("big-{}", env.ns);
    let (big_uuid, _leftovers) = define_by_hand_with(lv, &env, &big, "3G")?;
    env.apply(adopting(
        &env,
        "shrink",
        &n.vm_class,
        KVM,
        &big_uuid,
        json!({"adopt": {"backendId": big_uuid, "applyClass": true}, "desiredPowerState": "PoweredOff", "powerOffMode": "Hard"}),
    ))
    .await?;
    let v =
        wait_for(&vms, "shrink", SECS, "DiskShrinkRefused", |v: Option<&VirtualMachine>| condition(v, "ConfigurationMatches").is_some_and(|(_, r, _)| r == "DiskShrinkRefused"))
            .await?;
    let (_, _, message) = condition(Some(&v), "ConfigurationMatches").unwrap_or_default();
    assert!(message.contains("holds 3 GiB and is never shrunk") && message.contains("nothing was changed"), "{message}");
    assert_eq!(dominfo(lv, &big)?, (64 * 1024, 1), "its memory left as it was");
    assert_eq!(capacity(lv, &format!("{big}.qcow2"))?, 3 << 30, "its disk left as it was");
    vms.patch("shrink", &PatchParams::default(), &Patch::Merge(json!({"spec": {"deletionPolicy": "Orphan"}}))).await?;

    assert!(lv.domains(&format!("{}_", env.ns))?.is_empty(), "nothing was made");
    for name in ["ghost", "nowhere", "imageless", "shrink"] {
        vms.delete(name, &DeleteParams::default()).await?;
        await_deleted(&vms, name).await?;
    }
    Ok(())
}

/// Discover, adopt, power, release, adopt again and delete one VM of a backend other than
/// libvirt; `backend` checks each step on the backend's own API.
async fn round_trip(env: &TestEnv, provider: &str, class_name: &str, backend_id: &str, backend: &impl Backend) -> anyhow::Result<()> {
    let class = class_name;
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    let (code, out, err) = kubectl_vm(env, &["discover", "-n", &env.ns, "--provider", provider]).await?;
    anyhow::ensure!(code == 0 && out.contains(backend_id), "discover lists {backend_id}: {code} {out} {err}");

    env.apply(adopting(env, "legacy", class, provider, backend_id, json!({"powerOffMode": "Hard"}))).await?;
    wait_for(&vms, "legacy", SECS, "Ready, adopted", |v: Option<&VirtualMachine>| is_ready(v)).await?;
    let machine_uid = machines(env, backend.kind()).get("legacy").await?.uid().unwrap_or_default();
    assert_eq!(backend.owner(backend_id).await?.as_deref(), Some(machine_uid.as_str()), "marked with the Machine's UID");
    assert_eq!(backend.power(backend_id).await?, "on", "the same VM, left running");

    vms.patch("legacy", &PatchParams::default(), &Patch::Merge(json!({"spec": {"desiredPowerState": "PoweredOff"}}))).await?;
    wait_for(&vms, "legacy", SECS, "PoweredOff", is_powered(PowerState::PoweredOff)).await?;
    assert_eq!(backend.power(backend_id).await?, "off", "powered off through banlieue");
    // Brought to its class while off (applyClass), checked on the backend.
    let classes: Api<banlieue_api::VMClass> = Api::all(env.client.clone());
    let want = classes.get(class_name).await?.spec;
    assert_ne!(backend.hardware(backend_id).await?, (want.cpus, want.memory_mib), "the test needs a VM unlike its class");
    vms.patch("legacy", &PatchParams::default(), &Patch::Merge(json!({"spec": {"adopt": {"applyClass": true}}}))).await?;
    wait_for(&vms, "legacy", SECS, "the class's CPUs and memory in status.hardware", |v: Option<&VirtualMachine>| {
        v.and_then(|v| v.status.as_ref()?.hardware.as_ref()).is_some_and(|h| (h.cpus, h.memory_mib) == (want.cpus, want.memory_mib))
    })
    .await?;
    assert_eq!(backend.hardware(backend_id).await?, (want.cpus, want.memory_mib), "the backend holds the class's CPUs and memory");
    vms.patch("legacy", &PatchParams::default(), &Patch::Merge(json!({"spec": {"desiredPowerState": "PoweredOn"}}))).await?;
    wait_for(&vms, "legacy", SECS, "PoweredOn", is_powered(PowerState::PoweredOn)).await?;
    assert_eq!(backend.power(backend_id).await?, "on");

    let (code, out, err) = kubectl_vm(env, &["release", "legacy", "-n", &env.ns, "--wait", "--timeout", "120"]).await?;
    anyhow::ensure!(code == 0, "kubectl vm release: {code} {out} {err}");
    assert_eq!(backend.owner(backend_id).await?, None, "released: the mark is gone");
    assert_eq!(backend.power(backend_id).await?, "on", "released: still there, running");

    env.apply(adopting(env, "again", class, provider, backend_id, json!({"powerOffMode": "Hard"}))).await?;
    wait_for(&vms, "again", SECS, "Ready, adopted again", |v: Option<&VirtualMachine>| is_ready(v)).await?;
    vms.delete("again", &DeleteParams::default()).await?;
    await_deleted(&vms, "again").await?;
    assert!(!backend.exists(backend_id).await?, "deleted with the default policy");
    Ok(())
}

/// What the round trip checks on a backend's own API.
trait Backend {
    /// The `<Kind>` of its Machines.
    fn kind(&self) -> &'static str;
    /// The machine UID its mark names, if it carries one.
    async fn owner(&self, id: &str) -> anyhow::Result<Option<String>>;
    /// `on` or `off`.
    async fn power(&self, id: &str) -> anyhow::Result<String>;
    /// CPUs and MiB of memory.
    async fn hardware(&self, id: &str) -> anyhow::Result<(u32, u64)>;
    async fn exists(&self, id: &str) -> anyhow::Result<bool>;
}

struct OnVcsim<'a>(&'a Vcsim);

impl Backend for OnVcsim<'_> {
    fn kind(&self) -> &'static str {
        "VSphere"
    }
    async fn owner(&self, id: &str) -> anyhow::Result<Option<String>> {
        let vm = self.0.find_vm(id).await?.context("the VM")?;
        Ok(self.0.extra_config(&vm, "banlieue.owner.machine-uid").await?.filter(|v| !v.is_empty()))
    }
    async fn power(&self, id: &str) -> anyhow::Result<String> {
        let vm = self.0.find_vm(id).await?.context("the VM")?;
        Ok(if self.0.power_state(&vm).await? == "poweredOn" { "on" } else { "off" }.into())
    }
    async fn hardware(&self, id: &str) -> anyhow::Result<(u32, u64)> {
        let vm = self.0.find_vm(id).await?.context("the VM")?;
        let number = async |path: &str| -> anyhow::Result<u64> { self.0.vm_property(&vm, path).await?.with_context(|| format!("{path}"))?.parse().context("a number") };
        Ok((u32::try_from(number("config.hardware.numCPU").await?)?, number("config.hardware.memoryMB").await?))
    }
    async fn exists(&self, id: &str) -> anyhow::Result<bool> {
        Ok(self.0.find_vm(id).await?.is_some())
    }
}

struct OnFakePve<'a>(&'a FakePve);

impl OnFakePve<'_> {
    async fn node_of(&self, id: &str) -> anyhow::Result<Option<String>> {
        Ok(self.0.vms().await?.into_iter().find(|v| v.vmid.to_string() == id).map(|v| v.node))
    }
}

impl Backend for OnFakePve<'_> {
    fn kind(&self) -> &'static str {
        "Proxmox"
    }
    async fn owner(&self, id: &str) -> anyhow::Result<Option<String>> {
        let node = self.node_of(id).await?.context("the VM")?;
        let config = self.0.vm_config(&node, id.parse()?).await?;
        let description = config["description"].as_str().unwrap_or_default().to_string();
        Ok(description.lines().find_map(|l| l.strip_prefix("banlieue-owner: ")).and_then(|m| m.split_whitespace().find_map(|kv| kv.strip_prefix("machine-uid=")).map(str::to_string)))
    }
    async fn power(&self, id: &str) -> anyhow::Result<String> {
        let node = self.node_of(id).await?.context("the VM")?;
        let status = self.0.vm_status(&node, id.parse()?).await?;
        Ok(if status["status"] == "running" { "on" } else { "off" }.into())
    }
    async fn hardware(&self, id: &str) -> anyhow::Result<(u32, u64)> {
        let node = self.node_of(id).await?.context("the VM")?;
        let config = self.0.vm_config(&node, id.parse()?).await?;
        let number = |key: &str, default: u64| match &config[key] {
            serde_json::Value::Null => Ok(default),
            serde_json::Value::Number(n) => n.as_u64().context("a number"),
            v => v.as_str().unwrap_or_default().parse::<u64>().with_context(|| format!("{key}: {v}")),
        };
        Ok((u32::try_from(number("cores", 1)? * number("sockets", 1)?)?, number("memory", 0)?))
    }
    async fn exists(&self, id: &str) -> anyhow::Result<bool> {
        Ok(self.node_of(id).await?.is_some())
    }
}

#[tokio::test]
async fn a_vm_cloned_over_vim25_is_adopted_managed_released_and_deleted_on_vcsim() -> anyhow::Result<()> {
    let env = TestEnv::start("adopt-vc").await?;
    env.install_crds().await?;
    let vc = Vcsim::start().await?;
    let _cp = ControlPlane::start(&env)?;
    let n = vsphere_fixtures(&env, &vc, vcsim::PASSWORD).await?;
    let moref = vc.clone_outside(&format!("legacy-{}", env.ns)).await?;
    let uuid = vc.vm_property(&moref, "config.instanceUuid").await?.context("an instance UUID")?;
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);

    // Running, as a VM in use is (vcsim leaves a clone off whatever the clone spec says).
    if OnVcsim(&vc).power(&uuid).await? != "on" {
        vc.power_on_outside(&moref).await?;
    }
    // A template is listed, never adopted: refused, left without a mark.
    let template = vc.vm_at(&format!("DC0/vm/{}", vcsim::TEMPLATE)).await?.context("vcsim's template")?;
    let template_id = vc.vm_property(&template, "config.instanceUuid").await?.context("its instance UUID")?;
    let why = refused(&env, "tmpl", &n.vm_class, VCENTER, &template_id, "InvalidSpec").await?;
    assert!(why.contains("is a template"), "{why}");
    // A VM of another Provider's backend, named on the libvirtd one: not found there, and the
    // message names the Provider whose discovery lists it.
    let kvm = libvirtd_fixtures(&env, Libvirtd::shared()?).await?;
    let (code, out, err) = kubectl_vm(&env, &["discover", "-n", &env.ns, "--provider", VCENTER]).await?;
    anyhow::ensure!(code == 0 && out.contains(&uuid), "discover lists {uuid}: {code} {out} {err}");
    let why = refused(&env, "elsewhere", &kvm.vm_class, KVM, &uuid, "NotFound").await?;
    assert!(why.contains(&format!("Provider {VCENTER}'s discovery lists it")), "{why}");
    for name in ["tmpl", "elsewhere"] {
        vms.delete(name, &DeleteParams::default()).await?;
        await_deleted(&vms, name).await?;
    }
    assert_eq!(OnVcsim(&vc).owner(&template_id).await?, None, "the template carries no mark");
    assert_eq!(vc.is_template(vcsim::TEMPLATE).await?, Some(true), "deleting the refused VMs left the template");
    assert_eq!((OnVcsim(&vc).owner(&uuid).await?, OnVcsim(&vc).power(&uuid).await?), (None, "on".to_string()), "nor touched the VM");

    round_trip(&env, VCENTER, &n.vm_class, &uuid, &OnVcsim(&vc)).await?;
    // Never recreated: the one VM of that name, until it was deleted.
    assert!(vc.vm_names().await?.iter().all(|name| !name.starts_with(&format!("{}_", env.ns))), "banlieue made no VM of its own");
    Ok(())
}

#[tokio::test]
async fn a_vm_created_over_the_pve_api_is_adopted_managed_released_and_deleted_on_fakepve() -> anyhow::Result<()> {
    let env = TestEnv::start("adopt-pve").await?;
    env.install_crds().await?;
    let pve = FakePve::start().await?;
    let _cp = ControlPlane::start(&env)?;
    let n = proxmox_fixtures(&env, &pve, &pve.password, PveEndpoint::Https).await?;
    let vmid = "4242";
    pve.run_task("pve1", "POST", "/nodes/pve1/qemu", &[("vmid", vmid), ("name", "legacy-db"), ("memory", "512"), ("cores", "1"), ("description", "the billing database")]).await?;
    pve.run_task("pve1", "POST", &format!("/nodes/pve1/qemu/{vmid}/status/start"), &[]).await?;
    let before = pve.vms().await?.len();

    // fakepve's template is refused, left as it was.
    let template = banlieue_test_backends::fakepve::TEMPLATE_VMID.to_string();
    let config_before = pve.vm_config("pve1", banlieue_test_backends::fakepve::TEMPLATE_VMID).await?;
    let why = refused(&env, "tmpl", &n.vm_class, PVE, &template, "InvalidSpec").await?;
    assert!(why.contains("is a template"), "{why}");
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    vms.delete("tmpl", &DeleteParams::default()).await?;
    await_deleted(&vms, "tmpl").await?;
    assert_eq!(pve.vm_config("pve1", banlieue_test_backends::fakepve::TEMPLATE_VMID).await?, config_before, "the template untouched");

    round_trip(&env, PVE, &n.vm_class, vmid, &OnFakePve(&pve)).await?;
    assert_eq!(pve.vms().await?.len(), before - 1, "banlieue made no VM of its own; the adopted one was deleted");
    Ok(())
}

/// A pool adopts three VMs that exist (cloned over vim25, matched by name), makes the other two
/// of its five, and scales in to two in the documented order — the newest first, names breaking
/// ties — treating adopted members as any other: the VM of an adopted member it drops is deleted.
#[tokio::test]
async fn a_pool_adopts_three_existing_vms_makes_two_more_and_scales_in_to_two() -> anyhow::Result<()> {
    use banlieue_api::VirtualMachinePool;
    let env = TestEnv::start("adopt-pool").await?;
    env.install_crds().await?;
    let vc = Vcsim::start().await?;
    let _cp = ControlPlane::start(&env)?;
    let n = vsphere_fixtures(&env, &vc, vcsim::PASSWORD).await?;
    let mut existing = Vec::new();
    for i in 0..3 {
        let moref = vc.clone_outside(&format!("fleet-{i}-{}", env.ns)).await?;
        existing.push(vc.vm_property(&moref, "config.instanceUuid").await?.context("an instance UUID")?);
    }
    let pool = json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachinePool", "metadata": {"name": "fleet", "namespace": env.ns},
                      "spec": {"replicas": 5, "selector": {"matchLabels": {"app": "fleet"}},
                               "adoptSelector": {"names": [format!("fleet-*-{}", env.ns)]},
                               "template": {"metadata": {"labels": {"app": "fleet"}},
                                            "spec": {"classRef": {"name": n.vm_class}, "imageRef": {"name": n.image},
                                                     "placement": {"providerRef": {"name": VCENTER}}, "powerOffMode": "Hard"}}}});
    env.apply(pool).await?;
    let pools: Api<VirtualMachinePool> = Api::namespaced(env.client.clone(), &env.ns);
    let members = |want: i32| move |p: Option<&VirtualMachinePool>| p.and_then(|p| p.status.as_ref()).is_some_and(|s| s.replicas == want && s.ready_replicas == want);
    wait_for(&pools, "fleet", 180, "5 Ready members", members(5)).await?;
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    let adopted: std::collections::BTreeMap<String, String> = vms
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter_map(|vm| Some((vm.name_any(), vm.spec.adopt?.backend_id)))
        .collect();
    assert_eq!(adopted.values().cloned().collect::<std::collections::BTreeSet<_>>(), existing.iter().cloned().collect(), "the three existing VMs are members");
    for (member, id) in &adopted {
        let uid = machines(&env, "VSphere").get(member).await?.uid().unwrap_or_default();
        assert_eq!(OnVcsim(&vc).owner(id).await?.as_deref(), Some(uid.as_str()), "{member} marked its VM");
    }
    let made: Vec<String> = vc.vm_names().await?.into_iter().filter(|name| name.starts_with(&format!("{}_fleet-", env.ns))).collect();
    assert_eq!(made.len(), 2, "two made: {made:?}");

    pools.patch("fleet", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 2}}))).await?;
    wait_for(&pools, "fleet", 180, "2 Ready members", members(2)).await?;
    for gone in ["fleet-2", "fleet-3", "fleet-4"] {
        await_deleted(&vms, gone).await?;
    }
    let left: Vec<String> = vms.list(&Default::default()).await?.items.iter().map(|vm| vm.name_any()).collect();
    assert_eq!(left, ["fleet-0", "fleet-1"], "the newest went first");
    assert!(adopted.contains_key("fleet-0") && adopted.contains_key("fleet-1"), "what stays is adopted: {adopted:?}");
    let dropped = &adopted["fleet-2"];
    assert!(!OnVcsim(&vc).exists(dropped).await?, "the dropped adopted member's VM is deleted like any member's");
    for kept in [&adopted["fleet-0"], &adopted["fleet-1"]] {
        assert!(OnVcsim(&vc).exists(kept).await?);
    }
    assert!(vc.vm_names().await?.iter().all(|name| !name.starts_with(&format!("{}_fleet-", env.ns))), "the made ones are gone");
    Ok(())
}
