//! `[cache]` (the proxy cache's store: limits shared by every cached route) and a proxy
//! route's `cache = {}` (the route is cached).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::units::{Dur, Size};
use super::{ConfigError, RouteAction, Validator};

/// The proxy cache's store (`[cache]`), one for the whole server.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheConfig {
    /// Bytes of stored responses held in memory, at most (bodies, fields and a fixed
    /// overhead per entry); least recently used responses are evicted beyond.
    pub memory: u64,
    /// The largest response body stored; larger ones stream through unstored.
    pub max_object_size: u64,
    /// How long a request for a key another request is filling waits for that fill
    /// (collapsed misses) before it goes to the upstream itself.
    pub collapse_timeout: Duration,
    /// Bytes of stored responses held on disk, at most (whole entry files: header and
    /// body); `0` turns the disk tier off. Least recently used entries are removed beyond.
    pub disk: u64,
    /// The disk tier's folder (`<state_dir>/cache` unless set); `None` only in a
    /// [`CacheConfig::default`], which means that default.
    pub path: Option<PathBuf>,
}

/// The disk tier's default size.
pub const DEFAULT_DISK: u64 = 1 << 30;

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            memory: 256 << 20,
            max_object_size: 8 << 20,
            collapse_timeout: Duration::from_secs(5),
            disk: DEFAULT_DISK,
            path: None,
        }
    }
}

impl CacheConfig {
    /// The disk tier's folder for a server whose state folder is `state_dir`.
    pub fn disk_path(&self, state_dir: &Path) -> PathBuf {
        self.path.clone().unwrap_or_else(|| state_dir.join("cache"))
    }
}

/// A proxy route's `cache = {}`: its responses are cached by RFC 9111 (no keys yet: the
/// table is where per-route settings go).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RouteCache {}

/// `[cache]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCache {
    pub memory: Option<Size>,
    pub max_object_size: Option<Size>,
    pub collapse_timeout: Option<Dur>,
    pub disk: Option<Size>,
    pub path: Option<toml::Spanned<PathBuf>>,
}

/// A route's `cache` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRouteCache {}

impl Validator<'_> {
    /// Validates `[cache]`.
    pub(super) fn cache(
        &self,
        raw: &RawCache,
        state_dir: &Path,
    ) -> Result<CacheConfig, ConfigError> {
        let d = CacheConfig::default();
        let path = match &raw.path {
            Some(p) => self.path(p.get_ref(), p.span()),
            None => state_dir.join("cache"),
        };
        let c = CacheConfig {
            memory: raw.memory.map_or(d.memory, |s| s.0),
            max_object_size: raw.max_object_size.map_or(d.max_object_size, |s| s.0),
            collapse_timeout: raw.collapse_timeout.map_or(d.collapse_timeout, |v| v.0),
            disk: raw.disk.map_or(d.disk, |s| s.0),
            path: Some(path),
        };
        let bad = |key: &str, msg: &str| self.err(self.span_of_key(key), key, msg);
        if c.memory < 1 << 20 || c.memory > 1 << 40 {
            return Err(bad("cache.memory", "must be between 1MiB and 1TiB"));
        }
        if c.max_object_size == 0 || c.max_object_size > c.memory / 2 {
            return Err(bad(
                "cache.max_object_size",
                "must be at least 1 byte and at most half of cache.memory",
            ));
        }
        if c.collapse_timeout > Duration::from_secs(600) {
            return Err(bad("cache.collapse_timeout", "must be at most 10m"));
        }
        if c.disk != 0 && (c.disk < 1 << 20 || c.disk > 1 << 46 || c.disk < c.max_object_size) {
            return Err(bad(
                "cache.disk",
                "must be 0 (no disk tier) or between 1MiB and 64TiB, and at least cache.max_object_size",
            ));
        }
        if raw
            .path
            .as_ref()
            .is_some_and(|p| p.get_ref().as_os_str().is_empty())
        {
            return Err(bad("cache.path", "must not be empty"));
        }
        Ok(c)
    }

    /// Route `i`'s `cache` (a proxy route's only).
    pub(super) fn route_cache(
        &self,
        i: usize,
        raw: Option<&toml::Spanned<RawRouteCache>>,
        action: &RouteAction,
    ) -> Result<Option<RouteCache>, ConfigError> {
        let Some(c) = raw else {
            return Ok(None);
        };
        if !matches!(action, RouteAction::Proxy(_)) {
            return Err(self.err(
                Some(c.span()),
                format!("route[{i}].cache"),
                "`cache` is for proxy routes (with `upstreams`)",
            ));
        }
        Ok(Some(RouteCache {}))
    }
}
