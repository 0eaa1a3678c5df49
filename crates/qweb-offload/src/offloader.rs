//! A worker's handle on an engine: batched submission ("heuristic polling") and the per-op
//! timeout.
//!
//! Ops submitted on a worker are queued locally and handed to the engine as one batch when
//! `max` ops are waiting, or when the worker has no other ready work: the first queued op
//! schedules a flush task that yields once (so every task that is ready now runs first and
//! may add its ops), then flushes. An engine thus sees batches, not a trickle of wake-ups.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::completion::{channel, Completion};
use crate::engine::{Engine, Submission};
use crate::op::{Op, OpError, OpResult};

/// Batching parameters.
#[derive(Debug, Clone, Copy)]
pub struct BatchConfig {
    /// Queue ops locally and submit them in batches.
    pub enabled: bool,
    /// Flush as soon as this many ops wait.
    pub max: usize,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            enabled: true,
            max: 16,
        }
    }
}

/// One worker's handle on one engine. Lives on the worker thread (`Rc`).
pub struct Offloader {
    engine: Arc<dyn Engine>,
    batch: BatchConfig,
    timeout: Duration,
    pending: RefCell<Vec<Submission>>,
    flush_scheduled: Cell<bool>,
}

impl Offloader {
    /// A handle on `engine` with a per-op `timeout`.
    pub fn new(engine: Arc<dyn Engine>, batch: BatchConfig, timeout: Duration) -> Rc<Self> {
        Rc::new(Offloader {
            engine,
            batch,
            timeout,
            pending: RefCell::new(Vec::new()),
            flush_scheduled: Cell::new(false),
        })
    }

    /// The engine.
    pub fn engine(&self) -> &Arc<dyn Engine> {
        &self.engine
    }

    /// The per-op timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Queues `op` (or submits it at once when batching is off) and returns its completion.
    /// Must be called on a thread running a tokio `LocalSet` when batching is on.
    pub fn submit(self: &Rc<Self>, op: Op) -> Completion {
        let (completer, completion) = channel();
        let sub = Submission::new(op, completer);
        if !self.batch.enabled {
            self.hand_over(vec![sub]);
            return completion;
        }
        let full = {
            let mut p = self.pending.borrow_mut();
            p.push(sub);
            p.len() >= self.batch.max
        };
        if full {
            self.flush();
        } else if !self.flush_scheduled.replace(true) {
            let me = self.clone();
            tokio::task::spawn_local(async move {
                tokio::task::yield_now().await;
                me.flush_scheduled.set(false);
                me.flush();
            });
        }
        completion
    }

    /// Submits whatever is queued.
    pub fn flush(&self) {
        let batch = std::mem::take(&mut *self.pending.borrow_mut());
        if !batch.is_empty() {
            self.hand_over(batch);
        }
    }

    fn hand_over(&self, batch: Vec<Submission>) {
        for s in self.engine.submit(batch) {
            s.completer.complete(Err(OpError::Saturated));
        }
    }

    /// Submits `op` and waits for its result, at most the timeout.
    pub async fn run(self: &Rc<Self>, op: Op) -> OpResult {
        self.submit_timed(op).await
    }

    /// Submits `op`; the future resolves to its result, or to `Err(Timeout)` once the
    /// timeout passed (the op is then given up and counted once as timed out). Dropping the
    /// future before either cancels the op (counted as cancelled when the engine ends it).
    pub fn submit_timed(self: &Rc<Self>, op: Op) -> Timed {
        Timed {
            completion: self.submit(op),
            deadline: Box::pin(tokio::time::sleep(self.timeout)),
            engine: self.engine.clone(),
        }
    }
}

/// An op's result within the offloader's timeout (see [`Offloader::submit_timed`]).
pub struct Timed {
    completion: Completion,
    deadline: Pin<Box<tokio::time::Sleep>>,
    engine: Arc<dyn Engine>,
}

