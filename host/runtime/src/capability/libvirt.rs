//! `banlieue:host/libvirt`: a component drives only its Provider's libvirt URI.
//! The grant *is* the connection — there is no way to name another URI — so
//! [`HostState::libvirt`] (grant present or not) is the one choke point.

use banlieue_libvirt::{Libvirt, LibvirtError};

use super::bindings::banlieue::host::libvirt as wit;
use super::WitError;
use crate::state::HostState;

/// The libvirt connection a component may use.
#[derive(Clone)]
pub struct LibvirtGrant {
    pub conn: Libvirt,
}

impl std::fmt::Debug for LibvirtGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LibvirtGrant").field("uri", &self.conn.uri()).finish()
    }
}

pub(super) fn err(e: LibvirtError) -> WitError {
    match e {
        LibvirtError::NotFound(m) => WitError::NotFound(m),
        LibvirtError::Invalid(m) => WitError::InvalidSpec(m),
        LibvirtError::Unavailable(m) => WitError::Unavailable(m),
        LibvirtError::Denied(m) => WitError::Denied(m),
        LibvirtError::Internal(m) => WitError::Internal(m),
    }
}

fn state(s: banlieue_libvirt::DomainState) -> wit::DomainState {
    use banlieue_libvirt::DomainState as S;
    match s {
        S::NoState => wit::DomainState::NoState,
        S::Running => wit::DomainState::Running,
        S::Blocked => wit::DomainState::Blocked,
        S::Paused => wit::DomainState::Paused,
        S::Shutdown => wit::DomainState::Shutdown,
        S::Shutoff => wit::DomainState::Shutoff,
        S::Crashed => wit::DomainState::Crashed,
        S::PmSuspended => wit::DomainState::PmSuspended,
    }
}

fn domain(d: banlieue_libvirt::DomainInfo) -> wit::DomainInfo {
    wit::DomainInfo { name: d.name, uuid: d.uuid, state: state(d.state), vcpus: d.vcpus, memory_kib: d.memory_kib }
}

fn volume(v: banlieue_libvirt::VolumeInfo) -> wit::VolumeInfo {
    wit::VolumeInfo { name: v.name, path: v.path, capacity_bytes: v.capacity_bytes }
}

fn snapshot(s: banlieue_libvirt::SnapshotInfo) -> wit::SnapshotInfo {
    wit::SnapshotInfo { name: s.name, current: s.current, xml: s.xml }
}

impl HostState {
    pub(super) fn libvirt(&self) -> Result<Libvirt, WitError> {
        match &self.grants.libvirt {
            Some(g) => Ok(g.conn.clone()),
            None => Err(self.refusal(WitError::Denied("the libvirt capability is not granted to this component".into()))),
        }
    }
}

