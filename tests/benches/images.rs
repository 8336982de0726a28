//! Importing an image into libvirt: the host streaming the cached file through the
//! `transfer` capability, for the libvirt driver's `import-image` (the real component, on
//! libvirtd with qemu), against `virsh vol-upload` of the same file into the same pool (the
//! ceiling on this machine). Both in the same run, BENCH_ROUNDS rounds (default 3) of a
//! BENCH_IMAGE_MIB image (default 1024, incompressible bytes); the median MiB/s of each, and
//! the growth of this process's peak RSS (VmHWM) across the driver's imports — the host must
//! stream, not buffer.
//!
//! `cargo bench -p banlieue-tests --bench images` (needs root for libvirtd)

use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use banlieue_runtime::capability::libvirt::LibvirtGrant;
use banlieue_runtime::capability::transfer::TransferGrant;
use banlieue_runtime::capability::Grants;
use banlieue_runtime::provider::{ImageRequest, ImageSource, ProviderConfig, UrlSource};
use banlieue_runtime::{Limits, Runtime, RuntimeConfig};
use banlieue_test_backends::libvirtd::Libvirtd;
use banlieue_tests::bench::{env_or, median};

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib: f64 = status.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.split_whitespace().next()?.parse().ok()).unwrap_or(0.0);
    kib / 1024.0
}

fn main() -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(bench())
}

async fn bench() -> anyhow::Result<()> {
    let mib: u64 = env_or("BENCH_IMAGE_MIB", 1024);
    let rounds: usize = env_or("BENCH_ROUNDS", 3);
    let lv = Libvirtd::shared()?;
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("image.raw");
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&file)?);
        let mut block = vec![0u8; 1 << 20];
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for _ in 0..mib {
            for b in block.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            f.write_all(&block)?;
        }
    }
    let size = mib << 20;
    let digest = format!("sha256:{}", "ab".repeat(32));
    let conn = banlieue_libvirt::Connections::new().get(&lv.uri).await?;
    let rt = Runtime::new(RuntimeConfig::default())?;
    let driver = rt.provider(&std::fs::read(banlieue_tests::control::guests_dist().join("provider-libvirt.wasm"))?)?;
    let config = ProviderConfig {
        provider: "bench/kvm".into(),
        endpoint: lv.uri.clone(),
        credential_keys: vec![],
        storage_classes: vec![("standard".into(), lv.pool.clone())],
        network_classes: vec![],
        features: vec![],
    };
    let request = ImageRequest {
        name: "bench-image".into(),
        source: ImageSource::Url(UrlSource { url: "https://images.example/bench.raw".into(), checksum: Some(digest.clone()) }),
        target: Some(lv.pool.clone()),
    };
    let volume = format!("image@bench-image@{}", &digest[7..19]);
    let plain = "bench-virsh-upload.raw";
    let rss_before = peak_rss_mib();
    let (mut host, mut virsh) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let grants = Grants {
            libvirt: Some(LibvirtGrant { conn: conn.clone() }),
            transfer: Some(TransferGrant { file: Arc::new(std::fs::File::open(&file)?), digest: digest.clone(), format: "raw".into(), size, virtual_size: size }),
            ..Grants::default()
        };
        let start = Instant::now();
        let status = driver.import_image(&config, &request, Limits::default(), grants).await?;
        let secs = start.elapsed().as_secs_f64();
        anyhow::ensure!(status.phase == banlieue_runtime::provider::ImagePhase::Ready, "{status:?}");
        host.push(mib as f64 / secs);
        lv.virsh(&["vol-delete", "--pool", &lv.pool, &volume])?;

        let start = Instant::now();
        lv.virsh(&["vol-create-as", &lv.pool, plain, &size.to_string(), "--format", "raw"])?;
        let out = std::process::Command::new("virsh")
            .args(["-q", "-c", &lv.uri, "vol-upload", "--pool", &lv.pool, plain])
            .arg(&file)
            .output()?;
        anyhow::ensure!(out.status.success(), "virsh vol-upload: {}", String::from_utf8_lossy(&out.stderr));
        let secs = start.elapsed().as_secs_f64();
        virsh.push(mib as f64 / secs);
        lv.virsh(&["vol-delete", "--pool", &lv.pool, plain])?;
        println!("round {round}: import-image through the host {:.0} MiB/s, virsh vol-upload {:.0} MiB/s", host[round], virsh[round]);
    }
    let growth = peak_rss_mib() - rss_before;
    println!(
        "median over {rounds} rounds, {mib} MiB: import-image (host-streamed) {:.0} MiB/s, virsh vol-upload {:.0} MiB/s; peak RSS growth during the imports {growth:.1} MiB",
        median(host),
        median(virsh)
    );
    Ok(())
}
