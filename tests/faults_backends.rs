//! Sick backends: vSphere (a real vcsim) and Proxmox VE (a real fakepve), each behind a
//! [`FaultProxy`] that the test switches at chosen moments — bursts of HTTP 5xx, timeouts
//! (a blackholed or stalled backend), slow answers, connections reset in the middle of a
//! task, and a backend that makes the VM but answers the clone as failed. Each test checks,
//! through the backend's own API (vim25 on vcsim, the PVE API on fakepve), that:
//!
//! - while the fault lasts, the Machine's and the VM's `Ready` conditions (and the
//!   Provider's, once probed) say what is happening, with a reason and a message naming it;
//! - retries back off: from the proxy's request log, attempts are spaced (never a tight
//!   loop), spaced further each time, bounded, and jittered (machines failing together do
//!   not retry in lockstep);
//! - once the fault clears, everything converges: the VM is Ready with exactly one backend
//!   VM, and after its deletion none.
//!
//! Each test prints its `RELIABILITY` line ([`Tally`]); `BANLIEUE_FAULTS_FULL=1` (`make faults`)
//! runs the full iteration count, `BANLIEUE_FAULTS_SEED` replays a run.
//!
//! libvirt is not here: its protocol is libvirt RPC over a socket, not HTTP, so this proxy
//! cannot stand in front of it. libvirt faults (a libvirtd killed in the middle of create and
//! delete) are covered by the killed-host suite.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use banlieue_api::{Provider, VirtualMachine};
use banlieue_test_backends::fakepve::FakePve;
use banlieue_test_backends::fault_proxy::{Fault, FaultProxy, Request, Seen};
use banlieue_test_backends::vcsim::{self, Vcsim};
use banlieue_tests::backends::{machines, proxmox_fixtures, pve_vm, vm, vsphere_fixtures_at, Names, PveEndpoint, PVE, VCENTER};
use banlieue_tests::control::{wait_for, ControlPlane};
use banlieue_tests::faults::{iterations, Rng, Tally};
use banlieue_tests::{await_deleted, TestEnv};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{json, Value};

// ---------------------------------------------------------------------------------------------
// Conditions

type Cond = (String, String, String);

fn vm_ready(vm: &VirtualMachine) -> Option<Cond> {
    let c = vm.status.as_ref()?.conditions.iter().find(|c| c.type_ == "Ready")?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn provider_ready(p: &Provider) -> Option<Cond> {
    let c = p.status.as_ref()?.conditions.iter().find(|c| c.type_ == "Ready")?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn machine_ready(m: &DynamicObject) -> Option<Cond> {
    let c = m.data["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == "Ready")?;
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    Some((s("status"), s("reason"), s("message")))
}

fn is_ready(vm: Option<&VirtualMachine>) -> bool {
    vm.and_then(vm_ready).is_some_and(|(s, _, _)| s == "True")
}

// ---------------------------------------------------------------------------------------------
// The backends

enum Backend {
    VSphere(Vcsim),
    Proxmox(FakePve),
}

impl Backend {
    fn label(&self) -> &'static str {
        match self {
            Backend::VSphere(_) => "vsphere",
            Backend::Proxmox(_) => "proxmox",
        }
    }

    /// The name the driver gives the backend VM of VM `name`.
    fn vm_name(&self, env: &TestEnv, name: &str) -> String {
        match self {
            Backend::VSphere(_) => format!("{}_{name}", env.ns),
            Backend::Proxmox(_) => format!("{name}.{}", env.ns),
        }
    }

    /// Every VM the backend holds, by name (its own API).
    async fn names(&self) -> anyhow::Result<Vec<String>> {
        Ok(match self {
            Backend::VSphere(vc) => vc.vm_names().await?,
            Backend::Proxmox(pve) => pve.vms().await?.into_iter().map(|v| v.name).collect(),
        })
    }

    /// Backend VMs made for VM `name`.
    async fn count(&self, env: &TestEnv, name: &str) -> anyhow::Result<usize> {
        let want = self.vm_name(env, name);
        Ok(self.names().await?.iter().filter(|n| **n == want).count())
    }

    /// A test of whether a request is the one that makes a backend VM (the clone), for rules.
    fn is_clone(&self) -> impl Fn(&Request) -> bool + Send + Sync + Copy + 'static {
        let vsphere = matches!(self, Backend::VSphere(_));
        move |r: &Request| if vsphere { r.op.as_deref() == Some("CloneVM_Task") } else { r.method == "POST" && r.path.ends_with("/clone") }
    }

    /// A test of whether a request polls a task's state (PVE's task status, vim25's
    /// `RetrievePropertiesEx` of `info.state`), for rules.
    fn is_task_poll(&self) -> impl Fn(&Request) -> bool + Send + Sync + Copy + 'static {
        let vsphere = matches!(self, Backend::VSphere(_));
        move |r: &Request| {
            if vsphere {
                r.op.as_deref() == Some("RetrievePropertiesEx") && r.body.windows(10).any(|w| w == b"info.state")
            } else {
                r.method == "GET" && r.path.contains("/tasks/") && r.path.ends_with("/status")
            }
        }
    }

    fn seen_clone(&self, s: &Seen) -> bool {
        match self {
            Backend::VSphere(_) => s.op.as_deref() == Some("CloneVM_Task"),
            Backend::Proxmox(_) => s.method == "POST" && s.path.ends_with("/clone"),
        }
    }

    /// Whether a logged request is the clone of backend VM `vm_name`.
    fn seen_clone_of(&self, s: &Seen, vm_name: &str) -> bool {
        self.seen_clone(s)
            && match self {
                Backend::VSphere(_) => s.body_has(&format!("<name>{vm_name}</name>")),
                Backend::Proxmox(_) => s.body_has(&format!("name={vm_name}&")),
            }
    }
}

