//! `rate_limit = { ..., scope = "fleet" }` (issue 40): one rate for the whole fleet, counted
//! in the fleet's store, decided on each node from a local budget.
//!
//! The store holds one GCRA arrival time per key (`{prefix}rl:{route}:{hash}`, in the store's
//! clock, with a time to live); a node leases permits from it in batches (the server's fleet
//! thread runs the lease script, see `runtime::fleet_limit`). A request spends a permit of
//! its key's local lease: no store round trip on a worker's event loop, ever. When the lease
//! runs low a refill is queued for the fleet thread ([`LeaseStore::lease`], which never
//! waits); a request that finds no permit while the refill is on its way is decided by the
//! per-node limit (the rate divided by the nodes seen) and, when it passes, owed to the
//! store: the next lease of the key pays it first. So what the nodes let through is what the
//! store counted, give or take what is owed and not yet paid.
//!
//! A batch is at most [`LEASE_SPAN`] of the fleet's rate (at least one permit), sized to the
//! key's recent rate on this node; permits unused after [`LEASE_LIFE`] are dropped. With the
//! store away (the fleet client disconnected, or a lease failed lately), every request is
//! decided by the per-node limit at `rate / nodes seen`.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::rate_limit::KeyTable;
use super::{RateLimiter, Verdict};

/// The most of the fleet's rate one lease takes: a batch is at most this long at the rate.
pub const LEASE_SPAN: Duration = Duration::from_millis(50);
/// How long leased permits stay usable.
pub const LEASE_LIFE: Duration = Duration::from_secs(1);
/// The window a key's recent rate on this node is measured over.
const WINDOW_NS: u64 = 100_000_000;

/// The fleet's store, as the limiter sees it (the server's fleet client).
pub trait LeaseStore: Send + Sync {
    /// Queues `req` for the store; never waits. False when it cannot be queued.
    fn lease(&self, req: LeaseRequest) -> bool;
    /// Whether leases are answered now (the store connected, no lease failed lately).
    fn available(&self) -> bool;
    /// The nodes of the fleet seen in the store's heartbeats (at least 1).
    fn nodes(&self) -> u64;
}

/// One refill of a key's lease, for the fleet thread.
#[derive(Debug)]
#[non_exhaustive]
pub struct LeaseRequest {
    /// The limiter to answer ([`FleetLimiter::granted`], [`FleetLimiter::failed`]).
    pub limiter: Arc<FleetLimiter>,
    /// The key's slot in the limiter's table.
    pub slot: u64,
    /// The key as counted (the client's address bytes, the header's or cookie's value).
    pub key: Box<[u8]>,
    /// Requests let through while no permit was at hand, to count first.
    pub debt: u32,
    /// Permits asked for.
    pub want: u32,
}

/// A key's lease on this node.
#[derive(Debug, Default)]
struct Lease {
    permits: u32,
    /// When the permits stop being usable (ns of the limiter's clock).
    expires: u64,
    /// The store said no until then.
    denied_until: u64,
    pending: bool,
    debt: u32,
    window: u64,
    count: u32,
    recent: u32,
}

/// What a request found in its key's lease.
enum Found {
    Verdict(Verdict),
    /// No permit at hand: the per-node limit decides (and what passes is owed).
    Local,
}

/// A fleet-wide rate limit's state on this node.
pub struct FleetLimiter {
    /// The per-node limit: the store away, or a refill on its way.
    local: Arc<RateLimiter>,
    leases: KeyTable<Lease>,
    /// The store and the route's name in it, once the server attached them.
    store: OnceLock<(Arc<dyn LeaseStore>, String)>,
    interval_ns: u64,
    /// The most permits one lease asks for ([`LEASE_SPAN`] at the rate, at least 1).
    max_batch: u32,
    fallback: AtomicBool,
    reported: AtomicBool,
    base: Instant,
}

impl std::fmt::Debug for FleetLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetLimiter")
            .field("local", &self.local)
            .field("route", &self.store.get().map(|(_, r)| r))
            .finish_non_exhaustive()
    }
}

impl FleetLimiter {
    /// The fleet's limit at `local`'s rate and burst, with at most `max_keys` leases.
    pub fn new(local: Arc<RateLimiter>, max_keys: usize) -> FleetLimiter {
        let interval_ns = u64::try_from(local.interval().as_nanos()).unwrap_or(u64::MAX);
        let span = u64::try_from(LEASE_SPAN.as_nanos()).unwrap_or(u64::MAX);
        let max_batch = u32::try_from(span / interval_ns.max(1))
            .unwrap_or(u32::MAX)
            .max(1);
        FleetLimiter {
            local,
            leases: KeyTable::new(max_keys),
            store: OnceLock::new(),
            interval_ns,
            max_batch,
            fallback: AtomicBool::new(false),
            reported: AtomicBool::new(false),
            base: Instant::now(),
        }
    }

