//! VMs on a real hypervisor (libvirtd + qemu, TCG) and one VM's trip across three backends.
//!
//! 1. Apply N VirtualMachines at once on Provider `kvm` (the test guest: 1 vCPU, 256 MiB).
//!    For each VM, from its apply: **Ready** (the domain is defined and running — banlieue's
//!    own work: placement, Machine, the driver's volumes, seed, define and start) and
//!    **address** (`status.addresses` shows the DHCP lease — the hypervisor's part: the guest
//!    booting under TCG and asking for a lease; the part after Ready is the hypervisor's).
//!    Medians and maxima over the N VMs; then every VM deleted, until libvirtd holds none.
//! 2. One VM moved vcsim → fakepve → libvirtd (Ready with an address) → vcsim by changing
//!    `placement.providerRef`: each hop's time to Ready on the new backend, and the round trip.
//!
//! `cargo bench -p banlieue-tests --bench libvirtd` (BENCH_VMS=10, BENCH_RUNS=3 round trips).
//! Needs root (libvirtd), `guests/build.sh`, vcsim and fakepve (as `make test` installs them).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use banlieue_api::VirtualMachine;
use banlieue_controller::{Context, Options, Roles};
use banlieue_test_backends::fakepve::{self, FakePve};
use banlieue_test_backends::libvirtd::Libvirtd;
use banlieue_test_backends::vcsim::{self, Vcsim};
use banlieue_tests::bench::{env_or, median};
use banlieue_tests::control::{apply, guests_dist};
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};

const NS: &str = "default";

fn main() -> anyhow::Result<()> {
    if let Some(served) = banlieue_tests::bench::serve_if_child() {
        return served;
    }
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(bench())
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NAN, f64::max)
}

fn is_ready(vm: &VirtualMachine) -> bool {
    vm.status.as_ref().is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn on(vm: &VirtualMachine, provider: &str) -> bool {
    vm.status.as_ref().and_then(|s| s.scheduled.as_ref()).is_some_and(|s| s.provider == provider)
}

fn has_address(vm: &VirtualMachine) -> bool {
    vm.status.as_ref().is_some_and(|s| !s.addresses.is_empty())
}

/// Watch the VMs from `start` until each in `names` was seen Ready and with an address:
/// name → (seconds to Ready, seconds to an address).
async fn ready_and_addressed(client: &kube::Client, names: &[String], start: Instant, limit: Duration) -> anyhow::Result<HashMap<String, (f64, f64)>> {
    let api: Api<VirtualMachine> = Api::namespaced(client.clone(), NS);
    let mut events = watcher(api, watcher::Config::default()).default_backoff().applied_objects().boxed();
    let mut ready: HashMap<String, f64> = HashMap::new();
    let mut done: HashMap<String, (f64, f64)> = HashMap::new();
    tokio::time::timeout(limit, async {
        while done.len() < names.len() {
            let Some(vm) = events.try_next().await? else { anyhow::bail!("watch ended") };
            let name = vm.metadata.name.clone().unwrap_or_default();
            if !names.contains(&name) {
                continue;
            }
            let t = start.elapsed().as_secs_f64();
            if is_ready(&vm) {
                ready.entry(name.clone()).or_insert(t);
            }
            if let Some(&r) = ready.get(&name).filter(|_| has_address(&vm)) {
                done.entry(name).or_insert((r, t));
            }
        }
        anyhow::Ok(())
    })
    .await
    .map_err(|_| anyhow::anyhow!("{} of {} VMs Ready with an address after {limit:?}", done.len(), names.len()))??;
    Ok(done)
}

/// Poll until `f` holds (bounded).
async fn poll_until<F, Fut>(limit: Duration, what: &str, mut f: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let start = Instant::now();
    while !f().await? {
        anyhow::ensure!(start.elapsed() < limit, "{what} not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

fn vm(name: &str, provider: &str) -> Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name, "namespace": NS},
           "spec": {"classRef": {"name": "bench-tiny"}, "imageRef": {"name": "bench-guest"}, "placement": {"providerRef": {"name": provider}},
                    "userData": {"name": "bench-user-data", "key": "user-data"}}})
}

