//! Discovery and adoption (contract 0.6.0, feature `adopt`): the VMs of the cluster listed as
//! found machines, an existing VM taken under a Machine by a mark in its description, and let
//! go of again.
//!
//! - A found machine's `backend-id` is the VM id in decimal (`101`); a machine ref carrying
//!   one is found by it ([`locate`]), not by the name and UID tag `create` gives a VM, and only
//!   while the VM carries that machine's mark ([`owner_of`]).
//! - The mark is one line of the VM's description (PVE's free-text `description`, the "Notes"
//!   of its web UI), the rest of which is left as the user wrote it:
//!   `banlieue-owner: machine-uid=<uid> machine=<namespace/name> installation=<id>`; each
//!   value has `%`, white space and control characters percent-encoded (`%20`), so it is one
//!   token. When the UID is what a PVE tag may hold (lowercase letters, digits, `-`) the VM is
//!   also tagged `banlieue-<uid>`, as `create` tags its VMs: the tag shows in PVE's UI and
//!   keeps the VM the machine's when cloned from its snapshot as any other.
//! - A VM `create` made reports its own mark as owner: the UID of its `banlieue-uid:` line
//!   (else of a `banlieue-<UUID>` tag), the machine of its `banlieue machine` line (else of
//!   its `{name}.{namespace}` name), no installation (its VM holds none).
//! - The mark is written with the config's `digest`, so PVE refuses it (`checksum mismatch`,
//!   retried as `unavailable`) when the config changed since it was read: two adoptions racing
//!   for one VM cannot both stamp it. Nothing else of the VM is touched.
//! - The list is `/cluster/resources?type=vm` (one call for the cluster) less the VMs on nodes
//!   that are not online (no failure domain `probe` reports; their config cannot be read),
//!   sorted by VM id and cut into pages of [`PAGE_SIZE`] by [`page_range`]; only the page's VMs
//!   have their config (hardware, tags, mark) and, running, `status/current` read, and their
//!   addresses from the guest agent when their config enables it.

use banlieue_sdk::provider::{Address, FoundMachine, HardwareTarget, MachinePage, MachineRef, MachineStatus, OwnerMark, PowerState, ProviderConfig, Result, page_range};
use banlieue_sdk::{Error, info, warn};
use serde_json::Value;

use crate::pve::Pve;
use crate::{Vm, api};

/// Start of the description line carrying an adopted VM's owner.
pub const OWNER_LINE_PREFIX: &str = "banlieue-owner:";
/// Found machines per `list-machines` page.
pub const PAGE_SIZE: usize = 100;

