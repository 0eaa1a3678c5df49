//! Redirects (a route's or a whole listener's `redirect = { to = "https://{host}{uri}",
//! status = 308 }`), path rewrites before routing (`rewrite`), and `try_files`.

use http::{header, HeaderValue, Request, Response, StatusCode};

use crate::config::{RedirectConfig, RewriteRule};
use crate::files::StaticFiles;
use qweb_http::body::Body;
use qweb_http::path::PathError;
use qweb_http::response;
use qweb_session::ReadAhead;

/// The redirect for `req`: `Location` is `cfg.to` with `{host}` (the request's host without
/// port, else the SNI name), `{uri}` (`path` and the query), `{path}` and `{query}` filled in.
/// `path` is the normalised request path (`None`: it did not normalise), never the target as
/// sent: `//evil.com/../x` is `/x`. A `Location` that would start with `//` or `/\` (a
/// scheme-relative reference: another host) has its leading slashes collapsed to one. 400
/// when `{host}` is needed and the request names none, or `{uri}`/`{path}` and there is no
/// normalised path.
pub(crate) fn redirect<B>(
    cfg: &RedirectConfig,
    req: &Request<B>,
    path: Option<&str>,
    sni: Option<&str>,
) -> Response<Body> {
    let host = crate::pipeline::sites::host_of(req)
        .and_then(crate::pipeline::sites::host_name)
        .or_else(|| sni.map(str::to_owned));
    let query = req
        .uri()
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    let mut out = String::with_capacity(cfg.to.len() + path.map_or(0, str::len) + 32);
    let mut rest = cfg.to.as_str();
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let Some(close) = rest[open..].find('}') else {
            break;
        };
        match (&rest[open + 1..open + close], path) {
            ("host", _) => match &host {
                Some(h) => out.push_str(h),
                None => return response::status(StatusCode::BAD_REQUEST),
            },
            ("uri", Some(p)) => {
                out.push_str(p);
                out.push_str(&query);
            }
            ("path", Some(p)) => out.push_str(p),
            ("uri" | "path", None) => return response::status(StatusCode::BAD_REQUEST),
            ("query", _) => out.push_str(&query),
            // refused by the configuration
            _ => {}
        }
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    let Ok(location) = HeaderValue::from_str(&not_scheme_relative(&out)) else {
        return response::status(StatusCode::BAD_REQUEST);
    };
    let mut r = response::status(cfg.status);
    r.headers_mut().insert(header::LOCATION, location);
    r
}

/// `location` with a leading run of two or more `/` and `\` (browsers read `//` and `/\`
/// as "another host follows") collapsed to one `/`; else unchanged.
fn not_scheme_relative(location: &str) -> std::borrow::Cow<'_, str> {
    let rest = location.trim_start_matches(['/', '\\']);
    if location.len() - rest.len() >= 2 {
        format!("/{rest}").into()
    } else {
        location.into()
    }
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
    qweb_http::path::normalize(&out)
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
    ahead: &ReadAhead,
    identify: bool,
) -> Response<Body> {
    for (k, c) in list.iter().enumerate() {
        let last = k + 1 == list.len();
        let candidate = match qweb_http::path::normalize(&c.replace("{path}", sub)) {
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
            ahead,
            identify,
        );
        if last || r.status() != StatusCode::NOT_FOUND {
            return r;
        }
    }
    response::status(StatusCode::NOT_FOUND)
}

#[cfg(test)]
mod tests {
    use super::not_scheme_relative;

    #[test]
    fn locations_are_never_scheme_relative() {
        for (to, want) in [
            ("//evil.com/x", "/evil.com/x"),
            ("/\\evil.com/x", "/evil.com/x"),
            ("\\\\evil.com", "/evil.com"),
            ("///x?q=//y", "/x?q=//y"),
            ("/x//y", "/x//y"),
            ("/", "/"),
            ("https://h/x", "https://h/x"),
        ] {
            assert_eq!(not_scheme_relative(to), want, "{to}");
        }
    }
}
