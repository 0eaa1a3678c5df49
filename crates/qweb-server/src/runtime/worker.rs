//! A worker: one OS thread running one single-threaded event loop (tokio current-thread
//! runtime + `LocalSet`), accepting on its own `SO_REUSEPORT` sockets. Everything a request
//! touches (routes, upstream pools, connection counters) is owned by the worker: no locks and
//! no cross-thread hops on the request path.
//!
//! A worker serves *generations* of the configuration. A reload hands it a new
//! [`Generation`]: it builds a new [`WorkerCtx`] (routes, limits, compression) and points its
//! accept loops at it; listeners that stay keep their sockets and accept loops (no accept
//! gap), removed ones close, new ones start. The old context is *retired*: its connections
//! close once their current request is done (HTTP/1.1 `Connection: close`, HTTP/2 GOAWAY),
//! its paused handshakes finish, and whatever is left at its `shutdown_timeout` is closed.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use qweb_offload::{BatchConfig, Engine, Offloader};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::conn::TlsListener;
use crate::pipeline::ctx::WorkerCtx;
use crate::pipeline::routes::{build_route, Handler};
use qweb_observe::metrics::{Metrics, WorkerMetrics, NO_ROUTE};

/// One listener as this worker sees it.
pub(crate) struct ListenerCtx {
    pub tls: Option<TlsListener>,
    pub local_addr: SocketAddr,
    /// Every request on this listener is redirected.
    pub redirect: Option<Rc<crate::config::RedirectConfig>>,
    /// `Alt-Svc` of its responses: HTTP/3 on, and this worker's QUIC endpoint is up (a
    /// worker whose UDP socket did not bind advertises nothing it cannot serve).
    pub alt_svc: RefCell<Option<http::HeaderValue>>,
    /// QUIC handshakes in progress on this worker past which a new connection from an
    /// unvalidated address gets a Retry (`quic_retry_threshold`).
    pub quic_retry_threshold: i64,
    /// PROXY protocol: the balancers whose connections begin with a PROXY header (TCP).
    pub proxy_protocol: Option<crate::config::ProxyProtocol>,
}

impl ListenerCtx {
    /// The service of a connection accepted on this listener.
    fn service(
        &self,
        worker: &Rc<WorkerCtx>,
        state: Rc<qweb_session::ConnState>,
    ) -> crate::pipeline::service::Service {
        crate::pipeline::service::Service::new(
            worker.clone(),
            state,
            self.tls.is_some(),
            self.local_addr,
            self.redirect.clone(),
            self.alt_svc.borrow().clone(),
        )
    }
}

/// One listener of a generation, as handed to a worker.
pub(crate) struct GenListener {
    /// The address it is bound to (its identity across reloads).
    pub bound: SocketAddr,
    /// `IPV6_V6ONLY` of its sockets (the HTTP/3 socket is bound alike).
    pub ipv6_only: bool,
    /// This worker's socket when the listener is new; `None`: keep the one it has.
    pub socket: Option<StdListener>,
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// The configurations of sites with their own `client_auth`, by SNI.
    pub site_policies: Option<Arc<qweb_tls::SitePolicies>>,
    /// Async offload: the engine and the per-op timeout.
    pub async_engine: Option<(Arc<dyn Engine>, Duration)>,
    /// Every request on this listener is redirected.
    pub redirect: Option<crate::config::RedirectConfig>,
    /// Full/resumed handshake counters of the listener (TLS listeners).
    pub sessions: Option<Arc<qweb_tls::HandshakeStats>>,
    /// HTTP/3 on (a TLS listener): `Alt-Svc`'s max-age.
    pub http3: Option<u64>,
    /// `quic_retry_threshold` of the listener.
    pub quic_retry_threshold: u32,
    /// `proxy_protocol` of the listener.
    pub proxy_protocol: Option<crate::config::ProxyProtocol>,
    /// HTTP/3: this worker's UDP socket and the channel to the process that handed it over
    /// (a binary upgrade; see `crate::runtime::quic::steer`).
    pub udp: Option<(std::net::UdpSocket, std::os::fd::OwnedFd)>,
}

