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
//! - `delete` runs behind the finalizer `banlieue.io/provider`, so the Machine
//!   outlives its backend VM.
//!
//! A Machine annotated `cluster.x-k8s.io/paused`, or of a paused CAPI Cluster, is left
//! alone. Retryable driver errors back off; terminal ones become a condition (and, for
//! CAPI's v1beta1 readers, `status.deprecated.v1beta1.failureReason`) and wait for a change.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use banlieue_api::common::{AddressType, Initialization, MachineAddress, MachinePhase, PowerOffMode, PowerState};
use banlieue_api::infra::{InfraMachineSpec, InfraMachineStatus};
use banlieue_api::{Provider, ProviderClass};
use banlieue_runtime::provider::{self as wit, Machine, MachineRef, MachineStatus};
use banlieue_runtime::{CallError, GuestError};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};

use crate::status;
use crate::status::conditions::{self, PROVISIONED, READY};
use crate::failure::Failure;
use crate::status::reasons::Reason;
use crate::framework::reconciler::{cached, dynamic_controller, CachesReady, Frame, Outcome};
use crate::controllers::capi::contract;
use crate::framework::infra_kinds;
use crate::status::finalizer;
use crate::{Context, Error};

pub use crate::framework::infra_kinds::MACHINE_FINALIZER as FINALIZER;
/// How often a settled machine is described again, to notice drift.
pub const RESYNC: Duration = Duration::from_secs(300);
/// The first look again at a machine still on its way (powering on, waiting for an address).
pub const SETTLING_MIN: Duration = Duration::from_secs(2);

