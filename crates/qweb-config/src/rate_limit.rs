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
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use lru::LruCache;
use serde::Deserialize;
use toml::Spanned;

use super::{ConfigError, FleetLimiter, HashKey, Validator};

/// `max_keys` when the route does not say.
pub const DEFAULT_RATE_LIMIT_KEYS: usize = 100_000;

/// The most `max_keys` may be (about 80 bytes a key: 80 MB).
pub const MAX_RATE_LIMIT_KEYS: usize = 1_000_000;

/// The most `burst` may be.
pub const MAX_RATE_LIMIT_BURST: u32 = 1_000_000;

/// Shards of a limiter's key table (fewer when `max_keys` is smaller).
const SHARDS: usize = 16;

/// `rate_limit = { rate, burst, key, dry_run, max_keys, scope }` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRateLimit {
    pub rate: Spanned<String>,
    pub burst: Option<Spanned<i64>>,
    pub key: Option<Spanned<String>>,
    pub dry_run: Option<bool>,
    pub max_keys: Option<Spanned<i64>>,
    pub scope: Option<Spanned<String>>,
}

/// A route's rate limit.
#[derive(Debug, Clone)]
pub struct RateLimit {
    /// What is counted: the client address, a header's value or a cookie's. A request
    /// without the header or cookie is not counted (as nginx's `limit_req` with an empty key).
    pub key: HashKey,
    /// Count and log, but refuse nothing.
    pub dry_run: bool,
    /// The keys' state, shared by the workers (under `scope = "fleet"`, the per-node limit
    /// used while the fleet's store is away).
    pub state: Arc<RateLimiter>,
    /// `scope = "fleet"`: the rate is the whole fleet's, counted in the fleet's store.
    pub fleet: Option<Arc<FleetLimiter>>,
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

/// One shard of a key table: key hash to its value.
type Shard<V> = Mutex<LruCache<u64, V>>;

/// A bounded table of per-key state: at most `max_keys` keys in [`SHARDS`] least recently
/// used shards (the node limiter's and the fleet limiter's leases).
pub(crate) struct KeyTable<V> {
    /// Unbounded maps capped by hand, so no table is allocated for keys that never come.
    /// Each shard with its cap (together `max_keys`).
    shards: Box<[(usize, Shard<V>)]>,
    hasher: RandomState,
    keys: AtomicUsize,
}

impl<V> KeyTable<V> {
    /// A table of at most `max_keys` keys (at least one is kept).
    pub(crate) fn new(max_keys: usize) -> KeyTable<V> {
        let max_keys = max_keys.max(1);
        let n = max_keys.min(SHARDS);
        KeyTable {
            shards: (0..n)
                .map(|i| {
                    let cap = max_keys / n + usize::from(i < max_keys % n);
                    (cap, Mutex::new(LruCache::unbounded()))
                })
                .collect(),
            hasher: RandomState::new(),
            keys: AtomicUsize::new(0),
        }
    }

    /// The most keys held at once.
    pub(crate) fn max_keys(&self) -> usize {
        self.shards.iter().map(|(cap, _)| cap).sum()
    }

    /// Keys held now.
    pub(crate) fn keys(&self) -> usize {
        self.keys.load(Relaxed)
    }

    /// The slot of `key` in this table.
    pub(crate) fn hash(&self, key: impl Hash) -> u64 {
        self.hasher.hash_one(key)
    }

    fn shard(&self, h: u64) -> &(usize, Shard<V>) {
        &self.shards[((h >> 32) as usize) % self.shards.len()]
    }

    /// `f` on the value of slot `h`, made with `new` when absent (at the cap, the least
    /// recently seen key of the shard is forgotten).
    pub(crate) fn with<R>(
        &self,
        h: u64,
        new: impl FnOnce() -> V,
        f: impl FnOnce(&mut V) -> R,
    ) -> R {
        let (cap, shard) = self.shard(h);
        let mut map = shard.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(v) = map.get_mut(&h) {
            return f(v);
        }
        if map.len() >= *cap {
            map.pop_lru();
        } else {
            self.keys.fetch_add(1, Relaxed);
        }
        f(map.get_or_insert_mut(h, new))
    }

