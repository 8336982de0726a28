//! The image cache against a real HTTP server on 127.0.0.1 (started here) and the real
//! `qemu-img`: downloads verified before use, resumed after a cut, bounded, converted,
//! and nothing outside the cache reachable.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use banlieue_imagebuilder::{ConvertError, Digest, DiskFormat, FetchError, ImageCache};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::{Request, Response};
use sha2::Digest as _;

/// What the server does with the next requests.
#[derive(Default)]
struct Behaviour {
    /// Cut the connection after this many bytes of the body, for this many requests.
    cut_after: Option<usize>,
    cuts_left: AtomicUsize,
    /// Requests seen, and how many asked for a range.
    requests: AtomicUsize,
    ranged: AtomicUsize,
    /// Answer every request with the whole file (ignore `Range`).
    ignore_range: bool,
}

/// Serve `files` (path → bytes) on 127.0.0.1; a `Range: bytes=N-` request gets a 206.
async fn serve(files: Vec<(&'static str, Vec<u8>)>, behaviour: Arc<Behaviour>) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let files = Arc::new(files);
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            let (files, behaviour) = (files.clone(), behaviour.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let (files, behaviour) = (files.clone(), behaviour.clone());
                    async move { Ok::<_, Infallible>(answer(&files, &behaviour, req)) }
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(hyper_util::rt::TokioIo::new(stream), service).await;
            });
        }
    });
    Ok((addr, task))
}

type Body = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

fn answer(files: &[(&str, Vec<u8>)], b: &Behaviour, req: Request<hyper::body::Incoming>) -> Response<Body> {
    b.requests.fetch_add(1, Ordering::SeqCst);
    let Some((_, data)) = files.iter().find(|(p, _)| *p == req.uri().path()) else {
        return Response::builder().status(404).body(Full::new(Bytes::from_static(b"not found")).map_err(|e| match e {}).boxed()).unwrap();
    };
    let from = req
        .headers()
        .get("range")
        .and_then(|r| r.to_str().ok())
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|n| n.parse::<usize>().ok());
    if from.is_some() {
        b.ranged.fetch_add(1, Ordering::SeqCst);
    }
    let (status, body) = match from {
        Some(n) if !b.ignore_range && n >= data.len() => (416, Vec::new()),
        Some(n) if !b.ignore_range => (206, data[n..].to_vec()),
        _ => (200, data.clone()),
    };
    let len = body.len();
    let cut = b.cut_after.filter(|_| b.cuts_left.load(Ordering::SeqCst) > 0 && b.cuts_left.fetch_sub(1, Ordering::SeqCst) > 0);
    let body: Body = match cut {
        // Send part of the body, then fail it: the client sees the transfer cut off.
        Some(n) => {
            let part = Bytes::from(body[..n.min(len)].to_vec());
            let frames = futures::stream::iter([Ok(Frame::data(part)), Err(std::io::Error::other("cut"))]);
            StreamBody::new(frames).boxed()
        }
        None => Full::new(Bytes::from(body)).map_err(|e| match e {}).boxed(),
    };
    Response::builder().status(status).header("content-length", len).body(body).unwrap()
}

fn digest_of(data: &[u8]) -> Digest {
    Digest::parse(&format!("sha256:{}", hex::encode(sha2::Sha256::digest(data)))).unwrap()
}

/// A small real qcow2 image made by qemu-img, and its bytes.
fn qcow2_image(dir: &std::path::Path, mib: u32) -> anyhow::Result<Vec<u8>> {
    let path = dir.join("disk.qcow2");
    let out = std::process::Command::new("qemu-img").args(["create", "-q", "-f", "qcow2"]).arg(&path).arg(format!("{mib}M")).output()?;
    anyhow::ensure!(out.status.success(), "qemu-img create: {}", String::from_utf8_lossy(&out.stderr));
    Ok(std::fs::read(path)?)
}

/// Bytes that look like nothing in particular (a raw disk of `sectors` sectors).
fn raw_disk(sectors: usize) -> Vec<u8> {
    (0..sectors * 512).map(|i| (i * 7 % 251) as u8).collect()
}

