//! banlieue's console server: one HTTPS endpoint of the provider role where a user opens a
//! VM's console as a websocket, with their own Kubernetes token.
//!
//! `GET /apis/subresources.banlieue.io/v1alpha1/namespaces/NS/virtualmachines/NAME/console`
//! (or `/vnc`), a websocket upgrade, carrying the token as `Authorization: Bearer` or, from a
//! browser, as the subprotocol `base64url.bearer.authorization.k8s.io.<token>` (as
//! kube-apiserver takes it). Everything is decided before the upgrade — who the token is
//! and whether they may (the cluster, [`super::access`]), the session bounds, the VM's
//! state, the driver's answer — so a refusal is an HTTP status with a Kubernetes `Status`
//! body saying why. Then bytes flow as binary messages both ways until one side closes,
//! the session's bounds end it, or the VM is deleted or moves; each session is audited.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use banlieue_api::provider::ConsoleEndpoint;
use banlieue_api::VirtualMachine;
use banlieue_runtime::capability::console::ConsoleStream;
use base64::Engine;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use kube::api::Api;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};

use super::access::{self, Caller, Console, Refused};
use super::open::{self, Opened};
use super::session::{Admitted, SessionLimits, Sessions};
use super::tls::ServingCert;
use crate::failure::Failure;
use crate::status::reasons::Reason;
use crate::Context;

pub use banlieue_api::console::PATH_PREFIX as PREFIX;
/// The subprotocol prefix a browser passes its token in (a browser's websocket cannot set
/// an `Authorization` header).
const TOKEN_PROTOCOL: &str = "base64url.bearer.authorization.k8s.io.";
/// Why a session ended from the VM's side (closed with `CLOSE_VM_SIDE`: kubectl vm opens
/// such a console again).
const VM_SIDE_CLOSED: &str = "the VM's console closed (the VM stopped or restarted, or its backend ended the session)";
/// How long a client may take to send its request.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// How the console server is run (`--console-*` flags).
#[derive(Clone, Debug)]
pub struct ConsoleOptions {
    /// The address to listen on.
    pub listen: SocketAddr,
    /// How users reach it (`https://host:port`); by default the address listened on.
    pub url: Option<String>,
    /// The operator's certificate and key (PEM files), and the CA bundle clients check
    /// them by (by default the certificate file); none: one is made at start.
    pub tls: Option<TlsFiles>,
    pub limits: SessionLimits,
    /// The browser page's files (`index.html` and what it loads); none: no page.
    pub page_dir: Option<PathBuf>,
}

/// An operator's serving certificate.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: Option<PathBuf>,
}

/// The console server of this process.
pub struct ConsoleServer {
    listener: Mutex<Option<std::net::TcpListener>>,
    tls: Arc<rustls::ServerConfig>,
    endpoint: ConsoleEndpoint,
    limits: SessionLimits,
    page_dir: Option<PathBuf>,
    pub sessions: Arc<Sessions>,
}

