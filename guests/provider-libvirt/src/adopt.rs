//! Domains banlieue did not make: discovery, adoption and letting go.
//!
//! - `list-machines`: every domain of the connection, sorted by UUID, a page at a time; its
//!   backend id is its UUID, its hardware and addresses as `describe` reads them, its owner
//!   the adoption mark or, for a domain the driver made, the machine its metadata names.
//! - `adopt`: the mark is a `<metadata>` element of its own namespace ([`xml::OWNER_NS`]) set
//!   with `virDomainSetMetadata` — in the persistent definition and, while the domain runs, the
//!   live one — so nothing else about the domain changes: not its name, UUID, devices or power.
//! - An adopted machine is found by its UUID (`machine-ref.backend-id`), and only while it carries
//!   its machine's mark ([`lookup`]): one let go of, or taken by another, is not found.
//! - `delete` of an adopted domain powers it off, undefines it and deletes the pool volumes its
//!   disks are (not its backing images, not disks that are plain files outside any pool, not
//!   read-only ones but the seed of a domain banlieue once made).

use banlieue_sdk::provider::libvirt::{self, DomainInfo};
use banlieue_sdk::provider::{
    Address, AddressType, FoundMachine, HardwareTarget, MachinePage, MachineRef, MachineStatus, OwnerMark, PowerOff, ProviderConfig, ignore_not_found, page_range, power_off,
};

use banlieue_sdk::{Error, Result, info, warn};

use crate::{Domain, addresses, naming, spec, volumes_of, xml};

/// Domains per page of `list-machines`.
const PAGE: usize = 100;

/// The backend id an adopted machine is found by, if the machine is one.
pub fn backend_id(machine: &MachineRef) -> Option<&str> {
    machine.backend_id.as_deref().filter(|id| !id.is_empty())
}

/// The domain of UUID `id`, if any.
fn by_uuid(id: &str) -> Result<Option<DomainInfo>> {
    Ok(libvirt::domain_list()?.into_iter().find(|d| naming::same_uuid(&d.uuid, id)))
}

/// The adopted machine's domain (`id` its UUID), or `not-found` unless it carries the machine's mark.
pub fn lookup(machine: &MachineRef, id: &str) -> Result<DomainInfo> {
    let domain = by_uuid(id)?.ok_or_else(|| Error::NotFound(format!("no libvirt domain has UUID {id}")))?;
    let owner = xml::owner(&libvirt::domain_xml(&domain.name)?);
    match owner {
        Some(o) if o.machine_uid == machine.uid => Ok(domain),
        Some(o) => Err(Error::NotFound(format!("libvirt domain {} ({id}) is machine {} ({})'s, not {}'s", domain.name, o.machine, o.machine_uid, machine.uid))),
        None => Err(Error::NotFound(format!("libvirt domain {} ({id}) carries no mark: it was let go of", domain.name))),
    }
}

