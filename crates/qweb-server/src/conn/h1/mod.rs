//! The HTTP/1.1 connection driver: qweb's own, on the wire layer of [`qweb_http::h1`]. This
//! file is the connection's loop (heads, deadlines, parking, the end); one request's exchange
//! is `exchange.rs`; the response framing is [`mod@qweb_http::h1::write`]; `tests.rs` drives it
//! over in-memory I/O.
//!
//! One read buffer per connection, allocated when the next request's bytes arrive and freed
//! while the connection is idle ([`crate::conn::idle`]). A request head is searched for its
//! blank line as bytes arrive and parsed once, in one pass that also enforces the framing
//! rules; the request goes to the service with a body that reads from the socket only when it
//! is asked for a frame ([`BodyPipe`]); the response head and the first body chunk go out in
//! one vectored write. Pipelined requests are parsed from what is left in the buffer. Every
//! wait has its deadline (`header_read_timeout`, `keepalive_timeout`, `send_timeout`), and a
//! shutdown lets the request in flight finish with `Connection: close`. A 101 hands the
//! socket and the bytes after the request to the tunnel the proxy left in the connection's
//! slot.

use std::io;
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use super::idle::{ReadReady, SendQueue};
use super::lazy_timer::LazyTimer;
use super::{Handle, Host, Tracked};
use exchange::exchange;
use qweb_http::h1::encode;
use qweb_http::h1::parse::{self, Head, HeadError, HeadLimits};
use qweb_http::h1::write::Output;
use qweb_session::closing::Drain;
use qweb_session::{ConnState, Phase, Timeouts};

mod exchange;
#[cfg(test)]
mod tests;

/// A connection that has served more than one request keeps its read buffer this long when
/// idle: the next request of a keep-alive client usually follows within a round trip. One
/// that served a single request frees it at once (most never send a second).
const PARK_AFTER: Duration = Duration::from_millis(10);

/// The read buffer's size when the next request's bytes arrive; it grows for larger heads
/// (up to the head limit) and bodies.
const READ_SIZE: usize = 4096;

/// How long a connection closed with request-body bytes still arriving reads and drops them,
/// so that the client reads its answer instead of a reset (nginx's lingering close).
const LINGER: Duration = Duration::from_secs(2);

/// Why a connection stops.
enum Stop {
    /// The client closed, or a deadline passed, or shutdown found it idle: close quietly.
    Quiet,
    /// A socket error.
    Io(io::Error),
}

/// Serves HTTP/1.1 on `io` until the connection ends. `late`: the handshake finished after
/// shutdown began; the first request is still served.
pub(super) async fn serve<T, H: Host, S: Handle>(
    mut io: Box<Tracked<T>>,
    state: Rc<ConnState>,
    worker: &H,
    svc: Rc<S>,
    late: bool,
) where
    T: AsyncRead + AsyncWrite + ReadReady + Unpin + 'static,
{
    let limits = worker.limits();
    let mut shutdown = worker.shutdown();
    let mut shut = pin!(shutdown.wait_for(|s| *s));
    // a reload retired the configuration: the next response says `Connection: close` (an idle
    // connection is not cut, so no request races a close)
    let retired = worker.retired();
    // reads between requests keep the transport's read buffer; parking frees it
    io.keep_read_buffer(true);
    let mut c = Conn {
        io,
        buf: BytesMut::new(),
        searched: 0,
        eof: false,
        timer: LazyTimer::new(),
        // a new connection waits for its first bytes without a buffer
        park: Park::Now,
        queue: None,
        retired,
        late,
        served: 0,
        timeouts: Timeouts::http1(limits),
        head_limits: HeadLimits {
            // The service answers heads over the limit (414 for the target, 431 for the
            // fields) with a body; only heads over twice the limit are refused here.
            max_size: (limits.max_request_header_size * 2).max(8192),
            // the field count follows the size limit: a 101st small field is no attack
            max_fields: (limits.max_request_header_size / 32).max(100),
        },
        out: Output::default(),
    };
    loop {
        let head = loop {
            let r = tokio::select! {
                biased;
                r = std::future::poll_fn(|cx| c.poll_head(cx, &state)) => r,
                _ = shut.as_mut(), if !state.closing().shutting_down() => {
                    state.drain(Drain::Shutdown);
                    continue;
                }
            };
            break r;
        };
        let head = match head {
            Ok(h) => {
                c.park = Park::Not;
                h
            }
            Err(Err(e)) => {
                // (boxed, as every step that holds much: the task stays small)
                Box::pin(refuse(&mut c, &state, worker, e)).await;
                return;
            }
            Err(Ok(stop)) => {
                if let Stop::Io(e) = stop {
                    tracing::debug!(peer = %state.peer, "HTTP/1 read failed: {e}");
                }
                return;
            }
        };
        // Boxed, with the request's state and the service's future: the task stays small
        // while the connection is idle.
        let done = Box::pin(exchange(&mut c, &state, &svc, head, &mut shut)).await;
        let Some(done) = done else {
            return;
        };
        c.served += 1;
        if done.switched {
            let rest = std::mem::take(&mut c.buf).freeze();
            match state.tunnel.take() {
                Some(t) => {
                    // a tunnel reads until the peer sends: nothing to keep between reads
                    c.io.keep_read_buffer(false);
                    // kept past a reload's shutdown_timeout; told when to go away
                    let (_tunnel, ending) = worker.tunnels().started(worker.shutdown());
                    t.run(c.io, rest, Some(ending)).await;
                }
                None => Box::pin(close(&mut c.io, limits.send_timeout, false)).await,
            }
            return;
        }
        if !done.keep_alive || !state.closing().is_open() {
            Box::pin(close(&mut c.io, limits.send_timeout, done.body_unread)).await;
            return;
        }
        // the next request: at once from what is buffered, or after the client sends it
        c.searched = 0;
        c.park = if c.served > 1 {
            Park::After(Instant::now() + PARK_AFTER)
        } else {
            Park::Now
        };
        c.queue = None;
    }
}

