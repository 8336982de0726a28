//! Prometheus metrics, served as text on `/metrics` by [`serve`] with `/healthz` (the process
//! answers) and `/readyz` (every role has the permissions it needs, see [`Readiness`]).
//!
//! Two kinds: what happens — reconciles, driver calls, latencies, throttle waits — counted
//! here as it happens; and how things are — VMs by phase, Providers ready, pools — read
//! from the informer caches at each scrape by [`fleet`], so a gauge is never a count of
//! requests that may have been missed. Names and labels follow Prometheus' conventions
//! (docs/operations.md lists every family); no label holds a VM's or Machine's name.

pub mod fleet;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::ops::permissions::{Missing, Role};

/// A series' labels, in the order they are written.
pub type Labels = Vec<(&'static str, String)>;

type Histograms = Family<Labels, Histogram, fn() -> Histogram>;

/// Seconds, from 100 µs: reconciles, driver calls.
fn short() -> Histogram {
    Histogram::new(exponential_buckets(0.000_1, 3.0, 14))
}

/// Seconds, from 1 s to about 2 h: a VM from apply to Ready, from deletion to gone.
fn long() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 14))
}

/// Seconds, from 10 ms: how long an operation waited for its Provider's throttle.
fn waits() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 2.0, 14))
}

/// Spans the trace exporter could not deliver (see [`crate::ops::traces`]).
pub static SPANS_DROPPED: AtomicU64 = AtomicU64::new(0);

/// The process's metrics.
pub struct Metrics {
    registry: Registry,
    reconciles: Family<Labels, Counter>,
    reconcile_errors: Family<Labels, Counter>,
    reconcile_seconds: Histograms,
    calls: Family<Labels, Counter>,
    call_seconds: Histograms,
    limit_hits: Family<Labels, Counter>,
    operations: Family<Labels, Counter>,
    operation_seconds: Histograms,
    ready_seconds: Histograms,
    deletion_seconds: Histograms,
    throttle_waits: Family<Labels, Counter>,
    throttle_wait_seconds: Histograms,
    import_bytes: Family<Labels, Counter>,
    role_active: Family<Labels, Gauge>,
    /// Component instances alive now, per component (one per call under way).
    instances: Family<Labels, Gauge>,
    /// The caches and process state read at each scrape.
    pub fleet: Arc<fleet::Fleet>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("banlieue");
        let histograms = |f: fn() -> Histogram| -> Histograms { Family::new_with_constructor(f) };
        let m = Metrics {
            reconciles: Family::default(),
            reconcile_errors: Family::default(),
            reconcile_seconds: histograms(short),
            calls: Family::default(),
            call_seconds: histograms(short),
            limit_hits: Family::default(),
            operations: Family::default(),
            operation_seconds: histograms(short),
            ready_seconds: histograms(long),
            deletion_seconds: histograms(long),
            throttle_waits: Family::default(),
            throttle_wait_seconds: histograms(waits),
            import_bytes: Family::default(),
            role_active: Family::default(),
            instances: Family::default(),
            fleet: Arc::default(),
            registry: Registry::default(),
        };
        let build: Family<Labels, Gauge> = Family::default();
        build.get_or_create(&vec![("version", env!("CARGO_PKG_VERSION").to_string())]).set(1);
        registry.register("build_info", "1, labelled with the version of banlieue running", build);
        registry.register("role_active", "1 while this process runs the role (holds its Lease, or sharded), 0 while it stands by", m.role_active.clone());
        registry.register("reconciles", "Reconciles run, per controller", m.reconciles.clone());
        registry.register("reconcile_errors", "Reconciles that failed, per controller and reason", m.reconcile_errors.clone());
        registry.register("reconcile_duration_seconds", "Time spent in one reconcile", m.reconcile_seconds.clone());
        registry.register(
            "component_calls",
            "Calls into Wasm components, per component, function and outcome (traps and budget exhaustion included)",
            m.calls.clone(),
        );
        registry.register("component_call_duration_seconds", "Wall time of one component call", m.call_seconds.clone());
        registry.register("component_limit_hits", "Component calls stopped by their CPU (fuel) or memory budget", m.limit_hits.clone());
        registry.register("component_instances", "Component instances alive now (one per call under way)", m.instances.clone());
        registry.register("provider_operations", "Driver exports called for a Provider, per operation and outcome", m.operations.clone());
        registry.register("provider_operation_duration_seconds", "Wall time of one driver export for a Provider, waiting on the backend included", m.operation_seconds.clone());
        registry.register("virtualmachine_ready_duration_seconds", "From a VM's creation to its first Ready, per ProviderClass", m.ready_seconds.clone());
        registry.register("virtualmachine_deletion_duration_seconds", "From a VM's deletion to its finalizer's removal (backend VM gone), per ProviderClass", m.deletion_seconds.clone());
        registry.register("throttle_waits", "Operations a Provider's limits made wait, per reason (slots, rate)", m.throttle_waits.clone());
        registry.register("throttle_wait_seconds", "How long an operation waited for its Provider's limits before it started", m.throttle_wait_seconds.clone());
        registry.register("vmimage_import_bytes", "Bytes of images imported into backends", m.import_bytes.clone());
        registry.register_collector(Box::new(fleet::Collector(m.fleet.clone())));
        Metrics { registry, ..m }
    }
}

