//! Writing a provider driver: implement [`Driver`] and call [`export_provider!`].
//!
//! A driver instance keeps no state between calls: everything it needs comes
//! in the [`ProviderConfig`] and the call's arguments, and the backend is the
//! source of truth (`create` finds an existing machine by its UID).

pub use crate::bindings::host::banlieue::host::libvirt;
pub use crate::bindings::provider::banlieue::provider::types::{
    Address, AddressType, Capacity, Condition, ConditionStatus, ConsoleAccess, ConsoleFraming, ConsoleKind, Disk, DiskStatus, FailureDomain, Firmware, FoundMachine, Hardware, HardwareTarget, ImagePhase, ImageRequest,
    ImageSource, ImageStatus, Inventory, IpConfig, Machine, MachinePage, MachinePhase, MachineRef, MachineStatus, Nic, NicStatus, OwnerMark, PowerOff, PowerOffMode, PowerState,
    ProviderConfig, Snapshot, SnapshotRequest, UrlSource, UserDataFormat, WebsocketConsole,
};
pub use crate::{Error, Result};

/// The `banlieue:provider` contract version this SDK implements.
pub const CONTRACT_VERSION: &str = "0.6.0";

/// A provider driver. Every call may be retried; all must be idempotent.
pub trait Driver {
    /// What the driver does beyond the calls every driver answers (the host refuses the rest
    /// before calling): [`SNAPSHOTS`], [`DISK_EXPORT`], [`DISK_IMPORT`], [`ADOPT`], [`CONSOLE`], [`VNC`].
    const FEATURES: &'static [&'static str] = &[];
    /// Check the connection; report failure domains and free capacity.
    fn probe(config: &ProviderConfig) -> Result<Inventory>;
    /// Create `machine`, or return the existing one with the same UID, brought (while
    /// powered off) to the machine's hardware where the backend can.
    fn create(config: &ProviderConfig, machine: &Machine) -> Result<MachineStatus>;
    /// Current status of a machine.
    fn describe(config: &ProviderConfig, machine: &MachineRef) -> Result<MachineStatus>;
    /// Drive the machine towards `state`; powering off follows `power_off` (see [`power_off`]).
    fn set_power(config: &ProviderConfig, machine: &MachineRef, state: PowerState, power_off: &PowerOff) -> Result<MachineStatus>;
    /// Power the machine off per `power_off`, then remove it; a machine already gone is success.
    fn delete(config: &ProviderConfig, machine: &MachineRef, power_off: &PowerOff) -> Result<()>;
    /// Import an image; called again until it is ready or failed.
    fn import_image(_config: &ProviderConfig, request: &ImageRequest) -> Result<ImageStatus> {
        Err(Error::InvalidSpec(format!("this driver does not import images ({})", request.name)))
    }
    /// Remove what `import_image` made (`reference` as it reported it; empty: everything
    /// imported for the request's image name); already gone is
    /// success. A driver that imports nothing has nothing to remove.
    fn delete_image(_config: &ProviderConfig, _request: &ImageRequest, _reference: &str) -> Result<()> {
        Ok(())
    }
    /// Take a snapshot, or return the one already named `request.name` (a retry).
    fn snapshot_create(_config: &ProviderConfig, machine: &MachineRef, _request: &SnapshotRequest) -> Result<Snapshot> {
        Err(no_snapshots(machine))
    }
    /// The machine's snapshots, those made on the backend by hand included.
    fn snapshot_list(_config: &ProviderConfig, machine: &MachineRef) -> Result<Vec<Snapshot>> {
        Err(no_snapshots(machine))
    }
    /// Bring the machine back to snapshot `id` (the host has powered it off).
    fn snapshot_revert(_config: &ProviderConfig, machine: &MachineRef, _id: &str) -> Result<()> {
        Err(no_snapshots(machine))
    }
    /// Make `machine` as a copy of `source` at its snapshot `snapshot_id` (idempotent by UID).
    fn snapshot_clone(_config: &ProviderConfig, machine: &Machine, _source: &MachineRef, _snapshot_id: &str, _linked: bool) -> Result<MachineStatus> {
        Err(Error::InvalidSpec(format!("this driver does not restore snapshots into new machines (machine {})", machine.name)))
    }
    /// Hand the powered-off machine's disks to the host, boot disk first
    /// ([`crate::transfer::from_libvirt_volume`], [`crate::transfer::from_http`]).
    fn disk_export(_config: &ProviderConfig, machine: &MachineRef) -> Result<()> {
        Err(Error::InvalidSpec(format!("this driver does not export disks (machine {})", machine.name)))
    }
    /// Make `machine` from the disks the host carries for this call ([`crate::transfer::carried`])
    /// instead of its image; idempotent by UID, left powered off.
    fn disk_import(_config: &ProviderConfig, machine: &Machine) -> Result<MachineStatus> {
        Err(Error::InvalidSpec(format!("this driver does not import disks (machine {})", machine.name)))
    }
    /// Remove snapshot `id`; already gone is success.
    fn snapshot_delete(_config: &ProviderConfig, machine: &MachineRef, _id: &str) -> Result<()> {
        Err(no_snapshots(machine))
    }
    /// One page of the machines in the Provider's scope (`page`: the previous page's `next`).
    fn list_machines(_config: &ProviderConfig, _page: Option<&str>) -> Result<MachinePage> {
        Err(Error::InvalidSpec("this driver does not list the backend's machines".into()))
    }
    /// Stamp `mark` on machine `machine.backend_id` unless it carries one; return it as found.
    fn adopt(_config: &ProviderConfig, machine: &MachineRef, _mark: &OwnerMark) -> Result<FoundMachine> {
        Err(Error::InvalidSpec(format!("this driver does not adopt machines (machine {})", machine.name)))
    }
    /// Bring adopted, powered-off machine `machine.backend_id` to `want` (CPUs, memory, disks
    /// grown by position; never shrunk, never added).
    fn reconfigure(_config: &ProviderConfig, machine: &MachineRef, _want: &HardwareTarget) -> Result<MachineStatus> {
        Err(Error::InvalidSpec(format!("this driver does not reconfigure adopted machines (machine {})", machine.name)))
    }
    /// Remove `mark` from machine `machine.backend_id`, leaving it as it is; gone is success.
    fn release(_config: &ProviderConfig, machine: &MachineRef, _mark: &OwnerMark) -> Result<()> {
        Err(Error::InvalidSpec(format!("this driver does not adopt machines (machine {})", machine.name)))
    }
    /// Where the machine's console of `kind` is, for one session (a fresh ticket where the
    /// backend hands them out); the host opens it and pumps the bytes.
    fn console(_config: &ProviderConfig, machine: &MachineRef, kind: ConsoleKind) -> Result<ConsoleAccess> {
        let what = match kind {
            ConsoleKind::Serial => "serial consoles",
            ConsoleKind::Vnc => "graphical consoles",
        };
        Err(Error::InvalidSpec(format!("this driver opens no {what} (machine {})", machine.name)))
    }
}