impl wit::Host for HostState {
    async fn domain_define(&mut self, xml: String) -> Result<wit::DomainInfo, WitError> {
        let conn = self.libvirt();
        let result = async { conn?.domain_define(xml).await.map(domain).map_err(err) }.await;
        self.observed(true, result).await
    }
    async fn domain_start(&mut self, name: String) -> Result<(), WitError> {
        let conn = self.libvirt();
        let result = async { conn?.domain_start(&name).await.map_err(err) }.await;
        self.observed(true, result).await
    }
    async fn domain_shutdown(&mut self, name: String) -> Result<(), WitError> {
        let conn = self.libvirt();
        let result = async { conn?.domain_shutdown(&name).await.map_err(err) }.await;
        self.observed(true, result).await
    }
    async fn domain_destroy(&mut self, name: String) -> Result<(), WitError> {
        let conn = self.libvirt();
        let result = async { conn?.domain_destroy(&name).await.map_err(err) }.await;
        self.observed(true, result).await
    }
    async fn domain_undefine(&mut self, name: String) -> Result<(), WitError> {
        let conn = self.libvirt();
        let result = async { conn?.domain_undefine(&name).await.map_err(err) }.await;
        self.observed(true, result).await
    }
    async fn domain_get(&mut self, name: String) -> Result<wit::DomainInfo, WitError> {
        let conn = self.libvirt();
        let result = async { conn?.domain_get(&name).await.map(domain).map_err(err) }.await;
        self.observed(false, result).await
    }
    async fn domain_get_state(&mut self, name: String) -> Result<wit::DomainState, WitError> {
        let conn = self.libvirt();
        let result = async { conn?.domain_state(&name).await.map(state).map_err(err) }.await;
        self.observed(false, result).await
    }
    async fn domain_xml(&mut self, name: String) -> Result<String, WitError> {
        let conn = self.libvirt();
        let result = async { conn?.domain_xml(&name).await.map_err(err) }.await;
        self.observed(false, result).await
    }
    async fn domain_set_metadata(&mut self, name: String, uri: String, key: String, xml: Option<String>) -> Result<(), WitError> {
        let conn = self.libvirt();
        let result = async { conn?.domain_set_metadata(&name, &uri, &key, xml).await.map_err(err) }.await;
        self.observed(true, result).await
    }
    async fn domain_list(&mut self) -> Result<Vec<wit::DomainInfo>, WitError> {
        let conn = self.libvirt();
        let result = async { conn?.domain_list().await.map(|v| v.into_iter().map(domain).collect()).map_err(err) }.await;
        self.observed(false, result).await
    }
    async fn domain_addresses(
        &mut self,
        name: String,
        source: wit::AddressSource,
    ) -> Result<Vec<wit::InterfaceAddresses>, WitError> {
        let source = match source {
            wit::AddressSource::Lease => banlieue_libvirt::AddressSource::Lease,
            wit::AddressSource::Agent => banlieue_libvirt::AddressSource::Agent,
        };
        let found = self.libvirt()?.domain_addresses(&name, source).await.map_err(err)?;
        Ok(found
            .into_iter()
            .map(|i| wit::InterfaceAddresses {
                name: i.name,
                mac: i.mac,
                addresses: i
                    .addresses
                    .into_iter()
                    .map(|a| wit::IpAddress { address: a.address, prefix: a.prefix, ipv6: a.ipv6 })
                    .collect(),
            })
            .collect())
    }
    async fn snapshot_create(&mut self, domain: String, xml: String) -> Result<wit::SnapshotInfo, WitError> {
        let conn = self.libvirt();
        let result = async { conn?.snapshot_create(&domain, xml).await.map(snapshot).map_err(err) }.await;
        self.observed(true, result).await
    }
    async fn snapshot_redefine(&mut self, domain: String, xml: String) -> Result<wit::SnapshotInfo, WitError> {
        let conn = self.libvirt();
        let result = async { conn?.snapshot_redefine(&domain, xml).await.map(snapshot).map_err(err) }.await;
        self.observed(true, result).await
    }
    async fn snapshot_list(&mut self, domain: String) -> Result<Vec<wit::SnapshotInfo>, WitError> {
        let conn = self.libvirt();
        let result = async { conn?.snapshot_list(&domain).await.map(|v| v.into_iter().map(snapshot).collect()).map_err(err) }.await;
        self.observed(false, result).await
    }
    async fn snapshot_revert(&mut self, domain: String, name: String) -> Result<(), WitError> {
        let conn = self.libvirt();
        let result = async { conn?.snapshot_revert(&domain, &name).await.map_err(err) }.await;
        self.observed(true, result).await
    }
    async fn snapshot_delete(&mut self, domain: String, name: String) -> Result<(), WitError> {
        let conn = self.libvirt();
        let result = async { conn?.snapshot_delete(&domain, &name).await.map_err(err) }.await;
        self.observed(true, result).await
    }
    async fn volume_create(&mut self, pool: String, xml: String) -> Result<wit::VolumeInfo, WitError> {
        let conn = self.libvirt();
        let result = async { conn?.volume_create(&pool, xml).await.map(volume).map_err(err) }.await;
        self.observed(true, result).await
    }
    async fn volume_clone(&mut self, pool: String, source: String, xml: String) -> Result<wit::VolumeInfo, WitError> {
        let conn = self.libvirt();
        let result = async { conn?.volume_clone(&pool, &source, xml).await.map(volume).map_err(err) }.await;
        self.observed(true, result).await
    }
    async fn volume_upload(&mut self, pool: String, name: String, bytes: Vec<u8>) -> Result<(), WitError> {
        let conn = self.libvirt();
        let result = async { conn?.volume_upload(&pool, &name, bytes).await.map_err(err) }.await;
        self.observed(true, result).await
    }
    async fn volume_delete(&mut self, pool: String, name: String) -> Result<(), WitError> {
        let conn = self.libvirt();
        let result = async { conn?.volume_delete(&pool, &name).await.map_err(err) }.await;
        self.observed(true, result).await
    }
    async fn volume_resize(&mut self, pool: String, name: String, capacity_bytes: u64) -> Result<(), WitError> {
        let conn = self.libvirt();
        let result = async { conn?.volume_resize(&pool, &name, capacity_bytes).await.map_err(err) }.await;
        self.observed(true, result).await
    }
    async fn volume_list(&mut self, pool: String) -> Result<Vec<wit::VolumeInfo>, WitError> {
        let conn = self.libvirt();
        let result = async { conn?.volume_list(&pool).await.map(|v| v.into_iter().map(volume).collect()).map_err(err) }.await;
        self.observed(false, result).await
    }
    async fn pool_list(&mut self) -> Result<Vec<wit::PoolInfo>, WitError> {
        let pools = self.libvirt()?.pool_list().await.map_err(err)?;
        Ok(pools
            .into_iter()
            .map(|p| wit::PoolInfo { name: p.name, active: p.active, capacity_bytes: p.capacity_bytes, available_bytes: p.available_bytes })
            .collect())
    }
    async fn network_list(&mut self) -> Result<Vec<wit::NetworkInfo>, WitError> {
        let nets = self.libvirt()?.network_list().await.map_err(err)?;
        Ok(nets.into_iter().map(|n| wit::NetworkInfo { name: n.name, active: n.active, bridge: n.bridge }).collect())
    }
    async fn node_info(&mut self) -> Result<wit::Node, WitError> {
        let n = self.libvirt()?.node_info().await.map_err(err)?;
        Ok(wit::Node { model: n.model, memory_kib: n.memory_kib, cpus: n.cpus, mhz: n.mhz })
    }
}
