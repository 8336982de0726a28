//! Built-in placement policy: fill the fullest failure domain that still fits.

mod binpack;

pub use binpack::Binpack;

banlieue_sdk::export_placement!(Binpack);
