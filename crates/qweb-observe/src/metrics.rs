//! `/metrics`: one `prometheus-client` registry for the whole server, built at start. Each
//! crate registers its own families into it (engines: `qweb-offload`; compression:
//! `qweb-compress`); this module adds the worker, route, reload and build families. The text
//! is OpenMetrics (`application/openmetrics-text`), which Prometheus scrapes natively: each
//! family once, label values escaped by the encoder, `# EOF` at the end.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use qweb_offload::EngineSet;
use qweb_tls::handshake::HandshakeGauges;

/// The content type of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Upper bounds (seconds) of the request latency buckets.
const REQUEST_BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The `route` label of requests no route matched (refused before routing, or no prefix
/// covers the path).
pub const NO_ROUTE: &str = "-";

/// Counters of one worker, written by the worker, read by the admin endpoint.
#[derive(Debug, Default)]
pub struct WorkerMetrics {
    /// TLS (and QUIC) handshakes completed.
    pub handshakes_ok: AtomicU64,
    /// TLS (and QUIC) handshakes that failed or timed out.
    pub handshakes_failed: AtomicU64,
    /// Handshake jobs paused on an offloaded op right now.
    pub handshake: HandshakeGauges,
    /// Connections open (TCP from their accept, QUIC from their handshake's end).
    pub connections: AtomicI64,
    /// Connections serving HTTP/1.1 (the others are in their TLS handshake, or HTTP/2).
    pub http1: AtomicI64,
    /// Connections serving HTTP/2.
    pub h2: AtomicI64,
    /// QUIC connections serving HTTP/3 (handshake done; also counted in `connections`).
    pub h3: AtomicI64,
    /// QUIC handshakes in progress (accepted, not yet done or failed).
    pub quic_handshaking: AtomicI64,
    /// New QUIC connections answered with a Retry (address validation).
    pub quic_retries: AtomicU64,
    /// Requests served (every protocol).
    pub requests: AtomicU64,
    /// Connections closed at once because their client address held
    /// `connections_per_client` already (TCP and QUIC).
    pub refused_per_client: AtomicU64,
    /// Connections from a trusted balancer closed for a missing, malformed, oversized or late
    /// PROXY header.
    pub proxy_protocol_refused: AtomicU64,
}

/// The HTTP protocol a connection serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpProtocol {
    /// HTTP/1.x.
    Http1,
    /// HTTP/2.
    H2,
    /// Over QUIC: the connection is counted in `connections` here too (a TCP connection is
    /// counted there from its accept).
    H3,
}

/// One connection serving HTTP in a protocol (its counts are up while this lives).
pub struct ProtocolOpen<'a>(&'a AtomicI64, Option<&'a AtomicI64>);

impl<'a> ProtocolOpen<'a> {
    /// Counts a connection of `w` serving `protocol`.
    pub fn new(w: &'a WorkerMetrics, protocol: HttpProtocol) -> Self {
        let (count, also) = match protocol {
            HttpProtocol::Http1 => (&w.http1, None),
            HttpProtocol::H2 => (&w.h2, None),
            HttpProtocol::H3 => (&w.h3, Some(&w.connections)),
        };
        for c in std::iter::once(count).chain(also) {
            c.fetch_add(1, Relaxed);
        }
        ProtocolOpen(count, also)
    }
}

impl Drop for ProtocolOpen<'_> {
    fn drop(&mut self) {
        for c in std::iter::once(self.0).chain(self.1) {
            c.fetch_sub(1, Relaxed);
        }
    }
}

