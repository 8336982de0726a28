//! Behaviour particular to built-in types: Secret `stringData` and immutability,
//! Namespace lifecycle, and CRDs (which change what the server serves).

use serde_json::{json, Value};

use crate::objects::meta::{self, now, Causes};
use crate::schema::registry::{types_from_crd, Builtin, ResourceType};
use crate::storage::object::Object;
use crate::storage::state::State;
use crate::status::{ApiError, ApiResult};

/// Finalizer the server puts on CRDs so their objects are removed first.
pub const CRD_CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

/// Type-specific validation beyond the schema.
pub fn validate(rt: &ResourceType, obj: &Value) -> Causes {
    match rt.builtin {
        Some(Builtin::Crd) => match types_from_crd(obj) {
            Ok(_) => vec![],
            Err(errs) => errs.into_iter().map(|(f, m)| (f.clone(), "FieldValueInvalid".to_string(), format!("{f}: Invalid value: {m}"))).collect(),
        },
        _ => vec![],
    }
}

/// The label kube-apiserver keeps on every Namespace (since 1.21), so selectors can name one.
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// Set (or restore) [`NAMESPACE_NAME_LABEL`] to the Namespace's name, on every write.
fn label_namespace_name(obj: &mut Value) {
    let name = meta::name(obj).to_string();
    let m = meta::meta_mut(obj);
    if !m.get("labels").is_some_and(Value::is_object) {
        m.insert("labels".into(), json!({}));
    }
    m["labels"][NAMESPACE_NAME_LABEL] = Value::String(name);
}

/// Fold Secret `stringData` into base64 `data`, as the real server does on write.
fn fold_string_data(obj: &mut Value) {
    use base64::Engine;
    let Some(sd) = obj.as_object_mut().and_then(|o| o.remove("stringData")) else { return };
    let Some(sd) = sd.as_object() else { return };
    if !obj.get("data").is_some_and(Value::is_object) {
        obj["data"] = json!({});
    }
    for (k, v) in sd {
        let s = v.as_str().map(String::from).unwrap_or_else(|| v.to_string());
        obj["data"][k] = Value::String(base64::engine::general_purpose::STANDARD.encode(s));
    }
}

pub fn prepare_create(rt: &ResourceType, obj: &mut Value) {
    match rt.builtin {
        Some(Builtin::Secret) => {
            fold_string_data(obj);
            if obj.get("type").and_then(Value::as_str).is_none_or(str::is_empty) {
                obj["type"] = json!("Opaque");
            }
        }
        Some(Builtin::Namespace) => {
            if !obj.pointer("/spec/finalizers").is_some_and(Value::is_array) {
                obj["spec"] = json!({"finalizers": ["kubernetes"]});
            }
            obj["status"] = json!({"phase": "Active"});
            label_namespace_name(obj);
        }
        Some(Builtin::Crd) => {
            crd_status(obj, None);
            let mut f = meta::finalizers(obj);
            if !f.iter().any(|x| x == CRD_CLEANUP_FINALIZER) {
                f.push(CRD_CLEANUP_FINALIZER.into());
                meta::set_finalizers(obj, &f);
            }
        }
        _ => {}
    }
}

/// The status the server maintains for a CRD: accepted names, established, stored versions.
fn crd_status(obj: &mut Value, previous: Option<&Value>) {
    let names = obj.pointer("/spec/names").cloned().unwrap_or(json!({}));
    let storage = obj
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .and_then(|vs| vs.iter().find(|v| v.get("storage").and_then(Value::as_bool) == Some(true)))
        .and_then(|v| v.get("name").cloned());
    let mut stored: Vec<Value> = previous
        .and_then(|p| p.pointer("/status/storedVersions"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if let Some(s) = storage {
        if !stored.contains(&s) {
            stored.push(s);
        }
    }
    let since = previous
        .and_then(|p| p.pointer("/status/conditions/0/lastTransitionTime"))
        .cloned()
        .unwrap_or_else(|| Value::String(now()));
    let mut accepted = names;
    if accepted.get("listKind").is_none() {
        if let Some(k) = accepted.get("kind").and_then(Value::as_str) {
            accepted["listKind"] = Value::String(format!("{k}List"));
        }
    }
    if accepted.get("singular").is_none() {
        if let Some(k) = accepted.get("kind").and_then(Value::as_str) {
            accepted["singular"] = Value::String(k.to_ascii_lowercase());
        }
    }
    obj["status"] = json!({
        "acceptedNames": accepted,
        "storedVersions": stored,
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": since},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": since},
        ],
    });
}

