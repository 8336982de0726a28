//! vim25 SOAP, pure: request bodies built from string templates (element order
//! follows the vim25 schema, which vCenter enforces) and a small generic tree
//! for responses, faults and `RetrievePropertiesEx` results.

use std::collections::BTreeMap;

const XSI: &str = "http://www.w3.org/2001/XMLSchema-instance";

/// XML text/attribute escaping.
pub use banlieue_sdk::xml::escape as esc;

/// A managed object reference (`<x type="VirtualMachine">vm-42</x>`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MoRef {
    pub kind: String,
    pub value: String,
}

impl MoRef {
    pub fn new(kind: &str, value: &str) -> MoRef {
        MoRef { kind: kind.into(), value: value.into() }
    }

    /// `<tag type="kind">value</tag>`.
    pub fn xml(&self, tag: &str) -> String {
        format!("<{tag} type=\"{}\">{}</{tag}>", esc(&self.kind), esc(&self.value))
    }
}

impl std::fmt::Display for MoRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.kind, self.value)
    }
}

/// Wrap a method element in a SOAP envelope.
pub fn envelope(body: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\
<soapenv:Envelope xmlns:soapenv=\"http://schemas.xmlsoap.org/soap/envelope/\" \
xmlns:xsd=\"http://www.w3.org/2001/XMLSchema\" xmlns:xsi=\"{XSI}\">\
<soapenv:Body>{body}</soapenv:Body></soapenv:Envelope>"
    )
}

/// `<Method xmlns="urn:vim25"><_this …/>inner</Method>`.
pub fn method(name: &str, this: &MoRef, inner: &str) -> String {
    format!("<{name} xmlns=\"urn:vim25\">{}{inner}</{name}>", this.xml("_this"))
}

/// An element with escaped text.
pub fn el(tag: &str, text: &str) -> String {
    format!("<{tag}>{}</{tag}>", esc(text))
}

// ---------------------------------------------------------------- responses

/// A parsed XML element: local name, `xsi:type`, a managed-object `type`, text, children.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Node {
    pub name: String,
    pub xsi_type: Option<String>,
    pub mo_type: Option<String>,
    pub text: String,
    pub children: Vec<Node>,
}

impl Node {
    fn from_xml(n: roxmltree::Node) -> Node {
        let mut xsi_type = None;
        let mut mo_type = None;
        for a in n.attributes() {
            if a.name() == "type" {
                if a.namespace() == Some(XSI) {
                    let v = a.value();
                    xsi_type = Some(v.rsplit(':').next().unwrap_or(v).to_string());
                } else if a.namespace().is_none() {
                    mo_type = Some(a.value().to_string());
                }
            }
        }
        let mut text = String::new();
        let mut children = Vec::new();
        for c in n.children() {
            if c.is_element() {
                children.push(Node::from_xml(c));
            } else if c.is_text() {
                text.push_str(c.text().unwrap_or(""));
            }
        }
        Node { name: n.tag_name().name().to_string(), xsi_type, mo_type, text: text.trim().to_string(), children }
    }

    pub fn child(&self, name: &str) -> Option<&Node> {
        self.children.iter().find(|c| c.name == name)
    }

    pub fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Node> + 'a {
        self.children.iter().filter(move |c| c.name == name)
    }

    /// The node at a dotted path of child names (`summary.hardware.numCpuCores`).
    pub fn path(&self, path: &str) -> Option<&Node> {
        let mut n = self;
        for part in path.split('.') {
            n = n.child(part)?;
        }
        Some(n)
    }

    /// Text of the child at `path`.
    pub fn str_at(&self, path: &str) -> Option<&str> {
        self.path(path).map(|n| n.text.as_str())
    }

    /// This node as a managed object reference.
    pub fn as_ref(&self) -> Option<MoRef> {
        self.mo_type.as_ref().map(|t| MoRef { kind: t.clone(), value: self.text.clone() })
    }

    /// Children that are managed object references (an `ArrayOfManagedObjectReference`).
    pub fn refs(&self) -> Vec<MoRef> {
        self.children.iter().filter_map(Node::as_ref).collect()
    }
}

/// A SOAP fault: the vim25 fault type (`InvalidLogin`, `NotAuthenticated`, …) and the message.
#[derive(Clone, Debug, PartialEq)]
pub struct Fault {
    pub kind: String,
    pub message: String,
}

/// A method's answer: its `…Response` element, or a fault.
#[derive(Debug)]
pub enum Reply {
    Ok(Node),
    Fault(Fault),
}

