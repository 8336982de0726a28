//! A stored object: its JSON text exactly as served, and an index of the few
//! fields the server reads without parsing it.
//!
//! Objects are kept as text, not as parsed `serde_json::Value` trees: a tree costs
//! about four times its text, and most reads (GET, LIST, WATCH events) only need to
//! write the text out. Writes parse the current object, as they change it anyway.
//!
//! The resourceVersion is inside the text. An object is encoded once, before the
//! store takes its lock, with an empty resourceVersion whose position is noted
//! ([`Draft`]); the store's commit then writes the version it assigns into that
//! place ([`Draft::stamp`]) — a copy of the bytes, not a second serialization.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};

/// A stored object; cloning shares it.
#[derive(Clone)]
pub struct Object(Arc<Stored>);

struct Stored {
    json: Box<[u8]>,
    rv: u64,
    /// Where the resourceVersion's digits start in `json` (just inside its quotes).
    rv_at: usize,
    index: Index,
}

/// What the store, selectors, watches and the garbage collector read without parsing.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Index {
    api_version: Box<str>,
    kind: Box<str>,
    namespace: Box<str>,
    name: Box<str>,
    uid: Box<str>,
    /// Sorted by key. A value that is not a string is kept as its JSON text, as
    /// label selectors compare it.
    labels: Box<[(Box<str>, Box<str>)]>,
    /// UIDs of `metadata.ownerReferences`.
    owners: Box<[Box<str>]>,
    /// `metadata.deletionTimestamp` is set.
    deleting: bool,
}

/// An object encoded for storage, waiting for its resourceVersion.
pub struct Draft {
    /// The object's JSON with `"resourceVersion":""`.
    json: Vec<u8>,
    /// Between the quotes of that empty resourceVersion.
    rv_at: usize,
    index: Index,
}

impl Draft {
    /// Encode `obj`, which must be a JSON object (every stored object is). Any
    /// resourceVersion it carries is replaced when the draft is stamped.
    pub fn new(mut obj: Value) -> Draft {
        let top = obj.as_object_mut().expect("stored objects are JSON objects");
        if !top.get("metadata").is_some_and(Value::is_object) {
            top.insert("metadata".into(), Value::Object(Map::new()));
        }
        if let Some(Value::Object(m)) = top.get_mut("metadata") {
            m.insert("resourceVersion".into(), Value::String(String::new()));
        }
        let index = Index::of(top);
        let (json, rv_at) = encode(top);
        Draft { json, rv_at, index }
    }

    /// The object as committed at `rv`.
    pub fn stamp(self, rv: u64) -> Object {
        let json = splice(&self.json, self.rv_at, 0, rv);
        Object(Arc::new(Stored { json, rv, rv_at: self.rv_at, index: self.index }))
    }
}

impl Object {
    /// An object from JSON stored earlier (loading a data directory).
    pub fn load(json: &[u8]) -> serde_json::Result<Object> {
        let value: Value = serde_json::from_slice(json)?;
        if !value.is_object() {
            return Err(serde::de::Error::custom("a stored object must be a JSON object"));
        }
        let rv = value.pointer("/metadata/resourceVersion").and_then(Value::as_str).and_then(|s| s.parse().ok()).unwrap_or(0);
        Ok(Draft::new(value).stamp(rv))
    }

    /// The same object at another resourceVersion (its deletion's).
    pub fn restamp(&self, rv: u64) -> Object {
        let s = &self.0;
        let json = splice(&s.json, s.rv_at, digits(s.rv), rv);
        Object(Arc::new(Stored { json, rv, rv_at: s.rv_at, index: s.index.clone() }))
    }

    /// The JSON text, as stored and served.
    pub fn json(&self) -> &[u8] {
        &self.0.json
    }

    /// The JSON text as a buffer sharing this object's (no copy).
    pub fn bytes(&self) -> Bytes {
        Bytes::from_owner(self.clone())
    }

    /// The parsed object, for the readers that need more than the index.
    pub fn value(&self) -> Value {
        serde_json::from_slice(&self.0.json).expect("the store's own JSON parses")
    }

    pub fn rv(&self) -> u64 {
        self.0.rv
    }
    pub fn api_version(&self) -> &str {
        &self.0.index.api_version
    }
    pub fn kind(&self) -> &str {
        &self.0.index.kind
    }
    pub fn namespace(&self) -> &str {
        &self.0.index.namespace
    }
    pub fn name(&self) -> &str {
        &self.0.index.name
    }
    pub fn uid(&self) -> &str {
        &self.0.index.uid
    }
    pub fn is_deleting(&self) -> bool {
        self.0.index.deleting
    }
    pub fn owner_uids(&self) -> impl Iterator<Item = &str> {
        self.0.index.owners.iter().map(|u| &**u)
    }

