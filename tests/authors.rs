//! For the people who write components: `banlieue component new provider|placement NAME`
//! writes a crate that builds for wasm32-wasip2 as written and passes its own test; the
//! component loads in banlieue from a file — the driver's stubs reach the Provider's
//! condition in their own words, the policy places a VM on the libvirt test driver.

use std::path::{Path, PathBuf};

use banlieue_api::{Provider, VirtualMachine};
use banlieue_tests::control::{component_dir, repo_root, wait_for, ControlPlane};
use banlieue_tests::TestEnv;
use kube::api::Api;
use serde_json::json;

/// `banlieue ARGS…` (the workspace's build); its stdout, or why it failed.
fn banlieue(args: &[&str]) -> anyhow::Result<String> {
    let out = std::process::Command::new(banlieue_tests::bootstrap::banlieue()?).args(args).output()?;
    anyhow::ensure!(out.status.success(), "banlieue {}: {}{}", args.join(" "), String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `cargo ARGS…` in `dir`, as an author runs it (bounded), the scaffolds' builds kept in one
/// target directory so a second run reuses the SDK's.
fn cargo(dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    let out = std::process::Command::new("timeout")
        .arg("900")
        .arg(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(args)
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", scaffold_target())
        .env_remove("RUSTFLAGS")
        .output()?;
    anyhow::ensure!(out.status.success(), "cargo {} in {}: {}", args.join(" "), dir.display(), String::from_utf8_lossy(&out.stderr));
    Ok(())
}

fn scaffold_target() -> PathBuf {
    repo_root().join("target/scaffolds")
}

/// Scaffold component `name` of `kind`, build it, run its test; the built component.
fn scaffold(env: &TestEnv, kind: &str, name: &str) -> anyhow::Result<PathBuf> {
    let dir = env.dir().join(name);
    let said = banlieue(&["component", "new", kind, name, "--dir", &dir.to_string_lossy()])?;
    assert!(said.contains("cargo build --release"), "{said}");
    cargo(&dir, &["build", "--release"])?;
    cargo(&dir, &["test", "--target", "x86_64-unknown-linux-gnu"])?;
    let wasm = scaffold_target().join("wasm32-wasip2/release").join(format!("{}.wasm", name.replace('-', "_")));
    let inspected = banlieue(&["component", "inspect", &wasm.to_string_lossy()])?;
    assert!(inspected.contains(&format!("banlieue:{kind}")), "{inspected}");
    // Where file:// sources may be read from.
    let installed = component_dir(env).join(format!("{name}.wasm"));
    std::fs::copy(&wasm, &installed)?;
    Ok(installed)
}

#[tokio::test]
async fn scaffolded_components_build_as_written_and_run_in_banlieue() -> anyhow::Result<()> {
    let env = TestEnv::start("authors").await?;
    env.install_crds().await?;
    let ns = env.ns.as_str();

    // Bad names are refused before anything is written.
    let refused = banlieue(&["component", "new", "provider", "My_Driver", "--dir", &env.dir().join("bad").to_string_lossy()]).unwrap_err();
    assert!(refused.to_string().contains("is not a component name"), "{refused}");
    assert!(!env.dir().join("bad").exists());

    let driver = scaffold(&env, "provider", "acme-cloud")?;
    let policy = scaffold(&env, "placement", "roomiest")?;

    // The conformance suite runs the scaffold to its first honest failure: the probe stub.
    let manifest = env.dir().join("acme.yaml");
    std::fs::write(&manifest, "apiVersion: banlieue.io/v1alpha1\nkind: Provider\nmetadata: {name: acme, namespace: infra}\nspec:\n  providerClassRef: {name: acme}\n  connection: {endpoint: \"https://127.0.0.1:9\"}\n")?;
    let run = std::process::Command::new(banlieue_tests::bootstrap::banlieue()?)
        .args(["provider", "conformance", "--driver", &driver.to_string_lossy(), "-f", &manifest.to_string_lossy(), "--image", "template:any"])
        .output()?;
    let report = String::from_utf8_lossy(&run.stdout);
    assert_eq!(run.status.code(), Some(1), "{report}{}", String::from_utf8_lossy(&run.stderr));
    assert!(report.contains("FAIL probe") && report.contains("acme-cloud: `probe` is not written yet") && report.contains("nothing else was run"), "{report}");
    let _cp = ControlPlane::start(&env)?;

    // The driver, as a Provider's class: its probe stub's words are the Provider's condition.
    let class = format!("{ns}-acme");
    env.apply(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "ProviderClass", "metadata": {"name": class},
                     "spec": {"component": {"source": format!("file://{}", driver.display()), "verification": {"allowUnsigned": true}},
                              "infrastructureKind": "Acme", "capabilities": {"http": true}}}))
        .await?;
    env.apply(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "acme", "namespace": ns},
                     "spec": {"providerClassRef": {"name": class}, "connection": {"endpoint": "https://127.0.0.1:9"}}}))
        .await?;
    let providers: Api<Provider> = Api::namespaced(env.client.clone(), ns);
    let not_ready = |p: Option<&Provider>| {
        p.and_then(|p| p.status.as_ref()?.conditions.iter().find(|c| c.type_ == "Ready").cloned()).filter(|c| c.status == "False" && c.reason == "InvalidSpec")
    };
    let p = wait_for(&providers, "acme", 120, "refused by its stub", |p: Option<&Provider>| not_ready(p).is_some()).await?;
    let said = not_ready(Some(&p)).map(|c| c.message).unwrap_or_default();
    assert!(said.contains("acme-cloud: `probe` is not written yet"), "{said}");

    // The policy places a VM (on the libvirt test driver), giving its reason.
    let libvirt = env.libvirt_class();
    for object in [
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "ProviderClass", "metadata": {"name": libvirt},
               "spec": {"component": {"source": "builtin:provider-libvirt"}, "infrastructureKind": "Libvirt", "capabilities": {"libvirt": true}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "PlacementPolicy", "metadata": {"name": format!("{ns}-roomiest")},
               "spec": {"component": {"source": format!("file://{}", policy.display()), "verification": {"allowUnsigned": true}}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": format!("{ns}-small")},
               "spec": {"cpus": 1, "memoryMiB": 512, "disks": [{"name": "root", "sizeGiB": 4, "storageClass": "standard"}],
                        "nics": [{"name": "eth0", "networkClass": "default"}], "placementPolicyRef": {"name": format!("{ns}-roomiest")}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": format!("{ns}-debian")},
               "spec": {"sources": [{"providerClass": libvirt, "backingFile": "/var/lib/images/debian-12.qcow2"}]}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "a", "namespace": ns},
               "spec": {"providerClassRef": {"name": libvirt}, "connection": {"endpoint": "test:///default"},
                        "capabilities": {"storageClasses": {"standard": "default-pool"}, "networkClasses": {"default": "default"}}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": "web", "namespace": ns},
               "spec": {"classRef": {"name": format!("{ns}-small")}, "imageRef": {"name": format!("{ns}-debian")}}}),
    ] {
        env.apply(object).await?;
    }
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), ns);
    let scheduled = |v: Option<&VirtualMachine>| v.and_then(|v| v.status.as_ref()?.conditions.iter().find(|c| c.type_ == "Scheduled" && c.status == "True").cloned());
    let vm = wait_for(&vms, "web", 120, "scheduled", |v: Option<&VirtualMachine>| scheduled(v).is_some()).await?;
    let said = scheduled(Some(&vm)).map(|c| c.message).unwrap_or_default();
    assert!(said.contains(&format!("by {ns}-roomiest: most free memory")), "{said}");
    Ok(())
}
