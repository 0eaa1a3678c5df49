//! Idle HTTP/1 keep-alive connections hold no HTTP buffers.
//!
//! hyper's HTTP/1 connection keeps an 8 KiB read buffer and an 8 KiB write buffer for as long
//! as it lives. Between two requests `conn.rs` takes it apart (`into_parts`) and the
//! connection waits for its next request as its transport alone (the socket, or the TLS stream
//! with rustls' own state), plus its [`ConnState`]; a new hyper connection is built when the
//! next request's bytes arrive (as nginx frees its buffers in `ngx_http_set_keepalive` and
//! allocates them again on the next read).
//!
//! A connection that has served more than one request is taken apart only after it stayed
//! idle for `conn.rs`'s `PARK_AFTER` (10 ms); after its first request it parks at once (most
//! connections that go idle then stay idle). Under keep-alive load the next request arrives sooner, and parking for every
//! request cost an eventfd wake-up (0.37 `write` calls per request under `wrk -c8`) without
//! saving memory that matters. A grace for every connection was worse for bursts of new
//! connections: 1 000 opened at once all held hyper's 16 KiB at the same time, and the
//! allocator kept those pages (bench F: 16.6 KiB per idle connection with 100 ms, 11.7 with
//! 10 ms, instead of 10.3).
//!
//! Taking hyper apart is safe only when it holds nothing of the exchange: [`IdleWatch`] is
//! told what hyper does with the transport (by `conn.rs`'s `Tracked` wrapper) and what it
//! hands to the service, and [`IdleWatch::parkable`] says when every request hyper read has
//! been answered, every byte it wrote was flushed, it asks for more bytes, and the last
//! request had no body (so hyper is not draining one).

use std::cell::Cell;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::session::{ConnState, Phase};

/// A transport an idle connection can wait on without a read buffer.
pub(crate) trait ReadReady {
    /// Ready when a read would not wait (data, end of stream, or an error to report).
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;

    /// Bytes written that the peer has not yet acknowledged (the socket's send queue,
    /// `SIOCOUTQ`): a connection whose client has not taken what it was sent is not idle.
    fn unsent(&self) -> usize {
        send_queue(self.socket_fd())
    }

    /// The TCP socket's file descriptor (for [`ReadReady::unsent`], and for the HTTP/2 loop,
    /// which reads the send queue while hyper owns the transport).
    fn socket_fd(&self) -> RawFd;
}

/// `SIOCOUTQ` of the TCP socket `fd` (0 when the kernel does not say, e.g. `fd` was closed).
#[allow(unsafe_code)] // one ioctl: see the SAFETY note
pub(crate) fn send_queue(fd: RawFd) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (== TIOCOUTQ on Linux) writes one `int` through the pointer, which
    // points to `n`, a live local; whatever `fd` names now (an error if it is no longer a
    // socket), no other memory is touched.
    let r = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n as *mut libc::c_int) };
    if r == 0 {
        usize::try_from(n).unwrap_or(0)
    } else {
        0
    }
}

/// What a connection with nothing in flight has not had taken of what it was sent, and since
/// when that has not shrunk: such a connection is not idle (its client has not read its
/// answers), and it is closed when the queue has not shrunk for `send_timeout`, however long
/// `keepalive_timeout` is. Looked at every [`QUEUE_CHECK`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct SendQueue {
    unsent: usize,
    since: Instant,
}

/// How often a connection with unacknowledged bytes and nothing in flight looks at its send
/// queue.
pub(crate) const QUEUE_CHECK: Duration = Duration::from_secs(1);

impl SendQueue {
    /// The queue as it is now.
    pub(crate) fn new(unsent: usize) -> Self {
        SendQueue {
            unsent,
            since: Instant::now(),
        }
    }

    /// When to look again: never while nothing is unsent.
    pub(crate) fn next_check(&self, send_timeout: Duration) -> Option<Instant> {
        (self.unsent > 0).then(|| (Instant::now() + QUEUE_CHECK).min(self.since + send_timeout))
    }

    /// Looks again, `unsent` bytes being in the queue now: `true` when the client has taken
    /// nothing for `send_timeout`.
    pub(crate) fn stalled(&mut self, unsent: usize, send_timeout: Duration) -> bool {
        let now = Instant::now();
        if unsent < self.unsent {
            *self = SendQueue { unsent, since: now };
            return false;
        }
        self.unsent > 0 && self.since + send_timeout <= now
    }
}

impl ReadReady for TcpStream {
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        TcpStream::poll_read_ready(self, cx)
    }

    fn socket_fd(&self) -> RawFd {
        self.as_raw_fd()
    }
}

impl ReadReady for qweb_tls::TlsStream {
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        qweb_tls::TlsStream::poll_read_ready(self, cx)
    }

    fn socket_fd(&self) -> RawFd {
        self.socket().as_raw_fd()
    }
}