type RouteLabels = [(&'static str, String); 1];
type RouteClassLabels = [(&'static str, String); 2];
type ResultLabels = [(&'static str, &'static str); 1];

/// What `/metrics` reports, and the handles the server writes through.
pub struct Metrics {
    registry: Registry,
    /// The engines reported (replaced on reload).
    pub engines: EngineSet,
    /// Response compression counters (one set for the server's life, across reloads).
    pub compression: Arc<qweb_compress::CompressMetrics>,
    requests: Family<RouteClassLabels, Counter>,
    durations: Family<RouteLabels, Histogram>,
    reloads: Family<ResultLabels, Counter>,
    config: Arc<ConfigInfo>,
    /// Proxy upstream health (replaced on reload).
    pub upstreams: Arc<UpstreamsCollector>,
    rate_limited: Family<RouteResultLabels, Counter>,
    rate_keys: Family<RouteLabels, Gauge>,
    basic_auth: Family<RouteResultLabels, Counter>,
}

type RouteResultLabels = [(&'static str, String); 2];

/// A route's `rate_limit` counters (shared by the workers: one family entry per route).
#[derive(Clone, Debug, Default)]
pub struct RateLimitMetrics {
    /// Requests within the rate.
    pub allowed: Counter,
    /// Requests over it (refused, or only logged under `dry_run`).
    pub limited: Counter,
    /// Keys the route's limiter holds now.
    pub keys: Gauge,
}

/// A route's `basic_auth` counters (its own block's or its site's), shared by the workers.
#[derive(Clone, Debug, Default)]
pub struct BasicAuthMetrics {
    /// Credentials verified now (on the password engine).
    pub passed: Counter,
    /// Credentials verified lately (from the cache, no verification).
    pub cached: Counter,
    /// 401: missing, malformed or wrong credentials.
    pub refused: Counter,
    /// 503: `max_pending` verifications waiting, or the engine's queue full.
    pub busy: Counter,
}

/// A route's counters, resolved once when a worker builds its routes: a request only bumps
/// atomics (no label lookup on the request path).
#[derive(Clone)]
pub struct RouteMetrics {
    /// Requests by status class, `1xx` to `5xx`.
    by_class: [Counter; 5],
    duration: Histogram,
}

impl RouteMetrics {
    /// Handles counted in no registry: for a driver's tests over in-memory I/O, whose
    /// requests belong to no route of a running server.
    pub fn unregistered() -> Self {
        RouteMetrics {
            by_class: Default::default(),
            duration: Histogram::new(REQUEST_BUCKETS),
        }
    }

    /// A request on this route ended with `status` after `elapsed` (to the last body byte).
    pub fn observe(&self, status: u16, elapsed: Duration) {
        let class = usize::from(status / 100).clamp(1, 5) - 1;
        self.by_class[class].inc();
        self.duration.observe(elapsed.as_secs_f64());
    }
}

/// The loaded configuration's hash, replaced on reload.
#[derive(Debug, Default)]
struct ConfigInfo(Mutex<String>);

impl Collector for ConfigInfo {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let hash = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut family = encoder.encode_descriptor(
            "qweb_config",
            "The configuration in use: hash of its file (of the built-in default without one).",
            None,
            MetricType::Info,
        )?;
        family.encode_info(&[("hash", hash)])
    }
}

/// Writes one sample of a family read at scrape time: a counter (never below 0) or a gauge.
fn encode_value(
    sample: prometheus_client::encoding::MetricEncoder<'_>,
    kind: MetricType,
    value: i64,
) -> std::fmt::Result {
    if matches!(kind, MetricType::Counter) {
        ConstCounter::new(value.max(0) as u64).encode(sample)
    } else {
        ConstGauge::new(value).encode(sample)
    }
}

/// Reads the workers' counters at each scrape.
struct WorkersCollector(Vec<Arc<WorkerMetrics>>);

impl std::fmt::Debug for WorkersCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WorkersCollector({} workers)", self.0.len())
    }
}

impl Collector for WorkersCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        type Get = fn(&WorkerMetrics) -> i64;
        let families: [(&str, MetricType, &str, Get); 9] = [
            (
                "qweb_tls_handshakes",
                MetricType::Counter,
                "TLS handshakes completed.",
                |w| w.handshakes_ok.load(Relaxed) as i64,
            ),
            (
                "qweb_tls_handshakes_failed",
                MetricType::Counter,
                "TLS handshakes that failed or timed out.",
                |w| w.handshakes_failed.load(Relaxed) as i64,
            ),
            (
                "qweb_jobs_paused",
                MetricType::Gauge,
                "Handshake jobs paused on an offloaded op.",
                |w| w.handshake.paused.load(Relaxed),
            ),
            (
                "qweb_quic_handshakes_in_progress",
                MetricType::Gauge,
                "QUIC handshakes accepted and not yet complete.",
                |w| w.quic_handshaking.load(Relaxed),
            ),
            (
                "qweb_quic_retries",
                MetricType::Counter,
                "New QUIC connections answered with a Retry (quic_retry_threshold).",
                |w| w.quic_retries.load(Relaxed) as i64,
            ),
            (
                "qweb_connections_refused_per_client",
                MetricType::Counter,
                "Connections closed at once: their client address held connections_per_client already.",
                |w| w.refused_per_client.load(Relaxed) as i64,
            ),
            (
                "qweb_proxy_protocol_refused",
                MetricType::Counter,
                "Connections from a trusted balancer closed for a missing, malformed, oversized or late PROXY header.",
                |w| w.proxy_protocol_refused.load(Relaxed) as i64,
            ),
            (
                "qweb_connections_open",
                MetricType::Gauge,
                "Open client connections.",
                |w| w.connections.load(Relaxed),
            ),
            (
                "qweb_http_requests",
                MetricType::Counter,
                "HTTP requests handled.",
                |w| w.requests.load(Relaxed) as i64,
            ),
        ];
        for (name, kind, help, get) in families {
            let mut family = encoder.encode_descriptor(name, help, None, kind)?;
            for (i, w) in self.0.iter().enumerate() {
                let labels = [("worker", i.to_string())];
                encode_value(family.encode_family(&labels)?, kind, get(w))?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "qweb_http_connections_open",
            "Connections serving HTTP, by protocol (the rest of qweb_connections_open are in their TLS handshake).",
            None,
            MetricType::Gauge,
        )?;
        for (i, w) in self.0.iter().enumerate() {
            for (protocol, count) in [("http/1.1", &w.http1), ("h2", &w.h2), ("h3", &w.h3)] {
                let labels = [("worker", i.to_string()), ("protocol", protocol.to_owned())];
                let sample = family.encode_family(&labels)?;
                encode_value(sample, MetricType::Gauge, count.load(Relaxed))?;
            }
        }
        Ok(())
    }
}

/// One proxy route's upstreams for `/metrics`: its label, the upstreams' names, the gauges
/// its workers share.
pub type UpstreamRoute = (String, Vec<String>, Arc<qweb_config::UpstreamGauges>);

/// Reads the proxy routes' upstream health at each scrape; the routes are replaced on reload.
#[derive(Debug, Default)]
pub struct UpstreamsCollector {
    routes: Mutex<Vec<UpstreamRoute>>,
    workers: usize,
}

impl UpstreamsCollector {
    /// The routes of the configuration now in use.
    pub fn set(&self, routes: Vec<UpstreamRoute>) {
        *self.routes.lock().unwrap_or_else(PoisonError::into_inner) = routes;
    }
}

impl Collector for UpstreamsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
        if routes.is_empty() {
            return Ok(());
        }
        type Get = fn(&qweb_config::UpstreamGauges, usize) -> i64;
        let down_help = format!("Workers (of {}) that skip the upstream now.", self.workers);
        let families: [(&str, MetricType, &str, Get); 4] = [
            (
                "qweb_upstream_up",
                MetricType::Gauge,
                "Proxy upstream up on every worker (health checks, passive failures).",
                |g, i| i64::from(g.down_workers.get(i).map_or(0, |d| d.load(Relaxed)) <= 0),
            ),
            (
                "qweb_upstream_down_workers",
                MetricType::Gauge,
                &down_help,
                |g, i| g.down_workers.get(i).map_or(0, |d| d.load(Relaxed)),
            ),
            (
                "qweb_upstream_failures",
                MetricType::Counter,
                "Upstream connect failures and failed health checks.",
                |g, i| g.failures.get(i).map_or(0, |d| d.load(Relaxed)) as i64,
            ),
            (
                "qweb_upstream_in_flight",
                MetricType::Gauge,
                "Requests in flight to the upstream, all workers.",
                |g, i| g.in_flight.get(i).map_or(0, |d| d.load(Relaxed)),
            ),
        ];
        for (name, kind, help, get) in families {
            let mut family = encoder.encode_descriptor(name, help, None, kind)?;
            for (route, names, g) in routes.iter() {
                for (i, n) in names.iter().enumerate() {
                    let labels = [("route", route.clone()), ("upstream", n.clone())];
                    encode_value(family.encode_family(&labels)?, kind, get(g, i))?;
                }
            }
        }
        Ok(())
    }
}

