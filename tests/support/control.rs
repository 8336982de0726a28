//! The control plane in a test: banlieue's roles running in-process against the
//! test's API (embedded, or the external cluster — then scoped to the test's
//! namespace), with the built-in components from `guests/dist`.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use banlieue_controller::{CarryDownloads, Context, ImageCacheOptions, Options, Role, Roles};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use kube::runtime::wait::{await_condition, Condition};

use crate::{within, TestEnv};

/// Repository root (tests run from `tests/`).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("repo root").to_path_buf()
}

/// `PATH` with this workspace's binaries first (the tests run from `target/<profile>/deps`),
/// so kubectl finds the `kubectl-vm` plugin built with them.
pub fn path_with_workspace_binaries() -> String {
    let exe = std::env::current_exe().expect("test executable");
    let bins = exe.parent().and_then(|deps| deps.parent()).expect("target dir");
    format!("{}:{}", bins.display(), std::env::var("PATH").unwrap_or_default())
}

pub use banlieue_test_backends::guests_dist;

/// A VirtualMachine condition's (status, reason, message).
pub type Cond = (String, String, String);

/// The VM's condition `type_`, if it has one.
pub fn condition(vm: Option<&banlieue_api::VirtualMachine>, type_: &str) -> Option<Cond> {
    let c = vm?.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Whether the VM is Ready.
pub fn is_ready(vm: Option<&banlieue_api::VirtualMachine>) -> bool {
    condition(vm, "Ready").is_some_and(|(s, _, _)| s == "True")
}

/// Whether the VM is Ready and observed in power state `state`.
pub fn is_powered(state: banlieue_api::common::PowerState) -> impl Fn(Option<&banlieue_api::VirtualMachine>) -> bool {
    move |vm| is_ready(vm) && vm.and_then(|v| v.status.as_ref()?.observed_power_state) == Some(state)
}

/// `kubectl vm ARGS…` through kubectl's plugin lookup: (exit code, stdout, stderr).
pub async fn kubectl_vm(env: &TestEnv, args: &[&str]) -> anyhow::Result<(i32, String, String)> {
    let path = path_with_workspace_binaries();
    let plugin = std::path::Path::new(path.split(':').next().unwrap_or_default()).join("kubectl-vm");
    anyhow::ensure!(plugin.exists(), "{} is not built: cargo build -p kubectl-vm", plugin.display());
    let mut full = vec!["vm"];
    full.extend_from_slice(args);
    let out = env.kubectl_raw(&full, None, &[("PATH", &path)]).await?;
    Ok((out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned()))
}

/// A running set of roles; dropped or [`kill`](Self::kill)ed like a killed process.
pub struct ControlPlane {
    /// The context of the process running the provider role (whose libvirt
    /// connections hold the `test:///` drivers' state).
    pub ctx: Arc<Context>,
    /// Every process's context, by role, when each role runs as its own process.
    pub roles: Vec<(Role, Arc<Context>)>,
    tasks: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl ControlPlane {
    /// Start every role against `env`.
    pub fn start(env: &TestEnv) -> anyhow::Result<ControlPlane> {
        Self::start_with(env, |_| {})
    }

    /// Start every role with options adjusted by `adjust`.
    pub fn start_with(env: &TestEnv, adjust: impl FnOnce(&mut Options)) -> anyhow::Result<ControlPlane> {
        let mut options = test_options(env)?;
        adjust(&mut options);
        let ctx = Context::new(env.client.clone(), options)?;
        let task = tokio::spawn(banlieue_controller::run(ctx.clone(), Roles::ALL, std::future::pending()));
        Ok(ControlPlane { ctx, roles: vec![], tasks: vec![task] })
    }

    /// Start each role as its own "process", authenticated as the role's ServiceAccount
    /// (the client impersonates `system:serviceaccount:banlieue-system:banlieue-<role>`),
    /// with leader election on, as the Deployments in `deploy/` run them.
    pub async fn start_as_service_accounts(env: &TestEnv) -> anyhow::Result<ControlPlane> {
        Self::start_as_service_accounts_with(env, |_, _| {}).await
    }

    /// The same, with each role's options adjusted by `adjust`.
    pub async fn start_as_service_accounts_with(env: &TestEnv, adjust: impl Fn(Role, &mut Options)) -> anyhow::Result<ControlPlane> {
        let mut roles = Vec::new();
        let mut tasks = Vec::new();
        for role in Role::ALL {
            let kubeconfig = kube::config::Kubeconfig::read_from(&env.kubeconfig)?;
            let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
            config.auth_info.impersonate = Some(role.user());
            let mut options = Options { leader_election: true, ..test_options(env)? };
            adjust(role, &mut options);
            let ctx = Context::new(kube::Client::try_from(config)?, options)?;
            let only = Roles {
                controller: role == Role::Controller,
                provider: role == Role::Provider,
                operator: role == Role::Operator,
                imagebuilder: role == Role::ImageBuilder,
            };
            tasks.push(tokio::spawn(banlieue_controller::run(ctx.clone(), only, std::future::pending())));
            roles.push((role, ctx));
        }
        let ctx = roles.iter().find(|(r, _)| *r == Role::Provider).map(|(_, c)| c.clone()).context("provider role")?;
        Ok(ControlPlane { ctx, roles, tasks })
    }

    /// The roles as an install runs them: on the embedded server each as its ServiceAccount
    /// with only `deploy/base/rbac.yaml` (applied here, with namespace `banlieue-system`); on an
    /// external cluster all in this process, scoped to the test's namespace.
    pub async fn start_as_installed(env: &TestEnv) -> anyhow::Result<ControlPlane> {
        Self::start_as_installed_with(env, |_| {}).await
    }

    /// The same, with every role's options adjusted by `adjust`.
    pub async fn start_as_installed_with(env: &TestEnv, adjust: impl Fn(&mut Options)) -> anyhow::Result<ControlPlane> {
        // Leases live there (a fresh real cluster has no such namespace: no shard was ever taken).
        env.create_namespace(crate::SYSTEM_NAMESPACE).await?;
        if env.embedded().is_none() {
            return Self::start_with(env, adjust);
        }
        let rbac = repo_root().join("deploy/base/rbac.yaml");
        env.kubectl(&["apply", "--server-side", "--field-manager=banlieue-install", "-f", &rbac.to_string_lossy()]).await?;
        Self::start_as_service_accounts_with(env, |_, o| adjust(o)).await
    }

    /// Whether every role found all its permissions (always true in one process).
    pub fn permissions_complete(&self) -> Result<(), String> {
        for (role, ctx) in &self.roles {
            ctx.readiness.report().map_err(|e| format!("{role:?}: {e}"))?;
        }
        Ok(())
    }

    /// Stop at once, wherever the roles are (as if the process were killed).
    pub fn kill(self) {
        self.tasks.iter().for_each(|t| t.abort());
    }

    /// [`kill`](Self::kill), and return once every role has stopped.
    pub async fn kill_and_wait(&mut self) {
        self.tasks.iter().for_each(|t| t.abort());
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
    }
}

/// Options for roles in tests: built-in components from `guests/dist`, `file://` sources
/// from `<test dir>/components`, a cache in the test's directory, no leader election, the
/// test's namespace on an external cluster.
fn test_options(env: &TestEnv) -> anyhow::Result<Options> {
    let dist = guests_dist();
    anyhow::ensure!(dist.join("provider-libvirt.wasm").exists(), "{} has no provider-libvirt.wasm: run guests/build.sh", dist.display());
    Ok(Options {
        builtin_dir: dist,
        component_dir: Some(component_dir(env)),
        cache_dir: Some(env.dir().join("component-cache")),
        // Test servers for images listen on 127.0.0.1 over plain http.
        image_cache: Some(ImageCacheOptions { dir: env.dir().join("image-cache"), limit_bytes: 8 << 30, schemes: vec!["http".into(), "https".into()] }),
        // Carried disks for fakepve's download-url, on a port of its own.
        carry_downloads: Some(CarryDownloads { listen: "127.0.0.1:0".parse()?, url: None, ttl: std::time::Duration::from_secs(60) }),
        // Consoles, on a port of their own, with the browser page when it was built.
        consoles: Some(banlieue_controller::ConsoleOptions {
            listen: "127.0.0.1:0".parse()?,
            url: None,
            tls: None,
            limits: banlieue_controller::SessionLimits::default(),
            page_dir: Some(repo_root().join("target/console-page")).filter(|d| d.join("index.html").exists()),
        }),
        leader_election: false,
        namespace: TestEnv::external().then(|| env.ns.clone()),
        installation: env.installation(),
        ..Options::default()
    })
}

/// The directory `file://` component sources may name in a test (created).
pub fn component_dir(env: &TestEnv) -> PathBuf {
    let dir = env.dir().join("components");
    let _ = std::fs::create_dir_all(&dir);
    dir
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.tasks.iter().for_each(|t| t.abort());
    }
}

/// Server-side apply a JSON object (any kind) as the test's field manager.
pub async fn apply(client: &kube::Client, object: serde_json::Value) -> anyhow::Result<()> {
    let api_version = object["apiVersion"].as_str().context("apiVersion")?.to_string();
    let kind = object["kind"].as_str().context("kind")?.to_string();
    let (group, version) = api_version.split_once('/').unwrap_or(("", &api_version));
    let plural = match kind.as_str() {
        "ProviderClass" => "providerclasses".to_string(),
        "PlacementPolicy" => "placementpolicies".to_string(),
        "VMClass" => "vmclasses".to_string(),
        "VMImage" => "vmimages".to_string(),
        k => format!("{}s", k.to_ascii_lowercase()),
    };
    let resource = ApiResource::from_gvk_with_plural(&kube::api::GroupVersionKind::gvk(group, version, &kind), &plural);
    let name = object["metadata"]["name"].as_str().context("name")?.to_string();
    let api: Api<DynamicObject> = match object["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    api.patch(&name, &PatchParams::apply("banlieue-tests").force(), &Patch::Apply(&object))
        .await
        .with_context(|| format!("applying {kind} {name}"))?;
    Ok(())
}

/// Wait (by watch, at most `secs`) until `cond` holds for object `name`.
pub async fn wait_for<K>(api: &Api<K>, name: &str, secs: u64, what: &str, cond: impl Condition<K>) -> anyhow::Result<K>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    match within(secs, await_condition(api.clone(), name, cond)).await {
        Ok(Ok(Some(obj))) => Ok(obj),
        Ok(Ok(None)) => anyhow::bail!("{name} is gone while waiting for {what}"),
        Ok(Err(e)) => Err(e.into()),
        Err(_) => {
            let now = api.get_opt(name).await.ok().flatten();
            anyhow::bail!("{name}: {what} not reached within {secs}s; last seen: {now:#?}")
        }
    }
}

/// The cloud-init network-config the libvirt driver put in a test-driver domain's metadata
/// (where a booting guest's seed would carry it).
pub fn network_config(domain_xml: &str) -> anyhow::Result<serde_json::Value> {
    use base64::Engine as _;
    let encoded = domain_xml
        .split("<banlieue:network-config")
        .nth(1)
        .and_then(|r| r.split_once('>'))
        .and_then(|(_, r)| r.split('<').next())
        .ok_or_else(|| anyhow::anyhow!("no network-config in the domain: {domain_xml}"))?;
    Ok(serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(encoded)?)?)
}

