//! The memory store's eviction policy: S3-FIFO (Yang et al., "FIFO queues are all you need
//! for cache eviction", SOSP 2023), weighted in bytes, so that one-hit wonders and scans do
//! not push out what is requested again.
//!
//! - A new key enters the **small** queue (a FIFO meant to hold [`SMALL_SHARE`] % of the
//!   memory bound); a hit only raises the entry's 2-bit frequency (no list is touched).
//! - Evictions take from the small queue while it holds more than its share (or main is
//!   empty): its oldest entry moves to **main** when it was hit since it was stored, and is
//!   evicted otherwise (a one-hit wonder: counted in [`Stats::one_hit_evictions`](super::Stats::one_hit_evictions)),
//!   its key's hash then remembered in the **ghost** queue.
//! - Otherwise they take main's oldest entry: one hit since its last pass gives it another
//!   lap (its frequency lowered by one, put back at main's head), none evicts it.
//! - A new key whose hash is in the ghost (evicted from small lately, requested again) enters
//!   main at once.
//!
//! **Bounds.** The entries are what [`super::Limits::memory`] counts; the ghost holds at most
//! as many key hashes as the store holds keys, and at least [`MIN_GHOSTS`]: 16 bytes each in
//! its queue and about 17 in its map, so under one sixth of the 256 bytes every stored entry
//! is counted for at least (`ENTRY_OVERHEAD`), and less the larger the entries are.
//!
//! **A huge entry** (larger than the small queue's share) enters the small queue like any
//! other: making room for it takes from the small queue first (its one-time entries), and
//! from main's coldest entries only once the small queue is empty; never hit, it leaves in
//! its turn, after the small queue's entries older than it (the small queue is over its share
//! until then, so the evictions keep taking from it, not from main). The byte bound holds
//! throughout: the store evicts until the new entry fits.
//! Entries over half of [`super::Limits::memory`] are not stored at all (the configuration's
//! `max_object_size` is at most half of `memory`).
//!
//! [`Eviction::Lru`] keeps the previous policy (least recently used first, a hit moves the
//! key to the head) for comparison: `qweb-bench zipf` measures both.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::Arc;

/// Which entries the memory store evicts first ([`super::Store::with_eviction`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Eviction {
    /// S3-FIFO: a small FIFO for new keys, a main FIFO with reinsertion, a ghost of the keys
    /// evicted from small (the module documentation of `store`). The server's policy.
    #[default]
    S3Fifo,
    /// Least recently used first: kept to compare with (`qweb-bench zipf`).
    Lru,
}

/// The small queue's share of the memory bound, in percent.
pub const SMALL_SHARE: usize = 10;

/// Ghost key hashes remembered at least (more when the store holds more keys).
pub const MIN_GHOSTS: usize = 1024;

/// The highest frequency an entry counts (2 bits).
const MAX_FREQ: u8 = 3;

/// No node.
const NIL: usize = usize::MAX;

/// The maps' hasher: the one the store's `LruCache` used (foldhash through hashbrown), so a
/// hit hashes its key as cheaply as before.
type Hasher = lru::DefaultHasher;

/// What an entry weighs: the bytes it counts against the memory bound.
pub(super) trait Weigh {
    fn weight(&self) -> usize;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Queue {
    Small,
    Main,
}

struct Node<V> {
    key: Arc<str>,
    value: V,
    weight: usize,
    freq: u8,
    queue: Queue,
    /// Toward the head (newer).
    prev: usize,
    /// Toward the tail (older).
    next: usize,
}

/// A FIFO of nodes, linked through them: head the newest, tail the oldest.
#[derive(Debug, Clone, Copy)]
struct List {
    head: usize,
    tail: usize,
    bytes: usize,
}

impl List {
    const EMPTY: List = List {
        head: NIL,
        tail: NIL,
        bytes: 0,
    };
}

/// The hashes of keys evicted from the small queue, oldest first, bounded in count.
struct Ghost {
    /// Each hash with the number it was pushed with; an older push of a hash pushed again
    /// (or taken back) is stale and skipped when it leaves.
    order: VecDeque<(u64, u64)>,
    /// Hash → the number of its latest push.
    latest: HashMap<u64, u64, Hasher>,
    pushed: u64,
}

impl Ghost {
    fn push(&mut self, hash: u64, bound: usize) {
        while self.order.len() >= bound {
            let Some((h, n)) = self.order.pop_front() else {
                break;
            };
            if self.latest.get(&h) == Some(&n) {
                self.latest.remove(&h);
            }
        }
        self.pushed += 1;
        self.order.push_back((hash, self.pushed));
        self.latest.insert(hash, self.pushed);
    }

