//! The VirtualMachinePool controller (role `controller`). A pool owns VirtualMachines
//! stamped from `spec.template`:
//!
//! 1. its members are the VMs it controls (owner reference), named `<pool>-<n>` with
//!    the lowest free `n`, labelled `banlieue.io/pool` and `banlieue.io/pool-revision`
//!    (a hash of the template), placed by the pool's `placementPolicyRef` when it has one
//!    (spread across failure domains by default);
//! 2. with `paused`, nothing changes but the status;
//! 3. members that stay not Ready past `autoHealing.notReadyTimeoutSeconds` are deleted
//!    (and so replaced), at most `maxReplacements` times per revision;
//! 4. while members of an older revision exist (strategy RollingUpdate), one step of
//!    [`plan::roll`] runs; otherwise the pool scales to `replicas`, in by
//!    [`plan::scale_in`]'s order (never a member annotated `banlieue.io/protected`), and
//!    members waiting to apply a change of their class are restarted a few at a time
//!    ([`plan::cycle`]);
//!    Members it lacks are first taken from existing VMs (`spec.adoptSelector`: adopted, see
//!    [`adoptable`]), then made;
//! 5. status: counts, the selector for the scale subresource, `Ready`, `Progressing`
//!    and `ReplicaFailure` (a member's placement failing for a reason the template
//!    causes stops the pool from making more).
//!
//! Deleting a pool deletes its members through the garbage collector (each member's
//! own finalizer tears its backend VM down); `--cascade=orphan` leaves them.

pub mod plan;

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use banlieue_api::provider::DISCOVER_ANNOTATION;
use banlieue_api::vm::{AdoptSelector, UpdateStrategyType, VirtualMachinePoolStatus};
use banlieue_api::{Provider, VirtualMachine, VirtualMachinePool};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::core::{Selector, SelectorExt};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Resource, ResourceExt};

use crate::framework::reconciler::{Frame, Outcome, Retried};
use crate::status::conditions::{self, CONFIGURATION_APPLIED, READY, SCHEDULED};
use crate::status::reasons::Reason;
use crate::{status, Context, Error, FIELD_MANAGER};

pub const POOL_LABEL: &str = "banlieue.io/pool";
pub const REVISION_LABEL: &str = "banlieue.io/pool-revision";
/// A member annotated `banlieue.io/protected: "true"` is never chosen for scale-in.
pub const PROTECTED_ANNOTATION: &str = "banlieue.io/protected";
pub const PROGRESSING: &str = "Progressing";
pub const REPLICA_FAILURE: &str = "ReplicaFailure";
/// How often a pool with members on their way is looked at, besides their own changes.
const SETTLING: Duration = Duration::from_secs(10);
/// How old a Provider's discovery may be for a pool to adopt from it; an older one (or none)
/// is asked for again, and the pool makes no member until it is answered.
const DISCOVERY_MAX_AGE: Duration = Duration::from_secs(60);
/// How often a pool waiting for its Provider's discovery looks again.
const DISCOVERY_RECHECK: Duration = Duration::from_secs(2);

/// Scheduling failures the template causes: making more members would fail the same way.
const TEMPLATE_FAILURES: [Reason; 5] =
    [Reason::ClassNotFound, Reason::ImageNotFound, Reason::UserDataNotFound, Reason::PlacementPolicyNotFound, Reason::NoImageSource];

/// What every reconcile of this controller shares.
struct Shared {
    ctx: Arc<Context>,
    frame: Frame<VirtualMachinePool>,
    vms: Store<VirtualMachine>,
    vms_ready: crate::framework::reconciler::CachesReady,
}

