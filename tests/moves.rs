//! Moves that carry the VM's disks (`moveStrategy: CarryDisks`, the default) end to end, checked
//! on each backend's own API — and on the bytes: the booting test guest writes a marker into
//! its disk (at 40 MiB of its first disk), and after each move the disk as the new backend holds
//! it (a libvirt volume read with `qemu-img dd`, a vcsim datastore file read over HTTP) has it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use banlieue_api::vm::MovePhase;
use banlieue_api::VirtualMachine;
use banlieue_test_backends::fakepve::FakePve;
use banlieue_test_backends::libvirtd::Libvirtd;
use banlieue_test_backends::vcsim::Vcsim;
use banlieue_tests::backends::{census, libvirtd_fixtures, libvirtd_provider, secret, three_backends, vm, vm_class, Names, KVM, PVE, VCENTER};
use banlieue_tests::control::{condition, is_ready, wait_for, ControlPlane};
use banlieue_tests::{await_deleted, TestEnv};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

/// Bound on a TCG boot (~15 s alone; two cores shared by parallel tests).
const BOOT_SECS: u64 = 180;
/// Bound on a move of the test guest's 1 GiB disk (export, convert, import, boot).
const MOVE_SECS: u64 = 300;
/// Bound on the same move killed and restarted in each of its phases (each restart lists and
/// watches everything again, and an aborted stream's copy may hold a volume a while): it took
/// ~100 s here alone, and once over 300 s in CI with the machine loaded.
const KILLED_MOVE_SECS: u64 = 600;
/// Where the test guest writes `#banlieue-disk-write` (tests/backends/libvirtd/build-guest.sh).
const DISK_WRITE_OFFSET: u64 = 40 << 20;

fn provider_of(vm: &VirtualMachine) -> Option<String> {
    vm.status.as_ref()?.scheduled.as_ref().map(|s| s.provider.clone())
}

async fn patch_spec(vms: &Api<VirtualMachine>, name: &str, spec: serde_json::Value) -> anyhow::Result<()> {
    vms.patch(name, &PatchParams::default(), &Patch::Merge(json!({ "spec": spec }))).await?;
    Ok(())
}

