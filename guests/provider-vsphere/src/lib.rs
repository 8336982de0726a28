//! The vSphere provider driver: vCenter's vim25 SOAP API, reached only through
//! the host's `http` capability (granted for the Provider's endpoint), with the
//! Provider Secret's `username` / `password` and the host-held session store.
//! It keeps no state: vCenter is the source of truth, and every call is
//! idempotent.
//!
//! # Mapping
//!
//! - Session: `SessionManager.Login` once, its `vmware_soap_session` cookie kept
//!   by the host ([`banlieue_sdk::session::with_session`], 30 min); a
//!   `NotAuthenticated` fault means it was rejected (log in again once). A bad
//!   password (`InvalidLogin`) is `denied`.
//! - Failure domains are compute clusters, named after the cluster (or
//!   `{datacenter}/{cluster}` when two datacenters have a cluster of that name),
//!   labelled `topology.kubernetes.io/region` = datacenter and
//!   `topology.kubernetes.io/zone` = cluster. Standalone hosts are not offered.
//! - A storage class maps to a datastore name, a network class to a port group
//!   (standard or distributed) name; a domain offers a class only if the cluster
//!   sees that datastore (accessible) or network. Free capacity: CPU cores and
//!   memory the cluster's connected hosts do not use (host quick stats), and the
//!   free space of the offered datastores.
//! - A Machine is the VM named `{namespace}_{name}` (an underscore cannot occur
//!   in a Kubernetes name, so this is unambiguous) whose `config.instanceUuid` is
//!   the Machine UID — the idempotency key: every call finds the VM with
//!   `SearchIndex.FindByUuid(instanceUuid)`, never by name. An adopted machine
//!   (its `machine-ref.backend-id` set) is the VM whose instanceUuid is that id,
//!   and only while it carries the machine's mark: one released, or marked by
//!   another machine, is `not-found` ([`lookup_of`], [`lookup`]).
//! - The provider ID is `vsphere://{config.uuid}` (the BIOS UUID), as CAPV and
//!   the vSphere cloud provider write it on the Node.
//! - `create` clones the template named by the `template` image source (an
//!   inventory path if it contains `/`, else a VM or template of that name,
//!   templates first) into the datacenter's VM folder, the cluster's root
//!   resource pool and the first disk's datastore; the clone spec sets CPUs,
//!   memory, firmware, the instance UUID, replaces the template's NICs with one
//!   vmxnet3 per NIC on its network, and sets the extraConfig keys of the VMware
//!   cloud-init datasource: `guestinfo.userdata` (+ `.encoding` = `base64`) and
//!   `guestinfo.metadata` (JSON with `instance-id` = UID and `local-hostname` =
//!   name, base64), and banlieue's mark of the machine ([`adopt`]:
//!   `banlieue.owner.machine-uid` = UID, `banlieue.owner.machine` =
//!   `namespace/name`, no installation), so discovery lists it as managed; a VM
//!   `create` finds unmarked (made before the mark) is marked then, one marked by
//!   another machine is refused (`invalid-spec`). The clone is made powered
//!   off; the VM is then reconfigured if its CPUs or memory differ from the spec
//!   (vcsim ignores them in a clone spec) and powered on if asked. A `DuplicateName` fault is ours if the VM
//!   with our UUID exists meanwhile, otherwise the name belongs to another VM
//!   (`invalid-spec`). Then, while the VM is off, its disks are made as declared
//!   ([`disk_changes`]): the cloned boot disk grown to `disks[0]` (never shrunk:
//!   a smaller declaration is `invalid-spec`), each further disk added as a new
//!   thin `VirtualDisk` on its datastore, on the boot disk's controller. They are
//!   files of the VM, so `Destroy_Task` removes them with it.
//! - `describe`: hardware from `config.hardware` (a NIC on a distributed port
//!   group is on the port group's name, read through the VM's `network`); power
//!   state from `runtime.powerState`; addresses (InternalIP) from
//!   `guest.ipAddress` and `guest.net[].ipAddress` (IPv6 link-local left out),
//!   and `guest.hostName` as Hostname; the phase is `powering-on` …
//!   `waiting-for-address` (on, no address) / `running` / `powered-off`.
//! - `set-power`: on is `PowerOnVM_Task`, suspended `SuspendVM_Task`; off goes
//!   through [`power_off`]: `ShutdownGuest` is the request (a `ToolsUnavailable`
//!   fault is `invalid-spec`, so try-soft falls back), `PowerOffVM_Task` the
//!   hard way, `runtime.powerState` the poll.
//! - `delete`: power off per the mode, `Destroy_Task`; a VM already gone is success.
//! - Faults: `NotFound` / `ManagedObjectNotFound` → `not-found`; busy or
//!   unreachable (`TaskInProgress`, HTTP 5xx without a SOAP fault, connect
//!   errors) → `unavailable`; invalid arguments → `invalid-spec`; the message
//!   names the operation and object and carries vCenter's message.
//! - Snapshots ([`snapshot`]): `CreateSnapshot_Task` (a snapshot already named
//!   as asked is returned), `RevertToSnapshot_Task` (`suppressPowerOn`),
//!   `RemoveSnapshot_Task` (children kept); the id is the snapshot's managed
//!   object id, the list the VM's `snapshot` tree flattened. `snapshot-clone` is the
//!   create path's `CloneVM_Task` from the source VM with `spec.snapshot` (linked:
//!   `diskMoveType` `createNewChildDiskBacking`), then the same reconfiguration and power.
//! - `import-image` / `delete-image`: a VMImage `url` source becomes a template
//!   named `image-{vmimage}-{12 hex of its sha256}` through `ImportVApp` and an
//!   `HttpNfcLease`, the host streaming the VMDK ([`import`]).
//! - `disk-export` / `disk-import` ([`carry`]): the powered-off VM's disks go to the host
//!   from the datastore (`/folder/…`, the flat extent each descriptor names); carried disks
//!   come in raw the same way, each PUT to its datastore as a flat extent beside a descriptor
//!   the driver writes, in the VM's directory; `CreateVM_Task` makes a VM as `create` makes
//!   one with them attached, which gets the machine's UID only then; `create` adopts it.
//! - Discovery and adoption ([`adopt`]): `list-machines` lists every VM and template of
//!   every datacenter in one `RetrievePropertiesEx`, by instanceUuid (the `backend-id`),
//!   100 to a page, with `describe`'s hardware and addresses, the host's cluster as failure
//!   domain (none for a standalone host) and the mark its extraConfig holds; `adopt` stamps
//!   the mark (three extraConfig keys, `ReconfigVM_Task`, nothing else changed) on an
//!   unmarked VM, returns a marked one as it is, refuses a template; `release` removes the
//!   mark if it is the machine's. `delete` of an adopted VM destroys it like any other.

use banlieue_sdk::http::{Client, base64};
use banlieue_sdk::provider::{
    Address, AddressType, Capacity, DiskStatus, Driver, FailureDomain, FoundMachine, Hardware, ImageRequest, ImageSource, ImageStatus, Inventory, Machine,
    MachinePage, MachinePhase, MachineRef, MachineStatus, NicStatus, OwnerMark, PowerOff, PowerOffOps, PowerState, ProviderConfig, Result, Snapshot,
    SnapshotRequest, UserDataFormat, condition, power_off,
};
use banlieue_sdk::session::{SessionError, with_session};
use banlieue_sdk::{Error, info};
use std::collections::{BTreeMap, BTreeSet};

