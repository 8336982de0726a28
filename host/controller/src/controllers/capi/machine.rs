//! Binding a `<Kind>Machine` CAPI made from a `<Kind>MachineTemplate` (role
//! `controller`). CAPI copies the template's `spec.template.spec` — a class and an
//! image, no Provider — and owns the copy by a `Machine`. Per CAPI's "Contract rules
//! for InfraMachine" (v1beta2), banlieue then:
//!
//! 1. leaves it alone while paused (`Cluster.spec.paused`, `cluster.x-k8s.io/paused`),
//!    saying so in a `Paused` condition;
//! 2. waits for the owner `Machine` and its `spec.bootstrap.dataSecretName` (the
//!    bootstrap provider's Secret, keys `value` and `format`);
//! 3. places it: in the failure domain CAPI chose (`Machine.spec.failureDomain`, or the
//!    machine's own `spec.failureDomain`), which must be one its cluster lists; else
//!    through the placement policy across the cluster's domains — control-plane
//!    machines only in domains marked `controlPlane`;
//! 4. writes `spec.providerRef`, `spec.failureDomain` (the cluster's name of the domain)
//!    and `spec.vm` (class and image resolved for that Provider, the bootstrap Secret as
//!    user-data, the template's `spec.network` as the NICs' addresses — those from IP pools
//!    claimed first, the machine waiting `WaitingForIPAddress` until every pool answered). From there [`crate::controllers::machine`] realises it like any other machine and
//!    reports `providerID`, `addresses`, `initialization.provisioned` and `Ready`.
//!
//! Anything missing or wrong is a `Ready=False` condition naming it (CAPI mirrors it on
//! the Machine) and nothing is created.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use banlieue_api::common::{NameRef, SecretKeyRef, StaticIp};
use banlieue_api::infra::{ClusterFailureDomain, InfraClusterStatus, InfraMachineSpec, InfraMachineStatus, UserDataFormat};
use banlieue_api::vm::{Scheduled, VirtualMachineSpec, VirtualMachineStatus};
use banlieue_api::{Provider, VMClass, VMImage, VirtualMachine};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use super::cluster::{BACKEND_DOMAIN_ATTRIBUTE, PROVIDER_ATTRIBUTE};
use super::contract::{self, cluster_of, paused, str_at, CONTROL_PLANE_LABEL, PAUSED_CONDITION};
use crate::addressing::{self, ipam};
use crate::failure::{api_failure, Failure};
use crate::framework::reconciler::{dynamic_controller, Frame, Outcome};
use crate::placement::{resolve, scheduling};
use crate::status::conditions::{self, READY};
use crate::status::reasons::Reason;
use crate::{status, Context, Error};

/// What a machine waits for in the normal course of things (Normal events, not failures).
const WAITING: [Reason; 5] =
    [Reason::WaitingForOwner, Reason::WaitingForBootstrapData, Reason::WaitingForCluster, Reason::WaitingForClusterInfrastructure, Reason::WaitingForIPAddress];

/// The label on the IP address claims made for a machine: its name.
pub const MACHINE_LABEL: &str = "banlieue.io/machine";

/// The bootstrap Secret's keys, per CAPI's bootstrap contract.
pub const BOOTSTRAP_VALUE_KEY: &str = "value";
pub const BOOTSTRAP_FORMAT_KEY: &str = "format";

/// What every reconcile of this controller shares.
struct Shared {
    ctx: Arc<Context>,
    frame: Frame<DynamicObject>,
    resource: ApiResource,
    /// Wakes a machine's reconcile (its claims' IPAM provider answered).
    wake: futures::channel::mpsc::UnboundedSender<ObjectRef<DynamicObject>>,
    /// The watch on the machines' IP address claims.
    claims: ipam::ClaimWatch,
}

