//! Object operations with Kubernetes semantics: get, list, create, update, patch
//! (merge, JSON, strategic, server-side apply), delete and deletecollection, on
//! the main resource and its status and scale subresources.
//!
//! Every write funnels through [`write`] (updates) or [`create_object`] (creates)
//! and [`delete_object`] (deletes), so validation, generation, managed fields,
//! finalizers and dry-run are decided in one place each.

pub mod builtins;
pub mod managed;
pub mod meta;
pub mod patch;
pub mod protobuf;
pub mod selector;
pub mod watch;
#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use hyper::{HeaderMap, Method, Response};
use serde_json::{json, Map, Value};


use meta::now;
use crate::schema::registry::{Builtin, ResourceType};
use crate::response::{error_response, json_response, json_text_response, Body};
use crate::storage::object::Object;
use crate::storage::state::{Continuation, State};
use crate::status::{ApiError, ApiResult};
use crate::storage::store::{CommitError, Expect};

/// One request for an object or a collection.
pub struct Request {
    pub state: Arc<State>,
    pub rt: Arc<ResourceType>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub sub: Option<String>,
    pub query: HashMap<String, String>,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Request {
    fn q(&self, k: &str) -> Option<&str> {
        self.query.get(k).map(String::as_str).filter(|s| !s.is_empty())
    }
    fn dry_run(&self) -> ApiResult<bool> {
        match self.q("dryRun") {
            None => Ok(false),
            Some("All") => Ok(true),
            Some(other) => Err(ApiError::bad_request(format!("Invalid dry run value: {other:?}: supported values: \"All\""))),
        }
    }
    /// fieldManager, or the client's name as the real server derives it from User-Agent.
    fn manager(&self) -> String {
        if let Some(m) = self.q("fieldManager") {
            return m.to_string();
        }
        let ua = self.headers.get(hyper::header::USER_AGENT).and_then(|v| v.to_str().ok()).unwrap_or("unknown");
        ua.split('/').next().unwrap_or("unknown").chars().take(128).collect()
    }
    fn field_validation(&self) -> ApiResult<FieldValidation> {
        match self.q("fieldValidation") {
            None | Some("Warn") => Ok(FieldValidation::Warn),
            Some("Strict") => Ok(FieldValidation::Strict),
            Some("Ignore") => Ok(FieldValidation::Ignore),
            Some(o) => Err(ApiError::bad_request(format!("fieldValidation {o:?} is invalid: valid values are Ignore, Warn and Strict"))),
        }
    }
    fn wants_table(&self) -> bool {
        self.headers.get_all(hyper::header::ACCEPT).iter().any(|v| v.to_str().is_ok_and(|s| s.contains("as=Table")))
    }
    fn content_type(&self) -> String {
        self.headers
            .get(hyper::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|s| s.split(';').next().unwrap_or("").trim().to_ascii_lowercase())
            .unwrap_or_default()
    }
    fn ns(&self) -> &str {
        self.namespace.as_deref().unwrap_or("")
    }
    fn name(&self) -> &str {
        self.name.as_deref().unwrap_or("")
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum FieldValidation {
    Ignore,
    Warn,
    Strict,
}

/// A successful result.
pub struct Reply {
    pub code: u16,
    pub body: Payload,
    pub warnings: Vec<String>,
}

/// A response body: a document built for the response, or JSON text as stored.
pub enum Payload {
    Tree(Value),
    Text(Bytes),
}

fn reply(code: u16, body: Value) -> Reply {
    Reply { code, body: Payload::Tree(body), warnings: vec![] }
}

/// What a write left: the object as stored, or as it would be stored (dry run).
pub enum Written {
    Stored(Object),
    DryRun(Value),
}

impl Written {
    /// The object as a tree (the few responses that are not the object itself).
    pub fn tree(&self) -> Cow<'_, Value> {
        match self {
            Written::Stored(o) => Cow::Owned(o.value()),
            Written::DryRun(v) => Cow::Borrowed(v),
        }
    }

    fn is_deleting(&self) -> bool {
        match self {
            Written::Stored(o) => o.is_deleting(),
            Written::DryRun(v) => meta::is_deleting(v),
        }
    }

    /// The object as served at the request's version.
    fn served(&self, rt: &ResourceType) -> Payload {
        match self {
            Written::Stored(o) => Payload::Text(served_text(rt, o)),
            Written::DryRun(v) => Payload::Tree(served(rt, v)),
        }
    }
}

/// An object read to be changed: as stored (its resourceVersion) and parsed (to change it).
pub struct Current {
    pub stored: Object,
    pub tree: Value,
}

impl Current {
    pub fn of(stored: Object) -> Current {
        Current { tree: stored.value(), stored }
    }
}

pub async fn dispatch(method: Method, req: Request) -> Response<Body> {
    let has_name = req.name.is_some();
    let result = match (method, has_name) {
        (Method::GET, false) if req.q("watch").is_some_and(|w| w == "true" || w == "1") => {
            return crate::objects::watch::serve(req);
        }
        (Method::GET, false) => list(&req),
        (Method::GET, true) => get(&req),
        (Method::POST, false) => create(&req),
        (Method::PUT, true) => update(&req),
        (Method::PATCH, true) => patch(&req),
        (Method::DELETE, true) => delete(&req),
        (Method::DELETE, false) => delete_collection(&req),
        (m, _) => Err(ApiError::method_not_allowed(format!("the server does not allow this method on the requested resource ({m})"))),
    };
    match result {
        Ok(Reply { code, body: Payload::Tree(v), warnings }) => json_response(code, &v, &warnings),
        Ok(Reply { code, body: Payload::Text(b), warnings }) => json_text_response(code, b, &warnings),
        Err(e) => error_response(&e),
    }
}

// ---------------------------------------------------------------- reads

fn get(req: &Request) -> ApiResult<Reply> {
    let obj = req.state.store.get(&req.rt.storage_key(), req.ns(), req.name())
        .ok_or_else(|| ApiError::not_found(&req.rt.group_resource(), req.name()))?;
    if req.sub.as_deref() == Some("scale") {
        return Ok(reply(200, scale_of(&req.rt, &obj.value())?));
    }
    if req.wants_table() {
        let obj = served(&req.rt, &obj.value());
        return Ok(reply(200, crate::schema::table::table(&req.rt, &[obj], json!({"resourceVersion": ""}), req.q("includeObject"))));
    }
    Ok(Reply { code: 200, body: Payload::Text(served_text(&req.rt, &obj)), warnings: vec![] })
}

/// The object as served at the request's version.
pub fn served(rt: &ResourceType, obj: &Value) -> Value {
    let mut o = obj.clone();
    o["apiVersion"] = Value::String(rt.api_version());
    o["kind"] = Value::String(rt.kind.clone());
    o
}

/// A stored object's text as served at the request's version, sharing the stored buffer.
pub fn served_text(rt: &ResourceType, obj: &Object) -> Bytes {
    match served_json(rt, obj) {
        Cow::Borrowed(_) => obj.bytes(),
        Cow::Owned(json) => Bytes::from(json),
    }
}

/// A stored object's text as served at the request's version: the stored text
/// itself, unless the object was stored at another version of the resource.
pub fn served_json<'a>(rt: &ResourceType, obj: &'a Object) -> Cow<'a, [u8]> {
    let same_version = match obj.api_version().split_once('/') {
        Some((group, version)) => group == rt.group && version == rt.version,
        None => rt.group.is_empty() && obj.api_version() == rt.version,
    };
    if same_version && obj.kind() == rt.kind {
        Cow::Borrowed(obj.json())
    } else {
        Cow::Owned(serde_json::to_vec(&served(rt, &obj.value())).unwrap_or_default())
    }
}

