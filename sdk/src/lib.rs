//! Guest-side SDK for banlieue components.
//!
//! A placement policy or provider driver depends on this crate, implements
//! [`placement::Policy`] or [`provider::Driver`], and exports it with
//! [`export_placement!`] or [`export_provider!`]. The host capabilities are
//! wrapped in [`http`], [`secrets`], [`session`] and [`log`]; everything returns [`Error`],
//! the contract's error variant, so `?` works across them.

pub mod alloc;
pub mod bindings;
pub mod candidates;
mod error;
pub mod http;
pub mod log;
pub mod network;
pub mod placement;
pub mod provider;
pub mod secrets;
pub mod selector;
pub mod session;
pub mod time;
pub mod transfer;
pub mod xml;

pub use bindings::host::banlieue::host::types::{Error, Pairs};
pub use error::Result;

// Used by the export macros from the guest crate.
#[doc(hidden)]
pub use serde_json as __serde_json;

/// Look a key up in a list of label or header pairs.
pub fn lookup<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}
