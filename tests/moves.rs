//! Moves that carry the VM's disks (`moveStrategy: CarryDisks`, the default) end to end, checked
//! on each backend's own API — and on the bytes: the booting test guest writes a marker into
//! its disk, and the moved VM's volume, read back from libvirt, holds it.

use std::time::Duration;

use anyhow::Context as _;
use banlieue_api::vm::MovePhase;
use banlieue_api::VirtualMachine;
use banlieue_test_backends::libvirtd::Libvirtd;
use banlieue_tests::backends::{libvirtd_fixtures, libvirtd_provider, secret, vm, KVM};
use banlieue_tests::control::{wait_for, ControlPlane};
use banlieue_tests::{await_deleted, TestEnv};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

/// Bound on a TCG boot (~15 s alone; two cores shared by parallel tests).
const BOOT_SECS: u64 = 180;
/// Where the test guest writes `#banlieue-disk-write` (tests/backends/libvirtd/build-guest.sh).
const DISK_WRITE_OFFSET: u64 = 40 << 20;

fn condition(vm: Option<&VirtualMachine>, type_: &str) -> Option<(String, String, String)> {
    let c = vm?.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn is_ready(vm: Option<&VirtualMachine>) -> bool {
    condition(vm, "Ready").is_some_and(|(s, _, _)| s == "True")
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

/// libvirt → libvirt across two storage pools: the guest's writes arrive, one domain at the end.
#[tokio::test]
async fn a_move_between_libvirt_pools_carries_what_the_guest_wrote() -> anyhow::Result<()> {
    let env = TestEnv::start("carry-kvm").await?;
    env.install_crds().await?;
    let lv = Libvirtd::shared()?;
    let _cp = ControlPlane::start(&env)?;
    let n = libvirtd_fixtures(&env, lv).await?;
    let other = lv.add_pool(&format!("{}-b", env.ns))?;
    let mut kvm_b = libvirtd_provider(&env, lv, "kvm-b", &n.provider_class);
    kvm_b["spec"]["capabilities"]["storageClasses"]["standard"] = json!(other.name);
    env.apply(kvm_b).await?;
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    let (source, target) = (format!("{}_web", env.ns), format!("{}_web.moved", env.ns));

    let marker = format!("carried-{}", env.ns);
    env.apply(secret(&env, "web-user-data", &[("user-data", &format!("#cloud-config\n#banlieue-disk-write: {marker}\n"))])).await?;
    env.apply(vm(&env, "web", &n, KVM, json!({"userData": {"name": "web-user-data", "key": "user-data"}, "powerOffMode": "TrySoft"}))).await?;
    wait_for(&vms, "web", 90, "Ready on kvm", is_ready).await?;
    booted(lv, &source, &format!("disk-write={marker}")).await?;
    // The next boot writes nothing: only a carried disk can hold the marker after the move.
    env.apply(secret(&env, "web-user-data", &[("user-data", "#cloud-config\n")])).await?;

    patch_spec(&vms, "web", json!({"placement": {"providerRef": {"name": "kvm-b"}}})).await?;
    // Every phase the VM shows, and never a second running domain.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<MovePhase>::new()));
    let seen_in = seen.clone();
    let moved = wait_for(&vms, "web", 300, "moved to kvm-b and Ready", move |v: Option<&VirtualMachine>| {
        if let Some(phase) = v.and_then(|v| v.status.as_ref()?.moving.as_ref()).map(|m| m.phase) {
            let mut seen = seen_in.lock().unwrap();
            if seen.last() != Some(&phase) {
                seen.push(phase);
            }
        }
        is_ready(v) && condition(v, "Moved").is_some_and(|(s, _, _)| s == "True")
    })
    .await?;
    let phases = seen.lock().unwrap().clone();
    assert!(phases.contains(&MovePhase::PoweringOff) && phases.contains(&MovePhase::Importing), "the move showed its phases: {phases:?}");
    let st = moved.status.clone().unwrap_or_default();
    assert_eq!(st.scheduled.as_ref().map(|s| s.provider.as_str()), Some("kvm-b"));
    assert_eq!(st.infrastructure_ref.as_ref().map(|r| r.name.as_str()), Some("web.moved"), "a second LibvirtMachine, of another name");
    assert!(st.moving.is_none(), "the move is over: {:?}", st.moving);

    // libvirt: one domain, the new one, running on a volume of the other pool holding the marker.
    assert_eq!(lv.domains(&format!("{}_web", env.ns))?, vec![target.clone()], "exactly one domain after the move");
    assert_eq!(lv.state(&target)?, "running");
    assert!(lv.volumes(&format!("{source}_"))?.is_empty(), "the source's volumes are gone");
    let volume = format!("{target}_root.qcow2");
    assert!(lv.volumes_in(&other.name, &volume)?.contains(&volume), "{:?}", lv.volumes_in(&other.name, "")?);
    let bytes = lv.read_volume_in(&other.name, &volume, DISK_WRITE_OFFSET, 256)?;
    assert!(String::from_utf8_lossy(&bytes).contains(&format!("banlieue-disk:{marker}")), "the carried disk holds what the guest wrote: {:?}", String::from_utf8_lossy(&bytes));
    // The carried disk boots: the guest comes up on it.
    booted(lv, &target, "banlieue-guest: ready").await?;
    assert!(!lv.serial_log(&target).contains("disk-write="), "nothing was written again");

    vms.delete("web", &Default::default()).await?;
    await_deleted(&vms, "web").await?;
    assert!(lv.domains(&format!("{}_web", env.ns))?.is_empty());
    drop(other);
    Ok(())
}
