//! Storage: objects by resource, namespace and name with resourceVersions and the
//! event history watches resume from ([`store`]), and the state requests share.

pub mod state;
pub mod store;
