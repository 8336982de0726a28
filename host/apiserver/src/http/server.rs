//! HTTPS plumbing: TLS, HTTP/1.1 and HTTP/2, authentication, body limits, and
//! the hand-off to the router. Nothing here knows about resources.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::config::{Config, MAX_BODY};
use crate::response::{error_response, Body};
use crate::storage::state::State;
use crate::status::ApiError;
use crate::http::tls::{kubeconfig, Credentials};

/// A running server.
pub struct ApiServer {
    /// `https://127.0.0.1:PORT`
    pub url: String,
    pub addr: SocketAddr,
    /// A kubeconfig (YAML) with the CA and token.
    pub kubeconfig: String,
    pub token: String,
    pub ca_pem: String,
    state: Arc<State>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl ApiServer {
    /// Bind, load or create credentials and stored objects, and start serving.
    pub async fn start(config: Config) -> anyhow::Result<ApiServer> {
        let creds = match &config.data_dir {
            Some(dir) => Credentials::load_or_create(dir)?,
            None => Credentials::generate()?,
        };
        let state = State::new(&config, creds.token.clone())?;
        crate::objects::ensure_default_namespaces(&state);
        let tls = tokio_rustls::TlsAcceptor::from(creds.server_config()?);
        let listener = TcpListener::bind(config.addr).await?;
        let addr = listener.local_addr()?;
        let url = format!("https://{addr}");
        state.set_self_address(addr);
        let (stop, stop_rx) = watch::channel(false);
        crate::controllers::gc::spawn(state.clone(), stop_rx.clone());
        let task = tokio::spawn(accept_loop(listener, tls, state.clone(), stop_rx));
        tracing::info!(%url, "embedded API server listening");
        Ok(ApiServer { kubeconfig: kubeconfig(&url, &creds), url, addr, token: creds.token, ca_pem: creds.ca_pem, state, stop, task })
    }

    /// Compact the watch history and end every open watch with `410 Gone` (fault tests:
    /// a watch-expiry storm, as an etcd compaction causes on a real cluster).
    pub fn expire_watches(&self) {
        self.state.store.expire();
    }

    /// Every resource request so far, oldest first (see [`crate::audit`]).
    pub fn audit_log(&self) -> Vec<crate::audit::AuditEntry> {
        self.state.audit.entries()
    }

    /// Write the kubeconfig to a file (mode 0600).
    pub fn write_kubeconfig(&self, path: &std::path::Path) -> anyhow::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        crate::http::tls::write_private(path, &self.kubeconfig)
    }

    /// Stop accepting, end open connections and flush the store to disk.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
        self.state.store.close();
    }
}

async fn accept_loop(listener: TcpListener, tls: tokio_rustls::TlsAcceptor, state: Arc<State>, mut stop: watch::Receiver<bool>) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => { tracing::warn!("accept failed: {e}"); continue; }
            },
            _ = stop.changed() => break,
        };
        let _ = tcp.set_nodelay(true);
        let tls = tls.clone();
        let state = state.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(Duration::from_secs(10), tls.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => return tracing::debug!(%peer, "TLS handshake failed: {e}"),
                Err(_) => return tracing::debug!(%peer, "TLS handshake timed out"),
            };
            let svc = hyper::service::service_fn(move |req| serve(state.clone(), req));
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection(TokioIo::new(stream), svc).into_owned();
            if let Err(e) = watcher.watch(conn).await {
                tracing::debug!(%peer, "connection ended: {e}");
            }
        });
    }
    // Watches never end on their own; give requests in flight a moment, then drop.
    let _ = tokio::time::timeout(Duration::from_secs(2), graceful.shutdown()).await;
}

/// Authenticate, read the body within limits, route, and turn any failure (even a
/// panic) into a `Status` response.
async fn serve(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let (mut parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    let public = matches!(path.as_str(), "/version" | "/healthz" | "/livez" | "/readyz");
    match state.authenticate(&parts.headers) {
        // Who the request is, for the router's authorization.
        Some(user) => {
            parts.extensions.insert(user);
        }
        None if public => {}
        None => return Ok(error_response(&ApiError::unauthorized())),
    }
    let declared = parts
        .headers
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > MAX_BODY) {
        return Ok(error_response(&ApiError::too_large()));
    }
    let body = match http_body_util::Limited::new(body, MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
            return Ok(error_response(&ApiError::too_large()))
        }
        Err(e) => return Ok(error_response(&ApiError::bad_request(format!("reading request body: {e}")))),
    };
    let method = parts.method.clone();
    let routed = std::panic::AssertUnwindSafe(crate::http::router::route(state.clone(), parts, body)).catch_unwind().await;
    Ok(match routed {
        Ok(resp) => {
            // A change is acknowledged once it is on disk (with `--data-dir`): what a client
            // was told succeeded survives a crash of the server.
            if !matches!(method, hyper::Method::GET | hyper::Method::HEAD | hyper::Method::OPTIONS) {
                state.store.durable(state.store.current_rv()).await;
            }
            resp
        }
        Err(_) => {
            tracing::error!(%method, %path, "request handler panicked");
            error_response(&ApiError::internal("internal error while handling the request"))
        }
    })
}

