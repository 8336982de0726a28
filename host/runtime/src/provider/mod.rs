//! Provider components: the driver of one backend kind. Each call runs in a
//! fresh instance with the capabilities of one Provider: its endpoint, its
//! libvirt URI, its secret — nothing else.

use wasmtime::component::HasSelf;

use crate::capability::Grants;
use crate::component::{Contract, LoadedComponent};
use crate::error::{CallError, Feature};
use crate::limits::Limits;
use crate::state::{classify, classify_instantiate, new_store, HostState};
use crate::{validate, Runtime};

pub mod legacy;

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
    Address, AddressType, Capacity, Condition, ConditionStatus, ConsoleAccess, ConsoleFraming, ConsoleKind, Disk, DiskStatus, FailureDomain, Firmware, FoundMachine, Hardware, HardwareTarget, ImagePhase, ImageRequest,
    ImageSource, ImageStatus, Inventory, IpConfig, Machine, MachinePage, MachinePhase, MachineRef, MachineStatus, Nic, NicStatus, OwnerMark, PowerOff, PowerOffMode, PowerState,
    ProviderConfig, Snapshot, SnapshotRequest, UrlSource, UserDataFormat, WebsocketConsole,
};

/// A provider driver ready to be called.
#[derive(Clone)]
pub struct ProviderDriver {
    rt: Runtime,
    pre: Pre,
    pub component: LoadedComponent,
}

/// The driver's contract: the current one, or 0.5.0 through [`legacy`].
#[derive(Clone)]
enum Pre {
    Current(bindings::ProviderPre<HostState>),
    V0_5(legacy::bindings::ProviderPre<HostState>),
}

impl Runtime {
    /// Load a provider component.
    pub fn provider(&self, bytes: &[u8]) -> Result<ProviderDriver, CallError> {
        let component = self.load(bytes, Contract::Provider)?;
        let mut linker = self.wasi_linker()?;
        let invalid = |e: wasmtime::Error| CallError::Invalid(format!("{e:#}"));
        let incompatible = |e: wasmtime::Error| CallError::Incompatible(format!("{e:#}"));
        let pre = if legacy::adapts(&component.contract_version) {
            legacy::bindings::Provider::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s).map_err(invalid)?;
            let pre = linker.instantiate_pre(&component.component).map_err(incompatible)?;
            Pre::V0_5(legacy::bindings::ProviderPre::new(pre).map_err(incompatible)?)
        } else {
            bindings::Provider::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s).map_err(invalid)?;
            let pre = linker.instantiate_pre(&component.component).map_err(incompatible)?;
            Pre::Current(bindings::ProviderPre::new(pre).map_err(incompatible)?)
        };
        Ok(ProviderDriver { rt: self.clone(), pre, component })
    }
}

