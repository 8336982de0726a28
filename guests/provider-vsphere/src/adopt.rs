//! Discovery and adoption (contract 0.6.0): `list-machines`, `adopt` and `release`.
//!
//! - The mark banlieue puts on a VM it manages is three `config.extraConfig` keys,
//!   [`MARK_UID`], [`MARK_MACHINE`] and [`MARK_INSTALLATION`], written with
//!   `ReconfigVM_Task` (`OptionValue`s); an empty value removes a key. Only the keys count:
//!   a VM whose instance UUID happens to be a Machine UID is not marked by that. A key listed
//!   twice counts by its last entry and an empty value as none — vCenter keeps one entry per
//!   key, vcsim appends every change (a removal included) to the list.
//! - A mark is written with the VM's `config.changeVersion`, so of two callers that both read
//!   the VM unmarked, the second's write fails (`ConcurrentAccess`, `unavailable`) and its
//!   retry finds the first's mark instead of overwriting it. vcsim ignores it.
//! - `list-machines` reads every VM and template of every datacenter under the root folder
//!   (VMs in VM folders; those inside vApps are not reached, as for `probe`) in one
//!   `RetrievePropertiesEx` with the inventory that names their failure domains, sorted by
//!   instance UUID and cut into pages of [`PAGE_SIZE`] by offset
//!   ([`banlieue_sdk::provider::page_range`]). A VM without a readable configuration (no
//!   instance UUID: orphaned, inaccessible) is not listed. A VM's failure domain is its host's
//!   cluster, named as `probe` names it; a VM on a standalone host (which `probe` does not
//!   offer) has none: an empty name.

use banlieue_sdk::provider::{FoundMachine, Hardware, HardwareTarget, Machine, MachinePage, MachineRef, MachineStatus, OwnerMark, PowerState, ProviderConfig, Result, page_range};
use banlieue_sdk::session::SessionError;
use banlieue_sdk::{Error, info, warn};
use std::collections::BTreeMap;

use crate::soap::{self, ConfigSpec, DiskChange, MoRef, Node, ObjectContent, PropSpec};
use crate::vim::{VResult, Vim};
use crate::{Inv, PortGroups, addresses, hardware, portgroup_names, power_state, with_vim};

/// extraConfig key: the UID of the Machine that manages the VM.
pub const MARK_UID: &str = "banlieue.owner.machine-uid";
/// extraConfig key: `namespace/name` of that Machine.
pub const MARK_MACHINE: &str = "banlieue.owner.machine";
/// extraConfig key: the banlieue installation that manages it (empty for a VM `create` made).
pub const MARK_INSTALLATION: &str = "banlieue.owner.installation";

/// Machines on a page of `list-machines`.
pub const PAGE_SIZE: usize = 100;

/// Objects per `RetrievePropertiesEx` answer while listing: a VM's devices and extraConfig
/// (guestinfo user-data included) can run to tens of KiB, and the host caps an answer at 16 MiB.
const OBJECTS_PER_ANSWER: u32 = 100;

/// What `list-machines` and `adopt` read of a VM.
pub const VM_FOUND: &[&str] = &[
    "name",
    "config.instanceUuid",
    "config.template",
    "config.changeVersion",
    "config.extraConfig",
    "config.hardware.numCPU",
    "config.hardware.memoryMB",
    "config.hardware.device",
    "runtime.powerState",
    "runtime.host",
    "guest.ipAddress",
    "guest.net",
    "guest.hostName",
];

/// The inventory that names failure domains as `probe` does (clusters, their datacenters,
/// hosts' parents) and distributed port groups.
const SCOPE: &[PropSpec] = &[
    PropSpec { kind: "Folder", paths: &["name", "parent"] },
    PropSpec { kind: "Datacenter", paths: &["name", "parent"] },
    PropSpec { kind: "ClusterComputeResource", paths: &["name", "parent"] },
    PropSpec { kind: "HostSystem", paths: &["parent"] },
    PropSpec { kind: "DistributedVirtualPortgroup", paths: &["key", "name"] },
];

