//! Snapshots end to end through the control plane (VMSnapshot reconciler, the VM's
//! `spec.revertTo`, the Machine, the Wasm drivers) on the real backends, each checked on the
//! backend's own API: vcsim's snapshot tree over vim25, fakepve's snapshot list and tasks over
//! the PVE API, libvirtd's `virsh snapshot-list` — and, on libvirtd, the bytes the booting
//! guest wrote to its disk, read back from the volume.

use std::time::{Duration, Instant};

use banlieue_api::common::PowerState;
use banlieue_api::snapshot::SnapshotPhase;
use banlieue_api::vm::RevertPhase;
use banlieue_api::{VMSnapshot, VirtualMachine};
use banlieue_test_backends::fakepve::FakePve;
use banlieue_test_backends::libvirtd::Libvirtd;
use banlieue_test_backends::vcsim::{self, Vcsim};
use banlieue_tests::backends::{libvirtd_fixtures, names, proxmox_fixtures, pve_vm, secret, vm, vm_class, Names, PveEndpoint, KVM, VCENTER};
use banlieue_tests::control::{wait_for, ControlPlane};
use banlieue_tests::{await_deleted, TestEnv};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::{json, Value};

fn snapshot(env: &TestEnv, name: &str, vm: &str, extra: Value) -> Value {
    let mut spec = json!({"vmRef": {"name": vm}});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMSnapshot", "metadata": {"name": name, "namespace": env.ns}, "spec": spec})
}

fn phase(s: Option<&VMSnapshot>) -> Option<SnapshotPhase> {
    s?.status.as_ref()?.phase
}

/// The snapshot's `Ready` condition: (reason, message).
fn ready_reason(s: Option<&VMSnapshot>) -> Option<(String, String)> {
    let c = s?.status.as_ref()?.conditions.iter().find(|c| c.type_ == "Ready")?;
    Some((c.reason.clone(), c.message.clone()))
}

async fn taken(snaps: &Api<VMSnapshot>, name: &str) -> anyhow::Result<VMSnapshot> {
    wait_for(snaps, name, 120, "Ready", |s: Option<&VMSnapshot>| phase(s) == Some(SnapshotPhase::Ready)).await
}

/// Wait for the snapshot to say `reason` (and stay in `phase`).
async fn refused(snaps: &Api<VMSnapshot>, name: &str, want: SnapshotPhase, reason: &'static str) -> anyhow::Result<String> {
    let s = wait_for(snaps, name, 60, reason, move |s: Option<&VMSnapshot>| phase(s) == Some(want) && ready_reason(s).is_some_and(|(r, _)| r == reason)).await?;
    Ok(ready_reason(Some(&s)).map(|(_, m)| m).unwrap_or_default())
}

fn snapshot_id(s: &VMSnapshot) -> String {
    s.status.as_ref().and_then(|st| st.snapshot_id.clone()).unwrap_or_default()
}

fn is_ready(vm: Option<&VirtualMachine>) -> bool {
    vm.and_then(|v| v.status.as_ref()).is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn machine_uid(vm: &VirtualMachine) -> String {
    vm.status.as_ref().and_then(|s| s.infrastructure_ref.as_ref()?.uid.clone()).unwrap_or_default()
}

/// The VM's `Reverted` condition: (status, reason, message).
fn reverted(vm: Option<&VirtualMachine>) -> Option<(String, String, String)> {
    let c = vm?.status.as_ref()?.conditions.iter().find(|c| c.type_ == "Reverted")?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Wait for the VM to be back at `snapshot` and Ready in `power`.
async fn reverted_to(vms: &Api<VirtualMachine>, name: &str, snapshot: &'static str, power: PowerState, secs: u64) -> anyhow::Result<VirtualMachine> {
    wait_for(vms, name, secs, "reverted and Ready", move |v: Option<&VirtualMachine>| {
        let done = v.and_then(|v| v.status.as_ref()?.revert.as_ref()).is_some_and(|r| r.snapshot == snapshot && r.phase == RevertPhase::Reverted);
        done && is_ready(v) && v.and_then(|v| v.status.as_ref()?.observed_power_state) == Some(power)
    })
    .await
}

async fn patch_spec(vms: &Api<VirtualMachine>, name: &str, spec: Value) -> anyhow::Result<()> {
    vms.patch(name, &PatchParams::default(), &Patch::Merge(json!({ "spec": spec }))).await?;
    Ok(())
}

/// Any change to the object wakes its reconciler (its periodic look at the backend is minutes away).
async fn nudge(snaps: &Api<VMSnapshot>, name: &str) -> anyhow::Result<()> {
    let at = format!("{:?}", Instant::now());
    snaps.patch(name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"annotations": {"test/nudge": at}}}))).await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// vSphere

/// A test's API and control plane, vcsim (behind a fault proxy when `proxied`) and the
/// vSphere fixtures (Provider `vcenter`).
struct OnVsphere {
    env: TestEnv,
    vc: Vcsim,
    proxy: Option<banlieue_test_backends::fault_proxy::FaultProxy>,
    /// Taken by a test that kills it.
    cp: Option<ControlPlane>,
    n: Names,
    vms: Api<VirtualMachine>,
    snaps: Api<VMSnapshot>,
}