struct Sick {
    env: TestEnv,
    backend: Backend,
    proxy: FaultProxy,
    n: Names,
    provider: &'static str,
    vms: Api<VirtualMachine>,
    machines: Api<DynamicObject>,
    providers: Api<Provider>,
    rng: Rng,
    tally: Tally,
    _cp: ControlPlane,
}

impl Sick {
    async fn vsphere(suite: &'static str) -> anyhow::Result<Sick> {
        let env = TestEnv::start(suite).await?;
        env.install_crds().await?;
        let vc = Vcsim::start().await?;
        let proxy = FaultProxy::start(&vc.url).await?;
        let cp = ControlPlane::start(&env)?;
        let n = vsphere_fixtures_at(&env, &proxy.url_for(&vc.url), vcsim::PASSWORD).await?;
        Sick::ready(env, Backend::VSphere(vc), proxy, cp, n, VCENTER, suite, "VSphere").await
    }

    async fn proxmox(suite: &'static str) -> anyhow::Result<Sick> {
        let env = TestEnv::start(suite).await?;
        env.install_crds().await?;
        let pve = FakePve::start().await?;
        let proxy = FaultProxy::start(&pve.proxy_url).await?;
        let cp = ControlPlane::start(&env)?;
        let n = proxmox_fixtures(&env, &pve, &pve.password.clone(), PveEndpoint::At(proxy.url.clone())).await?;
        Sick::ready(env, Backend::Proxmox(pve), proxy, cp, n, PVE, suite, "Proxmox").await
    }

    #[allow(clippy::too_many_arguments)]
    async fn ready(env: TestEnv, backend: Backend, proxy: FaultProxy, cp: ControlPlane, n: Names, provider: &'static str, suite: &'static str, kind: &str) -> anyhow::Result<Sick> {
        let providers: Api<Provider> = Api::namespaced(env.client.clone(), &env.ns);
        wait_for(&providers, provider, 60, "Provider Ready", |p: Option<&Provider>| p.and_then(provider_ready).is_some_and(|(s, _, _)| s == "True")).await?;
        let vms = Api::namespaced(env.client.clone(), &env.ns);
        let machines = machines(&env, kind);
        let rng = Rng::seeded(suite, 16);
        Ok(Sick { env, backend, proxy, n, provider, vms, machines, providers, rng, tally: Tally::new(suite), _cp: cp })
    }

