//! A MachineDeployment's worth of CAPI-style Machines to provisioned (embedded API server
//! in-process, libvirt test driver, the real placement and provider components), playing
//! CAPI's part as `tests/capi.rs` does: per machine a bootstrap Secret, a `Machine` and a
//! `LibvirtMachine` cloned from a template, then owned by the Machine. Two variants in the
//! same run: machines CAPI puts in a failure domain (`Machine.spec.failureDomain`), and
//! machines banlieue places across the cluster's domains with the placement policy.
//! Reports the time from the first object to all provisioned and Ready, and API writes per
//! machine (from the server's audit log, the bench's own four per machine subtracted).
//!
//! `cargo bench -p banlieue-tests --bench capi` (BENCH_MACHINES=100, BENCH_ROUNDS=3)

use std::time::{Duration, Instant};

use banlieue_controller::{Context, Options, Roles};
use banlieue_tests::bench::{env_or, mark, median, writes_since};
use banlieue_tests::control::{apply, guests_dist, libvirt_test_node, repo_root};
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::runtime::{reflector, watcher};
use serde_json::{json, Value};

const NS: &str = "default";
const INFRA: &str = "infrastructure.banlieue.io";
/// Requests the bench itself makes per machine: Secret, Machine, LibvirtMachine, owner.
const OWN_WRITES: usize = 4;

fn main() -> anyhow::Result<()> {
    let machines: usize = env_or("BENCH_MACHINES", 100);
    let rounds: usize = env_or("BENCH_ROUNDS", 3);
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(bench(machines, rounds))
}

fn resource(group: &str, version: &str, kind: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), &format!("{}s", kind.to_ascii_lowercase()))
}

fn ready(m: &DynamicObject) -> bool {
    m.data.pointer("/status/initialization/provisioned") == Some(&json!(true))
        && m.data.pointer("/status/conditions").and_then(Value::as_array).is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

/// Wait (by watch) until the LibvirtMachines of `cluster` are `n`, all provisioned and Ready (or, for 0, gone).
async fn await_machines(client: &kube::Client, cluster: &str, n: usize, limit: Duration) -> anyhow::Result<()> {
    let machines = resource(INFRA, "v1alpha1", "LibvirtMachine");
    let writer = reflector::store::Writer::new(machines.clone());
    let reader = writer.as_reader();
    let api = Api::<DynamicObject>::namespaced_with(client.clone(), NS, &machines);
    let config = watcher::Config::default().labels(&format!("cluster.x-k8s.io/cluster-name={cluster}"));
    let mut events = reflector(writer, watcher(api, config)).boxed();
    let mut listed = false;
    tokio::time::timeout(limit, async {
        while let Some(event) = events.try_next().await? {
            if matches!(event, watcher::Event::InitDone) {
                listed = true;
            }
            let state = reader.state();
            if listed && state.len() == n && state.iter().all(|m| ready(m)) {
                return Ok(());
            }
        }
        anyhow::bail!("watch ended")
    })
    .await
    .map_err(|_| anyhow::anyhow!("machines of {cluster} not {n} provisioned within {limit:?}"))?
}

/// A Cluster owning a LibvirtCluster over both Providers, with an endpoint.
async fn cluster(client: &kube::Client, name: &str) -> anyhow::Result<()> {
    let clusters = Api::<DynamicObject>::namespaced_with(client.clone(), NS, &resource("cluster.x-k8s.io", "v1beta2", "Cluster"));
    let c = clusters
        .create(&PostParams::default(), &serde_json::from_value(json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "metadata": {"name": name},
            "spec": {"infrastructureRef": {"apiGroup": INFRA, "kind": "LibvirtCluster", "name": name}}}))?)
        .await?;
    apply(client, json!({"apiVersion": format!("{INFRA}/v1alpha1"), "kind": "LibvirtCluster",
        "metadata": {"name": name, "namespace": NS, "labels": {"cluster.x-k8s.io/cluster-name": name},
                     "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "name": name, "uid": c.metadata.uid, "controller": true}]},
        "spec": {"controlPlaneEndpoint": {"host": "192.0.2.10", "port": 6443}}}))
    .await?;
    let infra = Api::<DynamicObject>::namespaced_with(client.clone(), NS, &resource(INFRA, "v1alpha1", "LibvirtCluster"));
    let provisioned = |c: Option<&DynamicObject>| c.is_some_and(|c| c.data.pointer("/status/failureDomains").and_then(Value::as_array).is_some_and(|l| l.len() == 2));
    tokio::time::timeout(Duration::from_secs(60), kube::runtime::wait::await_condition(infra, name, provisioned)).await??;
    Ok(())
}

