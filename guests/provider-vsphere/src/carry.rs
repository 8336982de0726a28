//! `disk-export` and `disk-import`: a machine's disks carried to or from another backend
//! (a move that keeps the VM's data). The bytes never pass through the driver: it names
//! URLs on the Provider's endpoint and the host streams.
//!
//! - `disk-export`: the powered-off VM (found by its instance UUID) hands each virtual disk
//!   to the host in controller and unit order — the order `describe` reports them in, so
//!   the boot disk first — named `disk0`, `disk1`, … by position (vCenter keeps no names
//!   for disks; the host names unnamed disks by position too). The host GETs each disk
//!   through vCenter's datastore file access, `/folder/{path}?dcPath={datacenter}&dsName=
//!   {datastore}`, with the session cookie. A disk's backing names its descriptor
//!   (`[ds] vm/vm.vmdk`), a few lines of text naming the extent that holds the data (on
//!   VMFS and NFS `vm-flat.vmdk`, raw): the driver reads the descriptor and exports that
//!   extent. A disk that is a child of another (a snapshot's delta, a linked clone) or not
//!   one plain datastore file (vSAN and VVol objects, raw device mappings, split extents)
//!   cannot be read as one file and is refused (`invalid-spec`): delete the VM's snapshots
//!   first. vcsim writes empty descriptors (and empty extents): the extent is then the
//!   conventional `-flat.vmdk`.
//! - `disk-import`: the carried disks (stream-optimised VMDK, the ProviderClass's
//!   `imageFormat: vmdk`) become the machine's first disks by position, through one
//!   `ImportVApp` as in [`crate::import`]: a VM named as `create` names it, in the machine's
//!   cluster, folder and pool, with its CPUs, memory, firmware, NICs (MACs as `create` sets
//!   them) and guestinfo (metadata and user-data, as `create` sets them — `create` does not
//!   set NICs or guestinfo on a VM it finds), an LSI Logic controller and one thin disk per
//!   carried disk on the declared disk's datastore, of the carried virtual size or the
//!   declared size if larger. The host streams each disk to its lease upload URL
//!   (`transfer.carried-to-http`), the lease is completed, and only then does the VM get the
//!   machine's UID as its instance UUID: the VM `create` (and every other call) finds by it
//!   is always a finished one. `create` then adopts it like any VM it finds: further declared
//!   disks added, power as asked. Until then the VM's annotation marks it unfinished: a
//!   failed upload aborts the lease and destroys the VM, and a later call destroys one an
//!   interrupted call left, so nothing partial stays. A VM that already has the UID is
//!   returned untouched.

use banlieue_sdk::provider::{Firmware, Machine, MachineRef, MachineStatus, ProviderConfig, Result};
use banlieue_sdk::session::SessionError;
use banlieue_sdk::transfer::{self, CarriedDisk};
use banlieue_sdk::{Error, info, warn};

use crate::import::{destroy, lease_info, upload_url};
use crate::soap::{self, ConfigSpec, DiskChange, MoRef, NetworkBacking, Node, PropSpec};
use crate::vim::{COOKIE, VResult, Vim};
use crate::{INVENTORY, Inv, controller_units, describe_vm, extra_config, lookup, nic_mac, virtual_disks, vm_name, with_vim};

/// The media type vCenter takes a stream-optimised VMDK upload as.
pub const STREAM_VMDK: &str = "application/x-vnd.vmware-streamVmdk";

/// The temporary key of the SCSI controller an imported VM gets (new devices take negative keys).
const CONTROLLER_KEY: i32 = -10;

/// The controller an imported VM's disks are on: LSI Logic, which most guests have a driver for.
const CONTROLLER: &str = "VirtualLsiLogicController";

/// How much of a descriptor is read: they are a few hundred bytes.
const DESCRIPTOR_MAX: usize = 64 << 10;

// ------------------------------------------------------------------ export

/// One of the VM's disks to export.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportDisk {
    /// The name it is handed over as (`disk{position}`).
    pub name: String,
    pub datastore: String,
    /// Its descriptor's path on the datastore.
    pub descriptor: String,
}

/// The datastore and path of a datastore path: `[ds] vm/vm.vmdk` → (`ds`, `vm/vm.vmdk`).
pub fn datastore_path(file: &str) -> Option<(&str, &str)> {
    let (ds, path) = file.strip_prefix('[')?.split_once(']')?;
    let path = path.trim_start();
    (!ds.is_empty() && !path.is_empty()).then_some((ds, path))
}

/// Backings whose descriptor is one file on the datastore (raw device mappings are not).
const FILE_BACKINGS: &[&str] = &[
    "VirtualDiskFlatVer2BackingInfo",
    "VirtualDiskFlatVer1BackingInfo",
    "VirtualDiskSparseVer2BackingInfo",
    "VirtualDiskSparseVer1BackingInfo",
    "VirtualDiskSeSparseBackingInfo",
];

