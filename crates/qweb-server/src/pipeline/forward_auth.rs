//! Phase 8, `forward_auth`: the route's authentication service is asked before the handler
//! runs (Caddy's `forward_auth`, nginx's `auth_request`).
//!
//! The subrequest goes through the proxy (its pool, its header rewriting: `X-Forwarded-For`,
//! `-Host`, `-Proto` are qweb's, never the client's) with the original method and fields, no
//! body, to the configured path; `X-Forwarded-Method` and `X-Forwarded-Uri` carry the original
//! method and URI. A 2xx answer lets the request on, with the answer's `copy_headers` fields
//! set on it (a client's own copies of those fields are always removed: it cannot pose as the
//! service); its body is not read. Any other answer is the client's, its body bounded by
//! `max_response_size`. A service that does not answer within `timeout`, or cannot be reached,
//! is a 502: never a pass.

use std::rc::Rc;

use http::{header, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;

use crate::config::ForwardAuth;
use qweb_http::body::Body;
use qweb_http::request_body::RequestBody;
use qweb_http::response;
use qweb_proxy::{ClientInfo, Proxy, Target};

static FORWARDED_METHOD: HeaderName = HeaderName::from_static("x-forwarded-method");
static FORWARDED_URI: HeaderName = HeaderName::from_static("x-forwarded-uri");

/// Asks the service about `req` (`uri`: its path and query as routed). `None`: it may go on
/// (the copied fields are set on it); `Some`: the answer to send instead.
pub(crate) async fn check(
    auth: &ForwardAuth,
    proxy: &Rc<Proxy>,
    req: &mut Request<()>,
    uri: &str,
    authority: Option<&HeaderValue>,
    client: &ClientInfo,
) -> Option<Response<Body>> {
    for name in &auth.copy_headers {
        req.headers_mut().remove(name);
    }
    let mut sub = Request::new(RequestBody::Empty);
    // an extended CONNECT (a WebSocket over HTTP/2) is asked about as the GET it stands for
    *sub.method_mut() = match req.method() {
        &Method::CONNECT => Method::GET,
        m => m.clone(),
    };
    let mut headers = req.headers().clone();
    // no body, no upgrade: the subrequest is a plain request of its own
    for h in [
        header::CONTENT_LENGTH,
        header::TRANSFER_ENCODING,
        header::EXPECT,
        header::UPGRADE,
        header::CONNECTION,
    ] {
        headers.remove(h);
    }
    headers.insert(
        FORWARDED_METHOD.clone(),
        HeaderValue::from_str(req.method().as_str()).unwrap_or(HeaderValue::from_static("GET")),
    );
    if let Ok(v) = HeaderValue::from_str(uri) {
        headers.insert(FORWARDED_URI.clone(), v);
    }
    *sub.headers_mut() = headers;
    let target = Target {
        path_and_query: &auth.path,
        authority,
    };
    let answer = match tokio::time::timeout(auth.timeout, proxy.forward(sub, &target, client)).await
    {
        Ok(r) => r,
        Err(_) => {
            tracing::warn!(timeout = ?auth.timeout, "forward_auth: the authentication service did not answer in time");
            return Some(response::status(StatusCode::BAD_GATEWAY));
        }
    };
    if answer.status().is_success() {
        for name in &auth.copy_headers {
            for v in answer.headers().get_all(name) {
                req.headers_mut().append(name.clone(), v.clone());
            }
        }
        // its body is not read: dropping it closes (or pools) the connection
        return None;
    }
    let declared = answer
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > auth.max_response_size) {
        tracing::warn!(
            length = declared,
            "forward_auth: the authentication service's answer is over max_response_size"
        );
        return Some(response::status(StatusCode::BAD_GATEWAY));
    }
    let limit = usize::try_from(auth.max_response_size).unwrap_or(usize::MAX);
    Some(answer.map(|b| {
        qweb_http::body::boxed(http_body_util::Limited::new(b, limit).map_err(
            |e| -> qweb_http::body::BoxError {
                tracing::warn!("forward_auth: the authentication service's answer is cut: {e}");
                e
            },
        ))
    }))
}
