//! The HTTP/2 connection loop: hyper's HTTP/2 server connection, watched for the keep-alive,
//! send and flood deadlines, shutdown and retirement; how the connection is ending is the
//! session's [`Closing`], as for HTTP/1 and HTTP/3.

use std::future::Future;
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;

use super::h2_flood::FloodMeter;
use super::h2_own::H2Conn;
use super::idle::{send_queue, SendQueue, QUEUE_CHECK};
use super::lazy_timer::LazyTimer;
use super::{sleep_or_never, HyperService, LocalExec, Tracked};
use super::{Host, ReadReady};
use qweb_session::closing::{Closing, Drain, GRACE};
use qweb_session::{ConnState, Expiry, Timeouts};

fn log_flood<H: Host>(worker: &H, state: &ConnState) {
    if let Some(n) = worker.peer_log().hit(state.peer.ip()) {
        tracing::warn!(peer = %state.peer, suppressed = n, "HTTP/2 control-frame flood: GOAWAY ENHANCE_YOUR_CALM, closing");
    }
}

/// Bytes h2 buffers per stream before it stops asking the response body for more (hyper's
/// default is 400 KiB). A client that grants large windows but does not read its socket has
/// every stream's data wait in memory: with this and the body's share of its connection's
/// read-ahead (`session::READ_AHEAD_BUDGET`, at least 16 KiB a chunk) a stream holds about
/// 48 KiB, a connection of 128 such streams about 6 MiB (82 MiB with hyper's defaults). A
/// stream that flows keeps a chunk and this much queued, enough to fill the socket.
const SEND_BUFFER: usize = 32 * 1024;

/// An HTTP/2 connection with nothing in flight: since when, how many requests it had started
/// then, and what its client has not taken of what it was sent (looked at [`QUEUE_CHECK`]
/// after it went quiet, then while bytes wait). Such a connection is not idle: it is closed
/// once its queue has not shrunk for `send_timeout` with no new request from its client (as
/// HTTP/1's parked connections), not kept to `keepalive_timeout`.
///
/// A request started since it went quiet ends the quiet spell, even one the loop never saw
/// in flight: a small answer is often served whole between two turns of the loop, and its
/// bytes wait unacknowledged until the client's next packet (its delayed ACK rides on the
/// next request), so a busy client's queue is rarely empty when looked at and, one answer
/// like the next, never looks shrunk (issue 41's soak: healthy connections cut every
/// `send_timeout`).
#[derive(Default)]
struct Quiet(Option<(Instant, u64, Option<SendQueue>)>);

impl Quiet {
    /// When to read the send queue next; `quiet`: nothing is in flight and no GOAWAY is out
    /// (else the state is forgotten); `started`: requests the connection has started so far
    /// (a new one starts the quiet spell over).
    fn next_check(&mut self, quiet: bool, started: u64, send_timeout: Duration) -> Option<Instant> {
        match self.0 {
            _ if !quiet => self.0 = None,
            Some((_, seen, _)) if seen == started => {}
            _ => self.0 = Some((Instant::now(), started, None)),
        }
        match self.0 {
            Some((since, _, None)) => Some(since + QUEUE_CHECK),
            Some((_, _, Some(q))) => q.next_check(send_timeout),
            None => None,
        }
    }

    /// The queue holds `unsent` bytes now, and `started` requests were started so far: `true`
    /// when the client took nothing for `send_timeout` and sent no new request.
    fn stalled(&mut self, unsent: usize, started: u64, send_timeout: Duration) -> bool {
        match &mut self.0 {
            // (a request came since: the loop starts the spell over on its next turn)
            Some((_, seen, _)) if *seen != started => false,
            Some((_, _, q @ None)) => {
                *q = Some(SendQueue::new(unsent));
                false
            }
            Some((_, _, Some(q))) => q.stalled(unsent, send_timeout),
            None => false,
        }
    }
}

type HyperConn<T, S> =
    hyper::server::conn::http2::Connection<TokioIo<Box<Tracked<T>>>, S, LocalExec>;

