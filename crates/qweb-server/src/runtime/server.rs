//! Starting, reloading and stopping the server.
//!
//! The server's life is a [`Phase`]: `Running`, `Reloading` while a new configuration is
//! being built (the old one serves meanwhile), `Draining` once a stop was asked (until its
//! deadline). Start and reload run the same named steps: engines (unchanged ones are kept),
//! each listener's TLS and offload setup, the in-use check and binding of *new* addresses,
//! compression; a reload then hands every worker the new [`Generation`] (see
//! [`crate::runtime::worker`]).

mod engines;
mod sockets;
use engines::{build_engines, engine_list};
use sockets::{bind_new_listeners, clone_sockets, refuse_addresses_in_use};

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use qweb_offload::EngineSet;
use qweb_offload::{Engine, InlineEngine, Mode, PoolConfig, PoolEngine};
use tokio::sync::{mpsc, watch};

use crate::config::{Config, EngineConfig, EngineKind, ListenerConfig, RouteAction, TlsConfig};
use crate::runtime::listen::bind_reuseport;
use crate::runtime::worker::{self, Command, GenListener, Generation, WorkerExtras};
use qweb_observe::metrics::{Metrics, WorkerMetrics};

pub use crate::runtime::error::ServerError;

/// Why a reload was refused (the running configuration stays).
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The new configuration is invalid (file, line, column and key named).
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The new configuration is valid but cannot be put in place (a certificate, a new
    /// address, an engine).
    #[error(transparent)]
    Server(#[from] ServerError),
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

/// Where the server is in its life; each phase that waits owns its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Serving the current configuration.
    Running,
    /// Building a new configuration; the current one serves meanwhile.
    Reloading {
        /// When the reload began.
        since: Instant,
    },
    /// No new connections; in-flight requests and paused handshakes finish until `deadline`.
    Draining {
        /// When the remaining connections are closed.
        deadline: Instant,
    },
}

/// An engine with the configuration it was built from (kept across a reload when that is
/// unchanged, so that its in-flight ops are not disturbed).
struct BuiltEngine {
    config: String,
    engine: Arc<dyn Engine>,
}

/// A listener as the server tracks it across reloads.
#[derive(Debug, Clone, Copy)]
struct BoundListener {
    /// The address in the configuration (port 0: a fresh port each time).
    configured: SocketAddr,
    /// The address its sockets are bound to.
    bound: SocketAddr,
    /// `IPV6_V6ONLY` of its sockets (and of its HTTP/3 socket).
    ipv6_only: bool,
}

/// A started server.
pub struct RunningServer {
    listeners: Vec<BoundListener>,
    addrs: Vec<SocketAddr>,
    admin: Option<SocketAddr>,
    info: StartInfo,
    shutdown: watch::Sender<bool>,
    workers: Vec<JoinHandle<()>>,
    admin_thread: Option<JoinHandle<()>>,
    generations: Vec<mpsc::UnboundedSender<Command>>,
    /// Duplicates of the listening sockets (and the admin one), by bound address, for a
    /// binary upgrade to hand over. Dropped with their listener (a reload removing it) and
    /// before a stop, so that a closed listener refuses connections at once.
    sockets: HashMap<SocketAddr, Vec<std::net::TcpListener>>,
    engines: HashMap<String, BuiltEngine>,
    /// Keeps the running configuration's ticket-key and OCSP refreshers going.
    refreshers: crate::runtime::tls::session::RefresherStop,
    /// The TLS listeners' resumption state by configured address (fixed ports only), for
    /// a reload to keep.
    sessions: HashMap<SocketAddr, Arc<crate::runtime::tls::session::ListenerSession>>,
    config: Config,
    metrics: Arc<Metrics>,
    /// TLS session resumption and OCSP per TLS listener, on `/metrics` (replaced on reload).
    tls_sessions_collector: Arc<crate::runtime::tls::session::TlsSessionsCollector>,
    phase: Phase,
    /// The fleet client, for the `scope = "fleet"` limits of a reloaded configuration.
    fleet: Option<Arc<crate::runtime::fleet::Fleet>>,
}

/// Everything a configuration needs that the workers share, built on the calling thread.
struct Built {
    engines: HashMap<String, BuiltEngine>,
    listeners: Vec<ListenerSetup>,
    compression: Option<Arc<crate::pipeline::compress::Shared>>,
    /// Stops this configuration's ticket-key, OCSP and ACME threads when dropped.
    refreshers: crate::runtime::tls::session::RefresherStop,
    /// The ACME certificates and challenge answers (sites with `acme`).
    acme: Option<Arc<qweb_tls::Managed>>,
}

/// One listener's TLS configuration and async-offload engine.
struct ListenerSetup {
    tls: Option<Arc<rustls::ServerConfig>>,
    async_engine: Option<(Arc<dyn Engine>, Duration)>,
    /// TLS session resumption and OCSP state (TLS listeners).
    session: Option<Arc<crate::runtime::tls::session::ListenerSession>>,
    /// The configurations of sites with their own `client_auth`, by SNI.
    sites: Option<Arc<qweb_tls::SitePolicies>>,
}

impl Server {
    /// Binds every listener and starts the workers. Connections are accepted (queued in the
    /// backlog) from the moment this returns.
    pub fn start(config: Config) -> Result<RunningServer, ServerError> {
        let mut info = StartInfo {
            welcome: install_welcome(&config)?,
            ..StartInfo::default()
        };
        let compression_metrics = Arc::new(qweb_compress::CompressMetrics::default());
        let built = build(
            &config,
            &HashMap::new(),
            &HashMap::new(),
            &compression_metrics,
            &mut info,
        )?;
        refuse_addresses_in_use(&config, &[], true)?;
        let n = config.workers.max(1);
        let (listeners, mut sockets) = bind_new_listeners(&config, &[], n)?;
        let mut clones = clone_sockets(&listeners, &sockets, HashMap::new())?;

        let worker_metrics: Vec<Arc<WorkerMetrics>> =
            (0..n).map(|_| Arc::new(WorkerMetrics::default())).collect();
        let tls_sessions_collector =
            Arc::new(crate::runtime::tls::session::TlsSessionsCollector::default());
        let file_cache = Arc::new(crate::files::cache::Stats::default());
        let cache = crate::pipeline::cache::open_store(&config);
        let client_slots = Arc::new(qweb_session::client_slots::ClientSlots::default());
        let (tx, rx) = watch::channel(false);
        // the fleet client: its own thread, which connects in the background (a store down
        // or silent never holds up the start)
        let fleet = match &config.fleet {
            Some(f) => Some(
                crate::runtime::fleet::Fleet::start(f.clone(), cache.clone(), rx.clone())
                    .map_err(ServerError::Thread)?,
            ),
            None => None,
        };
        let mut collectors: Vec<Box<dyn prometheus_client::collector::Collector>> = vec![
            Box::new(tls_sessions_collector.clone()),
            Box::new(crate::files::cache::CacheCollector(file_cache.clone())),
            Box::new(crate::pipeline::cache::Collector(cache.clone())),
            Box::new(crate::conn::ClientSlotsCollector(client_slots.clone())),
        ];
        crate::runtime::fleet::limit::attach(&config, fleet.as_ref());
        if let Some(f) = &fleet {
            collectors.push(Box::new(crate::runtime::fleet::FleetCollector(f.clone())));
        }
        let metrics = Arc::new(Metrics::new(
            worker_metrics.clone(),
            EngineSet::new(engine_list(&built.engines)),
            compression_metrics,
            config_hash(&config),
            collectors,
        ));
        metrics.upstreams.set(qweb_proxy::upstream_gauges(&config));
        tls_sessions_collector.set(tls_sessions(&listeners, &built));
        let admin = match config.admin {
            Some(addr) => bind_reuseport(addr, false, 1)
                .map_err(|source| ServerError::Bind { addr, source })?
                .pop(),
            None => None,
        };
        let admin_addr = admin.as_ref().and_then(|s| s.local_addr().ok());
        if let (Some(s), Some(a)) = (&admin, admin_addr) {
            let clone = s
                .try_clone()
                .map_err(|source| ServerError::Bind { addr: a, source })?;
            clones.insert(a, vec![clone]);
        }

        let shared = Arc::new(config.clone());
        let mut workers = Vec::new();
        let mut generations = Vec::new();
        for (id, m) in worker_metrics.iter().enumerate() {
            let generation =
                generation_for_worker(id, &shared, &built, &listeners, &mut sockets, None);
            let (gen_tx, gen_rx) = mpsc::unbounded_channel();
            generations.push(gen_tx);
            let extras = WorkerExtras {
                metrics: m.clone(),
                registry: metrics.clone(),
                file_cache: file_cache.clone(),
                cache: cache.clone(),
                client_slots: client_slots.clone(),
            };
            let rx = rx.clone();
            let handle = std::thread::Builder::new()
                .name(format!("qweb-worker-{id}"))
                .spawn(move || {
                    if let Err(e) = worker::run(id, generation, extras, gen_rx, rx) {
                        tracing::error!(worker = id, "worker failed: {e}");
                    }
                })
                .map_err(ServerError::Thread)?;
            workers.push(handle);
        }
        let mut admin_thread = None;
        if let Some(socket) = admin {
            // Its own thread: metrics stay readable when workers are busy or blocked
            // (sync offload).
            let state = crate::runtime::admin::AdminState {
                registry: metrics.clone(),
                cache: Some(cache.clone()),
                fleet: fleet.clone(),
            };
            let rx = rx.clone();
            let limits = config.admin_limits.clone();
            let handle = std::thread::Builder::new()
                .name("qweb-admin".into())
                .spawn(move || crate::runtime::admin::run_with(socket, state, rx, limits))
                .map_err(ServerError::Thread)?;
            admin_thread = Some(handle);
        }
        Ok(RunningServer {
            addrs: listeners.iter().map(|l| l.bound).collect(),
            listeners,
            admin: admin_addr,
            info,
            shutdown: tx,
            workers,
            admin_thread,
            generations,
            sockets: clones,
            sessions: kept_sessions(&config, &built),
            engines: built.engines,
            refreshers: built.refreshers,
            config,
            metrics,
            tls_sessions_collector,
            phase: Phase::Running,
            fleet,
        })
    }
}

/// The TLS listeners' session state, labelled by bound address, for `/metrics`.
fn tls_sessions(
    listeners: &[BoundListener],
    built: &Built,
) -> Vec<crate::runtime::tls::session::LabelledSession> {
    listeners
        .iter()
        .zip(&built.listeners)
        .filter_map(|(l, setup)| Some((l.bound.to_string(), setup.session.clone()?)))
        .collect()
}

/// Writes the built-in welcome site when a route serves it; returns its folder then.
fn install_welcome(config: &Config) -> Result<Option<PathBuf>, ServerError> {
    let welcome = config.welcome_root();
    if !config
        .routes
        .iter()
        .any(|r| matches!(&r.action, RouteAction::Static(s) if s.root == welcome))
    {
        return Ok(None);
    }
    crate::runtime::welcome::install(&welcome).map_err(|source| ServerError::State {
        path: welcome.clone(),
        source,
    })?;
    Ok(Some(welcome))
}

/// The TLS listeners' resumption state of `built`, by configured address (a listener on
/// port 0 gets a new port at each reload: nothing to keep).
fn kept_sessions(
    config: &Config,
    built: &Built,
) -> HashMap<SocketAddr, Arc<crate::runtime::tls::session::ListenerSession>> {
    config
        .listeners
        .iter()
        .zip(&built.listeners)
        .filter(|(l, _)| l.address.port() != 0)
        .filter_map(|(l, setup)| Some((l.address, setup.session.clone()?)))
        .collect()
}

/// Engines, listener TLS setups and compression for `config`; engines of `previous` whose
/// configuration is unchanged are reused, and so is the resumption state of `sessions`
/// (listeners by configured address) whose settings are unchanged.
fn build(
    config: &Config,
    previous: &HashMap<String, BuiltEngine>,
    sessions: &HashMap<SocketAddr, Arc<crate::runtime::tls::session::ListenerSession>>,
    compression_metrics: &Arc<qweb_compress::CompressMetrics>,
    info: &mut StartInfo,
) -> Result<Built, ServerError> {
    let engines = build_engines(config, previous)?;
    let by_name: HashMap<&str, Arc<dyn Engine>> = engines
        .iter()
        .map(|(n, b)| (n.as_str(), b.engine.clone()))
        .collect();
    let mut refreshers = Vec::new();
    let acme = crate::runtime::tls::acme::prepare(config, &by_name).map(|(managed, jobs)| {
        refreshers.extend(
            jobs.into_iter()
                .map(|j| crate::runtime::tls::session::Refresher::Acme(Box::new(j))),
        );
        managed
    });
    let listeners = config
        .listeners
        .iter()
        .map(|l| {
            let previous = sessions.get(&l.address).map(|s| &**s);
            let acme = acme.as_ref();
            listener_setup(config, l, &by_name, info, &mut refreshers, previous, acme)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let (stop, stopped) = crate::runtime::tls::session::RefresherStop::new();
    // detached: each ends within a second of `stop` being dropped
    drop(crate::runtime::tls::session::spawn(refreshers, &stopped)?);
    let compression = crate::pipeline::compress::shared(
        config,
        |name| by_name.get(name).cloned(),
        compression_metrics,
    );
    Ok(Built {
        engines,
        listeners,
        compression,
        refreshers: stop,
        acme,
    })
}

/// A listener's rustls configuration (certificates loaded, signing offloaded as configured)
/// and its async-offload engine.
fn listener_setup(
    config: &Config,
    l: &ListenerConfig,
    engines: &HashMap<&str, Arc<dyn Engine>>,
    info: &mut StartInfo,
    refreshers: &mut Vec<crate::runtime::tls::session::Refresher>,
    previous: Option<&crate::runtime::tls::session::ListenerSession>,
    acme: Option<&Arc<qweb_tls::Managed>>,
) -> Result<ListenerSetup, ServerError> {
    let provider = qweb_tls::provider();
    let offload = l
        .offload
        .as_ref()
        .filter(|o| o.policy.mode.offloads())
        .and_then(|o| engines.get(o.engine.as_str()).map(|e| (o, e.clone())));
    let key_offload = offload.as_ref().map(|(o, e)| qweb_tls::KeyOffload {
        engine: e.clone(),
        policy: o.policy,
    });
    let async_engine = offload
        .as_ref()
        .filter(|(o, _)| o.policy.mode == Mode::Async)
        .map(|(o, e)| (e.clone(), o.policy.timeout));
    let load = |cert: &Path, key: Option<&Path>| match (&key_offload, key) {
        (Some(p), key) => qweb_tls::load_offloaded(cert, key, &provider, p),
        (None, Some(key)) => qweb_tls::load_certified_key(cert, key, &provider),
        (None, None) => Err(qweb_tls::TlsError::Pem {
            path: cert.to_owned(),
            message: "no private key, and no key server engine for this listener".into(),
        }),
    };
    let mut session = None;
    let mut sites = None;
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
                    crate::runtime::tls::session::staple(list, &mut certs, refreshers);
                    certs
                }
            };
            // ACME certificates join the listeners that take the sites' certificates
            let acme = acme.filter(|_| matches!(t, TlsConfig::Certificates(_)));
            let resolver = match acme {
                Some(m) => qweb_tls::SniResolver::with_managed(&certs, m.clone()),
                None => qweb_tls::SniResolver::new(&certs).ok_or_else(|| {
                    qweb_tls::TlsError::Generate("no certificate for a TLS listener".into())
                })?,
            };
            let client_auth = match &l.client_auth {
                Some(c) => Some(qweb_tls::ClientAuth::with_names(
                    &c.ca, c.required, &c.names,
                )?),
                None => None,
            };
            let resolver: Arc<dyn rustls::server::ResolvesServerCert> = Arc::new(resolver);
            let mut sc = qweb_tls::server_config(resolver.clone(), l.http2, client_auth.as_ref())?;
            if acme.is_some() {
                // last: only a client offering `acme-tls/1` alone (a CA validating
                // TLS-ALPN-01) gets it
                sc.alpn_protocols.push(qweb_tls::ALPN_ACME.to_vec());
            }
            let (s, refresher) =
                crate::runtime::tls::session::setup(l, config, &certs, &mut sc, previous)?;
            // sites with a policy of their own share the listener's certificates and
            // resumption state, each bound to its own policy
            if matches!(t, TlsConfig::Certificates(_)) {
                sites = site_policies(config, &sc, &resolver, l.http2)?;
            }
            if let Some(c) = &client_auth {
                // a session resumes only under the policy that issued it
                qweb_tls::client_auth::bind_sessions(&mut sc, c.tag);
            }
            session = Some(Arc::new(s));
            refreshers.extend(refresher);
            Some(Arc::new(sc))
        }
    };
    Ok(ListenerSetup {
        tls,
        async_engine,
        session,
        sites,
    })
}