/// A configuration generation for one worker.
pub(crate) struct Generation {
    pub config: Arc<Config>,
    pub listeners: Vec<GenListener>,
    pub compression: Option<Arc<crate::pipeline::compress::Shared>>,
    /// ACME challenge answers (sites with `acme`).
    pub acme: Option<Arc<qweb_tls::Managed>>,
    /// Told when the worker serves new connections with this generation (a reload waits for
    /// every worker).
    pub applied: Option<std::sync::mpsc::Sender<()>>,
}

/// What the server tells a worker.
pub(crate) enum Command {
    /// Serve new connections with this generation (a reload).
    Generation(Generation),
    /// A binary upgrade: another process accepts now. Stop accepting, let every connection
    /// close after its current request (within `shutdown_timeout`), then return.
    HandOver,
}

/// What a worker gets besides its generations.
pub(crate) struct WorkerExtras {
    pub metrics: Arc<WorkerMetrics>,
    /// The server's registry (route metrics handles).
    pub registry: Arc<Metrics>,
    /// The server's open-file cache counters.
    pub file_cache: Arc<crate::files::cache::Stats>,
    /// The server's proxy cache store (every worker's, kept across reloads).
    pub cache: Arc<qweb_cache::Store>,
    /// The connections per client address (every worker's, kept across reloads).
    pub client_slots: Arc<qweb_session::client_slots::ClientSlots>,
}

/// One configuration generation on this worker: what its connections are served with, and
/// the connections themselves.
struct Gen {
    ctx: Rc<WorkerCtx>,
    /// The connections of this generation, aborted when it was retired and its deadline
    /// passed (kept here rather than a kill switch in every connection's task, which was
    /// polled at every wake-up of every connection and made each task bigger).
    tasks: RefCell<HashMap<u64, tokio::task::AbortHandle>>,
    /// The key of the next connection in `tasks`.
    next_task: Cell<u64>,
    connections: Cell<usize>,
    connection_closed: Notify,
    /// `upgrade_drain_timeout` of this generation's configuration.
    upgrade_drain: Duration,
}

/// What an accept loop serves new connections with; replaced by a reload.
struct Current {
    listener: Rc<ListenerCtx>,
    gen: Rc<Gen>,
}

/// A running accept loop.
struct Accepting {
    current: Rc<RefCell<Current>>,
    task: JoinHandle<()>,
    /// HTTP/3: this worker's QUIC endpoint on the listener's address, and its accept loop.
    quic: Option<(quinn::Endpoint, JoinHandle<()>)>,
}

impl Accepting {
    /// Stops accepting (connections already accepted go on); returns the QUIC endpoint, if
    /// any, whose connections may still be closing.
    fn stop_accepting(&mut self) -> Option<quinn::Endpoint> {
        self.task.abort();
        let (endpoint, task) = self.quic.take()?;
        task.abort();
        // no new QUIC connections; those in flight keep the endpoint's driver running
        endpoint.set_server_config(None);
        Some(endpoint)
    }
}

/// The worker's state across generations.
struct Worker {
    id: usize,
    extras: WorkerExtras,
    shutdown: watch::Receiver<bool>,
    ctx: Option<(Rc<Gen>, Duration)>,
    accepting: HashMap<SocketAddr, Accepting>,
    retiring: Vec<JoinHandle<()>>,
}

/// Runs a worker until shutdown; returns when its connections are done or the deadline
/// passed.
pub(crate) fn run(
    id: usize,
    first: Generation,
    extras: WorkerExtras,
    mut generations: mpsc::UnboundedReceiver<Command>,
    shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let mut w = Worker {
            id,
            extras,
            shutdown: shutdown.clone(),
            ctx: None,
            accepting: HashMap::new(),
            retiring: Vec::new(),
        };
        w.apply(first)?;
        tracing::debug!(worker = id, "worker started");
        let mut sd = shutdown.clone();
        loop {
            tokio::select! {
                g = generations.recv() => match g {
                    Some(Command::HandOver) => {
                        w.hand_over().await;
                        break;
                    }
                    Some(Command::Generation(mut g)) => {
                        let applied = g.applied.take();
                        if let Err(e) = w.apply(g) {
                            tracing::error!(worker = id, "reload: this worker keeps the old configuration: {e}");
                        }
                        if let Some(a) = applied {
                            let _ = a.send(());
                        }
                    }
                    None => break,
                },
                _ = sd.wait_for(|s| *s) => break,
            }
        }
        w.stop().await;
        tracing::debug!(worker = id, "worker stopped");
        Ok::<(), std::io::Error>(())
    })
}

