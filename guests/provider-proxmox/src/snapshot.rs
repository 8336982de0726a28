//! Snapshots of a machine's VM (contract 0.6.0) through PVE's
//! `/nodes/{node}/qemu/{vmid}/snapshot` API, on the VM found by its UID as
//! every other call finds it.
//!
//! - A snapshot's id is its name: PVE names snapshots and knows no other id.
//!   A create finds an existing snapshot by name and takes none (a retry after
//!   a lost answer).
//! - The list is PVE's minus its `current` pseudo-entry ("You are here!"),
//!   whose `parent` is the snapshot the VM's present state descends from.
//! - Memory (`vmstate=1`) needs a running VM. PVE quiesces through the QEMU
//!   guest agent by itself when the VM's config enables it and the agent
//!   answers (it freezes the file systems around a snapshot without memory), so
//!   `quiesce` is a check that both hold, not a parameter.
//! - Rollback and removal of an unknown name are accepted by PVE and fail in
//!   their task (`snapshot 'x' does not exist`): the list is read first, and
//!   that task error still means "not there".
//! - A restore into a new machine (`snapshot-clone`) is `POST …/clone` of the source VM with
//!   `snapname` through the clone `create` makes from a template (`newid` from
//!   `/cluster/nextid`, name, the description with the new UID, `storage`, `target`), then
//!   `create`'s configuration. PVE copies the snapshot's config, the source machine's UID tag
//!   included, which the configuration replaces with the new machine's. A linked clone is only
//!   made of a template, and a template holds no snapshots: the copy is always full.

use banlieue_sdk::provider::{Machine, MachineRef, MachineStatus, ProviderConfig, Result, Snapshot, SnapshotRequest};
use banlieue_sdk::{Error, info};
use serde_json::Value;

use crate::pve::Pve;
use crate::{CloneSource, Vm, api, lookup};

/// How long a snapshot task may take: one with memory writes the VM's memory out, a removal
/// or rollback may merge or copy volumes.
pub const SNAPSHOT_TASK_TIMEOUT_MS: u64 = 600_000;

/// A snapshot as PVE lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub snapshot: Snapshot,
    /// `prepare` or `delete` while PVE is taking or removing it (or was, when that failed).
    pub snapstate: Option<String>,
}

/// The snapshots of a `GET …/snapshot` answer, without the `current` pseudo-entry; the one
/// that entry names as its `parent` is current.
pub fn parse_list(data: &Value) -> Vec<Entry> {
    let items: &[Value] = data.as_array().map(Vec::as_slice).unwrap_or_default();
    let current = items.iter().find(|i| api::text(i, "name") == "current").map(|c| api::text(c, "parent")).filter(|p| !p.is_empty());
    items
        .iter()
        .filter(|i| !matches!(api::text(i, "name"), "" | "current"))
        .map(|i| {
            let name = api::text(i, "name");
            Entry {
                snapshot: Snapshot {
                    id: name.to_string(),
                    name: name.to_string(),
                    description: api::text(i, "description").to_string(),
                    created_at: api::num(i.get("snaptime")).filter(|t| *t > 0),
                    size_bytes: None,
                    memory: api::flag(i, "vmstate"),
                    current: current == Some(name),
                },
                snapstate: Some(api::text(i, "snapstate")).filter(|s| !s.is_empty()).map(str::to_string),
            }
        })
        .collect()
}

/// Whether the VM config's `agent` option (`1`, `enabled=1,fstrim_cloned_disks=1`, `0,type=isa`, …)
/// enables the QEMU guest agent.
pub fn agent_enabled(config: &Value) -> bool {
    let value = match config.get("agent") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::Bool(b)) => u8::from(*b).to_string(),
        _ => return false,
    };
    value.split(',').any(|part| {
        // The first property may be given without its key, `enabled`.
        let (key, v) = part.split_once('=').unwrap_or(("enabled", part));
        key.trim() == "enabled" && matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "on" | "yes" | "true")
    })
}

/// Check a snapshot name as PVE takes one (a configuration ID: a letter, then letters, digits,
/// `-` and `_`, 2 to 40 in all; `current` and `pending` are reserved), so a bad one is
/// `invalid-spec` naming the field rather than a PVE error of another kind.
pub fn check_name(name: &str) -> Result<()> {
    let ok = (2..=40).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && !name.eq_ignore_ascii_case("current")
        && !name.eq_ignore_ascii_case("pending");
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidSpec(format!(
            "snapshot name {name:?} is not one Proxmox VE takes: a letter, then letters, digits, '-' or '_', 2 to 40 in all, not current or pending"
        )))
    }
}

