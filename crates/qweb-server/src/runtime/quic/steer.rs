//! HTTP/3 across a binary upgrade: the UDP sockets are handed to the new process, and the
//! datagrams of connections the old process still serves are forwarded to it.
//!
//! TCP needs none of this: a listening socket only accepts, and an accepted connection has a
//! socket of its own. A QUIC server has one UDP socket per worker for all its connections. So
//! after an upgrade the two processes must share each socket, and the kernel gives a datagram
//! to whichever process reads first. The approach is mvfst's "takeover" (Facebook's QUIC
//! server):
//!
//! - Every connection ID this process issues carries its *mark*, one bit (the low bit of the
//!   first byte; [`MarkedCids`]). A process started by an upgrade uses the other mark than its
//!   parent.
//! - On an upgrade the old process passes each worker's UDP socket to the new process, with one
//!   `SOCK_SEQPACKET` pair per worker socket (the *peer* channel). Worker `k` of the new process
//!   reads the socket worker `k` read: the kernel's `SO_REUSEPORT` group is unchanged, so every
//!   flow still lands on the same socket.
//! - A datagram addressed to a connection ID with the other mark (a short header, or a
//!   Handshake packet) is forwarded to the peer process through the channel, with its source
//!   address and ECN bits. The peer feeds it to its endpoint as if it had read it from the
//!   socket. Initial and 0-RTT packets carry an ID the client chose: they stay where they land.
//! - Once the new process is ready, the old one stops reading the UDP sockets and reads only
//!   its channels. It still sends on the sockets, which it keeps. Its connections finish their
//!   requests (HTTP/3 GOAWAY), then it exits. The new process then sees the channel end and
//!   handles every datagram itself: a late packet for a connection of the old process gets a
//!   stateless reset.
//!
//! Without the forwarding, an old connection's packets reach the new process, which does not
//! know the connection ID and answers with a stateless reset: the download in flight is lost.
//!
//! Limits, all documented in docs/ARCHITECTURE.md:
//! - Worker `k` of one process pairs with worker `k` of the other. A new configuration with
//!   fewer workers closes the sockets it does not adopt, and one with more binds new ones.
//!   Either changes the group, so some of the old connections' flows move to a socket whose
//!   worker has no channel to the right peer.
//! - An upgrade while the previous old process still drains is refused: its connections have
//!   the same mark as the new process's.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, IoSliceMut, Read};
use std::net::{IpAddr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::task::{Context, Poll, Waker};

use quinn::udp::{EcnCodepoint, RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};
use quinn_proto::{ConnectionId, ConnectionIdGenerator, RandomConnectionIdGenerator};
use socket2::{Domain, Socket, Type};
use tokio::io::unix::AsyncFd;

use crate::runtime::quic::filter::{Filter, Verdict, CID_LEN};

/// `addr=worker:udp_fd:channel_fd,...;addr=...`: the UDP sockets and peer channels handed
/// to the new process.
pub const QUIC_FDS_ENV: &str = "QWEB_UPGRADE_QUIC_FDS";
/// The mark (`0` or `1`) of the connection IDs the new process issues.
pub const QUIC_MARK_ENV: &str = "QWEB_UPGRADE_QUIC_MARK";

/// The largest datagram forwarded (a UDP payload can be no larger).
const MAX_DATAGRAM: usize = 65_535;
/// A forwarded datagram's header: family (1), source address (16) and port (2), ECN (1),
/// whether the destination address is known (1) and that address (16).
const HEADER: usize = 37;

/// Datagrams this process forwarded to its peer, and received from it.
pub(crate) static FORWARDED: AtomicU64 = AtomicU64::new(0);
/// Datagrams received from the peer process.
pub(crate) static RECEIVED: AtomicU64 = AtomicU64::new(0);

/// What this process inherited: its mark and the UDP sockets of an upgrade.
struct Inherited {
    mark: u8,
    sockets: Mutex<HashMap<(SocketAddr, usize), (UdpSocket, OwnedFd)>>,
}

fn inherited() -> &'static Inherited {
    static INHERITED: OnceLock<Inherited> = OnceLock::new();
    INHERITED.get_or_init(parse_inherited)
}

