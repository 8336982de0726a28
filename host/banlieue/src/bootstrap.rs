//! `banlieue bootstrap`: a management cluster's VMs made with no cluster to start from.
//!
//! A temporary control plane — the embedded API server (its objects kept in `--data-dir`)
//! and every role — runs on the operator's machine. It applies the objects of the config
//! file (Providers and their Secrets, classes, images, the management VirtualMachines),
//! waits until every VirtualMachine is Ready, then **moves** banlieue's objects into the
//! new cluster (`--target-kubeconfig`), as `clusterctl move` does: the roles stop first,
//! so nothing acts on the backends meanwhile; each object is copied with its status; each
//! infrastructure Machine carries `banlieue.io/backend-uid` (the UID its backend VM is
//! keyed by) and is copied paused, then un-paused once its VM owns it, so the new
//! cluster's banlieue adopts the VMs without touching them on the backend.
//!
//! Idempotent and resumable: objects are applied by server-side apply, the data directory
//! keeps the temporary cluster between runs (a rerun after an interruption continues with
//! the same Machines, so drivers find the VMs they made), and a finished move is recorded
//! in `<data-dir>/moved` (a rerun then does nothing).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use banlieue_api::VirtualMachine;
use banlieue_controller::{Context, Roles};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::{json, Value};

const FIELD_MANAGER: &str = "banlieue-bootstrap";
const MOVED: &str = "moved";

#[derive(clap::Args)]
pub struct BootstrapArgs {
    /// The objects to create (multi-document YAML): Providers and their Secrets, ProviderClasses,
    /// VMClasses, VMImages, user-data Secrets and the management VirtualMachines.
    #[arg(long)]
    config: PathBuf,
    /// Where the temporary control plane keeps its objects; a rerun resumes from it.
    #[arg(long, default_value = ".bootstrap")]
    data_dir: PathBuf,
    /// The new cluster; banlieue's objects are moved there once every VM is Ready. Without
    /// it, bootstrap stops once the VMs are Ready (rerun with it to move).
    #[arg(long)]
    target_kubeconfig: Option<PathBuf>,
    /// How long to wait for the VMs, in seconds.
    #[arg(long, default_value_t = 1800)]
    timeout: u64,
    #[command(flatten)]
    roles: crate::roles::RoleArgs,
}

/// One object of the config file.
struct Object {
    kind: String,
    name: String,
    namespace: Option<String>,
    value: Value,
}

fn read_config(path: &PathBuf) -> anyhow::Result<Vec<Object>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading the bootstrap config {}", path.display()))?;
    let mut objects = Vec::new();
    for (i, doc) in serde_yaml::Deserializer::from_str(&text).enumerate() {
        let value: Value = serde::Deserialize::deserialize(doc).with_context(|| format!("{}: document {}", path.display(), i + 1))?;
        if value.is_null() {
            continue;
        }
        let kind = value["kind"].as_str().unwrap_or_default().to_string();
        let name = value["metadata"]["name"].as_str().unwrap_or_default().to_string();
        if kind.is_empty() || name.is_empty() || value["apiVersion"].as_str().is_none() {
            bail!("{}: document {} has no apiVersion, kind or metadata.name", path.display(), i + 1);
        }
        let namespace = value["metadata"]["namespace"].as_str().map(str::to_string);
        objects.push(Object { kind, name, namespace, value });
    }
    Ok(objects)
}

/// Every VirtualMachine's class, image and Provider is in the file: said before anything is made.
fn check_config(objects: &[Object]) -> anyhow::Result<()> {
    let has = |kind: &str, name: &str, ns: Option<&str>| objects.iter().any(|o| o.kind == kind && o.name == name && (ns.is_none() || o.namespace.as_deref() == ns));
    let vms: Vec<&Object> = objects.iter().filter(|o| o.kind == "VirtualMachine").collect();
    if vms.is_empty() {
        bail!("the bootstrap config has no VirtualMachine");
    }
    for vm in vms {
        let spec = &vm.value["spec"];
        let ns = vm.namespace.as_deref().unwrap_or("default");
        let class = spec["classRef"]["name"].as_str().unwrap_or_default();
        let image = spec["imageRef"]["name"].as_str().unwrap_or_default();
        let provider = spec["placement"]["providerRef"]["name"].as_str().unwrap_or_default();
        if !has("VMClass", class, None) {
            bail!("VirtualMachine {ns}/{} names VMClass {class:?}, which the config does not define", vm.name);
        }
        if !has("VMImage", image, None) {
            bail!("VirtualMachine {ns}/{} names VMImage {image:?}, which the config does not define", vm.name);
        }
        if provider.is_empty() || !has("Provider", provider, Some(ns)) {
            bail!("VirtualMachine {ns}/{} must name a Provider of namespace {ns} the config defines (placement.providerRef), not {provider:?}", vm.name);
        }
    }
    Ok(())
}

