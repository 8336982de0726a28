//! `<Kind>Cluster`, per CAPI's "Contract rules for InfraCluster" (v1beta2):
//!
//! 1. one labelled `cluster.x-k8s.io/managed-by` is managed by someone else: left alone;
//! 2. wait for the owner `Cluster` CAPI sets;
//! 3. paused (`Cluster.spec.paused` or the `cluster.x-k8s.io/paused` annotation):
//!    `Paused=True` and nothing else;
//! 4. `status.failureDomains`, the v1beta2 list: one entry per failure domain of each
//!    selected Provider, named `<provider>/<domain>` (unique across Providers), with
//!    `controlPlane` from `spec.controlPlaneSelector` and the domain's labels as
//!    `attributes`; at most 100, as the contract allows;
//! 5. `spec.controlPlaneEndpoint` is the user's or the control-plane provider's to set;
//!    the cluster is provisioned once it is set and a failure domain exists:
//!    `status.initialization.provisioned`, and `status.ready` for v1beta1 readers;
//! 6. annotated `cluster.x-k8s.io/managed-by: k0smotron`, k0smotron writes
//!    `spec.controlPlaneEndpoint` and the v1beta1 `status.ready` itself (hosted control
//!    planes): banlieue leaves `status.ready` alone and still writes the failure domains,
//!    `initialization.provisioned` (which v1beta2 CAPI reads) and its conditions.

use std::collections::BTreeMap;
use std::sync::Arc;

use banlieue_api::common::Initialization;
use banlieue_api::infra::{ClusterFailureDomain, InfraClusterSpec, InfraClusterStatus};
use banlieue_api::Provider;
use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::{Selector, SelectorExt};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use super::contract::{self, cluster_of, paused, MANAGED_BY, PAUSED_CONDITION};
use crate::framework::reconciler::{dynamic_controller, Frame, Outcome};
use crate::placement::scheduling::{FAILURE_DOMAIN_LABEL, PROVIDER_LABEL};
use crate::status::conditions::{self, READY};
use crate::status::reasons::Reason;
use crate::{status, Context, Error};

/// The `cluster.x-k8s.io/managed-by` annotation value of clusters whose control plane
/// k0smotron hosts.
pub const K0SMOTRON: &str = "k0smotron";
/// The contract's limit on `status.failureDomains`.
pub const MAX_FAILURE_DOMAINS: usize = 100;
/// The attributes of a cluster failure domain naming its Provider, the Provider's own
/// name of the domain, and the Provider's class (a machine placed there is bound by them).
pub const PROVIDER_ATTRIBUTE: &str = PROVIDER_LABEL;
pub const BACKEND_DOMAIN_ATTRIBUTE: &str = FAILURE_DOMAIN_LABEL;
pub const PROVIDER_CLASS_ATTRIBUTE: &str = "banlieue.io/provider-class";

/// What every reconcile of this controller shares.
struct Shared {
    ctx: Arc<Context>,
    frame: Frame<DynamicObject>,
    resource: ApiResource,
}

/// Reconcile every `<prefix>Cluster` until `stop`.
pub async fn reconcile_kind(ctx: Arc<Context>, prefix: String, stop: impl Future<Output = ()> + Send + Sync + 'static) {
    let resource = crate::framework::infra_kinds::cluster_resource(&prefix);
    let (controller, store, frame) = dynamic_controller(&ctx, "infracluster", &resource, None);
    let kind = Arc::new(Shared { ctx: ctx.clone(), frame, resource: resource.clone() });
    let (in_namespace, by_cluster) = (store.clone(), store.clone());
    let (r1, r2) = (resource.clone(), resource.clone());
    controller
        // Failure domains follow the namespace's Providers.
        .watches_stream(crate::framework::reconciler::changes(ctx.watched::<Provider>(), ctx.scope()), move |p| {
            in_namespace
                .state()
                .into_iter()
                .filter(|c| c.namespace() == p.namespace())
                .map(|c| ObjectRef::from_obj_with(&*c, r1.clone()))
                .collect::<Vec<_>>()
        })
        // Pausing is on the CAPI Cluster.
        .watches_stream_with(
            contract::changes(&ctx, contract::cluster_resource()),
            move |c: DynamicObject| {
                by_cluster
                    .state()
                    .into_iter()
                    .filter(|ic| ic.namespace() == c.namespace() && contract::cluster_name(ic).as_deref() == Some(c.name_any().as_str()))
                    .map(|ic| ObjectRef::from_obj_with(&*ic, r2.clone()))
                    .collect::<Vec<_>>()
            },
            contract::cluster_resource(),
        )
        .graceful_shutdown_on(stop)
        .run(reconcile, |c, err, kind| kind.frame.error_policy(&c, err), kind)
        .for_each(crate::framework::reconciler::log_run("cluster"))
        .await;
}

async fn reconcile(c: Arc<DynamicObject>, kind: Arc<Shared>) -> Result<Action, Error> {
    kind.frame.reconcile(&c, reconcile_inner(&c, &kind)).await
}

