//! The VMSnapshotSchedule reconciler (role `controller`): on each scheduled time, one
//! VMSnapshot per VM the selector picks (the VMSnapshot reconciler takes it on the backend),
//! at most `maxInFlightPerProvider` under way per Provider, and retention. A reconcile:
//!
//! 1. check the schedule, time zone and retention (`Ready=False` naming the field);
//! 2. the run due: the latest scheduled time since the last run — a control plane that was
//!    down over several catches up once — recorded in `status.lastScheduleTime` before any
//!    snapshot is made for it;
//! 3. the run's snapshots, named after the schedule, the VM and the run, so a crash before
//!    the status write makes no second one ([`plan::run`]);
//! 4. retention ([`plan::expired`]): the VMSnapshots deleted, whose reconciler removes them
//!    from the backend;
//! 5. look again at the next scheduled time, or soon while VMs wait for a slot.

pub mod cron;
pub mod plan;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use banlieue_api::snapshot::{RunStatus, VMSnapshotScheduleStatus, SCHEDULED_AT_ANNOTATION, SCHEDULE_LABEL};
use banlieue_api::{VMSnapshot, VMSnapshotSchedule, VirtualMachine};
use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::core::Selector;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use crate::failure::{api_failure, Failure};
use crate::framework::reconciler::{typed_controller, Frame, Outcome};
use crate::status::conditions::{self, READY};
use crate::status::reasons::Reason;
use crate::{status, Context, Error};

/// How soon a run with VMs waiting for a slot looks again (a finished snapshot also wakes it).
const WAITING_RECHECK: Duration = Duration::from_secs(5);
/// The longest wait for the next run (a clock or time zone change is noticed by then).
const MAX_WAIT: Duration = Duration::from_secs(3600);

struct Shared {
    ctx: Arc<Context>,
    frame: Frame<VMSnapshotSchedule>,
}

pub async fn run(ctx: Arc<Context>, stop: impl Future<Output = ()> + Send + Sync + 'static) -> Result<(), Error> {
    let (controller, frame) = typed_controller(&ctx, "vmsnapshotschedule", crate::key);
    let shared = Arc::new(Shared { ctx: ctx.clone(), frame });
    let snapshots = crate::framework::reconciler::changes(ctx.watched::<VMSnapshot>(), ctx.options.installation.watch(Some(SCHEDULE_LABEL)));
    controller
        // A scheduled snapshot done (or gone) frees a slot for the VMs of its run that wait.
        .watches_stream(snapshots, |s: VMSnapshot| {
            let schedule = s.labels().get(SCHEDULE_LABEL).cloned();
            s.namespace().zip(schedule).map(|(ns, name)| ObjectRef::new(&name).within(&ns))
        })
        .graceful_shutdown_on(stop)
        .run(reconcile, |s, err, shared| shared.frame.error_policy(&s, err), shared)
        .for_each(crate::framework::reconciler::log_run("vmsnapshotschedule"))
        .await;
    Ok(())
}

async fn reconcile(s: Arc<VMSnapshotSchedule>, shared: Arc<Shared>) -> Result<Action, Error> {
    shared.frame.reconcile(&s, reconcile_schedule(&s, &shared.ctx)).await
}

async fn reconcile_schedule(s: &VMSnapshotSchedule, ctx: &Context) -> Result<Outcome, Error> {
    let ns = s.namespace().unwrap_or_default();
    let api: Api<VMSnapshotSchedule> = Api::namespaced(ctx.client.clone(), &ns);
    let mut st = s.status.clone().unwrap_or_default();
    let generation = s.metadata.generation;
    st.observed_generation = generation;
    let outcome = match schedule(s, ctx, &ns, &api, &mut st).await {
        Ok(outcome) => outcome,
        Err(f) => {
            if conditions::set(&mut st.conditions, READY, false, f.reason, f.message.clone(), generation) {
                ctx.event(&s.object_ref(&()), true, f.reason, "Schedule", f.message.clone()).await;
            }
            Outcome::after(&f)
        }
    };
    status::write(&api, &s.name_any(), s.status.as_ref(), &st).await?;
    Ok(outcome)
}

