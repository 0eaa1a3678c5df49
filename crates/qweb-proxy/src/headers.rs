//! Header rewriting for both directions of the proxy: hop-by-hop removal (RFC 9110 §7.6.1,
//! the list is [`qweb_http::fields`]'s), the forwarding headers, and names qweb does not pass.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use qweb_config::ProxyConfig;
use qweb_http::fields::strip_hop_by_hop;

/// The forwarding headers a client may only pass when it is a trusted proxy.
const FORWARDING: [&str; 4] = [
    "x-forwarded-host",
    "x-forwarded-proto",
    "forwarded",
    "x-real-ip",
];

/// Joins several `Cookie` fields into one, separated by `"; "` (RFC 9113 §8.2.3, RFC 6265
/// §5.4: one `Cookie` header).
fn join_cookies(h: &mut HeaderMap) {
    if h.get_all(header::COOKIE).iter().nth(1).is_none() {
        return;
    }
    let joined: Vec<&[u8]> = h
        .get_all(header::COOKIE)
        .iter()
        .map(HeaderValue::as_bytes)
        .collect();
    // valid values joined by "; " are a valid value; kept as they came if not
    let Ok(one) = HeaderValue::from_bytes(&joined.join(&b"; "[..])) else {
        return;
    };
    h.insert(header::COOKIE, one);
}

/// Who sent the request, as the upstream is told.
pub struct Forwarding<'a> {
    /// The client's address.
    pub peer: std::net::IpAddr,
    /// It came over TLS.
    pub tls: bool,
    /// The authority it named (see [`qweb_http::request_rules::check`]).
    pub authority: Option<&'a HeaderValue>,
}