pub async fn run(args: BootstrapArgs) -> anyhow::Result<()> {
    let began = Instant::now();
    let objects = read_config(&args.config)?;
    check_config(&objects)?;
    std::fs::create_dir_all(&args.data_dir)?;
    let marker = args.data_dir.join(MOVED);
    if marker.exists() {
        println!("already moved ({}): nothing to do", std::fs::read_to_string(&marker).unwrap_or_default().trim());
        return Ok(());
    }
    // The temporary cluster, kept in the data directory so a rerun resumes.
    let server = banlieue_apiserver::ApiServer::start(banlieue_apiserver::Config { data_dir: Some(args.data_dir.join("apiserver")), ..Default::default() })
        .await
        .context("starting the temporary API server")?;
    // For the operator to look at the temporary cluster with kubectl while it works.
    server.write_kubeconfig(&args.data_dir.join("kubeconfig"))?;
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&server.kubeconfig)?;
    let source = kube::Client::try_from(kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?)?;
    crate::crds::install(&source).await?;

    // Components and images (a URL source) are cached beside the temporary cluster.
    let options = args.roles.one_process_options(&args.data_dir)?;
    let ctx = Context::new(source.clone(), options)?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let roles = tokio::spawn(banlieue_controller::run(ctx, Roles::ALL, async {
        let _ = stop_rx.await;
    }));
    // Applied to the running control plane (a rerun re-applies what is there already).
    for ns in namespaces(&objects) {
        crate::dev::apply(&source, json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})).await?;
    }
    for o in &objects {
        crate::dev::apply(&source, o.value.clone()).await?;
    }
    println!("phase create: {} objects applied to the temporary control plane at {} in {:.1}s", objects.len(), server.url, began.elapsed().as_secs_f64());

    let vms: Vec<(String, String)> = objects
        .iter()
        .filter(|o| o.kind == "VirtualMachine")
        .map(|o| (o.namespace.clone().unwrap_or_else(|| "default".into()), o.name.clone()))
        .collect();
    let started = Instant::now();
    wait_ready(&source, &vms, Duration::from_secs(args.timeout)).await?;
    println!("phase wait: {} VirtualMachines Ready in {:.1}s", vms.len(), started.elapsed().as_secs_f64());

    // Nothing acts on the backends from here: the roles stop before anything moves.
    let started = Instant::now();
    let _ = stop_tx.send(());
    let abort = roles.abort_handle();
    if tokio::time::timeout(Duration::from_secs(30), roles).await.is_err() {
        // A call still in flight after 30 s is cut off: nothing may act during the move.
        abort.abort();
    }
    println!("phase stop: the temporary control plane's roles stopped in {:.1}s", started.elapsed().as_secs_f64());
    let Some(target_kubeconfig) = &args.target_kubeconfig else {
        println!("the VMs are Ready; rerun with --target-kubeconfig to move banlieue's objects into the new cluster");
        server.shutdown().await;
        return Ok(());
    };
    let started = Instant::now();
    let target = target_client(target_kubeconfig).await?;
    let moved = move_objects(&source, &target, &namespaces(&objects)).await?;
    std::fs::write(&marker, format!("{moved} objects to the cluster of {}\n", target_kubeconfig.display()))?;
    println!("phase move: {moved} objects moved in {:.1}s; the new cluster's banlieue owns the VMs", started.elapsed().as_secs_f64());
    server.shutdown().await;
    Ok(())
}

fn namespaces(objects: &[Object]) -> BTreeSet<String> {
    objects.iter().filter_map(|o| o.namespace.clone()).collect()
}

async fn target_client(path: &PathBuf) -> anyhow::Result<kube::Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path).with_context(|| format!("reading the target kubeconfig {}", path.display()))?;
    let client = kube::Client::try_from(kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?)?;
    // Unreachable: said before anything is moved.
    tokio::time::timeout(Duration::from_secs(15), client.apiserver_version())
        .await
        .map_err(|_| anyhow::anyhow!("the target cluster ({}) did not answer within 15s; nothing was moved", path.display()))?
        .with_context(|| format!("the target cluster ({}) cannot be reached; nothing was moved", path.display()))?;
    Ok(client)
}

