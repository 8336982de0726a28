//! Running drivers built against `banlieue:provider@0.5.0`, before snapshots.
//!
//! 0.6.0 added records and functions, and one field to `machine-ref` (`backend-id`, for
//! adopted machines). Every other 0.5.0 record is unchanged, so the 0.5.0 driver's calls take
//! and return 0.6.0's Rust types (`with` below maps 0.5.0's `types` to [`types`], which is
//! 0.6.0's; the component model checks records by shape, not by package) — but for
//! `machine-ref`, which [`types`] defines in 0.5.0's shape, made from 0.6.0's ([`From`]: a
//! 0.5.0 driver adopts nothing, so no machine it is given has a backend id). What 0.5.0
//! lacks, the host refuses before calling ([`crate::CallError::Unsupported`]).

pub(crate) mod bindings {
    wasmtime::component::bindgen!({
        path: ["../../wit/host", "../../wit/provider-0.5"],
        world: "banlieue:provider/provider",
        imports: { default: async },
        exports: { default: async },
        with: {
            "banlieue:host": crate::capability::bindings::banlieue::host,
            "banlieue:provider/types@0.5.0": super::types,
        },
    });
}

/// 0.5.0's `types`: 0.6.0's, but for `machine-ref`.
pub mod types {
    pub use crate::provider::bindings::banlieue::provider::types::*;

    /// 0.5.0's `machine-ref`: 0.6.0's without the backend id.
    #[derive(wasmtime::component::ComponentType, wasmtime::component::Lift, wasmtime::component::Lower, Clone, Debug)]
    #[component(record)]
    pub struct MachineRef {
        pub uid: String,
        pub name: String,
        pub namespace: String,
        #[component(name = "provider-id")]
        pub provider_id: Option<String>,
        #[component(name = "failure-domain")]
        pub failure_domain: String,
    }

    impl From<crate::provider::MachineRef> for MachineRef {
        fn from(m: crate::provider::MachineRef) -> Self {
            MachineRef { uid: m.uid, name: m.name, namespace: m.namespace, provider_id: m.provider_id, failure_domain: m.failure_domain }
        }
    }
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