impl<T, S> H2Conn for Pin<Box<HyperConn<T, S>>>
where
    T: AsyncRead + AsyncWrite + ReadReady + Unpin + 'static,
    S: HyperService,
{
    fn poll_conn(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), String>> {
        self.as_mut().poll(cx).map_err(|e| format!("{e:?}"))
    }

    fn graceful_shutdown(&mut self) {
        self.as_mut().graceful_shutdown();
    }
}

/// Which HTTP/2 connection serves: qweb's own layer ([`super::h2_own`]), unless `QWEB_H2=hyper`
/// is set in the environment (read once): hyper's server over the `h2` crate, kept for a
/// release as the way back should the own layer misbehave somewhere the tests do not reach.
pub(super) fn own_layer() -> bool {
    static OWN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OWN.get_or_init(|| std::env::var("QWEB_H2").map_or(true, |v| v != "hyper"))
}

/// The flood meter on the transport, and the protocol noted.
fn prepare<T, H: Host>(io: &mut Tracked<T>, state: &ConnState, worker: &H) {
    io.flood = Some(Box::new((
        FloodMeter::new(worker.limits().h2_control_frames_per_second),
        0,
    )));
    state.protocol.set("HTTP/2");
}

/// Serves HTTP/2 on `io` with hyper's connection until the connection ends.
pub(super) async fn serve<T, H: Host>(
    mut io: Box<Tracked<T>>,
    state: Rc<ConnState>,
    worker: &H,
    service: impl HyperService,
) where
    T: AsyncRead + AsyncWrite + ReadReady + Unpin + 'static,
{
    let limits = worker.limits();
    prepare(&mut io, &state, worker);
    // hyper owns the transport from here; the send queue is read by the socket's fd, which
    // stays open while `conn` lives (to the end of this function)
    let fd = io.socket_fd();
    let io = TokioIo::new(io);
    let conn = hyper::server::conn::http2::Builder::new(LocalExec)
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        .max_header_list_size(limits.max_request_header_size as u32)
        // what h2 keeps per stream beyond the chunk it was handed (see SEND_BUFFER)
        .max_send_buf_size(SEND_BUFFER)
        // WebSocket over HTTP/2 (RFC 8441), for proxy routes
        .enable_connect_protocol()
        .serve_connection(io, service);
    run(Box::pin(conn), fd, state, worker).await;
}

/// Serves HTTP/2 on `io` with qweb's own connection layer until the connection ends.
pub(super) async fn serve_own<T, H: Host, S: super::Handle>(
    mut io: Box<Tracked<T>>,
    state: Rc<ConnState>,
    worker: &H,
    svc: Rc<S>,
) where
    T: AsyncRead + AsyncWrite + ReadReady + Unpin + 'static,
{
    let limits = worker.limits();
    prepare(&mut io, &state, worker);
    let fd = io.socket_fd();
    let config = qweb_http::h2::Config {
        max_concurrent_streams: limits.max_concurrent_streams,
        max_header_list_size: limits.max_request_header_size as u32,
        // WebSocket over HTTP/2 (RFC 8441), for proxy routes
        connect_protocol: true,
        ..qweb_http::h2::Config::default()
    };
    let conn = super::h2_own::Own::new(io, &state, svc, config);
    run(conn, fd, state, worker).await;
}