    /// Puts the fleet's store behind this limit, the route named `route` in it (once: a
    /// reload makes new limiters). Until then it limits as one node alone.
    pub fn attach(&self, store: Arc<dyn LeaseStore>, route: String) {
        let _ = self.store.set((store, route));
    }

    /// The route's name in the store.
    pub fn route(&self) -> &str {
        self.store.get().map_or("", |(_, r)| r)
    }

    /// The time between two requests at the fleet's rate.
    pub fn interval(&self) -> Duration {
        self.local.interval()
    }

    /// `burst` of the fleet's limit.
    pub fn burst(&self) -> u32 {
        self.local.burst()
    }

    /// Whether the last request was decided by the per-node limit because the store is away.
    pub fn fallback(&self) -> bool {
        self.fallback.load(Relaxed)
    }

    /// `Some(fallback)` once after each change of [`FleetLimiter::fallback`], for the log.
    pub fn transition(&self) -> Option<bool> {
        let now = self.fallback.load(Relaxed);
        (self.reported.swap(now, Relaxed) != now).then_some(now)
    }

    fn now(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Counts one request of `key` now.
    pub fn check(self: &Arc<Self>, key: &[u8]) -> Verdict {
        let Some((store, _)) = self.store.get() else {
            return self.local.check(key);
        };
        if !store.available() {
            self.fallback.store(true, Relaxed);
            self.local.share(store.nodes());
            return self.local.check(key);
        }
        if self.fallback.load(Relaxed) {
            self.fallback.store(false, Relaxed);
        }
        let now = self.now();
        let slot = self.leases.hash(key);
        // the lease's lock, then the node limit's (never the other way round)
        let (verdict, refill) = self.leases.with(slot, Lease::default, |l| {
            let (found, refill) = self.spend(l, now);
            match found {
                Found::Verdict(v) => (v, refill),
                Found::Local => {
                    self.local.share(store.nodes());
                    let v = self.local.check(key);
                    let owed = u32::from(v == Verdict::Allowed);
                    // owed with the refill asked for now, if one is
                    match refill {
                        Some((debt, want)) => (v, Some((debt.saturating_add(owed), want))),
                        None => {
                            l.debt = l.debt.saturating_add(owed);
                            (v, None)
                        }
                    }
                }
            }
        });
        if let Some((debt, want)) = refill {
            let req = LeaseRequest {
                limiter: self.clone(),
                slot,
                key: key.into(),
                debt,
                want,
            };
            if !store.lease(req) {
                self.failed(slot);
            }
        }
        verdict
    }

    /// One request on lease `l` at `now`: what it found, and the refill to ask for (what
    /// is owed, permits wanted), if any.
    fn spend(&self, l: &mut Lease, now: u64) -> (Found, Option<(u32, u32)>) {
        if now.saturating_sub(l.window) >= WINDOW_NS {
            let gap = now.saturating_sub(l.window);
            l.recent = if gap < 2 * WINDOW_NS { l.count } else { 0 };
            l.window = now;
            l.count = 0;
        }
        l.count = l.count.saturating_add(1);
        if l.expires <= now {
            l.permits = 0;
        }
        // half of the recent window's count: about LEASE_SPAN of this key's rate here
        let want = (l.recent.max(l.count) / 2).clamp(1, self.max_batch);
        let found = if l.permits > 0 {
            l.permits -= 1;
            Found::Verdict(Verdict::Allowed)
        } else if l.denied_until > now {
            Found::Verdict(Verdict::Limited {
                retry_after: Duration::from_nanos(l.denied_until - now),
            })
        } else {
            Found::Local
        };
        let low = l.permits <= want / 2;
        if l.pending || l.denied_until > now || !low {
            return (found, None);
        }
        l.pending = true;
        let debt = std::mem::take(&mut l.debt);
        (found, Some((debt, want)))
    }

    /// The store's answer to the lease of `slot`: `permits` more, or none and the wait until
    /// the next one.
    pub fn granted(&self, slot: u64, permits: u32, wait: Duration) {
        let now = self.now();
        self.leases.with_existing(slot, |l| {
            l.pending = false;
            if permits > 0 {
                l.permits = l
                    .permits
                    .saturating_add(permits)
                    .min(self.max_batch.saturating_mul(2));
                l.expires = now.saturating_add(LEASE_LIFE.as_nanos() as u64);
                l.denied_until = 0;
            } else {
                let wait = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
                l.denied_until = now.saturating_add(wait.max(1));
            }
        });
    }

    /// The lease of `slot` was not answered (the store away, late or garbled): the per-node
    /// limit decides its requests until the next one.
    pub fn failed(&self, slot: u64) {
        self.leases.with_existing(slot, |l| l.pending = false);
    }

    /// Keys with a lease held now.
    pub fn keys(&self) -> usize {
        self.leases.keys()
    }

    /// The time between two requests at the fleet's rate, ns (for the store's script).
    pub fn interval_ns(&self) -> u64 {
        self.interval_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::sync::Mutex;

    /// A store that keeps what it is asked and is up or down as told.
    #[derive(Default)]
    struct Queue {
        asked: Mutex<Vec<LeaseRequest>>,
        down: AtomicBool,
        nodes: AtomicU64,
    }

    impl LeaseStore for Queue {
        fn lease(&self, req: LeaseRequest) -> bool {
            self.asked.lock().unwrap().push(req);
            true
        }
        fn available(&self) -> bool {
            !self.down.load(Relaxed)
        }
        fn nodes(&self) -> u64 {
            self.nodes.load(Relaxed).max(1)
        }
    }

    fn limiter(per_sec: u32, burst: u32) -> (Arc<FleetLimiter>, Arc<Queue>) {
        let local = Arc::new(RateLimiter::new(
            Duration::from_secs(1) / per_sec,
            burst,
            100,
        ));
        let l = Arc::new(FleetLimiter::new(local, 100));
        let q = Arc::new(Queue::default());
        l.attach(q.clone(), "/r".into());
        (l, q)
    }

    #[test]
    fn leased_permits_are_spent_locally_and_owed_requests_paid_with_the_next_lease() {
        let (l, q) = limiter(1000, 0);
        // the first request: no lease yet, the node's limit lets it through and owes it
        assert_eq!(l.check(b"k"), Verdict::Allowed);
        let first = q.asked.lock().unwrap().remove(0);
        assert_eq!((first.debt, first.want, &*first.key), (1, 1, &b"k"[..]));
        assert!(!l.fallback());
        // while the refill is on its way nothing more is asked
        assert!(matches!(l.check(b"k"), Verdict::Limited { .. }));
        assert!(q.asked.lock().unwrap().is_empty());
        l.granted(first.slot, 3, Duration::ZERO);
        // three permits, the refill asked for before they run out, with the debt
        for _ in 0..3 {
            assert_eq!(l.check(b"k"), Verdict::Allowed);
        }
        let next = q.asked.lock().unwrap().remove(0);
        assert_eq!(next.debt, 0, "paid with the first lease");
        // the store says none for 40 ms: limited without asking again
        l.granted(next.slot, 0, Duration::from_millis(40));
        let Verdict::Limited { retry_after } = l.check(b"k") else {
            panic!("denied by the store");
        };
        assert!(retry_after > Duration::from_millis(30), "{retry_after:?}");
        assert!(q.asked.lock().unwrap().is_empty());
    }

    #[test]
    fn the_store_away_limits_each_node_at_its_share() {
        let (l, q) = limiter(10, 0);
        q.down.store(true, Relaxed);
        q.nodes.store(2, Relaxed);
        assert_eq!(l.transition(), None);
        assert_eq!(l.check(b"k"), Verdict::Allowed);
        assert_eq!(l.transition(), Some(true));
        assert_eq!(l.transition(), None);
        // 10/s over two nodes: one every 200 ms here
        let Verdict::Limited { retry_after } = l.check(b"k") else {
            panic!("limited at the node's share");
        };
        assert!(retry_after > Duration::from_millis(150), "{retry_after:?}");
        assert!(
            q.asked.lock().unwrap().is_empty(),
            "no lease with the store away"
        );
        q.down.store(false, Relaxed);
        let _ = l.check(b"other");
        assert_eq!(l.transition(), Some(false));
    }

    #[test]
    fn a_million_distinct_keys_stay_at_the_cap() {
        let (l, q) = limiter(1000, 0);
        for i in 0..1_000_000u32 {
            let _ = l.check(&i.to_be_bytes());
            if i % 1000 == 0 {
                q.asked.lock().unwrap().clear();
            }
        }
        assert_eq!(l.keys(), 100);
        assert_eq!(l.leases.held(), 100);
    }
}
