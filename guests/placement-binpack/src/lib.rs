//! Built-in placement policy: fill the fullest failure domain that still fits.

mod binpack;

pub use binpack::Binpack;

banlieue_sdk::export_placement!(Binpack);

// Each call runs in a fresh instance: bump allocation, no frees (see the SDK's `alloc`).
#[cfg(target_arch = "wasm32")]
#[global_allocator]
static ALLOC: banlieue_sdk::alloc::Bump = banlieue_sdk::alloc::Bump::new();