impl Worker {
    /// Puts a generation in place: new connections get it; the previous one retires.
    fn apply(&mut self, g: Generation) -> std::io::Result<()> {
        let config = &g.config;
        qweb_offload::job::set_max_live(config.offload.max_jobs_per_worker);
        crate::files::cache::configure(&config.file_cache, &self.extras.file_cache);
        crate::files::body::set_held_fds(config.file_cache.held_fds);
        self.extras
            .cache
            .set_limits(crate::pipeline::cache::limits(&config.cache));
        let batch = BatchConfig {
            enabled: config.offload.batch,
            max: config.offload.batch_max,
        };
        let routes = config
            .routes
            .iter()
            .map(|r| build_route(r, &self.extras.registry, "", false))
            .collect::<std::io::Result<Vec<_>>>()?;
        let sites = crate::pipeline::sites::Sites::new(&config.sites, &self.extras.registry)?;
        let ctx = Rc::new(WorkerCtx {
            limits: config.limits.clone(),
            routes,
            sites,
            access_log: config.log.access,
            log_format: config.log.format,
            shutdown: self.shutdown.clone(),
            retire: watch::Sender::new(false),
            metrics: self.extras.metrics.clone(),
            unmatched: Rc::new(self.extras.registry.route(NO_ROUTE)),
            compression: g
                .compression
                .as_ref()
                .map(crate::pipeline::compress::Compressor::new),
            peer_log: qweb_observe::log_limit::PerPeer::new(Duration::from_secs(60)),
            tunnels: Rc::default(),
            acme: g.acme.clone(),
            cache: crate::pipeline::cache::CacheCtx {
                store: self.extras.cache.clone(),
                collapse_timeout: config.cache.collapse_timeout,
            },
            client_slots: self.extras.client_slots.clone(),
        });
        let gen = Rc::new(Gen {
            ctx: ctx.clone(),
            tasks: RefCell::new(HashMap::new()),
            next_task: Cell::new(0),
            connections: Cell::new(0),
            connection_closed: Notify::new(),
            upgrade_drain: config.upgrade_drain_timeout,
        });
        let mut next = HashMap::new();
        for l in g.listeners {
            let sessions = l.sessions;
            let site_policies = l.site_policies;
            let tls = l.tls.map(|config| TlsListener {
                config,
                site_policies,
                sessions,
                offloader: l
                    .async_engine
                    .map(|(engine, timeout)| Offloader::new(engine, batch, timeout)),
            });
            let quic = match (&tls, l.http3) {
                (Some(tls), Some(_)) => {
                    let offload = tls
                        .offloader
                        .as_ref()
                        .map(|o| (o.clone(), ctx.metrics.clone()));
                    match crate::runtime::quic::server_config(&tls.config, &config.limits, offload)
                    {
                        Ok(c) => Some(c),
                        Err(e) => {
                            tracing::error!(worker = self.id, listener = %l.bound, "no HTTP/3 on this listener: {e}");
                            None
                        }
                    }
                }
                _ => None,
            };
            let lctx = Rc::new(ListenerCtx {
                tls,
                local_addr: l.bound,
                redirect: l.redirect.map(Rc::new),
                alt_svc: RefCell::new(
                    l.http3
                        .filter(|_| quic.is_some())
                        .map(|age| crate::runtime::quic::alt_svc(l.bound.port(), age)),
                ),
                quic_retry_threshold: l.quic_retry_threshold.into(),
                proxy_protocol: l.proxy_protocol,
            });
            let current = Current {
                listener: lctx,
                gen: gen.clone(),
            };
            let mut accepting = match (self.accepting.remove(&l.bound), l.socket) {
                (Some(a), _) => {
                    // kept: the same socket and accept loop, the new configuration
                    *a.current.borrow_mut() = current;
                    a
                }
                (None, Some(socket)) => {
                    let socket = match TcpListener::from_std(socket) {
                        Ok(s) => s,
                        Err(e) => {
                            tracing::error!(worker = self.id, listener = %l.bound, "cannot accept on this listener: {e}");
                            continue;
                        }
                    };
                    let current = Rc::new(RefCell::new(current));
                    let task = tokio::task::spawn_local(accept_loop(
                        socket,
                        current.clone(),
                        self.shutdown.clone(),
                    ));
                    Accepting {
                        current,
                        task,
                        quic: None,
                    }
                }
                (None, None) => {
                    tracing::error!(worker = self.id, listener = %l.bound, "reload: no socket for this listener on this worker");
                    continue;
                }
            };
            self.quic(&mut accepting, (l.bound, l.ipv6_only), l.udp, quic);
            if accepting.quic.is_none() {
                accepting.current.borrow().listener.alt_svc.take();
            }
            next.insert(l.bound, accepting);
        }
        for r in ctx.routes.iter().chain(ctx.sites.all_routes()) {
            if let Handler::Proxy(p) = &r.handler {
                p.start_health_checks();
            }
        }
        // listeners the generation does not have: their sockets close now
        for (addr, mut a) in self.accepting.drain() {
            tracing::debug!(worker = self.id, listener = %addr, "listener closed by reload");
            a.stop_accepting();
        }
        self.accepting = next;
        let previous = self.ctx.replace((gen, config.shutdown_timeout));
        if let Some((old, deadline)) = previous {
            self.retiring.retain(|t| !t.is_finished());
            self.retiring
                .push(tokio::task::spawn_local(retire(old, deadline)));
        }
        Ok(())
    }