/// The VM's disks to export, boot disk first (controller and unit order, as `describe`
/// reports them). A disk with a parent — a snapshot's delta, a linked clone's — holds only
/// what changed since, and one that is no datastore file cannot be read; both are refused.
pub fn export_disks(vm: &str, devices: Option<&Node>) -> Result<Vec<ExportDisk>> {
    let all = devices.map(|d| d.children.as_slice()).unwrap_or_default();
    let mut out = Vec::new();
    for (i, disk) in virtual_disks(devices).into_iter().enumerate() {
        let device = all.iter().find(|d| d.xsi_type.as_deref() == Some("VirtualDisk") && d.str_at("key").and_then(|k| k.parse().ok()) == Some(disk.key));
        let backing = device.and_then(|d| d.child("backing"));
        let kind = backing.and_then(|b| b.xsi_type.as_deref()).unwrap_or("");
        if !FILE_BACKINGS.contains(&kind) {
            return Err(Error::InvalidSpec(format!("disk {i} of vSphere VM {vm} is backed by a {kind}, not a datastore file: it cannot be exported")));
        }
        if backing.and_then(|b| b.child("parent")).is_some() {
            return Err(Error::InvalidSpec(format!(
                "disk {i} of vSphere VM {vm} ({}) is a child disk (the VM has snapshots or is a linked clone): its data is spread over several files; delete its snapshots (or clone it in full) before it is moved",
                disk.file
            )));
        }
        let Some((datastore, descriptor)) = datastore_path(&disk.file) else {
            return Err(Error::InvalidSpec(format!("disk {i} of vSphere VM {vm} has no datastore file ({:?}): it cannot be exported", disk.file)));
        };
        out.push(ExportDisk { name: format!("disk{i}"), datastore: datastore.to_string(), descriptor: descriptor.to_string() });
    }
    Ok(out)
}

/// Percent-encode `s` for a URL, leaving unreserved characters (and `/` in a path).
fn encode(s: &str, path: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') || (path && b == b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `scheme://authority` of the Provider's endpoint (its `/sdk` path left out).
fn origin(endpoint: &str) -> String {
    let (scheme, rest) = endpoint.split_once("://").unwrap_or(("https", endpoint));
    format!("{scheme}://{}", rest.split('/').next().unwrap_or(""))
}

/// The URL of file `path` on datastore `datastore` of the datacenter at inventory path
/// `datacenter`, through vCenter's datastore file access on the Provider's endpoint.
pub fn datastore_url(endpoint: &str, datacenter: &str, datastore: &str, path: &str) -> String {
    format!("{}/folder/{}?dcPath={}&dsName={}", origin(endpoint), encode(path.trim_start_matches('/'), true), encode(datacenter, false), encode(datastore, false))
}

/// The datastore path of the file that holds the data of the disk whose descriptor is at
/// `descriptor` and begins with `head`: the one flat extent it names, beside it. A hosted
/// sparse disk (binary, `KDMV`) holds its own data; an empty descriptor (vcsim's) means the
/// conventional `-flat.vmdk`. Child, sparse, split and non-file (vSAN, VVol, RDM) disks are refused.
pub fn data_file(disk: &str, descriptor: &str, head: &[u8]) -> Result<String> {
    let refuse = |why: String| Error::InvalidSpec(format!("disk {disk} ({descriptor}) cannot be exported as one file: {why}"));
    if head.iter().all(u8::is_ascii_whitespace) {
        let stem = descriptor.strip_suffix(".vmdk").unwrap_or(descriptor);
        return Ok(format!("{stem}-flat.vmdk"));
    }
    if head.starts_with(b"KDMV") || head.starts_with(b"COWD") {
        return Ok(descriptor.to_string());
    }
    let text = String::from_utf8_lossy(head);
    let mut extents = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        if let Some(v) = line.strip_prefix("parentCID=") {
            let v = v.trim().trim_matches('"');
            if !v.eq_ignore_ascii_case("ffffffff") {
                return Err(refuse(format!("it is a child of another disk (parentCID {v}): delete the VM's snapshots first")));
            }
        } else if ["RW ", "RDONLY ", "NOACCESS "].iter().any(|a| line.starts_with(a)) {
            // `RW 41943040 VMFS "vm-flat.vmdk" [offset]`: access, sectors, type, file.
            let mut parts = line.splitn(4, ' ');
            let (_, _, kind, rest) = (parts.next(), parts.next(), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            let file = rest.trim().strip_prefix('"').and_then(|r| r.split_once('"')).map(|(f, _)| f).unwrap_or("");
            extents.push((kind.to_string(), file.to_string()));
        }
    }
    let [(kind, file)] = extents.as_slice() else {
        return Err(refuse(format!("its descriptor names {} extents, not one", extents.len())));
    };
    if !matches!(kind.as_str(), "VMFS" | "FLAT") {
        return Err(refuse(format!("its extent is of type {kind} (sparse, delta or raw device), not a flat file")));
    }
    if file.is_empty() || file.contains("://") || file.starts_with('/') {
        return Err(refuse(format!("its extent {file:?} is not a file beside the descriptor (a vSAN or VVol object?)")));
    }
    Ok(match descriptor.rsplit_once('/') {
        Some((dir, _)) => format!("{dir}/{file}"),
        None => file.clone(),
    })
}

/// The inventory path of the datacenter above `parent` (a VM's folder), as `dcPath` takes it.
fn datacenter_path(vim: &Vim, mut cur: Option<MoRef>) -> VResult<String> {
    let mut names = Vec::new();
    let mut found = false;
    // Inventories nest a few levels; the cap keeps a malformed answer from looping.
    for _ in 0..64 {
        let Some(r) = cur.take() else { break };
        if r == vim.sc.root_folder {
            break;
        }
        let o = vim.props(&r, &["name", "parent"])?;
        found |= r.kind == "Datacenter";
        if found {
            names.push(o.str("name").unwrap_or_default().to_string());
        }
        cur = o.reference("parent");
    }
    if !found {
        return Err(Error::Internal("the VM is in no datacenter".into()).into());
    }
    names.reverse();
    Ok(names.join("/"))
}

/// The first bytes of a datastore file (a descriptor), through the SOAP client's HTTP.
fn read_head(vim: &Vim, url: &str, what: &str) -> VResult<Vec<u8>> {
    let cookie = format!("{COOKIE}={}", vim.cookie);
    let range = format!("bytes=0-{}", DESCRIPTOR_MAX - 1);
    let resp = vim.http.send("GET", url, &[("cookie", cookie.as_str()), ("range", range.as_str())], None)?;
    match resp.status {
        // A server that ignores the range sends it all: a descriptor is small anyway.
        200 | 206 => Ok(resp.body.into_iter().take(DESCRIPTOR_MAX).collect()),
        // No byte in the range: an empty file.
        416 => Ok(Vec::new()),
        404 => Err(Error::InvalidSpec(format!("{what}: vCenter has no such file ({url})")).into()),
        s => Err(banlieue_sdk::http::status_error(s, format!("{what}: GET {url}: HTTP {s}")).into()),
    }
}

/// Hand the powered-off machine's disks to the host, boot disk first.
pub fn export(config: &ProviderConfig, machine: &MachineRef) -> Result<()> {
    let name = vm_name(&machine.namespace, &machine.name);
    // Every SOAP call comes before the first disk: a session rejected later would run the
    // closure again, and the host takes each disk once.
    let (cookie, sources) = with_vim(config, |vim| {
        let vm = lookup(vim, &machine.uid, &name)?;
        let p = vim.props(&vm, &["name", "runtime.powerState", "config.hardware.device", "parent"])?;
        let vm_name = p.str("name").unwrap_or(&name).to_string();
        let state = p.str("runtime.powerState").unwrap_or("in an unknown power state");
        if state != "poweredOff" {
            return Err(Error::InvalidSpec(format!("vSphere VM {vm_name} is {state}: its disks are exported once it is powered off")).into());
        }
        let disks = export_disks(&vm_name, p.props.get("config.hardware.device"))?;
        if disks.is_empty() {
            return Err(Error::InvalidSpec(format!("vSphere VM {vm_name} has no virtual disk to export")).into());
        }
        let dc = datacenter_path(vim, p.reference("parent"))?;
        let mut sources = Vec::new();
        for d in disks {
            let what = format!("disk {} of vSphere VM {vm_name}", d.name);
            let head = read_head(vim, &datastore_url(&config.endpoint, &dc, &d.datastore, &d.descriptor), &what)?;
            let data = data_file(&d.name, &d.descriptor, &head)?;
            sources.push((d.name, format!("[{}] {data}", d.datastore), datastore_url(&config.endpoint, &dc, &d.datastore, &data)));
        }
        Ok((vim.cookie.to_string(), sources))
    })?;
    let headers = [("Cookie".to_string(), format!("{COOKIE}={cookie}"))];
    for (disk, file, url) in sources {
        let bytes = transfer::from_http(&disk, &url, &headers)?;
        info!("exported disk {disk} of vSphere VM {name} ({file}, {bytes} bytes)");
    }
    Ok(())
}

// ------------------------------------------------------------------ import

/// One disk of the imported VM: a carried disk, where it goes and how large it is made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Landing {
    pub carried: String,
    /// The declared disk's datastore.
    pub datastore: String,
    pub unit: i32,
    pub capacity_kib: u64,
}

