//! Running drivers built against `banlieue:provider@0.5.0`, before snapshots.
//!
//! 0.6.0 added records and functions, and one field to `machine-ref` (`backend-id`, for
//! adopted machines). Every other 0.5.0 record is unchanged, so the 0.5.0 driver's calls take
//! and return 0.6.0's Rust types (`with` below, type by type; the component model checks records
//! by shape, not by package); its `machine-ref` is its own, made from 0.6.0's ([`From`] below:
//! a 0.5.0 driver adopts nothing, so no machine it is given has a backend id). What 0.5.0
//! lacks, the host refuses before calling ([`crate::CallError::Unsupported`]).

pub(crate) mod bindings {
    wasmtime::component::bindgen!({
        path: ["../../wit/host", "../../wit/provider-0.5"],
        world: "banlieue:provider/provider",
        imports: { default: async },
        exports: { default: async },
        with: {
            "banlieue:host": crate::capability::bindings::banlieue::host,
            "banlieue:provider/types@0.5.0/provider-config": crate::provider::ProviderConfig,
            "banlieue:provider/types@0.5.0/capacity": crate::provider::Capacity,
            "banlieue:provider/types@0.5.0/failure-domain": crate::provider::FailureDomain,
            "banlieue:provider/types@0.5.0/inventory": crate::provider::Inventory,
            "banlieue:provider/types@0.5.0/firmware": crate::provider::Firmware,
            "banlieue:provider/types@0.5.0/power-state": crate::provider::PowerState,
            "banlieue:provider/types@0.5.0/power-off-mode": crate::provider::PowerOffMode,
            "banlieue:provider/types@0.5.0/power-off": crate::provider::PowerOff,
            "banlieue:provider/types@0.5.0/disk": crate::provider::Disk,
            "banlieue:provider/types@0.5.0/ip-config": crate::provider::IpConfig,
            "banlieue:provider/types@0.5.0/nic": crate::provider::Nic,
            "banlieue:provider/types@0.5.0/url-source": crate::provider::UrlSource,
            "banlieue:provider/types@0.5.0/image-source": crate::provider::ImageSource,
            "banlieue:provider/types@0.5.0/user-data-format": crate::provider::UserDataFormat,
            "banlieue:provider/types@0.5.0/machine": crate::provider::Machine,
            "banlieue:provider/types@0.5.0/address-type": crate::provider::AddressType,
            "banlieue:provider/types@0.5.0/address": crate::provider::Address,
            "banlieue:provider/types@0.5.0/condition-status": crate::provider::ConditionStatus,
            "banlieue:provider/types@0.5.0/condition": crate::provider::Condition,
            "banlieue:provider/types@0.5.0/machine-phase": crate::provider::MachinePhase,
            "banlieue:provider/types@0.5.0/disk-status": crate::provider::DiskStatus,
            "banlieue:provider/types@0.5.0/nic-status": crate::provider::NicStatus,
            "banlieue:provider/types@0.5.0/hardware": crate::provider::Hardware,
            "banlieue:provider/types@0.5.0/machine-status": crate::provider::MachineStatus,
            "banlieue:provider/types@0.5.0/image-request": crate::provider::ImageRequest,
            "banlieue:provider/types@0.5.0/image-phase": crate::provider::ImagePhase,
            "banlieue:provider/types@0.5.0/image-status": crate::provider::ImageStatus,
        },
    });
}

/// 0.5.0's `machine-ref`: 0.6.0's without the backend id.
impl From<crate::provider::MachineRef> for bindings::banlieue::provider::types::MachineRef {
    fn from(m: crate::provider::MachineRef) -> Self {
        Self { uid: m.uid, name: m.name, namespace: m.namespace, provider_id: m.provider_id, failure_domain: m.failure_domain }
    }
}

impl bindings::banlieue::provider::types::Host for crate::state::HostState {}

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
