//! A custom placement policy: prefer failure domains labelled `tier=gold`,
//! otherwise the one with the most free memory.

use banlieue_sdk::info;
use banlieue_sdk::placement::{self, Candidates, Decision, Policy, Request, Result};

pub struct PreferGold;

impl Policy for PreferGold {
    fn choose(req: &Request, candidates: Candidates<'_>) -> Result<Decision> {
        let best = placement::feasible(req, candidates)?
            .into_iter()
            .map(|f| f.candidate)
            .max_by_key(|c| (c.label("tier") == Some("gold"), c.capacity().memory_mib))
            .expect("feasible() is never empty");
        let gold = best.label("tier") == Some("gold");
        info!("{}/{} -> {}", req.vm_namespace, req.vm_name, placement::name(&best));
        Ok(placement::decide(&best, gold as i64, if gold { "gold tier" } else { "no gold tier fits; most free memory" }))
    }
}

banlieue_sdk::export_placement!(PreferGold);

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_sdk::placement::fixtures::*;

    #[test]
    fn prefers_gold() {
        let mut gold = candidate("p", "gold").with_labels(&[("tier", "gold")]);
        gold.capacity.memory_mib = 4096;
        let d = choose::<PreferGold>(&request("ns", "vm", &[]), &[candidate("p", "big"), gold]).unwrap();
        assert_eq!((d.candidate, d.score), (1, 1));
    }
}