    fn object(&self, name: &str) -> Value {
        match self.backend {
            Backend::VSphere(_) => vm(&self.env, name, &self.n, VCENTER, json!({})),
            Backend::Proxmox(_) => pve_vm(&self.env, name, &self.n, json!({})),
        }
    }

    async fn apply_vm(&self, name: &str) -> anyhow::Result<()> {
        self.env.apply(self.object(name)).await
    }

    /// Wait until the Machine and the VM of `name` say, with reason `reason`, a message
    /// containing `says`: what a user reads while the fault lasts.
    async fn wait_reported(&self, name: &str, secs: u64, reason: &'static str, says: &'static str) -> anyhow::Result<String> {
        let m = wait_for(&self.machines, name, secs, &format!("Machine Ready=False {reason} ({says})"), move |m: Option<&DynamicObject>| {
            m.and_then(machine_ready).is_some_and(|(s, r, msg)| s == "False" && r == reason && msg.contains(says))
        })
        .await?;
        let (_, _, message) = machine_ready(&m).unwrap_or_default();
        let v = wait_for(&self.vms, name, 30, &format!("VM Ready=False {reason}"), move |v: Option<&VirtualMachine>| {
            v.and_then(vm_ready).is_some_and(|(s, r, _)| s == "False" && r == reason)
        })
        .await?;
        let (_, _, vm_message) = vm_ready(&v).unwrap_or_default();
        assert!(vm_message.contains(says), "{}: the VM's Ready message says what is happening: {vm_message}", self.backend.label());
        Ok(message)
    }

    /// From `cleared` until VM `name` is Ready and the backend holds exactly one VM for it
    /// (a second one is counted as duplicated); the time it took is a converge sample.
    async fn converge(&mut self, name: &str, cleared: Instant) -> anyhow::Result<()> {
        wait_for(&self.vms, name, 120, "Ready after the fault cleared", is_ready).await?;
        let count = self.backend.count(&self.env, name).await?;
        self.tally.converge.push(cleared.elapsed());
        println!("{}: {name} Ready with {count} backend VM(s) {:.2} s after the fault cleared", self.backend.label(), cleared.elapsed().as_secs_f64());
        if count != 1 {
            eprintln!("{}: {name} has {count} backend VMs: {:?}", self.backend.label(), self.backend.names().await?);
        }
        assert!(count >= 1, "{}: {name} is Ready with no backend VM", self.backend.label());
        self.tally.duplicated += count.saturating_sub(1);
        Ok(())
    }

    /// Delete VM `name` (no fault) and count what the backend kept of it.
    async fn delete(&mut self, name: &str) -> anyhow::Result<()> {
        self.vms.delete(name, &Default::default()).await?;
        await_deleted(&self.vms, name).await?;
        await_deleted(&self.machines, name).await?;
        let left = self.backend.count(&self.env, name).await?;
        if left != 0 {
            eprintln!("{}: {name} left {left} backend VMs after deletion", self.backend.label());
        }
        self.tally.leaked += left;
        Ok(())
    }

    /// VM destructions so far: PVE's own `qmdestroy` tasks on every node; for vSphere
    /// (vcsim keeps no task history) the `Destroy_Task` calls that reached it.
    async fn destroys(&self) -> anyhow::Result<usize> {
        Ok(match &self.backend {
            Backend::VSphere(_) => self.proxy.log().iter().filter(|r| r.op.as_deref() == Some("Destroy_Task")).count(),
            Backend::Proxmox(pve) => {
                let mut n = 0;
                for node in ["pve1", "pve2"] {
                    n += pve.tasks(node).await?.iter().filter(|t| t["type"] == "qmdestroy").count();
                }
                n
            }
        })
    }

    async fn nudge(&self, value: &str) -> anyhow::Result<()> {
        let patch = json!({"metadata": {"annotations": {"banlieue-tests/nudge": value}}});
        self.providers.patch(self.provider, &PatchParams::default(), &Patch::Merge(patch)).await?;
        Ok(())
    }

