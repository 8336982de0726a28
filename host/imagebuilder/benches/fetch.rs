//! Downloading an image into the cache: throughput and memory. A local HTTP server (in this
//! process, streaming a file from disk in 1 MiB chunks) serves a BENCH_IMAGE_MIB image
//! (default 1024); the bench compares, in the same run, the cache's fetch (hashing every byte
//! and verifying the digest) with a plain copy of the same response to a file (the ceiling
//! of this machine's loopback and disk). It reports MiB/s (median of BENCH_ROUNDS, default 3)
//! and the process's peak RSS growth (VmHWM) over the whole run: the cache must stream, not
//! buffer.
//!
//! `cargo bench -p banlieue-imagebuilder --bench fetch`

use std::io::Write;
use std::time::Instant;

use banlieue_imagebuilder::{Digest, ImageCache};
use futures::StreamExt;
use sha2::Digest as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// `VmHWM` (peak resident set) of this process, in MiB.
fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib: f64 = status.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.split_whitespace().next()?.parse().ok()).unwrap_or(0.0);
    kib / 1024.0
}

/// Serve `path` as the body of every request, streamed from disk.
async fn serve(path: std::path::PathBuf, len: u64) -> anyhow::Result<std::net::SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let path = path.clone();
            tokio::spawn(async move {
                let mut head = [0u8; 4096];
                let _ = stream.read(&mut head).await;
                let header = format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n");
                if stream.write_all(header.as_bytes()).await.is_err() {
                    return;
                }
                let Ok(mut file) = tokio::fs::File::open(&path).await else { return };
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    match file.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if stream.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    }
                }
                let _ = stream.shutdown().await;
            });
        }
    });
    Ok(addr)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mib: u64 = env_or("BENCH_IMAGE_MIB", 1024);
    let rounds: usize = env_or("BENCH_ROUNDS", 3);
    let dir = tempfile::tempdir()?;
    // The served image: pseudo-random bytes (incompressible), whole sectors.
    let source = dir.path().join("image.raw");
    let mut hasher = sha2::Sha256::new();
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&source)?);
        let mut block = vec![0u8; 1 << 20];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..mib {
            for b in block.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            hasher.update(&block);
            f.write_all(&block)?;
        }
    }
    let digest = Digest::parse(&format!("sha256:{}", hex::encode(hasher.finalize())))?;
    let len = mib << 20;
    let addr = serve(source, len).await?;
    let url = format!("http://{addr}/image.raw");
    // reqwest without a bundled TLS provider (as the cache uses it): install ring's.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::new();
    let rss_before = peak_rss_mib();

    let (mut cached, mut plain) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let cache = ImageCache::open(&dir.path().join(format!("cache-{round}")), len * 2, &["http"])?;
        let start = Instant::now();
        let entry = cache.fetch(&url, &digest).await?;
        let secs = start.elapsed().as_secs_f64();
        anyhow::ensure!(entry.size == len, "fetched {} bytes", entry.size);
        cached.push(mib as f64 / secs);
        cache.remove(&digest)?;

        let target = dir.path().join(format!("plain-{round}.raw"));
        let start = Instant::now();
        let mut out = tokio::fs::File::create(&target).await?;
        let mut body = client.get(&url).send().await?.bytes_stream();
        while let Some(chunk) = body.next().await {
            out.write_all(&chunk?).await?;
        }
        out.sync_all().await?;
        let secs = start.elapsed().as_secs_f64();
        plain.push(mib as f64 / secs);
        std::fs::remove_file(target)?;
        println!("round {round}: cache fetch {:.0} MiB/s, plain copy {:.0} MiB/s", cached[round], plain[round]);
    }
    let growth = peak_rss_mib() - rss_before;
    println!(
        "median over {rounds} rounds, {mib} MiB image: cache fetch (sha256 verified) {:.0} MiB/s, plain copy {:.0} MiB/s; peak RSS growth {growth:.1} MiB",
        median(cached),
        median(plain)
    );
    Ok(())
}
