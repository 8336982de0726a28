//! Label selectors and anti-affinity, evaluated purely over what the host passed.

use crate::bindings::placement::banlieue::placement::types::{AntiAffinity, Request, SelectorOp, SelectorRequirement};
use crate::candidates::{Candidate, Candidates, PlacedGroup};
use crate::lookup;

/// Topology key meaning "the same Provider".
pub const PROVIDER_KEY: &str = "banlieue.io/provider";
/// Topology key meaning "the same failure domain of the same Provider".
pub const FAILURE_DOMAIN_KEY: &str = "banlieue.io/failure-domain";
/// Label the pool controller puts on its VMs.
pub const POOL_LABEL: &str = "banlieue.io/pool";

/// Whether the labels `label` looks up satisfy every requirement (an empty selector
/// matches everything).
pub fn matches<'l>(selector: &[SelectorRequirement], label: impl Fn(&str) -> Option<&'l str>) -> bool {
    selector.iter().all(|r| {
        let value = label(&r.key);
        match r.op {
            SelectorOp::In => value.is_some_and(|v| r.values.iter().any(|x| x == v)),
            SelectorOp::NotIn => value.is_none_or(|v| r.values.iter().all(|x| x != v)),
            SelectorOp::Exists => value.is_some(),
            SelectorOp::DoesNotExist => value.is_none(),
        }
    })
}

/// A candidate's value for a topology key, compared without allocating; `None`
/// when the domain lacks the label (such a candidate is outside the rule's
/// topology, as in Kubernetes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Topology<'a> {
    Provider(&'a str),
    FailureDomain(&'a str, &'a str),
    Label(&'a str),
}

fn topology<'a>(candidate: &Candidate<'a>, key: &str) -> Option<Topology<'a>> {
    match key {
        PROVIDER_KEY => Some(Topology::Provider(candidate.provider())),
        FAILURE_DOMAIN_KEY => Some(Topology::FailureDomain(candidate.provider(), candidate.failure_domain())),
        _ => candidate.facts().label(key).map(Topology::Label),
    }
}

/// Whether placed VMs of `group` are ones `rule` is about: in the request's namespace
/// (anti-affinity only looks there) and matching its selector.
fn rule_covers(req: &Request, rule: &AntiAffinity, group: &PlacedGroup<'_>) -> bool {
    group.namespace() == req.vm_namespace && matches(&rule.selector, |k| group.label(k))
}

