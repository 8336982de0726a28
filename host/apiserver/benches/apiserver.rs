//! Embedded API server benchmark: creates/s of a 2 KiB custom object with and
//! without a watcher, watch delivery latency, and memory per stored object.
//!
//! Run: `cargo bench -p banlieue-apiserver --bench apiserver` (set BENCH_OBJECTS to change N).
//! Client and server share the machine (and its 2 cores), as in `banlieue dev`.

use std::time::{Duration, Instant};

use banlieue_apiserver::{ApiServer, Config};
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::json;

const CONCURRENCY: usize = 32;

/// Counts live heap bytes, so memory per stored object is measured, not guessed from RSS.
struct Counting;

static LIVE: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as i64, std::sync::atomic::Ordering::Relaxed);
        unsafe { std::alloc::System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        LIVE.fetch_sub(l.size() as i64, std::sync::atomic::Ordering::Relaxed);
        unsafe { std::alloc::System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: std::alloc::Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as i64 - l.size() as i64, std::sync::atomic::Ordering::Relaxed);
        unsafe { std::alloc::System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn live_bytes() -> i64 {
    LIVE.load(std::sync::atomic::Ordering::Relaxed)
}

fn crd() -> serde_json::Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "benches.bench.banlieue.io"},
        "spec": {"group": "bench.banlieue.io", "scope": "Namespaced",
            "names": {"plural": "benches", "singular": "bench", "kind": "Bench"},
            "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "required": ["cpus"], "properties": {
                        "cpus": {"type": "integer", "minimum": 1},
                        "memoryMiB": {"type": "integer", "minimum": 64},
                        "sentAtMicros": {"type": "integer"},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "disks": {"type": "array", "items": {"type": "object", "properties": {
                            "name": {"type": "string"}, "sizeGiB": {"type": "integer"}}}},
                        "blob": {"type": "string", "maxLength": 4096}}},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]}
    })
}