impl OnVsphere {
    async fn start(test: &str, proxied: bool) -> anyhow::Result<OnVsphere> {
        let env = TestEnv::start(test).await?;
        env.install_crds().await?;
        let vc = Vcsim::start().await?;
        let proxy = match proxied {
            true => Some(banlieue_test_backends::fault_proxy::FaultProxy::start(&vc.url).await?),
            false => None,
        };
        let cp = ControlPlane::start(&env)?;
        let endpoint = proxy.as_ref().map_or(vc.url.clone(), |p| p.url_for(&vc.url));
        let n = banlieue_tests::backends::vsphere_fixtures_at(&env, &endpoint, vcsim::PASSWORD).await?;
        let vms = Api::namespaced(env.client.clone(), &env.ns);
        let snaps = Api::namespaced(env.client.clone(), &env.ns);
        Ok(OnVsphere { env, vc, proxy, cp: Some(cp), n, vms, snaps })
    }

    /// VM `name` on vcsim (`extra`: more of its spec), Ready: it, and its managed object id.
    async fn ready_vm(&self, name: &str, extra: Value) -> anyhow::Result<(VirtualMachine, String)> {
        self.env.apply(vm(&self.env, name, &self.n, VCENTER, extra)).await?;
        let v = wait_for(&self.vms, name, 90, "Ready", is_ready).await?;
        let moref = self.vc.find_vm(&machine_uid(&v)).await?.ok_or_else(|| anyhow::anyhow!("{name} is not on vcsim"))?;
        Ok((v, moref))
    }
}

#[tokio::test]
async fn on_vsphere_snapshots_are_taken_reverted_to_and_deleted_on_the_vms_snapshot_tree() -> anyhow::Result<()> {
    let t = OnVsphere::start("snap-vsphere", false).await?;
    let (env, vc, n, vms, snaps) = (&t.env, &t.vc, &t.n, &t.vms, &t.snaps);
    let (web, moref) = t.ready_vm("web", json!({})).await?;

    env.apply(snapshot(&env, "before", "web", json!({"memory": true, "description": "before the upgrade"}))).await?;
    let before = taken(&snaps, "before").await?;
    let (tree, current) = vc.snapshots(&moref).await?;
    assert_eq!(tree, [(snapshot_id(&before), format!("bl-{}", before.uid().unwrap()))], "vSphere's tree holds it under the VMSnapshot's UID");
    assert_eq!(current.as_deref(), Some(snapshot_id(&before).as_str()));
    let st = before.status.as_ref().unwrap();
    assert_eq!(st.memory, Some(true));
    assert!(st.ready_to_use && st.creation_time.is_some());
    let source = st.source.as_ref().expect("what the VM was");
    assert_eq!((source.class_ref.name.as_str(), source.image_ref.name.as_str(), source.provider.as_str()), (n.vm_class.as_str(), n.image.as_str(), VCENTER));
    assert_eq!(before.owner_references().first().map(|o| o.name.as_str()), Some("web"), "owned by its VM");

    env.apply(snapshot(&env, "after", "web", json!({}))).await?;
    let after = taken(&snaps, "after").await?;
    assert_eq!(vc.snapshots(&moref).await?.1.as_deref(), Some(snapshot_id(&after).as_str()));

    // Revert: vSphere's current snapshot is the one reverted to, and the VM runs again.
    patch_spec(&vms, "web", json!({"revertTo": "before"})).await?;
    let back = reverted_to(&vms, "web", "before", PowerState::PoweredOn, 90).await?;
    assert_eq!(vc.snapshots(&moref).await?.1.as_deref(), Some(snapshot_id(&before).as_str()), "vSphere's current snapshot");
    assert_eq!(vc.power_state(&moref).await?, "poweredOn");
    assert_eq!(reverted(Some(&back)).map(|(s, r, _)| (s, r)), Some(("True".to_string(), "Reverted".to_string())));
    assert_eq!(machine_uid(&back), machine_uid(&web), "the same machine: a revert keeps the VM's identity");

    // Delete one: gone from the tree, the other kept.
    snaps.delete("after", &DeleteParams::default()).await?;
    await_deleted(&snaps, "after").await?;
    let (tree, _) = vc.snapshots(&moref).await?;
    assert_eq!(tree.iter().map(|(id, _)| id.clone()).collect::<Vec<_>>(), [snapshot_id(&before)]);

    // Deleted on vSphere by hand: Failed, never taken again.
    vc.remove_snapshot_outside(&snapshot_id(&before)).await?;
    nudge(&snaps, "before").await?;
    let message = refused(&snaps, "before", SnapshotPhase::Failed, "NotFoundOnBackend").await?;
    assert!(message.contains(&snapshot_id(&before)), "{message}");
    assert!(vc.snapshots(&moref).await?.0.is_empty(), "not taken again");
    assert!(!snaps.get("before").await?.status.unwrap().ready_to_use);

    // The VM's deletion takes its snapshots.
    vms.delete("web", &DeleteParams::default()).await?;
    await_deleted(&vms, "web").await?;
    await_deleted(&snaps, "before").await?;
    assert_eq!(vc.find_vm(&machine_uid(&web)).await?, None);
    Ok(())
}

