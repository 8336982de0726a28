//! Secret values from one KV v2 path of Vault or OpenBao, read on every call.
//!
//! Authentication is a Vault token for now.
//! TODO: the Kubernetes auth method (log in with the pod's service account token at
//! `auth/kubernetes/login`, renew the client token before its TTL runs out).

use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{StatusCode, Url};
use zeroize::Zeroizing;

use crate::{SecretError, SecretSource, SecretValue};

/// How long one read may take by default.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The keys of one KV v2 secret: `GET {address}/v1/{mount}/data/{path}`, field `data.data[key]`.
#[derive(Clone)]
pub struct VaultKv2 {
    http: reqwest::Client,
    /// The full read URL, `…/v1/{mount}/data/{path}`.
    url: Url,
    token: SecretValue,
    mount: String,
    path: String,
}

impl std::fmt::Debug for VaultKv2 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VaultKv2")
            .field("url", &self.url.as_str())
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

/// Options for [`VaultKv2`]; start with [`VaultKv2::builder`].
pub struct VaultKv2Builder {
    address: String,
    token: SecretValue,
    mount: String,
    path: String,
    ca_pem: Vec<u8>,
    insecure_skip_verify: bool,
    timeout: Duration,
}

impl VaultKv2Builder {
    /// The KV v2 mount (default `secret`).
    pub fn mount(mut self, mount: impl Into<String>) -> Self {
        self.mount = mount.into();
        self
    }

    /// Trust these PEM certificates (one or more) in addition to the system roots.
    pub fn ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_pem = pem.into();
        self
    }

    /// Accept any server certificate. For development only.
    pub fn insecure_skip_verify(mut self, insecure: bool) -> Self {
        self.insecure_skip_verify = insecure;
        self
    }

    /// Bound each read (default 10 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Check the address, mount and path, and build the HTTP client.
    pub fn build(self) -> Result<VaultKv2, SecretError> {
        let url = read_url(&self.address, &self.mount, &self.path)?;
        // reqwest is built without a bundled crypto provider; use ring, as the rest of the host does.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut http = reqwest::Client::builder()
            .timeout(self.timeout)
            .connect_timeout(self.timeout.min(Duration::from_secs(5)))
            // A redirect would carry X-Vault-Token to wherever it points.
            .redirect(reqwest::redirect::Policy::none())
            .tls_danger_accept_invalid_certs(self.insecure_skip_verify);
        if !self.ca_pem.is_empty() {
            let certs = reqwest::Certificate::from_pem_bundle(&self.ca_pem)
                .map_err(|e| SecretError::Invalid(format!("Vault CA bundle: {e}")))?;
            for cert in certs {
                http = http.add_root_certificate(cert);
            }
        }
        let http = http
            .build()
            .map_err(|e| SecretError::Invalid(format!("Vault HTTP client: {e}")))?;
        Ok(VaultKv2 {
            http,
            url,
            token: self.token,
            mount: self.mount,
            path: self.path,
        })
    }
}

