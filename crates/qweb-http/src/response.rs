//! Small canned responses (errors, redirects).

use http::{header, HeaderValue, Response, StatusCode};

use crate::body::{full, Body};

/// Marks a response qweb made itself (not an upstream's): `error_pages` replace only these.
#[derive(Debug, Clone, Copy)]
pub struct Generated;

/// A response with a short plain-text body naming the status, e.g. `404 Not Found`.
pub fn status(code: StatusCode) -> Response<Body> {
    let text = format!(
        "{} {}\n",
        code.as_u16(),
        code.canonical_reason().unwrap_or("")
    );
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
