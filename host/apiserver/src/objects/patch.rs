//! The three Kubernetes patch types: JSON merge patch (RFC 7386), JSON patch (RFC 6902)
//! and strategic merge patch.

use serde_json::{Map, Value};

use crate::schema::shape::{ListType, Shape};

/// Recursion limit for our own walks. Values decoded by serde_json are at most 128 deep,
/// so this only matters for values built in code; it keeps us clear of stack overflow.
pub(crate) const MAX_DEPTH: usize = 256;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PatchError {
    #[error("json patch must be a JSON array of operation objects")]
    JsonPatchNotArray,
    /// `index` is the 0-based position of the operation in the patch array.
    #[error("json patch operation {index} ({op} {path}): {reason}")]
    JsonPatchOp { index: usize, op: String, path: String, reason: String },
    #[error("strategic merge patch must be a JSON object")]
    StrategicNotObject,
    /// `path` is like `.spec.containers[name="a"]`.
    #[error("strategic merge patch at {path}: {reason}")]
    Strategic { path: String, reason: String },
    #[error("patch nested too deeply (more than {MAX_DEPTH} levels)")]
    TooDeep,
}

// ---------------------------------------------------------------------------------------------
// JSON merge patch

/// RFC 7386 JSON merge patch. Never fails: a non-object patch replaces the target.
pub fn merge_patch(target: &Value, patch: &Value) -> Value {
    merge_patch_at(target, patch, 0)
}

fn merge_patch_at(target: &Value, patch: &Value, depth: usize) -> Value {
    let Value::Object(p) = patch else { return patch.clone() };
    if depth > MAX_DEPTH {
        // Beyond the limit, replacing is the only thing we can do without recursing.
        return strip_nulls_shallow(p);
    }
    let mut out = match target {
        Value::Object(t) => t.clone(),
        _ => Map::new(),
    };
    for (k, v) in p {
        if v.is_null() {
            out.remove(k);
        } else {
            let merged = merge_patch_at(out.get(k).unwrap_or(&Value::Null), v, depth + 1);
            out.insert(k.clone(), merged);
        }
    }
    Value::Object(out)
}

fn strip_nulls_shallow(p: &Map<String, Value>) -> Value {
    Value::Object(p.iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k.clone(), v.clone())).collect())
}

// ---------------------------------------------------------------------------------------------
// JSON patch

/// RFC 6902 JSON patch. All-or-nothing: on any error the target is untouched.
pub fn json_patch(target: &Value, ops: &Value) -> Result<Value, PatchError> {
    let Value::Array(ops) = ops else { return Err(PatchError::JsonPatchNotArray) };
    let mut doc = target.clone();
    for (index, op) in ops.iter().enumerate() {
        apply_json_op(&mut doc, index, op)?;
    }
    Ok(doc)
}

fn apply_json_op(doc: &mut Value, index: usize, op: &Value) -> Result<(), PatchError> {
    let fail = |op: &str, path: &str, reason: String| PatchError::JsonPatchOp {
        index,
        op: op.to_string(),
        path: path.to_string(),
        reason,
    };
    let Value::Object(o) = op else {
        return Err(fail("?", "", "operation must be a JSON object".into()));
    };
    let name = match o.get("op") {
        Some(Value::String(s)) => s.as_str(),
        Some(_) => return Err(fail("?", "", "\"op\" must be a string".into())),
        None => return Err(fail("?", "", "missing \"op\"".into())),
    };
    let path = match o.get("path") {
        Some(Value::String(s)) => s.as_str(),
        Some(_) => return Err(fail(name, "", "\"path\" must be a string".into())),
        None => return Err(fail(name, "", "missing \"path\"".into())),
    };
    let err = |reason: &str| fail(name, path, reason.to_string());
    let tokens = parse_pointer(path).map_err(|e| err(&e))?;
    // `value` may legitimately be null, so "absent" must be told apart from null.
    let value = || o.get("value").ok_or_else(|| err("missing \"value\""));
    let from = || -> Result<Vec<String>, PatchError> {
        match o.get("from") {
            Some(Value::String(f)) => parse_pointer(f).map_err(|e| err(&format!("from: {e}"))),
            Some(_) => Err(err("\"from\" must be a string")),
            None => Err(err("missing \"from\"")),
        }
    };
    match name {
        "add" => add(doc, &tokens, value()?.clone()).map_err(|e| err(&e)),
        "remove" => remove(doc, &tokens).map(|_| ()).map_err(|e| err(&e)),
        "replace" => {
            let v = value()?.clone();
            let slot = pointer_mut(doc, &tokens).ok_or_else(|| err("path not found"))?;
            *slot = v;
            Ok(())
        }
        "move" => {
            let from = from()?;
            if from == tokens {
                return pointer(doc, &from).map(|_| ()).ok_or_else(|| err("from: path not found"));
            }
            if tokens.len() > from.len() && tokens[..from.len()] == from[..] {
                return Err(err("cannot move a value into one of its own children"));
            }
            let v = remove(doc, &from).map_err(|e| err(&format!("from: {e}")))?;
            add(doc, &tokens, v).map_err(|e| err(&e))
        }
        "copy" => {
            let from = from()?;
            let v = pointer(doc, &from).ok_or_else(|| err("from: path not found"))?.clone();
            add(doc, &tokens, v).map_err(|e| err(&e))
        }
        "test" => {
            let expected = value()?;
            let actual = pointer(doc, &tokens).ok_or_else(|| err("path not found"))?;
            if json_equal(actual, expected) { Ok(()) } else { Err(err("test failed: value differs")) }
        }
        other => Err(fail(other, path, format!("unknown operation {other:?}"))),
    }
}

