//! `kubectl vm`: a kubectl plugin (kubectl runs `kubectl-vm` from `PATH`) for banlieue's
//! VirtualMachines, VirtualMachinePools and VMSnapshots. It only reads objects, makes
//! VMSnapshots and patches declarative fields — power state, restart request, pause,
//! replicas, revertTo — and never talks to a backend: banlieue's controllers do the rest.
//!
//! Exit codes scripts can rely on: 0 done; 1 an API or other error; 2 bad usage;
//! 3 no such VM, pool or snapshot; 4 refused (the VM is paused or being deleted, the snapshot
//! failed or is not Ready, or is of another VM); 5 `--wait` timed
//! out; 6 banlieue is not installed on the cluster.

mod adoption;
mod console;
mod output;
mod snapshots;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use banlieue_api::{VirtualMachine, VirtualMachinePool};
use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::json;

use output::{Format, Paint};

#[derive(Parser)]
#[command(name = "kubectl vm", bin_name = "kubectl vm", version, about = "Work with banlieue VirtualMachines and pools")]
struct Cli {
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    context: Option<String>,
    /// Namespace (default: the context's, then `default`).
    #[arg(short = 'n', long, global = true)]
    namespace: Option<String>,
    /// List across all namespaces.
    #[arg(short = 'A', long, global = true)]
    all_namespaces: bool,
    /// Output format.
    #[arg(short = 'o', long, global = true, value_enum)]
    output: Option<Format>,
    /// The bearer token a console is opened with (default: the kubeconfig user's).
    #[arg(long, global = true, env = "KUBECTL_VM_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List VMs: ready, power, provider, age (`-o wide`: failure domain, phase, addresses).
    List,
    /// A VM's conditions and recent events.
    Status { name: String },
    /// Power a VM on.
    Start {
        name: String,
        #[command(flatten)]
        wait: Wait,
    },
    /// Power a VM off.
    Stop {
        name: String,
        /// How: `hard` (power off now), `soft` (ACPI shutdown), `try-soft` (soft, then hard after the class's timeout).
        #[arg(long, value_enum)]
        mode: Option<StopMode>,
        #[command(flatten)]
        wait: Wait,
    },
    /// Restart a VM once.
    Restart {
        name: String,
        #[command(flatten)]
        wait: Wait,
    },
    /// Stop reconciling a VM (its backend VM is left as it is).
    Pause { name: String },
    /// Reconcile a paused VM again.
    Unpause { name: String },
    /// List pools: desired, current, ready and updated members.
    Pools,
    /// Set a pool's number of members.
    Scale {
        pool: String,
        replicas: i32,
        #[command(flatten)]
        wait: Wait,
    },
    /// Take a snapshot of a VM (a VMSnapshot named `<vm>-<UTC time>` unless --name).
    Snapshot {
        name: String,
        /// Include the VM's memory (it must be running).
        #[arg(long)]
        memory: bool,
        /// Quiesce the guest's file systems first (guest tools or agent).
        #[arg(long)]
        quiesce: bool,
        /// Kept with the snapshot on the backend.
        #[arg(long)]
        description: Option<String>,
        /// The VMSnapshot's name.
        #[arg(long = "name", value_name = "SNAPSHOT")]
        snapshot_name: Option<String>,
        #[command(flatten)]
        wait: Wait,
    },
    /// List a VM's snapshots (`-o wide`: backend id, schedule, message).
    Snapshots { name: String },
    /// Bring a VM back to one of its snapshots (powered off first, on again if it should run).
    Revert {
        name: String,
        snapshot: String,
        #[command(flatten)]
        wait: Wait,
    },
    /// Make a new VM from a snapshot (on the snapshot's Provider).
    Restore {
        snapshot: String,
        /// The new VM's name.
        #[arg(long)]
        to: String,
        /// Share the snapshot's disks where the backend can (a vSphere linked clone).
        #[arg(long)]
        linked: bool,
        #[command(flatten)]
        wait: Wait,
    },
    /// List the VMs on a Provider's backend that banlieue does not manage (`--all`: every
    /// one, with the Machine that manages it; `-o wide`: failure domain, addresses, tags).
    Discover {
        #[arg(long)]
        provider: String,
        /// Every VM, those banlieue manages too.
        #[arg(long)]
        all: bool,
        /// Give up waiting for the Provider's answer after this many seconds (exit code 5).
        #[arg(long, default_value_t = 120)]
        timeout: u64,
    },
    /// Take over a VM that exists on a Provider's backend: a VirtualMachine that adopts it
    /// (with a VMClass made from its hardware unless --class).
    Adopt {
        backend_id: String,
        #[arg(long)]
        provider: String,
        /// The VirtualMachine's name.
        #[arg(long)]
        name: String,
        /// Its VMClass (default: `adopted-<name>`, made from the VM's hardware).
        #[arg(long)]
        class: Option<String>,
        #[command(flatten)]
        wait: Wait,
    },
    /// Stop managing a VM without deleting it: its backend VM is left as it is, without
    /// banlieue's mark, and the VirtualMachine goes.
    Release {
        name: String,
        #[command(flatten)]
        wait: Wait,
    },
    /// Open a VM's serial console on this terminal (Ctrl-] to leave). Needs `get` on
    /// `virtualmachines/console`; a console closed by the VM's restart is opened again.
    Console {
        name: String,
        /// How long to keep trying to open the console again after it closed (a restart), in seconds.
        #[arg(long, default_value_t = 60)]
        timeout: u64,
    },
    /// Serve a VM's graphical console on a local port for any VNC client (or open it in the
    /// browser). Needs `get` on `virtualmachines/vnc`.
    Vnc {
        name: String,
        /// The local port (default: any free one, printed).
        #[arg(long, default_value_t = 0)]
        port: u16,
        /// Print (and try to open) the browser page instead.
        #[arg(long)]
        browser: bool,
    },
    /// Where a VM would be placed now, without placing it: every candidate in the order its
    /// placement policy prefers them, and what left the other failure domains out
    /// (runs `banlieue placement explain`).
    Place {
        name: String,
        /// Only explain (required: a VM is placed by banlieue; change spec.placement to move it).
        #[arg(long)]
        dry_run: bool,
        /// Try this placement policy (a `.wasm` file) instead of the VM's.
        #[arg(long)]
        policy: Option<PathBuf>,
        /// Rank this many candidates.
        #[arg(long, default_value_t = 10)]
        top: usize,
    },
    /// Print a shell completion script.
    Completion { shell: clap_complete::Shell },
}

