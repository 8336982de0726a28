//! Whether a CRD's schema is structural and servable (`check_structural`).

use super::*;
use super::pruning::prune_node;

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
