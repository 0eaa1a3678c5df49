//! A proxy route (`[[route]]` with `upstreams`): its settings and their validation.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use toml::Spanned;

use super::raw::RawRoute;
use super::{ConfigError, Validator};

/// Smallest upstream response head limit: hyper's HTTP/1 client cannot buffer less.
const MIN_RESPONSE_HEADER_SIZE: u64 = 8 * 1024;

/// Largest body `buffer_request_body` may hold in memory.
const MAX_BUFFERED_BODY: u64 = 1 << 30;

/// Reverse proxy to upstream servers.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// Upstream servers, used round-robin.
    pub upstreams: Vec<Upstream>,
    /// Time to connect to an upstream.
    pub connect_timeout: Duration,
    /// Time to wait for the upstream's response head once the request body was sent, for the
    /// upstream to take more of the request body, and between upstream body reads.
    pub timeout: Duration,
    /// Longest pause between two reads of the client's request body (408 beyond).
    pub client_body_timeout: Duration,
    /// Idle keep-alive connections kept per upstream per worker.
    pub keepalive: usize,
    /// Forward the client's path bytes as sent instead of the normalised path.
    pub pass_raw_path: bool,
    /// Forward request headers whose names contain `_` (dropped by default, as nginx does:
    /// `X_Forwarded_For` must not pass next to `X-Forwarded-For`).
    pub underscores_in_headers: bool,
    /// Clients whose `X-Forwarded-Host`, `X-Forwarded-Proto`, `Forwarded` and `X-Real-IP` are
    /// passed on; from everyone else they are replaced.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Largest upstream response head; larger is a 502.
    pub max_response_header_size: usize,
    /// HTTP/1.1 `Upgrade` tokens passed through to the upstream (lowercase; default
    /// `["websocket"]`); other upgrades are stripped.
    pub upgrade: Vec<String>,
    /// An upgraded connection with no bytes moving either way for this long is closed.
    pub upgrade_idle_timeout: Duration,
    /// Largest request body (413 beyond); `None`: no limit.
    pub max_body_size: Option<u64>,
    /// Read the whole request body before sending it, with a `Content-Length`.
    pub buffer_request_body: bool,
    /// TLS to the `https://` upstreams (roots, client certificate), when there are any.
    pub upstream_tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    /// The name `https://` upstreams are verified against (and sent as SNI) instead of the
    /// URL's host (`upstream_server_name`).
    pub upstream_server_name: Option<String>,
    /// How an upstream is chosen (`balance`, `hash_key`).
    pub balance: Balance,
    /// Each upstream's weight (`weights`, default 1 each).
    pub weights: Vec<u32>,
    /// Connect failures in a row that take an upstream out (0: never).
    pub max_fails: u32,
    /// How long an upstream that failed `max_fails` times is skipped.
    pub fail_timeout: Duration,
    /// Active health checks (`health_check`).
    pub health_check: Option<HealthCheck>,
    /// Upstream health as all workers see it (not a key: filled for `/metrics`).
    pub gauges: std::sync::Arc<UpstreamGauges>,
    /// A PROXY header written first on every new upstream connection
    /// (`upstream_proxy_protocol`); `None`: none.
    pub upstream_proxy_protocol: Option<UpstreamProxyProtocol>,
}

/// `keepalive` when the route does not say: idle connections kept per upstream per worker.
pub const DEFAULT_KEEPALIVE: usize = 32;

/// `max_response_header_size` when the route does not say.
pub const DEFAULT_MAX_RESPONSE_HEADER_SIZE: usize = 32 * 1024;

/// `fail_timeout` when the route does not say.
pub const DEFAULT_FAIL_TIMEOUT: Duration = Duration::from_secs(10);

