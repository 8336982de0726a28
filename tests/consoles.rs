//! Consoles, as users open them, on the embedded server and on a real kube-apiserver alike:
//!
//! - who may open one is decided by the cluster — the caller's token reviewed
//!   (`TokenReview`), its permission checked (`SubjectAccessReview`) for `get` on
//!   `virtualmachines/console` or `virtualmachines/vnc` — for ServiceAccounts with different
//!   Roles, their tokens issued by the API server (`TokenRequest`);
//! - `kubectl vm console` and `kubectl vm vnc` against the libvirtd + qemu test guest (its
//!   shell answers, its VNC server speaks RFB), fakepve (termproxy, vncproxy behind a
//!   one-time password) and vcsim (a webmks ticket asked for, which it does not hand out);
//! - the browser page in a real headless Chromium (xterm.js and noVNC).

use banlieue_controller::console::access::{authorize, Console, Refused};
use banlieue_tests::TestEnv;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use serde_json::json;

/// A ServiceAccount bound to a Role of `rules` in the test's namespace; a token for it.
async fn account(env: &TestEnv, name: &str, rules: serde_json::Value) -> anyhow::Result<String> {
    let ns = &env.ns;
    for object in [
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": name, "namespace": ns}, "rules": rules}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": name, "namespace": ns},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
               "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]}),
    ] {
        env.apply(object).await?;
    }
    let accounts: Api<ServiceAccount> = Api::namespaced(env.client.clone(), ns);
    let request: TokenRequest = serde_json::from_value(json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"audiences": [], "expirationSeconds": 600}}))?;
    let issued = accounts.create_token_request(name, &PostParams::default(), &request).await?;
    Ok(issued.status.map(|s| s.token).unwrap_or_default())
}

/// A client of the test's API server that authenticates with `token`.
async fn client_with(env: &TestEnv, token: &str) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(&env.kubeconfig)?;
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    cfg.auth_info = kube::config::AuthInfo { token: Some(token.to_string().into()), ..Default::default() };
    Ok(kube::Client::try_from(cfg)?)
}

