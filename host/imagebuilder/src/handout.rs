//! One-time download URLs for backends that fetch a carried disk themselves (Proxmox VE's
//! `download-url`): the host holds the disk, the backend pulls it.
//!
//! - A URL names one file by a random token (256 bits), nothing else: no path of the cache
//!   is in it, and a token maps to the file the host opened, never to a name.
//! - It works for one complete download (`GET`; a `HEAD` only asks the size), and not after
//!   its time to live. A download cut off ends it too: the backend's task fails and the
//!   driver asks for a new URL.
//! - The server listens where the operator says (`--carry-listen`), and URLs name the address
//!   the backends reach it at (`--carry-url`): a backend elsewhere in the network needs a
//!   route to it, and nothing else on the host is served there.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Full, StreamBody};

/// Files handed out for one download each.
pub struct Handouts {
    base: String,
    ttl: Duration,
    entries: Mutex<HashMap<String, Handout>>,
    listener: Mutex<Option<std::net::TcpListener>>,
}

struct Handout {
    file: Arc<std::fs::File>,
    size: u64,
    expires: Instant,
}

/// Why a URL does not (or no longer) work.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// Never handed out, used already, or expired (told apart only in the log).
    Gone,
}

type Body = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

impl Handouts {
    /// Listen on `listen` now (so a bad address is named at start); URLs start with `base`
    /// (default: `http://` and the address bound) and live `ttl`.
    pub fn bind(listen: SocketAddr, base: Option<String>, ttl: Duration) -> std::io::Result<Arc<Handouts>> {
        let listener = std::net::TcpListener::bind(listen)?;
        listener.set_nonblocking(true)?;
        let base = base.unwrap_or_else(|| format!("http://{}", listener.local_addr().map(|a| a.to_string()).unwrap_or_default()));
        Ok(Arc::new(Handouts { base: base.trim_end_matches('/').to_string(), ttl, entries: Mutex::default(), listener: Mutex::new(Some(listener)) }))
    }

    /// A URL for one download of `file` (`size` bytes), ending `.{extension}`.
    pub fn hand_out(&self, file: Arc<std::fs::File>, size: u64, extension: &str) -> String {
        let token: [u8; 32] = rand::random();
        let token = hex::encode(token);
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        entries.retain(|_, h| h.expires > now);
        entries.insert(token.clone(), Handout { file, size, expires: now + self.ttl });
        let extension: String = extension.chars().filter(|c| c.is_ascii_alphanumeric()).collect();
        format!("{}/carried/{token}.{extension}", self.base)
    }

    /// The file of `path` (`/carried/<token>.<ext>`), taken (`take`) or only looked at.
    fn lookup(&self, path: &str, take: bool) -> Result<(Arc<std::fs::File>, u64), Refused> {
        let token = path.strip_prefix("/carried/").and_then(|t| t.split('.').next()).ok_or(Refused::Gone)?;
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let h = entries.get(token).ok_or(Refused::Gone)?;
        if h.expires <= Instant::now() {
            entries.remove(token);
            return Err(Refused::Gone);
        }
        let found = (h.file.clone(), h.size);
        if take {
            entries.remove(token);
        }
        Ok(found)
    }