/// Split a JSON pointer into unescaped reference tokens.
fn parse_pointer(p: &str) -> Result<Vec<String>, String> {
    if p.is_empty() {
        return Ok(vec![]);
    }
    let Some(rest) = p.strip_prefix('/') else {
        return Err(format!("invalid JSON pointer {p:?}: must be empty or start with '/'"));
    };
    rest.split('/')
        .map(|t| {
            let mut out = String::with_capacity(t.len());
            let mut chars = t.chars();
            while let Some(c) = chars.next() {
                if c == '~' {
                    match chars.next() {
                        Some('0') => out.push('~'),
                        Some('1') => out.push('/'),
                        _ => return Err(format!("invalid JSON pointer {p:?}: '~' must be followed by 0 or 1")),
                    }
                } else {
                    out.push(c);
                }
            }
            Ok(out)
        })
        .collect()
}

/// Parse an array index token: digits only, no leading zeros (RFC 6901).
fn parse_index(t: &str) -> Option<usize> {
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) || (t.len() > 1 && t.starts_with('0')) {
        return None;
    }
    t.parse().ok()
}

fn pointer<'a>(doc: &'a Value, tokens: &[String]) -> Option<&'a Value> {
    tokens.iter().try_fold(doc, |cur, t| match cur {
        Value::Object(m) => m.get(t),
        Value::Array(a) => parse_index(t).and_then(|i| a.get(i)),
        _ => None,
    })
}

fn pointer_mut<'a>(doc: &'a mut Value, tokens: &[String]) -> Option<&'a mut Value> {
    tokens.iter().try_fold(doc, |cur, t| match cur {
        Value::Object(m) => m.get_mut(t),
        Value::Array(a) => parse_index(t).and_then(move |i| a.get_mut(i)),
        _ => None,
    })
}

fn add(doc: &mut Value, tokens: &[String], v: Value) -> Result<(), String> {
    let Some((last, parent)) = tokens.split_last() else {
        *doc = v;
        return Ok(());
    };
    match pointer_mut(doc, parent) {
        Some(Value::Object(m)) => {
            m.insert(last.clone(), v);
            Ok(())
        }
        Some(Value::Array(a)) => {
            if last == "-" {
                a.push(v);
                return Ok(());
            }
            match parse_index(last) {
                Some(i) if i <= a.len() => {
                    a.insert(i, v);
                    Ok(())
                }
                Some(i) => Err(format!("index {i} out of bounds (array length {})", a.len())),
                None => Err(format!("invalid array index {last:?}")),
            }
        }
        Some(_) => Err("parent is not an object or array".into()),
        None => Err("path not found (parent does not exist)".into()),
    }
}

fn remove(doc: &mut Value, tokens: &[String]) -> Result<Value, String> {
    let Some((last, parent)) = tokens.split_last() else {
        return Err("cannot remove the whole document".into());
    };
    match pointer_mut(doc, parent) {
        Some(Value::Object(m)) => m.remove(last).ok_or_else(|| "path not found".to_string()),
        Some(Value::Array(a)) => match parse_index(last) {
            Some(i) if i < a.len() => Ok(a.remove(i)),
            _ => Err("path not found".into()),
        },
        _ => Err("path not found".into()),
    }
}

/// JSON equality where numbers compare by value (`1` == `1.0`), as RFC 6902 `test` requires.
pub(crate) fn json_equal(a: &Value, b: &Value) -> bool {
    json_equal_at(a, b, 0)
}

fn json_equal_at(a: &Value, b: &Value, depth: usize) -> bool {
    if depth > MAX_DEPTH {
        return a == b;
    }
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            if x == y {
                return true;
            }
            match (x.as_i64(), y.as_i64(), x.as_u64(), y.as_u64()) {
                (Some(i), Some(j), _, _) => i == j,
                (_, _, Some(i), Some(j)) => i == j,
                _ => match (x.as_f64(), y.as_f64()) {
                    (Some(f), Some(g)) => f == g,
                    _ => false,
                },
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| json_equal_at(a, b, depth + 1))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| json_equal_at(v, w, depth + 1)))
        }
        _ => a == b,
    }
}

// ---------------------------------------------------------------------------------------------
// Strategic merge patch

const PATCH: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const DELETE_FROM_PRIMITIVE: &str = "$deleteFromPrimitiveList/";
const SET_ELEMENT_ORDER: &str = "$setElementOrder/";

