//! The hostile-guest suite and the placement path: every misbehaviour is contained
//! with a typed error, and the host keeps serving other components meanwhile.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use banlieue_runtime::capability::http::HttpGrant;
use banlieue_runtime::capability::Grants;
use banlieue_runtime::placement::{Capacity, Domains, DomainsBuilder, Request, VmClass};
use banlieue_runtime::provider::ProviderConfig;
use banlieue_runtime::{CallError, InvalidDecision, Limits, Runtime, RuntimeConfig};
use common::guest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn runtime() -> Runtime {
    Runtime::new(RuntimeConfig::default()).unwrap()
}

fn config(provider: &str, endpoint: &str) -> ProviderConfig {
    ProviderConfig {
        provider: provider.into(),
        endpoint: endpoint.into(),
        credential_keys: vec![],
        storage_classes: vec![],
        network_classes: vec![],
        features: vec![],
    }
}

fn fast() -> Limits {
    Limits { cpu: Duration::from_millis(300), ..Limits::default() }
}

/// Failure domains (provider, name, VMs of `app=web`, free memory in MiB), as the host gathers them.
fn domains(all: &[(&str, &str, u32, u64)]) -> Domains {
    let mut b = DomainsBuilder::default();
    let web = b.group("default", [("app", "web")]);
    for &(provider, fd, vms, memory_mib) in all {
        let facts = b.facts("libvirt", [("zone", fd)], &["standard".into()], &["default".into()], &[]);
        let (provider, fd) = (b.text(provider), b.text(fd));
        b.candidate(provider, fd, facts, Capacity { cpus: 64, memory_mib, storage_gib: 1000 }, vms, std::iter::repeat_n(web, vms as usize));
    }
    b.build()
}

/// The chosen candidate's `provider/failure-domain`.
fn chosen(domains: &Domains, d: &banlieue_runtime::placement::Decision) -> String {
    format!("{:?}", domains.get(d.candidate).expect("the runtime checks the index"))
}

fn request() -> Request {
    Request {
        vm_name: "web-1".into(),
        vm_namespace: "default".into(),
        vm_labels: vec![("app".into(), "web".into())],
        class: VmClass {
            name: "small".into(),
            cpus: 2,
            memory_mib: 2048,
            storage_gib: 20,
            storage_classes: vec!["standard".into()],
            network_classes: vec!["default".into()],
            features: vec![],
        },
        parameters: "{}".into(),
        anti_affinity: vec![],
    }
}

#[tokio::test]
async fn spread_picks_the_emptiest_domain_and_binpack_the_fullest() {
    let rt = runtime();
    let cands = domains(&[("p1", "a", 3, 65536), ("p1", "b", 1, 65536), ("p2", "c", 2, 65536)]);
    let spread = rt.placement(&guest("placement-spread")).unwrap();
    let d = spread.choose(&request(), &cands, Limits::default(), Grants::default()).await.unwrap();
    assert_eq!(chosen(&cands, &d), "p1/b");
    assert!(d.reason.starts_with("spread: 1 VM(s) of this group in p1/b"), "{}", d.reason);
    // Least room left after placing.
    let full = domains(&[("p1", "a", 3, 4096), ("p1", "b", 1, 65536), ("p2", "c", 2, 65536)]);
    let binpack = rt.placement(&guest("placement-binpack")).unwrap();
    let d = binpack.choose(&request(), &full, Limits::default(), Grants::default()).await.unwrap();
    assert_eq!(chosen(&full, &d), "p1/a");
    assert_eq!(spread.contract_version().await.unwrap(), "0.2.0");
    assert_eq!(spread.component.contract_version.to_string(), "0.2.0");
}

