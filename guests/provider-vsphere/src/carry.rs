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
//! - `disk-import`: the carried disks become the machine's first disks by position, taken
//!   the way vSphere takes a monolithic flat disk: through the datastore, not an import
//!   lease. They come raw (the host converts them to raw for vSphere: the ProviderClass's
//!   `imageFormat: vmdk`); another format is refused. Each is written to the declared
//!   disk's datastore, in the directory vSphere would make for the VM (its name, as `create`
//!   names it): the host PUTs the bytes to `/folder/{vm}/{vm}-disk{i}-flat.vmdk?dcPath=
//!   {datacenter}&dsName={datastore}` (`transfer.carried-to-http`, the session cookie), and
//!   the driver PUTs the VMFS descriptor `{vm}/{vm}-disk{i}.vmdk` beside it, whose one extent
//!   names that file and counts its sectors (the one `disk-export` reads back). Then
//!   `CreateVM_Task` makes the VM in the machine's cluster (its root pool, a connected host
//!   that mounts every disk's datastore) and datacenter VM folder, its files
//!   `[ds] {vm}/{vm}.vmx` in that directory, with its CPUs, memory, firmware, NICs (MACs as
//!   `create` sets them) and guestinfo (metadata and user-data, as `create` sets them —
//!   `create` does not set NICs or guestinfo on a VM it finds), an LSI Logic controller and
//!   each uploaded disk attached as it is (no file operation: vSphere neither creates nor
//!   touches the file), at its carried size. The disks are the VM's files, in its
//!   directory: `Destroy_Task` removes them with it (vcsim removes the VM's directory on its
//!   first datastore, disks of other datastores stay). Only then does the VM get the machine's
//!   UID as its instance UUID: the VM `create` (and every other call) finds by it is always a
//!   finished one. `create` then adopts it like any VM it finds: disks grown to their
//!   declared sizes, further declared disks added, power as asked. Until then the VM's
//!   annotation marks it unfinished: a failure destroys the VM and deletes the uploaded
//!   files, and a later call destroys a VM an interrupted call left and writes the files
//!   anew, so nothing partial stays. A VM that already has the UID is returned untouched.
//!   Known limit: files a call cut off before it made the VM stay on the datastore until a
//!   retry overwrites them (a machine deleted instead leaves them: nothing names it).

use banlieue_sdk::provider::{Firmware, Machine, MachineRef, MachineStatus, ProviderConfig, Result};
use banlieue_sdk::session::SessionError;
use banlieue_sdk::transfer::{self, CarriedDisk};
use banlieue_sdk::{Error, info, warn};

use crate::import::destroy;
use crate::soap::{self, ConfigSpec, DiskChange, MoRef, NetworkBacking, Node, PropSpec};
use crate::vim::{COOKIE, VResult, Vim, is_fault};
use crate::{Cluster, INVENTORY, Inv, controller_units, describe_vm, extra_config, lookup, nic_mac, virtual_disks, vm_name, with_vim};

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
        let vm = lookup(vim, machine)?;
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

/// The descriptor of carried disk `index` of VM `vm`, in the VM's directory: `{vm}/{vm}-disk{index}.vmdk`.
/// vSphere names a VM's own disks `{vm}.vmdk`, `{vm}_1.vmdk`, …: these names never overwrite
/// a disk another VM of that name left in the directory, nor one `create` adds later.
pub fn disk_path(vm: &str, index: usize) -> String {
    format!("{vm}/{vm}-disk{index}.vmdk")
}

/// The path of the VM's configuration file: in the directory vSphere would make for a VM of
/// that name. Named in full because the directory already holds the uploaded disks: given
/// only `[ds]`, vSphere (and vcsim) would make the VM a new directory beside it.
pub fn vmx_path(vm: &str) -> String {
    format!("{vm}/{vm}.vmx")
}

/// One carried disk of the new VM: where its data and descriptor are written and where it is attached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Landing {
    pub carried: String,
    /// The declared disk's datastore.
    pub datastore: String,
    /// The descriptor's path on the datastore ([`disk_path`]).
    pub descriptor: String,
    /// The unit of the VM's controller it is attached at.
    pub unit: i32,
    /// The carried disk's bytes: the flat extent's size and the disk's virtual size.
    pub bytes: u64,
}

