//! The infrastructure-machine reconciler (role `provider`): one generic reconciler
//! over every installed `<Kind>Machine`, calling the ProviderClass's driver with
//! the Provider's grant.
//!
//! - `create` is keyed by the Machine's UID, so a retry or a restart of this
//!   process never makes a second backend VM;
//! - `describe` feeds the CAPI v1beta2 status (`initialization.provisioned`,
//!   `addresses`, `failureDomain`, conditions) and `spec.providerID`;
//! - `set-power` drives `spec.vm.powerState` and restarts on a new
//!   `spec.vm.restartRequestedAt`;
//! - a change of CPUs, memory or disk sizes (a grown class) is applied by `create` on the
//!   existing machine while it is off — at once, after a power-off (`updatePolicy: Restart`)
//!   or at the next power cycle — and shown as `ConfigurationApplied` ([`hardware`]);
//! - `delete` runs behind the finalizer `banlieue.io/provider`, so the Machine
//!   outlives its backend VM — or, with `deletionPolicy: Orphan`, `release` leaves the VM
//!   without banlieue's mark;
//! - a machine with `spec.vm.adopt` takes over an existing backend VM ([`adopt`]) instead
//!   of `create`.
//!
//! A Machine annotated `cluster.x-k8s.io/paused`, or of a paused CAPI Cluster, is left
//! alone. Retryable driver errors back off; terminal ones become a condition (and, for
//! CAPI's v1beta1 readers, `status.deprecated.v1beta1.failureReason`) and wait for a change.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use banlieue_api::common::MachinePhase;
use banlieue_api::infra::{InfraMachineSpec, InfraMachineStatus};
use banlieue_api::{Provider, ProviderClass};
use banlieue_runtime::provider::MachineRef;
use banlieue_runtime::CallError;
use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};

use crate::controllers::capi::contract;
use crate::failure::Failure;
use crate::framework::infra_kinds;
use crate::framework::reconciler::{cached, dynamic_controller, CachesReady, Frame, Outcome};
use crate::status::conditions::{self, READY};
use crate::status::finalizer;
use crate::status::reasons::Reason;
use crate::status;
use crate::{Context, Error};

mod adopt;
pub(crate) mod carry;
pub(crate) mod convert;
mod delete;
mod hardware;
mod realise;

pub use crate::framework::infra_kinds::MACHINE_FINALIZER as FINALIZER;
/// How often a settled machine is described again, to notice drift.
pub const RESYNC: Duration = Duration::from_secs(300);
/// The first look again at a machine still on its way (powering on, waiting for an address).
pub const SETTLING_MIN: Duration = Duration::from_secs(2);

/// What every reconcile of this controller shares.
struct Shared {
    ctx: Arc<Context>,
    frame: Frame<DynamicObject>,
    resource: ApiResource,
    /// The Providers and ProviderClasses machines name, kept by watches (no GET per reconcile).
    providers: Store<Provider>,
    provider_classes: Store<ProviderClass>,
    caches_ready: CachesReady,
}

/// Start a reconciler for every `<Kind>Machine` as ProviderClasses declare kinds.
pub async fn run(ctx: Arc<Context>, stop: impl Future<Output = ()> + Send + Sync + 'static) -> Result<(), Error> {
    infra_kinds::per_kind(ctx.client.clone(), ctx.scope(), stop, |kind, stop| reconcile_kind(ctx.clone(), kind, stop)).await;
    Ok(())
}

