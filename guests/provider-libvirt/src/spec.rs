//! The driver's decisions, as pure functions of what libvirt reported (tested natively).

use banlieue_sdk::provider::libvirt::{DomainInfo, DomainState, InterfaceAddresses, NetworkInfo, Node, PoolInfo, VolumeInfo};
use banlieue_sdk::provider::{
    Address, AddressType, Capacity, DiskStatus, FailureDomain, Hardware, ImageSource, Inventory, Machine, MachinePhase, MachineStatus, NicStatus,
    PowerState, ProviderConfig, condition,
};
use banlieue_sdk::{Error, Result};

use crate::{naming, xml};

const GIB: u64 = 1 << 30;

/// Free space a pool must have beyond the seed: the qcow2 overlays start at a
/// few hundred KiB of metadata each (they are thin; the guest fills them later).
pub const OVERLAY_HEADROOM_BYTES: u64 = 4 << 20;

/// The `<domain type>` for the Provider's endpoint: libvirt's test driver for
/// `test…` URIs, otherwise `qemu` (TCG; works without `/dev/kvm`).
pub fn virt_type(config: &ProviderConfig) -> &'static str {
    if config.endpoint.starts_with("test") { "test" } else { "qemu" }
}

/// The failure domain's name: the Provider's name (`config.provider` after the `/`).
pub fn failure_domain_name(config: &ProviderConfig) -> &str {
    config.provider.rsplit_once('/').map_or(config.provider.as_str(), |(_, name)| name)
}

/// Whether the domain is running in some form (and so holds memory and must be destroyed to stop).
pub fn is_active(state: DomainState) -> bool {
    !matches!(state, DomainState::Shutoff | DomainState::NoState)
}

pub fn power_state(state: DomainState) -> PowerState {
    match state {
        DomainState::Running | DomainState::Blocked => PowerState::PoweredOn,
        DomainState::Paused | DomainState::PmSuspended => PowerState::Suspended,
        DomainState::Shutoff | DomainState::Shutdown | DomainState::Crashed | DomainState::NoState => {
            PowerState::PoweredOff
        }
    }
}

fn state_reason(state: DomainState) -> &'static str {
    match state {
        DomainState::NoState => "NoState",
        DomainState::Running => "Running",
        DomainState::Blocked => "Blocked",
        DomainState::Paused => "Paused",
        DomainState::Shutdown => "ShuttingDown",
        DomainState::Shutoff => "ShutOff",
        DomainState::Crashed => "Crashed",
        DomainState::PmSuspended => "PMSuspended",
    }
}

/// The hardware of domain `domain` as its XML and its volumes (`(pool, volume)` of
/// the pools its disks are in) say: a disk is named after its volume (`{domain}_{disk}.qcow2`),
/// its id is the volume's path; the read-only seed is no disk of the machine. NICs are left
/// unnamed (the host names them by position).
pub fn hardware(domain: &str, hw: &xml::DomainHardware, volumes: &[(String, VolumeInfo)]) -> Hardware {
    let prefix = format!("{domain}_");
    let disks = hw
        .disks
        .iter()
        .filter(|d| !d.readonly)
        .map(|d| {
            let volume = volumes.iter().find(|(pool, v)| *pool == d.pool && v.name == d.volume).map(|(_, v)| v);
            DiskStatus {
                name: d.volume.strip_prefix(&prefix).and_then(|n| n.strip_suffix(".qcow2")).unwrap_or(&d.dev).to_string(),
                size_gib: volume.map_or(0, |v| v.capacity_bytes >> 30),
                id: volume.map_or_else(|| format!("{}/{}", d.pool, d.volume), |v| v.path.clone()),
            }
        })
        .collect();
    let nics = hw.nics.iter().map(|(mac, network)| NicStatus { name: String::new(), mac: mac.clone(), network: network.clone() }).collect();
    Hardware { cpus: hw.cpus, memory_mib: hw.memory_mib, disks, nics }
}

