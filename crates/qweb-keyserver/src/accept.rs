//! Accept loops that survive accept errors.
//!
//! When `accept` fails for want of a resource (`EMFILE`/`ENFILE`: out of file descriptors;
//! `ENOMEM`), the pending connection stays in the listen backlog, so the listener stays
//! readable and accepting again at once fails again at once: a loop without a pause spins
//! at 100% CPU. [`AcceptErrors`] pauses the loop (50 ms, doubling to 1 s while the errors
//! last) and logs at most one line per listener per minute, with the count of the errors it
//! did not log.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// First pause after a failed accept.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// Longest pause while accept keeps failing.
pub const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// At most one log line per listener in this period.
pub const LOG_PERIOD: Duration = Duration::from_secs(60);

/// Backoff and log rate limiting of one accept loop.
#[derive(Debug)]
pub struct AcceptErrors {
    listener: &'static str,
    backoff: Duration,
    last_log: Option<Instant>,
    suppressed: u64,
}

impl AcceptErrors {
    /// The state of the accept loop of `listener` (a name for the log).
    pub fn new(listener: &'static str) -> Self {
        AcceptErrors {
            listener,
            backoff: FIRST_BACKOFF,
            last_log: None,
            suppressed: 0,
        }
    }

    /// An accept succeeded: the next error pauses briefly again.
    pub fn succeeded(&mut self) {
        self.backoff = FIRST_BACKOFF;
    }

    /// An accept failed with `e`: counts it in `counter`, logs it unless a line was logged
    /// for this listener within [`LOG_PERIOD`], and returns how long to pause before the
    /// next accept.
    pub fn failed(&mut self, e: &std::io::Error, counter: &AtomicU64) -> Duration {
        counter.fetch_add(1, Relaxed);
        let now = Instant::now();
        match self.last_log {
            Some(t) if now.duration_since(t) < LOG_PERIOD => self.suppressed += 1,
            _ => {
                tracing::warn!(
                    listener = self.listener,
                    suppressed = self.suppressed,
                    "accept failed: {e}; pausing accepts up to {MAX_BACKOFF:?} while it lasts \
                     (at most one such line per minute; `suppressed` errors were not logged)"
                );
                self.last_log = Some(now);
                self.suppressed = 0;
            }
        }
        let pause = self.backoff;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        pause
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap_and_resets() {
        let c = AtomicU64::new(0);
        let mut a = AcceptErrors::new("t");
        let e = std::io::Error::from_raw_os_error(libc::EMFILE);
        let pauses: Vec<Duration> = (0..8).map(|_| a.failed(&e, &c)).collect();
        assert_eq!(pauses[0], FIRST_BACKOFF);
        assert_eq!(pauses[1], FIRST_BACKOFF * 2);
        assert_eq!(*pauses.last().unwrap(), MAX_BACKOFF);
        assert_eq!(c.load(Relaxed), 8);
        // one line logged, the other seven counted as suppressed
        assert_eq!(a.suppressed, 7);
        a.succeeded();
        assert_eq!(a.failed(&e, &c), FIRST_BACKOFF);
    }
}
