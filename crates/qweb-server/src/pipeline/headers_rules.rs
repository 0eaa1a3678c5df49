//! Header rules around a route's handler: the site's and the route's `headers` on responses,
//! `request_headers` on requests forwarded upstream, and `expires` (`Cache-Control: max-age`
//! by content type) on static files.

use http::{header, HeaderMap, HeaderValue, Response, StatusCode};

use crate::config::RouteRules;
use crate::pipeline::routes::Route;
use crate::pipeline::sites::Site;
use qweb_http::body::Body;

/// The site's response edits, then the route's.
pub(crate) fn respond(site: Option<&Site>, route: Option<&Route>, resp: &mut Response<Body>) {
    if let Some(s) = site {
        s.headers.apply(resp.headers_mut());
    }
    if let Some(r) = route {
        r.rules.headers.apply(resp.headers_mut());
    }
}

/// The site's edits of a request forwarded upstream, then the route's; `cert`: the
/// connection's verified client certificate, for the placeholders.
pub(crate) fn forward(
    site: Option<&Site>,
    route: &Route,
    cert: Option<&qweb_tls::ClientCert>,
    headers: &mut HeaderMap,
) {
    if let Some(s) = site {
        s.request_headers.apply_request(headers, cert);
    }
    route.rules.request_headers.apply_request(headers, cert);
}

/// `charset` (the route's, else the site's) added to a text response that names none.
pub(crate) fn charset(site: Option<&Site>, route: &Route, resp: &mut Response<Body>) {
    let Some(cs) = route
        .rules
        .charset
        .as_deref()
        .or_else(|| site.and_then(|s| s.charset.as_deref()))
    else {
        return;
    };
    let Some(ct) = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return;
    };
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let textual = essence.starts_with("text/")
        || matches!(
            essence.as_str(),
            "application/javascript" | "application/json" | "image/svg+xml" | "application/xml"
        );
    let has = ct
        .split(';')
        .skip(1)
        .any(|p| p.trim().to_ascii_lowercase().starts_with("charset="));
    if textual && !has {
        if let Ok(v) = HeaderValue::from_str(&format!("{ct}; charset={cs}")) {
            resp.headers_mut().insert(header::CONTENT_TYPE, v);
        }
    }
}

/// `Cache-Control: max-age` for a successful static response by its content type, unless it
/// has a `Cache-Control` already.
pub(crate) fn expires(rules: &RouteRules, resp: &mut Response<Body>) {
    if rules.expires.is_empty()
        || resp.headers().contains_key(header::CACHE_CONTROL)
        || !matches!(
            resp.status(),
            StatusCode::OK | StatusCode::PARTIAL_CONTENT | StatusCode::NOT_MODIFIED
        )
    {
        return;
    }
    let ct = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default();
    let hit = rules.expires.iter().find(|(t, _)| {
        t == "*"
            || *t == ct
            || t.strip_suffix('*')
                .is_some_and(|major| major.ends_with('/') && ct.starts_with(major))
    });
    if let Some((_, d)) = hit {
        if let Ok(v) = HeaderValue::from_str(&format!("max-age={}", d.as_secs())) {
            resp.headers_mut().insert(header::CACHE_CONTROL, v);
        }
    }
}
