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

/// Splits an entity-tag list (RFC 9110 §8.8.3: `*`, `"x"`, `W/"x"`, separated by commas and
/// optional whitespace) into its tags; `None` when malformed. A comma inside quotes belongs
/// to its tag. The one entity-tag parser: conditional requests here, and the compressed
/// variants' tags in `compress.rs`.
pub(crate) fn entity_tags(list: &str) -> Option<Vec<&str>> {
    let mut out = Vec::new();
    let mut rest = list.trim_start_matches([' ', '\t', ',']);
    while !rest.is_empty() {
        let start = rest;
        let body = rest.strip_prefix("W/").unwrap_or(rest);
        let len = if let Some(b) = body.strip_prefix('*') {
            start.len() - b.len()
        } else {
            let b = body.strip_prefix('"')?;
            let close = b.find('"')?;
            start.len() - (b.len() - close - 1)
        };
        out.push(&start[..len]);
        rest = start[len..].trim_start_matches([' ', '\t']);
        if !rest.is_empty() {
            rest = rest.strip_prefix(',')?.trim_start_matches([' ', '\t', ',']);
        }
    }
    Some(out)
}

fn opaque(tag: &str) -> (bool, &str) {
    match tag.strip_prefix("W/") {
        Some(t) => (true, t),
        None => (false, tag),
    }
}

/// Does an entity-tag list (or `*`) match `etag`? Strong comparison when `strong` (both
/// tags strong and equal), else weak (equal opaque tags). A malformed list matches nothing.
fn list_matches(list: &str, etag: &str, strong: bool) -> bool {
    let (our_weak, ours) = opaque(etag);
    entity_tags(list).is_some_and(|tags| {
        tags.into_iter().any(|t| {
            if t == "*" {
                return true;
            }
            let (weak, theirs) = opaque(t);
            theirs == ours && (!strong || (!weak && !our_weak))
        })
    })
}

fn date(headers: &HeaderMap, name: header::HeaderName) -> Option<u64> {
    let v = headers.get(name)?.to_str().ok()?;
    httpdate::parse_http_date(v).ok().map(secs)
}

/// Evaluates the preconditions for a GET or HEAD of a representation with `etag` and `mtime`.
pub(crate) fn evaluate(headers: &HeaderMap, etag: &str, mtime: SystemTime) -> Outcome {
    // Most requests carry no condition: one pass over their field names instead of five
    // lookups, each hashing a name.
    if !headers.keys().any(|k| {
        k == header::IF_MATCH
            || k == header::IF_NONE_MATCH
            || k == header::IF_MODIFIED_SINCE
            || k == header::IF_UNMODIFIED_SINCE
            || k == header::IF_RANGE
    }) {
        return Outcome::Proceed {
            range_allowed: true,
        };
    }
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
                // exactly one strong tag, equal to ours
                entity_tags(v).is_some_and(|t| t.len() == 1 && t[0] != "*")
                    && list_matches(v, etag, true)
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
    fn entity_tag_lists() {
        assert_eq!(
            entity_tags("\"a\", W/\"b\" ,*").unwrap(),
            vec!["\"a\"", "W/\"b\"", "*"]
        );
        assert_eq!(entity_tags("\"a,b\"").unwrap(), vec!["\"a,b\""]);
        assert_eq!(
            entity_tags(" ,\"a\",,\t\"b\"").unwrap(),
            vec!["\"a\"", "\"b\""]
        );
        assert_eq!(entity_tags("").unwrap(), Vec::<&str>::new());
        assert!(entity_tags("\"a").is_none());
        assert!(entity_tags("a").is_none());
        assert!(entity_tags("\"a\" \"b\"").is_none());
        // what the comma-splitting copy got wrong: a comma inside a tag
        let e = "\"a,b\"";
        assert!(list_matches("\"a,b\"", e, true));
        assert!(!list_matches("\"a\"", e, false));
        assert!(list_matches("\"x\", W/\"a,b\"", e, false));
        assert!(!list_matches("\"x\", W/\"a,b\"", e, true));
        assert!(list_matches(" *", e, true));
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
        assert_eq!(evaluate(&h(&[("if-range", "W/\"abc\"")]), e, t), no_range);
        assert_eq!(
            evaluate(&h(&[("if-range", "\"abc\", \"x\"")]), e, t),
            no_range
        );
        assert_eq!(evaluate(&h(&[("if-range", &date)]), e, t), go);
        assert_eq!(evaluate(&h(&[("if-range", &older)]), e, t), no_range);
    }
}
