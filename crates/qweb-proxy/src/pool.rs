//! Idle upstream connections of one proxy route on one worker, per upstream.
//!
//! A connection comes back only when its exchange ended cleanly (see
//! [`super::response_body::UpstreamBody`]), and is handed out again only if it is still open, younger than
//! [`IDLE_MAX`], and *quiet*: nothing is waiting to be read on its socket. An upstream that sends
//! bytes after a response ended (late or stray bytes) never gets them read as the response to
//! another client's request.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use hyper::client::conn::http1::SendRequest;
use tokio::io::ReadBuf;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::body::ClientBody;

/// Idle upstream connections older than this are not reused.
pub(super) const IDLE_MAX: Duration = Duration::from_secs(30);

/// An upstream connection: hyper's request sender, and the socket (shared with hyper's
/// connection task) to check for unread bytes before reuse.
pub(super) struct UpstreamConn {
    pub sender: SendRequest<ClientBody>,
    pub socket: Rc<TcpStream>,
}

impl UpstreamConn {
    /// Still usable: hyper has not seen it close, and nothing unread is waiting on it (a
    /// readable socket between exchanges means stray bytes or a close).
    fn reusable(&self) -> bool {
        !self.sender.is_closed() && quiet(&self.socket)
    }
}

/// `true` when a non-blocking peek finds nothing to read (no bytes, no EOF, no error).
fn quiet(socket: &TcpStream) -> bool {
    let mut b = [MaybeUninit::<u8>::uninit(); 1];
    let r =
        socket2::SockRef::from(socket).recv_with_flags(&mut b, libc::MSG_PEEK | libc::MSG_DONTWAIT);
    matches!(r, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}

/// ACKs what was just read at once (Linux `TCP_QUICKACK`, which the kernel turns off again by
/// itself). An upstream with Nagle on that writes a response head and body in two sends
/// (python's http.server) holds the body until the head is ACKed; on a kept-alive connection
/// the kernel would delay that ACK by up to 40 ms, on every request.
fn quick_ack(socket: &TcpStream) {
    #[cfg(target_os = "linux")]
    let _ = socket2::SockRef::from(socket).set_quickack(true);
    #[cfg(not(target_os = "linux"))]
    let _ = socket;
}

/// The socket of an upstream connection as hyper's connection task sees it: reads and writes go
/// through tokio's readiness API, so that the pool can keep a second handle on the same socket.
pub(super) struct SharedSocket(pub Rc<TcpStream>);

impl tokio::io::AsyncRead for SharedSocket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            ready!(self.0.poll_read_ready(cx))?;
            match self.0.try_read(buf.initialize_unfilled()) {
                Ok(n) => {
                    buf.advance(n);
                    if n > 0 {
                        quick_ack(&self.0);
                    }
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl tokio::io::AsyncWrite for SharedSocket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.0.poll_write_ready(cx))?;
            match self.0.try_write(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => return Poll::Ready(r),
            }
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.0.poll_write_ready(cx))?;
            match self.0.try_write_vectored(bufs) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => return Poll::Ready(r),
            }
        }
    }
    fn is_write_vectored(&self) -> bool {
        true
    }
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(socket2::SockRef::from(&*self.0).shutdown(std::net::Shutdown::Write))
    }
}

struct Idle {
    conn: UpstreamConn,
    since: Instant,
}

/// The idle connections of each upstream of a route.
pub(super) struct Pool {
    idle: Vec<RefCell<VecDeque<Idle>>>,
    max_idle: usize,
}

impl Pool {
    /// A pool for `upstreams` upstreams keeping at most `max_idle` idle connections each.
    pub(super) fn new(upstreams: usize, max_idle: usize) -> Self {
        Pool {
            idle: (0..upstreams)
                .map(|_| RefCell::new(VecDeque::new()))
                .collect(),
            max_idle,
        }
    }

    /// The most recently used reusable idle connection to upstream `idx`; stale ones are
    /// dropped on the way.
    pub(super) fn checkout(&self, idx: usize) -> Option<UpstreamConn> {
        let mut q = self.idle[idx].borrow_mut();
        while let Some(i) = q.pop_back() {
            if i.since.elapsed() < IDLE_MAX && i.conn.reusable() {
                return Some(i.conn);
            }
        }
        None
    }

    /// Returns a connection whose exchange ended cleanly.
    pub(super) fn checkin(&self, idx: usize, conn: UpstreamConn) {
        if conn.sender.is_closed() {
            return;
        }
        let mut q = self.idle[idx].borrow_mut();
        // oldest first out when full
        if q.len() >= self.max_idle {
            q.pop_front();
        }
        if self.max_idle > 0 {
            q.push_back(Idle {
                conn,
                since: Instant::now(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::quiet;

    #[tokio::test]
    async fn quiet_sees_unread_bytes_and_eof() {
        use tokio::io::AsyncWriteExt;
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = tokio::net::TcpStream::connect(l.local_addr().unwrap())
            .await
            .unwrap();
        let (mut s, _) = l.accept().await.unwrap();
        assert!(quiet(&c));
        s.write_all(b"late").await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!quiet(&c), "unread bytes");
        let mut buf = [0u8; 4];
        c.try_read(&mut buf).unwrap();
        assert!(quiet(&c));
        drop(s);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!quiet(&c), "EOF");
    }
}
