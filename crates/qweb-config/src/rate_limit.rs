//! `rate_limit` on a route (issue 39): requests per key (the client address, a header, a
//! cookie) measured with GCRA (the generic cell rate algorithm: one "theoretical arrival
//! time" per key), checked after routing and before the access rules.
//!
//! The state is shared by every worker of the process (like [`UpstreamGauges`](super::UpstreamGauges),
//! it lives in the validated configuration, so a reload starts from empty state) and bounded:
//! at most `max_keys` keys, kept in 16 least-recently-used shards. A key whose arrival time is
//! in the past is the same as no key, so the first keys evicted at the cap cost nothing; past
//! the cap with every key still in debt, the least recently seen key forgets its debt.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use lru::LruCache;
use serde::Deserialize;
use toml::Spanned;

use super::{ConfigError, HashKey, Validator};

/// `max_keys` when the route does not say.
pub const DEFAULT_RATE_LIMIT_KEYS: usize = 100_000;

/// The most `max_keys` may be (about 80 bytes a key: 80 MB).
pub const MAX_RATE_LIMIT_KEYS: usize = 1_000_000;

/// The most `burst` may be.
pub const MAX_RATE_LIMIT_BURST: u32 = 1_000_000;

/// Shards of a limiter's key table (fewer when `max_keys` is smaller).
const SHARDS: usize = 16;

/// `rate_limit = { rate, burst, key, dry_run, max_keys }` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRateLimit {
    pub rate: Spanned<String>,
    pub burst: Option<Spanned<i64>>,
    pub key: Option<Spanned<String>>,
    pub dry_run: Option<bool>,
    pub max_keys: Option<Spanned<i64>>,
}

/// A route's rate limit.
#[derive(Debug, Clone)]
pub struct RateLimit {
    /// What is counted: the client address, a header's value or a cookie's. A request
    /// without the header or cookie is not counted (as nginx's `limit_req` with an empty key).
    pub key: HashKey,
    /// Count and log, but refuse nothing.
    pub dry_run: bool,
    /// The keys' state, shared by the workers.
    pub state: Arc<RateLimiter>,
}

/// What a limiter decided for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// Within the rate (or its burst).
    Allowed,
    /// Over it: the next request of this key passes after `retry_after`.
    Limited {
        /// How long until one more request of the key passes.
        retry_after: Duration,
    },
}

/// One shard of a limiter: key hash to its theoretical arrival time (ns).
type Shard = Mutex<LruCache<u64, u64>>;

/// Keyed GCRA state, bounded to `max_keys` keys (hashed: a key's length costs nothing).
pub struct RateLimiter {
    /// Time between two requests at the rate, in nanoseconds.
    interval: u64,
    /// How far ahead of now a key's arrival time may be: `burst` intervals.
    tolerance: u64,
    /// Unbounded maps capped by hand (`shard_cap`), so no table is allocated for keys that
    /// never come.
    /// Each shard with its cap (together `max_keys`).
    shards: Box<[(usize, Shard)]>,
    hasher: RandomState,
    base: Instant,
    keys: AtomicUsize,
}

impl std::fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter")
            .field("interval_ns", &self.interval)
            .field("tolerance_ns", &self.tolerance)
            .field("max_keys", &self.max_keys())
            .finish()
    }
}

impl RateLimiter {
    /// One request every `interval`, `burst` more at once, at most `max_keys` keys (at least
    /// one is kept).
    pub fn new(interval: Duration, burst: u32, max_keys: usize) -> RateLimiter {
        let max_keys = max_keys.max(1);
        let n = max_keys.min(SHARDS);
        let interval = u64::try_from(interval.as_nanos())
            .unwrap_or(u64::MAX)
            .max(1);
        RateLimiter {
            interval,
            tolerance: interval.saturating_mul(u64::from(burst)),
            shards: (0..n)
                .map(|i| {
                    let cap = max_keys / n + usize::from(i < max_keys % n);
                    (cap, Mutex::new(LruCache::unbounded()))
                })
                .collect(),
            hasher: RandomState::new(),
            base: Instant::now(),
            keys: AtomicUsize::new(0),
        }
    }

    /// The most keys held at once.
    pub fn max_keys(&self) -> usize {
        self.shards.iter().map(|(cap, _)| cap).sum()
    }

    /// Keys held now.
    pub fn keys(&self) -> usize {
        self.keys.load(Relaxed)
    }

    /// Counts one request of `key` now.
    pub fn check(&self, key: impl Hash) -> Verdict {
        let now = u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.check_at(key, now)
    }

    /// Counts one request of `key` at `now` nanoseconds after the limiter was made.
    fn check_at(&self, key: impl Hash, now: u64) -> Verdict {
        let h = self.hasher.hash_one(key);
        let (cap, shard) = &self.shards[((h >> 32) as usize) % self.shards.len()];
        let mut map = shard.lock().unwrap_or_else(PoisonError::into_inner);
        let tat = map.get(&h).copied().unwrap_or(0).max(now);
        if tat - now > self.tolerance {
            let wait = tat - now - self.tolerance;
            return Verdict::Limited {
                retry_after: Duration::from_nanos(wait),
            };
        }
        let next = tat.saturating_add(self.interval);
        if let Some(v) = map.get_mut(&h) {
            *v = next;
        } else {
            if map.len() >= *cap {
                // the least recently seen key: free when its arrival time has passed
                map.pop_lru();
            } else {
                self.keys.fetch_add(1, Relaxed);
            }
            map.put(h, next);
        }
        Verdict::Allowed
    }
}

