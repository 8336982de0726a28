//! Label selectors and anti-affinity, evaluated purely over what the host passed.

use crate::bindings::placement::banlieue::placement::types::{
    AntiAffinity, Candidate, PlacedVm, Request, SelectorOp, SelectorRequirement,
};
use crate::lookup;

/// Topology key meaning "the same Provider".
pub const PROVIDER_KEY: &str = "banlieue.io/provider";
/// Topology key meaning "the same failure domain of the same Provider".
pub const FAILURE_DOMAIN_KEY: &str = "banlieue.io/failure-domain";
/// Label the pool controller puts on its VMs.
pub const POOL_LABEL: &str = "banlieue.io/pool";

/// Whether `labels` satisfy every requirement (an empty selector matches everything).
pub fn matches(selector: &[SelectorRequirement], labels: &[(String, String)]) -> bool {
    selector.iter().all(|r| {
        let value = lookup(labels, &r.key);
        match r.op {
            SelectorOp::In => value.is_some_and(|v| r.values.iter().any(|x| x == v)),
            SelectorOp::NotIn => value.is_none_or(|v| r.values.iter().all(|x| x != v)),
            SelectorOp::Exists => value.is_some(),
            SelectorOp::DoesNotExist => value.is_none(),
        }
    })
}

/// The candidate's value for a topology key; `None` when the domain lacks the label
/// (such a candidate is outside the rule's topology, as in Kubernetes).
pub fn topology_value(candidate: &Candidate, key: &str) -> Option<String> {
    match key {
        PROVIDER_KEY => Some(candidate.provider.clone()),
        FAILURE_DOMAIN_KEY => Some(format!("{}/{}", candidate.provider, candidate.failure_domain)),
        _ => lookup(&candidate.labels, key).map(str::to_string),
    }
}

/// VMs matching `rule` that share `candidate`'s topology value, counted over all candidates
/// (anti-affinity only looks at VMs in the request's namespace).
pub fn conflicts(req: &Request, rule: &AntiAffinity, candidate: &Candidate, all: &[Candidate]) -> u32 {
    let Some(here) = topology_value(candidate, &rule.topology_key) else { return 0 };
    all.iter()
        .filter(|c| topology_value(c, &rule.topology_key).as_deref() == Some(here.as_str()))
        .flat_map(|c| c.vms.iter())
        .filter(|vm| vm.namespace == req.vm_namespace && matches(&rule.selector, &vm.labels))
        .count() as u32
}

/// What the anti-affinity rules say about one candidate.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AntiAffinityVerdict {
    /// The first required rule this candidate breaks, if any.
    pub violated: Option<String>,
    /// Sum of `weight × matching VMs` over preferred rules.
    pub penalty: u64,
}

/// Evaluate every anti-affinity rule of `req` for `candidate`.
pub fn anti_affinity(req: &Request, candidate: &Candidate, all: &[Candidate]) -> AntiAffinityVerdict {
    let mut verdict = AntiAffinityVerdict::default();
    for rule in &req.anti_affinity {
        let n = conflicts(req, rule, candidate, all);
        if n == 0 {
            continue;
        }
        if rule.required {
            verdict.violated.get_or_insert_with(|| format!("{n} VM(s) match required anti-affinity on {}", rule.topology_key));
        } else {
            verdict.penalty += u64::from(rule.weight) * u64::from(n);
        }
    }
    verdict
}

/// Whether `vm` is in the same group as the VM being placed: the same pool when it has
/// one, otherwise carrying all of its labels (a VM without labels groups with its whole
/// namespace).
pub fn same_group(req: &Request, vm: &PlacedVm) -> bool {
    if vm.namespace != req.vm_namespace {
        return false;
    }
    match lookup(&req.vm_labels, POOL_LABEL) {
        Some(pool) => lookup(&vm.labels, POOL_LABEL) == Some(pool),
        None => req.vm_labels.iter().all(|(k, v)| lookup(&vm.labels, k) == Some(v.as_str())),
    }
}
