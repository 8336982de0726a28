//! Structural defaulting: `default`s applied top-down.

use super::*;

/// Applies `default`s top-down like Kubernetes' structural defaulting: a
/// property gets its default when absent, or when null and the property is
/// not nullable. Defaults are applied before descending, so defaults nested
/// inside a freshly defaulted value are applied too. Array items and
/// additionalProperties values that are null get the items/value default.
pub fn default(obj: &mut Value, schema: &Value) {
    default_node(obj, schema, 0);
}

/// A default that should replace `v`: only for null values of non-nullable
/// schemas with a non-null default.
fn null_default(v: &Value, s: &Value) -> Option<Value> {
    let s = s.as_object()?;
    if v.is_null() && !flag(s, "nullable") {
        s.get("default").filter(|d| !d.is_null()).cloned()
    } else {
        None
    }
}

fn default_node(x: &mut Value, schema: &Value, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    let Some(s) = schema.as_object() else { return };
    match x {
        Value::Object(m) => {
            let props = s.get("properties").and_then(Value::as_object);
            if let Some(props) = props {
                for (k, p) in props {
                    // `default: null` means "no default" (Go sees a nil object)
                    let Some(d) = p.get("default").filter(|d| !d.is_null()) else {
                        continue;
                    };
                    let nullable = p.get("nullable") == Some(&Value::Bool(true));
                    match m.get(k) {
                        None => {
                            m.insert(k.clone(), d.clone());
                        }
                        Some(Value::Null) if !nullable => {
                            m.insert(k.clone(), d.clone());
                        }
                        _ => {}
                    }
                }
            }
            let addl = s.get("additionalProperties").filter(|a| a.is_object());
            for (k, v) in m.iter_mut() {
                if let Some(p) = props.and_then(|p| p.get(k)) {
                    default_node(v, p, depth + 1);
                } else if let Some(a) = addl {
                    if let Some(d) = null_default(v, a) {
                        *v = d;
                    }
                    default_node(v, a, depth + 1);
                }
            }
        }
        Value::Array(a) => {
            let Some(items) = s.get("items") else { return };
            for v in a.iter_mut() {
                if let Some(d) = null_default(v, items) {
                    *v = d;
                }
                default_node(v, items, depth + 1);
            }
        }
        _ => {}
    }
}