/// Where each carried disk lands, by position: on the datastore of the declared disk in
/// its place, at the next free unit of the VM's controller, as large as the carried disk's
/// virtual size or the declared size if larger. Refused: no disks, fewer declared than
/// carried, a declared disk smaller than what it carries (a disk is never shrunk; 0 GiB
/// takes the carried size), another format than stream-optimised VMDK, more disks than the
/// controller has units.
pub fn plan(machine: &Machine, carried: &[CarriedDisk]) -> Result<Vec<Landing>> {
    let who = format!("machine {}/{}", machine.namespace, machine.name);
    if carried.is_empty() {
        return Err(Error::InvalidSpec(format!("no disks were carried for {who}")));
    }
    if machine.disks.len() < carried.len() {
        return Err(Error::InvalidSpec(format!("{} disks were carried; {who} declares {}: declare at least as many", carried.len(), machine.disks.len())));
    }
    let units = controller_units(CONTROLLER);
    if carried.len() > units.len() {
        return Err(Error::InvalidSpec(format!("{} disks were carried for {who}; the vSphere driver puts at most {} on one controller", carried.len(), units.len())));
    }
    let mut out = Vec::new();
    for ((disk, from), unit) in machine.disks.iter().zip(carried).zip(units) {
        if from.format != "vmdk" {
            return Err(Error::InvalidSpec(format!(
                "carried disk {} is {}; the vSphere driver takes stream-optimised VMDK (set the ProviderClass's imageFormat to vmdk)",
                from.name, from.format
            )));
        }
        if disk.size_gib != 0 && disk.size_gib << 30 < from.virtual_size {
            let need = from.virtual_size.div_ceil(1 << 30);
            return Err(Error::InvalidSpec(format!(
                "carried disk {} holds {need} GiB; disk {} declares {} GiB and a disk is never shrunk: declare at least {need} GiB",
                from.name, disk.name, disk.size_gib
            )));
        }
        if disk.target.is_empty() {
            return Err(Error::InvalidSpec(format!("disk {} of {who} has no datastore (map its storage class to one)", disk.name)));
        }
        out.push(Landing { carried: from.name.clone(), datastore: disk.target.clone(), unit, capacity_kib: from.virtual_size.div_ceil(1024).max(disk.size_gib << 20) });
    }
    Ok(out)
}

