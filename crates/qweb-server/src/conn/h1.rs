//! The HTTP/1.1 connection loop: hyper's HTTP/1 connection, built only while a request is
//! there and taken apart between requests (idle parking, see [`crate::conn::idle`]), watched
//! for the head, keep-alive and send deadlines and shutdown, with one [`Closing`] state for
//! how the connection is ending; then a tunnel, when the last response started one.

use std::io;
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::time::Instant;

use super::idle::{IdleWatch, SendQueue};
use super::lazy_timer::LazyTimer;
use super::{sleep_or_never, Host, HyperService, ReadReady, Tracked};
use crate::session::{ConnState, Phase, Timeouts};

/// How an HTTP/1 connection is ending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Closing {
    /// Serving; may park when idle.
    Open,
    /// Shutdown began while a request head was arriving: hyper would close before reading
    /// it, so the head is let in (bounded by `header_read_timeout`) and the connection closes
    /// after that request.
    AfterRequest,
    /// hyper was asked to close once the response in flight is out.
    Draining,
}

/// Serves HTTP/1.1 on `io` until the connection ends. `late`: the handshake finished after
/// shutdown began; the first request is still served.
pub(super) async fn serve<T, H: Host, S: HyperService>(
    mut io: Box<Tracked<T>>,
    state: Rc<ConnState>,
    worker: &H,
    mut service: S,
    watch: Rc<IdleWatch>,
    late: bool,
) where
    T: AsyncRead + AsyncWrite + ReadReady + Unpin + 'static,
{
    let limits = worker.limits();
    let mut shutdown = worker.shutdown();
    io.idle = Some(watch.clone());
    // hyper's HTTP/1 connection allocates its read and write buffers (16 KiB) when it is
    // built: it is built only once request bytes arrive, and taken apart again whenever it
    // goes idle between requests (see `crate::conn::idle`), so that idle connections cost
    // little (as nginx allocates its header buffer on the first read and frees it on idle
    // keep-alive).
    let mut first = true;
    loop {
        if io.prefix.is_none() && !park(&mut io, &state, limits, &mut shutdown, first && late).await
        {
            return;
        }
        first = false;
        watch.restart();
        // (built anew each time rather than kept: an idle connection holds nothing more)
        let conn = h1_builder(limits).serve_connection(TokioIo::new(io), service);
        // Boxed, with all the exchange's state, so that the task stays small while parked.
        let (next_io, read_buf, next_service, parked) =
            match Box::pin(exchange(conn, &state, worker, &watch, &mut shutdown)).await {
                // taken apart in one expression: `parts` is borrowed nowhere, so it is not
                // kept in this function's state (see `crate::conn::serve`)
                Some((p, parked)) => (p.io.into_inner(), p.read_buf, p.service, parked),
                None => return,
            };
        io = next_io;
        service = next_service;
        if parked {
            // bytes of the next request hyper read ahead (pipelining) are replayed to the
            // next hyper connection, which is then built at once (an empty `read_buf` is not
            // kept: it may still hold hyper's whole read buffer)
            if !read_buf.is_empty() {
                io.prefix = Some(Box::new(read_buf));
            }
            continue;
        }
        match state.tunnel.take() {
            Some(t) => {
                // kept past a reload's shutdown_timeout; told when to go away
                let (_tunnel, ending) = worker.tunnels().started(worker.shutdown());
                t.run(io, read_buf, Some(ending)).await
            }
            None => {
                let shut = tokio::io::AsyncWriteExt::shutdown(&mut io);
                let _ = tokio::time::timeout(limits.send_timeout, shut).await;
            }
        }
        return;
    }
}

type Conn<T, S> = http1::Connection<TokioIo<Box<Tracked<T>>>, S>;

