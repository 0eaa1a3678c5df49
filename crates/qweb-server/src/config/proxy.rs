//! The keys of a proxy route (`[[route]]` with `upstreams`), validated.

use std::net::ToSocketAddrs;
use std::time::Duration;

use toml::Spanned;

use super::raw::RawRoute;
use super::{ConfigError, ProxyConfig, Upstream, Validator};

/// Smallest upstream response head limit: hyper's HTTP/1 client cannot buffer less.
const MIN_RESPONSE_HEADER_SIZE: u64 = 8 * 1024;

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
        Ok(ProxyConfig {
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