pub mod adopt;
pub mod carry;
pub mod console;
pub mod import;
pub mod snapshot;
pub mod soap;
pub mod vim;

use soap::{ConfigSpec, DiskChange, MoRef, NetworkBacking, Node, ObjectContent, PropSpec, VirtualDisk};
use vim::{VResult, Vim, is_fault};

pub struct VSphere;

/// The VM name of a machine.
pub fn vm_name(namespace: &str, name: &str) -> String {
    format!("{namespace}_{name}")
}

/// Run `f` with a logged-in client (the stored session, or a new one).
fn with_vim<T>(config: &ProviderConfig, mut f: impl FnMut(&Vim) -> VResult<T>) -> Result<T> {
    let url = vim::sdk_url(&config.endpoint);
    let http = Client::new(url.clone()).timeout_ms(60_000);
    let sc = vim::service_content(&http, &url)?;
    with_session(
        || {
            let (user, password) = banlieue_sdk::secrets::basic_credentials("")?;
            info!("logging in to vCenter {url} as {user}");
            Ok((vim::login(&http, &url, &sc, &user, &password)?, vim::SESSION_TTL_S))
        },
        |cookie| f(&Vim { http: &http, url: &url, cookie, sc: &sc }),
    )
}

// ------------------------------------------------------------------ inventory

const INVENTORY: &[PropSpec] = &[
    PropSpec { kind: "Folder", paths: &["name", "parent"] },
    PropSpec { kind: "Datacenter", paths: &["name", "parent", "vmFolder"] },
    PropSpec { kind: "ClusterComputeResource", paths: &["name", "parent", "host", "datastore", "network", "resourcePool"] },
    PropSpec {
        kind: "HostSystem",
        paths: &[
            "summary.hardware.numCpuCores",
            "summary.hardware.cpuMhz",
            "summary.hardware.memorySize",
            "summary.quickStats.overallCpuUsage",
            "summary.quickStats.overallMemoryUsage",
            "runtime.connectionState",
            "runtime.inMaintenanceMode",
        ],
    },
    PropSpec { kind: "Datastore", paths: &["name", "summary.freeSpace", "summary.accessible"] },
    PropSpec { kind: "Network", paths: &["name"] },
    PropSpec { kind: "DistributedVirtualPortgroup", paths: &["key", "config.distributedVirtualSwitch"] },
    PropSpec { kind: "DistributedVirtualSwitch", paths: &["uuid"] },
];

const VMS: &[PropSpec] = &[PropSpec { kind: "VirtualMachine", paths: &["name", "config.template"] }];

/// The objects of the inventory, by reference.
struct Inv(BTreeMap<MoRef, ObjectContent>);

/// A cluster, its datacenter and its failure-domain name.
struct Cluster<'a> {
    obj: &'a ObjectContent,
    name: String,
    datacenter: &'a ObjectContent,
}

impl Inv {
    fn read(vim: &Vim, specs: &[PropSpec]) -> VResult<Inv> {
        Ok(Inv::of(vim.inventory(specs)?))
    }

    fn of(objects: Vec<ObjectContent>) -> Inv {
        Inv(objects.into_iter().filter_map(|o| Some((o.obj.clone()?, o))).collect())
    }

    fn get(&self, r: &MoRef) -> Option<&ObjectContent> {
        self.0.get(r)
    }

