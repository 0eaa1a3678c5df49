//! Configuration: the TOML file, its validation, and the built-in default.
//!
//! Every error names the file, the line and column, and the key (see [`ConfigError`]). Unknown
//! keys are refused. Relative paths in a file are resolved against the file's directory.

mod compression;
mod error;
mod file_cache;
mod log;
mod proxy;
mod raw;
mod sites;
mod tls;
pub mod units;

pub use file_cache::FileCacheConfig;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use compression::CompressionConfig;
pub use error::ConfigError;
pub use log::AccessFormat;
use qweb_offload::{Fallback, Mode, Policy};
use raw::{RawConfig, RawListener, RawRoute, Workers};
pub use sites::{
    ErrorPages, HeaderEdits, RedirectConfig, RewriteRule, RouteRules, SiteConfig, SitesConfig,
};
pub use tls::{OcspSource, SessionConfig, TicketKeys};
use toml::Spanned;

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from (`None`: the built-in default).
    pub source: Option<PathBuf>,
    /// Number of worker threads.
    pub workers: usize,
    /// Where qweb keeps its state (the self-signed certificate, the built-in welcome site).
    pub state_dir: PathBuf,
    /// How long in-flight requests may run after SIGINT/SIGTERM before the process exits.
    pub shutdown_timeout: Duration,
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
    /// Response compression (`[compression]`).
    /// The open-file cache of static routes (`[file_cache]`).
    pub file_cache: FileCacheConfig,
    pub compression: CompressionConfig,
    /// Virtual hosts (`[[site]]`); `routes` answer the names no site claims unless a site is
    /// the default.
    pub sites: SitesConfig,
}

/// Offload engines and how workers submit to them.
#[derive(Debug, Clone)]
pub struct OffloadConfig {
    /// Engines by name; `inline` always exists.
    pub engines: Vec<EngineConfig>,
    /// Submit ops in batches (flush at `batch_max` or when the worker is idle).
    pub batch: bool,
    /// Largest batch.
    pub batch_max: usize,
    /// Most handshake jobs live at once per worker; past it, handshakes sign synchronously.
    pub max_jobs_per_worker: usize,
}

impl Default for OffloadConfig {
    fn default() -> Self {
        OffloadConfig {
            engines: vec![EngineConfig {
                name: "inline".into(),
                kind: EngineKind::Inline,
            }],
            batch: true,
            batch_max: 16,
            max_jobs_per_worker: 4096,
        }
    }
}

/// One engine.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Its name, used by listeners and in metrics.
    pub name: String,
    /// What it is.
    pub kind: EngineKind,
}

/// Engine kinds.
#[derive(Debug, Clone)]
pub enum EngineKind {
    /// Runs ops on the calling thread.
    Inline,
    /// Dedicated threads behind a bounded queue.
    Pool {
        /// Engine threads.
        threads: usize,
        /// Queue bound; past it ops are refused (saturation fallback).
        queue: usize,
        /// For measurement only: every op completes at least this long after submission.
        added_latency: Duration,
        /// For fault testing only: every op fails.
        inject_failures: bool,
    },
    /// Key servers (`qweb keyserver`) holding the private keys.
    Keyserver(KeyserverEngineConfig),
}

/// A `keyserver` engine.
#[derive(Debug, Clone)]
pub struct KeyserverEngineConfig {
    /// `unix:/path` or `tls://host:port`.
    pub servers: Vec<qweb_keyserver::client::Endpoint>,
    /// Connections per key server.
    pub connections: usize,
    /// Most ops in flight; more are refused (saturation fallback).
    pub queue: usize,
    /// An op not answered within this fails.
    pub timeout: Duration,
    /// Client certificate and key, and the CA of the key servers' certificates, for `tls://`.
    pub client_cert: Option<PathBuf>,
    /// Client key.
    pub client_key: Option<PathBuf>,
    /// CA that key server certificates chain to.
    pub server_ca: Option<PathBuf>,
}

/// A listener's offload settings: the engine, by name, and the shared offload policy
/// (`mode`: `none` is [`Mode::InPlace`], `sync` [`Mode::Sync`], `async` [`Mode::Async`];
/// `fallback`: `software` or `fail`; `timeout`: per op).
#[derive(Debug, Clone)]
pub struct ListenerOffload {
    /// Engine name.
    pub engine: String,
    /// Mode, fallback and per-op timeout.
    pub policy: Policy,
}