/// Wait (by watch, at most `timeout`) until every VM is Ready, printing each as it becomes so.
async fn wait_ready(client: &kube::Client, vms: &[(String, String)], timeout: Duration) -> anyhow::Result<()> {
    use futures::StreamExt;
    use kube::runtime::{watcher, WatchStreamExt};
    let wanted: BTreeSet<(String, String)> = vms.iter().cloned().collect();
    let mut ready: BTreeSet<(String, String)> = BTreeSet::new();
    let mut last: BTreeMap<(String, String), String> = BTreeMap::new();
    let api: Api<VirtualMachine> = Api::all(client.clone());
    let mut stream = watcher(api, watcher::Config::default()).default_backoff().applied_objects().boxed();
    let deadline = tokio::time::Instant::now() + timeout;
    while ready != wanted {
        let next = tokio::time::timeout_at(deadline, stream.next()).await.map_err(|_| {
            let waiting: Vec<String> = wanted.difference(&ready).map(|(ns, n)| format!("{ns}/{n}: {}", last.get(&(ns.clone(), n.clone())).cloned().unwrap_or_default())).collect();
            anyhow::anyhow!("VirtualMachines not Ready within {}s: {}", timeout.as_secs(), waiting.join("; "))
        })?;
        let Some(Ok(vm)) = next else { continue };
        let key = (vm.namespace().unwrap_or_default(), vm.name_any());
        let conditions = vm.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
        let cond = conditions.iter().find(|c| c.type_ == "Ready").cloned();
        // What the VM says, for the operator to act on when it never gets there.
        let said: Vec<String> = conditions.iter().filter(|c| c.status != "True").map(|c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message)).collect();
        last.insert(key.clone(), if said.is_empty() { "no conditions yet".into() } else { said.join("; ") });
        if wanted.contains(&key) && cond.is_some_and(|c| c.status == "True") && ready.insert(key.clone()) {
            println!("  {}/{} Ready", key.0, key.1);
        }
    }
    Ok(())
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

/// The object as the target gets it: no server-set metadata; status sent apart.
fn portable(o: &DynamicObject) -> (Value, Option<Value>) {
    let mut v = serde_json::to_value(o).unwrap_or_default();
    let status = v.as_object_mut().and_then(|m| m.remove("status"));
    if let Some(meta) = v["metadata"].as_object_mut() {
        for k in ["uid", "resourceVersion", "creationTimestamp", "managedFields", "generation", "selfLink", "deletionTimestamp", "deletionGracePeriodSeconds"] {
            meta.remove(k);
        }
    }
    (v, status)
}

/// Set by tests only: the process aborts (as if killed) once this many objects are in the
/// target, to check that a move cut off there is finished by a rerun.
const ABORT_AFTER: &str = "BANLIEUE_BOOTSTRAP_ABORT_AFTER_OBJECTS";

/// Server-side apply `value` into `api`, then its status; the object as the target has it.
async fn put(api: &Api<DynamicObject>, value: &Value, status: Option<&Value>, moved: &mut usize) -> anyhow::Result<DynamicObject> {
    let applied = put_one(api, value, status).await?;
    *moved += 1;
    if std::env::var(ABORT_AFTER).ok().and_then(|n| n.parse::<usize>().ok()) == Some(*moved) {
        eprintln!("{ABORT_AFTER}={moved}: aborting mid-move");
        std::process::abort();
    }
    Ok(applied)
}

async fn put_one(api: &Api<DynamicObject>, value: &Value, status: Option<&Value>) -> anyhow::Result<DynamicObject> {
    let name = value["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let kind = value["kind"].as_str().unwrap_or_default().to_string();
    let mut applied = api.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(value)).await.with_context(|| format!("moving {kind} {name}"))?;
    if let Some(st) = status.filter(|s| !s.is_null()) {
        applied = api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&json!({"status": st})))
            .await
            .with_context(|| format!("moving the status of {kind} {name}"))?;
    }
    Ok(applied)
}

