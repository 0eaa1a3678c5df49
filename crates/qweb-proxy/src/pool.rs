//! Idle upstream connections of one proxy route on one worker, per upstream.
//!
//! A connection comes back only when its exchange ended cleanly (see
//! [`super::response_body::UpstreamBody`]), and is handed out again only if it is still open, idle
//! for less than its `idle_max` ([`IDLE_MAX`], or less when the upstream announced a shorter
//! keep-alive: [`announced_idle`]), and *quiet*: nothing is waiting to be read on its socket. While it sits in the
//! pool, hyper's connection task reads it: bytes from the upstream there (late or stray bytes,
//! a second response) end the connection, so they are never read as the response to another
//! client's request.
//!
//! Neither check sees late bytes that arrive *after* the next request went out on the
//! connection: they are read as that request's answer (and the connection stays one answer
//! behind until the upstream pauses). HTTP/1.1 does not tag responses, so nothing read off the
//! socket tells a stray response from a real one. What qweb does (issue 41, item 6) is
//! *remember*: an upstream whose connection was ended by hyper for bytes outside any response
//! ([`late_bytes`]) is distrusted for [`DISTRUST`] (renewed by each new case), and while it is,
//! its connections are handed out only after [`COOL`] idle in the pool, oldest first: late
//! bytes sent within `COOL` of a response have arrived, and ended the connection, before
//! anyone else's request could go out on it. A new connection is opened otherwise.
//!
//! Cost: for an upstream never seen doing this (the normal keep-alive path) nothing changes but
//! one `Cell` read per checkout (no syscall, no wait); the hyper error is looked at only when a
//! connection ends with one. A distrusted upstream gets a new connection per request whenever no
//! idle connection is `COOL` old (under steady traffic: no keep-alive to it). What it does not
//! cover: the first late bytes of an upstream not yet distrusted, when they land while a
//! follow-up is in flight (as in nginx, whose keep-alive cache also only closes a connection
//! that turns readable while cached), and late bytes that come more than `COOL` after their
//! response.

use std::cell::{Cell, RefCell};
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

/// How long before the end of an upstream's announced keep-alive (`Keep-Alive: timeout=N`) its
/// connection stops being reused. An upstream closes an idle connection at `N`; a request sent
/// just before that crosses the close, and a request already on the wire cannot be taken back
/// (undici keeps the same margin, `keepAliveTimeoutThreshold`).
pub(super) const KEEP_ALIVE_MARGIN: Duration = Duration::from_secs(1);

/// The idle time an upstream's response allows its connection: [`IDLE_MAX`], or its
/// `Keep-Alive: timeout=N` less [`KEEP_ALIVE_MARGIN`] when that is shorter (Node.js and Apache
/// announce 5 s, and close at 5 s). An unreadable hint leaves `IDLE_MAX`.
pub(super) fn announced_idle(headers: &http::HeaderMap) -> Duration {
    let hint = headers
        .get_all("keep-alive")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|p| {
            let (k, v) = p.split_once('=')?;
            k.trim().eq_ignore_ascii_case("timeout").then_some(v)?;
            v.trim().trim_matches('"').parse::<u64>().ok()
        })
        .min();
    match hint {
        Some(secs) => Duration::from_secs(secs)
            .saturating_sub(KEEP_ALIVE_MARGIN)
            .min(IDLE_MAX),
        None => IDLE_MAX,
    }
}

/// How long a connection of a distrusted upstream sits idle before it is reused: late bytes
/// sent up to this long after a response have arrived (and ended the connection) by then.
pub(super) const COOL: Duration = Duration::from_secs(1);

/// How long an upstream stays distrusted after it last sent bytes outside a response.
pub(super) const DISTRUST: Duration = Duration::from_secs(600);

/// When an upstream last sent bytes outside any response (per route, worker and upstream;
/// shared with the connection tasks, which see it).
#[derive(Default)]
pub(super) struct LateBytes(Cell<Option<Instant>>);

impl LateBytes {
    /// The upstream sent bytes outside a response now; `true` when it was not distrusted yet.
    pub(super) fn seen(&self) -> bool {
        let was = self.distrusted();
        self.0.set(Some(Instant::now()));
        !was
    }

    /// Seen sending late bytes less than [`DISTRUST`] ago.
    fn distrusted(&self) -> bool {
        self.0.get().is_some_and(|t| t.elapsed() < DISTRUST)
    }

    /// What the end of a connection says: `true` when hyper ended it for bytes that were no
    /// answer to any request ([`late_bytes`]), now remembered.
    pub(super) fn ended(&self, e: &hyper::Error, upstream: &str) {
        if late_bytes(e) && self.seen() {
            tracing::warn!(
                upstream,
                "upstream sent bytes outside a response: its idle connections are reused only after {COOL:?} for {DISTRUST:?}"
            );
        }
    }
}