/// `s` with `%`, white space and control characters percent-encoded (UTF-8 bytes), so it is
/// one token of the owner line whatever an installation id holds.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c == '%' || c.is_whitespace() || c.is_control() {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The inverse of [`escape`]; a `%` not followed by two hex digits is kept as it is.
fn unescape(s: &str) -> String {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        let byte = s.as_bytes()[i];
        if byte == b'%'
            && let Some(b) = s.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(byte);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The description line of `mark`.
pub fn mark_line(mark: &OwnerMark) -> String {
    format!(
        "{OWNER_LINE_PREFIX} machine-uid={} machine={} installation={}",
        escape(&mark.machine_uid),
        escape(&mark.machine),
        escape(&mark.installation)
    )
}

/// The mark of an owner line, if `line` is one with a machine UID. Keys it does not know are
/// skipped, so a later driver may add some.
pub fn parse_mark_line(line: &str) -> Option<OwnerMark> {
    let rest = line.trim().strip_prefix(OWNER_LINE_PREFIX)?;
    let mut mark = OwnerMark { machine_uid: String::new(), machine: String::new(), installation: String::new() };
    for (key, value) in rest.split_whitespace().filter_map(|t| t.split_once('=')) {
        match key {
            "machine-uid" => mark.machine_uid = unescape(value),
            "machine" => mark.machine = unescape(value),
            "installation" => mark.installation = unescape(value),
            _ => {}
        }
    }
    (!mark.machine_uid.is_empty()).then_some(mark)
}

/// `namespace/name` of a VM named `{name}.{namespace}` as `create` names them.
fn machine_of_vm_name(vm_name: &str) -> Option<String> {
    let (name, namespace) = vm_name.rsplit_once('.')?;
    (!name.is_empty() && !namespace.is_empty()).then(|| format!("{namespace}/{name}"))
}

/// Who owns a VM, from its description, tags and name: an owner line (an adopted VM), else
/// the mark `create` leaves (a `banlieue-uid:` line, else a `banlieue-<UUID>` tag) with no
/// installation; none for a VM banlieue has not marked.
pub fn owner_of(description: &str, tags: &str, vm_name: &str) -> Option<OwnerMark> {
    if let Some(mark) = description.lines().find_map(parse_mark_line) {
        return Some(mark);
    }
    let from_line = description
        .lines()
        .find_map(|l| l.trim().strip_prefix(api::UID_LINE_PREFIX.trim_end()).map(str::trim).filter(|u| !u.is_empty()));
    // Only a UUID-shaped tag is a UID: people's tags may start with `banlieue-` too.
    let from_tag = || api::split_tags(tags).into_iter().find_map(|t| t.strip_prefix(api::UID_TAG_PREFIX).filter(|u| api::is_uuid(u)));
    let uid = from_line.or_else(from_tag)?;
    let machine = description
        .lines()
        .find_map(|l| l.trim().strip_prefix(api::MACHINE_LINE_PREFIX).map(str::trim).filter(|m| !m.is_empty()).map(str::to_string))
        .or_else(|| machine_of_vm_name(vm_name))
        .unwrap_or_default();
    Some(OwnerMark { machine_uid: uid.to_string(), machine, installation: String::new() })
}

/// Whether `owner` is machine `uid`'s: the only VMs a machine found by its backend id acts on.
pub fn marked_for(owner: Option<&OwnerMark>, uid: &str) -> bool {
    owner.is_some_and(|o| !uid.is_empty() && o.machine_uid == uid)
}

/// `description` with `mark`'s line added as its last line, the user's text before it as it was.
pub fn with_mark(description: &str, mark: &OwnerMark) -> String {
    let mut out = description.to_string();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&mark_line(mark));
    out.push('\n');
    out
}

/// Whether `line` marks the VM as machine `uid`'s: its owner line, or `create`'s UID line.
fn is_mark_of(line: &str, uid: &str) -> bool {
    parse_mark_line(line).is_some_and(|m| m.machine_uid == uid)
        || line.trim().strip_prefix(api::UID_LINE_PREFIX.trim_end()).map(str::trim) == Some(uid)
}

/// `description` without the lines that mark it as machine `uid`'s; every other line as it was
/// (a description that lacked a final newline before the mark was added keeps one: PVE ends
/// every description line with one anyway).
pub fn without_marks(description: &str, uid: &str) -> String {
    description.split_inclusive('\n').filter(|l| !is_mark_of(l, uid)).collect()
}

/// `tags` with the tag of `uid` added, when a PVE tag can hold that UID (PVE refuses a tag
/// with other characters than letters, digits, `_`, `-`, `+`, `.`; a Kubernetes UID is
/// lowercase hex and `-`); `None`: leave the tags as they are.
pub fn mark_tags(tags: &str, uid: &str) -> Option<String> {
    if api::check_uid(uid).is_err() || api::has_uid_tag(tags, uid) {
        return None;
    }
    Some(api::with_uid_tag(tags, uid))
}

/// `tags` without the tag of `uid`, or `None` when they have none.
pub fn unmark_tags(tags: &str, uid: &str) -> Option<String> {
    if !api::has_uid_tag(tags, uid) {
        return None;
    }
    let tag = api::uid_tag(uid);
    Some(api::split_tags(tags).into_iter().filter(|t| *t != tag).collect::<Vec<_>>().join(";"))
}

