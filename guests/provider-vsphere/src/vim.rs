//! A vim25 client over the host `http` capability: one `Vim` per driver call,
//! holding the session cookie. Faults become errors here, once: a
//! `NotAuthenticated` fault means the stored session was rejected.

use banlieue_sdk::http::{Client, status_error};
use banlieue_sdk::session::SessionError;
use banlieue_sdk::{Error, Result};

use crate::soap::{self, Fault, MoRef, Node, ObjectContent, PropSpec, Reply};

/// A call's result: an error, or the backend rejecting the session.
pub type VResult<T> = std::result::Result<T, SessionError>;

/// The session cookie vCenter sets.
pub const COOKIE: &str = "vmware_soap_session";

/// How long a session is kept (vCenter's default idle timeout is 30 min).
pub const SESSION_TTL_S: u32 = 1800;

/// How long a task may take before the call gives up (`unavailable`; the next call carries on).
pub const TASK_TIMEOUT_MS: u64 = 120_000;
const TASK_POLL_MS: u64 = 200;

/// The parts of `ServiceContent` the driver uses.
#[derive(Clone, Debug)]
pub struct ServiceContent {
    pub root_folder: MoRef,
    pub property_collector: MoRef,
    pub search_index: MoRef,
    pub session_manager: MoRef,
    /// Deletes datastore files (what a failed `disk-import` uploaded); optional in the
    /// schema, so a vCenter without one only loses that clean-up.
    pub file_manager: Option<MoRef>,
    /// Deletes a disk's descriptor and extents together; optional like the file manager.
    pub virtual_disk_manager: Option<MoRef>,
    pub full_name: Option<String>,
}

/// The SOAP URL for an endpoint: `https://vc` means `https://vc/sdk`.
pub fn sdk_url(endpoint: &str) -> String {
    let e = endpoint.trim_end_matches('/');
    let after_scheme = e.split_once("://").map(|(_, r)| r).unwrap_or(e);
    if after_scheme.contains('/') { e.to_string() } else { format!("{e}/sdk") }
}

/// The error for a fault of a call `what` (which names the object).
pub fn fault_error(what: &str, f: &Fault) -> SessionError {
    let msg = if f.message.is_empty() {
        format!("{what}: vCenter fault {}", f.kind)
    } else {
        format!("{what}: vCenter fault {}: {}", f.kind, f.message)
    };
    match f.kind.as_str() {
        "NotAuthenticated" => SessionError::Rejected(msg),
        "InvalidLogin" | "NoPermission" | "NotAuthorized" | "SecurityError" => Error::Denied(msg).into(),
        "ManagedObjectNotFound" | "NotFound" => Error::NotFound(msg).into(),
        "TaskInProgress" | "ResourceInUse" | "HostCommunication" | "HostNotConnected" | "Timedout"
        | "RequestCanceled" | "SystemError" | "InsufficientResourcesFault" | "ConcurrentAccess" | "SnapshotLocked"
        | "FileLocked" => {
            Error::Unavailable(msg).into()
        }
        "InvalidArgument" | "InvalidRequest" | "InvalidName" | "InvalidType" | "NotSupported" | "InvalidState"
        | "InvalidPowerState" | "MethodNotFound" | "ToolsUnavailable" | "InvalidDeviceSpec" | "FileNotFound" | "DuplicateName"
        | "InvalidDatastore" | "InvalidCollectorVersion" | "InvalidProperty" | "SnapshotDisabled" | "TooManySnapshotLevels"
        | "SnapshotIncompatibleDeviceInVm" | "MemorySnapshotOnIndependentDisk" | "ApplicationQuiesceFault" => {
            Error::InvalidSpec(msg).into()
        }
        _ => Error::Internal(msg).into(),
    }
}

/// Whether an error is a given vCenter fault (by the message `fault_error` built).
pub fn is_fault(e: &SessionError, kind: &str) -> bool {
    match e {
        SessionError::Failed(e) => e.message().contains(&format!("vCenter fault {kind}")),
        SessionError::Rejected(_) => kind == "NotAuthenticated",
    }
}

