//! Where a client connection keeps the tunnel its last HTTP/1.1 response started (a proxied
//! `101 Switching Protocols`, or a `CONNECT` answered 2xx), until the connection driver has
//! taken hyper apart and can hand the raw transport over.
//!
//! The driver (`crate::conn`) knows nothing of what is at the other end: it calls
//! [`Tunnel::run`] with the client's transport; the proxy implements it.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};

/// A client transport handed to a tunnel.
pub(crate) trait TunnelIo: AsyncRead + AsyncWrite + Unpin {}

impl<T: AsyncRead + AsyncWrite + Unpin> TunnelIo for T {}

/// Something that carries bytes between the client and another peer once the client's
/// HTTP/1.1 exchange is over.
pub(crate) trait Tunnel {
    /// Runs the tunnel to its end; `early` are the bytes the client sent after its request
    /// head that hyper had already read.
    fn run<'a>(
        self: Box<Self>,
        client: Box<dyn TunnelIo + 'a>,
        early: Bytes,
    ) -> Pin<Box<dyn Future<Output = ()> + 'a>>;
}

/// The slot (HTTP/1.1 only: HTTP/2 tunnels run inside their stream).
#[derive(Default)]
pub(crate) struct TunnelSlot(RefCell<Option<Box<dyn Tunnel>>>);

impl TunnelSlot {
    /// The tunnel to run once the connection's HTTP/1 exchange is over, if any.
    pub(crate) fn take(&self) -> Option<Box<dyn Tunnel>> {
        self.0.borrow_mut().take()
    }

    /// Leaves a tunnel for the connection to run.
    pub(crate) fn set(&self, t: Box<dyn Tunnel>) {
        *self.0.borrow_mut() = Some(t);
    }
}