/// The loop around either connection: deadlines, drains and the flood's end.
async fn run<H: Host>(
    mut conn: impl H2Conn,
    fd: std::os::fd::RawFd,
    state: Rc<ConnState>,
    worker: &H,
) {
    let limits = worker.limits();
    let mut shutdown = worker.shutdown();
    // A reload retired this connection's configuration: HTTP/2 gets a GOAWAY (HTTP/1.1
    // responses say `Connection: close`, see `Service::handle`).
    let mut retire = worker.retired();
    let mut timer = LazyTimer::new();
    // Kept across turns of the loop: a wait made anew each turn registers with its watch or
    // `Notify` each time (7 % of a worker's time on HTTP/1 keep-alive).
    let mut shut = pin!(shutdown.wait_for(|s| *s));
    let mut retired = pin!(retire.wait_for(|r| *r));
    let mut changed = pin!(state.changed.notified());
    let timeouts = Timeouts::multiplexed(limits);
    let mut quiet = Quiet::default();
    loop {
        let queue_check = quiet.next_check(
            state.in_flight() == 0 && !state.closing().announced(),
            state.requests_started(),
            limits.send_timeout,
        );
        if state.flooded() && !matches!(state.closing(), Closing::Cutting { .. }) {
            log_flood(worker, &state);
            state.reset_all_streams();
            state.set_closing(Closing::Cutting {
                at: Instant::now() + GRACE,
            });
        }
        // A drain the client was not told of: GOAWAY, except that a retirement waits for the
        // client's first request (hyper drops a connection still in its HTTP/2 handshake,
        // and that request would be lost).
        if let Closing::Draining {
            why,
            announced: false,
            ..
        } = state.closing()
        {
            if why != Drain::Retired || state.requests_started() > 0 {
                conn.graceful_shutdown();
                state.set_closing(state.closing().announce(None));
            }
        }
        let closing = state.closing();
        timer.arm(
            state
                .deadline(timeouts)
                .filter(|(_, why)| {
                    !closing.announced() || !matches!(why, Expiry::Idle | Expiry::Head)
                })
                .map(|d| d.0),
        );
        tokio::select! {
            r = std::future::poll_fn(|cx| conn.poll_conn(cx)) => {
                if state.flooded() && !matches!(state.closing(), Closing::Cutting { .. }) {
                    // the flood ended the connection before the loop saw it
                    log_flood(worker, &state);
                }
                if let Err(text) = r {
                    if text.contains("ENHANCE_YOUR_CALM") && !state.flooded() {
                        if let Some(n) = worker.peer_log().hit(state.peer.ip()) {
                            tracing::warn!(peer = %state.peer, suppressed = n, "HTTP/2 peer misbehaved (too many resets): GOAWAY ENHANCE_YOUR_CALM");
                        }
                    } else {
                        tracing::debug!(peer = %state.peer, "HTTP/2 connection error: {text}");
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
                            if state.reset_stalled_streams(limits.send_timeout)
                                && !matches!(state.closing(), Closing::Cutting { .. })
                            {
                                // Every stream waits on a client that takes nothing.
                                tracing::debug!(peer = %state.peer, "closing: {}", why.as_str());
                                conn.graceful_shutdown();
                                state.reset_all_streams();
                                state.set_closing(Closing::Cutting { at: Instant::now() + GRACE });
                            }
                        }
                        Expiry::Idle | Expiry::Head if !state.closing().announced() => {
                            conn.graceful_shutdown();
                            let drained = state.closing().drain(Drain::Idle);
                            state.set_closing(drained.announce(Some(Instant::now() + GRACE)));
                        }
                        // (already closing: a timer armed before the GOAWAY)
                        Expiry::Idle | Expiry::Head => {}
                    },
                    _ => {}
                }
            }
            _ = sleep_or_never(queue_check) => {
                let left = send_queue(fd);
                if quiet.stalled(left, state.requests_started(), limits.send_timeout) {
                    tracing::debug!(peer = %state.peer, unsent = left, "closing: the client takes nothing of what it was sent (send_timeout)");
                    return;
                }
            }
            _ = sleep_or_never(closing.deadline()) => match state.closing() {
                // (a GOAWAY for idleness, and a request came after all: it finishes)
                c @ Closing::Draining { .. } if state.in_flight() > 0 => {
                    state.set_closing(c.announce(None));
                }
                _ => return,
            },
            // (each polled again only while its guard holds, never after it completed)
            _ = shut.as_mut(), if !state.closing().shutting_down() => state.drain(Drain::Shutdown),
            _ = retired.as_mut(), if state.closing().is_open() => state.drain(Drain::Retired),
        }
    }
}