fn is_directive(k: &str) -> bool {
    k == PATCH || k == RETAIN_KEYS || k.starts_with(DELETE_FROM_PRIMITIVE) || k.starts_with(SET_ELEMENT_ORDER)
}

fn smp_err(path: &str, reason: impl Into<String>) -> PatchError {
    PatchError::Strategic { path: if path.is_empty() { ".".into() } else { path.into() }, reason: reason.into() }
}

/// Strategic merge patch (Kubernetes' strategic-merge-patch.md), driven by `shape`
/// instead of Go struct tags.
pub fn strategic_merge_patch(target: &Value, patch: &Value, shape: &Shape) -> Result<Value, PatchError> {
    let Value::Object(p) = patch else { return Err(PatchError::StrategicNotObject) };
    let empty = Map::new();
    let t = target.as_object().unwrap_or(&empty);
    // A root-level `$patch: delete` leaves an empty object (there is no parent to remove it from).
    Ok(Value::Object(smp_map(t, p, shape, "", 0)?.unwrap_or_default()))
}

/// Merge a patch map into an original map. `Ok(None)` means "delete this map".
fn smp_map(
    orig: &Map<String, Value>,
    patch: &Map<String, Value>,
    shape: &Shape,
    path: &str,
    depth: usize,
) -> Result<Option<Map<String, Value>>, PatchError> {
    if depth > MAX_DEPTH {
        return Err(PatchError::TooDeep);
    }
    match patch.get(PATCH) {
        None => {}
        Some(Value::String(s)) if s == "merge" => {}
        Some(Value::String(s)) if s == "delete" => return Ok(None),
        Some(Value::String(s)) if s == "replace" => {
            // Replace: the result is the patch itself, with its own directives still honoured
            // against an empty original (so nothing of them leaks into the output).
            let rest: Map<String, Value> = patch.iter().filter(|(k, _)| *k != PATCH).map(|(k, v)| (k.clone(), v.clone())).collect();
            return smp_map(&Map::new(), &rest, shape, path, depth);
        }
        Some(other) => return Err(smp_err(path, format!("unknown $patch directive {other}; expected merge, replace or delete"))),
    }

    let mut out = orig.clone();

    if let Some(retain) = patch.get(RETAIN_KEYS) {
        let Some(list) = retain.as_array() else {
            return Err(smp_err(path, "$retainKeys must be a list of field names"));
        };
        let mut keep = Vec::with_capacity(list.len());
        for k in list {
            let Some(k) = k.as_str() else {
                return Err(smp_err(path, "$retainKeys must be a list of field names"));
            };
            keep.push(k);
        }
        out.retain(|k, _| keep.contains(&k.as_str()));
        // Keys the patch sets must be retained too, otherwise the patch contradicts itself.
        for k in patch.keys().filter(|k| !is_directive(k)) {
            if !keep.contains(&k.as_str()) && !patch[k.as_str()].is_null() {
                return Err(smp_err(path, format!("$retainKeys does not list {k:?}, which the patch sets")));
            }
        }
    }

    let mut orders: Vec<(&str, &Vec<Value>)> = Vec::new();
    for (k, v) in patch {
        if let Some(field) = k.strip_prefix(DELETE_FROM_PRIMITIVE) {
            let Some(del) = v.as_array() else {
                return Err(smp_err(&child(path, field), "$deleteFromPrimitiveList value must be a list"));
            };
            if let Some(Value::Array(list)) = out.get_mut(field) {
                list.retain(|e| !del.iter().any(|d| json_equal(d, e)));
            }
        } else if let Some(field) = k.strip_prefix(SET_ELEMENT_ORDER) {
            let Some(order) = v.as_array() else {
                return Err(smp_err(&child(path, field), "$setElementOrder value must be a list"));
            };
            orders.push((field, order));
        }
    }

    for (k, v) in patch {
        if is_directive(k) {
            continue;
        }
        if v.is_null() {
            out.remove(k);
            continue;
        }
        let p = child(path, k);
        match smp_value(out.get(k), v, shape.field(k), &p, depth + 1)? {
            Some(merged) => {
                out.insert(k.clone(), merged);
            }
            None => {
                out.remove(k);
            }
        }
    }

    for (field, order) in orders {
        if let Some(Value::Array(list)) = out.get_mut(field) {
            apply_element_order(list, order, shape.field(field));
        }
    }
    Ok(Some(out))
}

fn child(path: &str, field: &str) -> String {
    format!("{path}.{field}")
}

