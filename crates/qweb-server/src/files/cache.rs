//! The open-file cache: small static files held in memory, per worker, with their response
//! headers prebuilt, so that a hit costs no system call (nginx's `open_file_cache`, which also
//! keeps contents out of reach; h2o's file cache).
//!
//! - **What**: regular files up to `file_cache.max_file_size` (default 64 KiB), found by the
//!   route's root and the request's path; at most `entries` files and `memory` bytes of content
//!   per worker, least recently used evicted first. Larger files are streamed from disk.
//! - **Freshness**: an entry is used without looking at the disk for `valid` (default 1 s).
//!   The next request after that opens the file again, exactly as an uncached request does
//!   (beneath the root, by the route's symlink rules), and compares device, inode, size and
//!   modification time with the entry's: the same file keeps its entry; a file replaced,
//!   rewritten, removed, made unreachable (a symlink swapped to point outside the root) or
//!   turned into something else drops it and the request is answered from what the open found.
//!   So a change on disk is seen at most `valid` after it happens.
//! - **Keys** are hashed with a per-worker random key (SipHash), so a client cannot choose
//!   paths that collide; a collision (two keys, one hash) is a miss, never the wrong file.
//! - A reload empties the cache.

use std::cell::{Cell, RefCell};
use std::collections::hash_map::RandomState;
use std::fs::Metadata;
use std::hash::BuildHasher;
use std::num::NonZeroUsize;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::rc::Rc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue};
use lru::LruCache;

use crate::config::FileCacheConfig;

/// Bytes an entry costs beyond its content (the entry, its headers and key), for the budget.
const ENTRY_OVERHEAD: u64 = 512;

/// Which version of a file an entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Identity {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: SystemTime,
}

impl Identity {
    /// The identity of the file `meta` describes (of an opened fd).
    pub(crate) fn of(meta: &Metadata) -> Identity {
        Identity {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
        }
    }
}

/// A file's metadata and the response headers built from it.
#[derive(Debug)]
pub(crate) struct FileHead {
    pub len: u64,
    pub mtime: SystemTime,
    pub etag: HeaderValue,
    pub last_modified: Option<HeaderValue>,
    pub content_type: HeaderValue,
    /// The root's path joined with `rel`.
    pub path: Arc<Path>,
    /// The path relative to the root.
    pub rel: Arc<Path>,
    pub identity: Identity,
    /// A whole `200`'s fields, built once (cloned per response): Content-Type,
    /// Accept-Ranges, ETag, Last-Modified, Content-Length.
    pub fields: HeaderMap,
}

impl FileHead {
    /// The fields a whole `200` of this file carries, in the order they are sent.
    pub(crate) fn full_fields(&self) -> HeaderMap {
        let mut h = HeaderMap::with_capacity(8);
        h.insert(header::CONTENT_TYPE, self.content_type.clone());
        h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
        h.insert(header::ETAG, self.etag.clone());
        if let Some(v) = &self.last_modified {
            h.insert(header::LAST_MODIFIED, v.clone());
        }
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(self.len));
        h
    }
}

/// A cached file.
#[derive(Debug)]
pub(crate) struct Entry {
    pub head: FileHead,
    pub body: Bytes,
    root: u64,
    key: Box<str>,
    checked: Cell<Instant>,
}

/// What a lookup found.
pub(crate) enum Lookup {
    /// Checked against the disk less than `valid` ago.
    Fresh(Rc<Entry>),
    /// Held, but to be checked against the disk before it is used.
    Stale(Rc<Entry>),
    Miss,
}

/// The LRU's keys are already SipHash values (keyed per worker): hashed again, they would only
/// cost time.
#[derive(Default, Clone, Copy)]
struct Prehashed(u64);

impl std::hash::Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // only `write_u64` is used (the key is a u64); fold anything else in
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

type Lru = LruCache<u64, Rc<Entry>, std::hash::BuildHasherDefault<Prehashed>>;

struct Cache {
    cfg: FileCacheConfig,
    /// The server's counters (one per server, shared by its workers).
    stats: Arc<Stats>,
    lru: Lru,
    /// Content plus overhead of every entry held.
    bytes: u64,
    hasher: RandomState,
}

thread_local! {
    static CACHE: RefCell<Option<Cache>> = const { RefCell::new(None) };
}

/// A server's counters, summed over its workers (`/metrics`).
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    /// Checks against the disk that found the file unchanged.
    pub revalidated: AtomicU64,
    /// Entries dropped because the file changed or went away.
    pub invalidated: AtomicU64,
    pub entries: AtomicI64,
    pub bytes: AtomicI64,
}

impl Cache {
    fn hash(&self, root: u64, key: &str) -> u64 {
        self.hasher.hash_one((root, key))
    }