fn parse_inherited() -> Inherited {
    let mark = std::env::var(QUIC_MARK_ENV)
        .ok()
        .and_then(|m| m.parse::<u8>().ok())
        .map_or(0, |m| m & 1);
    let mut sockets = HashMap::new();
    if let Ok(spec) = std::env::var(QUIC_FDS_ENV) {
        for part in spec.split(';').filter(|p| !p.is_empty()) {
            let Some((addr, list)) = part.split_once('=') else {
                continue;
            };
            let Ok(addr) = addr.parse::<SocketAddr>() else {
                tracing::warn!("upgrade: ignoring {part:?} in {QUIC_FDS_ENV}");
                continue;
            };
            for entry in list.split(',').filter(|e| !e.is_empty()) {
                match adopt(addr, entry) {
                    Some((worker, udp, chan)) => {
                        sockets.insert((addr, worker), (udp, chan));
                    }
                    None => {
                        tracing::warn!("upgrade: ignoring {entry:?} for {addr} in {QUIC_FDS_ENV}")
                    }
                }
            }
        }
    }
    // not passed on to processes this one starts
    std::env::remove_var(QUIC_FDS_ENV);
    std::env::remove_var(QUIC_MARK_ENV);
    Inherited {
        mark,
        sockets: Mutex::new(sockets),
    }
}

/// `worker:udp_fd:channel_fd` of `addr`: the worker and the two fds, if both are open and the
/// UDP one is bound to `addr`.
fn adopt(addr: SocketAddr, entry: &str) -> Option<(usize, UdpSocket, OwnedFd)> {
    let mut it = entry.split(':');
    let worker = it.next()?.parse::<usize>().ok()?;
    let udp = it.next()?.parse::<RawFd>().ok()?;
    let chan = it.next()?.parse::<RawFd>().ok()?;
    if !crate::runtime::process::fd::is_open(udp) || !crate::runtime::process::fd::is_open(chan) {
        return None;
    }
    #[allow(unsafe_code)]
    // SAFETY: the previous process left both fds open for this one (they are open: probed
    // above) and named them only in QUIC_FDS_ENV, which is read once; nothing else here owns
    // them.
    let (udp, chan) = unsafe { (UdpSocket::from_raw_fd(udp), OwnedFd::from_raw_fd(chan)) };
    if udp.local_addr().ok() != Some(addr) {
        // not ours to close (it may be anything the caller passed)
        let _ = std::os::fd::IntoRawFd::into_raw_fd(udp);
        let _ = std::os::fd::IntoRawFd::into_raw_fd(chan);
        return None;
    }
    for fd in [udp.as_raw_fd(), chan.as_raw_fd()] {
        crate::runtime::process::fd::close_on_exec(fd);
    }
    Some((worker, udp, chan))
}

/// The mark of the connection IDs this process issues.
pub(crate) fn mark() -> u8 {
    inherited().mark
}

/// Worker `worker`'s UDP socket on `addr` and its channel to the previous process, when this
/// process was started by an upgrade that handed them over.
pub(crate) fn take_inherited(addr: SocketAddr, worker: usize) -> Option<(UdpSocket, OwnedFd)> {
    inherited()
        .sockets
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&(addr, worker))
}

/// Closes inherited UDP sockets no worker adopted; says how many.
pub(crate) fn close_unadopted() -> usize {
    let mut map = inherited()
        .sockets
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    for (addr, worker) in map.keys() {
        tracing::info!(
            "upgrade: the UDP socket of worker {worker} on {addr} is not adopted: closed"
        );
    }
    let n = map.len();
    map.clear();
    n
}

