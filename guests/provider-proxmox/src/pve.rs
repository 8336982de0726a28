//! A Proxmox VE API client over the host `http` capability, authenticated with
//! an API token or a ticket held in the host's session store.

use banlieue_sdk::http::Client;
use banlieue_sdk::provider::ProviderConfig;
use banlieue_sdk::session::{SessionError, with_session};
use banlieue_sdk::{Error, Result, debug, secrets};
use serde_json::Value;

use crate::api;

/// How long a stored ticket is used (PVE's tickets live two hours).
const TICKET_TTL_SECONDS: u32 = 3600;
/// How often a task is polled.
const TASK_POLL_MS: u64 = 250;

enum Auth {
    /// `Authorization: PVEAPIToken=USER@REALM!TOKENID=SECRET`.
    Token(String),
    /// A ticket and CSRF token from `POST /access/ticket`, kept in the session store.
    Ticket { username: String, password: String },
}

pub struct Pve {
    http: Client,
    auth: Auth,
}

/// A stored session: the ticket and the CSRF token, a line each.
fn ticket_and_csrf(session: &str) -> std::result::Result<(&str, &str), SessionError> {
    session.split_once('\n').ok_or_else(|| SessionError::Rejected("the stored session is not a ticket and CSRF token".into()))
}

impl Pve {
    /// A client for the Provider's endpoint with the credentials its Secret holds:
    /// `token-id` + `token-secret` (an API token), else `username` + `password` (a ticket).
    pub fn connect(config: &ProviderConfig) -> Result<Pve> {
        let http = Client::new(api::api_base(&config.endpoint));
        // Only keys the Provider grants are read (an empty list grants every key).
        let key = |k: &str| -> Result<Option<String>> {
            if !config.credential_keys.is_empty() && !config.credential_keys.iter().any(|g| g == k) {
                return Ok(None);
            }
            secrets::get_optional(k)
        };
        let token_id = key("token-id")?;
        let token_secret = key("token-secret")?;
        let username = key("username")?;
        let auth = match (token_id, token_secret) {
            (Some(id), Some(secret)) => {
                // A bare token name is qualified with the username (`user@realm!name`).
                let id = match (&username, id.contains('!')) {
                    (Some(user), false) => format!("{user}!{id}"),
                    _ => id,
                };
                if !id.contains('!') || !id.contains('@') {
                    return Err(Error::InvalidSpec(format!(
                        "token-id {id:?} must be USER@REALM!TOKENID (or give the user in `username`)"
                    )));
                }
                Auth::Token(format!("PVEAPIToken={id}={secret}"))
            }
            _ => {
                let password = key("password")?;
                match (username, password) {
                    (Some(username), Some(password)) => Auth::Ticket { username, password },
                    _ => {
                        // Say when a needed key is there but not granted.
                        let grants = if config.credential_keys.is_empty() {
                            String::new()
                        } else {
                            format!(" (credentialsRef.keys grants only {:?})", config.credential_keys)
                        };
                        return Err(Error::InvalidSpec(format!(
                            "the Provider's credentials need `token-id` and `token-secret`, or `username` and `password`{grants}"
                        )));
                    }
                }
            }
        };
        Ok(Pve { http, auth })
    }

    fn login(&self, username: &str, password: &str) -> Result<(String, u32)> {
        let body = api::form(&[("username".into(), username.into()), ("password".into(), password.into())]);
        let resp = self.http.send(
            "POST",
            "/access/ticket",
            &[("content-type", "application/x-www-form-urlencoded"), ("accept", "application/json")],
            Some(body),
        )?;
        if resp.status == 401 || resp.status == 403 {
            return Err(Error::Denied(format!("Proxmox VE refused the login of {username:?} (HTTP {})", resp.status)));
        }
        let data = api::parse_response("POST", "/access/ticket", resp.status, &resp.body)?;
        if api::flag(&data, "NeedTFA") {
            return Err(Error::Denied(format!("{username:?} needs two-factor authentication; use an API token")));
        }
        let ticket = api::text(&data, "ticket");
        let csrf = api::text(&data, "CSRFPreventionToken");
        if ticket.is_empty() || csrf.is_empty() || ticket.contains('\n') || csrf.contains('\n') {
            return Err(Error::Internal("POST /access/ticket: no ticket or CSRF token in the answer".into()));
        }
        debug!("logged in to Proxmox VE as {username}");
        Ok((format!("{ticket}\n{csrf}"), TICKET_TTL_SECONDS))
    }

