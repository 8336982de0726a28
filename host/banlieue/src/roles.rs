//! `banlieue run|controller|provider|operator`: the control plane's roles against
//! the cluster in the environment's kubeconfig (or in-cluster config).

use std::net::SocketAddr;
use std::path::PathBuf;

use banlieue_api::provider::RequestedCapabilities;
use banlieue_controller::{Context, ImageBuildOptions, ImageCacheOptions, Options, Roles, VaultAccess};

#[derive(clap::Args, Clone)]
pub struct RoleArgs {
    /// Where `builtin:NAME` components are found.
    #[arg(long, env = "BANLIEUE_BUILTIN_DIR", default_value = "guests/dist")]
    pub builtin_dir: PathBuf,
    /// The one directory `file://` component sources may name files in (development);
    /// unset, `file://` sources are refused.
    #[arg(long, env = "BANLIEUE_COMPONENT_DIR")]
    pub component_dir: Option<PathBuf>,
    /// Precompiled component cache (none when unset).
    #[arg(long, env = "BANLIEUE_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Serve Prometheus metrics on this address.
    #[arg(long, default_value = "127.0.0.1:9464")]
    pub metrics_addr: SocketAddr,
    /// Act without holding the role's Lease (only when a single replica is certain).
    #[arg(long)]
    pub no_leader_election: bool,
    /// Host capabilities a ProviderClass may request (comma-separated: http, libvirt, secrets).
    #[arg(long, value_delimiter = ',', default_value = "http,libvirt,secrets")]
    pub allow_capabilities: Vec<String>,
    /// Vault (OpenBao) address for Providers whose credentials are a Vault path.
    #[arg(long, env = "VAULT_ADDR")]
    pub vault_addr: Option<String>,
    /// Reconciles run at once per controller.
    #[arg(long, default_value_t = 32)]
    pub concurrency: u16,
    /// Split the controller and provider roles' work into this many shards, held by
    /// whichever replicas run (a Lease per shard); the same number on every replica.
    /// 0: no sharding, one leader per role.
    #[arg(long, default_value_t = 0)]
    pub shards: u32,
    /// Seconds a shard's lease holds without renewal: how long a dead replica's shards
    /// wait before another replica takes them over.
    #[arg(long, default_value_t = 15)]
    pub shard_lease_seconds: u64,
    /// Seconds between two probes of a Provider (capacity, and rotated credentials).
    #[arg(long, default_value_t = 60)]
    pub probe_interval: u64,
    /// The image cache of the imagebuilder role (downloaded and converted images), which the
    /// provider role also carries moving VMs' disks through.
    #[arg(long, env = "BANLIEUE_IMAGE_CACHE_DIR", default_value = "/var/cache/banlieue/images")]
    pub image_cache_dir: PathBuf,
    /// The most the image cache holds, in GiB (older images are evicted to make room).
    #[arg(long, default_value_t = 50)]
    pub image_cache_gib: u64,
    /// Serve carried disks to backends that download them (Proxmox VE's `download-url`) on
    /// this address, e.g. `0.0.0.0:8092` (unset: VMs cannot move to such backends with their disks).
    #[arg(long, env = "BANLIEUE_CARRY_LISTEN")]
    pub carry_listen: Option<std::net::SocketAddr>,
    /// How those backends reach it, e.g. `http://banlieue.example:8092` (default: the address listened on).
    #[arg(long, env = "BANLIEUE_CARRY_URL")]
    pub carry_url: Option<String>,
    /// How long a carried disk's download URL works, unused.
    #[arg(long, default_value_t = 900)]
    pub carry_url_ttl_seconds: u64,
    /// Serve VM consoles (`kubectl vm console`, `kubectl vm vnc`, the browser page) over
    /// HTTPS on this address, e.g. `0.0.0.0:8443` (unset: no consoles). The provider role serves them.
    #[arg(long, env = "BANLIEUE_CONSOLE_LISTEN")]
    pub console_listen: Option<std::net::SocketAddr>,
    /// How users reach the console server, e.g. `https://consoles.example:8443` (default: the address listened on).
    #[arg(long, env = "BANLIEUE_CONSOLE_URL")]
    pub console_url: Option<String>,
    /// The console server's certificate (PEM; default: one made at start, under a CA made with it).
    #[arg(long, requires = "console_tls_key")]
    pub console_tls_cert: Option<PathBuf>,
    /// Its key (PEM).
    #[arg(long, requires = "console_tls_cert")]
    pub console_tls_key: Option<PathBuf>,
    /// The CA bundle clients check the certificate by (default: the certificate file).
    #[arg(long)]
    pub console_tls_ca: Option<PathBuf>,
    /// A console session without a byte either way for this many seconds is closed.
    #[arg(long, default_value_t = 900)]
    pub console_idle_timeout: u64,
    /// A console session is closed after this many seconds.
    #[arg(long, default_value_t = 28800)]
    pub console_max_duration: u64,
    /// Console sessions open at once on one VM.
    #[arg(long, default_value_t = 4)]
    pub console_max_per_vm: usize,
    /// Console sessions open at once by one user.
    #[arg(long, default_value_t = 16)]
    pub console_max_per_user: usize,
    /// The browser console page's files (`make console-page` builds them into `target/console-page`).
    #[arg(long, env = "BANLIEUE_CONSOLE_PAGE_DIR")]
    pub console_page_dir: Option<PathBuf>,
    /// URL schemes a VMImage source may be downloaded over (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "https")]
    pub image_url_schemes: Vec<String>,
    /// `REGISTRY/REPOSITORY` VMImage builds are exported to (none: VMImages with `build` are refused).
    #[arg(long, env = "BANLIEUE_IMAGE_BUILD_REGISTRY")]
    pub image_build_registry: Option<String>,
    /// The exporter Job's image (needs `sh` and `oras`).
    #[arg(long, default_value = "ghcr.io/oras-project/oras:v1.2.0")]
    pub image_build_exporter_image: String,
    /// Watch and act on this namespace only (cluster-scoped objects are still read); by
    /// default every namespace.
    #[arg(long)]
    pub namespace: Option<String>,
    /// The installation this process belongs to: it acts only on objects labelled
    /// `banlieue.io/instance=NAME` (and its Leases carry the name), so two installations
    /// share a cluster without acting on each other's objects. Unset: the default
    /// installation, which acts only on objects without that label.
    #[arg(long, env = "BANLIEUE_INSTANCE")]
    pub instance: Option<String>,
}