/// The fault type named by a fault detail element (`xsi:type`, else its name without `Fault`).
fn fault_kind(n: &Node) -> String {
    n.xsi_type.clone().unwrap_or_else(|| n.name.strip_suffix("Fault").unwrap_or(&n.name).to_string())
}

/// Parse a SOAP response body.
pub fn parse_reply(xml: &str) -> Result<Reply, String> {
    let doc = roxmltree::Document::parse(xml).map_err(|e| format!("malformed SOAP response: {e}"))?;
    let root = Node::from_xml(doc.root_element());
    if root.name != "Envelope" {
        return Err(format!("malformed SOAP response: root element is <{}>, not <Envelope>", root.name));
    }
    let body = root.child("Body").ok_or("malformed SOAP response: no <Body>")?;
    let first = body.children.first().ok_or("malformed SOAP response: empty <Body>")?;
    if first.name == "Fault" {
        let message = first.str_at("faultstring").unwrap_or("").to_string();
        let kind = first
            .child("detail")
            .and_then(|d| d.children.first())
            .map(fault_kind)
            .unwrap_or_else(|| first.str_at("faultcode").unwrap_or("SoapFault").to_string());
        return Ok(Reply::Fault(Fault { kind, message }));
    }
    Ok(Reply::Ok(first.clone()))
}

/// A `LocalizedMethodFault` (a task's `info.error`).
pub fn localized_fault(n: &Node) -> Fault {
    let kind = n.child("fault").map(fault_kind).unwrap_or_else(|| "Fault".into());
    let message = n.str_at("localizedMessage").filter(|m| !m.is_empty()).unwrap_or("").to_string();
    Fault { kind, message }
}

/// One object of a `RetrievePropertiesEx` answer.
#[derive(Clone, Debug, Default)]
pub struct ObjectContent {
    pub obj: Option<MoRef>,
    pub props: BTreeMap<String, Node>,
    /// Properties that could not be read: (path, fault type).
    pub missing: Vec<(String, String)>,
}

impl ObjectContent {
    pub fn str(&self, prop: &str) -> Option<&str> {
        self.props.get(prop).map(|n| n.text.as_str())
    }

    pub fn u64(&self, prop: &str) -> u64 {
        self.str(prop).and_then(|s| s.parse::<i64>().ok()).map(|v| v.max(0) as u64).unwrap_or(0)
    }

    pub fn reference(&self, prop: &str) -> Option<MoRef> {
        self.props.get(prop).and_then(Node::as_ref)
    }

    pub fn refs(&self, prop: &str) -> Vec<MoRef> {
        self.props.get(prop).map(Node::refs).unwrap_or_default()
    }
}

/// The objects and paging token of a `RetrieveResult` (`returnval`; absent means none).
pub fn retrieve_result(response: &Node) -> (Vec<ObjectContent>, Option<String>) {
    let Some(rv) = response.child("returnval") else { return (Vec::new(), None) };
    let objects = rv
        .all("objects")
        .map(|o| {
            let mut oc = ObjectContent { obj: o.child("obj").and_then(Node::as_ref), ..Default::default() };
            for p in o.all("propSet") {
                if let (Some(name), Some(val)) = (p.str_at("name"), p.child("val")) {
                    oc.props.insert(name.to_string(), val.clone());
                }
            }
            for m in o.all("missingSet") {
                let kind = m.path("fault.fault").map(fault_kind).unwrap_or_default();
                oc.missing.push((m.str_at("path").unwrap_or("").to_string(), kind));
            }
            oc
        })
        .collect();
    let token = rv.str_at("token").filter(|t| !t.is_empty()).map(str::to_string);
    (objects, token)
}

// ---------------------------------------------------------------- requests

/// `RetrieveServiceContent`.
pub fn retrieve_service_content() -> String {
    method("RetrieveServiceContent", &MoRef::new("ServiceInstance", "ServiceInstance"), "")
}

/// `SessionManager.Login`.
pub fn login(session_manager: &MoRef, user: &str, password: &str) -> String {
    method("Login", session_manager, &format!("{}{}", el("userName", user), el("password", password)))
}

/// `SearchIndex.FindByUuid` for a VM, by instance UUID or BIOS UUID.
pub fn find_by_uuid(search_index: &MoRef, uuid: &str, instance: bool) -> String {
    method(
        "FindByUuid",
        search_index,
        &format!("{}<vmSearch>true</vmSearch><instanceUuid>{instance}</instanceUuid>", el("uuid", uuid)),
    )
}

/// `SearchIndex.FindByInventoryPath`.
pub fn find_by_inventory_path(search_index: &MoRef, path: &str) -> String {
    method("FindByInventoryPath", search_index, &el("inventoryPath", path))
}

