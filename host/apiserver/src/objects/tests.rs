//! Serving stored text: what GET, LIST and WATCH send is the stored object with
//! the right resourceVersion, relabelled when asked for at another version.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::{json, Value};

use crate::config::Config;
use crate::response::Body;
use crate::storage::state::State;

/// A CRD served at two versions (no conversion: objects are relabelled).
const CRD: &str = r#"{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition",
 "metadata":{"name":"widgets.test.banlieue.io"},
 "spec":{"group":"test.banlieue.io","scope":"Namespaced","names":{"plural":"widgets","kind":"Widget"},
  "versions":[
   {"name":"v1","served":true,"storage":true,"schema":{"openAPIV3Schema":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}},
   {"name":"v2","served":true,"storage":false,"schema":{"openAPIV3Schema":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}}]}}"#;

const V1: &str = "/apis/test.banlieue.io/v1/namespaces/default/widgets";
const V2: &str = "/apis/test.banlieue.io/v2/namespaces/default/widgets";

async fn send(state: &Arc<State>, method: &str, uri: &str, content_type: &str, body: &str) -> hyper::Response<Body> {
    let req = hyper::Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", content_type)
        .header("authorization", "Bearer t")
        .body(())
        .unwrap();
    let (parts, ()) = req.into_parts();
    crate::http::router::route(state.clone(), parts, Bytes::copy_from_slice(body.as_bytes())).await
}

/// One request's status and body text.
async fn call(state: &Arc<State>, method: &str, uri: &str, body: &str) -> (u16, Bytes) {
    let content_type = if method == "PATCH" { "application/merge-patch+json" } else { "application/json" };
    let resp = send(state, method, uri, content_type, body).await;
    let status = resp.status().as_u16();
    (status, resp.into_body().collect().await.unwrap().to_bytes())
}

fn parse(b: &[u8]) -> Value {
    serde_json::from_slice(b).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(b)))
}

