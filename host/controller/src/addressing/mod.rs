//! A machine's declared addressing — `network.interfaces[]` of a VirtualMachine, or of a
//! `<Kind>Machine` CAPI makes from a template: fixed addresses and IP pools per NIC of the
//! class — checked against the class before anything is made, completed with what the
//! pools allocated ([`ipam`]), and written into the Machine's NICs.

pub mod ipam;

use std::collections::BTreeMap;
use std::net::IpAddr;

use banlieue_api::common::{Cidr, StaticIp};
use banlieue_api::infra::ResolvedNic;
use banlieue_api::vm::VmNetwork;
use banlieue_api::VMClass;
use kube::ResourceExt;

use self::ipam::Allocated;

/// Check `network` (at `spec.network`) against the class: every entry names one of the
/// class's NICs, once; addresses are CIDRs, the gateway an IP inside one of them,
/// nameservers IPs (a NIC with pools may have no address of its own). The error names the
/// field and what to do.
pub fn check(network: Option<&VmNetwork>, class: &VMClass) -> Result<(), String> {
    let Some(network) = network else { return Ok(()) };
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

/// Each addressed NIC's addressing: what `network` declares, with what its pools allocated
/// (`allocated`) after the declared addresses, the first pool's gateway unless one is
/// declared — checked whole (a declared gateway outside every allocated network is caught here).
pub fn resolve(network: Option<&VmNetwork>, allocated: &[Allocated]) -> Result<BTreeMap<String, StaticIp>, String> {
    let mut out = BTreeMap::new();
    for (i, iface) in network.iter().flat_map(|n| n.interfaces.iter().enumerate()) {
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

/// The class's NICs with their addressing (see [`resolve`]; a NIC not named takes DHCP).
pub fn addressed(mut nics: Vec<ResolvedNic>, addressing: &BTreeMap<String, StaticIp>) -> Vec<ResolvedNic> {
    for nic in &mut nics {
        if let Some(ip) = addressing.get(&nic.name) {
            nic.ip = ip.clone();
        }
    }
    nics
}

/// The static IPs of a Machine's NICs (declared or from pools).
pub fn static_ips(nics: &[ResolvedNic]) -> Vec<IpAddr> {
    nics.iter().flat_map(|n| &n.ip.addresses).filter_map(|a| Cidr::parse(a)).map(|c| c.ip).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::class::{NicSpec, VMClassSpec};
    use banlieue_api::vm::{InterfaceAddressing, PoolRef};

    fn class(nics: &[&str]) -> VMClass {
        VMClass::new("small", VMClassSpec { nics: nics.iter().map(|n| NicSpec { name: n.to_string(), network_class: "lan".into() }).collect(), ..Default::default() })
    }

    fn network(ifaces: Vec<(&str, StaticIp)>) -> VmNetwork {
        VmNetwork { interfaces: ifaces.into_iter().map(|(n, ip)| InterfaceAddressing { name: n.into(), ip, addresses_from_pools: vec![] }).collect() }
    }

    fn ip(addresses: &[&str], gateway: Option<&str>) -> StaticIp {
        StaticIp { addresses: addresses.iter().map(|a| a.to_string()).collect(), gateway: gateway.map(str::to_string), ..Default::default() }
    }

    #[test]
    fn each_mistake_names_its_field() {
        let c = class(&["eth0", "eth1"]);
        assert_eq!(check(Some(&network(vec![("eth0", ip(&["10.0.0.5/24"], Some("10.0.0.1")))])), &c), Ok(()));
        assert_eq!(check(None, &c), Ok(()), "no network: every NIC takes DHCP");
        let cases = [
            (network(vec![("eth9", ip(&["10.0.0.5/24"], None))]), "spec.network.interfaces[0].name: VMClass \"small\" has no NIC \"eth9\" (its NICs: eth0, eth1)"),
            (network(vec![("eth0", ip(&["10.0.0.5"], None))]), "spec.network.interfaces[0].addresses[0]: \"10.0.0.5\" is not an address with its prefix length"),
            (network(vec![("eth0", ip(&["10.0.0.5/24"], Some("10.0.1.1")))]), "spec.network.interfaces[0].gateway: 10.0.1.1 is outside the interface's networks (10.0.0.5/24)"),
            (network(vec![("eth0", ip(&["10.0.0.5/24"], None)), ("eth0", ip(&["10.0.0.6/24"], None))]), "spec.network.interfaces[1].name: NIC \"eth0\" is addressed twice"),
            (network(vec![("eth1", ip(&[], Some("10.0.0.1")))]), "spec.network.interfaces[0].addresses: name at least one address"),
        ];
        for (n, want) in cases {
            let got = check(Some(&n), &c).unwrap_err();
            assert!(got.starts_with(want), "{got}\n  does not start with\n{want}");
        }
    }

    #[test]
    fn pool_addresses_join_the_declared_ones_and_are_checked_whole() {
        let pooled = |ip: StaticIp| {
            let mut n = network(vec![("eth0", ip)]);
            n.interfaces[0].addresses_from_pools = vec![PoolRef { api_group: "ipam.cluster.x-k8s.io".into(), kind: "InClusterIPPool".into(), name: "lan".into() }];
            n
        };
        let c = class(&["eth0"]);
        let only_pool = pooled(StaticIp { nameservers: vec!["10.9.0.2".into()], ..Default::default() });
        assert_eq!(check(Some(&only_pool), &c), Ok(()), "a NIC with a pool needs no address of its own");
        let given = [Allocated { nic: "eth0".into(), address: "10.9.0.7/24".into(), gateway: Some("10.9.0.1".into()) }];
        let got = resolve(Some(&only_pool), &given).unwrap();
        assert_eq!(got["eth0"], StaticIp { addresses: vec!["10.9.0.7/24".into()], gateway: Some("10.9.0.1".into()), nameservers: vec!["10.9.0.2".into()], ..Default::default() });
        let both = pooled(ip(&["192.168.5.5/24"], Some("192.168.5.1")));
        assert_eq!(resolve(Some(&both), &given).unwrap()["eth0"].addresses, ["192.168.5.5/24", "10.9.0.7/24"]);
        assert_eq!(resolve(Some(&both), &given).unwrap()["eth0"].gateway.as_deref(), Some("192.168.5.1"), "a declared gateway wins");
        let stray = pooled(ip(&[], Some("172.16.0.1")));
        assert_eq!(check(Some(&stray), &c), Ok(()), "the gateway is checked once the pool has answered");
        assert!(resolve(Some(&stray), &given).unwrap_err().starts_with("spec.network.interfaces[0].gateway: 172.16.0.1 is outside"));
        let nics = vec![ResolvedNic { name: "eth0".into(), ..Default::default() }, ResolvedNic { name: "eth1".into(), ..Default::default() }];
        let nics = addressed(nics, &got);
        assert_eq!(static_ips(&nics), ["10.9.0.7".parse::<IpAddr>().unwrap()]);
        assert!(nics[1].ip.is_empty(), "a NIC not named takes DHCP");
    }
}
