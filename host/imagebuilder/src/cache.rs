//! The host-side image cache: disk images downloaded once, verified, and converted to
//! what each backend takes, before any import.
//!
//! - **Content-addressed.** An image is stored under the sha256 its VMImage declares
//!   (`images/sha256-<hex>`), its conversions beside it (`converted/sha256-<hex>.qcow2`).
//!   The only names the cache ever builds are those hex digests.
//! - **Capabilities, not paths.** The cache is a `cap-std` directory opened once from the
//!   path the administrator configures; every file is opened relative to it, so no name
//!   (and no `..`, absolute path or symlink) can reach anything outside. `qemu-img` is
//!   handed the files this process opened, as `/proc/<pid>/fd/<n>`, never a path built
//!   from input.
//! - **Verified before use.** A download is hashed as it streams and becomes an entry
//!   only when its digest is the declared one; a mismatch leaves nothing behind.
//! - **Resumable.** A download cut off stays in `partial/`; the next fetch asks for the
//!   rest with an HTTP `Range` request (and starts over when the server ignores it).
//! - **Bounded.** The cache never holds more than its limit: older entries are evicted
//!   to make room, and an image that cannot fit is refused.
//! - **Carried disks pass through.** A move's disks (`carry/<machine UID>/`) are written by
//!   the transfer capability, converted here, and removed when the move ends; they count
//!   against the limit while they are here.

use std::collections::HashMap;
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use cap_std::ambient_authority;
use cap_std::fs::{Dir, OpenOptions};
use futures::StreamExt;
use sha2::{Digest as _, Sha256};

const IMAGES: &str = "images";
const CONVERTED: &str = "converted";
const PARTIAL: &str = "partial";
/// Where the disks of moves pass through: `carry/<new machine's UID>/<disk>`.
const CARRY: &str = "carry";

/// A sha256 digest, as VMImages write it (`sha256:<64 hex>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest([u8; 32]);

impl Digest {
    /// Parse `sha256:<64 lower-case hex>`.
    pub fn parse(s: &str) -> Result<Digest, FetchError> {
        let invalid = || FetchError::InvalidChecksum(s.to_string());
        let hex_part = s.strip_prefix("sha256:").ok_or_else(invalid)?;
        if hex_part.len() != 64 || !hex_part.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return Err(invalid());
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(hex_part, &mut out).map_err(|_| invalid())?;
        Ok(Digest(out))
    }

    /// The file name of this digest in the cache: `sha256-<hex>`.
    fn file_name(&self) -> String {
        format!("sha256-{}", hex::encode(self.0))
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sha256:{}", hex::encode(self.0))
    }
}

/// The disk formats the backends take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DiskFormat {
    /// libvirt volumes, Proxmox VE.
    Qcow2,
    /// Proxmox VE, and what kairos-operator builds.
    Raw,
    /// vSphere's OVF import (`streamOptimized` VMDK).
    StreamOptimizedVmdk,
}

impl DiskFormat {
    /// Its file extension, which is also how the transfer capability names it.
    pub fn extension(self) -> &'static str {
        match self {
            DiskFormat::Qcow2 => "qcow2",
            DiskFormat::Raw => "raw",
            DiskFormat::StreamOptimizedVmdk => "vmdk",
        }
    }
}

/// Why an image could not be fetched. Every variant leaves no entry behind.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("checksum {0:?} is not sha256:<64 lower-case hex digits>")]
    InvalidChecksum(String),
    #[error("URL {0:?} is not a URL")]
    InvalidUrl(String),
    #[error("URL scheme {scheme:?} is not allowed (allowed: {allowed})")]
    SchemeNotAllowed { scheme: String, allowed: String },
    #[error("GET {url}: the server answered {status}")]
    Http { url: String, status: u16 },
    /// Retryable: the server could not be reached or the transfer was cut off (what
    /// arrived is kept, and the next fetch resumes from there).
    #[error("GET {url}: {message}")]
    Unavailable { url: String, message: String },
    #[error("the download's checksum is {actual}, not the declared {expected}")]
    ChecksumMismatch { expected: Digest, actual: Digest },
    #[error("the image is {size} bytes, more than the image cache holds ({limit} bytes)")]
    TooLarge { size: u64, limit: u64 },
    #[error("image cache: {0}")]
    Io(#[from] std::io::Error),
}

