//! A small HTTP client over the host `http` capability.
//!
//! The host only lets requests through to the Provider's own endpoint, so a
//! [`Client`] is built from that endpoint and takes paths.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::bindings::host::banlieue::host::http as host;
use crate::{Error, Result};

pub use host::{Request, Response};

/// Requests against one base URL with default headers.
#[derive(Clone, Debug)]
pub struct Client {
    base: String,
    headers: Vec<(String, String)>,
    timeout_ms: Option<u32>,
}

impl Client {
    /// `base` is the endpoint, e.g. `https://vcenter.example:443`; a trailing `/` is ignored.
    pub fn new(base: impl Into<String>) -> Self {
        let mut base = base.into();
        while base.ends_with('/') {
            base.pop();
        }
        Self { base, headers: Vec::new(), timeout_ms: None }
    }

    /// Add a header sent with every request.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// `Authorization: Bearer <token>`.
    pub fn bearer(self, token: &str) -> Self {
        self.header("authorization", format!("Bearer {token}"))
    }

    /// `Authorization: Basic <base64(user:password)>`.
    pub fn basic_auth(self, user: &str, password: &str) -> Self {
        let token = base64(format!("{user}:{password}").as_bytes());
        self.header("authorization", format!("Basic {token}"))
    }

    /// Per-request timeout (the host caps it).
    pub fn timeout_ms(mut self, ms: u32) -> Self {
        self.timeout_ms = Some(ms);
        self
    }

    /// The absolute URL of `path` (an absolute URL is passed through).
    pub fn url(&self, path: &str) -> String {
        if path.starts_with("http://") || path.starts_with("https://") {
            path.to_string()
        } else if path.starts_with('/') {
            format!("{}{path}", self.base)
        } else {
            format!("{}/{path}", self.base)
        }
    }

    /// Send a request; any status comes back as a [`Response`].
    pub fn send(&self, method: &str, path: &str, headers: &[(&str, &str)], body: Option<Vec<u8>>) -> Result<Response> {
        let mut all = self.headers.clone();
        all.extend(headers.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let req = Request {
            method: method.to_string(),
            url: self.url(path),
            headers: all,
            body,
            timeout_ms: self.timeout_ms,
        };
        host::send(&req).map_err(|e| e.context(format_args!("{method} {path}")))
    }

    pub fn get(&self, path: &str) -> Result<Response> {
        self.send("GET", path, &[], None)
    }

    pub fn delete(&self, path: &str) -> Result<Response> {
        self.send("DELETE", path, &[], None)
    }

    /// GET and decode a JSON body; a non-2xx status is an error.
    pub fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        let resp = self.send("GET", path, &[("accept", "application/json")], None)?;
        check("GET", path, resp)?.json()
    }

    /// Send `body` as JSON with `method`; a non-2xx status is an error.
    pub fn send_json<B: Serialize + ?Sized>(&self, method: &str, path: &str, body: &B) -> Result<Response> {
        let bytes = serde_json::to_vec(body)?;
        let resp = self.send(
            method,
            path,
            &[("content-type", "application/json"), ("accept", "application/json")],
            Some(bytes),
        )?;
        check(method, path, resp)
    }

    /// POST JSON and decode the JSON answer.
    pub fn post_json<B: Serialize + ?Sized, T: DeserializeOwned>(&self, path: &str, body: &B) -> Result<T> {
        self.send_json("POST", path, body)?.json()
    }

    /// PUT JSON and decode the JSON answer.
    pub fn put_json<B: Serialize + ?Sized, T: DeserializeOwned>(&self, path: &str, body: &B) -> Result<T> {
        self.send_json("PUT", path, body)?.json()
    }
}

impl Response {
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// A response header, case-insensitively.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// Decode the body as JSON.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T> {
        Ok(serde_json::from_slice(&self.body)?)
    }

    /// The body as UTF-8 text.
    pub fn text(&self) -> Result<String> {
        Ok(String::from_utf8(self.body.clone())?)
    }
}

/// Turn a non-2xx status into the error kind a host acts on.
pub fn check(method: &str, path: &str, resp: Response) -> Result<Response> {
    if resp.is_success() {
        return Ok(resp);
    }
    let mut body = String::from_utf8_lossy(&resp.body).into_owned();
    body.truncate(512);
    let msg = format!("{method} {path}: HTTP {}: {body}", resp.status);
    Err(status_error(resp.status, msg))
}

/// The error kind for an HTTP status.
pub fn status_error(status: u16, msg: String) -> Error {
    match status {
        404 | 410 => Error::NotFound(msg),
        401 | 403 => Error::Denied(msg),
        408 | 425 | 429 | 500..=599 => Error::Unavailable(msg),
        400..=499 => Error::InvalidSpec(msg),
        _ => Error::Internal(msg),
    }
}

/// Standard base64 with padding (for basic auth; no dependency needed).
pub fn base64(input: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (i, o) in [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foob", "Zm9vYg=="), ("fooba", "Zm9vYmE="), ("foobar", "Zm9vYmFy")] {
            assert_eq!(base64(i.as_bytes()), o);
        }
    }

    #[test]
    fn urls_join_paths() {
        let c = Client::new("https://pve:8006/");
        assert_eq!(c.url("/api2/json/nodes"), "https://pve:8006/api2/json/nodes");
        assert_eq!(c.url("api2/json"), "https://pve:8006/api2/json");
        assert_eq!(c.url("https://other/x"), "https://other/x");
    }

    #[test]
    fn statuses_map_to_error_kinds() {
        assert!(status_error(404, String::new()).is_not_found());
        assert!(status_error(503, String::new()).is_retryable());
        assert!(status_error(429, String::new()).is_retryable());
        assert!(matches!(status_error(403, String::new()), Error::Denied(_)));
        assert!(matches!(status_error(422, String::new()), Error::InvalidSpec(_)));
    }
}
