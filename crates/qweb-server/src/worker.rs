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
use std::collections::{HashMap, HashSet};
use std::net::{SocketAddr, TcpListener as StdListener};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use qweb_offload::{BatchConfig, Engine, Offloader};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinHandle;

use crate::config::{Config, Limits, RouteAction};
use crate::files::StaticFiles;
use crate::metrics::{Metrics, RouteMetrics, WorkerMetrics, NO_ROUTE};
use crate::proxy::Proxy;

/// What serves a route on this worker.
pub(crate) enum Handler {
    Static(StaticFiles),
    Proxy(Rc<Proxy>),
    Redirect(crate::config::RedirectConfig),
}

/// A route on this worker.
pub(crate) struct Route {
    pub prefix: String,
    pub strip_prefix: bool,
    pub handler: Handler,
    /// Requests by status class and latency of this route (`/metrics`).
    pub metrics: Rc<RouteMetrics>,
    /// Header edits and `expires`.
    pub rules: crate::config::RouteRules,
}

/// Builds a route of this worker; its `/metrics` label is `label_prefix` (a site's first
/// server name; empty for top-level routes) followed by the route's prefix.
pub(crate) fn build_route(
    r: &crate::config::RouteConfig,
    registry: &crate::metrics::Metrics,
    label_prefix: &str,
) -> std::io::Result<Route> {
    let handler = match &r.action {
        RouteAction::Static(s) => Handler::Static(StaticFiles::new(s)?),
        RouteAction::Proxy(p) => Handler::Proxy(Proxy::new(p)),
        RouteAction::Redirect(d) => Handler::Redirect(d.clone()),
    };
    Ok(Route {
        prefix: r.prefix.clone(),
        strip_prefix: r.strip_prefix,
        handler,
        metrics: Rc::new(registry.route(&format!("{label_prefix}{}", r.prefix))),
        rules: r.rules.clone(),
    })
}

/// Worker-wide state of one configuration generation, shared by its connections through
/// `Rc`.
pub(crate) struct WorkerCtx {
    pub limits: Limits,
    pub routes: Vec<Route>,
    /// The `[[site]]`s (`routes` are the top-level ones).
    pub sites: crate::sites::Sites,
    pub access_log: bool,
    /// The access-log line format.
    pub log_format: crate::config::AccessFormat,
    /// Becomes `true` when the server shuts down.
    pub shutdown: watch::Receiver<bool>,
    /// Becomes `true` when a reload replaced this generation: its connections close after
    /// their current request.
    pub retire: watch::Sender<bool>,
    /// The connections of this generation, aborted when it was retired and its deadline
    /// passed (kept here rather than a kill switch in every connection's task, which was
    /// polled at every wake-up of every connection and made each task bigger).
    tasks: RefCell<HashMap<u64, tokio::task::AbortHandle>>,
    /// The key of the next connection in `tasks`.
    next_task: Cell<u64>,
    /// The tasks of `tasks` that run a tunnel (an accepted upgrade): a retired generation
    /// keeps them past its `shutdown_timeout`, up to `upgrade_drain`.
    tunnel_tasks: RefCell<HashSet<tokio::task::Id>>,
    /// `upgrade_drain_timeout` of this generation's configuration.
    upgrade_drain: Duration,
    /// Becomes `true` when this generation's tunnels must end (retired and its
    /// `upgrade_drain` passed, or shutdown while retired): each WebSocket is sent a close
    /// frame 1001 (going away), then the tunnel closes.
    going_away: watch::Sender<bool>,
    /// This worker's counters (also read by `/metrics`).
    pub metrics: Arc<WorkerMetrics>,
    /// The metrics of requests no route matched.
    pub unmatched: Rc<RouteMetrics>,
    /// Response compression on this worker (`None`: off).
    pub compression: Option<Rc<crate::compress::Compressor>>,
    /// Log lines about misbehaving peers: one per peer per minute.
    pub peer_log: crate::log_limit::PerPeer,
    connections: Cell<usize>,
    connection_closed: Notify,
}

/// A TLS listener's handshake setup on this worker.
pub(crate) struct TlsListener {
    pub config: Arc<rustls::ServerConfig>,
    /// Async offload: this worker's handle on the engine (handshakes run as jobs).
    pub offloader: Option<Rc<Offloader>>,
    /// Full/resumed handshake counters of the listener.
    pub sessions: Option<Arc<qweb_tls::HandshakeStats>>,
}

/// One listener as this worker sees it.
pub(crate) struct ListenerCtx {
    pub tls: Option<TlsListener>,
    pub local_addr: SocketAddr,
    /// Every request on this listener is redirected.
    pub redirect: Option<Rc<crate::config::RedirectConfig>>,
}

/// One listener of a generation, as handed to a worker.
pub(crate) struct GenListener {
    /// The address it is bound to (its identity across reloads).
    pub bound: SocketAddr,
    /// This worker's socket when the listener is new; `None`: keep the one it has.
    pub socket: Option<StdListener>,
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Async offload: the engine and the per-op timeout.
    pub async_engine: Option<(Arc<dyn Engine>, Duration)>,
    /// Every request on this listener is redirected.
    pub redirect: Option<crate::config::RedirectConfig>,
    /// Full/resumed handshake counters of the listener (TLS listeners).
    pub sessions: Option<Arc<qweb_tls::HandshakeStats>>,
}