async fn bench() -> anyhow::Result<()> {
    let vms: usize = env_or("BENCH_VMS", 10);
    let runs: usize = env_or("BENCH_RUNS", 3);
    let lv = Libvirtd::shared()?;
    let vc = Vcsim::start().await?;
    let pve = FakePve::start().await?;
    let server = banlieue_tests::bench::ChildApiServer::start().await?;
    let client = server.client.clone();
    let provider = |name: &str, class: &str, connection: Value, storage: &str, network: &str| {
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": name, "namespace": NS},
               "spec": {"providerClassRef": {"name": class}, "connection": connection,
                        "capabilities": {"storageClasses": {"standard": storage}, "networkClasses": {"default": network}}}})
    };
    let class = |name: &str, component: &str, kind: &str, caps: Value| {
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "ProviderClass", "metadata": {"name": name},
               "spec": {"component": {"source": format!("builtin:{component}")}, "infrastructureKind": kind, "capabilities": caps}})
    };
    let creds = |name: &str, user: &str, password: &str| {
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NS}, "stringData": {"username": user, "password": password}})
    };
    let credentials_ref = |name: &str| json!({"kind": "Secret", "name": name, "keys": ["username", "password"]});
    for object in [
        class("libvirt", "provider-libvirt", "Libvirt", json!({"libvirt": true})),
        class("vsphere", "provider-vsphere", "VSphere", json!({"http": true, "secrets": true})),
        class("proxmox", "provider-proxmox", "Proxmox", json!({"http": true, "secrets": true})),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": "bench-tiny"},
               "spec": {"cpus": 1, "memoryMiB": 256, "disks": [{"name": "root", "sizeGiB": 2, "storageClass": "standard"}],
                        "nics": [{"name": "eth0", "networkClass": "default"}], "powerOffTimeoutSeconds": 30}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": "bench-guest"},
               "spec": {"sources": [{"providerClass": "libvirt", "backingFile": lv.guest_disk()},
                                    {"providerClass": "vsphere", "template": vcsim::TEMPLATE},
                                    {"providerClass": "proxmox", "template": fakepve::TEMPLATE_VMID.to_string()}]}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "bench-user-data", "namespace": NS},
               "stringData": {"user-data": "#cloud-config\n#banlieue-marker: bench\n"}}),
        creds("vcsim-credentials", vcsim::USERNAME, vcsim::PASSWORD),
        creds("pve-credentials", &pve.username, &pve.password),
        provider("kvm", "libvirt", json!({"endpoint": lv.uri}), &lv.pool, &lv.network),
        provider("vcsim", "vsphere", json!({"endpoint": vc.url, "credentialsRef": credentials_ref("vcsim-credentials")}), "LocalDS_0", "VM Network"),
        provider("fakepve", "proxmox", json!({"endpoint": pve.url, "caBundle": pve.ca_pem, "credentialsRef": credentials_ref("pve-credentials")}), "shared-dir", "vmbr0"),
    ] {
        apply(&client, object).await?;
    }
    let dir = tempfile::tempdir()?;
    let options = Options { builtin_dir: guests_dist(), cache_dir: Some(dir.path().join("cache")), leader_election: false, ..Options::default() };
    let ctx = Context::new(client.clone(), options)?;
    let roles = tokio::spawn(banlieue_controller::run(ctx.clone(), Roles::ALL, std::future::pending()));
    let api: Api<VirtualMachine> = Api::namespaced(client.clone(), NS);

    // Warm-up: the components compiled, every Provider probed, one VM on libvirtd booted.
    let t = Instant::now();
    apply(&client, vm("warm-up", "kvm")).await?;
    ready_and_addressed(&client, &["warm-up".to_string()], Instant::now(), Duration::from_secs(300)).await?;
    api.delete("warm-up", &DeleteParams::default()).await?;
    poll_until(Duration::from_secs(120), "warm-up gone", || async { Ok(lv.domains("default_warm-up")?.is_empty()) }).await?;
    println!("warm-up (compile, probes, one boot, delete): {:.1}s", t.elapsed().as_secs_f64());

    // 1. N VMs at once on libvirtd.
    let names: Vec<String> = (0..vms).map(|i| format!("kvm-{i:02}")).collect();
    let start = Instant::now();
    let watching = tokio::spawn({
        let (client, names) = (client.clone(), names.clone());
        async move { ready_and_addressed(&client, &names, start, Duration::from_secs(900)).await }
    });
    // libvirtd's side, sampled every 250 ms: when each domain runs, and when its guest has its
    // lease (the console line udhcpc's script prints).
    let sampling = tokio::task::spawn_blocking({
        let names = names.clone();
        move || backend_times(lv, &names, start, Duration::from_secs(900))
    });
    futures::stream::iter(names.iter().map(|n| apply(&client, vm(n, "kvm")))).buffer_unordered(16).try_collect::<Vec<_>>().await?;
    let times = watching.await??;
    let backend = sampling.await??;
    let all = start.elapsed().as_secs_f64();
    let running = names.iter().filter(|n| lv.state(&format!("default_{n}")).is_ok_and(|s| s == "running")).count();
    anyhow::ensure!(running == vms, "libvirtd runs {running} of the {vms} domains");
    let ready: Vec<f64> = times.values().map(|t| t.0).collect();
    let addressed: Vec<f64> = times.values().map(|t| t.1).collect();
    let boot: Vec<f64> = times.values().map(|t| t.1 - t.0).collect();
    let running: Vec<f64> = backend.values().map(|t| t.0).collect();
    let leased: Vec<f64> = backend.values().map(|t| t.1).collect();
    let guest: Vec<f64> = backend.values().map(|t| t.1 - t.0).collect();
    let lag: Vec<f64> = names.iter().map(|n| times[n].1 - backend[n].1).collect();
    println!("{vms} VMs on libvirtd + qemu (TCG), applied at once: all Ready with an address after {all:.1}s");
    println!("  as libvirtd saw it (sampled every 250 ms):");
    println!("    apply → domain running: median {:.2}s, max {:.2}s", median(running.clone()), max(&running));
    println!("    domain running → guest has its lease (boot under TCG + DHCP): median {:.2}s, max {:.2}s", median(guest.clone()), max(&guest));
    println!("    apply → lease: median {:.2}s, max {:.2}s", median(leased.clone()), max(&leased));
    println!("    lease → address in the VM's status (banlieue describing again): median {:.2}s, max {:.2}s", median(lag.clone()), max(&lag));
    println!("  as the VM's status showed it:");
    println!(
        "  apply → Ready (banlieue: placement, Machine, volumes, seed, define, start): median {:.2}s, max {:.2}s",
        median(ready.clone()),
        max(&ready)
    );
    println!("  Ready → address (hypervisor: guest boot under TCG + DHCP): median {:.2}s, max {:.2}s", median(boot.clone()), max(&boot));
    println!("  apply → address: median {:.2}s, max {:.2}s", median(addressed.clone()), max(&addressed));
    let start = Instant::now();
    for n in &names {
        api.delete(n, &DeleteParams::default()).await?;
    }
    poll_until(Duration::from_secs(600), "every VM gone", || async {
        Ok(lv.domains("default_kvm-")?.is_empty() && lv.volumes("default_kvm-")?.is_empty())
    })
    .await?;
    poll_until(Duration::from_secs(60), "every VM object gone", || async { Ok(api.list(&ListParams::default()).await?.items.is_empty()) }).await?;
    println!("  deleted (ACPI shutdown, undefine, volumes) until libvirtd holds none: {:.1}s", start.elapsed().as_secs_f64());

    // 2. Round trips vcsim → fakepve → kvm → vcsim.
    let mut hops: Vec<Vec<f64>> = vec![Vec::new(); 4];
    for run in 0..runs {
        let name = format!("roamer-{run}");
        let start = Instant::now();
        apply(&client, vm(&name, "vcsim")).await?;
        wait_on(&api, &name, "vcsim", false).await?;
        hops[0].push(start.elapsed().as_secs_f64());
        for (i, (to, address)) in [("fakepve", false), ("kvm", true), ("vcsim", false)].into_iter().enumerate() {
            let t = Instant::now();
            api.patch(&name, &PatchParams::default(), &Patch::Merge(json!({"spec": {"placement": {"providerRef": {"name": to}}}}))).await?;
            wait_on(&api, &name, to, address).await?;
            hops[i + 1].push(t.elapsed().as_secs_f64());
        }
        api.delete(&name, &DeleteParams::default()).await?;
        poll_until(Duration::from_secs(120), "roamer gone", || async { Ok(api.get_opt(&name).await?.is_none()) }).await?;
    }
    let round: Vec<f64> = (0..runs).map(|r| hops[1][r] + hops[2][r] + hops[3][r]).collect();
    println!("one VM across three backends ({runs} round trips; each hop until Ready on the new backend):");
    for (label, h) in ["create on vcsim", "vcsim → fakepve", "fakepve → kvm (with an address)", "kvm → vcsim"].iter().zip(&hops) {
        println!("  {label}: median {:.2}s, max {:.2}s", median(h.clone()), max(h));
    }
    println!("  round trip vcsim → fakepve → kvm → vcsim: median {:.2}s, max {:.2}s", median(round.clone()), max(&round));
    roles.abort();
    Ok(())
}

