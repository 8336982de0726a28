//! `snapshot-clone` on libvirt: a new machine made of another machine's internal snapshot.
//!
//! Internal snapshots live inside the source's qcow2 volumes, so the new machine gets copies
//! of them, and the snapshot's record, then reverts to it:
//!
//! 1. each disk volume of the source (as the snapshot's domain definition names them, the
//!    NoCloud seed left out) is copied with `volume-clone` into the volume the new machine's
//!    disk of that position is called ([`naming::volume_name`]), in the source volume's pool
//!    (libvirt copies within a pool); further declared disks are made empty, and the seed is
//!    the new machine's own (its user-data, its UID as instance ID);
//! 2. the domain is defined as `create` defines it (its UUID the machine's UID, its NICs and
//!    seed), on those volumes, with a restore mark in its metadata ([`xml::Restore`]);
//! 3. `snapshot-redefine` records the snapshot on it, embedding the new domain's own definition
//!    ([`snapshot::redefine_xml`]: libvirt requires its UUID, and reverts the disks it names);
//! 4. `snapshot-revert` brings its disks to the snapshot, `snapshot-delete` removes the
//!    snapshot again (a restored machine starts with none), the mark is taken off by defining
//!    the domain without it;
//! 5. then, as for any machine: disks grown to their declared sizes, the power state.
//!
//! A retry finds the domain by name and UUID: marked, it goes on from step 3; unmarked, it is
//! the machine, brought to its hardware and power state as `create` does. Without a domain,
//! the copy is redone (a volume left by an attempt cut off may be half-written); a failure
//! before the domain exists removes the volumes it made. A linked clone cannot be had:
//! another domain's volumes cannot share an internal snapshot, so the disks are always copied.

use banlieue_sdk::provider::libvirt::{self, SnapshotInfo, VolumeInfo};
use banlieue_sdk::provider::{Machine, MachineRef, MachineStatus, ProviderConfig, ignore_not_found};
use banlieue_sdk::{Error, Result, info, warn};

use crate::xml::{self, DomainDisk, Restore};
use crate::{CREATE_POWER_OFF, Created, Seed, apply_hardware, check_owner, describe_domain, ensure_power, find, lookup, naming, realise, snapshot, spec, write_seed};

/// Make `machine` as a copy of machine `source` at its snapshot `id`, or finish or return the
/// one already made (found by name and UID).
pub fn snapshot_clone(config: &ProviderConfig, machine: &Machine, source: &MachineRef, id: &str, linked: bool) -> Result<MachineStatus> {
    naming::check_machine(&machine.namespace, &machine.name)?;
    naming::check_uuid(&machine.uid)?;
    if naming::same_uuid(&machine.uid, &source.uid) {
        return Err(Error::InvalidSpec(format!("machine {} cannot be restored into itself: snapshot-clone makes a new machine", machine.uid)));
    }
    let name = naming::domain_name(&machine.namespace, &machine.name);
    if let Some(existing) = find(&name)? {
        check_owner(&name, &existing, machine)?;
        return match xml::restore_marker(&libvirt::domain_xml(&name)?) {
            Some(restore) => {
                info!("finishing the restore of snapshot {} into libvirt domain {name}", restore.snapshot);
                // Once recorded on the new domain, the snapshot no longer needs its source.
                let recorded = libvirt::snapshot_list(&name)?.into_iter().find(|s| s.name == restore.snapshot);
                let taken = match recorded {
                    Some(s) => s,
                    None => source_snapshot(&lookup(source)?.name, &restore.snapshot)?,
                };
                finish(config, &name, machine, &taken)
            }
            None => realise(config, &name, &existing, machine),
        };
    }
    if linked {
        info!("libvirt keeps snapshot {id} inside the volumes of machine {}: a linked clone cannot share it, so the disks are copied in full", source.name);
    }
    let source_domain = lookup(source)?;
    let taken = source_snapshot(&source_domain.name, id)?;
    let at_snapshot = snapshot::embedded_domain(&taken.xml)
        .ok_or_else(|| Error::Internal(format!("snapshot {id} of libvirt domain {} embeds no domain definition", source_domain.name)))?;
    let source_disks: Vec<DomainDisk> = xml::hardware(at_snapshot).disks.into_iter().filter(|d| !d.readonly).collect();

    let pools = libvirt::pool_list()?;
    let networks = libvirt::network_list()?;
    spec::validate_hardware(machine, &pools, &networks)?;
    let mut volumes = Vec::new();
    for pool in source_disks.iter().map(|d| d.pool.as_str()).filter(|p| !p.is_empty()).collect::<std::collections::BTreeSet<_>>() {
        volumes.extend(libvirt::volume_list(pool)?.into_iter().map(|v| (pool.to_string(), v)));
    }
    let plan = plan(machine, &source_domain.name, &source_disks, &volumes)?;
    // The new machine's disks where the copies go: a copy stays in its source's pool.
    let mut restored = machine.clone();
    for (disk, copy) in restored.disks.iter_mut().zip(&plan) {
        if disk.target != copy.pool {
            info!("disk {} of {name} is copied within pool {} (its snapshot's), not into pool {}", disk.name, copy.pool, disk.target);
            disk.target = copy.pool.clone();
        }
    }
    let restore = Restore { source: source.uid.clone(), snapshot: id.to_string() };
    let defined = crate::define(config, &restored, &pools, |xml| xml::with_restore_marker(&xml, &restore), |seed, created| {
        make_volumes(&restored, &plan, seed, created)
    })?;
    info!("defined libvirt domain {name} ({}) on copies of the volumes of {} for snapshot {id}", defined.uuid, source_domain.name);
    finish(config, &name, &restored, &taken)
}

