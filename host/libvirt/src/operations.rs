//! The operations of `banlieue:host/libvirt`, one method each.

use virt::connect::Connect;
use virt::domain::Domain;
use virt::domain_snapshot::DomainSnapshot;
use virt::error::{Error as VirtError, ErrorNumber};
use virt::storage_pool::StoragePool;
use virt::storage_vol::StorageVol;
use virt::stream::Stream;
use virt::sys;

use crate::connection::{Libvirt, check_c_string};
use crate::error::Result;
use crate::types::{
    AddressSource, DomainInfo, DomainState, InterfaceAddresses, IpAddress, NetworkInfo, NodeInfo, PoolInfo, SnapshotInfo, VolumeInfo,
};

/// Upload chunk size: large enough to keep round trips few, small enough to bound one send.
const UPLOAD_CHUNK: usize = 256 * 1024;

impl Libvirt {
    /// Define (or redefine) a persistent domain from XML.
    pub async fn domain_define(&self, xml: String) -> Result<DomainInfo> {
        check_c_string("domain XML", &xml)?;
        self.run("domain-define", move |c| {
            domain_info(&Domain::define_xml(c, &xml)?)
        })
        .await
    }

    /// Start a defined domain.
    pub async fn domain_start(&self, name: &str) -> Result<()> {
        self.with_domain("domain-start", name, |d| d.create().map(drop))
            .await
    }

    /// Graceful shutdown (ACPI); returns before the guest is off.
    pub async fn domain_shutdown(&self, name: &str) -> Result<()> {
        self.with_domain("domain-shutdown", name, |d| d.shutdown().map(drop))
            .await
    }

    /// Hard power-off.
    pub async fn domain_destroy(&self, name: &str) -> Result<()> {
        self.with_domain("domain-destroy", name, |d| d.destroy())
            .await
    }

    /// Remove the definition, including NVRAM and managed save; the domain must be off.
    pub async fn domain_undefine(&self, name: &str) -> Result<()> {
        self.with_domain("domain-undefine", name, |d| {
            // Snapshot metadata goes too: internal snapshots live in the disks, which the
            // driver deletes next, and libvirt refuses to undefine a domain that has any.
            let snapshots = sys::VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA;
            let flags = sys::VIR_DOMAIN_UNDEFINE_NVRAM | sys::VIR_DOMAIN_UNDEFINE_MANAGED_SAVE | snapshots;
            match d.undefine_flags(flags) {
                // Drivers without NVRAM (e.g. `test:///`) refuse the flag; nothing to remove there.
                Err(e) if e.code() == ErrorNumber::InvalidArg => d.undefine_flags(snapshots),
                other => other,
            }
        })
        .await
    }

    /// One domain by name (a lookup, not a listing).
    pub async fn domain_get(&self, name: &str) -> Result<DomainInfo> {
        self.with_domain("domain-get", name, domain_info).await
    }

    /// The domain's current state.
    pub async fn domain_state(&self, name: &str) -> Result<DomainState> {
        self.with_domain("domain-get-state", name, |d| {
            d.get_state()
                .map(|(state, _reason)| DomainState::from_raw(state))
        })
        .await
    }

    /// The domain's XML, as libvirt would define it.
    pub async fn domain_xml(&self, name: &str) -> Result<String> {
        self.with_domain("domain-xml", name, |d| d.get_xml_desc(0))
            .await
    }

    /// Set (`Some`) or remove (`None`) the domain's `<metadata>` element of namespace `uri`,
    /// written with prefix `key`: in its persistent definition and, while it runs, in the live
    /// one too (a running domain's definition alone would show the change only after a restart).
    pub async fn domain_set_metadata(&self, name: &str, uri: &str, key: &str, xml: Option<String>) -> Result<()> {
        check_c_string("metadata namespace", uri)?;
        check_c_string("metadata key", key)?;
        if let Some(x) = &xml {
            check_c_string("metadata", x)?;
        }
        let (uri, key) = (uri.to_string(), key.to_string());
        self.with_domain("domain-set-metadata", name, move |d| {
            let live = if d.is_active()? { sys::VIR_DOMAIN_AFFECT_LIVE } else { 0 };
            let element = sys::VIR_DOMAIN_METADATA_ELEMENT as i32;
            d.set_metadata(element, xml.as_deref(), Some(&key), Some(&uri), sys::VIR_DOMAIN_AFFECT_CONFIG | live).map(drop)
        })
        .await
    }