/// A libvirt "host" of our own for the test driver: a node description with `cpus`, `memory_gib`,
/// network `default` and pool `default-pool` of `pool_gib`. Returns its `test://` URI.
pub fn libvirt_test_node(dir: &std::path::Path, name: &str, cpus: u32, memory_gib: u64, pool_gib: u64) -> anyhow::Result<String> {
    let path = dir.join(format!("{name}.xml"));
    std::fs::write(
        &path,
        format!(
            r#"<node>
  <cpu><mhz>2000</mhz><model>x86_64</model><active>{cpus}</active><sockets>1</sockets><cores>{cpus}</cores><threads>1</threads><nodes>1</nodes></cpu>
  <memory>{memory_kib}</memory>
  <network><name>default</name><uuid>dd8fe884-6c02-601e-7551-cca97df1c5df</uuid><bridge name='virbr0'/><forward/>
    <ip address='192.168.123.1' netmask='255.255.255.0'/></network>
  <pool type='dir'><name>default-pool</name><uuid>dfe224cb-28fb-8dd0-c4b2-64eb3f0f4566</uuid>
    <capacity unit='GiB'>{pool_gib}</capacity><allocation>0</allocation><available unit='GiB'>{pool_gib}</available>
    <target><path>/default-pool</path></target></pool>
</node>"#,
            memory_kib = memory_gib * 1024 * 1024
        ),
    )?;
    Ok(format!("test://{}", path.display()))
}

