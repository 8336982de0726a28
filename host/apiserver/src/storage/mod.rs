//! Storage: objects by resource, namespace and name with resourceVersions and the
//! event history watches resume from ([`store`]), each object kept as its JSON text
//! with a small index ([`object`]), and the state requests share.

pub mod object;
pub mod state;
pub mod store;
