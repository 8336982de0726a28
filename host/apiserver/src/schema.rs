//! CRD structural schemas (apiextensions.k8s.io/v1 `openAPIV3Schema`):
//! structural checks for the CRD itself, defaulting, pruning and validation
//! of custom objects.
//!
//! Everything works directly on `serde_json::Value` so the schema never has
//! to be converted into a typed model; a malformed schema node is simply
//! ignored by `default`/`prune`/`validate` (it is `check_structural`'s job to
//! refuse it up front). No function in this module panics on any input.

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

// ---------------------------------------------------------------------------
// formats
// ---------------------------------------------------------------------------

fn digits(b: &[u8]) -> Option<u32> {
    if b.is_empty() || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(b.iter().fold(0u32, |a, d| a * 10 + u32::from(d - b'0')))
}

/// `YYYY-MM-DD` with real calendar bounds.
fn is_date(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return false;
    }
    let (Some(y), Some(m), Some(d)) = (digits(&b[0..4]), digits(&b[5..7]), digits(&b[8..10]))
    else {
        return false;
    };
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let days = match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    (1..=days).contains(&d)
}

/// RFC 3339 date-time: `2006-01-02T15:04:05[.frac](Z|+07:00)`.
fn is_date_time(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() < 20
        || !s.is_char_boundary(10)
        || !is_date(&s[..10])
        || !matches!(b[10], b'T' | b't')
    {
        return false;
    }
    let t = &b[11..];
    if t.len() < 9 || t[2] != b':' || t[5] != b':' {
        return false;
    }
    let (Some(h), Some(mi), Some(sec)) = (digits(&t[0..2]), digits(&t[3..5]), digits(&t[6..8]))
    else {
        return false;
    };
    if h > 23 || mi > 59 || sec > 60 {
        return false;
    }
    let mut rest = &t[8..];
    if rest.first() == Some(&b'.') {
        let n = rest[1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if n == 0 {
            return false;
        }
        rest = &rest[1 + n..];
    }
    match rest {
        [b'Z'] | [b'z'] => true,
        [sign, h1, h2, b':', m1, m2] if *sign == b'+' || *sign == b'-' => {
            matches!((digits(&[*h1, *h2]), digits(&[*m1, *m2])), (Some(h), Some(m)) if h <= 23 && m <= 59)
        }
        _ => false,
    }
}

/// Standard (padded) base64, as Go's `base64.StdEncoding` accepts it; line
/// breaks are ignored like Go does.
fn is_base64(s: &str) -> bool {
    let b: Vec<u8> = s.bytes().filter(|c| *c != b'\r' && *c != b'\n').collect();
    if !b.len().is_multiple_of(4) {
        return false;
    }
    let pad = b.iter().rev().take_while(|c| **c == b'=').count();
    if pad > 2 {
        return false;
    }
    b[..b.len() - pad]
        .iter()
        .all(|c| c.is_ascii_alphanumeric() || *c == b'+' || *c == b'/')
}

/// Deliberately loose: Go's url.Parse accepts nearly anything, so only
/// reject empty strings, whitespace and control characters.
fn is_uri(s: &str) -> bool {
    !s.is_empty() && !s.chars().any(|c| c.is_whitespace() || c.is_control())
}

fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

fn is_cidr(s: &str) -> bool {
    let Some((ip, bits)) = s.split_once('/') else {
        return false;
    };
    let Some(bits) = digits(bits.as_bytes()) else {
        return false;
    };
    if ip.parse::<std::net::Ipv4Addr>().is_ok() {
        bits <= 32
    } else if ip.parse::<std::net::Ipv6Addr>().is_ok() {
        bits <= 128
    } else {
        false
    }
}

/// `Some(ok)` for formats we know on strings, `None` for unknown formats
/// (Kubernetes ignores unknown formats too).
fn string_format_ok(format: &str, s: &str) -> Option<bool> {
    Some(match format {
        "date-time" | "datetime" => is_date_time(s),
        "date" => is_date(s),
        "byte" => is_base64(s),
        "uri" => is_uri(s),
        "uuid" => is_uuid(s),
        "ipv4" => s.parse::<std::net::Ipv4Addr>().is_ok(),
        "ipv6" => s.parse::<std::net::Ipv6Addr>().is_ok(),
        "cidr" => is_cidr(s),
        _ => return None,
    })
}

fn number_format_ok(format: &str, v: &Value) -> Option<bool> {
    let range = match format {
        "int32" => (i32::MIN as f64, i32::MAX as f64),
        "int64" => (i64::MIN as f64, i64::MAX as f64),
        _ => return None,
    };
    if !is_integer(v) {
        return Some(false);
    }
    if let Value::Number(n) = v {
        if let Some(i) = n.as_i64() {
            return Some(format != "int32" || i32::try_from(i).is_ok());
        }
        if n.is_u64() {
            return Some(false); // larger than i64::MAX
        }
        let f = n.as_f64().unwrap_or(f64::NAN);
        return Some(f >= range.0 && f <= range.1);
    }
    Some(false)
}

// ---------------------------------------------------------------------------
// validation
// ---------------------------------------------------------------------------

/// Where a node sits: the resource root and embedded resources get the
/// apiVersion/kind/metadata treatment.
#[derive(Clone, Copy, PartialEq)]
enum Level {
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

/// "spec.x in body" as kube-openapi phrases it.
fn in_body(path: &str) -> String {
    if path.is_empty() {
        "in body".to_string()
    } else {
        format!("{path} in body")
    }
}

/// Validates a custom object against its version's `openAPIV3Schema`.
/// The top level is treated as the resource root: `apiVersion`/`kind` are
/// left to the server and `metadata` only gets its `name` checked (plus any
/// name/generateName restrictions the schema declares).
pub fn validate(obj: &Value, schema: &Value) -> Vec<FieldError> {
    let mut errs = Errs::default();
    validate_node(&mut errs, obj, schema, "", 0, Level::Root);
    errs.list
}

/// Validates `v` against `schema` as a plain value (no resource-root rules),
/// reporting paths under `base`. Used for defaults and for callers that want
/// to check a fragment.
pub fn validate_value(v: &Value, schema: &Value, base: &str) -> Vec<FieldError> {
    let mut errs = Errs::default();
    validate_node(&mut errs, v, schema, base, 0, Level::Normal);
    errs.list
}

fn type_error(errs: &mut Errs, path: &str, ty: &str, v: &Value) {
    let tn = type_name(v);
    errs.push(FieldError::new(
        path,
        FieldErrorKind::TypeInvalid,
        Some(quote(tn)),
        &format!("{} must be of type {ty}: {}", in_body(path), quote(tn)),
    ));
}

fn validate_node(
    errs: &mut Errs,
    v: &Value,
    schema: &Value,
    path: &str,
    depth: usize,
    level: Level,
) {
    if errs.full() {
        return;
    }
    let Some(s) = schema.as_object() else { return };
    if depth > MAX_DEPTH {
        errs.push(FieldError::new(
            path,
            FieldErrorKind::Invalid,
            None,
            &format!("exceeds the maximum nesting depth of {MAX_DEPTH}"),
        ));
        return;
    }
    let ty = s.get("type").and_then(Value::as_str);
    let int_or_string = flag(s, "x-kubernetes-int-or-string");

    if v.is_null() && flag(s, "nullable") {
        return; // an allowed null skips every other check, as in Kubernetes
    }
    if int_or_string {
        if !(is_integer(v) || v.is_string()) {
            type_error(errs, path, "integer-or-string", v);
            return;
        }
    } else if let Some(t) = ty
        && !type_matches(t, v)
    {
        type_error(errs, path, t, v);
        return;
    }

    if let Some(Value::Array(allowed)) = s.get("enum")
        && !allowed.iter().any(|e| json_eq(e, v))
    {
        let list: Vec<String> = allowed.iter().map(fmt_value).collect();
        errs.push(FieldError::new(
            path,
            FieldErrorKind::Unsupported,
            Some(fmt_value(v)),
            &format!("supported values: {}", list.join(", ")),
        ));
    }

    match v {
        Value::Number(_) => validate_number(errs, v, s, path),
        Value::String(st) => validate_string(errs, v, st, s, path),
        Value::Array(a) => validate_array(errs, v, a, s, path, depth),
        Value::Object(m) => validate_object(errs, v, m, s, path, depth, level),
        _ => {}
    }

    validate_junctors(errs, v, s, path, depth);
}

fn validate_number(errs: &mut Errs, v: &Value, s: &Map<String, Value>, path: &str) {
    let Some(x) = v.as_f64() else { return };
    if let Some(Value::Number(m)) = s.get("minimum") {
        let mf = m.as_f64().unwrap_or(f64::NEG_INFINITY);
        let excl = flag(s, "exclusiveMinimum");
        if (excl && x <= mf) || (!excl && x < mf) {
            let rel = if excl {
                "greater than"
            } else {
                "greater than or equal to"
            };
            errs.invalid(
                path,
                v,
                format!("{} should be {rel} {}", in_body(path), fmt_number(m)),
            );
        }
    }
    if let Some(Value::Number(m)) = s.get("maximum") {
        let mf = m.as_f64().unwrap_or(f64::INFINITY);
        let excl = flag(s, "exclusiveMaximum");
        if (excl && x >= mf) || (!excl && x > mf) {
            let rel = if excl {
                "less than"
            } else {
                "less than or equal to"
            };
            errs.invalid(
                path,
                v,
                format!("{} should be {rel} {}", in_body(path), fmt_number(m)),
            );
        }
    }
    if let Some(Value::Number(m)) = s.get("multipleOf") {
        let ok = match (v.as_i64(), m.as_i64()) {
            // exact for integers; avoids float rounding on large values
            (Some(i), Some(d)) if d > 0 => i % d == 0,
            _ => match m.as_f64() {
                Some(d) if d > 0.0 => {
                    let q = x / d;
                    q.is_finite() && (q - q.round()).abs() <= 1e-9 * q.abs().max(1.0)
                }
                _ => true, // non-positive multipleOf is a schema bug, not the object's
            },
        };
        if !ok {
            errs.invalid(
                path,
                v,
                format!(
                    "{} should be a multiple of {}",
                    in_body(path),
                    fmt_number(m)
                ),
            );
        }
    }
    if let Some(Value::String(f)) = s.get("format")
        && number_format_ok(f, v) == Some(false)
    {
        errs.invalid(
            path,
            v,
            format!(
                "{} must be of type {f}: {}",
                in_body(path),
                quote(&v.to_string())
            ),
        );
    }
}

fn validate_string(errs: &mut Errs, v: &Value, st: &str, s: &Map<String, Value>, path: &str) {
    // Kubernetes counts characters (runes), not bytes.
    let len = st.chars().count() as u64;
    if let Some(max) = s.get("maxLength").and_then(Value::as_u64)
        && len > max
    {
        errs.push(FieldError::new(
            path,
            FieldErrorKind::TooLong,
            None,
            &format!("may not be longer than {max}"),
        ));
    }
    if let Some(min) = s.get("minLength").and_then(Value::as_u64)
        && len < min
    {
        errs.invalid(
            path,
            v,
            format!("{} should be at least {min} chars long", in_body(path)),
        );
    }
    if let Some(Value::String(p)) = s.get("pattern") {
        match compiled(p) {
            Ok(re) => {
                if !re.is_match(st) {
                    errs.invalid(path, v, format!("{} should match '{p}'", in_body(path)));
                }
            }
            Err(e) => errs.push(FieldError::new(
                path,
                FieldErrorKind::Internal,
                None,
                &format!("schema pattern {} does not compile: {e}", quote(p)),
            )),
        }
    }
    if let Some(Value::String(f)) = s.get("format")
        && string_format_ok(f, st) == Some(false)
    {
        errs.invalid(
            path,
            v,
            format!("{} must be of type {f}: {}", in_body(path), quote(st)),
        );
    }
}

fn validate_array(
    errs: &mut Errs,
    v: &Value,
    a: &[Value],
    s: &Map<String, Value>,
    path: &str,
    depth: usize,
) {
    let n = a.len() as u64;
    if let Some(max) = s.get("maxItems").and_then(Value::as_u64)
        && n > max
    {
        errs.push(FieldError::new(
            path,
            FieldErrorKind::TooMany,
            Some(n.to_string()),
            &format!("must have at most {max} items"),
        ));
    }
    if let Some(min) = s.get("minItems").and_then(Value::as_u64)
        && n < min
    {
        errs.invalid(
            path,
            v,
            format!("{} should have at least {min} items", in_body(path)),
        );
    }
    let list_type = s.get("x-kubernetes-list-type").and_then(Value::as_str);
    if flag(s, "uniqueItems") || list_type == Some("set") {
        let mut seen = HashSet::new();
        for (i, e) in a.iter().enumerate() {
            if !seen.insert(canon_string(e)) {
                errs.push(FieldError::new(
                    &index(path, i),
                    FieldErrorKind::Duplicate,
                    Some(fmt_value(e)),
                    "",
                ));
            }
        }
    }
    if list_type == Some("map") {
        let keys: Vec<&str> = match s.get("x-kubernetes-list-map-keys") {
            Some(Value::Array(k)) => k.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        let item_schema = s.get("items").and_then(Value::as_object);
        let mut seen = HashSet::new();
        for (i, e) in a.iter().enumerate() {
            let Value::Object(m) = e else { continue }; // item type errors come from `items`
            let mut key_obj = Map::new();
            for k in &keys {
                // an absent key falls back to its schema default, as the
                // defaulting pass would have filled it in
                let kv = m.get(*k).cloned().or_else(|| {
                    item_schema
                        .and_then(|is| is.get("properties"))
                        .and_then(|p| p.get(*k))
                        .and_then(|p| p.get("default"))
                        .cloned()
                });
                key_obj.insert((*k).to_string(), kv.unwrap_or(Value::Null));
            }
            let key_val = Value::Object(key_obj);
            if !seen.insert(canon_string(&key_val)) {
                errs.push(FieldError::new(
                    &index(path, i),
                    FieldErrorKind::Duplicate,
                    Some(fmt_value(&key_val)),
                    "",
                ));
            }
        }
    }
    if let Some(items) = s.get("items") {
        for (i, e) in a.iter().enumerate() {
            if errs.full() {
                break;
            }
            validate_node(errs, e, items, &index(path, i), depth + 1, Level::Normal);
        }
    }
}

fn validate_object(
    errs: &mut Errs,
    v: &Value,
    m: &Map<String, Value>,
    s: &Map<String, Value>,
    path: &str,
    depth: usize,
    level: Level,
) {
    let n = m.len() as u64;
    if let Some(max) = s.get("maxProperties").and_then(Value::as_u64)
        && n > max
    {
        errs.push(FieldError::new(
            path,
            FieldErrorKind::TooMany,
            Some(n.to_string()),
            &format!("must have at most {max} items"),
        ));
    }
    if let Some(min) = s.get("minProperties").and_then(Value::as_u64)
        && n < min
    {
        errs.invalid(
            path,
            v,
            format!("{} should have at least {min} properties", in_body(path)),
        );
    }
    if let Some(Value::Array(req)) = s.get("required") {
        for r in req.iter().filter_map(Value::as_str) {
            if !m.contains_key(r) {
                errs.push(FieldError::new(
                    &child(path, r),
                    FieldErrorKind::Required,
                    None,
                    "",
                ));
            }
        }
    }
    let level = if level == Level::Normal && flag(s, "x-kubernetes-embedded-resource") {
        Level::Embedded
    } else {
        level
    };
    if level == Level::Embedded {
        // an embedded object must name its type; the root's apiVersion/kind
        // are checked by the server itself
        for k in ["apiVersion", "kind"] {
            match m.get(k) {
                Some(Value::String(x)) if !x.is_empty() => {}
                Some(Value::String(_)) | None => errs.push(FieldError::new(
                    &child(path, k),
                    FieldErrorKind::Required,
                    None,
                    "must not be empty",
                )),
                Some(other) => type_error(errs, &child(path, k), "string", other),
            }
        }
    }
    let props = s.get("properties").and_then(Value::as_object);
    let addl = s.get("additionalProperties");
    for (k, cv) in m {
        if errs.full() {
            return;
        }
        let cpath = child(path, k);
        let prop = props.and_then(|p| p.get(k));
        if level != Level::Normal && k == "metadata" {
            validate_metadata(errs, cv, prop, &cpath, depth);
            continue;
        }
        if let Some(p) = prop {
            validate_node(errs, cv, p, &cpath, depth + 1, Level::Normal);
        } else if let Some(a) = addl {
            match a {
                Value::Object(_) => {
                    validate_node(errs, cv, a, &map_key(path, k), depth + 1, Level::Normal)
                }
                Value::Bool(false) => errs.push(FieldError::new(
                    &cpath,
                    FieldErrorKind::Forbidden,
                    None,
                    &format!("{} is a forbidden property", in_body(&cpath)),
                )),
                _ => {}
            }
        }
        // unknown fields are otherwise the pruner's business, not an error
    }
}

/// ObjectMeta at a resource root: only the name is checked here (the server
/// validates the rest of ObjectMeta), plus schema restrictions on
/// name/generateName, the only ones a CRD may declare.
fn validate_metadata(errs: &mut Errs, v: &Value, prop: Option<&Value>, path: &str, depth: usize) {
    let Value::Object(m) = v else {
        type_error(errs, path, "object", v);
        return;
    };
    if let Some(name) = m.get("name") {
        let npath = child(path, "name");
        match name {
            Value::String(n) if n.len() > 253 => errs.invalid(
                &npath,
                name,
                "must be no more than 253 characters".to_string(),
            ),
            Value::String(n) if !is_dns_subdomain(n) => {
                errs.invalid(&npath, name, DNS1123_SUBDOMAIN_MSG.to_string())
            }
            Value::String(_) => {}
            other => type_error(errs, &npath, "string", other),
        }
    }
    if let Some(props) = prop
        .and_then(|p| p.get("properties"))
        .and_then(Value::as_object)
    {
        for k in ["name", "generateName"] {
            if let (Some(sub), Some(val)) = (props.get(k), m.get(k)) {
                validate_node(errs, val, sub, &child(path, k), depth + 1, Level::Normal);
            }
        }
    }
}

fn validate_junctors(errs: &mut Errs, v: &Value, s: &Map<String, Value>, path: &str, depth: usize) {
    if let Some(Value::Array(subs)) = s.get("allOf") {
        for sub in subs {
            validate_node(errs, v, sub, path, depth + 1, Level::Normal);
        }
    }
    // anyOf/oneOf: evaluate alternatives in isolation and report the closest
    // failing alternative's errors, so the user sees something actionable.
    for (kw, what) in [
        ("anyOf", "must validate at least one schema (anyOf)"),
        ("oneOf", "must validate one and only one schema (oneOf)"),
    ] {
        let Some(Value::Array(subs)) = s.get(kw) else {
            continue;
        };
        if subs.is_empty() {
            continue;
        }
        let results: Vec<Vec<FieldError>> = subs
            .iter()
            .map(|sub| {
                let mut e = Errs::default();
                validate_node(&mut e, v, sub, path, depth + 1, Level::Normal);
                e.list
            })
            .collect();
        let passing = results.iter().filter(|r| r.is_empty()).count();
        let ok = if kw == "anyOf" {
            passing >= 1
        } else {
            passing == 1
        };
        if !ok {
            errs.invalid(path, v, format!("{} {what}", in_body(path)));
            if passing == 0
                && let Some(best) = results.into_iter().min_by_key(Vec::len)
            {
                for e in best {
                    errs.push(e);
                }
            }
        }
    }
    if let Some(not) = s.get("not")
        && not.is_object()
    {
        let mut e = Errs::default();
        validate_node(&mut e, v, not, path, depth + 1, Level::Normal);
        if e.list.is_empty() {
            errs.invalid(
                path,
                v,
                format!("{} must not validate the schema (not)", in_body(path)),
            );
        }
    }
}

// ---------------------------------------------------------------------------
// defaulting
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// pruning
// ---------------------------------------------------------------------------

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

fn prune_node(
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

// ---------------------------------------------------------------------------
// structural schema check
// ---------------------------------------------------------------------------

const TYPES: [&str; 6] = ["array", "boolean", "integer", "number", "object", "string"];
/// JSON-Schema features apiextensions.k8s.io/v1 refuses.
const FORBIDDEN_KEYWORDS: [&str; 7] = [
    "$ref",
    "$schema",
    "id",
    "definitions",
    "dependencies",
    "additionalItems",
    "patternProperties",
];

struct SChecker {
    errs: Errs,
}

impl SChecker {
    fn err(&mut self, path: &str, kind: FieldErrorKind, bad: Option<String>, detail: &str) {
        self.errs.push(FieldError::new(path, kind, bad, detail));
    }

    /// Shape of keyword values, shared by structural and junctor nodes.
    fn keyword_types(&mut self, s: &Map<String, Value>, path: &str) {
        for k in FORBIDDEN_KEYWORDS {
            if s.contains_key(k) {
                self.err(
                    &child(path, k),
                    FieldErrorKind::Forbidden,
                    None,
                    "not allowed in apiextensions.k8s.io/v1 schemas",
                );
            }
        }
        if flag(s, "uniqueItems") {
            self.err(
                &child(path, "uniqueItems"),
                FieldErrorKind::Forbidden,
                None,
                "uniqueItems cannot be set to true since the runtime complexity becomes quadratic",
            );
        }
        for k in [
            "nullable",
            "uniqueItems",
            "exclusiveMinimum",
            "exclusiveMaximum",
            "x-kubernetes-preserve-unknown-fields",
            "x-kubernetes-embedded-resource",
            "x-kubernetes-int-or-string",
        ] {
            if let Some(v) = s.get(k)
                && !v.is_boolean()
            {
                self.err(
                    &child(path, k),
                    FieldErrorKind::Invalid,
                    Some(fmt_value(v)),
                    "must be a boolean",
                );
            }
        }
        for k in ["minimum", "maximum", "multipleOf"] {
            if let Some(v) = s.get(k) {
                if !v.is_number() {
                    self.err(
                        &child(path, k),
                        FieldErrorKind::Invalid,
                        Some(fmt_value(v)),
                        "must be a number",
                    );
                } else if k == "multipleOf" && v.as_f64().is_some_and(|f| f <= 0.0) {
                    self.err(
                        &child(path, k),
                        FieldErrorKind::Invalid,
                        Some(fmt_value(v)),
                        "must be greater than zero",
                    );
                }
            }
        }
        for k in [
            "minLength",
            "maxLength",
            "minItems",
            "maxItems",
            "minProperties",
            "maxProperties",
        ] {
            if let Some(v) = s.get(k)
                && v.as_u64().is_none()
            {
                self.err(
                    &child(path, k),
                    FieldErrorKind::Invalid,
                    Some(fmt_value(v)),
                    "must be a non-negative integer",
                );
            }
        }
        for k in ["format", "description", "title", "pattern"] {
            if let Some(v) = s.get(k)
                && !v.is_string()
            {
                self.err(
                    &child(path, k),
                    FieldErrorKind::Invalid,
                    Some(fmt_value(v)),
                    "must be a string",
                );
            }
        }
        if let Some(Value::String(p)) = s.get("pattern")
            && let Err(e) = compiled(p)
        {
            self.err(
                &child(path, "pattern"),
                FieldErrorKind::Invalid,
                Some(quote(p)),
                &format!("must be a valid regular expression: {e}"),
            );
        }
        if let Some(v) = s.get("enum")
            && !v.is_array()
        {
            self.err(
                &child(path, "enum"),
                FieldErrorKind::Invalid,
                Some(fmt_value(v)),
                "must be an array",
            );
        }
        if let Some(v) = s.get("required") {
            let ok = v.as_array().is_some_and(|a| a.iter().all(Value::is_string));
            if !ok {
                self.err(
                    &child(path, "required"),
                    FieldErrorKind::Invalid,
                    Some(fmt_value(v)),
                    "must be an array of strings",
                );
            }
        }
        if let Some(v) = s.get("properties")
            && !v.is_object()
        {
            self.err(
                &child(path, "properties"),
                FieldErrorKind::Invalid,
                Some(fmt_value(v)),
                "must be an object",
            );
        }
        if let Some(v) = s.get("x-kubernetes-validations") {
            // CEL rules are accepted but not evaluated by this module
            if !v.is_array() {
                self.err(
                    &child(path, "x-kubernetes-validations"),
                    FieldErrorKind::Invalid,
                    Some(fmt_value(v)),
                    "must be an array",
                );
            }
        }
    }

    /// The schema node as an object, or `None` (after recording why) when it is
    /// not one, nests too deep, or enough errors were found already.
    fn schema_object<'v>(&mut self, v: &'v Value, path: &str, depth: usize) -> Option<&'v Map<String, Value>> {
        if self.errs.full() {
            return None;
        }
        if depth > MAX_DEPTH {
            self.err(path, FieldErrorKind::Forbidden, None, &format!("schema exceeds the maximum nesting depth of {MAX_DEPTH}"));
            return None;
        }
        let s = v.as_object();
        if s.is_none() {
            self.err(path, FieldErrorKind::Invalid, Some(fmt_value(v)), "must be a schema object");
        }
        s
    }

    fn node(&mut self, v: &Value, path: &str, depth: usize, root: bool) {
        let Some(s) = self.schema_object(v, path, depth) else { return };
        self.keyword_types(s, path);

        let ty = match s.get("type") {
            None => None,
            Some(Value::String(t)) if TYPES.contains(&t.as_str()) => Some(t.as_str()),
            Some(Value::String(t)) if t.is_empty() => None,
            Some(other) => {
                let supported: Vec<String> = TYPES.iter().map(|t| quote(t)).collect();
                self.err(
                    &child(path, "type"),
                    FieldErrorKind::Unsupported,
                    Some(fmt_value(other)),
                    &format!("supported values: {}", supported.join(", ")),
                );
                return;
            }
        };
        let ios = flag(s, "x-kubernetes-int-or-string");
        let preserve = flag(s, "x-kubernetes-preserve-unknown-fields");
        let embedded = flag(s, "x-kubernetes-embedded-resource");

        if ios && ty.is_some() {
            self.err(
                &child(path, "type"),
                FieldErrorKind::Forbidden,
                None,
                "must be empty if x-kubernetes-int-or-string is true",
            );
        }
        if ty.is_none() && !ios && !preserve {
            self.err(
                &child(path, "type"),
                FieldErrorKind::Required,
                None,
                "must not be empty for specified fields",
            );
        }
        if root && ty != Some("object") {
            self.err(
                &child(path, "type"),
                FieldErrorKind::Invalid,
                ty.map(quote),
                "must be object at the root",
            );
        }
        if embedded {
            if ty != Some("object") {
                self.err(
                    &child(path, "type"),
                    FieldErrorKind::Invalid,
                    ty.map(quote),
                    "must be object if x-kubernetes-embedded-resource is true",
                );
            }
            if !preserve
                && s.get("properties")
                    .and_then(Value::as_object)
                    .is_none_or(Map::is_empty)
            {
                self.err(
                    &child(path, "x-kubernetes-preserve-unknown-fields"),
                    FieldErrorKind::Required,
                    None,
                    "must be true if x-kubernetes-embedded-resource is true and properties are empty",
                );
            }
        }

        let props = s.get("properties").and_then(Value::as_object);
        if let Some(props) = props {
            if ty.is_some() && ty != Some("object") {
                self.err(
                    &child(path, "properties"),
                    FieldErrorKind::Forbidden,
                    None,
                    "must only be used with type object",
                );
            }
            for (k, sub) in props {
                let ppath = map_key(&child(path, "properties"), k);
                if root && k == "metadata" {
                    self.root_metadata(sub, &ppath, depth + 1);
                } else {
                    self.node(sub, &ppath, depth + 1, false);
                }
            }
        }
        match s.get("additionalProperties") {
            None | Some(Value::Bool(true)) => {}
            Some(a) => {
                let apath = child(path, "additionalProperties");
                if props.is_some_and(|p| !p.is_empty()) {
                    self.err(
                        &apath,
                        FieldErrorKind::Forbidden,
                        None,
                        "additionalProperties and properties are mutual exclusive",
                    );
                }
                if ty.is_some() && ty != Some("object") {
                    self.err(
                        &apath,
                        FieldErrorKind::Forbidden,
                        None,
                        "must only be used with type object",
                    );
                }
                match a {
                    Value::Object(_) => self.node(a, &apath, depth + 1, false),
                    Value::Bool(false) => {}
                    other => self.err(
                        &apath,
                        FieldErrorKind::Invalid,
                        Some(fmt_value(other)),
                        "must be a schema object or a boolean",
                    ),
                }
            }
        }
        let ipath = child(path, "items");
        match s.get("items") {
            None if ty == Some("array") => {
                self.err(&ipath, FieldErrorKind::Required, None, "must be specified")
            }
            None => {}
            Some(items @ Value::Object(_)) => {
                if ty.is_some() && ty != Some("array") {
                    self.err(
                        &ipath,
                        FieldErrorKind::Forbidden,
                        None,
                        "must only be used with type array",
                    );
                }
                self.node(items, &ipath, depth + 1, false);
            }
            Some(Value::Array(_)) => self.err(
                &ipath,
                FieldErrorKind::Forbidden,
                None,
                "items must be a schema object and not an array",
            ),
            Some(other) => self.err(
                &ipath,
                FieldErrorKind::Invalid,
                Some(fmt_value(other)),
                "must be a schema object",
            ),
        }

        self.junctors(s, path, depth, s, ios);
        self.list_and_map_types(s, path, ty);

        if let Some(d) = s.get("default") {
            let dpath = child(path, "default");
            if root {
                self.err(
                    &dpath,
                    FieldErrorKind::Forbidden,
                    None,
                    "must not be set at the root",
                );
            } else if !d.is_null() {
                // a default must itself be valid and free of unknown fields,
                // otherwise every defaulted object would be rejected
                let mut pruned = d.clone();
                let mut unknown = Vec::new();
                prune_node(&mut pruned, Some(s), "", depth, Level::Normal, &mut unknown);
                if !unknown.is_empty() {
                    self.err(
                        &dpath,
                        FieldErrorKind::Invalid,
                        Some(fmt_value(d)),
                        &format!("must not have unknown fields: {}", unknown.join(", ")),
                    );
                }
                for e in validate_value(d, v, "default") {
                    self.errs.push(FieldError {
                        message: format!("{path}.{}", e.message),
                        field: format!("{path}.{}", e.field),
                        kind: e.kind,
                    });
                }
            }
        }
    }

    /// Only `type: object` and restrictions on name/generateName are allowed;
    /// everything else in metadata is owned by the server.
    fn root_metadata(&mut self, v: &Value, path: &str, depth: usize) {
        let Some(s) = v.as_object() else {
            self.err(
                path,
                FieldErrorKind::Invalid,
                Some(fmt_value(v)),
                "must be a schema object",
            );
            return;
        };
        for (k, val) in s {
            match k.as_str() {
                "type" if val.as_str() == Some("object") => {}
                "type" => self.err(
                    &child(path, "type"),
                    FieldErrorKind::Invalid,
                    Some(fmt_value(val)),
                    "must be object",
                ),
                "description" | "title" => {}
                "properties" => {
                    let Some(props) = val.as_object() else {
                        self.err(
                            &child(path, "properties"),
                            FieldErrorKind::Invalid,
                            Some(fmt_value(val)),
                            "must be an object",
                        );
                        continue;
                    };
                    for (pk, pv) in props {
                        let ppath = map_key(&child(path, "properties"), pk);
                        if pk != "name" && pk != "generateName" {
                            self.err(&ppath, FieldErrorKind::Forbidden, None, "must not be specified, only name and generateName may be restricted");
                            continue;
                        }
                        if pv.get("default").is_some() {
                            self.err(
                                &child(&ppath, "default"),
                                FieldErrorKind::Forbidden,
                                None,
                                "must not be set for metadata",
                            );
                        }
                        if pv
                            .get("type")
                            .and_then(Value::as_str)
                            .is_some_and(|t| t != "string")
                        {
                            self.err(
                                &child(&ppath, "type"),
                                FieldErrorKind::Invalid,
                                Some(fmt_value(&pv["type"])),
                                "must be string",
                            );
                        }
                        self.node(pv, &ppath, depth + 1, false);
                    }
                }
                _ => self.err(
                    &child(path, k),
                    FieldErrorKind::Forbidden,
                    None,
                    "must not be specified, metadata is implicitly specified",
                ),
            }
        }
    }

    fn junctors(
        &mut self,
        s: &Map<String, Value>,
        path: &str,
        depth: usize,
        counterpart: &Map<String, Value>,
        ios: bool,
    ) {
        for kw in ["allOf", "anyOf", "oneOf"] {
            let Some(v) = s.get(kw) else { continue };
            let Some(subs) = v.as_array() else {
                self.err(
                    &child(path, kw),
                    FieldErrorKind::Invalid,
                    Some(fmt_value(v)),
                    "must be an array",
                );
                continue;
            };
            for (i, sub) in subs.iter().enumerate() {
                self.value_validation(
                    sub,
                    &index(&child(path, kw), i),
                    depth + 1,
                    Some(counterpart),
                    ios,
                );
            }
        }
        if let Some(not) = s.get("not") {
            self.value_validation(not, &child(path, "not"), depth + 1, Some(counterpart), ios);
        }
    }

    /// A node inside allOf/anyOf/oneOf/not: validation only. It may not
    /// introduce types, defaults or fields the structural part lacks.
    fn value_validation(
        &mut self,
        v: &Value,
        path: &str,
        depth: usize,
        counterpart: Option<&Map<String, Value>>,
        ios: bool,
    ) {
        let Some(s) = self.schema_object(v, path, depth) else { return };
        self.keyword_types(s, path);
        for k in [
            "description",
            "default",
            "nullable",
            "additionalProperties",
            "x-kubernetes-preserve-unknown-fields",
            "x-kubernetes-embedded-resource",
            "x-kubernetes-int-or-string",
            "x-kubernetes-list-type",
            "x-kubernetes-list-map-keys",
            "x-kubernetes-map-type",
            "x-kubernetes-validations",
        ] {
            if s.contains_key(k) {
                self.err(
                    &child(path, k),
                    FieldErrorKind::Forbidden,
                    None,
                    "must be empty to be structural",
                );
            }
        }
        if let Some(t) = s.get("type") {
            // the one exception: the int-or-string idiom
            // `anyOf: [{type: integer}, {type: string}]`
            let idiom = ios && matches!(t.as_str(), Some("integer" | "string"));
            if !idiom {
                self.err(
                    &child(path, "type"),
                    FieldErrorKind::Forbidden,
                    None,
                    "must be empty to be structural",
                );
            }
        }
        if let Some(props) = s.get("properties").and_then(Value::as_object) {
            let cprops = counterpart
                .and_then(|c| c.get("properties"))
                .and_then(Value::as_object);
            for (k, sub) in props {
                let ppath = map_key(&child(path, "properties"), k);
                match cprops.and_then(|c| c.get(k)).and_then(Value::as_object) {
                    Some(c) => self.value_validation(sub, &ppath, depth + 1, Some(c), false),
                    None => {
                        self.err(&ppath, FieldErrorKind::Forbidden, None, "must have a counterpart in the structural schema outside of allOf/anyOf/oneOf/not");
                    }
                }
            }
        }
        if let Some(items) = s.get("items") {
            let ipath = child(path, "items");
            match counterpart.and_then(|c| c.get("items")).and_then(Value::as_object) {
                Some(c) if items.is_object() => self.value_validation(items, &ipath, depth + 1, Some(c), false),
                Some(_) => self.err(&ipath, FieldErrorKind::Invalid, Some(fmt_value(items)), "must be a schema object"),
                None => self.err(&ipath, FieldErrorKind::Forbidden, None, "must have a counterpart in the structural schema outside of allOf/anyOf/oneOf/not"),
            }
        }
        if let Some(c) = counterpart {
            self.junctors(s, path, depth, c, ios);
        }
    }

    fn list_and_map_types(&mut self, s: &Map<String, Value>, path: &str, ty: Option<&str>) {
        let lt_path = child(path, "x-kubernetes-list-type");
        let list_type = match s.get("x-kubernetes-list-type") {
            None => None,
            Some(Value::String(t)) if matches!(t.as_str(), "atomic" | "set" | "map") => {
                Some(t.as_str())
            }
            Some(other) => {
                self.err(
                    &lt_path,
                    FieldErrorKind::Unsupported,
                    Some(fmt_value(other)),
                    "supported values: \"atomic\", \"set\", \"map\"",
                );
                None
            }
        };
        if list_type.is_some() && ty != Some("array") {
            self.err(
                &lt_path,
                FieldErrorKind::Invalid,
                None,
                "must only be used with type array",
            );
        }
        let items = s.get("items").and_then(Value::as_object);
        let item_ty = items.and_then(|i| i.get("type")).and_then(Value::as_str);
        let keys_path = child(path, "x-kubernetes-list-map-keys");
        match list_type {
            Some("set") => {
                let scalar = matches!(item_ty, Some("string" | "integer" | "number" | "boolean"))
                    || items.is_some_and(|i| flag(i, "x-kubernetes-int-or-string"))
                    || (item_ty == Some("object")
                        && items
                            .and_then(|i| i.get("x-kubernetes-map-type"))
                            .and_then(Value::as_str)
                            == Some("atomic"))
                    || (item_ty == Some("array")
                        && items
                            .and_then(|i| i.get("x-kubernetes-list-type"))
                            .and_then(Value::as_str)
                            == Some("atomic"));
                if !scalar {
                    self.err(
                        &lt_path,
                        FieldErrorKind::Invalid,
                        Some(quote("set")),
                        "may only be used for scalar items or atomic objects/arrays",
                    );
                }
            }
            Some("map") => {
                let keys = s
                    .get("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array);
                let Some(keys) = keys.filter(|k| !k.is_empty()) else {
                    self.err(
                        &keys_path,
                        FieldErrorKind::Required,
                        None,
                        "must not be empty if x-kubernetes-list-type is map",
                    );
                    return;
                };
                if item_ty != Some("object") {
                    self.err(
                        &child(&child(path, "items"), "type"),
                        FieldErrorKind::Invalid,
                        item_ty.map(quote),
                        "must be object if parent array's x-kubernetes-list-type is map",
                    );
                }
                let iprops = items
                    .and_then(|i| i.get("properties"))
                    .and_then(Value::as_object);
                let required: Vec<&str> = items
                    .and_then(|i| i.get("required"))
                    .and_then(Value::as_array)
                    .map(|r| r.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let mut seen = HashSet::new();
                for (i, k) in keys.iter().enumerate() {
                    let kpath = index(&keys_path, i);
                    let Some(k) = k.as_str() else {
                        self.err(
                            &kpath,
                            FieldErrorKind::Invalid,
                            Some(fmt_value(k)),
                            "must be a string",
                        );
                        continue;
                    };
                    if !seen.insert(k) {
                        self.err(&kpath, FieldErrorKind::Duplicate, Some(quote(k)), "");
                        continue;
                    }
                    let Some(p) = iprops.and_then(|p| p.get(k)) else {
                        self.err(
                            &kpath,
                            FieldErrorKind::Invalid,
                            Some(quote(k)),
                            "entries must all be names of item properties",
                        );
                        continue;
                    };
                    let pty = p.get("type").and_then(Value::as_str);
                    let scalar = matches!(pty, Some("string" | "integer" | "number" | "boolean"))
                        || p.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
                    if !scalar {
                        self.err(
                            &kpath,
                            FieldErrorKind::Invalid,
                            Some(quote(k)),
                            "must be a scalar typed property",
                        );
                    }
                    if !required.contains(&k) && p.get("default").is_none_or(Value::is_null) {
                        self.err(
                            &kpath,
                            FieldErrorKind::Invalid,
                            Some(quote(k)),
                            "all map keys must be required or have a default value",
                        );
                    }
                }
            }
            _ => {
                if s.contains_key("x-kubernetes-list-map-keys") {
                    self.err(
                        &keys_path,
                        FieldErrorKind::Forbidden,
                        None,
                        "must not be set if x-kubernetes-list-type is not map",
                    );
                }
            }
        }
        if let Some(mt) = s.get("x-kubernetes-map-type") {
            let mpath = child(path, "x-kubernetes-map-type");
            if !matches!(mt.as_str(), Some("granular" | "atomic")) {
                self.err(
                    &mpath,
                    FieldErrorKind::Unsupported,
                    Some(fmt_value(mt)),
                    "supported values: \"granular\", \"atomic\"",
                );
            } else if ty != Some("object") {
                self.err(
                    &mpath,
                    FieldErrorKind::Invalid,
                    Some(fmt_value(mt)),
                    "must only be used with type object",
                );
            }
        }
    }
}

/// Checks that a CRD version's `openAPIV3Schema` is structural and servable
/// (types everywhere, no `$ref`, junctors only validate, valid patterns and
/// defaults, consistent list/map types, metadata restricted to
/// name/generateName). Returns Kubernetes-style error lines whose paths start
/// at `openAPIV3Schema`; callers prefix e.g. `spec.versions[0].schema.`.
/// An empty result means the schema is acceptable.
pub fn check_structural(schema: &Value) -> Vec<String> {
    let mut c = SChecker {
        errs: Errs::default(),
    };
    c.node(schema, "openAPIV3Schema", 0, true);
    c.errs.list.into_iter().map(|e| e.message).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vm_schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "apiVersion": {"type": "string"},
                "kind": {"type": "string"},
                "metadata": {"type": "object"},
                "spec": {
                    "type": "object",
                    "required": ["classRef", "cpus"],
                    "properties": {
                        "classRef": {"type": "string", "minLength": 1, "maxLength": 10},
                        "cpus": {"type": "integer", "minimum": 1, "maximum": 64, "format": "int32"},
                        "memory": {"x-kubernetes-int-or-string": true, "anyOf": [{"type": "integer"}, {"type": "string"}]},
                        "ratio": {"type": "number", "minimum": 0, "exclusiveMinimum": true, "maximum": 1, "multipleOf": 0.25},
                        "firmware": {"type": "string", "enum": ["BIOS", "UEFI"], "default": "UEFI"},
                        "hostname": {"type": "string", "pattern": "^[a-z]+$", "nullable": true},
                        "created": {"type": "string", "format": "date-time"},
                        "blob": {"type": "string", "format": "byte"},
                        "tags": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set", "maxItems": 3},
                        "disks": {
                            "type": "array", "minItems": 1,
                            "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                            "items": {
                                "type": "object", "required": ["name"],
                                "properties": {
                                    "name": {"type": "string"},
                                    "sizeGiB": {"type": "integer", "minimum": 1, "default": 10},
                                    "bus": {"type": "string", "default": "virtio"}
                                }
                            }
                        },
                        "labels": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 5}, "maxProperties": 2},
                        "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true, "properties": {"known": {"type": "object", "properties": {"a": {"type": "string"}}}}},
                        "template": {"type": "object", "x-kubernetes-embedded-resource": true, "x-kubernetes-preserve-unknown-fields": true},
                        "net": {"type": "object", "default": {}, "properties": {"mode": {"type": "string", "default": "nat"}}}
                    }
                },
                "status": {"type": "object", "properties": {"phase": {"type": "string"}}}
            }
        })
    }

    fn good_vm() -> Value {
        json!({
            "apiVersion": "banlieue.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "web", "namespace": "default", "labels": {"a": "b"}},
            "spec": {"classRef": "small", "cpus": 2, "memory": "4Gi", "ratio": 0.5,
                     "disks": [{"name": "root", "sizeGiB": 20}], "tags": ["a", "b"],
                     "created": "2024-02-29T12:00:00.5+01:00", "blob": "aGVsbG8=",
                     "labels": {"x": "y"}}
        })
    }

    fn messages(errs: &[FieldError]) -> Vec<String> {
        errs.iter().map(|e| e.message.clone()).collect()
    }

    #[test]
    fn vm_schema_is_structural_and_good_object_validates() {
        assert_eq!(check_structural(&vm_schema()), Vec::<String>::new());
        assert_eq!(
            messages(&validate(&good_vm(), &vm_schema())),
            Vec::<String>::new()
        );
    }

    #[test]
    fn kubernetes_style_messages() {
        let mut o = good_vm();
        o["spec"]["cpus"] = json!(0);
        o["spec"]["firmware"] = json!("XYZ");
        o["spec"].as_object_mut().unwrap().remove("classRef");
        let m = messages(&validate(&o, &vm_schema()));
        assert!(m.contains(&"spec.cpus: Invalid value: 0: spec.cpus in body should be greater than or equal to 1".to_string()), "{m:?}");
        assert!(
            m.contains(
                &r#"spec.firmware: Unsupported value: "XYZ": supported values: "BIOS", "UEFI""#
                    .to_string()
            ),
            "{m:?}"
        );
        assert!(
            m.contains(&"spec.classRef: Required value".to_string()),
            "{m:?}"
        );

        o = good_vm();
        o["spec"]["cpus"] = json!("string");
        let e = validate(&o, &vm_schema());
        assert_eq!(
            messages(&e),
            vec![
                r#"spec.cpus: Invalid value: "string": spec.cpus in body must be of type integer: "string""#
            ]
        );
        assert_eq!(e[0].kind, FieldErrorKind::TypeInvalid);
        assert_eq!(e[0].field, "spec.cpus");
        assert_eq!(e[0].to_string(), e[0].message);
    }

    #[test]
    fn types() {
        let s = |t: &str| json!({"type": t});
        assert!(validate_value(&json!(3), &s("integer"), "x").is_empty());
        assert!(
            validate_value(&json!(3.0), &s("integer"), "x").is_empty(),
            "integral float is an integer"
        );
        assert_eq!(
            messages(&validate_value(&json!(3.5), &s("integer"), "x")),
            vec![r#"x: Invalid value: "number": x in body must be of type integer: "number""#]
        );
        assert!(validate_value(&json!(3), &s("number"), "x").is_empty());
        assert!(validate_value(&json!(true), &s("boolean"), "x").is_empty());
        assert!(!validate_value(&json!("true"), &s("boolean"), "x").is_empty());
        assert!(!validate_value(&json!([]), &s("object"), "x").is_empty());
        assert!(!validate_value(&json!({}), &s("array"), "x").is_empty());
        assert!(!validate_value(&json!(1), &s("string"), "x").is_empty());
        // null: refused unless nullable
        assert_eq!(
            messages(&validate_value(&Value::Null, &s("object"), "x")),
            vec![r#"x: Invalid value: "null": x in body must be of type object: "null""#]
        );
        assert!(
            validate_value(
                &Value::Null,
                &json!({"type": "object", "nullable": true, "minProperties": 1}),
                "x"
            )
            .is_empty()
        );
        // int-or-string
        let ios = json!({"x-kubernetes-int-or-string": true});
        assert!(validate_value(&json!(1), &ios, "x").is_empty());
        assert!(validate_value(&json!("1Gi"), &ios, "x").is_empty());
        assert!(!validate_value(&json!(1.5), &ios, "x").is_empty());
        assert!(!validate_value(&json!(true), &ios, "x").is_empty());
        // int-or-string with the anyOf idiom reports exactly one error
        let mut o = good_vm();
        o["spec"]["memory"] = json!(false);
        assert_eq!(validate(&o, &vm_schema()).len(), 1);
    }

    #[test]
    fn numeric_bounds() {
        let s = json!({"type": "number", "minimum": 1, "exclusiveMinimum": true, "maximum": 10, "exclusiveMaximum": true});
        assert_eq!(
            messages(&validate_value(&json!(1), &s, "n")),
            vec!["n: Invalid value: 1: n in body should be greater than 1"]
        );
        assert_eq!(
            messages(&validate_value(&json!(10), &s, "n")),
            vec!["n: Invalid value: 10: n in body should be less than 10"]
        );
        assert!(validate_value(&json!(5.5), &s, "n").is_empty());
        let s = json!({"type": "integer", "maximum": 10});
        assert_eq!(
            messages(&validate_value(&json!(11), &s, "n")),
            vec!["n: Invalid value: 11: n in body should be less than or equal to 10"]
        );
        assert!(validate_value(&json!(10), &s, "n").is_empty());
        let s = json!({"type": "number", "multipleOf": 0.1});
        assert!(
            validate_value(&json!(0.3), &s, "n").is_empty(),
            "float rounding tolerated"
        );
        assert!(!validate_value(&json!(0.35), &s, "n").is_empty());
        let s = json!({"type": "integer", "multipleOf": 5});
        assert!(validate_value(&json!(15), &s, "n").is_empty());
        assert_eq!(
            messages(&validate_value(&json!(7), &s, "n")),
            vec!["n: Invalid value: 7: n in body should be a multiple of 5"]
        );
        // int32 / int64 formats
        let s = json!({"type": "integer", "format": "int32"});
        assert!(validate_value(&json!(2147483647), &s, "n").is_empty());
        assert!(!validate_value(&json!(2147483648i64), &s, "n").is_empty());
        assert!(!validate_value(&json!(-2147483649i64), &s, "n").is_empty());
        let s = json!({"type": "integer", "format": "int64"});
        assert!(validate_value(&json!(i64::MAX), &s, "n").is_empty());
        assert!(!validate_value(&json!(u64::MAX), &s, "n").is_empty());
    }

    #[test]
    fn strings() {
        let s = json!({"type": "string", "minLength": 2, "maxLength": 3});
        assert!(
            validate_value(&json!("héé"), &s, "s").is_empty(),
            "counts chars, not bytes"
        );
        assert_eq!(
            messages(&validate_value(&json!("abcd"), &s, "s")),
            vec!["s: Too long: may not be longer than 3"]
        );
        assert_eq!(
            validate_value(&json!("abcd"), &s, "s")[0].kind,
            FieldErrorKind::TooLong
        );
        assert_eq!(
            messages(&validate_value(&json!("a"), &s, "s")),
            vec![r#"s: Invalid value: "a": s in body should be at least 2 chars long"#]
        );
        let s = json!({"type": "string", "pattern": "^[a-z]+$"});
        assert_eq!(
            messages(&validate_value(&json!("Ab"), &s, "s")),
            vec![r#"s: Invalid value: "Ab": s in body should match '^[a-z]+$'"#]
        );
        // a pattern that slipped past check_structural: reported, no panic
        let bad = json!({"type": "string", "pattern": "(?=x)"});
        assert_eq!(
            validate_value(&json!("x"), &bad, "s")[0].kind,
            FieldErrorKind::Internal
        );
    }

    #[test]
    fn formats() {
        let f = |fmt: &str, v: &str| {
            validate_value(&json!(v), &json!({"type": "string", "format": fmt}), "f").is_empty()
        };
        for ok in [
            "2024-02-29T12:00:00Z",
            "2023-01-01t00:00:00.123456789z",
            "2023-12-31T23:59:60-08:00",
        ] {
            assert!(f("date-time", ok), "{ok}");
        }
        for bad in [
            "2023-02-29T12:00:00Z",
            "2023-01-01",
            "2023-01-01T25:00:00Z",
            "2023-01-01T00:00:00",
            "2023-01-01T00:00:00.Z",
            "2023-01-01T00:00:00+0100",
            "x",
            "2023-13-01T00:00:00Z",
            "２０２３-01-01T00:00:00Z",
        ] {
            assert!(!f("date-time", bad), "{bad}");
        }
        assert_eq!(
            messages(&validate_value(
                &json!("x"),
                &json!({"type": "string", "format": "date-time"}),
                "f"
            )),
            vec![r#"f: Invalid value: "x": f in body must be of type date-time: "x""#]
        );
        for ok in ["", "aGVsbG8=", "aGk=", "YWJj", "YW\nJj"] {
            assert!(f("byte", ok), "{ok:?}");
        }
        for bad in ["aGVsbG8", "a===", "====", "aGk*", "aG=k"] {
            assert!(!f("byte", bad), "{bad:?}");
        }
        assert!(f("uri", "https://example.com/a?b=c"));
        assert!(!f("uri", "has space"));
        assert!(!f("uri", ""));
        assert!(f("date", "2024-02-29") && !f("date", "2023-02-29"));
        assert!(f("uuid", "123e4567-e89b-12d3-a456-426614174000") && !f("uuid", "123e4567"));
        assert!(f("ipv4", "10.0.0.1") && !f("ipv4", "10.0.0.256"));
        assert!(f("ipv6", "::1") && !f("ipv6", "1::2::3"));
        assert!(
            f("cidr", "10.0.0.0/8")
                && f("cidr", "fd00::/64")
                && !f("cidr", "10.0.0.0/33")
                && !f("cidr", "10.0.0.0")
        );
        assert!(f("some-unknown-format", "anything"));
    }

    #[test]
    fn arrays_and_list_types() {
        let mut o = good_vm();
        o["spec"]["tags"] = json!(["a", "b", "a", "c"]);
        o["spec"]["disks"] = json!([]);
        let m = messages(&validate(&o, &vm_schema()));
        assert!(
            m.contains(&"spec.tags: Too many: 4: must have at most 3 items".to_string()),
            "{m:?}"
        );
        assert!(
            m.contains(&r#"spec.tags[2]: Duplicate value: "a""#.to_string()),
            "{m:?}"
        );
        assert!(
            m.contains(
                &"spec.disks: Invalid value: []: spec.disks in body should have at least 1 items"
                    .to_string()
            ),
            "{m:?}"
        );

        o = good_vm();
        o["spec"]["disks"] = json!([{"name": "a"}, {"name": "b"}, {"name": "a", "sizeGiB": 0}]);
        let m = messages(&validate(&o, &vm_schema()));
        assert!(
            m.contains(&r#"spec.disks[2]: Duplicate value: {"name":"a"}"#.to_string()),
            "{m:?}"
        );
        assert!(m.contains(&"spec.disks[2].sizeGiB: Invalid value: 0: spec.disks[2].sizeGiB in body should be greater than or equal to 1".to_string()), "{m:?}");

        // uniqueItems compares numerically: 1 and 1.0 are duplicates
        let s = json!({"type": "array", "uniqueItems": true, "items": {"type": "number"}});
        assert_eq!(validate_value(&json!([1, 1.0]), &s, "a").len(), 1);
        assert!(validate_value(&json!([1, 2]), &s, "a").is_empty());
        // object elements compare regardless of key order
        let s = json!({"type": "array", "uniqueItems": true, "items": {"type": "object"}});
        assert_eq!(
            validate_value(&json!([{"a": 1, "b": 2}, {"b": 2, "a": 1}]), &s, "a").len(),
            1
        );
    }

    #[test]
    fn objects_maps_and_required() {
        let mut o = good_vm();
        o["spec"]["labels"] = json!({"a": "toolong", "b": "x", "c": 1});
        let m = messages(&validate(&o, &vm_schema()));
        assert!(
            m.contains(&"spec.labels: Too many: 3: must have at most 2 items".to_string()),
            "{m:?}"
        );
        assert!(
            m.contains(&"spec.labels[a]: Too long: may not be longer than 5".to_string()),
            "{m:?}"
        );
        assert!(m.contains(&r#"spec.labels[c]: Invalid value: "integer": spec.labels[c] in body must be of type string: "integer""#.to_string()), "{m:?}");
        let s = json!({"type": "object", "minProperties": 1});
        assert_eq!(
            messages(&validate_value(&json!({}), &s, "o")),
            vec!["o: Invalid value: {}: o in body should have at least 1 properties"]
        );
        let s = json!({"type": "object", "additionalProperties": false});
        assert_eq!(
            validate_value(&json!({"x": 1}), &s, "o")[0].kind,
            FieldErrorKind::Forbidden
        );
        // present-but-null satisfies `required`, then fails the type check
        let s =
            json!({"type": "object", "required": ["a"], "properties": {"a": {"type": "string"}}});
        let e = validate_value(&json!({"a": null}), &s, "o");
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].kind, FieldErrorKind::TypeInvalid);
    }

    #[test]
    fn metadata_and_embedded_resources() {
        let mut o = good_vm();
        o["metadata"]["name"] = json!("Web_1");
        o["metadata"]["whatever"] = json!({"deep": true});
        let e = validate(&o, &vm_schema());
        assert_eq!(e.len(), 1, "{:?}", messages(&e));
        assert_eq!(e[0].field, "metadata.name");
        assert!(e[0].message.starts_with(
            r#"metadata.name: Invalid value: "Web_1": a lowercase RFC 1123 subdomain"#
        ));
        o["metadata"]["name"] = json!("a".repeat(254));
        assert!(
            validate(&o, &vm_schema())[0]
                .message
                .ends_with("must be no more than 253 characters")
        );
        o["metadata"]["name"] = json!(7);
        assert_eq!(
            validate(&o, &vm_schema())[0].kind,
            FieldErrorKind::TypeInvalid
        );
        o["metadata"] = json!("nope");
        assert_eq!(validate(&o, &vm_schema())[0].field, "metadata");
        // metadata name restrictions declared by the CRD apply too
        let s = json!({"type": "object", "properties": {"metadata": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 3}}}}});
        assert_eq!(check_structural(&s), Vec::<String>::new());
        assert_eq!(
            messages(&validate(&json!({"metadata": {"name": "abcd"}}), &s)),
            vec!["metadata.name: Too long: may not be longer than 3"]
        );

        let mut o = good_vm();
        o["spec"]["template"] = json!({"metadata": {"name": "x"}, "spec": {}});
        let m = messages(&validate(&o, &vm_schema()));
        assert_eq!(
            m,
            vec![
                "spec.template.apiVersion: Required value: must not be empty",
                "spec.template.kind: Required value: must not be empty"
            ]
        );
        o["spec"]["template"] =
            json!({"apiVersion": "v1", "kind": 3, "metadata": {"name": "UPPER"}});
        let m = messages(&validate(&o, &vm_schema()));
        assert_eq!(m.len(), 2, "{m:?}");
        o["spec"]["template"] = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ok"}, "spec": {"x": 1}});
        assert!(validate(&o, &vm_schema()).is_empty());
    }

    #[test]
    fn junctors() {
        let s = json!({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
                       "oneOf": [{"required": ["a"]}, {"required": ["b"]}]});
        assert!(validate_value(&json!({"a": "x"}), &s, "o").is_empty());
        let m = messages(&validate_value(&json!({"a": "x", "b": "y"}), &s, "o"));
        assert_eq!(
            m,
            vec![
                r#"o: Invalid value: {"a":"x","b":"y"}: o in body must validate one and only one schema (oneOf)"#
            ]
        );
        let m = messages(&validate_value(&json!({}), &s, "o"));
        assert_eq!(
            m[0],
            "o: Invalid value: {}: o in body must validate one and only one schema (oneOf)"
        );
        assert_eq!(
            m[1], "o.a: Required value",
            "closest alternative explains why"
        );

        let s = json!({"type": "string", "anyOf": [{"pattern": "^a"}, {"pattern": "^b"}], "allOf": [{"maxLength": 3}], "not": {"enum": ["bad"]}});
        assert!(validate_value(&json!("abc"), &s, "s").is_empty());
        assert_eq!(
            validate_value(&json!("c"), &s, "s")[0].message,
            r#"s: Invalid value: "c": s in body must validate at least one schema (anyOf)"#
        );
        assert_eq!(
            validate_value(&json!("bcde"), &s, "s")[0].kind,
            FieldErrorKind::TooLong
        );
        let s = json!({"type": "string", "not": {"enum": ["bad"]}});
        assert_eq!(
            messages(&validate_value(&json!("bad"), &s, "s")),
            vec![r#"s: Invalid value: "bad": s in body must not validate the schema (not)"#]
        );
    }

    #[test]
    fn defaulting() {
        let mut o = good_vm();
        o["spec"]["disks"] =
            json!([{"name": "root"}, {"name": "data", "sizeGiB": 50, "bus": "scsi"}]);
        default(&mut o, &vm_schema());
        assert_eq!(o["spec"]["firmware"], "UEFI");
        assert_eq!(
            o["spec"]["disks"][0],
            json!({"name": "root", "sizeGiB": 10, "bus": "virtio"})
        );
        assert_eq!(
            o["spec"]["disks"][1],
            json!({"name": "data", "sizeGiB": 50, "bus": "scsi"})
        );
        // defaults inside a defaulted value are applied (top-down)
        assert_eq!(o["spec"]["net"], json!({"mode": "nat"}));
        assert!(o.get("status").is_none(), "no default, nothing invented");
        assert!(validate(&o, &vm_schema()).is_empty());

        // null replaced unless nullable
        let s = json!({"type": "object", "properties": {
            "a": {"type": "string", "default": "x"},
            "b": {"type": "string", "default": "y", "nullable": true},
            "c": {"type": "string", "default": null},
            "m": {"type": "object", "additionalProperties": {"type": "string", "default": "d"}},
            "l": {"type": "array", "items": {"type": "integer", "default": 7}}
        }});
        let mut o = json!({"a": null, "b": null, "m": {"k": null, "j": "set"}, "l": [1, null]});
        default(&mut o, &s);
        assert_eq!(
            o,
            json!({"a": "x", "b": null, "m": {"k": "d", "j": "set"}, "l": [1, 7]})
        );
        // bad shapes are left alone
        let mut o = json!("scalar");
        default(&mut o, &s);
        assert_eq!(o, json!("scalar"));
        let mut o = json!({"a": 1});
        default(&mut o, &json!("not a schema"));
        assert_eq!(o, json!({"a": 1}));
    }

    #[test]
    fn pruning() {
        let mut o = good_vm();
        o["spec"]["unknown"] = json!(1);
        o["spec"]["disks"][0]["junk"] = json!({"x": 1});
        o["spec"]["extra"] = json!({"anything": {"goes": 1}, "known": {"a": "k", "b": "pruned"}});
        o["spec"]["template"] = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "x": 1}, "spec": {"keep": 1}});
        o["metadata"]["annotations"] = json!({"a": "b"});
        o["status"] = json!({"phase": "Running", "bogus": true});
        o["topLevelJunk"] = json!(true);
        o["spec"]["labels"] = json!({"k": "v"});
        let mut pruned = prune(&mut o, &vm_schema());
        pruned.sort();
        assert_eq!(
            pruned,
            vec![
                "spec.disks[0].junk",
                "spec.extra.known.b",
                "spec.unknown",
                "status.bogus",
                "topLevelJunk"
            ]
        );
        assert_eq!(
            o["spec"]["extra"],
            json!({"anything": {"goes": 1}, "known": {"a": "k"}})
        );
        assert_eq!(o["spec"]["template"]["spec"], json!({"keep": 1}));
        assert_eq!(
            o["metadata"]["annotations"],
            json!({"a": "b"}),
            "root metadata never pruned"
        );
        assert_eq!(o["apiVersion"], "banlieue.io/v1");
        assert_eq!(o["spec"]["labels"], json!({"k": "v"}));

        // additionalProperties schema: values are pruned below the map key
        let s = json!({"type": "object", "properties": {"m": {"type": "object", "additionalProperties": {"type": "object", "properties": {"a": {"type": "string"}}}}}});
        let mut o = json!({"m": {"k": {"a": "x", "b": "y"}}});
        assert_eq!(prune(&mut o, &s), vec!["m[k].b"]);
        // additionalProperties: true keeps everything
        let s = json!({"type": "object", "additionalProperties": true});
        let mut o = json!({"a": {"b": 1}});
        assert!(prune(&mut o, &s).is_empty());
        // array without schema items under preserve-unknown-fields is kept
        let s = json!({"type": "object", "properties": {"a": {"type": "array", "x-kubernetes-preserve-unknown-fields": true}}});
        let mut o = json!({"a": [{"x": 1}]});
        assert!(prune(&mut o, &s).is_empty());
        // non-schema input: everything below the root goes, no panic
        let mut o = json!({"a": 1, "kind": "K"});
        assert_eq!(prune(&mut o, &json!(42)), vec!["a"]);
    }

    #[test]
    fn structural_checks() {
        let bad = |s: Value, needle: &str| {
            let errs = check_structural(&s);
            assert!(
                errs.iter().any(|e| e.contains(needle)),
                "expected {needle:?} in {errs:?}"
            );
        };
        bad(
            json!({"type": "object", "properties": {"spec": {"properties": {}}}}),
            "openAPIV3Schema.properties[spec].type: Required value",
        );
        bad(
            json!({"type": "string"}),
            "openAPIV3Schema.type: Invalid value: \"string\": must be object at the root",
        );
        bad(
            json!({"type": "object", "properties": {"a": {"$ref": "#/x", "type": "string"}}}),
            "properties[a].$ref: Forbidden",
        );
        bad(
            json!({"type": "object", "properties": {"a": {"type": "strin"}}}),
            "properties[a].type: Unsupported value: \"strin\"",
        );
        bad(
            json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "(?=x)"}}}),
            "properties[a].pattern: Invalid value",
        );
        bad(
            json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "(unclosed"}}}),
            "pattern: Invalid value",
        );
        bad(
            json!({"type": "object", "properties": {"a": {"type": "array"}}}),
            "properties[a].items: Required value",
        );
        bad(
            json!({"type": "object", "properties": {"a": {"type": "array", "items": [{"type": "string"}]}}}),
            "items must be a schema object",
        );
        bad(
            json!({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string"}, "uniqueItems": true}}}),
            "uniqueItems: Forbidden",
        );
        bad(
            json!({"type": "object", "properties": {"a": {"type": "object", "properties": {"x": {"type": "string"}}, "additionalProperties": {"type": "string"}}}}),
            "mutual exclusive",
        );
        bad(
            json!({"type": "object", "properties": {"a": {"type": "string", "anyOf": [{"type": "string"}]}}}),
            "anyOf[0].type: Forbidden",
        );
        bad(
            json!({"type": "object", "properties": {"a": {"type": "object", "anyOf": [{"properties": {"z": {"minLength": 1}}}]}}}),
            "anyOf[0].properties[z]: Forbidden",
        );
        bad(
            json!({"type": "object", "properties": {"a": {"type": "string", "allOf": [{"default": "x"}]}}}),
            "allOf[0].default: Forbidden",
        );
        bad(
            json!({"type": "object", "properties": {"a": {"type": "integer", "minimum": 1, "default": 0}}}),
            "properties[a].default: Invalid value: 0: default in body should be greater than or equal to 1",
        );
        bad(
            json!({"type": "object", "properties": {"a": {"type": "object", "default": {"zz": 1}}}}),
            "must not have unknown fields: zz",
        );
        bad(
            json!({"type": "object", "properties": {"a": {"type": "string", "x-kubernetes-int-or-string": true}}}),
            "must be empty if x-kubernetes-int-or-string",
        );
        bad(
            json!({"type": "object", "properties": {"a": {"type": "string", "x-kubernetes-embedded-resource": true}}}),
            "must be object if x-kubernetes-embedded-resource",
        );
        bad(
            json!({"type": "object", "properties": {"a": {"type": "object", "x-kubernetes-embedded-resource": true}}}),
            "x-kubernetes-preserve-unknown-fields: Required value",
        );
        bad(
            json!({"type": "object", "properties": {"metadata": {"type": "object", "properties": {"labels": {"type": "object"}}}}}),
            "properties[metadata].properties[labels]: Forbidden",
        );
        bad(
            json!({"type": "object", "properties": {"metadata": {"type": "object", "properties": {"name": {"type": "string", "default": "x"}}}}}),
            "default: Forbidden",
        );
        bad(
            json!({"type": "object", "properties": {"l": {"type": "array", "x-kubernetes-list-type": "map", "items": {"type": "object"}}}}),
            "x-kubernetes-list-map-keys: Required value",
        );
        bad(
            json!({"type": "object", "properties": {"l": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["k"], "items": {"type": "object", "properties": {"k": {"type": "string"}}}}}}),
            "must be required or have a default",
        );
        bad(
            json!({"type": "object", "properties": {"l": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "object"}}}}),
            "x-kubernetes-list-type: Invalid value: \"set\"",
        );
        bad(
            json!({"type": "object", "properties": {"l": {"type": "array", "x-kubernetes-list-type": "bag", "items": {"type": "string"}}}}),
            "x-kubernetes-list-type: Unsupported value: \"bag\"",
        );
        bad(
            json!({"type": "object", "properties": {"l": {"type": "array", "x-kubernetes-list-map-keys": ["k"], "items": {"type": "string"}}}}),
            "must not be set if x-kubernetes-list-type is not map",
        );
        bad(
            json!({"type": "object", "properties": {"m": {"type": "string", "x-kubernetes-map-type": "atomic"}}}),
            "x-kubernetes-map-type: Invalid value",
        );
        bad(
            json!({"type": "object", "properties": {"a": {"type": "integer", "minimum": "1", "maxLength": -1, "multipleOf": 0}}}),
            "minimum: Invalid value",
        );
        bad(
            json!({"type": "object", "properties": {"a": {"type": "integer", "multipleOf": 0}}}),
            "multipleOf: Invalid value: 0: must be greater than zero",
        );
        bad(
            json!({"type": "object", "properties": {"a": "string"}}),
            "properties[a]: Invalid value: \"string\": must be a schema object",
        );
        bad(
            json!({"type": "object", "properties": {"a": {"type": "string", "nullable": "yes"}}}),
            "nullable: Invalid value",
        );
        bad(
            json!({"type": "object", "properties": {"a": {"type": "string", "enum": "x", "required": [1]}}}),
            "enum: Invalid value",
        );
        bad(json!("nope"), "openAPIV3Schema: Invalid value");

        // accepted idioms
        let ok = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true, "properties": {
            "q": {"x-kubernetes-int-or-string": true, "anyOf": [{"type": "integer"}, {"type": "string"}], "pattern": "^[0-9]+(Gi|Mi)?$"},
            "free": {"x-kubernetes-preserve-unknown-fields": true},
            "s": {"type": "string", "anyOf": [{"pattern": "^a"}, {"enum": ["b"]}], "not": {"maxLength": 0}, "x-kubernetes-validations": [{"rule": "self != ''"}]},
            "o": {"type": "object", "properties": {"x": {"type": "integer"}}, "oneOf": [{"required": ["x"]}, {"properties": {"x": {"minimum": 5}}}]},
            "l": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name", "proto"],
                  "items": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}, "proto": {"type": "string", "default": "TCP"}}}},
            "m": {"type": "object", "x-kubernetes-map-type": "atomic", "additionalProperties": {"type": "string"}},
            "e": {"type": "object", "x-kubernetes-embedded-resource": true, "properties": {"apiVersion": {"type": "string"}}},
            "d": {"type": "object", "default": {"x": 1}, "properties": {"x": {"type": "integer"}}}
        }});
        assert_eq!(check_structural(&ok), Vec::<String>::new());
    }

    #[test]
    fn status_messages() {
        let e1 = FieldError::new(
            "spec.cpus",
            FieldErrorKind::Invalid,
            Some("0".into()),
            "spec.cpus in body should be greater than or equal to 1",
        );
        let e2 = FieldError::new(
            "spec.x",
            FieldErrorKind::Required,
            Some("ignored".into()),
            "",
        );
        assert_eq!(
            status_message(
                std::slice::from_ref(&e1),
                "VirtualMachine.banlieue.io",
                "web"
            ),
            r#"VirtualMachine.banlieue.io "web" is invalid: spec.cpus: Invalid value: 0: spec.cpus in body should be greater than or equal to 1"#
        );
        assert_eq!(
            status_message(&[e1, e2], "VirtualMachine.banlieue.io", "web"),
            r#"VirtualMachine.banlieue.io "web" is invalid: [spec.cpus: Invalid value: 0: spec.cpus in body should be greater than or equal to 1, spec.x: Required value]"#
        );
        assert_eq!(status_message(&[], "K.g", "n"), r#"K.g "n" is invalid"#);
    }

    fn nested_schema(depth: usize) -> Value {
        let mut s = json!({"type": "string"});
        for _ in 0..depth {
            s = json!({"type": "object", "properties": {"a": s}});
        }
        s
    }

    fn nested_value(depth: usize) -> Value {
        let mut v = json!("leaf");
        for _ in 0..depth {
            v = json!({"a": v});
        }
        v
    }

    #[test]
    fn depth_cap_and_error_cap() {
        let s = nested_schema(100);
        assert!(
            check_structural(&s)
                .iter()
                .any(|e| e.contains("maximum nesting depth"))
        );
        let errs = validate(&nested_value(100), &s);
        assert_eq!(errs.len(), 1);
        assert!(
            errs[0].message.contains("maximum nesting depth"),
            "{:?}",
            errs[0]
        );
        let mut v = nested_value(100);
        default(&mut v, &s);
        prune(&mut v, &s);
        // within the cap everything works
        assert!(check_structural(&nested_schema(30)).is_empty());
        assert!(validate(&nested_value(30), &nested_schema(30)).is_empty());

        let s = json!({"type": "object", "properties": {"l": {"type": "array", "items": {"type": "string"}}}});
        let v = json!({"l": vec![1; 500]});
        assert_eq!(validate(&v, &s).len(), MAX_ERRORS);
    }

    #[test]
    fn odd_inputs_never_panic() {
        let values = vec![
            Value::Null,
            json!(true),
            json!(0),
            json!(-1),
            json!(1.5),
            json!(u64::MAX),
            json!(f64::MAX),
            json!(""),
            json!("x"),
            json!([]),
            json!([null, 1, "a", [], {}]),
            json!({}),
            json!({"metadata": null, "spec": null}),
            json!({"metadata": {"name": ""}, "apiVersion": 1, "kind": [], "spec": {"disks": [null, 1, {"name": null}], "labels": [], "tags": {}}}),
            nested_value(200),
        ];
        let schemas = vec![
            vm_schema(),
            Value::Null,
            json!(1),
            json!("object"),
            json!([]),
            json!({}),
            json!({"type": 5}),
            json!({"type": "object", "properties": 3, "required": "x", "additionalProperties": 3, "items": 1}),
            json!({"type": "array", "items": "x", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": 4}),
            json!({"type": "array", "items": {"type": "object"}, "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": [1, "k", "k"]}),
            json!({"type": "number", "minimum": "a", "maximum": null, "multipleOf": -1, "format": 3}),
            json!({"type": "integer", "multipleOf": 0}),
            json!({"type": "string", "minLength": -1, "maxLength": 1.5, "pattern": "[", "enum": {}}),
            json!({"anyOf": 1, "oneOf": [], "allOf": [1, null], "not": 5}),
            json!({"anyOf": [{"anyOf": [{"not": {}}]}]}),
            json!({"type": "object", "properties": {"metadata": 1}}),
            json!({"type": "object", "properties": {"metadata": {"type": "string", "properties": {"name": 1}}}}),
            nested_schema(200),
        ];
        for s in &schemas {
            let _ = check_structural(s);
            for v in &values {
                let _ = validate(v, s);
                let _ = validate_value(v, s, "");
                let mut d = v.clone();
                default(&mut d, s);
                let mut p = v.clone();
                let _ = prune(&mut p, s);
            }
        }
    }
}
