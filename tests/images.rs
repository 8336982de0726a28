//! VMImages with `url` sources, end to end: the imagebuilder role downloads each into
//! its image cache from a real HTTP server (started here), verifies the declared sha256
//! and inspects it with qemu-img, and says so in the VMImage's `Fetched` condition; bad
//! sources get a condition naming the problem and leave nothing in the cache. On the
//! embedded server the roles run as their ServiceAccounts with `deploy/base/rbac.yaml`.

use std::collections::BTreeMap;

use banlieue_api::VMImage;
use banlieue_imagebuilder::Digest;
use banlieue_tests::control::{apply, wait_for, ControlPlane};
use banlieue_tests::files::{Answer, FileServer};
use banlieue_tests::TestEnv;
use kube::api::{Api, DeleteParams};
use serde_json::json;
use sha2::Digest as _;

fn checksum(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

/// A real qcow2 disk of `mib` MiB (virtual) made by qemu-img.
fn qcow2(dir: &std::path::Path, mib: u32) -> anyhow::Result<Vec<u8>> {
    let path = dir.join("served.qcow2");
    let out = std::process::Command::new("qemu-img").args(["create", "-q", "-f", "qcow2"]).arg(&path).arg(format!("{mib}M")).output()?;
    anyhow::ensure!(out.status.success(), "qemu-img create: {}", String::from_utf8_lossy(&out.stderr));
    Ok(std::fs::read(path)?)
}

/// A VMImage named `<ns>-<name>` with one libvirt source `url` (and `checksum` when given).
async fn image(env: &TestEnv, name: &str, url: &str, checksum: Option<&str>) -> anyhow::Result<String> {
    let name = format!("{}-{name}", env.ns);
    let mut source = json!({"providerClass": "libvirt", "url": url});
    if let Some(c) = checksum {
        source["checksum"] = json!(c);
    }
    apply(&env.client, json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": name}, "spec": {"sources": [source]}})).await?;
    Ok(name)
}

/// Wait until `Fetched` has `status` and `reason`; its message.
async fn fetched(env: &TestEnv, name: &str, status: &str, reason: &str) -> anyhow::Result<String> {
    let images: Api<VMImage> = Api::all(env.client.clone());
    let cond = |i: &VMImage| i.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "Fetched").cloned());
    let i = wait_for(&images, name, 60, &format!("Fetched={status}/{reason}"), |i: Option<&VMImage>| {
        i.and_then(cond).is_some_and(|c| c.status == status && c.reason == reason)
    })
    .await?;
    Ok(cond(&i).map(|c| c.message).unwrap_or_default())
}

#[tokio::test]
async fn url_images_are_fetched_verified_and_bad_ones_say_why() -> anyhow::Result<()> {
    let env = TestEnv::start("images").await?;
    env.install_crds().await?;
    let cp = ControlPlane::start_as_installed(&env).await?;
    let disk = qcow2(env.dir(), 64)?;
    let text = b"#!/bin/sh\necho this is no disk\n".to_vec();
    let server = FileServer::start(BTreeMap::from([
        ("/debian.qcow2".to_string(), Answer::Bytes(disk.clone())),
        ("/notes.txt".to_string(), Answer::Bytes(text.clone())),
        ("/huge.raw".to_string(), Answer::Announce(4 << 30)),
    ]))
    .await?;
    let cache = cp.ctx.images.clone().expect("tests configure an image cache");

    // A good source: downloaded, verified, inspected; the cache holds exactly those bytes.
    let good = image(&env, "debian", &server.url("/debian.qcow2"), Some(&checksum(&disk))).await?;
    let message = fetched(&env, &good, "True", "Fetched").await?;
    assert!(message.contains("qcow2") && message.contains(&format!("virtual size {}", 64 << 20)), "{message}");
    let entry = cache.get(&Digest::parse(&checksum(&disk))?)?.expect("the image is in the cache");
    let mut cached = Vec::new();
    std::io::Read::read_to_end(&mut cache.open_entry(&entry)?, &mut cached)?;
    assert_eq!(checksum(&cached), checksum(&disk));

    // The cache is content-addressed: another URL with the same checksum needs no download.
    let mirror = image(&env, "mirror", &server.url("/gone/debian.qcow2"), Some(&checksum(&disk))).await?;
    fetched(&env, &mirror, "True", "Fetched").await?;

    // Bad sources, each named in the condition; nothing of them is kept.
    let used = cache.usage()?;
    let cases = [
        ("wrong-sum", server.url("/debian.qcow2"), Some(checksum(b"another image")), "ChecksumMismatch", "not the declared"),
        ("missing", server.url("/missing.qcow2"), Some(checksum(b"missing")), "FetchFailed", "404"),
        ("ftp", "ftp://127.0.0.1/debian.qcow2".to_string(), Some(checksum(&disk)), "URLNotAllowed", "ftp"),
        ("no-sum", server.url("/debian.qcow2"), None, "InvalidSpec", "needs a checksum"),
        ("not-a-disk", server.url("/notes.txt"), Some(checksum(&text)), "NotADiskImage", "not whole 512-byte sectors"),
        ("huge", server.url("/huge.raw"), Some(checksum(b"huge")), "ImageTooLarge", "more than the image cache holds"),
    ];
    for (name, url, sum, reason, says) in cases {
        let name = image(&env, name, &url, sum.as_deref()).await?;
        let message = fetched(&env, &name, "False", reason).await?;
        assert!(message.contains(says) && message.contains(&url), "{name}: {message}");
    }
    // The text file was verified and kept (its checksum is right); nothing else was added.
    assert_eq!(cache.usage()?, used + text.len() as u64);

    // A fixed source recovers without a restart.
    let images: Api<VMImage> = Api::all(env.client.clone());
    let fixed = image(&env, "wrong-sum", &server.url("/debian.qcow2"), Some(&checksum(&disk))).await?;
    fetched(&env, &fixed, "True", "Fetched").await?;
    for i in images.list(&Default::default()).await?.items.into_iter().filter(|i| i.metadata.name.as_deref().is_some_and(|n| n.starts_with(&env.ns))) {
        images.delete(&i.metadata.name.unwrap_or_default(), &DeleteParams::default()).await?;
    }
    assert_eq!(cp.permissions_complete(), Ok(()));
    Ok(())
}
