//! Connection drivers: one client connection's TLS handshake (with a deadline), then HTTP/1.1
//! (`h1/`) or HTTP/2 (`h2.rs`) by ALPN, or a QUIC connection's HTTP/3 (`h3.rs`), with the idle
//! keep-alive, request-head and send timeouts, the HTTP/2 flood budget, idle parking and
//! graceful shutdown. The state the watchdog reads, and the one `Closing` lifecycle the three
//! drivers share, live in the `qweb-session` crate.
//!
//! A driver knows no routes: like hyper-util's `serve_connection(io, service)`, [`serve`]
//! takes the worker as a [`Host`] (limits, counters, shutdown) and a [`Handle`] made for the
//! connection, which answers each request. The pipeline implements both.

pub(crate) mod h1;
pub(crate) mod h2;
pub(crate) mod h2_flood;
mod h2_own;
pub(crate) mod h3;
#[cfg(test)]
mod h3_tests;
pub(crate) mod idle;
pub(crate) mod lazy_timer;
pub(crate) mod plain_on_tls;
pub(crate) mod proxy_protocol;
#[cfg(test)]
mod test_kit;
pub(crate) mod write_burst;

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::task::{Context, Poll};

use hyper::service::service_fn;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{sleep_until, Instant};

use crate::conn::h2_flood::FloodMeter;
use crate::conn::idle::ReadReady;
use crate::conn::write_burst::WriteBurst;
use qweb_session::logged::Logged;
use qweb_session::{ConnState, StreamCancel};

thread_local! {
    /// This worker's turns for handshake steps computed in place (modes `none` and `sync`):
    /// one per thread, whatever the configuration generation, since they share its CPU.
    static HANDSHAKE_TURNS: Rc<qweb_tls::handshake::HandshakeTurns> = Rc::default();
}

/// A peer's address as logs, limits and `X-Forwarded-For` see it: an IPv4 client of a
/// dual-stack `[::]` socket (TCP or QUIC) arrives as `::ffff:a.b.c.d` and is `a.b.c.d` here.
pub(crate) fn canonical_peer(peer: SocketAddr) -> SocketAddr {
    SocketAddr::new(peer.ip().to_canonical(), peer.port())
}

/// This worker's handshake turns (TLS over TCP and QUIC share them).
pub(crate) fn handshake_turns() -> Rc<qweb_tls::handshake::HandshakeTurns> {
    HANDSHAKE_TURNS.with(Rc::clone)
}

/// What a connection driver reads from the worker that runs it.
pub(crate) trait Host: 'static {
    /// The configured limits and timeouts.
    fn limits(&self) -> &crate::config::Limits;
    /// The worker's counters (handshakes).
    fn metrics(&self) -> &qweb_observe::metrics::WorkerMetrics;
    /// Rate limit of log lines about misbehaving peers.
    fn peer_log(&self) -> &qweb_observe::log_limit::PerPeer;
    /// Becomes `true` when the server shuts down.
    fn shutdown(&self) -> tokio::sync::watch::Receiver<bool>;
    /// Becomes `true` when a reload retired the connection's configuration.
    fn retired(&self) -> tokio::sync::watch::Receiver<bool>;
    /// The access-log format for requests the HTTP/1 parser refused (`None`: no access log).
    fn refused_log(&self) -> Option<crate::config::AccessFormat>;
    /// The tunnels of the connection's generation (registered while they run).
    fn tunnels(&self) -> &Rc<qweb_session::tunnel::Tunnels>;
    /// The connections each client address holds (the server's one table, kept across
    /// reloads), counted under `[limits] connections_per_client`.
    fn client_slots(&self) -> &std::sync::Arc<qweb_session::client_slots::ClientSlots>;
}

/// A slot of `peer` in the worker's client table, or `None` (counted, logged at most once a
/// minute per address) when the address holds `connections_per_client` already.
pub(crate) fn client_slot<H: Host>(
    worker: &H,
    peer: SocketAddr,
) -> Option<qweb_session::client_slots::Slot> {
    let limit = worker.limits().connections_per_client;
    match worker.client_slots().take(peer.ip(), limit) {
        Ok(slot) => Some(slot),
        Err(_) => {
            worker.metrics().refused_per_client.fetch_add(1, Relaxed);
            if let Some(n) = worker.peer_log().hit(peer.ip()) {
                tracing::warn!(%peer, suppressed = n, limit, "connection closed: its address holds connections_per_client already");
            }
            None
        }
    }
}

