//! Arbitrary create bodies (JSON, YAML, protobuf) for a custom resource and built-ins.
#![no_main]
use std::sync::LazyLock;

use banlieue_apiserver::fuzzing::Harness;
use libfuzzer_sys::fuzz_target;

static H: LazyLock<std::sync::Mutex<Harness>> = LazyLock::new(|| std::sync::Mutex::new(Harness::new()));

fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else { return };
    let h = H.lock().unwrap();
    let (path, ct) = match sel % 6 {
        0 => ("/apis/fuzz.banlieue.io/v1/namespaces/default/things", "application/json"),
        1 => ("/apis/fuzz.banlieue.io/v1/namespaces/default/things", "application/yaml"),
        2 => ("/api/v1/namespaces/default/secrets", "application/json"),
        3 => ("/api/v1/namespaces/default/configmaps", "application/vnd.kubernetes.protobuf"),
        4 => ("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", "application/json"),
        _ => ("/api/v1/namespaces", "application/vnd.kubernetes.protobuf"),
    };
    let status = h.request("POST", path, ct, body);
    assert!(status != 500, "internal error on create");
});