/// A configuration generation for one worker.
pub(crate) struct Generation {
    pub config: Arc<Config>,
    pub listeners: Vec<GenListener>,
    pub compression: Option<Arc<crate::compress::Shared>>,
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
}

/// What an accept loop serves new connections with; replaced by a reload.
struct Current {
    listener: Rc<ListenerCtx>,
    ctx: Rc<WorkerCtx>,
}

/// A running accept loop.
struct Accepting {
    current: Rc<RefCell<Current>>,
    task: JoinHandle<()>,
}

/// The worker's state across generations.
struct Worker {
    id: usize,
    extras: WorkerExtras,
    shutdown: watch::Receiver<bool>,
    ctx: Option<(Rc<WorkerCtx>, Duration)>,
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
        crate::files::cache::configure(&config.file_cache);
        let batch = BatchConfig {
            enabled: config.offload.batch,
            max: config.offload.batch_max,
        };
        let routes = config
            .routes
            .iter()
            .map(|r| build_route(r, &self.extras.registry, ""))
            .collect::<std::io::Result<Vec<_>>>()?;
        let sites = crate::sites::Sites::new(&config.sites, &self.extras.registry)?;
        let ctx = Rc::new(WorkerCtx {
            limits: config.limits.clone(),
            routes,
            sites,
            access_log: config.log.access,
            log_format: config.log.format,
            shutdown: self.shutdown.clone(),
            retire: watch::Sender::new(false),
            tasks: RefCell::new(HashMap::new()),
            next_task: Cell::new(0),
            tunnel_tasks: RefCell::new(HashSet::new()),
            upgrade_drain: config.upgrade_drain_timeout,
            going_away: watch::Sender::new(false),
            metrics: self.extras.metrics.clone(),
            unmatched: Rc::new(self.extras.registry.route(NO_ROUTE)),
            compression: g.compression.as_ref().map(crate::compress::Compressor::new),
            peer_log: crate::log_limit::PerPeer::new(Duration::from_secs(60)),
            connections: Cell::new(0),
            connection_closed: Notify::new(),
        });
        let mut next = HashMap::new();
        for l in g.listeners {
            let sessions = l.sessions;
            let tls = l.tls.map(|config| TlsListener {
                config,
                sessions,
                offloader: l
                    .async_engine
                    .map(|(engine, timeout)| Offloader::new(engine, batch, timeout)),
            });
            let lctx = Rc::new(ListenerCtx {
                tls,
                local_addr: l.bound,
                redirect: l.redirect.map(Rc::new),
            });
            let current = Current {
                listener: lctx,
                ctx: ctx.clone(),
            };
            let accepting = match (self.accepting.remove(&l.bound), l.socket) {
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
                    Accepting { current, task }
                }
                (None, None) => {
                    tracing::error!(worker = self.id, listener = %l.bound, "reload: no socket for this listener on this worker");
                    continue;
                }
            };
            next.insert(l.bound, accepting);
        }
        for r in ctx.routes.iter().chain(ctx.sites.all_routes()) {
            if let Handler::Proxy(p) = &r.handler {
                p.start_health_checks();
            }
        }
        // listeners the generation does not have: their sockets close now
        for (addr, a) in self.accepting.drain() {
            tracing::debug!(worker = self.id, listener = %addr, "listener closed by reload");
            a.task.abort();
        }
        self.accepting = next;
        let previous = self.ctx.replace((ctx, config.shutdown_timeout));
        if let Some((old, deadline)) = previous {
            self.retiring.retain(|t| !t.is_finished());
            self.retiring
                .push(tokio::task::spawn_local(retire(old, deadline)));
        }
        Ok(())
    }

    /// Binary upgrade: stops accepting (the sockets live on in the new process) and retires
    /// the current generation like a reload would; returns when every connection is done.
    async fn hand_over(&mut self) {
        for (_, a) in self.accepting.drain() {
            a.task.abort();
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
        for (_, a) in self.accepting.drain() {
            a.task.abort();
            let _ = a.task.await;
        }
        if let Some((ctx, deadline)) = self.ctx.take() {
            drain(&ctx, deadline).await;
        }
        for t in self.retiring.drain(..) {
            let _ = t.await;
        }
    }
}

/// How long tunnels told to go away get to send their close frames and close.
const GOING_AWAY_GRACE: Duration = Duration::from_secs(2);