async fn reconcile_kind(ctx: Arc<Context>, prefix: String, stop: impl Future<Output = ()> + Send + Sync + 'static) {
    let resource = infra_kinds::machine_resource(&prefix);
    tracing::info!(kind = %resource.kind, "reconciling machines");
    let (controller, store, frame) = dynamic_controller(&ctx, "machine", &resource, None);
    // Everything that talks to one backend runs in the replica holding its Provider's shard.
    let frame = frame.sharded_by(shard_key).continues_trace(creation_trace);
    let (providers, provider_changes) = cached(ctx.watched::<Provider>(), ctx.scope());
    let (provider_classes, provider_class_changes) = cached(Api::<ProviderClass>::all(ctx.client.clone()), ctx.scope());
    let provider_changes = provider_changes.filter(wakes_machines(providers.clone()));
    let kind = Arc::new(Shared { ctx: ctx.clone(), frame, resource: resource.clone(), providers, provider_classes, caches_ready: CachesReady::default() });
    let (by_cluster, r2) = (store.clone(), resource.clone());
    // The Provider reconciler counts a deleted Provider's Machines here (`in_use`).
    crate::controllers::in_use::add_cache(&ctx, store.clone());
    controller
        // A ProviderClass reaches machines through their Provider's probe; this stream only keeps the cache.
        .watches_stream(provider_class_changes, |_| std::iter::empty::<ObjectRef<DynamicObject>>())
        // A Provider that appears, goes, changes or becomes Ready unblocks the machines that name it.
        .watches_stream(provider_changes, move |p| {
            let (ns, name) = (p.namespace(), p.name_any());
            store
                .state()
                .into_iter()
                .filter(|m| m.namespace() == ns && spec(m).ok().and_then(|s| s.provider_ref).is_some_and(|r| r.name == name))
                .map(|m| ObjectRef::from_obj_with(&*m, resource.clone()))
                .collect::<Vec<_>>()
        })
        // Unpausing a CAPI Cluster resumes its machines.
        .watches_stream_with(
            contract::changes(&ctx, contract::cluster_resource()),
            move |c: DynamicObject| contract::of_cluster(&by_cluster, &c, &r2),
            contract::cluster_resource(),
        )
        .graceful_shutdown_on(stop)
        .run(reconcile, |m, err, kind| kind.frame.error_policy(&m, err), kind)
        .for_each(crate::framework::reconciler::log_run("machine"))
        .await;
}

/// The trace of the VM reconcile that made the Machine, until the Machine is provisioned: one
/// VM's creation is one trace (see [`crate::ops::traces`]).
fn creation_trace(m: &DynamicObject) -> Option<String> {
    if m.data["status"]["initialization"]["provisioned"].as_bool() == Some(true) {
        return None;
    }
    m.annotations().get(crate::ops::traces::TRACEPARENT).cloned()
}

/// Which Provider events wake the machines naming it: a Provider new to this process, one
/// deleted, one whose spec or metadata changed, and one that became Ready (its backend is back:
/// machines backing off from it try again now). Not its other status changes — the capacity a
/// probe found, a failure's message, becoming unready: machines read only a Provider's spec,
/// and waking them then only repeats calls a failing backend is spared by their backoff
/// (`faults_backends` saw a clone retried 24 ms after it failed, for a Provider status write).
/// kube's `predicate_filter` would not do: a deleted Provider (gone once its last finalizer
/// is removed) looks the same as the last copy of it, and is told apart here by its absence from the cache, which
/// the reflector updated before the event came on.
fn wakes_machines(providers: Store<Provider>) -> impl FnMut(&Result<Provider, kube::runtime::watcher::Error>) -> std::future::Ready<bool> + Send {
    let mut seen: HashMap<ObjectRef<Provider>, (Option<u64>, bool)> = HashMap::new();
    move |event| {
        let Ok(p) = event else {
            return std::future::ready(true);
        };
        let key = ObjectRef::from_obj(p);
        if providers.get(&key).is_none() {
            seen.remove(&key);
            return std::future::ready(true);
        }
        let ready = p.status.as_ref().is_some_and(|s| conditions::is_true(&s.conditions, READY));
        // A discovery asked of the Provider is none of its machines' business.
        let mut meta = p.metadata.clone();
        if let Some(a) = meta.annotations.as_mut() {
            a.remove(banlieue_api::provider::DISCOVER_ANNOTATION);
        }
        if meta.annotations.as_ref().is_some_and(|a| a.is_empty()) {
            meta.annotations = None;
        }
        let now = (crate::framework::reconciler::acted_on(&Provider { metadata: meta, spec: p.spec.clone(), status: None }), ready);
        let wake = match seen.insert(key, now) {
            None => true,
            Some((acted, was_ready)) => acted != now.0 || (ready && !was_ready),
        };
        std::future::ready(wake)
    }
}

/// A machine belongs to its Provider's shard (its own, while CAPI has not bound it to one).
pub fn shard_key(m: &DynamicObject) -> String {
    match spec(m).ok().and_then(|s| s.provider_ref) {
        Some(p) => format!("{}/{}", m.namespace().unwrap_or_default(), p.name),
        None => crate::key(m),
    }
}

fn spec(m: &DynamicObject) -> Result<InfraMachineSpec, serde_json::Error> {
    serde_json::from_value(m.data.get("spec").cloned().unwrap_or_default())
}

fn status(m: &DynamicObject) -> InfraMachineStatus {
    m.data.get("status").cloned().and_then(|s| serde_json::from_value(s).ok()).unwrap_or_default()
}