/// Parsed label and field selectors of a list or watch.
pub struct Filter {
    labels: Option<crate::objects::selector::LabelSelector>,
    fields: Option<crate::objects::selector::FieldSelector>,
}

impl Filter {
    pub fn from_request(req: &Request) -> ApiResult<Filter> {
        let labels = match req.q("labelSelector") {
            Some(s) => Some(crate::objects::selector::parse_label_selector(s).map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?),
            None => None,
        };
        let fields = match req.q("fieldSelector") {
            Some(s) => Some(
                crate::objects::selector::parse_field_selector(s, &req.rt.field_selector_allowed())
                    .map_err(|e| ApiError::bad_request(format!("{e}")))?,
            ),
            None => None,
        };
        Ok(Filter { labels, fields })
    }

    pub fn matches(&self, obj: &Object) -> bool {
        if let Some(l) = &self.labels {
            if !l.matches(obj) {
                return false;
            }
        }
        if let Some(f) = &self.fields {
            if !f.matches(obj) {
                return false;
            }
        }
        true
    }
}

fn list(req: &Request) -> ApiResult<Reply> {
    let limit: usize = match req.q("limit") {
        Some(l) => l.parse().map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?,
        None => 0,
    };
    let (items, rv) = match req.q("continue") {
        Some(token) => {
            let c = req.state.take_continuation(token).ok_or_else(|| {
                ApiError::gone("The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.")
            })?;
            (c.items, c.rv)
        }
        None => {
            let filter = Filter::from_request(req)?;
            let (all, rv) = req.state.store.list(&req.rt.storage_key(), req.namespace.as_deref());
            (all.into_iter().filter(|o| filter.matches(o)).collect::<Vec<_>>(), rv)
        }
    };
    let (page, rest) = if limit > 0 && items.len() > limit {
        let mut items = items;
        let rest = items.split_off(limit);
        (items, rest)
    } else {
        (items, vec![])
    };
    let mut list_meta = json!({"resourceVersion": rv.to_string()});
    let wants_table = req.wants_table();
    if !rest.is_empty() {
        let remaining = rest.len();
        let token = req
            .state
            .save_continuation(Continuation { created: std::time::Instant::now(), rv, items: rest })
            .map_err(|_| ApiError::internal("too many paginated lists in progress; retry without limit"))?;
        list_meta["continue"] = Value::String(token);
        list_meta["remainingItemCount"] = json!(remaining);
    }
    if wants_table {
        let page: Vec<Value> = page.iter().map(|o| served(&req.rt, &o.value())).collect();
        return Ok(reply(200, crate::schema::table::table(&req.rt, &page, list_meta, req.q("includeObject"))));
    }
    Ok(Reply { code: 200, body: Payload::Text(list_text(&req.rt, &list_meta, &page)), warnings: vec![] })
}

/// A list of stored objects, written around their stored text.
fn list_text(rt: &ResourceType, list_meta: &Value, items: &[Object]) -> Bytes {
    let head = json!({"kind": rt.list_kind, "apiVersion": rt.api_version(), "metadata": list_meta});
    let mut out = serde_json::to_vec(&head).unwrap_or_default();
    out.pop(); // the closing brace: the items follow
    out.reserve(items.iter().map(|o| o.json().len() + 1).sum::<usize>() + 12);
    out.extend_from_slice(b",\"items\":[");
    for (i, o) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(&served_json(rt, o));
    }
    out.extend_from_slice(b"]}");
    Bytes::from(out)
}

// ---------------------------------------------------------------- decoding

