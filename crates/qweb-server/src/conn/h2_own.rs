//! qweb's own HTTP/2 connection: [`qweb_http::h2::Connection`] (frames, streams, flow
//! control, without I/O) driven over the connection's transport, each stream's answer a
//! future polled in the connection's own task (no task per stream, no lock). A request
//! whose answer is ready at once (a static file, a cached response) is answered in the turn
//! that read it, and every answer of a turn leaves in one write.
//!
//! The loop around it (deadlines, GOAWAY on shutdown and retirement, the flood meter) is
//! `h2.rs`'s, the same as for hyper's connection.

use std::cell::RefCell;
use std::future::Future;
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use futures_util::stream::{FuturesUnordered, StreamExt};

use http_body::Body as _;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::idle::ReadReady;
use super::{Handle, Tracked};
use qweb_http::h2::{Config, ConnError, Connection, H2Body, Reason};
use qweb_http::request_body::RequestBody;
use qweb_session::logged::Logged;
use qweb_session::{ConnState, StreamCancel};

/// The read buffer's size when bytes arrive (a frame larger than what is left reserves its
/// whole length).
const READ_SIZE: usize = 16 * 1024;

/// Reads in one turn before the connection lets the worker's other connections run.
const READS_PER_TURN: usize = 8;

/// Don't read more while this much is queued for a client that does not take it.
const READ_PAUSE: usize = 256 * 1024;

type StreamTask = Pin<Box<dyn Future<Output = ()>>>;

/// The HTTP/2 connection `h2.rs`'s loop drives: hyper's (over the `h2` crate), or qweb's
/// own ([`Own`]).
pub(super) trait H2Conn {
    /// Drives the connection; `Ready` when it is over (`Err`: why, for the log).
    fn poll_conn(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), String>>;
    /// Sends GOAWAY: the streams open are served, no new one is.
    fn graceful_shutdown(&mut self);
}

/// One HTTP/2 connection served by qweb's own layer.
pub(super) struct Own<T, S> {
    io: Box<Tracked<T>>,
    conn: Rc<RefCell<Connection>>,
    svc: Rc<S>,
    tasks: FuturesUnordered<StreamTask>,
    buf: BytesMut,
    eof: bool,
    /// The connection error sent (the connection ends once its GOAWAY is out).
    failed: Option<ConnError>,
    /// A read was skipped for a full queue (see [`READ_PAUSE`]).
    read_paused: bool,
}

impl<T, S: Handle> Own<T, S>
where
    T: AsyncRead + AsyncWrite + ReadReady + Unpin + 'static,
{
    pub(super) fn new(io: Box<Tracked<T>>, state: &ConnState, svc: Rc<S>, config: Config) -> Self {
        let conn = Rc::new(RefCell::new(Connection::new(config)));
        // (extended CONNECT streams find it there: the proxy opens their tunnels)
        *state.h2.borrow_mut() = Rc::downgrade(&conn);
        Own {
            io,
            conn,
            svc,
            tasks: FuturesUnordered::new(),
            buf: BytesMut::new(),
            eof: false,
            failed: None,
            read_paused: false,
        }
    }

    /// Starts the task of each request the last read completed.
    fn start_streams(&mut self) {
        loop {
            let Some(new) = self.conn.borrow_mut().next_request() else {
                return;
            };
            let id = new.id;
            let head = new.request.method() == http::Method::HEAD;
            let body = if new.end_stream {
                RequestBody::Empty
            } else {
                RequestBody::H2(H2Body::new(self.conn.clone(), id))
            };
            let mut req = new.request.map(|()| body);
            if new.tunnel {
                req.extensions_mut().insert(qweb_http::h2::UpgradeId(id));
            }
            let cancel = Rc::new(StreamCancel::default());
            self.conn.borrow_mut().set_task(id, cancel.clone());
            let conn = self.conn.clone();
            // boxed at once: the pipeline's future is large, and the task moves it
            let answer: Pin<Box<dyn Future<Output = hyper::Response<Logged>>>> =
                Box::pin(self.svc.clone().call(req));
            let task = async move {
                StreamCancel::run(cancel, answer_stream(conn.clone(), id, head, answer)).await;
                // (a response already complete: nothing; else the client is told)
                conn.borrow_mut().task_ended(id, Reason::CANCEL);
            };
            self.tasks.push(Box::pin(task));
        }
    }

    /// Reads what the client sent, up to [`READS_PER_TURN`] reads: `true` when something
    /// was read (or the client closed).
    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        for _ in 0..READS_PER_TURN {
            if self.eof || self.failed.is_some() {
                return Poll::Ready(Ok(()));
            }
            if self.conn.borrow().queued() >= READ_PAUSE {
                // (no read is armed: the turn that drains the queue reads again)
                self.read_paused = true;
                return Poll::Pending;
            }
            if self.buf.capacity() - self.buf.len() < 1024 {
                self.buf.reserve(READ_SIZE);
            }
            let spare = self.buf.spare_capacity_mut();
            let mut rb = ReadBuf::uninit(spare);
            match Pin::new(&mut *self.io).poll_read(cx, &mut rb) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {}
            }
            let n = rb.filled().len();
            if n == 0 {
                self.eof = true;
                return Poll::Ready(Ok(()));
            }
            // SAFETY: `poll_read` initialised the first `n` bytes of the spare capacity
            // (`ReadBuf::filled`), which directly follow the buffer's length.
            #[allow(unsafe_code)]
            unsafe {
                self.buf.set_len(self.buf.len() + n);
            }
            let r = self.conn.borrow_mut().recv(&mut self.buf);
            if let Err(e) = r {
                self.failed = Some(e);
            }
            self.start_streams();
        }
        // (more may wait: the next turn reads on)
        cx.waker().wake_by_ref();
        Poll::Ready(Ok(()))
    }

    /// Writes what is queued: `Ready` once everything is out and flushed.
    fn poll_write(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let mut c = self.conn.borrow_mut();
        let before = c.queued();
        if before > 0 {
            let r = c.out().poll_write(cx, &mut self.io);
            if c.queued() != before {
                c.wrote();
            }
            std::task::ready!(r)?;
            c.out().unflushed = true;
        }
        if c.out().unflushed {
            std::task::ready!(Pin::new(&mut *self.io).poll_flush(cx))?;
            c.out().unflushed = false;
        }
        Poll::Ready(Ok(()))
    }
}