impl FetchError {
    /// Whether trying again later may succeed without a change to the VMImage.
    pub fn is_retryable(&self) -> bool {
        matches!(self, FetchError::Unavailable { .. } | FetchError::Io(_)) || matches!(self, FetchError::Http { status, .. } if *status >= 500 || *status == 429)
    }
}

/// Why an image could not be inspected or converted.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error("not a disk image: {0}")]
    NotADiskImage(String),
    #[error("qemu-img: {0}")]
    QemuImg(String),
    #[error("image cache: {0}")]
    Io(#[from] std::io::Error),
}

/// An image in the cache: verified, whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The digest of the downloaded image (a conversion keeps its source's).
    pub digest: Digest,
    /// Its format on disk.
    pub format: Option<DiskFormat>,
    pub size: u64,
    /// Where it is, relative to the cache (`images/sha256-…`).
    name: String,
}

/// What `qemu-img info` says of an image.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
pub struct ImageInfo {
    /// `qcow2`, `raw`, `vmdk`, `iso` is `raw` to qemu-img.
    pub format: String,
    #[serde(rename = "virtual-size")]
    pub virtual_size: u64,
}

/// The image cache (see the module docs).
pub struct ImageCache {
    root: Dir,
    limit: u64,
    allowed_schemes: Vec<String>,
    client: reqwest::Client,
    /// One fetch or conversion of a digest at a time.
    busy: Mutex<HashMap<Digest, Arc<tokio::sync::Mutex<()>>>>,
}