fn decode(req: &Request) -> ApiResult<Value> {
    let ct = req.content_type();
    let v: Value = match ct.as_str() {
        "" | "application/json" | "application/merge-patch+json" | "application/json-patch+json"
        | "application/strategic-merge-patch+json" => serde_json::from_slice(&req.body)
            .map_err(|e| ApiError::bad_request(format!("the body of the request could not be decoded as JSON: {e}")))?,
        "application/yaml" | "application/apply-patch+yaml" => serde_yaml::from_slice(&req.body)
            .map_err(|e| ApiError::bad_request(format!("the body of the request could not be decoded as YAML: {e}")))?,
        crate::objects::protobuf::CONTENT_TYPE if req.rt.builtin.is_some() => crate::objects::protobuf::decode(&req.body)
            .map_err(|e| ApiError::bad_request(format!("the body of the request could not be decoded as protobuf: {e}")))?,
        other => {
            return Err(ApiError::unsupported_media(format!(
                "the body of the request was in an unknown format ({other}) - accepted media types include: application/json, application/yaml"
            )))
        }
    };
    Ok(v)
}

fn decode_object(req: &Request) -> ApiResult<Value> {
    let v = decode(req)?;
    if !v.is_object() {
        return Err(ApiError::bad_request("the body of the request must be a JSON object"));
    }
    Ok(v)
}

/// apiVersion and kind, when sent, must name this resource.
fn check_type_meta(rt: &ResourceType, obj: &mut Value) -> ApiResult<()> {
    let av = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
    if (!av.is_empty() && av != rt.api_version()) || (!kind.is_empty() && kind != rt.kind) {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({av}) does not match the expected API version ({}) or kind ({kind}) does not match {}",
            rt.api_version(),
            rt.kind
        )));
    }
    obj["apiVersion"] = Value::String(rt.api_version());
    obj["kind"] = Value::String(rt.kind.clone());
    Ok(())
}

/// The namespace in the body must match the URL's (or be empty).
fn check_namespace(req: &Request, obj: &mut Value) -> ApiResult<()> {
    let m = meta::meta_mut(obj);
    if req.rt.namespaced {
        let body_ns = m.get("namespace").and_then(Value::as_str).unwrap_or("");
        let url_ns = req.ns();
        if url_ns.is_empty() {
            return Err(ApiError::bad_request("a namespace is required for this resource"));
        }
        if !body_ns.is_empty() && body_ns != url_ns {
            return Err(ApiError::bad_request("the namespace of the provided object does not match the namespace sent on the request"));
        }
        m.insert("namespace".into(), Value::String(url_ns.to_string()));
    } else {
        m.remove("namespace");
    }
    Ok(())
}

// ---------------------------------------------------------------- validation

/// Default, prune and validate an object against its schema and the metadata rules.
fn validate_object(rt: &ResourceType, obj: &mut Value, fv: FieldValidation, warnings: &mut Vec<String>) -> ApiResult<()> {
    crate::schema::default(obj, &rt.schema);
    let pruned = crate::schema::prune(obj, &rt.schema);
    if !pruned.is_empty() {
        match fv {
            FieldValidation::Strict => {
                let list: Vec<String> = pruned.iter().map(|p| format!("unknown field \"{p}\"")).collect();
                return Err(ApiError::bad_request(format!("strict decoding error: {}", list.join(", "))));
            }
            FieldValidation::Warn => warnings.extend(pruned.iter().map(|p| format!("unknown field \"{p}\""))),
            FieldValidation::Ignore => {}
        }
    }
    let mut causes = meta::validate(obj, rt.builtin == Some(Builtin::Namespace));
    for e in crate::schema::validate(obj, &rt.schema) {
        causes.push((e.field.clone(), cause_reason(e.kind).into(), e.message.clone()));
    }
    causes.extend(builtins::validate(rt, obj));
    if !causes.is_empty() {
        return Err(ApiError::invalid(&rt.group_kind(), meta::name(obj), causes));
    }
    Ok(())
}

/// The `reason` of a validation cause, as the real server names it.
fn cause_reason(k: crate::schema::FieldErrorKind) -> &'static str {
    use crate::schema::FieldErrorKind as K;
    match k {
        K::Required => "FieldValueRequired",
        K::Invalid => "FieldValueInvalid",
        K::Unsupported => "FieldValueNotSupported",
        K::TooLong => "FieldValueTooLong",
        K::TooMany => "FieldValueTooMany",
        K::TypeInvalid => "FieldValueTypeInvalid",
        K::Duplicate => "FieldValueDuplicate",
        K::Forbidden => "FieldValueForbidden",
        K::Internal => "InternalError",
    }
}

// ---------------------------------------------------------------- create

fn create(req: &Request) -> ApiResult<Reply> {
    if req.sub.is_some() {
        return Err(ApiError::method_not_allowed("subresources cannot be created"));
    }
    let mut obj = decode_object(req)?;
    check_type_meta(&req.rt, &mut obj)?;
    check_namespace(req, &mut obj)?;
    let mut warnings = Vec::new();
    let out = create_object(&req.state, &req.rt, obj, &req.manager(), req.field_validation()?, req.dry_run()?, false, &mut warnings)?;
    Ok(Reply { code: 201, body: out.served(&req.rt), warnings })
}