/// CAPI's objects for machine `name` of `cluster`, in the order CAPI writes them.
async fn machine(client: &kube::Client, cluster: &str, name: &str, failure_domain: Option<&str>) -> anyhow::Result<()> {
    use base64::Engine;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), NS);
    let value = base64::engine::general_purpose::STANDARD.encode(format!("#cloud-config\nhostname: {name}\n"));
    secrets.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": name}, "type": "cluster.x-k8s.io/secret", "data": {"value": value}}))?).await?;
    let labels = json!({"cluster.x-k8s.io/cluster-name": cluster, "cluster.x-k8s.io/deployment-name": cluster});
    let mut spec = json!({"clusterName": cluster, "bootstrap": {"dataSecretName": name}, "infrastructureRef": {"apiGroup": INFRA, "kind": "LibvirtMachine", "name": name}});
    if let Some(fd) = failure_domain {
        spec["failureDomain"] = json!(fd);
    }
    let machines = Api::<DynamicObject>::namespaced_with(client.clone(), NS, &resource("cluster.x-k8s.io", "v1beta2", "Machine"));
    let m = machines.create(&PostParams::default(), &serde_json::from_value(json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "metadata": {"name": name, "labels": labels}, "spec": spec}))?).await?;
    let infra = Api::<DynamicObject>::namespaced_with(client.clone(), NS, &resource(INFRA, "v1alpha1", "LibvirtMachine"));
    infra
        .create(&PostParams::default(), &serde_json::from_value(json!({"apiVersion": format!("{INFRA}/v1alpha1"), "kind": "LibvirtMachine",
            "metadata": {"name": name, "labels": labels, "annotations": {"cluster.x-k8s.io/cloned-from-name": "workers", "cluster.x-k8s.io/cloned-from-groupkind": format!("LibvirtMachineTemplate.{INFRA}")}},
            "spec": {"classRef": {"name": "small"}, "imageRef": {"name": "debian"}}}))?)
        .await?;
    let owner = json!({"metadata": {"ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "name": name, "uid": m.metadata.uid, "controller": true}]}});
    infra.patch(name, &PatchParams::default(), &Patch::Merge(owner)).await?;
    Ok(())
}

async fn bench(machines: usize, rounds: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let server = banlieue_apiserver::ApiServer::start(banlieue_apiserver::Config::default()).await?;
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig)?;
    let client = banlieue_tests::client_for(&kubeconfig).await?;
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> = Api::all(client.clone());
    let capi: Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        serde_yaml::Deserializer::from_str(&std::fs::read_to_string(repo_root().join("tests/capi/crds.yaml"))?)
            .map(serde::Deserialize::deserialize)
            .collect::<Result<_, _>>()?;
    for crd in banlieue_api::crdgen::all_crds().into_iter().chain(capi) {
        crds.patch(crd.metadata.name.as_deref().unwrap_or_default(), &PatchParams::apply("bench").force(), &Patch::Apply(&crd)).await?;
    }
    let uris = [libvirt_test_node(dir.path(), "host-a", 4096, 8192, 1 << 20)?, libvirt_test_node(dir.path(), "host-b", 4096, 8192, 1 << 20)?];
    let mut objects = banlieue_tests::bench::libvirt_objects();
    for (name, uri) in ["a", "b"].iter().zip(&uris) {
        objects.push(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": name, "namespace": NS},
               "spec": {"providerClassRef": {"name": "libvirt"}, "connection": {"endpoint": uri},
                        "capabilities": {"storageClasses": {"standard": "default-pool"}, "networkClasses": {"default": "default"}}}}));
    }
    for object in objects {
        apply(&client, object).await?;
    }
    let options = Options { builtin_dir: guests_dist(), cache_dir: Some(dir.path().join("cache")), leader_election: false, ..Options::default() };
    let ctx = Context::new(client.clone(), options)?;
    let roles = tokio::spawn(banlieue_controller::run(ctx.clone(), Roles::ALL, std::future::pending()));
    let domain_a = {
        let providers: Api<banlieue_api::Provider> = Api::namespaced(client.clone(), NS);
        let probed = |p: Option<&banlieue_api::Provider>| p.and_then(|p| p.status.as_ref()).is_some_and(|s| !s.failure_domains.is_empty());
        let a = tokio::time::timeout(Duration::from_secs(120), kube::runtime::wait::await_condition(providers.clone(), "a", probed)).await??;
        tokio::time::timeout(Duration::from_secs(120), kube::runtime::wait::await_condition(providers, "b", probed)).await??;
        format!("a/{}", a.and_then(|a| a.status).and_then(|s| s.failure_domains.into_iter().next()).map(|f| f.name).unwrap_or_default())
    };

    // Warm up: components compiled, one machine through and gone.
    cluster(&client, "warmup").await?;
    machine(&client, "warmup", "warmup-0", None).await?;
    await_machines(&client, "warmup", 1, Duration::from_secs(120)).await?;

    let (mut chosen, mut placed) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        for (variant, fd, out) in [("fd", Some(domain_a.as_str()), &mut chosen), ("placed", None, &mut placed)] {
            let name = format!("{variant}-{round}");
            cluster(&client, &name).await?;
            let w0 = mark(&server);
            let start = Instant::now();
            futures::stream::iter((0..machines).map(|i| {
                let (client, name) = (client.clone(), name.clone());
                async move { machine(&client, &name, &format!("{name}-{i}"), fd).await }
            }))
            .buffer_unordered(16)
            .try_collect::<Vec<()>>()
            .await?;
            await_machines(&client, &name, machines, Duration::from_secs(1800)).await?;
            let secs = start.elapsed().as_secs_f64();
            let writes = writes_since(&server, w0, OWN_WRITES * machines) as f64 / machines as f64;
            println!("{variant} round {round}: {machines} machines provisioned in {secs:.1}s ({:.0} ms/machine), {writes:.1} writes/machine", secs * 1000.0 / machines as f64);
            // Which writes, per machine (the bench's own included: 4 creates and patches).
            let mut by_kind = std::collections::BTreeMap::<String, usize>::new();
            for e in server.audit_log().iter().filter(|e| e.seq >= w0 && matches!(e.verb.as_str(), "create" | "update" | "patch" | "delete")) {
                let what = match &e.subresource {
                    Some(sub) => format!("{} {}/{sub}", e.verb, e.resource),
                    None => format!("{} {}", e.verb, e.resource),
                };
                *by_kind.entry(what).or_default() += 1;
            }
            let breakdown: Vec<String> = by_kind.iter().map(|(k, n)| format!("{k} {:.2}", *n as f64 / machines as f64)).collect();
            println!("  per machine: {}", breakdown.join(", "));
            out.push((secs, writes));
        }
    }
    let summary = |label: &str, v: &[(f64, f64)]| {
        let secs = median(v.iter().map(|r| r.0).collect());
        let writes = median(v.iter().map(|r| r.1).collect());
        println!("median {label}: {machines} machines to provisioned {secs:.1}s ({:.0} ms/machine), {writes:.1} API writes/machine", secs * 1000.0 / machines as f64);
    };
    summary("in the failure domain CAPI chose", &chosen);
    summary("placed by the policy", &placed);

    let infra = Api::<DynamicObject>::namespaced_with(client.clone(), NS, &resource(INFRA, "v1alpha1", "LibvirtMachine"));
    infra.delete_collection(&DeleteParams::default(), &Default::default()).await?;
    roles.abort();
    Ok(())
}
