//! For the people who write components: `banlieue component new provider|placement NAME`
//! writes a crate that builds for wasm32-wasip2 as written and passes its own test; the
//! component loads in banlieue from a file — the driver's stubs reach the Provider's
//! condition in their own words (and `banlieue provider conformance` runs it to that first
//! honest failure), the policy places a VM on the libvirt test driver — and `banlieue
//! placement explain` (and `kubectl vm place --dry-run`) says what the policy would do now.

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
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "b", "namespace": ns, "labels": {"site": "b"}},
               "spec": {"providerClassRef": {"name": libvirt}, "connection": {"endpoint": "test:///default"},
                        "capabilities": {"storageClasses": {"standard": "default-pool"}, "networkClasses": {"default": "default"}}}}),
        // Of a class the image has no source for: never a candidate, and explain says why.
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "vc", "namespace": ns},
               "spec": {"providerClassRef": {"name": format!("{ns}-vsphere")}, "connection": {"endpoint": "https://127.0.0.1:9"}}}),
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

    // What the policy would do now, from the live cluster: both libvirt Providers ranked in
    // the policy's words, the vSphere one left out naming why.
    let (code, out, err) = placement(&env, &["explain", "web", "-n", ns]).await?;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(&format!("policy {ns}-roomiest")), "{out}");
    let ranked: Vec<&str> = out.lines().filter(|l| l.contains("most free memory")).collect();
    assert_eq!(ranked.len(), 2, "{out}");
    assert!(ranked[0].trim_start().starts_with("1  ") && ranked[1].trim_start().starts_with("2  "), "{out}");
    assert!(out.contains(&format!("the image has no source for Provider vc's class \"{ns}-vsphere\"")), "{out}");
    // As JSON.
    let (code, out, err) = placement(&env, &["explain", "web", "-n", ns, "--json"]).await?;
    assert_eq!(code, 0, "{err}");
    let json: serde_json::Value = serde_json::from_str(&out)?;
    assert_eq!(json["ranked"].as_array().map(Vec::len), Some(2), "{json:#}");

    // An unpublished policy tried against the live candidates: the built-in spread's file.
    let spread = repo_root().join("guests/dist/placement-spread.wasm");
    let (code, out, err) = placement(&env, &["explain", "web", "-n", ns, "--policy", &spread.to_string_lossy(), "--top", "1"]).await?;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("placement-spread.wasm (--policy)") && out.contains("not ranked (--top 1)"), "{out}");

    // The same from a file of the objects (as `kubectl get -o yaml` writes them).
    let dump = env.dir().join("objects.yaml");
    let mut docs = vec![];
    for (kind, api) in [("virtualmachines", format!("-n={ns}")), ("providers", format!("-n={ns}"))] {
        docs.push(env.kubectl(&["get", kind, &api, "-o", "yaml"]).await?);
    }
    for (kind, name) in [("vmclasses", format!("{ns}-small")), ("vmimages", format!("{ns}-debian")), ("placementpolicies", format!("{ns}-roomiest"))] {
        docs.push(env.kubectl(&["get", kind, &name, "-o", "yaml"]).await?);
    }
    std::fs::write(&dump, docs.join("---\n"))?;
    let (code, out, err) = placement(&env, &["explain", "web", "-n", ns, "--from", &dump.to_string_lossy()]).await?;
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out.lines().filter(|l| l.contains("most free memory")).count(), 2, "{out}");

    // Through the plugin; without --dry-run it says it only explains; a missing VM is exit 3.
    let component_env = component_dir(&env).to_string_lossy().into_owned();
    let builtin = repo_root().join("guests/dist").to_string_lossy().into_owned();
    let plugin_env = [("BANLIEUE_COMPONENT_DIR", component_env.as_str()), ("BANLIEUE_BUILTIN_DIR", builtin.as_str()), ("PATH", &banlieue_tests::control::path_with_workspace_binaries())];
    let out = env.kubectl_raw(&["vm", "-n", ns, "place", "web", "--dry-run"], None, &plugin_env).await?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.lines().filter(|l| l.contains("most free memory")).count() == 2, "{text}{}", String::from_utf8_lossy(&out.stderr));
    let out = env.kubectl_raw(&["vm", "-n", ns, "place", "web"], None, &plugin_env).await?;
    assert_eq!(out.status.code(), Some(4), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("only explains (--dry-run)"));
    let (code, _, err) = placement(&env, &["explain", "nosuch", "-n", ns]).await?;
    assert_eq!(code, 3, "{err}");

    // The guides' last steps: keys made, the policy pushed to a registry and signed, and a
    // PlacementPolicy naming it by its digest with the public key places a VM; the minimal
    // driver published the same way becomes a ProviderClass a VM runs on.
    let registry = banlieue_test_backends::registry::Registry::start().await?;
    let keys = env.dir().join("team");
    let password = "correct horse battery staple";
    banlieue(&["component", "keygen", "--output-prefix", &keys.to_string_lossy(), "--password", password])?;
    let public = std::fs::read_to_string(keys.with_extension("pub"))?;
    let publish = |wasm: &Path, repository: &str| -> anyhow::Result<String> {
        let pinned = banlieue(&["component", "push", &wasm.to_string_lossy(), &format!("oci://{}/{repository}:0.1.0", registry.host)])?.trim().to_string();
        banlieue(&["component", "sign", &pinned, "--key", &keys.with_extension("key").to_string_lossy(), "--password", password])?;
        Ok(pinned)
    };
    let signed_policy = publish(&policy, "roomiest")?;
    let minimal = publish(&repo_root().join("guests/dist/minimal-provider.wasm"), "minimal")?;
    let signed = |source: &str| json!({"source": source, "verification": {"publicKeys": [public]}});
    for object in [
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "PlacementPolicy", "metadata": {"name": format!("{ns}-published")}, "spec": {"component": signed(&signed_policy)}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "ProviderClass", "metadata": {"name": format!("{ns}-minimal")},
               "spec": {"component": signed(&minimal), "infrastructureKind": "Minimal"}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "m", "namespace": ns},
               "spec": {"providerClassRef": {"name": format!("{ns}-minimal")}, "connection": {"endpoint": "https://minimal.invalid"},
                        "capabilities": {"storageClasses": {"standard": "any"}, "networkClasses": {"default": "any"}}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": format!("{ns}-anything")},
               "spec": {"sources": [{"providerClass": format!("{ns}-minimal"), "template": "any"}]}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": "db", "namespace": ns},
               "spec": {"classRef": {"name": format!("{ns}-small")}, "imageRef": {"name": format!("{ns}-anything")},
                        "placement": {"policyRef": {"name": format!("{ns}-published")}}}}),
    ] {
        env.apply(object).await?;
    }
    let ready = |v: Option<&VirtualMachine>| v.and_then(|v| v.status.as_ref()?.conditions.iter().find(|c| c.type_ == "Ready" && c.status == "True").cloned()).is_some();
    let db = wait_for(&vms, "db", 180, "Ready on the published driver", ready).await?;
    let placed = scheduled(Some(&db)).map(|c| c.message).unwrap_or_default();
    assert!(placed.starts_with("m/") && placed.contains(&format!("by {ns}-published: most free memory")), "{placed}");
    let kind = db.status.as_ref().and_then(|s| s.infrastructure_ref.as_ref()).map(|r| r.kind.clone()).unwrap_or_default();
    assert_eq!(kind, "MinimalMachine", "made by the published driver's class");
    // The registry served the signed artifacts: their manifests and signatures were fetched.
    let log = registry.log();
    assert!(log.contains("/v2/roomiest/manifests/sha256-") && log.contains("/v2/minimal/manifests/sha256-"), "the signatures were fetched:\n{log}");

    // What the policy costs, over generated candidates.
    let (code, out, err) = placement(&env, &["bench", &policy.to_string_lossy(), "--candidates", "1000", "--runs", "3"]).await?;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("over 1000 candidates, 3 calls") && out.contains("choose: median") && out.contains("most free memory"), "{out}");
    Ok(())
}

/// `banlieue placement ARGS…` against the test's cluster (which this process serves: waited
/// for without blocking it), components found as the roles find them.
async fn placement(env: &TestEnv, args: &[&str]) -> anyhow::Result<(i32, String, String)> {
    let out = tokio::process::Command::new(banlieue_tests::bootstrap::banlieue()?)
        .arg("placement")
        .args(args)
        .env("KUBECONFIG", &env.kubeconfig)
        .env("BANLIEUE_COMPONENT_DIR", component_dir(env))
        .env("BANLIEUE_BUILTIN_DIR", repo_root().join("guests/dist"))
        .kill_on_drop(true)
        .output();
    let out = banlieue_tests::within(300, out).await??;
    Ok((out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned()))
}
