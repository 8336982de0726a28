//! RBAC as kube-apiserver's authorizer applies it: a request made as a user other
//! than the token's (`Impersonate-User`, e.g. a ServiceAccount) is allowed only when a
//! ClusterRoleBinding, or a RoleBinding in the request's namespace, grants a rule that
//! matches its verb, API group, resource/subresource and name. The token's own user is
//! a cluster administrator (`system:masters`); a token TokenRequest issued for a
//! ServiceAccount is that account, under the same rules. `TokenReview` and
//! `SubjectAccessReview` answer from them, for components that authorize users of their own
//! (banlieue's consoles). No escalation checks, no aggregation.

use serde_json::{json, Value};

use crate::storage::object::Object;
use crate::storage::state::State;
use crate::status::ApiError;

const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// The user a request acts as, and its groups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
}

/// The token's user: every request without impersonation.
pub const ADMIN: &str = "admin";

impl User {
    /// From `Impersonate-User` / `Impersonate-Group` (the token's user when absent).
    pub fn of(headers: &hyper::HeaderMap) -> User {
        let Some(name) = headers.get("impersonate-user").and_then(|v| v.to_str().ok()) else {
            return User::admin();
        };
        let mut groups: Vec<String> =
            headers.get_all("impersonate-group").iter().filter_map(|v| v.to_str().ok()).map(String::from).collect();
        // ServiceAccounts are in their namespace's group and the all-accounts group.
        if let Some(ns) = name.strip_prefix("system:serviceaccount:").and_then(|rest| rest.split(':').next()) {
            groups.push("system:serviceaccounts".into());
            groups.push(format!("system:serviceaccounts:{ns}"));
        }
        groups.push("system:authenticated".into());
        User { name: name.into(), groups }
    }

    /// The server's own token's user.
    pub fn admin() -> User {
        User { name: ADMIN.into(), groups: vec!["system:masters".into(), "system:authenticated".into()] }
    }

    /// A ServiceAccount, with the groups kube-apiserver gives it.
    pub fn service_account(namespace: &str, name: &str) -> User {
        let groups = vec!["system:serviceaccounts".into(), format!("system:serviceaccounts:{namespace}"), "system:authenticated".into()];
        User { name: format!("system:serviceaccount:{namespace}:{name}"), groups }
    }

    fn is_admin(&self) -> bool {
        self.groups.iter().any(|g| g == "system:masters")
    }
}

/// What a request asks to do, in RBAC's terms.
#[derive(Clone, Debug, Default)]
pub struct Attributes<'a> {
    pub verb: &'a str,
    pub group: &'a str,
    pub resource: &'a str,
    pub subresource: Option<&'a str>,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
}

/// Is `user` allowed to do `attrs`?
pub fn allowed(state: &State, user: &User, attrs: &Attributes) -> bool {
    if user.is_admin() {
        return true;
    }
    let bindings = |plural: &str, ns: Option<&str>| {
        let rt = state.builtin(RBAC_GROUP, plural);
        state.store.list(&rt.storage_key(), ns).0
    };
    // Only the fields read are taken from each stored binding and role (no whole parse per request).
    let granted = |binding: &Object| -> bool {
        let subjects = binding.pointer(&["subjects"]);
        if !subjects.as_ref().and_then(Value::as_array).is_some_and(|subjects| subjects.iter().any(|s| subject_matches(s, user))) {
            return false;
        }
        let role_ref = binding.pointer(&["roleRef"]).unwrap_or_default();
        let name = role_ref["name"].as_str().unwrap_or_default();
        let role = match role_ref["kind"].as_str() {
            Some("ClusterRole") => role_object(state, "clusterroles", "", name),
            Some("Role") => role_object(state, "roles", binding.namespace(), name),
            _ => None,
        };
        let rules = role.and_then(|r| r.pointer(&["rules"]));
        rules.as_ref().and_then(Value::as_array).is_some_and(|rules| rules.iter().any(|rule| rule_matches(rule, attrs)))
    };
    if bindings("clusterrolebindings", None).iter().any(granted) {
        return true;
    }
    attrs.namespace.is_some_and(|ns| bindings("rolebindings", Some(ns)).iter().any(granted))
}

