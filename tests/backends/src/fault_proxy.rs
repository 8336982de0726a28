//! A loopback HTTP/1.1 proxy that makes a healthy backend sick on demand: placed between a
//! driver and a plain-http simulator (vcsim's url, fakepve's `proxy_url`), it decides per
//! request — from its method, path and body — which [`Fault`] applies, through a rule the test
//! switches at chosen moments ([`FaultProxy::set`], [`FaultProxy::clear`]).
//!
//! Every request is its own connection: the proxy answers `Connection: close` to the client
//! and asks the upstream for the same, so each decision applies to exactly one request and
//! the proxy never has to frame a response beyond its head (the upstream closes after it).
//! It counts requests and the faults it injected (per kind) and keeps a log of what it saw
//! (method, path, the SOAP operation of a vim25 body), so a test can check how a client
//! retried. Dropping the proxy ends its listener and every connection it holds.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// What the proxy does with one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Forward it and its answer unchanged.
    Pass,
    /// Wait this long, then forward.
    Latency(Duration),
    /// Read the request, then close the connection without an answer.
    Drop,
    /// Read the request, then reset the connection (RST: `SO_LINGER` 0).
    Reset,
    /// Answer this HTTP status with a small text body; the upstream never sees the request.
    Status(u16),
    /// Forward; send the answer's head and half its body, then hold the connection.
    Stall,
    /// Read the request and never answer (the connection stays open until the client leaves).
    Blackhole,
    /// Forward (the backend acts), discard its answer and answer this status instead.
    ForwardThenFail(u16),
}

impl Fault {
    /// The kind's name in counters and the log.
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::Pass => "pass",
            Fault::Latency(_) => "latency",
            Fault::Drop => "drop",
            Fault::Reset => "reset",
            Fault::Status(_) => "status",
            Fault::Stall => "stall",
            Fault::Blackhole => "blackhole",
            Fault::ForwardThenFail(_) => "forward-then-fail",
        }
    }
}

/// A request as the rule sees it.
#[derive(Clone, Debug)]
pub struct Request {
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The query, if any (without `?`).
    pub query: String,
    /// The SOAP operation of a vim25 body (`CloneVM_Task`, `RetrievePropertiesEx`), if any.
    pub op: Option<String>,
    pub body: Vec<u8>,
}

/// One request the proxy handled.
#[derive(Clone, Debug)]
pub struct Seen {
    pub at: Instant,
    pub method: String,
    pub path: String,
    pub op: Option<String>,
    /// The fault applied (`pass` when none).
    pub fault: &'static str,
    pub body: Vec<u8>,
}

impl Seen {
    /// Whether the request's body contains `text`.
    pub fn body_has(&self, text: &str) -> bool {
        self.body.windows(text.len().max(1)).any(|w| w == text.as_bytes())
    }
}

type Rule = Arc<dyn Fn(&Request) -> Fault + Send + Sync>;

struct Shared {
    upstream: SocketAddr,
    rule: Mutex<Rule>,
    log: Mutex<Vec<Seen>>,
    faults: Mutex<BTreeMap<&'static str, usize>>,
}

