//! `banlieue:host/transfer`: disk bytes between the host's image cache and the backend,
//! streamed by the host — they never pass through the component. Three grants, one per
//! call that holds one, each with its choke point: the one image of an `import-image` call
//! ([`HostState::transfer`]), the directory a `disk-export` call's disks go to
//! ([`HostState::export`]), the disks a `disk-import` call carries ([`HostState::carried`]);
//! without it every call is `denied`. The backend end is checked by the capability that
//! owns it: a libvirt volume only on the granted connection, HTTP only on a URL the http
//! grant allows (its one choke point, [`HttpGrant::check`]).
//!
//! [`HttpGrant::check`]: super::http::HttpGrant::check

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

use super::bindings::banlieue::host::transfer as wit;
use super::WitError;
use crate::state::HostState;

/// The image a component may send, for one call.
#[derive(Clone)]
pub struct TransferGrant {
    /// Opened by the host in its cache; read at offsets, so clones share no position.
    pub file: Arc<std::fs::File>,
    /// `sha256:<hex>` of the downloaded image.
    pub digest: String,
    /// `qcow2`, `raw` or `vmdk`.
    pub format: String,
    pub size: u64,
    pub virtual_size: u64,
}

impl std::fmt::Debug for TransferGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransferGrant").field("digest", &self.digest).field("format", &self.format).field("size", &self.size).finish()
    }
}

/// Reads the granted file from the start, whatever else reads it.
struct FromStart {
    file: Arc<std::fs::File>,
    pos: u64,
}

impl std::io::Read for FromStart {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

/// The file from the start as an HTTP body: 256 KiB positional reads, off the async threads.
fn body_of(file: Arc<std::fs::File>, len: u64) -> reqwest::Body {
    const CHUNK: u64 = 256 << 10;
    let chunks = futures::stream::try_unfold(0u64, move |pos| {
        let file = file.clone();
        async move {
            if pos >= len {
                return Ok(None);
            }
            let want = CHUNK.min(len - pos) as usize;
            let buf = tokio::task::spawn_blocking(move || {
                let mut buf = vec![0u8; want];
                let n = file.read_at(&mut buf, pos)?;
                if n == 0 {
                    return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the cached image is shorter than its size"));
                }
                buf.truncate(n);
                Ok(buf)
            })
            .await
            .map_err(std::io::Error::other)??;
            let next = pos + buf.len() as u64;
            Ok::<_, std::io::Error>(Some((bytes::Bytes::from(buf), next)))
        }
    });
    reqwest::Body::wrap_stream(chunks)
}

/// Where the disks of one `disk-export` call go: a directory the host made for this move,
/// each disk a file named after it, with a cap on what they may take together.
#[derive(Clone)]
pub struct ExportGrant {
    pub dir: Arc<cap_std::fs::Dir>,
    /// Bytes every disk of the call may take together.
    pub max_bytes: u64,
    /// The disks received whole, in the order they came: what the call exported.
    pub received: Arc<Mutex<Vec<ExportedDisk>>>,
    /// The disk coming in now and its bytes so far, for progress.
    pub progress: Arc<AtomicU64>,
    pub current: Arc<Mutex<String>>,
}

impl std::fmt::Debug for ExportGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExportGrant").field("max_bytes", &self.max_bytes).finish()
    }
}

impl ExportGrant {
    /// A grant into `dir`, for at most `max_bytes` in all.
    pub fn new(dir: cap_std::fs::Dir, max_bytes: u64) -> ExportGrant {
        ExportGrant { dir: Arc::new(dir), max_bytes, received: Arc::default(), progress: Arc::default(), current: Arc::default() }
    }

    /// The disk coming in now (empty before the first) and its bytes so far.
    pub fn current(&self) -> (String, u64) {
        (self.current.lock().unwrap_or_else(|e| e.into_inner()).clone(), self.progress.load(Ordering::Relaxed))
    }

    /// What was received whole so far.
    pub fn received(&self) -> Vec<ExportedDisk> {
        self.received.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Bytes still allowed.
    fn room(&self) -> u64 {
        self.max_bytes.saturating_sub(self.received().iter().map(|d| d.size).sum())
    }
}

/// A disk a `disk-export` call handed over: a file of the grant's directory named `name`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportedDisk {
    pub name: String,
    pub size: u64,
    /// `sha256:<hex>` of the bytes, hashed as they streamed in.
    pub digest: String,
}

/// The disks a `disk-import` call carries, by the name the source gave them, boot disk first.
#[derive(Clone, Default)]
pub struct CarriedGrant {
    pub disks: Vec<(String, TransferGrant)>,
    /// Where the host serves a disk for a backend to download it, if it does.
    pub urls: Option<Arc<dyn HandOut>>,
}

impl std::fmt::Debug for CarriedGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CarriedGrant").field("disks", &self.disks).field("urls", &self.urls.is_some()).finish()
    }
}

