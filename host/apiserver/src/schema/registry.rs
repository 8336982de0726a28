//! What the server serves: the built-in resources and those defined by CRDs.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use serde_json::{json, Value};

use crate::schema::shape::Shape;

/// Which built-in type a resource is; built-ins get type-specific behaviour
/// (strategic merge patch, Secret `stringData`, Namespace lifecycle, CRD registration).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Builtin {
    Namespace,
    Secret,
    ConfigMap,
    Event,
    EventsV1,
    Lease,
    Crd,
    /// ClusterRole, ClusterRoleBinding, Role, RoleBinding: stored, and read by the authorizer.
    Rbac,
    /// ServiceAccount, Service, Deployment, PodDisruptionBudget: stored and validated so
    /// manifests can be applied and dry-run; nothing here runs them.
    Stored,
}

/// One additional printer column.
#[derive(Clone, Debug)]
pub struct PrinterColumn {
    pub name: String,
    pub type_: String,
    pub format: String,
    pub description: String,
    pub priority: i64,
    pub json_path: String,
}

/// The scale subresource's paths.
#[derive(Clone, Debug)]
pub struct ScaleSpec {
    pub spec_replicas_path: String,
    pub status_replicas_path: String,
    pub label_selector_path: Option<String>,
}

/// One served group/version/resource.
#[derive(Debug)]
pub struct ResourceType {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub list_kind: String,
    pub plural: String,
    pub singular: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub status_subresource: bool,
    pub scale: Option<ScaleSpec>,
    /// openAPIV3Schema of the object (validation, defaulting, pruning, OpenAPI docs).
    pub schema: Value,
    /// What patching and managed fields need to know about lists and maps.
    pub shape: Shape,
    pub columns: Vec<PrinterColumn>,
    pub builtin: Option<Builtin>,
    /// Field selectors supported besides `metadata.name` and `metadata.namespace`.
    pub selectable_fields: Vec<String>,
    /// The CRD that defines this resource.
    pub crd_name: Option<String>,
}

/// Where objects of a resource are stored: `group/plural` (every version shares it).
pub type StorageKey = Arc<str>;

impl ResourceType {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() { self.version.clone() } else { format!("{}/{}", self.group, self.version) }
    }
    /// `virtualmachines.banlieue.io`, or `secrets` for the core group.
    pub fn group_resource(&self) -> String {
        if self.group.is_empty() { self.plural.clone() } else { format!("{}.{}", self.plural, self.group) }
    }
    /// `VirtualMachine.banlieue.io`, as used in validation messages.
    pub fn group_kind(&self) -> String {
        if self.group.is_empty() { self.kind.clone() } else { format!("{}.{}", self.kind, self.group) }
    }
    pub fn storage_key(&self) -> StorageKey {
        format!("{}/{}", self.group, self.plural).into()
    }
    /// Custom resources count `metadata.generation`; so do CRDs.
    pub fn has_generation(&self) -> bool {
        matches!(self.builtin, None | Some(Builtin::Crd))
    }
    pub fn field_selector_allowed(&self) -> Vec<&str> {
        let mut v = vec!["metadata.name", "metadata.namespace"];
        v.extend(self.selectable_fields.iter().map(|s| s.as_str()));
        v
    }
    /// Verbs advertised in discovery.
    pub fn verbs(&self) -> Vec<&'static str> {
        vec!["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
    }
}

/// Every served resource, indexed for lookups by URL and by kind.
#[derive(Default)]
pub struct Registry {
    by_gvr: BTreeMap<(String, String, String), Arc<ResourceType>>,
    /// Group order as discovery lists it.
    group_order: Vec<String>,
    /// The resourceVersion each CRD-defined resource has been served from (built-in ones:
    /// from the start). kube-apiserver serves a resource's watches from a cache that starts
    /// then, so a watch from before it is `410 Gone`, not a replay.
    served_since: HashMap<StorageKey, u64>,
}

impl Registry {
    pub fn with_builtins() -> Self {
        let mut r = Registry::default();
        for t in builtin_types() {
            r.insert(t);
        }
        r
    }