#[derive(clap::Args, Clone, Copy)]
struct Wait {
    /// Wait until the VM (or pool) gets there, showing what is awaited.
    #[arg(long)]
    wait: bool,
    /// Give up waiting after this many seconds (exit code 5).
    #[arg(long, default_value_t = 300)]
    timeout: u64,
}

#[derive(Clone, Copy, ValueEnum)]
enum StopMode {
    Hard,
    Soft,
    TrySoft,
}

impl StopMode {
    fn api(self) -> &'static str {
        match self {
            StopMode::Hard => "Hard",
            StopMode::Soft => "Soft",
            StopMode::TrySoft => "TrySoft",
        }
    }
}

/// Why the plugin stops, with its exit code.
#[derive(Debug)]
enum Failure {
    NotFound(String),
    Refused(String),
    TimedOut(String),
    NotInstalled,
    Other(anyhow::Error),
}

impl Failure {
    fn code(&self) -> i32 {
        match self {
            Failure::Other(_) => 1,
            Failure::NotFound(_) => 3,
            Failure::Refused(_) => 4,
            Failure::TimedOut(_) => 5,
            Failure::NotInstalled => 6,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::NotFound(m) | Failure::Refused(m) | Failure::TimedOut(m) => f.write_str(m),
            Failure::NotInstalled => f.write_str(
                "banlieue is not installed on this cluster (no virtualmachines.banlieue.io CRD); install it with `kubectl apply -k deploy/`",
            ),
            Failure::Other(e) => write!(f, "{e:#}"),
        }
    }
}