/// vendor/h2's write path over a transport that counts flushes (mock IO: an in-memory pipe).
#[cfg(test)]
mod write_tests {
    use std::pin::Pin;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    use std::sync::Arc;
    use std::task::{Context, Poll};

    use bytes::Bytes;
    use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};

    /// Counts the flushes asked of the transport: over TLS each one writes the records held
    /// so far to the socket.
    struct CountFlushes {
        inner: DuplexStream,
        flushes: Arc<AtomicUsize>,
        /// Every byte written, for the frame sizes.
        written: Arc<std::sync::Mutex<Vec<u8>>>,
    }

    impl CountFlushes {
        fn new(inner: DuplexStream) -> Self {
            CountFlushes {
                inner,
                flushes: Arc::default(),
                written: Arc::default(),
            }
        }
    }

    /// The payload lengths of the DATA frames in `bytes` (a client's preface skipped).
    fn data_frame_lengths(bytes: &[u8]) -> Vec<usize> {
        let mut rest = bytes
            .strip_prefix(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .unwrap_or(bytes);
        let mut lengths = Vec::new();
        while rest.len() >= 9 {
            let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
            if rest[3] == 0 {
                lengths.push(len);
            }
            rest = &rest[(9 + len).min(rest.len())..];
        }
        lengths
    }

    impl AsyncRead for CountFlushes {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.inner).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for CountFlushes {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            let this = &mut *self;
            let written = Pin::new(&mut this.inner).poll_write(cx, buf);
            if let Poll::Ready(Ok(n)) = written {
                this.written.lock().unwrap().extend_from_slice(&buf[..n]);
            }
            written
        }
        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            self.flushes.fetch_add(1, Relaxed);
            Pin::new(&mut self.inner).poll_flush(cx)
        }
        fn poll_shutdown(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }

    /// A response of seven DATA frames, all sendable at once, reaches the transport with one
    /// flush or two, not one per frame: h2 made room for each next frame by flushing the
    /// transport (over TLS, one `writev` per 16 KiB frame), where writing the frame into it
    /// is enough (vendor/h2 `FramedWrite::poll_ready`); it flushes once nothing more is ready.
    #[tokio::test]
    async fn data_frames_are_not_flushed_one_by_one() {
        let (client_io, server_io) = tokio::io::duplex(1 << 20);
        let server_io = CountFlushes::new(server_io);
        let (flushes, written) = (server_io.flushes.clone(), server_io.written.clone());
        let body: Bytes = (0..100 * 1024).map(|i| (i % 251) as u8).collect();
        let sent = body.clone();
        let (at_send, at_send_rx) = tokio::sync::oneshot::channel();
        let counted = flushes.clone();
        let server = tokio::spawn(async move {
            let mut conn = h2::server::handshake(server_io).await.unwrap();
            let (_req, mut respond) = conn.accept().await.unwrap().unwrap();
            let mut stream = respond
                .send_response(http::Response::new(()), false)
                .unwrap();
            // the headers and the body go out in the connection's next turn
            let _ = at_send.send(counted.load(Relaxed));
            stream.send_data(sent, true).unwrap();
            // drive the connection until the client goes away
            while let Some(r) = conn.accept().await {
                if r.is_err() {
                    break;
                }
            }
        });
        let (mut client, conn) = h2::client::Builder::new()
            .initial_window_size(1 << 20)
            .initial_connection_window_size(1 << 20)
            .handshake::<_, Bytes>(client_io)
            .await
            .unwrap();
        let driver = tokio::spawn(conn);
        let req = http::Request::get("https://example.com/").body(()).unwrap();
        let (resp, _) = client.send_request(req, true).unwrap();
        let resp = resp.await.unwrap();
        let before = at_send_rx.await.unwrap();
        let mut got = Vec::new();
        let mut rx = resp.into_body();
        while let Some(chunk) = rx.data().await {
            let chunk = chunk.unwrap();
            let _ = rx.flow_control().release_capacity(chunk.len());
            got.extend_from_slice(&chunk);
        }
        let n = flushes.load(Relaxed) - before;
        assert!(got == body, "bytes differ");
        assert!(n <= 2, "{n} flushes for a HEADERS frame and 7 DATA frames");
        // the server's DATA frames fill one TLS record each with their heads
        let lengths = data_frame_lengths(&written.lock().unwrap());
        assert_eq!(lengths.iter().max(), Some(&16_375), "{lengths:?}");
        drop(client);
        driver.abort();
        server.abort();
    }

    /// The largest DATA frame a client writes with `max_send_data_frame_size` set as given
    /// (100 KiB of request body to a server granting 1 MiB of window).
    async fn client_data_frames(max: Option<Option<u32>>) -> Vec<usize> {
        let (client_io, server_io) = tokio::io::duplex(1 << 20);
        let client_io = CountFlushes::new(client_io);
        let written = client_io.written.clone();
        let server = tokio::spawn(async move {
            let mut conn = h2::server::Builder::new()
                .initial_window_size(1 << 20)
                .initial_connection_window_size(1 << 20)
                .handshake::<_, Bytes>(server_io)
                .await
                .unwrap();
            let (req, mut respond) = conn.accept().await.unwrap().unwrap();
            let driver = tokio::spawn(async move { while conn.accept().await.is_some() {} });
            let mut body = req.into_body();
            let mut got = 0;
            while let Some(chunk) = body.data().await {
                let chunk = chunk.unwrap();
                let _ = body.flow_control().release_capacity(chunk.len());
                got += chunk.len();
            }
            let _ = respond.send_response(http::Response::new(()), true);
            driver.abort();
            got
        });
        let mut builder = h2::client::Builder::new();
        if let Some(max) = max {
            builder.max_send_data_frame_size(max);
        }
        let (mut client, conn) = builder.handshake::<_, Bytes>(client_io).await.unwrap();
        let driver = tokio::spawn(conn);
        let req = http::Request::post("http://upstream/").body(()).unwrap();
        let (_resp, mut send) = client.send_request(req, false).unwrap();
        let body: Bytes = vec![7u8; 100 * 1024].into();
        send.reserve_capacity(body.len());
        send.send_data(body, true).unwrap();
        assert_eq!(server.await.unwrap(), 100 * 1024);
        driver.abort();
        let lengths = data_frame_lengths(&written.lock().unwrap());
        drop(client);
        lengths
    }

    /// The DATA frame cap is the server's default only: the proxy's own HTTP/2 client (hyper
    /// over h2's client) writes frames as large as the upstream allows, unless asked.
    #[tokio::test]
    async fn the_data_frame_cap_is_a_server_default_a_client_does_not_inherit() {
        let lengths = client_data_frames(None).await;
        assert_eq!(lengths.iter().max(), Some(&16_384), "{lengths:?}");
        let lengths = client_data_frames(Some(Some(16_375))).await;
        assert_eq!(lengths.iter().max(), Some(&16_375), "{lengths:?}");
        let lengths = client_data_frames(Some(None)).await;
        assert_eq!(lengths.iter().max(), Some(&16_384), "{lengths:?}");
    }
}

