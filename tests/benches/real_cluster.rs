//! The control loop on a real kube-apiserver beside the embedded one, in the same run:
//! 1,000 VirtualMachines applied → all Ready on libvirt's test driver (the control plane in
//! this process, as `banlieue run` would run it), then all deleted; the API writes it took per
//! VM; and each server's own write ceiling, measured the same way on both: creates/s of a small
//! custom object from 16 clients while a watcher follows them. banlieue's share of the
//! ceiling is (VMs/s × writes per VM) / ceiling.
//!
//! `BANLIEUE_TEST_KUBERNETES=<dir of start.sh> cargo bench -p banlieue-tests --bench real_cluster`
//! (BENCH_VMS=1000, BENCH_CEILING_OBJECTS=3000); without the variable only the embedded server runs.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use banlieue_api::VirtualMachine;
use banlieue_tests::apiserver::ApiServerProcess;
use banlieue_tests::bench::{await_ready, control_plane, env_or, ChildApiServer};
use banlieue_tests::control::{apply, guests_dist, libvirt_test_node};
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use serde_json::json;

const NS: &str = "bench";

fn main() -> anyhow::Result<()> {
    if let Some(served) = banlieue_tests::bench::serve_if_child() {
        return served;
    }
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(bench())
}

struct Figures {
    server: &'static str,
    applied_s: f64,
    ready_s: f64,
    deleted_s: f64,
    writes_per_vm: f64,
    ceiling: f64,
}

async fn bench() -> anyhow::Result<()> {
    let vms: usize = env_or("BENCH_VMS", 1000);
    let objects: usize = env_or("BENCH_CEILING_OBJECTS", 3000);
    let mut all = Vec::new();
    {
        let server = ChildApiServer::start().await?;
        all.push(run("embedded", &server.client, vms, objects).await?);
    }
    match ApiServerProcess::kubernetes_scripts() {
        Some(scripts) => {
            let server = ApiServerProcess::start_kubernetes(&scripts).await?;
            let client = banlieue_tests::client_for(&server.kubeconfig()).await?;
            let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> = Api::all(client.clone());
            for crd in banlieue_api::crdgen::all_crds() {
                let name = crd.metadata.name.clone().unwrap_or_default();
                crds.patch(&name, &PatchParams::apply("bench").force(), &Patch::Apply(&crd)).await?;
                tokio::time::timeout(Duration::from_secs(30), kube::runtime::wait::await_condition(crds.clone(), &name, kube::runtime::wait::conditions::is_crd_established())).await??;
            }
            all.push(run("kube-apiserver 1.24", &client, vms, objects).await?);
        }
        None => println!("(no BANLIEUE_TEST_KUBERNETES: the real kube-apiserver was not run)"),
    }
    println!();
    println!("| server | {vms} VMs applied | all Ready | VMs/s | API writes per VM | deleted | write ceiling (creates/s) | share of the ceiling |");
    println!("|---|---|---|---|---|---|---|---|");
    for f in &all {
        let rate = vms as f64 / f.ready_s;
        println!(
            "| {} | {:.1} s | {:.1} s | {:.0} | {:.1} | {:.1} s | {:.0} | {:.2} |",
            f.server,
            f.applied_s,
            f.ready_s,
            rate,
            f.writes_per_vm,
            f.deleted_s,
            f.ceiling,
            rate * f.writes_per_vm / f.ceiling
        );
    }
    Ok(())
}