/// Create an object (API create, or server-side apply of a new object).
#[allow(clippy::too_many_arguments)]
pub fn create_object(
    state: &State,
    rt: &ResourceType,
    mut obj: Value,
    manager: &str,
    fv: FieldValidation,
    dry_run: bool,
    managed_done: bool,
    warnings: &mut Vec<String>,
) -> ApiResult<Written> {
    let ns = meta::namespace(&obj).to_string();
    if rt.namespaced {
        let ns_rt = state.builtin("", "namespaces");
        match state.store.get(&ns_rt.storage_key(), "", &ns) {
            None => return Err(ApiError::not_found("namespaces", &ns)),
            Some(n) if n.is_deleting() => {
                return Err(ApiError::forbidden(format!(
                    "{} \"{}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                    rt.group_resource(),
                    meta::name(&obj)
                )))
            }
            _ => {}
        }
    }
    // Status is the controllers' to write, through the status subresource.
    if rt.status_subresource && rt.builtin.is_none() {
        if let Some(o) = obj.as_object_mut() {
            o.remove("status");
        }
    }
    let generate = meta::name(&obj).is_empty().then(|| meta::str_field(&obj, "generateName").unwrap_or("").to_string());
    {
        let m = meta::meta_mut(&mut obj);
        for k in ["resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"] {
            m.remove(k);
        }
        m.insert("uid".into(), Value::String(uuid::Uuid::new_v4().to_string()));
        m.insert("creationTimestamp".into(), Value::String(now()));
        if rt.has_generation() {
            m.insert("generation".into(), json!(1));
        } else {
            m.remove("generation");
        }
        if let Some(g) = &generate {
            if !g.is_empty() {
                m.insert("name".into(), Value::String(format!("{g}{}", random_suffix())));
            }
        }
    }
    builtins::prepare_create(rt, &mut obj);
    validate_object(rt, &mut obj, fv, warnings)?;
    if !managed_done {
        crate::objects::managed::record_update(None, &mut obj, manager, &rt.shape, &rt.api_version(), &now(), None);
    }
    if dry_run {
        return Ok(Written::DryRun(obj));
    }
    let key = rt.storage_key();
    for attempt in 0..8 {
        let name = meta::name(&obj).to_string();
        match state.store.commit(&key, &ns, &name, Expect::Absent, Some(obj.clone())) {
            Ok(stored) => {
                builtins::after_commit(state, rt, &stored);
                return Ok(Written::Stored(stored));
            }
            Err(CommitError::AlreadyExists) if generate.as_deref().is_some_and(|g| !g.is_empty()) && attempt < 7 => {
                let g = generate.clone().unwrap_or_default();
                meta::meta_mut(&mut obj).insert("name".into(), Value::String(format!("{g}{}", random_suffix())));
            }
            Err(CommitError::AlreadyExists) => return Err(ApiError::already_exists(&rt.group_resource(), &name)),
            Err(_) => return Err(ApiError::internal("create failed")),
        }
    }
    Err(ApiError::internal("could not generate a unique name"))
}

fn random_suffix() -> String {
    use rand::Rng;
    const CHARS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5).map(|_| CHARS[rng.random_range(0..CHARS.len())] as char).collect()
}

// ---------------------------------------------------------------- update & patch

/// Why a write did not happen.
pub enum WriteError {
    /// The object changed since it was read; the caller may re-read and retry.
    Stale,
    Api(ApiError),
}

impl From<ApiError> for WriteError {
    fn from(e: ApiError) -> Self {
        WriteError::Api(e)
    }
}

/// Options of one write.
pub struct WriteOpts<'a> {
    pub manager: &'a str,
    pub subresource: Option<&'a str>,
    pub fv: FieldValidation,
    pub dry_run: bool,
    /// Managed fields were already computed (server-side apply).
    pub managed_done: bool,
}

fn update(req: &Request) -> ApiResult<Reply> {
    let mut body = decode_object(req)?;
    if req.sub.as_deref() == Some("scale") {
        return update_scale(req, body);
    }
    check_type_meta(&req.rt, &mut body)?;
    check_namespace(req, &mut body)?;
    let body_name = meta::name(&body);
    if !body_name.is_empty() && body_name != req.name() {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({})",
            req.name()
        )));
    }
    let precondition = match meta::str_field(&body, "resourceVersion").filter(|s| !s.is_empty()) {
        Some(s) => Some(s.parse::<u64>().map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {s:?}")))?),
        None => None,
    };
    let current = req.state.store.get(&req.rt.storage_key(), req.ns(), req.name())
        .ok_or_else(|| ApiError::not_found(&req.rt.group_resource(), req.name()))?;
    if precondition.is_some_and(|p| p != current.rv()) {
        return Err(stale(&req.rt, req.name()));
    }
    let current = Current::of(current);
    let candidate = candidate_for(&req.rt, req.sub.as_deref(), &current.tree, body);
    let mut warnings = Vec::new();
    let opts = WriteOpts { manager: &req.manager(), subresource: req.sub.as_deref(), fv: req.field_validation()?, dry_run: req.dry_run()?, managed_done: false };
    match write(&req.state, &req.rt, &current, candidate, &opts, &mut warnings) {
        Ok(w) => Ok(Reply { code: 200, body: w.served(&req.rt), warnings }),
        Err(WriteError::Stale) => Err(stale(&req.rt, req.name())),
        Err(WriteError::Api(e)) => Err(e),
    }
}

fn stale(rt: &ResourceType, name: &str) -> ApiError {
    ApiError::conflict(&rt.group_resource(), name, "the object has been modified; please apply your changes to the latest version and try again")
}

/// What an update of `sub` may change: the main endpoint never changes status
/// (when there is a status subresource); the status endpoint changes only status.
fn candidate_for(rt: &ResourceType, sub: Option<&str>, current: &Value, mut body: Value) -> Value {
    match sub {
        Some("status") => {
            let mut c = current.clone();
            match body.get_mut("status").map(Value::take) {
                Some(s) if !s.is_null() => c["status"] = s,
                _ => {
                    if let Some(o) = c.as_object_mut() {
                        o.remove("status");
                    }
                }
            }
            c
        }
        Some("finalize") => {
            let mut c = current.clone();
            c["spec"]["finalizers"] = body.pointer("/spec/finalizers").cloned().unwrap_or(json!([]));
            c
        }
        _ => {
            if rt.status_subresource && rt.builtin != Some(Builtin::Namespace) {
                match current.get("status") {
                    Some(s) => body["status"] = s.clone(),
                    None => {
                        if let Some(o) = body.as_object_mut() {
                            o.remove("status");
                        }
                    }
                }
            }
            if rt.builtin == Some(Builtin::Namespace) {
                // A namespace's phase is the server's, its finalizers change only through `finalize`.
                body["status"] = current.get("status").cloned().unwrap_or(json!({}));
                body["spec"] = current.get("spec").cloned().unwrap_or(json!({}));
            }
            body
        }
    }
}