/// Bind every `<prefix>Machine` CAPI creates, until `stop`.
pub async fn reconcile_kind(ctx: Arc<Context>, prefix: String, stop: impl Future<Output = ()> + Send + Sync + 'static) {
    let resource = crate::framework::infra_kinds::machine_resource(&prefix);
    // Only machines CAPI made: it labels each with its cluster's name (VM-made machines, most
    // of them, are neither cached nor reconciled here).
    let (controller, store, frame) = dynamic_controller(&ctx, "capimachine", &resource, Some(contract::CLUSTER_NAME_LABEL));
    let (wake, woken) = futures::channel::mpsc::unbounded();
    let kind = Arc::new(Shared { ctx: ctx.clone(), frame, resource: resource.clone(), wake, claims: ipam::ClaimWatch::default() });
    let (by_machine, by_cluster) = (store.clone(), store.clone());
    let (r1, r2) = (resource.clone(), resource.clone());
    controller
        .reconcile_on(woken)
        // The owner Machine appears, gets its bootstrap data or a failure domain.
        .watches_stream_with(
            contract::changes(&ctx, contract::machine_resource()),
            move |m: DynamicObject| {
                let name = str_at(&m, "/spec/infrastructureRef/name").map(str::to_string);
                let kind = str_at(&m, "/spec/infrastructureRef/kind").map(str::to_string);
                let found = (kind.as_deref() == Some(r1.kind.as_str())).then(|| by_machine.get(&ObjectRef::new_with(name.as_deref().unwrap_or_default(), r1.clone()).within(&m.namespace().unwrap_or_default())));
                found.flatten().map(|im| ObjectRef::from_obj_with(&*im, r1.clone()))
            },
            contract::machine_resource(),
        )
        // Pausing and unpausing is on the Cluster.
        .watches_stream_with(
            contract::changes(&ctx, contract::cluster_resource()),
            move |c: DynamicObject| contract::of_cluster(&by_cluster, &c, &r2),
            contract::cluster_resource(),
        )
        .graceful_shutdown_on(stop)
        .run(reconcile, |m, err, kind| kind.frame.error_policy(&m, err), kind)
        .for_each(crate::framework::reconciler::log_run("capi-machine"))
        .await;
}

async fn reconcile(m: Arc<DynamicObject>, kind: Arc<Shared>) -> Result<Action, Error> {
    kind.frame.reconcile(&m, reconcile_inner(&m, &kind)).await
}

fn spec(m: &DynamicObject) -> Result<InfraMachineSpec, serde_json::Error> {
    serde_json::from_value(m.data.get("spec").cloned().unwrap_or_default())
}

async fn reconcile_inner(m: &DynamicObject, kind: &Shared) -> Result<Outcome, Error> {
    let ctx = &kind.ctx;
    // Bound machines (VM-made ones always are) are the provider role's; a machine
    // being deleted before it was bound has nothing on a backend.
    let Ok(spec) = spec(m) else { return Ok(Outcome::AwaitChange) };
    if spec.provider_ref.is_some() || m.metadata.deletion_timestamp.is_some() {
        return Ok(Outcome::AwaitChange);
    }
    let ns = m.namespace().unwrap_or_default();
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &kind.resource);
    let old: InfraMachineStatus = m.data.get("status").cloned().and_then(|s| serde_json::from_value(s).ok()).unwrap_or_default();
    let mut st = old.clone();
    let generation = m.metadata.generation;
    let cluster = cluster_of(&ctx.client, m).await?;
    if let Some(why) = paused(cluster.as_ref(), m) {
        conditions::set(&mut st.conditions, PAUSED_CONDITION, true, Reason::Paused, why, generation);
        status::write(&api, &m.name_any(), Some(&old), &st).await?;
        return Ok(Outcome::AwaitChange);
    }
    if contract::cluster_name(m).is_some() {
        conditions::set(&mut st.conditions, PAUSED_CONDITION, false, Reason::NotPaused, "", generation);
    }
    let outcome = match bind(kind, m, &spec, cluster.as_ref()).await {
        Ok(bound) => {
            // The status first: once the spec names a Provider the provider role owns the
            // conditions, and it must see this write before it writes its own.
            conditions::set(&mut st.conditions, READY, false, Reason::Scheduled, bound.message.clone(), generation);
            status::write(&api, &m.name_any(), Some(&old), &st).await?;
            api.patch(&m.name_any(), &PatchParams::default(), &Patch::Merge(serde_json::json!({ "spec": bound.patch }))).await?;
            ctx.event(&m.object_ref(&kind.resource), false, Reason::Scheduled, "Schedule", bound.message).await;
            return Ok(Outcome::AwaitChange);
        }
        Err(Failure { reason, message, retry }) => {
            let changed = conditions::set(&mut st.conditions, READY, false, reason, message.clone(), generation);
            // A terminal failure, for v1beta1 readers too (cleared once the machine is Ready).
            if !retry && !WAITING.contains(&reason) {
                st.deprecated = Some(contract::v1beta1_failure(format!("{reason}: {message}")));
            }
            if changed {
                ctx.event(&m.object_ref(&kind.resource), !WAITING.contains(&reason), reason, "Schedule", message).await;
            }
            if retry { Outcome::Retry } else { Outcome::AwaitChange }
        }
    };
    status::write(&api, &m.name_any(), Some(&old), &st).await?;
    Ok(outcome)
}

