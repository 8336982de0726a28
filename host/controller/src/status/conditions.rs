//! Kubernetes conditions: set one, keeping `lastTransitionTime` when the status
//! did not change, so a condition's age says how long it has been true.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::status::reasons::Reason;

pub const READY: &str = "Ready";
pub const SCHEDULED: &str = "Scheduled";
pub const PLACEMENT_VALID: &str = "PlacementValid";
pub const INFRASTRUCTURE_READY: &str = "InfrastructureReady";
pub const PROVISIONED: &str = "Provisioned";
pub const VERIFIED: &str = "Verified";
/// Every address a VM declares is reported by its backend (none declared: any address is).
pub const ADDRESSES_READY: &str = "AddressesReady";
/// Whether the machine's backend holds the CPUs, memory and disks its spec asks for.
pub const CONFIGURATION_APPLIED: &str = "ConfigurationApplied";
/// Whether the VM's `spec.revertTo` has been applied.
pub const REVERTED: &str = "Reverted";
/// A VM's last move that carried its disks: done, or why not.
pub const MOVED: &str = "Moved";
/// Whether an adopted VM's hardware is what its class says (it is reported, not changed).
pub const CONFIGURATION_MATCHES: &str = "ConfigurationMatches";

/// Set condition `type_` in `conditions`. Returns whether that is news — a new condition,
/// its status or reason changed, or it is said of a new generation of the object (the user
/// changed something, and this is what came of it) — which is when a reconcile announces
/// it as an Event. A message alone changing (a count, an address, a backend's wording) is
/// not news: every later reconcile saying the same thing announces nothing.
pub fn set(conditions: &mut Vec<Condition>, type_: &str, status: bool, reason: Reason, message: impl Into<String>, generation: Option<i64>) -> bool {
    let before = get(conditions, type_).map(|c| (c.status == "True", c.reason.clone(), c.observed_generation));
    put(conditions, type_, status, reason.as_str(), message, generation);
    before.is_none_or(|(was, why, of)| was != status || why != reason.as_str() || of != generation)
}

/// Set condition `type_` with a reason someone else gave: a driver component's own
/// conditions, or a Machine's condition mirrored on its VirtualMachine.
pub fn set_reported(conditions: &mut Vec<Condition>, type_: &str, status: bool, reason: &str, message: impl Into<String>, generation: Option<i64>) {
    put(conditions, type_, status, reason, message, generation);
}

fn put(conditions: &mut Vec<Condition>, type_: &str, status: bool, reason: &str, message: impl Into<String>, generation: Option<i64>) {
    let status = if status { "True" } else { "False" }.to_string();
    let message = truncate(message.into());
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != status {
                c.last_transition_time = now;
            }
            c.status = status;
            c.reason = reason.into();
            c.message = message;
            c.observed_generation = generation;
        }
        None => conditions.push(Condition {
            type_: type_.into(),
            status,
            reason: reason.into(),
            message,
            observed_generation: generation,
            last_transition_time: now,
        }),
    }
}

/// Remove condition `type_` (one that only exists while something is wrong).
pub fn remove(conditions: &mut Vec<Condition>, type_: &str) {
    conditions.retain(|c| c.type_ != type_);
}

/// Is condition `type_` True?
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    conditions.iter().any(|c| c.type_ == type_ && c.status == "True")
}

/// The condition `type_`, if set.
pub fn get<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Condition messages are capped (the API allows 32 KiB; users read a line or two).
fn truncate(mut s: String) -> String {
    const MAX: usize = 1024;
    if s.len() > MAX {
        let mut end = MAX;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_condition_or_a_changed_status_or_reason_is_news_a_new_message_alone_is_not() {
        let mut conditions = Vec::new();
        assert!(set(&mut conditions, READY, false, Reason::BackendUnavailable, "down", None), "new");
        assert!(!set(&mut conditions, READY, false, Reason::BackendUnavailable, "still down (3 tries)", None), "same status and reason");
        assert_eq!(get(&conditions, READY).map(|c| c.message.as_str()), Some("still down (3 tries)"), "the message is still written");
        assert!(set(&mut conditions, READY, false, Reason::CredentialsRefused, "refused", None), "another reason");
        assert!(set(&mut conditions, READY, false, Reason::CredentialsRefused, "refused", Some(2)), "of a new generation");
        assert!(!set(&mut conditions, READY, false, Reason::CredentialsRefused, "refused", Some(2)), "the same again");
        let since = get(&conditions, READY).map(|c| c.last_transition_time.clone());
        assert!(set(&mut conditions, READY, true, Reason::CredentialsRefused, "ok", None), "another status");
        assert_ne!(get(&conditions, READY).map(|c| c.last_transition_time.clone()), since, "a transition moves lastTransitionTime");
    }
}