async fn reconcile_inner(c: &DynamicObject, kind: &Shared) -> Result<Outcome, Error> {
    let ctx = &kind.ctx;
    if c.labels().contains_key(MANAGED_BY) || c.metadata.deletion_timestamp.is_some() {
        return Ok(Outcome::AwaitChange);
    }
    let ns = c.namespace().unwrap_or_default();
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &kind.resource);
    let old: InfraClusterStatus = c.data.get("status").cloned().and_then(|s| serde_json::from_value(s).ok()).unwrap_or_default();
    let mut st = old.clone();
    let generation = c.metadata.generation;
    st.observed_generation = generation;
    // What `Ready` says; `None` while paused (then only `Paused` changes).
    let ready = match serde_json::from_value::<InfraClusterSpec>(c.data.get("spec").cloned().unwrap_or_default()) {
        Err(e) => Some((false, Reason::InvalidSpec, format!("spec does not parse: {e}"))),
        Ok(spec) => {
            let cluster = if contract::owner(c, "Cluster").is_some() { cluster_of(&ctx.client, c).await? } else { None };
            match (&cluster, paused(cluster.as_ref(), c)) {
                (_, Some(why)) => {
                    conditions::set(&mut st.conditions, PAUSED_CONDITION, true, Reason::Paused, why, generation);
                    None
                }
                (None, None) => {
                    conditions::set(&mut st.conditions, PAUSED_CONDITION, false, Reason::NotPaused, "", generation);
                    Some((false, Reason::WaitingForCluster, "waiting for CAPI to set the owner Cluster".to_string()))
                }
                (Some(_), None) => {
                    conditions::set(&mut st.conditions, PAUSED_CONDITION, false, Reason::NotPaused, "", generation);
                    let providers = Api::<Provider>::namespaced(ctx.client.clone(), &ns).list(&ctx.options.installation.list()).await?.items;
                    let k0smotron = c.annotations().get(MANAGED_BY).is_some_and(|v| v == K0SMOTRON);
                    Some(aggregate(&spec, &providers, k0smotron, &mut st))
                }
            }
        }
    };
    if let Some((ready, reason, message)) = ready {
        // v1beta1 readers learn of a terminal failure only from these fields.
        st.deprecated = (reason == Reason::InvalidSpec).then(|| contract::v1beta1_failure(message.clone()));
        if conditions::set(&mut st.conditions, READY, ready, reason, message.clone(), generation) {
            ctx.event(&c.object_ref(&kind.resource), !ready, reason, "Reconcile", message).await;
        }
    }
    status::write(&api, &c.name_any(), Some(&old), &st).await?;
    // Everything it depends on is watched: Providers, the Cluster, the object itself.
    Ok(Outcome::AwaitChange)
}

/// Fill the failure domains and `provisioned` from the spec and the Providers; what
/// `Ready` says.
fn aggregate(spec: &InfraClusterSpec, providers: &[Provider], k0smotron: bool, st: &mut InfraClusterStatus) -> (bool, Reason, String) {
    let problem = match failure_domains(spec, providers) {
        Ok((domains, missing)) => {
            st.failure_domains = domains;
            match missing.first() {
                Some(name) => Some((Reason::ProviderNotFound, format!("Provider {name:?} named in spec.providerRefs not found"))),
                None if st.failure_domains.is_empty() => Some((Reason::NoFailureDomains, "the selected Providers report no failure domains (yet)".to_string())),
                None => None,
            }
        }
        Err(message) => Some((Reason::InvalidSpec, message)),
    };
    let endpoint = spec.control_plane_endpoint.as_ref().filter(|e| !e.host.is_empty() && e.port > 0);
    let (ready, reason, message) = match (problem, endpoint) {
        (Some((reason, message)), _) => (false, reason, message),
        (None, None) => (false, Reason::WaitingForControlPlaneEndpoint, "waiting for spec.controlPlaneEndpoint (set by you or the control-plane provider)".to_string()),
        (None, Some(e)) => (true, Reason::Provisioned, format!("{} failure domains; control plane at {}:{}", st.failure_domains.len(), e.host, e.port)),
    };
    // Once provisioned, a cluster stays provisioned (the contract's field never goes back).
    let provisioned = st.initialization.as_ref().and_then(|i| i.provisioned).unwrap_or(false) || ready;
    st.initialization = Some(Initialization { provisioned: Some(provisioned) });
    // v1beta1's `status.ready` is k0smotron's to write on clusters it manages.
    if !k0smotron {
        st.ready = Some(provisioned);
    }
    (ready, reason, message)
}