/// Limits that protect the server from clients.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest request head (request line and headers) accepted; larger gets 431.
    pub max_request_header_size: usize,
    /// Time a client has to send a complete request head once it started one.
    pub header_read_timeout: Duration,
    /// Time an idle keep-alive connection is kept open.
    pub keepalive_timeout: Duration,
    /// Time a client has to complete the TLS handshake.
    pub tls_handshake_timeout: Duration,
    /// Open connections per worker; more wait in the listen backlog.
    pub max_connections_per_worker: usize,
    /// HTTP/2 streams per connection.
    pub max_concurrent_streams: u32,
    /// A response that makes no progress (the client takes nothing) for this long is cut:
    /// the HTTP/1 connection is closed, the HTTP/2 stream reset (the connection closed with
    /// GOAWAY when all its streams stalled).
    pub send_timeout: Duration,
    /// HTTP/2 control frames (SETTINGS, PING, WINDOW_UPDATE, PRIORITY, RST_STREAM, empty
    /// frames) a client may send per second (and in one burst); more gets GOAWAY
    /// ENHANCE_YOUR_CALM.
    pub h2_control_frames_per_second: u32,
    /// Bytes one connection may write in a row before its worker turns to its other
    /// connections (as nginx's `sendfile_max_chunk`): a fast download cannot hold a worker
    /// for longer than it takes to encrypt and send this much.
    pub write_burst: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_request_header_size: 16 * 1024,
            header_read_timeout: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(75),
            tls_handshake_timeout: Duration::from_secs(10),
            max_connections_per_worker: 10_000,
            max_concurrent_streams: 128,
            send_timeout: Duration::from_secs(60),
            h2_control_frames_per_second: 1000,
            write_burst: 256 << 10,
        }
    }
}

/// Logging settings.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// One access-log line per request on stdout.
    pub access: bool,
    /// Log filter for everything else (stderr), e.g. `info` or `qweb=debug`.
    pub level: String,
    /// Access log to this file (appended; reopened on SIGUSR1) instead of stdout.
    pub access_file: Option<PathBuf>,
    /// The access-log line format.
    pub format: AccessFormat,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            access: true,
            level: "info".into(),
            access_file: None,
            format: AccessFormat::default(),
        }
    }
}

/// One listening address.
#[derive(Debug, Clone)]
pub struct ListenerConfig {
    /// Address and port; port 0 picks a free port (used by tests).
    pub address: SocketAddr,
    /// TLS settings; `None` is plain HTTP/1.1.
    pub tls: Option<TlsConfig>,
    /// Offer HTTP/2 by ALPN (TLS listeners only).
    pub http2: bool,
    /// Offload of the TLS private-key operations (`None`: rustls signs in place).
    pub offload: Option<ListenerOffload>,
    /// Every request on this listener is redirected (`redirect = { to = ... }`).
    pub redirect: Option<RedirectConfig>,
    /// TLS session resumption (tickets, session cache).
    pub session: SessionConfig,
}

/// Where a TLS listener's certificates come from.
#[derive(Debug, Clone)]
pub enum TlsConfig {
    /// The self-signed certificate in the state folder, generated on first use.
    SelfSigned,
    /// Certificate chains and keys; the first is the default, others are chosen by SNI.
    Certificates(Vec<CertificateConfig>),
}

/// One certificate chain and its private key.
#[derive(Debug, Clone)]
pub struct CertificateConfig {
    /// PEM chain, leaf first.
    pub cert: PathBuf,
    /// The OCSP response to staple: a DER file (`ocsp = "file.der"`, re-read when it
    /// changes) or fetched from the certificate's responder (`ocsp = "fetch"`).
    pub ocsp: Option<OcspSource>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1). `None`: a key server holds it (the
    /// listener's offload engine is a key server).
    pub key: Option<PathBuf>,
}

pub use proxy::{Balance, HashKey, HealthCheck, UpstreamGauges};

/// A path prefix and what serves it.
#[derive(Debug, Clone)]
pub struct RouteConfig {
    /// Matches the path itself and everything below it (`/api` matches `/api` and `/api/x`, not
    /// `/apix`); `/` matches everything.
    pub prefix: String,
    /// Remove the prefix from the path before serving it (a static route then maps
    /// `/prefix/x` to `root/x`, a proxy route forwards `/x`). Off: the whole path is used.
    pub strip_prefix: bool,
    /// What serves the route.
    pub action: RouteAction,
    /// Header edits and `expires` around the handler.
    pub rules: RouteRules,
}

/// What serves a route.
#[derive(Debug, Clone)]
// a handful per configuration, built once: the size of the proxy variant costs nothing
#[allow(clippy::large_enum_variant)]
pub enum RouteAction {
    /// Files under a directory.
    Static(StaticConfig),
    /// Upstream HTTP/1.1 servers.
    Proxy(ProxyConfig),
    /// A redirect (`redirect = { to = "https://{host}{uri}", status = 308 }`).
    Redirect(RedirectConfig),
}

