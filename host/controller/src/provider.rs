//! The Provider reconciler (role `provider`): call the driver's `probe` with the
//! Provider's grant and publish what it found — failure domains with labels, free
//! capacity, available classes and features — and `Ready` with the reason when
//! the backend is unreachable or refuses the credentials. Probes repeat every
//! minute so capacity stays current, and at once when the Provider's credentials
//! Secret changes; each first checks whether the credentials changed, and drops
//! the Provider's backend session if they did.

use std::sync::Arc;
use std::time::{Duration, Instant};

use banlieue_api::provider::{Capacity, FailureDomain};
use banlieue_api::{Provider, ProviderClass};
use banlieue_runtime::provider::Inventory;
use banlieue_runtime::{CallError, GuestError};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};

use crate::conditions::{self, READY};
use crate::{Context, Error};

/// How often a healthy Provider is probed again.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(60);

pub async fn run(ctx: Arc<Context>, stop: impl Future<Output = ()> + Send + Sync + 'static) -> Result<(), Error> {
    let controller = Controller::new(ctx.watched::<Provider>(), watcher::Config::default());
    let store = controller.store();
    let by_secret = store.clone();
    controller
        // Fixed or rotated credentials are probed at once (and drop the backend session).
        .watches(ctx.watched::<Secret>(), watcher::Config::default(), move |secret| {
            let (ns, name) = (secret.namespace(), secret.name_any());
            by_secret
                .state()
                .into_iter()
                .filter(|p| {
                    p.namespace() == ns
                        && p.spec.connection.credentials_ref.as_ref().and_then(|c| c.name.as_deref()) == Some(name.as_str())
                })
                .map(|p| ObjectRef::from_obj(&*p))
                .collect::<Vec<_>>()
        })
        .watches(Api::<ProviderClass>::all(ctx.client.clone()), watcher::Config::default(), move |class| {
            let name = class.name_any();
            store
                .state()
                .into_iter()
                .filter(|p| p.spec.provider_class_ref.name == name)
                .map(|p| ObjectRef::from_obj(&*p))
                .collect::<Vec<_>>()
        })
        .graceful_shutdown_on(stop)
        .with_config(kube::runtime::controller::Config::default().concurrency(ctx.options.concurrency))
        .run(reconcile, error_policy, ctx)
        .for_each(|_| futures::future::ready(()))
        .await;
    Ok(())
}

fn error_policy(provider: Arc<Provider>, err: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(provider = %crate::key(&*provider), error = %err, "provider reconcile failed");
    Action::requeue(ctx.backoff(&format!("provider/{}", crate::key(&*provider))))
}

async fn reconcile(provider: Arc<Provider>, ctx: Arc<Context>) -> Result<Action, Error> {
    let start = Instant::now();
    let result = reconcile_inner(&provider, &ctx).await;
    ctx.metrics.reconciled("provider", start.elapsed(), result.as_ref().err().map(|_| "Error"));
    result
}

use crate::grants::Failure;

async fn reconcile_inner(provider: &Provider, ctx: &Context) -> Result<Action, Error> {
    let key = crate::key(provider);
    let generation = provider.metadata.generation;
    let mut status = provider.status.clone().unwrap_or_default();
    let outcome = probe(provider, ctx).await;
    status.observed_generation = generation;
    let action = match outcome {
        Ok(inventory) => {
            status.failure_domains = failure_domains(&inventory);
            let version = inventory.backend_version.unwrap_or_else(|| "unknown backend version".into());
            let message = format!("{version}; {} failure domain(s)", status.failure_domains.len());
            conditions::set(&mut status.conditions, READY, true, "Probed", message, generation);
            ctx.succeeded(&format!("provider/{key}"));
            Action::requeue(PROBE_INTERVAL)
        }
        Err((reason, message, retryable)) => {
            let was_ready = conditions::is_true(&status.conditions, READY);
            conditions::set(&mut status.conditions, READY, false, reason, message.clone(), generation);
            if was_ready || provider.status.is_none() {
                ctx.event(&provider.object_ref(&()), true, reason, "Probe", message).await;
            }
            if retryable { Action::requeue(ctx.backoff(&format!("provider/{key}"))) } else { Action::requeue(PROBE_INTERVAL) }
        }
    };
    {
        let unchanged = provider.status.as_ref().is_some_and(|old| {
            old.failure_domains == status.failure_domains
                && old.observed_generation == status.observed_generation
                && conditions::same(&old.conditions, &status.conditions)
        });
        if !unchanged {
            let api: Api<Provider> = Api::namespaced(ctx.client.clone(), &provider.namespace().unwrap_or_default());
            api.patch_status(&provider.name_any(), &PatchParams::default(), &Patch::Merge(serde_json::json!({ "status": status })))
                .await?;
        }
    }
    Ok(action)
}

async fn probe(provider: &Provider, ctx: &Context) -> Result<Inventory, Failure> {
    let b = crate::grants::backend(ctx, provider, &crate::key(provider)).await?;
    crate::grants::check_credentials(ctx, provider, &b.grants).await;
    ctx.call(&b.class, "probe", b.driver.component.probe(&b.config, b.driver.limits, b.grants))
        .await
        .map_err(|e| call_failure(&e))
}

/// A driver call's failure as a condition reason a user can act on.
pub fn call_failure(e: &CallError) -> Failure {
    let reason = match e {
        CallError::Guest(GuestError::Denied(_)) => "CredentialsRefused",
        CallError::Guest(GuestError::Unavailable(_)) => "BackendUnavailable",
        CallError::Guest(GuestError::InvalidSpec(_)) => "InvalidSpec",
        CallError::Guest(GuestError::NotFound(_)) => "NotFound",
        CallError::Guest(GuestError::Internal(_)) => "DriverError",
        other => other.reason(),
    };
    (reason, e.to_string(), e.is_retryable())
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
