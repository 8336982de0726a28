//! Writing a placement policy: implement [`Policy`] and call [`export_placement!`].
//!
//! ```ignore
//! struct PreferGold;
//! impl banlieue_sdk::placement::Policy for PreferGold {
//!     fn choose(req: &Request, candidates: &[Candidate]) -> Result<Decision, Error> { ... }
//! }
//! banlieue_sdk::export_placement!(PreferGold);
//! ```
//!
//! The helpers here are pure, so a policy's logic unit-tests natively.

use serde::de::DeserializeOwned;

pub use crate::bindings::placement::banlieue::placement::types::{
    AntiAffinity, Candidate, Capacity, Decision, PlacedVm, Request, SelectorOp, SelectorRequirement, VmClass,
};
pub use crate::selector::{AntiAffinityIndex, AntiAffinityVerdict, Group, anti_affinity, same_group};
pub use crate::{Error, Result};

/// The `banlieue:placement` contract version this SDK implements.
pub const CONTRACT_VERSION: &str = "0.1.0";

/// A placement policy.
pub trait Policy {
    /// Pick one of `candidates` for the VM in `req`.
    fn choose(req: &Request, candidates: &[Candidate]) -> Result<Decision>;
}

/// Why a candidate cannot take the VM at all (capacity, classes, features), or `None`.
pub fn unfit(class: &VmClass, c: &Candidate) -> Option<String> {
    let cap = &c.capacity;
    if cap.cpus < u64::from(class.cpus) {
        return Some(format!("{} free CPUs < {}", cap.cpus, class.cpus));
    }
    if cap.memory_mib < class.memory_mib {
        return Some(format!("{} MiB free memory < {}", cap.memory_mib, class.memory_mib));
    }
    if cap.storage_gib < class.storage_gib {
        return Some(format!("{} GiB free storage < {}", cap.storage_gib, class.storage_gib));
    }
    let missing = |want: &[String], have: &[String], what: &str| {
        want.iter().find(|w| !have.contains(w)).map(|w| format!("no {what} {w:?}"))
    };
    missing(&class.storage_classes, &c.storage_classes, "storage class")
        .or_else(|| missing(&class.network_classes, &c.network_classes, "network class"))
        .or_else(|| missing(&class.features, &c.features, "feature"))
}

/// Whether a candidate can take the VM at all: [`unfit`] is `None`, without building the reason.
pub fn fits(class: &VmClass, c: &Candidate) -> bool {
    let cap = &c.capacity;
    let has_all = |want: &[String], have: &[String]| want.iter().all(|w| have.contains(w));
    cap.cpus >= u64::from(class.cpus)
        && cap.memory_mib >= class.memory_mib
        && cap.storage_gib >= class.storage_gib
        && has_all(&class.storage_classes, &c.storage_classes)
        && has_all(&class.network_classes, &c.network_classes)
        && has_all(&class.features, &c.features)
}

/// A candidate that passed the filters, with its anti-affinity penalty.
#[derive(Clone, Copy, Debug)]
pub struct Feasible<'a> {
    pub candidate: &'a Candidate,
    pub penalty: u64,
}

/// Drop candidates that lack capacity, classes or features, or break a required
/// anti-affinity rule. Returns the survivors, or `unavailable` listing why each was
/// dropped (capacity may free up, so the host retries).
///
/// Allocates only the list of survivors: the reasons are written only when
/// nothing fits, and anti-affinity is evaluated through an index built once.
pub fn feasible<'a>(req: &Request, candidates: &'a [Candidate]) -> Result<Vec<Feasible<'a>>> {
    let rules = AntiAffinityIndex::new(req, candidates);
    let mut kept = Vec::with_capacity(candidates.len());
    for c in candidates {
        if !fits(&req.class, c) {
            continue;
        }
        if let Some(penalty) = rules.penalty(c) {
            kept.push(Feasible { candidate: c, penalty });
        }
    }
    if kept.is_empty() {
        let dropped: Vec<String> = candidates
            .iter()
            .filter_map(|c| Some(format!("{}: {}", name(c), unfit(&req.class, c).or(rules.verdict(c).violated)?)))
            .collect();
        return Err(Error::Unavailable(if dropped.is_empty() {
            "no candidate failure domains".to_string()
        } else {
            format!("no candidate fits: {}", dropped.join("; "))
        }));
    }
    Ok(kept)
}

/// `provider/failure-domain`, for messages.
pub fn name(c: &Candidate) -> String {
    format!("{}/{}", c.provider, c.failure_domain)
}

/// The stable tie-break key: (provider, failure domain).
pub fn tie_break(c: &Candidate) -> (&str, &str) {
    (&c.provider, &c.failure_domain)
}

/// Decode the policy parameters; an empty string means `{}`.
pub fn parameters<T: DeserializeOwned + Default>(req: &Request) -> Result<T> {
    if req.parameters.trim().is_empty() {
        return Ok(T::default());
    }
    serde_json::from_str(&req.parameters).map_err(|e| Error::InvalidSpec(format!("placement parameters: {e}")))
}

/// The decision for `c`.
pub fn decide(c: &Candidate, score: i64, reason: impl Into<String>) -> Decision {
    Decision { provider: c.provider.clone(), failure_domain: c.failure_domain.clone(), score, reason: reason.into() }
}