/// What cannot be snapshotted or reverted to is refused with a condition naming the field,
/// and nothing is made on the backend.
#[tokio::test]
async fn bad_snapshots_and_reverts_are_refused_naming_the_field_and_make_nothing() -> anyhow::Result<()> {
    let t = OnVsphere::start("snap-bad", false).await?;
    let (env, vc, n, vms, snaps) = (&t.env, &t.vc, &t.n, &t.vms, &t.snaps);

    // No such VM: pending, saying so; taken once the VM exists.
    env.apply(snapshot(&env, "early", "late", json!({}))).await?;
    let message = refused(&snaps, "early", SnapshotPhase::Pending, "VMNotFound").await?;
    assert!(message.starts_with("spec.vmRef:"), "{message}");

    env.apply(vm(&env, "off", &n, VCENTER, json!({"desiredPowerState": "PoweredOff"}))).await?;
    env.apply(vm(&env, "other", &n, VCENTER, json!({"desiredPowerState": "PoweredOff"}))).await?;
    let off = wait_for(&vms, "off", 90, "Ready", is_ready).await?;
    wait_for(&vms, "other", 90, "Ready", is_ready).await?;
    let moref = vc.find_vm(&machine_uid(&off)).await?.expect("on vcsim");

    // Memory of a powered-off VM; quiesce without guest tools running (the driver's check).
    env.apply(snapshot(&env, "with-memory", "off", json!({"memory": true}))).await?;
    let message = refused(&snaps, "with-memory", SnapshotPhase::Failed, "InvalidSpec").await?;
    assert!(message.starts_with("spec.memory:"), "{message}");
    env.apply(snapshot(&env, "quiesced", "off", json!({"quiesce": true}))).await?;
    let message = refused(&snaps, "quiesced", SnapshotPhase::Failed, "InvalidSpec").await?;
    assert!(message.contains("spec.quiesce"), "{message}");
    assert!(vc.snapshots(&moref).await?.0.is_empty(), "nothing made on vSphere");

    // Reverts: to a snapshot of another VM, to one that failed, to one that does not exist.
    env.apply(snapshot(&env, "of-other", "other", json!({}))).await?;
    taken(&snaps, "of-other").await?;
    for (target, reason, words) in [("of-other", "InvalidRevert", "VirtualMachine \"other\""), ("with-memory", "SnapshotNotReady", "Failed"), ("nowhere", "InvalidRevert", "not found")] {
        patch_spec(&vms, "off", json!({"revertTo": target})).await?;
        let v = wait_for(&vms, "off", 60, reason, move |v: Option<&VirtualMachine>| reverted(v).is_some_and(|(s, r, _)| s == "False" && r == reason)).await?;
        let (_, _, message) = reverted(Some(&v)).unwrap();
        assert!(message.starts_with("spec.revertTo:") && message.contains(words), "{message}");
        assert!(is_ready(Some(&v)), "the VM itself is unaffected");
    }
    assert!(vc.snapshots(&moref).await?.0.is_empty());

    // A VM that is never placed (its class does not exist): pending, saying so.
    env.apply(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": "homeless", "namespace": env.ns},
                     "spec": {"classRef": {"name": "no-such-class"}, "imageRef": {"name": n.image}}}))
        .await?;
    env.apply(snapshot(&env, "of-homeless", "homeless", json!({}))).await?;
    let message = refused(&snaps, "of-homeless", SnapshotPhase::Pending, "VMNotPlaced").await?;
    assert!(message.starts_with("spec.vmRef:"), "{message}");

    // Schedules that cannot run: each says which field, and makes nothing.
    let schedules: Api<banlieue_api::VMSnapshotSchedule> = Api::namespaced(env.client.clone(), &env.ns);
    for (name, spec, field) in [
        ("bad-cron", json!({"schedule": "61 * * * *", "retention": {"keepLast": 1}}), "spec.schedule: the minute field"),
        ("bad-zone", json!({"schedule": "@daily", "timeZone": "Mars/Olympus", "retention": {"keepLast": 1}}), "spec.timeZone"),
        ("keeps-nothing", json!({"schedule": "* * * * * *", "retention": {"keepLast": 0}}), "spec.retention.keepLast"),
    ] {
        let mut spec = spec;
        spec["selector"] = json!({"matchLabels": {"app": "any"}});
        env.apply(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMSnapshotSchedule", "metadata": {"name": name, "namespace": env.ns}, "spec": spec})).await?;
        let s = wait_for(&schedules, name, 60, "InvalidSchedule", |s: Option<&banlieue_api::VMSnapshotSchedule>| {
            s.and_then(|s| s.status.as_ref()).is_some_and(|st| st.conditions.iter().any(|c| c.type_ == "Ready" && c.reason == "InvalidSchedule"))
        })
        .await?;
        let c = s.status.unwrap().conditions.into_iter().find(|c| c.type_ == "Ready").unwrap();
        assert!(c.message.starts_with(field), "{name}: {}", c.message);
    }
    let made = snaps.list(&ListParams::default().labels("banlieue.io/snapshot-schedule")).await?.items;
    assert!(made.is_empty(), "no snapshot from an invalid schedule: {made:?}");

    // A driver built for the contract before snapshots: its VMs run, their snapshots are refused.
    let legacy = names(&env, "legacy");
    for object in [
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "ProviderClass", "metadata": {"name": legacy.provider_class},
               "spec": {"component": {"source": "builtin:provider-legacy"}, "infrastructureKind": "Legacy"}}),
        vm_class(&legacy.vm_class, 1, 512, 1, "standard", 5),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": legacy.image},
               "spec": {"sources": [{"providerClass": legacy.provider_class, "template": "t"}]}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "old", "namespace": env.ns},
               "spec": {"providerClassRef": {"name": legacy.provider_class}, "connection": {"endpoint": "legacy://"},
                        "capabilities": {"storageClasses": {"standard": "s"}, "networkClasses": {"default": "n"}}}}),
    ] {
        env.apply(object).await?;
    }
    env.apply(vm(&env, "old-vm", &legacy, "old", json!({}))).await?;
    wait_for(&vms, "old-vm", 90, "Ready on the 0.5.0 driver", is_ready).await?;
    env.apply(snapshot(&env, "of-old", "old-vm", json!({}))).await?;
    let message = refused(&snaps, "of-old", SnapshotPhase::Failed, "SnapshotsUnsupported").await?;
    assert!(message.contains("banlieue:provider 0.6.0") && message.contains("0.5.0"), "{message}");
    Ok(())
}

