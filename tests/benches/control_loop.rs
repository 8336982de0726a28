//! The control loop at scale: time from applying 1,000 VirtualMachines to all of
//! them Ready (embedded API server, libvirt test driver, the real placement and
//! provider components), and the controller process's RSS with 10,000 VMs tracked.
//!
//! The API server runs in a child process (this binary again, see `serve_api`), so
//! the RSS figures are the control plane's alone.
//!
//! `cargo bench -p banlieue-tests --bench control_loop` (BENCH_VMS=1000, BENCH_TRACKED=10000)

use std::collections::HashSet;
use std::time::{Duration, Instant};

use banlieue_api::VirtualMachine;
use banlieue_tests::control::{apply, guests_dist, libvirt_test_node};
use futures::{StreamExt, TryStreamExt};
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};
use serde_json::json;

const NS: &str = "default";

/// Live heap bytes, to tell data held from allocator retention in the RSS figures.
struct Counting;

static INNER: std::alloc::System = std::alloc::System;

static LIVE: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as i64, std::sync::atomic::Ordering::Relaxed);
        unsafe { std::alloc::GlobalAlloc::alloc(&INNER, l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        LIVE.fetch_sub(l.size() as i64, std::sync::atomic::Ordering::Relaxed);
        unsafe { std::alloc::GlobalAlloc::dealloc(&INNER, p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: std::alloc::Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as i64 - l.size() as i64, std::sync::atomic::Ordering::Relaxed);
        unsafe { std::alloc::GlobalAlloc::realloc(&INNER, p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn heap_mib() -> f64 {
    LIVE.load(std::sync::atomic::Ordering::Relaxed) as f64 / (1024.0 * 1024.0)
}

fn main() -> anyhow::Result<()> {
    if let Some(served) = banlieue_tests::bench::serve_if_child() {
        return served;
    }
    let vms: usize = std::env::var("BENCH_VMS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let tracked: usize = std::env::var("BENCH_TRACKED").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(bench(vms, tracked))
}

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

fn vm(name: &str, class: &str) -> serde_json::Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name, "namespace": NS},
           "spec": {"classRef": {"name": class}, "imageRef": {"name": "debian"}}})
}

/// Apply `names` with up to 32 requests in flight.
async fn apply_all(client: &kube::Client, names: Vec<String>, class: &str) -> anyhow::Result<()> {
    futures::stream::iter(names.into_iter().map(|n| {
        let client = client.clone();
        let class = class.to_string();
        async move { apply(&client, vm(&n, &class)).await }
    }))
    .buffer_unordered(32)
    .try_collect::<Vec<_>>()
    .await?;
    Ok(())
}


async fn bench(vms: usize, tracked: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let server = banlieue_tests::bench::ChildApiServer::start().await?;
    let client = server.client.clone();
    // A big host: placement capacity and the pool never run out.
    let uri = libvirt_test_node(dir.path(), "bench-host", 64, 1024, 1 << 20)?;
    for object in [
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "ProviderClass", "metadata": {"name": "libvirt"},
               "spec": {"component": {"source": "builtin:provider-libvirt"}, "infrastructureKind": "Libvirt", "capabilities": {"libvirt": true}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": "small"},
               "spec": {"cpus": 1, "memoryMiB": 512, "disks": [{"name": "root", "sizeGiB": 4, "storageClass": "standard"}],
                        "nics": [{"name": "eth0", "networkClass": "default"}]}}),
        // Tracked but never placeable: no Provider offers its storage class.
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": "unplaceable"},
               "spec": {"cpus": 1, "memoryMiB": 512, "disks": [{"name": "root", "sizeGiB": 4, "storageClass": "absent"}]}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": "debian"},
               "spec": {"sources": [{"providerClass": "libvirt", "backingFile": "/images/debian.qcow2"}]}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "host", "namespace": NS},
               "spec": {"providerClassRef": {"name": "libvirt"}, "connection": {"endpoint": uri},
                        "capabilities": {"storageClasses": {"standard": "default-pool"}, "networkClasses": {"default": "default"}},
                        // libvirt's test driver needs no protection: measure banlieue, not the throttle.
                        "limits": {"maxConcurrentOperations": 1000, "operationsPerSecond": 10000}}}),
    ] {
        apply(&client, object).await?;
    }
    let rss_before = rss_mib();
    let (ctx, roles) = banlieue_tests::bench::control_plane(&client, guests_dist(), dir.path().join("cache"))?;

    // Warm up: components loaded and compiled, the Provider probed, one VM through.
    apply(&client, vm("warmup", "small")).await?;
    banlieue_tests::bench::await_ready(&client, NS, HashSet::from(["warmup".to_string()]), Duration::from_secs(60)).await?;
    let rss_idle = rss_mib();

    let names: Vec<String> = (0..vms).map(|i| format!("vm-{i:05}")).collect();
    // The embedded server's resourceVersion counts every write it took, whoever made it.
    let rv_before = current_rv(&client).await?;
    let start = Instant::now();
    let waiting = tokio::spawn({
        let client = client.clone();
        let want = names.iter().cloned().collect();
        async move { banlieue_tests::bench::await_ready(&client, NS, want, Duration::from_secs(600)).await }
    });
    apply_all(&client, names, "small").await?;
    let applied = start.elapsed();
    waiting.await??;
    let all_ready = start.elapsed();
    let writes = current_rv(&client).await?.saturating_sub(rv_before);
    println!("{vms} VMs: applied in {:.2}s, all Ready after {:.2}s ({:.0} VMs/s)", applied.as_secs_f64(), all_ready.as_secs_f64(), vms as f64 / all_ready.as_secs_f64());
    println!("API writes from apply to all Ready: {writes} ({:.1} per VM, the bench's own apply included)", writes as f64 / vms as f64);
    let rss_after_ready = rss_mib();
    let heap_after_ready = heap_mib();
    if std::env::var_os("BENCH_METRICS").is_some() {
        for line in ctx.metrics.render().lines().filter(|l| (l.contains("_total") || l.contains("_sum")) && !l.starts_with('#')) {
            println!("  {line}");
        }
    }

    // Track more, up to `tracked`: VMs that stay unscheduled (reconciled, conditions written, kept in the cache).
    let extra: Vec<String> = (vms..tracked.max(vms)).map(|i| format!("vm-{i:05}")).collect();
    let extra_count = extra.len();
    let start = Instant::now();
    apply_all(&client, extra, "unplaceable").await?;
    // Wait (by watch: the bench must not hold lists of 10k VMs itself) until the controller
    // has reported on every one of them.
    let mut want: HashSet<String> = (0..tracked.max(vms)).map(|i| format!("vm-{i:05}")).collect();
    want.insert("warmup".into());
    let api: Api<VirtualMachine> = Api::namespaced(client.clone(), NS);
    let mut events = watcher(api, watcher::Config::default()).default_backoff().applied_objects().boxed();
    tokio::time::timeout(Duration::from_secs(900), async {
        while !want.is_empty() {
            let Some(vm) = events.try_next().await? else { anyhow::bail!("watch ended") };
            if vm.status.as_ref().is_some_and(|s| !s.conditions.is_empty()) {
                want.remove(vm.metadata.name.as_deref().unwrap_or_default());
            }
        }
        Ok(())
    })
    .await
    .map_err(|_| anyhow::anyhow!("VMs not reported on within 900s"))??;
    drop(events);
    println!("{} more VMs (unplaceable) reported on in {:.1}s", extra_count, start.elapsed().as_secs_f64());
    println!(
        "controller RSS: {rss_before:.0} MiB before the roles, {rss_idle:.0} MiB idle after warm-up, {rss_after_ready:.0} MiB with {} VMs Ready, {:.0} MiB with {} VMs tracked",
        vms + 1,
        rss_mib(),
        vms + 1 + extra_count
    );
    println!("live heap: {heap_after_ready:.0} MiB with {} VMs Ready, {:.0} MiB with {} VMs tracked", vms + 1, heap_mib(), vms + 1 + extra_count);
    roles.abort();
    drop(server);
    Ok(())
}

/// The API server's current resourceVersion (a list's): on the embedded server, the number of
/// writes it has taken.
async fn current_rv(client: &kube::Client) -> anyhow::Result<u64> {
    let list = Api::<VirtualMachine>::namespaced(client.clone(), NS).list_metadata(&kube::api::ListParams::default().limit(1)).await?;
    let rv = list.metadata.resource_version.unwrap_or_default();
    rv.parse().map_err(|_| anyhow::anyhow!("resourceVersion {rv:?} is not a number"))
}
