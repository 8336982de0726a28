//! A provider driver built against `banlieue:provider@0.5.0` with wit-bindgen directly
//! (the SDK implements 0.6.0, which added snapshots): one failure domain, no backend.
//! Machines exist as soon as they are asked for, in the power state asked for, so a
//! VM placed on it becomes Ready — and a snapshot of it must be refused by the host.

wit_bindgen::generate!({
    path: ["../../wit/host", "../../wit/provider-0.5"],
    world: "banlieue:provider/provider",
    generate_all,
});

use banlieue::provider::types::{
    Capacity, Condition, ConditionStatus, FailureDomain, ImageRequest, ImageStatus, Inventory, Machine, MachinePhase, MachineRef, MachineStatus,
    PowerOff, PowerState, ProviderConfig,
};
use exports::banlieue::provider::driver::{Error, Guest};

struct Legacy;

fn status(uid: &str, power_state: PowerState) -> MachineStatus {
    MachineStatus {
        provider_id: format!("legacy://{uid}"),
        hardware: None,
        power_state,
        addresses: vec![],
        conditions: vec![Condition { type_: "Ready".into(), status: ConditionStatus::True, reason: "Legacy".into(), message: String::new() }],
        provisioned: true,
        phase: if power_state == PowerState::PoweredOn { MachinePhase::Running } else { MachinePhase::PoweredOff },
    }
}

impl Guest for Legacy {
    fn contract_version() -> String {
        "0.5.0".into()
    }
    fn probe(config: ProviderConfig) -> Result<Inventory, Error> {
        Ok(Inventory {
            backend_version: Some("legacy 0.5.0".into()),
            failure_domains: vec![FailureDomain {
                name: "default".into(),
                labels: vec![],
                capacity: Capacity { cpus: 64, memory_mib: 256 * 1024, storage_gib: 4096 },
                storage_classes: config.storage_classes.iter().map(|(class, _)| class.clone()).collect(),
                network_classes: config.network_classes.iter().map(|(class, _)| class.clone()).collect(),
                features: config.features,
            }],
        })
    }
    fn create(_: ProviderConfig, machine: Machine) -> Result<MachineStatus, Error> {
        Ok(status(&machine.uid, machine.power_state))
    }
    fn describe(_: ProviderConfig, machine: MachineRef) -> Result<MachineStatus, Error> {
        Ok(status(&machine.uid, PowerState::PoweredOn))
    }
    fn set_power(_: ProviderConfig, machine: MachineRef, state: PowerState, _: PowerOff) -> Result<MachineStatus, Error> {
        Ok(status(&machine.uid, state))
    }
    fn delete(_: ProviderConfig, _: MachineRef, _: PowerOff) -> Result<(), Error> {
        Ok(())
    }
    fn import_image(_: ProviderConfig, request: ImageRequest) -> Result<ImageStatus, Error> {
        Err(Error::InvalidSpec(format!("no images ({})", request.name)))
    }
    fn delete_image(_: ProviderConfig, _: ImageRequest, _: String) -> Result<(), Error> {
        Ok(())
    }
}

export!(Legacy);
