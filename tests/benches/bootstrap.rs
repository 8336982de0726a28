//! `banlieue bootstrap` of BENCH_VMS management VMs (default 3) on libvirtd + qemu (TCG, the
//! test guest: 1 vCPU, 256 MiB), split by phase, over BENCH_RUNS runs (default 3):
//!
//! - **create**: the process starts, its temporary API server, CRDs and roles come up and
//!   the config's objects are applied;
//! - **wait**: until every VirtualMachine is Ready (placement, Machines, the driver's
//!   volumes, seed, define and start on libvirtd);
//! - **stop**: the temporary control plane's roles stop;
//! - **move**: banlieue's objects are copied into the new cluster (a second embedded API
//!   server with banlieue running, standing in for it);
//! - **other**: the rest of the process's life (starting up before `create` counts, and the
//!   temporary API server's shutdown after the move);
//! - **adopt**: from the end of the process until the new cluster's banlieue has taken every
//!   VM over: Ready, its status naming the new cluster's Machine (it found each domain by its
//!   backend UID; nothing is made);
//! - **total**: from the start of the process to adopted.
//!
//! Each run ends by deleting the VMs through the new cluster. Medians (and maxima) printed.
//!
//! `cargo build --release -p banlieue && cargo bench -p banlieue-tests --bench bootstrap`
//! (needs root for libvirtd and `guests/build.sh`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use banlieue_api::VirtualMachine;
use banlieue_test_backends::libvirtd::Libvirtd;
use banlieue_tests::bench::{env_or, median};
use banlieue_tests::bootstrap::{banlieue, config};
use banlieue_tests::control::{guests_dist, ControlPlane};
use banlieue_tests::TestEnv;
use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::ResourceExt;
use kube::runtime::{watcher, WatchStreamExt};

fn main() -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(bench())
}

/// `phase <name>: … in <secs>s` lines of bootstrap's output: name → seconds.
fn phases(out: &str) -> BTreeMap<String, f64> {
    out.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("phase ")?;
            let (name, tail) = rest.split_once(':')?;
            let secs = tail.split(" in ").nth(1)?.split('s').next()?.parse().ok()?;
            Some((name.to_string(), secs))
        })
        .collect()
}

fn ready(vm: &VirtualMachine) -> bool {
    vm.status.as_ref().is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn run_once(lv: &Libvirtd, vms: usize) -> anyhow::Result<BTreeMap<String, f64>> {
    let target = TestEnv::start("bench-bootstrap").await?;
    target.install_crds().await?;
    let _cp = ControlPlane::start(&target)?;
    let ns = target.ns.clone();
    let file = target.dir().join("bootstrap.yaml");
    std::fs::write(&file, config(&ns, target.installation().instance(), lv, vms))?;
    let data = target.dir().join("data");
    // Watch the new cluster from before the move: adopted = every VM seen Ready there.
    let api: Api<VirtualMachine> = Api::namespaced(target.client.clone(), &ns);
    let mut events = watcher(api.clone(), watcher::Config::default()).default_backoff().applied_objects().boxed();

    let began = Instant::now();
    let out = tokio::time::timeout(
        Duration::from_secs(600),
        tokio::process::Command::new(banlieue()?)
            .env("BANLIEUE_INSTANCE", target.installation().instance().unwrap_or_default())
            .args(["bootstrap", "--metrics-addr", "127.0.0.1:0", "--timeout", "300", "--config"])
            .arg(&file)
            .arg("--data-dir")
            .arg(&data)
            .arg("--builtin-dir")
            .arg(guests_dist())
            .arg("--target-kubeconfig")
            .arg(&target.kubeconfig)
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await??;
    let ended = Instant::now();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    anyhow::ensure!(out.status.success(), "banlieue bootstrap failed: {stdout}");
    if let Some(line) = stdout.lines().find(|l| l.starts_with("phase move:")) {
        println!("  {line}");
    }
    let mut figures = phases(&stdout);
    anyhow::ensure!(figures.len() == 4, "expected create, wait, stop and move in: {stdout}");

    // Adopted: Ready, and reporting the new cluster's Machine (the status that came with the
    // move names the old cluster's).
    let machines: Api<DynamicObject> = Api::namespaced_with(
        target.client.clone(),
        &ns,
        &ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("infrastructure.banlieue.io", "v1alpha1", "LibvirtMachine"), "libvirtmachines"),
    );
    let uids: BTreeMap<String, Option<String>> = machines.list(&Default::default()).await?.items.iter().map(|m| (m.name_any(), m.uid())).collect();
    let adopted = |vm: &VirtualMachine| ready(vm) && vm.status.as_ref().and_then(|s| s.infrastructure_ref.as_ref()).is_some_and(|r| uids.get(&vm.name_any()).is_some_and(|u| *u == r.uid));
    let mut seen = std::collections::BTreeSet::new();
    tokio::time::timeout(Duration::from_secs(300), async {
        while seen.len() < vms {
            match events.next().await {
                Some(Ok(vm)) if adopted(&vm) => {
                    seen.insert(vm.name_any());
                }
                Some(_) => {}
                None => anyhow::bail!("the watch of the new cluster ended"),
            }
        }
        Ok(())
    })
    .await??;
    let phases_sum: f64 = figures.values().sum();
    figures.insert("other".into(), (ended - began).as_secs_f64() - phases_sum);
    figures.insert("adopt".into(), ended.elapsed().as_secs_f64());
    figures.insert("total".into(), began.elapsed().as_secs_f64());
    anyhow::ensure!(lv.domains(&format!("{ns}_mgmt-"))?.len() == vms, "each VM once on libvirt");

    for i in 0..vms {
        api.delete(&format!("mgmt-{i}"), &Default::default()).await?;
    }
    for i in 0..vms {
        banlieue_tests::await_deleted(&api, &format!("mgmt-{i}")).await?;
    }
    Ok(figures)
}

async fn bench() -> anyhow::Result<()> {
    let vms: usize = env_or("BENCH_VMS", 3);
    let runs: usize = env_or("BENCH_RUNS", 3);
    let lv = Libvirtd::shared()?;
    let mut all: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for run in 1..=runs {
        let figures = run_once(lv, vms).await?;
        println!("run {run}: {}", figures.iter().map(|(k, v)| format!("{k} {v:.2}s")).collect::<Vec<_>>().join(", "));
        for (k, v) in figures {
            all.entry(k).or_default().push(v);
        }
    }
    println!("\nbanlieue bootstrap of {vms} VMs on libvirtd + qemu (TCG), {runs} runs:");
    println!("{:<8} {:>10} {:>10}", "phase", "median s", "max s");
    for phase in ["create", "wait", "stop", "move", "other", "adopt", "total"] {
        let v = all.get(phase).cloned().unwrap_or_default();
        let max = v.iter().copied().fold(f64::NAN, f64::max);
        println!("{phase:<8} {:>10.2} {:>10.2}", median(v), max);
    }
    Ok(())
}
