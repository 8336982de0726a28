//! Faults from drivers (issue 16): a driver returning garbage, and one bad Provider among
//! healthy ones.
//!
//! A. Garbage: the hostile driver (`guests/hostile-provider`, its behaviour chosen by the
//!    Provider's name) returns from `probe` millions of failure domains, megabytes of name,
//!    labels that are not labels, names aliasing one 32 MiB string; from `create`/`describe`
//!    megabyte provider IDs, thousands of addresses that are not IPs, invalid conditions and
//!    an enum discriminant the contract does not have. Each becomes a condition saying what
//!    was wrong (`InvalidDriverResult`, or `MemoryLimitExceeded` when the guest cannot even
//!    build it), the objects stay small, and VMs on a healthy libvirt Provider keep becoming
//!    Ready meanwhile.
//! B. One bad Provider among many: four healthy libvirt Providers, and one whose backend
//!    stopped answering (its `describe` blocks until the host's request timeout). VMs on the
//!    healthy ones must become Ready about as fast as without it.
//!
//! Short iteration counts by default; `BANLIEUE_FAULTS_FULL=1` runs the full ones.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use banlieue_api::{Provider, VirtualMachine};
use banlieue_libvirt::{DomainState, Libvirt};
use banlieue_tests::control::{component_dir, guests_dist, libvirt_fixtures, libvirt_test_node, wait_for, ControlPlane};
use banlieue_tests::faults::{iterations, percentile, Tally};
use banlieue_tests::{await_deleted, TestEnv};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams};
use kube::ResourceExt;
use serde_json::{json, Value};

/// What a Provider, Machine or VM may weigh, serialized, whatever its driver returned.
const SMALL: usize = 32 * 1024;

fn condition(conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition], type_: &str) -> Option<(String, String, String)> {
    let c = conditions.iter().find(|c| c.type_ == type_)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn vm_ready(vm: Option<&VirtualMachine>) -> Option<(String, String, String)> {
    condition(&vm?.status.as_ref()?.conditions, "Ready")
}

fn is_ready(vm: Option<&VirtualMachine>) -> bool {
    vm_ready(vm).is_some_and(|(s, _, _)| s == "True")
}

fn vm(env: &TestEnv, name: &str, provider: &str) -> Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name, "namespace": env.ns},
           "spec": {"classRef": {"name": format!("{}-small", env.ns)}, "imageRef": {"name": format!("{}-debian", env.ns)},
                    "placement": {"providerRef": {"name": provider}}}})
}

/// The hostile driver as ProviderClass `<ns>-<suffix>` of `kind`, and the VMImage with a
/// source for it as well as for libvirt.
async fn hostile_class(env: &TestEnv, suffix: &str, kind: &str) -> anyhow::Result<String> {
    let path = component_dir(env).join("hostile-provider.wasm");
    std::fs::copy(guests_dist().join("hostile-provider.wasm"), &path)?;
    let class = format!("{}-{suffix}", env.ns);
    env.apply(
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "ProviderClass", "metadata": {"name": class},
               "spec": {"component": {"source": format!("file://{}", path.display()), "verification": {"allowUnsigned": true}},
                        "infrastructureKind": kind,
                        // The `hang` mode calls its endpoint (a blackhole); the others reach nothing.
                        "capabilities": {"http": true}}}),
    )
    .await?;
    env.apply(
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": format!("{}-debian", env.ns)},
               "spec": {"sources": [{"providerClass": env.libvirt_class(), "backingFile": "/var/lib/images/debian.qcow2"},
                                    {"providerClass": class, "backingFile": "/var/lib/images/debian.qcow2"}]}}),
    )
    .await?;
    Ok(class)
}

async fn hostile_provider(env: &TestEnv, class: &str, name: &str, endpoint: &str) -> anyhow::Result<()> {
    env.apply(
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": name, "namespace": env.ns},
               "spec": {"providerClassRef": {"name": class}, "connection": {"endpoint": endpoint},
                        "capabilities": {"storageClasses": {"standard": "pool"}, "networkClasses": {"default": "net"}}}}),
    )
    .await
}

/// The object's size as the API serves it.
async fn size<K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize>(api: &Api<K>, name: &str) -> anyhow::Result<usize> {
    Ok(serde_json::to_vec(&api.get(name).await?)?.len())
}

fn machines(env: &TestEnv, kind: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("infrastructure.banlieue.io", "v1alpha1", &format!("{kind}Machine"));
    Api::namespaced_with(env.client.clone(), &env.ns, &ApiResource::from_gvk_with_plural(&gvk, &format!("{}machines", kind.to_ascii_lowercase())))
}

