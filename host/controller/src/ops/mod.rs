//! What an operator of banlieue sees: [`metrics`] with `/healthz` and `/readyz`, [`traces`]
//! when an OTLP endpoint is set, each Provider's [`recent`] operations, and the
//! [`permissions`] each role needs (the source of `deploy/`'s RBAC).

pub mod metrics;
pub mod permissions;
pub mod recent;
pub mod traces;