impl ProxyConfig {
    /// One plain upstream with the route defaults, every timeout `timeout`, no upgrades, and
    /// never taken out after failures (each request asks again): how qweb reaches a service
    /// of its own, such as a route's `forward_auth`.
    pub fn one_upstream(up: Upstream, timeout: Duration) -> ProxyConfig {
        ProxyConfig {
            gauges: UpstreamGauges::new(1),
            upstreams: vec![up],
            connect_timeout: timeout,
            timeout,
            client_body_timeout: timeout,
            keepalive: DEFAULT_KEEPALIVE,
            pass_raw_path: false,
            underscores_in_headers: false,
            trusted_proxies: Vec::new(),
            max_response_header_size: DEFAULT_MAX_RESPONSE_HEADER_SIZE,
            upgrade: Vec::new(),
            upgrade_idle_timeout: timeout,
            max_body_size: None,
            buffer_request_body: false,
            upstream_tls: None,
            upstream_server_name: None,
            balance: Balance::RoundRobin,
            weights: vec![1],
            max_fails: 0,
            fail_timeout: DEFAULT_FAIL_TIMEOUT,
            health_check: None,
            upstream_proxy_protocol: None,
        }
    }
}

/// The PROXY protocol version qweb writes to upstreams (`upstream_proxy_protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamProxyProtocol {
    /// HAProxy's text line (`"v1"`).
    V1,
    /// HAProxy's binary block (`"v2"`).
    V2,
}

