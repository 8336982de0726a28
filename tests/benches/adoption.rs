//! Discovery and adoption at scale on vcsim, through the whole control plane, against the
//! listing a user would run by hand in the same run (one vim25 `RetrievePropertiesEx` of
//! every VM's name, what `govc find` does):
//!
//! 1. vcsim with BENCH_VMS_PER_HOST (default 500) VMs on its standalone host and in its
//!    cluster (about 1,000 VMs); BENCH_RUNS (default 3) times: the Provider's
//!    `banlieue.io/discover` set → `status.discovery` answered (the driver lists every VM with
//!    its hardware, addresses and mark, a hundred per page, into the Provider's status), and
//!    the listing by hand. Medians.
//! 2. BENCH_ADOPT (default 100) of those VMs adopted at once by VirtualMachines
//!    (`spec.adopt`): seconds until all are Ready, adoptions per second, API writes and
//!    driver calls per adopted VM.
//!
//! 3. A pool of BENCH_POOL_ADOPT (default 500) replicas whose `adoptSelector` matches the
//!    standalone host's VMs (`DC0_H0_VM*`, none of them adopted in 2.): seconds until every
//!    member is Ready, adoptions per second, API writes and driver calls per member — and
//!    nothing cloned.
//!
//! `cargo bench -p banlieue-tests --bench adoption` (needs `guests/build.sh` and vcsim).

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use banlieue_api::provider::DISCOVER_ANNOTATION;
use banlieue_api::{Provider, VirtualMachinePool};
use banlieue_test_backends::vcsim::{self, Vcsim};
use banlieue_tests::backends::{vsphere_fixtures, VCENTER};
use banlieue_tests::bench::{await_ready, env_or, mark, median, writes_since};
use banlieue_tests::control::ControlPlane;
use banlieue_tests::TestEnv;
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

/// The names of vcsim's standalone host's VMs, which the pool adopts.
const POOL_NAMES: &str = "DC0_H0_VM";

fn main() -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(bench())
}

/// Ask for a discovery and wait for the Provider's answer; the machines it lists.
async fn discover(providers: &Api<Provider>, token: &str) -> anyhow::Result<Vec<banlieue_api::provider::DiscoveredMachine>> {
    let patch = json!({"metadata": {"annotations": {DISCOVER_ANNOTATION: token}}});
    providers.patch(VCENTER, &PatchParams::default(), &Patch::Merge(patch)).await?;
    let token = token.to_string();
    let answered = move |p: Option<&Provider>| p.and_then(|p| p.status.as_ref()?.discovery.as_ref()).is_some_and(|d| d.requested == token);
    let p = tokio::time::timeout(Duration::from_secs(600), kube::runtime::wait::await_condition(providers.clone(), VCENTER, answered)).await??;
    let d = p.and_then(|p| p.status?.discovery).unwrap_or_default();
    anyhow::ensure!(d.message.is_none(), "discovery: {:?}", d.message);
    Ok(d.machines)
}

/// Driver calls so far, by function, from the provider role's metrics.
fn calls(cp: &ControlPlane) -> BTreeMap<String, f64> {
    let mut by = BTreeMap::new();
    for line in cp.ctx.metrics.render().lines().filter(|l| l.starts_with("banlieue_component_calls_total{")) {
        let function = line.split("function=\"").nth(1).and_then(|r| r.split('"').next()).unwrap_or_default().to_string();
        let n: f64 = line.rsplit(' ').next().and_then(|n| n.parse().ok()).unwrap_or(0.0);
        *by.entry(function).or_default() += n;
    }
    by
}

