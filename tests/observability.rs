//! What an operator watches, end to end: a real Prometheus (Debian's) scrapes the control
//! plane's `/metrics` while VMs are created, powered and deleted on libvirt's test driver
//! and one Provider is broken; PromQL over its HTTP API gives the fleet counts (checked
//! against libvirt's own list), the broken Provider's error rate, every query of
//! `deploy/monitoring`'s dashboard returns data, and its "Provider not Ready" alert fires.
//! `promtool` checks and unit-tests the alert rules. Traces: an OTLP/HTTP receiver here
//! (decoding with OpenTelemetry's protobuf definitions) gets one VM's creation on fakepve
//! as one trace, down to the backend's HTTP requests; an unreachable receiver changes
//! nothing but a counter. A scrape during a relist sees the whole fleet; a metrics port in
//! use stops the process, saying so.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use banlieue_api::common::PowerState;
use banlieue_api::{Provider, VirtualMachine};
use banlieue_test_backends::prometheus::{promtool, Prometheus};
use banlieue_tests::control::{is_powered, is_ready, libvirt_fixtures, libvirt_test_node, repo_root, wait_for, ControlPlane};
use banlieue_tests::files::{Answer, FileServer};
use banlieue_tests::otlp::{Receiver, Span};
use banlieue_tests::{await_deleted, TestEnv};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::{json, Value};

/// `deploy/monitoring`'s PrometheusRule as a plain rule file in `dir` (its `spec`), each
/// alert's `for:` replaced by `hold` when given (a live run cannot wait five minutes).
fn rule_file(dir: &Path, hold: Option<&str>) -> anyhow::Result<PathBuf> {
    let rule: Value = serde_yaml::from_str(&std::fs::read_to_string(repo_root().join("deploy/monitoring/prometheusrule.yaml"))?)?;
    let mut spec = rule["spec"].clone();
    if let Some(hold) = hold {
        for group in spec["groups"].as_array_mut().into_iter().flatten() {
            for r in group["rules"].as_array_mut().into_iter().flatten() {
                if r.get("for").is_some() {
                    r["for"] = json!(hold);
                }
            }
        }
    }
    std::fs::create_dir_all(dir)?;
    let path = dir.join("rules.yaml");
    std::fs::write(&path, serde_yaml::to_string(&spec)?)?;
    Ok(path)
}

#[test]
fn the_alert_rules_pass_promtools_checks_and_unit_tests() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    rule_file(dir.path(), None)?;
    std::fs::copy(repo_root().join("deploy/monitoring/rules.test.yaml"), dir.path().join("rules.test.yaml"))?;
    let checked = promtool(dir.path(), &["check", "rules", "rules.yaml"])?;
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = promtool(dir.path(), &["test", "rules", "rules.test.yaml"])?;
    assert!(tested.contains("SUCCESS"), "{tested}");
    // Every alert has a unit test that makes it fire.
    let tests = std::fs::read_to_string(dir.path().join("rules.test.yaml"))?;
    for alert in alert_names()? {
        assert!(tests.contains(&format!("alertname: {alert}")), "rules.test.yaml never tests {alert}");
    }
    Ok(())
}

fn alert_names() -> anyhow::Result<Vec<String>> {
    let rule: Value = serde_yaml::from_str(&std::fs::read_to_string(repo_root().join("deploy/monitoring/prometheusrule.yaml"))?)?;
    Ok(rule["spec"]["groups"].as_array().into_iter().flatten().flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default()).filter_map(|r| r["alert"].as_str().map(String::from)).collect())
}

#[test]
fn every_alert_has_a_runbook_in_the_operations_guide() -> anyhow::Result<()> {
    let guide = std::fs::read_to_string(repo_root().join("docs/operations.md"))?;
    for alert in alert_names()? {
        assert!(guide.contains(&format!("#### {alert}")), "docs/operations.md has no runbook for {alert}");
    }
    Ok(())
}

