//! `banlieue:host/http`: outbound HTTP to the Provider's own endpoint, nothing else.
//!
//! [`HttpGrant::check`] is the one choke point: every request passes it before
//! a socket is opened. It allows only the granted scheme, host and port, refuses
//! URLs with credentials, resolves the name itself and allows only the addresses
//! the name had when the grant was made (so a name re-pointed later — DNS
//! rebinding — is refused), refuses link-local and cloud-metadata addresses
//! unless granted, and pins the connection to the checked address. Redirects are
//! returned to the guest, never followed.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::Semaphore;

pub use super::bindings::banlieue::host::http::{Request, Response};
use super::bindings::banlieue::host::http::Host;
use super::WitError;
use crate::state::HostState;

/// Resolves host names (pluggable so tests can serve hostile answers).
pub trait Resolve: Send + Sync + std::fmt::Debug {
    fn resolve(&self, host: &str, port: u16) -> futures::future::BoxFuture<'static, std::io::Result<Vec<IpAddr>>>;
}

/// The system resolver.
#[derive(Debug, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(&self, host: &str, port: u16) -> futures::future::BoxFuture<'static, std::io::Result<Vec<IpAddr>>> {
        let target = format!("{host}:{port}");
        Box::pin(async move { Ok(tokio::net::lookup_host(target).await?.map(|a| a.ip()).collect()) })
    }
}

/// What a component may reach over HTTP.
#[derive(Clone, Debug)]
pub struct HttpGrant {
    scheme: String,
    host: String,
    port: u16,
    /// Addresses the host had when the grant was made.
    addresses: BTreeSet<IpAddr>,
    /// PEM CA bundle trusted for the endpoint (system roots when `None`). Like the
    /// insecure flag, set it before the first request: clients are built once per grant.
    pub ca_bundle: Option<String>,
    pub insecure_skip_tls_verify: bool,
    /// Allow link-local / metadata addresses (only when a Provider really lives there).
    pub allow_link_local: bool,
    pub max_response_bytes: usize,
    pub max_request_time: Duration,
    /// Requests in flight at once, shared by every call of one Provider.
    pub concurrency: Arc<Semaphore>,
    resolver: Arc<dyn Resolve>,
    /// One client per checked address, shared by every call under this grant: building one
    /// loads the trust roots (milliseconds of CPU), and a kept one reuses its connections.
    clients: Arc<std::sync::Mutex<std::collections::HashMap<SocketAddr, reqwest::Client>>>,
}

/// Default caps.
pub const MAX_RESPONSE_BYTES: usize = 16 << 20;
pub const MAX_REQUEST_TIME: Duration = Duration::from_secs(30);
pub const MAX_CONCURRENT: usize = 8;

fn denied(msg: impl Into<String>) -> WitError {
    WitError::Denied(msg.into())
}

/// Headers the websocket handshake sets itself: a driver's are dropped, not merged (a
/// subprotocol, `Sec-WebSocket-Protocol`, is the driver's to ask for).
fn is_hop_header(name: &str) -> bool {
    ["host", "connection", "upgrade", "content-length", "sec-websocket-key", "sec-websocket-version"].iter().any(|h| name.eq_ignore_ascii_case(h))
}

/// Link-local, metadata and other addresses no provider endpoint should be on.
fn is_special(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            v4.is_link_local() // 169.254.0.0/16, incl. 169.254.169.254 (cloud metadata)
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.octets() == [100, 100, 100, 200] // Alibaba metadata
        }
        IpAddr::V6(v6) => {
            (v6.segments()[0] & 0xffc0) == 0xfe80 // fe80::/10
                || v6.is_unspecified()
                || v6.is_multicast()
                || v6.segments() == [0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254] // AWS metadata (IPv6)
                || v6.to_ipv4_mapped().is_some_and(|v4| is_special(IpAddr::V4(v4)))
        }
    }
}

impl HttpGrant {
    /// A grant for one endpoint (`https://host[:port]`), resolving it now.
    pub async fn for_endpoint(endpoint: &str) -> Result<HttpGrant, String> {
        Self::with_resolver(endpoint, Arc::new(SystemResolver)).await
    }