/// The one update path: system metadata, finalizer rules, validation, generation,
/// managed fields, no-op detection, finalization, commit.
pub fn write(state: &State, rt: &ResourceType, current: &Current, mut new: Value, opts: &WriteOpts, warnings: &mut Vec<String>) -> Result<Written, WriteError> {
    let (stored, current) = (&current.stored, &current.tree);
    {
        let cm = meta::meta(current).cloned().unwrap_or_default();
        let m = meta::meta_mut(&mut new);
        for k in ["uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation", "name", "namespace"] {
            match cm.get(k) {
                Some(v) => {
                    m.insert(k.into(), v.clone());
                }
                None => {
                    m.remove(k);
                }
            }
        }
        m.remove("resourceVersion");
        m.remove("selfLink");
        if !m.contains_key("managedFields") {
            if let Some(mf) = cm.get("managedFields") {
                m.insert("managedFields".into(), mf.clone());
            }
        }
    }
    if meta::is_deleting(current) {
        let before = meta::finalizers(current);
        if let Some(added) = meta::finalizers(&new).into_iter().find(|f| !before.contains(f)) {
            return Err(ApiError::invalid(&rt.group_kind(), meta::name(current), vec![(
                "metadata.finalizers".into(),
                "FieldValueForbidden".into(),
                format!("metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{{{added:?}}}"),
            )])
            .into());
        }
    }
    builtins::prepare_update(rt, current, &mut new)?;
    validate_object(rt, &mut new, opts.fv, warnings)?;
    if rt.has_generation() && spec_changed(rt, current, &new) {
        let g = current.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(0);
        meta::meta_mut(&mut new).insert("generation".into(), json!(g + 1));
    }
    if !opts.managed_done {
        crate::objects::managed::record_update(Some(current), &mut new, opts.manager, &rt.shape, &rt.api_version(), &now(), opts.subresource);
    }
    if unchanged(current, &new) {
        return Ok(Written::Stored(stored.clone()));
    }
    let finished = meta::is_deleting(&new) && meta::finalizers(&new).is_empty() && !builtins::blocks_deletion(rt, &new);
    if opts.dry_run {
        return Ok(Written::DryRun(new));
    }
    let (ns, name) = (stored.namespace(), stored.name());
    let expect = Expect::Version(stored.rv());
    let result = if finished {
        // The response and the DELETED event show the object as this update left it.
        state.store.commit_delete_as(&rt.storage_key(), ns, name, expect, new)
    } else {
        state.store.commit(&rt.storage_key(), ns, name, expect, Some(new))
    };
    match result {
        Ok(stored) => {
            if finished {
                builtins::after_delete(state, rt, &stored);
            } else {
                builtins::after_commit(state, rt, &stored);
            }
            Ok(Written::Stored(stored))
        }
        Err(CommitError::Conflict) | Err(CommitError::NotFound) => Err(WriteError::Stale),
        Err(CommitError::AlreadyExists) => Err(WriteError::Api(ApiError::internal("unexpected store state"))),
    }
}

/// Did anything but metadata (and status, when it has its own endpoint) change?
fn spec_changed(rt: &ResourceType, a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| -> Value {
        let mut v = v.clone();
        if let Some(o) = v.as_object_mut() {
            o.remove("metadata");
            if rt.status_subresource {
                o.remove("status");
            }
        }
        v
    };
    strip(a) != strip(b)
}

/// Equal apart from the resourceVersion and managed-field timestamps: a no-op update.
fn unchanged(current: &Value, new: &Value) -> bool {
    let norm = |v: &Value| -> Value {
        let mut v = v.clone();
        let m = meta::meta_mut(&mut v);
        m.remove("resourceVersion");
        if let Some(Value::Array(entries)) = m.get_mut("managedFields") {
            for e in entries.iter_mut() {
                if let Some(o) = e.as_object_mut() {
                    o.remove("time");
                }
            }
        }
        v
    };
    norm(current) == norm(new)
}

