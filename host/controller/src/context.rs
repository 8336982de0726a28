//! What every reconciler shares ([`Context`]) and the settings it is made from ([`Options`]).

use std::collections::HashMap;
use std::path::PathBuf;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use banlieue_api::provider::RequestedCapabilities;
use banlieue_runtime::{CallError, Runtime, RuntimeConfig};
use k8s_openapi::api::core::v1::ObjectReference;

use banlieue_runtime::capability::Grants;
use banlieue_secrets::VaultClient;
use kube::api::DynamicObject;
use kube::runtime::reflector::Store;

use crate::FIELD_MANAGER;
use crate::framework::{installation, shards, throttle};
use crate::ops::metrics::{Metrics, Readiness};
use crate::sandbox::components::Components;
use crate::status::reasons;

/// How often each Provider is probed by default (capacity, and whether its credentials rotated).
pub const PROBE_INTERVAL: Duration = Duration::from_secs(60);

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
    /// Where carried disks are served to backends that download them (none: such backends
    /// cannot be moved to with their disks).
    pub carry_downloads: Option<CarryDownloads>,
    /// Where the provider role serves VM consoles (none: no consoles).
    pub consoles: Option<crate::console::ConsoleOptions>,
    /// Watch namespaced objects in this namespace only (all namespaces when `None`).
    pub namespace: Option<String>,
    /// Split the `controller` and `provider` roles' work across replicas by shard leases
    /// instead of one leader per role (`framework::shards`); `None`: one leader does it all.
    pub sharding: Option<shards::Sharding>,
    /// The installation this process belongs to: the objects it acts on ([`Installation`](crate::Installation)).
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
            probe_interval: PROBE_INTERVAL,
            namespace: None,
            image_cache: None,
            image_build: None,
            carry_downloads: None,
            consoles: None,
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

/// The server of one-time URLs a backend downloads a carried disk from
/// ([`banlieue_imagebuilder::handout`]).
#[derive(Clone, Debug)]
pub struct CarryDownloads {
    /// The address to listen on.
    pub listen: std::net::SocketAddr,
    /// How backends reach it (`http://host:port`); by default the address listened on.
    pub url: Option<String>,
    /// How long a URL works, unused.
    pub ttl: std::time::Duration,
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

/// The gauges of this process's own state, read at each scrape: each Provider's throttle,
/// the shards held, and the backend sessions' logins and reuses.
fn process_gauges(
    throttles: Arc<throttle::Throttles>,
    shards: Option<Arc<shards::Shards>>,
    sessions: Arc<banlieue_runtime::capability::session::SessionStore>,
) -> crate::ops::metrics::fleet::Source {
    use crate::ops::metrics::{fleet, provider_labels};
    Box::new(move |s| {
        for (provider, queued, in_flight) in throttles.usage() {
            s.add(fleet::THROTTLE_QUEUED, provider_labels(&provider), queued as f64);
            s.add(fleet::THROTTLE_IN_FLIGHT, provider_labels(&provider), in_flight as f64);
        }
        if let Some(shards) = &shards {
            let group = || ("group", shards.group().to_string());
            s.add(fleet::SHARDS, vec![group()], f64::from(shards.count()));
            for shard in shards.held() {
                s.add(fleet::SHARD_HELD, vec![group(), ("shard", shard.to_string())], 1.0);
            }
            let (gained, lost) = shards.handovers();
            s.add(fleet::SHARD_HANDOVERS, vec![group(), ("direction", "gained".into())], gained as f64);
            s.add(fleet::SHARD_HANDOVERS, vec![group(), ("direction", "lost".into())], lost as f64);
        }
        for (scope, uses) in sessions.uses() {
            // A scope is the Provider's `namespace/name/uid`.
            let provider = scope.rsplit_once('/').map_or(scope.as_str(), |(p, _)| p);
            s.add(fleet::LOGINS, provider_labels(provider), uses.logins as f64);
            s.add(fleet::SESSION_REUSES, provider_labels(provider), uses.reuses as f64);
        }
    })
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
    /// The grants built per Provider (by `namespace/name`), with the fingerprint of what
    /// they were built from ([`crate::sandbox::grants`]).
    pub(crate) grants: Mutex<HashMap<String, (String, Grants)>>,
    /// Logged-in Vault clients, for Providers whose credentials live in Vault.
    pub(crate) vault: Mutex<HashMap<String, (String, VaultClient)>>,
    /// Backend sessions drivers keep between calls, one per Provider.
    pub sessions: Arc<banlieue_runtime::capability::session::SessionStore>,
    /// The image cache (role `imagebuilder`), when configured.
    pub images: Option<Arc<banlieue_imagebuilder::ImageCache>>,
    /// One-time download URLs of carried disks, when configured (served by [`crate::run`]).
    pub handouts: Option<Arc<banlieue_imagebuilder::Handouts>>,
    /// The console server, when configured (served by [`crate::run`] with the provider role).
    pub consoles: Option<Arc<crate::console::ConsoleServer>>,
    /// UIDs of the machines this process has created (see `machine::realise`).
    pub(crate) created: Mutex<std::collections::HashSet<String>>,
    /// The provider role's Machine caches, one per infrastructure kind once it has listed
    /// them all: which Machines use which Provider, for in-use protection
    /// ([`crate::controllers::in_use`]).
    pub(crate) machine_caches: Arc<Mutex<Vec<Store<DynamicObject>>>>,
    /// When each held Provider's `InUse` condition was last written (by UID): each write
    /// wakes the Provider again, so the count is written at most every
    /// [`crate::controllers::in_use::RECHECK`].
    pub(crate) in_use_reported: Mutex<HashMap<String, Instant>>,
    /// Per Provider, the operations banlieue may send its backend at once (`spec.limits`).
    pub throttles: Arc<throttle::Throttles>,
    /// Per Provider, the driver operations of the last minutes (`status.operations`).
    pub recent: crate::ops::recent::Recent,
    /// The shards this replica acts on, when the work is sharded.
    pub shards: Option<Arc<shards::Shards>>,
    /// The UID of the cluster's `kube-system` Namespace, read once: what names the cluster in
    /// the owner marks of adopted machines ([`Context::installation_id`]).
    cluster_id: tokio::sync::OnceCell<String>,
    /// Backend VMs being adopted by this process (`<Provider>/<backend id>` → Machine UID):
    /// two Machines naming one VM never stamp it at once ([`crate::controllers::machine`]).
    pub(crate) adopting: Mutex<HashMap<String, String>>,
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
        let handouts = match (&options.carry_downloads, &images) {
            (Some(c), Some(_)) => Some(
                banlieue_imagebuilder::Handouts::bind(c.listen, c.url.clone(), c.ttl).map_err(|e| anyhow::anyhow!("listening on {} for carried-disk downloads: {e}", c.listen))?,
            ),
            _ => None,
        };
        let consoles = match &options.consoles {
            Some(c) => Some(crate::console::ConsoleServer::bind(c).map_err(|e| anyhow::anyhow!("the console server on {}: {e}", c.listen))?),
            None => None,
        };
        let metrics = Arc::new(Metrics::default());
        let throttles = Arc::new(throttle::Throttles::default());
        let sessions = banlieue_runtime::capability::session::SessionStore::new();
        metrics.fleet.add(process_gauges(throttles.clone(), shards.clone(), sessions.clone()));
        Ok(Arc::new(Context {
            images,
            handouts,
            consoles,
            client,
            components,
            libvirt: banlieue_libvirt::Connections::new(),
            metrics,
            readiness: Arc::default(),
            options,
            grants: Mutex::default(),
            vault: Mutex::default(),
            sessions,
            created: Mutex::default(),
            machine_caches: Arc::default(),
            in_use_reported: Mutex::default(),
            throttles,
            recent: Default::default(),
            shards,
            cluster_id: tokio::sync::OnceCell::new(),
            adopting: Mutex::default(),
        }))
    }