/// The configurations of the sites with their own `client_auth`, made like the listener's
/// `base` (certificates from `resolver`, its ALPN, tickets and session cache, before they are
/// bound to the listener's policy); `None`: no site has one.
fn site_policies(
    config: &Config,
    base: &rustls::ServerConfig,
    resolver: &Arc<dyn rustls::server::ResolvesServerCert>,
    http2: bool,
) -> Result<Option<Arc<qweb_tls::SitePolicies>>, ServerError> {
    let mut out = qweb_tls::SitePolicies::default();
    for (i, site) in config.sites.sites.iter().enumerate() {
        let Some(c) = &site.client_auth else { continue };
        let auth = qweb_tls::ClientAuth::with_names(&c.ca, c.required, &c.names)?;
        let mut sc = qweb_tls::server_config(resolver.clone(), http2, Some(&auth))?;
        sc.alpn_protocols = base.alpn_protocols.clone();
        sc.max_early_data_size = base.max_early_data_size;
        sc.send_tls13_tickets = base.send_tls13_tickets;
        sc.ticketer = base.ticketer.clone();
        sc.session_storage = base.session_storage.clone();
        qweb_tls::client_auth::bind_sessions(&mut sc, auth.tag);
        out.add(i, &site.server_names, Arc::new(sc));
    }
    Ok((!out.is_empty()).then(|| Arc::new(out)))
}

