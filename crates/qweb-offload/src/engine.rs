//! Engines: where ops run. [`InlineEngine`] runs them on the caller's thread;
//! [`PoolEngine`] on dedicated threads behind a bounded queue.

use std::collections::{BinaryHeap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;

use crate::completion::Completer;
use crate::metrics::{encode_engines, EngineMetrics};
use crate::op::{Op, OpError};

/// An op on its way to an engine, with where its result goes.
pub struct Submission {
    /// The op.
    pub op: Op,
    /// Where the result goes.
    pub completer: Completer,
    /// When it was submitted (for latency metrics and the added latency).
    pub submitted_at: Instant,
}

impl Submission {
    /// A submission made now.
    pub fn new(op: Op, completer: Completer) -> Self {
        Submission {
            op,
            completer,
            submitted_at: Instant::now(),
        }
    }
}

/// Something that executes ops and reports completions. Nothing above an engine knows which
/// one it is.
pub trait Engine: Send + Sync + 'static {
    /// The engine's configured name (metrics label).
    fn name(&self) -> &str;
    /// Hands a batch of ops to the engine without blocking. Returns the submissions it could
    /// not take (its queue is full); their completers are untouched.
    fn submit(&self, batch: Vec<Submission>) -> Vec<Submission>;
    /// The engine's metrics.
    fn metrics(&self) -> &EngineMetrics;
    /// The servers this engine sends ops to (a key server engine), each with whether at
    /// least one connection to it is established now (`qweb_keyserver_up`). None by default.
    fn servers_up(&self) -> Vec<(String, bool)> {
        Vec::new()
    }
}

/// Sync offload: submits `op` to `engine` and blocks the calling thread until its result or
/// `timeout` (then the op is given up and counted once as timed out). A full queue is
/// `Saturated` at once.
pub fn run_blocking(engine: &dyn Engine, op: Op, timeout: Duration) -> crate::op::OpResult {
    let (completer, mut completion) = crate::completion::channel();
    if !engine
        .submit(vec![Submission::new(op, completer)])
        .is_empty()
    {
        return Err(OpError::Saturated);
    }
    completion.wait_for(timeout).unwrap_or_else(|| {
        engine.metrics().on_waiter_timeout();
        Err(OpError::Timeout)
    })
}

/// Runs each op on the caller's thread, at submission: the software baseline.
pub struct InlineEngine {
    name: String,
    metrics: EngineMetrics,
}

impl InlineEngine {
    /// An inline engine.
    pub fn new(name: impl Into<String>) -> Self {
        InlineEngine {
            name: name.into(),
            metrics: EngineMetrics::default(),
        }
    }
}

impl Engine for InlineEngine {
    fn name(&self) -> &str {
        &self.name
    }

    fn submit(&self, batch: Vec<Submission>) -> Vec<Submission> {
        self.metrics.on_submit(batch.len());
        for s in batch {
            let r = s.op.execute();
            self.metrics.finish(s.completer, r, s.submitted_at);
        }
        Vec::new()
    }

    fn metrics(&self) -> &EngineMetrics {
        &self.metrics
    }
}

/// Parameters of a [`PoolEngine`].
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Engine threads.
    pub threads: usize,
    /// Most ops waiting in the queue; more are refused (saturation).
    pub queue: usize,
    /// For measurement only: every op completes no earlier than this long after submission,
    /// as if the engine were a device (or a remote server) with this latency and unlimited
    /// parallel slots. Zero in production.
    pub added_latency: Duration,
    /// For fault testing only: every op fails with an engine error.
    pub inject_failures: bool,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            threads: 1,
            queue: 1024,
            added_latency: Duration::ZERO,
            inject_failures: false,
        }
    }
}

struct Delayed {
    due: Instant,
    seq: u64,
    completer: Completer,
    result: crate::op::OpResult,
    submitted_at: Instant,
}

impl PartialEq for Delayed {
    fn eq(&self, o: &Self) -> bool {
        (self.due, self.seq) == (o.due, o.seq)
    }
}
impl Eq for Delayed {}
impl PartialOrd for Delayed {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Delayed {
    // BinaryHeap is a max-heap: reverse so the earliest due comes first.
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (o.due, o.seq).cmp(&(self.due, self.seq))
    }
}

