//! The keys of one KV v2 secret as a [`SecretSource`], optionally served from a short cache so
//! one driver call that asks for several keys costs one read.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::vault::{Part, api_url, kv2_what};
use crate::{Kv2Secret, SecretError, SecretSource, SecretValue, VaultClient};

/// The last read of a source and when it was made.
type Cache = Option<(Instant, Arc<Kv2Secret>)>;

/// `GET {address}/v1/{mount}/data/{path}[?version=N]`, field `data.data[key]`, through a shared
/// [`VaultClient`].
#[derive(Clone)]
pub struct VaultKv2 {
    client: VaultClient,
    mount: String,
    path: String,
    version: Option<u64>,
    cache_ttl: Duration,
    /// The last read and when it was made; shared by clones. Held across a refresh, so
    /// concurrent `get`s wait for one read instead of each making their own.
    cache: Arc<tokio::sync::Mutex<Cache>>,
}

impl std::fmt::Debug for VaultKv2 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VaultKv2")
            .field("mount", &self.mount)
            .field("path", &self.path)
            .field("version", &self.version)
            .field("cache_ttl", &self.cache_ttl)
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

impl VaultKv2 {
    /// Read `path` under `mount` (e.g. `secret`), at `version` or the latest (`None`). Mount and
    /// path are checked now: `..` and empty segments are refused.
    pub fn new(
        client: VaultClient,
        mount: &str,
        path: &str,
        version: Option<u64>,
    ) -> Result<VaultKv2, SecretError> {
        // Only to check them; the client builds the real URL on each read.
        let probe = reqwest::Url::parse("http://vault.invalid")
            .map_err(|e| SecretError::Invalid(format!("Vault URL: {e}")))?;
        api_url(
            &probe,
            &[
                Part::Clean("mount", mount),
                Part::Api("data"),
                Part::Clean("path", path),
            ],
            None,
        )?;
        Ok(VaultKv2 {
            client,
            mount: mount.trim_matches('/').to_string(),
            path: path.trim_matches('/').to_string(),
            version,
            cache_ttl: Duration::ZERO,
            cache: Arc::default(),
        })
    }

    /// Serve every key from the last read for `ttl` (zero, the default: read on every `get`).
    /// A rotated value is then seen at most `ttl` late.
    pub fn with_cache(mut self, ttl: Duration) -> Self {
        self.cache_ttl = ttl;
        self.cache = Arc::default();
        self
    }

    /// The KV version the path is at now (the latest, whatever version this source is pinned
    /// to), read from Vault past the cache: a number that grows means the secret was rotated.
    pub async fn current_version(&self) -> Result<u64, SecretError> {
        Ok(self
            .client
            .read_kv2(&self.mount, &self.path, None)
            .await?
            .version)
    }

    /// The secret, from the cache while it is fresh.
    async fn secret(&self) -> Result<Arc<Kv2Secret>, SecretError> {
        let read = || self.client.read_kv2(&self.mount, &self.path, self.version);
        if self.cache_ttl.is_zero() {
            return Ok(Arc::new(read().await?));
        }
        let mut cache = self.cache.lock().await;
        if let Some((at, secret)) = cache.as_ref()
            && at.elapsed() < self.cache_ttl
        {
            return Ok(secret.clone());
        }
        let started = Instant::now();
        let secret = Arc::new(read().await?);
        *cache = Some((started, secret.clone()));
        Ok(secret)
    }
}

#[async_trait::async_trait]
impl SecretSource for VaultKv2 {
    async fn get(&self, key: &str) -> Result<SecretValue, SecretError> {
        if key.is_empty() {
            return Err(SecretError::Invalid(format!(
                "{}: empty key",
                self.describe()
            )));
        }
        let secret = self.secret().await?;
        if let Some(value) = secret.data.get(key) {
            return Ok(value.clone());
        }
        let what = kv2_what(
            &self.mount,
            &self.path,
            Some(secret.version),
            &self.client.origin(),
        );
        if secret.non_string.contains(key) {
            Err(SecretError::Invalid(format!(
                "key {key:?} in {what} is not a string"
            )))
        } else {
            Err(SecretError::NotFound(format!("key {key:?} in {what}")))
        }
    }

    fn describe(&self) -> String {
        kv2_what(&self.mount, &self.path, self.version, &self.client.origin())
    }
}
