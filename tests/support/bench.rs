//! The benchmarks' API server, run in a child process (the bench binary again), so
//! what a benchmark measures in its own process — RSS, CPU — is the control plane's alone.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{Api, Patch, PatchParams};

/// Set in the child: the directory to write its kubeconfig and `ready` marker to.
const CHILD_ENV: &str = "BANLIEUE_BENCH_API_DIR";

/// Call first in a benchmark's `main`: in the child process, serve the API until the
/// parent closes stdin and return its result; in the parent, `None`.
pub fn serve_if_child() -> Option<anyhow::Result<()>> {
    let dir = std::env::var(CHILD_ENV).ok()?;
    Some(serve(Path::new(&dir)))
}

fn serve(dir: &Path) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async {
        let server = banlieue_apiserver::ApiServer::start(banlieue_apiserver::Config::default()).await?;
        server.write_kubeconfig(&dir.join("kubeconfig"))?;
        std::fs::write(dir.join("ready"), b"")?;
        tokio::task::spawn_blocking(|| {
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
        })
        .await?;
        server.shutdown().await;
        Ok(())
    })
}

/// The API server child with banlieue's CRDs installed; stopped (stdin closed, waited for) when dropped.
pub struct ChildApiServer {
    process: std::process::Child,
    _dir: tempfile::TempDir,
    pub client: kube::Client,
}

impl ChildApiServer {
    pub async fn start() -> anyhow::Result<ChildApiServer> {
        let dir = tempfile::tempdir()?;
        let process = std::process::Command::new(std::env::current_exe()?)
            .env(CHILD_ENV, dir.path())
            .stdin(std::process::Stdio::piped())
            .spawn()?;
        let started = Instant::now();
        while !dir.path().join("ready").exists() {
            anyhow::ensure!(started.elapsed() < Duration::from_secs(30), "API server did not start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let client = crate::client_for(&dir.path().join("kubeconfig")).await?;
        let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> = Api::all(client.clone());
        for crd in banlieue_api::crdgen::all_crds() {
            crds.patch(crd.metadata.name.as_deref().unwrap_or_default(), &PatchParams::apply("bench").force(), &Patch::Apply(&crd)).await?;
        }
        Ok(ChildApiServer { process, _dir: dir, client })
    }

    /// Its kubeconfig (for `kubectl` in a bench).
    pub fn kubeconfig(&self) -> std::path::PathBuf {
        self._dir.path().join("kubeconfig")
    }

    /// The child's PID (for its CPU time in /proc).
    pub fn id(&self) -> u32 {
        self.process.id()
    }
}

impl Drop for ChildApiServer {
    fn drop(&mut self) {
        // Closing its stdin stops the API server.
        drop(self.process.stdin.take());
        let _ = self.process.wait();
    }
}

/// `$name` parsed, or `default` when unset or unparsable (benchmark knobs).
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Every role of one process, run in the bench's process: no leader election, `BENCH_CONCURRENCY` honoured (default 32).
pub fn control_plane(
    client: &kube::Client,
    builtin_dir: PathBuf,
    cache_dir: PathBuf,
) -> anyhow::Result<(Arc<banlieue_controller::Context>, tokio::task::JoinHandle<anyhow::Result<()>>)> {
    let options = banlieue_controller::Options {
        builtin_dir,
        cache_dir: Some(cache_dir),
        leader_election: false,
        concurrency: env_or("BENCH_CONCURRENCY", 32),
        ..banlieue_controller::Options::default()
    };
    let ctx = banlieue_controller::Context::new(client.clone(), options)?;
    let roles = tokio::spawn(banlieue_controller::run(ctx.clone(), banlieue_controller::Roles::ALL, std::future::pending()));
    Ok((ctx, roles))
}

/// The median (NaN for none).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The embedded server's audit log position now (see [`writes_since`]).
pub fn mark(server: &banlieue_apiserver::ApiServer) -> u64 {
    server.audit_log().last().map_or(0, |e| e.seq + 1)
}

/// Writes (create, update, patch, delete) the server answered since `from`, less the
/// bench's own `own`.
pub fn writes_since(server: &banlieue_apiserver::ApiServer, from: u64, own: usize) -> usize {
    let all = server.audit_log().iter().filter(|e| e.seq >= from && matches!(e.verb.as_str(), "create" | "update" | "patch" | "delete")).count();
    all.saturating_sub(own)
}

/// Watch the VMs of `namespace` until every name in `want` has been seen `Ready=True`.
pub async fn await_ready(client: &kube::Client, namespace: &str, mut want: std::collections::HashSet<String>, limit: std::time::Duration) -> anyhow::Result<()> {
    use futures::{StreamExt, TryStreamExt};
    use kube::runtime::{watcher, WatchStreamExt};
    let api: kube::Api<banlieue_api::VirtualMachine> = kube::Api::namespaced(client.clone(), namespace);
    let mut events = watcher(api, watcher::Config::default()).default_backoff().applied_objects().boxed();
    let ready = |vm: &banlieue_api::VirtualMachine| vm.status.as_ref().is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    tokio::time::timeout(limit, async {
        while !want.is_empty() {
            let Some(vm) = events.try_next().await? else { anyhow::bail!("watch ended") };
            if ready(&vm) {
                want.remove(vm.metadata.name.as_deref().unwrap_or_default());
            }
        }
        Ok(())
    })
    .await
    .map_err(|_| anyhow::anyhow!("{} VMs still not Ready after {limit:?}", want.len()))?
}

/// What the libvirt benches start from: ProviderClass `libvirt` (the built-in driver),
/// VMClass `small` (1 CPU, 512 MiB, a 4 GiB `standard` disk, a `default` NIC) and VMImage
/// `debian`; each bench adds its Providers.
pub fn libvirt_objects() -> Vec<serde_json::Value> {
    use serde_json::json;
    vec![
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "ProviderClass", "metadata": {"name": "libvirt"},
               "spec": {"component": {"source": "builtin:provider-libvirt"}, "infrastructureKind": "Libvirt", "capabilities": {"libvirt": true}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": "small"},
               "spec": {"cpus": 1, "memoryMiB": 512, "disks": [{"name": "root", "sizeGiB": 4, "storageClass": "standard"}],
                        "nics": [{"name": "eth0", "networkClass": "default"}]}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": "debian"},
               "spec": {"sources": [{"providerClass": "libvirt", "backingFile": "/images/debian.qcow2"}]}}),
    ]
}