    fn report(mut self, backend_vms_before: usize, backend_vms_after: usize) {
        self.tally.faults = self.proxy.faults();
        // Anything else the backend gained over the whole run was leaked too.
        self.tally.leaked = self.tally.leaked.max(backend_vms_after.saturating_sub(backend_vms_before));
        println!("{}: faults injected by kind: {:?}, requests: {}", self.tally.suite, self.proxy.faults_by_kind(), self.proxy.requests());
        self.tally.report();
    }
}

/// The times of the clone attempts of backend VM `vm_name` in the proxy's log.
fn clone_attempts(s: &Sick, vm_name: &str) -> Vec<Instant> {
    s.proxy.log().iter().filter(|r| s.backend.seen_clone_of(r, vm_name)).map(|r| r.at).collect()
}

fn gaps(times: &[Instant]) -> Vec<Duration> {
    times.windows(2).map(|w| w[1] - w[0]).collect()
}

// ---------------------------------------------------------------------------------------------
// The phases

/// A burst of HTTP 503 on every clone, for two VMs at once: both Machines say the backend is
/// unavailable and why; each one's clone attempts back off (spaced, growing, bounded) and the
/// two do not retry in lockstep. Then the burst spreads to every request and the Provider,
/// probed, says so too. After it clears: both Ready, one backend VM each.
async fn burst_of_5xx(s: &mut Sick, i: usize) -> anyhow::Result<()> {
    let names = [format!("burst-{i}-a"), format!("burst-{i}-b")];
    let window = Duration::from_millis(s.rng.between(7_000, 10_000));
    // A Provider still recovering from the last fault would wake its Machines when it does
    // (an extra, immediate attempt): start from a Provider probed Ready.
    s.nudge(&format!("before-burst-{i}")).await?;
    wait_for(&s.providers, s.provider, 90, "Provider Ready", |p: Option<&Provider>| p.and_then(provider_ready).is_some_and(|(st, _, _)| st == "True")).await?;
    s.proxy.set_when(s.backend.is_clone(), Fault::Status(503));
    let start = Instant::now();
    for name in &names {
        s.apply_vm(name).await?;
    }
    for name in &names {
        let message = s.wait_reported(name, 30, "BackendUnavailable", "HTTP 503").await?;
        println!("{}: while clones fail: {message}", s.backend.label());
        // What a user acts on: the backend's status and answer, not a parser's complaint.
        assert!(!message.contains("malformed"), "{}: a 503 is reported as what it is: {message}", s.backend.label());
    }
    tokio::time::sleep(window.saturating_sub(start.elapsed())).await;

    // Every request fails now, and the Provider, probed, says so.
    s.proxy.set(|_| Fault::Status(503));
    s.nudge(&format!("burst-{i}")).await?;
    let p = wait_for(&s.providers, s.provider, 30, "Provider Ready=False BackendUnavailable naming the 503", |p: Option<&Provider>| {
        p.and_then(provider_ready).is_some_and(|(st, r, m)| st == "False" && r == "BackendUnavailable" && m.contains("503"))
    })
    .await?;
    let (_, _, message) = provider_ready(&p).unwrap_or_default();
    assert!(message.contains("503"), "{}: the Provider's message names the backend's answer: {message}", s.backend.label());
    let failing = start.elapsed();
    s.proxy.clear();
    let cleared = Instant::now();

    let mut lockstep = Vec::new();
    let per_vm: Vec<Vec<Instant>> = names.iter().map(|n| clone_attempts(s, &s.backend.vm_name(&s.env, n))).collect();
    for (name, attempts) in names.iter().zip(&per_vm) {
        let g = gaps(attempts);
        println!("{}: {name}: {} clone attempts in {failing:.1?}, gaps {g:.2?}", s.backend.label(), attempts.len());
        assert!(attempts.len() >= 2, "{name}: retried during the burst: {g:?}");
        // Backoff: 1 s, 2 s, 4 s … (jittered down to half): never a tight loop, and bounded.
        assert!(g.iter().all(|d| *d >= Duration::from_millis(400)), "{name}: retries are spaced, not a tight loop: {g:?}");
        let bound = 2 + (failing.as_secs_f64() / 0.4).log2().ceil() as usize;
        assert!(attempts.len() <= bound + 1, "{name}: at most ~log2(burst) attempts ({bound}), saw {}: {g:?}", attempts.len());
        if g.len() >= 3 {
            assert!(g[g.len() - 1] > g[0], "{name}: the spacing grows: {g:?}");
        }
    }
    // Jitter: two machines failing together drift apart instead of retrying in lockstep.
    let (a, b) = (gaps(&per_vm[0]), gaps(&per_vm[1]));
    for (x, y) in a.iter().zip(&b) {
        lockstep.push(if x > y { *x - *y } else { *y - *x });
    }
    let drift = lockstep.iter().max().copied().unwrap_or_default();
    println!("{}: retry gaps of the two machines differ by up to {drift:.2?}", s.backend.label());
    // Without jitter the two drift by a millisecond or so (the reconciles' own noise); with it,
    // by more than 50 ms on at least one of three or more gaps but for ~0.1% of runs.
    assert!(drift >= Duration::from_millis(50), "{}: two machines failing together retry in lockstep (gaps {a:?} vs {b:?}): backoff is not jittered", s.backend.label());

    for name in &names {
        s.converge(name, cleared).await?;
    }
    for name in &names {
        s.delete(name).await?;
    }
    Ok(())
}

