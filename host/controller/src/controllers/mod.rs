//! One module per reconciled kind. Role `controller`: [`virtualmachine`], [`pool`], [`snapshotschedule`],
//! [`capi`]. Role `provider`: [`machine`], [`provider`], [`in_use`], [`vmsnapshot`]. Role
//! `operator`: [`operator`] (ProviderClasses and PlacementPolicies). Role
//! `imagebuilder`: [`vmimage`].

pub mod capi;
pub mod in_use;
pub mod machine;
pub mod operator;
pub mod pool;
pub mod provider;
pub mod snapshotschedule;
pub mod virtualmachine;
pub mod vmimage;
pub mod vmsnapshot;