    /// Whether `hash` is remembered; forgets it when it is.
    fn take(&mut self, hash: u64) -> bool {
        self.latest.remove(&hash).is_some()
    }

    fn contains(&self, hash: u64) -> bool {
        self.latest.contains_key(&hash)
    }
}

/// An entry the policy gave up.
pub(super) struct Victim<V> {
    pub value: V,
    /// It left the small queue never hit since it was stored.
    pub one_hit: bool,
}

/// The store's keys and the order they are evicted in.
pub(super) struct Keys<V> {
    eviction: Eviction,
    map: HashMap<Arc<str>, usize, Hasher>,
    nodes: Vec<Option<Node<V>>>,
    free: Vec<usize>,
    small: List,
    main: List,
    ghost: Ghost,
    hasher: Hasher,
    /// The small queue's share in bytes.
    small_target: usize,
}

impl<V: Weigh + Default> Keys<V> {
    /// No keys, for a memory bound of `memory` bytes.
    pub fn new(eviction: Eviction, memory: usize) -> Keys<V> {
        let mut keys = Keys {
            eviction,
            map: HashMap::default(),
            nodes: Vec::new(),
            free: Vec::new(),
            small: List::EMPTY,
            main: List::EMPTY,
            ghost: Ghost {
                order: VecDeque::new(),
                latest: HashMap::default(),
                pushed: 0,
            },
            hasher: Hasher::default(),
            small_target: 0,
        };
        keys.set_memory(memory);
        keys
    }

    /// Key hashes the ghost holds (stale ones included).
    #[cfg(test)]
    pub fn ghosts(&self) -> usize {
        self.ghost.order.len()
    }

    /// Keys held.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// A new memory bound (the small queue's share follows it).
    pub fn set_memory(&mut self, memory: usize) {
        self.small_target = memory / 100 * SMALL_SHARE + memory % 100 * SMALL_SHARE / 100;
    }

    /// The value of `key`, counted as a hit.
    pub fn get(&mut self, key: &str) -> Option<&V> {
        let i = *self.map.get(key)?;
        match self.eviction {
            Eviction::S3Fifo => {
                let n = self.node_mut(i);
                n.freq = (n.freq + 1).min(MAX_FREQ);
            }
            Eviction::Lru => {
                self.unlink(i);
                self.push_head(i, Queue::Main);
            }
        }
        Some(&self.node(i).value)
    }

    /// Every key and its value, in no order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &V)> {
        self.map.iter().map(|(k, &i)| (&**k, &self.node(i).value))
    }

    /// Changes the value of `key` with `f` (not a hit), its weight taken again after.
    pub fn update<R>(&mut self, key: &str, f: impl FnOnce(&mut V) -> R) -> Option<R> {
        let i = *self.map.get(key)?;
        let r = f(&mut self.node_mut(i).value);
        self.reweigh(i);
        Some(r)
    }

    /// [`Keys::update`], with an empty value put under `key` first when it has none (a new
    /// key: into the small queue, or main when the ghost remembers it).
    pub fn upsert<R>(&mut self, key: &str, f: impl FnOnce(&mut V) -> R) -> R {
        let i = match self.map.get(key) {
            Some(&i) => i,
            None => self.add(key),
        };
        let r = f(&mut self.node_mut(i).value);
        self.reweigh(i);
        r
    }

    /// Removes `key`; its value.
    pub fn remove(&mut self, key: &str) -> Option<V> {
        let i = self.map.remove(key)?;
        self.unlink(i);
        self.free.push(i);
        self.nodes[i].take().map(|n| n.value)
    }

    /// How many of `weight` new bytes for `key` would go into the small queue (`key` is new
    /// and not in the ghost, or it is in the small queue now).
    pub fn small_part(&self, key: &str, weight: usize) -> usize {
        if self.eviction == Eviction::Lru {
            return 0;
        }
        match self.map.get(key) {
            Some(&i) if self.node(i).queue == Queue::Small => weight,
            Some(_) => 0,
            None if self.ghost.contains(self.hasher.hash_one(key)) => 0,
            None => weight,
        }
    }

