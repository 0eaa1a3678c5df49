//! [`RequestBody`]: the one request-body type of every protocol. HTTP/1.1 and HTTP/2 bodies
//! are hyper's [`Incoming`]; an HTTP/3 body is the receive half of the request's QUIC stream
//! (DATA frames, then trailers). The pipeline and the proxy see only this type.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;

use crate::http::body::BoxError;

/// The receive half of an HTTP/3 request stream.
pub(crate) type H3Recv = h3::server::RequestStream<h3_quinn::RecvStream, Bytes>;

/// A request's body, whichever protocol carried it.
pub(crate) enum RequestBody {
    /// HTTP/1.1 or HTTP/2 (hyper).
    Hyper(Incoming),
    /// HTTP/3: the request stream's DATA frames, then its trailers (boxed: the stream is
    /// larger than hyper's body).
    H3(Box<H3Body>),
}

/// An HTTP/3 request body: DATA frames until the stream's end, then the trailers if any.
pub(crate) struct H3Body {
    stream: H3Recv,
    /// The request's `Content-Length`, for `size_hint`.
    length: Option<u64>,
    /// Bytes received so far.
    seen: u64,
    /// DATA frames are over (trailers may follow).
    data_done: bool,
    /// Nothing more: trailers read or none.
    done: bool,
}

impl RequestBody {
    /// An HTTP/3 body on `stream`; `length`: the request's `Content-Length`. A request whose
    /// length says 0 ends at once.
    pub(crate) fn h3(stream: H3Recv, length: Option<u64>) -> Self {
        RequestBody::H3(Box::new(H3Body {
            stream,
            length,
            seen: 0,
            data_done: false,
            done: false,
        }))
    }
}

impl From<Incoming> for RequestBody {
    fn from(b: Incoming) -> Self {
        RequestBody::Hyper(b)
    }
}

impl HttpBody for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            RequestBody::Hyper(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            RequestBody::H3(b) => b.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Hyper(b) => b.is_end_stream(),
            RequestBody::H3(b) => b.done || (b.length == Some(0) && b.data_done),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RequestBody::Hyper(b) => b.size_hint(),
            RequestBody::H3(b) => match b.length {
                Some(n) => SizeHint::with_exact(n.saturating_sub(b.seen)),
                None => SizeHint::default(),
            },
        }
    }
}

impl H3Body {
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        if !self.data_done {
            match self.stream.poll_recv_data(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => {
                    self.done = true;
                    return Poll::Ready(Some(Err(Box::new(e))));
                }
                Poll::Ready(Ok(Some(mut buf))) => {
                    let data = buf.copy_to_bytes(buf.remaining());
                    self.seen += data.len() as u64;
                    if self.length.is_some_and(|n| self.seen > n) {
                        self.done = true;
                        return Poll::Ready(Some(Err(
                            "HTTP/3 body longer than its Content-Length".into(),
                        )));
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Poll::Ready(Ok(None)) => {
                    self.data_done = true;
                    if self.length.is_some_and(|n| self.seen != n) {
                        self.done = true;
                        return Poll::Ready(Some(Err(
                            "HTTP/3 body shorter than its Content-Length".into(),
                        )));
                    }
                }
            }
        }
        let r = self.stream.poll_recv_trailers(cx);
        if r.is_ready() {
            self.done = true;
        }
        r.map(|t| match t {
            Ok(Some(t)) => Some(Ok(Frame::trailers(t))),
            Ok(None) => None,
            Err(e) => Some(Err(Box::new(e) as BoxError)),
        })
    }
}
