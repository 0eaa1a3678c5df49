//! `error_pages`: an error response qweb made (not an upstream's) has its body replaced by a page from one of the site's static
//! routes, keeping the original status (and the original's headers that are not about the
//! body, such as `Allow` or `Retry-After`).

use http::{header, HeaderMap, Method, Response};

use crate::config::ErrorPages;
use crate::pipeline::routes::{Handler, Route};
use qweb_http::body::Body;
use qweb_session::ReadAhead;

/// Headers of the page that describe the file rather than the error.
const PAGE_ONLY: [header::HeaderName; 4] = [
    header::ETAG,
    header::LAST_MODIFIED,
    header::ACCEPT_RANGES,
    header::CACHE_CONTROL,
];

/// `resp` with its body replaced by the configured page, when there is one for its status
/// and a static route of `routes` serves it (200); else `resp` unchanged.
pub(crate) fn apply(
    pages: &ErrorPages,
    routes: &[Route],
    method: &Method,
    resp: Response<Body>,
    ahead: &ReadAhead,
) -> Response<Body> {
    let status = resp.status();
    if pages.pages.is_empty()
        || !(status.is_client_error() || status.is_server_error())
        || resp
            .extensions()
            .get::<qweb_http::response::Generated>()
            .is_none()
    {
        // an upstream's own error pages pass untouched
        return resp;
    }
    let Some(page) = pages.page(status.as_u16()) else {
        return resp;
    };
    let Some((route, (mount, sub))) = routes.iter().find_map(|r| {
        qweb_http::path::split_prefix(&r.prefix, r.strip_prefix, page).map(|split| (r, split))
    }) else {
        return resp;
    };
    let Handler::Static(files) = &route.handler else {
        return resp;
    };
    let m = if method == Method::HEAD {
        Method::HEAD
    } else {
        Method::GET
    };
    let served = files.serve(&m, &HeaderMap::new(), mount, sub, None, ahead, false);
    if served.status() != http::StatusCode::OK {
        tracing::debug!(
            page,
            status = served.status().as_u16(),
            "error page not served"
        );
        return resp;
    }
    let (mut parts, body) = served.into_parts();
    parts.status = status;
    for h in &PAGE_ONLY {
        parts.headers.remove(h);
    }
    let (orig, _) = resp.into_parts();
    // (the refusal's typed markers go with its page: see `EndsConnection`)
    if orig
        .extensions
        .get::<qweb_http::response::EndsConnection>()
        .is_some()
    {
        parts.extensions.insert(qweb_http::response::EndsConnection);
    }
    for name in orig.headers.keys() {
        if !parts.headers.contains_key(name)
            && *name != header::CONTENT_LENGTH
            && *name != header::CONTENT_ENCODING
            && *name != header::TRANSFER_ENCODING
            && *name != header::CONTENT_RANGE
        {
            for v in orig.headers.get_all(name) {
                parts.headers.append(name.clone(), v.clone());
            }
        }
    }
    Response::from_parts(parts, body)
}
