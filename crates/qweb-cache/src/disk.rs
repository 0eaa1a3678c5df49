//! The disk tier's index and files: one entry file per stored variant ([`crate::format`]) in
//! one folder, named `<16 hex digits>.qc`; written to `<name>.tmp` and renamed into place, so
//! a reader sees a whole file or none. The index (key → variants, least recently used first,
//! bytes and objects) lives in memory, under the store's lock; every function here that
//! touches a file is called off the event loop (the store's writer thread, a blocking task,
//! or the start-up scan, before the workers run).
//!
//! At start [`scan`] rebuilds the index from the headers alone (one `open` and one small
//! read per file; bodies are checked when read); files that fail are removed.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use bytes::Bytes;
use lru::LruCache;

use crate::format::{self, Corrupt, Header};
use crate::policy::Meta;

/// An entry file's name (its number).
pub(crate) type Name = u64;

/// What the index holds of one stored variant on disk.
#[derive(Debug)]
pub(crate) struct Variant {
    /// What [`Meta::vary_matches`] needs: the `Vary` values (and `Content-Language`), no
    /// other field.
    pub sel: Meta,
    pub name: Name,
    /// The whole file's bytes (counted against the disk bound).
    pub size: u64,
    pub body_len: u64,
}

/// The disk tier's index.
pub(crate) struct Index {
    pub dir: PathBuf,
    pub keys: LruCache<String, Vec<Variant>>,
    pub bytes: u64,
    pub objects: u64,
    pub limit: u64,
    /// Variants evicted so far.
    pub evicted: u64,
    next: u64,
}

impl Index {
    /// An empty index of `dir`, bounded by `limit` bytes.
    pub fn new(dir: PathBuf, limit: u64) -> Index {
        let seed = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ (u64::from(std::process::id()) << 40);
        Index {
            dir,
            keys: LruCache::unbounded(),
            bytes: 0,
            objects: 0,
            limit,
            evicted: 0,
            next: seed,
        }
    }

    /// A file name for a new variant: a 64-bit mix of a counter seeded by the clock and the
    /// process id (a collision, 2^-64 per pair, replaces the other entry's file, whose key
    /// then does not match when it is read: a miss, not a wrong response).
    pub fn fresh_name(&mut self) -> Name {
        self.next = self.next.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.next;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// The variant of `key` with the same `Vary` values as `vary`, if any.
    pub fn same_variant(&self, key: &str, vary: &[(String, Option<Vec<u8>>)]) -> Option<Name> {
        self.keys
            .peek(key)?
            .iter()
            .find(|v| v.sel.vary == vary)
            .map(|v| v.name)
    }

    /// Adds (or replaces, by `Vary` values) a variant of `key`; the names of the files it
    /// displaced (a replaced variant in another file) and evicted to stay within the bound.
    pub fn insert(&mut self, key: &str, v: Variant) -> Vec<Name> {
        let mut gone = self.remove_where(key, |o| o.sel.vary == v.sel.vary);
        gone.retain(|n| *n != v.name);
        self.bytes += v.size;
        self.objects += 1;
        self.keys
            .get_or_insert_mut(key.to_owned(), Vec::new)
            .push(v);
        gone.extend(self.evict());
        gone
    }

    /// Removes least recently used keys until the bytes are within the bound; their names.
    pub fn evict(&mut self) -> Vec<Name> {
        self.reserve(0)
    }

    /// Removes least recently used keys until `size` more bytes fit within the bound; their
    /// names.
    pub fn reserve(&mut self, size: u64) -> Vec<Name> {
        let mut gone = Vec::new();
        while self.bytes + size > self.limit {
            let Some((_, vs)) = self.keys.pop_lru() else {
                break;
            };
            for v in vs {
                self.bytes -= v.size;
                self.objects -= 1;
                self.evicted += 1;
                gone.push(v.name);
            }
        }
        gone
    }

    /// Removes the variants of `key` that `which` picks; their names.
    pub fn remove_where(&mut self, key: &str, which: impl Fn(&Variant) -> bool) -> Vec<Name> {
        let Some(vs) = self.keys.peek_mut(key) else {
            return Vec::new();
        };
        let mut gone = Vec::new();
        let mut freed = 0;
        vs.retain(|v| {
            let keep = !which(v);
            if !keep {
                freed += v.size;
                gone.push(v.name);
            }
            keep
        });
        if vs.is_empty() {
            self.keys.pop(key);
        }
        self.bytes -= freed;
        self.objects -= gone.len() as u64;
        gone
    }

    /// Removes every variant of every key starting with `prefix`; their names.
    pub fn remove_prefix(&mut self, prefix: &str) -> Vec<Name> {
        let keys: Vec<String> = self
            .keys
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(k, _)| k.clone())
            .collect();
        keys.iter()
            .flat_map(|k| self.remove_where(k, |_| true))
            .collect()
    }
}

/// The path of entry file `name` in `dir`.
pub(crate) fn file_path(dir: &Path, name: Name) -> PathBuf {
    dir.join(format!("{name:016x}.qc"))
}

