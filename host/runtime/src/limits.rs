//! Per-call limits: a CPU budget that counts only time spent running guest code,
//! and a memory limit.
//!
//! An epoch deadline alone counts wall time, which would kill a driver that is
//! merely waiting on a slow backend. So the store's call hook starts a clock
//! when control first enters guest code and stops it while the guest waits on a
//! host function (an import call); the epoch callback, which fires every tick
//! while guest code runs, compares the accumulated guest time with the budget.
//!
//! The clock deliberately keeps running when the host merely re-enters the guest
//! to copy arguments in (each string or list lowered into guest memory is one
//! call of the guest's `realloc`): reading the clock around each of those would
//! cost more than the copy itself. So a call's time also includes the host
//! copying that call's arguments and results, which is bounded by what the host
//! chose to pass and small next to any budget; waiting on I/O is never counted.
//!
//! Placement calls need no hook at all: their only import (`log`) never waits,
//! so their whole call is guest time (see `state::new_store`).

use std::time::{Duration, Instant};

use wasmtime::{CallHook, UpdateDeadline};

/// Limits of one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Guest time one call may use.
    pub cpu: Duration,
    /// Linear memory one instance may grow to.
    pub memory_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { cpu: Duration::from_secs(1), memory_bytes: 64 << 20 }
    }
}

impl Limits {
    /// Limits from a ProviderClass or PlacementPolicy's `limits` (defaults where unset).
    pub fn from_millis_mib(cpu_millis: Option<u32>, memory_mib: Option<u32>) -> Limits {
        let d = Limits::default();
        Limits {
            cpu: cpu_millis.map(|m| Duration::from_millis(m.into())).unwrap_or(d.cpu),
            memory_bytes: memory_mib.map(|m| (m as usize) << 20).unwrap_or(d.memory_bytes).min(crate::engine::MAX_MEMORY_BYTES),
        }
    }
}

/// Tracks one store's guest time and memory against its limits.
pub(crate) struct Meter {
    limits: Limits,
    guest: Duration,
    running_since: Option<Instant>,
    pub cpu_exceeded: bool,
    pub memory_exceeded: bool,
}

/// Marker error raised from the epoch callback.
#[derive(Debug, thiserror::Error)]
#[error("CPU budget exceeded")]
pub(crate) struct BudgetExceeded;

impl Meter {
    pub fn new(limits: Limits) -> Meter {
        Meter { limits, guest: Duration::ZERO, running_since: None, cpu_exceeded: false, memory_exceeded: false }
    }

    /// A meter whose clock runs from now on: for calls that never wait on the host.
    pub fn running(limits: Limits) -> Meter {
        Meter { running_since: Some(Instant::now()), ..Meter::new(limits) }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Guest time used so far.
    pub fn guest_time(&self) -> Duration {
        self.guest + self.running_since.map(|s| s.elapsed()).unwrap_or_default()
    }

    #[inline]
    pub fn on_hook(&mut self, hook: CallHook) {
        match hook {
            // Entering the guest, whether for the call itself or a `realloc` while
            // the host copies arguments in: start the clock unless it runs already.
            CallHook::CallingWasm | CallHook::ReturningFromHost => {
                if self.running_since.is_none() {
                    self.running_since = Some(Instant::now());
                }
            }
            // The guest waits on the host (an import call, maybe a slow backend).
            CallHook::CallingHost => {
                if let Some(s) = self.running_since.take() {
                    self.guest += s.elapsed();
                }
            }
            // Back in the host between `realloc`s, or the call is over (the store
            // is dropped with it): no clock read, see the module doc.
            CallHook::ReturningFromWasm => {}
        }
    }

    pub fn on_tick(&mut self) -> wasmtime::Result<UpdateDeadline> {
        if self.guest_time() > self.limits.cpu {
            self.cpu_exceeded = true;
            return Err(wasmtime::Error::new(BudgetExceeded));
        }
        // Yield so one busy guest never starves the executor's other tasks.
        Ok(UpdateDeadline::Yield(1))
    }
}

impl wasmtime::ResourceLimiter for Meter {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.limits.memory_bytes {
            self.memory_exceeded = true;
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(cpu_ms: u64) -> Limits {
        Limits { cpu: Duration::from_millis(cpu_ms), ..Limits::default() }
    }

    #[test]
    fn waiting_on_the_host_is_not_guest_time() {
        let mut m = Meter::new(limits(1000));
        m.on_hook(CallHook::CallingWasm);
        std::thread::sleep(Duration::from_millis(20));
        m.on_hook(CallHook::CallingHost);
        let before = m.guest_time();
        assert!(before >= Duration::from_millis(20));
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(m.guest_time(), before, "the clock stops while the guest waits");
        m.on_hook(CallHook::ReturningFromHost);
        std::thread::sleep(Duration::from_millis(5));
        assert!(m.guest_time() >= before + Duration::from_millis(5), "and runs again once it is back");
    }

    #[test]
    fn re_entries_for_copying_arguments_keep_the_clock_running() {
        let mut m = Meter::new(limits(1000));
        for _ in 0..3 {
            m.on_hook(CallHook::CallingWasm);
            m.on_hook(CallHook::ReturningFromWasm);
        }
        std::thread::sleep(Duration::from_millis(10));
        assert!(m.guest_time() >= Duration::from_millis(10));
    }

    #[test]
    fn the_budget_trips_on_a_tick_once_exceeded() {
        let mut m = Meter::running(limits(10));
        assert!(m.on_tick().is_ok());
        std::thread::sleep(Duration::from_millis(15));
        assert!(m.on_tick().is_err());
        assert!(m.cpu_exceeded);
    }
}
