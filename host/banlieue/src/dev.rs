//! `banlieue dev`: the embedded API server, the CRDs, and the controller roles, on
//! one machine without a Kubernetes cluster.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, Patch, PatchParams};

#[derive(clap::Args)]
pub struct DevArgs {
    /// Address of the embedded API server.
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
    /// Where objects, credentials and the kubeconfig are kept.
    #[arg(long, default_value = ".dev")]
    data_dir: PathBuf,
    /// Keep everything in memory (objects are gone when it stops).
    #[arg(long)]
    in_memory: bool,
}

pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    let config = banlieue_apiserver::Config {
        addr: args.listen,
        data_dir: (!args.in_memory).then(|| args.data_dir.clone()),
        ..Default::default()
    };
    let server = banlieue_apiserver::ApiServer::start(config)
        .await
        .with_context(|| format!("starting the embedded API server on {} (is another `banlieue dev` running? use --listen)", args.listen))?;
    std::fs::create_dir_all(&args.data_dir)?;
    let kubeconfig_path = std::path::absolute(args.data_dir.join("kubeconfig"))?;
    server.write_kubeconfig(&kubeconfig_path)?;

    let kubeconfig = kube::config::Kubeconfig::from_yaml(&server.kubeconfig)?;
    let client_config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    let client = kube::Client::try_from(client_config)?;
    crate::crds::install(&client).await?;
    let ns: Api<Namespace> = Api::all(client.clone());
    let system = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "banlieue-system"}});
    ns.patch("banlieue-system", &PatchParams::apply(crate::crds::FIELD_MANAGER), &Patch::Apply(&system)).await?;

    println!("banlieue dev is running at {}", server.url);
    println!("export KUBECONFIG={}", kubeconfig_path.display());
    println!("then: kubectl get vm");

    tokio::signal::ctrl_c().await?;
    tracing::info!("shutting down");
    server.shutdown().await;
    Ok(())
}