    /// `f` on the value of slot `h` if it is still held.
    pub(crate) fn with_existing<R>(&self, h: u64, f: impl FnOnce(&mut V) -> R) -> Option<R> {
        let (_, shard) = self.shard(h);
        let mut map = shard.lock().unwrap_or_else(PoisonError::into_inner);
        map.peek_mut(&h).map(f)
    }

    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.shards
            .iter()
            .map(|(_, s)| s.lock().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }
}

/// Keyed GCRA state, bounded to `max_keys` keys (hashed: a key's length costs nothing).
pub struct RateLimiter {
    /// Time between two requests at the configured rate, in nanoseconds.
    rate_interval: u64,
    /// `burst` as configured.
    burst: u32,
    /// Time between two requests now (`rate_interval` times the share, see
    /// [`RateLimiter::share`]).
    interval: AtomicU64,
    /// How far ahead of now a key's arrival time may be: `burst` intervals.
    tolerance: AtomicU64,
    /// The nodes the rate is shared by (1: all of it).
    nodes: AtomicU64,
    table: KeyTable<u64>,
    base: Instant,
}

impl std::fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter")
            .field("interval_ns", &self.rate_interval)
            .field("burst", &self.burst)
            .field("max_keys", &self.max_keys())
            .finish()
    }
}

impl RateLimiter {
    /// One request every `interval`, `burst` more at once, at most `max_keys` keys (at least
    /// one is kept).
    pub fn new(interval: Duration, burst: u32, max_keys: usize) -> RateLimiter {
        let interval = u64::try_from(interval.as_nanos())
            .unwrap_or(u64::MAX)
            .max(1);
        RateLimiter {
            rate_interval: interval,
            burst,
            interval: AtomicU64::new(interval),
            tolerance: AtomicU64::new(interval.saturating_mul(u64::from(burst))),
            nodes: AtomicU64::new(1),
            table: KeyTable::new(max_keys),
            base: Instant::now(),
        }
    }

    /// The time between two requests at the configured rate.
    pub fn interval(&self) -> Duration {
        Duration::from_nanos(self.rate_interval)
    }

    /// `burst` as configured.
    pub fn burst(&self) -> u32 {
        self.burst
    }

    /// Limits at the rate divided by `nodes` (at least 1), each node's share of a fleet's
    /// rate, with the burst divided likewise (rounded up); 1 is the whole rate.
    pub fn share(&self, nodes: u64) {
        let n = nodes.max(1);
        if self.nodes.swap(n, Relaxed) == n {
            return;
        }
        let interval = self.rate_interval.saturating_mul(n);
        self.interval.store(interval, Relaxed);
        let burst = u64::from(self.burst).div_ceil(n);
        self.tolerance
            .store(interval.saturating_mul(burst), Relaxed);
    }

    /// The most keys held at once.
    pub fn max_keys(&self) -> usize {
        self.table.max_keys()
    }

    /// Keys held now.
    pub fn keys(&self) -> usize {
        self.table.keys()
    }

    /// Counts one request of `key` now.
    pub fn check(&self, key: impl Hash) -> Verdict {
        let now = u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.check_at(key, now)
    }

    /// Counts one request of `key` at `now` nanoseconds after the limiter was made.
    fn check_at(&self, key: impl Hash, now: u64) -> Verdict {
        let h = self.table.hash(key);
        let interval = self.interval.load(Relaxed);
        let tolerance = self.tolerance.load(Relaxed);
        // a key absent (or forgotten at the cap) is a key whose arrival time has passed
        self.table.with(
            h,
            || 0,
            |tat| {
                let t = (*tat).max(now);
                if t - now > tolerance {
                    return Verdict::Limited {
                        retry_after: Duration::from_nanos(t - now - tolerance),
                    };
                }
                *tat = t.saturating_add(interval);
                Verdict::Allowed
            },
        )
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
        let fleet = match &raw.scope {
            None => false,
            Some(s) => match s.get_ref().as_str() {
                "node" => false,
                "fleet" if self.has_fleet => true,
                "fleet" => {
                    return Err(self.err(
                        Some(s.span()),
                        format!("{k}.scope"),
                        "`scope = \"fleet\"` needs a `[fleet]` section (the store the nodes share)",
                    ))
                }
                other => {
                    return Err(self.err(
                        Some(s.span()),
                        format!("{k}.scope"),
                        format!("`{other}`: \"node\" (this process's count) or \"fleet\" (the fleet's store)"),
                    ))
                }
            },
        };
        let hash_key = match &raw.key {
            None => HashKey::ClientIp,
            Some(s) => self.hash_key(format!("{k}.key"), s)?,
        };
        let state = Arc::new(RateLimiter::new(interval, burst, max_keys));
        Ok(RateLimit {
            key: hash_key,
            dry_run: raw.dry_run.unwrap_or(false),
            fleet: fleet.then(|| Arc::new(FleetLimiter::new(state.clone(), max_keys))),
            state,
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
        assert_eq!(l.table.held(), 1000);
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