/// hyper ended a client connection for bytes that answer no request: bytes while no request was
/// in flight, or left over behind a complete response (`Kind::UnexpectedMessage`, which hyper
/// only shows as its message; `late_bytes_are_told_apart` pins it).
pub(super) fn late_bytes(e: &hyper::Error) -> bool {
    e.to_string().contains("unexpected message")
}

/// An upstream connection: hyper's request sender, and the socket (shared with hyper's
/// connection task) to check for unread bytes before reuse.
pub(super) struct UpstreamConn {
    pub sender: SendRequest<ClientBody>,
    pub socket: Rc<TcpStream>,
    /// How long it may sit idle and still be reused ([`announced_idle`] of its last response).
    pub idle_max: Duration,
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
    late: Vec<Rc<LateBytes>>,
    max_idle: usize,
}

impl Pool {
    /// A pool for `upstreams` upstreams keeping at most `max_idle` idle connections each.
    pub(super) fn new(upstreams: usize, max_idle: usize) -> Self {
        Pool {
            idle: (0..upstreams)
                .map(|_| RefCell::new(VecDeque::new()))
                .collect(),
            late: (0..upstreams).map(|_| Rc::default()).collect(),
            max_idle,
        }
    }

    /// Upstream `idx`'s record of late bytes, for its connection tasks.
    pub(super) fn late(&self, idx: usize) -> Rc<LateBytes> {
        self.late[idx].clone()
    }

    /// The most recently used reusable idle connection to upstream `idx` or, while the
    /// upstream is distrusted, the oldest one if it has been idle for [`COOL`]; stale ones are
    /// dropped on the way.
    pub(super) fn checkout(&self, idx: usize) -> Option<UpstreamConn> {
        let mut q = self.idle[idx].borrow_mut();
        let now = Instant::now();
        loop {
            let i = if self.late[idx].distrusted() {
                // the others are younger
                q.front().filter(|i| now.duration_since(i.since) >= COOL)?;
                q.pop_front()?
            } else {
                q.pop_back()?
            };
            if now.duration_since(i.since) < i.conn.idle_max && i.conn.reusable() {
                return Some(i.conn);
            }
        }
    }