/// Serves one file for one download by a backend, at a URL that names nothing else.
pub trait HandOut: Send + Sync {
    /// A URL for one complete download of `file` (`size` bytes), whose name ends `.{extension}`.
    fn hand_out(&self, file: Arc<std::fs::File>, size: u64, extension: &str) -> Result<String, String>;
}

/// A disk's name as a file name: what the drivers call disks (`root`, `data-1`, `scsi0`).
fn disk_file(name: &str) -> Result<String, WitError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !ok {
        return Err(WitError::InvalidSpec(format!("disk name {name:?}: 1 to 63 letters, digits, '-', '_' or '.', starting with a letter or digit")));
    }
    Ok(name.to_string())
}

/// A file of the export directory being written: hashed and counted as the bytes come.
struct Incoming {
    file: std::fs::File,
    hasher: Sha256,
    total: u64,
    max: u64,
    progress: Arc<AtomicU64>,
}

impl Write for Incoming {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.total + buf.len() as u64 > self.max {
            return Err(std::io::Error::new(std::io::ErrorKind::FileTooLarge, format!("the disks are larger than the {} bytes left in the host's image cache", self.max)));
        }
        // Zeros are skipped, not written: a disk's unused space stays a hole in the cache
        // (a raw export is mostly zeros). The file gets its length when it is whole.
        let n = if buf.iter().all(|b| *b == 0) {
            use std::io::Seek;
            self.file.seek(std::io::SeekFrom::Current(buf.len() as i64))?;
            buf.len()
        } else {
            self.file.write(buf)?
        };
        self.hasher.update(&buf[..n]);
        self.total += n as u64;
        self.progress.store(self.total, Ordering::Relaxed);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

impl HostState {
    fn transfer(&self) -> Result<&TransferGrant, WitError> {
        self.grants.transfer.as_ref().ok_or_else(|| WitError::Denied("no image to transfer: only an import-image call holds one".into()))
    }

    fn export(&self) -> Result<ExportGrant, WitError> {
        self.grants.export.clone().ok_or_else(|| WitError::Denied("nowhere to export disks to: only a disk-export call has it".into()))
    }

    fn carried_disk(&self, disk: &str) -> Result<TransferGrant, WitError> {
        let carried = self.grants.carried.as_ref().ok_or_else(|| WitError::Denied("no carried disks: only a disk-import call holds them".into()))?;
        carried.disks.iter().find(|(n, _)| n == disk).map(|(_, g)| g.clone()).ok_or_else(|| WitError::NotFound(format!("no carried disk {disk:?}")))
    }

    /// Open `<disk>.part` in the export directory for a new disk (refusing one received already).
    fn incoming(&self, g: &ExportGrant, disk: &str) -> Result<(String, Incoming), WitError> {
        let name = disk_file(disk)?;
        if g.received().iter().any(|d| d.name == name) {
            return Err(WitError::InvalidSpec(format!("disk {name:?} was exported already in this call")));
        }
        let io = |e: std::io::Error| WitError::Internal(format!("the host's export directory: {e}"));
        let file = g.dir.open_with(format!("{name}.part"), cap_std::fs::OpenOptions::new().create(true).write(true).truncate(true)).map_err(io)?.into_std();
        g.progress.store(0, Ordering::Relaxed);
        *g.current.lock().unwrap_or_else(|e| e.into_inner()) = name.clone();
        Ok((name, Incoming { file, hasher: Sha256::new(), total: 0, max: g.room(), progress: g.progress.clone() }))
    }

    /// The disk came in whole: keep it under its name.
    fn received(&self, g: &ExportGrant, name: String, incoming: Incoming) -> Result<u64, WitError> {
        let io = |e: std::io::Error| WitError::Internal(format!("the host's export directory: {e}"));
        incoming.file.set_len(incoming.total).map_err(io)?;
        incoming.file.sync_all().map_err(io)?;
        g.dir.rename(format!("{name}.part"), &g.dir, &name).map_err(io)?;
        let digest = format!("sha256:{}", hex::encode(incoming.hasher.finalize()));
        g.received.lock().unwrap_or_else(|e| e.into_inner()).push(ExportedDisk { name, size: incoming.total, digest });
        crate::usage::transferred(incoming.total);
        Ok(incoming.total)
    }
}

/// Stream `g` into volume `name` of `pool` on the granted connection.
async fn send_to_volume(conn: banlieue_libvirt::Libvirt, g: TransferGrant, pool: String, name: String) -> Result<u64, WitError> {
    let reader = FromStart { file: g.file.clone(), pos: 0 };
    let sent = conn.volume_upload_from(&pool, &name, reader, g.size).await.map_err(super::libvirt::err)?;
    crate::usage::transferred(sent);
    Ok(sent)
}

/// Stream `g` as the body of one request, inside the http grant.
async fn send_to_http(http: Option<super::http::HttpGrant>, g: TransferGrant, method: String, url: String, headers: Vec<(String, String)>) -> Result<u16, WitError> {
    let http = http.ok_or_else(|| WitError::Denied("the http capability is not granted to this component".into()))?;
    let status = http.upload(&method, &url, &headers, body_of(g.file.clone(), g.size), g.size).await?;
    if (200..300).contains(&status) {
        crate::usage::transferred(g.size);
    }
    Ok(status)
}

impl wit::Host for HostState {
    async fn current(&mut self) -> Result<wit::Image, WitError> {
        let g = self.transfer()?;
        Ok(wit::Image { digest: g.digest.clone(), format: g.format.clone(), size: g.size, virtual_size: g.virtual_size })
    }

