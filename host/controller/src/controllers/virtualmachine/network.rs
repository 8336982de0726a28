//! A VM's declared addressing (`spec.network`): checked against its class and its
//! namespace before anything is made, merged into the Machine's NICs, and compared with
//! what the backend reports (`AddressesReady`).

use std::collections::BTreeMap;
use std::net::IpAddr;

use banlieue_api::common::{AddressType, Cidr, MachineAddress, StaticIp};
use banlieue_api::infra::ResolvedNic;
use banlieue_api::{VMClass, VirtualMachine};
use kube::ResourceExt;

use super::ipam::Allocated;
use crate::status::reasons::Reason;

/// Check `vm`'s `spec.network` against its class: every entry names one of the class's
/// NICs, once; addresses are CIDRs, the gateway an IP inside one of them, nameservers IPs
/// (a NIC with pools may have no address of its own). The error names the field and what to do.
pub fn check(vm: &VirtualMachine, class: &VMClass) -> Result<(), String> {
    let Some(network) = &vm.spec.network else { return Ok(()) };
    let nics: Vec<&str> = class.spec.nics.iter().map(|n| n.name.as_str()).collect();
    for (i, iface) in network.interfaces.iter().enumerate() {
        let field = format!("spec.network.interfaces[{i}]");
        if !nics.contains(&iface.name.as_str()) {
            return Err(format!(
                "{field}.name: VMClass {:?} has no NIC {:?} (its NICs: {}): name one of them",
                class.name_any(),
                iface.name,
                if nics.is_empty() { "none".to_string() } else { nics.join(", ") }
            ));
        }
        if network.interfaces[..i].iter().any(|o| o.name == iface.name) {
            return Err(format!("{field}.name: NIC {:?} is addressed twice: merge the entries", iface.name));
        }
        iface.ip.check_with_pools(&field, !iface.addresses_from_pools.is_empty())?;
    }
    Ok(())
}

/// Each addressed NIC's addressing: what the VM declares, with what its pools allocated
/// (`allocated`) after the declared addresses, the first pool's gateway unless one is
/// declared — checked whole (a declared gateway outside every allocated network is caught here).
pub fn addressing(vm: &VirtualMachine, allocated: &[Allocated]) -> Result<BTreeMap<String, StaticIp>, String> {
    let mut out = BTreeMap::new();
    for (i, iface) in vm.spec.network.iter().flat_map(|n| n.interfaces.iter().enumerate()) {
        let mut ip = iface.ip.clone();
        for a in allocated.iter().filter(|a| a.nic == iface.name) {
            ip.addresses.push(a.address.clone());
            if ip.gateway.is_none() {
                ip.gateway = a.gateway.clone();
            }
        }
        ip.check(&format!("spec.network.interfaces[{i}]"))?;
        out.insert(iface.name.clone(), ip);
    }
    Ok(out)
}

/// The static IPs `vm` declares.
pub fn declared(vm: &VirtualMachine) -> Vec<IpAddr> {
    vm.spec
        .network
        .iter()
        .flat_map(|n| &n.interfaces)
        .flat_map(|i| &i.ip.addresses)
        .filter_map(|a| Cidr::parse(a))
        .map(|c| c.ip)
        .collect()
}

/// A VM of the namespace ahead of `vm` that declares one of its static IPs: the IP and that
/// VM. (Two VMs on one address would each break the other's connections.) A VM that has
/// its Machine is ahead of one that has none, so a VM running with its address is never the
/// one refused; then the older, then the name.
pub fn conflict<'a>(vm: &VirtualMachine, others: impl IntoIterator<Item = &'a VirtualMachine>) -> Option<(IpAddr, String)> {
    let mine = declared(vm);
    if mine.is_empty() {
        return None;
    }
    let ns = vm.namespace();
    let age = |v: &VirtualMachine| {
        let made = v.status.as_ref().is_some_and(|s| s.infrastructure_ref.is_some());
        (!made, v.metadata.creation_timestamp.as_ref().map(|t| t.0), v.name_any())
    };
    others
        .into_iter()
        .filter(|o| o.namespace() == ns && age(o) < age(vm) && o.metadata.deletion_timestamp.is_none() && !invalid(o))
        .find_map(|o| declared(o).into_iter().find(|ip| mine.contains(ip)).map(|ip| (ip, o.name_any())))
}

/// Whether `vm`'s declaration was refused as invalid: it holds no address.
fn invalid(vm: &VirtualMachine) -> bool {
    vm.status.as_ref().is_some_and(|s| {
        s.conditions.iter().any(|c| c.type_ == crate::status::conditions::ADDRESSES_READY && c.status == "False" && c.reason == Reason::InvalidNetwork.as_str())
    })
}

