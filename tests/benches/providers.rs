//! The vSphere and Proxmox VE drivers at scale, on real protocol servers: time from
//! applying N VirtualMachines to all of them Ready on vcsim and on fakepve through the
//! Wasm drivers (`builtin:provider-vsphere`, `builtin:provider-proxmox`), the backend
//! requests and logins that took, and the drivers' guest CPU time against the wall time
//! of their calls (the rest is waiting on the backend). Then every VM is deleted and the
//! time until the Machines are gone and the backend holds none of them is measured.
//!
//! The API server runs in a child process (this binary again, see `serve_api`); the
//! roles run in-process, so the runtime's process-wide counters (`banlieue_runtime::usage`,
//! read through `ctx.metrics.render()`) and the call-duration histograms are this
//! bench's alone. Backends run one at a time; each run has a fresh backend, a fresh
//! namespace with its own Secret and Provider (so a fresh backend session), and starts
//! once the Provider is Ready (its first probe, and login, done).
//!
//! `cargo bench -p banlieue-tests --bench providers`
//! (BENCH_VMS=100, BENCH_RUNS=3, BENCH_BACKENDS=vsphere,proxmox, BENCH_CONCURRENCY=32,
//! BENCH_SHAPES=plain,declared,pools — see [`Shape`];
//! BENCH_PVE_DIRECT=1 points the Proxmox Provider at fakepve's https URL instead of the
//! fixture's counting proxy, so logins are not counted).
//!
//! Needs `guests/build.sh` (guests/dist), vcsim (`tests/backends/vcsim/build.sh`) and
//! fakepve (`tests/backends/fakepve/install.sh`).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use banlieue_api::{Provider, VirtualMachine};
use banlieue_controller::Context;
use banlieue_test_backends::fakepve::{self, FakePve};
use banlieue_test_backends::vcsim::{self, Vcsim};
use banlieue_tests::bench::{control_plane, env_or, median};
use banlieue_tests::control::{apply, guests_dist};
use banlieue_tests::ipam;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use serde_json::{json, Value};

fn main() -> anyhow::Result<()> {
    if let Some(served) = banlieue_tests::bench::serve_if_child() {
        return served;
    }
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(bench())
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Vsphere,
    Proxmox,
}

impl Kind {
    /// The ProviderClass name (also the `component` label of the call metrics).
    fn class(self) -> &'static str {
        match self {
            Kind::Vsphere => "vsphere",
            Kind::Proxmox => "proxmox",
        }
    }
    fn label(self) -> &'static str {
        match self {
            Kind::Vsphere => "vSphere (vcsim)",
            Kind::Proxmox => "Proxmox VE (fakepve)",
        }
    }
    fn machine_resource(self) -> ApiResource {
        let prefix = match self {
            Kind::Vsphere => "VSphere",
            Kind::Proxmox => "Proxmox",
        };
        let gvk = GroupVersionKind::gvk("infrastructure.banlieue.io", "v1alpha1", &format!("{prefix}Machine"));
        ApiResource::from_gvk_with_plural(&gvk, &format!("{}machines", prefix.to_ascii_lowercase()))
    }
}

/// A fresh backend instance.
enum Backend {
    Vsphere(Vcsim),
    Proxmox(FakePve, bool),
}

impl Backend {
    async fn start(kind: Kind) -> anyhow::Result<Backend> {
        Ok(match kind {
            Kind::Vsphere => Backend::Vsphere(Vcsim::start().await?),
            Kind::Proxmox => Backend::Proxmox(FakePve::start().await?, std::env::var_os("BENCH_PVE_DIRECT").is_some()),
        })
    }