    async fn to_libvirt_volume(&mut self, pool: String, name: String) -> Result<u64, WitError> {
        let g = self.transfer()?.clone();
        send_to_volume(self.libvirt()?, g, pool, name).await
    }

    async fn to_http(&mut self, method: String, url: String, headers: Vec<(String, String)>) -> Result<u16, WitError> {
        let g = self.transfer()?.clone();
        send_to_http(self.grants.http.clone(), g, method, url, headers).await
    }

    async fn from_libvirt_volume(&mut self, disk: String, pool: String, name: String) -> Result<u64, WitError> {
        let g = self.export()?;
        let conn = self.libvirt()?;
        let (file, incoming) = self.incoming(&g, &disk)?;
        let max = incoming.max;
        let (incoming, _) = conn.volume_download_to(&pool, &name, incoming, max).await.map_err(super::libvirt::err)?;
        self.received(&g, file, incoming)
    }

    async fn from_http(&mut self, disk: String, url: String, headers: Vec<(String, String)>) -> Result<u64, WitError> {
        let g = self.export()?;
        let http = self.grants.http.clone().ok_or_else(|| WitError::Denied("the http capability is not granted to this component".into()))?;
        let (file, mut incoming) = self.incoming(&g, &disk)?;
        let max = incoming.max;
        http.download(&url, &headers, max, |chunk| incoming.write_all(chunk)).await?;
        self.received(&g, file, incoming)
    }

    async fn carried(&mut self) -> Result<Vec<wit::CarriedDisk>, WitError> {
        let carried = self.grants.carried.as_ref().ok_or_else(|| WitError::Denied("no carried disks: only a disk-import call holds them".into()))?;
        Ok(carried
            .disks
            .iter()
            .map(|(name, g)| wit::CarriedDisk { name: name.clone(), format: g.format.clone(), size: g.size, virtual_size: g.virtual_size })
            .collect())
    }

    async fn carried_to_libvirt_volume(&mut self, disk: String, pool: String, name: String) -> Result<u64, WitError> {
        let g = self.carried_disk(&disk)?;
        send_to_volume(self.libvirt()?, g, pool, name).await
    }

    async fn carried_to_http(&mut self, disk: String, method: String, url: String, headers: Vec<(String, String)>) -> Result<u16, WitError> {
        let g = self.carried_disk(&disk)?;
        send_to_http(self.grants.http.clone(), g, method, url, headers).await
    }

    async fn carried_url(&mut self, disk: String) -> Result<String, WitError> {
        let g = self.carried_disk(&disk)?;
        let urls = self.grants.carried.as_ref().and_then(|c| c.urls.clone()).ok_or_else(|| {
            WitError::Unavailable("this banlieue process serves no disk downloads (its --carry-url is not set)".into())
        })?;
        urls.hand_out(g.file.clone(), g.size, &g.format).map_err(WitError::Unavailable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disk_larger_than_the_room_left_is_refused_and_zeros_stay_holes() {
        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::File::create(dir.path().join("root.part")).unwrap();
        let mut incoming = Incoming { file, hasher: Sha256::new(), total: 0, max: 1 << 20, progress: Arc::default() };
        incoming.write_all(&vec![0u8; 512 << 10]).unwrap();
        incoming.write_all(&vec![7u8; 256 << 10]).unwrap();
        assert_eq!(incoming.total, 768 << 10);
        let e = incoming.write_all(&vec![7u8; 512 << 10]).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::FileTooLarge);
        assert!(e.to_string().contains("left in the host's image cache"), "{e}");
        use std::os::unix::fs::MetadataExt;
        let on_disk = std::fs::metadata(dir.path().join("root.part")).unwrap().blocks() * 512;
        assert!(on_disk < 512 << 10, "the zeros were not written: {on_disk} bytes allocated");
    }

    #[test]
    fn a_disk_name_never_leaves_the_export_directory() {
        for good in ["root", "data-1", "scsi0", "disk_2.vmdk"] {
            assert_eq!(disk_file(good).ok().as_deref(), Some(good));
        }
        for bad in ["", "../etc", "a/b", ".hidden", "/abs", "x\0", &"a".repeat(64)] {
            assert!(matches!(disk_file(bad), Err(WitError::InvalidSpec(_))), "{bad:?} must be refused");
        }
    }
}
