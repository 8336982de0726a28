//! Each Provider's recent driver operations, kept in memory by the process that calls its
//! driver, for `Provider.status.operations`: how often its backend failed lately, readable
//! with `kubectl` (and `kubectl vm`) where no Prometheus is at hand.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use banlieue_api::provider::{OperationError, RecentOperations};

/// How far back `status.operations` looks.
pub const WINDOW: Duration = Duration::from_secs(600);
/// Operations remembered per Provider at most (the oldest go first).
const KEPT: usize = 10_000;
/// Outcomes that are not the backend failing: a machine already gone is what `describe`
/// after a deletion expects.
const NOT_ERRORS: [&str; 2] = ["ok", "not-found"];

struct Op {
    at: Instant,
    failed: bool,
}

#[derive(Default)]
struct Provider {
    ops: VecDeque<Op>,
    last_error: Option<OperationError>,
}

/// Every Provider's operations of the last [`WINDOW`], by `namespace/name`.
#[derive(Default)]
pub struct Recent {
    by_provider: Mutex<HashMap<String, Provider>>,
}

impl Recent {
    /// An operation's outcome (`ok`, or the error's name as in the metrics) and, when it
    /// failed, what the driver said.
    pub fn record(&self, provider: &str, operation: &str, outcome: &str, message: Option<&str>) {
        let mut all = self.lock();
        let p = all.entry(provider.to_string()).or_default();
        let failed = !NOT_ERRORS.contains(&outcome);
        p.ops.push_back(Op { at: Instant::now(), failed });
        if p.ops.len() > KEPT {
            p.ops.pop_front();
        }
        if failed {
            p.last_error = Some(OperationError {
                operation: operation.to_string(),
                reason: outcome.to_string(),
                message: message.unwrap_or_default().chars().take(512).collect(),
                time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()),
            });
        }
    }

    /// What `status.operations` says of `provider` now (`None`: no operation was called).
    pub fn summary(&self, provider: &str) -> Option<RecentOperations> {
        let mut all = self.lock();
        let p = all.get_mut(provider)?;
        let since = Instant::now().checked_sub(WINDOW);
        while p.ops.front().is_some_and(|o| since.is_some_and(|s| o.at < s)) {
            p.ops.pop_front();
        }
        let errors = p.ops.iter().filter(|o| o.failed).count() as i64;
        Some(RecentOperations { window_seconds: WINDOW.as_secs() as i64, calls: p.ops.len() as i64, errors, last_error: p.last_error.clone() })
    }

    /// Forget a deleted Provider.
    pub fn forget(&self, provider: &str) {
        self.lock().remove(provider);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Provider>> {
        self.by_provider.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_failures_but_not_machines_already_gone() {
        let r = Recent::default();
        assert!(r.summary("ns/p").is_none());
        r.record("ns/p", "describe", "ok", None);
        r.record("ns/p", "describe", "not-found", Some("gone"));
        r.record("ns/p", "create", "unavailable", Some("connection refused"));
        let s = r.summary("ns/p").expect("recorded");
        assert_eq!((s.calls, s.errors, s.window_seconds), (3, 1, 600));
        let last = s.last_error.expect("the failure");
        assert_eq!((last.operation.as_str(), last.reason.as_str(), last.message.as_str()), ("create", "unavailable", "connection refused"));
        r.forget("ns/p");
        assert!(r.summary("ns/p").is_none());
    }
}