impl Landing {
    /// The flat extent's file name, which the descriptor names (the conventional `-flat.vmdk` beside it).
    pub fn extent(&self) -> String {
        let file = self.descriptor.rsplit('/').next().unwrap_or(&self.descriptor);
        format!("{}-flat.vmdk", file.strip_suffix(".vmdk").unwrap_or(file))
    }

    /// The flat extent's path on the datastore.
    pub fn flat(&self) -> String {
        match self.descriptor.rsplit_once('/') {
            Some((dir, _)) => format!("{dir}/{}", self.extent()),
            None => self.extent(),
        }
    }

    /// The size the VM is told, in KiB: the bytes, rounded up (never below them).
    pub fn capacity_kib(&self) -> u64 {
        self.bytes.div_ceil(1024)
    }
}

/// Where each carried disk lands, by position: its data and descriptor on the datastore of
/// the declared disk in its place, in the VM's directory, attached at the next free unit of
/// the VM's controller. The VM gets each disk at its carried size; `create` grows it to the
/// declared size when that is larger. Refused: no disks, fewer declared than carried, a
/// declared disk smaller than what it carries (a disk is never shrunk; 0 GiB takes the
/// carried size), another format than raw, a size that is not whole 512-byte sectors (a
/// flat extent's size is counted in them), more disks than the controller has units.
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
    let vm = vm_name(&machine.namespace, &machine.name);
    let mut out = Vec::new();
    for (index, ((disk, from), unit)) in machine.disks.iter().zip(carried).zip(units).enumerate() {
        if from.format != "raw" {
            return Err(Error::InvalidSpec(format!(
                "carried disk {} is {}; the vSphere driver takes raw disks, which it writes to the datastore as flat extents (set the ProviderClass's imageFormat to vmdk: the host then carries disks to vSphere as raw)",
                from.name, from.format
            )));
        }
        // The bytes sent are the extent: a raw disk that says otherwise would leave the VM a
        // disk of another size than its descriptor's.
        if from.size != from.virtual_size {
            return Err(Error::InvalidSpec(format!(
                "carried raw disk {} sends {} bytes for a virtual size of {}: a raw disk's bytes are the disk",
                from.name, from.size, from.virtual_size
            )));
        }
        if from.size == 0 || from.size % 512 != 0 {
            return Err(Error::InvalidSpec(format!("carried disk {} is {} bytes, not a whole number of 512-byte sectors as a vSphere disk is", from.name, from.size)));
        }
        if disk.size_gib != 0 && disk.size_gib << 30 < from.size {
            let need = from.size.div_ceil(1 << 30);
            return Err(Error::InvalidSpec(format!(
                "carried disk {} holds {need} GiB; disk {} declares {} GiB and a disk is never shrunk: declare at least {need} GiB",
                from.name, disk.name, disk.size_gib
            )));
        }
        if disk.target.is_empty() {
            return Err(Error::InvalidSpec(format!("disk {} of {who} has no datastore (map its storage class to one)", disk.name)));
        }
        out.push(Landing { carried: from.name.clone(), datastore: disk.target.clone(), descriptor: disk_path(&vm, index), unit, bytes: from.size });
    }
    Ok(out)
}

/// The VMFS descriptor of a monolithic flat disk of `bytes` whose data is the file `extent`
/// beside it: one read-write extent of that many sectors, no parent (`parentCID=ffffffff`),
/// the adapter type of the controller it is attached to. vSphere reads it to attach the data
/// as it is; `disk-export` reads it back ([`data_file`]) to find the extent.
pub fn descriptor(extent: &str, bytes: u64) -> String {
    format!(
        "# Disk DescriptorFile\nversion=1\nCID=fffffffe\nparentCID=ffffffff\ncreateType=\"vmfs\"\n\n\
# Extent description\nRW {} VMFS \"{extent}\"\n\n\
# The Disk Data Base\n#DDB\n\nddb.adapterType = \"lsilogic\"\nddb.virtualHWVersion = \"13\"\n",
        bytes / 512
    )
}

/// What the annotation of a VM still being made for the machine says.
pub fn unfinished(machine: &Machine) -> String {
    format!("banlieue disk-import of machine {}/{} ({}): not finished", machine.namespace, machine.name, machine.uid)
}