pub fn prepare_update(rt: &ResourceType, current: &Value, new: &mut Value) -> ApiResult<()> {
    match rt.builtin {
        Some(Builtin::Secret) => {
            fold_string_data(new);
            if new.get("type") != current.get("type") && new.get("type").is_some() {
                return Err(immutable(rt, current, "type", "field is immutable"));
            }
            if new.get("type").is_none() {
                new["type"] = current.get("type").cloned().unwrap_or(json!("Opaque"));
            }
            check_immutable_data(rt, current, new, &["data"])?;
        }
        Some(Builtin::ConfigMap) => check_immutable_data(rt, current, new, &["data", "binaryData"])?,
        Some(Builtin::Namespace) => label_namespace_name(new),
        Some(Builtin::Crd) => {
            if new.pointer("/spec/group") != current.pointer("/spec/group")
                || new.pointer("/spec/names/plural") != current.pointer("/spec/names/plural")
                || new.pointer("/spec/scope") != current.pointer("/spec/scope")
            {
                return Err(immutable(rt, current, "spec", "group, names.plural and scope are immutable"));
            }
            crd_status(new, Some(current));
        }
        _ => {}
    }
    Ok(())
}

fn check_immutable_data(rt: &ResourceType, current: &Value, new: &Value, fields: &[&str]) -> ApiResult<()> {
    if current.get("immutable").and_then(Value::as_bool) != Some(true) {
        return Ok(());
    }
    if new.get("immutable").and_then(Value::as_bool) != Some(true) {
        return Err(immutable(rt, current, "immutable", "field is immutable when `immutable` is set"));
    }
    for f in fields {
        if new.get(*f) != current.get(*f) {
            return Err(immutable(rt, current, f, "field is immutable when `immutable` is set"));
        }
    }
    Ok(())
}

fn immutable(rt: &ResourceType, obj: &Value, field: &str, why: &str) -> ApiError {
    ApiError::invalid(&rt.group_kind(), meta::name(obj), vec![(field.into(), "FieldValueForbidden".into(), format!("{field}: Forbidden: {why}"))])
}

/// A namespace stays while its `spec.finalizers` are not empty.
pub fn blocks_deletion(rt: &ResourceType, obj: &Value) -> bool {
    rt.builtin == Some(Builtin::Namespace) && obj.pointer("/spec/finalizers").and_then(Value::as_array).is_some_and(|a| !a.is_empty())
}

pub fn prepare_delete(_state: &State, rt: &ResourceType, obj: &mut Value, _finalizers: &mut Vec<String>) {
    if rt.builtin == Some(Builtin::Namespace) {
        obj["status"]["phase"] = json!("Terminating");
    }
}

/// After a create or update is stored.
pub fn after_commit(state: &State, rt: &ResourceType, stored: &Object) {
    if rt.builtin == Some(Builtin::Crd) && !stored.is_deleting() {
        match types_from_crd(&stored.value()) {
            Ok(types) => state.registry.write().unwrap().serve_crd(stored.name(), types, stored.rv()),
            Err(e) => tracing::error!("stored CRD {} is not servable: {e:?}", stored.name()),
        }
    }
}

/// After an object is removed from the store.
pub fn after_delete(state: &State, rt: &ResourceType, stored: &Object) {
    if rt.builtin == Some(Builtin::Crd) {
        state.registry.write().unwrap().remove_crd(stored.name());
    }
}