/// Sample libvirtd until every domain of `names` ran and its guest printed its lease: name →
/// (seconds from `start` to the domain running, to the lease).
fn backend_times(lv: &Libvirtd, names: &[String], start: Instant, limit: Duration) -> anyhow::Result<HashMap<String, (f64, f64)>> {
    let mut running: HashMap<String, f64> = HashMap::new();
    let mut done: HashMap<String, (f64, f64)> = HashMap::new();
    while done.len() < names.len() {
        anyhow::ensure!(start.elapsed() < limit, "{} of {} guests leased within {limit:?}", done.len(), names.len());
        let t = start.elapsed().as_secs_f64();
        let up = lv.virsh(&["list", "--name", "--state-running"])?;
        for name in names {
            let domain = format!("default_{name}");
            if up.lines().any(|l| l.trim() == domain) {
                running.entry(name.clone()).or_insert(t);
            }
            if let Some(&r) = running.get(name)
                && !done.contains_key(name)
                && lv.serial_log(&domain).contains("banlieue-guest: eth0 address=")
            {
                done.insert(name.clone(), (r, t));
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    Ok(done)
}

/// Wait (watch, bounded) until the VM is Ready on `provider` (and, if asked, shows an address).
async fn wait_on(api: &Api<VirtualMachine>, name: &str, provider: &'static str, address: bool) -> anyhow::Result<()> {
    banlieue_tests::control::wait_for(api, name, 300, &format!("Ready on {provider}"), move |v: Option<&VirtualMachine>| {
        v.is_some_and(|v| is_ready(v) && on(v, provider) && (!address || has_address(v)))
    })
    .await
    .map(drop)
}
