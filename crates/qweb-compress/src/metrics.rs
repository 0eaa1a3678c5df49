//! Compression counters, shared by every worker (relaxed atomics), registered in the
//! server's `/metrics` registry.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use qweb_offload::compress::Codec;

/// Counters and gauges of the compression layer.
#[derive(Debug, Default)]
pub struct CompressMetrics {
    /// Identity bytes compressed (or served from an encoded variant), per codec.
    pub bytes_in: [AtomicU64; 3],
    /// Encoded bytes produced, per codec.
    pub bytes_out: [AtomicU64; 3],
    /// Responses encoded, per codec.
    pub responses: [AtomicU64; 3],
    /// Chunk ops submitted.
    pub chunks: AtomicU64,
    /// Chunk ops submitted and not yet joined.
    pub chunks_in_flight: AtomicI64,
    /// Chunks compressed in software after the engine failed, timed out or was full.
    pub fallbacks: AtomicU64,
    /// Variant cache hits.
    pub cache_hits: AtomicU64,
    /// Variant cache misses.
    pub cache_misses: AtomicU64,
    /// Variants evicted to stay within the budget.
    pub cache_evictions: AtomicU64,
    /// Variants dropped because their file changed.
    pub cache_invalidations: AtomicU64,
    /// Bytes held in the variant caches.
    pub cache_bytes: AtomicI64,
    /// Responses served from a precompressed sidecar file.
    pub sidecar_hits: AtomicU64,
}

impl CompressMetrics {
    /// Registers the compression families (`qweb_compression_*`) in `registry`; a scrape
    /// reads these counters as they are then.
    pub fn register(self: &Arc<Self>, registry: &mut Registry) {
        registry.register_collector(Box::new(self.clone()));
    }
}

impl Collector for CompressMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let per_codec: [(&str, &str, &[AtomicU64; 3]); 3] = [
            (
                "qweb_compression_bytes_in",
                "Identity bytes encoded, per codec.",
                &self.bytes_in,
            ),
            (
                "qweb_compression_bytes_out",
                "Encoded bytes sent, per codec.",
                &self.bytes_out,
            ),
            (
                "qweb_compression_responses",
                "Responses encoded, per codec.",
                &self.responses,
            ),
        ];
        for (name, help, values) in per_codec {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for c in Codec::ALL {
                let labels = [("codec", c.token())];
                ConstCounter::new(values[c.index()].load(Relaxed))
                    .encode(family.encode_family(&labels)?)?;
            }
        }
        let counters: [(&str, &str, &AtomicU64); 7] = [
            (
                "qweb_compression_chunks",
                "Chunk ops submitted to engines.",
                &self.chunks,
            ),
            (
                "qweb_compression_fallbacks",
                "Chunks compressed in software after an engine failure, timeout or saturation.",
                &self.fallbacks,
            ),
            (
                "qweb_compression_cache_hits",
                "Compressed-variant cache hits.",
                &self.cache_hits,
            ),
            (
                "qweb_compression_cache_misses",
                "Compressed-variant cache misses.",
                &self.cache_misses,
            ),
            (
                "qweb_compression_cache_evictions",
                "Variants evicted to stay within the cache budget.",
                &self.cache_evictions,
            ),
            (
                "qweb_compression_cache_invalidations",
                "Variants dropped because their file changed.",
                &self.cache_invalidations,
            ),
            (
                "qweb_compression_sidecar_hits",
                "Responses served from a precompressed sidecar file.",
                &self.sidecar_hits,
            ),
        ];
        for (name, help, v) in counters {
            let family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            ConstCounter::new(v.load(Relaxed)).encode(family)?;
        }
        let gauges: [(&str, &str, &AtomicI64); 2] = [
            (
                "qweb_compression_chunks_in_flight",
                "Chunk ops submitted and not yet written out.",
                &self.chunks_in_flight,
            ),
            (
                "qweb_compression_cache_bytes",
                "Bytes held in the compressed-variant caches.",
                &self.cache_bytes,
            ),
        ];
        for (name, help, v) in gauges {
            let family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(v.load(Relaxed)).encode(family)?;
        }
        Ok(())
    }
}
