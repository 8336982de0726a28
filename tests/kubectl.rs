//! A user's kubectl session against the API (embedded server or any cluster):
//! apply, server-side apply, get -o wide, describe, patch, edit, wait, explain,
//! get --watch, delete.

use banlieue_api::VirtualMachine;
use banlieue_tests::*;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

fn quickstart() -> String {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/quickstart/vm.yaml").display().to_string()
}

#[tokio::test]
async fn apply_get_describe_patch_edit_delete() -> anyhow::Result<()> {
    let env = TestEnv::start("kubectl-flow").await?;
    env.install_crds().await?;
    let ns = env.ns.as_str();
    let out = env.kubectl(&["apply", "-n", ns, "-f", &quickstart()]).await?;
    assert!(out.contains("virtualmachine.banlieue.io/hello created"), "{out}");
    let again = env.kubectl(&["apply", "-n", ns, "-f", &quickstart()]).await?;
    assert!(again.contains("virtualmachine.banlieue.io/hello unchanged"), "{again}");

    let wide = env.kubectl(&["get", "vm", "-n", ns, "-o", "wide"]).await?;
    let header = wide.lines().next().unwrap_or_default();
    for col in ["NAME", "CLASS", "IMAGE", "PROVIDER", "POWER", "READY", "ADDRESS", "AGE"] {
        assert!(header.contains(col), "{col} missing in {header}");
    }
    assert!(wide.lines().nth(1).is_some_and(|l| l.starts_with("hello") && l.contains("small") && l.contains("debian-12")), "{wide}");
    let narrow = env.kubectl(&["get", "vm", "-n", ns]).await?;
    assert!(!narrow.lines().next().unwrap_or_default().contains("ADDRESS"), "priority columns only with -o wide");

    let described = env.kubectl(&["describe", "vm", "hello", "-n", ns]).await?;
    assert!(described.contains("Name:         hello") && described.contains("Class Ref"), "{described}");

    env.kubectl(&["patch", "vm", "hello", "-n", ns, "--type", "merge", "-p", r#"{"spec":{"desiredPowerState":"PoweredOff"}}"#]).await?;
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), ns);
    assert_eq!(vms.get("hello").await?.spec.desired_power_state, banlieue_api::common::PowerState::PoweredOff);

    // kubectl edit with a scripted editor.
    let editor = env.dir().join("editor.sh");
    std::fs::write(&editor, "#!/bin/sh\nsed -i 's/paused: false/paused: true/' \"$1\"\n")?;
    std::fs::set_permissions(&editor, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let out = env.kubectl_raw(&["edit", "vm", "hello", "-n", ns], None, &[("KUBE_EDITOR", editor.to_str().unwrap())]).await?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(vms.get("hello").await?.spec.paused, "edit applied");

    let out = env.kubectl(&["delete", "vm", "hello", "-n", ns]).await?;
    assert!(out.contains("deleted"), "{out}");
    assert!(vms.get_opt("hello").await?.is_none());
    Ok(())
}

#[tokio::test]
async fn server_side_apply_records_kubectl_as_manager() -> anyhow::Result<()> {
    let env = TestEnv::start("kubectl-ssa").await?;
    env.install_crds().await?;
    let ns = env.ns.as_str();
    let out = env.kubectl(&["apply", "--server-side", "-n", ns, "-f", &quickstart()]).await?;
    assert!(out.contains("virtualmachine.banlieue.io/hello serverside-applied"), "{out}");
    let yaml = env.kubectl(&["get", "vm", "hello", "-n", ns, "-o", "yaml", "--show-managed-fields"]).await?;
    assert!(yaml.contains("manager: kubectl") && yaml.contains("operation: Apply"), "{yaml}");
    // Another manager changing an applied field conflicts until forced.
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), ns);
    vms.patch("hello", &PatchParams::apply("other").force(), &Patch::Apply(json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": "hello"},
        "spec": {"classRef": {"name": "large"}, "imageRef": {"name": "debian-12"}}
    }))).await?;
    let out = env.kubectl_raw(&["apply", "--server-side", "-n", ns, "-f", &quickstart()], None, &[]).await?;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("conflict"), "{}", String::from_utf8_lossy(&out.stderr));
    env.kubectl(&["apply", "--server-side", "--force-conflicts", "-n", ns, "-f", &quickstart()]).await?;
    assert_eq!(vms.get("hello").await?.spec.class_ref.name, "small");
    Ok(())
}

