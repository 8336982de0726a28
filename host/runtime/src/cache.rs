//! The precompiled-component cache.
//!
//! Deserializing precompiled code is `unsafe`: wasmtime trusts it completely. So
//! the cache only loads bytes this host wrote itself: every entry carries an
//! HMAC-SHA256 under a key that never leaves the cache directory (mode 0600),
//! and entries are keyed by (component sha256, wasmtime version, engine-config hash).

use std::path::PathBuf;

use anyhow::Context;
use hmac::{Hmac, Mac};
use sha2::Sha256;

pub struct Cache {
    dir: PathBuf,
    key: Vec<u8>,
}

impl Cache {
    pub fn open(dir: PathBuf) -> anyhow::Result<Cache> {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating cache dir {}", dir.display()))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        }
        let key_path = dir.join("cache.key");
        let key = match std::fs::read(&key_path) {
            Ok(k) if k.len() == 32 => k,
            _ => {
                let k: [u8; 32] = rand::random();
                write_private(&key_path, &k)?;
                k.to_vec()
            }
        };
        Ok(Cache { dir, key })
    }

    fn entry(&self, digest: &str, config_hash: &str) -> PathBuf {
        self.dir.join(format!("{digest}-wasmtime{}-{config_hash}.cwasm", crate::engine::wasmtime_version()))
    }

    fn mac(&self, bytes: &[u8]) -> Vec<u8> {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.key).expect("any key length");
        m.update(bytes);
        m.finalize().into_bytes().to_vec()
    }

    /// Precompiled bytes for this component and engine, if this host wrote them.
    pub fn get(&self, digest: &str, config_hash: &str) -> Option<Vec<u8>> {
        let path = self.entry(digest, config_hash);
        let bytes = std::fs::read(&path).ok()?;
        let tag = std::fs::read(path.with_extension("mac")).ok()?;
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.key).expect("any key length");
        m.update(&bytes);
        match m.verify_slice(&tag) {
            Ok(()) => Some(bytes),
            Err(_) => {
                tracing::warn!(path = %path.display(), "ignoring a precompiled component this host did not write");
                None
            }
        }
    }

    pub fn put(&self, digest: &str, config_hash: &str, bytes: &[u8]) -> anyhow::Result<()> {
        let path = self.entry(digest, config_hash);
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        write_private(&tmp, bytes)?;
        write_private(&path.with_extension("mac"), &self.mac(bytes))?;
        std::fs::rename(&tmp, &path)?;
        Ok(())
    }
}

fn write_private(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    o.open(path)?.write_all(bytes)?;
    Ok(())
}
