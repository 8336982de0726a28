//! The libvirt provider driver: one libvirt host per Provider, reached only
//! through the host's `banlieue:host/libvirt` capability (the grant is the
//! connection to the Provider's URI) and `log`. It keeps no state: libvirt is
//! the source of truth, and every call is idempotent.
//!
//! # Mapping
//!
//! - Machine `namespace/name` is the persistent domain `{namespace}_{name}`
//!   (an underscore cannot occur in a Kubernetes name, so this is unambiguous).
//!   Its `<uuid>` is the Machine UID — the idempotency key — and it carries
//!   `<title>{namespace}/{name}</title>` and a `<metadata>` element in the
//!   `https://banlieue.io/libvirt/v1` namespace with the UID, namespace and name.
//! - Disk `d` is the qcow2 volume `{namespace}_{name}_{d}.qcow2` in storage pool
//!   `disk.target`, thin, of the class's size; the first (boot) disk is an overlay
//!   on the image's backing file (qcow2 `<backingStore>`). Only `backingFile`
//!   image sources are supported.
//! - The user-data reaches the guest as a **NoCloud seed**: a FAT image labelled
//!   `cidata` with `meta-data` (instance ID = Machine UID, hostname) and
//!   `user-data`, built in memory here ([`seed`], at most [`seed::MAX_USER_DATA`]
//!   bytes of user-data), uploaded into the raw volume `{namespace}_{name}_cidata.img`
//!   in the boot disk's pool and attached read-only after the disks. On libvirt's
//!   test driver (which cannot upload and boots nothing) the user-data is only
//!   recorded in the metadata instead.
//! - The serial console is a pty logged by libvirt to
//!   `/var/log/libvirt/qemu/{domain}.serial.log` on the libvirt host; a virtio
//!   channel for the QEMU guest agent is added.
//! - NICs are `<interface type='network'>` on `nic.network`, virtio.
//! - `<domain type>` is `test` when the endpoint starts with `test` (libvirt's
//!   test driver), otherwise `qemu` (TCG, so no `/dev/kvm` is needed).
//!
//! # Calls
//!
//! - `create`: a domain of that name with the machine's UID is the machine
//!   (shut off, it is brought to the machine's vCPUs, memory and disk sizes — a
//!   redefinition and `volume-resize`; then its power state is driven to the
//!   requested one); with another UUID it
//!   belongs to another machine (`invalid-spec`). Otherwise the spec is checked
//!   against the host (pools, networks, image kind, seed size, room in the
//!   pool) before anything is made, missing volumes are created (volumes left
//!   by an interrupted create are reused; the seed is always written anew),
//!   the domain is defined and, if asked for, started. A create that fails
//!   before the domain is defined removes the volumes it made.
//! - `describe`: `libvirt://{uuid}`, the power state from the domain state,
//!   the addresses from the DHCP leases of the domain's networks (else the
//!   guest agent), phase `waiting-for-address` while a running domain with a
//!   NIC has none, the NIC MACs in the `PoweredOn` condition's message, the hardware
//!   (vCPUs, memory, each disk's volume and capacity, each NIC's MAC and network) from
//!   the domain XML and the pools' volumes. A domain of that name with another UUID
//!   is `not-found` for this machine.
//! - `set-power`: on starts the domain; off follows the power-off mode
//!   (`banlieue_sdk::provider::power_off`): `hard` is `domain-destroy`, `soft`
//!   an ACPI `domain-shutdown` polled until the domain is off, `try-soft` the
//!   same then `domain-destroy` at the timeout; suspend is refused.
//! - `delete`: power off per the mode, undefine, then delete every volume whose name starts
//!   with `{namespace}_{name}_` in every active pool, so a delete retried after
//!   a crash still removes leftovers. A domain of that name with another UUID
//!   is left alone (and so are the volumes, which are its).
//! - `probe`: the host is one failure domain named after the Provider; memory
//!   is the node's (libvirt hosts overcommit, and a domain's maximum says little
//!   about what it uses, so defined domains are not subtracted), storage is the
//!   free space of the mapped pools (volumes are thin: allocation 0); a class is offered only if its pool or network
//!   exists and is active.
//! - `import-image`: the host holds the image (downloaded, verified, converted to qcow2);
//!   the driver (re)creates the volume `image@{vmimage}@{sha256 prefix}` in the request's
//!   target pool, exactly the image's size, and asks the host to stream the image into it
//!   (`banlieue:host/transfer`): the bytes never pass through the driver. The reference is
//!   the volume's path, for machines to use as their backing file. The host records
//!   completion in the VMImage's status, so an import cut off is simply done again.
//! - `snapshot-clone` ([`clone`]): each disk volume of the source at the snapshot copied
//!   (`volume-clone`) into the new machine's volume of that position, the domain defined as
//!   `create` defines it on them (marked as a restore in its metadata), the snapshot recorded
//!   on it (`snapshot-redefine`, embedding its own definition), reverted to, deleted, the mark
//!   removed; then hardware and power as for any machine. Always a full copy. A `create` of a
//!   domain still marked is `unavailable`.
//! - `list-machines`, `adopt`, `release` ([`adopt`]): every domain is listed by UUID; an adopted
//!   one carries an owner mark in a `<metadata>` element of its own, is found by its UUID while
//!   it carries its machine's mark, and is otherwise left as it was made.
//! - `delete-image`: deletes the volume at the reported path, if its name is one this driver
//!   gives imports of that VMImage (`image@{vmimage}@…`); already gone is success.

