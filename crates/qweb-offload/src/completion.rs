//! Completions: a one-shot slot an engine fills from any thread, awaited by a task (async
//! offload) or waited for by a blocked thread (sync offload).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crate::op::{OpError, OpResult};

struct Slot {
    result: Option<OpResult>,
    waker: Option<Waker>,
    /// The completer was dropped without completing.
    abandoned: bool,
    waiter: Waiter,
}

/// The waiter's side of a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Waiter {
    /// Still waiting (or has taken its result).
    Waiting,
    /// Gave up on its timeout ([`Completion::give_up`]).
    TimedOut,
    /// Went away (the [`Completion`] was dropped).
    Gone,
}

/// What became of a result an engine delivered ([`Completer::complete`]): the engine's
/// metrics count the op by it, so that every op is counted exactly once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// The waiter gets the result.
    Delivered,
    /// The waiter had already given up on its timeout (and counted the op as timed out).
    WaiterTimedOut,
    /// The waiter had gone away before the result came (the op is cancelled).
    WaiterGone,
}

struct Shared {
    slot: Mutex<Slot>,
    cond: Condvar,
}

/// The engine's half: completes the op once.
pub struct Completer {
    shared: Arc<Shared>,
    done: bool,
}

/// The waiter's half: a future of the op's result; also [`Completion::wait`] for threads.
pub struct Completion {
    shared: Arc<Shared>,
}

/// A connected completer and completion.
pub fn channel() -> (Completer, Completion) {
    let shared = Arc::new(Shared {
        slot: Mutex::new(Slot {
            result: None,
            waker: None,
            abandoned: false,
            waiter: Waiter::Waiting,
        }),
        cond: Condvar::new(),
    });
    (
        Completer {
            shared: shared.clone(),
            done: false,
        },
        Completion { shared },
    )
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Slot> {
        // A panic while holding this lock cannot leave the slot inconsistent (plain stores).
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Completer {
    /// Delivers the result and wakes the waiter; says whether the waiter was still there.
    pub fn complete(self, result: OpResult) -> Delivery {
        self.complete_then(result, |_| {})
    }

    /// As [`Completer::complete`], and runs `account` with the delivery before the waiter
    /// can see the result (so that metrics are up to date when the waiter wakes).
    pub fn complete_then(mut self, result: OpResult, account: impl FnOnce(Delivery)) -> Delivery {
        self.done = true;
        self.fill(Some(result), account)
    }

    fn fill(&self, result: Option<OpResult>, account: impl FnOnce(Delivery)) -> Delivery {
        let (waker, delivery) = {
            let mut slot = self.shared.lock();
            let delivery = match slot.waiter {
                Waiter::Waiting => Delivery::Delivered,
                Waiter::TimedOut => Delivery::WaiterTimedOut,
                Waiter::Gone => Delivery::WaiterGone,
            };
            match result {
                Some(r) if delivery == Delivery::Delivered => slot.result = Some(r),
                Some(_) => {}
                None => slot.abandoned = true,
            }
            // the waiter takes the result under this lock: it cannot see it yet
            account(delivery);
            (slot.waker.take(), delivery)
        };
        self.shared.cond.notify_all();
        if let Some(w) = waker {
            w.wake();
        }
        delivery
    }

    /// Is anyone still waiting? (An engine may skip work nobody waits for.)
    pub fn is_wanted(&self) -> bool {
        Arc::strong_count(&self.shared) > 1 && self.shared.lock().waiter == Waiter::Waiting
    }
}

impl Drop for Completer {
    fn drop(&mut self) {
        if !self.done {
            self.fill(None, |_| {});
        }
    }
}

impl Completion {
    fn take(slot: &mut Slot) -> Option<OpResult> {
        if let Some(r) = slot.result.take() {
            return Some(r);
        }
        slot.abandoned.then_some(Err(OpError::Dropped))
    }

    /// Blocks the calling thread until the result arrives or `timeout` passes (sync offload);
    /// `Err(Timeout)` then. Use [`Completion::wait_for`] to tell a timeout of this wait (to
    /// count it) from an engine's own `Timeout` result.
    pub fn wait(mut self, timeout: Duration) -> OpResult {
        self.wait_for(timeout).unwrap_or(Err(OpError::Timeout))
    }

    /// Blocks the calling thread until the result arrives (`Some`) or `timeout` passes:
    /// then gives up ([`Completion::give_up`]) and returns `None`.
    pub fn wait_for(&mut self, timeout: Duration) -> Option<OpResult> {
        let deadline = std::time::Instant::now() + timeout;
        let mut slot = self.shared.lock();
        loop {
            if let Some(r) = Self::take(&mut slot) {
                return Some(r);
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                slot.waiter = Waiter::TimedOut;
                return None;
            }
            slot = self
                .shared
                .cond
                .wait_timeout(slot, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

impl Completion {
    /// The waiter's timeout passed: takes the result if it came meanwhile (`Some`), else
    /// marks the op as given up (`None`): the engine's completion will then not count it,
    /// the caller counts it as timed out (`EngineMetrics::on_waiter_timeout`).
    pub fn give_up(&mut self) -> Option<OpResult> {
        let mut slot = self.shared.lock();
        if let Some(r) = Self::take(&mut slot) {
            return Some(r);
        }
        slot.waiter = Waiter::TimedOut;
        None
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        let mut slot = self.shared.lock();
        if slot.waiter == Waiter::Waiting {
            slot.waiter = Waiter::Gone;
        }
    }
}

impl Future for Completion {
    type Output = OpResult;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<OpResult> {
        let mut slot = self.shared.lock();
        if let Some(r) = Self::take(&mut slot) {
            return Poll::Ready(r);
        }
        match &slot.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => slot.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::OpOutput;

    #[test]
    fn wait_gets_result_from_another_thread() {
        let (c, w) = channel();
        std::thread::spawn(move || c.complete(Ok(OpOutput::Signature(vec![1]))));
        assert_eq!(
            w.wait(Duration::from_secs(5)),
            Ok(OpOutput::Signature(vec![1]))
        );
    }

    #[test]
    fn dropped_completer_and_timeout() {
        let (c, w) = channel();
        drop(c);
        assert_eq!(w.wait(Duration::from_secs(5)), Err(OpError::Dropped));
        let (_c, w) = channel();
        assert_eq!(w.wait(Duration::from_millis(10)), Err(OpError::Timeout));
    }

    #[test]
    fn completer_learns_what_became_of_the_waiter() {
        let (c, w) = channel();
        drop(w);
        assert!(!c.is_wanted());
        assert_eq!(
            c.complete(Ok(OpOutput::Signature(vec![1]))),
            Delivery::WaiterGone
        );
        let (c, mut w) = channel();
        assert_eq!(w.wait_for(Duration::from_millis(5)), None);
        assert!(!c.is_wanted());
        assert_eq!(
            c.complete(Ok(OpOutput::Signature(vec![1]))),
            Delivery::WaiterTimedOut
        );
        let (c, mut w) = channel();
        assert_eq!(
            c.complete(Ok(OpOutput::Signature(vec![2]))),
            Delivery::Delivered
        );
        // the result came before the waiter gave up: it gets it
        assert_eq!(w.give_up(), Some(Ok(OpOutput::Signature(vec![2]))));
    }

    #[tokio::test]
    async fn await_gets_result() {
        let (c, w) = channel();
        assert!(c.is_wanted());
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            c.complete(Ok(OpOutput::Signature(vec![2])));
        });
        assert_eq!(w.await, Ok(OpOutput::Signature(vec![2])));
    }
}
