//! Writing what a reconcile found: the status subresource (here), its [`conditions`]
//! with their [`reasons`], and [`finalizer`]s.
//!
//! Writing a status subresource: one request only when something changed, and
//! what a reconciler cleared really cleared on the server.
//!
//! Status types skip empty fields when serialized, so a plain merge patch of the
//! new status would never remove anything (a VM that moved to another backend
//! kept the old backend's addresses). The patch is the RFC 7386 difference
//! between the status read and the status computed: changed members, `null`
//! for removed ones.

pub mod conditions;
pub mod finalizer;
pub mod reasons;

use kube::api::{Api, Patch, PatchParams};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};

/// Patch `name`'s status from `old` to `new`; no request when they are equal.
/// An object deleted meanwhile is not an error.
pub async fn write<K, S>(api: &Api<K>, name: &str, old: Option<&S>, new: &S) -> Result<(), kube::Error>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
    S: Serialize,
{
    let old = old.map(serde_json::to_value).transpose().map_err(kube::Error::SerdeError)?.unwrap_or(Value::Null);
    let new = serde_json::to_value(new).map_err(kube::Error::SerdeError)?;
    let Some(patch) = merge_diff(&old, &new) else {
        return Ok(());
    };
    match api.patch_status(name, &PatchParams::default(), &Patch::Merge(serde_json::json!({ "status": patch }))).await {
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
        Ok(_) => Ok(()),
    }
}

/// The JSON merge patch that turns `old` into `new`, or `None` when they are equal.
/// Objects are compared member by member; anything else (lists included) is replaced whole.
pub fn merge_diff(old: &Value, new: &Value) -> Option<Value> {
    if old == new {
        return None;
    }
    let (Value::Object(old), Value::Object(new)) = (old, new) else {
        return Some(new.clone());
    };
    let mut patch = Map::new();
    for (key, value) in new {
        let changed = match old.get(key) {
            Some(was) => merge_diff(was, value),
            None => Some(value.clone()),
        };
        if let Some(changed) = changed {
            patch.insert(key.clone(), changed);
        }
    }
    for key in old.keys().filter(|k| !new.contains_key(*k)) {
        patch.insert(key.clone(), Value::Null);
    }
    Some(Value::Object(patch))
}

#[cfg(test)]
mod tests {
    use super::merge_diff;
    use serde_json::json;

    #[test]
    fn equal_values_need_no_patch() {
        let s = json!({"addresses": [{"address": "10.0.0.1"}], "phase": "Running"});
        assert_eq!(merge_diff(&s, &s.clone()), None);
    }

    #[test]
    fn removed_members_become_null_and_nested_objects_are_diffed() {
        let old = json!({"addresses": [{"address": "10.0.0.1"}], "phase": "Running", "scheduled": {"provider": "a", "storage": {"x": "y"}}});
        let new = json!({"scheduled": {"provider": "b"}, "observedGeneration": 2});
        assert_eq!(
            merge_diff(&old, &new),
            Some(json!({"addresses": null, "phase": null, "scheduled": {"provider": "b", "storage": null}, "observedGeneration": 2}))
        );
    }

    #[test]
    fn lists_are_replaced_whole() {
        let old = json!({"conditions": [{"type": "Ready", "status": "True"}, {"type": "Scheduled", "status": "True"}]});
        let new = json!({"conditions": [{"type": "Ready", "status": "False"}]});
        assert_eq!(merge_diff(&old, &new), Some(new.clone()));
    }

    #[test]
    fn a_first_status_is_written_whole() {
        let new = json!({"phase": "Provisioning"});
        assert_eq!(merge_diff(&serde_json::Value::Null, &new), Some(new.clone()));
    }
}