    pub async fn with_resolver(endpoint: &str, resolver: Arc<dyn Resolve>) -> Result<HttpGrant, String> {
        let url = url::Url::parse(endpoint).map_err(|e| format!("endpoint {endpoint:?} is not a URL: {e}"))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!("endpoint {endpoint:?} must be http:// or https://"));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err("endpoint must not carry credentials; use credentialsRef".into());
        }
        let host = url.host_str().ok_or("endpoint has no host")?.trim_matches(['[', ']']).to_ascii_lowercase();
        let port = url.port_or_known_default().ok_or("endpoint has no port")?;
        let addresses: BTreeSet<IpAddr> = match host.parse::<IpAddr>() {
            Ok(ip) => [ip].into(),
            Err(_) => resolver.resolve(&host, port).await.map_err(|e| format!("resolving {host}: {e}"))?.into_iter().collect(),
        };
        if addresses.is_empty() {
            return Err(format!("{host} resolves to no address"));
        }
        Ok(HttpGrant {
            scheme: url.scheme().to_string(),
            host,
            port,
            addresses,
            ca_bundle: None,
            insecure_skip_tls_verify: false,
            allow_link_local: false,
            max_response_bytes: MAX_RESPONSE_BYTES,
            max_request_time: MAX_REQUEST_TIME,
            concurrency: Arc::new(Semaphore::new(MAX_CONCURRENT)),
            resolver,
            clients: Arc::default(),
        })
    }

    /// The choke point: may this URL be fetched, and at which address?
    pub async fn check(&self, raw: &str) -> Result<(url::Url, SocketAddr), WitError> {
        let url = url::Url::parse(raw).map_err(|e| WitError::InvalidSpec(format!("invalid URL {raw:?}: {e}")))?;
        if url.scheme() != self.scheme {
            return Err(denied(format!("scheme {:?} is not granted (only {}://{}:{})", url.scheme(), self.scheme, self.host, self.port)));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(denied("URLs with credentials (userinfo) are refused; use the secrets capability"));
        }
        let host = url.host_str().unwrap_or("").trim_matches(['[', ']']).to_ascii_lowercase();
        let port = url.port_or_known_default().unwrap_or(0);
        if host != self.host || port != self.port {
            return Err(denied(format!("{host}:{port} is outside the grant (only {}:{})", self.host, self.port)));
        }
        let resolved: Vec<IpAddr> = match host.parse::<IpAddr>() {
            Ok(ip) => vec![ip],
            Err(_) => tokio::time::timeout(Duration::from_secs(5), self.resolver.resolve(&host, port))
                .await
                .map_err(|_| WitError::Unavailable(format!("resolving {host} timed out")))?
                .map_err(|e| WitError::Unavailable(format!("resolving {host}: {e}")))?,
        };
        let ip = resolved
            .iter()
            .copied()
            .find(|ip| self.addresses.contains(ip))
            .ok_or_else(|| denied(format!("{host} now resolves to {resolved:?}, outside the granted addresses {:?}", self.addresses)))?;
        if is_special(ip) && !self.allow_link_local {
            return Err(denied(format!("{ip} is a link-local or metadata address; not granted")));
        }
        Ok((url, SocketAddr::new(ip, port)))
    }

    /// The client pinned to `addr` (an address [`check`](Self::check) allowed), built once.
    fn client(&self, addr: SocketAddr) -> Result<reqwest::Client, WitError> {
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = clients.get(&addr) {
            return Ok(c.clone());
        }
        let client = self.build_client(addr)?;
        clients.insert(addr, client.clone());
        Ok(client)
    }

    fn build_client(&self, addr: SocketAddr) -> Result<reqwest::Client, WitError> {
        self.build_client_for(addr, false)
    }

    /// A client pinned to `addr`; `http1_only` for a websocket, which upgrades an HTTP/1.1
    /// connection (a server offered HTTP/2 by ALPN may take it, and h2 has no upgrade).
    fn build_client_for(&self, addr: SocketAddr, http1_only: bool) -> Result<reqwest::Client, WitError> {
        // reqwest is built without a bundled crypto provider; use ring, process-wide.
        static PROVIDER: std::sync::Once = std::sync::Once::new();
        PROVIDER.call_once(|| {
            let _ = rustls::crypto::ring::default_provider().install_default();
        });
        let mut b = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .resolve(&self.host, addr)
            .connect_timeout(self.max_request_time.min(Duration::from_secs(10)));
        if let Some(pem) = &self.ca_bundle {
            let certs = reqwest::Certificate::from_pem_bundle(pem.as_bytes())
                .map_err(|e| WitError::InvalidSpec(format!("Provider CA bundle is not valid PEM: {e}")))?;
            b = b.tls_certs_only(certs);
        }
        if self.insecure_skip_tls_verify {
            b = b.tls_danger_accept_invalid_certs(true);
        }
        if http1_only {
            b = b.http1_only();
        }
        b.build().map_err(|e| WitError::Internal(format!("HTTP client: {e}")))
    }

    /// Send a request the guest asked for, within the grant's limits, in a span of its own
    /// (method, and the URL without its query, which may carry a ticket).
    pub async fn send(&self, req: Request) -> Result<Response, WitError> {
        use tracing::Instrument;
        let shown = url::Url::parse(&req.url).map(|mut u| {
            u.set_query(None);
            u.to_string()
        });
        let span = tracing::info_span!(
            "HTTP request",
            otel.name = %req.method.to_uppercase(),
            otel.kind = "client",
            http.request.method = %req.method.to_uppercase(),
            url.full = shown.as_deref().unwrap_or("(invalid)"),
            http.response.status_code = tracing::field::Empty,
        );
        let result = self.send_checked(req).instrument(span.clone()).await;
        if let Ok(resp) = &result {
            span.record("http.response.status_code", resp.status);
        }
        result
    }

    async fn send_checked(&self, req: Request) -> Result<Response, WitError> {
        let (url, addr) = self.check(&req.url).await?;
        let method = reqwest::Method::from_bytes(req.method.as_bytes())
            .map_err(|_| WitError::InvalidSpec(format!("invalid HTTP method {:?}", req.method)))?;
        let timeout = req.timeout_ms.map(|ms| Duration::from_millis(ms.into())).unwrap_or(self.max_request_time).min(self.max_request_time);
        let _permit = self.concurrency.acquire().await.map_err(|_| WitError::Unavailable("HTTP capability closed".into()))?;
        let mut rb = self.request(method, url, addr, &req.headers, timeout)?;
        if let Some(body) = req.body {
            rb = rb.body(body);
        }
        let resp = rb.send().await.map_err(|e| self.send_error(e, timeout))?;
        let status = resp.status().as_u16();
        let headers = resp
            .headers()
            .iter()
            .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
            .collect();
        if resp.content_length().is_some_and(|n| n as usize > self.max_response_bytes) {
            return Err(denied(format!("response larger than {} bytes", self.max_response_bytes)));
        }
        let mut body = Vec::new();
        let mut stream = resp.bytes_stream();
        let read = tokio::time::timeout(timeout, async {
            while let Some(chunk) = stream.next().await {
                // The request's own timeout covers the body too, and fires first: a backend that
                // stalls halfway through its answer is named as such, not as a decoding error.
                let chunk = chunk.map_err(|e| {
                    if e.is_timeout() {
                        WitError::Unavailable(format!("{} did not finish the response within {timeout:?}", self.host))
                    } else {
                        WitError::Unavailable(format!("reading the response from {}: {e}", self.host))
                    }
                })?;
                if body.len() + chunk.len() > self.max_response_bytes {
                    return Err(denied(format!("response larger than {} bytes", self.max_response_bytes)));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(())
        })
        .await;
        match read {
            Ok(r) => r?,
            Err(_) => return Err(WitError::Unavailable(format!("{} did not finish the response within {timeout:?}", self.host))),
        }
        Ok(Response { status, headers, body })
    }

    /// A request to a checked URL and address, with the guest's headers (never `Host`).
    fn request(&self, method: reqwest::Method, url: url::Url, addr: SocketAddr, headers: &[(String, String)], timeout: Duration) -> Result<reqwest::RequestBuilder, WitError> {
        let client = self.client(addr)?;
        crate::usage::http_request();
        let mut rb = client.request(method, url).timeout(timeout);
        for (k, v) in headers {
            if k.eq_ignore_ascii_case("host") || k.eq_ignore_ascii_case("content-length") {
                continue; // the URL decides the host, the body its length
            }
            rb = rb.header(k, v);
        }
        Ok(rb)
    }

    fn send_error(&self, e: reqwest::Error, timeout: Duration) -> WitError {
        if e.is_timeout() {
            WitError::Unavailable(format!("{} did not answer within {timeout:?}", self.host))
        } else {
            WitError::Unavailable(format!("request to {} failed: {e}", self.host))
        }
    }

    /// Open `raw` as a websocket, checked like [`send`](Self::send): a backend's console (the
    /// console capability's way out). The upgraded connection is the caller's to speak
    /// websocket on; it is bounded by the session, not by the grant's request time.
    pub async fn websocket(&self, raw: &str, headers: &[(String, String)]) -> Result<reqwest::Upgraded, WitError> {
        use tokio_tungstenite::tungstenite::handshake::{client::generate_key, derive_accept_key};
        let (url, addr) = self.check(raw).await?;
        let client = self.build_client_for(addr, true)?;
        crate::usage::http_request();
        let key = generate_key();
        let mut rb = client
            .get(url)
            .header(reqwest::header::CONNECTION, "Upgrade")
            .header(reqwest::header::UPGRADE, "websocket")
            .header(reqwest::header::SEC_WEBSOCKET_VERSION, "13")
            .header(reqwest::header::SEC_WEBSOCKET_KEY, &key);
        for (k, v) in headers {
            if !is_hop_header(k) {
                rb = rb.header(k, v);
            }
        }
        let timeout = self.max_request_time;
        let resp = tokio::time::timeout(timeout, rb.send())
            .await
            .map_err(|_| WitError::Unavailable(format!("{} did not answer within {timeout:?}", self.host)))?
            .map_err(|e| self.send_error(e, timeout))?;
        if resp.status() != reqwest::StatusCode::SWITCHING_PROTOCOLS {
            return Err(WitError::Unavailable(format!("{} refused the websocket: HTTP {}", self.host, resp.status())));
        }
        let accept = resp.headers().get(reqwest::header::SEC_WEBSOCKET_ACCEPT).map(|v| v.as_bytes().to_vec());
        if accept.as_deref() != Some(derive_accept_key(key.as_bytes()).as_bytes()) {
            return Err(WitError::Unavailable(format!("{} answered the websocket with a wrong Sec-WebSocket-Accept", self.host)));
        }
        resp.upgrade().await.map_err(|e| WitError::Unavailable(format!("websocket to {}: {e}", self.host)))
    }

    /// Stream `len` bytes as the body of one PUT or POST to `raw`, checked like [`send`](Self::send)
    /// (the transfer capability's way out). The time limit grows with the size (4 MiB/s at
    /// least, on top of the grant's request time); the response body is read and dropped.
    pub async fn upload(&self, method: &str, raw: &str, headers: &[(String, String)], body: reqwest::Body, len: u64) -> Result<u16, WitError> {
        let (url, addr) = self.check(raw).await?;
        let method = match method {
            "PUT" => reqwest::Method::PUT,
            "POST" => reqwest::Method::POST,
            other => return Err(WitError::InvalidSpec(format!("an image is sent with PUT or POST, not {other:?}"))),
        };
        let timeout = self.max_request_time + Duration::from_secs(len / (4 << 20));
        let _permit = self.concurrency.acquire().await.map_err(|_| WitError::Unavailable("HTTP capability closed".into()))?;
        let rb = self.request(method, url, addr, headers, timeout)?.header(reqwest::header::CONTENT_LENGTH, len).body(body);
        let resp = rb.send().await.map_err(|e| self.send_error(e, timeout))?;
        let status = resp.status().as_u16();
        let mut stream = resp.bytes_stream();
        let mut read = 0usize;
        while let Some(chunk) = stream.next().await {
            read += chunk.map_err(|e| WitError::Unavailable(format!("reading the upload's response: {e}")))?.len();
            if read > self.max_response_bytes {
                break;
            }
        }
        Ok(status)
    }
}

impl HttpGrant {
    /// GET `raw`, checked like [`send`](Self::send), handing the body to `sink` a chunk at a
    /// time (the transfer capability's way in): at most `max` bytes, within a time limit
    /// that grows with them (4 MiB/s at least). An HTTP error status is `unavailable`.
    pub async fn download(&self, raw: &str, headers: &[(String, String)], max: u64, mut sink: impl FnMut(&[u8]) -> std::io::Result<()>) -> Result<u64, WitError> {
        let (url, addr) = self.check(raw).await?;
        let _permit = self.concurrency.acquire().await.map_err(|_| WitError::Unavailable("HTTP capability closed".into()))?;
        let timeout = self.max_request_time + Duration::from_secs(max / (4 << 20));
        let resp = self.request(reqwest::Method::GET, url, addr, headers, timeout)?.send().await.map_err(|e| self.send_error(e, timeout))?;
        let status = resp.status().as_u16();
        if !(200..300).contains(&status) {
            return Err(WitError::Unavailable(format!("GET {raw}: the backend answered HTTP {status}")));
        }
        if let Some(len) = resp.content_length().filter(|l| *l > max) {
            return Err(WitError::InvalidSpec(format!("GET {raw}: {len} bytes, more than the {max} allowed")));
        }
        let mut stream = resp.bytes_stream();
        let mut total = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| WitError::Unavailable(format!("GET {raw}: cut off after {total} bytes: {e}")))?;
            total += chunk.len() as u64;
            sink(&chunk).map_err(|e| match e.kind() {
                std::io::ErrorKind::FileTooLarge => WitError::InvalidSpec(e.to_string()),
                _ => WitError::Internal(format!("keeping what GET {raw} sent: {e}")),
            })?;
        }
        Ok(total)
    }
}

