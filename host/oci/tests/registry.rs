//! Push, sign, verify and pull against a real registry (Debian `docker-registry` 2.8),
//! and what must be refused: unsigned, wrong key, tampered bytes, moved tags, copied signatures.

use banlieue_oci::{Auth, Error, Policy, Reference, Verified};
use banlieue_test_backends::registry::Registry as TestRegistry;

/// A test that needs a tool it cannot find fails, saying how to install it.
fn missing(what: &str) -> ! {
    panic!("{what}; scripts/install-deps.sh installs what the tests need")
}

/// A registry of this test's own (Debian's `docker-registry`, on a free loopback port).
async fn start_registry() -> TestRegistry {
    TestRegistry::start().await.unwrap_or_else(|e| panic!("{e:#}"))
}

const PASSWORD: &[u8] = b"correct horse";

/// A distinct (empty) component: the component preamble plus a custom section naming it.
fn component(name: &str) -> Vec<u8> {
    let section_name = b"banlieue-test";
    let mut body = vec![section_name.len() as u8];
    body.extend_from_slice(section_name);
    body.extend_from_slice(name.as_bytes());
    assert!(body.len() < 128, "one-byte LEB128 size");
    let mut wasm = vec![
        0x00,
        0x61,
        0x73,
        0x6d,
        0x0d,
        0x00,
        0x01,
        0x00,
        0x00,
        body.len() as u8,
    ];
    wasm.extend(body);
    wasm
}

fn reference(registry: &TestRegistry, rest: &str) -> Reference {
    format!("oci://{}/{rest}", registry.host).parse().unwrap()
}

struct Keys {
    private: String,
    public: String,
}

fn keys() -> Keys {
    let (private, public) = banlieue_oci::keygen(PASSWORD).unwrap();
    Keys { private, public }
}

fn verify_with(keys: &[&Keys]) -> Policy {
    Policy::Verify {
        public_keys: keys.iter().map(|k| k.public.clone()).collect(),
    }
}

async fn push_and_sign(r: &Reference, wasm: Vec<u8>, keys: &Keys) -> String {
    let digest = banlieue_oci::push(r, wasm, &Auth::Anonymous).await.unwrap();
    let tag = banlieue_oci::sign(r, &keys.private, PASSWORD, &Auth::Anonymous)
        .await
        .unwrap();
    assert_eq!(tag, banlieue_oci::signature_tag(&digest));
    digest
}

#[tokio::test]
async fn push_sign_verify_pull_round_trip() {
    let registry = start_registry().await;
    let keys = keys();
    let r = reference(&registry, "team/provider-libvirt:v1");
    let wasm = component("libvirt v1");

    let digest = push_and_sign(&r, wasm.clone(), &keys).await;
    assert_eq!(
        banlieue_oci::verify(&r, &[&keys.public], &Auth::Anonymous)
            .await
            .unwrap(),
        digest
    );

    let Verified { digest: got, bytes } =
        banlieue_oci::pull_verified(&r, &verify_with(&[&keys]), &Auth::Anonymous)
            .await
            .unwrap();
    assert_eq!(
        (got.as_str(), bytes.as_slice()),
        (digest.as_str(), wasm.as_slice())
    );

    // Pinned by digest, and by tag + digest, resolve to the same verified artifact.
    for pinned in [
        r.with_digest(&digest).unwrap(),
        format!("{r}@{digest}").parse().unwrap(),
    ] {
        let v = banlieue_oci::pull_verified(&pinned, &verify_with(&[&keys]), &Auth::Anonymous)
            .await
            .unwrap();
        assert_eq!((v.digest, v.bytes), (digest.clone(), wasm.clone()));
    }

    let info = banlieue_oci::inspect(&r, &Auth::Anonymous).await.unwrap();
    assert_eq!(info.digest, digest);
    assert_eq!(info.signatures, 1);
    assert_eq!(info.layer.media_type, "application/wasm");
    assert_eq!(
        info.manifest.artifact_type.as_deref(),
        Some("application/vnd.wasm.config.v0+json")
    );
    let config = info.config.unwrap();
    assert_eq!(
        (config.architecture.as_str(), config.os.as_str()),
        ("wasm", "wasip2")
    );
    assert_eq!(config.layer_digests, vec![info.layer.digest.clone()]);

    // Signing again keeps the first signature (cosign appends).
    banlieue_oci::sign(&r, &keys.private, PASSWORD, &Auth::Anonymous)
        .await
        .unwrap();
    assert_eq!(
        banlieue_oci::inspect(&r, &Auth::Anonymous)
            .await
            .unwrap()
            .signatures,
        2
    );
}

