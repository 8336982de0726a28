//! What the patch and apply logic needs to know about a type: which maps merge
//! granularly, and how each list merges (atomic, set, or map keyed by fields).

use std::collections::BTreeMap;

use serde_json::Value;

/// How a list merges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListType {
    /// Replaced whole; owned as one field.
    Atomic,
    /// Scalars, merged by value (union).
    Set,
    /// Objects, merged element-wise by these key fields (e.g. `["type"]`).
    Map(Vec<String>),
}

/// The merge-relevant shape of a JSON value.
#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    /// Unknown / preserve-unknown-fields: maps merge recursively, lists are atomic.
    Any,
    Scalar,
    Object {
        fields: BTreeMap<String, Shape>,
        /// Shape of keys not in `fields` (additionalProperties); `None` means unknown keys
        /// are treated as `Any`, same as `Some(Any)`.
        additional: Option<Box<Shape>>,
        /// `x-kubernetes-map-type: atomic`: replaced whole, owned as one field.
        map_type_atomic: bool,
    },
    List { list_type: ListType, items: Box<Shape> },
}

/// Returned by reference for unknown fields / items.
static ANY: Shape = Shape::Any;

/// Deeper schemas than this are treated as `Any` (guards against pathological input).
const MAX_SCHEMA_DEPTH: usize = 128;

impl Shape {
    /// Build from a CRD-style `openAPIV3Schema`. Anything unrecognised becomes `Any`,
    /// so this never fails.
    pub fn from_openapi(schema: &Value) -> Shape {
        from_openapi_at(schema, 0)
    }

    /// Shape of a field of an object; `Any` when unknown.
    pub fn field(&self, name: &str) -> &Shape {
        match self {
            Shape::Object { fields, additional, .. } => match fields.get(name) {
                Some(s) => s,
                None => additional.as_deref().unwrap_or(&ANY),
            },
            _ => &ANY,
        }
    }

    /// Shape of the items of a list; `Any` when not a list.
    pub fn items(&self) -> &Shape {
        match self {
            Shape::List { items, .. } => items,
            _ => &ANY,
        }
    }

    /// The list type, if this is a list; `Any` lists count as atomic.
    pub fn list_type(&self) -> &ListType {
        static ATOMIC: ListType = ListType::Atomic;
        match self {
            Shape::List { list_type, .. } => list_type,
            _ => &ATOMIC,
        }
    }

    /// True for `x-kubernetes-map-type: atomic` objects.
    pub fn is_atomic_map(&self) -> bool {
        matches!(self, Shape::Object { map_type_atomic: true, .. })
    }