/// The HTTP/2 loop over in-memory I/O (`conn/test_kit.rs`) with the `h2` crate's client and
/// the clock paused: idle GOAWAY, shutdown and retirement drains, and the send deadline; each
/// test runs with hyper's connection and with qweb's own (`_own`).
#[cfg(test)]
mod loop_tests {
    use std::time::Duration;

    use bytes::Bytes;
    use tokio::time::Instant;

    use super::super::test_kit::{local, parts, TestHost};
    use crate::config::Limits;

    fn limits() -> Limits {
        Limits {
            keepalive_timeout: Duration::from_secs(30),
            send_timeout: Duration::from_secs(20),
            ..Limits::default()
        }
    }

    /// The driver on a new connection (`own`: qweb's own layer, else hyper's), an HTTP/2
    /// client on its other end; the driver's task and the client's connection task.
    async fn connect(
        own: bool,
        limits: Limits,
        pipe: usize,
        before: impl FnOnce(&TestHost),
    ) -> (
        std::rc::Rc<TestHost>,
        h2::client::SendRequest<Bytes>,
        tokio::task::JoinHandle<()>,
    ) {
        let (p, client) = parts(limits, pipe);
        before(&p.host);
        let host = p.host.clone();
        let served = tokio::task::spawn_local(async move {
            if own {
                super::serve_own(p.io, p.state, &*p.host, p.svc).await;
            } else {
                let service = super::super::hyper_service(p.svc);
                super::serve(p.io, p.state, &*p.host, service).await;
            }
        });
        let (send, conn) = h2::client::Builder::new()
            .handshake::<_, Bytes>(client)
            .await
            .expect("the HTTP/2 handshake");
        tokio::task::spawn_local(async move {
            let _ = conn.await;
        });
        (host, send, served)
    }