impl From<kube::Error> for Failure {
    fn from(e: kube::Error) -> Self {
        match &e {
            // The resource itself is not served: the CRD is missing.
            kube::Error::Api(s) if s.code == 404 && s.details.as_ref().is_none_or(|d| d.name.is_empty()) => Failure::NotInstalled,
            _ => Failure::Other(e.into()),
        }
    }
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        Failure::Other(e)
    }
}

type Result<T> = std::result::Result<T, Failure>;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let cli = Cli::parse();
    if let Command::Completion { shell } = cli.command {
        clap_complete::generate(shell, &mut Cli::command(), "kubectl-vm", &mut std::io::stdout());
        return;
    }
    if let Err(e) = run(cli).await {
        eprintln!("error: {e}");
        std::process::exit(e.code());
    }
    // Done: exit now rather than wait for the runtime to wind down — a console's stdin
    // reader is blocked in a read that only the process's end interrupts.
    std::process::exit(0);
}

struct Target {
    client: kube::Client,
    /// The user's bearer token, for consoles (`--token`, else the kubeconfig's).
    token: Option<String>,
    namespace: String,
    all: bool,
    format: Format,
    paint: Paint,
}

impl Target {
    fn vms(&self) -> Api<VirtualMachine> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }
    fn pools(&self) -> Api<VirtualMachinePool> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }
}

async fn connect(cli: &Cli) -> Result<Target> {
    let options = kube::config::KubeConfigOptions { context: cli.context.clone(), ..Default::default() };
    let config = match &cli.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options).await.map_err(anyhow::Error::from)?
        }
        None => kube::Config::from_kubeconfig(&options).await.map_err(anyhow::Error::from)?,
    };
    let namespace = cli.namespace.clone().unwrap_or_else(|| config.default_namespace.clone());
    let token = cli.token.clone().or_else(|| {
        use secrecy::ExposeSecret;
        let from_file = config.auth_info.token_file.as_ref().and_then(|f| std::fs::read_to_string(f).ok()).map(|t| t.trim().to_string());
        config.auth_info.token.as_ref().map(|t| t.expose_secret().to_string()).or(from_file)
    });
    let client = kube::Client::try_from(config).map_err(anyhow::Error::from)?;
    let format = cli.output.unwrap_or(Format::Table);
    Ok(Target { client, token, namespace, all: cli.all_namespaces, format, paint: Paint::new(std::io::stdout().is_terminal()) })
}

async fn run(cli: Cli) -> Result<()> {
    let t = connect(&cli).await?;
    let config = (cli.kubeconfig.clone(), cli.context.clone());
    match cli.command {
        Command::List => list(&t).await,
        Command::Status { name } => status(&t, &name).await,
        Command::Start { name, wait } => {
            writable(&t, &name).await?;
            set_spec(&t, &name, json!({"desiredPowerState": "PoweredOn"})).await?;
            println!("virtualmachine/{name} starting");
            if wait.wait {
                await_vm(&t, &name, wait, "Ready and PoweredOn", |vm| power(vm) == Some("PoweredOn") && ready(vm)).await?;
            }
            Ok(())
        }
        Command::Stop { name, mode, wait } => {
            writable(&t, &name).await?;
            let mut spec = json!({"desiredPowerState": "PoweredOff"});
            if let Some(mode) = mode {
                spec["powerOffMode"] = json!(mode.api());
            }
            set_spec(&t, &name, spec).await?;
            println!("virtualmachine/{name} stopping");
            if wait.wait {
                await_vm(&t, &name, wait, "PoweredOff", |vm| power(vm) == Some("PoweredOff") && ready(vm)).await?;
            }
            Ok(())
        }
        Command::Restart { name, wait } => {
            writable(&t, &name).await?;
            let at = k8s_openapi::jiff::Timestamp::now().to_string();
            set_spec(&t, &name, json!({"restartRequestedAt": at})).await?;
            println!("virtualmachine/{name} restarting");
            if wait.wait {
                let what = format!("the restart requested at {at}");
                await_vm(&t, &name, wait, &what, move |vm| {
                    vm.status.as_ref().and_then(|s| s.last_restart_requested_at.as_deref()) == Some(at.as_str()) && ready(vm)
                })
                .await?;
            }
            Ok(())
        }
        Command::Pause { name } => pause(&t, &name, true).await,
        Command::Unpause { name } => pause(&t, &name, false).await,
        Command::Pools => pools(&t).await,
        Command::Scale { pool, replicas, wait } => scale(&t, &pool, replicas, wait).await,
        Command::Snapshot { name, memory, quiesce, description, snapshot_name, wait } => {
            snapshots::snapshot(&t, &name, snapshots::Request { memory, quiesce, description, name: snapshot_name }, wait).await
        }
        Command::Snapshots { name } => snapshots::list(&t, &name).await,
        Command::Revert { name, snapshot, wait } => snapshots::revert(&t, &name, &snapshot, wait).await,
        Command::Restore { snapshot, to, linked, wait } => snapshots::restore(&t, &snapshot, &to, linked, wait).await,
        Command::Discover { provider, all, timeout } => adoption::discover(&t, &provider, all, timeout).await,
        Command::Adopt { backend_id, provider, name, class, wait } => adoption::adopt(&t, adoption::Adopt { provider, backend_id, name, class }, wait).await,
        Command::Release { name, wait } => adoption::release(&t, &name, wait).await,
        Command::Console { name, timeout } => console::console(&t, &name, Duration::from_secs(timeout.max(1))).await,
        Command::Vnc { name, port, browser } => console::vnc(&t, &name, port, browser).await,
        Command::Place { name, dry_run, policy, top } => place(&config, &t, &name, dry_run, policy.as_deref(), top),
        Command::Completion { .. } => Ok(()),
    }
}