    pub fn insert(&mut self, t: ResourceType) {
        if !self.group_order.contains(&t.group) {
            self.group_order.push(t.group.clone());
        }
        self.by_gvr.insert((t.group.clone(), t.version.clone(), t.plural.clone()), Arc::new(t));
    }

    /// Serve what a CRD defines (replacing what it defined before) from resourceVersion
    /// `rv` on; a resource it served already keeps the resourceVersion it was served from.
    pub fn serve_crd(&mut self, crd_name: &str, types: Vec<ResourceType>, rv: u64) {
        let kept: HashMap<StorageKey, u64> =
            types.iter().filter_map(|t| self.served_since.get(&t.storage_key()).map(|since| (t.storage_key(), *since))).collect();
        self.remove_crd(crd_name);
        for t in types {
            let key = t.storage_key();
            self.served_since.insert(key.clone(), kept.get(&key).copied().unwrap_or(rv));
            self.insert(t);
        }
    }

    /// Remove every version of the resources a CRD defined.
    pub fn remove_crd(&mut self, crd_name: &str) {
        self.by_gvr.retain(|_, t| t.crd_name.as_deref() != Some(crd_name));
        let groups: Vec<String> = self.by_gvr.values().map(|t| t.group.clone()).collect();
        self.group_order.retain(|g| groups.contains(g));
        let served: HashSet<StorageKey> = self.by_gvr.values().map(|t| t.storage_key()).collect();
        self.served_since.retain(|key, _| served.contains(key));
    }

    /// The resourceVersion a resource has been served from: a watch from before it is gone.
    pub fn served_since(&self, key: &StorageKey) -> u64 {
        self.served_since.get(key).copied().unwrap_or(0)
    }

    /// Whether `group` is one of the server's own (not a CRD's): kube-apiserver's handlers
    /// for those answer a path they do not serve with a `Status`, the rest with plain text.
    pub fn is_builtin_group(&self, group: &str) -> bool {
        group.is_empty() || self.by_gvr.values().any(|t| t.group == group && t.crd_name.is_none())
    }

    pub fn get(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.by_gvr.get(&(group.to_string(), version.to_string(), plural.to_string())).cloned()
    }

    /// Is any resource of this group served (any version)?
    pub fn groups(&self) -> Vec<String> {
        self.group_order.clone()
    }

    /// Served versions of a group, preferred first (highest stability, then newest).
    pub fn versions(&self, group: &str) -> Vec<String> {
        let mut vs: Vec<String> = self.by_gvr.keys().filter(|(g, _, _)| g == group).map(|(_, v, _)| v.clone()).collect();
        vs.dedup();
        vs.sort_by(|a, b| version_priority(b).cmp(&version_priority(a)));
        vs
    }

    pub fn resources(&self, group: &str, version: &str) -> Vec<Arc<ResourceType>> {
        self.by_gvr.values().filter(|t| t.group == group && t.version == version).cloned().collect()
    }

    pub fn all(&self) -> Vec<Arc<ResourceType>> {
        self.by_gvr.values().cloned().collect()
    }
}

/// Kubernetes' version ordering: GA > beta > alpha, then by number.
fn version_priority(v: &str) -> (u8, u32, u32) {
    let rest = v.strip_prefix('v').unwrap_or("");
    let num_end = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
    let major: u32 = rest[..num_end].parse().unwrap_or(0);
    let tail = &rest[num_end..];
    if num_end == 0 {
        return (0, 0, 0);
    }
    if tail.is_empty() {
        (3, major, 0)
    } else if let Some(n) = tail.strip_prefix("beta") {
        (2, major, n.parse().unwrap_or(0))
    } else if let Some(n) = tail.strip_prefix("alpha") {
        (1, major, n.parse().unwrap_or(0))
    } else {
        (0, major, 0)
    }
}

fn str_map() -> Value {
    json!({"type": "object", "additionalProperties": {"type": "string"}})
}

