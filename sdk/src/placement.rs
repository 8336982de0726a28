//! Writing a placement policy: implement [`Policy`] and call [`export_placement!`].
//!
//! ```ignore
//! struct PreferGold;
//! impl banlieue_sdk::placement::Policy for PreferGold {
//!     fn choose(req: &Request, candidates: Candidates<'_>) -> Result<Decision> { ... }
//! }
//! banlieue_sdk::export_placement!(PreferGold);
//! ```
//!
//! A policy reads each candidate through a [`Candidate`] view (`provider()`,
//! `failure_domain()`, `label(key)`, `facts()`, `placed()`, `capacity()`); the
//! helpers here are pure, so a policy's logic unit-tests natively with
//! [`fixtures`].

use serde::de::DeserializeOwned;

pub use crate::bindings::placement::banlieue::placement::types::{
    AntiAffinity, Decision, Request, SelectorOp, SelectorRequirement, VmClass,
};
pub use crate::candidates::{Candidate, Candidates, Capacity, Corrupt, Facts, PlacedGroup};
pub use crate::selector::{AntiAffinityIndex, AntiAffinityVerdict, Group, anti_affinity, same_group};
pub use crate::{Error, Result};

/// The contract's flat request tables, as they cross the boundary; a policy reads
/// them through [`Candidates`].
pub mod wire {
    pub use crate::bindings::placement::banlieue::placement::types::{
        Candidates, DomainFacts, Domains, Label, Text, VmGroup,
    };
}

/// The `banlieue:placement` contract version this SDK implements.
pub const CONTRACT_VERSION: &str = "0.2.0";

/// A placement policy.
pub trait Policy {
    /// Pick one of `candidates` for the VM in `req`.
    fn choose(req: &Request, candidates: Candidates<'_>) -> Result<Decision>;
}

/// Why a candidate cannot take the VM at all (capacity, classes, features), or `None`.
pub fn unfit(class: &VmClass, c: &Candidate<'_>) -> Option<String> {
    let cap = c.capacity();
    if cap.cpus < u64::from(class.cpus) {
        return Some(format!("{} free CPUs < {}", cap.cpus, class.cpus));
    }
    if cap.memory_mib < class.memory_mib {
        return Some(format!("{} MiB free memory < {}", cap.memory_mib, class.memory_mib));
    }
    if cap.storage_gib < class.storage_gib {
        return Some(format!("{} GiB free storage < {}", cap.storage_gib, class.storage_gib));
    }
    let facts = c.facts();
    let no = |what: &str, w: &str| format!("no {what} {w:?}");
    first_missing(&class.storage_classes, facts.storage_classes())
        .map(|w| no("storage class", w))
        .or_else(|| first_missing(&class.network_classes, facts.network_classes()).map(|w| no("network class", w)))
        .or_else(|| first_missing(&class.features, facts.features()).map(|w| no("feature", w)))
}

/// The first of `want` that `have` lacks.
fn first_missing<'w, 'h>(want: &'w [String], have: impl Iterator<Item = &'h str> + Clone) -> Option<&'w str> {
    want.iter().map(String::as_str).find(|w| !have.clone().any(|h| h == *w))
}

/// Whether a candidate can take the VM at all: [`unfit`] is `None`, without building the reason.
pub fn fits(class: &VmClass, c: &Candidate<'_>) -> bool {
    has_room(class, &c.capacity()) && offers(class, &c.facts())
}

fn has_room(class: &VmClass, cap: &Capacity) -> bool {
    cap.cpus >= u64::from(class.cpus) && cap.memory_mib >= class.memory_mib && cap.storage_gib >= class.storage_gib
}

/// Whether `facts` offer every class and feature the VM needs.
fn offers(class: &VmClass, facts: &Facts<'_>) -> bool {
    first_missing(&class.storage_classes, facts.storage_classes()).is_none()
        && first_missing(&class.network_classes, facts.network_classes()).is_none()
        && first_missing(&class.features, facts.features()).is_none()
}

