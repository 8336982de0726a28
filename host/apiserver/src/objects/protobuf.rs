//! Decoding of Kubernetes protobuf request bodies for the built-in types that
//! kubectl's typed commands send that way (`kubectl create namespace|secret|configmap`).
//!
//! Only decoding, and only the fields those types have: responses are always
//! JSON (clients list `application/json` as an accepted fallback). A body this
//! decoder cannot read is a 400, never a panic.

use serde_json::{json, Map, Value};

/// Content type of Kubernetes protobuf.
pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";
const MAGIC: &[u8] = b"k8s\0";

/// A wire-format field: (number, value).
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, String> {
        let mut v: u64 = 0;
        for i in 0..10 {
            let (&b, rest) = self.buf.split_first().ok_or("truncated varint")?;
            self.buf = rest;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("varint too long".into())
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.buf.len() {
            return Err("truncated field".into());
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Ok(a)
    }

    fn next(&mut self) -> Result<Option<(u64, Field<'a>)>, String> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let field = match key & 7 {
            0 => Field::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Field::Fixed
            }
            2 => {
                let n = usize::try_from(self.varint()?).map_err(|_| "length overflow")?;
                Field::Bytes(self.take(n)?)
            }
            5 => {
                self.take(4)?;
                Field::Fixed
            }
            w => return Err(format!("unsupported wire type {w}")),
        };
        Ok(Some((key >> 3, field)))
    }
}

fn fields(buf: &[u8]) -> Result<Vec<(u64, Field<'_>)>, String> {
    let mut r = Reader { buf };
    let mut out = Vec::new();
    while let Some(f) = r.next()? {
        out.push(f);
    }
    Ok(out)
}

fn string(b: &[u8]) -> Result<String, String> {
    String::from_utf8(b.to_vec()).map_err(|_| "invalid UTF-8 in a string field".to_string())
}

fn b64(b: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// One `map<string, string|bytes>` entry.
fn map_entry(b: &[u8], bytes_value: bool) -> Result<(String, Value), String> {
    let (mut k, mut v) = (String::new(), Value::String(String::new()));
    for (n, f) in fields(b)? {
        if let Field::Bytes(x) = f {
            match n {
                1 => k = string(x)?,
                2 => v = Value::String(if bytes_value { b64(x) } else { string(x)? }),
                _ => {}
            }
        }
    }
    Ok((k, v))
}

fn time(b: &[u8]) -> Result<Value, String> {
    let mut secs = 0i64;
    for (n, f) in fields(b)? {
        if let (1, Field::Varint(v)) = (n, f) {
            secs = v as i64;
        }
    }
    Ok(chrono::DateTime::from_timestamp(secs, 0)
        .map(|t| Value::String(t.format("%Y-%m-%dT%H:%M:%SZ").to_string()))
        .unwrap_or(Value::Null))
}

fn object_meta(b: &[u8]) -> Result<Value, String> {
    let mut m = Map::new();
    let mut labels = Map::new();
    let mut annotations = Map::new();
    let mut finalizers = Vec::new();
    let mut owners = Vec::new();
    for (n, f) in fields(b)? {
        match (n, f) {
            (1, Field::Bytes(x)) => drop(m.insert("name".into(), string(x)?.into())),
            (2, Field::Bytes(x)) => drop(m.insert("generateName".into(), string(x)?.into())),
            (3, Field::Bytes(x)) => drop(m.insert("namespace".into(), string(x)?.into())),
            (5, Field::Bytes(x)) => drop(m.insert("uid".into(), string(x)?.into())),
            (6, Field::Bytes(x)) => drop(m.insert("resourceVersion".into(), string(x)?.into())),
            (8, Field::Bytes(x)) => drop(m.insert("creationTimestamp".into(), time(x)?)),
            (11, Field::Bytes(x)) => {
                let (k, v) = map_entry(x, false)?;
                labels.insert(k, v);
            }
            (12, Field::Bytes(x)) => {
                let (k, v) = map_entry(x, false)?;
                annotations.insert(k, v);
            }
            (13, Field::Bytes(x)) => owners.push(owner_reference(x)?),
            (14, Field::Bytes(x)) => finalizers.push(Value::String(string(x)?)),
            _ => {}
        }
    }
    if !labels.is_empty() {
        m.insert("labels".into(), Value::Object(labels));
    }
    if !annotations.is_empty() {
        m.insert("annotations".into(), Value::Object(annotations));
    }
    if !finalizers.is_empty() {
        m.insert("finalizers".into(), Value::Array(finalizers));
    }
    if !owners.is_empty() {
        m.insert("ownerReferences".into(), Value::Array(owners));
    }
    Ok(Value::Object(m))
}

fn owner_reference(b: &[u8]) -> Result<Value, String> {
    let mut o = Map::new();
    for (n, f) in fields(b)? {
        match (n, f) {
            (1, Field::Bytes(x)) => drop(o.insert("kind".into(), string(x)?.into())),
            (3, Field::Bytes(x)) => drop(o.insert("name".into(), string(x)?.into())),
            (4, Field::Bytes(x)) => drop(o.insert("uid".into(), string(x)?.into())),
            (5, Field::Bytes(x)) => drop(o.insert("apiVersion".into(), string(x)?.into())),
            (6, Field::Varint(v)) => drop(o.insert("controller".into(), (v != 0).into())),
            (7, Field::Varint(v)) => drop(o.insert("blockOwnerDeletion".into(), (v != 0).into())),
            _ => {}
        }
    }
    Ok(Value::Object(o))
}

fn strings(b: &[u8], field: u64) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    for (n, f) in fields(b)? {
        if let (true, Field::Bytes(x)) = (n == field, f) {
            out.push(Value::String(string(x)?));
        }
    }
    Ok(out)
}