/// A VM's snapshots live on its machine: a move that would lose them is refused until the
/// VM's migrationPolicy allows dropping them; then they are deleted from vSphere and it moves.
#[tokio::test]
async fn a_vm_with_snapshots_moves_only_when_its_policy_drops_them() -> anyhow::Result<()> {
    let t = OnVsphere::start("snap-move", false).await?;
    let (env, vc, vms, snaps) = (&t.env, &t.vc, &t.vms, &t.snaps);
    // A second Provider on the same vCenter: somewhere to move to.
    let first = Api::<banlieue_api::Provider>::namespaced(env.client.clone(), &env.ns).get(VCENTER).await?;
    env.apply(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "vcenter-b", "namespace": env.ns}, "spec": first.spec})).await?;
    let (web, moref) = t.ready_vm("web", json!({"moveStrategy": "Recreate"})).await?;
    env.apply(snapshot(env, "keep", "web", json!({}))).await?;
    taken(&snaps, "keep").await?;

    patch_spec(&vms, "web", json!({"placement": {"providerRef": {"name": "vcenter-b"}}})).await?;
    let placement_valid = |v: Option<&VirtualMachine>| v?.status.as_ref()?.conditions.iter().find(|c| c.type_ == "PlacementValid").map(|c| (c.reason.clone(), c.message.clone()));
    let stays = wait_for(&vms, "web", 60, "SnapshotsBlockMove", move |v: Option<&VirtualMachine>| placement_valid(v).is_some_and(|(r, _)| r == "SnapshotsBlockMove")).await?;
    let (_, message) = placement_valid(Some(&stays)).unwrap();
    assert!(message.contains("keep") && message.contains("AutomaticDroppingSnapshots"), "{message}");
    assert_eq!(machine_uid(&stays), machine_uid(&web), "not moved");
    assert_eq!(vc.snapshots(&moref).await?.0.len(), 1);

    patch_spec(&vms, "web", json!({"migrationPolicy": "AutomaticDroppingSnapshots"})).await?;
    await_deleted(&snaps, "keep").await?;
    let moved = wait_for(&vms, "web", 90, "Ready on vcenter-b", |v: Option<&VirtualMachine>| {
        is_ready(v) && v.and_then(|v| v.status.as_ref()?.scheduled.as_ref()).is_some_and(|s| s.provider == "vcenter-b")
    })
    .await?;
    assert_ne!(machine_uid(&moved), machine_uid(&web));
    assert_eq!(vc.find_vm(&machine_uid(&web)).await?, None, "the old machine is gone");
    Ok(())
}