impl Host for HostState {
    async fn send(&mut self, req: Request) -> Result<Response, WitError> {
        let changes = !(req.method.eq_ignore_ascii_case("GET") || req.method.eq_ignore_ascii_case("HEAD"));
        let result = match &self.grants.http {
            Some(g) => g.clone().send(req).await.map_err(|e| self.refusal(e)),
            None => Err(self.refusal(denied("the http capability is not granted to this component"))),
        };
        self.observed(changes, result).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Fixed(std::sync::Mutex<Vec<IpAddr>>);
    impl Resolve for Fixed {
        fn resolve(&self, _: &str, _: u16) -> futures::future::BoxFuture<'static, std::io::Result<Vec<IpAddr>>> {
            let v = self.0.lock().unwrap().clone();
            Box::pin(async move { Ok(v) })
        }
    }

    #[tokio::test]
    async fn a_backend_that_stalls_halfway_through_its_answer_is_named_as_such() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = sock.read(&mut buf).await;
            // The head and 10 of the 100 bytes it announces, then nothing.
            sock.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789").await.unwrap();
            let _ = sock.read(&mut buf).await;
        });
        let mut g = HttpGrant::for_endpoint(&format!("http://127.0.0.1:{port}")).await.unwrap();
        g.max_request_time = Duration::from_millis(500);
        let req = Request { method: "GET".into(), url: format!("http://127.0.0.1:{port}/x"), headers: vec![], body: None, timeout_ms: None };
        match g.send(req).await {
            Err(WitError::Unavailable(m)) => assert!(m.contains("did not finish the response within 500ms"), "{m}"),
            other => panic!("expected unavailable, got {other:?}"),
        }
        server.abort();
    }

    #[tokio::test]
    async fn only_the_granted_origin_passes_the_choke_point() {
        let r = Arc::new(Fixed(std::sync::Mutex::new(vec!["127.0.0.1".parse().unwrap()])));
        let g = HttpGrant::with_resolver("https://vcenter.test:8443", r.clone()).await.unwrap();
        assert!(g.check("https://vcenter.test:8443/sdk").await.is_ok());
        assert!(g.check("https://VCENTER.test:8443/x?y=1").await.is_ok());
        for bad in [
            "http://vcenter.test:8443/sdk",           // scheme
            "https://vcenter.test/sdk",               // port
            "https://other.test:8443/",               // host
            "https://user:pw@vcenter.test:8443/",     // userinfo
            "https://169.254.169.254:8443/latest",    // literal outside the grant
            "file:///etc/passwd",
        ] {
            assert!(matches!(g.check(bad).await, Err(WitError::Denied(_))), "{bad} must be denied");
        }
        // The name now points elsewhere (rebinding): refused.
        *r.0.lock().unwrap() = vec!["10.1.2.3".parse().unwrap()];
        assert!(matches!(g.check("https://vcenter.test:8443/").await, Err(WitError::Denied(_))));
    }

    #[tokio::test]
    async fn metadata_addresses_need_an_explicit_grant() {
        let r = Arc::new(Fixed(std::sync::Mutex::new(vec!["169.254.169.254".parse().unwrap()])));
        let mut g = HttpGrant::with_resolver("http://metadata.test", r).await.unwrap();
        assert!(matches!(g.check("http://metadata.test/").await, Err(WitError::Denied(_))));
        g.allow_link_local = true;
        assert!(g.check("http://metadata.test/").await.is_ok());
        assert!(is_special("fe80::1".parse().unwrap()));
        assert!(is_special("::ffff:169.254.169.254".parse().unwrap()));
        assert!(!is_special("127.0.0.1".parse().unwrap()));
    }
}
