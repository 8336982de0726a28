//! What a Provider's driver may touch: built here and only here, from the
//! Provider's connection and the capabilities its ProviderClass requested (which
//! the operator already checked against what the administrator allows).
//!
//! - `http`: the Provider's endpoint origin, its CA bundle, its insecure flag;
//! - `libvirt`: the one long-lived connection to the Provider's URI;
//! - `secrets`: the keys of the Provider's `credentialsRef` (Secret or Vault path);
//! - `session`: the Provider's own backend session (with `http`), scoped by its UID.
//!
//! Grants are cached per Provider generation, because the HTTP grant carries the
//! per-Provider request concurrency limit and libvirt connections are long-lived.


pub mod vault;

use std::sync::Arc;

use banlieue_api::provider::{CredentialsKind, RequestedCapabilities};
use banlieue_api::Provider;
use banlieue_runtime::capability::http::HttpGrant;
use banlieue_runtime::capability::libvirt::LibvirtGrant;
use banlieue_runtime::capability::log::Attribution;
use banlieue_runtime::capability::secrets::SecretsGrant;
use banlieue_runtime::capability::transfer::TransferGrant;
use banlieue_runtime::capability::Grants;
use banlieue_runtime::provider::ProviderConfig;
use banlieue_secrets::KubernetesSecret;
use kube::ResourceExt;

use crate::Context;
use crate::failure::{api_failure, Cause, Failure};
use crate::status::reasons::Reason;

/// A grant that cannot be made; the reason goes on the Provider's condition.
#[derive(Debug, thiserror::Error)]
pub enum GrantError {
    /// The endpoint or credentials reference is wrong as written.
    #[error("{0}")]
    Invalid(String),
    /// The backend cannot be reached now (libvirt URI not answering).
    #[error("{0}")]
    Unavailable(String),
}

/// Retried either way: a connection written wrong is fixed by editing the Provider, whose
/// change brings it back sooner.
impl Cause for GrantError {
    fn reason(&self) -> Reason {
        match self {
            GrantError::Invalid(_) => Reason::InvalidConnection,
            GrantError::Unavailable(_) => Reason::BackendUnavailable,
        }
    }

    fn retry(&self) -> bool {
        true
    }
}


/// The driver configuration and grants of `provider`, for a call about `object`.
pub async fn for_provider(
    ctx: &Context,
    provider: &Provider,
    class: &str,
    caps: &RequestedCapabilities,
    object: &str,
) -> Result<(ProviderConfig, Grants), GrantError> {
    let key = crate::key(provider);
    let fingerprint = format!("{:?}/{}/{caps:?}", provider.metadata.uid, provider.metadata.generation.unwrap_or(0));
    let cached = {
        let map = ctx.grants.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&key).filter(|(f, _)| *f == fingerprint).map(|(_, g)| g.clone())
    };
    let mut grants = match cached {
        Some(g) => g,
        None => {
            let g = build(ctx, provider, caps).await?;
            ctx.grants.lock().unwrap_or_else(|e| e.into_inner()).insert(key.clone(), (fingerprint, g.clone()));
            g
        }
    };
    grants.log = Attribution { component: class.to_string(), object: object.to_string() };
    Ok((config(provider), grants))
}

fn config(provider: &Provider) -> ProviderConfig {
    let caps = &provider.spec.capabilities;
    let pairs = |m: &std::collections::BTreeMap<String, String>| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    ProviderConfig {
        provider: crate::key(provider),
        endpoint: provider.spec.connection.endpoint.clone(),
        credential_keys: provider.spec.connection.credentials_ref.as_ref().map(|c| c.keys.clone()).unwrap_or_default(),
        storage_classes: pairs(&caps.storage_classes),
        network_classes: pairs(&caps.network_classes),
        features: caps.features.clone(),
    }
}

async fn build(ctx: &Context, provider: &Provider, caps: &RequestedCapabilities) -> Result<Grants, GrantError> {
    let conn = &provider.spec.connection;
    let mut grants = Grants::default();
    if caps.http {
        let mut g = HttpGrant::for_endpoint(&conn.endpoint).await.map_err(GrantError::Invalid)?;
        g.ca_bundle = conn.ca_bundle.clone();
        g.insecure_skip_tls_verify = conn.insecure_skip_tls_verify;
        grants.http = Some(g);
        grants.session = Some(ctx.sessions.grant(session_scope(provider)));
    }
    if caps.libvirt {
        let libvirt = ctx
            .libvirt
            .get(&conn.endpoint)
            .await
            .map_err(|e| GrantError::Unavailable(format!("libvirt {}: {e}", conn.endpoint)))?;
        grants.libvirt = Some(LibvirtGrant { conn: libvirt });
    }
    if let (true, Some(creds)) = (caps.secrets, &conn.credentials_ref) {
        let namespace = provider.namespace().unwrap_or_default();
        let source: Arc<dyn banlieue_secrets::SecretSource> = match creds.kind {
            CredentialsKind::Secret => {
                let name = creds.name.clone().ok_or_else(|| GrantError::Invalid("credentialsRef of kind Secret needs a name".into()))?;
                Arc::new(KubernetesSecret::new(ctx.client.clone(), namespace, name))
            }
            CredentialsKind::Vault => Arc::new(crate::sandbox::grants::vault::source(ctx, provider, creds).await?),
        };
        grants.secrets = Some(SecretsGrant::new(source, creds.keys.clone()));
    }
    Ok(grants)
}