fn object(i: usize, t0: Instant) -> DynamicObject {
    let mut o = json!({
        "apiVersion": "bench.banlieue.io/v1", "kind": "Bench",
        "metadata": {"name": format!("b-{i}"), "labels": {"app": "bench", "shard": (i % 8).to_string()}},
        "spec": {"cpus": 2, "memoryMiB": 2048, "sentAtMicros": t0.elapsed().as_micros() as u64,
                 "labels": {"tier": "web", "zone": "a"},
                 "disks": [{"name": "root", "sizeGiB": 20}, {"name": "data", "sizeGiB": 100}],
                 "blob": ""}
    });
    // Pad to 2 KiB of JSON.
    let len = serde_json::to_vec(&o).unwrap().len();
    o["spec"]["blob"] = json!("x".repeat(2048usize.saturating_sub(len)));
    serde_json::from_value(o).unwrap()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

struct RunResult {
    creates_per_s: f64,
    latencies_ms: Vec<f64>,
    /// Heap bytes per stored object beyond its stored JSON size.
    overhead_per_object: f64,
}

/// `n` creates with `concurrency` in flight, optionally watched, optionally persisted.
async fn run(n: usize, concurrency: usize, watch: bool, data_dir: Option<std::path::PathBuf>) -> anyhow::Result<RunResult> {
    let server = ApiServer::start(Config { data_dir, ..Default::default() }).await?;
    let kc = kube::config::Kubeconfig::from_yaml(&server.kubeconfig)?;
    let client = kube::Client::try_from(kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?)?;
    let crds: Api<DynamicObject> = Api::all_with(client.clone(), &ApiResource::from_gvk(&GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition")));
    crds.create(&PostParams::default(), &serde_json::from_value(crd())?).await?;
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("bench.banlieue.io", "v1", "Bench"));
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    let t0 = Instant::now();

    let watcher = if watch {
        let stream = api.watch(&WatchParams::default().timeout(290), "0").await?;
        Some(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(n);
            let mut stream = stream.boxed();
            while let Ok(Some(ev)) = stream.try_next().await {
                if let WatchEvent::Added(o) = ev {
                    let sent = o.data["spec"]["sentAtMicros"].as_u64().unwrap_or(0);
                    lat.push((t0.elapsed().as_micros() as u64).saturating_sub(sent) as f64 / 1000.0);
                    if lat.len() == n {
                        break;
                    }
                }
            }
            lat
        }))
    } else {
        None
    };

    let heap_before = live_bytes();
    let start = Instant::now();
    let stored_json = std::sync::atomic::AtomicUsize::new(0);
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move { api.create(&PostParams::default(), &object(i, t0)).await }
        })
        .buffer_unordered(concurrency)
        .try_for_each(|o| {
            stored_json.fetch_add(serde_json::to_vec(&o).map(|v| v.len()).unwrap_or(0), std::sync::atomic::Ordering::Relaxed);
            async { Ok(()) }
        })
        .await?;
    let elapsed = start.elapsed();
    let mut latencies_ms = match watcher {
        Some(w) => tokio::time::timeout(Duration::from_secs(120), w).await??,
        None => vec![],
    };
    latencies_ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let growth = (live_bytes() - heap_before) as f64;
    let overhead_per_object = growth / n as f64 - stored_json.into_inner() as f64 / n as f64;
    server.shutdown().await;
    Ok(RunResult { creates_per_s: n as f64 / elapsed.as_secs_f64(), latencies_ms, overhead_per_object })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let n: usize = std::env::var("BENCH_OBJECTS").ok().and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let rounds = 3;
    println!("embedded API server: {n} creates of a 2 KiB custom object, {rounds} rounds, medians");
    let (mut plain, mut watched, mut persisted) = (vec![], vec![], vec![]);
    let (mut load_p50, mut load_p99, mut seq_p50, mut seq_p99, mut mem) = (vec![], vec![], vec![], vec![], vec![]);
    for _ in 0..rounds {
        // Variants interleaved in one run so machine noise hits all of them alike.
        plain.push(run(n, CONCURRENCY, false, None).await?.creates_per_s);
        let r = run(n, CONCURRENCY, true, None).await?;
        watched.push(r.creates_per_s);
        load_p50.push(percentile(&r.latencies_ms, 0.50));
        load_p99.push(percentile(&r.latencies_ms, 0.99));
        let dir = tempfile_dir();
        persisted.push(run(n, CONCURRENCY, true, Some(dir.clone())).await?.creates_per_s);
        let _ = std::fs::remove_dir_all(dir);
        // One create at a time: what a watcher sees when the server is not saturated.
        let r = run(n / 5, 1, true, None).await?;
        seq_p50.push(percentile(&r.latencies_ms, 0.50));
        seq_p99.push(percentile(&r.latencies_ms, 0.99));
        mem.push(r.overhead_per_object);
    }
    println!("creates/s, {CONCURRENCY} in flight, no watcher:          {:>8.0}", median(plain));
    println!("creates/s, {CONCURRENCY} in flight, 1 watcher:           {:>8.0}", median(watched));
    println!("creates/s, {CONCURRENCY} in flight, 1 watcher, data-dir: {:>8.0}", median(persisted));
    println!("watch latency at saturation ({CONCURRENCY} in flight) p50:  {:>8.2} ms", median(load_p50));
    println!("watch latency at saturation ({CONCURRENCY} in flight) p99:  {:>8.2} ms", median(load_p99));
    println!("watch latency, one create at a time, p50:     {:>8.2} ms", median(seq_p50));
    println!("watch latency, one create at a time, p99:     {:>8.2} ms", median(seq_p99));
    println!("heap per stored object beyond its JSON:       {:>8.0} bytes", median(mem));
    Ok(())
}

fn tempfile_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("banlieue-bench-{}-{}", std::process::id(), rand_suffix()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}