/// What binding writes into the machine's spec, and the condition message saying where.
struct Bound {
    patch: serde_json::Value,
    message: String,
}

/// Everything a CAPI machine needs before it can be realised; the first thing
/// missing is the failure.
async fn bind(kind: &Shared, m: &DynamicObject, spec: &InfraMachineSpec, cluster: Option<&DynamicObject>) -> Result<Bound, Failure> {
    let (ctx, resource) = (&*kind.ctx, &kind.resource);
    let ns = m.namespace().unwrap_or_default();
    let owner = contract::owner(m, "Machine").ok_or_else(|| Failure::until_changed(Reason::WaitingForOwner, "waiting for CAPI to set the owner Machine".to_string()))?;
    let machines: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &contract::machine_resource());
    let machine = machines
        .get_opt(&owner.name)
        .await
        .map_err(|e| api_failure(&e))?
        .ok_or_else(|| Failure::transient(Reason::WaitingForOwner, format!("owner Machine {:?} not found", owner.name)))?;
    let data_secret = str_at(&machine, "/spec/bootstrap/dataSecretName")
        .ok_or_else(|| Failure::until_changed(Reason::WaitingForBootstrapData, format!("waiting for Machine {:?} to get spec.bootstrap.dataSecretName from its bootstrap provider", owner.name)))?
        .to_string();

    // The template's class and image (checked before anything else is looked up, so a bad
    // template says so at once).
    let class_ref = spec.class_ref.as_ref().ok_or_else(|| Failure::until_changed(Reason::InvalidSpec, "spec.classRef is required for machines made from a template".to_string()))?;
    let image_ref = spec.image_ref.as_ref().ok_or_else(|| Failure::until_changed(Reason::InvalidSpec, "spec.imageRef is required for machines made from a template".to_string()))?;
    let class = Api::<VMClass>::all(ctx.client.clone())
        .get_opt(&class_ref.name)
        .await
        .map(|o| o.filter(|o| ctx.options.installation.owns(&o.metadata)))
        .map_err(|e| api_failure(&e))?
        .ok_or_else(|| Failure::transient(Reason::ClassNotFound, format!("VMClass {:?} (spec.classRef) not found", class_ref.name)))?;
    let image = Api::<VMImage>::all(ctx.client.clone())
        .get_opt(&image_ref.name)
        .await
        .map(|o| o.filter(|o| ctx.options.installation.owns(&o.metadata)))
        .map_err(|e| api_failure(&e))?
        .ok_or_else(|| Failure::transient(Reason::ImageNotFound, format!("VMImage {:?} (spec.imageRef) not found", image_ref.name)))?;
    let format = bootstrap_format(ctx, &ns, &data_secret).await?;
    let addressing = addresses(kind, m, spec, &class).await?;

    let domains = cluster_failure_domains(ctx, &ns, cluster).await?;
    let wanted = spec.failure_domain.clone().or_else(|| str_at(&machine, "/spec/failureDomain").map(str::to_string));
    let providers: Vec<Arc<Provider>> = Api::<Provider>::namespaced(ctx.client.clone(), &ns)
        .list(&ctx.options.installation.list())
        .await
        .map_err(|e| api_failure(&e))?
        .items
        .into_iter()
        .map(Arc::new)
        .collect();
    let (domain, how) = match wanted {
        Some(name) => {
            let d = domains.iter().find(|d| d.name == name).ok_or_else(|| {
                let known: Vec<&str> = domains.iter().map(|d| d.name.as_str()).collect();
                Failure::transient(Reason::FailureDomainNotFound, format!("failure domain {name:?} is not one of the cluster's ({})", known.join(", ")))
            })?;
            (d.clone(), "as CAPI chose".to_string())
        }
        None => {
            let control_plane = m.labels().contains_key(CONTROL_PLANE_LABEL);
            place(ctx, m, resource, &class, &image, &domains, &providers, control_plane).await?
        }
    };
    let provider_name = domain.attributes.get(PROVIDER_ATTRIBUTE).cloned().unwrap_or_default();
    let backend_domain = domain.attributes.get(BACKEND_DOMAIN_ATTRIBUTE).cloned().unwrap_or_default();
    let provider = providers
        .iter()
        .find(|p| p.name_any() == provider_name)
        .ok_or_else(|| Failure::transient(Reason::ProviderNotFound, format!("Provider {provider_name:?} of failure domain {:?} not found", domain.name)))?;
    let provider_class = provider.spec.provider_class_ref.name.clone();
    // Bound once: the binder does not come back to a machine it has bound.
    let mut vm = resolve::machine_vm(&class, Some(&image), provider, &provider_class, None)?;
    vm.user_data = Some(SecretKeyRef { name: data_secret.clone(), key: BOOTSTRAP_VALUE_KEY.into() });
    vm.user_data_format = Some(format);
    vm.failure_domain = Some(backend_domain);
    vm.nics = addressing::addressed(vm.nics, &addressing);
    let patch = serde_json::json!({
        "providerRef": NameRef { name: provider_name.clone() },
        "failureDomain": domain.name,
        "vm": vm,
    });
    Ok(Bound { patch, message: format!("bound to Provider {provider_name}, failure domain {} ({how}); bootstrap data from Secret {data_secret:?}", domain.name) })
}