#[tokio::test]
async fn the_cluster_decides_who_opens_a_vms_console() -> anyhow::Result<()> {
    let env = TestEnv::start("console-rbac").await?;
    env.install_crds().await?;
    let viewer = account(&env, "viewer", json!([{"apiGroups": ["banlieue.io"], "resources": ["virtualmachines"], "verbs": ["get", "list"]}])).await?;
    let operator = account(
        &env,
        "operator",
        json!([{"apiGroups": ["banlieue.io"], "resources": ["virtualmachines", "virtualmachines/console"], "verbs": ["get"]}]),
    )
    .await?;
    let ns = env.ns.as_str();

    // The operator may open the serial console, as who the API server says it is.
    let caller = authorize(&env.client, &operator, ns, "web", Console::Serial).await.map_err(|r| anyhow::anyhow!("{r:?}"))?;
    assert_eq!(caller.user, format!("system:serviceaccount:{ns}:operator"));
    assert!(caller.groups.iter().any(|g| g == &format!("system:serviceaccounts:{ns}")), "{:?}", caller.groups);

    // Not the graphical one: its Role names only `virtualmachines/console`.
    let refused = authorize(&env.client, &operator, ns, "web", Console::Vnc).await.unwrap_err();
    assert_eq!(refused.status(), 403);
    assert!(refused.message().contains("cannot get resource \"virtualmachines/vnc\""), "{refused:?}");

    // The viewer reads VMs but opens no console; the message names the verb and subresource.
    let refused = authorize(&env.client, &viewer, ns, "web", Console::Serial).await.unwrap_err();
    assert_eq!(refused.status(), 403);
    let message = refused.message();
    assert!(message.contains(&format!("User \"system:serviceaccount:{ns}:viewer\" cannot get resource \"virtualmachines/console\"")), "{message}");
    // (Its token is a real one: the API server itself lets it list VMs, and no more.)
    let as_viewer: Api<banlieue_api::VirtualMachine> = Api::namespaced(client_with(&env, &viewer).await?, ns);
    as_viewer.list(&Default::default()).await?;
    let denied = as_viewer.delete("web", &Default::default()).await.unwrap_err();
    assert!(matches!(&denied, kube::Error::Api(e) if e.code == 403), "{denied:?}");

    // In another namespace the operator's Role does not reach.
    let refused = authorize(&env.client, &operator, "default", "web", Console::Serial).await.unwrap_err();
    assert_eq!(refused.status(), 403, "{refused:?}");

    // `edit` opens consoles: deploy/base/users.yaml's ClusterRole is aggregated into it — by
    // kube-controller-manager on a real cluster (the embedded server has no default roles
    // and aggregates none: that part is for real clusters only).
    if env.embedded().is_none() {
        let users = std::fs::read_to_string(banlieue_tests::control::repo_root().join("deploy/base/users.yaml"))?;
        env.kubectl_raw(&["apply", "-f", "-"], Some(&users), &[]).await?;
        let editor = account(&env, "editor", json!([])).await?;
        env.apply(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "editor-edit", "namespace": ns},
                         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
                         "subjects": [{"kind": "ServiceAccount", "name": "editor", "namespace": ns}]}))
            .await?;
        let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(env.client.clone());
        let aggregated = |r: Option<&k8s_openapi::api::rbac::v1::ClusterRole>| {
            r.and_then(|r| r.rules.as_ref()).is_some_and(|rules| rules.iter().any(|rule| rule.resources.iter().flatten().any(|res| res == "virtualmachines/console")))
        };
        banlieue_tests::within(60, kube::runtime::wait::await_condition(roles, "edit", aggregated)).await??;
        let caller = authorize(&env.client, &editor, ns, "web", Console::Vnc).await.map_err(|r| anyhow::anyhow!("an editor: {r:?}"))?;
        assert_eq!(caller.user, format!("system:serviceaccount:{ns}:editor"));
    }

    // A token the API server does not know, and none at all.
    for token in ["not-a-token", ""] {
        let refused = authorize(&env.client, token, ns, "web", Console::Serial).await.unwrap_err();
        assert!(matches!(refused, Refused::Unauthenticated(_)), "{token:?}: {refused:?}");
        assert_eq!(refused.status(), 401);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Sessions, end to end: `kubectl vm console` and `kubectl vm vnc` through banlieue's console
// server, against the libvirtd + qemu test guest.

/// Bound on a TCG boot (~15 s alone; two cores shared by parallel tests).
const BOOT_SECS: u64 = 180;

/// Held by each test here that runs a libvirtd guest: one at a time, so that no guest's tap
/// device comes or goes while the browser test's page loads (Chromium cuts off loads when the
/// machine's network changes).
static LIBVIRTD_GUESTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `kubectl vm ARGS…` as the holder of `token` (exit code, stdout, stderr).
async fn kubectl_vm_as(env: &TestEnv, token: &str, args: &[&str]) -> anyhow::Result<(i32, String, String)> {
    let path = banlieue_tests::control::path_with_workspace_binaries();
    let mut full = vec!["vm", "-n", env.ns.as_str()];
    full.extend_from_slice(args);
    let out = env.kubectl_raw(&full, None, &[("PATH", &path), ("KUBECTL_VM_TOKEN", token)]).await?;
    Ok((out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned()))
}

/// A running `kubectl vm ARGS…` (its stdin, stdout and stderr piped), as the holder of `token`.
fn kubectl_vm_session(env: &TestEnv, token: &str, args: &[&str]) -> anyhow::Result<tokio::process::Child> {
    let path = banlieue_tests::control::path_with_workspace_binaries();
    let mut full = vec!["vm", "-n", env.ns.as_str()];
    full.extend_from_slice(args);
    let mut cmd = env.kubectl_command(&full, &[("PATH", &path), ("KUBECTL_VM_TOKEN", token)]);
    cmd.stdin(std::process::Stdio::piped());
    Ok(cmd.spawn()?)
}

/// Reading VMs and Providers (what finding a VM's console server takes), and no more.
fn reads() -> serde_json::Value {
    json!({"apiGroups": ["banlieue.io"], "resources": ["virtualmachines", "providers"], "verbs": ["get", "list"]})
}

/// A user who reads VMs and opens their consoles and displays: a token for them.
async fn operator(env: &TestEnv) -> anyhow::Result<String> {
    account(env, "operator", json!([reads(), {"apiGroups": ["banlieue.io"], "resources": ["virtualmachines/console", "virtualmachines/vnc"], "verbs": ["get"]}])).await
}

/// What a running command printed, read as it comes (one reader per stream).
struct Output {
    seen: std::sync::Arc<tokio::sync::Mutex<String>>,
    more: tokio::sync::watch::Receiver<usize>,
}

impl Output {
    fn of(stream: impl tokio::io::AsyncRead + Unpin + Send + 'static) -> Output {
        use tokio::io::AsyncReadExt;
        let seen = std::sync::Arc::new(tokio::sync::Mutex::new(String::new()));
        let (tx, more) = tokio::sync::watch::channel(0usize);
        let kept = seen.clone();
        tokio::spawn(async move {
            let mut stream = stream;
            let mut buf = vec![0u8; 4096];
            while let Ok(n) = stream.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                let mut s = kept.lock().await;
                s.push_str(&String::from_utf8_lossy(&buf[..n]).replace('\r', ""));
                let _ = tx.send(s.len());
            }
        });
        Output { seen, more }
    }

    /// Wait (bounded) until the output holds `text`; all of it.
    async fn until(&mut self, secs: u64, text: &str) -> anyhow::Result<String> {
        self.until_after(0, secs, text).await
    }

    /// How much has been read so far.
    async fn len(&self) -> usize {
        self.seen.lock().await.len()
    }

    /// Wait (bounded) until what came after the first `from` bytes holds `text`; all of it.
    async fn until_after(&mut self, from: usize, secs: u64, text: &str) -> anyhow::Result<String> {
        let found = banlieue_tests::within(secs, async {
            loop {
                if self.seen.lock().await.get(from..).is_some_and(|s| s.contains(text)) {
                    return true;
                }
                if self.more.changed().await.is_err() {
                    return self.seen.lock().await.get(from..).is_some_and(|s| s.contains(text));
                }
            }
        })
        .await;
        let all = self.seen.lock().await.clone();
        match found {
            Ok(true) => Ok(all),
            _ => anyhow::bail!("{text:?} did not come within {secs}s; got:\n{all}"),
        }
    }
}