struct PoolShared {
    name: String,
    queue: Mutex<VecDeque<Submission>>,
    queue_cond: Condvar,
    delayed: Mutex<(BinaryHeap<Delayed>, u64)>,
    delayed_cond: Condvar,
    stop: AtomicBool,
    metrics: EngineMetrics,
    cfg: PoolConfig,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Dedicated engine threads behind a bounded queue: a software accelerator on spare cores.
pub struct PoolEngine {
    shared: Arc<PoolShared>,
    threads: Vec<JoinHandle<()>>,
}

impl PoolEngine {
    /// Starts the engine's threads.
    pub fn new(name: impl Into<String>, cfg: PoolConfig) -> std::io::Result<Self> {
        let shared = Arc::new(PoolShared {
            name: name.into(),
            queue: Mutex::new(VecDeque::new()),
            queue_cond: Condvar::new(),
            delayed: Mutex::new((BinaryHeap::new(), 0)),
            delayed_cond: Condvar::new(),
            stop: AtomicBool::new(false),
            metrics: EngineMetrics::default(),
            cfg: PoolConfig {
                threads: cfg.threads.max(1),
                queue: cfg.queue.max(1),
                ..cfg
            },
        });
        let mut threads = Vec::new();
        for i in 0..shared.cfg.threads {
            let s = shared.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("qweb-engine-{}-{i}", s.name))
                    .spawn(move || engine_thread(&s))?,
            );
        }
        if !shared.cfg.added_latency.is_zero() {
            let s = shared.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("qweb-engine-{}-delay", s.name))
                    .spawn(move || delay_thread(&s))?,
            );
        }
        Ok(PoolEngine { shared, threads })
    }
}

fn engine_thread(s: &PoolShared) {
    loop {
        let sub = {
            let mut q = lock(&s.queue);
            loop {
                if s.stop.load(Relaxed) {
                    return;
                }
                if let Some(sub) = q.pop_front() {
                    s.metrics.queue_depth.fetch_sub(1, Relaxed);
                    break sub;
                }
                q = s.queue_cond.wait(q).unwrap_or_else(PoisonError::into_inner);
            }
        };
        let result = if s.cfg.inject_failures {
            Err(OpError::Failed("injected failure".into()))
        } else if sub.completer.is_wanted() {
            // a panicking op fails that op, not the engine thread
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sub.op.execute()))
                .unwrap_or_else(|_| Err(OpError::Failed("the op panicked".into())))
        } else {
            Err(OpError::Dropped) // nobody waits any more: skip the work
        };
        if s.cfg.added_latency.is_zero() {
            s.metrics.finish(sub.completer, result, sub.submitted_at);
        } else {
            let mut d = lock(&s.delayed);
            d.1 += 1;
            let seq = d.1;
            d.0.push(Delayed {
                due: sub.submitted_at + s.cfg.added_latency,
                seq,
                completer: sub.completer,
                result,
                submitted_at: sub.submitted_at,
            });
            drop(d);
            s.delayed_cond.notify_one();
        }
    }
}