impl VaultKv2 {
    /// Read `path` under the `secret` mount of the server at `address` with `token`.
    pub fn builder(
        address: impl Into<String>,
        token: SecretValue,
        path: impl Into<String>,
    ) -> VaultKv2Builder {
        VaultKv2Builder {
            address: address.into(),
            token,
            mount: "secret".to_string(),
            path: path.into(),
            ca_pem: Vec::new(),
            insecure_skip_verify: false,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    fn headers(&self) -> Result<HeaderMap, SecretError> {
        let mut token = HeaderValue::from_str(self.token.expose()).map_err(|_| {
            SecretError::Invalid("the Vault token is not a valid header value".into())
        })?;
        token.set_sensitive(true);
        let mut headers = HeaderMap::new();
        headers.insert("X-Vault-Token", token);
        Ok(headers)
    }
}

#[async_trait::async_trait]
impl SecretSource for VaultKv2 {
    async fn get(&self, key: &str) -> Result<SecretValue, SecretError> {
        let what = self.describe();
        if key.is_empty() {
            return Err(SecretError::Invalid(format!("{what}: empty key")));
        }
        let response = self
            .http
            .get(self.url.clone())
            .headers(self.headers()?)
            .send()
            .await
            .map_err(|e| SecretError::Unavailable(format!("{what}: {e}")))?;
        let status = response.status();
        let body = Zeroizing::new(
            response
                .bytes()
                .await
                .map_err(|e| SecretError::Unavailable(format!("{what}: reading the answer: {e}")))?
                .to_vec(),
        );
        if !status.is_success() {
            return Err(status_error(status, &what, &body));
        }
        // Errors from here on must not quote the body: it holds every value at this path.
        let json: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|_| SecretError::Invalid(format!("{what}: the answer is not JSON")))?;
        let data = json
            .get("data")
            .and_then(|d| d.get("data"))
            .and_then(|d| d.as_object())
            .ok_or_else(|| SecretError::NotFound(format!("{what}: no data (deleted version?)")))?;
        match data.get(key) {
            Some(serde_json::Value::String(value)) => Ok(SecretValue::new(value.as_str())),
            Some(_) => Err(SecretError::Invalid(format!(
                "key {key:?} in {what} is not a string"
            ))),
            None => Err(SecretError::NotFound(format!("key {key:?} in {what}"))),
        }
    }

    fn describe(&self) -> String {
        format!(
            "Vault KV v2 {}/{} at {}",
            self.mount,
            self.path,
            origin(&self.url)
        )
    }
}

/// `{address}/v1/{mount}/data/{path}`, each path segment escaped; `..` and empty segments refused.
fn read_url(address: &str, mount: &str, path: &str) -> Result<Url, SecretError> {
    let mut url = Url::parse(address)
        .map_err(|e| SecretError::Invalid(format!("Vault address {address:?}: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.cannot_be_a_base() {
        return Err(SecretError::Invalid(format!(
            "Vault address {address:?} is not http(s)"
        )));
    }
    let segments = |what: &str, value: &str| -> Result<Vec<String>, SecretError> {
        let parts: Vec<String> = value
            .trim_matches('/')
            .split('/')
            .map(str::to_string)
            .collect();
        if parts.iter().any(|p| p.is_empty() || p == "." || p == "..") {
            return Err(SecretError::Invalid(format!(
                "Vault {what} {value:?} is not a clean path"
            )));
        }
        Ok(parts)
    };
    let mount = segments("mount", mount)?;
    let path = segments("path", path)?;
    url.set_query(None);
    url.set_fragment(None);
    url.path_segments_mut()
        .map_err(|_| SecretError::Invalid(format!("Vault address {address:?} has no path")))?
        .pop_if_empty()
        .push("v1")
        .extend(&mount)
        .push("data")
        .extend(&path);
    Ok(url)
}

fn origin(url: &Url) -> String {
    url.origin().ascii_serialization()
}

/// Vault's `{"errors": [...]}` messages name the problem (e.g. "permission denied"), not values.
fn status_error(status: StatusCode, what: &str, body: &[u8]) -> SecretError {
    let errors = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("errors").cloned())
        .and_then(|e| e.as_array().cloned())
        .map(|errors| {
            errors
                .iter()
                .filter_map(|e| e.as_str())
                .collect::<Vec<_>>()
                .join("; ")
        })
        .filter(|e| !e.is_empty())
        .map(|e| format!(": {}", truncate(&e, 200)))
        .unwrap_or_default();
    let message = format!("{what}: HTTP {}{errors}", status.as_u16());
    match status {
        StatusCode::NOT_FOUND => SecretError::NotFound(message),
        StatusCode::FORBIDDEN | StatusCode::UNAUTHORIZED => SecretError::Denied(message),
        StatusCode::BAD_REQUEST | StatusCode::METHOD_NOT_ALLOWED => SecretError::Invalid(message),
        _ => SecretError::Unavailable(message),
    }
}

fn truncate(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_url_escapes_and_nests() {
        let url = read_url("https://vault.example:8200/", "kv", "team a/vsphere").unwrap();
        assert_eq!(
            url.as_str(),
            "https://vault.example:8200/v1/kv/data/team%20a/vsphere"
        );
        let url = read_url("http://127.0.0.1:8200", "secret", "/a/b/").unwrap();
        assert_eq!(url.as_str(), "http://127.0.0.1:8200/v1/secret/data/a/b");
    }

    #[test]
    fn read_url_refuses_traversal() {
        assert!(matches!(
            read_url("http://v", "secret", "a/../b"),
            Err(SecretError::Invalid(_))
        ));
        assert!(matches!(
            read_url("http://v", "secret", ""),
            Err(SecretError::Invalid(_))
        ));
        assert!(matches!(
            read_url("file:///x", "secret", "a"),
            Err(SecretError::Invalid(_))
        ));
    }

    #[test]
    fn debug_hides_the_token() {
        let vault = VaultKv2::builder("http://127.0.0.1:1", SecretValue::new("s.tok3n"), "a")
            .build()
            .unwrap();
        assert!(!format!("{vault:?}").contains("s.tok3n"));
    }
}
