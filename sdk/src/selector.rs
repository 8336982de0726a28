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

/// [`topology_value`] without allocating: what candidates are compared by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Topology<'a> {
    Provider(&'a str),
    FailureDomain(&'a str, &'a str),
    Label(&'a str),
}

fn topology<'a>(candidate: &'a Candidate, key: &str) -> Option<Topology<'a>> {
    match key {
        PROVIDER_KEY => Some(Topology::Provider(&candidate.provider)),
        FAILURE_DOMAIN_KEY => Some(Topology::FailureDomain(&candidate.provider, &candidate.failure_domain)),
        _ => lookup(&candidate.labels, key).map(Topology::Label),
    }
}

/// VMs of `candidate` that `rule` is about: in the request's namespace (anti-affinity
/// only looks there) and matching its selector.
fn matching_vms(req: &Request, rule: &AntiAffinity, candidate: &Candidate) -> u32 {
    candidate.vms.iter().filter(|vm| vm.namespace == req.vm_namespace && matches(&rule.selector, &vm.labels)).count() as u32
}

/// VMs matching `rule` that share `candidate`'s topology value, counted over all candidates
/// (anti-affinity only looks at VMs in the request's namespace).
///
/// This scans `all`; to evaluate every candidate, build an [`AntiAffinityIndex`] once.
pub fn conflicts(req: &Request, rule: &AntiAffinity, candidate: &Candidate, all: &[Candidate]) -> u32 {
    let Some(here) = topology(candidate, &rule.topology_key) else { return 0 };
    all.iter().filter(|c| topology(c, &rule.topology_key) == Some(here)).map(|c| matching_vms(req, rule, c)).sum()
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
///
/// This scans `all` for each rule; to evaluate every candidate, build an
/// [`AntiAffinityIndex`] once.
pub fn anti_affinity(req: &Request, candidate: &Candidate, all: &[Candidate]) -> AntiAffinityVerdict {
    verdict(req, |_, rule| conflicts(req, rule, candidate, all))
}

fn verdict(req: &Request, conflicts: impl FnMut(usize, &AntiAffinity) -> u32) -> AntiAffinityVerdict {
    let (violated, penalty) = outcome(req, conflicts);
    AntiAffinityVerdict {
        violated: violated.map(|(n, key)| format!("{n} VM(s) match required anti-affinity on {key}")),
        penalty,
    }
}

/// The first required rule broken (matching VMs, topology key), and the penalty.
fn outcome(req: &Request, mut conflicts: impl FnMut(usize, &AntiAffinity) -> u32) -> (Option<(u32, &str)>, u64) {
    let (mut violated, mut penalty) = (None, 0u64);
    for (i, rule) in req.anti_affinity.iter().enumerate() {
        let n = conflicts(i, rule);
        if n == 0 {
            continue;
        }
        if rule.required {
            violated.get_or_insert((n, rule.topology_key.as_str()));
        } else {
            penalty += u64::from(rule.weight) * u64::from(n);
        }
    }
    (violated, penalty)
}

/// The request's anti-affinity rules, evaluated over all candidates once: for each
/// rule, how many matching VMs each topology value holds. Then each candidate's
/// verdict is a lookup per rule, instead of a scan of every candidate.
pub struct AntiAffinityIndex<'a> {
    req: &'a Request,
    /// Per rule: (topology value, matching VMs), sorted by value.
    counts: Vec<Vec<(Topology<'a>, u32)>>,
}

impl<'a> AntiAffinityIndex<'a> {
    pub fn new(req: &'a Request, all: &'a [Candidate]) -> AntiAffinityIndex<'a> {
        let counts = req
            .anti_affinity
            .iter()
            .map(|rule| {
                let mut v: Vec<(Topology<'a>, u32)> = all
                    .iter()
                    .filter_map(|c| Some((topology(c, &rule.topology_key)?, matching_vms(req, rule, c))))
                    .filter(|(_, n)| *n > 0)
                    .collect();
                v.sort_unstable_by(|a, b| a.0.cmp(&b.0));
                v.dedup_by(|later, first| {
                    let same = later.0 == first.0;
                    if same {
                        first.1 += later.1;
                    }
                    same
                });
                v
            })
            .collect();
        AntiAffinityIndex { req, counts }
    }

    /// The same as [`anti_affinity`] for `candidate` over the candidates the index was built from.
    pub fn verdict(&self, candidate: &Candidate) -> AntiAffinityVerdict {
        verdict(self.req, |i, rule| self.conflicts(i, rule, candidate))
    }

    /// The penalty of `candidate`, or `None` when it breaks a required rule: the
    /// verdict without writing out why.
    pub fn penalty(&self, candidate: &Candidate) -> Option<u64> {
        if self.counts.is_empty() {
            return Some(0);
        }
        match outcome(self.req, |i, rule| self.conflicts(i, rule, candidate)) {
            (None, penalty) => Some(penalty),
            (Some(_), _) => None,
        }
    }

    fn conflicts(&self, i: usize, rule: &AntiAffinity, candidate: &Candidate) -> u32 {
        let Some(here) = topology(candidate, &rule.topology_key) else { return 0 };
        let counts = &self.counts[i];
        counts.binary_search_by(|(t, _)| t.cmp(&here)).map(|at| counts[at].1).unwrap_or(0)
    }
}

/// Whether `vm` is in the same group as the VM being placed: the same pool when it has
/// one, otherwise carrying all of its labels (a VM without labels groups with its whole
/// namespace).
///
/// To test many VMs, build the [`Group`] once.
pub fn same_group(req: &Request, vm: &PlacedVm) -> bool {
    Group::of(req).contains(vm)
}

/// The group of the VM being placed (see [`same_group`]), looked up once.
#[derive(Clone, Copy, Debug)]
pub struct Group<'a> {
    namespace: &'a str,
    /// The VM's pool, if it has one.
    pool: Option<&'a str>,
    labels: &'a [(String, String)],
}

