//! Server-side apply and `metadata.managedFields` bookkeeping.
//!
//! Field ownership is tracked as sets of paths (FieldSet), stored per manager in
//! `metadata.managedFields` in Kubernetes' FieldsV1 format.

use std::collections::BTreeSet;
use std::fmt;
use std::ops::Bound;

use serde_json::{Map, Value};

use crate::objects::patch::{MAX_DEPTH, json_equal};
use crate::schema::shape::{ListType, Shape};

// ---------------------------------------------------------------------------------------------
// Paths

/// One step of a field path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathElement {
    /// `f:<name>`: a field of an object.
    Field(String),
    /// `k:{...}`: the element of a map list whose key fields have these values.
    Key(Map<String, Value>),
    /// `v:<json>`: the element of a set list with this value.
    Value(Value),
    /// `i:<n>`: a list element by position (only used when nothing better exists).
    Index(usize),
}

impl PathElement {
    /// The FieldsV1 key for this element (`f:`, `k:`, `v:` or `i:` prefixed).
    pub fn encode(&self) -> String {
        match self {
            PathElement::Field(f) => format!("f:{f}"),
            PathElement::Key(m) => format!("k:{}", canonical_json(&Value::Object(m.clone()), 0)),
            PathElement::Value(v) => format!("v:{}", canonical_json(v, 0)),
            PathElement::Index(i) => format!("i:{i}"),
        }
    }

    /// Parse a FieldsV1 key.
    pub fn decode(s: &str) -> Result<PathElement, FieldsError> {
        let bad = |reason: &str| FieldsError { path: s.to_string(), reason: reason.to_string() };
        if let Some(f) = s.strip_prefix("f:") {
            Ok(PathElement::Field(f.to_string()))
        } else if let Some(k) = s.strip_prefix("k:") {
            match serde_json::from_str::<Value>(k) {
                Ok(Value::Object(m)) => Ok(PathElement::Key(m)),
                _ => Err(bad("k: must be followed by a JSON object")),
            }
        } else if let Some(v) = s.strip_prefix("v:") {
            serde_json::from_str(v).map(PathElement::Value).map_err(|_| bad("v: must be followed by JSON"))
        } else if let Some(i) = s.strip_prefix("i:") {
            i.parse().map(PathElement::Index).map_err(|_| bad("i: must be followed by a number"))
        } else {
            Err(bad("key must start with f:, k:, v: or i:"))
        }
    }

    /// Human form used in conflict messages: `.name`, `[type="Ready"]`, `[="x"]`, `[3]`.
    fn display(&self) -> String {
        match self {
            PathElement::Field(f) => format!(".{f}"),
            PathElement::Key(m) => {
                let parts: Vec<String> = m.iter().map(|(k, v)| format!("{k}={}", canonical_json(v, 0))).collect();
                format!("[{}]", parts.join(","))
            }
            PathElement::Value(v) => format!("[={}]", canonical_json(v, 0)),
            PathElement::Index(i) => format!("[{i}]"),
        }
    }
}

/// Compact JSON with object keys sorted at every level, so `k:`/`v:` keys are canonical even
/// if serde_json's `preserve_order` gets switched on by feature unification elsewhere.
fn canonical_json(v: &Value, depth: usize) -> String {
    match v {
        Value::Object(m) if depth <= MAX_DEPTH => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let parts: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", Value::String(k.clone()), canonical_json(&m[k.as_str()], depth + 1)))
                .collect();
            format!("{{{}}}", parts.join(","))
        }
        Value::Array(a) if depth <= MAX_DEPTH => {
            let parts: Vec<String> = a.iter().map(|e| canonical_json(e, depth + 1)).collect();
            format!("[{}]", parts.join(","))
        }
        other => other.to_string(),
    }
}

/// Human form of an encoded path, e.g. `.spec.containers[name="a"].image`.
fn display_path(p: &[String]) -> String {
    p.iter().map(|s| PathElement::decode(s).map(|e| e.display()).unwrap_or_else(|_| format!(".{s}"))).collect()
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid fieldsV1 at {path:?}: {reason}")]
pub struct FieldsError {
    pub path: String,
    pub reason: String,
}

// ---------------------------------------------------------------------------------------------
// FieldSet

/// A set of owned field paths. Paths are stored in their encoded FieldsV1 form, which makes
/// them totally ordered (descendants sort right after their ancestor).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSet(BTreeSet<Vec<String>>);

/// Top-level fields that are never owned.
const IGNORED_TOP: &[&str] = &["apiVersion", "kind"];
/// `metadata` fields that are never owned (server-managed or identity).
const IGNORED_META: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
];

fn strip_ignored(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Value::Object(o) = &mut v {
        for k in IGNORED_TOP {
            o.remove(*k);
        }
        if let Some(Value::Object(m)) = o.get_mut("metadata") {
            for k in IGNORED_META {
                m.remove(*k);
            }
            if m.is_empty() {
                o.remove("metadata");
            }
        }
    }
    v
}

impl FieldSet {
    pub fn new() -> FieldSet {
        FieldSet::default()
    }

    /// Every leaf and every list-element path of `obj` (ignoring apiVersion, kind and the
    /// server-managed metadata fields). Empty maps/lists and atomic values are leaves.
    pub fn from_object(obj: &Value, shape: &Shape) -> FieldSet {
        let mut set = BTreeSet::new();
        let stripped = strip_ignored(obj);
        if let Value::Object(m) = &stripped {
            let mut path = Vec::new();
            for (k, v) in m {
                path.push(PathElement::Field(k.clone()).encode());
                walk_object(v, shape.field(k), &mut path, &mut set, 1);
                path.pop();
            }
        }
        FieldSet(set)
    }

    /// Parse a `fieldsV1` object.
    pub fn from_fields_v1(v: &Value) -> Result<FieldSet, FieldsError> {
        let mut set = BTreeSet::new();
        parse_fields_v1(v, &mut Vec::new(), &mut set, 0)?;
        Ok(FieldSet(set))
    }

    /// Render as a `fieldsV1` object.
    pub fn to_fields_v1(&self) -> Value {
        let mut root = Map::new();
        let mut iter = self.0.iter().peekable();
        while let Some(p) = iter.next() {
            // Sorted order puts descendants right after their ancestor.
            let has_children = iter.peek().is_some_and(|n| n.len() > p.len() && n.starts_with(p));
            insert_path(&mut root, p, has_children);
        }
        Value::Object(root)
    }