/// One page of the connection's domains.
pub fn list(config: &ProviderConfig, page: Option<&str>) -> Result<MachinePage> {
    let mut domains = libvirt::domain_list()?;
    domains.sort_by(|a, b| a.uuid.cmp(&b.uuid));
    let (range, next) = page_range(page, domains.len(), PAGE)?;
    let mut machines = Vec::with_capacity(range.len());
    for d in &domains[range] {
        match found(config, d) {
            Ok(m) => machines.push(m),
            // Undefined between the listing and the look: not there any more.
            Err(Error::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(MachinePage { machines, next })
}

/// Domain `d` as discovery reports it.
fn found(config: &ProviderConfig, d: &DomainInfo) -> Result<FoundMachine> {
    let domain_xml = libvirt::domain_xml(&d.name)?;
    let hw = xml::hardware(&domain_xml);
    let hardware = spec::hardware(&d.name, &hw, &volumes_of(&hw)?);
    let status = spec::status(d, &domain_xml, &addresses(d, spec::virt_type(config)), None);
    Ok(FoundMachine {
        backend_id: d.uuid.to_ascii_lowercase(),
        name: d.name.clone(),
        power_state: status.power_state,
        hardware,
        addresses: status.addresses.into_iter().filter(|a: &Address| a.type_ == AddressType::InternalIp).collect(),
        failure_domain: spec::failure_domain_name(config).to_string(),
        tags: vec![],
        owner: xml::owner(&domain_xml),
        template: false,
    })
}

/// Stamp `mark` on the domain of UUID `machine.backend-id` unless it carries one; it as found.
pub fn adopt(config: &ProviderConfig, machine: &MachineRef, mark: &OwnerMark) -> Result<FoundMachine> {
    let id = backend_id(machine).ok_or_else(|| Error::InvalidSpec(format!("machine {}/{} names no libvirt domain UUID to adopt", machine.namespace, machine.name)))?;
    let domain = by_uuid(id)?.ok_or_else(|| Error::NotFound(format!("no libvirt domain has UUID {id}")))?;
    let now = found(config, &domain)?;
    if now.owner.is_some() {
        return Ok(now);
    }
    libvirt::domain_set_metadata(&domain.name, xml::OWNER_NS, xml::OWNER_KEY, Some(&xml::owner_mark(mark)?))
        .map_err(|e| e.context(format!("marking libvirt domain {} as machine {}'s", domain.name, mark.machine)))?;
    info!("adopted libvirt domain {} ({id}) as machine {} ({})", domain.name, mark.machine, mark.machine_uid);
    found(config, &domain)
}

/// Remove the machine's mark from its domain — an adopted one's owner mark, or the metadata
/// of one the driver made — and leave the domain as it is. Another's mark is left alone.
pub fn release(machine: &MachineRef, mark: &OwnerMark) -> Result<()> {
    let domain = match crate::lookup(machine) {
        Err(Error::NotFound(_)) => return Ok(()),
        other => other?,
    };
    let domain_xml = libvirt::domain_xml(&domain.name)?;
    match xml::owner(&domain_xml) {
        Some(o) if o.machine_uid == mark.machine_uid => {
            // An adopted domain's mark is its own element; a made one's, the driver's metadata.
            let adopted = xml::owner_marked(&domain_xml);
            let (uri, key) = if adopted { (xml::OWNER_NS, xml::OWNER_KEY) } else { (xml::METADATA_NS, "banlieue") };
            ignore_not_found(libvirt::domain_set_metadata(&domain.name, uri, key, None))?;
            info!("let go of libvirt domain {} ({}), machine {}", domain.name, domain.uuid, mark.machine);
        }
        Some(o) => warn!("not letting go of libvirt domain {}: it is machine {}'s, not {}'s", domain.name, o.machine, mark.machine),
        None => {}
    }
    Ok(())
}

/// Bring the adopted, shut-off domain to `want`: vCPUs and memory by redefining it, each
/// disk's pool volume grown (by the position `describe` reports disks in). Every disk is
/// checked before anything changes, so a shrink refused leaves the domain as it was.
pub fn reconfigure(config: &ProviderConfig, machine: &MachineRef, id: &str, want: &HardwareTarget) -> Result<MachineStatus> {
    let domain = lookup(machine, id)?;
    if spec::is_active(domain.state) {
        return Err(Error::InvalidSpec(format!("libvirt domain {} is not shut off: its hardware is changed only while it is", domain.name)));
    }
    let domain_xml = libvirt::domain_xml(&domain.name)?;
    let hw = xml::hardware(&domain_xml);
    let volumes = volumes_of(&hw)?;
    let mut grow = Vec::new();
    for (d, gib) in hw.disks.iter().filter(|d| !d.readonly).zip(&want.disk_sizes_gib) {
        let Some(have) = volumes.iter().find(|(pool, v)| *pool == d.pool && v.name == d.volume).map(|(_, v)| v.capacity_bytes) else {
            warn!("disk {} of libvirt domain {} is no pool volume: it is not grown", d.dev, domain.name);
            continue;
        };
        if *gib < have >> 30 {
            return Err(Error::InvalidSpec(format!("disk {} ({}) of libvirt domain {} holds {} GiB; it is never shrunk to {gib} GiB", d.dev, d.volume, domain.name, have >> 30)));
        }
        if gib << 30 > have {
            grow.push((d, gib << 30));
        }
    }
    if hw.cpus != want.cpus || hw.memory_mib != want.memory_mib {
        info!("redefining adopted libvirt domain {}: {} vCPUs, {} MiB (was {}, {})", domain.name, want.cpus, want.memory_mib, hw.cpus, hw.memory_mib);
        libvirt::domain_define(&xml::with_cpus_and_memory(&domain_xml, want.cpus, want.memory_mib)?)?;
    }
    for (d, bytes) in grow {
        info!("growing volume {} in pool {} of adopted libvirt domain {} to {} GiB", d.volume, d.pool, domain.name, bytes >> 30);
        libvirt::volume_resize(&d.pool, &d.volume, bytes)?;
    }
    crate::describe_domain(config, &domain.name)
}

/// Power the adopted domain off per `off`, undefine it, delete the pool volumes its disks are.
pub fn delete(machine: &MachineRef, id: &str, off: &PowerOff) -> Result<()> {
    let domain = match lookup(machine, id) {
        Err(Error::NotFound(_)) => return Ok(()),
        other => other?,
    };
    let hw = xml::hardware(&libvirt::domain_xml(&domain.name)?);
    if spec::is_active(domain.state) {
        ignore_not_found(power_off(&mut Domain(&domain.name), off)).map_err(|e| e.context(format!("powering off libvirt domain {}", domain.name)))?;
    }
    ignore_not_found(libvirt::domain_undefine(&domain.name)).map_err(|e| e.context(format!("undefining libvirt domain {}", domain.name)))?;
    info!("undefined adopted libvirt domain {} ({id})", domain.name);
    // Read-only disks (an installer ISO a pool shares) stay, but for a seed banlieue made for
    // the domain when it made it (named after the domain).
    let seed_prefix = format!("{}_", domain.name);
    for d in hw.disks.iter().filter(|d| !d.pool.is_empty() && (!d.readonly || d.volume.starts_with(&seed_prefix))) {
        ignore_not_found(libvirt::volume_delete(&d.pool, &d.volume)).map_err(|e| e.context(format!("deleting volume {} in pool {}", d.volume, d.pool)))?;
        info!("deleted volume {} in pool {}", d.volume, d.pool);
    }
    Ok(())
}
