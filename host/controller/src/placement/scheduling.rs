//! Gathering what a placement component may look at, and checking a placement
//! still holds. The host filters hard constraints (provider and failure-domain
//! selectors, classes and features the VMClass needs, required anti-affinity);
//! the component ranks what is left (spread, binpack, or a team's own policy).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use banlieue_api::provider::FailureDomain;
use banlieue_api::vm::{AffinityMode, Scheduled};
use banlieue_api::{Provider, VMClass, VirtualMachine};
use banlieue_runtime::placement::{AntiAffinity, Capacity, Domains, DomainsBuilder, Request, SelectorOp, SelectorRequirement, VmClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt};
use kube::ResourceExt;

use banlieue_api::common::NameRef;
use banlieue_api::PlacementPolicy;
use kube::Api;

use crate::Context;
use crate::failure::{api_failure, Failure};
use crate::status::conditions::{self, READY};
use crate::status::reasons::Reason;

/// Labels every candidate carries besides its failure domain's own.
pub const PROVIDER_LABEL: &str = "banlieue.io/provider";
pub const FAILURE_DOMAIN_LABEL: &str = "banlieue.io/failure-domain";

/// Candidates for one VM, and why the others were left out (for the condition message).
pub struct Candidates {
    pub candidates: Domains,
    pub excluded: Vec<String>,
    /// Left out because the VM's placement does not select them (`providerRef`, selectors):
    /// what it asked for, so not in its condition; `placement explain` shows them.
    pub unselected: Vec<String>,
}

fn selector(s: &Option<LabelSelector>) -> Result<Option<Selector>, String> {
    match s {
        None => Ok(None),
        Some(s) => Selector::try_from(s.clone()).map(Some).map_err(|e| format!("invalid selector: {e}")),
    }
}

/// The labels of one failure domain of one Provider, as selectors and topology keys see them.
fn domain_labels(provider: &str, fd: &FailureDomain) -> BTreeMap<String, String> {
    let mut labels = fd.labels.clone();
    labels.insert(PROVIDER_LABEL.into(), provider.to_string());
    labels.insert(FAILURE_DOMAIN_LABEL.into(), fd.name.clone());
    labels
}

/// One label of [`domain_labels`], without building them all.
fn domain_label<'a>(provider: &'a str, fd: &'a FailureDomain, key: &str) -> Option<&'a str> {
    match key {
        PROVIDER_LABEL => Some(provider),
        FAILURE_DOMAIN_LABEL => Some(&fd.name),
        _ => fd.labels.get(key).map(String::as_str),
    }
}