/// Properties to read from each object of a type.
#[derive(Clone, Copy)]
pub struct PropSpec<'a> {
    pub kind: &'a str,
    pub paths: &'a [&'a str],
}

fn prop_sets(specs: &[PropSpec]) -> String {
    specs
        .iter()
        .map(|s| {
            let paths: String = s.paths.iter().map(|p| el("pathSet", p)).collect();
            format!("<propSet><type>{}</type><all>false</all>{paths}</propSet>", esc(s.kind))
        })
        .collect()
}

fn traversal(name: &str, kind: &str, path: &str, next: &[&str]) -> String {
    let sel: String = next.iter().map(|n| format!("<selectSet><name>{n}</name></selectSet>")).collect();
    format!(
        "<selectSet xsi:type=\"TraversalSpec\"><name>{name}</name><type>{kind}</type><path>{path}</path>\
<skip>false</skip>{sel}</selectSet>"
    )
}

/// The traversal from the root folder through datacenters to clusters, hosts,
/// datastores, networks and VMs (resource pools and vApps are not entered: VMs
/// are reached through the VM folders).
fn inventory_traversal() -> String {
    const ALL: &[&str] = &["folder", "dcHost", "dcVm", "dcDs", "dcNet", "crHost"];
    [
        traversal("folder", "Folder", "childEntity", ALL),
        traversal("dcHost", "Datacenter", "hostFolder", &["folder"]),
        traversal("dcVm", "Datacenter", "vmFolder", &["folder"]),
        traversal("dcDs", "Datacenter", "datastoreFolder", &["folder"]),
        traversal("dcNet", "Datacenter", "networkFolder", &["folder"]),
        traversal("crHost", "ComputeResource", "host", &[]),
    ]
    .concat()
}

/// `RetrievePropertiesEx` over the whole inventory under `root`.
pub fn retrieve_inventory(pc: &MoRef, root: &MoRef, specs: &[PropSpec]) -> String {
    retrieve_inventory_paged(pc, root, specs, 1000)
}

/// [`retrieve_inventory`] answered `max_objects` objects at a time (the rest through
/// `ContinueRetrievePropertiesEx`): what keeps each answer of a large read under the host's
/// response size cap.
pub fn retrieve_inventory_paged(pc: &MoRef, root: &MoRef, specs: &[PropSpec], max_objects: u32) -> String {
    let body = format!(
        "<specSet>{}<objectSet>{}<skip>false</skip>{}</objectSet></specSet><options><maxObjects>{max_objects}</maxObjects></options>",
        prop_sets(specs),
        root.xml("obj"),
        inventory_traversal()
    );
    method("RetrievePropertiesEx", pc, &body)
}

/// `RetrievePropertiesEx` of some properties of given objects (all of one type).
pub fn retrieve_objects(pc: &MoRef, objs: &[MoRef], paths: &[&str]) -> String {
    let kind = objs.first().map(|o| o.kind.as_str()).unwrap_or("ManagedEntity");
    let objects: String = objs.iter().map(|o| format!("<objectSet>{}<skip>false</skip></objectSet>", o.xml("obj"))).collect();
    let body =
        format!("<specSet>{}{objects}</specSet><options></options>", prop_sets(&[PropSpec { kind, paths }]));
    method("RetrievePropertiesEx", pc, &body)
}

/// `ContinueRetrievePropertiesEx`.
pub fn continue_retrieve(pc: &MoRef, token: &str) -> String {
    method("ContinueRetrievePropertiesEx", pc, &el("token", token))
}

/// A task method taking only `_this` (`PowerOnVM_Task`, `Destroy_Task`, …) or a plain one (`ShutdownGuest`).
pub fn simple(name: &str, this: &MoRef) -> String {
    method(name, this, "")
}

/// A NIC backing: a standard port group or a distributed one.
#[derive(Clone, Debug, PartialEq)]
pub enum NetworkBacking {
    Standard { name: String, network: MoRef },
    Distributed { switch_uuid: String, portgroup_key: String },
}