/// The source domain's snapshot `id`; `not-found` when it has none of that name.
fn source_snapshot(domain: &str, id: &str) -> Result<SnapshotInfo> {
    libvirt::snapshot_list(domain)?
        .into_iter()
        .find(|s| s.name == id)
        .ok_or_else(|| Error::NotFound(format!("libvirt domain {domain} has no snapshot {id}")))
}

/// One disk of the new machine that is a copy of one of the source's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeCopy {
    /// The pool both volumes are in (libvirt copies a volume within its pool).
    pub pool: String,
    /// The source's volume.
    pub from: String,
    /// The new machine's volume.
    pub to: String,
    /// The source volume's capacity, the copy's.
    pub capacity_bytes: u64,
}

/// Which source volume each of the machine's disks is a copy of, by position (the boot disk
/// first): refused when the machine declares fewer disks than the snapshot has, or one smaller
/// than its copy (a disk is never shrunk); `not-found` when a volume of the snapshot is gone.
pub fn plan(machine: &Machine, source: &str, source_disks: &[DomainDisk], volumes: &[(String, VolumeInfo)]) -> Result<Vec<VolumeCopy>> {
    if source_disks.is_empty() {
        return Err(Error::InvalidSpec(format!("snapshot of libvirt domain {source} holds no disk to restore")));
    }
    if machine.disks.len() < source_disks.len() {
        return Err(Error::InvalidSpec(format!(
            "the snapshot of libvirt domain {source} holds {} disks; machine {}/{} declares {}: declare at least as many",
            source_disks.len(),
            machine.namespace,
            machine.name,
            machine.disks.len()
        )));
    }
    let mut copies = Vec::new();
    for (disk, from) in machine.disks.iter().zip(source_disks) {
        if from.pool.is_empty() {
            return Err(Error::InvalidSpec(format!("disk {} of libvirt domain {source} is not a storage pool volume ({})", from.dev, from.volume)));
        }
        let volume = volumes
            .iter()
            .find(|(pool, v)| *pool == from.pool && v.name == from.volume)
            .map(|(_, v)| v)
            .ok_or_else(|| Error::NotFound(format!("volume {} (disk {} of libvirt domain {source} at the snapshot) is not in pool {}", from.volume, from.dev, from.pool)))?;
        if disk.size_gib << 30 < volume.capacity_bytes {
            return Err(Error::InvalidSpec(format!(
                "disk {} is a copy of volume {} of {} GiB; {} GiB are declared and a disk is never shrunk: declare at least {} GiB",
                disk.name,
                from.volume,
                volume.capacity_bytes.div_ceil(1 << 30),
                disk.size_gib,
                volume.capacity_bytes.div_ceil(1 << 30)
            )));
        }
        copies.push(VolumeCopy {
            pool: from.pool.clone(),
            from: from.volume.clone(),
            to: naming::volume_name(&machine.namespace, &machine.name, &disk.name),
            capacity_bytes: volume.capacity_bytes,
        });
    }
    Ok(copies)
}

