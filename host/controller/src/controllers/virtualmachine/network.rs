//! A VM's addresses among its namespace's and against what its backend reports: two VMs
//! never declare one static address (`AddressConflict`), and `AddressesReady` says when the
//! backend reports every address the VM's Machine was given. (Checking and resolving the
//! declaration is [`crate::addressing`]'s.)

use std::net::IpAddr;

use banlieue_api::common::{AddressType, Cidr, MachineAddress};
use banlieue_api::VirtualMachine;
use kube::ResourceExt;

use crate::status::reasons::Reason;

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
    use banlieue_api::common::StaticIp;
    use banlieue_api::vm::{InterfaceAddressing, VirtualMachineSpec, VmNetwork};

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
}
