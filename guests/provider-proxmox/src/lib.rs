//! The Proxmox VE provider driver: one PVE cluster per Provider, reached only
//! through the host's `http` capability (the grant is the Provider's endpoint),
//! `secrets` and `session`. It keeps no state: PVE is the source of truth, and
//! every call is idempotent.
//!
//! # Authentication
//!
//! Chosen by the keys of the Provider's Secret: `token-id` (`USER@REALM!NAME`,
//! or `NAME` with `username`) + `token-secret` send
//! `Authorization: PVEAPIToken=…` on every request (no session); otherwise
//! `username` + `password` log in (`POST /access/ticket`) and the ticket and CSRF
//! token are kept in the host's session store (one string, `ticket\ncsrf`,
//! for an hour) through [`banlieue_sdk::session::with_session`]: a call logs in
//! only when no ticket is stored or PVE answered 401. Refused credentials are
//! `denied`.
//!
//! # Mapping
//!
//! - A failure domain is a PVE node (labels `topology.kubernetes.io/zone` and
//!   `proxmox.banlieue.io/node` = node name).
//! - Machine `namespace/name` is the VM named `{name}.{namespace}` (a DNS name:
//!   a namespace is a single label, so the last label is the namespace).
//! - The Machine UID is the idempotency key. It is in the VM's tags as
//!   `banlieue-<uid>` (PVE tags allow lowercase letters, digits and `-`, which is
//!   what a Kubernetes UID is made of) and in its description as a
//!   `banlieue-uid: <uid>` line. The description is set by the clone request
//!   itself, the tag only by the final config write, so a VM that has the
//!   description but not the tag is a clone whose configuration was interrupted:
//!   the next `create` finds it (by name, then description) and finishes it, and
//!   never clones twice.
//! - The provider ID is `proxmox://<node>/<vmid>` (informational: the driver
//!   always finds the VM by its UID tag, or an adopted one by its VM id, so a
//!   migration does not lose it).
//! - Discovery and adoption ([`adopt`]): a VM made by hand is a found machine whose
//!   backend id is its VM id (`101`) and whose failure domain is its node. Adopting it
//!   writes one line into its description, `banlieue-owner: machine-uid=<uid>
//!   machine=<namespace/name> installation=<id>` (values percent-encoded where they hold
//!   `%`, white space or control characters), and tags it `banlieue-<uid>` like the VMs
//!   `create` makes; the rest of the description and its tags, power, hardware and VM id
//!   are left as they are. Every call on a machine ref with a backend id finds the VM by
//!   that id, and only while it carries that machine's mark (else `not-found`); a VM
//!   `create` made reports its own mark (`banlieue-uid:` line) as owner, without installation.
//! - The boot disk is a full clone (`full=1`) of the template
//!   (`ImageSource::Template`: a VMID, or the name of a template VM) on storage
//!   `disks[0].target`, onto node `failure-domain` (a clone to another node
//!   needs shared storage, as in PVE); it is grown to `size-gib` if larger.
//!   Further disks are new `scsi<N>` volumes `<target>:<size-gib>`.
//! - Config written in one `PUT …/config`: `cores`, `memory`, `bios`
//!   (`ovmf` for UEFI), `agent=1`, `net<i>=virtio[=<kept MAC>],bridge=<nic.network>`
//!   (template NICs beyond the machine's are deleted), a cloud-init drive
//!   `<boot storage>:cloudinit` on `ide2` (else the first free IDE slot), `ipconfig<i>=ip=dhcp`,
//!   from a `#cloud-config` user-data its `user`, `password` and
//!   `ssh_authorized_keys` as `ciuser`, `cipassword`, `sshkeys` (PVE's API cannot
//!   store a whole user-data document: `cicustom` needs a snippet file, and
//!   snippets cannot be uploaded through the API; other keys are reported in the
//!   `UserData` condition), then the UID tag.
//!
//! # Calls
//!
//! - `probe`: `/version`; per online node (`/nodes`): CPUs, free memory,
//!   the mapped storages that exist there, are active and hold VM images
//!   (`/nodes/{node}/storage`; storage = their free space), the mapped bridges
//!   that exist there (`/nodes/{node}/network`). A class whose storage or bridge
//!   a node lacks is not offered on that node.
//! - `create`: an existing VM with the UID is returned (finished and powered as
//!   asked); else the spec is checked against PVE (template, node, storages,
//!   bridges: `invalid-spec` naming what is missing, before anything is made),
//!   a VMID from `/cluster/nextid` (PVE does not reserve it: after a collision a
//!   random one above it, in a window that doubles per attempt), clone, wait for
//!   the task, configure, start if asked. A clone task that fails leaves nothing
//!   (PVE removes it; the driver deletes a leftover carrying the UID).
//! - `describe`: `status/current`; addresses from the guest agent
//!   (`agent/network-get-interfaces`) when it answers (no agent: no addresses,
//!   phase `waiting-for-address`, not an error).
//! - `set-power`: on is `status/start`; off follows the power-off mode
//!   ([`banlieue_sdk::provider::power_off`]): the request is `status/shutdown`
//!   with `timeout` = the soft timeout, hard is `status/stop`
//!   (`overrule-shutdown=1`), both tasks waited for. Suspend is refused.
//! - `delete`: power off per the mode, `DELETE …?purge=1&destroy-unreferenced-disks=1`,
//!   wait for the task; a VM that is not there is success. An adopted VM is destroyed
//!   the same way.
//! - `list-machines` ([`adopt`]): `/cluster/resources?type=vm` less the VMs on nodes not
//!   online, by VM id, 100 a page ([`banlieue_sdk::provider::page_range`]: the token is the
//!   index of the page's first VM); for the page's VMs their config (hardware as `describe`
//!   reports it, tags, mark), `status/current` if running, and guest-agent addresses when the
//!   config enables the agent. `adopt`: `PUT …/config` of `description` and `tags` with the
//!   config's `digest` (a racing change fails it; the retry finds the mark there) unless the
//!   VM carries a mark already (returned as it is); a template is `invalid-spec`. `release`:
//!   the machine's mark lines and tag removed (`delete` when that empties them), another's
//!   mark left with a warning; a VM gone is success.
//! - Snapshots ([`snapshot`]): `…/snapshot` (a snapshot already named as asked
//!   is returned; `vmstate=1` for memory; quiesce needs the guest agent enabled
//!   and answering), `…/snapshot/{name}/rollback`, `DELETE …/snapshot/{name}`,
//!   each task waited for; the id is the snapshot's name. `snapshot-clone` is the create
//!   path's clone of the source VM with `snapname` (always `full=1`: PVE clones linked only
//!   from templates, which hold no snapshots), then the same configuration.
//! - `import-image` / `delete-image`: a VMImage `url` source becomes a template
//!   named `image-{vmimage}-{12 hex of its sha256}`: PVE downloads the URL
//!   (`download-url`, checksum checked) and imports it into a new VM's disk
//!   (`import-from`), which becomes the template ([`import`]).
//! - `disk-import` (a move that carries a VM's disks here): PVE downloads each carried disk
//!   from the one-time URL the host serves it at and imports it into a new VM's `scsi<i>`
//!   (`import-from`), which is named, described and configured as `create` configures a clone
//!   and left powered off; `create` then finds it by its UID tag as any machine's ([`carry`]).
//!
//! # Moves
//!
//! A VM moves here with its disks (`disk-import`), not away (no `disk-export`, so the host
//! refuses Proxmox VE as the source of a move that carries disks): PVE's API offers no way to
//! read a VM disk's bytes over HTTP. Storage content (`GET …/storage/{storage}/content/{volume}`)
//! answers a volume's path and size, not its bytes; `POST` there copies it to another storage
//! of the cluster; `download-url` and `upload` only bring files in; `file-restore/download`
//! extracts files from inside Proxmox Backup Server backups; `vzdump` writes backups to a
//! storage (`stdout` is for the command line). A VM leaves by hand: a backup (`vzdump <vmid>
//! --mode stop`) restored on another PVE (`qmrestore`), or on the node the disk's file
//! (`pvesm path <volid>`) converted with `qemu-img convert -O qcow2` and brought to the other
//! backend as an image (PVE has `qm disk import`, no `qm disk export`; `pvesm export` streams
//! PVE's own migration formats, on the command line only). Otherwise the VM moves with
//! `spec.moveStrategy: Recreate`, made afresh from its image.

