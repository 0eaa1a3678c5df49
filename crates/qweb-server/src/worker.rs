//! A worker: one OS thread running one single-threaded event loop (tokio current-thread
//! runtime + `LocalSet`), accepting on its own `SO_REUSEPORT` sockets. Everything a request
//! touches (routes, upstream pools, connection counters) is owned by the worker: no locks and
//! no cross-thread hops on the request path.

use std::cell::Cell;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use qweb_offload::{BatchConfig, Engine, Offloader};
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};

use crate::config::{Config, Limits, RouteAction};
use crate::files::StaticFiles;
use crate::metrics::WorkerMetrics;
use crate::proxy::Proxy;

/// What serves a route on this worker.
pub(crate) enum Handler {
    Static(StaticFiles),
    Proxy(Rc<Proxy>),
}

/// A route on this worker.
pub(crate) struct Route {
    pub prefix: String,
    pub strip_prefix: bool,
    pub handler: Handler,
}

/// Worker-wide state, shared by its connections through `Rc`.
pub(crate) struct WorkerCtx {
    pub limits: Limits,
    pub routes: Vec<Route>,
    pub access_log: bool,
    /// Becomes `true` when the server shuts down.
    pub shutdown: watch::Receiver<bool>,
    /// This worker's counters (also read by `/metrics`).
    pub metrics: Arc<WorkerMetrics>,
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
}

/// A listener handed to a worker: its socket, TLS configuration, and (async offload) engine
/// and per-op timeout.
pub(crate) struct WorkerListener {
    pub socket: StdListener,
    pub tls: Option<Arc<rustls::ServerConfig>>,
    pub async_engine: Option<(Arc<dyn Engine>, Duration)>,
    /// Full/resumed handshake counters of the listener (TLS listeners).
    pub sessions: Option<Arc<qweb_tls::HandshakeStats>>,
}

/// What a worker gets besides its listeners.
pub(crate) struct WorkerExtras {
    pub metrics: Arc<WorkerMetrics>,
    pub compression: Option<Arc<crate::compress::Shared>>,
}

/// Runs a worker until shutdown; returns when its connections are done or `deadline` passed.
pub(crate) fn run(
    id: usize,
    config: Arc<Config>,
    listeners: Vec<WorkerListener>,
    extras: WorkerExtras,
    shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    qweb_offload::job::set_max_live(config.offload.max_jobs_per_worker);
    let batch = BatchConfig {
        enabled: config.offload.batch,
        max: config.offload.batch_max,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    let mut routes = Vec::new();
    for r in &config.routes {
        let handler = match &r.action {
            RouteAction::Static(s) => Handler::Static(StaticFiles::new(s)?),
            RouteAction::Proxy(p) => Handler::Proxy(Proxy::new(p)),
        };
        routes.push(Route {
            prefix: r.prefix.clone(),
            strip_prefix: r.strip_prefix,
            handler,
        });
    }
    let ctx = Rc::new(WorkerCtx {
        limits: config.limits.clone(),
        routes,
        access_log: config.log.access,
        shutdown: shutdown.clone(),
        metrics: extras.metrics,
        compression: extras
            .compression
            .as_ref()
            .map(crate::compress::Compressor::new),
        peer_log: crate::log_limit::PerPeer::new(Duration::from_secs(60)),
        connections: Cell::new(0),
        connection_closed: Notify::new(),
    });
    let deadline = config.shutdown_timeout;
    local.block_on(&rt, async move {
        let mut accepting = Vec::new();
        for l in listeners {
            let local_addr = l.socket.local_addr()?;
            let socket = TcpListener::from_std(l.socket)?;
            let sessions = l.sessions;
            let tls = l.tls.map(|config| TlsListener {
                config,
                sessions,
                offloader: l
                    .async_engine
                    .map(|(engine, timeout)| Offloader::new(engine, batch, timeout)),
            });
            let lctx = Rc::new(ListenerCtx { tls, local_addr });
            accepting.push(tokio::task::spawn_local(accept_loop(
                socket,
                lctx,
                ctx.clone(),
            )));
        }
        tracing::debug!(worker = id, "worker started");
        let mut sd = shutdown.clone();
        let _ = sd.wait_for(|s| *s).await;
        for a in accepting {
            let _ = a.await;
        }
        drain(&ctx, deadline).await;
        tracing::debug!(worker = id, "worker stopped");
        Ok::<(), std::io::Error>(())
    })
}

/// Waits until every connection has finished, or the deadline passed.
async fn drain(ctx: &Rc<WorkerCtx>, deadline: Duration) {
    let wait = async {
        while ctx.connections.get() > 0 {
            ctx.connection_closed.notified().await;
        }
    };
    if tokio::time::timeout(deadline, wait).await.is_err() {
        tracing::warn!(
            connections = ctx.connections.get(),
            "shutdown deadline passed; closing the remaining connections"
        );
    }
}

struct ConnCount(Rc<WorkerCtx>);

impl Drop for ConnCount {
    fn drop(&mut self) {
        self.0.connections.set(self.0.connections.get() - 1);
        self.0
            .metrics
            .connections
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        self.0.connection_closed.notify_waiters();
    }
}

async fn accept_loop(socket: TcpListener, listener: Rc<ListenerCtx>, ctx: Rc<WorkerCtx>) {
    let mut shutdown = ctx.shutdown.clone();
    let max = ctx.limits.max_connections_per_worker;
    let errors = crate::log_limit::Every::new(Duration::from_secs(1));
    loop {
        // At the limit, stop accepting: new connections wait in the backlog.
        while ctx.connections.get() >= max {
            tokio::select! {
                _ = ctx.connection_closed.notified() => {}
                _ = shutdown.wait_for(|s| *s) => return,
            }
        }
        let accepted = tokio::select! {
            r = socket.accept() => r,
            _ = shutdown.wait_for(|s| *s) => return,
        };
        match accepted {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                ctx.connections.set(ctx.connections.get() + 1);
                ctx.metrics
                    .connections
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let count = ConnCount(ctx.clone());
                let (l, c) = (listener.clone(), ctx.clone());
                tokio::task::spawn_local(async move {
                    crate::conn::serve(stream, peer, l, c).await;
                    drop(count);
                });
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