fn patch(req: &Request) -> ApiResult<Reply> {
    let ct = req.content_type();
    let kind = match ct.as_str() {
        "application/merge-patch+json" => PatchKind::Merge,
        "application/json-patch+json" => PatchKind::Json,
        "application/strategic-merge-patch+json" if req.rt.builtin.is_some() || req.sub.as_deref() == Some("scale") => PatchKind::Strategic,
        "application/apply-patch+yaml" => return apply(req),
        _ => {
            return Err(ApiError::unsupported_media(format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml{}",
                if req.rt.builtin.is_some() { ", application/strategic-merge-patch+json" } else { "" }
            )))
        }
    };
    let body = decode(req)?;
    let opts = WriteOpts { manager: &req.manager(), subresource: req.sub.as_deref(), fv: req.field_validation()?, dry_run: req.dry_run()?, managed_done: false };
    // Patches without a resourceVersion apply to whatever is current: retry on races.
    for _ in 0..16 {
        let current = req.state.store.get(&req.rt.storage_key(), req.ns(), req.name())
            .ok_or_else(|| ApiError::not_found(&req.rt.group_resource(), req.name()))?;
        let current = Current::of(current);
        let scale = req.sub.as_deref() == Some("scale");
        let base = if scale { scale_of(&req.rt, &current.tree)? } else { served(&req.rt, &current.tree) };
        let shape = if scale { crate::schema::shape::Shape::Any } else { req.rt.shape.clone() };
        let patched = match kind {
            PatchKind::Merge => crate::objects::patch::merge_patch(&base, &body),
            PatchKind::Json => crate::objects::patch::json_patch(&base, &body).map_err(|e| ApiError::unprocessable(e.to_string()))?,
            PatchKind::Strategic => crate::objects::patch::strategic_merge_patch(&base, &body, &shape).map_err(|e| ApiError::unprocessable(e.to_string()))?,
        };
        if !patched.is_object() {
            return Err(ApiError::bad_request("the patch did not produce an object"));
        }
        let user_rv = meta::str_field(&patched, "resourceVersion").filter(|s| !s.is_empty()).map(String::from);
        if user_rv.as_deref().is_some_and(|r| r != current.stored.rv().to_string()) {
            return Err(stale(&req.rt, req.name()));
        }
        let mut candidate = if scale {
            with_replicas(&req.rt, &current.tree, &patched)?
        } else {
            let mut p = patched;
            check_type_meta(&req.rt, &mut p)?;
            if meta::name(&p) != req.name() || (req.rt.namespaced && meta::namespace(&p) != req.ns()) {
                return Err(ApiError::bad_request("metadata.name and metadata.namespace cannot be changed by a patch"));
            }
            candidate_for(&req.rt, req.sub.as_deref(), &current.tree, p)
        };
        if kind != PatchKind::Strategic || req.rt.builtin.is_none() {
            // Nothing to adjust.
        }
        let mut warnings = Vec::new();
        match write(&req.state, &req.rt, &current, std::mem::take(&mut candidate), &opts, &mut warnings) {
            Ok(w) => {
                let body = if scale { Payload::Tree(scale_of(&req.rt, &w.tree())?) } else { w.served(&req.rt) };
                return Ok(Reply { code: 200, body, warnings });
            }
            Err(WriteError::Stale) if user_rv.is_none() => continue,
            Err(WriteError::Stale) => return Err(stale(&req.rt, req.name())),
            Err(WriteError::Api(e)) => return Err(e),
        }
    }
    Err(stale(&req.rt, req.name()))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum PatchKind {
    Merge,
    Json,
    Strategic,
}

/// Server-side apply.
fn apply(req: &Request) -> ApiResult<Reply> {
    let manager = req.q("fieldManager").ok_or_else(|| ApiError::bad_request("PATCH requests with apply-patch+yaml must have fieldManager"))?.to_string();
    let force = match req.q("force") {
        None | Some("false") => false,
        Some("true") => true,
        Some(o) => return Err(ApiError::bad_request(format!("invalid force value {o:?}"))),
    };
    if req.sub.as_deref() == Some("scale") {
        return Err(ApiError::unsupported_media("server-side apply of the scale subresource is not supported; use a merge patch"));
    }
    let mut applied = decode_object(req)?;
    let av = applied.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = applied.get("kind").and_then(Value::as_str).unwrap_or("");
    if av.is_empty() || kind.is_empty() {
        return Err(ApiError::bad_request("apiVersion and kind must be set in an applied configuration"));
    }
    check_type_meta(&req.rt, &mut applied)?;
    let name = meta::name(&applied).to_string();
    if name != req.name() {
        return Err(ApiError::bad_request(format!("the name of the object ({name}) does not match the name on the URL ({})", req.name())));
    }
    check_namespace(req, &mut applied)?;
    // Each endpoint owns its part of the object (the real server's "reset fields").
    if let Some(o) = applied.as_object_mut() {
        match req.sub.as_deref() {
            Some("status") => o.retain(|k, _| matches!(k.as_str(), "apiVersion" | "kind" | "metadata" | "status")),
            _ if req.rt.status_subresource => {
                o.remove("status");
            }
            _ => {}
        }
    }
    let fv = req.field_validation()?;
    let dry = req.dry_run()?;
    let api_version = req.rt.api_version();
    for _ in 0..16 {
        let current = req.state.store.get(&req.rt.storage_key(), req.ns(), req.name()).map(Current::of);
        let merged = crate::objects::managed::apply(
            current.as_ref().map(|c| &c.tree),
            &applied,
            &manager,
            force,
            &req.rt.shape,
            &api_version,
            &now(),
            req.sub.as_deref(),
        )
        .map_err(|conflicts| {
            let pairs: Vec<(String, String)> = conflicts.into_iter().map(|c| (c.manager, c.path)).collect();
            ApiError::apply_conflict(&req.rt.group_resource(), req.name(), &pairs)
        })?;
        let mut warnings = Vec::new();
        let Some(current) = current else {
            if req.sub.is_some() {
                return Err(ApiError::not_found(&req.rt.group_resource(), req.name()));
            }
            let out = create_object(&req.state, &req.rt, merged, &manager, fv, dry, true, &mut warnings);
            match out {
                Err(e) if e.reason == "AlreadyExists" => continue,
                Err(e) => return Err(e),
                Ok(w) => return Ok(Reply { code: 201, body: w.served(&req.rt), warnings }),
            }
        };
        let candidate = candidate_for(&req.rt, req.sub.as_deref(), &current.tree, merged);
        let opts = WriteOpts { manager: &manager, subresource: req.sub.as_deref(), fv, dry_run: dry, managed_done: true };
        match write(&req.state, &req.rt, &current, candidate, &opts, &mut warnings) {
            Ok(w) => return Ok(Reply { code: 200, body: w.served(&req.rt), warnings }),
            Err(WriteError::Stale) => continue,
            Err(WriteError::Api(e)) => return Err(e),
        }
    }
    Err(stale(&req.rt, req.name()))
}

