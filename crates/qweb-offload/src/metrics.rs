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

use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::completion::{Completer, Delivery};
use crate::engine::Engine;
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

    /// Writes the metrics of this one engine in Prometheus text format, label
    /// `engine="<name>"`, each family with its `# HELP`/`# TYPE` lines. For several engines
    /// use [`write_engines`] (a family's samples must not be split).
    pub fn write_prometheus(&self, out: &mut String, engine: &str) {
        write_families(out, &[(engine, self)], &[]);
    }
}

/// Writes the metrics of `engines` in Prometheus text format: each family once, with its
/// `# HELP`/`# TYPE` lines, then one sample per engine (label `engine`); and
/// `qweb_keyserver_up{engine, server}` for the servers engines talk to ([`Engine::servers_up`]).
pub fn write_engines(out: &mut String, engines: &[Arc<dyn Engine>]) {
    let named: Vec<(&str, &EngineMetrics)> =
        engines.iter().map(|e| (e.name(), e.metrics())).collect();
    let mut up = Vec::new();
    for e in engines {
        for (server, is_up) in e.servers_up() {
            up.push((e.name().to_owned(), server, is_up));
        }
    }
    write_families(out, &named, &up);
}

/// A Prometheus label value: `\`, `"` and line feeds escaped.
pub fn escape_label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

fn write_families(
    out: &mut String,
    engines: &[(&str, &EngineMetrics)],
    up: &[(String, String, bool)],
) {
    type Counter = fn(&EngineMetrics) -> &AtomicU64;
    let counters: [(&str, &str, Counter); 8] = [
        (
            "qweb_offload_ops_submitted_total",
            "Ops handed to the engine.",
            |m| &m.submitted,
        ),
        (
            "qweb_offload_ops_completed_total",
            "Ops completed with a result.",
            |m| &m.completed,
        ),
        (
            "qweb_offload_ops_failed_total",
            "Ops that failed with an engine error (not counting timeouts and cancellations).",
            |m| &m.failed,
        ),
        (
            "qweb_offload_ops_timed_out_total",
            "Ops not done within the timeout (each counted once).",
            |m| &m.timed_out,
        ),
        (
            "qweb_offload_ops_cancelled_total",
            "Ops whose waiter went away before the result (e.g. the TLS client left).",
            |m| &m.cancelled,
        ),
        (
            "qweb_offload_ops_fallback_total",
            "Ops run in software instead of on the engine.",
            |m| &m.fallen_back,
        ),
        (
            "qweb_offload_ops_saturated_total",
            "Ops refused because the engine queue was full.",
            |m| &m.saturated,
        ),
        (
            "qweb_offload_batches_total",
            "Submission batches (engine wake-ups).",
            |m| &m.batches,
        ),
    ];
    let labels: Vec<String> = engines.iter().map(|(n, _)| escape_label(n)).collect();
    for (name, help, get) in counters {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for ((_, m), engine) in engines.iter().zip(&labels) {
            let _ = writeln!(
                out,
                "{name}{{engine=\"{engine}\"}} {}",
                get(m).load(Relaxed)
            );
        }
    }
    type Gauge = fn(&EngineMetrics) -> &AtomicI64;
    let gauges: [(&str, &str, Gauge); 3] = [
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
    for (name, help, get) in gauges {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for ((_, m), engine) in engines.iter().zip(&labels) {
            let _ = writeln!(
                out,
                "{name}{{engine=\"{engine}\"}} {}",
                get(m).load(Relaxed)
            );
        }
    }
    let name = "qweb_offload_op_latency_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} Op latency from submission to completion.\n# TYPE {name} histogram"
    );
    for ((_, m), engine) in engines.iter().zip(&labels) {
        for (i, le) in LATENCY_BUCKETS.iter().enumerate() {
            let _ = writeln!(
                out,
                "{name}_bucket{{engine=\"{engine}\",le=\"{le}\"}} {}",
                m.latency_buckets[i].load(Relaxed)
            );
        }
        let count = m.latency_count.load(Relaxed);
        let _ = writeln!(
            out,
            "{name}_bucket{{engine=\"{engine}\",le=\"+Inf\"}} {count}"
        );
        let _ = writeln!(
            out,
            "{name}_sum{{engine=\"{engine}\"}} {}",
            m.latency_sum_ns.load(Relaxed) as f64 / 1e9
        );
        let _ = writeln!(out, "{name}_count{{engine=\"{engine}\"}} {count}");
    }
    if !up.is_empty() {
        let name = "qweb_keyserver_up";
        let _ = writeln!(
            out,
            "# HELP {name} 1 when at least one connection to the key server is established.\n# TYPE {name} gauge"
        );
        for (engine, server, is_up) in up {
            let _ = writeln!(
                out,
                "{name}{{engine=\"{}\",server=\"{}\"}} {}",
                escape_label(engine),
                escape_label(server),
                u8::from(*is_up)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::InlineEngine;

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

    #[test]
    fn every_family_once_with_all_engines_and_escaped_labels() {
        let engines: Vec<Arc<dyn Engine>> = vec![
            Arc::new(InlineEngine::new("a")),
            Arc::new(Remote(InlineEngine::new("x"))),
        ];
        let mut out = String::new();
        write_engines(&mut out, &engines);
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
        assert_eq!(
            out.matches("# HELP qweb_offload_ops_cancelled_total")
                .count(),
            1
        );
        assert!(out.contains("qweb_offload_ops_failed_total{engine=\"a\"} 0"));
        assert!(out.contains("qweb_offload_ops_failed_total{engine=\"r\\\"1\"} 0"));
        assert!(out.contains("qweb_keyserver_up{engine=\"r\\\"1\",server=\"unix:/a\\\\b\"} 1"));
        assert!(out.contains("qweb_keyserver_up{engine=\"r\\\"1\",server=\"tls://k:1\"} 0"));
    }
}
