//! Consoles, measured through the whole path — `kubectl vm`, the console server, the
//! cluster's TokenReview and SubjectAccessReview, the driver, the backend's console — against
//! the tool a user would otherwise use by hand, in the same run:
//!
//! 1. libvirtd + qemu (the test guest's shell on ttyS0), BENCH_RUNS times (default 5):
//!    **open** — from starting `kubectl vm console` (a newline typed every 50 ms) to the
//!    shell's prompt on stdout — and **throughput** — the guest printing BENCH_BYTES bytes
//!    (default 1,000,000) to its serial console, timed until the end mark — beside the same
//!    with `virsh console` (under `script`, for the terminal it wants). Medians.
//! 2. fakepve: open, to termproxy's first bytes (a `termproxy` ticket, the websocket, the
//!    login line), BENCH_RUNS times.
//! 3. BENCH_SESSIONS idle serial sessions (default 100) on one fakepve VM, each a
//!    `kubectl vm console` process (opened one after another): the bench process's (the control plane's) resident memory
//!    and CPU over BENCH_IDLE_SECS seconds (default 20) with none open and with all open.
//!
//! `cargo bench --profile dev -p banlieue-tests --bench consoles` (needs root for libvirtd,
//! `guests/build.sh`, fakepve and `cargo build -p kubectl-vm`).

use std::time::{Duration, Instant};

use banlieue_api::common::PowerState;
use banlieue_api::VirtualMachine;
use banlieue_test_backends::fakepve::FakePve;
use banlieue_test_backends::libvirtd::Libvirtd;
use banlieue_tests::backends::{libvirtd_fixtures, proxmox_fixtures, pve_vm, vm, PveEndpoint, KVM};
use banlieue_tests::bench::{env_or, median};
use banlieue_tests::control::{is_powered, path_with_workspace_binaries, wait_for, ControlPlane};
use banlieue_tests::TestEnv;
use kube::api::Api;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

fn main() -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(bench())
}

/// A console client process: its stdin, and what it printed on stdout so far.
struct Session {
    child: Child,
    stdin: tokio::process::ChildStdin,
    out: tokio::sync::watch::Receiver<String>,
    err: tokio::sync::watch::Receiver<String>,
}

/// What a stream says, as it comes.
fn read_all(mut stream: impl tokio::io::AsyncRead + Unpin + Send + 'static) -> tokio::sync::watch::Receiver<String> {
    let (tx, rx) = tokio::sync::watch::channel(String::new());
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = stream.read(&mut buf).await {
            if n == 0 {
                break;
            }
            tx.send_modify(|s| s.push_str(&String::from_utf8_lossy(&buf[..n])));
        }
    });
    rx
}

impl Session {
    fn spawn(mut cmd: Command) -> anyhow::Result<Session> {
        cmd.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).kill_on_drop(true);
        let mut child = cmd.spawn()?;
        let stdin = child.stdin.take().expect("stdin");
        let (out, err) = (read_all(child.stdout.take().expect("stdout")), read_all(child.stderr.take().expect("stderr")));
        Ok(Session { child, stdin, out, err })
    }

    /// Wait until stdout holds `text` (bounded); the seconds from `since`.
    async fn until(&mut self, text: &str, since: Instant, limit: Duration) -> anyhow::Result<f64> {
        let waited = tokio::time::timeout(limit, self.out.wait_for(|s| s.contains(text))).await.map(|r| r.map(drop));
        match waited {
            Ok(Ok(())) => Ok(since.elapsed().as_secs_f64()),
            _ => {
                let tail: String = self.out.borrow().chars().rev().take(300).collect::<Vec<_>>().into_iter().rev().collect();
                anyhow::bail!("{text:?} did not come within {limit:?}: {tail:?} (stderr: {:?})", self.err.borrow())
            }
        }
    }

    /// Leave (Ctrl-]) and wait for the process.
    async fn leave(mut self) -> anyhow::Result<()> {
        self.stdin.write_all(&[0x1d]).await?;
        if tokio::time::timeout(Duration::from_secs(15), self.child.wait()).await.is_err() {
            self.child.kill().await?;
        }
        Ok(())
    }
}

fn kubectl_vm(env: &TestEnv, args: &[&str]) -> Command {
    let path = path_with_workspace_binaries();
    let plugin = std::path::Path::new(path.split(':').next().unwrap_or_default()).join("kubectl-vm");
    let mut cmd = Command::new(plugin);
    cmd.arg("-n").arg(&env.ns).args(args).env("KUBECONFIG", &env.kubeconfig);
    cmd
}

fn virsh_console(lv: &Libvirtd, domain: &str) -> Command {
    let mut cmd = Command::new("script");
    cmd.args(["-qfec", &format!("virsh -c {} console {domain}", lv.uri), "/dev/null"]);
    cmd
}

/// Open a console, a newline typed every 50 ms until the shell answers (virsh drops what
/// was typed before it put the terminal in raw mode): seconds to the shell's prompt.
async fn open(cmd: Command) -> anyhow::Result<(f64, Session)> {
    let start = Instant::now();
    let mut s = Session::spawn(cmd)?;
    loop {
        s.stdin.write_all(b"\n").await?;
        if let Ok(secs) = s.until("# ", start, Duration::from_millis(50)).await {
            return Ok((secs, s));
        }
        anyhow::ensure!(start.elapsed() < Duration::from_secs(60), "no prompt within 60 s: {:?}", s.out.borrow());
    }
}