use banlieue_sdk::provider::{
    Address, DiskStatus, Driver, FailureDomain, Firmware, FoundMachine, Hardware, ImageRequest, ImageSource, ImageStatus, Inventory, Machine, MachinePage,
    MachinePhase, MachineRef, MachineStatus, NicStatus, OwnerMark, PowerOff, PowerOffMode, PowerOffOps, PowerState, ProviderConfig, Result, Snapshot,
    SnapshotRequest, UserDataFormat, condition, power_off,
};
use banlieue_sdk::{Error, info, warn};
use serde_json::Value;

pub mod adopt;
pub mod api;
pub mod carry;
pub mod console;
pub mod import;
pub mod pve;
pub mod snapshot;

use pve::Pve;

/// The Proxmox VE driver.
pub struct Proxmox;

const CLONE_TIMEOUT_MS: u64 = 600_000;
const TASK_TIMEOUT_MS: u64 = 120_000;
const CLONE_ATTEMPTS: u32 = 8;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A random number from the host's WASI random source (std seeds `RandomState` from it).
fn random() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new().build_hasher().finish()
}

/// A machine created powered off is stopped hard if found running (nothing to shut down gracefully yet).
const CREATE_POWER_OFF: PowerOff = PowerOff { mode: PowerOffMode::Hard, timeout_ms: 0 };

/// A VM as `/cluster/resources` lists it.
#[derive(Clone, Debug)]
struct Vm {
    node: String,
    vmid: u64,
    lock: String,
    /// Its configuration is complete: it carries the UID tag, or it was adopted (found by its
    /// VM id: its configuration is its owner's, never the driver's to finish).
    tagged: bool,
}

impl Vm {
    fn path(&self) -> String {
        format!("/nodes/{}/qemu/{}", api::encode(&self.node), self.vmid)
    }
}

/// The cluster's qemu VMs and templates as `/cluster/resources` lists them.
pub(crate) fn vms(pve: &Pve) -> Result<Vec<Value>> {
    match pve.get("/cluster/resources?type=vm")? {
        Value::Array(a) => Ok(a.into_iter().filter(|v| api::text(v, "type") == "qemu").collect()),
        other => Err(Error::Internal(format!("/cluster/resources: expected a list, got {other}"))),
    }
}

pub(crate) fn vm_of(v: &Value, tagged: bool) -> Option<Vm> {
    Some(Vm {
        node: api::text(v, "node").to_string(),
        vmid: api::num(v.get("vmid"))?,
        lock: api::text(v, "lock").to_string(),
        tagged,
    })
}

/// The VM of this machine: tagged with its UID, or (an interrupted create)
/// named after it with the UID in its description.
pub(crate) fn find(pve: &Pve, uid: &str, vm_name: &str) -> Result<Option<Vm>> {
    let all = vms(pve)?;
    let mut tagged: Vec<Vm> = all
        .iter()
        .filter(|v| !api::flag(v, "template") && api::has_uid_tag(api::text(v, "tags"), uid))
        .filter_map(|v| vm_of(v, true))
        .collect();
    tagged.sort_by_key(|v| v.vmid);
    if tagged.len() > 1 {
        // A clone of this machine's snapshot carries its tag until the clone is configured
        // for its own machine; its description (written by the clone request) names that one.
        for vm in &tagged {
            let cfg = match pve.get(&format!("{}/config", vm.path())) {
                Ok(c) => c,
                Err(Error::NotFound(_)) => continue,
                Err(e) => return Err(e),
            };
            if api::description_has_uid(api::text(&cfg, "description"), uid) {
                return Ok(Some(vm.clone()));
            }
        }
    }
    if let Some(first) = tagged.first() {
        if tagged.len() > 1 {
            warn!("{} VMs carry the tag of machine {uid}; using VM {}", tagged.len(), first.vmid);
        }
        return Ok(Some(first.clone()));
    }
    for v in all.iter().filter(|v| api::text(v, "name") == vm_name && !api::flag(v, "template")) {
        let Some(vm) = vm_of(v, false) else { continue };
        let cfg = match pve.get(&format!("{}/config", vm.path())) {
            Ok(c) => c,
            Err(Error::NotFound(_)) => continue,
            Err(e) => return Err(e),
        };
        if api::description_has_uid(api::text(&cfg, "description"), uid) {
            return Ok(Some(vm));
        }
    }
    Ok(None)
}

/// The VM of the machine a call names, the one way every call that takes a machine ref finds
/// it: an adopted machine (a backend id) by its VM id, while the VM carries the machine's mark;
/// another by its UID as `create` made it.
pub(crate) fn lookup(pve: &Pve, machine: &MachineRef) -> Result<Vm> {
    match adopt::locate(machine)? {
        adopt::Locate::Vmid(vmid) => adopt::marked_vm(pve, vmid, &machine.uid),
        adopt::Locate::Uid(name) => find(pve, &machine.uid, &name)?
            .ok_or_else(|| Error::NotFound(format!("no Proxmox VM carries machine UID {} ({name})", machine.uid))),
    }
}