fn server() -> (tokio::runtime::Runtime, Arc<State>) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let state = State::new(&Config::default(), "t".into()).unwrap();
    crate::objects::ensure_default_namespaces(&state);
    let (status, body) = rt.block_on(call(&state, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", CRD));
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    (rt, state)
}

fn widget_key(state: &State) -> crate::schema::registry::StorageKey {
    state.resource("test.banlieue.io", "v1", "widgets").unwrap().storage_key()
}

#[test]
fn reads_serve_the_stored_text_with_its_resource_version() {
    let (rt, state) = server();
    rt.block_on(async {
        let (status, created) = call(&state, "POST", V1, r#"{"metadata":{"name":"w","labels":{"app":"a"}},"spec":{"size":1}}"#).await;
        assert_eq!(status, 201);
        let stored = state.store.get(&widget_key(&state), "default", "w").unwrap();
        assert_eq!(&created[..], stored.json(), "the create answers with the stored text");
        assert_eq!(parse(&created)["metadata"]["resourceVersion"], stored.rv().to_string());

        let (_, got) = call(&state, "GET", &format!("{V1}/w"), "").await;
        assert_eq!(&got[..], stored.json());

        let (status, patched) = call(&state, "PATCH", &format!("{V1}/w"), r#"{"spec":{"size":2}}"#).await;
        assert_eq!(status, 200);
        let patched = parse(&patched);
        let now = state.store.get(&widget_key(&state), "default", "w").unwrap();
        assert!(now.rv() > stored.rv());
        assert_eq!(patched["metadata"]["resourceVersion"], now.rv().to_string());
        assert_eq!(patched["spec"]["size"], 2);

        let (_, list) = call(&state, "GET", V1, "").await;
        let list = parse(&list);
        assert_eq!(list["kind"], "WidgetList");
        assert_eq!(list["metadata"]["resourceVersion"], state.store.current_rv().to_string());
        assert_eq!(list["items"], json!([patched]));
        let (_, none) = call(&state, "GET", &format!("{V1}?labelSelector=app%3Db"), "").await;
        assert_eq!(parse(&none)["items"], json!([]));
    });
}

#[test]
fn another_version_is_served_relabelled() {
    let (rt, state) = server();
    rt.block_on(async {
        let (_, created) = call(&state, "POST", V1, r#"{"metadata":{"name":"w"},"spec":{"size":1}}"#).await;
        let mut expected = parse(&created);
        expected["apiVersion"] = json!("test.banlieue.io/v2");
        let (_, got) = call(&state, "GET", &format!("{V2}/w"), "").await;
        assert_eq!(parse(&got), expected);
        let (_, list) = call(&state, "GET", V2, "").await;
        assert_eq!(parse(&list)["items"], json!([expected]));
        assert_eq!(parse(&list)["apiVersion"], "test.banlieue.io/v2");
    });
}

#[test]
fn watch_events_carry_each_change_at_its_resource_version() {
    let (rt, state) = server();
    rt.block_on(async {
        let from = state.store.current_rv();
        let (_, a) = call(&state, "POST", V1, r#"{"metadata":{"name":"a","labels":{"app":"x"}}}"#).await;
        call(&state, "POST", V1, r#"{"metadata":{"name":"b","labels":{"app":"y"}}}"#).await;
        let (_, a2) = call(&state, "PATCH", &format!("{V1}/a"), r#"{"metadata":{"labels":{"app":"z"}}}"#).await;
        call(&state, "DELETE", &format!("{V1}/b"), "").await;
        let deleted_rv = state.store.current_rv();

        let watch = send(&state, "GET", &format!("{V2}?watch=true&resourceVersion={from}&labelSelector=app%21%3Dy"), "application/json", "").await;
        let mut body = watch.into_body();
        let mut text = Vec::new();
        while text.iter().filter(|&&c| c == b'\n').count() < 2 {
            let frame = tokio::time::timeout(Duration::from_secs(5), body.frame()).await.expect("an event").unwrap().unwrap();
            text.extend_from_slice(&frame.into_data().unwrap());
        }
        let events: Vec<Value> = text.split(|&c| c == b'\n').filter(|l| !l.is_empty()).map(parse).collect();
        let relabelled = |b: &[u8]| {
            let mut v = parse(b);
            v["apiVersion"] = json!("test.banlieue.io/v2");
            v
        };
        assert_eq!(events, [json!({"type": "ADDED", "object": relabelled(&a)}), json!({"type": "MODIFIED", "object": relabelled(&a2)})]);

        // Without the selector, b's deletion shows at the deletion's resourceVersion.
        let watch = send(&state, "GET", &format!("{V1}?watch=true&resourceVersion={}", deleted_rv - 1), "application/json", "").await;
        let frame = tokio::time::timeout(Duration::from_secs(5), watch.into_body().frame()).await.expect("an event").unwrap().unwrap();
        let event = parse(frame.into_data().unwrap().strip_suffix(b"\n").unwrap());
        assert_eq!(event["type"], "DELETED");
        assert_eq!(event["object"]["metadata"]["name"], "b");
        assert_eq!(event["object"]["metadata"]["resourceVersion"], deleted_rv.to_string());
    });
}

#[test]
fn expiring_watches_ends_open_ones_with_410_and_refuses_resuming_from_before() {
    let (rt, state) = server();
    rt.block_on(async {
        let from = state.store.current_rv();
        call(&state, "POST", V1, r#"{"metadata":{"name":"a"}}"#).await;
        let watch = send(&state, "GET", &format!("{V1}?watch=true&resourceVersion={from}"), "application/json", "").await;
        let mut body = watch.into_body();
        let mut next = async || {
            let frame = tokio::time::timeout(Duration::from_secs(5), body.frame()).await.expect("an event").unwrap().unwrap();
            parse(frame.into_data().unwrap().strip_suffix(b"\n").unwrap())
        };
        assert_eq!(next().await["type"], "ADDED");

        state.store.expire();
        let error = next().await;
        assert_eq!((error["type"].as_str(), error["object"]["code"].as_i64(), error["object"]["reason"].as_str()), (Some("ERROR"), Some(410), Some("Expired")));
        let end = tokio::time::timeout(Duration::from_secs(5), body.frame()).await.expect("the watch ends");
        assert!(end.is_none(), "the watch ends after the error");

        // Resuming from any resourceVersion before the expiry is refused; a fresh list works.
        let watch = send(&state, "GET", &format!("{V1}?watch=true&resourceVersion={from}"), "application/json", "").await;
        let frame = tokio::time::timeout(Duration::from_secs(5), watch.into_body().frame()).await.expect("an event").unwrap().unwrap();
        let gone = parse(frame.into_data().unwrap().strip_suffix(b"\n").unwrap());
        assert_eq!(gone["object"]["code"], 410);
        let (status, list) = call(&state, "GET", V1, "").await;
        assert_eq!((status, parse(&list)["items"].as_array().map(Vec::len)), (200, Some(1)));
    });
}

/// A request as a server-issued token's holder (`serve` authenticates it so).
async fn call_as(state: &Arc<State>, token: &str, method: &str, uri: &str, body: &str) -> (u16, Value) {
    let req = hyper::Request::builder().method(method).uri(uri).header("content-type", "application/json").header("authorization", format!("Bearer {token}")).body(()).unwrap();
    let (mut parts, ()) = req.into_parts();
    let user = state.authenticate(&parts.headers).expect("a token the server knows");
    parts.extensions.insert(user);
    let resp = crate::http::router::route(state.clone(), parts, Bytes::copy_from_slice(body.as_bytes())).await;
    let status = resp.status().as_u16();
    (status, parse(&resp.into_body().collect().await.unwrap().to_bytes()))
}

#[test]
fn a_serviceaccount_token_is_issued_reviewed_and_authorized_by_rbac() {
    let (rt, state) = server();
    rt.block_on(async {
        let sa = "/api/v1/namespaces/default/serviceaccounts";
        let (status, _) = call(&state, "POST", &format!("{sa}/ghost/token"), "{}").await;
        assert_eq!(status, 404, "no token for a ServiceAccount that does not exist");
        assert_eq!(call(&state, "POST", sa, r#"{"metadata":{"name":"reader"}}"#).await.0, 201);
        let (status, body) = call(&state, "POST", &format!("{sa}/reader/token"), r#"{"spec":{"expirationSeconds":60}}"#).await;
        assert_eq!(status, 400, "shorter than kube-apiserver allows: {}", String::from_utf8_lossy(&body));
        let (status, body) = call(&state, "POST", &format!("{sa}/reader/token"), r#"{"spec":{"expirationSeconds":600}}"#).await;
        assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
        let token = parse(&body)["status"]["token"].as_str().unwrap().to_string();

        // TokenReview says who it is; an unknown token is not authenticated.
        let (_, review) = call(&state, "POST", "/apis/authentication.k8s.io/v1/tokenreviews", &format!(r#"{{"spec":{{"token":"{token}"}}}}"#)).await;
        let review = parse(&review);
        assert_eq!(review["status"]["authenticated"], true);
        assert_eq!(review["status"]["user"]["username"], "system:serviceaccount:default:reader");
        let (_, review) = call(&state, "POST", "/apis/authentication.k8s.io/v1/tokenreviews", r#"{"spec":{"token":"nope"}}"#).await;
        assert_eq!(parse(&review)["status"]["authenticated"], false);

        // RBAC decides what the token may do, and what a SubjectAccessReview answers for it.
        let sar = |sub: &str| format!(
            r#"{{"spec":{{"user":"system:serviceaccount:default:reader","groups":["system:serviceaccounts"],"resourceAttributes":{{"verb":"get","group":"test.banlieue.io","resource":"widgets","subresource":"{sub}","namespace":"default","name":"w"}}}}}}"#
        );
        let (status, review) = call(&state, "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", &sar("status")).await;
        assert_eq!((status, parse(&review)["status"]["allowed"].clone()), (201, Value::Bool(false)));
        assert_eq!(call_as(&state, &token, "GET", V1, "").await.0, 403, "nothing granted yet");
        let role = r#"{"metadata":{"name":"r"},"rules":[{"apiGroups":["test.banlieue.io"],"resources":["widgets","widgets/status"],"verbs":["get","list"]}]}"#;
        assert_eq!(call(&state, "POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles", role).await.0, 201);
        let binding = r#"{"metadata":{"name":"r"},"roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"Role","name":"r"},"subjects":[{"kind":"ServiceAccount","name":"reader","namespace":"default"}]}"#;
        assert_eq!(call(&state, "POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings", binding).await.0, 201);
        let (_, review) = call(&state, "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", &sar("status")).await;
        assert_eq!(parse(&review)["status"]["allowed"], true);
        let (_, review) = call(&state, "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", &sar("scale")).await;
        assert_eq!(parse(&review)["status"]["allowed"], false, "only the subresources granted");
        assert_eq!(call_as(&state, &token, "GET", V1, "").await.0, 200);
        assert_eq!(call_as(&state, &token, "DELETE", &format!("{V1}/w"), "").await.0, 403);
        // The token's holder may not review tokens or access itself.
        assert_eq!(call_as(&state, &token, "POST", "/apis/authentication.k8s.io/v1/tokenreviews", r#"{"spec":{"token":"x"}}"#).await.0, 403);
        assert_eq!(call_as(&state, &token, "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", &sar("status")).await.0, 403);
    });
}
