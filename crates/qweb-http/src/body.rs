//! The response body type and its constructors (the wrapper that counts bytes and logs the
//! request is `session/logged.rs`, a layer above).

use std::pin::Pin;

use bytes::Bytes;
use http_body::Body as HttpBody;
use http_body_util::{BodyExt, Empty, Full};

/// Errors a body can yield.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Every response body qweb produces. Bodies live on their worker, so they need not be
/// `Send` (an upstream body holds the worker's connection pool).
pub type Body = Pin<Box<dyn HttpBody<Data = Bytes, Error = BoxError>>>;

/// Bytes that are also the whole content of a sealed file (a cached body in a `memfd`): a body
/// chunk that lies inside [`FileBytes::bytes`] can be sent from the file instead
/// (`sendfile(2)`: the kernel takes the pages without copying them from user space). Put on a
/// response's extensions by the handler that made the body; the HTTP/1.1 writer looks at each
/// chunk's address, so a body that a later phase replaced (compression) is written as usual.
#[derive(Debug, Clone)]
pub struct FileBytes {
    /// The file; its content must never change while this lives (a sealed `memfd`).
    pub file: std::sync::Arc<std::fs::File>,
    /// The file's whole content, mapped.
    pub bytes: Bytes,
}

impl FileBytes {
    /// Where `chunk` starts in the file, when it is a part of [`FileBytes::bytes`] (the same
    /// memory: its bytes are the file's there).
    pub fn offset_of(&self, chunk: &[u8]) -> Option<u64> {
        let base = self.bytes.as_ptr() as usize;
        let at = chunk.as_ptr() as usize;
        (at >= base && at + chunk.len() <= base + self.bytes.len()).then(|| (at - base) as u64)
    }
}

/// Boxes a body.
pub fn boxed<B>(b: B) -> Body
where
    B: HttpBody<Data = Bytes, Error = BoxError> + 'static,
{
    Box::pin(b)
}

/// A body of known bytes.
pub fn full(b: impl Into<Bytes>) -> Body {
    boxed(Full::new(b.into()).map_err(|never| match never {}))
}

/// An empty body.
pub fn empty() -> Body {
    boxed(Empty::new().map_err(|never| match never {}))
}

/// How much of a request body its handler did not take [`DrainAfter`] reads at most.
pub const DRAIN_BYTES: usize = 64 * 1024;
/// How long [`DrainAfter`] waits at most for the rest of a request body.
pub const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(2);

/// An HTTP/2 response body that, once its own bytes are out, reads and discards the rest of
/// its request's body (which the handler did not take: a static file, a redirect, a refusal)
/// before it ends. The response's stream then ends after the request's, so what the client
/// still sends on it (a DATA frame beyond its `content-length`, a pseudo-header in its
/// trailers) is an error of an open stream, answered the same way every time (RST_STREAM
/// PROTOCOL_ERROR, RFC 9113 §8.1.1), not a frame on a stream already closed whose answer
/// depends on timing. nginx likewise discards an unread request body. Bounded: after
/// [`DRAIN_BYTES`] or [`DRAIN_TIME`] the response ends anyway (and h2 resets the request's
/// side with NO_ERROR, as before).
pub struct DrainAfter<R> {
    inner: Body,
    /// The request body still to read (`None`: read, or given up).
    request: Option<R>,
    left: usize,
    /// Started when `inner` ended.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<R> DrainAfter<R> {
    /// `inner`, then the rest of `request`.
    pub fn new(inner: Body, request: R) -> Self {
        DrainAfter {
            inner,
            request: Some(request),
            left: DRAIN_BYTES,
            deadline: None,
        }
    }
}

impl<R> HttpBody for DrainAfter<R>
where
    R: HttpBody<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        use std::task::Poll;
        let this = &mut *self;
        if this.deadline.is_none() {
            match this.inner.as_mut().poll_frame(cx) {
                Poll::Ready(None) => {}
                other => return other,
            }
        }
        let deadline = this
            .deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(DRAIN_TIME)));
        while let Some(req) = this.request.as_mut() {
            match Pin::new(req).poll_frame(cx) {
                Poll::Ready(Some(Ok(f))) => {
                    let n = f.data_ref().map_or(0, Bytes::len);
                    this.left = this.left.saturating_sub(n);
                    if this.left == 0 {
                        this.request = None;
                    }
                }
                // ended, or failed (h2 has answered the client already)
                Poll::Ready(_) => this.request = None,
                Poll::Pending => {
                    if std::future::Future::poll(deadline.as_mut(), cx).is_ready() {
                        this.request = None;
                    } else {
                        return Poll::Pending;
                    }
                }
            }
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.request.is_none() && (self.deadline.is_some() || self.inner.is_end_stream())
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::StreamBody;
    use tokio::sync::mpsc;

    type Item = Result<http_body::Frame<Bytes>, std::convert::Infallible>;

    /// A request body fed by hand (the tree's usual channel stream, boxed to be `Unpin`).
    fn request() -> (
        mpsc::UnboundedSender<Item>,
        Pin<Box<impl HttpBody<Data = Bytes, Error = std::convert::Infallible>>>,
    ) {
        let (tx, rx) = mpsc::unbounded_channel::<Item>();
        let stream =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|x| (x, rx)) },
            );
        (tx, Box::pin(StreamBody::new(stream)))
    }

    fn data(n: usize) -> Item {
        Ok(http_body::Frame::data(Bytes::from(vec![0u8; n])))
    }

    /// The response's bytes first; its end only once the request's body ended.
    #[tokio::test(start_paused = true)]
    async fn ends_after_the_request_body() {
        let (tx, req) = request();
        let mut b = DrainAfter::new(full("answer"), req);
        assert!(!b.is_end_stream());
        let f = b.frame().await.unwrap().unwrap();
        assert_eq!(f.into_data().unwrap(), "answer");
        tx.send(data(100)).unwrap();
        let mut next = Box::pin(b.frame());
        let waited = tokio::time::timeout(DRAIN_TIME / 2, next.as_mut()).await;
        assert!(waited.is_err(), "ended before the request body did");
        drop(tx);
        assert!(next.await.is_none());
    }

    /// A client that keeps sending, or sends nothing, does not hold the response past
    /// DRAIN_BYTES or DRAIN_TIME.
    #[tokio::test(start_paused = true)]
    async fn bounded_in_bytes_and_time() {
        let (tx, req) = request();
        for _ in 0..100 {
            tx.send(data(1024)).unwrap();
        }
        let mut b = DrainAfter::new(empty(), req);
        assert!(b.frame().await.is_none());
        assert!(b.is_end_stream());

        let (_tx, req) = request();
        let mut b = DrainAfter::new(empty(), req);
        let start = tokio::time::Instant::now();
        assert!(b.frame().await.is_none());
        assert_eq!(start.elapsed(), DRAIN_TIME);
    }
}