fn conditions_schema() -> Value {
    json!({"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"],
           "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                     "required": ["type"], "properties": {"type": {"type": "string"}}}})
}

fn object_reference_schema() -> Value {
    let s = json!({"type": "string"});
    json!({"type": "object", "properties": {
        "apiVersion": s, "kind": s, "name": s, "namespace": s, "uid": s,
        "resourceVersion": s, "fieldPath": s}})
}

fn object_schema(description: &str, props: Value) -> Value {
    let mut p = props;
    p["apiVersion"] = json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."});
    p["kind"] = json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents."});
    p["metadata"] = json!({"type": "object", "description": "Standard object's metadata."});
    json!({"type": "object", "description": description, "properties": p})
}

/// The OpenAPI schema of a Kubernetes type, from k8s-openapi, inlined; `metadata` is
/// left to the server's own ObjectMeta handling as for every other type.
fn typed<T: schemars::JsonSchema>() -> Value {
    let generator = schemars::generate::SchemaSettings::openapi3()
        .with(|s| {
            s.inline_subschemas = true;
            s.meta_schema = None;
        })
        .into_generator();
    let mut schema = generator.into_root_schema_for::<T>().to_value();
    if let Some(o) = schema.as_object_mut() {
        o.remove("components");
        o.remove("definitions");
        o.remove("$defs");
        o.remove("required");
    }
    schema["properties"]["metadata"] = json!({"type": "object", "description": "Standard object's metadata."});
    schema
}

struct Def {
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    namespaced: bool,
    short: &'static [&'static str],
    status: bool,
    builtin: Builtin,
    schema: Value,
    columns: Vec<(&'static str, &'static str, &'static str, i64)>,
    selectable: &'static [&'static str],
}

