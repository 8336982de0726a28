//! An embedded, Kubernetes-compatible API server for development and tests.
//!
//! It serves the built-in resources banlieue needs (Namespace, Secret, ConfigMap,
//! Event, Lease, CustomResourceDefinition, RBAC, and the workload kinds `deploy/`
//! installs) and any CRD created at run time, with Kubernetes semantics —
//! resourceVersions, watches, finalizers, garbage collection, server-side apply,
//! schema validation, RBAC for impersonated users — over HTTPS with a bearer token.
//! Production runs on a real cluster; nothing in banlieue depends on this.
//!
//! By concern, each layer using only those below it:
//! - [`http`]: TLS, connections, routing, discovery, authorization;
//! - `objects`: what a request does to objects — CRUD, patch, apply and managed
//!   fields, watch, selectors, per-type behaviour;
//! - `controllers`: what kube-controller-manager would do (garbage collection,
//!   Namespace termination);
//! - `storage`: objects, resourceVersions and watch history;
//! - [`schema`]: served resources, validation, defaulting, pruning, OpenAPI, tables;
//! - [`config`], [`response`], [`status`] and [`audit`]: shared by all.

pub mod audit;
pub mod config;
mod controllers;
pub mod http;
mod objects;
pub mod response;
pub mod schema;
pub mod status;
mod storage;

pub use config::{Config, MAX_BODY};
pub use http::server::ApiServer;
pub use objects::{managed, patch, protobuf, selector};
pub use schema::{jsonpath, shape};

pub mod fuzzing;
