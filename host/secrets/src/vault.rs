//! A Vault/OpenBao client shared by every Provider that uses the same server and credentials:
//! it logs in (token, AppRole or Kubernetes auth), keeps its client token alive, and reads KV v2
//! secrets.
//!
//! The token is refreshed on use, not by a background task: once 2/3 of its lease has passed the
//! next request renews it first (`auth/token/renew-self`); when Vault refuses or caps the renewal
//! (the token's max TTL), or a request answers 403 because the token died (expired, revoked), the
//! client logs in again and retries that request once. One mutex around the token state keeps
//! concurrent callers from logging in all at once.
//!
//! An AppRole login Vault refused is not sent again with the same role and secret ID for
//! [`REFUSED_LOGIN_HOLD`]: Vault locks an AppRole out after a few failed logins (5 within
//! 15 minutes by default), and a locked-out role refuses even a good secret ID — retrying
//! a revoked one would lock out the fix too. New credentials make a new client.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use reqwest::header::HeaderValue;
use reqwest::{Method, StatusCode, Url};
use zeroize::Zeroizing;

use crate::{SecretError, SecretValue};

/// How long an AppRole login Vault refused (4xx) is answered from memory instead of being
/// sent again: longer than Vault's default lockout counter reset (15 minutes), so this client
/// alone never adds up to a lockout.
pub const REFUSED_LOGIN_HOLD: Duration = Duration::from_secs(20 * 60);

/// How Vault knows who we are.
#[derive(Clone, Debug)]
pub enum VaultAuth {
    /// A Vault token used as is (e.g. `VAULT_TOKEN`); it cannot be replaced when it dies, but it
    /// is renewed while it lives if it has a TTL and is renewable.
    Token(SecretValue),
    /// `POST /v1/auth/{mount}/login {role_id, secret_id}`; `mount` is usually `approle`.
    AppRole {
        mount: String,
        role_id: SecretValue,
        secret_id: SecretValue,
    },
    /// `POST /v1/auth/{mount}/login {role, jwt}` with the pod's service-account token (the caller
    /// reads the token file and passes its content); `mount` is usually `kubernetes`.
    Kubernetes {
        mount: String,
        role: String,
        jwt: SecretValue,
    },
}

impl VaultAuth {
    /// AppRole at the default mount `approle`.
    pub fn approle(role_id: SecretValue, secret_id: SecretValue) -> Self {
        VaultAuth::AppRole {
            mount: "approle".to_string(),
            role_id,
            secret_id,
        }
    }

    /// Kubernetes auth at the default mount `kubernetes`.
    pub fn kubernetes(role: impl Into<String>, jwt: SecretValue) -> Self {
        VaultAuth::Kubernetes {
            mount: "kubernetes".to_string(),
            role: role.into(),
            jwt,
        }
    }

    /// The auth method and mount, for messages: `AppRole login (auth/approle)`.
    fn login_name(&self) -> String {
        match self {
            VaultAuth::Token(_) => "token".to_string(),
            VaultAuth::AppRole { mount, .. } => format!("AppRole login (auth/{mount})"),
            VaultAuth::Kubernetes { mount, role, .. } => {
                format!("Kubernetes login (auth/{mount}, role {role:?})")
            }
        }
    }

    fn can_login(&self) -> bool {
        !matches!(self, VaultAuth::Token(_))
    }

    /// Every secret this auth holds, to scrub from anything Vault says back.
    fn secrets(&self) -> Vec<&str> {
        match self {
            VaultAuth::Token(token) => vec![token.expose()],
            VaultAuth::AppRole {
                role_id, secret_id, ..
            } => vec![role_id.expose(), secret_id.expose()],
            VaultAuth::Kubernetes { jwt, .. } => vec![jwt.expose()],
        }
    }
}

/// Transport options of a [`VaultClient`].
#[derive(Clone)]
pub struct VaultOptions {
    /// PEM certificates (one or more) trusted in addition to the system roots.
    pub ca_pem: Vec<u8>,
    /// Accept any server certificate. For development only.
    pub insecure_skip_verify: bool,
    /// Bound on each request (connecting is bounded by the smaller of this and 5 s).
    pub timeout: Duration,
}