    /// This installation as owner marks on backend VMs name it: the cluster (its
    /// `kube-system` Namespace's UID, which lives as long as the cluster) and, for a named
    /// installation, `/<instance>`. Two clusters, or two installations on one, never share it.
    pub async fn installation_id(&self) -> Result<String, kube::Error> {
        let cluster = self
            .cluster_id
            .get_or_try_init(|| async {
                let ns = kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(self.client.clone()).get("kube-system").await?;
                Ok::<_, kube::Error>(ns.metadata.uid.unwrap_or_default())
            })
            .await?;
        Ok(match self.options.installation.instance() {
            Some(instance) => format!("{cluster}/{instance}"),
            None => cluster.clone(),
        })
    }

    /// A watch of this installation's objects (see [`Installation`](crate::Installation)).
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

    /// Time a component call and count its outcome, in a span of its own.
    pub async fn call<T>(&self, component: &str, function: &str, fut: impl Future<Output = Result<T, CallError>>) -> Result<T, CallError> {
        use tracing::Instrument;
        let start = Instant::now();
        let _instance = self.metrics.instance(component);
        let span = tracing::info_span!("component call", otel.name = %format!("{component} {function}"), component, function, outcome = tracing::field::Empty);
        tracing::debug!(component, function, "component call");
        let result = fut.instrument(span.clone()).await;
        let outcome = match &result {
            Ok(_) => "ok",
            Err(e) => crate::failure::Cause::reason(e).as_str(),
        };
        span.record("outcome", outcome);
        tracing::debug!(component, function, outcome, elapsed = ?start.elapsed(), "component call returned");
        self.metrics.component_call(component, function, start.elapsed(), outcome);
        result
    }

    /// A driver export for `provider` that could not be called (`failure` says why: its
    /// backend or credentials unreachable, its driver not loaded), counted as one that failed.
    pub fn unreached(&self, provider: &str, class: &str, operation: &str, failure: &crate::Failure) {
        let outcome = crate::ops::metrics::outcome_label(failure.reason.as_str());
        self.metrics.provider_operation(provider, class, operation, Duration::ZERO, &outcome);
        self.recent.record(provider, operation, &outcome, Some(&failure.message));
    }
}

