//! Shared test helpers: the built guest components.

/// Bytes of `guests/dist/<name>.wasm` (built by `guests/build.sh`, which `make test` runs first).
pub use banlieue_test_backends::guest_component as guest;

/// An image as the host's cache holds it for one `import-image` call: a raw disk of `mib` MiB
/// with random data at its start, converted by qemu-img to `format` (`vmdk` is
/// stream-optimised). The digest is the raw source's, as the image builder reports it.
#[allow(dead_code)] // not every test binary imports images
pub fn image_grant(dir: &std::path::Path, mib: u64, format: &str) -> banlieue_runtime::capability::transfer::TransferGrant {
    use sha2::Digest as _;
    use std::io::Write as _;
    let raw = dir.join("source.raw");
    let mut f = std::fs::File::create(&raw).unwrap();
    let mut noise = vec![0u8; 1 << 20];
    for (i, b) in noise.iter_mut().enumerate() {
        *b = (i.wrapping_mul(2654435761) >> 13) as u8;
    }
    f.write_all(&noise).unwrap();
    f.set_len(mib << 20).unwrap();
    drop(f);
    let digest = format!("sha256:{}", hex::encode(sha2::Sha256::digest(std::fs::read(&raw).unwrap())));
    let out = dir.join(format!("image.{format}"));
    let mut args = vec!["convert", "-O", format];
    if format == "vmdk" {
        args.extend(["-o", "subformat=streamOptimized"]);
    }
    let status = std::process::Command::new("qemu-img").args(&args).arg(&raw).arg(&out).status().unwrap();
    assert!(status.success(), "qemu-img convert to {format}");
    let size = std::fs::metadata(&out).unwrap().len();
    banlieue_runtime::capability::transfer::TransferGrant {
        file: std::sync::Arc::new(std::fs::File::open(&out).unwrap()),
        digest,
        format: format.into(),
        size,
        virtual_size: mib << 20,
    }
}