    fn of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a ObjectContent> + 'a {
        self.0.iter().filter(move |(r, _)| r.kind == kind).map(|(_, o)| o)
    }

    /// The datacenter above an object.
    fn datacenter_of(&self, o: &ObjectContent) -> Option<&ObjectContent> {
        let mut cur = o.reference("parent");
        for _ in 0..64 {
            let r = cur?;
            let obj = self.get(&r)?;
            if r.kind == "Datacenter" {
                return Some(obj);
            }
            cur = obj.reference("parent");
        }
        None
    }

    /// Every cluster with its failure-domain name.
    fn clusters(&self) -> Vec<Cluster<'_>> {
        let mut out: Vec<Cluster> = self
            .of_kind("ClusterComputeResource")
            .filter_map(|c| {
                Some(Cluster { obj: c, name: c.str("name")?.to_string(), datacenter: self.datacenter_of(c)? })
            })
            .collect();
        let mut count: BTreeMap<String, usize> = BTreeMap::new();
        for c in &out {
            *count.entry(c.name.clone()).or_default() += 1;
        }
        for c in &mut out {
            if count[&c.name] > 1 {
                c.name = format!("{}/{}", c.datacenter.str("name").unwrap_or(""), c.name);
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// The datastore named `name` the cluster sees.
    fn datastore_in(&self, c: &Cluster, name: &str) -> Option<(MoRef, &ObjectContent)> {
        c.obj.refs("datastore").into_iter().find_map(|r| {
            let o = self.get(&r)?;
            (o.str("name") == Some(name) && o.str("summary.accessible") != Some("false")).then_some((r, o))
        })
    }

    /// The NIC backing for the network named `name` the cluster sees.
    fn network_in(&self, c: &Cluster, name: &str) -> Option<NetworkBacking> {
        c.obj.refs("network").into_iter().find_map(|r| {
            let o = self.get(&r)?;
            if o.str("name") != Some(name) {
                return None;
            }
            if r.kind == "DistributedVirtualPortgroup" {
                let switch = o.reference("config.distributedVirtualSwitch")?;
                let uuid = self.get(&switch)?.str("uuid")?.to_string();
                Some(NetworkBacking::Distributed { switch_uuid: uuid, portgroup_key: o.str("key")?.to_string() })
            } else {
                Some(NetworkBacking::Standard { name: name.to_string(), network: r })
            }
        })
    }
}

fn failure_domain(config: &ProviderConfig, inv: &Inv, c: &Cluster) -> FailureDomain {
    let (mut cpus, mut memory_mib) = (0u64, 0u64);
    for h in c.obj.refs("host").iter().filter_map(|r| inv.get(r)) {
        if h.str("runtime.connectionState").is_some_and(|s| s != "connected")
            || h.str("runtime.inMaintenanceMode") == Some("true")
        {
            continue;
        }
        let cores = h.u64("summary.hardware.numCpuCores");
        let mhz = h.u64("summary.hardware.cpuMhz").max(1);
        cpus += cores.saturating_sub(h.u64("summary.quickStats.overallCpuUsage").div_ceil(mhz));
        memory_mib += (h.u64("summary.hardware.memorySize") >> 20).saturating_sub(h.u64("summary.quickStats.overallMemoryUsage"));
    }
    let mut storage_classes = Vec::new();
    let mut offered = BTreeSet::new();
    let mut storage_gib = 0;
    for (class, target) in &config.storage_classes {
        if let Some((r, ds)) = inv.datastore_in(c, target) {
            storage_classes.push(class.clone());
            if offered.insert(r) {
                storage_gib += ds.u64("summary.freeSpace") >> 30;
            }
        }
    }
    let network_classes =
        config.network_classes.iter().filter(|(_, n)| inv.network_in(c, n).is_some()).map(|(k, _)| k.clone()).collect();
    let dc = c.datacenter.str("name").unwrap_or("").to_string();
    FailureDomain {
        name: c.name.clone(),
        labels: vec![
            ("topology.kubernetes.io/region".into(), dc),
            ("topology.kubernetes.io/zone".into(), c.obj.str("name").unwrap_or("").to_string()),
        ],
        capacity: Capacity { cpus, memory_mib, storage_gib },
        storage_classes,
        network_classes,
        features: config.features.clone(),
    }
}

// ------------------------------------------------------------------ machines

const VM_STATUS: &[&str] = &[
    "name",
    "config.uuid",
    "runtime.powerState",
    "guest.ipAddress",
    "guest.net",
    "guest.hostName",
    "guest.toolsRunningStatus",
    "config.hardware.numCPU",
    "config.hardware.memoryMB",
    "config.hardware.device",
    "network",
];

/// Distributed port group keys and their names: a NIC on a distributed port group names only
/// its key, and the machine's spec (a network class) names the port group.
pub type PortGroups = BTreeMap<String, String>;

/// The VM's hardware as vCenter holds it (read with [`VM_STATUS`]): disks in controller and
/// unit order, named by the host by position, their VMDK as id; each NIC's MAC and network
/// (a standard network's name, a distributed port group's name from `portgroups`, else its key).
pub fn hardware(vm: &ObjectContent, portgroups: &PortGroups) -> Option<Hardware> {
    let cpus = u32::try_from(vm.u64("config.hardware.numCPU")).ok().filter(|c| *c > 0)?;
    let devices = vm.props.get("config.hardware.device");
    let disks = virtual_disks(devices).into_iter().map(|d| DiskStatus { name: String::new(), size_gib: d.capacity_kib.div_ceil(1 << 20), id: d.file }).collect();
    let nics = devices
        .map(|d| d.children.iter().filter(|dev| dev.child("macAddress").is_some() || dev.child("addressType").is_some()).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|dev| NicStatus {
            name: String::new(),
            mac: dev.str_at("macAddress").unwrap_or_default().to_string(),
            network: match dev.str_at("backing.port.portgroupKey") {
                Some(key) => portgroups.get(key).map(String::as_str).unwrap_or(key),
                None => dev.str_at("backing.deviceName").unwrap_or_default(),
            }
            .to_string(),
        })
        .collect();
    Some(Hardware { cpus, memory_mib: vm.u64("config.hardware.memoryMB"), disks, nics })
}

fn power_state(s: Option<&str>) -> PowerState {
    match s {
        Some("poweredOn") => PowerState::PoweredOn,
        Some("suspended") => PowerState::Suspended,
        _ => PowerState::PoweredOff,
    }
}

/// The guest's addresses: `guest.ipAddress` first, then every NIC's, without duplicates or link-local IPv6.
pub fn addresses(vm: &ObjectContent) -> Vec<Address> {
    let mut ips: Vec<String> = Vec::new();
    let mut push = |ip: &str| {
        let ip = ip.trim();
        if !ip.is_empty() && !ip.to_ascii_lowercase().starts_with("fe80:") && !ips.iter().any(|i| i == ip) {
            ips.push(ip.to_string());
        }
    };
    if let Some(ip) = vm.str("guest.ipAddress") {
        push(ip);
    }
    if let Some(net) = vm.props.get("guest.net") {
        for nic in &net.children {
            for ip in nic.all("ipAddress") {
                push(&ip.text);
            }
        }
    }
    let mut out: Vec<Address> = ips.into_iter().map(|a| Address { type_: AddressType::InternalIp, address: a }).collect();
    if let Some(h) = vm.str("guest.hostName").filter(|h| !h.is_empty()) {
        out.push(Address { type_: AddressType::Hostname, address: h.to_string() });
    }
    out
}

/// The machine status of a VM read with [`VM_STATUS`].
pub fn status(vm: &ObjectContent, portgroups: &PortGroups) -> MachineStatus {
    let name = vm.str("name").unwrap_or("?");
    let state = power_state(vm.str("runtime.powerState"));
    let addresses = addresses(vm);
    let has_ip = addresses.iter().any(|a| a.type_ == AddressType::InternalIp);
    let phase = match state {
        PowerState::PoweredOn if has_ip => MachinePhase::Running,
        PowerState::PoweredOn => MachinePhase::WaitingForAddress,
        _ => MachinePhase::PoweredOff,
    };
    let on = state == PowerState::PoweredOn;
    let tools = vm.str("guest.toolsRunningStatus").unwrap_or("unknown");
    MachineStatus {
        provider_id: format!("vsphere://{}", vm.str("config.uuid").unwrap_or("")),
        hardware: hardware(vm, portgroups),
        power_state: state,
        conditions: vec![
            condition(
                "PoweredOn",
                on,
                vm.str("runtime.powerState").unwrap_or("unknown"),
                format!("vSphere VM {name} is {}", vm.str("runtime.powerState").unwrap_or("in an unknown power state")),
            ),
            condition(
                "AddressReported",
                has_ip,
                if has_ip { "GuestReported" } else { "NoAddress" },
                format!("VMware Tools: {tools}"),
            ),
        ],
        addresses,
        provisioned: true,
        phase,
    }
}

/// How a machine's VM is found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup<'a> {
    /// A VM banlieue made: its instance UUID is the machine's UID.
    Made(&'a str),
    /// An adopted VM: its own instance UUID (`backend-id`); it is the machine's only while
    /// it carries the machine's mark.
    Adopted(&'a str),
}

/// How `machine`'s VM is found: by its `backend-id` once it has one (adopted), else by its UID.
pub fn lookup_of(machine: &MachineRef) -> Lookup<'_> {
    match machine.backend_id.as_deref() {
        Some(id) if !id.is_empty() => Lookup::Adopted(id),
        _ => Lookup::Made(&machine.uid),
    }
}

/// Why an adopted VM carrying `mark` is not `machine`'s, if it is not: released, or taken by
/// another machine, it must not be acted on for this one.
pub fn not_ours(mark: Option<&OwnerMark>, machine: &MachineRef) -> Option<String> {
    match mark {
        Some(m) if m.machine_uid == machine.uid => None,
        Some(m) => Some(format!("it carries the mark of machine {} ({}), not of {}", m.machine, m.machine_uid, machine.uid)),
        None => Some(format!("it carries no mark of machine {} (released)", machine.uid)),
    }
}

/// The machine's VM, or why it has none: the one lookup every call on a [`MachineRef`] makes
/// (through [`find_machine`] or [`lookup`]).
fn locate(vim: &Vim, machine: &MachineRef) -> VResult<std::result::Result<MoRef, String>> {
    let what = vm_name(&machine.namespace, &machine.name);
    match lookup_of(machine) {
        Lookup::Made(uid) => Ok(vim.find_vm(uid)?.ok_or_else(|| format!("no vSphere VM has instanceUuid {uid} ({what})"))),
        Lookup::Adopted(id) => {
            let Some(vm) = vim.find_vm(id)? else {
                return Ok(Err(format!("no vSphere VM has instanceUuid {id} (adopted machine {what})")));
            };
            let p = match vim.props(&vm, &["name", "config.extraConfig"]) {
                Err(SessionError::Failed(e)) if e.is_not_found() => return Ok(Err(format!("vSphere VM {id} is gone (adopted machine {what})"))),
                other => other?,
            };
            Ok(match not_ours(adopt::mark(p.props.get("config.extraConfig")).as_ref(), machine) {
                None => Ok(vm),
                Some(why) => Err(format!("vSphere VM {} (instanceUuid {id}) is not machine {what}'s: {why}", p.str("name").unwrap_or(&vm.value))),
            })
        }
    }
}

/// The machine's VM, if it has one the driver may act on.
pub(crate) fn find_machine(vim: &Vim, machine: &MachineRef) -> VResult<Option<MoRef>> {
    Ok(locate(vim, machine)?.ok())
}

/// The machine's VM, or `not-found`.
pub(crate) fn lookup(vim: &Vim, machine: &MachineRef) -> VResult<MoRef> {
    locate(vim, machine)?.map_err(|why| Error::NotFound(why).into())
}

fn describe_vm(vim: &Vim, vm: &MoRef) -> VResult<MachineStatus> {
    let p = vim.props(vm, VM_STATUS)?;
    let portgroups = portgroups_of(vim, &p)?;
    Ok(status(&p, &portgroups))
}

/// The names of the distributed port groups a VM read with [`VM_STATUS`] is on (none read
/// when no NIC is on one).
fn portgroups_of(vim: &Vim, vm: &ObjectContent) -> VResult<PortGroups> {
    let on_one = vm.props.get("config.hardware.device").is_some_and(|d| d.children.iter().any(|dev| dev.path("backing.port.portgroupKey").is_some()));
    let refs: Vec<MoRef> = vm.refs("network").into_iter().filter(|r| r.kind == "DistributedVirtualPortgroup").collect();
    if !on_one || refs.is_empty() {
        return Ok(PortGroups::new());
    }
    let found = match vim.objects(&refs, &["key", "name"]) {
        // A port group removed meanwhile: its NICs keep their key.
        Err(SessionError::Failed(e)) if e.is_not_found() => return Ok(PortGroups::new()),
        other => other?,
    };
    Ok(portgroup_names(&found))
}

/// Port group keys and names from `DistributedVirtualPortgroup` objects read with `key` and `name`.
fn portgroup_names<'a>(objects: impl IntoIterator<Item = &'a ObjectContent>) -> PortGroups {
    objects.into_iter().filter_map(|o| Some((o.str("key")?.to_string(), o.str("name")?.to_string()))).collect()
}