/// The copies, the further (empty) disks and the seed.
fn make_volumes(machine: &Machine, plan: &[VolumeCopy], seed: Option<&Seed>, created: &mut Created) -> Result<()> {
    for copy in plan {
        // No domain yet: whatever is there was left by an attempt cut off, maybe half-copied.
        let stale = libvirt::volume_list(&copy.pool)?.iter().any(|v| v.name == copy.to);
        if stale {
            warn!("deleting volume {} in pool {}, left by a restore that did not finish: it is copied again", copy.to, copy.pool);
            ignore_not_found(libvirt::volume_delete(&copy.pool, &copy.to))?;
        }
        libvirt::volume_clone(&copy.pool, &copy.from, &xml::cloned_volume(&copy.to, copy.capacity_bytes)?)
            .map_err(|e| e.context(format!("copying volume {} to {} in pool {}", copy.from, copy.to, copy.pool)))?;
        info!("copied volume {} to {} in pool {}", copy.from, copy.to, copy.pool);
        created.0.push((copy.pool.clone(), copy.to.clone()));
    }
    for disk in machine.disks.iter().skip(plan.len()) {
        let volume = naming::volume_name(&machine.namespace, &machine.name, &disk.name);
        if libvirt::volume_list(&disk.target)?.iter().any(|v| v.name == volume) {
            ignore_not_found(libvirt::volume_delete(&disk.target, &volume))?;
        }
        libvirt::volume_create(&disk.target, &xml::volume(&volume, disk.size_gib, None)?)
            .map_err(|e| e.context(format!("creating volume {volume} in pool {}", disk.target)))?;
        info!("created volume {volume} ({} GiB) in pool {}", disk.size_gib, disk.target);
        created.0.push((disk.target.clone(), volume));
    }
    if let Some(seed) = seed {
        write_seed(seed, created)?;
    }
    Ok(())
}

/// Steps 3 to 5 on the marked domain `name`: record the snapshot, revert to it, delete it,
/// unmark; then hardware and power as for any machine.
fn finish(config: &ProviderConfig, name: &str, machine: &Machine, taken: &SnapshotInfo) -> Result<MachineStatus> {
    let id = taken.name.as_str();
    let domain_xml = libvirt::domain_xml(name)?;
    if !libvirt::snapshot_list(name)?.iter().any(|s| s.name == id) {
        // The seed and further disks hold no internal snapshot: only the copies are reverted.
        let copies: Vec<String> = snapshot::embedded_domain(&taken.xml)
            .map(|d| xml::hardware(d).disks.into_iter().filter(|d| !d.readonly).count())
            .map(|n| machine.disks.iter().take(n).map(|d| naming::volume_name(&machine.namespace, &machine.name, &d.name)).collect())
            .unwrap_or_default();
        let disks: Vec<(String, bool)> = xml::hardware(&domain_xml).disks.into_iter().map(|d| (d.dev, copies.contains(&d.volume))).collect();
        // A revert makes the embedded definition the domain's: the mark stays on until taken off below.
        let redefine = snapshot::redefine_xml(id, &taken.xml, &domain_xml, &disks)?;
        libvirt::snapshot_redefine(name, &redefine).map_err(|e| e.context(format!("recording snapshot {id} on libvirt domain {name}")))?;
        info!("recorded snapshot {id} on libvirt domain {name}");
    }
    if let Err(e) = libvirt::snapshot_revert(name, id) {
        if lost_internal_snapshot(&e) {
            return Err(undo(name, machine, e));
        }
        return Err(e.context(format!("reverting libvirt domain {name} to snapshot {id}")));
    }
    info!("reverted libvirt domain {name} to snapshot {id}");
    // The machine starts with no snapshot: the record goes, and the copies' internal snapshot with it.
    ignore_not_found(libvirt::snapshot_delete(name, id)).map_err(|e| e.context(format!("deleting snapshot {id} of libvirt domain {name}")))?;
    libvirt::domain_define(&xml::without_restore_marker(&libvirt::domain_xml(name)?)).map_err(|e| e.context(format!("unmarking libvirt domain {name}")))?;
    info!("restored snapshot {id} into libvirt domain {name}");
    let state = libvirt::domain_get_state(name)?;
    if !spec::is_active(state) {
        apply_hardware(name, machine)?;
    }
    ensure_power(name, state, machine.power_state, &CREATE_POWER_OFF)?;
    describe_domain(config, name)
}

/// Whether a revert failed because the copied volumes do not hold the snapshot: libvirt's
/// `virStorageVolCreateXMLFrom` copies a qcow2 with `qemu-img convert`, which leaves internal
/// snapshots behind, and the revert's `qemu-img snapshot -a` then finds none.
pub fn lost_internal_snapshot(e: &Error) -> bool {
    let m = e.message();
    m.contains("Could not apply snapshot") || m.contains("Failed to load snapshot")
}

