//! Killed hosts: the banlieue process (`banlieue run`, every role, a process of its own)
//! SIGKILLed and restarted at random moments of a pool scale-up, a VM's swap between
//! backends and a pool's deletion, while the state that matters is held by the backends
//! (vcsim and fakepve, started here) and the API server. Every iteration ends with exactly
//! the declared VMs on the backends, each made once, and nothing after deletion — as
//! vcsim's vim25 API and fakepve's PVE API show.
//!
//! The moments are drawn from a seeded generator; the seed is printed
//! (`BANLIEUE_FAULTS_SEED=N` replays it). CI runs a short count; `make faults` the full
//! one (20 iterations of a 50-member pool).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use banlieue_api::{VirtualMachine, VirtualMachinePool};
use banlieue_test_backends::fakepve::{self, FakePve};
use banlieue_test_backends::vcsim::{self, Vcsim};
use banlieue_tests::backends::{proxmox_fixtures, vm, vm_class, vsphere_fixtures, Names, PveEndpoint, PVE, VCENTER};
use banlieue_tests::control::{guests_dist};
use banlieue_tests::faults::{iterations, ready_vms, MadeFor, Rng, Tally};
use banlieue_tests::TestEnv;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::json;

/// `banlieue run` as a child process, SIGKILLed and restarted by the test.
struct Banlieue {
    env_dir: PathBuf,
    kubeconfig: PathBuf,
    namespace: String,
    /// The test's installation (`--instance`), none for the default one.
    instance: Option<String>,
    child: Option<Child>,
    starts: usize,
}

impl Banlieue {
    fn start(env: &TestEnv) -> anyhow::Result<Banlieue> {
        let mut b = Banlieue { env_dir: env.dir().to_path_buf(), kubeconfig: env.kubeconfig.clone(), namespace: env.ns.clone(), instance: env.installation().instance().map(str::to_string), child: None, starts: 0 };
        b.restart()?;
        Ok(b)
    }

    fn restart(&mut self) -> anyhow::Result<()> {
        anyhow::ensure!(self.child.is_none(), "banlieue is running");
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.env_dir.join("banlieue.log"))?;
        let metrics = format!("127.0.0.1:{}", banlieue_test_backends::free_port());
        let child = Command::new(banlieue_tests::bootstrap::banlieue()?)
            .arg("run")
            .args(["--no-leader-election", "--namespace", &self.namespace, "--metrics-addr", &metrics])
            .args(self.instance.iter().flat_map(|i| ["--instance", i]))
            .arg("--builtin-dir")
            .arg(guests_dist())
            .arg("--cache-dir")
            .arg(self.env_dir.join("component-cache"))
            .arg("--image-cache-dir")
            .arg(self.env_dir.join("image-cache"))
            .env("KUBECONFIG", &self.kubeconfig)
            .env("RUST_LOG", "info,kube=warn,hyper=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        self.child = Some(child);
        self.starts += 1;
        Ok(())
    }