/// Powering one VM off.
struct VmPower<'a, 'b> {
    vim: &'a Vim<'b>,
    vm: MoRef,
    name: String,
    /// The session was rejected midway: reported once `power_off` returns.
    rejected: Option<String>,
}

impl VmPower<'_, '_> {
    fn lift<T>(&mut self, r: VResult<T>) -> Result<T> {
        r.map_err(|e| match e {
            SessionError::Failed(e) => e,
            SessionError::Rejected(m) => {
                self.rejected = Some(m.clone());
                Error::Unavailable(m)
            }
        })
    }

    fn state(&mut self) -> Result<PowerState> {
        let r = self.vim.props(&self.vm, &["runtime.powerState"]);
        Ok(power_state(self.lift(r)?.str("runtime.powerState")))
    }
}

impl PowerOffOps for VmPower<'_, '_> {
    fn request_shutdown(&mut self) -> Result<()> {
        info!("shutting down the guest of vSphere VM {}", self.name);
        let r = self.vim.call(&format!("ShutdownGuest {}", self.name), &soap::simple("ShutdownGuest", &self.vm));
        match r {
            Err(e) if is_fault(&e, "InvalidPowerState") && self.is_off()? => Ok(()),
            Err(e) if is_fault(&e, "ToolsUnavailable") => Err(Error::InvalidSpec(format!(
                "VMware Tools are not running in vSphere VM {}: the guest cannot be asked to shut down ({})",
                self.name,
                match &e {
                    SessionError::Failed(e) => e.message().to_string(),
                    SessionError::Rejected(m) => m.clone(),
                }
            ))),
            other => self.lift(other.map(|_| ())),
        }
    }

    fn hard_off(&mut self) -> Result<()> {
        info!("powering off vSphere VM {}", self.name);
        let r = self.vim.run_task(&format!("PowerOffVM_Task {}", self.name), &soap::simple("PowerOffVM_Task", &self.vm));
        match r {
            Err(e) if is_fault(&e, "InvalidPowerState") && self.is_off()? => Ok(()),
            other => self.lift(other.map(|_| ())),
        }
    }

    fn is_off(&mut self) -> Result<bool> {
        Ok(self.state()? == PowerState::PoweredOff)
    }
}

fn vm_name_of(vim: &Vim, vm: &MoRef) -> VResult<String> {
    Ok(vim.props(vm, &["name"])?.str("name").unwrap_or(&vm.value).to_string())
}

/// Drive a VM towards `target`.
fn ensure_power(vim: &Vim, vm: &MoRef, target: PowerState, off: &PowerOff) -> VResult<()> {
    let props = vim.props(vm, &["name", "runtime.powerState"])?;
    let name = props.str("name").unwrap_or(&vm.value).to_string();
    let current = power_state(props.str("runtime.powerState"));
    if current == target {
        return Ok(());
    }
    let (method, what) = match target {
        PowerState::PoweredOn => ("PowerOnVM_Task", "powering on"),
        PowerState::Suspended if current == PowerState::PoweredOff => {
            return Err(Error::InvalidSpec(format!("vSphere VM {name} is powered off and cannot be suspended")).into());
        }
        PowerState::Suspended => ("SuspendVM_Task", "suspending"),
        PowerState::PoweredOff => {
            let mut ops = VmPower { vim, vm: vm.clone(), name, rejected: None };
            let r = power_off(&mut ops, off);
            if let Some(m) = ops.rejected {
                return Err(SessionError::Rejected(m));
            }
            return Ok(r?);
        }
    };
    info!("{what} vSphere VM {name}");
    match vim.run_task(&format!("{method} {name}"), &soap::simple(method, vm)) {
        Err(e) if is_fault(&e, "InvalidPowerState") && power_state(vim.props(vm, &["runtime.powerState"])?.str("runtime.powerState")) == target => Ok(()),
        other => other.map(|_| ()),
    }
}

/// Base64 of the cloud-init metadata for the VMware datasource.
fn metadata(machine: &Machine) -> String {
    let mut meta = serde_json::json!({ "instance-id": machine.uid, "local-hostname": machine.name });
    // Static addresses: cloud-init's VMware datasource reads a version 2 network
    // configuration from the metadata's `network` key.
    if banlieue_sdk::network::any_static(&machine.nics) {
        meta["network"] = banlieue_sdk::network::config_v2(&machine.nics, |i| nic_mac(machine, i));
    }
    base64(meta.to_string().as_bytes())
}

/// The MAC of the machine's `index`-th NIC when it has static addresses, in VMware's
/// range for manual MACs (`00:50:56:00:00:00`–`00:50:56:3f:ff:ff`).
pub fn nic_mac(machine: &Machine, index: usize) -> String {
    banlieue_sdk::network::stable_mac([0x00, 0x50, 0x56], 0x3f, &machine.uid, index)
}