/// Merge one patch value into an optional original. `Ok(None)` means "remove the key".
fn smp_value(
    orig: Option<&Value>,
    patch: &Value,
    shape: &Shape,
    path: &str,
    depth: usize,
) -> Result<Option<Value>, PatchError> {
    if depth > MAX_DEPTH {
        return Err(PatchError::TooDeep);
    }
    match patch {
        Value::Object(p) => {
            let empty = Map::new();
            // Atomic maps are replaced, but directives in them are still interpreted.
            let base = match orig {
                Some(Value::Object(o)) if !shape.is_atomic_map() => o,
                _ => &empty,
            };
            Ok(smp_map(base, p, shape, path, depth)?.map(Value::Object))
        }
        Value::Array(items) => {
            let orig = match orig {
                Some(Value::Array(a)) => Some(a.as_slice()),
                _ => None,
            };
            let merged = match shape.list_type() {
                ListType::Map(keys) => smp_map_list(orig, items, keys, shape.items(), path, depth)?,
                ListType::Set => smp_set_list(orig, items, path)?,
                ListType::Atomic => smp_atomic_list(items, path)?,
            };
            Ok(Some(Value::Array(merged)))
        }
        other => Ok(Some(other.clone())),
    }
}

/// Find a `{"$patch": ...}` marker element in a list patch; returns its directive.
fn list_directive<'a>(e: &'a Value, path: &str) -> Result<Option<&'a str>, PatchError> {
    match e.as_object().and_then(|o| o.get(PATCH)) {
        None => Ok(None),
        Some(Value::String(s)) if matches!(s.as_str(), "replace" | "delete" | "merge") => Ok(Some(s)),
        Some(other) => Err(smp_err(path, format!("unknown $patch directive {other} in list element"))),
    }
}

fn smp_atomic_list(items: &[Value], path: &str) -> Result<Vec<Value>, PatchError> {
    // Atomic lists are replaced anyway, so a `$patch: replace` marker is tolerated and dropped.
    let mut out = Vec::with_capacity(items.len());
    for e in items {
        match list_directive(e, path)? {
            Some("replace") => {}
            Some(d) => return Err(smp_err(path, format!("$patch: {d} is not supported in an atomic list"))),
            None => out.push(e.clone()),
        }
    }
    Ok(out)
}

fn smp_set_list(orig: Option<&[Value]>, items: &[Value], path: &str) -> Result<Vec<Value>, PatchError> {
    let mut replace = false;
    let mut new = Vec::new();
    for e in items {
        match list_directive(e, path)? {
            Some("replace") => replace = true,
            Some(d) => return Err(smp_err(path, format!("$patch: {d} is not supported in a set list; use $deleteFromPrimitiveList"))),
            None => new.push(e),
        }
    }
    if replace {
        let mut out: Vec<Value> = Vec::new();
        for e in new {
            if !out.iter().any(|o| json_equal(o, e)) {
                out.push(e.clone());
            }
        }
        return Ok(out);
    }
    let server = orig.unwrap_or_default();
    // kube-apiserver's order (strategicpatch's normalizeElementOrder): the patch's items in patch
    // order, the server's other items in server order, interleaved where both are on the server;
    // a patch item the server does not have goes before the server item it is compared with.
    let mut patch_items: Vec<&Value> = Vec::new();
    for e in new {
        if !patch_items.iter().any(|o| json_equal(o, e)) {
            patch_items.push(e);
        }
    }
    let server_only: Vec<&Value> = server.iter().filter(|o| !patch_items.iter().any(|p| json_equal(p, o))).collect();
    let position = |v: &Value| server.iter().position(|o| json_equal(o, v));
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::with_capacity(patch_items.len() + server_only.len());
    while i < patch_items.len() || j < server_only.len() {
        let take_patch = match (patch_items.get(i), server_only.get(j)) {
            (Some(p), Some(s)) => match (position(p), position(s)) {
                (Some(pi), Some(si)) => pi < si,
                _ => true,
            },
            (Some(_), None) => true,
            _ => false,
        };
        if take_patch {
            out.push(patch_items[i].clone());
            i += 1;
        } else {
            out.push(server_only[j].clone());
            j += 1;
        }
    }
    Ok(out)
}

/// Key of a map-list element: the values of the key fields, all of which must be present.
fn element_key<'a>(e: &'a Value, keys: &[String]) -> Option<Vec<&'a Value>> {
    let o = e.as_object()?;
    keys.iter().map(|k| o.get(k).filter(|v| !v.is_null())).collect()
}

fn keys_equal(a: &[&Value], b: &[&Value]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| json_equal(x, y))
}

fn describe_key(keys: &[String], vals: &[&Value]) -> String {
    let parts: Vec<String> = keys.iter().zip(vals).map(|(k, v)| format!("{k}={v}")).collect();
    format!("[{}]", parts.join(","))
}