/// The config write that takes machine `uid`'s marks off a VM whose config has `description`,
/// `tags` and `digest`; empty when it carries none. A value left empty is deleted (PVE keeps
/// no empty description or tag list).
pub fn release_params(description: &str, tags: &str, digest: &str, uid: &str) -> Vec<(String, String)> {
    let mut set = Vec::new();
    let mut delete = Vec::new();
    let new_description = without_marks(description, uid);
    if new_description != description {
        if new_description.trim().is_empty() {
            delete.push("description");
        } else {
            set.push(("description".to_string(), new_description));
        }
    }
    if let Some(new_tags) = unmark_tags(tags, uid) {
        if new_tags.is_empty() {
            delete.push("tags");
        } else {
            set.push(("tags".to_string(), new_tags));
        }
    }
    if set.is_empty() && delete.is_empty() {
        return set;
    }
    if !delete.is_empty() {
        set.push(("delete".to_string(), delete.join(",")));
    }
    if !digest.is_empty() {
        set.push(("digest".to_string(), digest.to_string()));
    }
    set
}

/// How a call finds a machine's VM.
#[derive(Debug, PartialEq, Eq)]
pub enum Locate {
    /// An adopted machine: the VM with this id, while it carries the machine's mark.
    Vmid(u64),
    /// A machine `create` made: the VM tagged with its UID (or so named, with the UID in its
    /// description): the VM name.
    Uid(String),
}

/// A backend id as a VM id: `None` when there is none (absent or empty); `invalid-spec` when it
/// is not a decimal number.
pub fn parse_vmid(backend_id: Option<&str>) -> Result<Option<u64>> {
    let Some(id) = backend_id.map(str::trim).filter(|s| !s.is_empty()) else { return Ok(None) };
    match id.parse::<u64>() {
        Ok(vmid) if id.bytes().all(|b| b.is_ascii_digit()) => Ok(Some(vmid)),
        _ => Err(Error::InvalidSpec(format!("backend id {id:?} is not a Proxmox VE VM id (a decimal number)"))),
    }
}

/// How `machine` is found: by its backend id when it has one, else by its UID.
pub fn locate(machine: &MachineRef) -> Result<Locate> {
    if let Some(vmid) = parse_vmid(machine.backend_id.as_deref())? {
        return Ok(Locate::Vmid(vmid));
    }
    api::check_uid(&machine.uid)?;
    Ok(Locate::Uid(api::vm_name(&machine.namespace, &machine.name)?))
}

/// The VM id `adopt` and `release` act on: theirs is always named by its backend id.
fn required_vmid(machine: &MachineRef) -> Result<u64> {
    parse_vmid(machine.backend_id.as_deref())?.ok_or_else(|| {
        Error::InvalidSpec(format!("machine {}/{} has no backend id: name the Proxmox VE VM id to act on", machine.namespace, machine.name))
    })
}

/// The VM's tags: its config's (what PVE stores), else the listing's.
fn tags_of<'a>(listed: &'a Value, cfg: &'a Value) -> &'a str {
    if cfg.get("tags").is_some() { api::text(cfg, "tags") } else { api::text(listed, "tags") }
}

/// The VM's name: the listing's, else its config's.
fn name_of<'a>(listed: &'a Value, cfg: &'a Value) -> &'a str {
    let name = api::text(listed, "name");
    if name.is_empty() { api::text(cfg, "name") } else { name }
}

/// A VM as found, from its `/cluster/resources` entry, its config, and the power state and
/// addresses read for it.
pub fn found_from(listed: &Value, cfg: &Value, power_state: PowerState, addresses: Vec<Address>) -> FoundMachine {
    let name = name_of(listed, cfg);
    let tags = tags_of(listed, cfg);
    FoundMachine {
        backend_id: api::num(listed.get("vmid")).map(|v| v.to_string()).unwrap_or_default(),
        name: name.to_string(),
        power_state,
        hardware: crate::hardware(cfg),
        addresses,
        failure_domain: api::text(listed, "node").to_string(),
        tags: api::split_tags(tags).into_iter().map(str::to_string).collect(),
        owner: owner_of(api::text(cfg, "description"), tags, name),
        template: api::flag(listed, "template") || api::flag(cfg, "template"),
    }
}

