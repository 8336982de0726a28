//! What observability costs the control loop: 1,000 VMs from apply to all Ready (embedded
//! API server in a child process, libvirt test driver, the real components), with
//!
//! - `off`: no traces, nobody scraping (the default);
//! - `scraped`: `/metrics` rendered every second, as Prometheus would scrape it;
//! - `traced`: traces on, exported over OTLP/HTTP to a receiver in this (parent) process;
//! - `both`: traced and scraped.
//!
//! Each run is a process of its own (the tracing subscriber is process-wide), the variants
//! interleaved run after run; medians of wall time and of the control plane's CPU time.
//!
//! `cargo bench -p banlieue-tests --bench observability` (BENCH_VMS=1000, BENCH_RUNS=3)

use std::collections::HashSet;
use std::time::{Duration, Instant};

use banlieue_tests::control::{apply, guests_dist, libvirt_test_node};
use futures::{StreamExt, TryStreamExt};
use serde_json::json;

const NS: &str = "default";
const VARIANT_ENV: &str = "BANLIEUE_BENCH_VARIANT";
const VARIANTS: [&str; 4] = ["off", "scraped", "traced", "both"];

fn main() -> anyhow::Result<()> {
    if let Some(served) = banlieue_tests::bench::serve_if_child() {
        return served;
    }
    let vms: usize = std::env::var("BENCH_VMS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    match std::env::var(VARIANT_ENV) {
        Ok(variant) => rt.block_on(run(&variant, vms)),
        Err(_) => rt.block_on(compare(vms)),
    }
}

/// CPU time (user + system) this process has used.
fn cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // After the command's closing parenthesis come fields 3 (state) on: utime and stime are
    // fields 14 and 15 (proc(5)), in clock ticks of 10 ms.
    let fields: Vec<&str> = stat.rsplit_once(')').map(|(_, r)| r.split_whitespace().collect()).unwrap_or_default();
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    let ticks = field(14) + field(15);
    Duration::from_millis(ticks * 10)
}

async fn compare(vms: usize) -> anyhow::Result<()> {
    let runs: usize = std::env::var("BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let receiver = banlieue_tests::otlp::Receiver::start().await?;
    let mut results: Vec<(&str, f64, f64)> = Vec::new();
    for run in 0..runs {
        for variant in VARIANTS {
            let before = receiver.spans().len();
            let out = tokio::process::Command::new(std::env::current_exe()?)
                .env(VARIANT_ENV, variant)
                .env("BENCH_VMS", vms.to_string())
                .env("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.url)
                .output()
                .await?;
            anyhow::ensure!(out.status.success(), "{variant}: {}", String::from_utf8_lossy(&out.stderr));
            let line = String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().to_string();
            let v: serde_json::Value = serde_json::from_str(&line)?;
            let (wall, cpu) = (v["wall"].as_f64().unwrap_or(f64::NAN), v["cpu"].as_f64().unwrap_or(f64::NAN));
            let spans = receiver.spans().len() - before;
            println!(
                "run {run} {variant:>8}: all Ready after {wall:.2}s, control plane CPU {cpu:.2}s, {spans} spans received, {} scrapes; then one scrape {:.1} ms ({} series) vs kubectl get of every VM {:.0} ms",
                v["scrapes"], v["scrape_ms"].as_f64().unwrap_or(f64::NAN), v["series"], v["kubectl_ms"].as_f64().unwrap_or(f64::NAN)
            );
            results.push((variant, wall, cpu));
        }
    }
    let median = |mut xs: Vec<f64>| {
        xs.sort_by(f64::total_cmp);
        xs[xs.len() / 2]
    };
    let base = |f: fn(&(&str, f64, f64)) -> f64| median(results.iter().filter(|r| r.0 == "off").map(f).collect());
    let (wall0, cpu0) = (base(|r| r.1), base(|r| r.2));
    println!("\n{vms} VMs, median of {runs} runs each:");
    println!("| variant | apply → all Ready | vs off | control plane CPU | vs off |");
    println!("|---|---|---|---|---|");
    for variant in VARIANTS {
        let wall = median(results.iter().filter(|r| r.0 == variant).map(|r| r.1).collect());
        let cpu = median(results.iter().filter(|r| r.0 == variant).map(|r| r.2).collect());
        println!("| {variant} | {wall:.2} s | {:+.1} % | {cpu:.2} s | {:+.1} % |", (wall / wall0 - 1.0) * 100.0, (cpu / cpu0 - 1.0) * 100.0);
    }
    Ok(())
}

fn vm(name: &str) -> serde_json::Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name, "namespace": NS},
           "spec": {"classRef": {"name": "small"}, "imageRef": {"name": "debian"}}})
}