impl Validator<'_> {
    /// Route `key`'s `rate_limit`.
    pub(super) fn rate_limit(
        &self,
        key: &str,
        r: &Spanned<RawRateLimit>,
    ) -> Result<RateLimit, ConfigError> {
        let raw = r.get_ref();
        let k = format!("{key}.rate_limit");
        let interval = parse_rate(raw.rate.get_ref())
            .map_err(|m| self.err(Some(raw.rate.span()), format!("{k}.rate"), m))?;
        let burst = match &raw.burst {
            None => 0,
            Some(b) => u32::try_from(*b.get_ref())
                .ok()
                .filter(|b| *b <= MAX_RATE_LIMIT_BURST)
                .ok_or_else(|| {
                    self.err(
                        Some(b.span()),
                        format!("{k}.burst"),
                        format!("a count from 0 to {MAX_RATE_LIMIT_BURST}"),
                    )
                })?,
        };
        let max_keys = match &raw.max_keys {
            None => DEFAULT_RATE_LIMIT_KEYS,
            Some(m) => usize::try_from(*m.get_ref())
                .ok()
                .filter(|m| (1..=MAX_RATE_LIMIT_KEYS).contains(m))
                .ok_or_else(|| {
                    self.err(
                        Some(m.span()),
                        format!("{k}.max_keys"),
                        format!("a count from 1 to {MAX_RATE_LIMIT_KEYS}"),
                    )
                })?,
        };
        let hash_key = match &raw.key {
            None => HashKey::ClientIp,
            Some(s) => self.hash_key(format!("{k}.key"), s)?,
        };
        Ok(RateLimit {
            key: hash_key,
            dry_run: raw.dry_run.unwrap_or(false),
            state: Arc::new(RateLimiter::new(interval, burst, max_keys)),
        })
    }
}

/// `"10/s"`, `"30/m"` (also `"10r/s"`, as nginx writes it): the time between two requests.
fn parse_rate(s: &str) -> Result<Duration, String> {
    let bad = || {
        format!(
            "`{s}` is not a rate: write requests per second or minute, e.g. \"10/s\" or \"30/m\""
        )
    };
    let (n, unit) = s.trim().split_once('/').ok_or_else(bad)?;
    let n = n.trim();
    let n = n.strip_suffix('r').unwrap_or(n);
    let count: u32 = n.parse().ok().filter(|c| *c > 0).ok_or_else(bad)?;
    let period = match unit.trim() {
        "s" => Duration::from_secs(1),
        "m" => Duration::from_secs(60),
        _ => return Err(bad()),
    };
    if count > 1_000_000 {
        return Err(format!("`{s}`: at most 1000000 requests a period"));
    }
    Ok(period / count)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_burst_passes_at_once_then_the_rate_holds() {
        // 10/s, burst 5: six at once (nginx's `burst=5 nodelay`), then one every 100 ms
        let l = RateLimiter::new(Duration::from_millis(100), 5, 100);
        let t0 = 1_000 * MS;
        for i in 0..6 {
            assert_eq!(l.check_at("a", t0), Verdict::Allowed, "request {i}");
        }
        let Verdict::Limited { retry_after } = l.check_at("a", t0) else {
            panic!("the seventh is limited");
        };
        assert_eq!(retry_after, Duration::from_millis(100));
        assert_eq!(l.check_at("b", t0), Verdict::Allowed, "another key");
        assert!(matches!(
            l.check_at("a", t0 + 50 * MS),
            Verdict::Limited { .. }
        ));
        assert_eq!(l.check_at("a", t0 + 100 * MS), Verdict::Allowed);
        assert!(matches!(
            l.check_at("a", t0 + 150 * MS),
            Verdict::Limited { .. }
        ));
        // a second later the whole burst is back
        for _ in 0..6 {
            assert_eq!(l.check_at("a", t0 + 1_200 * MS), Verdict::Allowed);
        }
    }

    #[test]
    fn a_million_distinct_keys_stay_at_the_cap() {
        let l = RateLimiter::new(Duration::from_secs(1), 0, 1000);
        for i in 0..1_000_000u32 {
            assert_eq!(l.check_at(i, 1), Verdict::Allowed);
        }
        assert_eq!((l.keys(), l.max_keys()), (1000, 1000));
        let held: usize = l.shards.iter().map(|(_, s)| s.lock().unwrap().len()).sum();
        assert_eq!(held, 1000);
        // the most recent keys are still limited
        assert!(matches!(l.check_at(999_999u32, 1), Verdict::Limited { .. }));
    }

    #[test]
    fn rates_as_written() {
        assert_eq!(parse_rate("10/s"), Ok(Duration::from_millis(100)));
        assert_eq!(parse_rate("30/m"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_rate("5r/s"), Ok(Duration::from_millis(200)));
        for bad in ["10", "0/s", "10/h", "x/s", "-1/s", "2000000/s"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
    }
}