/// One worker's share of a generation: every listener, with a socket where it is new (each
/// worker takes the next socket of a new listener).
fn generation_for_worker(
    worker: usize,
    config: &Arc<Config>,
    built: &Built,
    listeners: &[BoundListener],
    sockets: &mut HashMap<usize, Vec<std::net::TcpListener>>,
    applied: Option<std::sync::mpsc::Sender<()>>,
) -> Generation {
    let listeners = listeners
        .iter()
        .zip(&built.listeners)
        .enumerate()
        .map(|(i, (l, setup))| GenListener {
            bound: l.bound,
            ipv6_only: l.ipv6_only,
            // each worker takes the next socket of a new listener
            socket: sockets.get_mut(&i).and_then(|s| s.pop()),
            // (a binary upgrade's: taken at start, before unadopted ones are closed)
            udp: crate::runtime::quic::steer::take_inherited(l.bound, worker),
            tls: setup.tls.clone(),
            site_policies: setup.sites.clone(),
            async_engine: setup.async_engine.clone(),
            sessions: setup.session.as_ref().map(|s| s.stats.clone()),
            redirect: config.listeners.get(i).and_then(|c| c.redirect.clone()),
            http3: config
                .listeners
                .get(i)
                .filter(|c| c.http3)
                .map(|c| c.alt_svc_max_age),
            quic_retry_threshold: config
                .listeners
                .get(i)
                .map_or(crate::config::DEFAULT_QUIC_RETRY_THRESHOLD, |c| {
                    c.quic_retry_threshold
                }),
            proxy_protocol: config
                .listeners
                .get(i)
                .and_then(|c| c.proxy_protocol.clone()),
        })
        .collect();
    Generation {
        config: config.clone(),
        listeners,
        compression: built.compression.clone(),
        acme: built.acme.clone(),
        applied,
    }
}

