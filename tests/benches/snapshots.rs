//! Snapshots, measured on the real backends through the whole control plane, against the
//! same operation done by hand on the backend's own API in the same run:
//!
//! 1. per backend (vcsim, fakepve, libvirtd + qemu), BENCH_RUNS times (default 7) on one
//!    powered-off VM: a VMSnapshot applied → Ready, and `spec.revertTo` set → `Reverted`;
//!    beside it the backend call a user would make by hand (vim25 `CreateSnapshot_Task` /
//!    `RevertToSnapshot_Task`, PVE `POST …/snapshot` / `…/rollback`, `virsh snapshot-create-as`
//!    / `snapshot-revert`), each waited for. Medians.
//! 2. a schedule round over BENCH_SCHEDULE_VMS VMs (default 100) on vcsim with
//!    `maxInFlightPerProvider: 4`: seconds from the run's scheduled time to every snapshot
//!    Ready, and the peak number of the run's snapshots `InProgress` at once (a backend call
//!    outstanding for each), seen through a watch; beside it the same snapshots taken one
//!    after another by hand.
//!
//! `cargo bench -p banlieue-tests --bench snapshots` (needs root for libvirtd, `guests/build.sh`,
//! vcsim and fakepve; BENCH_BACKENDS=vsphere,proxmox,libvirt to pick).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use banlieue_api::snapshot::SnapshotPhase;
use banlieue_api::vm::RevertPhase;
use banlieue_api::{VMSnapshot, VirtualMachine};
use banlieue_test_backends::fakepve::FakePve;
use banlieue_test_backends::libvirtd::Libvirtd;
use banlieue_test_backends::vcsim::{self, Vcsim};
use banlieue_tests::backends::{libvirtd_fixtures, proxmox_fixtures, pve_vm, vm, vsphere_fixtures, PveEndpoint, KVM, VCENTER};
use banlieue_tests::bench::{env_or, median};
use banlieue_tests::control::{wait_for, ControlPlane};
use banlieue_tests::TestEnv;
use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use serde_json::json;

fn main() -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(bench())
}

fn ready(v: Option<&VirtualMachine>) -> bool {
    v.and_then(|v| v.status.as_ref()).is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn machine_uid(v: &VirtualMachine) -> String {
    v.status.as_ref().and_then(|s| s.infrastructure_ref.as_ref()?.uid.clone()).unwrap_or_default()
}

/// The backend, by hand: take snapshot `name` of the VM, and revert to it.
enum ByHand<'a> {
    Vsphere(&'a Vcsim, String),
    Proxmox(&'a FakePve, String, u64),
    Libvirt(&'a Libvirtd, String),
}

impl ByHand<'_> {
    async fn snapshot(&self, name: &str) -> anyhow::Result<()> {
        match self {
            ByHand::Vsphere(vc, moref) => vc.create_snapshot_outside(moref, name).await,
            ByHand::Proxmox(pve, node, vmid) => {
                let exit = pve.run_task(node, "POST", &format!("/nodes/{node}/qemu/{vmid}/snapshot"), &[("snapname", name)]).await?;
                anyhow::ensure!(exit == "OK", "snapshot {name}: {exit}");
                Ok(())
            }
            ByHand::Libvirt(lv, domain) => lv.virsh(&["snapshot-create-as", domain, name]).map(drop),
        }
    }

    async fn revert(&self, name: &str) -> anyhow::Result<()> {
        match self {
            ByHand::Vsphere(vc, moref) => {
                let (tree, _) = vc.snapshots(moref).await?;
                let id = tree.into_iter().find(|(_, n)| n == name).map(|(id, _)| id).ok_or_else(|| anyhow::anyhow!("no snapshot {name}"))?;
                vc.revert_snapshot_outside(&id).await
            }
            ByHand::Proxmox(pve, node, vmid) => {
                let exit = pve.run_task(node, "POST", &format!("/nodes/{node}/qemu/{vmid}/snapshot/{name}/rollback"), &[]).await?;
                anyhow::ensure!(exit == "OK", "rollback {name}: {exit}");
                Ok(())
            }
            ByHand::Libvirt(lv, domain) => lv.virsh(&["snapshot-revert", domain, name]).map(drop),
        }
    }
}

/// BENCH_RUNS snapshots and reverts of VM `web` through banlieue and by hand: medians (ms)
/// of (snapshot via banlieue, revert via banlieue, snapshot by hand, revert by hand).
async fn latencies(env: &TestEnv, hand: ByHand<'_>, runs: usize) -> anyhow::Result<[f64; 4]> {
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    let snaps: Api<VMSnapshot> = Api::namespaced(env.client.clone(), &env.ns);
    let (mut take, mut revert, mut take_hand, mut revert_hand) = (vec![], vec![], vec![], vec![]);
    for i in 0..runs {
        let name = format!("s{i}");
        let started = Instant::now();
        env.apply(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMSnapshot", "metadata": {"name": name, "namespace": env.ns}, "spec": {"vmRef": {"name": "web"}}}))
            .await?;
        wait_for(&snaps, &name, 120, "Ready", |s: Option<&VMSnapshot>| s.and_then(|s| s.status.as_ref()?.phase) == Some(SnapshotPhase::Ready)).await?;
        take.push(started.elapsed().as_secs_f64() * 1e3);

        let started = Instant::now();
        vms.patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"revertTo": name}}))).await?;
        let target = name.clone();
        wait_for(&vms, "web", 120, "reverted", move |v: Option<&VirtualMachine>| {
            ready(v) && v.and_then(|v| v.status.as_ref()?.revert.as_ref()).is_some_and(|r| r.snapshot == target && r.phase == RevertPhase::Reverted)
        })
        .await?;
        revert.push(started.elapsed().as_secs_f64() * 1e3);

        let by_hand = format!("hand{i}");
        let started = Instant::now();
        hand.snapshot(&by_hand).await?;
        take_hand.push(started.elapsed().as_secs_f64() * 1e3);
        let started = Instant::now();
        hand.revert(&by_hand).await?;
        revert_hand.push(started.elapsed().as_secs_f64() * 1e3);
    }
    Ok([median(take), median(revert), median(take_hand), median(revert_hand)])
}

