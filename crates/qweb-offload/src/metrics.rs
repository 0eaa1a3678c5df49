//! Engine metrics: counters, gauges and an op-latency histogram, lock-free, written by engine
//! threads and workers, read by the admin endpoint.

//!
//! Every op handed to an engine is counted exactly once when it ends, as one of:
//! - `completed`: the engine produced a result and the waiter got it;
//! - `failed`: the engine reported an error and the waiter got it;
//! - `timed_out`: the waiter's timeout passed first (counted by the waiter, which gives the
//!   op up, see [`crate::Completion::give_up`]; the engine's later completion is not
//!   counted again), or the engine itself timed the op out;
//! - `cancelled`: the waiter went away before the result came (e.g. the TLS client left
//!   while its handshake waited for a signature): not an engine failure.
//!
//! `submitted = completed + failed + timed_out + cancelled + in flight`, where an op given
//! up by its waiter stays in flight until the engine is done with it.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

use crate::completion::{Completer, Delivery};
use crate::op::{OpError, OpResult};

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
    /// Ops that failed (an engine error delivered to the waiter).
    pub failed: AtomicU64,
    /// Ops whose waiter timed out first, or that the engine timed out.
    pub timed_out: AtomicU64,
    /// Ops whose waiter went away before the result came.
    pub cancelled: AtomicU64,
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

    /// The engine is done with an op submitted at `submitted_at`: delivers `result` through
    /// `completer` and counts the op by what became of its waiter (see the module
    /// documentation). Every engine ends every op it accepted through this.
    pub fn finish(&self, completer: Completer, result: OpResult, submitted_at: Instant) {
        let outcome = match &result {
            Ok(_) => &self.completed,
            Err(OpError::Timeout) => &self.timed_out,
            Err(_) => &self.failed,
        };
        let latency = submitted_at.elapsed();
        // counted before the waiter can see the result (a sync waiter submits its next op at
        // once: the in-flight gauge must already be down)
        completer.complete_then(result, |delivery| {
            match delivery {
                Delivery::Delivered => {
                    outcome.fetch_add(1, Relaxed);
                }
                Delivery::WaiterGone => {
                    self.cancelled.fetch_add(1, Relaxed);
                }
                // counted by the waiter when it gave up
                Delivery::WaiterTimedOut => {}
            }
            self.record_latency(latency);
        });
    }

    /// A waiter gave up on an op at its timeout ([`crate::Completion::give_up`] said so):
    /// counts it as timed out. The engine's completion of it will not count it again.
    pub fn on_waiter_timeout(&self) {
        self.timed_out.fetch_add(1, Relaxed);
    }

    /// The engine is done with one op (in flight no more), after `latency`.
    fn record_latency(&self, latency: Duration) {
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
}

type CounterOf = fn(&EngineMetrics) -> &AtomicU64;
type GaugeOf = fn(&EngineMetrics) -> &AtomicI64;

/// The counter families: name (without `_total`), help, field.
const COUNTERS: [(&str, &str, CounterOf); 8] = [
    (
        "qweb_offload_ops_submitted",
        "Ops handed to the engine.",
        |m| &m.submitted,
    ),
    (
        "qweb_offload_ops_completed",
        "Ops completed with a result.",
        |m| &m.completed,
    ),
    (
        "qweb_offload_ops_failed",
        "Ops that failed with an engine error (not counting timeouts and cancellations).",
        |m| &m.failed,
    ),
    (
        "qweb_offload_ops_timed_out",
        "Ops not done within the timeout (each counted once).",
        |m| &m.timed_out,
    ),
    (
        "qweb_offload_ops_cancelled",
        "Ops whose waiter went away before the result (e.g. the TLS client left).",
        |m| &m.cancelled,
    ),
    (
        "qweb_offload_ops_fallback",
        "Ops run in software instead of on the engine.",
        |m| &m.fallen_back,
    ),
    (
        "qweb_offload_ops_saturated",
        "Ops refused because the engine queue was full.",
        |m| &m.saturated,
    ),
    (
        "qweb_offload_batches",
        "Submission batches (engine wake-ups).",
        |m| &m.batches,
    ),
];

/// The gauge families.
const GAUGES: [(&str, &str, GaugeOf); 3] = [
    (
        "qweb_offload_in_flight",
        "Ops submitted and not completed.",
        |m| &m.in_flight,
    ),
    (
        "qweb_offload_in_flight_peak",
        "Highest number of ops in flight.",
        |m| &m.in_flight_peak,
    ),
    (
        "qweb_offload_queue_depth",
        "Ops waiting for an engine thread.",
        |m| &m.queue_depth,
    ),
];

