//! One client connection: TLS handshake (with a deadline), then HTTP/1.1 or HTTP/2 by ALPN,
//! with the idle keep-alive and request-head timeouts, and graceful shutdown.

use std::cell::Cell;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{sleep_until, Instant};

use crate::head_scan::HeadScan;
use crate::service::Service;
use crate::worker::{ListenerCtx, WorkerCtx};

/// What the watchdog of a connection needs to know, shared by the I/O wrapper, the service and
/// the response bodies (all on the worker's thread).
pub(crate) struct ConnState {
    /// The client's address.
    pub peer: SocketAddr,
    /// "HTTP/1.1" or "HTTP/2" (set once the protocol is known).
    pub protocol: Cell<&'static str>,
    in_flight: Cell<u32>,
    last_activity: Cell<Instant>,
    head_started: Cell<Option<Instant>>,
    /// What the current HTTP/1 request head's bytes showed (see [`HeadScan`]).
    head_scan: Cell<HeadScan>,
    /// Woken when the deadline may have moved earlier (a request started or finished, a
    /// request head started arriving).
    changed: tokio::sync::Notify,
}

impl ConnState {
    fn new(peer: SocketAddr) -> Self {
        ConnState {
            peer,
            protocol: Cell::new("HTTP/1.1"),
            in_flight: Cell::new(0),
            last_activity: Cell::new(Instant::now()),
            head_started: Cell::new(None),
            head_scan: Cell::new(HeadScan::default()),
            changed: tokio::sync::Notify::new(),
        }
    }

    /// A request head was parsed and handed to the service; the request is in flight until
    /// the guard is dropped (response body finished, or the request abandoned).
    pub(crate) fn request_started_guard(self: &Rc<Self>) -> RequestGuard {
        self.head_started.set(None);
        self.in_flight.set(self.in_flight.get() + 1);
        self.changed.notify_one();
        RequestGuard(self.clone())
    }

    fn request_done(&self) {
        self.in_flight.set(self.in_flight.get().saturating_sub(1));
        self.last_activity.set(Instant::now());
        self.changed.notify_one();
    }

    fn on_read(&self, bytes: &[u8]) {
        let now = Instant::now();
        self.last_activity.set(now);
        let mut scan = self.head_scan.get();
        if self.in_flight.get() == 0 && self.head_started.get().is_none() {
            self.head_started.set(Some(now));
            self.changed.notify_one();
            scan.start();
        }
        scan.feed(bytes);
        self.head_scan.set(scan);
    }

    /// The current HTTP/1 request's head had a `Content-Length` field (hyper hides it when
    /// `Transfer-Encoding` is present too).
    pub(crate) fn head_had_content_length(&self) -> bool {
        self.head_scan.get().saw_content_length()
    }

    /// When the connection should be closed if nothing changes, and why.
    fn deadline(
        &self,
        header_timeout: Duration,
        idle_timeout: Duration,
    ) -> Option<(Instant, &'static str)> {
        if self.in_flight.get() > 0 {
            return None;
        }
        match self.head_started.get() {
            Some(t) => Some((t + header_timeout, "request head timeout")),
            None => Some((
                self.last_activity.get() + idle_timeout,
                "idle keep-alive timeout",
            )),
        }
    }
}

/// One request in flight on a connection.
pub(crate) struct RequestGuard(Rc<ConnState>);

impl RequestGuard {
    /// The connection's state.
    pub(crate) fn conn(&self) -> &ConnState {
        &self.0
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.request_done();
    }
}

/// Marks reads on the connection state, and replays `prefix` (bytes already read, already
/// marked) before reading on; transparent otherwise.
struct Tracked<T> {
    inner: T,
    state: Rc<ConnState>,
    prefix: bytes::Bytes,
}