/// The clone goes through, then every request after it (the task's polls, the VM's reads) is
/// reset: the Machine and the VM say so while it lasts; once it clears, one backend VM.
async fn resets_mid_task(s: &mut Sick, i: usize) -> anyhow::Result<()> {
    let name = format!("reset-{i}");
    let cloned = Arc::new(AtomicUsize::new(0));
    let is_clone = s.backend.is_clone();
    let seen = cloned.clone();
    s.proxy.set(move |r| {
        if is_clone(r) {
            seen.fetch_add(1, Ordering::SeqCst);
            Fault::Pass
        } else if seen.load(Ordering::SeqCst) > 0 {
            Fault::Reset
        } else {
            Fault::Pass
        }
    });
    s.apply_vm(&name).await?;
    let message = s.wait_reported(&name, 60, "BackendUnavailable", "request to").await?;
    println!("{}: after a reset mid-task: {message}", s.backend.label());
    // Held a little longer, a random while, so retries meet the resets too.
    tokio::time::sleep(Duration::from_millis(s.rng.between(500, 3_000))).await;
    s.proxy.clear();
    let cleared = Instant::now();
    s.converge(&name, cleared).await?;
    s.delete(&name).await
}

/// Every answer late by 0.2–1.5 s: slower, never wrong.
async fn slow_answers(s: &mut Sick, i: usize) -> anyhow::Result<()> {
    let name = format!("slow-{i}");
    let (lo, hi) = (s.rng.between(100, 400), s.rng.between(800, 1_500));
    let seed = Arc::new(AtomicUsize::new(s.rng.next() as usize));
    s.proxy.set(move |_| {
        // A cheap per-request draw (xorshift on a shared counter).
        let mut x = seed.fetch_add(0x9e37_79b9, Ordering::SeqCst) as u64;
        x ^= x << 13;
        x ^= x >> 7;
        Fault::Latency(Duration::from_millis(lo + x % (hi - lo).max(1)))
    });
    let applied = Instant::now();
    s.apply_vm(&name).await?;
    s.converge(&name, applied).await?;
    s.proxy.clear();
    s.delete(&name).await
}

/// The backend stops answering — accepts and reads, never answers (blackhole) or sends half an
/// answer and holds (stall): the call gives up within the request time limit, the Machine says
/// the backend does not answer, and the reconcile is not stuck.
async fn timeouts(s: &mut Sick, i: usize) -> anyhow::Result<()> {
    let name = format!("timeout-{i}");
    // Each provider meets both kinds over two iterations (and one each in a short run).
    let first = matches!(s.backend, Backend::VSphere(_));
    let (fault, says) =
        if (i % 2 == 0) == first { (Fault::Blackhole, "did not answer within") } else { (Fault::Stall, "did not finish the response within") };
    s.proxy.set(move |_| fault);
    s.apply_vm(&name).await?;
    // Bounded: the host's request limit (30 s) plus a reconcile.
    let message = s.wait_reported(&name, 75, "BackendUnavailable", says).await?;
    println!("{}: while the backend {:?}s: {message}", s.backend.label(), fault);
    s.proxy.clear();
    let cleared = Instant::now();
    s.converge(&name, cleared).await?;
    s.delete(&name).await
}

