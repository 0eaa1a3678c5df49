//! One client connection: TLS handshake (with a deadline), then HTTP/1.1 or HTTP/2 by ALPN,
//! with the idle keep-alive, request-head and send timeouts, the HTTP/2 flood budget, and
//! graceful shutdown. The state the watchdog reads lives in [`crate::conn_state`].

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

use crate::conn_state::{ConnState, Expiry, Phase, StreamCancel, Timeouts};
use crate::h2_flood::FloodMeter;
use crate::idle::{IdleWatch, ReadReady};
use crate::lazy_timer::LazyTimer;
use crate::service::Service;
use crate::worker::{ListenerCtx, WorkerCtx};
use crate::write_burst::WriteBurst;

/// Marks reads and write progress on the connection state, replays `prefix` (bytes already
/// read, already marked) before reading on, and on HTTP/2 meters the client's control frames
/// (see [`crate::h2_flood`]); transparent otherwise.
struct Tracked<T> {
    inner: T,
    state: Rc<ConnState>,
    /// (Boxed, and `None` when empty: this wrapper is most of what an idle connection keeps;
    /// see `crate::idle`.)
    prefix: Option<Box<bytes::Bytes>>,
    /// HTTP/2: the flood meter, and how much of its GOAWAY is still to be written (boxed: an
    /// idle HTTP/1 connection keeps this wrapper, see `crate::idle`).
    flood: Option<Box<(FloodMeter, usize)>>,
    /// Bytes written in a row; past `[limits] write_burst` the worker turns to the others.
    burst: WriteBurst,
    /// HTTP/1: told what hyper does with the transport (see [`crate::idle`]).
    idle: Option<Rc<IdleWatch>>,
}

impl<T> Tracked<T> {
    fn new(inner: T, state: &Rc<ConnState>, write_burst: usize) -> Self {
        Tracked {
            inner,
            state: state.clone(),
            prefix: None,
            flood: None,
            burst: WriteBurst::new(write_burst),
            idle: None,
        }
    }

    /// Notes a write's outcome: progress for the send timeout and the write burst.
    fn on_write<R>(&mut self, r: &Poll<io::Result<R>>, n: impl FnOnce(&R) -> usize) {
        match r {
            Poll::Ready(Ok(v)) => {
                self.state.on_write(false);
                let n = n(v);
                self.burst.wrote(n);
                if let Some(w) = &self.idle {
                    w.on_write(n);
                }
            }
            Poll::Pending => {
                self.state.on_write(true);
                self.burst.pushed_back();
            }
            Poll::Ready(Err(_)) => {}
        }
    }

