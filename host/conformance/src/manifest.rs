//! The backend under test, as an operator would declare it: a Provider manifest and the
//! Secret its `credentialsRef` names (multi-document YAML, one or several files).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context};
use banlieue_api::provider::CredentialsKind;
use banlieue_api::Provider;
use banlieue_runtime::capability::http::HttpGrant;
use banlieue_runtime::capability::libvirt::LibvirtGrant;
use banlieue_runtime::capability::observer::Observer;
use banlieue_runtime::capability::secrets::SecretsGrant;
use banlieue_runtime::capability::session::SessionStore;
use banlieue_runtime::capability::Grants;
use banlieue_runtime::provider::ProviderConfig;

/// A Provider and the credentials its driver may read.
#[derive(Clone)]
pub struct Backend {
    pub provider: Provider,
    /// The Secret's values (`data` decoded, `stringData` over it); empty when it names none.
    pub credentials: BTreeMap<String, String>,
}

/// Which host capabilities a driver imports: it is granted those (as the operator would
/// grant what its ProviderClass requests), never more.
#[derive(Clone, Copy, Debug, Default)]
pub struct Imports {
    pub http: bool,
    pub libvirt: bool,
    pub secrets: bool,
    pub session: bool,
}

impl Imports {
    pub fn of(names: &[String]) -> Imports {
        let has = |p: &str| names.iter().any(|n| n.starts_with(p));
        Imports {
            http: has("banlieue:host/http@"),
            libvirt: has("banlieue:host/libvirt@"),
            secrets: has("banlieue:host/secrets@"),
            session: has("banlieue:provider/session@"),
        }
    }
}

/// Which credentials a grant carries.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Credentials {
    AsWritten,
    /// Every value replaced: the backend must refuse them.
    Wrong,
}

impl Backend {
    /// Read the Provider (exactly one) and, when its `credentialsRef` names a Secret, that
    /// Secret from `files`.
    pub fn read(files: &[impl AsRef<Path>]) -> anyhow::Result<Backend> {
        let mut providers = Vec::new();
        let mut secrets = BTreeMap::new();
        for file in files {
            let file = file.as_ref();
            let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
            for doc in serde_yaml::Deserializer::from_str(&text) {
                let value = serde_yaml::Value::deserialize(doc).with_context(|| format!("{}: not YAML", file.display()))?;
                if value.is_null() {
                    continue;
                }
                match value.get("kind").and_then(|k| k.as_str()) {
                    Some("Provider") => providers.push(serde_yaml::from_value::<Provider>(value).with_context(|| format!("{}: a Provider as banlieue.io/v1alpha1 defines it", file.display()))?),
                    Some("Secret") => {
                        let name = value.get("metadata").and_then(|m| m.get("name")).and_then(|n| n.as_str()).unwrap_or_default().to_string();
                        let values = secret_values(&value).with_context(|| format!("{}: Secret {name:?}", file.display()))?;
                        secrets.insert(name, values);
                    }
                    // A ProviderClass or anything else beside them is not needed here.
                    _ => {}
                }
            }
        }
        let provider = match providers.len() {
            1 => providers.remove(0),
            0 => bail!("the manifests hold no Provider: conformance needs one to say which backend to use"),
            n => bail!("the manifests hold {n} Providers; give one"),
        };
        if provider.spec.connection.endpoint.trim().is_empty() {
            bail!("the Provider names no backend: spec.connection.endpoint is empty");
        }
        let credentials = match &provider.spec.connection.credentials_ref {
            None => BTreeMap::new(),
            Some(c) if c.kind == CredentialsKind::Vault => bail!("credentialsRef of kind Vault: conformance reads credentials from a Secret in the manifests; copy them into one"),
            Some(c) => {
                let name = c.name.clone().unwrap_or_default();
                secrets.remove(&name).with_context(|| format!("the Provider's credentialsRef names Secret {name:?}, which the manifests do not hold"))?
            }
        };
        Ok(Backend { provider, credentials })
    }

    /// The driver's configuration, as the provider role gives it.
    pub fn config(&self) -> ProviderConfig {
        let p = &self.provider;
        let caps = &p.spec.capabilities;
        let pairs = |m: &BTreeMap<String, String>| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        ProviderConfig {
            provider: format!("{}/{}", p.metadata.namespace.as_deref().unwrap_or("default"), p.metadata.name.as_deref().unwrap_or("conformance")),
            endpoint: p.spec.connection.endpoint.clone(),
            credential_keys: self.keys(),
            storage_classes: pairs(&caps.storage_classes),
            network_classes: pairs(&caps.network_classes),
            features: caps.features.clone(),
        }
    }

    fn keys(&self) -> Vec<String> {
        match self.provider.spec.connection.credentials_ref.as_ref().map(|c| c.keys.clone()) {
            Some(keys) if !keys.is_empty() => keys,
            _ => self.credentials.keys().cloned().collect(),
        }
    }