/// `/metrics` of the server's client table: the addresses holding a connection now (at most
/// the open connections, since an address's entry goes with its last one).
pub(crate) struct ClientSlotsCollector(pub std::sync::Arc<qweb_session::client_slots::ClientSlots>);

impl std::fmt::Debug for ClientSlotsCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("client slots collector")
    }
}

impl prometheus_client::collector::Collector for ClientSlotsCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> std::fmt::Result {
        use prometheus_client::encoding::EncodeMetric;
        let n = i64::try_from(self.0.addresses()).unwrap_or(i64::MAX);
        let g = prometheus_client::metrics::gauge::ConstGauge::new(n);
        g.encode(encoder.encode_descriptor(
            "qweb_client_addresses",
            "Client addresses (IPv4, IPv6 /64) holding at least one connection, counted under connections_per_client (0 while it is unlimited).",
            None,
            g.metric_type(),
        )?)
    }
}

/// The client's address of a connection from `peer`, which the listener trusts for PROXY
/// headers: the header's source address (read within `header_read_timeout`). `None`: no
/// valid header in time, the connection is to be closed (counted, logged at most once a
/// minute per address).
async fn client_address<H: Host>(
    stream: &mut TcpStream,
    peer: SocketAddr,
    worker: &H,
) -> Option<SocketAddr> {
    let limit = worker.limits().header_read_timeout;
    let e = match tokio::time::timeout(limit, proxy_protocol::read(stream)).await {
        Ok(Ok(proxy_protocol::Said::Client(a))) => return Some(canonical_peer(a)),
        Ok(Ok(proxy_protocol::Said::Keep)) => return Some(peer),
        Ok(Err(e)) => e.to_string(),
        Err(_) => "no complete PROXY header within header_read_timeout".to_owned(),
    };
    worker
        .metrics()
        .proxy_protocol_refused
        .fetch_add(1, Relaxed);
    if let Some(n) = worker.peer_log().hit(peer.ip()) {
        tracing::warn!(%peer, suppressed = n, "connection from a trusted balancer closed: {e}");
    }
    None
}

/// Answers the requests of one connection.
pub(crate) trait Handle: 'static {
    /// The response to `req`; its body logs the request when it ends.
    fn call(
        self: Rc<Self>,
        req: hyper::Request<qweb_http::request_body::RequestBody>,
    ) -> impl Future<Output = hyper::Response<qweb_session::logged::Logged>> + 'static;
}

/// A TLS listener's handshake setup on this worker.
pub(crate) struct TlsListener {
    pub config: std::sync::Arc<rustls::ServerConfig>,
    /// The configurations of sites with their own `client_auth`, chosen by SNI.
    pub site_policies: Option<std::sync::Arc<qweb_tls::SitePolicies>>,
    /// Async offload: this worker's handle on the engine (handshakes run as jobs).
    pub offloader: Option<Rc<qweb_offload::Offloader>>,
    /// Full/resumed handshake counters of the listener.
    pub sessions: Option<std::sync::Arc<qweb_tls::HandshakeStats>>,
}

/// Marks reads and write progress on the connection state, and on HTTP/2 meters the client's
/// control frames (see [`crate::conn::h2_flood`]); transparent otherwise.
struct Tracked<T> {
    inner: T,
    state: Rc<ConnState>,
    /// HTTP/2: the flood meter, and how much of its GOAWAY is still to be written (boxed: an
    /// idle HTTP/1 connection keeps this wrapper, see `crate::conn::idle`).
    flood: Option<Box<(FloodMeter, usize)>>,
    /// Bytes written in a row; past `[limits] write_burst` the worker turns to the others.
    burst: WriteBurst,
}

impl<T> Tracked<T> {
    fn new(inner: T, state: &Rc<ConnState>, write_burst: usize) -> Self {
        Tracked {
            inner,
            state: state.clone(),
            flood: None,
            burst: WriteBurst::new(write_burst),
        }
    }

