//! Which `<Kind>Machine` (and `<Kind>Cluster`) kinds exist: one per ProviderClass `infrastructureKind`.
//! Third-party classes appear at run time, so roles that work on machines start
//! their per-kind watches from this stream rather than from a fixed list.

use std::collections::HashSet;

/// The provider role's finalizer on every `<Kind>Machine`: held until the backend VM is
/// torn down. The VM controller makes Machines with it; in-use protection reads it.
pub const MACHINE_FINALIZER: &str = "banlieue.io/provider";

/// CAPI's annotation that stops reconciling a Machine: the VM controller sets it while
/// its VM is paused, and the machine reconciler leaves such a Machine alone.
pub const PAUSED_ANNOTATION: &str = "cluster.x-k8s.io/paused";

use banlieue_api::infra::INFRA_GROUP;
use banlieue_api::ProviderClass;
use futures::{Stream, StreamExt};
use kube::api::{Api, ApiResource, GroupVersionKind};
use kube::runtime::{watcher, WatchStreamExt};

use crate::framework::reconciler::Retried;

/// The API resource of `<prefix>Machine`.
pub fn machine_resource(prefix: &str) -> ApiResource {
    let gvk = GroupVersionKind::gvk(INFRA_GROUP, banlieue_api::VERSION, &format!("{prefix}Machine"));
    ApiResource::from_gvk_with_plural(&gvk, &format!("{}machines", prefix.to_ascii_lowercase()))
}

/// The API resource of a Machine kind (`LibvirtMachine`), as an `infrastructureRef` names it.
pub fn machine_resource_of_kind(kind: &str) -> ApiResource {
    machine_resource(kind.strip_suffix("Machine").unwrap_or(kind))
}

/// The API resource of `<prefix>Cluster`.
pub fn cluster_resource(prefix: &str) -> ApiResource {
    let gvk = GroupVersionKind::gvk(INFRA_GROUP, banlieue_api::VERSION, &format!("{prefix}Cluster"));
    ApiResource::from_gvk_with_plural(&gvk, &format!("{}clusters", prefix.to_ascii_lowercase()))
}

/// Each infrastructure kind prefix, once, as ProviderClasses (of the installation:
/// `scope`) declaring it appear.
pub fn watch(client: kube::Client, scope: watcher::Config) -> impl Stream<Item = String> + Send {
    let classes: Api<ProviderClass> = Api::all(client);
    let mut seen = HashSet::new();
    watcher(classes, scope)
        .retried()
        .applied_objects()
        .filter_map(move |class| {
            let new = match class {
                Ok(class) => {
                    let kind = class.spec.infrastructure_kind.clone();
                    seen.insert(kind.clone()).then_some(kind)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "watching ProviderClasses");
                    None
                }
            };
            futures::future::ready(new)
        })
}

/// The stop signal each per-kind reconciler gets (a clone of the role's).
pub type Stop = futures::future::Shared<std::pin::Pin<Box<dyn Future<Output = ()> + Send + Sync>>>;

/// Run `start(prefix, stop)` for each infrastructure kind as it appears, until `stop`
/// resolves and every started reconciler has finished.
pub async fn per_kind<F, Fut>(client: kube::Client, scope: watcher::Config, stop: impl Future<Output = ()> + Send + Sync + 'static, start: F)
where
    F: Fn(String, Stop) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let stop: Stop = futures::FutureExt::shared(Box::pin(stop) as std::pin::Pin<Box<dyn Future<Output = ()> + Send + Sync>>);
    let mut kinds = watch(client, scope).boxed();
    let mut running = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            kind = kinds.next() => {
                let Some(kind) = kind else { break };
                running.spawn(start(kind, stop.clone()));
            }
            _ = stop.clone() => break,
        }
    }
    while running.join_next().await.is_some() {}
}