/// `(node, vmid, config)` of the template an image names: a VMID, or a template's name.
fn resolve_template(pve: &Pve, image: &ImageSource) -> Result<(String, u64)> {
    let ImageSource::Template(spec) = image else {
        return Err(Error::InvalidSpec(
            "the Proxmox driver clones templates: the image source must be a template (VMID or template name)".into(),
        ));
    };
    let spec = spec.trim();
    let all = vms(pve)?;
    let found: Vec<&Value> = match spec.parse::<u64>() {
        Ok(vmid) => all.iter().filter(|v| api::num(v.get("vmid")) == Some(vmid)).collect(),
        Err(_) => all.iter().filter(|v| api::text(v, "name") == spec && api::flag(v, "template")).collect(),
    };
    match found.as_slice() {
        [v] => Ok((api::text(v, "node").to_string(), api::num(v.get("vmid")).unwrap_or(0))),
        [] => Err(Error::InvalidSpec(format!("template {spec:?} does not exist on this Proxmox VE cluster"))),
        _ => Err(Error::InvalidSpec(format!("template name {spec:?} is ambiguous: {} templates have it", found.len()))),
    }
}

pub(crate) fn online_nodes(pve: &Pve) -> Result<Vec<Value>> {
    match pve.get("/nodes")? {
        Value::Array(a) => Ok(a.into_iter().filter(|n| api::text(n, "status") == "online").collect()),
        other => Err(Error::Internal(format!("/nodes: expected a list, got {other}"))),
    }
}

/// Storages of a node that exist, are enabled and active, and hold VM images: name -> free bytes.
fn image_storages(pve: &Pve, node: &str) -> Result<Vec<(String, u64)>> {
    let list = pve.get(&format!("/nodes/{}/storage", api::encode(node)))?;
    Ok(list
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| {
            api::num(s.get("active")).unwrap_or(1) != 0
                && api::num(s.get("enabled")).unwrap_or(1) != 0
                && api::text(s, "content").split(',').any(|c| c.trim() == "images")
        })
        .map(|s| (api::text(s, "storage").to_string(), api::num(s.get("avail")).unwrap_or(0)))
        .collect())
}

/// Bridges of a node (Linux and OVS).
fn bridges(pve: &Pve, node: &str) -> Result<Vec<String>> {
    let list = pve.get(&format!("/nodes/{}/network", api::encode(node)))?;
    Ok(list
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| matches!(api::text(n, "type"), "bridge" | "OVSBridge"))
        .map(|n| api::text(n, "iface").to_string())
        .collect())
}

struct Ops<'a> {
    pve: &'a Pve,
    vm: &'a Vm,
    timeout_s: u32,
}