impl ConsoleServer {
    /// Listen on `options.listen` now (so the URL published names the real port).
    pub fn bind(options: &ConsoleOptions) -> anyhow::Result<Arc<ConsoleServer>> {
        let listener = std::net::TcpListener::bind(options.listen)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let url = options.url.clone().unwrap_or_else(|| format!("https://{addr}")).trim_end_matches('/').to_string();
        let cert = match &options.tls {
            Some(files) => {
                let read = |p: &PathBuf| std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("reading {}: {e}", p.display()));
                let cert_pem = read(&files.cert)?;
                let ca_pem = files.ca.as_ref().map(read).transpose()?.unwrap_or_else(|| cert_pem.clone());
                ServingCert { cert_pem, key_pem: read(&files.key)?, ca_pem }
            }
            None => {
                let host = url::Url::parse(&url).ok().and_then(|u| u.host_str().map(|h| h.trim_matches(['[', ']']).to_string()));
                let mut names: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
                names.extend(host.filter(|h| !names.contains(h)));
                if !addr.ip().is_unspecified() && !names.contains(&addr.ip().to_string()) {
                    names.push(addr.ip().to_string());
                }
                ServingCert::generate(&names)?
            }
        };
        Ok(Arc::new(ConsoleServer {
            listener: Mutex::new(Some(listener)),
            tls: cert.server_config()?,
            endpoint: ConsoleEndpoint { url, ca_bundle: cert.ca_pem },
            limits: options.limits.clone(),
            page_dir: options.page_dir.clone(),
            sessions: Arc::default(),
        }))
    }

    /// How clients reach this server, as Providers publish it.
    pub fn endpoint(&self) -> ConsoleEndpoint {
        self.endpoint.clone()
    }

    /// Serve until the process ends (called once).
    pub async fn serve(self: Arc<Self>, ctx: Arc<Context>) -> anyhow::Result<()> {
        let listener = self.listener.lock().unwrap_or_else(|e| e.into_inner()).take().ok_or_else(|| anyhow::anyhow!("the console server is already serving"))?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        tracing::info!(url = %self.endpoint.url, "serving consoles");
        let acceptor = tokio_rustls::TlsAcceptor::from(self.tls.clone());
        loop {
            let (tcp, _) = listener.accept().await?;
            let (server, ctx, acceptor) = (self.clone(), ctx.clone(), acceptor.clone());
            tokio::spawn(async move {
                let Ok(Ok(tls)) = tokio::time::timeout(HEADER_TIMEOUT, acceptor.accept(tcp)).await else { return };
                let service = hyper::service::service_fn(move |req| {
                    let (server, ctx) = (server.clone(), ctx.clone());
                    async move { Ok::<_, std::convert::Infallible>(server.handle(ctx, req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .serve_connection(TokioIo::new(tls), service)
                    .with_upgrades()
                    .await;
            });
        }
    }

    async fn handle(self: Arc<Self>, ctx: Arc<Context>, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let path = req.uri().path().to_string();
        if let Some(page) = path.strip_prefix("/console/") {
            return self.page(page);
        }
        if path == "/" || path == "/console" {
            return redirect("/console/");
        }
        let Some((namespace, name, console)) = route(&path) else {
            return status(StatusCode::NOT_FOUND, "NotFound", &format!("no console at {path}: consoles are at {PREFIX}NAMESPACE/virtualmachines/NAME/console or /vnc"));
        };
        if req.method() != hyper::Method::GET {
            return status(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", "a console is opened with GET and a websocket upgrade");
        }
        let Some(key) = req.headers().get(header::SEC_WEBSOCKET_KEY).cloned() else {
            return status(StatusCode::BAD_REQUEST, "BadRequest", "a console is a websocket: send the upgrade headers (kubectl vm console does)");
        };
        let offered = protocols(&req);
        let Some(token) = bearer(&req, &offered) else {
            return refused(&Refused::Unauthenticated("no bearer token: send your Kubernetes token (Authorization: Bearer, or the base64url.bearer.authorization.k8s.io subprotocol)".into()));
        };
        let caller = match access::authorize(&ctx.client, &token, &namespace, &name, console).await {
            Ok(c) => c,
            Err(r) => {
                tracing::info!(vm = %format!("{namespace}/{name}"), console = console.subresource(), "console refused: {}", r.message());
                return refused(&r);
            }
        };
        let vm_key = format!("{namespace}/{name}");
        let admitted = match self.sessions.admit(&self.limits, &vm_key, &caller.user) {
            Ok(a) => a,
            Err(f) => return failed(&f),
        };
        let opened = match open::open(&ctx, &namespace, &name, console).await {
            Ok(o) => o,
            Err(f) => {
                tracing::info!(vm = %vm_key, user = %caller.user, console = console.subresource(), "console not opened: {f}");
                return failed(&f);
            }
        };
        // The subprotocol answered is the first one offered that is not the token.
        let protocol = offered.iter().find(|p| !p.starts_with(TOKEN_PROTOCOL)).cloned();
        let mut response = Response::new(Full::new(Bytes::new()));
        *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let h = response.headers_mut();
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        if let Ok(accept) = HeaderValue::from_str(&derive_accept_key(key.as_bytes())) {
            h.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
        }
        if let Some(p) = protocol.and_then(|p| HeaderValue::from_str(&p).ok()) {
            h.insert(header::SEC_WEBSOCKET_PROTOCOL, p);
        }
        let limits = self.limits.clone();
        tokio::spawn(async move {
            match hyper::upgrade::on(req).await {
                Ok(upgraded) => {
                    let socket = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
                    session(&ctx, socket, opened, caller, console, &limits, admitted).await;
                }
                Err(e) => tracing::info!(vm = %vm_key, "the console's upgrade failed: {e}"),
            }
        });
        response
    }

    /// The browser page's files.
    fn page(&self, file: &str) -> Response<Full<Bytes>> {
        let Some(dir) = &self.page_dir else {
            return status(StatusCode::NOT_FOUND, "NotFound", "this console server has no browser page (--console-page-dir)");
        };
        let file = if file.is_empty() { "index.html" } else { file };
        // One level of plain names: nothing outside the page's directory is served.
        if !file.split('/').all(|part| !part.is_empty() && part != ".." && !part.starts_with('.')) {
            return status(StatusCode::NOT_FOUND, "NotFound", "no such file");
        }
        match std::fs::read(dir.join(file)) {
            Ok(bytes) => {
                let mut response = Response::new(Full::new(Bytes::from(bytes)));
                let kind = match file.rsplit('.').next() {
                    Some("html") => "text/html; charset=utf-8",
                    Some("js") | Some("mjs") => "text/javascript; charset=utf-8",
                    Some("css") => "text/css; charset=utf-8",
                    Some("json") => "application/json",
                    Some("svg") => "image/svg+xml",
                    _ => "application/octet-stream",
                };
                response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
                // The page runs no script but its own and is framed by nobody; inline styles
                // are allowed, as xterm.js styles the terminal with <style> elements and
                // style attributes (its colours).
                response.headers_mut().insert(
                    header::CONTENT_SECURITY_POLICY,
                    HeaderValue::from_static("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'"),
                );
                response
            }
            Err(_) => status(StatusCode::NOT_FOUND, "NotFound", &format!("no file {file}")),
        }
    }
}

/// `(namespace, name, console)` of a console path.
fn route(path: &str) -> Option<(String, String, Console)> {
    let rest = path.strip_prefix(PREFIX)?;
    let parts: Vec<&str> = rest.split('/').collect();
    let [namespace, "virtualmachines", name, sub] = parts.as_slice() else { return None };
    let console = match *sub {
        "console" => Console::Serial,
        "vnc" => Console::Vnc,
        _ => return None,
    };
    (!namespace.is_empty() && !name.is_empty()).then(|| (namespace.to_string(), name.to_string(), console))
}

/// The subprotocols the client offered.
fn protocols(req: &Request<Incoming>) -> Vec<String> {
    req.headers()
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

/// The caller's token: `Authorization: Bearer`, or the token subprotocol.
fn bearer(req: &Request<Incoming>, offered: &[String]) -> Option<String> {
    if let Some(token) = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer ")) {
        return Some(token.trim().to_string()).filter(|t| !t.is_empty());
    }
    let encoded = offered.iter().find_map(|p| p.strip_prefix(TOKEN_PROTOCOL))?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(encoded.trim_end_matches('=')).ok()?;
    String::from_utf8(bytes).ok().filter(|t| !t.is_empty())
}

/// Pump one session, audited when it opens and when it ends.
async fn session(ctx: &Context, socket: WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>, opened: Opened, caller: Caller, console: Console, limits: &SessionLimits, admitted: Admitted) {
    let Opened { stream, vm, machine, provider } = opened;
    let reference = vm.object_ref(&());
    let (key, what) = (crate::key(&vm), open::what(console));
    tracing::info!(vm = %key, user = %caller.user, console = console.subresource(), %provider, "console opened");
    ctx.event(&reference, false, Reason::ConsoleOpened, "Console", format!("{} opened the {what} (Provider {provider})", caller.user)).await;
    let started = Instant::now();
    let api = Api::<VirtualMachine>::namespaced(ctx.client.clone(), &vm.namespace().unwrap_or_default());
    let ends = gone_or_moved(api, vm.name_any(), vm.uid().unwrap_or_default(), machine);
    let ended = pump(socket, stream, limits, ends).await;
    drop(admitted);
    let secs = started.elapsed().as_secs();
    tracing::info!(vm = %key, user = %caller.user, console = console.subresource(), seconds = secs, bytes_in = ended.bytes_in, bytes_out = ended.bytes_out, "console closed: {}", ended.why);
    let note = format!("{}'s {what} closed after {secs}s ({}): {} bytes in, {} bytes out", caller.user, ended.why, ended.bytes_in, ended.bytes_out);
    ctx.event(&reference, false, Reason::ConsoleClosed, "Console", note).await;
}

/// How a session ended.
struct Ended {
    why: String,
    bytes_in: u64,
    bytes_out: u64,
}

/// Bytes both ways until one side closes, the session idles or lasts too long, or `ends`
/// says why it must stop; the user is told why in the close frame.
async fn pump<S>(socket: WebSocketStream<S>, stream: ConsoleStream, limits: &SessionLimits, ends: impl Future<Output = String>) -> Ended
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let ConsoleStream { input, mut output } = stream;
    let (mut to_user, mut from_user) = socket.split();
    let deadline = tokio::time::Instant::now() + limits.max_duration;
    let mut idle_until = tokio::time::Instant::now() + limits.idle;
    let (mut bytes_in, mut bytes_out) = (0u64, 0u64);
    let mut ends = std::pin::pin!(ends);
    let (why, code) = loop {
        tokio::select! {
            message = from_user.next() => match message {
                Some(Ok(Message::Binary(b))) => {
                    idle_until = tokio::time::Instant::now() + limits.idle;
                    bytes_in += b.len() as u64;
                    if input.send(b.to_vec()).await.is_err() {
                        break (VM_SIDE_CLOSED.to_string(), CloseCode::Library(banlieue_api::console::CLOSE_VM_SIDE));
                    }
                }
                Some(Ok(Message::Text(t))) => {
                    idle_until = tokio::time::Instant::now() + limits.idle;
                    bytes_in += t.len() as u64;
                    if input.send(t.as_bytes().to_vec()).await.is_err() {
                        break (VM_SIDE_CLOSED.to_string(), CloseCode::Library(banlieue_api::console::CLOSE_VM_SIDE));
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break ("the user left".to_string(), CloseCode::Normal),
                Some(Ok(_)) => {}
            },
            bytes = output.recv() => match bytes {
                Some(b) => {
                    idle_until = tokio::time::Instant::now() + limits.idle;
                    bytes_out += b.len() as u64;
                    if to_user.send(Message::binary(b)).await.is_err() {
                        break ("the user left".to_string(), CloseCode::Normal);
                    }
                }
                None => break (VM_SIDE_CLOSED.to_string(), CloseCode::Library(banlieue_api::console::CLOSE_VM_SIDE)),
            },
            _ = tokio::time::sleep_until(idle_until) => break (format!("idle for {}s (--console-idle-timeout)", limits.idle.as_secs()), CloseCode::Policy),
            _ = tokio::time::sleep_until(deadline) => break (format!("open for {}s, the most allowed (--console-max-duration)", limits.max_duration.as_secs()), CloseCode::Policy),
            why = &mut ends => break (why, CloseCode::Away),
        }
    };
    drop(input);
    // A close frame's reason is at most 123 bytes.
    let mut reason = why.clone();
    while reason.len() > 123 {
        reason.pop();
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), to_user.send(Message::Close(Some(CloseFrame { code, reason: reason.into() })))).await;
    Ended { why, bytes_in, bytes_out }
}

/// Resolves, with why, once the VM is deleted (or being deleted), replaced by another of
/// the same name, or realised by another Machine than `machine` (it moved).
async fn gone_or_moved(api: Api<VirtualMachine>, name: String, uid: String, machine: String) -> String {
    // No bookmarks: they keep a long watch from relisting, and relisting one VM costs
    // nothing, while a bookmark per session per interval adds up over many idle sessions.
    let config = watcher::Config::default().fields(&format!("metadata.name={name}")).disable_bookmarks();
    let mut events = std::pin::pin!(kube::runtime::WatchStreamExt::default_backoff(watcher::watcher(api, config)));
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Delete(_)) => return "the VM was deleted".into(),
            Ok(watcher::Event::Apply(vm) | watcher::Event::InitApply(vm)) => {
                if vm.uid().as_deref() != Some(uid.as_str()) || vm.metadata.deletion_timestamp.is_some() {
                    return "the VM was deleted".into();
                }
                let now = vm.status.as_ref().and_then(|s| s.infrastructure_ref.as_ref()).map(|r| r.name.as_str());
                if now != Some(machine.as_str()) {
                    return "the VM moved".into();
                }
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(vm = %name, "watching a console's VM: {e}"),
        }
    }
    std::future::pending().await
}

/// A refusal by the cluster, as its HTTP status.
fn refused(r: &Refused) -> Response<Full<Bytes>> {
    let (code, reason) = match r {
        Refused::Unauthenticated(_) => (StatusCode::UNAUTHORIZED, "Unauthorized"),
        Refused::Forbidden(_) => (StatusCode::FORBIDDEN, "Forbidden"),
        Refused::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable"),
    };
    status(code, reason, r.message())
}

/// Why a console was not opened, as an HTTP status: no such VM 404, too many sessions 429,
/// what may clear by itself 503, what needs a change 409.
fn failed(f: &Failure) -> Response<Full<Bytes>> {
    let code = match f.reason {
        Reason::VMNotFound => StatusCode::NOT_FOUND,
        Reason::TooManySessions => StatusCode::TOO_MANY_REQUESTS,
        _ if f.retry => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::CONFLICT,
    };
    status(code, f.reason.as_str(), &f.message)
}

/// A Kubernetes `Status` answer.
fn status(code: StatusCode, reason: &str, message: &str) -> Response<Full<Bytes>> {
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16(),
    });
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = code;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn redirect(to: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = StatusCode::FOUND;
    response.headers_mut().insert(header::LOCATION, HeaderValue::from_static(to));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_paths_name_a_namespace_a_vm_and_a_console() {
        let at = |p: &str| route(&format!("{PREFIX}{p}"));
        assert_eq!(at("team-a/virtualmachines/web/console"), Some(("team-a".into(), "web".into(), Console::Serial)));
        assert_eq!(at("team-a/virtualmachines/web/vnc"), Some(("team-a".into(), "web".into(), Console::Vnc)));
        for wrong in ["team-a/virtualmachines/web/exec", "team-a/pods/web/console", "team-a/virtualmachines//console", "team-a/virtualmachines/web/console/x", ""] {
            assert_eq!(at(wrong), None, "{wrong}");
        }
        assert_eq!(route("/api/v1/namespaces/a/virtualmachines/web/console"), None);
    }
}