/// One run: prints its figures as a JSON line.
async fn run(variant: &str, vms: usize) -> anyhow::Result<()> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let traced = matches!(variant, "traced" | "both");
    let scraped = matches!(variant, "scraped" | "both");
    if traced {
        let layer = banlieue_controller::ops::traces::layer("banlieue-bench")?.ok_or_else(|| anyhow::anyhow!("no OTEL_EXPORTER_OTLP_ENDPOINT"))?;
        tracing_subscriber::registry().with(layer.with_filter(tracing_subscriber::filter::LevelFilter::INFO)).init();
    }
    let dir = tempfile::tempdir()?;
    let server = banlieue_tests::bench::ChildApiServer::start().await?;
    let client = server.client.clone();
    let uri = libvirt_test_node(dir.path(), "bench-host", 64, 1024, 1 << 20)?;
    let mut objects = banlieue_tests::bench::libvirt_objects();
    objects.push(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "host", "namespace": NS},
                        "spec": {"providerClassRef": {"name": "libvirt"}, "connection": {"endpoint": uri},
                                 "capabilities": {"storageClasses": {"standard": "default-pool"}, "networkClasses": {"default": "default"}},
                                 "limits": {"maxConcurrentOperations": 1000, "operationsPerSecond": 10000}}}));
    for object in objects {
        apply(&client, object).await?;
    }
    let (ctx, roles) = banlieue_tests::bench::control_plane(&client, guests_dist(), dir.path().join("cache"))?;
    apply(&client, vm("warmup")).await?;
    banlieue_tests::bench::await_ready(&client, NS, HashSet::from(["warmup".to_string()]), Duration::from_secs(60)).await?;

    let scrapes = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let scraper = scraped.then(|| {
        let (ctx, scrapes) = (ctx.clone(), scrapes.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                std::hint::black_box(ctx.metrics.render());
                scrapes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        })
    });
    let names: Vec<String> = (0..vms).map(|i| format!("vm-{i:05}")).collect();
    let (start, cpu_start) = (Instant::now(), cpu());
    let waiting = tokio::spawn({
        let client = client.clone();
        let want = names.iter().cloned().collect();
        async move { banlieue_tests::bench::await_ready(&client, NS, want, Duration::from_secs(900)).await }
    });
    futures::stream::iter(names.into_iter().map(|n| {
        let client = client.clone();
        async move { apply(&client, vm(&n)).await }
    }))
    .buffer_unordered(32)
    .try_collect::<Vec<_>>()
    .await?;
    waiting.await??;
    let (wall, used) = (start.elapsed(), cpu() - cpu_start);
    if let Some(s) = scraper {
        s.abort();
    }
    // How many VMs are Ready, as an operator asks: one scrape (the fleet read from the caches)
    // against `kubectl get` of every VM, counted by its Ready condition.
    let median = |mut xs: Vec<f64>| {
        xs.sort_by(f64::total_cmp);
        xs[xs.len() / 2]
    };
    let scrape_ms = median((0..11).map(|_| {
        let t = Instant::now();
        std::hint::black_box(ctx.metrics.render());
        t.elapsed().as_secs_f64() * 1000.0
    }).collect());
    let series = ctx.metrics.render().lines().filter(|l| !l.starts_with('#')).count();
    let mut kubectl_ms = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let out = tokio::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(server.kubeconfig())
            .args(["get", "virtualmachines", "-n", NS, "-o", r#"jsonpath={range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}"#])
            .output()
            .await?;
        anyhow::ensure!(out.status.success(), "kubectl: {}", String::from_utf8_lossy(&out.stderr));
        let ready = String::from_utf8_lossy(&out.stdout).lines().filter(|l| *l == "True").count();
        anyhow::ensure!(ready == vms + 1, "kubectl counted {ready} Ready VMs");
        kubectl_ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let kubectl_ms = median(kubectl_ms);
    roles.abort();
    drop(server);
    println!("{}", json!({"wall": wall.as_secs_f64(), "cpu": used.as_secs_f64(), "scrapes": scrapes.load(std::sync::atomic::Ordering::Relaxed),
                          "scrape_ms": scrape_ms, "series": series, "kubectl_ms": kubectl_ms}));
    Ok(())
}
