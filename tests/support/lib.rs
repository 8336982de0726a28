//! What every end-to-end test needs: a Kubernetes API to talk to (the embedded
//! server, or any cluster named by `BANLIEUE_TEST_KUBECONFIG`), a namespace of its
//! own, kubectl wired to it, and bounded waits.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::Client;

pub mod apiserver;
pub mod backends;
pub mod bench;
pub mod bootstrap;
pub mod browser;
pub mod conformance;
pub mod control;
pub mod faults;
pub mod files;
pub mod ipam;
pub mod otlp;

/// banlieue's own namespace (Leases).
pub const SYSTEM_NAMESPACE: &str = banlieue_controller::SYSTEM_NAMESPACE;

/// A driver component built for `banlieue:provider@0.1.0` (WAT): a contract this host no
/// longer implements.
pub const DRIVER_0_1: &str = r#"(component
  (core module $m (func (export "v")))
  (core instance $i (instantiate $m))
  (func $v (canon lift (core func $i "v")))
  (instance $driver (export "contract-version" (func $v)))
  (export "banlieue:provider/driver@0.1.0" (instance $driver)))"#;

/// Events kept by the embedded server in tests (small, so `410 Gone` is reachable).
pub const TEST_WATCH_HISTORY: usize = 200;

/// A Kubernetes API for one test.
pub struct TestEnv {
    pub client: Client,
    pub kubeconfig: PathBuf,
    /// A namespace created for this test (deleted when the test ends on a real cluster).
    pub ns: String,
    /// A banlieue installation name of this test's own (`banlieue.io/instance`). On a shared
    /// cluster the test's control planes are that installation ([`TestEnv::installation`]):
    /// they act only on objects carrying it, so tests never act on each other's
    /// cluster-scoped objects; [`TestEnv::apply`] labels what a test applies.
    pub instance: String,
    server: Option<banlieue_apiserver::ApiServer>,
    dir: tempfile::TempDir,
}

impl TestEnv {
    /// Whether tests run against an external cluster.
    pub fn external() -> bool {
        std::env::var_os("BANLIEUE_TEST_KUBECONFIG").is_some()
    }

    /// Start an embedded server (or connect to the external cluster) and create a namespace.
    pub async fn start(test: &str) -> anyhow::Result<TestEnv> {
        Self::start_with(test, None).await
    }

    /// Like [`start`](Self::start), with the embedded server persisting in `data_dir`.
    pub async fn start_with(test: &str, data_dir: Option<&Path>) -> anyhow::Result<TestEnv> {
        let _ = tracing_init();
        let dir = tempfile::tempdir()?;
        let (kubeconfig, server) = match std::env::var_os("BANLIEUE_TEST_KUBECONFIG") {
            Some(path) => (PathBuf::from(path), None),
            None => {
                let server = banlieue_apiserver::ApiServer::start(banlieue_apiserver::Config {
                    data_dir: data_dir.map(Path::to_path_buf),
                    watch_history: TEST_WATCH_HISTORY,
                    bookmark_interval: Duration::from_millis(500),
                    ..Default::default()
                })
                .await?;
                let path = dir.path().join("kubeconfig");
                server.write_kubeconfig(&path)?;
                (path, Some(server))
            }
        };
        let client = match server {
            Some(_) => client_for(&kubeconfig).await?,
            None => answering(&kubeconfig).await?,
        };
        let (ns, instance) = names(test);
        let env = TestEnv { client, kubeconfig, ns, instance, server, dir };
        env.create_namespace(&env.ns).await?;
        Ok(env)
    }

    /// A test on the server of `kubeconfig` (one the test started itself, such as an
    /// [`apiserver::ApiServerProcess`]), with a namespace of its own.
    pub async fn connect(test: &str, kubeconfig: &Path) -> anyhow::Result<TestEnv> {
        let _ = tracing_init();
        let client = client_for(kubeconfig).await?;
        let (ns, instance) = names(test);
        let env = TestEnv { client, kubeconfig: kubeconfig.to_path_buf(), ns, instance, server: None, dir: tempfile::tempdir()? };
        env.create_namespace(&env.ns).await?;
        Ok(env)
    }

    /// The installation of this test's control planes: its own on a shared cluster; on
    /// its own embedded server, the default one (as installed from `deploy/`, whose RBAC
    /// names the default installation's Leases: the suites that run the roles as their
    /// ServiceAccounts depend on it). `tests/installations.rs` runs named ones on both.
    pub fn installation(&self) -> banlieue_controller::Installation {
        let name = Self::external().then_some(self.instance.as_str());
        banlieue_controller::Installation::new(name).expect("test instance names are valid")
    }