/// `kubectl vm place NAME --dry-run`: `banlieue placement explain` (which runs the policy
/// component, so it lives in the binary that hosts components) on the same cluster.
fn place((kubeconfig, context): &(Option<PathBuf>, Option<String>), t: &Target, name: &str, dry_run: bool, policy: Option<&std::path::Path>, top: usize) -> Result<()> {
    if !dry_run {
        return Err(Failure::Refused("kubectl vm place only explains (--dry-run): banlieue places a VM itself; change its spec.placement to move it".into()));
    }
    let banlieue = std::env::var_os("BANLIEUE").unwrap_or_else(|| "banlieue".into());
    let mut cmd = std::process::Command::new(&banlieue);
    cmd.args(["placement", "explain", name, "--namespace", &t.namespace, "--top", &top.to_string()]);
    if let Some(p) = policy {
        cmd.arg("--policy").arg(p);
    }
    if let Some(c) = context {
        cmd.args(["--context", c]);
    }
    if matches!(t.format, Format::Json) {
        cmd.arg("--json");
    }
    if let Some(k) = kubeconfig {
        cmd.env("KUBECONFIG", k);
    }
    let status = cmd.status().map_err(|e| anyhow::anyhow!("running {} placement explain (install banlieue on PATH, or set BANLIEUE to it): {e}", banlieue.to_string_lossy()))?;
    match status.code() {
        Some(0) => Ok(()),
        Some(3) => Err(Failure::NotFound(format!("virtualmachine {name:?} not found in namespace {:?}", t.namespace))),
        code => Err(Failure::Other(anyhow::anyhow!("banlieue placement explain ended with {code:?}"))),
    }
}

/// The VM, or why it cannot be acted on: unknown (with the names closest to it), being
/// deleted, or paused.
async fn writable(t: &Target, name: &str) -> Result<VirtualMachine> {
    let vm = get_vm(t, name).await?;
    if vm.metadata.deletion_timestamp.is_some() {
        return Err(Failure::Refused(format!("virtualmachine {name:?} is being deleted")));
    }
    if vm.spec.paused {
        return Err(Failure::Refused(format!("virtualmachine {name:?} is paused: `kubectl vm unpause {name}` first")));
    }
    Ok(vm)
}

async fn get_vm(t: &Target, name: &str) -> Result<VirtualMachine> {
    match t.vms().get_opt(name).await? {
        Some(vm) => Ok(vm),
        None => {
            let names: Vec<String> = t.vms().list(&ListParams::default()).await?.items.iter().map(|vm| vm.name_any()).collect();
            Err(Failure::NotFound(not_found("virtualmachine", name, &t.namespace, &names)))
        }
    }
}