/// A task error saying the snapshot is not there (PVE's `snapshot 'x' does not exist`).
fn is_gone(e: &Error) -> bool {
    let m = e.message().to_ascii_lowercase();
    m.contains("snapshot '") && m.contains("does not exist")
}

/// A snapshot task error, as `invalid-spec` when the VM can never have one: PVE's "snapshot
/// feature is not available" means a disk is on storage or in a format that cannot snapshot
/// (a raw file on a directory storage).
pub fn cannot_snapshot(e: Error) -> Error {
    if e.message().contains("snapshot feature is not available") {
        Error::InvalidSpec(format!("{} (a disk of the VM is on storage or in a format that takes no snapshots)", e.message()))
    } else {
        e
    }
}

fn snapshots_path(vm: &Vm) -> String {
    format!("{}/snapshot", vm.path())
}

fn read(pve: &Pve, vm: &Vm) -> Result<Vec<Entry>> {
    Ok(parse_list(&pve.get(&snapshots_path(vm))?))
}

/// The snapshot of an entry, unless PVE is still taking or removing it (or failed to).
fn finished(vm: &Vm, e: Entry) -> Result<Snapshot> {
    match e.snapstate {
        None => Ok(e.snapshot),
        Some(state) => Err(Error::Unavailable(format!(
            "snapshot {} of VM {} is not complete (snapstate {state})",
            e.snapshot.name, vm.vmid
        ))),
    }
}

/// Why a snapshot cannot be taken as asked (`invalid-spec`, nothing made), if it cannot.
fn refusal(pve: &Pve, vm: &Vm, request: &SnapshotRequest) -> Result<Option<Error>> {
    if request.memory {
        let st = pve.get(&format!("{}/status/current", vm.path()))?;
        let status = api::text(&st, "status");
        if status != "running" {
            return Ok(Some(Error::InvalidSpec(format!(
                "spec.memory: VM {} is {}: only a running VM's memory can go into a snapshot",
                vm.vmid,
                if status.is_empty() { "not running" } else { status }
            ))));
        }
    }
    if request.quiesce {
        let cfg = pve.get(&format!("{}/config", vm.path()))?;
        if !agent_enabled(&cfg) {
            return Ok(Some(Error::InvalidSpec(format!(
                "spec.quiesce: VM {} has no QEMU guest agent enabled (config `agent`), through which Proxmox VE freezes file systems",
                vm.vmid
            ))));
        }
        match pve.request("POST", &format!("{}/agent/ping", vm.path()), &[]) {
            Ok(_) => {}
            Err(e @ Error::Denied(_)) => return Err(e),
            Err(e) => {
                return Ok(Some(Error::InvalidSpec(format!(
                    "spec.quiesce: the QEMU guest agent of VM {} does not answer, so its file systems cannot be frozen: {}",
                    vm.vmid,
                    e.message()
                ))));
            }
        }
    }
    Ok(None)
}

/// Take a snapshot, or return the one already named `request.name`.
pub fn create(config: &ProviderConfig, machine: &MachineRef, request: &SnapshotRequest) -> Result<Snapshot> {
    check_name(&request.name)?;
    let pve = Pve::connect(config)?;
    let vm = lookup(&pve, machine)?;
    if let Some(e) = read(&pve, &vm)?.into_iter().find(|e| e.snapshot.name == request.name) {
        return finished(&vm, e);
    }
    if let Some(e) = refusal(&pve, &vm, request)? {
        return Err(e);
    }
    let mut params = vec![("snapname".to_string(), request.name.clone())];
    if !request.description.is_empty() {
        params.push(("description".into(), request.description.clone()));
    }
    if request.memory {
        params.push(("vmstate".into(), "1".into()));
    }
    info!("taking snapshot {} of VM {} (memory {}, quiesce {})", request.name, vm.vmid, request.memory, request.quiesce);
    let what = format!("taking snapshot {} of VM {}", request.name, vm.vmid);
    let upid = pve.task("POST", &snapshots_path(&vm), &params).map_err(|e| e.context(&what))?;
    match pve.task_outcome(&upid, SNAPSHOT_TASK_TIMEOUT_MS, &what)? {
        Ok(()) => {}
        // A create racing this one took it under the same name: it is the one asked for.
        Err(e) if e.message().contains("already used") => {}
        Err(e) => return Err(cannot_snapshot(e)),
    }
    match read(&pve, &vm)?.into_iter().find(|e| e.snapshot.name == request.name) {
        Some(e) => finished(&vm, e),
        None => Err(Error::Internal(format!("{what}: the task succeeded but PVE does not list the snapshot"))),
    }
}