/// The hardware and guestinfo of a clone (or of a new VM: name, guest OS, files, controller).
#[derive(Clone, Debug, Default)]
pub struct ConfigSpec {
    /// `config.changeVersion` as read: vCenter applies the change only if the VM's
    /// configuration has not changed since (else a `ConcurrentAccess` fault).
    pub change_version: Option<String>,
    /// A new VM's name.
    pub name: Option<String>,
    pub instance_uuid: Option<String>,
    /// A new VM's guest OS identifier (`otherGuest64`).
    pub guest_id: Option<String>,
    pub annotation: Option<String>,
    /// `files.vmPathName` of a new VM: `[datastore]` puts its files in a folder of its name there.
    pub vm_path: Option<String>,
    pub cpus: Option<u32>,
    pub memory_mib: Option<u64>,
    /// A new LSI Logic SCSI controller on bus 0 with this (negative, temporary) key, added
    /// before the disks that name it as their controller.
    pub scsi_controller: Option<i32>,
    /// Ethernet cards of the template to remove: (xsi type, key).
    pub remove_nics: Vec<(String, i32)>,
    pub add_nics: Vec<NetworkBacking>,
    /// The MAC of each added card, in order (none: vCenter generates one). A guest's
    /// static network configuration matches its NICs by MAC.
    pub nic_macs: Vec<Option<String>>,
    pub extra_config: Vec<(String, String)>,
    /// `bios` or `efi`.
    pub firmware: Option<String>,
    /// Disks to grow or add.
    pub disks: Vec<DiskChange>,
}

/// A virtual disk as vSphere reports it (`config.hardware.device`).
#[derive(Clone, Debug, PartialEq)]
pub struct VirtualDisk {
    pub key: i32,
    pub controller: i32,
    pub unit: i32,
    pub capacity_kib: u64,
    /// `[datastore] folder/file.vmdk`.
    pub file: String,
    pub datastore: Option<MoRef>,
    pub disk_mode: String,
    pub thin: bool,
    /// `deviceInfo.label` (an edit must carry the device's description).
    pub label: String,
}

/// One change to a VM's disks.
#[derive(Clone, Debug, PartialEq)]
pub enum DiskChange {
    /// An existing disk to `capacity_kib` (the device as read, with the new capacity).
    Grow { disk: VirtualDisk, capacity_kib: u64 },
    /// A new thin disk of `capacity_kib` on datastore `datastore` (a name), at `unit` of controller `controller`.
    Add { controller: i32, unit: i32, capacity_kib: u64, datastore: String },
    /// The existing disk whose descriptor is `file` (`[ds] dir/name.vmdk`), attached as it is
    /// at `unit` of controller `controller`: no file operation, so vSphere neither creates
    /// nor changes the file (it must exist) and takes its size from the descriptor;
    /// `capacity_kib` says the same size.
    Attach { controller: i32, unit: i32, capacity_kib: u64, file: String },
}

impl DiskChange {
    /// The `VirtualDeviceConfigSpec`, in schema order; `i` keeps new devices' keys apart.
    fn xml(&self, i: usize) -> String {
        let device = |key: i64, info: String, backing: String, controller: i32, unit: i32, kib: u64| {
            format!(
                "<device xsi:type=\"VirtualDisk\"><key>{key}</key>{info}{backing}<controllerKey>{controller}</controllerKey><unitNumber>{unit}</unitNumber>\
<capacityInKB>{kib}</capacityInKB><capacityInBytes>{}</capacityInBytes></device>",
                kib * 1024
            )
        };
        let backing = |file: &str, datastore: Option<&MoRef>, mode: &str, thin: bool| {
            format!(
                "<backing xsi:type=\"VirtualDiskFlatVer2BackingInfo\">{}{}{}<thinProvisioned>{thin}</thinProvisioned></backing>",
                el("fileName", file),
                datastore.map(|d| d.xml("datastore")).unwrap_or_default(),
                el("diskMode", mode)
            )
        };
        match self {
            DiskChange::Grow { disk, capacity_kib } => format!(
                "<deviceChange><operation>edit</operation>{}</deviceChange>",
                device(
                    i64::from(disk.key),
                    format!("<deviceInfo>{}{}</deviceInfo>", el("label", &disk.label), el("summary", &format!("{capacity_kib} KB"))),
                    backing(&disk.file, disk.datastore.as_ref(), &disk.disk_mode, disk.thin),
                    disk.controller,
                    disk.unit,
                    *capacity_kib
                )
            ),
            DiskChange::Add { controller, unit, capacity_kib, datastore } => format!(
                "<deviceChange><operation>add</operation><fileOperation>create</fileOperation>{}</deviceChange>",
                device(-200 - i as i64, String::new(), backing(&format!("[{datastore}]"), None, "persistent", true), *controller, *unit, *capacity_kib)
            ),
            // Not thin: the extent was written whole (every byte of the disk uploaded).
            DiskChange::Attach { controller, unit, capacity_kib, file } => format!(
                "<deviceChange><operation>add</operation>{}</deviceChange>",
                device(-200 - i as i64, String::new(), backing(file, None, "persistent", false), *controller, *unit, *capacity_kib)
            ),
        }
    }
}

