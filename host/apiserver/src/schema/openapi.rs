//! OpenAPI v3 documents, one per served group-version (`/openapi/v3`, `/openapi/v3/<gv_path>`).
//!
//! What clients rely on:
//! - `kubectl explain` finds the GVK on an operation of the resource's paths and then the
//!   schema in `components.schemas` whose `x-kubernetes-group-version-kind` list contains it,
//!   following `$ref`s and `allOf: [{$ref}]` (notably into `ObjectMeta`).
//! - kubectl's server-side field validation check looks for a `patch` operation whose
//!   `x-kubernetes-group-version-kind` (a single object on operations) is the GVK and which
//!   has a `fieldValidation` parameter; every patch operation for a GVK must have it.
//! - client caches key on `serverRelativeURL`, so its `hash` must change with the document.
//!
//! Output only depends on the resources' contents (not their order), and the hash is taken
//! over a key-sorted serialization, so it is stable across runs.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use crate::schema::registry::{Builtin, ResourceType};

const META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1";
const RAW_EXTENSION: &str = "io.k8s.apimachinery.pkg.runtime.RawExtension";
const SCALE: &str = "io.k8s.api.autoscaling.v1.Scale";
const SCALE_SPEC: &str = "io.k8s.api.autoscaling.v1.ScaleSpec";
const SCALE_STATUS: &str = "io.k8s.api.autoscaling.v1.ScaleStatus";

const API_VERSION_DESC: &str = "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources";
const KIND_DESC: &str = "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds";
const METADATA_DESC: &str = "Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";
const LIST_METADATA_DESC: &str = "Standard list metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds";

/// GET /openapi/v3 : `{"paths": {"api/v1": {"serverRelativeURL": "/openapi/v3/api/v1?hash=<HASH>"}, ...}}`.
/// One entry per served group-version; HASH is a stable hex hash of that group-version's document.
pub fn index(resources: &[Arc<ResourceType>]) -> Value {
    let mut paths = Map::new();
    for (gv_path, rs) in by_group_version(resources) {
        let hash = hash_hex(&build_doc(&rs));
        paths.insert(gv_path.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{gv_path}?hash={hash}")}));
    }
    json!({ "paths": paths })
}

/// GET /openapi/v3/<gv_path> where gv_path is "api/v1" or "apis/<group>/<version>": an OpenAPI 3.0
/// document, or None if no resource is served at that group-version.
pub fn group_version_doc(resources: &[Arc<ResourceType>], gv_path: &str) -> Option<Value> {
    let (group, version) = parse_gv_path(gv_path)?;
    let mut rs: Vec<&ResourceType> =
        resources.iter().map(|r| &**r).filter(|r| r.group == group && r.version == version).collect();
    if rs.is_empty() {
        return None;
    }
    sort_resources(&mut rs);
    Some(build_doc(&rs))
}

// ---------------------------------------------------------------------------------------------
// Group-versions and names

fn gv_path_of(group: &str, version: &str) -> String {
    if group.is_empty() { format!("api/{version}") } else { format!("apis/{group}/{version}") }
}

fn parse_gv_path(p: &str) -> Option<(String, String)> {
    let p = p.split('?').next().unwrap_or("").trim_matches('/');
    let parts: Vec<&str> = p.split('/').collect();
    match parts.as_slice() {
        ["api", v] if !v.is_empty() => Some((String::new(), v.to_string())),
        ["apis", g, v] if !g.is_empty() && !v.is_empty() => Some((g.to_string(), v.to_string())),
        _ => None,
    }
}

fn sort_resources(rs: &mut [&ResourceType]) {
    rs.sort_by(|a, b| (&a.kind, &a.plural).cmp(&(&b.kind, &b.plural)));
}

fn by_group_version(resources: &[Arc<ResourceType>]) -> BTreeMap<String, Vec<&ResourceType>> {
    let mut m: BTreeMap<String, Vec<&ResourceType>> = BTreeMap::new();
    for r in resources {
        m.entry(gv_path_of(&r.group, &r.version)).or_default().push(r);
    }
    for rs in m.values_mut() {
        sort_resources(rs);
    }
    m
}

/// The package-like prefix Kubernetes uses for a group's schema names (without the version).
fn schema_prefix(r: &ResourceType) -> String {
    match r.builtin {
        Some(Builtin::Crd) if r.group == "apiextensions.k8s.io" => {
            "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions".to_string()
        }
        Some(_) if r.group.is_empty() => "io.k8s.api.core".to_string(),
        Some(_) => {
            let g = r.group.strip_suffix(".k8s.io").unwrap_or(&r.group);
            format!("io.k8s.api.{}", g.split('.').next().unwrap_or(g))
        }
        // Custom resources: the group's DNS labels reversed (banlieue.io -> io.banlieue).
        None if r.group.is_empty() => "io.k8s.api.core".to_string(),
        None => r.group.split('.').rev().collect::<Vec<_>>().join("."),
    }
}

fn schema_name(r: &ResourceType, kind: &str) -> String {
    format!("{}.{}.{}", schema_prefix(r), r.version, kind)
}

fn schema_ref(name: &str) -> String {
    format!("#/components/schemas/{name}")
}

fn meta(name: &str) -> String {
    format!("{META}.{name}")
}

fn ref_to(name: &str) -> Value {
    json!({ "$ref": schema_ref(name) })
}

/// `{"allOf": [{"$ref": ...}]}`, the way Kubernetes attaches descriptions/defaults to references.
fn all_of(name: &str, description: &str) -> Value {
    json!({ "allOf": [ref_to(name)], "description": description })
}

fn all_of_default(name: &str, description: &str) -> Value {
    json!({ "allOf": [ref_to(name)], "default": {}, "description": description })
}

fn gvk(group: &str, version: &str, kind: &str) -> Value {
    json!({ "group": group, "version": version, "kind": kind })
}

fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

/// `CoreV1`, `CoordinationV1`, `BanlieueIoV1alpha1`: the operationId infix.
fn op_infix(r: &ResourceType) -> String {
    let g = if r.group.is_empty() {
        "Core".to_string()
    } else {
        let g = r.group.strip_suffix(".k8s.io").unwrap_or(&r.group);
        g.split(['.', '-']).map(capitalize).collect()
    };
    format!("{g}{}", capitalize(&r.version))
}

// ---------------------------------------------------------------------------------------------
// Document

fn build_doc(rs: &[&ResourceType]) -> Value {
    let mut schemas = meta_schemas();
    let mut paths = Map::new();
    for r in rs {
        let name = schema_name(r, &r.kind);
        let list_name = schema_name(r, &r.list_kind);
        schemas.insert(name.clone(), resource_schema(r));
        schemas.insert(list_name.clone(), list_schema(r, &name));
        if r.scale.is_some() {
            schemas.extend(scale_schemas());
        }
        add_paths(&mut paths, r, &name, &list_name);
    }
    json!({
        "openapi": "3.0.0",
        "info": { "title": "Kubernetes", "version": "unversioned" },
        "paths": paths,
        "components": { "schemas": schemas },
    })
}

/// A string property (`apiVersion`, `kind`), keeping what the resource's schema already says.
fn string_prop(existing: Option<&Value>, description: &str) -> Value {
    let mut p = match existing {
        Some(Value::Object(m)) => m.clone(),
        _ => Map::new(),
    };
    p.entry("type").or_insert_with(|| json!("string"));
    p.entry("description").or_insert_with(|| json!(description));
    Value::Object(p)
}

fn resource_schema(r: &ResourceType) -> Value {
    let mut s = match &r.schema {
        Value::Object(m) => m.clone(),
        _ => Map::new(),
    };
    s.entry("type").or_insert_with(|| json!("object"));
    let mut props = match s.remove("properties") {
        Some(Value::Object(p)) => p,
        _ => Map::new(),
    };
    let api_version = string_prop(props.get("apiVersion"), API_VERSION_DESC);
    let kind = string_prop(props.get("kind"), KIND_DESC);
    props.insert("apiVersion".into(), api_version);
    props.insert("kind".into(), kind);
    props.insert("metadata".into(), all_of_default(&meta("ObjectMeta"), METADATA_DESC));
    s.insert("properties".into(), Value::Object(props));
    s.insert("x-kubernetes-group-version-kind".into(), json!([gvk(&r.group, &r.version, &r.kind)]));
    Value::Object(s)
}

fn list_schema(r: &ResourceType, item_name: &str) -> Value {
    json!({
        "description": format!("{} is a list of {}.", r.list_kind, r.kind),
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": { "type": "string", "description": API_VERSION_DESC },
            "items": {
                "type": "array",
                "description": format!("List of {}. More info: https://kubernetes.io/docs/reference/using-api/api-concepts/#collections", r.plural),
                "items": ref_to(item_name),
            },
            "kind": { "type": "string", "description": KIND_DESC },
            "metadata": all_of_default(&meta("ListMeta"), LIST_METADATA_DESC),
        },
        "x-kubernetes-group-version-kind": [gvk(&r.group, &r.version, &r.list_kind)],
    })
}