pub async fn run(ctx: Arc<Context>, stop: impl Future<Output = ()> + Send + Sync + 'static) -> Result<(), Error> {
    let (controller, frame) = crate::framework::reconciler::typed_controller(&ctx, "virtualmachinepool", crate::key);
    ctx.metrics.fleet.pools(controller.store());
    let (vms, vm_writer) = kube::runtime::reflector::store();
    let member_changes = kube::runtime::reflector(
        vm_writer,
        watcher(ctx.watched::<VirtualMachine>(), ctx.options.installation.watch(Some(POOL_LABEL))).modify(|vm: &mut VirtualMachine| {
            vm.metadata.managed_fields = None;
        }),
    )
    .retried()
    .touched_objects();
    let pools = Arc::new(Shared { ctx: ctx.clone(), frame, vms, vms_ready: Default::default() });
    controller
        // A member's change (Ready, deleted) is its pool's business.
        .watches_stream(member_changes, |vm: VirtualMachine| {
            let ns = vm.namespace();
            vm.owner_references()
                .iter()
                .filter(|o| o.controller == Some(true) && o.kind == "VirtualMachinePool")
                .map(|o| ObjectRef::new(&o.name).within(ns.as_deref().unwrap_or_default()))
                .collect::<Vec<_>>()
        })
        .graceful_shutdown_on(stop)
        .run(reconcile, |pool, err, pools| pools.frame.error_policy(&pool, err), pools)
        .for_each(crate::framework::reconciler::log_run("pool"))
        .await;
    Ok(())
}

async fn reconcile(pool: Arc<VirtualMachinePool>, pools: Arc<Shared>) -> Result<Action, Error> {
    pools.vms_ready.wait(|| async { pools.vms.wait_until_ready().await.map_err(|_| Error::CacheStopped("VM")) }).await?;
    pools.frame.reconcile(&pool, reconcile_pool(&pool, &pools)).await
}

/// The revision of a template: a short hash of its JSON.
pub fn revision(pool: &VirtualMachinePool) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_string(&pool.spec.template).unwrap_or_default().hash(&mut h);
    format!("{:010x}", h.finish() & 0xff_ffff_ffff)
}

