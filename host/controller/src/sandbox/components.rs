//! Loading components: the one place where a ProviderClass's or PlacementPolicy's
//! source is fetched, its signature verified, its contract checked and its code
//! compiled (or taken from the precompiled cache). Every role asks here, so a
//! component runs only after this check, in whichever process runs it.
//!
//! A loaded component is kept per object and reused while the object's
//! `spec.component` stays the same; a changed spec loads again. Failures are not
//! kept: the next reconcile tries again (a registry that comes back is picked up).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use banlieue_api::common::ComponentSource;
use banlieue_api::provider::RequestedCapabilities;
use banlieue_api::{PlacementPolicy, ProviderClass};
use banlieue_runtime::placement::PlacementPolicy as Policy;
use banlieue_runtime::provider::ProviderDriver;
use banlieue_runtime::source::{self, LocalDirs, Source, Trust};
use banlieue_runtime::{Limits, Runtime};
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::ResourceExt;
use tokio::sync::OnceCell;

use crate::failure::Cause;
use crate::status::reasons::Reason;

/// Why a component could not be loaded. `reason()` names the condition reason.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{0}")]
    Source(#[from] source::SourceError),
    #[error("{0}")]
    Component(#[from] banlieue_runtime::CallError),
    #[error("registry credentials: {0}")]
    PullSecret(String),
    #[error("the class requests capabilities the administrator does not allow: {0} (allowed: {1})")]
    CapabilitiesNotAllowed(String, String),
}

impl Cause for LoadError {
    fn reason(&self) -> Reason {
        use banlieue_oci::Error as O;
        use source::SourceError as S;
        match self {
            LoadError::Source(S::UnsignedNotAllowed(_) | S::Oci(O::Unsigned { .. })) => Reason::Unsigned,
            LoadError::Source(S::Oci(O::SignatureMismatch { .. } | O::DigestMismatch(_))) => Reason::VerificationFailed,
            LoadError::Source(S::Oci(O::InvalidArtifact(_) | O::TooLarge { .. })) => Reason::InvalidArtifact,
            LoadError::Source(S::Oci(_)) => Reason::FetchFailed,
            LoadError::Source(_) => Reason::SourceInvalid,
            LoadError::Component(e) => Cause::reason(e),
            LoadError::PullSecret(_) => Reason::PullSecretInvalid,
            LoadError::CapabilitiesNotAllowed(..) => Reason::CapabilitiesNotAllowed,
        }
    }

    /// Worth retrying without a spec change: a registry down or unreachable, registry
    /// credentials or a component file not there yet.
    fn retry(&self) -> bool {
        use banlieue_oci::Error as O;
        use source::SourceError as S;
        match self {
            LoadError::Source(S::Oci(O::Unsigned { .. } | O::SignatureMismatch { .. } | O::DigestMismatch(_) | O::InvalidArtifact(_) | O::TooLarge { .. })) => false,
            LoadError::Source(S::Oci(_) | S::File { .. }) | LoadError::PullSecret(_) => true,
            LoadError::Source(_) | LoadError::Component(_) | LoadError::CapabilitiesNotAllowed(..) => false,
        }
    }
}

/// A verified, compiled component and what it was loaded as.
pub struct Loaded<T> {
    pub component: T,
    /// `sha256:…` of the bytes that run.
    pub digest: String,
    /// A signature was verified (false for unsigned-allowed sources; built-ins ship with the host).
    pub verified: bool,
    pub contract_version: String,
    pub limits: Limits,
}

pub type LoadedDriver = Loaded<ProviderDriver>;
pub type LoadedPolicy = Loaded<Policy>;

type Slot<T> = Arc<OnceCell<Arc<Loaded<T>>>>;

/// The components this process has loaded.
pub struct Components {
    rt: Runtime,
    client: kube::Client,
    /// Where `builtin:` and `file://` components are read from.
    dirs: LocalDirs,
    /// What an administrator allows a ProviderClass to request.
    allowed: RequestedCapabilities,
    drivers: Mutex<HashMap<String, (String, Slot<ProviderDriver>)>>,
    policies: Mutex<HashMap<String, (String, Slot<Policy>)>>,
}

impl Components {
    pub fn new(rt: Runtime, client: kube::Client, dirs: LocalDirs, allowed: RequestedCapabilities) -> Self {
        Components { rt, client, dirs, allowed, drivers: Default::default(), policies: Default::default() }
    }

    pub fn runtime(&self) -> &Runtime {
        &self.rt
    }

    /// The driver of a ProviderClass, after the capability check.
    pub async fn driver(&self, class: &ProviderClass) -> Result<Arc<LoadedDriver>, LoadError> {
        self.check_capabilities(&class.spec.capabilities)?;
        let slot = slot(&self.drivers, &class.name_any(), &class.spec.component);
        let loaded = slot
            .get_or_try_init(|| async {
                let (bytes, digest, verified) = self.fetch(&class.spec.component).await?;
                let driver = self.rt.provider(&bytes)?;
                let contract_version = driver.component.contract_version.clone();
                Ok::<_, LoadError>(Arc::new(Loaded { component: driver, digest, verified, contract_version: contract_version.to_string(), limits: limits(&class.spec.component) }))
            })
            .await?;
        Ok(loaded.clone())
    }

    /// A PlacementPolicy's component.
    pub async fn policy(&self, policy: &PlacementPolicy) -> Result<Arc<LoadedPolicy>, LoadError> {
        self.policy_from(&policy.name_any(), &policy.spec.component).await
    }

    /// A built-in placement policy (`spread`, `binpack`) used without a PlacementPolicy object.
    pub async fn builtin_policy(&self, name: &str) -> Result<Arc<LoadedPolicy>, LoadError> {
        let source = ComponentSource { source: format!("builtin:placement-{name}"), ..Default::default() };
        self.policy_from(&format!("builtin:{name}"), &source).await
    }

    async fn policy_from(&self, key: &str, spec: &ComponentSource) -> Result<Arc<LoadedPolicy>, LoadError> {
        let slot = slot(&self.policies, key, spec);
        let loaded = slot
            .get_or_try_init(|| async {
                let (bytes, digest, verified) = self.fetch(spec).await?;
                let policy = self.rt.placement(&bytes)?;
                let contract_version = policy.component.contract_version.clone();
                Ok::<_, LoadError>(Arc::new(Loaded { component: policy, digest, verified, contract_version: contract_version.to_string(), limits: limits(spec) }))
            })
            .await?;
        Ok(loaded.clone())
    }

    fn check_capabilities(&self, wanted: &RequestedCapabilities) -> Result<(), LoadError> {
        let list = |c: &RequestedCapabilities| {
            let names: Vec<&str> = [("http", c.http), ("libvirt", c.libvirt), ("secrets", c.secrets)]
                .into_iter()
                .filter_map(|(n, on)| on.then_some(n))
                .collect();
            if names.is_empty() { "none".to_string() } else { names.join(", ") }
        };
        let excess = RequestedCapabilities {
            http: wanted.http && !self.allowed.http,
            libvirt: wanted.libvirt && !self.allowed.libvirt,
            secrets: wanted.secrets && !self.allowed.secrets,
        };
        if excess != RequestedCapabilities::default() {
            return Err(LoadError::CapabilitiesNotAllowed(list(&excess), list(&self.allowed)));
        }
        Ok(())
    }

    /// Fetch and verify; the bytes returned are the bytes whose digest was verified.
    async fn fetch(&self, spec: &ComponentSource) -> Result<(Vec<u8>, String, bool), LoadError> {
        let source: Source = spec.source.parse()?;
        let trust = Trust {
            public_keys: spec.verification.as_ref().map(|v| v.public_keys.clone()).unwrap_or_default(),
            allow_unsigned: spec.verification.as_ref().is_some_and(|v| v.allow_unsigned),
        };
        let auth = match (&source, &spec.pull_secret_ref) {
            (Source::Oci(reference), Some(r)) => {
                let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &r.namespace);
                let secret = secrets
                    .get_opt(&r.name)
                    .await
                    .map_err(|e| LoadError::PullSecret(format!("reading Secret {}/{}: {e}", r.namespace, r.name)))?
                    .ok_or_else(|| LoadError::PullSecret(format!("Secret {}/{} not found", r.namespace, r.name)))?;
                let json = secret
                    .data
                    .as_ref()
                    .and_then(|d| d.get(".dockerconfigjson"))
                    .ok_or_else(|| LoadError::PullSecret(format!("Secret {}/{} has no .dockerconfigjson", r.namespace, r.name)))?;
                banlieue_oci::auth_from_docker_config(&json.0, reference.registry())
                    .map_err(|e| LoadError::PullSecret(e.to_string()))?
            }
            _ => banlieue_oci::Auth::Anonymous,
        };
        let fetched = source::fetch(&source, &trust, &auth, &self.dirs).await?;
        Ok((fetched.bytes, fetched.digest, fetched.verified))
    }
}

