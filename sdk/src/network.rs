//! Static addressing as guests read it: cloud-init's network configuration (version 2,
//! the netplan shape cloud-init reads from a NoCloud seed's `network-config` and from the
//! VMware datasource's `network` metadata), and the MAC addresses it matches NICs by.

use serde_json::{json, Map, Value};

use crate::provider::Nic;

/// A MAC for the `index`-th NIC of machine `uid` under `prefix` (the backend's vendor
/// prefix), the same on every call so a configuration written before the NIC exists can
/// match it. `mask` limits the fourth byte (VMware's manual range is `00:50:56:00-3f`).
pub fn stable_mac(prefix: [u8; 3], mask: u8, uid: &str, index: usize) -> String {
    // FNV-1a over the UID and the index: stable across builds and hosts.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in uid.bytes().chain((index as u32).to_be_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let b = h.to_be_bytes();
    format!("{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", prefix[0], prefix[1], prefix[2], b[0] & mask, b[1], b[2])
}

/// Whether any NIC has static addresses (else the guest keeps its default: DHCP).
pub fn any_static(nics: &[Nic]) -> bool {
    nics.iter().any(|n| n.ip.is_some())
}

/// cloud-init network configuration version 2 for `nics`, each matched by the MAC
/// `mac(index)` gives: static addresses where declared, DHCP (v4) elsewhere. JSON, which
/// cloud-init reads as the YAML it is a subset of.
pub fn config_v2(nics: &[Nic], mac: impl Fn(usize) -> String) -> Value {
    let mut ethernets = Map::new();
    for (i, nic) in nics.iter().enumerate() {
        let mut eth = Map::new();
        eth.insert("match".into(), json!({ "macaddress": mac(i) }));
        // Linux names an interface with at most 15 bytes; a longer NIC name keeps the
        // guest's own.
        if nic.name.len() <= 15 {
            eth.insert("set-name".into(), json!(nic.name));
        }
        match &nic.ip {
            None => {
                eth.insert("dhcp4".into(), json!(true));
            }
            Some(ip) => {
                eth.insert("dhcp4".into(), json!(false));
                eth.insert("addresses".into(), json!(ip.addresses));
                if let Some(g) = &ip.gateway {
                    // `routes` rather than `gateway4`/`gateway6`, which netplan deprecates.
                    let to = if g.contains(':') { "::/0" } else { "0.0.0.0/0" };
                    eth.insert("routes".into(), json!([{ "to": to, "via": g }]));
                }
                if !ip.nameservers.is_empty() || !ip.search_domains.is_empty() {
                    eth.insert("nameservers".into(), json!({ "addresses": ip.nameservers, "search": ip.search_domains }));
                }
            }
        }
        ethernets.insert(nic.name.clone(), Value::Object(eth));
    }
    json!({ "version": 2, "ethernets": ethernets })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::IpConfig;

    fn nic(name: &str, ip: Option<IpConfig>) -> Nic {
        Nic { name: name.into(), network: "lan".into(), ip }
    }

    #[test]
    fn macs_are_stable_per_machine_and_nic_and_keep_the_prefix() {
        let a = stable_mac([0x52, 0x54, 0x00], 0xff, "uid-1", 0);
        assert_eq!(a, stable_mac([0x52, 0x54, 0x00], 0xff, "uid-1", 0));
        assert_ne!(a, stable_mac([0x52, 0x54, 0x00], 0xff, "uid-1", 1));
        assert_ne!(a, stable_mac([0x52, 0x54, 0x00], 0xff, "uid-2", 0));
        assert!(a.starts_with("52:54:00:"), "{a}");
        for i in 0..64 {
            let vmware = stable_mac([0x00, 0x50, 0x56], 0x3f, "uid-1", i);
            let fourth = u8::from_str_radix(&vmware[9..11], 16).unwrap();
            assert!(vmware.starts_with("00:50:56:") && fourth <= 0x3f, "{vmware}");
        }
    }

    #[test]
    fn static_nics_get_their_addresses_and_the_others_dhcp() {
        let nics = [
            nic(
                "eth0",
                Some(IpConfig {
                    addresses: vec!["10.0.0.5/24".into()],
                    gateway: Some("10.0.0.1".into()),
                    nameservers: vec!["10.0.0.2".into()],
                    search_domains: vec!["lab.example".into()],
                }),
            ),
            nic("eth1", None),
        ];
        let config = config_v2(&nics, |i| format!("52:54:00:00:00:0{i}"));
        assert_eq!(
            config,
            json!({"version": 2, "ethernets": {
                "eth0": {"match": {"macaddress": "52:54:00:00:00:00"}, "set-name": "eth0", "dhcp4": false,
                         "addresses": ["10.0.0.5/24"], "routes": [{"to": "0.0.0.0/0", "via": "10.0.0.1"}],
                         "nameservers": {"addresses": ["10.0.0.2"], "search": ["lab.example"]}},
                "eth1": {"match": {"macaddress": "52:54:00:00:00:01"}, "set-name": "eth1", "dhcp4": true}
            }})
        );
        assert!(any_static(&nics));
        assert!(!any_static(&nics[1..]));
    }
}