impl PowerOffOps for Ops<'_> {
    fn request_shutdown(&mut self) -> Result<()> {
        let params = [("timeout".to_string(), self.timeout_s.max(1).to_string()), ("forceStop".to_string(), "0".to_string())];
        match self.pve.task("POST", &format!("{}/status/shutdown", self.vm.path()), &params) {
            Ok(_) => Ok(()),
            Err(e) if e.message().contains("not running") => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn hard_off(&mut self) -> Result<()> {
        let params = [("overrule-shutdown".to_string(), "1".to_string())];
        match self.pve.task("POST", &format!("{}/status/stop", self.vm.path()), &params) {
            Ok(upid) => self.pve.wait_task(&upid, TASK_TIMEOUT_MS, &format!("stopping VM {}", self.vm.vmid))?,
            Err(e) if e.message().contains("not running") => {}
            Err(e) => return Err(e),
        }
        if self.is_off()? {
            Ok(())
        } else {
            Err(Error::Unavailable(format!("VM {} is still running after status/stop", self.vm.vmid)))
        }
    }

    fn is_off(&mut self) -> Result<bool> {
        let st = self.pve.get(&format!("{}/status/current", self.vm.path()))?;
        Ok(api::text(&st, "status") != "running")
    }
}

fn stop(pve: &Pve, vm: &Vm, mode: &PowerOff) -> Result<()> {
    let mut ops = Ops { pve, vm, timeout_s: mode.timeout_ms.div_ceil(1000) };
    power_off(&mut ops, mode)
}

fn start(pve: &Pve, vm: &Vm) -> Result<()> {
    let st = pve.get(&format!("{}/status/current", vm.path()))?;
    if api::text(&st, "status") == "running" {
        return Ok(());
    }
    let upid = pve.task("POST", &format!("{}/status/start", vm.path()), &[])?;
    pve.wait_task(&upid, TASK_TIMEOUT_MS, &format!("starting VM {}", vm.vmid))
}

fn drive_power(pve: &Pve, vm: &Vm, state: PowerState) -> Result<()> {
    match state {
        PowerState::PoweredOn => start(pve, vm),
        PowerState::PoweredOff => stop(pve, vm, &CREATE_POWER_OFF),
        PowerState::Suspended => Err(Error::InvalidSpec("the Proxmox driver does not suspend machines".into())),
    }
}

/// The power state a `status/current` answer says: a running VM whose QEMU is paused is suspended.
pub(crate) fn power_state_of(st: &Value) -> PowerState {
    match (api::text(st, "status"), api::text(st, "qmpstatus")) {
        ("running", "paused") => PowerState::Suspended,
        ("running", _) => PowerState::PoweredOn,
        _ => PowerState::PoweredOff,
    }
}

/// The guest's addresses as its QEMU guest agent reports them (an error when it does not answer).
pub(crate) fn guest_addresses(pve: &Pve, vm: &Vm) -> Result<Vec<Address>> {
    Ok(api::agent_addresses(&pve.get(&format!("{}/agent/network-get-interfaces", vm.path()))?))
}

/// The machine's status as PVE has it.
pub(crate) fn status(pve: &Pve, vm: &Vm, extra: Vec<banlieue_sdk::provider::Condition>) -> Result<MachineStatus> {
    let st = pve.get(&format!("{}/status/current", vm.path()))?;
    let power_state = power_state_of(&st);
    let running = power_state != PowerState::PoweredOff;
    let paused = power_state == PowerState::Suspended;
    let lock = api::text(&st, "lock").to_string();
    let lock = if lock.is_empty() { vm.lock.clone() } else { lock };
    let (addresses, agent) = if running && !paused {
        match guest_addresses(pve, vm) {
            Ok(a) => {
                let n = a.len();
                (a, condition("GuestAgent", true, "Answering", format!("the guest agent reported {n} address(es)")))
            }
            Err(e) => (Vec::new(), condition("GuestAgent", false, "NotAnswering", e.message().to_string())),
        }
    } else {
        (Vec::new(), condition("GuestAgent", false, "NotRunning", "the VM is not running"))
    };
    let phase = if lock == "clone" || lock == "create" {
        MachinePhase::Cloning
    } else if !vm.tagged {
        MachinePhase::Configuring
    } else if running && addresses.is_empty() {
        MachinePhase::WaitingForAddress
    } else if running {
        MachinePhase::Running
    } else {
        MachinePhase::PoweredOff
    };
    let mut conditions = vec![condition(
        "PoweredOn",
        running,
        if running { "Running" } else { "Stopped" },
        format!("VM {} on node {} is {}", vm.vmid, vm.node, api::text(&st, "status")),
    )];
    conditions.push(agent);
    if !lock.is_empty() {
        conditions.push(condition("Locked", true, "ConfigLock", format!("the VM config is locked ({lock})")));
    }
    conditions.extend(extra);
    let hardware = if lock.is_empty() { Some(hardware(&pve.get(&format!("{}/config", vm.path()))?)) } else { None };
    Ok(MachineStatus {
        provider_id: api::provider_id(&vm.node, vm.vmid),
        hardware,
        power_state,
        addresses,
        conditions,
        provisioned: vm.tagged && lock.is_empty(),
        phase,
    })
}

/// The boot disk's config key: the first entry of the boot order that is a disk, else the first disk.
fn boot_disk(cfg: &Value) -> Option<String> {
    let is_disk = |k: &str| {
        let v = api::text(cfg, k);
        !v.is_empty() && !v.contains("media=cdrom") && !v.contains(":cloudinit") && api::drive_storage(v).is_some()
    };
    if let Some(order) = api::text(cfg, "boot").strip_prefix("order=") {
        if let Some(k) = order.split(';').find(|k| is_disk(k)) {
            return Some(k.to_string());
        }
    }
    for prefix in ["scsi", "virtio", "sata", "ide"] {
        for i in 0..31 {
            let k = format!("{prefix}{i}");
            if is_disk(&k) {
                return Some(k);
            }
        }
    }
    None
}

/// The VM's disk keys: the boot disk first, then the others in bus and index order
/// (`scsi1` before `scsi2`): the order the machine's disks were made in.
fn disk_keys(cfg: &Value) -> Vec<String> {
    let boot = boot_disk(cfg);
    let is_disk = |v: &str| !v.contains("media=cdrom") && !v.contains(":cloudinit") && api::drive_storage(v).is_some();
    let mut keys: Vec<String> = boot.iter().cloned().collect();
    for prefix in ["scsi", "virtio", "sata", "ide"] {
        for i in 0..31 {
            let k = format!("{prefix}{i}");
            if Some(&k) != boot.as_ref() && is_disk(api::text(cfg, &k)) {
                keys.push(k);
            }
        }
    }
    keys
}

/// The VM's hardware as its config says: cores × sockets, memory, each disk's size and
/// volume (`storage:vm-100-disk-0`), each NIC's MAC and bridge. Disks and NICs are named by
/// the host, by position.
pub(crate) fn hardware(cfg: &Value) -> Hardware {
    let number = |k: &str| cfg.get(k).and_then(|v| v.as_u64().or_else(|| v.as_str()?.parse().ok()));
    let disks = disk_keys(cfg)
        .iter()
        .map(|k| {
            let value = api::text(cfg, k);
            DiskStatus { name: String::new(), size_gib: drive_size_gib(value).unwrap_or(0), id: value.split(',').next().unwrap_or_default().to_string() }
        })
        .collect();
    let nics = (0..32)
        .filter_map(|i| cfg.get(format!("net{i}")).and_then(Value::as_str))
        .map(|v| NicStatus {
            name: String::new(),
            mac: v.split(',').find_map(|p| p.split_once('=').filter(|(_, m)| m.len() == 17).map(|(_, m)| m.to_ascii_lowercase())).unwrap_or_default(),
            network: api::net_bridge(v).unwrap_or_default().to_string(),
        })
        .collect();
    let cpus = number("cores").unwrap_or(1) * number("sockets").unwrap_or(1);
    Hardware { cpus: u32::try_from(cpus).unwrap_or(u32::MAX), memory_mib: number("memory").unwrap_or(0), disks, nics }
}

/// Bring a stopped, configured VM to the machine's cores, memory and disk sizes (disks
/// matched by position; never shrunk: refused). A disk the VM lacks is not added here:
/// describe shows it missing, and the host says so.
pub(crate) fn apply_hardware(pve: &Pve, vm: &Vm, machine: &Machine) -> Result<()> {
    let disks: Vec<(&str, u64)> = machine.disks.iter().map(|d| (d.name.as_str(), d.size_gib)).collect();
    reshape(pve, vm, machine.cpus, machine.memory_mib, &disks)
}

/// Bring a stopped VM to `cpus`, `memory_mib` and each disk (by position, named for
/// messages) to its size; every disk is checked before anything changes, so a shrink
/// refused changes nothing.
pub(crate) fn reshape(pve: &Pve, vm: &Vm, cpus: u32, memory_mib: u64, disks: &[(&str, u64)]) -> Result<()> {
    let cfg = pve.get(&format!("{}/config", vm.path()))?;
    let have = hardware(&cfg);
    let keys = disk_keys(&cfg);
    let mut grow = Vec::new();
    for (((name, gib), key), had) in disks.iter().zip(&keys).zip(&have.disks) {
        if *gib < had.size_gib {
            return Err(Error::InvalidSpec(format!("disk {name} ({key}) of VM {} holds {} GiB; it is never shrunk to {gib} GiB", vm.vmid, had.size_gib)));
        }
        if *gib > had.size_gib {
            grow.push((key.clone(), *gib));
        }
    }
    if have.cpus != cpus || have.memory_mib != memory_mib {
        info!("reconfiguring VM {}: {cpus} cores, {memory_mib} MiB (was {}, {})", vm.vmid, have.cpus, have.memory_mib);
        let params = [("cores".to_string(), cpus.max(1).to_string()), ("sockets".to_string(), "1".to_string()), ("memory".to_string(), memory_mib.to_string())];
        pve.request("PUT", &format!("{}/config", vm.path()), &params).map_err(|e| e.context(format_args!("reconfiguring VM {}", vm.vmid)))?;
    }
    for (key, gib) in grow {
        info!("growing {key} of VM {} to {gib} GiB", vm.vmid);
        let params = [("disk".to_string(), key.clone()), ("size".to_string(), format!("{gib}G"))];
        if let Value::String(upid) = pve.request("PUT", &format!("{}/resize", vm.path()), &params).map_err(|e| e.context(format_args!("growing {key} of VM {}", vm.vmid)))? {
            if upid.starts_with("UPID:") {
                pve.wait_task(&upid, TASK_TIMEOUT_MS, &format!("resizing {key} of VM {}", vm.vmid))?;
            }
        }
    }
    Ok(())
}

/// Size in GiB of a drive value's `size=` option (rounded up).
fn drive_size_gib(value: &str) -> Option<u64> {
    let size = value.split(',').find_map(|p| p.strip_prefix("size="))?;
    let (digits, unit) = size.split_at(size.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(size.len()));
    let n: f64 = digits.parse().ok()?;
    let bytes = n * match unit {
        "K" => 1024.0,
        "M" => MIB as f64,
        "" | "G" => GIB as f64,
        "T" => (GIB * 1024) as f64,
        _ => return None,
    };
    Some((bytes / GIB as f64).ceil() as u64)
}

/// A NIC's `ipconfigN`: DHCP, or its static addresses (PVE's cloud-init takes one IPv4
/// and one IPv6 address per NIC, each with its gateway).
fn ipconfig(nic: &banlieue_sdk::provider::Nic) -> Result<String> {
    let Some(ip) = &nic.ip else { return Ok("ip=dhcp".into()) };
    let (v6, v4): (Vec<&String>, Vec<&String>) = ip.addresses.iter().partition(|a| a.contains(':'));
    if v4.len() > 1 || v6.len() > 1 {
        return Err(Error::InvalidSpec(format!(
            "nic {}: Proxmox VE's cloud-init gives a NIC one IPv4 and one IPv6 address; {} are declared",
            nic.name,
            ip.addresses.join(", ")
        )));
    }
    let mut parts = Vec::new();
    if let Some(a) = v4.first() {
        parts.push(format!("ip={a}"));
        if let Some(g) = ip.gateway.as_deref().filter(|g| !g.contains(':')) {
            parts.push(format!("gw={g}"));
        }
    }
    if let Some(a) = v6.first() {
        parts.push(format!("ip6={a}"));
        if let Some(g) = ip.gateway.as_deref().filter(|g| g.contains(':')) {
            parts.push(format!("gw6={g}"));
        }
    }
    Ok(parts.join(","))
}

/// Write the machine's configuration onto a cloned VM (or one made from carried disks),
/// ending with the UID tag.
pub(crate) fn configure(pve: &Pve, vm: &Vm, machine: &Machine) -> Result<Vec<banlieue_sdk::provider::Condition>> {
    let cfg = pve.get(&format!("{}/config", vm.path()))?;
    let boot_storage = &machine.disks[0].target;
    // Grow the boot disk first (a separate call; a retry finds it grown and skips it).
    if let Some(disk) = boot_disk(&cfg) {
        let have = drive_size_gib(api::text(&cfg, &disk)).unwrap_or(0);
        let want = machine.disks[0].size_gib;
        if want > have {
            let params = [("disk".to_string(), disk.clone()), ("size".to_string(), format!("{want}G"))];
            match pve.request("PUT", &format!("{}/resize", vm.path()), &params)? {
                Value::String(upid) if upid.starts_with("UPID:") => {
                    pve.wait_task(&upid, TASK_TIMEOUT_MS, &format!("resizing {disk} of VM {}", vm.vmid))?
                }
                _ => {}
            }
        }
    }
    let mut params: Vec<(String, String)> = vec![
        ("cores".into(), machine.cpus.max(1).to_string()),
        ("memory".into(), machine.memory_mib.to_string()),
        ("bios".into(), if machine.firmware == Firmware::Uefi { "ovmf" } else { "seabios" }.into()),
        ("agent".into(), "1".into()),
        // A serial port for `termproxy`: the machine's serial console (`kubectl vm console`).
        ("serial0".into(), "socket".into()),
    ];
    let mut delete: Vec<String> = Vec::new();
    for (i, nic) in machine.nics.iter().enumerate() {
        let key = format!("net{i}");
        let existing = cfg.get(&key).and_then(Value::as_str);
        params.push((key, api::net_value(&nic.network, existing)));
        params.push((format!("ipconfig{i}"), ipconfig(nic)?));
    }
    // DNS is one setting of the VM in PVE's cloud-init: every NIC's, in order.
    let mut nameservers: Vec<&str> = Vec::new();
    let mut search: Vec<&str> = Vec::new();
    for ip in machine.nics.iter().filter_map(|n| n.ip.as_ref()) {
        for (all, these) in [(&mut nameservers, &ip.nameservers), (&mut search, &ip.search_domains)] {
            for v in these {
                if !all.contains(&v.as_str()) {
                    all.push(v);
                }
            }
        }
    }
    if !nameservers.is_empty() {
        params.push(("nameserver".into(), nameservers.join(" ")));
    }
    if !search.is_empty() {
        params.push(("searchdomain".into(), search.join(" ")));
    }
    for i in machine.nics.len()..32 {
        if cfg.get(format!("net{i}")).is_some() {
            delete.push(format!("net{i}"));
        }
    }
    // Further disks: the machine's disks are the VM's by position (the boot disk first), so
    // only those beyond what the clone brought (a template's boot disk, a snapshot's every
    // disk) are added, in scsi slots after the ones it uses.
    let mut slot = 0;
    for disk in machine.disks.iter().skip(disk_keys(&cfg).len().max(1)) {
        while cfg.get(format!("scsi{slot}")).is_some() || params.iter().any(|(k, _)| *k == format!("scsi{slot}")) {
            slot += 1;
        }
        params.push((format!("scsi{slot}"), format!("{}:{}", disk.target, disk.size_gib.max(1))));
    }
    let has_cloudinit = cfg.as_object().into_iter().flatten().any(|(_, v)| v.as_str().is_some_and(|s| s.contains(":cloudinit")));
    if !has_cloudinit {
        let slot = [2, 0, 1, 3].iter().map(|i| format!("ide{i}")).find(|k| cfg.get(k).is_none()).ok_or_else(|| {
            Error::InvalidSpec(format!("VM {} has no free IDE slot for the cloud-init drive", vm.vmid))
        })?;
        params.push((slot, format!("{boot_storage}:cloudinit")));
    }
    let mut conditions = Vec::new();
    if let Some(ud) = machine.user_data.as_deref().filter(|u| !u.trim().is_empty()) {
        let ci = api::cloud_init(ud);
        params.extend(ci.params);
        if ci.ignored.is_empty() {
            conditions.push(condition("UserData", true, "Mapped", "user-data mapped to PVE cloud-init keys"));
        } else {
            conditions.push(condition(
                "UserData",
                false,
                "PartiallyMapped",
                format!("PVE's API carries only user, password and ssh_authorized_keys; ignored: {}", ci.ignored.join(", ")),
            ));
        }
    }
    if !delete.is_empty() {
        params.push(("delete".into(), delete.join(",")));
    }
    // A clone of another machine's snapshot comes with that machine's UID tag: only this one's stays.
    params.push(("tags".into(), api::with_only_uid_tag(api::text(&cfg, "tags"), &machine.uid)));
    pve.request("PUT", &format!("{}/config", vm.path()), &params)
        .map_err(|e| e.context(format_args!("configuring VM {}", vm.vmid)))?;
    Ok(conditions)
}

/// Check what `create` and `snapshot-clone` are asked for that PVE is not needed to judge;
/// returns the VM name.
pub(crate) fn check_machine(machine: &Machine) -> Result<String> {
    api::check_uid(&machine.uid)?;
    let vm_name = api::vm_name(&machine.namespace, &machine.name)?;
    if machine.disks.is_empty() {
        return Err(Error::InvalidSpec("a machine needs a boot disk (disks[0])".into()));
    }
    if machine.power_state == PowerState::Suspended {
        return Err(Error::InvalidSpec("the Proxmox driver does not suspend machines".into()));
    }
    Ok(vm_name)
}

/// Check the machine against node `target` (online, its storages and bridges there, its
/// NICs' addresses) before anything is made: `invalid-spec` naming what is missing.
pub(crate) fn check_target(pve: &Pve, machine: &Machine, target: &str) -> Result<()> {
    if machine.user_data_format == UserDataFormat::Ignition && machine.user_data.is_some() {
        return Err(Error::InvalidSpec(
            "Proxmox VE cannot deliver Ignition: its cloud-init drive takes cloud-config keys only, and a whole config needs `cicustom` with a snippet storage PVE's API cannot upload to; use cloud-config user-data on Proxmox VE, or another backend".into(),
        ));
    }
    let nodes = online_nodes(pve)?;
    if !nodes.iter().any(|n| api::text(n, "node") == target) {
        return Err(Error::InvalidSpec(format!("failure domain {target:?} is not an online Proxmox VE node")));
    }
    let storages = image_storages(pve, target)?;
    for disk in &machine.disks {
        if !storages.iter().any(|(s, _)| *s == disk.target) {
            return Err(Error::InvalidSpec(format!(
                "storage {:?} (disk {}) does not exist on node {target}, is not active, or does not hold VM images",
                disk.target, disk.name
            )));
        }
    }
    let nets = bridges(pve, target)?;
    for nic in &machine.nics {
        if !nets.contains(&nic.network) {
            return Err(Error::InvalidSpec(format!("bridge {:?} (nic {}) does not exist on node {target}", nic.network, nic.name)));
        }
        ipconfig(nic)?;
    }
    Ok(())
}

/// The VM a clone is made from, and how.
pub(crate) struct CloneSource<'a> {
    pub node: &'a str,
    pub vmid: u64,
    /// For messages: `template 9000`, `snapshot bl-1 of VM 101`.
    pub what: String,
    /// What the clone request carries besides `newid`, `name`, `description` and `target`
    /// (`full`, `storage`, `snapname`).
    pub params: Vec<(String, String)>,
}

