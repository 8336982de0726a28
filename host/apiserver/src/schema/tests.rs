//! The schema passes against kube-apiserver's behaviour.

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