// ---------------------------------------------------------------- scale

fn path_segments(p: &str) -> Vec<&str> {
    p.trim_start_matches('.').split('.').filter(|s| !s.is_empty()).collect()
}

fn lookup<'a>(obj: &'a Value, p: &str) -> Option<&'a Value> {
    path_segments(p).into_iter().try_fold(obj, |v, s| v.get(s))
}

/// The autoscaling/v1 Scale view of an object.
fn scale_of(rt: &ResourceType, obj: &Value) -> ApiResult<Value> {
    let s = rt.scale.as_ref().ok_or_else(ApiError::no_such_resource)?;
    let spec = lookup(obj, &s.spec_replicas_path).and_then(Value::as_i64).unwrap_or(0);
    let status = lookup(obj, &s.status_replicas_path).and_then(Value::as_i64).unwrap_or(0);
    let selector = s.label_selector_path.as_deref().and_then(|p| lookup(obj, p)).and_then(Value::as_str).unwrap_or("");
    let m = meta::meta(obj).cloned().unwrap_or_default();
    let pick = |k: &str| m.get(k).cloned().unwrap_or(Value::Null);
    Ok(json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {"name": pick("name"), "namespace": pick("namespace"), "uid": pick("uid"),
                     "resourceVersion": pick("resourceVersion"), "creationTimestamp": pick("creationTimestamp")},
        "spec": {"replicas": spec},
        "status": {"replicas": status, "selector": selector},
    }))
}

/// The object with the Scale's `spec.replicas` written to the spec replicas path.
fn with_replicas(rt: &ResourceType, current: &Value, scale: &Value) -> ApiResult<Value> {
    let s = rt.scale.as_ref().ok_or_else(ApiError::no_such_resource)?;
    let replicas = scale.pointer("/spec/replicas").and_then(Value::as_i64).ok_or_else(|| {
        ApiError::invalid("Scale.autoscaling", meta::name(current), vec![("spec.replicas".into(), "FieldValueRequired".into(), "spec.replicas: Required value".into())])
    })?;
    if replicas < 0 {
        return Err(ApiError::invalid("Scale.autoscaling", meta::name(current), vec![(
            "spec.replicas".into(),
            "FieldValueInvalid".into(),
            format!("spec.replicas: Invalid value: {replicas}: must be greater than or equal to 0"),
        )]));
    }
    let mut obj = current.clone();
    let segs = path_segments(&s.spec_replicas_path);
    let mut cur = &mut obj;
    for (i, seg) in segs.iter().enumerate() {
        if !cur.is_object() {
            *cur = Value::Object(Map::new());
        }
        if i == segs.len() - 1 {
            cur[*seg] = json!(replicas);
            break;
        }
        cur = cur.as_object_mut().expect("object").entry(seg.to_string()).or_insert_with(|| Value::Object(Map::new()));
    }
    Ok(obj)
}

fn update_scale(req: &Request, body: Value) -> ApiResult<Reply> {
    let current = req.state.store.get(&req.rt.storage_key(), req.ns(), req.name())
        .ok_or_else(|| ApiError::not_found(&req.rt.group_resource(), req.name()))?;
    if let Some(rv) = meta::str_field(&body, "resourceVersion").filter(|s| !s.is_empty()) {
        if rv != current.rv().to_string() {
            return Err(stale(&req.rt, req.name()));
        }
    }
    let current = Current::of(current);
    let candidate = with_replicas(&req.rt, &current.tree, &body)?;
    let mut warnings = Vec::new();
    let opts = WriteOpts { manager: &req.manager(), subresource: Some("scale"), fv: FieldValidation::Warn, dry_run: req.dry_run()?, managed_done: false };
    match write(&req.state, &req.rt, &current, candidate, &opts, &mut warnings) {
        Ok(w) => Ok(Reply { code: 200, body: Payload::Tree(scale_of(&req.rt, &w.tree())?), warnings }),
        Err(WriteError::Stale) => Err(stale(&req.rt, req.name())),
        Err(WriteError::Api(e)) => Err(e),
    }
}

// ---------------------------------------------------------------- delete

/// How dependents are treated when their owner is deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Propagation {
    Background,
    Foreground,
    Orphan,
}

struct DeleteOptions {
    propagation: Propagation,
    dry_run: bool,
    uid: Option<String>,
    rv: Option<String>,
}

fn delete_options(req: &Request) -> ApiResult<DeleteOptions> {
    let body: Value = if req.body.iter().all(u8::is_ascii_whitespace) {
        Value::Null
    } else {
        serde_json::from_slice(&req.body).map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?
    };
    let policy = body
        .get("propagationPolicy")
        .and_then(Value::as_str)
        .map(String::from)
        .or_else(|| req.q("propagationPolicy").map(String::from))
        .or_else(|| {
            let orphan = body.get("orphanDependents").and_then(Value::as_bool).or_else(|| req.q("orphanDependents").map(|s| s == "true"));
            orphan.map(|o| if o { "Orphan".to_string() } else { "Background".to_string() })
        });
    let propagation = match policy.as_deref() {
        None | Some("Background") => Propagation::Background,
        Some("Foreground") => Propagation::Foreground,
        Some("Orphan") => Propagation::Orphan,
        Some(o) => return Err(ApiError::bad_request(format!("propagationPolicy {o:?} is invalid: must be Orphan, Background or Foreground"))),
    };
    let dry_run = match body.get("dryRun") {
        Some(Value::Array(a)) if a.iter().any(|v| v == "All") => true,
        Some(Value::Array(a)) if a.is_empty() => req.dry_run()?,
        None | Some(Value::Null) => req.dry_run()?,
        Some(other) => return Err(ApiError::bad_request(format!("Invalid dry run value: {other}: supported values: \"All\""))),
    };
    Ok(DeleteOptions {
        propagation,
        dry_run,
        uid: body.pointer("/preconditions/uid").and_then(Value::as_str).map(String::from),
        rv: body.pointer("/preconditions/resourceVersion").and_then(Value::as_str).map(String::from),
    })
}