/// Every failure domain of `vm`'s namespace that satisfies its hard constraints.
/// `providers` are the namespace's Providers; `vms` every VM this process knows.
///
/// `image_classes` are the provider classes the VM's image has a source for.
/// With `require_ready` false, Providers whose probe currently fails still count
/// (to judge whether a running VM's placement still holds: a backend blip is no
/// reason to move a VM).
///
/// Texts, facts and groups of placed VMs are interned as they are met; the
/// placed VMs are indexed by (provider, failure domain) once, so the work grows
/// with domains + VMs, not their product.
pub fn candidates(
    vm: &VirtualMachine,
    class: &VMClass,
    image_classes: &BTreeSet<String>,
    providers: &[Arc<Provider>],
    vms: &[Arc<VirtualMachine>],
    require_ready: bool,
) -> Result<Candidates, String> {
    let namespace = vm.namespace().unwrap_or_default();
    let placement = vm.spec.placement.clone().unwrap_or_default();
    let provider_selector = selector(&placement.provider_selector)?;
    let domain_selector = selector(&placement.failure_domain_selector)?;
    let needs_storage: BTreeSet<&str> = class.spec.disks.iter().map(|d| d.storage_class.as_str()).collect();
    let needs_network: BTreeSet<&str> = class.spec.nics.iter().map(|n| n.network_class.as_str()).collect();
    let domain_count = providers.iter().filter_map(|p| p.status.as_ref()).map(|s| s.failure_domains.len()).sum();
    let mut b = DomainsBuilder::with_capacity(domain_count);

    // Every other placed VM of the namespace, its group interned, indexed by where it is.
    let placed: Vec<(&VirtualMachine, &Scheduled)> = vms
        .iter()
        .filter(|o| o.namespace().as_deref() == Some(namespace.as_str()) && o.uid() != vm.uid())
        .filter_map(|o| o.status.as_ref()?.scheduled.as_ref().map(|s| (o.as_ref(), s)))
        .collect();
    let mut here: HashMap<(&str, &str), Vec<u32>> = HashMap::new();
    for (o, s) in &placed {
        let group = b.group(&namespace, o.labels().iter().map(|(k, v)| (k.as_str(), v.as_str())));
        here.entry((s.provider.as_str(), s.failure_domain.as_str())).or_default().push(group);
    }

    // Required anti-affinity: per rule, the first matching VM holding each topology value.
    let rules: Vec<(Selector, &banlieue_api::vm::AntiAffinityRule)> = placement
        .anti_affinity
        .iter()
        .filter(|r| r.mode == AffinityMode::Required)
        .map(|r| Selector::try_from(r.label_selector.clone()).map(|s| (s, r)).map_err(|e| format!("invalid anti-affinity selector: {e}")))
        .collect::<Result<_, _>>()?;
    let mut held: Vec<HashMap<&str, &VirtualMachine>> = vec![HashMap::new(); rules.len()];
    if !rules.is_empty() {
        let mut domains: HashMap<(String, &str), &FailureDomain> = HashMap::new();
        for p in providers {
            for fd in p.status.as_ref().map(|s| s.failure_domains.as_slice()).unwrap_or_default() {
                domains.insert((p.name_any(), fd.name.as_str()), fd);
            }
        }
        for (o, s) in &placed {
            let Some(fd) = domains.get(&(s.provider.clone(), s.failure_domain.as_str())) else { continue };
            for ((sel, r), held) in rules.iter().zip(&mut held) {
                if let Some(value) = domain_label(&s.provider, fd, &r.topology_key).filter(|_| sel.matches(o.labels())) {
                    held.entry(value).or_insert(o);
                }
            }
        }
    }

    let (mut excluded, mut unselected) = (vec![], vec![]);
    for p in providers {
        let name = p.name_any();
        if placement.provider_ref.as_ref().is_some_and(|r| r.name != name) {
            unselected.push(format!("Provider {name} is not spec.placement.providerRef"));
            continue;
        }
        if provider_selector.as_ref().is_some_and(|s| !s.matches(p.labels())) {
            unselected.push(format!("Provider {name} does not match spec.placement.providerSelector"));
            continue;
        }
        if !image_classes.contains(&p.spec.provider_class_ref.name) {
            excluded.push(format!("the image has no source for Provider {name}'s class {:?}", p.spec.provider_class_ref.name));
            continue;
        }
        let Some(status) = p.status.as_ref() else {
            if require_ready {
                excluded.push(format!("Provider {name} is not ready (not probed yet)"));
            }
            continue;
        };
        if require_ready && !conditions::is_true(&status.conditions, READY) {
            let why = conditions::get(&status.conditions, READY).map(|c| c.reason.clone()).unwrap_or_else(|| "not probed yet".into());
            excluded.push(format!("Provider {name} is not ready ({why})"));
            continue;
        }
        let caps = &p.spec.capabilities;
        let provider = b.text(&format!("{namespace}/{name}"));
        for fd in &status.failure_domains {
            let at = format!("{name}/{}", fd.name);
            if domain_selector.as_ref().is_some_and(|s| !s.matches(&domain_labels(&name, fd))) {
                unselected.push(format!("{at} does not match spec.placement.failureDomainSelector"));
                continue;
            }
            let offered = |have: &[String], map: &BTreeMap<String, String>, need: &str| have.iter().any(|h| h == need) && map.contains_key(need);
            if let Some(missing) = needs_storage.iter().find(|c| !offered(&fd.storage_classes, &caps.storage_classes, c)) {
                excluded.push(format!("{at} offers no storage class {missing:?}"));
                continue;
            }
            if let Some(missing) = needs_network.iter().find(|c| !offered(&fd.network_classes, &caps.network_classes, c)) {
                excluded.push(format!("{at} offers no network class {missing:?}"));
                continue;
            }
            if let Some(missing) = class.spec.features.iter().find(|f| !fd.features.contains(f)) {
                excluded.push(format!("{at} lacks feature {missing:?}"));
                continue;
            }
            // Required anti-affinity: no matching VM may share this candidate's topology value.
            let conflict = rules.iter().zip(&held).find_map(|((_, r), held)| {
                let value = domain_label(&name, fd, &r.topology_key)?;
                held.get(value).map(|o| format!("{at} shares {}={value} with {} (required anti-affinity)", r.topology_key, o.name_any()))
            });
            if let Some(why) = conflict {
                excluded.push(why);
                continue;
            }
            let own = fd.labels.iter().filter(|(k, _)| *k != PROVIDER_LABEL && *k != FAILURE_DOMAIN_LABEL).map(|(k, v)| (k.as_str(), v.as_str()));
            let facts = b.facts(&p.spec.provider_class_ref.name, own, &fd.storage_classes, &fd.network_classes, &fd.features);
            let groups = here.get(&(name.as_str(), fd.name.as_str())).map(Vec::as_slice).unwrap_or_default();
            let capacity = Capacity { cpus: fd.capacity.cpus, memory_mib: fd.capacity.memory_mib, storage_gib: fd.capacity.storage_gib };
            let failure_domain = b.text(&fd.name);
            b.candidate(provider, failure_domain, facts, capacity, groups.len() as u32, groups.iter().copied());
        }
    }
    Ok(Candidates { candidates: b.build(), excluded, unselected })
}

