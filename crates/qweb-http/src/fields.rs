//! Which header fields belong to one connection rather than to the message, and which may
//! not travel as trailers: the one list of each, for the drivers and the proxy.

use http::header::{self, HeaderMap, HeaderName};

/// Fields that describe one connection (RFC 9110 §7.6.1): an HTTP/2 or HTTP/3 message with one
/// is malformed (RFC 9113 §8.2.2, RFC 9114 §4.2), and a proxy does not forward them.
pub const CONNECTION_SPECIFIC: [&str; 6] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "transfer-encoding",
    "upgrade",
];

/// Whether `name` is one of the [`CONNECTION_SPECIFIC`] fields, compared as a header name
/// (the standard ones by their tag, not as strings): for the HTTP/2 layer's every field.
#[inline]
pub fn is_connection_specific(name: &HeaderName) -> bool {
    matches!(
        *name,
        header::CONNECTION | header::TE | header::TRANSFER_ENCODING | header::UPGRADE
    ) || name == "keep-alive"
        || name == "proxy-connection"
}

/// What a proxy removes on each hop beyond [`CONNECTION_SPECIFIC`]: `Trailer` (its framing is
/// the hop's) and the proxy credentials (RFC 9110 §11.7), which are for qweb, not the next hop.
const HOP_ONLY: [&str; 3] = ["trailer", "proxy-authorization", "proxy-authenticate"];

/// Fields a `Connection` option may not remove: the framing, the target, end-to-end
/// credentials, and the forwarding headers qweb sets itself. A client must not be able to
/// strip `Authorization` or `Cookie` on their way to the application, nor a response's
/// `Content-Length` on its way down.
const PROTECTED: [&str; 11] = [
    "host",
    "content-length",
    "content-type",
    "authorization",
    "cookie",
    "set-cookie",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "forwarded",
    "x-real-ip",
];

/// Removes the [`CONNECTION_SPECIFIC`] fields: for an HTTP/3 response (hyper does the same for
/// HTTP/2), where a client such as aioquic closes the whole connection with
/// H3_MESSAGE_ERROR on one of them.
pub fn strip_connection_specific(h: &mut HeaderMap) {
    for n in CONNECTION_SPECIFIC {
        h.remove(n);
    }
}

/// Removes hop-by-hop fields on the proxy's way in either direction: every field named in
/// `Connection` (except the protected ones: framing, `Host`, credentials, cookies and the forwarding fields), the [`CONNECTION_SPECIFIC`] ones, `Trailer`
/// and the proxy credentials.
pub fn strip_hop_by_hop(h: &mut HeaderMap) {
    if h.contains_key(header::CONNECTION) {
        let named: Vec<HeaderName> = h
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
            .filter(|n| !PROTECTED.contains(&n.as_str()))
            .collect();
        for n in named {
            h.remove(n);
        }
    }
    strip_connection_specific(h);
    for n in HOP_ONLY {
        h.remove(n);
    }
}

/// Fields that must not be sent, nor acted on, as trailers (RFC 9110 §6.5.1): message
/// framing, routing, request modifiers (controls, conditionals, content negotiation),
/// authentication and cookies, response control data, and what describes the content.
/// Prefixes (`content-`, `if-`, `accept`, `x-forwarded-`) are matched by
/// [`allowed_in_trailers`].
const NOT_TRAILERS: [&str; 33] = [
    // framing and the connection
    "transfer-encoding",
    "content-length",
    "trailer",
    "connection",
    "keep-alive",
    "proxy-connection",
    "upgrade",
    "te",
    // routing and forwarding
    "host",
    "forwarded",
    "x-real-ip",
    "via",
    "max-forwards",
    // request modifiers
    "cache-control",
    "expect",
    "pragma",
    "range",
    // authentication and state
    "authorization",
    "proxy-authorization",
    "www-authenticate",
    "proxy-authenticate",
    "authentication-info",
    "proxy-authentication-info",
    "cookie",
    "set-cookie",
    // response control data
    "age",
    "date",
    "expires",
    "location",
    "retry-after",
    "vary",
    "strict-transport-security",
    "alt-svc",
];