    /// Starts, keeps (with the new configuration) or stops the listener's QUIC endpoint on
    /// this worker; `config`: HTTP/3 on.
    fn quic(
        &self,
        a: &mut Accepting,
        (bound, ipv6_only): (SocketAddr, bool),
        inherited: Option<(std::net::UdpSocket, std::os::fd::OwnedFd)>,
        config: Option<quinn::ServerConfig>,
    ) {
        match (config, &a.quic) {
            (Some(c), Some((endpoint, _))) => endpoint.set_server_config(Some(c)),
            (Some(c), None) => {
                match crate::runtime::quic::endpoint(bound, ipv6_only, self.id, inherited, c) {
                    Ok(endpoint) => {
                        let task = tokio::task::spawn_local(quic_accept_loop(
                            endpoint.clone(),
                            a.current.clone(),
                            self.shutdown.clone(),
                        ));
                        a.quic = Some((endpoint, task));
                    }
                    Err(e) => {
                        tracing::error!(worker = self.id, listener = %bound, "no HTTP/3 on this listener: {e}");
                    }
                }
            }
            (None, Some(_)) => {
                if let Some((endpoint, task)) = a.quic.take() {
                    task.abort();
                    endpoint.set_server_config(None);
                }
            }
            (None, None) => {}
        }
    }

    /// Binary upgrade: stops accepting (the sockets live on in the new process) and retires
    /// the current generation like a reload would; returns when every connection is done.
    async fn hand_over(&mut self) {
        for (_, mut a) in self.accepting.drain() {
            a.stop_accepting();
            let _ = a.task.await;
        }
        if let Some((old, deadline)) = self.ctx.take() {
            self.retiring
                .push(tokio::task::spawn_local(retire(old, deadline)));
        }
        for t in self.retiring.drain(..) {
            let _ = t.await;
        }
    }

    /// Shutdown: stops accepting, then waits for the connections of every generation (each
    /// within its deadline).
    async fn stop(&mut self) {
        let mut endpoints = Vec::new();
        for (_, mut a) in self.accepting.drain() {
            endpoints.extend(a.stop_accepting());
            let _ = a.task.await;
        }
        if let Some((ctx, deadline)) = self.ctx.take() {
            drain(&ctx, deadline).await;
        }
        for t in self.retiring.drain(..) {
            let _ = t.await;
        }
        // the QUIC connections' last packets (CONNECTION_CLOSE) leave before the runtime ends
        for e in endpoints {
            let _ = tokio::time::timeout(QUIC_CLOSE_GRACE, e.wait_idle()).await;
        }
    }
}