/// A candidate that passed the filters, with its anti-affinity penalty.
#[derive(Clone, Copy, Debug)]
pub struct Feasible<'a> {
    pub candidate: Candidate<'a>,
    pub penalty: u64,
}

/// Drop candidates that lack capacity, classes or features, or break a required
/// anti-affinity rule. Returns the survivors, or `unavailable` listing why each was
/// dropped (capacity may free up, so the host retries).
///
/// Allocates nothing per candidate beyond the list of survivors: classes and
/// features are checked once per distinct set of facts, anti-affinity through an
/// index built once, and the reasons are written only when nothing fits.
pub fn feasible<'a>(req: &'a Request, candidates: Candidates<'a>) -> Result<Vec<Feasible<'a>>> {
    let rules = AntiAffinityIndex::new(req, candidates);
    let offered: Vec<bool> = candidates.facts().map(|f| offers(&req.class, &f)).collect();
    let mut kept = Vec::with_capacity(candidates.len());
    for c in candidates.iter() {
        if !(has_room(&req.class, &c.capacity()) && offered[c.facts().index() as usize]) {
            continue;
        }
        if let Some(penalty) = rules.penalty(&c) {
            kept.push(Feasible { candidate: c, penalty });
        }
    }
    if kept.is_empty() {
        let dropped: Vec<String> = candidates
            .iter()
            .filter_map(|c| Some(format!("{}: {}", name(&c), unfit(&req.class, &c).or(rules.verdict(&c).violated)?)))
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
pub fn name(c: &Candidate<'_>) -> String {
    format!("{}/{}", c.provider(), c.failure_domain())
}

/// The stable tie-break key: (provider, failure domain).
pub fn tie_break<'a>(c: &Candidate<'a>) -> (&'a str, &'a str) {
    (c.provider(), c.failure_domain())
}

/// Decode the policy parameters; an empty string means `{}`.
pub fn parameters<T: DeserializeOwned + Default>(req: &Request) -> Result<T> {
    if req.parameters.trim().is_empty() {
        return Ok(T::default());
    }
    serde_json::from_str(&req.parameters).map_err(|e| Error::InvalidSpec(format!("placement parameters: {e}")))
}

/// The decision for `c`.
pub fn decide(c: &Candidate<'_>, score: i64, reason: impl Into<String>) -> Decision {
    Decision { candidate: c.index(), score, reason: reason.into() }
}

/// Export a [`Policy`] as this component's `banlieue:placement/policy`.
///
/// Only on wasm32, so the crate's logic also builds and tests natively. A request
/// whose indices point nowhere is answered with `invalid-spec` before the policy runs.
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
                fn choose(request: wit::Request, domains: wit::Domains) -> ::core::result::Result<wit::Decision, wit::Error> {
                    let decision = $crate::placement::Candidates::new(&domains)
                        .and_then(|candidates| <$policy as $crate::placement::Policy>::choose(&request, candidates));
                    // Each call runs in a fresh instance that the host drops
                    // afterwards: freeing the arguments would be wasted work.
                    ::core::mem::forget((request, domains));
                    decision
                }
            }
            $crate::bindings::placement::export_placement_world!(Exported with_types_in $crate::bindings::placement);
        }
    };
}

/// Builders for unit tests of policy logic (native, no host needed): describe
/// each failure domain in full, as 0.1.0 passed it, and [`domains`] interns them
/// into the request's tables.
pub mod fixtures {
    use std::collections::HashMap;

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

    /// `n` placed VMs of one namespace with the same labels: (namespace, labels, n).
    pub type PlacedVms = (String, Vec<(String, String)>, u32);

