//! banlieue's reconcilers, one module per role's concern:
//!
//! - [`vm`]: the VirtualMachine controller (role `controller`), with [`scheduling`]
//!   gathering candidates for the placement component;
//! - [`machine`]: the generic infrastructure-machine reconciler over every
//!   `<Kind>Machine` (role `provider`), and [`provider`] probing Providers;
//! - [`capi`]: the Cluster API contract: `<Kind>Cluster`s, and binding the machines
//!   CAPI makes from templates (role `controller`);
//! - [`operator`]: ProviderClasses and PlacementPolicies (role `operator`);
//! - [`images`]: VMImages downloaded into the image cache (role `imagebuilder`).
//!
//! Components are loaded only through [`components`], grants are built only in
//! [`grants`]. [`run`] starts the roles asked for, each behind its own Lease, or, with
//! sharding, the `controller` and `provider` roles on the shards this replica holds ([`shards`]).

pub mod capi;
pub mod components;
pub mod conditions;
mod finalizer;
pub mod grants;
pub mod images;
pub mod in_use;
pub mod infra_kinds;
pub mod installation;
pub mod leader;
pub mod machine;
pub mod metrics;
pub mod operator;
pub mod permissions;
pub mod pool;
pub mod provider;
pub mod reasons;
pub mod reconciler;
pub mod resolve;
pub mod scheduling;
pub mod shards;
pub mod status;
pub mod throttle;
pub mod vault;
pub mod vm;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use banlieue_api::provider::RequestedCapabilities;
use banlieue_runtime::{CallError, Runtime, RuntimeConfig};
use k8s_openapi::api::core::v1::ObjectReference;

pub use components::Components;
pub use metrics::{Metrics, Readiness};
pub use permissions::Role;

/// Field manager of everything banlieue applies.
pub const FIELD_MANAGER: &str = "banlieue.io/controller";
/// Namespace of leases (and, in a cluster, of banlieue itself).
pub const SYSTEM_NAMESPACE: &str = "banlieue-system";

/// Which roles this process runs.
#[derive(Clone, Copy, Debug, Default)]
pub struct Roles {
    pub controller: bool,
    pub provider: bool,
    pub operator: bool,
    pub imagebuilder: bool,
}

impl Roles {
    pub const ALL: Roles = Roles { controller: true, provider: true, operator: true, imagebuilder: true };

    /// The roles switched on, in start order.
    pub fn enabled(self) -> Vec<Role> {
        [(Role::Operator, self.operator), (Role::ImageBuilder, self.imagebuilder), (Role::Provider, self.provider), (Role::Controller, self.controller)]
            .into_iter()
            .filter_map(|(role, on)| on.then_some(role))
            .collect()
    }
}

/// How often a role whose permissions are incomplete asks again (RBAC fixed later
/// makes it ready without a restart).
const PERMISSION_RECHECK: Duration = Duration::from_secs(30);

/// Settings shared by every role.
#[derive(Clone, Debug)]
pub struct Options {
    /// Where `builtin:NAME` components are found.
    pub builtin_dir: PathBuf,
    /// The one directory `file://` component sources may name (none: they are refused).
    pub component_dir: Option<PathBuf>,
    /// Precompiled component cache.
    pub cache_dir: Option<PathBuf>,
    /// What a ProviderClass may request.
    pub allowed_capabilities: RequestedCapabilities,
    /// Serve `/metrics` here.
    pub metrics_addr: Option<SocketAddr>,
    /// Take a Lease per role before acting (off only when a single process is certain).
    pub leader_election: bool,
    /// This replica's name in leases.
    pub identity: String,
    /// Vault (OpenBao) for Providers whose credentials are a Vault path.
    pub vault: Option<VaultAccess>,
    /// Reconciles run at once per controller.
    pub concurrency: u16,
    /// How often each Provider is probed (capacity, and whether its credentials rotated).
    pub probe_interval: Duration,
    /// The image cache of the `imagebuilder` role (none: the role cannot run).
    pub image_cache: Option<ImageCacheOptions>,
    /// Where the `imagebuilder` role has VMImage builds pushed (none: builds are refused).
    pub image_build: Option<ImageBuildOptions>,
    /// Watch namespaced objects in this namespace only (all namespaces when `None`).
    pub namespace: Option<String>,
    /// Split the `controller` and `provider` roles' work across replicas by shard leases
    /// instead of one leader per role ([`shards`]); `None`: one leader does it all.
    pub sharding: Option<shards::Sharding>,
    /// The installation this process belongs to: the objects it acts on ([`installation`]).
    pub installation: installation::Installation,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            builtin_dir: PathBuf::from("guests/dist"),
            component_dir: None,
            cache_dir: None,
            allowed_capabilities: RequestedCapabilities { http: true, libvirt: true, secrets: true },
            metrics_addr: None,
            leader_election: true,
            identity: format!("{}-{}", hostname(), std::process::id()),
            vault: None,
            concurrency: 32,
            probe_interval: provider::PROBE_INTERVAL,
            namespace: None,
            image_cache: None,
            image_build: None,
            sharding: None,
            installation: installation::Installation::default(),
        }
    }
}

