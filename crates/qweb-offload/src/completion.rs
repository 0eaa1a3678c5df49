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
    /// Delivers the result and wakes the waiter.
    pub fn complete(mut self, result: OpResult) {
        self.done = true;
        self.fill(Some(result));
    }

    fn fill(&self, result: Option<OpResult>) {
        let waker = {
            let mut slot = self.shared.lock();
            match result {
                Some(r) => slot.result = Some(r),
                None => slot.abandoned = true,
            }
            slot.waker.take()
        };
        self.shared.cond.notify_all();
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Is anyone still waiting? (An engine may skip work nobody waits for.)
    pub fn is_wanted(&self) -> bool {
        Arc::strong_count(&self.shared) > 1
    }
}

impl Drop for Completer {
    fn drop(&mut self) {
        if !self.done {
            self.fill(None);
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

    /// Blocks the calling thread until the result arrives or `timeout` passes (sync offload).
    pub fn wait(self, timeout: Duration) -> OpResult {
        let deadline = std::time::Instant::now() + timeout;
        let mut slot = self.shared.lock();
        loop {
            if let Some(r) = Self::take(&mut slot) {
                return r;
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return Err(OpError::Timeout);
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
