//! `banlieue`: every role of the control plane, the development environment and tools.

mod bootstrap;
mod component;
mod conformance;
mod crds;
mod dev;
mod placement;
mod rbac;
mod roles;
mod scaffold;

use std::path::PathBuf;

use banlieue_controller::Roles;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "banlieue", version, about = "A Kubernetes-native control plane for virtual machines")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the embedded API server with the CRDs installed and every role, on this machine.
    Dev(dev::DevArgs),
    /// Make a management cluster's VMs with a temporary control plane, then move banlieue's
    /// objects into the new cluster (resumable).
    Bootstrap(bootstrap::BootstrapArgs),
    /// Run every role against the cluster in KUBECONFIG (or in-cluster).
    Run(roles::RoleArgs),
    /// Run the VirtualMachine controller.
    Controller(roles::RoleArgs),
    /// Run the infrastructure-machine and Provider reconcilers (the drivers' host); or, with
    /// `conformance`, check a driver against the provider contract.
    Provider(ProviderCommand),
    /// Run the ProviderClass and PlacementPolicy reconcilers.
    Operator(roles::RoleArgs),
    /// Run the VMImage reconciler: images downloaded, verified and converted in the image cache.
    Imagebuilder(roles::RoleArgs),
    /// Try placement policies: what one would do for a VM now (explain), what it costs (bench).
    #[command(subcommand)]
    Placement(placement::PlacementCommand),
    /// Work with Wasm components: inspect, keygen, push, sign, verify.
    #[command(subcommand)]
    Component(component::ComponentCommand),
    /// Write the CRDs generated from the API types to a directory (or check it is up to date).
    Crdgen {
        /// Target directory.
        #[arg(long, default_value = "deploy/crds")]
        out: PathBuf,
        /// Fail instead of writing when the directory differs from the generated CRDs.
        #[arg(long)]
        check: bool,
    },
    /// Write the RBAC objects each role needs (ServiceAccounts, ClusterRoles, Roles, bindings), or check the file.
    Rbacgen {
        /// Target file.
        #[arg(long, default_value = "deploy/base/rbac.yaml")]
        out: PathBuf,
        /// Fail instead of writing when the file differs from what the code declares.
        #[arg(long)]
        check: bool,
    },
}

/// `banlieue provider`: the role, or a tool for driver authors.
#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
struct ProviderCommand {
    #[command(subcommand)]
    tool: Option<ProviderTool>,
    #[command(flatten)]
    role: roles::RoleArgs,
}

#[derive(Subcommand)]
enum ProviderTool {
    /// Run the provider contract's behaviours against a driver and the live backend a
    /// Provider manifest and its Secret describe (no Kubernetes needed).
    Conformance(Box<conformance::ConformanceArgs>),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // The authors' tools print their reports; the components' own log lines only when asked (RUST_LOG).
    let quiet = matches!(cli.command, Command::Provider(ProviderCommand { tool: Some(_), .. }) | Command::Placement(_));
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::Layer;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = || tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| if quiet { "warn".into() } else { "info,kube=warn,hyper=warn".into() });
    // Traces only when OTEL_EXPORTER_OTLP_ENDPOINT asks for them; every span, whatever the log level.
    let traces = banlieue_controller::ops::traces::layer("banlieue")?.map(|l| l.with_filter(tracing_subscriber::filter::LevelFilter::INFO));
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_filter(filter()))
        .with(traces)
        .init();
    match cli.command {
        Command::Dev(args) => dev::run(args).await,
        Command::Bootstrap(args) => bootstrap::run(args).await,
        Command::Run(args) => roles::run(args, Roles::ALL).await,
        Command::Controller(args) => roles::run(args, Roles { controller: true, ..Roles::default() }).await,
        Command::Provider(ProviderCommand { tool: Some(ProviderTool::Conformance(args)), .. }) => conformance::run(*args).await,
        Command::Provider(ProviderCommand { tool: None, role }) => roles::run(role, Roles { provider: true, ..Roles::default() }).await,
        Command::Operator(args) => roles::run(args, Roles { operator: true, ..Roles::default() }).await,
        Command::Imagebuilder(args) => roles::run(args, Roles { imagebuilder: true, ..Roles::default() }).await,
        Command::Crdgen { out, check } => crds::crdgen(&out, check),
        Command::Rbacgen { out, check } => rbac::rbacgen(&out, check),
        Command::Component(cmd) => component::run(cmd).await,
        Command::Placement(cmd) => placement::run(cmd).await,
    }
}
