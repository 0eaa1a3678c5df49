//! The keys of a proxy route (`[[route]]` with `upstreams`), validated.

use std::net::ToSocketAddrs;
use std::time::Duration;

use toml::Spanned;

use super::raw::RawRoute;
use super::{ConfigError, ProxyConfig, Upstream, Validator};

/// Smallest upstream response head limit: hyper's HTTP/1 client cannot buffer less.
const MIN_RESPONSE_HEADER_SIZE: u64 = 8 * 1024;

/// Largest body `buffer_request_body` may hold in memory.
const MAX_BUFFERED_BODY: u64 = 1 << 30;

impl Validator<'_> {
    /// The proxy part of route `i` (its `upstreams` are `ups`).
    pub(super) fn proxy_route(
        &self,
        i: usize,
        rr: &RawRoute,
        ups: &Spanned<Vec<Spanned<String>>>,
    ) -> Result<ProxyConfig, ConfigError> {
        if ups.get_ref().is_empty() {
            return Err(self.err(
                Some(ups.span()),
                format!("route[{i}].upstreams"),
                "at least one upstream is needed",
            ));
        }
        let mut upstreams = Vec::new();
        for (j, u) in ups.get_ref().iter().enumerate() {
            let up = parse_upstream(u.get_ref())
                .map_err(|m| self.err(Some(u.span()), format!("route[{i}].upstreams[{j}]"), m))?;
            upstreams.push(up);
        }
        let mut trusted_proxies = Vec::new();
        for (j, t) in rr.trusted_proxies.iter().flatten().enumerate() {
            let net = parse_cidr(t.get_ref()).map_err(|m| {
                self.err(
                    Some(t.span()),
                    format!("route[{i}].trusted_proxies[{j}]"),
                    m,
                )
            })?;
            trusted_proxies.push(net);
        }
        let max_response_header_size = match &rr.max_response_header_size {
            None => 32 * 1024,
            Some(s) if s.get_ref().0 < MIN_RESPONSE_HEADER_SIZE || s.get_ref().0 > 1 << 20 => {
                return Err(self.err(
                    Some(s.span()),
                    format!("route[{i}].max_response_header_size"),
                    "must be from 8KiB to 1MiB",
                ))
            }
            Some(s) => s.get_ref().0 as usize,
        };
        let pass_raw_path = rr.pass_raw_path.unwrap_or(false);
        if pass_raw_path && rr.strip_prefix.unwrap_or(false) {
            return Err(self.err(
                None,
                format!("route[{i}].pass_raw_path"),
                "`pass_raw_path` forwards the client's path as sent: it cannot be combined with `strip_prefix`",
            ));
        }
        let upgrade = self.upgrade_tokens(i, rr)?;
        let upgrade_idle_timeout = match &rr.upgrade_idle_timeout {
            None => Duration::from_secs(300),
            Some(d) if d.get_ref().0.is_zero() => {
                return Err(self.err(
                    Some(d.span()),
                    format!("route[{i}].upgrade_idle_timeout"),
                    "must be more than 0",
                ))
            }
            Some(d) => d.get_ref().0,
        };
        let max_body_size = match &rr.max_body_size {
            None => None,
            Some(s) if s.get_ref().0 == 0 => {
                return Err(self.err(
                    Some(s.span()),
                    format!("route[{i}].max_body_size"),
                    "must be more than 0 (leave it out for no limit)",
                ))
            }
            Some(s) => Some(s.get_ref().0),
        };
        let buffer_request_body = rr.buffer_request_body.unwrap_or(false);
        match max_body_size {
            None if buffer_request_body => {
                return Err(self.err(
                    None,
                    format!("route[{i}].buffer_request_body"),
                    "`buffer_request_body` holds the body in memory: set `max_body_size` too",
                ))
            }
            Some(n) if buffer_request_body && n > MAX_BUFFERED_BODY => {
                return Err(self.err(
                    rr.max_body_size.as_ref().map(|s| s.span()),
                    format!("route[{i}].max_body_size"),
                    "with `buffer_request_body`, at most 1GiB",
                ))
            }
            _ => {}
        }
        Ok(ProxyConfig {
            upgrade,
            upgrade_idle_timeout,
            max_body_size,
            buffer_request_body,
            upstreams,
            connect_timeout: rr
                .connect_timeout
                .map(|d| d.0)
                .unwrap_or(Duration::from_secs(5)),
            timeout: rr.timeout.map(|d| d.0).unwrap_or(Duration::from_secs(60)),
            client_body_timeout: rr
                .client_body_timeout
                .map(|d| d.0)
                .unwrap_or(Duration::from_secs(60)),
            keepalive: rr.keepalive.unwrap_or(32),
            pass_raw_path,
            underscores_in_headers: rr.underscores_in_headers.unwrap_or(false),
            trusted_proxies,
            max_response_header_size,
        })
    }

    /// Refuses proxy-only keys on a static route.
    pub(super) fn no_proxy_keys(&self, i: usize, rr: &RawRoute) -> Result<(), ConfigError> {
        let set = [
            ("connect_timeout", rr.connect_timeout.is_some()),
            ("timeout", rr.timeout.is_some()),
            ("client_body_timeout", rr.client_body_timeout.is_some()),
            ("keepalive", rr.keepalive.is_some()),
            ("pass_raw_path", rr.pass_raw_path.is_some()),
            (
                "underscores_in_headers",
                rr.underscores_in_headers.is_some(),
            ),
            ("trusted_proxies", rr.trusted_proxies.is_some()),
            (
                "max_response_header_size",
                rr.max_response_header_size.is_some(),
            ),
            ("upgrade", rr.upgrade.is_some()),
            ("upgrade_idle_timeout", rr.upgrade_idle_timeout.is_some()),
            ("max_body_size", rr.max_body_size.is_some()),
            ("buffer_request_body", rr.buffer_request_body.is_some()),
        ];
        match set.iter().find(|(_, on)| *on) {
            Some((key, _)) => Err(self.err(
                None,
                format!("route[{i}].{key}"),
                format!("`{key}` is for proxy routes (with `upstreams`)"),
            )),
            None => Ok(()),
        }
    }
}