/// What a reconcile changed, for the status and the events.
#[derive(Default)]
struct Changes {
    created: Vec<String>,
    deleted: Vec<(String, &'static str)>,
    failure: Option<(Reason, String)>,
    /// Members waiting for a power cycle to apply a change of their class, and of those the
    /// ones restarting for it.
    pending: usize,
    cycling: usize,
}

async fn reconcile_pool(pool: &VirtualMachinePool, pools: &Shared) -> Result<Outcome, Error> {
    if pool.metadata.deletion_timestamp.is_some() {
        return Ok(Outcome::AwaitChange);
    }
    let ctx = &*pools.ctx;
    let (ns, name) = (pool.namespace().unwrap_or_default(), pool.name_any());
    let uid = pool.uid().unwrap_or_default();
    let generation = pool.metadata.generation;
    let revision = revision(pool);
    let mut status = pool.status.clone().unwrap_or_default();
    if status.current_revision.as_deref() != Some(revision.as_str()) {
        status.current_revision = Some(revision.clone());
        status.replaced = 0;
    }
    status.observed_generation = generation;

    let selector = match Selector::try_from(pool.spec.selector.clone()) {
        Ok(s) if s.matches(&pool.spec.template.metadata.labels) => s,
        Ok(_) => return fail(pool, status, Reason::InvalidSelector, "spec.selector does not match spec.template.metadata.labels".into(), ctx).await,
        Err(e) => return fail(pool, status, Reason::InvalidSelector, format!("spec.selector: {e}"), ctx).await,
    };
    status.selector = Some(selector.to_string());

    let owned: Vec<Arc<VirtualMachine>> = pools
        .vms
        .state()
        .into_iter()
        .filter(|vm| vm.namespace().as_deref() == Some(ns.as_str()) && vm.owner_references().iter().any(|o| o.uid == uid && o.controller == Some(true)))
        .collect();
    let (live, terminating): (Vec<Arc<VirtualMachine>>, Vec<Arc<VirtualMachine>>) =
        owned.into_iter().partition(|vm| vm.metadata.deletion_timestamp.is_none());
    let members: Vec<plan::Member> = live.iter().map(|vm| member(vm)).collect();
    let replicas = usize::try_from(pool.spec.replicas).unwrap_or(0);
    let mut changes = Changes::default();
    let mut next = Outcome::AwaitChange;

    if !pool.spec.paused {
        changes.failure = template_failure(&live, &revision);
        // Auto-healing: members not Ready past the timeout go (and are made again).
        let mut healed: BTreeSet<String> = BTreeSet::new();
        if let Some(h) = &pool.spec.auto_healing {
            let timeout = Duration::from_secs(u64::from(h.not_ready_timeout_seconds));
            for vm in &live {
                let Some(waited) = not_ready_for(vm) else { continue };
                if waited < timeout {
                    next = sooner(next, Outcome::Requeue(timeout - waited + Duration::from_secs(1)));
                    continue;
                }
                if status.replaced >= i32::try_from(h.max_replacements).unwrap_or(i32::MAX) {
                    changes.failure = Some((
                        Reason::AutoHealingLimit,
                        format!(
                            "{} has not been Ready for {}s; {} replacement(s) made for revision {revision}, the limit",
                            vm.name_any(),
                            waited.as_secs(),
                            status.replaced
                        ),
                    ));
                    break;
                }
                status.replaced += 1;
                healed.insert(vm.name_any());
                changes.deleted.push((vm.name_any(), "not Ready in time"));
            }
        }
        let members: Vec<plan::Member> = members.iter().filter(|m| !healed.contains(&m.name)).cloned().collect();
        let rolling_updates = pool.spec.update_strategy.type_ == UpdateStrategyType::RollingUpdate;
        let rolling = rolling_updates && members.iter().any(|m| m.revision != revision);
        let bounds = pool.spec.update_strategy.rolling_update.clone().unwrap_or_default();
        let quarter = IntOrString::String("25%".into());
        let unavailable = plan::resolve(bounds.max_unavailable.as_ref().unwrap_or(&quarter), replicas, false).unwrap_or(0);
        let (create, delete) = if rolling {
            let surge = plan::resolve(bounds.max_surge.as_ref().unwrap_or(&quarter), replicas, true).unwrap_or(1);
            let step = plan::roll(&members, replicas, &revision, surge, unavailable);
            (step.create, step.delete.into_iter().map(|n| (n, "rolling update")).collect::<Vec<_>>())
        } else if members.len() < replicas {
            (replicas - members.len(), vec![])
        } else {
            (0, plan::scale_in(&members, replicas).into_iter().map(|n| (n, "scale in")).collect())
        };
        changes.deleted.extend(delete);
        let api: Api<VirtualMachine> = Api::namespaced(ctx.client.clone(), &ns);
        for (member, _) in &changes.deleted {
            match api.delete(member, &DeleteParams::background()).await {
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                r => {
                    r?;
                }
            }
        }
        // A change of the members' class (more CPUs, memory, disk) waits in each member for
        // its next power cycle: the pool gives them that cycle a few at a time, within the
        // rolling update's maxUnavailable (at least one), once no template change is rolling.
        if rolling_updates && !rolling {
            let pending: BTreeSet<String> = live.iter().filter(|vm| pending_restart(vm)).map(|vm| vm.name_any()).collect();
            let mut cycling: BTreeSet<String> = live.iter().filter(|vm| restart_asked(vm)).map(|vm| vm.name_any()).collect();
            let now = k8s_openapi::jiff::Timestamp::now().to_string();
            for member in plan::cycle(&members, &pending, &cycling, unavailable) {
                api.patch(&member, &PatchParams::default(), &Patch::Merge(serde_json::json!({"spec": {"restartRequestedAt": now}}))).await?;
                ctx.event(&pool.object_ref(&()), false, Reason::Reconfigured, "Update", format!("restarting {member} to apply its class's change")).await;
                cycling.insert(member);
            }
            (changes.pending, changes.cycling) = (pending.len(), cycling.len());
        }
        // Members it lacks are adopted first, when the pool adopts: from a fresh discovery of
        // its Provider (none yet: asked for, and nothing is made meanwhile).
        let mut adopt: Vec<String> = Vec::new();
        let mut create = create;
        if let (Some(selector), true, None) = (&pool.spec.adopt_selector, create > 0, &changes.failure) {
            match adoptable(ctx, pool, selector, &pools.vms).await? {
                Adoptable::Ids(ids) => adopt = ids.into_iter().take(create).collect(),
                Adoptable::Asked => {
                    create = 0;
                    next = sooner(next, Outcome::Requeue(DISCOVERY_RECHECK));
                }
                Adoptable::Cannot(reason, why) => changes.failure = Some((reason, why)),
            }
        }
        // A template that cannot work makes nothing more.
        if changes.failure.is_none() {
            let taken: BTreeSet<String> = live.iter().chain(&terminating).map(|vm| vm.name_any()).collect();
            for (i, member_name) in free_names(&name, &taken, create).into_iter().enumerate() {
                let body = member_object(pool, &member_name, &revision, adopt.get(i).map(String::as_str));
                api.patch(&member_name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&body)).await?;
                changes.created.push(member_name);
            }
        }
    }