/// The machine's addressing (`spec.network`, from its template), checked against the class;
/// addresses from pools claimed (claims owned by the machine, so the garbage collector
/// releases them once the machine and its backend VM are gone) — the machine stays unbound
/// until every pool has answered (the claims' watch brings it back).
async fn addresses(kind: &Shared, m: &DynamicObject, spec: &InfraMachineSpec, class: &VMClass) -> Result<BTreeMap<String, StaticIp>, Failure> {
    let network = spec.network.as_ref();
    addressing::check(network, class).map_err(|msg| Failure::until_changed(Reason::InvalidNetwork, msg))?;
    let (name, ns) = (m.name_any(), m.namespace().unwrap_or_default());
    let wanted = ipam::wanted(&name, network);
    let mut allocated = Vec::new();
    if !wanted.is_empty() {
        let (wake, resource) = (kind.wake.clone(), kind.resource.clone());
        kind.claims
            .start(&kind.ctx, &ns, MACHINE_LABEL, move |machine, ns| wake.unbounded_send(ObjectRef::new_with(machine, resource.clone()).within(ns)).is_ok())
            .await?;
        let owner = m.controller_owner_ref(&kind.resource).ok_or_else(|| Failure::until_changed(Reason::Internal, "the machine has no uid"))?;
        let mut labels = BTreeMap::from([(MACHINE_LABEL.to_string(), name)]);
        kind.ctx.options.installation.mark(&mut labels);
        allocated = ipam::claim(&kind.ctx.client, &ns, &owner, &labels, &wanted)
            .await
            .map_err(|e| api_failure(&e))?
            .map_err(|why| Failure::until_changed(Reason::WaitingForIPAddress, why))?;
    }
    addressing::resolve(network, &allocated).map_err(|msg| Failure::until_changed(Reason::InvalidNetwork, msg))
}