/// Every PromQL expression of the dashboard, its variables given values that select everything.
fn dashboard_queries() -> anyhow::Result<Vec<(String, String)>> {
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(repo_root().join("deploy/monitoring/grafana-dashboard.json"))?)?;
    let mut out = Vec::new();
    let mut panels: Vec<Value> = dashboard["panels"].as_array().cloned().unwrap_or_default();
    while let Some(panel) = panels.pop() {
        panels.extend(panel["panels"].as_array().cloned().unwrap_or_default());
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                let expr = expr.replace("$__rate_interval", "1m").replace("$__range", "5m").replace("$namespace", ".*").replace("$provider", ".*");
                out.push((panel["title"].as_str().unwrap_or_default().to_string(), expr));
            }
        }
    }
    Ok(out)
}

/// A free port on 127.0.0.1 for the control plane's `/metrics`.
fn metrics_addr() -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], banlieue_test_backends::free_port()))
}

fn vm(env: &TestEnv, name: &str) -> Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name, "namespace": env.ns},
           "spec": {"classRef": {"name": format!("{}-small", env.ns)}, "imageRef": {"name": format!("{}-debian", env.ns)},
                    "placement": {"providerRef": {"name": "lv"}}}})
}

/// A real qcow2 disk of `mib` MiB (virtual) made by qemu-img.
fn qcow2(dir: &Path, mib: u32) -> anyhow::Result<Vec<u8>> {
    let path = dir.join("served.qcow2");
    let out = std::process::Command::new("qemu-img").args(["create", "-q", "-f", "qcow2"]).arg(&path).arg(format!("{mib}M")).output()?;
    anyhow::ensure!(out.status.success(), "qemu-img create: {}", String::from_utf8_lossy(&out.stderr));
    Ok(std::fs::read(path)?)
}