/// The clone is forwarded (the backend makes the VM) but answered as failed: the VM made
/// anyway is found and adopted on the retry, not made a second time; deleting the VM removes it.
async fn forward_then_fail(s: &mut Sick, i: usize) -> anyhow::Result<()> {
    let name = format!("orphan-{i}");
    let once = Arc::new(AtomicUsize::new(0));
    let is_clone = s.backend.is_clone();
    let code = [500, 502, 503][i % 3];
    let o = once.clone();
    s.proxy.set(move |r| {
        if is_clone(r) && o.fetch_add(1, Ordering::SeqCst) == 0 { Fault::ForwardThenFail(code) } else { Fault::Pass }
    });
    s.apply_vm(&name).await?;
    let cleared = Instant::now();
    s.converge(&name, cleared).await?;
    let vm_name = s.backend.vm_name(&s.env, &name);
    let clones = clone_attempts(s, &vm_name).len();
    println!("{}: {name}: {clones} clone request(s), the first answered {code} after the backend acted", s.backend.label());
    s.proxy.clear();
    s.delete(&name).await
}

/// The clone goes through but the first poll of its task answers 503: how the clone ended is
/// unknown, so the VM it made must be kept and adopted on the retry — cloned once, never
/// destroyed (the Proxmox driver used to destroy it as a failed clone, and clone again).
async fn lost_task_poll(s: &mut Sick, i: usize) -> anyhow::Result<()> {
    let name = format!("lost-poll-{i}");
    // 0: before the clone; 1: the next task poll fails; 2: after it.
    let step = Arc::new(AtomicUsize::new(0));
    let (is_clone, is_task_poll) = (s.backend.is_clone(), s.backend.is_task_poll());
    let st = step.clone();
    s.proxy.set(move |r| {
        if is_clone(r) {
            let _ = st.compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst);
            Fault::Pass
        } else if is_task_poll(r) && st.compare_exchange(1, 2, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            Fault::Status(503)
        } else {
            Fault::Pass
        }
    });
    let destroys_before = s.destroys().await?;
    s.apply_vm(&name).await?;
    let cleared = Instant::now();
    s.converge(&name, cleared).await?;
    assert_eq!(step.load(Ordering::SeqCst), 2, "{}: the clone's task poll was failed", s.backend.label());
    let vm_name = s.backend.vm_name(&s.env, &name);
    let clones = clone_attempts(s, &vm_name).len();
    assert_eq!(clones, 1, "{}: {name}: one clone, the VM it made adopted after the lost poll", s.backend.label());
    assert_eq!(s.destroys().await?, destroys_before, "{}: no VM was destroyed meanwhile", s.backend.label());
    s.proxy.clear();
    s.delete(&name).await
}

async fn sick_backend(mut s: Sick, short: usize, full: usize) -> anyhow::Result<()> {
    let before = s.backend.names().await?.len();
    let n = iterations(short, full);
    s.tally.iterations = n;
    for i in 0..n {
        burst_of_5xx(&mut s, i).await?;
        resets_mid_task(&mut s, i).await?;
        slow_answers(&mut s, i).await?;
        forward_then_fail(&mut s, i).await?;
        lost_task_poll(&mut s, i).await?;
        timeouts(&mut s, i).await?;
    }
    let after = s.backend.names().await?.len();
    s.report(before, after);
    Ok(())
}

#[tokio::test]
async fn vsphere_on_a_sick_vcenter_converges_with_one_vm_per_machine() -> anyhow::Result<()> {
    let s = Sick::vsphere("faults-vsphere").await?;
    sick_backend(s, 1, 6).await
}

#[tokio::test]
async fn proxmox_on_a_sick_cluster_converges_with_one_vm_per_machine() -> anyhow::Result<()> {
    let s = Sick::proxmox("faults-proxmox").await?;
    sick_backend(s, 1, 6).await
}