    /// Notes a write's outcome: progress for the send timeout and the write burst.
    fn on_write<R>(&mut self, r: &Poll<io::Result<R>>, n: impl FnOnce(&R) -> usize) {
        match r {
            Poll::Ready(Ok(v)) => {
                self.state.on_write(false);
                let n = n(v);
                self.burst.wrote(n);
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

impl<T: AsyncRead + AsyncWrite + ReadReady + Unpin> AsyncRead for Tracked<T> {
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
        let before = buf.filled().len();
        let this = &mut *self;
        // HTTP/2 reads in every turn of its connection (several a request): while requests
        // are in flight, a read that finds nothing keeps the transport's read buffer (TLS:
        // rustls' 4 KiB, allocated and zeroed again at each read otherwise); the read after
        // the last request ends frees it, so an idle connection holds none.
        let busy = this.flood.is_some() && this.state.in_flight() > 0;
        if this.flood.is_some() {
            this.inner.keep_read_buffer(busy);
        }
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if busy && r.is_pending() {
            this.state.wake_reader_when_idle(cx.waker());
        }
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.state.on_read();
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

/// HTTP/1.1 only (HTTP/2 frames its data itself): a plain TCP transport sends cached bodies
/// from their `memfd` ([`qweb_http::body::FileBytes`]), with the same write-burst turns and
/// send-timeout progress as its writes.
impl<T: AsyncWrite + ReadReady + Unpin> qweb_http::h1::write::SendFile for Tracked<T> {
    fn can_send_file(&self) -> bool {
        self.sends_files()
    }

    fn poll_send_file(
        &mut self,
        cx: &mut Context<'_>,
        file: &std::fs::File,
        offset: u64,
        len: usize,
    ) -> Option<Poll<io::Result<usize>>> {
        self.tcp_write(cx, |tcp, cx| idle::send_file(tcp, cx, file, offset, len))
    }

    fn poll_write_more(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Option<Poll<io::Result<usize>>> {
        self.tcp_write(cx, |tcp, cx| idle::write_more(tcp, cx, bufs))
    }
}

impl<T: ReadReady> Tracked<T> {
    /// Whether writes may go straight on the plain TCP socket: HTTP/1.1 (no flood meter to
    /// see the bytes) over TCP, not TLS.
    fn sends_files(&self) -> bool {
        self.flood.is_none() && self.inner.tcp().is_some()
    }

    /// A write straight on the plain TCP socket (`None` where [`Tracked::sends_files`] says
    /// no), with the same write-burst turns and send-timeout progress as the other writes.
    fn tcp_write(
        &mut self,
        cx: &mut Context<'_>,
        op: impl FnOnce(&tokio::net::TcpStream, &mut Context<'_>) -> Poll<io::Result<usize>>,
    ) -> Option<Poll<io::Result<usize>>> {
        if !self.sends_files() {
            return None;
        }
        if self.burst.poll_turn(cx).is_pending() {
            return Some(Poll::Pending);
        }
        let r = op(self.inner.tcp()?, cx);
        self.on_write(&r, |n| *n);
        Some(r)
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
        if self.flood.is_some() && self.state.flooded() {
            // After a flood: cut at the frame boundary, one buffer at a time.
            let first = bufs
                .iter()
                .find(|b| !b.is_empty())
                .map_or(&[][..], |b| &b[..]);
            return self.poll_write(cx, first);
        }
        if self.burst.poll_turn(cx).is_pending() {
            return Poll::Pending;
        }
        // Vectored for HTTP/2 too: h2 then writes a DATA frame's head and payload in one
        // call, which TLS seals as one record (one buffer at a time, it was two: the head
        // with the first KiB of payload h2 copies next to it, then the rest).
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.on_write(&r, |n| *n);
        if let Poll::Ready(Ok(n)) = r {
            self.meter_writes(bufs, n);
        }
        r
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.on_write(&r, |_| 0);
        r
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<T: ReadReady> ReadReady for Tracked<T> {
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.inner.poll_read_ready(cx)
    }

    fn keep_read_buffer(&mut self, on: bool) {
        self.inner.keep_read_buffer(on);
    }

    fn socket_fd(&self) -> std::os::fd::RawFd {
        self.inner.socket_fd()
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
/// `crate::conn::idle`).
///
/// Phase 0, before TLS: the client's address (a trusted balancer's PROXY header replaces
/// the socket's peer, see [`proxy_protocol`]), then its slot under `connections_per_client`
/// (held to the connection's end); a connection that fails either is closed at once.
pub(crate) async fn serve<H: Host, S: Handle>(
    mut stream: TcpStream,
    peer: SocketAddr,
    tls: Option<&TlsListener>,
    proxy: Option<&crate::config::ProxyProtocol>,
    worker: &H,
    service: impl FnOnce(Rc<ConnState>) -> S,
) {
    let peer = if proxy.is_some_and(|p| p.trusts(peer.ip())) {
        // boxed: its state (the header's timer) does not size every connection's task
        match Box::pin(client_address(&mut stream, peer, worker)).await {
            Some(client) => client,
            None => return,
        }
    } else {
        peer
    };
    let Some(_slot) = client_slot(worker, peer) else {
        return;
    };
    let state = Rc::new(ConnState::new(peer));
    let write_burst = worker.limits().write_burst;
    let Some(tls) = tls else {
        let io = Tracked::new(stream, &state, write_burst);
        let svc = Rc::new(service(state.clone()));
        drive(Box::new(io), false, state, worker, svc).await;
        return;
    };
    let Some(mut tls) = Box::pin(handshake(stream, &state, tls, worker)).await else {
        return;
    };
    if tls.connection().alpn_protocol() == Some(qweb_tls::ALPN_ACME) {
        // a CA checked the TLS-ALPN-01 certificate: nothing more is said (RFC 8737 section 3)
        let _ = tokio::time::timeout(
            std::time::Duration::from_secs(1),
            tokio::io::AsyncWriteExt::shutdown(&mut tls),
        )
        .await;
        return;
    }
    let (io, h2) = tls_io(tls, &state, write_burst);
    let svc = Rc::new(service(state.clone()));
    drive(Box::new(io), h2, state, worker, svc).await;
}

/// The TLS handshake (after a check for plain HTTP on the TLS port), under
/// `tls_handshake_timeout`. `None`: the connection is over.
async fn handshake<H: Host>(
    stream: TcpStream,
    state: &ConnState,
    tls: &TlsListener,
    worker: &H,
) -> Option<qweb_tls::TlsStream> {
    let peer = state.peer;
    let limits = worker.limits();
    // the first byte and the handshake share one deadline
    let deadline = tokio::time::Instant::now() + limits.tls_handshake_timeout;
    let plain = crate::conn::plain_on_tls::starts_with_plain_http(&stream);
    match tokio::time::timeout_at(deadline, plain).await {
        Ok(false) => {}
        Ok(true) => {
            tracing::debug!(%peer, "plain HTTP on a TLS port: 400");
            crate::conn::plain_on_tls::answer(stream).await;
            return None;
        }
        Err(e) => {
            handshake_outcome::<(), Infallible>(worker.metrics(), peer, "TLS handshake", Err(e));
            return None;
        }
    }
    let turns = handshake_turns();
    let driver = match &tls.offloader {
        Some(offloader) => qweb_tls::handshake::Driver::Job {
            offloader,
            gauges: &worker.metrics().handshake,
        },
        None => qweb_tls::handshake::Driver::Fair(&turns),
    };
    // A handshake in progress (perhaps paused on an offloaded signature) is not cut by
    // a shutdown: it may finish within its own timeout, bounded by the drain deadline.
    let accept = qweb_tls::handshake::accept_for_sites(
        stream,
        tls.config.clone(),
        tls.site_policies.as_deref(),
        driver,
    );
    let hs = tokio::time::timeout_at(deadline, accept).await;
    let (stream, site) = handshake_outcome(worker.metrics(), peer, "TLS handshake", hs)?;
    state.tls_policy_site.set(site);
    if let Some(s) = &tls.sessions {
        s.record(stream.connection());
    }
    Some(stream)
}

/// Counts a handshake's end (TLS over TCP, QUIC) in the worker's metrics and logs a failure
/// or a timeout (`what` names it): the one place both transports count theirs. `Some`: it
/// completed.
pub(crate) fn handshake_outcome<T, E: std::fmt::Display>(
    m: &qweb_observe::metrics::WorkerMetrics,
    peer: SocketAddr,
    what: &str,
    r: Result<Result<T, E>, tokio::time::error::Elapsed>,
) -> Option<T> {
    match r {
        Ok(Ok(done)) => {
            m.handshakes_ok.fetch_add(1, Relaxed);
            Some(done)
        }
        Ok(Err(e)) => {
            m.handshakes_failed.fetch_add(1, Relaxed);
            tracing::debug!(%peer, "{what} failed: {e}");
            None
        }
        Err(_) => {
            m.handshakes_failed.fetch_add(1, Relaxed);
            tracing::debug!(%peer, "{what} timed out");
            None
        }
    }
}

/// Notes what the handshake chose (protocol version, SNI, the client's verified
/// certificate) and wraps the stream; `true`:
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
    if let Some(c) = qweb_tls::ClientCert::of_chain(tls.connection().peer_certificates()) {
        let _ = state.client_cert.set(std::sync::Arc::new(c));
    }
    // HTTP/2: the frames of every stream ready in one turn go out in one write
    tls.set_flush_after_yield(h2);
    (Tracked::new(tls, state, write_burst), h2)
}

/// Serves HTTP on the connection's transport. `io` comes boxed: an `async fn` keeps its
/// arguments in its state beside the locals they are moved into, and the transport (with
/// rustls' connection) is its largest value.
async fn drive<T, H: Host, S: Handle>(
    io: Box<Tracked<T>>,
    h2: bool,
    state: Rc<ConnState>,
    worker: &H,
    svc: Rc<S>,
) where
    T: AsyncRead + AsyncWrite + ReadReady + Unpin + 'static,
{
    // A connection that completed its handshake after shutdown began (it was paused) still
    // gets its first request served.
    let late = *worker.shutdown().borrow();
    let protocol = if h2 {
        qweb_observe::metrics::HttpProtocol::H2
    } else {
        qweb_observe::metrics::HttpProtocol::Http1
    };
    let _open = qweb_observe::metrics::ProtocolOpen::new(worker.metrics(), protocol);
    if !h2 {
        h1::serve(io, state, worker, svc, late).await;
        return;
    }
    // Boxed: what an HTTP/2 connection holds while it lives does not size the task of every
    // connection (see `crate::conn::idle`).
    if h2::own_layer() {
        Box::pin(h2::serve_own(io, state, worker, svc)).await;
    } else {
        Box::pin(h2::serve(io, state, worker, hyper_service(svc))).await;
    }
}

/// The connection's [`Handle`] as hyper's HTTP/2 connection takes a service.
fn hyper_service<S: Handle>(svc: Rc<S>) -> impl HyperService {
    service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let svc = svc.clone();
        Box::pin(async move {
            let req = req.map(qweb_http::request_body::RequestBody::Hyper);
            let mut resp = svc.call(req).await;
            qweb_http::response::server_field(resp.headers_mut());
            Ok::<_, Infallible>(resp)
        }) as ServiceFuture
    })
}

/// What hyper's HTTP/2 connections are given: the connection's [`Handle`] behind hyper's
/// service interface, with a boxed future.
pub(crate) trait HyperService:
    hyper::service::Service<
        hyper::Request<hyper::body::Incoming>,
        Response = hyper::Response<Logged>,
        Error = Infallible,
        Future = ServiceFuture,
    > + Unpin
    + 'static
{
}

impl<T> HyperService for T where
    T: hyper::service::Service<
            hyper::Request<hyper::body::Incoming>,
            Response = hyper::Response<Logged>,
            Error = Infallible,
            Future = ServiceFuture,
        > + Unpin
        + 'static
{
}

/// The future of one request's answer.
pub(crate) type ServiceFuture =
    Pin<Box<dyn Future<Output = Result<hyper::Response<Logged>, Infallible>>>>;

pub(super) async fn sleep_or_never(deadline: Option<Instant>) {
    match deadline {
        Some(d) => sleep_until(d).await,
        None => std::future::pending().await,
    }
}
