//! The memory store: one per server, shared by every worker (a lookup or fill takes one
//! short lock), bounded in bytes; evicted by S3-FIFO ([`Eviction`]: new keys wait in a small
//! queue, so one-hit wonders and scans leave before the keys asked again). Each key holds the
//! variants its `Vary` selects between. In-flight fills are tracked per key so that
//! concurrent misses wait for one fill instead of all going upstream; a fill that is streamed
//! ([`crate::Pending::share`]) hands its waiters its head and growing body as soon as it has
//! them ([`FillGuard::publish`], [`crate::InFlight`]), so that they need not wait for its end.
//!
//! A purge or invalidation also reaches the fills in flight: a response the origin produced
//! before a key was purged (its fill began before) is not stored after the purge, so that once
//! a purge has answered, nothing fetched before it is served ([`Store::epoch`],
//! [`Store::insert_since`]).
//!
//! **The disk tier** ([`Store::open`]; `disk`, [`crate::format`]) is written
//! through: every response stored in memory is also queued for the disk, so what a restart
//! finds is everything stored, not only what memory had evicted (a write-back tier would lose
//! the hottest objects, the ones still in memory, at every restart or crash). One writer
//! thread per store takes the queue (a channel whose writes are bounded by
//! [`MAX_QUEUED_WRITES`] and [`MAX_QUEUED_BYTES`]: beyond, the write is skipped and counted in
//! [`Stats::disk_skipped`]; removals are never skipped), writes each entry to a temporary
//! file, renames it into place and only then adds it to the disk index, unless the key was
//! purged since its fill began (then the file is removed: the purge epoch holds for disk too).
//! A memory miss asks [`Store::lookup_disk`]: the index (under the same lock) names a file,
//! which a blocking task reads whole and checks ([`crate::format::decode`]); a good one is
//! promoted to memory, a bad one removed and never served. Purges remove index entries at
//! once (nothing purged is served from disk from then) and their files through the writer.
//! No file IO runs on a worker's event loop and none under the lock.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use http::HeaderMap;
use tokio::sync::watch;

use crate::disk::Index;
use crate::policy::Meta;
use crate::shared::InFlight;

mod evict;
mod tier;
pub use evict::{Eviction, MIN_GHOSTS, SMALL_SHARE};
use evict::{Keys, Weigh};
use tier::Writer;

/// What every entry costs beyond its body and fields (the key's slot, the map, the `Arc`s).
const ENTRY_OVERHEAD: usize = 256;

/// How many of the latest purges and invalidations the store remembers for the fills in flight;
/// a fill older than all of them is not stored (it may have missed one).
const PURGE_LOG: usize = 1024;

/// Disk writes queued at most; a store beyond it is not written to disk (counted).
pub const MAX_QUEUED_WRITES: usize = 256;

/// Body bytes of the queued disk writes at most (the queue holds the bodies alive even when
/// memory evicted them).
pub const MAX_QUEUED_BYTES: usize = 64 << 20;

/// What a purge or invalidation removed.
#[derive(Debug)]
enum Purged {
    Key(String),
    Prefix(String),
}

impl Purged {
    fn covers(&self, key: &str) -> bool {
        match self {
            Purged::Key(k) => k == key,
            Purged::Prefix(p) => key.starts_with(p.as_str()),
        }
    }
}

/// The store's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// Bytes held at most (bodies, fields, keys and a fixed overhead per entry).
    pub memory: usize,
    /// The largest body stored; larger responses stream through unstored.
    pub max_object_size: usize,
    /// Bytes of entry files held on disk at most (a store opened without a disk tier
    /// ignores it).
    pub disk: u64,
}

impl Limits {
    /// Limits of `memory` bytes with bodies up to `max_object_size`, no disk.
    pub fn new(memory: usize, max_object_size: usize) -> Limits {
        Limits {
            memory,
            max_object_size,
            disk: 0,
        }
    }

    /// These limits with `disk` bytes on disk.
    pub fn with_disk(self, disk: u64) -> Limits {
        Limits { disk, ..self }
    }
}

/// A stored response: its head and its whole body.
#[derive(Debug)]
#[non_exhaustive]
pub struct Entry {
    /// The head, with what age and freshness are computed from.
    pub meta: Meta,
    /// The body.
    pub body: Bytes,
    /// A large body's sealed memfd, whose mapping [`Entry::body`] is (`crate::memfd`): a
    /// plain HTTP/1.1 response sends it with `sendfile(2)`.
    pub file: Option<qweb_http::body::FileBytes>,
    /// Names the body in the process (never reused): what compressed variants of it are
    /// kept under ([`StoredBody`]).
    pub id: u64,
}

/// Marks a response whose body is a stored entry's whole body, for the compression layer's
/// variant cache: a hit is compressed once per encoding and worker, then served encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoredBody {
    /// The entry's [`Entry::id`].
    pub id: u64,
    /// The body's length.
    pub len: u64,
}

impl StoredBody {
    /// The mark for `entry`'s body.
    pub fn of(entry: &Entry) -> StoredBody {
        StoredBody {
            id: entry.id,
            len: entry.body.len() as u64,
        }
    }
}