impl Metrics {
    /// The registry for `workers`, the engines of `engines` and the compression counters;
    /// `config_hash` names the configuration loaded at start. `collectors` are registered by
    /// the layers above (TLS sessions, the open-file cache): this module imports none of them.
    pub fn new(
        workers: Vec<Arc<WorkerMetrics>>,
        engines: EngineSet,
        compression: Arc<qweb_compress::CompressMetrics>,
        config_hash: String,
        collectors: Vec<Box<dyn Collector>>,
    ) -> Metrics {
        let mut registry = Registry::default();
        registry.register(
            "qweb_build",
            "The running qweb's version.",
            Info::new([("version", env!("CARGO_PKG_VERSION"))]),
        );
        let started = Gauge::<f64, AtomicU64>::default();
        started.set(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
        );
        registry.register(
            "qweb_start_time_seconds",
            "When this qweb started, in seconds since the Unix epoch (uptime: now minus this).",
            started,
        );
        let config = Arc::new(ConfigInfo(Mutex::new(config_hash)));
        registry.register_collector(Box::new(config.clone()));
        let reloads = Family::<ResultLabels, Counter>::default();
        for result in ["ok", "failed"] {
            let _ = reloads.get_or_create_owned(&[("result", result)]);
        }
        registry.register(
            "qweb_config_reloads",
            "Configuration reloads (SIGHUP, `qweb reload`) by result; a failed one left the running configuration in place.",
            reloads.clone(),
        );
        let upstreams = Arc::new(UpstreamsCollector {
            routes: Mutex::default(),
            workers: workers.len(),
        });
        registry.register_collector(Box::new(upstreams.clone()));
        registry.register_collector(Box::new(WorkersCollector(workers)));
        let requests = Family::<RouteClassLabels, Counter>::default();
        registry.register(
            "qweb_http_route_requests",
            "HTTP requests by route (prefix; `-`: none matched) and status class.",
            requests.clone(),
        );
        let durations = Family::<RouteLabels, Histogram>::new_with_constructor(
            (|| Histogram::new(REQUEST_BUCKETS)) as fn() -> Histogram,
        );
        registry.register(
            "qweb_http_request_duration_seconds",
            "Time from the request head to the last body byte handed to the connection, by route.",
            durations.clone(),
        );
        let rate_limited = Family::<RouteResultLabels, Counter>::default();
        registry.register(
            "qweb_rate_limit_requests",
            "Requests counted by a route's rate_limit, by result (allowed; limited: refused with 429, or only logged under dry_run).",
            rate_limited.clone(),
        );
        let rate_keys = Family::<RouteLabels, Gauge>::default();
        registry.register(
            "qweb_rate_limit_keys",
            "Keys a route's rate_limit holds (at most its max_keys).",
            rate_keys.clone(),
        );
        let basic_auth = Family::<RouteResultLabels, Counter>::default();
        registry.register(
            "qweb_basic_auth_requests",
            "Requests checked by a route's basic_auth, by result (passed: verified; cached: verified lately; refused: 401; busy: 503 past max_pending).",
            basic_auth.clone(),
        );
        engines.register(&mut registry);
        compression.register(&mut registry);
        registry.register_collector(Box::new(crate::process_counters::ProcessCounters));
        for c in collectors {
            registry.register_collector(c);
        }
        Metrics {
            registry,
            engines,
            compression,
            requests,
            durations,
            reloads,
            config,
            upstreams,
            rate_limited,
            rate_keys,
            basic_auth,
        }
    }

