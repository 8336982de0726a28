//! Faults of the Kubernetes API: the embedded server SIGKILLed and restarted (a process of
//! its own with `--data-dir`, `banlieue-test-apiserver`) during creates, deletes and a pool
//! scale, and watch-expiry storms (every open watch ended with `410 Gone`, the history
//! compacted) during a pool scale. The control plane runs in this process against libvirt's
//! test driver (whose state this process's connection holds); every end state is checked on
//! libvirt's own domain list.
//!
//! These suites restart and compact the server they talk to, which a test cannot do to a
//! shared cluster: they always run on the embedded server they start, also when
//! `BANLIEUE_TEST_KUBECONFIG` names a cluster.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use banlieue_api::{VirtualMachine, VirtualMachinePool};
use banlieue_libvirt::Libvirt;
use banlieue_tests::apiserver::ApiServerProcess;
use banlieue_tests::control::{libvirt_fixtures, libvirt_test_node, ControlPlane};
use banlieue_tests::faults::{iterations, ready_vms, MadeFor, Rng, Tally};
use banlieue_tests::TestEnv;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use serde_json::json;

const SERVER: &str = env!("CARGO_BIN_EXE_banlieue-test-apiserver");

/// Writes the server acknowledged before it was SIGKILLed are all there after the restart:
/// creates, then updates, then deletes, each killed right after the last acknowledgement.
#[tokio::test]
async fn acknowledged_writes_survive_a_sigkill_of_the_api_server() -> anyhow::Result<()> {
    let mut server = ApiServerProcess::start(SERVER).await?;
    let env = TestEnv::connect("api-kill-writes", &server.kubeconfig()).await?;
    let maps: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.ns);
    let rounds = iterations(2, 10);
    let n = 200;
    let mut lost = 0;
    for round in 0..rounds {
        let names: Vec<String> = (0..n).map(|i| format!("r{round}-{i}")).collect();
        // Creates, 20 at a time; every one acknowledged; then SIGKILL at once.
        acknowledged(&names, |name| {
            let (maps, cm) = (maps.clone(), serde_json::from_value::<ConfigMap>(json!({"metadata": {"name": name}, "data": {"v": "1"}})));
            async move { Ok(maps.create(&PostParams::default(), &cm?).await.map(drop)?) }
        })
        .await?;
        server.sigkill();
        server.restart().await?;
        let found: BTreeSet<String> = maps.list(&ListParams::default()).await?.items.iter().map(|c| c.name_any()).collect();
        lost += names.iter().filter(|n| !found.contains(*n)).count();
        let names: Vec<String> = names.into_iter().filter(|n| found.contains(n)).collect();

        // Updates.
        acknowledged(&names, |name| {
            let maps = maps.clone();
            async move { Ok(maps.patch(&name, &PatchParams::default(), &Patch::Merge(json!({"data": {"v": "2"}}))).await.map(drop)?) }
        })
        .await?;
        server.sigkill();
        server.restart().await?;
        let items = maps.list(&ListParams::default()).await?.items;
        lost += items.iter().filter(|c| names.contains(&c.name_any()) && c.data.as_ref().and_then(|d| d.get("v")).map(String::as_str) != Some("2")).count();

        // Deletes.
        acknowledged(&names, |name| {
            let maps = maps.clone();
            async move { Ok(maps.delete(&name, &Default::default()).await.map(drop)?) }
        })
        .await?;
        server.sigkill();
        server.restart().await?;
        let left = maps.list(&ListParams::default()).await?.items;
        lost += left.iter().filter(|c| names.contains(&c.name_any())).count();
    }
    println!("RELIABILITY suite=api-sigkill-acknowledged-writes iterations={rounds} faults={} writes={} lost={lost}", rounds * 3, rounds * 3 * n);
    assert_eq!(lost, 0, "acknowledged writes lost across SIGKILL");
    Ok(())
}

/// Run `write` for every name, 20 at a time, until every one was acknowledged (or one failed).
async fn acknowledged<F, Fut>(names: &[String], write: F) -> anyhow::Result<()>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    futures::stream::iter(names.iter().cloned())
        .map(write)
        .buffer_unordered(20)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

