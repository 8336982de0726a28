//! Carrying a machine's disks to and from another backend (a move that keeps the VM's data).
//!
//! - `disk-export`: each disk volume of the shut-off domain (the NoCloud seed left out: the
//!   new machine gets its own) goes to the host under the machine's name for the disk (its
//!   volume's name without the machine's prefix), boot disk first. The host flattens a volume
//!   on a backing file (the boot disk over its image) before it streams it, so the copy stands
//!   alone.
//! - `disk-import`: the carried disks (qcow2, as the ProviderClass's `imageFormat` asks the
//!   host for) become the machine's volumes by position — a qcow2 volume of the disk's virtual
//!   size, then overwritten by the carried file; further declared disks are made empty, the seed
//!   is the machine's own — and the domain is defined on them as `create` defines it, left
//!   shut off. The domain is defined last: a retry that finds it has nothing left to do; one
//!   that does not makes every volume again (an attempt cut off may have left one half-written).

use banlieue_sdk::provider::libvirt;
use banlieue_sdk::provider::{Machine, MachineRef, MachineStatus, ProviderConfig, ignore_not_found};
use banlieue_sdk::transfer::{self, CarriedDisk};
use banlieue_sdk::{Error, Result, info, warn};

use crate::xml;
use crate::{Created, Seed, check_owner, describe_domain, find, lookup, naming, spec, write_seed};

/// Hand the shut-off machine's disk volumes to the host, boot disk first.
pub fn export(machine: &MachineRef) -> Result<()> {
    let domain = lookup(machine)?;
    if spec::is_active(domain.state) {
        return Err(Error::InvalidSpec(format!("libvirt domain {} is running: its disks are exported once it is shut off", domain.name)));
    }
    let hw = xml::hardware(&libvirt::domain_xml(&domain.name)?);
    let prefix = naming::volume_prefix(&machine.namespace, &machine.name);
    let seed = naming::seed_volume_name(&machine.namespace, &machine.name);
    for d in hw.disks.iter().filter(|d| !d.readonly && d.volume != seed) {
        if d.pool.is_empty() {
            return Err(Error::InvalidSpec(format!("disk {} of libvirt domain {} is not a storage pool volume ({}): it cannot be exported", d.dev, domain.name, d.volume)));
        }
        let name = disk_name(&prefix, &d.volume).unwrap_or(&d.dev);
        let bytes = transfer::from_libvirt_volume(name, &d.pool, &d.volume)?;
        info!("exported disk {name} of libvirt domain {} ({}/{}, {bytes} bytes)", domain.name, d.pool, d.volume);
    }
    Ok(())
}

/// The machine's name for a disk from its volume's: `{prefix}{disk}.qcow2`.
fn disk_name<'a>(prefix: &str, volume: &'a str) -> Option<&'a str> {
    volume.strip_prefix(prefix)?.strip_suffix(".qcow2").filter(|d| !d.is_empty())
}

/// One of the machine's disks made from a carried one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Landing {
    pub carried: String,
    pub pool: String,
    pub volume: String,
    pub capacity_bytes: u64,
}

/// Which carried disk each of the machine's disks is made from, by position: refused when the
/// machine declares fewer disks than were carried, one smaller than what it carries (a disk is
/// never shrunk), or a carried disk is not qcow2.
pub fn plan(machine: &Machine, carried: &[CarriedDisk]) -> Result<Vec<Landing>> {
    if carried.is_empty() {
        return Err(Error::InvalidSpec(format!("no disks were carried for machine {}/{}", machine.namespace, machine.name)));
    }
    if machine.disks.len() < carried.len() {
        return Err(Error::InvalidSpec(format!(
            "{} disks were carried; machine {}/{} declares {}: declare at least as many",
            carried.len(),
            machine.namespace,
            machine.name,
            machine.disks.len()
        )));
    }
    let mut out = Vec::new();
    for (disk, from) in machine.disks.iter().zip(carried) {
        if from.format != "qcow2" {
            return Err(Error::InvalidSpec(format!("carried disk {} is {}; the libvirt driver takes qcow2 (set the ProviderClass's imageFormat to qcow2)", from.name, from.format)));
        }
        if disk.size_gib << 30 < from.virtual_size {
            let need = from.virtual_size.div_ceil(1 << 30);
            return Err(Error::InvalidSpec(format!(
                "carried disk {} holds {need} GiB; disk {} declares {} GiB and a disk is never shrunk: declare at least {need} GiB",
                from.name, disk.name, disk.size_gib
            )));
        }
        out.push(Landing {
            carried: from.name.clone(),
            pool: disk.target.clone(),
            volume: naming::volume_name(&machine.namespace, &machine.name, &disk.name),
            capacity_bytes: from.virtual_size,
        });
    }
    Ok(out)
}

