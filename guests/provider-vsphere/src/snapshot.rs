//! Snapshots of a machine's VM (contract 0.6.0): `CreateSnapshot_Task`,
//! `RevertToSnapshot_Task` and `RemoveSnapshot_Task`, on the VM found by its
//! instance UUID as every other call finds it, and the VM's `snapshot`
//! property (a tree: `rootSnapshotList`, each node's `childSnapshotList`) for
//! what exists.
//!
//! - A snapshot's id is its managed object id (`snapshot-123`), its name the
//!   one it was given: a create finds an existing snapshot by name and takes
//!   none (a retry after a lost answer).
//! - vSphere keeps memory in a snapshot only of a powered-on VM, and records
//!   the VM's power state then as the node's `state`: `poweredOn` is read as
//!   "holds memory".
//! - `current` is the node that `snapshot.currentSnapshot` names.
//! - A restore into a new machine (`snapshot-clone`) is `CloneVM_Task` of the source VM with
//!   `spec.snapshot` = the snapshot (and `diskMoveType` `createNewChildDiskBacking` for a
//!   linked clone), through the same clone spec `create` gives a VM from a template (name,
//!   folder, pool, datastore, instance UUID = the new machine's UID, CPUs, memory, NICs,
//!   guestinfo), then brought to the machine as `create` does ([`crate::realise`]). The
//!   snapshot is looked up in the source's tree first: vcsim ignores `spec.snapshot` (it clones
//!   the VM as it is now, even for a snapshot that does not exist), vCenter would fault.

use banlieue_sdk::provider::{Machine, MachineRef, MachineStatus, ProviderConfig, Result, Snapshot, SnapshotRequest};
use banlieue_sdk::session::SessionError;
use banlieue_sdk::{Error, info};

use crate::soap::{self, MoRef, Node, ObjectContent, SnapshotSource, el};
use crate::vim::{VResult, Vim};
use crate::{Origin, clone_machine, find_machine, lookup, realise, with_vim};

/// How long a snapshot task may take: a memory snapshot writes the VM's memory out, and a
/// removal merges the snapshot's delta disks.
pub const SNAPSHOT_TASK_TIMEOUT_MS: u64 = 600_000;

/// What a snapshot call reads of the VM.
const PROPS: &[&str] = &["name", "runtime.powerState", "guest.toolsRunningStatus", "snapshot"];

/// One snapshot of the tree: its managed object reference and what the contract reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub moref: MoRef,
    pub snapshot: Snapshot,
}

/// The VM's snapshots in tree order (a parent before its children), from its `snapshot`
/// property (`VirtualMachineSnapshotInfo`; absent when the VM has none).
pub fn flatten(info: Option<&Node>) -> Vec<Entry> {
    let Some(info) = info else { return Vec::new() };
    let current = info.child("currentSnapshot").and_then(Node::as_ref).filter(|r| !r.value.is_empty());
    let mut out = Vec::new();
    for root in info.all("rootSnapshotList") {
        walk(root, current.as_ref(), &mut out, 0);
    }
    out
}

/// vSphere caps the tree at a few dozen levels; the cap keeps a malformed answer from recursing without end.
const MAX_DEPTH: usize = 256;

fn walk(node: &Node, current: Option<&MoRef>, out: &mut Vec<Entry>, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    if let Some(moref) = node.child("snapshot").and_then(Node::as_ref).filter(|r| !r.value.is_empty()) {
        out.push(Entry {
            snapshot: Snapshot {
                id: moref.value.clone(),
                name: node.str_at("name").unwrap_or_default().to_string(),
                description: node.str_at("description").unwrap_or_default().to_string(),
                created_at: node.str_at("createTime").and_then(unix_seconds),
                size_bytes: None,
                memory: node.str_at("state") == Some("poweredOn"),
                current: current == Some(&moref),
            },
            moref,
        });
    }
    for child in node.all("childSnapshotList") {
        walk(child, current, out, depth + 1);
    }
}