impl Future for Timed {
    type Output = OpResult;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<OpResult> {
        let this = &mut *self;
        if let Poll::Ready(r) = Pin::new(&mut this.completion).poll(cx) {
            return Poll::Ready(r);
        }
        if this.deadline.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        Poll::Ready(this.completion.give_up().unwrap_or_else(|| {
            this.engine.metrics().on_waiter_timeout();
            Err(OpError::Timeout)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{PoolConfig, PoolEngine};
    use crate::op::{SignOp, SignScheme};
    use crate::LocalKey;
    use std::sync::atomic::Ordering::Relaxed;

    fn op(key: &Arc<LocalKey>) -> Op {
        Op::Sign(SignOp {
            key: crate::KeyRef {
                id: crate::KeyId([0; 32]),
                local: Some(key.clone()),
            },
            scheme: SignScheme::EcdsaP256Sha256,
            message: b"m".to_vec(),
        })
    }

    fn key() -> Arc<LocalKey> {
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        Arc::new(LocalKey::from_der(&kp.serialize_der()).unwrap())
    }

    #[tokio::test]
    async fn ops_from_many_tasks_go_in_one_batch() {
        let engine = Arc::new(PoolEngine::new("p", PoolConfig::default()).unwrap());
        let local = tokio::task::LocalSet::new();
        let k = key();
        local
            .run_until(async move {
                let off = Offloader::new(
                    engine.clone(),
                    BatchConfig {
                        enabled: true,
                        max: 64,
                    },
                    Duration::from_secs(5),
                );
                let mut tasks = Vec::new();
                for _ in 0..10 {
                    let (off, k) = (off.clone(), k.clone());
                    tasks.push(tokio::task::spawn_local(
                        async move { off.run(op(&k)).await },
                    ));
                }
                for t in tasks {
                    assert!(t.await.unwrap().is_ok());
                }
                // 10 tasks, ready at once: one flush
                assert_eq!(engine.metrics().batches.load(Relaxed), 1);
                assert_eq!(engine.metrics().submitted.load(Relaxed), 10);
            })
            .await;
    }

    #[tokio::test]
    async fn full_batch_flushes_at_once_and_unbatched_submits_each() {
        let engine = Arc::new(PoolEngine::new("p", PoolConfig::default()).unwrap());
        let local = tokio::task::LocalSet::new();
        let k = key();
        local
            .run_until(async move {
                let off = Offloader::new(
                    engine.clone(),
                    BatchConfig {
                        enabled: true,
                        max: 4,
                    },
                    Duration::from_secs(5),
                );
                let c: Vec<_> = (0..4).map(|_| off.submit(op(&k))).collect();
                // flushed synchronously when the 4th arrived
                assert_eq!(engine.metrics().batches.load(Relaxed), 1);
                for c in c {
                    assert!(c.await.is_ok());
                }
                let off = Offloader::new(
                    engine.clone(),
                    BatchConfig {
                        enabled: false,
                        max: 4,
                    },
                    Duration::from_secs(5),
                );
                for _ in 0..3 {
                    assert!(off.run(op(&k)).await.is_ok());
                }
                assert_eq!(engine.metrics().batches.load(Relaxed), 4);
            })
            .await;
    }

    /// Async offload: an op whose timeout passes counts once as timed out (not also as
    /// failed, nor again when the engine finishes it); an op whose waiter is dropped (the
    /// TLS client left mid-handshake) counts as cancelled.
    #[tokio::test]
    async fn timed_out_and_abandoned_ops_count_once() {
        let engine = Arc::new(
            PoolEngine::new(
                "slow",
                PoolConfig {
                    threads: 1,
                    queue: 16,
                    added_latency: Duration::from_millis(150),
                    ..Default::default()
                },
            )
            .unwrap(),
        );
        let local = tokio::task::LocalSet::new();
        let k = key();
        let e = engine.clone();
        local
            .run_until(async move {
                let off = Offloader::new(
                    e.clone(),
                    BatchConfig {
                        enabled: false,
                        max: 1,
                    },
                    Duration::from_millis(20),
                );
                assert_eq!(off.run(op(&k)).await, Err(OpError::Timeout));
                // the waiter leaves before the result: the future is dropped
                let gone = off.submit_timed(op(&k));
                drop(gone);
                while e.metrics().in_flight.load(Relaxed) != 0 {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
            .await;
        let m = engine.metrics();
        let got = [
            m.submitted.load(Relaxed),
            m.completed.load(Relaxed),
            m.failed.load(Relaxed),
            m.timed_out.load(Relaxed),
            m.cancelled.load(Relaxed),
        ];
        // [submitted, completed, failed, timed_out, cancelled]
        assert_eq!(got, [2, 0, 0, 1, 1]);
    }

    #[tokio::test]
    async fn timeout_and_saturation() {
        let engine = Arc::new(
            PoolEngine::new(
                "slow",
                PoolConfig {
                    threads: 1,
                    queue: 1,
                    added_latency: Duration::from_secs(30),
                    ..Default::default()
                },
            )
            .unwrap(),
        );
        let local = tokio::task::LocalSet::new();
        let k = key();
        local
            .run_until(async move {
                let off = Offloader::new(
                    engine.clone(),
                    BatchConfig {
                        enabled: false,
                        max: 1,
                    },
                    Duration::from_millis(50),
                );
                assert_eq!(off.run(op(&k)).await, Err(OpError::Timeout));
                // fill the single queue slot and the thread, then one more is refused
                let off = Offloader::new(
                    engine.clone(),
                    BatchConfig {
                        enabled: true,
                        max: 8,
                    },
                    Duration::from_millis(50),
                );
                let results: Vec<_> = (0..8).map(|_| off.submit(op(&k))).collect();
                let mut saturated = 0;
                for r in results {
                    // the accepted ones would take 30 s: only look for the refusals
                    let r = tokio::time::timeout(Duration::from_millis(200), r).await;
                    if r == Ok(Err(OpError::Saturated)) {
                        saturated += 1;
                    }
                }
                assert!(saturated >= 5, "{saturated}");
            })
            .await;
    }
}