/// Static file serving.
#[derive(Debug, Clone)]
pub struct StaticConfig {
    /// The document root.
    pub root: PathBuf,
    /// File served for a directory.
    pub index: String,
    /// Which symlinks in a request's path are followed.
    pub symlinks: Symlinks,
    /// How files are opened beneath the root (not a config key: tests force the fallback).
    pub open_method: OpenMethod,
}

/// Which symlinks a static route follows (`symlinks = "inside_root" | "refuse" | "follow"`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Symlinks {
    /// Symlinks are followed as long as the path stays beneath the root (the kernel's
    /// `RESOLVE_BENEATH`): relative targets that stay inside work, absolute targets are
    /// refused even when they point inside the root, as is every target that leaves it.
    #[default]
    InsideRoot,
    /// No symlink anywhere in the path.
    Refuse,
    /// Any symlink, wherever it points (nginx's `disable_symlinks off`): whoever can create a
    /// symlink under the root can publish any file the server can read.
    Follow,
}

/// How a static route opens files beneath its root.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OpenMethod {
    /// `openat2` with `RESOLVE_BENEATH` when the kernel allows it (probed once per process),
    /// else [`OpenMethod::Walk`].
    #[default]
    Auto,
    /// One `openat(O_NOFOLLOW)` per path component from the root's directory fd, symlinks
    /// resolved by qweb with the same rules (the fallback where `openat2` is unavailable,
    /// e.g. blocked by seccomp).
    Walk,
}

/// Reverse proxy to upstream servers.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// Upstream servers, used round-robin.
    pub upstreams: Vec<Upstream>,
    /// Time to connect to an upstream.
    pub connect_timeout: Duration,
    /// Time to wait for the upstream's response head once the request body was sent, for the
    /// upstream to take more of the request body, and between upstream body reads.
    pub timeout: Duration,
    /// Longest pause between two reads of the client's request body (408 beyond).
    pub client_body_timeout: Duration,
    /// Idle keep-alive connections kept per upstream per worker.
    pub keepalive: usize,
    /// Forward the client's path bytes as sent instead of the normalised path.
    pub pass_raw_path: bool,
    /// Forward request headers whose names contain `_` (dropped by default, as nginx does:
    /// `X_Forwarded_For` must not pass next to `X-Forwarded-For`).
    pub underscores_in_headers: bool,
    /// Clients whose `X-Forwarded-Host`, `X-Forwarded-Proto`, `Forwarded` and `X-Real-IP` are
    /// passed on; from everyone else they are replaced.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Largest upstream response head; larger is a 502.
    pub max_response_header_size: usize,
    /// HTTP/1.1 `Upgrade` tokens passed through to the upstream (lowercase; default
    /// `["websocket"]`); other upgrades are stripped.
    pub upgrade: Vec<String>,
    /// An upgraded connection with no bytes moving either way for this long is closed.
    pub upgrade_idle_timeout: Duration,
    /// Largest request body (413 beyond); `None`: no limit.
    pub max_body_size: Option<u64>,
    /// Read the whole request body before sending it, with a `Content-Length`.
    pub buffer_request_body: bool,
    /// TLS to the `https://` upstreams (roots, client certificate), when there are any.
    pub upstream_tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    /// The name `https://` upstreams are verified against (and sent as SNI) instead of the
    /// URL's host (`upstream_server_name`).
    pub upstream_server_name: Option<String>,
    /// How an upstream is chosen (`balance`, `hash_key`).
    pub balance: Balance,
    /// Each upstream's weight (`weights`, default 1 each).
    pub weights: Vec<u32>,
    /// Connect failures in a row that take an upstream out (0: never).
    pub max_fails: u32,
    /// How long an upstream that failed `max_fails` times is skipped.
    pub fail_timeout: Duration,
    /// Active health checks (`health_check`).
    pub health_check: Option<HealthCheck>,
    /// Upstream health as all workers see it (not a key: filled for `/metrics`).
    pub gauges: std::sync::Arc<UpstreamGauges>,
}

/// One upstream server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// As written (`host:port`), used in logs.
    pub name: String,
    /// Resolved when the configuration is loaded.
    pub addr: SocketAddr,
    /// `https://`: TLS to the upstream.
    pub tls: bool,
    /// The URL's host (the TLS server name unless `upstream_server_name` says otherwise).
    pub host: String,
    /// Spoken to in HTTP/2: `h2c://` (prior knowledge), or `https://` with
    /// `upstream_http2 = true` (ALPN h2).
    pub h2: bool,
}