/// POST one SOAP request (`cookie` if any) and return the reply, or the transport / HTTP error.
fn post(http: &Client, url: &str, cookie: Option<&str>, what: &str, body: &str) -> Result<(Reply, Vec<(String, String)>)> {
    let cookie_header = cookie.map(|c| format!("{COOKIE}={c}"));
    let mut headers = vec![("content-type", "text/xml; charset=utf-8"), ("soapaction", "urn:vim25/6.5")];
    if let Some(c) = &cookie_header {
        headers.push(("cookie", c.as_str()));
    }
    let resp = http
        .send("POST", url, &headers, Some(soap::envelope(body).into_bytes()))
        .map_err(|e| e.context(format_args!("vCenter {what}")))?;
    let text = String::from_utf8_lossy(&resp.body);
    let reply = answer(what, resp.status, &text)?;
    Ok((reply, resp.headers))
}

/// vCenter's answer to a SOAP call: a reply or fault, else the error for what came instead.
/// An HTTP error without a SOAP body (a proxy or load balancer in front of vCenter, or a
/// vCenter restarting) is named by its status and body, not as a malformed SOAP answer.
fn answer(what: &str, status: u16, text: &str) -> Result<Reply> {
    let ok = (200..300).contains(&status);
    match soap::parse_reply(text) {
        // vCenter answers faults with HTTP 500 and a SOAP body.
        Ok(reply @ Reply::Fault(_)) => Ok(reply),
        Ok(reply) if ok => Ok(reply),
        parsed => {
            let mut snippet = text.trim().to_string();
            let mut cut = snippet.len().min(300);
            while !snippet.is_char_boundary(cut) {
                cut -= 1;
            }
            snippet.truncate(cut);
            if !ok {
                return Err(status_error(status, format!("vCenter {what}: HTTP {status}: {snippet}")));
            }
            let why = match parsed {
                Err(e) => e,
                Ok(_) => "unexpected answer".into(),
            };
            Err(Error::Internal(format!("vCenter {what}: HTTP {status}: {why}: {snippet}")))
        }
    }
}

/// `RetrieveServiceContent` (needs no session).
pub fn service_content(http: &Client, url: &str) -> Result<ServiceContent> {
    let what = "RetrieveServiceContent";
    let (reply, _) = post(http, url, None, what, &soap::retrieve_service_content())?;
    let node = match reply {
        Reply::Ok(n) => n,
        Reply::Fault(f) => {
            return Err(match fault_error(what, &f) {
                SessionError::Failed(e) => e,
                SessionError::Rejected(m) => Error::Denied(m),
            });
        }
    };
    let rv = node.child("returnval").ok_or_else(|| Error::Internal(format!("vCenter {what}: no returnval")))?;
    let get = |name: &str| {
        rv.child(name).and_then(Node::as_ref).ok_or_else(|| Error::Internal(format!("vCenter {what}: no {name}")))
    };
    Ok(ServiceContent {
        root_folder: get("rootFolder")?,
        property_collector: get("propertyCollector")?,
        search_index: get("searchIndex")?,
        session_manager: get("sessionManager")?,
        file_manager: rv.child("fileManager").and_then(Node::as_ref),
        virtual_disk_manager: rv.child("virtualDiskManager").and_then(Node::as_ref),
        full_name: rv.str_at("about.fullName").map(str::to_string),
    })
}

/// `SessionManager.Login`; returns the session cookie value.
pub fn login(http: &Client, url: &str, sc: &ServiceContent, user: &str, password: &str) -> Result<String> {
    let what = format!("Login as {user:?}");
    let (reply, headers) = post(http, url, None, &what, &soap::login(&sc.session_manager, user, password))?;
    if let Reply::Fault(f) = reply {
        return Err(match fault_error(&what, &f) {
            SessionError::Failed(e) => e,
            SessionError::Rejected(m) => Error::Denied(m),
        });
    }
    headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("set-cookie"))
        .find_map(|(_, v)| {
            let first = v.split(';').next()?.trim();
            let (name, value) = first.split_once('=')?;
            (name.trim() == COOKIE).then(|| value.trim().to_string())
        })
        .ok_or_else(|| Error::Internal(format!("vCenter {what}: no {COOKIE} cookie in the answer")))
}

