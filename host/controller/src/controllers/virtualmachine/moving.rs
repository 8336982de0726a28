//! Moves that carry the VM's disks (`spec.moveStrategy: CarryDisks`, the default), in one place:
//!
//! 1. **decided** in `place`: both Providers must offer it (their drivers' `disk-export` and
//!    `disk-import`, as probed into `status.driverFeatures`), else the VM stays where it runs
//!    (`PlacementValid=False/CannotCarryDisks`, naming the backend and `moveStrategy`). The move
//!    is recorded in `status.move` before anything is touched;
//! 2. **PoweringOff**: the source Machine is asked to power off (per its `powerOffMode`); a
//!    VM that cannot be powered off does not move;
//! 3. the target Machine is made with `spec.vm.carry` naming the source: its reconciler
//!    exports, converts and imports the disks (`Exporting`, `Converting`, `Importing`, shown
//!    from its `status.carry`), then starts it (`Starting`);
//! 4. once it is Ready it becomes the VM's Machine and the source is deleted
//!    (`RemovingSource`); when it is gone the move is over (`Moved=True`).
//!
//! A carry that fails for good deletes the target, gives the VM back its source (powered as
//! its spec says) and says why (`Moved=False`); the move is not tried again until the VM's
//! spec changes. Every step is read back from the objects, so a restart resumes it.

use banlieue_api::infra::{CarryStatus, InfraMachineSpec, InfraMachineStatus};
use banlieue_api::vm::{InfrastructureRef, MoveEnd, MovePhase, MoveStatus, MoveStrategy, Scheduled};
use banlieue_api::Provider;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};

use super::{api_error, resource_of, status_error, Blocked, Reconcile, Target, Wanted, MACHINE_GONE_RECHECK, STALE_CACHE_RETRY};
use crate::framework::reconciler::Outcome;
use crate::status::conditions::{self, INFRASTRUCTURE_READY, MOVED, PLACEMENT_VALID, READY};
use crate::status::reasons::Reason;

/// What a carrying move does next, from what its two Machines say.
#[derive(Debug, PartialEq)]
pub enum Step {
    /// Ask the source to power off, and wait until it is.
    PowerOff,
    /// Make (or keep) the target Machine, and follow its carry.
    Carry,
    /// The target is Ready: it is the VM's Machine now, the source goes.
    Switch,
    /// The carry failed for good: why.
    GiveUp(Reason, String),
}

/// The next step, from the source's power and the target's status (none: not made yet).
pub fn step(source_off: bool, target: Option<&InfraMachineStatus>) -> Step {
    let Some(st) = target else {
        return if source_off { Step::Carry } else { Step::PowerOff };
    };
    match &st.carry {
        Some(CarryStatus { phase: MovePhase::Failed, message, reason, .. }) => {
            let reason = reason.as_deref().and_then(Reason::parse).unwrap_or(Reason::MoveFailed);
            Step::GiveUp(reason, message.clone().unwrap_or_default())
        }
        Some(CarryStatus { phase: MovePhase::Starting, .. }) if conditions::is_true(&st.conditions, READY) => Step::Switch,
        _ => Step::Carry,
    }
}

/// The name of the Machine a VM moves to when it stays of the same kind (two Machines of one
/// kind cannot share the name): the VM's name and `<vm>.moved` take turns. A dot cannot be in
/// a name banlieue gives a Machine otherwise unless the VM's own name has one.
pub fn moved_name(vm: &str, from: &str) -> String {
    if from == vm { format!("{vm}.moved") } else { vm.to_string() }
}

/// Why Provider `name` cannot take part in a carrying move as `feature` (`disk-export` at the
/// source, `disk-import` at the target), if it cannot: what its driver offers, and what to set.
pub fn lacks(provider: Option<&Provider>, name: &str, feature: &str) -> Option<String> {
    let offered = provider.and_then(|p| p.status.as_ref()).map(|s| s.driver_features.clone()).unwrap_or_default();
    if offered.iter().any(|f| f == feature) {
        return None;
    }
    let class = provider.map(|p| p.spec.provider_class_ref.name.clone()).unwrap_or_default();
    let offers = if offered.is_empty() { "nothing more".to_string() } else { offered.join(", ") };
    let what = if feature == "disk-export" { "export its machines' disks" } else { "make machines from carried disks" };
    Some(format!(
        "Provider {name} (ProviderClass {class}) cannot {what}: its driver offers {offers}; set spec.moveStrategy: Recreate to move the VM by making it afresh from its image (what the guest wrote is lost)"
    ))
}