impl Entry {
    /// An entry of `meta` and `body`, with a new id.
    pub fn new(meta: Meta, body: Bytes) -> Entry {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let file = crate::memfd::seal(&body);
        Entry {
            meta,
            body: file.as_ref().map_or(body, |f| f.bytes.clone()),
            file,
            id: NEXT.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// An entry of `meta` with `old`'s body (its file and id too: the same bytes, so its
    /// compressed variants stay valid).
    pub fn reusing(meta: Meta, old: &Entry) -> Entry {
        Entry {
            meta,
            body: old.body.clone(),
            file: old.file.clone(),
            id: old.id,
        }
    }

    /// What the entry counts against [`Limits::memory`].
    fn cost(&self, key: &str) -> usize {
        let fields: usize = self
            .meta
            .headers
            .iter()
            .map(|(n, v)| n.as_str().len() + v.len() + 32)
            .sum();
        let vary: usize = self
            .meta
            .vary
            .iter()
            .map(|(n, v)| n.len() + v.as_ref().map_or(0, Vec::len) + 32)
            .sum();
        self.body.len() + fields + vary + key.len() + ENTRY_OVERHEAD
    }
}

/// The counters of the store, read by `/metrics`.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct Stats {
    /// Requests answered from the store without the origin.
    pub hits: AtomicU64,
    /// Requests that found nothing usable stored and went to the origin.
    pub misses: AtomicU64,
    /// Stale responses served (the request allowed it, or the origin failed).
    pub stale: AtomicU64,
    /// Stored responses the origin confirmed with a `304`.
    pub revalidated: AtomicU64,
    /// Requests that waited for another request's fill of the same key.
    pub collapsed: AtomicU64,
    /// Requests of a cached route the cache did not take part in (methods other than
    /// GET and HEAD, upgrades).
    pub bypass: AtomicU64,
    /// Responses stored.
    pub stored: AtomicU64,
    /// Responses not stored because their body was over [`Limits::max_object_size`].
    pub too_large: AtomicU64,
    /// Fills abandoned before the body's end (client gone, upstream error).
    pub abandoned: AtomicU64,
    /// Entries evicted to stay within [`Limits::memory`].
    pub evictions: AtomicU64,
    /// Of [`Stats::evictions`], entries that left S3-FIFO's small queue never hit since they
    /// were stored: one-hit wonders kept out of the main queue ([`Eviction`]).
    pub one_hit_evictions: AtomicU64,
    /// Entries removed by unsafe methods and purges.
    pub invalidated: AtomicU64,
    /// Entries held now.
    pub objects: AtomicU64,
    /// Bytes held now (as counted against [`Limits::memory`]).
    pub bytes: AtomicU64,
    /// Fills not stored because their key was purged or invalidated while they were in flight.
    pub superseded: AtomicU64,
    /// Requests answered from a disk entry (promoted to memory).
    pub disk_hits: AtomicU64,
    /// Entries written to disk.
    pub disk_stored: AtomicU64,
    /// Disk writes skipped because the writer's queue was full.
    pub disk_skipped: AtomicU64,
    /// Disk entries dropped (removed, never served): corrupt, truncated, another version.
    pub disk_dropped: AtomicU64,
    /// Disk errors: the folder not made or read, a write, read or removal that failed.
    pub disk_errors: AtomicU64,
    /// Disk entries evicted to stay within [`Limits::disk`].
    pub disk_evictions: AtomicU64,
    /// Entries on disk now.
    pub disk_objects: AtomicU64,
    /// Bytes of entry files on disk now.
    pub disk_bytes: AtomicU64,
}

/// The variants of one key.
#[derive(Default)]
struct Slot {
    variants: Vec<(Arc<Entry>, usize)>,
}

impl Weigh for Slot {
    fn weight(&self) -> usize {
        self.variants.iter().map(|(_, cost)| cost).sum()
    }
}

struct Inner {
    keys: Keys<Slot>,
    bytes: usize,
    objects: usize,
    /// The fills in flight: what their waiters are told (the head and body once streamed).
    fills: HashMap<String, watch::Sender<Option<InFlight>>>,
    limits: Limits,
    /// Purges and invalidations so far.
    epoch: u64,
    /// The latest of them ([`PURGE_LOG`] at most), with the epoch each one made.
    purges: VecDeque<(u64, Purged)>,
    /// The disk tier's index, when there is one.
    disk: Option<Index>,
}

impl Inner {
    fn purged(&mut self, what: Purged) {
        self.epoch += 1;
        if self.purges.len() == PURGE_LOG {
            self.purges.pop_front();
        }
        self.purges.push_back((self.epoch, what));
    }

    /// A purge or invalidation after `epoch` covers `key`, or may have (forgotten).
    fn purged_since(&self, key: &str, epoch: u64) -> bool {
        if self.epoch == epoch {
            return false;
        }
        if self.purges.front().is_none_or(|(e, _)| *e > epoch + 1) {
            return true;
        }
        self.purges
            .iter()
            .rev()
            .take_while(|(e, _)| *e > epoch)
            .any(|(_, p)| p.covers(key))
    }
}

/// The shared store: memory, and the disk tier when opened with one.
pub struct Store {
    inner: Mutex<Inner>,
    stats: Stats,
    writer: Option<Writer>,
    /// A disk error was logged (later ones are only counted).
    logged: AtomicBool,
}

impl Drop for Store {
    fn drop(&mut self) {
        // the writer finishes what was queued (removals included) and ends with the channel
        if let Some(w) = self.writer.take() {
            drop(w.tx);
            if let Some(t) = w.thread {
                if t.thread().id() != std::thread::current().id() {
                    let _ = t.join();
                }
            }
        }
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("stats", &self.stats).finish()
    }
}

/// What a miss does: fill the key itself, or wait for the fill already running (matched
/// exhaustively by callers: not `non_exhaustive`).
#[derive(Debug)]
pub enum Fill {
    /// This request fills the key; dropping the guard (stored or not) wakes the waiters.
    Lead(FillGuard),
    /// Another request fills it: wait for this to hold the fill's head and body (a streamed
    /// fill), or to close (the fill ended, stored or not), then look again.
    Wait(watch::Receiver<Option<InFlight>>),
}

/// Held by the request that fills a key; dropped when its fill ended, stored or not.
#[derive(Debug)]
pub struct FillGuard {
    store: Arc<Store>,
    key: String,
}

impl FillGuard {
    /// Hands the fill's head and growing body to the requests waiting on its key, and to
    /// those that join it from now on.
    pub fn publish(&self, fill: InFlight) {
        if let Some(tx) = self.store.lock().fills.get(&self.key) {
            tx.send_replace(Some(fill));
        }
    }
}

impl Drop for FillGuard {
    fn drop(&mut self) {
        // dropping the sender wakes every waiter
        self.store.lock().fills.remove(&self.key);
    }
}

impl Store {
    /// An empty store bounded by `limits`, in memory only.
    pub fn new(limits: Limits) -> Arc<Store> {
        Arc::new(Store::bare(limits, None, None))
    }