async fn run(server: &'static str, client: &kube::Client, vms: usize, objects: usize) -> anyhow::Result<Figures> {
    println!("== {server}");
    let dir = tempfile::tempdir()?;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let _ = namespaces.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": NS}}))?).await;
    let uri = libvirt_test_node(dir.path(), "bench-host", 64, 1024, 1 << 20)?;
    for object in banlieue_tests::bench::libvirt_objects().into_iter().chain([json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "host", "namespace": NS},
        "spec": {"providerClassRef": {"name": "libvirt"}, "connection": {"endpoint": uri},
                 "capabilities": {"storageClasses": {"standard": "default-pool"}, "networkClasses": {"default": "default"}},
                 "limits": {"maxConcurrentOperations": 1000, "operationsPerSecond": 10000}}})])
    {
        apply(client, object).await?;
    }
    let (_ctx, roles) = control_plane(client, guests_dist(), dir.path().join("cache"))?;
    apply(client, vm("warmup")).await?;
    await_ready(client, NS, HashSet::from(["warmup".to_string()]), Duration::from_secs(120)).await?;

    let names: Vec<String> = (0..vms).map(|i| format!("vm-{i:05}")).collect();
    // kube-apiserver's resourceVersion is etcd's revision, one per write to the cluster
    // (the embedded server's counts the same): writes of every client, this bench's included.
    let rv_before = current_rv(client).await?;
    let start = Instant::now();
    let waiting = tokio::spawn({
        let client = client.clone();
        let want = names.iter().cloned().collect();
        async move { await_ready(&client, NS, want, Duration::from_secs(900)).await }
    });
    futures::stream::iter(names.iter().map(|n| apply(client, vm(n)))).buffer_unordered(32).try_collect::<Vec<_>>().await?;
    let applied_s = start.elapsed().as_secs_f64();
    waiting.await??;
    let ready_s = start.elapsed().as_secs_f64();
    let writes = current_rv(client).await?.saturating_sub(rv_before);
    println!("{vms} VMs: applied in {applied_s:.2}s, all Ready after {ready_s:.2}s ({:.0} VMs/s), {writes} writes", vms as f64 / ready_s);

    // Deleted: every one gone, the warm-up's too (their Machines and domains first).
    let api: Api<VirtualMachine> = Api::namespaced(client.clone(), NS);
    let start = Instant::now();
    futures::stream::iter(names.iter().map(String::as_str).chain(["warmup"]).map(|n| {
        let api = api.clone();
        async move { api.delete(n, &DeleteParams::default()).await.map(|_| ()) }
    }))
    .buffer_unordered(32)
    .try_collect::<Vec<_>>()
    .await?;
    // Counted by listing (every 0.1 s: a watch that relists after `410 Gone` shows no
    // deletion events for what went meanwhile).
    tokio::time::timeout(Duration::from_secs(900), async {
        loop {
            if api.list_metadata(&ListParams::default().limit(1)).await?.items.is_empty() {
                return anyhow::Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .map_err(|_| anyhow::anyhow!("VMs not deleted within 900 s"))??;
    let deleted_s = start.elapsed().as_secs_f64();
    println!("{vms} VMs deleted in {deleted_s:.2}s");
    roles.abort();

    let ceiling = write_ceiling(client, objects).await?;
    println!("write ceiling: {ceiling:.0} creates/s (16 clients, a watcher following)");
    Ok(Figures { server, applied_s, ready_s, deleted_s, writes_per_vm: writes as f64 / vms as f64, ceiling })
}

fn vm(name: &str) -> serde_json::Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name, "namespace": NS},
           "spec": {"classRef": {"name": "small"}, "imageRef": {"name": "debian"}}})
}

/// Creates/s the server takes of a small custom object (a PlacementPolicy nothing acts on:
/// the roles are stopped) from 16 clients, while a watcher sees each of them.
async fn write_ceiling(client: &kube::Client, objects: usize) -> anyhow::Result<f64> {
    let api: Api<banlieue_api::PlacementPolicy> = Api::all(client.clone());
    let selector = "bench=ceiling";
    let mut seen = 0usize;
    let mut events = watcher(api.clone(), watcher::Config::default().labels(selector)).default_backoff().applied_objects().boxed();
    let start = Instant::now();
    let creating = futures::stream::iter((0..objects).map(|i| {
        let api = api.clone();
        async move {
            let object = serde_json::from_value(json!({"metadata": {"name": format!("ceiling-{i:05}"), "labels": {"bench": "ceiling"}},
                                                       "spec": {"component": {"source": "builtin:placement-spread"}}}))?;
            api.create(&PostParams::default(), &object).await?;
            anyhow::Ok(())
        }
    }))
    .buffer_unordered(16)
    .try_collect::<Vec<_>>();
    let watching = async {
        while seen < objects {
            if events.try_next().await?.is_none() {
                anyhow::bail!("watch ended");
            }
            seen += 1;
        }
        anyhow::Ok(())
    };
    let (created, watched) = tokio::join!(creating, tokio::time::timeout(Duration::from_secs(600), watching));
    created?;
    watched.map_err(|_| anyhow::anyhow!("the watcher did not see every create within 600 s"))??;
    let rate = objects as f64 / start.elapsed().as_secs_f64();
    api.delete_collection(&DeleteParams::default(), &ListParams::default().labels(selector)).await?;
    Ok(rate)
}

async fn current_rv(client: &kube::Client) -> anyhow::Result<u64> {
    let list = Api::<VirtualMachine>::namespaced(client.clone(), NS).list_metadata(&ListParams::default().limit(1)).await?;
    let rv = list.metadata.resource_version.unwrap_or_default();
    rv.parse().map_err(|_| anyhow::anyhow!("resourceVersion {rv:?} is not a number"))
}
