//! Small canned responses (errors, redirects).

use http::{header, HeaderValue, Response, StatusCode};

use crate::body::{full, Body};

/// Marks a response qweb made itself (not an upstream's): `error_pages` replace only these.
#[derive(Debug, Clone, Copy)]
pub struct Generated;

/// Marks a response after which its connection takes no more requests: a refusal that leaves
/// an HTTP/1 connection unusable (a head too large to have been read whole, a request the
/// rules refuse with `close`). The HTTP/1 driver answers it with `Connection: close` and
/// closes; HTTP/2 and HTTP/3, whose streams end apart, ignore it. The pipeline never writes
/// `Connection` itself.
#[derive(Debug, Clone, Copy)]
pub struct EndsConnection;

/// The `Server` value of every response that does not bring its own (an upstream's is
/// kept). The connection layers write it as they write `Date`, while encoding the head
/// (HTTP/1, qweb's HTTP/2), or add it to the head they hand on ([`server_field`]: HTTP/3,
/// hyper's HTTP/2), as nginx's header filter does: no response's `HeaderMap` grows by it.
pub const SERVER: &str = "qweb";

/// Adds `Server: qweb` to `headers` unless they have a `Server` (for the connection layers
/// that hand a `HeaderMap` on rather than encode it).
pub fn server_field(headers: &mut http::HeaderMap) {
    headers
        .entry(header::SERVER)
        .or_insert(HeaderValue::from_static(SERVER));
}

/// The body of every canned answer, for the pipeline's responses and the HTTP/1 driver's
/// refusals alike: the status and its reason on one line, `404 Not Found\n`.
pub fn status_text(code: StatusCode, dst: &mut Vec<u8>) {
    dst.extend_from_slice(code.as_str().as_bytes());
    dst.push(b' ');
    dst.extend_from_slice(code.canonical_reason().unwrap_or("").as_bytes());
    dst.push(b'\n');
}

/// A response with a short plain-text body naming the status, e.g. `404 Not Found`.
pub fn status(code: StatusCode) -> Response<Body> {
    let mut text = Vec::with_capacity(32);
    status_text(code, &mut text);
    let mut r = Response::new(full(text));
    *r.status_mut() = code;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r.extensions_mut().insert(Generated);
    r
}

/// 405 with `Allow`.
pub fn method_not_allowed(allow: &'static str) -> Response<Body> {
    let mut r = status(StatusCode::METHOD_NOT_ALLOWED);
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    r
}