    fn bare(limits: Limits, disk: Option<Index>, writer: Option<Writer>) -> Store {
        Store {
            inner: Mutex::new(Inner {
                keys: Keys::new(Eviction::default(), limits.memory),
                bytes: 0,
                objects: 0,
                fills: HashMap::new(),
                limits,
                epoch: 0,
                purges: VecDeque::new(),
                disk,
            }),
            stats: Stats::default(),
            writer,
            logged: AtomicBool::new(false),
        }
    }

    /// An empty store bounded by `limits`, in memory only, evicting by `eviction` (the server
    /// uses [`Store::new`]'s default; the others are there to compare with).
    pub fn with_eviction(limits: Limits, eviction: Eviction) -> Arc<Store> {
        let mut store = Store::bare(limits, None, None);
        store
            .inner
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .keys = Keys::new(eviction, limits.memory);
        Arc::new(store)
    }

    /// The counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The bounds now.
    pub fn limits(&self) -> Limits {
        self.lock().limits
    }

    /// New bounds (a reload): entries over them are evicted at once.
    pub fn set_limits(&self, limits: Limits) {
        let mut inner = self.lock();
        inner.limits = limits;
        inner.keys.set_memory(limits.memory);
        let over = inner.bytes.saturating_sub(limits.memory);
        self.evict(&mut inner, over, 0);
        let max = limits.max_object_size;
        let keys: Vec<String> = inner
            .keys
            .iter()
            .filter(|(_, s)| s.variants.iter().any(|(e, _)| e.body.len() > max))
            .map(|(k, _)| k.to_owned())
            .collect();
        for k in keys {
            self.remove_where(&mut inner, &k, |e| e.body.len() > max);
        }
        let mut gone = Vec::new();
        if let Some(ix) = inner.disk.as_mut() {
            ix.limit = limits.disk;
            let before = ix.evicted;
            gone = ix.evict();
            let evicted = ix.evicted - before;
            let keys: Vec<String> = ix
                .keys
                .iter()
                .filter(|(_, vs)| vs.iter().any(|v| v.body_len > max as u64))
                .map(|(k, _)| k.clone())
                .collect();
            for k in keys {
                gone.extend(ix.remove_where(&k, |v| v.body_len > max as u64));
            }
            self.stats
                .disk_evictions
                .fetch_add(evicted, Ordering::Relaxed);
        }
        self.remove_files(gone);
        self.publish(&inner);
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // a panic while holding the lock leaves counts that are at worst approximate
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The most recent stored variant of `key` whose `Vary` fields match `req`.
    pub fn lookup(&self, key: &str, req: &HeaderMap) -> Option<Arc<Entry>> {
        let mut inner = self.lock();
        if let Some(ix) = inner.disk.as_mut() {
            // a memory hit keeps the disk copy recent too
            ix.keys.promote(key);
        }
        let slot = inner.keys.get(key)?;
        slot.variants
            .iter()
            .rev()
            .find(|(e, _)| e.meta.vary_matches(req))
            .map(|(e, _)| e.clone())
    }

    /// Starts a fill of `key`, or joins the one in flight.
    pub fn begin_fill(self: &Arc<Self>, key: &str) -> Fill {
        let mut inner = self.lock();
        if let Some(tx) = inner.fills.get(key) {
            return Fill::Wait(tx.subscribe());
        }
        inner.fills.insert(key.to_owned(), watch::Sender::new(None));
        Fill::Lead(FillGuard {
            store: self.clone(),
            key: key.to_owned(),
        })
    }

    /// Whether `key` was purged or invalidated since `epoch` ([`Store::epoch`]): a fill in
    /// flight that began before is then not served to the requests that join it.
    pub fn superseded(&self, key: &str, epoch: u64) -> bool {
        self.lock().purged_since(key, epoch)
    }

    /// Purges and invalidations so far: taken when a request goes to the origin, and given
    /// back to [`Store::insert_since`] with its response.
    pub fn epoch(&self) -> u64 {
        self.lock().epoch
    }

    /// Stores `entry` under `key`, replacing the variant with the same `Vary` values; false
    /// when it is over the limits.
    pub fn insert(&self, key: &str, entry: Entry) -> bool {
        let since = self.epoch();
        self.insert_since(key, entry, since)
    }

    /// [`Store::insert`] for a response whose request went to the origin at `epoch`
    /// ([`Store::epoch`]): not stored (false) when `key` was purged or invalidated since.
    pub fn insert_since(&self, key: &str, entry: Entry, epoch: u64) -> bool {
        let mut inner = self.lock();
        if inner.purged_since(key, epoch) {
            self.stats.superseded.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let Some(stored) = self.put(&mut inner, key, entry) else {
            self.stats.too_large.fetch_add(1, Ordering::Relaxed);
            return false;
        };
        self.stats.stored.fetch_add(1, Ordering::Relaxed);
        self.queue_write(&inner, key, stored);
        self.publish(&inner);
        true
    }

    /// Puts `entry` in memory (replacing the variant with the same `Vary` values); `None`
    /// when it is over the limits.
    fn put(&self, inner: &mut Inner, key: &str, entry: Entry) -> Option<Arc<Entry>> {
        let cost = entry.cost(key);
        if entry.body.len() > inner.limits.max_object_size || cost > inner.limits.memory {
            return None;
        }
        let vary = entry.meta.vary.clone();
        // the key keeps its place in the policy's queues (a refill is not a new key)
        self.drop_variants(inner, key, |e| e.meta.vary == vary);
        let need = (inner.bytes + cost).saturating_sub(inner.limits.memory);
        let incoming = inner.keys.small_part(key, cost);
        self.evict(inner, need, incoming);
        let entry = Arc::new(entry);
        inner
            .keys
            .upsert(key, |slot| slot.variants.push((entry.clone(), cost)));
        inner.bytes += cost;
        inner.objects += 1;
        Some(entry)
    }

    /// Replaces the stored `old` of `key` (when it is still there) by the same body with
    /// `meta` (a `304` updated it).
    pub fn update(&self, key: &str, old: &Arc<Entry>, meta: Meta) -> Arc<Entry> {
        // the same body: its compressed variants stay valid
        let new = Arc::new(Entry::reusing(meta, old));
        let mut inner = self.lock();
        let cost = new.cost(key);
        let delta = inner.keys.update(key, |slot| {
            let v = slot
                .variants
                .iter_mut()
                .find(|(e, _)| Arc::ptr_eq(e, old))?;
            let delta = cost as isize - v.1 as isize;
            *v = (new.clone(), cost);
            Some(delta)
        });
        let Some(delta) = delta.flatten() else {
            return new;
        };
        // the disk copy gets the new head too (a restart would otherwise revalidate)
        self.queue_write(&inner, key, new.clone());
        inner.bytes = inner.bytes.saturating_add_signed(delta);
        let over = inner.bytes.saturating_sub(inner.limits.memory);
        self.evict(&mut inner, over, 0);
        self.publish(&inner);
        new
    }

    /// Removes every variant of `key`; how many there were.
    pub fn invalidate(&self, key: &str) -> usize {
        let mut inner = self.lock();
        inner.purged(Purged::Key(key.to_owned()));
        let n = self.remove_where(&mut inner, key, |_| true);
        let gone = inner
            .disk
            .as_mut()
            .map(|ix| ix.remove_where(key, |_| true))
            .unwrap_or_default();
        // what only the disk held counts too (a purge answers how many it removed)
        let n = n.max(gone.len());
        self.remove_files(gone);
        self.stats
            .invalidated
            .fetch_add(n as u64, Ordering::Relaxed);
        self.publish(&inner);
        n
    }

    /// Removes the stored `entry` of `key` (when it is still there): the origin answered a
    /// request it would have served with a response that is not stored.
    pub fn remove_entry(&self, key: &str, entry: &Arc<Entry>) {
        let mut inner = self.lock();
        let target = Arc::as_ptr(entry);
        let n = self.remove_where(&mut inner, key, |e| std::ptr::eq(e, target));
        let vary = &entry.meta.vary;
        let gone = inner
            .disk
            .as_mut()
            .map(|ix| ix.remove_where(key, |v| v.sel.vary == *vary))
            .unwrap_or_default();
        self.remove_files(gone);
        self.stats
            .invalidated
            .fetch_add(n as u64, Ordering::Relaxed);
        self.publish(&inner);
    }

    /// Removes every variant of every key that starts with `prefix`; how many there were.
    pub fn purge_prefix(&self, prefix: &str) -> usize {
        let mut inner = self.lock();
        inner.purged(Purged::Prefix(prefix.to_owned()));
        let keys: Vec<String> = inner
            .keys
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(k, _)| k.to_owned())
            .collect();
        let n = keys
            .iter()
            .map(|k| self.remove_where(&mut inner, k, |_| true))
            .sum::<usize>();
        let gone = inner
            .disk
            .as_mut()
            .map(|ix| ix.remove_prefix(prefix))
            .unwrap_or_default();
        let n = n.max(gone.len());
        self.remove_files(gone);
        self.stats
            .invalidated
            .fetch_add(n as u64, Ordering::Relaxed);
        self.publish(&inner);
        n
    }

    /// Removes the variants of `key` that `which` picks, and the key when none is left; how
    /// many.
    fn remove_where(&self, inner: &mut Inner, key: &str, which: impl Fn(&Entry) -> bool) -> usize {
        let (removed, empty) = self.drop_variants(inner, key, which);
        if empty {
            inner.keys.remove(key);
        }
        removed
    }

    /// Removes the variants of `key` that `which` picks (the key stays, even empty); how many,
    /// and whether none is left.
    fn drop_variants(
        &self,
        inner: &mut Inner,
        key: &str,
        which: impl Fn(&Entry) -> bool,
    ) -> (usize, bool) {
        let dropped = inner.keys.update(key, |slot| {
            let before = slot.variants.len();
            let mut freed = 0;
            slot.variants.retain(|(e, cost)| {
                let keep = !which(e);
                if !keep {
                    freed += cost;
                }
                keep
            });
            (
                before - slot.variants.len(),
                freed,
                slot.variants.is_empty(),
            )
        });
        let Some((removed, freed, empty)) = dropped else {
            return (0, false);
        };
        inner.bytes -= freed;
        inner.objects -= removed;
        (removed, empty)
    }

    /// Evicts keys in the policy's order until `need` bytes were freed, `incoming` bytes being
    /// about to enter the small queue ([`Keys::small_part`]).
    fn evict(&self, inner: &mut Inner, need: usize, incoming: usize) {
        let mut freed = 0;
        while freed < need {
            let Some(victim) = inner.keys.evict(incoming) else {
                break;
            };
            let n = victim.value.variants.len() as u64;
            for (_, cost) in &victim.value.variants {
                freed += cost;
                inner.bytes -= cost;
                inner.objects -= 1;
            }
            self.stats.evictions.fetch_add(n, Ordering::Relaxed);
            if victim.one_hit {
                self.stats.one_hit_evictions.fetch_add(n, Ordering::Relaxed);
            }
        }
    }

    fn publish(&self, inner: &Inner) {
        self.stats
            .objects
            .store(inner.objects as u64, Ordering::Relaxed);
        self.stats
            .bytes
            .store(inner.bytes as u64, Ordering::Relaxed);
        if let Some(ix) = &inner.disk {
            self.stats.disk_objects.store(ix.objects, Ordering::Relaxed);
            self.stats.disk_bytes.store(ix.bytes, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderValue, StatusCode};
    use std::path::{Path, PathBuf};
    use std::time::SystemTime;

    fn entry(body: usize, vary: Option<&str>) -> Entry {
        let mut resp = HeaderMap::new();
        let mut req = HeaderMap::new();
        if let Some(v) = vary {
            resp.insert(http::header::VARY, HeaderValue::from_static("x-v"));
            req.insert("x-v", HeaderValue::from_str(v).unwrap());
        }
        let now = SystemTime::now();
        Entry::new(
            Meta::new(StatusCode::OK, &resp, &req, now, now),
            Bytes::from(vec![b'x'; body]),
        )
    }

    /// A fill whose request went out before a purge or invalidation of its key is not stored
    /// after it; one of another key is; a fill older than every purge the store remembers is
    /// not stored either (it may have missed one).
    #[test]
    fn a_purge_reaches_the_fills_in_flight() {
        let store = Store::new(Limits::new(1 << 20, 10_000));
        let before = store.epoch();
        store.invalidate("http://h/a");
        assert!(!store.insert_since("http://h/a", entry(1, None), before));
        assert!(store.insert_since("http://h/b", entry(1, None), before));
        assert!(store.insert_since("http://h/a", entry(1, None), store.epoch()));
        let before = store.epoch();
        store.purge_prefix("http://h/p/");
        assert!(!store.insert_since("http://h/p/x", entry(1, None), before));
        assert!(store.insert_since("http://h/q", entry(1, None), before));
        assert_eq!(store.stats().superseded.load(Ordering::Relaxed), 2);
        let old = store.epoch();
        for i in 0..=PURGE_LOG {
            store.invalidate(&format!("http://h/other/{i}"));
        }
        assert!(!store.insert_since("http://h/c", entry(1, None), old));
        let recent = store.epoch() - 1;
        assert!(store.insert_since("http://h/c", entry(1, None), recent));
    }

    #[test]
    fn memory_stays_bounded_with_many_keys() {
        let store = Store::new(Limits::new(100_000, 10_000));
        for i in 0..10_000 {
            store.insert(&format!("http://h/{i}"), entry(100, None));
            assert!(store.stats().bytes.load(Ordering::Relaxed) <= 100_000);
        }
        let objects = store.stats().objects.load(Ordering::Relaxed);
        assert!(objects > 100 && objects < 400, "{objects}");
        assert!(store.lookup("http://h/9999", &HeaderMap::new()).is_some());
        assert!(store.lookup("http://h/0", &HeaderMap::new()).is_none());
    }

    /// A hot set hit between passes of a scan (10 times the memory bound in keys asked once)
    /// stays stored under S3-FIFO; plain LRU loses it at the first pass (the same test with
    /// [`Eviction::Lru`] shows it).
    #[test]
    fn a_scan_does_not_evict_the_hot_set() {
        let run = |eviction| {
            let store = Store::with_eviction(Limits::new(1 << 20, 1 << 16), eviction);
            let hot: Vec<String> = (0..20).map(|i| format!("http://h/hot/{i}")).collect();
            for k in &hot {
                assert!(store.insert(k, entry(10_000, None)));
                assert!(store.lookup(k, &HeaderMap::new()).is_some());
            }
            let mut lost = 0;
            let mut once = 0;
            for _ in 0..10 {
                // more than one memory bound's worth of keys never asked again
                for _ in 0..110 {
                    once += 1;
                    let k = format!("http://h/once/{once}");
                    assert!(store.lookup(&k, &HeaderMap::new()).is_none());
                    assert!(store.insert(&k, entry(10_000, None)));
                    assert!(stat(&store.stats().bytes) <= 1 << 20);
                }
                for k in &hot {
                    if store.lookup(k, &HeaderMap::new()).is_none() {
                        lost += 1;
                        assert!(store.insert(k, entry(10_000, None)));
                    }
                }
            }
            lost
        };
        assert_eq!(run(Eviction::S3Fifo), 0, "S3-FIFO lost hot keys");
        assert_eq!(
            run(Eviction::Lru),
            20 * 10,
            "LRU loses the hot set at every pass"
        );
    }

    /// A million distinct keys asked once: the bytes never go over the bound and the ghost
    /// stays within its bound in hashes.
    #[test]
    fn a_million_distinct_keys_stay_within_memory() {
        let store = Store::new(Limits::new(1 << 20, 10_000));
        let mut k = String::new();
        for i in 0..1_000_000 {
            use std::fmt::Write as _;
            k.clear();
            let _ = write!(k, "http://h/{i}");
            store.insert(&k, entry(100, None));
            if i % 1000 == 0 {
                assert!(stat(&store.stats().bytes) <= 1 << 20);
                let inner = store.lock();
                assert!(inner.keys.ghosts() <= inner.keys.len().max(MIN_GHOSTS));
            }
        }
        assert!(stat(&store.stats().bytes) <= 1 << 20);
        assert!(stat(&store.stats().one_hit_evictions) > 990_000);
        assert_eq!(
            stat(&store.stats().one_hit_evictions),
            stat(&store.stats().evictions)
        );
    }

    /// An object larger than the small queue's share (40 % of the bound, where the small
    /// queue holds 10 %) is stored within the bound, taken from the small queue's one-time
    /// keys; never hit, it leaves in its turn (60 small entries later), and the keys hit
    /// before it stay throughout.
    #[test]
    fn a_huge_object_keeps_the_bound_and_leaves_first() {
        let mem = 1 << 20;
        let store = Store::new(Limits::new(mem, mem / 2));
        let hot: Vec<String> = (0..30).map(|i| format!("http://h/hot/{i}")).collect();
        for _ in 0..2 {
            for k in &hot {
                if store.lookup(k, &HeaderMap::new()).is_none() {
                    store.insert(k, entry(10_000, None));
                }
            }
        }
        for i in 0..200 {
            store.insert(&format!("http://h/once/{i}"), entry(10_000, None));
        }
        assert!(store.insert("http://h/huge", entry(mem * 4 / 10, None)));
        assert!(stat(&store.stats().bytes) <= mem as u64);
        // the small queue's entries older than it go first, then it
        for i in 0..60 {
            store.insert(&format!("http://h/after/{i}"), entry(10_000, None));
            assert!(stat(&store.stats().bytes) <= mem as u64);
        }
        assert!(store.lookup("http://h/huge", &HeaderMap::new()).is_none());
        for k in &hot {
            assert!(store.lookup(k, &HeaderMap::new()).is_some(), "{k}");
        }
        // set_limits (a reload) shrinking the bound keeps working
        store.set_limits(Limits::new(mem / 4, mem / 8));
        assert!(stat(&store.stats().bytes) <= mem as u64 / 4);
        let held = stat(&store.stats().objects) as usize;
        assert_eq!(store.purge_prefix("http://h/"), held);
        assert_eq!(stat(&store.stats().bytes), 0);
    }

    #[test]
    fn too_large_is_refused() {
        let store = Store::new(Limits::new(100_000, 1_000));
        assert!(!store.insert("k", entry(1_001, None)));
        assert!(store.insert("k", entry(1_000, None)));
    }

    #[test]
    fn variants_and_purge() {
        let store = Store::new(Limits::new(1 << 20, 1 << 16));
        store.insert("http://h/a", entry(1, Some("1")));
        store.insert("http://h/a", entry(2, Some("2")));
        store.insert("http://h/a", entry(3, Some("2")));
        store.insert("http://h/ab", entry(1, None));
        store.insert("http://h/b", entry(1, None));
        let mut req = HeaderMap::new();
        req.insert("x-v", HeaderValue::from_static("2"));
        assert_eq!(
            store.lookup("http://h/a", &req).map(|e| e.body.len()),
            Some(3)
        );
        assert_eq!(store.stats().objects.load(Ordering::Relaxed), 4);
        assert_eq!(store.invalidate("http://h/b"), 1);
        assert_eq!(store.purge_prefix("http://h/a"), 3);
        assert_eq!(store.stats().objects.load(Ordering::Relaxed), 0);
        assert_eq!(store.stats().bytes.load(Ordering::Relaxed), 0);
    }

    const SYNC: std::time::Duration = std::time::Duration::from_secs(10);

    fn disk_store(dir: &Path, disk: u64) -> Arc<Store> {
        Store::open(Limits::new(1 << 20, 100_000).with_disk(disk), dir)
    }

    fn files(dir: &Path) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "qc"))
            .collect();
        v.sort();
        v
    }

