//! A VM's declared addressing (`spec.network`): checked against its class and its
//! namespace before anything is made, merged into the Machine's NICs, and compared with
//! what the backend reports (`AddressesReady`).

use std::net::IpAddr;

use banlieue_api::common::{AddressType, Cidr, MachineAddress};
use banlieue_api::infra::ResolvedNic;
use banlieue_api::{VMClass, VirtualMachine};
use kube::ResourceExt;

use crate::status::reasons::Reason;

/// Check `vm`'s `spec.network` against its class: every entry names one of the class's
/// NICs, once; addresses are CIDRs, the gateway an IP inside one of them, nameservers IPs.
/// The error names the field and what to do.
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
        iface.ip.check(&field)?;
    }
    Ok(())
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

/// The class's NICs with the VM's addressing (a NIC not named takes DHCP).
pub fn addressed(mut nics: Vec<ResolvedNic>, vm: &VirtualMachine) -> Vec<ResolvedNic> {
    for iface in vm.spec.network.iter().flat_map(|n| &n.interfaces) {
        if let Some(nic) = nics.iter_mut().find(|n| n.name == iface.name) {
            nic.ip = iface.ip.clone();
        }
    }
    nics
}

/// The VM's addresses: what the backend reports, after the declared ones it has not
/// reported yet (a script can read them before the guest is up); and, when some are
/// missing, which (for `AddressesReady=False`). Without declared addresses, the VM waits
/// for the backend to report any.
pub fn merge(vm: &VirtualMachine, reported: &[MachineAddress]) -> (Vec<MachineAddress>, Result<(), String>) {
    let declared = declared(vm);
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
        vm.spec.network = Some(VmNetwork { interfaces: ifaces.into_iter().map(|(n, ip)| InterfaceAddressing { name: n.into(), ip }).collect() });
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
        let a = vm("a", vec![("eth0", ip(&["10.0.0.5/24"], None))]);
        let other = MachineAddress { type_: AddressType::InternalIP, address: "192.168.1.9".into() };
        let (all, ready) = merge(&a, std::slice::from_ref(&other));
        assert_eq!(all.iter().map(|a| a.address.as_str()).collect::<Vec<_>>(), ["10.0.0.5", "192.168.1.9"]);
        assert_eq!(ready, Err("the guest has not reported 10.0.0.5 yet".into()));
        let mine = MachineAddress { type_: AddressType::InternalIP, address: "10.0.0.5".into() };
        let (all, ready) = merge(&a, std::slice::from_ref(&mine));
        assert_eq!(all, [mine]);
        assert_eq!(ready, Ok(()));
        let dhcp = VirtualMachine::new("d", VirtualMachineSpec::default());
        assert_eq!(merge(&dhcp, &[]).1, Err("the backend reports no address yet".into()));
        assert_eq!(merge(&dhcp, &[other]).1, Ok(()));
    }
}
