//! The patch algorithms on arbitrary documents: `target \0 patch`.
#![no_main]
use banlieue_apiserver::fuzzing::{json_patch, merge_patch, strategic_merge_patch};
use banlieue_apiserver::shape::Shape;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Some(split) = data.iter().position(|&b| b == 0) else { return };
    let (Ok(target), Ok(patch)) = (serde_json::from_slice::<Value>(&data[..split]), serde_json::from_slice::<Value>(&data[split + 1..])) else {
        return;
    };
    let schema = serde_json::json!({"type": "object", "properties": {
        "items": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"], "items": {"type": "object"}},
        "set": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}}}});
    let shape = banlieue_apiserver::shape::with_object_meta(Shape::from_openapi(&schema));
    let _ = merge_patch(&target, &patch);
    let _ = json_patch(&target, &patch);
    let _ = strategic_merge_patch(&target, &patch, &shape);
    let _ = strategic_merge_patch(&target, &patch, &Shape::Any);
});