    fn stat(s: &AtomicU64) -> u64 {
        s.load(Ordering::Relaxed)
    }

    /// What was stored is found by a new store on the same folder, with its times (so its
    /// age) and its body; a memory miss on the old one finds it on disk too.
    #[tokio::test]
    async fn a_restart_finds_what_was_stored() {
        let d = tempfile::tempdir().unwrap();
        let store = disk_store(d.path(), 1 << 20);
        let e = entry(1000, Some("1"));
        let times = (e.meta.request_time, e.meta.response_time);
        assert!(store.insert("http://h/a", e));
        assert!(store.sync_disk(SYNC));
        assert_eq!(stat(&store.stats().disk_objects), 1);
        drop(store);
        let store = disk_store(d.path(), 1 << 20);
        assert_eq!(stat(&store.stats().disk_objects), 1);
        let mut req = HeaderMap::new();
        assert!(
            store.lookup("http://h/a", &req).is_none(),
            "memory starts empty"
        );
        assert!(
            store.lookup_disk("http://h/a", &req).await.is_none(),
            "another variant"
        );
        req.insert("x-v", HeaderValue::from_static("1"));
        let got = store
            .lookup_disk("http://h/a", &req)
            .await
            .expect("on disk");
        assert_eq!(got.body.len(), 1000);
        assert_eq!((got.meta.request_time, got.meta.response_time), times);
        assert!(
            store.lookup("http://h/a", &req).is_some(),
            "promoted to memory"
        );
        assert_eq!(stat(&store.stats().disk_hits), 1);
    }

