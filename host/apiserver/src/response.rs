//! Response bodies: JSON documents and `Status` errors.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};
use hyper::Response;

use crate::status::ApiError;

/// Response body: a whole buffer or a stream (watches).
pub type Body = UnsyncBoxBody<Bytes, Infallible>;

/// A JSON response.
pub fn json_response(code: u16, body: &serde_json::Value, warnings: &[String]) -> Response<Body> {
    json_text_response(code, Bytes::from(serde_json::to_vec(body).unwrap_or_default()), warnings)
}

/// A response of JSON already serialized (stored objects are served as their text).
pub fn json_text_response(code: u16, bytes: Bytes, warnings: &[String]) -> Response<Body> {
    let mut b = Response::builder().status(code).header("content-type", "application/json");
    for w in warnings {
        let w = w.replace(['"', '\n', '\r'], "'");
        b = b.header("warning", format!("299 - \"{w}\""));
    }
    b.body(Full::new(bytes).boxed_unsync()).unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed_unsync()))
}

/// A `Status` error response.
pub fn error_response(e: &ApiError) -> Response<Body> {
    json_response(e.code, &e.to_status(), &[])
}
