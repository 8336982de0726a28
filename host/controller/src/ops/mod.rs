//! What an operator of banlieue sees: [`metrics`] with `/healthz` and `/readyz`, and the
//! [`permissions`] each role needs (the source of `deploy/`'s RBAC).

pub mod metrics;
pub mod permissions;