#[tokio::test]
async fn a_0_1_component_chooses_through_the_adapter() {
    let rt = runtime();
    let legacy = rt.placement(&guest("placement-legacy")).unwrap();
    assert_eq!(legacy.component.contract_version.to_string(), "0.1.0");
    assert_eq!(legacy.contract_version().await.unwrap(), "0.1.0");
    // It picks the most free memory, and names it by provider and failure domain.
    let cands = domains(&[("team/p1", "a", 2, 4096), ("team/p1", "b", 0, 8192), ("team/p2", "c", 1, 1024)]);
    let d = legacy.choose(&request(), &cands, Limits::default(), Grants::default()).await.unwrap();
    assert_eq!((d.candidate, d.score, d.reason.as_str()), (1, 8192, "most free memory"));
    // Naming a domain that is not a candidate is refused.
    let elsewhere = Request { parameters: "\"elsewhere\"".into(), ..request() };
    match legacy.choose(&elsewhere, &cands, Limits::default(), Grants::default()).await {
        Err(e @ CallError::InvalidDecision(InvalidDecision::NotACandidate { .. })) => assert_eq!(e.reason(), "InvalidDecision"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_0_5_driver_runs_through_the_adapter_and_its_snapshots_are_refused() {
    use banlieue_runtime::provider::{Firmware, ImageSource, Machine, MachineRef, PowerState, SnapshotRequest, UserDataFormat};
    let rt = runtime();
    let legacy = rt.provider(&guest("provider-legacy")).unwrap();
    assert_eq!(legacy.component.contract_version.to_string(), "0.5.0");
    // Everything 0.5.0 had still works, with 0.6.0's types.
    let inv = legacy.probe(&config("team/old", "legacy://"), Limits::default(), Grants::default()).await.unwrap();
    assert_eq!(inv.backend_version.as_deref(), Some("legacy 0.5.0"));
    let machine = Machine {
        uid: "u-1".into(),
        name: "vm".into(),
        namespace: "team".into(),
        cpus: 1,
        memory_mib: 512,
        firmware: Firmware::Bios,
        disks: vec![],
        nics: vec![],
        image: ImageSource::Template("t".into()),
        user_data: None,
        user_data_format: UserDataFormat::CloudConfig,
        failure_domain: "default".into(),
        power_state: PowerState::PoweredOff,
        labels: vec![],
    };
    let st = legacy.create(&config("team/old", ""), &machine, Limits::default(), Grants::default()).await.unwrap();
    assert_eq!((st.provider_id.as_str(), st.power_state), ("legacy://u-1", PowerState::PoweredOff));
    // Snapshots are refused by the host, naming the contract, without calling the driver.
    let r = MachineRef { uid: "u-1".into(), name: "vm".into(), namespace: "team".into(), provider_id: Some(st.provider_id), failure_domain: "default".into(), backend_id: None };
    let request = SnapshotRequest { name: "bl-1".into(), description: String::new(), memory: false, quiesce: false };
    let e = legacy.snapshot_create(&config("team/old", ""), &r, &request, Limits::default(), Grants::default()).await.unwrap_err();
    assert_eq!(e.reason(), "SnapshotsUnsupported");
    assert!(e.to_string().contains("banlieue:provider 0.6.0") && e.to_string().contains("built for 0.5.0"), "{e}");
    assert!(legacy.snapshots().is_err());
    // A current driver has them.
    assert!(rt.provider(&guest("minimal-provider")).unwrap().snapshots().is_ok());
}

#[tokio::test]
async fn a_decision_index_out_of_range_is_refused() {
    let rt = runtime();
    let hostile = rt.placement(&guest("hostile-placement")).unwrap();
    let cands = domains(&[("p1", "a", 0, 4096), ("p1", "b", 0, 4096)]);
    match hostile.choose(&request(), &cands, Limits::default(), Grants::default()).await {
        Err(CallError::InvalidDecision(e)) => assert_eq!(e, InvalidDecision::OutOfRange { index: 2, candidates: 2 }),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn the_wrong_contract_or_forbidden_imports_are_refused_at_load() {
    let rt = runtime();
    match rt.placement(&guest("minimal-provider")) {
        Err(CallError::Incompatible(m)) => assert!(m.contains("banlieue:placement/policy"), "{m}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a provider loaded as a placement policy"),
    }
    match rt.provider(&guest("hostile-fs")) {
        Err(CallError::ForbiddenImport { import, .. }) => assert!(import.starts_with("wasi:filesystem"), "{import}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a component importing wasi:filesystem loaded"),
    }
    assert!(matches!(rt.provider(b"\0asm not really"), Err(CallError::Invalid(_))));
}

#[tokio::test]
async fn cpu_memory_stack_and_panics_are_typed_errors() {
    let rt = runtime();
    let p = rt.provider(&guest("hostile-provider")).unwrap();
    let started = Instant::now();
    let e = p.probe(&config("spin", "http://127.0.0.1:1"), fast(), Grants::default()).await.unwrap_err();
    assert!(matches!(e, CallError::CpuBudget(_)), "{e}");
    assert!(started.elapsed() < Duration::from_secs(5), "stopped promptly");
    let e = p.probe(&config("alloc", "http://127.0.0.1:1"), fast(), Grants::default()).await.unwrap_err();
    assert!(matches!(e, CallError::Memory(64)), "{e}");
    let e = p.probe(&config("recurse", "http://127.0.0.1:1"), fast(), Grants::default()).await.unwrap_err();
    assert!(matches!(&e, CallError::Trap(m) if m.contains("stack")), "{e}");
    let e = p.probe(&config("panic", "http://127.0.0.1:1"), fast(), Grants::default()).await.unwrap_err();
    assert!(matches!(&e, CallError::Trap(m) if m.contains("panics on purpose")), "{e}");
    // A well-behaved call on the same component still works afterwards.
    let inv = p.probe(&config("fine", "http://127.0.0.1:1"), fast(), Grants::default()).await.unwrap();
    assert_eq!(inv.failure_domains[0].name, "ok");
}

#[tokio::test]
async fn a_log_flood_is_rate_limited_and_env_is_empty() {
    let rt = runtime();
    let p = rt.provider(&guest("hostile-provider")).unwrap();
    let inv = p.probe(&config("log-flood", ""), Limits::default(), Grants::default()).await.unwrap();
    assert_eq!(inv.failure_domains[0].name, "flooded");
    let inv = p.probe(&config("env", ""), Limits::default(), Grants::default()).await.unwrap();
    assert_eq!(inv.failure_domains[0].name, "env-0-args-0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_keeps_serving_while_a_guest_spins() {
    let rt = runtime();
    let hostile = rt.provider(&guest("hostile-provider")).unwrap();
    let spread = rt.placement(&guest("placement-spread")).unwrap();
    let slow = tokio::spawn(async move {
        hostile.probe(&config("spin", ""), Limits { cpu: Duration::from_secs(2), ..Limits::default() }, Grants::default()).await
    });
    let started = Instant::now();
    let cands = domains(&[("p1", "a", 0, 65536)]);
    for _ in 0..50 {
        spread.choose(&request(), &cands, Limits::default(), Grants::default()).await.unwrap();
    }
    let quick = started.elapsed();
    assert!(!slow.is_finished() || quick < Duration::from_secs(2), "other calls waited for the spinning guest ({quick:?})");
    assert!(matches!(slow.await.unwrap(), Err(CallError::CpuBudget(_))));
}

/// A loopback HTTP server answering every request with `reply`; counts requests.
async fn serve(reply: &'static [u8]) -> (u16, Arc<std::sync::atomic::AtomicUsize>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let h = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            h.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                if !reply.is_empty() {
                    let _ = s.write_all(reply).await;
                } else {
                    // Never answer.
                    tokio::time::sleep(Duration::from_secs(600)).await;
                }
            });
        }
    });
    (port, hits)
}