/// May `name` travel as a trailer? `grpc-status`, `grpc-message`, `server-timing` and
/// `x-...` fields may; framing, routing, request modifiers, authentication and cookies,
/// response control and `Content-*` fields may not (RFC 9110 §6.5.1).
pub fn allowed_in_trailers(name: &HeaderName) -> bool {
    let n = name.as_str();
    !(NOT_TRAILERS.contains(&n)
        || n.starts_with("content-")
        || n.starts_with("if-")
        || n.starts_with("accept")
        || n.starts_with("x-forwarded-"))
}

/// Removes from trailers every field that may not be one ([`allowed_in_trailers`]); returns
/// how many were removed.
pub fn strip_forbidden_trailers(t: &mut HeaderMap) -> usize {
    let bad: Vec<HeaderName> = t
        .keys()
        .filter(|n| !allowed_in_trailers(n))
        .cloned()
        .collect();
    let mut removed = 0;
    for n in bad {
        removed += t.get_all(&n).iter().count();
        t.remove(n);
    }
    removed
}

#[cfg(test)]
mod tests {
    /// The fast check names the list's fields and no others.
    #[test]
    fn the_fast_check_agrees_with_the_list() {
        for n in CONNECTION_SPECIFIC {
            assert!(is_connection_specific(&HeaderName::from_static(n)), "{n}");
        }
        for n in [
            "content-type",
            "keep-alive-x",
            "connections",
            "tea",
            "date",
            "x-upgrade",
        ] {
            assert!(!is_connection_specific(&HeaderName::from_static(n)), "{n}");
        }
    }

    use super::*;

    /// Issue 41, item 3: one field of each class RFC 9110 §6.5.1 names is dropped from
    /// trailers; what gRPC and timing need passes.
    #[test]
    fn trailers_keep_only_what_may_be_a_trailer() {
        let mut t = HeaderMap::new();
        for (n, v) in [
            ("x-t", "ok"),
            ("grpc-status", "0"),
            ("grpc-message", "fine"),
            ("server-timing", "db;dur=53"),
            ("location", "//evil.example/"),
            ("content-length", "5"),
            ("transfer-encoding", "chunked"),
            ("host", "evil.example"),
            ("authorization", "Basic eA=="),
            ("set-cookie", "a=b"),
            ("cache-control", "no-store"),
            ("if-match", "*"),
            ("content-type", "text/html"),
            ("content-encoding", "gzip"),
            ("accept-encoding", "br"),
            ("www-authenticate", "Basic"),
            ("retry-after", "1"),
            ("x-forwarded-for", "10.0.0.1"),
            ("trailer", "x-t"),
        ] {
            t.append(HeaderName::from_static(n), v.parse().unwrap());
        }
        t.append("set-cookie", "c=d".parse().unwrap());
        assert_eq!(strip_forbidden_trailers(&mut t), 16);
        let mut left: Vec<&str> = t.keys().map(|k| k.as_str()).collect();
        left.sort();
        assert_eq!(
            left,
            ["grpc-message", "grpc-status", "server-timing", "x-t"]
        );
    }

    #[test]
    fn connection_options_cannot_remove_protected_fields() {
        let mut h = HeaderMap::new();
        for (n, v) in [
            ("connection", "x-a, authorization, cookie, keep-alive"),
            ("x-a", "1"),
            ("authorization", "Bearer t"),
            ("cookie", "a=1"),
            ("keep-alive", "timeout=5"),
            ("trailer", "x-b"),
            ("te", "trailers"),
            ("x-b", "2"),
        ] {
            h.append(HeaderName::from_static(n), v.parse().unwrap());
        }
        strip_hop_by_hop(&mut h);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort();
        assert_eq!(left, ["authorization", "cookie", "x-b"]);
    }
}