    /// A byte flipped in the body on disk (the header still good: the scan keeps it) is caught
    /// when read: not served, the file removed, counted.
    #[tokio::test]
    async fn a_corrupt_entry_is_dropped_and_never_served() {
        let d = tempfile::tempdir().unwrap();
        let store = disk_store(d.path(), 1 << 20);
        store.insert("http://h/a", entry(1000, None));
        assert!(store.sync_disk(SYNC));
        let f = files(d.path()).pop().unwrap();
        let mut bytes = std::fs::read(&f).unwrap();
        let at = bytes.len() - 100;
        bytes[at] ^= 1;
        std::fs::write(&f, &bytes).unwrap();
        // the same store, past its memory tier
        assert!(store
            .lookup_disk("http://h/a", &HeaderMap::new())
            .await
            .is_none());
        assert!(!f.exists(), "removed");
        assert_eq!(stat(&store.stats().disk_dropped), 1);
        assert_eq!(stat(&store.stats().disk_objects), 0);
        // and after a restart
        store.insert("http://h/b", entry(1000, None));
        assert!(store.sync_disk(SYNC));
        drop(store);
        let f = files(d.path()).pop().unwrap();
        let mut bytes = std::fs::read(&f).unwrap();
        bytes[at] ^= 1;
        std::fs::write(&f, &bytes).unwrap();
        let store = disk_store(d.path(), 1 << 20);
        assert!(store
            .lookup_disk("http://h/b", &HeaderMap::new())
            .await
            .is_none());
        assert!(files(d.path()).is_empty());
    }