impl<T> Tracked<T> {
    fn new(inner: T, state: &Rc<ConnState>) -> Self {
        Tracked {
            inner,
            state: state.clone(),
            prefix: bytes::Bytes::new(),
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Tracked<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            let chunk = self.prefix.split_to(n);
            buf.put_slice(&chunk);
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.state.on_read(&buf.filled()[before..]);
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Tracked<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Spawns HTTP/2 stream tasks on the worker's `LocalSet`.
#[derive(Clone, Copy)]
pub(crate) struct LocalExec;

impl<F> hyper::rt::Executor<F> for LocalExec
where
    F: Future + 'static,
{
    fn execute(&self, fut: F) {
        tokio::task::spawn_local(fut);
    }
}

/// Serves one accepted connection to completion.
pub(crate) async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    listener: Rc<ListenerCtx>,
    worker: Rc<WorkerCtx>,
) {
    let state = Rc::new(ConnState::new(peer));
    let limits = &worker.limits;
    match &listener.tls {
        None => {
            let io = Tracked::new(stream, &state);
            drive(io, false, false, state, &listener, &worker).await;
        }
        Some(tls) => {
            let mut shutdown = worker.shutdown.clone();
            let driver = match &tls.offloader {
                Some(offloader) => qweb_tls::handshake::Driver::Job {
                    offloader,
                    gauges: &worker.metrics.handshake,
                },
                None => qweb_tls::handshake::Driver::Direct,
            };
            let accept = qweb_tls::handshake::accept(stream, tls.config.clone(), driver);
            let hs = tokio::select! {
                r = tokio::time::timeout(limits.tls_handshake_timeout, accept) => r,
                _ = shutdown.wait_for(|s| *s) => return,
            };
            let m = &worker.metrics;
            let tls = match hs {
                Ok(Ok(tls)) => {
                    m.handshakes_ok.fetch_add(1, Relaxed);
                    tls
                }
                Ok(Err(e)) => {
                    m.handshakes_failed.fetch_add(1, Relaxed);
                    tracing::debug!(%peer, "TLS handshake failed: {e}");
                    return;
                }
                Err(_) => {
                    m.handshakes_failed.fetch_add(1, Relaxed);
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let h2 = tls.connection().alpn_protocol() == Some(qweb_tls::ALPN_H2);
            let io = Tracked::new(tls, &state);
            drive(io, true, h2, state, &listener, &worker).await;
        }
    }
}

async fn drive<T>(
    mut io: Tracked<T>,
    tls: bool,
    h2: bool,
    state: Rc<ConnState>,
    listener: &Rc<ListenerCtx>,
    worker: &Rc<WorkerCtx>,
) where
    T: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let limits = &worker.limits;
    let svc = Rc::new(Service::new(
        worker.clone(),
        state.clone(),
        tls,
        listener.local_addr,
    ));
    let service = service_fn(move |req| {
        let svc = svc.clone();
        async move { Ok::<_, Infallible>(svc.handle(req).await) }
    });
    let mut shutdown = worker.shutdown.clone();
    if h2 {
        let io = TokioIo::new(io);
        state.protocol.set("HTTP/2");
        let conn = hyper::server::conn::http2::Builder::new(LocalExec)
            .timer(TokioTimer::new())
            .max_concurrent_streams(limits.max_concurrent_streams)
            .max_header_list_size(limits.max_request_header_size as u32)
            .serve_connection(io, service);
        let mut conn = pin!(conn);
        let mut closing = false;
        // An idle connection gets a GOAWAY, then this long to close before it is dropped
        // (a client that never answers must not hold it forever).
        let mut drop_at: Option<Instant> = None;
        // HTTP/2 frames that are not requests (PING, WINDOW_UPDATE) may arrive while idle:
        // only the keep-alive timeout applies (h2 bounds header blocks itself).
        let h2_idle = limits.keepalive_timeout;
        loop {
            let deadline = if closing {
                None
            } else {
                state.deadline(h2_idle, h2_idle)
            };
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r { tracing::debug!(peer = %state.peer, "HTTP/2 connection error: {e}"); }
                    return;
                }
                _ = state.changed.notified() => {}
                _ = sleep_or_never(deadline.map(|d| d.0)) => {
                    if state.deadline(h2_idle, h2_idle).is_some_and(|(d, _)| d <= Instant::now()) {
                        conn.as_mut().graceful_shutdown();
                        closing = true;
                        drop_at = Some(Instant::now() + Duration::from_secs(1));
                    }
                }
                _ = sleep_or_never(drop_at) => {
                    if state.in_flight.get() == 0 {
                        return;
                    }
                    drop_at = None;
                }
                _ = shutdown.wait_for(|s| *s), if !closing => {
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
        }
    } else {
        // hyper's HTTP/1 connection allocates its read and write buffers (16 KiB) when it is
        // built: build it only once the first request bytes arrive, so that idle connections
        // cost little (as nginx allocates its header buffer on the first read).
        let mut first = vec![0u8; 2048];
        let n = loop {
            let deadline = state.deadline(limits.header_read_timeout, limits.keepalive_timeout);
            tokio::select! {
                r = io.read(&mut first) => match r {
                    Ok(0) | Err(_) => return,
                    Ok(n) => break n,
                },
                _ = sleep_or_never(deadline.map(|d| d.0)) => {
                    if state.deadline(limits.header_read_timeout, limits.keepalive_timeout).is_some_and(|(d, _)| d <= Instant::now()) {
                        tracing::debug!(peer = %state.peer, "closing: idle before the first request");
                        return;
                    }
                }
                _ = shutdown.wait_for(|s| *s) => return,
            }
        };
        first.truncate(n);
        io.prefix = bytes::Bytes::from(first);
        let io = TokioIo::new(io);
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(None)
            // The service answers heads over the limit (414 for the target, 431 for the
            // fields) with a body; hyper's parser only refuses heads over twice the limit.
            .max_buf_size((limits.max_request_header_size * 2).max(8192))
            // the header count follows the size limit: a 101st small header is no attack
            .max_headers((limits.max_request_header_size / 32).max(100))
            .keep_alive(true)
            .serve_connection(io, service);
        let mut conn = pin!(conn);
        let mut closing = false;
        loop {
            let deadline = state.deadline(limits.header_read_timeout, limits.keepalive_timeout);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r { tracing::debug!(peer = %state.peer, "HTTP/1 connection error: {e}"); }
                    return;
                }
                _ = state.changed.notified() => {}
                _ = sleep_or_never(deadline.map(|d| d.0)) => {
                    if let Some((d, why)) = state.deadline(limits.header_read_timeout, limits.keepalive_timeout) {
                        if d <= Instant::now() {
                            tracing::debug!(peer = %state.peer, "closing: {why}");
                            return;
                        }
                    }
                }
                _ = shutdown.wait_for(|s| *s), if !closing => {
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                    if state.in_flight.get() == 0 {
                        return;
                    }
                }
            }
        }
    }
}

async fn sleep_or_never(deadline: Option<Instant>) {
    match deadline {
        Some(d) => sleep_until(d).await,
        None => std::future::pending().await,
    }
}