/// Connection IDs of [`CID_LEN`] random bytes, but for the low bit of the first, which is
/// this process's mark (see the module's comment).
pub(crate) struct MarkedCids {
    random: RandomConnectionIdGenerator,
    mark: u8,
}

impl MarkedCids {
    pub(crate) fn new(mark: u8) -> Self {
        MarkedCids {
            random: RandomConnectionIdGenerator::new(CID_LEN),
            mark: mark & 1,
        }
    }
}

impl ConnectionIdGenerator for MarkedCids {
    fn generate_cid(&mut self) -> ConnectionId {
        let cid = self.random.generate_cid();
        let mut bytes = [0u8; CID_LEN];
        bytes.copy_from_slice(&cid[..CID_LEN]);
        bytes[0] = (bytes[0] & !1) | self.mark;
        ConnectionId::new(&bytes)
    }

    fn cid_len(&self) -> usize {
        CID_LEN
    }

    fn cid_lifetime(&self) -> Option<std::time::Duration> {
        None
    }
}

/// The mark of the connection ID `datagram` is addressed to, when that ID is one a server
/// issued: a short-header packet, or a long-header Handshake packet. `None` for Initial and
/// 0-RTT packets (the ID is the client's choice), Version Negotiation and anything too short.
pub(crate) fn mark_of(datagram: &[u8]) -> Option<u8> {
    let first = *datagram.first()?;
    if first & 0x80 == 0 {
        // short header: the destination ID follows the first byte, at the length we issue
        if datagram.len() < 1 + CID_LEN {
            return None;
        }
        return Some(datagram[1] & 1);
    }
    let version = u32::from_be_bytes(datagram.get(1..5)?.try_into().ok()?);
    let handshake = match version {
        0 => return None,
        // QUIC v2 (RFC 9369) renumbered the long-header types
        0x6b33_43cf => 3,
        _ => 2,
    };
    if (first >> 4) & 0x3 != handshake || usize::from(*datagram.get(5)?) != CID_LEN {
        return None;
    }
    datagram.get(6).map(|b| b & 1)
}

/// One worker socket's state shared with the server thread: whether the worker still reads
/// the UDP socket, and the channel an upgrade hands it.
#[derive(Debug)]
pub(crate) struct Steering {
    addr: SocketAddr,
    worker: usize,
    /// A duplicate of the UDP socket, to hand over.
    udp: UdpSocket,
    /// `false` once the socket is handed to a new process that is ready: only the channel is
    /// read then.
    reading: AtomicBool,
    /// A channel to a new process, until the endpoint's driver picks it up.
    pending: Mutex<Option<OwnedFd>>,
    /// The driver has a channel to a peer process that is still there.
    has_peer: AtomicBool,
    /// The endpoint driver's waker, to pick a pending channel up.
    waker: Mutex<Option<Waker>>,
}

/// Every worker socket of this process (those whose endpoint is gone are pruned).
fn registry() -> &'static Mutex<Vec<Weak<Steering>>> {
    static REGISTRY: OnceLock<Mutex<Vec<Weak<Steering>>>> = OnceLock::new();
    REGISTRY.get_or_init(Mutex::default)
}

fn live() -> Vec<Arc<Steering>> {
    let mut reg = registry().lock().unwrap_or_else(PoisonError::into_inner);
    reg.retain(|w| w.strong_count() > 0);
    reg.iter().filter_map(Weak::upgrade).collect()
}

/// Why a binary upgrade cannot hand the UDP sockets over.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandoffError {
    /// The process this one replaced still serves HTTP/3 connections through it.
    #[error("the process this one replaced still drains its HTTP/3 connections (their datagrams are forwarded to it); try again once it has exited")]
    PreviousDraining,
    /// A socket or channel could not be made.
    #[error("cannot hand over the UDP sockets: {0}")]
    Io(#[from] io::Error),
}

