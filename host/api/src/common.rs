//! Small shared shapes used by several kinds.

use std::net::IpAddr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A reference to an object by name (same namespace, or cluster-scoped).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct NameRef {
    /// Name of the referenced object.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

impl NameRef {
    /// Whether it names nothing (an optional reference left out).
    pub fn is_unset(&self) -> bool {
        self.name.is_empty()
    }
}

/// For an optional reference kept as an empty [`NameRef`]: the schema has no `default` (an
/// empty name would not pass the reference's own validation).
pub fn no_default(schema: &mut schemars::Schema) {
    schema.remove("default");
}

/// A key in a Secret in the referring object's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct SecretKeyRef {
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key inside the Secret's data.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// Where a Wasm component comes from and how it is trusted (ProviderClass, PlacementPolicy).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComponentSource {
    /// `oci://REGISTRY/REPO:TAG`, `oci://REGISTRY/REPO@sha256:…`, `file:///path.wasm`
    /// (development), or `builtin:NAME` for a component compiled into banlieue.
    #[schemars(regex(pattern = r"^(oci://[^\s]+|file:///[^\s]*|builtin:[a-z0-9-]+)$"))]
    pub source: String,
    /// How the component is verified before a byte of it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification: Option<Verification>,
    /// Docker-config Secret (namespace/name) holding registry credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_secret_ref: Option<NamespacedRef>,
    /// CPU and memory budget of one call into the component.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<ComponentLimits>,
}

/// Signature verification of a component.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Verification {
    /// PEM public keys (cosign format); a signature by any one of them is accepted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub public_keys: Vec<String>,
    /// Run the component without a signature. Only for development.
    #[serde(default)]
    pub allow_unsigned: bool,
}

/// A namespaced object reference.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct NamespacedRef {
    /// Namespace of the object.
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    /// Name of the object.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Per-call budget of a component.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComponentLimits {
    /// CPU time one call may spend running guest code, in milliseconds (default 1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 600000))]
    pub cpu_millis: Option<u32>,
    /// Linear memory of one instance, in MiB (default 64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4096))]
    pub memory_mib: Option<u32>,
}

/// A network address as CAPI reports it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct MachineAddress {
    /// Hostname, ExternalIP, InternalIP, ExternalDNS or InternalDNS.
    #[serde(rename = "type")]
    pub type_: AddressType,
    /// The address.
    pub address: String,
}

/// Kinds of machine address (CAPI `MachineAddressType`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum AddressType {
    Hostname,
    ExternalIP,
    InternalIP,
    ExternalDNS,
    InternalDNS,
}

/// Power states a VM can be asked for or observed in.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PowerState {
    #[default]
    PoweredOn,
    PoweredOff,
    Suspended,
}

/// How a VM is powered off (when asked to power off, restart, or be deleted).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PowerOffMode {
    /// Cut the power at once.
    Hard,
    /// Ask the guest to shut down; never force it (retried until the guest is off).
    Soft,
    /// Ask the guest, then cut the power when the class's timeout passes.
    #[default]
    TrySoft,
}

/// Where a machine is on its way to running, as its driver reports it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum MachinePhase {
    Provisioning,
    Cloning,
    Configuring,
    PoweringOn,
    WaitingForAddress,
    Running,
    ShuttingDown,
    PoweredOff,
}

/// CAPI v1beta2 `initialization` status block.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct Initialization {
    /// True once the infrastructure is provisioned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioned: Option<bool>,
}

/// Static addressing of one NIC (instead of DHCP), as the guest is told at first boot.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StaticIp {
    /// Addresses with their prefix length (CIDR): `10.0.0.5/24`, `2001:db8::5/64`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub addresses: Vec<String>,
    /// The default gateway, inside one of `addresses`' networks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// DNS servers (IP addresses).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub nameservers: Vec<String>,
    /// DNS search domains.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub search_domains: Vec<String>,
}

