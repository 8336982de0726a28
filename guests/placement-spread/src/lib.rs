//! The default placement policy: spread VMs across failure domains.

mod spread;

pub use spread::Spread;

banlieue_sdk::export_placement!(Spread);
