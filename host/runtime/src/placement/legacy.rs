//! Running components built against `banlieue:placement@0.1.0`.
//!
//! 0.1.0 passed every candidate in full (its labels, classes and features, and
//! one entry per placed VM) and named its choice by provider and failure domain.
//! The host gathers 0.2.0's tables only; for a 0.1.0 component it [`expand`]s
//! them into 0.1.0's shape and maps the answer back to a candidate index
//! ([`decision`]). [`intern`] is the way back, 0.1.0 candidates to tables.

use super::{wire, Domains, DomainsBuilder};
use crate::error::InvalidDecision;

pub(crate) mod bindings {
    wasmtime::component::bindgen!({
        path: ["../../wit/host", "../../wit/placement-0.1"],
        world: "banlieue:placement/placement",
        imports: { default: async },
        exports: { default: async },
        with: { "banlieue:host": crate::capability::bindings::banlieue::host },
        additional_derives: [PartialEq, Eq],
    });
}

/// 0.1.0's types.
pub mod v0_1 {
    pub use super::bindings::banlieue::placement::types::{
        AntiAffinity, Candidate, Capacity, Decision, PlacedVm, Request, SelectorOp, SelectorRequirement, VmClass,
    };
}

/// Labels 0.1.0 put on every candidate, which 0.2.0 answers from the candidate itself.
const PROVIDER_LABEL: &str = "banlieue.io/provider";
const FAILURE_DOMAIN_LABEL: &str = "banlieue.io/failure-domain";

impl bindings::banlieue::placement::types::Host for crate::state::HostState {}

/// Whether a component built for `version` (one the host accepted) runs through this adapter.
pub(crate) fn adapts(version: &semver::Version) -> bool {
    (version.major, version.minor) == (0, 1)
}

/// The request and candidates in 0.1.0's shape. Each candidate's labels are its
/// domain's, plus `banlieue.io/provider` (the provider's name) and
/// `banlieue.io/failure-domain`, sorted by key as the host used to pass them;
/// each placed group becomes one entry per VM.
pub fn expand(request: &super::Request, domains: &Domains) -> (v0_1::Request, Vec<v0_1::Candidate>) {
    let owned = |it: &mut dyn Iterator<Item = &str>| it.map(str::to_string).collect::<Vec<_>>();
    let pairs = |list: &[wire::Label]| domains.labels(list).map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>();
    let candidates = domains
        .iter()
        .map(|c| {
            let facts = c.facts();
            let provider = c.provider();
            let name = provider.rsplit_once('/').map_or(provider, |(_, name)| name);
            let mut labels = pairs(&facts.labels);
            labels.extend([(PROVIDER_LABEL.to_string(), name.to_string()), (FAILURE_DOMAIN_LABEL.to_string(), c.failure_domain().to_string())]);
            labels.sort();
            let cap = c.capacity();
            v0_1::Candidate {
                provider: provider.to_string(),
                provider_class: c.provider_class().to_string(),
                failure_domain: c.failure_domain().to_string(),
                labels,
                capacity: v0_1::Capacity { cpus: cap.cpus, memory_mib: cap.memory_mib, storage_gib: cap.storage_gib },
                storage_classes: owned(&mut domains.texts(&facts.storage_classes)),
                network_classes: owned(&mut domains.texts(&facts.network_classes)),
                features: owned(&mut domains.texts(&facts.features)),
                vm_count: c.vm_count(),
                vms: c
                    .placed()
                    .flat_map(|(g, n)| {
                        let vm = v0_1::PlacedVm { namespace: domains.text(g.namespace).to_string(), labels: pairs(&g.labels) };
                        std::iter::repeat_n(vm, n as usize)
                    })
                    .collect(),
            }
        })
        .collect();
    (lower_request(request), candidates)
}

/// 0.1.0's request: the same fields, in 0.1.0's types.
pub fn lower_request(r: &super::Request) -> v0_1::Request {
    use super::SelectorOp as Op;
    let op = |op: Op| match op {
        Op::In => v0_1::SelectorOp::In,
        Op::NotIn => v0_1::SelectorOp::NotIn,
        Op::Exists => v0_1::SelectorOp::Exists,
        Op::DoesNotExist => v0_1::SelectorOp::DoesNotExist,
    };
    let c = &r.class;
    v0_1::Request {
        vm_name: r.vm_name.clone(),
        vm_namespace: r.vm_namespace.clone(),
        vm_labels: r.vm_labels.clone(),
        class: v0_1::VmClass {
            name: c.name.clone(),
            cpus: c.cpus,
            memory_mib: c.memory_mib,
            storage_gib: c.storage_gib,
            storage_classes: c.storage_classes.clone(),
            network_classes: c.network_classes.clone(),
            features: c.features.clone(),
        },
        parameters: r.parameters.clone(),
        anti_affinity: r
            .anti_affinity
            .iter()
            .map(|a| v0_1::AntiAffinity {
                topology_key: a.topology_key.clone(),
                selector: a.selector.iter().map(|s| v0_1::SelectorRequirement { key: s.key.clone(), op: op(s.op), values: s.values.clone() }).collect(),
                required: a.required,
                weight: a.weight,
            })
            .collect(),
    }
}