/// `ns/name` as the two labels `namespace` and `provider`.
pub fn provider_labels(provider: &str) -> Labels {
    let (ns, name) = provider.split_once('/').unwrap_or(("", provider));
    vec![("namespace", ns.to_string()), ("provider", name.to_string())]
}

/// A reason as the outcome label of driver operations: the contract's error names (`ok`,
/// `invalid-spec`, `unavailable`, `cpu-budget-exceeded`, …).
pub fn outcome_label(reason: &str) -> String {
    // The acronym is one word: `CPUBudgetExceeded` → `cpu-budget-exceeded`.
    let reason = reason.replace("CPU", "Cpu");
    let mut out = String::new();
    for (i, c) in reason.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('-');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

impl Metrics {
    pub fn reconciled(&self, controller: &str, took: Duration, error: Option<&str>) {
        let labels = vec![("controller", controller.to_string())];
        self.reconciles.get_or_create(&labels).inc();
        self.reconcile_seconds.get_or_create(&labels).observe(took.as_secs_f64());
        if let Some(reason) = error {
            self.reconcile_errors.get_or_create(&vec![("controller", controller.into()), ("reason", reason.into())]).inc();
        }
    }

    pub fn component_call(&self, component: &str, function: &str, took: Duration, outcome: &str) {
        let (c, f) = (("component", component.to_string()), ("function", function.to_string()));
        self.calls.get_or_create(&vec![c.clone(), f.clone(), ("outcome", outcome.into())]).inc();
        self.call_seconds.get_or_create(&vec![c.clone(), f]).observe(took.as_secs_f64());
        let limit = match outcome {
            "CPUBudgetExceeded" => "cpu",
            "MemoryLimitExceeded" => "memory",
            _ => return,
        };
        self.limit_hits.get_or_create(&vec![c, ("limit", limit.into())]).inc();
    }

    /// One more instance of `component` alive until the guard is dropped.
    pub fn instance(&self, component: &str) -> InstanceGuard {
        let gauge = self.instances.get_or_create(&vec![("component", component.to_string())]).clone();
        gauge.inc();
        InstanceGuard(gauge)
    }

    /// A driver export called for `provider` (`namespace/name`) of ProviderClass `class`.
    pub fn provider_operation(&self, provider: &str, class: &str, operation: &str, took: Duration, outcome: &str) {
        let mut labels = provider_labels(provider);
        labels.push(("operation", operation.to_string()));
        self.operation_seconds.get_or_create(&labels).observe(took.as_secs_f64());
        labels.insert(2, ("class", class.to_string()));
        labels.push(("outcome", outcome.to_string()));
        self.operations.get_or_create(&labels).inc();
    }

    /// A VM became Ready for the first time, `took` after its creation.
    pub fn vm_ready(&self, provider_class: &str, took: Duration) {
        self.ready_seconds.get_or_create(&vec![("provider_class", provider_class.to_string())]).observe(took.as_secs_f64());
    }

    /// A VM's deletion finished, `took` after it was asked for.
    pub fn vm_deleted(&self, provider_class: &str, took: Duration) {
        self.deletion_seconds.get_or_create(&vec![("provider_class", provider_class.to_string())]).observe(took.as_secs_f64());
    }

    /// An operation for `provider` was held back by its limits (`why`: `slots`, `rate`).
    pub fn throttle_wait(&self, provider: &str, why: &str) {
        let mut labels = provider_labels(provider);
        labels.push(("why", why.to_string()));
        self.throttle_waits.get_or_create(&labels).inc();
    }

    /// An operation held back for `waited` started.
    pub fn throttle_waited(&self, provider: &str, waited: Duration) {
        self.throttle_wait_seconds.get_or_create(&provider_labels(provider)).observe(waited.as_secs_f64());
    }

    pub fn image_imported(&self, provider: &str, bytes: u64) {
        self.import_bytes.get_or_create(&provider_labels(provider)).inc_by(bytes);
    }

    /// Whether this process runs `role` now (leading it) or stands by.
    pub fn role_active(&self, role: &str, active: bool) {
        self.role_active.get_or_create(&vec![("role", role.to_string())]).set(i64::from(active));
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        // Process-wide counters kept outside the registry, appended before the exposition's `# EOF`.
        let usage = banlieue_runtime::usage::snapshot();
        let counters = format!(
            "# HELP banlieue_provider_guest_seconds Time provider components spent running guest code (not waiting on backends).\n\
             # TYPE banlieue_provider_guest_seconds counter\n\
             banlieue_provider_guest_seconds_total {}\n\
             # HELP banlieue_http_requests Requests provider components sent through the http capability.\n\
             # TYPE banlieue_http_requests counter\n\
             banlieue_http_requests_total {}\n\
             # HELP banlieue_trace_spans_dropped Spans the OTLP exporter could not deliver.\n\
             # TYPE banlieue_trace_spans_dropped counter\n\
             banlieue_trace_spans_dropped_total {}\n",
            usage.provider_guest_time.as_secs_f64(),
            usage.http_requests,
            SPANS_DROPPED.load(Ordering::Relaxed),
        );
        match out.rfind("# EOF") {
            Some(i) => out.insert_str(i, &counters),
            None => out.push_str(&counters),
        }
        out
    }
}

/// See [`Metrics::instance`].
pub struct InstanceGuard(Gauge);

impl Drop for InstanceGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// What `/readyz` reports: per role started in this process, the permissions its
/// start-up check found missing (`None` until the check has answered).
#[derive(Default)]
pub struct Readiness {
    roles: Mutex<std::collections::BTreeMap<&'static str, Option<Vec<Missing>>>>,
}

impl Readiness {
    pub fn checking(&self, role: Role) {
        self.lock().insert(role.name(), None);
    }

    pub fn checked(&self, role: Role, missing: Vec<Missing>) {
        self.lock().insert(role.name(), Some(missing));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<&'static str, Option<Vec<Missing>>>> {
        self.roles.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `Ok` when every role is ready, else the lines saying why not.
    pub fn report(&self) -> Result<(), String> {
        let mut why = String::new();
        for (role, state) in self.lock().iter() {
            match state {
                None => why.push_str(&format!("{role}: checking permissions\n")),
                Some(missing) => missing.iter().for_each(|m| why.push_str(&format!("{role}: missing permission: {m}\n"))),
            }
        }
        if why.is_empty() { Ok(()) } else { Err(why) }
    }
}

/// Listen for [`serve`] on `addr`: a port in use is an error at start-up, said with the flag
/// that chose it, not a log line while the process goes on without metrics.
pub async fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await.map_err(|e| anyhow::anyhow!("cannot serve metrics on {addr} (--metrics-addr): {e}"))
}

/// Serve `/metrics`, `/healthz` and `/readyz` on `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, metrics: Arc<Metrics>, readiness: Arc<Readiness>) -> anyhow::Result<()> {
    tracing::info!(addr = %listener.local_addr()?, "serving metrics");
    loop {
        let (stream, _) = listener.accept().await?;
        let (metrics, readiness) = (metrics.clone(), readiness.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let (metrics, readiness) = (metrics.clone(), readiness.clone());
                async move {
                    let (status, body) = match req.uri().path() {
                        "/metrics" => (200, metrics.render()),
                        "/healthz" => (200, "ok\n".to_string()),
                        "/readyz" => match readiness.report() {
                            Ok(()) => (200, "ok\n".to_string()),
                            Err(why) => (503, why),
                        },
                        _ => (404, "not found\n".to_string()),
                    };
                    let mut resp = hyper::Response::new(Full::new(Bytes::from(body)));
                    *resp.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or_default();
                    resp.headers_mut().insert(
                        hyper::header::CONTENT_TYPE,
                        hyper::header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
                    );
                    Ok::<_, std::convert::Infallible>(resp)
                }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_are_the_contracts_error_names() {
        assert_eq!(outcome_label("ok"), "ok");
        assert_eq!(outcome_label("InvalidSpec"), "invalid-spec");
        assert_eq!(outcome_label("CPUBudgetExceeded"), "cpu-budget-exceeded");
        assert_eq!(outcome_label("NotFound"), "not-found");
    }

    /// The fleet a platform team runs: `vms` VMs over 10 namespaces, each with 2 Providers of
    /// 4 failure domains, in every phase, with pools, imports and each driver operation.
    fn fleet(vms: usize) -> Metrics {
        use serde_json::json;
        let m = Metrics::default();
        let ns = |i: usize| format!("team-{}", i % 10);
        let classes = ["libvirt", "vsphere", "proxmox", "libvirt-edge", "vsphere-dr"];
        let vms: Vec<banlieue_api::VirtualMachine> = (0..vms)
            .map(|i| {
                let (phase, ready, reason) = match i % 10 {
                    0 => ("pending", "False", "Unschedulable"),
                    1 => ("provisioning", "False", "WaitingForInfrastructure"),
                    2 => ("notready", "False", "Unavailable"),
                    _ => ("ready", "True", "Running"),
                };
                let mut status = json!({"conditions": [
                    {"type": "Ready", "status": ready, "reason": reason, "message": format!("vm {i}"), "lastTransitionTime": "2026-12-01T00:00:00Z"},
                    {"type": "Scheduled", "status": if phase == "pending" { "False" } else { "True" }, "reason": if phase == "pending" { "Unschedulable" } else { "Scheduled" }, "message": "", "lastTransitionTime": "2026-12-01T00:00:00Z"},
                    {"type": "AddressesReady", "status": ready, "reason": if ready == "True" { "AddressesReported" } else { "WaitingForAddress" }, "message": "", "lastTransitionTime": "2026-12-01T00:00:00Z"},
                ]});
                if phase != "pending" {
                    status["scheduled"] = json!({"provider": format!("p{}", i % 2), "providerClass": classes[i % 5], "failureDomain": format!("fd{}", i % 4)});
                    status["initialization"] = json!({"provisioned": phase != "provisioning"});
                }
                serde_json::from_value(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
                    "metadata": {"name": format!("vm-{i}"), "namespace": ns(i), "uid": format!("uid-{i}"), "creationTimestamp": "2026-12-01T00:00:00Z"},
                    "spec": {"classRef": {"name": "small"}, "imageRef": {"name": "debian"}}, "status": status}))
                .expect("a VM")
            })
            .collect();
        let machines: Vec<kube::api::DynamicObject> = vms
            .iter()
            .filter_map(|vm| {
                let s = vm.status.as_ref()?.scheduled.as_ref()?;
                serde_json::from_value(json!({"apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "LibvirtMachine",
                    "metadata": {"name": vm.metadata.name, "namespace": vm.metadata.namespace},
                    "spec": {"providerRef": {"name": s.provider}}, "status": {"phase": "Running"}}))
                .ok()
            })
            .collect();
        let providers: Vec<banlieue_api::Provider> = (0..20)
            .map(|i| {
                serde_json::from_value(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
                    "metadata": {"name": format!("p{}", i % 2), "namespace": ns(i)},
                    "spec": {"providerClassRef": {"name": classes[i % 5]}, "connection": {"endpoint": "https://backend"}},
                    "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Probed", "message": "", "lastTransitionTime": "2026-12-01T00:00:00Z"}],
                               "failureDomains": (0..4).map(|f| json!({"name": format!("fd{f}"), "capacity": {"cpus": 64, "memoryMiB": 262144, "storageGiB": 4096}})).collect::<Vec<_>>()}}))
                .expect("a Provider")
            })
            .collect();
        let pools: Vec<banlieue_api::VirtualMachinePool> = (0..10)
            .map(|i| {
                serde_json::from_value(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachinePool",
                    "metadata": {"name": format!("pool-{i}"), "namespace": ns(i)},
                    "spec": {"replicas": 10, "selector": {"matchLabels": {"app": "web"}}, "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"classRef": {"name": "small"}, "imageRef": {"name": "debian"}}}},
                    "status": {"replicas": 10, "readyReplicas": 9, "updatedReplicas": 10}}))
                .expect("a pool")
            })
            .collect();
        m.fleet.add(Box::new(move |s| {
            let now = k8s_openapi::jiff::Timestamp::now();
            vms.iter().for_each(|vm| fleet::virtual_machine(s, vm, now));
            machines.iter().for_each(|mc| fleet::machine(s, mc));
            providers.iter().for_each(|p| fleet::provider(s, p));
            pools.iter().for_each(|p| fleet::pool(s, p));
            for p in 0..20 {
                s.add(fleet::IMAGE_IMPORTS, vec![("namespace", ns(p)), ("provider", format!("p{}", p % 2)), ("phase", "Ready".into())], 3.0);
                s.add(fleet::THROTTLE_QUEUED, vec![("namespace", ns(p)), ("provider", format!("p{}", p % 2))], 1.0);
            }
        }));
        let took = Duration::from_millis(30);
        let operations = ["probe", "features", "create", "describe", "set-power", "delete", "list-machines", "snapshot-create", "snapshot-delete", "import-image"];
        for p in 0..20 {
            let provider = format!("{}/p{}", ns(p), p % 2);
            for op in operations {
                for outcome in ["ok", "unavailable", "not-found"] {
                    m.provider_operation(&provider, classes[p % 5], op, took, outcome);
                }
            }
            m.throttle_wait(&provider, "slots");
            m.throttle_waited(&provider, took);
            m.image_imported(&provider, 1 << 30);
        }
        for class in classes {
            m.vm_ready(class, took);
            m.vm_deleted(class, took);
            for op in operations {
                m.component_call(class, op, took, "ok");
                m.component_call(class, op, took, "Unavailable");
            }
            m.component_call(class, "create", took, "CPUBudgetExceeded");
        }
        for controller in ["virtualmachine", "machine", "provider", "providerclass", "placementpolicy", "vmimage", "infracluster", "capimachine", "virtualmachinepool", "vmsnapshot"] {
            m.reconciled(controller, took, None);
            m.reconciled(controller, took, Some("Error"));
        }
        m.component_call("spread", "choose", took, "ok");
        for role in ["controller", "provider", "operator", "imagebuilder"] {
            m.role_active(role, true);
        }
        m
    }

    fn series(m: &Metrics) -> usize {
        m.render().lines().filter(|l| !l.starts_with('#') && !l.is_empty()).count()
    }

    #[test]
    fn series_stay_under_the_documented_bound_however_many_vms() {
        // docs/operations.md#cardinality states this bound.
        const BOUND: usize = 5_000;
        let thousand = series(&fleet(1_000));
        assert!(thousand < BOUND, "{thousand} series for 1,000 VMs, more than the documented {BOUND}");
        assert_eq!(series(&fleet(3_000)), thousand, "no family grows with the number of VMs");
        println!("{thousand} series for 1,000 VMs");
    }

    #[test]
    fn families_follow_the_conventions() {
        let m = Metrics::default();
        m.provider_operation("ns/p", "libvirt", "create", Duration::from_millis(5), "ok");
        m.component_call("libvirt", "create", Duration::from_millis(5), "CPUBudgetExceeded");
        let text = m.render();
        assert!(text.contains(r#"banlieue_provider_operations_total{namespace="ns",provider="p",class="libvirt",operation="create",outcome="ok"} 1"#), "{text}");
        assert!(text.contains(r#"banlieue_component_limit_hits_total{component="libvirt",limit="cpu"} 1"#), "{text}");
        assert!(text.contains("banlieue_build_info{version="), "{text}");
        assert!(text.trim_end().ends_with("# EOF"), "one exposition, ended once");
    }
}