/// Encodes the engine families for `engines` (name, metrics): each family once, one sample
/// per engine (label `engine`), and `qweb_keyserver_up{engine, server}` for `servers_up`
/// (engine, server, up). For collectors that own their engines differently (the key server's
/// own signing pool); [`EngineSet`](crate::EngineSet) uses it.
pub fn encode_engines(
    encoder: &mut DescriptorEncoder,
    engines: &[(&str, &EngineMetrics)],
    servers_up: &[(&str, String, bool)],
) -> std::fmt::Result {
    for (name, help, get) in COUNTERS {
        let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
        for (engine, m) in engines {
            let labels = [("engine", *engine)];
            ConstCounter::new(get(m).load(Relaxed)).encode(family.encode_family(&labels)?)?;
        }
    }
    for (name, help, get) in GAUGES {
        let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
        for (engine, m) in engines {
            let labels = [("engine", *engine)];
            ConstGauge::new(get(m).load(Relaxed)).encode(family.encode_family(&labels)?)?;
        }
    }
    let mut family = encoder.encode_descriptor(
        "qweb_offload_op_latency_seconds",
        "Op latency from submission to completion.",
        None,
        MetricType::Histogram,
    )?;
    for (engine, m) in engines {
        let labels = [("engine", *engine)];
        let (sum, count, buckets) = m.latency_snapshot();
        family
            .encode_family(&labels)?
            .encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
    }
    if !servers_up.is_empty() {
        let mut family = encoder.encode_descriptor(
            "qweb_keyserver_up",
            "1 when at least one connection to the key server is established.",
            None,
            MetricType::Gauge,
        )?;
        for (engine, server, is_up) in servers_up {
            let labels = [("engine", *engine), ("server", server.as_str())];
            ConstGauge::new(i64::from(*is_up)).encode(family.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

impl EngineMetrics {
    /// The latency histogram as (sum in seconds, count, per-bucket counts with their upper
    /// bounds, `+Inf` last). Read while ops complete: the count is the buckets' total, so
    /// the histogram is consistent even when a completion lands mid-read.
    fn latency_snapshot(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let mut buckets = Vec::with_capacity(LATENCY_BUCKETS.len() + 1);
        let mut below = 0u64;
        for (i, le) in LATENCY_BUCKETS.iter().enumerate() {
            // stored cumulatively; read in order, a later bucket is never below an earlier one
            let cumulative = self.latency_buckets[i].load(Relaxed).max(below);
            buckets.push((*le, cumulative - below));
            below = cumulative;
        }
        let count = self.latency_count.load(Relaxed).max(below);
        buckets.push((f64::INFINITY, count - below));
        let sum = self.latency_sum_ns.load(Relaxed) as f64 / 1e9;
        (sum, count, buckets)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use prometheus_client::registry::Registry;

    use crate::engine::{Engine, EngineSet, InlineEngine};

    struct Remote(InlineEngine);
    impl Engine for Remote {
        fn name(&self) -> &str {
            "r\"1"
        }
        fn submit(&self, b: Vec<crate::Submission>) -> Vec<crate::Submission> {
            self.0.submit(b)
        }
        fn metrics(&self) -> &EngineMetrics {
            self.0.metrics()
        }
        fn servers_up(&self) -> Vec<(String, bool)> {
            vec![("unix:/a\\b".into(), true), ("tls://k:1".into(), false)]
        }
    }

    fn render(set: &EngineSet) -> String {
        let mut registry = Registry::default();
        set.register(&mut registry);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
    }

    #[test]
    fn every_family_once_with_all_engines_and_escaped_labels() {
        let set = EngineSet::new(vec![
            Arc::new(InlineEngine::new("a")),
            Arc::new(Remote(InlineEngine::new("x"))),
        ]);
        let out = render(&set);
        let mut seen = Vec::new();
        let mut last = "";
        for l in out.lines() {
            if let Some(rest) = l.strip_prefix("# TYPE ") {
                let name = rest.split(' ').next().unwrap();
                assert!(!seen.contains(&name), "family {name} twice:\n{out}");
                seen.push(name);
                last = name;
            } else if !l.starts_with('#') {
                // every sample belongs to the family declared last
                assert!(l.starts_with(last), "{l} outside its family {last}:\n{out}");
            }
        }
        assert!(out.ends_with("# EOF\n"), "{out}");
        assert_eq!(out.matches("# HELP qweb_offload_ops_cancelled ").count(), 1);
        assert!(out.contains("qweb_offload_ops_failed_total{engine=\"a\"} 0"));
        assert!(out.contains("qweb_offload_ops_failed_total{engine=\"r\\\"1\"} 0"));
        assert!(out.contains("qweb_keyserver_up{engine=\"r\\\"1\",server=\"unix:/a\\\\b\"} 1"));
        assert!(out.contains("qweb_keyserver_up{engine=\"r\\\"1\",server=\"tls://k:1\"} 0"));
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_end_at_the_count() {
        let m = EngineMetrics::default();
        m.on_submit(3);
        m.record_latency(Duration::from_micros(50));
        m.record_latency(Duration::from_millis(3));
        m.record_latency(Duration::from_secs(5));
        let (_, count, buckets) = m.latency_snapshot();
        assert_eq!(count, 3);
        assert_eq!(buckets.iter().map(|b| b.1).sum::<u64>(), 3);
        assert_eq!(buckets[0], (0.0001, 1));
        assert_eq!(buckets.last().copied(), Some((f64::INFINITY, 1)));
        let set = EngineSet::new(vec![Arc::new(InlineEngine::new("a"))]);
        set.set(Vec::new());
        assert!(
            !render(&set).contains("engine=\"a\""),
            "a replaced set is what a scrape shows"
        );
    }
}
