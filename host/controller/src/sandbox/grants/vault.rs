//! Provider credentials kept in Vault (or OpenBao): which server, how banlieue logs in,
//! and one logged-in client per server and login, shared by every Provider that uses them
//! (a client keeps its token, renews it, and logs in again when it must).
//!
//! The login comes from the Provider's `credentialsRef.vault.auth` — an AppRole whose role
//! ID and secret ID are in a Secret of the Provider's namespace, banlieue's service-account
//! token for the Kubernetes method, or a token in a Secret — or, without it, from the
//! process (`--vault-addr`, `VAULT_TOKEN`).

use std::path::Path;

use banlieue_api::provider::CredentialsRef;
use banlieue_api::Provider;
use banlieue_secrets::{SecretValue, VaultAuth, VaultClient, VaultKv2, VaultOptions};
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::ResourceExt;

use crate::Context;
use crate::sandbox::grants::GrantError;

/// Where a pod's service-account token is mounted (the Kubernetes auth method's JWT).
pub const SERVICE_ACCOUNT_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";


/// The KV v2 source of `provider`'s credentials.
pub async fn source(ctx: &Context, provider: &Provider, creds: &CredentialsRef) -> Result<VaultKv2, GrantError> {
    let path = creds.path.as_deref().filter(|p| !p.is_empty()).ok_or_else(|| GrantError::Invalid("credentialsRef of kind Vault needs a path".into()))?;
    let mount = creds.mount.as_deref().unwrap_or("secret");
    let client = client(ctx, provider, creds).await?;
    VaultKv2::new(client, mount, path, creds.version).map_err(|e| GrantError::Invalid(e.to_string()))
}

async fn client(ctx: &Context, provider: &Provider, creds: &CredentialsRef) -> Result<VaultClient, GrantError> {
    let namespace = provider.namespace().unwrap_or_default();
    let process = ctx.options.vault.as_ref();
    let conn = creds.vault.as_ref();
    let address = conn
        .and_then(|c| c.address.clone())
        .or_else(|| process.map(|v| v.address.clone()))
        .ok_or_else(|| GrantError::Invalid("credentialsRef is a Vault path, but names no vault.address and banlieue runs without --vault-addr".into()))?;
    let (auth, login, version) = match conn.map(|c| &c.auth) {
        None => {
            let token = process.and_then(|v| v.token.clone()).ok_or_else(|| {
                GrantError::Invalid("credentialsRef is a Vault path without vault.auth, and banlieue has no VAULT_TOKEN".into())
            })?;
            (VaultAuth::Token(token), "process token".to_string(), String::new())
        }
        Some(m) => match (&m.app_role, &m.kubernetes, &m.token_secret) {
            (Some(a), None, None) => {
                let (values, version) = secret_values(ctx, &namespace, &a.secret_name, &["role-id", "secret-id"]).await?;
                let [role_id, secret_id] = values;
                let mount = a.mount.clone().unwrap_or_else(|| "approle".into());
                (VaultAuth::AppRole { mount: mount.clone(), role_id, secret_id }, format!("approle {mount} {namespace}/{}", a.secret_name), version)
            }
            (None, Some(k), None) => {
                let jwt = std::fs::read_to_string(Path::new(SERVICE_ACCOUNT_TOKEN)).map_err(|e| {
                    GrantError::Invalid(format!("Vault Kubernetes auth needs the service-account token at {SERVICE_ACCOUNT_TOKEN}: {e}"))
                })?;
                let mount = k.mount.clone().unwrap_or_else(|| "kubernetes".into());
                // The kubelet rotates the token file; a client keeps the token it logged in with.
                let version = {
                    use std::hash::{Hash, Hasher};
                    let mut h = std::collections::hash_map::DefaultHasher::new();
                    jwt.trim().hash(&mut h);
                    format!("{:x}", h.finish())
                };
                (VaultAuth::Kubernetes { mount: mount.clone(), role: k.role.clone(), jwt: SecretValue::new(jwt.trim()) }, format!("kubernetes {mount} {}", k.role), version)
            }
            (None, None, Some(name)) => {
                let (values, version) = secret_values(ctx, &namespace, name, &["token"]).await?;
                let [token] = values;
                (VaultAuth::Token(token), format!("token {namespace}/{name}"), version)
            }
            _ => return Err(GrantError::Invalid("credentialsRef.vault.auth must set exactly one of appRole, kubernetes, tokenSecret".into())),
        },
    };
    let ca_pem = conn.and_then(|c| c.ca_bundle.clone()).unwrap_or_default().into_bytes();
    let key = format!("{address} {login}");
    let mut clients = ctx.vault.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, c)) = clients.get(&key).filter(|(v, _)| *v == version) {
        return Ok(c.clone());
    }
    let client = VaultClient::new(&address, auth, VaultOptions { ca_pem, ..Default::default() }).map_err(|e| GrantError::Invalid(e.to_string()))?;
    clients.insert(key, (version, client.clone()));
    Ok(client)
}

/// The values of `keys` in Secret `namespace/name`, and its resourceVersion.
async fn secret_values<const N: usize>(ctx: &Context, namespace: &str, name: &str, keys: &[&str; N]) -> Result<([SecretValue; N], String), GrantError> {
    let secret = Api::<Secret>::namespaced(ctx.client.clone(), namespace).get_opt(name).await.map_err(|e| GrantError::Unavailable(format!("reading Secret {namespace}/{name}: {e}")))?;
    let secret = secret.ok_or_else(|| GrantError::Invalid(format!("the Vault login's Secret {namespace}/{name} does not exist")))?;
    let data = secret.data.clone().unwrap_or_default();
    let mut values = Vec::with_capacity(N);
    for key in keys {
        let value = data.get(*key).ok_or_else(|| GrantError::Invalid(format!("the Vault login's Secret {namespace}/{name} has no key {key:?}")))?;
        let text = String::from_utf8(value.0.clone()).map_err(|_| GrantError::Invalid(format!("key {key:?} of Secret {namespace}/{name} is not UTF-8")))?;
        values.push(SecretValue::new(text.trim()));
    }
    let values: [SecretValue; N] = values.try_into().map_err(|_| GrantError::Invalid("internal: key count".into()))?;
    Ok((values, secret.resource_version().unwrap_or_default()))
}