    for (member, why) in &changes.deleted {
        ctx.event(&pool.object_ref(&()), false, Reason::ScaledIn, "Scale", format!("deleted {member} ({why})")).await;
    }
    if !changes.created.is_empty() {
        ctx.event(&pool.object_ref(&()), false, Reason::ScaledOut, "Scale", format!("created {}", changes.created.join(", "))).await;
    }
    report(&mut status, pool, &live, &revision, &changes, replicas);
    if !conditions::is_true(&status.conditions, READY) || status.updated_replicas != status.replicas || changes.pending + changes.cycling > 0 {
        next = sooner(next, Outcome::Requeue(SETTLING));
    }
    write_status(ctx, pool, status).await?;
    Ok(next)
}

/// Set `ReplicaFailure` and stop: nothing can be done until the pool changes.
async fn fail(pool: &VirtualMachinePool, mut status: VirtualMachinePoolStatus, reason: Reason, message: String, ctx: &Context) -> Result<Outcome, Error> {
    if conditions::set(&mut status.conditions, REPLICA_FAILURE, true, reason, message.clone(), pool.metadata.generation) {
        ctx.event(&pool.object_ref(&()), true, reason, "Reconcile", message).await;
    }
    write_status(ctx, pool, status).await?;
    Ok(Outcome::AwaitChange)
}

async fn write_status(ctx: &Context, pool: &VirtualMachinePool, status: VirtualMachinePoolStatus) -> Result<(), Error> {
    let api: Api<VirtualMachinePool> = Api::namespaced(ctx.client.clone(), &pool.namespace().unwrap_or_default());
    status::write(&api, &pool.name_any(), pool.status.as_ref(), &status).await?;
    Ok(())
}

fn report(status: &mut VirtualMachinePoolStatus, pool: &VirtualMachinePool, live: &[Arc<VirtualMachine>], revision: &str, changes: &Changes, replicas: usize) {
    let generation = pool.metadata.generation;
    let count = |f: &dyn Fn(&VirtualMachine) -> bool| i32::try_from(live.iter().filter(|vm| f(vm)).count()).unwrap_or(i32::MAX);
    status.replicas = count(&|_| true);
    status.ready_replicas = count(&|vm| is_ready(vm));
    status.updated_replicas = count(&|vm| vm.labels().get(REVISION_LABEL).map(String::as_str) == Some(revision));
    let want = i32::try_from(replicas).unwrap_or(i32::MAX);
    let all_ready = status.ready_replicas == want && status.replicas == want;
    let message = format!("{}/{want} Ready, {} updated", status.ready_replicas, status.updated_replicas);
    conditions::set(&mut status.conditions, READY, all_ready, if all_ready { Reason::AllReady } else { Reason::NotAllReady }, message, generation);
    let (progressing, reason, message) = if pool.spec.paused {
        (false, Reason::Paused, "spec.paused is set: members are left as they are".to_string())
    } else if status.updated_replicas < status.replicas {
        (true, Reason::Updating, format!("{} of {} members on revision {revision}", status.updated_replicas, status.replicas))
    } else if changes.pending > 0 || changes.cycling > 0 {
        (true, Reason::Updating, format!("{} member(s) to restart to apply a change of their class, {} restarting", changes.pending, changes.cycling))
    } else if status.replicas != want || !changes.created.is_empty() || !changes.deleted.is_empty() {
        (true, Reason::Scaling, format!("{} members, {want} wanted", status.replicas))
    } else {
        (false, Reason::Stable, format!("{want} members on revision {revision}"))
    };
    conditions::set(&mut status.conditions, PROGRESSING, progressing, reason, message, generation);
    match &changes.failure {
        Some((reason, message)) => {
            conditions::set(&mut status.conditions, REPLICA_FAILURE, true, *reason, message.clone(), generation);
        }
        None => conditions::remove(&mut status.conditions, REPLICA_FAILURE),
    }
}

