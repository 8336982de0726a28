//! A VirtualMachinePool at scale against the same number of VMs applied one by one,
//! in the same run (embedded API server in-process, libvirt test driver, the real
//! placement and provider components): time from 0 to all Ready, time back to 0 with no
//! VM, Machine or domain left, and API writes per member (from the server's audit log,
//! the bench's own requests subtracted).
//!
//! `cargo bench -p banlieue-tests --bench pools` (BENCH_POOL=500, BENCH_ROUNDS=1)

use std::time::{Duration, Instant};

use banlieue_api::{VirtualMachine, VirtualMachinePool};
use banlieue_controller::{Context, Options, Roles};
use banlieue_tests::bench::{env_or, mark, median, writes_since};
use banlieue_tests::control::{apply, guests_dist, libvirt_test_node};
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::{reflector, watcher};
use serde_json::json;

const NS: &str = "default";

fn main() -> anyhow::Result<()> {
    let members: usize = env_or("BENCH_POOL", 500);
    let rounds: usize = env_or("BENCH_ROUNDS", 1);
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(bench(members, rounds))
}

fn ready(vm: &VirtualMachine) -> bool {
    vm.status.as_ref().is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Wait (by watch) until the VMs matching `labels` are `n`, all Ready (or, for 0, gone).
async fn await_vms(client: &kube::Client, labels: &str, n: usize, limit: Duration) -> anyhow::Result<()> {
    let (reader, writer) = reflector::store();
    let api: Api<VirtualMachine> = Api::namespaced(client.clone(), NS);
    let mut events = reflector(writer, watcher(api, watcher::Config::default().labels(labels))).boxed();
    let mut listed = false;
    tokio::time::timeout(limit, async {
        while let Some(event) = events.try_next().await? {
            if matches!(event, watcher::Event::InitDone) {
                listed = true;
            }
            let state = reader.state();
            if listed && state.len() == n && state.iter().all(|vm| ready(vm)) {
                return Ok(());
            }
        }
        anyhow::bail!("watch ended")
    })
    .await
    .map_err(|_| anyhow::anyhow!("VMs {labels} not {n} Ready within {limit:?}"))?
}

struct Round {
    up: f64,
    down: f64,
    writes_up: f64,
    writes_down: f64,
}

async fn bench(members: usize, rounds: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let server = banlieue_apiserver::ApiServer::start(banlieue_apiserver::Config::default()).await?;
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig)?;
    let client = banlieue_tests::client_for(&kubeconfig).await?;
    for crd in banlieue_api::crdgen::all_crds() {
        let api: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> = Api::all(client.clone());
        api.patch(crd.metadata.name.as_deref().unwrap_or_default(), &PatchParams::apply("bench").force(), &Patch::Apply(&crd)).await?;
    }
    let uri = libvirt_test_node(dir.path(), "bench-host", 4096, 8192, 1 << 20)?;
    let mut objects = banlieue_tests::bench::libvirt_objects();
    objects.push(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "host", "namespace": NS},
        "spec": {"providerClassRef": {"name": "libvirt"}, "connection": {"endpoint": uri},
                 "capabilities": {"storageClasses": {"standard": "default-pool"}, "networkClasses": {"default": "default"}},
                 // libvirt's test driver needs no protection: measure banlieue, not the throttle.
                 "limits": {"maxConcurrentOperations": 1000, "operationsPerSecond": 10000}}}));
    for object in objects {
        apply(&client, object).await?;
    }
    let options = Options {
        builtin_dir: guests_dist(),
        cache_dir: Some(dir.path().join("cache")),
        leader_election: false,
        ..Options::default()
    };
    let ctx = Context::new(client.clone(), options)?;
    let roles = tokio::spawn(banlieue_controller::run(ctx.clone(), Roles::ALL, std::future::pending()));
    let libvirt = ctx.libvirt.get(&uri).await?;
    let spec = json!({"classRef": {"name": "small"}, "imageRef": {"name": "debian"}});

    // Warm up: components compiled, the Provider probed, one VM through and gone.
    apply(&client, json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
                          "metadata": {"name": "warmup", "namespace": NS, "labels": {"bench": "warmup"}}, "spec": spec})).await?;
    await_vms(&client, "bench=warmup", 1, Duration::from_secs(120)).await?;
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), NS);
    vms.delete("warmup", &DeleteParams::default()).await?;
    await_vms(&client, "bench=warmup", 0, Duration::from_secs(60)).await?;

    let (mut pool_rounds, mut one_by_one) = (Vec::new(), Vec::new());
    let pools: Api<VirtualMachinePool> = Api::namespaced(client.clone(), NS);
    for round in 0..rounds {
        // A pool: 0 → N → 0.
        let name = format!("pool-{round}");
        let labels = format!("banlieue.io/pool={name}");
        let w0 = mark(&server);
        let start = Instant::now();
        apply(&client, json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachinePool", "metadata": {"name": name, "namespace": NS},
            "spec": {"replicas": members, "selector": {"matchLabels": {"bench": name}},
                     "template": {"metadata": {"labels": {"bench": name}}, "spec": spec}}})).await?;
        await_vms(&client, &labels, members, Duration::from_secs(1800)).await?;
        let up = start.elapsed().as_secs_f64();
        let writes_up = writes_since(&server, w0, 1) as f64 / members as f64;
        let w1 = mark(&server);
        let start = Instant::now();
        pools.patch(&name, &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 0}}))).await?;
        await_vms(&client, &labels, 0, Duration::from_secs(1800)).await?;
        let down = start.elapsed().as_secs_f64();
        let writes_down = writes_since(&server, w1, 1) as f64 / members as f64;
        anyhow::ensure!(libvirt.domain_list().await?.is_empty(), "domains left after scaling the pool to 0");
        pools.delete(&name, &DeleteParams::default()).await?;
        println!("pool {members}: 0 → all Ready {up:.1}s ({writes_up:.1} writes/member), → 0 {down:.1}s ({writes_down:.1} writes/member)");
        pool_rounds.push(Round { up, down, writes_up, writes_down });

        // The same number of VMs, applied one by one (32 in flight), then deleted.
        let batch = format!("batch-{round}");
        let labels = format!("bench={batch}");
        let w0 = mark(&server);
        let start = Instant::now();
        futures::stream::iter((0..members).map(|i| {
            let client = client.clone();
            let object = json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
                                "metadata": {"name": format!("{batch}-{i}"), "namespace": NS, "labels": {"bench": batch}}, "spec": spec});
            async move { apply(&client, object).await }
        }))
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
        await_vms(&client, &labels, members, Duration::from_secs(1800)).await?;
        let up = start.elapsed().as_secs_f64();
        let writes_up = writes_since(&server, w0, members) as f64 / members as f64;
        let w1 = mark(&server);
        let start = Instant::now();
        let names: Vec<String> = vms.list(&ListParams::default().labels(&labels)).await?.items.into_iter().filter_map(|vm| vm.metadata.name).collect();
        futures::stream::iter(names.into_iter().map(|n| {
            let vms = vms.clone();
            async move { vms.delete(&n, &DeleteParams::default()).await.map(|_| ()) }
        }))
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
        await_vms(&client, &labels, 0, Duration::from_secs(1800)).await?;
        let down = start.elapsed().as_secs_f64();
        let writes_down = writes_since(&server, w1, members) as f64 / members as f64;
        anyhow::ensure!(libvirt.domain_list().await?.is_empty(), "domains left after deleting the VMs");
        println!("{members} VMs one by one: 0 → all Ready {up:.1}s ({writes_up:.1} writes/VM), → 0 {down:.1}s ({writes_down:.1} writes/VM)");
        one_by_one.push(Round { up, down, writes_up, writes_down });
    }
    for (what, r) in [("pool", &pool_rounds), ("one by one", &one_by_one)] {
        println!(
            "median of {rounds} ({what}, {members}): up {:.1}s, down {:.1}s, writes/member up {:.1}, down {:.1}",
            median(r.iter().map(|r| r.up).collect()),
            median(r.iter().map(|r| r.down).collect()),
            median(r.iter().map(|r| r.writes_up).collect()),
            median(r.iter().map(|r| r.writes_down).collect())
        );
    }
    roles.abort();
    server.shutdown().await;
    Ok(())
}
