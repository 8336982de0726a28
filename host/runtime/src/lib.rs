//! The Wasm runtime: the host side of banlieue's sandbox.
//!
//! Provider drivers and placement policies are WebAssembly components. This
//! crate loads them (compiling once, then from a precompiled cache the host
//! produced itself), checks the contract they were built for, and runs each call
//! in a fresh store with a CPU budget that counts only time spent in guest code,
//! a memory limit, and exactly the host capabilities the caller granted.

pub mod capability;
mod cache;
mod component;
mod engine;
mod error;
mod limits;
pub mod placement;
pub mod provider;
pub mod source;
mod state;
pub mod usage;
pub mod validate;

pub use component::{Contract, Inspection, LoadedComponent, PLACEMENT_LEGACY_VERSIONS, PLACEMENT_VERSION, PROVIDER_LEGACY_VERSIONS, PROVIDER_VERSION};
pub use engine::{Runtime, RuntimeConfig};
pub use error::{CallError, Feature, GuestError, InvalidDecision};
pub use limits::Limits;
