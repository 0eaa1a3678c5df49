//! A connection's deadline timer, re-armed lazily.
//!
//! A connection's deadline moves with every request (the keep-alive deadline starts at the
//! last byte read, the head deadline at the head's first byte). A fresh timer per turn of the
//! connection's loop registers in and leaves tokio's timer wheel for every request: 6 % of a
//! worker's time for 1 KiB keep-alive requests (pprof). Deadlines only move later while the
//! connection makes progress, so a timer armed for an earlier one can stay: it fires early,
//! the loop finds its deadline not yet passed and arms the timer for the current one. The
//! timer is re-armed sooner only when a deadline comes before it (nginx keeps its timers the
//! same way, `NGX_TIMER_LAZY_DELAY`). One registration per timeout period instead of one per
//! request.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::time::{Instant, Sleep};

/// A timer that wakes its connection at or before the deadline it was last given.
pub(crate) struct LazyTimer {
    sleep: Pin<Box<Sleep>>,
    /// When it fires; `None`: not armed.
    armed: Option<Instant>,
}

impl LazyTimer {
    /// An unarmed timer.
    pub(crate) fn new() -> Self {
        LazyTimer {
            sleep: Box::pin(tokio::time::sleep_until(Instant::now())),
            armed: None,
        }
    }

    /// Makes the timer fire at `deadline` or before it. An armed timer that fires no later
    /// is kept as it is; with no deadline the armed timer stays too (the loop ignores a
    /// wake-up with nothing due).
    pub(crate) fn arm(&mut self, deadline: Option<Instant>) {
        if let Some(d) = deadline {
            if self.armed.is_none_or(|a| d < a) {
                self.sleep.as_mut().reset(d);
                self.armed = Some(d);
            }
        }
    }

    /// Waits until the armed time (forever when unarmed); the timer is unarmed after it fires.
    pub(crate) fn fired(&mut self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx: &mut Context<'_>| self.poll_fired(cx))
    }

    /// [`LazyTimer::fired`] for a caller that polls.
    pub(crate) fn poll_fired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.armed.is_none() {
            return Poll::Pending;
        }
        match self.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.armed = None;
                Poll::Ready(())
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A later deadline keeps the earlier timer; a sooner one re-arms it; once fired it is
    /// unarmed and arms again for whatever comes next.
    #[tokio::test(start_paused = true)]
    async fn fires_at_the_earliest_deadline_it_was_given() {
        let start = Instant::now();
        let mut t = LazyTimer::new();
        t.arm(Some(start + Duration::from_secs(10)));
        t.arm(Some(start + Duration::from_secs(20))); // later: kept at 10
        t.fired().await;
        assert_eq!(Instant::now() - start, Duration::from_secs(10));
        t.arm(Some(start + Duration::from_secs(30)));
        t.arm(Some(start + Duration::from_secs(15))); // sooner: re-armed
        t.arm(None); // nothing due: stays armed
        t.fired().await;
        assert_eq!(Instant::now() - start, Duration::from_secs(15));
    }

    /// An unarmed timer never fires.
    #[tokio::test(start_paused = true)]
    async fn unarmed_never_fires() {
        let mut t = LazyTimer::new();
        t.arm(None);
        let r = tokio::time::timeout(Duration::from_secs(3600), t.fired()).await;
        assert!(r.is_err());
    }
}
