//! RBAC as kube-apiserver's authorizer applies it: a request made as a user other
//! than the token's (`Impersonate-User`, e.g. a ServiceAccount) is allowed only when a
//! ClusterRoleBinding, or a RoleBinding in the request's namespace, grants a rule that
//! matches its verb, API group, resource/subresource and name. The token's own user is
//! a cluster administrator (`system:masters`). No escalation checks, no aggregation.

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
            return User { name: ADMIN.into(), groups: vec!["system:masters".into(), "system:authenticated".into()] };
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

/// `POST selfsubjectaccessreviews`: answer whether the requesting user may do what the
/// review's `spec.resourceAttributes` describe (non-resource URLs are always allowed).
pub fn self_subject_access_review(state: &State, user: &User, review: &Value) -> Value {
    let ra = review.pointer("/spec/resourceAttributes").cloned().unwrap_or(Value::Null);
    let field = |f: &str| ra[f].as_str().filter(|s| !s.is_empty());
    let allowed = if ra.is_object() {
        let attrs = Attributes {
            verb: field("verb").unwrap_or_default(),
            group: field("group").unwrap_or_default(),
            resource: field("resource").unwrap_or_default(),
            subresource: field("subresource"),
            namespace: field("namespace"),
            name: field("name"),
        };
        allowed(state, user, &attrs)
    } else {
        true
    };
    json!({
        "kind": "SelfSubjectAccessReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": null},
        "spec": review.get("spec").cloned().unwrap_or(json!({})),
        "status": {"allowed": allowed},
    })
}