    /// One API request: `params` go in the query string of a GET/DELETE and in the
    /// form body of a POST/PUT. Returns PVE's `data`.
    pub fn request(&self, method: &str, path: &str, params: &[(String, String)]) -> Result<Value> {
        let (url, body) = if matches!(method, "GET" | "DELETE") || params.is_empty() {
            let query = String::from_utf8(api::form(params)).unwrap_or_default();
            (if query.is_empty() { path.to_string() } else { format!("{path}?{query}") }, None)
        } else {
            (path.to_string(), Some(api::form(params)))
        };
        let mut headers: Vec<(String, String)> = vec![("accept".into(), "application/json".into())];
        if body.is_some() {
            headers.push(("content-type".into(), "application/x-www-form-urlencoded".into()));
        }
        match &self.auth {
            Auth::Token(value) => {
                headers.push(("authorization".into(), value.clone()));
                let resp = self.send(method, &url, &headers, body)?;
                api::parse_response(method, path, resp.status, &resp.body)
            }
            Auth::Ticket { username, password } => with_session(
                || self.login(username, password),
                |session| {
                    let (ticket, csrf) = ticket_and_csrf(session)?;
                    let mut h = headers.clone();
                    h.push(("cookie".into(), format!("PVEAuthCookie={ticket}")));
                    if method != "GET" {
                        h.push(("CSRFPreventionToken".into(), csrf.to_string()));
                    }
                    let resp = self.send(method, &url, &h, body.clone())?;
                    if resp.status == 401 {
                        return Err(SessionError::Rejected(format!("{method} {path}: HTTP 401")));
                    }
                    api::parse_response(method, path, resp.status, &resp.body).map_err(SessionError::Failed)
                },
            ),
        }
    }

    fn send(&self, method: &str, url: &str, headers: &[(String, String)], body: Option<Vec<u8>>) -> Result<banlieue_sdk::http::Response> {
        let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        self.http.send(method, url, &h, body)
    }

    /// The headers that authenticate a request made outside [`request`](Self::request) (a
    /// console's websocket), as the requests before it were: the API token, or the session's
    /// ticket cookie.
    pub fn auth_headers(&self) -> Result<Vec<(String, String)>> {
        match &self.auth {
            Auth::Token(value) => Ok(vec![("authorization".into(), value.clone())]),
            Auth::Ticket { username, password } => with_session(
                || self.login(username, password),
                |session| {
                    let (ticket, _) = ticket_and_csrf(session)?;
                    Ok(vec![("cookie".into(), format!("PVEAuthCookie={ticket}"))])
                },
            ),
        }
    }

    pub fn get(&self, path: &str) -> Result<Value> {
        self.request("GET", path, &[])
    }

    /// A request that starts a task: returns its UPID.
    pub fn task(&self, method: &str, path: &str, params: &[(String, String)]) -> Result<String> {
        match self.request(method, path, params)? {
            Value::String(upid) if upid.starts_with("UPID:") => Ok(upid),
            other => Err(Error::Internal(format!("{method} {path}: expected a task id (UPID), got {other}"))),
        }
    }

    /// Wait for a task to end; a failed task is an error carrying PVE's exit status.
    pub fn wait_task(&self, upid: &str, timeout_ms: u64, what: &str) -> Result<()> {
        self.task_outcome(upid, timeout_ms, what)?
    }

    /// How a task ended: `Ok(Err(…))` when PVE says it failed, with its exit status; `Err(…)`
    /// when that could not be learnt (a status poll failed, or the task still runs at the
    /// timeout) — the task may still succeed, so whatever it makes must not be undone.
    pub fn task_outcome(&self, upid: &str, timeout_ms: u64, what: &str) -> Result<Result<()>> {
        let node = api::upid_node(upid)?;
        let path = format!("/nodes/{}/tasks/{}/status", api::encode(node), api::encode(upid));
        let mut state = api::TaskState::Running;
        banlieue_sdk::time::wait_until(timeout_ms, TASK_POLL_MS, || {
            state = api::task_state(&self.get(&path).map_err(|e| e.context(format_args!("{what}: polling its task")))?);
            Ok(state != api::TaskState::Running)
        })?;
        match state {
            api::TaskState::Ok => Ok(Ok(())),
            api::TaskState::Failed(exit) => Ok(Err(api::task_error(what, &exit))),
            api::TaskState::Running => {
                Err(Error::Unavailable(format!("{what}: task {upid} still running after {} s", timeout_ms / 1000)))
            }
        }
    }
}
