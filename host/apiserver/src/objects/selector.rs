//! Label selectors (string syntax and metav1.LabelSelector objects) and field
//! selectors, with Kubernetes' matching semantics.

use serde_json::{Map, Value};
use std::borrow::Cow;
use std::fmt;

use crate::storage::object::Object;

/// Longest selector string we parse; real selectors are tiny.
const MAX_LEN: usize = 64 * 1024;

// ---------------------------------------------------------------------------
// label key / value syntax
// ---------------------------------------------------------------------------

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, the shape shared by label
/// names and non-empty label values.
fn is_label_token(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        })
}

/// Validates a label key (`[prefix/]name`); the error says why.
pub fn validate_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        if p.is_empty() {
            return Err(format!(
                "invalid label key {key:?}: prefix part must be non-empty"
            ));
        }
        if p.len() > 253 {
            return Err(format!(
                "invalid label key {key:?}: prefix part must be no more than 253 characters"
            ));
        }
        if !is_dns_subdomain(p) {
            return Err(format!(
                "invalid label key {key:?}: prefix part must be a lowercase RFC 1123 subdomain"
            ));
        }
    }
    if name.is_empty() {
        return Err(format!(
            "invalid label key {key:?}: name part must be non-empty"
        ));
    }
    if name.len() > 63 {
        return Err(format!(
            "invalid label key {key:?}: name part must be no more than 63 characters"
        ));
    }
    if !is_label_token(name) {
        return Err(format!(
            "invalid label key {key:?}: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        ));
    }
    Ok(())
}

/// Validates a label value (may be empty).
pub fn validate_label_value(v: &str) -> Result<(), String> {
    if v.len() > 63 {
        return Err(format!(
            "invalid label value {v:?}: must be no more than 63 characters"
        ));
    }
    if !v.is_empty() && !is_label_token(v) {
        return Err(format!(
            "invalid label value {v:?}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// label selectors
// ---------------------------------------------------------------------------

/// What a label selector reads: an object's labels.
pub trait Labels {
    /// The value of a label; one that is not a string reads as its JSON text.
    fn label(&self, key: &str) -> Option<Cow<'_, str>>;
}

/// A `metadata.labels` map.
impl Labels for Map<String, Value> {
    fn label(&self, key: &str) -> Option<Cow<'_, str>> {
        self.get(key).map(|v| v.as_str().map_or_else(|| Cow::Owned(v.to_string()), Cow::Borrowed))
    }
}

/// A stored object's labels, from its index.
impl Labels for Object {
    fn label(&self, key: &str) -> Option<Cow<'_, str>> {
        Object::label(self, key).map(Cow::Borrowed)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator {
    Equals,
    NotEquals,
    In,
    NotIn,
    Exists,
    DoesNotExist,
    /// `key>N`: label present and an integer greater than N.
    GreaterThan,
    /// `key<N`: label present and an integer less than N.
    LessThan,
}

/// One `key op values` term; all terms of a selector must match (AND).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    pub op: Operator,
    /// Sorted and de-duplicated, as Kubernetes stores them.
    pub values: Vec<String>,
}

impl Requirement {
    /// Builds a requirement after the same checks as Kubernetes' NewRequirement.
    pub fn new(key: &str, op: Operator, values: Vec<String>) -> Result<Self, String> {
        validate_label_key(key)?;
        match op {
            Operator::In | Operator::NotIn if values.is_empty() => {
                return Err(format!(
                    "key {key:?}: for 'in', 'notin' operators, values set can't be empty"
                ));
            }
            Operator::Equals | Operator::NotEquals if values.len() != 1 => {
                return Err(format!(
                    "key {key:?}: exact-match compatibility requires one single value"
                ));
            }
            Operator::Exists | Operator::DoesNotExist if !values.is_empty() => {
                return Err(format!(
                    "key {key:?}: values set must be empty for exists and does not exist"
                ));
            }
            Operator::GreaterThan | Operator::LessThan
                if (values.len() != 1 || values[0].parse::<i64>().is_err()) =>
            {
                return Err(format!(
                    "key {key:?}: for 'Gt', 'Lt' operators, the value must be a single integer"
                ));
            }
            _ => {}
        }
        if !matches!(op, Operator::GreaterThan | Operator::LessThan) {
            for v in &values {
                validate_label_value(v)?;
            }
        }
        let mut values = values;
        values.sort();
        values.dedup();
        Ok(Requirement {
            key: key.to_string(),
            op,
            values,
        })
    }

    pub fn matches(&self, labels: &(impl Labels + ?Sized)) -> bool {
        let val = labels.label(&self.key);
        let has = |v: &Cow<str>| self.values.iter().any(|x| x == v);
        match self.op {
            Operator::Exists => val.is_some(),
            Operator::DoesNotExist => val.is_none(),
            Operator::Equals | Operator::In => val.as_ref().is_some_and(has),
            Operator::NotEquals | Operator::NotIn => !val.as_ref().is_some_and(has),
            Operator::GreaterThan | Operator::LessThan => {
                let (Some(v), Some(limit)) = (
                    val.and_then(|v| v.parse::<i64>().ok()),
                    self.values.first().and_then(|x| x.parse::<i64>().ok()),
                ) else {
                    return false;
                };
                if self.op == Operator::GreaterThan {
                    v > limit
                } else {
                    v < limit
                }
            }
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let k = &self.key;
        let first = self.values.first().map(String::as_str).unwrap_or("");
        match self.op {
            Operator::Exists => write!(f, "{k}"),
            Operator::DoesNotExist => write!(f, "!{k}"),
            Operator::Equals => write!(f, "{k}={first}"),
            Operator::NotEquals => write!(f, "{k}!={first}"),
            Operator::GreaterThan => write!(f, "{k}>{first}"),
            Operator::LessThan => write!(f, "{k}<{first}"),
            Operator::In => write!(f, "{k} in ({})", self.values.join(",")),
            Operator::NotIn => write!(f, "{k} notin ({})", self.values.join(",")),
        }
    }
}

/// A parsed label selector: the AND of its requirements. The empty selector
/// matches everything; `LabelSelector::nothing()` (a null metav1 selector)
/// matches nothing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSelector {
    reqs: Vec<Requirement>,
    nothing: bool,
}

impl LabelSelector {
    pub fn everything() -> Self {
        Self::default()
    }
    pub fn nothing() -> Self {
        LabelSelector {
            reqs: Vec::new(),
            nothing: true,
        }
    }
    pub fn requirements(&self) -> &[Requirement] {
        &self.reqs
    }
    pub fn matches(&self, labels: &(impl Labels + ?Sized)) -> bool {
        !self.nothing && self.reqs.iter().all(|r| r.matches(labels))
    }
    /// True when the selector matches everything.
    pub fn is_empty(&self) -> bool {
        !self.nothing && self.reqs.is_empty()
    }
    fn from_reqs(mut reqs: Vec<Requirement>) -> Self {
        // canonical order, like labels.Selector's String()
        reqs.sort_by(|a, b| a.key.cmp(&b.key));
        LabelSelector {
            reqs,
            nothing: false,
        }
    }
}

impl fmt::Display for LabelSelector {
    /// Canonical string form (`a=b,c in (x,y)`), reparseable by
    /// `parse_label_selector`. The match-nothing selector prints as empty.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.reqs.iter().map(ToString::to_string).collect();
        write!(f, "{}", parts.join(","))
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Bang,
    Eq,
    DoubleEq,
    NotEq,
    Gt,
    Lt,
    Comma,
    Open,
    Close,
}

fn lex(s: &str) -> Result<Vec<Tok>, String> {
    let mut out = Vec::new();
    let mut it = s.chars().peekable();
    while let Some(&c) = it.peek() {
        match c {
            c if c.is_whitespace() => {
                it.next();
            }
            '!' => {
                it.next();
                if it.peek() == Some(&'=') {
                    it.next();
                    out.push(Tok::NotEq);
                } else {
                    out.push(Tok::Bang);
                }
            }
            '=' => {
                it.next();
                if it.peek() == Some(&'=') {
                    it.next();
                    out.push(Tok::DoubleEq);
                } else {
                    out.push(Tok::Eq);
                }
            }
            '>' | '<' | ',' | '(' | ')' => {
                it.next();
                out.push(match c {
                    '>' => Tok::Gt,
                    '<' => Tok::Lt,
                    ',' => Tok::Comma,
                    '(' => Tok::Open,
                    _ => Tok::Close,
                });
            }
            _ => {
                let mut id = String::new();
                while let Some(&c) = it.peek() {
                    if c.is_whitespace() || "!=<>,()".contains(c) {
                        break;
                    }
                    id.push(c);
                    it.next();
                }
                out.push(Tok::Ident(id));
            }
        }
    }
    Ok(out)
}

/// Parses the string syntax: `a=b`, `a==b`, `a!=b`, `a in (x,y)`,
/// `a notin (x,y)`, `a`, `!a`, `a>1`, `a<1`, comma separated (AND).
/// An empty or all-whitespace string selects everything.
pub fn parse_label_selector(s: &str) -> Result<LabelSelector, String> {
    if s.len() > MAX_LEN {
        return Err(format!("label selector longer than {MAX_LEN} bytes"));
    }
    let toks = lex(s)?;
    let mut i = 0;
    let mut reqs = Vec::new();
    let err = |what: &str, at: Option<&Tok>| {
        format!(
            "unable to parse requirement: found {}, expected: {what}",
            at.map_or("end of input".to_string(), |t| format!("{t:?}"))
        )
    };
    if toks.is_empty() {
        return Ok(LabelSelector::everything());
    }
    loop {
        // one requirement
        let negated = toks.get(i) == Some(&Tok::Bang);
        if negated {
            i += 1;
        }
        let key = match toks.get(i) {
            Some(Tok::Ident(k)) => k.clone(),
            other => return Err(err("identifier", other)),
        };
        i += 1;
        let at_end = matches!(toks.get(i), None | Some(Tok::Comma));
        let req = if negated {
            if !at_end {
                return Err(err("',' or end of input after '!key'", toks.get(i)));
            }
            Requirement::new(&key, Operator::DoesNotExist, vec![])?
        } else if at_end {
            Requirement::new(&key, Operator::Exists, vec![])?
        } else {
            let op = match toks.get(i) {
                Some(Tok::Eq) | Some(Tok::DoubleEq) => Operator::Equals,
                Some(Tok::NotEq) => Operator::NotEquals,
                Some(Tok::Gt) => Operator::GreaterThan,
                Some(Tok::Lt) => Operator::LessThan,
                Some(Tok::Ident(w)) if w == "in" => Operator::In,
                Some(Tok::Ident(w)) if w == "notin" => Operator::NotIn,
                other => return Err(err("'=', '==', '!=', '>', '<', 'in' or 'notin'", other)),
            };
            i += 1;
            let values = if matches!(op, Operator::In | Operator::NotIn) {
                if toks.get(i) != Some(&Tok::Open) {
                    return Err(err("'('", toks.get(i)));
                }
                i += 1;
                // `(a,b)`; an empty slot counts as the empty value, as in Kubernetes
                let mut vals = Vec::new();
                let mut expect_value = true;
                loop {
                    match toks.get(i) {
                        Some(Tok::Ident(v)) if expect_value => {
                            vals.push(v.clone());
                            expect_value = false;
                        }
                        Some(Tok::Comma) => {
                            if expect_value {
                                vals.push(String::new());
                            }
                            expect_value = true;
                        }
                        Some(Tok::Close) => {
                            if expect_value {
                                vals.push(String::new());
                            }
                            i += 1;
                            break;
                        }
                        other => return Err(err("a value, ',' or ')'", other)),
                    }
                    i += 1;
                }
                vals
            } else {
                match toks.get(i) {
                    Some(Tok::Ident(v)) => {
                        i += 1;
                        vec![v.clone()]
                    }
                    // `a=` selects the empty value
                    None | Some(Tok::Comma)
                        if matches!(op, Operator::Equals | Operator::NotEquals) =>
                    {
                        vec![String::new()]
                    }
                    other => return Err(err("a value", other)),
                }
            };
            Requirement::new(&key, op, values)?
        };
        reqs.push(req);
        match toks.get(i) {
            None => break,
            Some(Tok::Comma) => {
                i += 1;
                if i >= toks.len() {
                    return Err(err("identifier after ','", None));
                }
            }
            other => return Err(err("',' or end of input", other)),
        }
    }
    Ok(LabelSelector::from_reqs(reqs))
}

/// Converts a metav1.LabelSelector object (`{matchLabels, matchExpressions}`).
/// `null` gives the match-nothing selector and `{}` the match-everything
/// one, as `metav1.LabelSelectorAsSelector` does.
pub fn label_selector_from_object(v: &Value) -> Result<LabelSelector, String> {
    let m = match v {
        Value::Null => return Ok(LabelSelector::nothing()),
        Value::Object(m) => m,
        _ => return Err("label selector must be an object".to_string()),
    };
    let mut reqs = Vec::new();
    match m.get("matchLabels") {
        None | Some(Value::Null) => {}
        Some(Value::Object(ml)) => {
            for (k, val) in ml {
                let Some(s) = val.as_str() else {
                    return Err(format!("matchLabels[{k}]: value must be a string"));
                };
                reqs.push(Requirement::new(k, Operator::Equals, vec![s.to_string()])?);
            }
        }
        Some(_) => return Err("matchLabels must be an object".to_string()),
    }
    match m.get("matchExpressions") {
        None | Some(Value::Null) => {}
        Some(Value::Array(exprs)) => {
            for (i, e) in exprs.iter().enumerate() {
                let Some(e) = e.as_object() else {
                    return Err(format!("matchExpressions[{i}] must be an object"));
                };
                let key = e
                    .get("key")
                    .and_then(Value::as_str)
                    .ok_or(format!("matchExpressions[{i}].key: must be a string"))?;
                let op = match e.get("operator").and_then(Value::as_str) {
                    Some("In") => Operator::In,
                    Some("NotIn") => Operator::NotIn,
                    Some("Exists") => Operator::Exists,
                    Some("DoesNotExist") => Operator::DoesNotExist,
                    Some(other) => {
                        return Err(format!("{other:?} is not a valid label selector operator"));
                    }
                    None => {
                        return Err(format!("matchExpressions[{i}].operator: must be a string"));
                    }
                };
                let values = match e.get("values") {
                    None | Some(Value::Null) => Vec::new(),
                    Some(Value::Array(a)) => a
                        .iter()
                        .map(|x| {
                            x.as_str()
                                .map(str::to_string)
                                .ok_or(format!("matchExpressions[{i}].values: must be strings"))
                        })
                        .collect::<Result<Vec<_>, _>>()?,
                    Some(_) => {
                        return Err(format!("matchExpressions[{i}].values: must be an array"));
                    }
                };
                reqs.push(Requirement::new(key, op, values)?);
            }
        }
        Some(_) => return Err("matchExpressions must be an array".to_string()),
    }
    Ok(LabelSelector::from_reqs(reqs))
}

// ---------------------------------------------------------------------------
// field selectors
// ---------------------------------------------------------------------------

/// One `field=value` / `field!=value` term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldRequirement {
    pub field: String,
    pub negated: bool,
    pub value: String,
}

/// A parsed field selector: the AND of its terms; empty matches everything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FieldSelector(Vec<FieldRequirement>);

impl FieldSelector {
    pub fn requirements(&self) -> &[FieldRequirement] {
        &self.0
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn matches(&self, obj: &(impl Fields + ?Sized)) -> bool {
        self.0.iter().all(|r| (obj.field(&r.field) == r.value) != r.negated)
    }
}

/// What a field selector reads: an object's fields by dotted path (`metadata.name`,
/// `type`, `spec.nodeName`). A missing or null field reads as "" as in Kubernetes'
/// field sets, one that is not a string as its JSON text.
pub trait Fields {
    fn field(&self, path: &str) -> Cow<'_, str>;
}

impl Fields for Value {
    fn field(&self, path: &str) -> Cow<'_, str> {
        let mut cur = self;
        for part in path.split('.') {
            match cur.get(part) {
                Some(v) => cur = v,
                None => return Cow::Borrowed(""),
            }
        }
        field_text(cur)
    }
}

/// A stored object: name and namespace from its index, other fields read from its
/// text without parsing the rest.
impl Fields for Object {
    fn field(&self, path: &str) -> Cow<'_, str> {
        match path {
            "metadata.name" => Cow::Borrowed(self.name()),
            "metadata.namespace" => Cow::Borrowed(self.namespace()),
            _ => {
                let parts: Vec<&str> = path.split('.').collect();
                self.pointer(&parts).map_or(Cow::Borrowed(""), |v| Cow::Owned(field_text(&v).into_owned()))
            }
        }
    }
}

fn field_text(v: &Value) -> Cow<'_, str> {
    match v {
        Value::Null => Cow::Borrowed(""),
        Value::String(s) => Cow::Borrowed(s),
        other => Cow::Owned(other.to_string()),
    }
}

/// Splits on unescaped commas, keeping escapes for the value unescaper.
fn split_terms(s: &str) -> Vec<String> {
    let mut terms = Vec::new();
    let mut cur = String::new();
    let mut escaped = false;
    for c in s.chars() {
        if escaped {
            cur.push(c);
            escaped = false;
        } else if c == '\\' {
            cur.push(c);
            escaped = true;
        } else if c == ',' {
            terms.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    terms.push(cur);
    terms
}

/// `\\`, `\,` and `\=` are the only escapes field selector values allow.
fn unescape(v: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut it = v.chars();
    while let Some(c) = it.next() {
        if c == '\\' {
            match it.next() {
                Some(e @ ('\\' | ',' | '=')) => out.push(e),
                Some(e) => {
                    return Err(format!(
                        "invalid field selector value {v:?}: invalid escape sequence '\\{e}'"
                    ));
                }
                None => {
                    return Err(format!(
                        "invalid field selector value {v:?}: trailing backslash"
                    ));
                }
            }
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

/// Parses `a=b`, `a==b`, `a!=b`, comma separated. Fields outside `allowed`
/// are refused with "field label not supported: x".
pub fn parse_field_selector(s: &str, allowed: &[&str]) -> Result<FieldSelector, String> {
    if s.len() > MAX_LEN {
        return Err(format!("field selector longer than {MAX_LEN} bytes"));
    }
    let mut reqs = Vec::new();
    for term in split_terms(s) {
        if term.trim().is_empty() {
            continue; // Kubernetes skips empty terms such as a trailing comma
        }
        // the first unescaped operator splits the term
        let chars: Vec<(usize, char)> = term.char_indices().collect();
        let mut found = None;
        let mut k = 0;
        while k < chars.len() {
            let (pos, c) = chars[k];
            if c == '\\' {
                k += 2;
                continue;
            }
            let rest = &term[pos..];
            if rest.starts_with("!=") {
                found = Some((pos, 2, true));
            } else if rest.starts_with("==") {
                found = Some((pos, 2, false));
            } else if rest.starts_with('=') {
                found = Some((pos, 1, false));
            }
            if found.is_some() {
                break;
            }
            k += 1;
        }
        let Some((pos, len, negated)) = found else {
            return Err(format!(
                "invalid selector: '{s}'; can't understand '{term}'"
            ));
        };
        let field = term[..pos].trim();
        if field.is_empty() {
            return Err(format!(
                "invalid selector: '{s}'; field name is empty in '{term}'"
            ));
        }
        if !allowed.contains(&field) {
            return Err(format!("field label not supported: {field}"));
        }
        let value = unescape(term[pos + len..].trim())?;
        reqs.push(FieldRequirement {
            field: field.to_string(),
            negated,
            value,
        });
    }
    Ok(FieldSelector(reqs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    fn sel(s: &str) -> LabelSelector {
        parse_label_selector(s).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    #[test]
    fn label_selector_syntax_and_matching() {
        let l = labels(
            json!({"app": "web", "tier": "front", "example.com/team": "a-b_c.d", "n": "5", "empty": ""}),
        );
        let yes = [
            "",
            "  ",
            "app=web",
            "app==web",
            "app = web",
            "tier!=back",
            "missing!=x",
            "app in (web,db)",
            "app in ( web , db )",
            "app notin (db)",
            "missing notin (x)",
            "app",
            "!missing",
            "app=web,tier=front",
            " app , !missing ",
            "example.com/team=a-b_c.d",
            "n>4",
            "n<6",
            "empty=",
            "empty in (,x)",
            "empty in ()",
        ];
        for s in yes {
            assert!(sel(s).matches(&l), "{s:?} should match");
        }
        let no = [
            "app=db",
            "app!=web",
            "missing=x",
            "missing",
            "!app",
            "app in (db)",
            "app notin (web,db)",
            "app=web,tier=back",
            "n>5",
            "n<5",
            "app>1",
            "missing>1",
            "empty=x",
            "missing in (x)",
        ];
        for s in no {
            assert!(!sel(s).matches(&l), "{s:?} should not match");
        }
        assert!(sel("").is_empty());
        assert!(sel("empty==").matches(&l), "a== selects the empty value");
        assert!(!sel("a").is_empty());
        // canonical string form round-trips
        let s = sel("z=1, a in (y,x,x), !b, c, d!=2, e notin (q), n>3");
        assert_eq!(s.to_string(), "a in (x,y),!b,c,d!=2,e notin (q),n>3,z=1");
        assert_eq!(parse_label_selector(&s.to_string()).unwrap(), s);
        assert_eq!(s.requirements().len(), 7);
        // non-string label values are compared by JSON text, never panic
        assert!(sel("x=1").matches(&labels(json!({"x": 1}))));
    }

    #[test]
    fn label_selector_errors() {
        let too_long_name = format!("{}=x", "a".repeat(64));
        let too_long_value = format!("a={}", "v".repeat(64));
        let too_long_prefix = format!("{}/a", "p".repeat(254));
        for bad in [
            "=",
            "a=b=c",
            "a===",
            "!",
            "!a=b",
            "a,",
            ",a",
            "a,,b",
            "a in",
            "a in (",
            "a in (x",
            "a in x",
            "a notin",
            "a in (x y)",
            "a (x)",
            "a b",
            "a=b c",
            "-a=b",
            "a-=b",
            "a=-b",
            "a=b-",
            "a/b/c=d",
            "/a=b",
            "a/=b",
            "A.com/x=y",
            "a>b",
            "a<",
            "a>1.5",
            "a)",
            "(a)",
            "a=(b)",
            "a!b",
            too_long_name.as_str(),
            too_long_value.as_str(),
            too_long_prefix.as_str(),
            "ünïcode=x",
            "a=ü",
        ] {
            assert!(
                parse_label_selector(bad).is_err(),
                "{bad:?} should fail: {:?}",
                parse_label_selector(bad)
            );
        }
        assert!(parse_label_selector(&"a,".repeat(40000)).is_err());
        // 63 chars is fine
        assert!(parse_label_selector(&format!("{}={}", "a".repeat(63), "b".repeat(63))).is_ok());
    }

    #[test]
    fn label_selector_objects() {
        let l = labels(json!({"app": "web", "tier": "front"}));
        let s = label_selector_from_object(&json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["front", "mid"]},
                {"key": "legacy", "operator": "DoesNotExist"},
                {"key": "app", "operator": "Exists", "values": []},
                {"key": "tier", "operator": "NotIn", "values": ["back"]}
            ]
        }))
        .unwrap();
        assert!(s.matches(&l));
        assert!(!s.matches(&labels(json!({"app": "web", "tier": "back"}))));
        let all = label_selector_from_object(&json!({})).unwrap();
        assert!(all.is_empty() && all.matches(&l));
        let all =
            label_selector_from_object(&json!({"matchLabels": null, "matchExpressions": null}))
                .unwrap();
        assert!(all.is_empty());
        let none = label_selector_from_object(&Value::Null).unwrap();
        assert!(!none.is_empty() && !none.matches(&l) && !none.matches(&Map::new()));

        for bad in [
            json!(1),
            json!("app=web"),
            json!([]),
            json!({"matchLabels": []}),
            json!({"matchLabels": {"app": 1}}),
            json!({"matchLabels": {"bad key": "x"}}),
            json!({"matchLabels": {"a": "bad value"}}),
            json!({"matchExpressions": {}}),
            json!({"matchExpressions": [1]}),
            json!({"matchExpressions": [{"operator": "Exists"}]}),
            json!({"matchExpressions": [{"key": "a"}]}),
            json!({"matchExpressions": [{"key": "a", "operator": "Equals", "values": ["x"]}]}),
            json!({"matchExpressions": [{"key": "a", "operator": "In"}]}),
            json!({"matchExpressions": [{"key": "a", "operator": "In", "values": []}]}),
            json!({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}),
            json!({"matchExpressions": [{"key": "a", "operator": "In", "values": "x"}]}),
            json!({"matchExpressions": [{"key": "a", "operator": "In", "values": [1]}]}),
        ] {
            assert!(
                label_selector_from_object(&bad).is_err(),
                "{bad} should fail"
            );
        }
    }

    #[test]
    fn requirement_constructor_errors() {
        assert!(Requirement::new("a", Operator::Equals, vec![]).is_err());
        assert!(Requirement::new("a", Operator::NotEquals, vec!["x".into(), "y".into()]).is_err());
        assert!(Requirement::new("a", Operator::GreaterThan, vec!["x".into()]).is_err());
        assert!(Requirement::new("a", Operator::LessThan, vec![]).is_err());
        assert!(Requirement::new("", Operator::Exists, vec![]).is_err());
        assert!(validate_label_key("example.com/a").is_ok());
        assert!(validate_label_value("").is_ok());
    }

    #[test]
    fn field_selectors() {
        let allowed = [
            "metadata.name",
            "metadata.namespace",
            "type",
            "spec.nodeName",
            "spec.replicas",
        ];
        let secret = json!({"metadata": {"name": "tok", "namespace": "ns"}, "type": "kubernetes.io/service-account-token", "spec": {"replicas": 3}});
        let m = |s: &str| {
            parse_field_selector(s, &allowed)
                .unwrap_or_else(|e| panic!("{s:?}: {e}"))
                .matches(&secret)
        };
        assert!(m(""));
        assert!(m(" "));
        assert!(m("metadata.name=tok"));
        assert!(m("metadata.name==tok,metadata.namespace=ns"));
        assert!(m("metadata.name!=other"));
        assert!(m("type=kubernetes.io/service-account-token"));
        assert!(m("spec.nodeName="), "missing field reads as empty");
        assert!(m("spec.nodeName!=node1"));
        assert!(m("spec.replicas=3"), "numbers compare as text");
        assert!(
            m(" metadata.name = tok ,"),
            "whitespace and trailing comma tolerated"
        );
        assert!(!m("metadata.name=other"));
        assert!(!m("metadata.name!=tok"));
        assert!(!m("metadata.name=tok,metadata.namespace=other"));
        assert!(parse_field_selector("", &allowed).unwrap().is_empty());

        // escapes in values
        let o = json!({"metadata": {"name": "a,b=c\\d"}});
        let s = parse_field_selector(r"metadata.name=a\,b\=c\\d", &allowed).unwrap();
        assert_eq!(s.requirements()[0].value, "a,b=c\\d");
        assert!(s.matches(&o));
        // `!=` inside an escaped value is not an operator
        let s = parse_field_selector(r"metadata.name=x\=y", &allowed).unwrap();
        assert_eq!(
            s.requirements()[0],
            FieldRequirement {
                field: "metadata.name".into(),
                negated: false,
                value: "x=y".into()
            }
        );
    }

    /// A stored object's index and text answer every selector as its parsed tree does.
    #[test]
    fn stored_objects_match_as_their_trees_do() {
        use crate::storage::object::Draft;
        let objects = [
            json!({"metadata": {"name": "a", "namespace": "ns", "labels": {"app": "web", "n": "5", "empty": "", "example.com/team": "x"}},
                   "type": "Opaque", "spec": {"nodeName": "node1", "replicas": 3, "paused": false, "nested": {"v": "x,y"}}}),
            json!({"metadata": {"name": "b", "labels": {"app": "db", "x": 1}}, "spec": {"nodeName": null, "replicas": [1]}}),
            json!({"metadata": {"name": "c"}, "spec": "not an object"}),
            json!({"metadata": {"name": "d", "namespace": "ns", "labels": {}}}),
        ];
        let label_selectors = ["", "app=web", "app!=web", "app in (web,db)", "app notin (web)", "app", "!app", "n>4", "n<4",
            "empty=", "empty", "example.com/team=x", "x=1", "x", "missing notin (a)"];
        let allowed = ["metadata.name", "metadata.namespace", "type", "spec.nodeName", "spec.replicas", "spec.paused", "spec.nested.v", "spec"];
        let field_selectors = ["", "metadata.name=a", "metadata.name!=a", "metadata.namespace=ns", "metadata.namespace=", "type=Opaque",
            "type=", "spec.nodeName=node1", "spec.nodeName=", "spec.nodeName!=node1", "spec.replicas=3", "spec.replicas=[1]",
            "spec.paused=false", r"spec.nested.v=x\,y", "spec=not an object", "spec.nodeName=node1,metadata.name=a"];
        for tree in objects {
            let stored = Draft::new(tree.clone()).stamp(2);
            let tree_labels = tree["metadata"].get("labels").and_then(Value::as_object).cloned().unwrap_or_default();
            for s in label_selectors {
                let sel = sel(s);
                assert_eq!(sel.matches(&stored), sel.matches(&tree_labels), "{s:?} on {tree}");
            }
            for s in field_selectors {
                let sel = parse_field_selector(s, &allowed).unwrap_or_else(|e| panic!("{s:?}: {e}"));
                assert_eq!(sel.matches(&stored), sel.matches(&tree), "{s:?} on {tree}");
            }
        }
        // The cases above are not all alike.
        let stored = Draft::new(json!({"metadata": {"name": "a", "labels": {"app": "web"}}, "spec": {"replicas": 3}})).stamp(2);
        assert!(sel("app=web").matches(&stored) && !sel("app=db").matches(&stored));
        assert!(parse_field_selector("spec.replicas=3", &allowed).unwrap().matches(&stored));
        assert!(!parse_field_selector("spec.replicas=4", &allowed).unwrap().matches(&stored));
    }

    #[test]
    fn field_selector_errors() {
        let allowed = ["metadata.name"];
        assert_eq!(
            parse_field_selector("spec.x=1", &allowed).unwrap_err(),
            "field label not supported: spec.x"
        );
        assert_eq!(
            parse_field_selector("metadata.name=a,status.phase!=b", &allowed).unwrap_err(),
            "field label not supported: status.phase"
        );
        for bad in [
            "metadata.name",
            "=x",
            "!=x",
            r"metadata.name=a\x",
            r"metadata.name=a\",
            "metadata.name",
            "x",
            r"metadata.name\=a",
        ] {
            assert!(parse_field_selector(bad, &allowed).is_err(), "{bad:?}");
        }
        assert!(parse_field_selector(&"x".repeat(70000), &allowed).is_err());
    }

    #[test]
    fn odd_inputs_never_panic() {
        let chars = [
            "a", "=", "!", ",", "(", ")", " ", "in", "notin", "\\", "<", ">", "/", ".", "é",
            "\u{0}", "-",
        ];
        // every 3-token combination through both parsers
        for a in chars {
            for b in chars {
                for c in chars {
                    let s = format!("{a}{b}{c}");
                    if let Ok(sel) = parse_label_selector(&s) {
                        let _ = sel.matches(&Map::new());
                        let _ = parse_label_selector(&sel.to_string());
                    }
                    if let Ok(fs) = parse_field_selector(&s, &["a"]) {
                        let _ = fs.matches(&json!({"a": [1]}));
                        let _ = fs.matches(&Value::Null);
                    }
                }
            }
        }
    }
}
