//! The VMSnapshot reconciler (role `provider`): one snapshot of one VM, taken, watched and
//! deleted on the VM's backend through its Provider's driver and grant. A reconcile:
//!
//! 1. deleted: `snapshot-delete` on the backend (gone already is fine), then the finalizer;
//! 2. finalizer `banlieue.io/snapshot`, added before the backend is ever asked, so no
//!    snapshot is left on a backend by an object that is gone;
//! 3. not taken yet: find the VM and its Machine (missing or not placed: `Pending`, looked
//!    at again with backoff), check what is asked of it (memory of a VM that is not
//!    running: `Failed`, nothing made), own it by the VM, and record what the VM was and
//!    `InProgress` *before* the backend call;
//! 4. `snapshot-create`, named after the VMSnapshot's UID: a retry after a crash between the
//!    backend's answer and the status write finds the snapshot taken and adopts it;
//! 5. taken: looked for in the backend's list now and then (and on any change of the
//!    object); a snapshot deleted on the backend by hand becomes `Failed/NotFoundOnBackend`
//!    and is never taken again.

use std::sync::Arc;
use std::time::Duration;

use banlieue_api::common::PowerState;
use banlieue_api::snapshot::{backend_name, SnapshotPhase, SnapshotSource, VMSnapshotStatus};
use banlieue_api::{Provider, ProviderClass, VMSnapshot, VirtualMachine};
use banlieue_runtime::provider::{MachineRef, SnapshotRequest};
use banlieue_runtime::{CallError, GuestError};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};

use crate::failure::{api_failure, Failure};
use crate::framework::reconciler::{typed_controller, Frame, Outcome};
use crate::sandbox::grants::Backend;
use crate::status::conditions::{self, READY};
use crate::status::finalizer;
use crate::status::reasons::Reason;
use crate::{status, Context, Error};

pub const FINALIZER: &str = "banlieue.io/snapshot";
/// How often a taken snapshot is looked for on its backend.
pub const RESYNC: Duration = Duration::from_secs(300);

struct Shared {
    ctx: Arc<Context>,
    frame: Frame<VMSnapshot>,
}

pub async fn run(ctx: Arc<Context>, stop: impl Future<Output = ()> + Send + Sync + 'static) -> Result<(), Error> {
    let (controller, frame) = typed_controller(&ctx, "vmsnapshot", shard_key);
    let shared = Arc::new(Shared { ctx: ctx.clone(), frame });
    controller
        .graceful_shutdown_on(stop)
        .run(reconcile, |s, err, shared| shared.frame.error_policy(&s, err), shared)
        .for_each(crate::framework::reconciler::log_run("vmsnapshot"))
        .await;
    Ok(())
}

/// A snapshot belongs to its Provider's shard once it knows it, to its own before.
pub fn shard_key(s: &VMSnapshot) -> String {
    match s.status.as_ref().and_then(|st| st.source.as_ref()) {
        Some(src) => format!("{}/{}", s.namespace().unwrap_or_default(), src.provider),
        None => crate::key(s),
    }
}

async fn reconcile(s: Arc<VMSnapshot>, shared: Arc<Shared>) -> Result<Action, Error> {
    shared.frame.reconcile(&s, Reconcile::new(&s, &shared.ctx).run()).await
}

/// The VM's machine on its backend, as a snapshot reaches it.
struct Target {
    backend: Backend,
    machine: MachineRef,
}

struct Reconcile<'a> {
    snap: &'a VMSnapshot,
    ctx: &'a Context,
    api: Api<VMSnapshot>,
    ns: String,
    status: VMSnapshotStatus,
}

impl<'a> Reconcile<'a> {
    fn new(snap: &'a VMSnapshot, ctx: &'a Context) -> Self {
        let ns = snap.namespace().unwrap_or_default();
        Reconcile { snap, ctx, api: Api::namespaced(ctx.client.clone(), &ns), ns, status: snap.status.clone().unwrap_or_default() }
    }

