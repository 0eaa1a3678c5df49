//! Counters the embedding binary provides for `/metrics`, read when it is scraped: the
//! `qweb` binary's counting allocator (feature `alloc-count`) registers
//! `qweb_allocations_total` here, so allocations per request can be read before and after a
//! load run, beside `qweb_http_requests_total`.

use std::sync::OnceLock;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;

/// One counter: its name (without `_total`), help text and how to read it.
#[derive(Clone, Copy)]
pub struct ProcessCounter {
    /// Metric name, without the `_total` suffix the exposition adds.
    pub name: &'static str,
    /// Help text.
    pub help: &'static str,
    /// Reads the current value.
    pub read: fn() -> u64,
}

static COUNTERS: OnceLock<Vec<ProcessCounter>> = OnceLock::new();

/// Registers `counters` for every server started later in this process. Only the first call
/// takes effect (it returns false for the later ones).
pub fn register(counters: Vec<ProcessCounter>) -> bool {
    COUNTERS.set(counters).is_ok()
}

/// Encodes the registered counters.
#[derive(Debug, Default)]
pub struct ProcessCounters;

impl Collector for ProcessCounters {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        for c in COUNTERS.get().map(Vec::as_slice).unwrap_or_default() {
            let counter = ConstCounter::new((c.read)());
            let metric = encoder.encode_descriptor(c.name, c.help, None, counter.metric_type())?;
            counter.encode(metric)?;
        }
        Ok(())
    }
}