/// The VM's snapshots.
pub fn list(config: &ProviderConfig, machine: &MachineRef) -> Result<Vec<Snapshot>> {
    let pve = Pve::connect(config)?;
    let vm = lookup(&pve, machine)?;
    Ok(read(&pve, &vm)?.into_iter().map(|e| e.snapshot).collect())
}

/// Roll the VM back to snapshot `id`; `not-found` when it has no such snapshot.
pub fn revert(config: &ProviderConfig, machine: &MachineRef, id: &str) -> Result<()> {
    let pve = Pve::connect(config)?;
    let vm = lookup(&pve, machine)?;
    let gone = || Error::NotFound(format!("VM {} has no snapshot {id:?}", vm.vmid));
    if !read(&pve, &vm)?.iter().any(|e| e.snapshot.id == id) {
        return Err(gone());
    }
    info!("rolling VM {} back to snapshot {id}", vm.vmid);
    let what = format!("rolling VM {} back to snapshot {id}", vm.vmid);
    let upid = pve.task("POST", &format!("{}/{}/rollback", snapshots_path(&vm), api::encode(id)), &[]).map_err(|e| e.context(&what))?;
    match pve.task_outcome(&upid, SNAPSHOT_TASK_TIMEOUT_MS, &what)? {
        Err(e) if is_gone(&e) => Err(gone()),
        other => other,
    }
}

/// Remove snapshot `id`; one that is not there (or a VM that is gone) is success.
pub fn delete(config: &ProviderConfig, machine: &MachineRef, id: &str) -> Result<()> {
    let pve = Pve::connect(config)?;
    let vm = match lookup(&pve, machine) {
        Err(Error::NotFound(_)) => return Ok(()),
        other => other?,
    };
    let present = match read(&pve, &vm) {
        Err(Error::NotFound(_)) => return Ok(()),
        other => other?.iter().any(|e| e.snapshot.id == id),
    };
    if !present {
        return Ok(());
    }
    info!("removing snapshot {id} of VM {}", vm.vmid);
    let what = format!("removing snapshot {id} of VM {}", vm.vmid);
    let upid = match pve.task("DELETE", &format!("{}/{}", snapshots_path(&vm), api::encode(id)), &[]) {
        Err(Error::NotFound(_)) => return Ok(()),
        other => other.map_err(|e| e.context(&what))?,
    };
    match pve.task_outcome(&upid, SNAPSHOT_TASK_TIMEOUT_MS, &what)? {
        Err(e) if is_gone(&e) || e.is_not_found() => Ok(()),
        other => other,
    }
}

/// Why a machine cannot be made of a snapshot whose config is `snapshot_config`, if it cannot:
/// a declared disk smaller than the snapshot's in the same position (a disk is never shrunk).
pub fn clone_refusal(snapshot_config: &Value, machine: &Machine) -> Option<Error> {
    let have = crate::hardware(snapshot_config);
    machine.disks.iter().zip(&have.disks).find(|(want, had)| want.size_gib > 0 && want.size_gib < had.size_gib).map(|(want, had)| {
        Error::InvalidSpec(format!(
            "disk {} is {} GiB in the snapshot ({}); {} GiB are declared and a disk is never shrunk: declare at least {} GiB",
            want.name, had.size_gib, had.id, want.size_gib, had.size_gib
        ))
    })
}

