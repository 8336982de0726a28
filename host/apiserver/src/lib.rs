//! An embedded, Kubernetes-compatible API server for development and tests.
//!
//! It serves the built-in resources banlieue needs (Namespace, Secret, ConfigMap,
//! Event, Lease, CustomResourceDefinition) and any CRD created at run time, with
//! Kubernetes semantics — resourceVersions, watches, finalizers, garbage
//! collection, server-side apply, schema validation — over HTTPS with a bearer
//! token. Production runs on a real cluster; nothing in banlieue depends on this.

pub mod audit;
mod authz;
mod builtins;
mod discovery;
mod gc;
pub mod jsonpath;
pub mod managed;
mod meta;
mod objects;
mod openapi;
pub mod patch;
pub mod protobuf;
mod registry;
mod router;
pub mod schema;
pub mod selector;
mod server;
pub mod shape;
mod state;
mod status;
mod store;
mod table;
mod tls;
mod watch;

pub use server::{ApiServer, Config, MAX_BODY};

pub mod fuzzing;