async fn http_grants(endpoint: &str) -> Grants {
    let mut g = HttpGrant::for_endpoint(endpoint).await.unwrap();
    g.max_request_time = Duration::from_secs(2);
    g.max_response_bytes = 1 << 20;
    Grants { http: Some(g), ..Grants::default() }
}

#[tokio::test]
async fn http_reaches_only_the_granted_endpoint() {
    let rt = runtime();
    let p = rt.provider(&guest("hostile-provider")).unwrap();
    let (port, _) = serve(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok").await;
    let (other, other_hits) = serve(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await;
    let granted = format!("http://127.0.0.1:{port}");
    let ok = p.probe(&config("http", &granted), fast(), http_grants(&granted).await).await.unwrap();
    assert_eq!(ok.failure_domains[0].name, "status-200-len-2");

    let deny = |r: Result<_, CallError>| match r {
        Err(CallError::Guest(banlieue_runtime::GuestError::Denied(m))) => m,
        other => panic!("expected denied, got {other:?}"),
    };
    // Another port on the same host, the metadata address, userinfo, file://, no grant at all.
    for target in [
        format!("http://127.0.0.1:{other}"),
        "http://169.254.169.254/latest/meta-data".to_string(),
        format!("http://admin:pw@127.0.0.1:{port}"),
        "file:///etc/passwd".to_string(),
    ] {
        deny(p.probe(&config("http", &target), fast(), http_grants(&granted).await).await);
    }
    deny(p.probe(&config("http", &granted), fast(), Grants::default()).await);
    assert_eq!(other_hits.load(std::sync::atomic::Ordering::SeqCst), 0, "nothing reached the other server");
}

#[tokio::test]
async fn redirects_are_not_followed_and_big_or_silent_backends_are_bounded() {
    let rt = runtime();
    let p = rt.provider(&guest("hostile-provider")).unwrap();
    let (target, target_hits) = serve(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await;
    let redirect: &'static [u8] = Box::leak(format!("HTTP/1.1 302 Found\r\nlocation: http://127.0.0.1:{target}/\r\ncontent-length: 0\r\n\r\n").into_bytes().into_boxed_slice());
    let (port, _) = serve(redirect).await;
    let ep = format!("http://127.0.0.1:{port}");
    let inv = p.probe(&config("http", &ep), fast(), http_grants(&ep).await).await.unwrap();
    assert_eq!(inv.failure_domains[0].name, "status-302-len-0");
    assert_eq!(target_hits.load(std::sync::atomic::Ordering::SeqCst), 0, "redirect not followed");

    // A 1 GiB response (declared) is refused without reading it.
    let (big, _) = serve(b"HTTP/1.1 200 OK\r\ncontent-length: 1073741824\r\n\r\nxxxx").await;
    let ep = format!("http://127.0.0.1:{big}");
    let e = p.probe(&config("http", &ep), fast(), http_grants(&ep).await).await.unwrap_err();
    assert!(matches!(&e, CallError::Guest(banlieue_runtime::GuestError::Denied(m)) if m.contains("larger")), "{e}");

    // A backend that never answers: the request times out as unavailable, and the
    // 2 s of waiting do not count against the 300 ms CPU budget.
    let (silent, _) = serve(b"").await;
    let ep = format!("http://127.0.0.1:{silent}");
    let started = Instant::now();
    let e = p.probe(&config("http", &ep), fast(), http_grants(&ep).await).await.unwrap_err();
    assert!(matches!(e, CallError::Guest(banlieue_runtime::GuestError::Unavailable(_))), "{e}");
    assert!(started.elapsed() >= Duration::from_secs(2) && started.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn precompiled_cache_is_used_and_foreign_bytes_are_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::new(RuntimeConfig { cache_dir: Some(dir.path().to_path_buf()), ..Default::default() }).unwrap();
    let bytes = guest("placement-spread");
    let t = Instant::now();
    rt.placement(&bytes).unwrap();
    let cold = t.elapsed();
    let entries: Vec<_> = std::fs::read_dir(dir.path()).unwrap().filter_map(|e| e.ok()).filter(|e| e.path().extension().is_some_and(|x| x == "cwasm")).collect();
    assert_eq!(entries.len(), 1);
    let rt2 = Runtime::new(RuntimeConfig { cache_dir: Some(dir.path().to_path_buf()), ..Default::default() }).unwrap();
    let t = Instant::now();
    rt2.placement(&bytes).unwrap();
    assert!(t.elapsed() < cold, "cache hit is faster than compiling");
    // Bytes the host didn't write (MAC mismatch) are never deserialized.
    let path = entries[0].path();
    let mut tampered = std::fs::read(&path).unwrap();
    let mid = tampered.len() / 2;
    tampered[mid] ^= 0xff;
    std::fs::write(&path, tampered).unwrap();
    let rt3 = Runtime::new(RuntimeConfig { cache_dir: Some(dir.path().to_path_buf()), ..Default::default() }).unwrap();
    let spread = rt3.placement(&bytes).unwrap();
    let cands = domains(&[("p", "a", 0, 65536)]);
    let d = spread.choose(&request(), &cands, Limits::default(), Grants::default()).await.unwrap();
    assert_eq!(chosen(&cands, &d), "p/a");
}

#[tokio::test]
async fn secrets_only_of_the_granted_keys() {
    use banlieue_runtime::capability::secrets::SecretsGrant;
    use k8s_openapi::api::core::v1::Secret;
    // A real Secret in the embedded API server.
    let server = banlieue_apiserver::ApiServer::start(banlieue_apiserver::Config::default()).await.unwrap();
    let kc = kube::config::Kubeconfig::from_yaml(&server.kubeconfig).unwrap();
    let client = kube::Client::try_from(kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap()).unwrap();
    let secrets: kube::Api<Secret> = kube::Api::namespaced(client.clone(), "default");
    let s: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "vsphere"}, "stringData": {"username": "admin", "password": "hunter22"}
    }))
    .unwrap();
    secrets.create(&Default::default(), &s).await.unwrap();
    let source = std::sync::Arc::new(banlieue_secrets::KubernetesSecret::new(client, "default", "vsphere"));
    let grants = || Grants { secrets: Some(SecretsGrant::new(source.clone(), ["username".to_string()])), ..Grants::default() };

    let rt = runtime();
    let p = rt.provider(&guest("hostile-provider")).unwrap();
    let ok = p.probe(&config("secret:username", ""), fast(), grants()).await.unwrap();
    assert_eq!(ok.failure_domains[0].name, "secret-len-5");
    let e = p.probe(&config("secret:password", ""), fast(), grants()).await.unwrap_err();
    assert!(matches!(&e, CallError::Guest(banlieue_runtime::GuestError::Denied(m)) if !m.contains("hunter22")), "{e}");
    let e = p.probe(&config("secret:username", ""), fast(), Grants::default()).await.unwrap_err();
    assert!(matches!(e, CallError::Guest(banlieue_runtime::GuestError::Denied(_))));
    server.shutdown().await;
}

