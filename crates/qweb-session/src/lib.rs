//! What the watchdog of one connection knows: which phase the connection is in, when each
//! phase must end, how far each response being sent has come, and how the connection is
//! ending ([`closing`]): one lifecycle for the HTTP/1, HTTP/2 and HTTP/3 drivers.
//!
//! Shared (through `Rc`) by the connection's I/O wrapper, its service and its response bodies,
//! all on the worker's thread. Imports only `qweb-config`, `qweb-http` and `qweb-observe`.

pub mod client_slots;
pub mod closing;
pub mod logged;
pub mod tunnel;

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

tokio::task_local! {
    /// The HTTP/2 stream task a request runs in (none for HTTP/1).
    static STREAM: Rc<StreamCancel>;
}

/// Cancels one HTTP/2 stream task: the task drops its stream (h2 sends RST_STREAM) and its
/// response body (which closes files and frees upstream connections).
#[derive(Default)]
pub struct StreamCancel {
    cancelled: Cell<bool>,
    /// The stream task's waker, woken by a cancel (one thread: no lock, no wait list).
    waker: RefCell<Option<std::task::Waker>>,
}

impl StreamCancel {
    /// Runs `fut` as the stream task of `cancel`, until it ends or is cancelled.
    pub async fn run<F: std::future::Future>(cancel: Rc<StreamCancel>, fut: F) {
        let c = cancel.clone();
        STREAM.scope(cancel, Cancellable { fut, cancel: c }).await;
    }

    fn cancel(&self) {
        if !self.cancelled.replace(true) {
            if let Some(w) = self.waker.borrow_mut().take() {
                w.wake();
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// `fut` until it ends, or until its stream is cancelled (then it is dropped unfinished).
    struct Cancellable<F> {
        #[pin]
        fut: F,
        cancel: Rc<StreamCancel>,
    }
}

impl<F: std::future::Future> std::future::Future for Cancellable<F> {
    type Output = ();

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        let this = self.project();
        if this.cancel.cancelled.get() {
            return std::task::Poll::Ready(());
        }
        if this.fut.poll(cx).is_ready() {
            return std::task::Poll::Ready(());
        }
        let mut w = this.cancel.waker.borrow_mut();
        if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            *w = Some(cx.waker().clone());
        }
        std::task::Poll::Pending
    }
}

/// qweb's own HTTP/2 layer cancels a stream's task through this (the client reset it).
impl qweb_http::h2::Cancel for StreamCancel {
    fn cancel(&self) {
        StreamCancel::cancel(self);
    }
}

/// The phase a connection is in; each phase owns its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for a request head to start (idle keep-alive).
    AwaitRequest,
    /// A request head is arriving.
    ReadingHead,
    /// Requests in flight: the service or the client is working.
    Serving,
}

/// Why a connection's deadline passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// Idle for `keepalive_timeout`.
    Idle,
    /// The request head took longer than `header_read_timeout`.
    Head,
    /// A write made no progress for `send_timeout`.
    WriteStalled,
    /// At least one response made no progress for `send_timeout`.
    ResponseStalled,
}

impl Expiry {
    /// For the log.
    pub fn as_str(self) -> &'static str {
        match self {
            Expiry::Idle => "idle keep-alive timeout",
            Expiry::Head => "request head timeout",
            Expiry::WriteStalled => "send timeout (writes stalled)",
            Expiry::ResponseStalled => "send timeout (response stalled)",
        }
    }
}

/// The timeouts a connection's deadlines come from.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// A request head must arrive within this (`header_read_timeout`).
    pub head: Duration,
    /// A connection may wait this long for its next request (`keepalive_timeout`).
    pub idle: Duration,
    /// A write, or a response, may make no progress for this long (`send_timeout`).
    pub send: Duration,
    /// Also cut single responses that wait for the client (HTTP/2, where flow control can
    /// stall one stream while the socket stays writable). HTTP/1 needs only stalled writes.
    pub per_response: bool,
}

impl Timeouts {
    /// HTTP/1: the head, keep-alive and send timeouts as configured; a stalled write is what
    /// a stalled response looks like (one response at a time).
    pub fn http1(limits: &qweb_config::Limits) -> Self {
        Timeouts {
            head: limits.header_read_timeout,
            idle: limits.keepalive_timeout,
            send: limits.send_timeout,
            per_response: false,
        }
    }