fn delete(req: &Request) -> ApiResult<Reply> {
    if req.sub.is_some() {
        return Err(ApiError::method_not_allowed("subresources cannot be deleted"));
    }
    let opts = delete_options(req)?;
    let dry = opts.dry_run;
    for _ in 0..16 {
        let current = req.state.store.get(&req.rt.storage_key(), req.ns(), req.name())
            .ok_or_else(|| ApiError::not_found(&req.rt.group_resource(), req.name()))?;
        if let Some(uid) = &opts.uid {
            if uid != current.uid() {
                return Err(ApiError::conflict(&req.rt.group_resource(), req.name(), &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}", current.uid())));
            }
        }
        if let Some(rv) = &opts.rv {
            if *rv != current.rv().to_string() {
                return Err(ApiError::conflict(&req.rt.group_resource(), req.name(), &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}", current.rv())));
            }
        }
        match delete_object(&req.state, &req.rt, &current, opts.propagation, dry) {
            // Removed at once: like kube-apiserver (no type here sets ReturnDeletedObject), a
            // Status naming what went; still there (finalizers): the object as it now is.
            Ok(w) if !dry && !w.is_deleting() => return Ok(reply(200, deleted_status(&req.rt, &w.tree()))),
            Ok(w) => return Ok(Reply { code: 200, body: w.served(&req.rt), warnings: vec![] }),
            Err(WriteError::Stale) => continue,
            Err(WriteError::Api(e)) => return Err(e),
        }
    }
    Err(stale(&req.rt, req.name()))
}

/// The `Status` a DELETE answers with when the object is gone.
fn deleted_status(rt: &ResourceType, obj: &Value) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": meta::name(obj), "group": rt.group, "kind": rt.plural, "uid": meta::uid(obj)},
    })
}

/// Delete an object: mark it deleting while finalizers remain, remove it otherwise.
pub fn delete_object(state: &State, rt: &ResourceType, current: &Object, propagation: Propagation, dry_run: bool) -> Result<Written, WriteError> {
    let before = current.value();
    let mut obj = before.clone();
    let mut finalizers = meta::finalizers(&obj);
    let wanted = match propagation {
        Propagation::Orphan => Some("orphan"),
        Propagation::Foreground => Some("foregroundDeletion"),
        Propagation::Background => None,
    };
    if let Some(f) = wanted {
        // The policy given at first deletion wins; a later delete doesn't switch it.
        if !meta::is_deleting(&obj) && !finalizers.iter().any(|x| x == f) {
            finalizers.push(f.to_string());
        }
    }
    builtins::prepare_delete(state, rt, &mut obj, &mut finalizers);
    meta::set_finalizers(&mut obj, &finalizers);
    let key = rt.storage_key();
    let (ns, name) = (current.namespace(), current.name());
    if !finalizers.is_empty() || builtins::blocks_deletion(rt, &obj) {
        if !meta::is_deleting(&obj) {
            let m = meta::meta_mut(&mut obj);
            m.insert("deletionTimestamp".into(), Value::String(now()));
            m.insert("deletionGracePeriodSeconds".into(), json!(0));
            if rt.has_generation() {
                let g = m.get("generation").and_then(Value::as_i64).unwrap_or(0);
                m.insert("generation".into(), json!(g + 1));
            }
        }
        if dry_run {
            return Ok(Written::DryRun(obj));
        }
        if obj == before {
            return Ok(Written::Stored(current.clone()));
        }
        return match state.store.commit(&key, ns, name, Expect::Version(current.rv()), Some(obj)) {
            Ok(stored) => Ok(Written::Stored(stored)),
            Err(_) => Err(WriteError::Stale),
        };
    }
    if dry_run {
        return Ok(Written::DryRun(obj));
    }
    match state.store.commit(&key, ns, name, Expect::Version(current.rv()), None) {
        Ok(stored) => {
            builtins::after_delete(state, rt, &stored);
            Ok(Written::Stored(stored))
        }
        Err(_) => Err(WriteError::Stale),
    }
}

fn delete_collection(req: &Request) -> ApiResult<Reply> {
    let opts = delete_options(req)?;
    let dry = opts.dry_run;
    let filter = Filter::from_request(req)?;
    let (items, _) = req.state.store.list(&req.rt.storage_key(), req.namespace.as_deref());
    let mut deleted = Vec::new();
    for item in items.into_iter().filter(|o| filter.matches(o)) {
        match delete_object(&req.state, &req.rt, &item, opts.propagation, dry) {
            Ok(w) => deleted.push(served(&req.rt, &w.tree())),
            Err(WriteError::Stale) => {} // changed or gone meanwhile; a later pass will see it
            Err(WriteError::Api(e)) => return Err(e),
        }
    }
    let rv = req.state.store.current_rv();
    Ok(reply(200, json!({"kind": req.rt.list_kind, "apiVersion": req.rt.api_version(), "metadata": {"resourceVersion": rv.to_string()}, "items": deleted})))
}

/// `default`, `kube-system`, `kube-public` and `kube-node-lease` exist from the start.
pub fn ensure_default_namespaces(state: &State) {
    let rt = state.builtin("", "namespaces");
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        if state.store.get(&rt.storage_key(), "", ns).is_none() {
            let obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
            if let Err(e) = create_object(state, &rt, obj, "banlieue-apiserver", FieldValidation::Ignore, false, false, &mut vec![]) {
                tracing::error!("creating namespace {ns}: {e}");
            }
        }
    }
}