/// The value of extraConfig `key` (`config.extraConfig`, an `ArrayOfOptionValue`): the last
/// entry of that key; an empty value is none.
pub fn extra_config_value<'a>(extra: Option<&'a Node>, key: &str) -> Option<&'a str> {
    extra?.children.iter().rev().find(|o| o.str_at("key") == Some(key)).and_then(|o| o.str_at("value")).filter(|v| !v.is_empty())
}

/// The mark a VM's `config.extraConfig` holds; none without a machine UID.
pub fn mark(extra: Option<&Node>) -> Option<OwnerMark> {
    Some(OwnerMark {
        machine_uid: extra_config_value(extra, MARK_UID)?.to_string(),
        machine: extra_config_value(extra, MARK_MACHINE).unwrap_or_default().to_string(),
        installation: extra_config_value(extra, MARK_INSTALLATION).unwrap_or_default().to_string(),
    })
}

/// The mark of a VM `create` makes for `machine`: no installation.
pub fn made_mark(machine: &Machine) -> OwnerMark {
    OwnerMark { machine_uid: machine.uid.clone(), machine: format!("{}/{}", machine.namespace, machine.name), installation: String::new() }
}

/// The extraConfig entries that write `mark`: every key, so an empty installation removes one
/// left from before.
pub fn mark_entries(mark: &OwnerMark) -> Vec<(String, String)> {
    vec![
        (MARK_UID.into(), mark.machine_uid.clone()),
        (MARK_MACHINE.into(), mark.machine.clone()),
        (MARK_INSTALLATION.into(), mark.installation.clone()),
    ]
}

/// `ReconfigVM_Task` that writes `mark` on `vm` (none: removes the three keys), and nothing
/// else, only while its configuration is at `change_version` (when vCenter gave one).
pub fn mark_request(vm: &MoRef, change_version: Option<&str>, mark: Option<&OwnerMark>) -> String {
    let extra_config = match mark {
        Some(m) => mark_entries(m),
        None => [MARK_UID, MARK_MACHINE, MARK_INSTALLATION].iter().map(|k| (k.to_string(), String::new())).collect(),
    };
    let spec = ConfigSpec { change_version: change_version.filter(|v| !v.is_empty()).map(str::to_string), extra_config, ..Default::default() };
    soap::reconfigure(vm, &spec)
}

/// Failure-domain names by host: a clustered host's cluster as `probe` names it; a
/// standalone host is in none.
fn host_domains(inv: &Inv) -> BTreeMap<MoRef, String> {
    let clusters: BTreeMap<MoRef, String> = inv.clusters().into_iter().filter_map(|c| Some((c.obj.obj.clone()?, c.name))).collect();
    inv.of_kind("HostSystem")
        .filter_map(|h| Some((h.obj.clone()?, clusters.get(&h.reference("parent")?)?.clone())))
        .collect()
}

/// A VM read with [`VM_FOUND`] as found; none without an instance UUID.
pub fn found_machine(vm: &ObjectContent, domains: &BTreeMap<MoRef, String>, portgroups: &PortGroups) -> Option<FoundMachine> {
    let backend_id = vm.str("config.instanceUuid").filter(|u| !u.is_empty())?.to_string();
    let hardware = hardware(vm, portgroups)
        .unwrap_or_else(|| Hardware { cpus: 0, memory_mib: vm.u64("config.hardware.memoryMB"), disks: Vec::new(), nics: Vec::new() });
    Some(FoundMachine {
        backend_id,
        name: vm.str("name").unwrap_or_default().to_string(),
        power_state: power_state(vm.str("runtime.powerState")),
        hardware,
        addresses: addresses(vm),
        failure_domain: vm.reference("runtime.host").and_then(|h| domains.get(&h).cloned()).unwrap_or_default(),
        tags: Vec::new(),
        owner: mark(vm.props.get("config.extraConfig")),
        template: vm.str("config.template") == Some("true"),
    })
}