    async fn run(mut self) -> Result<Outcome, Error> {
        if self.snap.metadata.deletion_timestamp.is_some() {
            return self.delete().await;
        }
        if !finalizer::has(self.snap, FINALIZER) {
            finalizer::add(&self.api, self.snap, FINALIZER).await?;
        }
        let outcome = match self.status.phase {
            Some(SnapshotPhase::Ready) => self.check().await,
            Some(SnapshotPhase::Failed) if self.status.observed_generation == self.snap.metadata.generation => Ok(Outcome::AwaitChange),
            _ => self.take().await,
        };
        let next = match outcome {
            Ok(next) => next,
            Err(failure) => self.failed(failure).await,
        };
        self.write().await?;
        Ok(next)
    }

    /// Steps 3 and 4.
    async fn take(&mut self) -> Result<Outcome, Failure> {
        let vm = self.vm().await?;
        let spec = &self.snap.spec;
        if spec.memory && vm.status.as_ref().and_then(|s| s.observed_power_state) != Some(PowerState::PoweredOn) {
            return Err(Failure::until_changed(Reason::InvalidSpec, format!("spec.memory: VirtualMachine {:?} is not running, it has no memory to keep", vm.name_any())));
        }
        let (target, source) = self.target(&vm).await?;
        // A driver built before snapshots is refused here, before anything is recorded.
        target.backend.driver.component.snapshots().map_err(Failure::from)?;
        self.own(&vm).await?;
        if self.status.phase != Some(SnapshotPhase::InProgress) || self.status.source.as_ref() != Some(&source) {
            self.status.source = Some(source);
            self.status.phase = Some(SnapshotPhase::InProgress);
            self.set(false, Reason::SnapshotInProgress, "asking the backend for the snapshot");
            self.write().await.map_err(|e| api_failure(&e))?;
        }
        let request = SnapshotRequest {
            name: backend_name(&self.snap.uid().unwrap_or_default()),
            description: spec.description.clone().unwrap_or_default(),
            memory: spec.memory,
            quiesce: spec.quiesce,
        };
        let b = &target.backend;
        let _op = b.throttle.start().map_err(|q| Failure::transient(Reason::Queued, q.to_string()))?;
        let taken = b
            .drive(&self.ctx, "snapshot-create", b.driver.component.snapshot_create(&b.config, &target.machine, &request, b.driver.limits, b.grants.clone()))
            .await
            .map_err(Failure::from)?;
        self.status.phase = Some(SnapshotPhase::Ready);
        self.status.ready_to_use = true;
        self.status.snapshot_id = Some(taken.id.clone());
        self.status.memory = Some(taken.memory);
        self.status.size_bytes = taken.size_bytes;
        self.status.creation_time = Some(Time(taken.created_at.and_then(|t| k8s_openapi::jiff::Timestamp::from_second(t as i64).ok()).unwrap_or_else(k8s_openapi::jiff::Timestamp::now)));
        let message = format!("snapshot {} of {} taken{}", taken.id, target.machine.name, if taken.memory { " with its memory" } else { "" });
        if self.set(true, Reason::SnapshotTaken, message.clone()) {
            self.event(false, Reason::SnapshotTaken, "Snapshot", message).await;
        }
        Ok(Outcome::Requeue(RESYNC))
    }

    /// Step 5: the snapshot is still on the backend.
    async fn check(&mut self) -> Result<Outcome, Failure> {
        let Some(id) = self.status.snapshot_id.clone() else { return Ok(Outcome::AwaitChange) };
        let target = self.recorded_target().await?;
        let b = &target.backend;
        let listed = b.drive(&self.ctx, "snapshot-list", b.driver.component.snapshot_list(&b.config, &target.machine, b.driver.limits, b.grants.clone())).await;
        let present = match listed {
            Ok(list) => list.iter().any(|s| s.id == id),
            // The machine itself is gone: so are its snapshots.
            Err(CallError::Guest(GuestError::NotFound(_))) => false,
            Err(e) => return Err(Failure::from(e)),
        };
        if !present {
            self.status.ready_to_use = false;
            self.status.phase = Some(SnapshotPhase::Failed);
            let message = format!("snapshot {id} is no longer on {}'s backend (deleted there, or with its machine); it is not taken again", target.machine.name);
            self.set(false, Reason::NotFoundOnBackend, message.clone());
            self.event(true, Reason::NotFoundOnBackend, "Check", message).await;
            return Ok(Outcome::AwaitChange);
        }
        Ok(Outcome::Requeue(RESYNC))
    }