impl<'a> Group<'a> {
    pub fn of(req: &'a Request) -> Group<'a> {
        Group { namespace: &req.vm_namespace, pool: lookup(&req.vm_labels, POOL_LABEL), labels: &req.vm_labels }
    }

    /// Whether `vm` is in this group.
    pub fn contains(&self, vm: &PlacedVm) -> bool {
        if vm.namespace != self.namespace {
            return false;
        }
        match self.pool {
            Some(pool) => lookup(&vm.labels, POOL_LABEL) == Some(pool),
            None => self.labels.iter().all(|(k, v)| lookup(&vm.labels, k) == Some(v.as_str())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::fixtures::*;

    #[test]
    fn the_index_gives_the_same_verdicts_as_scanning() {
        let mut req = request("ns", "db-1", &[("app", "db")]);
        for (key, required, weight) in [("zone", false, 1), (PROVIDER_KEY, false, 3), (FAILURE_DOMAIN_KEY, false, 7), ("rack", true, 2)] {
            req.anti_affinity.push(AntiAffinity {
                topology_key: key.into(),
                selector: vec![SelectorRequirement { key: "app".into(), op: SelectorOp::In, values: vec!["db".into()] }],
                required,
                weight,
            });
        }
        let all: Vec<Candidate> = (0..60)
            .map(|i| {
                let ns = if i % 4 == 0 { "other" } else { "ns" };
                let app = if i % 7 == 1 { "db" } else { "web" };
                let mut c = with_vms(candidate(&format!("p{}", i % 4), &format!("fd{}", i % 9)), ns, &[("app", app)], 1 + (i % 2) as u32);
                c.labels = pairs(&[("zone", ["a", "b", "c", "d", "e"][i % 5])]);
                if i % 2 == 0 {
                    c.labels.push(("rack".into(), format!("r{}", i % 6)));
                }
                c
            })
            .collect();
        let index = AntiAffinityIndex::new(&req, &all);
        let mut seen = (0, 0);
        for c in &all {
            let v = anti_affinity(&req, c, &all);
            seen.0 += v.violated.is_some() as u32;
            seen.1 += (v.penalty > 0) as u32;
            assert_eq!(index.verdict(c), v, "{}/{}", c.provider, c.failure_domain);
            assert_eq!(index.penalty(c), v.violated.is_none().then_some(v.penalty));
        }
        assert!(seen.0 > 0 && seen.1 > 0 && seen.0 < all.len() as u32, "the rules both filter and weigh: {seen:?}");
    }

    #[test]
    fn the_group_is_the_pool_else_all_labels() {
        let vm = |ns: &str, labels: &[(&str, &str)]| PlacedVm { namespace: ns.into(), labels: pairs(labels) };
        let pooled = request("ns", "a", &[(POOL_LABEL, "web"), ("x", "1")]);
        assert!(same_group(&pooled, &vm("ns", &[(POOL_LABEL, "web")])));
        assert!(!same_group(&pooled, &vm("ns", &[(POOL_LABEL, "db"), ("x", "1")])));
        assert!(!same_group(&pooled, &vm("other", &[(POOL_LABEL, "web")])));
        let labelled = request("ns", "a", &[("x", "1"), ("y", "2")]);
        assert!(same_group(&labelled, &vm("ns", &[("y", "2"), ("x", "1"), ("z", "3")])));
        assert!(!same_group(&labelled, &vm("ns", &[("x", "1")])));
        assert!(same_group(&request("ns", "a", &[]), &vm("ns", &[("any", "thing")])));
    }
}
