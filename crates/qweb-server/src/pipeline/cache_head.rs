//! The fields of the proxy cache's answers, shared by its phases ([`super::cache`]) and the
//! collapsed waiters ([`super::collapse`]): the client's conditionals, a stored head served
//! (`Age`, `Content-Length`), a `304` in place of a `200`, and qweb's `Cache-Status` member.

use std::time::SystemTime;

use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use qweb_cache::{policy, CacheStatus};
use qweb_http::body::Body;

/// The client's own validators, answered by qweb from the response it ends up with when it
/// replaced them by the stored response's for a revalidation.
#[derive(Default)]
pub(super) struct Conditionals {
    if_none_match: Vec<HeaderValue>,
    if_modified_since: Option<HeaderValue>,
}

impl Conditionals {
    pub(super) fn take(h: &mut HeaderMap) -> Conditionals {
        let if_none_match = match h.remove(header::IF_NONE_MATCH) {
            Some(first) => {
                let mut all = vec![first];
                all.extend(h.get_all(header::IF_NONE_MATCH).iter().cloned());
                h.remove(header::IF_NONE_MATCH);
                all
            }
            None => Vec::new(),
        };
        Conditionals {
            if_none_match,
            if_modified_since: h.remove(header::IF_MODIFIED_SINCE),
        }
    }

    pub(super) fn of(h: &HeaderMap) -> Conditionals {
        Conditionals {
            if_none_match: h.get_all(header::IF_NONE_MATCH).iter().cloned().collect(),
            if_modified_since: h.get(header::IF_MODIFIED_SINCE).cloned(),
        }
    }

    /// Whether a `200` with fields `resp` answers them with `304` (RFC 9110 section 13.1.2
    /// and 13.1.3: weak comparison of entity tags; the date only without `If-None-Match`).
    pub(super) fn not_modified(&self, resp: &HeaderMap) -> bool {
        if !self.if_none_match.is_empty() {
            let Some(etag) = resp.get(header::ETAG).and_then(|v| v.to_str().ok()) else {
                return false;
            };
            let weak = |t: &str| t.trim().trim_start_matches("W/").to_owned();
            let etag = weak(etag);
            return self
                .if_none_match
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .any(|t| t.trim() == "*" || weak(t) == etag);
        }
        let Some(since) = self
            .if_modified_since
            .as_ref()
            .and_then(|v| v.to_str().ok())
            .and_then(|v| httpdate::parse_http_date(v).ok())
        else {
            return false;
        };
        // without Last-Modified, the Date is the latest it could have changed (RFC 9110
        // section 13.2.2 leaves the comparison to the cache)
        resp.get(header::LAST_MODIFIED)
            .or_else(|| resp.get(header::DATE))
            .and_then(|v| v.to_str().ok())
            .and_then(|v| httpdate::parse_http_date(v).ok())
            .is_some_and(|lm| lm <= since)
    }
}

/// A `304` in place of a `200` (RFC 9110 section 15.4.5: the fields a 200 would have had,
/// without the body's own).
pub(super) fn to_not_modified(r: &mut Response<Body>) {
    *r.status_mut() = StatusCode::NOT_MODIFIED;
    for name in [
        header::CONTENT_LENGTH,
        header::CONTENT_TYPE,
        header::CONTENT_ENCODING,
        header::TRANSFER_ENCODING,
        header::CONTENT_RANGE,
    ] {
        r.headers_mut().remove(name);
    }
    *r.body_mut() = qweb_http::body::empty();
}

/// Statuses whose responses have no body.
pub(super) fn bodiless(status: StatusCode) -> bool {
    status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
}

/// The fields of a stored response `meta` served at `now`: its own with `Age`, and the body's
/// `length` (when known) for a status that has a body.
pub(super) fn head(meta: &policy::Meta, length: Option<u64>, now: SystemTime) -> HeaderMap {
    let mut headers = meta.headers.clone();
    let age = meta.current_age(now).as_secs();
    headers.insert(header::AGE, HeaderValue::from(age));
    if let (Some(len), false) = (length, bodiless(meta.status)) {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    }
    headers
}

/// The name of RFC 9211's field.
static CACHE_STATUS: HeaderName = HeaderName::from_static("cache-status");

/// Adds qweb's `Cache-Status` member (kept after what the origin's caches wrote).
pub(super) fn mark<B>(r: &mut Response<B>, status: CacheStatus) {
    r.headers_mut()
        .append(CACHE_STATUS.clone(), status.header());
    r.extensions_mut().insert(status);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_conditionals() {
        let mut resp = HeaderMap::new();
        resp.insert(header::ETAG, HeaderValue::from_static("\"a\""));
        let c = Conditionals {
            if_none_match: vec![HeaderValue::from_static("W/\"b\", W/\"a\"")],
            if_modified_since: None,
        };
        assert!(c.not_modified(&resp));
        let c = Conditionals {
            if_none_match: vec![HeaderValue::from_static("\"b\"")],
            if_modified_since: None,
        };
        assert!(!c.not_modified(&resp));
        resp.insert(
            header::LAST_MODIFIED,
            HeaderValue::from_static("Wed, 01 Jan 2020 00:00:00 GMT"),
        );
        let c = Conditionals {
            if_none_match: Vec::new(),
            if_modified_since: Some(HeaderValue::from_static("Thu, 02 Jan 2020 00:00:00 GMT")),
        };
        assert!(c.not_modified(&resp));
    }
}
