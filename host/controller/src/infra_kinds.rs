//! Which `<Kind>Machine` kinds exist: one per ProviderClass `infrastructureKind`.
//! Third-party classes appear at run time, so roles that work on machines start
//! their per-kind watches from this stream rather than from a fixed list.

use std::collections::HashSet;

/// CAPI's annotation that stops reconciling a Machine: the VM controller sets it while
/// its VM is paused, and the machine reconciler leaves such a Machine alone.
pub const PAUSED_ANNOTATION: &str = "cluster.x-k8s.io/paused";

use banlieue_api::infra::INFRA_GROUP;
use banlieue_api::ProviderClass;
use futures::{Stream, StreamExt};
use kube::api::{Api, ApiResource, GroupVersionKind};
use kube::runtime::{watcher, WatchStreamExt};

/// The API resource of `<prefix>Machine`.
pub fn machine_resource(prefix: &str) -> ApiResource {
    let gvk = GroupVersionKind::gvk(INFRA_GROUP, banlieue_api::VERSION, &format!("{prefix}Machine"));
    ApiResource::from_gvk_with_plural(&gvk, &format!("{}machines", prefix.to_ascii_lowercase()))
}

/// Each infrastructure kind prefix, once, as ProviderClasses declaring it appear.
pub fn watch(client: kube::Client) -> impl Stream<Item = String> + Send {
    let classes: Api<ProviderClass> = Api::all(client);
    let mut seen = HashSet::new();
    watcher(classes, watcher::Config::default())
        .default_backoff()
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
