//! `banlieue placement explain|bench`: what a placement policy would do for a VM now, and what
//! a policy costs, for the teams who write them. Nothing is placed or written.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use banlieue_api::{PlacementPolicy, Provider, VMClass, VMImage, VirtualMachine};
use banlieue_controller::explain::{self, Explanation, World};
use banlieue_controller::Components;
use banlieue_runtime::placement::{Capacity, DomainsBuilder, Request, VmClass};
use banlieue_runtime::{Limits, Runtime, RuntimeConfig};
use kube::api::{Api, ListParams};
use kube::ResourceExt;

#[derive(clap::Subcommand)]
pub enum PlacementCommand {
    /// The candidates a VM would be offered now, the hard constraint that left each other
    /// failure domain out, and the order its placement policy prefers the candidates in.
    Explain(ExplainArgs),
    /// Time a placement policy's `choose` over generated candidates.
    Bench(BenchArgs),
}

#[derive(clap::Args)]
pub struct ExplainArgs {
    /// The VirtualMachine.
    vm: String,
    #[arg(short, long, default_value = "default")]
    namespace: String,
    /// Try this policy (a `.wasm` file, not published yet) instead of the VM's.
    #[arg(long)]
    policy: Option<PathBuf>,
    /// Parameters (JSON) for the --policy file.
    #[arg(long)]
    parameters: Option<String>,
    /// Read the objects from this file (`kubectl get -o yaml` output, one or more documents:
    /// the VM, its VMClass and VMImage, the namespace's Providers and VMs, PlacementPolicies)
    /// instead of the cluster.
    #[arg(long)]
    from: Option<PathBuf>,
    /// Rank this many candidates (each is one call of the policy).
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// The kubeconfig context (default: its current one).
    #[arg(long)]
    context: Option<String>,
    /// Where `builtin:` components are.
    #[arg(long, env = "BANLIEUE_BUILTIN_DIR", default_value = "guests/dist")]
    builtin_dir: PathBuf,
    /// The one directory `file://` component sources may name files in.
    #[arg(long, env = "BANLIEUE_COMPONENT_DIR")]
    component_dir: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct BenchArgs {
    /// The policy: a `.wasm` file, or `builtin:NAME` (spread, binpack).
    policy: String,
    /// Candidates generated (10 Providers, 3 zones, VMs placed on most).
    #[arg(long, default_value_t = 10_000)]
    candidates: usize,
    /// Calls timed.
    #[arg(long, default_value_t = 20)]
    runs: usize,
    /// Parameters (JSON) passed to the policy.
    #[arg(long)]
    parameters: Option<String>,
    /// Where `builtin:` components are.
    #[arg(long, env = "BANLIEUE_BUILTIN_DIR", default_value = "guests/dist")]
    builtin_dir: PathBuf,
}

pub async fn run(cmd: PlacementCommand) -> anyhow::Result<()> {
    match cmd {
        PlacementCommand::Explain(args) => explain_vm(args).await,
        PlacementCommand::Bench(args) => bench(args).await,
    }
}

/// The objects a placement looks at, from the cluster or a file.
#[derive(Default)]
struct Objects {
    vms: Vec<Arc<VirtualMachine>>,
    classes: Vec<VMClass>,
    images: Vec<VMImage>,
    providers: Vec<Arc<Provider>>,
    policies: Vec<PlacementPolicy>,
}

async fn explain_vm(args: ExplainArgs) -> anyhow::Result<()> {
    let ns = args.namespace.clone();
    let (objects, client) = match &args.from {
        Some(file) => (from_file(file)?, offline_client()?),
        None => {
            let options = kube::config::KubeConfigOptions { context: args.context.clone(), ..Default::default() };
            let config = kube::Config::from_kubeconfig(&options).await.context("reading the kubeconfig (KUBECONFIG)")?;
            let client = kube::Client::try_from(config)?;
            (from_cluster(&client, &ns, &args.vm).await?, client)
        }
    };
    let Some(vm) = objects.vms.iter().find(|v| v.name_any() == args.vm && v.namespace().as_deref() == Some(ns.as_str())).cloned() else {
        eprintln!("error: VirtualMachine {ns}/{} not found", args.vm);
        std::process::exit(3);
    };
    let class_name = &vm.spec.class_ref.name;
    let class = objects.classes.iter().find(|c| c.name_any() == *class_name).with_context(|| format!("VMClass {class_name:?} not found"))?;
    let image_name = &vm.spec.image_ref.name;
    let image = match image_name.as_str() {
        "" => VMImage::default(),
        name => objects.images.iter().find(|i| i.name_any() == name).cloned().with_context(|| format!("VMImage {name:?} not found"))?,
    };
    let world = World {
        vm: &vm,
        class,
        image: &image,
        providers: objects.providers.iter().filter(|p| p.namespace().as_deref() == Some(ns.as_str())).cloned().collect(),
        vms: objects.vms.iter().filter(|v| v.namespace().as_deref() == Some(ns.as_str())).cloned().collect(),
    };
    let (candidates, excluded) = explain::candidates(&world).map_err(anyhow::Error::msg)?;

    // The policy: the file tried, or the VM's own (a pool sets it on members), else its
    // class's, else spread — as the VM controller chooses.
    let rt = Runtime::new(RuntimeConfig::default())?;
    let dirs = banlieue_runtime::source::LocalDirs { builtin: args.builtin_dir.clone(), files: args.component_dir.clone() };
    let components = Components::new(rt.clone(), client, dirs, banlieue_api::provider::RequestedCapabilities { http: true, libvirt: true, secrets: true });
    let policy_ref = vm.spec.placement.as_ref().and_then(|p| p.policy_ref.as_ref()).or(class.spec.placement_policy_ref.as_ref());
    let (policy_name, policy, parameters, limits) = match (&args.policy, policy_ref) {
        (Some(file), _) => {
            let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
            let parameters: BTreeMap<String, serde_json::Value> = serde_json::from_str(args.parameters.as_deref().unwrap_or("{}")).context("--parameters is not a JSON object")?;
            (format!("{} (--policy)", file.display()), Arc::new(rt.placement(&bytes)?), parameters, Limits::default())
        }
        (None, Some(r)) => {
            let pp = objects.policies.iter().find(|p| p.name_any() == r.name).with_context(|| format!("PlacementPolicy {:?} not found", r.name))?;
            let loaded = components.policy(pp).await.map_err(|e| anyhow::anyhow!("PlacementPolicy {:?}: {e}", r.name))?;
            (r.name.clone(), Arc::new(loaded.component.clone()), pp.spec.parameters.clone(), loaded.limits)
        }
        (None, None) => {
            let loaded = components.builtin_policy("spread").await.map_err(|e| anyhow::anyhow!("the built-in spread policy: {e}"))?;
            ("spread (built in)".to_string(), Arc::new(loaded.component.clone()), BTreeMap::new(), loaded.limits)
        }
    };
    let mut explained = explain::rank(&policy, &world, &parameters, candidates, args.top, limits).await.map_err(|e| anyhow::anyhow!("placement policy {policy_name}: {e}"))?;
    explained.excluded = excluded;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&json(&vm, &policy_name, &explained))?);
    } else {
        print!("{}", text(&vm, class, &policy_name, &explained, args.top));
    }
    Ok(())
}

