//! `banlieue:host/secrets`: a component reads only the keys of its Provider's
//! credential source. [`SecretsGrant::get`] is the one choke point. Values never
//! appear in logs or errors.

use std::collections::BTreeSet;
use std::sync::Arc;

use banlieue_secrets::{SecretError, SecretSource};

use super::bindings::banlieue::host::secrets::Host;
use super::WitError;
use crate::state::HostState;

/// Which secret a component may read.
#[derive(Clone)]
pub struct SecretsGrant {
    source: Arc<dyn SecretSource>,
    /// Keys that may be read; every key of the source when empty.
    keys: BTreeSet<String>,
}

impl std::fmt::Debug for SecretsGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretsGrant").field("source", &self.source.describe()).field("keys", &self.keys).finish()
    }
}

impl SecretsGrant {
    pub fn new(source: Arc<dyn SecretSource>, keys: impl IntoIterator<Item = String>) -> SecretsGrant {
        SecretsGrant { source, keys: keys.into_iter().collect() }
    }

    /// The choke point.
    pub async fn get(&self, key: &str) -> Result<String, WitError> {
        if !self.keys.is_empty() && !self.keys.contains(key) {
            return Err(WitError::Denied(format!("secret key {key:?} is not granted (granted: {:?})", self.keys)));
        }
        match self.source.get(key).await {
            Ok(v) => Ok(v.expose().to_string()),
            Err(SecretError::NotFound(m)) => Err(WitError::NotFound(m)),
            Err(SecretError::Denied(m)) => Err(WitError::Denied(m)),
            Err(SecretError::Unavailable(m)) => Err(WitError::Unavailable(m)),
            Err(SecretError::Invalid(m)) => Err(WitError::InvalidSpec(m)),
        }
    }
}

impl SecretsGrant {
    /// A digest of every granted key's value (keyed per process, so it says nothing
    /// about the values), to notice rotated credentials without keeping them. A key
    /// with no value counts as empty.
    /// When the source holds none of the granted keys (a Secret or Vault path that is not
    /// there), that is `not-found`, with the source's words.
    pub async fn fingerprint(&self) -> Result<[u8; 32], WitError> {
        static KEY: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();
        let mut h = blake3::Hasher::new_keyed(KEY.get_or_init(rand::random));
        let mut missing = Vec::new();
        for key in &self.keys {
            let value = match self.get(key).await {
                Err(WitError::NotFound(m)) => {
                    missing.push(m);
                    String::new()
                }
                other => other?,
            };
            h.update(&(key.len() as u64).to_le_bytes()).update(key.as_bytes());
            h.update(&(value.len() as u64).to_le_bytes()).update(value.as_bytes());
        }
        if !self.keys.is_empty() && missing.len() == self.keys.len() {
            return Err(WitError::NotFound(format!("{}: none of the granted keys is there ({})", self.source.describe(), missing.join("; "))));
        }
        Ok(*h.finalize().as_bytes())
    }
}

impl Host for HostState {
    async fn get(&mut self, key: String) -> Result<String, WitError> {
        match &self.grants.secrets {
            Some(g) => g.clone().get(&key).await.map_err(|e| self.refusal(e)),
            None => Err(self.refusal(WitError::Denied("the secrets capability is not granted to this component".into()))),
        }
    }
}
