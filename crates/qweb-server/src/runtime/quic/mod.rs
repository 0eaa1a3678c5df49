//! HTTP/3's transport on a worker: the QUIC endpoint (quinn) of a TLS listener with
//! `http3 = true`, on its own `SO_REUSEPORT` UDP socket bound to the listener's address, and
//! the QUIC server configuration made from the listener's rustls configuration.
//!
//! quinn's endpoint and connection drivers are tasks spawned on the worker's current-thread
//! runtime, so a worker's QUIC connections run on its thread like its TCP connections; the
//! kernel spreads datagrams over the workers' sockets by 4-tuple hash (see
//! docs/ARCHITECTURE.md, "HTTP/3", for what that means to a client that changes address).

pub(crate) mod filter;
pub(crate) mod handshake;
pub mod steer;

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::rc::Rc;
use std::sync::Arc;

use socket2::{Protocol, Type};

use crate::runtime::quic::handshake::OffloadingConfig;
use crate::runtime::quic::steer::{MarkedCids, SteeredSocket};
use qweb_observe::metrics::WorkerMetrics;

/// Streams of other kinds than requests a client may have open at once: HTTP/3 needs three
/// (control, QPACK encoder and decoder); the rest is room for reserved (grease) streams.
pub(crate) const MAX_UNI_STREAMS: u32 = 8;

/// Request body bytes a client may send on one HTTP/3 stream ahead of what qweb has read
/// (QUIC stream flow control; quinn's default is 1.25 MB). As HTTP/2's stream window.
pub(crate) const STREAM_RECEIVE_WINDOW: u32 = 1024 * 1024;

/// Request body bytes a client may send on a whole connection ahead of what qweb has read.
/// quinn's default is unlimited: a client could then park `max_concurrent_streams` x the
/// stream window (128 x 1.25 MB) of bodies that a slow upstream does not take.
pub(crate) const RECEIVE_WINDOW: u32 = 2 * 1024 * 1024;

/// Response bytes a connection buffers until the client acknowledges them (quinn's default is
/// 10 MB): a client that grants credit but does not acknowledge holds at most this.
pub(crate) const SEND_WINDOW: u64 = 2 * 1024 * 1024;

/// QUIC handshakes a worker's endpoint holds before it answers more Initial packets with a
/// refusal (quinn's own default is 65 536): a flood of Initials from many ports holds at most
/// this many half-open connections per worker, each for at most `tls_handshake_timeout`.
pub(crate) const MAX_INCOMING: usize = 1024;

