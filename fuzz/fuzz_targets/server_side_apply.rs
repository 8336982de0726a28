//! Server-side apply and managed-field bookkeeping on arbitrary objects: `live \0 applied`.
#![no_main]
use banlieue_apiserver::managed;
use banlieue_apiserver::shape::{with_object_meta, Shape};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Some(split) = data.iter().position(|&b| b == 0) else { return };
    let (Ok(live), Ok(applied)) = (serde_json::from_slice::<Value>(&data[..split]), serde_json::from_slice::<Value>(&data[split + 1..])) else {
        return;
    };
    let schema = serde_json::json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "ports": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name", "protocol"], "items": {"type": "object"}},
        "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}}}}}});
    let shape = with_object_meta(Shape::from_openapi(&schema));
    let now = "2026-01-01T00:00:00Z";
    for force in [false, true] {
        let _ = managed::apply(Some(&live), &applied, "fuzz", force, &shape, "v1", now, None);
    }
    let _ = managed::apply(None, &applied, "fuzz", false, &shape, "v1", now, Some("status"));
    let mut new = applied.clone();
    if new.is_object() {
        managed::record_update(Some(&live), &mut new, "fuzz", &shape, "v1", now, None);
    }
});