/// Run one export call in a fresh instance and map every failure. The body is written
/// once and compiled for each contract the call exists in (their types are the same);
/// `only current` calls refuse an older driver before instantiating it.
macro_rules! call {
    ($self:ident, $limits:ident, $grants:ident, |$d:ident, $store:ident| $body:expr) => {{
        match &$self.pre {
            Pre::Current(pre) => call!(@run pre, $self, $limits, $grants, |$d, $store| $body),
            Pre::V0_5(pre) => call!(@run pre, $self, $limits, $grants, |$d, $store| $body),
        }
    }};
    (only current $feature:expr, $self:ident, $limits:ident, $grants:ident, |$d:ident, $store:ident| $body:expr) => {{
        match &$self.pre {
            Pre::Current(pre) => call!(@run pre, $self, $limits, $grants, |$d, $store| $body),
            Pre::V0_5(_) => Err(CallError::Unsupported { feature: $feature, contract: $self.component.contract_version.clone() }),
        }
    }};
    (@run $pre:ident, $self:ident, $limits:ident, $grants:ident, |$d:ident, $store:ident| $body:expr) => {{
        let mut $store = new_store(&$self.rt, Contract::Provider, $limits, $grants);
        let instance = match $pre.instantiate_async(&mut $store).await {
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
        let st = call!(self, limits, grants, |d, store| d.call_describe(&mut store, config, &machine.clone().into()).await)?;
        validate::machine_status("describe", &st)?;
        Ok(st)
    }

    pub async fn set_power(&self, config: &ProviderConfig, machine: &MachineRef, state: PowerState, off: PowerOff, limits: Limits, grants: Grants) -> Result<MachineStatus, CallError> {
        let st = call!(self, limits, grants, |d, store| d.call_set_power(&mut store, config, &machine.clone().into(), state, off).await)?;
        validate::machine_status("set-power", &st)?;
        Ok(st)
    }

    pub async fn delete(&self, config: &ProviderConfig, machine: &MachineRef, off: PowerOff, limits: Limits, grants: Grants) -> Result<(), CallError> {
        call!(self, limits, grants, |d, store| d.call_delete(&mut store, config, &machine.clone().into(), off).await)
    }

    pub async fn import_image(&self, config: &ProviderConfig, request: &ImageRequest, limits: Limits, grants: Grants) -> Result<ImageStatus, CallError> {
        let st = call!(self, limits, grants, |d, store| d.call_import_image(&mut store, config, request).await)?;
        validate::image_status(&st)?;
        Ok(st)
    }

    pub async fn delete_image(&self, config: &ProviderConfig, request: &ImageRequest, reference: &str, limits: Limits, grants: Grants) -> Result<(), CallError> {
        call!(self, limits, grants, |d, store| d.call_delete_image(&mut store, config, request, reference).await)
    }

    /// Whether the driver's contract has snapshots (0.6.0).
    pub fn snapshots(&self) -> Result<(), CallError> {
        match self.pre {
            Pre::Current(_) => Ok(()),
            Pre::V0_5(_) => Err(CallError::Unsupported { feature: Feature::Snapshots, contract: self.component.contract_version.clone() }),
        }
    }

    pub async fn snapshot_create(&self, config: &ProviderConfig, machine: &MachineRef, request: &SnapshotRequest, limits: Limits, grants: Grants) -> Result<Snapshot, CallError> {
        let s = call!(only current Feature::Snapshots, self, limits, grants, |d, store| d.call_snapshot_create(&mut store, config, machine, request).await)?;
        validate::snapshots("snapshot-create", std::slice::from_ref(&s))?;
        Ok(s)
    }

    pub async fn snapshot_list(&self, config: &ProviderConfig, machine: &MachineRef, limits: Limits, grants: Grants) -> Result<Vec<Snapshot>, CallError> {
        let list = call!(only current Feature::Snapshots, self, limits, grants, |d, store| d.call_snapshot_list(&mut store, config, machine).await)?;
        validate::snapshots("snapshot-list", &list)?;
        Ok(list)
    }

    pub async fn snapshot_revert(&self, config: &ProviderConfig, machine: &MachineRef, id: &str, limits: Limits, grants: Grants) -> Result<(), CallError> {
        call!(only current Feature::Snapshots, self, limits, grants, |d, store| d.call_snapshot_revert(&mut store, config, machine, id).await)
    }

    pub async fn snapshot_clone(&self, config: &ProviderConfig, machine: &Machine, source: &MachineRef, snapshot_id: &str, linked: bool, limits: Limits, grants: Grants) -> Result<MachineStatus, CallError> {
        let st = call!(only current Feature::Snapshots, self, limits, grants, |d, store| d.call_snapshot_clone(&mut store, config, machine, source, snapshot_id, linked).await)?;
        validate::machine_status("snapshot-clone", &st)?;
        Ok(st)
    }

    /// What the driver offers beyond the calls every driver answers (`features`); a 0.5.0
    /// driver offers nothing more.
    pub async fn features(&self, limits: Limits, grants: Grants) -> Result<Vec<Feature>, CallError> {
        if let Pre::V0_5(_) = self.pre {
            return Ok(Vec::new());
        }
        let names = call!(only current Feature::Snapshots, self, limits, grants, |d, store| d
            .call_features(&mut store)
            .await
            .map(Ok::<_, crate::capability::WitError>))?;
        validate::features(&names)
    }

    /// Whether the driver offers `feature`: its contract has it and its `features` answer lists it.
    pub async fn offers(&self, feature: Feature, limits: Limits, grants: Grants) -> Result<(), CallError> {
        if let Pre::V0_5(_) = self.pre {
            return Err(CallError::Unsupported { feature, contract: self.component.contract_version.clone() });
        }
        match self.features(limits, grants).await?.contains(&feature) {
            true => Ok(()),
            false => Err(CallError::NotOffered(feature)),
        }
    }

    /// Hand the powered-off machine's disks to the host, into `grants.export`. Every disk
    /// the driver names comes in whole, or the call fails.
    pub async fn disk_export(&self, config: &ProviderConfig, machine: &MachineRef, limits: Limits, grants: Grants) -> Result<(), CallError> {
        call!(only current Feature::DiskExport, self, limits, grants, |d, store| d.call_disk_export(&mut store, config, machine).await)
    }

    /// Make `machine` from the disks in `grants.carried`.
    pub async fn disk_import(&self, config: &ProviderConfig, machine: &Machine, limits: Limits, grants: Grants) -> Result<MachineStatus, CallError> {
        let st = call!(only current Feature::DiskImport, self, limits, grants, |d, store| d.call_disk_import(&mut store, config, machine).await)?;
        validate::machine_status("disk-import", &st)?;
        Ok(st)
    }

    pub async fn snapshot_delete(&self, config: &ProviderConfig, machine: &MachineRef, id: &str, limits: Limits, grants: Grants) -> Result<(), CallError> {
        call!(only current Feature::Snapshots, self, limits, grants, |d, store| d.call_snapshot_delete(&mut store, config, machine, id).await)
    }

    /// One page of the machines in the Provider's scope (`page`: the last page's `next`).
    pub async fn list_machines(&self, config: &ProviderConfig, page: Option<&str>, limits: Limits, grants: Grants) -> Result<MachinePage, CallError> {
        let page = call!(only current Feature::Adopt, self, limits, grants, |d, store| d.call_list_machines(&mut store, config, page).await)?;
        validate::machine_page(&page)?;
        Ok(page)
    }

    /// Stamp `mark` on machine `machine.backend_id` unless it carries one; it as found.
    pub async fn adopt(&self, config: &ProviderConfig, machine: &MachineRef, mark: &OwnerMark, limits: Limits, grants: Grants) -> Result<FoundMachine, CallError> {
        let found = call!(only current Feature::Adopt, self, limits, grants, |d, store| d.call_adopt(&mut store, config, machine, mark).await)?;
        validate::found_machine(&found)?;
        Ok(found)
    }

    /// Bring adopted, powered-off machine `machine.backend_id` to `want`; it as described.
    pub async fn reconfigure(&self, config: &ProviderConfig, machine: &MachineRef, want: &HardwareTarget, limits: Limits, grants: Grants) -> Result<MachineStatus, CallError> {
        let st = call!(only current Feature::Adopt, self, limits, grants, |d, store| d.call_reconfigure(&mut store, config, machine, want).await)?;
        validate::machine_status("reconfigure", &st)?;
        Ok(st)
    }

    /// Where machine `machine`'s console of `kind` is, for one session; the host opens it
    /// ([`crate::capability::console::open`]).
    pub async fn console(&self, config: &ProviderConfig, machine: &MachineRef, kind: ConsoleKind, limits: Limits, grants: Grants) -> Result<ConsoleAccess, CallError> {
        let feature = Feature::of_console(kind);
        let access = call!(only current feature, self, limits, grants, |d, store| d.call_console(&mut store, config, machine, kind).await)?;
        validate::console_access(&access)?;
        Ok(access)
    }

    /// Remove `mark` from machine `machine.backend_id`, leaving the machine as it is.
    pub async fn release(&self, config: &ProviderConfig, machine: &MachineRef, mark: &OwnerMark, limits: Limits, grants: Grants) -> Result<(), CallError> {
        call!(only current Feature::Adopt, self, limits, grants, |d, store| d.call_release(&mut store, config, machine, mark).await)
    }
}

impl bindings::banlieue::provider::types::Host for HostState {}