/// What an upgrade passes to the new process for HTTP/3: environment and fds (inheritable
/// only for the spawn; dropped after it).
#[derive(Default)]
pub struct Handoff {
    /// Variables to set in the new process.
    pub env: Vec<(&'static str, String)>,
    /// The fds named in them.
    pub fds: Vec<OwnedFd>,
}

/// In the old process, before the new one starts: a channel per worker socket, installed on
/// this side at once (datagrams of this process's connections that the new one reads are
/// forwarded from its first read), and the other ends with duplicates of the UDP sockets to
/// pass on. If the new process does not start, its ends close and the channels end.
pub fn prepare_handoff() -> Result<Handoff, HandoffError> {
    let socks = live();
    if socks.iter().any(|s| s.has_peer.load(Relaxed)) {
        return Err(HandoffError::PreviousDraining);
    }
    let mut by_addr: HashMap<SocketAddr, Vec<String>> = HashMap::new();
    let mut out = Handoff::default();
    let mut ours = Vec::new();
    for s in &socks {
        let udp = OwnedFd::from(s.udp.try_clone()?);
        let (mine, theirs) = Socket::pair(Domain::UNIX, Type::SEQPACKET, None)?;
        by_addr.entry(s.addr).or_default().push(format!(
            "{}:{}:{}",
            s.worker,
            udp.as_raw_fd(),
            theirs.as_raw_fd()
        ));
        out.fds.push(udp);
        out.fds.push(OwnedFd::from(theirs));
        ours.push((s.clone(), OwnedFd::from(mine)));
    }
    if socks.is_empty() {
        return Ok(out);
    }
    let spec: String = by_addr
        .iter()
        .map(|(a, l)| format!("{a}={};", l.join(",")))
        .collect();
    out.env.push((QUIC_FDS_ENV, spec));
    out.env.push((QUIC_MARK_ENV, (1 - mark()).to_string()));
    for (s, fd) in ours {
        *s.pending.lock().unwrap_or_else(PoisonError::into_inner) = Some(fd);
        s.wake();
    }
    Ok(out)
}

/// In the old process, once the new one is ready: stop reading the UDP sockets (the new
/// process reads them and forwards what is this one's).
pub fn stop_reading() {
    for s in live() {
        s.reading.store(false, Relaxed);
        s.wake();
    }
}

impl Steering {
    fn wake(&self) {
        if let Some(w) = self
            .waker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            w.wake();
        }
    }
}

/// A worker's UDP socket as its QUIC endpoint sees it: the socket, and while an upgrade pairs
/// this process with another, the channel to it (see the module's comment).
pub(crate) struct SteeredSocket {
    inner: Arc<dyn AsyncUdpSocket>,
    shared: Arc<Steering>,
    mark: u8,
    peer: Mutex<Option<Peer>>,
    filter: Mutex<Filter>,
}

impl fmt::Debug for SteeredSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SteeredSocket")
            .field("inner", &self.inner)
            .field("shared", &self.shared)
            .finish_non_exhaustive()
    }
}

