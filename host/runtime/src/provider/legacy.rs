//! Running drivers built against `banlieue:provider@0.5.0`, before snapshots.
//!
//! 0.6.0 only added records and functions: every 0.5.0 record is unchanged, so the
//! 0.5.0 driver's calls take and return 0.6.0's Rust types (`with` below; the component
//! model checks records by shape, not by package). What 0.5.0 lacks, the host refuses
//! before calling ([`crate::CallError::Unsupported`]).

pub(crate) mod bindings {
    wasmtime::component::bindgen!({
        path: ["../../wit/host", "../../wit/provider-0.5"],
        world: "banlieue:provider/provider",
        imports: { default: async },
        exports: { default: async },
        with: {
            "banlieue:host": crate::capability::bindings::banlieue::host,
            "banlieue:provider/types@0.5.0": crate::provider::bindings::banlieue::provider::types,
        },
    });
}

/// Whether a driver built for `version` (one the host accepted) runs through this adapter.
pub(crate) fn adapts(version: &semver::Version) -> bool {
    (version.major, version.minor) == (0, 5)
}

/// 0.5.0's session store is 0.6.0's: the same three calls on the same per-Provider state.
impl bindings::banlieue::provider::session::Host for crate::state::HostState {
    async fn get(&mut self) -> Option<String> {
        crate::provider::bindings::banlieue::provider::session::Host::get(self).await
    }
    async fn set(&mut self, token: String, ttl_seconds: u32) -> Result<(), crate::capability::WitError> {
        crate::provider::bindings::banlieue::provider::session::Host::set(self, token, ttl_seconds).await
    }
    async fn clear(&mut self) {
        crate::provider::bindings::banlieue::provider::session::Host::clear(self).await
    }
}