/// What `describe` reports for a domain, its XML and the addresses libvirt knows for it.
pub fn status(domain: &DomainInfo, domain_xml: &str, interfaces: &[InterfaceAddresses], hardware: Option<Hardware>) -> MachineStatus {
    let power = power_state(domain.state);
    let macs = xml::macs(domain_xml);
    let mut message = format!("libvirt domain {} is {}", domain.name, state_reason(domain.state).to_ascii_lowercase());
    if !macs.is_empty() {
        message.push_str(&format!("; NIC MAC addresses {}", macs.join(", ")));
    }
    // IPv4 first (what users connect to), loopback and link-local left out, each address once.
    let mut addresses: Vec<Address> = Vec::new();
    for ipv6 in [false, true] {
        for ip in interfaces.iter().flat_map(|i| &i.addresses).filter(|a| a.ipv6 == ipv6) {
            let local = ip.address.starts_with("127.") || ip.address == "::1" || ip.address.starts_with("fe80:");
            if !local && !addresses.iter().any(|a| a.address == ip.address) {
                addresses.push(Address { type_: AddressType::InternalIp, address: ip.address.clone() });
            }
        }
    }
    let on = power == PowerState::PoweredOn;
    let mut conditions = vec![condition("PoweredOn", on, state_reason(domain.state), message)];
    if on && !macs.is_empty() {
        let known = !addresses.is_empty();
        conditions.push(condition(
            "AddressReported",
            known,
            if known { "Reported" } else { "NoAddress" },
            if known {
                "from the network's DHCP leases or the guest agent".to_string()
            } else {
                "no DHCP lease for the domain's MAC addresses yet, and no guest agent answered".to_string()
            },
        ));
    }
    MachineStatus {
        provider_id: format!("libvirt://{}", domain.uuid.to_ascii_lowercase()),
        hardware,
        power_state: power,
        phase: match domain.state {
            DomainState::Shutdown => MachinePhase::ShuttingDown,
            _ if on && !macs.is_empty() && addresses.is_empty() => MachinePhase::WaitingForAddress,
            _ if on => MachinePhase::Running,
            _ => MachinePhase::PoweredOff,
        },
        addresses,
        conditions,
        provisioned: true,
    }
}

/// Check a machine against the host before anything is created. Missing pools
/// or networks can never appear by retrying the same spec: `InvalidSpec`.
/// Inactive ones may be started by the operator: `Unavailable`.
pub fn validate<'m>(machine: &'m Machine, pools: &[PoolInfo], networks: &[NetworkInfo]) -> Result<&'m str> {
    let backing = match &machine.image {
        ImageSource::BackingFile(path) if !path.is_empty() => path.as_str(),
        ImageSource::BackingFile(_) => return Err(Error::InvalidSpec("the image's backing file is empty".into())),
        ImageSource::Template(_) | ImageSource::Url(_) => {
            return Err(Error::InvalidSpec("the libvirt driver boots from a backingFile image source".into()));
        }
    };
    validate_hardware(machine, pools, networks)?;
    Ok(backing)
}