    pub fn union(&self, other: &FieldSet) -> FieldSet {
        FieldSet(self.0.union(&other.0).cloned().collect())
    }
    pub fn difference(&self, other: &FieldSet) -> FieldSet {
        FieldSet(self.0.difference(&other.0).cloned().collect())
    }
    pub fn intersection(&self, other: &FieldSet) -> FieldSet {
        FieldSet(self.0.intersection(&other.0).cloned().collect())
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn insert(&mut self, path: &[PathElement]) {
        self.0.insert(path.iter().map(PathElement::encode).collect());
    }
    pub fn contains(&self, path: &[PathElement]) -> bool {
        let p: Vec<String> = path.iter().map(PathElement::encode).collect();
        self.0.contains(&p)
    }
    /// All paths, decoded.
    pub fn paths(&self) -> Vec<Vec<PathElement>> {
        self.0.iter().map(|p| p.iter().filter_map(|s| PathElement::decode(s).ok()).collect()).collect()
    }
    /// All paths in human form (`.spec.replicas`), sorted.
    pub fn display_paths(&self) -> Vec<String> {
        self.0.iter().map(|p| display_path(p)).collect()
    }

    fn has_descendants(&self, p: &[String]) -> bool {
        self.0
            .range::<Vec<String>, _>((Bound::Excluded(p.to_vec()), Bound::Unbounded))
            .next()
            .is_some_and(|n| n.len() > p.len() && n.starts_with(p))
    }
}

/// Create the nodes for `segs`; `mark` adds `"."` (owned node that also has children).
fn insert_path(m: &mut Map<String, Value>, segs: &[String], mark: bool) {
    match segs.split_first() {
        None => {
            if mark {
                m.insert(".".into(), Value::Object(Map::new()));
            }
        }
        Some((seg, rest)) => {
            if let Value::Object(child) = m.entry(seg.clone()).or_insert_with(|| Value::Object(Map::new())) {
                insert_path(child, rest, mark);
            }
        }
    }
}

fn walk_object(v: &Value, shape: &Shape, path: &mut Vec<String>, set: &mut BTreeSet<Vec<String>>, depth: usize) {
    if depth > MAX_DEPTH {
        set.insert(path.clone());
        return;
    }
    match v {
        Value::Object(m) if !m.is_empty() && !shape.is_atomic_map() && *shape != Shape::Scalar => {
            for (k, c) in m {
                path.push(PathElement::Field(k.clone()).encode());
                walk_object(c, shape.field(k), path, set, depth + 1);
                path.pop();
            }
        }
        Value::Array(a) if !a.is_empty() => match shape.list_type() {
            ListType::Map(keys) => {
                for (i, e) in a.iter().enumerate() {
                    let el = match key_of(e, keys) {
                        Some(k) => PathElement::Key(k),
                        None => PathElement::Index(i),
                    };
                    path.push(el.encode());
                    set.insert(path.clone());
                    if let Value::Object(m) = e {
                        for (k, c) in m {
                            path.push(PathElement::Field(k.clone()).encode());
                            walk_object(c, shape.items().field(k), path, set, depth + 2);
                            path.pop();
                        }
                    }
                    path.pop();
                }
            }
            ListType::Set => {
                for e in a {
                    path.push(PathElement::Value(e.clone()).encode());
                    set.insert(path.clone());
                    path.pop();
                }
            }
            ListType::Atomic => {
                set.insert(path.clone());
            }
        },
        _ => {
            set.insert(path.clone());
        }
    }
}

fn parse_fields_v1(
    v: &Value,
    path: &mut Vec<String>,
    set: &mut BTreeSet<Vec<String>>,
    depth: usize,
) -> Result<(), FieldsError> {
    let here = |path: &[String]| path.join("/");
    if depth > MAX_DEPTH {
        return Err(FieldsError { path: here(path), reason: "nested too deeply".into() });
    }
    let Value::Object(m) = v else {
        return Err(FieldsError { path: here(path), reason: "expected a JSON object".into() });
    };
    if m.is_empty() && !path.is_empty() {
        set.insert(path.clone());
    }
    for (k, c) in m {
        if k == "." {
            if !path.is_empty() {
                set.insert(path.clone());
            }
            continue;
        }
        let el = PathElement::decode(k).map_err(|e| FieldsError { path: format!("{}/{}", here(path), e.path), reason: e.reason })?;
        path.push(el.encode());
        parse_fields_v1(c, path, set, depth + 1)?;
        path.pop();
    }
    Ok(())
}

/// The key-field values of a map-list element, if it is an object carrying all of them.
fn key_of(e: &Value, keys: &[String]) -> Option<Map<String, Value>> {
    let o = e.as_object()?;
    let mut out = Map::new();
    for k in keys {
        out.insert(k.clone(), o.get(k).filter(|v| !v.is_null())?.clone());
    }
    Some(out)
}

fn key_matches(e: &Value, key: &Map<String, Value>) -> bool {
    e.as_object().is_some_and(|o| key.iter().all(|(k, v)| o.get(k).is_some_and(|x| json_equal(x, v))))
}

fn lookup<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut cur = v;
    for seg in path {
        cur = match PathElement::decode(seg).ok()? {
            PathElement::Field(f) => cur.as_object()?.get(&f)?,
            PathElement::Key(k) => cur.as_array()?.iter().find(|e| key_matches(e, &k))?,
            PathElement::Value(x) => cur.as_array()?.iter().find(|e| json_equal(e, &x))?,
            PathElement::Index(i) => cur.as_array()?.get(i)?,
        };
    }
    Some(cur)
}

fn lookup_mut<'a>(v: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    let mut cur = v;
    for seg in path {
        cur = match PathElement::decode(seg).ok()? {
            PathElement::Field(f) => cur.as_object_mut()?.get_mut(&f)?,
            PathElement::Key(k) => cur.as_array_mut()?.iter_mut().find(|e| key_matches(e, &k))?,
            PathElement::Value(x) => cur.as_array_mut()?.iter_mut().find(|e| json_equal(e, &x))?,
            PathElement::Index(i) => cur.as_array_mut()?.get_mut(i)?,
        };
    }
    Some(cur)
}