fn text(vm: &VirtualMachine, class: &VMClass, policy: &str, e: &Explanation, top: usize) -> String {
    let c = &class.spec;
    let storage: u64 = c.disks.iter().map(|d| d.size_gib).sum();
    let mut out = format!(
        "virtualmachine {}/{}: class {} ({} CPU, {} MiB, {storage} GiB); policy {policy}\n",
        vm.namespace().unwrap_or_default(),
        vm.name_any(),
        class.name_any(),
        c.cpus,
        c.memory_mib
    );
    if e.ranked.is_empty() {
        out.push_str("no failure domain fits\n");
    } else {
        out.push_str("candidates, in the order the policy prefers them:\n");
        let width = e.ranked.iter().map(|r| r.candidate.len()).chain(e.unranked.iter().map(String::len)).max().unwrap_or(0);
        for (i, r) in e.ranked.iter().enumerate() {
            out.push_str(&format!("  {:>3}  {:<width$}  score {:>6}  free {:>4} CPU {:>8} MiB  {:>3} VMs  {}\n", i + 1, r.candidate, r.score, r.free_cpus, r.free_memory_mib, r.vms, r.why));
        }
        for c in &e.unranked {
            out.push_str(&format!("    -  {c:<width$}  not ranked (--top {top})\n"));
        }
    }
    if !e.excluded.is_empty() {
        out.push_str("not candidates:\n");
        for x in &e.excluded {
            out.push_str(&format!("  {x}\n"));
        }
    }
    out
}