/// The feature of a driver that takes, lists, reverts and deletes snapshots.
pub const SNAPSHOTS: &str = "snapshots";
/// The feature of a driver whose machines' disks can be carried to another backend.
pub const DISK_EXPORT: &str = "disk-export";
/// The feature of a driver that makes machines from disks carried from another backend.
pub const DISK_IMPORT: &str = "disk-import";
/// The feature of a driver that lists the backend's machines, adopts and releases them.
pub const ADOPT: &str = "adopt";
/// The feature of a driver that finds a machine's serial console.
pub const CONSOLE: &str = "console";
/// The feature of a driver that finds a machine's graphical (VNC) console.
pub const VNC: &str = "vnc";

/// Which page of `total` items `page` asks for, `size` to a page: the items' range and the
/// next page's token (`none` after the last). A token that is not one this gives is refused.
pub fn page_range(page: Option<&str>, total: usize, size: usize) -> Result<(std::ops::Range<usize>, Option<String>)> {
    let start = match page {
        None => 0,
        Some(p) => p.parse::<usize>().map_err(|_| Error::InvalidSpec(format!("page token {p:?} is not one this driver gave")))?,
    };
    let start = start.min(total);
    let end = start.saturating_add(size.max(1)).min(total);
    Ok((start..end, (end < total).then(|| end.to_string())))
}

/// What a driver that takes no snapshots answers.
fn no_snapshots(machine: &MachineRef) -> Error {
    Error::InvalidSpec(format!("this driver takes no snapshots (machine {})", machine.name))
}

/// What no backend can make, refused before a driver's `create` sees it: a machine without a
/// CPU, memory or a boot disk.
pub fn check_shape(machine: &Machine) -> Result<()> {
    if machine.cpus == 0 || machine.memory_mib == 0 {
        return Err(Error::InvalidSpec(format!("a machine needs at least one CPU and some memory (cpus {}, memory {} MiB)", machine.cpus, machine.memory_mib)));
    }
    if machine.disks.is_empty() {
        return Err(Error::InvalidSpec("a machine needs at least one disk (its first, the boot disk, is cloned from the image)".into()));
    }
    Ok(())
}

