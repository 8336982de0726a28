//! What a conformance run watches of a driver's capability use (`banlieue provider
//! conformance`): the backend calls it made and how many of them changed something, every
//! refusal at a choke point, every backend session it stored — and, when armed, a crash
//! point: the call is abandoned right after its N-th changing backend call answered, before
//! the driver sees the answer, as if the host had died there. The controllers never set one.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::WitError;
use crate::state::HostState;

/// Counts and a crash point, shared by every call that carries it in its [`Grants`](super::Grants).
#[derive(Debug, Default)]
pub struct Observer {
    calls: AtomicUsize,
    changes: AtomicUsize,
    logins: AtomicUsize,
    refusals: Mutex<Vec<String>>,
    /// Abandon the call after this many changing calls (counted from when it was armed); 0: never.
    crash_after: AtomicUsize,
    crashed: tokio::sync::Notify,
}

impl Observer {
    pub fn new() -> Arc<Observer> {
        Arc::new(Observer::default())
    }

    /// Backend calls made (HTTP requests, libvirt calls).
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// Backend calls that change something (HTTP other than GET/HEAD, libvirt writes).
    pub fn changes(&self) -> usize {
        self.changes.load(Ordering::SeqCst)
    }

    /// Backend sessions stored through the `session` capability: logins.
    pub fn logins(&self) -> usize {
        self.logins.load(Ordering::SeqCst)
    }

    /// What the choke points refused, in their words.
    pub fn refusals(&self) -> Vec<String> {
        self.refusals.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Crash the next call after its `n`-th changing backend call has answered (n ≥ 1).
    pub fn arm_crash(&self, n: usize) {
        self.crash_after.store(self.changes() + n, Ordering::SeqCst);
    }

    /// Disarm the crash point.
    pub fn disarm(&self) {
        self.crash_after.store(0, Ordering::SeqCst);
    }

    /// Resolves when an armed crash point was reached: the caller then drops the call.
    pub async fn crashed(&self) {
        self.crashed.notified().await
    }

    fn refused(&self, e: &WitError) {
        if let WitError::Denied(m) = e {
            self.refusals.lock().unwrap_or_else(|e| e.into_inner()).push(m.clone());
        }
    }
}

impl HostState {
    /// Count one backend call that answered `result`; at an armed crash point, never return.
    pub(super) async fn observed<T>(&mut self, changes: bool, result: Result<T, WitError>) -> Result<T, WitError> {
        // Held as its own Arc: the state itself is not shared across the await.
        let Some(o) = self.grants.observer.clone() else { return result };
        o.calls.fetch_add(1, Ordering::SeqCst);
        if changes && result.is_ok() {
            let n = o.changes.fetch_add(1, Ordering::SeqCst) + 1;
            if n == o.crash_after.load(Ordering::SeqCst) {
                o.crash_after.store(0, Ordering::SeqCst);
                o.crashed.notify_one();
                // The backend did it; the driver never hears. The caller drops this call.
                std::future::pending::<()>().await;
            }
        }
        result
    }

    /// Note a choke point's refusal.
    pub(super) fn refusal(&self, e: WitError) -> WitError {
        if let Some(o) = &self.grants.observer {
            o.refused(&e);
        }
        e
    }

    /// Note a backend session stored.
    pub(super) fn login(&self) {
        if let Some(o) = &self.grants.observer {
            o.logins.fetch_add(1, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_hosts_refusals_are_kept() {
        let o = Observer::new();
        o.refused(&WitError::Denied("https://elsewhere.test/ is outside the grant".into()));
        o.refused(&WitError::NotFound("no such VM".into()));
        assert_eq!(o.refusals(), vec!["https://elsewhere.test/ is outside the grant".to_string()]);
    }

    #[test]
    fn a_crash_point_counts_from_when_it_is_armed() {
        let o = Observer::new();
        o.changes.store(5, Ordering::SeqCst);
        o.arm_crash(2);
        assert_eq!(o.crash_after.load(Ordering::SeqCst), 7);
        o.disarm();
        assert_eq!(o.crash_after.load(Ordering::SeqCst), 0);
    }
}