/// One upstream server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// As written (`host:port`), used in logs.
    pub name: String,
    /// Resolved when the configuration is loaded.
    pub addr: SocketAddr,
    /// `https://`: TLS to the upstream.
    pub tls: bool,
    /// The URL's host (the TLS server name unless `upstream_server_name` says otherwise).
    pub host: String,
    /// Spoken to in HTTP/2: `h2c://` (prior knowledge), or `https://` with
    /// `upstream_http2 = true` (ALPN h2).
    pub h2: bool,
}

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
        let mut upstreams: Vec<Upstream> = Vec::new();
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
            None => DEFAULT_MAX_RESPONSE_HEADER_SIZE,
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
        if let Some(h2) = &rr.upstream_http2 {
            if !upstreams.iter().any(|u| u.tls) {
                return Err(self.err(
                    Some(h2.span()),
                    format!("route[{i}].upstream_http2"),
                    "`upstream_http2` is for https:// upstreams (use h2c://host:port for cleartext HTTP/2)",
                ));
            }
            for u in upstreams.iter_mut().filter(|u| u.tls) {
                u.h2 = *h2.get_ref();
            }
        }
        let upstream_tls = self.upstream_tls(i, rr, upstreams.iter().any(|u| u.tls))?;
        let (balance, weights, health_check) = self.balancing(i, rr, upstreams.len())?;
        Ok(ProxyConfig {
            gauges: UpstreamGauges::new(upstreams.len()),
            balance,
            weights,
            max_fails: rr.max_fails.unwrap_or(1),
            fail_timeout: rr
                .fail_timeout
                .as_ref()
                .map_or(DEFAULT_FAIL_TIMEOUT, |d| d.get_ref().0),
            health_check,
            upstream_tls,
            upstream_server_name: rr
                .upstream_server_name
                .as_ref()
                .map(|s| s.get_ref().clone()),
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
            keepalive: rr.keepalive.unwrap_or(DEFAULT_KEEPALIVE),
            pass_raw_path,
            underscores_in_headers: rr.underscores_in_headers.unwrap_or(false),
            trusted_proxies,
            max_response_header_size,
            upstream_proxy_protocol: self.upstream_proxy_protocol(i, rr)?,
        })
    }

    /// `upstream_proxy_protocol` of route `i`: `"v1"` or `"v2"`, on HTTP/1.1 upstreams only
    /// (an HTTP/2 upstream connection carries the requests of many clients).
    fn upstream_proxy_protocol(
        &self,
        i: usize,
        rr: &RawRoute,
    ) -> Result<Option<UpstreamProxyProtocol>, ConfigError> {
        let Some(v) = &rr.upstream_proxy_protocol else {
            return Ok(None);
        };
        let key = format!("route[{i}].upstream_proxy_protocol");
        let version = match v.get_ref().as_str() {
            "v1" => UpstreamProxyProtocol::V1,
            "v2" => UpstreamProxyProtocol::V2,
            other => {
                return Err(self.err(
                    Some(v.span()),
                    key,
                    format!("`{other}`: use \"v1\" or \"v2\""),
                ))
            }
        };
        let h2 = rr.upstream_http2.as_ref().is_some_and(|h| *h.get_ref())
            || rr.upstreams.as_ref().is_some_and(|u| {
                u.get_ref()
                    .iter()
                    .any(|s| s.get_ref().trim_start().starts_with("h2c://"))
            });
        if h2 {
            return Err(self.err(
                Some(v.span()),
                key,
                "needs HTTP/1.1 upstreams: one HTTP/2 upstream connection carries many clients' requests (remove upstream_http2 / h2c://)",
            ));
        }
        Ok(Some(version))
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
            ("upstream_ca", rr.upstream_ca.is_some()),
            ("upstream_server_name", rr.upstream_server_name.is_some()),
            (
                "upstream_proxy_protocol",
                rr.upstream_proxy_protocol.is_some(),
            ),
            ("upstream_client_cert", rr.upstream_client_cert.is_some()),
            ("upstream_client_key", rr.upstream_client_key.is_some()),
            ("balance", rr.balance.is_some()),
            ("hash_key", rr.hash_key.is_some()),
            ("weights", rr.weights.is_some()),
            ("max_fails", rr.max_fails.is_some()),
            ("fail_timeout", rr.fail_timeout.is_some()),
            ("health_check", rr.health_check.is_some()),
            ("upstream_http2", rr.upstream_http2.is_some()),
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

/// Health of a route's upstreams as the workers see it, shared by all of them (for
/// `/metrics` and `/status.json`): how many workers have each upstream down, and the
/// requests in flight to each.
#[derive(Debug, Default)]
pub struct UpstreamGauges {
    /// Per upstream (config order): workers that skip it now.
    pub down_workers: Vec<std::sync::atomic::AtomicI64>,
    /// Per upstream: connect failures and failed health checks, all workers.
    pub failures: Vec<std::sync::atomic::AtomicU64>,
    /// Per upstream: requests in flight to it, all workers (from the first try until the
    /// response body ends).
    pub in_flight: Vec<std::sync::atomic::AtomicI64>,
}

impl UpstreamGauges {
    pub(super) fn new(n: usize) -> Arc<Self> {
        Arc::new(UpstreamGauges {
            down_workers: (0..n).map(|_| Default::default()).collect(),
            failures: (0..n).map(|_| Default::default()).collect(),
            in_flight: (0..n).map(|_| Default::default()).collect(),
        })
    }
}

/// How a proxy route chooses an upstream (`balance`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Balance {
    /// In turn, by weight (smooth weighted round-robin).
    RoundRobin,
    /// The fewest requests in flight on this worker, relative to weight.
    LeastConn,
    /// By a key of the request, consistently (rendezvous hashing: adding an upstream moves
    /// only the keys it wins).
    Hash(HashKey),
}

/// What `balance = "hash"` hashes (`hash_key`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashKey {
    /// The client's address (`"client_ip"`, the default).
    ClientIp,
    /// A request header's value (`"header:X-User"`).
    Header(http::HeaderName),
    /// A cookie's value (`"cookie:session"`).
    Cookie(String),
}

/// Active health checks (`health_check = { path, interval, expect, timeout }`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    /// Path (and query) requested with GET.
    pub path: String,
    /// Time between two checks of an upstream.
    pub interval: Duration,
    /// The status a healthy upstream answers.
    pub expect: u16,
    /// Time a check may take (default: the interval).
    pub timeout: Duration,
}