fn json(vm: &VirtualMachine, policy: &str, e: &Explanation) -> serde_json::Value {
    serde_json::json!({
        "vm": format!("{}/{}", vm.namespace().unwrap_or_default(), vm.name_any()),
        "policy": policy,
        "ranked": e.ranked.iter().enumerate().map(|(i, r)| serde_json::json!({"rank": i + 1, "candidate": r.candidate, "freeCpus": r.free_cpus, "freeMemoryMiB": r.free_memory_mib, "vms": r.vms, "score": r.score, "reason": r.why})).collect::<Vec<_>>(),
        "unranked": e.unranked,
        "excluded": e.excluded,
    })
}

async fn from_cluster(client: &kube::Client, ns: &str, vm: &str) -> anyhow::Result<Objects> {
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), ns);
    let mut objects = Objects::default();
    let Some(me) = vms.get_opt(vm).await? else {
        eprintln!("error: VirtualMachine {ns}/{vm} not found");
        std::process::exit(3);
    };
    if let Some(c) = Api::<VMClass>::all(client.clone()).get_opt(&me.spec.class_ref.name).await? {
        objects.classes.push(c);
    }
    if !me.spec.image_ref.name.is_empty() {
        if let Some(i) = Api::<VMImage>::all(client.clone()).get_opt(&me.spec.image_ref.name).await? {
            objects.images.push(i);
        }
    }
    objects.vms = vms.list(&ListParams::default()).await?.items.into_iter().map(Arc::new).collect();
    objects.providers = Api::<Provider>::namespaced(client.clone(), ns).list(&ListParams::default()).await?.items.into_iter().map(Arc::new).collect();
    objects.policies = Api::<PlacementPolicy>::all(client.clone()).list(&ListParams::default()).await?.items;
    Ok(objects)
}

/// The objects of a `kubectl get -o yaml` dump (documents, or `kind: List`).
fn from_file(file: &std::path::Path) -> anyhow::Result<Objects> {
    use serde::Deserialize;
    let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let mut objects = Objects::default();
    let mut add = |v: serde_yaml::Value| -> anyhow::Result<()> {
        let kind = v.get("kind").and_then(|k| k.as_str()).unwrap_or_default().to_string();
        match kind.as_str() {
            "VirtualMachine" => objects.vms.push(Arc::new(serde_yaml::from_value(v)?)),
            "VMClass" => objects.classes.push(serde_yaml::from_value(v)?),
            "VMImage" => objects.images.push(serde_yaml::from_value(v)?),
            "Provider" => objects.providers.push(Arc::new(serde_yaml::from_value(v)?)),
            "PlacementPolicy" => objects.policies.push(serde_yaml::from_value(v)?),
            _ => {}
        }
        Ok(())
    };
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v = serde_yaml::Value::deserialize(doc).with_context(|| format!("{}: not YAML", file.display()))?;
        match v.get("items").and_then(|i| i.as_sequence()).cloned() {
            Some(items) => items.into_iter().try_for_each(&mut add)?,
            None if !v.is_null() => add(v).with_context(|| format!("{}: an object banlieue does not understand", file.display()))?,
            None => {}
        }
    }
    Ok(objects)
}

