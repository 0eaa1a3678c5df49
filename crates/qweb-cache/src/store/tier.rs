//! The store's disk tier: opening it (the index rebuilt from the entry files' headers), the
//! writer thread that takes the store's disk jobs in order, and the reads of a memory miss.
//! See the module documentation of [`super`].

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Weak};

use http::HeaderMap;

use super::{Entry, Inner, Limits, Store, MAX_QUEUED_BYTES, MAX_QUEUED_WRITES};
use crate::disk::{self, Index, Name, Variant};

/// What the disk writer thread does, in the order asked.
pub(super) enum Job {
    Write {
        key: String,
        entry: Arc<Entry>,
        epoch: u64,
    },
    Remove(Vec<Name>),
    /// Answered when every job before it is done.
    Sync(mpsc::SyncSender<()>),
}

/// The disk writer's end of the store.
pub(super) struct Writer {
    pub(super) tx: mpsc::Sender<Job>,
    pub(super) thread: Option<std::thread::JoinHandle<()>>,
    pub(super) queued: AtomicUsize,
    pub(super) queued_bytes: AtomicUsize,
}

impl Store {
    /// A store bounded by `limits` with a disk tier in `dir` of [`Limits::disk`] bytes (none
    /// when that is 0). The index is rebuilt from the entry files' headers (call it before the
    /// event loops run: it reads one header per file); entries that fail their checks are
    /// removed. When the folder cannot be made or read, or the writer thread not started, the
    /// store works in memory alone (logged, counted in [`Stats::disk_errors`](super::Stats::disk_errors)).
    pub fn open(limits: Limits, dir: &Path) -> Arc<Store> {
        if limits.disk == 0 {
            return Store::new(limits);
        }
        let scan = match disk::scan(dir) {
            Ok(s) => s,
            Err(e) => {
                let store = Store::new(limits);
                store.disk_error(&format!("the folder {}", dir.display()), &e);
                return store;
            }
        };
        let mut index = Index::new(dir.to_path_buf(), limits.disk);
        let mut gone = Vec::new();
        for (name, size, h) in scan.entries {
            let v = Variant {
                sel: disk::selector(&h.meta),
                name,
                size,
                body_len: h.body_len,
            };
            gone.extend(index.insert(&h.key, v));
        }
        let mut errors = scan.errors;
        for n in gone {
            if disk::remove_file(dir, n).is_err() {
                errors += 1;
            }
        }
        let (tx, rx) = mpsc::channel();
        let thread_dir = dir.to_path_buf();
        let mut failed = None;
        let store = Arc::new_cyclic(|weak: &Weak<Store>| {
            let weak = weak.clone();
            let thread = std::thread::Builder::new()
                .name("qweb-cache-disk".into())
                .spawn(move || writer(weak, rx, thread_dir));
            match thread {
                Ok(t) => {
                    let w = Writer {
                        tx,
                        thread: Some(t),
                        queued: AtomicUsize::new(0),
                        queued_bytes: AtomicUsize::new(0),
                    };
                    Store::bare(limits, Some(index), Some(w))
                }
                Err(e) => {
                    failed = Some(e);
                    Store::bare(limits, None, None)
                }
            }
        });
        if let Some(e) = failed {
            store.disk_error("the writer thread", &e);
        }
        store
            .stats
            .disk_dropped
            .fetch_add(scan.dropped, Ordering::Relaxed);
        store.stats.disk_errors.fetch_add(errors, Ordering::Relaxed);
        let inner = store.lock();
        store.publish(&inner);
        drop(inner);
        store
    }