/// Domains of the test's namespace on each connection: domain name → how many connections have it.
async fn domains(libvirts: &[Libvirt], ns: &str) -> anyhow::Result<BTreeMap<String, usize>> {
    let prefix = format!("{ns}_");
    let mut all = BTreeMap::new();
    for l in libvirts {
        for d in l.domain_list().await? {
            if d.name.starts_with(&prefix) && d.state == DomainState::Running {
                *all.entry(d.name).or_default() += 1;
            }
        }
    }
    Ok(all)
}

async fn delete_vms(vms: &Api<VirtualMachine>, names: &[String]) -> anyhow::Result<()> {
    for n in names {
        vms.delete(n, &DeleteParams::default()).await?;
    }
    for n in names {
        await_deleted(vms, n).await?;
    }
    Ok(())
}

#[tokio::test]
async fn garbage_from_a_driver_becomes_a_condition_and_objects_stay_small() -> anyhow::Result<()> {
    let env = TestEnv::start("faults-garbage").await?;
    env.install_crds().await?;
    let cp = ControlPlane::start(&env)?;
    let healthy = libvirt_test_node(env.dir(), "healthy", 8, 64, 1000)?;
    libvirt_fixtures(&env, &[("healthy", &healthy)]).await?;
    let libvirt = cp.ctx.libvirt.get(&healthy).await?;
    let class = hostile_class(&env, "hostile", "Hostile").await?;
    let mut tally = Tally::new("drivers_garbage");

    // Probes: what the Provider says, and that it stays small.
    let providers: Api<Provider> = Api::namespaced(env.client.clone(), &env.ns);
    let probes = [
        ("domains-100000", "InvalidDriverResult", "the driver's probe returned 100,000 failure domains; at most 1,000 are accepted"),
        ("domains-2000000", "MemoryLimitExceeded", "memory limit of 64 MiB"),
        ("huge-domain", "InvalidDriverResult", "8,388,608 bytes; at most 256 bytes are accepted"),
        ("bad-labels", "InvalidDriverResult", "5,000 labels on failure domain \"ok\"; at most 64 are accepted"),
        ("alias-40", "InvalidDriverResult", "more than the host copies out of a sandbox"),
    ];
    for (name, _, _) in probes {
        hostile_provider(&env, &class, name, "https://127.0.0.1:1").await?;
    }
    for (name, reason, want) in probes {
        let p = wait_for(&providers, name, 60, reason, move |p: Option<&Provider>| {
            p.and_then(|p| condition(&p.status.as_ref()?.conditions, "Ready")).is_some_and(|(s, r, _)| s == "False" && r == reason)
        })
        .await?;
        let (_, _, message) = condition(&p.status.as_ref().unwrap().conditions, "Ready").unwrap();
        assert!(message.contains(want), "{name}: {message}");
        assert!(p.status.as_ref().unwrap().failure_domains.is_empty(), "{name}: nothing of the garbage is published");
        let bytes = size(&providers, name).await?;
        assert!(bytes < SMALL, "Provider {name} is {bytes} bytes");
        println!("provider {name}: {reason}: {message} ({bytes} bytes)");
        tally.faults += 1;
    }

    // Machine calls: each round, one VM per garbage mode and one on the healthy Provider.
    let garbage = [
        ("huge-status", "provider ID of 8,388,608 bytes; at most 512 bytes are accepted"),
        ("bad-addresses", "5,000 addresses; at most 64 are accepted"),
        ("bad-conditions", "1,000 conditions; at most 16 are accepted"),
        ("bad-enum", "a value its contract does not define (unexpected discriminant: 7)"),
    ];
    for (name, _) in garbage {
        hostile_provider(&env, &class, name, "https://127.0.0.1:1").await?;
        wait_for(&providers, name, 60, "Ready", |p: Option<&Provider>| {
            p.and_then(|p| condition(&p.status.as_ref()?.conditions, "Ready")).is_some_and(|(s, _, _)| s == "True")
        })
        .await?;
    }
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    let hostile_machines = machines(&env, "Hostile");
    let rounds = iterations(1, 5);
    for round in 0..rounds {
        let ok = format!("ok-{round}");
        let mut names = vec![ok.clone()];
        for (mode, _) in garbage {
            let name = format!("{mode}-{round}");
            env.apply(vm(&env, &name, mode)).await?;
            names.push(name);
        }
        let start = Instant::now();
        env.apply(vm(&env, &ok, "healthy")).await?;
        wait_for(&vms, &ok, 60, "Ready", is_ready).await?;
        let seen = domains(std::slice::from_ref(&libvirt), &env.ns).await?;
        anyhow::ensure!(seen.get(&format!("{}_{ok}", env.ns)) == Some(&1), "{ok} is Ready but libvirt has {seen:?}");
        tally.converge.push(start.elapsed());
        for (mode, want) in garbage {
            let name = format!("{mode}-{round}");
            let v = wait_for(&vms, &name, 60, "InvalidDriverResult", |v: Option<&VirtualMachine>| {
                vm_ready(v).is_some_and(|(s, r, _)| s == "False" && r == "InvalidDriverResult")
            })
            .await?;
            let (_, _, message) = vm_ready(Some(&v)).unwrap();
            assert!(message.contains(want), "{name}: {message}");
            let (vm_bytes, machine_bytes) = (size(&vms, &name).await?, size(&hostile_machines, &name).await?);
            assert!(vm_bytes < SMALL && machine_bytes < SMALL, "{name}: VM {vm_bytes} bytes, Machine {machine_bytes} bytes");
            let machine = hostile_machines.get(&name).await?;
            assert!(machine.data["status"]["addresses"].as_array().is_none_or(|a| a.is_empty()), "{name}: no garbage address is written");
            if round == 0 {
                println!("vm {name}: InvalidDriverResult: {message} (VM {vm_bytes} bytes, Machine {machine_bytes} bytes)");
            }
            tally.faults += 1;
        }
        delete_vms(&vms, &names).await?;
        tally.leaked += domains(std::slice::from_ref(&libvirt), &env.ns).await?.len();
        tally.iterations += 1;
    }
    // Every Provider is still there and small; the healthy one still Ready.
    for p in providers.list(&ListParams::default()).await? {
        let bytes = serde_json::to_vec(&p)?.len();
        assert!(bytes < SMALL, "Provider {} is {bytes} bytes", p.name_any());
    }
    let h = providers.get("healthy").await?;
    assert_eq!(condition(&h.status.unwrap().conditions, "Ready").map(|c| c.0), Some("True".into()));
    tally.report();
    Ok(())
}