/// The bootstrap Secret's `format` (cloud-config when absent), after checking it has a `value`.
async fn bootstrap_format(ctx: &Context, ns: &str, name: &str) -> Result<UserDataFormat, Failure> {
    let secret = Api::<Secret>::namespaced(ctx.client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(|e| api_failure(&e))?
        .ok_or_else(|| Failure::transient(Reason::WaitingForBootstrapData, format!("bootstrap Secret {name:?} not found yet")))?;
    let key = |k: &str| secret.data.as_ref().and_then(|d| d.get(k)).map(|b| b.0.clone()).or_else(|| secret.string_data.as_ref().and_then(|d| d.get(k)).map(|s| s.clone().into_bytes()));
    if key(BOOTSTRAP_VALUE_KEY).is_none_or(|v| v.is_empty()) {
        return Err(Failure::transient(Reason::InvalidBootstrapData, format!("bootstrap Secret {name:?} has no key {BOOTSTRAP_VALUE_KEY:?}")));
    }
    match key(BOOTSTRAP_FORMAT_KEY).as_deref() {
        None | Some(b"cloud-config") => Ok(UserDataFormat::CloudConfig),
        Some(b"ignition") => Ok(UserDataFormat::Ignition),
        Some(other) => Err(Failure::transient(Reason::InvalidBootstrapData, format!("bootstrap Secret {name:?} has format {:?}; banlieue takes cloud-config or ignition", String::from_utf8_lossy(other)))),
    }
}

/// The failure domains the cluster's `<Kind>Cluster` lists (`Cluster.spec.infrastructureRef`).
async fn cluster_failure_domains(ctx: &Context, ns: &str, cluster: Option<&DynamicObject>) -> Result<Vec<ClusterFailureDomain>, Failure> {
    let cluster = cluster.ok_or_else(|| Failure::transient(Reason::WaitingForCluster, "waiting for the CAPI Cluster named by label cluster.x-k8s.io/cluster-name".to_string()))?;
    let (Some(group), Some(kind), Some(name)) = (
        str_at(cluster, "/spec/infrastructureRef/apiGroup"),
        str_at(cluster, "/spec/infrastructureRef/kind"),
        str_at(cluster, "/spec/infrastructureRef/name"),
    ) else {
        return Err(Failure::transient(Reason::WaitingForClusterInfrastructure, format!("Cluster {:?} has no spec.infrastructureRef yet", cluster.name_any())));
    };
    if group != banlieue_api::infra::INFRA_GROUP {
        return Err(Failure::until_changed(Reason::InvalidSpec, format!("Cluster {:?} has its infrastructure in {group}, not banlieue", cluster.name_any())));
    }
    let prefix = kind.strip_suffix("Cluster").unwrap_or(kind);
    let resource = crate::framework::infra_kinds::cluster_resource(prefix);
    let infra = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), ns, &resource)
        .get_opt(name)
        .await
        .map_err(|e| api_failure(&e))?
        .ok_or_else(|| Failure::transient(Reason::WaitingForClusterInfrastructure, format!("{kind} {name:?} not found")))?;
    let st: InfraClusterStatus = infra.data.get("status").cloned().and_then(|s| serde_json::from_value(s).ok()).unwrap_or_default();
    if st.failure_domains.is_empty() {
        return Err(Failure::transient(Reason::WaitingForClusterInfrastructure, format!("{kind} {name:?} lists no failure domains yet")));
    }
    Ok(st.failure_domains)
}

/// The cluster's failure domain that is `failure_domain` of Provider `provider`
/// (`namespace/name`), if the cluster has it — and, for a control-plane machine, only one
/// the cluster allows control planes in.
fn cluster_domain<'a>(domains: &'a [ClusterFailureDomain], ns: &str, provider: &str, failure_domain: &str, control_plane: bool) -> Option<&'a ClusterFailureDomain> {
    domains.iter().find(|d| {
        format!("{ns}/{}", d.attributes.get(PROVIDER_ATTRIBUTE).map(String::as_str).unwrap_or_default()) == provider
            && d.attributes.get(BACKEND_DOMAIN_ATTRIBUTE).map(String::as_str) == Some(failure_domain)
            && (!control_plane || d.control_plane == Some(true))
    })
}