impl Reconcile<'_> {
    /// Whether the VM moves by carrying its disks.
    pub(super) fn carries(&self) -> bool {
        self.vm.spec.move_strategy == MoveStrategy::CarryDisks
    }

    /// A carrying move under way (recorded, not failed, source not yet being removed).
    pub(super) fn carrying(&self) -> bool {
        self.status.moving.as_ref().is_some_and(|m| !matches!(m.phase, MovePhase::Failed | MovePhase::RemovingSource))
    }

    /// The last carrying move failed for this generation of the VM: why (it is not tried again
    /// until the spec changes).
    pub(super) fn move_failed(&self) -> Option<String> {
        let m = self.status.moving.as_ref().filter(|m| m.phase == MovePhase::Failed && m.observed_generation == self.generation)?;
        Some(m.message.clone().unwrap_or_default())
    }

    /// Step 1: a carrying move from `from` to `to` is recorded, before anything is touched.
    pub(super) fn start_move(&mut self, from: Scheduled, to: &Scheduled) {
        let machine = self.status.infrastructure_ref.clone().unwrap_or_default();
        self.status.moving = Some(MoveStatus {
            from: MoveEnd { scheduled: from, machine },
            to: MoveEnd { scheduled: to.clone(), machine: InfrastructureRef::default() },
            phase: MovePhase::PoweringOff,
            disks: vec![],
            message: None,
            observed_generation: self.generation,
            start_time: Some(Time(k8s_openapi::jiff::Timestamp::now())),
        });
    }

    /// Steps 2 to 4, while the VM's Machine is still the source (`old`).
    pub(super) async fn carry(
        &mut self,
        old: DynamicObject,
        wanted: &Wanted,
        provider: &Provider,
        target: &Target,
        scheduled: &Scheduled,
        addressing: &std::collections::BTreeMap<String, banlieue_api::common::StaticIp>,
    ) -> Result<Outcome, Blocked> {
        // The move is on record before the source is touched.
        self.record().await.map_err(status_error)?;
        let mut mv = self.status.moving.clone().unwrap_or_default();
        let from = mv.from.machine.clone();
        let to_name = if target.reference.kind == from.kind { moved_name(&self.name, &from.name) } else { target.reference.name.clone() };
        mv.to.machine = InfrastructureRef { name: to_name.clone(), uid: None, ..target.reference.clone() };
        let to_api: Api<DynamicObject> = Api::namespaced_with(self.ctx.client.clone(), &self.ns, &target.resource);
        let made = to_api.get_opt(&to_name).await.map_err(api_error)?;
        let source_status: InfraMachineStatus = old.data.get("status").cloned().and_then(|s| serde_json::from_value(s).ok()).unwrap_or_default();
        let source_off = source_status.power_state == Some(banlieue_api::common::PowerState::PoweredOff);
        let target_status: Option<InfraMachineStatus> = made.as_ref().map(|m| m.data.get("status").cloned().and_then(|s| serde_json::from_value(s).ok()).unwrap_or_default());
        let to = format!("{}/{}", scheduled.provider, scheduled.failure_domain);
        match step(source_off, target_status.as_ref()) {
            Step::PowerOff => {
                self.power_off_source(&old, &from).await?;
                mv.phase = MovePhase::PoweringOff;
                self.progress(mv, format!("powering off {} {} to carry its disks to {to}", from.kind, from.name));
                // The source's power change brings the VM back.
                Ok(Outcome::AwaitChange)
            }
            Step::Carry => {
                let old_spec: InfraMachineSpec = serde_json::from_value(old.data.get("spec").cloned().unwrap_or_default()).unwrap_or_default();
                let mut spec = self.machine_spec(&wanted.class, &wanted.image, provider, scheduled, addressing, None)?;
                spec.vm.carry = Some(crate::controllers::machine::carry::source(&mv.from.scheduled.provider, &from.kind, &old, &old_spec));
                let machine = self.apply_machine(&target.resource, &to_name, spec, made).await?;
                let carry = target_status.and_then(|s| s.carry).unwrap_or_default();
                mv.phase = if made_status(&machine).is_some() { carry.phase } else { MovePhase::Exporting };
                mv.disks = carry.disks;
                let bytes: u64 = mv.disks.iter().map(|d| d.bytes_done).sum();
                let message = format!("moving to {to}, carrying the disks of {} {}: {:?} ({} disk(s), {bytes} bytes)", from.kind, from.name, mv.phase, mv.disks.len());
                self.progress(mv, message);
                // The target's status changes bring the VM back.
                Ok(Outcome::AwaitChange)
            }
            Step::Switch => {
                let machine = made.expect("a Ready target exists");
                self.delete_machine(&from).await?;
                mv.phase = MovePhase::RemovingSource;
                let carried = mv.disks.len();
                let target_ref = mv.to.machine.clone();
                self.status.moving = Some(mv);
                self.mirror(&machine, &target_ref);
                self.event(false, Reason::Moving, "Move", format!("{} {to_name} is Ready on {to} with {carried} carried disk(s); deleting {} {}", target_ref.kind, from.kind, from.name)).await;
                Ok(Outcome::Requeue(MACHINE_GONE_RECHECK))
            }
            Step::GiveUp(reason, why) => {
                if made.as_ref().is_some_and(|m| m.metadata.deletion_timestamp.is_none()) {
                    to_api.delete(&to_name, &DeleteParams::default()).await.map_err(api_error)?;
                }
                let message = format!("the move to {to} failed, {} {} stays the VM's machine: {why}", from.kind, from.name);
                mv.phase = MovePhase::Failed;
                mv.message = Some(why);
                mv.observed_generation = self.generation;
                self.status.scheduled = Some(mv.from.scheduled.clone());
                self.state.assumed.assume(self.vm, mv.from.scheduled.clone());
                self.status.moving = Some(mv);
                self.set(MOVED, false, reason, message.clone());
                self.set(PLACEMENT_VALID, false, Reason::MoveFailed, format!("{message}; change the VM's spec to try again"));
                self.event(true, Reason::MoveFailed, "Move", message).await;
                // The source gets the VM's spec (its power) back at once.
                Ok(Outcome::Requeue(STALE_CACHE_RETRY))
            }
        }
    }

    /// Step 4's end: once the source Machine is gone, the move is over.
    pub(super) async fn finish_move(&mut self) -> Result<Option<Outcome>, Blocked> {
        let Some(mv) = self.status.moving.clone().filter(|m| m.phase == MovePhase::RemovingSource) else { return Ok(None) };
        if self.get_machine(&mv.from.machine).await.map_err(api_error)?.is_some() {
            self.delete_machine(&mv.from.machine).await?;
            return Ok(Some(Outcome::Requeue(MACHINE_GONE_RECHECK)));
        }
        let message = format!(
            "moved from {}/{} to {}/{} with its {} disk(s)",
            mv.from.scheduled.provider,
            mv.from.scheduled.failure_domain,
            mv.to.scheduled.provider,
            mv.to.scheduled.failure_domain,
            mv.disks.len()
        );
        self.status.moving = None;
        self.set(MOVED, true, Reason::Moved, message.clone());
        self.event(false, Reason::Moved, "Move", message).await;
        Ok(None)
    }

    /// The source Machine asked to power off (its reconciler does it per its power-off mode).
    async fn power_off_source(&self, old: &DynamicObject, from: &InfrastructureRef) -> Result<(), Blocked> {
        if old.data["spec"]["vm"]["powerState"] == "PoweredOff" {
            return Ok(());
        }
        let api: Api<DynamicObject> = Api::namespaced_with(self.ctx.client.clone(), &self.ns, &resource_of(from));
        let patch = serde_json::json!({ "spec": { "vm": { "powerState": "PoweredOff" } } });
        api.patch(&from.name, &PatchParams::default(), &Patch::Merge(patch)).await.map_err(api_error)?;
        Ok(())
    }

    pub(super) async fn delete_machine(&self, r: &InfrastructureRef) -> Result<(), Blocked> {
        let api: Api<DynamicObject> = Api::namespaced_with(self.ctx.client.clone(), &self.ns, &resource_of(r));
        match api.get_opt(&r.name).await.map_err(api_error)? {
            Some(m) if m.metadata.deletion_timestamp.is_none() => api.delete(&r.name, &DeleteParams::default()).await.map(drop).map_err(api_error),
            _ => Ok(()),
        }
    }

    /// The move's progress in `status.move` and on the VM's conditions (not Ready until it is over).
    fn progress(&mut self, mv: MoveStatus, message: String) {
        self.status.moving = Some(mv);
        self.set(INFRASTRUCTURE_READY, false, Reason::Carrying, message.clone());
        self.set(READY, false, Reason::Carrying, message);
    }
}