/// Seconds since the Unix epoch of an `xsd:dateTime` (`2026-12-06T17:08:02.303585Z`, or with a
/// `±hh:mm` offset; no zone is taken as UTC). None for anything else or a time before 1970.
pub fn unix_seconds(s: &str) -> Option<u64> {
    let s = s.trim();
    let (date, time) = s.split_once('T')?;
    let mut d = date.splitn(3, '-');
    let (year, month, day): (i64, i64, i64) = (d.next()?.parse().ok()?, d.next()?.parse().ok()?, d.next()?.parse().ok()?);
    // The zone: `Z`, `+hh:mm` / `-hh:mm`, or none.
    let (clock, offset_s) = if let Some(c) = time.strip_suffix('Z') {
        (c, 0)
    } else if let Some(i) = time.rfind(['+', '-']) {
        let (c, z) = time.split_at(i);
        let (h, m) = z[1..].split_once(':')?;
        let secs = h.parse::<i64>().ok()? * 3600 + m.parse::<i64>().ok()? * 60;
        (c, if z.starts_with('-') { -secs } else { secs })
    } else {
        (time, 0)
    };
    let clock = clock.split('.').next()?;
    let mut t = clock.splitn(3, ':');
    let (h, mi, sec): (i64, i64, i64) = (t.next()?.parse().ok()?, t.next()?.parse().ok()?, t.next()?.parse().ok()?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let total = days_since_epoch(year, month, day) * 86_400 + h * 3600 + mi * 60 + sec - offset_s;
    u64::try_from(total).ok()
}

/// Days from 1970-01-01 to a proleptic Gregorian date: count in 400-year eras starting in March,
/// so the leap day falls at the end of each counted year.
fn days_since_epoch(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    // 719468 days lie between 0000-03-01 and 1970-01-01.
    era * 146_097 + day_of_era - 719_468
}

/// `CreateSnapshot_Task` (fields in schema order).
pub fn create_request(vm: &MoRef, request: &SnapshotRequest) -> String {
    soap::method(
        "CreateSnapshot_Task",
        vm,
        &format!(
            "{}{}<memory>{}</memory><quiesce>{}</quiesce>",
            el("name", &request.name),
            el("description", &request.description),
            request.memory,
            request.quiesce
        ),
    )
}

/// `RevertToSnapshot_Task`, leaving the VM's power to the host (which sets it after the revert).
pub fn revert_request(snapshot: &MoRef) -> String {
    soap::method("RevertToSnapshot_Task", snapshot, "<suppressPowerOn>true</suppressPowerOn>")
}

/// `RemoveSnapshot_Task` of one snapshot: its children stay, its changes merged into them.
pub fn remove_request(snapshot: &MoRef) -> String {
    soap::method("RemoveSnapshot_Task", snapshot, "<removeChildren>false</removeChildren>")
}

/// Why a snapshot cannot be taken as asked (`invalid-spec`, nothing made), if it cannot.
pub fn refusal(vm: &ObjectContent, request: &SnapshotRequest) -> Option<Error> {
    let name = vm.str("name").unwrap_or("?");
    let power = vm.str("runtime.powerState").unwrap_or("in an unknown power state");
    if request.memory && power != "poweredOn" {
        return Some(Error::InvalidSpec(format!(
            "spec.memory: vSphere VM {name} is {power}: only a powered-on VM's memory can go into a snapshot"
        )));
    }
    let tools = vm.str("guest.toolsRunningStatus").unwrap_or("unknown");
    if request.quiesce && tools != "guestToolsRunning" {
        return Some(Error::InvalidSpec(format!(
            "spec.quiesce: VMware Tools are not running in vSphere VM {name} ({tools}): its file systems cannot be quiesced"
        )));
    }
    None
}

/// The machine's VM and its snapshot properties.
fn read(vim: &Vim, machine: &MachineRef) -> VResult<(MoRef, ObjectContent)> {
    let vm = lookup(vim, machine)?;
    let props = vim.props(&vm, PROPS)?;
    Ok((vm, props))
}

/// Take a snapshot, or return the one already named `request.name`.
pub fn create(config: &ProviderConfig, machine: &MachineRef, request: &SnapshotRequest) -> Result<Snapshot> {
    if request.name.is_empty() {
        return Err(Error::InvalidSpec("a snapshot needs a name".into()));
    }
    with_vim(config, |vim| {
        let (vm, props) = read(vim, machine)?;
        if let Some(e) = flatten(props.props.get("snapshot")).into_iter().find(|e| e.snapshot.name == request.name) {
            return Ok(e.snapshot);
        }
        if let Some(e) = refusal(&props, request) {
            return Err(e.into());
        }
        let name = props.str("name").unwrap_or(&vm.value).to_string();
        info!("taking snapshot {} of vSphere VM {name} (memory {}, quiesce {})", request.name, request.memory, request.quiesce);
        // vCenter refuses a second task on a VM while one runs (TaskInProgress), so a retry
        // after a timeout cannot take the snapshot twice.
        let what = format!("CreateSnapshot_Task {} of {name}", request.name);
        let made = vim.run_task_within(&what, &create_request(&vm, request), SNAPSHOT_TASK_TIMEOUT_MS)?.and_then(|n| n.as_ref());
        // Read back as `snapshot-list` reports it (time, current).
        let all = flatten(vim.props(&vm, &["snapshot"])?.props.get("snapshot"));
        let found = match &made {
            Some(r) => all.into_iter().find(|e| e.moref.value == r.value),
            None => all.into_iter().find(|e| e.snapshot.name == request.name),
        };
        found
            .map(|e| e.snapshot)
            .ok_or_else(|| Error::Internal(format!("{what}: the task succeeded but the snapshot is not in the VM's snapshot tree")).into())
    })
}

/// The VM's snapshots.
pub fn list(config: &ProviderConfig, machine: &MachineRef) -> Result<Vec<Snapshot>> {
    with_vim(config, |vim| {
        let vm = lookup(vim, machine)?;
        Ok(flatten(vim.props(&vm, &["snapshot"])?.props.get("snapshot")).into_iter().map(|e| e.snapshot).collect())
    })
}

/// Revert the VM to snapshot `id`; `not-found` when the VM has no such snapshot.
pub fn revert(config: &ProviderConfig, machine: &MachineRef, id: &str) -> Result<()> {
    with_vim(config, |vim| {
        let (vm, props) = read(vim, machine)?;
        let name = props.str("name").unwrap_or(&vm.value).to_string();
        let Some(e) = flatten(props.props.get("snapshot")).into_iter().find(|e| e.snapshot.id == id) else {
            return Err(Error::NotFound(format!("vSphere VM {name} has no snapshot {id}")).into());
        };
        info!("reverting vSphere VM {name} to snapshot {id} ({})", e.snapshot.name);
        vim.run_task_within(&format!("RevertToSnapshot_Task {id} of {name}"), &revert_request(&e.moref), SNAPSHOT_TASK_TIMEOUT_MS)
            .map(|_| ())
    })
}

/// Make `machine` as a clone of `source`'s VM at its snapshot `id` (linked: on child disks of
/// the snapshot's), or return the VM that already carries the machine's UID (a retry).
pub fn clone(config: &ProviderConfig, machine: &Machine, source: &MachineRef, id: &str, linked: bool) -> Result<MachineStatus> {
    if machine.uid.is_empty() {
        return Err(Error::InvalidSpec("the machine has no UID".into()));
    }
    if machine.uid.eq_ignore_ascii_case(&source.uid) {
        return Err(Error::InvalidSpec(format!("machine {} cannot be restored into itself: snapshot-clone makes a new machine", machine.uid)));
    }
    with_vim(config, |vim| {
        // Found by its instance UUID as `create` finds it: a retry never clones twice.
        if let Some(vm) = vim.find_vm(&machine.uid)? {
            return realise(vim, &vm, machine);
        }
        let (source_vm, props) = read(vim, source)?;
        let source_name = props.str("name").unwrap_or(&source_vm.value).to_string();
        let Some(e) = flatten(props.props.get("snapshot")).into_iter().find(|e| e.snapshot.id == id) else {
            return Err(Error::NotFound(format!("vSphere VM {source_name} has no snapshot {id}")).into());
        };
        let what = format!("snapshot {id} ({}) of vSphere VM {source_name}", e.snapshot.name);
        let origin = Origin::Snapshot { vm: &source_vm, what: &what, source: SnapshotSource { snapshot: e.moref, linked } };
        let vm = clone_machine(vim, machine, &origin)?;
        realise(vim, &vm, machine)
    })
}

/// Remove snapshot `id`; one that is not there (or a VM that is gone) is success.
pub fn delete(config: &ProviderConfig, machine: &MachineRef, id: &str) -> Result<()> {
    with_vim(config, |vim| {
        let Some(vm) = find_machine(vim, machine)? else { return Ok(()) };
        let props = vim.props(&vm, &["name", "snapshot"]);
        let props = match props {
            Err(SessionError::Failed(e)) if e.is_not_found() => return Ok(()),
            other => other?,
        };
        let name = props.str("name").unwrap_or(&vm.value).to_string();
        let Some(e) = flatten(props.props.get("snapshot")).into_iter().find(|e| e.snapshot.id == id) else { return Ok(()) };
        info!("removing snapshot {id} ({}) of vSphere VM {name}", e.snapshot.name);
        match vim.run_task_within(&format!("RemoveSnapshot_Task {id} of {name}"), &remove_request(&e.moref), SNAPSHOT_TASK_TIMEOUT_MS) {
            Err(SessionError::Failed(e)) if e.is_not_found() => Ok(()),
            other => other.map(|_| ()),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `snapshot` property as vcsim answers it: `bl-one` (taken powered on) with a child
    /// `bl-two`, and a second root `manual` (taken powered off); `bl-two` is current.
    const INFO: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/" xmlns:xsd="http://www.w3.org/2001/XMLSchema" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"><soapenv:Body>
<RetrievePropertiesExResponse xmlns="urn:vim25"><returnval><objects><obj type="VirtualMachine">vm-63</obj><propSet><name>snapshot</name><val xmlns:XMLSchema-instance="http://www.w3.org/2001/XMLSchema-instance" XMLSchema-instance:type="VirtualMachineSnapshotInfo"><currentSnapshot type="VirtualMachineSnapshot">snapshot-74</currentSnapshot><rootSnapshotList><snapshot type="VirtualMachineSnapshot">snapshot-72</snapshot><vm type="VirtualMachine">vm-63</vm><name>bl-one</name><description>first &amp; one</description><id>1</id><createTime>2026-12-06T17:08:02.30358526Z</createTime><state>poweredOn</state><quiesced>true</quiesced><childSnapshotList><snapshot type="VirtualMachineSnapshot">snapshot-74</snapshot><vm type="VirtualMachine">vm-63</vm><name>bl-two</name><description></description><id>2</id><createTime>2026-12-06T17:08:03.323377817Z</createTime><state>poweredOff</state><quiesced>false</quiesced><replaySupported>false</replaySupported></childSnapshotList><replaySupported>false</replaySupported></rootSnapshotList><rootSnapshotList><snapshot type="VirtualMachineSnapshot">snapshot-80</snapshot><vm type="VirtualMachine">vm-63</vm><name>manual</name><description>by hand</description><id>3</id><createTime>2026-12-06T18:08:03+01:00</createTime><state>poweredOff</state><quiesced>false</quiesced></rootSnapshotList></val></propSet></objects></returnval></RetrievePropertiesExResponse></soapenv:Body></soapenv:Envelope>"#;

    fn info() -> Node {
        let soap::Reply::Ok(resp) = soap::parse_reply(INFO).unwrap() else { panic!("a fault") };
        let (mut objects, _) = soap::retrieve_result(&resp);
        objects.remove(0).props.remove("snapshot").unwrap()
    }

    #[test]
    fn the_tree_is_flattened_parents_first_with_memory_and_current() {
        let all = flatten(Some(&info()));
        let got: Vec<(&str, &str, &str, Option<u64>, bool, bool)> = all
            .iter()
            .map(|e| (e.snapshot.id.as_str(), e.snapshot.name.as_str(), e.snapshot.description.as_str(), e.snapshot.created_at, e.snapshot.memory, e.snapshot.current))
            .collect();
        assert_eq!(
            got,
            [
                ("snapshot-72", "bl-one", "first & one", Some(1_796_576_882), true, false),
                ("snapshot-74", "bl-two", "", Some(1_796_576_883), false, true),
                ("snapshot-80", "manual", "by hand", Some(1_796_576_883), false, false),
            ]
        );
        assert_eq!(all[1].moref, MoRef::new("VirtualMachineSnapshot", "snapshot-74"));
        assert!(all.iter().all(|e| e.snapshot.size_bytes.is_none()));
    }

    #[test]
    fn no_snapshot_property_or_an_empty_current_means_none_current() {
        assert!(flatten(None).is_empty());
        // vcsim leaves `<currentSnapshot type="">` when it fails to remove a current root snapshot.
        let mut i = info();
        i.children[0] = Node { name: "currentSnapshot".into(), mo_type: Some(String::new()), ..Default::default() };
        assert!(flatten(Some(&i)).iter().all(|e| !e.snapshot.current));
    }

    #[test]
    fn xsd_date_times_become_unix_seconds() {
        assert_eq!(unix_seconds("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(unix_seconds("2000-03-01T00:00:00Z"), Some(951_868_800));
        assert_eq!(unix_seconds("2024-02-29T12:00:00.5Z"), Some(1_709_208_000));
        assert_eq!(unix_seconds("2024-02-29T13:30:00+01:30"), Some(1_709_208_000));
        assert_eq!(unix_seconds("2024-02-29T10:00:00-02:00"), Some(1_709_208_000));
        assert_eq!(unix_seconds("2024-02-29T12:00:00"), Some(1_709_208_000));
        assert_eq!(unix_seconds("1969-12-31T23:59:59Z"), None);
        assert_eq!(unix_seconds("yesterday"), None);
        assert_eq!(unix_seconds("2024-13-01T00:00:00Z"), None);
    }

    fn vm(power: &str, tools: &str) -> ObjectContent {
        let text = |t: &str| Node { text: t.into(), ..Default::default() };
        ObjectContent {
            props: [("name", "ns_vm"), ("runtime.powerState", power), ("guest.toolsRunningStatus", tools)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), text(v)))
                .collect(),
            ..Default::default()
        }
    }

    fn request(memory: bool, quiesce: bool) -> SnapshotRequest {
        SnapshotRequest { name: "bl-x".into(), description: "d".into(), memory, quiesce }
    }

    #[test]
    fn memory_needs_a_powered_on_vm_and_quiesce_running_tools() {
        assert_eq!(refusal(&vm("poweredOn", "guestToolsRunning"), &request(true, true)), None);
        assert_eq!(refusal(&vm("poweredOff", "guestToolsNotRunning"), &request(false, false)), None);
        let e = refusal(&vm("poweredOff", "guestToolsNotRunning"), &request(true, false)).unwrap();
        assert!(matches!(&e, Error::InvalidSpec(m) if m.starts_with("spec.memory") && m.contains("poweredOff")), "{e:?}");
        let e = refusal(&vm("poweredOn", "guestToolsNotRunning"), &request(false, true)).unwrap();
        assert!(matches!(&e, Error::InvalidSpec(m) if m.starts_with("spec.quiesce") && m.contains("guestToolsNotRunning")), "{e:?}");
    }

    #[test]
    fn requests_follow_the_schema() {
        let vm = MoRef::new("VirtualMachine", "vm-63");
        let body = create_request(&vm, &SnapshotRequest { name: "bl-<1>".into(), description: "a & b".into(), memory: true, quiesce: false });
        assert!(body.ends_with("<name>bl-&lt;1&gt;</name><description>a &amp; b</description><memory>true</memory><quiesce>false</quiesce></CreateSnapshot_Task>"), "{body}");
        let snap = MoRef::new("VirtualMachineSnapshot", "snapshot-72");
        assert!(revert_request(&snap).contains("<_this type=\"VirtualMachineSnapshot\">snapshot-72</_this><suppressPowerOn>true</suppressPowerOn>"));
        assert!(remove_request(&snap).contains("</_this><removeChildren>false</removeChildren>"));
        roxmltree::Document::parse(&soap::envelope(&body)).unwrap();
    }
}