/// What most control-loop tests start from: ProviderClass `libvirt` (the built-in
/// driver), VMClass `<ns>-small`, VMImage `<ns>-debian` and a Provider per
/// `(name, libvirt URI)` in the test's namespace.
pub async fn libvirt_fixtures(env: &TestEnv, providers: &[(&str, &str)]) -> anyhow::Result<()> {
    let ns = &env.ns;
    let mut objects = vec![
        serde_json::json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "ProviderClass", "metadata": {"name": env.libvirt_class()},
               "spec": {"component": {"source": "builtin:provider-libvirt"}, "infrastructureKind": "Libvirt", "capabilities": {"libvirt": true}}}),
        serde_json::json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": format!("{ns}-small")},
               "spec": {"cpus": 1, "memoryMiB": 256, "disks": [{"name": "root", "sizeGiB": 1, "storageClass": "standard"}],
                        "nics": [{"name": "eth0", "networkClass": "default"}]}}),
        serde_json::json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": format!("{ns}-debian")},
               "spec": {"sources": [{"providerClass": env.libvirt_class(), "backingFile": "/var/lib/images/debian.qcow2"}]}}),
    ];
    for (name, uri) in providers {
        objects.push(serde_json::json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": name, "namespace": ns},
               "spec": {"providerClassRef": {"name": env.libvirt_class()}, "connection": {"endpoint": uri},
                        "capabilities": {"storageClasses": {"standard": "default-pool"}, "networkClasses": {"default": "default"}},
                        // libvirt's test driver needs no protection (tests of the throttle use libvirtd).
                        "limits": {"maxConcurrentOperations": 1000, "operationsPerSecond": 10000}}}));
    }
    for object in objects {
        env.apply(object).await?;
    }
    Ok(())
}
