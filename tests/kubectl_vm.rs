//! `kubectl vm` as a user runs it: the real `kubectl` finds the `kubectl-vm` plugin on
//! `PATH`; each command's output and exit code are checked, and what it changed is
//! checked on the backend (libvirt's test driver) and on the objects.

use banlieue_api::VirtualMachine;
use banlieue_libvirt::DomainState;
use banlieue_tests::control::{kubectl_vm, libvirt_fixtures, wait_for, ControlPlane};
use banlieue_tests::TestEnv;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::{json, Value};

async fn fixtures(env: &TestEnv) -> anyhow::Result<()> {
    libvirt_fixtures(env, &[("a", "test:///default")]).await
}

fn vm(env: &TestEnv, name: &str, placement: Value) -> Value {
    let ns = &env.ns;
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name, "namespace": ns},
           "spec": {"classRef": {"name": format!("{ns}-small")}, "imageRef": {"name": format!("{ns}-debian")}, "placement": placement}})
}

fn is_ready(v: Option<&VirtualMachine>) -> bool {
    v.and_then(|v| v.status.as_ref()).is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[tokio::test]
async fn power_commands_wait_for_the_backend_and_errors_have_their_exit_codes() -> anyhow::Result<()> {
    let env = TestEnv::start("kubectl-vm").await?;
    env.install_crds().await?;
    let cp = ControlPlane::start(&env)?;
    fixtures(&env).await?;
    env.apply(vm(&env, "web", json!({}))).await?;
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    wait_for(&vms, "web", 60, "Ready", is_ready).await?;
    let libvirt = cp.ctx.libvirt.get("test:///default").await?;
    let domain = format!("{}_web", env.ns);
    let state = || {
        let (libvirt, domain) = (libvirt.clone(), domain.clone());
        async move { anyhow::Ok(libvirt.domain_list().await?.into_iter().find(|d| d.name == domain).map(|d| d.state)) }
    };
    let ns = env.ns.clone();

    // list, wide and structured.
    let (code, out, _) = kubectl_vm(&env, &["list", "-n", &ns]).await?;
    assert_eq!(code, 0);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("NAME") && lines[0].contains("READY") && lines[0].contains("PROVIDER"), "{out}");
    assert!(lines[1].starts_with("web ") && lines[1].contains("True") && lines[1].contains("PoweredOn") && lines[1].contains(" a "), "{out}");
    assert!(!out.contains('\x1b'), "no colour when piped");
    let (_, wide, _) = kubectl_vm(&env, &["list", "-n", &ns, "-o", "wide"]).await?;
    assert!(wide.lines().next().is_some_and(|h| h.contains("FAILURE-DOMAIN") && h.contains("ADDRESSES")), "{wide}");
    let (_, json_out, _) = kubectl_vm(&env, &["list", "-n", &ns, "-o", "json"]).await?;
    let parsed: Value = serde_json::from_str(&json_out)?;
    assert_eq!(parsed["items"][0]["metadata"]["name"], "web");
    let (_, all, _) = kubectl_vm(&env, &["list", "-A"]).await?;
    assert!(all.lines().next().is_some_and(|h| h.starts_with("NAMESPACE")) && all.contains(&ns), "{all}");

    // stop --mode soft --wait: the field is set and the backend domain is off when it returns.
    let (code, out, err) = kubectl_vm(&env, &["stop", "web", "-n", &ns, "--mode", "soft", "--wait", "--timeout", "60"]).await?;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("virtualmachine/web is PoweredOff"), "{out}");
    assert_eq!(state().await?, Some(DomainState::Shutoff));
    let now = vms.get("web").await?;
    assert_eq!(serde_json::to_value(now.spec.power_off_mode)?, json!("Soft"));
    let (code, _, _) = kubectl_vm(&env, &["start", "web", "-n", &ns, "--wait"]).await?;
    assert_eq!(code, 0);
    assert_eq!(state().await?, Some(DomainState::Running));
    let (code, out, _) = kubectl_vm(&env, &["restart", "web", "-n", &ns, "--wait"]).await?;
    assert_eq!(code, 0, "{out}");
    let restarted = vms.get("web").await?;
    assert_eq!(restarted.status.and_then(|s| s.last_restart_requested_at), restarted.spec.restart_requested_at);

    // status: conditions and events.
    let (code, out, _) = kubectl_vm(&env, &["status", "web", "-n", &ns]).await?;
    assert_eq!(code, 0);
    assert!(out.contains("CONDITION") && out.contains("REASON"), "{out}");
    assert!(out.lines().any(|l| l.contains("Normal") && l.contains("Scheduled")), "recent events: {out}");
    assert!(out.lines().any(|l| l.starts_with("Ready ") && l.contains("True")), "{out}");

    // Unknown VM: exit 3 with the closest names.
    let (code, _, err) = kubectl_vm(&env, &["start", "wbe", "-n", &ns]).await?;
    assert_eq!(code, 3);
    assert!(err.contains("virtualmachine \"wbe\" not found") && err.contains("did you mean web?"), "{err}");

    // Paused: exit 4, and saying so.
    let (code, _, _) = kubectl_vm(&env, &["pause", "web", "-n", &ns]).await?;
    assert_eq!(code, 0);
    assert!(vms.get("web").await?.spec.paused);
    let (code, _, err) = kubectl_vm(&env, &["stop", "web", "-n", &ns]).await?;
    assert_eq!(code, 4);
    assert!(err.contains("is paused"), "{err}");
    assert_eq!(state().await?, Some(DomainState::Running), "nothing changed");
    kubectl_vm(&env, &["unpause", "web", "-n", &ns]).await?;

    // --wait that cannot be satisfied: exit 5 after the timeout, with the VM's Ready condition.
    env.apply(vm(&env, "lost", json!({"providerRef": {"name": "nowhere"}}))).await?;
    let (code, _, err) = kubectl_vm(&env, &["start", "lost", "-n", &ns, "--wait", "--timeout", "2"]).await?;
    assert_eq!(code, 5);
    assert!(err.contains("not Ready and PoweredOn after 2s") && err.contains("Ready is"), "{err}");

    // Being deleted: exit 4.
    vms.patch("lost", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": ["banlieue.io/test-hold"]}}))).await?;
    vms.delete("lost", &DeleteParams::default()).await?;
    let (code, _, err) = kubectl_vm(&env, &["restart", "lost", "-n", &ns]).await?;
    assert_eq!(code, 4);
    assert!(err.contains("is being deleted"), "{err}");
    let hold = vms.get("lost").await?.metadata.finalizers.unwrap_or_default().into_iter().filter(|f| f != "banlieue.io/test-hold").collect::<Vec<_>>();
    vms.patch("lost", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": hold}}))).await?;
    Ok(())
}

#[tokio::test]
async fn pools_are_listed_and_scaled_and_a_member_is_started_like_any_vm() -> anyhow::Result<()> {
    let env = TestEnv::start("kubectl-vm-pool").await?;
    env.install_crds().await?;
    let _cp = ControlPlane::start(&env)?;
    fixtures(&env).await?;
    let ns = env.ns.clone();
    env.apply(
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachinePool", "metadata": {"name": "web", "namespace": ns},
               "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                        "template": {"metadata": {"labels": {"app": "web"}},
                                     "spec": {"classRef": {"name": format!("{ns}-small")}, "imageRef": {"name": format!("{ns}-debian")}}}}}),
    )
    .await?;
    let (code, out, err) = kubectl_vm(&env, &["scale", "web", "3", "-n", &ns, "--wait", "--timeout", "90"]).await?;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("virtualmachinepool/web has 3 Ready members"), "{out}");
    let (_, out, _) = kubectl_vm(&env, &["pools", "-n", &ns]).await?;
    let row = out.lines().find(|l| l.starts_with("web ")).unwrap_or_default().split_whitespace().collect::<Vec<_>>();
    assert_eq!(&row[..5], ["web", "3", "3", "3", "3"], "{out}");

    let (code, _, _) = kubectl_vm(&env, &["stop", "web-1", "-n", &ns, "--wait"]).await?;
    assert_eq!(code, 0);
    let (code, out, _) = kubectl_vm(&env, &["start", "web-1", "-n", &ns, "--wait"]).await?;
    assert_eq!(code, 0, "a pool member starts like any VM: {out}");

    let (code, _, err) = kubectl_vm(&env, &["scale", "wbe", "2", "-n", &ns]).await?;
    assert_eq!(code, 3);
    assert!(err.contains("did you mean web?"), "{err}");
    let (code, _, err) = kubectl_vm(&env, &["scale", "web", "5000", "-n", &ns]).await?;
    assert_eq!(code, 4, "{err}");
    Ok(())
}