fn smp_map_list(
    orig: Option<&[Value]>,
    items: &[Value],
    keys: &[String],
    item_shape: &Shape,
    path: &str,
    depth: usize,
) -> Result<Vec<Value>, PatchError> {
    let mut replace = false;
    for e in items {
        if list_directive(e, path)? == Some("replace") {
            replace = true;
        }
    }
    let mut out: Vec<Value> = if replace { Vec::new() } else { orig.unwrap_or_default().to_vec() };
    for e in items {
        let directive = list_directive(e, path)?;
        // As in Kubernetes, an element carrying `$patch: replace` only marks the whole list
        // as replaced; the element itself is dropped.
        if directive == Some("replace") {
            continue;
        }
        let Some(key) = element_key(e, keys) else {
            return Err(smp_err(path, format!("list element {e} lacks merge key(s) {keys:?}")));
        };
        let p = format!("{path}{}", describe_key(keys, &key));
        let pos = out.iter().position(|o| element_key(o, keys).is_some_and(|k| keys_equal(&k, &key)));
        if directive == Some("delete") {
            out.retain(|o| !element_key(o, keys).is_some_and(|k| keys_equal(&k, &key)));
            continue;
        }
        let Some(pm) = e.as_object() else { return Err(smp_err(&p, "list element is not an object")) };
        let base = match pos.and_then(|i| out[i].as_object()) {
            Some(o) => o.clone(),
            None => Map::new(),
        };
        let merged = smp_map(&base, pm, item_shape, &p, depth + 1)?;
        match (pos, merged) {
            (Some(i), Some(m)) => out[i] = Value::Object(m),
            (None, Some(m)) => out.push(Value::Object(m)),
            (Some(i), None) => {
                out.remove(i);
            }
            (None, None) => {}
        }
    }
    Ok(out)
}

