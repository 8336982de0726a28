//! `kubectl vm console NAME` and `kubectl vm vnc NAME`: a VM's console through banlieue's
//! console server, opened with the user's own Kubernetes token — the cluster decides
//! whether they may (`get virtualmachines/console`, `virtualmachines/vnc`). The server's
//! address and CA come from the VM's Provider (`status.console`), read through the API.

use std::io::{IsTerminal, Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use banlieue_api::provider::ConsoleEndpoint;
use banlieue_api::Provider;
use futures::{SinkExt, StreamExt};
use kube::api::Api;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_rustls::client::TlsStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::{Failure, Result, Target};

use banlieue_api::console::{CLOSE_VM_SIDE, PATH_PREFIX as PREFIX};
/// The byte that leaves a serial console: Ctrl-] (as telnet and `virsh console`).
const ESCAPE: u8 = 0x1d;

type Socket = WebSocketStream<TlsStream<TcpStream>>;

/// Which console.
#[derive(Clone, Copy)]
pub enum Kind {
    Serial,
    Vnc,
}

impl Kind {
    fn subresource(self) -> &'static str {
        match self {
            Kind::Serial => "console",
            Kind::Vnc => "vnc",
        }
    }
}

/// A VM's console server, as its Provider publishes it, and the token to open it with.
struct Server {
    endpoint: ConsoleEndpoint,
    tls: Arc<rustls::ClientConfig>,
    token: String,
    namespace: String,
    vm: String,
}

impl Server {
    /// The console server of VM `name`, or why there is none to use.
    async fn of(t: &Target, name: &str) -> Result<Server> {
        let token = t.token.clone().ok_or_else(|| {
            Failure::Other(anyhow::anyhow!("a console is opened with your Kubernetes token, and this kubeconfig's user has none (give one with --token)"))
        })?;
        let vm = crate::get_vm(t, name).await?;
        let provider = vm.status.as_ref().and_then(|s| s.scheduled.as_ref()).map(|s| s.provider.clone()).ok_or_else(|| {
            Failure::Refused(format!("virtualmachine {name:?} is not placed on a Provider yet: it has no console"))
        })?;
        let p = Api::<Provider>::namespaced(t.client.clone(), &t.namespace)
            .get_opt(&provider)
            .await?
            .ok_or_else(|| Failure::Refused(format!("virtualmachine {name:?} is on Provider {provider:?}, which does not exist")))?;
        let endpoint = p.status.as_ref().and_then(|s| s.console.clone()).ok_or_else(|| {
            Failure::Refused(format!(
                "Provider {provider:?} publishes no console server: its driver opens no consoles (see its status.driverFeatures), or banlieue runs without --console-listen"
            ))
        })?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(endpoint.ca_bundle.as_bytes()) {
            let cert = cert.map_err(|e| anyhow::anyhow!("Provider {provider:?}'s status.console.caBundle is not PEM: {e}"))?;
            roots.add(cert).map_err(|e| anyhow::anyhow!("Provider {provider:?}'s status.console.caBundle: {e}"))?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(anyhow::Error::from)?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Server { endpoint, tls: Arc::new(tls), token, namespace: t.namespace.clone(), vm: name.to_string() })
    }

    /// Open the VM's console of `kind`: a refusal says why, with the plugin's exit codes
    /// (no such VM 3; not allowed, not running, no such console, too many sessions 4).
    async fn open(&self, kind: Kind) -> Result<Socket> {
        let url = url::Url::parse(&self.endpoint.url).map_err(|e| anyhow::anyhow!("console server URL {:?}: {e}", self.endpoint.url))?;
        let host = url.host_str().unwrap_or_default().trim_matches(['[', ']']).to_string();
        let port = url.port_or_known_default().unwrap_or(443);
        let tcp = tokio::time::timeout(Duration::from_secs(10), TcpStream::connect((host.as_str(), port)))
            .await
            .map_err(|_| anyhow::anyhow!("the console server at {} did not answer within 10s", self.endpoint.url))?
            .map_err(|e| anyhow::anyhow!("the console server at {}: {e}", self.endpoint.url))?;
        let name = ServerName::try_from(host.clone()).map_err(|e| anyhow::anyhow!("console server host {host:?}: {e}"))?;
        let tls = tokio_rustls::TlsConnector::from(self.tls.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| anyhow::anyhow!("TLS with the console server at {}: {e}", self.endpoint.url))?;
        let wss = format!("wss://{host}:{port}{PREFIX}{}/virtualmachines/{}/{}", self.namespace, self.vm, kind.subresource());
        let mut request = wss.into_client_request().map_err(anyhow::Error::from)?;
        let bearer = format!("Bearer {}", self.token).parse().map_err(|_| anyhow::anyhow!("the token is not a valid header value"))?;
        request.headers_mut().insert("authorization", bearer);
        match tokio_tungstenite::client_async(request, tls).await {
            Ok((socket, _)) => Ok(socket),
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                let body = response.body().as_deref().unwrap_or_default();
                let message = serde_json::from_slice::<serde_json::Value>(body)
                    .ok()
                    .and_then(|s| s.get("message").and_then(|m| m.as_str()).map(str::to_string))
                    .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
                let message = format!("{} (HTTP {})", message, response.status().as_u16());
                Err(match response.status().as_u16() {
                    404 => Failure::NotFound(message),
                    401 | 403 | 409 | 429 => Failure::Refused(message),
                    _ => Failure::Other(anyhow::anyhow!(message)),
                })
            }
            Err(e) => Err(Failure::Other(anyhow::anyhow!("opening the console at {}: {e}", self.endpoint.url))),
        }
    }
}

