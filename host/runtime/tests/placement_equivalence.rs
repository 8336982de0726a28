//! The 0.2.0 request tables carry what 0.1.0 passed, and the policies decide on
//! them as they did on 0.1.0's candidates. For random requests and failure
//! domains (a fixed seed, printed on failure):
//! - 0.1.0 candidates interned into tables and expanded back are the same (up to
//!   the order of placed VMs), and
//! - spread and binpack on the tables (the SDK, natively) give the decision a
//!   reference copy of their 0.1.0 logic gives on the 0.1.0 candidates: the same
//!   candidate, score and reason, or the same error.

use banlieue_runtime::placement::legacy::{self, v0_1};
use banlieue_runtime::placement as host;
use banlieue_sdk::placement::{self as sdk, Candidates, Policy};
use banlieue_sdk::Error;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod sdk_tables;

const SEED: u64 = 0x0b15_0002;
const CASES: usize = 400;
const PROVIDER_KEY: &str = "banlieue.io/provider";
const FAILURE_DOMAIN_KEY: &str = "banlieue.io/failure-domain";
const POOL: &str = "banlieue.io/pool";

fn pick<'a>(rng: &mut StdRng, from: &[&'a str]) -> &'a str {
    from[rng.random_range(0..from.len())]
}

fn some(rng: &mut StdRng, from: &[&str]) -> Vec<String> {
    from.iter().filter(|_| rng.random_bool(0.5)).map(|s| s.to_string()).collect()
}

fn labels(rng: &mut StdRng, keys: &[(&str, &[&str])]) -> Vec<(String, String)> {
    let mut v = vec![];
    for (k, vs) in keys {
        if rng.random_bool(0.7) {
            v.push((k.to_string(), pick(rng, vs).to_string()));
        }
    }
    v.sort();
    v
}

const VM_LABELS: &[(&str, &[&str])] = &[("app", &["web", "db"]), (POOL, &["web", "db"]), ("tier", &["a"])];

fn request(rng: &mut StdRng) -> host::Request {
    let ops = [host::SelectorOp::In, host::SelectorOp::NotIn, host::SelectorOp::Exists, host::SelectorOp::DoesNotExist];
    let anti_affinity = (0..rng.random_range(0..3))
        .map(|_| host::AntiAffinity {
            topology_key: pick(rng, &["zone", "rack", PROVIDER_KEY, FAILURE_DOMAIN_KEY]).into(),
            selector: (0..rng.random_range(0..3))
                .map(|_| host::SelectorRequirement {
                    key: pick(rng, &["app", POOL, "tier"]).into(),
                    op: ops[rng.random_range(0..4)],
                    values: some(rng, &["web", "db", "a"]),
                })
                .collect(),
            required: rng.random_bool(0.3),
            weight: rng.random_range(0..20),
        })
        .collect();
    let parameters = match rng.random_range(0..3) {
        0 => String::new(),
        1 => "{}".into(),
        _ => r#"{"spreadBy": ["app"]}"#.into(),
    };
    host::Request {
        vm_name: "vm".into(),
        vm_namespace: "ns".into(),
        vm_labels: labels(rng, VM_LABELS),
        class: host::VmClass {
            name: "c".into(),
            cpus: rng.random_range(1..8),
            memory_mib: rng.random_range(1..8) * 1024,
            storage_gib: rng.random_range(1..80),
            storage_classes: some(rng, &["fast", "slow"]),
            network_classes: some(rng, &["lan"]),
            features: some(rng, &["gpu"]),
        },
        parameters,
        anti_affinity,
    }
}

/// Unique (provider, failure domain) pairs, labelled as the host labels them.
fn candidates(rng: &mut StdRng) -> Vec<v0_1::Candidate> {
    let mut all: Vec<v0_1::Candidate> = vec![];
    for _ in 0..rng.random_range(0..14) {
        let (provider, fd) = (format!("ns/p{}", rng.random_range(0..3)), format!("fd{}", rng.random_range(0..5)));
        if all.iter().any(|c| c.provider == provider && c.failure_domain == fd) {
            continue;
        }
        let mut own = labels(rng, &[("zone", &["z1", "z2"]), ("rack", &["r1", "r2", "r3"])]);
        own.extend([(PROVIDER_KEY.into(), provider[3..].to_string()), (FAILURE_DOMAIN_KEY.into(), fd.clone())]);
        own.sort();
        let vms: Vec<v0_1::PlacedVm> =
            (0..rng.random_range(0..5)).map(|_| v0_1::PlacedVm { namespace: pick(rng, &["ns", "ns", "other"]).into(), labels: labels(rng, VM_LABELS) }).collect();
        all.push(v0_1::Candidate {
            provider,
            provider_class: pick(rng, &["libvirt", "vsphere"]).into(),
            failure_domain: fd,
            labels: own,
            capacity: v0_1::Capacity { cpus: rng.random_range(0..10), memory_mib: rng.random_range(0..10) * 1024, storage_gib: rng.random_range(0..100) },
            storage_classes: some(rng, &["fast", "slow"]),
            network_classes: some(rng, &["lan"]),
            features: some(rng, &["gpu", "tpm"]),
            vm_count: vms.len() as u32 + rng.random_range(0..2),
            vms,
        });
    }
    all
}