/// A restore into a new VM on vSphere: a second VM cloned by `CloneVM_Task` from the
/// snapshot (the request names it; vcsim itself clones the VM as it is, and ignores it), the
/// new VM known by its own UID, the source untouched.
#[tokio::test]
async fn on_vsphere_a_restore_clones_a_new_vm_from_the_snapshot() -> anyhow::Result<()> {
    let t = OnVsphere::start("snap-restore-vc", true).await?;
    let (env, vc, n, vms, snaps, proxy) = (&t.env, &t.vc, &t.n, &t.vms, &t.snaps, t.proxy.as_ref().expect("proxied"));
    let (web, _) = t.ready_vm("web", json!({})).await?;
    env.apply(snapshot(&env, "golden", "web", json!({}))).await?;
    let golden = taken(&snaps, "golden").await?;

    env.apply(vm(&env, "copy", &n, VCENTER, json!({"source": {"snapshotRef": {"name": "golden"}, "linkedClone": true}}))).await?;
    let copy = wait_for(&vms, "copy", 90, "Ready", is_ready).await?;
    assert_ne!(machine_uid(&copy), machine_uid(&web));
    let moref = vc.find_vm(&machine_uid(&copy)).await?.expect("the restored VM on vcsim, under its own UID");
    assert_eq!(vc.name(&moref).await?, format!("{}_copy", env.ns));
    let clones: Vec<_> = proxy.log().into_iter().filter(|r| r.op.as_deref() == Some("CloneVM_Task") && r.body_has(&format!(">{}</snapshot>", snapshot_id(&golden)))).collect();
    assert_eq!(clones.len(), 1, "one clone from the snapshot");
    assert!(clones[0].body_has("createNewChildDiskBacking"), "a linked clone was asked for");
    assert_eq!(vc.snapshots(&vc.find_vm(&machine_uid(&web)).await?.unwrap()).await?.0.len(), 1, "the source keeps its snapshot");

    // Bad input: a snapshot that is not there, or on another Provider than the VM's.
    env.apply(vm(&env, "nowhere", &n, VCENTER, json!({"source": {"snapshotRef": {"name": "nope"}}}))).await?;
    let why = |v: Option<&VirtualMachine>| v?.status.as_ref()?.conditions.iter().find(|c| c.type_ == "InfrastructureReady").map(|c| (c.reason.clone(), c.message.clone()));
    let v = wait_for(&vms, "nowhere", 60, "InvalidRestore", move |v: Option<&VirtualMachine>| why(v).is_some_and(|(r, _)| r == "InvalidRestore")).await?;
    assert!(why(Some(&v)).unwrap().1.starts_with("spec.source.snapshotRef:"));
    let names = vc.vm_names().await?;
    assert!(!names.contains(&format!("{}_nowhere", env.ns)), "nothing made: {names:?}");
    Ok(())
}