/// `kubectl vm console NAME`: the serial console on this terminal (raw), until Ctrl-]. A
/// console the VM's restart closed is opened again, for up to `timeout`.
pub async fn console(t: &Target, name: &str, timeout: Duration) -> Result<()> {
    let server = Server::of(t, name).await?;
    let mut socket = server.open(Kind::Serial).await?;
    let _raw = RawTerminal::enter();
    note(&format!("Connected to the serial console of virtualmachine/{name} (Ctrl-] to leave)"));
    let mut keys = Some(stdin_keys());
    loop {
        match serial(&mut socket, &mut keys).await {
            Ended::Left => return Ok(()),
            // The VM's side closed (a restart, a stop), or the connection was lost: it is
            // opened again as soon as it can be.
            Ended::Closed { why, reopen: true } => note(&format!("console closed: {why}; opening it again (for up to {}s)", timeout.as_secs())),
            // Deleted, moved, or the session's bounds reached: done.
            Ended::Closed { why, reopen: false } => {
                note(&format!("console closed: {why}"));
                return Ok(());
            }
        }
        socket = reopen(&server, timeout).await?;
        note("Connected again");
    }
}

/// A serial session until the user leaves or the server closes it.
async fn serial(socket: &mut Socket, keys: &mut Option<mpsc::Receiver<Vec<u8>>>) -> Ended {
    let mut out = std::io::stdout();
    loop {
        tokio::select! {
            key = async { keys.as_mut()?.recv().await }, if keys.is_some() => match key {
                Some(bytes) => {
                    let (bytes, leave) = match bytes.iter().position(|b| *b == ESCAPE) {
                        Some(at) => (bytes[..at].to_vec(), true),
                        None => (bytes, false),
                    };
                    if !bytes.is_empty() && socket.send(Message::binary(bytes)).await.is_err() {
                        return Ended::lost("the connection was lost".into());
                    }
                    if leave {
                        let _ = socket.close(None).await;
                        return Ended::Left;
                    }
                }
                // No more input (a pipe ended): the session goes on until the server ends it.
                None => *keys = None,
            },
            message = socket.next() => match message {
                Some(Ok(Message::Binary(b))) => {
                    let _ = out.write_all(&b);
                    let _ = out.flush();
                }
                Some(Ok(Message::Text(s))) => {
                    let _ = out.write_all(s.as_bytes());
                    let _ = out.flush();
                }
                Some(Ok(Message::Close(frame))) => {
                    let reopen = frame.as_ref().is_some_and(|f| u16::from(f.code) == CLOSE_VM_SIDE);
                    let why = frame.map(|f| f.reason.to_string()).filter(|r| !r.is_empty()).unwrap_or_else(|| "closed by the server".into());
                    return Ended::Closed { why, reopen };
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Ended::lost(format!("the connection was lost: {e}")),
                None => return Ended::lost("the connection was lost".into()),
            },
        }
    }
}

enum Ended {
    /// The user left (Ctrl-]).
    Left,
    /// The server closed it (or the connection was lost), saying why; whether it may be
    /// opened again (the VM's side ended it, or the connection was lost).
    Closed { why: String, reopen: bool },
}

impl Ended {
    fn lost(why: String) -> Ended {
        Ended::Closed { why, reopen: true }
    }
}

/// Open the console again while the VM comes back (a restart), for up to `timeout`.
async fn reopen(server: &Server, timeout: Duration) -> Result<Socket> {
    let deadline = Instant::now() + timeout;
    loop {
        match server.open(Kind::Serial).await {
            Ok(socket) => return Ok(socket),
            // Gone, or no longer allowed: nothing to wait for.
            Err(e @ (Failure::NotFound(_) | Failure::NotInstalled)) => return Err(e),
            Err(Failure::Refused(m)) if m.contains("HTTP 401") || m.contains("HTTP 403") || m.contains("is being deleted") => return Err(Failure::Refused(m)),
            Err(e) if Instant::now() >= deadline => {
                return Err(Failure::TimedOut(format!("the console of virtualmachine/{} did not open again within {}s: {e}", server.vm, timeout.as_secs())));
            }
            Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
}

/// `kubectl vm vnc NAME`: the VM's display on a local port for any VNC client (each
/// connection a session of its own), until interrupted; `--browser`: the page instead.
pub async fn vnc(t: &Target, name: &str, port: u16, browser: bool) -> Result<()> {
    let server = Server::of(t, name).await?;
    if browser {
        let url = format!("{}/console/?namespace={}&vm={}&console=vnc", server.endpoint.url, server.namespace, server.vm);
        println!("The graphical console of virtualmachine/{name}: {url}");
        println!("(log in with your Kubernetes token; the page trusts the CA in Provider status.console.caBundle)");
        let _ = std::process::Command::new("xdg-open").arg(&url).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn();
        return Ok(());
    }
    // Opened once first: a refusal is said (with its exit code) before anything listens.
    let first = server.open(Kind::Vnc).await?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.map_err(|e| anyhow::anyhow!("listening on 127.0.0.1:{port}: {e}"))?;
    let addr = listener.local_addr().map_err(anyhow::Error::from)?;
    println!("The display of virtualmachine/{name} is on {addr} (vnc://{addr}); Ctrl-C to stop");
    let server = Arc::new(server);
    let mut first = Some(first);
    loop {
        let (client, _) = tokio::select! {
            accepted = listener.accept() => accepted.map_err(anyhow::Error::from)?,
            _ = tokio::signal::ctrl_c() => return Ok(()),
        };
        let server = server.clone();
        let opened = first.take();
        tokio::spawn(async move {
            let socket = match opened {
                Some(s) => Ok(s),
                None => server.open(Kind::Vnc).await,
            };
            match socket {
                Ok(socket) => splice(client, socket).await,
                Err(e) => eprintln!("error: {e}"),
            }
        });
    }
}

/// A VNC client's connection and a console websocket, both ways, until either ends.
async fn splice(client: TcpStream, socket: Socket) {
    let (mut rd, mut wr) = client.into_split();
    let (mut to_server, mut from_server) = socket.split();
    let up = async {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = rd.read(&mut buf).await {
            if n == 0 || to_server.send(Message::binary(buf[..n].to_vec())).await.is_err() {
                break;
            }
        }
        let _ = to_server.close().await;
    };
    let down = async {
        while let Some(Ok(message)) = from_server.next().await {
            let bytes = match message {
                Message::Binary(b) => b,
                Message::Close(frame) => {
                    if let Some(f) = frame.filter(|f| !f.reason.is_empty()) {
                        eprintln!("display closed: {}", f.reason);
                    }
                    break;
                }
                _ => continue,
            };
            if wr.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = wr.shutdown().await;
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

/// Keys from stdin, read on a thread of their own (stdin has no async read that a
/// terminal in raw mode likes), kept across reconnections.
fn stdin_keys() -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel(64);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin();
        let mut buf = [0u8; 1024];
        while let Ok(n) = stdin.read(&mut buf) {
            if n == 0 || tx.blocking_send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    rx
}

/// A line for the user on stderr (`\r\n`: the terminal may be raw).
fn note(line: &str) {
    eprint!("{line}\r\n");
}

/// The terminal in raw mode while a console is open (keys go to the guest as typed, Ctrl-C
/// included); put back as it was when dropped. Nothing when stdin is not a terminal.
struct RawTerminal(Option<libc::termios>);

impl RawTerminal {
    fn enter() -> RawTerminal {
        if !std::io::stdin().is_terminal() {
            return RawTerminal(None);
        }
        // SAFETY: termios calls on fd 0 with a zeroed struct they fill in.
        unsafe {
            let mut was: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(0, &mut was) != 0 {
                return RawTerminal(None);
            }
            let mut raw = was;
            libc::cfmakeraw(&mut raw);
            if libc::tcsetattr(0, libc::TCSANOW, &raw) != 0 {
                return RawTerminal(None);
            }
            RawTerminal(Some(was))
        }
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        if let Some(was) = &self.0 {
            // SAFETY: restoring the settings read in `enter`.
            unsafe {
                libc::tcsetattr(0, libc::TCSANOW, was);
            }
        }
    }
}