async fn booted(lv: &Libvirtd, domain: &str, line: &str) -> anyhow::Result<()> {
    banlieue_tests::within(BOOT_SECS, async {
        while !lv.serial_log(domain).contains(line) {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await
    .with_context(|| format!("{domain} never printed {line:?}: {}", lv.serial_log(domain)))
}

/// Wait until the VM has moved to `provider` (Ready there, `Moved=True`, the move over),
/// recording every move phase it shows on the way.
async fn moved_to(vms: &Api<VirtualMachine>, name: &str, provider: &str, phases: Arc<Mutex<Vec<MovePhase>>>) -> anyhow::Result<VirtualMachine> {
    let provider = provider.to_string();
    wait_for(vms, name, MOVE_SECS, &format!("moved to {provider}"), move |v: Option<&VirtualMachine>| {
        if let Some(phase) = v.and_then(|v| v.status.as_ref()?.moving.as_ref()).map(|m| m.phase) {
            let mut seen = phases.lock().unwrap();
            if seen.last() != Some(&phase) {
                seen.push(phase);
            }
        }
        is_ready(v)
            && condition(v, "Moved").is_some_and(|(s, _, _)| s == "True")
            && v.is_some_and(|v| provider_of(v).as_deref() == Some(provider.as_str()) && v.status.as_ref().is_some_and(|s| s.moving.is_none()))
    })
    .await
}

/// vcsim, fakepve and libvirtd each with a Provider (`three_backends`), a control plane, and a
/// VMClass of one 1 GiB disk.
struct Three {
    env: TestEnv,
    vc: Vcsim,
    pve: FakePve,
    lv: &'static Libvirtd,
    /// The class of one 1 GiB disk; `template_sized` is `three_backends`' (the size of the
    /// vcsim and fakepve templates' disks, which a VM made from them may not shrink).
    n: Names,
    template_sized: Names,
    vms: Api<VirtualMachine>,
    _cp: ControlPlane,
}

impl Three {
    async fn start(test: &str) -> anyhow::Result<Three> {
        let env = TestEnv::start(test).await?;
        env.install_crds().await?;
        let (vc, pve, lv) = (Vcsim::start().await?, FakePve::start().await?, Libvirtd::shared()?);
        let _cp = ControlPlane::start(&env)?;
        let template_sized = three_backends(&env, &vc, &pve, lv).await?;
        let n = small_class(&env, &template_sized).await?;
        let vms = Api::namespaced(env.client.clone(), &env.ns);
        Ok(Three { env, vc, pve, lv, n, template_sized, vms, _cp })
    }
}

/// A VMClass of one 1 GiB disk (the smallest a class declares) for the carried test guest.
async fn small_class(env: &TestEnv, n: &Names) -> anyhow::Result<Names> {
    let class = format!("{}-carry-small", env.ns);
    env.apply(vm_class(&class, 1, 256, 1, "standard", 30)).await?;
    Ok(Names { vm_class: class, provider_class: n.provider_class.clone(), image: n.image.clone() })
}

/// The guest boots once with `#banlieue-disk-write: marker`, then its user-data says nothing
/// more: only a carried disk can hold the marker after a move.
async fn guest_wrote(env: &TestEnv, lv: &Libvirtd, vms: &Api<VirtualMachine>, name: &str, marker: &str) -> anyhow::Result<()> {
    wait_for(vms, name, 90, "Ready", is_ready).await?;
    booted(lv, &format!("{}_{name}", env.ns), &format!("disk-write={marker}")).await?;
    env.apply(secret(env, &format!("{name}-user-data"), &[("user-data", "#cloud-config\n")])).await?;
    Ok(())
}

fn user_data(env: &TestEnv, name: &str, marker: &str) -> serde_json::Value {
    secret(env, &format!("{name}-user-data"), &[("user-data", &format!("#cloud-config\n#banlieue-disk-write: {marker}\n"))])
}

/// libvirt → libvirt across two storage pools, with banlieue killed (and started again) each
/// time the move shows a new phase: it resumes every time, and ends with one domain whose disk
/// holds what the guest wrote.
#[tokio::test]
async fn a_move_between_libvirt_pools_carries_the_guests_writes_through_kills_in_each_phase() -> anyhow::Result<()> {
    let env = TestEnv::start("carry-kvm").await?;
    env.install_crds().await?;
    let lv = Libvirtd::shared()?;
    let mut cp = ControlPlane::start(&env)?;
    let n = small_class(&env, &libvirtd_fixtures(&env, lv).await?).await?;
    let other = lv.add_pool(&format!("{}-b", env.ns))?;
    let mut kvm_b = libvirtd_provider(&env, lv, "kvm-b", &n.provider_class);
    kvm_b["spec"]["capabilities"]["storageClasses"]["standard"] = json!(other.name);
    env.apply(kvm_b).await?;
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    let (source, target) = (format!("{}_web", env.ns), format!("{}_web.moved", env.ns));
    let marker = format!("carried-{}", env.ns);
    env.apply(user_data(&env, "web", &marker)).await?;
    env.apply(vm(&env, "web", &n, KVM, json!({"userData": {"name": "web-user-data", "key": "user-data"}, "powerOffMode": "TrySoft"}))).await?;
    guest_wrote(&env, lv, &vms, "web", &marker).await?;

    patch_spec(&vms, "web", json!({"placement": {"providerRef": {"name": "kvm-b"}}})).await?;
    // Each phase seen, with the seconds since the move began: what a timeout reports.
    let began = std::time::Instant::now();
    let mut timeline: Vec<(u64, MovePhase)> = Vec::new();
    let mut kills = 0;
    let run = banlieue_tests::within(KILLED_MOVE_SECS, async {
        loop {
            let seen = timeline.last().map(|(_, p)| *p);
            let next = wait_for(&vms, "web", MOVE_SECS, "the next phase of the move, or its end", move |v: Option<&VirtualMachine>| {
                let phase = v.and_then(|v| v.status.as_ref()?.moving.as_ref()).map(|m| m.phase);
                phase.is_some_and(|p| Some(p) != seen) || condition(v, "Moved").is_some_and(|(s, _, _)| s == "True")
            })
            .await?;
            let Some(phase) = next.status.as_ref().and_then(|s| s.moving.as_ref()).map(|m| m.phase) else { return Ok::<_, anyhow::Error>(next) };
            assert_ne!(phase, MovePhase::Failed, "{:?}", next.status);
            timeline.push((began.elapsed().as_secs(), phase));
            // Killed as the phase shows, started again: the move goes on from what the
            // objects and the backends hold.
            cp.kill_and_wait().await;
            kills += 1;
            // (The source's name is a prefix of the target's: one listing counts both.)
            let domains = lv.domains(&source)?;
            assert!(domains.iter().all(|d| *d == source || *d == target) && domains.len() <= 2, "never more than the source and the target: {domains:?}");
            cp = ControlPlane::start(&env)?;
        }
    })
    .await;
    if run.is_err() {
        let status = vms.get_opt("web").await?.and_then(|v| v.status);
        anyhow::bail!("the move did not end within {KILLED_MOVE_SECS}s after {kills} kill(s); phases seen (seconds, phase): {timeline:?}; the VM's status: {status:?}");
    }
    run??;
    eprintln!("phases seen (seconds, phase): {timeline:?}");
    let phases: Vec<MovePhase> = timeline.iter().map(|(_, p)| *p).collect();
    let moved = wait_for(&vms, "web", MOVE_SECS, "Ready on kvm-b, moved", |v: Option<&VirtualMachine>| {
        is_ready(v) && v.is_some_and(|v| provider_of(v).as_deref() == Some("kvm-b") && v.status.as_ref().is_some_and(|s| s.moving.is_none()))
    })
    .await?;
    assert!(kills >= 2 && phases.contains(&MovePhase::PoweringOff), "killed in each phase seen: {phases:?}");
    let st = moved.status.clone().unwrap_or_default();
    assert_eq!(st.infrastructure_ref.as_ref().map(|r| r.name.as_str()), Some("web.moved"), "a second LibvirtMachine, of another name");
    assert_eq!(condition(Some(&moved), "Moved").map(|c| c.0), Some("True".into()));

    // libvirt: one domain, the new one, running on a volume of the other pool holding the marker.
    assert_eq!(lv.domains(&format!("{}_web", env.ns))?, vec![target.clone()], "exactly one domain after the move");
    assert_eq!(lv.state(&target)?, "running");
    assert_eq!(lv.uuid(&target)?, st.infrastructure_ref.as_ref().and_then(|r| r.uid.clone()).unwrap_or_default());
    assert!(lv.volumes(&format!("{source}_"))?.is_empty(), "the source's volumes are gone");
    let volume = format!("{target}_root.qcow2");
    let bytes = lv.read_volume_in(&other.name, &volume, DISK_WRITE_OFFSET, 256)?;
    assert!(String::from_utf8_lossy(&bytes).contains(&format!("banlieue-disk:{marker}")), "the carried disk holds what the guest wrote: {:?}", String::from_utf8_lossy(&bytes));
    booted(lv, &target, "banlieue-guest: ready").await?;
    assert!(!lv.serial_log(&target).contains("disk-write="), "nothing was written again: the marker came with the disk");
    // The image cache keeps nothing of the move.
    let carried = std::fs::read_dir(env.dir().join("image-cache/carry"))?.count();
    assert_eq!(carried, 0, "the carried copies are removed when the move ends");

    vms.delete("web", &Default::default()).await?;
    await_deleted(&vms, "web").await?;
    assert!(lv.domains(&format!("{}_web", env.ns))?.is_empty());
    drop(other);
    Ok(())
}

/// A target that fails its import (a ProviderClass that hands it raw disks where it takes
/// qcow2): the move is given up, the source runs on unchanged, the target left nothing.
#[tokio::test]
async fn a_target_that_fails_its_import_leaves_the_source_running_and_unchanged() -> anyhow::Result<()> {
    let env = TestEnv::start("carry-fail").await?;
    env.install_crds().await?;
    let lv = Libvirtd::shared()?;
    let _cp = ControlPlane::start(&env)?;
    let n = small_class(&env, &libvirtd_fixtures(&env, lv).await?).await?;
    // The same driver under a class that converts carried disks to raw.
    let raw_class = format!("{}-libvirt-raw", env.ns);
    let mut class = banlieue_tests::backends::libvirt_provider_class(&raw_class);
    class["spec"]["imageFormat"] = json!("raw");
    env.apply(class).await?;
    let image = json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": n.image},
                       "spec": {"sources": [{"providerClass": n.provider_class, "backingFile": lv.guest_disk()}, {"providerClass": raw_class, "backingFile": lv.guest_disk()}]}});
    env.apply(image).await?;
    env.apply(libvirtd_provider(&env, lv, "kvm-raw", &raw_class)).await?;
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    let source = format!("{}_db", env.ns);
    let marker = format!("stays-{}", env.ns);
    env.apply(user_data(&env, "db", &marker)).await?;
    env.apply(vm(&env, "db", &n, KVM, json!({"userData": {"name": "db-user-data", "key": "user-data"}, "powerOffMode": "TrySoft"}))).await?;
    guest_wrote(&env, lv, &vms, "db", &marker).await?;
    let uuid = lv.uuid(&source)?;

    patch_spec(&vms, "db", json!({"placement": {"providerRef": {"name": "kvm-raw"}}})).await?;
    let failed = wait_for(&vms, "db", MOVE_SECS, "MoveFailed", |v: Option<&VirtualMachine>| condition(v, "PlacementValid").is_some_and(|(_, r, _)| r == "MoveFailed")).await?;
    let (_, reason, message) = condition(Some(&failed), "Moved").context("a Moved condition")?;
    assert_eq!(reason, "InvalidSpec", "the target's words: {message}");
    assert!(message.contains("qcow2") && message.contains("imageFormat"), "{message}");
    assert_eq!(failed.status.as_ref().and_then(|s| s.moving.as_ref()).map(|m| m.phase), Some(MovePhase::Failed));
    // The source is the VM's machine again, running (powered on again as the spec asks).
    let back = wait_for(&vms, "db", 120, "Ready and running on kvm again", |v: Option<&VirtualMachine>| {
        is_ready(v)
            && v.and_then(provider_of).as_deref() == Some(KVM)
            && v.and_then(|v| v.status.as_ref()?.observed_power_state) == Some(banlieue_api::common::PowerState::PoweredOn)
    })
    .await?;
    assert_eq!(back.status.as_ref().and_then(|s| s.infrastructure_ref.as_ref()).map(|r| r.name.as_str()), Some("db"));
    banlieue_tests::within(120, async {
        while lv.domains(&format!("{}_db.moved", env.ns)).map(|d| !d.is_empty()).unwrap_or(true) {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await
    .context("the failed target's domain is removed")?;
    assert_eq!(lv.domains(&source)?, vec![source.clone()]);
    assert_eq!(lv.uuid(&source)?, uuid, "the same domain");
    assert_eq!(lv.state(&source)?, "running");
    let bytes = lv.read_volume(&format!("{source}_root.qcow2"), DISK_WRITE_OFFSET, 256)?;
    assert!(String::from_utf8_lossy(&bytes).contains(&format!("banlieue-disk:{marker}")), "the source's disk is as it was");
    assert!(lv.volumes(&format!("{}_db.moved_", env.ns))?.is_empty(), "the target left no volume");

    vms.delete("db", &Default::default()).await?;
    await_deleted(&vms, "db").await?;
    assert!(lv.domains(&source)?.is_empty());
    Ok(())
}

/// A VM on a backend that cannot export its disks (Proxmox VE) is not moved with
/// `CarryDisks` — never silently recreated — and `Recreate` still makes it afresh elsewhere.
#[tokio::test]
async fn a_move_from_a_backend_that_cannot_export_is_refused_and_recreate_still_recreates() -> anyhow::Result<()> {
    let t = Three::start("carry-refused").await?;
    let (env, vc, pve, lv, n, vms) = (&t.env, &t.vc, &t.pve, t.lv, &t.template_sized, &t.vms);
    let mut on_pve = vm(&env, "app", &n, PVE, json!({}));
    on_pve["spec"]["placement"]["failureDomainSelector"] = json!({"matchLabels": {"banlieue.io/failure-domain": "pve1"}});
    env.apply(on_pve).await?;
    let ready = wait_for(&vms, "app", 90, "Ready on pve", is_ready).await?;
    let uid = ready.status.as_ref().and_then(|s| s.infrastructure_ref.as_ref()?.uid.clone()).unwrap_or_default();
    assert_eq!(census(&env, &vc, &pve, lv, "app").await?, (0, 1, 0));

    patch_spec(&vms, "app", json!({"placement": {"providerRef": {"name": VCENTER}, "failureDomainSelector": null}})).await?;
    let refused = wait_for(&vms, "app", 60, "CannotCarryDisks", |v: Option<&VirtualMachine>| condition(v, "PlacementValid").is_some_and(|(_, r, _)| r == "CannotCarryDisks")).await?;
    let (_, _, message) = condition(Some(&refused), "PlacementValid").unwrap();
    assert!(message.contains("Provider pve") && message.contains("cannot export") && message.contains("moveStrategy: Recreate"), "{message}");
    assert_eq!(refused.status.as_ref().and_then(|s| s.scheduled.as_ref()).map(|s| s.provider.as_str()), Some(PVE), "it stays");
    assert_eq!(census(&env, &vc, &pve, lv, "app").await?, (0, 1, 0), "nothing made elsewhere");
    let [kept] = pve.vms_tagged(&uid).await?.try_into().map_err(|v| anyhow::anyhow!("one PVE VM: {v:?}"))?;
    assert_eq!(kept.status, "running", "the PVE VM runs on, untouched");

    patch_spec(&vms, "app", json!({"moveStrategy": "Recreate"})).await?;
    wait_for(&vms, "app", 90, "Ready on vcenter", |v: Option<&VirtualMachine>| is_ready(v) && v.and_then(provider_of).as_deref() == Some(VCENTER)).await?;
    assert_eq!(census(&env, &vc, &pve, lv, "app").await?, (1, 0, 0), "recreated from the image on vSphere");
    vms.delete("app", &Default::default()).await?;
    await_deleted(&vms, "app").await?;
    Ok(())
}

/// libvirt → vSphere (vcsim) → libvirt: the guest's writes cross both ways; on vcsim the VM's
/// disk is a flat file on the datastore of the exported size, holding the marker; exactly one
/// backend VM at the end of each leg, counted on every backend.
#[tokio::test]
async fn a_vm_carries_its_disk_from_libvirt_to_vsphere_and_back() -> anyhow::Result<()> {
    let t = Three::start("carry-trip").await?;
    let (env, vc, pve, lv, n, vms) = (&t.env, &t.vc, &t.pve, t.lv, &t.n, &t.vms);
    // vSphere takes carried disks raw (flat extents), as its class's imageFormat vmdk says.
    let mut class = banlieue_tests::backends::provider_class(&n.provider_class, "provider-vsphere", "VSphere");
    class["spec"]["imageFormat"] = json!("vmdk");
    env.apply(class).await?;
    let marker = format!("round-trip-{}", env.ns);
    env.apply(user_data(&env, "trip", &marker)).await?;
    env.apply(vm(&env, "trip", &n, KVM, json!({"userData": {"name": "trip-user-data", "key": "user-data"}, "powerOffMode": "TrySoft"}))).await?;
    guest_wrote(&env, lv, &vms, "trip", &marker).await?;
    let domain = format!("{}_trip", env.ns);
    let capacity = lv.virsh(&["vol-info", "--bytes", "--pool", &lv.pool, &format!("{domain}_root.qcow2")])?;
    let capacity: u64 = capacity.lines().find_map(|l| l.strip_prefix("Capacity:")).and_then(|c| c.split_whitespace().next()?.parse().ok()).context("capacity")?;

    // → vSphere.
    let phases = Arc::new(Mutex::new(Vec::new()));
    patch_spec(&vms, "trip", json!({"placement": {"providerRef": {"name": VCENTER}}})).await?;
    let on_vc = moved_to(&vms, "trip", VCENTER, phases.clone()).await?;
    assert_eq!(census(&env, &vc, &pve, lv, "trip").await?, (1, 0, 0), "one VM, on vcsim");
    let uid = on_vc.status.as_ref().and_then(|s| s.infrastructure_ref.as_ref()?.uid.clone()).unwrap_or_default();
    let moref = vc.find_vm(&uid).await?.context("the VSphereMachine's VM on vcsim")?;
    assert_eq!(vc.power_state(&moref).await?, "poweredOn");
    let disks = vc.virtual_disks(&moref).await?;
    let descriptor = &disks.first().context("a disk")?.1;
    let flat = descriptor.replace(".vmdk", "-flat.vmdk");
    let (size, bytes) = vc.datastore_read(&flat, DISK_WRITE_OFFSET, 256).await?;
    assert_eq!(size, capacity, "the flat file on vcsim's datastore is the exported disk, whole ({descriptor})");
    assert!(String::from_utf8_lossy(&bytes).contains(&format!("banlieue-disk:{marker}")), "vcsim's datastore holds the guest's writes");
    assert!(phases.lock().unwrap().contains(&MovePhase::Exporting) || phases.lock().unwrap().contains(&MovePhase::Importing), "{:?}", phases.lock().unwrap());

    // → back to libvirt.
    patch_spec(&vms, "trip", json!({"placement": {"providerRef": {"name": KVM}}})).await?;
    let on_kvm = moved_to(&vms, "trip", KVM, phases.clone()).await?;
    assert_eq!(census(&env, &vc, &pve, lv, "trip").await?, (0, 0, 1), "one VM, on libvirtd");
    assert!(vc.find_vm(&uid).await?.is_none(), "the vcsim VM is gone");
    let back = on_kvm.status.as_ref().and_then(|s| s.infrastructure_ref.as_ref()?.uid.clone()).unwrap_or_default();
    assert_eq!(lv.uuid(&domain)?, back);
    let bytes = lv.read_volume(&format!("{domain}_root.qcow2"), DISK_WRITE_OFFSET, 256)?;
    assert!(String::from_utf8_lossy(&bytes).contains(&format!("banlieue-disk:{marker}")), "the marker came back: {:?}", String::from_utf8_lossy(&bytes));
    booted(lv, &domain, "banlieue-guest: ready").await?;

    vms.delete("trip", &Default::default()).await?;
    await_deleted(&vms, "trip").await?;
    assert_eq!(census(&env, &vc, &pve, lv, "trip").await?, (0, 0, 0));
    Ok(())
}

/// libvirt → Proxmox VE: fakepve is told to download each carried disk from a one-time URL the
/// host serves (its task log names it), and makes the VM from the download (`import-from`).
/// fakepve never fetches, so the test does it in its place: the URL gives the carried disk —
/// a qcow2 holding the guest's writes — once, and then no more.
#[tokio::test]
async fn a_move_to_proxmox_hands_the_disk_over_through_a_one_time_url() -> anyhow::Result<()> {
    let t = Three::start("carry-pve").await?;
    let (env, vc, pve, lv, n, vms) = (&t.env, &t.vc, &t.pve, t.lv, &t.n, &t.vms);
    let marker = format!("to-pve-{}", env.ns);
    env.apply(user_data(&env, "pv", &marker)).await?;
    env.apply(vm(&env, "pv", &n, KVM, json!({"userData": {"name": "pv-user-data", "key": "user-data"}, "powerOffMode": "TrySoft"}))).await?;
    guest_wrote(&env, lv, &vms, "pv", &marker).await?;

    patch_spec(&vms, "pv", json!({"placement": {"providerRef": {"name": PVE}, "failureDomainSelector": {"matchLabels": {"banlieue.io/failure-domain": "pve1"}}}})).await?;
    let on_pve = moved_to(&vms, "pv", PVE, Arc::new(Mutex::new(Vec::new()))).await?;
    assert_eq!(census(&env, &vc, &pve, lv, "pv").await?, (0, 1, 0), "one VM, on fakepve");
    let uid = on_pve.status.as_ref().and_then(|s| s.infrastructure_ref.as_ref()?.uid.clone()).unwrap_or_default();
    let [made] = pve.vms_tagged(&uid).await?.try_into().map_err(|v| anyhow::anyhow!("one PVE VM: {v:?}"))?;
    let config = pve.vm_config(&made.node, made.vmid).await?;
    assert!(config["scsi0"].as_str().is_some_and(|d| d.contains("import-from=") && d.contains(&format!("carry-{uid}-0"))), "made from the downloaded disk: {config}");

    // fakepve's download task names the URL it was given.
    let mut urls = Vec::new();
    for t in pve.tasks(&made.node).await?.into_iter().filter(|t| t["type"] == "download") {
        for line in pve.task_log(&made.node, t["upid"].as_str().unwrap_or("")).await? {
            if let Some(url) = line.split_whitespace().find(|w| w.contains("/carried/")) {
                urls.push(url.to_string());
            }
        }
    }
    let [url] = urls.try_into().map_err(|u| anyhow::anyhow!("one download URL in fakepve's task log: {u:?}"))?;
    assert!(url.starts_with("http://127.0.0.1:") && url.ends_with(".qcow2"), "{url}");
    let disk = env.dir().join("downloaded.qcow2");
    assert_eq!(fetch(&url, &disk).await?, "200");
    let slice = std::process::Command::new("qemu-img")
        .args(["dd", "-f", "qcow2", "-O", "raw", "bs=4096", &format!("skip={}", DISK_WRITE_OFFSET / 4096), &format!("count={}", DISK_WRITE_OFFSET / 4096 + 1)])
        .arg(format!("if={}", disk.display()))
        .arg(format!("of={}", env.dir().join("slice.raw").display()))
        .output()?;
    assert!(slice.status.success(), "{}", String::from_utf8_lossy(&slice.stderr));
    let bytes = std::fs::read(env.dir().join("slice.raw"))?;
    assert!(String::from_utf8_lossy(&bytes).contains(&format!("banlieue-disk:{marker}")), "the URL serves the carried disk with the guest's writes");
    assert_eq!(fetch(&url, &env.dir().join("again.qcow2")).await?, "404", "a one-time URL works once");
    assert!(lv.domains(&format!("{}_pv", env.ns))?.is_empty(), "the libvirt source is gone");

    vms.delete("pv", &Default::default()).await?;
    await_deleted(&vms, "pv").await?;
    assert_eq!(census(&env, &vc, &pve, lv, "pv").await?, (0, 0, 0));
    Ok(())
}

/// GET `url` into `to` with curl (bounded; the server runs on this test's runtime); the HTTP status.
async fn fetch(url: &str, to: &std::path::Path) -> anyhow::Result<String> {
    let out = tokio::process::Command::new("curl").args(["-sS", "--max-time", "60", "-o"]).arg(to).args(["-w", "%{http_code}", url]).output().await?;
    anyhow::ensure!(out.status.success(), "curl {url}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}