/// Steps 1 to 5.
async fn schedule(s: &VMSnapshotSchedule, ctx: &Context, ns: &str, api: &Api<VMSnapshotSchedule>, st: &mut VMSnapshotScheduleStatus) -> Result<Outcome, Failure> {
    let spec = &s.spec;
    let invalid = |m: String| Failure::until_changed(Reason::InvalidSchedule, m);
    let cron = cron::Cron::parse(&spec.schedule).map_err(|e| invalid(format!("spec.schedule: {e}")))?;
    let tz = cron::time_zone(spec.time_zone.as_deref()).map_err(|e| invalid(format!("spec.timeZone: {e}")))?;
    let max_age = plan::check_retention(&spec.retention).map_err(invalid)?;
    let selector = Selector::try_from(spec.selector.clone()).map_err(|e| invalid(format!("spec.selector: {e}")))?;
    let now = Timestamp::now();

    // Step 2: recorded before anything is made for it.
    let created = s.metadata.creation_timestamp.as_ref().map(|t| t.0).unwrap_or(now);
    let last = st.last_schedule_time.as_ref().map(|t| t.0);
    if !spec.suspend
        && let Some(due) = cron.latest_in(last.unwrap_or(created), now, &tz)
    {
        st.last_schedule_time = Some(Time(due));
        st.last_run = Some(RunStatus { schedule_time: Time(due), vms: 0, ready: 0, in_progress: 0, failed: 0, waiting: 0 });
        status::write(api, &s.name_any(), s.status.as_ref(), &*st).await.map_err(|e| api_failure(&e))?;
        ctx.event(&s.object_ref(&()), false, Reason::SnapshotRunStarted, "Schedule", format!("run of {}", cron::local(due, &tz))).await;
    }

    // Step 3.
    let vms_api: Api<VirtualMachine> = Api::namespaced(ctx.client.clone(), ns);
    let vms: Vec<plan::Vm> = vms_api
        .list(&ListParams::default().labels_from(&selector))
        .await
        .map_err(|e| api_failure(&e))?
        .into_iter()
        .filter(|v| v.metadata.deletion_timestamp.is_none())
        .map(|v| plan::Vm { provider: v.status.as_ref().and_then(|s| s.scheduled.as_ref()).map(|s| s.provider.clone()), name: v.name_any() })
        .collect();
    let snaps_api: Api<VMSnapshot> = Api::namespaced(ctx.client.clone(), ns);
    let mut mine = list_taken(&snaps_api, &s.name_any()).await?;
    let mut waiting = 0;
    if let (Some(run), false) = (st.last_schedule_time.as_ref().map(|t| t.0), spec.suspend) {
        let todo = plan::run(run, &vms, &mine, spec.max_in_flight_per_provider);
        waiting = todo.waiting;
        for vm in &todo.create {
            let name = plan::snapshot_name(&s.name_any(), vm, run);
            let snapshot = scheduled_snapshot(s, &name, vm, run);
            match snaps_api.create(&PostParams::default(), &snapshot).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(api_failure(&e)),
            }
            mine.push(plan::Taken { name, vm: vm.clone(), run, phase: None });
        }
        st.last_run = Some(summary(run, &vms, &mine, waiting));
    }

    // Step 4.
    for name in plan::expired(&mine, &spec.retention, max_age, now) {
        match snaps_api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(api_failure(&e)),
        }
    }

    // Step 5.
    let next = cron.next_after(now, &tz);
    st.next_schedule_time = next.map(|n| cron::local(n, &tz).to_string());
    let message = match (spec.suspend, next) {
        (true, _) => "suspended: no snapshots are taken".to_string(),
        (false, Some(n)) => format!("next run {}", cron::local(n, &tz)),
        (false, None) => "the schedule never fires again".to_string(),
    };
    conditions::set(&mut st.conditions, READY, true, Reason::Scheduled, message, s.metadata.generation);
    let until_next = next.and_then(|n| Duration::try_from(n.duration_since(now)).ok()).unwrap_or(MAX_WAIT).clamp(Duration::from_millis(200), MAX_WAIT);
    Ok(Outcome::Requeue(if waiting > 0 { until_next.min(WAITING_RECHECK) } else { until_next }))
}

/// The schedule's snapshots, with the run that made each.
async fn list_taken(api: &Api<VMSnapshot>, schedule: &str) -> Result<Vec<plan::Taken>, Failure> {
    let list = api.list(&ListParams::default().labels(&format!("{SCHEDULE_LABEL}={schedule}"))).await.map_err(|e| api_failure(&e))?;
    Ok(list
        .into_iter()
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .filter_map(|s| {
            let run = s.annotations().get(SCHEDULED_AT_ANNOTATION)?.parse().ok()?;
            Some(plan::Taken { run, vm: s.spec.vm_ref.name.clone(), phase: s.status.as_ref().and_then(|st| st.phase), name: s.name_any() })
        })
        .collect())
}

fn scheduled_snapshot(s: &VMSnapshotSchedule, name: &str, vm: &str, run: Timestamp) -> VMSnapshot {
    let mut snap = VMSnapshot::new(
        name,
        banlieue_api::VMSnapshotSpec {
            vm_ref: banlieue_api::common::NameRef { name: vm.to_string() },
            memory: s.spec.memory,
            quiesce: s.spec.quiesce,
            description: Some(format!("VMSnapshotSchedule {} at {run}", s.name_any())),
            retain_on_vm_deletion: false,
        },
    );
    snap.metadata.namespace = s.namespace();
    let mut labels = BTreeMap::from([(SCHEDULE_LABEL.to_string(), s.name_any())]);
    // The schedule's installation acts on what it makes.
    for (k, v) in s.labels() {
        if k == banlieue_api::INSTANCE_LABEL {
            labels.insert(k.clone(), v.clone());
        }
    }
    snap.metadata.labels = Some(labels);
    snap.metadata.annotations = Some(BTreeMap::from([(SCHEDULED_AT_ANNOTATION.to_string(), run.to_string())]));
    snap
}

fn summary(run: Timestamp, vms: &[plan::Vm], taken: &[plan::Taken], waiting: usize) -> RunStatus {
    use banlieue_api::snapshot::SnapshotPhase as P;
    let of_run: Vec<&plan::Taken> = taken.iter().filter(|t| t.run == run).collect();
    let count = |f: &dyn Fn(Option<P>) -> bool| of_run.iter().filter(|t| f(t.phase)).count() as u32;
    RunStatus {
        schedule_time: Time(run),
        vms: vms.len() as u32,
        ready: count(&|p| p == Some(P::Ready)),
        in_progress: count(&|p| matches!(p, None | Some(P::Pending | P::InProgress))),
        failed: count(&|p| p == Some(P::Failed)),
        waiting: waiting as u32,
    }
}