impl Config {
    /// Reads and validates a configuration file.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: Some(path.to_owned()),
            line: 0,
            column: 0,
            key: String::new(),
            message: format!("cannot read the configuration file: {e}"),
        })?;
        Config::from_str_at(&text, Some(path))
    }

    /// Parses and validates configuration text; `file` names it in errors and anchors relative
    /// paths (the current directory when `None`).
    pub fn from_str_at(text: &str, file: Option<&Path>) -> Result<Config, ConfigError> {
        let de = toml::Deserializer::new(text);
        let raw: RawConfig = serde_path_to_error::deserialize(de).map_err(|e| {
            // toml::Spanned shows up in the path as a private field name: drop it.
            let key = e
                .path()
                .to_string()
                .replace(".$__serde_spanned_private_value", "");
            let inner = e.into_inner();
            ConfigError::at(
                file,
                text,
                inner.span(),
                if key == "." { String::new() } else { key },
                inner.message().to_string(),
            )
        })?;
        Validator {
            file,
            text,
            site_certs: sites::any_certificates(&raw),
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
            workers: default_workers(),
            routes: default_routes(&state_dir),
            state_dir,
            shutdown_timeout: Duration::from_secs(10),
            limits: Limits::default(),
            log: LogConfig::default(),
            listeners: default_listeners(),
            offload: OffloadConfig::default(),
            admin: None,
            compression: CompressionConfig::default(),
            file_cache: FileCacheConfig::default(),
            sites: SitesConfig::default(),
        }
    }

    /// Where the built-in welcome site lives (written there at start when a route serves
    /// it).
    pub fn welcome_root(&self) -> PathBuf {
        self.state_dir.join("welcome")
    }
}

/// The listeners without a config: HTTPS on 127.0.0.1:8443 (self-signed), HTTP on
/// 127.0.0.1:8080.
fn default_listeners() -> Vec<ListenerConfig> {
    vec![
        ListenerConfig {
            address: ([127, 0, 0, 1], 8443).into(),
            tls: Some(TlsConfig::SelfSigned),
            http2: true,
            offload: None,
            redirect: None,
            session: SessionConfig::default(),
        },
        ListenerConfig {
            address: ([127, 0, 0, 1], 8080).into(),
            tls: None,
            http2: false,
            offload: None,
            redirect: None,
            session: SessionConfig::default(),
        },
    ]
}

/// The route without a config: `/` serves `./public` when it exists, else the built-in
/// welcome site in `state_dir`.
fn default_routes(state_dir: &Path) -> Vec<RouteConfig> {
    let public = PathBuf::from("public");
    let root = if public.is_dir() {
        absolute(&public)
    } else {
        state_dir.join("welcome")
    };
    vec![RouteConfig {
        prefix: "/".into(),
        strip_prefix: false,
        action: RouteAction::Static(StaticConfig {
            root,
            index: "index.html".into(),
            symlinks: Symlinks::default(),
            open_method: OpenMethod::default(),
        }),
        rules: RouteRules::default(),
    }]
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

struct Validator<'a> {
    file: Option<&'a Path>,
    text: &'a str,
    /// A `[[site]]` has certificates: a TLS listener may take those alone.
    site_certs: bool,
}