impl ConfigSpec {
    /// The `VirtualMachineConfigSpec` contents, in schema order.
    pub fn xml(&self) -> String {
        let mut s = String::new();
        if let Some(v) = &self.change_version {
            s += &el("changeVersion", v);
        }
        if let Some(n) = &self.name {
            s += &el("name", n);
        }
        if let Some(u) = &self.instance_uuid {
            s += &el("instanceUuid", u);
        }
        if let Some(g) = &self.guest_id {
            s += &el("guestId", g);
        }
        if let Some(a) = &self.annotation {
            s += &el("annotation", a);
        }
        if let Some(p) = &self.vm_path {
            s += &format!("<files>{}</files>", el("vmPathName", p));
        }
        if let Some(c) = self.cpus {
            s += &format!("<numCPUs>{c}</numCPUs>");
        }
        if let Some(m) = self.memory_mib {
            s += &format!("<memoryMB>{m}</memoryMB>");
        }
        if let Some(key) = self.scsi_controller {
            s += &format!(
                "<deviceChange><operation>add</operation><device xsi:type=\"VirtualLsiLogicController\"><key>{key}</key>\
<busNumber>0</busNumber><sharedBus>noSharing</sharedBus></device></deviceChange>"
            );
        }
        for (kind, key) in &self.remove_nics {
            s += &format!(
                "<deviceChange><operation>remove</operation><device xsi:type=\"{}\"><key>{key}</key></device></deviceChange>",
                esc(kind)
            );
        }
        for (i, backing) in self.add_nics.iter().enumerate() {
            let backing = match backing {
                NetworkBacking::Standard { name, network } => format!(
                    "<backing xsi:type=\"VirtualEthernetCardNetworkBackingInfo\">{}{}</backing>",
                    el("deviceName", name),
                    network.xml("network")
                ),
                NetworkBacking::Distributed { switch_uuid, portgroup_key } => format!(
                    "<backing xsi:type=\"VirtualEthernetCardDistributedVirtualPortBackingInfo\"><port>{}{}</port></backing>",
                    el("switchUuid", switch_uuid),
                    el("portgroupKey", portgroup_key)
                ),
            };
            s += &format!(
                "<deviceChange><operation>add</operation><device xsi:type=\"VirtualVmxnet3\"><key>{}</key>{backing}\
<connectable><startConnected>true</startConnected><allowGuestControl>true</allowGuestControl><connected>true</connected></connectable>\
{}</device></deviceChange>",
                -100 - i as i64,
                match self.nic_macs.get(i).cloned().flatten() {
                    Some(mac) => format!("<addressType>manual</addressType>{}", el("macAddress", &mac)),
                    None => "<addressType>generated</addressType>".to_string(),
                }
            );
        }
        for (i, change) in self.disks.iter().enumerate() {
            s += &change.xml(i);
        }
        for (k, v) in &self.extra_config {
            s += &format!(
                "<extraConfig xsi:type=\"OptionValue\">{}<value xsi:type=\"xsd:string\">{}</value></extraConfig>",
                el("key", k),
                esc(v)
            );
        }
        if let Some(f) = &self.firmware {
            s += &el("firmware", f);
        }
        s
    }
}

/// `CloneVM_Task` of `template` into `folder` as `name`, in `pool` on `datastore`, powered off.
pub fn clone_vm(template: &MoRef, folder: &MoRef, name: &str, pool: &MoRef, datastore: Option<&MoRef>, config: &ConfigSpec, snapshot: Option<&SnapshotSource>) -> String {
    let ds = datastore.map(|d| d.xml("datastore")).unwrap_or_default();
    // A linked clone's disks are new child (delta) disks of the snapshot's: vCenter accepts that
    // move type only together with `spec.snapshot`.
    let move_type = match snapshot {
        Some(s) if s.linked => "<diskMoveType>createNewChildDiskBacking</diskMoveType>",
        _ => "",
    };
    let from = snapshot.map(|s| s.snapshot.xml("snapshot")).unwrap_or_default();
    let inner = format!(
        "{}{}<spec><location>{ds}{move_type}{}</location><template>false</template><config>{}</config><powerOn>false</powerOn>{from}</spec>",
        folder.xml("folder"),
        el("name", name),
        pool.xml("pool"),
        config.xml()
    );
    method("CloneVM_Task", template, &inner)
}

/// Where a clone of a VM (not of a template) starts: one of its snapshots, copied (full
/// clone) or shared (linked clone).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotSource {
    /// The `VirtualMachineSnapshot`.
    pub snapshot: MoRef,
    /// Share the snapshot's disks (`diskMoveType` `createNewChildDiskBacking`) instead of copying them.
    pub linked: bool,
}

