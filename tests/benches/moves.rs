//! Moves that carry a VM's disk, measured through the whole control plane on the real
//! backends, against the same bytes moved by hand in the same run:
//!
//! For each disk size in BENCH_SIZES_GIB (default `1,4`), BENCH_RUNS times (default 3), a
//! powered-off VM on libvirtd whose disk holds random data over its first
//! min(size, BENCH_DATA_GIB_MAX = 2) GiB and zeros after (a qcow2 of that virtual size):
//!
//! 1. **libvirt → libvirt** (two storage pools of libvirtd): the VM's `spec.placement` changed,
//!    the phases it shows timed through a watch (`Exporting`, `Converting`, `Importing`, then to
//!    Ready); beside it, by hand: `virsh vol-download`, `qemu-img convert -O qcow2`,
//!    `virsh vol-create-as` + `vol-upload` into the other pool.
//! 2. **libvirt → vcsim** (the VM moved on to vSphere): the same phases; by hand, a `curl`
//!    upload of the raw disk to vcsim's datastore (after the same download and a
//!    `qemu-img convert -O raw`).
//!
//! MiB/s of each phase is the disk's virtual size over the phase's time (what a user waits
//! per GiB of disk); the host's peak RSS during each move (this process runs every role),
//! against its RSS before: bounded, whatever the disk's size. Medians.
//!
//! `cargo bench -p banlieue-tests --bench moves` (needs root for libvirtd, `guests/build.sh`,
//! vcsim; about 6 × BENCH_DATA_GIB_MAX GiB free in /tmp and /var/tmp).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use banlieue_api::vm::MovePhase;
use banlieue_api::VirtualMachine;
use banlieue_test_backends::libvirtd::Libvirtd;
use banlieue_test_backends::vcsim::{self, Vcsim};
use banlieue_tests::backends::{libvirtd_fixtures, libvirtd_provider, provider_class, secret, vm, vm_class, Names, KVM, VCENTER};
use banlieue_tests::bench::{env_or, median};
use banlieue_tests::control::{wait_for, ControlPlane};
use banlieue_tests::TestEnv;
use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{watcher, WatchStreamExt};
use serde_json::json;

fn main() -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(bench())
}

fn ready(v: Option<&VirtualMachine>) -> bool {
    v.and_then(|v| v.status.as_ref()).is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// This process's resident set now, in KiB.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("VmRSS:").and_then(|v| v.split_whitespace().next()?.parse().ok())))
        .unwrap_or(0)
}

fn run(cmd: &str, args: &[&str]) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let out = std::process::Command::new(cmd).args(args).output()?;
    anyhow::ensure!(out.status.success(), "{cmd} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    Ok(start.elapsed())
}

/// Seconds of each phase of one move, its peak RSS, and the total to Ready on `provider`.
struct Moved {
    phases: BTreeMap<&'static str, f64>,
    total: f64,
    peak_rss_kib: u64,
}