async fn web_ready(env: &TestEnv) -> anyhow::Result<VirtualMachine> {
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    wait_for(&vms, "web", 180, "Ready", ready).await
}

fn row(backend: &str, m: [f64; 4]) {
    println!("| {backend} | {:.0} | {:.0} | {:.0} | {:.0} |", m[0], m[2], m[1], m[3]);
}

/// One schedule round over `count` VMs on vcsim: (seconds from the run's time to all Ready,
/// peak InProgress at once, seconds for the same snapshots one after another by hand).
async fn schedule_round(count: usize) -> anyhow::Result<(f64, usize, f64)> {
    let env = TestEnv::start("bench-snap-sched").await?;
    env.install_crds().await?;
    let vc = Vcsim::start().await?;
    let _cp = ControlPlane::start(&env)?;
    let n = vsphere_fixtures(&env, &vc, vcsim::PASSWORD).await?;
    env.apply(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachinePool", "metadata": {"name": "fleet", "namespace": env.ns},
                     "spec": {"replicas": count, "selector": {"matchLabels": {"app": "fleet"}},
                              "template": {"metadata": {"labels": {"app": "fleet"}},
                                           "spec": {"classRef": {"name": n.vm_class}, "imageRef": {"name": n.image}, "desiredPowerState": "PoweredOff",
                                                    "placement": {"providerRef": {"name": VCENTER}}}}}}))
        .await?;
    banlieue_tests::bench::await_ready(&env.client, &env.ns, (0..count).map(|i| format!("fleet-{i}")).collect(), Duration::from_secs(600)).await?;

    // Once, a few seconds from now (six fields: second minute hour, every day).
    let at = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(5);
    let utc = at.to_zoned(jiff::tz::TimeZone::UTC);
    let cron = format!("{} {} {} * * *", utc.second(), utc.minute(), utc.hour());
    let snaps: Api<VMSnapshot> = Api::namespaced(env.client.clone(), &env.ns);
    let mut events = watcher(snaps.clone(), watcher::Config::default()).default_backoff().applied_objects().boxed();
    env.apply(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMSnapshotSchedule", "metadata": {"name": "round", "namespace": env.ns},
                     "spec": {"schedule": cron, "selector": {"matchLabels": {"banlieue.io/pool": "fleet"}}, "retention": {"keepLast": 1}, "maxInFlightPerProvider": 4}}))
        .await?;
    let mut phases: BTreeMap<String, Option<SnapshotPhase>> = BTreeMap::new();
    let mut peak = 0;
    tokio::time::timeout(Duration::from_secs(900), async {
        while phases.len() < count || phases.values().any(|p| *p != Some(SnapshotPhase::Ready)) {
            let Some(s) = events.next().await else { anyhow::bail!("watch ended") };
            let s = s?;
            phases.insert(s.name_any(), s.status.as_ref().and_then(|st| st.phase));
            peak = peak.max(phases.values().filter(|p| **p == Some(SnapshotPhase::InProgress)).count());
        }
        anyhow::Ok(())
    })
    .await
    .map_err(|_| anyhow::anyhow!("the round did not finish"))??;
    let round = (jiff::Timestamp::now().duration_since(at)).as_secs_f64();

    // The same by hand: one after another, each task waited for.
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    let mut morefs = Vec::new();
    for i in 0..count {
        let v = vms.get(&format!("fleet-{i}")).await?;
        morefs.push(vc.find_vm(&machine_uid(&v)).await?.ok_or_else(|| anyhow::anyhow!("fleet-{i} not on vcsim"))?);
    }
    let started = Instant::now();
    for moref in &morefs {
        vc.create_snapshot_outside(moref, "by-hand").await?;
    }
    Ok((round, peak, started.elapsed().as_secs_f64()))
}

