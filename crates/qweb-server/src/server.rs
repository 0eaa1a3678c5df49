//! Starting and stopping the server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::sync::watch;

use std::collections::HashMap;

use qweb_offload::{Engine, InlineEngine, PoolConfig, PoolEngine};

use crate::config::{Config, EngineKind, FallbackPolicy, OffloadMode, RouteAction, TlsConfig};
use crate::listen::bind_reuseport;
use crate::metrics::{Registry, WorkerMetrics};
use crate::worker::{self, WorkerExtras, WorkerListener};

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A listening address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The error.
        source: std::io::Error,
    },
    /// Another process listens on the address already.
    #[error("{addr} is already in use by another process ({key})")]
    InUse {
        /// The address.
        addr: SocketAddr,
        /// The configuration key that names it, e.g. `listener[0].address`.
        key: String,
    },
    /// Certificates could not be loaded or generated.
    #[error(transparent)]
    Tls(#[from] qweb_tls::TlsError),
    /// The state folder could not be written.
    #[error("state folder {path}: {source}")]
    State {
        /// The folder.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A worker thread could not be started.
    #[error("cannot start a worker thread: {0}")]
    Thread(std::io::Error),
    /// An engine could not be started.
    #[error("cannot start offload engine `{name}`: {source}")]
    Engine {
        /// The engine.
        name: String,
        /// The error.
        source: std::io::Error,
    },
    /// Session ticket keys could not be set up (key file).
    #[error("ticket keys: {0}")]
    Tickets(String),
}

/// The server.
pub struct Server;

/// What the server did at start that the operator should know.
#[derive(Debug, Clone, Default)]
pub struct StartInfo {
    /// The self-signed certificate in use, if any, and whether it was created now.
    pub self_signed: Option<qweb_tls::SelfSigned>,
    /// The built-in welcome site's folder, when it is served.
    pub welcome: Option<PathBuf>,
}

/// A started server.
pub struct RunningServer {
    addrs: Vec<SocketAddr>,
    admin: Option<SocketAddr>,
    info: StartInfo,
    shutdown: watch::Sender<bool>,
    workers: Vec<JoinHandle<()>>,
}

impl Server {
    /// Binds every listener and starts the workers. Connections are accepted (queued in the
    /// backlog) from the moment this returns.
    pub fn start(config: Config) -> Result<RunningServer, ServerError> {
        let mut info = StartInfo::default();
        let welcome = config.welcome_root();
        if config
            .routes
            .iter()
            .any(|r| matches!(&r.action, RouteAction::Static(s) if s.root == welcome))
        {
            crate::welcome::install(&welcome).map_err(|source| ServerError::State {
                path: welcome.clone(),
                source,
            })?;
            info.welcome = Some(welcome);
        }

        let mut engines: HashMap<String, Arc<dyn Engine>> = HashMap::new();
        let mut engine_list: Vec<Arc<dyn Engine>> = Vec::new();
        for e in &config.offload.engines {
            let engine: Arc<dyn Engine> = match &e.kind {
                EngineKind::Inline => Arc::new(InlineEngine::new(e.name.clone())),
                EngineKind::Keyserver(k) => Arc::new(
                    qweb_keyserver::client::KeyserverEngine::new(
                        e.name.clone(),
                        qweb_keyserver::client::ClientConfig {
                            servers: k.servers.clone(),
                            connections: k.connections,
                            max_in_flight: k.queue,
                            timeout: k.timeout,
                            tls: keyserver_client_tls(k)?,
                        },
                    )
                    .map_err(|source| ServerError::Engine {
                        name: e.name.clone(),
                        source,
                    })?,
                ),
                EngineKind::Pool {
                    threads,
                    queue,
                    added_latency,
                    inject_failures,
                } => Arc::new(
                    PoolEngine::new(
                        e.name.clone(),
                        PoolConfig {
                            threads: *threads,
                            queue: *queue,
                            added_latency: *added_latency,
                            inject_failures: *inject_failures,
                        },
                    )
                    .map_err(|source| ServerError::Engine {
                        name: e.name.clone(),
                        source,
                    })?,
                ),
            };
            engines.insert(e.name.clone(), engine.clone());
            engine_list.push(engine);
        }

        let provider = qweb_tls::provider();
        let mut tls_configs = Vec::new();
        let mut async_engines = Vec::new();
        // per listener (`None`: plain HTTP), and what keeps file and fleet keys fresh
        let mut sessions = Vec::new();
        let mut refreshers = Vec::new();
        for l in &config.listeners {
            let offload = l
                .offload
                .as_ref()
                .filter(|o| o.mode != OffloadMode::None)
                .and_then(|o| engines.get(&o.engine).map(|e| (o, e.clone())));
            let policy = offload.as_ref().map(|(o, e)| qweb_tls::OffloadPolicy {
                engine: e.clone(),
                timeout: o.timeout,
                fallback: match o.fallback {
                    FallbackPolicy::Software => qweb_tls::Fallback::Software,
                    FallbackPolicy::Fail => qweb_tls::Fallback::Fail,
                },
            });
            async_engines.push(
                offload
                    .as_ref()
                    .filter(|(o, _)| o.mode == OffloadMode::Async)
                    .map(|(o, e)| (e.clone(), o.timeout)),
            );
            let load = |cert: &std::path::Path, key: Option<&std::path::Path>| match (&policy, key)
            {
                (Some(p), key) => qweb_tls::load_offloaded(cert, key, &provider, p),
                (None, Some(key)) => qweb_tls::load_certified_key(cert, key, &provider),
                (None, None) => Err(qweb_tls::TlsError::Pem {
                    path: cert.to_owned(),
                    message: "no private key, and no key server engine for this listener".into(),
                }),
            };
            let tls = match &l.tls {
                None => None,
                Some(t) => {
                    let certs = match t {
                        TlsConfig::SelfSigned => {
                            let ss = qweb_tls::ensure_self_signed(&config.state_dir)?;
                            let c = load(&ss.cert, Some(&ss.key))?;
                            info.self_signed = Some(ss);
                            vec![c]
                        }
                        TlsConfig::Certificates(list) => {
                            let mut certs = list
                                .iter()
                                .map(|c| load(&c.cert, c.key.as_deref()))
                                .collect::<Result<Vec<_>, _>>()?;
                            crate::tls_session::staple(list, &mut certs, &mut refreshers);
                            certs
                        }
                    };
                    let resolver = qweb_tls::SniResolver::new(&certs).ok_or_else(|| {
                        qweb_tls::TlsError::Generate("no certificate for a TLS listener".into())
                    })?;
                    let mut sc = qweb_tls::server_config(Arc::new(resolver), l.http2)?;
                    let (session, refresher) =
                        crate::tls_session::setup(l, &config, &certs, &mut sc)?;
                    sessions.push(Some(session));
                    refreshers.extend(refresher);
                    Some(Arc::new(sc))
                }
            };
            if tls.is_none() {
                sessions.push(None);
            }
            tls_configs.push(tls);
        }

        // Refuse to share a port with another process before binding anything.
        let mut to_bind: Vec<(SocketAddr, String)> = config
            .listeners
            .iter()
            .enumerate()
            .map(|(i, l)| (l.address, format!("listener[{i}].address")))
            .collect();
        if let Some(addr) = config.admin {
            to_bind.push((addr, "admin.address".into()));
        }
        for (addr, key) in to_bind {
            match crate::listen::in_use(addr) {
                Ok(false) => {}
                Ok(true) => return Err(ServerError::InUse { addr, key }),
                Err(source) => return Err(ServerError::Bind { addr, source }),
            }
        }

        let n = config.workers.max(1);
        let mut per_worker: Vec<Vec<WorkerListener>> = (0..n).map(|_| Vec::new()).collect();
        let mut addrs = Vec::new();
        for (((l, tls), async_engine), session) in config
            .listeners
            .iter()
            .zip(&tls_configs)
            .zip(&async_engines)
            .zip(&mut sessions)
        {
            let sockets = bind_reuseport(l.address, n).map_err(|source| ServerError::Bind {
                addr: l.address,
                source,
            })?;
            addrs.push(
                sockets[0]
                    .local_addr()
                    .map_err(|source| ServerError::Bind {
                        addr: l.address,
                        source,
                    })?,
            );
            if let (Some(s), Some(a)) = (session.as_mut(), addrs.last()) {
                s.label = a.to_string();
            }
            let stats = session.as_ref().map(|s| s.stats.clone());
            for (w, socket) in sockets.into_iter().enumerate() {
                per_worker[w].push(WorkerListener {
                    socket,
                    tls: tls.clone(),
                    async_engine: async_engine.clone(),
                    sessions: stats.clone(),
                });
            }
        }

        let compression = crate::compress::shared(&config, |name| engines.get(name).cloned());
        let worker_metrics: Vec<Arc<WorkerMetrics>> =
            (0..n).map(|_| Arc::new(WorkerMetrics::default())).collect();
        let registry = Arc::new(Registry {
            workers: worker_metrics.clone(),
            engines: engine_list,
            compression: compression.as_ref().map(|c| c.metrics.clone()),
            tls_sessions: sessions.into_iter().flatten().map(Arc::new).collect(),
        });
        let admin = match config.admin {
            Some(addr) => {
                let socket = bind_reuseport(addr, 1)
                    .map_err(|source| ServerError::Bind { addr, source })?
                    .pop();
                socket.map(|s| (s, registry.clone()))
            }
            None => None,
        };
        let admin_addr = admin.as_ref().and_then(|(s, _)| s.local_addr().ok());

        let (tx, rx) = watch::channel(false);
        let config = Arc::new(config);
        let mut workers = crate::tls_session::spawn(refreshers, &rx)?;
        for (id, listeners) in per_worker.into_iter().enumerate() {
            let (config, rx) = (config.clone(), rx.clone());
            let extras = WorkerExtras {
                metrics: worker_metrics[id].clone(),
                compression: compression.clone(),
            };
            let handle = std::thread::Builder::new()
                .name(format!("qweb-worker-{id}"))
                .spawn(move || {
                    if let Err(e) = worker::run(id, config, listeners, extras, rx) {
                        tracing::error!(worker = id, "worker failed: {e}");
                    }
                })
                .map_err(ServerError::Thread)?;
            workers.push(handle);
        }
        if let Some((socket, registry)) = admin {
            // Its own thread: metrics stay readable when workers are busy or blocked
            // (sync offload).
            let rx = rx.clone();
            let handle = std::thread::Builder::new()
                .name("qweb-admin".into())
                .spawn(move || crate::admin::run(socket, registry, rx))
                .map_err(ServerError::Thread)?;
            workers.push(handle);
        }
        Ok(RunningServer {
            addrs,
            admin: admin_addr,
            info,
            shutdown: tx,
            workers,
        })
    }
}

/// The mutual-TLS client configuration for `tls://` key servers.
pub(crate) fn keyserver_client_tls(
    k: &crate::config::KeyserverEngineConfig,
) -> Result<Option<Arc<rustls::ClientConfig>>, ServerError> {
    let (Some(cert), Some(key), Some(ca)) = (&k.client_cert, &k.client_key, &k.server_ca) else {
        return Ok(None);
    };
    let provider = Arc::new(qweb_tls::provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in qweb_tls::load_certs(ca)? {
        roots.add(c).map_err(qweb_tls::TlsError::Rustls)?;
    }
    let chain = qweb_tls::load_certs(cert)?;
    let key = qweb_tls::load_private_key(key)?;
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(qweb_tls::TlsError::Rustls)?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(qweb_tls::TlsError::Rustls)?;
    Ok(Some(Arc::new(cfg)))
}

impl RunningServer {
    /// The bound address of each listener, in configuration order.
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// The admin listener's address, when configured.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin
    }

    /// What start-up did (certificate, welcome site).
    pub fn start_info(&self) -> &StartInfo {
        &self.info
    }

    /// Stops accepting, lets in-flight requests finish (up to the configured
    /// `shutdown_timeout`), then returns.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let _ = self.shutdown.send(true);
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        self.stop();
    }
}