async fn bench() -> anyhow::Result<()> {
    let (per_host, runs, adopt): (usize, usize, usize) = (env_or("BENCH_VMS_PER_HOST", 500), env_or("BENCH_RUNS", 3), env_or("BENCH_ADOPT", 100));
    let pool_adopt: usize = env_or("BENCH_POOL_ADOPT", 500);
    let env = TestEnv::start("bench-adopt").await?;
    env.install_crds().await?;
    let started = Instant::now();
    let vc = Vcsim::start_with_vms(per_host).await?;
    let total = vc.vm_names().await?.len();
    println!("vcsim: {total} VMs and templates (started in {:.1}s)", started.elapsed().as_secs_f64());
    let cp = ControlPlane::start(&env)?;
    let n = vsphere_fixtures(&env, &vc, vcsim::PASSWORD).await?;
    let providers: Api<Provider> = Api::namespaced(env.client.clone(), &env.ns);
    let probed = |p: Option<&Provider>| p.and_then(|p| p.status.as_ref()).is_some_and(|s| s.driver_features.iter().any(|f| f == "adopt"));
    tokio::time::timeout(Duration::from_secs(300), kube::runtime::wait::await_condition(providers.clone(), VCENTER, probed)).await??;

    // 1. Discovery, against the listing by hand.
    let (mut ours, mut by_hand) = (Vec::new(), Vec::new());
    let mut found = Vec::new();
    for run in 0..runs {
        let t = Instant::now();
        found = discover(&providers, &format!("run-{run}")).await?;
        ours.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let names = vc.vm_names().await?;
        by_hand.push(t.elapsed().as_secs_f64());
        println!("run {run}: banlieue discovered {} machines in {:.2}s; vim25 listed {} names in {:.2}s", found.len(), ours[run], names.len(), by_hand[run]);
    }
    println!("discovery of {} machines: median {:.2}s through banlieue (status written), {:.2}s by hand (names only)", found.len(), median(ours), median(by_hand));

    // 2. Adoption of `adopt` of them at once.
    // The pool (3.) takes the standalone host's VMs; these come from the cluster.
    let chosen: Vec<String> = found.iter().filter(|m| !m.template && m.owner.is_none() && !m.name.starts_with(POOL_NAMES)).take(adopt).map(|m| m.backend_id.clone()).collect();
    let server = env.embedded().ok_or_else(|| anyhow::anyhow!("the bench counts writes on the embedded API server"))?;
    let (w0, c0) = (mark(server), calls(&cp));
    let t = Instant::now();
    let names: HashSet<String> = (0..chosen.len()).map(|i| format!("adopted-{i}")).collect();
    futures::stream::iter(chosen.iter().enumerate().map(|(i, id)| {
        let (env, class) = (&env, n.vm_class.clone());
        async move {
            let vm = json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": format!("adopted-{i}"), "namespace": env.ns},
                            "spec": {"classRef": {"name": class}, "placement": {"providerRef": {"name": VCENTER}}, "adopt": {"backendId": id}}});
            env.apply(vm).await
        }
    }))
    .buffer_unordered(16)
    .try_collect::<Vec<()>>()
    .await?;
    await_ready(&env.client, &env.ns, names, Duration::from_secs(1800)).await?;
    let secs = t.elapsed().as_secs_f64();
    let k = chosen.len() as f64;
    let writes = writes_since(server, w0, chosen.len()) as f64 / k;
    let c1 = calls(&cp);
    let per_vm: Vec<String> = c1.iter().filter_map(|(f, n)| Some((f, n - c0.get(f).copied().unwrap_or(0.0))).filter(|(_, d)| *d > 0.0)).map(|(f, d)| format!("{f} {:.2}", d / k)).collect();
    println!("adopted {} VMs in {secs:.1}s: {:.1} adoptions/s, {writes:.1} API writes and driver calls {} per VM", chosen.len(), k / secs, per_vm.join(", "));

    // 3. A pool adopting `pool_adopt` of the standalone host's VMs.
    let matching = found.iter().filter(|m| !m.template && m.owner.is_none() && m.name.starts_with(POOL_NAMES)).count();
    let replicas = pool_adopt.min(matching);
    let before = vc.vm_names().await?.len();
    let (w0, c0) = (mark(server), calls(&cp));
    let t = Instant::now();
    let pool = json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachinePool", "metadata": {"name": "fleet", "namespace": env.ns},
                      "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "fleet"}},
                               "adoptSelector": {"names": [format!("{POOL_NAMES}*")]},
                               "template": {"metadata": {"labels": {"app": "fleet"}},
                                            "spec": {"classRef": {"name": n.vm_class}, "imageRef": {"name": n.image}, "placement": {"providerRef": {"name": VCENTER}}}}}});
    env.apply(pool).await?;
    let pools: Api<VirtualMachinePool> = Api::namespaced(env.client.clone(), &env.ns);
    let want = i32::try_from(replicas)?;
    let all_ready = move |p: Option<&VirtualMachinePool>| p.and_then(|p| p.status.as_ref()).is_some_and(|s| s.replicas == want && s.ready_replicas == want);
    tokio::time::timeout(Duration::from_secs(1800), kube::runtime::wait::await_condition(pools, "fleet", all_ready)).await??;
    let secs = t.elapsed().as_secs_f64();
    let k = replicas as f64;
    let writes = writes_since(server, w0, replicas) as f64 / k;
    let c1 = calls(&cp);
    let per_vm: Vec<String> = c1.iter().filter_map(|(f, n)| Some((f, n - c0.get(f).copied().unwrap_or(0.0))).filter(|(_, d)| *d > 0.0)).map(|(f, d)| format!("{f} {:.2}", d / k)).collect();
    let vms: Api<banlieue_api::VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    let members = vms.list(&kube::api::ListParams::default().labels("app=fleet")).await?.items;
    let adopted = members.iter().filter(|vm| vm.spec.adopt.is_some()).count();
    let made = vc.vm_names().await?.len().saturating_sub(before);
    println!(
        "a pool of {replicas} adopted {adopted} of them in {secs:.1}s: {:.1} adoptions/s, {writes:.1} API writes and driver calls {} per member; {made} VMs made on vcsim",
        k / secs,
        per_vm.join(", ")
    );
    anyhow::ensure!(adopted == replicas && made == 0, "the pool adopted {adopted} of {replicas} and made {made}");
    drop(cp);
    Ok(())
}