#[tokio::test]
async fn an_image_is_downloaded_once_verified_and_converted() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let image = qcow2_image(dir.path(), 64)?;
    let behaviour = Arc::new(Behaviour::default());
    let (addr, server) = serve(vec![("/disk.qcow2", image.clone())], behaviour.clone()).await?;
    let cache = ImageCache::open(&dir.path().join("cache"), 1 << 30, &["http"])?;
    let digest = digest_of(&image);
    let url = format!("http://{addr}/disk.qcow2");

    let entry = cache.fetch(&url, &digest).await?;
    assert_eq!(entry.size, image.len() as u64);
    let mut cached = Vec::new();
    std::io::Read::read_to_end(&mut cache.open_entry(&entry)?, &mut cached)?;
    assert_eq!(cached, image, "the cache holds the bytes served");
    // A second fetch is served from the cache.
    assert_eq!(cache.fetch(&url, &digest).await?, entry);
    assert_eq!(behaviour.requests.load(Ordering::SeqCst), 1, "downloaded once");

    let info = cache.inspect(&entry).await?;
    assert_eq!((info.format.as_str(), info.virtual_size), ("qcow2", 64 << 20));
    for (format, name) in [(DiskFormat::Raw, "raw"), (DiskFormat::StreamOptimizedVmdk, "vmdk"), (DiskFormat::Qcow2, "qcow2")] {
        let converted = cache.convert(&entry, format).await?;
        let info = cache.inspect(&converted).await?;
        assert_eq!(info.format, name, "{format:?}");
        assert_eq!(info.virtual_size, 64 << 20, "{format:?}");
        assert_eq!(cache.convert(&entry, format).await?, converted, "converted once");
    }
    cache.remove(&digest)?;
    assert!(cache.get(&digest)?.is_none());
    assert_eq!(cache.usage()?, 0, "removing an image removes its conversions");
    server.abort();
    Ok(())
}

#[tokio::test]
async fn a_download_cut_halfway_resumes_where_it_stopped() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let image = raw_disk(8192); // 4 MiB
    let behaviour = Arc::new(Behaviour { cut_after: Some(1 << 21), cuts_left: AtomicUsize::new(1), ..Default::default() });
    let (addr, server) = serve(vec![("/disk.raw", image.clone())], behaviour.clone()).await?;
    let cache = ImageCache::open(&dir.path().join("cache"), 1 << 30, &["http"])?;
    let digest = digest_of(&image);
    let url = format!("http://{addr}/disk.raw");

    let cut = cache.fetch(&url, &digest).await.expect_err("the first transfer is cut");
    assert!(matches!(cut, FetchError::Unavailable { .. }) && cut.is_retryable(), "{cut:?}");
    assert!(cache.get(&digest)?.is_none(), "a partial download is no entry");
    assert_eq!(cache.usage()?, 1 << 21, "what arrived is kept");

    let entry = cache.fetch(&url, &digest).await?;
    assert_eq!(entry.size, image.len() as u64);
    assert_eq!(behaviour.ranged.load(Ordering::SeqCst), 1, "the second request asked for the rest only");
    cache.inspect(&entry).await?;
    server.abort();
    Ok(())
}

#[tokio::test]
async fn a_server_that_ignores_ranges_gets_a_fresh_download() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let image = raw_disk(4096);
    let behaviour = Arc::new(Behaviour { cut_after: Some(100_000), cuts_left: AtomicUsize::new(1), ignore_range: true, ..Default::default() });
    let (addr, server) = serve(vec![("/disk.raw", image.clone())], behaviour.clone()).await?;
    let cache = ImageCache::open(&dir.path().join("cache"), 1 << 30, &["http"])?;
    let digest = digest_of(&image);
    let url = format!("http://{addr}/disk.raw");
    assert!(cache.fetch(&url, &digest).await.is_err());
    let entry = cache.fetch(&url, &digest).await?;
    let mut cached = Vec::new();
    std::io::Read::read_to_end(&mut cache.open_entry(&entry)?, &mut cached)?;
    assert_eq!(cached, image, "the whole answer replaced the partial download, not appended to it");
    server.abort();
    Ok(())
}