/// `ReconfigVM_Task`.
pub fn reconfigure(vm: &MoRef, config: &ConfigSpec) -> String {
    method("ReconfigVM_Task", vm, &format!("<spec>{}</spec>", config.xml()))
}

/// `CreateVM_Task` of the new VM `config` describes (name, files, devices) in `folder`, in
/// `pool`, on `host` (vCenter picks one in a DRS cluster when there is none).
pub fn create_vm(folder: &MoRef, config: &ConfigSpec, pool: &MoRef, host: Option<&MoRef>) -> String {
    method("CreateVM_Task", folder, &format!("<config>{}</config>{}{}", config.xml(), pool.xml("pool"), host.map(|h| h.xml("host")).unwrap_or_default()))
}

/// `DeleteVirtualDisk_Task` of the disk whose descriptor is `file` (`[ds] dir/name.vmdk`) in
/// `datacenter`: the descriptor and its extents.
pub fn delete_virtual_disk(virtual_disk_manager: &MoRef, file: &str, datacenter: &MoRef) -> String {
    method("DeleteVirtualDisk_Task", virtual_disk_manager, &format!("{}{}", el("name", file), datacenter.xml("datacenter")))
}

/// `DeleteDatastoreFile_Task` of `file` (`[ds] dir/name`) in `datacenter`.
pub fn delete_datastore_file(file_manager: &MoRef, file: &str, datacenter: &MoRef) -> String {
    method("DeleteDatastoreFile_Task", file_manager, &format!("{}{}", el("name", file), datacenter.xml("datacenter")))
}

