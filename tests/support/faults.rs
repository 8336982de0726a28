//! What the fault suites share: how many iterations to run (a short count in CI, the full
//! count with `make faults`) and the tally each suite prints for BENCHMARKS.md
//! ("Reliability"): iterations, faults injected, backend VMs leaked and duplicated, and the
//! time to converge after each fault cleared.

use std::collections::BTreeMap;
use std::time::Duration;

use banlieue_api::VirtualMachine;
use kube::api::{Api, ListParams};
use kube::ResourceExt;

use crate::TestEnv;

/// Set by `make faults`: run every suite's full iteration count.
pub const FULL_ENV: &str = "BANLIEUE_FAULTS_FULL";

/// `full` under `make faults`, else `short` (CI).
pub fn iterations(short: usize, full: usize) -> usize {
    if std::env::var_os(FULL_ENV).is_some_and(|v| v != "0" && !v.is_empty()) { full } else { short }
}

/// One suite's counts.
#[derive(Debug, Default)]
pub struct Tally {
    pub suite: &'static str,
    pub iterations: usize,
    pub faults: usize,
    /// Backend VMs that remained although nothing declared them.
    pub leaked: usize,
    /// Backend VMs made a second time for one declared VM.
    pub duplicated: usize,
    /// From the moment each fault cleared to the declared state, as the backend shows it.
    pub converge: Vec<Duration>,
}

impl Tally {
    pub fn new(suite: &'static str) -> Tally {
        Tally { suite, ..Default::default() }
    }

    /// Print the suite's line (`RELIABILITY suite=… iterations=… faults=… leaked=… duplicated=…
    /// converge_p50_s=… converge_p99_s=…`) and fail when anything leaked or was duplicated.
    pub fn report(&self) {
        let (p50, p99) = (percentile(&self.converge, 50), percentile(&self.converge, 99));
        println!(
            "RELIABILITY suite={} iterations={} faults={} leaked={} duplicated={} converge_p50_s={:.2} converge_p99_s={:.2} samples={}",
            self.suite,
            self.iterations,
            self.faults,
            self.leaked,
            self.duplicated,
            p50.as_secs_f64(),
            p99.as_secs_f64(),
            self.converge.len()
        );
        assert_eq!((self.leaked, self.duplicated), (0, 0), "{}: backend VMs leaked / duplicated", self.suite);
    }
}

/// A VM Ready now: the Provider it is scheduled on and its Machine's UID (which names its
/// backend VM: a new UID is a new backend VM).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadyVm {
    pub provider: String,
    pub machine_uid: String,
}

/// How many VMs the test namespace holds, and those Ready, by name.
pub async fn ready_vms(env: &TestEnv) -> anyhow::Result<(usize, BTreeMap<String, ReadyVm>)> {
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    let listed = vms.list(&ListParams::default()).await?.items;
    let ready = listed
        .iter()
        .filter(|v| v.status.as_ref().is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True")))
        .filter_map(|v| {
            let s = v.status.as_ref()?;
            let provider = s.scheduled.as_ref().map(|p| p.provider.clone()).unwrap_or_default();
            Some((v.name_any(), ReadyVm { provider, machine_uid: s.infrastructure_ref.as_ref()?.uid.clone()? }))
        })
        .collect();
    Ok((listed.len(), ready))
}

/// Why the namespace's VMs that are not Ready are not: `name: reason: message` each, for a
/// convergence timeout to say what it waited on.
pub async fn not_ready(env: &TestEnv) -> anyhow::Result<Vec<String>> {
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    Ok(vms
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter_map(|v| {
            let ready = v.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
            match ready {
                Some(c) if c.status == "True" => None,
                Some(c) => Some(format!("{}: {}: {}", v.name_any(), c.reason, c.message)),
                None => Some(format!("{}: no Ready condition", v.name_any())),
            }
        })
        .collect())
}

/// The Machine UID each VM's backend VM was first made for: the same VM converged later on
/// another one had its backend VM made a second time.
#[derive(Debug, Default)]
pub struct MadeFor(BTreeMap<String, String>);

impl MadeFor {
    /// The VMs of a converged state; each remade one counts as duplicated in `tally`.
    pub fn record(&mut self, converged: &BTreeMap<String, ReadyVm>, tally: &mut Tally) {
        for (name, vm) in converged {
            match self.0.insert(name.clone(), vm.machine_uid.clone()) {
                Some(first) if first != vm.machine_uid => tally.duplicated += 1,
                _ => {}
            }
        }
    }

    /// Forget VM `name` (about to be remade on purpose, as a swap does), or every VM (`None`).
    pub fn forget(&mut self, name: Option<&str>) {
        match name {
            Some(n) => {
                self.0.remove(n);
            }
            None => self.0.clear(),
        }
    }
}

/// The `p`th percentile (nearest rank) of `samples`; zero for none.
pub fn percentile(samples: &[Duration], p: usize) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    let mut v = samples.to_vec();
    v.sort();
    let rank = (p * v.len()).div_ceil(100).clamp(1, v.len());
    v[rank - 1]
}

/// A small seeded generator (xorshift64*), so a failing run is replayed with its printed seed.
pub struct Rng(u64);

impl Rng {
    /// `BANLIEUE_FAULTS_SEED` when set, else `default`; printed either way.
    pub fn seeded(suite: &str, default: u64) -> Rng {
        let seed = std::env::var("BANLIEUE_FAULTS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(default);
        println!("{suite}: seed {seed} (replay with BANLIEUE_FAULTS_SEED={seed})");
        Rng(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `lo..hi` (`lo` when the range is empty).
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo { lo } else { lo + self.next() % (hi - lo) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let s: Vec<Duration> = (1..=100).map(Duration::from_secs).collect();
        assert_eq!(percentile(&s, 50), Duration::from_secs(50));
        assert_eq!(percentile(&s, 99), Duration::from_secs(99));
        assert_eq!(percentile(&s[..1], 99), Duration::from_secs(1));
        assert_eq!(percentile(&[], 50), Duration::ZERO);
    }

    #[test]
    fn the_same_seed_gives_the_same_draws() {
        let (mut a, mut b) = (Rng(7), Rng(7));
        let (x, y): (Vec<u64>, Vec<u64>) = ((0..5).map(|_| a.between(10, 20)).collect(), (0..5).map(|_| b.between(10, 20)).collect());
        assert_eq!(x, y);
        assert!(x.iter().all(|v| (10..20).contains(v)));
    }
}