#[tokio::test]
async fn unsigned_is_refused_unless_explicitly_allowed() {
    let registry = start_registry().await;
    let keys = keys();
    let r = reference(&registry, "team/placement-spread:v1");
    let digest = banlieue_oci::push(&r, component("spread"), &Auth::Anonymous)
        .await
        .unwrap();

    match banlieue_oci::pull_verified(&r, &verify_with(&[&keys]), &Auth::Anonymous).await {
        Err(Error::Unsigned { digest: d, .. }) => assert_eq!(d, digest),
        other => panic!("expected Unsigned, got {other:?}"),
    }
    let v = banlieue_oci::pull_verified(&r, &Policy::AllowUnsigned, &Auth::Anonymous)
        .await
        .unwrap();
    assert_eq!(v.digest, digest);
    let (d, bytes) = banlieue_oci::pull(&r, &Auth::Anonymous).await.unwrap();
    assert_eq!((d, bytes), (digest, component("spread")));
}

#[tokio::test]
async fn wrong_key_is_refused() {
    let registry = start_registry().await;
    let (signer, stranger) = (keys(), keys());
    let r = reference(&registry, "team/provider-vsphere:v1");
    push_and_sign(&r, component("vsphere"), &signer).await;

    match banlieue_oci::pull_verified(&r, &verify_with(&[&stranger]), &Auth::Anonymous).await {
        Err(Error::SignatureMismatch { checked: 1, .. }) => {}
        other => panic!("expected SignatureMismatch, got {other:?}"),
    }
    // Any one trusted key is enough.
    banlieue_oci::pull_verified(&r, &verify_with(&[&stranger, &signer]), &Auth::Anonymous)
        .await
        .unwrap();
    // Wrong password on the private key.
    assert!(matches!(
        banlieue_oci::sign(&r, &signer.private, b"wrong", &Auth::Anonymous).await,
        Err(Error::Key(_))
    ));
}