impl Validator<'_> {
    /// `upgrade = ["websocket", ...]`: protocol tokens (RFC 9110 §7.8), lowercased; `h2c` is
    /// refused (an h2c upgrade through a proxy reaches the upstream's HTTP/2 side without the
    /// proxy's request checks: request smuggling).
    fn upgrade_tokens(&self, i: usize, rr: &RawRoute) -> Result<Vec<String>, ConfigError> {
        let Some(list) = &rr.upgrade else {
            return Ok(vec!["websocket".to_owned()]);
        };
        let mut out = Vec::new();
        for (j, t) in list.get_ref().iter().enumerate() {
            let key = format!("route[{i}].upgrade[{j}]");
            let v = t.get_ref().trim();
            let name = v.split('/').next().unwrap_or("");
            let token = |s: &str| {
                !s.is_empty()
                    && s.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
            };
            if !v.split('/').all(token) || v.split('/').count() > 2 {
                return Err(self.err(
                    Some(t.span()),
                    key,
                    format!("`{v}` is not a protocol token (e.g. \"websocket\")"),
                ));
            }
            if name.eq_ignore_ascii_case("h2c") {
                return Err(self.err(
                    Some(t.span()),
                    key,
                    "`h2c` upgrades are never passed (they smuggle requests past the proxy)",
                ));
            }
            out.push(v.to_ascii_lowercase());
        }
        Ok(out)
    }
}

/// `10.0.0.0/8`, `::1/128`, or a bare address (one host).
fn parse_cidr(s: &str) -> Result<ipnet::IpNet, String> {
    if let Ok(n) = s.parse::<ipnet::IpNet>() {
        return Ok(n.trunc());
    }
    s.parse::<std::net::IpAddr>()
        .map(ipnet::IpNet::from)
        .map_err(|_| format!("`{s}` is not an address or CIDR block (e.g. 10.0.0.0/8)"))
}