/// `virtualmachine "wbe" not found in namespace "team"; did you mean web?`
fn not_found(kind: &str, name: &str, namespace: &str, names: &[String]) -> String {
    let mut close: Vec<(usize, &String)> =
        names.iter().map(|n| (strsim::levenshtein(n, name), n)).filter(|(d, n)| *d <= 2.max(name.len() / 3) || n.starts_with(name)).collect();
    close.sort();
    let mut message = format!("{kind} {name:?} not found in namespace {namespace:?}");
    if !close.is_empty() {
        let list: Vec<&str> = close.iter().take(3).map(|(_, n)| n.as_str()).collect();
        message.push_str(&format!("; did you mean {}?", list.join(", ")));
    }
    message
}

async fn set_spec(t: &Target, name: &str, spec: serde_json::Value) -> Result<()> {
    t.vms().patch(name, &PatchParams::default(), &Patch::Merge(json!({ "spec": spec }))).await?;
    Ok(())
}

async fn pause(t: &Target, name: &str, paused: bool) -> Result<()> {
    let vm = get_vm(t, name).await?;
    if vm.metadata.deletion_timestamp.is_some() {
        return Err(Failure::Refused(format!("virtualmachine {name:?} is being deleted")));
    }
    set_spec(t, name, json!({ "paused": paused })).await?;
    println!("virtualmachine/{name} {}", if paused { "paused" } else { "unpaused" });
    Ok(())
}

fn ready(vm: &VirtualMachine) -> bool {
    condition(vm, "Ready").is_some_and(|c| c.status == "True")
}

fn condition<'a>(vm: &'a VirtualMachine, type_: &str) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    vm.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)
}

fn power(vm: &VirtualMachine) -> Option<&'static str> {
    use banlieue_api::common::PowerState;
    vm.status.as_ref()?.observed_power_state.map(|p| match p {
        PowerState::PoweredOn => "PoweredOn",
        PowerState::PoweredOff => "PoweredOff",
        PowerState::Suspended => "Suspended",
    })
}

/// Wait (by watch) until `done` holds, with a live line on a terminal saying what is awaited.
async fn await_vm(t: &Target, name: &str, wait: Wait, what: &str, done: impl Fn(&VirtualMachine) -> bool + Send + 'static) -> Result<()> {
    let progress = Progress::start(what);
    let waited = tokio::time::timeout(
        Duration::from_secs(wait.timeout),
        kube::runtime::wait::await_condition(t.vms(), name, move |vm: Option<&VirtualMachine>| vm.is_some_and(&done)),
    )
    .await;
    progress.finish();
    match waited {
        Ok(Ok(Some(_))) => {
            println!("virtualmachine/{name} is {what} ({:.1}s)", progress.elapsed().as_secs_f64());
            Ok(())
        }
        Ok(Ok(None)) => Err(Failure::NotFound(format!("virtualmachine {name:?} was deleted while waiting"))),
        Ok(Err(e)) => Err(Failure::Other(e.into())),
        Err(_) => {
            let now = t.vms().get_opt(name).await?.and_then(|vm| condition(&vm, "Ready").map(|c| format!("{}: {}", c.reason, c.message)));
            Err(Failure::TimedOut(format!(
                "virtualmachine {name:?} not {what} after {}s{}",
                wait.timeout,
                now.map(|n| format!("; Ready is {n}")).unwrap_or_default()
            )))
        }
    }
}