/// How long a stopping worker waits for its QUIC endpoints' closing connections.
const QUIC_CLOSE_GRACE: Duration = Duration::from_secs(1);

/// How long tunnels told to go away get to send their close frames and close.
const GOING_AWAY_GRACE: Duration = Duration::from_secs(2);

/// A replaced generation: its connections close after their current request; what is left
/// at `deadline` is closed, except tunnels (WebSockets...), which go on until
/// `upgrade_drain_timeout` (counted from now) or a shutdown, then are told to go away (a
/// WebSocket close frame 1001 each way) and closed.
async fn retire(gen: Rc<Gen>, deadline: Duration) {
    let started = tokio::time::Instant::now();
    let tunnels = gen.ctx.tunnels.clone();
    gen.ctx.retire.send_replace(true);
    if !wait_until(&gen, deadline, |g| g.connections.get() <= tunnels.count()).await {
        tracing::warn!(
            connections = gen.connections.get().saturating_sub(tunnels.count()),
            "shutdown deadline passed; closing the remaining connections"
        );
    }
    // (taken out first: an aborted task's `ConnCount` removes itself from the map)
    let tasks: Vec<_> = {
        let mut all = gen.tasks.borrow_mut();
        let ids: Vec<u64> = all
            .iter()
            .filter(|(_, t)| !tunnels.runs(t.id()))
            .map(|(k, _)| *k)
            .collect();
        ids.into_iter().filter_map(|k| all.remove(&k)).collect()
    };
    for t in tasks {
        t.abort();
    }
    if gen.connections.get() > 0 {
        let left = gen.upgrade_drain.saturating_sub(started.elapsed());
        let mut shutdown = gen.ctx.shutdown.clone();
        tokio::select! {
            _ = wait_until(&gen, left, |g| g.connections.get() == 0) => {}
            _ = shutdown.wait_for(|s| *s) => {}
        }
    }
    if gen.connections.get() > 0 {
        tracing::info!(
            tunnels = gen.connections.get(),
            "tunnels of a replaced configuration: going away"
        );
        tunnels.go_away();
        wait_until(&gen, GOING_AWAY_GRACE, |g| g.connections.get() == 0).await;
    }
    let tasks = std::mem::take(&mut *gen.tasks.borrow_mut());
    for t in tasks.into_values() {
        t.abort();
    }
}

/// Waits until every connection has finished, or the deadline passed.
async fn drain(gen: &Rc<Gen>, deadline: Duration) {
    if !wait_until(gen, deadline, |g| g.connections.get() == 0).await {
        tracing::warn!(
            connections = gen.connections.get(),
            "shutdown deadline passed; closing the remaining connections"
        );
    }
}

/// Waits until `done` holds (checked whenever a connection closes or a tunnel starts), or
/// `deadline` passed; says whether it holds.
async fn wait_until(gen: &Rc<Gen>, deadline: Duration, done: impl Fn(&Gen) -> bool) -> bool {
    let wait = async {
        while !done(gen) {
            tokio::select! {
                _ = gen.connection_closed.notified() => {}
                _ = gen.ctx.tunnels.started.notified() => {}
            }
        }
    };
    tokio::time::timeout(deadline, wait).await.is_ok()
}

/// A connection of a generation, counted while it lives.
struct ConnCount(Rc<Gen>, u64);

impl ConnCount {
    /// Counts a new connection of `gen` (its key in `gen.tasks` is `.1`).
    fn new(gen: &Rc<Gen>) -> Self {
        gen.connections.set(gen.connections.get() + 1);
        gen.ctx
            .metrics
            .connections
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = gen.next_task.get();
        gen.next_task.set(id + 1);
        ConnCount(gen.clone(), id)
    }
}

impl Drop for ConnCount {
    fn drop(&mut self) {
        self.0.tasks.borrow_mut().remove(&self.1);
        self.0.connections.set(self.0.connections.get() - 1);
        self.0
            .ctx
            .metrics
            .connections
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        self.0.connection_closed.notify_waiters();
    }
}