impl StaticIp {
    /// Whether anything is declared (nothing: the NIC takes DHCP).
    pub fn is_empty(&self) -> bool {
        self == &StaticIp::default()
    }

    /// Check the addressing of the NIC at `field` (e.g. `spec.network.interfaces[0]`):
    /// addresses are CIDRs, the gateway an IP inside one of them, nameservers IPs. The
    /// error names the field and what to do.
    pub fn check(&self, field: &str) -> Result<(), String> {
        self.check_with_pools(field, false)
    }

    /// [`StaticIp::check`] of a NIC that may also take addresses from pools: with
    /// `from_pools`, `addresses` may be empty, and a gateway outside them is left to the
    /// check of what the pools allocate.
    pub fn check_with_pools(&self, field: &str, from_pools: bool) -> Result<(), String> {
        let ip = self;
        if ip.addresses.is_empty() && !from_pools {
            return Err(format!("{field}.addresses: name at least one address (or leave the NIC out: it takes DHCP)"));
        }
        let mut cidrs = Vec::new();
        for (j, a) in ip.addresses.iter().enumerate() {
            let cidr = Cidr::parse(a).ok_or_else(|| format!("{field}.addresses[{j}]: {a:?} is not an address with its prefix length (e.g. 10.0.0.5/24)"))?;
            if cidrs.iter().any(|c: &Cidr| c.ip == cidr.ip) {
                return Err(format!("{field}.addresses[{j}]: {} is listed twice", cidr.ip));
            }
            cidrs.push(cidr);
        }
        if let Some(g) = &ip.gateway {
            let gw: IpAddr = g.parse().map_err(|_| format!("{field}.gateway: {g:?} is not an IP address"))?;
            if !from_pools && !cidrs.iter().any(|c| c.contains(gw)) {
                return Err(format!(
                    "{field}.gateway: {gw} is outside the interface's networks ({}): use a gateway inside one of them",
                    ip.addresses.join(", ")
                ));
            }
        }
        for (j, n) in ip.nameservers.iter().enumerate() {
            n.parse::<IpAddr>().map_err(|_| format!("{field}.nameservers[{j}]: {n:?} is not an IP address"))?;
        }
        Ok(())
    }
}

/// An address with its prefix length (`10.0.0.5/24`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    pub ip: IpAddr,
    pub prefix: u8,
}

impl Cidr {
    pub fn parse(s: &str) -> Option<Cidr> {
        let (ip, prefix) = s.split_once('/')?;
        let ip: IpAddr = ip.parse().ok()?;
        let prefix: u8 = prefix.parse().ok()?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        (prefix <= max).then_some(Cidr { ip, prefix })
    }

    /// Whether `ip` is in this address's network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let mask = |bits: u32, width: u32| if bits == 0 { 0u128 } else { u128::MAX << (width - bits) };
        match (self.ip, ip) {
            (IpAddr::V4(a), IpAddr::V4(b)) => {
                let m = mask(u32::from(self.prefix), 32) as u32;
                u32::from(a) & m == u32::from(b) & m
            }
            (IpAddr::V6(a), IpAddr::V6(b)) => {
                let m = mask(u32::from(self.prefix), 128);
                u128::from(a) & m == u128::from(b) & m
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod addressing_tests {
    use super::*;

    #[test]
    fn cidrs_parse_and_contain_their_network() {
        let c = Cidr::parse("10.0.0.5/24").unwrap();
        assert!(c.contains("10.0.0.1".parse().unwrap()));
        assert!(!c.contains("10.0.1.1".parse().unwrap()));
        assert!(Cidr::parse("2001:db8::5/64").unwrap().contains("2001:db8::1".parse().unwrap()));
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains("192.0.2.1".parse().unwrap()));
        for bad in ["10.0.0.5", "10.0.0.5/33", "10.0.0/24", "x/24", "2001:db8::5/129"] {
            assert_eq!(Cidr::parse(bad), None, "{bad}");
        }
    }
}