/// A control plane killed between the backend taking a snapshot and the status saying so
/// takes no second one: the restarted one finds it by the VMSnapshot's UID. The window is
/// made certain, not raced: a proxy lets vSphere take the snapshot and loses its answer.
#[tokio::test]
async fn a_kill_between_the_backend_taking_a_snapshot_and_the_status_write_makes_no_second_one() -> anyhow::Result<()> {
    use banlieue_test_backends::fault_proxy::Fault;
    let mut t = OnVsphere::start("snap-kill", true).await?;
    let (_, moref) = t.ready_vm("web", json!({})).await?;
    let cp = t.cp.take().expect("running");
    let (env, vc, snaps, proxy) = (&t.env, &t.vc, &t.snaps, t.proxy.as_ref().expect("proxied"));

    // vCenter takes the snapshot, its answer is lost, and it stays unreachable until the kill:
    // nothing can be adopted before, whatever the timing.
    let asked = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = asked.clone();
    proxy.set(move |r| {
        if r.op.as_deref() == Some("CreateSnapshot_Task") && !seen.swap(true, std::sync::atomic::Ordering::SeqCst) {
            Fault::ForwardThenFail(503)
        } else if seen.load(std::sync::atomic::Ordering::SeqCst) {
            Fault::Status(503)
        } else {
            Fault::Pass
        }
    });
    env.apply(snapshot(&env, "crashy", "web", json!({}))).await?;
    let uid = wait_for(&snaps, "crashy", 30, "exists", |s: Option<&VMSnapshot>| s.is_some()).await?.uid().expect("uid");
    let name = format!("bl-{uid}");
    // vcsim has no watch: poll its tree (bounded) for the snapshot its lost answer made.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !vc.snapshots(&moref).await?.0.iter().any(|(_, n)| *n == name) {
        anyhow::ensure!(Instant::now() < deadline, "no snapshot {name} appeared on vcsim within 60 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cp.kill();
    let at_kill = snaps.get("crashy").await?;
    assert_ne!(phase(Some(&at_kill)), Some(SnapshotPhase::Ready), "killed before the status said it was taken");
    proxy.clear();

    let _cp = ControlPlane::start(&env)?;
    let s = taken(&snaps, "crashy").await?;
    let (tree, _) = vc.snapshots(&moref).await?;
    assert_eq!(tree.iter().filter(|(_, n)| *n == name).count(), 1, "exactly one snapshot on vSphere: {tree:?}");
    assert_eq!(tree.len(), 1, "{tree:?}");
    assert_eq!(tree[0].0, snapshot_id(&s), "the one taken before the kill, adopted");
    let creates = proxy.log().iter().filter(|r| r.op.as_deref() == Some("CreateSnapshot_Task")).count();
    assert_eq!(creates, 1, "vSphere was asked once");
    Ok(())
}

/// A schedule every ten seconds with `keepLast: 2` over a pool of three VMs on vcsim: after
/// four runs each VM has exactly its two newest snapshots on vSphere (the older removed there);
/// a control plane down across two scheduled times catches up once, at the latest of them.
#[tokio::test]
async fn a_schedule_over_a_pool_keeps_the_last_two_per_vm_and_catches_up_once() -> anyhow::Result<()> {
    use banlieue_api::snapshot::{SCHEDULED_AT_ANNOTATION, SCHEDULE_LABEL};
    use banlieue_api::VMSnapshotSchedule;
    let mut t = OnVsphere::start("snap-sched", false).await?;
    let cp = t.cp.take().expect("running");
    let (env, vc, n, vms, snaps) = (&t.env, &t.vc, &t.n, &t.vms, &t.snaps);
    let schedules: Api<VMSnapshotSchedule> = Api::namespaced(env.client.clone(), &env.ns);
    env.apply(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachinePool", "metadata": {"name": "web", "namespace": env.ns},
                     "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                              "template": {"metadata": {"labels": {"app": "web"}},
                                           "spec": {"classRef": {"name": n.vm_class}, "imageRef": {"name": n.image}, "placement": {"providerRef": {"name": VCENTER}}}}}}))
        .await?;
    let members: Vec<String> = (0..3).map(|i| format!("web-{i}")).collect();
    let mut morefs = Vec::new();
    for m in &members {
        let v = wait_for(&vms, m, 120, "Ready", is_ready).await?;
        morefs.push(vc.find_vm(&machine_uid(&v)).await?.expect("on vcsim"));
    }
    env.apply(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMSnapshotSchedule", "metadata": {"name": "often", "namespace": env.ns},
                     "spec": {"schedule": "*/10 * * * * *", "timeZone": "Europe/Paris", "selector": {"matchLabels": {"banlieue.io/pool": "web"}},
                              "retention": {"keepLast": 2}, "maxInFlightPerProvider": 2}}))
        .await?;
    let run_of = |s: &VMSnapshot| s.annotations().get(SCHEDULED_AT_ANNOTATION).and_then(|a| a.parse::<jiff::Timestamp>().ok());
    let scheduled = ListParams::default().labels(&format!("{SCHEDULE_LABEL}=often"));
    let last_run = |s: Option<&VMSnapshotSchedule>| s.and_then(|s| s.status.as_ref()?.last_schedule_time.as_ref()).map(|t| t.0);

    // Four runs.
    let first = wait_for(&schedules, "often", 30, "a first run", |s: Option<&VMSnapshotSchedule>| last_run(s).is_some()).await?;
    let first = last_run(Some(&first)).unwrap();
    let fourth = first + jiff::SignedDuration::from_secs(30);
    wait_for(&schedules, "often", 60, "four runs", move |s: Option<&VMSnapshotSchedule>| last_run(s).is_some_and(|t| t >= fourth)).await?;
    // Then: each VM has its two newest Ready, on vSphere too (retention catches up with the
    // fourth run's snapshots within a few seconds; a fifth run may start meanwhile).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let list = snaps.list(&scheduled).await?.items;
        let mut settled = true;
        for (m, moref) in members.iter().zip(&morefs) {
            let of_vm: Vec<&VMSnapshot> = list.iter().filter(|s| s.spec.vm_ref.name == *m).collect();
            let ready: Vec<&&VMSnapshot> = of_vm.iter().filter(|s| phase(Some(s)) == Some(SnapshotPhase::Ready)).collect();
            let on_vsphere = vc.snapshots(moref).await?.0;
            settled &= of_vm.len() == 2 && ready.len() == 2 && on_vsphere.len() == 2;
            settled &= ready.iter().all(|s| on_vsphere.iter().any(|(id, _)| *id == snapshot_id(s)));
            settled &= ready.iter().all(|s| run_of(s).is_some_and(|r| r >= first + jiff::SignedDuration::from_secs(20)));
        }
        if settled {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "no moment with exactly the two newest snapshots per VM, on vSphere too: {:#?}", list.iter().map(|s| (s.name_any(), phase(Some(s)))).collect::<Vec<_>>());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // Down across two scheduled times: caught up once, at the latest.
    let before = last_run(schedules.get_opt("often").await?.as_ref()).unwrap();
    cp.kill();
    tokio::time::sleep(Duration::from_secs(25)).await; // the outage itself, not a synchronisation
    let _cp = ControlPlane::start(&env)?;
    let after = wait_for(&schedules, "often", 60, "a run after the restart", move |s: Option<&VMSnapshotSchedule>| last_run(s).is_some_and(|t| t > before)).await?;
    let caught_up = last_run(Some(&after)).unwrap();
    assert!(caught_up >= before + jiff::SignedDuration::from_secs(20), "the latest missed time ({caught_up}), not the first (after {before})");
    let runs: std::collections::BTreeSet<jiff::Timestamp> = snaps.list(&scheduled).await?.items.iter().filter_map(run_of).filter(|r| *r > before && *r < caught_up).collect();
    assert!(runs.is_empty(), "no snapshot of the earlier missed times: {runs:?}");

    // Suspended: what is under way finishes, retention leaves two per VM, on vSphere as in the API.
    schedules.patch("often", &PatchParams::default(), &Patch::Merge(json!({"spec": {"suspend": true}}))).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let list = snaps.list(&scheduled).await?.items;
        let mut settled = list.len() == 6 && list.iter().all(|s| phase(Some(s)) == Some(SnapshotPhase::Ready));
        for moref in &morefs {
            settled &= vc.snapshots(moref).await?.0.len() == 2;
        }
        if settled {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "not two per VM once suspended: {:#?}", list.iter().map(|s| (s.name_any(), phase(Some(s)))).collect::<Vec<_>>());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Proxmox VE

