//! banlieue's control plane: the reconcilers of its four roles and what they share.
//!
//! - `controllers`: one module per reconciled kind, each header naming its role;
//! - `framework`: how every reconcile runs — the frame and its backoff, watches scoped to
//!   this installation (`framework::installation`), leader election, shards, throttles;
//! - `status`: writing what a reconcile found — status, conditions and their reasons,
//!   finalizers, Events;
//! - `sandbox`: the edge to the components — loading them (`sandbox::components`,
//!   the one place a component is verified) and the grants they run with
//!   (`sandbox::grants`, the one place grants are built);
//! - `placement`: the candidates a placement component ranks, resolving classes to a
//!   Provider's terms, and what a policy would do now (`explain`, for `banlieue placement`);
//! - `ops`: metrics, health and the permissions each role needs;
//! - `console`: a VM's consoles, and who may open them (`console::access`, the one place
//!   a console is authorized).
//!
//! [`run()`] starts the roles asked for with a [`Context`].

mod addressing;
pub mod console;
mod context;
mod controllers;
mod failure;
#[cfg(test)]
mod fixtures;
mod framework;
pub mod ops;
mod placement;
mod run;
mod sandbox;
mod status;

// What other crates use (the binary, the tests, the benchmarks); the rest is this crate's.
pub use console::{ConsoleOptions, SessionLimits, TlsFiles};
pub use context::{CarryDownloads, Context, ImageBuildOptions, ImageCacheOptions, Options, VaultAccess};
pub use controllers::capi::contract::PAUSED_ANNOTATION;
pub use controllers::in_use::{FINALIZER as IN_USE_FINALIZER, PROTECTED_SECRET};
pub use controllers::machine::{backend_uid, BACKEND_UID};
pub use controllers::pool;
pub use failure::{Error, Failure};
pub use framework::infra_kinds::machine_resource;
pub use framework::installation::Installation;
pub use framework::leader;
pub use framework::shards::{shard_of, Sharding, Shards};
pub use ops::metrics::{Metrics, Readiness};
pub use ops::permissions::{self, Role};
pub use run::{run, Roles};
pub use placement::explain;
pub use sandbox::components::Components;

/// Field manager of everything banlieue applies.
pub const FIELD_MANAGER: &str = "banlieue.io/controller";
/// Namespace of leases (and, in a cluster, of banlieue itself).
pub const SYSTEM_NAMESPACE: &str = "banlieue-system";

/// `namespace/name` of an object, for logs, attributions and backoff keys.
pub fn key<K: kube::Resource>(obj: &K) -> String {
    match obj.meta().namespace.as_deref() {
        Some(ns) => format!("{ns}/{}", obj.meta().name.as_deref().unwrap_or_default()),
        None => obj.meta().name.clone().unwrap_or_default(),
    }
}