/// `kubectl vm vnc VM` as the holder of `token`, and an RFB 3.8 client of the local port it
/// prints, up to the display's ServerInit: the user is offered one security type, None (the
/// cluster authorized the session; a display's own password, if any, the host answered).
/// The framebuffer's width and height, and the display's name.
async fn display_of(env: &TestEnv, token: &str, vm: &str) -> anyhow::Result<(u16, u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut vnc = kubectl_vm_session(env, token, &["vnc", vm])?;
    let mut listening = Output::of(vnc.stdout.take().expect("stdout"));
    let printed = listening.until(60, "(vnc://").await?;
    let addr = printed.split("(vnc://").nth(1).and_then(|r| r.split(')').next()).expect("an address").to_string();
    let mut display = tokio::net::TcpStream::connect(&addr).await?;
    let take = async |display: &mut tokio::net::TcpStream, n: usize| -> anyhow::Result<Vec<u8>> {
        let mut buf = vec![0u8; n];
        banlieue_tests::within(30, display.read_exact(&mut buf)).await??;
        Ok(buf)
    };
    assert_eq!(take(&mut display, 12).await?, b"RFB 003.008\n");
    display.write_all(b"RFB 003.008\n").await?;
    assert_eq!(take(&mut display, 2).await?, [1, 1], "one security type, None");
    display.write_all(&[1]).await?;
    assert_eq!(take(&mut display, 4).await?, [0, 0, 0, 0], "security handshake accepted");
    display.write_all(&[1]).await?; // ClientInit: shared
    let init = take(&mut display, 24).await?;
    let (width, height) = (u16::from_be_bytes([init[0], init[1]]), u16::from_be_bytes([init[2], init[3]]));
    let name = take(&mut display, u32::from_be_bytes([init[20], init[21], init[22], init[23]]).min(4096) as usize).await?;
    vnc.kill().await?;
    Ok((width, height, String::from_utf8_lossy(&name).into_owned()))
}