    /// One failure domain, spelled out.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Domain {
        /// `namespace/name` of the Provider.
        pub provider: String,
        pub provider_class: String,
        pub failure_domain: String,
        /// Its own labels (not `banlieue.io/provider` or `banlieue.io/failure-domain`).
        pub labels: Vec<(String, String)>,
        pub capacity: Capacity,
        pub storage_classes: Vec<String>,
        pub network_classes: Vec<String>,
        pub features: Vec<String>,
        pub vm_count: u32,
        pub vms: Vec<PlacedVms>,
    }

    /// An empty failure domain with plenty of room.
    pub fn candidate(provider: &str, failure_domain: &str) -> Domain {
        Domain {
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

    impl Domain {
        pub fn with_labels(mut self, labels: &[(&str, &str)]) -> Domain {
            self.labels = pairs(labels);
            self
        }

        /// Add `n` placed VMs.
        pub fn with_vms(mut self, namespace: &str, labels: &[(&str, &str)], n: u32) -> Domain {
            self.vms.push((namespace.into(), pairs(labels), n));
            self.vm_count += n;
            self
        }
    }

    /// Interns domains into the request's tables: each text, set of facts and
    /// group of placed VMs once.
    pub struct DomainsBuilder {
        out: wire::Domains,
        texts: HashMap<String, u32>,
        facts: HashMap<Vec<u32>, u32>,
        groups: HashMap<Vec<u32>, u32>,
    }

    impl Default for DomainsBuilder {
        fn default() -> Self {
            let candidates = wire::Candidates {
                provider: vec![],
                failure_domain: vec![],
                facts: vec![],
                cpus: vec![],
                memory_mib: vec![],
                storage_gib: vec![],
                vm_count: vec![],
                placed_ends: vec![],
            };
            let out = wire::Domains { texts: String::new(), text_ends: vec![], facts: vec![], groups: vec![], placed_groups: vec![], placed_counts: vec![], candidates };
            DomainsBuilder { out, texts: HashMap::new(), facts: HashMap::new(), groups: HashMap::new() }
        }
    }

    impl DomainsBuilder {
        pub fn text(&mut self, s: &str) -> u32 {
            if let Some(&i) = self.texts.get(s) {
                return i;
            }
            let i = self.out.text_ends.len() as u32;
            self.out.texts.push_str(s);
            self.out.text_ends.push(self.out.texts.len() as u32);
            self.texts.insert(s.to_string(), i);
            i
        }

        fn labels(&mut self, labels: &[(String, String)]) -> Vec<wire::Label> {
            labels.iter().map(|(k, v)| wire::Label { key: self.text(k), value: self.text(v) }).collect()
        }

        fn texts(&mut self, list: &[String]) -> Vec<u32> {
            list.iter().map(|s| self.text(s)).collect()
        }

        pub fn push(&mut self, d: &Domain) {
            let facts = wire::DomainFacts {
                provider_class: self.text(&d.provider_class),
                labels: self.labels(&d.labels),
                storage_classes: self.texts(&d.storage_classes),
                network_classes: self.texts(&d.network_classes),
                features: self.texts(&d.features),
            };
            let key: Vec<u32> = [facts.provider_class, facts.labels.len() as u32]
                .into_iter()
                .chain(facts.labels.iter().flat_map(|l| [l.key, l.value]))
                .chain([facts.storage_classes.len() as u32])
                .chain(facts.storage_classes.iter().copied())
                .chain([facts.network_classes.len() as u32])
                .chain(facts.network_classes.iter().copied())
                .chain(facts.features.iter().copied())
                .collect();
            let next = self.out.facts.len() as u32;
            let facts_index = *self.facts.entry(key).or_insert_with(|| {
                self.out.facts.push(facts);
                next
            });
            for (namespace, labels, count) in &d.vms {
                let group = wire::VmGroup { namespace: self.text(namespace), labels: self.labels(labels) };
                let key: Vec<u32> = [group.namespace].into_iter().chain(group.labels.iter().flat_map(|l| [l.key, l.value])).collect();
                let next = self.out.groups.len() as u32;
                let group = *self.groups.entry(key).or_insert_with(|| {
                    self.out.groups.push(group);
                    next
                });
                self.out.placed_groups.push(group);
                self.out.placed_counts.push(*count);
            }
            let (provider, failure_domain) = (self.text(&d.provider), self.text(&d.failure_domain));
            let c = &mut self.out.candidates;
            c.provider.push(provider);
            c.failure_domain.push(failure_domain);
            c.facts.push(facts_index);
            c.cpus.push(d.capacity.cpus);
            c.memory_mib.push(d.capacity.memory_mib);
            c.storage_gib.push(d.capacity.storage_gib);
            c.vm_count.push(d.vm_count);
            c.placed_ends.push(self.out.placed_groups.len() as u32);
        }

        pub fn build(self) -> wire::Domains {
            self.out
        }
    }

    /// `all` as the request's tables.
    pub fn domains(all: &[Domain]) -> wire::Domains {
        let mut b = DomainsBuilder::default();
        for d in all {
            b.push(d);
        }
        b.build()
    }

    /// Run policy `P` over `all`, as the host would.
    pub fn choose<P: Policy>(req: &Request, all: &[Domain]) -> Result<Decision> {
        let tables = domains(all);
        P::choose(req, Candidates::new(&tables)?)
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;

    fn kept(req: &Request, all: &[Domain]) -> Result<Vec<String>> {
        let tables = domains(all);
        let kept = feasible(req, Candidates::new(&tables)?)?;
        Ok(kept.iter().map(|f| f.candidate.failure_domain().to_string()).collect())
    }

    #[test]
    fn filters_capacity_classes_and_features() {
        let mut req = request("ns", "vm", &[]);
        req.class.features = vec!["tpm".into()];
        req.class.storage_classes = vec!["fast".into()];
        let mut small = candidate("p", "small");
        small.capacity.cpus = 1;
        small.features = vec!["tpm".into()];
        let no_tpm = candidate("p", "no-tpm");
        let mut ok = candidate("p", "ok");
        ok.features = vec!["tpm".into()];
        let mut slow = ok.clone();
        slow.failure_domain = "slow".into();
        for c in [&mut small, &mut ok] {
            c.storage_classes = vec!["slow".into(), "fast".into()];
        }
        assert_eq!(kept(&req, &[small, no_tpm, ok, slow]).unwrap(), ["ok"]);
    }

    #[test]
    fn nothing_fits_is_unavailable_with_reasons() {
        let mut req = request("ns", "vm", &[]);
        let mut c = candidate("p", "a");
        c.capacity.memory_mib = 10;
        let err = kept(&req, &[c]).unwrap_err();
        assert!(err.is_retryable());
        assert!(err.message().contains("p/a: 10 MiB free memory"), "{err:?}");
        assert!(kept(&req, &[]).unwrap_err().is_retryable());
        req.class.network_classes = vec!["lan".into()];
        let err = kept(&req, &[candidate("p", "b")]).unwrap_err();
        assert!(err.message().ends_with("p/b: no network class \"lan\""), "{err:?}");
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
        let all = [
            candidate("p", "a1").with_labels(&[("zone", "a")]),
            candidate("p", "a2").with_labels(&[("zone", "a")]).with_vms("ns", &[("app", "db")], 1),
            candidate("p", "b").with_labels(&[("zone", "b")]).with_vms("other-ns", &[("app", "db")], 3),
        ];
        assert_eq!(kept(&req, &all).unwrap(), ["b"]);
    }

    #[test]
    fn the_decision_names_the_candidate_by_index() {
        let tables = domains(&[candidate("p", "a"), candidate("p", "b")]);
        let b = Candidates::new(&tables).unwrap().get(1).unwrap();
        assert_eq!(decide(&b, 3, "why"), Decision { candidate: 1, score: 3, reason: "why".into() });
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