    /// The `basic_auth` handles of route `prefix` (created with zero counts when new).
    pub fn basic_auth(&self, prefix: &str) -> BasicAuthMetrics {
        let result = |r: &str| {
            self.basic_auth
                .get_or_create_owned(&[("route", prefix.to_owned()), ("result", r.to_owned())])
        };
        BasicAuthMetrics {
            passed: result("passed"),
            cached: result("cached"),
            refused: result("refused"),
            busy: result("busy"),
        }
    }

    /// The `rate_limit` handles of route `prefix` (created with zero counts when new).
    pub fn rate_limit(&self, prefix: &str) -> RateLimitMetrics {
        let result = |r: &str| {
            self.rate_limited
                .get_or_create_owned(&[("route", prefix.to_owned()), ("result", r.to_owned())])
        };
        RateLimitMetrics {
            allowed: result("allowed"),
            limited: result("limited"),
            keys: self
                .rate_keys
                .get_or_create_owned(&[("route", prefix.to_owned())]),
        }
    }

    /// The handles of route `prefix` (created with zero counts when new).
    pub fn route(&self, prefix: &str) -> RouteMetrics {
        let class = |c: &str| {
            self.requests
                .get_or_create_owned(&[("route", prefix.to_owned()), ("class", c.to_owned())])
        };
        RouteMetrics {
            by_class: [
                class("1xx"),
                class("2xx"),
                class("3xx"),
                class("4xx"),
                class("5xx"),
            ],
            duration: self
                .durations
                .get_or_create_owned(&[("route", prefix.to_owned())]),
        }
    }

