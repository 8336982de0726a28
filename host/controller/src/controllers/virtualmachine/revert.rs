//! `spec.revertTo`: which snapshot the VM's Machine is to be brought back to, decided
//! from the VMSnapshot it names ([`decide`], pure), handed to the Machine (whose reconciler
//! powers it off, reverts and powers it as the spec says), and followed in `status.revert`.
//! And `spec.source.snapshotRef`: the snapshot a new VM's machine is restored from
//! ([`restore_from`], pure).

use banlieue_api::infra::{MachineRestore, MachineRevert};
use banlieue_api::snapshot::SnapshotPhase;
use banlieue_api::vm::{RevertPhase, RevertStatus};
use banlieue_api::VMSnapshot;
use kube::api::{Api, DynamicObject};
use kube::ResourceExt;

use super::{api_error, Blocked, Reconcile};
use crate::controllers::machine::backend_uid;
use crate::status::conditions::{self, REVERTED};
use crate::status::reasons::Reason;

/// What to do about `spec.revertTo`.
#[derive(Debug, PartialEq)]
pub enum Decision {
    /// Hand this to the Machine (a revert under way or done: the Machine applies it once).
    Revert(MachineRevert),
    /// A new revert: record it, then hand it to the Machine.
    Start(RevertStatus),
    /// Not applied: why, on `Reverted`, naming the field.
    Refuse(Reason, String),
}

/// Decide a revert of VM `vm` to the snapshot `revert_to` names (`snapshot`, when it exists),
/// while the VM's machine has backend UID `machine_uid` and `current` is the last revert.
pub fn decide(vm: &str, revert_to: &str, snapshot: Option<&VMSnapshot>, machine_uid: Option<&str>, current: Option<&RevertStatus>) -> Decision {
    // Under way or done for the snapshot named: nothing to look up again (the snapshot may
    // even be deleted since).
    if let Some(c) = current.filter(|c| c.snapshot == revert_to) {
        return Decision::Revert(MachineRevert { snapshot_id: c.snapshot_id.clone(), snapshot_uid: c.snapshot_uid.clone() });
    }
    let Some(snapshot) = snapshot else {
        return Decision::Refuse(Reason::InvalidRevert, format!("spec.revertTo: VMSnapshot {revert_to:?} not found"));
    };
    if snapshot.spec.vm_ref.name != vm {
        return Decision::Refuse(
            Reason::InvalidRevert,
            format!("spec.revertTo: VMSnapshot {revert_to:?} is a snapshot of VirtualMachine {:?}, not of this one", snapshot.spec.vm_ref.name),
        );
    }
    let st = snapshot.status.clone().unwrap_or_default();
    let (Some(SnapshotPhase::Ready), Some(id), Some(source)) = (st.phase, st.snapshot_id, st.source) else {
        let phase = st.phase.unwrap_or_default();
        return Decision::Refuse(Reason::SnapshotNotReady, format!("spec.revertTo: VMSnapshot {revert_to:?} is {phase:?}, not Ready"));
    };
    if machine_uid != Some(source.machine_uid.as_str()) {
        return Decision::Refuse(
            Reason::InvalidRevert,
            format!("spec.revertTo: VMSnapshot {revert_to:?} was taken of machine {} on Provider {}, which this VM no longer runs on (it moved since)", source.machine, source.provider),
        );
    }
    Decision::Start(RevertStatus { snapshot: revert_to.to_string(), snapshot_uid: snapshot.uid().unwrap_or_default(), snapshot_id: id, phase: RevertPhase::Reverting, completion_time: None })
}

/// What a machine restored from `snapshot` (named `name`) is made from, for a VM placed on
/// `provider`; why not, naming the field.
pub fn restore_from(name: &str, snapshot: Option<&VMSnapshot>, provider: &str, linked: bool) -> Result<MachineRestore, (Reason, String)> {
    let field = "spec.source.snapshotRef";
    let snapshot = snapshot.ok_or_else(|| (Reason::InvalidRestore, format!("{field}: VMSnapshot {name:?} not found")))?;
    let st = snapshot.status.clone().unwrap_or_default();
    let (Some(SnapshotPhase::Ready), Some(id), Some(source)) = (st.phase, st.snapshot_id, st.source) else {
        let phase = st.phase.unwrap_or_default();
        return Err((Reason::SnapshotNotReady, format!("{field}: VMSnapshot {name:?} is {phase:?}, not Ready")));
    };
    if source.provider != provider {
        return Err((
            Reason::InvalidRestore,
            format!("{field}: VMSnapshot {name:?} is on Provider {:?}; a restore is made there: set spec.placement.providerRef.name to {:?}", source.provider, source.provider),
        ));
    }
    Ok(MachineRestore {
        source_machine: source.machine,
        source_machine_uid: source.machine_uid,
        source_failure_domain: source.failure_domain,
        snapshot_id: id,
        linked,
        source_backend_id: source.backend_id,
    })
}

