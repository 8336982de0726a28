//! The edge between the trusted host and the components: [`components`] is the one place
//! a component is fetched, verified and compiled; [`grants`] the one place what a driver
//! may reach is built.

pub mod components;
pub mod grants;
