//! Who asked for what: one entry per resource request, as kube-apiserver's audit log
//! records it (user, verb, group, resource, subresource, namespace, name). Tests read
//! it to check that banlieue's roles stay within their RBAC rules and that no Secret
//! banlieue was not pointed at is ever read.

use std::collections::VecDeque;
use std::sync::Mutex;

/// Entries kept (oldest dropped first), so a long `banlieue dev` session stays small.
const CAPACITY: usize = 100_000;

/// One request, in RBAC's terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditEntry {
    /// The user the request acted as: its `Impersonate-User`, else the token's user `admin`.
    pub user: String,
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete` or `deletecollection`.
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub subresource: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// The HTTP status code answered (a watch: 200 when it started).
    pub code: u16,
    /// Position in the log since the server started (set when recorded), so a reader can
    /// take what came after a point even once the oldest entries are dropped.
    pub seq: u64,
}

/// The log itself.
#[derive(Default)]
pub struct AuditLog {
    entries: Mutex<(VecDeque<AuditEntry>, u64)>,
}

impl AuditLog {
    pub fn record(&self, mut entry: AuditEntry) {
        let mut guard = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let (entries, next) = &mut *guard;
        entry.seq = *next;
        *next += 1;
        if entries.len() == CAPACITY {
            entries.pop_front();
        }
        entries.push_back(entry);
    }

    pub fn entries(&self) -> Vec<AuditEntry> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).0.iter().cloned().collect()
    }
}

/// The RBAC verb of a request on a resource path.
pub fn verb(method: &hyper::Method, has_name: bool, watch: bool) -> &'static str {
    use hyper::Method;
    match (method, has_name) {
        (&Method::GET, false) if watch => "watch",
        (&Method::GET, false) => "list",
        (&Method::GET, true) => "get",
        (&Method::POST, _) => "create",
        (&Method::PUT, _) => "update",
        (&Method::PATCH, _) => "patch",
        (&Method::DELETE, true) => "delete",
        (&Method::DELETE, false) => "deletecollection",
        _ => "unknown",
    }
}