impl<T, S: Handle> H2Conn for Own<T, S>
where
    T: AsyncRead + AsyncWrite + ReadReady + Unpin + 'static,
{
    fn poll_conn(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), String>> {
        self.conn.borrow_mut().turn(Some(cx.waker()));
        let r = self.poll_turn(cx);
        self.conn.borrow_mut().turn(None);
        r
    }

    fn graceful_shutdown(&mut self) {
        self.conn.borrow_mut().graceful_shutdown();
    }
}

impl<T, S: Handle> Own<T, S>
where
    T: AsyncRead + AsyncWrite + ReadReady + Unpin + 'static,
{
    fn poll_turn(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), String>> {
        // read (and start the requests read), answer what is ready, write it all
        let read = self.poll_read(cx);
        if let Poll::Ready(Err(e)) = read {
            return Poll::Ready(Err(format!("read: {e}")));
        }
        while let Poll::Ready(Some(())) = self.tasks.poll_next_unpin(cx) {}
        let written = self.poll_write(cx);
        if let Poll::Ready(Err(e)) = written {
            return Poll::Ready(Err(format!("write: {e}")));
        }
        if written.is_ready() && std::mem::take(&mut self.read_paused) {
            // the queue is out: read again (no read was armed while it was full)
            cx.waker().wake_by_ref();
        }
        if written.is_ready() {
            if let Some(e) = &self.failed {
                return Poll::Ready(Err(format!("{e}")));
            }
            let c = self.conn.borrow();
            if self.eof || c.is_done() && self.tasks.is_empty() {
                return Poll::Ready(Ok(()));
            }
            drop(c);
            let mut c = self.conn.borrow_mut();
            if c.open_streams() == 0 && self.buf.is_empty() {
                // idle: nothing held but what the next frames need
                self.buf = BytesMut::new();
                c.release_idle_buffers();
            }
        }
        Poll::Pending
    }
}

/// One stream's answer: the service's response, then its body as the windows allow.
async fn answer_stream(
    conn: Rc<RefCell<Connection>>,
    id: u32,
    head: bool,
    answer: impl Future<Output = hyper::Response<Logged>>,
) {
    let resp = answer.await;
    let (parts, body) = resp.into_parts();
    let end = head || body.is_end_stream();
    // (Server, Date and Content-Length are the layer's to add: `send_headers`)
    let length = body.size_hint().exact();
    if !conn
        .borrow_mut()
        .send_headers(id, parts.status, parts.headers, length, end)
        || end
    {
        return;
    }
    let mut body = pin!(body);
    loop {
        if std::future::poll_fn(|cx| conn.borrow_mut().poll_capacity(id, cx))
            .await
            .is_err()
        {
            return;
        }
        let frame = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await;
        let frame = match frame {
            None => {
                conn.borrow_mut().send_data(id, &mut Bytes::new(), true);
                return;
            }
            Some(Err(e)) => {
                tracing::debug!(stream = id, "HTTP/2 response body failed: {e}");
                conn.borrow_mut().task_ended(id, Reason::INTERNAL_ERROR);
                return;
            }
            Some(Ok(f)) => f,
        };
        let mut data = match frame.into_data() {
            Ok(d) => d,
            Err(f) => {
                if let Ok(t) = f.into_trailers() {
                    conn.borrow_mut().send_trailers(id, t);
                    return;
                }
                continue;
            }
        };
        let end = body.is_end_stream();
        loop {
            if !conn.borrow_mut().send_data(id, &mut data, end) {
                return;
            }
            if data.is_empty() {
                break;
            }
            if std::future::poll_fn(|cx| conn.borrow_mut().poll_capacity(id, cx))
                .await
                .is_err()
            {
                return;
            }
        }
        if end {
            return;
        }
    }
}
