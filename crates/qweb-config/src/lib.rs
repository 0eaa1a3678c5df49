//! Configuration: the TOML file, its validation, and the built-in default.
//!
//! Every error names the file, the line and column, and the key (see [`ConfigError`]). Unknown
//! keys are refused. Relative paths in a file are resolved against the file's directory.
//!
//! Each section has its module, holding its typed settings and the part of `Validator` that
//! checks them: `limits`, `log`, `offload`, `listener` (with `tls` for session resumption and
//! OCSP), `route` (with `proxy` for proxy routes, `rate_limit`, `basic_auth`), `sites`, `compression`, `file_cache`, `cache`, `fleet`. The
//! file as written is `raw`. This module holds [`Config`], its entry points and defaults, and
//! `Validator` with its shared helpers.

mod access;
mod acme;
mod basic_auth;
mod cache;
mod certificates;
mod compression;
mod error;
mod file_cache;
mod fleet;
mod fleet_limit;
mod forward_auth;
mod limits;
mod listener;
mod log;
mod offload;
mod proxy;
mod rate_limit;
mod raw;
mod route;
mod sites;
mod source;
mod tls;
pub mod units;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use access::AccessRules;
pub use acme::{
    AcmeChallenge, AcmeConfig, DEFAULT_ACME_DIRECTORY, DEFAULT_ACME_RETRY, MAX_ACME_RETRY,
};
pub use basic_auth::{
    read_users, BasicAuth, PasswordHash, Users, VerifiedCache, DEFAULT_BASIC_AUTH_CACHE_SIZE,
    DEFAULT_BASIC_AUTH_CACHE_TTL, DEFAULT_BASIC_AUTH_MAX_PENDING, MAX_ARGON2_MEMORY_KIB,
    MAX_ARGON2_PASSES, MAX_BASIC_AUTH_CACHE_SIZE, MAX_BASIC_AUTH_CACHE_TTL,
    MAX_BASIC_AUTH_MAX_PENDING,
};
pub use cache::{CacheConfig, RouteCache};
pub use compression::CompressionConfig;
pub use error::ConfigError;
pub use file_cache::FileCacheConfig;
pub use fleet::{
    default_node_name, FleetConfig, FleetSecret, DEFAULT_FLEET_KEY_PREFIX, DEFAULT_FLEET_TIMEOUT,
    MAX_FLEET_TIMEOUT,
};
pub use forward_auth::{
    ForwardAuth, DEFAULT_FORWARD_AUTH_RESPONSE, DEFAULT_FORWARD_AUTH_TIMEOUT,
    MAX_FORWARD_AUTH_RESPONSE,
};
pub use limits::{AdminLimits, Limits};
pub use listener::{
    CertificateConfig, ListenerConfig, ProxyProtocol, TlsConfig, DEFAULT_ALT_SVC_MAX_AGE,
    DEFAULT_QUIC_RETRY_THRESHOLD,
};
pub use log::{AccessFormat, LogConfig};
pub use offload::{
    EngineConfig, EngineKind, KeyserverEngineConfig, ListenerOffload, OffloadConfig,
};
pub use proxy::{
    Balance, HashKey, HealthCheck, ProxyConfig, Upstream, UpstreamGauges, UpstreamProxyProtocol,
};
// for `forward_auth`'s one upstream (a module of its own would make a circle through raw.rs)
pub use fleet_limit::{FleetLimiter, LeaseRequest, LeaseStore};
use proxy::parse_upstream;
pub use rate_limit::{
    RateLimit, RateLimiter, Verdict, DEFAULT_RATE_LIMIT_KEYS, MAX_RATE_LIMIT_BURST,
    MAX_RATE_LIMIT_KEYS,
};
use raw::{RawConfig, Workers};
pub use route::{OpenMethod, RouteAction, RouteConfig, StaticConfig, Symlinks};
pub use sites::{
    ErrorPages, HeaderEdits, RedirectConfig, RewriteRule, RouteRules, SiteConfig, SitesConfig,
    ValuePart,
};
pub use source::{MAX_CONFIG_FILES, MAX_CONFIG_FILE_SIZE, MAX_INCLUDE_DEPTH};
pub use tls::{ClientAuthConfig, OcspSource, SessionConfig, TicketKeys};

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from (`None`: the built-in default).
    pub source: Option<PathBuf>,
    /// Every file read: `source` first, then the files it includes, in the order read
    /// (empty for the built-in default).
    pub files: Vec<PathBuf>,
    /// Number of worker threads.
    pub workers: usize,
    /// Where qweb keeps its state (the self-signed certificate, the built-in welcome site).
    pub state_dir: PathBuf,
    /// How long in-flight requests may run after SIGINT/SIGTERM before the process exits.
    pub shutdown_timeout: Duration,
    /// How long a tunnel (an accepted WebSocket or other upgrade) of a configuration a
    /// reload or binary upgrade replaced may go on; then (or at shutdown) a WebSocket gets a
    /// close frame 1001 (going away) and the tunnel closes.
    pub upgrade_drain_timeout: Duration,
    /// Protective limits.
    pub limits: Limits,
    /// Logging.
    pub log: LogConfig,
    /// Listening sockets.
    pub listeners: Vec<ListenerConfig>,
    /// Routes, longest prefix first.
    pub routes: Vec<RouteConfig>,
    /// Offload engines and batching.
    pub offload: OffloadConfig,
    /// The admin listener (`/metrics`), off unless configured.
    pub admin: Option<SocketAddr>,
    /// Bounds of the admin listener's connections (`[admin]` `max_connections`,
    /// `connections_per_client`, `header_timeout`, `idle_timeout`).
    pub admin_limits: AdminLimits,
    /// The open-file cache of static routes (`[file_cache]`).
    pub file_cache: FileCacheConfig,
    /// The proxy cache's store (`[cache]`), used by routes with `cache`.
    pub cache: CacheConfig,
    /// Response compression (`[compression]`).
    pub compression: CompressionConfig,
    /// Virtual hosts (`[[site]]`); `routes` answer the names no site claims unless a site is
    /// the default.
    pub sites: SitesConfig,
    /// The store the fleet's nodes share (`[fleet]`), off unless configured.
    pub fleet: Option<FleetConfig>,
}