#[tokio::test]
async fn a_driver_sees_only_its_own_providers_session() {
    use banlieue_runtime::capability::session::SessionStore;
    let store = SessionStore::new();
    store.grant("infra/vc-a/uid-a").set("cookie-of-a".into(), std::time::Duration::from_secs(60)).unwrap();
    let rt = runtime();
    let p = rt.provider(&guest("hostile-provider")).unwrap();
    let with = |scope: &str| Grants { session: Some(store.grant(scope)), ..Grants::default() };
    // Provider b's driver (same component) asks for "the" session and clears "it": b's, not a's.
    let seen = p.probe(&config("session", ""), fast(), with("infra/vc-b/uid-b")).await.unwrap();
    assert_eq!(seen.failure_domains[0].name, "session-none");
    let seen = p.probe(&config("session", ""), fast(), Grants::default()).await.unwrap();
    assert_eq!(seen.failure_domains[0].name, "session-none", "no grant, no session");
    // Provider a's driver sees its own (so the check above could have failed), and clears it.
    let seen = p.probe(&config("session", ""), fast(), with("infra/vc-a/uid-a")).await.unwrap();
    assert_eq!(seen.failure_domains[0].name, "session-cookie-of-a");
    assert_eq!(store.grant("infra/vc-a/uid-a").get(), None);
}

