//! banlieue's API: the `banlieue.io` and `infrastructure.banlieue.io` kinds as Rust
//! types, and the generator of their CustomResourceDefinitions.

pub mod class;
pub mod common;
pub mod console;
pub mod crdgen;
pub mod infra;
pub mod provider;
pub mod snapshot;
pub mod vm;

pub use class::{VMClass, VMClassSpec, VMImage, VMImageSpec};
pub use infra::{infrastructure_crds, InfraMachine, InfraMachineSpec};
pub use provider::{PlacementPolicy, Provider, ProviderClass, ProviderSpec};
pub use snapshot::{VMSnapshot, VMSnapshotSchedule, VMSnapshotSpec};
pub use vm::{VirtualMachine, VirtualMachinePool, VirtualMachineSpec};

/// API group of the user-facing kinds.
pub const GROUP: &str = "banlieue.io";
/// The one served version.
pub const VERSION: &str = "v1alpha1";
/// The label naming the banlieue installation an object belongs to (`--instance`);
/// objects without it belong to the default installation.
pub const INSTANCE_LABEL: &str = "banlieue.io/instance";
