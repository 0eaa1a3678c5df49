//! The rules every request passes before it is routed (RFC 9110, 9112, 9113; nginx where the
//! RFCs leave a choice). A request that breaks one is answered here and never reaches a
//! route, a file or an upstream.
//!
//! | rule | answer |
//! |---|---|
//! | `CONNECT` (except HTTP/2 extended CONNECT, RFC 8441), `TRACE` | 405 (never forwarded) |
//! | HTTP/1.1 without `Host`, with two, or with an invalid value (RFC 9112 §3.2) | 400 |
//! | HTTP/2 `host` that differs from `:authority` (RFC 9113 §8.3.1), or neither present | 400 |
//! | `Transfer-Encoding` other than exactly `chunked` (RFC 9112 §6.1) | 501, connection closed |
//! | `Transfer-Encoding` and `Content-Length` together (RFC 9112 §6.3) | 400, connection closed |
//!
//! The authority a request names (what the upstream is told in `Host`) is the request
//! target's own for absolute-form targets (RFC 9112 §3.2.2: the `Host` header is then
//! ignored), else `:authority` (HTTP/2), else `Host`.

use http::header::{self, HeaderValue};
use http::{HeaderMap, Method, Request, StatusCode, Version};

/// A request refused before routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// The answer.
    pub status: StatusCode,
    /// The request's framing is in doubt: close the connection after answering (HTTP/1).
    pub close: bool,
    /// What the log's debug line says.
    pub reason: &'static str,
}

impl Refusal {
    fn bad(reason: &'static str) -> Self {
        Refusal {
            status: StatusCode::BAD_REQUEST,
            close: false,
            reason,
        }
    }
}

/// Where the authority a request names is (what the upstream is told in `Host`): found by
/// [`check`], made a value by [`authority`] only for the handlers that send it (a static
/// file needs none: copying it cost every HTTP/2 request an allocation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Authority {
    /// The request target's (absolute form, HTTP/2's `:authority`).
    Target,
    /// The `Host` header's.
    Host,
    /// None (an HTTP/1.0 request without `Host`, or an empty one).
    None,
}

/// The authority `at` says `req` names, as a value (`None`: it names none).
pub fn authority<B>(req: &Request<B>, at: Authority) -> Option<HeaderValue> {
    match at {
        Authority::Target => HeaderValue::from_str(req.uri().authority()?.as_str()).ok(),
        Authority::Host => req.headers().get(header::HOST).cloned(),
        Authority::None => None,
    }
}

/// Checks `req` against the table above; on success says where the authority the request
/// names is (see [`authority`]).
pub fn check<B>(req: &Request<B>) -> Result<Authority, Refusal> {
    // an HTTP/2 extended CONNECT (RFC 8441, WebSocket) goes on to its route
    let extended = req.extensions().get::<hyper::ext::Protocol>().is_some();
    if (req.method() == Method::CONNECT && !extended) || req.method() == Method::TRACE {
        return Err(Refusal {
            status: StatusCode::METHOD_NOT_ALLOWED,
            close: false,
            reason: "CONNECT and TRACE are not served",
        });
    }
    let h = req.headers();
    if req.version() <= Version::HTTP_11 {
        check_framing(h)?;
    }
    let mut hosts = h.get_all(header::HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err(Refusal::bad("more than one Host header"));
    }
    if let Some(v) = host {
        if !valid_host(v.as_bytes()) {
            return Err(Refusal::bad("invalid Host header"));
        }
    }
    let target = req
        .uri()
        .authority()
        .map(|a| a.as_str())
        .filter(|a| !a.is_empty());
    if let Some(a) = target {
        if !valid_host(a.as_bytes()) || a.is_empty() {
            return Err(Refusal::bad("invalid authority in the request target"));
        }
    }
    match req.version() {
        Version::HTTP_2 | Version::HTTP_3 => match (target, host) {
            (Some(a), Some(h)) if !a.as_bytes().eq_ignore_ascii_case(h.as_bytes()) => {
                Err(Refusal::bad("host header differs from :authority"))
            }
            (Some(_), _) => Ok(Authority::Target),
            (None, Some(h)) => Ok(host_authority(h)),
            (None, None) => Err(Refusal::bad("no :authority and no host header")),
        },
        Version::HTTP_11 if host.is_none() => Err(Refusal::bad("HTTP/1.1 request without Host")),
        _ => Ok(match (target, host) {
            // absolute-form: the target's authority wins over Host
            (Some(_), _) => Authority::Target,
            (None, Some(h)) => host_authority(h),
            (None, None) => Authority::None,
        }),
    }
}

fn host_authority(h: &HeaderValue) -> Authority {
    if h.is_empty() {
        Authority::None
    } else {
        Authority::Host
    }
}

/// HTTP/1 body framing: `Transfer-Encoding` must be exactly `chunked`, and never comes with
/// `Content-Length` (a request smuggling vector when two hops disagree on which wins).
fn check_framing(h: &HeaderMap) -> Result<(), Refusal> {
    let mut codings = 0usize;
    let mut chunked_only = true;
    for v in h.get_all(header::TRANSFER_ENCODING) {
        let Ok(s) = v.to_str() else {
            chunked_only = false;
            continue;
        };
        for t in s.split(',') {
            let t = t.trim();
            if t.is_empty() {
                continue;
            }
            codings += 1;
            if !t.eq_ignore_ascii_case("chunked") {
                chunked_only = false;
            }
        }
    }
    if h.contains_key(header::TRANSFER_ENCODING) {
        if codings != 1 || !chunked_only {
            return Err(Refusal {
                status: StatusCode::NOT_IMPLEMENTED,
                close: true,
                reason: "unsupported Transfer-Encoding",
            });
        }
        if h.contains_key(header::CONTENT_LENGTH) {
            return Err(Refusal {
                status: StatusCode::BAD_REQUEST,
                close: true,
                reason: "Transfer-Encoding with Content-Length",
            });
        }
    }
    Ok(())
}