    /// Gives up the next entry to evict, when `incoming` more bytes are about to go into the
    /// small queue ([`Keys::small_part`]); `None` when no entry is left.
    pub fn evict(&mut self, incoming: usize) -> Option<Victim<V>> {
        loop {
            let small_first = self.small.tail != NIL
                && (self.small.bytes + incoming > self.small_target || self.main.tail == NIL);
            if small_first {
                let i = self.small.tail;
                self.unlink(i);
                if self.node(i).freq > 0 {
                    // hit while in the small queue: into main, counted afresh there
                    self.node_mut(i).freq = 0;
                    self.push_head(i, Queue::Main);
                    continue;
                }
                let node = self.take(i);
                let bound = self.map.len().max(MIN_GHOSTS);
                self.ghost.push(self.hasher.hash_one(&*node.key), bound);
                return Some(Victim {
                    value: node.value,
                    one_hit: true,
                });
            }
            let i = self.main.tail;
            if i == NIL {
                return None;
            }
            self.unlink(i);
            if self.eviction == Eviction::S3Fifo && self.node(i).freq > 0 {
                self.node_mut(i).freq -= 1;
                self.push_head(i, Queue::Main);
                continue;
            }
            let node = self.take(i);
            return Some(Victim {
                value: node.value,
                one_hit: false,
            });
        }
    }