/// One spell of hyper's connection: requests until it goes idle long enough to park
/// (`Some((parts, true))`), or hyper is done with it (`Some((parts, false))`: closed, or
/// upgraded), or it must end now (`None`). Not pinned: the connection is taken apart after.
async fn exchange<T, H: Host, S: HyperService>(
    mut conn: Conn<T, S>,
    state: &ConnState,
    worker: &H,
    watch: &IdleWatch,
    shutdown: &mut tokio::sync::watch::Receiver<bool>,
) -> Option<(http1::Parts<TokioIo<Box<Tracked<T>>>, S>, bool)>
where
    T: AsyncRead + AsyncWrite + ReadReady + Unpin + 'static,
{
    let timeouts = h1_timeouts(worker.limits());
    let mut closing = Closing::Open;
    // When this idle spell may end in parking, and the requests handed by then: a keep-alive
    // client's next request usually follows within a round trip, and taking hyper apart for
    // it would cost more than its buffers are worth.
    let mut park_at: Option<(Instant, u64)> = None;
    let mut timer = LazyTimer::new();
    // kept across turns of the loop (see the HTTP/2 loop)
    let mut shut = pin!(shutdown.wait_for(|s| *s));
    let mut changed = pin!(state.changed.notified());
    let parked = loop {
        if closing == Closing::AfterRequest && state.phase() == Phase::Serving {
            Pin::new(&mut conn).graceful_shutdown();
            closing = Closing::Draining;
        }
        if closing == Closing::Open && watch.parkable(state) {
            match park_at {
                Some((at, handed)) if handed == watch.handed_count() => {
                    if at <= Instant::now() {
                        break true;
                    }
                }
                // a new idle spell; a connection that has not yet reused itself parks at
                // once (most never send a second request)
                _ if watch.handed_count() <= 1 => break true,
                _ => park_at = Some((Instant::now() + PARK_AFTER, watch.handed_count())),
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
                    match worker.refused_log() {
                        Some(format) if e.is_parse() || e.is_parse_too_large() => {
                            // hyper's parser answered (400, or 431 for a head over its buffer)
                            let status = if e.is_parse_too_large() { 431 } else { 400 };
                            crate::observe::access_log::refused(format, state.peer, status);
                        }
                        _ => {}
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
            _ = shut.as_mut(), if closing == Closing::Open => {
                closing = Closing::Draining;
                match state.phase() {
                    Phase::AwaitRequest => return None,
                    Phase::ReadingHead => closing = Closing::AfterRequest,
                    Phase::Serving => Pin::new(&mut conn).graceful_shutdown(),
                }
            }
        }
    };
    Some((conn.into_parts(), parked))
}

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
    // What the client has not taken of what it was sent, and since when that has not
    // shrunk: a connection with bytes in its send queue is not idle; its send timeout runs.
    let mut queue = SendQueue::new(io.unsent());
    loop {
        let mut deadline = state.deadline(h1_timeouts(limits)).map(|d| d.0);
        if let Some(check) = queue.next_check(limits.send_timeout) {
            deadline = Some(deadline.map_or(check, |d| d.min(check)));
        }
        // Only once bytes are there is there a buffer (as nginx's
        // `ngx_http_wait_request_handler`).
        let first = async {
            crate::conn::idle::wait_readable(io).await?;
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
            _ = sleep_or_never(deadline) => {
                let now = Instant::now();
                if state
                    .deadline(h1_timeouts(limits))
                    .is_some_and(|(d, _)| d <= now)
                {
                    tracing::debug!(peer = %state.peer, "closing: idle keep-alive timeout");
                    return false;
                }
                if queue.next_check(limits.send_timeout).is_some() {
                    let left = io.unsent();
                    if queue.stalled(left, limits.send_timeout) {
                        tracing::debug!(peer = %state.peer, unsent = left, "closing: the client takes nothing of what it was sent (send_timeout)");
                        return false;
                    }
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
fn h1_builder(limits: &crate::config::Limits) -> http1::Builder {
    let mut b = http1::Builder::new();
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
