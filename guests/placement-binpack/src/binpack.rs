//! Binpack: put the VM where the least capacity is left after placing it.
//!
//! Same filters as spread (capacity, classes, features, required
//! anti-affinity). The rest are ordered by preferred anti-affinity penalty,
//! then free memory, CPUs and storage after placement (memory first: it is
//! what runs out first on most hypervisors), then (provider, failure domain).

use banlieue_sdk::placement::{self, Candidate, Candidates, Decision, Policy, Request, Result, VmClass};

/// The binpack policy.
pub struct Binpack;

/// Free (memory MiB, CPUs, storage GiB) left in `c` once the VM is placed.
fn left_after(class: &VmClass, c: &Candidate<'_>) -> (u64, u64, u64) {
    let cap = c.capacity();
    (
        cap.memory_mib.saturating_sub(class.memory_mib),
        cap.cpus.saturating_sub(u64::from(class.cpus)),
        cap.storage_gib.saturating_sub(class.storage_gib),
    )
}

impl Policy for Binpack {
    fn choose(req: &Request, candidates: Candidates<'_>) -> Result<Decision> {
        let feasible = placement::feasible(req, candidates)?;
        let total = candidates.len();
        let fit = feasible.len();
        let best = feasible
            .into_iter()
            .min_by(|a, b| {
                a.penalty
                    .cmp(&b.penalty)
                    .then(left_after(&req.class, &a.candidate).cmp(&left_after(&req.class, &b.candidate)))
                    .then_with(|| placement::tie_break(&a.candidate).cmp(&placement::tie_break(&b.candidate)))
            })
            .expect("feasible() never returns an empty list");
        let (mem, cpus, storage) = left_after(&req.class, &best.candidate);
        let reason = format!(
            "binpack: {} keeps {mem} MiB, {cpus} CPUs, {storage} GiB free (anti-affinity penalty {}); {fit} of {total} candidates fit",
            placement::name(&best.candidate),
            best.penalty
        );
        // Higher is better: less memory left, and any penalty outweighs memory.
        let score = -(mem.min(1 << 40) as i64) - (best.penalty.min(1 << 20) as i64) * (1 << 40);
        Ok(placement::decide(&best.candidate, score, reason))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_sdk::placement::fixtures::*;
    use banlieue_sdk::placement::{AntiAffinity, SelectorOp, SelectorRequirement};

    fn with_memory(mut d: Domain, mib: u64) -> Domain {
        d.capacity.memory_mib = mib;
        d
    }

    /// The chosen candidate's `provider/failure-domain`, and the score.
    fn run(req: &Request, all: &[Domain]) -> (String, i64) {
        let d = choose::<Binpack>(req, all).unwrap();
        let c = &all[d.candidate as usize];
        (format!("{}/{}", c.provider, c.failure_domain), d.score)
    }

    #[test]
    fn fills_the_fullest_domain_that_fits() {
        let req = request("ns", "vm", &[]); // needs 2048 MiB
        let all = [
            with_memory(candidate("p", "roomy"), 100_000),
            with_memory(candidate("p", "full"), 1024),
            with_memory(candidate("p", "snug"), 4096),
        ];
        assert_eq!(run(&req, &all), ("p/snug".into(), -2048));
    }

    #[test]
    fn equal_fullness_breaks_on_cpus_then_names() {
        let req = request("ns", "vm", &[]);
        let mut fewer_cpus = candidate("z", "a");
        fewer_cpus.capacity.cpus = 4;
        assert_eq!(run(&req, &[candidate("b", "x"), candidate("a", "y"), fewer_cpus]).0, "z/a");
        assert_eq!(run(&req, &[candidate("b", "x"), candidate("a", "y")]).0, "a/y");
    }

    #[test]
    fn preferred_anti_affinity_beats_fullness() {
        let mut req = request("ns", "vm", &[("app", "db")]);
        req.anti_affinity.push(AntiAffinity {
            topology_key: "banlieue.io/failure-domain".into(),
            selector: vec![SelectorRequirement { key: "app".into(), op: SelectorOp::In, values: vec!["db".into()] }],
            required: false,
            weight: 1,
        });
        let all = [with_memory(candidate("p", "snug"), 4096).with_vms("ns", &[("app", "db")], 1), with_memory(candidate("p", "roomy"), 100_000)];
        assert_eq!(run(&req, &all).0, "p/roomy");
    }
}