impl ImageCache {
    /// Open (creating) the cache at `path`, the one place this takes a path: everything
    /// after is relative to the directory opened here. It holds at most `limit` bytes and
    /// fetches only URLs of `allowed_schemes` (e.g. `["https"]`).
    pub fn open(path: &Path, limit: u64, allowed_schemes: &[&str]) -> std::io::Result<ImageCache> {
        std::fs::create_dir_all(path)?;
        let root = Dir::open_ambient_dir(path, ambient_authority())?;
        for sub in [IMAGES, CONVERTED, PARTIAL, CARRY] {
            root.create_dir_all(sub)?;
        }
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(15))
            .read_timeout(std::time::Duration::from_secs(60))
            .build()
            .map_err(std::io::Error::other)?;
        Ok(ImageCache { root, limit, allowed_schemes: allowed_schemes.iter().map(|s| s.to_string()).collect(), client, busy: Mutex::default() })
    }

    /// The cache's limit in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes held (entries, conversions and partial downloads).
    pub fn usage(&self) -> std::io::Result<u64> {
        Ok(self.files()?.iter().map(|f| f.1).sum())
    }

    /// The verified image of `digest`, if the cache holds it.
    pub fn get(&self, digest: &Digest) -> std::io::Result<Option<Entry>> {
        let name = format!("{IMAGES}/{}", digest.file_name());
        match self.root.metadata(&name) {
            Ok(m) => Ok(Some(Entry { digest: *digest, format: None, size: m.len(), name })),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Open an entry for reading (to stream it to a backend).
    pub fn open_entry(&self, entry: &Entry) -> std::io::Result<std::fs::File> {
        Ok(self.root.open(&entry.name)?.into_std())
    }

    /// Remove an image and its conversions.
    pub fn remove(&self, digest: &Digest) -> std::io::Result<()> {
        let stem = digest.file_name();
        for (name, _, _) in self.files()? {
            let file = name.rsplit('/').next().unwrap_or_default();
            if file == stem || file.starts_with(&format!("{stem}.")) {
                self.root.remove_file(&name)?;
            }
        }
        Ok(())
    }

    /// Download `url` into the cache unless an entry of `digest` is there already;
    /// verified against `digest` before it becomes one.
    pub async fn fetch(&self, url: &str, digest: &Digest) -> Result<Entry, FetchError> {
        let parsed = reqwest::Url::parse(url).map_err(|_| FetchError::InvalidUrl(url.to_string()))?;
        if !self.allowed_schemes.iter().any(|s| s == parsed.scheme()) {
            return Err(FetchError::SchemeNotAllowed { scheme: parsed.scheme().to_string(), allowed: self.allowed_schemes.join(", ") });
        }
        let lock = self.lock(digest);
        let _held = lock.lock().await;
        if let Some(entry) = self.get(digest)? {
            return Ok(entry);
        }
        let partial = format!("{PARTIAL}/{}", digest.file_name());
        let mut file = self.root.open_with(&partial, OpenOptions::new().create(true).read(true).append(true))?.into_std();
        // What arrived before counts, hashed again from disk.
        let mut hasher = Sha256::new();
        let mut have = 0u64;
        {
            let mut reader = std::io::BufReader::new(&file);
            let mut buf = vec![0u8; 1 << 16];
            loop {
                let n = reader.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                hasher.update(&buf[..n]);
                have += n as u64;
            }
        }
        let unavailable = |e: reqwest::Error| FetchError::Unavailable { url: url.to_string(), message: e.to_string() };
        let mut request = self.client.get(parsed.clone());
        if have > 0 {
            request = request.header(reqwest::header::RANGE, format!("bytes={have}-"));
        }
        let response = request.send().await.map_err(unavailable)?;
        let status = response.status().as_u16();
        match status {
            206 => {}
            // All of it arrived before; the hash decides.
            416 if have > 0 => return self.finish(&partial, hasher, have, digest),
            200 => {
                // The server sent the whole image: start over.
                file.set_len(0)?;
                file.seek(std::io::SeekFrom::Start(0))?;
                hasher = Sha256::new();
                have = 0;
            }
            _ => {
                drop(file);
                let _ = self.root.remove_file(&partial);
                return Err(FetchError::Http { url: url.to_string(), status });
            }
        }
        if let Some(rest) = response.content_length() {
            let total = have + rest;
            if total > self.limit {
                drop(file);
                let _ = self.root.remove_file(&partial);
                return Err(FetchError::TooLarge { size: total, limit: self.limit });
            }
            self.make_room(total.saturating_sub(have), &partial)?;
        }
        let mut body = response.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(unavailable)?;
            have += chunk.len() as u64;
            if have > self.limit {
                drop(file);
                let _ = self.root.remove_file(&partial);
                return Err(FetchError::TooLarge { size: have, limit: self.limit });
            }
            hasher.update(&chunk);
            file.write_all(&chunk)?;
        }
        file.sync_all()?;
        drop(file);
        self.finish(&partial, hasher, have, digest)
    }

    /// The partial download is whole: an entry if its digest is the declared one.
    fn finish(&self, partial: &str, hasher: Sha256, size: u64, digest: &Digest) -> Result<Entry, FetchError> {
        let actual = Digest(hasher.finalize().into());
        if actual != *digest {
            self.root.remove_file(partial)?;
            return Err(FetchError::ChecksumMismatch { expected: *digest, actual });
        }
        let name = format!("{IMAGES}/{}", digest.file_name());
        self.root.rename(partial, &self.root, &name)?;
        Ok(Entry { digest: *digest, format: None, size, name })
    }

    /// What `qemu-img info` makes of an entry; a file that is not a disk image is refused.
    pub async fn inspect(&self, entry: &Entry) -> Result<ImageInfo, ConvertError> {
        let file = self.root.open(&entry.name)?.into_std();
        info_of(&file, entry.size).await
    }

    /// The entry in `format`, converted once with `qemu-img convert` and kept beside it.
    pub async fn convert(&self, entry: &Entry, format: DiskFormat) -> Result<Entry, ConvertError> {
        let info = self.inspect(entry).await?;
        let source_format = info.format.clone();
        let lock = self.lock(&entry.digest);
        let _held = lock.lock().await;
        let name = format!("{CONVERTED}/{}.{}", entry.digest.file_name(), format.extension());
        if let Ok(m) = self.root.metadata(&name) {
            return Ok(Entry { digest: entry.digest, format: Some(format), size: m.len(), name });
        }
        // A conversion can be as large as the virtual disk.
        self.make_room(info.virtual_size, &entry.name).map_err(ConvertError::Io)?;
        let tmp = format!("{PARTIAL}/{}.{}", entry.digest.file_name(), format.extension());
        let input = self.root.open(&entry.name)?.into_std();
        let output = self.root.open_with(&tmp, OpenOptions::new().create(true).write(true).truncate(true))?.into_std();
        let result = convert_file(&input, &source_format, &output, format).await;
        drop((input, output));
        if let Err(e) = result {
            let _ = self.root.remove_file(&tmp);
            return Err(e);
        }
        self.root.rename(&tmp, &self.root, &name)?;
        let size = self.root.metadata(&name)?.len();
        Ok(Entry { digest: entry.digest, format: Some(format), size, name })
    }

    /// The directory the disks of one move pass through (made if need be), named by `key`
    /// (the new machine's UID: letters, digits and `-`).
    pub fn carry_dir(&self, key: &str) -> std::io::Result<Dir> {
        let name = carry_name(key)?;
        self.root.create_dir_all(&name)?;
        self.root.open_dir(&name)
    }

    /// Bytes the cache may still take for carried disks: its limit less everything it holds
    /// (images can be evicted for a move only by removing them by hand).
    pub fn carry_room(&self) -> std::io::Result<u64> {
        let carried: u64 = self.carry_files()?.iter().map(|f| f.1).sum();
        Ok(self.limit.saturating_sub(self.usage()? + carried))
    }

    /// Remove what a move carried through the cache.
    pub fn carry_remove(&self, key: &str) -> std::io::Result<()> {
        match self.root.remove_dir_all(carry_name(key)?) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }

    /// Carried disk `disk` of move `key` in `format`: converted once with `qemu-img convert`
    /// and kept beside it as `<disk>.<extension>` (the carried file itself when it already
    /// is in that format). The carried file must be a disk image.
    pub async fn carry_convert(&self, key: &str, disk: &str, format: DiskFormat) -> Result<CarriedFile, ConvertError> {
        let dir = self.carry_dir(key)?;
        if disk.is_empty() || disk.starts_with('.') || disk.contains(['/', '\\']) {
            return Err(ConvertError::NotADiskImage(format!("carried disk name {disk:?}")));
        }
        let source = dir.open(disk)?.into_std();
        let info = info_of(&source, source.metadata()?.len()).await?;
        let out = format!("{disk}.{}", format.extension());
        if !matches!(dir.metadata(&out), Ok(m) if m.is_file()) {
            let same = matches!((info.format.as_str(), format), ("qcow2", DiskFormat::Qcow2) | ("raw", DiskFormat::Raw));
            if same {
                dir.hard_link(disk, &dir, &out)?;
            } else {
                let tmp = format!("{out}.part");
                let output = dir.open_with(&tmp, OpenOptions::new().create(true).write(true).truncate(true))?.into_std();
                let converted = convert_file(&source, &info.format, &output, format).await;
                drop(output);
                if let Err(e) = converted {
                    let _ = dir.remove_file(&tmp);
                    return Err(e);
                }
                dir.rename(&tmp, &dir, &out)?;
            }
        }
        let file = dir.open(&out)?.into_std();
        let size = file.metadata()?.len();
        Ok(CarriedFile { file, format, size, virtual_size: info.virtual_size })
    }

    /// Every file of every move's directory: name, size.
    fn carry_files(&self) -> std::io::Result<Vec<(String, u64)>> {
        let mut out = Vec::new();
        for moving in self.root.read_dir(CARRY)? {
            let moving = moving?;
            if !moving.file_type()?.is_dir() {
                continue;
            }
            let sub = format!("{CARRY}/{}", moving.file_name().to_string_lossy());
            for item in self.root.read_dir(&sub)? {
                let item = item?;
                out.push((format!("{sub}/{}", item.file_name().to_string_lossy()), item.metadata()?.len()));
            }
        }
        Ok(out)
    }

    fn lock(&self, digest: &Digest) -> Arc<tokio::sync::Mutex<()>> {
        let mut busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        busy.entry(*digest).or_default().clone()
    }

    /// Every file in the cache: name, size, last modified.
    fn files(&self) -> std::io::Result<Vec<(String, u64, SystemTime)>> {
        let mut out = Vec::new();
        for sub in [IMAGES, CONVERTED, PARTIAL] {
            for item in self.root.read_dir(sub)? {
                let item = item?;
                let meta = item.metadata()?;
                if meta.is_file() {
                    let modified = meta.modified().map(|m| m.into_std()).unwrap_or(SystemTime::UNIX_EPOCH);
                    out.push((format!("{sub}/{}", item.file_name().to_string_lossy()), meta.len(), modified));
                }
            }
        }
        Ok(out)
    }

    /// Evict the least recently written files (never `keep`) until `needed` more bytes fit.
    fn make_room(&self, needed: u64, keep: &str) -> std::io::Result<()> {
        let mut files = self.files()?;
        let mut used: u64 = files.iter().map(|f| f.1).sum();
        files.sort_by_key(|f| f.2);
        for (name, size, _) in files {
            if used.saturating_add(needed) <= self.limit {
                break;
            }
            if name == keep {
                continue;
            }
            tracing::info!(file = %name, size, "evicting from the image cache");
            self.root.remove_file(&name)?;
            used -= size;
        }
        Ok(())
    }
}

