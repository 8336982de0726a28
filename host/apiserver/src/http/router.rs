//! Maps a request's method and path to discovery, OpenAPI, or an object operation.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use hyper::http::request::Parts;
use hyper::{Method, Response};

use crate::audit::AuditEntry;
use crate::http::authz::{Attributes, User};
use crate::objects::{self, Request};
use crate::response::{error_response, json_response, Body};
use crate::storage::state::State;
use crate::status::ApiError;

pub async fn route(state: Arc<State>, parts: Parts, body: Bytes) -> Response<Body> {
    let path = parts.uri.path().trim_end_matches('/').to_string();
    let query: HashMap<String, String> = parts
        .uri
        .query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    let segs: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(|s| percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned())
        .collect();
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();

    let get = parts.method == Method::GET;
    match segs.as_slice() {
        ["version"] if get => return json_response(200, &crate::http::discovery::version(), &[]),
        ["healthz"] | ["livez"] | ["readyz"] if get => return text_ok(),
        ["api"] if get => return json_response(200, &crate::http::discovery::core_versions(&state), &[]),
        ["apis"] if get => return json_response(200, &crate::http::discovery::group_list(&state), &[]),
        ["apis", g] if get => {
            return match crate::http::discovery::group(&state, g) {
                Some(v) => json_response(200, &v, &[]),
                None => not_served(&state, Some(g)),
            }
        }
        ["api", "v1"] if get => return json_response(200, &crate::http::discovery::resource_list(&state, "", "v1").unwrap_or_default(), &[]),
        ["apis", g, v] if get => {
            return match crate::http::discovery::resource_list(&state, g, v) {
                Some(l) => json_response(200, &l, &[]),
                None => not_served(&state, Some(g)),
            }
        }
        ["openapi", "v3"] if get => return json_response(200, &crate::schema::openapi::index(&state.registry.read().unwrap().all()), &[]),
        ["openapi", "v3", rest @ ..] if get => {
            return match crate::schema::openapi::group_version_doc(&state.registry.read().unwrap().all(), &rest.join("/")) {
                Some(doc) => json_response(200, &doc, &[]),
                None => error_response(&ApiError::no_such_resource()),
            }
        }
        ["apis", "authorization.k8s.io", "v1", "selfsubjectaccessreviews"] if parts.method == Method::POST => {
            let user = requester(&parts);
            return match serde_json::from_slice::<serde_json::Value>(&body) {
                Ok(review) => json_response(201, &crate::http::authz::self_subject_access_review(&state, &user, &review), &[]),
                Err(e) => error_response(&ApiError::bad_request(format!("decoding SelfSubjectAccessReview: {e}"))),
            };
        }
        ["apis", "authorization.k8s.io", "v1", "subjectaccessreviews"] if parts.method == Method::POST => {
            return reviewed(&state, &parts, &body, "authorization.k8s.io", "subjectaccessreviews", crate::http::authz::subject_access_review);
        }
        ["apis", "authentication.k8s.io", "v1", "tokenreviews"] if parts.method == Method::POST => {
            return reviewed(&state, &parts, &body, "authentication.k8s.io", "tokenreviews", crate::http::authz::token_review);
        }
        ["api", "v1", "namespaces", ns, "serviceaccounts", name, "token"] if parts.method == Method::POST => {
            let user = requester(&parts);
            let attrs = Attributes { verb: "create", group: "", resource: "serviceaccounts", subresource: Some("token"), namespace: Some(ns), name: Some(name) };
            if !crate::http::authz::allowed(&state, &user, &attrs) {
                return error_response(&crate::http::authz::forbidden(&user, &attrs));
            }
            let request = serde_json::from_slice::<serde_json::Value>(&body).unwrap_or_default();
            return match crate::http::authz::token_request(&state, ns, name, &request) {
                Ok(answer) => json_response(201, &answer, &[]),
                Err(e) => error_response(&e),
            };
        }
        _ => {}
    }

    // Resource paths: /api/v1/... or /apis/GROUP/VERSION/...
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        ["api", ..] => return not_served(&state, Some("")),
        ["apis", g, ..] => return not_served(&state, Some(g)),
        _ => return not_served(&state, None),
    };
    let lookup = |plural: &str| state.resource(group, version, plural);
    // `namespaces/NS/PLURAL[/NAME[/SUB]]` is namespaced unless PLURAL isn't a namespaced resource,
    // in which case it is the Namespace NS itself with a subresource (`namespaces/NS/status`).
    let target = match rest {
        ["namespaces", ns, plural, tail @ ..] if lookup(plural).is_some_and(|t| t.namespaced) && tail.len() <= 2 => {
            (lookup(plural), Some(ns.to_string()), tail.first().map(|s| s.to_string()), tail.get(1).map(|s| s.to_string()))
        }
        [plural, tail @ ..] if tail.len() <= 2 => {
            (lookup(plural), None, tail.first().map(|s| s.to_string()), tail.get(1).map(|s| s.to_string()))
        }
        _ => (None, None, None, None),
    };
    let (Some(rt), namespace, name, sub) = target else {
        return not_served(&state, Some(group));
    };
    if rt.namespaced && namespace.is_none() && name.is_some() {
        return not_served(&state, Some(group));
    }
    if let Some(s) = &sub {
        let allowed = match s.as_str() {
            "status" => rt.status_subresource,
            "scale" => rt.scale.is_some(),
            "finalize" => rt.builtin == Some(crate::schema::registry::Builtin::Namespace),
            _ => false,
        };
        if !allowed {
            // kube-apiserver's handler of custom resources calls the object not found.
            return match (&rt.crd_name, &name) {
                (Some(_), Some(n)) => error_response(&ApiError::not_found(&rt.group_resource(), n)),
                _ => error_response(&ApiError::no_such_resource()),
            };
        }
    }
    let watch = query.get("watch").is_some_and(|w| w == "true" || w == "1");
    let user = requester(&parts);
    let verb = crate::audit::verb(&parts.method, name.is_some(), watch);
    let attrs = Attributes {
        verb,
        group: &rt.group,
        resource: &rt.plural,
        subresource: sub.as_deref(),
        namespace: namespace.as_deref(),
        name: name.as_deref(),
    };
    let mut denied = (!crate::http::authz::allowed(&state, &user, &attrs)).then(|| crate::http::authz::forbidden(&user, &attrs));
    // An apply that creates the object is authorized as `create` too (as kube-apiserver
    // does), and audited as both.
    let is_apply = parts.headers.get(hyper::header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/apply-patch"));
    let apply_creates = parts.method == Method::PATCH
        && is_apply
        && sub.is_none()
        && name.as_deref().is_some_and(|n| state.store.get(&rt.storage_key(), namespace.as_deref().unwrap_or_default(), n).is_none());
    if denied.is_none() && apply_creates {
        let create = Attributes { verb: "create", ..attrs.clone() };
        denied = (!crate::http::authz::allowed(&state, &user, &create)).then(|| crate::http::authz::forbidden(&user, &create));
    }
    let mut entry = AuditEntry {
        user: user.name,
        verb: verb.to_string(),
        group: rt.group.clone(),
        resource: rt.plural.clone(),
        subresource: sub.clone(),
        namespace: namespace.clone(),
        name: name.clone(),
        code: 0,
        seq: 0,
    };
    let audit = state.clone();
    let response = match denied {
        Some(e) => error_response(&e),
        None => objects::dispatch(parts.method, Request { state, rt, namespace, name, sub, query, headers: parts.headers, body }).await,
    };
    entry.code = response.status().as_u16();
    if apply_creates {
        audit.audit.record(AuditEntry { verb: "create".into(), ..entry.clone() });
    }
    audit.audit.record(entry);
    response
}