/// `host:port` or `http://host:port`, resolved now.
pub(super) fn parse_upstream(s: &str) -> Result<Upstream, String> {
    let hostport = if let Some(rest) = s.strip_prefix("http://") {
        rest.trim_end_matches('/')
    } else if s.starts_with("https://") {
        return Err("https upstreams are not supported yet; use http://host:port".into());
    } else {
        s
    };
    if hostport.contains('/') {
        return Err(format!("`{s}`: an upstream is `host:port` without a path"));
    }
    let mut addrs = hostport
        .to_socket_addrs()
        .map_err(|e| format!("`{s}` is not a reachable host:port: {e}"))?;
    let addr = addrs
        .next()
        .ok_or_else(|| format!("`{s}` resolves to no address"))?;
    Ok(Upstream {
        name: hostport.to_owned(),
        addr,
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::{Config, ProxyConfig, RouteAction};

    fn route(keys: &str) -> Result<ProxyConfig, String> {
        let text = format!("[[route]]\nprefix = \"/api\"\nupstreams = [\"127.0.0.1:9\"]\n{keys}\n");
        let c = Config::from_str_at(&text, Some(Path::new("/etc/qweb/test.toml")))
            .map_err(|e| e.to_string())?;
        match &c.routes.iter().find(|r| r.prefix == "/api").unwrap().action {
            RouteAction::Proxy(p) => Ok(p.clone()),
            RouteAction::Static(_) => panic!("not a proxy route"),
        }
    }

    #[test]
    fn upgrade_and_body_defaults() {
        let p = route("").unwrap();
        assert_eq!(p.upgrade, vec!["websocket".to_owned()]);
        assert_eq!(p.upgrade_idle_timeout, std::time::Duration::from_secs(300));
        assert_eq!(p.max_body_size, None);
        assert!(!p.buffer_request_body);
        let p = route(
            "upgrade = [\"WebSocket\", \"foo/2\"]\nupgrade_idle_timeout = \"30s\"\n\
             max_body_size = \"1MiB\"\nbuffer_request_body = true",
        )
        .unwrap();
        assert_eq!(p.upgrade, vec!["websocket".to_owned(), "foo/2".to_owned()]);
        assert_eq!(p.upgrade_idle_timeout, std::time::Duration::from_secs(30));
        assert_eq!(p.max_body_size, Some(1 << 20));
        assert!(p.buffer_request_body);
        assert!(route("upgrade = []").unwrap().upgrade.is_empty());
    }

    #[test]
    fn upgrade_and_body_errors_name_the_key() {
        let e = route("upgrade = [\"websocket\", \"h2c\"]").unwrap_err();
        assert!(
            e.contains(":4:") && e.contains("key `route[0].upgrade[1]`"),
            "{e}"
        );
        assert!(e.contains("smuggle"), "{e}");
        let e = route("upgrade = [\"web socket\"]").unwrap_err();
        assert!(e.contains("key `route[0].upgrade[0]`"), "{e}");
        let e = route("upgrade_idle_timeout = \"0s\"").unwrap_err();
        assert!(e.contains("key `route[0].upgrade_idle_timeout`"), "{e}");
        let e = route("max_body_size = 0").unwrap_err();
        assert!(
            e.contains(":4:") && e.contains("key `route[0].max_body_size`"),
            "{e}"
        );
        let e = route("buffer_request_body = true").unwrap_err();
        assert!(e.contains("key `route[0].buffer_request_body`"), "{e}");
        let e = route("buffer_request_body = true\nmax_body_size = \"2GiB\"").unwrap_err();
        assert!(e.contains("key `route[0].max_body_size`"), "{e}");
        let text = "[[route]]\nprefix = \"/\"\nroot = \"/tmp\"\nmax_body_size = \"1MiB\"\n";
        let e = Config::from_str_at(text, None).unwrap_err().to_string();
        assert!(e.contains("key `route[0].max_body_size`"), "{e}");
    }
}