fn limits(spec: &ComponentSource) -> Limits {
    let l = spec.limits.clone().unwrap_or_default();
    Limits::from_millis_mib(l.cpu_millis, l.memory_mib)
}

/// The slot for `key`, replaced when the component spec changed.
fn slot<T>(map: &Mutex<HashMap<String, (String, Slot<T>)>>, key: &str, spec: &ComponentSource) -> Slot<T> {
    let fingerprint = serde_json::to_string(spec).unwrap_or_default();
    let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
    match map.get(key) {
        Some((f, slot)) if *f == fingerprint => slot.clone(),
        _ => {
            let slot: Slot<T> = Arc::default();
            map.insert(key.to_string(), (fingerprint, slot.clone()));
            slot
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_oci::Error as O;
    use banlieue_runtime::CallError;
    use source::SourceError as S;

    #[test]
    fn a_load_failure_says_its_reason_and_whether_it_may_clear_by_itself() {
        let cases = [
            (LoadError::Source(S::UnsignedNotAllowed("oci://r/x".into())), Reason::Unsigned, false),
            (LoadError::Source(S::Oci(O::Unsigned { repository: "r/x".into(), digest: "sha256:1".into() })), Reason::Unsigned, false),
            (LoadError::Source(S::Oci(O::SignatureMismatch { digest: "sha256:1".into(), checked: 1 })), Reason::VerificationFailed, false),
            (LoadError::Source(S::Oci(O::DigestMismatch("tampered".into()))), Reason::VerificationFailed, false),
            // A registry down, or the artifact not pushed yet: it may come.
            (LoadError::Source(S::Oci(O::Registry("connection refused".into()))), Reason::FetchFailed, true),
            (LoadError::Source(S::Oci(O::NotFound("r/x:v1".into()))), Reason::FetchFailed, true),
            (LoadError::Source(S::File { path: "/components/x.wasm".into(), error: std::io::ErrorKind::NotFound.into() }), Reason::SourceInvalid, true),
            (LoadError::Source(S::UnknownBuiltin("nope".into())), Reason::SourceInvalid, false),
            (LoadError::PullSecret("Secret infra/pull not found".into()), Reason::PullSecretInvalid, true),
            (LoadError::CapabilitiesNotAllowed("libvirt".into(), "http".into()), Reason::CapabilitiesNotAllowed, false),
            (LoadError::Component(CallError::Trap("unreachable".into())), Reason::Trapped, false),
        ];
        for (e, reason, retry) in cases {
            assert_eq!((e.reason(), e.retry()), (reason, retry), "{e}");
        }
    }
}