#[tokio::test]
async fn on_proxmox_snapshots_are_taken_rolled_back_to_and_deleted_in_the_vms_snapshot_list() -> anyhow::Result<()> {
    let env = TestEnv::start("snap-pve").await?;
    env.install_crds().await?;
    let pve = FakePve::start().await?;
    let _cp = ControlPlane::start(&env)?;
    let n = proxmox_fixtures(&env, &pve, &pve.password, PveEndpoint::Https).await?;
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    let snaps: Api<VMSnapshot> = Api::namespaced(env.client.clone(), &env.ns);
    env.apply(pve_vm(&env, "web", &n, json!({}))).await?;
    let web = wait_for(&vms, "web", 90, "Ready", is_ready).await?;
    let [on_pve] = pve.vms_tagged(&machine_uid(&web)).await?.try_into().map_err(|v| anyhow::anyhow!("one VM: {v:?}"))?;

    env.apply(snapshot(&env, "before", "web", json!({"description": "before the upgrade"}))).await?;
    let before = taken(&snaps, "before").await?;
    let (list, current) = pve.snapshots(&on_pve.node, on_pve.vmid).await?;
    let before_name = format!("bl-{}", before.uid().unwrap());
    assert_eq!(list.iter().map(|s| s["name"].as_str().unwrap_or("")).collect::<Vec<_>>(), [before_name.as_str()]);
    assert_eq!(list[0]["description"], "before the upgrade");
    assert_eq!(snapshot_id(&before), before_name, "PVE's id is the name");
    assert_eq!(current.as_deref(), Some(before_name.as_str()));

    env.apply(snapshot(&env, "after", "web", json!({}))).await?;
    let after = taken(&snaps, "after").await?;
    assert_eq!(pve.snapshots(&on_pve.node, on_pve.vmid).await?.1, Some(snapshot_id(&after)));

    // Revert: a rollback task on the node, the VM's current snapshot, and the VM running again.
    patch_spec(&vms, "web", json!({"revertTo": "before"})).await?;
    reverted_to(&vms, "web", "before", PowerState::PoweredOn, 90).await?;
    assert_eq!(pve.snapshots(&on_pve.node, on_pve.vmid).await?.1.as_deref(), Some(before_name.as_str()));
    let rollbacks = pve.tasks(&on_pve.node).await?.into_iter().filter(|t| t["type"] == "qmrollback" && t["id"] == on_pve.vmid.to_string()).count();
    assert_eq!(rollbacks, 1, "one rollback task for the VM");
    assert_eq!(pve.vm_status(&on_pve.node, on_pve.vmid).await?["status"], "running");

    snaps.delete("after", &DeleteParams::default()).await?;
    await_deleted(&snaps, "after").await?;
    let (list, _) = pve.snapshots(&on_pve.node, on_pve.vmid).await?;
    assert_eq!(list.iter().map(|s| s["name"].as_str().unwrap_or("")).collect::<Vec<_>>(), [before_name.as_str()]);

    // Restore into a new VM: cloned from the snapshot (a setting made by hand on the source
    // after the snapshot is not in the copy), under its own UID.
    pve.api("PUT", &format!("/nodes/{}/qemu/{}/config", on_pve.node, on_pve.vmid), &[("onboot", "1")]).await?;
    env.apply(pve_vm(&env, "copy", &n, json!({"source": {"snapshotRef": {"name": "before"}}}))).await?;
    let copy = wait_for(&vms, "copy", 90, "Ready", is_ready).await?;
    let [copy_on_pve] = pve.vms_tagged(&machine_uid(&copy)).await?.try_into().map_err(|v| anyhow::anyhow!("one VM: {v:?}"))?;
    assert_ne!(copy_on_pve.vmid, on_pve.vmid);
    assert!(!copy_on_pve.tags.contains(&machine_uid(&web)), "the copy carries its own UID only: {}", copy_on_pve.tags);
    let clones = pve.tasks(&on_pve.node).await?.into_iter().filter(|t| t["type"] == "qmclone" && t["id"] == on_pve.vmid.to_string()).count();
    assert_eq!(clones, 1, "one clone of the source VM");
    assert_ne!(pve.vm_config(&copy_on_pve.node, copy_on_pve.vmid).await?["onboot"], 1, "the snapshot's configuration, not the source's present one");
    vms.delete("copy", &DeleteParams::default()).await?;
    await_deleted(&vms, "copy").await?;

    vms.delete("web", &DeleteParams::default()).await?;
    await_deleted(&vms, "web").await?;
    await_deleted(&snaps, "before").await?;
    assert!(pve.vms_tagged(&machine_uid(&web)).await?.is_empty());
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// libvirtd + qemu

/// Bound on a TCG boot (~15 s alone; two cores shared by parallel tests).
const BOOT_SECS: u64 = 180;
/// Where the test guest writes `#banlieue-disk-write` (tests/backends/libvirtd/build-guest.sh).
const DISK_WRITE_OFFSET: u64 = 40 << 20;

/// A revert on libvirtd brings the guest's disk back: what the booting guest wrote after the
/// snapshot is gone from the volume (read back from the qcow2's present state).
#[tokio::test]
async fn on_libvirtd_a_revert_takes_back_what_the_guest_wrote_after_the_snapshot() -> anyhow::Result<()> {
    let env = TestEnv::start("snap-kvm").await?;
    env.install_crds().await?;
    let lv = Libvirtd::shared()?;
    let domain = format!("{}_web", env.ns);
    let _leftovers = banlieue_test_backends::libvirtd::Leftovers { lv, prefix: format!("{}_", env.ns), volumes: vec![] };
    let _cp = ControlPlane::start(&env)?;
    let n = libvirtd_fixtures(&env, lv).await?;
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    let snaps: Api<VMSnapshot> = Api::namespaced(env.client.clone(), &env.ns);
    let marker = format!("written-after-the-snapshot-{}", env.ns);
    env.apply(secret(&env, "web-user-data", &[("user-data", &format!("#cloud-config\n#banlieue-disk-write: {marker}\n"))])).await?;
    env.apply(vm(&env, "web", &n, KVM, json!({"desiredPowerState": "PoweredOff", "userData": {"name": "web-user-data", "key": "user-data"}}))).await?;
    wait_for(&vms, "web", 90, "Ready, powered off", is_ready).await?;
    let volume = format!("{domain}_root.qcow2");
    let written = |lv: &Libvirtd| -> anyhow::Result<bool> {
        let bytes = lv.read_volume(&volume, DISK_WRITE_OFFSET, 256)?;
        Ok(String::from_utf8_lossy(&bytes).contains(&format!("banlieue-disk:{marker}")))
    };
    assert!(!written(lv)?, "a new disk holds no marker");

    env.apply(snapshot(&env, "clean", "web", json!({}))).await?;
    let clean = taken(&snaps, "clean").await?;
    let name = format!("bl-{}", clean.uid().unwrap());
    assert_eq!(lv.snapshots(&domain)?, (vec![name.clone()], Some(name.clone())), "virsh snapshot-list");
    assert_eq!(clean.status.as_ref().and_then(|s| s.memory), Some(false), "a shut-off domain's snapshot holds no memory");

    // The guest boots and writes its marker after the snapshot.
    patch_spec(&vms, "web", json!({"desiredPowerState": "PoweredOn"})).await?;
    lv.await_serial(&domain, &format!("banlieue-guest: disk-write={marker}"), BOOT_SECS).await?;
    assert!(written(lv)?, "the guest's write is on the volume");

    // Restore into a new VM (off): its disk is the snapshot's, without the guest's write.
    env.apply(vm(&env, "copy", &n, KVM, json!({"desiredPowerState": "PoweredOff", "source": {"snapshotRef": {"name": "clean"}}}))).await?;
    let copy = wait_for(&vms, "copy", 120, "Ready", is_ready).await?;
    let copy_domain = format!("{}_copy", env.ns);
    assert_eq!(lv.uuid(&copy_domain)?, machine_uid(&copy));
    let copy_bytes = lv.read_volume(&format!("{copy_domain}_root.qcow2"), DISK_WRITE_OFFSET, 256)?;
    assert!(!String::from_utf8_lossy(&copy_bytes).contains("banlieue-disk:"), "the copy is the snapshot's disk");
    assert!(lv.snapshots(&copy_domain)?.0.is_empty(), "a restored VM starts with no snapshots");
    assert!(written(lv)?, "the source keeps its write");
    vms.delete("copy", &DeleteParams::default()).await?;
    await_deleted(&vms, "copy").await?;
    assert!(lv.domains(&copy_domain)?.is_empty());

    // Revert (and stay off, so the guest does not write again): the write is gone.
    patch_spec(&vms, "web", json!({"revertTo": "clean", "desiredPowerState": "PoweredOff"})).await?;
    reverted_to(&vms, "web", "clean", PowerState::PoweredOff, 120).await?;
    assert_eq!(lv.state(&domain)?, "shut off");
    assert_eq!(lv.snapshots(&domain)?.1.as_deref(), Some(name.as_str()), "libvirt's current snapshot");
    assert!(!written(lv)?, "what the guest wrote after the snapshot is gone from the volume");

    // Another snapshot, deleted: gone from libvirt's list, the first kept.
    env.apply(snapshot(&env, "later", "web", json!({}))).await?;
    let later = taken(&snaps, "later").await?;
    assert_eq!(lv.snapshots(&domain)?.0.len(), 2);
    snaps.delete("later", &DeleteParams::default()).await?;
    await_deleted(&snaps, "later").await?;
    assert_eq!(lv.snapshots(&domain)?.0, [name.clone()], "{} removed from libvirt", snapshot_id(&later));

    vms.delete("web", &DeleteParams::default()).await?;
    await_deleted(&vms, "web").await?;
    await_deleted(&snaps, "clean").await?;
    assert!(lv.domains(&domain)?.is_empty());
    assert_eq!(lv.volumes(&format!("{domain}_"))?, Vec::<String>::new());
    Ok(())
}
