//! A provider that tries to read `/etc/passwd`. Using `std::fs` makes the
//! component import `wasi:filesystem`, which the host never links.

use banlieue_sdk::provider::{Driver, Inventory, Machine, MachineRef, MachineStatus, PowerOff, PowerState, ProviderConfig, Result};
use banlieue_sdk::Error;

pub struct ReadsFiles;

impl Driver for ReadsFiles {
    fn probe(_: &ProviderConfig) -> Result<Inventory> {
        let text = std::fs::read_to_string("/etc/passwd").map_err(|e| Error::Internal(e.to_string()))?;
        Err(Error::Internal(format!("read {} bytes", text.len())))
    }
    fn create(_: &ProviderConfig, _: &Machine) -> Result<MachineStatus> {
        Err(Error::Internal("no".into()))
    }
    fn describe(_: &ProviderConfig, _: &MachineRef) -> Result<MachineStatus> {
        Err(Error::Internal("no".into()))
    }
    fn set_power(_: &ProviderConfig, _: &MachineRef, _: PowerState, _: &PowerOff) -> Result<MachineStatus> {
        Err(Error::Internal("no".into()))
    }
    fn delete(_: &ProviderConfig, _: &MachineRef, _: &PowerOff) -> Result<()> {
        Ok(())
    }
}

banlieue_sdk::export_provider!(ReadsFiles);