/// The new VM: named as `create` names it, its files in the directory that holds the
/// uploaded disks (on the boot disk's datastore), with the machine's hardware and guestinfo
/// as `create` gives a clone, a new controller with each uploaded disk attached as it is,
/// marked unfinished and without the machine's UID yet.
pub fn create_spec(machine: &Machine, plan: &[Landing], nics: Vec<NetworkBacking>) -> ConfigSpec {
    let name = vm_name(&machine.namespace, &machine.name);
    let statics = banlieue_sdk::network::any_static(&machine.nics);
    ConfigSpec {
        vm_path: plan.first().map(|l| format!("[{}] {}", l.datastore, vmx_path(&name))),
        name: Some(name),
        guest_id: Some("otherGuest64".into()),
        annotation: Some(unfinished(machine)),
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
            .map(|l| DiskChange::Attach { controller: CONTROLLER_KEY, unit: l.unit, capacity_kib: l.capacity_kib(), file: format!("[{}] {}", l.datastore, l.descriptor) })
            .collect(),
        ..Default::default()
    }
}

/// The error for an HTTP status vCenter refused a datastore file request with. A missing
/// datacenter or datastore (404) is the machine's spec, not a missing machine.
fn refused(status: u16, what: String) -> SessionError {
    match banlieue_sdk::http::status_error(status, what) {
        Error::NotFound(m) => Error::InvalidSpec(m),
        e => e,
    }
    .into()
}

/// Whether the datastore file at `url` exists (a GET of its first byte).
fn exists(vim: &Vim, url: &str, what: &str) -> VResult<bool> {
    let cookie = format!("{COOKIE}={}", vim.cookie);
    let resp = vim.http.send("GET", url, &[("cookie", cookie.as_str()), ("range", "bytes=0-0")], None)?;
    match resp.status {
        // 416: an empty file (vcsim's are), which has no first byte.
        200 | 206 | 416 => Ok(true),
        404 => Ok(false),
        s => Err(refused(s, format!("{what}: GET {url}: HTTP {s}"))),
    }
}

/// Write each carried disk to its datastore: the host streams the data to the flat extent,
/// then the driver writes the descriptor naming it.
fn upload(vim: &Vim, config: &ProviderConfig, datacenter: &str, plan: &[Landing]) -> VResult<()> {
    let cookie = format!("{COOKIE}={}", vim.cookie);
    let headers = [("Content-Type".to_string(), "application/octet-stream".to_string()), ("Cookie".to_string(), cookie.clone())];
    for l in plan {
        let url = datastore_url(&config.endpoint, datacenter, &l.datastore, &l.flat());
        let status = transfer::carried_to_http(&l.carried, "PUT", &url, &headers)?;
        if !(200..300).contains(&status) {
            return Err(refused(status, format!("vCenter refused the upload of disk {} to {url}: HTTP {status}", l.carried)));
        }
        let url = datastore_url(&config.endpoint, datacenter, &l.datastore, &l.descriptor);
        let text = descriptor(&l.extent(), l.bytes);
        let resp = vim.http.send("PUT", &url, &[("cookie", cookie.as_str()), ("content-type", "application/octet-stream")], Some(text.into_bytes()))?;
        if !(200..300).contains(&resp.status) {
            return Err(refused(resp.status, format!("vCenter refused the descriptor of disk {} at {url}: HTTP {}", l.carried, resp.status)));
        }
        info!("uploaded carried disk {} to [{}] {} ({} bytes)", l.carried, l.datastore, l.flat(), l.bytes);
    }
    Ok(())
}

/// The message of an error, for a warning.
fn message(e: &SessionError) -> String {
    match e {
        SessionError::Failed(e) => e.message().to_string(),
        SessionError::Rejected(m) => m.clone(),
    }
}

