//! The operator role: ProviderClasses and PlacementPolicies.
//!
//! For each, resolve the component source, verify its signature, compile it (into
//! the precompiled cache), and report the digest that runs with `Verified` and
//! `Ready`. A ProviderClass also gets its four infrastructure CRDs installed from
//! the shared generator, so a third-party class needs no release of banlieue.

use std::sync::Arc;

use banlieue_api::common::ComponentSource;
use banlieue_api::provider::ComponentStatus;
use banlieue_api::{infrastructure_crds, PlacementPolicy, ProviderClass};
use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Controller;
use kube::{Resource, ResourceExt};

use crate::failure::{Cause, Failure};
use crate::framework::reconciler::{cached, Frame, Outcome};
use crate::sandbox::components::{LoadError, Loaded};
use crate::status::conditions::{self, READY, VERIFIED};
use crate::status::reasons::Reason;
use crate::status;
use crate::{Context, Error, FIELD_MANAGER};

/// One frame per kind the operator reconciles.
struct Shared {
    ctx: Arc<Context>,
    classes: Frame<ProviderClass>,
    policies: Frame<PlacementPolicy>,
}

pub async fn run(ctx: Arc<Context>, stop: impl Future<Output = ()> + Send + Sync + 'static) -> Result<(), Error> {
    let (stop_a, stop_b) = split(stop);
    let (store, changes) = cached(Api::<ProviderClass>::all(ctx.client.clone()), ctx.scope());
    let classes = Controller::for_stream(changes, store).trigger_backoff(crate::framework::reconciler::PerWatch);
    let (store, changes) = cached(Api::<PlacementPolicy>::all(ctx.client.clone()), ctx.scope());
    let policies = Controller::for_stream(changes, store).trigger_backoff(crate::framework::reconciler::PerWatch);
    let frames = Arc::new(Shared {
        ctx: ctx.clone(),
        classes: Frame::new(ctx.clone(), "providerclass", classes.store(), ()),
        policies: Frame::new(ctx.clone(), "placementpolicy", policies.store(), ()),
    });
    let classes = classes
        .graceful_shutdown_on(stop_a)
        .run(
            |class, frames| async move { frames.classes.reconcile(&class, reconcile_class(&class, &frames.ctx)).await },
            |class, err, frames| frames.classes.error_policy(&class, err),
            frames.clone(),
        )
        .for_each(crate::framework::reconciler::log_run("providerclass"));
    let policies = policies
        .graceful_shutdown_on(stop_b)
        .run(
            |policy, frames| async move { frames.policies.reconcile(&policy, reconcile_policy(&policy, &frames.ctx)).await },
            |policy, err, frames| frames.policies.error_policy(&policy, err),
            frames,
        )
        .for_each(crate::framework::reconciler::log_run("placementpolicy"));
    futures::future::join(classes, policies).await;
    Ok(())
}

/// One stop signal for two controllers.
pub(crate) fn split(stop: impl Future<Output = ()> + Send + Sync + 'static) -> (impl Future<Output = ()> + Send + Sync + 'static, impl Future<Output = ()> + Send + Sync + 'static) {
    let shared = futures::FutureExt::shared(Box::pin(stop));
    (shared.clone(), shared)
}

async fn reconcile_class(class: &ProviderClass, ctx: &Context) -> Result<Outcome, Error> {
    let name = class.name_any();
    let generation = class.metadata.generation;
    let mut status = class.status.clone().unwrap_or_default();

    // The infrastructure kinds first: a class whose component is broken still
    // has its Machines' CRDs, so existing Machines can be listed and cleaned up.
    let crds_installed = match install_crds(ctx, &class.spec.infrastructure_kind).await {
        Ok(()) => Ok(()),
        Err(e) => Err(format!("installing the {}Machine CRDs: {e}", class.spec.infrastructure_kind)),
    };
    let loaded = ctx.components.driver(class).await;
    let loaded_ok = report(&mut status, &loaded.as_ref().map(|l| l.as_ref()), &class.spec.component, generation, crds_installed.clone());
    if let Err(e) = &loaded {
        ctx.event(&class.object_ref(&()), true, e.reason(), "Load", e.to_string()).await;
    }
    write_status::<ProviderClass>(ctx, &name, class.status.as_ref(), status).await?;
    Ok(match loaded_ok {
        Ok(()) if crds_installed.is_ok() => Outcome::AwaitChange,
        Ok(()) => Outcome::Retry,
        Err(f) => Outcome::after(&f),
    })
}

async fn reconcile_policy(policy: &PlacementPolicy, ctx: &Context) -> Result<Outcome, Error> {
    let name = policy.name_any();
    let mut status = policy.status.clone().unwrap_or_default();
    let loaded = ctx.components.policy(policy).await;
    let loaded_ok = report(&mut status, &loaded.as_ref().map(|l| l.as_ref()), &policy.spec.component, policy.metadata.generation, Ok(()));
    if let Err(e) = &loaded {
        ctx.event(&policy.object_ref(&()), true, e.reason(), "Load", e.to_string()).await;
    }
    write_status::<PlacementPolicy>(ctx, &name, policy.status.as_ref(), status).await?;
    Ok(match loaded_ok {
        Ok(()) => Outcome::AwaitChange,
        Err(f) => Outcome::after(&f),
    })
}