/// Remove the value at `path`; returns whether something was removed.
fn remove_at(v: &mut Value, path: &[String]) -> bool {
    let Some((last, parent)) = path.split_last() else { return false };
    let Ok(el) = PathElement::decode(last) else { return false };
    match (lookup_mut(v, parent), el) {
        (Some(Value::Object(m)), PathElement::Field(f)) => m.remove(&f).is_some(),
        (Some(Value::Array(a)), PathElement::Key(k)) => {
            let n = a.len();
            a.retain(|e| !key_matches(e, &k));
            a.len() != n
        }
        (Some(Value::Array(a)), PathElement::Value(x)) => {
            let n = a.len();
            a.retain(|e| !json_equal(e, &x));
            a.len() != n
        }
        (Some(Value::Array(a)), PathElement::Index(i)) if i < a.len() => {
            a.remove(i);
            true
        }
        _ => false,
    }
}

/// Whether the value at `p` differs between `a` and `b`. Paths with descendants in `set`
/// (map-list elements) only count as changed when they appear or disappear: their
/// contents are judged through the descendant paths.
fn changed(a: &Value, b: &Value, p: &[String], set: &FieldSet) -> bool {
    match (lookup(a, p), lookup(b, p)) {
        (None, None) => false,
        (Some(_), None) | (None, Some(_)) => true,
        (Some(x), Some(y)) => !set.has_descendants(p) && !json_equal(x, y),
    }
}

// ---------------------------------------------------------------------------------------------
// managedFields entries

/// One `metadata.managedFields` entry. Entries whose fieldsV1 can't be parsed are carried
/// along untouched (`fields: None`) rather than dropped or trusted.
struct Entry {
    raw: Map<String, Value>,
    fields: Option<FieldSet>,
}

impl Entry {
    fn new(manager: &str, operation: &str, api_version: &str, now: &str, subresource: Option<&str>) -> Entry {
        let mut raw = Map::new();
        raw.insert("manager".into(), manager.into());
        raw.insert("operation".into(), operation.into());
        raw.insert("apiVersion".into(), api_version.into());
        raw.insert("time".into(), now.into());
        if let Some(s) = subresource.filter(|s| !s.is_empty()) {
            raw.insert("subresource".into(), s.into());
        }
        Entry { raw, fields: Some(FieldSet::new()) }
    }

    fn parse(v: &Value) -> Option<Entry> {
        let raw = v.as_object()?.clone();
        let fields = match raw.get("fieldsV1") {
            None | Some(Value::Null) => Some(FieldSet::new()),
            Some(f) => FieldSet::from_fields_v1(f).ok(),
        };
        Some(Entry { raw, fields })
    }

    fn str_field(&self, k: &str) -> &str {
        self.raw.get(k).and_then(Value::as_str).unwrap_or("")
    }
    fn is(&self, manager: &str, operation: &str, subresource: &str) -> bool {
        self.str_field("manager") == manager
            && self.str_field("operation") == operation
            && self.str_field("subresource") == subresource
    }
    fn touch(&mut self, api_version: &str, now: &str) {
        self.raw.insert("apiVersion".into(), api_version.into());
        self.raw.insert("time".into(), now.into());
    }
    fn is_empty(&self) -> bool {
        self.fields.as_ref().is_some_and(FieldSet::is_empty)
    }
    fn to_value(&self) -> Value {
        let mut raw = self.raw.clone();
        if let Some(f) = &self.fields {
            raw.insert("fieldsType".into(), "FieldsV1".into());
            raw.insert("fieldsV1".into(), f.to_fields_v1());
        }
        Value::Object(raw)
    }
}

fn stored_managed_fields(obj: Option<&Value>) -> Vec<Value> {
    match obj.and_then(|o| o.pointer("/metadata/managedFields")) {
        Some(Value::Array(a)) => a.clone(),
        _ => Vec::new(),
    }
}

/// The managedFields an update (non-apply) write starts from, following Kubernetes:
/// - `metadata.managedFields` absent, null or `[]` in `new`: keep the stored ones from `old`
///   (an empty list deliberately does NOT reset, so clients unaware of the field can't wipe it);
/// - exactly `[{}]` (one empty entry): reset, i.e. start from no entries;
/// - any other list: the client's entries replace the stored ones, unless they are invalid
///   (not all objects, or unparseable fieldsV1), in which case the stored ones are kept.
///
/// `record_update` calls this itself; it is public for callers that need the decision alone.
pub fn incoming_managed_fields(old: Option<&Value>, new: &Value) -> Vec<Value> {
    match new.pointer("/metadata/managedFields") {
        Some(Value::Array(a)) if a.len() == 1 && a[0].as_object().is_some_and(Map::is_empty) => Vec::new(),
        Some(Value::Array(a)) if !a.is_empty() => {
            let valid = a.iter().all(|e| {
                e.as_object().is_some_and(|o| o.get("fieldsV1").is_none_or(|f| FieldSet::from_fields_v1(f).is_ok()))
            });
            if valid { a.clone() } else { stored_managed_fields(old) }
        }
        _ => stored_managed_fields(old),
    }
}

fn write_managed_fields(obj: &mut Value, entries: &[Entry]) {
    let Value::Object(o) = obj else { return };
    let meta = o.entry("metadata").or_insert_with(|| Value::Object(Map::new()));
    let Value::Object(m) = meta else { return };
    let list: Vec<Value> = entries.iter().filter(|e| !e.is_empty()).map(Entry::to_value).collect();
    if list.is_empty() {
        m.remove("managedFields");
    } else {
        m.insert("managedFields".into(), Value::Array(list));
    }
}

// ---------------------------------------------------------------------------------------------
// Update