/// Why a listener's QUIC side could not be set up.
#[derive(Debug, thiserror::Error)]
pub(crate) enum QuicError {
    /// The rustls configuration has no TLS 1.3 suite QUIC's Initial packets can use.
    #[error("the TLS configuration has no cipher suite for QUIC")]
    NoInitialSuite,
    /// `keepalive_timeout` does not fit QUIC's idle timeout.
    #[error("keepalive_timeout is too long for QUIC's idle timeout")]
    IdleTimeout,
    /// The UDP socket.
    #[error("UDP socket: {0}")]
    Socket(#[from] io::Error),
}

/// The QUIC server configuration of a listener: its rustls configuration (certificates, SNI,
/// the offloading signing keys, tickets) with ALPN `h3` and no 0-RTT (replayable), and the
/// limits of `[limits]` as QUIC transport parameters. With `offload` (the listener's mode is
/// `async`), handshake signatures go to the worker's offloader without blocking the worker
/// (`quic_handshake`).
pub(crate) fn server_config(
    tls: &rustls::ServerConfig,
    limits: &crate::config::Limits,
    offload: Option<(Rc<qweb_offload::Offloader>, Arc<WorkerMetrics>)>,
) -> Result<quinn::ServerConfig, QuicError> {
    let mut tls = tls.clone();
    tls.alpn_protocols = vec![crate::conn::h3::ALPN_H3.to_vec()];
    // 0-RTT refused: early data could be replayed
    tls.max_early_data_size = 0;
    let crypto = Arc::new(
        quinn::crypto::rustls::QuicServerConfig::try_from(Arc::new(tls))
            .map_err(|_| QuicError::NoInitialSuite)?,
    );
    let crypto: Arc<dyn quinn::crypto::ServerConfig> = match offload {
        Some((offloader, metrics)) => Arc::new(OffloadingConfig::new(crypto, offloader, metrics)),
        None => crypto,
    };
    let mut transport = quinn::TransportConfig::default();
    transport
        .max_concurrent_bidi_streams(limits.max_concurrent_streams.into())
        .max_concurrent_uni_streams(MAX_UNI_STREAMS.into())
        .stream_receive_window(STREAM_RECEIVE_WINDOW.into())
        .receive_window(RECEIVE_WINDOW.into())
        .send_window(SEND_WINDOW)
        .max_idle_timeout(Some(
            limits
                .keepalive_timeout
                .try_into()
                .map_err(|_| QuicError::IdleTimeout)?,
        ));
    let mut config = quinn::ServerConfig::with_crypto(crypto);
    config
        .transport_config(Arc::new(transport))
        .max_incoming(MAX_INCOMING);
    Ok(config)
}

/// Worker `worker`'s QUIC endpoint on `addr` (the listener's bound address, UDP): on the UDP
/// socket and channel a binary upgrade handed over (`inherited`), else on a new socket. Its
/// connection IDs carry this process's mark (see `crate::runtime::quic::steer`).
pub(crate) fn endpoint(
    addr: SocketAddr,
    ipv6_only: bool,
    worker: usize,
    inherited: Option<(UdpSocket, std::os::fd::OwnedFd)>,
    config: quinn::ServerConfig,
) -> Result<quinn::Endpoint, QuicError> {
    let (socket, peer) = match inherited {
        Some((socket, peer)) => (socket, Some(peer)),
        // one per worker, as the listener's TCP sockets
        None => (
            crate::runtime::listen::bind_reusing_port(addr, ipv6_only, Type::DGRAM, Protocol::UDP)?
                .into(),
            None,
        ),
    };
    let socket = SteeredSocket::new(addr, worker, socket, peer, &WorkerRuntime)?;
    let mut endpoint = quinn::EndpointConfig::default();
    let mark = crate::runtime::quic::steer::mark();
    endpoint.cid_generator(move || Box::new(MarkedCids::new(mark)));
    Ok(quinn::Endpoint::new_with_abstract_socket(
        endpoint,
        Some(config),
        socket,
        Arc::new(WorkerRuntime),
    )?)
}

/// quinn's tokio runtime with its tasks (the endpoint's and each connection's driver) spawned
/// on the worker's `LocalSet` rather than beside it: what they poll may use the worker's
/// thread-local parts (an async offload's op is submitted through the worker's batching
/// offloader, which schedules its flush with `spawn_local`), and they stop with the worker's
/// other tasks.
#[derive(Debug)]
struct WorkerRuntime;

impl quinn::Runtime for WorkerRuntime {
    fn new_timer(&self, i: std::time::Instant) -> std::pin::Pin<Box<dyn quinn::AsyncTimer>> {
        quinn::TokioRuntime.new_timer(i)
    }

    fn spawn(&self, future: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>) {
        // quinn spawns from the worker's own tasks (creating the endpoint, accepting): the
        // worker's LocalSet is the current one
        tokio::task::spawn_local(future);
    }

    fn wrap_udp_socket(&self, t: UdpSocket) -> io::Result<Arc<dyn quinn::AsyncUdpSocket>> {
        quinn::TokioRuntime.wrap_udp_socket(t)
    }

    fn now(&self) -> std::time::Instant {
        quinn::TokioRuntime.now()
    }
}

/// The `Alt-Svc` value a listener with HTTP/3 on `port` sends: `h3=":PORT"; ma=MAX_AGE`.
pub(crate) fn alt_svc(port: u16, max_age: u64) -> http::HeaderValue {
    let text = format!("h3=\":{port}\"; ma={max_age}");
    // digits and ASCII punctuation only
    http::HeaderValue::from_str(&text).unwrap_or(http::HeaderValue::from_static("clear"))
}
