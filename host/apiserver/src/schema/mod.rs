//! CRD structural schemas (apiextensions.k8s.io/v1 `openAPIV3Schema`):
//! structural checks for the CRD itself, defaulting, pruning and validation
//! of custom objects.
//!
//! Everything works directly on `serde_json::Value` so the schema never has
//! to be converted into a typed model; a malformed schema node is simply
//! ignored by `default`/`prune`/`validate` (it is `check_structural`'s job to
//! refuse it up front). No function in this module panics on any input.

pub mod jsonpath;
pub(crate) mod openapi;
pub(crate) mod registry;
pub mod shape;
pub(crate) mod table;

mod defaulting;
mod formats;
mod pruning;
mod structural;
#[cfg(test)]
mod tests;
mod validation;

pub use defaulting::default;
pub use pruning::prune;
pub use structural::check_structural;
pub use validation::{validate, validate_value};
use formats::*;

use regex::{Regex, RegexBuilder};
use serde_json::{Map, Value};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

/// Deepest schema/object nesting we walk. Real CRDs are far shallower; the cap
/// keeps hostile input from exhausting the stack.
pub const MAX_DEPTH: usize = 64;
/// Maximum number of errors collected by one `validate`/`check_structural`.
pub const MAX_ERRORS: usize = 100;

/// Kubernetes `field.ErrorType` equivalents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldErrorKind {
    Required,
    Invalid,
    /// Value not in an enum ("Unsupported value").
    Unsupported,
    TooLong,
    TooMany,
    /// Wrong JSON type; rendered as "Invalid value" like Kubernetes does.
    TypeInvalid,
    Duplicate,
    Forbidden,
    Internal,
}

impl FieldErrorKind {
    /// The human text Kubernetes prints for the error type.
    pub fn as_str(self) -> &'static str {
        match self {
            FieldErrorKind::Required => "Required value",
            FieldErrorKind::Invalid | FieldErrorKind::TypeInvalid => "Invalid value",
            FieldErrorKind::Unsupported => "Unsupported value",
            FieldErrorKind::TooLong => "Too long",
            FieldErrorKind::TooMany => "Too many",
            FieldErrorKind::Duplicate => "Duplicate value",
            FieldErrorKind::Forbidden => "Forbidden",
            FieldErrorKind::Internal => "Internal error",
        }
    }
}

/// One validation failure. `message` is the complete Kubernetes-style line,
/// e.g. `spec.cpus: Invalid value: 0: spec.cpus in body should be greater than or equal to 1`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct FieldError {
    pub field: String,
    pub kind: FieldErrorKind,
    pub message: String,
}

impl FieldError {
    /// Builds the message the way `field.Error.Error()` does: Required,
    /// Forbidden, TooLong and Internal never print the bad value.
    pub fn new(field: &str, kind: FieldErrorKind, bad: Option<String>, detail: &str) -> Self {
        let mut body = kind.as_str().to_string();
        let shows_value = !matches!(
            kind,
            FieldErrorKind::Required
                | FieldErrorKind::Forbidden
                | FieldErrorKind::TooLong
                | FieldErrorKind::Internal
        );
        if let (true, Some(b)) = (shows_value, bad) {
            body.push_str(": ");
            body.push_str(&b);
        }
        if !detail.is_empty() {
            body.push_str(": ");
            body.push_str(detail);
        }
        let message = if field.is_empty() {
            body
        } else {
            format!("{field}: {body}")
        };
        FieldError {
            field: field.to_string(),
            kind,
            message,
        }
    }
}

/// `Kind.group "name" is invalid: [e1, e2]` (no brackets for a single error),
/// matching the apiserver's StatusReasonInvalid message.
pub fn status_message(errs: &[FieldError], kind: &str, name: &str) -> String {
    let head = format!("{kind} {} is invalid", quote(name));
    match errs.len() {
        0 => head,
        1 => format!("{head}: {}", errs[0].message),
        _ => {
            let parts: Vec<&str> = errs.iter().map(|e| e.message.as_str()).collect();
            format!("{head}: [{}]", parts.join(", "))
        }
    }
}

// ---------------------------------------------------------------------------
// small helpers shared by all passes
// ---------------------------------------------------------------------------

fn quote(s: &str) -> String {
    // JSON string escaping is close enough to Go's %q for messages.
    Value::String(s.to_string()).to_string()
}