/// A running fault proxy; stopped (listener and every connection) when dropped.
pub struct FaultProxy {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

/// How long the proxy waits on the upstream for one answer (bounded: a sick upstream
/// cannot hold a proxy connection forever; the client then sees the connection close).
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(120);
const MAX_HEAD: usize = 1 << 20;

impl FaultProxy {
    /// A proxy on 127.0.0.1 in front of `upstream` (`http://127.0.0.1:PORT[/…]` or `127.0.0.1:PORT`),
    /// passing everything until [`set`](Self::set) says otherwise.
    pub async fn start(upstream: &str) -> Result<FaultProxy> {
        let hostport = upstream.trim_start_matches("http://").split('/').next().unwrap_or_default();
        let upstream: SocketAddr = tokio::net::lookup_host(hostport)
            .await
            .with_context(|| format!("resolving upstream {hostport:?}"))?
            .next()
            .with_context(|| format!("upstream {hostport:?} has no address"))?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream,
            rule: Mutex::new(Arc::new(|_: &Request| Fault::Pass)),
            log: Mutex::default(),
            faults: Mutex::default(),
        });
        let task = tokio::spawn(serve(listener, shared.clone()));
        Ok(FaultProxy { url: format!("http://{addr}"), addr, shared, task })
    }

    /// The same path on the proxy: `http://127.0.0.1:UP/sdk` → `http://127.0.0.1:PROXY/sdk`.
    pub fn url_for(&self, upstream_url: &str) -> String {
        let rest = upstream_url.trim_start_matches("http://");
        let path = rest.find('/').map(|i| &rest[i..]).unwrap_or("");
        format!("{}{path}", self.url)
    }

    /// Decide every request from now on with `rule`.
    pub fn set(&self, rule: impl Fn(&Request) -> Fault + Send + Sync + 'static) {
        *self.shared.rule.lock().unwrap() = Arc::new(rule);
    }

    /// Apply `fault` to the requests `matches` picks; pass the others.
    pub fn set_when(&self, matches: impl Fn(&Request) -> bool + Send + Sync + 'static, fault: Fault) {
        self.set(move |r| if matches(r) { fault } else { Fault::Pass });
    }

    /// Pass everything (the fault cleared).
    pub fn clear(&self) {
        self.set(|_| Fault::Pass);
    }

    /// Requests handled so far.
    pub fn requests(&self) -> usize {
        self.shared.log.lock().unwrap().len()
    }

    /// Faults injected so far (every kind but `pass`).
    pub fn faults(&self) -> usize {
        self.shared.faults.lock().unwrap().values().sum()
    }

    /// Faults injected so far, per kind.
    pub fn faults_by_kind(&self) -> BTreeMap<&'static str, usize> {
        self.shared.faults.lock().unwrap().clone()
    }

    /// Every request handled, oldest first.
    pub fn log(&self) -> Vec<Seen> {
        self.shared.log.lock().unwrap().clone()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // The accept task owns every connection's task (a JoinSet): aborting it ends them all.
        self.task.abort();
    }
}

async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((sock, _)) = accepted {
                    let shared = shared.clone();
                    conns.spawn(async move {
                        let _ = handle(sock, &shared).await;
                    });
                }
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// A parsed HTTP message head: the first line and the headers.
struct Head {
    first: String,
    headers: Vec<(String, String)>,
}

impl Head {
    fn parse(raw: &[u8]) -> Head {
        let text = String::from_utf8_lossy(raw);
        let mut lines = text.split("\r\n").filter(|l| !l.is_empty());
        let first = lines.next().unwrap_or_default().to_string();
        let headers = lines.filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim().to_string(), v.trim().to_string())).collect();
        Head { first, headers }
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    fn content_length(&self) -> Option<usize> {
        self.get("content-length").and_then(|v| v.parse().ok())
    }

    /// The head with `Connection: close` (and no keep-alive) instead of what it said.
    fn closing(&self) -> Vec<u8> {
        let mut out = format!("{}\r\n", self.first);
        for (k, v) in &self.headers {
            if !k.eq_ignore_ascii_case("connection") && !k.eq_ignore_ascii_case("keep-alive") && !k.eq_ignore_ascii_case("proxy-connection") {
                out.push_str(&format!("{k}: {v}\r\n"));
            }
        }
        out.push_str("Connection: close\r\n\r\n");
        out.into_bytes()
    }
}

/// Read a message head (up to the blank line); returns it and the bytes read past it.
async fn read_head(sock: &mut TcpStream) -> Result<Option<(Head, Vec<u8>)>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = sock.read(&mut chunk).await?;
        if n == 0 {
            return if buf.is_empty() { Ok(None) } else { bail!("connection closed inside a head") };
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(i + 4);
            return Ok(Some((Head::parse(&buf), rest)));
        }
        if buf.len() > MAX_HEAD {
            bail!("head larger than {MAX_HEAD} bytes");
        }
    }
}