/// The candidates where `image` can be used now, when there are any: a `url` image is
/// usable only on Providers it was imported into (for its source's checksum), so placement
/// prefers those. With none of them (the imports still running), every candidate stays: the
/// imagebuilder imports into each Provider of the class, and a VM placed before its Provider
/// has the image waits with `ImageNotReady`.
pub fn prefer_imported(mut candidates: Domains, image: &banlieue_api::VMImage) -> Domains {
    let usable = |c: banlieue_runtime::placement::CandidateRef<'_>| match image.source_for(c.provider_class()) {
        Some(src) if src.url.is_some() || src.is_built() => crate::placement::resolve::imported(image, c.provider(), src.checksum.as_deref()).is_ok(),
        _ => true,
    };
    if candidates.iter().any(usable) {
        candidates.retain(usable);
    }
    candidates
}

/// Is the VM's current placement still among the candidates?
pub fn still_valid(scheduled: &Scheduled, candidates: &Candidates, namespace: &str) -> bool {
    let provider = format!("{namespace}/{}", scheduled.provider);
    candidates.candidates.iter().any(|c| c.provider() == provider && c.failure_domain() == scheduled.failure_domain)
}

/// The placement request for `vm`.
pub fn request(vm: &VirtualMachine, class: &VMClass, parameters: &BTreeMap<String, serde_json::Value>) -> Request {
    let c = &class.spec;
    let uniq = |it: Vec<String>| it.into_iter().collect::<BTreeSet<_>>().into_iter().collect::<Vec<_>>();
    Request {
        vm_name: vm.name_any(),
        vm_namespace: vm.namespace().unwrap_or_default(),
        vm_labels: vm.labels().clone().into_iter().collect(),
        class: VmClass {
            name: class.name_any(),
            cpus: c.cpus,
            memory_mib: c.memory_mib,
            storage_gib: c.disks.iter().map(|d| d.size_gib).sum(),
            storage_classes: uniq(c.disks.iter().map(|d| d.storage_class.clone()).collect()),
            network_classes: uniq(c.nics.iter().map(|n| n.network_class.clone()).collect()),
            features: c.features.clone(),
        },
        parameters: serde_json::to_string(parameters).unwrap_or_else(|_| "{}".into()),
        anti_affinity: vm
            .spec
            .placement
            .as_ref()
            .map(|p| p.anti_affinity.iter().map(anti_affinity).collect())
            .unwrap_or_default(),
    }
}

fn anti_affinity(r: &banlieue_api::vm::AntiAffinityRule) -> AntiAffinity {
    let mut selector: Vec<SelectorRequirement> = r
        .label_selector
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| SelectorRequirement { key: k.clone(), op: SelectorOp::In, values: vec![v.clone()] })
        .collect();
    for e in r.label_selector.match_expressions.iter().flatten() {
        let op = match e.operator.as_str() {
            "In" => SelectorOp::In,
            "NotIn" => SelectorOp::NotIn,
            "Exists" => SelectorOp::Exists,
            _ => SelectorOp::DoesNotExist,
        };
        selector.push(SelectorRequirement { key: e.key.clone(), op, values: e.values.clone().unwrap_or_default() });
    }
    AntiAffinity {
        topology_key: r.topology_key.clone(),
        selector,
        required: r.mode == AffinityMode::Required,
        weight: r.weight.max(0) as u32,
    }
}

/// The candidate a placement component chose.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chosen {
    /// `namespace/name` of the Provider.
    pub provider: String,
    pub provider_class: String,
    pub failure_domain: String,
}

