//! Prometheus metrics: reconciles per controller, component calls per component,
//! served as text on `/metrics` by [`serve`], with `/healthz` (the process answers) and
//! `/readyz` (every role has the permissions it needs, see [`Readiness`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::ops::permissions::{Missing, Role};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    controller: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    component: String,
    function: String,
    /// `ok`, or the error reason (`CPUBudgetExceeded`, `Trapped`, `Unavailable`, …).
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FunctionLabels {
    component: String,
    function: String,
}

fn histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_1, 3.0, 14))
}

/// The process's metrics.
pub struct Metrics {
    registry: Registry,
    reconciles: Family<ControllerLabels, Counter>,
    reconcile_errors: Family<ErrorLabels, Counter>,
    reconcile_seconds: Family<ControllerLabels, Histogram, fn() -> Histogram>,
    calls: Family<CallLabels, Counter>,
    call_seconds: Family<FunctionLabels, Histogram, fn() -> Histogram>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("banlieue");
        let reconciles = Family::default();
        let reconcile_errors = Family::default();
        let reconcile_seconds = Family::new_with_constructor(histogram as fn() -> Histogram);
        let calls = Family::default();
        let call_seconds = Family::new_with_constructor(histogram as fn() -> Histogram);
        registry.register("reconciles", "Reconciles run, per controller", reconciles.clone());
        registry.register("reconcile_errors", "Reconciles that failed, per controller and reason", reconcile_errors.clone());
        registry.register("reconcile_duration_seconds", "Time spent in one reconcile", reconcile_seconds.clone());
        registry.register(
            "component_calls",
            "Calls into Wasm components, per component, function and outcome (traps and budget exhaustion included)",
            calls.clone(),
        );
        registry.register("component_call_duration_seconds", "Wall time of one component call", call_seconds.clone());
        Metrics { registry, reconciles, reconcile_errors, reconcile_seconds, calls, call_seconds }
    }
}

impl Metrics {
    pub fn reconciled(&self, controller: &str, took: Duration, error: Option<&str>) {
        let labels = ControllerLabels { controller: controller.into() };
        self.reconciles.get_or_create(&labels).inc();
        self.reconcile_seconds.get_or_create(&labels).observe(took.as_secs_f64());
        if let Some(reason) = error {
            self.reconcile_errors.get_or_create(&ErrorLabels { controller: controller.into(), reason: reason.into() }).inc();
        }
    }

    pub fn component_call(&self, component: &str, function: &str, took: Duration, outcome: &str) {
        self.calls
            .get_or_create(&CallLabels { component: component.into(), function: function.into(), outcome: outcome.into() })
            .inc();
        self.call_seconds
            .get_or_create(&FunctionLabels { component: component.into(), function: function.into() })
            .observe(took.as_secs_f64());
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        // Process-wide runtime counters, appended before the exposition's `# EOF`.
        let usage = banlieue_runtime::usage::snapshot();
        let counters = format!(
            "# HELP banlieue_provider_guest_seconds Time provider components spent running guest code (not waiting on backends).\n\
             # TYPE banlieue_provider_guest_seconds counter\n\
             banlieue_provider_guest_seconds_total {}\n\
             # HELP banlieue_http_requests Requests provider components sent through the http capability.\n\
             # TYPE banlieue_http_requests counter\n\
             banlieue_http_requests_total {}\n",
            usage.provider_guest_time.as_secs_f64(),
            usage.http_requests
        );
        match out.rfind("# EOF") {
            Some(i) => out.insert_str(i, &counters),
            None => out.push_str(&counters),
        }
        out
    }
}

/// What `/readyz` reports: per role started in this process, the permissions its
/// start-up check found missing (`None` until the check has answered).
#[derive(Default)]
pub struct Readiness {
    roles: std::sync::Mutex<std::collections::BTreeMap<&'static str, Option<Vec<Missing>>>>,
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

/// Serve `/metrics`, `/healthz` and `/readyz` on `addr` until the task is dropped.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>, readiness: Arc<Readiness>) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving metrics");
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