/// A member as the planner sees it.
pub fn member(vm: &VirtualMachine) -> plan::Member {
    plan::Member {
        name: vm.name_any(),
        revision: vm.labels().get(REVISION_LABEL).cloned().unwrap_or_default(),
        ready: is_ready(vm),
        failure_domain: vm.status.as_ref().and_then(|s| s.scheduled.as_ref()).map(|s| format!("{}/{}", s.provider, s.failure_domain)),
        created: vm.metadata.creation_timestamp.as_ref().map(|t| t.0.as_second()).unwrap_or_default(),
        protected: vm.annotations().get(PROTECTED_ANNOTATION).is_some_and(|v| v == "true"),
    }
}

/// A member whose class changed and which waits for its next power cycle to apply it.
fn pending_restart(vm: &VirtualMachine) -> bool {
    vm.status.as_ref().and_then(|s| conditions::get(&s.conditions, CONFIGURATION_APPLIED)).is_some_and(|c| c.status == "False" && c.reason == Reason::PendingRestart.as_str())
}

/// A member asked to restart that has not yet.
fn restart_asked(vm: &VirtualMachine) -> bool {
    vm.spec.restart_requested_at.is_some() && vm.spec.restart_requested_at != vm.status.as_ref().and_then(|s| s.last_restart_requested_at.clone())
}

fn is_ready(vm: &VirtualMachine) -> bool {
    vm.status.as_ref().is_some_and(|s| conditions::is_true(&s.conditions, READY))
}

/// How long a member has not been Ready (since it was made, or last stopped being
/// Ready); `None` when it is Ready.
fn not_ready_for(vm: &VirtualMachine) -> Option<Duration> {
    if is_ready(vm) {
        return None;
    }
    let since = vm
        .status
        .as_ref()
        .and_then(|s| conditions::get(&s.conditions, READY))
        .map(|c| c.last_transition_time.0)
        .or_else(|| vm.metadata.creation_timestamp.as_ref().map(|t| t.0))?;
    let waited = k8s_openapi::jiff::Timestamp::now().duration_since(since);
    Some(Duration::from_secs(u64::try_from(waited.as_secs()).unwrap_or(0)))
}

/// A member of the current revision whose placement failed for a reason the template
/// causes (its class, image or user-data missing): the pool's `ReplicaFailure`.
fn template_failure(live: &[Arc<VirtualMachine>], revision: &str) -> Option<(Reason, String)> {
    live.iter().filter(|vm| vm.labels().get(REVISION_LABEL).map(String::as_str) == Some(revision)).find_map(|vm| {
        let c = conditions::get(&vm.status.as_ref()?.conditions, SCHEDULED)?;
        let reason = TEMPLATE_FAILURES.into_iter().find(|r| *r == c.reason)?;
        Some((reason, format!("member {}: {}", vm.name_any(), c.message)))
    })
}

fn sooner(a: Outcome, b: Outcome) -> Outcome {
    match (a, b) {
        (Outcome::Requeue(x), Outcome::Requeue(y)) => Outcome::Requeue(x.min(y)),
        (Outcome::Requeue(x), _) | (_, Outcome::Requeue(x)) => Outcome::Requeue(x),
        (a, _) => a,
    }
}

/// `n` names `<pool>-<i>` with the lowest `i` not taken.
fn free_names(pool: &str, taken: &BTreeSet<String>, n: usize) -> Vec<String> {
    (0..).map(|i| format!("{pool}-{i}")).filter(|name| !taken.contains(name)).take(n).collect()
}

/// What a pool may adopt now.
enum Adoptable {
    /// These backend ids, in this order.
    Ids(Vec<String>),
    /// Its Provider was asked for a discovery (or already is): nothing to go on yet.
    Asked,
    /// Why the pool cannot adopt.
    Cannot(Reason, String),
}