/// What the annotation of a VM still being imported for machine `uid` says.
pub fn unfinished(machine: &Machine) -> String {
    format!("banlieue disk-import of machine {}/{} ({}): not finished", machine.namespace, machine.name, machine.uid)
}

/// The new VM: named as `create` names it, with the machine's hardware and guestinfo as
/// `create` gives a clone, one thin disk per landing on a new controller, marked unfinished
/// and without the machine's UID yet.
pub fn import_spec(machine: &Machine, plan: &[Landing], nics: Vec<NetworkBacking>) -> ConfigSpec {
    let statics = banlieue_sdk::network::any_static(&machine.nics);
    ConfigSpec {
        name: Some(vm_name(&machine.namespace, &machine.name)),
        guest_id: Some("otherGuest64".into()),
        annotation: Some(unfinished(machine)),
        vm_path: plan.first().map(|l| format!("[{}]", l.datastore)),
        cpus: Some(machine.cpus),
        memory_mib: Some(machine.memory_mib),
        scsi_controller: Some(CONTROLLER_KEY),
        nic_macs: (0..nics.len()).map(|i| statics.then(|| nic_mac(machine, i))).collect(),
        add_nics: nics,
        extra_config: extra_config(machine),
        firmware: Some(match machine.firmware {
            Firmware::Bios => "bios".into(),
            Firmware::Uefi => "efi".into(),
        }),
        disks: plan
            .iter()
            .map(|l| DiskChange::Add { controller: CONTROLLER_KEY, unit: l.unit, capacity_kib: l.capacity_kib, datastore: l.datastore.clone() })
            .collect(),
        ..Default::default()
    }
}

/// The upload URL of each disk of a ready lease's `info`, in disk order. vCenter keys a
/// device URL `/vm-1/VirtualLsiLogicController0:{unit}`, vcsim `/vm-1/VirtualDisk:{n}`;
/// either sorts by the number after the last `:` into the order the disks were declared in
/// (one controller, units ascending).
pub fn disk_urls(info: &Node, endpoint: &str) -> Vec<String> {
    let mut disks: Vec<((String, u64), String)> = info
        .all("deviceUrl")
        .filter(|d| d.str_at("disk") == Some("true"))
        .filter_map(|d| {
            let key = d.str_at("key").unwrap_or_default();
            let (prefix, n) = key.rsplit_once(':').unwrap_or((key, ""));
            Some(((prefix.to_string(), n.parse().unwrap_or(u64::MAX)), upload_url(d.str_at("url")?, endpoint)))
        })
        .collect();
    disks.sort();
    disks.into_iter().map(|(_, url)| url).collect()
}

/// Stream each carried disk through the lease and complete it; the imported VM.
fn upload(vim: &Vim, config: &ProviderConfig, lease: &MoRef, plan: &[Landing]) -> VResult<MoRef> {
    let info = lease_info(vim, lease)?;
    let vm = info.child("entity").and_then(Node::as_ref).ok_or_else(|| Error::Internal(format!("import lease {lease} names no VM")))?;
    let urls = disk_urls(&info, &config.endpoint);
    if urls.len() != plan.len() {
        return Err(Error::Internal(format!("import lease {lease} offers {} disk upload URLs for {} disks", urls.len(), plan.len())).into());
    }
    let headers = [("Content-Type".to_string(), STREAM_VMDK.to_string()), ("Cookie".to_string(), format!("{COOKIE}={}", vim.cookie))];
    for (i, (landing, url)) in plan.iter().zip(&urls).enumerate() {
        let status = transfer::carried_to_http(&landing.carried, "POST", url, &headers)?;
        if !(200..300).contains(&status) {
            return Err(Error::Unavailable(format!("vCenter refused the upload of disk {} to {url}: HTTP {status}", landing.carried)).into());
        }
        info!("uploaded carried disk {} to {url}", landing.carried);
        // Progress keeps the lease from expiring while the next disk streams; the completion
        // below reports a lease that expired anyway.
        let _ = vim.call(&format!("HttpNfcLeaseProgress {lease}"), &soap::lease_progress(lease, ((i + 1) * 100 / plan.len()) as u8));
    }
    vim.call(&format!("HttpNfcLeaseComplete {lease}"), &soap::simple("HttpNfcLeaseComplete", lease))?;
    Ok(vm)
}