/// Export a [`Policy`] as this component's `banlieue:placement/policy`.
///
/// Only on wasm32, so the crate's logic also builds and tests natively.
#[macro_export]
macro_rules! export_placement {
    ($policy:ty) => {
        #[cfg(target_arch = "wasm32")]
        #[doc(hidden)]
        mod __banlieue_placement_export {
            #[allow(unused_imports)]
            use super::*;
            use $crate::bindings::placement::exports::banlieue::placement::policy as wit;
            pub struct Exported;
            impl wit::Guest for Exported {
                fn contract_version() -> ::std::string::String {
                    $crate::placement::CONTRACT_VERSION.into()
                }
                fn choose(
                    request: wit::Request,
                    candidates: ::std::vec::Vec<wit::Candidate>,
                ) -> ::core::result::Result<wit::Decision, wit::Error> {
                    let decision = <$policy as $crate::placement::Policy>::choose(&request, &candidates);
                    // Each call runs in a fresh instance that the host drops
                    // afterwards: freeing every string and list of the
                    // arguments one by one would be wasted work.
                    ::core::mem::forget((request, candidates));
                    decision
                }
            }
            $crate::bindings::placement::export_placement_world!(Exported with_types_in $crate::bindings::placement);
        }
    };
}

/// Builders for unit tests of policy logic (native, no host needed).
pub mod fixtures {
    use super::*;

    /// Owned label pairs.
    pub fn pairs(kv: &[(&str, &str)]) -> Vec<(String, String)> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// A request for `namespace/name` with `labels`: 2 CPUs, 2 GiB, 20 GiB, no classes.
    pub fn request(namespace: &str, name: &str, labels: &[(&str, &str)]) -> Request {
        Request {
            vm_name: name.into(),
            vm_namespace: namespace.into(),
            vm_labels: pairs(labels),
            class: VmClass {
                name: "small".into(),
                cpus: 2,
                memory_mib: 2048,
                storage_gib: 20,
                storage_classes: vec![],
                network_classes: vec![],
                features: vec![],
            },
            parameters: String::new(),
            anti_affinity: vec![],
        }
    }

    /// An empty failure domain with plenty of room.
    pub fn candidate(provider: &str, failure_domain: &str) -> Candidate {
        Candidate {
            provider: provider.into(),
            provider_class: "libvirt".into(),
            failure_domain: failure_domain.into(),
            labels: vec![],
            capacity: Capacity { cpus: 64, memory_mib: 262_144, storage_gib: 4096 },
            storage_classes: vec![],
            network_classes: vec![],
            features: vec![],
            vm_count: 0,
            vms: vec![],
        }
    }

    /// Add placed VMs to a candidate.
    pub fn with_vms(mut c: Candidate, namespace: &str, labels: &[(&str, &str)], n: u32) -> Candidate {
        for _ in 0..n {
            c.vms.push(PlacedVm { namespace: namespace.into(), labels: pairs(labels) });
        }
        c.vm_count += n;
        c
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;

    #[test]
    fn filters_capacity_classes_and_features() {
        let mut req = request("ns", "vm", &[]);
        req.class.features = vec!["tpm".into()];
        let mut small = candidate("p", "small");
        small.capacity.cpus = 1;
        small.features = vec!["tpm".into()];
        let mut no_tpm = candidate("p", "no-tpm");
        no_tpm.features = vec![];
        let mut ok = candidate("p", "ok");
        ok.features = vec!["tpm".into()];
        let all = [small, no_tpm, ok];
        let kept = feasible(&req, &all).unwrap();
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].candidate.failure_domain, "ok");
    }

    #[test]
    fn nothing_fits_is_unavailable_with_reasons() {
        let req = request("ns", "vm", &[]);
        let mut c = candidate("p", "a");
        c.capacity.memory_mib = 10;
        let err = feasible(&req, &[c]).unwrap_err();
        assert!(err.is_retryable());
        assert!(err.message().contains("p/a: 10 MiB free memory"), "{err:?}");
        assert!(feasible(&req, &[]).unwrap_err().is_retryable());
    }

    #[test]
    fn required_anti_affinity_spans_the_topology() {
        let mut req = request("ns", "db-1", &[("app", "db")]);
        req.anti_affinity.push(AntiAffinity {
            topology_key: "zone".into(),
            selector: vec![SelectorRequirement { key: "app".into(), op: SelectorOp::In, values: vec!["db".into()] }],
            required: true,
            weight: 1,
        });
        // a1 and a2 share zone a; the db VM lives in a2, so a1 is excluded as well.
        let mut a1 = candidate("p", "a1");
        a1.labels = pairs(&[("zone", "a")]);
        let mut a2 = with_vms(candidate("p", "a2"), "ns", &[("app", "db")], 1);
        a2.labels = pairs(&[("zone", "a")]);
        let mut b = with_vms(candidate("p", "b"), "other-ns", &[("app", "db")], 3);
        b.labels = pairs(&[("zone", "b")]);
        let all = [a1, a2, b];
        let kept = feasible(&req, &all).unwrap();
        assert_eq!(kept.iter().map(|f| f.candidate.failure_domain.as_str()).collect::<Vec<_>>(), ["b"]);
    }

    #[test]
    fn parameters_default_and_reject_garbage() {
        #[derive(serde::Deserialize, Default, Debug)]
        struct P {
            #[allow(dead_code)]
            x: Option<u32>,
        }
        let mut req = request("ns", "vm", &[]);
        assert!(parameters::<P>(&req).is_ok());
        req.parameters = "{not json".into();
        assert!(matches!(parameters::<P>(&req), Err(Error::InvalidSpec(_))));
    }
}