    /// A truncated entry file is dropped by the scan at start (its length is not its
    /// header's) and by a read.
    #[tokio::test]
    async fn a_truncated_entry_is_dropped_and_never_served() {
        let d = tempfile::tempdir().unwrap();
        let store = disk_store(d.path(), 1 << 20);
        store.insert("http://h/a", entry(1000, None));
        store.insert("http://h/b", entry(1000, None));
        assert!(store.sync_disk(SYNC));
        let all = files(d.path());
        for f in &all {
            let len = std::fs::metadata(f).unwrap().len();
            std::fs::OpenOptions::new()
                .write(true)
                .open(f)
                .unwrap()
                .set_len(len - 10)
                .unwrap();
        }
        let first = store.lookup_disk("http://h/a", &HeaderMap::new()).await;
        assert!(first.is_none());
        drop(store);
        let store = disk_store(d.path(), 1 << 20);
        assert_eq!(
            stat(&store.stats().disk_dropped),
            1,
            "the other one, at the scan"
        );
        assert_eq!(stat(&store.stats().disk_objects), 0);
        assert!(store
            .lookup_disk("http://h/b", &HeaderMap::new())
            .await
            .is_none());
        assert!(files(d.path()).is_empty());
    }

    /// An entry file that grew after the scan (swapped for a huge one) is not read into
    /// memory: its size is not the index's; dropped, not served.
    #[tokio::test]
    async fn an_entry_that_grew_is_not_read() {
        let d = tempfile::tempdir().unwrap();
        let store = disk_store(d.path(), 1 << 20);
        store.insert("http://h/a", entry(10, None));
        assert!(store.sync_disk(SYNC));
        let f = files(d.path()).pop().unwrap();
        let mut bytes = std::fs::read(&f).unwrap();
        bytes.extend(std::iter::repeat_n(0u8, 1 << 20));
        std::fs::write(&f, &bytes).unwrap();
        assert!(store
            .lookup_disk("http://h/a", &HeaderMap::new())
            .await
            .is_none());
        assert_eq!(stat(&store.stats().disk_dropped), 1);
        assert!(!f.exists());
    }