/// kube-apiserver's 404 for a path it does not serve: under `/api` or one of its own groups,
/// that group's handler answers with a `Status`; any other path (an unknown group, or a CRD's
/// group with an unknown version or resource) falls through to Go's plain-text not-found.
fn not_served(state: &State, group: Option<&str>) -> Response<Body> {
    if group.is_some_and(|g| state.registry.read().unwrap().is_builtin_group(g)) {
        return error_response(&ApiError::no_such_resource());
    }
    use http_body_util::{BodyExt, Full};
    Response::builder()
        .status(404)
        .header("content-type", "text/plain; charset=utf-8")
        .header("x-content-type-options", "nosniff")
        .body(Full::new(Bytes::from_static(b"404 page not found\n")).boxed_unsync())
        .expect("static response")
}

fn text_ok() -> Response<Body> {
    use http_body_util::{BodyExt, Full};
    Response::builder()
        .status(200)
        .header("content-type", "text/plain")
        .body(Full::new(Bytes::from_static(b"ok")).boxed_unsync())
        .expect("static response")
}

/// Who the request is, as the server authenticated it (`serve` does for every request it
/// routes; a request routed without it is the token's user, as before authentication knew
/// other tokens).
fn requester(parts: &Parts) -> User {
    parts.extensions.get::<User>().cloned().unwrap_or_else(|| User::of(&parts.headers))
}

/// `POST` of a review (`TokenReview`, `SubjectAccessReview`): allowed to who may `create` it,
/// answered by `answer`.
fn reviewed(state: &State, parts: &Parts, body: &Bytes, group: &str, plural: &str, answer: fn(&State, &serde_json::Value) -> serde_json::Value) -> Response<Body> {
    let user = requester(parts);
    let attrs = Attributes { verb: "create", group, resource: plural, ..Default::default() };
    if !crate::http::authz::allowed(state, &user, &attrs) {
        return error_response(&crate::http::authz::forbidden(&user, &attrs));
    }
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(review) => json_response(201, &answer(state, &review), &[]),
        Err(e) => error_response(&ApiError::bad_request(format!("decoding the {plural} request: {e}"))),
    }
}