/// Where the `imagebuilder` role keeps downloaded images, and how much.
#[derive(Clone, Debug)]
pub struct ImageCacheOptions {
    pub dir: PathBuf,
    pub limit_bytes: u64,
    /// URL schemes a VMImage source may use (`https`; `http` only where the network is trusted).
    pub schemes: Vec<String>,
}

/// Where VMImage builds (kairos-operator `OSArtifact`s) are exported to.
#[derive(Clone, Debug)]
pub struct ImageBuildOptions {
    /// `REGISTRY/REPOSITORY` the exporter pushes each built disk to (tag `<vmimage>-<generation>`).
    pub registry: String,
    /// The exporter's container image: it must have `sh` and `oras`.
    pub exporter_image: String,
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_else(|_| "banlieue".into())
}

/// Address and token of the Vault server holding Provider credentials.
#[derive(Clone)]
pub struct VaultAccess {
    pub address: String,
    /// For Providers whose `credentialsRef` names no `vault.auth`.
    pub token: Option<banlieue_secrets::SecretValue>,
}

impl std::fmt::Debug for VaultAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VaultAccess").field("address", &self.address).finish_non_exhaustive()
    }
}

/// What every reconciler shares.
pub struct Context {
    pub client: kube::Client,
    pub components: Components,
    pub libvirt: banlieue_libvirt::Connections,
    pub metrics: Arc<Metrics>,
    /// What `/readyz` answers.
    pub readiness: Arc<Readiness>,
    pub options: Options,
    grants: grants::Cache,
    /// Logged-in Vault clients, for Providers whose credentials live in Vault.
    vault: vault::Clients,
    /// Backend sessions drivers keep between calls, one per Provider.
    pub sessions: Arc<banlieue_runtime::capability::session::SessionStore>,
    /// The image cache (role `imagebuilder`), when configured.
    pub images: Option<Arc<banlieue_imagebuilder::ImageCache>>,
    /// UIDs of the machines this process has created (see `machine::realise`).
    pub(crate) created: Mutex<std::collections::HashSet<String>>,
    /// Which Machines use which Provider, for in-use protection ([`in_use`]).
    pub(crate) in_use: in_use::State,
    /// Per Provider, the operations banlieue may send its backend at once (`spec.limits`).
    pub throttles: throttle::Throttles,
    /// The shards this replica acts on, when the work is sharded.
    pub shards: Option<Arc<shards::Shards>>,
}

impl Context {
    pub fn new(client: kube::Client, options: Options) -> anyhow::Result<Arc<Context>> {
        let rt = Runtime::new(RuntimeConfig { cache_dir: options.cache_dir.clone(), ..Default::default() })?;
        let dirs = banlieue_runtime::source::LocalDirs { builtin: options.builtin_dir.clone(), files: options.component_dir.clone() };
        let components = Components::new(rt, client.clone(), dirs, options.allowed_capabilities.clone());
        let images = match &options.image_cache {
            Some(c) => {
                let schemes: Vec<&str> = c.schemes.iter().map(String::as_str).collect();
                let cache = banlieue_imagebuilder::ImageCache::open(&c.dir, c.limit_bytes, &schemes)
                    .map_err(|e| anyhow::anyhow!("opening the image cache {}: {e}", c.dir.display()))?;
                Some(Arc::new(cache))
            }
            None => None,
        };
        let shards = options.sharding.map(|s| shards::Shards::new(s.count));
        Ok(Arc::new(Context {
            images,
            client,
            components,
            libvirt: banlieue_libvirt::Connections::new(),
            metrics: Arc::new(Metrics::default()),
            readiness: Arc::default(),
            options,
            grants: grants::Cache::default(),
            vault: vault::Clients::default(),
            sessions: banlieue_runtime::capability::session::SessionStore::new(),
            created: Mutex::default(),
            in_use: in_use::State::default(),
            throttles: throttle::Throttles::default(),
            shards,
        }))
    }