    /// An entry file of another format version (an older or newer qweb) is dropped by the
    /// scan: removed, counted, not served.
    #[tokio::test]
    async fn an_entry_of_another_version_is_dropped() {
        let d = tempfile::tempdir().unwrap();
        let store = disk_store(d.path(), 1 << 20);
        store.insert("http://h/a", entry(10, None));
        assert!(store.sync_disk(SYNC));
        drop(store);
        let f = files(d.path()).pop().unwrap();
        let mut bytes = std::fs::read(&f).unwrap();
        bytes[8] = bytes[8].wrapping_add(1);
        std::fs::write(&f, &bytes).unwrap();
        let store = disk_store(d.path(), 1 << 20);
        assert_eq!(stat(&store.stats().disk_dropped), 1);
        assert!(store
            .lookup_disk("http://h/a", &HeaderMap::new())
            .await
            .is_none());
        assert!(!f.exists());
    }

    /// Stores faster than the writer can write: the writer's queue stays bounded, the writes
    /// beyond it are skipped and counted, every store is either written or counted, and
    /// memory serves them all the same.
    #[test]
    fn a_full_writer_queue_skips_and_counts() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(Limits::new(64 << 20, 100_000).with_disk(1 << 30), d.path());
        let n = 3000;
        for i in 0..n {
            assert!(store.insert(&format!("http://h/{i}"), entry(10_000, None)));
            let w = store.writer.as_ref().unwrap();
            assert!(w.queued.load(Ordering::Relaxed) <= MAX_QUEUED_WRITES);
        }
        assert!(store.sync_disk(SYNC));
        let stored = stat(&store.stats().disk_stored);
        let skipped = stat(&store.stats().disk_skipped);
        assert_eq!(stored + skipped, n, "{stored} written, {skipped} skipped");
        assert!(skipped > 0, "the writer kept up with {n} stores");
        assert_eq!(files(d.path()).len() as u64, stored);
        assert!(store
            .lookup(&format!("http://h/{}", n - 1), &HeaderMap::new())
            .is_some());
    }

