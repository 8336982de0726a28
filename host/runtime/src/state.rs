//! The state of one store (one call): an empty WASI context, the meter, the
//! guest's captured stderr, and the capabilities this call was granted.

use wasmtime::component::ResourceTable;
use wasmtime::Store;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::capability::Grants;
use crate::component::Contract;
use crate::error::CallError;
use crate::limits::{Limits, Meter};
use crate::Runtime;

/// How much of a guest's stderr (panic messages) is kept for error reports.
const STDERR_CAPACITY: usize = 8 * 1024;

pub struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(crate) meter: Meter,
    pub(crate) stderr: MemoryOutputPipe,
    pub(crate) grants: Grants,
    pub(crate) log_bucket: crate::capability::log::Bucket,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

impl HostState {
    pub(crate) fn table(&mut self) -> &mut ResourceTable {
        &mut self.table
    }
}

/// A store for one call of a `contract` component, with limits and accounting wired in.
pub(crate) fn new_store(rt: &Runtime, contract: Contract, limits: Limits, grants: Grants) -> Store<HostState> {
    let stderr = MemoryOutputPipe::new(STDERR_CAPACITY);
    // No arguments, environment, preopened directories or network: the WASI
    // interfaces std needs are linked, and this context gives them nothing.
    let wasi = WasiCtx::builder().stderr(stderr.clone()).build();
    let meter = match contract {
        // A provider waits on its backend through host functions: a call hook
        // stops the clock while it does (see `limits`).
        Contract::Provider => Meter::new(limits),
        // A placement policy can only log, which never waits: the whole call is
        // its time, and no hook has to run on each of the thousands of entries
        // into the guest that copying its arguments in takes.
        Contract::Placement => Meter::running(limits),
    };
    let state = HostState { wasi, table: ResourceTable::new(), meter, stderr, grants, log_bucket: Default::default() };
    let mut store = Store::new(&rt.engine, state);
    store.limiter(|s| &mut s.meter);
    if contract == Contract::Provider {
        store.call_hook(|mut ctx, hook| {
            ctx.data_mut().meter.on_hook(hook);
            Ok(())
        });
    }
    // What the host copies out of the sandbox for one call is bounded (see `validate`).
    store.set_hostcall_fuel(crate::validate::MAX_RESULT_COPY);
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(|mut ctx| ctx.data_mut().meter.on_tick());
    store
}

/// Turn a wasmtime failure into what the caller can act on.
pub(crate) fn classify(store: &Store<HostState>, err: wasmtime::Error) -> CallError {
    let data = store.data();
    if data.meter.cpu_exceeded {
        return CallError::CpuBudget(data.meter.limits().cpu);
    }
    if data.meter.memory_exceeded {
        return CallError::Memory((data.meter.limits().memory_bytes >> 20) as u64);
    }
    let stderr = String::from_utf8_lossy(&data.stderr.contents()).trim().to_string();
    let panic = stderr.lines().find(|l| l.contains("panicked at")).map(|l| {
        // Keep the panic line and the message after it.
        let idx = stderr.find(l).unwrap_or(0);
        stderr[idx..].lines().take(2).collect::<Vec<_>>().join(": ")
    });
    let trap = err.downcast_ref::<wasmtime::Trap>().map(|t| t.to_string());
    if let Some(invalid) = invalid_result(&err) {
        return invalid;
    }
    match (panic, trap) {
        (Some(p), _) => CallError::Trap(format!("guest {}", truncate(&p, 512))),
        (None, Some(t)) => CallError::Trap(t),
        (None, None) => CallError::Trap(truncate(&format!("{err:#}"), 512)),
    }
}

/// A result the component model refused while copying it out of the sandbox: a value the
/// contract does not define (an enum or variant discriminant it does not have), or more
/// data than the host copies for one call.
fn invalid_result(err: &wasmtime::Error) -> Option<CallError> {
    let msg = format!("{err:#}");
    if msg.contains("unexpected discriminant") || msg.contains("invalid discriminant") {
        return Some(CallError::InvalidResult(format!(
            "the driver returned a value its contract does not define ({}); rebuild it against this contract version",
            truncate(&msg, 256)
        )));
    }
    if msg.contains("too much data is being copied") {
        return Some(CallError::InvalidResult(format!(
            "the driver returned more than the host copies out of a sandbox for one call ({} bytes)",
            crate::validate::thousands(crate::validate::MAX_RESULT_COPY)
        )));
    }
    None
}

/// Instantiation failures: a full pool is retryable, anything else is the component's.
pub(crate) fn classify_instantiate(store: &Store<HostState>, err: wasmtime::Error) -> CallError {
    let msg = format!("{err:#}");
    if msg.contains("concurrent") || msg.contains("pool") || msg.contains("maximum") {
        return CallError::Busy(truncate(&msg, 256));
    }
    classify(store, err)
}

pub(crate) fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}