impl Default for VaultOptions {
    fn default() -> Self {
        VaultOptions {
            ca_pem: Vec::new(),
            insecure_skip_verify: false,
            timeout: Duration::from_secs(10),
        }
    }
}

impl std::fmt::Debug for VaultOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VaultOptions")
            .field("ca_pem_bytes", &self.ca_pem.len())
            .field("insecure_skip_verify", &self.insecure_skip_verify)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// One version of a KV v2 secret. `Debug` names the keys, never the values.
#[derive(Clone)]
pub struct Kv2Secret {
    /// The KV version this is (`data.metadata.version`).
    pub version: u64,
    /// The keys whose value is a string.
    pub data: BTreeMap<String, SecretValue>,
    /// Keys whose value is not a string (number, object…): present, but unusable as a credential.
    pub non_string: BTreeSet<String>,
}

impl std::fmt::Debug for Kv2Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kv2Secret")
            .field("version", &self.version)
            .field("keys", &self.data.keys().collect::<Vec<_>>())
            .field("non_string", &self.non_string)
            .finish()
    }
}

/// A Vault server plus the credentials to use it; cheap to clone (one `Arc`), so one client
/// serves every Provider configured with the same address and auth.
#[derive(Clone)]
pub struct VaultClient {
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    /// The address as given, checked: `{base}/v1/…` is every request.
    base: Url,
    auth: VaultAuth,
    state: tokio::sync::Mutex<TokenState>,
    logins: AtomicU64,
    renewals: AtomicU64,
}

/// The client token and what we know of its lease.
struct TokenState {
    /// None until the first use (lazy login).
    token: Option<SecretValue>,
    /// Bumped on each login, so a caller that saw a dead token logs in only if nobody did since.
    generation: u64,
    /// When the current lease started (the login or renewal request was sent).
    since: Instant,
    /// None: the token does not expire (or we could not learn when).
    lease: Option<Duration>,
    /// False once Vault capped a renewal (max TTL in sight) or said the token is not renewable.
    renewable: bool,
    /// The lease a fresh token got: a renewal granting less means the max TTL is near.
    full_lease: Duration,
    /// An AppRole login Vault refused, and when: not sent again before [`REFUSED_LOGIN_HOLD`].
    refused: Option<(Instant, String)>,
}

impl std::fmt::Debug for VaultClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VaultClient")
            .field("address", &self.inner.base.as_str())
            .field("auth", &self.inner.auth)
            .field("logins", &self.logins())
            .field("renewals", &self.renewals())
            .finish_non_exhaustive()
    }
}

/// A response: status and body (zeroed when dropped: it may hold every value of a secret).
type Answer = (StatusCode, Zeroizing<Vec<u8>>);