    /// The grants of a call: what `imports` asks for, limited to this backend, watched by
    /// `observer`. `endpoint` overrides the manifest's (a backend that does not answer).
    pub async fn grants(&self, imports: Imports, endpoint: Option<&str>, credentials: Credentials, sessions: &Arc<SessionStore>, observer: &Arc<Observer>, libvirt: &banlieue_libvirt::Connections) -> Result<Grants, String> {
        let conn = &self.provider.spec.connection;
        let endpoint = endpoint.unwrap_or(&conn.endpoint);
        let mut grants = Grants { observer: Some(observer.clone()), ..Grants::default() };
        if imports.http {
            let mut g = HttpGrant::for_endpoint(endpoint).await?;
            g.ca_bundle = conn.ca_bundle.clone();
            g.insecure_skip_tls_verify = conn.insecure_skip_tls_verify;
            grants.http = Some(g);
            grants.session = imports.session.then(|| sessions.grant("conformance"));
        }
        if imports.libvirt {
            let c = libvirt.get(endpoint).await.map_err(|e| format!("libvirt {endpoint}: {e}"))?;
            grants.libvirt = Some(LibvirtGrant { conn: c });
        }
        if imports.secrets && !self.credentials.is_empty() {
            let values: Vec<(String, String)> = self
                .credentials
                .iter()
                .map(|(k, v)| (k.clone(), if credentials == Credentials::Wrong { format!("banlieue-conformance-wrong-{}", v.len()) } else { v.clone() }))
                .collect();
            grants.secrets = Some(SecretsGrant::new(Arc::new(banlieue_secrets::StaticSecrets::new(values)), self.keys()));
        }
        Ok(grants)
    }
}

use serde::Deserialize as _;

/// A Secret's values: `data` (base64) with `stringData` over it, as the API server merges them.
fn secret_values(secret: &serde_yaml::Value) -> anyhow::Result<BTreeMap<String, String>> {
    use base64::Engine as _;
    let mut values = BTreeMap::new();
    if let Some(data) = secret.get("data").and_then(|d| d.as_mapping()) {
        for (k, v) in data {
            let (Some(k), Some(v)) = (k.as_str(), v.as_str()) else { bail!("data holds a value that is not a string") };
            let bytes = base64::engine::general_purpose::STANDARD.decode(v.trim()).with_context(|| format!("data.{k} is not base64"))?;
            values.insert(k.to_string(), String::from_utf8(bytes).with_context(|| format!("data.{k} is not UTF-8"))?);
        }
    }
    if let Some(data) = secret.get("stringData").and_then(|d| d.as_mapping()) {
        for (k, v) in data {
            let (Some(k), Some(v)) = (k.as_str(), v.as_str()) else { bail!("stringData holds a value that is not a string") };
            values.insert(k.to_string(), v.to_string());
        }
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, text: &str) -> std::path::PathBuf {
        let p = dir.join("backend.yaml");
        std::fs::write(&p, text).unwrap();
        p
    }

    const PROVIDER: &str = "apiVersion: banlieue.io/v1alpha1\nkind: Provider\nmetadata: {name: pve, namespace: infra}\nspec:\n  providerClassRef: {name: proxmox}\n  connection:\n    endpoint: https://127.0.0.1:8006\n    credentialsRef: {name: pve-creds}\n";

    #[test]
    fn a_provider_and_its_secret_are_read_with_data_and_string_data_merged() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), &format!("{PROVIDER}---\napiVersion: v1\nkind: Secret\nmetadata: {{name: pve-creds}}\ndata: {{username: cm9vdEBwYW0=, password: eA==}}\nstringData: {{password: secret}}\n"));
        let b = Backend::read(&[p]).unwrap();
        assert_eq!(b.credentials.get("username").map(String::as_str), Some("root@pam"));
        assert_eq!(b.credentials.get("password").map(String::as_str), Some("secret"));
        assert_eq!(b.config().provider, "infra/pve");
        assert_eq!(b.config().credential_keys, vec!["password".to_string(), "username".to_string()]);
    }

    #[test]
    fn manifests_that_name_no_backend_are_refused_saying_why() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path();
        let none = write(dir, "apiVersion: v1\nkind: Secret\nmetadata: {name: x}\n");
        assert!(Backend::read(&[none]).err().unwrap().to_string().contains("hold no Provider"));
        let empty = write(dir, &PROVIDER.replace("https://127.0.0.1:8006", "\"\""));
        assert!(Backend::read(&[empty]).err().unwrap().to_string().contains("names no backend"));
        let missing = write(dir, PROVIDER);
        assert!(Backend::read(&[missing]).err().unwrap().to_string().contains("names Secret \"pve-creds\""));
    }

}