/// Copy banlieue's objects from `source` to `target`; how many.
async fn move_objects(source: &kube::Client, target: &kube::Client, namespaces: &BTreeSet<String>) -> anyhow::Result<usize> {
    crate::crds::install(target).await.context("installing banlieue's CRDs in the target cluster")?;
    let mut moved = 0;
    for ns in namespaces {
        crate::dev::apply(target, json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})).await?;
    }
    let cluster_kinds = [
        resource("banlieue.io", "v1alpha1", "ProviderClass", "providerclasses"),
        resource("banlieue.io", "v1alpha1", "PlacementPolicy", "placementpolicies"),
        resource("banlieue.io", "v1alpha1", "VMClass", "vmclasses"),
        resource("banlieue.io", "v1alpha1", "VMImage", "vmimages"),
    ];
    for r in &cluster_kinds {
        for o in Api::<DynamicObject>::all_with(source.clone(), r).list(&ListParams::default()).await?.items {
            let (value, status) = portable(&o);
            put(&Api::all_with(target.clone(), r), &value, status.as_ref(), &mut moved).await?;
        }
    }
    let secrets = resource("", "v1", "Secret", "secrets");
    let providers = resource("banlieue.io", "v1alpha1", "Provider", "providers");
    for ns in namespaces {
        for r in [&secrets, &providers] {
            for o in Api::<DynamicObject>::namespaced_with(source.clone(), ns, r).list(&ListParams::default()).await?.items {
                if o.data["type"].as_str() == Some("kubernetes.io/service-account-token") {
                    continue;
                }
                let (value, status) = portable(&o);
                put(&Api::namespaced_with(target.clone(), ns, r), &value, status.as_ref(), &mut moved).await?;
            }
        }
    }
    // Machines first, paused and owned by nothing yet: a VM arriving before its Machine would
    // have the new cluster make another one.
    let prefixes: BTreeSet<String> = Api::<banlieue_api::ProviderClass>::all(source.clone())
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|c| c.spec.infrastructure_kind.clone())
        .collect();
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> = Api::all(target.clone());
    let mut machines = Vec::new();
    for prefix in &prefixes {
        for crd in banlieue_api::infra::infrastructure_crds(prefix).map_err(|e| anyhow::anyhow!("{e}"))? {
            let name = crd.metadata.name.clone().unwrap_or_default();
            crds.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&crd)).await.with_context(|| format!("installing CRD {name} in the target"))?;
            // Served before any Machine of it is written.
            let established = kube::runtime::wait::await_condition(crds.clone(), &name, kube::runtime::wait::conditions::is_crd_established());
            tokio::time::timeout(Duration::from_secs(30), established).await.with_context(|| format!("CRD {name} not established in the target within 30s"))??;
        }
        let r = banlieue_controller::machine_resource(prefix);
        for ns in namespaces {
            for o in Api::<DynamicObject>::namespaced_with(source.clone(), ns, &r).list(&ListParams::default()).await?.items {
                let (mut value, status) = portable(&o);
                let backend_uid = banlieue_controller::backend_uid(&o);
                value["metadata"]["annotations"][banlieue_controller::BACKEND_UID] = json!(backend_uid);
                value["metadata"]["annotations"][banlieue_controller::PAUSED_ANNOTATION] = json!("banlieue bootstrap: moving");
                let owner = o.owner_references().iter().find(|r| r.kind == "VirtualMachine").map(|r| r.name.clone());
                value["metadata"]["ownerReferences"] = json!([]);
                put(&Api::namespaced_with(target.clone(), ns, &r), &value, status.as_ref(), &mut moved).await?;
                machines.push((r.clone(), ns.clone(), o.name_any(), owner));
            }
        }
    }
    let vms = resource("banlieue.io", "v1alpha1", "VirtualMachine", "virtualmachines");
    let mut vm_uids = BTreeMap::new();
    for ns in namespaces {
        for o in Api::<DynamicObject>::namespaced_with(source.clone(), ns, &vms).list(&ListParams::default()).await?.items {
            let (value, status) = portable(&o);
            let applied = put(&Api::namespaced_with(target.clone(), ns, &vms), &value, status.as_ref(), &mut moved).await?;
            vm_uids.insert((ns.clone(), o.name_any()), applied.uid().unwrap_or_default());
        }
    }
    // Each Machine owned by its VM again, then let go.
    for (r, ns, name, owner) in machines {
        let api: Api<DynamicObject> = Api::namespaced_with(target.clone(), &ns, &r);
        let mut patch = json!({"metadata": {"annotations": {banlieue_controller::PAUSED_ANNOTATION: null}}});
        if let Some(vm) = owner {
            let uid = vm_uids.get(&(ns.clone(), vm.clone())).cloned().unwrap_or_default();
            patch["metadata"]["ownerReferences"] = json!([{"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "name": vm, "uid": uid,
                                                        "controller": true, "blockOwnerDeletion": true}]);
        }
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.with_context(|| format!("handing Machine {ns}/{name} to its VM"))?;
    }
    Ok(moved)
}
