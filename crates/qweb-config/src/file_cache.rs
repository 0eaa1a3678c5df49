//! `[file_cache]`: the per-worker open-file cache of static routes (see
//! the static files' `cache` module).

use std::time::Duration;

use serde::Deserialize;

use super::units::{Dur, Size};
use super::{ConfigError, Validator};

/// The open-file cache: small static files held in memory with their headers, per worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileCacheConfig {
    /// Files held per worker, at most (0 turns the cache off).
    pub entries: usize,
    /// Files up to this size are held (their bytes and headers); larger ones are streamed
    /// from disk on every request.
    pub max_file_size: u64,
    /// Bytes of file content held per worker, at most.
    pub memory: u64,
    /// A held file is used without looking at the disk for this long; then the next request
    /// for it opens the file again (by the route's rules) and compares device, inode, size and
    /// modification time. A file replaced, changed, removed or made unreachable is seen at
    /// most this long after.
    pub valid: Duration,
    /// Open files a worker keeps between the frames of its streamed responses (larger files,
    /// sidecars), least recently read closed first; a response whose file was closed opens
    /// it again (and checks it is the same file) when the client takes more. Bounds the fds
    /// that HTTP/2 streams whose client reads nothing can hold (see `FileBody` in the static files handler).
    pub held_fds: usize,
}

impl Default for FileCacheConfig {
    fn default() -> Self {
        FileCacheConfig {
            entries: 1024,
            max_file_size: 64 << 10,
            memory: 16 << 20,
            valid: Duration::from_secs(1),
            held_fds: 64,
        }
    }
}

/// `[file_cache]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFileCache {
    pub entries: Option<usize>,
    pub max_file_size: Option<Size>,
    pub memory: Option<Size>,
    pub valid: Option<Dur>,
    pub held_fds: Option<usize>,
}

impl Validator<'_> {
    pub(super) fn file_cache(&self, raw: &RawFileCache) -> Result<FileCacheConfig, ConfigError> {
        let d = FileCacheConfig::default();
        let c = FileCacheConfig {
            entries: raw.entries.unwrap_or(d.entries),
            max_file_size: raw.max_file_size.map_or(d.max_file_size, |s| s.0),
            memory: raw.memory.map_or(d.memory, |s| s.0),
            valid: raw.valid.map_or(d.valid, |v| v.0),
            held_fds: raw.held_fds.unwrap_or(d.held_fds),
        };
        let bad = |key: &str, msg: &str| self.err(self.span_of_key(key), key, msg);
        if c.entries > 1 << 20 {
            return Err(bad("file_cache.entries", "must be at most 1048576"));
        }
        if !(1..=16 << 20).contains(&c.max_file_size) {
            return Err(bad(
                "file_cache.max_file_size",
                "must be between 1 and 16MiB",
            ));
        }
        if c.memory > 1 << 30 {
            return Err(bad("file_cache.memory", "must be at most 1GiB"));
        }
        if c.memory < c.max_file_size {
            return Err(bad(
                "file_cache.memory",
                "must be at least file_cache.max_file_size",
            ));
        }
        if c.held_fds > 65536 {
            return Err(bad("file_cache.held_fds", "must be at most 65536"));
        }
        if c.valid.is_zero() || c.valid > Duration::from_secs(3600) {
            return Err(bad("file_cache.valid", "must be between 1ms and 1h"));
        }
        Ok(c)
    }
}
