//! Per-call limits: a CPU budget that counts only time spent running guest code,
//! and a memory limit.
//!
//! An epoch deadline alone counts wall time, which would kill a driver that is
//! merely waiting on a slow backend. So the store's call hook starts a clock
//! whenever control enters guest code and stops it whenever the guest calls the
//! host (or returns); the epoch callback, which fires every tick while guest code
//! runs, compares the accumulated guest time with the budget.

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

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Guest time used so far.
    pub fn guest_time(&self) -> Duration {
        self.guest + self.running_since.map(|s| s.elapsed()).unwrap_or_default()
    }

    pub fn on_hook(&mut self, hook: CallHook) {
        match hook {
            CallHook::CallingWasm | CallHook::ReturningFromHost => {
                self.running_since.get_or_insert_with(Instant::now);
            }
            CallHook::CallingHost | CallHook::ReturningFromWasm => {
                if let Some(s) = self.running_since.take() {
                    self.guest += s.elapsed();
                }
            }
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