#[tokio::test]
async fn without_banlieue_installed_it_says_so_and_completion_scripts_print() -> anyhow::Result<()> {
    if TestEnv::external() {
        eprintln!("skipped the not-installed case: a shared cluster has banlieue's CRDs");
    } else {
        let env = TestEnv::start("kubectl-vm-bare").await?;
        let (code, _, err) = kubectl_vm(&env, &["list"]).await?;
        assert_eq!(code, 6, "{err}");
        assert!(err.contains("banlieue is not installed") && err.contains("kubectl apply -k deploy/"), "{err}");
    }
    let env = TestEnv::start("kubectl-vm-completion").await?;
    for shell in ["bash", "zsh", "fish"] {
        let (code, out, _) = kubectl_vm(&env, &["completion", shell]).await?;
        assert_eq!(code, 0);
        assert!(out.contains("kubectl-vm") && out.contains("restart"), "{shell}: {out}");
    }
    let (code, _, err) = kubectl_vm(&env, &["frobnicate"]).await?;
    assert_eq!(code, 2, "bad usage: {err}");
    Ok(())
}

/// `kubectl vm snapshot|snapshots|revert`: what each made is checked on libvirt's own
/// snapshot list; refusals and unknown names have their exit codes.
#[tokio::test]
async fn snapshot_commands_take_list_and_revert_on_the_backend() -> anyhow::Result<()> {
    let env = TestEnv::start("kubectl-vm-snap").await?;
    env.install_crds().await?;
    let cp = ControlPlane::start(&env)?;
    fixtures(&env).await?;
    env.apply(vm(&env, "web", json!({}))).await?;
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    wait_for(&vms, "web", 60, "Ready", is_ready).await?;
    let libvirt = cp.ctx.libvirt.get("test:///default").await?;
    let domain = format!("{}_web", env.ns);
    let ns = env.ns.clone();

    let (code, out, err) = kubectl_vm(&env, &["snapshot", "web", "-n", &ns, "--name", "first", "--description", "before the upgrade", "--wait", "--timeout", "60"]).await?;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("vmsnapshot/first is Ready (backend snapshot bl-"), "{out}");
    let (code, _, _) = kubectl_vm(&env, &["snapshot", "web", "-n", &ns, "--name", "second", "--wait"]).await?;
    assert_eq!(code, 0);
    let on_libvirt = libvirt.snapshot_list(&domain).await?;
    assert_eq!(on_libvirt.len(), 2, "{on_libvirt:?}");
    assert!(on_libvirt.iter().any(|s| s.xml.contains("before the upgrade")));

    let (code, out, _) = kubectl_vm(&env, &["snapshots", "web", "-n", &ns]).await?;
    assert_eq!(code, 0);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("NAME") && lines[0].contains("PHASE") && lines[0].contains("MEMORY"), "{out}");
    assert!(lines[1].starts_with("first ") && lines[1].contains("Ready") && lines[2].starts_with("second "), "oldest first: {out}");

    // Revert, waited for: libvirt's current snapshot is the first one's.
    let (code, out, err) = kubectl_vm(&env, &["revert", "web", "first", "-n", &ns, "--wait", "--timeout", "60"]).await?;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("virtualmachine/web is reverted to first"), "{out}");
    let current: Vec<String> = libvirt.snapshot_list(&domain).await?.into_iter().filter(|s| s.current).map(|s| s.name).collect();
    let first = kube::Api::<banlieue_api::VMSnapshot>::namespaced(env.client.clone(), &ns).get("first").await?;
    assert_eq!(current, [first.status.unwrap().snapshot_id.unwrap()]);

    // Restore into a new VM, on the snapshot's Provider, with the VM's spec.
    let (code, out, err) = kubectl_vm(&env, &["restore", "second", "--to", "web-copy", "-n", &ns, "--wait", "--timeout", "60"]).await?;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("virtualmachine/web-copy restoring from second on a"), "{out}");
    let copy = vms.get("web-copy").await?;
    assert_eq!(copy.spec.source.as_ref().map(|s| s.snapshot_ref.name.as_str()), Some("second"));
    assert!(libvirt.domain_list().await?.iter().any(|d| d.name == format!("{ns}_web-copy")), "the restored domain on libvirt");
    let (code, _, err) = kubectl_vm(&env, &["restore", "second", "--to", "web-copy", "-n", &ns]).await?;
    assert_eq!(code, 4, "a name taken: {err}");

    // Unknown names and refusals.
    let (code, _, err) = kubectl_vm(&env, &["revert", "web", "frist", "-n", &ns]).await?;
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("vmsnapshot \"frist\" not found") && err.contains("did you mean first"), "{err}");
    let (code, _, err) = kubectl_vm(&env, &["snapshot", "nope", "-n", &ns]).await?;
    assert_eq!(code, 3, "{err}");
    let (code, _, _) = kubectl_vm(&env, &["stop", "web", "-n", &ns, "--mode", "hard", "--wait"]).await?;
    assert_eq!(code, 0);
    let (code, _, err) = kubectl_vm(&env, &["snapshot", "web", "-n", &ns, "--name", "with-memory", "--memory", "--wait", "--timeout", "60"]).await?;
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("InvalidSpec: spec.memory"), "{err}");
    assert_eq!(libvirt.snapshot_list(&domain).await?.len(), 2, "nothing made on libvirt");
    Ok(())
}