/// Record a non-apply write (create/update/patch) by `manager` into `new`'s
/// `metadata.managedFields`. Folds in [`incoming_managed_fields`]: the starting entries are
/// the client's (if it sent a valid non-empty list), none (if it sent `[{}]`), or `old`'s.
///
/// Fields changed from `old` to `new` (all of `new` when `old` is None) become owned by
/// `manager`'s Update entry for (`api_version`, `subresource`) and are taken from everyone
/// else; fields removed are dropped from every entry; empty entries are dropped. Existing
/// entries keep their positions; a new entry goes last.
#[allow(clippy::too_many_arguments)]
pub fn record_update(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    shape: &Shape,
    api_version: &str,
    now: &str,
    subresource: Option<&str>,
) {
    if !new.is_object() {
        return;
    }
    let sub = subresource.unwrap_or("");
    let mut entries: Vec<Entry> = incoming_managed_fields(old, new).iter().filter_map(Entry::parse).collect();

    let new_set = FieldSet::from_object(new, shape);
    let (changed_set, removed) = match old {
        Some(o) => {
            let old_set = FieldSet::from_object(o, shape);
            let changed_set = FieldSet(new_set.0.iter().filter(|p| changed(o, new, p, &new_set)).cloned().collect());
            (changed_set, old_set.difference(&new_set))
        }
        None => (new_set.clone(), FieldSet::new()),
    };
    let touched = changed_set.union(&removed);

    let mine = entries
        .iter()
        .position(|e| e.is(manager, "Update", sub) && e.str_field("apiVersion") == api_version && e.fields.is_some());
    for (i, e) in entries.iter_mut().enumerate() {
        if Some(i) == mine {
            continue;
        }
        if let Some(f) = &mut e.fields {
            *f = f.difference(&touched);
        }
    }
    match mine {
        Some(i) => {
            let e = &mut entries[i];
            if let Some(f) = &mut e.fields {
                *f = f.union(&changed_set).difference(&removed);
            }
            if !changed_set.is_empty() {
                e.touch(api_version, now);
            }
        }
        None if !changed_set.is_empty() => {
            let mut e = Entry::new(manager, "Update", api_version, now, subresource);
            e.fields = Some(changed_set);
            entries.push(e);
        }
        None => {}
    }
    write_managed_fields(new, &entries);
}

// ---------------------------------------------------------------------------------------------
// Apply

/// Another manager owns a field that the applied configuration sets to a different value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    pub manager: String,
    /// Like `.spec.replicas` or `.status.conditions[type="Ready"].status`.
    pub path: String,
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "conflict with {:?}: {}", self.manager, self.path)
    }
}

/// Fields of `metadata` that a client's applied configuration may not set.
const SERVER_META: &[&str] = &[
    "managedFields",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
];

fn without_server_meta(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(Value::Object(m)) = v.get_mut("metadata") {
        for k in SERVER_META {
            m.remove(*k);
        }
    }
    v
}

/// Drop `null` map values: a null in an applied config deletes the field, it is not owned.
fn without_nulls(v: &Value, depth: usize) -> Value {
    match v {
        Value::Object(m) if depth <= MAX_DEPTH => Value::Object(
            m.iter().filter(|(_, c)| !c.is_null()).map(|(k, c)| (k.clone(), without_nulls(c, depth + 1))).collect(),
        ),
        Value::Array(a) if depth <= MAX_DEPTH => Value::Array(a.iter().map(|c| without_nulls(c, depth + 1)).collect()),
        other => other.clone(),
    }
}

/// Merge an applied configuration into the live object: maps merge, map lists merge by key,
/// set lists union, atomic values are replaced, `null` deletes.
fn merge_applied(live: &Value, cfg: &Value, shape: &Shape, depth: usize) -> Value {
    if depth > MAX_DEPTH {
        return cfg.clone();
    }
    match cfg {
        Value::Object(c) if !shape.is_atomic_map() && *shape != Shape::Scalar => {
            let mut out = live.as_object().cloned().unwrap_or_default();
            for (k, v) in c {
                if v.is_null() {
                    out.remove(k);
                } else {
                    let merged = merge_applied(out.get(k).unwrap_or(&Value::Null), v, shape.field(k), depth + 1);
                    out.insert(k.clone(), merged);
                }
            }
            Value::Object(out)
        }
        Value::Array(items) => match shape.list_type() {
            ListType::Map(keys) => {
                let mut out = live.as_array().cloned().unwrap_or_default();
                for e in items {
                    match key_of(e, keys) {
                        Some(k) => match out.iter().position(|o| key_matches(o, &k)) {
                            Some(i) => out[i] = merge_applied(&out[i], e, shape.items(), depth + 1),
                            None => out.push(merge_applied(&Value::Null, e, shape.items(), depth + 1)),
                        },
                        // Keyless elements (invalid for a map list) are matched by value, so
                        // re-applying the same config doesn't duplicate them.
                        None if out.iter().any(|o| json_equal(o, e)) => {}
                        None => out.push(e.clone()),
                    }
                }
                Value::Array(out)
            }
            ListType::Set => {
                let mut out = live.as_array().cloned().unwrap_or_default();
                for e in items {
                    if !out.iter().any(|o| json_equal(o, e)) {
                        out.push(e.clone());
                    }
                }
                Value::Array(out)
            }
            ListType::Atomic => cfg.clone(),
        },
        _ => cfg.clone(),
    }
}

/// Server-side apply of `applied` by `manager` onto `live` (None when creating).
///
/// Returns the merged object with `metadata.managedFields` updated, or the conflicts (fields
/// owned by other managers that `applied` sets to a different value) unless `force`, in which
/// case those fields are taken from the other managers. Fields this manager applied last time
/// but no longer applies are removed unless someone else owns them. A non-object `applied` is
/// a no-op (the live object, or `{}`, is returned): callers should reject it beforehand.
#[allow(clippy::too_many_arguments)]
pub fn apply(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    shape: &Shape,
    api_version: &str,
    now: &str,
    subresource: Option<&str>,
) -> Result<Value, Vec<Conflict>> {
    if !applied.is_object() {
        return Ok(live.cloned().unwrap_or_else(|| Value::Object(Map::new())));
    }
    let sub = subresource.unwrap_or("");
    let mut entries: Vec<Entry> = stored_managed_fields(live).iter().filter_map(Entry::parse).collect();
    let config = without_server_meta(applied);
    let applied_set = FieldSet::from_object(&without_nulls(&config, 0), shape);

    let base = match live {
        Some(l) if l.is_object() => without_server_meta_managed(l),
        _ => Value::Object(Map::new()),
    };
    let mut merged = merge_applied(&base, &config, shape, 0);

    let mine = entries.iter().position(|e| e.is(manager, "Apply", sub));
    let previous = mine.and_then(|i| entries[i].fields.clone()).unwrap_or_default();

    // Conflicts: fields we set that someone else owns and whose value we change.
    // Entries of the same manager name (e.g. its own Update entry) never conflict.
    let mut conflicts = Vec::new();
    let mut taken: Vec<(usize, Vec<String>)> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        if e.str_field("manager") == manager {
            continue;
        }
        let Some(f) = &e.fields else { continue };
        for p in applied_set.intersection(f).0 {
            if changed(&base, &merged, &p, &applied_set) {
                conflicts.push(Conflict { manager: e.str_field("manager").to_string(), path: display_path(&p) });
                taken.push((i, p));
            }
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflicts);
    }
    for (i, p) in taken {
        if let Some(f) = &mut entries[i].fields {
            f.0.remove(&p);
        }
    }

    // Remove what we applied before but not now, unless another manager owns it.
    let others = entries
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != mine)
        .filter_map(|(_, e)| e.fields.as_ref())
        .fold(FieldSet::new(), |acc, f| acc.union(f));
    let keep = others.union(&applied_set);
    let to_remove = previous.difference(&applied_set).difference(&others);
    // Reverse order visits descendants before their ancestors.
    for p in to_remove.0.iter().rev() {
        if keep.has_descendants(p) || is_key_field_of_parent(p) {
            continue;
        }
        if remove_at(&mut merged, p) {
            prune_empty_parents(&mut merged, p, &keep);
        }
    }

    // Ownership: ours is exactly what we applied; drop others' paths that no longer exist.
    for e in entries.iter_mut() {
        if let Some(f) = &mut e.fields {
            f.0.retain(|p| lookup(&merged, p).is_some());
        }
    }
    match mine {
        Some(i) => {
            entries[i].fields = Some(applied_set);
            entries[i].touch(api_version, now);
        }
        None => {
            let mut e = Entry::new(manager, "Apply", api_version, now, subresource);
            e.fields = Some(applied_set);
            entries.push(e);
        }
    }
    write_managed_fields(&mut merged, &entries);
    Ok(merged)
}