/// Move `name` to `provider` and time what the VM shows, sampling this process's RSS.
async fn time_move(vms: &Api<VirtualMachine>, name: &str, provider: &str) -> anyhow::Result<Moved> {
    let peak = Arc::new(AtomicU64::new(rss_kib()));
    let sampler = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                peak.fetch_max(rss_kib(), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let events = watcher(vms.clone(), watcher::Config::default().fields(&format!("metadata.name={name}"))).applied_objects().boxed();
    let start = Instant::now();
    vms.patch(name, &PatchParams::default(), &Patch::Merge(json!({"spec": {"placement": {"providerRef": {"name": provider}}}}))).await?;
    let mut seen: Vec<(MovePhase, Instant)> = Vec::new();
    let mut events = events;
    let done = tokio::time::timeout(Duration::from_secs(3600), async {
        while let Some(v) = events.next().await {
            let v = v?;
            let st = v.status.clone().unwrap_or_default();
            if let Some(m) = &st.moving {
                anyhow::ensure!(m.phase != MovePhase::Failed, "the move failed: {:?}", m.message);
                if seen.last().map(|s| s.0) != Some(m.phase) {
                    seen.push((m.phase, Instant::now()));
                }
            }
            let placed = st.scheduled.as_ref().is_some_and(|s| s.provider == provider);
            if placed && ready(Some(&v)) && st.moving.is_none() {
                return Ok(Instant::now());
            }
        }
        anyhow::bail!("the watch ended")
    })
    .await??;
    sampler.abort();
    let mut phases = BTreeMap::new();
    for (i, (phase, at)) in seen.iter().enumerate() {
        let until = seen.get(i + 1).map(|s| s.1).unwrap_or(done);
        let name = match phase {
            MovePhase::PoweringOff => "powering off",
            MovePhase::Exporting => "exporting",
            MovePhase::Converting => "converting",
            MovePhase::Importing => "importing",
            MovePhase::Starting => "starting",
            MovePhase::RemovingSource => "removing the source",
            MovePhase::Failed => "failed",
        };
        *phases.entry(name).or_insert(0.0) += until.duration_since(*at).as_secs_f64();
    }
    Ok(Moved { phases, total: done.duration_since(start).as_secs_f64(), peak_rss_kib: peak.load(Ordering::Relaxed) })
}

async fn bench() -> anyhow::Result<()> {
    let sizes: Vec<u64> = std::env::var("BENCH_SIZES_GIB").unwrap_or_else(|_| "1,4".into()).split(',').filter_map(|s| s.trim().parse().ok()).collect();
    let runs: usize = env_or("BENCH_RUNS", 3);
    let data_max: u64 = env_or("BENCH_DATA_GIB_MAX", 2);
    let env = TestEnv::start("bench-moves").await?;
    env.install_crds().await?;
    let lv = Libvirtd::shared()?;
    let vc = Vcsim::start().await?;
    let _cp = ControlPlane::start(&env)?;
    let n = libvirtd_fixtures(&env, lv).await?;
    let other = lv.add_pool(&format!("{}-b", env.ns))?;
    let mut kvm_b = libvirtd_provider(&env, lv, "kvm-b", &n.provider_class);
    kvm_b["spec"]["capabilities"]["storageClasses"]["standard"] = json!(other.name);
    env.apply(kvm_b).await?;
    let vsphere = format!("{}-vsphere", env.ns);
    let mut class = provider_class(&vsphere, "provider-vsphere", "VSphere");
    class["spec"]["imageFormat"] = json!("vmdk");
    env.apply(class).await?;
    env.apply(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": n.image},
                     "spec": {"sources": [{"providerClass": n.provider_class, "backingFile": lv.guest_disk()}, {"providerClass": vsphere, "template": vcsim::TEMPLATE}]}}))
        .await?;
    env.apply(secret(&env, "vcenter-credentials", &[("username", vcsim::USERNAME), ("password", vcsim::PASSWORD)])).await?;
    env.apply(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": VCENTER, "namespace": env.ns},
                     "spec": {"providerClassRef": {"name": vsphere},
                              "connection": {"endpoint": vc.url, "credentialsRef": {"kind": "Secret", "name": "vcenter-credentials", "keys": ["username", "password"]}},
                              "capabilities": {"storageClasses": {"standard": "LocalDS_0"}, "networkClasses": {"default": "VM Network"}}}}))
        .await?;
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    let work = tempfile::tempdir_in("/var/tmp")?;
    println!("moves that carry the disk: {} run(s) per size; libvirtd pools {} → {}, then vcsim", runs, lv.pool, other.name);

    for gib in sizes {
        let class = format!("{}-disk-{gib}", env.ns);
        env.apply(vm_class(&class, 1, 256, gib, "standard", 30)).await?;
        let names = Names { provider_class: n.provider_class.clone(), vm_class: class, image: n.image.clone() };
        // The disk's content: random bytes over its first `data` GiB (all of it, up to
        // BENCH_DATA_GIB_MAX), zeros after (holes, as in a disk not full), as a qcow2.
        let data = gib.min(data_max);
        let raw = work.path().join(format!("random-{gib}.raw"));
        let qcow2 = work.path().join(format!("random-{gib}.qcow2"));
        run("sh", &["-c", &format!("head -c {} /dev/urandom > {} && truncate -s {} {}", data << 30, raw.display(), gib << 30, raw.display())])?;
        run("qemu-img", &["convert", "-f", "raw", "-O", "qcow2", &raw.display().to_string(), &qcow2.display().to_string()])?;
        std::fs::remove_file(&raw)?;
        let mut results: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        let mut rss = Vec::new();
        let mut peaks = Vec::new();
        for r in 0..runs {
            let name = format!("m{gib}g{r}");
            env.apply(vm(&env, &name, &names, KVM, json!({"desiredPowerState": "PoweredOff"}))).await?;
            wait_for(&vms, &name, 120, "Ready", ready).await?;
            let domain = format!("{}_{name}", env.ns);
            let volume = format!("{domain}_root.qcow2");
            lv.virsh(&["vol-upload", "--pool", &lv.pool, &volume, &qcow2.display().to_string()])?;

            // By hand: the same disk to the other pool, then to vcsim's datastore.
            // (Each file goes as soon as the next step has it: a 4 GiB disk three times over
            // does not fit on these machines.)
            let down = work.path().join("down.qcow2");
            let t_down = run("virsh", &["-c", &lv.uri, "vol-download", "--pool", &lv.pool, &volume, &down.display().to_string()])?;
            let conv = work.path().join("conv.qcow2");
            let t_conv = run("qemu-img", &["convert", "-O", "qcow2", &down.display().to_string(), &conv.display().to_string()])?;
            std::fs::remove_file(&down)?;
            let size = std::fs::metadata(&conv)?.len();
            let by_hand_vol = format!("byhand-{name}.qcow2");
            let t_up = run("virsh", &["-c", &lv.uri, "vol-create-as", &other.name, &by_hand_vol, &size.to_string(), "--format", "raw"])?
                + run("virsh", &["-c", &lv.uri, "vol-upload", "--pool", &other.name, &by_hand_vol, &conv.display().to_string()])?;
            lv.virsh(&["vol-delete", "--pool", &other.name, &by_hand_vol])?;
            let flat = work.path().join("flat.raw");
            let t_raw = run("qemu-img", &["convert", "-O", "raw", &conv.display().to_string(), &flat.display().to_string()])?;
            std::fs::remove_file(&conv)?;
            let start = Instant::now();
            // One file per size, overwritten by each run: vcsim keeps what it is sent until it stops.
            let code = vc.datastore_put_with_curl(&format!("[LocalDS_0] byhand/{gib}g-flat.vmdk"), &flat).await?;
            anyhow::ensure!(code == "200", "curl upload to vcsim: HTTP {code}");
            let t_curl = start.elapsed();
            std::fs::remove_file(&flat)?;
            let mib = (gib << 10) as f64;
            for (what, t) in [("virsh vol-download", t_down), ("qemu-img convert qcow2", t_conv), ("virsh vol-create-as + vol-upload", t_up), ("qemu-img convert raw", t_raw), ("curl PUT to vcsim", t_curl)] {
                results.entry(format!("by hand: {what} (s)")).or_default().push(t.as_secs_f64());
            }
            results.entry("by hand: virsh vol-download".into()).or_default().push(mib / t_down.as_secs_f64());
            results.entry("by hand: qemu-img convert qcow2".into()).or_default().push(mib / t_conv.as_secs_f64());
            results.entry("by hand: virsh vol-create-as + vol-upload".into()).or_default().push(mib / t_up.as_secs_f64());
            results.entry("by hand: qemu-img convert raw".into()).or_default().push(mib / t_raw.as_secs_f64());
            results.entry("by hand: curl PUT to vcsim".into()).or_default().push(mib / t_curl.as_secs_f64());
            results.entry("by hand: libvirt → libvirt total (s)".into()).or_default().push((t_down + t_conv + t_up).as_secs_f64());
            results.entry("by hand: libvirt → vcsim total (s)".into()).or_default().push((t_down + t_raw + t_curl).as_secs_f64());

            let before = rss_kib();
            let to_pool = time_move(&vms, &name, "kvm-b").await?;
            let to_vc = time_move(&vms, &name, VCENTER).await?;
            let peak = to_pool.peak_rss_kib.max(to_vc.peak_rss_kib);
            rss.push((peak as f64 - before as f64) / 1024.0);
            peaks.push(peak as f64 / 1024.0);
            for (leg, m) in [("libvirt → libvirt", &to_pool), ("libvirt → vcsim", &to_vc)] {
                for (phase, secs) in &m.phases {
                    results.entry(format!("banlieue {leg}: {phase} (s)")).or_default().push(*secs);
                    if matches!(*phase, "exporting" | "importing") {
                        results.entry(format!("banlieue {leg}: {phase}")).or_default().push(mib / secs.max(1e-3));
                    }
                }
                results.entry(format!("banlieue {leg}: total (s)")).or_default().push(m.total);
            }
            vms.delete(&name, &Default::default()).await?;
            banlieue_tests::await_deleted(&vms, &name).await?;
        }
        std::fs::remove_file(&qcow2)?;
        println!("\n{gib} GiB disk ({data} GiB of random data), medians of {runs}; MiB/s of the disk's virtual size:");
        for (what, values) in &results {
            let unit = if what.ends_with("(s)") { "s" } else { "MiB/s" };
            println!("  {what:<48} {:>9.1} {unit}", median(values.clone()));
        }
        println!("  {:<48} {:>9.1} MiB", "host RSS growth during the moves (peak)", median(rss));
        println!("  {:<48} {:>9.1} MiB", "host RSS during the moves (peak)", median(peaks));
    }
    drop(other);
    Ok(())
}
