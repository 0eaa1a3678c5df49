//! Compression counters, shared by every worker (relaxed atomics), rendered for `/metrics`.

use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

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
    /// Appends the Prometheus text exposition of these metrics.
    pub fn write_prometheus(&self, out: &mut String) {
        let per_codec: [(&str, &str, &[AtomicU64; 3]); 3] = [
            (
                "qweb_compression_bytes_in_total",
                "Identity bytes encoded, per codec.",
                &self.bytes_in,
            ),
            (
                "qweb_compression_bytes_out_total",
                "Encoded bytes sent, per codec.",
                &self.bytes_out,
            ),
            (
                "qweb_compression_responses_total",
                "Responses encoded, per codec.",
                &self.responses,
            ),
        ];
        for (name, help, values) in per_codec {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for c in Codec::ALL {
                let _ = writeln!(
                    out,
                    "{name}{{codec=\"{}\"}} {}",
                    c.token(),
                    values[c.index()].load(Relaxed)
                );
            }
        }
        let singles: [(&str, &str, &str, i64); 9] = [
            (
                "qweb_compression_chunks_total",
                "counter",
                "Chunk ops submitted to engines.",
                self.chunks.load(Relaxed) as i64,
            ),
            (
                "qweb_compression_chunks_in_flight",
                "gauge",
                "Chunk ops submitted and not yet written out.",
                self.chunks_in_flight.load(Relaxed),
            ),
            (
                "qweb_compression_fallbacks_total",
                "counter",
                "Chunks compressed in software after an engine failure, timeout or saturation.",
                self.fallbacks.load(Relaxed) as i64,
            ),
            (
                "qweb_compression_cache_hits_total",
                "counter",
                "Compressed-variant cache hits.",
                self.cache_hits.load(Relaxed) as i64,
            ),
            (
                "qweb_compression_cache_misses_total",
                "counter",
                "Compressed-variant cache misses.",
                self.cache_misses.load(Relaxed) as i64,
            ),
            (
                "qweb_compression_cache_evictions_total",
                "counter",
                "Variants evicted to stay within the cache budget.",
                self.cache_evictions.load(Relaxed) as i64,
            ),
            (
                "qweb_compression_cache_invalidations_total",
                "counter",
                "Variants dropped because their file changed.",
                self.cache_invalidations.load(Relaxed) as i64,
            ),
            (
                "qweb_compression_cache_bytes",
                "gauge",
                "Bytes held in the compressed-variant caches.",
                self.cache_bytes.load(Relaxed),
            ),
            (
                "qweb_compression_sidecar_hits_total",
                "counter",
                "Responses served from a precompressed sidecar file.",
                self.sidecar_hits.load(Relaxed) as i64,
            ),
        ];
        for (name, kind, help, v) in singles {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        }
    }
}