/// Page `page` of the VMs `/cluster/resources` lists on the nodes in `online`, by VM id, with
/// the next page's token and how many were left out for being on a node not online.
pub fn page_of(listed: Vec<Value>, online: &[String], page: Option<&str>) -> Result<(Vec<Value>, Option<String>, usize)> {
    let (here, away): (Vec<Value>, Vec<Value>) = listed.into_iter().partition(|v| online.iter().any(|n| n == api::text(v, "node")));
    let mut vms: Vec<(u64, Value)> = here.into_iter().filter_map(|v| Some((api::num(v.get("vmid"))?, v))).collect();
    vms.sort_by_key(|(vmid, _)| *vmid);
    let (range, next) = page_range(page, vms.len(), PAGE_SIZE)?;
    Ok((vms.drain(range).map(|(_, v)| v).collect(), next, away.len()))
}

/// The VM `vmid` as `/cluster/resources` lists it (templates included), if it is there.
fn listed(pve: &Pve, vmid: u64) -> Result<Option<Value>> {
    Ok(crate::vms(pve)?.into_iter().find(|v| api::num(v.get("vmid")) == Some(vmid)))
}

fn vm(listed: &Value) -> Result<Vm> {
    crate::vm_of(listed, true).ok_or_else(|| Error::Internal(format!("/cluster/resources lists a VM without a vmid: {listed}")))
}

fn vm_config(pve: &Pve, vm: &Vm) -> Result<Value> {
    pve.get(&format!("{}/config", vm.path()))
}

/// The VM of a machine found by its backend id: there, not a template, and carrying the
/// machine's mark; else `not-found` (another's VM is never acted on).
pub(crate) fn marked_vm(pve: &Pve, vmid: u64, uid: &str) -> Result<Vm> {
    let Some(entry) = listed(pve, vmid)? else {
        return Err(Error::NotFound(format!("no Proxmox VE VM {vmid}")));
    };
    if api::flag(&entry, "template") {
        return Err(Error::NotFound(format!("VM {vmid} is a template, not a machine")));
    }
    let vm = vm(&entry)?;
    let cfg = vm_config(pve, &vm)?;
    let owner = owner_of(api::text(&cfg, "description"), tags_of(&entry, &cfg), name_of(&entry, &cfg));
    if !marked_for(owner.as_ref(), uid) {
        let whose = owner.map_or("none".to_string(), |o| format!("machine {} ({})", o.machine_uid, o.machine));
        return Err(Error::NotFound(format!("VM {vmid} does not carry the mark of machine {uid} (its mark: {whose})")));
    }
    Ok(vm)
}

/// The VM listed as `entry`, as found: its config read, and for a running one its power state
/// (paused or not) and guest-agent addresses when its config enables the agent.
fn found(pve: &Pve, entry: &Value) -> Result<FoundMachine> {
    let vm = vm(entry)?;
    let cfg = vm_config(pve, &vm)?;
    let (power_state, addresses) = if api::text(entry, "status") == "running" {
        let state = crate::power_state_of(&pve.get(&format!("{}/status/current", vm.path()))?);
        // An agent that is not enabled is not asked: PVE would wait for it.
        let addresses = if state == PowerState::PoweredOn && crate::snapshot::agent_enabled(&cfg) {
            crate::guest_addresses(pve, &vm).unwrap_or_default()
        } else {
            Vec::new()
        };
        (state, addresses)
    } else {
        (PowerState::PoweredOff, Vec::new())
    };
    Ok(found_from(entry, &cfg, power_state, addresses))
}