impl CloneSource<'_> {
    /// Clone the source to a new VM named `vm_name` on node `target`, its description
    /// carrying the machine's UID; returns the new VM (not yet configured).
    pub(crate) fn clone_to(&self, pve: &Pve, machine: &Machine, vm_name: &str, target: &str) -> Result<Vm> {
        let mut last = String::new();
        for attempt in 0..CLONE_ATTEMPTS {
            let next = api::num(Some(&pve.get("/cluster/nextid")?))
                .ok_or_else(|| Error::Internal("/cluster/nextid did not answer a VMID".into()))?;
            // PVE does not reserve the ID it answers: creates racing for it collide, so
            // after a collision each tries a random ID above it instead.
            let newid = api::candidate_vmid(next, attempt, random());
            let mut params: Vec<(String, String)> = vec![
                ("newid".into(), newid.to_string()),
                ("name".into(), vm_name.to_string()),
                ("description".into(), api::description(&machine.namespace, &machine.name, &machine.uid)),
            ];
            params.extend(self.params.iter().cloned());
            if target != self.node {
                params.push(("target".into(), target.to_string()));
            }
            let path = format!("/nodes/{}/qemu/{}/clone", api::encode(self.node), self.vmid);
            let upid = match pve.task("POST", &path, &params) {
                Ok(u) => u,
                Err(e) if api::is_collision(e.message()) => {
                    last = e.message().to_string();
                    continue;
                }
                Err(e @ Error::NotFound(_)) => return Err(e),
                Err(e) => return Err(e.context(format_args!("cloning {}", self.what))),
            };
            // Only a clone PVE says failed is cleaned up: one whose end could not be learnt (a
            // poll failed, still running) may succeed, and the next create finds it by its UID.
            match pve.task_outcome(&upid, CLONE_TIMEOUT_MS, &format!("cloning {} to VM {newid}", self.what))? {
                Ok(()) => {
                    info!("cloned {} to VM {newid} ({vm_name}) on {target}", self.what);
                    return Ok(Vm { node: target.to_string(), vmid: newid, lock: String::new(), tagged: false });
                }
                Err(e) if api::is_collision(e.message()) => {
                    last = e.message().to_string();
                    continue;
                }
                Err(e) => {
                    clean_up(pve, machine, vm_name, newid);
                    return Err(e);
                }
            }
        }
        Err(Error::Unavailable(format!("no free VMID after {CLONE_ATTEMPTS} attempts: {last}")))
    }
}