/// The guest prints `bytes` bytes to its console: bytes per second until the end mark.
async fn throughput(s: &mut Session, bytes: usize, run: usize) -> anyhow::Result<f64> {
    let start = Instant::now();
    s.stdin.write_all(format!("head -c {bytes} /dev/zero | tr '\\0' x; echo; echo done-{run}-$((6*7))\n").as_bytes()).await?;
    let secs = s.until(&format!("done-{run}-42"), start, Duration::from_secs(600)).await?;
    Ok(bytes as f64 / secs)
}

/// The process's resident memory (KiB) and CPU time (seconds) so far.
fn usage() -> (u64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let rss = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()).unwrap_or(0);
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or_default().split_whitespace().collect();
    let ticks: f64 = fields.get(11..13).map(|f| f.iter().filter_map(|v| v.parse::<f64>().ok()).sum()).unwrap_or(0.0);
    (rss, ticks / 100.0)
}

/// CPU seconds per second over `secs` idle seconds, and the RSS at the end.
async fn idle(secs: u64) -> (f64, u64) {
    let (_, cpu0) = usage();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let (rss, cpu1) = usage();
    ((cpu1 - cpu0) / secs as f64, rss)
}

async fn bench() -> anyhow::Result<()> {
    let runs: usize = env_or("BENCH_RUNS", 5);
    let bytes: usize = env_or("BENCH_BYTES", 1_000_000);
    let sessions: usize = env_or("BENCH_SESSIONS", 100);
    let idle_secs: u64 = env_or("BENCH_IDLE_SECS", 20);
    let env = TestEnv::start("bench-consoles").await?;
    env.install_crds().await?;
    let _cp = ControlPlane::start_with(&env, |o| {
        if let Some(c) = &mut o.consoles {
            c.limits.per_vm = sessions + 10;
            c.limits.per_user = sessions + 10;
        }
    })?;
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);

    // 1. libvirtd + qemu.
    let lv = Libvirtd::shared()?;
    let domain = format!("{}_web", env.ns);
    let _leftovers = banlieue_test_backends::libvirtd::Leftovers { lv, prefix: format!("{}_", env.ns), volumes: vec![] };
    let n = libvirtd_fixtures(&env, lv).await?;
    env.apply(vm(&env, "web", &n, KVM, json!({}))).await?;
    wait_for(&vms, "web", 300, "running", is_powered(PowerState::PoweredOn)).await?;
    lv.await_serial(&domain, "banlieue-guest: ready", 300).await?;
    let (mut open_ours, mut open_virsh, mut rate_ours, mut rate_virsh) = (vec![], vec![], vec![], vec![]);
    for run in 0..runs {
        let (secs, mut s) = open(kubectl_vm(&env, &["console", "web"])).await?;
        open_ours.push(secs);
        rate_ours.push(throughput(&mut s, bytes, run).await?);
        s.leave().await?;
        let (secs, mut s) = open(virsh_console(lv, &domain)).await?;
        open_virsh.push(secs);
        rate_virsh.push(throughput(&mut s, bytes, run).await?);
        s.leave().await?;
    }
    println!("libvirtd + qemu (TCG), {runs} runs, medians:");
    println!("  open, command → the shell's prompt: kubectl vm console {:.3} s   virsh console {:.3} s", median(open_ours), median(open_virsh));
    println!("  serial output, {bytes} bytes: kubectl vm console {:.0} KiB/s   virsh console {:.0} KiB/s", median(rate_ours) / 1024.0, median(rate_virsh) / 1024.0);

    // 2. fakepve: open to termproxy's first bytes.
    let pve = FakePve::start().await?;
    let n = proxmox_fixtures(&env, &pve, &pve.password, PveEndpoint::Https).await?;
    env.apply(pve_vm(&env, "pve", &n, json!({}))).await?;
    wait_for(&vms, "pve", 120, "running", is_powered(PowerState::PoweredOn)).await?;
    let mut open_pve = vec![];
    for _ in 0..runs {
        let start = Instant::now();
        let mut s = Session::spawn(kubectl_vm(&env, &["console", "pve"]))?;
        open_pve.push(s.until("starting serial terminal", start, Duration::from_secs(60)).await?);
        s.leave().await?;
    }
    println!("fakepve, {runs} runs: open, command → termproxy's first bytes {:.3} s (median)", median(open_pve));

    // 3. Idle sessions: what each costs the control plane.
    let (cpu_none, rss_none) = idle(idle_secs).await;
    let mut open_sessions = Vec::with_capacity(sessions);
    let start = Instant::now();
    // One after another: fakepve keeps one console ticket per VM (PVE's own are signed and
    // independent), so tickets asked for at once would replace each other.
    for _ in 0..sessions {
        let mut s = Session::spawn(kubectl_vm(&env, &["console", "pve"]))?;
        s.until("starting serial terminal", start, Duration::from_secs(300)).await?;
        open_sessions.push(s);
    }
    let opened = start.elapsed().as_secs_f64();
    let (cpu_all, rss_all) = idle(idle_secs).await;
    println!("{sessions} idle serial sessions on one fakepve VM (opened in {opened:.1} s), the control plane's process over {idle_secs} s:");
    println!("  none open: {rss_none} KiB resident, {:.1} ms CPU/s", cpu_none * 1000.0);
    println!("  {sessions} open: {rss_all} KiB resident, {:.1} ms CPU/s", cpu_all * 1000.0);
    println!(
        "  per session: {:.0} KiB, {:.3} ms CPU/s",
        (rss_all as f64 - rss_none as f64) / sessions as f64,
        (cpu_all - cpu_none) * 1000.0 / sessions as f64
    );
    for s in open_sessions {
        s.leave().await?;
    }
    Ok(())
}