/// What one HTTP/1 connection's hyper did lately, to tell when it can be taken apart.
#[derive(Default)]
pub(crate) struct IdleWatch {
    /// Bytes were written since the last completed flush.
    unflushed: Cell<bool>,
    /// hyper's last read found nothing (and nothing was written since).
    read_waiting: Cell<bool>,
    /// Requests hyper handed to the service (over the connection's life).
    handed: Cell<u64>,
    /// The last of them came with a body or asked for an upgrade.
    last_had_body: Cell<bool>,
    /// A request was handed and no flush has completed since every request was done. A
    /// response hyper holds in its own write buffer is invisible to the transport: its request
    /// may be done (an empty body is dropped before the head is written) while hyper, pushed
    /// back by the write burst, has not written it yet.
    unanswered: Cell<bool>,
}

impl IdleWatch {
    /// hyper handed a request to the service; `has_body`: it came with a body (one hyper may
    /// still be reading or draining after the response) or asked for an upgrade or CONNECT
    /// (after which the connection may carry another protocol).
    pub(crate) fn handed(&self, has_body: bool) {
        self.handed.set(self.handed.get() + 1);
        self.last_had_body.set(has_body);
        self.unanswered.set(true);
    }

    /// How many requests hyper handed to the service so far.
    pub(crate) fn handed_count(&self) -> u64 {
        self.handed.get()
    }

    /// A read returned bytes.
    pub(crate) fn on_read(&self) {
        self.read_waiting.set(false);
    }

    /// A read found nothing. Wakes the connection's loop (through `state.changed`) when this
    /// may be the moment hyper went idle: once per quiet spell, never on every poll.
    pub(crate) fn on_read_pending(&self, state: &ConnState) {
        if !self.read_waiting.replace(true) && !self.unflushed.get() {
            state.changed.notify_one();
        }
    }

    /// A write took `n` bytes.
    pub(crate) fn on_write(&self, n: usize) {
        if n > 0 {
            self.unflushed.set(true);
            self.read_waiting.set(false);
        }
    }

    /// A flush completed: everything written so far is on the socket.
    pub(crate) fn on_flushed(&self, state: &ConnState) {
        if state.in_flight() == 0 && self.handed.get() == state.requests_started() {
            // hyper flushes only once its own buffer is written: every answer is out
            self.unanswered.set(false);
        }
        if self.unflushed.replace(false) && self.read_waiting.get() {
            state.changed.notify_one();
        }
    }

    /// A new hyper connection starts on the transport.
    pub(crate) fn restart(&self) {
        self.unflushed.set(false);
        self.read_waiting.set(false);
    }

    /// Whether hyper holds nothing of any exchange: every request it handed over was started
    /// and answered (its response body finished, and a flush completed after that), it
    /// flushed all it wrote and then asked for more bytes, and the last request had no body.
    pub(crate) fn parkable(&self, state: &ConnState) -> bool {
        self.read_waiting.get()
            && !self.unflushed.get()
            && !self.unanswered.get()
            && !self.last_had_body.get()
            && self.handed.get() == state.requests_started()
            && state.in_flight() == 0
            && state.phase() == Phase::AwaitRequest
    }
}

/// Waits until `io` has bytes (or end of stream, or an error) without a read buffer.
pub(crate) async fn wait_readable<T: ReadReady>(io: &mut T) -> io::Result<()> {
    std::future::poll_fn(|cx| io.poll_read_ready(cx)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> ConnState {
        ConnState::new("127.0.0.1:1".parse().unwrap())
    }

    /// One bodiless request: parkable only once its response was flushed and hyper asked for
    /// more; a request with a body never is.
    #[test]
    fn parkable_only_after_a_flushed_answer_to_a_bodiless_request() {
        let s = std::rc::Rc::new(state());
        let w = IdleWatch::default();
        w.on_read_pending(&s);
        assert!(w.parkable(&s), "a fresh connection waiting for bytes");
        w.on_read();
        w.handed(false);
        assert!(!w.parkable(&s), "handed, not yet started");
        let guard = s.request_started_guard();
        w.on_read_pending(&s); // hyper checks for EOF while serving
        assert!(!w.parkable(&s), "in flight");
        w.on_write(100);
        drop(guard);
        w.on_read_pending(&s);
        assert!(!w.parkable(&s), "written, not flushed");
        w.on_flushed(&s);
        assert!(w.parkable(&s));

        w.on_read();
        w.handed(true);
        let guard = s.request_started_guard();
        w.on_write(10);
        w.on_flushed(&s);
        drop(guard);
        w.on_read_pending(&s);
        assert!(!w.parkable(&s), "hyper may still drain the body");
    }

    /// A response hyper has not written yet (its empty body already dropped, so the request
    /// is done) keeps the connection from parking until a flush follows.
    #[test]
    fn a_done_request_is_not_parkable_until_its_answer_is_flushed() {
        let s = std::rc::Rc::new(state());
        let w = IdleWatch::default();
        w.on_read();
        w.handed(false);
        w.on_read_pending(&s); // hyper looks for more bytes while the service runs
        let guard = s.request_started_guard();
        drop(guard); // the body was empty: dropped before hyper wrote the head
        assert!(!w.parkable(&s), "the head is still in hyper's buffer");
        w.on_write(40);
        w.on_flushed(&s);
        w.on_read_pending(&s);
        assert!(w.parkable(&s));
    }
}