/// A carried disk converted for the backend it goes to.
#[derive(Debug)]
pub struct CarriedFile {
    pub file: std::fs::File,
    pub format: DiskFormat,
    pub size: u64,
    /// What a VM sees of it, in bytes.
    pub virtual_size: u64,
}

/// `carry/<key>`, for a key of letters, digits and `-` only.
fn carry_name(key: &str) -> std::io::Result<String> {
    if key.is_empty() || key.len() > 64 || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("move key {key:?}: letters, digits and '-' only")));
    }
    Ok(format!("{CARRY}/{key}"))
}

/// What `qemu-img info` makes of `file` (`size` bytes); a file that is not a disk image is refused.
async fn info_of(file: &std::fs::File, size: u64) -> Result<ImageInfo, ConvertError> {
    let out = qemu_img(&["info", "--output=json", &fd_path(file)]).await?;
    let info: ImageInfo = serde_json::from_slice(&out).map_err(|e| ConvertError::QemuImg(format!("unreadable `qemu-img info`: {e}")))?;
    // Any file is a "raw" image to qemu-img: a disk (or ISO) is at least whole sectors.
    if info.format == "raw" && (size == 0 || size % 512 != 0) {
        return Err(ConvertError::NotADiskImage(format!("{size} bytes of no known image format (not whole 512-byte sectors)")));
    }
    if !matches!(info.format.as_str(), "raw" | "qcow2" | "vmdk" | "vpc" | "vhdx") {
        return Err(ConvertError::NotADiskImage(format!("format {:?}", info.format)));
    }
    Ok(info)
}