/// An endpoint that accepts connections and holds them, never answering (a backend that
/// stopped answering); counts the connections, so a test can see the calls hanging on it.
struct Blackhole {
    url: String,
    accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Blackhole {
    fn start() -> anyhow::Result<Blackhole> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let url = format!("http://127.0.0.1:{}", listener.local_addr()?.port());
        let (accepted, stop) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
        let (count, stopped) = (accepted.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut held = Vec::new();
            while !stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        held.push(conn);
                        count.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Ok(Blackhole { url, accepted, stop })
    }

    /// Wait (bounded) until `n` connections hang on it.
    async fn await_hanging(&self, n: usize) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.accepted.load(Ordering::SeqCst) < n {
            anyhow::ensure!(Instant::now() < deadline, "{n} calls did not reach the blackhole within 60 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }
}

impl Drop for Blackhole {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Apply `names` (pinned round-robin to `providers`) at once; each one's time from its apply
/// to `Ready` with its domain running on libvirt.
async fn burst(env: &TestEnv, vms: &Api<VirtualMachine>, libvirts: &[Libvirt], names: &[String], providers: &[String], tally: &mut Tally) -> anyhow::Result<Vec<Duration>> {
    let mut started = Vec::new();
    for (i, n) in names.iter().enumerate() {
        env.apply(vm(env, n, &providers[i % providers.len()])).await?;
        started.push(Instant::now());
    }
    let waits = names.iter().zip(started).map(|(n, t)| async move {
        wait_for(vms, n, 120, "Ready", is_ready).await.map(|_| t.elapsed())
    });
    let latencies = futures::future::try_join_all(waits).await?;
    let seen = domains(libvirts, &env.ns).await?;
    for n in names {
        match seen.get(&format!("{}_{n}", env.ns)).copied().unwrap_or(0) {
            0 => anyhow::bail!("{n} is Ready but no libvirt connection runs it: {seen:?}"),
            1 => {}
            k => tally.duplicated += k - 1,
        }
    }
    Ok(latencies)
}

#[tokio::test]
async fn one_hanging_provider_does_not_slow_the_healthy_ones() -> anyhow::Result<()> {
    let env = TestEnv::start("faults-bad-provider").await?;
    env.install_crds().await?;
    // Eight concurrent reconciles per controller (the default is 32): the bad Provider's
    // machines outnumber them, as a hung backend with many VMs would at any setting.
    const CONCURRENCY: u16 = 8;
    let cp = ControlPlane::start_with(&env, |o| o.concurrency = CONCURRENCY)?;
    let healthy: Vec<String> = (0..4).map(|i| format!("h{i}")).collect();
    let uris: Vec<String> = healthy.iter().map(|h| libvirt_test_node(env.dir(), h, 16, 64, 1000)).collect::<anyhow::Result<_>>()?;
    let pairs: Vec<(&str, &str)> = healthy.iter().map(String::as_str).zip(uris.iter().map(String::as_str)).collect();
    libvirt_fixtures(&env, &pairs).await?;
    let mut libvirts = Vec::new();
    for u in &uris {
        libvirts.push(cp.ctx.libvirt.get(u).await?);
    }
    let providers: Api<Provider> = Api::namespaced(env.client.clone(), &env.ns);
    for h in &healthy {
        wait_for(&providers, h, 60, "Ready", |p: Option<&Provider>| {
            p.and_then(|p| condition(&p.status.as_ref()?.conditions, "Ready")).is_some_and(|(s, _, _)| s == "True")
        })
        .await?;
    }
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    let per_phase = iterations(8, 32);
    let mut tally = Tally::new("drivers_bad_provider");

    // Warm up (components compiled, connections open), then the baseline.
    let warm: Vec<String> = (0..healthy.len()).map(|i| format!("warm-{i}")).collect();
    burst(&env, &vms, &libvirts, &warm, &healthy, &mut tally).await?;
    delete_vms(&vms, &warm).await?;
    let base: Vec<String> = (0..per_phase).map(|i| format!("base-{i}")).collect();
    let baseline = burst(&env, &vms, &libvirts, &base, &healthy, &mut tally).await?;
    delete_vms(&vms, &base).await?;
    tally.leaked += domains(&libvirts, &env.ns).await?.len();

    // The bad Provider, with more VMs than there are concurrent reconciles: created at once,
    // then every describe hangs until the host's request timeout.
    let hole = Blackhole::start()?;
    let endpoint = hole.url.clone();
    let class = hostile_class(&env, "hang", "Libvirt").await?;
    hostile_provider(&env, &class, "hang", &endpoint).await?;
    wait_for(&providers, "hang", 60, "Ready", |p: Option<&Provider>| {
        p.and_then(|p| condition(&p.status.as_ref()?.conditions, "Ready")).is_some_and(|(s, _, _)| s == "True")
    })
    .await?;
    let bad: Vec<String> = (0..2 * CONCURRENCY as usize).map(|i| format!("bad-{i}")).collect();
    for n in &bad {
        env.apply(vm(&env, n, "hang")).await?;
    }
    let libvirt_machines = machines(&env, "Libvirt");
    for n in &bad {
        // Created (its provider ID written): from now on each reconcile describes, and hangs.
        wait_for(&libvirt_machines, n, 60, "created", |m: Option<&DynamicObject>| m.is_some_and(|m| m.data["spec"]["providerID"].is_string())).await?;
    }
    // Their describes hang: at least as many as one Provider may hold of the machine
    // reconciler's concurrent reconciles (half of them).
    hole.await_hanging(CONCURRENCY as usize / 2).await?;
    tally.faults += bad.len();
    let with: Vec<String> = (0..per_phase).map(|i| format!("with-{i}")).collect();
    let degraded = burst(&env, &vms, &libvirts, &with, &healthy, &mut tally).await?;
    tally.converge.extend(degraded.iter().copied());
    tally.iterations = baseline.len() + degraded.len();
    let (b50, d50) = (percentile(&baseline, 50), percentile(&degraded, 50));
    println!(
        "LATENCY suite=drivers_bad_provider healthy_vms={per_phase} bad_vms={} without_bad_p50_s={:.2} with_bad_p50_s={:.2} without_bad_max_s={:.2} with_bad_max_s={:.2}",
        bad.len(),
        b50.as_secs_f64(),
        d50.as_secs_f64(),
        percentile(&baseline, 100).as_secs_f64(),
        percentile(&degraded, 100).as_secs_f64()
    );
    delete_vms(&vms, &with).await?;
    delete_vms(&vms, &bad).await?;
    tally.leaked += domains(&libvirts, &env.ns).await?.len();
    tally.report();
    // Within twice the baseline (a floor of 250 ms keeps a sub-second baseline's noise out), the
    // slowest VM too: a stall hits some VMs, those whose machines wait for a reconcile slot
    // the hung calls hold (30 s each).
    let within = |base: Duration| (base * 2).max(base + Duration::from_millis(250));
    let (bmax, dmax) = (percentile(&baseline, 100), percentile(&degraded, 100));
    assert!(d50 <= within(b50), "healthy VMs took {d50:?} (median) with a hanging Provider present, {b50:?} without");
    assert!(dmax <= within(bmax), "the slowest healthy VM took {dmax:?} with a hanging Provider present, {bmax:?} without");
    Ok(())
}
