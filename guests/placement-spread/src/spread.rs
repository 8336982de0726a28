//! Spread: put the VM where the fewest VMs of its group already run.
//!
//! Candidates lacking capacity, classes or features, or breaking a required
//! anti-affinity rule, are dropped. The rest are ordered by
//! `group VMs + preferred anti-affinity penalty`, then by total VMs in the
//! domain, then by (provider, failure domain) so equal candidates always
//! resolve the same way.

use banlieue_sdk::lookup;
use banlieue_sdk::placement::{self, Candidates, Decision, PlacedGroup, Policy, Request, Result};
use serde::Deserialize;

/// PlacementPolicy parameters.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Params {
    /// Label keys that define the VM's group (default: its pool, else all its labels).
    #[serde(default)]
    spread_by: Option<Vec<String>>,
}

/// The spread policy.
pub struct Spread;

impl Policy for Spread {
    fn choose(req: &Request, candidates: Candidates<'_>) -> Result<Decision> {
        let params: Params = placement::parameters(req)?;
        let group = InGroup::new(req, &params);
        // Whether each group of placed VMs is the VM's, decided once per group.
        let member: Vec<bool> = candidates.groups().map(|g| group.contains(&g)).collect();
        let feasible = placement::feasible(req, candidates)?;
        let total = candidates.len();
        let fit = feasible.len();
        let best = feasible
            .into_iter()
            .map(|f| {
                let group: u64 = f.candidate.placed().filter(|(g, _)| member[g.index() as usize]).map(|(_, n)| u64::from(n)).sum();
                (group + f.penalty, group, f)
            })
            .min_by(|(a, _, fa), (b, _, fb)| {
                a.cmp(b)
                    .then(fa.candidate.vm_count().cmp(&fb.candidate.vm_count()))
                    .then_with(|| placement::tie_break(&fa.candidate).cmp(&placement::tie_break(&fb.candidate)))
            })
            .expect("feasible() never returns an empty list");
        let (cost, group, f) = best;
        let reason = format!(
            "spread: {group} VM(s) of this group in {} (anti-affinity penalty {}); {fit} of {total} candidates fit",
            placement::name(&f.candidate),
            f.penalty
        );
        Ok(placement::decide(&f.candidate, -(cost.min(i64::MAX as u64) as i64), reason))
    }
}

/// The VM's group, worked out once per call rather than for every placed VM.
enum InGroup<'a> {
    /// `spreadBy`: same namespace and the same value (or absence) of each key.
    Keys { namespace: &'a str, values: Vec<(&'a str, Option<&'a str>)> },
    /// The SDK's default: same pool, else all of the VM's labels.
    Default(placement::Group<'a>),
}

impl<'a> InGroup<'a> {
    fn new(req: &'a Request, params: &'a Params) -> InGroup<'a> {
        match &params.spread_by {
            Some(keys) => InGroup::Keys {
                namespace: &req.vm_namespace,
                values: keys.iter().map(|k| (k.as_str(), lookup(&req.vm_labels, k))).collect(),
            },
            None => InGroup::Default(placement::Group::of(req)),
        }
    }

    fn contains(&self, vms: &PlacedGroup<'_>) -> bool {
        match self {
            InGroup::Keys { namespace, values } => {
                vms.namespace() == *namespace && values.iter().all(|(k, v)| vms.label(k) == *v)
            }
            InGroup::Default(g) => g.contains(vms),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_sdk::Error;
    use banlieue_sdk::placement::fixtures::*;
    use banlieue_sdk::placement::{AntiAffinity, SelectorOp, SelectorRequirement};

    /// The chosen candidate's `provider/failure-domain`, and the score.
    fn run(req: &Request, all: &[Domain]) -> Result<(String, i64)> {
        let d = choose::<Spread>(req, all)?;
        let c = &all[d.candidate as usize];
        Ok((format!("{}/{}", c.provider, c.failure_domain), d.score))
    }

    const POOL: (&str, &str) = ("banlieue.io/pool", "web");

    #[test]
    fn picks_the_domain_with_fewest_vms_of_the_pool() {
        let req = request("ns", "web-3", &[POOL]);
        let all = [
            candidate("p", "a").with_vms("ns", &[POOL], 2),
            // Busy with other VMs, but none of this pool.
            candidate("p", "b").with_vms("ns", &[("banlieue.io/pool", "db")], 5),
            candidate("p", "c").with_vms("ns", &[POOL], 1),
        ];
        assert_eq!(run(&req, &all).unwrap(), ("p/b".into(), 0));
    }

    #[test]
    fn ties_break_on_total_vms_then_names() {
        let req = request("ns", "vm", &[POOL]);
        let all = [candidate("q", "a"), candidate("p", "z").with_vms("ns", &[], 1), candidate("p", "b")];
        let d = run(&req, &all).unwrap();
        assert_eq!(d.0, "p/b");
        // Input order does not matter.
        let mut rev = all.clone();
        rev.reverse();
        assert_eq!(run(&req, &rev).unwrap(), d);
    }

    #[test]
    fn vms_in_other_namespaces_do_not_count() {
        let req = request("ns", "vm", &[POOL]);
        let all = [candidate("p", "a").with_vms("other", &[POOL], 3), candidate("p", "b").with_vms("ns", &[POOL], 1)];
        assert_eq!(run(&req, &all).unwrap().0, "p/a");
    }

    #[test]
    fn preferred_anti_affinity_weighs_by_weight() {
        let mut req = request("ns", "vm", &[POOL]);
        req.anti_affinity.push(AntiAffinity {
            topology_key: "banlieue.io/failure-domain".into(),
            selector: vec![SelectorRequirement { key: "role".into(), op: SelectorOp::Exists, values: vec![] }],
            required: false,
            weight: 10,
        });
        let all = [
            // One VM of the pool, no conflicting VM: cost 1.
            candidate("p", "a").with_vms("ns", &[POOL], 1),
            // No VM of the pool but one matching the rule: cost 10.
            candidate("p", "b").with_vms("ns", &[("role", "x")], 1),
        ];
        assert_eq!(run(&req, &all).unwrap(), ("p/a".into(), -1));
    }

    #[test]
    fn required_anti_affinity_and_capacity_filter() {
        let mut req = request("ns", "vm", &[POOL]);
        req.anti_affinity.push(AntiAffinity {
            topology_key: "banlieue.io/provider".into(),
            selector: vec![SelectorRequirement { key: "banlieue.io/pool".into(), op: SelectorOp::In, values: vec!["web".into()] }],
            required: true,
            weight: 1,
        });
        let mut tiny = candidate("q", "a");
        tiny.capacity.cpus = 1;
        let all = [candidate("p", "a"), candidate("p", "b").with_vms("ns", &[POOL], 1), tiny];
        let err = run(&req, &all).unwrap_err();
        assert!(matches!(err, Error::Unavailable(_)), "{err:?}");
        assert!(err.message().contains("q/a: 1 free CPUs"), "{err:?}");
    }

    #[test]
    fn spread_by_parameter_overrides_the_group() {
        let mut req = request("ns", "vm", &[("app", "api"), ("team", "x")]);
        req.parameters = r#"{"spreadBy": ["app"]}"#.into();
        let all = [
            candidate("p", "a").with_vms("ns", &[("app", "api"), ("team", "y")], 1),
            candidate("p", "b").with_vms("ns", &[("app", "web"), ("team", "x")], 2),
        ];
        assert_eq!(run(&req, &all).unwrap().0, "p/b");
        req.parameters = r#"{"bogus": 1}"#.into();
        assert!(matches!(run(&req, &all), Err(Error::InvalidSpec(_))));
    }
}