/// Make `machine` as a full clone of `source`'s VM at its snapshot `id`, configured as
/// `create` configures a VM, or return the VM already carrying the machine's UID (a retry).
pub fn clone(config: &ProviderConfig, machine: &Machine, source: &MachineRef, id: &str, linked: bool) -> Result<MachineStatus> {
    let vm_name = crate::check_machine(machine)?;
    if machine.uid == source.uid {
        return Err(Error::InvalidSpec(format!("machine {} cannot be restored into itself: snapshot-clone makes a new machine", machine.uid)));
    }
    let pve = Pve::connect(config)?;
    // Found by its UID as `create` finds it: a retry never clones twice.
    if let Some(vm) = crate::find(&pve, &machine.uid, &vm_name)? {
        return crate::realise(&pve, vm, machine);
    }
    let src = lookup(&pve, source)?;
    let Some(entry) = read(&pve, &src)?.into_iter().find(|e| e.snapshot.id == id) else {
        return Err(Error::NotFound(format!("VM {} has no snapshot {id}", src.vmid)));
    };
    finished(&src, entry)?;
    let target = if machine.failure_domain.is_empty() { src.node.clone() } else { machine.failure_domain.clone() };
    crate::check_target(&pve, machine, &target)?;
    let snapshot_config = pve.get(&format!("{}/snapshot/{}/config", src.path(), api::encode(id)))?;
    if let Some(e) = clone_refusal(&snapshot_config, machine) {
        return Err(e);
    }
    if linked {
        // The source is a VM (a template cannot be found as a machine, nor hold a snapshot),
        // and PVE makes linked clones of templates only.
        info!("VM {} is not a template, so Proxmox VE cannot link a clone to it: snapshot {id} is copied in full", src.vmid);
    }
    let clone = CloneSource { node: &src.node, vmid: src.vmid, what: format!("snapshot {id} of VM {}", src.vmid), params: clone_params(id, &machine.disks[0].target) };
    let vm = match clone.clone_to(&pve, machine, &vm_name, &target) {
        // Removed between the listing and the clone.
        Err(e) if is_gone(&e) => return Err(Error::NotFound(e.message().to_string())),
        other => other?,
    };
    crate::finish_clone(&pve, vm, machine, true)
}