#[tokio::test]
async fn bad_sources_are_refused_and_leave_nothing() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let image = raw_disk(2048); // 1 MiB
    let text = b"this is not a disk image\n".to_vec();
    let (addr, server) = serve(vec![("/disk.raw", image.clone()), ("/notes.txt", text.clone())], Arc::default()).await?;
    let cache = ImageCache::open(&dir.path().join("cache"), 1 << 30, &["http"])?;
    let digest = digest_of(&image);

    // A wrong checksum: refused after the download, nothing kept.
    let wrong = digest_of(b"something else");
    match cache.fetch(&format!("http://{addr}/disk.raw"), &wrong).await {
        Err(FetchError::ChecksumMismatch { expected, actual }) => assert_eq!((expected, actual), (wrong, digest)),
        other => panic!("{other:?}"),
    }
    assert_eq!(cache.usage()?, 0);
    // A 404, a scheme not allowed, a malformed checksum.
    match cache.fetch(&format!("http://{addr}/missing.raw"), &digest).await {
        Err(e @ FetchError::Http { status: 404, .. }) => assert!(!e.is_retryable()),
        other => panic!("{other:?}"),
    }
    for url in ["file:///etc/passwd", "ftp://127.0.0.1/disk.raw"] {
        assert!(matches!(cache.fetch(url, &digest).await, Err(FetchError::SchemeNotAllowed { .. })), "{url}");
    }
    let https_only = ImageCache::open(&dir.path().join("cache-https"), 1 << 30, &["https"])?;
    assert!(matches!(https_only.fetch(&format!("http://{addr}/disk.raw"), &digest).await, Err(FetchError::SchemeNotAllowed { .. })));
    for checksum in ["sha256:abc", "md5:0123", &format!("sha256:{}", "G".repeat(64))] {
        assert!(matches!(Digest::parse(checksum), Err(FetchError::InvalidChecksum(_))), "{checksum}");
    }
    // Larger than the whole cache: refused before anything is written.
    let small = ImageCache::open(&dir.path().join("small"), 512 * 1024, &["http"])?;
    assert!(matches!(small.fetch(&format!("http://{addr}/disk.raw"), &digest).await, Err(FetchError::TooLarge { size: 1048576, .. })));
    assert_eq!(small.usage()?, 0);
    // Fetched and verified, but not a disk image: refused before any conversion.
    let entry = cache.fetch(&format!("http://{addr}/notes.txt"), &digest_of(&text)).await?;
    assert!(matches!(cache.inspect(&entry).await, Err(ConvertError::NotADiskImage(_))));
    assert!(matches!(cache.convert(&entry, DiskFormat::Qcow2).await, Err(ConvertError::NotADiskImage(_))));
    server.abort();
    Ok(())
}

#[tokio::test]
async fn the_cache_stays_within_its_limit_by_evicting_the_oldest() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (a, b) = (raw_disk(2048), raw_disk(2049));
    let (addr, server) = serve(vec![("/a.raw", a.clone()), ("/b.raw", b.clone())], Arc::default()).await?;
    let cache = ImageCache::open(&dir.path().join("cache"), 1536 * 1024, &["http"])?;
    cache.fetch(&format!("http://{addr}/a.raw"), &digest_of(&a)).await?;
    cache.fetch(&format!("http://{addr}/b.raw"), &digest_of(&b)).await?;
    assert!(cache.get(&digest_of(&a))?.is_none(), "the older image made room");
    assert!(cache.get(&digest_of(&b))?.is_some());
    assert!(cache.usage()? <= cache.limit());
    server.abort();
    Ok(())
}

#[test]
fn nothing_outside_the_cache_is_reachable() -> anyhow::Result<()> {
    // The names the cache builds come from digests (no `..`, no `/`), and every file is
    // opened through the cache's cap-std directory: a symlink planted in the cache that
    // points outside it is not followed.
    let dir = tempfile::tempdir()?;
    let outside = dir.path().join("secret");
    std::fs::write(&outside, raw_disk(1))?;
    let root = dir.path().join("cache");
    let cache = ImageCache::open(&root, 1 << 20, &["http"])?;
    let digest = digest_of(&raw_disk(1));
    std::os::unix::fs::symlink(&outside, root.join(format!("images/sha256-{}", &digest.to_string()[7..])))?;
    assert!(cache.get(&digest).is_err(), "the planted symlink is refused, not followed");
    std::os::unix::fs::symlink("../../secret", root.join("images/sha256-relative"))?;
    assert!(cache.usage().is_ok(), "listing the cache does not follow links either");
    for checksum in ["sha256:../../secret", "sha256:/etc/passwd", "../secret"] {
        assert!(Digest::parse(checksum).is_err(), "{checksum}");
    }
    Ok(())
}