/// Default `upgrade_drain_timeout`: tunnels of a replaced configuration live on up to an
/// hour (nginx keeps its old workers until their sockets end).
pub const DEFAULT_UPGRADE_DRAIN_TIMEOUT: Duration = Duration::from_secs(3600);

impl Config {
    /// Reads and validates a configuration file and the files it includes, with environment
    /// variables expanded (see the `source` module).
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = source::read_limited(path).map_err(|m| ConfigError {
            file: Some(path.to_owned()),
            line: 0,
            column: 0,
            key: String::new(),
            message: format!("cannot read the configuration file: {m}"),
        })?;
        Config::from_str_at(&text, Some(path))
    }

    /// Parses and validates configuration text; `file` names it in errors and anchors relative
    /// paths and includes (the current directory when `None`).
    pub fn from_str_at(text: &str, file: Option<&Path>) -> Result<Config, ConfigError> {
        Config::from_str_with_env(text, file, &source::env::process_env)
    }

    /// [`Config::from_str_at`] with environment variables from `env`.
    fn from_str_with_env(
        text: &str,
        file: Option<&Path>,
        env: source::env::Lookup,
    ) -> Result<Config, ConfigError> {
        let (sources, root) = source::load(text.to_owned(), file, env)?;
        let raw: RawConfig =
            serde_path_to_error::deserialize(source::de::NodeDe(root)).map_err(|e| {
                // toml::Spanned shows up in the path as a private field name: drop it.
                let key = e
                    .path()
                    .to_string()
                    .replace(".$__serde_spanned_private_value", "");
                let inner = e.into_inner();
                sources.error(
                    inner.span,
                    if key == "." { String::new() } else { key },
                    inner.message,
                )
            })?;
        Validator {
            file,
            sources: &sources,
            site_certs: sites::any_certificates(&raw),
            has_fleet: raw.fleet.is_some(),
        }
        .validate(raw)
    }

    /// The configuration `qweb serve` uses without `--config`: HTTPS on 127.0.0.1:8443 with the
    /// self-signed certificate, HTTP on 127.0.0.1:8080, serving `./public` when it exists, else
    /// the built-in welcome site.
    pub fn default_config() -> Config {
        let state_dir = default_state_dir();
        Config {
            source: None,
            files: Vec::new(),
            workers: default_workers(),
            routes: route::default_routes(&state_dir),
            state_dir,
            shutdown_timeout: Duration::from_secs(10),
            upgrade_drain_timeout: DEFAULT_UPGRADE_DRAIN_TIMEOUT,
            limits: Limits::default(),
            log: LogConfig::default(),
            listeners: listener::default_listeners(),
            offload: OffloadConfig::default(),
            admin: None,
            admin_limits: AdminLimits::default(),
            compression: CompressionConfig::default(),
            file_cache: FileCacheConfig::default(),
            cache: CacheConfig::default(),
            sites: SitesConfig::default(),
            fleet: None,
        }
    }

    /// Where the built-in welcome site lives (written there at start when a route serves
    /// it).
    pub fn welcome_root(&self) -> PathBuf {
        self.state_dir.join("welcome")
    }
}

/// The configuration file `qweb` reads without `--config`, when it exists (nginx's and
/// Caddy's habit); `$QWEB_CONFIG` names another (for tests, containers, unprivileged runs).
pub const DEFAULT_CONFIG_PATH: &str = "/etc/qweb/qweb.toml";

/// The default configuration file: `$QWEB_CONFIG` when set and not empty, else
/// [`DEFAULT_CONFIG_PATH`]. Whether it exists is the caller's question: without it, `qweb
/// serve` runs [`Config::default_config`].
pub fn default_config_path() -> PathBuf {
    std::env::var_os("QWEB_CONFIG")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_PATH))
}