/// Remove the domain and volumes of a restore that can never work on this host; the error to
/// report.
fn undo(name: &str, machine: &Machine, cause: Error) -> Error {
    warn!("removing libvirt domain {name} and its volumes: the copies of the source's volumes lost its internal snapshots ({})", cause.message());
    // The host's undefine drops the snapshot's record too.
    let undefined = ignore_not_found(libvirt::domain_undefine(name));
    let prefix = naming::volume_prefix(&machine.namespace, &machine.name);
    let mut left = Vec::new();
    if undefined.is_ok() {
        for pool in libvirt::pool_list().unwrap_or_default().into_iter().filter(|p| p.active) {
            for v in libvirt::volume_list(&pool.name).unwrap_or_default().into_iter().filter(|v| v.name.starts_with(&prefix)) {
                if ignore_not_found(libvirt::volume_delete(&pool.name, &v.name)).is_err() {
                    left.push(v.name);
                }
            }
        }
    }
    if undefined.is_err() || !left.is_empty() {
        warn!("could not remove all of libvirt domain {name}: a delete of the machine removes the rest");
    }
    Error::Internal(format!(
        "the libvirt host's volume copy (virStorageVolCreateXMLFrom: qemu-img convert) does not carry qcow2 internal snapshots, so the copies cannot be reverted to the snapshot: {}",
        cause.message()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_sdk::provider::Disk;

    fn machine(sizes: &[u64]) -> Machine {
        let mut m = crate::xml::tests::machine();
        m.name = "new".into();
        m.disks = sizes.iter().enumerate().map(|(i, s)| Disk { name: ["root", "data", "more"][i].into(), size_gib: *s, target: "default-pool".into() }).collect();
        m
    }

    fn disk(dev: &str, pool: &str, volume: &str, readonly: bool) -> DomainDisk {
        DomainDisk { dev: dev.into(), pool: pool.into(), volume: volume.into(), readonly }
    }

    fn volumes() -> Vec<(String, VolumeInfo)> {
        [("p", "ns_src_root.qcow2", 10u64 << 30), ("q", "ns_src_data.qcow2", 1 << 30)]
            .into_iter()
            .map(|(pool, name, capacity_bytes)| (pool.to_string(), VolumeInfo { name: name.into(), path: format!("/{pool}/{name}"), capacity_bytes }))
            .collect()
    }

    #[test]
    fn each_disk_is_a_copy_of_the_snapshots_disk_in_its_position_within_its_pool() {
        let source = [disk("vda", "p", "ns_src_root.qcow2", false), disk("vdb", "q", "ns_src_data.qcow2", false)];
        let copies = plan(&machine(&[10, 2, 5]), "ns_src", &source, &volumes()).unwrap();
        assert_eq!(
            copies,
            [
                VolumeCopy { pool: "p".into(), from: "ns_src_root.qcow2".into(), to: "ns_new_root.qcow2".into(), capacity_bytes: 10 << 30 },
                VolumeCopy { pool: "q".into(), from: "ns_src_data.qcow2".into(), to: "ns_new_data.qcow2".into(), capacity_bytes: 1 << 30 },
            ]
        );
    }

    #[test]
    fn fewer_or_smaller_disks_than_the_snapshot_and_gone_volumes_are_refused() {
        let source = [disk("vda", "p", "ns_src_root.qcow2", false), disk("vdb", "q", "ns_src_data.qcow2", false)];
        let e = plan(&machine(&[10]), "ns_src", &source, &volumes()).unwrap_err();
        assert!(matches!(&e, Error::InvalidSpec(m) if m.contains("holds 2 disks")), "{e:?}");
        let e = plan(&machine(&[9, 1]), "ns_src", &source, &volumes()).unwrap_err();
        assert!(matches!(&e, Error::InvalidSpec(m) if m.contains("never shrunk") && m.contains("at least 10 GiB")), "{e:?}");
        let e = plan(&machine(&[10, 1]), "ns_src", &[disk("vda", "p", "gone.qcow2", false)], &volumes()).unwrap_err();
        assert!(matches!(&e, Error::NotFound(m) if m.contains("gone.qcow2")), "{e:?}");
        let e = plan(&machine(&[10]), "ns_src", &[disk("vda", "", "/var/lib/x.qcow2", false)], &volumes()).unwrap_err();
        assert!(matches!(&e, Error::InvalidSpec(m) if m.contains("not a storage pool volume")), "{e:?}");
        assert!(plan(&machine(&[10]), "ns_src", &[], &volumes()).is_err());
    }

    #[test]
    fn a_revert_that_finds_no_internal_snapshot_is_told_apart() {
        // libvirt 9.0's answer when the copies have no snapshot (qemu:///session, dir pool).
        let lost = Error::Internal("internal error: Child process (/usr/bin/qemu-img snapshot -a s1 /tmp/lvs/pool/new_root.qcow2) unexpected exit status 1: qemu-img: Could not apply snapshot 's1': Failed to load snapshot: No such file or directory".into());
        assert!(lost_internal_snapshot(&lost));
        assert!(!lost_internal_snapshot(&Error::NotFound("Domain snapshot not found: no domain snapshot with matching name 's1'".into())));
    }
}
