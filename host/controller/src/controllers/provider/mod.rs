//! The Provider reconciler (role `provider`): call the driver's `probe` with the
//! Provider's grant and publish what it found — failure domains with labels, free
//! capacity, available classes and features, and, when asked, the machines on the
//! backend ([`discovery`]) — and `Ready` with the reason when
//! the backend is unreachable or refuses the credentials. Probes repeat every
//! `--probe-interval` (a minute) so capacity stays current; each first reads the
//! credentials (a Kubernetes Secret, or the latest version of a Vault path) and
//! drops the Provider's backend session if they changed, so a rotation is used
//! within one interval.
//!
//! banlieue watches no Secrets (it may only `get` the ones objects reference):
//! credentials a backend refused are re-read every [`CREDENTIALS_RECHECK`] and
//! probed again as soon as they change — not before, so a wrong password is not
//! tried against the backend over and over.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use banlieue_api::provider::{Capacity, FailureDomain};
use banlieue_api::{Provider, ProviderClass};
use banlieue_runtime::provider::Inventory;
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};

mod discovery;

use crate::framework::reconciler::{Frame, Outcome};
use crate::status::conditions::{self, READY};
use crate::status;
use crate::{Context, Error};

/// How often refused credentials are re-read to notice that they were fixed.
pub const CREDENTIALS_RECHECK: Duration = Duration::from_secs(5);

/// What the Provider reconciler keeps between reconciles.
struct Shared {
    ctx: Arc<Context>,
    frame: Frame<Provider>,
    providers: Store<Provider>,
    /// Providers whose credentials the backend refused, by session scope.
    refused: Mutex<HashMap<String, Refused>>,
}

pub async fn run(ctx: Arc<Context>, stop: impl Future<Output = ()> + Send + Sync + 'static) -> Result<(), Error> {
    let (store, changes) = crate::framework::reconciler::cached(ctx.watched::<Provider>(), ctx.scope());
    // Its own writes of `status.operations` do not bring a Provider back (it would probe again at once).
    let changes = changes.filter(crate::framework::reconciler::provider_news(store.clone()));
    let controller = Controller::for_stream(changes, store.clone()).trigger_backoff(crate::framework::reconciler::PerWatch);
    ctx.metrics.fleet.providers(store.clone());
    ctx.metrics.fleet.machines(ctx.machine_caches.clone());
    let probes = Arc::new(Shared {
        ctx: ctx.clone(),
        frame: Frame::new(ctx.clone(), "provider", store.clone(), ()).sharded_by(crate::key),
        providers: store.clone(),
        refused: Mutex::default(),
    });
    controller
        .watches_stream(crate::framework::reconciler::changes(Api::<ProviderClass>::all(ctx.client.clone()), ctx.scope()), move |class| {
            let name = class.name_any();
            store
                .state()
                .into_iter()
                .filter(|p| p.spec.provider_class_ref.name == name)
                .map(|p| ObjectRef::from_obj(&*p))
                .collect::<Vec<_>>()
        })
        .reconcile_all_on(crate::framework::reconciler::shard_gains(&ctx))
        .graceful_shutdown_on(stop)
        .with_config(kube::runtime::controller::Config::default().concurrency(ctx.options.concurrency))
        .run(reconcile, |p, err, probes| probes.frame.error_policy(&p, err), probes)
        .for_each(crate::framework::reconciler::log_run("provider"))
        .await;
    Ok(())
}

async fn reconcile(provider: Arc<Provider>, probes: Arc<Shared>) -> Result<Action, Error> {
    probes.frame.reconcile(&provider, reconcile_inner(&provider, &probes)).await
}

use crate::failure::Failure;
use crate::status::reasons::Reason;