    /// Serve the URLs until the task is dropped.
    pub async fn serve(self: Arc<Self>) -> std::io::Result<()> {
        let std_listener = self.listener.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(std_listener) = std_listener else { return Ok(()) };
        let listener = tokio::net::TcpListener::from_std(std_listener)?;
        tracing::info!(base = %self.base, "serving carried disks to backends that download them");
        loop {
            let (stream, peer) = listener.accept().await?;
            let me = self.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let me = me.clone();
                    async move { Ok::<_, Infallible>(me.answer(&req, peer)) }
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
            });
        }
    }

    fn answer(&self, req: &hyper::Request<hyper::body::Incoming>, peer: SocketAddr) -> hyper::Response<Body> {
        let path = req.uri().path().to_string();
        let (head, get) = (req.method() == hyper::Method::HEAD, req.method() == hyper::Method::GET);
        if !head && !get {
            return status(405, "GET or HEAD only\n");
        }
        match self.lookup(&path, get) {
            Err(Refused::Gone) => {
                tracing::warn!(%peer, "a carried-disk URL that was never handed out, was used already, or expired");
                status(404, "no such download (a carried-disk URL works once, for a short time)\n")
            }
            Ok((_, size)) if head => {
                let mut resp = hyper::Response::new(Full::new(Bytes::new()).map_err(|e| match e {}).boxed());
                resp.headers_mut().insert(hyper::header::CONTENT_LENGTH, size.into());
                resp
            }
            Ok((file, size)) => {
                tracing::info!(%peer, size, "a backend downloads a carried disk");
                let mut resp = hyper::Response::new(BodyExt::boxed(StreamBody::new(chunks(file, size).map(|c| c.map(hyper::body::Frame::data)))));
                resp.headers_mut().insert(hyper::header::CONTENT_LENGTH, size.into());
                resp.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/octet-stream"));
                resp
            }
        }
    }
}

fn status(code: u16, text: &'static str) -> hyper::Response<Body> {
    let mut resp = hyper::Response::new(Full::new(Bytes::from_static(text.as_bytes())).map_err(|e| match e {}).boxed());
    *resp.status_mut() = hyper::StatusCode::from_u16(code).unwrap_or_default();
    resp
}

/// The file from the start in 256 KiB positional reads, off the async threads.
fn chunks(file: Arc<std::fs::File>, len: u64) -> impl futures::Stream<Item = std::io::Result<Bytes>> + Send {
    const CHUNK: u64 = 256 << 10;
    futures::stream::try_unfold(0u64, move |pos| {
        let file = file.clone();
        async move {
            if pos >= len {
                return Ok(None);
            }
            let want = CHUNK.min(len - pos) as usize;
            let buf = tokio::task::spawn_blocking(move || {
                let mut buf = vec![0u8; want];
                let n = file.read_at(&mut buf, pos)?;
                if n == 0 {
                    return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the carried disk is shorter than its size"));
                }
                buf.truncate(n);
                Ok(buf)
            })
            .await
            .map_err(std::io::Error::other)??;
            let next = pos + buf.len() as u64;
            Ok(Some((Bytes::from(buf), next)))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file(bytes: &[u8]) -> Arc<std::fs::File> {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(bytes).unwrap();
        Arc::new(f)
    }

    fn client() -> reqwest::Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        reqwest::Client::new()
    }

    async fn get(url: &str) -> (u16, Vec<u8>) {
        let resp = client().get(url).send().await.unwrap();
        let code = resp.status().as_u16();
        (code, resp.bytes().await.unwrap().to_vec())
    }

    #[tokio::test]
    async fn a_url_serves_its_file_once_and_not_after_its_time() {
        let h = Handouts::bind("127.0.0.1:0".parse().unwrap(), None, Duration::from_millis(300)).unwrap();
        let server = tokio::spawn(h.clone().serve());
        let url = h.hand_out(file(b"disk bytes"), 10, "qcow2");
        assert!(url.ends_with(".qcow2") && url.contains("/carried/"), "{url}");
        let head = client().head(&url).send().await.unwrap();
        let length = head.headers().get("content-length").and_then(|v| v.to_str().ok()).map(String::from);
        assert_eq!((head.status().as_u16(), length.as_deref()), (200, Some("10")), "a HEAD only asks");
        assert_eq!(get(&url).await, (200, b"disk bytes".to_vec()));
        assert_eq!(get(&url).await.0, 404, "used once");
        let late = h.hand_out(file(b"other"), 5, "raw");
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(get(&late).await.0, 404, "expired");
        let base = url.split("/carried/").next().unwrap().to_string();
        assert_eq!(get(&format!("{base}/carried/{}.qcow2", "0".repeat(64))).await.0, 404, "a token never handed out");
        assert_eq!(get(&format!("{base}/etc/passwd")).await.0, 404);
        server.abort();
    }
}