    fn meter_writes(&mut self, bufs: &[io::IoSlice<'_>], mut n: usize) {
        if let Some((m, _)) = self.flood.as_deref_mut() {
            for b in bufs {
                let k = n.min(b.len());
                m.on_write(&b[..k]);
                n -= k;
                if n == 0 {
                    break;
                }
            }
        }
    }

    /// Past the flood budget: once the server's last frame is complete, writes GOAWAY
    /// ENHANCE_YOUR_CALM. `Ready(Ok)` when it is out (the connection then ends).
    fn poll_goaway(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>
    where
        T: AsyncWrite + Unpin,
    {
        let Some((m, sent)) = self.flood.as_deref_mut() else {
            return Poll::Ready(Ok(()));
        };
        if m.write_to_boundary() > 0 {
            return Poll::Pending; // hyper finishes its frame first (see poll_write)
        }
        let frame = m.goaway();
        while *sent < frame.len() {
            match Pin::new(&mut self.inner).poll_write(cx, &frame[*sent..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => *sent += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn flooded(&self) -> bool {
        self.state.flooded() && self.flood.is_some()
    }
}

fn flood_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "HTTP/2 control-frame flood",
    )
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for Tracked<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.flooded() {
            // Read no more from a flooding client: send GOAWAY, then end the connection.
            return match self.poll_goaway(cx) {
                Poll::Ready(_) => Poll::Ready(Err(flood_error())),
                Poll::Pending => Poll::Pending,
            };
        }
        if let Some(prefix) = self.prefix.as_deref_mut() {
            let n = prefix.len().min(buf.remaining());
            // the whole prefix is taken, not split: an empty rest would keep its buffer alive
            let chunk = if n == prefix.len() {
                let whole = std::mem::take(prefix);
                self.prefix = None;
                whole
            } else {
                prefix.split_to(n)
            };
            buf.put_slice(&chunk);
            if let Some(w) = &self.idle {
                w.on_read();
            }
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let this = &mut *self;
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Some(w) = &this.idle {
            match r {
                Poll::Pending => w.on_read_pending(&this.state),
                Poll::Ready(_) => w.on_read(),
            }
        }
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.state.on_read(&buf.filled()[before..]);
            if let Some((m, _)) = this.flood.as_deref_mut() {
                if m.on_read(&buf.filled()[before..]) {
                    // Over budget: hyper sees none of it; GOAWAY, then the end.
                    buf.set_filled(before);
                    this.state.on_flood();
                    return match this.poll_goaway(cx) {
                        Poll::Ready(_) => Poll::Ready(Err(flood_error())),
                        Poll::Pending => Poll::Pending,
                    };
                }
            }
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
        let mut buf = buf;
        if self.burst.poll_turn(cx).is_pending() {
            return Poll::Pending;
        }
        if self.state.flooded() {
            if let Some((m, _)) = self.flood.as_deref() {
                // Let hyper finish the frame it started, and nothing more.
                let left = m.write_to_boundary();
                if left == 0 {
                    return match self.poll_goaway(cx) {
                        Poll::Ready(_) => Poll::Ready(Err(flood_error())),
                        Poll::Pending => Poll::Pending,
                    };
                }
                buf = &buf[..left.min(buf.len())];
            }
        }
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.on_write(&r, |n| *n);
        if let Poll::Ready(Ok(n)) = r {
            self.meter_writes(&[io::IoSlice::new(buf)], n);
        }
        r
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.flood.is_some() {
            // Metered (and, after a flood, cut at frame boundaries) one buffer at a time.
            let first = bufs
                .iter()
                .find(|b| !b.is_empty())
                .map_or(&[][..], |b| &b[..]);
            return self.poll_write(cx, first);
        }
        if self.burst.poll_turn(cx).is_pending() {
            return Poll::Pending;
        }
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.on_write(&r, |n| *n);
        r
    }
    fn is_write_vectored(&self) -> bool {
        self.flood.is_none() && self.inner.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.on_write(&r, |_| 0);
        if let (Poll::Ready(Ok(())), Some(w)) = (&r, &self.idle) {
            w.on_flushed(&self.state);
        }
        r
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<T: ReadReady> ReadReady for Tracked<T> {
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.prefix.is_some() {
            return Poll::Ready(Ok(()));
        }
        self.inner.poll_read_ready(cx)
    }
}

/// Spawns HTTP/2 stream tasks on the worker's `LocalSet`, each cancellable by the
/// connection's watchdog (send timeout).
#[derive(Clone, Copy)]
pub(crate) struct LocalExec;

impl<F> hyper::rt::Executor<F> for LocalExec
where
    F: Future + 'static,
{
    fn execute(&self, fut: F) {
        let cancel = Rc::new(StreamCancel::default());
        tokio::task::spawn_local(StreamCancel::run(cancel, fut));
    }
}

/// Serves one accepted connection to completion.
///
/// Every step that holds much while it runs (the handshake, an HTTP/2 connection, an HTTP/1
/// exchange) is boxed and its values are moved, never borrowed, into what comes next: an
/// `async fn` keeps a borrowed local in its state until the end of its scope, and the
/// connection's task is as large as its largest state for as long as it lives (see
/// `crate::idle`).
pub(crate) async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    listener: Rc<ListenerCtx>,
    worker: Rc<WorkerCtx>,
) {
    let state = Rc::new(ConnState::new(peer));
    let write_burst = worker.limits.write_burst;
    if listener.tls.is_none() {
        let io = Tracked::new(stream, &state, write_burst);
        drive(Box::new(io), false, false, state, &listener, &worker).await;
        return;
    }
    let Some(tls) = Box::pin(handshake(stream, &state, &listener, &worker)).await else {
        return;
    };
    let (io, h2) = tls_io(tls, &state, write_burst);
    drive(Box::new(io), true, h2, state, &listener, &worker).await;
}

/// The TLS handshake (after a check for plain HTTP on the TLS port), under
/// `tls_handshake_timeout`. `None`: the connection is over.
async fn handshake(
    stream: TcpStream,
    state: &ConnState,
    listener: &ListenerCtx,
    worker: &WorkerCtx,
) -> Option<qweb_tls::TlsStream> {
    let peer = state.peer;
    let tls = listener.tls.as_ref()?;
    let limits = &worker.limits;
    // the first byte and the handshake share one deadline
    let deadline = tokio::time::Instant::now() + limits.tls_handshake_timeout;
    let plain = crate::plain_on_tls::starts_with_plain_http(&stream);
    match tokio::time::timeout_at(deadline, plain).await {
        Ok(false) => {}
        Ok(true) => {
            tracing::debug!(%peer, "plain HTTP on a TLS port: 400");
            crate::plain_on_tls::answer(stream).await;
            return None;
        }
        Err(_) => {
            worker.metrics.handshakes_failed.fetch_add(1, Relaxed);
            tracing::debug!(%peer, "TLS handshake timed out");
            return None;
        }
    }
    let driver = match &tls.offloader {
        Some(offloader) => qweb_tls::handshake::Driver::Job {
            offloader,
            gauges: &worker.metrics.handshake,
        },
        None => qweb_tls::handshake::Driver::Direct,
    };
    // A handshake in progress (perhaps paused on an offloaded signature) is not cut by
    // a shutdown: it may finish within its own timeout, bounded by the drain deadline.
    let accept = qweb_tls::handshake::accept(stream, tls.config.clone(), driver);
    let hs = tokio::time::timeout_at(deadline, accept).await;
    let m = &worker.metrics;
    match hs {
        Ok(Ok(stream)) => {
            m.handshakes_ok.fetch_add(1, Relaxed);
            if let Some(s) = &tls.sessions {
                s.record(stream.connection());
            }
            Some(stream)
        }
        Ok(Err(e)) => {
            m.handshakes_failed.fetch_add(1, Relaxed);
            tracing::debug!(%peer, "TLS handshake failed: {e}");
            None
        }
        Err(_) => {
            m.handshakes_failed.fetch_add(1, Relaxed);
            tracing::debug!(%peer, "TLS handshake timed out");
            None
        }
    }
}

/// Notes what the handshake chose (protocol version, SNI) and wraps the stream; `true`:
/// HTTP/2 by ALPN.
fn tls_io(
    mut tls: qweb_tls::TlsStream,
    state: &Rc<ConnState>,
    write_burst: usize,
) -> (Tracked<qweb_tls::TlsStream>, bool) {
    let h2 = tls.connection().alpn_protocol() == Some(qweb_tls::ALPN_H2);
    state
        .tls_version
        .set(match tls.connection().protocol_version() {
            Some(rustls::ProtocolVersion::TLSv1_3) => Some("TLSv1.3"),
            Some(rustls::ProtocolVersion::TLSv1_2) => Some("TLSv1.2"),
            _ => None,
        });
    if let Some(name) = tls.connection().server_name() {
        let _ = state.sni.set(name.into());
    }
    // HTTP/2: the frames of every stream ready in one turn go out in one write
    tls.set_flush_after_yield(h2);
    (Tracked::new(tls, state, write_burst), h2)
}

/// Serves HTTP on the connection's transport. `io` comes boxed: an `async fn` keeps its
/// arguments in its state beside the locals they are moved into, and the transport (with
/// rustls' connection) is its largest value.
async fn drive<T>(
    mut io: Box<Tracked<T>>,
    tls: bool,
    h2: bool,
    state: Rc<ConnState>,
    listener: &Rc<ListenerCtx>,
    worker: &Rc<WorkerCtx>,
) where
    T: AsyncRead + AsyncWrite + ReadReady + Unpin + 'static,
{
    let limits = &worker.limits;
    let svc = Rc::new(Service::new(
        worker.clone(),
        state.clone(),
        tls,
        listener.local_addr,
        listener.redirect.clone(),
    ));
    let watch = Rc::new(IdleWatch::default());
    let handed = watch.clone();
    let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        use hyper::body::Body as _;
        handed.handed(
            !req.body().is_end_stream()
                || req.method() == hyper::Method::CONNECT
                || req.headers().contains_key(hyper::header::UPGRADE),
        );
        let svc = svc.clone();
        // boxed: an HTTP/1 connection is polled without its shutdown (to be taken apart
        // after an upgrade), which needs an `Unpin` future
        Box::pin(async move { Ok::<_, Infallible>(svc.handle(req).await) })
    });
    let mut shutdown = worker.shutdown.clone();
    // A connection that completed its handshake after shutdown began (it was paused) still
    // gets its first request served.
    let late = *shutdown.borrow();
    if h2 {
        // Boxed: what an HTTP/2 connection holds while it lives does not size the task of
        // every connection (see `crate::idle`).
        Box::pin(async move {
            // A reload retired this connection's configuration: HTTP/2 gets a GOAWAY (HTTP/1.1
            // responses say `Connection: close`, see `Service::handle`).
            let mut retire = worker.retire.subscribe();
            let mut retire_pending = false;
            io.flood = Some(Box::new((
                FloodMeter::new(limits.h2_control_frames_per_second),
                0,
            )));
            let io = TokioIo::new(io);
            state.protocol.set("HTTP/2");
            let conn = hyper::server::conn::http2::Builder::new(LocalExec)
                .timer(TokioTimer::new())
                .max_concurrent_streams(limits.max_concurrent_streams)
                .max_header_list_size(limits.max_request_header_size as u32)
                // WebSocket over HTTP/2 (RFC 8441), for proxy routes
                .enable_connect_protocol()
                .serve_connection(io, service);
            let mut conn = pin!(conn);
            let mut closing = false;
            // An idle connection gets a GOAWAY, then this long to close before it is dropped
            // (a client that never answers must not hold it forever).
            let mut drop_at: Option<Instant> = None;
            // Closed whatever is in flight at this time (stalled, flooding).
            let mut cut_at: Option<Instant> = None;
            let mut timer = LazyTimer::new();
            // Kept across turns of the loop: a wait made anew each turn registers with its
            // watch or `Notify` each time (7 % of a worker's time on HTTP/1 keep-alive).
            let mut shut = pin!(shutdown.wait_for(|s| *s));
            let mut retired = pin!(retire.wait_for(|r| *r));
            let mut changed = pin!(state.changed.notified());
            // HTTP/2 frames that are not requests (PING, WINDOW_UPDATE) may arrive while idle:
            // only the keep-alive timeout applies (h2 bounds header blocks itself).
            let timeouts = Timeouts {
                head: limits.keepalive_timeout,
                idle: limits.keepalive_timeout,
                send: limits.send_timeout,
                per_response: true,
            };
            loop {
                if state.flooded() && cut_at.is_none() {
                    if let Some(n) = worker.peer_log.hit(state.peer.ip()) {
                        tracing::warn!(peer = %state.peer, suppressed = n, "HTTP/2 control-frame flood: GOAWAY ENHANCE_YOUR_CALM, closing");
                    }
                    state.reset_all_streams();
                    cut_at = Some(Instant::now() + Duration::from_secs(1));
                }
                // GOAWAY once the client's first request is in: hyper drops a connection still in
                // its HTTP/2 handshake instead, and that request would be lost
                if retire_pending && !closing && state.requests_started() > 0 {
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
                timer.arm(
                    state
                        .deadline(timeouts)
                        .filter(|(_, why)| !closing || !matches!(why, Expiry::Idle | Expiry::Head))
                        .map(|d| d.0),
                );
                tokio::select! {
                    r = conn.as_mut() => {
                        if state.flooded() && cut_at.is_none() {
                            // the flood ended the connection before the loop saw it
                            if let Some(n) = worker.peer_log.hit(state.peer.ip()) {
                                tracing::warn!(peer = %state.peer, suppressed = n, "HTTP/2 control-frame flood: GOAWAY ENHANCE_YOUR_CALM, closing");
                            }
                        }
                        if let Err(e) = r {
                            let text = format!("{e:?}");
                            if text.contains("ENHANCE_YOUR_CALM") && !state.flooded() {
                                if let Some(n) = worker.peer_log.hit(state.peer.ip()) {
                                    tracing::warn!(peer = %state.peer, suppressed = n, "HTTP/2 peer misbehaved (too many resets): GOAWAY ENHANCE_YOUR_CALM");
                                }
                            } else {
                                tracing::debug!(peer = %state.peer, "HTTP/2 connection error: {e}");
                            }
                        }
                        return;
                    }
                    _ = changed.as_mut() => changed.set(state.changed.notified()),
                    _ = timer.fired() => {
                        match state.deadline(timeouts) {
                            Some((d, why)) if d <= Instant::now() => match why {
                                Expiry::WriteStalled => {
                                    tracing::debug!(peer = %state.peer, "closing: {}", why.as_str());
                                    return;
                                }
                                Expiry::ResponseStalled => {
                                    if state.reset_stalled_streams(limits.send_timeout) {
                                        // Every stream waits on a client that takes nothing.
                                        tracing::debug!(peer = %state.peer, "closing: {}", why.as_str());
                                        conn.as_mut().graceful_shutdown();
                                        state.reset_all_streams();
                                        closing = true;
                                        cut_at = Some(Instant::now() + Duration::from_secs(1));
                                    }
                                }
                                Expiry::Idle | Expiry::Head if !closing => {
                                    conn.as_mut().graceful_shutdown();
                                    closing = true;
                                    drop_at = Some(Instant::now() + Duration::from_secs(1));
                                }
                                // (already closing: a timer armed before the GOAWAY)
                                Expiry::Idle | Expiry::Head => {}
                            },
                            _ => {}
                        }
                    }
                    _ = sleep_or_never(drop_at) => {
                        if state.in_flight() == 0 {
                            return;
                        }
                        drop_at = None;
                    }
                    _ = sleep_or_never(cut_at) => return,
                    // (each polled again only while its guard holds, never after it completed)
                    _ = shut.as_mut(), if !closing => {
                        conn.as_mut().graceful_shutdown();
                        closing = true;
                    }
                    _ = retired.as_mut(), if !closing && !retire_pending => {
                        retire_pending = true;
                    }
                }
            }
        })
        .await;
    } else {
        io.idle = Some(watch.clone());
        let mut service = service;
        // hyper's HTTP/1 connection allocates its read and write buffers (16 KiB) when it is
        // built: it is built only once request bytes arrive, and taken apart again whenever
        // it goes idle between requests (see `crate::idle`), so that idle connections cost
        // little (as nginx allocates its header buffer on the first read and frees it on idle
        // keep-alive).
        let mut first = true;
        loop {
            if io.prefix.is_none()
                && !park(&mut io, &state, limits, &mut shutdown, first && late).await
            {
                return;
            }
            first = false;
            watch.restart();
            // (built anew each time rather than kept: an idle connection holds nothing more)
            let conn = h1_builder(limits).serve_connection(TokioIo::new(io), service);
            // Boxed, with all the exchange's state, so that the task stays small while parked.
            // Not pinned: once the exchange is over it is taken apart (an upgraded connection
            // goes on as a tunnel; an idle one parks; any other is shut down here). `None`:
            // the connection is over.
            let exchange = Box::pin(async {
                let timeouts = h1_timeouts(limits);
                let mut conn = conn;
                let mut closing = false;
                // Shutdown began while a request head was arriving: close after that request.
                let mut close_after_request = false;
                // When this idle spell may end in parking, and the requests handed by then: a
                // keep-alive client's next request usually follows within a round trip, and
                // taking hyper apart for it would cost more than its buffers are worth.
                let mut park_at: Option<(Instant, u64)> = None;
                let mut timer = LazyTimer::new();
                // kept across turns of the loop (see the HTTP/2 loop)
                let mut shut = pin!(shutdown.wait_for(|s| *s));
                let mut changed = pin!(state.changed.notified());
                let parked = loop {
                    if close_after_request && state.phase() == Phase::Serving {
                        Pin::new(&mut conn).graceful_shutdown();
                        close_after_request = false;
                    }
                    if !closing && !close_after_request && watch.parkable(&state) {
                        match park_at {
                            Some((at, handed)) if handed == watch.handed_count() => {
                                if at <= Instant::now() {
                                    break true;
                                }
                            }
                            // a new idle spell; a connection that has not yet reused
                            // itself parks at once (most never send a second request)
                            _ if watch.handed_count() <= 1 => break true,
                            _ => {
                                park_at = Some((Instant::now() + PARK_AFTER, watch.handed_count()))
                            }
                        }
                    } else {
                        park_at = None;
                    }
                    timer.arm(state.deadline(timeouts).map(|d| d.0));
                    timer.arm(park_at.map(|p| p.0));
                    tokio::select! {
                        r = std::future::poll_fn(|cx| conn.poll_without_shutdown(cx)) => {
                            if let Err(e) = r {
                                tracing::debug!(peer = %state.peer, "HTTP/1 connection error: {e}");
                                if worker.access_log && (e.is_parse() || e.is_parse_too_large()) {
                                    // hyper's parser answered (400, or 431 for a head over its buffer)
                                    let status = if e.is_parse_too_large() { 431 } else { 400 };
                                    crate::access_log::refused(worker.log_format, state.peer, status);
                                }
                                return None;
                            }
                            break false;
                        }
                        _ = changed.as_mut() => changed.set(state.changed.notified()),
                        // (also wakes the loop when parking is due)
                        _ = timer.fired() => {
                            if let Some((d, why)) = state.deadline(timeouts) {
                                if d <= Instant::now() {
                                    // Dropping the connection drops the response body: its file is
                                    // closed, its upstream connection freed.
                                    tracing::debug!(peer = %state.peer, "closing: {}", why.as_str());
                                    return None;
                                }
                            }
                        }
                        // (never polled again once it completed: `closing` is set, or it returns)
                        _ = shut.as_mut(), if !closing => {
                            closing = true;
                            match state.phase() {
                                Phase::AwaitRequest => return None,
                                // hyper would close before reading the head: let it arrive first
                                // (bounded by header_read_timeout).
                                Phase::ReadingHead => close_after_request = true,
                                Phase::Serving => Pin::new(&mut conn).graceful_shutdown(),
                            }
                        }

                    }
                };
                Some((conn.into_parts(), parked))
            });
            // taken apart in one expression: `parts` is borrowed nowhere, so it is not kept
            // in this function's state (see `serve`)
            let (next_io, read_buf, next_service, parked) = match exchange.await {
                Some((p, parked)) => (p.io.into_inner(), p.read_buf, p.service, parked),
                None => return,
            };
            io = next_io;
            service = next_service;
            if parked {
                // bytes of the next request hyper read ahead (pipelining) are replayed to the
                // next hyper connection, which is then built at once (an empty `read_buf` is
                // not kept: it may still hold hyper's whole read buffer)
                if !read_buf.is_empty() {
                    io.prefix = Some(Box::new(read_buf));
                }
                continue;
            }
            match state.tunnel.take() {
                Some(t) => {
                    // kept past a reload's shutdown_timeout; told when to go away
                    let (_tunnel, ending) = worker.tunnel_started();
                    Box::pin(crate::proxy::run_tunnel(io, read_buf, t, Some(ending))).await
                }
                None => {
                    let shut = tokio::io::AsyncWriteExt::shutdown(&mut io);
                    let _ = tokio::time::timeout(limits.send_timeout, shut).await;
                }
            }
            return;
        }
    }
}

/// How long an HTTP/1 connection that has served more than one request stays whole after it
/// goes idle before it is taken apart and parked (see [`crate::idle`]). Under keep-alive load
/// the next request comes sooner, and hyper's connection is kept for it; a connection idle
/// longer than this holds no buffers. One that served a single request parks at once.
const PARK_AFTER: Duration = Duration::from_millis(10);

/// An idle HTTP/1 connection waits for its next request's bytes without any read buffer,
/// then reads the first of them (which starts the request-head timeout). `false`: the
/// connection ends (the client left, the keep-alive timeout passed, or shutdown began and
/// `late` is not set: a connection whose handshake finished after shutdown began still gets
/// its first request served).
async fn park<T>(
    io: &mut Tracked<T>,
    state: &ConnState,
    limits: &crate::config::Limits,
    shutdown: &mut tokio::sync::watch::Receiver<bool>,
    late: bool,
) -> bool
where
    T: AsyncRead + AsyncWrite + ReadReady + Unpin,
{
    loop {
        let deadline = state.deadline(h1_timeouts(limits));
        // Only once bytes are there is there a buffer (as nginx's
        // `ngx_http_wait_request_handler`).
        let first = async {
            crate::idle::wait_readable(io).await?;
            let mut first = vec![0u8; 2048];
            let n = io.read(&mut first).await?;
            first.truncate(n);
            Ok::<_, io::Error>(first)
        };
        tokio::select! {
            r = first => return match r {
                Ok(b) if b.is_empty() => false,
                Ok(b) => {
                    io.prefix = Some(Box::new(bytes::Bytes::from(b)));
                    true
                }
                Err(e) => {
                    tracing::debug!(peer = %state.peer, "read failed while idle: {e}");
                    false
                }
            },
            _ = sleep_or_never(deadline.map(|d| d.0)) => {
                if state
                    .deadline(h1_timeouts(limits))
                    .is_some_and(|(d, _)| d <= Instant::now())
                {
                    tracing::debug!(peer = %state.peer, "closing: idle keep-alive timeout");
                    return false;
                }
            }
            _ = shutdown.wait_for(|s| *s), if !late => return false,
        }
    }
}

/// The deadlines of an HTTP/1 connection (computed when needed rather than kept: an idle
/// connection holds nothing more than it must).
fn h1_timeouts(limits: &crate::config::Limits) -> Timeouts {
    Timeouts {
        head: limits.header_read_timeout,
        idle: limits.keepalive_timeout,
        send: limits.send_timeout,
        per_response: false,
    }
}

/// hyper's HTTP/1 connection settings.
fn h1_builder(limits: &crate::config::Limits) -> hyper::server::conn::http1::Builder {
    let mut b = hyper::server::conn::http1::Builder::new();
    b.timer(TokioTimer::new())
        .header_read_timeout(None)
        // The service answers heads over the limit (414 for the target, 431 for the
        // fields) with a body; hyper's parser only refuses heads over twice the limit.
        .max_buf_size((limits.max_request_header_size * 2).max(8192))
        // the header count follows the size limit: a 101st small header is no attack
        .max_headers((limits.max_request_header_size / 32).max(100))
        .keep_alive(true);
    b
}

async fn sleep_or_never(deadline: Option<Instant>) {
    match deadline {
        Some(d) => sleep_until(d).await,
        None => std::future::pending().await,
    }
}
