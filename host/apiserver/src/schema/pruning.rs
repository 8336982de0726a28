//! Pruning: fields a schema does not declare are dropped.

use super::*;

/// Removes fields the schema does not declare, except below
/// `x-kubernetes-preserve-unknown-fields: true` or `additionalProperties: true`.
/// `apiVersion`, `kind` and `metadata` are kept at the root and in embedded
/// resources. Returns the removed paths (`spec.foo`, `spec.list[0].bar`,
/// `spec.map[key].baz`) for "unknown field" warnings / strict validation.
pub fn prune(obj: &mut Value, schema: &Value) -> Vec<String> {
    let mut out = Vec::new();
    prune_node(obj, schema.as_object(), "", 0, Level::Root, &mut out);
    out
}

pub(super) fn prune_node(
    x: &mut Value,
    s: Option<&Map<String, Value>>,
    path: &str,
    depth: usize,
    level: Level,
    out: &mut Vec<String>,
) {
    if depth > MAX_DEPTH {
        return; // validation reports the depth; pruning just stops
    }
    let preserve = s.is_some_and(|s| flag(s, "x-kubernetes-preserve-unknown-fields"));
    match x {
        Value::Object(m) => {
            let level = if level == Level::Normal
                && s.is_some_and(|s| flag(s, "x-kubernetes-embedded-resource"))
            {
                Level::Embedded
            } else {
                level
            };
            let props = s
                .and_then(|s| s.get("properties"))
                .and_then(Value::as_object);
            let addl = s.and_then(|s| s.get("additionalProperties"));
            let mut remove = Vec::new();
            for (k, v) in m.iter_mut() {
                let cpath = child(path, k);
                if level != Level::Normal
                    && matches!(k.as_str(), "apiVersion" | "kind" | "metadata")
                {
                    // typed by the server: ObjectMeta is never pruned here
                    if k != "metadata"
                        && let Some(p) = props.and_then(|p| p.get(k))
                    {
                        prune_node(v, p.as_object(), &cpath, depth + 1, Level::Normal, out);
                    }
                    continue;
                }
                if let Some(p) = props.and_then(|p| p.get(k)) {
                    prune_node(v, p.as_object(), &cpath, depth + 1, Level::Normal, out);
                } else if let Some(Value::Object(a)) = addl {
                    prune_node(v, Some(a), &map_key(path, k), depth + 1, Level::Normal, out);
                } else if preserve || matches!(addl, Some(Value::Bool(true))) {
                    // kept verbatim: there is no schema below this point
                } else {
                    remove.push(k.clone());
                    out.push(cpath);
                }
            }
            for k in remove {
                m.remove(&k);
            }
        }
        Value::Array(a) => {
            let items = s.and_then(|s| s.get("items")).and_then(Value::as_object);
            if items.is_none() && preserve {
                return;
            }
            for (i, v) in a.iter_mut().enumerate() {
                prune_node(v, items, &index(path, i), depth + 1, Level::Normal, out);
            }
        }
        _ => {}
    }
}
