//! The records a libvirt call returns; they mirror `banlieue:host/libvirt` in `wit/host/libvirt.wit`.

/// libvirt's `virDomainState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DomainState {
    NoState,
    Running,
    Blocked,
    Paused,
    Shutdown,
    Shutoff,
    Crashed,
    PmSuspended,
}

impl DomainState {
    /// Map a raw `virDomainState`; values newer than this crate read as `NoState`.
    pub(crate) fn from_raw(state: virt::sys::virDomainState) -> Self {
        use virt::sys;
        match state {
            sys::VIR_DOMAIN_RUNNING => DomainState::Running,
            sys::VIR_DOMAIN_BLOCKED => DomainState::Blocked,
            sys::VIR_DOMAIN_PAUSED => DomainState::Paused,
            sys::VIR_DOMAIN_SHUTDOWN => DomainState::Shutdown,
            sys::VIR_DOMAIN_SHUTOFF => DomainState::Shutoff,
            sys::VIR_DOMAIN_CRASHED => DomainState::Crashed,
            sys::VIR_DOMAIN_PMSUSPENDED => DomainState::PmSuspended,
            _ => DomainState::NoState,
        }
    }
}

/// A domain (VM) as libvirt knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainInfo {
    pub name: String,
    pub uuid: String,
    pub state: DomainState,
    pub vcpus: u32,
    /// The domain's configured (maximum) memory.
    pub memory_kib: u64,
}

/// A storage volume inside a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeInfo {
    pub name: String,
    /// libvirt's unique key for the volume (often the same as `path`).
    pub key: String,
    pub path: String,
    pub capacity_bytes: u64,
    pub allocation_bytes: u64,
}

/// A storage pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolInfo {
    pub name: String,
    pub active: bool,
    pub capacity_bytes: u64,
    pub available_bytes: u64,
}

/// A virtual network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkInfo {
    pub name: String,
    pub active: bool,
    /// The host bridge, when the network has one.
    pub bridge: Option<String>,
}

/// The hypervisor host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    pub hostname: String,
    /// CPU model, e.g. `x86_64`.
    pub model: String,
    pub cpus: u32,
    /// Expected CPU frequency; 0 when unknown.
    pub mhz: u32,
    pub memory_kib: u64,
}

/// Where [`Libvirt::domain_addresses`](crate::Libvirt::domain_addresses) looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressSource {
    /// The DHCP leases of the libvirt networks the domain's interfaces are on.
    Lease,
    /// The QEMU guest agent running inside the domain.
    Agent,
}

/// One guest interface with its IP addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceAddresses {
    pub name: String,
    /// MAC address, lower case.
    pub mac: String,
    pub addresses: Vec<IpAddress>,
}

/// One IP address of a guest interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpAddress {
    pub address: String,
    pub prefix: u8,
    pub ipv6: bool,
}

/// A domain snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    pub name: String,
    /// Whether the domain's present state descends from it.
    pub current: bool,
    /// libvirt's `<domainsnapshot>` description.
    pub xml: String,
}