fn scale_schemas() -> Map<String, Value> {
    let mut m = Map::new();
    m.insert(SCALE.into(), json!({
        "description": "Scale represents a scaling request for a resource.",
        "type": "object",
        "properties": {
            "apiVersion": { "type": "string", "description": API_VERSION_DESC },
            "kind": { "type": "string", "description": KIND_DESC },
            "metadata": all_of_default(&meta("ObjectMeta"), METADATA_DESC),
            "spec": all_of_default(SCALE_SPEC, "spec defines the behavior of the scale. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#spec-and-status."),
            "status": all_of_default(SCALE_STATUS, "status is the current status of the scale. Read-only. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#spec-and-status."),
        },
        "x-kubernetes-group-version-kind": [gvk("autoscaling", "v1", "Scale")],
    }));
    m.insert(SCALE_SPEC.into(), json!({
        "description": "ScaleSpec describes the attributes of a scale subresource.",
        "type": "object",
        "properties": {
            "replicas": { "type": "integer", "format": "int32", "description": "replicas is the desired number of instances for the scaled object." },
        },
    }));
    m.insert(SCALE_STATUS.into(), json!({
        "description": "ScaleStatus represents the current status of a scale subresource.",
        "type": "object",
        "required": ["replicas"],
        "properties": {
            "replicas": { "type": "integer", "format": "int32", "default": 0, "description": "replicas is the actual number of observed instances of the scaled object." },
            "selector": { "type": "string", "description": "selector is the label query over pods that should match the replicas count, in serialized label selector form. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors" },
        },
    }));
    m
}

