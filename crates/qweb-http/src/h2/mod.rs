//! HTTP/2 on the wire without I/O, server side: frames ([`frame`]), one connection's state
//! ([`conn::Connection`]: streams, flow control, SETTINGS, PING, GOAWAY) and the request body
//! its streams hand to the service ([`H2Body`]). HPACK is the `h2` crate's codec (vendored,
//! its module made public). The connection driver (qweb-server's `conn/h2`) owns the I/O and
//! runs each stream's answer in its own turn, without a task per stream.

pub mod conn;
mod encode;
mod error;
pub mod frame;
mod head;

use std::cell::RefCell;
use std::rc::Rc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};

pub use conn::{Cancel, Config, ConnError, Connection, NewStream, StreamEnded};
/// HTTP/2 error codes (the `h2` crate's).
pub use h2::Reason;

/// The body of a request on stream `id`: its DATA frames, then its trailers, as the
/// connection receives them; taking a chunk gives its bytes of window back to the client.
pub struct H2Body {
    conn: Rc<RefCell<Connection>>,
    id: u32,
}

impl H2Body {
    /// The body of stream `id` of `conn`.
    pub fn new(conn: Rc<RefCell<Connection>>, id: u32) -> Self {
        H2Body { conn, id }
    }

    pub(crate) fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, StreamEnded>>> {
        self.conn.borrow_mut().poll_body(self.id, cx)
    }

    pub(crate) fn is_end_stream(&self) -> bool {
        self.conn.borrow().body_ended(self.id)
    }

    pub(crate) fn size_hint(&self) -> SizeHint {
        match self.conn.borrow().body_remaining(self.id) {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

impl Drop for H2Body {
    fn drop(&mut self) {
        // (never borrowed here: the driver drops stream tasks, and bodies with them, between
        // its calls on the connection)
        if let Ok(mut c) = self.conn.try_borrow_mut() {
            c.drop_body(self.id);
        }
    }
}

/// In the extensions of an extended CONNECT request (RFC 8441) served by qweb's own HTTP/2
/// layer: its stream, whose [`Upgrade`] the connection's state gives (extensions hold only
/// what may cross threads).
#[derive(Debug, Clone, Copy)]
pub struct UpgradeId(pub u32);

/// The way to an extended CONNECT's stream as a tunnel once the request is answered 2xx.
#[derive(Clone)]
pub struct Upgrade {
    conn: Rc<RefCell<Connection>>,
    id: u32,
}

impl Upgrade {
    /// The upgrade of stream `id` of `conn`.
    pub fn new(conn: Rc<RefCell<Connection>>, id: u32) -> Self {
        Upgrade { conn, id }
    }

    /// The stream as a tunnel, once its 2xx went out; `Err` when it was answered otherwise
    /// or reset.
    pub async fn open(self) -> Result<Tunnel, StreamEnded> {
        std::future::poll_fn(|cx| self.conn.borrow_mut().poll_tunnel(self.id, cx)).await?;
        Ok(Tunnel {
            conn: self.conn,
            id: self.id,
            read: Bytes::new(),
            eof: false,
        })
    }
}

/// An HTTP/2 stream carrying a tunnel's bytes (RFC 8441): what the client sends in DATA is
/// read, what is written goes to it in DATA (as its windows allow); shutting down ends the
/// stream's server side. Dropped with a side still open, the stream is reset (CANCEL).
pub struct Tunnel {
    conn: Rc<RefCell<Connection>>,
    id: u32,
    /// Bytes received and not yet read.
    read: Bytes,
    eof: bool,
}

fn ended(e: StreamEnded) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::ConnectionReset, e)
}

impl tokio::io::AsyncRead for Tunnel {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        while this.read.is_empty() && !this.eof {
            match std::task::ready!(this.conn.borrow_mut().poll_tunnel_read(this.id, cx)) {
                Some(Ok(d)) => this.read = d,
                Some(Err(e)) => return Poll::Ready(Err(ended(e))),
                None => this.eof = true,
            }
        }
        let n = this.read.len().min(buf.remaining());
        buf.put_slice(&this.read.split_to(n));
        Poll::Ready(Ok(()))
    }
}

impl tokio::io::AsyncWrite for Tunnel {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let mut c = self.conn.borrow_mut();
        let room = std::task::ready!(c.poll_capacity(self.id, cx)).map_err(ended)?;
        let mut d = Bytes::copy_from_slice(&buf[..buf.len().min(room)]);
        let n = d.len();
        if !c.send_data(self.id, &mut d, false) {
            return Poll::Ready(Err(ended(StreamEnded("the stream was reset"))));
        }
        Poll::Ready(Ok(n - d.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        // (the connection's driver writes what is queued)
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        self.conn
            .borrow_mut()
            .send_data(self.id, &mut Bytes::new(), true);
        Poll::Ready(Ok(()))
    }
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        if let Ok(mut c) = self.conn.try_borrow_mut() {
            c.tunnel_closed(self.id);
        }
    }
}