/// (provider, failure domain, score, reason) of a decision.
type Outcome = Result<(String, String, i64, String), Error>;

fn sdk_outcome<P: Policy>(req: &sdk::Request, tables: &sdk::wire::Domains) -> Outcome {
    let all = Candidates::new(tables)?;
    let d = P::choose(req, all)?;
    let c = all.get(d.candidate).expect("an index of the request");
    Ok((c.provider().into(), c.failure_domain().into(), d.score, d.reason))
}

#[test]
fn the_tables_carry_0_1_and_decide_the_same() {
    let mut rng = StdRng::seed_from_u64(SEED);
    let mut decided = [0usize; 2];
    for case in 0..CASES {
        let req = request(&mut rng);
        let all = candidates(&mut rng);
        let ctx = format!("seed {SEED:#x}, case {case}");

        let tables = legacy::intern(&all);
        let (req_0_1, mut back) = legacy::expand(&req, &tables);
        let mut expected = all.clone();
        for c in back.iter_mut().chain(&mut expected) {
            c.vms.sort_by(|a, b| (&a.namespace, &a.labels).cmp(&(&b.namespace, &b.labels)));
        }
        assert_eq!(back, expected, "{ctx}: 0.1 -> 0.2 -> 0.1");

        let sdk_req = sdk_tables::request(&req);
        let sdk_tables = sdk_tables::tables(tables.clone());
        let spread = sdk_outcome::<placement_spread::Spread>(&sdk_req, &sdk_tables);
        assert_eq!(spread, reference::spread(&req_0_1, &all), "{ctx}: spread");
        let binpack = sdk_outcome::<placement_binpack::Binpack>(&sdk_req, &sdk_tables);
        assert_eq!(binpack, reference::binpack(&req_0_1, &all), "{ctx}: binpack");
        decided[0] += spread.is_ok() as usize;
        decided[1] += binpack.is_err() as usize;
    }
    // The generator reaches both outcomes.
    assert!(decided[0] > CASES / 10 && decided[1] > CASES / 10, "{decided:?}");
}

/// The decision logic of spread and binpack as it was on 0.1.0's candidates
/// (scanning, unindexed), kept here as the reference.
mod reference {
    use super::*;
    use v0_1::{AntiAffinity, Candidate, PlacedVm, Request, SelectorOp, SelectorRequirement};