/// Delete the files of each landing, as far as they were written: the disk through the
/// virtual disk manager (what vSphere deletes a disk with: descriptor and extent), else
/// each file on its own. Best effort: a file left is reported, and overwritten by a retry.
fn delete_files(vim: &Vim, datacenter: &MoRef, plan: &[Landing]) {
    for l in plan {
        let disk = format!("[{}] {}", l.datastore, l.descriptor);
        if let Some(vdm) = &vim.sc.virtual_disk_manager {
            if vim.run_task(&format!("DeleteVirtualDisk_Task {disk}"), &soap::delete_virtual_disk(vdm, &disk, datacenter)).is_ok() {
                continue;
            }
        }
        // No descriptor or no extent (an upload cut off), or no virtual disk manager.
        let Some(fm) = &vim.sc.file_manager else {
            warn!("vCenter offers no file manager: the files of disk {disk} stay on the datastore");
            continue;
        };
        for path in [l.flat(), l.descriptor.clone()] {
            let file = format!("[{}] {path}", l.datastore);
            match vim.run_task(&format!("DeleteDatastoreFile_Task {file}"), &soap::delete_datastore_file(fm, &file, datacenter)) {
                Err(e) if !is_fault(&e, "FileNotFound") => warn!("{file}, uploaded by a disk-import that failed, stays on the datastore: {}", message(&e)),
                _ => {}
            }
        }
    }
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

/// A host of the cluster to make the VM on: connected, not in maintenance, mounting every
/// datastore the disks are on. (A cluster without DRS needs one named; with DRS, naming one
/// is allowed.)
fn pick_host(vim: &Vim, cluster: &Cluster, datastores: &[MoRef]) -> VResult<MoRef> {
    for host in cluster.obj.refs("host") {
        let p = vim.props(&host, &["runtime.connectionState", "runtime.inMaintenanceMode", "datastore"])?;
        let mounted = p.refs("datastore");
        if p.str("runtime.connectionState") == Some("connected") && p.str("runtime.inMaintenanceMode") != Some("true") && datastores.iter().all(|d| mounted.contains(d)) {
            return Ok(host);
        }
    }
    Err(Error::Unavailable(format!("no connected host of cluster {} (out of maintenance) mounts every datastore of the machine's disks", cluster.name)).into())
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
        let datacenter = cluster.datacenter.obj.clone().ok_or_else(|| Error::Internal(format!("cluster {} is in no datacenter", cluster.name)))?;
        // Every datastore and network is checked before anything is written.
        let mut datastores = Vec::new();
        for d in &machine.disks {
            let Some((ds, _)) = inv.datastore_in(cluster, &d.target) else {
                return Err(Error::InvalidSpec(format!("disk {}: datastore {:?} is not available in cluster {}", d.name, d.target, cluster.name)).into());
            };
            if plan.iter().any(|l| l.datastore == d.target) && !datastores.contains(&ds) {
                datastores.push(ds);
            }
        }
        let nics = machine
            .nics
            .iter()
            .map(|n| inv.network_in(cluster, &n.network).ok_or_else(|| Error::InvalidSpec(format!("network {:?} is not available in cluster {}", n.network, cluster.name))))
            .collect::<Result<Vec<_>>>()?;
        let host = pick_host(vim, cluster, &datastores)?;
        let marker = unfinished(machine);
        for (vm, annotation) in named(vim, &name)? {
            if annotation != marker {
                return Err(Error::InvalidSpec(format!("a vSphere VM named {name} exists and is not this machine (its instanceUuid is not {})", machine.uid)).into());
            }
            // Its disks are the ones about to be written again.
            warn!("destroying vSphere VM {name}, left by a disk-import that did not finish");
            destroy(vim, &vm, &name)?;
        }
        let dc = datacenter_path(vim, Some(datacenter.clone()))?;
        // A configuration file in the VM's directory is a VM vCenter does not list: its
        // creation would fail once every disk is uploaded, so it is refused before.
        let vmx = vmx_path(&name);
        if exists(vim, &datastore_url(&config.endpoint, &dc, &plan[0].datastore, &vmx), &format!("checking [{}] {vmx}", plan[0].datastore))? {
            return Err(Error::InvalidSpec(format!(
                "datastore {} holds {vmx}, the files of a VM named {name} that vCenter does not list: register or remove it first",
                plan[0].datastore
            ))
            .into());
        }
        info!("importing {} carried disk(s) into vSphere VM {name} (cluster {}, host {})", plan.len(), cluster.name, host.value);
        let made = upload(vim, config, &dc, &plan).and_then(|()| {
            let spec = create_spec(machine, &plan, nics.clone());
            let made = vim.run_task(&format!("CreateVM_Task {name}"), &soap::create_vm(&folder, &spec, &pool, Some(&host)))?.and_then(|r| r.as_ref());
            let vm = match made {
                Some(vm) => vm,
                None => named(vim, &name)?
                    .into_iter()
                    .find(|(_, a)| *a == marker)
                    .map(|(vm, _)| vm)
                    .ok_or_else(|| Error::Internal(format!("CreateVM_Task {name}: vCenter returned no VM")))?,
            };
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
                // Nothing partial stays: the VM is destroyed, and the files with it; those it
                // does not hold (not made, or vcsim, which deletes only the VM's directory on
                // its first datastore) are deleted here.
                if let Err(d) = destroy_unfinished(vim, machine, &name) {
                    warn!("vSphere VM {name} of a failed disk-import is left for the next call to destroy: {}", message(&d));
                }
                delete_files(vim, &datacenter, &plan);
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
        CarriedDisk { name: name.into(), format: format.into(), size: bytes, virtual_size: bytes }
    }

    fn landing(carried: &str, datastore: &str, index: usize, unit: i32, bytes: u64) -> Landing {
        Landing { carried: carried.into(), datastore: datastore.into(), descriptor: format!("ns_web/ns_web-disk{index}.vmdk"), unit, bytes }
    }

    #[test]
    fn carried_disks_land_in_order_in_the_vms_directory_on_their_datastores() {
        let m = machine(&[10, 2, 5]);
        let got = plan(&m, &[carried("disk0", "raw", 10 << 30), carried("disk1", "raw", (1 << 30) + 512)]).unwrap();
        assert_eq!(got, vec![landing("disk0", "LocalDS_0", 0, 0, 10 << 30), landing("disk1", "LocalDS_1", 1, 1, (1 << 30) + 512)]);
        assert_eq!(got[1].extent(), "ns_web-disk1-flat.vmdk");
        assert_eq!(got[1].flat(), "ns_web/ns_web-disk1-flat.vmdk");
        // The VM is told the carried size, rounded up to the KiB; `create` grows it to the declared one.
        assert_eq!(got[0].capacity_kib(), 10 << 20);
        assert_eq!(got[1].capacity_kib(), (1 << 20) + 1);
        // 0 GiB declared keeps the carried size.
        assert_eq!(plan(&machine(&[0]), &[carried("root", "raw", (3 << 30) + 512)]).unwrap()[0].bytes, (3 << 30) + 512);
        assert_eq!(vmx_path("ns_web"), "ns_web/ns_web.vmx");
    }

    #[test]
    fn fewer_smaller_odd_or_too_many_disks_or_another_format_are_refused() {
        let e = plan(&machine(&[10]), &[carried("a", "raw", 1 << 30), carried("b", "raw", 1 << 30)]).unwrap_err();
        assert!(matches!(&e, Error::InvalidSpec(m) if m.contains("declare at least as many")), "{e:?}");
        let e = plan(&machine(&[9]), &[carried("a", "raw", (9 << 30) + 512)]).unwrap_err();
        assert!(matches!(&e, Error::InvalidSpec(m) if m.contains("never shrunk") && m.contains("at least 10 GiB")), "{e:?}");
        for format in ["vmdk", "qcow2"] {
            let e = plan(&machine(&[10]), &[carried("a", format, 1 << 30)]).unwrap_err();
            assert!(matches!(&e, Error::InvalidSpec(m) if m.contains(&format!("carried disk a is {format}")) && m.contains("raw")), "{e:?}");
        }
        let e = plan(&machine(&[10]), &[carried("a", "raw", (1 << 30) + 100)]).unwrap_err();
        assert!(matches!(&e, Error::InvalidSpec(m) if m.contains("512-byte sectors")), "{e:?}");
        assert!(plan(&machine(&[10]), &[carried("a", "raw", 0)]).is_err());
        let sparse = CarriedDisk { size: 1 << 20, ..carried("a", "raw", 1 << 30) };
        let e = plan(&machine(&[10]), &[sparse]).unwrap_err();
        assert!(matches!(&e, Error::InvalidSpec(m) if m.contains("a raw disk's bytes are the disk")), "{e:?}");
        assert!(plan(&machine(&[10]), &[]).is_err());
        let many: Vec<CarriedDisk> = (0..16).map(|i| carried(&format!("d{i}"), "raw", 1 << 30)).collect();
        let e = plan(&machine(&[1; 16]), &many).unwrap_err();
        assert!(matches!(&e, Error::InvalidSpec(m) if m.contains("at most 15")), "{e:?}");
        // Fifteen fit: unit 7 is the controller's own.
        let fifteen = plan(&machine(&[1; 15]), &many[..15]).unwrap();
        assert_eq!(fifteen.iter().map(|l| l.unit).collect::<Vec<_>>(), [0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14, 15]);
        assert_eq!(fifteen[14].descriptor, "ns_web/ns_web-disk14.vmdk");
    }

    #[test]
    fn the_descriptor_names_the_uploaded_extent_and_export_reads_it_back() {
        let l = landing("disk0", "LocalDS_0", 0, 0, 2 << 30);
        let text = descriptor(&l.extent(), l.bytes);
        assert_eq!(
            text,
            "# Disk DescriptorFile\nversion=1\nCID=fffffffe\nparentCID=ffffffff\ncreateType=\"vmfs\"\n\n# Extent description\nRW 4194304 VMFS \"ns_web-disk0-flat.vmdk\"\n\n# The Disk Data Base\n#DDB\n\nddb.adapterType = \"lsilogic\"\nddb.virtualHWVersion = \"13\"\n"
        );
        // What `disk-export` GETs for the attached disk is the file the host PUT.
        assert_eq!(data_file("disk0", &l.descriptor, text.as_bytes()).unwrap(), l.flat());
    }

    #[test]
    fn uploads_go_to_the_datastore_files_of_the_vms_directory() {
        let l = landing("disk1", "LocalDS_1", 1, 1, 1 << 30);
        assert_eq!(
            datastore_url("http://127.0.0.1:8989/sdk", "DC0", &l.datastore, &l.flat()),
            "http://127.0.0.1:8989/folder/ns_web/ns_web-disk1-flat.vmdk?dcPath=DC0&dsName=LocalDS_1"
        );
        assert_eq!(
            datastore_url("https://vc.lab/sdk", "Lab/DC 1", &l.datastore, &l.descriptor),
            "https://vc.lab/folder/ns_web/ns_web-disk1.vmdk?dcPath=Lab%2FDC%201&dsName=LocalDS_1"
        );
    }

    #[test]
    fn the_vm_is_made_unfinished_with_every_uploaded_disk_attached_as_it_is() {
        let m = machine(&[10, 2, 6]);
        let landed = plan(&m, &[carried("disk0", "raw", 10 << 30), carried("disk1", "raw", 1 << 30), carried("disk2", "raw", (5 << 30) + 512)]).unwrap();
        let nics = vec![NetworkBacking::Standard { name: "VM Network".into(), network: MoRef::new("Network", "network-7") }];
        let spec = create_spec(&m, &landed, nics);
        assert_eq!(spec.instance_uuid, None, "the UID comes once the VM is made");
        let body = soap::create_vm(&MoRef::new("Folder", "group-v3"), &spec, &MoRef::new("ResourcePool", "resgroup-8"), Some(&MoRef::new("HostSystem", "host-34")));
        let env = soap::envelope(&body);
        let doc = roxmltree::Document::parse(&env).unwrap();
        let call = doc.descendants().find(|n| n.has_tag_name("CreateVM_Task")).unwrap();
        let args: Vec<&str> = call.children().filter(|c| c.is_element()).map(|c| c.tag_name().name()).collect();
        assert_eq!(args, ["_this", "config", "pool", "host"]);
        assert!(body.contains("<_this type=\"Folder\">group-v3</_this>") && body.contains("<host type=\"HostSystem\">host-34</host>"), "{body}");
        let config = call.children().find(|n| n.has_tag_name("config")).unwrap();
        let order: Vec<&str> = config.children().filter(|c| c.is_element()).map(|c| c.tag_name().name()).collect();
        assert_eq!(order, [
            "name", "guestId", "annotation", "files", "numCPUs", "memoryMB", "deviceChange", "deviceChange", "deviceChange", "deviceChange", "deviceChange",
            "extraConfig", "extraConfig", "extraConfig", "extraConfig", "extraConfig", "extraConfig", "extraConfig", "firmware"
        ]);
        assert!(body.contains("<name>ns_web</name>") && body.contains("<vmPathName>[LocalDS_0] ns_web/ns_web.vmx</vmPathName>") && body.contains("<firmware>efi</firmware>"), "{body}");
        assert!(body.contains(&format!("<annotation>{}</annotation>", unfinished(&m))));
        assert!(body.contains("<key>guestinfo.userdata</key>") && body.contains("<key>guestinfo.metadata</key>"));
        assert!(body.contains(&format!("<key>banlieue.owner.machine-uid</key><value xsi:type=\"xsd:string\">{}</value>", m.uid)), "marked as made: {body}");
        // The controller comes first, then the NIC; every disk is an uploaded file, attached on the controller.
        let changes: Vec<roxmltree::Node> = config.children().filter(|c| c.has_tag_name("deviceChange")).collect();
        fn device<'a, 'i>(c: &roxmltree::Node<'a, 'i>) -> roxmltree::Node<'a, 'i> {
            c.children().find(|d| d.has_tag_name("device")).unwrap()
        }
        let kind = |c: &roxmltree::Node| device(c).attributes().find(|a| a.name() == "type").unwrap().value().to_string();
        let text = |c: &roxmltree::Node, tag: &str| device(c).descendants().find(|d| d.has_tag_name(tag)).and_then(|d| d.text()).unwrap_or("").to_string();
        assert_eq!(kind(&changes[0]), "VirtualLsiLogicController");
        assert_eq!(text(&changes[0], "key"), "-10");
        assert_eq!(kind(&changes[1]), "VirtualVmxnet3");
        let disks: Vec<[String; 6]> = changes[2..5]
            .iter()
            .map(|c| [kind(c), text(c, "controllerKey"), text(c, "unitNumber"), text(c, "fileName"), text(c, "thinProvisioned"), text(c, "capacityInKB")])
            .collect();
        let row = |unit: &str, file: &str, kib: u64| ["VirtualDisk".to_string(), "-10".into(), unit.into(), file.into(), "false".into(), kib.to_string()];
        assert_eq!(disks, [
            row("0", "[LocalDS_0] ns_web/ns_web-disk0.vmdk", 10 << 20),
            row("1", "[LocalDS_1] ns_web/ns_web-disk1.vmdk", 1 << 20),
            row("2", "[LocalDS_0] ns_web/ns_web-disk2.vmdk", (5 << 20) + 1),
        ]);
        assert!(changes[2..5].iter().all(|c| c.children().any(|f| f.has_tag_name("operation") && f.text() == Some("add"))));
        assert!(!body.contains("fileOperation"), "the uploaded files are attached, not made: {body}");
    }

    #[test]
    fn the_commit_sets_the_uid_and_a_new_annotation() {
        let spec = ConfigSpec { instance_uuid: Some("u-1".into()), annotation: Some("done".into()), ..Default::default() };
        let body = soap::reconfigure(&MoRef::new("VirtualMachine", "vm-1"), &spec);
        assert!(body.ends_with("<spec><instanceUuid>u-1</instanceUuid><annotation>done</annotation></spec></ReconfigVM_Task>"), "{body}");
    }

    #[test]
    fn failed_uploads_are_deleted_by_their_datastore_paths() {
        let body = soap::delete_virtual_disk(&MoRef::new("VirtualDiskManager", "virtualDiskManager"), "[LocalDS_0] ns_web/ns_web-disk0.vmdk", &MoRef::new("Datacenter", "datacenter-2"));
        assert!(body.ends_with("<name>[LocalDS_0] ns_web/ns_web-disk0.vmdk</name><datacenter type=\"Datacenter\">datacenter-2</datacenter></DeleteVirtualDisk_Task>"), "{body}");
        let body = soap::delete_datastore_file(&MoRef::new("FileManager", "FileManager"), "[LocalDS_0] ns_web/ns_web-disk0-flat.vmdk", &MoRef::new("Datacenter", "datacenter-2"));
        assert!(body.starts_with("<DeleteDatastoreFile_Task xmlns=\"urn:vim25\"><_this type=\"FileManager\">FileManager</_this><name>"), "{body}");
    }
}
