//! Runtime benchmark: instantiate + trivial call, load from the precompiled cache,
//! `choose` over 10,000 candidates in Wasm vs the same code native (and a 0.1.0
//! component through the host's adapter), and the overhead of a Wasm provider
//! call over native code on an I/O-bound call.
//!
//! Run: `guests/build.sh && cargo bench -p banlieue-runtime --bench runtime`
//! (`BENCH_ONLY=instance,load,choose,io` for some sections only).

use std::time::{Duration, Instant};

use banlieue_runtime::capability::http::HttpGrant;
use banlieue_runtime::capability::Grants;
use banlieue_runtime::placement::{Capacity, Domains, DomainsBuilder, Request, VmClass};
use banlieue_runtime::provider::ProviderConfig;
use banlieue_runtime::{Limits, Runtime, RuntimeConfig};
use banlieue_sdk::placement::fixtures::Domain;
use banlieue_sdk::placement::{Candidates, Policy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

// The host's request and tables as the SDK's types, for the native run.
#[path = "../tests/sdk_tables/mod.rs"]
mod sdk_tables;

use banlieue_test_backends::guest_component as guest;

/// `BENCH_ONLY=instance,load,choose,io` runs only those sections (all by default).
fn want(section: &str) -> bool {
    std::env::var("BENCH_ONLY").map(|v| v.split(',').any(|s| s == section)).unwrap_or(true)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// What the host knows about 10,000 failure domains (10 Providers; three zones;
/// up to two VMs each), before any placement request is made.
fn host_state(n: usize) -> Vec<Domain> {
    (0..n)
        .map(|i| {
            let mut d = banlieue_sdk::placement::fixtures::candidate(&format!("default/p{}", i % 10), &format!("fd-{i}"))
                .with_labels(&[("zone", &format!("z{}", i % 3))]);
            d.capacity = banlieue_sdk::placement::Capacity { cpus: 64, memory_mib: 65536 + (i as u64 % 97), storage_gib: 1000 };
            d.storage_classes = vec!["standard".into()];
            d.network_classes = vec!["default".into()];
            d.vm_count = (i % 5) as u32;
            if i % 3 > 0 {
                d.vms.push(("default".into(), vec![("app".into(), "web".into())], (i % 3) as u32));
            }
            d
        })
        .collect()
}

/// The host's preparation: the request tables, interned from what it knows.
fn host_domains(state: &[Domain]) -> Domains {
    let mut b = DomainsBuilder::with_capacity(state.len());
    let mut groups = vec![];
    for d in state {
        let labels = d.labels.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        let facts = b.facts(&d.provider_class, labels, &d.storage_classes, &d.network_classes, &d.features);
        groups.clear();
        for (ns, labels, n) in &d.vms {
            let g = b.group(ns, labels.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            groups.extend(std::iter::repeat_n(g, *n as usize));
        }
        let (provider, fd) = (b.text(&d.provider), b.text(&d.failure_domain));
        let c = Capacity { cpus: d.capacity.cpus, memory_mib: d.capacity.memory_mib, storage_gib: d.capacity.storage_gib };
        b.candidate(provider, fd, facts, c, d.vm_count, groups.iter().copied());
    }
    b.build()
}

fn host_request() -> Request {
    Request {
        vm_name: "web-1".into(),
        vm_namespace: "default".into(),
        vm_labels: vec![("app".into(), "web".into())],
        class: VmClass { name: "small".into(), cpus: 2, memory_mib: 2048, storage_gib: 20, storage_classes: vec!["standard".into()], network_classes: vec!["default".into()], features: vec![] },
        parameters: "{}".into(),
        anti_affinity: vec![],
    }
}

async fn loopback_server() -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 8192];
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {
                            // A backend that takes ~2 ms, like a fast API on the LAN.
                            tokio::time::sleep(Duration::from_millis(2)).await;
                            if s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    port
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let cache = tempfile::tempdir().unwrap();
    let rt = Runtime::new(RuntimeConfig { cache_dir: Some(cache.path().to_path_buf()), ..Default::default() }).unwrap();
    let spread_bytes = guest("placement-spread");
    let spread = rt.placement(&spread_bytes).unwrap();

    // 1. Fresh instance + trivial call.
    if want("instance") {
        let mut v = Vec::new();
        for _ in 0..3000 {
            let t = Instant::now();
            spread.contract_version().await.unwrap();
            v.push(t.elapsed());
        }
        println!("fresh instance + trivial call:          {:>10.1?} median", median(v));
    }

    // 2. Load from the precompiled cache (MAC check, deserialize, link, pre-instantiate),
    //    and by compiling.
    if want("load") {
        let mut v = Vec::new();
        for _ in 0..50 {
            let rt2 = Runtime::new(RuntimeConfig { cache_dir: Some(cache.path().to_path_buf()), ..Default::default() }).unwrap();
            let t = Instant::now();
            rt2.placement(&spread_bytes).unwrap();
            v.push(t.elapsed());
        }
        println!("load from precompiled cache:            {:>10.1?} median", median(v));
        let mut v = Vec::new();
        for _ in 0..5 {
            let rt3 = Runtime::new(RuntimeConfig::default()).unwrap();
            let t = Instant::now();
            rt3.placement(&spread_bytes).unwrap();
            v.push(t.elapsed());
        }
        println!("load by compiling (no cache):           {:>10.1?} median", median(v));
    }

    // 3. choose over 10,000 candidates, data preparation included, Wasm vs native;
    //    where the time goes; and a 0.1.0 component through the adapter.
    if want("choose") {
        let state = host_state(10_000);
        let legacy = rt.placement(&guest("placement-legacy")).unwrap();
        let (mut wasm, mut native) = (Vec::new(), Vec::new());
        let (mut prep, mut call, mut ignored, mut nprep, mut ncall, mut legacy_call) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..31 {
            let t = Instant::now();
            let domains = host_domains(&state);
            let req = host_request();
            let prepared = t.elapsed();
            let d = spread.choose(&req, &domains, Limits::default(), Grants::default()).await.unwrap();
            let total = t.elapsed();
            prep.push(prepared);
            call.push(total - prepared);
            wasm.push(total);

            // Native: the same preparation, then the tables handed over as the SDK's types.
            let t = Instant::now();
            let tables = sdk_tables::tables(host_domains(&state));
            let nreq = sdk_tables::request(&host_request());
            let prepared = t.elapsed();
            let n = placement_spread::Spread::choose(&nreq, Candidates::new(&tables).unwrap()).unwrap();
            let total = t.elapsed();
            nprep.push(prepared);
            ncall.push(total - prepared);
            native.push(total);
            assert_eq!((d.candidate, d.score, &d.reason), (n.candidate, n.score, &n.reason), "same decision");

            // Invalid parameters: the policy fails before it looks at a candidate, so
            // this is the cost of the call itself: a fresh instance and moving the
            // tables into guest memory.
            let bad = Request { parameters: "{not json".into(), ..req.clone() };
            let t = Instant::now();
            spread.choose(&bad, &domains, Limits::default(), Grants::default()).await.unwrap_err();
            ignored.push(t.elapsed());

            // A 0.1.0 component (most free memory): the tables expanded into 0.1.0's shape.
            let t = Instant::now();
            legacy.choose(&req, &domains, Limits::default(), Grants::default()).await.unwrap();
            legacy_call.push(t.elapsed());
        }
        let (w, n) = (median(wasm), median(native));
        println!("choose over 10,000 candidates, Wasm:    {:>10.2?} median", w);
        println!("choose over 10,000 candidates, native:  {:>10.2?} median  (Wasm/native = {:.2}x)", n, w.as_secs_f64() / n.as_secs_f64());
        println!("  Wasm: host builds the tables          {:>10.2?} median", median(prep));
        println!("  Wasm: the choose call                 {:>10.2?} median", median(call));
        println!("  Wasm: a call that ignores its input   {:>10.2?} median", median(ignored));
        println!("  native: build the tables (the same)   {:>10.2?} median", median(nprep));
        println!("  native: the policy                    {:>10.2?} median", median(ncall));
        println!("  0.1.0 component through the adapter   {:>10.2?} median  (call only; the tables as above)", median(legacy_call));
    }
    if !want("io") {
        return;
    }

    // 4. A provider call that is one HTTP round trip to a loopback backend:
    //    the Wasm driver vs the same request made by native code through the same grant.
    let port = loopback_server().await;
    let endpoint = format!("http://127.0.0.1:{port}");
    let grant = HttpGrant::for_endpoint(&endpoint).await.unwrap();
    let driver = rt.provider(&guest("hostile-provider")).unwrap();
    let config = ProviderConfig { provider: "http".into(), endpoint: endpoint.clone(), credential_keys: vec![], storage_classes: vec![], network_classes: vec![], features: vec![] };
    let (mut wasm, mut native) = (Vec::new(), Vec::new());
    for _ in 0..300 {
        let t = Instant::now();
        driver.probe(&config, Limits::default(), Grants { http: Some(grant.clone()), ..Default::default() }).await.unwrap();
        wasm.push(t.elapsed());
        let t = Instant::now();
        let req = banlieue_runtime::capability::http::Request { method: "GET".into(), url: endpoint.clone(), headers: vec![], body: None, timeout_ms: None };
        grant.send(req).await.unwrap();
        native.push(t.elapsed());
    }
    let (w, n) = (median(wasm), median(native));
    println!("I/O-bound provider call, Wasm driver:   {:>10.2?} median", w);
    println!("I/O-bound provider call, native:        {:>10.2?} median  (overhead {:+.1}%)", n, (w.as_secs_f64() / n.as_secs_f64() - 1.0) * 100.0);
}