/// A logged-in vim25 client for one driver call.
pub struct Vim<'a> {
    pub http: &'a Client,
    pub url: &'a str,
    pub cookie: &'a str,
    pub sc: &'a ServiceContent,
}

impl Vim<'_> {
    /// Call a method; `what` names the operation and object for errors.
    pub fn call(&self, what: &str, body: &str) -> VResult<Node> {
        match post(self.http, self.url, Some(self.cookie), what, body)? {
            (Reply::Ok(n), _) => Ok(n),
            (Reply::Fault(f), _) => Err(fault_error(what, &f)),
        }
    }

    /// Run a `RetrievePropertiesEx` request and follow its paging tokens.
    fn retrieve(&self, what: &str, body: &str) -> VResult<Vec<ObjectContent>> {
        let pc = &self.sc.property_collector;
        let (mut objects, mut token) = soap::retrieve_result(&self.call(what, body)?);
        while let Some(t) = token {
            let (more, next) = soap::retrieve_result(&self.call(what, &soap::continue_retrieve(pc, &t))?);
            objects.extend(more);
            token = next;
        }
        // vcsim reports an unauthenticated read as missing properties, not a fault.
        if let Some((path, _)) = objects.iter().flat_map(|o| &o.missing).find(|(_, k)| k == "NotAuthenticated") {
            return Err(SessionError::Rejected(format!("{what}: property {path}: NotAuthenticated")));
        }
        Ok(objects)
    }

    /// Properties of every object of the given types in the inventory.
    pub fn inventory(&self, specs: &[PropSpec]) -> VResult<Vec<ObjectContent>> {
        let body = soap::retrieve_inventory(&self.sc.property_collector, &self.sc.root_folder, specs);
        self.retrieve("reading the inventory", &body)
    }

    /// [`Vim::inventory`] read `max_objects` objects per answer.
    pub fn inventory_paged(&self, specs: &[PropSpec], max_objects: u32) -> VResult<Vec<ObjectContent>> {
        let body = soap::retrieve_inventory_paged(&self.sc.property_collector, &self.sc.root_folder, specs, max_objects);
        self.retrieve("reading the inventory", &body)
    }

    /// Properties of some objects of one type.
    pub fn objects(&self, objs: &[MoRef], paths: &[&str]) -> VResult<Vec<ObjectContent>> {
        let what = format!("reading {} {}(s)", objs.len(), objs.first().map(|o| o.kind.as_str()).unwrap_or("object"));
        self.retrieve(&what, &soap::retrieve_objects(&self.sc.property_collector, objs, paths))
    }

    /// Properties of one object; `not-found` if it is gone.
    pub fn props(&self, obj: &MoRef, paths: &[&str]) -> VResult<ObjectContent> {
        let what = format!("reading {obj}");
        let body = soap::retrieve_objects(&self.sc.property_collector, std::slice::from_ref(obj), paths);
        self.retrieve(&what, &body)?
            .into_iter()
            .next()
            .ok_or_else(|| Error::NotFound(format!("{what}: the object does not exist")).into())
    }

    /// The VM whose instance UUID is `uuid`.
    pub fn find_vm(&self, uuid: &str) -> VResult<Option<MoRef>> {
        let n = self.call(&format!("FindByUuid {uuid}"), &soap::find_by_uuid(&self.sc.search_index, uuid, true))?;
        Ok(n.child("returnval").and_then(Node::as_ref))
    }

    pub fn find_by_path(&self, path: &str) -> VResult<Option<MoRef>> {
        let n = self.call(&format!("FindByInventoryPath {path}"), &soap::find_by_inventory_path(&self.sc.search_index, path))?;
        Ok(n.child("returnval").and_then(Node::as_ref))
    }

    /// Start a task method and wait for it; returns the task's result, if any.
    pub fn run_task(&self, what: &str, body: &str) -> VResult<Option<Node>> {
        self.run_task_within(what, body, TASK_TIMEOUT_MS)
    }

    /// [`Vim::run_task`] for a task that may take up to `timeout_ms`.
    pub fn run_task_within(&self, what: &str, body: &str, timeout_ms: u64) -> VResult<Option<Node>> {
        let task = self
            .call(what, body)?
            .child("returnval")
            .and_then(Node::as_ref)
            .ok_or_else(|| Error::Internal(format!("{what}: vCenter returned no task")))?;
        let mut outcome: Option<VResult<Option<Node>>> = None;
        let done = banlieue_sdk::time::wait_until(timeout_ms, TASK_POLL_MS, || {
            let info = match self.props(&task, &["info.state", "info.error", "info.result"]) {
                Ok(i) => i,
                Err(SessionError::Failed(e)) => return Err(e),
                Err(r) => {
                    outcome = Some(Err(r));
                    return Ok(true);
                }
            };
            match info.str("info.state") {
                Some("success") => {
                    outcome = Some(Ok(info.props.get("info.result").cloned()));
                    Ok(true)
                }
                Some("error") => {
                    let fault = info
                        .props
                        .get("info.error")
                        .map(soap::localized_fault)
                        .unwrap_or(Fault { kind: "Fault".into(), message: String::new() });
                    outcome = Some(Err(fault_error(&format!("{what} ({task})"), &fault)));
                    Ok(true)
                }
                _ => Ok(false),
            }
        })?;
        match outcome {
            Some(o) if done => o,
            _ => Err(Error::Unavailable(format!("{what}: {task} still running after {timeout_ms} ms")).into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_get_the_sdk_path() {
        assert_eq!(sdk_url("https://vc.example"), "https://vc.example/sdk");
        assert_eq!(sdk_url("https://vc.example:8443/"), "https://vc.example:8443/sdk");
        assert_eq!(sdk_url("http://127.0.0.1:9/sdk"), "http://127.0.0.1:9/sdk");
    }

    #[test]
    fn an_http_error_without_a_soap_body_names_the_status_not_a_malformed_answer() {
        let e = answer("CloneVM_Task t -> vm", 503, "Service Unavailable\n").unwrap_err();
        assert!(matches!(e, Error::Unavailable(_)), "{e:?}");
        assert_eq!(e.message(), "vCenter CloneVM_Task t -> vm: HTTP 503: Service Unavailable");
        let e = answer("x", 200, "<html/>").unwrap_err();
        assert!(matches!(e, Error::Internal(_)) && e.message().contains("malformed SOAP response"), "{e:?}");
        let fault = soap::envelope("<soapenv:Fault><faultcode>ServerFaultCode</faultcode><faultstring>busy</faultstring></soapenv:Fault>");
        assert!(matches!(answer("x", 500, &fault), Ok(Reply::Fault(_))));
    }

    #[test]
    fn faults_map_to_error_kinds() {
        let f = |k: &str| fault_error("x", &Fault { kind: k.into(), message: "m".into() });
        assert!(matches!(f("NotAuthenticated"), SessionError::Rejected(_)));
        assert!(matches!(f("InvalidLogin"), SessionError::Failed(Error::Denied(_))));
        assert!(matches!(f("ManagedObjectNotFound"), SessionError::Failed(Error::NotFound(_))));
        assert!(matches!(f("TaskInProgress"), SessionError::Failed(Error::Unavailable(_))));
        assert!(matches!(f("ToolsUnavailable"), SessionError::Failed(Error::InvalidSpec(_))));
        assert!(matches!(f("SnapshotLocked"), SessionError::Failed(Error::Unavailable(_))));
        assert!(matches!(f("TooManySnapshotLevels"), SessionError::Failed(Error::InvalidSpec(_))));
        assert!(matches!(f("SomethingNew"), SessionError::Failed(Error::Internal(_))));
        assert!(is_fault(&f("DuplicateName"), "DuplicateName"));
        assert!(!is_fault(&f("DuplicateName"), "InvalidPowerState"));
    }
}