use banlieue_sdk::provider::libvirt::{self, DomainInfo, DomainState};
use banlieue_sdk::provider::{
    ConsoleAccess, ConsoleKind, Driver, ImagePhase, ImageRequest, ImageStatus, Inventory, Machine, MachineRef, MachineStatus, PowerOff, PowerOffOps,
    PowerState, ProviderConfig, Result, Snapshot, SnapshotRequest, ignore_not_found, power_off,
};
use banlieue_sdk::transfer;
use banlieue_sdk::{Error, info, warn};

pub mod adopt;
pub mod carry;
pub mod clone;
pub mod naming;
pub mod seed;
pub mod snapshot;
pub mod spec;
pub mod xml;

pub struct Libvirt;

/// A machine created powered off is defined, never started: nothing to shut down.
const CREATE_POWER_OFF: PowerOff = PowerOff { mode: banlieue_sdk::provider::PowerOffMode::Hard, timeout_ms: 0 };

/// The domain named `name`, if any (a lookup: hosts with thousands of domains stay fast).
fn find(name: &str) -> Result<Option<DomainInfo>> {
    match libvirt::domain_get(name) {
        Ok(d) => Ok(Some(d)),
        Err(Error::NotFound(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The machine's domain, or `not-found` (also when the name is taken by another machine's
/// domain, or an adopted domain no longer carries the machine's mark). Every call that is
/// given a machine finds its domain here.
fn lookup(machine: &MachineRef) -> Result<DomainInfo> {
    if let Some(id) = adopt::backend_id(machine) {
        return adopt::lookup(machine, id);
    }
    naming::check_machine(&machine.namespace, &machine.name)?;
    let name = naming::domain_name(&machine.namespace, &machine.name);
    match find(&name)? {
        None => Err(Error::NotFound(format!("libvirt domain {name} does not exist"))),
        Some(d) if !machine.uid.is_empty() && !naming::same_uuid(&d.uuid, &machine.uid) => Err(Error::NotFound(
            format!("libvirt domain {name} belongs to another machine (uuid {}, not {})", d.uuid, machine.uid),
        )),
        Some(d) => Ok(d),
    }
}

pub(crate) fn describe_domain(config: &ProviderConfig, name: &str) -> Result<MachineStatus> {
    let domain = find(name)?.ok_or_else(|| Error::NotFound(format!("libvirt domain {name} does not exist")))?;
    let xml = libvirt::domain_xml(name)?;
    let addresses = addresses(&domain, spec::virt_type(config));
    let hw = xml::hardware(&xml);
    let hardware = spec::hardware(name, &hw, &volumes_of(&hw)?);
    Ok(spec::status(&domain, &xml, &addresses, Some(hardware)))
}

/// The volumes of the pools the domain's disks are in (one listing per pool).
fn volumes_of(hw: &xml::DomainHardware) -> Result<Vec<(String, libvirt::VolumeInfo)>> {
    let pools: std::collections::BTreeSet<&str> = hw.disks.iter().filter(|d| !d.readonly && !d.pool.is_empty()).map(|d| d.pool.as_str()).collect();
    let mut out = Vec::new();
    for pool in pools {
        out.extend(libvirt::volume_list(pool)?.into_iter().map(|v| (pool.to_string(), v)));
    }
    Ok(out)
}

/// Bring shut-off domain `name` to the machine's hardware: vCPUs and memory by redefining
/// it, each disk grown to its size (never shrunk: refused). A disk the domain lacks is not
/// added here; describe shows it missing, and the host says so.
fn apply_hardware(name: &str, machine: &Machine) -> Result<()> {
    let domain_xml = libvirt::domain_xml(name)?;
    let hw = xml::hardware(&domain_xml);
    let volumes = volumes_of(&hw)?;
    let mut grow = Vec::new();
    for disk in &machine.disks {
        let volume = naming::volume_name(&machine.namespace, &machine.name, &disk.name);
        let Some((pool, have)) = volumes.iter().find(|(_, v)| v.name == volume).map(|(p, v)| (p, v.capacity_bytes)) else { continue };
        let want = disk.size_gib << 30;
        if want < have {
            return Err(Error::InvalidSpec(format!("disk {} of libvirt domain {name} holds {} GiB; it is never shrunk to {} GiB", disk.name, have >> 30, disk.size_gib)));
        }
        if want > have {
            grow.push((pool.clone(), volume, want));
        }
    }
    if hw.cpus != machine.cpus || hw.memory_mib != machine.memory_mib {
        info!("redefining libvirt domain {name}: {} vCPUs, {} MiB (was {}, {})", machine.cpus, machine.memory_mib, hw.cpus, hw.memory_mib);
        libvirt::domain_define(&xml::with_cpus_and_memory(&domain_xml, machine.cpus, machine.memory_mib)?)?;
    }
    for (pool, volume, bytes) in grow {
        info!("growing volume {volume} in pool {pool} to {} GiB", bytes >> 30);
        libvirt::volume_resize(&pool, &volume, bytes)?;
    }
    Ok(())
}

/// Refuse a domain of the machine's name that carries another UUID: another machine's.
fn check_owner(name: &str, existing: &DomainInfo, machine: &Machine) -> Result<()> {
    if naming::same_uuid(&existing.uuid, &machine.uid) {
        return Ok(());
    }
    Err(Error::InvalidSpec(format!("libvirt domain {name} exists and belongs to another machine (uuid {}, not {})", existing.uuid, machine.uid)))
}

/// Bring the machine's existing domain to the machine's hardware (while shut off) and power state.
fn realise(config: &ProviderConfig, name: &str, existing: &DomainInfo, machine: &Machine) -> Result<MachineStatus> {
    // libvirt starts a domain paused, then resumes it: one found paused while its
    // machine is still being created was left so by an interrupted start (nothing
    // suspends a machine banlieue has not finished making). It has not run: start it
    // afresh. A machine already made keeps the rule: banlieue does not resume VMs.
    let mut state = existing.state;
    if state == DomainState::Paused && machine.power_state == PowerState::PoweredOn {
        warn!("libvirt domain {name} was left paused by an interrupted start; starting it afresh");
        ignore_not_found(libvirt::domain_destroy(name))?;
        state = DomainState::Shutoff;
    }
    if state == DomainState::Shutoff {
        apply_hardware(name, machine)?;
    }
    ensure_power(name, state, machine.power_state, &CREATE_POWER_OFF)?;
    describe_domain(config, name)
}

/// Drive domain `name`, now in `state`, towards `target`; powering off follows `off`.
fn ensure_power(name: &str, state: DomainState, target: PowerState, off: &PowerOff) -> Result<()> {
    match target {
        PowerState::Suspended => Err(Error::InvalidSpec("the libvirt driver does not suspend VMs".into())),
        PowerState::PoweredOn => match state {
            DomainState::Running | DomainState::Blocked => Ok(()),
            DomainState::Paused | DomainState::PmSuspended => Err(Error::InvalidSpec(format!(
                "libvirt domain {name} was suspended outside banlieue; the libvirt driver does not resume VMs"
            ))),
            DomainState::Shutdown => {
                Err(Error::Unavailable(format!("libvirt domain {name} is shutting down; start it once it is off")))
            }
            DomainState::Shutoff | DomainState::Crashed | DomainState::NoState => {
                info!("starting libvirt domain {name}");
                match libvirt::domain_start(name) {
                    // Started by someone else meanwhile.
                    Err(Error::InvalidSpec(_))
                        if spec::power_state(libvirt::domain_get_state(name)?) == PowerState::PoweredOn =>
                    {
                        Ok(())
                    }
                    other => other,
                }
            }
        },
        PowerState::PoweredOff => power_off(&mut Domain(name), off),
    }
}

/// Powering one domain off: ACPI shutdown, destroy, and its state.
struct Domain<'a>(&'a str);

impl PowerOffOps for Domain<'_> {
    fn request_shutdown(&mut self) -> Result<()> {
        info!("shutting down (ACPI) libvirt domain {}", self.0);
        match libvirt::domain_shutdown(self.0) {
            // Went off between the state check and the request.
            Err(Error::InvalidSpec(_)) if self.is_off()? => Ok(()),
            other => other,
        }
    }

    fn hard_off(&mut self) -> Result<()> {
        info!("powering off (destroying) libvirt domain {}", self.0);
        match libvirt::domain_destroy(self.0) {
            // Already off by the time the call arrived.
            Err(Error::InvalidSpec(_)) if self.is_off()? => Ok(()),
            other => other,
        }
    }

    fn is_off(&mut self) -> Result<bool> {
        Ok(!spec::is_active(libvirt::domain_get_state(self.0)?))
    }
}

fn list_snapshots(domain: &str) -> Result<Vec<Snapshot>> {
    Ok(libvirt::snapshot_list(domain)?.iter().map(|s| snapshot::parse(&s.name, s.current, &s.xml)).collect())
}

/// The machine's NoCloud seed, built before anything is created on the host.
struct Seed {
    pool: String,
    volume: String,
    image: Vec<u8>,
}

impl Seed {
    /// The seed goes into the boot disk's pool; refused when that pool has no room for it.
    fn build(machine: &Machine, pools: &[libvirt::PoolInfo]) -> Result<Seed> {
        let files = seed::files(&machine.uid, &machine.name, xml::cloud_init_user_data(machine), xml::network_config(machine).as_deref())?;
        let image = seed::image(&files)?;
        let pool = machine.disks[0].target.clone();
        let free = pools.iter().find(|p| p.name == pool).map_or(0, |p| p.available_bytes);
        // The seed plus room for the qcow2 overlays' metadata.
        let needed = image.len() as u64 + spec::OVERLAY_HEADROOM_BYTES;
        if free < needed {
            return Err(Error::Unavailable(format!(
                "storage pool {pool:?} has {free} bytes free; machine {}/{} needs at least {needed} (its {}-byte NoCloud seed and disk overlays)",
                machine.namespace,
                machine.name,
                image.len()
            )));
        }
        Ok(Seed { volume: naming::seed_volume_name(&machine.namespace, &machine.name), pool, image })
    }
}

/// Volumes one `create` made, removed again when it fails before the domain is defined.
#[derive(Default)]
struct Created(Vec<(String, String)>);

impl Created {
    fn remove(self) {
        for (pool, volume) in self.0 {
            match libvirt::volume_delete(&pool, &volume) {
                Ok(()) | Err(Error::NotFound(_)) => info!("removed volume {volume} in pool {pool} after a failed create"),
                // A later delete of the machine removes it by its name prefix.
                Err(e) => warn!("could not remove volume {volume} in pool {pool} after a failed create: {e}"),
            }
        }
    }
}

/// Define `machine`'s domain: its seed built (on a backend that boots guests) and its XML
/// written — passed through `decorate` — before anything is made (everything that can be
/// refused is checked first), then its volumes made by `make`, then the domain defined on
/// them. What was made is removed if either step fails.
fn define(
    config: &ProviderConfig,
    machine: &Machine,
    pools: &[libvirt::PoolInfo],
    decorate: impl FnOnce(String) -> Result<String>,
    make: impl FnOnce(Option<&Seed>, &mut Created) -> Result<()>,
) -> Result<DomainInfo> {
    let name = naming::domain_name(&machine.namespace, &machine.name);
    let boots = spec::virt_type(config) != "test";
    let seed = if boots { Some(Seed::build(machine, pools)?) } else { None };
    let serial_log = naming::serial_log(&name);
    let extras = xml::Extras { seed: seed.as_ref().map(|s| (s.pool.as_str(), s.volume.as_str())), serial_log: boots.then_some(serial_log.as_str()) };
    let domain_xml = decorate(xml::domain(spec::virt_type(config), machine, extras)?)?;
    let mut created = Created::default();
    if let Err(e) = make(seed.as_ref(), &mut created) {
        created.remove();
        return Err(e);
    }
    libvirt::domain_define(&domain_xml).map_err(|e| {
        created.remove();
        e.context(format!("defining libvirt domain {name}"))
    })
}

/// The machine's disk volumes (the first on top of `backing`) and its seed.
fn create_volumes(machine: &Machine, backing: &str, seed: Option<&Seed>, created: &mut Created) -> Result<()> {
    for (i, disk) in machine.disks.iter().enumerate() {
        let volume = naming::volume_name(&machine.namespace, &machine.name, &disk.name);
        let backing = if i == 0 { Some(backing) } else { None };
        match libvirt::volume_create(&disk.target, &xml::volume(&volume, disk.size_gib, backing)?) {
            Ok(_) => {
                info!("created volume {volume} ({} GiB) in pool {}", disk.size_gib, disk.target);
                created.0.push((disk.target.clone(), volume));
            }
            // Left by an earlier attempt that did not get as far as the domain: reuse it.
            // (Listing only on failure keeps the usual path independent of the pool's size.)
            Err(e) => {
                // A listing that fails says nothing about this volume: report the create's error.
                let exists = libvirt::volume_list(&disk.target).is_ok_and(|l| l.iter().any(|v| v.name == volume));
                if !exists {
                    let what = match backing {
                        Some(path) => format!("creating volume {volume} in pool {} on backing file {path}", disk.target),
                        None => format!("creating volume {volume} in pool {}", disk.target),
                    };
                    return Err(e.context(what));
                }
                info!("reusing volume {volume} in pool {}", disk.target);
            }
        }
    }
    if let Some(seed) = seed {
        write_seed(seed, created)?;
    }
    Ok(())
}

/// Write the machine's NoCloud seed volume.
fn write_seed(seed: &Seed, created: &mut Created) -> Result<()> {
    // A seed left by an interrupted create may be half-written: always write it anew.
    ignore_not_found(libvirt::volume_delete(&seed.pool, &seed.volume))?;
    libvirt::volume_create(&seed.pool, &xml::raw_volume(&seed.volume, seed.image.len() as u64)?)
        .map_err(|e| e.context(format!("creating the NoCloud seed volume {} in pool {}", seed.volume, seed.pool)))?;
    created.0.push((seed.pool.clone(), seed.volume.clone()));
    libvirt::volume_upload(&seed.pool, &seed.volume, &seed.image)
        .map_err(|e| e.context(format!("uploading the NoCloud seed to volume {} in pool {}", seed.volume, seed.pool)))?;
    info!("wrote the NoCloud seed {} ({} bytes) in pool {}", seed.volume, seed.image.len(), seed.pool);
    Ok(())
}

/// The domain's IP addresses: from the DHCP leases of its networks, else from a
/// guest agent. A domain that is off has none.
fn addresses(domain: &DomainInfo, virt_type: &str) -> Vec<libvirt::InterfaceAddresses> {
    if !spec::is_active(domain.state) {
        return vec![];
    }
    match libvirt::domain_addresses(&domain.name, libvirt::AddressSource::Lease) {
        Ok(found) if found.iter().any(|i| !i.addresses.is_empty()) => return found,
        Ok(_) => {}
        Err(e) => warn!("reading the DHCP leases of libvirt domain {}: {e}", domain.name),
    }
    if virt_type == "test" {
        return vec![];
    }
    // Most guests run no agent: its absence is the normal case, not worth a warning.
    libvirt::domain_addresses(&domain.name, libvirt::AddressSource::Agent).unwrap_or_default()
}

impl Driver for Libvirt {
    const FEATURES: &'static [&'static str] =
        &[banlieue_sdk::provider::SNAPSHOTS, banlieue_sdk::provider::DISK_EXPORT, banlieue_sdk::provider::DISK_IMPORT, banlieue_sdk::provider::ADOPT, banlieue_sdk::provider::CONSOLE, banlieue_sdk::provider::VNC];

    fn probe(config: &ProviderConfig) -> Result<Inventory> {
        let node = libvirt::node_info()?;
        let pools = libvirt::pool_list()?;
        let networks = libvirt::network_list()?;
        Ok(spec::inventory(config, &node, &pools, &networks))
    }

    fn create(config: &ProviderConfig, machine: &Machine) -> Result<MachineStatus> {
        naming::check_machine(&machine.namespace, &machine.name)?;
        naming::check_uuid(&machine.uid)?;
        let name = naming::domain_name(&machine.namespace, &machine.name);
        if let Some(existing) = find(&name)? {
            check_owner(&name, &existing, machine)?;
            if let Some(restore) = xml::restore_marker(&libvirt::domain_xml(&name)?) {
                return Err(Error::Unavailable(format!(
                    "libvirt domain {name} is being restored from snapshot {} of machine {}: snapshot-clone finishes it",
                    restore.snapshot, restore.source
                )));
            }
            return realise(config, &name, &existing, machine);
        }
        // (A UID already used by a domain of another name is refused by libvirt's define.)

        let pools = libvirt::pool_list()?;
        let networks = libvirt::network_list()?;
        let backing = spec::validate(machine, &pools, &networks)?;
        let defined = define(config, machine, &pools, Ok, |seed, created| create_volumes(machine, backing, seed, created))?;
        info!("defined libvirt domain {name} ({})", defined.uuid);
        ensure_power(&name, defined.state, machine.power_state, &CREATE_POWER_OFF)?;
        describe_domain(config, &name)
    }

    fn describe(config: &ProviderConfig, machine: &MachineRef) -> Result<MachineStatus> {
        let domain = lookup(machine)?;
        describe_domain(config, &domain.name)
    }

    fn console(_config: &ProviderConfig, machine: &MachineRef, kind: ConsoleKind) -> Result<ConsoleAccess> {
        let domain = lookup(machine)?;
        if !matches!(domain.state, DomainState::Running | DomainState::Blocked) {
            return Err(Error::InvalidSpec(format!("libvirt domain {} is not running ({:?}): its console opens while it runs", domain.name, domain.state)));
        }
        let xml = libvirt::domain_xml(&domain.name)?;
        let (has, what) = match kind {
            ConsoleKind::Serial => (xml::has_serial_console(&xml), "serial console"),
            ConsoleKind::Vnc => (xml::has_vnc_display(&xml), "VNC display"),
        };
        if !has {
            return Err(Error::InvalidSpec(format!("libvirt domain {} has no {what} configured", domain.name)));
        }
        Ok(ConsoleAccess::LibvirtDomain(domain.name))
    }

    fn set_power(config: &ProviderConfig, machine: &MachineRef, state: PowerState, off: &PowerOff) -> Result<MachineStatus> {
        if state == PowerState::Suspended {
            return Err(Error::InvalidSpec("the libvirt driver does not suspend VMs".into()));
        }
        let domain = lookup(machine)?;
        ensure_power(&domain.name, domain.state, state, off)?;
        describe_domain(config, &domain.name)
    }

    fn delete(_config: &ProviderConfig, machine: &MachineRef, off: &PowerOff) -> Result<()> {
        if let Some(id) = adopt::backend_id(machine) {
            return adopt::delete(machine, id, off);
        }
        naming::check_machine(&machine.namespace, &machine.name)?;
        let name = naming::domain_name(&machine.namespace, &machine.name);
        if let Some(domain) = find(&name)? {
            if !machine.uid.is_empty() && !naming::same_uuid(&domain.uuid, &machine.uid) {
                warn!(
                    "not deleting libvirt domain {name}: it belongs to another machine (uuid {}, not {})",
                    domain.uuid, machine.uid
                );
                return Ok(());
            }
            if spec::is_active(domain.state) {
                ignore_not_found(power_off(&mut Domain(&name), off))
                    .map_err(|e| e.context(format!("powering off libvirt domain {name}")))?;
            }
            ignore_not_found(libvirt::domain_undefine(&name))
                .map_err(|e| e.context(format!("undefining libvirt domain {name}")))?;
            info!("undefined libvirt domain {name}");
        }
        let prefix = naming::volume_prefix(&machine.namespace, &machine.name);
        for pool in libvirt::pool_list()?.into_iter().filter(|p| p.active) {
            let volumes = match libvirt::volume_list(&pool.name) {
                Err(Error::NotFound(_)) => continue,
                other => other?,
            };
            for volume in volumes.into_iter().filter(|v| v.name.starts_with(&prefix)) {
                ignore_not_found(libvirt::volume_delete(&pool.name, &volume.name))
                    .map_err(|e| e.context(format!("deleting volume {} in pool {}", volume.name, pool.name)))?;
                info!("deleted volume {} in pool {}", volume.name, pool.name);
            }
        }
        Ok(())
    }

    fn snapshot_create(_config: &ProviderConfig, machine: &MachineRef, request: &SnapshotRequest) -> Result<Snapshot> {
        let domain = lookup(machine)?;
        // A retry after the host lost the answer: the name carries the VMSnapshot's UID.
        if let Some(taken) = list_snapshots(&domain.name)?.into_iter().find(|s| s.name == request.name) {
            return Ok(taken);
        }
        let hw = xml::hardware(&libvirt::domain_xml(&domain.name)?);
        let request_xml = snapshot::request_xml(request, &hw.disks, spec::is_active(domain.state))?;
        let taken = libvirt::snapshot_create(&domain.name, &request_xml)
            .map_err(|e| e.context(format!("taking snapshot {} of libvirt domain {}", request.name, domain.name)))?;
        info!("took snapshot {} of libvirt domain {}", taken.name, domain.name);
        Ok(snapshot::parse(&taken.name, taken.current, &taken.xml))
    }

    fn snapshot_list(_config: &ProviderConfig, machine: &MachineRef) -> Result<Vec<Snapshot>> {
        list_snapshots(&lookup(machine)?.name)
    }

    fn snapshot_revert(_config: &ProviderConfig, machine: &MachineRef, id: &str) -> Result<()> {
        let domain = lookup(machine)?;
        libvirt::snapshot_revert(&domain.name, id).map_err(|e| e.context(format!("reverting libvirt domain {} to snapshot {id}", domain.name)))?;
        info!("reverted libvirt domain {} to snapshot {id}", domain.name);
        Ok(())
    }

    fn snapshot_clone(config: &ProviderConfig, machine: &Machine, source: &MachineRef, snapshot_id: &str, linked: bool) -> Result<MachineStatus> {
        clone::snapshot_clone(config, machine, source, snapshot_id, linked)
    }

    fn snapshot_delete(_config: &ProviderConfig, machine: &MachineRef, id: &str) -> Result<()> {
        // No domain, no snapshot: internal snapshots live in its volumes.
        let domain = match lookup(machine) {
            Err(Error::NotFound(_)) => return Ok(()),
            other => other?,
        };
        ignore_not_found(libvirt::snapshot_delete(&domain.name, id))
            .map_err(|e| e.context(format!("deleting snapshot {id} of libvirt domain {}", domain.name)))?;
        info!("deleted snapshot {id} of libvirt domain {}", domain.name);
        Ok(())
    }

    fn disk_export(_config: &ProviderConfig, machine: &MachineRef) -> Result<()> {
        carry::export(machine)
    }

    fn list_machines(config: &ProviderConfig, page: Option<&str>) -> Result<banlieue_sdk::provider::MachinePage> {
        adopt::list(config, page)
    }

    fn adopt(config: &ProviderConfig, machine: &MachineRef, mark: &banlieue_sdk::provider::OwnerMark) -> Result<banlieue_sdk::provider::FoundMachine> {
        adopt::adopt(config, machine, mark)
    }

    fn reconfigure(config: &ProviderConfig, machine: &MachineRef, want: &banlieue_sdk::provider::HardwareTarget) -> Result<MachineStatus> {
        let id = adopt::backend_id(machine)
            .ok_or_else(|| Error::InvalidSpec(format!("machine {}/{} was not adopted: its hardware follows its class through create", machine.namespace, machine.name)))?;
        adopt::reconfigure(config, machine, id, want)
    }

    fn release(_config: &ProviderConfig, machine: &MachineRef, mark: &banlieue_sdk::provider::OwnerMark) -> Result<()> {
        adopt::release(machine, mark)
    }

    fn disk_import(config: &ProviderConfig, machine: &Machine) -> Result<MachineStatus> {
        carry::import(config, machine)
    }

    fn import_image(_config: &ProviderConfig, request: &ImageRequest) -> Result<ImageStatus> {
        let pool = request.target.as_deref().filter(|t| !t.is_empty()).ok_or_else(|| {
            Error::InvalidSpec(format!("image {}: no storage pool to import into (map a storage class to a pool)", request.name))
        })?;
        let image = transfer::image()?;
        let volume = naming::image_volume_name(&request.name, &image.digest)?;
        // A volume left by an earlier try may hold part of the image: start again.
        let existing = libvirt::volume_list(pool)?;
        if existing.iter().any(|v| v.name == volume) {
            ignore_not_found(libvirt::volume_delete(pool, &volume))?;
        }
        let created = libvirt::volume_create(pool, &xml::image_volume(&volume, image.size)?)
            .map_err(|e| e.context(format!("creating volume {volume} in pool {pool}")))?;
        let sent = match transfer::to_libvirt_volume(pool, &volume) {
            Ok(sent) => sent,
            Err(e) => {
                // Nothing partial is left behind.
                let _ = libvirt::volume_delete(pool, &volume);
                return Err(e);
            }
        };
        info!("imported image {} ({}, {sent} bytes) into {pool}/{volume}", request.name, image.format);
        Ok(ImageStatus {
            phase: ImagePhase::Ready,
            reference: Some(created.path),
            message: Some(format!("{} bytes of {} ({}) in volume {volume} of pool {pool}", sent, image.format, image.digest)),
        })
    }

    fn delete_image(_config: &ProviderConfig, request: &ImageRequest, reference: &str) -> Result<()> {
        // Only a volume this driver imported (its name says so), found by the path it reported
        // (every one of the image's, for an empty reference).
        let prefix = naming::image_volume_prefix(&request.name)?;
        for pool in libvirt::pool_list()?.into_iter().filter(|p| p.active) {
            let volumes = match libvirt::volume_list(&pool.name) {
                Err(Error::NotFound(_)) => continue,
                other => other?,
            };
            for volume in volumes.into_iter().filter(|v| v.name.starts_with(&prefix) && (reference.is_empty() || v.path == reference)) {
                ignore_not_found(libvirt::volume_delete(&pool.name, &volume.name))
                    .map_err(|e| e.context(format!("deleting image volume {} in pool {}", volume.name, pool.name)))?;
                info!("deleted image volume {} in pool {}", volume.name, pool.name);
            }
        }
        Ok(())
    }
}

banlieue_sdk::export_provider!(Libvirt);