fn meta_schemas() -> Map<String, Value> {
    let s = |d: &str| json!({ "type": "string", "description": d });
    let i64_ = |d: &str| json!({ "type": "integer", "format": "int64", "description": d });
    let i32_ = |d: &str| json!({ "type": "integer", "format": "int32", "description": d });
    let b = |d: &str| json!({ "type": "boolean", "description": d });
    let str_map = |d: &str| json!({ "type": "object", "additionalProperties": { "type": "string", "default": "" }, "description": d });
    let mut m = Map::new();
    m.insert(meta("ObjectMeta"), json!({
        "description": "ObjectMeta is metadata that all persisted resources must have, which includes all objects users must create.",
        "type": "object",
        "properties": {
            "annotations": str_map("Annotations is an unstructured key value map stored with a resource that may be set by external tools to store and retrieve arbitrary metadata. They are not queryable and should be preserved when modifying objects. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/annotations"),
            "creationTimestamp": all_of(&meta("Time"), "CreationTimestamp is a timestamp representing the server time when this object was created. It is set by the system and cannot be set by clients. Populated by the system. Read-only. Null for lists."),
            "deletionGracePeriodSeconds": i64_("Number of seconds allowed for this object to gracefully terminate before it will be removed from the system. Only set when deletionTimestamp is also set. Read-only."),
            "deletionTimestamp": all_of(&meta("Time"), "DeletionTimestamp is the RFC 3339 date and time at which this resource will be deleted. It is set by the server when a graceful deletion is requested by the user, and is not directly settable by a client. Populated by the system when a graceful deletion is requested. Read-only."),
            "finalizers": {
                "type": "array",
                "items": { "type": "string", "default": "" },
                "x-kubernetes-list-type": "set",
                "x-kubernetes-patch-strategy": "merge",
                "description": "Must be empty before the object is deleted from the registry. Each entry is an identifier for the responsible component that will remove the entry from the list. If the deletionTimestamp of the object is non-nil, entries in this list can only be removed.",
            },
            "generateName": s("GenerateName is an optional prefix, used by the server, to generate a unique name ONLY IF the Name field has not been provided. The provided value has a random suffix appended to make it unique. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#idempotency"),
            "generation": i64_("A sequence number representing a specific generation of the desired state. Populated by the system. Read-only."),
            "labels": str_map("Map of string keys and values that can be used to organize and categorize (scope and select) objects. May match selectors of replication controllers and services. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels"),
            "managedFields": {
                "type": "array",
                "items": { "allOf": [ref_to(&meta("ManagedFieldsEntry"))], "default": {} },
                "x-kubernetes-list-type": "atomic",
                "description": "ManagedFields maps workflow-id and version to the set of fields that are managed by that workflow. This is mostly for internal housekeeping, and users typically shouldn't need to set or understand this field.",
            },
            "name": s("Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names"),
            "namespace": s("Namespace defines the space within which each name must be unique. An empty namespace is equivalent to the \"default\" namespace. Not all objects are required to be scoped to a namespace - the value of this field for those objects will be empty. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/namespaces"),
            "ownerReferences": {
                "type": "array",
                "items": { "allOf": [ref_to(&meta("OwnerReference"))], "default": {} },
                "x-kubernetes-list-map-keys": ["uid"],
                "x-kubernetes-list-type": "map",
                "x-kubernetes-patch-merge-key": "uid",
                "x-kubernetes-patch-strategy": "merge",
                "description": "List of objects depended by this object. If ALL objects in the list have been deleted, this object will be garbage collected. If this object is managed by a controller, then an entry in this list will point to this controller, with the controller field set to true.",
            },
            "resourceVersion": s("An opaque value that represents the internal version of this object that can be used by clients to determine when objects have changed. Populated by the system. Read-only. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#concurrency-control-and-consistency"),
            "selfLink": s("Deprecated: selfLink is a legacy read-only field that is no longer populated by the system."),
            "uid": s("UID is the unique in time and space value for this object. It is typically generated by the server on successful creation of a resource and is not allowed to change on PUT operations. Populated by the system. Read-only. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#uids"),
        },
    }));
    m.insert(meta("ListMeta"), json!({
        "description": "ListMeta describes metadata that synthetic resources must have, including lists and various status objects.",
        "type": "object",
        "properties": {
            "continue": s("continue may be set if the user set a limit on the number of items returned, and indicates that the server has more data available. The value is opaque and may be used to issue another request to the endpoint that served this list to retrieve the next set of available objects."),
            "remainingItemCount": i64_("remainingItemCount is the number of subsequent items in the list which are not included in this list response. Only set when the list was truncated by a limit."),
            "resourceVersion": s("String that identifies the server's internal version of this object that can be used by clients to determine when objects have changed. Populated by the system. Read-only."),
            "selfLink": s("Deprecated: selfLink is a legacy read-only field that is no longer populated by the system."),
        },
    }));
    m.insert(meta("OwnerReference"), json!({
        "description": "OwnerReference contains enough information to let you identify an owning object. An owning object must be in the same namespace as the dependent, or be cluster-scoped, so there is no namespace field.",
        "type": "object",
        "required": ["apiVersion", "kind", "name", "uid"],
        "properties": {
            "apiVersion": s("API version of the referent."),
            "blockOwnerDeletion": b("If true, AND if the owner has the \"foregroundDeletion\" finalizer, then the owner cannot be deleted from the key-value store until this reference is removed."),
            "controller": b("If true, this reference points to the managing controller."),
            "kind": s("Kind of the referent. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds"),
            "name": s("Name of the referent. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names"),
            "uid": s("UID of the referent. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#uids"),
        },
        "x-kubernetes-map-type": "atomic",
    }));
    m.insert(meta("ManagedFieldsEntry"), json!({
        "description": "ManagedFieldsEntry is a workflow-id, a FieldSet and the group version of the resource that the fieldset applies to.",
        "type": "object",
        "properties": {
            "apiVersion": s("APIVersion defines the version of this resource that this field set applies to. The format is \"group/version\" just like the top-level APIVersion field."),
            "fieldsType": s("FieldsType is the discriminator for the different fields format and version. There is currently only one possible value: \"FieldsV1\""),
            "fieldsV1": all_of(&meta("FieldsV1"), "FieldsV1 holds the first JSON version format as described in the \"FieldsV1\" type."),
            "manager": s("Manager is an identifier of the workflow managing these fields."),
            "operation": s("Operation is the type of operation which lead to this ManagedFieldsEntry being created. The only valid values for this field are 'Apply' and 'Update'."),
            "subresource": s("Subresource is the name of the subresource used to update that object, or empty string if the object was updated through the main resource."),
            "time": all_of(&meta("Time"), "Time is the timestamp of when the ManagedFields entry was added. The timestamp will also be updated if a field is added, the manager changes any of the owned fields value or removes a field."),
        },
    }));
    m.insert(meta("FieldsV1"), json!({
        "description": "FieldsV1 stores a set of fields in a data structure like a Trie, in JSON format.",
        "type": "object",
    }));
    m.insert(meta("Time"), json!({
        "description": "Time is a wrapper around time.Time which supports correct marshaling to YAML and JSON. It is serialized as an RFC 3339 date and time.",
        "type": "string",
        "format": "date-time",
    }));
    m.insert(meta("Status"), json!({
        "description": "Status is a return value for calls that don't return other objects.",
        "type": "object",
        "properties": {
            "apiVersion": s(API_VERSION_DESC),
            "code": i32_("Suggested HTTP return code for this status, 0 if not set."),
            "details": all_of(&meta("StatusDetails"), "Extended data associated with the reason. Each reason may define its own extended details. This field is optional and the data returned is not guaranteed to conform to any schema except that defined by the reason type."),
            "kind": s(KIND_DESC),
            "message": s("A human-readable description of the status of this operation."),
            "metadata": all_of_default(&meta("ListMeta"), LIST_METADATA_DESC),
            "reason": s("A machine-readable description of why this operation is in the \"Failure\" status. If this value is empty there is no information available."),
            "status": s("Status of the operation. One of: \"Success\" or \"Failure\". More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#spec-and-status"),
        },
        "x-kubernetes-group-version-kind": [gvk("", "v1", "Status")],
    }));
    m.insert(meta("StatusDetails"), json!({
        "description": "StatusDetails is a set of additional properties that MAY be set by the server to provide additional information about a response.",
        "type": "object",
        "properties": {
            "causes": {
                "type": "array",
                "items": { "allOf": [ref_to(&meta("StatusCause"))], "default": {} },
                "x-kubernetes-list-type": "atomic",
                "description": "The Causes array includes more details associated with the StatusReason failure. Not all StatusReasons may provide detailed causes.",
            },
            "group": s("The group attribute of the resource associated with the status StatusReason."),
            "kind": s("The kind attribute of the resource associated with the status StatusReason."),
            "name": s("The name attribute of the resource associated with the status StatusReason (when there is a single name which can be described)."),
            "retryAfterSeconds": i32_("If specified, the time in seconds before the operation should be retried."),
            "uid": s("UID of the resource (when there is a single resource which can be described)."),
        },
    }));
    m.insert(meta("StatusCause"), json!({
        "description": "StatusCause provides more information about an api.Status failure, including cases when multiple errors are encountered.",
        "type": "object",
        "properties": {
            "field": s("The field of the resource that has caused this error, as named by its JSON serialization, e.g. \"spec.replicas\"."),
            "message": s("A human-readable description of the cause of the error."),
            "reason": s("A machine-readable description of the cause of the error. If this value is empty there is no information available."),
        },
    }));
    m.insert(meta("DeleteOptions"), json!({
        "description": "DeleteOptions may be provided when deleting an API object.",
        "type": "object",
        "properties": {
            "apiVersion": s(API_VERSION_DESC),
            "dryRun": {
                "type": "array",
                "items": { "type": "string", "default": "" },
                "x-kubernetes-list-type": "atomic",
                "description": "When present, indicates that modifications should not be persisted. Valid values are: All (process all dry run stages).",
            },
            "gracePeriodSeconds": i64_("The duration in seconds before the object should be deleted. Zero means delete immediately."),
            "ignoreStoreReadErrorWithClusterBreakingPotential": b("if set to true, it will trigger an unsafe deletion of the resource in case the normal deletion flow fails with a corrupt object error."),
            "kind": s(KIND_DESC),
            "orphanDependents": b("Deprecated: please use the PropagationPolicy. Should the dependent objects be orphaned."),
            "preconditions": all_of(&meta("Preconditions"), "Must be fulfilled before a deletion is carried out. If not possible, a 409 Conflict status will be returned."),
            "propagationPolicy": s("Whether and how garbage collection will be performed. Acceptable values are: 'Orphan', 'Background' and 'Foreground'."),
        },
        "x-kubernetes-group-version-kind": [gvk("", "v1", "DeleteOptions")],
    }));
    m.insert(meta("Preconditions"), json!({
        "description": "Preconditions must be fulfilled before an operation (update, delete, etc.) is carried out.",
        "type": "object",
        "properties": {
            "resourceVersion": s("Specifies the target ResourceVersion"),
            "uid": s("Specifies the target UID."),
        },
    }));
    m.insert(meta("Patch"), json!({
        "description": "Patch is provided to give a concrete name and type to the Kubernetes PATCH request body.",
        "type": "object",
    }));
    m.insert(meta("WatchEvent"), json!({
        "description": "Event represents a single event to a watched resource.",
        "type": "object",
        "required": ["type", "object"],
        "properties": {
            "object": all_of(RAW_EXTENSION, "Object is: * If Type is Added or Modified: the new state of the object. * If Type is Deleted: the state of the object immediately before deletion. * If Type is Error: *Status is recommended; other types may make sense depending on context."),
            "type": s("Type of the event: ADDED, MODIFIED, DELETED, BOOKMARK or ERROR."),
        },
        "x-kubernetes-group-version-kind": [gvk("", "v1", "WatchEvent")],
    }));
    m.insert(RAW_EXTENSION.into(), json!({
        "description": "RawExtension holds an embedded object of any kind, serialized as JSON.",
        "type": "object",
    }));
    m
}

