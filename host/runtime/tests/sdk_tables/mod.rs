//! The host's request and tables as the guest SDK's types (the same contract,
//! generated on each side), to run a policy natively on exactly what a component
//! would get. Shared by tests and the bench.

use banlieue_runtime::placement::{self as host, Domains};
use banlieue_sdk::placement as sdk;

/// The tables, moved (the candidates' columns are not copied).
pub fn tables(d: Domains) -> sdk::wire::Domains {
    use sdk::wire as w;
    let d = d.into_wire();
    let labels = |l: Vec<host::wire::Label>| l.into_iter().map(|l| w::Label { key: l.key, value: l.value }).collect();
    let c = d.candidates;
    w::Domains {
        texts: d.texts,
        text_ends: d.text_ends,
        facts: d
            .facts
            .into_iter()
            .map(|f| w::DomainFacts {
                provider_class: f.provider_class,
                labels: labels(f.labels),
                storage_classes: f.storage_classes,
                network_classes: f.network_classes,
                features: f.features,
            })
            .collect(),
        groups: d.groups.into_iter().map(|g| w::VmGroup { namespace: g.namespace, labels: labels(g.labels) }).collect(),
        placed_groups: d.placed_groups,
        placed_counts: d.placed_counts,
        candidates: w::Candidates {
            provider: c.provider,
            failure_domain: c.failure_domain,
            facts: c.facts,
            cpus: c.cpus,
            memory_mib: c.memory_mib,
            storage_gib: c.storage_gib,
            vm_count: c.vm_count,
            placed_ends: c.placed_ends,
        },
    }
}

pub fn request(r: &host::Request) -> sdk::Request {
    let op = |op: host::SelectorOp| match op {
        host::SelectorOp::In => sdk::SelectorOp::In,
        host::SelectorOp::NotIn => sdk::SelectorOp::NotIn,
        host::SelectorOp::Exists => sdk::SelectorOp::Exists,
        host::SelectorOp::DoesNotExist => sdk::SelectorOp::DoesNotExist,
    };
    let c = &r.class;
    sdk::Request {
        vm_name: r.vm_name.clone(),
        vm_namespace: r.vm_namespace.clone(),
        vm_labels: r.vm_labels.clone(),
        class: sdk::VmClass {
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
            .map(|a| sdk::AntiAffinity {
                topology_key: a.topology_key.clone(),
                selector: a.selector.iter().map(|s| sdk::SelectorRequirement { key: s.key.clone(), op: op(s.op), values: s.values.clone() }).collect(),
                required: a.required,
                weight: a.weight,
            })
            .collect(),
    }
}
