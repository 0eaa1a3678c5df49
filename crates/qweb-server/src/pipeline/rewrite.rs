//! Redirects (a route's or a whole listener's `redirect = { to = "https://{host}{uri}",
//! status = 308 }`), path rewrites before routing (`rewrite`), and `try_files`.

use http::{header, HeaderValue, Request, Response, StatusCode};

use crate::config::{RedirectConfig, RewriteRule};
use crate::files::StaticFiles;
use crate::http::body::Body;
use crate::http::path::PathError;
use crate::http::response;

/// The redirect for `req`: `Location` is `cfg.to` with `{host}` (the request's host without
/// port, else the SNI name), `{uri}`, `{path}` and `{query}` filled in. 400 when `{host}` is
/// needed and the request names none.
pub(crate) fn redirect<B>(
    cfg: &RedirectConfig,
    req: &Request<B>,
    sni: Option<&str>,
) -> Response<Body> {
    let host = crate::pipeline::sites::host_of(req)
        .and_then(crate::pipeline::sites::host_name)
        .or_else(|| sni.map(str::to_owned));
    let uri = req.uri();
    let path_and_query = uri.path_and_query().map_or("/", |p| p.as_str());
    let query = uri.query().map(|q| format!("?{q}")).unwrap_or_default();
    let mut out = String::with_capacity(cfg.to.len() + path_and_query.len() + 32);
    let mut rest = cfg.to.as_str();
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let Some(close) = rest[open..].find('}') else {
            break;
        };
        match &rest[open + 1..open + close] {
            "host" => match &host {
                Some(h) => out.push_str(h),
                None => return response::status(StatusCode::BAD_REQUEST),
            },
            "uri" => out.push_str(path_and_query),
            "path" => out.push_str(uri.path()),
            "query" => out.push_str(&query),
            // refused by the configuration
            _ => {}
        }
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    let Ok(location) = HeaderValue::from_str(&out) else {
        return response::status(StatusCode::BAD_REQUEST);
    };
    let mut r = response::status(cfg.status);
    r.headers_mut().insert(header::LOCATION, location);
    r
}

/// The first matching rule's rewrite of `path` (normalised), normalised again: a rewrite
/// that climbs above `/` or produces a forbidden escape is refused like a request path.
pub(crate) fn rewrite(rules: &[RewriteRule], path: String) -> Result<String, PathError> {
    let Some((rule, caps)) = rules
        .iter()
        .find_map(|r| r.from.captures(&path).map(|c| (r, c)))
    else {
        return Ok(path);
    };
    let mut out = String::new();
    caps.expand(&rule.to, &mut out);
    crate::http::path::normalize(&out)
}

/// `try_files`: each candidate (`{path}` is the request's path within the route) is served
/// in turn until one is not a 404; the last answers whatever it answers. Candidates are
/// normalised like request paths and stay beneath the route's root.
pub(crate) fn try_files(
    files: &StaticFiles,
    list: &[String],
    req: &Request<impl Sized>,
    mount: &str,
    sub: &str,
) -> Response<Body> {
    for (k, c) in list.iter().enumerate() {
        let last = k + 1 == list.len();
        let candidate = match crate::http::path::normalize(&c.replace("{path}", sub)) {
            Ok(p) => p,
            Err(e) if last => return response::status(e.status()),
            Err(_) => continue,
        };
        let r = files.serve(
            req.method(),
            req.headers(),
            mount,
            &candidate,
            req.uri().query(),
        );
        if last || r.status() != StatusCode::NOT_FOUND {
            return r;
        }
    }
    response::status(StatusCode::NOT_FOUND)
}
