//! `forward_auth` on a route (issue 39, phase 8): every request asks an authentication service
//! first (Caddy's `forward_auth`, nginx's `auth_request`, Envoy's `ext_authz` over HTTP). The
//! service gets a subrequest with the original method, fields and URI; a 2xx lets the request
//! through with the `copy_headers` fields of the answer; anything else is the client's answer.

use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::units::{Dur, Size};
use super::{parse_upstream, ConfigError, ProxyConfig, Validator};

/// `timeout` when the route does not say.
pub const DEFAULT_FORWARD_AUTH_TIMEOUT: Duration = Duration::from_secs(5);

/// `max_response_size` when the route does not say.
pub const DEFAULT_FORWARD_AUTH_RESPONSE: u64 = 64 * 1024;

/// The most `max_response_size` may be.
pub const MAX_FORWARD_AUTH_RESPONSE: u64 = 16 << 20;

/// `forward_auth = { upstream, path, copy_headers, timeout, max_response_size }` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawForwardAuth {
    pub upstream: Spanned<String>,
    pub path: Option<Spanned<String>>,
    pub copy_headers: Option<Vec<Spanned<String>>>,
    pub timeout: Option<Spanned<Dur>>,
    pub max_response_size: Option<Spanned<Size>>,
}

/// A route's authentication service.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ForwardAuth {
    /// How the service is reached: one upstream, its timeouts.
    pub proxy: ProxyConfig,
    /// The path (and query) the subrequest asks for; the original URI goes in
    /// `X-Forwarded-Uri`.
    pub path: String,
    /// Fields of a 2xx answer set on the request (any the client sent are removed first).
    pub copy_headers: Vec<http::HeaderName>,
    /// The longest the service may take to answer; then 502 (never a pass).
    pub timeout: Duration,
    /// The largest body of a refusal passed to the client; a longer one is cut (and a
    /// `Content-Length` over it is a 502).
    pub max_response_size: u64,
}

impl Validator<'_> {
    /// Route `key`'s `forward_auth`.
    pub(super) fn forward_auth(
        &self,
        key: &str,
        f: &Spanned<RawForwardAuth>,
    ) -> Result<ForwardAuth, ConfigError> {
        let raw = f.get_ref();
        let k = format!("{key}.forward_auth");
        let up = parse_upstream(raw.upstream.get_ref())
            .map_err(|m| self.err(Some(raw.upstream.span()), format!("{k}.upstream"), m))?;
        if up.tls || up.h2 {
            return Err(self.err(
                Some(raw.upstream.span()),
                format!("{k}.upstream"),
                "the authentication service is reached over HTTP/1.1 in cleartext: host:port or http://host:port",
            ));
        }
        let path = match &raw.path {
            None => "/".to_owned(),
            Some(p)
                if p.get_ref().starts_with('/')
                    && http::uri::PathAndQuery::try_from(p.get_ref().as_str()).is_ok() =>
            {
                p.get_ref().clone()
            }
            Some(p) => {
                return Err(self.err(
                    Some(p.span()),
                    format!("{k}.path"),
                    "a path (and query) that starts with `/`",
                ))
            }
        };
        let mut copy_headers = Vec::new();
        for (j, h) in raw.copy_headers.iter().flatten().enumerate() {
            let name = http::HeaderName::try_from(h.get_ref().as_str()).map_err(|_| {
                self.err(
                    Some(h.span()),
                    format!("{k}.copy_headers[{j}]"),
                    "not a header field name",
                )
            })?;
            copy_headers.push(name);
        }
        let timeout = match &raw.timeout {
            None => DEFAULT_FORWARD_AUTH_TIMEOUT,
            Some(t) if t.get_ref().0.is_zero() || t.get_ref().0 > Duration::from_secs(60) => {
                return Err(self.err(
                    Some(t.span()),
                    format!("{k}.timeout"),
                    "more than 0, at most 60s",
                ))
            }
            Some(t) => t.get_ref().0,
        };
        let max_response_size = match &raw.max_response_size {
            None => DEFAULT_FORWARD_AUTH_RESPONSE,
            Some(s) if s.get_ref().0 > MAX_FORWARD_AUTH_RESPONSE => {
                return Err(self.err(
                    Some(s.span()),
                    format!("{k}.max_response_size"),
                    "at most 16MiB",
                ))
            }
            Some(s) => s.get_ref().0,
        };
        // qweb's own bound fires first: the proxy's are a little longer
        let slack = timeout + Duration::from_secs(1);
        // (never taken out after failures: a dead service is a 502 each time)
        let proxy = ProxyConfig::one_upstream(up, slack);
        Ok(ForwardAuth {
            proxy,
            path,
            copy_headers,
            timeout,
            max_response_size,
        })
    }
}