#[tokio::test]
async fn tampered_layer_is_refused() {
    let registry = start_registry().await;
    let keys = keys();
    let r = reference(&registry, "team/provider-proxmox:v1");
    push_and_sign(&r, component("proxmox"), &keys).await;
    let layer = banlieue_oci::inspect(&r, &Auth::Anonymous)
        .await
        .unwrap()
        .layer;
    let file = registry.blob_file(&layer.digest);

    // Same length, different bytes; then a different length.
    let mut evil = component("proxmox");
    *evil.last_mut().unwrap() ^= 0xff;
    for tampered in [evil, component("proxmox, with a backdoor")] {
        std::fs::write(&file, &tampered).unwrap();
        match banlieue_oci::pull_verified(&r, &verify_with(&[&keys]), &Auth::Anonymous).await {
            Err(Error::DigestMismatch(why)) => assert!(why.contains(&layer.digest), "{why}"),
            other => panic!("expected DigestMismatch, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn tampered_manifest_is_refused() {
    let registry = start_registry().await;
    let keys = keys();
    let r = reference(&registry, "team/provider-libvirt:v1");
    let digest = push_and_sign(&r, component("libvirt"), &keys).await;

    // Rewrite the stored manifest so its layer points elsewhere (the signed digest stays the tag's link).
    let file = registry.blob_file(&digest);
    let manifest = std::fs::read_to_string(&file).unwrap();
    let other_layer = banlieue_oci::artifact::sha256_digest(b"evil");
    let layer = banlieue_oci::inspect(&r, &Auth::Anonymous)
        .await
        .unwrap()
        .layer
        .digest;
    std::fs::write(&file, manifest.replace(&layer, &other_layer)).unwrap();

    for r in [r.clone(), r.with_digest(&digest).unwrap()] {
        match banlieue_oci::pull_verified(&r, &verify_with(&[&keys]), &Auth::Anonymous).await {
            Err(Error::DigestMismatch(_)) => {}
            other => panic!("{r}: expected DigestMismatch, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn moved_tag_needs_its_own_signature() {
    let registry = start_registry().await;
    let keys = keys();
    let r = reference(&registry, "team/provider-libvirt:stable");
    let signed = push_and_sign(&r, component("v1"), &keys).await;

    // Someone with push rights moves the tag to an unsigned build.
    let moved = banlieue_oci::push(&r, component("v2 unsigned"), &Auth::Anonymous)
        .await
        .unwrap();
    match banlieue_oci::pull_verified(&r, &verify_with(&[&keys]), &Auth::Anonymous).await {
        Err(Error::Unsigned { digest, .. }) => assert_eq!(digest, moved),
        other => panic!("expected Unsigned for the moved tag, got {other:?}"),
    }
    // The signed digest is still fine when pinned (a digest wins over a tag).
    let pinned: Reference = format!("{r}@{signed}").parse().unwrap();
    let v = banlieue_oci::pull_verified(&pinned, &verify_with(&[&keys]), &Auth::Anonymous)
        .await
        .unwrap();
    assert_eq!((v.digest, v.bytes), (signed, component("v1")));

    // Once the new digest is itself signed, the tag verifies again, to the new digest.
    banlieue_oci::sign(&r, &keys.private, PASSWORD, &Auth::Anonymous)
        .await
        .unwrap();
    let v = banlieue_oci::pull_verified(&r, &verify_with(&[&keys]), &Auth::Anonymous)
        .await
        .unwrap();
    assert_eq!((v.digest, v.bytes), (moved, component("v2 unsigned")));
}

#[tokio::test]
async fn signature_copied_to_another_digest_or_repository_is_refused() {
    let registry = start_registry().await;
    let keys = keys();
    let a = reference(&registry, "team/provider:a");
    let signed = push_and_sign(&a, component("good"), &keys).await;
    let unsigned = banlieue_oci::push(
        &a.with_tag("b").unwrap(),
        component("evil"),
        &Auth::Anonymous,
    )
    .await
    .unwrap();

    // A genuine signature for `signed`, replayed at the `.sig` tag of `unsigned`.
    raw::copy(
        &registry,
        &a.with_tag(&banlieue_oci::signature_tag(&signed)).unwrap(),
        &a.with_tag(&banlieue_oci::signature_tag(&unsigned)).unwrap(),
    )
    .await;
    match banlieue_oci::pull_verified(
        &a.with_tag("b").unwrap(),
        &verify_with(&[&keys]),
        &Auth::Anonymous,
    )
    .await
    {
        Err(Error::DigestMismatch(why)) => assert!(why.contains(&signed), "{why}"),
        other => panic!("expected DigestMismatch, got {other:?}"),
    }

    // The same artifact and signature copied into another repository: bound to the first one.
    let other = reference(&registry, "elsewhere/provider:a");
    assert_eq!(
        banlieue_oci::push(&other, component("good"), &Auth::Anonymous)
            .await
            .unwrap(),
        signed
    );
    let sig_tag = banlieue_oci::signature_tag(&signed);
    raw::copy(
        &registry,
        &a.with_tag(&sig_tag).unwrap(),
        &other.with_tag(&sig_tag).unwrap(),
    )
    .await;
    match banlieue_oci::pull_verified(&other, &verify_with(&[&keys]), &Auth::Anonymous).await {
        Err(Error::DigestMismatch(why)) => assert!(why.contains("repository"), "{why}"),
        other => panic!("expected DigestMismatch, got {other:?}"),
    }
}

#[tokio::test]
async fn missing_artifacts_are_not_found() {
    let registry = start_registry().await;
    let r = reference(&registry, "team/nothing:v1");
    assert!(matches!(
        banlieue_oci::pull(&r, &Auth::Anonymous).await,
        Err(Error::NotFound(_))
    ));
    banlieue_oci::push(&r, component("x"), &Auth::Anonymous)
        .await
        .unwrap();
    let r = r.with_tag("v2").unwrap();
    assert!(matches!(
        banlieue_oci::verify(&r, &[keys().public], &Auth::Anonymous).await,
        Err(Error::NotFound(_))
    ));
}

#[tokio::test]
async fn component_pushed_by_oras_python_pulls() {
    let registry = start_registry().await;
    let python = std::env::var("BANLIEUE_PYTHON").unwrap_or_else(|_| "python3".into());
    let has_oras = std::process::Command::new(&python)
        .args(["-c", "import oras.provider"])
        .output();
    if !has_oras.is_ok_and(|o| o.status.success()) {
        missing(&format!("{python} cannot import oras (pip install oras)"));
    }
    let wasm = component("pushed by oras");
    let path = registry.dir().join("upload").join("component.wasm");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, &wasm).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/oras_push.py");
    let out = std::process::Command::new(&python)
        .arg(script)
        .args([registry.host.as_str(), "third-party/component:v1"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "oras push failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        registry.log()
    );

    let r = reference(&registry, "third-party/component:v1");
    let (digest, bytes) = banlieue_oci::pull(&r, &Auth::Anonymous).await.unwrap();
    assert_eq!(bytes, wasm);
    let oras_digest = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !oras_digest.is_empty() {
        assert_eq!(digest, oras_digest);
    }
    // And our signatures apply to artifacts we did not build.
    let keys = keys();
    banlieue_oci::sign(&r, &keys.private, PASSWORD, &Auth::Anonymous)
        .await
        .unwrap();
    let v = banlieue_oci::pull_verified(&r, &verify_with(&[&keys]), &Auth::Anonymous)
        .await
        .unwrap();
    assert_eq!((v.digest, v.bytes), (digest, wasm));
}

#[tokio::test]
async fn signature_verifies_with_an_independent_python_checker() {
    let registry = start_registry().await;
    let python = std::env::var("BANLIEUE_PYTHON").unwrap_or_else(|_| "python3".into());
    let has_crypto = std::process::Command::new(&python)
        .args(["-c", "import cryptography"])
        .output();
    if !has_crypto.is_ok_and(|o| o.status.success()) {
        missing(&format!(
            "{python} cannot import cryptography (pip install cryptography)"
        ));
    }
    let signer = keys();
    let r = reference(&registry, "team/checked:v1");
    let digest = push_and_sign(&r, component("checked"), &signer).await;
    let key_file = registry.dir().join("cosign.pub");
    std::fs::write(&key_file, &signer.public).unwrap();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/cosign_check.py"
    );
    let check = |key: &std::path::Path| {
        std::process::Command::new(&python)
            .arg(script)
            .args([registry.host.as_str(), "team/checked", digest.as_str()])
            .arg(key)
            .output()
            .unwrap()
    };
    let out = check(&key_file);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // And the checker itself refuses another key.
    let other = registry.dir().join("other.pub");
    std::fs::write(&other, keys().public).unwrap();
    assert!(!check(&other).status.success());
}

/// Registry operations our API deliberately does not offer, done with oci-client directly.
mod raw {
    use oci_client::client::{ClientConfig, ClientProtocol};
    use oci_client::manifest::{OCI_IMAGE_MEDIA_TYPE, OciImageManifest};
    use oci_client::secrets::RegistryAuth;

    use super::{Reference, TestRegistry};

    fn oci(r: &Reference) -> oci_client::Reference {
        let s = r.to_string();
        s.trim_start_matches("oci://").parse().unwrap()
    }

    /// Copy a manifest and its blobs from one reference to another.
    pub async fn copy(registry: &TestRegistry, from: &Reference, to: &Reference) {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = oci_client::Client::new(ClientConfig {
            protocol: ClientProtocol::HttpsExcept(vec![registry.host.clone()]),
            ..Default::default()
        });
        let (from, to) = (oci(from), oci(to));
        let (bytes, _) = client
            .pull_manifest_raw(&from, &RegistryAuth::Anonymous, &[OCI_IMAGE_MEDIA_TYPE])
            .await
            .unwrap();
        let manifest: OciImageManifest = serde_json::from_slice(&bytes).unwrap();
        for blob in manifest.layers.iter().chain([&manifest.config]) {
            let mut data = Vec::new();
            client.pull_blob(&from, blob, &mut data).await.unwrap();
            client.push_blob(&to, data, &blob.digest).await.unwrap();
        }
        client
            .push_manifest_raw(&to, bytes, OCI_IMAGE_MEDIA_TYPE.parse().unwrap())
            .await
            .unwrap();
    }
}