    /// A watch of this installation's objects (see [`installation`]).
    pub fn scope(&self) -> kube::runtime::watcher::Config {
        self.options.installation.watch(None)
    }

    /// The API of a namespaced kind over the namespaces this process watches.
    pub fn watched<K>(&self) -> kube::Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        match &self.options.namespace {
            Some(ns) => kube::Api::namespaced(self.client.clone(), ns),
            None => kube::Api::all(self.client.clone()),
        }
    }

    /// The same for a dynamic kind (`<Kind>Machine`).
    pub fn watched_dynamic(&self, resource: &kube::api::ApiResource) -> kube::Api<kube::api::DynamicObject> {
        match &self.options.namespace {
            Some(ns) => kube::Api::namespaced_with(self.client.clone(), ns, resource),
            None => kube::Api::all_with(self.client.clone(), resource),
        }
    }

    /// Record an Event on `object` (core/v1, which `kubectl describe` shows on any
    /// cluster and on the embedded server). Failing to record is logged, never fatal.
    pub async fn event(&self, object: &ObjectReference, warning: bool, reason: reasons::Reason, action: &str, note: impl Into<String>) {
        let reason = reason.as_str();
        use k8s_openapi::api::core::v1::{Event, EventSource};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
        let now = k8s_openapi::jiff::Timestamp::now();
        let namespace = object.namespace.clone().unwrap_or_else(|| "default".into());
        let name = format!("{}.{:x}", object.name.as_deref().unwrap_or("object"), now.as_nanosecond());
        let event = Event {
            metadata: kube::api::ObjectMeta { name: Some(name), namespace: Some(namespace.clone()), ..Default::default() },
            involved_object: object.clone(),
            reason: Some(reason.into()),
            message: Some(note.into()),
            type_: Some(if warning { "Warning" } else { "Normal" }.into()),
            action: Some(action.into()),
            source: Some(EventSource { component: Some(FIELD_MANAGER.into()), host: None }),
            reporting_component: Some(FIELD_MANAGER.into()),
            reporting_instance: Some(self.options.identity.clone()),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: Some(MicroTime(now)),
            count: Some(1),
            ..Default::default()
        };
        let api: kube::Api<Event> = kube::Api::namespaced(self.client.clone(), &namespace);
        if let Err(e) = api.create(&Default::default(), &event).await {
            tracing::debug!(error = %e, reason, "recording event");
        }
    }

    /// Time a component call and count its outcome.
    pub async fn call<T>(&self, component: &str, function: &str, fut: impl Future<Output = Result<T, CallError>>) -> Result<T, CallError> {
        let start = Instant::now();
        tracing::debug!(component, function, "component call");
        let result = fut.await;
        let outcome = match &result {
            Ok(_) => "ok",
            Err(e) => reasons::Reason::of_call(e).as_str(),
        };
        tracing::debug!(component, function, outcome, elapsed = ?start.elapsed(), "component call returned");
        self.metrics.component_call(component, function, start.elapsed(), outcome);
        result
    }
}

/// Errors a reconcile returns to the controller runtime (which retries with backoff).
/// Domain failures (a missing class, a driver error) are conditions, not errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Other(String),
}

impl From<kube::runtime::finalizer::Error<Error>> for Error {
    fn from(e: kube::runtime::finalizer::Error<Error>) -> Self {
        use kube::runtime::finalizer::Error as F;
        match e {
            F::ApplyFailed(e) | F::CleanupFailed(e) => e,
            F::AddFinalizer(e) | F::RemoveFinalizer(e) => Error::Kube(e),
            other => Error::Other(other.to_string()),
        }
    }
}