    /// HTTP/2 and HTTP/3: frames that are not requests (PING, WINDOW_UPDATE) may arrive
    /// while idle, so only the keep-alive timeout applies between requests (the codecs bound
    /// header blocks themselves); each response has its own send deadline, as flow control
    /// can stall one stream while the connection stays writable.
    pub fn multiplexed(limits: &qweb_config::Limits) -> Self {
        Timeouts {
            head: limits.keepalive_timeout,
            idle: limits.keepalive_timeout,
            send: limits.send_timeout,
            per_response: true,
        }
    }
}

/// How far one response has come.
struct Sending {
    /// `Some(t)`: the response's next chunk is ready and has been waiting for the client since
    /// `t`. `None`: not sending yet, or waiting for its own source (an upstream).
    waiting_since: Cell<Option<Instant>>,
    /// The HTTP/2 stream to reset when it stalls.
    stream: Option<Rc<StreamCancel>>,
}

/// What the responses of one connection may read ahead of their client, together: a streamed
/// body reads its next chunk only when hyper asks for it (the client granted window, or
/// HTTP/1's socket took the last one), but an HTTP/2 client that grants large windows and
/// does not read its socket has each stream's chunk wait in memory. The budget is split among
/// the requests in flight ([`ReadAhead::share`]); with HTTP/2's send buffer per stream
/// (`conn/h2.rs`) it bounds what such a connection holds.
pub const READ_AHEAD_BUDGET: usize = 1 << 20;

/// A response's share of its connection's [`READ_AHEAD_BUDGET`]. `None` (no connection, as
/// in unit tests): no share, the reader's own maximum applies.
#[derive(Clone, Default)]
pub struct ReadAhead(Option<Rc<ConnState>>);

impl ReadAhead {
    /// The share of a response on `conn`.
    pub fn of(conn: &Rc<ConnState>) -> Self {
        ReadAhead(Some(conn.clone()))
    }

    /// Bytes this response may read ahead now: the budget over the requests in flight.
    pub fn share(&self) -> usize {
        match &self.0 {
            Some(c) => READ_AHEAD_BUDGET / (c.in_flight().max(1) as usize),
            None => usize::MAX,
        }
    }
}

/// The state of one connection.
pub struct ConnState {
    /// The client's address.
    pub peer: SocketAddr,
    /// "HTTP/1.1" or "HTTP/2" (set once the protocol is known).
    pub protocol: Cell<&'static str>,
    /// "TLSv1.3" or "TLSv1.2" once the handshake is done; `None` on plain HTTP.
    pub tls_version: Cell<Option<&'static str>>,
    phase: Cell<Phase>,
    in_flight: Cell<u32>,
    /// Requests started on this connection so far.
    started: Cell<u64>,
    last_activity: Cell<Instant>,
    head_started: Cell<Option<Instant>>,
    /// Writes to the client have been refused (socket buffer full) since then.
    write_blocked_since: Cell<Option<Instant>>,
    responses: RefCell<Vec<Rc<Sending>>>,
    /// An HTTP/2 control-frame flood was detected on the read path.
    flood: Cell<bool>,
    /// How the connection is ending (see [`closing`]).
    closing: Cell<closing::Closing>,
    /// Woken when the deadline may have moved earlier, or the connection must close.
    pub changed: Notify,
    /// The server name the TLS client sent (SNI), lower case.
    pub sni: std::cell::OnceCell<Box<str>>,
    /// The client's verified certificate (`[listener.tls] client_auth`), taken once at the
    /// end of the handshake (a resumed session's from its ticket); unset: none.
    pub client_cert: std::cell::OnceCell<std::sync::Arc<qweb_tls::ClientCert>>,
    /// The site (by its index in the configuration) whose own `client_auth` policy the
    /// handshake ran with; `None`: the listener's (or plain HTTP).
    pub tls_policy_site: Cell<Option<usize>>,
    /// An upgrade the proxy accepted: run once the HTTP/1 exchange is over.
    pub tunnel: tunnel::TunnelSlot,
    /// The task that serves the connection (it made this state): an HTTP/2 WebSocket,
    /// which runs in a task of its own, is registered as this task's tunnel.
    pub task: Option<tokio::task::Id>,
    /// A reader that waits while requests are in flight, woken when the last one ends (see
    /// [`ConnState::wake_reader_when_idle`]).
    idle_reader: Cell<Option<std::task::Waker>>,
    /// HTTP/2 served by qweb's own layer: its connection, for the tunnels of extended
    /// CONNECT streams ([`qweb_http::h2::UpgradeId`]).
    pub h2: RefCell<std::rc::Weak<RefCell<qweb_http::h2::Connection>>>,
}