/// The connection's own state between and during exchanges.
struct Conn<T> {
    io: Box<Tracked<T>>,
    /// Bytes read and not yet parsed or decoded (empty and unallocated while parked).
    buf: BytesMut,
    /// How far the current head was searched for its end.
    searched: usize,
    /// The client closed its side.
    eof: bool,
    timer: LazyTimer,
    /// When an idle connection frees its read buffer (and starts watching its send queue).
    park: Park,
    /// While parked: what the client has not taken of what it was sent (a connection whose
    /// client does not read is not idle: closed after `send_timeout`, see
    /// [`crate::conn::idle`]).
    queue: Option<SendQueue>,
    /// Becomes `true` when a reload retires the connection's configuration.
    retired: tokio::sync::watch::Receiver<bool>,
    /// The handshake finished after shutdown began: one request is still served.
    late: bool,
    served: u64,
    timeouts: Timeouts,
    head_limits: HeadLimits,
    out: Output,
}

impl<T: AsyncRead + AsyncWrite + ReadReady + Unpin> Conn<T> {
    /// Reads until a request head is complete and parses it. `Err(Ok(stop))`: the connection
    /// ends without an answer; `Err(Err(e))`: the head is refused with `e.status()`.
    fn poll_head(
        &mut self,
        cx: &mut Context<'_>,
        state: &ConnState,
    ) -> Poll<Result<Head, Result<Stop, HeadError>>> {
        loop {
            if !self.buf.is_empty() {
                self.queue = None;
                if self.searched == 0 {
                    parse::skip_empty_lines(&mut self.buf);
                }
                if let Some(end) = parse::head_end(&self.buf, &mut self.searched) {
                    return Poll::Ready(
                        parse::parse(&mut self.buf, end, self.head_limits).map_err(Err),
                    );
                }
                if self.buf.len() >= self.head_limits.max_size {
                    return Poll::Ready(Err(Err(HeadError::TooLarge(self.head_limits.max_size))));
                }
                if state.phase() == Phase::AwaitRequest {
                    // (pipelined bytes: the head's deadline runs from now)
                    state.on_read();
                }
            } else if self.eof {
                return Poll::Ready(Err(Ok(Stop::Quiet)));
            }
            // an idle connection is closed by shutdown; one whose head is arriving gets it
            // served (with `Connection: close`), and so does a late handshake's first request
            if state.closing().shutting_down()
                && self.buf.is_empty()
                && !(self.late && self.served == 0)
            {
                return Poll::Ready(Err(Ok(Stop::Quiet)));
            }
            if !self.buf.is_empty() {
                self.park = Park::Not;
            }
            if let Some(stop) = self.poll_deadline(cx, state) {
                return Poll::Ready(Err(Ok(stop)));
            }
            if self.buf.is_empty() && self.park == Park::Now {
                // idle long enough: the buffer goes (as nginx frees its buffers in
                // `ngx_http_set_keepalive`), and the send queue is watched
                self.buf = BytesMut::new();
                self.out = Output::default();
                self.park = Park::Not;
                self.queue = Some(SendQueue::new(self.io.unsent()));
                // (once more round: the timer is armed for the queue's check)
                continue;
            }
            if self.eof {
                // the head was not complete
                return Poll::Ready(Err(Ok(Stop::Quiet)));
            }
            match ready!(self.poll_read_more(cx)) {
                Ok(()) => {}
                Err(e) => return Poll::Ready(Err(Ok(Stop::Io(e)))),
            }
        }
    }