/// Run the roles until `shutdown` resolves (or leadership is lost, which is an error:
/// the process should exit and be restarted).
pub async fn run(ctx: Arc<Context>, roles: Roles, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    if let Some(addr) = ctx.options.metrics_addr {
        let (metrics, readiness) = (ctx.metrics.clone(), ctx.readiness.clone());
        tokio::spawn(async move {
            if let Err(e) = metrics::serve(addr, metrics, readiness).await {
                tracing::error!(error = %e, "metrics endpoint");
            }
        });
    }
    let mut tasks = tokio::task::JoinSet::new();
    let sharded = |role: Role| ctx.shards.is_some() && matches!(role, Role::Controller | Role::Provider);
    if let (Some(shards), Some(sharding)) = (&ctx.shards, ctx.options.sharding) {
        // The replicas running the same sharded roles split the shards among themselves.
        let group = match (roles.controller, roles.provider) {
            (true, true) => Some("controller-provider"),
            (true, false) => Some("controller"),
            (false, true) => Some("provider"),
            (false, false) => None,
        };
        if let Some(group) = group {
            // Another installation's replicas split their own shards, under other Lease names.
            let group = ctx.options.installation.lease(group);
            let (shards, client, identity) = (shards.clone(), ctx.client.clone(), ctx.options.identity.clone());
            let stop = stopped();
            // In the role set: a killed process's leases are no longer renewed.
            tasks.spawn(async move {
                shards.run(client, &group, identity, sharding.lease_duration, stop).await;
                Ok(())
            });
        }
    }
    for role in roles.enabled() {
        let sharded = sharded(role);
        ctx.readiness.checking(role);
        tokio::spawn(check_permissions(ctx.clone(), role, stopped()));
        let ctx = ctx.clone();
        let stopped = stopped.clone();
        tasks.spawn(async move {
            let mut leadership = None;
            // A sharded role needs no leader: each replica acts only on the shards it holds.
            if ctx.options.leader_election && !sharded {
                leadership = Some(leader::acquire(ctx.client.clone(), SYSTEM_NAMESPACE, &ctx.options.installation.lease(&role.lease()), &ctx.options.identity).await);
            }
            let lost = async {
                match &mut leadership {
                    Some(l) => l.lost().await,
                    None => std::future::pending().await,
                }
            };
            let work = async {
                match role {
                    Role::Operator => operator::run(ctx.clone(), stopped()).await,
                    Role::ImageBuilder => images::run(ctx.clone(), stopped()).await,
                    Role::Provider => futures::future::join(provider::run(ctx.clone(), stopped()), machine::run(ctx.clone(), stopped())).await.0,
                    Role::Controller => futures::future::try_join3(vm::run(ctx.clone(), stopped()), pool::run(ctx.clone(), stopped()), capi::run(ctx.clone(), stopped()))
                        .await
                        .map(|_| ()),
                }
            };
            let role = role.name();
            tokio::select! {
                r = work => r.map_err(|e| anyhow::anyhow!("role {role}: {e}")),
                _ = lost => Err(anyhow::anyhow!("role {role} lost its lease")),
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(())
}

/// Ask the API server which of `role`'s permissions this process lacks, log each one,
/// and keep `/readyz` failing until none is missing. The role runs meanwhile: what it
/// may do still works, and each denied call is logged by the API client.
async fn check_permissions(ctx: Arc<Context>, role: Role, stopped: impl Future<Output = ()>) {
    let check = async {
        loop {
            match permissions::missing(&ctx.client, role).await {
                Ok(missing) if missing.is_empty() => {
                    ctx.readiness.checked(role, missing);
                    tracing::info!(role = role.name(), "every permission the role needs is granted");
                    return;
                }
                Ok(missing) => {
                    for m in &missing {
                        tracing::error!(role = role.name(), user = %role.user(), "missing permission: {m} (see deploy/base/rbac.yaml)");
                    }
                    ctx.readiness.checked(role, missing);
                }
                Err(e) => {
                    // Reviews need no permission on a real cluster; if they fail, the API
                    // server is unreachable or does not offer them: don't hold readiness on it.
                    tracing::warn!(role = role.name(), error = %e, "cannot review the role's permissions");
                    ctx.readiness.checked(role, Vec::new());
                    return;
                }
            }
            tokio::time::sleep(PERMISSION_RECHECK).await;
        }
    };
    tokio::select! {
        _ = check => {}
        _ = stopped => {}
    }
}

/// `namespace/name` of an object, for logs, attributions and backoff keys.
pub fn key<K: kube::Resource>(obj: &K) -> String {
    match obj.meta().namespace.as_deref() {
        Some(ns) => format!("{ns}/{}", obj.meta().name.as_deref().unwrap_or_default()),
        None => obj.meta().name.clone().unwrap_or_default(),
    }
}