/// `delete` semantics: a `not-found` error is success.
pub fn ignore_not_found(result: Result<()>) -> Result<()> {
    match result {
        Err(Error::NotFound(_)) => Ok(()),
        other => other,
    }
}

/// How a backend powers a machine off, for [`power_off`].
pub trait PowerOffOps {
    /// Ask the guest to shut down (ACPI, guest tools); returns before it is off.
    fn request_shutdown(&mut self) -> Result<()>;
    /// Pull the plug; returns once the machine is off.
    fn hard_off(&mut self) -> Result<()>;
    /// Whether the machine is off now.
    fn is_off(&mut self) -> Result<bool>;
}

/// How often a soft shutdown is polled.
pub const SHUTDOWN_POLL_MS: u64 = 250;

/// Power a machine off per `mode`, the same way in every driver: `hard` pulls the plug;
/// `soft` asks the guest and waits up to the timeout, then fails with `unavailable`
/// (the host retries later, the guest is never cut off); `try-soft` asks, waits, then
/// pulls the plug. A guest that refuses the request (no guest tools, no ACPI) counts
/// as one that did not shut down in time.
pub fn power_off(ops: &mut impl PowerOffOps, mode: &PowerOff) -> Result<()> {
    if ops.is_off()? {
        return Ok(());
    }
    if mode.mode == PowerOffMode::Hard {
        return ops.hard_off();
    }
    let asked = match ops.request_shutdown() {
        Ok(()) => true,
        Err(e) if mode.mode == PowerOffMode::TrySoft && !e.is_retryable() => {
            crate::warn!("guest shutdown refused ({}); powering off hard", e.message());
            false
        }
        Err(e) => return Err(e),
    };
    if asked && crate::time::wait_until(u64::from(mode.timeout_ms), SHUTDOWN_POLL_MS, || ops.is_off())? {
        return Ok(());
    }
    match mode.mode {
        PowerOffMode::Soft => Err(Error::Unavailable(format!(
            "the guest did not shut down within {} ms (powerOffMode Soft never forces it off)",
            mode.timeout_ms
        ))),
        _ => {
            if asked {
                crate::info!("guest still running after {} ms; powering off hard", mode.timeout_ms);
            }
            ops.hard_off()
        }
    }
}

/// The backend target for an abstract storage class, from the Provider's mapping.
pub fn storage_target<'a>(config: &'a ProviderConfig, class: &str) -> Result<&'a str> {
    crate::lookup(&config.storage_classes, class)
        .ok_or_else(|| Error::InvalidSpec(format!("storage class {class:?} is not mapped by this Provider")))
}

/// The backend network for an abstract network class, from the Provider's mapping.
pub fn network_target<'a>(config: &'a ProviderConfig, class: &str) -> Result<&'a str> {
    crate::lookup(&config.network_classes, class)
        .ok_or_else(|| Error::InvalidSpec(format!("network class {class:?} is not mapped by this Provider")))
}

/// A condition with the given type and status.
pub fn condition(type_: &str, status: bool, reason: &str, message: impl Into<String>) -> Condition {
    Condition {
        type_: type_.into(),
        status: if status { ConditionStatus::True } else { ConditionStatus::False },
        reason: reason.into(),
        message: message.into(),
    }
}