#[tokio::test]
async fn on_libvirtd_kubectl_vm_console_and_vnc_reach_the_guest_for_whom_the_cluster_allows() -> anyhow::Result<()> {
    use banlieue_api::common::PowerState;
    use banlieue_test_backends::libvirtd::Libvirtd;
    use banlieue_tests::backends::{libvirtd_fixtures, secret, vm, KVM};
    use banlieue_tests::control::{is_powered, wait_for, ControlPlane};
    use tokio::io::AsyncWriteExt;

    let _one_at_a_time = LIBVIRTD_GUESTS.lock().await;
    let env = TestEnv::start("console-kvm").await?;
    env.install_crds().await?;
    let lv = Libvirtd::shared()?;
    let domain = format!("{}_web", env.ns);
    let _leftovers = banlieue_test_backends::libvirtd::Leftovers { lv, prefix: format!("{}_", env.ns), volumes: vec![] };
    // As installed: the provider role serves consoles with deploy/'s rules alone (TokenReview,
    // SubjectAccessReview, the VM watched while a session lasts).
    let _cp = ControlPlane::start_as_installed(&env).await?;
    let n = libvirtd_fixtures(&env, lv).await?;
    let ns = env.ns.as_str();
    let vms: Api<banlieue_api::VirtualMachine> = Api::namespaced(env.client.clone(), ns);
    let marker = format!("console-marker-{ns}");
    env.apply(secret(&env, "web-user-data", &[("user-data", &format!("#cloud-config\n#banlieue-marker: {marker}\n"))])).await?;
    env.apply(vm(&env, "web", &n, KVM, json!({"userData": {"name": "web-user-data", "key": "user-data"}}))).await?;
    env.apply(vm(&env, "idle", &n, KVM, json!({"desiredPowerState": "PoweredOff"}))).await?;

    // Who: a viewer reads VMs; an operator opens consoles too (and reads the Provider that
    // says where they are served).
    let viewer = account(&env, "viewer", json!([reads()])).await?;
    let operator = operator(&env).await?;

    wait_for(&vms, "web", BOOT_SECS, "Ready and running", is_powered(PowerState::PoweredOn)).await?;
    wait_for(&vms, "idle", 120, "Ready and off", is_powered(PowerState::PoweredOff)).await?;
    lv.await_serial(&domain, "banlieue-guest: ready", BOOT_SECS).await?;

    // The viewer is refused by the cluster, naming the verb and subresource (exit code 4).
    let (code, _, err) = kubectl_vm_as(&env, &viewer, &["console", "web"]).await?;
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("cannot get resource \"virtualmachines/console\"") && err.contains("HTTP 403"), "{err}");
    // A VM that is off, and one that does not exist, are said so (exit codes 4 and 3).
    let (code, _, err) = kubectl_vm_as(&env, &operator, &["console", "idle"]).await?;
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("is not running"), "{err}");
    let (code, _, err) = kubectl_vm_as(&env, &operator, &["console", "nosuch"]).await?;
    assert_eq!(code, 3, "{err}");

    // The operator gets in: typed into the console, the guest's shell answers.
    let mut session = kubectl_vm_session(&env, &operator, &["console", "web", "--timeout", "180"])?;
    let mut stdin = session.stdin.take().expect("stdin");
    let mut out = Output::of(session.stdout.take().expect("stdout"));
    let mut err = Output::of(session.stderr.take().expect("stderr"));
    err.until(60, "Connected to the serial console of virtualmachine/web").await?;
    stdin.write_all(b"\necho banlieue-$((6*7))\n").await?;
    out.until(60, "banlieue-42").await?;

    // libvirt allows one console session per domain: a second is refused, saying why.
    let (code, _, second) = kubectl_vm_as(&env, &operator, &["console", "web"]).await?;
    assert_ne!(code, 0, "{second}");
    assert!(second.to_lowercase().contains("console"), "{second}");

    // A restart closes the console; kubectl vm opens it again, and the rebooted guest's shell
    // answers through it: its seed holds the user-data marker. The shell starts some seconds
    // after the console opens again, so the question is typed again (bounded) until answered;
    // what the guest printed while booting may come before the console reopened.
    let (code, _, e) = banlieue_tests::control::kubectl_vm(&env, &["-n", ns, "restart", "web"]).await?;
    assert_eq!(code, 0, "{e}");
    if let Err(e) = err.until(BOOT_SECS, "Connected again").await {
        anyhow::bail!("{e}\nstdout:\n{}", out.seen.lock().await);
    }
    let asked = out.len().await;
    let seeded = format!("#banlieue-marker: {marker}");
    banlieue_tests::within(BOOT_SECS, async {
        loop {
            stdin.write_all(b"\ncat /run/seed/user-data\n").await?;
            if out.until_after(asked, 5, &seeded).await.is_ok() {
                return anyhow::Ok(());
            }
        }
    })
    .await
    .map_err(|_| anyhow::anyhow!("the rebooted guest's shell did not show {seeded:?} within {BOOT_SECS}s; got:\n{}", out.seen.try_lock().map(|s| s.clone()).unwrap_or_default()))??;

    // The display, on a local port for any VNC client: the guest's own VNC server answers
    // (RFB), past its authentication — the cluster decided, not a VNC password.
    let (width, height, _) = display_of(&env, &operator, "web").await?;
    assert!(width >= 320 && height >= 200, "the guest's framebuffer: {width}x{height}");

    // Deleting the VM ends the session, and kubectl vm with it.
    vms.delete("web", &Default::default()).await?;
    err.until(120, "console closed: the VM was deleted").await?;
    let status = banlieue_tests::within(30, session.wait()).await??;
    assert!(status.success(), "{status:?}");
    drop(stdin);

    // Each session is audited on the VM: who, and how it ended (the last session's Event is
    // written as it closes, so it is awaited: polled, bounded).
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(env.client.clone(), ns);
    let user = format!("system:serviceaccount:{ns}:operator");
    let audited = |notes: &[(String, String)]| {
        notes.iter().any(|(r, m)| r == "ConsoleOpened" && m.starts_with(&format!("{user} opened the serial console")))
            && notes.iter().any(|(r, m)| r == "ConsoleClosed" && m.contains("the VM was deleted"))
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let notes: Vec<(String, String)> = events
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some("web"))
            .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
            .collect();
        if audited(&notes) {
            break;
        }
        anyhow::ensure!(std::time::Instant::now() < deadline, "the sessions' Events did not come within 30s: {notes:?}");
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    Ok(())
}

