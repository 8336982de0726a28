//! Kubernetes protobuf request bodies.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = banlieue_apiserver::protobuf::decode(data);
});