/// The cluster's failure domains from its Providers, and the `providerRefs` not found.
pub fn failure_domains(spec: &InfraClusterSpec, providers: &[Provider]) -> Result<(Vec<ClusterFailureDomain>, Vec<String>), String> {
    let selector = |s: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>, what: &str| {
        s.clone().map(Selector::try_from).transpose().map_err(|e| format!("invalid {what}: {e}"))
    };
    let provider_selector = selector(&spec.provider_selector, "spec.providerSelector")?;
    let control_plane = selector(&spec.control_plane_selector, "spec.controlPlaneSelector")?;
    let named = |p: &Provider| spec.provider_refs.iter().any(|r| r.name == p.name_any());
    let everything = spec.provider_refs.is_empty() && provider_selector.is_none();
    let mut selected: Vec<&Provider> = providers
        .iter()
        .filter(|p| everything || named(p) || provider_selector.as_ref().is_some_and(|s| s.matches(p.labels())))
        .collect();
    selected.sort_by_key(|p| p.name_any());
    let missing = spec.provider_refs.iter().filter(|r| !providers.iter().any(|p| p.name_any() == r.name)).map(|r| r.name.clone()).collect();
    let mut domains = Vec::new();
    for p in selected {
        for fd in p.status.as_ref().map(|s| s.failure_domains.as_slice()).unwrap_or_default() {
            let mut attributes: BTreeMap<String, String> = fd.labels.clone();
            attributes.insert(PROVIDER_ATTRIBUTE.into(), p.name_any());
            attributes.insert(BACKEND_DOMAIN_ATTRIBUTE.into(), fd.name.clone());
            attributes.insert(PROVIDER_CLASS_ATTRIBUTE.into(), p.spec.provider_class_ref.name.clone());
            let control_plane = control_plane.as_ref().is_none_or(|s| s.matches(&attributes));
            domains.push(ClusterFailureDomain { name: format!("{}/{}", p.name_any(), fd.name), control_plane: Some(control_plane), attributes });
        }
    }
    domains.truncate(MAX_FAILURE_DOMAINS);
    Ok((domains, missing))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn providers() -> Vec<Provider> {
        vec![
            crate::fixtures::provider("team", "kvm-a", true, json!([{"name": "rack1", "labels": {"zone": "z1"}, "capacity": {}}])),
            crate::fixtures::provider("team", "kvm-b", true, json!([{"name": "rack2", "labels": {"zone": "z2"}, "capacity": {}}])),
        ]
    }

    fn spec(v: serde_json::Value) -> InfraClusterSpec {
        serde_json::from_value(v).expect("spec")
    }

    #[test]
    fn failure_domains_come_from_the_selected_providers_with_control_planes_where_allowed() {
        let (all, missing) = failure_domains(&spec(json!({"controlPlaneSelector": {"matchLabels": {"zone": "z1"}}})), &providers()).unwrap();
        let names: Vec<(&str, Option<bool>)> = all.iter().map(|d| (d.name.as_str(), d.control_plane)).collect();
        assert_eq!(names, [("kvm-a/rack1", Some(true)), ("kvm-b/rack2", Some(false))]);
        assert!(missing.is_empty());
        let a = &all[0].attributes;
        assert_eq!((a[PROVIDER_ATTRIBUTE].as_str(), a[BACKEND_DOMAIN_ATTRIBUTE].as_str(), a[PROVIDER_CLASS_ATTRIBUTE].as_str(), a["zone"].as_str()), ("kvm-a", "rack1", "libvirt", "z1"));

        let (selected, _) = failure_domains(&spec(json!({"providerSelector": {"matchLabels": {"site": "kvm-b"}}})), &providers()).unwrap();
        assert_eq!(selected.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), ["kvm-b/rack2"]);
        let (named, missing) = failure_domains(&spec(json!({"providerRefs": [{"name": "kvm-a"}, {"name": "gone"}]})), &providers()).unwrap();
        assert_eq!((named.len(), missing), (1, vec!["gone".to_string()]));
        let bad = failure_domains(&spec(json!({"providerSelector": {"matchExpressions": [{"key": "site", "operator": "Near", "values": ["x"]}]}})), &providers());
        assert!(bad.is_err_and(|e| e.contains("spec.providerSelector")));
    }

    #[test]
    fn a_cluster_is_provisioned_once_it_has_domains_and_an_endpoint_and_stays_so() {
        let mut st = InfraClusterStatus::default();
        let waiting = aggregate(&spec(json!({})), &providers(), false, &mut st);
        assert_eq!((waiting.0, waiting.1), (false, Reason::WaitingForControlPlaneEndpoint));
        assert_eq!(st.failure_domains.len(), 2);
        let endpoint = spec(json!({"controlPlaneEndpoint": {"host": "10.0.0.1", "port": 6443}}));
        let ready = aggregate(&endpoint, &providers(), false, &mut st);
        assert_eq!((ready.0, ready.1), (true, Reason::Provisioned));
        assert_eq!((st.initialization.as_ref().and_then(|i| i.provisioned), st.ready), (Some(true), Some(true)));
        let lost = aggregate(&spec(json!({"controlPlaneEndpoint": {"host": "10.0.0.1", "port": 6443}, "providerRefs": [{"name": "gone"}]})), &providers(), false, &mut st);
        assert_eq!((lost.0, lost.1), (false, Reason::ProviderNotFound));
        assert_eq!(st.initialization.as_ref().and_then(|i| i.provisioned), Some(true), "provisioned never goes back");
        let mut hosted = InfraClusterStatus::default();
        aggregate(&endpoint, &providers(), true, &mut hosted);
        assert_eq!(hosted.ready, None, "k0smotron writes status.ready on the clusters it manages");
    }
}