    /// Returns a connection whose exchange ended cleanly.
    pub(super) fn checkin(&self, idx: usize, conn: UpstreamConn) {
        if conn.sender.is_closed() || conn.idle_max.is_zero() {
            return;
        }
        let mut q = self.idle[idx].borrow_mut();
        if q.len() >= self.max_idle {
            if self.late[idx].distrusted() {
                // the oldest are the next to be reusable: this one goes
                return;
            }
            // oldest first out when full
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
    use super::*;

    /// `Keep-Alive: timeout=N` (any case, among other parameters, quoted) ends reuse at N - 1 s,
    /// never later than [`IDLE_MAX`]; a hint of 1 s or less means no reuse; anything unreadable
    /// leaves `IDLE_MAX`.
    #[test]
    fn an_announced_keep_alive_shortens_the_idle_time() {
        let idle = |v: &str| {
            let mut h = http::HeaderMap::new();
            h.insert("keep-alive", http::HeaderValue::from_str(v).unwrap());
            announced_idle(&h)
        };
        let s = Duration::from_secs;
        assert_eq!(idle("timeout=5"), s(4));
        assert_eq!(idle("max=100, Timeout=5"), s(4));
        assert_eq!(idle("timeout=\"3\""), s(2));
        assert_eq!(idle("timeout=1"), s(0));
        assert_eq!(idle("timeout=0"), s(0));
        assert_eq!(idle("timeout=600"), IDLE_MAX);
        assert_eq!(idle("timeout=-1"), IDLE_MAX);
        assert_eq!(idle("timeout"), IDLE_MAX);
        assert_eq!(idle("max=5"), IDLE_MAX);
        assert_eq!(announced_idle(&http::HeaderMap::new()), IDLE_MAX);
    }

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A hyper client connection over [`SharedSocket`] to a raw upstream socket (returned), its
    /// task's result on `ended`.
    async fn conn_pair() -> (
        UpstreamConn,
        TcpStream,
        tokio::sync::oneshot::Receiver<hyper::Result<()>>,
    ) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        let socket = Rc::new(c);
        let io = hyper_util::rt::TokioIo::new(SharedSocket(socket.clone()));
        let (sender, conn) = hyper::client::conn::http1::handshake::<_, ClientBody>(io)
            .await
            .unwrap();
        let (tx, ended) = tokio::sync::oneshot::channel();
        tokio::task::spawn_local(async move {
            let _ = tx.send(conn.await);
        });
        (
            UpstreamConn {
                sender,
                socket,
                idle_max: IDLE_MAX,
            },
            s,
            ended,
        )
    }

    /// One GET on `conn`, answered by `up` with `answer`; the response body read whole.
    async fn exchange(conn: &mut UpstreamConn, up: &mut TcpStream, answer: &[u8]) -> Vec<u8> {
        use http_body_util::BodyExt;
        conn.sender.ready().await.unwrap();
        let (body, _) = ClientBody::buffered(bytes::Bytes::new());
        let req = http::Request::get("/").body(body).unwrap();
        let resp = conn.sender.send_request(req);
        let mut head = [0u8; 1024];
        let n = up.read(&mut head).await.unwrap();
        assert!(head[..n].ends_with(b"\r\n\r\n"));
        up.write_all(answer).await.unwrap();
        let r = resp.await.unwrap();
        r.into_body().collect().await.unwrap().to_bytes().to_vec()
    }

    const OK: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
    const STRAY: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nSTRAY!";

    /// hyper's error for bytes outside any response is told apart from an upstream's plain
    /// close and from a response cut short (pins hyper's message, which `late_bytes` reads).
    #[tokio::test]
    async fn late_bytes_are_told_apart() {
        tokio::task::LocalSet::new()
            .run_until(async {
                // a stray response while the connection is idle
                let (mut conn, mut up, ended) = conn_pair().await;
                assert_eq!(exchange(&mut conn, &mut up, OK).await, b"ok");
                up.write_all(STRAY).await.unwrap();
                let e = ended.await.unwrap().unwrap_err();
                assert!(late_bytes(&e), "{e}");
                // bytes behind a complete response, in the same write
                let (mut conn, mut up, ended) = conn_pair().await;
                let both = [OK, b"xyz"].concat();
                assert_eq!(exchange(&mut conn, &mut up, &both).await, b"ok");
                let e = ended.await.unwrap().unwrap_err();
                assert!(late_bytes(&e), "{e}");
                // the upstream closes an idle connection: no error at all
                let (mut conn, mut up, ended) = conn_pair().await;
                assert_eq!(exchange(&mut conn, &mut up, OK).await, b"ok");
                drop(up);
                assert!(ended.await.unwrap().is_ok());
                // a response cut short: an error, not late bytes
                let (mut conn, mut up, ended) = conn_pair().await;
                conn.sender.ready().await.unwrap();
                let (body, _) = ClientBody::buffered(bytes::Bytes::new());
                let resp = conn
                    .sender
                    .send_request(http::Request::get("/").body(body).unwrap());
                let mut head = [0u8; 1024];
                let _ = up.read(&mut head).await.unwrap();
                up.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nok")
                    .await
                    .unwrap();
                let r = resp.await.unwrap();
                drop(up);
                use http_body_util::BodyExt;
                let _ = r.into_body().collect().await;
                if let Err(e) = ended.await.unwrap() {
                    assert!(!late_bytes(&e), "{e}");
                }
            })
            .await;
    }

    /// A connection ended for late bytes makes its upstream distrusted; a distrusted upstream's
    /// idle connections are handed out only once `COOL` old, oldest first, and a full pool
    /// keeps its oldest. Before that, the most recent one is handed out at once.
    #[tokio::test]
    async fn a_distrusted_upstream_connection_is_reused_only_after_cooling() {
        tokio::task::LocalSet::new()
            .run_until(async {
                let pool = Pool::new(1, 2);
                let mut ups = Vec::new();
                let mut conns = Vec::new();
                for _ in 0..3 {
                    let (mut conn, mut up, _) = conn_pair().await;
                    exchange(&mut conn, &mut up, OK).await;
                    conns.push(conn);
                    ups.push(up);
                }
                let port = |c: &UpstreamConn| c.socket.local_addr().unwrap().port();
                let ports: Vec<u16> = conns.iter().map(port).collect();
                let [c0, c1, c2] = <[UpstreamConn; 3]>::try_from(conns).ok().unwrap();
                // trusted: the most recent at once
                pool.checkin(0, c0);
                pool.checkin(0, c1);
                let c1 = pool.checkout(0).expect("reused at once");
                assert_eq!(port(&c1), ports[1]);
                let c0 = pool.checkout(0).expect("reused at once");
                assert_eq!(port(&c0), ports[0]);
                // distrusted: nothing younger than COOL
                assert!(pool.late(0).seen());
                assert!(!pool.late(0).seen(), "told once");
                pool.checkin(0, c0);
                pool.checkin(0, c1);
                assert!(
                    pool.checkout(0).is_none(),
                    "young connections are not reused"
                );
                // full: the newcomer goes, the oldest stay
                pool.checkin(0, c2);
                assert_eq!(pool.idle[0].borrow().len(), 2);
                // the oldest first once it is COOL old
                let old = Instant::now() - COOL;
                pool.idle[0].borrow_mut()[0].since = old;
                let c = pool.checkout(0).expect("cooled");
                assert_eq!(port(&c), ports[0]);
                assert!(pool.checkout(0).is_none());
                // trusted again after DISTRUST
                pool.late(0).0.set(Instant::now().checked_sub(DISTRUST));
                let c = pool.checkout(0).expect("trusted again");
                assert_eq!(port(&c), ports[1]);
                drop(ups);
            })
            .await;
    }

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