// ---------------------------------------------------------------------------------------------
// Paths and operations

fn query_param(name: &str, ty: &str, description: &str) -> Value {
    json!({ "name": name, "in": "query", "description": description, "schema": { "type": ty }, "uniqueItems": true })
}

fn path_param(name: &str, description: &str) -> Value {
    json!({ "name": name, "in": "path", "required": true, "description": description, "schema": { "type": "string" }, "uniqueItems": true })
}

fn p_pretty() -> Value {
    query_param("pretty", "string", "If 'true', then the output is pretty printed.")
}
fn p_dry_run() -> Value {
    query_param("dryRun", "string", "When present, indicates that modifications should not be persisted. An invalid or unrecognized dryRun directive will result in an error response and no further processing of the request. Valid values are: - All: all dry run stages will be processed")
}
fn p_field_manager(required_for_apply: bool) -> Value {
    let mut d = "fieldManager is a name associated with the actor or entity that is making these changes. The value must be less than or 128 characters long, and only contain printable characters, as defined by https://golang.org/pkg/unicode/#IsPrint.".to_string();
    if required_for_apply {
        d.push_str(" This field is required for apply requests (application/apply-patch) but optional for non-apply patch types (JsonPatch, MergePatch, StrategicMergePatch).");
    }
    query_param("fieldManager", "string", &d)
}
fn p_field_validation() -> Value {
    query_param("fieldValidation", "string", "fieldValidation instructs the server on how to handle objects in the request (POST/PUT/PATCH) containing unknown or duplicate fields. Valid values are: - Ignore: silently drops unknown fields and keeps the last duplicate. - Warn: sends a warning via the standard warning response header for each unknown or duplicate field, the request still succeeds. - Strict: fails the request with a BadRequest error if any unknown or duplicate fields are present.")
}
fn p_force() -> Value {
    query_param("force", "boolean", "Force is going to \"force\" Apply requests. It means user will re-acquire conflicting fields owned by other people. Force flag must be unset for non-apply patch requests.")
}

fn write_params() -> Vec<Value> {
    vec![p_dry_run(), p_field_manager(false), p_field_validation()]
}

fn patch_params() -> Vec<Value> {
    vec![p_dry_run(), p_field_manager(true), p_field_validation(), p_force()]
}

fn list_params() -> Vec<Value> {
    vec![
        query_param("allowWatchBookmarks", "boolean", "allowWatchBookmarks requests watch events with type \"BOOKMARK\". Servers that do not implement bookmarks may ignore this flag. Ignored when watch is not set."),
        query_param("continue", "string", "The continue option should be set when retrieving more results from the server. Its value is the opaque token returned in the previous list's metadata.continue; the rest of the query must be identical."),
        query_param("fieldSelector", "string", "A selector to restrict the list of returned objects by their fields. Defaults to everything."),
        query_param("labelSelector", "string", "A selector to restrict the list of returned objects by their labels. Defaults to everything."),
        query_param("limit", "integer", "limit is a maximum number of responses to return for a list call. If more items exist, the server will set the `continue` field on the list metadata to a value that can be used with the same initial query to retrieve the next set of results."),
        query_param("resourceVersion", "string", "resourceVersion sets a constraint on what resource versions a request may be served from. Defaults to unset. See https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-versions for details."),
        query_param("resourceVersionMatch", "string", "resourceVersionMatch determines how resourceVersion is applied to list calls. Defaults to unset."),
        query_param("sendInitialEvents", "boolean", "`sendInitialEvents=true` may be set together with `watch=true`. In that case, the watch stream will begin with synthetic events to produce the current state of objects in the collection."),
        query_param("timeoutSeconds", "integer", "Timeout for the list/watch call. This limits the duration of the call, regardless of any activity or inactivity."),
        query_param("watch", "boolean", "Watch for changes to the described resources and return them as a stream of add, update, and remove notifications. Specify resourceVersion."),
    ]
}

fn delete_params() -> Vec<Value> {
    vec![
        p_dry_run(),
        query_param("gracePeriodSeconds", "integer", "The duration in seconds before the object should be deleted. Value must be non-negative integer. The value zero indicates delete immediately."),
        query_param("ignoreStoreReadErrorWithClusterBreakingPotential", "boolean", "if set to true, it will trigger an unsafe deletion of the resource in case the normal deletion flow fails with a corrupt object error."),
        query_param("orphanDependents", "boolean", "Deprecated: please use the PropagationPolicy, this field will be deprecated in 1.7. Should the dependent objects be orphaned."),
        query_param("propagationPolicy", "string", "Whether and how garbage collection will be performed. Either this field or OrphanDependents may be set, but not both. Acceptable values are: 'Orphan', 'Background', 'Foreground'."),
    ]
}

fn delete_collection_params() -> Vec<Value> {
    let mut v = delete_params();
    for name in ["continue", "fieldSelector", "labelSelector", "limit", "resourceVersion", "resourceVersionMatch", "sendInitialEvents", "timeoutSeconds"] {
        v.extend(list_params().into_iter().filter(|p| p["name"] == name));
    }
    v.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    v
}

fn code_description(code: &str) -> &'static str {
    match code {
        "200" => "OK",
        "201" => "Created",
        "202" => "Accepted",
        _ => "",
    }
}

fn responses(codes: &[&str], schema: &str, content_types: &[&str]) -> Value {
    let mut m = Map::new();
    for code in codes {
        let content: Map<String, Value> =
            content_types.iter().map(|ct| (ct.to_string(), json!({ "schema": ref_to(schema) }))).collect();
        m.insert(code.to_string(), json!({ "description": code_description(code), "content": content }));
    }
    m.insert("401".into(), json!({ "description": "Unauthorized" }));
    Value::Object(m)
}

fn request_body(schema: &str, content_types: &[&str]) -> Value {
    let content: Map<String, Value> =
        content_types.iter().map(|ct| (ct.to_string(), json!({ "schema": ref_to(schema) }))).collect();
    json!({ "content": content, "required": true })
}

const JSON: &[&str] = &["application/json"];
const JSON_AND_STREAM: &[&str] = &["application/json", "application/json;stream=watch"];

fn patch_content_types(r: &ResourceType) -> Vec<&'static str> {
    let mut v = vec!["application/apply-patch+yaml", "application/json-patch+json", "application/merge-patch+json"];
    if r.builtin.is_some() {
        v.push("application/strategic-merge-patch+json");
    }
    v
}

struct Op<'a> {
    action: &'a str,
    id: String,
    description: String,
    gvk: Value,
    params: Vec<Value>,
    body: Option<Value>,
    responses: Value,
}

fn operation(op: Op) -> Value {
    let mut m = Map::new();
    m.insert("description".into(), json!(op.description));
    m.insert("operationId".into(), json!(op.id));
    if !op.params.is_empty() {
        m.insert("parameters".into(), Value::Array(op.params));
    }
    if let Some(b) = op.body {
        m.insert("requestBody".into(), b);
    }
    m.insert("responses".into(), op.responses);
    m.insert("x-kubernetes-action".into(), json!(op.action));
    m.insert("x-kubernetes-group-version-kind".into(), op.gvk);
    Value::Object(m)
}