    /// The credentials Secret and the Provider `backend` in `ns`.
    fn objects(&self, ns: &str) -> Vec<Value> {
        let (class, endpoint, username, password, ca, storage, network) = match self {
            Backend::Vsphere(v) => ("vsphere", v.url.clone(), vcsim::USERNAME.to_string(), vcsim::PASSWORD.to_string(), None, "LocalDS_0", "VM Network"),
            // Through the counting proxy (plain http on loopback) unless asked otherwise;
            // shared-dir is on every node, so a clone may land on any of them.
            Backend::Proxmox(p, direct) => {
                let (url, ca) = if *direct { (p.url.clone(), Some(p.ca_pem.clone())) } else { (p.proxy_url.clone(), None) };
                ("proxmox", url, p.username.clone(), p.password.clone(), ca, "shared-dir", "vmbr0")
            }
        };
        let mut connection = json!({"endpoint": endpoint, "credentialsRef": {"kind": "Secret", "name": "credentials", "keys": ["username", "password"]}});
        if let Some(ca) = ca {
            connection["caBundle"] = json!(ca);
        }
        vec![
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "credentials", "namespace": ns},
                   "stringData": {"username": username, "password": password}}),
            json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "backend", "namespace": ns},
                   "spec": {"providerClassRef": {"name": class}, "connection": connection,
                            "capabilities": {"storageClasses": {"standard": storage}, "networkClasses": {"default": network}}}}),
        ]
    }

    /// Logins the drivers made: vcsim's live sessions (other than the fixture's), or the
    /// `POST /access/ticket` requests through fakepve's proxy (`None` when not proxied).
    async fn logins(&self) -> anyhow::Result<Option<usize>> {
        Ok(match self {
            Backend::Vsphere(v) => Some(v.login_count().await?),
            Backend::Proxmox(_, true) => None,
            Backend::Proxmox(p, false) => Some(p.logins()),
        })
    }

    /// Requests that went through fakepve's proxy (a cross-check of the http counter).
    fn proxied(&self) -> Option<usize> {
        match self {
            Backend::Proxmox(p, false) => Some(p.requests().len()),
            _ => None,
        }
    }

    /// Every VM and template on the backend, as the backend lists them.
    async fn vms(&self) -> anyhow::Result<BTreeSet<String>> {
        Ok(match self {
            Backend::Vsphere(v) => v.vm_names().await?.into_iter().collect(),
            Backend::Proxmox(p, _) => p.vms().await?.into_iter().map(|v| format!("{}/{}", v.vmid, v.name)).collect(),
        })
    }
}

/// A scrape of the controller's metrics: series (name + labels) → value.
#[derive(Clone, Default)]
struct Scrape(BTreeMap<String, f64>);

impl Scrape {
    fn take(ctx: &Context) -> Scrape {
        let mut out = BTreeMap::new();
        for line in ctx.metrics.render().lines().filter(|l| !l.starts_with('#')) {
            if let Some((series, value)) = line.rsplit_once(' ') {
                if let Ok(v) = value.parse::<f64>() {
                    out.insert(series.to_string(), v);
                }
            }
        }
        Scrape(out)
    }

    /// Sum of the series named `name` whose labels contain every one of `labels`.
    fn sum(&self, name: &str, labels: &[&str]) -> f64 {
        self.0
            .iter()
            .filter(|(k, _)| {
                let (n, l) = k.split_once('{').unwrap_or((k.as_str(), ""));
                n == name && labels.iter().all(|want| l.contains(want))
            })
            .map(|(_, v)| v)
            .sum()
    }

    /// `self - before`, series by series.
    fn since(&self, before: &Scrape) -> Scrape {
        Scrape(self.0.iter().map(|(k, v)| (k.clone(), v - before.0.get(k).copied().unwrap_or(0.0))).collect())
    }

    /// Calls per function of component `class`: function → (calls, wall seconds).
    fn calls_by_function(&self, class: &str) -> BTreeMap<String, (f64, f64)> {
        let mut out: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        let component = format!("component=\"{class}\"");
        for (k, v) in &self.0 {
            let (n, l) = k.split_once('{').unwrap_or((k.as_str(), ""));
            if !l.contains(&component) {
                continue;
            }
            let Some(function) = l.split("function=\"").nth(1).and_then(|s| s.split('"').next()) else { continue };
            let e = out.entry(function.to_string()).or_default();
            match n {
                "banlieue_component_call_duration_seconds_count" => e.0 += v,
                "banlieue_component_call_duration_seconds_sum" => e.1 += v,
                _ => {}
            }
        }
        out.retain(|_, (n, _)| *n > 0.0);
        out
    }

