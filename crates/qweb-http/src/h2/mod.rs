//! HTTP/2 on the wire without I/O, server side: frames ([`frame`]), one connection's state
//! ([`conn::Connection`]: streams, flow control, SETTINGS, PING, GOAWAY) and the request body
//! its streams hand to the service ([`H2Body`]). HPACK is the `h2` crate's codec (vendored,
//! its module made public). The connection driver (qweb-server's `conn/h2`) owns the I/O and
//! runs each stream's answer in its own turn, without a task per stream.

pub mod conn;
pub mod frame;

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