fn role_object(state: &State, plural: &str, ns: &str, name: &str) -> Option<Object> {
    state.store.get(&state.builtin(RBAC_GROUP, plural).storage_key(), ns, name)
}

fn subject_matches(subject: &Value, user: &User) -> bool {
    let name = subject["name"].as_str().unwrap_or_default();
    match subject["kind"].as_str() {
        Some("User") => name == user.name,
        Some("Group") => user.groups.iter().any(|g| g == name),
        Some("ServiceAccount") => {
            let ns = subject["namespace"].as_str().unwrap_or_default();
            user.name == format!("system:serviceaccount:{ns}:{name}")
        }
        _ => false,
    }
}

fn rule_matches(rule: &Value, attrs: &Attributes) -> bool {
    let list = |field: &str| -> Vec<&str> { rule[field].as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default() };
    let verbs = list("verbs");
    let groups = list("apiGroups");
    let resources = list("resources");
    let names = list("resourceNames");
    let resource = match attrs.subresource {
        Some(sub) => format!("{}/{sub}", attrs.resource),
        None => attrs.resource.to_string(),
    };
    let resource_ok = resources.iter().any(|r| {
        *r == "*" || *r == resource || attrs.subresource.is_some_and(|sub| r.strip_prefix("*/") == Some(sub))
    });
    // A rule limited to names never grants an unnamed request (list, watch, create).
    let name_ok = names.is_empty() || attrs.name.is_some_and(|n| names.contains(&n));
    verbs.iter().any(|v| *v == "*" || *v == attrs.verb) && groups.iter().any(|g| *g == "*" || *g == attrs.group) && resource_ok && name_ok
}

/// The 403 kube-apiserver answers, in its words.
pub fn forbidden(user: &User, attrs: &Attributes) -> ApiError {
    let group_resource = if attrs.group.is_empty() { attrs.resource.to_string() } else { format!("{}.{}", attrs.resource, attrs.group) };
    let subject = match attrs.name {
        Some(n) => format!("{group_resource} \"{n}\""),
        None => group_resource,
    };
    let resource = match attrs.subresource {
        Some(sub) => format!("{}/{sub}", attrs.resource),
        None => attrs.resource.to_string(),
    };
    let scope = match attrs.namespace {
        Some(ns) => format!("in the namespace \"{ns}\""),
        None => "at the cluster scope".to_string(),
    };
    let mut e = ApiError::forbidden(format!(
        "{subject} is forbidden: User \"{}\" cannot {} resource \"{resource}\" in API group \"{}\" {scope}",
        user.name, attrs.verb, attrs.group
    ));
    e.details = Some(json!({"name": attrs.name.unwrap_or_default(), "group": attrs.group, "kind": attrs.resource}));
    e
}

/// What a review's `spec.resourceAttributes` ask about.
fn reviewed(ra: &Value) -> Attributes<'_> {
    let field = |f: &str| ra[f].as_str().filter(|s| !s.is_empty());
    Attributes {
        verb: field("verb").unwrap_or_default(),
        group: field("group").unwrap_or_default(),
        resource: field("resource").unwrap_or_default(),
        subresource: field("subresource"),
        namespace: field("namespace"),
        name: field("name"),
    }
}

/// `POST selfsubjectaccessreviews`: answer whether the requesting user may do what the
/// review's `spec.resourceAttributes` describe (non-resource URLs are always allowed).
pub fn self_subject_access_review(state: &State, user: &User, review: &Value) -> Value {
    let ra = review.pointer("/spec/resourceAttributes").cloned().unwrap_or(Value::Null);
    let allowed = if ra.is_object() { allowed(state, user, &reviewed(&ra)) } else { true };
    json!({
        "kind": "SelfSubjectAccessReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": null},
        "spec": review.get("spec").cloned().unwrap_or(json!({})),
        "status": {"allowed": allowed},
    })
}