    async fn get(send: &mut h2::client::SendRequest<Bytes>, path: &str) -> (u16, Vec<u8>) {
        request(send, "GET", path, None).await
    }

    /// A request with an optional body; the status and the body of its response.
    async fn request(
        send: &mut h2::client::SendRequest<Bytes>,
        method: &str,
        path: &str,
        body: Option<Bytes>,
    ) -> (u16, Vec<u8>) {
        let req = http::Request::builder()
            .method(method)
            .uri(format!("https://t{path}"))
            .body(())
            .unwrap();
        let mut send = send.clone().ready().await.expect("a stream");
        let (resp, mut tx) = send.send_request(req, body.is_none()).expect("sent");
        if let Some(b) = body {
            tx.reserve_capacity(b.len());
            tx.send_data(b, true).expect("the body sent");
        }
        let resp = resp.await.expect("a response");
        let status = resp.status().as_u16();
        let mut body = resp.into_body();
        let mut got = Vec::new();
        while let Some(d) = body.data().await {
            let d = d.expect("data");
            let _ = body.flow_control().release_capacity(d.len());
            got.extend_from_slice(&d);
        }
        (status, got)
    }

    async fn ends_within(served: tokio::task::JoinHandle<()>, secs: u64) -> u64 {
        let t0 = Instant::now();
        tokio::time::timeout(Duration::from_secs(secs), served)
            .await
            .expect("the driver ended")
            .expect("without a panic");
        t0.elapsed().as_secs()
    }

    /// Each test once per connection: hyper's, and qweb's own (`NAME_own`).
    macro_rules! both {
        ($($name:ident, $own:ident => $body:ident;)*) => {$(
            #[tokio::test(start_paused = true)]
            async fn $name() {
                local($body(false)).await;
            }
            #[tokio::test(start_paused = true)]
            async fn $own() {
                local($body(true)).await;
            }
        )*};
    }

    both! {
        an_idle_connection_gets_goaway_after_the_keepalive_timeout,
        an_idle_connection_gets_goaway_after_the_keepalive_timeout_own => idle_goaway;
        a_shutdown_lets_the_stream_in_flight_finish,
        a_shutdown_lets_the_stream_in_flight_finish_own => shutdown_drains;
        a_retirement_before_the_first_request_still_serves_it,
        a_retirement_before_the_first_request_still_serves_it_own => retired_first;
        a_client_that_takes_nothing_is_cut_after_the_send_timeout,
        a_client_that_takes_nothing_is_cut_after_the_send_timeout_own => takes_nothing;
        bodies_both_ways_arrive_whole,
        bodies_both_ways_arrive_whole_own => bodies;
        a_stream_the_client_resets_stops_its_answer,
        a_stream_the_client_resets_stops_its_answer_own => client_reset;
    }

    async fn idle_goaway(own: bool) {
        let (_host, mut send, served) = connect(own, limits(), 64 << 10, |_| {}).await;
        assert_eq!(get(&mut send, "/").await, (200, b"hello".to_vec()));
        // (the client keeps its handle: dropping it would close the connection itself)
        let t = ends_within(served, 600).await;
        assert!((30..=31).contains(&t), "ended after {t} s");
        drop(send);
    }

