//! The default placement policy: spread VMs across failure domains.

mod spread;

pub use spread::Spread;

banlieue_sdk::export_placement!(Spread);

// Each call runs in a fresh instance: bump allocation, no frees (see the SDK's `alloc`).
#[cfg(target_arch = "wasm32")]
#[global_allocator]
static ALLOC: banlieue_sdk::alloc::Bump = banlieue_sdk::alloc::Bump::new();