/// Proxmox VE: the serial console rides a `termproxy` ticket and the display a `vncproxy`
/// one, both over the `vncwebsocket` of the Provider's endpoint, requested as the PVE API
/// documents them (seen by the fixture's proxy, which also carries the websockets).
/// fakepve's terminal echoes what it is sent, framed by termproxy's protocol; its display
/// speaks RFB behind VNC authentication with the generated password, which the host answers.
#[tokio::test]
async fn on_proxmox_the_console_and_the_display_are_opened_with_one_time_tickets() -> anyhow::Result<()> {
    use banlieue_api::common::PowerState;
    use banlieue_test_backends::fakepve::FakePve;
    use banlieue_tests::backends::{proxmox_fixtures, pve_vm, PveEndpoint};
    use banlieue_tests::control::{is_powered, wait_for, ControlPlane};
    use tokio::io::AsyncWriteExt;

    let env = TestEnv::start("console-pve").await?;
    env.install_crds().await?;
    let pve = FakePve::start().await?;
    // One session per VM at a time, closed after 8 s without a byte.
    let _cp = ControlPlane::start_with(&env, |o| {
        let limits = &mut o.consoles.as_mut().expect("consoles").limits;
        limits.per_vm = 1;
        limits.idle = std::time::Duration::from_secs(8);
    })?;
    let n = proxmox_fixtures(&env, &pve, &pve.password, PveEndpoint::Proxy).await?;
    let vms: Api<banlieue_api::VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    env.apply(pve_vm(&env, "web", &n, json!({}))).await?;
    let operator = operator(&env).await?;
    wait_for(&vms, "web", 120, "Ready and running", is_powered(PowerState::PoweredOn)).await?;

    // The serial console: termproxy's greeting, then what is typed comes back.
    let mut session = kubectl_vm_session(&env, &operator, &["console", "web"])?;
    let mut stdin = session.stdin.take().expect("stdin");
    let mut out = Output::of(session.stdout.take().expect("stdout"));
    let mut err = Output::of(session.stderr.take().expect("stderr"));
    err.until(60, "Connected to the serial console of virtualmachine/web").await?;
    let all = out.until(30, "starting serial terminal on interface serial0").await?;
    assert!(!all.starts_with("OK"), "termproxy's OK is the host's, not the user's: {all:?}");
    stdin.write_all(b"typed into proxmox\n").await?;
    out.until(30, "typed into proxmox").await?;
    // A second session on the VM is beyond --console-max-per-vm: refused, saying so.
    let (code, _, second) = kubectl_vm_as(&env, &operator, &["console", "web"]).await?;
    assert_eq!(code, 4, "{second}");
    assert!(second.contains("has 1 console sessions open") && second.contains("HTTP 429"), "{second}");
    stdin.write_all(&[0x1d]).await?; // Ctrl-]
    let status = banlieue_tests::within(30, session.wait()).await.map_err(|e| anyhow::anyhow!("kubectl vm console did not leave on Ctrl-]: {e}"))??;
    assert!(status.success(), "{status:?}");

    // The display: the user is offered no password; the host answered the display's.
    let (_, _, name) = display_of(&env, &operator, "web").await?;
    assert!(name.contains("web"), "ServerInit names the VM: {name:?}");

    // A session left idle is closed by the server, and kubectl vm ends, saying why.
    let mut idle = kubectl_vm_session(&env, &operator, &["console", "web"])?;
    let mut said = Output::of(idle.stderr.take().expect("stderr"));
    let all = said.until(60, "console closed: idle for 8s").await?;
    let status = banlieue_tests::within(30, idle.wait()).await.map_err(|e| anyhow::anyhow!("kubectl vm console did not end after the idle close: {e}; it said:\n{all}"))??;
    assert!(status.success(), "{status:?}");

    // As the PVE API documents them: the tickets, then the websocket with port and ticket.
    let seen = pve.requests();
    let posted = |tail: &str| seen.iter().filter(|r| r.method == "POST" && r.path.ends_with(tail)).map(|r| r.body.clone()).collect::<Vec<_>>();
    let term = posted("/termproxy");
    assert!(term.iter().any(|b| b == "serial=serial0"), "termproxy: {term:?}");
    let proxy = posted("/vncproxy");
    assert!(proxy.iter().any(|b| b.contains("websocket=1") && b.contains("generate-password=1")), "vncproxy: {proxy:?}");
    let sockets: Vec<_> = seen.iter().filter(|r| r.method == "GET" && r.path.ends_with("/vncwebsocket")).collect();
    assert!(sockets.len() >= 2, "{sockets:?}");
    for s in &sockets {
        assert!(s.query.starts_with("port=") && s.query.contains("&vncticket=PVEVNC"), "{s:?}");
        assert_eq!(s.auth, "ticket", "the websocket is opened with the Provider's session");
    }
    Ok(())
}