/// Default number of workers: the number of CPU cores.
pub fn default_workers() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Default state folder: `$QWEB_STATE_DIR`, else `$XDG_STATE_HOME/qweb`, else
/// `$HOME/.local/state/qweb`, else `./.qweb`.
pub fn default_state_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("QWEB_STATE_DIR").filter(|d| !d.is_empty()) {
        return absolute(Path::new(&d));
    }
    if let Some(d) = std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("qweb");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(h).join(".local/state/qweb");
    }
    absolute(Path::new(".qweb"))
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_owned())
}

/// Turns the file as written into a [`Config`]; its `impl` blocks are spread over the
/// section modules.
struct Validator<'a> {
    /// The main file.
    file: Option<&'a Path>,
    /// Its text and the text of the files it includes.
    sources: &'a source::Sources,
    /// A `[[site]]` has certificates: a TLS listener may take those alone.
    site_certs: bool,
    /// The file has a `[fleet]` (for `scope = "fleet"` limits, validated before it).
    has_fleet: bool,
}

impl Validator<'_> {
    /// An error at `span` (a byte range of the file) about `key`.
    fn err(
        &self,
        span: Option<std::ops::Range<usize>>,
        key: impl Into<String>,
        msg: impl Into<String>,
    ) -> ConfigError {
        self.sources.error(span, key, msg)
    }

    /// A path written at `span`, relative to the folder of the file it is written in.
    fn path(&self, p: &Path, span: std::ops::Range<usize>) -> PathBuf {
        absolute(&self.sources.dir_of(span.start).join(p))
    }

    /// Byte span of a dotted key's value, for errors found after parsing (best effort: the
    /// first occurrence of the last key segment inside its table, in any file).
    fn span_of_key(&self, dotted: &str) -> Option<std::ops::Range<usize>> {
        self.sources.texts().find_map(|(text, base)| {
            span_of_key(text, dotted).map(|s| s.start + base..s.end + base)
        })
    }

    /// Validates the whole file, section by section.
    fn validate(&self, raw: RawConfig) -> Result<Config, ConfigError> {
        let workers = match raw.workers.as_ref().map(|w| *w.get_ref()) {
            None | Some(Workers::Auto) => default_workers(),
            Some(Workers::Count(n)) => n,
        };
        let state_dir = match &raw.state_dir {
            Some(d) => self.path(d.get_ref(), d.span()),
            None => default_state_dir(),
        };
        let limits = self.limits(&raw.limits)?;
        let log = self.log(&raw.log)?;

        let offload = self.offload(&raw.offload)?;
        let mut listeners = self.listeners(raw.listeners.as_ref(), &offload)?;
        let routes = self.routes(&raw.routes, &state_dir)?;

        let compression = self.compression(raw.compression.as_ref(), &offload)?;
        let sites = self.sites(&raw, &mut listeners, &offload)?;
        let file_cache = self.file_cache(&raw.file_cache)?;
        let cache = self.cache(&raw.cache, &state_dir)?;
        let admin_limits = self.admin_limits(raw.admin.as_ref())?;
        let fleet = self.fleet(raw.fleet.as_ref())?;
        self.fleet_ticket_keys(&listeners, fleet.as_ref())?;
        self.fleet_acme(&sites, fleet.as_ref())?;
        Ok(Config {
            source: self.file.map(absolute),
            files: self.sources.paths().iter().map(|p| absolute(p)).collect(),
            workers,
            state_dir,
            shutdown_timeout: raw
                .shutdown_timeout
                .map(|d| d.0)
                .unwrap_or(Duration::from_secs(10)),
            upgrade_drain_timeout: raw
                .upgrade_drain_timeout
                .map(|d| d.0)
                .unwrap_or(DEFAULT_UPGRADE_DRAIN_TIMEOUT),
            limits,
            log,
            listeners,
            routes,
            offload,
            admin: raw.admin.as_ref().map(|a| *a.address.get_ref()),
            admin_limits,
            compression,
            file_cache,
            cache,
            sites,
            fleet,
        })
    }
}

/// Byte span of a dotted key's value, for errors found after parsing (best effort: the first
/// occurrence of the last key segment inside its table).
fn span_of_key(text: &str, dotted: &str) -> Option<std::ops::Range<usize>> {
    let (table, key) = dotted.rsplit_once('.').unwrap_or(("", dotted));
    let mut in_table = table.is_empty();
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let t = line.trim();
        if t.starts_with('[') {
            in_table = t.trim_matches(|c| c == '[' || c == ']').trim() == table;
        } else if in_table {
            if let Some((k, _)) = t.split_once('=') {
                if k.trim() == key {
                    let start = offset + line.find(k.trim()).unwrap_or(0);
                    return Some(start..start + key.len());
                }
            }
        }
        offset += line.len();
    }
    None
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_traffic;