fn builtin_types() -> Vec<ResourceType> {
    let s = || json!({"type": "string"});
    let i = || json!({"type": "integer"});
    let defs = vec![
        Def {
            group: "", version: "v1", kind: "Namespace", plural: "namespaces", namespaced: false,
            short: &["ns"], status: true, builtin: Builtin::Namespace,
            schema: object_schema("Namespace provides a scope for Names.", json!({
                "spec": {"type": "object", "properties": {"finalizers": {"type": "array", "items": s()}}},
                "status": {"type": "object", "properties": {"phase": s(), "conditions": conditions_schema()}}})),
            columns: vec![("Status", "string", ".status.phase", 0)],
            selectable: &["status.phase"],
        },
        Def {
            group: "", version: "v1", kind: "Secret", plural: "secrets", namespaced: true,
            short: &[], status: false, builtin: Builtin::Secret,
            schema: object_schema("Secret holds secret data of a certain type.", json!({
                "data": {"type": "object", "additionalProperties": {"type": "string", "format": "byte"}},
                "stringData": str_map(), "type": s(), "immutable": {"type": "boolean"}})),
            columns: vec![("Type", "string", ".type", 0)],
            selectable: &["type"],
        },
        Def {
            group: "", version: "v1", kind: "ConfigMap", plural: "configmaps", namespaced: true,
            short: &["cm"], status: false, builtin: Builtin::ConfigMap,
            schema: object_schema("ConfigMap holds configuration data for pods to consume.", json!({
                "data": str_map(),
                "binaryData": {"type": "object", "additionalProperties": {"type": "string", "format": "byte"}},
                "immutable": {"type": "boolean"}})),
            columns: vec![],
            selectable: &[],
        },
        Def {
            group: "", version: "v1", kind: "Event", plural: "events", namespaced: true,
            short: &["ev"], status: false, builtin: Builtin::Event,
            schema: object_schema("Event is a report of an event somewhere in the cluster.", json!({
                "involvedObject": object_reference_schema(), "related": object_reference_schema(),
                "reason": s(), "message": s(), "type": s(), "action": s(), "count": i(),
                "source": {"type": "object", "properties": {"component": s(), "host": s()}},
                "firstTimestamp": {"type": "string", "format": "date-time", "nullable": true},
                "lastTimestamp": {"type": "string", "format": "date-time", "nullable": true},
                "eventTime": {"type": "string", "format": "date-time", "nullable": true},
                "series": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                "reportingComponent": s(), "reportingInstance": s()})),
            columns: vec![("Type", "string", ".type", 0), ("Reason", "string", ".reason", 0),
                          ("Object", "string", ".involvedObject.name", 0), ("Message", "string", ".message", 0)],
            selectable: &["involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
                          "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
                          "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type"],
        },
        Def {
            group: "events.k8s.io", version: "v1", kind: "Event", plural: "events", namespaced: true,
            short: &["ev"], status: false, builtin: Builtin::EventsV1,
            schema: object_schema("Event is a report of an event somewhere in the cluster.", json!({
                "regarding": object_reference_schema(), "related": object_reference_schema(),
                "reason": s(), "note": s(), "type": s(), "action": s(),
                "eventTime": {"type": "string", "format": "date-time", "nullable": true},
                "series": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                "reportingController": s(), "reportingInstance": s(),
                "deprecatedSource": {"type": "object", "properties": {"component": s(), "host": s()}},
                "deprecatedFirstTimestamp": {"type": "string", "format": "date-time", "nullable": true},
                "deprecatedLastTimestamp": {"type": "string", "format": "date-time", "nullable": true},
                "deprecatedCount": i()})),
            columns: vec![("Type", "string", ".type", 0), ("Reason", "string", ".reason", 0),
                          ("Object", "string", ".regarding.name", 0), ("Note", "string", ".note", 0)],
            selectable: &["regarding.kind", "regarding.namespace", "regarding.name", "regarding.uid",
                          "reason", "reportingController", "type"],
        },
        Def {
            group: "coordination.k8s.io", version: "v1", kind: "Lease", plural: "leases", namespaced: true,
            short: &[], status: false, builtin: Builtin::Lease,
            schema: object_schema("Lease defines a lease concept.", json!({
                "spec": {"type": "object", "properties": {
                    "holderIdentity": s(), "leaseDurationSeconds": i(), "leaseTransitions": i(),
                    "acquireTime": {"type": "string", "format": "date-time"},
                    "renewTime": {"type": "string", "format": "date-time"},
                    "strategy": s(), "preferredHolder": s()}}})),
            columns: vec![("Holder", "string", ".spec.holderIdentity", 0)],
            selectable: &[],
        },
        Def {
            group: "", version: "v1", kind: "ServiceAccount", plural: "serviceaccounts", namespaced: true,
            short: &["sa"], status: false, builtin: Builtin::Stored,
            schema: typed::<k8s_openapi::api::core::v1::ServiceAccount>(), columns: vec![], selectable: &[],
        },
        Def {
            group: "", version: "v1", kind: "Service", plural: "services", namespaced: true,
            short: &["svc"], status: true, builtin: Builtin::Stored,
            schema: typed::<k8s_openapi::api::core::v1::Service>(),
            columns: vec![("Type", "string", ".spec.type", 0), ("Cluster-IP", "string", ".spec.clusterIP", 0)],
            selectable: &[],
        },
        Def {
            group: "apps", version: "v1", kind: "Deployment", plural: "deployments", namespaced: true,
            short: &["deploy"], status: true, builtin: Builtin::Stored,
            schema: typed::<k8s_openapi::api::apps::v1::Deployment>(),
            columns: vec![("Ready", "integer", ".status.readyReplicas", 0), ("Up-To-Date", "integer", ".status.updatedReplicas", 0)],
            selectable: &[],
        },
        Def {
            group: "policy", version: "v1", kind: "PodDisruptionBudget", plural: "poddisruptionbudgets", namespaced: true,
            short: &["pdb"], status: true, builtin: Builtin::Stored,
            schema: typed::<k8s_openapi::api::policy::v1::PodDisruptionBudget>(),
            columns: vec![("Min Available", "string", ".spec.minAvailable", 0), ("Max Unavailable", "string", ".spec.maxUnavailable", 0)],
            selectable: &[],
        },
        Def {
            group: "rbac.authorization.k8s.io", version: "v1", kind: "ClusterRole", plural: "clusterroles", namespaced: false,
            short: &[], status: false, builtin: Builtin::Rbac,
            schema: typed::<k8s_openapi::api::rbac::v1::ClusterRole>(), columns: vec![], selectable: &[],
        },
        Def {
            group: "rbac.authorization.k8s.io", version: "v1", kind: "ClusterRoleBinding", plural: "clusterrolebindings", namespaced: false,
            short: &[], status: false, builtin: Builtin::Rbac,
            schema: typed::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>(),
            columns: vec![("Role", "string", ".roleRef.name", 0)], selectable: &[],
        },
        Def {
            group: "rbac.authorization.k8s.io", version: "v1", kind: "Role", plural: "roles", namespaced: true,
            short: &[], status: false, builtin: Builtin::Rbac,
            schema: typed::<k8s_openapi::api::rbac::v1::Role>(), columns: vec![], selectable: &[],
        },
        Def {
            group: "rbac.authorization.k8s.io", version: "v1", kind: "RoleBinding", plural: "rolebindings", namespaced: true,
            short: &[], status: false, builtin: Builtin::Rbac,
            schema: typed::<k8s_openapi::api::rbac::v1::RoleBinding>(),
            columns: vec![("Role", "string", ".roleRef.name", 0)], selectable: &[],
        },
        Def {
            group: "apiextensions.k8s.io", version: "v1", kind: "CustomResourceDefinition",
            plural: "customresourcedefinitions", namespaced: false, short: &["crd", "crds"], status: true,
            builtin: Builtin::Crd,
            schema: object_schema("CustomResourceDefinition represents a resource that should be exposed on the API server.", json!({
                "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}})),
            columns: vec![("Created At", "date", ".metadata.creationTimestamp", 0)],
            selectable: &[],
        },
    ];
    defs.into_iter()
        .map(|d| {
            let singular = d.kind.to_ascii_lowercase();
            let shape = crate::schema::shape::with_object_meta(Shape::from_openapi(&d.schema));
            let mut columns = vec![name_column()];
            columns.extend(d.columns.into_iter().map(|(name, ty, path, prio)| PrinterColumn {
                name: name.into(),
                type_: ty.into(),
                format: String::new(),
                description: String::new(),
                priority: prio,
                json_path: path.into(),
            }));
            if d.builtin != Builtin::Crd {
                columns.push(age_column());
            }
            ResourceType {
                group: d.group.into(),
                version: d.version.into(),
                kind: d.kind.into(),
                list_kind: format!("{}List", d.kind),
                plural: d.plural.into(),
                singular,
                namespaced: d.namespaced,
                short_names: d.short.iter().map(|s| s.to_string()).collect(),
                categories: vec![],
                status_subresource: d.status,
                scale: None,
                schema: d.schema,
                shape,
                columns,
                builtin: Some(d.builtin),
                selectable_fields: d.selectable.iter().map(|s| s.to_string()).collect(),
                crd_name: None,
            }
        })
        .collect()
}

/// The `Name` column every table starts with.
pub fn name_column() -> PrinterColumn {
    PrinterColumn {
        name: "Name".into(),
        type_: "string".into(),
        format: "name".into(),
        description: "Name must be unique within a namespace.".into(),
        priority: 0,
        json_path: ".metadata.name".into(),
    }
}

/// The `Age` column.
pub fn age_column() -> PrinterColumn {
    PrinterColumn {
        name: "Age".into(),
        type_: "date".into(),
        format: String::new(),
        description: "CreationTimestamp is a timestamp representing the server time when this object was created.".into(),
        priority: 0,
        json_path: ".metadata.creationTimestamp".into(),
    }
}

/// The resources a CRD defines (one per served version), or why the CRD can't be served.
pub fn types_from_crd(crd: &Value) -> Result<Vec<ResourceType>, Vec<(String, String)>> {
    let mut errs: Vec<(String, String)> = Vec::new();
    let name = crd.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
    let spec = crd.get("spec").cloned().unwrap_or(Value::Null);
    let group = spec.get("group").and_then(Value::as_str).unwrap_or_default().to_string();
    let names = spec.get("names").cloned().unwrap_or(Value::Null);
    let plural = names.get("plural").and_then(Value::as_str).unwrap_or_default().to_string();
    let kind = names.get("kind").and_then(Value::as_str).unwrap_or_default().to_string();
    let scope = spec.get("scope").and_then(Value::as_str).unwrap_or_default();
    let dns_label = regex_lite_dns_label;
    if group.is_empty() || !group.contains('.') {
        errs.push(("spec.group".into(), "should be a domain with at least one dot".into()));
    }
    if plural.is_empty() || !dns_label(&plural) {
        errs.push(("spec.names.plural".into(), "must be a lowercase DNS label".into()));
    }
    if kind.is_empty() || !kind.chars().next().is_some_and(|c| c.is_ascii_alphabetic()) {
        errs.push(("spec.names.kind".into(), "Required value".into()));
    }
    if name != format!("{plural}.{group}") {
        errs.push(("metadata.name".into(), format!("must be spec.names.plural+\".\"+spec.group ({plural}.{group})")));
    }
    if scope != "Namespaced" && scope != "Cluster" {
        errs.push(("spec.scope".into(), "Unsupported value: supported values: \"Cluster\", \"Namespaced\"".into()));
    }
    let versions = spec.get("versions").and_then(Value::as_array).cloned().unwrap_or_default();
    if versions.is_empty() {
        errs.push(("spec.versions".into(), "must have exactly one version marked as storage version".into()));
    }
    if versions.iter().filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true)).count() != 1 {
        errs.push(("spec.versions".into(), "must have exactly one version marked as storage version".into()));
    }
    let mut out = Vec::new();
    for (i, v) in versions.iter().enumerate() {
        let vname = v.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
        if vname.is_empty() || !dns_label(&vname) {
            errs.push((format!("spec.versions[{i}].name"), "must be a DNS label".into()));
        }
        let schema = v.pointer("/schema/openAPIV3Schema").cloned();
        let Some(schema) = schema else {
            errs.push((format!("spec.versions[{i}].schema.openAPIV3Schema"), "Required value: schemas are required".into()));
            continue;
        };
        for e in crate::schema::check_structural(&schema) {
            errs.push((format!("spec.versions[{i}].schema.openAPIV3Schema"), e));
        }
        if v.get("served").and_then(Value::as_bool) != Some(true) {
            continue;
        }
        let status = v.pointer("/subresources/status").is_some();
        let scale = v.pointer("/subresources/scale").map(|s| ScaleSpec {
            spec_replicas_path: s.get("specReplicasPath").and_then(Value::as_str).unwrap_or_default().into(),
            status_replicas_path: s.get("statusReplicasPath").and_then(Value::as_str).unwrap_or_default().into(),
            label_selector_path: s.get("labelSelectorPath").and_then(Value::as_str).map(String::from),
        });
        let mut columns = vec![name_column()];
        let declared = v.get("additionalPrinterColumns").and_then(Value::as_array).cloned().unwrap_or_default();
        for c in &declared {
            columns.push(PrinterColumn {
                name: c.get("name").and_then(Value::as_str).unwrap_or_default().into(),
                type_: c.get("type").and_then(Value::as_str).unwrap_or("string").into(),
                format: c.get("format").and_then(Value::as_str).unwrap_or_default().into(),
                description: c.get("description").and_then(Value::as_str).unwrap_or_default().into(),
                priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0),
                json_path: c.get("jsonPath").and_then(Value::as_str).unwrap_or_default().into(),
            });
        }
        if declared.is_empty() {
            columns.push(age_column());
        }
        let strings = |k: &str| -> Vec<String> {
            names.get(k).and_then(Value::as_array).map(|a| a.iter().filter_map(|s| s.as_str().map(String::from)).collect()).unwrap_or_default()
        };
        let selectable = v.get("selectableFields").and_then(Value::as_array).map(|a| {
            a.iter().filter_map(|f| f.get("jsonPath").and_then(Value::as_str)).map(|p| p.trim_start_matches('.').to_string()).collect()
        }).unwrap_or_default();
        out.push(ResourceType {
            group: group.clone(),
            version: vname,
            kind: kind.clone(),
            list_kind: names.get("listKind").and_then(Value::as_str).map(String::from).unwrap_or_else(|| format!("{kind}List")),
            plural: plural.clone(),
            singular: names.get("singular").and_then(Value::as_str).map(String::from).unwrap_or_else(|| kind.to_ascii_lowercase()),
            namespaced: scope == "Namespaced",
            short_names: strings("shortNames"),
            categories: strings("categories"),
            status_subresource: status,
            scale,
            shape: crate::schema::shape::with_object_meta(Shape::from_openapi(&schema)),
            schema,
            columns,
            builtin: None,
            selectable_fields: selectable,
            crd_name: Some(name.clone()),
        });
    }
    if errs.is_empty() { Ok(out) } else { Err(errs) }
}

fn regex_lite_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}