/// The class's NICs with the VM's addressing (see [`addressing`]; a NIC not named takes DHCP).
pub fn addressed(mut nics: Vec<ResolvedNic>, addressing: &BTreeMap<String, StaticIp>) -> Vec<ResolvedNic> {
    for nic in &mut nics {
        if let Some(ip) = addressing.get(&nic.name) {
            nic.ip = ip.clone();
        }
    }
    nics
}

/// The static IPs of a Machine's NICs (declared or from pools).
pub fn machine_declared(nics: &[ResolvedNic]) -> Vec<IpAddr> {
    nics.iter().flat_map(|n| &n.ip.addresses).filter_map(|a| Cidr::parse(a)).map(|c| c.ip).collect()
}

/// The VM's addresses: what the backend reports, after the `declared` ones (the Machine's
/// static IPs) it has not reported yet (a script can read them before the guest is up);
/// and, when some are missing, which (for `AddressesReady=False`). Without declared
/// addresses, the VM waits for the backend to report any.
pub fn merge(declared: &[IpAddr], reported: &[MachineAddress]) -> (Vec<MachineAddress>, Result<(), String>) {
    let is_reported = |ip: &IpAddr| reported.iter().any(|a| a.address.parse::<IpAddr>().ok().as_ref() == Some(ip));
    let missing: Vec<String> = declared.iter().filter(|ip| !is_reported(ip)).map(IpAddr::to_string).collect();
    let mut all: Vec<MachineAddress> = missing.iter().map(|ip| MachineAddress { type_: AddressType::InternalIP, address: ip.clone() }).collect();
    all.extend(reported.iter().cloned());
    let ready = if !missing.is_empty() {
        Err(format!("the guest has not reported {} yet", missing.join(", ")))
    } else if reported.is_empty() {
        Err("the backend reports no address yet".to_string())
    } else {
        Ok(())
    };
    (all, ready)
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::class::{NicSpec, VMClassSpec};
    use banlieue_api::common::StaticIp;
    use banlieue_api::vm::{InterfaceAddressing, VirtualMachineSpec, VmNetwork};

    fn class(nics: &[&str]) -> VMClass {
        VMClass::new("small", VMClassSpec { nics: nics.iter().map(|n| NicSpec { name: n.to_string(), network_class: "lan".into() }).collect(), ..Default::default() })
    }

    fn vm(name: &str, ifaces: Vec<(&str, StaticIp)>) -> VirtualMachine {
        let mut vm = VirtualMachine::new(name, VirtualMachineSpec::default());
        vm.metadata.namespace = Some("ns".into());
        vm.spec.network = Some(VmNetwork { interfaces: ifaces.into_iter().map(|(n, ip)| InterfaceAddressing { name: n.into(), ip, addresses_from_pools: vec![] }).collect() });
        vm
    }

    fn ip(addresses: &[&str], gateway: Option<&str>) -> StaticIp {
        StaticIp { addresses: addresses.iter().map(|a| a.to_string()).collect(), gateway: gateway.map(str::to_string), ..Default::default() }
    }

    #[test]
    fn each_mistake_names_its_field() {
        let c = class(&["eth0", "eth1"]);
        assert_eq!(check(&vm("a", vec![("eth0", ip(&["10.0.0.5/24"], Some("10.0.0.1")))]), &c), Ok(()));
        let cases = [
            (vm("a", vec![("eth9", ip(&["10.0.0.5/24"], None))]), "spec.network.interfaces[0].name: VMClass \"small\" has no NIC \"eth9\" (its NICs: eth0, eth1)"),
            (vm("a", vec![("eth0", ip(&["10.0.0.5"], None))]), "spec.network.interfaces[0].addresses[0]: \"10.0.0.5\" is not an address with its prefix length"),
            (vm("a", vec![("eth0", ip(&["10.0.0.5/24"], Some("10.0.1.1")))]), "spec.network.interfaces[0].gateway: 10.0.1.1 is outside the interface's networks (10.0.0.5/24)"),
            (vm("a", vec![("eth0", ip(&["10.0.0.5/24"], None)), ("eth0", ip(&["10.0.0.6/24"], None))]), "spec.network.interfaces[1].name: NIC \"eth0\" is addressed twice"),
            (vm("a", vec![("eth1", ip(&[], Some("10.0.0.1")))]), "spec.network.interfaces[0].addresses: name at least one address"),
        ];
        for (v, want) in cases {
            let got = check(&v, &c).unwrap_err();
            assert!(got.starts_with(want), "{got}\n  does not start with\n{want}");
        }
    }

    #[test]
    fn a_static_address_another_vm_declares_is_a_conflict() {
        let a = vm("a", vec![("eth0", ip(&["10.0.0.5/24"], None))]);
        let b = vm("b", vec![("eth0", ip(&["10.0.0.5/16"], None))]);
        let c = vm("c", vec![("eth0", ip(&["10.0.0.6/24"], None))]);
        assert_eq!(conflict(&b, [&b, &c]), None, "itself and other addresses are no conflict");
        assert_eq!(conflict(&b, [&c, &a]), Some(("10.0.0.5".parse().unwrap(), "a".into())), "the older VM keeps the address");
        assert_eq!(conflict(&a, [&b]), None, "the younger one is refused, not the older");
        let mut running = b.clone();
        running.status = Some(banlieue_api::vm::VirtualMachineStatus {
            infrastructure_ref: Some(Default::default()),
            ..Default::default()
        });
        assert_eq!(conflict(&a, [&running]).map(|c| c.1), Some("b".into()), "a VM with its Machine keeps its address");
        let mut refused = a.clone();
        let mut status = banlieue_api::vm::VirtualMachineStatus::default();
        crate::status::conditions::set(&mut status.conditions, crate::status::conditions::ADDRESSES_READY, false, Reason::InvalidNetwork, "bad gateway", None);
        refused.status = Some(status);
        assert_eq!(conflict(&b, [&refused]), None, "an invalid declaration holds no address");
        let mut elsewhere = a.clone();
        elsewhere.metadata.namespace = Some("other".into());
        assert_eq!(conflict(&b, [&elsewhere]), None, "another namespace is another network");
    }

    #[test]
    fn declared_addresses_show_until_reported_and_dhcp_waits_for_any() {
        let a: Vec<IpAddr> = vec!["10.0.0.5".parse().unwrap()];
        let other = MachineAddress { type_: AddressType::InternalIP, address: "192.168.1.9".into() };
        let (all, ready) = merge(&a, std::slice::from_ref(&other));
        assert_eq!(all.iter().map(|a| a.address.as_str()).collect::<Vec<_>>(), ["10.0.0.5", "192.168.1.9"]);
        assert_eq!(ready, Err("the guest has not reported 10.0.0.5 yet".into()));
        let mine = MachineAddress { type_: AddressType::InternalIP, address: "10.0.0.5".into() };
        let (all, ready) = merge(&a, std::slice::from_ref(&mine));
        assert_eq!(all, [mine]);
        assert_eq!(ready, Ok(()));
        assert_eq!(merge(&[], &[]).1, Err("the backend reports no address yet".into()));
        assert_eq!(merge(&[], &[other]).1, Ok(()));
    }

    #[test]
    fn pool_addresses_join_the_declared_ones_and_are_checked_whole() {
        let pooled = |ip: StaticIp| {
            let mut v = vm("a", vec![("eth0", ip)]);
            v.spec.network.as_mut().unwrap().interfaces[0].addresses_from_pools =
                vec![banlieue_api::vm::PoolRef { api_group: "ipam.cluster.x-k8s.io".into(), kind: "InClusterIPPool".into(), name: "lan".into() }];
            v
        };
        let c = class(&["eth0"]);
        let only_pool = pooled(StaticIp { nameservers: vec!["10.9.0.2".into()], ..Default::default() });
        assert_eq!(check(&only_pool, &c), Ok(()), "a NIC with a pool needs no address of its own");
        let given = [Allocated { nic: "eth0".into(), address: "10.9.0.7/24".into(), gateway: Some("10.9.0.1".into()) }];
        let got = addressing(&only_pool, &given).unwrap();
        assert_eq!(got["eth0"], StaticIp { addresses: vec!["10.9.0.7/24".into()], gateway: Some("10.9.0.1".into()), nameservers: vec!["10.9.0.2".into()], ..Default::default() });
        let both = pooled(ip(&["192.168.5.5/24"], Some("192.168.5.1")));
        assert_eq!(addressing(&both, &given).unwrap()["eth0"].addresses, ["192.168.5.5/24", "10.9.0.7/24"]);
        assert_eq!(addressing(&both, &given).unwrap()["eth0"].gateway.as_deref(), Some("192.168.5.1"), "a declared gateway wins");
        let stray = pooled(ip(&[], Some("172.16.0.1")));
        assert_eq!(check(&stray, &c), Ok(()), "the gateway is checked once the pool has answered");
        assert!(addressing(&stray, &given).unwrap_err().starts_with("spec.network.interfaces[0].gateway: 172.16.0.1 is outside"));
        let nics = vec![ResolvedNic { name: "eth0".into(), ..Default::default() }, ResolvedNic { name: "eth1".into(), ..Default::default() }];
        let nics = addressed(nics, &got);
        assert_eq!(machine_declared(&nics), ["10.9.0.7".parse::<IpAddr>().unwrap()]);
        assert!(nics[1].ip.is_empty(), "a NIC not named takes DHCP");
    }
}