impl Validator<'_> {
    /// A request key as written (`"client_ip"`, `"header:NAME"`, `"cookie:NAME"`): a proxy
    /// route's `hash_key`, a `rate_limit`'s `key`. `key`: the config key, for errors.
    pub(super) fn hash_key(
        &self,
        key: String,
        k: &Spanned<String>,
    ) -> Result<HashKey, ConfigError> {
        let v = k.get_ref().trim();
        if v == "client_ip" {
            Ok(HashKey::ClientIp)
        } else if let Some(h) = v.strip_prefix("header:") {
            http::HeaderName::from_bytes(h.trim().as_bytes())
                .map(HashKey::Header)
                .map_err(|_| self.err(Some(k.span()), key, format!("`{h}` is not a header name")))
        } else if let Some(c) = v.strip_prefix("cookie:").filter(|c| !c.trim().is_empty()) {
            Ok(HashKey::Cookie(c.trim().to_owned()))
        } else {
            Err(self.err(
                Some(k.span()),
                key,
                "use \"client_ip\", \"header:NAME\" or \"cookie:NAME\"",
            ))
        }
    }

    /// `balance`, `hash_key`, `weights` (one per upstream), `health_check`.
    fn balancing(
        &self,
        i: usize,
        rr: &RawRoute,
        n: usize,
    ) -> Result<(Balance, Vec<u32>, Option<HealthCheck>), ConfigError> {
        let hash_key = match &rr.hash_key {
            None => HashKey::ClientIp,
            Some(k) => self.hash_key(format!("route[{i}].hash_key"), k)?,
        };
        let balance = match rr.balance.as_ref().map(|b| (b, b.get_ref().as_str())) {
            None | Some((_, "round_robin")) => Balance::RoundRobin,
            Some((_, "least_conn")) => Balance::LeastConn,
            Some((_, "hash")) => Balance::Hash(hash_key),
            Some((b, other)) => {
                return Err(self.err(
                    Some(b.span()),
                    format!("route[{i}].balance"),
                    format!("`{other}`: use \"round_robin\", \"least_conn\" or \"hash\""),
                ))
            }
        };
        if rr.hash_key.is_some() && !matches!(balance, Balance::Hash(_)) {
            return Err(self.err(
                rr.hash_key.as_ref().map(|k| k.span()),
                format!("route[{i}].hash_key"),
                "`hash_key` is for `balance = \"hash\"`",
            ));
        }
        let weights = match &rr.weights {
            None => vec![1; n],
            Some(w) => {
                if w.get_ref().len() != n {
                    return Err(self.err(
                        Some(w.span()),
                        format!("route[{i}].weights"),
                        format!(
                            "one weight per upstream: {n} upstreams, {} weights",
                            w.get_ref().len()
                        ),
                    ));
                }
                let mut out = Vec::new();
                for (j, x) in w.get_ref().iter().enumerate() {
                    if *x.get_ref() == 0 || *x.get_ref() > 1000 {
                        return Err(self.err(
                            Some(x.span()),
                            format!("route[{i}].weights[{j}]"),
                            "a weight is from 1 to 1000",
                        ));
                    }
                    out.push(*x.get_ref());
                }
                out
            }
        };
        let health_check = match &rr.health_check {
            None => None,
            Some(h) => {
                let key = format!("route[{i}].health_check");
                let raw = h.get_ref();
                let path = raw.path.get_ref();
                if !path.starts_with('/')
                    || http::uri::PathAndQuery::try_from(path.as_str()).is_err()
                {
                    return Err(self.err(
                        Some(raw.path.span()),
                        format!("{key}.path"),
                        format!("`{path}` is not a path (e.g. \"/healthz\")"),
                    ));
                }
                let interval = raw
                    .interval
                    .as_ref()
                    .map_or(Duration::from_secs(5), |d| d.get_ref().0);
                if interval < Duration::from_millis(10) {
                    return Err(self.err(
                        raw.interval.as_ref().map(|d| d.span()),
                        format!("{key}.interval"),
                        "at least 10ms",
                    ));
                }
                let expect = raw.expect.as_ref().map_or(200, |e| *e.get_ref());
                if !(100..=599).contains(&expect) {
                    return Err(self.err(
                        raw.expect.as_ref().map(|e| e.span()),
                        format!("{key}.expect"),
                        "an HTTP status (100 to 599)",
                    ));
                }
                let timeout = raw.timeout.as_ref().map_or(interval, |d| d.get_ref().0);
                if timeout.is_zero() {
                    return Err(self.err(
                        raw.timeout.as_ref().map(|d| d.span()),
                        format!("{key}.timeout"),
                        "must be more than 0",
                    ));
                }
                Some(HealthCheck {
                    path: path.clone(),
                    interval,
                    expect,
                    timeout,
                })
            }
        };
        Ok((balance, weights, health_check))
    }

    /// The TLS client configuration for a route's `https://` upstreams: `upstream_ca` (PEM)
    /// or the system's roots, the client certificate of `upstream_client_cert` and
    /// `upstream_client_key` (mTLS), `upstream_server_name` checked. `None` without `https://`
    /// upstreams (the keys are then refused).
    fn upstream_tls(
        &self,
        i: usize,
        rr: &RawRoute,
        any_tls: bool,
    ) -> Result<Option<Arc<rustls::ClientConfig>>, ConfigError> {
        if !any_tls {
            let set = [
                ("upstream_ca", rr.upstream_ca.as_ref().map(|s| s.span())),
                (
                    "upstream_server_name",
                    rr.upstream_server_name.as_ref().map(|s| s.span()),
                ),
                (
                    "upstream_client_cert",
                    rr.upstream_client_cert.as_ref().map(|s| s.span()),
                ),
                (
                    "upstream_client_key",
                    rr.upstream_client_key.as_ref().map(|s| s.span()),
                ),
            ];
            if let Some((key, span)) = set.into_iter().find(|(_, s)| s.is_some()) {
                return Err(self.err(
                    span,
                    format!("route[{i}].{key}"),
                    format!("`{key}` is for https:// upstreams; this route has none"),
                ));
            }
            return Ok(None);
        }
        if let Some(n) = &rr.upstream_server_name {
            if rustls::pki_types::ServerName::try_from(n.get_ref().as_str()).is_err() {
                return Err(self.err(
                    Some(n.span()),
                    format!("route[{i}].upstream_server_name"),
                    format!("`{}` is not a DNS name or IP address", n.get_ref()),
                ));
            }
        }
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(qweb_tls::provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| self.err(None, format!("route[{i}].upstreams"), e.to_string()))?;
        let builder = match &rr.upstream_ca {
            // the anchors may include the upstream's own self-signed certificate, pinned
            Some(ca) => {
                let key = format!("route[{i}].upstream_ca");
                let path = self.path(ca.get_ref(), ca.span());
                let certs = qweb_tls::load_certs(&path)
                    .map_err(|e| self.err(Some(ca.span()), key.clone(), e.to_string()))?;
                let verifier = qweb_tls::PinnedAnchors::new(certs).map_err(|e| {
                    self.err(
                        Some(ca.span()),
                        key.clone(),
                        format!("{}: not a usable CA certificate: {e}", path.display()),
                    )
                })?;
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(verifier)
            }
            None => {
                let mut roots = rustls::RootCertStore::empty();
                let found = rustls_native_certs::load_native_certs();
                let (added, _) = roots.add_parsable_certificates(found.certs);
                if added == 0 {
                    return Err(self.err(
                        None,
                        format!("route[{i}].upstream_ca"),
                        "no system CA certificates found for the https:// upstreams: set `upstream_ca`",
                    ));
                }
                builder.with_root_certificates(roots)
            }
        };
        let mut cfg = match (&rr.upstream_client_cert, &rr.upstream_client_key) {
            (None, None) => builder.with_no_client_auth(),
            (Some(c), Some(k)) => {
                let certs =
                    qweb_tls::load_certs(&self.path(c.get_ref(), c.span())).map_err(|e| {
                        self.err(
                            Some(c.span()),
                            format!("route[{i}].upstream_client_cert"),
                            e.to_string(),
                        )
                    })?;
                let key =
                    qweb_tls::load_private_key(&self.path(k.get_ref(), k.span())).map_err(|e| {
                        self.err(
                            Some(k.span()),
                            format!("route[{i}].upstream_client_key"),
                            e.to_string(),
                        )
                    })?;
                builder.with_client_auth_cert(certs, key).map_err(|e| {
                    self.err(
                        Some(k.span()),
                        format!("route[{i}].upstream_client_key"),
                        format!("does not match upstream_client_cert: {e}"),
                    )
                })?
            }
            (Some(c), None) => {
                return Err(self.err(
                    Some(c.span()),
                    format!("route[{i}].upstream_client_key"),
                    "`upstream_client_cert` needs `upstream_client_key`",
                ))
            }
            (None, Some(k)) => {
                return Err(self.err(
                    Some(k.span()),
                    format!("route[{i}].upstream_client_cert"),
                    "`upstream_client_key` needs `upstream_client_cert`",
                ))
            }
        };
        cfg.alpn_protocols = if rr.upstream_http2.as_ref().is_some_and(|h| *h.get_ref()) {
            vec![b"h2".to_vec()]
        } else {
            vec![b"http/1.1".to_vec()]
        };
        Ok(Some(Arc::new(cfg)))
    }

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
pub(super) fn parse_cidr(s: &str) -> Result<ipnet::IpNet, String> {
    if let Ok(n) = s.parse::<ipnet::IpNet>() {
        return Ok(n.trunc());
    }
    s.parse::<std::net::IpAddr>()
        .map(ipnet::IpNet::from)
        .map_err(|_| format!("`{s}` is not an address or CIDR block (e.g. 10.0.0.0/8)"))
}