/// [`validate`] without the image source: what a machine restored from a snapshot (whose
/// disks come from the snapshot) is checked for.
pub fn validate_hardware(machine: &Machine, pools: &[PoolInfo], networks: &[NetworkInfo]) -> Result<()> {
    if machine.power_state == PowerState::Suspended {
        return Err(Error::InvalidSpec("the libvirt driver does not suspend VMs".into()));
    }
    if machine.cpus == 0 || machine.memory_mib == 0 {
        return Err(Error::InvalidSpec(format!(
            "a machine needs at least one CPU and some memory (cpus {}, memory {} MiB)",
            machine.cpus, machine.memory_mib
        )));
    }
    if machine.disks.is_empty() {
        return Err(Error::InvalidSpec("a machine needs at least one disk (the first is the boot disk)".into()));
    }
    for (i, disk) in machine.disks.iter().enumerate() {
        naming::check_disk(&disk.name)?;
        if machine.disks[..i].iter().any(|d| d.name == disk.name) {
            return Err(Error::InvalidSpec(format!("disk name {:?} is used twice", disk.name)));
        }
        if disk.size_gib == 0 {
            return Err(Error::InvalidSpec(format!("disk {:?} has size 0", disk.name)));
        }
        match pools.iter().find(|p| p.name == disk.target) {
            None => {
                return Err(Error::InvalidSpec(format!(
                    "storage pool {:?} (disk {:?}) does not exist on this libvirt host",
                    disk.target, disk.name
                )));
            }
            Some(p) if !p.active => {
                return Err(Error::Unavailable(format!(
                    "storage pool {:?} (disk {:?}) is not active",
                    disk.target, disk.name
                )));
            }
            Some(_) => {}
        }
    }
    for nic in &machine.nics {
        match networks.iter().find(|n| n.name == nic.network) {
            None => {
                return Err(Error::InvalidSpec(format!(
                    "network {:?} (NIC {:?}) does not exist on this libvirt host",
                    nic.network, nic.name
                )));
            }
            Some(n) if !n.active => {
                return Err(Error::Unavailable(format!(
                    "network {:?} (NIC {:?}) is not active",
                    nic.network, nic.name
                )));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// What `probe` reports: the libvirt host is one failure domain.
pub fn inventory(
    config: &ProviderConfig,
    node: &Node,
    pools: &[PoolInfo],
    networks: &[NetworkInfo],
) -> Inventory {
    let name = failure_domain_name(config).to_string();
    let active_pool = |target: &str| pools.iter().find(|p| p.name == target && p.active);
    let storage_classes: Vec<String> = config
        .storage_classes
        .iter()
        .filter(|(_, pool)| active_pool(pool).is_some())
        .map(|(class, _)| class.clone())
        .collect();
    let network_classes: Vec<String> = config
        .network_classes
        .iter()
        .filter(|(_, net)| networks.iter().any(|n| &n.name == net && n.active))
        .map(|(class, _)| class.clone())
        .collect();
    // Each mapped pool counts once, however many classes point at it.
    let mut counted: Vec<&str> = Vec::new();
    let mut storage_bytes: u64 = 0;
    for (_, target) in &config.storage_classes {
        if let Some(pool) = active_pool(target)
            && !counted.contains(&pool.name.as_str())
        {
            counted.push(&pool.name);
            storage_bytes = storage_bytes.saturating_add(pool.available_bytes);
        }
    }
    Inventory {
        backend_version: Some(format!("libvirt ({} node)", node.model)),
        failure_domains: vec![FailureDomain {
            labels: vec![("banlieue.io/host".into(), name.clone())],
            name,
            capacity: Capacity {
                cpus: u64::from(node.cpus),
                memory_mib: node.memory_kib / 1024,
                storage_gib: storage_bytes / GIB,
            },
            storage_classes,
            network_classes,
            features: config.features.clone(),
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_sdk::provider::{Disk, Firmware, Nic, UrlSource, UserDataFormat};

    fn config(endpoint: &str) -> ProviderConfig {
        ProviderConfig {
            provider: "infra/host-a".into(),
            endpoint: endpoint.into(),
            credential_keys: vec![],
            storage_classes: vec![
                ("standard".into(), "default-pool".into()),
                ("fast".into(), "default-pool".into()),
                ("cold".into(), "stopped-pool".into()),
                ("ghost".into(), "no-such-pool".into()),
            ],
            network_classes: vec![("default".into(), "default".into()), ("dmz".into(), "missing".into())],
            features: vec!["uefi".into()],
        }
    }

    fn pools() -> Vec<PoolInfo> {
        vec![
            PoolInfo {
                name: "default-pool".into(),
                active: true,
                capacity_bytes: 100 * GIB,
                available_bytes: 97 * GIB + 5,
            },
            PoolInfo {
                name: "stopped-pool".into(),
                active: false,
                capacity_bytes: 10 * GIB,
                available_bytes: 10 * GIB,
            },
            PoolInfo { name: "unmapped".into(), active: true, capacity_bytes: 10 * GIB, available_bytes: 10 * GIB },
        ]
    }

    fn networks() -> Vec<NetworkInfo> {
        vec![
            NetworkInfo { name: "default".into(), active: true, bridge: Some("virbr0".into()) },
            NetworkInfo { name: "down".into(), active: false, bridge: None },
        ]
    }

    fn domain(name: &str, state: DomainState, memory_kib: u64) -> DomainInfo {
        DomainInfo {
            name: name.into(),
            uuid: "6F1C2A3E-1111-4222-8333-444455556666".into(),
            state,
            vcpus: 1,
            memory_kib,
        }
    }

    fn machine() -> Machine {
        Machine {
            uid: "6f1c2a3e-1111-4222-8333-444455556666".into(),
            name: "vm".into(),
            namespace: "ns".into(),
            cpus: 2,
            memory_mib: 512,
            firmware: Firmware::Bios,
            disks: vec![Disk { name: "root".into(), size_gib: 10, target: "default-pool".into() }],
            nics: vec![Nic { name: "eth0".into(), network: "default".into(), ip: None }],
            image: ImageSource::BackingFile("/images/base.qcow2".into()),
            user_data: None,
            user_data_format: UserDataFormat::CloudConfig,
            failure_domain: "host-a".into(),
            power_state: PowerState::PoweredOn,
            labels: vec![],
        }
    }

    #[test]
    fn domain_type_follows_the_endpoint() {
        assert_eq!(virt_type(&config("test:///default")), "test");
        assert_eq!(virt_type(&config("test+unix:///default")), "test");
        assert_eq!(virt_type(&config("qemu:///system")), "qemu");
        assert_eq!(virt_type(&config("qemu+ssh://root@h/system")), "qemu");
    }

    #[test]
    fn probe_reports_mapped_active_targets_only() {
        let node = Node { model: "x86_64".into(), memory_kib: 4 * 1024 * 1024, cpus: 8, mhz: 2000 };
        let inv = inventory(&config("qemu:///system"), &node, &pools(), &networks());
        assert_eq!(inv.backend_version.as_deref(), Some("libvirt (x86_64 node)"));
        let [fd] = inv.failure_domains.as_slice() else { panic!("{inv:?}") };
        assert_eq!(fd.name, "host-a");
        assert_eq!(fd.labels, vec![("banlieue.io/host".to_string(), "host-a".to_string())]);
        assert_eq!(fd.storage_classes, vec!["standard".to_string(), "fast".to_string()]);
        assert_eq!(fd.network_classes, vec!["default".to_string()]);
        assert_eq!(fd.features, vec!["uefi".to_string()]);
        // default-pool counted once; the node's memory, whatever the domains' maximums (libvirt overcommits).
        assert_eq!((fd.capacity.cpus, fd.capacity.memory_mib, fd.capacity.storage_gib), (8, 4096, 97));
        let mut bare = config("x");
        bare.provider = "host-b".into();
        assert_eq!(failure_domain_name(&bare), "host-b");
    }

    #[test]
    fn states_map_to_power_states() {
        use DomainState::*;
        for (s, p) in [
            (Running, PowerState::PoweredOn),
            (Blocked, PowerState::PoweredOn),
            (Paused, PowerState::Suspended),
            (PmSuspended, PowerState::Suspended),
            (Shutoff, PowerState::PoweredOff),
            (Shutdown, PowerState::PoweredOff),
            (Crashed, PowerState::PoweredOff),
            (NoState, PowerState::PoweredOff),
        ] {
            assert_eq!(power_state(s), p, "{s:?}");
        }
    }

    #[test]
    fn hardware_names_disks_after_their_volumes_and_leaves_the_seed_out() {
        let hw = xml::DomainHardware {
            cpus: 2,
            memory_mib: 512,
            disks: vec![
                xml::DomainDisk { dev: "vda".into(), pool: "p".into(), volume: "ns_vm_root.qcow2".into(), readonly: false },
                xml::DomainDisk { dev: "vdb".into(), pool: "q".into(), volume: "elsewhere.qcow2".into(), readonly: false },
                xml::DomainDisk { dev: "vdc".into(), pool: "p".into(), volume: "ns_vm_cidata.img".into(), readonly: true },
            ],
            nics: vec![("52:54:00:aa:bb:cc".into(), "default".into())],
        };
        let volumes = vec![("p".to_string(), VolumeInfo { name: "ns_vm_root.qcow2".into(), path: "/pool/ns_vm_root.qcow2".into(), capacity_bytes: 8 << 30 })];
        let got = hardware("ns_vm", &hw, &volumes);
        assert_eq!((got.cpus, got.memory_mib), (2, 512));
        let disks: Vec<(&str, u64, &str)> = got.disks.iter().map(|d| (d.name.as_str(), d.size_gib, d.id.as_str())).collect();
        assert_eq!(disks, [("root", 8, "/pool/ns_vm_root.qcow2"), ("vdb", 0, "q/elsewhere.qcow2")], "a volume not found is reported as the XML names it");
        assert_eq!((got.nics[0].mac.as_str(), got.nics[0].network.as_str(), got.nics[0].name.as_str()), ("52:54:00:aa:bb:cc", "default", ""));
    }

    #[test]
    fn status_is_truthful() {
        use banlieue_sdk::provider::libvirt::IpAddress;
        let xml = "<domain><devices><interface type='network'><mac address='52:54:00:aa:bb:cc'/></interface></devices></domain>";
        let s = status(&domain("ns_vm", DomainState::Running, 1), xml, &[], None);
        assert_eq!(s.provider_id, "libvirt://6f1c2a3e-1111-4222-8333-444455556666");
        assert_eq!(s.power_state, PowerState::PoweredOn);
        assert!(s.addresses.is_empty() && s.provisioned);
        assert_eq!(s.phase, MachinePhase::WaitingForAddress);
        assert!(s.conditions[0].message.contains("52:54:00:aa:bb:cc"), "{:?}", s.conditions);
        assert_eq!((s.conditions[1].type_.as_str(), s.conditions[1].reason.as_str()), ("AddressReported", "NoAddress"));
        let ip = |address: &str, ipv6| IpAddress { address: address.into(), prefix: 24, ipv6 };
        let leases = [InterfaceAddresses {
            name: "vnet0".into(),
            mac: "52:54:00:aa:bb:cc".into(),
            addresses: vec![ip("fe80::1", true), ip("fd00::5", true), ip("192.168.123.101", false), ip("127.0.0.1", false)],
        }];
        let s = status(&domain("ns_vm", DomainState::Running, 1), xml, &leases, None);
        let got: Vec<&str> = s.addresses.iter().map(|a| a.address.as_str()).collect();
        assert_eq!(got, ["192.168.123.101", "fd00::5"]);
        assert_eq!(s.phase, MachinePhase::Running);
        let off = status(&domain("ns_vm", DomainState::Shutoff, 1), "<domain/>", &[], None);
        assert_eq!(off.power_state, PowerState::PoweredOff);
        assert_eq!(off.conditions[0].reason, "ShutOff");
        assert_eq!(off.conditions.len(), 1);
        // Without a NIC there is no address to wait for.
        assert_eq!(status(&domain("ns_vm", DomainState::Running, 1), "<domain/>", &[], None).phase, MachinePhase::Running);
    }

    #[test]
    fn validation_names_what_is_wrong() {
        assert_eq!(validate(&machine(), &pools(), &networks()).unwrap(), "/images/base.qcow2");
        let invalid = |m: Machine, needle: &str| match validate(&m, &pools(), &networks()) {
            Err(Error::InvalidSpec(msg)) => assert!(msg.contains(needle), "{msg} lacks {needle}"),
            other => panic!("{needle}: {other:?}"),
        };
        let mut m = machine();
        m.image = ImageSource::Template("tpl".into());
        invalid(m, "backingFile");
        let mut m = machine();
        m.image = ImageSource::Url(UrlSource { url: "http://x".into(), checksum: None });
        invalid(m, "backingFile");
        let mut m = machine();
        m.disks.clear();
        invalid(m, "at least one disk");
        let mut m = machine();
        m.disks[0].target = "nope".into();
        invalid(m, "\"nope\"");
        let mut m = machine();
        m.nics[0].network = "missing-net".into();
        invalid(m, "\"missing-net\"");
        let mut m = machine();
        m.power_state = PowerState::Suspended;
        invalid(m, "does not suspend");
        let mut m = machine();
        m.disks.push(m.disks[0].clone());
        invalid(m, "used twice");
        let mut m = machine();
        m.disks[0].target = "stopped-pool".into();
        assert!(matches!(validate(&m, &pools(), &networks()), Err(Error::Unavailable(_))));
        let mut m = machine();
        m.nics[0].network = "down".into();
        assert!(matches!(validate(&m, &pools(), &networks()), Err(Error::Unavailable(_))));
    }
}