/// vSphere: the display is asked of vCenter as a `webmks` ticket (`AcquireTicket`), which
/// vcsim does not hand out — the user is told so; a serial console vSphere has none of.
#[tokio::test]
async fn on_vsphere_the_display_is_asked_as_a_webmks_ticket_and_vcsim_says_it_has_none() -> anyhow::Result<()> {
    use banlieue_api::common::PowerState;
    use banlieue_test_backends::vcsim::{self, Vcsim};
    use banlieue_tests::backends::{vm, vsphere_fixtures, VCENTER};
    use banlieue_tests::control::{is_powered, wait_for, ControlPlane};

    let env = TestEnv::start("console-vc").await?;
    env.install_crds().await?;
    let vc = Vcsim::start().await?;
    let _cp = ControlPlane::start(&env)?;
    let n = vsphere_fixtures(&env, &vc, vcsim::PASSWORD).await?;
    let vms: Api<banlieue_api::VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    env.apply(vm(&env, "web", &n, VCENTER, json!({}))).await?;
    let operator = operator(&env).await?;
    wait_for(&vms, "web", 120, "Ready and running", is_powered(PowerState::PoweredOn)).await?;

    let (code, _, err) = kubectl_vm_as(&env, &operator, &["vnc", "web"]).await?;
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("AcquireTicket(webmks)") && err.contains("does not implement: AcquireTicket"), "{err}");
    assert!(vc.log().contains("AcquireTicket"), "vcsim was asked");
    let (code, _, err) = kubectl_vm_as(&env, &operator, &["console", "web"]).await?;
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("console"), "{err}");
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The browser page, in a real headless Chromium.