/// `uri-host [ ":" port ]` (RFC 9110 §7.2, RFC 3986 §3.2.2): an IP literal in brackets, or a
/// reg-name of unreserved, percent-encoded and sub-delim characters; the port all digits.
/// An empty value is valid (RFC 9112 §3.2: the target has no authority). No userinfo.
pub fn valid_host(v: &[u8]) -> bool {
    if v.is_empty() {
        return true;
    }
    let (host, port) = if v[0] == b'[' {
        let Some(end) = v.iter().position(|&b| b == b']') else {
            return false;
        };
        let inner = &v[1..end];
        let ok = std::str::from_utf8(inner)
            .ok()
            .and_then(|s| s.parse::<std::net::Ipv6Addr>().ok())
            .is_some();
        if !ok {
            return false;
        }
        match &v[end + 1..] {
            [] => return true,
            [b':', port @ ..] => (&v[..0], port),
            _ => return false,
        }
    } else {
        match v.iter().position(|&b| b == b':') {
            Some(i) => (&v[..i], &v[i + 1..]),
            None => (v, &v[v.len()..]),
        }
    };
    if !port.iter().all(u8::is_ascii_digit) || port.len() > 5 {
        return false;
    }
    let mut i = 0;
    while i < host.len() {
        let b = host[i];
        if b == b'%' {
            if !(host.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && host.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
            {
                return false;
            }
            i += 3;
            continue;
        }
        let ok = b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'-' | b'.'
                    | b'_'
                    | b'~'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
            );
        if !ok {
            return false;
        }
        i += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(version: Version, uri: &str, headers: &[(&str, &str)]) -> Request<()> {
        let mut b = Request::builder().version(version).uri(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn host_values() {
        for ok in [
            "example.com",
            "example.com:8443",
            "127.0.0.1",
            "127.0.0.1:80",
            "[::1]",
            "[::1]:443",
            "a-b_c~d.e",
            "xn--caf-dma.example",
            "%41bc",
            "",
        ] {
            assert!(valid_host(ok.as_bytes()), "{ok}");
        }
        for bad in [
            "user@example.com",
            "example.com/path",
            "example.com:80:80",
            "example.com:8o",
            "exa mple.com",
            "[::1",
            "[nope]:80",
            "[::1]x",
            "example.com:123456",
            "%zz",
            "a\"b",
            "a\\b",
        ] {
            assert!(!valid_host(bad.as_bytes()), "{bad}");
        }
    }

    /// The authority `req` names, as the proxy gets it.
    fn named<B>(req: &Request<B>) -> HeaderValue {
        authority(req, check(req).unwrap()).unwrap()
    }

    #[test]
    fn host_rules_per_version() {
        let h11 = Version::HTTP_11;
        let h2 = Version::HTTP_2;
        assert!(check(&req(h11, "/", &[("host", "a")])).is_ok());
        assert_eq!(check(&req(h11, "/", &[])).unwrap_err().status, 400);
        let old = req(Version::HTTP_10, "/", &[]);
        assert_eq!(check(&old).unwrap(), Authority::None);
        assert!(authority(&old, Authority::None).is_none());
        let two = req(h11, "/", &[("host", "a"), ("host", "b")]);
        assert_eq!(check(&two).unwrap_err().status, 400);
        let bad = req(h11, "/", &[("host", "a@b")]);
        assert_eq!(check(&bad).unwrap_err().status, 400);
        // absolute-form: the target's authority wins
        let abs = req(h11, "http://target.example/x", &[("host", "other")]);
        assert_eq!(named(&abs), "target.example");
        // h2: host must agree with :authority
        let ok = req(h2, "https://a.example/", &[("host", "A.example")]);
        assert_eq!(named(&ok), "a.example");
        let differ = req(h2, "https://a.example/", &[("host", "b.example")]);
        assert_eq!(check(&differ).unwrap_err().status, 400);
        let host_only = req(h2, "/", &[("host", "b.example")]);
        assert_eq!(named(&host_only), "b.example");
        assert_eq!(check(&req(h2, "/", &[])).unwrap_err().status, 400);
    }

    #[test]
    fn methods_and_framing() {
        let connect = Request::builder()
            .method(Method::CONNECT)
            .uri("example.com:443")
            .header("host", "example.com:443")
            .body(())
            .unwrap();
        assert_eq!(check(&connect).unwrap_err().status, 405);
        let trace = Request::builder()
            .method(Method::TRACE)
            .uri("/")
            .header("host", "a")
            .body(())
            .unwrap();
        assert_eq!(check(&trace).unwrap_err().status, 405);
        let h11 = Version::HTTP_11;
        let te = |v: &str| req(h11, "/", &[("host", "a"), ("transfer-encoding", v)]);
        assert!(check(&te("chunked")).is_ok());
        assert!(check(&te("Chunked")).is_ok());
        for bad in ["gzip, chunked", "chunked, chunked", "identity", "gzip"] {
            let r = check(&te(bad)).unwrap_err();
            assert_eq!(
                (r.status, r.close),
                (StatusCode::NOT_IMPLEMENTED, true),
                "{bad}"
            );
        }
        let both = req(
            h11,
            "/",
            &[
                ("host", "a"),
                ("transfer-encoding", "chunked"),
                ("content-length", "3"),
            ],
        );
        let r = check(&both).unwrap_err();
        assert_eq!((r.status, r.close), (StatusCode::BAD_REQUEST, true));
    }
}