async fn bench() -> anyhow::Result<()> {
    let runs: usize = env_or("BENCH_RUNS", 7);
    let backends: String = env_or("BENCH_BACKENDS", "vsphere,proxmox,libvirt".to_string());
    println!("## Snapshot and revert latency, median of {runs} (ms; one powered-off VM)\n");
    println!("| backend | snapshot → Ready (banlieue) | snapshot by hand | revert → Reverted (banlieue) | revert by hand |");
    println!("|---|---|---|---|---|");
    if backends.contains("vsphere") {
        let env = TestEnv::start("bench-snap-vc").await?;
        env.install_crds().await?;
        let vc = Vcsim::start().await?;
        let _cp = ControlPlane::start(&env)?;
        let n = vsphere_fixtures(&env, &vc, vcsim::PASSWORD).await?;
        env.apply(vm(&env, "web", &n, VCENTER, json!({"desiredPowerState": "PoweredOff"}))).await?;
        let web = web_ready(&env).await?;
        let moref = vc.find_vm(&machine_uid(&web)).await?.ok_or_else(|| anyhow::anyhow!("web not on vcsim"))?;
        row("vSphere (vcsim)", latencies(&env, ByHand::Vsphere(&vc, moref), runs).await?);
    }
    if backends.contains("proxmox") {
        let env = TestEnv::start("bench-snap-pve").await?;
        env.install_crds().await?;
        let pve = FakePve::start().await?;
        let _cp = ControlPlane::start(&env)?;
        let n = proxmox_fixtures(&env, &pve, &pve.password, PveEndpoint::Https).await?;
        env.apply(pve_vm(&env, "web", &n, json!({"desiredPowerState": "PoweredOff"}))).await?;
        let web = web_ready(&env).await?;
        let on = pve.vms_tagged(&machine_uid(&web)).await?.into_iter().next().ok_or_else(|| anyhow::anyhow!("web not on fakepve"))?;
        row("Proxmox VE (fakepve)", latencies(&env, ByHand::Proxmox(&pve, on.node, on.vmid), runs).await?);
    }
    if backends.contains("libvirt") {
        let env = TestEnv::start("bench-snap-kvm").await?;
        env.install_crds().await?;
        let lv = Libvirtd::shared()?;
        let domain = format!("{}_web", env.ns);
        let _leftovers = banlieue_test_backends::libvirtd::Leftovers { lv, prefix: domain.clone(), volumes: vec![] };
        let _cp = ControlPlane::start(&env)?;
        let n = libvirtd_fixtures(&env, lv).await?;
        env.apply(vm(&env, "web", &n, KVM, json!({"desiredPowerState": "PoweredOff"}))).await?;
        web_ready(&env).await?;
        row("libvirt (libvirtd + qemu)", latencies(&env, ByHand::Libvirt(lv, domain), runs).await?);
    }
    let count: usize = env_or("BENCH_SCHEDULE_VMS", 100);
    if count > 0 {
        let (round, peak, by_hand) = schedule_round(count).await?;
        println!("\n## A schedule round over {count} VMs on vcsim, maxInFlightPerProvider 4\n");
        println!("| | seconds | peak in progress |");
        println!("|---|---|---|");
        println!("| banlieue: scheduled time → every snapshot Ready | {round:.1} | {peak} |");
        println!("| by hand: CreateSnapshot_Task one after another | {by_hand:.1} | 1 |");
    }
    Ok(())
}