/// Let the placement policy (the class's, else spread) choose among the cluster's
/// failure domains, counting the cluster's machines already placed.
async fn place(
    ctx: &Context,
    m: &DynamicObject,
    resource: &ApiResource,
    class: &VMClass,
    image: &VMImage,
    domains: &[ClusterFailureDomain],
    providers: &[Arc<Provider>],
    control_plane: bool,
) -> Result<(ClusterFailureDomain, String), Failure> {
    let ns = m.namespace().unwrap_or_default();
    // The machine and its placed siblings, as the scheduler sees VMs.
    let as_vm = |o: &DynamicObject, scheduled: Option<Scheduled>| {
        let mut vm = VirtualMachine::new(&o.name_any(), VirtualMachineSpec { class_ref: NameRef { name: class.name_any() }, ..Default::default() });
        vm.metadata.namespace = Some(ns.clone());
        vm.metadata.uid = o.uid();
        vm.metadata.labels = o.metadata.labels.clone();
        vm.status = scheduled.map(|s| VirtualMachineStatus { scheduled: Some(s), ..Default::default() });
        vm
    };
    let me = as_vm(m, None);
    let siblings = match contract::cluster_name(m) {
        Some(cluster) => {
            let lp = kube::api::ListParams::default().labels(&format!("{}={cluster}", contract::CLUSTER_NAME_LABEL));
            Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &ns, resource).list(&lp).await.map_err(|e| api_failure(&e))?.items
        }
        None => vec![],
    };
    let placed: Vec<Arc<VirtualMachine>> = siblings
        .iter()
        .filter_map(|o| {
            let s = spec(o).ok()?;
            let failure_domain = s.backend_failure_domain()?.to_string();
            let scheduled = Scheduled { provider: s.provider_ref?.name, failure_domain, ..Default::default() };
            Some(Arc::new(as_vm(o, Some(scheduled))))
        })
        .collect();
    let image_classes: BTreeSet<String> = image.spec.sources.iter().map(|s| s.provider_class.clone()).collect();
    let found = scheduling::candidates(&me, class, &image_classes, providers, &placed, true).map_err(|e| Failure::until_changed(Reason::InvalidPlacement, e))?;
    let allowed = |provider: &str, failure_domain: &str| cluster_domain(domains, &ns, provider, failure_domain, control_plane);
    let mut candidates = found.candidates;
    candidates.retain(|c| allowed(c.provider(), c.failure_domain()).is_some());
    let candidates = scheduling::prefer_imported(candidates, image);
    if candidates.is_empty() {
        let what = if control_plane { "control-plane " } else { "" };
        let mut message = format!("none of the cluster's {what}failure domains can host this machine");
        if !found.excluded.is_empty() {
            message.push_str(&format!(": {}", found.excluded.join("; ")));
        }
        return Err(Failure::transient(Reason::NoCandidates, message));
    }
    let request = |parameters: &std::collections::BTreeMap<String, serde_json::Value>| scheduling::request(&me, class, parameters);
    let decision = scheduling::decide(ctx, class.spec.placement_policy_ref.as_ref(), request, &candidates, crate::key(m)).await?;
    let domain = allowed(&decision.candidate.provider, &decision.candidate.failure_domain).cloned().ok_or_else(|| Failure::transient(Reason::Internal, "the placement decision is not a cluster domain".to_string()))?;
    Ok((domain, format!("by {}: {}", decision.policy, decision.why)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn domain(name: &str, provider: &str, backend_domain: &str, control_plane: bool) -> ClusterFailureDomain {
        serde_json::from_value(serde_json::json!({
            "name": name, "controlPlane": control_plane,
            "attributes": {PROVIDER_ATTRIBUTE: provider, BACKEND_DOMAIN_ATTRIBUTE: backend_domain}
        }))
        .expect("failure domain")
    }

    #[test]
    fn a_machine_goes_only_to_the_clusters_domains_and_a_control_plane_only_where_allowed() {
        let domains = [domain("kvm-a-rack1", "kvm-a", "rack1", true), domain("kvm-b-rack2", "kvm-b", "rack2", false)];
        let name = |d: Option<&ClusterFailureDomain>| d.map(|d| d.name.clone());
        assert_eq!(name(cluster_domain(&domains, "team", "team/kvm-a", "rack1", false)), Some("kvm-a-rack1".into()));
        assert_eq!(name(cluster_domain(&domains, "team", "team/kvm-b", "rack2", false)), Some("kvm-b-rack2".into()));
        assert_eq!(name(cluster_domain(&domains, "team", "team/kvm-b", "rack2", true)), None, "no control planes there");
        assert_eq!(name(cluster_domain(&domains, "team", "team/kvm-a", "rack2", false)), None, "a domain of another Provider");
        assert_eq!(name(cluster_domain(&domains, "team", "other/kvm-a", "rack1", false)), None, "a Provider of another namespace");
        assert_eq!(name(cluster_domain(&domains, "team", "team/kvm-c", "rack1", false)), None, "a Provider the cluster does not select");
    }
}
