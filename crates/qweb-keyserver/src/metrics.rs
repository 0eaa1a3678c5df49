//! The key server's own `/metrics` (OpenMetrics text, through `prometheus-client`): its
//! request, error and connection counters, and its signing pool's engine families.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use qweb_offload::Engine;

use crate::state::State;

/// Reads the key server's state at each scrape.
struct StateCollector(Arc<State>);

impl std::fmt::Debug for StateCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StateCollector")
    }
}

impl Collector for StateCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let m = &self.0.metrics;
        for (name, help, v) in [
            ("qweb_keyserver_requests", "Requests received.", &m.requests),
            ("qweb_keyserver_errors", "Error answers sent.", &m.errors),
            (
                "qweb_keyserver_rejected_connections",
                "Connections refused or dropped.",
                &m.rejected_connections,
            ),
            (
                "qweb_keyserver_timed_out_connections",
                "Connections closed because a frame or an answer stalled past frame_timeout.",
                &m.timed_out_connections,
            ),
            (
                "qweb_keyserver_accept_errors",
                "Failed accepts (e.g. out of file descriptors).",
                &m.accept_errors,
            ),
        ] {
            let family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            ConstCounter::new(v.load(Relaxed)).encode(family)?;
        }
        let family = encoder.encode_descriptor(
            "qweb_keyserver_connections",
            "Open client connections.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(m.connections.load(Relaxed)).encode(family)?;
        let pool = &self.0.pool;
        qweb_offload::metrics::encode_engines(&mut encoder, &[(pool.name(), pool.metrics())], &[])
    }
}

/// The OpenMetrics text of the key server's metrics (ends with `# EOF`).
pub(crate) fn render(state: &Arc<State>) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(StateCollector(state.clone())));
    let mut out = String::new();
    // writing to a String cannot fail; a collector error would leave a partial text
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &registry) {
        tracing::error!("metrics: {e}");
    }
    out
}