/// The status a Machine reports, once it has.
fn made_status(m: &DynamicObject) -> Option<InfraMachineStatus> {
    m.data.get("status").filter(|s| !s.is_null()).cloned().and_then(|s| serde_json::from_value(s).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(phase: MovePhase, ready: bool) -> InfraMachineStatus {
        let mut st = InfraMachineStatus { carry: Some(CarryStatus { phase, ..Default::default() }), ..Default::default() };
        conditions::set(&mut st.conditions, READY, ready, if ready { Reason::PoweredOn } else { Reason::Provisioning }, "", None);
        st
    }

    #[test]
    fn a_move_powers_the_source_off_then_carries_then_switches_once_the_target_is_ready() {
        assert_eq!(step(false, None), Step::PowerOff);
        assert_eq!(step(true, None), Step::Carry);
        assert_eq!(step(true, Some(&target(MovePhase::Exporting, false))), Step::Carry);
        assert_eq!(step(true, Some(&target(MovePhase::Importing, false))), Step::Carry);
        assert_eq!(step(true, Some(&target(MovePhase::Starting, false))), Step::Carry, "made, not Ready yet");
        assert_eq!(step(true, Some(&target(MovePhase::Starting, true))), Step::Switch);
        // A Ready condition left from before the carry finished does not switch.
        assert_eq!(step(true, Some(&target(MovePhase::Importing, true))), Step::Carry);
    }

    #[test]
    fn a_failed_carry_gives_up_with_its_reason() {
        let mut st = target(MovePhase::Failed, false);
        st.carry.as_mut().unwrap().reason = Some("CannotCarryDisks".into());
        st.carry.as_mut().unwrap().message = Some("no room".into());
        assert_eq!(step(true, Some(&st)), Step::GiveUp(Reason::CannotCarryDisks, "no room".into()));
        st.carry.as_mut().unwrap().reason = Some("SomethingElse".into());
        assert_eq!(step(true, Some(&st)), Step::GiveUp(Reason::MoveFailed, "no room".into()));
    }

    #[test]
    fn machines_of_one_kind_take_turns_at_the_vms_name() {
        assert_eq!(moved_name("web", "web"), "web.moved");
        assert_eq!(moved_name("web", "web.moved"), "web");
    }

    #[test]
    fn a_provider_without_the_feature_is_named_with_the_field_to_set() {
        let mut p: Provider = serde_json::from_value(serde_json::json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "pve", "namespace": "ns"},
            "spec": {"providerClassRef": {"name": "proxmox"}, "connection": {"endpoint": "https://pve:8006"}},
            "status": {"driverFeatures": ["snapshots", "disk-import"]}})).unwrap();
        assert_eq!(lacks(Some(&p), "pve", "disk-import"), None);
        let why = lacks(Some(&p), "pve", "disk-export").unwrap();
        assert!(why.contains("Provider pve (ProviderClass proxmox) cannot export") && why.contains("snapshots, disk-import") && why.contains("moveStrategy: Recreate"), "{why}");
        p.status = None;
        assert!(lacks(Some(&p), "pve", "disk-import").unwrap().contains("offers nothing more"));
    }
}