/// The SOAP operation of a vim25 body: the first element inside `<…Body>`.
pub fn soap_op(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let body_at = text.find(":Body>").map(|i| i + 6).or_else(|| text.find("<Body>").map(|i| i + 6))?;
    let rest = &text[body_at..];
    let start = rest.find('<')? + 1;
    let tag: String = rest[start..].chars().take_while(|c| !c.is_whitespace() && *c != '>' && *c != '/').collect();
    let name = tag.rsplit(':').next().unwrap_or(&tag);
    (!name.is_empty()).then(|| name.to_string())
}

/// Hold a connection open until the client leaves (reads and discards what it sends).
async fn hold(sock: &mut TcpStream) {
    let mut chunk = [0u8; 4096];
    while let Ok(n) = sock.read(&mut chunk).await {
        if n == 0 {
            break;
        }
    }
}

async fn handle(mut sock: TcpStream, shared: &Shared) -> Result<()> {
    let Some((head, mut body)) = read_head(&mut sock).await? else { return Ok(()) };
    let len = head.content_length().unwrap_or(0);
    let mut chunk = [0u8; 8192];
    while body.len() < len {
        let n = sock.read(&mut chunk).await?;
        if n == 0 {
            bail!("connection closed inside a body");
        }
        body.extend_from_slice(&chunk[..n]);
    }
    let mut first = head.first.split(' ');
    let method = first.next().unwrap_or_default().to_string();
    let target = first.next().unwrap_or("/").to_string();
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p.to_string(), q.to_string()),
        None => (target.clone(), String::new()),
    };
    let request = Request { method, path, query, op: soap_op(&body), body };
    let rule = shared.rule.lock().unwrap().clone();
    let fault = rule(&request);
    shared.log.lock().unwrap().push(Seen {
        at: Instant::now(),
        method: request.method.clone(),
        path: request.path.clone(),
        op: request.op.clone(),
        fault: fault.kind(),
        body: request.body.clone(),
    });
    if fault != Fault::Pass {
        *shared.faults.lock().unwrap().entry(fault.kind()).or_default() += 1;
    }

    match fault {
        Fault::Drop => {
            let _ = sock.shutdown().await;
            Ok(())
        }
        Fault::Reset => {
            sock.set_zero_linger()?;
            drop(sock);
            Ok(())
        }
        Fault::Status(code) => answer(&mut sock, code).await,
        Fault::Blackhole => {
            hold(&mut sock).await;
            Ok(())
        }
        Fault::Latency(d) => {
            tokio::time::sleep(d).await;
            let (head, body) = forward(shared.upstream, &head, &request.body).await?;
            sock.write_all(&head).await?;
            sock.write_all(&body).await?;
            sock.shutdown().await?;
            Ok(())
        }
        Fault::Pass => {
            let (head, body) = forward(shared.upstream, &head, &request.body).await?;
            sock.write_all(&head).await?;
            sock.write_all(&body).await?;
            sock.shutdown().await?;
            Ok(())
        }
        Fault::Stall => {
            let (head, body) = forward(shared.upstream, &head, &request.body).await?;
            sock.write_all(&head).await?;
            sock.write_all(&body[..body.len() / 2]).await?;
            sock.flush().await?;
            hold(&mut sock).await;
            Ok(())
        }
        Fault::ForwardThenFail(code) => {
            let _ = forward(shared.upstream, &head, &request.body).await?;
            answer(&mut sock, code).await
        }
    }
}