/// Renders a value for an error message: strings quoted, numbers without a
/// spurious ".0", composites as compact JSON.
fn fmt_value(v: &Value) -> String {
    match v {
        Value::Number(n) => fmt_number(n),
        Value::String(s) => quote(s),
        other => other.to_string(),
    }
}

fn fmt_number(n: &serde_json::Number) -> String {
    if n.is_f64()
        && let Some(f) = n.as_f64()
        && f.fract() == 0.0
        && f.abs() < 1e15
    {
        return format!("{}", f as i64);
    }
    n.to_string()
}

fn child(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn index(path: &str, i: usize) -> String {
    format!("{path}[{i}]")
}

fn map_key(path: &str, key: &str) -> String {
    format!("{path}[{key}]")
}

fn flag(s: &Map<String, Value>, key: &str) -> bool {
    matches!(s.get(key), Some(Value::Bool(true)))
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) if is_integer(v) => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Integer in the JSON sense: any number without a fractional part (a
/// decoder may hand us `1.0` as a float).
fn is_integer(v: &Value) -> bool {
    match v {
        Value::Number(n) => {
            n.is_i64()
                || n.is_u64()
                || n.as_f64()
                    .is_some_and(|f| f.is_finite() && f.fract() == 0.0)
        }
        _ => false,
    }
}

fn type_matches(ty: &str, v: &Value) -> bool {
    match ty {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "integer" => is_integer(v),
        "number" => v.is_number(),
        _ => true, // unknown types are refused by check_structural
    }
}

/// JSON equality where 1 == 1.0 (serde_json's `==` distinguishes them).
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(i), Some(j)) => i == j,
            _ => match (x.as_u64(), y.as_u64()) {
                (Some(i), Some(j)) => i == j,
                _ => x.as_f64() == y.as_f64(),
            },
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| json_eq(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

/// Canonical text of a value for duplicate detection via hashing: numbers
/// normalised (1 and 1.0 collide), object keys sorted regardless of the
/// serde_json `preserve_order` feature.
fn canon(v: &Value, out: &mut String, depth: usize) {
    if depth > MAX_DEPTH {
        out.push('…');
        return;
    }
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => {
                out.push_str(&format!("{}", f as i64))
            }
            _ => out.push_str(&n.to_string()),
        },
        Value::Array(a) => {
            out.push('[');
            for e in a {
                canon(e, out, depth + 1);
                out.push(',');
            }
            out.push(']');
        }
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for k in keys {
                out.push_str(&quote(k));
                out.push(':');
                canon(&m[k], out, depth + 1);
                out.push(',');
            }
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

fn canon_string(v: &Value) -> String {
    let mut s = String::new();
    canon(v, &mut s, 0);
    s
}

thread_local! {
    // Patterns are compiled once per thread; a CRD's patterns are few, the
    // cap only guards against unbounded growth with many distinct schemas.
    static RE_CACHE: RefCell<HashMap<String, Result<Regex, String>>> = RefCell::new(HashMap::new());
}

/// Compiles `pattern` (the regex crate is RE2-like, as is Go's regexp which
/// Kubernetes uses). The size limit stops pathological patterns.
fn compiled(pattern: &str) -> Result<Regex, String> {
    RE_CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if let Some(r) = c.get(pattern) {
            return r.clone();
        }
        let r = RegexBuilder::new(pattern)
            .size_limit(1 << 21)
            .dfa_size_limit(1 << 21)
            .build()
            .map_err(|e| e.to_string());
        if c.len() >= 512 {
            c.clear();
        }
        c.insert(pattern.to_string(), r.clone());
        r
    })
}

/// RFC 1123 DNS subdomain as used for object names.
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        })
}

const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

/// Where a node sits: the resource root and embedded resources get the
/// apiVersion/kind/metadata treatment.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Level {
    Root,
    Embedded,
    Normal,
}

#[derive(Default)]
struct Errs {
    list: Vec<FieldError>,
}

impl Errs {
    fn push(&mut self, e: FieldError) {
        if self.list.len() < MAX_ERRORS {
            self.list.push(e);
        }
    }
    fn full(&self) -> bool {
        self.list.len() >= MAX_ERRORS
    }
    fn invalid(&mut self, path: &str, bad: &Value, detail: String) {
        self.push(FieldError::new(
            path,
            FieldErrorKind::Invalid,
            Some(fmt_value(bad)),
            &detail,
        ));
    }
}
