//! Adding and removing a finalizer with optimistic concurrency: the patch carries
//! the resourceVersion it was computed from, so a concurrent change makes it fail
//! (409) and the reconcile runs again on fresh data instead of losing an entry.

use kube::api::{Api, Patch, PatchParams};
use kube::Resource;
use serde::de::DeserializeOwned;

pub fn has<K: Resource>(obj: &K, name: &str) -> bool {
    obj.meta().finalizers.iter().flatten().any(|f| f == name)
}

pub async fn add<K>(api: &Api<K>, obj: &K, name: &str) -> Result<(), kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut list = obj.meta().finalizers.clone().unwrap_or_default();
    list.push(name.to_string());
    set(api, obj, list).await
}

pub async fn remove<K>(api: &Api<K>, obj: &K, name: &str) -> Result<(), kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let list: Vec<String> = obj.meta().finalizers.iter().flatten().filter(|f| *f != name).cloned().collect();
    match set(api, obj, list).await {
        // Already gone: nothing left to release.
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        other => other,
    }
}

async fn set<K>(api: &Api<K>, obj: &K, list: Vec<String>) -> Result<(), kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let meta = obj.meta();
    let patch = serde_json::json!({
        "metadata": { "finalizers": list, "resourceVersion": meta.resource_version }
    });
    api.patch(meta.name.as_deref().unwrap_or_default(), &PatchParams::default(), &Patch::Merge(patch)).await?;
    Ok(())
}
