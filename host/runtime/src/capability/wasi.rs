//! The WASI that Rust std on wasip2 imports (cli, io, clocks, random), linked
//! with an empty context. Filesystem and sockets are not linked at all: a
//! component importing them fails to load with a clear error.

use wasmtime::component::{HasData, Linker, ResourceTable};
use wasmtime_wasi::cli::{WasiCli, WasiCliView};
use wasmtime_wasi::clocks::{WasiClocks, WasiClocksView};
use wasmtime_wasi::p2::bindings::{cli, clocks, random};
use wasmtime_wasi::random::WasiRandom;
use wasmtime_wasi::WasiView;

use crate::state::HostState;

/// Interface prefixes of WASI a component may import.
pub const ALLOWED: &[&str] = &["wasi:cli/", "wasi:io/", "wasi:clocks/", "wasi:random/"];

struct Io;

impl HasData for Io {
    type Data<'a> = &'a mut ResourceTable;
}

pub fn link(l: &mut Linker<HostState>) -> wasmtime::Result<()> {
    wasmtime_wasi_io::bindings::wasi::io::error::add_to_linker::<HostState, Io>(l, |s| s.table())?;
    wasmtime_wasi_io::bindings::wasi::io::poll::add_to_linker::<HostState, Io>(l, |s| s.table())?;
    wasmtime_wasi_io::bindings::wasi::io::streams::add_to_linker::<HostState, Io>(l, |s| s.table())?;
    clocks::wall_clock::add_to_linker::<HostState, WasiClocks>(l, HostState::clocks)?;
    clocks::monotonic_clock::add_to_linker::<HostState, WasiClocks>(l, HostState::clocks)?;
    random::random::add_to_linker::<HostState, WasiRandom>(l, |s| s.ctx().ctx.random())?;
    random::insecure::add_to_linker::<HostState, WasiRandom>(l, |s| s.ctx().ctx.random())?;
    random::insecure_seed::add_to_linker::<HostState, WasiRandom>(l, |s| s.ctx().ctx.random())?;
    cli::exit::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::environment::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::stdin::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::stdout::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::stderr::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_input::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_output::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_stdin::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_stdout::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_stderr::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    Ok(())
}