    /// Every domain, running or only defined. A domain undefined between the listing and
    /// reading it is not in the list (it is gone), rather than failing the whole listing.
    pub async fn domain_list(&self) -> Result<Vec<DomainInfo>> {
        self.run("domain-list", |c| {
            let mut found = Vec::new();
            for d in c.list_all_domains(0)? {
                match domain_info(&d) {
                    Ok(info) => found.push(info),
                    Err(e) if e.code() == ErrorNumber::NoDomain => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(found)
        })
        .await
    }

    /// The domain's IP addresses per interface, from `source`.
    pub async fn domain_addresses(&self, name: &str, source: AddressSource) -> Result<Vec<InterfaceAddresses>> {
        let raw = match source {
            AddressSource::Lease => sys::VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE,
            AddressSource::Agent => sys::VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT,
        };
        self.with_domain("domain-addresses", name, move |d| {
            Ok(d.interface_addresses(raw, 0)?
                .into_iter()
                .map(|i| InterfaceAddresses {
                    name: i.name,
                    mac: i.hwaddr.to_ascii_lowercase(),
                    addresses: i
                        .addrs
                        .into_iter()
                        .map(|a| IpAddress {
                            address: a.addr,
                            prefix: u8::try_from(a.prefix).unwrap_or(u8::MAX),
                            ipv6: a.typed == i64::from(sys::VIR_IP_ADDR_TYPE_IPV6),
                        })
                        .collect(),
                })
                .collect())
        })
        .await
    }

    /// Take a snapshot of the domain from `<domainsnapshot>` XML (internal snapshots; a
    /// running domain's include its memory).
    pub async fn snapshot_create(&self, domain: &str, xml: String) -> Result<SnapshotInfo> {
        check_c_string("snapshot XML", &xml)?;
        self.with_domain("snapshot-create", domain, move |d| snapshot_info(&DomainSnapshot::create_xml(d, &xml, 0)?)).await
    }

    /// Record a snapshot's metadata on the domain without taking it (`<domainsnapshot>` as
    /// another domain's snapshot describes it): for disks copied with their internal
    /// snapshots, so the domain can be reverted to one.
    pub async fn snapshot_redefine(&self, domain: &str, xml: String) -> Result<SnapshotInfo> {
        check_c_string("snapshot XML", &xml)?;
        self.with_domain("snapshot-redefine", domain, move |d| snapshot_info(&DomainSnapshot::create_xml(d, &xml, sys::VIR_DOMAIN_SNAPSHOT_CREATE_REDEFINE)?))
            .await
    }

    /// The domain's snapshots, oldest first (libvirt lists them in no promised order).
    pub async fn snapshot_list(&self, domain: &str) -> Result<Vec<SnapshotInfo>> {
        self.with_domain("snapshot-list", domain, |d| {
            let mut found = Vec::new();
            for s in d.list_all_snapshots(0)? {
                match snapshot_info(&s) {
                    Ok(info) => found.push(info),
                    // Deleted between the listing and reading it: gone, not a failure.
                    Err(e) if e.code() == ErrorNumber::NoDomainSnapshot => {}
                    Err(e) => return Err(e),
                }
            }
            found.sort_by_key(|s| (creation_time(&s.xml), s.name.clone()));
            Ok(found)
        })
        .await
    }

    /// Revert the domain to snapshot `name`.
    pub async fn snapshot_revert(&self, domain: &str, name: &str) -> Result<()> {
        check_c_string("snapshot name", name)?;
        let name = name.to_string();
        self.with_domain("snapshot-revert", domain, move |d| DomainSnapshot::lookup_by_name(d, &name, 0)?.revert(0)).await
    }

    /// Delete snapshot `name` (not its children).
    pub async fn snapshot_delete(&self, domain: &str, name: &str) -> Result<()> {
        check_c_string("snapshot name", name)?;
        let name = name.to_string();
        self.with_domain("snapshot-delete", domain, move |d| DomainSnapshot::lookup_by_name(d, &name, 0)?.delete(0)).await
    }

    /// Create a volume in `pool` from volume XML.
    pub async fn volume_create(&self, pool: &str, xml: String) -> Result<VolumeInfo> {
        check_c_string("pool name", pool)?;
        check_c_string("volume XML", &xml)?;
        let pool = pool.to_string();
        self.run("volume-create", move |c| {
            let pool = StoragePool::lookup_by_name(c, &pool)?;
            volume_info(&StorageVol::create_xml(&pool, &xml, 0)?)
        })
        .await
    }

    /// Create a volume in `pool` from volume XML holding a byte-for-byte copy of volume
    /// `source` of the same pool: the file itself, streamed (download into upload), so a
    /// qcow2 keeps its internal snapshots and its backing file. (`virStorageVolCreateXMLFrom`
    /// would not: it copies with `qemu-img convert`, which writes the current content only.)
    pub async fn volume_clone(&self, pool: &str, source: &str, xml: String) -> Result<VolumeInfo> {
        check_c_string("pool name", pool)?;
        check_c_string("volume name", source)?;
        check_c_string("volume XML", &xml)?;
        let (pool, source) = (pool.to_string(), source.to_string());
        let limit = self.timeout() * 10;
        self.run_within("volume-clone", limit, move |c| {
            let pool = StoragePool::lookup_by_name(c, &pool)?;
            let from = StorageVol::lookup_by_name(&pool, &source)?;
            let to = StorageVol::create_xml(&pool, &xml, 0)?;
            let copied = (|| {
                let down = Stream::new(c, 0)?;
                from.download(&down, 0, 0, 0)?;
                let up = Stream::new(c, 0)?;
                to.upload(&up, 0, 0, 0)?;
                let mut buf = vec![0u8; UPLOAD_CHUNK];
                loop {
                    let n = match down.recv(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => n,
                        Err(e) => {
                            let _ = up.abort();
                            return Err(e);
                        }
                    };
                    let mut sent = 0;
                    while sent < n {
                        match up.send(&buf[sent..n]) {
                            Ok(k) => sent += k,
                            Err(e) => {
                                let _ = down.abort();
                                return Err(e);
                            }
                        }
                    }
                }
                down.finish()?;
                up.finish()
            })();
            match copied {
                Ok(()) => volume_info(&to),
                // A driver that cannot stream volumes (libvirt's test driver) copies its own way.
                Err(e) if e.code() == ErrorNumber::NoSupport => {
                    let _ = to.delete(0);
                    volume_info(&StorageVol::create_xml_from(&pool, &xml, &from, 0)?)
                }
                Err(e) => {
                    // A half copy is no copy.
                    let _ = to.delete(0);
                    Err(e)
                }
            }
        })
        .await
    }

    /// Replace the start of the volume's content with `bytes` (the volume keeps its capacity).
    pub async fn volume_upload(&self, pool: &str, name: &str, bytes: Vec<u8>) -> Result<()> {
        let len = bytes.len() as u64;
        self.volume_upload_from(pool, name, std::io::Cursor::new(bytes), len).await.map(|_| ())
    }

    /// Stream `len` bytes from `reader` into a volume, a chunk at a time (never all of it
    /// in memory). Returns the bytes sent. The time limit grows with `len` (at least
    /// 4 MiB/s on top of the connection's usual limit).
    pub async fn volume_upload_from(&self, pool: &str, name: &str, mut reader: impl std::io::Read + Send + 'static, len: u64) -> Result<u64> {
        check_c_string("pool name", pool)?;
        check_c_string("volume name", name)?;
        let (pool, name) = (pool.to_string(), name.to_string());
        let limit = self.timeout() + std::time::Duration::from_secs(len / (4 << 20));
        let sent = self.run_within("volume-upload", limit, move |c| {
            let vol = StorageVol::lookup_by_name(&StoragePool::lookup_by_name(c, &pool)?, &name)?;
            let stream = Stream::new(c, 0)?;
            vol.upload(&stream, 0, len, 0)?;
            let mut buf = vec![0u8; UPLOAD_CHUNK];
            let mut total = 0u64;
            while total < len {
                let want = UPLOAD_CHUNK.min((len - total) as usize);
                let n = match reader.read(&mut buf[..want]) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) => {
                        let _ = stream.abort();
                        return Ok(Err(e));
                    }
                };
                let mut sent = 0;
                while sent < n {
                    match stream.send(&buf[sent..n]) {
                        Ok(k) => sent += k,
                        Err(e) => {
                            let _ = stream.abort();
                            return Err(e);
                        }
                    }
                }
                total += n as u64;
            }
            stream.finish()?;
            Ok(Ok(total))
        })
        .await?;
        sent.map_err(|e| crate::error::LibvirtError::Internal(format!("reading what to upload: {e}")))
    }