/// `qemu-img convert` of `input` (in `source_format`) into `output` as `format`.
async fn convert_file(input: &std::fs::File, source_format: &str, output: &std::fs::File, format: DiskFormat) -> Result<(), ConvertError> {
    let mut args = vec!["convert", "-f", source_format, "-O"];
    match format {
        DiskFormat::Qcow2 => args.push("qcow2"),
        DiskFormat::Raw => args.push("raw"),
        DiskFormat::StreamOptimizedVmdk => args.extend(["vmdk", "-o", "subformat=streamOptimized"]),
    }
    let (from, to) = (fd_path(input), fd_path(output));
    args.extend([from.as_str(), to.as_str()]);
    qemu_img(&args).await.map(drop)
}

/// The path through which another process opens a file this process holds open.
fn fd_path(file: &std::fs::File) -> String {
    format!("/proc/{}/fd/{}", std::process::id(), file.as_raw_fd())
}

async fn qemu_img(args: &[&str]) -> Result<Vec<u8>, ConvertError> {
    let out = tokio::process::Command::new("qemu-img")
        .args(args)
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| ConvertError::QemuImg(format!("cannot run qemu-img (Debian package qemu-utils): {e}")))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(ConvertError::QemuImg(stderr.trim().to_string()));
    }
    Ok(out.stdout)
}