async fn reconcile(m: Arc<DynamicObject>, kind: Arc<Shared>) -> Result<Action, Error> {
    kind.caches_ready
        .wait(|| async {
            let not_ready = |_| Error::CacheStopped("machine reconciler");
            kind.providers.wait_until_ready().await.map_err(not_ready)?;
            kind.provider_classes.wait_until_ready().await.map_err(not_ready)
        })
        .await?;
    kind.frame.reconcile(&m, reconcile_inner(&m, &kind)).await
}

use crate::sandbox::grants::Backend;

async fn reconcile_inner(m: &DynamicObject, kind: &Shared) -> Result<Outcome, Error> {
    let ctx = &kind.ctx;
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &m.namespace().unwrap_or_default(), &kind.resource);
    let spec = match spec(m) {
        Ok(s) => s,
        Err(e) => {
            let mut st = status(m);
            conditions::set(&mut st.conditions, READY, false, Reason::InvalidSpec, format!("spec does not parse: {e}"), m.metadata.generation);
            write_status(&api, m, st).await?;
            return Ok(Outcome::AwaitChange);
        }
    };
    if spec.provider_ref.is_none() {
        // Not bound to a Provider yet (a machine CAPI made from a template): `capi::machine`
        // binds it and owns its conditions until then; nothing exists on a backend.
        if m.metadata.deletion_timestamp.is_some() && finalizer::has(m, FINALIZER) {
            finalizer::remove(&api, m, FINALIZER).await?;
        }
        return Ok(Outcome::AwaitChange);
    }
    // Paused (by its VM, or by CAPI on the machine or its Cluster): nothing is touched,
    // not even a deletion. Machines of a CAPI cluster say so in a `Paused` condition.
    let capi_cluster = if contract::cluster_name(m).is_some() { contract::cluster_of(&ctx.client, m).await? } else { None };
    let paused = contract::paused(capi_cluster.as_ref(), m);
    let mut base = status(m);
    if contract::cluster_name(m).is_some() {
        let (reason, why) = match &paused {
            Some(why) => (Reason::Paused, why.clone()),
            None => (Reason::NotPaused, String::new()),
        };
        conditions::set(&mut base.conditions, contract::PAUSED_CONDITION, paused.is_some(), reason, why, m.metadata.generation);
    }
    if paused.is_some() {
        write_status(&api, m, base).await?;
        return Ok(Outcome::AwaitChange);
    }
    // At most half of the concurrent reconciles for one Provider's machines: a backend that
    // hangs holds the ones it has until the request timeout, never all of them.
    let Some(_share) = ctx.throttles.share(&shard_key(m), (usize::from(ctx.options.concurrency) / 2).max(1)) else {
        return Ok(Outcome::Requeue(crate::framework::throttle::recheck_after()));
    };
    if m.metadata.deletion_timestamp.is_some() {
        return delete::delete(m, &spec, kind, &api).await;
    }
    if !finalizer::has(m, FINALIZER) {
        // Machines a VM makes come with it; those CAPI makes from templates get it here,
        // and the reconcile goes on (no write below depends on the resourceVersion read).
        finalizer::add(&api, m, FINALIZER).await?;
    }
    let mut st = base;
    let mut generation = m.metadata.generation;
    let outcome = async {
        let backend = backend(kind, m, &spec).await?;
        realise::realise(ctx, m, &kind.resource, &spec, &mut st, &backend).await
    }
    .await;
    let next = match outcome {
        Ok(observed) => {
            // The providerID goes first, so the status written next observes the generation
            // it makes: one status write, not a second one for the reconcile it wakes.
            // (Readers act on `initialization.provisioned`, which only that status sets.)
            if spec.provider_id.as_deref() != Some(observed.provider_id.as_str()) && !observed.provider_id.is_empty() {
                let patch = serde_json::json!({ "spec": { "providerID": observed.provider_id } });
                let patched = api.patch(&m.name_any(), &PatchParams::default(), &Patch::Merge(patch)).await?;
                generation = patched.metadata.generation;
            }
            realise::apply_observed(&mut st, &spec, &observed, generation);
            write_status(&api, m, st.clone()).await?;
            return Ok(Outcome::Requeue(next_look(&st)));
        }
        Err(Failure { reason, message, retry: retryable }) => {
            let changed = conditions::set(&mut st.conditions, READY, false, reason, message.clone(), generation);
            st.observed_generation = generation;
            if !retryable {
                // v1beta1 readers learn of a terminal failure only from these fields.
                st.deprecated = Some(contract::v1beta1_failure(format!("{reason}: {message}")));
            }
            if changed {
                ctx.event(&m.object_ref(&kind.resource), reason != Reason::Queued, reason, "Reconcile", message).await;
            }
            after_failure(reason, retryable)
        }
    };
    write_status(&api, m, st).await?;
    Ok(next)
}