/// Reorder `list` per `$setElementOrder`: the slots held by elements named in `order` are
/// refilled in the order given; unnamed elements keep their slots; unknown names are ignored.
fn apply_element_order(list: &mut [Value], order: &[Value], shape: &Shape) {
    let matches = |e: &Value, o: &Value| match shape.list_type() {
        ListType::Map(keys) => match (element_key(e, keys), element_key(o, keys)) {
            (Some(a), Some(b)) => keys_equal(&a, &b),
            _ => false,
        },
        _ => json_equal(e, o),
    };
    let mut taken = vec![false; list.len()];
    let mut ordered = Vec::new();
    for o in order {
        if let Some(i) = (0..list.len()).find(|&i| !taken[i] && matches(&list[i], o)) {
            taken[i] = true;
            ordered.push(list[i].clone());
        }
    }
    let slots = (0..list.len()).filter(|&i| taken[i]);
    for (slot, v) in slots.zip(ordered) {
        list[slot] = v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::shape::{ListType, Shape};
    use serde_json::json;

    // ---- merge patch

    #[test]
    fn merge_patch_rfc7386_examples() {
        let cases = [
            (json!({"a": "b"}), json!({"a": "c"}), json!({"a": "c"})),
            (json!({"a": "b"}), json!({"b": "c"}), json!({"a": "b", "b": "c"})),
            (json!({"a": "b"}), json!({"a": null}), json!({})),
            (json!({"a": "b", "b": "c"}), json!({"a": null}), json!({"b": "c"})),
            (json!({"a": ["b"]}), json!({"a": "c"}), json!({"a": "c"})),
            (json!({"a": "c"}), json!({"a": ["b"]}), json!({"a": ["b"]})),
            (json!({"a": {"b": "c"}}), json!({"a": {"b": "d", "c": null}}), json!({"a": {"b": "d"}})),
            (json!({"a": [{"b": "c"}]}), json!({"a": [1]}), json!({"a": [1]})),
            (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
            (json!({"a": "b"}), json!(["c"]), json!(["c"])),
            (json!({"a": "foo"}), json!(null), json!(null)),
            (json!({"a": "foo"}), json!("bar"), json!("bar")),
            (json!({"e": null}), json!({"a": 1}), json!({"e": null, "a": 1})),
            (json!([1, 2]), json!({"a": "b", "c": null}), json!({"a": "b"})),
            (json!({}), json!({"a": {"bb": {"ccc": null}}}), json!({"a": {"bb": {}}})),
        ];
        for (t, p, want) in cases {
            assert_eq!(merge_patch(&t, &p), want, "target {t} patch {p}");
        }
    }

    // ---- json patch

    #[test]
    fn json_patch_ops() {
        let doc = json!({"spec": {"a": 1, "list": [1, 2, 3], "x/y": 5, "m~n": 6}});
        let ops = json!([
            {"op": "add", "path": "/spec/b", "value": 2},
            {"op": "add", "path": "/spec/list/-", "value": 4},
            {"op": "add", "path": "/spec/list/0", "value": 0},
            {"op": "remove", "path": "/spec/list/1"},
            {"op": "replace", "path": "/spec/a", "value": {"z": null}},
            {"op": "test", "path": "/spec/x~1y", "value": 5.0},
            {"op": "copy", "from": "/spec/m~0n", "path": "/spec/copied"},
            {"op": "move", "from": "/spec/b", "path": "/spec/moved"},
            {"op": "add", "path": "/spec/nullv", "value": null}
        ]);
        let out = json_patch(&doc, &ops).unwrap();
        assert_eq!(
            out,
            json!({"spec": {"a": {"z": null}, "list": [0, 2, 3, 4], "x/y": 5, "m~n": 6, "copied": 6, "moved": 2, "nullv": null}})
        );
    }

    #[test]
    fn json_patch_root_and_move_same() {
        assert_eq!(json_patch(&json!({"a": 1}), &json!([{"op": "add", "path": "", "value": [1]}])).unwrap(), json!([1]));
        assert_eq!(json_patch(&json!({"a": 1}), &json!([{"op": "replace", "path": "", "value": 3}])).unwrap(), json!(3));
        assert_eq!(json_patch(&json!({"a": 1}), &json!([{"op": "move", "from": "/a", "path": "/a"}])).unwrap(), json!({"a": 1}));
        assert_eq!(json_patch(&json!({"a": 1}), &json!([])).unwrap(), json!({"a": 1}));
    }

    #[test]
    fn json_patch_errors() {
        let doc = json!({"spec": {"a": 1, "l": [1]}});
        let bad: &[(Value, &str)] = &[
            (json!({"op": "add"}), "must be a JSON array"),
            (json!([1]), "operation 0 (? ): operation must be a JSON object"),
            (json!([{"path": "/a"}]), "missing \"op\""),
            (json!([{"op": "add", "path": "/a"}]), "missing \"value\""),
            (json!([{"op": "bogus", "path": "/a"}]), "unknown operation"),
            (json!([{"op": "test", "path": "/spec/a", "value": 1}, {"op": "remove", "path": "/spec/x"}]),
             "json patch operation 1 (remove /spec/x): path not found"),
            (json!([{"op": "replace", "path": "/spec/x", "value": 1}]), "path not found"),
            (json!([{"op": "add", "path": "/nope/x", "value": 1}]), "parent does not exist"),
            (json!([{"op": "add", "path": "/spec/l/5", "value": 1}]), "out of bounds"),
            (json!([{"op": "add", "path": "/spec/l/01", "value": 1}]), "invalid array index"),
            (json!([{"op": "remove", "path": "/spec/l/-"}]), "path not found"),
            (json!([{"op": "test", "path": "/spec/a", "value": 2}]), "test failed"),
            (json!([{"op": "add", "path": "spec", "value": 2}]), "must be empty or start with '/'"),
            (json!([{"op": "add", "path": "/spec/~2", "value": 2}]), "'~' must be followed by 0 or 1"),
            (json!([{"op": "move", "from": "/spec", "path": "/spec/a/b"}]), "own children"),
            (json!([{"op": "move", "path": "/spec/b"}]), "missing \"from\""),
            (json!([{"op": "copy", "from": "/zz", "path": "/spec/b"}]), "from: path not found"),
            (json!([{"op": "remove", "path": ""}]), "whole document"),
            (json!([{"op": "add", "path": "/spec/a/b", "value": 1}]), "not an object or array"),
        ];
        for (ops, want) in bad {
            let e = json_patch(&doc, ops).unwrap_err().to_string();
            assert!(e.contains(want), "ops {ops}: got {e:?}, want {want:?}");
        }
    }

    #[test]
    fn json_patch_is_atomic() {
        let doc = json!({"a": 1});
        let ops = json!([{"op": "add", "path": "/b", "value": 2}, {"op": "remove", "path": "/zz"}]);
        assert!(json_patch(&doc, &ops).is_err());
        assert_eq!(doc, json!({"a": 1}));
    }

    // ---- strategic merge patch

    fn pod_shape() -> Shape {
        let container = Shape::object([
            ("name", Shape::Scalar),
            ("image", Shape::Scalar),
            ("args", Shape::list(ListType::Atomic, Shape::Scalar)),
            ("ports", Shape::list(ListType::Map(vec!["containerPort".into(), "protocol".into()]), Shape::Any)),
        ]);
        Shape::object([
            ("metadata", crate::schema::shape::object_meta()),
            (
                "spec",
                Shape::object([
                    ("containers", Shape::list(ListType::Map(vec!["name".into()]), container)),
                    ("tags", Shape::list(ListType::Set, Shape::Scalar)),
                    ("args", Shape::list(ListType::Atomic, Shape::Scalar)),
                    ("selector", Shape::Object { fields: Default::default(), additional: Some(Box::new(Shape::Scalar)), map_type_atomic: true }),
                ]),
            ),
        ])
    }

    fn smp(t: Value, p: Value) -> Result<Value, PatchError> {
        strategic_merge_patch(&t, &p, &pod_shape())
    }

    #[test]
    fn smp_maps_and_nulls() {
        let out = smp(json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"x": {"y": 1}}}),
                      json!({"metadata": {"labels": {"a": null, "c": "3"}}, "spec": {"x": {"z": 2}}})).unwrap();
        assert_eq!(out, json!({"metadata": {"labels": {"b": "2", "c": "3"}}, "spec": {"x": {"y": 1, "z": 2}}}));
    }

    #[test]
    fn smp_map_list_merge_delete_replace() {
        let t = json!({"spec": {"containers": [{"name": "a", "image": "a:1", "args": ["x"]}, {"name": "b", "image": "b:1"}]}});
        let out = smp(t.clone(), json!({"spec": {"containers": [
            {"name": "b", "image": "b:2"}, {"name": "c", "image": "c:1"}, {"name": "a", "args": ["y", "z"]}
        ]}})).unwrap();
        assert_eq!(out, json!({"spec": {"containers": [
            {"name": "a", "image": "a:1", "args": ["y", "z"]}, {"name": "b", "image": "b:2"}, {"name": "c", "image": "c:1"}
        ]}}));

        let out = smp(t.clone(), json!({"spec": {"containers": [{"name": "a", "$patch": "delete"}]}})).unwrap();
        assert_eq!(out, json!({"spec": {"containers": [{"name": "b", "image": "b:1"}]}}));

        let out = smp(t.clone(), json!({"spec": {"containers": [{"name": "z", "image": "z"}, {"$patch": "replace"}]}})).unwrap();
        assert_eq!(out, json!({"spec": {"containers": [{"name": "z", "image": "z"}]}}));

        // Any element carrying `$patch: replace` replaces the whole list (and is itself dropped).
        let out = smp(t, json!({"spec": {"containers": [{"name": "q", "$patch": "replace"}, {"name": "a", "image": "new"}]}})).unwrap();
        assert_eq!(out, json!({"spec": {"containers": [{"name": "a", "image": "new"}]}}));
    }

    #[test]
    fn smp_multi_key_map_list() {
        let t = json!({"spec": {"containers": [{"name": "a", "ports": [
            {"containerPort": 80, "protocol": "TCP", "hostPort": 1}, {"containerPort": 80, "protocol": "UDP"}]}]}});
        let out = smp(t, json!({"spec": {"containers": [{"name": "a", "ports": [
            {"containerPort": 80, "protocol": "UDP", "hostPort": 2}]}]}})).unwrap();
        assert_eq!(out["spec"]["containers"][0]["ports"], json!([
            {"containerPort": 80, "protocol": "TCP", "hostPort": 1}, {"containerPort": 80, "protocol": "UDP", "hostPort": 2}]));
    }

    #[test]
    fn smp_sets_and_atomic() {
        let out = smp(json!({"spec": {"tags": ["a", "b"], "args": ["1", "2"], "selector": {"x": "1"}}}),
                      json!({"spec": {"tags": ["c", "a"], "args": ["3"], "selector": {"y": "2"}}})).unwrap();
        // Like kube-apiserver: the patch's items in its order, then the items only the object had.
        assert_eq!(out, json!({"spec": {"tags": ["c", "a", "b"], "args": ["3"], "selector": {"y": "2"}}}));
        // Unknown lists (shape Any) are atomic.
        let out = smp(json!({"other": [1, 2]}), json!({"other": [3]})).unwrap();
        assert_eq!(out, json!({"other": [3]}));
        // Set list replace marker.
        let out = smp(json!({"spec": {"tags": ["a", "b"]}}), json!({"spec": {"tags": [{"$patch": "replace"}, "z"]}})).unwrap();
        assert_eq!(out, json!({"spec": {"tags": ["z"]}}));
    }

    #[test]
    fn smp_map_directives() {
        let t = json!({"spec": {"x": {"a": 1, "b": 2}, "y": 1}});
        assert_eq!(smp(t.clone(), json!({"spec": {"x": {"$patch": "replace", "c": 3}}})).unwrap(),
                   json!({"spec": {"x": {"c": 3}, "y": 1}}));
        assert_eq!(smp(t.clone(), json!({"spec": {"x": {"$patch": "delete"}}})).unwrap(), json!({"spec": {"y": 1}}));
        assert_eq!(smp(t.clone(), json!({"$patch": "delete"})).unwrap(), json!({}));
        assert_eq!(smp(t.clone(), json!({"spec": {"x": {"$retainKeys": ["b", "c"], "c": 3}}})).unwrap(),
                   json!({"spec": {"x": {"b": 2, "c": 3}, "y": 1}}));
        assert_eq!(smp(t, json!({"spec": {"x": {"$patch": "merge", "c": 3}}})).unwrap(),
                   json!({"spec": {"x": {"a": 1, "b": 2, "c": 3}, "y": 1}}));
    }

    #[test]
    fn smp_delete_from_primitive_list_and_order() {
        let t = json!({"spec": {"tags": ["a", "b", "c"], "containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}});
        let out = smp(t.clone(), json!({"spec": {"$deleteFromPrimitiveList/tags": ["b", "zz"], "tags": ["d"]}})).unwrap();
        // As kube-apiserver orders a merged primitive list: a new item first.
        assert_eq!(out, json!({"spec": {"tags": ["d", "a", "c"], "containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}}));

        let out = smp(t.clone(), json!({"spec": {
            "$setElementOrder/containers": [{"name": "d"}, {"name": "c"}, {"name": "unknown"}, {"name": "a"}, 7],
            "containers": [{"name": "d"}],
            "$setElementOrder/tags": ["c", "a"]
        }})).unwrap();
        // b is not named, so it keeps its slot; d, c, a fill the remaining slots in order.
        assert_eq!(out["spec"]["containers"], json!([{"name": "d"}, {"name": "b"}, {"name": "c"}, {"name": "a"}]));
        assert_eq!(out["spec"]["tags"], json!(["c", "b", "a"]));
        assert!(!out.to_string().contains('$'));
    }

    #[test]
    fn smp_primitive_lists_merge_in_kube_apiserver_order() {
        let t = json!({"metadata": {"finalizers": ["a", "b", "c"]}});
        let merged = |p: Value| smp(t.clone(), json!({"metadata": {"finalizers": p}})).unwrap()["metadata"]["finalizers"].clone();
        assert_eq!(merged(json!(["x"])), json!(["x", "a", "b", "c"]));
        assert_eq!(merged(json!(["b", "d"])), json!(["a", "b", "d", "c"]));
        assert_eq!(merged(json!(["c", "a"])), json!(["b", "c", "a"]));
        assert_eq!(merged(json!(["a", "a"])), json!(["a", "b", "c"]));
        assert_eq!(smp(json!({}), json!({"metadata": {"finalizers": ["x", "y"]}})).unwrap()["metadata"]["finalizers"], json!(["x", "y"]));
    }

    #[test]
    fn smp_no_directive_leaks() {
        let out = smp(json!({}), json!({"spec": {"new": {"$patch": "replace", "a": {"$retainKeys": ["b"], "b": 1}},
            "containers": [{"name": "a", "$patch": "merge", "x": {"$patch": "replace", "y": 1}}]}})).unwrap();
        assert_eq!(out, json!({"spec": {"new": {"a": {"b": 1}}, "containers": [{"name": "a", "x": {"y": 1}}]}}));
        assert!(!out.to_string().contains('$'));
    }

    #[test]
    fn smp_errors() {
        let cases: &[(Value, &str)] = &[
            (json!({"spec": {"$patch": "foo"}}), "unknown $patch directive"),
            (json!({"spec": {"x": {"$retainKeys": "a"}}}), "$retainKeys must be a list"),
            (json!({"spec": {"x": {"$retainKeys": [1]}}}), "$retainKeys must be a list"),
            (json!({"spec": {"x": {"$retainKeys": ["a"], "b": 1}}}), "does not list"),
            (json!({"spec": {"containers": [{"image": "x"}]}}), "lacks merge key"),
            (json!({"spec": {"containers": ["x"]}}), "lacks merge key"),
            (json!({"spec": {"containers": [{"name": "a", "$patch": 3}]}}), "unknown $patch directive"),
            (json!({"spec": {"$deleteFromPrimitiveList/tags": "a"}}), "must be a list"),
            (json!({"spec": {"$setElementOrder/tags": {}}}), "must be a list"),
            (json!({"spec": {"tags": [{"$patch": "delete"}]}}), "not supported in a set list"),
            (json!({"spec": {"args": [{"$patch": "delete"}]}}), "not supported in an atomic list"),
        ];
        for (p, want) in cases {
            let e = smp(json!({"spec": {"x": {"a": 1}}}), p.clone()).unwrap_err().to_string();
            assert!(e.contains(want), "patch {p}: got {e:?}, want {want:?}");
        }
        assert_eq!(smp(json!({}), json!([1])).unwrap_err(), PatchError::StrategicNotObject);
        let e = smp(json!({}), json!({"spec": {"containers": [{"image": "x"}]}})).unwrap_err().to_string();
        assert!(e.contains(".spec.containers"), "{e}");
    }

    fn deep(n: usize, leaf: Value) -> Value {
        let mut v = leaf;
        for _ in 0..n {
            v = json!({"a": v});
        }
        v
    }

    #[test]
    fn nothing_panics_on_odd_input() {
        let odd = [
            json!(null), json!(1), json!("s"), json!(true), json!([]), json!([null, 1, "x", [], {}]),
            json!({}), json!({"$patch": null}), json!({"a": {"$patch": []}}), json!({"spec": []}),
            json!({"spec": {"containers": {}}}), json!({"spec": {"containers": [null]}}),
            json!({"spec": {"containers": [{"name": null}]}}), json!({"spec": {"tags": {"a": 1}}}),
            json!({"$setElementOrder/spec": [1], "spec": 5}), json!({"$deleteFromPrimitiveList/spec": []}),
            json!([{"op": "add", "path": "/a/-/b", "value": 1}]), json!([{"op": "move", "from": "", "path": "/a"}]),
            json!([{"op": "copy", "from": "", "path": ""}]), json!([{"op": "test", "path": "", "value": {}}]),
            deep(300, json!(1)), deep(300, json!(null)),
        ];
        let shape = pod_shape();
        for t in &odd {
            for p in &odd {
                let _ = merge_patch(t, p);
                let _ = json_patch(t, p);
                let _ = strategic_merge_patch(t, p, &shape);
                let _ = strategic_merge_patch(t, p, &Shape::Any);
                let _ = strategic_merge_patch(t, p, &Shape::Scalar);
            }
        }
        assert_eq!(strategic_merge_patch(&json!({}), &deep(300, json!(1)), &Shape::Any), Err(PatchError::TooDeep));
    }
}
