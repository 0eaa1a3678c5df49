//! Idle HTTP/1 keep-alive connections hold no HTTP buffers.
//!
//! The HTTP/1 driver (`crate::conn::h1`) frees its read buffer while a connection waits for
//! its next request, and waits for the socket to become readable without one ([`ReadReady`]);
//! the buffer is allocated again when the next request's bytes arrive (as nginx frees its
//! buffers in `ngx_http_set_keepalive` and allocates them again on the next read). An idle
//! connection is its transport (the socket, or the TLS stream with rustls' own state), its
//! [`qweb_session::ConnState`] and the driver's small state.
//!
//! A connection that has served more than one request frees its buffer only after it stayed
//! idle for the driver's `PARK_AFTER` (10 ms); after its first request it does at once (most
//! connections that go idle then stay idle). Under keep-alive load the next request arrives
//! sooner, and parking for every request cost an eventfd wake-up (0.37 `write` calls per
//! request under `wrk -c8`, measured with hyper's connection) without saving memory that
//! matters. A grace for every connection was worse for bursts of new connections: 1 000
//! opened at once all held their buffers at the same time, and the allocator kept those
//! pages.
//!
//! A parked connection is idle only if its client took what it was sent: [`SendQueue`]
//! watches the socket's send queue, and a client that takes nothing for `send_timeout` is cut
//! (hostile round 3: a pipelining client that never reads).

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::Instant;

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

    /// With `on`, a read that finds nothing keeps the transport's read buffer (TLS: rustls')
    /// for the next read, and only [`ReadReady::poll_read_ready`] frees it: the HTTP/1 driver
    /// keeps it while it serves and waits idle in `poll_read_ready`.
    fn keep_read_buffer(&mut self, _on: bool) {}

    /// The plain TCP socket under the transport, when it is one (not TLS): HTTP/1.1 sends
    /// cached bodies from their files on it ([`send_file`], [`write_more`]).
    fn tcp(&self) -> Option<&TcpStream> {
        None
    }
}

/// Runs the write `op` on `tcp` once the socket is writable (again when the readiness was
/// stale: `try_io` clears it, so the next poll waits).
fn poll_try_write(
    tcp: &TcpStream,
    cx: &mut Context<'_>,
    mut op: impl FnMut() -> io::Result<usize>,
) -> Poll<io::Result<usize>> {
    loop {
        if let Err(e) = std::task::ready!(tcp.poll_write_ready(cx)) {
            return Poll::Ready(Err(e));
        }
        match tcp.try_io(tokio::io::Interest::WRITABLE, &mut op) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            r => return Poll::Ready(r),
        }
    }
}

/// Sends up to `len` bytes of `file` from `offset` on `tcp` without copying them through
/// user space (`sendfile(2)`).
pub(crate) fn send_file(
    tcp: &TcpStream,
    cx: &mut Context<'_>,
    file: &std::fs::File,
    offset: u64,
    len: usize,
) -> Poll<io::Result<usize>> {
    poll_try_write(tcp, cx, || {
        let mut at = offset;
        rustix::fs::sendfile(tcp, file, Some(&mut at), len).map_err(io::Error::from)
    })
}

/// A vectored write on `tcp` with `MSG_MORE`: more follows at once (the head before a body
/// sent from its file leaves in the body's first segment).
pub(crate) fn write_more(
    tcp: &TcpStream,
    cx: &mut Context<'_>,
    bufs: &[io::IoSlice<'_>],
) -> Poll<io::Result<usize>> {
    use rustix::net::{sendmsg, SendAncillaryBuffer, SendFlags};
    poll_try_write(tcp, cx, || {
        let mut control = SendAncillaryBuffer::default();
        sendmsg(
            tcp,
            bufs,
            &mut control,
            SendFlags::MORE | SendFlags::NOSIGNAL,
        )
        .map_err(io::Error::from)
    })
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

    fn tcp(&self) -> Option<&TcpStream> {
        Some(self)
    }

    fn socket_fd(&self) -> RawFd {
        self.as_raw_fd()
    }
}

impl ReadReady for qweb_tls::TlsStream {
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        qweb_tls::TlsStream::poll_read_ready(self, cx)
    }

    fn keep_read_buffer(&mut self, on: bool) {
        self.set_keep_read_buffer(on);
    }

    fn socket_fd(&self) -> RawFd {
        self.socket().as_raw_fd()
    }
}