/// Every VM of an inventory read with [`SCOPE`] and [`VM_FOUND`], sorted by backend id.
pub fn found_machines(objects: Vec<ObjectContent>) -> Vec<FoundMachine> {
    let inv = Inv::of(objects);
    let inv = &inv;
    let domains = host_domains(inv);
    let portgroups = portgroup_names(inv.of_kind("DistributedVirtualPortgroup"));
    let mut out: Vec<FoundMachine> = inv.of_kind("VirtualMachine").filter_map(|vm| found_machine(vm, &domains, &portgroups)).collect();
    out.sort_by(|a, b| a.backend_id.cmp(&b.backend_id));
    out
}

/// One page of the VMs and templates in the Provider's scope.
///
/// The whole inventory is read with each VM's instance UUID only (what orders the pages); the
/// page's VMs alone are then read whole ([`VM_FOUND`]): a thousand VMs' devices and
/// extraConfig at once would not fit the driver's memory.
pub fn list(config: &ProviderConfig, page: Option<&str>) -> Result<MachinePage> {
    // A token this driver never gave is refused before vCenter is asked.
    page_range(page, usize::MAX, PAGE_SIZE)?;
    let mut specs = SCOPE.to_vec();
    specs.push(PropSpec { kind: "VirtualMachine", paths: &["config.instanceUuid"] });
    with_vim(config, |vim| {
        let inv = Inv::of(vim.inventory_paged(&specs, OBJECTS_PER_ANSWER)?);
        let mut ids: Vec<(String, MoRef)> = inv
            .of_kind("VirtualMachine")
            .filter_map(|vm| Some((vm.str("config.instanceUuid").filter(|u| !u.is_empty())?.to_string(), vm.obj.clone()?)))
            .collect();
        ids.sort();
        let (range, next) = page_range(page, ids.len(), PAGE_SIZE)?;
        let wanted: Vec<MoRef> = ids[range].iter().map(|(_, vm)| vm.clone()).collect();
        let read = if wanted.is_empty() { Vec::new() } else { vim.objects(&wanted, VM_FOUND)? };
        let (domains, portgroups) = (host_domains(&inv), portgroup_names(inv.of_kind("DistributedVirtualPortgroup")));
        let mut machines: Vec<FoundMachine> = read.iter().filter_map(|vm| found_machine(vm, &domains, &portgroups)).collect();
        machines.sort_by(|a, b| a.backend_id.cmp(&b.backend_id));
        Ok(MachinePage { machines, next })
    })
}

/// The backend id of the machine to adopt or release.
fn backend_id(machine: &MachineRef) -> Result<&str> {
    machine
        .backend_id
        .as_deref()
        .filter(|id| !id.is_empty())
        .ok_or_else(|| Error::InvalidSpec(format!("machine {}/{} names no vSphere VM (backend-id, its instance UUID)", machine.namespace, machine.name)))
}

