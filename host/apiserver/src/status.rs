//! Kubernetes `Status` errors: every failure the server returns is one of these.

use serde_json::{json, Value};

/// An API error, rendered as a `metav1.Status` body with its HTTP code.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self { code, reason, message: message.into(), details: None }
    }
    pub fn bad_request(msg: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", msg)
    }
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }
    pub fn forbidden(msg: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", msg)
    }
    /// `<resource>.<group> "<name>" not found`, as the real server words it.
    pub fn not_found(resource: &str, name: &str) -> Self {
        let mut e = Self::new(404, "NotFound", format!("{resource} \"{name}\" not found"));
        e.details = Some(json!({"name": name, "kind": resource}));
        e
    }
    /// A path the server's own API groups do not serve, in kube-apiserver's words.
    pub fn no_such_resource() -> Self {
        Self::new(404, "NotFound", "the server could not find the requested resource")
    }
    pub fn method_not_allowed(msg: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", msg)
    }
    pub fn already_exists(resource: &str, name: &str) -> Self {
        let mut e = Self::new(409, "AlreadyExists", format!("{resource} \"{name}\" already exists"));
        e.details = Some(json!({"name": name, "kind": resource}));
        e
    }
    pub fn conflict(resource: &str, name: &str, why: &str) -> Self {
        let mut e = Self::new(409, "Conflict", format!("Operation cannot be fulfilled on {resource} \"{name}\": {why}"));
        e.details = Some(json!({"name": name, "kind": resource}));
        e
    }
    /// Server-side apply conflicts: one cause per contested field.
    pub fn apply_conflict(resource: &str, name: &str, conflicts: &[(String, String)]) -> Self {
        let list: Vec<String> =
            conflicts.iter().map(|(m, f)| format!("conflict with \"{m}\": {f}")).collect();
        let message = if list.len() == 1 {
            format!("Apply failed with 1 conflict: {}", list[0])
        } else {
            format!("Apply failed with {} conflicts: {}", list.len(), list.join("\n"))
        };
        let causes: Vec<Value> = conflicts
            .iter()
            .map(|(m, f)| json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{m}\""), "field": f}))
            .collect();
        let mut e = Self::new(409, "Conflict", message);
        e.details = Some(json!({"name": name, "kind": resource, "causes": causes}));
        e
    }
    pub fn gone(msg: impl Into<String>) -> Self {
        Self::new(410, "Expired", msg)
    }
    pub fn too_large() -> Self {
        Self::new(413, "RequestEntityTooLarge", "Request entity too large: limit is 3145728")
    }
    pub fn unsupported_media(msg: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", msg)
    }
    /// 422 with one cause per invalid field.
    pub fn invalid(kind_group: &str, name: &str, causes: Vec<(String, String, String)>) -> Self {
        let msgs: Vec<String> = causes.iter().map(|(_, _, m)| m.clone()).collect();
        let summary = if msgs.len() == 1 { msgs[0].clone() } else { format!("[{}]", msgs.join(", ")) };
        let message = format!("{kind_group} \"{name}\" is invalid: {summary}");
        // The summary says "field: problem"; a cause carries the two apart (clients such as
        // kubectl join them again), so its message must not repeat the field.
        let causes: Vec<Value> = causes
            .into_iter()
            .map(|(field, reason, message)| {
                let message = message.strip_prefix(&format!("{field}: ")).map(String::from).unwrap_or(message);
                json!({"reason": reason, "message": message, "field": field})
            })
            .collect();
        let mut e = Self::new(422, "Invalid", message);
        let (group, kind) = match kind_group.split_once('.') {
            Some((k, g)) => (g.to_string(), k.to_string()),
            None => (String::new(), kind_group.to_string()),
        };
        e.details = Some(json!({"name": name, "group": group, "kind": kind, "causes": causes}));
        e
    }
    /// A request that is well-formed but can't be carried out (a patch that does not apply).
    pub fn unprocessable(msg: impl Into<String>) -> Self {
        Self::new(422, "Invalid", msg)
    }
    pub fn internal(msg: impl Into<String>) -> Self {
        Self::new(500, "InternalError", msg)
    }

    /// The `metav1.Status` body.
    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}