/// Configure a VM just cloned for the machine, then bring it to the machine's hardware (a
/// snapshot's further disks may be smaller than declared) and power state.
pub(crate) fn finish_clone(pve: &Pve, mut vm: Vm, machine: &Machine, whole_hardware: bool) -> Result<MachineStatus> {
    let extra = configure(pve, &vm, machine)?;
    vm.tagged = true;
    if whole_hardware {
        apply_hardware(pve, &vm, machine)?;
    }
    drive_power(pve, &vm, machine.power_state)?;
    status(pve, &vm, extra)
}

/// The machine's VM that exists already (a retry, or the host's `create` after a
/// `snapshot-clone`): one still being cloned is reported as it is; one whose configuration
/// was interrupted is configured; a stopped one is brought to the machine's hardware; then
/// to its power state.
pub(crate) fn realise(pve: &Pve, mut vm: Vm, machine: &Machine) -> Result<MachineStatus> {
    if vm.lock == "clone" || vm.lock == "create" {
        return status(pve, &vm, Vec::new());
    }
    let mut extra = Vec::new();
    if !vm.tagged {
        info!("finishing the configuration of VM {} left by an interrupted create", vm.vmid);
        extra = configure(pve, &vm, machine)?;
        vm.tagged = true;
    } else if api::text(&pve.get(&format!("{}/status/current", vm.path()))?, "status") == "stopped" {
        apply_hardware(pve, &vm, machine)?;
    }
    drive_power(pve, &vm, machine.power_state)?;
    status(pve, &vm, extra)
}

