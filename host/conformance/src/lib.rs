//! `banlieue provider conformance`: the provider contract's behaviours, run against one
//! driver component and the live backend a Provider manifest describes — no Kubernetes.
//!
//! - [`manifest`]: the Provider and its Secret read from YAML, and the grants built from them
//!   the way the provider role builds them;
//! - [`behaviours`]: what the contract asks of a driver, each checked on the backend through
//!   the driver's own answers and the host's view of its capability use;
//! - [`report`]: the outcomes, as text, JUnit XML or JSON.

pub mod behaviours;
pub mod manifest;
pub mod report;

pub use behaviours::{run, Options};
pub use manifest::Backend;
pub use report::{Outcome, Report, Status};