/// What the placement component chose, and why.
pub struct Decision {
    pub candidate: Chosen,
    /// The policy that chose (`spread` when none is named).
    pub policy: String,
    /// The policy's own words.
    pub why: String,
}

/// Let the placement policy `policy_ref` (or the built-in spread) choose among
/// `candidates`. `request` builds the request from the policy's parameters; `object`
/// names what is placed, for the component's log lines. A policy answering with
/// something that is not a candidate is refused (`InvalidDecision`).
pub async fn decide(
    ctx: &Context,
    policy_ref: Option<&NameRef>,
    request: impl FnOnce(&BTreeMap<String, serde_json::Value>) -> Request,
    candidates: &Domains,
    object: String,
) -> Result<Decision, Failure> {
    let (policy_name, policy, parameters) = match policy_ref {
        None => ("spread".to_string(), ctx.components.builtin_policy("spread").await, BTreeMap::new()),
        Some(r) => {
            let pp = Api::<PlacementPolicy>::all(ctx.client.clone())
                .get_opt(&r.name)
                .await
                .map(|o| o.filter(|o| ctx.options.installation.owns(&o.metadata)))
                .map_err(|e| api_failure(&e))?
                .ok_or_else(|| Failure::until_changed(Reason::PlacementPolicyNotFound, format!("PlacementPolicy {:?} not found", r.name)))?;
            (r.name.clone(), ctx.components.policy(&pp).await, pp.spec.parameters.clone())
        }
    };
    let policy = policy.map_err(|e| Failure::until_changed(Reason::PlacementPolicyNotReady, format!("PlacementPolicy {policy_name:?}: {e}")))?;
    let request = request(&parameters);
    let grants = crate::sandbox::grants::for_policy(&policy_name, object);
    let decision = ctx.call(&policy_name, "choose", policy.component.choose(&request, candidates, policy.limits, grants)).await.map_err(|e| {
        let failure = Failure::from(e).context(format!("placement policy {policy_name:?}"));
        // A policy that cannot decide leaves the VM with nowhere to go, whatever it said.
        if failure.reason == Reason::BackendUnavailable { Failure { reason: Reason::NoCandidates, ..failure } } else { failure }
    })?;
    // The runtime checked the index; a candidate list changed under us would be a bug here.
    let c = candidates
        .get(decision.candidate)
        .ok_or_else(|| Failure::until_changed(Reason::InvalidDecision, format!("placement policy {policy_name:?} chose candidate {}, which does not exist", decision.candidate)))?;
    let candidate = Chosen { provider: c.provider().into(), provider_class: c.provider_class().into(), failure_domain: c.failure_domain().into() };
    Ok(Decision { candidate, policy: policy_name, why: decision.reason })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn provider(name: &str, ready: bool, domains: Value) -> Arc<Provider> {
        Arc::new(crate::fixtures::provider("team", name, ready, domains))
    }

    #[test]
    fn placement_prefers_providers_that_have_a_url_image_imported() {
        use banlieue_api::class::{ImageImport, ImportPhase};
        let providers = [provider("a", true, json!([domain("a1", "z1", &[])])), provider("b", true, json!([domain("b1", "z2", &[])]))];
        let mut image: banlieue_api::VMImage = serde_json::from_value(json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": "os"},
            "spec": {"sources": [{"providerClass": "libvirt", "url": "https://images.example/os.qcow2",
                                  "checksum": "sha256:0000000000000000000000000000000000000000000000000000000000000001"}]}
        }))
        .unwrap();
        let vm: VirtualMachine = serde_json::from_value(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
            "metadata": {"name": "web", "namespace": "team"}, "spec": {"classRef": {"name": "small"}, "imageRef": {"name": "os"}}})).unwrap();
        let classes: BTreeSet<String> = ["libvirt".to_string()].into();
        let all = candidates(&vm, &class(&[]), &classes, &providers, &[], true).unwrap().candidates;
        let names = |c: &Domains| c.iter().map(|c| c.provider().to_string()).collect::<Vec<_>>();
        assert_eq!(names(&prefer_imported(all.clone(), &image)), ["team/a", "team/b"], "no import yet: every candidate");
        let import = |provider: &str, phase: ImportPhase, digest: &str| ImageImport {
            provider: provider.into(), phase, digest: Some(digest.into()), reference: Some("/pool/os".into()), message: None,
        };
        let sum = "sha256:0000000000000000000000000000000000000000000000000000000000000001";
        image.status = Some(banlieue_api::class::VMImageStatus {
            providers: vec![import("team/a", ImportPhase::Importing, sum), import("team/b", ImportPhase::Ready, sum)],
            ..Default::default()
        });
        assert_eq!(names(&prefer_imported(all.clone(), &image)), ["team/b"], "only where it is imported");
        image.status.as_mut().unwrap().providers[1].digest = Some("sha256:other".into());
        assert_eq!(names(&prefer_imported(all, &image)), ["team/a", "team/b"], "an import of another checksum does not count");
    }

    fn domain(name: &str, zone: &str, features: &[&str]) -> Value {
        json!({"name": name, "labels": {"zone": zone}, "capacity": {"cpus": 8, "memoryMiB": 16384, "storageGiB": 100},
               "storageClasses": ["fast"], "networkClasses": ["lan"], "features": features})
    }

    fn class(features: &[&str]) -> VMClass {
        serde_json::from_value(json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": "small"},
            "spec": {"cpus": 2, "memoryMiB": 2048, "features": features,
                     "disks": [{"name": "root", "sizeGiB": 10, "storageClass": "fast"}, {"name": "data", "sizeGiB": 5, "storageClass": "fast"}],
                     "nics": [{"name": "eth0", "networkClass": "lan"}]}
        }))
        .expect("class")
    }

    fn vm(name: &str, labels: Value, placement: Value, scheduled: Option<(&str, &str)>) -> Arc<VirtualMachine> {
        let mut v = json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
            "metadata": {"name": name, "namespace": "team", "uid": format!("uid-{name}"), "labels": labels},
            "spec": {"classRef": {"name": "small"}, "imageRef": {"name": "debian"}, "placement": placement}
        });
        if let Some((p, fd)) = scheduled {
            v["status"] = json!({"scheduled": {"provider": p, "failureDomain": fd, "providerClass": "libvirt"}});
        }
        Arc::new(serde_json::from_value(v).expect("vm"))
    }

    fn libvirt() -> BTreeSet<String> {
        BTreeSet::from(["libvirt".to_string()])
    }

    fn names(c: &Candidates) -> Vec<String> {
        c.candidates.iter().map(|c| format!("{}/{}", c.provider(), c.failure_domain())).collect()
    }

    #[test]
    fn hard_constraints_filter_and_say_why() {
        let providers = [
            provider("a", true, json!([domain("a1", "z1", &["gpu"]), domain("a2", "z2", &[])])),
            provider("b", false, json!([domain("b1", "z1", &["gpu"])])),
        ];
        let me = vm("web", json!({}), json!({}), None);
        let found = candidates(&me, &class(&["gpu"]), &libvirt(), &providers, &[me.clone()], true).unwrap();
        assert_eq!(names(&found), ["team/a/a1"]);
        assert!(found.excluded.iter().any(|w| w == "a/a2 lacks feature \"gpu\""), "{:?}", found.excluded);
        assert!(found.excluded.iter().any(|w| w.starts_with("Provider b is not ready")), "{:?}", found.excluded);
        // A backend blip is no reason to move a running VM: without `require_ready`, b counts.
        let holding = candidates(&me, &class(&["gpu"]), &libvirt(), &providers, &[], false).unwrap();
        assert_eq!(names(&holding), ["team/a/a1", "team/b/b1"]);
        // No image source for the class: nothing, with the reason.
        let none = candidates(&me, &class(&[]), &BTreeSet::new(), &providers, &[], true).unwrap();
        assert!(none.candidates.is_empty() && none.excluded.iter().all(|w| w.contains("no source")), "{:?}", none.excluded);
    }

    #[test]
    fn selectors_and_provider_ref_narrow_the_choice() {
        let providers = [provider("a", true, json!([domain("a1", "z1", &[]), domain("a2", "z2", &[])])), provider("b", true, json!([domain("b1", "z1", &[])]))];
        let by_ref = vm("web", json!({}), json!({"providerRef": {"name": "b"}}), None);
        assert_eq!(names(&candidates(&by_ref, &class(&[]), &libvirt(), &providers, &[], true).unwrap()), ["team/b/b1"]);
        let by_zone = vm("web", json!({}), json!({"failureDomainSelector": {"matchLabels": {"zone": "z2"}}}), None);
        assert_eq!(names(&candidates(&by_zone, &class(&[]), &libvirt(), &providers, &[], true).unwrap()), ["team/a/a2"]);
        let by_site = vm("web", json!({}), json!({"providerSelector": {"matchLabels": {"site": "a"}}}), None);
        assert_eq!(names(&candidates(&by_site, &class(&[]), &libvirt(), &providers, &[], true).unwrap()), ["team/a/a1", "team/a/a2"]);
    }

    #[test]
    fn required_anti_affinity_excludes_a_shared_topology_value() {
        let providers = [provider("a", true, json!([domain("a1", "z1", &[]), domain("a2", "z1", &[]), domain("a3", "z2", &[])]))];
        let rule = json!({"antiAffinity": [{"topologyKey": "zone", "labelSelector": {"matchLabels": {"app": "db"}}, "mode": "Required"}]});
        let me = vm("db-1", json!({"app": "db"}), rule, None);
        let other = vm("db-0", json!({"app": "db"}), json!({}), Some(("a", "a1")));
        let unrelated = vm("web", json!({"app": "web"}), json!({}), Some(("a", "a3")));
        let found = candidates(&me, &class(&[]), &libvirt(), &providers, &[me.clone(), other, unrelated], true).unwrap();
        assert_eq!(names(&found), ["team/a/a3"], "z1 holds db-0: both of its domains are out");
        assert!(found.excluded.iter().any(|w| w.contains("shares zone=z1 with db-0")), "{:?}", found.excluded);
        let a3 = found.candidates.get(0).unwrap();
        assert_eq!((a3.vm_count(), a3.placed().map(|(_, n)| n).sum::<u32>()), (1, 1), "the web VM is counted where it is");
        assert!(still_valid(&Scheduled { provider: "a".into(), failure_domain: "a3".into(), ..Default::default() }, &found, "team"));
        assert!(!still_valid(&Scheduled { provider: "a".into(), failure_domain: "a1".into(), ..Default::default() }, &found, "team"));
    }

    #[test]
    fn placed_vms_are_counted_where_they_are_and_shared_facts_passed_once() {
        let providers = [provider("a", true, json!([domain("a1", "z1", &[]), domain("a2", "z1", &[]), domain("a3", "z2", &["gpu"])]))];
        let me = vm("web-9", json!({"app": "web"}), json!({}), None);
        let placed = [
            vm("web-0", json!({"app": "web"}), json!({}), Some(("a", "a1"))),
            vm("web-1", json!({"app": "web"}), json!({}), Some(("a", "a1"))),
            vm("db-0", json!({"app": "db"}), json!({}), Some(("a", "a1"))),
            vm("web-2", json!({"app": "web"}), json!({}), Some(("a", "a3"))),
            vm("lost", json!({"app": "web"}), json!({}), Some(("gone", "x1"))),
        ];
        let vms: Vec<_> = placed.iter().cloned().chain([me.clone()]).collect();
        let found = candidates(&me, &class(&[]), &libvirt(), &providers, &vms, true).unwrap();
        let d = &found.candidates;
        // Per domain: `name vm-count app=count…`.
        let by_domain: Vec<String> = d
            .iter()
            .map(|c| {
                let mut placed: Vec<String> = c.placed().map(|(g, n)| format!("{}={n}", d.text(g.labels[0].value))).collect();
                placed.sort();
                format!("{} {} {}", c.failure_domain(), c.vm_count(), placed.join(","))
            })
            .collect();
        assert_eq!(by_domain, ["a1 3 db=1,web=2", "a2 0 ", "a3 1 web=1"]);
        // a1 and a2 share zone, classes and features; a3 has its own zone and a GPU.
        assert_eq!(d.wire().facts.len(), 2);
        assert_eq!(d.wire().groups.len(), 2, "two label sets among the placed VMs");
    }

    #[test]
    fn the_request_sums_disks_and_lists_each_class_once() {
        let me = vm("web", json!({"tier": "gold"}), json!({"antiAffinity": [{"topologyKey": "zone", "labelSelector": {"matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["dev"]}]}, "mode": "Preferred", "weight": 50}]}), None);
        let r = request(&me, &class(&[]), &BTreeMap::from([("weights".to_string(), json!({"spread": 2}))]));
        assert_eq!((r.class.cpus, r.class.memory_mib, r.class.storage_gib), (2, 2048, 15));
        assert_eq!(r.class.storage_classes, ["fast"]);
        assert_eq!(r.parameters, r#"{"weights":{"spread":2}}"#);
        let rule = &r.anti_affinity[0];
        assert!(!rule.required && rule.weight == 50 && rule.topology_key == "zone");
        assert_eq!(rule.selector.len(), 2);
        assert!(matches!(rule.selector[1].op, SelectorOp::NotIn) && rule.selector[1].values == ["dev"]);
    }
}