    /// Calls of component `class` that did not end `ok`: "function outcome" → count.
    fn failures(&self, class: &str) -> BTreeMap<String, f64> {
        let component = format!("component=\"{class}\"");
        let field = |l: &str, f: &str| l.split(&format!("{f}=\"")).nth(1).and_then(|s| s.split('"').next()).unwrap_or("").to_string();
        let mut out: BTreeMap<String, f64> = BTreeMap::new();
        for (k, v) in &self.0 {
            let (n, l) = k.split_once('{').unwrap_or((k.as_str(), ""));
            if n == "banlieue_component_calls_total" && l.contains(&component) && !l.contains("outcome=\"ok\"") && *v > 0.0 {
                *out.entry(format!("{} {}", field(l, "function"), field(l, "outcome"))).or_default() += v;
            }
        }
        out
    }
}

/// What one phase (create or delete) cost.
#[derive(Clone, Debug, Default)]
struct Phase {
    seconds: f64,
    calls: f64,
    /// Wall time of the driver's calls, summed (they overlap).
    call_wall: f64,
    guest: f64,
    http: f64,
    proxied: Option<usize>,
    logins: Option<usize>,
    reconciles_machine: f64,
    reconciles_vm: f64,
    functions: BTreeMap<String, (f64, f64)>,
    failures: BTreeMap<String, f64>,
}

impl Phase {
    fn from(d: &Scrape, class: &str, seconds: f64, logins: Option<usize>, proxied: Option<usize>) -> Phase {
        let component = format!("component=\"{class}\"");
        Phase {
            seconds,
            calls: d.sum("banlieue_component_call_duration_seconds_count", &[&component]),
            call_wall: d.sum("banlieue_component_call_duration_seconds_sum", &[&component]),
            guest: d.sum("banlieue_provider_guest_seconds_total", &[]),
            http: d.sum("banlieue_http_requests_total", &[]),
            proxied,
            logins,
            reconciles_machine: d.sum("banlieue_reconciles_total", &["controller=\"machine\""]),
            reconciles_vm: d.sum("banlieue_reconciles_total", &["controller=\"virtualmachine\""]),
            functions: d.calls_by_function(class),
            failures: d.failures(class),
        }
    }
}

struct Run {
    probe_logins: Option<usize>,
    /// Warning Events recorded while creating: "reason: message" → count.
    warnings: BTreeMap<String, usize>,
    /// CPU seconds while creating: this process (roles + bench client), the API server, the backend.
    cpu: (f64, f64, f64),
    create: Phase,
    delete: Phase,
}

/// What each VM declares: the plain class (one disk, one NIC, DHCP), or the declared one
/// (two disks, two NICs, a static address on each NIC), or the declared one taking both
/// addresses from IP pools (Cluster API IPAM claims, answered by [`ipam::serve`]).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Shape {
    Plain,
    Declared,
    Pools,
}

impl Shape {
    fn label(self) -> &'static str {
        match self {
            Shape::Plain => "1 disk, 1 NIC, DHCP",
            Shape::Declared => "2 disks, 2 NICs, static addresses",
            Shape::Pools => "2 disks, 2 NICs, addresses from IP pools",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Shape::Plain => "plain",
            Shape::Declared => "declared",
            Shape::Pools => "pools",
        }
    }
}