/// Build `provider`'s grants afresh on the next call: its credentials could not be read or
/// were refused, and what they come from (a Vault login's Secret) may have been fixed since.
pub fn forget(ctx: &Context, provider: &Provider) {
    ctx.grants.lock().unwrap_or_else(|e| e.into_inner()).remove(&crate::key(provider));
}

/// The session scope of a Provider: a Provider recreated under the same name starts afresh.
pub fn session_scope(provider: &Provider) -> String {
    format!("{}/{}", crate::key(provider), provider.metadata.uid.as_deref().unwrap_or_default())
}

/// Drop the Provider's backend session if its credentials changed since the last look,
/// so the driver's next call logs in with the new ones.
pub async fn check_credentials(ctx: &Context, provider: &Provider, grants: &Grants) {
    let (Some(secrets), Some(_)) = (&grants.secrets, &grants.session) else { return };
    // Unreadable credentials are the driver's to report, with its own reason.
    if let Ok(fingerprint) = secrets.fingerprint().await {
        if ctx.sessions.bind_credentials(&session_scope(provider), fingerprint) {
            tracing::info!(provider = %crate::key(provider), "credentials changed; dropped the backend session");
        }
    }
}

/// A Provider's driver, ready to call for one object: the class's component, the
/// Provider's configuration and grants. Why there is none is a [`Failure`].
pub struct Backend {
    pub class: String,
    /// What the class's driver imports (`spec.imageFormat`).
    pub image_format: banlieue_api::provider::ImageFormat,
    pub driver: std::sync::Arc<crate::sandbox::components::LoadedDriver>,
    pub config: ProviderConfig,
    pub grants: Grants,
    /// The Provider's operation slots and rate (`spec.limits`), for the object called about.
    pub throttle: crate::framework::throttle::Gate,
}

impl Backend {
    /// [`Context::call`] of this driver's export `operation`, counted for its Provider too:
    /// in the metrics and in its `status.operations`.
    pub async fn drive<T>(&self, ctx: &Context, operation: &str, fut: impl Future<Output = Result<T, banlieue_runtime::CallError>>) -> Result<T, banlieue_runtime::CallError> {
        let start = std::time::Instant::now();
        let result = ctx.call(&self.class, operation, fut).await;
        let provider = &self.config.provider;
        let (outcome, message) = match &result {
            Ok(_) => ("ok".to_string(), None),
            Err(e) => (crate::ops::metrics::outcome_label(crate::failure::Cause::reason(e).as_str()), Some(e.to_string())),
        };
        ctx.metrics.provider_operation(provider, &self.class, operation, start.elapsed(), &outcome);
        ctx.recent.record(provider, operation, &outcome, message.as_deref());
        result
    }

    /// The grants of this backend plus reading `file` — one image in the host's cache,
    /// opened by the host — for an `import-image` call, and nothing else.
    pub fn with_transfer(&self, file: std::fs::File, digest: String, format: String, size: u64, virtual_size: u64) -> Grants {
        let mut grants = self.grants.clone();
        grants.transfer = Some(TransferGrant { file: Arc::new(file), digest, format, size, virtual_size });
        grants
    }
}

/// What a placement policy may do: log, attributed to the policy and the object it decides
/// for. It reaches no backend, secret or file.
pub fn for_policy(policy: &str, object: String) -> Grants {
    Grants { log: Attribution { component: policy.to_string(), object }, ..Default::default() }
}

/// The driver of `provider` with its grants, for a call about `object`.
pub async fn backend(ctx: &Context, provider: &Provider, object: &str) -> Result<Backend, Failure> {
    let class_name = &provider.spec.provider_class_ref.name;
    let class = kube::Api::<banlieue_api::ProviderClass>::all(ctx.client.clone())
        .get_opt(class_name)
        .await
        .map(|o| o.filter(|o| ctx.options.installation.owns(&o.metadata)))
        .map_err(|e| api_failure(&e))?;
    backend_of_class(ctx, provider, class.as_ref(), object).await
}

/// [`backend`] with the Provider's class at hand (from a cache; `None`: there is no such class).
pub async fn backend_of_class(ctx: &Context, provider: &Provider, class: Option<&banlieue_api::ProviderClass>, object: &str) -> Result<Backend, Failure> {
    let class_name = provider.spec.provider_class_ref.name.clone();
    let class = class.ok_or_else(|| Failure::transient(Reason::ProviderClassNotFound, format!("ProviderClass {class_name:?} not found")))?;
    let driver = ctx
        .components
        .driver(class)
        .await
        .map_err(|e| Failure { reason: Reason::DriverNotReady, message: format!("ProviderClass {class_name:?}: {e}"), retry: e.retry() })?;
    let (config, grants) = for_provider(ctx, provider, &class_name, &class.spec.capabilities, object)
        .await
        .map_err(Failure::from)?;
    let key = crate::key(provider);
    let throttle = crate::framework::throttle::Gate::new(ctx.throttles.of(&key, provider.spec.limits.as_ref()), &key, object, ctx.metrics.clone());
    Ok(Backend { class: class_name, image_format: class.spec.image_format, driver, config, grants, throttle })
}