    fn forget(&mut self, e: &Entry) {
        let cost = cost(e.body.len());
        self.bytes -= cost;
        self.stats.bytes.fetch_sub(cost as i64, Relaxed);
        self.stats.entries.fetch_sub(1, Relaxed);
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        self.stats.bytes.fetch_sub(self.bytes as i64, Relaxed);
        self.stats.entries.fetch_sub(self.lru.len() as i64, Relaxed);
    }
}

fn cost(len: usize) -> u64 {
    len as u64 + ENTRY_OVERHEAD
}

/// Sets this worker's cache up for `cfg`, empty (called when a worker applies a
/// configuration generation: a reload starts with an empty cache).
pub(crate) fn configure(cfg: &FileCacheConfig, stats: &Arc<Stats>) {
    let cache = NonZeroUsize::new(cfg.entries).map(|n| Cache {
        cfg: *cfg,
        stats: stats.clone(),
        lru: Lru::with_hasher(n, Default::default()),
        bytes: 0,
        hasher: RandomState::new(),
    });
    CACHE.with(|c| *c.borrow_mut() = cache);
}

/// Looks up `key` (the request's path) under `root` (a [`super::Root`]'s id).
pub(crate) fn lookup(root: u64, key: &str) -> Lookup {
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        let Some(c) = c.as_mut() else {
            return Lookup::Miss;
        };
        let h = c.hash(root, key);
        let valid = c.cfg.valid;
        match c.lru.get(&h) {
            Some(e) if e.root == root && &*e.key == key => {
                if e.checked.get().elapsed() < valid {
                    c.stats.hits.fetch_add(1, Relaxed);
                    Lookup::Fresh(e.clone())
                } else {
                    Lookup::Stale(e.clone())
                }
            }
            _ => {
                c.stats.misses.fetch_add(1, Relaxed);
                Lookup::Miss
            }
        }
    })
}

/// The disk still has `e`'s version: it is fresh for another `valid`.
pub(crate) fn revalidated(e: &Entry) {
    e.checked.set(Instant::now());
    with_stats(|s| {
        s.revalidated.fetch_add(1, Relaxed);
        s.hits.fetch_add(1, Relaxed);
    });
}

/// Runs `f` on this worker's counters (when its cache is on).
fn with_stats(f: impl FnOnce(&Stats)) {
    CACHE.with(|c| {
        if let Some(c) = c.borrow().as_ref() {
            f(&c.stats);
        }
    });
}

/// The disk no longer has `e`'s version: drop it.
pub(crate) fn invalidate(e: &Entry) {
    with_stats(|s| {
        s.invalidated.fetch_add(1, Relaxed);
        s.misses.fetch_add(1, Relaxed);
    });
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        let Some(c) = c.as_mut() else { return };
        let h = c.hash(e.root, &e.key);
        if let Some(old) = c.lru.peek(&h).filter(|o| std::ptr::eq(&***o, e)).cloned() {
            c.lru.pop(&h);
            c.forget(&old);
        }
    });
}

/// Would a file of `len` bytes be held?
pub(crate) fn admits(len: u64) -> bool {
    CACHE.with(|c| {
        c.borrow()
            .as_ref()
            .is_some_and(|c| len <= c.cfg.max_file_size)
    })
}

/// Holds `body` (the whole file `head` describes) for `key` under `root`, evicting the least
/// recently used entries as needed; returns the entry.
pub(crate) fn insert(root: u64, key: &str, head: FileHead, body: Bytes) -> Rc<Entry> {
    let entry = Rc::new(Entry {
        head,
        body,
        root,
        key: key.into(),
        checked: Cell::new(Instant::now()),
    });
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        let Some(c) = c.as_mut() else { return };
        let add = cost(entry.body.len());
        let h = c.hash(root, key);
        if let Some(old) = c.lru.pop(&h) {
            c.forget(&old);
        }
        while c.bytes + add > c.cfg.memory || c.lru.len() >= c.lru.cap().get() {
            match c.lru.pop_lru() {
                Some((_, old)) => c.forget(&old),
                None => break,
            }
        }
        if c.bytes + add > c.cfg.memory {
            return;
        }
        c.lru.put(h, entry.clone());
        c.bytes += add;
        c.stats.bytes.fetch_add(add as i64, Relaxed);
        c.stats.entries.fetch_add(1, Relaxed);
    });
    entry
}

/// `/metrics`: the open-file cache's counters, summed over the workers.
#[derive(Debug)]
pub(crate) struct CacheCollector(pub Arc<Stats>);