/// One page of the cluster's VMs and templates.
pub fn list(config: &ProviderConfig, page: Option<&str>) -> Result<MachinePage> {
    let pve = Pve::connect(config)?;
    let online: Vec<String> = crate::online_nodes(&pve)?.iter().map(|n| api::text(n, "node").to_string()).collect();
    let (entries, next, offline) = page_of(crate::vms(&pve)?, &online, page)?;
    if offline > 0 {
        warn!("{offline} VM(s) on Proxmox VE nodes that are not online are not listed");
    }
    let mut machines = Vec::with_capacity(entries.len());
    for entry in &entries {
        match found(&pve, entry) {
            Ok(f) => machines.push(f),
            // Removed since the listing.
            Err(Error::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(MachinePage { machines, next })
}

/// Stamp `mark` on VM `machine.backend_id` unless it carries a mark already; return it as found.
pub fn adopt(config: &ProviderConfig, machine: &MachineRef, mark: &OwnerMark) -> Result<FoundMachine> {
    let vmid = required_vmid(machine)?;
    if mark.machine_uid.trim().is_empty() {
        return Err(Error::InvalidSpec(format!("the mark for VM {vmid} has no machine UID")));
    }
    let pve = Pve::connect(config)?;
    let Some(entry) = listed(&pve, vmid)? else {
        return Err(Error::NotFound(format!("no Proxmox VE VM {vmid}")));
    };
    let vm = vm(&entry)?;
    let cfg = vm_config(&pve, &vm)?;
    let name = name_of(&entry, &cfg);
    if api::flag(&entry, "template") || api::flag(&cfg, "template") {
        return Err(Error::InvalidSpec(format!("VM {vmid} ({name}) is a template: templates are listed, never adopted")));
    }
    let description = api::text(&cfg, "description");
    let tags = tags_of(&entry, &cfg);
    if let Some(owner) = owner_of(description, tags, name) {
        if owner.machine_uid != mark.machine_uid {
            info!("VM {vmid} ({name}) carries the mark of machine {} ({}); left as it is", owner.machine_uid, owner.machine);
        }
        return found(&pve, &entry);
    }
    let mut params = vec![("description".to_string(), with_mark(description, mark))];
    if let Some(tags) = mark_tags(tags, &mark.machine_uid) {
        params.push(("tags".into(), tags));
    }
    let digest = api::text(&cfg, "digest");
    if !digest.is_empty() {
        params.push(("digest".into(), digest.to_string()));
    }
    pve.request("PUT", &format!("{}/config", vm.path()), &params).map_err(|e| e.context(format_args!("marking VM {vmid} for machine {}", mark.machine)))?;
    info!("VM {vmid} ({name}) on {} adopted by machine {} ({})", vm.node, mark.machine, mark.machine_uid);
    // Read back: what is returned is the mark PVE holds now.
    found(&pve, &entry)
}

/// Bring adopted, stopped VM `machine.backend_id` to `want`: cores, memory, its disks grown
/// (in the order `describe` reports them); a shrink is refused before anything changes.
pub fn reconfigure(config: &ProviderConfig, machine: &MachineRef, want: &HardwareTarget) -> Result<MachineStatus> {
    let pve = Pve::connect(config)?;
    let vm = crate::lookup(&pve, machine)?;
    if crate::power_state_of(&pve.get(&format!("{}/status/current", vm.path()))?) != PowerState::PoweredOff {
        return Err(Error::InvalidSpec(format!("Proxmox VE VM {} is not stopped: its hardware is changed only while it is", vm.vmid)));
    }
    let names: Vec<String> = (0..want.disk_sizes_gib.len()).map(|i| format!("#{i}")).collect();
    let disks: Vec<(&str, u64)> = names.iter().map(String::as_str).zip(want.disk_sizes_gib.iter().copied()).collect();
    crate::reshape(&pve, &vm, want.cpus, want.memory_mib, &disks)?;
    crate::status(&pve, &vm, Vec::new())
}

/// Take `mark` off VM `machine.backend_id`; a VM that is gone or unmarked is success, one
/// carrying another's mark is left as it is.
pub fn release(config: &ProviderConfig, machine: &MachineRef, mark: &OwnerMark) -> Result<()> {
    let vmid = required_vmid(machine)?;
    let pve = Pve::connect(config)?;
    let Some(entry) = listed(&pve, vmid)? else { return Ok(()) };
    let vm = vm(&entry)?;
    let cfg = match vm_config(&pve, &vm) {
        Err(Error::NotFound(_)) => return Ok(()),
        other => other?,
    };
    let description = api::text(&cfg, "description");
    let tags = tags_of(&entry, &cfg);
    match owner_of(description, tags, name_of(&entry, &cfg)) {
        None => return Ok(()),
        Some(owner) if owner.machine_uid != mark.machine_uid => {
            warn!("not releasing VM {vmid}: it carries the mark of machine {} ({}), not of {}", owner.machine_uid, owner.machine, mark.machine_uid);
            return Ok(());
        }
        Some(_) => {}
    }
    let params = release_params(description, tags, api::text(&cfg, "digest"), &mark.machine_uid);
    if params.is_empty() {
        return Ok(());
    }
    match pve.request("PUT", &format!("{}/config", vm.path()), &params) {
        Ok(_) | Err(Error::NotFound(_)) => {}
        Err(e) => return Err(e.context(format_args!("unmarking VM {vmid}"))),
    }
    info!("VM {vmid} released by machine {} ({})", mark.machine, mark.machine_uid);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_sdk::provider::AddressType;
    use serde_json::json;

    const UID: &str = "0a1b2c3d-0000-4000-8000-0000000003aa";

    fn mark(installation: &str) -> OwnerMark {
        OwnerMark { machine_uid: UID.into(), machine: "default/web".into(), installation: installation.into() }
    }

    fn machine_ref(backend_id: Option<&str>) -> MachineRef {
        MachineRef {
            uid: UID.into(),
            name: "web".into(),
            namespace: "default".into(),
            provider_id: None,
            failure_domain: String::new(),
            backend_id: backend_id.map(str::to_string),
        }
    }

    #[test]
    fn the_owner_line_has_a_fixed_form_and_round_trips_any_value() {
        assert_eq!(
            mark_line(&mark("c1/i1")),
            "banlieue-owner: machine-uid=0a1b2c3d-0000-4000-8000-0000000003aa machine=default/web installation=c1/i1"
        );
        assert_eq!(mark_line(&mark("")), format!("banlieue-owner: machine-uid={UID} machine=default/web installation="));
        for installation in ["", "c1", "c1/i 2", "50%", "a=b", "tab\there", "é\nx"] {
            assert_eq!(parse_mark_line(&mark_line(&mark(installation))), Some(mark(installation)), "{installation:?}");
        }
        assert!(mark_line(&mark("c1/i 2")).ends_with("installation=c1/i%202"));
    }

    #[test]
    fn owner_lines_need_a_uid_and_skip_what_they_do_not_know() {
        assert_eq!(parse_mark_line("  banlieue-owner:   installation=x   machine-uid=u  later=1 machine=ns/n "), Some(OwnerMark {
            machine_uid: "u".into(),
            machine: "ns/n".into(),
            installation: "x".into()
        }));
        assert_eq!(parse_mark_line("banlieue-owner: machine=ns/n"), None);
        assert_eq!(parse_mark_line("banlieue-owner: machine-uid="), None);
        assert_eq!(parse_mark_line("see banlieue-owner: machine-uid=u"), None, "only a line that starts with it");
        assert_eq!(unescape("100%"), "100%");
        assert_eq!(unescape("%zz%4"), "%zz%4");
    }

    #[test]
    fn the_mark_is_added_and_removed_leaving_the_users_description_as_it_was() {
        for user in ["", "Hand made by ops.\n", "Hand made by ops.\nDo not touch on Fridays.\n", "a\r\nb\r\n"] {
            let marked = with_mark(user, &mark("c1"));
            assert!(marked.starts_with(user) && marked.ends_with(&format!("{}\n", mark_line(&mark("c1")))), "{marked:?}");
            assert_eq!(owner_of(&marked, "", "handmade"), Some(mark("c1")));
            assert_eq!(without_marks(&marked, UID), user, "{user:?}");
        }
        // No final newline: one is added before the mark, and stays (PVE adds it anyway).
        assert_eq!(with_mark("notes", &mark("")), format!("notes\n{}\n", mark_line(&mark(""))));
        assert_eq!(without_marks(&with_mark("notes", &mark("")), UID), "notes\n");
        // A mark the user moved up is still found and removed; another machine's is kept.
        let other = OwnerMark { machine_uid: "other".into(), ..mark("") };
        let moved = format!("{}\nnotes\n{}\n", mark_line(&mark("")), mark_line(&other));
        assert_eq!(without_marks(&moved, UID), format!("notes\n{}\n", mark_line(&other)));
    }

    #[test]
    fn vms_create_made_report_their_own_mark_without_installation() {
        let made = api::description("default", "existing", UID);
        let owner = owner_of(&made, &api::uid_tag(UID), "existing.default").unwrap();
        assert_eq!(owner, OwnerMark { machine_uid: UID.into(), machine: "default/existing".into(), installation: String::new() });
        // Only the tag left (a user rewrote the description): the machine from the VM's name.
        let owner = owner_of("my notes", &format!("prod;{}", api::uid_tag(UID)), "db.team-a").unwrap();
        assert_eq!((owner.machine_uid.as_str(), owner.machine.as_str()), (UID, "team-a/db"));
        // A tag that merely starts like ours is not a mark; nor is a note naming a machine.
        assert_eq!(owner_of("banlieue machine x/y\n", "banlieue-team;prod", "handmade"), None);
        assert_eq!(owner_of("", "", "handmade"), None);
        // An owner line wins over create's mark (a clone being configured carries both kinds).
        let both = format!("{made}{}\n", mark_line(&OwnerMark { machine_uid: "u2".into(), ..mark("c1") }));
        assert_eq!(owner_of(&both, "", "x").unwrap().machine_uid, "u2");
    }

    #[test]
    fn only_the_marked_machine_is_found_by_backend_id() {
        assert!(marked_for(Some(&mark("")), UID));
        assert!(!marked_for(Some(&mark("")), "0a1b2c3d-0000-4000-8000-0000000003ab"));
        assert!(!marked_for(None, UID));
        assert!(!marked_for(Some(&OwnerMark { machine_uid: String::new(), ..mark("") }), ""));
    }

    #[test]
    fn tags_carry_the_uid_only_where_pve_takes_it() {
        assert_eq!(mark_tags("prod;web", UID), Some(format!("prod;web;banlieue-{UID}")));
        assert_eq!(mark_tags("", UID), Some(format!("banlieue-{UID}")));
        assert_eq!(mark_tags(&format!("banlieue-{UID}"), UID), None, "already there");
        assert_eq!(mark_tags("prod", "Upper/Case uid"), None, "PVE refuses such a tag");
        assert_eq!(unmark_tags(&format!("prod;banlieue-{UID};web"), UID), Some("prod;web".into()));
        assert_eq!(unmark_tags(&format!("banlieue-{UID}"), UID), Some(String::new()));
        assert_eq!(unmark_tags("prod", UID), None);
    }

    #[test]
    fn release_writes_only_what_changes_and_deletes_what_it_empties() {
        let user = "Hand made by ops.\n";
        let marked = with_mark(user, &mark("c1"));
        let tags = format!("prod;banlieue-{UID}");
        assert_eq!(
            release_params(&marked, &tags, "d1", UID),
            vec![("description".into(), user.into()), ("tags".into(), "prod".into()), ("digest".into(), "d1".into())]
        );
        let alone = with_mark("", &mark(""));
        assert_eq!(
            release_params(&alone, &format!("banlieue-{UID}"), "d1", UID),
            vec![("delete".into(), "description,tags".into()), ("digest".into(), "d1".into())]
        );
        assert!(release_params(user, "prod", "d1", UID).is_empty(), "nothing of this machine's");
        // create's own mark goes too: a VM let go of is found unmanaged again.
        let made = api::description("default", "existing", UID);
        assert_eq!(release_params(&made, "", "", UID), vec![("description".into(), "banlieue machine default/existing\n".into())]);
    }

    #[test]
    fn a_backend_id_chooses_the_vmid_lookup() {
        assert_eq!(locate(&machine_ref(Some("101"))).unwrap(), Locate::Vmid(101));
        assert_eq!(locate(&machine_ref(Some(" 101 "))).unwrap(), Locate::Vmid(101));
        assert_eq!(locate(&machine_ref(None)).unwrap(), Locate::Uid("web.default".into()));
        assert_eq!(locate(&machine_ref(Some(""))).unwrap(), Locate::Uid("web.default".into()));
        for bad in ["vm-101", "+101", "-1", "1.5", "99999999999999999999999"] {
            assert!(matches!(locate(&machine_ref(Some(bad))), Err(Error::InvalidSpec(_))), "{bad}");
        }
        // A machine found by its backend id needs no UID fit for a tag.
        let mut r = machine_ref(Some("7"));
        r.uid = "Not/A Tag".into();
        assert_eq!(locate(&r).unwrap(), Locate::Vmid(7));
        assert!(matches!(required_vmid(&machine_ref(None)), Err(Error::InvalidSpec(_))));
        assert!(matches!(required_vmid(&machine_ref(Some("  "))), Err(Error::InvalidSpec(_))));
        assert_eq!(required_vmid(&machine_ref(Some("200"))).unwrap(), 200);
    }

    /// VM 200 as fakepve lists it (`/cluster/resources?type=vm`) and its config, adopted.
    fn fakepve_200() -> (Value, Value) {
        let listed = json!({"id": "qemu/200", "type": "qemu", "node": "pve1", "name": "handmade", "vmid": 200, "status": "running",
                            "template": 0, "maxmem": 4294967296u64, "maxcpu": 2, "tags": "prod;web"});
        let cfg = json!({"cores": 2, "sockets": 1, "memory": "4096", "scsi0": "local-lvm:vm-200-disk-0,size=10G",
                         "net0": "virtio=BC:24:11:00:02:00,bridge=vmbr0", "agent": "1", "tags": format!("prod;web;banlieue-{UID}"),
                         "description": format!("Hand made by ops.\nDo not touch on Fridays.\n{}\n", mark_line(&mark("c1"))),
                         "name": "handmade", "digest": "73cf3288734cc6b41e7a8282af76c47429629b90"});
        (listed, cfg)
    }

    #[test]
    fn a_listed_vm_becomes_a_found_machine() {
        let (listed, cfg) = fakepve_200();
        let address = Address { type_: AddressType::InternalIp, address: "192.0.2.10".into() };
        let f = found_from(&listed, &cfg, PowerState::PoweredOn, vec![address.clone()]);
        assert_eq!((f.backend_id.as_str(), f.name.as_str(), f.failure_domain.as_str()), ("200", "handmade", "pve1"));
        assert_eq!(f.power_state, PowerState::PoweredOn);
        assert_eq!(f.hardware, crate::hardware(&cfg));
        assert_eq!((f.hardware.cpus, f.hardware.memory_mib, f.hardware.disks[0].size_gib), (2, 4096, 10));
        assert_eq!(f.addresses, [address]);
        assert_eq!(f.tags, ["prod".to_string(), "web".into(), format!("banlieue-{UID}")], "the config's tags, ours included");
        assert_eq!(f.owner, Some(mark("c1")));
        assert!(!f.template);

        let template = json!({"vmid": 9000, "node": "pve1", "name": "ubuntu-template", "status": "stopped", "template": 1});
        let f = found_from(&template, &json!({"cores": 1, "memory": "1024", "template": 1}), PowerState::PoweredOff, vec![]);
        assert!(f.template && f.owner.is_none() && f.tags.is_empty());
        assert_eq!(f.backend_id, "9000");
    }

    #[test]
    fn pages_hold_a_hundred_vms_by_vmid_on_online_nodes() {
        let online = vec!["pve1".to_string(), "pve2".to_string()];
        let mut listed: Vec<Value> = (0..250u64).rev().map(|i| json!({"vmid": 100 + i, "node": if i % 2 == 0 { "pve1" } else { "pve2" }})).collect();
        listed.push(json!({"vmid": 5, "node": "pve3"}));
        listed.push(json!({"node": "pve1"}));
        let ids = |page: &[Value]| page.iter().map(|v| api::num(v.get("vmid")).unwrap()).collect::<Vec<_>>();
        let (first, next, offline) = page_of(listed.clone(), &online, None).unwrap();
        assert_eq!((ids(&first)[0], ids(&first)[99], first.len(), next.as_deref(), offline), (100, 199, 100, Some("100"), 1));
        let (second, next, _) = page_of(listed.clone(), &online, next.as_deref()).unwrap();
        assert_eq!((ids(&second)[0], next.as_deref()), (200, Some("200")));
        let (last, next, _) = page_of(listed.clone(), &online, next.as_deref()).unwrap();
        assert_eq!((ids(&last).len(), ids(&last)[49], next), (50, 349, None));
        assert!(matches!(page_of(listed, &online, Some("vm-100")), Err(Error::InvalidSpec(_))));
        assert_eq!(page_of(vec![], &online, None).unwrap(), (vec![], None, 0));
    }
}