/// Remove a VM a failed create left behind, if it is this machine's.
fn clean_up(pve: &Pve, machine: &Machine, vm_name: &str, vmid: u64) {
    match find(pve, &machine.uid, vm_name) {
        Ok(Some(vm)) if vm.vmid == vmid => {
            let r = pve
                .task("DELETE", &vm.path(), &[("purge".into(), "1".into()), ("destroy-unreferenced-disks".into(), "1".into())])
                .and_then(|upid| pve.wait_task(&upid, TASK_TIMEOUT_MS, "removing a failed clone"));
            if let Err(e) = r {
                warn!("could not remove VM {vmid} left by a failed clone: {}", e.message());
            }
        }
        _ => {}
    }
}

impl Driver for Proxmox {
    // No DISK_EXPORT: PVE's API cannot hand a VM disk's bytes out (see # Moves).
    const FEATURES: &'static [&'static str] =
        &[banlieue_sdk::provider::SNAPSHOTS, banlieue_sdk::provider::DISK_IMPORT, banlieue_sdk::provider::ADOPT, banlieue_sdk::provider::CONSOLE, banlieue_sdk::provider::VNC];

    fn probe(config: &ProviderConfig) -> Result<Inventory> {
        let pve = Pve::connect(config)?;
        let version = pve.get("/version")?;
        let backend_version = Some(format!("Proxmox VE {}", api::text(&version, "version")));
        let mut failure_domains = Vec::new();
        for node in online_nodes(&pve)? {
            let name = api::text(&node, "node").to_string();
            let storages = image_storages(&pve, &name)?;
            let nets = bridges(&pve, &name)?;
            let storage_classes: Vec<String> = config
                .storage_classes
                .iter()
                .filter(|(_, target)| storages.iter().any(|(s, _)| s == target))
                .map(|(class, _)| class.clone())
                .collect();
            let mut used: Vec<&str> = Vec::new();
            let mut free_bytes = 0u64;
            for (_, target) in &config.storage_classes {
                if let Some((s, avail)) = storages.iter().find(|(s, _)| s == target) {
                    if !used.contains(&s.as_str()) {
                        used.push(s);
                        free_bytes += avail;
                    }
                }
            }
            let network_classes: Vec<String> =
                config.network_classes.iter().filter(|(_, b)| nets.contains(b)).map(|(class, _)| class.clone()).collect();
            let maxmem = api::num(node.get("maxmem")).unwrap_or(0);
            let mem = api::num(node.get("mem")).unwrap_or(0);
            failure_domains.push(FailureDomain {
                labels: vec![
                    ("topology.kubernetes.io/zone".into(), name.clone()),
                    ("proxmox.banlieue.io/node".into(), name.clone()),
                ],
                capacity: banlieue_sdk::provider::Capacity {
                    cpus: api::num(node.get("maxcpu")).unwrap_or(0),
                    memory_mib: maxmem.saturating_sub(mem) / MIB,
                    storage_gib: free_bytes / GIB,
                },
                storage_classes,
                network_classes,
                features: config.features.clone(),
                name,
            });
        }
        Ok(Inventory { backend_version, failure_domains })
    }

    fn create(config: &ProviderConfig, machine: &Machine) -> Result<MachineStatus> {
        let vm_name = check_machine(machine)?;
        let pve = Pve::connect(config)?;
        if let Some(vm) = find(&pve, &machine.uid, &vm_name)? {
            return realise(&pve, vm, machine);
        }

        // Check the spec against the cluster before making anything.
        let (template_node, template_vmid) = resolve_template(&pve, &machine.image)?;
        let target = if machine.failure_domain.is_empty() { template_node.clone() } else { machine.failure_domain.clone() };
        check_target(&pve, machine, &target)?;
        // The boot disk is grown to its declared size after the clone, never shrunk: a smaller
        // declaration is refused before anything is cloned.
        let template_cfg = pve.get(&format!("/nodes/{}/qemu/{template_vmid}/config", api::encode(&template_node)))?;
        if let Some(have) = boot_disk(&template_cfg).and_then(|d| drive_size_gib(api::text(&template_cfg, &d))) {
            let want = machine.disks[0].size_gib;
            if want > 0 && want < have {
                return Err(Error::InvalidSpec(format!(
                    "disk {} is {have} GiB in template {template_vmid}; {want} GiB are declared and a disk is never shrunk: declare at least {have} GiB",
                    machine.disks[0].name
                )));
            }
        }
        let source = CloneSource { node: &template_node, vmid: template_vmid, what: format!("template {template_vmid}"), params: vec![("full".into(), "1".into()), ("storage".into(), machine.disks[0].target.clone())] };
        let source = match source.clone_to(&pve, machine, &vm_name, &target) {
            Err(Error::NotFound(m)) => return Err(Error::InvalidSpec(format!("template VM {template_vmid} on {template_node}: {m}"))),
            other => other?,
        };
        finish_clone(&pve, source, machine, false)
    }

    fn describe(config: &ProviderConfig, machine: &MachineRef) -> Result<MachineStatus> {
        let pve = Pve::connect(config)?;
        let vm = lookup(&pve, machine)?;
        status(&pve, &vm, Vec::new())
    }

    fn console(config: &ProviderConfig, machine: &MachineRef, kind: banlieue_sdk::provider::ConsoleKind) -> Result<banlieue_sdk::provider::ConsoleAccess> {
        let pve = Pve::connect(config)?;
        let vm = lookup(&pve, machine)?;
        console::open(config, &pve, &vm, kind)
    }

    fn set_power(config: &ProviderConfig, machine: &MachineRef, state: PowerState, power_off: &PowerOff) -> Result<MachineStatus> {
        let pve = Pve::connect(config)?;
        let vm = lookup(&pve, machine)?;
        match state {
            PowerState::PoweredOn => start(&pve, &vm)?,
            PowerState::PoweredOff => stop(&pve, &vm, power_off)?,
            PowerState::Suspended => return Err(Error::InvalidSpec("the Proxmox driver does not suspend machines".into())),
        }
        status(&pve, &vm, Vec::new())
    }

    fn import_image(config: &ProviderConfig, request: &ImageRequest) -> Result<ImageStatus> {
        import::import(config, request)
    }

    fn delete_image(config: &ProviderConfig, request: &ImageRequest, reference: &str) -> Result<()> {
        import::delete(config, request, reference)
    }

    fn snapshot_create(config: &ProviderConfig, machine: &MachineRef, request: &SnapshotRequest) -> Result<Snapshot> {
        snapshot::create(config, machine, request)
    }

    fn snapshot_list(config: &ProviderConfig, machine: &MachineRef) -> Result<Vec<Snapshot>> {
        snapshot::list(config, machine)
    }

    fn snapshot_revert(config: &ProviderConfig, machine: &MachineRef, id: &str) -> Result<()> {
        snapshot::revert(config, machine, id)
    }

    fn snapshot_clone(config: &ProviderConfig, machine: &Machine, source: &MachineRef, snapshot_id: &str, linked: bool) -> Result<MachineStatus> {
        snapshot::clone(config, machine, source, snapshot_id, linked)
    }

    fn snapshot_delete(config: &ProviderConfig, machine: &MachineRef, id: &str) -> Result<()> {
        snapshot::delete(config, machine, id)
    }

    fn disk_import(config: &ProviderConfig, machine: &Machine) -> Result<MachineStatus> {
        carry::import(config, machine)
    }

    fn list_machines(config: &ProviderConfig, page: Option<&str>) -> Result<MachinePage> {
        adopt::list(config, page)
    }

    fn adopt(config: &ProviderConfig, machine: &MachineRef, mark: &OwnerMark) -> Result<FoundMachine> {
        adopt::adopt(config, machine, mark)
    }

    fn reconfigure(config: &ProviderConfig, machine: &MachineRef, want: &banlieue_sdk::provider::HardwareTarget) -> Result<MachineStatus> {
        adopt::reconfigure(config, machine, want)
    }

    fn release(config: &ProviderConfig, machine: &MachineRef, mark: &OwnerMark) -> Result<()> {
        adopt::release(config, machine, mark)
    }

    fn delete(config: &ProviderConfig, machine: &MachineRef, power_off: &PowerOff) -> Result<()> {
        let pve = Pve::connect(config)?;
        let vm = match lookup(&pve, machine) {
            Ok(vm) => vm,
            Err(Error::NotFound(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        match stop(&pve, &vm, power_off) {
            Ok(()) | Err(Error::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
        let params = [("purge".to_string(), "1".to_string()), ("destroy-unreferenced-disks".to_string(), "1".to_string())];
        let upid = match pve.task("DELETE", &vm.path(), &params) {
            Ok(u) => u,
            Err(Error::NotFound(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        banlieue_sdk::provider::ignore_not_found(pve.wait_task(&upid, TASK_TIMEOUT_MS, &format!("destroying VM {}", vm.vmid)))
    }
}

banlieue_sdk::export_provider!(Proxmox);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ipconfig_is_dhcp_or_one_address_per_family_with_its_gateway() {
        let nic = |addresses: &[&str], gateway: Option<&str>| banlieue_sdk::provider::Nic {
            name: "eth0".into(),
            network: "vmbr0".into(),
            ip: (!addresses.is_empty()).then(|| banlieue_sdk::provider::IpConfig {
                addresses: addresses.iter().map(|a| a.to_string()).collect(),
                gateway: gateway.map(str::to_string),
                nameservers: vec![],
                search_domains: vec![],
            }),
        };
        assert_eq!(ipconfig(&nic(&[], None)).unwrap(), "ip=dhcp");
        assert_eq!(ipconfig(&nic(&["10.0.0.5/24"], Some("10.0.0.1"))).unwrap(), "ip=10.0.0.5/24,gw=10.0.0.1");
        assert_eq!(ipconfig(&nic(&["10.0.0.5/24", "2001:db8::5/64"], Some("2001:db8::1"))).unwrap(), "ip=10.0.0.5/24,ip6=2001:db8::5/64,gw6=2001:db8::1");
        let e = ipconfig(&nic(&["10.0.0.5/24", "10.0.0.6/24"], None)).unwrap_err();
        assert!(matches!(&e, Error::InvalidSpec(m) if m.contains("one IPv4 and one IPv6")), "{e:?}");
    }

    #[test]
    fn boot_disk_follows_boot_order() {
        let cfg = json!({"boot": "order=ide2;scsi1;net0", "ide2": "local:iso/x.iso,media=cdrom", "scsi0": "local-lvm:vm-1-disk-0", "scsi1": "local-lvm:vm-1-disk-1"});
        assert_eq!(boot_disk(&cfg).as_deref(), Some("scsi1"));
        let cfg = json!({"virtio0": "local-lvm:vm-1-disk-0,size=4G", "ide2": "local-lvm:cloudinit"});
        assert_eq!(boot_disk(&cfg).as_deref(), Some("virtio0"));
        assert_eq!(boot_disk(&json!({})), None);
    }

    #[test]
    fn hardware_lists_the_boot_disk_first_and_each_nics_mac_and_bridge() {
        let cfg = json!({"cores": 2, "sockets": 2, "memory": "2048", "boot": "order=scsi1;net0",
                         "scsi0": "local-lvm:vm-1-disk-1,size=2G", "scsi1": "local-lvm:vm-1-disk-0,size=8G",
                         "ide2": "local-lvm:vm-1-cloudinit,media=cdrom", "ide0": "local:iso/x.iso,media=cdrom",
                         "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0", "net1": "virtio,bridge=vmbr1"});
        let hw = hardware(&cfg);
        assert_eq!((hw.cpus, hw.memory_mib), (4, 2048));
        let disks: Vec<(u64, &str)> = hw.disks.iter().map(|d| (d.size_gib, d.id.as_str())).collect();
        assert_eq!(disks, [(8, "local-lvm:vm-1-disk-0"), (2, "local-lvm:vm-1-disk-1")]);
        let nics: Vec<(&str, &str)> = hw.nics.iter().map(|n| (n.mac.as_str(), n.network.as_str())).collect();
        assert_eq!(nics, [("bc:24:11:00:00:01", "vmbr0"), ("", "vmbr1")]);
    }

    #[test]
    fn drive_sizes_round_up_to_gib() {
        assert_eq!(drive_size_gib("local-lvm:vm-1-disk-0,size=4G"), Some(4));
        assert_eq!(drive_size_gib("local-lvm:vm-1-disk-0,size=2252M"), Some(3));
        assert_eq!(drive_size_gib("local-lvm:vm-1-disk-0,size=1T"), Some(1024));
        assert_eq!(drive_size_gib("local-lvm:vm-1-disk-0"), None);
    }
}
