//! From a signed OCI artifact to a running component: push, sign, fetch with
//! verification, load, call. Unsigned and wrongly signed artifacts never run.

mod common;

use banlieue_oci::Auth;
use banlieue_runtime::source::{fetch, LocalDirs, Source, SourceError, Trust};
use banlieue_runtime::{Limits, Runtime, RuntimeConfig};

#[tokio::test]
async fn signed_artifacts_load_and_unsigned_ones_are_refused() {
    let reg = banlieue_test_backends::registry::Registry::start().await.unwrap_or_else(|e| panic!("{e:#}"));
    let wasm = common::guest("placement-spread");
    let r: banlieue_oci::Reference = format!("oci://{}/banlieue/spread:v1", reg.host).parse().unwrap();
    let digest = banlieue_oci::push(&r, wasm.clone(), &Auth::Anonymous).await.unwrap();
    let builtin = &LocalDirs { builtin: "/nonexistent".into(), files: Some("/tmp".into()) };

    // Unsigned: refused unless explicitly allowed.
    let src = Source::Oci(r.clone());
    let e = fetch(&src, &Trust::default(), &Auth::Anonymous, builtin).await.err().unwrap();
    assert!(matches!(e, SourceError::UnsignedNotAllowed(_)), "{e}");
    let (private, public) = banlieue_oci::keygen(b"pw").unwrap();
    let trusted = Trust { public_keys: vec![public], allow_unsigned: false };
    assert!(fetch(&src, &trusted, &Auth::Anonymous, builtin).await.is_err(), "no signature yet");

    // Signed: the verified digest is the one loaded.
    banlieue_oci::sign(&r, &private, b"pw", &Auth::Anonymous).await.unwrap();
    let f = fetch(&src, &trusted, &Auth::Anonymous, builtin).await.unwrap();
    assert!(f.verified);
    assert_eq!(f.digest, digest);
    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    let policy = rt.placement(&f.bytes).unwrap();
    // The manifest digest was verified; the layer it names is exactly the bytes that run.
    use sha2::Digest as _;
    assert_eq!(policy.component.digest, format!("sha256:{}", hex::encode(sha2::Sha256::digest(&wasm))));
    assert_eq!(policy.contract_version().await.unwrap(), "0.2.0");
    let _ = Limits::default();

    // Another key's signature is not trust.
    let (_, other_public) = banlieue_oci::keygen(b"pw2").unwrap();
    let other = Trust { public_keys: vec![other_public], allow_unsigned: false };
    assert!(fetch(&src, &other, &Auth::Anonymous, builtin).await.is_err());

    // Local files are development-only.
    let file: Source = "file:///tmp/x.wasm".parse().unwrap();
    assert!(matches!(fetch(&file, &Trust::default(), &Auth::Anonymous, builtin).await, Err(SourceError::UnsignedNotAllowed(_))));
    assert!("http://example.com/x.wasm".parse::<Source>().is_err());
}
