//! banlieue's control plane: the reconcilers of its four roles and what they share.
//!
//! - [`controllers`]: one module per reconciled kind, each header naming its role;
//! - [`framework`]: how every reconcile runs — the frame and its backoff, watches scoped to
//!   this [installation](framework::installation), leader election, shards, throttles;
//! - [`status`]: writing what a reconcile found — status, conditions and their reasons,
//!   finalizers, Events;
//! - [`sandbox`]: the edge to the components — loading them ([`sandbox::components`],
//!   the one place a component is verified) and the grants they run with
//!   ([`sandbox::grants`], the one place grants are built);
//! - [`placement`]: the candidates a placement component ranks, and resolving classes
//!   to a Provider's terms;
//! - [`ops`]: metrics, health and the permissions each role needs.
//!
//! [`run`] starts the roles asked for with a [`Context`].

pub mod context;
pub mod controllers;
pub mod failure;
#[cfg(test)]
mod fixtures;
pub mod framework;
pub mod ops;
pub mod placement;
pub mod run;
pub mod sandbox;
pub mod status;

pub use failure::{Error, Failure};
pub use context::{Context, ImageBuildOptions, ImageCacheOptions, Options, VaultAccess};
pub use ops::metrics::{Metrics, Readiness};
pub use ops::permissions::Role;
pub use run::{run, Roles};
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