    /// A reload ended: `ok` with the new configuration's hash, or failed.
    pub fn reloaded(&self, new_hash: Option<String>) {
        let result = if new_hash.is_some() { "ok" } else { "failed" };
        self.reloads.get_or_create(&[("result", result)]).inc();
        if let Some(h) = new_hash {
            *self.config.0.lock().unwrap_or_else(PoisonError::into_inner) = h;
        }
    }

    /// The OpenMetrics text of everything registered.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            // writing to a String cannot fail; a collector error leaves a partial text
            tracing::error!("metrics: {e}");
        }
        out
    }
}

/// A short, stable hash of a configuration file's bytes (FNV-1a, 64 bits, hex): changes when
/// the file does, so dashboards can tell which configuration each instance runs.
pub fn config_hash(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_labels_are_escaped_and_each_family_is_written_once() {
        let m = Metrics::new(
            (0..2).map(|_| Arc::new(WorkerMetrics::default())).collect(),
            EngineSet::default(),
            Default::default(),
            config_hash(b"x"),
            Vec::new(),
        );
        let r = m.route("/a\"b\\c\nd");
        r.observe(204, Duration::from_millis(3));
        m.route("/").observe(503, Duration::from_secs(20));
        m.reloaded(None);
        m.reloaded(Some("abc".into()));
        let text = m.render();
        assert!(
            text.contains(
                "qweb_http_route_requests_total{route=\"/a\\\"b\\\\c\\nd\",class=\"2xx\"} 1"
            ),
            "{text}"
        );
        assert!(text.contains("qweb_http_route_requests_total{route=\"/\",class=\"5xx\"} 1"));
        assert!(
            text.contains("qweb_http_request_duration_seconds_bucket{le=\"+Inf\",route=\"/\"} 1")
                || text.contains(
                    "qweb_http_request_duration_seconds_bucket{route=\"/\",le=\"+Inf\"} 1"
                ),
            "{text}"
        );
        assert!(text.contains("qweb_config_reloads_total{result=\"failed\"} 1"));
        assert!(text.contains("qweb_config_info{hash=\"abc\"} 1"), "{text}");
        assert!(text.contains("qweb_http_requests_total{worker=\"1\"} 0"));
        for l in text.lines().filter(|l| l.starts_with("# TYPE ")) {
            assert_eq!(text.matches(&format!("{l}\n")).count(), 1, "{l} twice");
        }
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn config_hash_follows_the_bytes() {
        assert_eq!(config_hash(b"a"), config_hash(b"a"));
        assert_ne!(config_hash(b"a"), config_hash(b"b"));
        assert_eq!(config_hash(b"").len(), 16);
    }
}
