//! Where provider credentials come from: a Kubernetes Secret or a Vault/OpenBao KV v2 path (read
//! through a shared [`VaultClient`] that logs in with a token, AppRole or Kubernetes auth).
//!
//! These are the plain backends of the `banlieue:host/secrets` capability. They do not check
//! grants (the runtime decides which keys a component may read before calling in here), and they
//! never put a secret value in a log line, an error message or `Debug` output: values travel only
//! inside [`SecretValue`].

mod error;
mod kubernetes;
mod static_source;
mod value;
mod vault;
mod vault_kv2;

pub use error::SecretError;
pub use kubernetes::KubernetesSecret;
pub use static_source::StaticSecrets;
pub use value::SecretValue;
pub use vault::{Kv2Secret, VaultAuth, VaultClient, VaultOptions};
pub use vault_kv2::VaultKv2;

/// A place that holds secret values by key. Every `get` reads the backend again unless the source
/// was given a cache (`VaultKv2::with_cache`), so a rotated credential is seen on the next call.
#[async_trait::async_trait]
pub trait SecretSource: Send + Sync {
    /// The value stored under `key`.
    async fn get(&self, key: &str) -> Result<SecretValue, SecretError>;

    /// Where values come from, for conditions and logs (e.g. `Secret default/vsphere`); never a value.
    fn describe(&self) -> String;
}