impl SteeredSocket {
    /// Worker `worker`'s socket `udp` on `addr`, wrapped by `runtime`; `peer`: the channel
    /// to the process that handed the socket over.
    pub(crate) fn new(
        addr: SocketAddr,
        worker: usize,
        udp: UdpSocket,
        peer: Option<OwnedFd>,
        runtime: &dyn quinn::Runtime,
    ) -> io::Result<Arc<SteeredSocket>> {
        let dup = udp.try_clone()?;
        let inner = runtime.wrap_udp_socket(udp)?;
        let shared = Arc::new(Steering {
            addr,
            worker,
            udp: dup,
            reading: AtomicBool::new(true),
            has_peer: AtomicBool::new(peer.is_some()),
            pending: Mutex::new(peer),
            waker: Mutex::new(None),
        });
        registry()
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Arc::downgrade(&shared));
        Ok(Arc::new(SteeredSocket {
            inner,
            shared,
            mark: mark(),
            peer: Mutex::new(None),
            filter: Mutex::new(Filter::new(std::time::Instant::now())),
        }))
    }

    /// Drops the datagrams of `meta[..n]` that [`Filter`] refuses, as [`Self::forward`]
    /// drops those it forwards.
    fn filter(&self, bufs: &mut [IoSliceMut<'_>], meta: &mut [RecvMeta]) {
        let now = std::time::Instant::now();
        let mut filter = self.filter.lock().unwrap_or_else(PoisonError::into_inner);
        for (m, buf) in meta.iter_mut().zip(bufs.iter_mut()) {
            retain_datagrams(m, buf, |d| filter.keep(d, now) == Verdict::Keep);
        }
    }

    /// Forwards the datagrams of `meta[..n]` addressed to the peer's connections; a buffer
    /// left with none of this process's datagrams gets length 0. `false`: the peer is gone.
    fn forward(&self, peer: &mut Peer, bufs: &mut [IoSliceMut<'_>], meta: &mut [RecvMeta]) -> bool {
        let other = 1 - self.mark;
        let mut alive = true;
        for (m, buf) in meta.iter_mut().zip(bufs.iter_mut()) {
            let meta = *m;
            retain_datagrams(m, buf, |d| {
                if mark_of(d) == Some(other) {
                    alive &= peer.send(&meta, d);
                    return false;
                }
                true
            });
        }
        alive
    }
}

/// Keeps the datagrams of one received buffer for which `keep` is true, moved to its front,
/// and sets `m.len` to what is kept. (GRO: datagrams of one flow, `m.stride` bytes each but
/// the last; those kept are moved together, so the stride still holds.)
fn retain_datagrams(m: &mut RecvMeta, buf: &mut [u8], mut keep: impl FnMut(&[u8]) -> bool) {
    let stride = m.stride.max(1);
    let data = &mut buf[..m.len];
    let (mut kept, mut at) = (0, 0);
    while at < data.len() {
        let end = (at + stride).min(data.len());
        if keep(&data[at..end]) {
            data.copy_within(at..end, kept);
            kept += end - at;
        }
        at = end;
    }
    m.len = kept;
}

impl AsyncUdpSocket for SteeredSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        self.inner.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        self.inner.try_send(transmit)
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        let mut peer = self.peer.lock().unwrap_or_else(PoisonError::into_inner);
        {
            let mut w = self
                .shared
                .waker
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *w = Some(cx.waker().clone());
            }
        }
        let pending = self
            .shared
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(fd) = pending {
            match Peer::new(fd) {
                Ok(p) => {
                    *peer = Some(p);
                    self.shared.has_peer.store(true, Relaxed);
                }
                Err(e) => tracing::warn!(worker = self.shared.worker, "QUIC upgrade channel: {e}"),
            }
        }
        if let Some(p) = peer.as_mut() {
            match p.poll_recv(cx, bufs, meta) {
                PeerRecv::Got(n) => return Poll::Ready(Ok(n)),
                PeerRecv::Gone => {
                    tracing::debug!(
                        worker = self.shared.worker,
                        "QUIC upgrade channel closed: the other process is gone"
                    );
                    *peer = None;
                    self.shared.has_peer.store(false, Relaxed);
                }
                PeerRecv::Pending => {}
            }
        }
        if !self.shared.reading.load(Relaxed) {
            // handed over: only the channel brings datagrams now
            return Poll::Pending;
        }
        let n = match self.inner.poll_recv(cx, bufs, meta) {
            Poll::Ready(Ok(n)) => n,
            other => return other,
        };
        if let Some(p) = peer.as_mut() {
            if !self.forward(p, &mut bufs[..n], &mut meta[..n]) {
                *peer = None;
                self.shared.has_peer.store(false, Relaxed);
            }
        }
        drop(peer);
        self.filter(&mut bufs[..n], &mut meta[..n]);
        // a batch left empty still goes back to quinn (as datagrams of length 0, which it
        // skips): its work limiter counts it, so a flood of dropped datagrams ends the
        // endpoint's turn like any other (issue 41, item 5)
        Poll::Ready(Ok(n))
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}