/// What a clone of snapshot `name` carries besides what every clone does: a full copy onto
/// `storage` (PVE refuses `storage` for a linked clone, and links only templates' disks).
pub fn clone_params(name: &str, storage: &str) -> Vec<(String, String)> {
    vec![("snapname".into(), name.to_string()), ("full".into(), "1".into()), ("storage".into(), storage.to_string())]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// fakepve's answer after `bl-…abc` (with memory), `second` on it, and a rollback to `bl-…abc`.
    fn listed() -> Value {
        json!([
            {"name": "bl-0a1b2c3d-0000-4000-8000-000000000abc", "snaptime": 1796576762, "vmstate": 1, "description": "first"},
            {"name": "second", "snaptime": 1796576765, "vmstate": 0, "description": "", "parent": "bl-0a1b2c3d-0000-4000-8000-000000000abc"},
            {"name": "current", "digest": "64d8a0fc", "running": 0, "description": "You are here!", "parent": "bl-0a1b2c3d-0000-4000-8000-000000000abc"}
        ])
    }

    #[test]
    fn the_list_leaves_out_current_and_marks_its_parent() {
        let got: Vec<(String, String, Option<u64>, bool, bool)> = parse_list(&listed())
            .into_iter()
            .map(|e| (e.snapshot.id, e.snapshot.description, e.snapshot.created_at, e.snapshot.memory, e.snapshot.current))
            .collect();
        assert_eq!(
            got,
            [
                ("bl-0a1b2c3d-0000-4000-8000-000000000abc".to_string(), "first".to_string(), Some(1796576762), true, true),
                ("second".to_string(), String::new(), Some(1796576765), false, false),
            ]
        );
        let e = &parse_list(&listed())[1];
        assert_eq!((e.snapshot.name.as_str(), e.snapshot.size_bytes, e.snapstate.as_deref()), ("second", None, None));
    }

    #[test]
    fn no_snapshots_or_a_current_without_parent_means_none_current() {
        assert!(parse_list(&json!([{"name": "current", "running": 1, "description": "You are here!"}])).is_empty());
        assert!(parse_list(&Value::Null).is_empty());
        let list = parse_list(&json!([
            {"name": "a", "snaptime": "17", "vmstate": "0", "snapstate": "prepare"},
            {"name": "current", "description": "You are here!"}
        ]));
        assert_eq!(list.len(), 1);
        assert!(!list[0].snapshot.current);
        assert_eq!(list[0].snapshot.created_at, Some(17));
        assert_eq!(list[0].snapstate.as_deref(), Some("prepare"));
    }

    #[test]
    fn the_agent_option_enables_the_agent() {
        for on in [json!({"agent": "1"}), json!({"agent": 1}), json!({"agent": "enabled=1,fstrim_cloned_disks=1"}), json!({"agent": "1,type=virtio"})] {
            assert!(agent_enabled(&on), "{on}");
        }
        for off in [json!({}), json!({"agent": "0"}), json!({"agent": "enabled=0"}), json!({"agent": "0,type=isa"}), json!({"agent": "type=virtio"})] {
            assert!(!agent_enabled(&off), "{off}");
        }
    }

    #[test]
    fn names_are_pve_configuration_ids() {
        check_name("bl-0a1b2c3d-0000-4000-8000-000000000abc").unwrap();
        check_name("manual_1").unwrap();
        for bad in ["x", "current", "Pending", "1abc", "bad name", "a;b", &"a".repeat(41)] {
            assert!(matches!(check_name(bad), Err(Error::InvalidSpec(_))), "{bad}");
        }
    }

    #[test]
    fn storage_that_cannot_snapshot_is_invalid_spec() {
        let e = cannot_snapshot(api::task_error("taking snapshot bl-x of VM 200", "snapshot feature is not available"));
        assert!(matches!(&e, Error::InvalidSpec(m) if m.contains("takes no snapshots")), "{e:?}");
        assert!(matches!(cannot_snapshot(api::task_error("x", "VM is locked (backup)")), Error::Unavailable(_)));
    }

    #[test]
    fn a_missing_snapshot_task_error_is_gone() {
        assert!(is_gone(&api::task_error("rolling back", "snapshot 'nope' does not exist")));
        assert!(!is_gone(&api::task_error("rolling back", "VM is locked (backup)")));
    }

    fn machine(sizes: &[u64]) -> Machine {
        use banlieue_sdk::provider::{Disk, Firmware, ImageSource, PowerState, UserDataFormat};
        Machine {
            uid: "0a1b2c3d-0000-4000-8000-0000000002aa".into(),
            name: "restored".into(),
            namespace: "default".into(),
            cpus: 2,
            memory_mib: 2048,
            firmware: Firmware::Bios,
            disks: sizes.iter().enumerate().map(|(i, s)| Disk { name: format!("d{i}"), size_gib: *s, target: "local-lvm".into() }).collect(),
            nics: vec![],
            image: ImageSource::Template("9000".into()),
            user_data: None,
            user_data_format: UserDataFormat::CloudConfig,
            failure_domain: "pve2".into(),
            power_state: PowerState::PoweredOff,
            labels: vec![],
        }
    }

    /// `GET …/snapshot/bl-s1/config` as fakepve answers it for a VM with a second disk.
    fn snapshot_config() -> Value {
        json!({"cores": 2, "memory": 2048, "scsi0": "local-lvm:vm-101-disk-0,size=4G", "scsi1": "local-lvm:vm-101-disk-1,size=8G",
               "net0": "virtio=BC:24:11:00:01:01,bridge=vmbr0", "tags": "banlieue-0a1b2c3d-0000-4000-8000-000000000101",
               "name": "existing.default", "snaptime": 1796578071, "description": "d"})
    }

    #[test]
    fn a_disk_smaller_than_the_snapshots_in_its_position_is_refused() {
        assert!(clone_refusal(&snapshot_config(), &machine(&[4, 8])).is_none());
        assert!(clone_refusal(&snapshot_config(), &machine(&[10, 8, 5])).is_none(), "larger and further disks are made later");
        assert!(clone_refusal(&snapshot_config(), &machine(&[0])).is_none(), "a size of 0 keeps the snapshot's");
        let e = clone_refusal(&snapshot_config(), &machine(&[4, 2])).unwrap();
        assert!(matches!(&e, Error::InvalidSpec(m) if m.contains("disk d1 is 8 GiB") && m.contains("local-lvm:vm-101-disk-1")), "{e:?}");
    }

    #[test]
    fn a_snapshot_is_cloned_in_full_onto_the_boot_disks_storage() {
        let params = clone_params("bl-s1", "local-lvm");
        let get = |k: &str| params.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str());
        assert_eq!((get("snapname"), get("full"), get("storage")), (Some("bl-s1"), Some("1"), Some("local-lvm")));
        let body = String::from_utf8(api::form(&params)).unwrap();
        assert_eq!(body, "snapname=bl-s1&full=1&storage=local-lvm");
    }
}