/// Export a [`Driver`] as this component's `banlieue:provider/driver`.
///
/// Only on wasm32, so the crate's logic also builds and tests natively.
#[macro_export]
macro_rules! export_provider {
    ($driver:ty) => {
        #[cfg(target_arch = "wasm32")]
        #[doc(hidden)]
        mod __banlieue_provider_export {
            #[allow(unused_imports)]
            use super::*;
            use $crate::bindings::provider::exports::banlieue::provider::driver as wit;
            use $crate::provider::Driver as _;
            type D = $driver;
            pub struct Exported;
            impl wit::Guest for Exported {
                fn contract_version() -> ::std::string::String {
                    $crate::provider::CONTRACT_VERSION.into()
                }
                fn probe(config: wit::ProviderConfig) -> ::core::result::Result<wit::Inventory, wit::Error> {
                    D::probe(&config)
                }
                fn create(config: wit::ProviderConfig, machine: wit::Machine) -> ::core::result::Result<wit::MachineStatus, wit::Error> {
                    $crate::provider::check_shape(&machine)?;
                    D::create(&config, &machine)
                }
                fn describe(config: wit::ProviderConfig, machine: wit::MachineRef) -> ::core::result::Result<wit::MachineStatus, wit::Error> {
                    D::describe(&config, &machine)
                }
                fn set_power(
                    config: wit::ProviderConfig,
                    machine: wit::MachineRef,
                    state: wit::PowerState,
                    power_off: wit::PowerOff,
                ) -> ::core::result::Result<wit::MachineStatus, wit::Error> {
                    D::set_power(&config, &machine, state, &power_off)
                }
                fn delete(
                    config: wit::ProviderConfig,
                    machine: wit::MachineRef,
                    power_off: wit::PowerOff,
                ) -> ::core::result::Result<(), wit::Error> {
                    D::delete(&config, &machine, &power_off)
                }
                fn delete_image(config: wit::ProviderConfig, request: wit::ImageRequest, reference: ::std::string::String) -> ::core::result::Result<(), wit::Error> {
                    D::delete_image(&config, &request, &reference)
                }
                fn import_image(config: wit::ProviderConfig, request: wit::ImageRequest) -> ::core::result::Result<wit::ImageStatus, wit::Error> {
                    D::import_image(&config, &request)
                }
                fn snapshot_create(config: wit::ProviderConfig, machine: wit::MachineRef, request: wit::SnapshotRequest) -> ::core::result::Result<wit::Snapshot, wit::Error> {
                    D::snapshot_create(&config, &machine, &request)
                }
                fn snapshot_list(config: wit::ProviderConfig, machine: wit::MachineRef) -> ::core::result::Result<::std::vec::Vec<wit::Snapshot>, wit::Error> {
                    D::snapshot_list(&config, &machine)
                }
                fn snapshot_revert(config: wit::ProviderConfig, machine: wit::MachineRef, id: ::std::string::String) -> ::core::result::Result<(), wit::Error> {
                    D::snapshot_revert(&config, &machine, &id)
                }
                fn snapshot_clone(config: wit::ProviderConfig, machine: wit::Machine, source: wit::MachineRef, snapshot_id: ::std::string::String, linked: bool) -> ::core::result::Result<wit::MachineStatus, wit::Error> {
                    D::snapshot_clone(&config, &machine, &source, &snapshot_id, linked)
                }
                fn features() -> ::std::vec::Vec<::std::string::String> {
                    D::FEATURES.iter().map(|f| ::std::string::ToString::to_string(f)).collect()
                }
                fn disk_export(config: wit::ProviderConfig, machine: wit::MachineRef) -> ::core::result::Result<(), wit::Error> {
                    D::disk_export(&config, &machine)
                }
                fn disk_import(config: wit::ProviderConfig, machine: wit::Machine) -> ::core::result::Result<wit::MachineStatus, wit::Error> {
                    D::disk_import(&config, &machine)
                }
                fn snapshot_delete(config: wit::ProviderConfig, machine: wit::MachineRef, id: ::std::string::String) -> ::core::result::Result<(), wit::Error> {
                    D::snapshot_delete(&config, &machine, &id)
                }
                fn list_machines(config: wit::ProviderConfig, page: ::core::option::Option<::std::string::String>) -> ::core::result::Result<wit::MachinePage, wit::Error> {
                    D::list_machines(&config, page.as_deref())
                }
                fn adopt(config: wit::ProviderConfig, machine: wit::MachineRef, mark: wit::OwnerMark) -> ::core::result::Result<wit::FoundMachine, wit::Error> {
                    D::adopt(&config, &machine, &mark)
                }
                fn release(config: wit::ProviderConfig, machine: wit::MachineRef, mark: wit::OwnerMark) -> ::core::result::Result<(), wit::Error> {
                    D::release(&config, &machine, &mark)
                }
                fn reconfigure(config: wit::ProviderConfig, machine: wit::MachineRef, want: wit::HardwareTarget) -> ::core::result::Result<wit::MachineStatus, wit::Error> {
                    D::reconfigure(&config, &machine, &want)
                }
                fn console(config: wit::ProviderConfig, machine: wit::MachineRef, kind: wit::ConsoleKind) -> ::core::result::Result<wit::ConsoleAccess, wit::Error> {
                    D::console(&config, &machine, kind)
                }
            }
            $crate::bindings::provider::export_provider_world!(Exported with_types_in $crate::bindings::provider);
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_cover_every_item_once_and_refuse_foreign_tokens() {
        let (r, next) = page_range(None, 250, 100).unwrap();
        assert_eq!((r, next.as_deref()), (0..100, Some("100")));
        let (r, next) = page_range(Some("200"), 250, 100).unwrap();
        assert_eq!((r, next), (200..250, None));
        let (r, next) = page_range(Some("999"), 250, 100).unwrap();
        assert_eq!((r, next), (250..250, None), "past the end: empty, last");
        assert!(matches!(page_range(Some("x"), 250, 100), Err(Error::InvalidSpec(_))));
        assert_eq!(page_range(None, 0, 100).unwrap(), (0..0, None));
    }
}