/// A replaced generation: its connections close after their current request; what is left
/// at `deadline` is closed, except tunnels (WebSockets...), which go on until
/// `upgrade_drain_timeout` (counted from now) or a shutdown, then are told to go away (a
/// WebSocket close frame 1001 each way) and closed.
async fn retire(ctx: Rc<WorkerCtx>, deadline: Duration) {
    let started = tokio::time::Instant::now();
    ctx.retire.send_replace(true);
    if !wait_until(&ctx, deadline, |c| {
        c.connections.get() <= c.tunnel_tasks.borrow().len()
    })
    .await
    {
        tracing::warn!(
            connections = ctx
                .connections
                .get()
                .saturating_sub(ctx.tunnel_tasks.borrow().len()),
            "shutdown deadline passed; closing the remaining connections"
        );
    }
    // (taken out first: an aborted task's `ConnCount` removes itself from the map)
    let tasks: Vec<_> = {
        let tunnels = ctx.tunnel_tasks.borrow();
        let mut all = ctx.tasks.borrow_mut();
        let ids: Vec<u64> = all
            .iter()
            .filter(|(_, t)| !tunnels.contains(&t.id()))
            .map(|(k, _)| *k)
            .collect();
        ids.into_iter().filter_map(|k| all.remove(&k)).collect()
    };
    for t in tasks {
        t.abort();
    }
    if ctx.connections.get() > 0 {
        let left = ctx.upgrade_drain.saturating_sub(started.elapsed());
        let mut shutdown = ctx.shutdown.clone();
        tokio::select! {
            _ = wait_until(&ctx, left, |c| c.connections.get() == 0) => {}
            _ = shutdown.wait_for(|s| *s) => {}
        }
    }
    if ctx.connections.get() > 0 {
        tracing::info!(
            tunnels = ctx.connections.get(),
            "tunnels of a replaced configuration: going away"
        );
        ctx.going_away.send_replace(true);
        wait_until(&ctx, GOING_AWAY_GRACE, |c| c.connections.get() == 0).await;
    }
    let tasks = std::mem::take(&mut *ctx.tasks.borrow_mut());
    for t in tasks.into_values() {
        t.abort();
    }
}

/// Waits until every connection has finished, or the deadline passed.
async fn drain(ctx: &Rc<WorkerCtx>, deadline: Duration) {
    if !wait_until(ctx, deadline, |c| c.connections.get() == 0).await {
        tracing::warn!(
            connections = ctx.connections.get(),
            "shutdown deadline passed; closing the remaining connections"
        );
    }
}

/// Waits until `done` holds (checked whenever a connection closes or a tunnel starts), or
/// `deadline` passed; says whether it holds.
async fn wait_until(
    ctx: &Rc<WorkerCtx>,
    deadline: Duration,
    done: impl Fn(&WorkerCtx) -> bool,
) -> bool {
    let wait = async {
        while !done(ctx) {
            ctx.connection_closed.notified().await;
        }
    };
    tokio::time::timeout(deadline, wait).await.is_ok()
}

/// A tunnel running on the current task (a connection's), registered with its generation
/// until dropped.
pub(crate) struct TunnelGuard(Rc<WorkerCtx>, Option<tokio::task::Id>);

impl WorkerCtx {
    /// The connection on the current task now runs a tunnel: a retirement keeps it past
    /// `shutdown_timeout`. Returns the guard to hold while it runs and what tells it to go
    /// away.
    pub(crate) fn tunnel_started(self: &Rc<Self>) -> (TunnelGuard, crate::proxy::Ending) {
        let id = tokio::task::try_id();
        if let Some(id) = id {
            self.tunnel_tasks.borrow_mut().insert(id);
            // a retirement waiting for the requests to finish counts this one as done
            self.connection_closed.notify_waiters();
        }
        let ending = crate::proxy::Ending::new(self.shutdown.clone(), self.going_away.subscribe());
        (TunnelGuard(self.clone(), id), ending)
    }
}

impl Drop for TunnelGuard {
    fn drop(&mut self) {
        if let Some(id) = self.1 {
            self.0.tunnel_tasks.borrow_mut().remove(&id);
        }
    }
}

struct ConnCount(Rc<WorkerCtx>, u64);

impl Drop for ConnCount {
    fn drop(&mut self) {
        self.0.tasks.borrow_mut().remove(&self.1);
        self.0.connections.set(self.0.connections.get() - 1);
        self.0
            .metrics
            .connections
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        self.0.connection_closed.notify_waiters();
    }
}

async fn accept_loop(
    socket: TcpListener,
    current: Rc<RefCell<Current>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let errors = crate::log_limit::Every::new(Duration::from_secs(1));
    loop {
        let ctx = current.borrow().ctx.clone();
        // At the limit, stop accepting: new connections wait in the backlog.
        if ctx.connections.get() >= ctx.limits.max_connections_per_worker {
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
            (c.listener.clone(), c.ctx.clone())
        };
        match accepted {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                ctx.connections.set(ctx.connections.get() + 1);
                ctx.metrics
                    .connections
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let id = ctx.next_task.get();
                ctx.next_task.set(id + 1);
                let count = ConnCount(ctx.clone(), id);
                let tasks = ctx.clone();
                let task = tokio::task::spawn_local(async move {
                    crate::conn::serve(stream, peer, listener, ctx).await;
                    drop(count);
                });
                tasks.tasks.borrow_mut().insert(id, task.abort_handle());
            }
            Err(e) => {
                // EMFILE/ENFILE and the like: back off instead of spinning, and say so once
                // a second at most.
                if let Some(suppressed) = errors.hit() {
                    tracing::error!(listener = %listener.local_addr, suppressed, "accept failed: {e}");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}