/// `POST subjectaccessreviews`: whether the review's `spec.user` (with `spec.groups`) may do
/// what `spec.resourceAttributes` describe — how a component asks the cluster about a user
/// it authenticated (banlieue's console does, for `virtualmachines/console`).
pub fn subject_access_review(state: &State, review: &Value) -> Value {
    let spec = review.get("spec").cloned().unwrap_or(json!({}));
    let user = User {
        name: spec["user"].as_str().unwrap_or_default().to_string(),
        groups: spec["groups"].as_array().map(|g| g.iter().filter_map(Value::as_str).map(String::from).collect()).unwrap_or_default(),
    };
    let ra = &spec["resourceAttributes"];
    let (allowed, reason) = if user.name.is_empty() && user.groups.is_empty() {
        (false, "spec.user or spec.groups is required")
    } else if !ra.is_object() {
        (false, "only resourceAttributes are reviewed")
    } else {
        let allowed = self::allowed(state, &user, &reviewed(ra));
        (allowed, if allowed { "allowed by a RoleBinding or ClusterRoleBinding" } else { "no RBAC rule grants it" })
    };
    json!({
        "kind": "SubjectAccessReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": null},
        "spec": spec,
        "status": {"allowed": allowed, "reason": reason},
    })
}

/// `POST tokenreviews`: who `spec.token` is (this server's own token, or one it issued and
/// that has not expired).
pub fn token_review(state: &State, review: &Value) -> Value {
    let token = review.pointer("/spec/token").and_then(Value::as_str).unwrap_or_default();
    let status = match state.review_token(token) {
        Some(user) => json!({"authenticated": true, "user": {"username": user.name, "groups": user.groups}}),
        None => json!({"authenticated": false, "error": "the token is unknown to this server, or expired"}),
    };
    json!({
        "kind": "TokenReview",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"creationTimestamp": null},
        "spec": {"audiences": review.pointer("/spec/audiences").cloned().unwrap_or(json!([]))},
        "status": status,
    })
}

/// `POST serviceaccounts/NAME/token` (TokenRequest): a token for ServiceAccount `ns/name`,
/// valid for `spec.expirationSeconds` (one hour by default; ten minutes at least, as
/// kube-apiserver requires, and two days at most).
pub fn token_request(state: &State, ns: &str, name: &str, request: &Value) -> Result<Value, ApiError> {
    let accounts = state.builtin("", "serviceaccounts");
    if state.store.get(&accounts.storage_key(), ns, name).is_none() {
        return Err(ApiError::not_found(&accounts.group_resource(), name));
    }
    let seconds = request.pointer("/spec/expirationSeconds").and_then(Value::as_u64).unwrap_or(3600);
    if seconds < 600 {
        return Err(ApiError::bad_request("spec.expirationSeconds: may not specify a duration less than 10 minutes"));
    }
    let ttl = std::time::Duration::from_secs(seconds.min(2 * 24 * 3600));
    let Some((token, expires)) = state.issue_token(User::service_account(ns, name), ttl) else {
        return Err(ApiError::forbidden("too many unexpired tokens are out: try again when some expire"));
    };
    let expires = k8s_timestamp(expires);
    Ok(json!({
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": name, "namespace": ns, "creationTimestamp": null},
        "spec": {"audiences": request.pointer("/spec/audiences").cloned().unwrap_or(json!([])), "expirationSeconds": ttl.as_secs()},
        "status": {"token": token, "expirationTimestamp": expires},
    }))
}

/// RFC 3339 in seconds, as Kubernetes writes times.
fn k8s_timestamp(t: std::time::SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t).format("%Y-%m-%dT%H:%M:%SZ").to_string()
}
