//! The placement decisions this process made that the VM cache does not show yet.
//!
//! A Machine's event can wake a VM before the VM's own watch has brought back the status
//! that placed it; acting on that older copy would place the VM a second time. Decisions
//! enter here when made (before they are written), so the next placement in this process
//! counts them too: a burst of VMs is spread, not all put where the first went.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use banlieue_api::vm::Scheduled;
use banlieue_api::VirtualMachine;
use kube::runtime::reflector::Store;
use kube::ResourceExt;

/// How long a recorded decision may go unseen in the cache before the cache is trusted again.
const BOUND: Duration = Duration::from_secs(10);

#[derive(Default)]
pub(super) struct Assumed {
    /// By VM UID: the decision and when it was made.
    unseen: Mutex<HashMap<String, (Scheduled, Instant)>>,
    /// Held from gathering candidates to assuming the decision: placements in one process
    /// see each other's decisions.
    pub(super) placing: tokio::sync::Mutex<()>,
}

impl Assumed {
    fn unseen(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Scheduled, Instant)>> {
        self.unseen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `vm` (as cached) predates a decision this process made for it; forgets the
    /// decision once the cache shows it.
    pub(super) fn stale(&self, vm: &VirtualMachine) -> bool {
        let (Some(uid), mut unseen) = (vm.uid(), self.unseen()) else { return false };
        let Some((recorded, at)) = unseen.get(&uid) else { return false };
        // A watch catches up in milliseconds; past the bound, the cache is what it is.
        let seen = vm.status.as_ref().and_then(|s| s.scheduled.as_ref()).is_some_and(|s| same_decision(s, recorded));
        if seen || at.elapsed() > BOUND {
            unseen.remove(&uid);
            return false;
        }
        true
    }

    /// Count `scheduled` as `vm`'s placement from now on (it is about to be written).
    pub(super) fn assume(&self, vm: &VirtualMachine, scheduled: Scheduled) {
        if let Some(uid) = vm.uid() {
            self.unseen().insert(uid, (scheduled, Instant::now()));
        }
    }

    /// A decision whose write failed, or a VM gone: nothing records it.
    pub(super) fn forget(&self, vm: &VirtualMachine) {
        if let Some(uid) = vm.uid() {
            self.unseen().remove(&uid);
        }
    }

    /// Every VM of `vms`, with the decisions this process made but the cache does not show
    /// yet. (`image` is filled in after the decision, so a cached copy may differ from it there.)
    pub(super) fn placed_vms(&self, vms: &Store<VirtualMachine>) -> Vec<Arc<VirtualMachine>> {
        let mut vms = vms.state();
        let mut unseen = self.unseen();
        unseen.retain(|_, (_, at)| at.elapsed() <= BOUND);
        if unseen.is_empty() {
            return vms;
        }
        for vm in &mut vms {
            let Some((scheduled, _)) = vm.uid().and_then(|uid| unseen.get(&uid)) else { continue };
            if !vm.status.as_ref().and_then(|s| s.scheduled.as_ref()).is_some_and(|s| same_decision(s, scheduled)) {
                let mut assumed = VirtualMachine::clone(vm);
                assumed.status.get_or_insert_with(Default::default).scheduled = Some(scheduled.clone());
                *vm = Arc::new(assumed);
            }
        }
        vms
    }
}

/// Whether two placements are the same decision: where, and with which storage and networks.
/// The image it is made from is recorded after the decision, so it is not part of it.
pub(super) fn same_decision(a: &Scheduled, b: &Scheduled) -> bool {
    (&a.provider, &a.provider_class, &a.failure_domain, &a.storage, &a.networks) == (&b.provider, &b.provider_class, &b.failure_domain, &b.storage, &b.networks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vm(placed_on: Option<&str>) -> VirtualMachine {
        crate::fixtures::vm("team", "web", placed_on)
    }

    fn on(provider: &str) -> Scheduled {
        serde_json::from_value(json!({"provider": provider, "failureDomain": "d", "providerClass": "libvirt"})).expect("scheduled")
    }

    #[test]
    fn a_cached_copy_older_than_a_decision_is_stale_until_the_cache_shows_it() {
        let assumed = Assumed::default();
        assert!(!assumed.stale(&vm(None)), "nothing decided yet");
        assumed.assume(&vm(None), on("kvm-a"));
        assert!(assumed.stale(&vm(None)), "the cache has not shown the decision");
        assert!(assumed.stale(&vm(Some("kvm-b"))), "nor another one");
        assert!(!assumed.stale(&vm(Some("kvm-a"))), "the cache shows it");
        assert!(!assumed.stale(&vm(None)), "and it is forgotten once seen");
    }

    #[test]
    fn placements_count_the_decisions_the_cache_does_not_show_yet() {
        let (store, mut writer) = kube::runtime::reflector::store::<VirtualMachine>();
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(vm(None)));
        let assumed = Assumed::default();
        let placed = |a: &Assumed| a.placed_vms(&store).iter().map(|v| v.status.as_ref().and_then(|s| s.scheduled.as_ref()).map(|s| s.provider.clone())).collect::<Vec<_>>();
        assert_eq!(placed(&assumed), vec![None]);
        assumed.assume(&vm(None), on("kvm-a"));
        assert_eq!(placed(&assumed), vec![Some("kvm-a".to_string())]);
        assumed.forget(&vm(None));
        assert_eq!(placed(&assumed), vec![None], "a decision whose write failed counts no more");
    }
}