fn delay_thread(s: &PoolShared) {
    let mut d = lock(&s.delayed);
    loop {
        if s.stop.load(Relaxed) {
            return;
        }
        let now = Instant::now();
        match d.0.peek().map(|x| x.due) {
            Some(due) if due <= now => {
                if let Some(x) = d.0.pop() {
                    s.metrics.finish(x.completer, x.result, x.submitted_at);
                }
            }
            Some(due) => {
                d = s
                    .delayed_cond
                    .wait_timeout(d, due - now)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
            None => {
                d = s
                    .delayed_cond
                    .wait(d)
                    .unwrap_or_else(PoisonError::into_inner);
            }
        }
    }
}

impl Engine for PoolEngine {
    fn name(&self) -> &str {
        &self.shared.name
    }

    fn submit(&self, batch: Vec<Submission>) -> Vec<Submission> {
        let s = &self.shared;
        let mut rejected = Vec::new();
        let mut accepted = 0;
        {
            let mut q = lock(&s.queue);
            for sub in batch {
                if q.len() >= s.cfg.queue {
                    rejected.push(sub);
                } else {
                    q.push_back(sub);
                    accepted += 1;
                }
            }
        }
        if accepted > 0 {
            s.metrics.on_submit(accepted);
            s.metrics.queue_depth.fetch_add(accepted as i64, Relaxed);
            if accepted == 1 {
                s.queue_cond.notify_one();
            } else {
                s.queue_cond.notify_all();
            }
        }
        if !rejected.is_empty() {
            s.metrics
                .saturated
                .fetch_add(rejected.len() as u64, Relaxed);
        }
        rejected
    }

    fn metrics(&self) -> &EngineMetrics {
        &self.shared.metrics
    }
}

impl Drop for PoolEngine {
    fn drop(&mut self) {
        self.shared.stop.store(true, Relaxed);
        {
            let _q = lock(&self.shared.queue);
            self.shared.queue_cond.notify_all();
        }
        {
            let _d = lock(&self.shared.delayed);
            self.shared.delayed_cond.notify_all();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The engines `/metrics` reports: the whole set is replaced when a reload changes it, so a
/// scrape always sees the engines in use now.
#[derive(Clone, Default)]
pub struct EngineSet(Arc<Mutex<Vec<Arc<dyn Engine>>>>);

impl std::fmt::Debug for EngineSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self
            .snapshot()
            .iter()
            .map(|e| e.name().to_owned())
            .collect();
        f.debug_tuple("EngineSet").field(&names).finish()
    }
}

impl EngineSet {
    /// A set of these engines.
    pub fn new(engines: Vec<Arc<dyn Engine>>) -> Self {
        EngineSet(Arc::new(Mutex::new(engines)))
    }

    /// Replaces the engines reported.
    pub fn set(&self, engines: Vec<Arc<dyn Engine>>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = engines;
    }

    /// The engines reported now.
    pub fn snapshot(&self) -> Vec<Arc<dyn Engine>> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Registers the engine families (`qweb_offload_*`, `qweb_keyserver_up`) in `registry`:
    /// each family once, one sample per engine of the set at scrape time.
    pub fn register(&self, registry: &mut Registry) {
        registry.register_collector(Box::new(self.clone()));
    }
}

impl Collector for EngineSet {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let engines = self.snapshot();
        let named: Vec<(&str, &EngineMetrics)> =
            engines.iter().map(|e| (e.name(), e.metrics())).collect();
        let mut up = Vec::new();
        for e in &engines {
            for (server, is_up) in e.servers_up() {
                up.push((e.name(), server, is_up));
            }
        }
        encode_engines(&mut encoder, &named, &up)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::completion::channel;
    use crate::op::{OpOutput, SignOp, SignScheme};
    use crate::LocalKey;

    fn op() -> Op {
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        Op::Sign(SignOp {
            key: crate::KeyRef {
                id: crate::KeyId([0; 32]),
                local: Some(Arc::new(LocalKey::from_der(&kp.serialize_der()).unwrap())),
            },
            scheme: SignScheme::EcdsaP256Sha256,
            message: b"m".to_vec(),
        })
    }

    #[test]
    fn inline_completes_at_submit() {
        let e = InlineEngine::new("inline");
        let (c, w) = channel();
        assert!(e.submit(vec![Submission::new(op(), c)]).is_empty());
        assert!(matches!(w.wait(Duration::ZERO), Ok(OpOutput::Signature(_))));
        assert_eq!(e.metrics().completed.load(Relaxed), 1);
    }

    #[test]
    fn pool_runs_ops_and_refuses_past_the_queue_bound() {
        let e = PoolEngine::new(
            "p",
            PoolConfig {
                threads: 2,
                queue: 4,
                added_latency: Duration::ZERO,
                ..Default::default()
            },
        )
        .unwrap();
        let mut waits = Vec::new();
        let mut batch = Vec::new();
        for _ in 0..64 {
            let (c, w) = channel();
            batch.push(Submission::new(op(), c));
            waits.push(w);
        }
        let rejected = e.submit(batch);
        // at most `queue` can wait; the threads may have taken some already, but never all 64
        assert!(rejected.len() >= 64 - 4 - 2, "rejected {}", rejected.len());
        let accepted = 64 - rejected.len();
        drop(rejected);
        let ok = waits
            .into_iter()
            .map(|w| w.wait(Duration::from_secs(10)))
            .filter(|r| r.is_ok())
            .count();
        assert_eq!(ok, accepted);
        assert_eq!(e.metrics().saturated.load(Relaxed), (64 - accepted) as u64);
    }

    #[test]
    fn added_latency_overlaps_ops() {
        let e = PoolEngine::new(
            "slow",
            PoolConfig {
                threads: 1,
                queue: 1024,
                added_latency: Duration::from_millis(50),
                ..Default::default()
            },
        )
        .unwrap();
        let start = Instant::now();
        let mut waits = Vec::new();
        let mut batch = Vec::new();
        for _ in 0..32 {
            let (c, w) = channel();
            batch.push(Submission::new(op(), c));
            waits.push(w);
        }
        assert!(e.submit(batch).is_empty());
        for w in waits {
            assert!(w.wait(Duration::from_secs(10)).is_ok());
        }
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(50), "{took:?}");
        // 32 x 50 ms if they did not overlap; allow a very wide margin
        assert!(took < Duration::from_millis(32 * 50 / 2), "{took:?}");
        assert_eq!(e.metrics().in_flight_peak.load(Relaxed), 32);
    }

    fn slow_pool(latency_ms: u64) -> PoolEngine {
        PoolEngine::new(
            "slow",
            PoolConfig {
                threads: 1,
                queue: 16,
                added_latency: Duration::from_millis(latency_ms),
                ..Default::default()
            },
        )
        .unwrap()
    }

    /// Waits until the engine is done with every op (in flight 0).
    fn drained(e: &PoolEngine) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while e.metrics().in_flight.load(Relaxed) != 0 {
            assert!(Instant::now() < deadline, "ops never finished");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn counts(e: &PoolEngine) -> [u64; 5] {
        let m = e.metrics();
        [
            m.submitted.load(Relaxed),
            m.completed.load(Relaxed),
            m.failed.load(Relaxed),
            m.timed_out.load(Relaxed),
            m.cancelled.load(Relaxed),
        ]
    }

    #[test]
    fn a_timed_out_op_counts_once_as_timed_out() {
        // sync: the waiter times out at 20 ms, the engine finishes the op at 200 ms
        let e = slow_pool(200);
        assert_eq!(
            run_blocking(&e, op(), Duration::from_millis(20)),
            Err(OpError::Timeout)
        );
        drained(&e);
        // [submitted, completed, failed, timed_out, cancelled]
        assert_eq!(counts(&e), [1, 0, 0, 1, 0]);
    }

    #[test]
    fn an_op_whose_waiter_left_counts_as_cancelled_not_failed() {
        let e = slow_pool(100);
        let (c, w) = channel();
        assert!(e.submit(vec![Submission::new(op(), c)]).is_empty());
        drop(w); // the TLS client left while its op was in flight
        drained(&e);
        assert_eq!(counts(&e), [1, 0, 0, 0, 1]);
        // and a normal op still counts as completed
        let (c, w) = channel();
        assert!(e.submit(vec![Submission::new(op(), c)]).is_empty());
        assert!(w.wait(Duration::from_secs(10)).is_ok());
        drained(&e);
        assert_eq!(counts(&e), [2, 1, 0, 0, 1]);
    }

    #[test]
    fn dropping_the_engine_fails_waiting_ops() {
        let e = PoolEngine::new(
            "d",
            PoolConfig {
                threads: 1,
                queue: 16,
                added_latency: Duration::from_secs(60),
                ..Default::default()
            },
        )
        .unwrap();
        let (c, w) = channel();
        assert!(e.submit(vec![Submission::new(op(), c)]).is_empty());
        std::thread::sleep(Duration::from_millis(50));
        drop(e);
        assert_eq!(w.wait(Duration::from_secs(5)), Err(OpError::Dropped));
    }
}