/// Providers `a` and `b` on two libvirt test hosts with room for every VM of the suites.
async fn two_hosts(env: &TestEnv, cp: &ControlPlane) -> anyhow::Result<Vec<Libvirt>> {
    let (a, b) = (libvirt_test_node(env.dir(), "host-a", 256, 1024, 10_000)?, libvirt_test_node(env.dir(), "host-b", 256, 1024, 10_000)?);
    libvirt_fixtures(env, &[("a", &a), ("b", &b)]).await?;
    Ok(vec![cp.ctx.libvirt.get(&a).await?, cp.ctx.libvirt.get(&b).await?])
}

fn vm(env: &TestEnv, name: &str) -> serde_json::Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name, "namespace": env.ns, "labels": {"suite": "faults"}},
           "spec": {"classRef": {"name": format!("{}-small", env.ns)}, "imageRef": {"name": format!("{}-debian", env.ns)}}})
}

fn pool(env: &TestEnv, name: &str, replicas: usize) -> serde_json::Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachinePool", "metadata": {"name": name, "namespace": env.ns},
           "spec": {"replicas": replicas, "selector": {"matchLabels": {"pool": name}},
                    "template": {"metadata": {"labels": {"pool": name}},
                                 "spec": {"classRef": {"name": format!("{}-small", env.ns)}, "imageRef": {"name": format!("{}-debian", env.ns)}}}}})
}

/// Whether the namespace has converged on `declared` (VM names): every VM Ready, and the
/// libvirt hosts hold exactly one domain per declared VM, the one of its current Machine.
/// Counts into `tally` the backend VMs made a second time (a new Machine UID for a VM).
async fn converged(made: &mut MadeFor, env: &TestEnv, hosts: &[Libvirt], declared: &BTreeSet<String>, tally: &mut Tally) -> anyhow::Result<bool> {
    let (listed, ready) = ready_vms(env).await?;
    let domains = domains(env, hosts).await?;
    let done = listed == declared.len()
        && declared.iter().all(|n| ready.contains_key(n))
        && domains.len() == declared.len()
        && domains.iter().all(|(n, uids)| uids.len() == 1 && ready.get(n).is_some_and(|vm| uids[0] == vm.machine_uid));
    if done {
        made.record(&ready, tally);
    }
    Ok(done)
}

/// The test namespace's domains on every host: VM name → domain UUIDs (the Machine UIDs).
async fn domains(env: &TestEnv, hosts: &[Libvirt]) -> anyhow::Result<BTreeMap<String, Vec<String>>> {
    let prefix = format!("{}_", env.ns);
    let mut found: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for host in hosts {
        for d in host.domain_list().await? {
            if let Some(name) = d.name.strip_prefix(&prefix) {
                found.entry(name.to_string()).or_default().push(d.uuid);
            }
        }
    }
    Ok(found)
}

/// The bound on any convergence after a fault (a failure beyond it, not a figure).
const CONVERGE_WITHIN: Duration = Duration::from_secs(300);