/// A line rewritten every 200 ms on a terminal (`waiting for X… 3.2s`); nothing when piped.
struct Progress {
    started: Instant,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Progress {
    fn start(what: &str) -> Progress {
        let started = Instant::now();
        let task = std::io::stderr().is_terminal().then(|| {
            let what = what.to_string();
            tokio::spawn(async move {
                loop {
                    eprint!("\r\x1b[2Kwaiting for {what}… {:.1}s", started.elapsed().as_secs_f64());
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            })
        });
        Progress { started, task }
    }

    fn finish(&self) {
        if let Some(task) = &self.task {
            task.abort();
            eprint!("\r\x1b[2K");
        }
    }

    fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}

async fn list(t: &Target) -> Result<()> {
    let api: Api<VirtualMachine> = if t.all { Api::all(t.client.clone()) } else { t.vms() };
    let vms = api.list(&ListParams::default()).await?.items;
    if let Some(text) = output::structured(t.format, "VirtualMachineList", &vms)? {
        print!("{text}");
        return Ok(());
    }
    let wide = t.format == Format::Wide;
    let mut header = vec!["NAME", "READY", "POWER", "PROVIDER", "AGE"];
    if t.all {
        header.insert(0, "NAMESPACE");
    }
    if wide {
        header.extend(["FAILURE-DOMAIN", "PHASE", "ADDRESSES"]);
    }
    let rows = vms.iter().map(|vm| {
        let status = vm.status.clone().unwrap_or_default();
        let mut row = vec![
            vm.name_any(),
            t.paint.status(condition(vm, "Ready").map(|c| c.status.as_str()).unwrap_or("Unknown")),
            power(vm).unwrap_or("-").to_string(),
            status.scheduled.as_ref().map(|s| s.provider.clone()).unwrap_or_else(|| "-".into()),
            output::age(vm.metadata.creation_timestamp.as_ref()),
        ];
        if t.all {
            row.insert(0, vm.namespace().unwrap_or_default());
        }
        if wide {
            row.push(status.scheduled.as_ref().map(|s| s.failure_domain.clone()).unwrap_or_else(|| "-".into()));
            row.push(status.phase.map(|p| format!("{p:?}")).unwrap_or_else(|| "-".into()));
            let addresses: Vec<String> = status.addresses.iter().map(|a| a.address.clone()).collect();
            row.push(if addresses.is_empty() { "-".into() } else { addresses.join(",") });
        }
        row
    });
    print!("{}", output::table(&header, rows));
    Ok(())
}

async fn status(t: &Target, name: &str) -> Result<()> {
    let vm = get_vm(t, name).await?;
    if let Some(text) = output::structured(t.format, "", &vm)? {
        print!("{text}");
        return Ok(());
    }
    let s = vm.status.clone().unwrap_or_default();
    println!("Name:       {}/{}", vm.namespace().unwrap_or_default(), vm.name_any());
    println!("Power:      {} (wanted {:?})", power(&vm).unwrap_or("-"), vm.spec.desired_power_state);
    if let Some(sch) = &s.scheduled {
        println!("Placement:  {}/{} ({})", sch.provider, sch.failure_domain, sch.provider_class);
        // The backend's recent health, as its Provider's status says (no Prometheus needed).
        if let Some(p) = Api::<banlieue_api::Provider>::namespaced(t.client.clone(), &vm.namespace().unwrap_or_default()).get_opt(&sch.provider).await? {
            println!("Provider:   {}", output::provider_health(&p));
        }
    }
    if let Some(first) = &s.first_ready_time {
        let took = first.0.duration_since(vm.metadata.creation_timestamp.clone().map(|c| c.0).unwrap_or(first.0));
        println!("Ready:      first {} ago, {}s after it was created", output::age(Some(first)), took.as_secs());
    }
    if !s.addresses.is_empty() {
        println!("Addresses:  {}", s.addresses.iter().map(|a| a.address.as_str()).collect::<Vec<_>>().join(", "));
    }
    if vm.spec.paused {
        println!("Paused:     yes");
    }
    if let Some(m) = &s.moving {
        println!("{}", move_line(m));
        for d in &m.disks {
            let total = d.bytes_total.map(|t| format!(" of {}", mib(t))).unwrap_or_default();
            println!("            disk {}: {}{total}", d.name, mib(d.bytes_done));
        }
    }
    println!();
    let rows = s.conditions.iter().map(|c| vec![c.type_.clone(), t.paint.status(&c.status), output::age(Some(&c.last_transition_time)), c.reason.clone(), c.message.clone()]);
    print!("{}", output::table(&["CONDITION", "STATUS", "SINCE", "REASON", "MESSAGE"], rows));
    let events: Api<Event> = Api::namespaced(t.client.clone(), &t.namespace);
    let mut recent: Vec<Event> = events
        .list(&ListParams::default().fields(&format!("involvedObject.name={name},involvedObject.kind=VirtualMachine")))
        .await?
        .items;
    recent.sort_by_key(|e| e.last_timestamp.as_ref().map(|t| t.0));
    if !recent.is_empty() {
        println!();
        let rows = recent.iter().rev().take(10).rev().map(|e| {
            let kind = e.type_.clone().unwrap_or_default();
            vec![output::age(e.last_timestamp.as_ref()), t.paint.event(&kind), e.reason.clone().unwrap_or_default(), e.message.clone().unwrap_or_default()]
        });
        print!("{}", output::table(&["AGE", "TYPE", "REASON", "MESSAGE"], rows));
    }
    Ok(())
}

/// A carrying move (under way, or the last one that failed): from, to, phase.
fn move_line(m: &banlieue_api::vm::MoveStatus) -> String {
    let end = |e: &banlieue_api::vm::MoveEnd| format!("{}/{}", e.scheduled.provider, e.scheduled.failure_domain);
    let why = m.message.as_deref().map(|w| format!(": {w}")).unwrap_or_default();
    format!("Move:       {} -> {} ({:?}{why})", end(&m.from), end(&m.to), m.phase)
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

async fn pools(t: &Target) -> Result<()> {
    let api: Api<VirtualMachinePool> = if t.all { Api::all(t.client.clone()) } else { t.pools() };
    let pools = api.list(&ListParams::default()).await?.items;
    if let Some(text) = output::structured(t.format, "VirtualMachinePoolList", &pools)? {
        print!("{text}");
        return Ok(());
    }
    let mut header = vec!["NAME", "DESIRED", "CURRENT", "READY", "UPDATED", "CHANGED", "AGE"];
    if t.all {
        header.insert(0, "NAMESPACE");
    }
    let rows = pools.iter().map(|p| {
        let s = p.status.clone().unwrap_or_default();
        // When the pool's state last changed: its conditions' latest transition.
        let changed = s.conditions.iter().map(|c| &c.last_transition_time).max_by_key(|t| t.0);
        let mut row = vec![
            p.name_any(),
            p.spec.replicas.to_string(),
            s.replicas.to_string(),
            s.ready_replicas.to_string(),
            s.updated_replicas.to_string(),
            changed.map(|t| format!("{} ago", output::age(Some(t)))).unwrap_or_else(|| "-".into()),
            output::age(p.metadata.creation_timestamp.as_ref()),
        ];
        if t.all {
            row.insert(0, p.namespace().unwrap_or_default());
        }
        row
    });
    print!("{}", output::table(&header, rows));
    // The Providers the pools' VMs run on, with their recent health.
    let vms: Api<VirtualMachine> = if t.all { Api::all(t.client.clone()) } else { t.vms() };
    let mut providers = std::collections::BTreeSet::new();
    for vm in vms.list(&ListParams::default().labels("banlieue.io/pool")).await?.items {
        if let Some(sch) = vm.status.as_ref().and_then(|s| s.scheduled.as_ref()) {
            providers.insert((vm.namespace().unwrap_or_default(), sch.provider.clone()));
        }
    }
    if !providers.is_empty() {
        println!();
        let mut rows = Vec::new();
        for (ns, name) in providers {
            if let Some(p) = Api::<banlieue_api::Provider>::namespaced(t.client.clone(), &ns).get_opt(&name).await? {
                rows.push(vec![format!("{ns}/{name}"), output::provider_health(&p)]);
            }
        }
        print!("{}", output::table(&["PROVIDER", "HEALTH"], rows.into_iter()));
    }
    Ok(())
}

async fn scale(t: &Target, pool: &str, replicas: i32, wait: Wait) -> Result<()> {
    if t.pools().get_opt(pool).await?.is_none() {
        let names: Vec<String> = t.pools().list(&ListParams::default()).await?.items.iter().map(|p| p.name_any()).collect();
        return Err(Failure::NotFound(not_found("virtualmachinepool", pool, &t.namespace, &names)));
    }
    t.pools().patch(pool, &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": replicas}}))).await.map_err(|e| match e {
        kube::Error::Api(s) if s.code == 422 => Failure::Refused(format!("replicas {replicas} refused: {}", s.message)),
        e => e.into(),
    })?;
    println!("virtualmachinepool/{pool} scaled to {replicas}");
    if wait.wait {
        let what = format!("{replicas} Ready members");
        let progress = Progress::start(&what);
        let waited = tokio::time::timeout(
            Duration::from_secs(wait.timeout),
            kube::runtime::wait::await_condition(t.pools(), pool, move |p: Option<&VirtualMachinePool>| {
                p.and_then(|p| p.status.as_ref()).is_some_and(|s| s.replicas == replicas && s.ready_replicas == replicas)
            }),
        )
        .await;
        // Members scaled in are gone only once their backend VMs are: wait for that too.
        let left = Duration::from_secs(wait.timeout).saturating_sub(progress.elapsed());
        let waited = match waited {
            Ok(Ok(Some(p))) => match tokio::time::timeout(left, members_settle(t, pool, replicas)).await {
                Ok(Ok(())) => Ok(Ok(Some(p))),
                Ok(Err(e)) => Ok(Err(e)),
                Err(e) => Err(e),
            },
            other => other,
        };
        progress.finish();
        match waited {
            Ok(Ok(Some(_))) => println!("virtualmachinepool/{pool} has {what} ({:.1}s)", progress.elapsed().as_secs_f64()),
            Ok(Ok(None)) => return Err(Failure::NotFound(format!("virtualmachinepool {pool:?} was deleted while waiting"))),
            Ok(Err(e)) => return Err(Failure::Other(e.into())),
            Err(_) => return Err(Failure::TimedOut(format!("virtualmachinepool {pool:?} does not have {what} after {}s", wait.timeout))),
        }
    }
    Ok(())
}

/// Until exactly `replicas` VMs carry the pool's label (members being deleted count until gone).
async fn members_settle(t: &Target, pool: &str, replicas: i32) -> std::result::Result<(), kube::runtime::wait::Error> {
    use futures::StreamExt;
    use kube::runtime::{reflector, watcher};
    let (reader, writer) = reflector::store();
    let config = watcher::Config::default().labels(&format!("banlieue.io/pool={pool}"));
    let mut events = reflector(writer, watcher(t.vms(), config)).boxed();
    let want = usize::try_from(replicas).unwrap_or(0);
    let mut listed = false;
    while let Some(event) = events.next().await {
        match event.map_err(kube::runtime::wait::Error::ProbeFailed)? {
            watcher::Event::InitDone => listed = true,
            watcher::Event::Init | watcher::Event::InitApply(_) => continue,
            watcher::Event::Apply(_) | watcher::Event::Delete(_) => {}
        }
        if listed && reader.state().len() == want {
            return Ok(());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_move_is_shown_from_to_and_its_phase() {
        let end = |p: &str| banlieue_api::vm::MoveEnd { scheduled: banlieue_api::vm::Scheduled { provider: p.into(), failure_domain: "d".into(), ..Default::default() }, ..Default::default() };
        let m = banlieue_api::vm::MoveStatus { from: end("kvm"), to: end("vcenter"), phase: banlieue_api::vm::MovePhase::Exporting, ..Default::default() };
        assert_eq!(move_line(&m), "Move:       kvm/d -> vcenter/d (Exporting)");
        assert_eq!(mib(3 << 19), "1.5 MiB");
    }

    #[test]
    fn unknown_names_suggest_the_closest() {
        let names = vec!["web-0".to_string(), "web-1".to_string(), "database".to_string()];
        assert_eq!(not_found("virtualmachine", "wbe-0", "team", &names), "virtualmachine \"wbe-0\" not found in namespace \"team\"; did you mean web-0?");
        assert!(not_found("virtualmachine", "web", "team", &names).ends_with("did you mean web-0, web-1?"));
        assert_eq!(not_found("virtualmachine", "zzz", "team", &names), "virtualmachine \"zzz\" not found in namespace \"team\"");
    }
}
