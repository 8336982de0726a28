//! Bringing a machine's backend VM to its spec (create, power, restart) and its status
//! to what the driver observed.

use banlieue_api::common::{Initialization, MachinePhase, PowerState};
use banlieue_api::infra::{InfraMachineSpec, InfraMachineStatus, UpdatePolicy};
use banlieue_runtime::provider::{self as wit, MachineRef, MachineStatus};
use banlieue_runtime::{CallError, GuestError};
use kube::api::{ApiResource, DynamicObject};
use kube::Resource;

use super::convert::{address, api_phase, api_power, power_off, wit_machine, wit_power};
use super::{call, hardware, machine_ref, operation};
use crate::Context;
use crate::failure::Failure;
use crate::sandbox::grants::Backend;
use crate::status::conditions::{self, CONFIGURATION_APPLIED, CONFIGURATION_MATCHES, PROVISIONED, READY};
use crate::status::reasons::Reason;

/// Bring the backend VM to the spec: create (idempotent), then power and restart.
pub(super) async fn realise(ctx: &Context, m: &DynamicObject, resource: &ApiResource, spec: &InfraMachineSpec, st: &mut InfraMachineStatus, b: &Backend) -> Result<MachineStatus, Failure> {
    let r = machine_ref(m, spec);
    let (limits, grants) = (b.driver.limits, b.grants.clone());
    // A machine this process just created counts as provisioned even when the cached
    // object predates the status write: a second `create` would be harmless, only wasted.
    let provisioned = (st.initialization.as_ref().and_then(|i| i.provisioned).unwrap_or(false) && spec.provider_id.is_some())
        || ctx.created.lock().unwrap_or_else(|e| e.into_inner()).contains(&r.uid);
    let described = if provisioned {
        match b.drive(ctx, "describe", b.driver.component.describe(&b.config, &r, limits, grants.clone())).await {
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
        None if spec.vm.adopt.is_some() => {
            let backend_id = spec.vm.adopt.as_ref().map(|a| a.backend_id.as_str()).unwrap_or_default();
            let adopted = super::adopt::adopt(ctx, m, resource, b, &r, backend_id).await?;
            ctx.created.lock().unwrap_or_else(|e| e.into_inner()).insert(r.uid.clone());
            // A restart asked before the adoption is not one for this machine.
            st.last_restart_requested_at = spec.vm.restart_requested_at.clone();
            adopted
        }
        None => {
            let machine = wit_machine(ctx, m, spec).await?;
            let _op = operation(b)?;
            let created = match &spec.vm.restore {
                // A restore: a copy of another machine at its snapshot (then a machine like any other).
                Some(from) => {
                    let source = MachineRef {
                        uid: from.source_machine_uid.clone(),
                        name: from.source_machine.clone(),
                        namespace: r.namespace.clone(),
                        provider_id: None,
                        failure_domain: from.source_failure_domain.clone(),
                        backend_id: from.source_backend_id.clone(),
                    };
                    let made = call(ctx, b, "snapshot-clone", b.driver.component.snapshot_clone(&b.config, &machine, &source, &from.snapshot_id, from.linked, limits, grants.clone()))
                        .await
                        .map_err(|f| f.context(format_args!("restoring snapshot {} of {}", from.snapshot_id, from.source_machine)))?;
                    ctx.event(&m.object_ref(resource), false, Reason::Restored, "Restore", format!("made from snapshot {} of {}", from.snapshot_id, from.source_machine)).await;
                    made
                }
                // A move: made from the disks of the machine it replaces, then like any other.
                None if spec.vm.carry.is_some() => {
                    let from = spec.vm.carry.as_ref().expect("checked");
                    let made = super::carry::carry(ctx, m, resource, st, b, from, &machine).await?;
                    ctx.event(&m.object_ref(resource), false, Reason::Carrying, "Carry", format!("made from the disks of {} {} carried from Provider {}", from.kind, from.machine, from.provider)).await;
                    made
                }
                None => call(ctx, b, "create", b.driver.component.create(&b.config, &machine, limits, grants.clone())).await?,
            };
            ctx.created.lock().unwrap_or_else(|e| e.into_inner()).insert(r.uid.clone());
            // A machine just made needs no restart for a request older than itself.
            st.last_restart_requested_at = spec.vm.restart_requested_at.clone();
            created
        }
    };
    let want = wit_power(spec.vm.power_state);
    let off = power_off(spec);
    // A revert the VM asked for (`spec.revertTo`, resolved): off per its power-off mode, back
    // to the snapshot, then powered as the spec says (below). Once per snapshot object; a
    // crash before the status write reverts again to the same snapshot, which is the same end.
    match &spec.vm.revert {
        Some(revert) if st.reverted_to.as_deref() != Some(revert.snapshot_uid.as_str()) => {
            let _op = operation(b)?;
            if observed.power_state != wit::PowerState::PoweredOff {
                call(ctx, b, "set-power", b.driver.component.set_power(&b.config, &r, wit::PowerState::PoweredOff, off, limits, grants.clone())).await?;
            }
            call(ctx, b, "snapshot-revert", b.driver.component.snapshot_revert(&b.config, &r, &revert.snapshot_id, limits, grants.clone()))
                .await
                .map_err(|f| f.context(format_args!("reverting to snapshot {}", revert.snapshot_id)))?;
            st.reverted_to = Some(revert.snapshot_uid.clone());
            observed = call(ctx, b, "describe", b.driver.component.describe(&b.config, &r, limits, grants.clone())).await?;
            ctx.event(&m.object_ref(resource), false, Reason::Reverted, "Revert", format!("reverted to snapshot {}", revert.snapshot_id)).await;
        }
        // A revert cleared from the spec may be asked for again.
        None => st.reverted_to = None,
        Some(_) => {}
    }
    let mut restart = spec.vm.restart_requested_at.is_some() && spec.vm.restart_requested_at != st.last_restart_requested_at;
    // A change of hardware (a grown class) is applied by the driver's `create` while the
    // machine is off: at once when it is off, after a power-off when the update policy says
    // `Restart`, else in the power cycle a restart asks for.
    // An adopted machine keeps the hardware it came with (`ConfigurationMatches` reports it)
    // unless its VM says `applyClass`: then its driver's `reconfigure` brings it there.
    let (changes, target) = hardware::wanted(&spec.vm, observed.hardware.as_ref());
    let is_off = observed.power_state == wit::PowerState::PoweredOff;
    // A change this spec already asked for and the backend did not take (a disk a driver does
    // not add in place) is not worth another power cycle of a running machine.
    let cycle = (spec.vm.update_policy.unwrap_or_default() == UpdatePolicy::Restart && !tried(st, m.metadata.generation))
        || (restart && spec.vm.power_state == PowerState::PoweredOn);
    if !changes.apply.is_empty() && changes.refused.is_empty() && (is_off || cycle) {
        enum Apply {
            Create(wit::Machine),
            Reconfigure(wit::HardwareTarget),
        }
        let apply = match target {
            Some(target) => Apply::Reconfigure(target),
            None => Apply::Create(wit_machine(ctx, m, spec).await?),
        };
        let _op = operation(b)?;
        if !is_off {
            call(ctx, b, "set-power", b.driver.component.set_power(&b.config, &r, wit::PowerState::PoweredOff, off, limits, grants.clone())).await?;
        }
        observed = match &apply {
            // `create` on the existing machine: brought to the spec's hardware, then its power state.
            Apply::Create(machine) => call(ctx, b, "create", b.driver.component.create(&b.config, machine, limits, grants.clone())).await?,
            // An adopted one (never `create`d): its driver's `reconfigure`, left off.
            Apply::Reconfigure(target) => call(ctx, b, "reconfigure", b.driver.component.reconfigure(&b.config, &r, target, limits, grants.clone())).await?,
        };
        let how = if is_off { "while off" } else { "in a power cycle" };
        ctx.event(&m.object_ref(resource), false, Reason::Reconfigured, "Reconfigure", format!("applied {how}: {}", changes.apply.join(", "))).await;
        // What the backend still lacks after it was asked is not asked for again (no power
        // cycle after power cycle) until the spec changes.
        let (left, _) = hardware::wanted(&spec.vm, observed.hardware.as_ref());
        if !left.apply.is_empty() {
            conditions::set(&mut st.conditions, CONFIGURATION_APPLIED, false, Reason::NotAppliedInPlace, left.not_applied(), m.metadata.generation);
        }
        if restart {
            // That power cycle was the restart asked for.
            st.last_restart_requested_at = spec.vm.restart_requested_at.clone();
            restart = false;
            ctx.event(&m.object_ref(resource), false, Reason::Restarted, "Restart", format!("restarted for restartRequestedAt={}", spec.vm.restart_requested_at.as_deref().unwrap_or_default())).await;
        }
    }
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

/// Whether the backend was already asked to apply this spec's hardware (`generation`) and did
/// not: `ConfigurationApplied=False/NotAppliedInPlace` for it.
fn tried(st: &InfraMachineStatus, generation: Option<i64>) -> bool {
    conditions::get(&st.conditions, CONFIGURATION_APPLIED).is_some_and(|c| c.reason == Reason::NotAppliedInPlace.as_str() && c.observed_generation == generation)
}

/// The machine's status from what the driver observed: addresses, power, phase, the
/// driver's own conditions, `Provisioned`, and `Ready` only when provisioned and powered as
/// the spec asks.
pub(super) fn apply_observed(st: &mut InfraMachineStatus, spec: &InfraMachineSpec, observed: &MachineStatus, generation: Option<i64>) {
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
    conditions::set(
        &mut st.conditions,
        PROVISIONED,
        observed.provisioned,
        if observed.provisioned { Reason::Provisioned } else { Reason::Provisioning },
        observed.provider_id.clone(),
        generation,
    );
    if let (Some(hw), Some(adopt)) = (&observed.hardware, &spec.vm.adopt) {
        let have = hardware::reported(&spec.vm, hw);
        let differs = hardware::differences(&spec.vm, &have);
        let refused = hardware::to_class(&spec.vm, &have).0.refused;
        let (reason, message) = if differs.is_empty() {
            (Reason::ConfigurationMatches, "the adopted VM has the CPUs, memory and disks its class says".to_string())
        } else if !adopt.apply_class {
            (Reason::ConfigurationDiffers, format!("the adopted VM differs from its class, and is left as it is: {}", differs.join(", ")))
        } else if !refused.is_empty() {
            (Reason::DiskShrinkRefused, format!("{}: nothing was changed (applyClass); give the class the disk's size or more", refused.join("; ")))
        } else {
            let when = "applyClass brings it there while it is powered off: at once when it is off, else at its next power cycle (updatePolicy Restart: now); disks it lacks are not added";
            (Reason::ConfigurationDiffers, format!("the adopted VM differs from its class: {}; {when}", differs.join(", ")))
        };
        conditions::set(&mut st.conditions, CONFIGURATION_MATCHES, differs.is_empty(), reason, message, generation);
        st.hardware = Some(have);
    } else if let Some(hw) = &observed.hardware {
        let have = hardware::reported(&spec.vm, hw);
        let changes = hardware::changes(&spec.vm, &have);
        let on = power != PowerState::PoweredOff;
        let (applied, reason, message) = if changes.none() {
            (true, Reason::Applied, "the backend holds the CPUs, memory and disks the spec asks for".to_string())
        } else if !changes.refused.is_empty() {
            (false, Reason::DiskShrinkRefused, format!("{}: nothing was changed; give the class the disk's size or more", changes.refused.join("; ")))
        } else if !tried(st, generation) && on && spec.vm.update_policy.unwrap_or_default() == UpdatePolicy::OnNextPowerCycle {
            (false, Reason::PendingRestart, format!("{} at the next power cycle (updatePolicy OnNextPowerCycle): restart the VM, or power it off", changes.apply.join(", ")))
        } else {
            (false, Reason::NotAppliedInPlace, changes.not_applied())
        };
        conditions::set(&mut st.conditions, CONFIGURATION_APPLIED, applied, reason, message, generation);
        st.hardware = Some(have);
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(power: PowerState) -> InfraMachineSpec {
        serde_json::from_value(serde_json::json!({"failureDomain": "rack1", "vm": {"powerState": power}})).expect("spec")
    }

    fn observed(provisioned: bool, power: wit::PowerState, phase: wit::MachinePhase) -> MachineStatus {
        MachineStatus {
            provider_id: "libvirt://1234".into(),
            hardware: None,
            power_state: power,
            addresses: vec![wit::Address { type_: wit::AddressType::InternalIp, address: "192.168.123.10".into() }],
            conditions: vec![wit::Condition { type_: "GuestAgent".into(), status: wit::ConditionStatus::True, reason: "Connected".into(), message: "qemu-ga".into() }],
            provisioned,
            phase,
        }
    }

    fn condition<'a>(st: &'a InfraMachineStatus, type_: &str) -> (&'a str, &'a str) {
        let c = conditions::get(&st.conditions, type_).unwrap_or_else(|| panic!("no {type_}"));
        (c.status.as_str(), c.reason.as_str())
    }

    #[test]
    fn a_machine_is_ready_only_provisioned_and_powered_as_asked_and_says_why_not() {
        let mut st = InfraMachineStatus::default();
        apply_observed(&mut st, &spec(PowerState::PoweredOn), &observed(true, wit::PowerState::PoweredOn, wit::MachinePhase::Running), Some(3));
        assert_eq!(condition(&st, READY), ("True", "PoweredOn"));
        assert_eq!(condition(&st, PROVISIONED), ("True", "Provisioned"));
        assert_eq!(condition(&st, "GuestAgent"), ("True", "Connected"), "the driver's own conditions, as it said them");
        assert_eq!((st.addresses.len(), st.failure_domain.as_deref(), st.observed_generation), (1, Some("rack1"), Some(3)));
        assert_eq!(st.initialization.as_ref().and_then(|i| i.provisioned), Some(true));

        apply_observed(&mut st, &spec(PowerState::PoweredOn), &observed(true, wit::PowerState::PoweredOff, wit::MachinePhase::PoweredOff), Some(3));
        assert_eq!(condition(&st, READY), ("False", "PowerStateMismatch"), "powered off while the spec asks for on");
        apply_observed(&mut st, &spec(PowerState::PoweredOn), &observed(true, wit::PowerState::PoweredOff, wit::MachinePhase::PoweringOn), Some(3));
        assert_eq!(condition(&st, READY), ("False", "PoweringOn"), "on its way: the phase says so");
        apply_observed(&mut st, &spec(PowerState::PoweredOn), &observed(false, wit::PowerState::PoweredOff, wit::MachinePhase::Cloning), Some(3));
        assert_eq!(condition(&st, READY), ("False", "Cloning"));
        assert_eq!(condition(&st, PROVISIONED), ("False", "Provisioning"));
    }

    #[test]
    fn configuration_applied_says_what_the_backend_holds_against_the_spec() {
        let mut spec: InfraMachineSpec = serde_json::from_value(serde_json::json!({"vm": {"powerState": "PoweredOn", "cpus": 2, "memoryMiB": 512,
            "disks": [{"name": "root", "sizeGiB": 4, "target": "p"}]}})).expect("spec");
        let mut seen = observed(true, wit::PowerState::PoweredOn, wit::MachinePhase::Running);
        let hardware = |cpus: u32, disk: u64| wit::Hardware { cpus, memory_mib: 512, disks: vec![wit::DiskStatus { name: "root".into(), size_gib: disk, id: "/p/root".into() }], nics: vec![] };
        let mut st = InfraMachineStatus::default();
        seen.hardware = Some(hardware(2, 4));
        apply_observed(&mut st, &spec, &seen, Some(1));
        assert_eq!(condition(&st, CONFIGURATION_APPLIED), ("True", "Applied"));
        assert_eq!(st.hardware.as_ref().map(|h| (h.cpus, h.disks[0].name.as_str(), h.disks[0].size_gib)), Some((2, "root", 4)));

        seen.hardware = Some(hardware(1, 4));
        apply_observed(&mut st, &spec, &seen, Some(2));
        assert_eq!(condition(&st, CONFIGURATION_APPLIED), ("False", "PendingRestart"), "running, OnNextPowerCycle");
        spec.vm.update_policy = Some(UpdatePolicy::Restart);
        apply_observed(&mut st, &spec, &seen, Some(2));
        assert_eq!(condition(&st, CONFIGURATION_APPLIED), ("False", "NotAppliedInPlace"), "Restart would have applied it: the backend did not");
        spec.vm.update_policy = None;
        apply_observed(&mut st, &spec, &seen, Some(2));
        assert_eq!(condition(&st, CONFIGURATION_APPLIED), ("False", "NotAppliedInPlace"), "tried for this generation: no restart is asked for again");
        apply_observed(&mut st, &spec, &seen, Some(3));
        assert_eq!(condition(&st, CONFIGURATION_APPLIED), ("False", "PendingRestart"), "a new spec is worth a try");

        seen.hardware = Some(hardware(2, 8));
        apply_observed(&mut st, &spec, &seen, Some(3));
        assert_eq!(condition(&st, CONFIGURATION_APPLIED), ("False", "DiskShrinkRefused"));
    }
}