/// Wait (bounded) until the namespace converges on `declared`; the time it took.
async fn converge(made: &mut MadeFor, env: &TestEnv, hosts: &[Libvirt], declared: &BTreeSet<String>, tally: &mut Tally, what: &str) -> anyhow::Result<Duration> {
    let started = Instant::now();
    loop {
        match converged(made, env, hosts, declared, tally).await {
            Ok(true) => {
                let took = started.elapsed();
                println!("{what}: {} VMs converged in {:.2} s", declared.len(), took.as_secs_f64());
                return Ok(took);
            }
            Ok(false) => {}
            // A kube-apiserver just restarted may fail a read with a 500 while its etcd client
            // reconnects ("rpc error: … unexpected EOF"): the test's own look, not the control
            // plane, failed; look again (the bound below still holds).
            Err(e) if server_error(&e) => eprintln!("{what}: looking again after {e:#}"),
            Err(e) => return Err(e),
        }
        if started.elapsed() > CONVERGE_WITHIN {
            let d = domains(env, hosts).await?;
            let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
            let states: Vec<String> = vms
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .map(|v| {
                    let ready = v.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
                    format!("{}: {:?}", v.name_any(), ready.map(|c| (&c.status, &c.reason, &c.message)))
                })
                .collect();
            let maps: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.ns);
            let probe: ConfigMap = serde_json::from_value(json!({"metadata": {"generateName": "probe-"}}))?;
            let write = tokio::time::timeout(Duration::from_secs(5), maps.create(&PostParams::default(), &probe)).await;
            anyhow::bail!("{what}: not converged within {CONVERGE_WITHIN:?} on {} declared VMs; libvirt holds {d:?}; VMs: {states:#?}; a write now: {write:?}", declared.len());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether `e` is the API server failing a request (a 5xx), which a retry may not see.
fn server_error(e: &anyhow::Error) -> bool {
    matches!(e.downcast_ref::<kube::Error>(), Some(kube::Error::Api(s)) if s.code >= 500)
}

/// A fault while `act` runs: SIGKILL the server after a random delay, leave it down a while,
/// restart it. Returns when it is serving again (the fault cleared).
async fn sigkill_during(server: &mut ApiServerProcess, rng: &mut Rng, act: impl std::future::Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    let (delay, down) = (Duration::from_millis(rng.between(0, 1500)), Duration::from_millis(rng.between(50, 1500)));
    let acting = async {
        // A request cut by the kill fails; the test's own writes are retried until accepted.
        act.await
    };
    let killing = async {
        tokio::time::sleep(delay).await;
        server.sigkill();
        tokio::time::sleep(down).await;
        server.restart().await
    };
    let (acted, restarted) = tokio::join!(acting, killing);
    restarted?;
    acted
}

/// Apply `object`, retrying (bounded) while the server is down.
/// `request`, repeated every 0.1 s while it fails (the server is down or restarting), for at
/// most a minute.
async fn retrying<F, Fut>(mut request: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let started = Instant::now();
    loop {
        match request().await {
            Err(_) if started.elapsed() < Duration::from_secs(60) => tokio::time::sleep(Duration::from_millis(100)).await,
            done => return done,
        }
    }
}

async fn apply_retrying(env: &TestEnv, object: serde_json::Value) -> anyhow::Result<()> {
    retrying(|| env.apply(object.clone())).await
}

/// Delete `name`; already gone (an earlier try went through before a kill) is done too.
async fn delete_retrying<K>(api: &Api<K>, name: &str) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    retrying(|| async {
        match api.delete(name, &Default::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    })
    .await
}

/// The server SIGKILLed at a random moment of creates, of a pool scale and of deletes; each
/// time the control plane (in this process, its watches cut and resumed or relisted with
/// `410 Gone`) converges on exactly the declared VMs, each made once, and deletion leaves none.
#[tokio::test]
async fn the_control_plane_converges_across_api_server_sigkills() -> anyhow::Result<()> {
    let server = ApiServerProcess::start(SERVER).await?;
    converges_across_sigkills(server, "api-sigkill-control-plane").await
}

/// The same with a real kube-apiserver SIGKILLed (etcd keeps running, as when an API server
/// of a real control plane crashes) and restarted on the same etcd data.
#[tokio::test]
async fn the_control_plane_converges_across_kube_apiserver_sigkills() -> anyhow::Result<()> {
    let Some(scripts) = ApiServerProcess::kubernetes_scripts() else {
        eprintln!("skipped: needs a kube-apiserver it may kill: set BANLIEUE_TEST_KUBERNETES to the directory of its start.sh and stop.sh");
        return Ok(());
    };
    let server = ApiServerProcess::start_kubernetes(&scripts).await?;
    converges_across_sigkills(server, "kube-apiserver-sigkill-control-plane").await
}

async fn converges_across_sigkills(mut server: ApiServerProcess, suite: &'static str) -> anyhow::Result<()> {
    let env = TestEnv::connect("api-kill-vms", &server.kubeconfig()).await?;
    env.install_crds().await?;
    let cp = ControlPlane::start(&env)?;
    let hosts = two_hosts(&env, &cp).await?;
    let mut rng = Rng::seeded(suite, 0x16_0001);
    let mut tally = Tally::new(suite);
    let mut made = MadeFor::default();
    let (rounds, per_round, members) = (iterations(2, 10), 6, 8);
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    let pools: Api<VirtualMachinePool> = Api::namespaced(env.client.clone(), &env.ns);
    for round in 0..rounds {
        // Creates.
        let names: Vec<String> = (0..per_round).map(|i| format!("r{round}-vm-{i}")).collect();
        sigkill_during(&mut server, &mut rng, async {
            for n in &names {
                apply_retrying(&env, vm(&env, n)).await?;
            }
            Ok(())
        })
        .await?;
        tally.faults += 1;
        let mut declared: BTreeSet<String> = names.iter().cloned().collect();
        let took = converge(&mut made, &env, &hosts, &declared, &mut tally, "creates").await?;
        tally.converge.push(took);

        // A pool scaled out.
        let p = format!("r{round}-pool");
        sigkill_during(&mut server, &mut rng, apply_retrying(&env, pool(&env, &p, members))).await?;
        tally.faults += 1;
        declared.extend((0..members).map(|i| format!("{p}-{i}")));
        let took = converge(&mut made, &env, &hosts, &declared, &mut tally, "pool scale").await?;
        tally.converge.push(took);

        // Deletes: the VMs and the pool (its members go with it).
        sigkill_during(&mut server, &mut rng, async {
            for n in &names {
                delete_retrying(&vms, n).await?;
            }
            delete_retrying(&pools, &p).await
        })
        .await?;
        tally.faults += 1;
        declared.clear();
        let took = converge(&mut made, &env, &hosts, &declared, &mut tally, "deletes").await?;
        tally.converge.push(took);
        tally.leaked += domains(&env, &hosts).await?.len();
        tally.iterations += 1;
    }
    // The Machines too: none left behind.
    let gvk = kube::api::GroupVersionKind::gvk("infrastructure.banlieue.io", "v1alpha1", "LibvirtMachine");
    let machines: Api<DynamicObject> = Api::namespaced_with(env.client.clone(), &env.ns, &kube::api::ApiResource::from_gvk_with_plural(&gvk, "libvirtmachines"));
    assert!(machines.list(&ListParams::default()).await?.items.is_empty(), "no Machine left");
    tally.report();
    drop(cp);
    Ok(())
}

/// Calls of one driver function so far, from the process's metrics (`banlieue_component_calls`).
fn driver_calls(cp: &ControlPlane, function: &str) -> u64 {
    let wanted = format!("function=\"{function}\"");
    cp.ctx
        .metrics
        .render()
        .lines()
        .filter(|l| l.starts_with("banlieue_component_calls_total{") && l.contains(&wanted) && l.contains("component=\"libvirt\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Watch-expiry storms: every open watch ended with `410 Gone` and the history compacted,
/// again and again at random intervals, during a pool's scale-out and its deletion. The
/// control plane relists and converges; the driver is asked to create each backend VM at most
/// once and to delete each at most twice (the bound documented in BENCHMARKS.md).
#[tokio::test]
async fn watch_expiry_storms_during_a_pool_scale_cost_no_duplicate_backend_vms() -> anyhow::Result<()> {
    let server = ApiServerProcess::start(SERVER).await?;
    let env = TestEnv::connect("watch-storm", &server.kubeconfig()).await?;
    env.install_crds().await?;
    let cp = ControlPlane::start(&env)?;
    let hosts = two_hosts(&env, &cp).await?;
    let mut rng = Rng::seeded("watch-expiry-storm", 0x16_0002);
    let mut tally = Tally::new("watch-expiry-storm");
    let mut made = MadeFor::default();
    let (rounds, members) = (iterations(1, 3), iterations(30, 200));
    let pools: Api<VirtualMachinePool> = Api::namespaced(env.client.clone(), &env.ns);
    for round in 0..rounds {
        let (creates, deletes) = (driver_calls(&cp, "create"), driver_calls(&cp, "delete"));
        let p = format!("storm-{round}");
        env.apply(pool(&env, &p, members)).await?;
        let declared: BTreeSet<String> = (0..members).map(|i| format!("{p}-{i}")).collect();
        // A storm of fixed length over the scale-out, then the time from its last expiry until
        // the backends hold the pool.
        let storm_for = Duration::from_secs(iterations(6, 20) as u64);
        let started = Instant::now();
        while started.elapsed() < storm_for {
            tally.faults += 1;
            server.expire_watches()?;
            tokio::time::sleep(Duration::from_millis(rng.between(100, 600))).await;
        }
        tally.faults += 1;
        server.expire_watches()?;
        let took = converge(&mut made, &env, &hosts, &declared, &mut tally, "scale-out after the storm").await?;
        tally.converge.push(took);
        let created = driver_calls(&cp, "create") - creates;

        pools.delete(&p, &Default::default()).await?;
        let none = BTreeSet::new();
        let started = Instant::now();
        while !converged(&mut made, &env, &hosts, &none, &mut tally).await? {
            anyhow::ensure!(started.elapsed() < Duration::from_secs(300), "deletion did not converge under the storm in 300 s");
            tally.faults += 1;
            server.expire_watches()?;
            tokio::time::sleep(Duration::from_millis(rng.between(100, 600))).await;
        }
        let deleted = driver_calls(&cp, "delete") - deletes;
        println!("watch-expiry-storm round {round}: {members} members, {created} create calls, {deleted} delete calls");
        tally.duplicated += created.saturating_sub(members as u64) as usize;
        assert!(deleted <= 2 * members as u64, "{deleted} delete calls for {members} backend VMs");
        tally.leaked += domains(&env, &hosts).await?.len();
        tally.iterations += 1;
    }
    tally.report();
    Ok(())
}

/// A watch resumed after restarts, from any resourceVersion the client saw before a crash,
/// is told `410 Gone` at once (it lists again); one from a fresh list sees the next change.
#[tokio::test]
async fn watches_resumed_across_restarts_are_told_to_list_again() -> anyhow::Result<()> {
    let mut server = ApiServerProcess::start(SERVER).await?;
    let env = TestEnv::connect("api-kill-watch", &server.kubeconfig()).await?;
    let maps: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.ns);
    let mut seen = Vec::new();
    for round in 0..3 {
        let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": format!("m{round}")}}))?;
        seen.push(maps.create(&PostParams::default(), &cm).await?.resource_version().unwrap_or_default());
        seen.push(maps.list(&ListParams::default()).await?.metadata.resource_version.unwrap_or_default());
        server.sigkill();
        server.restart().await?;
        for rv in &seen {
            let mut events = maps.watch(&kube::api::WatchParams::default().timeout(10), rv).await?.boxed();
            let first = tokio::time::timeout(Duration::from_secs(5), events.next()).await;
            let gone = matches!(&first, Ok(Some(Err(kube::Error::Api(e)))) if e.code == 410)
                || matches!(&first, Ok(Some(Ok(kube::api::WatchEvent::Error(e)))) if e.code == 410);
            assert!(gone, "round {round}: a watch from {rv} (seen before the crash) got {first:?}");
        }
    }
    // A fresh list and watch sees the next change.
    let rv = maps.list(&ListParams::default()).await?.metadata.resource_version.unwrap_or_default();
    let mut events = maps.watch(&kube::api::WatchParams::default().timeout(10), &rv).await?.boxed();
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "after"}}))?;
    maps.create(&PostParams::default(), &cm).await?;
    let next = tokio::time::timeout(Duration::from_secs(5), events.next()).await;
    assert!(matches!(&next, Ok(Some(Ok(kube::api::WatchEvent::Added(c)))) if c.name_any() == "after"), "{next:?}");
    Ok(())
}
