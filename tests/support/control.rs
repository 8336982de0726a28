//! The control plane in a test: banlieue's roles running in-process against the
//! test's API (embedded, or the external cluster — then scoped to the test's
//! namespace), with the built-in components from `guests/dist`.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use banlieue_controller::{Context, Options, Roles};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use kube::runtime::wait::{await_condition, Condition};

use crate::{within, TestEnv};

/// Repository root (tests run from `tests/`).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("repo root").to_path_buf()
}

/// The directory of built guest components (`guests/build.sh` writes it).
pub fn guests_dist() -> PathBuf {
    repo_root().join("guests/dist")
}

/// A running set of roles; dropped or [`stop`](Self::stop)ped like a killed process.
pub struct ControlPlane {
    pub ctx: Arc<Context>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl ControlPlane {
    /// Start every role against `env`.
    pub fn start(env: &TestEnv) -> anyhow::Result<ControlPlane> {
        Self::start_with(env, |_| {})
    }

    /// Start every role with options adjusted by `adjust`.
    pub fn start_with(env: &TestEnv, adjust: impl FnOnce(&mut Options)) -> anyhow::Result<ControlPlane> {
        let dist = guests_dist();
        anyhow::ensure!(dist.join("provider-libvirt.wasm").exists(), "{} has no provider-libvirt.wasm: run guests/build.sh", dist.display());
        let mut options = Options {
            builtin_dir: dist,
            cache_dir: Some(env.dir().join("component-cache")),
            leader_election: false,
            namespace: TestEnv::external().then(|| env.ns.clone()),
            ..Options::default()
        };
        adjust(&mut options);
        let ctx = Context::new(env.client.clone(), options)?;
        let task = tokio::spawn(banlieue_controller::run(ctx.clone(), Roles::ALL, std::future::pending()));
        Ok(ControlPlane { ctx, task })
    }

    /// Stop at once, wherever the roles are (as if the process were killed).
    pub fn kill(self) {
        self.task.abort();
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.task.abort();
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