    async fn shutdown_drains(own: bool) {
        let (host, send, served) = connect(own, limits(), 64 << 10, |_| {}).await;
        let slow = tokio::task::spawn_local({
            let mut send = send.clone();
            async move { get(&mut send, "/slow").await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        host.shutdown.send_replace(true);
        assert_eq!(slow.await.unwrap(), (200, b"slow".to_vec()));
        // no new stream after the GOAWAY
        let late = send.clone().ready().await;
        assert!(
            late.is_err() || {
                let req = http::Request::builder().uri("https://t/").body(()).unwrap();
                match late.unwrap().send_request(req, true) {
                    Ok((resp, _)) => resp.await.is_err(),
                    Err(_) => true,
                }
            }
        );
        drop(send);
        assert!(ends_within(served, 10).await <= 5);
    }

    /// A retirement that finds the connection before its first request waits for it: the
    /// request is served, then GOAWAY (hyper would drop a connection still in its handshake).
    async fn retired_first(own: bool) {
        let (_host, mut send, served) = connect(own, limits(), 64 << 10, |h| {
            h.retire.send_replace(true);
        })
        .await;
        assert_eq!(get(&mut send, "/").await, (200, b"hello".to_vec()));
        drop(send);
        assert!(ends_within(served, 10).await <= 2);
    }

    /// A client that opens a large response and never takes a byte: the stream is reset and
    /// the connection cut after `send_timeout` (and its grace), not kept to the keep-alive.
    async fn takes_nothing(own: bool) {
        let (_host, send, served) = connect(own, limits(), 64 << 10, |_| {}).await;
        let req = http::Request::builder()
            .uri("https://t/bigstream")
            .body(())
            .unwrap();
        let mut ready = send.ready().await.expect("a stream");
        let (resp, _) = ready.send_request(req, true).expect("sent");
        let resp = resp.await.expect("the head");
        let _body = resp.into_body(); // never read: no window given back
        let t = ends_within(served, 600).await;
        assert!((20..=22).contains(&t), "ended after {t} s");
    }

    /// A 100 KiB request body (past the client's first window), a 1 MiB response in one
    /// piece and one in 16 KiB chunks (past the 64 KiB window the client grants), and a body
    /// of unknown length, several at once.
    async fn bodies(own: bool) {
        let (_host, send, _served) = connect(own, limits(), 64 << 10, |_| {}).await;
        let body = Bytes::from(vec![7u8; 100 << 10]);
        let mut tasks = Vec::new();
        for path in ["/echo", "/big", "/bigstream", "/stream", "/echo"] {
            let mut send = send.clone();
            let body = body.clone();
            tasks.push(tokio::task::spawn_local(async move {
                if path == "/echo" {
                    request(&mut send, "POST", path, Some(body)).await
                } else {
                    get(&mut send, path).await
                }
            }));
        }
        let mut got = Vec::new();
        for t in tasks {
            let (status, body) = t.await.unwrap();
            assert_eq!(status, 200);
            got.push(body);
        }
        assert_eq!(got[0], b"102400");
        assert_eq!(got[1], vec![b'x'; 1 << 20]);
        assert_eq!(got[2], vec![b'y'; 1 << 20]);
        assert_eq!(got[3], b"one two three");
        assert_eq!(got[4], b"102400");
    }

    /// A client resets a stream whose answer is still being made: the connection serves on.
    async fn client_reset(own: bool) {
        let (_host, mut send, _served) = connect(own, limits(), 64 << 10, |_| {}).await;
        let req = http::Request::builder()
            .uri("https://t/slow")
            .body(())
            .unwrap();
        let mut ready = send.clone().ready().await.expect("a stream");
        let (resp, mut tx) = ready.send_request(req, true).expect("sent");
        tokio::time::sleep(Duration::from_secs(1)).await;
        tx.send_reset(h2::Reason::CANCEL);
        assert!(resp.await.is_err());
        assert_eq!(get(&mut send, "/").await, (200, b"hello".to_vec()));
    }
}