    /// One label's value.
    pub fn label(&self, key: &str) -> Option<&str> {
        let labels = &self.0.index.labels;
        labels.binary_search_by(|(k, _)| (**k).cmp(key)).ok().map(|i| &*labels[i].1)
    }

    /// The value at a path of object keys (`["spec", "nodeName"]`), read from the
    /// text without building the rest of the tree.
    pub fn pointer(&self, path: &[&str]) -> Option<Value> {
        let mut de = serde_json::Deserializer::from_slice(&self.0.json);
        Pick(path).deserialize(&mut de).ok().flatten()
    }
}

impl AsRef<[u8]> for Object {
    fn as_ref(&self) -> &[u8] {
        self.json()
    }
}

impl fmt::Debug for Object {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Object({}/{}@{})", self.namespace(), self.name(), self.rv())
    }
}

impl Index {
    fn of(top: &Map<String, Value>) -> Index {
        let meta = top.get("metadata").and_then(Value::as_object);
        let field = |k: &str| -> Box<str> { meta.and_then(|m| m.get(k)).and_then(Value::as_str).unwrap_or("").into() };
        let top_str = |k: &str| -> Box<str> { top.get(k).and_then(Value::as_str).unwrap_or("").into() };
        let mut labels: Vec<(Box<str>, Box<str>)> = meta
            .and_then(|m| m.get("labels"))
            .and_then(Value::as_object)
            .map(|l| l.iter().map(|(k, v)| (k.as_str().into(), v.as_str().map_or_else(|| v.to_string().into(), Into::into))).collect())
            .unwrap_or_default();
        labels.sort();
        let owners = meta
            .and_then(|m| m.get("ownerReferences"))
            .and_then(Value::as_array)
            .map(|refs| refs.iter().filter_map(|r| r.get("uid").and_then(Value::as_str)).map(Into::into).collect())
            .unwrap_or_default();
        Index {
            api_version: top_str("apiVersion"),
            kind: top_str("kind"),
            namespace: field("namespace"),
            name: field("name"),
            uid: field("uid"),
            labels: labels.into(),
            owners,
            deleting: meta.and_then(|m| m.get("deletionTimestamp")).is_some_and(Value::is_string),
        }
    }
}

/// Serialize as `serde_json::to_vec` does, noting where the (empty) string value of
/// `metadata.resourceVersion` starts.
fn encode(top: &Map<String, Value>) -> (Vec<u8>, usize) {
    fn put(out: &mut Vec<u8>, v: &impl serde::Serialize) {
        serde_json::to_writer(out, v).expect("JSON values serialize");
    }
    let mut out = Vec::with_capacity(1024);
    let mut rv_at = 0;
    out.push(b'{');
    for (i, (k, v)) in top.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        put(&mut out, k);
        out.push(b':');
        match v {
            Value::Object(meta) if k == "metadata" => {
                out.push(b'{');
                for (j, (mk, mv)) in meta.iter().enumerate() {
                    if j > 0 {
                        out.push(b',');
                    }
                    put(&mut out, mk);
                    out.push(b':');
                    if mk == "resourceVersion" {
                        out.push(b'"');
                        rv_at = out.len();
                        out.push(b'"');
                    } else {
                        put(&mut out, mv);
                    }
                }
                out.push(b'}');
            }
            _ => put(&mut out, v),
        }
    }
    out.push(b'}');
    (out, rv_at)
}

/// Decimal digits of a resourceVersion as written.
fn digits(rv: u64) -> usize {
    rv.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// `json` with the `old_len` bytes at `at` replaced by `rv`'s digits, in one exact allocation.
fn splice(json: &[u8], at: usize, old_len: usize, rv: u64) -> Box<[u8]> {
    let rv = rv.to_string();
    let mut out = Vec::with_capacity(json.len() - old_len + rv.len());
    out.extend_from_slice(&json[..at]);
    out.extend_from_slice(rv.as_bytes());
    out.extend_from_slice(&json[at + old_len..]);
    out.into_boxed_slice()
}

/// Deserializes only the value at a path of object keys, skipping everything else.
struct Pick<'p>(&'p [&'p str]);

impl<'de> DeserializeSeed<'de> for Pick<'_> {
    type Value = Option<Value>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<Value>, D::Error> {
        match self.0.split_first() {
            None => Value::deserialize(d).map(Some),
            Some((key, rest)) => d.deserialize_any(PickIn { key, rest }),
        }
    }
}

/// Looks for `key` in a map and picks `rest` under it; anything but a map has no keys.
struct PickIn<'p> {
    key: &'p str,
    rest: &'p [&'p str],
}