    /// Counts a disk error; logs the first one (the store goes on without that write).
    pub(super) fn disk_error(&self, what: &str, e: &dyn std::fmt::Display) {
        self.stats.disk_errors.fetch_add(1, Ordering::Relaxed);
        if !self.logged.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "proxy cache disk tier: {what}: {e} (responses are still served; \
                 later disk errors are counted in qweb_proxy_cache_disk_errors_total)"
            );
        } else {
            tracing::debug!("proxy cache disk tier: {what}: {e}");
        }
    }

    /// Queues files for removal (never skipped).
    pub(super) fn remove_files(&self, names: Vec<Name>) {
        if names.is_empty() {
            return;
        }
        if let Some(w) = &self.writer {
            let _ = w.tx.send(Job::Remove(names));
        }
    }

    /// Queues `entry` for the disk, unless the queue is full (counted).
    pub(super) fn queue_write(&self, inner: &Inner, key: &str, entry: Arc<Entry>) {
        let (Some(w), Some(ix)) = (&self.writer, &inner.disk) else {
            return;
        };
        let len = entry.body.len();
        if len as u64 > ix.limit {
            return;
        }
        let n = w.queued.fetch_add(1, Ordering::Relaxed);
        let b = w.queued_bytes.fetch_add(len, Ordering::Relaxed);
        if n >= MAX_QUEUED_WRITES || b + len > MAX_QUEUED_BYTES {
            w.queued.fetch_sub(1, Ordering::Relaxed);
            w.queued_bytes.fetch_sub(len, Ordering::Relaxed);
            self.stats.disk_skipped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let job = Job::Write {
            key: key.to_owned(),
            entry,
            epoch: inner.epoch,
        };
        if w.tx.send(job).is_err() {
            w.queued.fetch_sub(1, Ordering::Relaxed);
            w.queued_bytes.fetch_sub(len, Ordering::Relaxed);
        }
    }

    /// The writer thread's part of a write: the file, then the index (unless purged since).
    pub(super) fn write_to_disk(&self, dir: &Path, key: &str, entry: &Entry, epoch: u64) {
        let Some(bytes) = crate::format::encode(key, &entry.meta, &entry.body) else {
            return;
        };
        let size = bytes.len() as u64;
        let (name, room) = {
            let mut inner = self.lock();
            if inner.purged_since(key, epoch) {
                return;
            }
            let Some(ix) = inner.disk.as_mut() else {
                return;
            };
            if size > ix.limit {
                return;
            }
            let name = match ix.same_variant(key, &entry.meta.vary) {
                Some(n) => n,
                None => ix.fresh_name(),
            };
            // room first: the folder never holds more than the bound, even while writing
            let before = ix.evicted;
            let room = ix.reserve(size);
            let evicted = ix.evicted - before;
            self.stats
                .disk_evictions
                .fetch_add(evicted, Ordering::Relaxed);
            self.publish(&inner);
            (name, room)
        };
        for n in room {
            if let Err(e) = disk::remove_file(dir, n) {
                self.disk_error("removing an entry file", &e);
            }
        }
        if let Err(e) = disk::write_file(dir, name, &bytes) {
            self.disk_error(&format!("writing to {}", dir.display()), &e);
            return;
        }
        let gone = {
            let mut inner = self.lock();
            if inner.purged_since(key, epoch) {
                None
            } else if let Some(ix) = inner.disk.as_mut() {
                let before = ix.evicted;
                let v = Variant {
                    sel: disk::selector(&entry.meta),
                    name,
                    size,
                    body_len: entry.body.len() as u64,
                };
                let gone = ix.insert(key, v);
                let evicted = ix.evicted - before;
                self.stats.disk_stored.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .disk_evictions
                    .fetch_add(evicted, Ordering::Relaxed);
                self.publish(&inner);
                Some(gone)
            } else {
                None
            }
        };
        // purged meanwhile: the file goes (the purge's own removal did not know it)
        let gone = gone.unwrap_or_else(|| vec![name]);
        for n in gone {
            if let Err(e) = disk::remove_file(dir, n) {
                self.disk_error("removing an entry file", &e);
            }
        }
    }

    /// The most recent disk variant of `key` whose `Vary` fields match `req`, read (in a
    /// blocking task: call it on a tokio runtime), checked and promoted to memory; `None`
    /// without a disk tier, when there is none, or when the file failed its checks (then it
    /// is removed and never served). A purge of `key` while it is read wins: not served.
    pub async fn lookup_disk(self: &Arc<Self>, key: &str, req: &HeaderMap) -> Option<Arc<Entry>> {
        let (name, size, vary, epoch, dir) = {
            let mut inner = self.lock();
            let max = inner.limits.max_object_size as u64;
            let epoch = inner.epoch;
            let ix = inner.disk.as_mut()?;
            let dir = ix.dir.clone();
            let v = ix
                .keys
                .get(key)?
                .iter()
                .rev()
                .find(|v| v.body_len <= max && v.sel.vary_matches(req))?;
            (v.name, v.size, v.sel.vary.clone(), epoch, dir)
        };
        let read = tokio::task::spawn_blocking(move || disk::read_file(&dir, name, size)).await;
        let mut inner = self.lock();
        let drop_variant = |inner: &mut Inner| {
            if let Some(ix) = inner.disk.as_mut() {
                ix.remove_where(key, |v| v.name == name);
            }
        };
        match read {
            Ok(Ok(r)) if r.key == key && r.meta.vary == vary => {
                if inner.purged_since(key, epoch) {
                    return None;
                }
                let entry = Entry::new(r.meta, r.body);
                let stored = self.put(&mut inner, key, entry);
                if stored.is_some() {
                    self.stats.disk_hits.fetch_add(1, Ordering::Relaxed);
                }
                self.publish(&inner);
                stored
            }
            Ok(Ok(_)) => {
                // another entry's file (a name collision replaced it): not this key's
                drop_variant(&mut inner);
                self.publish(&inner);
                None
            }
            Ok(Err(e)) => {
                drop_variant(&mut inner);
                self.publish(&inner);
                drop(inner);
                match e {
                    crate::format::Corrupt::Io(e) => self.disk_error("reading an entry", &e),
                    e => {
                        self.stats.disk_dropped.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(key, error = %e, "proxy cache: dropped a corrupt disk entry");
                    }
                }
                None
            }
            Err(_) => None,
        }
    }

    /// Waits until the disk writer has done every job queued before (at most `timeout`);
    /// false when it did not in time. Blocks: for shutdown and tests, never an event loop.
    pub fn sync_disk(&self, timeout: std::time::Duration) -> bool {
        let Some(w) = &self.writer else {
            return true;
        };
        let (tx, rx) = mpsc::sync_channel(1);
        if w.tx.send(Job::Sync(tx)).is_err() {
            return true;
        }
        rx.recv_timeout(timeout).is_ok()
    }

    /// The disk tier's folder, when there is one.
    pub fn disk_dir(&self) -> Option<PathBuf> {
        self.lock().disk.as_ref().map(|ix| ix.dir.clone())
    }
}

/// The disk writer thread: takes the jobs in order until the store is gone and the channel
/// closed.
fn writer(store: Weak<Store>, rx: mpsc::Receiver<Job>, dir: PathBuf) {
    for job in rx {
        match job {
            Job::Write { key, entry, epoch } => {
                let Some(store) = store.upgrade() else {
                    continue;
                };
                store.write_to_disk(&dir, &key, &entry, epoch);
                if let Some(w) = &store.writer {
                    w.queued.fetch_sub(1, Ordering::Relaxed);
                    w.queued_bytes
                        .fetch_sub(entry.body.len(), Ordering::Relaxed);
                }
            }
            Job::Sync(done) => {
                let _ = done.send(());
            }
            Job::Remove(names) => {
                for n in names {
                    if let Err(e) = disk::remove_file(&dir, n) {
                        if let Some(s) = store.upgrade() {
                            s.disk_error("removing an entry file", &e);
                        }
                    }
                }
            }
        }
    }
}