#[tokio::test]
async fn prometheus_sees_the_fleet_a_broken_provider_and_its_alert() -> anyhow::Result<()> {
    let env = TestEnv::start("observability").await?;
    env.install_crds().await?;
    // Shard leases live there.
    env.create_namespace(banlieue_controller::SYSTEM_NAMESPACE).await?;
    let addr = metrics_addr();
    let cp = ControlPlane::start_with(&env, |o| {
        o.metrics_addr = Some(addr);
        o.sharding = Some(banlieue_controller::Sharding { count: 4, lease_duration: Duration::from_secs(15) });
    })?;
    let node = libvirt_test_node(env.dir(), "node", 8, 16, 200)?;
    // `broken`'s libvirt is nowhere: its probe fails, and so does every call of its driver.
    let nowhere = format!("qemu+unix:///system?socket={}", env.dir().join("no-such-libvirtd.sock").display());
    libvirt_fixtures(&env, &[("lv", &node), ("broken", &nowhere)]).await?;
    // One operation at a time on `lv`, one a second: its five machines, made together, wait
    // for each other (the throttle's metrics).
    let providers: Api<Provider> = Api::namespaced(env.client.clone(), &env.ns);
    let limits = json!({"spec": {"limits": {"maxConcurrentOperations": 1, "operationsPerSecond": 1}}});
    providers.patch("lv", &PatchParams::default(), &Patch::Merge(limits)).await?;
    // A Proxmox VE Provider (fakepve): its driver logs in once and reuses the session.
    let pve = banlieue_test_backends::fakepve::FakePve::start().await?;
    banlieue_tests::backends::proxmox_fixtures(&env, &pve, &pve.password, banlieue_tests::backends::PveEndpoint::Proxy).await?;
    // An image imported into libvirtd (bytes moved), through a class of its own.
    let lv = banlieue_test_backends::libvirtd::Libvirtd::shared()?;
    let kvm_class = format!("{}-kvm", env.ns);
    env.apply(banlieue_tests::backends::libvirt_provider_class(&kvm_class)).await?;
    env.apply(banlieue_tests::backends::libvirtd_provider(&env, lv, "kvm", &kvm_class)).await?;
    let disk = qcow2(env.dir(), 16)?;
    let server = FileServer::start(BTreeMap::from([("/os.qcow2".to_string(), Answer::Bytes(disk.clone()))])).await?;
    let sum = format!("sha256:{}", hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&disk)));
    let image = format!("{}-served", env.ns);
    env.apply(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": image},
                     "spec": {"sources": [{"providerClass": kvm_class, "url": server.url("/os.qcow2"), "checksum": sum}]}}))
        .await?;

    // Three VMs and a pool of two on `lv`; one powered off, one deleted.
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    for name in ["a", "b", "c"] {
        env.apply(vm(&env, name)).await?;
    }
    let template = vm(&env, "member")["spec"].clone();
    env.apply(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachinePool", "metadata": {"name": "pool", "namespace": env.ns},
                     "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "pool"}},
                              "template": {"metadata": {"labels": {"app": "pool"}}, "spec": template}}}))
        .await?;
    for name in ["a", "b", "c"] {
        wait_for(&vms, name, 120, "Ready", is_ready).await?;
    }
    let pools: Api<banlieue_api::VirtualMachinePool> = Api::namespaced(env.client.clone(), &env.ns);
    wait_for(&pools, "pool", 120, "2 Ready members", |p: Option<&banlieue_api::VirtualMachinePool>| {
        p.and_then(|p| p.status.as_ref()).is_some_and(|s| s.ready_replicas == 2)
    })
    .await?;
    vms.patch("c", &PatchParams::default(), &Patch::Merge(json!({"spec": {"desiredPowerState": "PoweredOff"}}))).await?;
    wait_for(&vms, "c", 60, "powered off", is_powered(PowerState::PoweredOff)).await?;
    vms.delete("b", &DeleteParams::default()).await?;
    await_deleted(&vms, "b").await?;
    // One that waits for ever: the only Provider it may go to is broken.
    let mut stuck = vm(&env, "stuck");
    stuck["spec"]["placement"]["providerRef"]["name"] = json!("broken");
    env.apply(stuck).await?;

    // The backend's own list: the VMs left, `c` shut off.
    let libvirt = cp.ctx.libvirt.get(&node).await?;
    let domains: Vec<_> = libvirt.domain_list().await?.into_iter().filter(|d| d.name.starts_with(&format!("{}_", env.ns))).collect();
    assert_eq!(domains.len(), 4, "a, c and the pool's two: {domains:?}");

    let prom = Prometheus::start(&env.dir().join("prometheus"), &[addr.to_string()], &[rule_file(&env.dir().join("rules"), Some("1s"))?]).await?;
    let ns = &env.ns;
    let one = |expr: String| async move { expr };
    let listed = vms.list(&Default::default()).await?.items;
    let ready = listed.iter().filter(|v| is_ready(Some(v))).count() as f64;
    let fleet = prom
        .await_value(&one(format!(r#"sum(max without (instance, job) (banlieue_virtualmachines{{namespace="{ns}"}}))"#)).await, 60, |v| v == listed.len() as f64)
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", prom.log()))?;
    assert_eq!(fleet, 5.0, "a, c, stuck and the pool's two");
    prom.await_value(&format!(r#"banlieue_virtualmachines{{namespace="{ns}",provider="",phase="Pending"}}"#), 30, |v| v == 1.0).await?;
    prom.await_value(&format!(r#"max(banlieue_virtualmachine_provisioning_oldest_seconds{{namespace="{ns}"}})"#), 30, |v| v >= 0.0).await?;
    prom.await_value(&format!(r#"sum(banlieue_virtualmachines{{namespace="{ns}",phase="Ready"}})"#), 30, |v| v == ready).await?;
    // Machines by kind and phase, as the API has them — as many as libvirt holds domains.
    let machines = banlieue_tests::backends::machines(&env, "Libvirt").list(&Default::default()).await?.items;
    let mut phases: BTreeMap<String, f64> = BTreeMap::new();
    for m in &machines {
        *phases.entry(m.data["status"]["phase"].as_str().unwrap_or("Unknown").to_string()).or_default() += 1.0;
    }
    for (phase, n) in &phases {
        let expr = format!(r#"sum(banlieue_machines{{namespace="{ns}",provider="lv",kind="LibvirtMachine",phase="{phase}"}})"#);
        prom.await_value(&expr, 30, |v| v == *n).await.map_err(|e| {
            let exported: Vec<String> = cp.ctx.metrics.render().lines().filter(|l| l.starts_with("banlieue_machines")).map(String::from).collect();
            anyhow::anyhow!("{e}; the API has {phases:?}; exported: {exported:#?}")
        })?;
    }
    prom.await_value(&format!(r#"sum(banlieue_machines{{namespace="{ns}",provider="lv"}})"#), 30, |v| v == domains.len() as f64).await?;
    prom.await_value(&format!(r#"banlieue_pool_replicas{{namespace="{ns}",pool="pool",state="ready"}}"#), 30, |v| v == 2.0).await?;
    prom.await_value(&format!(r#"banlieue_provider_ready{{namespace="{ns}",provider="lv"}}"#), 30, |v| v == 1.0).await?;
    prom.await_value(&format!(r#"banlieue_provider_ready{{namespace="{ns}",provider="broken"}}"#), 30, |v| v == 0.0).await?;
    // The broken Provider fails, the other does not.
    prom.await_value(&format!(r#"sum(rate(banlieue_provider_operations_total{{namespace="{ns}",provider="broken",outcome!="ok"}}[1m]))"#), 90, |v| v > 0.0).await?;
    let lv_errors = prom.query(&format!(r#"sum by (operation, outcome) (banlieue_provider_operations_total{{namespace="{ns}",provider="lv",outcome!~"ok|not-found"}})"#)).await?;
    assert!(lv_errors.iter().all(|(_, v)| *v == 0.0), "lv's operations all succeeded: {lv_errors:?}");
    prom.await_value(&format!(r#"sum(banlieue_provider_operations_total{{namespace="{ns}",provider="lv",operation="create",outcome="ok"}})"#), 30, |v| v >= 4.0).await?;
    // apply → Ready and delete → gone were measured, once per VM.
    prom.await_value(r#"sum(banlieue_virtualmachine_ready_duration_seconds_count)"#, 30, |v| v >= 5.0).await?;
    prom.await_value(r#"sum(banlieue_virtualmachine_deletion_duration_seconds_count)"#, 30, |v| v >= 1.0).await?;
    prom.await_value(&format!(r#"sum(banlieue_throttle_waits_total{{namespace="{ns}",provider="lv"}})"#), 30, |v| v > 0.0).await?;
    prom.await_value(&format!(r#"sum(banlieue_vmimage_import_bytes_total{{namespace="{ns}",provider="kvm"}})"#), 120, |v| v >= disk.len() as f64).await?;
    prom.await_value("max(banlieue_shards)", 30, |v| v == 4.0).await?;
    // fakepve saw as many logins as banlieue counted.
    let logins = prom.await_value(&format!(r#"sum(banlieue_backend_logins_total{{namespace="{ns}",provider="pve"}})"#), 60, |v| v >= 1.0).await?;
    assert_eq!(logins, pve.logins() as f64, "logins counted by banlieue and by fakepve");

    // The alert fires for the broken Provider, and only for it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let alerts = prom.alerts().await?;
        let not_ready: Vec<_> = alerts.iter().filter(|(n, _, l)| n == "BanlieueProviderNotReady" && l.get("namespace") == Some(&json!(ns))).collect();
        if not_ready.iter().any(|(_, state, l)| state == "firing" && l.get("provider") == Some(&json!("broken"))) {
            assert!(not_ready.iter().all(|(_, _, l)| l.get("provider") == Some(&json!("broken"))), "{not_ready:?}");
            break;
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "BanlieueProviderNotReady did not fire for broken: {alerts:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Every query of the dashboard parses and has data.
    for (panel, expr) in dashboard_queries()? {
        let got = prom.query(&expr).await.map_err(|e| anyhow::anyhow!("panel {panel:?}: {e}"))?;
        assert!(!got.is_empty(), "panel {panel:?}: {expr} returned no data");
    }

    // Health over time, from status: the Provider's recent operations, the VM's transitions.
    let broken = wait_for(&providers, "broken", 90, "status.operations with errors", |p: Option<&Provider>| {
        p.and_then(|p| p.status.as_ref()).and_then(|s| s.operations.as_ref()).is_some_and(|o| o.errors > 0)
    })
    .await?;
    let ops = broken.status.and_then(|s| s.operations).expect("operations");
    assert!(ops.last_error.as_ref().is_some_and(|e| e.operation == "probe" && e.reason.contains("unavailable") && e.message.contains("no-such-libvirtd.sock")), "{ops:?}");
    let (code, out, err) = banlieue_tests::control::kubectl_vm(&env, &["status", "a", "-n", ns]).await?;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("SINCE") && out.contains("Ready:      first") && out.contains("Provider:   Ready for"), "{out}");
    let (code, out, err) = banlieue_tests::control::kubectl_vm(&env, &["pools", "-n", ns]).await?;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("CHANGED") && out.contains(&format!("{ns}/lv")) && out.contains("operations failed in the last 10m"), "{out}");
    drop(cp);
    Ok(())
}

#[tokio::test]
async fn a_scrape_during_a_relist_sees_the_whole_fleet() -> anyhow::Result<()> {
    // Watches are ended (410 Gone, history compacted) on a server of the test's own, which the
    // real cluster's tests cannot do: there, the same scrape runs without the forced relist.
    let server = match TestEnv::external() {
        true => None,
        false => Some(banlieue_tests::apiserver::ApiServerProcess::start(env!("CARGO_BIN_EXE_banlieue-test-apiserver")).await?),
    };
    let env = match &server {
        Some(s) => TestEnv::connect("observability-relist", &s.kubeconfig()).await?,
        None => TestEnv::start("observability-relist").await?,
    };
    env.install_crds().await?;
    let addr = metrics_addr();
    let _cp = ControlPlane::start_with(&env, |o| o.metrics_addr = Some(addr))?;
    libvirt_fixtures(&env, &[("lv", "test:///default")]).await?;
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    let names: Vec<String> = (0..6).map(|i| format!("vm-{i}")).collect();
    for name in &names {
        env.apply(vm(&env, name)).await?;
    }
    for name in &names {
        wait_for(&vms, name, 120, "Ready", is_ready).await?;
    }
    let count = || async {
        let text = reqwest_get(&format!("http://{addr}/metrics")).await?;
        let total: f64 = text
            .lines()
            .filter(|l| l.starts_with("banlieue_virtualmachines{") && l.contains(&format!("namespace=\"{}\"", env.ns)))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        anyhow::Ok(total)
    };
    assert_eq!(count().await?, 6.0);
    if let Some(s) = &server {
        s.expire_watches()?;
    }
    // Scrapes while every watch lists again: never a partial fleet.
    for _ in 0..40 {
        assert_eq!(count().await?, 6.0, "a scrape during the relist");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    Ok(())
}

/// GET `url` with a plain HTTP/1.1 client of the test's own; the body.
async fn reqwest_get(url: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").ok_or_else(|| anyhow::anyhow!("not http: {url}"))?;
    let (host, path) = rest.split_once('/').map(|(h, p)| (h, format!("/{p}"))).unwrap_or((rest, "/".into()));
    let mut s = tokio::time::timeout(Duration::from_secs(10), tokio::net::TcpStream::connect(host)).await??;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes()).await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf)).await??;
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    anyhow::ensure!(head.starts_with("HTTP/1.1 200"), "{head}");
    Ok(body.to_string())
}

#[tokio::test]
async fn a_metrics_port_in_use_stops_the_process_saying_so() -> anyhow::Result<()> {
    let env = TestEnv::start("observability-port").await?;
    env.install_crds().await?;
    let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = taken.local_addr()?;
    let mut options = banlieue_controller::Options { metrics_addr: Some(addr), leader_election: false, ..Default::default() };
    options.builtin_dir = banlieue_tests::control::guests_dist();
    let ctx = banlieue_controller::Context::new(env.client.clone(), options)?;
    let run = banlieue_controller::run(ctx, banlieue_controller::Roles::ALL, std::future::pending());
    let err = tokio::time::timeout(Duration::from_secs(10), run).await?.expect_err("the port is taken");
    let said = format!("{err:#}");
    assert!(said.contains(&format!("cannot serve metrics on {addr} (--metrics-addr)")) && said.contains("in use"), "{said}");
    Ok(())
}

#[tokio::test]
async fn one_vms_creation_is_one_trace_down_to_the_backends_http_requests() -> anyhow::Result<()> {
    use banlieue_test_backends::fakepve::FakePve;
    use banlieue_tests::backends::{proxmox_fixtures, pve_vm, PveEndpoint};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let receiver = Receiver::start().await?;
    // The standard variables, as an operator sets them; spans leave every 200 ms.
    // SAFETY: set before this test starts anything that reads the environment; no other
    // test of this suite reads these variables.
    unsafe {
        std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.url);
        std::env::set_var("OTEL_BSP_SCHEDULE_DELAY", "200");
    }
    let layer = banlieue_controller::ops::traces::layer("banlieue-test")?.expect("OTEL_EXPORTER_OTLP_ENDPOINT is set: traces are on");
    // As `banlieue` runs it: spans at info and above.
    tracing_subscriber::registry().with(tracing_subscriber::Layer::with_filter(layer, tracing_subscriber::filter::LevelFilter::INFO)).try_init()?;

    let env = TestEnv::start("observability-traces").await?;
    env.install_crds().await?;
    let pve = FakePve::start().await?;
    let cp = ControlPlane::start(&env)?;
    let n = proxmox_fixtures(&env, &pve, &pve.password, PveEndpoint::Proxy).await?;
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    env.apply(pve_vm(&env, "traced", &n, json!({}))).await?;
    let vm = wait_for(&vms, "traced", 120, "Ready and running", is_powered(PowerState::PoweredOn)).await?;
    let uid = vm.uid().unwrap_or_default();
    let on_pve: Vec<_> = pve.vms().await?.into_iter().filter(|v| v.name == format!("traced.{}", env.ns)).collect();
    assert_eq!(on_pve.len(), 1, "fakepve holds the VM");

    // The VM reconcile that made the Machine, the Machine's reconciles, the driver's
    // `create`, and the HTTP requests it sent — one trace.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let (trace, spans) = loop {
        let spans = receiver.spans();
        let made = spans.iter().find(|s| s.name == "reconcile virtualmachine" && s.attributes.get("k8s.object.uid") == Some(&uid) && spans.iter().any(|c| c.trace == s.trace && c.name == "reconcile machine"));
        if let Some(trace) = made.map(|s| s.trace.clone()) {
            let in_trace: Vec<Span> = spans.iter().filter(|s| s.trace == trace).cloned().collect();
            let create = in_trace.iter().find(|s| s.attributes.get("function").map(String::as_str) == Some("create"));
            if let Some(create) = create {
                if in_trace.iter().any(|s| s.parent == create.id && s.attributes.get("http.request.method").map(String::as_str) == Some("POST")) {
                    break (trace, in_trace);
                }
            }
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "no trace of traced's creation: {:#?}", spans.iter().map(|s| &s.name).collect::<Vec<_>>());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let by_id: BTreeMap<&[u8], &Span> = spans.iter().map(|s| (s.id.as_slice(), s)).collect();
    let create = spans.iter().find(|s| s.attributes.get("function").map(String::as_str) == Some("create")).expect("create");
    // Its chain of parents, up to the root.
    let mut chain = vec![create.name.clone()];
    let mut at = create;
    while let Some(parent) = by_id.get(at.parent.as_slice()) {
        chain.push(parent.name.clone());
        at = parent;
    }
    // The call, in a Machine reconcile, in the VM reconcile (under kube's own span of it, the root).
    let position = |name: &str| chain.iter().position(|c| c == name);
    assert_eq!(chain.first().map(String::as_str), Some(format!("{} create", n.provider_class).as_str()), "{chain:?}");
    assert!(position("reconcile machine") < position("reconcile virtualmachine") && position("reconcile machine").is_some(), "{chain:?}");
    assert!(at.parent.is_empty(), "the chain reaches the trace's root: {chain:?}");
    let posts: Vec<_> = spans.iter().filter(|s| s.parent == create.id).map(|s| s.attributes.get("url.full").cloned().unwrap_or_default()).collect();
    assert!(posts.iter().any(|u| u.contains("/api2/json/nodes/pve1/qemu/")), "the clone request: {posts:?}");
    assert!(posts.iter().all(|u| !u.contains('?')), "no query (a ticket may be there) in a span: {posts:?}");
    assert_eq!(trace.len(), 16);

    // The receiver goes: reconciling goes on, the spans it could not deliver are counted.
    drop(receiver);
    env.apply(pve_vm(&env, "untraced", &n, json!({}))).await?;
    wait_for(&vms, "untraced", 120, "Ready and running", is_powered(PowerState::PoweredOn)).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let text = cp.ctx.metrics.render();
        let dropped = text.lines().find_map(|l| l.strip_prefix("banlieue_trace_spans_dropped_total ")?.parse::<f64>().ok()).unwrap_or(0.0);
        if dropped > 0.0 {
            break;
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "no dropped span counted with the receiver gone");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

