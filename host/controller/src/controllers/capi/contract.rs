//! What both roles read of Cluster API: its kinds and labels, which cluster an object
//! belongs to, whether it is paused, and the v1beta1 failure fields. The provider role's
//! machine reconciler and the controller role's CAPI reconcilers import it; it imports
//! neither (a leaf), so the two roles' trees do not import each other.

use std::time::Duration;

use banlieue_api::infra::{Deprecated, V1Beta1Failure};
use futures::{Stream, StreamExt};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::ResourceExt;

use crate::Context;
pub use crate::framework::infra_kinds::PAUSED_ANNOTATION;

/// CAPI core's API group and the version banlieue reads.
pub const CAPI_GROUP: &str = "cluster.x-k8s.io";
pub const CAPI_VERSION: &str = "v1beta2";
/// The label CAPI puts on every object of a cluster.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
/// The label CAPI puts on control-plane Machines (and their infrastructure machines).
pub const CONTROL_PLANE_LABEL: &str = "cluster.x-k8s.io/control-plane";
/// An InfraCluster with this label is managed by someone else: banlieue leaves it alone.
/// As an annotation with the value `k0smotron`, k0smotron writes the endpoint and the
/// provisioned fields of the InfraCluster itself (hosted control planes).
pub const MANAGED_BY: &str = "cluster.x-k8s.io/managed-by";
/// The condition v1beta2 providers set on every object they reconcile.
pub const PAUSED_CONDITION: &str = "Paused";
/// How often banlieue looks for CAPI's API until it is installed.
pub const DISCOVERY_INTERVAL: Duration = Duration::from_secs(10);

fn capi_resource(kind: &str) -> ApiResource {
    let gvk = GroupVersionKind::gvk(CAPI_GROUP, CAPI_VERSION, kind);
    ApiResource::from_gvk_with_plural(&gvk, &format!("{}s", kind.to_ascii_lowercase()))
}

/// CAPI's `Cluster`.
pub fn cluster_resource() -> ApiResource {
    capi_resource("Cluster")
}

/// CAPI's `Machine`.
pub fn machine_resource() -> ApiResource {
    capi_resource("Machine")
}

/// Resolve once CAPI's API is served (checked every [`DISCOVERY_INTERVAL`]); banlieue
/// runs without CAPI, and starts its CAPI watches only when the API appears.
pub async fn served(client: &kube::Client) {
    loop {
        match client.list_api_group_resources(&format!("{CAPI_GROUP}/{CAPI_VERSION}")).await {
            Ok(list) if list.resources.iter().any(|r| r.name == "clusters") => return,
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "CAPI's API is not served yet"),
        }
        tokio::time::sleep(DISCOVERY_INTERVAL).await;
    }
}

/// Every change to a CAPI object of `resource`, once CAPI is installed.
pub fn changes(ctx: &Context, resource: ApiResource) -> impl Stream<Item = Result<DynamicObject, watcher::Error>> + Send + 'static {
    let client = ctx.client.clone();
    let api = ctx.watched_dynamic(&resource);
    futures::stream::once(async move { served(&client).await })
        // CAPI core's objects carry no installation label: they only wake this
        // installation's infrastructure objects, which are scoped.
        .flat_map(move |()| crate::framework::reconciler::changes(api.clone(), watcher::Config::default()))
}

/// The CAPI owner of `kind` (`Cluster`, `Machine`) among `obj`'s owner references.
pub fn owner<'a>(obj: &'a DynamicObject, kind: &str) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
    obj.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == kind && o.api_version.split('/').next() == Some(CAPI_GROUP))
}

/// The CAPI Cluster `obj` belongs to (its label, else its owner), if any.
pub fn cluster_name(obj: &DynamicObject) -> Option<String> {
    obj.labels().get(CLUSTER_NAME_LABEL).cloned().or_else(|| owner(obj, "Cluster").map(|o| o.name.clone()))
}

/// The CAPI Cluster of `obj`, when it has one and it exists.
pub async fn cluster_of(client: &kube::Client, obj: &DynamicObject) -> Result<Option<DynamicObject>, kube::Error> {
    let Some(name) = cluster_name(obj) else { return Ok(None) };
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &obj.namespace().unwrap_or_default(), &cluster_resource());
    match api.get_opt(&name).await {
        // CAPI not installed: nothing can pause the object but its own annotation.
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(None),
        other => other,
    }
}

/// Paused as the contract defines it: the Cluster's `spec.paused`, or the
/// `cluster.x-k8s.io/paused` annotation on the object itself. Returns why.
pub fn paused(cluster: Option<&DynamicObject>, obj: &DynamicObject) -> Option<String> {
    if obj.annotations().contains_key(PAUSED_ANNOTATION) {
        return Some(format!("annotated {PAUSED_ANNOTATION}"));
    }
    let cluster = cluster?;
    cluster.data.pointer("/spec/paused").and_then(|p| p.as_bool()).unwrap_or(false).then(|| format!("Cluster {} has spec.paused", cluster.name_any()))
}

/// `value` of a dynamic object at a JSON pointer, as a string.
pub(crate) fn str_at<'a>(obj: &'a DynamicObject, pointer: &str) -> Option<&'a str> {
    obj.data.pointer(pointer).and_then(|v| v.as_str()).filter(|s| !s.is_empty())
}

/// The machines of CAPI Cluster `c`.
pub fn of_cluster(store: &Store<DynamicObject>, c: &DynamicObject, resource: &ApiResource) -> Vec<ObjectRef<DynamicObject>> {
    store
        .state()
        .into_iter()
        .filter(|m| m.namespace() == c.namespace() && cluster_name(m).as_deref() == Some(c.name_any().as_str()))
        .map(|m| ObjectRef::from_obj_with(&*m, resource.clone()))
        .collect()
}

/// The reason v1beta1 readers get for a terminal failure.
pub const V1BETA1_FAILURE_REASON: &str = "InvalidConfiguration";

/// A terminal failure as v1beta1 readers learn of it: `status.deprecated.v1beta1`'s
/// `failureReason`/`failureMessage` (v1beta2 readers read the conditions).
pub fn v1beta1_failure(message: impl Into<String>) -> Deprecated {
    Deprecated { v1beta1: Some(V1Beta1Failure { failure_reason: Some(V1BETA1_FAILURE_REASON.into()), failure_message: Some(message.into()) }) }
}