#[tokio::test]
async fn libvirt_only_through_the_granted_connection() {
    use banlieue_runtime::capability::libvirt::LibvirtGrant;
    let conns = banlieue_libvirt::Connections::new();
    let conn = conns.get("test:///default").await.unwrap();
    let rt = runtime();
    let p = rt.provider(&guest("hostile-provider")).unwrap();
    let grants = Grants { libvirt: Some(LibvirtGrant { conn }), ..Grants::default() };
    let inv = p.probe(&config("libvirt", ""), fast(), grants).await.unwrap();
    assert_eq!(inv.failure_domains[0].name, "domains-test", "the test driver's one domain");
    let e = p.probe(&config("libvirt", ""), fast(), Grants::default()).await.unwrap_err();
    assert!(matches!(e, CallError::Guest(banlieue_runtime::GuestError::Denied(_))), "{e}");
}

/// The host's peak resident memory so far (`VmHWM`), in MiB.
fn peak_rss_mib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok()).unwrap_or(0) / 1024
}

#[tokio::test]
async fn garbage_results_are_refused_with_what_was_wrong_and_the_limit() {
    let rt = runtime();
    let p = rt.provider(&guest("hostile-provider")).unwrap();
    let invalid = |r: Result<(), CallError>| match r {
        Err(CallError::InvalidResult(m)) => m,
        other => panic!("expected InvalidResult, got {other:?}"),
    };
    let probe = |name: &'static str, limits: Limits| {
        let p = p.clone();
        async move { p.probe(&config(name, "http://127.0.0.1:1"), limits, Grants::default()).await.map(|_| ()) }
    };
    let m = invalid(probe("domains-100000", Limits::default()).await);
    assert_eq!(m, "the driver's probe returned 100,000 failure domains; at most 1,000 are accepted");
    let m = invalid(probe("huge-domain", Limits::default()).await);
    assert!(m.contains("8,388,608 bytes; at most 256"), "{m}");
    let m = invalid(probe("bad-labels", Limits::default()).await);
    assert!(m.contains("5,000 labels"), "{m}");
    // Two million failure domains do not fit in the default 64 MiB: the guest's own limit.
    let e = probe("domains-2000000", Limits::default()).await.unwrap_err();
    assert!(matches!(e, CallError::Memory(64)), "{e}");
    // With a gigabyte they are built, and copying them out is bounded by the host.
    let big = Limits { cpu: Duration::from_secs(20), memory_bytes: 1 << 30 };
    let e = probe("domains-2000000", big).await.unwrap_err();
    assert!(matches!(e, CallError::InvalidResult(_)), "{e}");
    // 40 names aliasing one 32 MiB string would be 1.25 GiB once copied: the copy stops at 64 MiB.
    let before = peak_rss_mib();
    let m = invalid(probe("alias-40", Limits::default()).await);
    assert!(m.contains("more than the host copies"), "{m}");
    let grew = peak_rss_mib().saturating_sub(before);
    assert!(grew < 512, "the host's peak memory grew by {grew} MiB for an aliased result");

    let r = banlieue_runtime::provider::MachineRef {
        uid: "u".into(),
        name: "n".into(),
        namespace: "ns".into(),
        provider_id: None,
        failure_domain: "ok".into(),
        backend_id: None,
    };
    for (name, want) in [
        ("huge-status", "provider ID of 8,388,608 bytes; at most 512"),
        ("bad-addresses", "5,000 addresses; at most 64"),
        ("bad-conditions", "1,000 conditions; at most 16"),
        ("bad-enum", "a value its contract does not define (unexpected discriminant: 7)"),
    ] {
        let m = invalid(p.describe(&config(name, "http://127.0.0.1:1"), &r, fast(), Grants::default()).await.map(|_| ()));
        assert!(m.contains(want), "{name}: {m}");
        assert!(m.len() < 512, "{name}: the message stays short ({} bytes)", m.len());
    }
    // The same component still answers well-behaved calls.
    let inv = p.probe(&config("fine", "http://127.0.0.1:1"), fast(), Grants::default()).await.unwrap();
    assert_eq!(inv.failure_domains[0].name, "ok");
}