    /// A purged key (by URL or prefix) is not found on disk, neither by the same store nor
    /// after a restart; a fill older than the purge is not written either, even when it was
    /// queued before the purge.
    #[tokio::test]
    async fn a_purge_reaches_the_disk_and_survives_a_restart() {
        let d = tempfile::tempdir().unwrap();
        let store = disk_store(d.path(), 1 << 20);
        for k in ["http://h/a", "http://h/p/1", "http://h/p/2", "http://h/q"] {
            store.insert(k, entry(100, None));
        }
        assert!(store.sync_disk(SYNC));
        assert_eq!(store.invalidate("http://h/a"), 1);
        assert_eq!(store.purge_prefix("http://h/p/"), 2);
        assert!(store
            .lookup_disk("http://h/a", &HeaderMap::new())
            .await
            .is_none());
        // queued, then purged before the writer may have taken it
        let before = store.epoch();
        store.insert("http://h/late", entry(100, None));
        store.invalidate("http://h/late");
        assert!(!store.insert_since("http://h/late", entry(100, None), before));
        assert!(store.sync_disk(SYNC));
        assert_eq!(files(d.path()).len(), 1);
        drop(store);
        let store = disk_store(d.path(), 1 << 20);
        assert_eq!(stat(&store.stats().disk_objects), 1);
        for k in [
            "http://h/a",
            "http://h/p/1",
            "http://h/p/2",
            "http://h/late",
        ] {
            assert!(
                store.lookup_disk(k, &HeaderMap::new()).await.is_none(),
                "{k}"
            );
        }
        assert!(store
            .lookup_disk("http://h/q", &HeaderMap::new())
            .await
            .is_some());
    }

    /// Many keys through a small disk tier: the files on disk never sum over the bound, the
    /// most recent are kept, and a restart with a smaller bound evicts down to it.
    #[test]
    fn the_disk_stays_within_its_bound_with_many_keys() {
        let d = tempfile::tempdir().unwrap();
        let bound = 1 << 20;
        let store = disk_store(d.path(), bound);
        let on_disk = |d: &Path| -> u64 {
            files(d)
                .iter()
                .map(|f| std::fs::metadata(f).map_or(0, |m| m.len()))
                .sum()
        };
        for i in 0..3000 {
            store.insert(&format!("http://h/{i}"), entry(2000, None));
            if i % 100 == 99 {
                assert!(store.sync_disk(SYNC));
                assert!(on_disk(d.path()) <= bound, "{i}: {}", on_disk(d.path()));
                assert!(stat(&store.stats().disk_bytes) <= bound);
            }
        }
        let objects = stat(&store.stats().disk_objects);
        assert!(objects > 300 && objects < 520, "{objects}");
        assert_eq!(files(d.path()).len() as u64, objects);
        assert!(stat(&store.stats().disk_evictions) > 2000);
        drop(store);
        let store = disk_store(d.path(), 1 << 20);
        assert_eq!(stat(&store.stats().disk_objects), objects);
        store.set_limits(Limits::new(1 << 20, 100_000).with_disk(bound / 2));
        assert!(store.sync_disk(SYNC));
        assert!(on_disk(d.path()) <= bound / 2);
    }

    /// A folder that cannot be made (a file where it should be: root's writes ignore modes)
    /// leaves a store that works in memory, with the error counted.
    #[test]
    fn an_unusable_folder_leaves_the_memory_tier_working() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("cache");
        std::fs::write(&path, b"a file").unwrap();
        let store = disk_store(&path, 1 << 20);
        assert_eq!(stat(&store.stats().disk_errors), 1);
        assert!(store.insert("http://h/a", entry(100, None)));
        assert!(store.lookup("http://h/a", &HeaderMap::new()).is_some());
        // a folder removed under a running store: writes fail, counted, memory serves
        let sub = d.path().join("sub");
        let store = disk_store(&sub, 1 << 20);
        std::fs::remove_dir(&sub).unwrap();
        std::fs::write(&sub, b"a file").unwrap();
        assert!(store.insert("http://h/a", entry(100, None)));
        assert!(store.sync_disk(SYNC));
        assert_eq!(stat(&store.stats().disk_errors), 1);
        assert_eq!(stat(&store.stats().disk_objects), 0);
        assert!(store.lookup("http://h/a", &HeaderMap::new()).is_some());
    }

    /// How long a start-up scan takes (docs/CONFIGURATION.md quotes it): 20 000 entries of
    /// 1 KiB. `cargo test -p qweb-cache --release -- --ignored --nocapture scan_time`.
    #[test]
    #[ignore = "a measurement"]
    fn scan_time() {
        let d = tempfile::tempdir().unwrap();
        let store = disk_store(d.path(), 1 << 30);
        for i in 0..20_000 {
            store.insert(&format!("http://h/{i}"), entry(1024, None));
            if i % 200 == 199 {
                assert!(store.sync_disk(SYNC));
            }
        }
        drop(store);
        let t = std::time::Instant::now();
        let store = disk_store(d.path(), 1 << 30);
        let took = t.elapsed();
        assert_eq!(stat(&store.stats().disk_objects), 20_000);
        println!("scan of 20000 entries: {took:?}");
    }

    #[tokio::test]
    async fn a_fill_wakes_its_waiters_when_it_ends() {
        let store = Store::new(Limits::new(1 << 20, 1 << 16));
        let Fill::Lead(guard) = store.begin_fill("k") else {
            panic!("the first fill leads");
        };
        let Fill::Wait(mut rx) = store.begin_fill("k") else {
            panic!("the second waits");
        };
        let waiter = tokio::spawn(async move { rx.changed().await.is_err() });
        drop(guard);
        assert!(waiter.await.unwrap(), "the waiter saw the fill end");
        assert!(matches!(store.begin_fill("k"), Fill::Lead(_)));
    }
}
