//! Object metadata: accessors, timestamps, and the validation every object gets
//! whatever its schema (names, labels, annotations, finalizers, owner references).

use serde_json::{Map, Value};

/// RFC 3339 with second precision, as the real server writes times.
pub fn now() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

pub fn meta(obj: &Value) -> Option<&Map<String, Value>> {
    obj.get("metadata").and_then(Value::as_object)
}

/// The `metadata` map, created when missing or not an object.
pub fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = Value::Object(Map::new());
    }
    obj["metadata"].as_object_mut().expect("just ensured")
}

pub fn str_field<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    meta(obj).and_then(|m| m.get(field)).and_then(Value::as_str)
}

pub fn name(obj: &Value) -> &str {
    str_field(obj, "name").unwrap_or("")
}

pub fn namespace(obj: &Value) -> &str {
    str_field(obj, "namespace").unwrap_or("")
}

pub fn uid(obj: &Value) -> &str {
    str_field(obj, "uid").unwrap_or("")
}

pub fn finalizers(obj: &Value) -> Vec<String> {
    meta(obj)
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|v| v.as_str().map(String::from)).collect())
        .unwrap_or_default()
}

pub fn set_finalizers(obj: &mut Value, f: &[String]) {
    let m = meta_mut(obj);
    if f.is_empty() {
        m.remove("finalizers");
    } else {
        m.insert("finalizers".into(), Value::from(f.to_vec()));
    }
}

pub fn is_deleting(obj: &Value) -> bool {
    str_field(obj, "deletionTimestamp").is_some()
}

/// RFC 1123 subdomain (most object names).
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(is_dns_label)
}

/// RFC 1123 label (namespace names).
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A qualified name: `[prefix/]name`, as label and annotation keys and finalizers use.
pub fn is_qualified_name(s: &str) -> bool {
    let (prefix, name) = match s.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    if prefix.is_some_and(|p| !is_dns_subdomain(p)) {
        return false;
    }
    !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.as_bytes()[name.len() - 1].is_ascii_alphanumeric()
}

pub fn is_label_value(s: &str) -> bool {
    s.is_empty()
        || (s.len() <= 63
            && s.bytes().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
            && s.as_bytes()[0].is_ascii_alphanumeric()
            && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric())
}

/// Validation causes: (field, reason, message).
pub type Causes = Vec<(String, String, String)>;

fn invalid(causes: &mut Causes, field: &str, value: &str, why: &str) {
    causes.push((field.into(), "FieldValueInvalid".into(), format!("{field}: Invalid value: {value:?}: {why}")));
}

/// Check metadata every object must satisfy.
pub fn validate(obj: &Value, dns_label_name: bool) -> Causes {
    let mut c = Causes::new();
    let Some(m) = meta(obj) else {
        c.push(("metadata".into(), "FieldValueRequired".into(), "metadata: Required value".into()));
        return c;
    };
    let name = m.get("name").and_then(Value::as_str).unwrap_or("");
    if name.is_empty() {
        c.push(("metadata.name".into(), "FieldValueRequired".into(), "metadata.name: Required value: name or generateName is required".into()));
    } else if dns_label_name && !is_dns_label(name) {
        invalid(&mut c, "metadata.name", name, "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character");
    } else if !dns_label_name && !is_dns_subdomain(name) {
        invalid(&mut c, "metadata.name", name, "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character");
    }
    for (field, check_values) in [("labels", true), ("annotations", false)] {
        match m.get(field) {
            None | Some(Value::Null) => {}
            Some(Value::Object(map)) => {
                for (k, v) in map {
                    if !is_qualified_name(k) {
                        invalid(&mut c, &format!("metadata.{field}"), k, "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (max 63 characters, optional DNS subdomain prefix and '/')");
                    }
                    match v.as_str() {
                        None => invalid(&mut c, &format!("metadata.{field}[{k}]"), &v.to_string(), "must be a string"),
                        Some(s) if check_values && !is_label_value(s) => invalid(&mut c, &format!("metadata.labels[{k}]"), s, "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (max 63 characters)"),
                        _ => {}
                    }
                }
                if field == "annotations" {
                    let total: usize = map.iter().map(|(k, v)| k.len() + v.as_str().map_or(0, str::len)).sum();
                    if total > 256 * 1024 {
                        c.push(("metadata.annotations".into(), "FieldValueTooLong".into(), "metadata.annotations: Too long: may not be more than 262144 bytes".into()));
                    }
                }
            }
            Some(_) => invalid(&mut c, &format!("metadata.{field}"), "", "must be a map of strings"),
        }
    }
    if let Some(f) = m.get("finalizers") {
        match f.as_array() {
            Some(items) => {
                for (i, v) in items.iter().enumerate() {
                    if !v.as_str().is_some_and(is_qualified_name) {
                        invalid(&mut c, &format!("metadata.finalizers[{i}]"), &v.to_string(), "must be a qualified name");
                    }
                }
            }
            None if f.is_null() => {}
            None => invalid(&mut c, "metadata.finalizers", "", "must be a list of strings"),
        }
    }
    if let Some(refs) = m.get("ownerReferences") {
        match refs.as_array() {
            Some(items) => {
                for (i, r) in items.iter().enumerate() {
                    for k in ["apiVersion", "kind", "name", "uid"] {
                        if r.get(k).and_then(Value::as_str).is_none_or(str::is_empty) {
                            c.push((format!("metadata.ownerReferences[{i}].{k}"), "FieldValueRequired".into(), format!("metadata.ownerReferences[{i}].{k}: Required value")));
                        }
                    }
                }
            }
            None if refs.is_null() => {}
            None => invalid(&mut c, "metadata.ownerReferences", "", "must be a list"),
        }
    }
    c
}