/// The extraConfig of a machine: guestinfo, and banlieue's mark of the machine (so discovery
/// lists the VM as managed; it also replaces a mark a clone's source carried).
pub fn extra_config(machine: &Machine) -> Vec<(String, String)> {
    let mut out = vec![
        ("guestinfo.metadata".to_string(), metadata(machine)),
        ("guestinfo.metadata.encoding".to_string(), "base64".to_string()),
    ];
    out.extend(adopt::mark_entries(&adopt::made_mark(machine)));
    // Ignition's VMware platform reads `guestinfo.ignition.config.data`; cloud-init's VMware
    // datasource `guestinfo.userdata`.
    let key = match machine.user_data_format {
        UserDataFormat::CloudConfig => "guestinfo.userdata",
        UserDataFormat::Ignition => "guestinfo.ignition.config.data",
    };
    if let Some(ud) = &machine.user_data {
        out.push((key.into(), base64(ud.as_bytes())));
        out.push((format!("{key}.encoding"), "base64".into()));
    }
    out
}

/// The template to clone from.
fn find_template(vim: &Vim, inv: &Inv, name: &str) -> VResult<MoRef> {
    if name.contains('/') {
        if let Some(r) = vim.find_by_path(name)?.filter(|r| r.kind == "VirtualMachine") {
            return Ok(r);
        }
    } else {
        let mut found: Vec<(bool, MoRef)> = inv
            .of_kind("VirtualMachine")
            .filter(|v| v.str("name") == Some(name))
            .filter_map(|v| Some((v.str("config.template") != Some("true"), v.obj.clone()?)))
            .collect();
        found.sort();
        if let Some((_, r)) = found.into_iter().next() {
            return Ok(r);
        }
    }
    Err(Error::InvalidSpec(format!("template {name:?} does not exist in vCenter")).into())
}

/// The ethernet cards of a VM: (xsi type, key).
fn ethernet_cards(devices: Option<&Node>) -> Vec<(String, i32)> {
    devices
        .map(|d| {
            d.children
                .iter()
                .filter(|dev| dev.child("addressType").is_some() || dev.child("macAddress").is_some())
                .filter_map(|dev| Some((dev.xsi_type.clone()?, dev.str_at("key")?.parse().ok()?)))
                .collect()
        })
        .unwrap_or_default()
}

