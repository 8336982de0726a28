//! Arbitrary patches of every type against a stored custom resource and a Secret.
#![no_main]
use std::sync::LazyLock;

use banlieue_apiserver::fuzzing::Harness;
use libfuzzer_sys::fuzz_target;

static H: LazyLock<std::sync::Mutex<Harness>> = LazyLock::new(|| std::sync::Mutex::new(Harness::new()));

fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else { return };
    let h = H.lock().unwrap();
    let ct = match sel % 4 {
        0 => "application/merge-patch+json",
        1 => "application/json-patch+json",
        2 => "application/strategic-merge-patch+json",
        _ => "application/apply-patch+yaml",
    };
    let path = match (sel / 4) % 4 {
        0 => "/apis/fuzz.banlieue.io/v1/namespaces/default/things/t?fieldManager=fuzz",
        1 => "/apis/fuzz.banlieue.io/v1/namespaces/default/things/t/status?fieldManager=fuzz",
        2 => "/apis/fuzz.banlieue.io/v1/namespaces/default/things/t/scale?fieldManager=fuzz",
        _ => "/api/v1/namespaces/default/configmaps/missing?fieldManager=fuzz&force=true",
    };
    let status = h.request("PATCH", path, ct, body);
    assert!(status != 500, "internal error on patch");
});
