//! Server metrics in Prometheus text format: per worker (handshakes, paused jobs,
//! connections, requests) and per offload engine.

use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use qweb_offload::Engine;
use qweb_tls::handshake::HandshakeGauges;

/// Counters of one worker, written by the worker, read by the admin endpoint.
#[derive(Debug, Default)]
pub(crate) struct WorkerMetrics {
    pub handshakes_ok: AtomicU64,
    pub handshakes_failed: AtomicU64,
    /// Handshake jobs paused on an offloaded op right now.
    pub handshake: HandshakeGauges,
    pub connections: AtomicI64,
    pub requests: AtomicU64,
}

/// Everything `/metrics` reports.
pub(crate) struct Registry {
    pub workers: Vec<Arc<WorkerMetrics>>,
    pub engines: Vec<Arc<dyn Engine>>,
    /// Response compression counters, when compression is on.
    pub compression: Option<Arc<qweb_compress::CompressMetrics>>,
    /// TLS session resumption, per TLS listener.
    pub tls_sessions: Vec<Arc<crate::tls_session::ListenerSession>>,
}

impl Registry {
    /// The Prometheus text exposition.
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        type Get = fn(&WorkerMetrics) -> i64;
        let families: [(&str, &str, &str, Get); 5] = [
            (
                "qweb_tls_handshakes_total",
                "counter",
                "TLS handshakes completed.",
                |w| w.handshakes_ok.load(Relaxed) as i64,
            ),
            (
                "qweb_tls_handshakes_failed_total",
                "counter",
                "TLS handshakes that failed or timed out.",
                |w| w.handshakes_failed.load(Relaxed) as i64,
            ),
            (
                "qweb_jobs_paused",
                "gauge",
                "Handshake jobs paused on an offloaded op.",
                |w| w.handshake.paused.load(Relaxed),
            ),
            (
                "qweb_connections_open",
                "gauge",
                "Open client connections.",
                |w| w.connections.load(Relaxed),
            ),
            (
                "qweb_http_requests_total",
                "counter",
                "HTTP requests handled.",
                |w| w.requests.load(Relaxed) as i64,
            ),
        ];
        for (name, kind, help, get) in families {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (i, w) in self.workers.iter().enumerate() {
                let _ = writeln!(out, "{name}{{worker=\"{i}\"}} {}", get(w));
            }
        }
        qweb_offload::write_engines(&mut out, &self.engines);
        if let Some(c) = &self.compression {
            c.write_prometheus(&mut out);
        }
        crate::tls_session::render(&mut out, &self.tls_sessions);
        out
    }
}