    /// Stream the content of a volume (the file as the pool holds it: a qcow2 stays one)
    /// into `writer`, a chunk at a time, and hand the writer back. A volume on a backing
    /// file (a machine's boot disk over its image) is first flattened into a temporary
    /// volume beside it (`virStorageVolCreateXMLFrom`, libvirt's `qemu-img convert`), so what
    /// comes out stands alone. At most `max` bytes: a longer volume is refused (`Invalid`)
    /// with what was written so far. The time limit grows with the volume's size (at least
    /// 4 MiB/s on top of the usual limit).
    pub async fn volume_download_to<W: std::io::Write + Send + 'static>(&self, pool: &str, name: &str, mut writer: W, max: u64) -> Result<(W, u64)> {
        check_c_string("pool name", pool)?;
        check_c_string("volume name", name)?;
        if name.contains(['<', '>', '&', '"', '\'']) {
            return Err(crate::error::LibvirtError::Invalid(format!("volume name {name:?}: no XML markup characters")));
        }
        let allocation = self.volume_list(pool).await?.into_iter().find(|v| v.name == name).map(|v| v.allocation_bytes.max(v.capacity_bytes)).unwrap_or(0);
        let (pool, name) = (pool.to_string(), name.to_string());
        let limit = self.timeout() + std::time::Duration::from_secs(allocation / (4 << 20));
        let got = self.run_within("volume-download", limit, move |c| {
            let pool = StoragePool::lookup_by_name(c, &pool)?;
            let source = StorageVol::lookup_by_name(&pool, &name)?;
            let flat = flattened(&pool, &source, &name)?;
            let vol = flat.as_ref().unwrap_or(&source);
            let sent = download(c, vol, &name, &mut writer, max);
            if let Some(flat) = &flat {
                let _ = flat.delete(0);
            }
            Ok(sent?.map(|total| (writer, total)))
        })
        .await?;
        got.map_err(|e| match e.kind() {
            std::io::ErrorKind::FileTooLarge => crate::error::LibvirtError::Invalid(e.to_string()),
            _ => crate::error::LibvirtError::Internal(format!("writing the downloaded volume: {e}")),
        })
    }

    /// Delete a volume and its content.
    pub async fn volume_delete(&self, pool: &str, name: &str) -> Result<()> {
        self.with_volume("volume-delete", pool, name, |_, vol| vol.delete(0))
            .await
    }

    /// Grow a volume to `capacity` bytes. libvirt refuses to shrink one (no
    /// `VIR_STORAGE_VOL_RESIZE_SHRINK`): an `Invalid` error.
    pub async fn volume_resize(&self, pool: &str, name: &str, capacity: u64) -> Result<()> {
        self.with_volume("volume-resize", pool, name, move |_, vol| vol.resize(capacity, 0).map(|_| ())).await
    }

    /// The volumes of `pool`.
    pub async fn volume_list(&self, pool: &str) -> Result<Vec<VolumeInfo>> {
        check_c_string("pool name", pool)?;
        let pool = pool.to_string();
        self.run("volume-list", move |c| {
            let pool = StoragePool::lookup_by_name(c, &pool)?;
            let mut out = Vec::new();
            for vol in pool.list_all_volumes(0)? {
                match volume_info(&vol) {
                    Ok(info) => out.push(info),
                    // Deleted between the listing and the lookup: not in the pool any more.
                    Err(e) if e.code() == ErrorNumber::NoStorageVolume => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(out)
        })
        .await
    }

    /// Every storage pool, active or not.
    pub async fn pool_list(&self) -> Result<Vec<PoolInfo>> {
        self.run("pool-list", |c| {
            c.list_all_storage_pools(0)?
                .iter()
                .map(|p| {
                    let info = p.get_info()?;
                    Ok(PoolInfo {
                        name: p.get_name()?,
                        active: p.is_active()?,
                        capacity_bytes: info.capacity,
                        available_bytes: info.available,
                    })
                })
                .collect()
        })
        .await
    }

    /// Every virtual network, active or not.
    pub async fn network_list(&self) -> Result<Vec<NetworkInfo>> {
        self.run("network-list", |c| {
            c.list_all_networks(0)?
                .iter()
                .map(|n| {
                    Ok(NetworkInfo {
                        name: n.get_name()?,
                        active: n.is_active()?,
                        // Networks without a bridge (e.g. hostdev forwarding) report an error here.
                        bridge: n.get_bridge_name().ok().filter(|b| !b.is_empty()),
                    })
                })
                .collect()
        })
        .await
    }

    /// The hypervisor host.
    pub async fn node_info(&self) -> Result<NodeInfo> {
        self.run("node-info", |c| {
            let info = c.get_node_info()?;
            Ok(NodeInfo {
                hostname: c.get_hostname()?,
                model: info.model,
                cpus: info.cpus,
                mhz: info.mhz,
                memory_kib: info.memory,
            })
        })
        .await
    }

    async fn with_domain<T, F>(&self, op: &'static str, name: &str, call: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Domain) -> std::result::Result<T, VirtError> + Send + 'static,
    {
        check_c_string("domain name", name)?;
        let name = name.to_string();
        self.run(op, move |c| call(&Domain::lookup_by_name(c, &name)?))
            .await
    }

    async fn with_volume<T, F>(
        &self,
        op: &'static str,
        pool: &str,
        name: &str,
        call: F,
    ) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connect, &StorageVol) -> std::result::Result<T, VirtError> + Send + 'static,
    {
        check_c_string("pool name", pool)?;
        check_c_string("volume name", name)?;
        let (pool, name) = (pool.to_string(), name.to_string());
        self.run(op, move |c| {
            let pool = StoragePool::lookup_by_name(c, &pool)?;
            call(c, &StorageVol::lookup_by_name(&pool, &name)?)
        })
        .await
    }
}

fn domain_info(d: &Domain) -> std::result::Result<DomainInfo, VirtError> {
    let info = d.get_info()?;
    Ok(DomainInfo {
        name: d.get_name()?,
        uuid: d.get_uuid_string()?,
        state: DomainState::from_raw(info.state),
        vcpus: info.nr_virt_cpu,
        memory_kib: info.max_mem,
    })
}

fn snapshot_info(s: &DomainSnapshot) -> std::result::Result<SnapshotInfo, VirtError> {
    Ok(SnapshotInfo { name: s.get_name()?, current: s.is_current(0)?, xml: s.get_xml_desc(0)? })
}

/// `<creationTime>` of a snapshot's XML (seconds), for ordering; 0 when absent.
fn creation_time(xml: &str) -> u64 {
    xml.split_once("<creationTime>")
        .and_then(|(_, rest)| rest.split_once("</creationTime>"))
        .and_then(|(t, _)| t.trim().parse().ok())
        .unwrap_or(0)
}

fn volume_info(v: &StorageVol) -> std::result::Result<VolumeInfo, VirtError> {
    let info = v.get_info()?;
    Ok(VolumeInfo {
        name: v.get_name()?,
        key: v.get_key()?,
        path: v.get_path()?,
        capacity_bytes: info.capacity,
        allocation_bytes: info.allocation,
    })
}

/// A standalone copy of `vol` beside it when it sits on a backing file (none when it does not):
/// `{name}.export`, replacing one an earlier export cut off left behind.
fn flattened(pool: &StoragePool, vol: &StorageVol, name: &str) -> std::result::Result<Option<StorageVol>, VirtError> {
    let xml = vol.get_xml_desc(0)?;
    let Some(backing) = xml.split_once("<backingStore>").map(|(_, rest)| rest) else { return Ok(None) };
    if !backing.split("</backingStore>").next().unwrap_or_default().contains("<path>") {
        return Ok(None);
    }
    let copy = format!("{name}.export");
    if let Ok(stale) = StorageVol::lookup_by_name(pool, &copy) {
        let _ = stale.delete(0);
    }
    let capacity = vol.get_info()?.capacity;
    let copy_xml = format!("<volume><name>{copy}</name><capacity unit='bytes'>{capacity}</capacity><target><format type='qcow2'/></target></volume>");
    StorageVol::create_xml_from(pool, &copy_xml, vol, 0).map(Some)
}

/// Receive `vol`'s content into `writer`, at most `max` bytes (`name` for messages). The
/// outer error is libvirt's, the inner one the writer's.
fn download(c: &Connect, vol: &StorageVol, name: &str, writer: &mut impl std::io::Write, max: u64) -> std::result::Result<std::io::Result<u64>, VirtError> {
    let stream = Stream::new(c, 0)?;
    vol.download(&stream, 0, 0, 0)?;
    let mut buf = vec![0u8; UPLOAD_CHUNK];
    let mut total = 0u64;
    loop {
        let n = stream.recv(&mut buf)?;
        if n == 0 {
            break;
        }
        total += n as u64;
        let written = if total > max {
            Err(std::io::Error::new(std::io::ErrorKind::FileTooLarge, format!("volume {name} is larger than the {max} bytes allowed")))
        } else {
            writer.write_all(&buf[..n])
        };
        if let Err(e) = written {
            let _ = stream.abort();
            return Ok(Err(e));
        }
    }
    stream.finish()?;
    Ok(Ok(total))
}
