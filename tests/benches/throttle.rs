//! Backend protection on a real hypervisor: BENCH_VMS VirtualMachines (default 12, the test
//! guest on libvirtd + qemu, TCG) applied at once to one Provider, for each of three
//! `spec.limits`: one operation at a time, the defaults (4 at once, 10 per second), and
//! effectively none. For each: the peak number of creates libvirtd itself had under way at
//! once (from its event stream: each domain's Defined → Started), and the time from apply to
//! every VM Ready. BENCH_RUNS rounds (default 2), medians.
//!
//! `cargo bench -p banlieue-tests --bench throttle` (needs root for libvirtd and `guests/build.sh`).

use std::time::{Duration, Instant};

use banlieue_api::VirtualMachine;
use banlieue_test_backends::libvirtd::{peak_concurrent, EventLog, Libvirtd};
use banlieue_tests::bench::{env_or, median};
use banlieue_tests::control::ControlPlane;
use banlieue_tests::TestEnv;
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use serde_json::{json, Value};

fn main() -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(bench())
}

fn ready(vm: &VirtualMachine) -> bool {
    vm.status.as_ref().is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// One round with `limits` on the Provider: (peak concurrent creates on libvirtd, seconds to all Ready).
async fn round(lv: &Libvirtd, vms: usize, limits: Value) -> anyhow::Result<(usize, f64)> {
    let env = TestEnv::start("bench-throttle").await?;
    env.install_crds().await?;
    let _cp = ControlPlane::start(&env)?;
    let ns = env.ns.clone();
    // The bootstrap tests' config: class, image, Provider `kvm`, VMs `mgmt-<i>` (hard power-off).
    let docs: Vec<Value> = serde_yaml::Deserializer::from_str(&banlieue_tests::bootstrap::config(&ns, env.installation().instance(), lv, vms))
        .map(|d| serde::Deserialize::deserialize(d).map_err(anyhow::Error::from))
        .collect::<anyhow::Result<_>>()?;
    let (vm_docs, mut others): (Vec<Value>, Vec<Value>) = docs.into_iter().partition(|d| d["kind"] == "VirtualMachine");
    for d in &mut others {
        if d["kind"] == "Provider" {
            d["spec"]["limits"] = limits.clone();
        }
        env.apply(d.clone()).await?;
    }
    let mut events = EventLog::subscribe(lv, env.dir(), &format!("{ns}_sentinel")).await?;
    let api: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &ns);
    let mut stream = watcher(api.clone(), watcher::Config::default()).default_backoff().applied_objects().boxed();
    let start = Instant::now();
    for d in vm_docs {
        env.apply(d).await?;
    }
    let mut seen = std::collections::BTreeSet::new();
    tokio::time::timeout(Duration::from_secs(600), async {
        while seen.len() < vms {
            match stream.next().await {
                Some(Ok(vm)) if ready(&vm) => {
                    seen.insert(vm.name_any());
                }
                Some(_) => {}
                None => anyhow::bail!("the watch ended"),
            }
        }
        Ok(())
    })
    .await??;
    let took = start.elapsed().as_secs_f64();
    let spans = events.creates(&format!("{ns}_mgmt-"), vms, Duration::from_secs(60)).await?;
    for i in 0..vms {
        api.delete(&format!("mgmt-{i}"), &Default::default()).await?;
    }
    for i in 0..vms {
        banlieue_tests::await_deleted(&api, &format!("mgmt-{i}")).await?;
    }
    Ok((peak_concurrent(&spans), took))
}

async fn bench() -> anyhow::Result<()> {
    let vms: usize = env_or("BENCH_VMS", 12);
    let runs: usize = env_or("BENCH_RUNS", 2);
    let lv = Libvirtd::shared()?;
    let variants = [
        ("maxConcurrentOperations 1", json!({"maxConcurrentOperations": 1, "operationsPerSecond": 10000})),
        ("defaults (4 at once, 10/s)", json!({})),
        ("1000 at once, 10000/s", json!({"maxConcurrentOperations": 1000, "operationsPerSecond": 10000})),
    ];
    let mut results: Vec<(Vec<f64>, Vec<f64>)> = vec![(vec![], vec![]); variants.len()];
    // Variants interleaved within each run, so a noisy moment hits them alike.
    for run in 1..=runs {
        for (i, (name, limits)) in variants.iter().enumerate() {
            let (peak, took) = round(lv, vms, limits.clone()).await?;
            println!("run {run}, {name}: peak {peak} creates at once on libvirtd, all {vms} Ready in {took:.2}s");
            results[i].0.push(peak as f64);
            results[i].1.push(took);
        }
    }
    println!("\n{vms} VMs applied at once to one libvirtd Provider, {runs} runs (medians):");
    println!("{:<30} {:>22} {:>16}", "spec.limits", "peak creates at once", "all Ready s");
    for ((name, _), (peaks, times)) in variants.iter().zip(results) {
        println!("{name:<30} {:>22} {:>16.2}", median(peaks), median(times));
    }
    Ok(())
}