#[tokio::test]
async fn wait_for_condition_sees_the_status_change() -> anyhow::Result<()> {
    let env = TestEnv::start("kubectl-wait").await?;
    env.install_crds().await?;
    let ns = env.ns.as_str();
    env.kubectl(&["apply", "-n", ns, "-f", &quickstart()]).await?;
    let waiter = env.kubectl_command(&["wait", "-n", ns, "--for=condition=Ready", "vm/hello", "--timeout=60s"], &[]).spawn()?;
    // Make the VM Ready as a controller would; kubectl sees it on its list or its watch.
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), ns);
    vms.patch_status("hello", &PatchParams::default(), &Patch::Merge(json!({"status": {"conditions": [
        {"type": "Ready", "status": "True", "reason": "Provisioned", "message": "ok", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    ]}}))).await?;
    let out = within(60, waiter.wait_with_output()).await??;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("condition met"));
    Ok(())
}

#[tokio::test]
async fn explain_shows_field_docs() -> anyhow::Result<()> {
    let env = TestEnv::start("kubectl-explain").await?;
    // kubectl explain reads custom resources' docs through OpenAPI v3 (GA in 1.27).
    if env.older_than(27, "kubectl explain of custom resources (OpenAPI v3)").await? {
        return Ok(());
    }
    env.install_crds().await?;
    let out = env.kubectl(&["explain", "virtualmachines.spec.placement"]).await?;
    assert!(out.contains("antiAffinity") && out.contains("providerSelector"), "{out}");
    let out = env.kubectl(&["explain", "vmclass.spec.cpus"]).await?;
    assert!(out.contains("Virtual CPUs"), "{out}");
    Ok(())
}

#[tokio::test]
async fn get_watch_streams_new_objects() -> anyhow::Result<()> {
    let env = TestEnv::start("kubectl-watch").await?;
    env.install_crds().await?;
    let ns = env.ns.as_str();
    env.kubectl(&["apply", "-n", ns, "-f", &quickstart()]).await?;
    let mut child = env.kubectl_command(&["get", "vm", "-n", ns, "--watch"], &[]).spawn()?;
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = within(30, async {
        loop {
            let l = lines.next_line().await?.unwrap_or_default();
            if l.starts_with("hello") {
                return Ok::<_, anyhow::Error>(l);
            }
        }
    })
    .await??;
    assert!(first.contains("small"));
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), ns);
    let mut second = vms.get("hello").await?;
    second.metadata = kube::api::ObjectMeta { name: Some("world".into()), ..Default::default() };
    vms.create(&Default::default(), &second).await?;
    within(30, async {
        loop {
            let l = lines.next_line().await?.unwrap_or_default();
            if l.starts_with("world") {
                return Ok::<_, anyhow::Error>(());
            }
        }
    })
    .await??;
    child.kill().await?;
    Ok(())
}

#[tokio::test]
async fn create_built_ins_and_describe_shows_events() -> anyhow::Result<()> {
    let env = TestEnv::start("kubectl-builtins").await?;
    env.install_crds().await?;
    let ns = env.ns.as_str();
    // Typed kubectl commands send protobuf bodies.
    env.kubectl(&["create", "configmap", "settings", "-n", ns, "--from-literal=mode=fast"]).await?;
    env.kubectl(&["create", "secret", "generic", "creds", "-n", ns, "--from-literal=password=s3cret"]).await?;
    let data = env.kubectl(&["get", "secret", "creds", "-n", ns, "-o", "jsonpath={.data.password}"]).await?;
    assert_eq!(data, "czNjcmV0");
    env.kubectl(&["label", "configmap", "settings", "-n", ns, "tier=gold"]).await?;
    let labelled = env.kubectl(&["get", "configmaps", "-n", ns, "-l", "tier=gold", "-o", "name"]).await?;
    assert_eq!(labelled.trim(), "configmap/settings");

    env.kubectl(&["apply", "-n", ns, "-f", &quickstart()]).await?;
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), ns);
    let vm = vms.get("hello").await?;
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(env.client.clone(), ns);
    let ev: k8s_openapi::api::core::v1::Event = serde_json::from_value(json!({
        "metadata": {"name": "hello.1"},
        "involvedObject": {"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "name": "hello", "namespace": ns, "uid": vm.metadata.uid},
        "reason": "Scheduled", "message": "placed on lab-libvirt/host-1", "type": "Normal",
        "source": {"component": "banlieue-controller"}, "count": 1,
        "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:00:00Z"
    }))?;
    events.create(&Default::default(), &ev).await?;
    let described = env.kubectl(&["describe", "vm", "hello", "-n", ns]).await?;
    assert!(described.contains("Scheduled") && described.contains("placed on lab-libvirt/host-1"), "{described}");
    Ok(())
}