impl RoleArgs {
    /// The options of a control plane that is one process on this machine (`dev`,
    /// `bootstrap`): no Lease to wait for after a restart, and the component and image
    /// caches in `data_dir` (unless a component cache was named).
    pub fn one_process_options(&self, data_dir: &std::path::Path) -> anyhow::Result<Options> {
        let mut options = self.options()?;
        options.leader_election = false;
        if options.cache_dir.is_none() {
            options.cache_dir = Some(data_dir.join("component-cache"));
        }
        if let Some(images) = &mut options.image_cache {
            images.dir = data_dir.join("image-cache");
        }
        Ok(options)
    }

    pub fn options(&self) -> anyhow::Result<Options> {
        let mut allowed = RequestedCapabilities::default();
        for c in &self.allow_capabilities {
            match c.trim() {
                "http" => allowed.http = true,
                "libvirt" => allowed.libvirt = true,
                "secrets" => allowed.secrets = true,
                "" => {}
                other => anyhow::bail!("unknown capability {other:?} in --allow-capabilities (http, libvirt, secrets)"),
            }
        }
        // Without VAULT_TOKEN, Providers log in themselves (credentialsRef.vault.auth).
        let vault = self.vault_addr.as_ref().map(|address| VaultAccess {
            address: address.clone(),
            token: std::env::var("VAULT_TOKEN").ok().filter(|t| !t.is_empty()).map(banlieue_secrets::SecretValue::new),
        });
        Ok(Options {
            builtin_dir: self.builtin_dir.clone(),
            component_dir: self.component_dir.clone(),
            cache_dir: self.cache_dir.clone(),
            allowed_capabilities: allowed,
            metrics_addr: Some(self.metrics_addr),
            leader_election: !self.no_leader_election,
            vault,
            concurrency: self.concurrency,
            sharding: (self.shards > 0).then(|| banlieue_controller::Sharding {
                count: self.shards,
                lease_duration: std::time::Duration::from_secs(self.shard_lease_seconds.max(1)),
            }),
            probe_interval: std::time::Duration::from_secs(self.probe_interval.max(1)),
            image_cache: Some(ImageCacheOptions {
                dir: self.image_cache_dir.clone(),
                limit_bytes: self.image_cache_gib.saturating_mul(1 << 30),
                schemes: self.image_url_schemes.iter().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect(),
            }),
            image_build: self
                .image_build_registry
                .clone()
                .map(|registry| ImageBuildOptions { registry, exporter_image: self.image_build_exporter_image.clone() }),
            carry_downloads: self.carry_listen.map(|listen| banlieue_controller::CarryDownloads {
                listen,
                url: self.carry_url.clone(),
                ttl: std::time::Duration::from_secs(self.carry_url_ttl_seconds.max(1)),
            }),
            consoles: self.console_listen.map(|listen| banlieue_controller::ConsoleOptions {
                listen,
                url: self.console_url.clone(),
                tls: self.console_tls_cert.clone().zip(self.console_tls_key.clone()).map(|(cert, key)| banlieue_controller::TlsFiles {
                    cert,
                    key,
                    ca: self.console_tls_ca.clone(),
                }),
                limits: banlieue_controller::SessionLimits {
                    idle: std::time::Duration::from_secs(self.console_idle_timeout.max(1)),
                    max_duration: std::time::Duration::from_secs(self.console_max_duration.max(1)),
                    per_vm: self.console_max_per_vm.max(1),
                    per_user: self.console_max_per_user.max(1),
                },
                page_dir: self.console_page_dir.clone(),
            }),
            namespace: self.namespace.clone(),
            installation: banlieue_controller::Installation::new(self.instance.as_deref()).map_err(|e| anyhow::anyhow!("--instance: {e}"))?,
            ..Options::default()
        })
    }
}

pub async fn run(args: RoleArgs, roles: Roles) -> anyhow::Result<()> {
    // Flags first: a bad one is named before the cluster is even looked for.
    let mut options = args.options()?;
    let client = kube::Client::try_default().await?;
    // The imagebuilder role keeps images; the provider role carries moving VMs' disks through
    // the same cache.
    if !roles.imagebuilder && !roles.provider {
        options.image_cache = None;
    }
    // Only the provider role serves consoles: another role's process holds no console port.
    if !roles.provider {
        options.consoles = None;
    }
    let ctx = Context::new(client, options)?;
    banlieue_controller::run(ctx, roles, async {
        shutdown_signal().await;
        tracing::info!("shutting down");
    })
    .await
}

/// SIGINT (Ctrl-C) or SIGTERM (what Kubernetes sends a Pod, and `kill`): stop gracefully.
pub async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("cannot listen for SIGTERM ({e}); only Ctrl-C stops gracefully");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
