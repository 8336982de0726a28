//! The precompiled-component cache.
//!
//! Deserializing precompiled code is `unsafe`: wasmtime trusts it completely. So
//! the cache only loads bytes this host wrote itself: every entry ends with a
//! MAC (keyed BLAKE3) under a key that never leaves the cache directory (mode
//! 0600), and entries are keyed by (component sha256, wasmtime version,
//! engine-config hash). The entry is read once into memory, checked there, and
//! only those checked bytes are deserialized, so a file swapped after the check
//! is never loaded.
//!
//! Keyed BLAKE3 rather than HMAC-SHA256: the MAC covers the whole serialized
//! component (~0.5 MB for a policy) on every load, and BLAKE3 does that several
//! times faster; both are PRFs under a secret 256-bit key.

use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::Context;
use cap_std::fs::{Dir, OpenOptions, OpenOptionsExt};

/// Bytes of the MAC at the end of an entry.
const TAG_LEN: usize = blake3::OUT_LEN;
const KEY_FILE: &str = "cache.key";

/// The cache directory, opened once as a capability: entries are opened relative to
/// it, so no digest or name can reach a file outside it (a planted symlink that points
/// out is not followed).
pub struct Cache {
    dir: Dir,
    key: [u8; 32],
}

impl Cache {
    pub fn open(path: PathBuf) -> anyhow::Result<Cache> {
        std::fs::create_dir_all(&path).with_context(|| format!("creating cache dir {}", path.display()))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700))?;
        }
        let dir = Dir::open_ambient_dir(&path, cap_std::ambient_authority()).with_context(|| format!("opening cache dir {}", path.display()))?;
        let key = match dir.read(KEY_FILE).ok().and_then(|k| <[u8; 32]>::try_from(k).ok()) {
            Some(k) => k,
            None => {
                let k: [u8; 32] = rand::random();
                write_private(&dir, KEY_FILE, &[&k])?;
                k
            }
        };
        Ok(Cache { dir, key })
    }

    fn entry(&self, digest: &str, config_hash: &str) -> String {
        // `-b3`: entries of the earlier HMAC format are simply not looked at.
        format!("{digest}-wasmtime{}-{config_hash}-b3.cwasm", crate::engine::wasmtime_version())
    }

    fn mac(&self, bytes: &[u8]) -> blake3::Hash {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(bytes);
        h.finalize()
    }

    /// Precompiled bytes for this component and engine, if this host wrote them.
    pub fn get(&self, digest: &str, config_hash: &str) -> Option<Vec<u8>> {
        let name = self.entry(digest, config_hash);
        let mut bytes = Vec::new();
        self.dir.open(&name).ok()?.read_to_end(&mut bytes).ok()?;
        let len = bytes.len().checked_sub(TAG_LEN)?;
        let tag = <[u8; TAG_LEN]>::try_from(&bytes[len..]).ok()?;
        // `Hash` compares in constant time.
        if self.mac(&bytes[..len]) != blake3::Hash::from_bytes(tag) {
            tracing::warn!(entry = %name, "ignoring a precompiled component this host did not write");
            return None;
        }
        bytes.truncate(len);
        Some(bytes)
    }

    pub fn put(&self, digest: &str, config_hash: &str, bytes: &[u8]) -> anyhow::Result<()> {
        let name = self.entry(digest, config_hash);
        let tmp = format!("{name}.tmp{}", std::process::id());
        write_private(&self.dir, &tmp, &[bytes, self.mac(bytes).as_bytes()])?;
        self.dir.rename(&tmp, &self.dir, &name)?;
        Ok(())
    }
}

fn write_private(dir: &Dir, name: &str, parts: &[&[u8]]) -> anyhow::Result<()> {
    let mut o = OpenOptions::new();
    o.write(true).create(true).truncate(true).mode(0o600);
    let mut f = dir.open_with(name, &o)?;
    for p in parts {
        f.write_all(p)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_any_change_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path().to_path_buf()).unwrap();
        let bytes: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
        cache.put("d", "c", &bytes).unwrap();
        assert_eq!(cache.get("d", "c").as_deref(), Some(&bytes[..]));
        assert_eq!(cache.get("d", "other"), None);

        let path = dir.path().join(cache.entry("d", "c"));
        let good = std::fs::read(&path).unwrap();
        for at in [0, good.len() / 2, good.len() - TAG_LEN - 1, good.len() - TAG_LEN, good.len() - 1] {
            let mut bad = good.clone();
            bad[at] ^= 1;
            std::fs::write(&path, &bad).unwrap();
            assert_eq!(cache.get("d", "c"), None, "flipped byte {at}");
        }
        std::fs::write(&path, &good[good.len() - TAG_LEN + 1..]).unwrap();
        assert_eq!(cache.get("d", "c"), None, "truncated");

        // Another host's key: its entries are not this host's.
        std::fs::write(&path, &good).unwrap();
        let other = tempfile::tempdir().unwrap();
        let other = Cache { dir: Dir::open_ambient_dir(dir.path(), cap_std::ambient_authority()).unwrap(), key: Cache::open(other.path().to_path_buf()).unwrap().key };
        assert_eq!(other.get("d", "c"), None);
        assert_eq!(cache.get("d", "c").as_deref(), Some(&bytes[..]));
    }

    #[test]
    fn a_symlink_planted_in_the_cache_is_not_followed_out_of_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("cache");
        let cache = Cache::open(root.clone()).unwrap();
        // Another cache's valid entry, outside this one, reached through a link.
        let outside = dir.path().join("outside");
        let other = Cache::open(outside.clone()).unwrap();
        other.put("d", "c", b"precompiled").unwrap();
        std::fs::copy(outside.join(KEY_FILE), root.join(KEY_FILE)).unwrap();
        let cache = Cache { key: Cache::open(root.clone()).unwrap().key, ..cache };
        std::os::unix::fs::symlink(outside.join(other.entry("d", "c")), root.join(cache.entry("d", "c"))).unwrap();
        assert_eq!(cache.get("d", "c"), None, "the absolute link out of the cache is refused");
        std::fs::remove_file(root.join(cache.entry("d", "c"))).unwrap();
        std::os::unix::fs::symlink(format!("../outside/{}", other.entry("d", "c")), root.join(cache.entry("d", "c"))).unwrap();
        assert_eq!(cache.get("d", "c"), None, "the relative link out of the cache is refused");
        // The same bytes inside the cache are this host's (same key): the refusal was the link.
        std::fs::remove_file(root.join(cache.entry("d", "c"))).unwrap();
        std::fs::copy(outside.join(other.entry("d", "c")), root.join(cache.entry("d", "c"))).unwrap();
        assert_eq!(cache.get("d", "c").as_deref(), Some(&b"precompiled"[..]));
    }
}
