//! HTTP and routing: TLS and connections ([`server`]), the request router, discovery,
//! and who may do what ([`authz`]).

pub mod authz;
pub mod discovery;
pub mod router;
pub mod server;
pub mod tls;
