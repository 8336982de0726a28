//! `banlieue:host/log`: guest logs, attributed to the component and the object
//! being reconciled, and rate-limited so a flooding guest costs the host little.

use std::time::Instant;

use super::bindings::banlieue::host::log::{Host, Level};
use crate::state::HostState;

/// Lines a call may log in a burst, and the longest line kept.
const BURST: u32 = 100;
const REFILL_PER_SEC: f64 = 20.0;
const MAX_LINE: usize = 2048;

/// Who a log line is from.
#[derive(Clone, Debug, Default)]
pub struct Attribution {
    /// The component (ProviderClass or PlacementPolicy name).
    pub component: String,
    /// The object being reconciled (`namespace/name`).
    pub object: String,
}

/// Per-call token bucket.
pub(crate) struct Bucket {
    tokens: f64,
    last: Instant,
    pub dropped: u64,
}

impl Default for Bucket {
    fn default() -> Self {
        Bucket { tokens: BURST as f64, last: Instant::now(), dropped: 0 }
    }
}

impl Bucket {
    fn take(&mut self) -> bool {
        let now = Instant::now();
        self.tokens = (self.tokens + now.duration_since(self.last).as_secs_f64() * REFILL_PER_SEC).min(BURST as f64);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            self.dropped += 1;
            false
        }
    }
}

impl Host for HostState {
    async fn log(&mut self, level: Level, message: String) {
        if !self.log_bucket.take() {
            return;
        }
        let a = &self.grants.log;
        let msg = crate::state::truncate(&message, MAX_LINE);
        let (component, object) = (a.component.as_str(), a.object.as_str());
        match level {
            Level::Trace => tracing::trace!(target: "banlieue::guest", component, object, "{msg}"),
            Level::Debug => tracing::debug!(target: "banlieue::guest", component, object, "{msg}"),
            Level::Info => tracing::info!(target: "banlieue::guest", component, object, "{msg}"),
            Level::Warn => tracing::warn!(target: "banlieue::guest", component, object, "{msg}"),
            Level::Error => tracing::error!(target: "banlieue::guest", component, object, "{msg}"),
        }
    }
}
