//! The HTTP/1.1 connection driver: qweb's own, on the wire layer of [`qweb_http::h1`].
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

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Request, Response, StatusCode};
use http_body::{Body as _, Frame};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use super::idle::{ReadReady, SendQueue};
use super::lazy_timer::LazyTimer;
use super::{Handle, Host, Tracked};
use qweb_http::h1::decode::{BodyError, Decoded, Decoder};
use qweb_http::h1::encode::{self, Asked, BodyHint, Framing as Out};
use qweb_http::h1::parse::{self, Framing, Head, HeadError, HeadLimits};
use qweb_http::request_body::{BodyPipe, RequestBody};
use qweb_session::logged::Logged;
use qweb_session::{ConnState, Phase, Timeouts};

/// A connection that has served more than one request keeps its read buffer this long when
/// idle: the next request of a keep-alive client usually follows within a round trip. One
/// that served a single request frees it at once (most never send a second).
const PARK_AFTER: Duration = Duration::from_millis(10);

/// The read buffer's size when the next request's bytes arrive; it grows for larger heads
/// (up to the head limit) and bodies.
const READ_SIZE: usize = 4096;

/// Bytes of a response queued before they are written (a streamed body's chunks are written
/// as they come; this bounds what one write gathers).
const WRITE_BATCH: usize = 64 * 1024;

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
        shutting: false,
        late,
        served: 0,
        timeouts: h1_timeouts(limits),
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
                _ = shut.as_mut(), if !c.shutting => {
                    c.shutting = true;
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
        if !done.keep_alive || c.shutting {
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
    /// Shutdown began: the request in flight (or whose head is arriving) is the last.
    shutting: bool,
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
            if self.shutting && self.buf.is_empty() && !(self.late && self.served == 0) {
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

/// How an exchange ended, for what comes after it.
struct Done {
    keep_alive: bool,
    /// A 101 went out: the socket is the tunnel's.
    switched: bool,
    /// The request body was not read to its end (the connection closes with a lingering
    /// read).
    body_unread: bool,
}

/// One request: the service's answer, the request body as the service reads it, the
/// response written. `None`: the connection must end now (a deadline, a socket error, a
/// response that cannot be completed).
async fn exchange<T, S: Handle, F>(
    c: &mut Conn<T>,
    state: &Rc<ConnState>,
    svc: &Rc<S>,
    head: Head,
    shut: &mut Pin<&mut F>,
) -> Option<Done>
where
    T: AsyncRead + AsyncWrite + ReadReady + Unpin,
    F: Future,
{
    let Head {
        parts,
        framing,
        keep_alive,
        expect_continue,
        te_trailers,
        upgrade,
    } = head;
    let asked = Asked::new(&parts.method, parts.version, keep_alive, te_trailers);
    let (pipe, body) = match framing {
        Framing::Empty => (None, RequestBody::Empty),
        Framing::Length(n) => {
            let (p, b) = BodyPipe::new(Some(n));
            (Some(p), b)
        }
        Framing::Chunked => {
            let (p, b) = BodyPipe::new(None);
            (Some(p), b)
        }
    };
    let mut ex = Exchange {
        asked,
        decoder: Decoder::new(framing, c.head_limits.max_size),
        pipe,
        expect_continue,
        body_failed: false,
        upgrade,
        stage: Stage::Calling,
    };
    let fut = svc.clone().call(Request::from_parts(parts, body));
    let mut fut = pin!(fut);
    loop {
        let r = tokio::select! {
            biased;
            r = std::future::poll_fn(|cx| ex.poll(cx, c, state, fut.as_mut())) => r,
            _ = shut.as_mut(), if !c.shutting => {
                c.shutting = true;
                continue;
            }
        };
        return r;
    }
}

/// The request's state while it is answered.
struct Exchange {
    asked: Asked,
    decoder: Decoder,
    /// The body's other end, while the request has a body.
    pipe: Option<BodyPipe>,
    /// A 100 (Continue) is owed before the body is read.
    expect_continue: bool,
    /// The body's framing was broken: the connection cannot go on.
    body_failed: bool,
    upgrade: bool,
    stage: Stage,
}

impl Drop for Exchange {
    fn drop(&mut self) {
        if let Some(p) = &self.pipe {
            p.close();
        }
    }
}

enum Stage {
    /// The service is working.
    Calling,
    /// The response is going out.
    Writing(Box<Writing>),
    /// Written; the flush is left.
    Flushing { keep_alive: bool, switched: bool },
}

struct Writing {
    body: Option<Logged>,
    framing: Out,
    /// Bytes still owed under `Content-Length`.
    left: u64,
    keep_alive: bool,
    trailers: Option<http::HeaderMap>,
    switched: bool,
}

impl Exchange {
    fn poll<T, F>(
        &mut self,
        cx: &mut Context<'_>,
        c: &mut Conn<T>,
        state: &ConnState,
        mut fut: Pin<&mut F>,
    ) -> Poll<Option<Done>>
    where
        T: AsyncRead + AsyncWrite + ReadReady + Unpin,
        F: Future<Output = Response<Logged>>,
    {
        loop {
            let mut progress = false;
            // the request body, when the service asks for it
            if let Some(pipe) = self.pipe.as_ref().filter(|p| {
                p.register(cx.waker());
                p.wanted()
            }) {
                let pipe = pipe.clone();
                {
                    match self.pump(cx, c, &pipe) {
                        Poll::Ready(Ok(())) => progress = true,
                        Poll::Ready(Err(())) => return Poll::Ready(None),
                        Poll::Pending => {}
                    }
                }
            }
            if let Stage::Calling = self.stage {
                if let Poll::Ready(resp) = fut.as_mut().poll(cx) {
                    self.start(resp, c);
                    progress = true;
                }
            }
            if let Stage::Writing(w) = &mut self.stage {
                match w.fill(cx, &mut c.out) {
                    Ok(p) => progress |= p,
                    Err(()) => return Poll::Ready(None),
                }
            }
            if !c.out.is_empty() {
                match c.out.poll_write(cx, &mut c.io) {
                    Poll::Ready(Ok(())) => {
                        progress = true;
                        c.out.unflushed = true;
                    }
                    Poll::Ready(Err(e)) => {
                        tracing::debug!(peer = %state.peer, "HTTP/1 write failed: {e}");
                        return Poll::Ready(None);
                    }
                    Poll::Pending => {}
                }
            }
            if c.out.unflushed && c.out.is_empty() && !matches!(self.stage, Stage::Flushing { .. })
            {
                // what was written goes out now (TLS: its records), while the body waits for
                // its source (or the client for its 100); a flush that waits for the socket is
                // polled again
                match Pin::new(&mut *c.io).poll_flush(cx) {
                    Poll::Ready(Ok(())) => c.out.unflushed = false,
                    Poll::Ready(Err(e)) => {
                        tracing::debug!(peer = %state.peer, "HTTP/1 flush failed: {e}");
                        return Poll::Ready(None);
                    }
                    Poll::Pending => {}
                }
            }
            if let Stage::Writing(w) = &mut self.stage {
                if w.body.is_none() && c.out.is_empty() {
                    self.stage = Stage::Flushing {
                        keep_alive: w.keep_alive,
                        switched: w.switched,
                    };
                }
            }
            if let Stage::Flushing {
                keep_alive,
                switched,
            } = self.stage
            {
                match Pin::new(&mut *c.io).poll_flush(cx) {
                    Poll::Ready(Ok(())) => c.out.unflushed = false,
                    Poll::Ready(Err(e)) => {
                        tracing::debug!(peer = %state.peer, "HTTP/1 flush failed: {e}");
                        return Poll::Ready(None);
                    }
                    // the last records wait for the client's window: the send timeout runs
                    Poll::Pending if c.poll_deadline(cx, state).is_some() => {
                        return Poll::Ready(None)
                    }
                    Poll::Pending => return Poll::Pending,
                }
                let mut body_unread = false;
                if !self.decoder.is_done() && !self.body_failed && !switched {
                    // what of the body is already buffered is taken; the rest is not waited for
                    body_unread = !self.decoder.skip_buffered(&mut c.buf);
                }
                return Poll::Ready(Some(Done {
                    keep_alive: keep_alive && !body_unread && !self.body_failed,
                    switched,
                    body_unread,
                }));
            }
            if !progress {
                // waiting: for the service, the body's source, the client's bytes or its
                // window; a write that just stalled has started the send timeout
                if c.poll_deadline(cx, state).is_some() {
                    return Poll::Ready(None);
                }
                return Poll::Pending;
            }
        }
    }

    /// Gives the body its next frame: from the buffer, or after a read. `Err`: the connection
    /// failed.
    fn pump<T>(
        &mut self,
        cx: &mut Context<'_>,
        c: &mut Conn<T>,
        pipe: &BodyPipe,
    ) -> Poll<Result<(), ()>>
    where
        T: AsyncRead + AsyncWrite + ReadReady + Unpin,
    {
        loop {
            match self.decoder.decode(&mut c.buf, c.eof) {
                Ok(Decoded::Data(d)) => {
                    pipe.push(Frame::data(d), self.decoder.is_done());
                    return Poll::Ready(Ok(()));
                }
                Ok(Decoded::Trailers(t)) => {
                    pipe.push(Frame::trailers(t), true);
                    return Poll::Ready(Ok(()));
                }
                Ok(Decoded::End) => {
                    pipe.end();
                    return Poll::Ready(Ok(()));
                }
                Err(e) => {
                    tracing::debug!("HTTP/1 request body: {e}");
                    self.body_failed = true;
                    pipe.fail(e);
                    return Poll::Ready(Ok(()));
                }
                Ok(Decoded::More) => {}
            }
            if self.expect_continue {
                self.expect_continue = false;
                if matches!(self.stage, Stage::Calling) {
                    c.out
                        .small(|b| b.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n"));
                    return Poll::Ready(Ok(()));
                }
            }
            match ready!(c.poll_read_more(cx)) {
                Ok(()) => {}
                Err(e) => {
                    tracing::debug!("HTTP/1 request body read failed: {e}");
                    self.body_failed = true;
                    pipe.fail(BodyError::Truncated);
                    return Poll::Ready(Err(()));
                }
            }
        }
    }

    /// The service answered: the head is queued, the body follows.
    fn start<T>(&mut self, resp: Response<Logged>, c: &mut Conn<T>) {
        let (parts, body) = resp.into_parts();
        let mut asked = self.asked;
        let abandoned = self.pipe.as_ref().is_some_and(|p| p.abandoned());
        if abandoned && !self.body_failed {
            // what of the body is already buffered is taken: a small body that came with its
            // head does not cost the connection
            self.decoder.skip_buffered(&mut c.buf);
        }
        let unread = abandoned && !self.decoder.is_done();
        // The connection ends after this response when the server shuts down, when the
        // request's body is left unread (nobody will read it: its bytes cannot be told from
        // the next request's), or when its framing broke.
        asked.keep_alive &= !c.shutting && !unread && !self.body_failed;
        let hint = BodyHint {
            empty: body.is_end_stream(),
            exact: body.size_hint().exact(),
        };
        let switched = parts.status == StatusCode::SWITCHING_PROTOCOLS && self.upgrade;
        let mut enc = None;
        c.out
            .small(|dst| enc = Some(encode::head(parts.status, &parts.headers, hint, asked, dst)));
        let Some(enc) = enc else {
            return;
        };
        let left = match enc.framing {
            Out::Length(n) => n,
            _ => 0,
        };
        let body = match enc.framing {
            // the body is not polled: dropping it logs the request
            Out::None => None,
            _ => Some(body),
        };
        self.stage = Stage::Writing(Box::new(Writing {
            body,
            framing: enc.framing,
            left,
            keep_alive: enc.keep_alive,
            trailers: None,
            switched,
        }));
    }
}

impl Writing {
    /// Queues what the body has ready, up to [`WRITE_BATCH`]. `Ok(true)`: something was
    /// queued or the body ended; `Err`: the response cannot be completed (the connection
    /// ends).
    fn fill(&mut self, cx: &mut Context<'_>, out: &mut Output) -> Result<bool, ()> {
        let mut progress = false;
        while out.queued < WRITE_BATCH {
            let Some(body) = self.body.as_mut() else {
                break;
            };
            match Pin::new(body).poll_frame(cx) {
                Poll::Pending => break,
                Poll::Ready(Some(Err(e))) => {
                    tracing::debug!("response body failed: {e}");
                    return Err(());
                }
                Poll::Ready(Some(Ok(frame))) => {
                    progress = true;
                    match frame.into_data() {
                        Ok(d) => self.data(d, out)?,
                        Err(f) => {
                            if let Ok(t) = f.into_trailers() {
                                self.trailers = Some(t);
                            }
                        }
                    }
                }
                Poll::Ready(None) => {
                    progress = true;
                    self.end(out)?;
                    self.body = None;
                }
            }
        }
        Ok(progress)
    }

    fn data(&mut self, d: Bytes, out: &mut Output) -> Result<(), ()> {
        if d.is_empty() {
            return Ok(());
        }
        match &self.framing {
            Out::Length(_) => {
                if d.len() as u64 > self.left {
                    tracing::warn!("response body longer than its Content-Length: cut");
                    return Err(());
                }
                self.left -= d.len() as u64;
                out.data(d);
            }
            Out::Chunked(_) => {
                out.small(|b| encode::chunk_size(b, d.len()));
                out.data(d);
                out.small(|b| b.extend_from_slice(b"\r\n"));
            }
            Out::Close => out.data(d),
            Out::None => {}
        }
        Ok(())
    }

    fn end(&mut self, out: &mut Output) -> Result<(), ()> {
        match &self.framing {
            Out::Length(_) if self.left > 0 => {
                tracing::warn!(
                    missing = self.left,
                    "response body shorter than its Content-Length"
                );
                Err(())
            }
            Out::Chunked(allowed) => {
                let t = self.trailers.take();
                out.small(|b| encode::last_chunk(b, t.as_ref(), allowed.as_deref()));
                Ok(())
            }
            Out::Close => {
                self.keep_alive = false;
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

/// What is queued for the client: framing bytes in one reused buffer, body chunks as they
/// came, written with vectored writes.
#[derive(Default)]
struct Output {
    small: Vec<u8>,
    pieces: VecDeque<Piece>,
    /// Bytes of the front piece already written.
    front: usize,
    /// Bytes queued.
    queued: usize,
    /// Bytes were written since the last completed flush.
    unflushed: bool,
}

enum Piece {
    /// `small[start..end]`.
    Small(usize, usize),
    Data(Bytes),
}

/// Body chunks up to this size are copied next to the framing (one buffer less to write).
const COPY_BELOW: usize = 512;

impl Output {
    fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// Appends framing bytes.
    fn small(&mut self, f: impl FnOnce(&mut Vec<u8>)) {
        let start = self.small.len();
        f(&mut self.small);
        let end = self.small.len();
        self.queued += end - start;
        match self.pieces.back_mut() {
            Some(Piece::Small(_, e)) if *e == start => *e = end,
            _ => self.pieces.push_back(Piece::Small(start, end)),
        }
    }

    fn data(&mut self, d: Bytes) {
        if d.len() < COPY_BELOW {
            self.small(|b| b.extend_from_slice(&d));
            return;
        }
        self.queued += d.len();
        self.pieces.push_back(Piece::Data(d));
    }

    /// Writes until everything queued is out (or the socket is full).
    fn poll_write<T: AsyncWrite + Unpin>(
        &mut self,
        cx: &mut Context<'_>,
        io: &mut T,
    ) -> Poll<io::Result<()>> {
        while !self.pieces.is_empty() {
            let mut slices = [io::IoSlice::new(&[]); 16];
            let mut k = 0;
            for (i, p) in self.pieces.iter().take(slices.len()).enumerate() {
                let bytes = match p {
                    Piece::Small(s, e) => &self.small[*s..*e],
                    Piece::Data(d) => &d[..],
                };
                let skip = if i == 0 { self.front } else { 0 };
                slices[k] = io::IoSlice::new(&bytes[skip..]);
                k += 1;
            }
            let mut n = ready!(Pin::new(&mut *io).poll_write_vectored(cx, &slices[..k]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.queued = self.queued.saturating_sub(n);
            while n > 0 {
                let Some(p) = self.pieces.front() else { break };
                let len = match p {
                    Piece::Small(s, e) => e - s,
                    Piece::Data(d) => d.len(),
                } - self.front;
                if n >= len {
                    n -= len;
                    self.front = 0;
                    self.pieces.pop_front();
                } else {
                    self.front += n;
                    n = 0;
                }
            }
        }
        self.small.clear();
        self.queued = 0;
        Poll::Ready(Ok(()))
    }
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

/// The deadlines of an HTTP/1 connection.
pub(super) fn h1_timeouts(limits: &crate::config::Limits) -> Timeouts {
    Timeouts {
        head: limits.header_read_timeout,
        idle: limits.keepalive_timeout,
        send: limits.send_timeout,
        per_response: false,
    }
}