/// VM number `i` of a run.
fn vm(ns: &str, i: usize, kind: Kind, shape: Shape) -> Value {
    let mut spec = json!({"classRef": {"name": "bench"}, "imageRef": {"name": format!("bench-{}", kind.class())},
                          "placement": {"providerRef": {"name": "backend"}}});
    if shape == Shape::Declared {
        let (hi, lo) = (i / 250, i % 250 + 1);
        spec["classRef"]["name"] = json!("bench-declared");
        spec["network"] = json!({"interfaces": [
            {"name": "eth0", "addresses": [format!("10.20.{hi}.{lo}/16")], "gateway": "10.20.255.254", "nameservers": ["10.20.255.253"]},
            {"name": "eth1", "addresses": [format!("10.21.{hi}.{lo}/16")]},
        ]});
    }
    if shape == Shape::Pools {
        spec["classRef"]["name"] = json!("bench-declared");
        spec["network"] = json!({"interfaces": [
            {"name": "eth0", "nameservers": ["10.30.255.253"], "addressesFromPools": [ipam::pool("lan")]},
            {"name": "eth1", "addressesFromPools": [ipam::pool("storage")]},
        ]});
    }
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": format!("vm-{i:04}"), "namespace": ns}, "spec": spec})
}

fn is_ready(vm: &VirtualMachine) -> bool {
    vm.status.as_ref().is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Why a VM is not Ready yet, for a timeout's message.
fn not_ready(vm: &VirtualMachine) -> String {
    let conds = vm.status.as_ref().map(|s| s.conditions.iter().map(|c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message)).collect::<Vec<_>>());
    format!("{}: {conds:?}", vm.metadata.name.as_deref().unwrap_or_default())
}

/// Watch the namespace's VMs until every name in `want` has been seen Ready.
async fn await_ready(client: &kube::Client, ns: &str, mut want: HashSet<String>, limit: Duration) -> anyhow::Result<()> {
    let api: Api<VirtualMachine> = Api::namespaced(client.clone(), ns);
    let mut events = watcher(api.clone(), watcher::Config::default()).default_backoff().applied_objects().boxed();
    let waited = tokio::time::timeout(limit, async {
        while !want.is_empty() {
            let Some(vm) = events.try_next().await? else { anyhow::bail!("watch ended") };
            if is_ready(&vm) {
                want.remove(vm.metadata.name.as_deref().unwrap_or_default());
            }
        }
        Ok(())
    })
    .await;
    match waited {
        Ok(r) => r,
        Err(_) => {
            let sample: Vec<String> = api.list(&ListParams::default()).await?.items.iter().filter(|v| !is_ready(v)).take(3).map(not_ready).collect();
            anyhow::bail!("{} VMs still not Ready after {limit:?}; e.g. {sample:#?}", want.len())
        }
    }
}

/// CPU seconds (user + system) used so far by process `pid`.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command (which may hold spaces): state is field 3, utime 14, stime 15.
    let rest: Vec<&str> = stat.rsplit_once(')').map(|(_, r)| r.split_whitespace().collect()).unwrap_or_default();
    let ticks = |i: usize| rest.get(i - 3).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(14) + ticks(15)) / 100.0
}

/// CPU seconds so far: (this process — roles, bench client, fixtures; the API server; the backend's processes).
fn cpu_split(api_pid: u32) -> (f64, f64, f64) {
    let me = std::process::id();
    let mut backend = 0.0;
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else { continue };
        if pid == api_pid {
            continue;
        }
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let ppid = stat.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().nth(1)).and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(me) {
            backend += cpu_secs(pid);
        }
    }
    (cpu_secs(me), cpu_secs(api_pid), backend)
}

/// The namespace's Warning Events, by reason and message (VM names and numbers blanked).
async fn warnings(client: &kube::Client, ns: &str) -> anyhow::Result<BTreeMap<String, usize>> {
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), ns);
    let mut out = BTreeMap::new();
    for e in events.list(&ListParams::default()).await?.items {
        if e.type_.as_deref() != Some("Warning") {
            continue;
        }
        let msg: String = e.message.unwrap_or_default().chars().map(|c| if c.is_ascii_digit() { '#' } else { c }).collect();
        *out.entry(format!("{}: {msg}", e.reason.unwrap_or_default())).or_insert(0) += 1;
    }
    Ok(out)
}