/// `ImportVApp` of a VM `name` with one thin disk of `capacity_kib` on `datastore` (a name)
/// behind an LSI Logic controller, into `pool` and `folder` — what `govc import.vmdk` asks
/// for; the disk's content then comes through the returned `HttpNfcLease`.
pub fn import_vapp(pool: &MoRef, folder: &MoRef, name: &str, annotation: &str, datastore: &str, capacity_kib: u64) -> String {
    let ds = format!("[{datastore}]");
    let inner = format!(
        "<spec xsi:type=\"VirtualMachineImportSpec\"><configSpec>{}<guestId>otherGuest64</guestId>{}<files>{}</files>\
<numCPUs>1</numCPUs><memoryMB>512</memoryMB>\
<deviceChange><operation>add</operation><device xsi:type=\"VirtualLsiLogicController\"><key>1000</key>\
<busNumber>0</busNumber><sharedBus>noSharing</sharedBus></device></deviceChange>\
<deviceChange><operation>add</operation><fileOperation>create</fileOperation><device xsi:type=\"VirtualDisk\"><key>-1</key>\
<backing xsi:type=\"VirtualDiskFlatVer2BackingInfo\">{}<diskMode>persistent</diskMode><thinProvisioned>true</thinProvisioned></backing>\
<controllerKey>1000</controllerKey><unitNumber>0</unitNumber><capacityInKB>{capacity_kib}</capacityInKB></device></deviceChange>\
</configSpec></spec>{}",
        el("name", name),
        el("annotation", annotation),
        el("vmPathName", &ds),
        el("fileName", &ds),
        folder.xml("folder"),
    );
    method("ImportVApp", pool, &inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENV: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/" xmlns:xsd="http://www.w3.org/2001/XMLSchema" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"><soapenv:Body>"#;

    #[test]
    fn escapes_and_envelopes() {
        assert_eq!(esc("a<b>&\"'"), "a&lt;b&gt;&amp;&quot;&apos;");
        let body = login(&MoRef::new("SessionManager", "SessionManager"), "u<", "p&");
        assert_eq!(
            body,
            "<Login xmlns=\"urn:vim25\"><_this type=\"SessionManager\">SessionManager</_this><userName>u&lt;</userName><password>p&amp;</password></Login>"
        );
        let env = envelope(&body);
        let doc = roxmltree::Document::parse(&env).unwrap();
        assert_eq!(doc.root_element().tag_name().name(), "Envelope");
    }

    #[test]
    fn parses_faults() {
        let xml = format!("{ENV}<soapenv:Fault><faultcode>ServerFaultCode</faultcode><faultstring>Login failure</faultstring><detail><InvalidLoginFault xmlns=\"urn:vim25\" xsi:type=\"InvalidLogin\"></InvalidLoginFault></detail></soapenv:Fault></soapenv:Body></soapenv:Envelope>");
        let Reply::Fault(f) = parse_reply(&xml).unwrap() else { panic!() };
        assert_eq!(f, Fault { kind: "InvalidLogin".into(), message: "Login failure".into() });
        // Without xsi:type, the element name says it.
        let xml = format!("{ENV}<soapenv:Fault><faultcode>ServerFaultCode</faultcode><faultstring></faultstring><detail><NotAuthenticatedFault xmlns=\"urn:vim25\"><object type=\"SearchIndex\">SearchIndex</object></NotAuthenticatedFault></detail></soapenv:Fault></soapenv:Body></soapenv:Envelope>");
        let Reply::Fault(f) = parse_reply(&xml).unwrap() else { panic!() };
        assert_eq!(f.kind, "NotAuthenticated");
        assert!(parse_reply("<html>502 Bad Gateway</html>").is_err());
        assert!(parse_reply("not xml").unwrap_err().contains("malformed"));
    }

    #[test]
    fn parses_retrieve_results() {
        let xml = format!(
            "{ENV}<RetrievePropertiesExResponse xmlns=\"urn:vim25\"><returnval><token>t1</token>\
<objects><obj type=\"ClusterComputeResource\">domain-c7</obj>\
<propSet><name>name</name><val xsi:type=\"xsd:string\">DC0_C0</val></propSet>\
<propSet><name>host</name><val xsi:type=\"ArrayOfManagedObjectReference\"><ManagedObjectReference type=\"HostSystem\">host-1</ManagedObjectReference><ManagedObjectReference type=\"HostSystem\">host-2</ManagedObjectReference></val></propSet>\
<propSet><name>parent</name><val type=\"Folder\" xsi:type=\"ManagedObjectReference\">group-h4</val></propSet>\
<propSet><name>summary.totalMemory</name><val xsi:type=\"xsd:long\">1024</val></propSet>\
</objects>\
<objects><obj type=\"VirtualMachine\">vm-1</obj><missingSet><path>name</path><fault><fault xsi:type=\"NotAuthenticated\"></fault></fault></missingSet></objects>\
</returnval></RetrievePropertiesExResponse></soapenv:Body></soapenv:Envelope>"
        );
        let Reply::Ok(resp) = parse_reply(&xml).unwrap() else { panic!() };
        let (objs, token) = retrieve_result(&resp);
        assert_eq!(token.as_deref(), Some("t1"));
        assert_eq!(objs[0].obj, Some(MoRef::new("ClusterComputeResource", "domain-c7")));
        assert_eq!(objs[0].str("name"), Some("DC0_C0"));
        assert_eq!(objs[0].refs("host"), vec![MoRef::new("HostSystem", "host-1"), MoRef::new("HostSystem", "host-2")]);
        assert_eq!(objs[0].reference("parent"), Some(MoRef::new("Folder", "group-h4")));
        assert_eq!(objs[0].u64("summary.totalMemory"), 1024);
        assert_eq!(objs[1].missing, vec![("name".to_string(), "NotAuthenticated".to_string())]);
        // An empty answer has no returnval.
        let xml = format!("{ENV}<RetrievePropertiesExResponse xmlns=\"urn:vim25\"></RetrievePropertiesExResponse></soapenv:Body></soapenv:Envelope>");
        let Reply::Ok(resp) = parse_reply(&xml).unwrap() else { panic!() };
        assert!(retrieve_result(&resp).0.is_empty());
    }

    #[test]
    fn task_errors_are_localized_faults() {
        let xml = format!(
            "{ENV}<x><error><fault xsi:type=\"DuplicateName\"><name>ns_vm</name></fault><localizedMessage>The name 'ns_vm' already exists.</localizedMessage></error></x></soapenv:Body></soapenv:Envelope>"
        );
        let Reply::Ok(x) = parse_reply(&xml).unwrap() else { panic!() };
        let f = localized_fault(x.child("error").unwrap());
        assert_eq!(f.kind, "DuplicateName");
        assert!(f.message.contains("already exists"));
    }

    #[test]
    fn clone_spec_is_in_schema_order_and_well_formed() {
        let config = ConfigSpec {
            instance_uuid: Some("u-1".into()),
            cpus: Some(2),
            memory_mib: Some(2048),
            remove_nics: vec![("VirtualE1000".into(), 4000)],
            add_nics: vec![
                NetworkBacking::Standard { name: "VM Network".into(), network: MoRef::new("Network", "network-7") },
                NetworkBacking::Distributed { switch_uuid: "sw".into(), portgroup_key: "dvportgroup-9".into() },
            ],
            nic_macs: vec![Some("00:50:56:01:02:03".into())],
            extra_config: vec![("guestinfo.userdata".into(), "I2Nsb3Vk".into())],
            firmware: Some("efi".into()),
            disks: vec![],
            ..Default::default()
        };
        let body = clone_vm(
            &MoRef::new("VirtualMachine", "vm-9"),
            &MoRef::new("Folder", "group-v3"),
            "ns_a&b",
            &MoRef::new("ResourcePool", "resgroup-8"),
            Some(&MoRef::new("Datastore", "datastore-1")),
            &config,
            None,
        );
        let env = envelope(&body);
        let doc = roxmltree::Document::parse(&env).unwrap();
        let spec = doc.descendants().find(|n| n.has_tag_name("config")).unwrap();
        let order: Vec<&str> = spec.children().filter(|c| c.is_element()).map(|c| c.tag_name().name()).collect();
        assert_eq!(
            order,
            ["instanceUuid", "numCPUs", "memoryMB", "deviceChange", "deviceChange", "deviceChange", "extraConfig", "firmware"]
        );
        assert!(body.contains("<name>ns_a&amp;b</name>"));
        assert!(body.contains("<addressType>manual</addressType><macAddress>00:50:56:01:02:03</macAddress></device>"), "the first card's MAC is set");
        assert!(body.contains("<addressType>generated</addressType></device>"), "the second card's is vCenter's");
        let loc = doc.descendants().find(|n| n.has_tag_name("location")).unwrap();
        let order: Vec<&str> = loc.children().filter(|c| c.is_element()).map(|c| c.tag_name().name()).collect();
        assert_eq!(order, ["datastore", "pool"]);
        let spec = doc.descendants().find(|n| n.has_tag_name("spec")).unwrap();
        assert!(!spec.children().any(|c| c.has_tag_name("snapshot")), "a template clone names no snapshot");
    }

    #[test]
    fn a_clone_from_a_snapshot_names_it_after_power_on_and_a_linked_one_its_disk_move_type() {
        let from = |linked| SnapshotSource { snapshot: MoRef::new("VirtualMachineSnapshot", "snapshot-72"), linked };
        let order = |body: &str, tag: &str| -> Vec<String> {
            let env = envelope(body);
            let doc = roxmltree::Document::parse(&env).unwrap();
            let n = doc.descendants().find(|n| n.has_tag_name(tag)).unwrap();
            n.children().filter(|c| c.is_element()).map(|c| c.tag_name().name().to_string()).collect()
        };
        let build = |source: Option<&SnapshotSource>| {
            clone_vm(
                &MoRef::new("VirtualMachine", "vm-63"),
                &MoRef::new("Folder", "group-v3"),
                "ns_restored",
                &MoRef::new("ResourcePool", "resgroup-8"),
                Some(&MoRef::new("Datastore", "datastore-1")),
                &ConfigSpec { instance_uuid: Some("u-2".into()), ..Default::default() },
                source,
            )
        };
        let full = build(Some(&from(false)));
        assert_eq!(order(&full, "spec"), ["location", "template", "config", "powerOn", "snapshot"]);
        assert_eq!(order(&full, "location"), ["datastore", "pool"]);
        assert!(full.contains("<snapshot type=\"VirtualMachineSnapshot\">snapshot-72</snapshot></spec>"), "{full}");
        let linked = build(Some(&from(true)));
        // vim25's VirtualMachineRelocateSpec: datastore, diskMoveType, pool.
        assert_eq!(order(&linked, "location"), ["datastore", "diskMoveType", "pool"]);
        assert!(linked.contains("<diskMoveType>createNewChildDiskBacking</diskMoveType>"), "{linked}");
        assert!(!build(None).contains("diskMoveType"));
    }

    #[test]
    fn inventory_request_names_every_traversal() {
        let body = retrieve_inventory(
            &MoRef::new("PropertyCollector", "propertyCollector"),
            &MoRef::new("Folder", "group-d1"),
            &[PropSpec { kind: "Datacenter", paths: &["name"] }],
        );
        let env = envelope(&body);
        let doc = roxmltree::Document::parse(&env).unwrap();
        let defined: Vec<&str> = doc
            .descendants()
            .filter(|n| n.has_tag_name("selectSet") && n.attributes().any(|a| a.value() == "TraversalSpec"))
            .filter_map(|n| n.children().find(|c| c.has_tag_name("name")).and_then(|c| c.text()))
            .collect();
        for used in doc.descendants().filter(|n| n.has_tag_name("selectSet")).filter_map(|n| n.children().find(|c| c.has_tag_name("name")).and_then(|c| c.text())) {
            assert!(defined.contains(&used), "{used} is not defined");
        }
    }
}