/// Answer `code` with a small text body, then close.
async fn answer(sock: &mut TcpStream, code: u16) -> Result<()> {
    let body = format!("fault proxy: injected HTTP {code}\n");
    let reason = match code {
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Error",
    };
    let head = format!("HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    sock.write_all(head.as_bytes()).await?;
    sock.write_all(body.as_bytes()).await?;
    sock.shutdown().await?;
    Ok(())
}

/// Send the request upstream (`Connection: close`) and read its whole answer: the rewritten
/// head (`Connection: close`) and the body bytes as sent (the upstream closes after them).
async fn forward(upstream: SocketAddr, head: &Head, body: &[u8]) -> Result<(Vec<u8>, Vec<u8>)> {
    tokio::time::timeout(UPSTREAM_TIMEOUT, async {
        let mut up = TcpStream::connect(upstream).await.with_context(|| format!("connecting to {upstream}"))?;
        up.write_all(&head.closing()).await?;
        up.write_all(body).await?;
        let (resp, mut rest) = read_head(&mut up).await?.context("the upstream closed without answering")?;
        match resp.content_length() {
            // A length: read exactly that much (the upstream may linger before closing).
            Some(n) => {
                let mut chunk = [0u8; 8192];
                while rest.len() < n {
                    let k = up.read(&mut chunk).await?;
                    if k == 0 {
                        break;
                    }
                    rest.extend_from_slice(&chunk[..k]);
                }
                rest.truncate(n);
            }
            None => {
                up.read_to_end(&mut rest).await?;
            }
        }
        Ok((resp.closing(), rest))
    })
    .await
    .map_err(|_| anyhow::anyhow!("the upstream {upstream} did not answer within {UPSTREAM_TIMEOUT:?}"))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A tiny loopback HTTP server: answers every request `200` with `hello <path>`, padded
    /// to 64 bytes, and counts what it served.
    async fn upstream() -> (String, Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let served = Arc::new(AtomicUsize::new(0));
        let count = served.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else { continue };
                let count = count.clone();
                tokio::spawn(async move {
                    let Ok(Some((head, mut body))) = read_head(&mut sock).await else { return };
                    let mut chunk = [0u8; 1024];
                    while body.len() < head.content_length().unwrap_or(0) {
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => body.extend_from_slice(&chunk[..n]),
                        }
                    }
                    count.fetch_add(1, Ordering::SeqCst);
                    let path = head.first.split(' ').nth(1).unwrap_or("").to_string();
                    let text = format!("{:<64}", format!("hello {path} {}", head.get("connection").unwrap_or("-")));
                    let resp = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: keep-alive\r\n\r\n{text}", text.len());
                    let _ = sock.write_all(resp.as_bytes()).await;
                    // Keep-alive as far as it is concerned: the proxy must not wait for a close.
                    hold(&mut sock).await;
                });
            }
        });
        (url, served, task)
    }

    fn client(timeout: Duration) -> reqwest::Client {
        let _ = crate::http_client(); // installs the crypto provider reqwest is built without
        reqwest::Client::builder().no_proxy().timeout(timeout).build().unwrap()
    }

    #[tokio::test]
    async fn every_fault_is_what_a_real_client_sees() -> Result<()> {
        let (up, served, _server) = upstream().await;
        let proxy = FaultProxy::start(&up).await?;
        let c = client(Duration::from_secs(5));
        let url = |p: &str| format!("{}{p}", proxy.url);

        // Pass: the upstream's answer, with `Connection: close` both ways.
        let r = c.get(url("/a")).send().await?;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers().get("connection").unwrap(), "close");
        assert_eq!(r.text().await?.trim(), "hello /a close", "the upstream was asked to close too");
        assert_eq!(served.load(Ordering::SeqCst), 1);

        // Latency.
        proxy.set(|_| Fault::Latency(Duration::from_millis(300)));
        let t = Instant::now();
        assert_eq!(c.get(url("/slow")).send().await?.text().await?.trim(), "hello /slow close");
        assert!(t.elapsed() >= Duration::from_millis(300), "{:?}", t.elapsed());

        // A 5xx from the proxy: the upstream never sees it.
        proxy.set_when(|r| r.path == "/sick", Fault::Status(503));
        let r = c.get(url("/sick")).send().await?;
        assert_eq!(r.status(), 503);
        assert!(r.text().await?.contains("injected HTTP 503"));
        assert_eq!(c.get(url("/fine")).send().await?.status(), 200, "the rule picks per request");
        assert_eq!(served.load(Ordering::SeqCst), 3);

        // Drop and reset: no answer.
        proxy.set(|_| Fault::Drop);
        assert!(c.get(url("/drop")).send().await.is_err());
        proxy.set(|_| Fault::Reset);
        let e = c.get(url("/reset")).send().await.unwrap_err();
        assert!(!e.is_timeout(), "{e:?}");
        assert_eq!(served.load(Ordering::SeqCst), 3);

        // Forward-then-fail: the upstream acted, the client sees a 502.
        proxy.set(|_| Fault::ForwardThenFail(502));
        assert_eq!(c.post(url("/create")).body("x=1").send().await?.status(), 502);
        assert_eq!(served.load(Ordering::SeqCst), 4, "forwarded before failing");

        // Stall: the head arrives, the body never completes.
        proxy.set(|_| Fault::Stall);
        let short = client(Duration::from_millis(700));
        let r = short.get(url("/stall")).send().await?;
        assert_eq!(r.status(), 200);
        let e = r.bytes().await.unwrap_err();
        assert!(e.is_timeout() || e.is_body(), "{e:?}");

        // Blackhole: nothing at all, until the client gives up.
        proxy.set(|_| Fault::Blackhole);
        let t = Instant::now();
        let e = short.get(url("/void")).send().await.unwrap_err();
        assert!(e.is_timeout(), "{e:?}");
        assert!(t.elapsed() >= Duration::from_millis(600));

        proxy.clear();
        assert_eq!(c.get(url("/again")).send().await?.status(), 200);

        let kinds = proxy.faults_by_kind();
        let want: BTreeMap<&str, usize> =
            [("latency", 1), ("status", 1), ("drop", 1), ("reset", 1), ("forward-then-fail", 1), ("stall", 1), ("blackhole", 1)].into();
        assert_eq!(kinds, want);
        assert_eq!(proxy.faults(), 7);
        assert_eq!(proxy.requests(), 10);
        let paths: Vec<String> = proxy.log().iter().map(|s| format!("{} {} {}", s.method, s.path, s.fault)).collect();
        assert_eq!(paths[0], "GET /a pass");
        assert_eq!(paths[6], "POST /create forward-then-fail");
        Ok(())
    }

    #[tokio::test]
    async fn the_log_names_soap_operations() -> Result<()> {
        let (up, _served, _server) = upstream().await;
        let proxy = FaultProxy::start(&format!("{up}/sdk")).await?;
        assert_eq!(proxy.url_for(&format!("{up}/sdk")), format!("{}/sdk", proxy.url));
        let body = r#"<?xml version="1.0"?><soapenv:Envelope xmlns:soapenv="x"><soapenv:Body><CloneVM_Task xmlns="urn:vim25"><_this type="VirtualMachine">vm-1</_this></CloneVM_Task></soapenv:Body></soapenv:Envelope>"#;
        proxy.set_when(|r| r.op.as_deref() == Some("CloneVM_Task"), Fault::Status(500));
        let r = client(Duration::from_secs(5)).post(proxy.url_for(&format!("{up}/sdk"))).body(body).send().await?;
        assert_eq!(r.status(), 500);
        let log = proxy.log();
        assert_eq!((log[0].path.as_str(), log[0].op.as_deref(), log[0].fault), ("/sdk", Some("CloneVM_Task"), "status"));
        assert_eq!(soap_op(b"not xml"), None);
        Ok(())
    }

    #[tokio::test]
    async fn dropping_the_proxy_ends_its_connections() -> Result<()> {
        let (up, _served, _server) = upstream().await;
        let proxy = FaultProxy::start(&up).await?;
        proxy.set(|_| Fault::Blackhole);
        let c = client(Duration::from_secs(10));
        let url = format!("{}/held", proxy.url);
        let pending = tokio::spawn(async move { c.get(url).send().await });
        // Wait (bounded) until the proxy holds the request, then drop it.
        let deadline = Instant::now() + Duration::from_secs(5);
        while proxy.requests() == 0 {
            assert!(Instant::now() < deadline, "the request never reached the proxy");
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let addr = proxy.addr;
        drop(proxy);
        let t = Instant::now();
        let e = tokio::time::timeout(Duration::from_secs(5), pending).await??.unwrap_err();
        assert!(!e.is_timeout() && t.elapsed() < Duration::from_secs(5), "the held connection ended with the proxy: {e:?}");
        // The listener is gone too (bounded: the abort lands on the runtime's next turn).
        let deadline = Instant::now() + Duration::from_secs(5);
        while TcpStream::connect(addr).await.is_ok() {
            assert!(Instant::now() < deadline, "the listener outlived the proxy");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }
}