    fn lookup<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
        pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    fn matches(selector: &[SelectorRequirement], labels: &[(String, String)]) -> bool {
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

    fn topology(c: &Candidate, key: &str) -> Option<String> {
        match key {
            PROVIDER_KEY => Some(c.provider.clone()),
            FAILURE_DOMAIN_KEY => Some(format!("{}/{}", c.provider, c.failure_domain)),
            _ => lookup(&c.labels, key).map(str::to_string),
        }
    }

    fn conflicts(req: &Request, rule: &AntiAffinity, c: &Candidate, all: &[Candidate]) -> u32 {
        let Some(here) = topology(c, &rule.topology_key) else { return 0 };
        let matching = |c: &Candidate| c.vms.iter().filter(|vm| vm.namespace == req.vm_namespace && matches(&rule.selector, &vm.labels)).count() as u32;
        all.iter().filter(|o| topology(o, &rule.topology_key).as_ref() == Some(&here)).map(matching).sum()
    }

    /// (the first required rule broken, penalty of the preferred ones)
    fn verdict(req: &Request, c: &Candidate, all: &[Candidate]) -> (Option<String>, u64) {
        let (mut violated, mut penalty) = (None, 0u64);
        for rule in &req.anti_affinity {
            let n = conflicts(req, rule, c, all);
            if n == 0 {
                continue;
            }
            if rule.required {
                violated.get_or_insert(format!("{n} VM(s) match required anti-affinity on {}", rule.topology_key));
            } else {
                penalty += u64::from(rule.weight) * u64::from(n);
            }
        }
        (violated, penalty)
    }

    fn unfit(req: &Request, c: &Candidate) -> Option<String> {
        let (class, cap) = (&req.class, &c.capacity);
        if cap.cpus < u64::from(class.cpus) {
            return Some(format!("{} free CPUs < {}", cap.cpus, class.cpus));
        }
        if cap.memory_mib < class.memory_mib {
            return Some(format!("{} MiB free memory < {}", cap.memory_mib, class.memory_mib));
        }
        if cap.storage_gib < class.storage_gib {
            return Some(format!("{} GiB free storage < {}", cap.storage_gib, class.storage_gib));
        }
        let missing = |want: &[String], have: &[String], what: &str| want.iter().find(|w| !have.contains(w)).map(|w| format!("no {what} {w:?}"));
        missing(&class.storage_classes, &c.storage_classes, "storage class")
            .or_else(|| missing(&class.network_classes, &c.network_classes, "network class"))
            .or_else(|| missing(&class.features, &c.features, "feature"))
    }

    fn feasible<'a>(req: &Request, all: &'a [Candidate]) -> Result<Vec<(&'a Candidate, u64)>, Error> {
        let kept: Vec<(&Candidate, u64)> = all
            .iter()
            .filter(|c| unfit(req, c).is_none())
            .filter_map(|c| match verdict(req, c, all) {
                (None, penalty) => Some((c, penalty)),
                (Some(_), _) => None,
            })
            .collect();
        if kept.is_empty() {
            let dropped: Vec<String> =
                all.iter().filter_map(|c| Some(format!("{}/{}: {}", c.provider, c.failure_domain, unfit(req, c).or(verdict(req, c, all).0)?))).collect();
            return Err(Error::Unavailable(if dropped.is_empty() {
                "no candidate failure domains".to_string()
            } else {
                format!("no candidate fits: {}", dropped.join("; "))
            }));
        }
        Ok(kept)
    }

    fn in_group(req: &Request, vm: &PlacedVm) -> bool {
        if vm.namespace != req.vm_namespace {
            return false;
        }
        if req.parameters.contains("spreadBy") {
            return lookup(&vm.labels, "app") == lookup(&req.vm_labels, "app");
        }
        match lookup(&req.vm_labels, POOL) {
            Some(pool) => lookup(&vm.labels, POOL) == Some(pool),
            None => req.vm_labels.iter().all(|(k, v)| lookup(&vm.labels, k) == Some(v.as_str())),
        }
    }

    pub fn spread(req: &Request, all: &[Candidate]) -> Outcome {
        let kept = feasible(req, all)?;
        let fit = kept.len();
        let (cost, group, c, penalty) = kept
            .into_iter()
            .map(|(c, penalty)| {
                let group = c.vms.iter().filter(|vm| in_group(req, vm)).count() as u64;
                (group + penalty, group, c, penalty)
            })
            .min_by(|a, b| a.0.cmp(&b.0).then(a.2.vm_count.cmp(&b.2.vm_count)).then_with(|| (&a.2.provider, &a.2.failure_domain).cmp(&(&b.2.provider, &b.2.failure_domain))))
            .unwrap();
        let reason = format!(
            "spread: {group} VM(s) of this group in {}/{} (anti-affinity penalty {penalty}); {fit} of {} candidates fit",
            c.provider,
            c.failure_domain,
            all.len()
        );
        Ok((c.provider.clone(), c.failure_domain.clone(), -(cost as i64), reason))
    }

    pub fn binpack(req: &Request, all: &[Candidate]) -> Outcome {
        let left = |c: &Candidate| {
            let (cap, class) = (&c.capacity, &req.class);
            (cap.memory_mib.saturating_sub(class.memory_mib), cap.cpus.saturating_sub(u64::from(class.cpus)), cap.storage_gib.saturating_sub(class.storage_gib))
        };
        let kept = feasible(req, all)?;
        let fit = kept.len();
        let (c, penalty) = kept
            .into_iter()
            .min_by(|a, b| a.1.cmp(&b.1).then(left(a.0).cmp(&left(b.0))).then_with(|| (&a.0.provider, &a.0.failure_domain).cmp(&(&b.0.provider, &b.0.failure_domain))))
            .unwrap();
        let (mem, cpus, storage) = left(c);
        let reason = format!(
            "binpack: {}/{} keeps {mem} MiB, {cpus} CPUs, {storage} GiB free (anti-affinity penalty {penalty}); {fit} of {} candidates fit",
            c.provider,
            c.failure_domain,
            all.len()
        );
        let score = -(mem.min(1 << 40) as i64) - (penalty.min(1 << 20) as i64) * (1 << 40);
        Ok((c.provider.clone(), c.failure_domain.clone(), score, reason))
    }
}