/// VMs named `name`: (reference, annotation).
fn named(vim: &Vim, name: &str) -> VResult<Vec<(MoRef, String)>> {
    const VMS: &[PropSpec] = &[PropSpec { kind: "VirtualMachine", paths: &["name", "config.annotation"] }];
    Ok(Inv::read(vim, VMS)?
        .of_kind("VirtualMachine")
        .filter(|v| v.str("name") == Some(name))
        .filter_map(|v| Some((v.obj.clone()?, v.str("config.annotation").unwrap_or_default().to_string())))
        .collect())
}

/// Destroy what an unfinished import of the machine left (its VM, known by its annotation).
fn destroy_unfinished(vim: &Vim, machine: &Machine, name: &str) -> VResult<()> {
    let marker = unfinished(machine);
    for (vm, _) in named(vim, name)?.into_iter().filter(|(_, a)| *a == marker) {
        destroy(vim, &vm, name)?;
    }
    Ok(())
}

/// Make `machine` from the carried disks, or return the VM that already has its UID.
pub fn import(config: &ProviderConfig, machine: &Machine) -> Result<MachineStatus> {
    if machine.uid.is_empty() {
        return Err(Error::InvalidSpec("the machine has no UID".into()));
    }
    let name = vm_name(&machine.namespace, &machine.name);
    with_vim(config, |vim| {
        if let Some(vm) = vim.find_vm(&machine.uid)? {
            return describe_vm(vim, &vm);
        }
        let plan = plan(machine, &transfer::carried()?)?;
        let inv = Inv::read(vim, INVENTORY)?;
        let clusters = inv.clusters();
        let cluster = clusters.iter().find(|c| c.name == machine.failure_domain).ok_or_else(|| {
            Error::InvalidSpec(format!("failure domain {:?} is not a vSphere cluster of this vCenter", machine.failure_domain))
        })?;
        let pool = cluster.obj.reference("resourcePool").ok_or_else(|| Error::Internal(format!("cluster {} has no resource pool", cluster.name)))?;
        let folder = cluster.datacenter.reference("vmFolder").ok_or_else(|| Error::Internal("the datacenter has no VM folder".into()))?;
        // Every datastore and network is checked before anything is made.
        for d in &machine.disks {
            if inv.datastore_in(cluster, &d.target).is_none() {
                return Err(Error::InvalidSpec(format!("disk {}: datastore {:?} is not available in cluster {}", d.name, d.target, cluster.name)).into());
            }
        }
        let nics = machine
            .nics
            .iter()
            .map(|n| inv.network_in(cluster, &n.network).ok_or_else(|| Error::InvalidSpec(format!("network {:?} is not available in cluster {}", n.network, cluster.name))))
            .collect::<Result<Vec<_>>>()?;
        let marker = unfinished(machine);
        for (vm, annotation) in named(vim, &name)? {
            if annotation != marker {
                return Err(Error::InvalidSpec(format!("a vSphere VM named {name} exists and is not this machine (its instanceUuid is not {})", machine.uid)).into());
            }
            warn!("destroying vSphere VM {name}, left by a disk-import that did not finish");
            destroy(vim, &vm, &name)?;
        }
        info!("importing {} carried disk(s) into vSphere VM {name} (cluster {})", plan.len(), cluster.name);
        let body = soap::import_vm(&pool, &folder, &import_spec(machine, &plan, nics));
        let lease = vim
            .call(&format!("ImportVApp {name}"), &body)?
            .child("returnval")
            .and_then(Node::as_ref)
            .ok_or_else(|| Error::Internal(format!("ImportVApp {name}: vCenter returned no lease")))?;
        let made = upload(vim, config, &lease, &plan).and_then(|vm| {
            // The commit: from here `create` and every other call find the VM by the UID.
            let commit = ConfigSpec {
                instance_uuid: Some(machine.uid.clone()),
                annotation: Some(format!("banlieue machine {}/{}: its disks were carried from another backend", machine.namespace, machine.name)),
                ..Default::default()
            };
            vim.run_task(&format!("ReconfigVM_Task {name}"), &soap::reconfigure(&vm, &commit))?;
            Ok(vm)
        });
        let vm = match made {
            Ok(vm) => vm,
            Err(e) => {
                // Nothing partial stays: the lease is aborted and its VM destroyed.
                let _ = vim.call(&format!("HttpNfcLeaseAbort {lease}"), &soap::simple("HttpNfcLeaseAbort", &lease));
                if let Err(d) = destroy_unfinished(vim, machine, &name) {
                    warn!("vSphere VM {name} of a failed disk-import is left for the next call to destroy: {}", match &d {
                        SessionError::Failed(e) => e.message().to_string(),
                        SessionError::Rejected(m) => m.clone(),
                    });
                }
                return Err(e);
            }
        };
        describe_vm(vim, &vm)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_sdk::provider::{Disk, ImageSource, Nic, PowerState, UserDataFormat};

    fn leaf(name: &str, text: &str) -> Node {
        Node { name: name.into(), text: text.into(), ..Default::default() }
    }

    /// A `VirtualDisk` at `unit` of controller 1000 with a backing of `kind` on `file`.
    fn disk(key: &str, unit: &str, kind: &str, file: &str, parent: bool) -> Node {
        let mut backing = Node { name: "backing".into(), xsi_type: Some(kind.into()), children: vec![leaf("fileName", file), leaf("diskMode", "persistent")], ..Default::default() };
        if parent {
            backing.children.push(Node { name: "parent".into(), children: vec![leaf("fileName", "[ds] base/base.vmdk")], ..Default::default() });
        }
        Node {
            name: "VirtualDevice".into(),
            xsi_type: Some("VirtualDisk".into()),
            children: vec![leaf("key", key), leaf("controllerKey", "1000"), leaf("unitNumber", unit), leaf("capacityInKB", "1048576"), backing],
            ..Default::default()
        }
    }

    fn devices(disks: Vec<Node>) -> Node {
        Node { children: disks, ..Default::default() }
    }

    #[test]
    fn disks_are_exported_in_unit_order_named_by_position() {
        let devs = devices(vec![
            disk("2001", "1", "VirtualDiskFlatVer2BackingInfo", "[LocalDS_1] ns_vm/ns_vm_1.vmdk", false),
            disk("2000", "0", "VirtualDiskFlatVer2BackingInfo", "[LocalDS_0] ns_vm/ns_vm.vmdk", false),
        ]);
        assert_eq!(export_disks("ns_vm", Some(&devs)).unwrap(), vec![
            ExportDisk { name: "disk0".into(), datastore: "LocalDS_0".into(), descriptor: "ns_vm/ns_vm.vmdk".into() },
            ExportDisk { name: "disk1".into(), datastore: "LocalDS_1".into(), descriptor: "ns_vm/ns_vm_1.vmdk".into() },
        ]);
        assert!(export_disks("ns_vm", None).unwrap().is_empty());
    }

    #[test]
    fn child_disks_and_raw_device_mappings_are_not_exported() {
        let child = devices(vec![disk("2000", "0", "VirtualDiskFlatVer2BackingInfo", "[ds] vm/vm-000001.vmdk", true)]);
        let e = export_disks("vm", Some(&child)).unwrap_err();
        assert!(matches!(&e, Error::InvalidSpec(m) if m.contains("child disk") && m.contains("snapshots")), "{e:?}");
        let rdm = devices(vec![disk("2000", "0", "VirtualDiskRawDiskMappingVer1BackingInfo", "[ds] vm/vm.vmdk", false)]);
        assert!(matches!(export_disks("vm", Some(&rdm)), Err(Error::InvalidSpec(m)) if m.contains("RawDiskMapping")));
    }

    #[test]
    fn datastore_paths_split_and_urls_are_on_the_endpoint() {
        assert_eq!(datastore_path("[LocalDS_0] ns_vm/ns_vm.vmdk"), Some(("LocalDS_0", "ns_vm/ns_vm.vmdk")));
        assert_eq!(datastore_path("[my ds]vm/a b.vmdk"), Some(("my ds", "vm/a b.vmdk")));
        assert_eq!(datastore_path("[LocalDS_0]"), None);
        assert_eq!(datastore_path("vm.vmdk"), None);
        assert_eq!(
            datastore_url("http://127.0.0.1:8989/sdk", "DC0", "LocalDS_0", "ns_vm/ns_vm-flat.vmdk"),
            "http://127.0.0.1:8989/folder/ns_vm/ns_vm-flat.vmdk?dcPath=DC0&dsName=LocalDS_0"
        );
        assert_eq!(
            datastore_url("https://vc.lab", "Lab/DC 1", "ds&1", "my vm/my vm-flat.vmdk"),
            "https://vc.lab/folder/my%20vm/my%20vm-flat.vmdk?dcPath=Lab%2FDC%201&dsName=ds%261"
        );
    }

    const FLAT: &str = "# Disk DescriptorFile\nversion=1\nencoding=\"UTF-8\"\nCID=fffffffe\nparentCID=ffffffff\ncreateType=\"vmfs\"\n\n# Extent description\nRW 41943040 VMFS \"ns_vm-flat.vmdk\"\n\n# The Disk Data Base\nddb.virtualHWVersion = \"13\"\n";

    #[test]
    fn the_descriptor_names_the_file_that_holds_the_data() {
        assert_eq!(data_file("disk0", "ns_vm/ns_vm.vmdk", FLAT.as_bytes()).unwrap(), "ns_vm/ns_vm-flat.vmdk");
        assert_eq!(data_file("disk0", "vm.vmdk", b"RW 2048 FLAT \"vm-flat.vmdk\" 0\n").unwrap(), "vm-flat.vmdk");
        // vcsim writes an empty descriptor beside an empty -flat file.
        assert_eq!(data_file("disk0", "ns_vm/ns_vm_1.vmdk", b"").unwrap(), "ns_vm/ns_vm_1-flat.vmdk");
        assert_eq!(data_file("disk0", "vm/vm.vmdk", b"KDMV\x01\x00\x00\x00").unwrap(), "vm/vm.vmdk");
    }

    #[test]
    fn child_split_and_object_disks_are_refused() {
        let child = FLAT.replace("parentCID=ffffffff", "parentCID=2c8f3a11").replace("VMFS \"ns_vm-flat", "VMFSSPARSE \"ns_vm-000001-delta");
        let e = data_file("disk0", "vm/vm-000001.vmdk", child.as_bytes()).unwrap_err();
        assert!(matches!(&e, Error::InvalidSpec(m) if m.contains("child of another disk")), "{e:?}");
        let sesparse = FLAT.replace("VMFS \"ns_vm-flat", "SESPARSE \"ns_vm-sesparse");
        assert!(matches!(data_file("disk0", "vm/vm.vmdk", sesparse.as_bytes()), Err(Error::InvalidSpec(m)) if m.contains("SESPARSE")));
        let split = "RW 4192256 FLAT \"vm-f001.vmdk\" 0\nRW 4192256 FLAT \"vm-f002.vmdk\" 0\n";
        assert!(matches!(data_file("disk0", "vm/vm.vmdk", split.as_bytes()), Err(Error::InvalidSpec(m)) if m.contains("2 extents")));
        let vsan = FLAT.replace("\"ns_vm-flat.vmdk\"", "\"vsan://52e8a8d3-5f1b/2b0c\"");
        assert!(matches!(data_file("disk0", "vm/vm.vmdk", vsan.as_bytes()), Err(Error::InvalidSpec(m)) if m.contains("vSAN")));
    }

    fn machine(sizes: &[u64]) -> Machine {
        Machine {
            uid: "4f1c2d3e-0000-4000-8000-000000000001".into(),
            name: "web".into(),
            namespace: "ns".into(),
            cpus: 2,
            memory_mib: 2048,
            firmware: Firmware::Uefi,
            disks: sizes.iter().enumerate().map(|(i, s)| Disk { name: format!("d{i}"), size_gib: *s, target: format!("LocalDS_{}", i % 2) }).collect(),
            nics: vec![Nic { name: "eth0".into(), network: "VM Network".into(), ip: None }],
            image: ImageSource::Template(String::new()),
            user_data: Some("#cloud-config\n".into()),
            user_data_format: UserDataFormat::CloudConfig,
            failure_domain: "DC0_C0".into(),
            power_state: PowerState::PoweredOn,
            labels: vec![],
        }
    }

    fn carried(name: &str, format: &str, bytes: u64) -> CarriedDisk {
        CarriedDisk { name: name.into(), format: format.into(), size: 1 << 20, virtual_size: bytes }
    }

    #[test]
    fn carried_disks_land_in_order_sized_to_the_larger_of_carried_and_declared() {
        let m = machine(&[10, 2, 5]);
        let got = plan(&m, &[carried("disk0", "vmdk", 10 << 30), carried("disk1", "vmdk", (1 << 30) + 512)]).unwrap();
        assert_eq!(got, vec![
            Landing { carried: "disk0".into(), datastore: "LocalDS_0".into(), unit: 0, capacity_kib: 10 << 20 },
            Landing { carried: "disk1".into(), datastore: "LocalDS_1".into(), unit: 1, capacity_kib: 2 << 20 },
        ]);
        // 0 GiB declared keeps the carried size, to the KiB.
        let got = plan(&machine(&[0]), &[carried("root", "vmdk", (3 << 30) + 512)]).unwrap();
        assert_eq!(got[0].capacity_kib, (3 << 20) + 1);
    }

    #[test]
    fn fewer_smaller_or_too_many_disks_or_another_format_are_refused() {
        let e = plan(&machine(&[10]), &[carried("a", "vmdk", 1 << 30), carried("b", "vmdk", 1 << 30)]).unwrap_err();
        assert!(matches!(&e, Error::InvalidSpec(m) if m.contains("declare at least as many")), "{e:?}");
        let e = plan(&machine(&[9]), &[carried("a", "vmdk", (9 << 30) + 512)]).unwrap_err();
        assert!(matches!(&e, Error::InvalidSpec(m) if m.contains("never shrunk") && m.contains("at least 10 GiB")), "{e:?}");
        let e = plan(&machine(&[10]), &[carried("a", "qcow2", 1 << 30)]).unwrap_err();
        assert!(matches!(&e, Error::InvalidSpec(m) if m.contains("imageFormat to vmdk") && m.contains("qcow2")), "{e:?}");
        assert!(plan(&machine(&[10]), &[]).is_err());
        let many: Vec<CarriedDisk> = (0..16).map(|i| carried(&format!("d{i}"), "vmdk", 1 << 30)).collect();
        let e = plan(&machine(&[1; 16]), &many).unwrap_err();
        assert!(matches!(&e, Error::InvalidSpec(m) if m.contains("at most 15")), "{e:?}");
        // Fifteen fit: unit 7 is the controller's own.
        let fifteen = plan(&machine(&[1; 15]), &many[..15]).unwrap();
        assert_eq!(fifteen.iter().map(|l| l.unit).collect::<Vec<_>>(), [0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14, 15]);
    }

    #[test]
    fn the_import_spec_makes_the_machines_vm_unfinished_and_without_its_uid() {
        let m = machine(&[10, 2, 5]);
        let landed = plan(&m, &[carried("disk0", "vmdk", 10 << 30), carried("disk1", "vmdk", 1 << 30), carried("disk2", "vmdk", 5 << 30)]).unwrap();
        let nics = vec![NetworkBacking::Standard { name: "VM Network".into(), network: MoRef::new("Network", "network-7") }];
        let spec = import_spec(&m, &landed, nics);
        assert_eq!(spec.instance_uuid, None, "the UID comes once the disks are uploaded");
        let body = soap::import_vm(&MoRef::new("ResourcePool", "resgroup-8"), &MoRef::new("Folder", "group-v3"), &spec);
        let env = soap::envelope(&body);
        let doc = roxmltree::Document::parse(&env).unwrap();
        let config = doc.descendants().find(|n| n.has_tag_name("configSpec")).unwrap();
        let order: Vec<&str> = config.children().filter(|c| c.is_element()).map(|c| c.tag_name().name()).collect();
        assert_eq!(order, [
            "name", "guestId", "annotation", "files", "numCPUs", "memoryMB", "deviceChange", "deviceChange", "deviceChange", "deviceChange", "deviceChange",
            "extraConfig", "extraConfig", "extraConfig", "extraConfig", "firmware"
        ]);
        assert!(body.contains("<name>ns_web</name>") && body.contains("<vmPathName>[LocalDS_0]</vmPathName>") && body.contains("<firmware>efi</firmware>"), "{body}");
        assert!(body.contains(&format!("<annotation>{}</annotation>", unfinished(&m))));
        assert!(body.contains("<key>guestinfo.userdata</key>") && body.contains("<key>guestinfo.metadata</key>"));
        // The controller comes first, then the NIC; every disk is a new thin file on its datastore, on the controller.
        let changes: Vec<roxmltree::Node> = config.children().filter(|c| c.has_tag_name("deviceChange")).collect();
        fn device<'a, 'i>(c: &roxmltree::Node<'a, 'i>) -> roxmltree::Node<'a, 'i> {
            c.children().find(|d| d.has_tag_name("device")).unwrap()
        }
        let kind = |c: &roxmltree::Node| device(c).attributes().find(|a| a.name() == "type").unwrap().value().to_string();
        let text = |c: &roxmltree::Node, tag: &str| device(c).descendants().find(|d| d.has_tag_name(tag)).and_then(|d| d.text()).unwrap_or("").to_string();
        assert_eq!(kind(&changes[0]), "VirtualLsiLogicController");
        assert_eq!(text(&changes[0], "key"), "-10");
        assert_eq!(kind(&changes[1]), "VirtualVmxnet3");
        let disks: Vec<(String, String, String, String)> = changes[2..5].iter().map(|c| (kind(c), text(c, "controllerKey"), text(c, "unitNumber"), text(c, "fileName"))).collect();
        assert_eq!(disks, [
            ("VirtualDisk".into(), "-10".into(), "0".into(), "[LocalDS_0]".into()),
            ("VirtualDisk".into(), "-10".into(), "1".into(), "[LocalDS_1]".into()),
            ("VirtualDisk".into(), "-10".into(), "2".into(), "[LocalDS_0]".into()),
        ]);
        assert_eq!(text(&changes[2], "capacityInKB"), (10u64 << 20).to_string());
        assert!(changes[2..5].iter().all(|c| c.children().any(|f| f.has_tag_name("fileOperation") && f.text() == Some("create"))));
        let folder = doc.descendants().find(|n| n.has_tag_name("folder")).unwrap();
        assert_eq!(folder.text(), Some("group-v3"));
    }

    fn device_url(key: &str, url: &str, disk: bool) -> Node {
        Node { name: "deviceUrl".into(), children: vec![leaf("key", key), leaf("url", url), leaf("disk", if disk { "true" } else { "false" })], ..Default::default() }
    }

    #[test]
    fn upload_urls_come_in_disk_order() {
        // vcsim: keys count the disks; URLs name the files on `*`.
        let vcsim = Node {
            children: vec![
                device_url("/vm-58/VirtualDisk:1", "https://*/nfc/lease-1/ns_web_1.vmdk", true),
                device_url("/vm-58/VirtualDisk:0", "https://*/nfc/lease-1/ns_web.vmdk", true),
            ],
            ..Default::default()
        };
        assert_eq!(disk_urls(&vcsim, "http://127.0.0.1:8989/sdk"), ["http://127.0.0.1:8989/nfc/lease-1/ns_web.vmdk", "http://127.0.0.1:8989/nfc/lease-1/ns_web_1.vmdk"]);
        // vCenter: controller and unit; unit 10 after unit 8, whatever the text order.
        let vcenter = Node {
            children: vec![
                device_url("/vm-9/VirtualLsiLogicController0:10", "https://*/nfc/52a/disk-2.vmdk", true),
                device_url("/vm-9/nvram", "https://*/nfc/52a/nvram", false),
                device_url("/vm-9/VirtualLsiLogicController0:8", "https://*/nfc/52a/disk-1.vmdk", true),
                device_url("/vm-9/VirtualLsiLogicController0:0", "https://*/nfc/52a/disk-0.vmdk", true),
            ],
            ..Default::default()
        };
        let urls = disk_urls(&vcenter, "https://vc.lab");
        assert_eq!(urls, ["https://vc.lab/nfc/52a/disk-0.vmdk", "https://vc.lab/nfc/52a/disk-1.vmdk", "https://vc.lab/nfc/52a/disk-2.vmdk"]);
    }

    #[test]
    fn the_commit_sets_the_uid_and_a_new_annotation() {
        let spec = ConfigSpec { instance_uuid: Some("u-1".into()), annotation: Some("done".into()), ..Default::default() };
        let body = soap::reconfigure(&MoRef::new("VirtualMachine", "vm-1"), &spec);
        assert!(body.ends_with("<spec><instanceUuid>u-1</instanceUuid><annotation>done</annotation></spec></ReconfigVM_Task>"), "{body}");
    }
}
