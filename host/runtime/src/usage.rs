//! Process-wide counters of what components cost: provider calls, the guest
//! (CPU) time they spent, and the HTTP requests they sent. Read by the metrics
//! endpoint and the benchmarks, to tell guest work from waiting on a backend.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

static PROVIDER_CALLS: AtomicU64 = AtomicU64::new(0);
static PROVIDER_GUEST_NANOS: AtomicU64 = AtomicU64::new(0);
static HTTP_REQUESTS: AtomicU64 = AtomicU64::new(0);
static TRANSFERRED_BYTES: AtomicU64 = AtomicU64::new(0);

/// A snapshot of the counters since the process started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub provider_calls: u64,
    /// Time spent running provider guest code (not waiting on host calls).
    pub provider_guest_time: Duration,
    /// Requests sent through the `http` capability.
    pub http_requests: u64,
    /// Image bytes the host streamed to backends for `transfer` calls.
    pub transferred_bytes: u64,
}

pub fn snapshot() -> Usage {
    Usage {
        provider_calls: PROVIDER_CALLS.load(Ordering::Relaxed),
        provider_guest_time: Duration::from_nanos(PROVIDER_GUEST_NANOS.load(Ordering::Relaxed)),
        http_requests: HTTP_REQUESTS.load(Ordering::Relaxed),
        transferred_bytes: TRANSFERRED_BYTES.load(Ordering::Relaxed),
    }
}

pub(crate) fn provider_call(guest: Duration) {
    PROVIDER_CALLS.fetch_add(1, Ordering::Relaxed);
    PROVIDER_GUEST_NANOS.fetch_add(guest.as_nanos() as u64, Ordering::Relaxed);
}

pub(crate) fn transferred(bytes: u64) {
    TRANSFERRED_BYTES.fetch_add(bytes, Ordering::Relaxed);
}

pub(crate) fn http_request() {
    HTTP_REQUESTS.fetch_add(1, Ordering::Relaxed);
}