struct Kind {
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
    let frame = frame.sharded_by(shard_key);
    let (providers, provider_changes) = cached(ctx.watched::<Provider>(), ctx.scope());
    let (provider_classes, provider_class_changes) = cached(Api::<ProviderClass>::all(ctx.client.clone()), ctx.scope());
    let provider_changes = provider_changes.filter(wakes_machines(providers.clone()));
    let kind = Arc::new(Kind { ctx: ctx.clone(), frame, resource: resource.clone(), providers, provider_classes, caches_ready: CachesReady::default() });
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
        let now = (crate::framework::reconciler::acted_on(p), ready);
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

async fn reconcile(m: Arc<DynamicObject>, kind: Arc<Kind>) -> Result<Action, Error> {
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

async fn reconcile_inner(m: &DynamicObject, kind: &Kind) -> Result<Outcome, Error> {
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
        return delete(m, &spec, kind, &api).await;
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
        realise(ctx, m, &kind.resource, &spec, &mut st, &backend).await
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
            apply_observed(&mut st, &spec, &observed, generation);
            write_status(&api, m, st.clone()).await?;
            return Ok(Outcome::Requeue(next_look(&st)));
        }
        Err(Failure { reason, message, retry: retryable }) => {
            let changed = conditions::get(&st.conditions, READY).is_none_or(|c| reason != c.reason || c.status != "False");
            conditions::set(&mut st.conditions, READY, false, reason, message.clone(), generation);
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

async fn backend(kind: &Kind, m: &DynamicObject, spec: &InfraMachineSpec) -> Result<Backend, Failure> {
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

fn machine_ref(m: &DynamicObject, spec: &InfraMachineSpec) -> MachineRef {
    MachineRef {
        uid: backend_uid(m),
        name: m.name_any(),
        namespace: m.namespace().unwrap_or_default(),
        provider_id: spec.provider_id.clone(),
        failure_domain: spec.backend_failure_domain().unwrap_or_default().to_string(),
    }
}

async fn call<T>(ctx: &Context, b: &Backend, function: &str, fut: impl Future<Output = Result<T, CallError>>) -> Result<T, Failure> {
    ctx.call(&b.class, function, fut).await.map_err(Failure::from)
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

/// Bring the backend VM to the spec: create (idempotent), then power and restart.
async fn realise(ctx: &Context, m: &DynamicObject, resource: &ApiResource, spec: &InfraMachineSpec, st: &mut InfraMachineStatus, b: &Backend) -> Result<MachineStatus, Failure> {
    let r = machine_ref(m, spec);
    let (limits, grants) = (b.driver.limits, b.grants.clone());
    // A machine this process just created counts as provisioned even when the cached
    // object predates the status write: a second `create` would be harmless, only wasted.
    let provisioned = (st.initialization.as_ref().and_then(|i| i.provisioned).unwrap_or(false) && spec.provider_id.is_some())
        || ctx.created.lock().unwrap_or_else(|e| e.into_inner()).contains(&r.uid);
    let described = if provisioned {
        match ctx.call(&b.class, "describe", b.driver.component.describe(&b.config, &r, limits, grants.clone())).await {
            Ok(s) => Some(s),
            // The backend VM vanished behind our back: make it again (same UID, same name).
            Err(CallError::Guest(GuestError::NotFound(_))) => None,
            Err(e) => return Err(Failure::from(e)),
        }
    } else {
        None
    };
    let mut observed = match described {
        Some(s) => s,
        None => {
            let machine = wit_machine(ctx, m, spec).await?;
            let _op = operation(b)?;
            let created = call(ctx, b, "create", b.driver.component.create(&b.config, &machine, limits, grants.clone())).await?;
            ctx.created.lock().unwrap_or_else(|e| e.into_inner()).insert(r.uid.clone());
            // A machine just made needs no restart for a request older than itself.
            st.last_restart_requested_at = spec.vm.restart_requested_at.clone();
            created
        }
    };
    let want = wit_power(spec.vm.power_state);
    let off = power_off(spec);
    let restart = spec.vm.restart_requested_at.is_some() && spec.vm.restart_requested_at != st.last_restart_requested_at;
    if restart && spec.vm.power_state == PowerState::PoweredOn {
        let _op = operation(b)?;
        call(ctx, b, "set-power", b.driver.component.set_power(&b.config, &r, wit::PowerState::PoweredOff, off, limits, grants.clone())).await?;
        observed = call(ctx, b, "set-power", b.driver.component.set_power(&b.config, &r, want, off, limits, grants.clone())).await?;
        ctx.event(&m.object_ref(resource), false, Reason::Restarted, "Restart", format!("restarted for restartRequestedAt={}", spec.vm.restart_requested_at.as_deref().unwrap_or_default())).await;
    } else if observed.power_state != want {
        let _op = operation(b)?;
        observed = call(ctx, b, "set-power", b.driver.component.set_power(&b.config, &r, want, off, limits, grants.clone())).await?;
    }
    if restart {
        st.last_restart_requested_at = spec.vm.restart_requested_at.clone();
    }
    Ok(observed)
}

fn apply_observed(st: &mut InfraMachineStatus, spec: &InfraMachineSpec, observed: &MachineStatus, generation: Option<i64>) {
    st.initialization = Some(Initialization { provisioned: Some(observed.provisioned) });
    st.ready = Some(observed.provisioned);
    st.deprecated = None;
    st.addresses = observed.addresses.iter().map(address).collect();
    st.failure_domain = spec.failure_domain.clone();
    let power = api_power(observed.power_state);
    st.power_state = Some(power);
    let phase = api_phase(observed.phase);
    st.phase = Some(phase);
    st.observed_generation = generation;
    for c in &observed.conditions {
        if c.type_ != READY && c.type_ != PROVISIONED {
            conditions::set_reported(&mut st.conditions, &c.type_, c.status == wit::ConditionStatus::True, &c.reason, c.message.clone(), generation);
        }
    }
    conditions::set(&mut st.conditions, PROVISIONED, observed.provisioned, if observed.provisioned { Reason::Provisioned } else { Reason::Provisioning }, observed.provider_id.clone(), generation);
    let ready = observed.provisioned && power == spec.vm.power_state;
    let (reason, message) = if ready {
        (Reason::of_power(power), format!("{} is {power:?}", observed.provider_id))
    } else if !observed.provisioned {
        (Reason::of_phase(phase), format!("the backend is still creating the machine ({phase:?})"))
    } else if matches!(phase, MachinePhase::PoweringOn | MachinePhase::ShuttingDown) {
        (Reason::of_phase(phase), format!("backend reports {power:?} and {phase:?}, spec asks for {:?}", spec.vm.power_state))
    } else {
        (Reason::PowerStateMismatch, format!("backend reports {power:?}, spec asks for {:?}", spec.vm.power_state))
    };
    conditions::set(&mut st.conditions, READY, ready, reason, message, generation);
}

async fn write_status(api: &Api<DynamicObject>, m: &DynamicObject, st: InfraMachineStatus) -> Result<(), Error> {
    status::write(api, &m.name_any(), Some(&status(m)), &st).await?;
    Ok(())
}

/// Teardown behind the finalizer: the backend VM goes first, then the finalizer.
async fn delete(m: &DynamicObject, spec: &InfraMachineSpec, kind: &Kind, api: &Api<DynamicObject>) -> Result<Outcome, Error> {
    let ctx = &kind.ctx;
    if !finalizer::has(m, FINALIZER) {
        return Ok(Outcome::AwaitChange);
    }
    let outcome = async {
        let b = backend(kind, m, spec).await?;
        let r = machine_ref(m, spec);
        let _op = operation(&b)?;
        match ctx.call(&b.class, "delete", b.driver.component.delete(&b.config, &r, power_off(spec), b.driver.limits, b.grants.clone())).await {
            Ok(()) | Err(CallError::Guest(GuestError::NotFound(_))) => Ok(()),
            Err(e) => Err(Failure::from(e)),
        }
    }
    .await;
    match outcome {
        Ok(()) => {
            ctx.event(&m.object_ref(&kind.resource), false, Reason::Deleted, "Delete", "backend VM and its disks removed").await;
            finalizer::remove(api, m, FINALIZER).await?;
            ctx.created.lock().unwrap_or_else(|e| e.into_inner()).remove(&backend_uid(m));
            Ok(Outcome::AwaitChange)
        }
        Err(Failure { reason, message, .. }) => {
            // The finalizer stays: without the backend's word the VM may still exist.
            let mut st = status(m);
            let message = format!("cannot delete the backend VM yet: {message}");
            let changed = conditions::get(&st.conditions, READY).is_none_or(|c| reason != c.reason);
            conditions::set(&mut st.conditions, READY, false, reason, message.clone(), m.metadata.generation);
            if changed || reason != Reason::Queued {
                ctx.event(&m.object_ref(&kind.resource), reason != Reason::Queued, reason, "Delete", message).await;
            }
            write_status(api, m, st).await?;
            Ok(after_failure(reason, true))
        }
    }
}

/// The driver's view of the machine; user-data is read from its Secret here, by the host.
async fn wit_machine(ctx: &Context, m: &DynamicObject, spec: &InfraMachineSpec) -> Result<Machine, Failure> {
    let ns = m.namespace().unwrap_or_default();
    let vm = &spec.vm;
    let user_data = match &vm.user_data {
        None => None,
        Some(r) => {
            let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
            let secret = secrets
                .get_opt(&r.name)
                .await
                .map_err(|e| crate::failure::api_failure(&e))?
                .ok_or_else(|| Failure::transient(Reason::UserDataNotFound, format!("user-data Secret {:?} not found", r.name)))?;
            let bytes = secret
                .data
                .as_ref()
                .and_then(|d| d.get(&r.key))
                .map(|b| b.0.clone())
                .or_else(|| secret.string_data.as_ref().and_then(|d| d.get(&r.key)).map(|s| s.clone().into_bytes()))
                .ok_or_else(|| Failure::transient(Reason::UserDataNotFound, format!("Secret {:?} has no key {:?}", r.name, r.key)))?;
            Some(String::from_utf8(bytes).map_err(|_| Failure::until_changed(Reason::InvalidUserData, format!("Secret {:?} key {:?} is not UTF-8", r.name, r.key)))?)
        }
    };
    let image = image_source(&vm.image).ok_or_else(|| Failure::until_changed(Reason::NoImageSource, "the machine's image has no template, backingFile or url"))?;
    Ok(Machine {
        uid: backend_uid(m),
        name: m.name_any(),
        namespace: ns,
        cpus: vm.cpus,
        memory_mib: vm.memory_mib,
        firmware: match vm.firmware {
            banlieue_api::class::Firmware::BIOS => wit::Firmware::Bios,
            banlieue_api::class::Firmware::UEFI => wit::Firmware::Uefi,
        },
        disks: vm.disks.iter().map(|d| wit::Disk { name: d.name.clone(), size_gib: d.size_gib, target: d.target.clone() }).collect(),
        nics: vm.nics.iter().map(|n| wit::Nic { name: n.name.clone(), network: n.network.clone() }).collect(),
        image,
        user_data,
        failure_domain: spec.backend_failure_domain().unwrap_or_default().to_string(),
        power_state: wit_power(vm.power_state),
        labels: m.labels().clone().into_iter().collect(),
    })
}

/// Keys of `spec.vm.image`, as the VM controller writes them from the VMImage source.
fn image_source(image: &BTreeMap<String, String>) -> Option<wit::ImageSource> {
    if let Some(t) = image.get("template") {
        return Some(wit::ImageSource::Template(t.clone()));
    }
    if let Some(f) = image.get("backingFile") {
        return Some(wit::ImageSource::BackingFile(f.clone()));
    }
    image.get("url").map(|u| wit::ImageSource::Url(wit::UrlSource { url: u.clone(), checksum: image.get("checksum").cloned() }))
}

fn wit_power(p: PowerState) -> wit::PowerState {
    match p {
        PowerState::PoweredOn => wit::PowerState::PoweredOn,
        PowerState::PoweredOff => wit::PowerState::PoweredOff,
        PowerState::Suspended => wit::PowerState::Suspended,
    }
}

/// How the spec asks the machine to be powered off.
fn power_off(spec: &InfraMachineSpec) -> wit::PowerOff {
    let mode = match spec.vm.power_off_mode {
        PowerOffMode::Hard => wit::PowerOffMode::Hard,
        PowerOffMode::Soft => wit::PowerOffMode::Soft,
        PowerOffMode::TrySoft => wit::PowerOffMode::TrySoft,
    };
    wit::PowerOff { mode, timeout_ms: spec.vm.power_off_timeout_seconds.saturating_mul(1000) }
}

fn api_phase(p: wit::MachinePhase) -> MachinePhase {
    match p {
        wit::MachinePhase::Provisioning => MachinePhase::Provisioning,
        wit::MachinePhase::Cloning => MachinePhase::Cloning,
        wit::MachinePhase::Configuring => MachinePhase::Configuring,
        wit::MachinePhase::PoweringOn => MachinePhase::PoweringOn,
        wit::MachinePhase::WaitingForAddress => MachinePhase::WaitingForAddress,
        wit::MachinePhase::Running => MachinePhase::Running,
        wit::MachinePhase::ShuttingDown => MachinePhase::ShuttingDown,
        wit::MachinePhase::PoweredOff => MachinePhase::PoweredOff,
    }
}

fn api_power(p: wit::PowerState) -> PowerState {
    match p {
        wit::PowerState::PoweredOn => PowerState::PoweredOn,
        wit::PowerState::PoweredOff => PowerState::PoweredOff,
        wit::PowerState::Suspended => PowerState::Suspended,
    }
}

fn address(a: &wit::Address) -> MachineAddress {
    let type_ = match a.type_ {
        wit::AddressType::Hostname => AddressType::Hostname,
        wit::AddressType::ExternalIp => AddressType::ExternalIP,
        wit::AddressType::InternalIp => AddressType::InternalIP,
        wit::AddressType::ExternalDns => AddressType::ExternalDNS,
        wit::AddressType::InternalDns => AddressType::InternalDNS,
    };
    MachineAddress { type_, address: a.address.clone() }
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
        serde_json::from_value(serde_json::json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
            "metadata": {"name": "p", "namespace": "team", "generation": generation},
            "spec": {"providerClassRef": {"name": "libvirt"}, "connection": {"endpoint": "test:///default"}},
            "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }, "reason": "Probed", "message": "",
                                       "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                       "failureDomains": [{"name": "d", "capacity": {"cpus": free_cpus}}]}
        }))
        .expect("provider")
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
        assert!(event(Event::Delete(provider(2, true, 4))), "deleted, though it looks as before");
        assert!(event(Event::Apply(provider(3, true, 4))), "made again");
    }
}
