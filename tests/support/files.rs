//! A plain HTTP/1.1 file server on 127.0.0.1 for tests that download things (VMImage
//! `url` sources): fixed paths and bytes, one request per connection, stopped on drop.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What a path answers.
#[derive(Clone)]
pub enum Answer {
    /// `200` with these bytes.
    Bytes(Vec<u8>),
    /// `200` announcing `Content-Length` of this many bytes, then closing without them.
    Announce(u64),
}

pub struct FileServer {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl FileServer {
    /// Serve `files`; every other path is a `404`.
    pub async fn start(files: BTreeMap<String, Answer>) -> anyhow::Result<FileServer> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let files = Arc::new(files);
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let files = files.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&head);
                    let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
                    let (status, length, body) = match files.get(&path) {
                        Some(Answer::Bytes(b)) => ("200 OK", b.len() as u64, b.clone()),
                        Some(Answer::Announce(n)) => ("200 OK", *n, Vec::new()),
                        None => ("404 Not Found", 9, b"not found".to_vec()),
                    };
                    let header = format!("HTTP/1.1 {status}\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n");
                    let _ = stream.write_all(header.as_bytes()).await;
                    let _ = stream.write_all(&body).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        Ok(FileServer { addr, task })
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for FileServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
