//! The upstream's response body on its way down ([`UpstreamBody`]), which decides whether
//! the upstream connection may go back to its pool.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use qweb_http::body::BoxError;
use tokio::time::{Instant, Sleep};

use super::body::{hop_frame, Progress};
use super::pool::UpstreamConn;
use super::Proxy;

/// The upstream's response body: streamed to the client; a pause longer than the route's
/// `timeout` between two reads ends the response with an error. The upstream connection goes
/// back to the pool only when the exchange ended cleanly: the response body read to its end
/// per its framing, the request body sent whole, and `reusable` (not a HEAD response, whose
/// framing an upstream may get wrong, and not an upgrade).
pub(super) struct UpstreamBody {
    pub inner: Incoming,
    pub conn: Option<UpstreamConn>,
    /// Counts the request as in flight to its upstream until the body is dropped.
    pub _load: Option<super::balance::Load>,
    pub proxy: Rc<Proxy>,
    pub idx: usize,
    pub request: Rc<Progress>,
    pub reusable: bool,
    pub timeout: Duration,
    pub sleep: Pin<Box<Sleep>>,
    pub done: bool,
}

impl HttpBody for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            return match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(None) => {
                    this.done = true;
                    Poll::Ready(None)
                }
                Poll::Ready(Some(Ok(f))) => {
                    this.sleep.as_mut().reset(Instant::now() + this.timeout);
                    if this.inner.is_end_stream() {
                        this.done = true;
                    }
                    if f.data_ref().is_some_and(|d| d.is_empty()) {
                        continue; // an empty chunk would become an empty DATA frame
                    }
                    Poll::Ready(Some(Ok(hop_frame(f))))
                }
                Poll::Ready(Some(Err(e))) => {
                    this.conn = None;
                    Poll::Ready(Some(Err(e.into())))
                }
                Poll::Pending => {
                    if this.sleep.as_mut().poll(cx).is_ready() {
                        this.conn = None;
                        tracing::warn!(upstream = %this.proxy.cfg.upstreams[this.idx].name, "upstream body read timed out");
                        return Poll::Ready(Some(Err("upstream read timed out".into())));
                    }
                    Poll::Pending
                }
            };
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for UpstreamBody {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            let ended = self.done || self.inner.is_end_stream();
            if ended && self.reusable && self.request.finished.get() {
                self.proxy.pool.checkin(self.idx, conn);
            }
        }
    }
}