/// The VMs the pool may adopt (`spec.adoptSelector`), from its Provider's discovery when it
/// is fresh; otherwise a discovery is asked for (the Provider's `banlieue.io/discover`, unless
/// a request of the last minute is still unanswered).
async fn adoptable(ctx: &Context, pool: &VirtualMachinePool, selector: &AdoptSelector, vms: &Store<VirtualMachine>) -> Result<Adoptable, Error> {
    let Some(provider) = pool.spec.template.spec.placement.as_ref().and_then(|p| p.provider_ref.as_ref()) else {
        let why = "spec.adoptSelector needs spec.template.spec.placement.providerRef: the Provider whose VMs the pool adopts";
        return Ok(Adoptable::Cannot(Reason::InvalidSpec, why.into()));
    };
    let ns = pool.namespace().unwrap_or_default();
    let api: Api<Provider> = Api::namespaced(ctx.client.clone(), &ns);
    let Some(p) = api.get_opt(&provider.name).await? else {
        return Ok(Adoptable::Cannot(Reason::ProviderNotFound, format!("Provider {:?} (spec.template.spec.placement.providerRef) not found", provider.name)));
    };
    let now = k8s_openapi::jiff::Timestamp::now();
    let recent = |t: Option<&str>| {
        t.and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok()).and_then(|t| Duration::try_from(now.duration_since(t)).ok()).is_some_and(|age| age < DISCOVERY_MAX_AGE)
    };
    let discovery = p.status.as_ref().and_then(|s| s.discovery.as_ref()).filter(|d| recent(d.time.as_deref()));
    match discovery {
        Some(d) if d.message.is_none() || !d.machines.is_empty() => {
            let claimed: BTreeSet<String> = vms
                .state()
                .iter()
                .filter(|vm| vm.namespace().as_deref() == Some(ns.as_str()))
                .filter_map(|vm| vm.spec.adopt.as_ref().map(|a| a.backend_id.clone()))
                .collect();
            Ok(Adoptable::Ids(plan::adoptable(&d.machines, selector, &claimed)))
        }
        Some(d) => Ok(Adoptable::Cannot(Reason::AdoptionUnsupported, format!("Provider {}: {}", provider.name, d.message.clone().unwrap_or_default()))),
        None => {
            let asked = p.annotations().get(DISCOVER_ANNOTATION).map(String::as_str);
            if !recent(asked) {
                let patch = serde_json::json!({"metadata": {"annotations": {DISCOVER_ANNOTATION: now.to_string()}}});
                api.patch(&provider.name, &PatchParams::default(), &Patch::Merge(patch)).await?;
            }
            Ok(Adoptable::Asked)
        }
    }
}

/// A member as the pool applies it: the template, the pool's labels and its owner reference;
/// `adopt`: the backend id of the existing VM it takes over.
fn member_object(pool: &VirtualMachinePool, name: &str, revision: &str, adopt: Option<&str>) -> serde_json::Value {
    let t = &pool.spec.template;
    let mut spec = t.spec.clone();
    if let Some(id) = adopt {
        spec.adopt = Some(banlieue_api::vm::VmAdopt { backend_id: id.to_string(), apply_class: false });
    }
    // The pool's placement policy, unless the template names one itself.
    if let Some(policy) = &pool.spec.placement_policy_ref {
        let placement = spec.placement.get_or_insert_with(Default::default);
        placement.policy_ref.get_or_insert_with(|| policy.clone());
    }
    let mut labels: BTreeMap<String, String> = t.metadata.labels.clone();
    labels.insert(POOL_LABEL.into(), pool.name_any());
    labels.insert(REVISION_LABEL.into(), revision.into());
    // Members belong to the pool's installation.
    if let Some(instance) = pool.labels().get(banlieue_api::INSTANCE_LABEL) {
        labels.insert(banlieue_api::INSTANCE_LABEL.into(), instance.clone());
    }
    serde_json::json!({
        "apiVersion": VirtualMachine::api_version(&()),
        "kind": "VirtualMachine",
        "metadata": {
            "name": name,
            "namespace": pool.namespace(),
            "labels": labels,
            "annotations": t.metadata.annotations,
            "ownerReferences": [pool.controller_owner_ref(&())],
        },
        "spec": spec,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_names_fill_the_lowest_gaps() {
        let taken = BTreeSet::from(["web-0".to_string(), "web-2".to_string()]);
        assert_eq!(free_names("web", &taken, 3), ["web-1", "web-3", "web-4"]);
    }

    #[test]
    fn the_revision_follows_the_template_only() {
        let mut pool: VirtualMachinePool = serde_json::from_value(serde_json::json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachinePool", "metadata": {"name": "web"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"classRef": {"name": "small"}, "imageRef": {"name": "debian"}}}}
        }))
        .unwrap();
        let r1 = revision(&pool);
        pool.spec.replicas = 5;
        assert_eq!(revision(&pool), r1, "scaling is not a new revision");
        pool.spec.template.spec.image_ref.name = "debian-13".into();
        assert_ne!(revision(&pool), r1);
        assert_eq!(r1.len(), 10);
    }
}