/// Poll (bounded) until `f` holds.
async fn poll_until<F, Fut>(limit: Duration, what: &str, mut f: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<String>>>,
{
    let start = Instant::now();
    loop {
        let left = f().await?;
        let Some(left) = left else { return Ok(()) };
        if start.elapsed() > limit {
            anyhow::bail!("{what} not reached within {limit:?}: {left}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One run: a fresh backend, Provider and namespace; N VMs applied → Ready, then deleted → gone.
async fn run(ctx: &Arc<Context>, client: &kube::Client, api_pid: u32, kind: Kind, shape: Shape, ns: &str, vms: usize) -> anyhow::Result<Run> {
    let backend = Backend::start(kind).await?;
    let baseline = backend.vms().await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": ns}}))?).await?;
    for object in backend.objects(ns) {
        apply(client, object).await?;
    }
    let providers: Api<Provider> = Api::namespaced(client.clone(), ns);
    let provider_ready = |p: Option<&Provider>| {
        p.and_then(|p| p.status.as_ref()).is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    };
    banlieue_tests::control::wait_for(&providers, "backend", 60, "Provider Ready", provider_ready).await?;
    let probe_logins = backend.logins().await?;

    // Create: apply N VMs (32 requests in flight), until all Ready.
    let before = Scrape::take(ctx);
    let (logins0, proxied0) = (backend.logins().await?, backend.proxied());
    let names: Vec<String> = (0..vms).map(|i| format!("vm-{i:04}")).collect();
    let cpu0 = cpu_split(api_pid);
    let start = Instant::now();
    // One IPAM provider per namespace: its claims only (dropped with the run).
    let _ipam = (shape == Shape::Pools).then(|| ipam::serve(client.clone(), ns.to_string(), "10.30.0.1".parse().expect("an address")));
    let waiting = tokio::spawn({
        let (client, ns, want) = (client.clone(), ns.to_string(), names.iter().cloned().collect());
        async move { await_ready(&client, &ns, want, Duration::from_secs(900)).await }
    });
    futures::stream::iter((0..vms).map(|i| apply(client, vm(ns, i, kind, shape)))).buffer_unordered(32).try_collect::<Vec<_>>().await?;
    waiting.await??;
    let ready_after = start.elapsed().as_secs_f64();
    let after = Scrape::take(ctx);
    let cpu1 = cpu_split(api_pid);
    let cpu = (cpu1.0 - cpu0.0, cpu1.1 - cpu0.1, cpu1.2 - cpu0.2);
    let warnings = warnings(client, ns).await?;
    let (logins1, proxied1) = (backend.logins().await?, backend.proxied());
    let made = backend.vms().await?.difference(&baseline).count();
    anyhow::ensure!(made == vms, "{} holds {made} new VMs once {vms} are Ready", kind.label());
    let claims = ipam::claims(client, ns);
    if shape == Shape::Pools {
        let claimed = claims.list(&ListParams::default()).await?.items.len();
        anyhow::ensure!(claimed == 2 * vms, "{claimed} IP address claims for {vms} VMs of two pooled NICs each");
    }
    let create = Phase::from(
        &after.since(&before),
        kind.class(),
        ready_after,
        logins1.zip(logins0).map(|(a, b)| a - b),
        proxied1.zip(proxied0).map(|(a, b)| a - b),
    );

    // Delete every VM; done when their Machines are gone and the backend holds none of them.
    let vm_api: Api<VirtualMachine> = Api::namespaced(client.clone(), ns);
    let machines: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &kind.machine_resource());
    let start = Instant::now();
    futures::stream::iter(names.iter().map(|n| {
        let api = vm_api.clone();
        async move { api.delete(n, &DeleteParams::default()).await.map(|_| ()) }
    }))
    .buffer_unordered(32)
    .try_collect::<Vec<_>>()
    .await?;
    poll_until(Duration::from_secs(600), "all VMs and Machines gone", || async {
        let (v, m) = (vm_api.list(&ListParams::default()).await?.items.len(), machines.list(&ListParams::default()).await?.items.len());
        Ok((v + m > 0).then(|| format!("{v} VMs, {m} Machines left")))
    })
    .await?;
    poll_until(Duration::from_secs(120), "the backend empty", || async {
        let left = backend.vms().await?.difference(&baseline).count();
        Ok((left > 0).then(|| format!("{left} VMs left on the backend")))
    })
    .await?;
    if shape == Shape::Pools {
        let left = claims.list(&ListParams::default()).await?.items.len();
        anyhow::ensure!(left == 0, "{left} IP address claims left once every VM is gone");
    }
    let deleted_after = start.elapsed().as_secs_f64();
    let end = Scrape::take(ctx);
    let (logins2, proxied2) = (backend.logins().await?, backend.proxied());
    let delete = Phase::from(
        &end.since(&after),
        kind.class(),
        deleted_after,
        logins2.zip(logins1).map(|(a, b)| a.saturating_sub(b)),
        proxied2.zip(proxied1).map(|(a, b)| a - b),
    );
    // The Provider goes before its backend, so no probe hits a dead backend later.
    providers.delete("backend", &DeleteParams::default()).await?;
    poll_until(Duration::from_secs(60), "the Provider gone", || async {
        Ok(providers.get_opt("backend").await?.map(|_| "still there".to_string()))
    })
    .await?;
    drop(backend);
    Ok(Run { probe_logins, create, delete, warnings, cpu })
}

fn opt(v: Option<usize>) -> String {
    v.map_or("n/a".into(), |v| v.to_string())
}

fn print_run(kind: Kind, i: usize, vms: usize, r: &Run) {
    let n = vms as f64;
    let c = &r.create;
    println!(
        "  {} run {i}: Ready after {:.2}s ({:.1} VMs/s); logins: probe {}, create {}, delete {}; \
         per VM: {:.2} calls, {:.1} HTTP requests{}, guest {:.2} ms, call wall {:.1} ms, {:.2} machine + {:.2} VM reconciles; \
         deleted in {:.2}s ({:.2} calls, {:.1} HTTP, guest {:.2} ms, wall {:.1} ms per VM)",
        kind.class(),
        c.seconds,
        n / c.seconds,
        opt(r.probe_logins),
        opt(c.logins),
        opt(r.delete.logins),
        c.calls / n,
        c.http / n,
        c.proxied.map_or(String::new(), |p| format!(" ({:.1} through the proxy)", p as f64 / n)),
        c.guest * 1e3 / n,
        c.call_wall * 1e3 / n,
        c.reconciles_machine / n,
        c.reconciles_vm / n,
        r.delete.seconds,
        r.delete.calls / n,
        r.delete.http / n,
        r.delete.guest * 1e3 / n,
        r.delete.call_wall * 1e3 / n,
    );
    let f: Vec<String> = c
        .functions
        .iter()
        .chain(r.delete.functions.iter())
        .map(|(name, (calls, wall))| format!("{name} {calls:.0}× {:.1} ms", wall * 1e3 / calls))
        .enumerate()
        .map(|(i, s)| if i == c.functions.len() { format!("| delete phase: {s}") } else { s })
        .collect();
    println!("    calls (count × mean wall): {}", f.join(", "));
    println!(
        "    CPU while creating: {:.2} s control plane (roles, bench client, fixture proxy), {:.2} s API server, {:.2} s backend — {:.0} % of 2 cores",
        r.cpu.0,
        r.cpu.1,
        r.cpu.2,
        (r.cpu.0 + r.cpu.1 + r.cpu.2) / (2.0 * c.seconds) * 100.0
    );
    for (w, n) in &r.warnings {
        println!("    warning event {n}×: {w}");
    }
    for (phase, p) in [("create", c), ("delete", &r.delete)] {
        if !p.failures.is_empty() {
            let f: Vec<String> = p.failures.iter().map(|(k, n)| format!("{k} {n:.0}×")).collect();
            println!("    calls not ok during {phase}: {}", f.join(", "));
        }
    }
}

async fn bench() -> anyhow::Result<()> {
    let vms: usize = env_or("BENCH_VMS", 100);
    let runs: usize = env_or("BENCH_RUNS", 3);
    let kinds: Vec<Kind> = std::env::var("BENCH_BACKENDS")
        .unwrap_or_else(|_| "vsphere,proxmox".into())
        .split(',')
        .filter_map(|k| match k.trim() {
            "vsphere" => Some(Kind::Vsphere),
            "proxmox" => Some(Kind::Proxmox),
            "" => None,
            other => panic!("BENCH_BACKENDS: unknown backend {other:?} (vsphere, proxmox)"),
        })
        .collect();
    let shapes: Vec<Shape> = std::env::var("BENCH_SHAPES")
        .unwrap_or_else(|_| "plain,declared,pools".into())
        .split(',')
        .filter_map(|k| match k.trim() {
            "plain" => Some(Shape::Plain),
            "declared" => Some(Shape::Declared),
            "pools" => Some(Shape::Pools),
            "" => None,
            other => panic!("BENCH_SHAPES: unknown shape {other:?} (plain, declared, pools)"),
        })
        .collect();
    let dist = guests_dist();
    for wasm in ["provider-vsphere.wasm", "provider-proxmox.wasm"] {
        anyhow::ensure!(dist.join(wasm).exists(), "{} has no {wasm}: run guests/build.sh", dist.display());
    }

    let dir = tempfile::tempdir()?;
    let server = banlieue_tests::bench::ChildApiServer::start().await?;
    let client = server.client.clone();
    for object in [
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "ProviderClass", "metadata": {"name": "vsphere"},
               "spec": {"component": {"source": "builtin:provider-vsphere"}, "infrastructureKind": "VSphere", "capabilities": {"http": true, "secrets": true}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "ProviderClass", "metadata": {"name": "proxmox"},
               "spec": {"component": {"source": "builtin:provider-proxmox"}, "infrastructureKind": "Proxmox", "capabilities": {"http": true, "secrets": true}}}),
        // 4 GiB: fakepve's template disk (a disk is never shrunk).
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": "bench"},
               "spec": {"cpus": 1, "memoryMiB": 256, "disks": [{"name": "root", "sizeGiB": 4, "storageClass": "standard"}],
                        "nics": [{"name": "eth0", "networkClass": "default"}]}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": "bench-declared"},
               "spec": {"cpus": 1, "memoryMiB": 256,
                        "disks": [{"name": "root", "sizeGiB": 8, "storageClass": "standard"}, {"name": "data", "sizeGiB": 2, "storageClass": "standard"}],
                        "nics": [{"name": "eth0", "networkClass": "default"}, {"name": "eth1", "networkClass": "default"}]}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": "bench-vsphere"},
               "spec": {"sources": [{"providerClass": "vsphere", "template": vcsim::TEMPLATE}]}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": "bench-proxmox"},
               "spec": {"sources": [{"providerClass": "proxmox", "template": fakepve::TEMPLATE_VMID.to_string()}]}}),
    ] {
        apply(&client, object).await?;
    }
    if shapes.contains(&Shape::Pools) {
        ipam::install_crds(&client).await?;
    }
    let (ctx, roles) = control_plane(&client, dist, dir.path().join("cache"))?;

    println!("{vms} VMs per run, {runs} runs per backend and shape, concurrency {}", ctx.options.concurrency);
    let mut results: Vec<(Kind, Shape, Vec<Run>)> = Vec::new();
    for &kind in &kinds {
        // Warm-up: the component compiled and instantiated, the placement component loaded.
        let t = Instant::now();
        run(&ctx, &client, server.id(), kind, Shape::Plain, &format!("{}-warmup", kind.class()), 2).await?;
        println!("{}: warm-up (2 VMs) in {:.1}s", kind.label(), t.elapsed().as_secs_f64());
        // The shapes alternate run by run, so both see the machine in the same state.
        let mut done: Vec<(Shape, Vec<Run>)> = shapes.iter().map(|s| (*s, Vec::new())).collect();
        for i in 1..=runs {
            for (shape, rs) in &mut done {
                let ns = format!("{}-{}-{i}", kind.class(), shape.name());
                let r = run(&ctx, &client, server.id(), kind, *shape, &ns, vms).await?;
                print!("[{}] ", shape.label());
                print_run(kind, i, vms, &r);
                rs.push(r);
            }
        }
        results.extend(done.into_iter().map(|(shape, rs)| (kind, shape, rs)));
    }

    let n = vms as f64;
    println!();
    println!("medians of {runs} runs, {vms} VMs each (per VM unless said otherwise):");
    println!(
        "| backend | VMs | apply → all Ready | VMs/s | logins (probe / create / delete) | HTTP requests | driver calls | guest CPU | call wall | waiting on backend | calls in flight (mean) | CPU: control plane / API server / backend | delete → gone |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (kind, shape, rs) in &results {
        let m = |f: &dyn Fn(&Run) -> f64| median(rs.iter().map(f).collect());
        let logins = |f: &dyn Fn(&Run) -> Option<usize>| {
            rs.iter().map(f).collect::<Option<Vec<usize>>>().map_or("n/a".into(), |v| {
                let (lo, hi) = (v.iter().min().copied().unwrap_or(0), v.iter().max().copied().unwrap_or(0));
                if lo == hi { lo.to_string() } else { format!("{lo}–{hi}") }
            })
        };
        let ready = m(&|r| r.create.seconds);
        println!(
            "| {} | {} | {:.2} s ({}) | {:.1} | {} / {} / {} | {:.1} | {:.2} | {:.2} ms | {:.1} ms | {:.1} ms | {:.1} | {:.0} / {:.0} / {:.0} ms | {:.2} s ({}) |",
            kind.label(),
            shape.label(),
            ready,
            rs.iter().map(|r| format!("{:.2}", r.create.seconds)).collect::<Vec<_>>().join(", "),
            n / ready,
            logins(&|r| r.probe_logins),
            logins(&|r| r.create.logins),
            logins(&|r| r.delete.logins),
            m(&|r| r.create.http / n),
            m(&|r| r.create.calls / n),
            m(&|r| r.create.guest * 1e3 / n),
            m(&|r| r.create.call_wall * 1e3 / n),
            m(&|r| (r.create.call_wall - r.create.guest) * 1e3 / n),
            m(&|r| r.create.call_wall / r.create.seconds),
            m(&|r| r.cpu.0 * 1e3 / n),
            m(&|r| r.cpu.1 * 1e3 / n),
            m(&|r| r.cpu.2 * 1e3 / n),
            m(&|r| r.delete.seconds),
            rs.iter().map(|r| format!("{:.2}", r.delete.seconds)).collect::<Vec<_>>().join(", "),
        );
    }
    println!();
    println!("delete phase, medians per VM:");
    for (kind, shape, rs) in &results {
        let m = |f: &dyn Fn(&Run) -> f64| median(rs.iter().map(f).collect());
        println!(
            "  {} ({}): {:.1} HTTP requests, {:.2} calls, guest {:.2} ms, call wall {:.1} ms",
            kind.label(),
            shape.label(),
            m(&|r| r.delete.http / n),
            m(&|r| r.delete.calls / n),
            m(&|r| r.delete.guest * 1e3 / n),
            m(&|r| r.delete.call_wall * 1e3 / n),
        );
    }
    roles.abort();
    drop(server);
    Ok(())
}