impl Validator<'_> {
    fn err(
        &self,
        span: Option<std::ops::Range<usize>>,
        key: impl Into<String>,
        msg: impl Into<String>,
    ) -> ConfigError {
        ConfigError::at(self.file, self.text, span, key, msg)
    }

    /// A path from the file, relative to the file's directory.
    fn path(&self, p: &Path) -> PathBuf {
        let base = self
            .file
            .and_then(Path::parent)
            .map(Path::to_owned)
            .unwrap_or_default();
        absolute(&base.join(p))
    }

    fn validate(&self, raw: RawConfig) -> Result<Config, ConfigError> {
        let defaults = Limits::default();
        let workers = match raw.workers.as_ref().map(|w| *w.get_ref()) {
            None | Some(Workers::Auto) => default_workers(),
            Some(Workers::Count(n)) => n,
        };
        let state_dir = match &raw.state_dir {
            Some(d) => self.path(d.get_ref()),
            None => default_state_dir(),
        };
        let l = &raw.limits;
        let limits = Limits {
            max_request_header_size: l
                .max_request_header_size
                .map(|s| s.0 as usize)
                .unwrap_or(defaults.max_request_header_size),
            header_read_timeout: l
                .header_read_timeout
                .map(|d| d.0)
                .unwrap_or(defaults.header_read_timeout),
            keepalive_timeout: l
                .keepalive_timeout
                .map(|d| d.0)
                .unwrap_or(defaults.keepalive_timeout),
            tls_handshake_timeout: l
                .tls_handshake_timeout
                .map(|d| d.0)
                .unwrap_or(defaults.tls_handshake_timeout),
            max_connections_per_worker: l
                .max_connections_per_worker
                .unwrap_or(defaults.max_connections_per_worker)
                .max(1),
            max_concurrent_streams: l
                .max_concurrent_streams
                .unwrap_or(defaults.max_concurrent_streams)
                .max(1),
            send_timeout: l.send_timeout.map(|d| d.0).unwrap_or(defaults.send_timeout),
            h2_control_frames_per_second: l
                .h2_control_frames_per_second
                .unwrap_or(defaults.h2_control_frames_per_second),
            write_burst: l
                .write_burst
                .map(|s| s.0 as usize)
                .unwrap_or(defaults.write_burst),
        };
        if !(16 << 10..=64 << 20).contains(&limits.write_burst) {
            let key = "limits.write_burst";
            return Err(self.err(
                span_of_key(self.text, key),
                key,
                "must be between 16KiB and 64MiB",
            ));
        }
        if limits.h2_control_frames_per_second == 0 {
            let key = "limits.h2_control_frames_per_second";
            return Err(self.err(span_of_key(self.text, key), key, "must be greater than 0"));
        }
        if !(8192..=1 << 24).contains(&limits.max_request_header_size) {
            let key = "limits.max_request_header_size";
            return Err(self.err(
                span_of_key(self.text, key),
                key,
                "must be between 8KiB and 16MiB",
            ));
        }
        for (key, d) in [
            ("limits.header_read_timeout", limits.header_read_timeout),
            ("limits.keepalive_timeout", limits.keepalive_timeout),
            ("limits.tls_handshake_timeout", limits.tls_handshake_timeout),
            ("limits.send_timeout", limits.send_timeout),
        ] {
            if d.is_zero() {
                return Err(self.err(span_of_key(self.text, key), key, "must be greater than 0"));
            }
        }
        let mut log = LogConfig::default();
        if let Some(a) = raw.log.access {
            log.access = a;
        }
        if let Some(level) = &raw.log.level {
            let v = level.get_ref().trim();
            if v.is_empty() {
                return Err(self.err(Some(level.span()), "log.level", "must not be empty"));
            }
            log.level = v.to_owned();
        }
        self.access_log(&raw.log, &mut log)?;

        let offload = self.offload(&raw.offload)?;
        let mut listeners = match &raw.listeners {
            Some(ls) => {
                if ls.get_ref().is_empty() {
                    return Err(self.err(
                        Some(ls.span()),
                        "listener",
                        "at least one listener is needed",
                    ));
                }
                let mut out: Vec<ListenerConfig> = Vec::new();
                for (i, l) in ls.get_ref().iter().enumerate() {
                    let cfg = self.listener(i, l, &offload)?;
                    if cfg.address.port() != 0 && out.iter().any(|o| o.address == cfg.address) {
                        return Err(self.err(
                            Some(l.address.span()),
                            format!("listener[{i}].address"),
                            format!("{} is already used by another listener", cfg.address),
                        ));
                    }
                    out.push(cfg);
                }
                out
            }
            None => default_listeners(),
        };

        let mut routes: Vec<RouteConfig> = Vec::new();
        for (i, r) in raw.routes.iter().enumerate() {
            let route = self.route(i, r)?;
            if routes.iter().any(|o| o.prefix == route.prefix) {
                return Err(self.err(
                    Some(r.get_ref().prefix.span()),
                    format!("route[{i}].prefix"),
                    format!("prefix `{}` is used by another route", route.prefix),
                ));
            }
            routes.push(route);
        }
        if routes.is_empty() {
            routes = default_routes(&state_dir);
        }
        routes.sort_by_key(|r| std::cmp::Reverse(r.prefix.len()));

        let compression = self.compression(raw.compression.as_ref(), &offload)?;
        let sites = self.sites(&raw, &mut listeners)?;
        let file_cache = self.file_cache(&raw.file_cache)?;
        Ok(Config {
            source: self.file.map(absolute),
            workers,
            state_dir,
            shutdown_timeout: raw
                .shutdown_timeout
                .map(|d| d.0)
                .unwrap_or(Duration::from_secs(10)),
            limits,
            log,
            listeners,
            routes,
            offload,
            admin: raw.admin.as_ref().map(|a| *a.address.get_ref()),
            compression,
            file_cache,
            sites,
        })
    }

    fn offload(&self, raw: &raw::RawOffload) -> Result<OffloadConfig, ConfigError> {
        let mut cfg = OffloadConfig::default();
        if let Some(b) = raw.batch {
            cfg.batch = b;
        }
        if let Some(m) = raw.batch_max {
            cfg.batch_max = m.clamp(1, 1024);
        }
        if let Some(m) = raw.max_jobs_per_worker {
            cfg.max_jobs_per_worker = m.max(1);
        }
        for (name, e) in &raw.engines {
            let key = format!("offload.engines.{name}");
            if name == "inline" {
                return Err(self.err(
                    Some(e.span()),
                    key,
                    "`inline` is built in; choose another name",
                ));
            }
            let er = e.get_ref();
            let kind = match er.kind.get_ref().as_str() {
                "inline" => EngineKind::Inline,
                "pool" => EngineKind::Pool {
                    threads: er.threads.unwrap_or(1).clamp(1, 256),
                    queue: er.queue.unwrap_or(1024).max(1),
                    added_latency: er.added_latency.map(|d| d.0).unwrap_or_default(),
                    inject_failures: er.inject_failures.unwrap_or(false),
                },
                "keyserver" => EngineKind::Keyserver(self.keyserver_engine(&key, e)?),
                other => {
                    return Err(self.err(
                        Some(er.kind.span()),
                        format!("{key}.kind"),
                        format!(
                        "unknown engine kind `{other}` (use \"pool\", \"keyserver\" or \"inline\")"
                    ),
                    ))
                }
            };
            let ks_only = er.servers.is_some()
                || er.connections.is_some()
                || er.timeout.is_some()
                || er.client_cert.is_some()
                || er.client_key.is_some()
                || er.server_ca.is_some();
            if ks_only && !matches!(kind, EngineKind::Keyserver(_)) {
                return Err(self.err(
                    Some(e.span()),
                    key,
                    "`servers`, `connections`, `timeout`, `client_cert`, `client_key` and `server_ca` are for `keyserver` engines",
                ));
            }
            if matches!(kind, EngineKind::Inline)
                && (er.threads.is_some() || er.queue.is_some() || er.added_latency.is_some())
            {
                return Err(self.err(
                    Some(e.span()),
                    key,
                    "`threads`, `queue` and `added_latency` are for `pool` engines",
                ));
            }
            cfg.engines.push(EngineConfig {
                name: name.clone(),
                kind,
            });
        }
        Ok(cfg)
    }

    fn keyserver_engine(
        &self,
        key: &str,
        e: &Spanned<raw::RawEngine>,
    ) -> Result<KeyserverEngineConfig, ConfigError> {
        let er = e.get_ref();
        if er.threads.is_some() || er.added_latency.is_some() || er.inject_failures.is_some() {
            return Err(self.err(
                Some(e.span()),
                key,
                "`threads`, `added_latency` and `inject_failures` are for `pool` engines (the key server has its own)",
            ));
        }
        let Some(servers) = &er.servers else {
            return Err(self.err(
                Some(e.span()),
                key,
                "a keyserver engine needs `servers = [\"unix:/path\" or \"tls://host:port\", ...]`",
            ));
        };
        if servers.get_ref().is_empty() {
            return Err(self.err(
                Some(servers.span()),
                format!("{key}.servers"),
                "at least one key server is needed",
            ));
        }
        let mut endpoints = Vec::new();
        for (j, sv) in servers.get_ref().iter().enumerate() {
            let mut ep = qweb_keyserver::client::Endpoint::parse(sv.get_ref())
                .map_err(|m| self.err(Some(sv.span()), format!("{key}.servers[{j}]"), m))?;
            if let qweb_keyserver::client::Endpoint::Unix(p) = &mut ep {
                *p = self.path(p);
            }
            endpoints.push(ep);
        }
        let file =
            |f: &Option<Spanned<PathBuf>>, name: &str| -> Result<Option<PathBuf>, ConfigError> {
                match f {
                    None => Ok(None),
                    Some(p) => {
                        let path = self.path(p.get_ref());
                        if !path.is_file() {
                            return Err(self.err(
                                Some(p.span()),
                                format!("{key}.{name}"),
                                format!("{} is not a readable file", path.display()),
                            ));
                        }
                        Ok(Some(path))
                    }
                }
            };
        let cfg = KeyserverEngineConfig {
            servers: endpoints,
            connections: er.connections.unwrap_or(2).clamp(1, 64),
            queue: er.queue.unwrap_or(4096).max(1),
            timeout: er.timeout.map(|d| d.0).unwrap_or(Duration::from_secs(2)),
            client_cert: file(&er.client_cert, "client_cert")?,
            client_key: file(&er.client_key, "client_key")?,
            server_ca: file(&er.server_ca, "server_ca")?,
        };
        let uses_tls = cfg
            .servers
            .iter()
            .any(|s| matches!(s, qweb_keyserver::client::Endpoint::Tls { .. }));
        if uses_tls
            && (cfg.client_cert.is_none() || cfg.client_key.is_none() || cfg.server_ca.is_none())
        {
            return Err(self.err(
                Some(e.span()),
                key,
                "tls:// key servers need `client_cert`, `client_key` and `server_ca` (mutual TLS)",
            ));
        }
        Ok(cfg)
    }

    fn listener_offload(
        &self,
        i: usize,
        raw: &Spanned<raw::RawListenerOffload>,
        engines: &OffloadConfig,
        tls: bool,
    ) -> Result<ListenerOffload, ConfigError> {
        let key = format!("listener[{i}].offload");
        if !tls {
            return Err(self.err(Some(raw.span()), key, "offload is for TLS listeners"));
        }
        let r = raw.get_ref();
        let engine = r.engine.get_ref().clone();
        if !engines.engines.iter().any(|e| e.name == engine) {
            let names: Vec<&str> = engines.engines.iter().map(|e| e.name.as_str()).collect();
            return Err(self.err(
                Some(r.engine.span()),
                format!("{key}.engine"),
                format!("no engine named `{engine}` (defined: {})", names.join(", ")),
            ));
        }
        let mode = match r.mode.as_ref().map(|m| (m.get_ref().as_str(), m.span())) {
            None if engine == "inline" => Mode::InPlace,
            None => Mode::Async,
            Some(("none", _)) => Mode::InPlace,
            Some(("sync", _)) => Mode::Sync,
            Some(("async", _)) => Mode::Async,
            Some((other, span)) => {
                return Err(self.err(
                    Some(span),
                    format!("{key}.mode"),
                    format!("unknown mode `{other}` (use \"none\", \"sync\" or \"async\")"),
                ))
            }
        };
        let fallback = match r
            .fallback
            .as_ref()
            .map(|m| (m.get_ref().as_str(), m.span()))
        {
            None | Some(("software", _)) => Fallback::Software,
            Some(("fail", _)) => Fallback::Fail,
            Some((other, span)) => {
                return Err(self.err(
                    Some(span),
                    format!("{key}.fallback"),
                    format!("unknown fallback `{other}` (use \"software\" or \"fail\")"),
                ))
            }
        };
        Ok(ListenerOffload {
            engine,
            policy: Policy {
                mode,
                fallback,
                timeout: r.timeout.map(|d| d.0).unwrap_or(Duration::from_secs(2)),
            },
        })
    }

    fn listener(
        &self,
        i: usize,
        l: &RawListener,
        engines: &OffloadConfig,
    ) -> Result<ListenerConfig, ConfigError> {
        let offload = match &l.offload {
            None => None,
            Some(o) => Some(self.listener_offload(i, o, engines, l.tls.is_some())?),
        };
        let keyserver = offload.as_ref().is_some_and(|o| {
            o.policy.mode.offloads()
                && engines
                    .engines
                    .iter()
                    .any(|e| e.name == o.engine && matches!(e.kind, EngineKind::Keyserver(_)))
        });
        let tls = match &l.tls {
            None => None,
            Some(t) => {
                let key = format!("listener[{i}].tls");
                let tr = t.get_ref();
                match (tr.self_signed, tr.certificates.is_empty()) {
                    (true, true) => Some(TlsConfig::SelfSigned),
                    (true, false) => {
                        return Err(self.err(
                            Some(t.span()),
                            key,
                            "use either `self_signed = true` or `certificates`, not both",
                        ))
                    }
                    (false, true) if self.site_certs => Some(TlsConfig::Certificates(Vec::new())),
                    (false, true) => {
                        return Err(self.err(
                            Some(t.span()),
                            key,
                            "a TLS listener needs `certificates = [{ cert = \"...\", key = \"...\" }]` or `self_signed = true`",
                        ))
                    }
                    (false, false) => {
                        let provider = qweb_tls::provider();
                        let mut certs = Vec::new();
                        for (j, c) in tr.certificates.iter().enumerate() {
                            let cert = self.path(c.cert.get_ref());
                            let Some(ck) = &c.key else {
                                // no key file: only with a key server holding the key
                                if !keyserver {
                                    return Err(self.err(
                                        Some(c.cert.span()),
                                        format!("{key}.certificates[{j}].key"),
                                        "missing: only a listener whose offload engine is a key server (mode sync or async) may omit the key",
                                    ));
                                }
                                if let Err(e) = qweb_tls::cert_key_id(&cert) {
                                    return Err(self.err(
                                        Some(c.cert.span()),
                                        format!("{key}.certificates[{j}].cert"),
                                        e.to_string(),
                                    ));
                                }
                                let ocsp = self.ocsp(i, j, c)?;
                                certs.push(CertificateConfig {
                                    cert,
                                    key: None,
                                    ocsp,
                                });
                                continue;
                            };
                            let keyp = self.path(ck.get_ref());
                            if let Err(e) = qweb_tls::load_certified_key(&cert, &keyp, &provider) {
                                let (span, which) = match &e {
                                    qweb_tls::TlsError::Key { .. } => (ck.span(), "key"),
                                    qweb_tls::TlsError::Read { path, .. }
                                    | qweb_tls::TlsError::Pem { path, .. }
                                        if *path == keyp =>
                                    {
                                        (ck.span(), "key")
                                    }
                                    _ => (c.cert.span(), "cert"),
                                };
                                return Err(self.err(
                                    Some(span),
                                    format!("{key}.certificates[{j}].{which}"),
                                    e.to_string(),
                                ));
                            }
                            certs.push(CertificateConfig {
                                cert,
                                key: Some(keyp),
                                ocsp: self.ocsp(i, j, c)?,
                            });
                        }
                        Some(TlsConfig::Certificates(certs))
                    }
                }
            }
        };
        let session = match &l.tls {
            Some(t) => self.session(i, t.get_ref(), engines)?,
            None => SessionConfig::default(),
        };
        // h2c is not served: an explicit `http2 = true` on a plain listener is a mistake
        if let (Some(h), None) = (&l.http2, &tls) {
            if *h.get_ref() {
                return Err(self.err(
                    Some(h.span()),
                    format!("listener[{i}].http2"),
                    "HTTP/2 needs TLS here (h2c is not served): add [listener.tls] or remove http2",
                ));
            }
        }
        let http2 = l.http2.as_ref().map(|h| *h.get_ref()).unwrap_or(true);
        Ok(ListenerConfig {
            address: *l.address.get_ref(),
            http2: http2 && tls.is_some(),
            tls,
            offload,
            redirect: match &l.redirect {
                Some(r) => Some(self.redirect(&format!("listener[{i}].redirect"), r)?),
                None => None,
            },
            session,
        })
    }

    fn route(&self, i: usize, r: &Spanned<RawRoute>) -> Result<RouteConfig, ConfigError> {
        let rr = r.get_ref();
        let prefix = rr.prefix.get_ref().clone();
        if !prefix.starts_with('/') {
            return Err(self.err(
                Some(rr.prefix.span()),
                format!("route[{i}].prefix"),
                "a prefix starts with `/`",
            ));
        }
        let prefix = if prefix.len() > 1 {
            prefix.trim_end_matches('/').to_owned()
        } else {
            prefix
        };
        let action = match (&rr.root, &rr.upstreams) {
            (None, None) if rr.redirect.is_some() => {
                RouteAction::Redirect(self.route_redirect(i, r)?)
            }
            (_, _) if rr.redirect.is_some() => {
                return Err(self.err(
                    Some(r.span()),
                    format!("route[{i}].redirect"),
                    "a redirect route has neither `root` nor `upstreams`",
                ))
            }
            (Some(_), Some(_)) | (None, None) => {
                return Err(self.err(
                    Some(r.span()),
                    format!("route[{i}]"),
                    "a route has either `root` (static files) or `upstreams` (reverse proxy)",
                ))
            }
            (Some(root), None) => {
                let path = self.path(root.get_ref());
                if !path.is_dir() {
                    return Err(self.err(
                        Some(root.span()),
                        format!("route[{i}].root"),
                        format!("{} is not a directory", path.display()),
                    ));
                }
                self.no_proxy_keys(i, rr)?;
                RouteAction::Static(StaticConfig {
                    root: path,
                    index: rr.index.clone().unwrap_or_else(|| "index.html".into()),
                    symlinks: self.symlinks(i, rr)?,
                    open_method: OpenMethod::default(),
                })
            }
            (None, Some(ups)) => RouteAction::Proxy(self.proxy_route(i, rr, ups)?),
        };
        if let (Some(s), RouteAction::Proxy(_)) = (&rr.symlinks, &action) {
            return Err(self.err(
                Some(s.span()),
                format!("route[{i}].symlinks"),
                "`symlinks` is for static routes",
            ));
        }
        if rr.index.is_some() && !matches!(action, RouteAction::Static(_)) {
            return Err(self.err(
                Some(r.span()),
                format!("route[{i}].index"),
                "`index` is for static routes",
            ));
        }
        let rules = self.route_rules(i, r, &action)?;
        Ok(RouteConfig {
            prefix,
            strip_prefix: rr.strip_prefix.unwrap_or(false),
            action,
            rules,
        })
    }
}

impl Validator<'_> {
    fn symlinks(&self, i: usize, rr: &RawRoute) -> Result<Symlinks, ConfigError> {
        let Some(s) = &rr.symlinks else {
            return Ok(Symlinks::default());
        };
        match s.get_ref().as_str() {
            "inside_root" => Ok(Symlinks::InsideRoot),
            "refuse" => Ok(Symlinks::Refuse),
            "follow" => Ok(Symlinks::Follow),
            other => Err(self.err(
                Some(s.span()),
                format!("route[{i}].symlinks"),
                format!(
                    "unknown symlinks mode `{other}` (use \"inside_root\", \"refuse\" or \"follow\")"
                ),
            )),
        }
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