/// The page's files in target/console-page (built when they are not up to date): the
/// control plane serves them when they are there as it starts.
fn build_console_page() -> anyhow::Result<()> {
    let root = banlieue_tests::control::repo_root();
    let out = std::process::Command::new("timeout").arg("300").arg(root.join("scripts/console-page.sh")).current_dir(&root).output()?;
    anyhow::ensure!(out.status.success(), "scripts/console-page.sh: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    Ok(())
}

/// Type `token` into the page's form and submit it.
async fn submit_token(browser: &banlieue_tests::browser::Browser, token: &str) -> anyhow::Result<()> {
    browser
        .evaluate(&format!(
            "(() => {{ const form = document.getElementById('login'); if (form.hidden) throw new Error('no token form'); \
             document.getElementById('token').value = {}; form.requestSubmit(); return true; }})()",
            json!(token)
        ))
        .await?;
    Ok(())
}

/// The page's state (`body[data-state]`) is `state`, within `secs`; the page's message.
async fn page_state(browser: &banlieue_tests::browser::Browser, state: &str, secs: u64) -> anyhow::Result<String> {
    browser.wait_until(&format!("document.body.dataset.state === {}", json!(state)), secs).await?;
    Ok(browser.evaluate("document.getElementById('message').textContent").await?.as_str().unwrap_or_default().to_string())
}

/// What xterm.js shows, row after row.
const TERMINAL_TEXT: &str = "(document.querySelector('.xterm-rows') || {}).textContent || ''";

#[tokio::test]
async fn on_libvirtd_the_browser_page_opens_the_serial_console_and_the_display_for_whom_the_cluster_allows() -> anyhow::Result<()> {
    use banlieue_api::common::PowerState;
    use banlieue_test_backends::libvirtd::Libvirtd;
    use banlieue_tests::backends::{libvirtd_fixtures, secret, vm, KVM};
    use banlieue_tests::browser::Browser;
    use banlieue_tests::control::{is_powered, wait_for, ControlPlane};

    build_console_page()?;
    let _one_at_a_time = LIBVIRTD_GUESTS.lock().await;
    let env = TestEnv::start("console-page").await?;
    env.install_crds().await?;
    let lv = Libvirtd::shared()?;
    let domain = format!("{}_web", env.ns);
    let _leftovers = banlieue_test_backends::libvirtd::Leftovers { lv, prefix: format!("{}_", env.ns), volumes: vec![] };
    let _cp = ControlPlane::start(&env)?;
    let n = libvirtd_fixtures(&env, lv).await?;
    let ns = env.ns.as_str();
    let vms: Api<banlieue_api::VirtualMachine> = Api::namespaced(env.client.clone(), ns);
    let marker = format!("console-marker-{ns}");
    env.apply(secret(&env, "web-user-data", &[("user-data", &format!("#cloud-config\n#banlieue-marker: {marker}\n"))])).await?;
    env.apply(vm(&env, "web", &n, KVM, json!({"userData": {"name": "web-user-data", "key": "user-data"}}))).await?;
    let viewer = account(&env, "viewer", json!([reads()])).await?;
    let operator = operator(&env).await?;

    // Where the Provider's consoles are served: the page is there too.
    let providers: Api<banlieue_api::Provider> = Api::namespaced(env.client.clone(), ns);
    let has_console = |p: Option<&banlieue_api::Provider>| p.and_then(|p| p.status.as_ref()?.console.as_ref()).is_some();
    let provider = wait_for(&providers, KVM, 120, "a console URL", has_console).await?;
    let url = provider.status.and_then(|s| s.console).map(|c| c.url).unwrap_or_default();
    let page = |console: &str| format!("{url}/console/?namespace={ns}&vm=web&console={console}");

    // The guest boots first: its tap device is there before the browser loads anything.
    wait_for(&vms, "web", BOOT_SECS, "Ready and running", is_powered(PowerState::PoweredOn)).await?;
    lv.await_serial(&domain, "banlieue-guest: ready", BOOT_SECS).await?;

    // Without a token in the tab, the page asks for one.
    let browser = Browser::start().await?;
    browser.navigate_until(&page("serial"), "document.body.dataset.state === 'token'", 60).await?;
    assert_eq!(browser.evaluate("document.getElementById('token').type").await?, json!("password"));

    // The viewer's token is refused by the cluster (before the upgrade: the browser sees the
    // websocket fail), and the page says what may be wrong and which command says why.
    submit_token(&browser, &viewer).await?;
    let said = page_state(&browser, "failed", 60).await?;
    assert!(said.contains("Could not open the serial console") && said.contains(&format!("kubectl vm console web -n {ns}")), "{said}");
    assert!(!browser.evaluate("document.getElementById('login').hidden").await?.as_bool().unwrap_or(true), "the form is offered again");

    // The operator's token opens the serial console in xterm.js; typed into, the guest's
    // shell answers.
    submit_token(&browser, &operator).await?;
    page_state(&browser, "open", 60).await?;
    browser.evaluate("document.querySelector('.xterm-helper-textarea').focus()").await?;
    browser.type_text("\n").await?;
    browser.wait_until(&format!("({TERMINAL_TEXT}).trim().length > 0"), 30).await?;
    browser.type_text("echo banlieue-$((6*7))\n").await?;
    browser.wait_until(&format!("({TERMINAL_TEXT}).includes('banlieue-42')"), 30).await?;
    // The guest printed its user-data's marker at boot, before the page connected: its seed
    // shows it now.
    browser.type_text("cat /run/seed/user-data\n").await?;
    browser.wait_until(&format!("({TERMINAL_TEXT}).includes({})", json!(format!("#banlieue-marker: {marker}"))), 30).await?;
    // xterm.js is styled under the page's policy: rows keep their spaces.
    let styled = browser.evaluate("getComputedStyle(document.querySelector('.xterm-rows')).whiteSpace").await?;
    assert_eq!(styled, json!("pre"), "xterm.js's own styles apply");
    let terminal = browser.screenshot(".xterm-screen").await?;
    assert!(browser.distinct_colors(&terminal).await? > 1, "the terminal shows something");
    keep_screenshot("console-serial.png", &terminal);

    // The display: the same tab has the token, so the page opens it at once; noVNC speaks
    // RFB through the session and draws the guest's screen.
    browser.navigate_until(&page("vnc"), "['connecting', 'open'].includes(document.body.dataset.state)", 60).await?;
    page_state(&browser, "open", 60).await?;
    browser.wait_until("(() => { const c = document.querySelector('#screen canvas'); return !!c && c.width > 0 && c.height > 0; })()", 30).await?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let display = loop {
        let shot = browser.screenshot("#screen canvas").await?;
        let colors = browser.distinct_colors(&shot).await?;
        if colors > 1 {
            break shot;
        }
        anyhow::ensure!(std::time::Instant::now() < deadline, "the display stayed blank (one colour) for 30s");
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    };
    keep_screenshot("console-vnc.png", &display);

    // Deleting the VM ends the session: the page shows the reason the server gave.
    vms.delete("web", &Default::default()).await?;
    let said = page_state(&browser, "closed", 120).await?;
    assert!(said.contains("The display closed: the VM was deleted"), "{said}");

    // Nothing the page loads was refused by its policy, and nothing threw.
    let log = browser.console_log();
    let wrong: Vec<&String> = log.iter().filter(|l| l.contains("Content Security Policy") || l.starts_with("exception:")).collect();
    assert!(wrong.is_empty(), "{wrong:#?}");
    Ok(())
}

/// Keep a screenshot in `BANLIEUE_TEST_SCREENSHOTS` (a directory), when set, for a person to see.
fn keep_screenshot(name: &str, png: &[u8]) {
    if let Some(dir) = std::env::var_os("BANLIEUE_TEST_SCREENSHOTS") {
        let path = std::path::Path::new(&dir).join(name);
        let _ = std::fs::create_dir_all(&dir);
        match std::fs::write(&path, png) {
            Ok(()) => eprintln!("screenshot: {}", path.display()),
            Err(e) => eprintln!("screenshot {}: {e}", path.display()),
        }
    }
}
