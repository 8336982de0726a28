//! Sharding: the same work done by one replica and by two sharded replicas, side by side.
//! Eight Providers (libvirt's test driver), VMs placed by the spread policy; per round, a
//! fresh API server (a child process) and fresh control planes. Prints, per variant, the
//! time from apply to every VM Ready and each replica's share of the reconciles.
//!
//! `cargo bench -p banlieue-tests --bench sharding` (BENCH_VMS=400, BENCH_RUNS=3)

use std::collections::HashSet;
use std::time::{Duration, Instant};

use banlieue_controller::Sharding;
use banlieue_controller::{Context, Options, Roles};
use banlieue_tests::bench::{env_or, median, ChildApiServer};
use banlieue_tests::control::{apply, guests_dist, libvirt_test_node};
use futures::{StreamExt, TryStreamExt};
use serde_json::json;

const NS: &str = "default";
const PROVIDERS: usize = 8;

fn main() -> anyhow::Result<()> {
    if let Some(served) = banlieue_tests::bench::serve_if_child() {
        return served;
    }
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(bench())
}

struct Round {
    seconds: f64,
    /// Reconciles run by each replica.
    reconciles: Vec<u64>,
}

async fn bench() -> anyhow::Result<()> {
    let vms: usize = env_or("BENCH_VMS", 400);
    let runs: usize = env_or("BENCH_RUNS", 3);
    let (mut one, mut two) = (Vec::new(), Vec::new());
    for run in 0..runs {
        for replicas in [1, 2] {
            let round = round(vms, replicas).await?;
            println!("round {run}, {replicas} replica(s): all Ready after {:.2}s, reconciles per replica {:?}", round.seconds, round.reconciles);
            if replicas == 1 { one.push(round) } else { two.push(round) }
        }
    }
    let share = |r: &Round| *r.reconciles.iter().max().unwrap_or(&0) as f64 / r.reconciles.iter().sum::<u64>().max(1) as f64;
    println!(
        "{vms} VMs on {PROVIDERS} Providers, median of {runs}: 1 replica {:.2}s, {:.0} reconciles; 2 replicas {:.2}s, {:.0} reconciles in all, the busier replica {:.1} % of them",
        median(one.iter().map(|r| r.seconds).collect()),
        median(one.iter().map(|r| r.reconciles.iter().sum::<u64>() as f64).collect()),
        median(two.iter().map(|r| r.seconds).collect()),
        median(two.iter().map(|r| r.reconciles.iter().sum::<u64>() as f64).collect()),
        100.0 * median(two.iter().map(share).collect()),
    );
    Ok(())
}

async fn round(vms: usize, replicas: usize) -> anyhow::Result<Round> {
    let dir = tempfile::tempdir()?;
    let server = ChildApiServer::start().await?;
    let client = server.client.clone();
    apply(&client, json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": banlieue_controller::SYSTEM_NAMESPACE}})).await?;
    let mut objects = banlieue_tests::bench::libvirt_objects();
    for p in 0..PROVIDERS {
        let uri = libvirt_test_node(dir.path(), &format!("host-{p}"), 64, 1024, 1 << 20)?;
        objects.push(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": format!("p{p}"), "namespace": NS},
               "spec": {"providerClassRef": {"name": "libvirt"}, "connection": {"endpoint": uri},
                        "capabilities": {"storageClasses": {"standard": "default-pool"}, "networkClasses": {"default": "default"}},
                        "limits": {"maxConcurrentOperations": 1000, "operationsPerSecond": 10000}}}));
    }
    for object in objects {
        apply(&client, object).await?;
    }
    let mut contexts = Vec::new();
    let mut tasks = Vec::new();
    for r in 0..replicas {
        let options = Options {
            builtin_dir: guests_dist(),
            cache_dir: Some(dir.path().join("cache")),
            leader_election: false,
            identity: format!("replica-{r}"),
            sharding: (replicas > 1).then_some(Sharding { count: 16, lease_duration: Duration::from_secs(15) }),
            ..Options::default()
        };
        let ctx = Context::new(client.clone(), options)?;
        tasks.push(tokio::spawn(banlieue_controller::run(ctx.clone(), Roles::ALL, std::future::pending())));
        contexts.push(ctx);
    }
    // Every shard held before the clock starts (and the components compiled by a warm-up VM).
    for ctx in &contexts {
        if let Some(shards) = &ctx.shards {
            let want = 16 / replicas;
            tokio::time::timeout(Duration::from_secs(60), shards.subscribe().wait_for(|h| h.len() == want)).await??;
        }
    }
    apply(&client, vm("warmup")).await?;
    banlieue_tests::bench::await_ready(&client, NS, HashSet::from(["warmup".to_string()]), Duration::from_secs(60)).await?;
    let before: Vec<u64> = contexts.iter().map(|c| reconciles(c)).collect();

    let names: Vec<String> = (0..vms).map(|i| format!("vm-{i:05}")).collect();
    let start = Instant::now();
    let waiting = tokio::spawn({
        let (client, want) = (client.clone(), names.iter().cloned().collect());
        async move { banlieue_tests::bench::await_ready(&client, NS, want, Duration::from_secs(600)).await }
    });
    futures::stream::iter(names.into_iter().map(|n| {
        let client = client.clone();
        async move { apply(&client, vm(&n)).await }
    }))
    .buffer_unordered(32)
    .try_collect::<Vec<_>>()
    .await?;
    waiting.await??;
    let seconds = start.elapsed().as_secs_f64();
    let counts = contexts.iter().zip(before).map(|(c, b)| reconciles(c) - b).collect();
    tasks.iter().for_each(|t| t.abort());
    drop(server);
    Ok(Round { seconds, reconciles: counts })
}

fn vm(name: &str) -> serde_json::Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name, "namespace": NS},
           "spec": {"classRef": {"name": "small"}, "imageRef": {"name": "debian"}}})
}

/// Reconciles a control plane has run, every controller together (from its metrics).
fn reconciles(ctx: &Context) -> u64 {
    ctx.metrics
        .render()
        .lines()
        .filter(|l| l.starts_with("banlieue_reconciles_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

