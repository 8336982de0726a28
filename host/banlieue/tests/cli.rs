//! The `banlieue` command as a user runs it: crdgen --check, and the component
//! tools end to end against a real registry (keygen, push, sign, verify, inspect).

use std::process::Command;

fn banlieue(args: &[&str], dir: &std::path::Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_banlieue"))
        .args(args)
        .current_dir(dir)
        .env("COSIGN_PASSWORD", "correct horse")
        .output()
        .expect("run banlieue");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

fn repo() -> std::path::PathBuf {
    banlieue_test_backends::repo_root()
}

#[test]
fn crdgen_check_passes_on_the_committed_crds() {
    let (ok, out) = banlieue(&["crdgen", "--check"], &repo());
    assert!(ok, "{out}");
}

#[test]
fn component_keygen_push_sign_verify_inspect() {
    // The registry runs as its own process; the runtime only waits for it to answer.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let reg = runtime.block_on(banlieue_test_backends::registry::Registry::start()).unwrap_or_else(|e| panic!("{e:#}"));
    let dir = tempfile::tempdir().unwrap();
    let spread = banlieue_test_backends::guests_dist().join("placement-spread.wasm");
    let spread = spread.to_str().unwrap();
    let r = format!("oci://{}/banlieue/spread:v1", reg.host);

    let (ok, out) = banlieue(&["component", "inspect", spread], dir.path());
    assert!(ok && out.contains("world:    placement (contract 0.2.0)") && out.contains("banlieue:placement/policy@0.2.0"), "{out}");
    // A policy built for 0.1.0 is still accepted (the host adapts it).
    let (ok, out) = banlieue(&["component", "inspect", banlieue_test_backends::guests_dist().join("placement-legacy.wasm").to_str().unwrap()], dir.path());
    assert!(ok && out.contains("world:    placement (contract 0.1.0)") && out.contains("banlieue:placement/policy@0.1.0"), "{out}");
    let (ok, out) = banlieue(&["component", "inspect", banlieue_test_backends::guests_dist().join("hostile-fs.wasm").to_str().unwrap()], dir.path());
    assert!(!ok && out.contains("wasi:filesystem"), "refused with the import named: {out}");

    assert!(banlieue(&["component", "keygen"], dir.path()).0);
    assert!(dir.path().join("cosign.key").exists() && dir.path().join("cosign.pub").exists());
    let (ok, out) = banlieue(&["component", "push", spread, &r], dir.path());
    assert!(ok && out.contains("@sha256:"), "{out}");
    let (ok, out) = banlieue(&["component", "verify", &r, "--key", "cosign.pub"], dir.path());
    assert!(!ok, "unsigned must not verify: {out}");
    let (ok, out) = banlieue(&["component", "sign", &r, "--key", "cosign.key"], dir.path());
    assert!(ok, "{out}");
    let (ok, out) = banlieue(&["component", "verify", &r, "--key", "cosign.pub"], dir.path());
    assert!(ok && out.starts_with("verified: "), "{out}");
    let (ok, out) = banlieue(&["component", "inspect", &r], dir.path());
    assert!(ok && out.contains("placement"), "{out}");
    // Publishing something banlieue would refuse is refused.
    let (ok, out) = banlieue(&["component", "push", banlieue_test_backends::guests_dist().join("hostile-fs.wasm").to_str().unwrap(), &r], dir.path());
    assert!(!ok && out.contains("not a usable banlieue component"), "{out}");
}