    /// Step 1.
    async fn delete(&mut self) -> Result<Outcome, Error> {
        if !finalizer::has(self.snap, FINALIZER) {
            return Ok(Outcome::AwaitChange);
        }
        // Nothing was asked of a backend before `InProgress` was recorded.
        let asked = matches!(self.status.phase, Some(SnapshotPhase::InProgress | SnapshotPhase::Ready)) || self.status.snapshot_id.is_some();
        if asked {
            let id = self.status.snapshot_id.clone().unwrap_or_else(|| backend_name(&self.snap.uid().unwrap_or_default()));
            let deleted = async {
                let target = self.recorded_target().await?;
                let b = &target.backend;
                let _op = b.throttle.start().map_err(|q| Failure::transient(Reason::Queued, q.to_string()))?;
                match b.drive(&self.ctx, "snapshot-delete", b.driver.component.snapshot_delete(&b.config, &target.machine, &id, b.driver.limits, b.grants.clone())).await {
                    Ok(()) | Err(CallError::Guest(GuestError::NotFound(_))) => Ok(()),
                    Err(e) => Err(Failure::from(e)),
                }
            }
            .await;
            match deleted {
                Ok(()) => self.event(false, Reason::SnapshotDeleted, "Delete", format!("snapshot {id} removed from the backend")).await,
                // A Provider deleted meanwhile took its backend out of banlieue's reach.
                Err(f) if f.reason == Reason::ProviderNotFound => {}
                Err(f) => {
                    let message = format!("cannot delete the backend snapshot yet: {}", f.message);
                    if self.set(false, f.reason, message.clone()) {
                        self.event(true, f.reason, "Delete", message).await;
                    }
                    self.write().await?;
                    return Ok(Outcome::Retry);
                }
            }
        }
        finalizer::remove(&self.api, self.snap, FINALIZER).await?;
        Ok(Outcome::AwaitChange)
    }

    /// The VM the snapshot names.
    async fn vm(&self) -> Result<VirtualMachine, Failure> {
        let name = &self.snap.spec.vm_ref.name;
        Api::<VirtualMachine>::namespaced(self.ctx.client.clone(), &self.ns)
            .get_opt(name)
            .await
            .map_err(|e| api_failure(&e))?
            .ok_or_else(|| Failure::transient(Reason::VMNotFound, format!("spec.vmRef: VirtualMachine {name:?} not found in namespace {}", self.ns)))
    }

    /// The VM's machine and backend, and what the snapshot records of them.
    async fn target(&self, vm: &VirtualMachine) -> Result<(Target, SnapshotSource), Failure> {
        let not_placed = || Failure::transient(Reason::VMNotPlaced, format!("spec.vmRef: VirtualMachine {:?} has no machine on a backend yet", vm.name_any()));
        let on = crate::controllers::machine::realising(self.ctx, vm).await?.ok_or_else(not_placed)?;
        let machine = on.machine_ref();
        let source = SnapshotSource {
            class_ref: vm.spec.class_ref.clone(),
            image_ref: vm.spec.image_ref.clone(),
            user_data: vm.spec.user_data.clone(),
            provider: on.provider.clone(),
            machine: machine.name.clone(),
            machine_uid: machine.uid.clone(),
            failure_domain: machine.failure_domain.clone(),
            backend_id: machine.backend_id.clone(),
        };
        Ok((Target { backend: self.backend(&source.provider).await?, machine }, source))
    }