/// When to describe the machine again. A machine whose phase is still moving (a guest
/// getting its address, powering on or off) is looked at again soon, then less often
/// the longer it stays there (a tenth of the time since `Ready` last changed), so a
/// guest without tools or agent costs little; a settled one at [`RESYNC`].
fn next_look(st: &InfraMachineStatus) -> Duration {
    let settled = matches!(st.phase, Some(MachinePhase::Running | MachinePhase::PoweredOff) | None);
    if settled {
        return RESYNC;
    }
    let since = conditions::get(&st.conditions, READY)
        .and_then(|c| Duration::try_from(k8s_openapi::jiff::Timestamp::now().duration_since(c.last_transition_time.0)).ok())
        .unwrap_or_default();
    (since / 10).clamp(SETTLING_MIN, RESYNC)
}

async fn backend(kind: &Shared, m: &DynamicObject, spec: &InfraMachineSpec) -> Result<Backend, Failure> {
    let ns = m.namespace().unwrap_or_default();
    let Some(provider_ref) = &spec.provider_ref else {
        // Unbound machines never get here (see `reconcile_inner`).
        return Err(Failure::until_changed(Reason::InvalidSpec, "spec.providerRef is not set"));
    };
    // A Provider that appears later wakes its machines (the Provider watch above).
    let provider = kind
        .providers
        .get(&ObjectRef::new(&provider_ref.name).within(&ns))
        .ok_or_else(|| Failure::until_changed(Reason::ProviderNotFound, format!("Provider {:?} not found in namespace {ns}", provider_ref.name)))?;
    let class = kind.provider_classes.get(&ObjectRef::new(&provider.spec.provider_class_ref.name));
    crate::sandbox::grants::backend_of_class(&kind.ctx, &provider, class.as_deref(), &crate::key(m)).await
}

/// Set on a Machine moved from another cluster (`banlieue bootstrap`): the UID the machine
/// had where it was created, which its backend VM is keyed by.
pub const BACKEND_UID: &str = "banlieue.io/backend-uid";

/// What the driver knows the machine by: its UID where it was created.
pub fn backend_uid(m: &DynamicObject) -> String {
    m.annotations().get(BACKEND_UID).cloned().filter(|u| !u.is_empty()).unwrap_or_else(|| m.uid().unwrap_or_default())
}

/// The Machine realising a VM now, as its status names it.
pub struct Realising {
    pub machine: DynamicObject,
    pub spec: InfraMachineSpec,
    /// The Provider it is on.
    pub provider: String,
}

impl Realising {
    /// What the driver knows the machine by.
    pub fn machine_ref(&self) -> MachineRef {
        machine_ref(&self.machine, &self.spec)
    }
}

/// The Machine realising `vm` (its `status.infrastructureRef`) once it is made on a backend
/// (it has a provider ID) and while it is not being deleted; `None` before and after.
pub async fn realising(ctx: &crate::Context, vm: &banlieue_api::VirtualMachine) -> Result<Option<Realising>, Failure> {
    let Some(st) = vm.status.as_ref() else { return Ok(None) };
    let (Some(reference), Some(scheduled)) = (&st.infrastructure_ref, &st.scheduled) else { return Ok(None) };
    let resource = crate::framework::infra_kinds::machine_resource_of_kind(&reference.kind);
    let machine = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &vm.namespace().unwrap_or_default(), &resource)
        .get_opt(&reference.name)
        .await
        .map_err(|e| crate::failure::api_failure(&e))?
        .filter(|m| m.metadata.deletion_timestamp.is_none());
    let Some(machine) = machine else { return Ok(None) };
    let spec: InfraMachineSpec = serde_json::from_value(machine.data.get("spec").cloned().unwrap_or_default()).unwrap_or_default();
    if spec.provider_id.is_none() {
        return Ok(None);
    }
    Ok(Some(Realising { machine, spec, provider: scheduled.provider.clone() }))
}