impl ConnState {
    /// A new connection from `peer`.
    pub fn new(peer: SocketAddr) -> Self {
        ConnState {
            peer,
            protocol: Cell::new("HTTP/1.1"),
            tls_version: Cell::new(None),
            phase: Cell::new(Phase::AwaitRequest),
            in_flight: Cell::new(0),
            started: Cell::new(0),
            last_activity: Cell::new(Instant::now()),
            head_started: Cell::new(None),
            write_blocked_since: Cell::new(None),
            responses: RefCell::new(Vec::new()),
            flood: Cell::new(false),
            closing: Cell::new(closing::Closing::Open),
            changed: Notify::new(),
            sni: std::cell::OnceCell::new(),
            client_cert: std::cell::OnceCell::new(),
            tls_policy_site: Cell::new(None),
            tunnel: Default::default(),
            task: tokio::task::try_id(),
            idle_reader: Cell::new(None),
            h2: RefCell::default(),
        }
    }

    /// Wakes `waker` when the last request in flight ends. For a multiplexed driver's reader,
    /// which keeps its transport's read buffer while requests are in flight (each turn of an
    /// HTTP/2 connection reads once more: freeing the buffer at each would allocate and zero
    /// it again several times a request) and must read once more after the last one, so
    /// that an idle connection frees it.
    pub fn wake_reader_when_idle(&self, waker: &std::task::Waker) {
        let held = self.idle_reader.take();
        let next = match held {
            Some(w) if w.will_wake(waker) => w,
            _ => waker.clone(),
        };
        self.idle_reader.set(Some(next));
    }

    /// The phase the connection is in.
    pub fn phase(&self) -> Phase {
        self.phase.get()
    }

    /// Requests in flight.
    #[inline]
    pub fn in_flight(&self) -> u32 {
        self.in_flight.get()
    }

    /// Requests started on this connection so far.
    pub fn requests_started(&self) -> u64 {
        self.started.get()
    }

    /// A request head was parsed and handed to the service; the request is in flight until
    /// the guard is dropped (response body finished, or the request abandoned).
    pub fn request_started_guard(self: &Rc<Self>) -> RequestGuard {
        self.head_started.set(None);
        self.in_flight.set(self.in_flight.get() + 1);
        self.started.set(self.started.get() + 1);
        self.phase.set(Phase::Serving);
        let sending = Rc::new(Sending {
            waiting_since: Cell::new(None),
            stream: STREAM.try_with(|s| s.clone()).ok(),
        });
        self.responses.borrow_mut().push(sending.clone());
        self.changed.notify_one();
        RequestGuard {
            conn: self.clone(),
            sending,
        }
    }

    fn request_done(&self, sending: &Rc<Sending>) {
        self.responses
            .borrow_mut()
            .retain(|s| !Rc::ptr_eq(s, sending));
        self.in_flight.set(self.in_flight.get().saturating_sub(1));
        if self.in_flight.get() == 0 {
            self.phase.set(Phase::AwaitRequest);
            if let Some(w) = self.idle_reader.take() {
                w.wake();
            }
        }
        self.last_activity.set(Instant::now());
        self.changed.notify_one();
    }

    /// Bytes were read from the client (with no request in flight: a head is arriving, and
    /// its deadline runs).
    #[inline]
    pub fn on_read(&self) {
        let now = Instant::now();
        self.last_activity.set(now);
        if self.in_flight.get() == 0 && self.head_started.get().is_none() {
            self.head_started.set(Some(now));
            self.phase.set(Phase::ReadingHead);
            self.changed.notify_one();
        }
    }

    /// A write to the client was refused (`blocked`) or made progress.
    #[inline]
    pub fn on_write(&self, blocked: bool) {
        if blocked {
            if self.write_blocked_since.get().is_none() {
                self.write_blocked_since.set(Some(Instant::now()));
                self.changed.notify_one();
            }
        } else {
            self.write_blocked_since.set(None);
        }
    }

    /// The read path saw an HTTP/2 control-frame flood: the connection must close.
    pub fn on_flood(&self) {
        if !self.flood.replace(true) {
            self.changed.notify_one();
        }
    }