    /// The machine and backend the status recorded (the machine may be gone by now).
    async fn recorded_target(&self) -> Result<Target, Failure> {
        let src = self.status.source.as_ref().ok_or_else(|| Failure::until_changed(Reason::Internal, "status.source is not recorded"))?;
        let machine = MachineRef {
            uid: src.machine_uid.clone(),
            name: src.machine.clone(),
            namespace: self.ns.clone(),
            provider_id: None,
            failure_domain: src.failure_domain.clone(),
            backend_id: src.backend_id.clone(),
        };
        Ok(Target { backend: self.backend(&src.provider).await?, machine })
    }

    async fn backend(&self, provider: &str) -> Result<Backend, Failure> {
        let provider = Api::<Provider>::namespaced(self.ctx.client.clone(), &self.ns)
            .get_opt(provider)
            .await
            .map_err(|e| api_failure(&e))?
            .ok_or_else(|| Failure::transient(Reason::ProviderNotFound, format!("Provider {provider:?} not found in namespace {}", self.ns)))?;
        let class = Api::<ProviderClass>::all(self.ctx.client.clone()).get_opt(&provider.spec.provider_class_ref.name).await.map_err(|e| api_failure(&e))?;
        crate::sandbox::grants::backend_of_class(self.ctx, &provider, class.as_ref(), &crate::key(self.snap)).await
    }

    /// Owned by its VM (deleted with it), unless `retainOnVMDeletion`.
    async fn own(&self, vm: &VirtualMachine) -> Result<(), Failure> {
        let uid = vm.uid().unwrap_or_default();
        let owned = self.snap.owner_references().iter().any(|o| o.uid == uid);
        if self.snap.spec.retain_on_vm_deletion || owned {
            return Ok(());
        }
        let mut owners = self.snap.owner_references().to_vec();
        // Not blockOwnerDeletion: that would need rights on the VM's finalizers, and the VM
        // waits for nothing of its snapshots (its machine's deletion takes them anyway).
        owners.push(OwnerReference { api_version: VirtualMachine::api_version(&()).into_owned(), kind: "VirtualMachine".into(), name: vm.name_any(), uid, controller: Some(true), block_owner_deletion: None });
        // No resourceVersion: the finalizer added by this same reconcile changed it, and
        // nothing else writes a snapshot's owners.
        let patch = serde_json::json!({ "metadata": { "ownerReferences": owners } });
        self.api.patch(&self.snap.name_any(), &PatchParams::default(), &Patch::Merge(patch)).await.map_err(|e| api_failure(&e))?;
        Ok(())
    }

    /// A failure on the way: `Pending` while it may clear by itself, `Failed` when only a
    /// change of the object clears it.
    async fn failed(&mut self, f: Failure) -> Outcome {
        if !f.retry {
            self.status.phase = Some(SnapshotPhase::Failed);
            self.status.ready_to_use = false;
        } else if self.status.phase.is_none() {
            self.status.phase = Some(SnapshotPhase::Pending);
        }
        if self.set(false, f.reason, f.message.clone()) {
            self.event(f.reason != Reason::Queued, f.reason, "Snapshot", f.message.clone()).await;
        }
        match (f.reason, f.retry) {
            (Reason::Queued, _) => Outcome::Requeue(crate::framework::throttle::recheck_after()),
            _ => Outcome::after(&f),
        }
    }

    fn set(&mut self, ready: bool, reason: Reason, message: impl Into<String>) -> bool {
        self.status.observed_generation = self.snap.metadata.generation;
        conditions::set(&mut self.status.conditions, READY, ready, reason, message, self.snap.metadata.generation)
    }

    async fn write(&self) -> Result<(), kube::Error> {
        status::write(&self.api, &self.snap.name_any(), self.snap.status.as_ref(), &self.status).await
    }

    async fn event(&self, warning: bool, reason: Reason, action: &str, note: impl Into<String>) {
        self.ctx.event(&self.snap.object_ref(&()), warning, reason, action, note).await;
    }
}