fn path_item(params: Vec<Value>, ops: Vec<(&str, Value)>) -> Value {
    let mut m = Map::new();
    for (method, op) in ops {
        m.insert(method.into(), op);
    }
    m.insert("parameters".into(), Value::Array(params));
    Value::Object(m)
}

fn add_paths(paths: &mut Map<String, Value>, r: &ResourceType, name: &str, list_name: &str) {
    let base = format!("/{}", gv_path_of(&r.group, &r.version));
    let infix = op_infix(r);
    let kind = &r.kind;
    let scoped = if r.namespaced { format!("Namespaced{kind}") } else { kind.clone() };
    let ns_seg = if r.namespaced { "namespaces/{namespace}/" } else { "" };
    let collection = format!("{base}/{ns_seg}{}", r.plural);
    let item = format!("{collection}/{{name}}");
    let the_gvk = gvk(&r.group, &r.version, kind);
    let ns_param = || path_param("namespace", "object name and auth scope, such as for teams and projects");
    let name_param = |what: &str| path_param("name", &format!("name of the {what}"));
    let scope_params = |with_name: Option<&str>| {
        let mut v = Vec::new();
        if let Some(what) = with_name {
            v.push(name_param(what));
        }
        if r.namespaced {
            v.push(ns_param());
        }
        v.push(p_pretty());
        v
    };
    let patch_types = patch_content_types(r);
    let delete_options = meta("DeleteOptions");
    let status = meta("Status");
    let watch_event = meta("WatchEvent");

    // Collection: list, create, deletecollection.
    paths.insert(collection.clone(), path_item(scope_params(None), vec![
        ("delete", operation(Op {
            action: "deletecollection",
            id: format!("delete{infix}Collection{scoped}"),
            description: format!("delete collection of {kind}"),
            gvk: the_gvk.clone(),
            params: delete_collection_params(),
            body: Some(request_body(&delete_options, JSON)),
            responses: responses(&["200"], &status, JSON),
        })),
        ("get", operation(Op {
            action: "list",
            id: format!("list{infix}{scoped}"),
            description: format!("list or watch objects of kind {kind}"),
            gvk: the_gvk.clone(),
            params: list_params(),
            body: None,
            responses: responses(&["200"], list_name, JSON_AND_STREAM),
        })),
        ("post", operation(Op {
            action: "post",
            id: format!("create{infix}{scoped}"),
            description: format!("create a {kind}"),
            gvk: the_gvk.clone(),
            params: write_params(),
            body: Some(request_body(name, JSON)),
            responses: responses(&["200", "201", "202"], name, JSON),
        })),
    ]));

    // Item: read, replace, patch, delete.
    paths.insert(item.clone(), path_item(scope_params(Some(kind)), vec![
        ("delete", operation(Op {
            action: "delete",
            id: format!("delete{infix}{scoped}"),
            description: format!("delete a {kind}"),
            gvk: the_gvk.clone(),
            params: delete_params(),
            body: Some(request_body(&delete_options, JSON)),
            responses: responses(&["200", "202"], &status, JSON),
        })),
        ("get", operation(Op {
            action: "get",
            id: format!("read{infix}{scoped}"),
            description: format!("read the specified {kind}"),
            gvk: the_gvk.clone(),
            params: vec![],
            body: None,
            responses: responses(&["200"], name, JSON),
        })),
        ("patch", operation(Op {
            action: "patch",
            id: format!("patch{infix}{scoped}"),
            description: format!("partially update the specified {kind}"),
            gvk: the_gvk.clone(),
            params: patch_params(),
            body: Some(request_body(&meta("Patch"), &patch_types)),
            responses: responses(&["200", "201"], name, JSON),
        })),
        ("put", operation(Op {
            action: "put",
            id: format!("replace{infix}{scoped}"),
            description: format!("replace the specified {kind}"),
            gvk: the_gvk.clone(),
            params: write_params(),
            body: Some(request_body(name, JSON)),
            responses: responses(&["200", "201"], name, JSON),
        })),
    ]));

    // Subresources: read, replace, patch.
    let mut subresources: Vec<(&str, &str, String, Value)> = Vec::new();
    if r.status_subresource {
        subresources.push(("status", "Status", name.to_string(), the_gvk.clone()));
    }
    if r.scale.is_some() {
        subresources.push(("scale", "Scale", SCALE.to_string(), gvk("autoscaling", "v1", "Scale")));
    }
    for (sub, suffix, schema, sub_gvk) in subresources {
        let what = if sub == "status" { format!("status of the specified {kind}") } else { format!("scale of the specified {kind}") };
        paths.insert(format!("{item}/{sub}"), path_item(scope_params(Some(kind)), vec![
            ("get", operation(Op {
                action: "get",
                id: format!("read{infix}{scoped}{suffix}"),
                description: format!("read {what}"),
                gvk: sub_gvk.clone(),
                params: vec![],
                body: None,
                responses: responses(&["200"], &schema, JSON),
            })),
            ("patch", operation(Op {
                action: "patch",
                id: format!("patch{infix}{scoped}{suffix}"),
                description: format!("partially update {what}"),
                gvk: sub_gvk.clone(),
                params: patch_params(),
                body: Some(request_body(&meta("Patch"), &patch_types)),
                responses: responses(&["200", "201"], &schema, JSON),
            })),
            ("put", operation(Op {
                action: "put",
                id: format!("replace{infix}{scoped}{suffix}"),
                description: format!("replace {what}"),
                gvk: sub_gvk.clone(),
                params: write_params(),
                body: Some(request_body(&schema, JSON)),
                responses: responses(&["200", "201"], &schema, JSON),
            })),
        ]));
    }

    // Listing across namespaces.
    if r.namespaced {
        paths.insert(format!("{base}/{}", r.plural), path_item(vec![p_pretty()], vec![
            ("get", operation(Op {
                action: "list",
                id: format!("list{infix}{kind}ForAllNamespaces"),
                description: format!("list or watch objects of kind {kind}"),
                gvk: the_gvk.clone(),
                params: list_params(),
                body: None,
                responses: responses(&["200"], list_name, JSON_AND_STREAM),
            })),
        ]));
    }

    // Deprecated watch paths (the `watch=true` parameter on list is the way to watch).
    let mut watches: Vec<(String, Vec<Value>, &str, String, String)> = vec![
        (format!("{base}/watch/{ns_seg}{}", r.plural), scope_params(None), "watchlist",
         format!("watch{infix}{scoped}List"), format!("watch individual changes to a list of {kind}. deprecated: use the 'watch' parameter with a list operation instead.")),
        (format!("{base}/watch/{ns_seg}{}/{{name}}", r.plural), scope_params(Some(kind)), "watch",
         format!("watch{infix}{scoped}"), format!("watch changes to an object of kind {kind}. deprecated: use the 'watch' parameter with a list operation instead, filtered to a single item with the 'fieldSelector' parameter.")),
    ];
    if r.namespaced {
        watches.push((format!("{base}/watch/{}", r.plural), vec![p_pretty()], "watchlist",
            format!("watch{infix}{kind}ListForAllNamespaces"), format!("watch individual changes to a list of {kind}. deprecated: use the 'watch' parameter with a list operation instead.")));
    }
    for (path, params, action, id, description) in watches {
        paths.insert(path, path_item(params, vec![
            ("get", operation(Op {
                action,
                id,
                description,
                gvk: the_gvk.clone(),
                params: list_params(),
                body: None,
                responses: responses(&["200"], &watch_event, JSON_AND_STREAM),
            })),
        ]));
    }
}