    fn sigkill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Banlieue {
    fn drop(&mut self) {
        self.sigkill();
    }
}

/// SIGKILL banlieue after a random delay (up to `within`) while the change just made is being
/// acted on, and start it again after a short random pause; returns when it runs again.
async fn kill_during(banlieue: &mut Banlieue, rng: &mut Rng, within: Duration) -> anyhow::Result<()> {
    tokio::time::sleep(Duration::from_millis(rng.between(0, within.as_millis() as u64))).await;
    banlieue.sigkill();
    tokio::time::sleep(Duration::from_millis(rng.between(0, 500))).await;
    banlieue.restart()
}

/// Backend VMs of the test's namespace by VM name: (on vSphere, on Proxmox VE).
async fn backend_vms(env: &TestEnv, vc: &Vcsim, pve: &FakePve) -> anyhow::Result<(BTreeMap<String, usize>, BTreeMap<String, usize>)> {
    let mut on_vsphere = BTreeMap::new();
    for n in vc.vm_names().await? {
        if let Some(name) = n.strip_prefix(&format!("{}_", env.ns)) {
            *on_vsphere.entry(name.to_string()).or_default() += 1;
        }
    }
    let mut on_proxmox = BTreeMap::new();
    for v in pve.vms().await? {
        if let Some(name) = v.name.strip_suffix(&format!(".{}", env.ns)) {
            *on_proxmox.entry(name.to_string()).or_default() += 1;
        }
    }
    Ok((on_vsphere, on_proxmox))
}

/// The declared state: VM name → the Provider it must be on.
type Declared = BTreeMap<String, &'static str>;

/// Whether the backends hold exactly `declared` (each VM once, on its Provider, nothing else)
/// and every declared VM is Ready there; counts remade backend VMs into `tally`.
async fn converged(env: &TestEnv, vc: &Vcsim, pve: &FakePve, declared: &Declared, made: &mut MadeFor, tally: &mut Tally) -> anyhow::Result<bool> {
    let (listed, ready) = ready_vms(env).await?;
    let (on_vsphere, on_proxmox) = backend_vms(env, vc, pve).await?;
    let done = listed == declared.len()
        && declared.iter().all(|(n, p)| ready.get(n).is_some_and(|vm| vm.provider == *p))
        && on_vsphere.iter().all(|(n, c)| *c == 1 && declared.get(n) == Some(&VCENTER))
        && on_proxmox.iter().all(|(n, c)| *c == 1 && declared.get(n) == Some(&PVE))
        && on_vsphere.len() + on_proxmox.len() == declared.len();
    if done {
        made.record(&ready, tally);
    }
    Ok(done)
}

async fn converge(env: &TestEnv, vc: &Vcsim, pve: &FakePve, declared: &Declared, made: &mut MadeFor, tally: &mut Tally, what: &str) -> anyhow::Result<Duration> {
    let started = Instant::now();
    loop {
        if converged(env, vc, pve, declared, made, tally).await? {
            return Ok(started.elapsed());
        }
        if started.elapsed() > Duration::from_secs(300) {
            let (v, p) = backend_vms(env, vc, pve).await?;
            let waiting = banlieue_tests::faults::not_ready(env).await?;
            anyhow::bail!("{what}: not converged within 300 s on {} declared VMs; vSphere holds {v:?}, Proxmox VE {p:?}; not Ready: {waiting:?}", declared.len());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn pool(env: &TestEnv, name: &str, n: &Names, replicas: usize) -> serde_json::Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachinePool", "metadata": {"name": name, "namespace": env.ns},
           "spec": {"replicas": replicas, "selector": {"matchLabels": {"pool": name}},
                    "template": {"metadata": {"labels": {"pool": name}},
                                 "spec": {"classRef": {"name": n.vm_class}, "imageRef": {"name": n.image},
                                          "placement": {"providerRef": {"name": VCENTER}}}}}})
}

#[tokio::test]
async fn sigkilled_at_random_moments_banlieue_leaves_each_declared_vm_once_and_nothing_after_deletion() -> anyhow::Result<()> {
    let env = TestEnv::start("killed-hosts").await?;
    env.install_crds().await?;
    let (vc, pve) = (Vcsim::start().await?, FakePve::start().await?);
    let on_vsphere = vsphere_fixtures(&env, &vc, vcsim::PASSWORD).await?;
    let on_proxmox = proxmox_fixtures(&env, &pve, &pve.password.clone(), PveEndpoint::Proxy).await?;
    // One VM class and image for both: the swap changes only the Provider.
    let ns = &env.ns;
    let any = Names { provider_class: String::new(), vm_class: format!("{ns}-any-small"), image: format!("{ns}-any-os") };
    env.apply(vm_class(&any.vm_class, 1, 256, 4, "standard", 5)).await?;
    env.apply(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": any.image},
        "spec": {"sources": [{"providerClass": on_vsphere.provider_class, "template": vcsim::TEMPLATE},
                             {"providerClass": on_proxmox.provider_class, "template": fakepve::TEMPLATE_VMID.to_string()}]}})).await?;
    let mut banlieue = Banlieue::start(&env)?;
    let (rounds, members) = (iterations(2, 20), iterations(10, 50));
    let mut rng = Rng::seeded("killed-hosts", 0x16_0004);
    let mut tally = Tally::new("killed-hosts");
    let mut made = MadeFor::default();
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    let pools: Api<VirtualMachinePool> = Api::namespaced(env.client.clone(), &env.ns);
    for round in 0..rounds {
        let mut declared = Declared::new();
        // A VM to swap, made on vSphere.
        let swap = format!("swap-{round}");
        env.apply(vm(&env, &swap, &any, VCENTER, json!({"moveStrategy": "Recreate"}))).await?;
        declared.insert(swap.clone(), VCENTER);

        // The pool scaled up to `members`, killed somewhere in it.
        let p = format!("pool-{round}");
        env.apply(pool(&env, &p, &any, members)).await?;
        declared.extend((0..members).map(|i| (format!("{p}-{i}"), VCENTER)));
        kill_during(&mut banlieue, &mut rng, Duration::from_millis(200 * members as u64)).await?;
        tally.faults += 1;
        let took = converge(&env, &vc, &pve, &declared, &mut made, &mut tally, "pool scale-up").await?;
        tally.converge.push(took);

        // The swap to Proxmox VE (pinned to pve1, where the template's disk is), killed in it.
        vms.patch(&swap, &PatchParams::default(), &Patch::Merge(json!({"spec": {"placement": {
            "providerRef": {"name": PVE}, "failureDomainSelector": {"matchLabels": {"banlieue.io/failure-domain": "pve1"}}}}})))
            .await?;
        declared.insert(swap.clone(), PVE);
        made.forget(Some(&swap));
        kill_during(&mut banlieue, &mut rng, Duration::from_secs(4)).await?;
        tally.faults += 1;
        let took = converge(&env, &vc, &pve, &declared, &mut made, &mut tally, "swap").await?;
        tally.converge.push(took);

        // The pool deleted (and the swapped VM), killed in it.
        pools.delete(&p, &Default::default()).await?;
        vms.delete(&swap, &Default::default()).await?;
        declared.clear();
        kill_during(&mut banlieue, &mut rng, Duration::from_millis(150 * members as u64)).await?;
        tally.faults += 1;
        let took = converge(&env, &vc, &pve, &declared, &mut made, &mut tally, "deletion").await?;
        tally.converge.push(took);
        let (v, p) = backend_vms(&env, &vc, &pve).await?;
        tally.leaked += v.len() + p.len();
        made.forget(None);
        tally.iterations += 1;
    }
    println!("killed-hosts: banlieue started {} times", banlieue.starts);
    tally.report();
    let names: BTreeSet<String> = vms.list(&ListParams::default()).await?.items.iter().map(|v| v.name_any()).collect();
    assert!(names.is_empty(), "no VM left: {names:?}");
    Ok(())
}
