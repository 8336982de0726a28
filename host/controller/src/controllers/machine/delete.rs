//! Tearing a machine's backend VM down behind the provider role's finalizer.

use banlieue_api::infra::InfraMachineSpec;
use banlieue_api::vm::DeletionPolicy;
use banlieue_runtime::{CallError, GuestError};
use kube::api::{Api, DynamicObject};
use kube::Resource;

use super::convert::power_off;
use super::{after_failure, backend, backend_uid, machine_ref, operation, status, write_status, Shared, FINALIZER};
use crate::Error;
use crate::failure::Failure;
use crate::framework::reconciler::Outcome;
use crate::status::conditions::{self, READY};
use crate::status::finalizer;
use crate::status::reasons::Reason;

/// Teardown behind the finalizer: the backend VM goes first, then the finalizer.
pub(super) async fn delete(m: &DynamicObject, spec: &InfraMachineSpec, kind: &Shared, api: &Api<DynamicObject>) -> Result<Outcome, Error> {
    let ctx = &kind.ctx;
    if !finalizer::has(m, FINALIZER) {
        return Ok(Outcome::AwaitChange);
    }
    let outcome = async {
        let b = backend(kind, m, spec).await?;
        let r = machine_ref(m, spec);
        if spec.vm.deletion_policy == Some(DeletionPolicy::Orphan) {
            // Let go: the VM stays as it is, without this machine's mark.
            super::adopt::release(ctx, m, &b, &r).await?;
            return Ok((Reason::Released, "backend VM left as it is, without banlieue's mark (deletionPolicy Orphan)"));
        }
        let _op = operation(&b)?;
        match b.drive(ctx, "delete", b.driver.component.delete(&b.config, &r, power_off(spec), b.driver.limits, b.grants.clone())).await {
            Ok(()) | Err(CallError::Guest(GuestError::NotFound(_))) => Ok((Reason::Deleted, "backend VM and its disks removed")),
            Err(e) => Err(Failure::from(e)),
        }
    }
    .await;
    match outcome {
        Ok((reason, note)) => {
            ctx.event(&m.object_ref(&kind.resource), false, reason, "Delete", note).await;
            finalizer::remove(api, m, FINALIZER).await?;
            ctx.created.lock().unwrap_or_else(|e| e.into_inner()).remove(&backend_uid(m));
            Ok(Outcome::AwaitChange)
        }
        Err(Failure { reason, message, .. }) => {
            // The finalizer stays: without the backend's word the VM may still exist.
            let mut st = status(m);
            let message = format!("cannot delete the backend VM yet: {message}");
            if conditions::set(&mut st.conditions, READY, false, reason, message.clone(), m.metadata.generation) {
                ctx.event(&m.object_ref(&kind.resource), reason != Reason::Queued, reason, "Delete", message).await;
            }
            write_status(api, m, st).await?;
            Ok(after_failure(reason, true))
        }
    }
}