/// The channel to the other process of an upgrade.
struct Peer {
    fd: AsyncFd<Socket>,
    buf: Vec<u8>,
}

enum PeerRecv {
    Got(usize),
    Pending,
    Gone,
}

impl Peer {
    fn new(fd: OwnedFd) -> io::Result<Peer> {
        let socket = Socket::from(fd);
        socket.set_nonblocking(true)?;
        #[allow(unsafe_code)]
        // SAFETY: `socket` owns its fd, which stays open and the same for as long as the
        // `AsyncFd` owns the socket (it is dropped with it).
        let fd = unsafe { AsyncFd::register(socket) }?;
        Ok(Peer {
            fd,
            buf: Vec::new(),
        })
    }

    /// Sends one datagram to the peer. A full channel drops it (QUIC retransmits, as after a
    /// loss on the network). `false`: the peer is gone.
    fn send(&mut self, m: &RecvMeta, datagram: &[u8]) -> bool {
        self.buf.clear();
        encode(&mut self.buf, m, datagram);
        match self
            .fd
            .get_ref()
            .send_with_flags(&self.buf, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT)
        {
            Ok(_) => {
                FORWARDED.fetch_add(1, Relaxed);
                true
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => true,
            Err(_) => false,
        }
    }

    /// Datagrams the peer forwarded, into `bufs` and `meta`.
    fn poll_recv(
        &mut self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> PeerRecv {
        self.buf.resize(HEADER + MAX_DATAGRAM, 0);
        let mut n = 0;
        while n < bufs.len().min(meta.len()) {
            let mut guard = match self.fd.poll_read_ready(cx) {
                Poll::Ready(Ok(g)) => g,
                Poll::Ready(Err(_)) => return PeerRecv::Gone,
                Poll::Pending => break,
            };
            let buf = &mut self.buf;
            match guard.try_io(|fd| fd.get_ref().read(buf)) {
                Ok(Ok(0)) => return PeerRecv::Gone,
                Ok(Ok(len)) => {
                    if let Some((m, data)) = decode(&self.buf[..len]) {
                        if data.len() <= bufs[n].len() {
                            bufs[n][..data.len()].copy_from_slice(data);
                            meta[n] = m;
                            n += 1;
                            RECEIVED.fetch_add(1, Relaxed);
                        }
                    }
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(_)) => return PeerRecv::Gone,
                // not ready after all: the guard cleared the readiness; poll again
                Err(_would_block) => {}
            }
        }
        if n > 0 {
            PeerRecv::Got(n)
        } else {
            PeerRecv::Pending
        }
    }
}

/// A forwarded datagram: [`HEADER`] then the datagram.
fn encode(out: &mut Vec<u8>, m: &RecvMeta, datagram: &[u8]) {
    // (IPv4 addresses as IPv6-mapped ones, after their family)
    fn family_and_octets(ip: IpAddr) -> (u8, [u8; 16]) {
        match ip {
            IpAddr::V4(a) => (4, a.to_ipv6_mapped().octets()),
            IpAddr::V6(a) => (6, a.octets()),
        }
    }
    let (family, src) = family_and_octets(m.addr.ip());
    out.push(family);
    out.extend_from_slice(&src);
    out.extend_from_slice(&m.addr.port().to_be_bytes());
    out.push(m.ecn.map_or(0, |e| e as u8));
    let (family, dst) = m.dst_ip.map_or((0, [0; 16]), family_and_octets);
    out.push(family);
    out.extend_from_slice(&dst);
    out.extend_from_slice(datagram);
}

fn ip(family: u8, octets: &[u8]) -> Option<IpAddr> {
    let a = Ipv6Addr::from(<[u8; 16]>::try_from(octets).ok()?);
    match family {
        4 => a.to_ipv4_mapped().map(IpAddr::V4),
        6 => Some(IpAddr::V6(a)),
        _ => None,
    }
}

/// The receive metadata and the datagram of a forwarded message (`None`: malformed).
fn decode(msg: &[u8]) -> Option<(RecvMeta, &[u8])> {
    if msg.len() < HEADER {
        return None;
    }
    let (head, data) = msg.split_at(HEADER);
    let src = ip(head[0], &head[1..17])?;
    let port = u16::from_be_bytes([head[17], head[18]]);
    let dst_ip = match head[20] {
        0 => None,
        f => Some(ip(f, &head[21..37])?),
    };
    let m = RecvMeta {
        addr: SocketAddr::new(src, port),
        len: data.len(),
        stride: data.len(),
        ecn: EcnCodepoint::from_bits(head[19]),
        dst_ip,
    };
    Some((m, data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_read_from_server_issued_ids_only() {
        let mut g = MarkedCids::new(1);
        for _ in 0..64 {
            let cid = g.generate_cid();
            assert_eq!(cid.len(), CID_LEN);
            assert_eq!(cid[0] & 1, 1);
            // a short-header packet to it
            let mut short = vec![0x40];
            short.extend_from_slice(&cid);
            short.extend_from_slice(&[0; 20]);
            assert_eq!(mark_of(&short), Some(1));
            // a Handshake packet to it (QUIC v1)
            let mut hs = vec![0xe0, 0, 0, 0, 1, CID_LEN as u8];
            hs.extend_from_slice(&cid);
            hs.extend_from_slice(&[0; 20]);
            assert_eq!(mark_of(&hs), Some(1));
            // an Initial or 0-RTT packet: the client's ID, whatever its bits
            let mut initial = hs.clone();
            initial[0] = 0xc0;
            assert_eq!(mark_of(&initial), None);
            initial[0] = 0xd0;
            assert_eq!(mark_of(&initial), None);
        }
        let mut g = MarkedCids::new(0);
        assert!((0..64).all(|_| g.generate_cid()[0] & 1 == 0));
        // version negotiation, truncated packets, another ID length
        assert_eq!(
            mark_of(&[0x80, 0, 0, 0, 0, 8, 1, 1, 1, 1, 1, 1, 1, 1]),
            None
        );
        assert_eq!(mark_of(&[0x40, 1, 2]), None);
        assert_eq!(mark_of(&[0xe0, 0, 0, 0, 1, 4, 1, 1, 1, 1]), None);
        assert_eq!(mark_of(&[]), None);
    }

    #[test]
    fn a_forwarded_datagram_keeps_its_address_and_ecn() {
        for (addr, dst) in [
            ("127.0.0.1:4433", Some("127.0.0.1")),
            ("[::1]:443", None),
            ("[2001:db8::1]:65535", Some("::1")),
        ] {
            let m = RecvMeta {
                addr: addr.parse().unwrap(),
                ecn: Some(EcnCodepoint::Ce),
                dst_ip: dst.map(|d| d.parse().unwrap()),
                ..RecvMeta::default()
            };
            let mut out = Vec::new();
            encode(&mut out, &m, b"datagram");
            let (back, data) = decode(&out).expect("decodes");
            assert_eq!(data, b"datagram");
            assert_eq!(back.addr, m.addr);
            assert_eq!(back.dst_ip, m.dst_ip);
            assert_eq!(back.ecn, m.ecn);
            assert_eq!((back.len, back.stride), (8, 8));
        }
        assert!(decode(&[4; HEADER - 1]).is_none());
        let mut bad = vec![9u8; HEADER];
        bad.extend_from_slice(b"x");
        assert!(decode(&bad).is_none());
    }
}