impl prometheus_client::collector::Collector for CacheCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> std::fmt::Result {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        let counters = [
            ("qweb_file_cache_hits", "Static-file requests answered from the open-file cache.", &self.0.hits),
            ("qweb_file_cache_misses", "Static-file lookups the open-file cache did not answer (not held, or changed on disk).", &self.0.misses),
            ("qweb_file_cache_revalidations", "Cached files checked against the disk after `file_cache.valid` and found unchanged.", &self.0.revalidated),
            ("qweb_file_cache_invalidations", "Cached files dropped because the file on disk changed or went away.", &self.0.invalidated),
        ];
        for (name, help, v) in counters {
            let c = ConstCounter::new(v.load(Relaxed));
            c.encode(encoder.encode_descriptor(name, help, None, c.metric_type())?)?;
        }
        let gauges = [
            (
                "qweb_file_cache_entries",
                "Files held in the open-file caches.",
                &self.0.entries,
            ),
            (
                "qweb_file_cache_bytes",
                "Bytes held in the open-file caches (content plus a fixed overhead per file).",
                &self.0.bytes,
            ),
        ];
        for (name, help, v) in gauges {
            let g = ConstGauge::new(v.load(Relaxed));
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn head(len: u64) -> FileHead {
        FileHead {
            len,
            mtime: SystemTime::UNIX_EPOCH,
            etag: HeaderValue::from_static("\"x\""),
            last_modified: None,
            content_type: HeaderValue::from_static("text/plain"),
            path: Arc::from(Path::new("/r/x")),
            rel: Arc::from(Path::new("x")),
            fields: HeaderMap::new(),
            identity: Identity {
                dev: 1,
                ino: 1,
                len,
                mtime: SystemTime::UNIX_EPOCH,
            },
        }
    }

    fn held() -> (usize, u64) {
        CACHE.with(|c| {
            let c = c.borrow();
            let c = c.as_ref().unwrap();
            (c.lru.len(), c.bytes)
        })
    }

    #[test]
    fn bounded_by_entries_and_memory_lru_first() {
        configure(
            &FileCacheConfig {
                entries: 3,
                max_file_size: 1000,
                memory: 3 * (1000 + ENTRY_OVERHEAD),
                valid: Duration::from_secs(60),
                ..Default::default()
            },
            &Arc::default(),
        );
        for i in 0..10 {
            insert(1, &format!("/f{i}"), head(10), Bytes::from(vec![0; 10]));
        }
        assert_eq!(held().0, 3);
        assert!(matches!(lookup(1, "/f9"), Lookup::Fresh(_)));
        assert!(matches!(lookup(1, "/f0"), Lookup::Miss));
        // the same path under another root is another file
        assert!(matches!(lookup(2, "/f9"), Lookup::Miss));
        // big entries push out small ones until the content fits
        configure(
            &FileCacheConfig {
                entries: 100,
                max_file_size: 1000,
                memory: 2 * (1000 + ENTRY_OVERHEAD),
                valid: Duration::from_secs(60),
                ..Default::default()
            },
            &Arc::default(),
        );
        for i in 0..5 {
            insert(1, &format!("/s{i}"), head(10), Bytes::from(vec![0; 10]));
        }
        insert(1, "/big1", head(1000), Bytes::from(vec![0; 1000]));
        insert(1, "/big2", head(1000), Bytes::from(vec![0; 1000]));
        let (n, bytes) = held();
        assert!(bytes <= 2 * (1000 + ENTRY_OVERHEAD), "{bytes}");
        assert_eq!(n, 2);
        assert!(matches!(lookup(1, "/big1"), Lookup::Fresh(_)));
    }

    #[test]
    fn entries_go_stale_after_valid_and_invalidate_drops_them() {
        configure(
            &FileCacheConfig {
                entries: 10,
                max_file_size: 1000,
                memory: 100_000,
                valid: Duration::from_millis(30),
                ..Default::default()
            },
            &Arc::default(),
        );
        let e = insert(7, "/a", head(3), Bytes::from_static(b"abc"));
        assert!(matches!(lookup(7, "/a"), Lookup::Fresh(_)));
        std::thread::sleep(Duration::from_millis(40));
        let Lookup::Stale(s) = lookup(7, "/a") else {
            panic!("not stale")
        };
        revalidated(&s);
        assert!(matches!(lookup(7, "/a"), Lookup::Fresh(_)));
        invalidate(&e);
        assert!(matches!(lookup(7, "/a"), Lookup::Miss));
        assert_eq!(held(), (0, 0));
    }

    #[test]
    fn off_when_entries_is_zero() {
        configure(
            &FileCacheConfig {
                entries: 0,
                ..FileCacheConfig::default()
            },
            &Arc::default(),
        );
        assert!(!admits(1));
        insert(1, "/x", head(1), Bytes::from_static(b"x"));
        assert!(matches!(lookup(1, "/x"), Lookup::Miss));
    }
}