/// Rewrites a client's request headers for the upstream named `upstream` (`host:port`).
///
/// - hop-by-hop headers go; names with `_` go unless `underscores_in_headers`;
/// - several `Cookie` fields (HTTP/2 clients send one per cookie) are joined into one with
///   `"; "` (RFC 9113 §8.2.3: an HTTP/1.1 upstream would otherwise read only one);
/// - `Host` is the authority the client named (else the upstream's name);
/// - `X-Forwarded-For` is every value the client sent, joined, plus the client's address;
/// - `X-Forwarded-Host`, `X-Forwarded-Proto`, `X-Real-IP` are set by qweb, and `Forwarded`
///   dropped, unless the client is in `trusted_proxies` (then the client's are kept).
pub fn rewrite_request(
    h: &mut HeaderMap,
    cfg: &ProxyConfig,
    from: &Forwarding<'_>,
    upstream: &str,
) {
    let xff_in: Vec<String> = h
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
        .collect();
    strip_hop_by_hop(h);
    // qweb answered the client's `Expect: 100-continue` itself when the body was first read;
    // the upstream gets the body at once (nginx clears `Expect` the same way)
    h.remove(header::EXPECT);
    join_cookies(h);
    if !cfg.underscores_in_headers {
        let bad: Vec<HeaderName> = h
            .keys()
            .filter(|n| n.as_str().contains('_'))
            .cloned()
            .collect();
        for n in bad {
            h.remove(n);
        }
    }
    let host = match from.authority {
        Some(a) => a.clone(),
        None => HeaderValue::from_str(upstream).unwrap_or(HeaderValue::from_static("localhost")),
    };
    h.insert(header::HOST, host.clone());
    let ip = from.peer.to_string();
    let trusted = cfg.trusted_proxies.iter().any(|n| n.contains(&from.peer));
    if !trusted {
        for n in FORWARDING {
            h.remove(n);
        }
    }
    let mut xff = xff_in.join(", ");
    if !xff.is_empty() {
        xff.push_str(", ");
    }
    xff.push_str(&ip);
    if let Ok(v) = HeaderValue::from_str(&xff) {
        h.insert("x-forwarded-for", v);
    }
    if !h.contains_key("x-forwarded-host") {
        h.insert("x-forwarded-host", host);
    }
    if !h.contains_key("x-forwarded-proto") {
        h.insert(
            "x-forwarded-proto",
            HeaderValue::from_static(if from.tls { "https" } else { "http" }),
        );
    }
    if !h.contains_key("x-real-ip") {
        if let Ok(v) = HeaderValue::from_str(&ip) {
            h.insert("x-real-ip", v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn cfg(trusted: &[&str], underscores: bool) -> ProxyConfig {
        ProxyConfig {
            upstreams: vec![],
            connect_timeout: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            client_body_timeout: Duration::from_secs(1),
            keepalive: 1,
            pass_raw_path: false,
            underscores_in_headers: underscores,
            trusted_proxies: trusted.iter().map(|t| t.parse().unwrap()).collect(),
            max_response_header_size: 8192,
            upgrade: vec![],
            upgrade_idle_timeout: Duration::from_secs(1),
            max_body_size: None,
            buffer_request_body: false,
            upstream_tls: None,
            upstream_server_name: None,
            balance: qweb_config::Balance::RoundRobin,
            weights: vec![],
            max_fails: 1,
            fail_timeout: Duration::from_secs(1),
            health_check: None,
            gauges: Default::default(),
            upstream_proxy_protocol: None,
        }
    }

    fn headers(list: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in list {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn connection_cannot_strip_protected_headers() {
        let mut h = headers(&[
            (
                "connection",
                "Authorization, Cookie, X-Custom, content-length",
            ),
            ("authorization", "Bearer t"),
            ("cookie", "a=b"),
            ("x-custom", "gone"),
            ("content-length", "3"),
            ("keep-alive", "timeout=5"),
        ]);
        strip_hop_by_hop(&mut h);
        assert!(h.contains_key("authorization"));
        assert!(h.contains_key("cookie"));
        assert!(h.contains_key("content-length"));
        assert!(!h.contains_key("x-custom"));
        assert!(!h.contains_key("keep-alive"));
        assert!(!h.contains_key("connection"));
    }

    #[test]
    fn cookie_fields_are_joined() {
        let mut h = headers(&[("cookie", "a=1"), ("cookie", "b=2; c=3"), ("x", "y")]);
        join_cookies(&mut h);
        let all: Vec<_> = h.get_all("cookie").iter().collect();
        assert_eq!(all, ["a=1; b=2; c=3"]);
        let mut h = headers(&[("cookie", "a=1")]);
        join_cookies(&mut h);
        assert_eq!(h["cookie"], "a=1");
    }

    #[test]
    fn forwarding_headers_from_untrusted_and_trusted_peers() {
        let authority = HeaderValue::from_static("site.example");
        let from = Forwarding {
            peer: "192.0.2.7".parse().unwrap(),
            tls: true,
            authority: Some(&authority),
        };
        let client = [
            ("x-forwarded-for", "10.0.0.1"),
            ("x-forwarded-for", "10.0.0.2, 10.0.0.3"),
            ("x-forwarded-host", "evil.example"),
            ("x-forwarded-proto", "http"),
            ("forwarded", "for=1.2.3.4"),
            ("x-real-ip", "1.2.3.4"),
            ("x_forwarded_for", "smuggled"),
            ("content_length", "0"),
        ];
        let mut h = headers(&client);
        rewrite_request(&mut h, &cfg(&[], false), &from, "up:80");
        assert_eq!(
            h["x-forwarded-for"],
            "10.0.0.1, 10.0.0.2, 10.0.0.3, 192.0.2.7"
        );
        assert_eq!(h["x-forwarded-host"], "site.example");
        assert_eq!(h["x-forwarded-proto"], "https");
        assert_eq!(h["x-real-ip"], "192.0.2.7");
        assert_eq!(h["host"], "site.example");
        assert!(!h.contains_key("forwarded"));
        assert!(!h.contains_key("x_forwarded_for"));
        assert!(!h.contains_key("content_length"));

        let mut h = headers(&client);
        rewrite_request(&mut h, &cfg(&["192.0.2.0/24"], true), &from, "up:80");
        assert_eq!(h["x-forwarded-host"], "evil.example");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["forwarded"], "for=1.2.3.4");
        assert_eq!(h["x-real-ip"], "1.2.3.4");
        assert_eq!(h["x_forwarded_for"], "smuggled");

        let mut h = HeaderMap::new();
        let none = Forwarding {
            authority: None,
            ..from
        };
        rewrite_request(&mut h, &cfg(&[], false), &none, "up:80");
        assert_eq!(h["host"], "up:80");
    }
}