    /// `object` labelled as belonging to this test's installation (unchanged for the default one).
    pub fn own(&self, mut object: serde_json::Value) -> serde_json::Value {
        if let Some(instance) = self.installation().instance() {
            object["metadata"]["labels"][banlieue_api::INSTANCE_LABEL] = serde_json::Value::String(instance.to_string());
        }
        object
    }

    /// Server-side apply `object` as this test's, labelled for its installation.
    pub async fn apply(&self, object: serde_json::Value) -> anyhow::Result<()> {
        control::apply(&self.client, self.own(object)).await
    }

    /// The name of this test's ProviderClass for the built-in libvirt driver (cluster-scoped
    /// names are shared by every test on a cluster; each test's installation has its own).
    pub fn libvirt_class(&self) -> String {
        format!("{}-libvirt", self.ns)
    }

    pub async fn create_namespace(&self, name: &str) -> anyhow::Result<()> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name, "labels": {"banlieue.io/test": "true"}}}))?;
        match api.create(&PostParams::default(), &ns).await {
            // banlieue's own namespace may be there already on a shared cluster.
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            other => other.map(|_| ()).with_context(|| format!("creating namespace {name}")),
        }
    }

    /// The server's Kubernetes minor version (`1.<minor>`; the embedded server says 1.34).
    pub async fn server_minor(&self) -> anyhow::Result<u32> {
        let info = self.client.apiserver_version().await?;
        let digits: String = info.minor.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().with_context(|| format!("server minor version {:?}", info.minor))
    }

    /// Whether the server is older than Kubernetes 1.`minor`, which `feature` needs; a test
    /// (or the part of one) that needs it says so and skips on such a server.
    pub async fn older_than(&self, minor: u32, feature: &str) -> anyhow::Result<bool> {
        let server = self.server_minor().await?;
        if server < minor {
            eprintln!("skipped: {feature} needs Kubernetes 1.{minor} or newer; the server is 1.{server}");
            return Ok(true);
        }
        Ok(false)
    }

    /// The embedded server's URL and token (raw HTTP tests), if embedded.
    pub fn embedded(&self) -> Option<&banlieue_apiserver::ApiServer> {
        self.server.as_ref()
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Install banlieue's CRDs (server-side apply) and wait until they are established.
    pub async fn install_crds(&self) -> anyhow::Result<()> {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        let api: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        let pp = PatchParams::apply("banlieue-tests").force();
        let crds = banlieue_api::crdgen::all_crds();
        for crd in &crds {
            api.patch(crd.metadata.name.as_deref().unwrap_or_default(), &pp, &Patch::Apply(crd)).await?;
        }
        for crd in &crds {
            let name = crd.metadata.name.clone().unwrap_or_default();
            within(30, kube::runtime::wait::await_condition(api.clone(), &name, kube::runtime::wait::conditions::is_crd_established())).await??;
        }
        Ok(())
    }

    /// Run kubectl against this environment; fails on a non-zero exit.
    pub async fn kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self.kubectl_raw(args, None, &[]).await?;
        if !out.status.success() {
            bail!("kubectl {} failed: {}{}", args.join(" "), String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Run kubectl with optional stdin and extra environment, returning the whole output.
    pub async fn kubectl_raw(&self, args: &[&str], stdin: Option<&str>, env: &[(&str, &str)]) -> anyhow::Result<Output> {
        let mut cmd = self.kubectl_command(args, env);
        cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
        let mut child = cmd.spawn().context("running kubectl (is it installed?)")?;
        if let Some(input) = stdin {
            use tokio::io::AsyncWriteExt;
            let mut i = child.stdin.take().context("stdin")?;
            i.write_all(input.as_bytes()).await?;
        }
        match tokio::time::timeout(Duration::from_secs(90), child.wait_with_output()).await {
            Ok(out) => Ok(out?),
            Err(_) => bail!("kubectl {} did not finish within 90s", args.join(" ")),
        }
    }

    /// A kubectl command wired to this environment (stdout/stderr piped, killed on drop).
    pub fn kubectl_command(&self, args: &[&str], env: &[(&str, &str)]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new("kubectl");
        cmd.args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", self.dir.path())
            .env("KUBECACHEDIR", self.dir.path().join("kube-cache"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd
    }

    /// Stop the embedded server (persistence tests) and hand back the data for a restart.
    pub async fn stop_server(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown().await;
        }
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        // On a shared cluster, leave nothing behind: the test's control plane is gone, so
        // drop the finalizers it would have removed (or the namespace stays Terminating),
        // then delete the namespace and the cluster-scoped objects named after it.
        // (scripts/test-cluster.sh removes what tests share, such as CRDs, after a run.)
        if self.server.is_none() && std::env::var_os("BANLIEUE_TEST_KUBECONFIG").is_some_and(|k| Path::new(&k) == self.kubeconfig) {
            let kubectl = |args: &[&str]| {
                Command::new("kubectl").args(args).env("KUBECONFIG", &self.kubeconfig).stdin(Stdio::null()).output().ok().filter(|o| o.status.success())
            };
            let names = |out: Option<Output>| -> Vec<String> {
                out.map(|o| String::from_utf8_lossy(&o.stdout).lines().map(String::from).collect()).unwrap_or_default()
            };
            // The namespaced kinds only: `get banlieue -n NS` lists the category's
            // cluster-scoped kinds cluster-wide, which stripped the finalizers of the
            // other tests' VMImages running beside this one. (Secrets too: a Provider's
            // credentials carry its in-use finalizer.)
            let namespaced = names(kubectl(&["api-resources", "--namespaced=true", "--categories=banlieue", "-o", "name"]));
            let namespaced = namespaced.into_iter().chain(["secrets".to_string()]).collect::<Vec<_>>().join(",");
            for object in names(kubectl(&["get", &namespaced, "-n", &self.ns, "-o", "name"])) {
                kubectl(&["patch", "-n", &self.ns, &object, "--type=merge", "-p", r#"{"metadata":{"finalizers":null}}"#]);
            }
            kubectl(&["delete", "namespace", &self.ns, "--wait=false", "--ignore-not-found"]);
            // The test's: labelled for its installation, or (the default installation's) named after its namespace.
            let kinds = "vmclasses,vmimages,providerclasses,placementpolicies";
            let mine = format!("{}={}", banlieue_api::INSTANCE_LABEL, self.instance);
            let prefix = format!("/{}-", self.ns);
            let labelled = names(kubectl(&["get", kinds, "-l", &mine, "-o", "name"]));
            let named = names(kubectl(&["get", kinds, "-o", "name"])).into_iter().filter(|o| o.contains(&prefix));
            for object in labelled.into_iter().chain(named) {
                kubectl(&["patch", &object, "--type=merge", "-p", r#"{"metadata":{"finalizers":null}}"#]);
                kubectl(&["delete", &object, "--wait=false", "--ignore-not-found"]);
            }
        }
    }
}

/// A client for the cluster of `BANLIEUE_TEST_KUBECONFIG`, once it answers: one that does
/// not fails the test at once, naming it, not after the test's own timeouts.
pub async fn answering(kubeconfig: &Path) -> anyhow::Result<Client> {
    let client = client_for(kubeconfig).await.with_context(|| format!("BANLIEUE_TEST_KUBECONFIG={}: not a usable kubeconfig", kubeconfig.display()))?;
    let server = kube::config::Kubeconfig::read_from(kubeconfig)
        .ok()
        .and_then(|k| k.clusters.first().and_then(|c| c.cluster.as_ref()?.server.clone()))
        .unwrap_or_default();
    match tokio::time::timeout(Duration::from_secs(10), client.apiserver_version()).await {
        Ok(Ok(_)) => Ok(client),
        Ok(Err(e)) => bail!("BANLIEUE_TEST_KUBECONFIG={}: the cluster at {server} does not answer: {e}", kubeconfig.display()),
        Err(_) => bail!("BANLIEUE_TEST_KUBECONFIG={}: the cluster at {server} did not answer within 10 s", kubeconfig.display()),
    }
}

/// A kubeconfig file `dir/file` naming a cluster on a free loopback port nothing serves;
/// with that port.
pub fn unreachable_kubeconfig(dir: &Path, file: &str) -> anyhow::Result<(PathBuf, u16)> {
    let port = banlieue_test_backends::free_port();
    let path = dir.join(file);
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: gone, cluster: {{server: \"https://127.0.0.1:{port}\", insecure-skip-tls-verify: true}}}}]\n\
             users: [{{name: u, user: {{token: t}}}}]\ncontexts: [{{name: c, context: {{cluster: gone, user: u}}}}]\ncurrent-context: c\n"
        ),
    )?;
    Ok((path, port))
}

/// A client for a kubeconfig file.
pub async fn client_for(path: &Path) -> anyhow::Result<Client> {
    let kc = kube::config::Kubeconfig::read_from(path)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    Ok(Client::try_from(cfg)?)
}

/// Await a future for at most `secs` seconds.
pub async fn within<F: std::future::Future>(secs: u64, f: F) -> anyhow::Result<F::Output> {
    tokio::time::timeout(Duration::from_secs(secs), f).await.map_err(|_| anyhow::anyhow!("timed out after {secs}s"))
}

/// Wait (through a watch, bounded) until an object is gone.
pub async fn await_deleted<K>(api: &Api<K>, name: &str) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let api = api.clone();
    let name = name.to_string();
    within(60, async move {
        if api.get_opt(&name).await?.is_none() {
            return Ok::<_, anyhow::Error>(());
        }
        let mut s = watcher(api.clone(), cfg).boxed();
        while let Some(ev) = s.try_next().await? {
            if let watcher::Event::Delete(_) = ev {
                return Ok(());
            }
            if let watcher::Event::InitDone = ev {
                if api.get_opt(&name).await?.is_none() {
                    return Ok(());
                }
            }
        }
        bail!("watch ended")
    })
    .await?
}

/// Delete and wait until gone.
pub async fn delete_and_wait<K>(api: &Api<K>, name: &str) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let _ = api.delete(name, &DeleteParams::default()).await;
    await_deleted(api, name).await
}

/// A test's namespace and installation names, unique on a shared cluster.
fn names(test: &str) -> (String, String) {
    let suffix = uuid_suffix();
    (format!("{}-{suffix}", test.replace('_', "-")), format!("test-{suffix}"))
}

fn uuid_suffix() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    format!("{:05x}{}", nanos & 0xfffff, N.fetch_add(1, Ordering::Relaxed))
}

/// Logs of the roles a test runs in-process, when `RUST_LOG` asks for them.
fn tracing_init() -> Result<(), ()> {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).with_test_writer().try_init();
    }
    Ok(())
}

/// What this thread logs at `filter`, kept in memory for a failure message. The roles a
/// test runs in-process are tasks of its current-thread runtime, so they log here; other
/// tests of the binary (other threads) do not.
pub struct ThreadLogs {
    buffer: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    _default: Box<dyn std::any::Any>,
}

impl ThreadLogs {
    pub fn capture(filter: &str) -> ThreadLogs {
        use tracing_subscriber::util::SubscriberInitExt;
        let buffer = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(move || LogSink(sink.clone()))
            .with_ansi(false)
            .finish();
        ThreadLogs { buffer, _default: Box::new(subscriber.set_default()) }
    }

    /// The last `n` lines that contain `needle`.
    pub fn last_with(&self, needle: &str, n: usize) -> String {
        let all = String::from_utf8_lossy(&self.buffer.lock().unwrap_or_else(|e| e.into_inner())).into_owned();
        let lines: Vec<&str> = all.lines().filter(|l| l.contains(needle)).collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

struct LogSink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Collect a watch stream's events until `pred` holds, within `secs` seconds.
pub async fn watch_until<S, T>(stream: S, secs: u64, mut pred: impl FnMut(&[T]) -> bool) -> anyhow::Result<Vec<T>>
where
    S: futures::Stream<Item = Result<T, kube::Error>> + Unpin,
{
    let mut seen = Vec::new();
    let mut stream = stream;
    within(secs, async {
        while let Some(ev) = stream.next().await {
            seen.push(ev?);
            if pred(&seen) {
                return Ok::<_, anyhow::Error>(());
            }
        }
        bail!("stream ended")
    })
    .await??;
    Ok(seen)
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn an_unreachable_test_cluster_fails_at_once_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let (path, port) = super::unreachable_kubeconfig(dir.path(), "gone.kubeconfig").unwrap();
        let started = std::time::Instant::now();
        let err = super::answering(&path).await.err().expect("refused").to_string();
        assert!(err.contains("gone.kubeconfig") && err.contains(&format!("127.0.0.1:{port}")), "{err}");
        assert!(started.elapsed() < std::time::Duration::from_secs(12), "named at once: {:?}", started.elapsed());
    }
}
