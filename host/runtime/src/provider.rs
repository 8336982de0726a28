//! Provider components: the driver of one backend kind. Each call runs in a
//! fresh instance with the capabilities of one Provider: its endpoint, its
//! libvirt URI, its secret — nothing else.

use wasmtime::component::HasSelf;

use crate::capability::Grants;
use crate::component::{Contract, LoadedComponent};
use crate::error::CallError;
use crate::limits::Limits;
use crate::state::{classify, classify_instantiate, new_store, HostState};
use crate::{validate, Runtime};

pub(crate) mod bindings {
    wasmtime::component::bindgen!({
        path: ["../../wit/host", "../../wit/provider"],
        world: "banlieue:provider/provider",
        imports: { default: async },
        exports: { default: async },
        with: { "banlieue:host": crate::capability::bindings::banlieue::host },
    });
}

pub use bindings::banlieue::provider::types::{
    Address, AddressType, Capacity, Condition, ConditionStatus, Disk, DiskStatus, FailureDomain, Firmware, Hardware, ImagePhase, ImageRequest,
    ImageSource, ImageStatus, Inventory, IpConfig, Machine, MachinePhase, MachineRef, MachineStatus, Nic, NicStatus, PowerOff, PowerOffMode,
    PowerState, ProviderConfig, UrlSource, UserDataFormat,
};

/// A provider driver ready to be called.
#[derive(Clone)]
pub struct ProviderDriver {
    rt: Runtime,
    pre: bindings::ProviderPre<HostState>,
    pub component: LoadedComponent,
}

impl Runtime {
    /// Load a provider component.
    pub fn provider(&self, bytes: &[u8]) -> Result<ProviderDriver, CallError> {
        let component = self.load(bytes, Contract::Provider)?;
        let mut linker = self.wasi_linker()?;
        bindings::Provider::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)
            .map_err(|e| CallError::Invalid(format!("{e:#}")))?;
        let pre = linker.instantiate_pre(&component.component).map_err(|e| CallError::Incompatible(format!("{e:#}")))?;
        let pre = bindings::ProviderPre::new(pre).map_err(|e| CallError::Incompatible(format!("{e:#}")))?;
        Ok(ProviderDriver { rt: self.clone(), pre, component })
    }
}

/// Run one export call in a fresh instance and map every failure.
macro_rules! call {
    ($self:ident, $limits:ident, $grants:ident, |$d:ident, $store:ident| $body:expr) => {{
        let mut $store = new_store(&$self.rt, Contract::Provider, $limits, $grants);
        let instance = match $self.pre.instantiate_async(&mut $store).await {
            Ok(i) => i,
            Err(e) => return Err(classify_instantiate(&$store, e)),
        };
        let $d = instance.banlieue_provider_driver();
        let result = $body;
        crate::usage::provider_call($store.data().meter.guest_time());
        match result {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(CallError::Guest(e.into())),
            Err(e) => Err(classify(&$store, e)),
        }
    }};
}

impl ProviderDriver {
    pub async fn probe(&self, config: &ProviderConfig, limits: Limits, grants: Grants) -> Result<Inventory, CallError> {
        let inv = call!(self, limits, grants, |d, store| d.call_probe(&mut store, config).await)?;
        validate::inventory(&inv)?;
        Ok(inv)
    }

    pub async fn create(&self, config: &ProviderConfig, machine: &Machine, limits: Limits, grants: Grants) -> Result<MachineStatus, CallError> {
        let st = call!(self, limits, grants, |d, store| d.call_create(&mut store, config, machine).await)?;
        validate::machine_status("create", &st)?;
        Ok(st)
    }

    pub async fn describe(&self, config: &ProviderConfig, machine: &MachineRef, limits: Limits, grants: Grants) -> Result<MachineStatus, CallError> {
        let st = call!(self, limits, grants, |d, store| d.call_describe(&mut store, config, machine).await)?;
        validate::machine_status("describe", &st)?;
        Ok(st)
    }

    pub async fn set_power(&self, config: &ProviderConfig, machine: &MachineRef, state: PowerState, off: PowerOff, limits: Limits, grants: Grants) -> Result<MachineStatus, CallError> {
        let st = call!(self, limits, grants, |d, store| d.call_set_power(&mut store, config, machine, state, off).await)?;
        validate::machine_status("set-power", &st)?;
        Ok(st)
    }

    pub async fn delete(&self, config: &ProviderConfig, machine: &MachineRef, off: PowerOff, limits: Limits, grants: Grants) -> Result<(), CallError> {
        call!(self, limits, grants, |d, store| d.call_delete(&mut store, config, machine, off).await)
    }

    pub async fn import_image(&self, config: &ProviderConfig, request: &ImageRequest, limits: Limits, grants: Grants) -> Result<ImageStatus, CallError> {
        let st = call!(self, limits, grants, |d, store| d.call_import_image(&mut store, config, request).await)?;
        validate::image_status(&st)?;
        Ok(st)
    }

    pub async fn delete_image(&self, config: &ProviderConfig, request: &ImageRequest, reference: &str, limits: Limits, grants: Grants) -> Result<(), CallError> {
        call!(self, limits, grants, |d, store| d.call_delete_image(&mut store, config, request, reference).await)
    }
}

impl bindings::banlieue::provider::types::Host for HostState {}
