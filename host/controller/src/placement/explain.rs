//! Placement what-ifs (`banlieue placement explain`, `kubectl vm place --dry-run`): the
//! candidates a VM would see now, which hard constraint left each other failure domain out,
//! and the order a placement policy prefers the candidates in — without placing anything.
//!
//! The placement contract answers one choice (with its score and reason), not a score for
//! every candidate; the order is found by asking again without the candidate just chosen (the
//! first `top` of them), so every position comes with the policy's own score and words and
//! costs one call.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use banlieue_api::{Provider, VMClass, VMImage, VirtualMachine};
use banlieue_runtime::placement::{Domains, PlacementPolicy};
use banlieue_runtime::{CallError, Limits};
use kube::ResourceExt;

use super::scheduling;

/// What a VM's placement would be now.
#[derive(Debug, Default)]
pub struct Explanation {
    /// The candidates in the order the policy prefers them: `provider/failure-domain`, what
    /// it knows of the domain, and the policy's reason for choosing it at that point.
    pub ranked: Vec<Ranked>,
    /// Candidates beyond `top`: feasible, not ranked.
    pub unranked: Vec<String>,
    /// Failure domains that are not candidates, each with the hard constraint that left it out.
    pub excluded: Vec<String>,
}

/// One ranked candidate.
#[derive(Debug, Clone, PartialEq)]
pub struct Ranked {
    pub candidate: String,
    pub free_cpus: u64,
    pub free_memory_mib: u64,
    pub vms: u32,
    /// The policy's score when it chose this one (higher is better; policy-specific).
    pub score: i64,
    pub why: String,
}

/// Everything the VM controller looks at to place `vm`.
pub struct World<'a> {
    pub vm: &'a VirtualMachine,
    pub class: &'a VMClass,
    pub image: &'a VMImage,
    /// The VM's namespace's Providers.
    pub providers: Vec<Arc<Provider>>,
    /// The namespace's VMs (placed ones count where they are).
    pub vms: Vec<Arc<VirtualMachine>>,
}

/// The candidates `world.vm` would be offered now, and the exclusions: the hard constraints
/// the VM controller applies, then the image's imports (a `url` image is preferred where it
/// is imported).
pub fn candidates(world: &World<'_>) -> Result<(Domains, Vec<String>), String> {
    let mut providers = world.providers.clone();
    providers.sort_by_key(|p| p.name_any());
    let image_classes: BTreeSet<String> = match world.vm.spec.adopt {
        Some(_) => providers.iter().map(|p| p.spec.provider_class_ref.name.clone()).collect(),
        None => world.image.spec.sources.iter().map(|s| s.provider_class.clone()).collect(),
    };
    let found = scheduling::candidates(world.vm, world.class, &image_classes, &providers, &world.vms, true)?;
    let mut excluded = found.unselected;
    excluded.extend(found.excluded);
    let all: Vec<String> = found.candidates.iter().map(|c| name(&c)).collect();
    let kept = scheduling::prefer_imported(found.candidates, world.image);
    let left: BTreeSet<String> = kept.iter().map(|c| name(&c)).collect();
    excluded.extend(all.into_iter().filter(|c| !left.contains(c)).map(|c| format!("{c}: VMImage {:?} is not imported there yet (elsewhere it is)", world.image.name_any())));
    Ok((kept, excluded))
}

/// Rank `candidates` with `policy`: its choice, then its choice without that one, … up to `top`.
pub async fn rank(policy: &PlacementPolicy, world: &World<'_>, parameters: &BTreeMap<String, serde_json::Value>, mut candidates: Domains, top: usize, limits: Limits) -> Result<Explanation, CallError> {
    let request = scheduling::request(world.vm, world.class, parameters);
    let mut out = Explanation::default();
    while out.ranked.len() < top && !candidates.is_empty() {
        let grants = crate::sandbox::grants::for_policy("explain", format!("{}/{}", world.vm.namespace().unwrap_or_default(), world.vm.name_any()));
        let decision = policy.choose(&request, &candidates, limits, grants).await?;
        let chosen = candidates.get(decision.candidate).expect("the runtime checked the index");
        let capacity = chosen.capacity();
        let picked = name(&chosen);
        out.ranked.push(Ranked { candidate: picked.clone(), free_cpus: capacity.cpus, free_memory_mib: capacity.memory_mib, vms: chosen.vm_count(), score: decision.score, why: decision.reason });
        let index = chosen.index();
        candidates.retain(|c| c.index() != index);
    }
    out.unranked = candidates.iter().map(|c| name(&c)).collect();
    Ok(out)
}

/// `provider/failure-domain`, the Provider without its namespace (as `Scheduled` names it).
fn name(c: &banlieue_runtime::placement::CandidateRef<'_>) -> String {
    format!("{}/{}", c.provider().rsplit('/').next().unwrap_or_default(), c.failure_domain())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn provider(name: &str, class: &str, domains: serde_json::Value) -> Arc<Provider> {
        let mut p = crate::fixtures::provider("team", name, true, domains);
        p.spec.provider_class_ref.name = class.into();
        Arc::new(p)
    }

    fn domain(name: &str, zone: &str, memory: u64) -> serde_json::Value {
        json!({"name": name, "labels": {"zone": zone}, "capacity": {"cpus": 8, "memoryMiB": memory, "storageGiB": 100},
               "storageClasses": ["fast"], "networkClasses": ["lan"]})
    }

    #[test]
    fn every_failure_domain_is_a_candidate_or_says_what_left_it_out() {
        let vm: VirtualMachine = serde_json::from_value(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
            "metadata": {"name": "web", "namespace": "team", "uid": "u"},
            "spec": {"classRef": {"name": "small"}, "imageRef": {"name": "os"}, "placement": {"failureDomainSelector": {"matchLabels": {"zone": "z1"}}}}})).unwrap();
        let class: VMClass = serde_json::from_value(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": "small"},
            "spec": {"cpus": 1, "memoryMiB": 512, "disks": [{"name": "root", "sizeGiB": 4, "storageClass": "fast"}], "nics": [{"name": "eth0", "networkClass": "lan"}]}})).unwrap();
        let image: VMImage = serde_json::from_value(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": "os"},
            "spec": {"sources": [{"providerClass": "libvirt", "backingFile": "/images/os.qcow2"}]}})).unwrap();
        let world = World {
            vm: &vm,
            class: &class,
            image: &image,
            providers: vec![provider("b", "libvirt", json!([domain("b1", "z1", 4096), domain("b2", "z2", 4096)])), provider("vc", "vsphere", json!([domain("dc", "z1", 4096)])), provider("a", "libvirt", json!([domain("a1", "z1", 8192)]))],
            vms: vec![],
        };
        let (candidates, excluded) = candidates(&world).unwrap();
        assert_eq!(candidates.iter().map(|c| name(&c)).collect::<Vec<_>>(), ["a/a1", "b/b1"]);
        assert!(excluded.iter().any(|e| e.contains("b/b2") && e.contains("failureDomainSelector")), "{excluded:?}");
        assert!(excluded.iter().any(|e| e.contains("Provider vc's class \"vsphere\"")), "{excluded:?}");
    }
}
