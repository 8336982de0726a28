//! Validation of objects against a structural schema, in kube-apiserver's words.

use super::*;

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