impl<'de> Visitor<'de> for PickIn<'_> {
    type Value = Option<Value>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<Value>, A::Error> {
        let mut found = None;
        while let Some(hit) = map.next_key_seed(KeyIs(self.key))? {
            if hit && found.is_none() {
                found = map.next_value_seed(Pick(self.rest))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Option<Value>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Option<Value>, E> {
        Ok(None)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Option<Value>, E> {
        Ok(None)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Option<Value>, E> {
        Ok(None)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Option<Value>, E> {
        Ok(None)
    }
    fn visit_str<E>(self, _: &str) -> Result<Option<Value>, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Option<Value>, E> {
        Ok(None)
    }
}

/// Is this map key the one sought? (Compares without allocating.)
struct KeyIs<'p>(&'p str);

impl<'de> DeserializeSeed<'de> for KeyIs<'_> {
    type Value = bool;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyIs<'_> {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a map key")
    }
    fn visit_str<E>(self, v: &str) -> Result<bool, E> {
        Ok(v == self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vm() -> Value {
        json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
            "metadata": {"name": "web-1", "namespace": "prod", "uid": "u-1", "resourceVersion": "7",
                "labels": {"app": "web", "tier": "front", "a\"quote": "x"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "o", "uid": "owner-1"}],
                "annotations": {"note": "resourceVersion \"1\" ü \u{1F600}"}},
            "spec": {"cpus": 2, "ratio": 0.5, "big": 18446744073709551615u64, "neg": -3, "disks": [{"name": "root"}], "nodeName": null},
            "status": {"phase": "Running"}
        })
    }

    #[test]
    fn stamped_text_is_what_serde_json_writes_with_that_version() {
        for rv in [1, 9, 10, 12345, u64::MAX] {
            let obj = Draft::new(vm()).stamp(rv);
            let mut expected = vm();
            expected["metadata"]["resourceVersion"] = json!(rv.to_string());
            assert_eq!(obj.json(), serde_json::to_vec(&expected).unwrap().as_slice(), "rv {rv}");
            assert_eq!(obj.value(), expected);
            assert_eq!(obj.rv(), rv);
        }
    }

    #[test]
    fn an_object_without_metadata_gets_a_resource_version() {
        let obj = Draft::new(json!({"kind": "X"})).stamp(3);
        assert_eq!(obj.value(), json!({"kind": "X", "metadata": {"resourceVersion": "3"}}));
    }

    #[test]
    fn restamping_changes_only_the_resource_version() {
        let obj = Draft::new(vm()).stamp(99);
        let later = obj.restamp(100);
        let mut expected = vm();
        expected["metadata"]["resourceVersion"] = json!("100");
        assert_eq!(later.json(), serde_json::to_vec(&expected).unwrap().as_slice());
        assert_eq!(later.rv(), 100);
        assert_eq!(later.restamp(5).value()["metadata"]["resourceVersion"], "5");
        assert_eq!(later.name(), "web-1");
    }

    #[test]
    fn loading_stored_text_round_trips_byte_for_byte() {
        let obj = Draft::new(vm()).stamp(42);
        let loaded = Object::load(obj.json()).unwrap();
        assert_eq!(loaded.json(), obj.json());
        assert_eq!(loaded.rv(), 42);
        assert_eq!(loaded.0.index, obj.0.index);
        assert_eq!(&obj.bytes()[..], obj.json());
        assert!(Object::load(b"[1]").is_err());
        assert!(Object::load(b"{").is_err());
    }

    #[test]
    fn the_index_holds_what_readers_ask_for() {
        let obj = Draft::new(vm()).stamp(2);
        assert_eq!((obj.api_version(), obj.kind()), ("banlieue.io/v1alpha1", "VirtualMachine"));
        assert_eq!((obj.namespace(), obj.name(), obj.uid()), ("prod", "web-1", "u-1"));
        assert_eq!(obj.label("app"), Some("web"));
        assert_eq!(obj.label("a\"quote"), Some("x"));
        assert_eq!(obj.label("zone"), None);
        assert_eq!(obj.owner_uids().collect::<Vec<_>>(), ["owner-1"]);
        assert!(!obj.is_deleting());
        let mut deleting = vm();
        deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        assert!(Draft::new(deleting).stamp(3).is_deleting());
    }

    #[test]
    fn pointer_reads_one_value_from_the_text() {
        let obj = Draft::new(vm()).stamp(2);
        assert_eq!(obj.pointer(&["status", "phase"]), Some(json!("Running")));
        assert_eq!(obj.pointer(&["spec", "disks"]), Some(json!([{"name": "root"}])));
        assert_eq!(obj.pointer(&["spec", "big"]), Some(json!(18446744073709551615u64)));
        assert_eq!(obj.pointer(&["spec", "nodeName"]), Some(Value::Null));
        assert_eq!(obj.pointer(&["spec", "missing"]), None);
        assert_eq!(obj.pointer(&["spec", "cpus", "deeper"]), None);
        assert_eq!(obj.pointer(&["spec", "disks", "0"]), None);
        assert_eq!(obj.pointer(&["metadata", "labels", "a\"quote"]), Some(json!("x")));
        assert_eq!(obj.pointer(&[]), Some(obj.value()));
    }
}