    /// A node for a new `key` with an empty value, linked where the policy puts new keys.
    fn add(&mut self, key: &str) -> usize {
        let queue = match self.eviction {
            Eviction::Lru => Queue::Main,
            Eviction::S3Fifo if self.ghost.take(self.hasher.hash_one(key)) => Queue::Main,
            Eviction::S3Fifo => Queue::Small,
        };
        let key: Arc<str> = Arc::from(key);
        let node = Node {
            key: key.clone(),
            value: V::default(),
            weight: 0,
            freq: 0,
            queue,
            prev: NIL,
            next: NIL,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i] = Some(node);
                i
            }
            None => {
                self.nodes.push(Some(node));
                self.nodes.len() - 1
            }
        };
        self.map.insert(key, i);
        self.push_head(i, queue);
        i
    }

    /// Unlinks node `i` (already unlinked) from the map and the slab.
    fn take(&mut self, i: usize) -> Node<V> {
        let node = self.nodes[i]
            .take()
            .unwrap_or_else(|| unreachable!("a linked node"));
        self.map.remove(&node.key);
        self.free.push(i);
        node
    }

    fn reweigh(&mut self, i: usize) {
        let n = self.node_mut(i);
        let (old, new, q) = (n.weight, n.value.weight(), n.queue);
        n.weight = new;
        let list = self.list(q);
        list.bytes = list.bytes - old + new;
    }

    fn node(&self, i: usize) -> &Node<V> {
        self.nodes[i]
            .as_ref()
            .unwrap_or_else(|| unreachable!("a live node"))
    }

    fn node_mut(&mut self, i: usize) -> &mut Node<V> {
        self.nodes[i]
            .as_mut()
            .unwrap_or_else(|| unreachable!("a live node"))
    }

    fn list(&mut self, q: Queue) -> &mut List {
        match q {
            Queue::Small => &mut self.small,
            Queue::Main => &mut self.main,
        }
    }

    fn unlink(&mut self, i: usize) {
        let n = self.node_mut(i);
        let (prev, next, q, w) = (n.prev, n.next, n.queue, n.weight);
        n.prev = NIL;
        n.next = NIL;
        if prev == NIL {
            self.list(q).head = next;
        } else {
            self.node_mut(prev).next = next;
        }
        if next == NIL {
            self.list(q).tail = prev;
        } else {
            self.node_mut(next).prev = prev;
        }
        self.list(q).bytes -= w;
    }

    fn push_head(&mut self, i: usize, q: Queue) {
        let list = *self.list(q);
        let n = self.node_mut(i);
        n.queue = q;
        n.prev = NIL;
        n.next = list.head;
        let w = n.weight;
        if list.head == NIL {
            self.list(q).tail = i;
        } else {
            self.node_mut(list.head).prev = i;
        }
        let l = self.list(q);
        l.head = i;
        l.bytes += w;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default, Debug)]
    struct W(usize);

    impl Weigh for W {
        fn weight(&self) -> usize {
            self.0
        }
    }

    /// Puts `key` of `w` bytes after evicting down to `cap`; how many were evicted.
    fn put(keys: &mut Keys<W>, held: &mut usize, cap: usize, key: &str, w: usize) -> usize {
        let incoming = keys.small_part(key, w);
        let mut n = 0;
        while *held + w > cap {
            let Some(v) = keys.evict(incoming) else {
                break;
            };
            *held -= v.value.0;
            n += 1;
        }
        keys.upsert(key, |v| v.0 = w);
        *held += w;
        n
    }

    fn check(keys: &Keys<W>, held: usize) {
        let sum: usize = keys.iter().map(|(_, v)| v.0).sum();
        assert_eq!(sum, held);
        assert_eq!(keys.small.bytes + keys.main.bytes, held);
        let linked = |mut i: usize| {
            let mut n = 0;
            while i != NIL {
                n += 1;
                i = keys.node(i).next;
            }
            n
        };
        assert_eq!(
            linked(keys.small.head) + linked(keys.main.head),
            keys.map.len()
        );
    }

    /// A one-time key goes first, before older keys that were hit; a key hit in the small
    /// queue moves to main; a key evicted from small and asked again enters main.
    #[test]
    fn one_hit_wonders_go_first() {
        let (cap, mut held) = (1000, 0);
        let mut keys = Keys::new(Eviction::S3Fifo, cap);
        for i in 0..10 {
            put(&mut keys, &mut held, cap, &format!("hot{i}"), 50);
            assert!(keys.get(&format!("hot{i}")).is_some());
        }
        for i in 0..100 {
            put(&mut keys, &mut held, cap, &format!("once{i}"), 50);
            check(&keys, held);
        }
        for i in 0..10 {
            assert!(keys.get(&format!("hot{i}")).is_some(), "hot{i}");
        }
        assert!(keys.get("once0").is_none());
        // once0 is in the ghost: asked again, it goes into main
        assert_eq!(keys.small_part("once0", 50), 0);
        put(&mut keys, &mut held, cap, "once0", 50);
        let i = keys.map["once0"];
        assert_eq!(keys.node(i).queue, Queue::Main);
        check(&keys, held);
    }

    /// The same workload under LRU loses the keys hit before the scan.
    #[test]
    fn lru_loses_them() {
        let (cap, mut held) = (1000, 0);
        let mut keys = Keys::new(Eviction::Lru, cap);
        for i in 0..10 {
            put(&mut keys, &mut held, cap, &format!("hot{i}"), 50);
            keys.get(&format!("hot{i}"));
        }
        for i in 0..100 {
            put(&mut keys, &mut held, cap, &format!("once{i}"), 50);
        }
        assert!(keys.get("hot0").is_none());
        assert!(keys.get("once99").is_some());
        check(&keys, held);
    }

    /// Removals, growth in place and a huge entry keep the lists' bytes right; the ghost stays
    /// within its bound under many distinct keys.
    #[test]
    fn bytes_and_the_ghost_stay_bounded() {
        let (cap, mut held) = (10_000, 0);
        let mut keys = Keys::new(Eviction::S3Fifo, cap);
        for i in 0..100_000 {
            let k = format!("k{i}");
            put(&mut keys, &mut held, cap, &k, 10 + i % 90);
            if i % 7 == 0 {
                keys.get(&k);
            }
            if i % 11 == 0 {
                let w = keys.update(&k, |v| {
                    v.0 += 5;
                    v.0
                });
                assert!(w.is_some());
                held += 5;
            }
            if i % 13 == 0 {
                held -= keys.remove(&format!("k{}", i / 2)).map_or(0, |v| v.0);
            }
            assert!(keys.ghost.order.len() <= keys.map.len().max(MIN_GHOSTS));
        }
        check(&keys, held);
        // a huge one: over the small queue's share, within the bound
        while held + 6000 > cap {
            held -= keys
                .evict(keys.small_part("huge", 6000))
                .map_or(0, |v| v.value.0);
        }
        keys.upsert("huge", |v| v.0 = 6000);
        held += 6000;
        check(&keys, held);
        assert!(held <= cap);
        // the small queue is over its share: evictions take from it (one-hit wonders, oldest
        // first) until the huge one has gone, main untouched
        let main = keys.main.bytes;
        loop {
            let v = keys.evict(0).expect("an entry");
            assert!(v.one_hit);
            held -= v.value.0;
            if v.value.0 == 6000 {
                break;
            }
        }
        assert!(keys.main.bytes >= main, "main kept its entries");
        check(&keys, held);
    }
}
