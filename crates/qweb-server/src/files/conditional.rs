//! Conditional requests (RFC 9110 section 13): If-Match, If-Unmodified-Since, If-None-Match,
//! If-Modified-Since and If-Range, evaluated in the order the RFC gives.

use std::time::{SystemTime, UNIX_EPOCH};

use http::header::{self, HeaderMap};

/// The outcome of the preconditions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Serve the representation; `range_allowed` is false when If-Range did not match.
    Proceed { range_allowed: bool },
    /// 304 Not Modified.
    NotModified,
    /// 412 Precondition Failed.
    Failed,
}

fn secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn opaque(tag: &str) -> (bool, &str) {
    match tag.strip_prefix("W/") {
        Some(t) => (true, t),
        None => (false, tag),
    }
}

/// Does a comma-separated entity-tag list (or `*`) match `etag`?
fn list_matches(list: &str, etag: &str, strong: bool) -> bool {
    let (our_weak, ours) = opaque(etag);
    list.split(',').map(str::trim).any(|t| {
        if t == "*" {
            return true;
        }
        let (weak, theirs) = opaque(t);
        theirs == ours && (!strong || (!weak && !our_weak))
    })
}

fn date(headers: &HeaderMap, name: header::HeaderName) -> Option<u64> {
    let v = headers.get(name)?.to_str().ok()?;
    httpdate::parse_http_date(v).ok().map(secs)
}

/// Evaluates the preconditions for a GET or HEAD of a representation with `etag` and `mtime`.
pub(crate) fn evaluate(headers: &HeaderMap, etag: &str, mtime: SystemTime) -> Outcome {
    let modified = secs(mtime);
    if let Some(im) = headers.get(header::IF_MATCH) {
        if !im.to_str().is_ok_and(|v| list_matches(v, etag, true)) {
            return Outcome::Failed;
        }
    } else if let Some(since) = date(headers, header::IF_UNMODIFIED_SINCE) {
        if modified > since {
            return Outcome::Failed;
        }
    }
    if let Some(inm) = headers.get(header::IF_NONE_MATCH) {
        if inm.to_str().is_ok_and(|v| list_matches(v, etag, false)) {
            return Outcome::NotModified;
        }
    } else if let Some(since) = date(headers, header::IF_MODIFIED_SINCE) {
        if modified <= since {
            return Outcome::NotModified;
        }
    }
    let range_allowed = match headers.get(header::IF_RANGE).map(|v| v.to_str()) {
        None => true,
        Some(Err(_)) => false,
        Some(Ok(v)) => {
            let v = v.trim();
            if v.starts_with('"') || v.starts_with("W/") {
                !v.starts_with("W/") && list_matches(v, etag, true) && !v.contains(',')
            } else {
                httpdate::parse_http_date(v).is_ok_and(|d| secs(d) == modified)
            }
        }
    };
    Outcome::Proceed { range_allowed }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn h(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.insert(
                header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        m
    }

    #[test]
    fn preconditions() {
        let t = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let date = httpdate::fmt_http_date(t);
        let older = httpdate::fmt_http_date(t - Duration::from_secs(10));
        let e = "\"abc\"";
        let go = Outcome::Proceed {
            range_allowed: true,
        };
        assert_eq!(evaluate(&h(&[]), e, t), go);
        assert_eq!(
            evaluate(&h(&[("if-none-match", "\"abc\"")]), e, t),
            Outcome::NotModified
        );
        assert_eq!(
            evaluate(&h(&[("if-none-match", "\"x\", W/\"abc\"")]), e, t),
            Outcome::NotModified
        );
        assert_eq!(
            evaluate(&h(&[("if-none-match", "*")]), e, t),
            Outcome::NotModified
        );
        assert_eq!(evaluate(&h(&[("if-none-match", "\"x\"")]), e, t), go);
        assert_eq!(
            evaluate(&h(&[("if-modified-since", &date)]), e, t),
            Outcome::NotModified
        );
        assert_eq!(evaluate(&h(&[("if-modified-since", &older)]), e, t), go);
        // If-None-Match wins over If-Modified-Since
        assert_eq!(
            evaluate(
                &h(&[("if-none-match", "\"x\""), ("if-modified-since", &date)]),
                e,
                t
            ),
            go
        );
        assert_eq!(
            evaluate(&h(&[("if-match", "\"x\"")]), e, t),
            Outcome::Failed
        );
        assert_eq!(
            evaluate(&h(&[("if-match", "W/\"abc\"")]), e, t),
            Outcome::Failed
        );
        assert_eq!(evaluate(&h(&[("if-match", "\"abc\"")]), e, t), go);
        assert_eq!(
            evaluate(&h(&[("if-unmodified-since", &older)]), e, t),
            Outcome::Failed
        );
        assert_eq!(evaluate(&h(&[("if-modified-since", "garbage")]), e, t), go);
        let no_range = Outcome::Proceed {
            range_allowed: false,
        };
        assert_eq!(evaluate(&h(&[("if-range", "\"abc\"")]), e, t), go);
        assert_eq!(evaluate(&h(&[("if-range", "\"old\"")]), e, t), no_range);
        assert_eq!(evaluate(&h(&[("if-range", &date)]), e, t), go);
        assert_eq!(evaluate(&h(&[("if-range", &older)]), e, t), no_range);
    }
}
