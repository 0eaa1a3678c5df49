//! `[offload]`: the engines private-key operations are submitted to (`inline`, `pool`,
//! `keyserver`) and batching, and a listener's `offload` (engine, mode, fallback, timeout).

use std::path::PathBuf;
use std::time::Duration;

use qweb_offload::{Fallback, Mode, Policy};
use toml::Spanned;

use super::raw::{RawEngine, RawListenerOffload, RawOffload};
use super::{ConfigError, Validator};

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

/// Whether a listener with `offload` signs on a key server (a `kind = "keyserver"` engine in
/// mode sync or async): then its certificates need no key file.
pub(crate) fn signs_on_keyserver(
    offload: Option<&ListenerOffload>,
    engines: &OffloadConfig,
) -> bool {
    offload.is_some_and(|o| {
        o.policy.mode.offloads()
            && engines
                .engines
                .iter()
                .any(|e| e.name == o.engine && matches!(e.kind, EngineKind::Keyserver(_)))
    })
}

impl Validator<'_> {
    /// Validates `[offload]` and its `[offload.engines.NAME]` tables.
    pub(super) fn offload(&self, raw: &RawOffload) -> Result<OffloadConfig, ConfigError> {
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

    /// Validates the `keyserver` engine `key` (`offload.engines.NAME`).
    fn keyserver_engine(
        &self,
        key: &str,
        e: &Spanned<RawEngine>,
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
                *p = self.path(p, sv.span());
            }
            endpoints.push(ep);
        }
        let file =
            |f: &Option<Spanned<PathBuf>>, name: &str| -> Result<Option<PathBuf>, ConfigError> {
                match f {
                    None => Ok(None),
                    Some(p) => {
                        let path = self.path(p.get_ref(), p.span());
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

    /// Validates listener `i`'s `offload` against the defined `engines`.
    pub(super) fn listener_offload(
        &self,
        i: usize,
        raw: &Spanned<RawListenerOffload>,
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
}