    /// Convenience: a granular object with the given fields and no additional properties.
    pub fn object(fields: impl IntoIterator<Item = (&'static str, Shape)>) -> Shape {
        Shape::Object {
            fields: fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            additional: None,
            map_type_atomic: false,
        }
    }

    /// Convenience: a granular map of `values`.
    pub fn map_of(values: Shape) -> Shape {
        Shape::Object { fields: BTreeMap::new(), additional: Some(Box::new(values)), map_type_atomic: false }
    }

    /// Convenience: a list.
    pub fn list(list_type: ListType, items: Shape) -> Shape {
        Shape::List { list_type, items: Box::new(items) }
    }
}

fn from_openapi_at(schema: &Value, depth: usize) -> Shape {
    let Some(s) = schema.as_object() else { return Shape::Any };
    if depth > MAX_SCHEMA_DEPTH {
        return Shape::Any;
    }
    let flag = |k: &str| s.get(k).and_then(Value::as_bool).unwrap_or(false);
    if flag("x-kubernetes-int-or-string") {
        return Shape::Scalar;
    }
    let preserve = flag("x-kubernetes-preserve-unknown-fields");
    let embedded = flag("x-kubernetes-embedded-resource");
    let ty = s.get("type").and_then(Value::as_str);

    let is_object = ty == Some("object")
        || (ty.is_none() && (s.contains_key("properties") || s.contains_key("additionalProperties") || embedded));
    let is_array = ty == Some("array") || (ty.is_none() && s.contains_key("items"));

    if is_object {
        let mut fields = BTreeMap::new();
        if let Some(props) = s.get("properties").and_then(Value::as_object) {
            for (k, v) in props {
                fields.insert(k.clone(), from_openapi_at(v, depth + 1));
            }
        }
        if embedded {
            // An embedded resource is a full object: it always has these, whatever the schema says.
            fields.entry("apiVersion".into()).or_insert(Shape::Scalar);
            fields.entry("kind".into()).or_insert(Shape::Scalar);
            fields.insert("metadata".into(), object_meta());
        }
        let additional = match s.get("additionalProperties") {
            Some(Value::Bool(true)) => Some(Box::new(Shape::Any)),
            Some(v @ Value::Object(_)) => Some(Box::new(from_openapi_at(v, depth + 1))),
            _ if preserve => Some(Box::new(Shape::Any)),
            _ => None,
        };
        let map_type_atomic = s.get("x-kubernetes-map-type").and_then(Value::as_str) == Some("atomic");
        return Shape::Object { fields, additional, map_type_atomic };
    }
    if is_array {
        let items = s.get("items").map(|i| from_openapi_at(i, depth + 1)).unwrap_or(Shape::Any);
        let list_type = match s.get("x-kubernetes-list-type").and_then(Value::as_str) {
            Some("set") => ListType::Set,
            Some("map") => {
                let keys: Vec<String> = s
                    .get("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(|k| k.as_str().map(String::from)).collect())
                    .unwrap_or_default();
                // A map list without keys is invalid in Kubernetes; atomic is the safe fallback.
                if keys.is_empty() { ListType::Atomic } else { ListType::Map(keys) }
            }
            _ => ListType::Atomic,
        };
        return Shape::List { list_type, items: Box::new(items) };
    }
    match ty {
        Some("string" | "integer" | "number" | "boolean") => Shape::Scalar,
        _ => Shape::Any,
    }
}

/// Kubernetes `ObjectMeta`, as far as patching and field ownership care.
pub fn object_meta() -> Shape {
    let owner_ref = Shape::object([
        ("apiVersion", Shape::Scalar),
        ("kind", Shape::Scalar),
        ("name", Shape::Scalar),
        ("uid", Shape::Scalar),
        ("controller", Shape::Scalar),
        ("blockOwnerDeletion", Shape::Scalar),
    ]);
    Shape::object([
        ("name", Shape::Scalar),
        ("generateName", Shape::Scalar),
        ("namespace", Shape::Scalar),
        ("selfLink", Shape::Scalar),
        ("uid", Shape::Scalar),
        ("resourceVersion", Shape::Scalar),
        ("generation", Shape::Scalar),
        ("creationTimestamp", Shape::Scalar),
        ("deletionTimestamp", Shape::Scalar),
        ("deletionGracePeriodSeconds", Shape::Scalar),
        ("labels", Shape::map_of(Shape::Scalar)),
        ("annotations", Shape::map_of(Shape::Scalar)),
        ("finalizers", Shape::list(ListType::Set, Shape::Scalar)),
        ("ownerReferences", Shape::list(ListType::Map(vec!["uid".into()]), owner_ref)),
        ("managedFields", Shape::list(ListType::Atomic, Shape::Any)),
    ])
}

/// Put `ObjectMeta` under `metadata` and `apiVersion`/`kind` as scalars on a root shape.
/// A non-object root (e.g. `Any`) becomes an object whose other fields are `Any`.
pub fn with_object_meta(root: Shape) -> Shape {
    let (mut fields, additional, map_type_atomic) = match root {
        Shape::Object { fields, additional, map_type_atomic } => (fields, additional, map_type_atomic),
        _ => (BTreeMap::new(), Some(Box::new(Shape::Any)), false),
    };
    fields.insert("apiVersion".into(), Shape::Scalar);
    fields.insert("kind".into(), Shape::Scalar);
    // Kubernetes ignores whatever a CRD schema says about metadata.
    fields.insert("metadata".into(), object_meta());
    Shape::Object { fields, additional, map_type_atomic }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn builds_from_crd_schema() {
        let schema = json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "properties": {
                        "replicas": {"type": "integer"},
                        "port": {"x-kubernetes-int-or-string": true},
                        "tags": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set"},
                        "args": {"type": "array", "items": {"type": "string"}},
                        "conds": {"type": "array", "x-kubernetes-list-type": "map",
                                  "x-kubernetes-list-map-keys": ["type"],
                                  "items": {"type": "object", "properties": {"type": {"type": "string"}}}},
                        "sel": {"type": "object", "x-kubernetes-map-type": "atomic",
                                "additionalProperties": {"type": "string"}},
                        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        "tmpl": {"type": "object", "x-kubernetes-embedded-resource": true}
                    }
                }
            }
        });
        let s = Shape::from_openapi(&schema);
        let spec = s.field("spec");
        assert_eq!(spec.field("replicas"), &Shape::Scalar);
        assert_eq!(spec.field("port"), &Shape::Scalar);
        assert_eq!(spec.field("tags").list_type(), &ListType::Set);
        assert_eq!(spec.field("args").list_type(), &ListType::Atomic);
        assert_eq!(spec.field("conds").list_type(), &ListType::Map(vec!["type".into()]));
        assert_eq!(spec.field("conds").items().field("type"), &Shape::Scalar);
        assert!(spec.field("sel").is_atomic_map());
        assert_eq!(spec.field("sel").field("x"), &Shape::Scalar);
        assert_eq!(spec.field("free").field("whatever"), &Shape::Any);
        assert_eq!(spec.field("tmpl").field("kind"), &Shape::Scalar);
        assert_eq!(
            spec.field("tmpl").field("metadata").field("finalizers").list_type(),
            &ListType::Set
        );
        assert_eq!(spec.field("nope"), &Shape::Any);
        assert_eq!(Shape::Scalar.items(), &Shape::Any);
    }

    #[test]
    fn map_list_without_keys_is_atomic() {
        let s = Shape::from_openapi(&json!({"type": "array", "x-kubernetes-list-type": "map"}));
        assert_eq!(s.list_type(), &ListType::Atomic);
    }

    #[test]
    fn odd_schemas_do_not_panic() {
        for v in [json!(null), json!(1), json!("x"), json!([]), json!({"type": 5}),
                  json!({"properties": 3}), json!({"items": [1]}), json!({"type": "array", "x-kubernetes-list-map-keys": "a"})] {
            let _ = Shape::from_openapi(&v);
        }
        let mut deep = json!({"type": "string"});
        for _ in 0..300 {
            deep = json!({"type": "object", "properties": {"a": deep}});
        }
        let _ = Shape::from_openapi(&deep);
    }

    #[test]
    fn with_object_meta_adds_metadata() {
        let s = with_object_meta(Shape::Any);
        assert_eq!(s.field("kind"), &Shape::Scalar);
        assert_eq!(s.field("metadata").field("ownerReferences").list_type(), &ListType::Map(vec!["uid".into()]));
        assert_eq!(s.field("spec"), &Shape::Any);
        assert!(matches!(s.field("metadata").field("labels"), Shape::Object { map_type_atomic: false, .. }));
    }
}