impl Reconcile<'_> {
    /// Step 6, a restore: what the VM's new machine is made from. A machine that exists keeps
    /// what it was made from (the snapshot may be gone since).
    pub(super) async fn restore(&self, provider: &str, machine: Option<&DynamicObject>) -> Result<Option<MachineRestore>, Blocked> {
        let Some(source) = &self.vm.spec.source else { return Ok(None) };
        if let Some(made) = machine.and_then(|m| serde_json::from_value::<MachineRestore>(m.data["spec"]["vm"]["restore"].clone()).ok()) {
            return Ok(Some(made));
        }
        let name = &source.snapshot_ref.name;
        let snapshot = Api::<VMSnapshot>::namespaced(self.ctx.client.clone(), &self.ns).get_opt(name).await.map_err(api_error)?;
        restore_from(name, snapshot.as_ref(), provider, source.linked_clone)
            .map(Some)
            .map_err(|(reason, message)| super::blocked(crate::status::conditions::INFRASTRUCTURE_READY, reason, message))
    }

    /// Step 6, a revert: the snapshot `spec.revertTo` names, checked, for the Machine to apply
    /// once. What is wrong with it is said on `Reverted`; the VM goes on without it.
    pub(super) async fn revert(&mut self, machine: Option<&DynamicObject>) -> Result<Option<MachineRevert>, Blocked> {
        let Some(name) = self.vm.spec.revert_to.clone() else {
            // Cleared: the next revertTo is a new revert, even to the same snapshot.
            self.status.revert = None;
            conditions::remove(&mut self.status.conditions, REVERTED);
            return Ok(None);
        };
        let current = self.status.revert.clone();
        let snapshot = if current.as_ref().is_some_and(|c| c.snapshot == name) {
            None
        } else {
            Api::<VMSnapshot>::namespaced(self.ctx.client.clone(), &self.ns).get_opt(&name).await.map_err(api_error)?
        };
        let machine_uid = machine.map(backend_uid);
        match decide(&self.name, &name, snapshot.as_ref(), machine_uid.as_deref(), current.as_ref()) {
            Decision::Revert(r) => Ok(Some(r)),
            Decision::Start(started) => {
                let message = format!("reverting to VMSnapshot {name} (backend snapshot {})", started.snapshot_id);
                let revert = MachineRevert { snapshot_id: started.snapshot_id.clone(), snapshot_uid: started.snapshot_uid.clone() };
                self.status.revert = Some(started);
                self.set(REVERTED, false, Reason::Reverting, message.clone());
                self.event(false, Reason::Reverting, "Revert", message).await;
                Ok(Some(revert))
            }
            Decision::Refuse(reason, message) => {
                if self.set(REVERTED, false, reason, message.clone()) {
                    self.event(true, reason, "Revert", message).await;
                }
                Ok(None)
            }
        }
    }

    /// Whether a revert is under way (the VM is not moved meanwhile).
    pub(super) fn reverting(&self) -> bool {
        self.status.revert.as_ref().is_some_and(|r| r.phase == RevertPhase::Reverting)
    }

    /// The Machine's word on the revert: done once it was reverted to the snapshot.
    pub(super) fn mirror_revert(&mut self, reverted_to: Option<&str>) {
        let Some(r) = self.status.revert.as_mut() else { return };
        if r.phase == RevertPhase::Reverting && reverted_to == Some(r.snapshot_uid.as_str()) {
            r.phase = RevertPhase::Reverted;
            r.completion_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()));
            let message = format!("reverted to VMSnapshot {} (backend snapshot {})", r.snapshot, r.snapshot_id);
            self.set(REVERTED, true, Reason::Reverted, message);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::snapshot::{SnapshotSource, VMSnapshotStatus};

    fn snapshot(vm: &str, phase: SnapshotPhase, machine_uid: &str) -> VMSnapshot {
        let mut s = VMSnapshot::new("before", banlieue_api::VMSnapshotSpec { vm_ref: banlieue_api::common::NameRef { name: vm.into() }, ..Default::default() });
        s.metadata.uid = Some("snap-uid".into());
        s.status = Some(VMSnapshotStatus {
            phase: Some(phase),
            snapshot_id: Some("snapshot-7".into()),
            source: Some(SnapshotSource { machine: "web".into(), machine_uid: machine_uid.into(), provider: "vc".into(), ..Default::default() }),
            ..Default::default()
        });
        s
    }

    #[test]
    fn a_restore_needs_a_ready_snapshot_on_the_vms_provider() {
        let ready = snapshot("web", SnapshotPhase::Ready, "m-1");
        let r = restore_from("before", Some(&ready), "vc", true).unwrap();
        assert_eq!((r.source_machine.as_str(), r.source_machine_uid.as_str(), r.snapshot_id.as_str(), r.linked), ("web", "m-1", "snapshot-7", true));
        let (reason, m) = restore_from("before", Some(&ready), "pve", false).unwrap_err();
        assert_eq!(reason, Reason::InvalidRestore);
        assert!(m.starts_with("spec.source.snapshotRef:") && m.contains("\"vc\""), "{m}");
        let (reason, _) = restore_from("before", Some(&snapshot("web", SnapshotPhase::Failed, "m-1")), "vc", false).unwrap_err();
        assert_eq!(reason, Reason::SnapshotNotReady);
        let (reason, m) = restore_from("gone", None, "vc", false).unwrap_err();
        assert_eq!(reason, Reason::InvalidRestore);
        assert!(m.contains("not found"), "{m}");
    }

    fn refused(d: Decision) -> (Reason, String) {
        match d {
            Decision::Refuse(r, m) => (r, m),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_ready_snapshot_of_this_vms_machine_is_reverted_to() {
        let d = decide("web", "before", Some(&snapshot("web", SnapshotPhase::Ready, "m-1")), Some("m-1"), None);
        let Decision::Start(st) = d else { panic!("{d:?}") };
        assert_eq!((st.snapshot.as_str(), st.snapshot_uid.as_str(), st.snapshot_id.as_str(), st.phase), ("before", "snap-uid", "snapshot-7", RevertPhase::Reverting));
        // Recorded: handed on without looking the snapshot up again, even once it is gone.
        let d = decide("web", "before", None, Some("m-1"), Some(&st));
        assert_eq!(d, Decision::Revert(MachineRevert { snapshot_id: "snapshot-7".into(), snapshot_uid: "snap-uid".into() }));
    }

    #[test]
    fn another_vms_an_unready_a_missing_or_a_left_behind_snapshot_is_refused_naming_the_field() {
        let (r, m) = refused(decide("web", "before", None, Some("m-1"), None));
        assert_eq!(r, Reason::InvalidRevert);
        assert!(m.starts_with("spec.revertTo:") && m.contains("not found"), "{m}");
        let (r, m) = refused(decide("web", "before", Some(&snapshot("db", SnapshotPhase::Ready, "m-1")), Some("m-1"), None));
        assert_eq!(r, Reason::InvalidRevert);
        assert!(m.contains("VirtualMachine \"db\""), "{m}");
        let (r, m) = refused(decide("web", "before", Some(&snapshot("web", SnapshotPhase::InProgress, "m-1")), Some("m-1"), None));
        assert_eq!(r, Reason::SnapshotNotReady);
        assert!(m.contains("InProgress"), "{m}");
        let (r, m) = refused(decide("web", "before", Some(&snapshot("web", SnapshotPhase::Ready, "m-1")), Some("m-2"), None));
        assert_eq!(r, Reason::InvalidRevert);
        assert!(m.contains("moved"), "{m}");
        // A different snapshot than the one recorded is a new revert.
        let old = RevertStatus { snapshot: "older".into(), snapshot_uid: "u0".into(), snapshot_id: "s0".into(), phase: RevertPhase::Reverted, completion_time: None };
        assert!(matches!(decide("web", "before", Some(&snapshot("web", SnapshotPhase::Ready, "m-1")), Some("m-1"), Some(&old)), Decision::Start(_)));
    }
}