async fn reconcile_inner(provider: &Provider, probes: &Shared) -> Result<Outcome, Error> {
    let ctx = &*probes.ctx;
    // A deleted Provider is not probed: it waits, kept by its finalizer, until no Machine
    // needs it to tear down its backend VM (see `in_use`).
    if provider.metadata.deletion_timestamp.is_some() {
        return crate::controllers::in_use::deleted(ctx, provider, &probes.providers).await;
    }
    crate::controllers::in_use::protect(ctx, provider, &probes.providers).await;
    let key = crate::key(provider);
    let generation = provider.metadata.generation;
    let mut status = provider.status.clone().unwrap_or_default();
    let backend = crate::sandbox::grants::backend(ctx, provider, &key).await;
    let read = match &backend {
        Ok(b) => read_credentials(b).await,
        Err(_) => Ok(None),
    };
    let credentials = read.as_ref().ok().copied().flatten();
    let refused = Refused { generation, credentials, at: Instant::now() };
    // Keyed by UID too: a Provider recreated under the same name is probed afresh.
    let memo_key = crate::sandbox::grants::session_scope(provider);
    if probes.refused().get(&memo_key).is_some_and(|was| was.holds(&refused, ctx.options.probe_interval)) {
        return Ok(Outcome::Requeue(CREDENTIALS_RECHECK));
    }
    let outcome = match (backend, read) {
        (Ok(b), Ok(_)) => probe(provider, ctx, b).await,
        // Credentials that cannot be read, or a login Vault refused, or a driver or backend
        // that cannot be reached: the backend is not called (its machines are left as they
        // are), and the probe counts as failed, as if the driver had said so.
        (Ok(_), Err(failure)) | (Err(failure), _) => {
            ctx.unreached(&key, &provider.spec.provider_class_ref.name, "probe", &failure);
            Err(failure)
        }
    };
    // Credentials refused or unreadable: the grants are built afresh next time, in case what
    // they come from (a Vault login's Secret) was fixed.
    if matches!(&outcome, Err(Failure { reason: r, .. }) if [Reason::CredentialsRefused, Reason::CredentialsUnavailable, Reason::CredentialsNotFound].contains(r)) {
        crate::sandbox::grants::forget(ctx, provider);
    }
    {
        let mut memo = probes.refused();
        // Providers deleted since are forgotten here.
        let live: HashSet<String> = probes.providers.state().iter().map(|p| crate::sandbox::grants::session_scope(p)).collect();
        memo.retain(|scope, _| live.contains(scope));
        match &outcome {
            Err(Failure { reason, .. }) if *reason == Reason::CredentialsRefused => memo.insert(memo_key, refused),
            _ => memo.remove(&memo_key),
        };
    }
    status.observed_generation = generation;
    let next = match outcome {
        Ok((inventory, features, discovered)) => {
            if let Some(d) = discovered {
                status.discovery = Some(d);
            }
            status.failure_domains = failure_domains(&inventory);
            status.driver_features = features.iter().map(|f| f.name().to_string()).collect();
            // Where its machines' consoles are: this replica's server, which probes it.
            let consoles = features.iter().any(|f| matches!(f, banlieue_runtime::Feature::Console | banlieue_runtime::Feature::Vnc));
            status.console = ctx.consoles.as_ref().filter(|_| consoles).map(|c| c.endpoint());
            let version = inventory.backend_version.unwrap_or_else(|| "unknown backend version".into());
            let message = format!("{version}; {} failure domain(s)", status.failure_domains.len());
            conditions::set(&mut status.conditions, READY, true, Reason::Probed, message, generation);
            Outcome::Requeue(ctx.options.probe_interval)
        }
        Err(Failure { reason, message, retry: retryable }) => {
            if conditions::set(&mut status.conditions, READY, false, reason, message.clone(), generation) {
                ctx.event(&provider.object_ref(&()), true, reason, "Probe", message).await;
            }
            match (reason == Reason::CredentialsRefused, retryable) {
                (true, _) => Outcome::Requeue(CREDENTIALS_RECHECK),
                (false, true) => Outcome::Retry,
                (false, false) => Outcome::Requeue(ctx.options.probe_interval),
            }
        }
    };
    status.operations = ctx.recent.summary(&crate::key(provider));
    let api: Api<Provider> = Api::namespaced(ctx.client.clone(), &provider.namespace().unwrap_or_default());
    status::write(&api, &provider.name_any(), provider.status.as_ref(), &status).await?;
    Ok(next)
}

impl Shared {
    fn refused(&self) -> std::sync::MutexGuard<'_, HashMap<String, Refused>> {
        self.refused.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The driver's inventory, what it offers beyond the calls every driver answers, and the
/// machines on the backend when the Provider asks for them ([`discovery`]).
async fn probe(provider: &Provider, ctx: &Context, b: crate::sandbox::grants::Backend) -> Result<(Inventory, Vec<banlieue_runtime::Feature>, Option<banlieue_api::provider::Discovery>), Failure> {
    crate::sandbox::grants::check_credentials(ctx, provider, &b.grants).await;
    let inventory = b.drive(ctx, "probe", b.driver.component.probe(&b.config, b.driver.limits, b.grants.clone())).await.map_err(Failure::from)?;
    let features = b.drive(ctx, "features", b.driver.component.features(b.driver.limits, b.grants.clone())).await.map_err(Failure::from)?;
    let discovered = match discovery::asked(provider) {
        Some(requested) => Some(discovery::discover(ctx, &b, requested, &features).await),
        None => None,
    };
    Ok((inventory, features, discovered))
}


/// A probe the backend refused: probed again only when the Provider or its
/// credentials change, or after the probe interval.
#[derive(Debug)]
pub(crate) struct Refused {
    generation: Option<i64>,
    credentials: Option<[u8; 32]>,
    at: Instant,
}

impl Refused {
    fn holds(&self, now: &Refused, interval: Duration) -> bool {
        self.generation == now.generation && self.credentials == now.credentials && now.at.duration_since(self.at) < interval
    }
}

/// The fingerprint of the Provider's credentials (none without a secrets grant). Their
/// source being unreachable (`CredentialsUnavailable`) or refusing banlieue
/// (`CredentialsRefused`) or holding none of the granted keys (`CredentialsNotFound`) is
/// reported as such; anything else (one key missing) is the driver's to report.
async fn read_credentials(b: &crate::sandbox::grants::Backend) -> Result<Option<[u8; 32]>, Failure> {
    use banlieue_runtime::capability::WitError;
    let Some(secrets) = b.grants.secrets.as_ref() else { return Ok(None) };
    match secrets.fingerprint().await {
        Ok(f) => Ok(Some(f)),
        Err(WitError::Unavailable(m)) => Err(Failure::transient(Reason::CredentialsUnavailable, format!("cannot read the credentials: {m}"))),
        Err(WitError::Denied(m)) => Err(Failure::until_changed(Reason::CredentialsRefused, format!("the credentials' source refused banlieue: {m}"))),
        Err(WitError::NotFound(m)) => Err(Failure::transient(Reason::CredentialsNotFound, m)),
        Err(_) => Ok(None),
    }
}

fn failure_domains(inventory: &Inventory) -> Vec<FailureDomain> {
    inventory
        .failure_domains
        .iter()
        .map(|fd| FailureDomain {
            name: fd.name.clone(),
            labels: fd.labels.iter().cloned().collect(),
            capacity: Capacity { cpus: fd.capacity.cpus, memory_mib: fd.capacity.memory_mib, storage_gib: fd.capacity.storage_gib },
            storage_classes: fd.storage_classes.clone(),
            network_classes: fd.network_classes.clone(),
            features: fd.features.clone(),
        })
        .collect()
}