/// Accepts QUIC connections on this worker's endpoint, each served by `conn::h3` with the
/// generation current when it arrived (as the TCP accept loop). At
/// `max_connections_per_worker`, new connections are refused.
async fn quic_accept_loop(
    endpoint: quinn::Endpoint,
    current: Rc<RefCell<Current>>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let incoming = tokio::select! {
            i = endpoint.accept() => match i {
                Some(i) => i,
                None => return,
            },
            _ = shutdown.wait_for(|s| *s) => return,
        };
        let (listener, ctx) = {
            let c = current.borrow();
            (c.listener.clone(), c.gen.clone())
        };
        if ctx.connections.get() >= ctx.ctx.limits.max_connections_per_worker {
            incoming.refuse();
            continue;
        }
        let m = &ctx.ctx.metrics;
        if m.quic_handshaking.load(Relaxed) >= listener.quic_retry_threshold
            && !incoming.remote_address_validated()
            && incoming.may_retry()
        {
            // stateless: the client must echo the token from its address before a
            // handshake is spent on it
            match incoming.retry() {
                Ok(()) => {
                    m.quic_retries.fetch_add(1, Relaxed);
                }
                Err(e) => e.into_incoming().ignore(),
            }
            continue;
        }
        let count = ConnCount::new(&ctx);
        let id = count.1;
        let task = tokio::task::spawn_local(async move {
            let worker = count.0.ctx.clone();
            crate::conn::h3::serve(incoming, &*worker, |state| listener.service(&worker, state))
                .await;
            drop(count);
        });
        ctx.tasks.borrow_mut().insert(id, task.abort_handle());
    }
}

async fn accept_loop(
    socket: TcpListener,
    current: Rc<RefCell<Current>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let errors = qweb_observe::log_limit::Every::new(Duration::from_secs(1));
    let mut reserve = crate::runtime::process::fd_limit::FdReserve::new();
    loop {
        let ctx = current.borrow().gen.clone();
        // At the limit, stop accepting: new connections wait in the backlog.
        if ctx.connections.get() >= ctx.ctx.limits.max_connections_per_worker {
            tokio::select! {
                _ = ctx.connection_closed.notified() => {}
                // a reload may have brought a new generation (and limit)
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                _ = shutdown.wait_for(|s| *s) => return,
            }
            continue;
        }
        drop(ctx);
        let accepted = tokio::select! {
            r = socket.accept() => r,
            _ = shutdown.wait_for(|s| *s) => return,
        };
        // the generation current when the connection was accepted serves it to its end
        let (listener, ctx) = {
            let c = current.borrow();
            (c.listener.clone(), c.gen.clone())
        };
        match accepted {
            Ok((stream, peer)) => {
                let peer = crate::conn::canonical_peer(peer);
                let _ = stream.set_nodelay(true);
                let count = ConnCount::new(&ctx);
                let id = count.1;
                let tasks = ctx.clone();
                let task = tokio::task::spawn_local(async move {
                    let worker = ctx.ctx.clone();
                    let tls = listener.tls.as_ref();
                    let proxy = listener.proxy_protocol.as_ref();
                    crate::conn::serve(stream, peer, tls, proxy, &*worker, |state| {
                        listener.service(&worker, state)
                    })
                    .await;
                    drop(count);
                });
                tasks.tasks.borrow_mut().insert(id, task.abort_handle());
            }
            Err(e) => {
                // Out of fds: the pending connection is taken with the reserve's fd and
                // answered at once (503 on a plain listener; closed on a TLS one, which could
                // not answer before a handshake), not left in the backlog.
                let shed = crate::runtime::process::fd_limit::out_of_fds(&e) && {
                    let answer = match listener.tls {
                        Some(_) => &[][..],
                        None => crate::runtime::process::fd_limit::OUT_OF_FDS_503,
                    };
                    reserve.shed(std::os::fd::AsFd::as_fd(&socket), answer)
                };
                // Say so once a second at most; back off instead of spinning when nothing
                // could be taken.
                if let Some(suppressed) = errors.hit() {
                    if shed {
                        tracing::error!(listener = %listener.local_addr, suppressed, "accept failed: {e}; answering new connections with 503 until fds are free");
                    } else {
                        tracing::error!(listener = %listener.local_addr, suppressed, "accept failed: {e}");
                    }
                }
                if !shed {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}
