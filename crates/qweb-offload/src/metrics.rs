//! Engine metrics: counters, gauges and an op-latency histogram, lock-free, written by engine
//! threads and workers, read by the admin endpoint.

use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds (seconds) of the latency histogram buckets.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// Metrics of one engine.
#[derive(Debug, Default)]
pub struct EngineMetrics {
    /// Ops handed to the engine.
    pub submitted: AtomicU64,
    /// Ops that completed with a result.
    pub completed: AtomicU64,
    /// Ops that failed (engine error, timeout, dropped).
    pub failed: AtomicU64,
    /// Ops run in software instead (engine failed, timed out or was saturated).
    pub fallen_back: AtomicU64,
    /// Ops refused because the queue was full.
    pub saturated: AtomicU64,
    /// Ops submitted and not yet completed.
    pub in_flight: AtomicI64,
    /// Highest `in_flight` seen.
    pub in_flight_peak: AtomicI64,
    /// Ops waiting in the queue for an engine thread.
    pub queue_depth: AtomicI64,
    /// Batches submitted (a batch is one wake-up of the engine).
    pub batches: AtomicU64,
    latency_buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    latency_count: AtomicU64,
    latency_sum_ns: AtomicU64,
}

impl EngineMetrics {
    /// `n` ops submitted in one batch.
    pub fn on_submit(&self, n: usize) {
        self.submitted.fetch_add(n as u64, Relaxed);
        self.batches.fetch_add(1, Relaxed);
        let now = self.in_flight.fetch_add(n as i64, Relaxed) + n as i64;
        self.in_flight_peak.fetch_max(now, Relaxed);
    }

    /// One op finished after `latency` (successfully or not).
    pub fn on_complete(&self, ok: bool, latency: Duration) {
        if ok {
            self.completed.fetch_add(1, Relaxed);
        } else {
            self.failed.fetch_add(1, Relaxed);
        }
        self.in_flight.fetch_sub(1, Relaxed);
        let secs = latency.as_secs_f64();
        for (i, le) in LATENCY_BUCKETS.iter().enumerate() {
            if secs <= *le {
                self.latency_buckets[i].fetch_add(1, Relaxed);
            }
        }
        self.latency_count.fetch_add(1, Relaxed);
        self.latency_sum_ns
            .fetch_add(latency.as_nanos().min(u64::MAX as u128) as u64, Relaxed);
    }

    /// Writes the metrics in Prometheus text format with the label `engine="<name>"`.
    /// `with_help` adds the `# HELP`/`# TYPE` lines (once per family when several engines are
    /// written).
    pub fn write_prometheus(&self, out: &mut String, engine: &str, with_help: bool) {
        let counters: [(&str, &str, &AtomicU64); 6] = [
            (
                "qweb_offload_ops_submitted_total",
                "Ops handed to the engine.",
                &self.submitted,
            ),
            (
                "qweb_offload_ops_completed_total",
                "Ops completed with a result.",
                &self.completed,
            ),
            (
                "qweb_offload_ops_failed_total",
                "Ops that failed or timed out.",
                &self.failed,
            ),
            (
                "qweb_offload_ops_fallback_total",
                "Ops run in software instead of on the engine.",
                &self.fallen_back,
            ),
            (
                "qweb_offload_ops_saturated_total",
                "Ops refused because the engine queue was full.",
                &self.saturated,
            ),
            (
                "qweb_offload_batches_total",
                "Submission batches (engine wake-ups).",
                &self.batches,
            ),
        ];
        for (name, help, v) in counters {
            if with_help {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            }
            let _ = writeln!(out, "{name}{{engine=\"{engine}\"}} {}", v.load(Relaxed));
        }
        let gauges: [(&str, &str, &AtomicI64); 3] = [
            (
                "qweb_offload_in_flight",
                "Ops submitted and not completed.",
                &self.in_flight,
            ),
            (
                "qweb_offload_in_flight_peak",
                "Highest number of ops in flight.",
                &self.in_flight_peak,
            ),
            (
                "qweb_offload_queue_depth",
                "Ops waiting for an engine thread.",
                &self.queue_depth,
            ),
        ];
        for (name, help, v) in gauges {
            if with_help {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            }
            let _ = writeln!(out, "{name}{{engine=\"{engine}\"}} {}", v.load(Relaxed));
        }
        let name = "qweb_offload_op_latency_seconds";
        if with_help {
            let _ = writeln!(
                out,
                "# HELP {name} Op latency from submission to completion.\n# TYPE {name} histogram"
            );
        }
        for (i, le) in LATENCY_BUCKETS.iter().enumerate() {
            let _ = writeln!(
                out,
                "{name}_bucket{{engine=\"{engine}\",le=\"{le}\"}} {}",
                self.latency_buckets[i].load(Relaxed)
            );
        }
        let count = self.latency_count.load(Relaxed);
        let _ = writeln!(
            out,
            "{name}_bucket{{engine=\"{engine}\",le=\"+Inf\"}} {count}"
        );
        let _ = writeln!(
            out,
            "{name}_sum{{engine=\"{engine}\"}} {}",
            self.latency_sum_ns.load(Relaxed) as f64 / 1e9
        );
        let _ = writeln!(out, "{name}_count{{engine=\"{engine}\"}} {count}");
    }
}