/// The VM whose instance UUID is `id`, read with [`VM_FOUND`]; none if there is none.
fn read_vm(vim: &Vim, id: &str) -> VResult<Option<(MoRef, ObjectContent)>> {
    let Some(vm) = vim.find_vm(id)? else { return Ok(None) };
    match vim.props(&vm, VM_FOUND) {
        Ok(p) => Ok(Some((vm, p))),
        Err(SessionError::Failed(e)) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// What `adopt` does with a VM as read.
#[derive(Debug, PartialEq, Eq)]
pub enum Adoption {
    /// A template: never adopted.
    Refuse(String),
    /// Marked already (by this machine or another): returned as it is.
    Keep,
    /// Unmarked: stamp the mark.
    Stamp,
}

/// What `adopt` does with `vm` (read with [`VM_FOUND`]).
pub fn adoption(vm: &ObjectContent) -> Adoption {
    if vm.str("config.template") == Some("true") {
        return Adoption::Refuse(format!("vSphere VM {} is a template: templates are listed, never adopted", vm.str("name").unwrap_or("?")));
    }
    if mark(vm.props.get("config.extraConfig")).is_some() { Adoption::Keep } else { Adoption::Stamp }
}

/// Stamp `mark` on VM `machine.backend_id` unless it carries a mark; return it as found.
pub fn adopt(config: &ProviderConfig, machine: &MachineRef, mark: &OwnerMark) -> Result<FoundMachine> {
    let id = backend_id(machine)?;
    if mark.machine_uid.is_empty() {
        return Err(Error::InvalidSpec(format!("the mark for vSphere VM {id} names no machine UID")));
    }
    with_vim(config, |vim| {
        let Some((vm, mut p)) = read_vm(vim, id)? else {
            return Err(Error::NotFound(format!("no vSphere VM has instanceUuid {id}")).into());
        };
        let name = p.str("name").unwrap_or(&vm.value).to_string();
        match adoption(&p) {
            Adoption::Refuse(why) => return Err(Error::InvalidSpec(why).into()),
            Adoption::Keep => {}
            Adoption::Stamp => {
                info!("adopting vSphere VM {name} ({id}) as machine {} ({})", mark.machine, mark.machine_uid);
                vim.run_task(&format!("ReconfigVM_Task {name} (mark)"), &mark_request(&vm, p.str("config.changeVersion"), Some(mark)))?;
                // Read back: what vCenter holds is what is returned.
                p = vim.props(&vm, VM_FOUND)?;
            }
        }
        let inv = Inv::read(vim, SCOPE)?;
        let portgroups = portgroup_names(inv.of_kind("DistributedVirtualPortgroup"));
        found_machine(&p, &host_domains(&inv), &portgroups)
            .ok_or_else(|| Error::Internal(format!("vSphere VM {name} ({id}) has no instance UUID any more")).into())
    })
}

/// Bring adopted, powered-off VM `machine.backend_id` to `want` in one `ReconfigVM_Task`:
/// CPUs, memory, and each virtual disk (controller and unit order, as `describe` reports
/// them) grown. Every disk is checked first, so a shrink refused changes nothing.
pub fn reconfigure(config: &ProviderConfig, machine: &MachineRef, want: &HardwareTarget) -> Result<MachineStatus> {
    with_vim(config, |vim| {
        let vm = crate::lookup(vim, machine)?;
        let p = vim.props(&vm, &["name", "runtime.powerState", "config.hardware.numCPU", "config.hardware.memoryMB", "config.hardware.device", "config.changeVersion"])?;
        let name = p.str("name").unwrap_or(&vm.value).to_string();
        if power_state(p.str("runtime.powerState")) != PowerState::PoweredOff {
            return Err(Error::InvalidSpec(format!("vSphere VM {name} is not powered off: its hardware is changed only while it is")).into());
        }
        let mut disks = Vec::new();
        for (disk, gib) in crate::virtual_disks(p.props.get("config.hardware.device")).into_iter().zip(&want.disk_sizes_gib) {
            let have = disk.capacity_kib.div_ceil(1 << 20);
            if *gib < have {
                return Err(Error::InvalidSpec(format!("{} ({}) of vSphere VM {name} holds {have} GiB; it is never shrunk to {gib} GiB", disk.label, disk.file)).into());
            }
            if *gib > have {
                disks.push(DiskChange::Grow { disk, capacity_kib: gib << 20 });
            }
        }
        if p.u64("config.hardware.numCPU") != u64::from(want.cpus) || p.u64("config.hardware.memoryMB") != want.memory_mib || !disks.is_empty() {
            info!("reconfiguring adopted vSphere VM {name}: {} CPUs, {} MiB, {} disk(s) grown", want.cpus, want.memory_mib, disks.len());
            let spec = ConfigSpec {
                change_version: p.str("config.changeVersion").map(str::to_string),
                cpus: Some(want.cpus),
                memory_mib: Some(want.memory_mib),
                disks,
                ..Default::default()
            };
            vim.run_task(&format!("ReconfigVM_Task {name}"), &soap::reconfigure(&vm, &spec))?;
        }
        crate::describe_vm(vim, &vm)
    })
}

/// Remove `mark` from VM `machine.backend_id` when it carries it, changing nothing else; a VM
/// gone, unmarked or carrying another machine's mark is left as it is.
pub fn release(config: &ProviderConfig, machine: &MachineRef, mark: &OwnerMark) -> Result<()> {
    let id = backend_id(machine)?;
    with_vim(config, |vim| {
        let Some((vm, p)) = read_vm(vim, id)? else { return Ok(()) };
        let name = p.str("name").unwrap_or(&vm.value).to_string();
        match self::mark(p.props.get("config.extraConfig")) {
            None => Ok(()),
            Some(m) if m.machine_uid != mark.machine_uid => {
                warn!(
                    "not releasing vSphere VM {name} ({id}) for machine {} ({}): it carries the mark of machine {} ({})",
                    mark.machine, mark.machine_uid, m.machine, m.machine_uid
                );
                Ok(())
            }
            Some(_) => {
                info!("releasing vSphere VM {name} ({id}) from machine {} ({})", mark.machine, mark.machine_uid);
                match vim.run_task(&format!("ReconfigVM_Task {name} (unmark)"), &mark_request(&vm, p.str("config.changeVersion"), None)) {
                    Err(SessionError::Failed(e)) if e.is_not_found() => Ok(()),
                    other => other.map(|_| ()),
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_sdk::provider::{DiskStatus, NicStatus, PowerState};

    /// A `RetrievePropertiesEx` answer of vcsim to [`SCOPE`] and [`VM_FOUND`] (devices other than
    /// disks and NICs cut): DC0_H0_VM0 on the standalone host DC0_H0, marked then released (vcsim
    /// appends the removal); DC0_C0_RP0_VM0 in cluster DC0_C0, adopted; the template tmpl-debian;
    /// and a VM whose configuration cannot be read.
    const ANSWER: &str = include_str!("../testdata/list-machines.xml");

    fn objects() -> Vec<ObjectContent> {
        let soap::Reply::Ok(resp) = soap::parse_reply(ANSWER).unwrap() else { panic!("a fault") };
        soap::retrieve_result(&resp).0
    }

    fn vm(name: &str) -> ObjectContent {
        objects().into_iter().find(|o| o.str("name") == Some(name)).unwrap()
    }

    #[test]
    fn an_answer_becomes_found_machines_by_backend_id_with_domains_marks_and_port_group_names() {
        let found = found_machines(objects());
        let ids: Vec<(&str, &str)> = found.iter().map(|f| (f.backend_id.as_str(), f.name.as_str())).collect();
        assert_eq!(
            ids,
            [
                ("aff67988-859a-56c4-a0b9-056800d082b8", "tmpl-debian"),
                ("b4689bed-97f0-5bcd-8a4c-07477cc8f06f", "DC0_H0_VM0"),
                ("bfff331f-7f07-572d-951e-edd3701dc061", "DC0_C0_RP0_VM0"),
            ],
            "sorted by instance UUID; a VM without one is not listed"
        );
        let [template, standalone, adopted] = &found[..] else { panic!() };
        assert!(template.template && !standalone.template && !adopted.template);
        assert_eq!(template.power_state, PowerState::PoweredOff);
        assert_eq!(standalone.failure_domain, "", "a standalone host is in no failure domain");
        assert_eq!(adopted.failure_domain, "DC0_C0");
        assert_eq!(standalone.owner, None, "released: the last entry of the key is empty");
        assert_eq!(adopted.owner, Some(OwnerMark { machine_uid: "uid-A".into(), machine: "ns/a".into(), installation: "c1".into() }));
        assert_eq!(
            standalone.hardware,
            Hardware {
                cpus: 1,
                memory_mib: 32,
                disks: vec![DiskStatus { name: String::new(), size_gib: 1, id: "[LocalDS_0] DC0_H0_VM0/disk1.vmdk".into() }],
                nics: vec![NicStatus { name: String::new(), mac: "00:0c:29:36:63:62".into(), network: "DC0_DVPG0".into() }],
            }
        );
        assert_eq!(standalone.power_state, PowerState::PoweredOn);
        assert_eq!(standalone.addresses.iter().map(|a| a.address.as_str()).collect::<Vec<_>>(), ["10.169.79.50"]);
        assert!(found.iter().all(|f| f.tags.is_empty()));
        // The hardware is what `describe` reports for the same VM.
        let portgroups = portgroup_names(objects().iter().filter(|o| o.obj.as_ref().is_some_and(|r| r.kind == "DistributedVirtualPortgroup")));
        assert_eq!(crate::status(&vm("DC0_H0_VM0"), &portgroups).hardware.as_ref(), Some(&standalone.hardware));
    }

    fn option(key: &str, value: &str) -> Node {
        let leaf = |name: &str, text: &str| Node { name: name.into(), text: text.into(), ..Default::default() };
        Node { name: "OptionValue".into(), xsi_type: Some("OptionValue".into()), children: vec![leaf("key", key), leaf("value", value)], ..Default::default() }
    }

    fn extra(options: &[(&str, &str)]) -> Node {
        Node { children: options.iter().map(|(k, v)| option(k, v)).collect(), ..Default::default() }
    }

    #[test]
    fn the_mark_is_the_last_entry_of_each_key_and_needs_a_machine_uid() {
        assert_eq!(mark(None), None);
        assert_eq!(mark(Some(&extra(&[("guestinfo.metadata", "x")]))), None);
        assert_eq!(mark(Some(&extra(&[(MARK_MACHINE, "ns/a"), (MARK_INSTALLATION, "c1")]))), None, "no machine UID, no mark");
        let m = mark(Some(&extra(&[(MARK_UID, "u-1")]))).unwrap();
        assert_eq!(m, OwnerMark { machine_uid: "u-1".into(), machine: String::new(), installation: String::new() });
        // vcsim's history of adopt, release, adopt by another.
        let history = [(MARK_UID, "u-1"), (MARK_MACHINE, "ns/a"), (MARK_INSTALLATION, "c1"), (MARK_UID, ""), (MARK_MACHINE, ""), (MARK_INSTALLATION, "")];
        assert_eq!(mark(Some(&extra(&history))), None);
        let mut again = history.to_vec();
        again.extend([(MARK_UID, "u-2"), (MARK_MACHINE, "ns/b"), (MARK_INSTALLATION, "")]);
        assert_eq!(mark(Some(&extra(&again))), Some(OwnerMark { machine_uid: "u-2".into(), machine: "ns/b".into(), installation: String::new() }));
    }

    /// The children of `spec` in a `ReconfigVM_Task` body: (element, key, value).
    fn spec_of(body: &str) -> Vec<(String, String, String)> {
        let env = soap::envelope(body);
        let doc = roxmltree::Document::parse(&env).unwrap();
        let spec = doc.descendants().find(|n| n.has_tag_name("spec")).unwrap();
        let text = |n: roxmltree::Node, tag: &str| n.children().find(|c| c.has_tag_name(tag)).and_then(|c| c.text()).unwrap_or("").to_string();
        spec.children()
            .filter(|c| c.is_element())
            .map(|c| {
                let name = c.tag_name().name().to_string();
                if name == "extraConfig" { (name, text(c, "key"), text(c, "value")) } else { (name, String::new(), c.text().unwrap_or("").to_string()) }
            })
            .collect()
    }

    #[test]
    fn stamping_writes_the_three_keys_and_nothing_else_and_removing_empties_them() {
        let vm = MoRef::new("VirtualMachine", "vm-63");
        let m = OwnerMark { machine_uid: "u-1".into(), machine: "ns/a&b".into(), installation: "c1/i".into() };
        let body = mark_request(&vm, Some("2026-12-07T00:00:00.1Z"), Some(&m));
        assert!(body.starts_with("<ReconfigVM_Task xmlns=\"urn:vim25\"><_this type=\"VirtualMachine\">vm-63</_this><spec>"), "{body}");
        let row = |e: &str, k: &str, v: &str| (e.to_string(), k.to_string(), v.to_string());
        assert_eq!(
            spec_of(&body),
            [
                row("changeVersion", "", "2026-12-07T00:00:00.1Z"),
                row("extraConfig", MARK_UID, "u-1"),
                row("extraConfig", MARK_MACHINE, "ns/a&b"),
                row("extraConfig", MARK_INSTALLATION, "c1/i"),
            ]
        );
        let removal = mark_request(&vm, Some(""), None);
        assert_eq!(spec_of(&removal), [row("extraConfig", MARK_UID, ""), row("extraConfig", MARK_MACHINE, ""), row("extraConfig", MARK_INSTALLATION, "")]);
        assert!(removal.contains("<value xsi:type=\"xsd:string\"></value>"), "an empty string, which removes the key: {removal}");
    }

    #[test]
    fn a_made_machine_is_marked_with_its_uid_and_name_and_no_installation() {
        let machine = Machine {
            uid: "u-9".into(),
            name: "web".into(),
            namespace: "ns".into(),
            cpus: 1,
            memory_mib: 512,
            firmware: banlieue_sdk::provider::Firmware::Bios,
            disks: Vec::new(),
            nics: Vec::new(),
            image: banlieue_sdk::provider::ImageSource::Template("t".into()),
            user_data: None,
            user_data_format: banlieue_sdk::provider::UserDataFormat::CloudConfig,
            failure_domain: "DC0_C0".into(),
            power_state: PowerState::PoweredOn,
            labels: Vec::new(),
        };
        let extra = crate::extra_config(&machine);
        let got: Vec<(&str, &str)> = extra.iter().filter(|(k, _)| k.starts_with("banlieue.")).map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(got, [(MARK_UID, "u-9"), (MARK_MACHINE, "ns/web"), (MARK_INSTALLATION, "")]);
    }

    #[test]
    fn templates_are_refused_marked_vms_kept_and_the_rest_stamped() {
        assert!(matches!(adoption(&vm("tmpl-debian")), Adoption::Refuse(m) if m.contains("tmpl-debian") && m.contains("template")));
        assert_eq!(adoption(&vm("DC0_C0_RP0_VM0")), Adoption::Keep);
        assert_eq!(adoption(&vm("DC0_H0_VM0")), Adoption::Stamp, "released: unmarked again");
    }

    fn machine_ref(backend_id: Option<&str>) -> MachineRef {
        MachineRef {
            uid: "u-1".into(),
            name: "a".into(),
            namespace: "ns".into(),
            provider_id: None,
            failure_domain: String::new(),
            backend_id: backend_id.map(str::to_string),
        }
    }

    #[test]
    fn no_backend_id_or_a_foreign_page_token_is_refused_before_vcenter_is_asked() {
        let config = ProviderConfig {
            provider: "infra/vc".into(),
            endpoint: "https://vc.invalid".into(),
            credential_keys: Vec::new(),
            storage_classes: Vec::new(),
            network_classes: Vec::new(),
            features: Vec::new(),
        };
        let m = OwnerMark { machine_uid: "u-1".into(), machine: "ns/a".into(), installation: String::new() };
        for id in [None, Some("")] {
            assert!(matches!(adopt(&config, &machine_ref(id), &m), Err(Error::InvalidSpec(e)) if e.contains("backend-id")));
            assert!(matches!(release(&config, &machine_ref(id), &m), Err(Error::InvalidSpec(_))));
        }
        assert!(matches!(list(&config, Some("next please")), Err(Error::InvalidSpec(_))));
    }
}
