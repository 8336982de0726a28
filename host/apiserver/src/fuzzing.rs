//! Entry points for fuzzing: whole requests through the router (decoding,
//! validation, patching, apply) against an in-memory server, without a network.

use std::sync::Arc;

use bytes::Bytes;

use crate::config::Config;
use crate::storage::state::State;

pub use crate::objects::patch::{json_patch, merge_patch, strategic_merge_patch};

/// An in-memory server state with a custom resource installed, and a runtime to drive requests.
pub struct Harness {
    state: Arc<State>,
    rt: tokio::runtime::Runtime,
}

/// A CRD with typed fields, lists of each kind and a scale subresource.
pub const FUZZ_CRD: &str = r#"{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition",
 "metadata":{"name":"things.fuzz.banlieue.io"},
 "spec":{"group":"fuzz.banlieue.io","scope":"Namespaced","names":{"plural":"things","kind":"Thing"},
  "versions":[{"name":"v1","served":true,"storage":true,
   "subresources":{"status":{},"scale":{"specReplicasPath":".spec.replicas","statusReplicasPath":".status.replicas"}},
   "additionalPrinterColumns":[{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}],
   "schema":{"openAPIV3Schema":{"type":"object","properties":{
    "spec":{"type":"object","properties":{
     "replicas":{"type":"integer","minimum":0,"default":1},
     "name":{"type":"string","pattern":"^[a-z]+$","maxLength":10},
     "mode":{"type":"string","enum":["A","B"]},
     "tags":{"type":"array","x-kubernetes-list-type":"set","items":{"type":"string"}},
     "ports":{"type":"array","x-kubernetes-list-type":"map","x-kubernetes-list-map-keys":["name"],
      "items":{"type":"object","required":["name"],"properties":{"name":{"type":"string"},"port":{"type":"integer"}}}},
     "free":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}},
    "status":{"type":"object","properties":{"replicas":{"type":"integer"},
     "conditions":{"type":"array","x-kubernetes-list-type":"map","x-kubernetes-list-map-keys":["type"],
      "items":{"type":"object","required":["type"],"properties":{"type":{"type":"string"},"status":{"type":"string"}}}}}}}}}}]}}"#;

impl Harness {
    pub fn new() -> Harness {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let state = State::new(&Config::default(), "fuzz".into()).expect("state");
        crate::objects::ensure_default_namespaces(&state);
        let h = Harness { state, rt };
        let (status, body) = h.request_full("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", "application/json", FUZZ_CRD.as_bytes());
        assert_eq!(status, 201, "the fuzz CRD installs: {body}");
        let seed = br#"{"apiVersion":"fuzz.banlieue.io/v1","kind":"Thing","metadata":{"name":"t"},"spec":{"name":"abc","tags":["a"],"ports":[{"name":"http","port":80}]}}"#;
        h.request("POST", "/apis/fuzz.banlieue.io/v1/namespaces/default/things", "application/json", seed);
        h
    }

    /// Send one request through the router; returns the HTTP status.
    pub fn request(&self, method: &str, path_and_query: &str, content_type: &str, body: &[u8]) -> u16 {
        self.request_full(method, path_and_query, content_type, body).0
    }

    /// Send one request; returns the status and the response body.
    pub fn request_full(&self, method: &str, path_and_query: &str, content_type: &str, body: &[u8]) -> (u16, String) {
        let Ok(req) = hyper::Request::builder()
            .method(method)
            .uri(path_and_query)
            .header("content-type", content_type)
            .header("authorization", "Bearer fuzz")
            .body(())
        else {
            return (400, String::new());
        };
        let (parts, ()) = req.into_parts();
        let state = self.state.clone();
        let body = Bytes::copy_from_slice(body);
        self.rt.block_on(async move {
            use http_body_util::BodyExt;
            let resp = crate::http::router::route(state, parts, body).await;
            let status = resp.status().as_u16();
            // Successful watches stream forever: only error bodies are read.
            if status != 200 {
                let text = resp.into_body().collect().await.map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned()).unwrap_or_default();
                (status, text)
            } else {
                (status, String::new())
            }
        })
    }
}

impl Default for Harness {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_harness_serves_requests() {
        let h = super::Harness::new();
        let (status, body) = h.request_full("GET", "/apis/fuzz.banlieue.io/v1/namespaces/default/things/t", "application/json", b"");
        assert_eq!(status, 200, "{body}");
        assert_eq!(h.request("POST", "/api/v1/namespaces/default/configmaps", "application/json", b"{"), 400);
    }
}