/// A 0.1.0 decision as 0.2.0's: the index of the first candidate with its
/// provider and failure domain.
pub fn decision(d: v0_1::Decision, domains: &Domains) -> Result<super::Decision, InvalidDecision> {
    match domains.iter().find(|c| c.provider() == d.provider && c.failure_domain() == d.failure_domain) {
        Some(c) => Ok(super::Decision { candidate: c.index(), score: d.score, reason: d.reason }),
        None => Err(InvalidDecision::NotACandidate { provider: d.provider, failure_domain: d.failure_domain }),
    }
}

/// 0.1.0 candidates as tables: the inverse of [`expand`] up to order, for
/// candidates whose `banlieue.io/provider` and `banlieue.io/failure-domain`
/// labels are what the host puts there.
pub fn intern(candidates: &[v0_1::Candidate]) -> Domains {
    let mut b = DomainsBuilder::default();
    for c in candidates {
        let own = c.labels.iter().filter(|(k, _)| k != PROVIDER_LABEL && k != FAILURE_DOMAIN_LABEL).map(|(k, v)| (k.as_str(), v.as_str()));
        let facts = b.facts(&c.provider_class, own, &c.storage_classes, &c.network_classes, &c.features);
        let groups: Vec<u32> = c.vms.iter().map(|vm| b.group(&vm.namespace, vm.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())))).collect();
        let (provider, failure_domain) = (b.text(&c.provider), b.text(&c.failure_domain));
        let cap = super::Capacity { cpus: c.capacity.cpus, memory_mib: c.capacity.memory_mib, storage_gib: c.capacity.storage_gib };
        b.candidate(provider, failure_domain, facts, cap, c.vm_count, groups);
    }
    b.build()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(provider: &str, fd: &str, zone: &str, vms: &[(&str, &str)]) -> v0_1::Candidate {
        let name = provider.rsplit('/').next().unwrap();
        let mut labels = vec![("zone".to_string(), zone.to_string()), (PROVIDER_LABEL.into(), name.into()), (FAILURE_DOMAIN_LABEL.into(), fd.into())];
        labels.sort();
        v0_1::Candidate {
            provider: provider.into(),
            provider_class: "libvirt".into(),
            failure_domain: fd.into(),
            labels,
            capacity: v0_1::Capacity { cpus: 4, memory_mib: 4096, storage_gib: 40 },
            storage_classes: vec!["fast".into()],
            network_classes: vec!["lan".into()],
            features: vec![],
            vm_count: vms.len() as u32,
            vms: vms.iter().map(|(k, v)| v0_1::PlacedVm { namespace: "team".into(), labels: vec![(k.to_string(), v.to_string())] }).collect(),
        }
    }

    #[test]
    fn interning_shares_facts_and_groups_and_expands_back() {
        let all = vec![
            candidate("team/a", "a1", "z1", &[("app", "web"), ("app", "db"), ("app", "web")]),
            candidate("team/a", "a2", "z1", &[("app", "db")]),
            candidate("team/b", "b1", "z2", &[]),
        ];
        let d = intern(&all);
        assert_eq!((d.wire().facts.len(), d.wire().groups.len(), d.wire().placed_groups.len()), (2, 2, 3));
        assert!(d.wire().facts.iter().all(|f| f.labels.len() == 1), "the two per-candidate labels are not facts");
        let request = super::super::Request {
            vm_name: "vm".into(),
            vm_namespace: "team".into(),
            vm_labels: vec![],
            class: super::super::VmClass { name: "c".into(), cpus: 1, memory_mib: 1, storage_gib: 1, storage_classes: vec![], network_classes: vec![], features: vec![] },
            parameters: "{}".into(),
            anti_affinity: vec![],
        };
        let (_, mut back) = expand(&request, &d);
        // Placed VMs come back grouped: the same multiset.
        for c in &mut back {
            c.vms.sort_by(|a, b| a.labels.cmp(&b.labels));
        }
        let mut expected = all.clone();
        expected[0].vms.sort_by(|a, b| a.labels.cmp(&b.labels));
        assert_eq!(back, expected);
    }

    #[test]
    fn a_decision_maps_back_to_its_index_or_is_refused() {
        let d = intern(&[candidate("team/a", "a1", "z1", &[]), candidate("team/a", "a2", "z1", &[])]);
        let answer = |p: &str, fd: &str| v0_1::Decision { provider: p.into(), failure_domain: fd.into(), score: 7, reason: "r".into() };
        let mapped = decision(answer("team/a", "a2"), &d).unwrap();
        assert_eq!((mapped.candidate, mapped.score, mapped.reason.as_str()), (1, 7, "r"));
        assert_eq!(
            decision(answer("team/a", "a3"), &d).unwrap_err(),
            InvalidDecision::NotACandidate { provider: "team/a".into(), failure_domain: "a3".into() }
        );
    }
}