/// A client for loading components when the objects came from a file: nothing is asked of
/// a cluster unless a policy names a pull Secret, which then fails saying so.
fn offline_client() -> anyhow::Result<kube::Client> {
    let config = kube::Config::new("http://127.0.0.1:9".parse()?);
    Ok(kube::Client::try_from(config)?)
}

async fn bench(args: BenchArgs) -> anyhow::Result<()> {
    let rt = Runtime::new(RuntimeConfig::default())?;
    let bytes = match args.policy.strip_prefix("builtin:") {
        Some(name) => std::fs::read(args.builtin_dir.join(format!("placement-{name}.wasm"))),
        None => std::fs::read(&args.policy),
    }
    .with_context(|| format!("reading {}", args.policy))?;
    let policy = rt.placement(&bytes)?;
    if args.candidates == 0 || args.runs == 0 {
        bail!("--candidates and --runs must be at least 1");
    }
    let started = Instant::now();
    let domains = generated(args.candidates);
    let tables = started.elapsed();
    let request = Request {
        vm_name: "web-1".into(),
        vm_namespace: "default".into(),
        vm_labels: vec![("app".into(), "web".into())],
        class: VmClass { name: "small".into(), cpus: 2, memory_mib: 2048, storage_gib: 20, storage_classes: vec!["standard".into()], network_classes: vec!["default".into()], features: vec![] },
        parameters: args.parameters.clone().unwrap_or_else(|| "{}".into()),
        anti_affinity: vec![],
    };
    let mut times = Vec::with_capacity(args.runs);
    let mut last = None;
    for _ in 0..args.runs {
        let t = Instant::now();
        last = Some(policy.choose(&request, &domains, Limits::default(), Default::default()).await?);
        times.push(t.elapsed());
    }
    times.sort();
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let chosen = last.expect("at least one run");
    println!("{} ({}, contract {}) over {} candidates, {} calls:", args.policy, policy.component.digest, policy.component.contract_version, args.candidates, args.runs);
    println!("  choose: median {:.3} ms, p90 {:.3} ms, min {:.3} ms", ms(at(0.5)), ms(at(0.9)), ms(times[0]));
    println!("  the host's tables for them: {:.3} ms (built once per placement)", ms(tables));
    println!("  chose {} (score {}) — {}", domains.get(chosen.candidate).map(|c| format!("{}/{}", c.provider(), c.failure_domain())).unwrap_or_default(), chosen.score, chosen.reason);
    Ok(())
}

/// `n` failure domains of 10 Providers in 3 zones, free memory varied, VMs of two apps
/// placed on most — the shape the runtime's own bench uses.
fn generated(n: usize) -> banlieue_runtime::placement::Domains {
    let mut b = DomainsBuilder::with_capacity(n);
    let web = b.group("default", [("app", "web")]);
    let db = b.group("default", [("app", "db")]);
    let (standard, default) = (vec!["standard".to_string()], vec!["default".to_string()]);
    for i in 0..n {
        let zone = format!("z{}", i % 3);
        let facts = b.facts("libvirt", [("topology.kubernetes.io/zone", zone.as_str())], &standard, &default, &[]);
        let provider = b.text(&format!("default/p{}", i % 10));
        let fd = b.text(&format!("fd-{i}"));
        let placed: Vec<u32> = (0..(i % 3) as u32).map(|k| if k == 0 { web } else { db }).collect();
        let capacity = Capacity { cpus: 64, memory_mib: 65536 + (i as u64 % 97) * 512, storage_gib: 1000 };
        b.candidate(provider, fd, facts, capacity, (i % 5) as u32, placed);
    }
    b.build()
}