/// Fill `status` from a load result; why it is not loaded, if it is not.
fn report<T>(
    status: &mut ComponentStatus,
    loaded: &Result<&Loaded<T>, &LoadError>,
    spec: &ComponentSource,
    generation: Option<i64>,
    crds: Result<(), String>,
) -> Result<(), Failure> {
    status.observed_generation = generation;
    match loaded {
        Ok(l) => {
            status.resolved_digest = Some(l.digest.clone());
            status.contract_version = Some(l.contract_version.clone().to_string());
            let (reason, message) = if spec.source.starts_with("builtin:") {
                (Reason::BuiltIn, format!("{} ships with banlieue", spec.source))
            } else if l.verified {
                (Reason::SignatureVerified, format!("{} verified as {}", spec.source, l.digest))
            } else {
                (Reason::UnsignedAllowed, format!("{} is not signed; running it because verification.allowUnsigned is set", spec.source))
            };
            conditions::set(&mut status.conditions, VERIFIED, true, reason, message, generation);
            match &crds {
                Ok(()) => conditions::set(&mut status.conditions, READY, true, Reason::Loaded, format!("contract {} compiled and ready", l.contract_version), generation),
                Err(e) => conditions::set(&mut status.conditions, READY, false, Reason::CRDInstallFailed, e.clone(), generation),
            };
            Ok(())
        }
        Err(e) => {
            let failure = Failure::from(*e);
            if matches!(failure.reason, Reason::Unsigned | Reason::VerificationFailed) {
                status.resolved_digest = None;
                conditions::set(&mut status.conditions, VERIFIED, false, failure.reason, failure.message.clone(), generation);
            } else if conditions::get(&status.conditions, VERIFIED).is_none() {
                conditions::set(&mut status.conditions, VERIFIED, false, Reason::NotLoaded, "the component could not be fetched or loaded", generation);
            }
            conditions::set(&mut status.conditions, READY, false, failure.reason, failure.message.clone(), generation);
            Err(failure)
        }
    }
}

async fn write_status<K>(ctx: &Context, name: &str, old: Option<&ComponentStatus>, new: ComponentStatus) -> Result<(), Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let api: Api<K> = Api::all(ctx.client.clone());
    status::write(&api, name, old, &new).await?;
    Ok(())
}

async fn install_crds(ctx: &Context, prefix: &str) -> Result<(), String> {
    let crds = infrastructure_crds(prefix).map_err(|e| e.to_string())?;
    let api: Api<CustomResourceDefinition> = Api::all(ctx.client.clone());
    for crd in crds {
        let name = crd.name_any();
        api.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&crd)).await.map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loaded() -> Loaded<()> {
        Loaded { component: (), digest: "sha256:1".into(), verified: true, contract_version: "0.2.0".into(), limits: Default::default() }
    }

    fn source(s: &str) -> ComponentSource {
        serde_json::from_value(serde_json::json!({"source": s})).expect("source")
    }

    fn condition(st: &ComponentStatus, type_: &str) -> (String, String) {
        conditions::get(&st.conditions, type_).map(|c| (c.status.clone(), c.reason.clone())).unwrap_or_default()
    }

    #[test]
    fn a_loaded_component_says_how_it_was_verified_and_whether_its_crds_are_installed() {
        let mut st = ComponentStatus::default();
        let l = loaded();
        assert_eq!(report(&mut st, &Ok(&l), &source("oci://registry.example/drivers/x:v1"), Some(2), Ok(())), Ok(()));
        assert_eq!(condition(&st, VERIFIED), ("True".into(), "SignatureVerified".into()));
        assert_eq!(condition(&st, READY), ("True".into(), "Loaded".into()));
        assert_eq!((st.resolved_digest.as_deref(), st.observed_generation), (Some("sha256:1"), Some(2)));
        assert_eq!(report(&mut st, &Ok(&l), &source("builtin:provider-libvirt"), Some(2), Err("forbidden".into())), Ok(()));
        assert_eq!(condition(&st, VERIFIED), ("True".into(), "BuiltIn".into()));
        assert_eq!(condition(&st, READY), ("False".into(), "CRDInstallFailed".into()));
    }

    #[test]
    fn a_component_that_does_not_load_says_why_and_forgets_a_digest_it_cannot_vouch_for() {
        let mut st = ComponentStatus::default();
        let l = loaded();
        report(&mut st, &Ok(&l), &source("oci://registry.example/drivers/x:v1"), Some(1), Ok(())).unwrap();
        let refused = LoadError::Source(banlieue_runtime::source::SourceError::UnsignedNotAllowed("oci://registry.example/drivers/x:v2".into()));
        let failure = report::<()>(&mut st, &Err(&refused), &source("oci://registry.example/drivers/x:v2"), Some(2), Ok(())).unwrap_err();
        assert_eq!((failure.reason, failure.retry), (Reason::Unsigned, false));
        assert_eq!(condition(&st, VERIFIED), ("False".into(), "Unsigned".into()));
        assert_eq!(st.resolved_digest, None, "the digest that ran before is not vouched for any more");
        let mut st = ComponentStatus::default();
        let pull = LoadError::PullSecret("Secret infra/pull not found".into());
        let failure = report::<()>(&mut st, &Err(&pull), &source("oci://registry.example/drivers/x:v1"), Some(1), Ok(())).unwrap_err();
        assert!(failure.retry, "a pull secret may appear");
        assert_eq!(condition(&st, VERIFIED), ("False".into(), "NotLoaded".into()));
        assert_eq!(condition(&st, READY), ("False".into(), "PullSecretInvalid".into()));
    }
}