impl VaultClient {
    /// Check `address` and the auth mount, and build the HTTP client; nothing is sent yet.
    pub fn new(
        address: &str,
        auth: VaultAuth,
        options: VaultOptions,
    ) -> Result<VaultClient, SecretError> {
        let base = Url::parse(address)
            .map_err(|e| SecretError::Invalid(format!("Vault address {address:?}: {e}")))?;
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            return Err(SecretError::Invalid(format!(
                "Vault address {address:?} is not http(s)"
            )));
        }
        match &auth {
            VaultAuth::Token(_) => {}
            VaultAuth::AppRole { mount, .. } | VaultAuth::Kubernetes { mount, .. } => {
                clean_segments("auth mount", mount)?;
            }
        }
        // reqwest is built without a bundled crypto provider; use ring, as the rest of the host does.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut http = reqwest::Client::builder()
            .timeout(options.timeout)
            .connect_timeout(options.timeout.min(Duration::from_secs(5)))
            // A redirect would carry X-Vault-Token to wherever it points.
            .redirect(reqwest::redirect::Policy::none())
            .tls_danger_accept_invalid_certs(options.insecure_skip_verify);
        if !options.ca_pem.is_empty() {
            let certs = reqwest::Certificate::from_pem_bundle(&options.ca_pem)
                .map_err(|e| SecretError::Invalid(format!("Vault CA bundle: {e}")))?;
            if certs.is_empty() {
                return Err(SecretError::Invalid(
                    "the Vault CA bundle holds no PEM certificate".into(),
                ));
            }
            for cert in certs {
                http = http.add_root_certificate(cert);
            }
        }
        let http = http
            .build()
            .map_err(|e| SecretError::Invalid(format!("Vault HTTP client: {e}")))?;
        Ok(VaultClient {
            inner: Arc::new(Inner {
                http,
                base,
                auth,
                state: tokio::sync::Mutex::new(TokenState {
                    token: None,
                    generation: 0,
                    since: Instant::now(),
                    lease: None,
                    renewable: false,
                    full_lease: Duration::ZERO,
                    refused: None,
                }),
                logins: AtomicU64::new(0),
                renewals: AtomicU64::new(0),
            }),
        })
    }

    /// Successful logins so far (token auth never logs in).
    pub fn logins(&self) -> u64 {
        self.inner.logins.load(Ordering::Relaxed)
    }

    /// Successful token renewals so far.
    pub fn renewals(&self) -> u64 {
        self.inner.renewals.load(Ordering::Relaxed)
    }

    /// `scheme://host:port` of the server, for descriptions.
    pub fn origin(&self) -> String {
        self.inner.base.origin().ascii_serialization()
    }

    /// Log in now, replacing the current token (e.g. to check credentials at startup). With
    /// token auth this only asks Vault whether the token is valid (`auth/token/lookup-self`).
    pub async fn login(&self) -> Result<(), SecretError> {
        let mut state = self.inner.state.lock().await;
        if let VaultAuth::Token(token) = &self.inner.auth {
            self.adopt_static_token(&mut state).await?;
            return match self.lookup_self(token).await? {
                Some(_) => Ok(()),
                None => Err(self.dead_static_token()),
            };
        }
        self.log_in(&mut state).await
    }

    /// `GET /v1/{mount}/data/{path}[?version=N]`: one version (default: the latest) of a secret.
    pub async fn read_kv2(
        &self,
        mount: &str,
        path: &str,
        version: Option<u64>,
    ) -> Result<Kv2Secret, SecretError> {
        let url = self.url(
            &[
                Part::Clean("mount", mount),
                Part::Api("data"),
                Part::Clean("path", path),
            ],
            version.map(|v| ("version", v.to_string())),
        )?;
        let what = kv2_what(mount, path, version, &self.origin());
        let (status, body) = self.authed(Method::GET, url, &what).await?;
        // Errors from here on must not quote the body: it holds every value at this path.
        let json = || -> Option<serde_json::Value> { serde_json::from_slice(&body).ok() };
        match status {
            StatusCode::OK => {
                let json = json().ok_or_else(|| {
                    SecretError::Invalid(format!("{what}: the answer is not JSON"))
                })?;
                match parse_kv2(&json) {
                    Some(secret) => Ok(secret),
                    // 200 without KV v2's shape: probably a KV v1 mount holding a key named `data/…`.
                    None => Err(self.mount_mismatch(mount, &what).await.unwrap_or_else(|| {
                        SecretError::Invalid(format!("{what}: the answer is not a KV v2 secret"))
                    })),
                }
            }
            StatusCode::NOT_FOUND => {
                let deleted = json()
                    .as_ref()
                    .and_then(|j| j.pointer("/data/metadata/version"))
                    .and_then(serde_json::Value::as_u64);
                if let Some(v) = deleted {
                    return Err(SecretError::NotFound(format!(
                        "{what}: version {v} is deleted or destroyed"
                    )));
                }
                if let Some(err) = self.mount_mismatch(mount, &what).await {
                    return Err(err);
                }
                let no_mount = vault_errors(&body).contains("no handler for route");
                Err(SecretError::NotFound(if no_mount {
                    format!("{what}: no secrets engine is mounted at {mount:?}")
                } else {
                    format!("{what}: no secret at this path")
                }))
            }
            StatusCode::FORBIDDEN => Err(SecretError::Denied(format!(
                "{what}: HTTP 403{}; the token is valid, so its policies do not allow reading this path",
                self.errors_suffix(&body)
            ))),
            _ => Err(self.status_error(status, &what, &body)),
        }
    }

    /// The one place request URLs are made: `{address}/v1/` then `parts`, each segment escaped.
    fn url(&self, parts: &[Part<'_>], query: Option<(&str, String)>) -> Result<Url, SecretError> {
        api_url(&self.inner.base, parts, query)
    }

    /// Send one request (with `token`, if any) and read the whole answer; transport failures
    /// (refused, timeout, TLS) are `Unavailable`.
    async fn send(
        &self,
        method: Method,
        url: Url,
        token: Option<&SecretValue>,
        body: Option<&serde_json::Value>,
        what: &str,
    ) -> Result<Answer, SecretError> {
        let mut request = self.inner.http.request(method, url);
        if let Some(token) = token {
            let mut value = HeaderValue::from_str(token.expose()).map_err(|_| {
                SecretError::Invalid("the Vault token is not a valid header value".into())
            })?;
            value.set_sensitive(true);
            request = request.header("X-Vault-Token", value);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let unavailable = |e: reqwest::Error| {
            let kind = if e.is_timeout() { " (timed out)" } else { "" };
            SecretError::Unavailable(self.scrub(&format!("{what}{kind}: {e}")))
        };
        let response = request.send().await.map_err(unavailable)?;
        let status = response.status();
        let body = Zeroizing::new(response.bytes().await.map_err(unavailable)?.to_vec());
        Ok((status, body))
    }

    /// A request with the client token. A 403 is either a policy refusing this path or a token
    /// Vault no longer knows (expired, revoked): `lookup-self` tells which, and for a dead token
    /// we log in again and retry once.
    async fn authed(&self, method: Method, url: Url, what: &str) -> Result<Answer, SecretError> {
        let (token, generation) = self.token().await?;
        let answer = self
            .send(method.clone(), url.clone(), Some(&token), None, what)
            .await?;
        if answer.0 != StatusCode::FORBIDDEN || self.lookup_self(&token).await?.is_some() {
            return Ok(answer);
        }
        if !self.inner.auth.can_login() {
            return Err(self.dead_static_token());
        }
        let token = self.relogin(generation).await?;
        self.send(method, url, Some(&token), None, what).await
    }

    /// The token to use now, renewed or replaced first if its lease is 2/3 gone.
    async fn token(&self) -> Result<(SecretValue, u64), SecretError> {
        let mut state = self.inner.state.lock().await;
        self.freshen(&mut state).await?;
        let token = state
            .token
            .clone()
            .ok_or_else(|| SecretError::Unavailable("Vault login left no token".into()))?;
        Ok((token, state.generation))
    }

    /// Log in again unless someone did since `generation` (their token is then the fresh one).
    async fn relogin(&self, generation: u64) -> Result<SecretValue, SecretError> {
        let mut state = self.inner.state.lock().await;
        if state.generation == generation {
            self.log_in(&mut state).await?;
        }
        state
            .token
            .clone()
            .ok_or_else(|| SecretError::Unavailable("Vault login left no token".into()))
    }

    async fn freshen(&self, state: &mut TokenState) -> Result<(), SecretError> {
        if state.token.is_none() {
            return match &self.inner.auth {
                VaultAuth::Token(_) => self.adopt_static_token(state).await,
                _ => self.log_in(state).await,
            };
        }
        let Some(lease) = state.lease else {
            return Ok(());
        };
        let age = state.since.elapsed();
        if age < lease * 2 / 3 {
            return Ok(());
        }
        if state.renewable {
            match self.renew(state).await {
                Ok(()) => return Ok(()),
                // Vault unreachable: keep a token that still lives; the request will tell.
                Err(SecretError::Unavailable(_)) if age < lease => return Ok(()),
                Err(e @ SecretError::Unavailable(_)) => return Err(e),
                // Refused (expired, revoked): log in again below.
                Err(_) => {}
            }
        }
        if self.inner.auth.can_login() {
            self.log_in(state).await
        } else {
            // A static token at its max TTL: use it until Vault refuses it.
            Ok(())
        }
    }

    /// The static token, plus its lease if it has one (`lookup-self`), so it gets renewed.
    async fn adopt_static_token(&self, state: &mut TokenState) -> Result<(), SecretError> {
        let VaultAuth::Token(token) = &self.inner.auth else {
            return Ok(());
        };
        if state.token.is_some() {
            return Ok(());
        }
        let lookup = self.lookup_self(token).await?;
        let ttl = lookup
            .as_ref()
            .and_then(|d| d.get("ttl"))
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0);
        let renewable = lookup
            .as_ref()
            .and_then(|d| d.get("renewable"))
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false);
        let created = lookup
            .as_ref()
            .and_then(|d| d.get("creation_ttl"))
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(ttl);
        state.token = Some(token.clone());
        state.since = Instant::now();
        state.lease = (ttl > 0).then(|| Duration::from_secs(ttl));
        state.renewable = renewable;
        state.full_lease = Duration::from_secs(created);
        Ok(())
    }

    /// `POST /v1/auth/{mount}/login`; on success the new token replaces the old one.
    async fn log_in(&self, state: &mut TokenState) -> Result<(), SecretError> {
        if let Some((at, message)) = &state.refused
            && at.elapsed() < REFUSED_LOGIN_HOLD
        {
            return Err(SecretError::Denied(message.clone()));
        }
        let (mount, body) = match &self.inner.auth {
            VaultAuth::Token(_) => return self.adopt_static_token(state).await,
            VaultAuth::AppRole {
                mount,
                role_id,
                secret_id,
            } => (
                mount,
                serde_json::json!({ "role_id": role_id.expose(), "secret_id": secret_id.expose() }),
            ),
            VaultAuth::Kubernetes { mount, role, jwt } => (
                mount,
                serde_json::json!({ "role": role, "jwt": jwt.expose() }),
            ),
        };
        let what = format!(
            "Vault {} at {}",
            self.inner.auth.login_name(),
            self.origin()
        );
        let url = self.url(
            &[
                Part::Api("auth"),
                Part::Clean("auth mount", mount),
                Part::Api("login"),
            ],
            None,
        )?;
        let sent = Instant::now();
        let (status, answer) = self
            .send(Method::POST, url, None, Some(&body), &what)
            .await?;
        drop(body);
        if !status.is_success() {
            let mut message = format!(
                "{what} failed: HTTP {}{}",
                status.as_u16(),
                self.errors_suffix(&answer)
            );
            if is_server_side(status) {
                return Err(SecretError::Unavailable(message));
            }
            if let VaultAuth::AppRole { .. } = &self.inner.auth {
                if status == StatusCode::FORBIDDEN {
                    message += " (Vault also answers so while the AppRole is locked out after repeated failed logins)";
                }
                message += &format!(
                    "; not tried again with this secret ID for {} minutes, so that retries do not lock the AppRole out",
                    REFUSED_LOGIN_HOLD.as_secs() / 60
                );
                state.refused = Some((sent, message.clone()));
            }
            return Err(SecretError::Denied(message));
        }
        let lease = parse_auth(&answer).ok_or_else(|| {
            SecretError::Invalid(format!("{what}: the answer has no client token"))
        })?;
        state.token = Some(lease.token);
        state.generation += 1;
        state.since = sent;
        state.lease = (lease.lease > 0).then(|| Duration::from_secs(lease.lease));
        state.renewable = lease.renewable;
        state.full_lease = Duration::from_secs(lease.lease);
        state.refused = None;
        self.inner.logins.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// `POST /v1/auth/token/renew-self`. A lease shorter than the token first got means Vault
    /// capped it at the max TTL: no renewal after this one will help.
    async fn renew(&self, state: &mut TokenState) -> Result<(), SecretError> {
        let token = state
            .token
            .clone()
            .ok_or_else(|| SecretError::Unavailable("no Vault token to renew".into()))?;
        let what = format!("Vault token renewal at {}", self.origin());
        let url = self.url(&[Part::Api("auth/token/renew-self")], None)?;
        let sent = Instant::now();
        let (status, answer) = self
            .send(
                Method::POST,
                url,
                Some(&token),
                Some(&serde_json::json!({})),
                &what,
            )
            .await?;
        if !status.is_success() {
            return Err(self.status_error(status, &what, &answer));
        }
        let lease = parse_auth(&answer)
            .ok_or_else(|| SecretError::Invalid(format!("{what}: the answer has no auth lease")))?;
        let granted = Duration::from_secs(lease.lease);
        state.since = sent;
        state.lease = Some(granted);
        state.renewable = lease.renewable && granted >= state.full_lease;
        self.inner.renewals.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// `GET /v1/auth/token/lookup-self`: the token's data, or None if Vault refuses the token.
    async fn lookup_self(
        &self,
        token: &SecretValue,
    ) -> Result<Option<serde_json::Value>, SecretError> {
        let what = format!("Vault token lookup at {}", self.origin());
        let url = self.url(&[Part::Api("auth/token/lookup-self")], None)?;
        let (status, answer) = self
            .send(Method::GET, url, Some(token), None, &what)
            .await?;
        if is_server_side(status) {
            return Err(self.status_error(status, &what, &answer));
        }
        if !status.is_success() {
            return Ok(None);
        }
        // Only the lease fields are kept: the answer also carries the token's own id.
        let data = serde_json::from_slice::<serde_json::Value>(&answer)
            .ok()
            .and_then(|j| j.get("data").cloned())
            .map(|d| {
                let mut kept = serde_json::Map::new();
                for key in ["ttl", "renewable", "creation_ttl"] {
                    if let Some(v) = d.get(key) {
                        kept.insert(key.to_string(), v.clone());
                    }
                }
                serde_json::Value::Object(kept)
            });
        Ok(Some(data.unwrap_or_default()))
    }

    /// Why a read on `mount` is not a KV v2 read, from `sys/internal/ui/mounts/{mount}` (which any
    /// token with access to something under the mount may ask); None if it is KV v2 or unknown.
    async fn mount_mismatch(&self, mount: &str, what: &str) -> Option<SecretError> {
        let (token, _) = self.token().await.ok()?;
        let url = self
            .url(
                &[
                    Part::Api("sys/internal/ui/mounts"),
                    Part::Clean("mount", mount),
                ],
                None,
            )
            .ok()?;
        let (status, answer) = self
            .send(Method::GET, url, Some(&token), None, what)
            .await
            .ok()?;
        if !status.is_success() {
            return None;
        }
        let json: serde_json::Value = serde_json::from_slice(&answer).ok()?;
        let kind = json.pointer("/data/type")?.as_str()?.to_string();
        let version = json
            .pointer("/data/options/version")
            .and_then(|v| v.as_str())
            .unwrap_or("1");
        match (kind.as_str(), version) {
            ("kv", "2") => None,
            ("kv", _) | ("generic", _) => Some(SecretError::Invalid(format!(
                "{what}: the mount {mount:?} is KV version 1, not KV version 2 (enable a KV v2 mount or upgrade it with `bao kv enable-versioning`)"
            ))),
            (other, _) => Some(SecretError::Invalid(format!(
                "{what}: the mount {mount:?} is a {other:?} secrets engine, not KV version 2"
            ))),
        }
    }

    fn dead_static_token(&self) -> SecretError {
        SecretError::Denied(format!(
            "Vault at {} refused the token (expired or revoked?); token auth cannot log in again",
            self.origin()
        ))
    }

    /// Vault's `{"errors": [...]}` name the problem ("permission denied"), not values; scrubbed
    /// of our own secrets all the same.
    fn errors_suffix(&self, body: &[u8]) -> String {
        let errors = vault_errors(body);
        if errors.is_empty() {
            String::new()
        } else {
            format!(": {}", self.scrub(truncate(&errors, 200)))
        }
    }

    fn status_error(&self, status: StatusCode, what: &str, body: &[u8]) -> SecretError {
        let message = format!(
            "{what}: HTTP {}{}",
            status.as_u16(),
            self.errors_suffix(body)
        );
        match status {
            StatusCode::NOT_FOUND => SecretError::NotFound(message),
            StatusCode::FORBIDDEN | StatusCode::UNAUTHORIZED => SecretError::Denied(message),
            s if is_server_side(s) => SecretError::Unavailable(message),
            _ => SecretError::Invalid(message),
        }
    }

    /// `text` with every credential of our auth replaced, should Vault ever echo one.
    fn scrub(&self, text: &str) -> String {
        let mut text = text.to_string();
        for secret in self.inner.auth.secrets() {
            if secret.len() >= 4 {
                text = text.replace(secret, "<redacted>");
            }
        }
        text
    }
}

/// Worth retrying later: the server failed, is sealed or standby (5xx), or rate-limits (429).
fn is_server_side(status: StatusCode) -> bool {
    status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS
}

/// `Vault KV v2 {mount}/{path}[ version N] at {origin}`: what a read is about, in every message.
pub(crate) fn kv2_what(mount: &str, path: &str, version: Option<u64>, origin: &str) -> String {
    let version = version.map(|v| format!(" version {v}")).unwrap_or_default();
    format!(
        "Vault KV v2 {}/{}{version} at {origin}",
        mount.trim_matches('/'),
        path.trim_matches('/')
    )
}

/// `data.data` and `data.metadata.version` of a KV v2 read; None if the answer is not that shape.
fn parse_kv2(json: &serde_json::Value) -> Option<Kv2Secret> {
    let version = json.pointer("/data/metadata/version")?.as_u64()?;
    let fields = json.pointer("/data/data")?.as_object()?;
    let mut data = BTreeMap::new();
    let mut non_string = BTreeSet::new();
    for (key, value) in fields {
        match value {
            serde_json::Value::String(s) => {
                data.insert(key.clone(), SecretValue::new(s.as_str()));
            }
            _ => {
                non_string.insert(key.clone());
            }
        }
    }
    Some(Kv2Secret {
        version,
        data,
        non_string,
    })
}

/// The `auth` block of a login or renewal answer.
struct AuthLease {
    token: SecretValue,
    lease: u64,
    renewable: bool,
}

fn parse_auth(body: &[u8]) -> Option<AuthLease> {
    let json: serde_json::Value = serde_json::from_slice(body).ok()?;
    let auth = json.get("auth")?;
    Some(AuthLease {
        token: SecretValue::new(auth.get("client_token")?.as_str()?),
        lease: auth
            .get("lease_duration")
            .and_then(|v| v.as_u64())
            .unwrap_or(0),
        renewable: auth
            .get("renewable")
            .and_then(|v| v.as_bool())
            .unwrap_or(false),
    })
}

fn vault_errors(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
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
        .unwrap_or_default()
}

/// One piece of a request path: words of Vault's API, or a caller's mount/path, checked and
/// escaped segment by segment.
pub(crate) enum Part<'a> {
    Api(&'static str),
    Clean(&'static str, &'a str),
}

/// `{address}/v1/{parts…}[?key=value]`; `..`, `.` and empty segments of a caller's value refused.
pub(crate) fn api_url(
    base: &Url,
    parts: &[Part<'_>],
    query: Option<(&str, String)>,
) -> Result<Url, SecretError> {
    let mut url = base.clone();
    url.set_query(None);
    url.set_fragment(None);
    {
        let mut segments = url.path_segments_mut().map_err(|_| {
            SecretError::Invalid(format!("Vault address {:?} has no path", base.as_str()))
        })?;
        segments.pop_if_empty().push("v1");
        for part in parts {
            match part {
                Part::Api(words) => {
                    segments.extend(words.split('/'));
                }
                Part::Clean(what, value) => {
                    segments.extend(clean_segments(what, value)?);
                }
            }
        }
    }
    if let Some((key, value)) = query {
        url.query_pairs_mut().append_pair(key, &value);
    }
    Ok(url)
}

/// The segments of a mount or path, refusing `..`, `.` and empty ones (`a//b`, `""`).
pub(crate) fn clean_segments(what: &str, value: &str) -> Result<Vec<String>, SecretError> {
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

    fn kv2_url(address: &str, mount: &str, path: &str) -> Result<Url, SecretError> {
        let base = Url::parse(address).unwrap();
        api_url(
            &base,
            &[
                Part::Clean("mount", mount),
                Part::Api("data"),
                Part::Clean("path", path),
            ],
            None,
        )
    }

    #[test]
    fn urls_escape_and_nest() {
        let url = kv2_url("https://vault.example:8200/", "kv", "team a/vsphere").unwrap();
        assert_eq!(
            url.as_str(),
            "https://vault.example:8200/v1/kv/data/team%20a/vsphere"
        );
        let url = kv2_url("http://127.0.0.1:8200", "secret", "/a/b/").unwrap();
        assert_eq!(url.as_str(), "http://127.0.0.1:8200/v1/secret/data/a/b");
        let url = kv2_url("https://proxy.example/vault/", "team/kv", "a").unwrap();
        assert_eq!(
            url.as_str(),
            "https://proxy.example/vault/v1/team/kv/data/a"
        );
        let base = Url::parse("http://v:1?x=y#f").unwrap();
        let url = api_url(
            &base,
            &[Part::Api("auth/token/renew-self")],
            Some(("version", "3".into())),
        )
        .unwrap();
        assert_eq!(
            url.as_str(),
            "http://v:1/v1/auth/token/renew-self?version=3"
        );
    }

    #[test]
    fn urls_refuse_traversal() {
        for (mount, path) in [
            ("secret", "a/../b"),
            ("secret", ""),
            ("a//b", "x"),
            ("..", "x"),
        ] {
            assert!(
                matches!(
                    kv2_url("http://v", mount, path),
                    Err(SecretError::Invalid(_))
                ),
                "{mount} {path}"
            );
        }
        let approle = VaultAuth::AppRole {
            mount: "../sys".into(),
            role_id: SecretValue::new("r"),
            secret_id: SecretValue::new("s"),
        };
        assert!(matches!(
            VaultClient::new("http://v", approle, VaultOptions::default()),
            Err(SecretError::Invalid(_))
        ));
        assert!(matches!(
            VaultClient::new(
                "file:///x",
                VaultAuth::Token(SecretValue::new("t")),
                VaultOptions::default()
            ),
            Err(SecretError::Invalid(_))
        ));
    }

    #[test]
    fn debug_hides_credentials() {
        let auth = VaultAuth::approle(SecretValue::new("role-1d-x"), SecretValue::new("s3cret-1d"));
        let client = VaultClient::new("http://127.0.0.1:1", auth, VaultOptions::default()).unwrap();
        let debug = format!("{client:?}");
        assert!(
            !debug.contains("role-1d-x") && !debug.contains("s3cret-1d"),
            "{debug}"
        );
        assert!(debug.contains("AppRole"), "{debug}");
        let token = VaultClient::new(
            "http://127.0.0.1:1",
            VaultAuth::Token(SecretValue::new("s.tok3n")),
            VaultOptions::default(),
        )
        .unwrap();
        assert!(!format!("{token:?}").contains("s.tok3n"));
        let secret = parse_kv2(&serde_json::json!({
            "data": { "data": { "password": "hunter2", "port": 1 }, "metadata": { "version": 4 } }
        }))
        .unwrap();
        let debug = format!("{secret:?}");
        assert!(!debug.contains("hunter2") && debug.contains("password") && debug.contains('4'));
        assert_eq!(secret.data["password"].expose(), "hunter2");
        assert!(secret.non_string.contains("port"));
    }

    #[test]
    fn scrub_removes_own_secrets() {
        let auth = VaultAuth::kubernetes("r", SecretValue::new("eyJhbGciOi.jwt.sig"));
        let client = VaultClient::new("http://127.0.0.1:1", auth, VaultOptions::default()).unwrap();
        let scrubbed = client.scrub("bad token eyJhbGciOi.jwt.sig here");
        assert_eq!(scrubbed, "bad token <redacted> here");
    }
}