// ---------------------------------------------------------------------------------------------
// Hash

/// FNV-1a (128 bit) over a key-sorted serialization, as 32 upper-case hex digits.
fn hash_hex(v: &Value) -> String {
    let mut s = String::new();
    canonical(v, &mut s);
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013B;
    let mut h = OFFSET;
    for b in s.bytes() {
        h ^= b as u128;
        h = h.wrapping_mul(PRIME);
    }
    format!("{h:032X}")
}

fn canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                canonical(&m[k], out);
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(x, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::registry::ScaleSpec;

    fn rt(group: &str, version: &str, kind: &str, plural: &str, namespaced: bool, builtin: Option<Builtin>, schema: Value) -> ResourceType {
        ResourceType {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            list_kind: format!("{kind}List"),
            plural: plural.into(),
            singular: kind.to_ascii_lowercase(),
            namespaced,
            short_names: vec![],
            categories: vec![],
            status_subresource: false,
            scale: None,
            shape: crate::schema::shape::Shape::from_openapi(&schema),
            schema,
            columns: vec![],
            builtin,
            selectable_fields: vec![],
            crd_name: None,
        }
    }

    fn builtin_schema(description: &str, props: Value) -> Value {
        let mut p = props;
        p["apiVersion"] = json!({"type": "string"});
        p["kind"] = json!({"type": "string"});
        p["metadata"] = json!({"type": "object", "description": "Standard object's metadata."});
        json!({"type": "object", "description": description, "properties": p})
    }

    fn vm_schema(placement_description: &str) -> Value {
        json!({
            "type": "object",
            "description": "VirtualMachine is a guest.",
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["class"],
                    "properties": {
                        "class": {"type": "string", "description": "Name of the VMClass."},
                        "replicas": {"type": "integer", "format": "int32"},
                        "placement": {
                            "type": "object",
                            "description": placement_description,
                            "nullable": true,
                            "properties": {
                                "zone": {"type": "string", "enum": ["a", "b"], "description": "Zone to run in."},
                                "size": {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": true},
                            },
                        },
                        "disks": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                                  "items": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}},
                    },
                },
                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            },
        })
    }

    fn sample(placement_description: &str) -> Vec<Arc<ResourceType>> {
        let s = || json!({"type": "string"});
        let mut ns = rt("", "v1", "Namespace", "namespaces", false, Some(Builtin::Namespace),
            builtin_schema("Namespace provides a scope for Names.", json!({"spec": {"type": "object"}, "status": {"type": "object"}})));
        ns.status_subresource = true;
        let secret = rt("", "v1", "Secret", "secrets", true, Some(Builtin::Secret),
            builtin_schema("Secret holds secret data of a certain type.", json!({
                "data": {"type": "object", "additionalProperties": {"type": "string", "format": "byte"}},
                "stringData": {"type": "object", "additionalProperties": s()}, "type": s(), "immutable": {"type": "boolean"}})));
        let cm = rt("", "v1", "ConfigMap", "configmaps", true, Some(Builtin::ConfigMap), builtin_schema("ConfigMap.", json!({})));
        let ev = rt("", "v1", "Event", "events", true, Some(Builtin::Event), builtin_schema("Event.", json!({"reason": s()})));
        let ev1 = rt("events.k8s.io", "v1", "Event", "events", true, Some(Builtin::EventsV1), builtin_schema("Event.", json!({"note": s()})));
        let lease = rt("coordination.k8s.io", "v1", "Lease", "leases", true, Some(Builtin::Lease),
            builtin_schema("Lease defines a lease concept.", json!({"spec": {"type": "object", "properties": {"holderIdentity": s()}}})));
        let mut crd = rt("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions", false, Some(Builtin::Crd),
            builtin_schema("CRD.", json!({"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}})));
        crd.status_subresource = true;
        let mut vm = rt("banlieue.io", "v1alpha1", "VirtualMachine", "virtualmachines", true, None, vm_schema(placement_description));
        vm.status_subresource = true;
        vm.scale = Some(ScaleSpec { spec_replicas_path: ".spec.replicas".into(), status_replicas_path: ".status.replicas".into(), label_selector_path: None });
        vm.crd_name = Some("virtualmachines.banlieue.io".into());
        // Cluster scoped, schema declares apiVersion/kind/metadata itself.
        let vmclass = rt("banlieue.io", "v1alpha1", "VMClass", "vmclasses", false, None, json!({
            "type": "object",
            "properties": {
                "apiVersion": {"type": "string"}, "kind": {"type": "string"},
                "metadata": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}}},
                "cpus": {"type": "integer", "description": "Number of CPUs."},
            },
        }));
        // A schema that is just "anything".
        let blob = rt("banlieue.io", "v1", "Blob", "blobs", true, None, json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}));
        vec![ns, secret, cm, ev, ev1, lease, crd, vm, vmclass, blob].into_iter().map(Arc::new).collect()
    }

    /// What kubectl does: /openapi/v3, then the document behind the group-version's serverRelativeURL.
    fn fetch(resources: &[Arc<ResourceType>], gv_path: &str) -> Value {
        let idx = index(resources);
        let url = idx["paths"][gv_path]["serverRelativeURL"].as_str().expect("gv in index");
        let (path, hash) = url.split_once("?hash=").expect("hash");
        assert!(!hash.is_empty() && hash.chars().all(|c| c.is_ascii_hexdigit()));
        let rest = path.strip_prefix("/openapi/v3/").expect("prefix");
        assert_eq!(rest, gv_path);
        group_version_doc(resources, rest).expect("doc")
    }

    fn gvk_map(g: &str, v: &str, k: &str) -> Value {
        json!({"group": g, "version": v, "kind": k})
    }

    /// kubectl's QueryParamVerifierV3: the first patch operation (in any path order) whose GVK
    /// matches decides.  We check all of them, so the answer cannot depend on map order.
    fn supports_query_param(doc: &Value, g: &str, v: &str, k: &str, param: &str) -> bool {
        let want = gvk_map(g, v, k);
        let mut found = false;
        for (_, item) in doc["paths"].as_object().unwrap() {
            let Some(op) = item.get("patch") else { continue };
            if op.get("x-kubernetes-group-version-kind") != Some(&want) {
                continue;
            }
            let has = op["parameters"].as_array().unwrap().iter().any(|p| p["name"] == param);
            if !has {
                return false;
            }
            found = true;
        }
        found
    }

    fn resolve<'a>(doc: &'a Value, r: &str) -> Option<&'a Value> {
        let name = r.strip_prefix("#/components/schemas/")?;
        doc["components"]["schemas"].get(name)
    }

    /// kubectl explain v2: GVK from the resource's operations, then the component schema.
    fn explain_schema<'a>(doc: &'a Value, r: &ResourceType) -> &'a Value {
        let prefix = if r.group.is_empty() { "/api".to_string() } else { format!("/apis/{}", r.group) };
        let p = format!("{prefix}/{}", r.version);
        let searches = [
            format!("{p}/{}", r.plural),
            format!("{p}/{}/{{name}}", r.plural),
            format!("{p}/namespaces/{{namespace}}/{}", r.plural),
            format!("{p}/namespaces/{{namespace}}/{}/{{name}}", r.plural),
        ];
        let mut gvk = None;
        'outer: for s in &searches {
            let Some(item) = doc["paths"].get(s) else { continue };
            for m in ["get", "post", "put", "patch", "delete"] {
                if let Some(g) = item.get(m).and_then(|o| o.get("x-kubernetes-group-version-kind")) {
                    gvk = Some(g.clone());
                    break 'outer;
                }
            }
        }
        let gvk = gvk.expect("GVK on an operation");
        assert_eq!(gvk, gvk_map(&r.group, &r.version, &r.kind));
        doc["components"]["schemas"].as_object().unwrap().values()
            .find(|s| s["x-kubernetes-group-version-kind"].as_array().is_some_and(|l| l.contains(&gvk)))
            .expect("component with GVK")
    }

    /// Follows a field path the way explain does (properties, $ref, allOf, items, additionalProperties).
    fn field<'a>(doc: &'a Value, mut s: &'a Value, path: &[&str]) -> Option<&'a Value> {
        for (i, f) in path.iter().enumerate() {
            loop {
                if let Some(r) = s.get("$ref").and_then(Value::as_str) {
                    s = resolve(doc, r)?;
                } else if s.get("properties").and_then(|p| p.get(*f)).is_some() {
                    break;
                } else if let Some(a) = s.get("allOf").and_then(Value::as_array) {
                    return a.iter().find_map(|sub| field(doc, sub, &path[i..]));
                } else if let Some(it) = s.get("items") {
                    s = it;
                } else {
                    return None;
                }
            }
            s = &s["properties"][*f];
        }
        Some(s)
    }

    fn collect_refs<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    if k == "$ref" {
                        out.push(x.as_str().unwrap());
                    } else {
                        collect_refs(x, out);
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|x| collect_refs(x, out)),
            _ => {}
        }
    }

    #[test]
    fn field_validation_is_discoverable_for_every_resource() {
        let rs = sample("Where to run.");
        for r in &rs {
            let doc = fetch(&rs, &gv_path_of(&r.group, &r.version));
            assert!(supports_query_param(&doc, &r.group, &r.version, &r.kind, "fieldValidation"), "{}", r.kind);
            assert!(supports_query_param(&doc, &r.group, &r.version, &r.kind, "dryRun"), "{}", r.kind);
        }
        // And not for a kind that is not served there.
        let doc = fetch(&rs, "apis/banlieue.io/v1alpha1");
        assert!(!supports_query_param(&doc, "banlieue.io", "v1alpha1", "Nope", "fieldValidation"));
    }

    #[test]
    fn operations_are_complete() {
        let rs = sample("x");
        let want = [
            ("get", "get"), ("put", "put"), ("patch", "patch"), ("delete", "delete"),
        ];
        for r in &rs {
            let doc = fetch(&rs, &gv_path_of(&r.group, &r.version));
            let base = if r.group.is_empty() { "/api/v1".to_string() } else { format!("/apis/{}/{}", r.group, r.version) };
            let coll = if r.namespaced { format!("{base}/namespaces/{{namespace}}/{}", r.plural) } else { format!("{base}/{}", r.plural) };
            let item = format!("{coll}/{{name}}");
            let c = &doc["paths"][&coll];
            let i = &doc["paths"][&item];
            for (m, action) in want {
                assert_eq!(i[m]["x-kubernetes-action"], action, "{item} {m}");
                assert_eq!(i[m]["x-kubernetes-group-version-kind"], gvk_map(&r.group, &r.version, &r.kind));
                assert!(i[m]["operationId"].is_string());
            }
            for (m, action) in [("get", "list"), ("post", "post"), ("delete", "deletecollection")] {
                assert_eq!(c[m]["x-kubernetes-action"], action, "{coll} {m}");
            }
            let names = |op: &Value| op["parameters"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap().to_string()).collect::<Vec<_>>();
            for p in ["labelSelector", "fieldSelector", "limit", "continue", "watch", "resourceVersion"] {
                assert!(names(&c["get"]).contains(&p.to_string()), "{p}");
            }
            for p in ["fieldValidation", "fieldManager", "dryRun", "force"] {
                assert!(names(&i["patch"]).contains(&p.to_string()), "{p}");
            }
            let path_names = |item: &Value| names(item);
            assert!(path_names(i).contains(&"name".to_string()));
            assert_eq!(path_names(i).contains(&"namespace".to_string()), r.namespaced);
            let types: Vec<&String> = i["patch"]["requestBody"]["content"].as_object().unwrap().keys().collect();
            for t in ["application/json-patch+json", "application/merge-patch+json", "application/apply-patch+yaml"] {
                assert!(types.iter().any(|x| *x == t));
            }
            assert_eq!(types.iter().any(|x| *x == "application/strategic-merge-patch+json"), r.builtin.is_some(), "{}", r.kind);
            let item_schema = schema_name(r, &r.kind);
            assert_eq!(i["get"]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"], schema_ref(&item_schema));
            assert_eq!(c["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"], schema_ref(&item_schema));
            assert_eq!(c["get"]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"], schema_ref(&schema_name(r, &r.list_kind)));
            assert_eq!(doc["paths"].get(format!("{item}/status")).is_some(), r.status_subresource);
            assert_eq!(doc["paths"].get(format!("{item}/scale")).is_some(), r.scale.is_some());
        }
        let doc = fetch(&rs, "apis/banlieue.io/v1alpha1");
        let scale = &doc["paths"]["/apis/banlieue.io/v1alpha1/namespaces/{namespace}/virtualmachines/{name}/scale"];
        assert_eq!(scale["patch"]["x-kubernetes-group-version-kind"], gvk_map("autoscaling", "v1", "Scale"));
        assert!(doc["components"]["schemas"].get(SCALE).is_some());
        assert!(doc["paths"].get("/apis/banlieue.io/v1alpha1/vmclasses/{name}").is_some());
        let core = fetch(&rs, "api/v1");
        assert!(core["paths"].get("/api/v1/namespaces/{namespace}/secrets/{name}").is_some());
        assert!(core["paths"].get("/api/v1/namespaces/{name}/status").is_some());
        assert!(core["components"]["schemas"].get(SCALE).is_none());
    }

    #[test]
    fn explain_finds_fields_and_object_meta() {
        let rs = sample("Where to run.");
        for r in &rs {
            let doc = fetch(&rs, &gv_path_of(&r.group, &r.version));
            let s = explain_schema(&doc, r);
            for f in ["apiVersion", "kind"] {
                let p = field(&doc, s, &[f]).unwrap();
                assert_eq!(p["type"], "string");
                assert!(p["description"].is_string());
            }
            let name = field(&doc, s, &["metadata", "name"]).expect("ObjectMeta reachable");
            assert_eq!(name["type"], "string");
            let owner_uid = field(&doc, s, &["metadata", "ownerReferences", "uid"]).expect("OwnerReference");
            assert_eq!(owner_uid["type"], "string");
            let ts = field(&doc, s, &["metadata", "creationTimestamp"]).unwrap();
            let t = resolve(&doc, ts["allOf"][0]["$ref"].as_str().unwrap()).unwrap();
            assert_eq!(t["format"], "date-time");
            assert!(field(&doc, s, &["metadata", "managedFields", "manager"]).is_some());
        }
        let doc = fetch(&rs, "apis/banlieue.io/v1alpha1");
        let vm = explain_schema(&doc, &rs[7]);
        let placement = field(&doc, vm, &["spec", "placement"]).unwrap();
        assert_eq!(placement["description"], "Where to run.");
        assert_eq!(placement["nullable"], true);
        assert_eq!(field(&doc, vm, &["spec", "placement", "zone"]).unwrap()["enum"], json!(["a", "b"]));
        assert_eq!(field(&doc, vm, &["spec", "placement", "size"]).unwrap()["x-kubernetes-int-or-string"], true);
        assert_eq!(field(&doc, vm, &["spec", "disks"]).unwrap()["x-kubernetes-list-map-keys"], json!(["name"]));
        assert_eq!(field(&doc, vm, &["spec"]).unwrap()["required"], json!(["class"]));
        let core = fetch(&rs, "api/v1");
        let secret = explain_schema(&core, &rs[1]);
        assert_eq!(field(&core, secret, &["data"]).unwrap()["additionalProperties"]["format"], "byte");
        // The list's items point back to the object.
        let list = &core["components"]["schemas"]["io.k8s.api.core.v1.SecretList"];
        assert_eq!(list["properties"]["items"]["items"]["$ref"], "#/components/schemas/io.k8s.api.core.v1.Secret");
        assert_eq!(list["x-kubernetes-group-version-kind"], json!([gvk_map("", "v1", "SecretList")]));
    }

    #[test]
    fn every_ref_resolves() {
        let rs = sample("x");
        for gv in ["api/v1", "apis/banlieue.io/v1alpha1", "apis/banlieue.io/v1", "apis/coordination.k8s.io/v1",
                   "apis/events.k8s.io/v1", "apis/apiextensions.k8s.io/v1"] {
            let doc = fetch(&rs, gv);
            let mut refs = vec![];
            collect_refs(&doc, &mut refs);
            assert!(!refs.is_empty());
            for r in refs {
                assert!(resolve(&doc, r).is_some(), "{gv}: {r}");
            }
            for m in ["ObjectMeta", "ListMeta", "OwnerReference", "ManagedFieldsEntry", "Time", "Status", "DeleteOptions", "Patch", "WatchEvent"] {
                assert!(doc["components"]["schemas"].get(meta(m)).is_some(), "{m}");
            }
        }
    }

    #[test]
    fn names() {
        let rs = sample("x");
        let names: Vec<String> = rs.iter().map(|r| schema_name(r, &r.kind)).collect();
        assert_eq!(names, [
            "io.k8s.api.core.v1.Namespace",
            "io.k8s.api.core.v1.Secret",
            "io.k8s.api.core.v1.ConfigMap",
            "io.k8s.api.core.v1.Event",
            "io.k8s.api.events.v1.Event",
            "io.k8s.api.coordination.v1.Lease",
            "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.CustomResourceDefinition",
            "io.banlieue.v1alpha1.VirtualMachine",
            "io.banlieue.v1alpha1.VMClass",
            "io.banlieue.v1.Blob",
        ]);
        assert_eq!(schema_name(&rs[1], "SecretList"), "io.k8s.api.core.v1.SecretList");
        let doc = fetch(&rs, "apis/banlieue.io/v1alpha1");
        assert!(doc["components"]["schemas"].get("io.banlieue.v1alpha1.VirtualMachineList").is_some());
        let op = &doc["paths"]["/apis/banlieue.io/v1alpha1/namespaces/{namespace}/virtualmachines/{name}"]["patch"];
        assert_eq!(op["operationId"], "patchBanlieueIoV1alpha1NamespacedVirtualMachine");
        let core = fetch(&rs, "api/v1");
        assert_eq!(core["paths"]["/api/v1/namespaces/{namespace}/secrets"]["get"]["operationId"], "listCoreV1NamespacedSecret");
        assert_eq!(core["paths"]["/api/v1/namespaces"]["post"]["operationId"], "createCoreV1Namespace");
        // Operation ids are unique within a document.
        for gv in ["api/v1", "apis/banlieue.io/v1alpha1"] {
            let doc = fetch(&rs, gv);
            let mut ids = vec![];
            for item in doc["paths"].as_object().unwrap().values() {
                for (k, op) in item.as_object().unwrap() {
                    if k != "parameters" {
                        ids.push(op["operationId"].as_str().unwrap().to_string());
                    }
                }
            }
            let n = ids.len();
            ids.sort();
            ids.dedup();
            assert_eq!(ids.len(), n, "{gv}");
        }
    }

    #[test]
    fn index_lists_every_group_version() {
        let rs = sample("x");
        let idx = index(&rs);
        let keys: Vec<&String> = idx["paths"].as_object().unwrap().keys().collect();
        let mut want = vec!["api/v1", "apis/apiextensions.k8s.io/v1", "apis/banlieue.io/v1", "apis/banlieue.io/v1alpha1",
                            "apis/coordination.k8s.io/v1", "apis/events.k8s.io/v1"];
        want.sort();
        assert_eq!(keys, want);
    }

    #[test]
    fn hash_is_stable_and_tracks_schema_changes() {
        let a = index(&sample("Where to run."));
        let b = index(&sample("Where to run."));
        assert_eq!(a, b);
        let mut reversed = sample("Where to run.");
        reversed.reverse();
        assert_eq!(index(&reversed), a);
        let c = index(&sample("Where the VM runs."));
        let url = |v: &Value, gv: &str| v["paths"][gv]["serverRelativeURL"].as_str().unwrap().to_string();
        assert_ne!(url(&a, "apis/banlieue.io/v1alpha1"), url(&c, "apis/banlieue.io/v1alpha1"));
        assert_eq!(url(&a, "api/v1"), url(&c, "api/v1"));
        assert_eq!(url(&a, "apis/banlieue.io/v1"), url(&c, "apis/banlieue.io/v1"));
        // Same document regardless of resource order.
        assert_eq!(group_version_doc(&reversed, "api/v1"), group_version_doc(&sample("x"), "api/v1"));
    }

    #[test]
    fn unknown_group_versions() {
        let rs = sample("x");
        for p in ["api/v2", "apis/banlieue.io/v9", "apis/nope.io/v1", "apis/banlieue.io", "apis", "api", "", "foo/bar",
                  "apis/banlieue.io/v1alpha1/extra", "api/v1/x"] {
            assert!(group_version_doc(&rs, p).is_none(), "{p}");
        }
        assert!(group_version_doc(&rs, "/apis/banlieue.io/v1alpha1").is_some());
        assert!(group_version_doc(&rs, "api/v1?hash=ABC").is_some());
        assert!(group_version_doc(&[], "api/v1").is_none());
        assert_eq!(index(&[]), json!({"paths": {}}));
    }

    #[test]
    fn input_is_untouched_and_extensions_pass_through() {
        let rs = sample("x");
        let before: Vec<Value> = rs.iter().map(|r| r.schema.clone()).collect();
        let doc = fetch(&rs, "apis/banlieue.io/v1alpha1");
        let _ = fetch(&rs, "api/v1");
        let after: Vec<Value> = rs.iter().map(|r| r.schema.clone()).collect();
        assert_eq!(before, after);
        let vmclass = &doc["components"]["schemas"]["io.banlieue.v1alpha1.VMClass"];
        assert_eq!(vmclass["properties"]["metadata"]["allOf"][0]["$ref"], schema_ref(&meta("ObjectMeta")));
        assert_eq!(vmclass["properties"]["metadata"]["default"], json!({}));
        assert_eq!(vmclass["properties"]["kind"]["type"], "string");
        assert!(vmclass["properties"]["kind"]["description"].is_string());
        assert_eq!(vmclass["x-kubernetes-group-version-kind"], json!([gvk_map("banlieue.io", "v1alpha1", "VMClass")]));
        let blob = &fetch(&rs, "apis/banlieue.io/v1")["components"]["schemas"]["io.banlieue.v1.Blob"];
        assert_eq!(blob["x-kubernetes-preserve-unknown-fields"], true);
        assert!(blob["properties"]["metadata"].is_object());
    }
}

