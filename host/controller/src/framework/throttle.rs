//! Backend protection: per Provider, how many operations changing the backend run at once
//! and how many start per second (`Provider.spec.limits`).
//!
//! A machine whose operation finds no slot or no token does not wait inside its reconcile
//! (that would hold one of the controller's concurrent reconciles, starving the machines of
//! other Providers): it says `Queued` and is looked at again shortly. Limits are per process.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use banlieue_api::provider::ProviderLimits;

/// The throttles of this process, one per Provider (`namespace/name`).
#[derive(Default)]
pub struct Throttles {
    by_provider: Mutex<HashMap<String, Arc<Throttle>>>,
    /// Machine reconciles under way per Provider (see [`Throttles::share`]).
    reconciling: Mutex<HashMap<String, Arc<AtomicUsize>>>,
}

/// One of a Provider's shares of the machine reconciler; given back when dropped.
pub struct Share {
    count: Arc<AtomicUsize>,
}

impl Drop for Share {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Throttles {
    /// The Providers whose backend this process has reached (a throttle is made on first use).
    pub fn providers(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.by_provider.lock().unwrap_or_else(|e| e.into_inner()).keys().cloned().collect();
        keys.sort();
        keys
    }

    /// A share of the machine reconciler for one of `provider`'s machines, or `None` when
    /// `max` of its machines are being reconciled already. Every driver call of a reconcile
    /// (a `describe` too, which no operation slot covers) holds one of the controller's
    /// concurrent reconciles while it waits on the backend, up to the request timeout: a
    /// Provider whose backend hangs, with more machines than there are concurrent
    /// reconciles, would otherwise hold them all and stall the machines of every other
    /// Provider. Its machines beyond `max` are looked at again shortly instead.
    pub fn share(&self, provider: &str, max: usize) -> Option<Share> {
        let count = self.reconciling.lock().unwrap_or_else(|e| e.into_inner()).entry(provider.to_string()).or_default().clone();
        if count.fetch_add(1, Ordering::AcqRel) >= max {
            count.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Share { count })
    }

    /// Per Provider whose backend this process has reached: the operations waiting (queued)
    /// and under way (in flight) now.
    pub fn usage(&self) -> Vec<(String, usize, usize)> {
        let map = self.by_provider.lock().unwrap_or_else(|e| e.into_inner());
        map.iter().map(|(p, t)| (p.clone(), t.queued(), t.in_flight.load(Ordering::Relaxed))).collect()
    }

    /// The throttle of `provider`, made anew when its limits changed.
    pub fn of(&self, provider: &str, limits: Option<&ProviderLimits>) -> Arc<Throttle> {
        let (concurrent, per_second) = ProviderLimits::effective(limits);
        let mut map = self.by_provider.lock().unwrap_or_else(|e| e.into_inner());
        let current = map.get(provider).filter(|t| t.concurrent == concurrent && t.per_second == per_second);
        match current {
            Some(t) => t.clone(),
            None => {
                let t = Arc::new(Throttle::new(concurrent, per_second));
                map.insert(provider.to_string(), t.clone());
                t
            }
        }
    }
}

/// Why an operation may not start now.
#[derive(Debug, Clone, PartialEq)]
pub enum Queued {
    /// Every slot is taken.
    Slots(u32),
    /// The rate is used up for now.
    Rate(u32),
}

impl std::fmt::Display for Queued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Queued::Slots(n) => write!(f, "waiting for one of the Provider's {n} operation slots (spec.limits.maxConcurrentOperations)"),
            Queued::Rate(n) => write!(f, "waiting for the Provider's rate of {n} operations per second (spec.limits.operationsPerSecond)"),
        }
    }
}

/// When a queued machine is looked at again: soon (a token comes within a second at the
/// lowest rate), spread so that queued machines do not all come back at once.
pub fn recheck_after() -> Duration {
    Duration::from_millis(500 + rand::random_range(0..500))
}

/// A queued object that has not come back within this long has stopped waiting (it was
/// deleted, or its work went elsewhere); queued objects come back every second or so.
const STILL_WAITING: Duration = Duration::from_secs(5);

/// One Provider's slots and token bucket.
pub struct Throttle {
    concurrent: u32,
    per_second: u32,
    slots: Arc<tokio::sync::Semaphore>,
    bucket: Mutex<Bucket>,
    in_flight: AtomicUsize,
    peak: AtomicUsize,
    /// The objects whose operation is queued: since when, and when last turned away.
    waiting: Mutex<HashMap<String, (Instant, Instant)>>,
}

/// One object's way through its Provider's [`Throttle`], counting its waits in the metrics.
#[derive(Clone)]
pub struct Gate {
    pub throttle: Arc<Throttle>,
    /// The object (`namespace/name`) whose operations go through.
    object: String,
    provider: String,
    metrics: Arc<crate::ops::metrics::Metrics>,
}

impl Gate {
    pub fn new(throttle: Arc<Throttle>, provider: &str, object: &str, metrics: Arc<crate::ops::metrics::Metrics>) -> Gate {
        Gate { throttle, object: object.to_string(), provider: provider.to_string(), metrics }
    }