    /// Whether a flood was detected.
    pub fn flooded(&self) -> bool {
        self.flood.get()
    }

    /// How the connection is ending.
    pub fn closing(&self) -> closing::Closing {
        self.closing.get()
    }

    /// The connection takes no more requests, for `why` (see [`closing::Closing::drain`]);
    /// its driver is woken.
    pub fn drain(&self, why: closing::Drain) {
        self.set_closing(self.closing.get().drain(why));
    }

    /// Sets how the connection is ending; its driver is woken when that changed.
    pub fn set_closing(&self, c: closing::Closing) {
        if self.closing.replace(c) != c {
            self.changed.notify_one();
        }
    }

    /// When the connection (or one of its responses) must be dealt with if nothing changes,
    /// and why. `t.head` is not used for HTTP/2 (pass the idle timeout).
    pub fn deadline(&self, t: Timeouts) -> Option<(Instant, Expiry)> {
        let write = self
            .write_blocked_since
            .get()
            .map(|s| (s + t.send, Expiry::WriteStalled));
        let phase = match self.phase.get() {
            Phase::Serving if !t.per_response => None,
            Phase::Serving => self
                .responses
                .borrow()
                .iter()
                .filter(|s| !s.stream.as_ref().is_some_and(|c| c.cancelled.get()))
                .filter_map(|s| s.waiting_since.get())
                .min()
                .map(|s| (s + t.send, Expiry::ResponseStalled)),
            Phase::ReadingHead => self.head_started.get().map(|s| (s + t.head, Expiry::Head)),
            Phase::AwaitRequest => Some((self.last_activity.get() + t.idle, Expiry::Idle)),
        };
        match (write, phase) {
            (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
            (a, b) => a.or(b),
        }
    }

    /// HTTP/2: resets every stream whose response waited for the client for `send` or
    /// longer. Returns `true` when every request in flight had stalled (the connection
    /// should be closed).
    pub fn reset_stalled_streams(&self, send: Duration) -> bool {
        let now = Instant::now();
        let responses = self.responses.borrow();
        let mut stalled = 0;
        for s in responses.iter() {
            if s.waiting_since.get().is_some_and(|w| w + send <= now) {
                stalled += 1;
                if let Some(c) = &s.stream {
                    c.cancel();
                }
            }
        }
        stalled > 0 && stalled == responses.len()
    }

    /// HTTP/2: resets every stream in flight.
    pub fn reset_all_streams(&self) {
        for s in self.responses.borrow().iter() {
            if let Some(c) = &s.stream {
                c.cancel();
            }
        }
    }
}

/// One request in flight on a connection.
pub struct RequestGuard {
    conn: Rc<ConnState>,
    sending: Rc<Sending>,
}

impl RequestGuard {
    /// The connection's state.
    pub fn conn(&self) -> &ConnState {
        &self.conn
    }

    /// The response body is about to be asked for its next chunk: whatever happens next is up
    /// to the body's source, not the client.
    #[inline]
    pub fn body_polled(&self) {
        self.sending.waiting_since.set(None);
    }

    /// The response (head or a chunk) was handed over and now waits for the client to take it.
    #[inline]
    pub fn waiting_for_client(&self) {
        if self.sending.waiting_since.get().is_none() {
            self.sending.waiting_since.set(Some(Instant::now()));
            self.conn.changed.notify_one();
        }
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.conn.request_done(&self.sending);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Wake, Waker};

    use super::*;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The reader that waits while requests are in flight is woken by the last one's end,
    /// not before, and once.
    #[tokio::test(flavor = "current_thread")]
    async fn the_idle_reader_is_woken_when_the_last_request_ends() {
        let state = Rc::new(ConnState::new("127.0.0.1:1".parse().unwrap()));
        let woken = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(woken.clone());
        let first = state.request_started_guard();
        let second = state.request_started_guard();
        state.wake_reader_when_idle(&waker);
        state.wake_reader_when_idle(&waker);
        drop(first);
        assert_eq!(
            woken.0.load(Ordering::Relaxed),
            0,
            "one request is still in flight"
        );
        drop(second);
        assert_eq!(woken.0.load(Ordering::Relaxed), 1);
        let third = state.request_started_guard();
        drop(third);
        assert_eq!(woken.0.load(Ordering::Relaxed), 1, "nobody waits now");
    }
}
