//! One wasmtime engine per process, its configuration, and the epoch ticker
//! that drives CPU budgets.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::cache::Cache;

/// How often the epoch advances; CPU budgets are enforced at this granularity.
pub const EPOCH_TICK: Duration = Duration::from_millis(5);

/// Bytes of a pooled linear memory, and of a table, kept resident and reset in
/// place between instances (see `Runtime::new`).
const KEEP_RESIDENT_MEMORY: usize = 2 << 20;
const KEEP_RESIDENT_TABLE: usize = 64 << 10;
/// Idle instance slots kept warm (see `Runtime::new`).
const WARM_SLOTS: u32 = 16;

/// Largest linear memory any component may be granted.
pub const MAX_MEMORY_BYTES: usize = 1 << 30;

/// Runtime settings.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// Where precompiled components are kept; no cache when `None`.
    pub cache_dir: Option<PathBuf>,
    /// Instances that may exist at once (pooling allocator slots).
    pub max_instances: u32,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig { cache_dir: None, max_instances: 128 }
    }
}

/// The process's runtime: engine, cache and the epoch ticker.
#[derive(Clone)]
pub struct Runtime {
    pub(crate) engine: Engine,
    pub(crate) cache: Option<Arc<Cache>>,
    /// Hash of everything in the engine configuration that affects compiled code.
    pub(crate) config_hash: String,
    /// Stops the epoch thread when the last clone of the runtime is dropped.
    #[allow(dead_code)]
    ticker: Arc<Ticker>,
}

struct Ticker {
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Runtime {
    pub fn new(cfg: RuntimeConfig) -> anyhow::Result<Runtime> {
        let mut config = Config::new();
        config.wasm_component_model(true);
        config.epoch_interruption(true);
        // Deep recursion traps instead of exhausting the host's stack.
        config.max_wasm_stack(1 << 20);
        config.async_stack_size(4 << 20);
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(cfg.max_instances);
        pool.total_core_instances(cfg.max_instances * 4);
        pool.total_memories(cfg.max_instances * 2);
        pool.total_tables(cfg.max_instances * 4);
        pool.total_stacks(cfg.max_instances);
        pool.max_memory_size(MAX_MEMORY_BYTES);
        pool.max_memories_per_module(2);
        pool.max_tables_per_module(4);
        pool.max_core_instances_per_component(32);
        pool.max_component_instance_size(1 << 20);
        pool.max_core_instance_size(4 << 20);
        // Slots a finished instance leaves keep their touched pages resident ("warm") for
        // the next instance of the same component; wasmtime keeps up to 100 by default, which
        // after a burst of calls is tens of MiB of RSS for nothing. A control plane runs at
        // most `--concurrency` calls per controller at once: a few warm slots per component
        // suffice, the rest are decommitted.
        pool.max_unused_warm_slots(WARM_SLOTS);
        // Every call gets a fresh instance, so a slot's memory is reset after each
        // call. By default that is an madvise of the whole memory: the next instance
        // page-faults its stack and data back in, and each madvise flushes the TLBs
        // of every core. With PAGEMAP_SCAN (Linux 6.7+) wasmtime finds the pages the
        // instance touched and restores just those in place, up to a bound per slot
        // (beyond it, the rest is still madvised). Same isolation, a third of the
        // cost of a small call. Without the scan, keeping pages would mean clearing
        // the whole bound each time, which is slower: then the default stays.
        if PoolingAllocationConfig::is_pagemap_scan_available() {
            pool.pagemap_scan(Enabled::Yes);
            pool.linear_memory_keep_resident(KEEP_RESIDENT_MEMORY);
            pool.table_keep_resident(KEEP_RESIDENT_TABLE);
        }
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&config)?;

        let config_hash = {
            let mut h = Sha256::new();
            h.update(format!("wasmtime={};stack={};epoch=1;component=1;async=1", wasmtime_version(), 1 << 20));
            hex::encode(&h.finalize()[..8])
        };
        let cache = match cfg.cache_dir {
            Some(dir) => Some(Arc::new(Cache::open(dir)?)),
            None => None,
        };
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (e, s) = (engine.clone(), stop.clone());
        std::thread::Builder::new().name("wasm-epoch".into()).spawn(move || {
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(EPOCH_TICK);
                e.increment_epoch();
            }
        })?;
        Ok(Runtime { engine, cache, config_hash, ticker: Arc::new(Ticker { stop }) })
    }

    /// The engine (for tests and tools that inspect components).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }
}

/// The wasmtime version this host was built with (part of the cache key).
pub fn wasmtime_version() -> &'static str {
    "48.0.8"
}