/// VMs matching `rule` that share `candidate`'s topology value, counted over all candidates.
///
/// This scans `all`; to evaluate every candidate, build an [`AntiAffinityIndex`] once.
pub fn conflicts(req: &Request, rule: &AntiAffinity, candidate: &Candidate<'_>, all: Candidates<'_>) -> u32 {
    let Some(here) = topology(candidate, &rule.topology_key) else { return 0 };
    let matching = |c: &Candidate<'_>| c.placed().filter(|(g, _)| rule_covers(req, rule, g)).map(|(_, n)| n).sum::<u32>();
    all.iter().filter(|c| topology(c, &rule.topology_key) == Some(here)).map(|c| matching(&c)).sum()
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
pub fn anti_affinity(req: &Request, candidate: &Candidate<'_>, all: Candidates<'_>) -> AntiAffinityVerdict {
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
/// rule, which groups of placed VMs it covers, and how many covered VMs each
/// topology value holds. Then each candidate's verdict is a lookup per rule,
/// instead of a scan of every candidate.
pub struct AntiAffinityIndex<'a> {
    req: &'a Request,
    /// Per rule: (topology value, matching VMs), sorted by value.
    counts: Vec<Vec<(Topology<'a>, u32)>>,
}

impl<'a> AntiAffinityIndex<'a> {
    pub fn new(req: &'a Request, all: Candidates<'a>) -> AntiAffinityIndex<'a> {
        let counts = req
            .anti_affinity
            .iter()
            .map(|rule| {
                let covered: Vec<bool> = all.groups().map(|g| rule_covers(req, rule, &g)).collect();
                let mut v: Vec<(Topology<'a>, u32)> = all
                    .iter()
                    .filter_map(|c| {
                        let n = c.placed().filter(|(g, _)| covered[g.index() as usize]).map(|(_, n)| n).sum::<u32>();
                        if n == 0 {
                            return None;
                        }
                        Some((topology(&c, &rule.topology_key)?, n))
                    })
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
    pub fn verdict(&self, candidate: &Candidate<'_>) -> AntiAffinityVerdict {
        verdict(self.req, |i, rule| self.conflicts(i, rule, candidate))
    }

    /// The penalty of `candidate`, or `None` when it breaks a required rule: the
    /// verdict without writing out why.
    pub fn penalty(&self, candidate: &Candidate<'_>) -> Option<u64> {
        if self.counts.is_empty() {
            return Some(0);
        }
        match outcome(self.req, |i, rule| self.conflicts(i, rule, candidate)) {
            (None, penalty) => Some(penalty),
            (Some(_), _) => None,
        }
    }

    fn conflicts(&self, i: usize, rule: &AntiAffinity, candidate: &Candidate<'_>) -> u32 {
        let Some(here) = topology(candidate, &rule.topology_key) else { return 0 };
        let counts = &self.counts[i];
        counts.binary_search_by(|(t, _)| t.cmp(&here)).map(|at| counts[at].1).unwrap_or(0)
    }
}

/// Whether placed VMs of `group` are in the same group as the VM being placed: the
/// same pool when it has one, otherwise carrying all of its labels (a VM without
/// labels groups with its whole namespace).
///
/// To test many groups, build the [`Group`] once.
pub fn same_group(req: &Request, group: &PlacedGroup<'_>) -> bool {
    Group::of(req).contains(group)
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

    /// Whether placed VMs of `group` are in this group.
    pub fn contains(&self, group: &PlacedGroup<'_>) -> bool {
        if group.namespace() != self.namespace {
            return false;
        }
        match self.pool {
            Some(pool) => group.label(POOL_LABEL) == Some(pool),
            None => self.labels.iter().all(|(k, v)| group.label(k) == Some(v.as_str())),
        }
    }

    /// For each of the request's groups of placed VMs (by index), whether it is in this group.
    pub fn members(&self, all: Candidates<'_>) -> Vec<bool> {
        all.groups().map(|g| self.contains(&g)).collect()
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
        let domains: Vec<Domain> = (0..60)
            .map(|i| {
                let ns = if i % 4 == 0 { "other" } else { "ns" };
                let app = if i % 7 == 1 { "db" } else { "web" };
                let mut d = candidate(&format!("p{}", i % 4), &format!("fd{}", i % 9))
                    .with_labels(&[("zone", ["a", "b", "c", "d", "e"][i % 5])])
                    .with_vms(ns, &[("app", app)], 1 + (i % 2) as u32);
                if i % 2 == 0 {
                    d.labels.push(("rack".into(), format!("r{}", i % 6)));
                }
                d
            })
            .collect();
        let tables = crate::placement::fixtures::domains(&domains);
        let all = Candidates::new(&tables).unwrap();
        let index = AntiAffinityIndex::new(&req, all);
        let mut seen = (0, 0);
        for c in all.iter() {
            let v = anti_affinity(&req, &c, all);
            seen.0 += v.violated.is_some() as u32;
            seen.1 += (v.penalty > 0) as u32;
            assert_eq!(index.verdict(&c), v, "{c:?}");
            assert_eq!(index.penalty(&c), v.violated.is_none().then_some(v.penalty));
        }
        assert!(seen.0 > 0 && seen.1 > 0 && seen.0 < all.len() as u32, "the rules both filter and weigh: {seen:?}");
    }

    #[test]
    fn the_group_is_the_pool_else_all_labels() {
        let placed = [
            ("ns", &[(POOL_LABEL, "web")][..]),
            ("ns", &[(POOL_LABEL, "db"), ("x", "1")]),
            ("other", &[(POOL_LABEL, "web")]),
            ("ns", &[("y", "2"), ("x", "1"), ("z", "3")]),
            ("ns", &[("x", "1")]),
            ("ns", &[("any", "thing")]),
        ];
        let mut d = candidate("p", "a");
        for (ns, labels) in placed {
            d = d.with_vms(ns, labels, 1);
        }
        let tables = domains(&[d]);
        let all = Candidates::new(&tables).unwrap();
        let members = |req: &Request| all.groups().map(|g| same_group(req, &g)).collect::<Vec<_>>();
        assert_eq!(members(&request("ns", "a", &[(POOL_LABEL, "web"), ("x", "1")])), [true, false, false, false, false, false]);
        assert_eq!(members(&request("ns", "a", &[("x", "1"), ("y", "2")])), [false, false, false, true, false, false]);
        assert_eq!(members(&request("ns", "a", &[])), [true, true, false, true, true, true]);
        assert_eq!(Group::of(&request("ns", "a", &[])).members(all), members(&request("ns", "a", &[])));
    }

    #[test]
    fn selectors_read_labels_through_a_lookup() {
        let labels = crate::placement::fixtures::pairs(&[("app", "db"), ("env", "prod")]);
        let req = |key: &str, op, values: &[&str]| SelectorRequirement { key: key.into(), op, values: values.iter().map(|v| v.to_string()).collect() };
        let matches_labels = |sel: &[SelectorRequirement]| matches(sel, |k| lookup(&labels, k));
        assert!(matches_labels(&[req("app", SelectorOp::In, &["db", "x"]), req("env", SelectorOp::NotIn, &["dev"])]));
        assert!(matches_labels(&[req("tier", SelectorOp::DoesNotExist, &[]), req("app", SelectorOp::Exists, &[])]));
        assert!(!matches_labels(&[req("app", SelectorOp::NotIn, &["db"])]));
        assert!(matches_labels(&[]));
    }
}