/// Decode a protobuf body of `kind` (`v1` Namespace, Secret or ConfigMap) into JSON.
pub fn decode(body: &[u8]) -> Result<Value, String> {
    let rest = body.strip_prefix(MAGIC).ok_or("protobuf body lacks the k8s envelope")?;
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), &[][..]);
    for (n, f) in fields(rest)? {
        match (n, f) {
            (1, Field::Bytes(tm)) => {
                for (n, f) in fields(tm)? {
                    match (n, f) {
                        (1, Field::Bytes(x)) => api_version = string(x)?,
                        (2, Field::Bytes(x)) => kind = string(x)?,
                        _ => {}
                    }
                }
            }
            (2, Field::Bytes(x)) => raw = x,
            _ => {}
        }
    }
    let mut obj = json!({"apiVersion": api_version, "kind": kind});
    let mut data = Map::new();
    let mut binary = Map::new();
    let mut string_data = Map::new();
    for (n, f) in fields(raw)? {
        match (kind.as_str(), n, f) {
            (_, 1, Field::Bytes(x)) => obj["metadata"] = object_meta(x)?,
            ("Namespace", 2, Field::Bytes(x)) => obj["spec"] = json!({"finalizers": strings(x, 1)?}),
            ("ConfigMap", 2, Field::Bytes(x)) => drop(data.insert_entry(map_entry(x, false)?)),
            ("ConfigMap", 3, Field::Bytes(x)) => drop(binary.insert_entry(map_entry(x, true)?)),
            ("ConfigMap", 4, Field::Varint(v)) | ("Secret", 5, Field::Varint(v)) => obj["immutable"] = (v != 0).into(),
            ("Secret", 2, Field::Bytes(x)) => drop(data.insert_entry(map_entry(x, true)?)),
            ("Secret", 3, Field::Bytes(x)) => obj["type"] = string(x)?.into(),
            ("Secret", 4, Field::Bytes(x)) => drop(string_data.insert_entry(map_entry(x, false)?)),
            ("Namespace" | "ConfigMap" | "Secret", _, _) => {}
            (other, _, _) => return Err(format!("protobuf bodies of kind {other:?} are not supported; send JSON")),
        }
    }
    for (k, m) in [("data", data), ("binaryData", binary), ("stringData", string_data)] {
        if !m.is_empty() {
            obj[k] = Value::Object(m);
        }
    }
    Ok(obj)
}

trait InsertEntry {
    fn insert_entry(&mut self, e: (String, Value)) -> Option<Value>;
}

impl InsertEntry for Map<String, Value> {
    fn insert_entry(&mut self, (k, v): (String, Value)) -> Option<Value> {
        self.insert(k, v)
    }
}

#[cfg(test)]
mod tests {
    use super::decode;

    fn field(n: u8, bytes: &[u8]) -> Vec<u8> {
        let mut v = vec![(n << 3) | 2, bytes.len() as u8];
        v.extend_from_slice(bytes);
        v
    }

    #[test]
    fn decodes_a_secret() {
        let meta = field(1, b"s1");
        let entry = [field(1, b"k"), field(2, b"\x00\xff")].concat();
        let raw = [field(1, &meta), field(2, &entry), field(3, b"Opaque")].concat();
        let tm = [field(1, b"v1"), field(2, b"Secret")].concat();
        let body = [b"k8s\0".to_vec(), field(1, &tm), field(2, &raw)].concat();
        let v = decode(&body).unwrap();
        assert_eq!(v["metadata"]["name"], "s1");
        assert_eq!(v["data"]["k"], "AP8=");
        assert_eq!(v["type"], "Opaque");
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for body in [&b""[..], b"k8s", b"k8s\0\x0a\xff", b"k8s\0\x0a\x05ab", b"k8s\0\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"] {
            let _ = decode(body);
        }
        assert!(decode(b"{}").is_err());
    }
}