    /// Arms the timer for the connection's deadline, parking and send-queue check, and
    /// when it fires looks at what is due: `Some` when the deadline passed. (The clock is read
    /// only when the timer fired: an armed timer fires at or before what it was armed for.)
    fn poll_deadline(&mut self, cx: &mut Context<'_>, state: &ConnState) -> Option<Stop> {
        let send = self.timeouts.send;
        loop {
            let deadline = state.deadline(self.timeouts);
            self.timer.arm(deadline.map(|d| d.0));
            if let Park::After(t) = self.park {
                self.timer.arm(Some(t));
            }
            if let Some(q) = &self.queue {
                self.timer.arm(q.next_check(send));
            }
            if self.timer.poll_fired(cx).is_pending() {
                return None;
            }
            let now = Instant::now();
            if let Some((d, why)) = deadline {
                if d <= now {
                    // Dropping the exchange drops the response body: its file is closed, its
                    // upstream connection freed.
                    tracing::debug!(peer = %state.peer, "closing: {}", why.as_str());
                    return Some(Stop::Quiet);
                }
            }
            if matches!(self.park, Park::After(t) if t <= now) {
                self.park = Park::Now;
            }
            if let Some(q) = self.queue.as_mut() {
                if q.next_check(send).is_some_and(|t| t <= now) {
                    let left = self.io.unsent();
                    if q.stalled(left, send) {
                        tracing::debug!(peer = %state.peer, unsent = left, "closing: the client takes nothing of what it was sent (send_timeout)");
                        return Some(Stop::Quiet);
                    }
                }
            }
        }
    }

    /// Reads more bytes into the buffer (`eof` when the client closed). A parked connection
    /// (no buffer) first waits until the socket is readable, then allocates.
    fn poll_read_more(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.buf.capacity() == 0 {
            ready!(self.io.poll_read_ready(cx))?;
            self.buf.reserve(READ_SIZE);
        } else if self.buf.capacity() - self.buf.len() < 1024 {
            self.buf.reserve(READ_SIZE.max(self.buf.len()));
        }
        let spare = self.buf.spare_capacity_mut();
        let mut rb = ReadBuf::uninit(spare);
        ready!(Pin::new(&mut *self.io).poll_read(cx, &mut rb))?;
        let n = rb.filled().len();
        if n == 0 {
            self.eof = true;
        } else {
            // SAFETY: `poll_read` initialised the first `n` bytes of the spare capacity
            // (`ReadBuf::filled`), which directly follow the buffer's length.
            #[allow(unsafe_code)]
            unsafe {
                self.buf.set_len(self.buf.len() + n);
            }
        }
        Poll::Ready(Ok(()))
    }
}

/// When an idle connection parks (frees its read buffer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Park {
    /// Not idle, or parked already.
    Not,
    /// At the next look.
    Now,
    /// Once idle until then.
    After(Instant),
}

/// Answers a refused head (400, 414, 431, 505) and closes the connection.
async fn refuse<T, H: Host>(c: &mut Conn<T>, state: &ConnState, worker: &H, e: HeadError)
where
    T: AsyncRead + AsyncWrite + ReadReady + Unpin,
{
    tracing::debug!(peer = %state.peer, "HTTP/1 request refused: {e}");
    let status = e.status();
    if let Some(format) = worker.refused_log() {
        qweb_observe::access_log::refused(format, state.peer, status.as_u16());
    }
    c.out.small(|b| encode::refusal(status, b));
    let limits = worker.limits();
    let write = std::future::poll_fn(|cx| c.out.poll_write(cx, &mut c.io));
    if let Ok(Ok(())) = tokio::time::timeout(limits.send_timeout, write).await {
        close(&mut c.io, limits.send_timeout, true).await;
    }
}

/// Ends the connection: flush and send the end of the stream (TLS: close_notify); with
/// `linger`, then reads and drops what the client still sends for a while, so that it reads
/// the answer rather than a reset.
async fn close<T: AsyncRead + AsyncWrite + Unpin>(
    io: &mut T,
    send_timeout: Duration,
    linger: bool,
) {
    let shut = tokio::io::AsyncWriteExt::shutdown(io);
    if tokio::time::timeout(send_timeout, shut).await.is_err() || !linger {
        return;
    }
    let drain = async {
        let mut sink = [0u8; 4096];
        loop {
            match tokio::io::AsyncReadExt::read(io, &mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}