fn machine_ref(m: &DynamicObject, spec: &InfraMachineSpec) -> MachineRef {
    MachineRef {
        uid: backend_uid(m),
        name: m.name_any(),
        namespace: m.namespace().unwrap_or_default(),
        provider_id: spec.provider_id.clone(),
        failure_domain: spec.backend_failure_domain().unwrap_or_default().to_string(),
        backend_id: spec.vm.adopt.as_ref().map(|a| a.backend_id.clone()),
    }
}

async fn call<T>(ctx: &Context, b: &Backend, function: &str, fut: impl Future<Output = Result<T, CallError>>) -> Result<T, Failure> {
    b.drive(ctx, function, fut).await.map_err(Failure::from)
}

/// A slot for an operation that changes the backend, or `Queued` (see [`crate::framework::throttle`]).
fn operation(b: &Backend) -> Result<crate::framework::throttle::Operation, Failure> {
    b.throttle.start().map_err(|q| Failure::transient(Reason::Queued, q.to_string()))
}

/// What a failed reconcile does next: queued work comes back soon (spread), anything else
/// retryable backs off.
fn after_failure(reason: Reason, retryable: bool) -> Outcome {
    match (reason, retryable) {
        (Reason::Queued, _) => Outcome::Requeue(crate::framework::throttle::recheck_after()),
        (_, true) => Outcome::Retry,
        (_, false) => Outcome::AwaitChange,
    }
}

async fn write_status(api: &Api<DynamicObject>, m: &DynamicObject, st: InfraMachineStatus) -> Result<(), Error> {
    status::write(api, &m.name_any(), Some(&status(m)), &st).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn status(phase: Option<MachinePhase>, ready_changed_secs_ago: i64) -> InfraMachineStatus {
        let mut st = InfraMachineStatus { phase, ..Default::default() };
        conditions::set(&mut st.conditions, READY, true, Reason::PoweredOn, "", None);
        let then = k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(ready_changed_secs_ago);
        st.conditions[0].last_transition_time = Time(then);
        st
    }

    #[test]
    fn machines_on_their_way_are_looked_at_soon_then_less_often() {
        assert_eq!(next_look(&status(Some(MachinePhase::Running), 0)), RESYNC);
        assert_eq!(next_look(&status(Some(MachinePhase::PoweredOff), 0)), RESYNC);
        assert_eq!(next_look(&status(None, 0)), RESYNC);
        assert_eq!(next_look(&status(Some(MachinePhase::WaitingForAddress), 0)), SETTLING_MIN);
        let later = next_look(&status(Some(MachinePhase::WaitingForAddress), 600));
        assert!(later >= Duration::from_secs(59) && later <= Duration::from_secs(61), "{later:?}");
        assert_eq!(next_look(&status(Some(MachinePhase::PoweringOn), 86_400)), RESYNC);
    }

    fn provider(generation: i64, ready: bool, free_cpus: u32) -> Provider {
        let mut p = crate::fixtures::provider("team", "p", ready, serde_json::json!([{"name": "d", "capacity": {"cpus": free_cpus}}]));
        p.metadata.generation = Some(generation);
        p
    }

    #[tokio::test]
    async fn machines_wake_for_a_providers_spec_its_return_to_ready_and_its_deletion_only() {
        use kube::runtime::watcher::Event;
        let (cache, mut writer) = kube::runtime::reflector::store::<Provider>();
        let mut wakes = wakes_machines(cache);
        let mut event = |e: Event<Provider>| {
            writer.apply_watcher_event(&e);
            let (Event::Apply(p) | Event::Delete(p)) = e else { unreachable!() };
            wakes(&Ok(p)).into_inner()
        };
        assert!(event(Event::Apply(provider(1, true, 8))), "a Provider new to this process");
        assert!(!event(Event::Apply(provider(1, true, 6))), "its capacity, probed");
        assert!(!event(Event::Apply(provider(1, false, 6))), "unready: the machines keep backing off");
        assert!(!event(Event::Apply(provider(1, false, 4))));
        assert!(event(Event::Apply(provider(1, true, 4))), "Ready again: the backend is back");
        assert!(event(Event::Apply(provider(2, true, 4))), "its spec changed");
        let mut asked = provider(2, true, 4);
        asked.metadata.annotations = Some([(banlieue_api::provider::DISCOVER_ANNOTATION.to_string(), "t1".to_string())].into());
        assert!(!event(Event::Apply(asked)), "a discovery asked of it");
        assert!(event(Event::Delete(provider(2, true, 4))), "deleted, though it looks as before");
        assert!(event(Event::Apply(provider(3, true, 4))), "made again");
    }
}
