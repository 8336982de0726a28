//! A minimal provider driver: one failure domain, no backend, no state.
//!
//! Machines "exist" as soon as they are asked for and report the power
//! state they were asked for; a skeleton to start a real driver from.

use banlieue_sdk::provider::{
    Capacity, Driver, FailureDomain, Inventory, Machine, MachineRef, MachineStatus, MachinePhase, PowerOff, PowerState, ProviderConfig,
    Result, condition,
};
use banlieue_sdk::{info, warn};

pub struct Minimal;

fn status(uid: &str, power_state: PowerState) -> MachineStatus {
    MachineStatus {
        provider_id: format!("minimal://{uid}"),
        // No backend: nothing to report (a real driver reports what the backend holds).
        hardware: None,
        power_state,
        addresses: vec![],
        conditions: vec![condition("Ready", true, "Minimal", "the minimal provider has no backend")],
        provisioned: true,
        phase: if power_state == PowerState::PoweredOn { MachinePhase::Running } else { MachinePhase::PoweredOff },
    }
}

impl Driver for Minimal {
    fn probe(config: &ProviderConfig) -> Result<Inventory> {
        info!("probe {} at {}", config.provider, config.endpoint);
        Ok(Inventory {
            backend_version: Some("minimal 0.1.0".into()),
            failure_domains: vec![FailureDomain {
                name: "default".into(),
                labels: vec![("topology.kubernetes.io/zone".into(), "default".into())],
                capacity: Capacity { cpus: 64, memory_mib: 256 * 1024, storage_gib: 4096 },
                storage_classes: config.storage_classes.iter().map(|(class, _)| class.clone()).collect(),
                network_classes: config.network_classes.iter().map(|(class, _)| class.clone()).collect(),
                features: config.features.clone(),
            }],
        })
    }

    fn create(_: &ProviderConfig, machine: &Machine) -> Result<MachineStatus> {
        info!("create {}/{} ({})", machine.namespace, machine.name, machine.uid);
        Ok(status(&machine.uid, machine.power_state))
    }

    fn describe(_: &ProviderConfig, machine: &MachineRef) -> Result<MachineStatus> {
        // Without state the last requested power state is unknown; say running.
        Ok(status(&machine.uid, PowerState::PoweredOn))
    }

    fn set_power(_: &ProviderConfig, machine: &MachineRef, state: PowerState, _: &PowerOff) -> Result<MachineStatus> {
        info!("set-power {} {state:?}", machine.uid);
        Ok(status(&machine.uid, state))
    }

    fn delete(_: &ProviderConfig, machine: &MachineRef, _: &PowerOff) -> Result<()> {
        warn!("delete {}: nothing to remove", machine.uid);
        Ok(())
    }
}

banlieue_sdk::export_provider!(Minimal);