fn without_server_meta_managed(live: &Value) -> Value {
    let mut v = live.clone();
    if let Some(Value::Object(m)) = v.get_mut("metadata") {
        m.remove("managedFields");
    }
    v
}

/// A key field of a map-list element (e.g. `f:type` under `k:{"type":..}`) goes away only
/// with its element, never on its own.
fn is_key_field_of_parent(p: &[String]) -> bool {
    let [.., parent, last] = p else { return false };
    match (PathElement::decode(parent), PathElement::decode(last)) {
        (Ok(PathElement::Key(k)), Ok(PathElement::Field(f))) => k.contains_key(&f),
        _ => false,
    }
}

/// After a removal, drop maps/lists left empty by it (below the top level), unless owned.
fn prune_empty_parents(obj: &mut Value, p: &[String], keep: &FieldSet) {
    for j in (2..p.len()).rev() {
        let parent = &p[..j];
        if keep.0.contains(parent) || !parent.last().is_some_and(|s| s.starts_with("f:")) {
            return;
        }
        let empty = match lookup(obj, parent) {
            Some(Value::Object(m)) => m.is_empty(),
            Some(Value::Array(a)) => a.is_empty(),
            _ => false,
        };
        if !empty || !remove_at(obj, parent) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::shape::{ListType, Shape, with_object_meta};
    use serde_json::json;

    const NOW: &str = "2024-01-01T00:00:00Z";
    const LATER: &str = "2024-01-02T00:00:00Z";

    fn shape() -> Shape {
        let cond = Shape::object([("type", Shape::Scalar), ("status", Shape::Scalar), ("reason", Shape::Scalar)]);
        with_object_meta(Shape::object([
            (
                "spec",
                Shape::object([
                    ("replicas", Shape::Scalar),
                    ("image", Shape::Scalar),
                    ("args", Shape::list(ListType::Atomic, Shape::Scalar)),
                    ("tags", Shape::list(ListType::Set, Shape::Scalar)),
                    ("selector", Shape::Object { fields: Default::default(), additional: Some(Box::new(Shape::Scalar)), map_type_atomic: true }),
                    ("extra", Shape::Any),
                ]),
            ),
            ("status", Shape::object([("conditions", Shape::list(ListType::Map(vec!["type".into()]), cond))])),
        ]))
    }

    fn obj(spec: Value) -> Value {
        json!({"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {"name": "t", "namespace": "ns"}, "spec": spec})
    }

    fn entries(o: &Value) -> Vec<Value> {
        o.pointer("/metadata/managedFields").and_then(Value::as_array).cloned().unwrap_or_default()
    }

    fn fields_of(o: &Value, manager: &str, op: &str) -> Option<Value> {
        entries(o).into_iter().find(|e| e["manager"] == manager && e["operation"] == op).map(|e| e["fieldsV1"].clone())
    }

    fn ap(live: Option<&Value>, cfg: &Value, manager: &str, force: bool) -> Result<Value, Vec<Conflict>> {
        apply(live, cfg, manager, force, &shape(), "example.com/v1", NOW, None)
    }

    // ---- FieldSet

    #[test]
    fn field_set_from_object_and_fields_v1() {
        let o = json!({
            "apiVersion": "v1", "kind": "Thing",
            "metadata": {"name": "n", "uid": "u", "labels": {"a": "1"}, "finalizers": ["f1"],
                         "ownerReferences": [{"uid": "u1", "kind": "K", "name": "o"}], "managedFields": [{}]},
            "spec": {"replicas": 1, "args": ["a", "b"], "selector": {"x": "y"}, "extra": {"e": {}, "l": [1]}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}
        });
        let fs = FieldSet::from_object(&o, &shape());
        let want = json!({
            "f:metadata": {"f:labels": {"f:a": {}}, "f:finalizers": {"v:\"f1\"": {}},
                           "f:ownerReferences": {"k:{\"uid\":\"u1\"}": {".": {}, "f:kind": {}, "f:name": {}, "f:uid": {}}}},
            "f:spec": {"f:replicas": {}, "f:args": {}, "f:selector": {}, "f:extra": {"f:e": {}, "f:l": {}}},
            "f:status": {"f:conditions": {"k:{\"type\":\"Ready\"}": {".": {}, "f:status": {}, "f:type": {}}}}
        });
        assert_eq!(fs.to_fields_v1(), want);
        assert_eq!(FieldSet::from_fields_v1(&want).unwrap(), fs);
        assert!(fs.contains(&[PathElement::Field("spec".into()), PathElement::Field("replicas".into())]));
        assert!(fs.display_paths().contains(&".status.conditions[type=\"Ready\"].status".to_string()));
    }

    #[test]
    fn field_set_ops_and_canonical_keys() {
        let a = FieldSet::from_fields_v1(&json!({"f:a": {}, "f:b": {"k:{ \"y\": 2, \"x\":1}": {}}})).unwrap();
        let b = FieldSet::from_fields_v1(&json!({"f:b": {"k:{\"x\":1,\"y\":2}": {}}, "f:c": {}})).unwrap();
        assert_eq!(a.intersection(&b).len(), 1);
        assert_eq!(a.union(&b).len(), 3);
        assert_eq!(a.difference(&b).to_fields_v1(), json!({"f:a": {}}));
        assert!(a.difference(&a).is_empty());
        assert_eq!(FieldSet::new().to_fields_v1(), json!({}));
        let mut s = FieldSet::new();
        s.insert(&[PathElement::Field("x".into()), PathElement::Index(2), PathElement::Value(json!({"b": 1, "a": [true]}))]);
        assert_eq!(s.to_fields_v1(), json!({"f:x": {"i:2": {"v:{\"a\":[true],\"b\":1}": {}}}}));
        assert_eq!(FieldSet::from_fields_v1(&s.to_fields_v1()).unwrap(), s);
        assert_eq!(s.paths()[0][1], PathElement::Index(2));
    }

    #[test]
    fn fields_v1_errors() {
        for bad in [json!([]), json!({"x:y": {}}), json!({"f:a": 1}), json!({"k:[1]": {}}), json!({"v:nope": {}}), json!({"i:-1": {}})] {
            assert!(FieldSet::from_fields_v1(&bad).is_err(), "{bad}");
        }
        let e = FieldSet::from_fields_v1(&json!({"f:spec": {"z:q": {}}})).unwrap_err();
        assert!(e.to_string().contains("f:spec"), "{e}");
    }

    // ---- apply

    #[test]
    fn apply_creates_with_ownership() {
        let out = ap(None, &obj(json!({"replicas": 3})), "alice", false).unwrap();
        assert_eq!(out["spec"], json!({"replicas": 3}));
        assert_eq!(out["metadata"]["name"], "t");
        let e = &entries(&out)[0];
        assert_eq!(e["manager"], "alice");
        assert_eq!(e["operation"], "Apply");
        assert_eq!(e["apiVersion"], "example.com/v1");
        assert_eq!(e["time"], NOW);
        assert_eq!(e["fieldsType"], "FieldsV1");
        assert_eq!(e["fieldsV1"], json!({"f:spec": {"f:replicas": {}}}));
        assert!(e.get("subresource").is_none());
    }

    #[test]
    fn apply_conflict_and_force() {
        let live = ap(None, &obj(json!({"replicas": 3, "image": "a"})), "alice", false).unwrap();
        let conflicts = ap(Some(&live), &obj(json!({"replicas": 5})), "bob", false).unwrap_err();
        assert_eq!(conflicts, vec![Conflict { manager: "alice".into(), path: ".spec.replicas".into() }]);
        assert_eq!(conflicts[0].to_string(), "conflict with \"alice\": .spec.replicas");

        let out = ap(Some(&live), &obj(json!({"replicas": 5})), "bob", true).unwrap();
        assert_eq!(out["spec"], json!({"replicas": 5, "image": "a"}));
        assert_eq!(fields_of(&out, "alice", "Apply").unwrap(), json!({"f:spec": {"f:image": {}}}));
        assert_eq!(fields_of(&out, "bob", "Apply").unwrap(), json!({"f:spec": {"f:replicas": {}}}));

        // Alice re-applying her old config now conflicts with bob.
        let c = ap(Some(&out), &obj(json!({"replicas": 3, "image": "a"})), "alice", false).unwrap_err();
        assert_eq!(c, vec![Conflict { manager: "bob".into(), path: ".spec.replicas".into() }]);
    }

    #[test]
    fn apply_same_value_shares_ownership() {
        let live = ap(None, &obj(json!({"replicas": 3, "image": "a"})), "alice", false).unwrap();
        let live = ap(Some(&live), &obj(json!({"replicas": 3})), "bob", false).unwrap();
        assert_eq!(fields_of(&live, "alice", "Apply").unwrap(), json!({"f:spec": {"f:image": {}, "f:replicas": {}}}));
        assert_eq!(fields_of(&live, "bob", "Apply").unwrap(), json!({"f:spec": {"f:replicas": {}}}));
        // Alice drops replicas: bob still owns it, so it stays.
        let live = ap(Some(&live), &obj(json!({"image": "a"})), "alice", false).unwrap();
        assert_eq!(live["spec"], json!({"replicas": 3, "image": "a"}));
        // Bob drops it too: now nobody does, so it goes.
        let bare = json!({"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {"name": "t"}});
        let live = ap(Some(&live), &bare, "bob", false).unwrap();
        assert_eq!(live["spec"], json!({"image": "a"}));
        assert!(fields_of(&live, "bob", "Apply").is_none(), "empty entries are dropped");
        // Applying an empty map owns the map itself (as Kubernetes shows `f:spec: {}`).
        let live = ap(Some(&live), &obj(json!({})), "bob", false).unwrap();
        assert_eq!(fields_of(&live, "bob", "Apply").unwrap(), json!({"f:spec": {}}));
    }

    #[test]
    fn apply_removes_dropped_fields_keeps_unowned() {
        let live = obj(json!({"untracked": 1, "extra": {"keep": true}}));
        let live1 = ap(Some(&live), &obj(json!({"replicas": 1, "extra": {"a": {"b": 1}}, "tags": ["x", "y"]})), "alice", false).unwrap();
        assert_eq!(live1["spec"], json!({"untracked": 1, "replicas": 1, "extra": {"keep": true, "a": {"b": 1}}, "tags": ["x", "y"]}));
        let live2 = ap(Some(&live1), &obj(json!({"tags": ["y"]})), "alice", false).unwrap();
        // a.b removed, and the emptied `a` map pruned; unowned fields kept.
        assert_eq!(live2["spec"], json!({"untracked": 1, "extra": {"keep": true}, "tags": ["y"]}));
        assert_eq!(fields_of(&live2, "alice", "Apply").unwrap(), json!({"f:spec": {"f:tags": {"v:\"y\"": {}}}}));
        assert_eq!(live2["metadata"]["name"], "t");
        // Re-applying the same config is a no-op apart from the entry's time.
        let live3 = apply(Some(&live2), &obj(json!({"tags": ["y"]})), "alice", false, &shape(), "example.com/v1", LATER, None).unwrap();
        assert_eq!(live3["spec"], live2["spec"]);
        assert_eq!(entries(&live3)[0]["time"], LATER);
    }

    #[test]
    fn apply_map_list_element_ownership() {
        let st = |conds: Value| json!({"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {"name": "t"}, "status": {"conditions": conds}});
        let live = ap(None, &st(json!([{"type": "Ready", "status": "True"}])), "ctrl-a", false).unwrap();
        assert_eq!(
            fields_of(&live, "ctrl-a", "Apply").unwrap(),
            json!({"f:status": {"f:conditions": {"k:{\"type\":\"Ready\"}": {".": {}, "f:status": {}, "f:type": {}}}}})
        );
        let live = ap(Some(&live), &st(json!([{"type": "Synced", "status": "False"}])), "ctrl-b", false).unwrap();
        assert_eq!(live["status"]["conditions"], json!([{"type": "Ready", "status": "True"}, {"type": "Synced", "status": "False"}]));

        // Conflict inside an element names the element by key.
        let c = ap(Some(&live), &st(json!([{"type": "Ready", "status": "False"}])), "ctrl-b", false).unwrap_err();
        assert_eq!(c, vec![Conflict { manager: "ctrl-a".into(), path: ".status.conditions[type=\"Ready\"].status".into() }]);

        // B adds a field to A's element: shared element, no conflict.
        let live = ap(Some(&live), &st(json!([{"type": "Synced", "status": "False"}, {"type": "Ready", "reason": "R"}])), "ctrl-b", false).unwrap();
        assert_eq!(live["status"]["conditions"][0], json!({"type": "Ready", "status": "True", "reason": "R"}));

        // A drops Ready: its status goes, but the element stays because B owns part of it.
        let live = ap(Some(&live), &st(json!([])), "ctrl-a", false).unwrap();
        assert_eq!(live["status"]["conditions"], json!([{"type": "Ready", "reason": "R"}, {"type": "Synced", "status": "False"}]));

        // B drops Ready: gone entirely.
        let live = ap(Some(&live), &st(json!([{"type": "Synced", "status": "False"}])), "ctrl-b", false).unwrap();
        assert_eq!(live["status"]["conditions"], json!([{"type": "Synced", "status": "False"}]));
    }

    #[test]
    fn apply_atomic_list_and_map() {
        let live = ap(None, &obj(json!({"args": ["a", "b"], "selector": {"x": "1"}})), "alice", false).unwrap();
        assert_eq!(fields_of(&live, "alice", "Apply").unwrap(), json!({"f:spec": {"f:args": {}, "f:selector": {}}}));
        let c = ap(Some(&live), &obj(json!({"args": ["a"]})), "bob", false).unwrap_err();
        assert_eq!(c[0].path, ".spec.args");
        let out = ap(Some(&live), &obj(json!({"args": ["c"], "selector": {"y": "2"}})), "bob", true).unwrap();
        assert_eq!(out["spec"], json!({"args": ["c"], "selector": {"y": "2"}}));
        assert!(fields_of(&out, "alice", "Apply").is_none());
    }

    #[test]
    fn apply_labels_finalizers_and_subresource() {
        let cfg = json!({"apiVersion": "example.com/v1", "kind": "Thing",
            "metadata": {"name": "t", "labels": {"a": "1"}, "finalizers": ["x"], "resourceVersion": "5", "managedFields": [{"manager": "evil"}]}});
        let live = ap(None, &cfg, "alice", false).unwrap();
        assert_eq!(live["metadata"]["labels"], json!({"a": "1"}));
        assert!(live["metadata"].get("resourceVersion").is_none());
        assert_eq!(entries(&live).len(), 1);
        assert_eq!(fields_of(&live, "alice", "Apply").unwrap(),
                   json!({"f:metadata": {"f:finalizers": {"v:\"x\"": {}}, "f:labels": {"f:a": {}}}}));

        let st = json!({"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {"name": "t"}, "status": {"conditions": [{"type": "A"}]}});
        let out = apply(Some(&live), &st, "alice", false, &shape(), "example.com/v1", LATER, Some("status")).unwrap();
        let es = entries(&out);
        assert_eq!(es.len(), 2, "status apply is a separate entry: {es:?}");
        assert_eq!(es[1]["subresource"], "status");
        assert_eq!(out["metadata"]["labels"], json!({"a": "1"}), "main-resource apply entry untouched");
    }

    #[test]
    fn apply_null_deletes_and_is_not_owned() {
        let live = obj(json!({"replicas": 1, "image": "x"}));
        let out = ap(Some(&live), &obj(json!({"replicas": null, "image": "y"})), "alice", false).unwrap();
        assert_eq!(out["spec"], json!({"image": "y"}));
        assert_eq!(fields_of(&out, "alice", "Apply").unwrap(), json!({"f:spec": {"f:image": {}}}));
    }

    #[test]
    fn apply_does_not_conflict_with_own_update_entry() {
        let mut live = obj(json!({"replicas": 1}));
        record_update(None, &mut live, "alice", &shape(), "example.com/v1", NOW, None);
        let out = ap(Some(&live), &obj(json!({"replicas": 2})), "alice", false).unwrap();
        assert_eq!(out["spec"]["replicas"], 2);
        let c = ap(Some(&live), &obj(json!({"replicas": 2})), "bob", false).unwrap_err();
        assert_eq!(c, vec![Conflict { manager: "alice".into(), path: ".spec.replicas".into() }]);
    }

    // ---- update

    #[test]
    fn record_update_create_and_change() {
        let s = shape();
        let mut created = obj(json!({"replicas": 1, "image": "a"}));
        record_update(None, &mut created, "kubectl", &s, "example.com/v1", NOW, None);
        assert_eq!(entries(&created).len(), 1);
        assert_eq!(fields_of(&created, "kubectl", "Update").unwrap(), json!({"f:spec": {"f:image": {}, "f:replicas": {}}}));

        // Apply by alice takes shared ownership of image (same value).
        let live = ap(Some(&created), &obj(json!({"image": "a", "tags": ["t"]})), "alice", false).unwrap();

        // A controller changes replicas and image, and removes tags.
        let mut new = live.clone();
        new["spec"]["replicas"] = json!(2);
        new["spec"]["image"] = json!("b");
        new["spec"].as_object_mut().unwrap().remove("tags");
        record_update(Some(&live), &mut new, "ctrl", &s, "example.com/v1", LATER, None);
        let es = entries(&new);
        // kubectl lost both fields and its entry is gone; alice lost image and tags and is gone too.
        assert_eq!(es.len(), 1, "{es:?}");
        assert_eq!(es[0]["manager"], "ctrl");
        assert_eq!(es[0]["fieldsV1"], json!({"f:spec": {"f:image": {}, "f:replicas": {}}}));

        // Another update by ctrl merges into its existing entry.
        let mut newer = new.clone();
        newer["spec"]["extra"] = json!({"z": 1});
        record_update(Some(&new), &mut newer, "ctrl", &s, "example.com/v1", LATER, None);
        let es = entries(&newer);
        assert_eq!(es.len(), 1);
        assert_eq!(es[0]["fieldsV1"], json!({"f:spec": {"f:extra": {"f:z": {}}, "f:image": {}, "f:replicas": {}}}));

        // A different apiVersion gets its own entry, appended (stable order).
        let mut v2 = newer.clone();
        v2["spec"]["replicas"] = json!(9);
        record_update(Some(&newer), &mut v2, "ctrl", &s, "example.com/v2", LATER, None);
        let es = entries(&v2);
        assert_eq!(es.len(), 2);
        assert_eq!(es[0]["apiVersion"], "example.com/v1");
        assert_eq!(es[1]["fieldsV1"], json!({"f:spec": {"f:replicas": {}}}));
    }

    #[test]
    fn record_update_noop_adds_nothing() {
        let s = shape();
        let live = obj(json!({"replicas": 1}));
        let mut same = live.clone();
        record_update(Some(&live), &mut same, "ctrl", &s, "v1", NOW, None);
        assert!(same["metadata"].get("managedFields").is_none());
    }

    #[test]
    fn incoming_managed_fields_rules() {
        let s = shape();
        let stored = vec![json!({"manager": "a", "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1",
                                 "fieldsV1": {"f:spec": {"f:replicas": {}}}})];
        let mut old = obj(json!({"replicas": 1, "image": "i"}));
        old["metadata"]["managedFields"] = json!(stored);

        // Absent, null and [] keep the stored ones.
        for sent in [None, Some(json!(null)), Some(json!([]))] {
            let mut new = obj(json!({"replicas": 1, "image": "i"}));
            if let Some(v) = sent.clone() {
                new["metadata"]["managedFields"] = v;
            }
            assert_eq!(incoming_managed_fields(Some(&old), &new), stored, "{sent:?}");
            record_update(Some(&old), &mut new, "x", &s, "v1", NOW, None);
            assert_eq!(entries(&new), stored);
        }

        // [{}] resets; the writer then owns what it changed in the same request.
        let mut new = obj(json!({"replicas": 1, "image": "j"}));
        new["metadata"]["managedFields"] = json!([{}]);
        assert!(incoming_managed_fields(Some(&old), &new).is_empty());
        record_update(Some(&old), &mut new, "x", &s, "v1", NOW, None);
        let es = entries(&new);
        assert_eq!(es.len(), 1);
        assert_eq!(es[0]["manager"], "x");
        assert_eq!(es[0]["fieldsV1"], json!({"f:spec": {"f:image": {}}}));

        // A client-supplied list replaces the stored one.
        let mine = vec![json!({"manager": "b", "operation": "Apply", "apiVersion": "v1", "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:spec": {"f:image": {}}}})];
        let mut new = obj(json!({"replicas": 1, "image": "i"}));
        new["metadata"]["managedFields"] = json!(mine);
        record_update(Some(&old), &mut new, "x", &s, "v1", NOW, None);
        assert_eq!(entries(&new), mine);

        // An invalid list is ignored in favour of the stored one.
        let mut new = obj(json!({"replicas": 1, "image": "i"}));
        new["metadata"]["managedFields"] = json!([{"manager": "b", "fieldsV1": {"bogus": {}}}]);
        assert_eq!(incoming_managed_fields(Some(&old), &new), stored);
        new["metadata"]["managedFields"] = json!([1, 2]);
        assert_eq!(incoming_managed_fields(Some(&old), &new), stored);
    }

    fn deep(n: usize) -> Value {
        let mut v = json!(1);
        for _ in 0..n {
            v = json!({"a": v, "l": [1]});
        }
        v
    }

    #[test]
    fn nothing_panics_on_odd_input() {
        let odd = vec![
            json!(null), json!(1), json!("s"), json!([]), json!([1, {"a": null}]), json!({}),
            json!({"metadata": 5}), json!({"metadata": {"managedFields": 5}}),
            json!({"metadata": {"managedFields": [5, {"fieldsV1": 3}, {"fieldsV1": {"f:x": {}}, "manager": 7}]}}),
            json!({"metadata": {"managedFields": [{"manager": "m", "operation": "Apply", "fieldsV1": {"f:spec": {"f:replicas": {}, "k:{\"a\":1}": {}, "v:3": {}, "i:9": {}}}}]}, "spec": {"replicas": [1]}}),
            json!({"spec": {"tags": {"a": 1}, "args": {"x": 1}, "selector": [1]}}),
            json!({"spec": [1, 2]}), json!({"status": {"conditions": [1, null, {"type": null}, {"status": "x"}, []]}}),
            json!({"status": {"conditions": {"type": "x"}}}), json!({"spec": {"extra": deep(300)}}),
            obj(json!({"replicas": 3})),
        ];
        let s = shape();
        for a in &odd {
            let _ = FieldSet::from_object(a, &s);
            let _ = FieldSet::from_object(a, &Shape::Any);
            let _ = FieldSet::from_fields_v1(a);
            for b in &odd {
                let _ = apply(Some(a), b, "m", false, &s, "v1", NOW, None);
                let _ = apply(Some(a), b, "x", true, &s, "v1", NOW, Some("status"));
                let _ = apply(None, b, "m", false, &Shape::Scalar, "v1", NOW, None);
                let mut n = b.clone();
                record_update(Some(a), &mut n, "m", &s, "v1", NOW, None);
                let mut n = b.clone();
                record_update(None, &mut n, "m", &Shape::Any, "v1", NOW, None);
                let _ = incoming_managed_fields(Some(a), b);
            }
        }
    }
}
