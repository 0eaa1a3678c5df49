//! The compressed-variant cache: encoded copies of static files and of responses stored by the
//! proxy cache, bounded by a byte budget, least recently used out first.
//!
//! One cache per worker (no locks on the request path). An entry is found by its source (the
//! file's path, or the proxy cache entry's id), the codec and the level, and is valid only for
//! the size and modification time it was made from: a lookup that finds an entry for another
//! size or mtime (the file changed) drops it and misses. A stored response never changes under
//! its id (a new response is a new entry with a new id), so its variants age out by use.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use bytes::Bytes;
use qweb_offload::compress::Codec;

/// What a variant is made from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Source {
    /// A static file, by its path.
    File(PathBuf),
    /// A response body held by the proxy cache, by its entry's id (unique in the process).
    Stored(u64),
}

/// What a variant was made from, and how.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VariantKey {
    /// What it encodes.
    pub source: Source,
    /// The codec.
    pub codec: Codec,
    /// The codec's level.
    pub level: u32,
}

#[derive(Debug)]
struct Entry {
    size: u64,
    mtime: SystemTime,
    data: Bytes,
    stamp: u64,
}

/// What a lookup or insertion did (for metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheEvents {
    /// Entries evicted to make room.
    pub evicted: u64,
    /// Entries dropped because their file changed.
    pub invalidated: u64,
}

/// A bounded LRU cache of encoded variants.
#[derive(Debug)]
pub struct VariantCache {
    budget: usize,
    used: usize,
    clock: u64,
    entries: HashMap<VariantKey, Entry>,
    /// Recency: stamp -> key; the smallest stamp is the least recently used.
    lru: BTreeMap<u64, VariantKey>,
}

impl VariantCache {
    /// A cache of at most `budget` bytes of encoded data (0: disabled).
    pub fn new(budget: usize) -> Self {
        VariantCache {
            budget,
            used: 0,
            clock: 0,
            entries: HashMap::new(),
            lru: BTreeMap::new(),
        }
    }

    /// Bytes held.
    pub fn used(&self) -> usize {
        self.used
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Is it empty?
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The budget.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Can an entry of `len` bytes be kept at all?
    pub fn fits(&self, len: usize) -> bool {
        len <= self.budget
    }

    fn remove(&mut self, key: &VariantKey) -> Option<Entry> {
        let e = self.entries.remove(key)?;
        self.lru.remove(&e.stamp);
        self.used -= e.data.len();
        Some(e)
    }

    /// The variant of `key` made from the file at `size` and `mtime`, marking it recently
    /// used; a variant of an older version of the file is dropped.
    pub fn get(
        &mut self,
        key: &VariantKey,
        size: u64,
        mtime: SystemTime,
        events: &mut CacheEvents,
    ) -> Option<Bytes> {
        let e = self.entries.get(key)?;
        if e.size != size || e.mtime != mtime {
            self.remove(key);
            events.invalidated += 1;
            return None;
        }
        self.clock += 1;
        let stamp = self.clock;
        let e = self.entries.get_mut(key)?;
        let old = std::mem::replace(&mut e.stamp, stamp);
        let data = e.data.clone();
        self.lru.remove(&old);
        self.lru.insert(stamp, key.clone());
        Some(data)
    }

    /// Keeps `data` as the variant of `key` for the file at `size` and `mtime`, evicting the
    /// least recently used entries to stay within the budget. Data larger than the budget is
    /// not kept.
    pub fn insert(
        &mut self,
        key: VariantKey,
        size: u64,
        mtime: SystemTime,
        data: Bytes,
        events: &mut CacheEvents,
    ) {
        if !self.fits(data.len()) {
            return;
        }
        if let Some(old) = self.remove(&key) {
            if old.size != size || old.mtime != mtime {
                events.invalidated += 1;
            }
        }
        while self.used + data.len() > self.budget {
            let Some((_, victim)) = self.lru.pop_first() else {
                break;
            };
            if let Some(e) = self.entries.remove(&victim) {
                self.used -= e.data.len();
                events.evicted += 1;
            }
        }
        self.clock += 1;
        self.used += data.len();
        self.lru.insert(self.clock, key.clone());
        self.entries.insert(
            key,
            Entry {
                size,
                mtime,
                data,
                stamp: self.clock,
            },
        );
    }

    /// Is there an entry for this file (any version)?
    pub fn contains(&self, path: &Path, codec: Codec, level: u32) -> bool {
        self.entries.contains_key(&VariantKey {
            source: Source::File(path.to_owned()),
            codec,
            level,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn key(p: &str) -> VariantKey {
        VariantKey {
            source: Source::File(PathBuf::from(p)),
            codec: Codec::Gzip,
            level: 6,
        }
    }

    #[test]
    fn hit_miss_and_invalidation() {
        let mut c = VariantCache::new(1000);
        let mut ev = CacheEvents::default();
        let t = UNIX_EPOCH + Duration::from_secs(10);
        assert!(c.get(&key("/a"), 5, t, &mut ev).is_none());
        c.insert(key("/a"), 5, t, Bytes::from_static(b"xyz"), &mut ev);
        assert_eq!(c.get(&key("/a"), 5, t, &mut ev).unwrap(), &b"xyz"[..]);
        // another level or codec is another variant
        let mut k = key("/a");
        k.level = 1;
        assert!(c.get(&k, 5, t, &mut ev).is_none());
        // the file changed: dropped
        assert!(c.get(&key("/a"), 6, t, &mut ev).is_none());
        assert_eq!(ev.invalidated, 1);
        assert_eq!(c.used(), 0);
        c.insert(key("/a"), 5, t, Bytes::from_static(b"xyz"), &mut ev);
        assert!(c
            .get(&key("/a"), 5, t + Duration::from_nanos(1), &mut ev)
            .is_none());
        assert_eq!(ev.invalidated, 2);
        assert!(c.is_empty());
    }

    #[test]
    fn evicts_least_recently_used_within_budget() {
        let mut c = VariantCache::new(100);
        let mut ev = CacheEvents::default();
        let t = UNIX_EPOCH;
        let d = Bytes::from(vec![0u8; 40]);
        c.insert(key("/a"), 1, t, d.clone(), &mut ev);
        c.insert(key("/b"), 1, t, d.clone(), &mut ev);
        assert!(c.get(&key("/a"), 1, t, &mut ev).is_some()); // /b is now the oldest
        c.insert(key("/c"), 1, t, d.clone(), &mut ev);
        assert_eq!(ev.evicted, 1);
        assert!(c.get(&key("/b"), 1, t, &mut ev).is_none());
        assert!(c.get(&key("/a"), 1, t, &mut ev).is_some());
        assert!(c.get(&key("/c"), 1, t, &mut ev).is_some());
        assert_eq!(c.used(), 80);
        // larger than the budget: not kept, nothing evicted
        c.insert(key("/huge"), 1, t, Bytes::from(vec![0u8; 101]), &mut ev);
        assert_eq!(c.len(), 2);
        assert_eq!(ev.evicted, 1);
        // replacing an entry does not count it twice
        c.insert(key("/a"), 1, t, Bytes::from(vec![0u8; 50]), &mut ev);
        assert_eq!(c.used(), 90);
    }
}