    /// Start an operation now, or say why not (see [`Throttle::start`]).
    pub fn start(&self) -> Result<Operation, Queued> {
        let started = self.throttle.start();
        let now = Instant::now();
        let mut waiting = self.throttle.waiting();
        waiting.retain(|_, (_, seen)| now.duration_since(*seen) < STILL_WAITING * 12);
        match &started {
            Ok(_) => {
                if let Some((since, _)) = waiting.remove(&self.object) {
                    self.metrics.throttle_waited(&self.provider, now.duration_since(since));
                }
            }
            Err(q) => {
                waiting.entry(self.object.clone()).or_insert((now, now)).1 = now;
                self.metrics.throttle_wait(&self.provider, match q {
                    Queued::Slots(_) => "slots",
                    Queued::Rate(_) => "rate",
                });
            }
        }
        started
    }
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

/// An operation under way; its slot is free again when dropped.
pub struct Operation {
    _slot: tokio::sync::OwnedSemaphorePermit,
    throttle: Arc<Throttle>,
}

impl Drop for Operation {
    fn drop(&mut self) {
        self.throttle.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Throttle {
    fn new(concurrent: u32, per_second: u32) -> Throttle {
        Throttle {
            concurrent,
            per_second,
            slots: Arc::new(tokio::sync::Semaphore::new(concurrent as usize)),
            bucket: Mutex::new(Bucket { tokens: f64::from(per_second), at: Instant::now() }),
            in_flight: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            waiting: Mutex::default(),
        }
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Instant, Instant)>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The objects waiting now.
    fn queued(&self) -> usize {
        let now = Instant::now();
        self.waiting().values().filter(|(_, seen)| now.duration_since(*seen) < STILL_WAITING).count()
    }

    /// Start an operation now, or say why not.
    pub fn start(self: &Arc<Self>) -> Result<Operation, Queued> {
        let slot = self.slots.clone().try_acquire_owned().map_err(|_| Queued::Slots(self.concurrent))?;
        {
            let mut b = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            let rate = f64::from(self.per_second);
            b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * rate).min(rate);
            b.at = now;
            if b.tokens < 1.0 {
                return Err(Queued::Rate(self.per_second));
            }
            b.tokens -= 1.0;
        }
        let now = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak.fetch_max(now, Ordering::Relaxed);
        Ok(Operation { _slot: slot, throttle: self.clone() })
    }

    /// The most operations that were ever in flight at once.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_provider_gets_at_most_its_share_of_the_reconciles() {
        let t = Throttles::default();
        let held: Vec<Share> = (0..4).map(|_| t.share("ns/hung", 4).expect("within the share")).collect();
        assert!(t.share("ns/hung", 4).is_none(), "a fifth machine of the hung Provider waits");
        assert!(t.share("ns/healthy", 4).is_some(), "other Providers are not affected");
        drop(held);
        assert!(t.share("ns/hung", 4).is_some(), "shares come back when reconciles end");
    }

    #[test]
    fn slots_bound_the_operations_in_flight() {
        let t = Throttles::default().of("ns/p", Some(&ProviderLimits { max_concurrent_operations: Some(2), operations_per_second: Some(1000) }));
        let a = t.start().expect("first");
        let b = t.start().expect("second");
        assert_eq!(t.start().err(), Some(Queued::Slots(2)), "a third waits");
        drop(a);
        let _c = t.start().expect("a slot came free");
        drop(b);
        assert_eq!(t.peak(), 2);
    }

    #[test]
    fn the_rate_allows_a_burst_then_holds_the_next() {
        let t = Throttles::default().of("ns/p", Some(&ProviderLimits { max_concurrent_operations: Some(100), operations_per_second: Some(5) }));
        let started: Vec<_> = (0..5).map(|_| t.start().expect("within the burst")).collect();
        assert_eq!(t.start().err(), Some(Queued::Rate(5)), "the sixth waits for the rate");
        drop(started);
    }

    #[test]
    fn a_gate_counts_who_waits_and_for_how_long() {
        let throttles = Throttles::default();
        let t = throttles.of("ns/p", Some(&ProviderLimits { max_concurrent_operations: Some(1), operations_per_second: Some(1000) }));
        let metrics = Arc::new(crate::ops::metrics::Metrics::default());
        let (a, b) = (Gate::new(t.clone(), "ns/p", "ns/a", metrics.clone()), Gate::new(t.clone(), "ns/p", "ns/b", metrics.clone()));
        let held = a.start().expect("a slot");
        assert!(b.start().is_err() && b.start().is_err(), "b waits");
        assert_eq!(throttles.usage(), vec![("ns/p".to_string(), 1, 1)], "one object queued however often it asks, one in flight");
        drop(held);
        let _op = b.start().expect("b's turn");
        assert_eq!(throttles.usage(), vec![("ns/p".to_string(), 0, 1)]);
        let text = metrics.render();
        assert!(text.contains(r#"banlieue_throttle_waits_total{namespace="ns",provider="p",why="slots"} 2"#), "{text}");
        assert!(text.contains(r#"banlieue_throttle_wait_seconds_count{namespace="ns",provider="p"} 1"#), "{text}");
    }

    #[test]
    fn changed_limits_make_a_new_throttle_and_defaults_apply() {
        let throttles = Throttles::default();
        let a = throttles.of("ns/p", None);
        assert!(Arc::ptr_eq(&a, &throttles.of("ns/p", None)));
        let b = throttles.of("ns/p", Some(&ProviderLimits { max_concurrent_operations: Some(1), operations_per_second: None }));
        assert!(!Arc::ptr_eq(&a, &b));
        let held: Vec<_> = (0..4).map(|_| a.start().expect("default 4 slots")).collect();
        assert_eq!(a.start().err(), Some(Queued::Slots(ProviderLimits::DEFAULT_MAX_CONCURRENT_OPERATIONS)));
        drop(held);
    }
}