/// The hash `/metrics` shows for `config` (of its files' bytes, the included ones too; of
/// nothing for the built-in default).
fn config_hash(config: &Config) -> String {
    let mut bytes = Vec::new();
    for p in &config.files {
        bytes.extend(std::fs::read(p).unwrap_or_default());
    }
    qweb_observe::metrics::config_hash(&bytes)
}

/// Checks what a worker would open for `config` (static roots), so that a reload fails here,
/// whole, rather than on some workers.
fn check_worker_setup(config: &Config) -> Result<(), ServerError> {
    for r in &config.routes {
        if let RouteAction::Static(s) = &r.action {
            crate::files::StaticFiles::new(s).map_err(|source| ServerError::State {
                path: s.root.clone(),
                source,
            })?;
        }
    }
    Ok(())
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

    /// Where the server is in its life.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The configuration in use.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Reads the configuration file the server was started with (or `path`) and reloads it;
    /// see [`RunningServer::reload`]. An invalid file changes nothing.
    pub fn reload_from(&mut self, path: Option<&Path>) -> Result<(), ReloadError> {
        let path = path
            .or(self.config.source.as_deref())
            .map(Path::to_path_buf);
        let config = match path {
            Some(p) => Config::from_file(&p),
            None => Ok(Config::default_config()),
        };
        match config {
            Ok(c) => Ok(self.reload(c)?),
            Err(e) => {
                self.metrics.reloaded(None);
                Err(e.into())
            }
        }
    }

    /// Puts `config` in place for new connections: new listeners open, removed ones close,
    /// kept ones (same address) keep their sockets, so no connection is refused meanwhile;
    /// routes, certificates, engines and limits are the new ones. Engines whose
    /// configuration is unchanged are kept. Connections already open, their requests and
    /// their paused handshakes finish on the old configuration, within its
    /// `shutdown_timeout`. On error nothing changes. `workers` and `[admin]` need a restart
    /// (or a binary upgrade): their changes are logged and ignored.
    pub fn reload(&mut self, mut config: Config) -> Result<(), ServerError> {
        self.phase = Phase::Reloading {
            since: Instant::now(),
        };
        let r = self.try_reload(&mut config);
        self.phase = Phase::Running;
        match r {
            Ok(()) => {
                self.metrics.reloaded(Some(config_hash(&config)));
                self.config = config;
                Ok(())
            }
            Err(e) => {
                self.metrics.reloaded(None);
                Err(e)
            }
        }
    }

    fn try_reload(&mut self, config: &mut Config) -> Result<(), ServerError> {
        if config.workers != self.config.workers {
            tracing::warn!(
                "reload: `workers` changed from {} to {}: needs a restart or a binary upgrade; keeping {}",
                self.config.workers,
                config.workers,
                self.config.workers
            );
            config.workers = self.config.workers;
        }
        if config.admin != self.config.admin {
            tracing::warn!("reload: `[admin]` changed: needs a restart or a binary upgrade; keeping the running admin listener");
            config.admin = self.config.admin;
        }
        check_worker_setup(config)?;
        crate::runtime::fleet::limit::attach(config, self.fleet.as_ref());
        let mut info = self.info.clone();
        info.welcome = install_welcome(config)?;
        let built = build(
            config,
            &self.engines,
            &self.sessions,
            &self.metrics.compression,
            &mut info,
        )?;
        refuse_addresses_in_use(config, &self.listeners, false)?;
        let n = self.generations.len();
        let (listeners, mut sockets) = bind_new_listeners(config, &self.listeners, n)?;
        let mut previous = std::mem::take(&mut self.sockets);
        let admin = self.admin.and_then(|a| previous.remove(&a).map(|s| (a, s)));
        self.sockets = clone_sockets(&listeners, &sockets, previous)?;
        if let Some((a, s)) = admin {
            self.sockets.insert(a, s);
        }
        let shared = Arc::new(config.clone());
        let (ack, acks) = std::sync::mpsc::channel();
        let mut sent = 0;
        for (id, tx) in self.generations.iter().enumerate() {
            let generation = generation_for_worker(
                id,
                &shared,
                &built,
                &listeners,
                &mut sockets,
                Some(ack.clone()),
            );
            match tx.send(Command::Generation(generation)) {
                Ok(()) => sent += 1,
                Err(_) => tracing::error!(worker = id, "reload: the worker is gone"),
            }
        }
        // when this returns, every new connection gets the new configuration
        let deadline = Instant::now() + Duration::from_secs(10);
        for _ in 0..sent {
            let left = deadline.saturating_duration_since(Instant::now());
            if acks.recv_timeout(left).is_err() {
                tracing::warn!("reload: a worker did not confirm within 10 s");
                break;
            }
        }
        self.metrics.engines.set(engine_list(&built.engines));
        self.metrics
            .upstreams
            .set(qweb_proxy::upstream_gauges(config));
        self.tls_sessions_collector
            .set(tls_sessions(&listeners, &built));
        self.sessions = kept_sessions(config, &built);
        self.engines = built.engines;
        self.refreshers = built.refreshers;
        self.addrs = listeners.iter().map(|l| l.bound).collect();
        self.listeners = listeners;
        self.info = info;
        Ok(())
    }

    /// Binary upgrade, step 1: starts `exe args` with this server's listening sockets
    /// inherited (see [`crate::runtime::process::upgrade`]) and waits up to `within` for it to serve. Returns
    /// its pid; then call [`RunningServer::hand_over`]. On error this server serves on.
    pub fn upgrade(
        &self,
        exe: &Path,
        args: &[std::ffi::OsString],
        within: Duration,
    ) -> Result<u32, crate::runtime::process::upgrade::UpgradeError> {
        let mut sockets = Vec::new();
        for (addr, list) in &self.sockets {
            let fds = list
                .iter()
                .map(|s| s.try_clone().map(std::os::fd::OwnedFd::from))
                .collect::<Result<Vec<_>, _>>()?;
            sockets.push((*addr, fds));
        }
        let quic = crate::runtime::quic::steer::prepare_handoff()?;
        crate::runtime::process::upgrade::start_new_binary(exe, args, &sockets, quic, within)
    }

    /// Binary upgrade, step 2: stops accepting (the new process accepts on the same
    /// sockets), lets every connection close after its current request (within
    /// `shutdown_timeout`), then returns.
    pub fn hand_over(mut self) {
        self.phase = Phase::Draining {
            deadline: Instant::now() + self.config.shutdown_timeout,
        };
        self.sockets.clear();
        // the new process reads the UDP sockets now, and forwards this one's datagrams
        crate::runtime::quic::steer::stop_reading();
        for tx in &self.generations {
            let _ = tx.send(Command::HandOver);
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
        self.stop();
    }

    /// Stops accepting, lets in-flight requests finish (up to the configured
    /// `shutdown_timeout`), then returns.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.phase = Phase::Draining {
            deadline: Instant::now() + self.config.shutdown_timeout,
        };
        // our duplicates would keep closed listeners queueing connections nobody accepts
        self.sockets.clear();
        let _ = self.shutdown.send(true);
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
        if let Some(a) = self.admin_thread.take() {
            let _ = a.join();
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        self.stop();
    }
}