/// What the index keeps of a header.
pub(crate) fn selector(meta: &Meta) -> Meta {
    let mut headers = http::HeaderMap::new();
    if let Some(l) = meta.headers.get(http::header::CONTENT_LANGUAGE) {
        headers.insert(http::header::CONTENT_LANGUAGE, l.clone());
    }
    Meta {
        status: meta.status,
        headers,
        request_time: meta.request_time,
        response_time: meta.response_time,
        vary: meta.vary.clone(),
    }
}

/// Writes `bytes` as entry file `name` of `dir`: a temporary file, then a rename over the
/// name. The temporary file is removed when anything fails.
pub(crate) fn write_file(dir: &Path, name: Name, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join(format!("{name:016x}.tmp"));
    let result = File::create(&tmp)
        .and_then(|mut f| f.write_all(bytes))
        .and_then(|()| std::fs::rename(&tmp, file_path(dir, name)));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Removes entry file `name` of `dir` (gone already is fine).
pub(crate) fn remove_file(dir: &Path, name: Name) -> std::io::Result<()> {
    match std::fs::remove_file(file_path(dir, name)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// A stored response read back from disk.
#[derive(Debug)]
pub(crate) struct Read {
    pub key: String,
    pub meta: Meta,
    pub body: Bytes,
}

/// Reads entry file `name` of `dir` whole and checks it; a corrupt one is removed. A file
/// whose size is not `size` (what the index knew) is not read at all: a file swapped for a
/// huge one is not taken into memory.
pub(crate) fn read_file(dir: &Path, name: Name, size: u64) -> Result<Read, Corrupt> {
    let path = file_path(dir, name);
    let checked = File::open(&path).map_err(Corrupt::Io).and_then(|mut f| {
        if f.metadata()?.len() != size {
            return Err(Corrupt::Length);
        }
        let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        std::io::Read::read_to_end(&mut f, &mut bytes)?;
        format::decode(&bytes).map(|(h, body)| (h, body, bytes))
    });
    match checked {
        Ok((h, body, bytes)) => {
            let bytes = Bytes::from(bytes);
            Ok(Read {
                key: h.key,
                meta: h.meta,
                body: bytes.slice(body),
            })
        }
        Err(Corrupt::Io(e)) => Err(Corrupt::Io(e)),
        Err(e) => {
            let _ = std::fs::remove_file(&path);
            Err(e)
        }
    }
}

/// What a start-up scan found.
#[derive(Debug, Default)]
pub(crate) struct Scan {
    /// The entries whose header is whole, oldest response first.
    pub entries: Vec<(Name, u64, Header)>,
    /// Files removed: corrupt, truncated, of another version, or duplicates.
    pub dropped: u64,
    /// Files that could not be read or removed.
    pub errors: u64,
}

/// Reads the header of every entry file in `dir` (creating it when missing); removes
/// leftover temporary files and every entry file that fails its checks.
pub(crate) fn scan(dir: &Path) -> std::io::Result<Scan> {
    std::fs::create_dir_all(dir)?;
    let mut scan = Scan::default();
    for e in std::fs::read_dir(dir)? {
        let Ok(e) = e else {
            scan.errors += 1;
            continue;
        };
        let path = e.path();
        let Some(file) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if file.ends_with(".tmp") {
            let _ = std::fs::remove_file(&path);
            continue;
        }
        let Some(name) = file
            .strip_suffix(".qc")
            .filter(|h| h.len() == 16)
            .and_then(|h| u64::from_str_radix(h, 16).ok())
        else {
            continue;
        };
        let header = File::open(&path).map_err(Corrupt::Io).and_then(|mut f| {
            let len = f.metadata()?.len();
            format::read_header(&mut std::io::BufReader::with_capacity(4096, &mut f), len)
                .map(|h| (len, h))
        });
        match header {
            Ok((len, h)) => scan.entries.push((name, len, h)),
            Err(Corrupt::Io(_)) => scan.errors += 1,
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "proxy cache: dropping a disk entry");
                scan.dropped += 1;
                if std::fs::remove_file(&path).is_err() {
                    scan.errors += 1;
                }
            }
        }
    }
    scan.entries.sort_by_key(|(_, _, h)| h.meta.response_time);
    Ok(scan)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn variant(name: Name, size: u64) -> Variant {
        let now = SystemTime::now();
        Variant {
            sel: Meta::new(
                http::StatusCode::OK,
                &http::HeaderMap::new(),
                &http::HeaderMap::new(),
                now,
                now,
            ),
            name,
            size,
            body_len: size,
        }
    }

    #[test]
    fn the_index_stays_within_its_bound_and_evicts_the_oldest() {
        let mut ix = Index::new(PathBuf::from("/nonexistent"), 1000);
        let mut gone = Vec::new();
        for i in 0..100 {
            gone.extend(ix.insert(&format!("k{i}"), variant(i, 100)));
            assert!(ix.bytes <= 1000);
        }
        assert_eq!(ix.objects, 10);
        assert_eq!(gone, (0..90).collect::<Vec<_>>());
        // a replaced variant (same Vary values) frees its old file
        let g = ix.insert("k99", variant(500, 100));
        assert_eq!(g, vec![99]);
        let mut g = ix.remove_prefix("k9");
        g.sort_unstable();
        assert_eq!(g, vec![90, 91, 92, 93, 94, 95, 96, 97, 98, 500]);
        assert_eq!((ix.objects, ix.bytes), (0, 0));
    }
}