/// The VM's virtual disks, in controller and unit order.
fn virtual_disks(devices: Option<&Node>) -> Vec<VirtualDisk> {
    let mut disks: Vec<VirtualDisk> = devices
        .map(|d| {
            d.children
                .iter()
                .filter(|dev| dev.xsi_type.as_deref() == Some("VirtualDisk"))
                .filter_map(|dev| {
                    Some(VirtualDisk {
                        key: dev.str_at("key")?.parse().ok()?,
                        controller: dev.str_at("controllerKey")?.parse().ok()?,
                        unit: dev.str_at("unitNumber")?.parse().ok()?,
                        capacity_kib: dev.str_at("capacityInKB")?.parse().ok()?,
                        file: dev.str_at("backing.fileName").unwrap_or_default().to_string(),
                        datastore: dev.path("backing.datastore").and_then(Node::as_ref),
                        disk_mode: dev.str_at("backing.diskMode").unwrap_or("persistent").to_string(),
                        thin: dev.str_at("backing.thinProvisioned") == Some("true"),
                        label: dev.str_at("deviceInfo.label").unwrap_or("Hard disk").to_string(),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    disks.sort_by_key(|d| (d.controller, d.unit));
    disks
}

/// The units a controller of `kind` offers (a SCSI controller keeps 7 for itself).
fn controller_units(kind: &str) -> Vec<i32> {
    match kind {
        k if k.contains("IDE") => (0..2).collect(),
        k if k.contains("SATA") || k.contains("Ahci") => (0..30).collect(),
        k if k.contains("NVME") || k.contains("Nvme") => (0..15).collect(),
        _ => (0..16).filter(|u| *u != 7).collect(),
    }
}

/// What makes the VM's disks the machine's: the `i`-th declared disk is the VM's `i`-th
/// (by controller and unit), grown when smaller; the declared disks it does not have are
/// added on the boot disk's controller. A declared disk smaller than the VM's is refused:
/// a disk is never shrunk.
fn disk_changes(name: &str, devices: Option<&Node>, want: &[banlieue_sdk::provider::Disk]) -> Result<Vec<DiskChange>> {
    let have = virtual_disks(devices);
    let mut changes = Vec::new();
    for (d, disk) in want.iter().zip(&have) {
        let kib = d.size_gib << 20;
        if d.size_gib == 0 || kib == disk.capacity_kib {
            continue;
        }
        if kib < disk.capacity_kib {
            return Err(Error::InvalidSpec(format!(
                "disk {} of {name} is {} GiB on vSphere (from its image); {} GiB are declared and a disk is never shrunk: declare at least {} GiB",
                d.name,
                disk.capacity_kib.div_ceil(1 << 20),
                d.size_gib,
                disk.capacity_kib.div_ceil(1 << 20)
            )));
        }
        changes.push(DiskChange::Grow { disk: disk.clone(), capacity_kib: kib });
    }
    let more = want.get(have.len()..).unwrap_or_default();
    if more.is_empty() {
        return Ok(changes);
    }
    let Some(boot) = have.first() else {
        return Err(Error::InvalidSpec(format!("{name} has no disk to attach further disks beside: its template has no virtual disk")));
    };
    let devices = devices.map(|d| d.children.as_slice()).unwrap_or_default();
    let kind = devices.iter().find(|dev| dev.str_at("key").and_then(|k| k.parse().ok()) == Some(boot.controller)).and_then(|dev| dev.xsi_type.clone()).unwrap_or_default();
    let used: BTreeSet<i32> = devices
        .iter()
        .filter(|dev| dev.str_at("controllerKey").and_then(|k| k.parse().ok()) == Some(boot.controller))
        .filter_map(|dev| dev.str_at("unitNumber")?.parse().ok())
        .collect();
    let mut free = controller_units(&kind).into_iter().filter(|u| !used.contains(u));
    for d in more {
        let Some(unit) = free.next() else {
            return Err(Error::InvalidSpec(format!("{name}: the boot disk's controller ({kind}) has no free unit for disk {}", d.name)));
        };
        changes.push(DiskChange::Add { controller: boot.controller, unit, capacity_kib: d.size_gib << 20, datastore: d.target.clone() });
    }
    Ok(changes)
}

/// What a machine's VM is cloned from.
pub(crate) enum Origin<'a> {
    /// The template the machine's image source names (`create`).
    Template,
    /// Another machine's VM at one of its snapshots (`snapshot-clone`).
    Snapshot {
        /// The source VM.
        vm: &'a MoRef,
        /// The source, for messages (`ns_vm snapshot snapshot-72 (bl-1)`).
        what: &'a str,
        source: soap::SnapshotSource,
    },
}

/// Clone the machine's VM from `origin` into the machine's cluster, folder, pool and
/// datastore, with its instance UUID, CPUs, memory, NICs and guestinfo; returns it.
pub(crate) fn clone_machine(vim: &Vim, machine: &Machine, origin: &Origin) -> VResult<MoRef> {
    let name = vm_name(&machine.namespace, &machine.name);
    let template = match (origin, &machine.image) {
        (Origin::Template, ImageSource::Template(template)) => template.as_str(),
        (Origin::Template, _) => {
            return Err(Error::InvalidSpec(format!("the vSphere driver clones VMs from templates; {name} has another image source")).into());
        }
        // The disks come from the snapshot: the image source plays no part.
        (Origin::Snapshot { .. }, _) => "",
    };
    let mut specs: Vec<PropSpec> = INVENTORY.to_vec();
    specs.extend_from_slice(VMS);
    let inv = Inv::read(vim, &specs)?;
    let clusters = inv.clusters();
    let cluster = clusters.iter().find(|c| c.name == machine.failure_domain).ok_or_else(|| {
        Error::InvalidSpec(format!("failure domain {:?} is not a vSphere cluster of this vCenter", machine.failure_domain))
    })?;
    let pool = cluster.obj.reference("resourcePool").ok_or_else(|| {
        Error::Internal(format!("cluster {} has no resource pool", cluster.name))
    })?;
    let folder = cluster.datacenter.reference("vmFolder").ok_or_else(|| {
        Error::Internal(format!("datacenter {} has no VM folder", cluster.datacenter.str("name").unwrap_or("?")))
    })?;
    let datastore = match machine.disks.first() {
        Some(d) => Some(
            inv.datastore_in(cluster, &d.target)
                .ok_or_else(|| {
                    Error::InvalidSpec(format!("datastore {:?} is not available in cluster {}", d.target, cluster.name))
                })?
                .0,
        ),
        None => None,
    };
    // Every disk's datastore is checked before anything is made.
    for d in machine.disks.iter().skip(1) {
        if inv.datastore_in(cluster, &d.target).is_none() {
            return Err(Error::InvalidSpec(format!("disk {}: datastore {:?} is not available in cluster {}", d.name, d.target, cluster.name)).into());
        }
    }
    let add_nics = machine
        .nics
        .iter()
        .map(|n| {
            inv.network_in(cluster, &n.network).ok_or_else(|| {
                Error::InvalidSpec(format!("network {:?} is not available in cluster {}", n.network, cluster.name))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let (source_ref, devices) = match origin {
        Origin::Snapshot { vm, source, .. } => {
            // The clone gets the devices the VM had when the snapshot was taken: the snapshot's
            // `config`, else (a vCenter that does not say) the VM's own.
            let at_snapshot = vim.props(&source.snapshot, &["config.hardware.device"])?;
            let devices = if at_snapshot.props.contains_key("config.hardware.device") { at_snapshot } else { vim.props(vm, &["config.hardware.device"])? };
            ((*vm).clone(), devices)
        }
        Origin::Template => {
            let r = find_template(vim, &inv, template)?;
            let devices = vim.props(&r, &["config.hardware.device"])?;
            (r, devices)
        }
    };
    let remove_nics = if machine.nics.is_empty() { Vec::new() } else { ethernet_cards(devices.props.get("config.hardware.device")) };
    // Disks the template cannot become (one to shrink, no controller room) are refused
    // before anything is cloned.
    disk_changes(&name, devices.props.get("config.hardware.device"), &machine.disks)?;
    let spec = ConfigSpec {
        instance_uuid: Some(machine.uid.clone()),
        cpus: Some(machine.cpus),
        memory_mib: Some(machine.memory_mib),
        remove_nics,
        nic_macs: (0..add_nics.len()).map(|i| banlieue_sdk::network::any_static(&machine.nics).then(|| nic_mac(machine, i))).collect(),
        add_nics,
        extra_config: extra_config(machine),
        firmware: Some(match machine.firmware {
            banlieue_sdk::provider::Firmware::Bios => "bios".into(),
            banlieue_sdk::provider::Firmware::Uefi => "efi".into(),
        }),
        // Made while the clone is off, once its devices (the template's) are known.
        disks: Vec::new(),
        ..Default::default()
    };
    let (what, snapshot) = match origin {
        Origin::Template => (format!("vSphere template {template}"), None),
        Origin::Snapshot { what, source, .. } => (what.to_string(), Some(source)),
    };
    let kind = match snapshot {
        Some(s) if s.linked => " (linked clone)",
        Some(_) => " (full clone)",
        None => "",
    };
    info!("cloning {what} into VM {name}{kind} (cluster {})", cluster.name);
    let body = soap::clone_vm(&source_ref, &folder, &name, &pool, datastore.as_ref(), &spec, snapshot);
    let timeout = if snapshot.is_some() { snapshot::SNAPSHOT_TASK_TIMEOUT_MS } else { vim::TASK_TIMEOUT_MS };
    match vim.run_task_within(&format!("CloneVM_Task {what} -> {name}"), &body, timeout) {
        Ok(Some(n)) if n.as_ref().is_some() => Ok(n.as_ref().unwrap()),
        Ok(_) => vim.find_vm(&machine.uid)?.ok_or_else(|| Error::NotFound(format!("no vSphere VM has instanceUuid {} after the clone to {name}", machine.uid)).into()),
        Err(e) if is_fault(&e, "DuplicateName") => match vim.find_vm(&machine.uid)? {
            Some(vm) => Ok(vm),
            None => {
                let taken = inv.of_kind("VirtualMachine").any(|v| v.str("name") == Some(name.as_str()));
                Err(if taken {
                    Error::InvalidSpec(format!("a vSphere VM named {name} exists and is not this machine (its instanceUuid is not {})", machine.uid))
                } else {
                    Error::Unavailable(format!("a clone to {name} is in progress"))
                }
                .into())
            }
        },
        Err(e) => Err(e),
    }
}

/// Bring an existing VM to the machine's hardware (while off) and power state.
pub(crate) fn realise(vim: &Vim, vm: &MoRef, machine: &Machine) -> VResult<MachineStatus> {
    let p = vim.props(
        vm,
        &["name", "runtime.powerState", "config.hardware.numCPU", "config.hardware.memoryMB", "config.hardware.device", "config.extraConfig", "config.changeVersion"],
    )?;
    let name = p.str("name").unwrap_or(&vm.value).to_string();
    match adopt::mark(p.props.get("config.extraConfig")) {
        // A VM made before the driver marked the VMs it makes.
        None => {
            info!("marking vSphere VM {name} as machine {}/{}", machine.namespace, machine.name);
            let body = adopt::mark_request(vm, p.str("config.changeVersion"), Some(&adopt::made_mark(machine)));
            vim.run_task(&format!("ReconfigVM_Task {name} (mark)"), &body)?;
        }
        Some(m) if m.machine_uid != machine.uid => {
            return Err(Error::InvalidSpec(format!(
                "vSphere VM {name} has instanceUuid {} but was adopted by machine {} ({}): it is not machine {}/{}'s to change",
                machine.uid, m.machine, m.machine_uid, machine.namespace, machine.name
            ))
            .into());
        }
        Some(_) => {}
    }
    let off = power_state(p.str("runtime.powerState")) == PowerState::PoweredOff;
    let devices = p.props.get("config.hardware.device");
    if off && !machine.disks.is_empty() && virtual_disks(devices).is_empty() {
        // A clone that failed half-way (seen on vcsim when the client that asked for it was
        // killed and a second clone raced it): the VM is registered, carries this machine's
        // UID and has none of the template's disks, and stays so. A VM without a disk holds
        // no data, so it is destroyed and the next create clones again. (A template without
        // a disk was refused before the clone.)
        info!("destroying vSphere VM {name}: a clone left it without a disk");
        vim.run_task(&format!("Destroy_Task {name}"), &soap::simple("Destroy_Task", vm))?;
        return Err(Error::Unavailable(format!("vSphere VM {name} was left without a disk by a clone that did not finish: destroyed, it is cloned again")).into());
    }
    let disks = if off { disk_changes(&name, devices, &machine.disks)? } else { Vec::new() };
    if off && (p.u64("config.hardware.numCPU") != u64::from(machine.cpus) || p.u64("config.hardware.memoryMB") != machine.memory_mib || !disks.is_empty()) {
        info!("reconfiguring vSphere VM {name}: {} CPUs, {} MiB, {} disk change(s)", machine.cpus, machine.memory_mib, disks.len());
        let changes_disks = !disks.is_empty();
        let spec = ConfigSpec { cpus: Some(machine.cpus), memory_mib: Some(machine.memory_mib), disks, ..Default::default() };
        match vim.run_task(&format!("ReconfigVM_Task {name}"), &soap::reconfigure(vm, &spec)) {
            // The clone's disk files are still being copied (this create follows one cut off).
            Err(e) if changes_disks && is_fault(&e, "FileNotFound") => {
                return Err(Error::Unavailable(format!("the disks of vSphere VM {name} are not there yet: its clone is not finished")).into());
            }
            other => {
                other?;
            }
        }
    }
    if machine.power_state != PowerState::PoweredOff {
        ensure_power(vim, vm, machine.power_state, &PowerOff { mode: banlieue_sdk::provider::PowerOffMode::Hard, timeout_ms: 0 })?;
    }
    describe_vm(vim, vm)
}

impl Driver for VSphere {
    const FEATURES: &'static [&'static str] =
        &[banlieue_sdk::provider::SNAPSHOTS, banlieue_sdk::provider::DISK_EXPORT, banlieue_sdk::provider::DISK_IMPORT, banlieue_sdk::provider::ADOPT, banlieue_sdk::provider::VNC];

    fn probe(config: &ProviderConfig) -> Result<Inventory> {
        let (version, inv) = with_vim(config, |vim| Ok((vim.sc.full_name.clone(), Inv::read(vim, INVENTORY)?)))?;
        let failure_domains = inv.clusters().iter().map(|c| failure_domain(config, &inv, c)).collect();
        Ok(Inventory { backend_version: version, failure_domains })
    }

    fn create(config: &ProviderConfig, machine: &Machine) -> Result<MachineStatus> {
        if machine.uid.is_empty() {
            return Err(Error::InvalidSpec("the machine has no UID".into()));
        }
        with_vim(config, |vim| {
            let vm = match vim.find_vm(&machine.uid)? {
                Some(vm) => vm,
                None => clone_machine(vim, machine, &Origin::Template)?,
            };
            realise(vim, &vm, machine)
        })
    }

    fn describe(config: &ProviderConfig, machine: &MachineRef) -> Result<MachineStatus> {
        with_vim(config, |vim| {
            let vm = lookup(vim, machine)?;
            describe_vm(vim, &vm)
        })
    }

    fn console(config: &ProviderConfig, machine: &MachineRef, kind: banlieue_sdk::provider::ConsoleKind) -> Result<banlieue_sdk::provider::ConsoleAccess> {
        console::open(config, machine, kind)
    }

    fn set_power(config: &ProviderConfig, machine: &MachineRef, state: PowerState, off: &PowerOff) -> Result<MachineStatus> {
        with_vim(config, |vim| {
            let vm = lookup(vim, machine)?;
            ensure_power(vim, &vm, state, off)?;
            describe_vm(vim, &vm)
        })
    }

    fn import_image(config: &ProviderConfig, request: &ImageRequest) -> Result<ImageStatus> {
        import::import(config, request)
    }

    fn delete_image(config: &ProviderConfig, request: &ImageRequest, reference: &str) -> Result<()> {
        import::delete(config, request, reference)
    }

    fn disk_export(config: &ProviderConfig, machine: &MachineRef) -> Result<()> {
        carry::export(config, machine)
    }

    fn disk_import(config: &ProviderConfig, machine: &Machine) -> Result<MachineStatus> {
        carry::import(config, machine)
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

    fn delete(config: &ProviderConfig, machine: &MachineRef, off: &PowerOff) -> Result<()> {
        with_vim(config, |vim| {
            let Some(vm) = find_machine(vim, machine)? else { return Ok(()) };
            let r = (|| {
                ensure_power(vim, &vm, PowerState::PoweredOff, off)?;
                let name = vm_name_of(vim, &vm)?;
                info!("destroying vSphere VM {name}");
                vim.run_task(&format!("Destroy_Task {name}"), &soap::simple("Destroy_Task", &vm)).map(|_| ())
            })();
            match r {
                Err(SessionError::Failed(e)) if e.is_not_found() => Ok(()),
                other => other,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm(xml_props: &[(&str, Node)]) -> ObjectContent {
        ObjectContent { props: xml_props.iter().cloned().map(|(k, v)| (k.to_string(), v)).collect(), ..Default::default() }
    }

    fn text(t: &str) -> Node {
        Node { text: t.into(), ..Default::default() }
    }

    #[test]
    fn status_reports_addresses_and_phase() {
        let nic = Node {
            name: "GuestNicInfo".into(),
            children: vec![
                Node { name: "ipAddress".into(), text: "10.0.0.5".into(), ..Default::default() },
                Node { name: "ipAddress".into(), text: "fe80::1".into(), ..Default::default() },
                Node { name: "ipAddress".into(), text: "10.0.0.6".into(), ..Default::default() },
            ],
            ..Default::default()
        };
        let on = vm(&[
            ("name", text("ns_vm")),
            ("config.uuid", text("4211-abc")),
            ("runtime.powerState", text("poweredOn")),
            ("guest.ipAddress", text("10.0.0.5")),
            ("guest.net", Node { children: vec![nic], ..Default::default() }),
        ]);
        let s = status(&on, &PortGroups::new());
        assert_eq!(s.provider_id, "vsphere://4211-abc");
        assert_eq!(s.power_state, PowerState::PoweredOn);
        assert_eq!(s.phase, MachinePhase::Running);
        let ips: Vec<&str> = s.addresses.iter().map(|a| a.address.as_str()).collect();
        assert_eq!(ips, ["10.0.0.5", "10.0.0.6"]);
        let waiting = vm(&[("runtime.powerState", text("poweredOn"))]);
        assert_eq!(status(&waiting, &PortGroups::new()).phase, MachinePhase::WaitingForAddress);
        let off = vm(&[("runtime.powerState", text("poweredOff"))]);
        assert_eq!(status(&off, &PortGroups::new()).phase, MachinePhase::PoweredOff);
        assert_eq!(status(&off, &PortGroups::new()).power_state, PowerState::PoweredOff);
    }

    fn machine_ref(backend_id: Option<&str>) -> MachineRef {
        MachineRef {
            uid: "u-1".into(),
            name: "a".into(),
            namespace: "ns".into(),
            provider_id: Some("vsphere://4211".into()),
            failure_domain: "DC0_C0".into(),
            backend_id: backend_id.map(str::to_string),
        }
    }

    #[test]
    fn an_adopted_machine_is_found_by_its_backend_id_and_only_while_it_carries_its_mark() {
        assert_eq!(lookup_of(&machine_ref(None)), Lookup::Made("u-1"));
        assert_eq!(lookup_of(&machine_ref(Some(""))), Lookup::Made("u-1"), "an empty backend id is none");
        assert_eq!(lookup_of(&machine_ref(Some("5003-abc"))), Lookup::Adopted("5003-abc"));
        let mark = |uid: &str| OwnerMark { machine_uid: uid.into(), machine: "ns/other".into(), installation: String::new() };
        let m = machine_ref(Some("5003-abc"));
        assert_eq!(not_ours(Some(&mark("u-1")), &m), None);
        assert!(not_ours(Some(&mark("u-2")), &m).is_some_and(|why| why.contains("ns/other") && why.contains("u-2")), "taken by another");
        assert!(not_ours(None, &m).is_some_and(|why| why.contains("released")), "let go of");
    }

    #[test]
    fn a_nic_on_a_distributed_port_group_is_on_its_name_when_known() {
        let nic = |backing: Node| Node { name: "VirtualDevice".into(), xsi_type: Some("VirtualVmxnet3".into()), children: vec![leaf("key", "4000"), backing, leaf("macAddress", "00:50:56:00:00:01")], ..Default::default() };
        let dv = Node { name: "backing".into(), children: vec![Node { name: "port".into(), children: vec![leaf("switchUuid", "sw"), leaf("portgroupKey", "dvportgroup-13")], ..Default::default() }], ..Default::default() };
        let std = Node { name: "backing".into(), children: vec![leaf("deviceName", "VM Network")], ..Default::default() };
        let v = vm(&[("config.hardware.numCPU", text("1")), ("config.hardware.device", Node { children: vec![nic(dv), nic(std)], ..Default::default() })]);
        let networks = |pg: &PortGroups| hardware(&v, pg).unwrap().nics.into_iter().map(|n| n.network).collect::<Vec<_>>();
        assert_eq!(networks(&PortGroups::from([("dvportgroup-13".to_string(), "DC0_DVPG0".to_string())])), ["DC0_DVPG0", "VM Network"]);
        assert_eq!(networks(&PortGroups::new()), ["dvportgroup-13", "VM Network"], "unknown: its key");
    }

    #[test]
    fn ethernet_cards_are_found_by_their_mac_fields() {
        let devs = Node {
            children: vec![
                Node { name: "VirtualDevice".into(), xsi_type: Some("VirtualIDEController".into()), children: vec![Node { name: "key".into(), text: "200".into(), ..Default::default() }], ..Default::default() },
                Node {
                    name: "VirtualDevice".into(),
                    xsi_type: Some("VirtualE1000".into()),
                    children: vec![
                        Node { name: "key".into(), text: "4000".into(), ..Default::default() },
                        Node { name: "addressType".into(), text: "generated".into(), ..Default::default() },
                    ],
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        assert_eq!(ethernet_cards(Some(&devs)), vec![("VirtualE1000".to_string(), 4000)]);
    }

    fn leaf(name: &str, text: &str) -> Node {
        Node { name: name.into(), text: text.into(), ..Default::default() }
    }

    fn device(kind: &str, fields: &[(&str, &str)]) -> Node {
        Node { name: "VirtualDevice".into(), xsi_type: Some(kind.into()), children: fields.iter().map(|(k, v)| leaf(k, v)).collect(), ..Default::default() }
    }

    /// A template as vcsim clones it: an LSI Logic controller with a 1 GiB disk at unit 0.
    fn devices(extra: Vec<Node>) -> Node {
        let mut disk = device("VirtualDisk", &[("key", "2000"), ("controllerKey", "1000"), ("unitNumber", "0"), ("capacityInKB", "1048576")]);
        disk.children.push(Node { name: "backing".into(), children: vec![leaf("fileName", "[LocalDS_0] vm/vm.vmdk"), leaf("diskMode", "persistent")], ..Default::default() });
        let mut children = vec![device("VirtualLsiLogicController", &[("key", "1000")]), disk];
        children.extend(extra);
        Node { children, ..Default::default() }
    }

    fn want(sizes: &[u64]) -> Vec<banlieue_sdk::provider::Disk> {
        sizes.iter().enumerate().map(|(i, s)| banlieue_sdk::provider::Disk { name: format!("d{i}"), size_gib: *s, target: "LocalDS_1".into() }).collect()
    }

    #[test]
    fn the_boot_disk_is_grown_and_further_disks_are_added_on_its_controller() {
        let devs = devices(vec![device("VirtualCdrom", &[("key", "3000"), ("controllerKey", "1000"), ("unitNumber", "1")])]);
        let changes = disk_changes("vm", Some(&devs), &want(&[20, 5, 2])).unwrap();
        assert_eq!(changes.len(), 3, "{changes:?}");
        assert!(matches!(&changes[0], DiskChange::Grow { disk, capacity_kib } if disk.key == 2000 && disk.file == "[LocalDS_0] vm/vm.vmdk" && *capacity_kib == 20 << 20));
        // Unit 0 is the boot disk's, 1 the CD-ROM's: the next free ones.
        assert_eq!(changes[1], DiskChange::Add { controller: 1000, unit: 2, capacity_kib: 5 << 20, datastore: "LocalDS_1".into() });
        assert_eq!(changes[2], DiskChange::Add { controller: 1000, unit: 3, capacity_kib: 2 << 20, datastore: "LocalDS_1".into() });
        let xml = ConfigSpec { disks: changes, ..Default::default() }.xml();
        assert!(xml.contains("<operation>edit</operation>") && xml.contains("<fileName>[LocalDS_1]</fileName>") && xml.contains("<fileOperation>create</fileOperation>"), "{xml}");
    }

    #[test]
    fn disks_as_declared_need_no_change_and_a_shrink_is_refused() {
        assert_eq!(disk_changes("vm", Some(&devices(vec![])), &want(&[1])).unwrap(), vec![]);
        assert_eq!(disk_changes("vm", Some(&devices(vec![])), &want(&[])).unwrap(), vec![]);
        let refused = disk_changes("vm", Some(&devices(vec![])), &want(&[2])).map(|_| ()).and_then(|()| disk_changes("vm", Some(&devices(vec![])), &[banlieue_sdk::provider::Disk { name: "root".into(), size_gib: 0, target: String::new() }]));
        assert!(refused.is_ok(), "a size of 0 keeps the image's");
        let mut big = devices(vec![]);
        big.children[1].children[3].text = (40u64 << 20).to_string();
        let shrink = disk_changes("vm", Some(&big), &want(&[20])).unwrap_err();
        assert!(matches!(&shrink, Error::InvalidSpec(m) if m.contains("never shrunk") && m.contains("at least 40 GiB")), "{shrink:?}");
    }

    #[test]
    fn a_full_controller_or_a_template_without_a_disk_says_so() {
        let units: Vec<Node> = (1..16).filter(|u| *u != 7).map(|u| device("VirtualDisk", &[("key", &(2000 + u).to_string()), ("controllerKey", "1000"), ("unitNumber", &u.to_string()), ("capacityInKB", "1024")])).collect();
        let full = disk_changes("vm", Some(&devices(units)), &want(&[0; 16])).unwrap_err();
        assert!(matches!(&full, Error::InvalidSpec(m) if m.contains("no free unit")), "{full:?}");
        let bare = Node { children: vec![device("VirtualLsiLogicController", &[("key", "1000")])], ..Default::default() };
        assert!(matches!(disk_changes("vm", Some(&bare), &want(&[10])), Err(Error::InvalidSpec(m)) if m.contains("no virtual disk")));
    }
}

banlieue_sdk::export_provider!(VSphere);