/// `host:port`, `http://host:port` or `https://host:port` (default port 443), resolved now.
pub(super) fn parse_upstream(s: &str) -> Result<Upstream, String> {
    let (tls, h2, rest) = if let Some(rest) = s.strip_prefix("http://") {
        (false, false, rest)
    } else if let Some(rest) = s.strip_prefix("https://") {
        (true, false, rest)
    } else if let Some(rest) = s.strip_prefix("h2c://") {
        (false, true, rest)
    } else if s.contains("://") {
        return Err(format!(
            "`{s}`: an upstream is host:port, http://host:port, https://host:port or h2c://host:port"
        ));
    } else {
        (false, false, s)
    };
    let hostport = rest.trim_end_matches('/');
    if hostport.contains('/') {
        return Err(format!("`{s}`: an upstream is `host:port` without a path"));
    }
    let has_port = hostport.rsplit_once(':').is_some_and(|(h, p)| {
        !p.is_empty()
            && p.bytes().all(|b| b.is_ascii_digit())
            && (!h.starts_with('[') || h.ends_with(']'))
    });
    let hostport = if has_port || !tls {
        hostport.to_owned()
    } else {
        format!("{hostport}:443")
    };
    let mut addrs = hostport
        .to_socket_addrs()
        .map_err(|e| format!("`{s}` is not a reachable host:port: {e}"))?;
    let addr = addrs
        .next()
        .ok_or_else(|| format!("`{s}` resolves to no address"))?;
    let host = hostport
        .rsplit_once(':')
        .map_or(hostport.as_str(), |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    if tls && rustls::pki_types::ServerName::try_from(host.as_str()).is_err() {
        return Err(format!("`{s}`: `{host}` is not a TLS server name"));
    }
    Ok(Upstream {
        name: hostport,
        addr,
        tls,
        host,
        h2,
    })
}

#[cfg(test)]
mod tests;