/// Make `machine` from the carried disks, or return the one already made (found by name and UID).
pub fn import(config: &ProviderConfig, machine: &Machine) -> Result<MachineStatus> {
    naming::check_machine(&machine.namespace, &machine.name)?;
    naming::check_uuid(&machine.uid)?;
    let name = naming::domain_name(&machine.namespace, &machine.name);
    if let Some(existing) = find(&name)? {
        check_owner(&name, &existing, machine)?;
        return describe_domain(config, &name);
    }
    let carried = transfer::carried()?;
    let pools = libvirt::pool_list()?;
    let networks = libvirt::network_list()?;
    spec::validate_hardware(machine, &pools, &networks)?;
    let plan = plan(machine, &carried)?;
    let mut off = machine.clone();
    off.power_state = banlieue_sdk::provider::PowerState::PoweredOff;
    let defined = crate::define(config, &off, &pools, Ok, |seed, created| land(machine, &plan, seed, created))?;
    info!("defined libvirt domain {name} ({}) on {} carried disks", defined.uuid, plan.len());
    describe_domain(config, &name)
}

/// The carried volumes, the further (empty) disks and the seed.
fn land(machine: &Machine, plan: &[Landing], seed: Option<&Seed>, created: &mut Created) -> Result<()> {
    for l in plan {
        if libvirt::volume_list(&l.pool)?.iter().any(|v| v.name == l.volume) {
            warn!("deleting volume {} in pool {}, left by an import that did not finish: it is written again", l.volume, l.pool);
            ignore_not_found(libvirt::volume_delete(&l.pool, &l.volume))?;
        }
        libvirt::volume_create(&l.pool, &xml::cloned_volume(&l.volume, l.capacity_bytes)?).map_err(|e| e.context(format!("creating volume {} in pool {}", l.volume, l.pool)))?;
        created.0.push((l.pool.clone(), l.volume.clone()));
        let sent = transfer::carried_to_libvirt_volume(&l.carried, &l.pool, &l.volume)?;
        info!("wrote carried disk {} into volume {} of pool {} ({sent} bytes)", l.carried, l.volume, l.pool);
    }
    for disk in machine.disks.iter().skip(plan.len()) {
        let volume = naming::volume_name(&machine.namespace, &machine.name, &disk.name);
        if libvirt::volume_list(&disk.target)?.iter().any(|v| v.name == volume) {
            ignore_not_found(libvirt::volume_delete(&disk.target, &volume))?;
        }
        libvirt::volume_create(&disk.target, &xml::volume(&volume, disk.size_gib, None)?).map_err(|e| e.context(format!("creating volume {volume} in pool {}", disk.target)))?;
        created.0.push((disk.target.clone(), volume));
    }
    if let Some(seed) = seed {
        write_seed(seed, created)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_sdk::provider::Disk;

    fn machine(sizes: &[u64]) -> Machine {
        let mut m = crate::xml::tests::machine();
        m.disks = sizes.iter().enumerate().map(|(i, s)| Disk { name: ["root", "data", "more"][i].into(), size_gib: *s, target: "p".into() }).collect();
        m
    }

    fn carried(name: &str, format: &str, gib: u64) -> CarriedDisk {
        CarriedDisk { name: name.into(), format: format.into(), size: 1 << 20, virtual_size: gib << 30 }
    }

    #[test]
    fn a_volume_names_its_disk_after_the_machines_prefix() {
        assert_eq!(disk_name("ns_web_", "ns_web_root.qcow2"), Some("root"));
        assert_eq!(disk_name("ns_web_", "ns_web_data-1.qcow2"), Some("data-1"));
        assert_eq!(disk_name("ns_web_", "image@x@abc"), None);
        assert_eq!(disk_name("ns_web_", "ns_web_.qcow2"), None);
    }

    #[test]
    fn each_declared_disk_lands_on_the_carried_disk_in_its_position() {
        let m = machine(&[10, 2, 5]);
        let plan = plan(&m, &[carried("root", "qcow2", 10), carried("data", "qcow2", 1)]).unwrap();
        assert_eq!(plan.iter().map(|l| (l.carried.as_str(), l.volume.as_str(), l.capacity_bytes)).collect::<Vec<_>>(), [
            ("root", "ns_vm_root.qcow2", 10 << 30),
            ("data", "ns_vm_data.qcow2", 1 << 30)
        ]);
    }

    #[test]
    fn fewer_or_smaller_disks_or_another_format_are_refused() {
        let e = plan(&machine(&[10]), &[carried("root", "qcow2", 10), carried("data", "qcow2", 1)]).unwrap_err();
        assert!(matches!(&e, Error::InvalidSpec(m) if m.contains("declare at least as many")), "{e:?}");
        let e = plan(&machine(&[9]), &[carried("root", "qcow2", 10)]).unwrap_err();
        assert!(matches!(&e, Error::InvalidSpec(m) if m.contains("never shrunk") && m.contains("at least 10 GiB")), "{e:?}");
        let e = plan(&machine(&[10]), &[carried("root", "vmdk", 10)]).unwrap_err();
        assert!(matches!(&e, Error::InvalidSpec(m) if m.contains("imageFormat")), "{e:?}");
        assert!(plan(&machine(&[10]), &[]).is_err());
    }
}
