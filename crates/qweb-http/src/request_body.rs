//! [`RequestBody`]: the one request-body type of every protocol. An HTTP/1.1 body is what
//! qweb's own connection driver decodes into a [`BodyPipe`]; an HTTP/2 body is hyper's
//! [`Incoming`]; an HTTP/3 body is the receive half of the request's QUIC stream (DATA frames,
//! then trailers). The pipeline and the proxy see only this type.

use std::cell::RefCell;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use bytes::{Buf, Bytes};
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;

use crate::body::BoxError;

/// The receive half of an HTTP/3 request stream.
pub type H3Recv = h3::server::RequestStream<h3_quinn::RecvStream, Bytes>;

/// A request's body, whichever protocol carried it.
pub enum RequestBody {
    /// No body (an HTTP/1.1 request without one).
    Empty,
    /// HTTP/1.1: the bytes the connection driver decodes (see [`BodyPipe`]).
    H1(H1Body),
    /// HTTP/2 (hyper).
    Hyper(Incoming),
    /// HTTP/2 (qweb's own connection layer, [`crate::h2`]).
    H2(crate::h2::H2Body),
    /// HTTP/3: the request stream's DATA frames, then its trailers (boxed: the stream is
    /// larger than hyper's body).
    H3(Box<H3Body>),
}

/// An HTTP/3 request body: DATA frames until the stream's end, then the trailers if any.
pub struct H3Body {
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
    pub fn h3(stream: H3Recv, length: Option<u64>) -> Self {
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
            RequestBody::Empty => Poll::Ready(None),
            RequestBody::H1(b) => b.poll_frame(cx),
            RequestBody::Hyper(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            RequestBody::H2(b) => b.poll_frame(cx).map_err(Into::into),
            RequestBody::H3(b) => b.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Empty => true,
            RequestBody::H1(b) => b.is_end_stream(),
            RequestBody::Hyper(b) => b.is_end_stream(),
            RequestBody::H2(b) => b.is_end_stream(),
            RequestBody::H3(b) => b.done || (b.length == Some(0) && b.data_done),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RequestBody::Empty => SizeHint::with_exact(0),
            RequestBody::H1(b) => b.size_hint(),
            RequestBody::Hyper(b) => b.size_hint(),
            RequestBody::H2(b) => b.size_hint(),
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

/// An HTTP/1.1 request body: frames the connection driver decodes from its read buffer,
/// handed over one at a time through a [`BodyPipe`]. The driver reads from the socket only
/// when the body is asked for a frame (so a body nobody reads is never read), and a
/// `Content-Length` body knows its size.
pub struct H1Body {
    pipe: Rc<RefCell<Pipe>>,
}

/// The connection driver's end of an [`H1Body`].
#[derive(Clone)]
pub struct BodyPipe(Rc<RefCell<Pipe>>);

#[derive(Default)]
struct Pipe {
    /// A frame decoded and not yet taken.
    frame: Option<Frame<Bytes>>,
    /// No frame follows the one held (or none is held and the body is over).
    ended: bool,
    /// Why the body failed (given once, then the body is over).
    failed: Option<crate::h1::decode::BodyError>,
    /// The body asked for a frame and has none.
    wanted: bool,
    /// Bytes the body still announces (`Content-Length`).
    remaining: Option<u64>,
    /// The body's consumer, woken when a frame or the end arrives.
    consumer: Option<Waker>,
    /// The connection driver, woken when the body wants a frame or is dropped.
    driver: Option<Waker>,
    /// The body was dropped.
    dropped: bool,
}

impl BodyPipe {
    /// A pipe and its body; `length`: the body's `Content-Length`, if it has one.
    pub fn new(length: Option<u64>) -> (BodyPipe, RequestBody) {
        let pipe = Rc::new(RefCell::new(Pipe {
            remaining: length,
            ..Pipe::default()
        }));
        (BodyPipe(pipe.clone()), RequestBody::H1(H1Body { pipe }))
    }

    /// The body asked for a frame the driver has not given yet.
    pub fn wanted(&self) -> bool {
        let p = self.0.borrow();
        p.wanted && p.frame.is_none() && !p.ended && p.failed.is_none() && !p.dropped
    }

    /// The body was dropped before its end (nobody will read the rest).
    pub fn abandoned(&self) -> bool {
        let p = self.0.borrow();
        p.dropped && !p.ended
    }

    /// Wakes the driver with `w` when the body wants a frame or is dropped.
    pub fn register(&self, w: &Waker) {
        let mut p = self.0.borrow_mut();
        match &p.driver {
            Some(d) if d.will_wake(w) => {}
            _ => p.driver = Some(w.clone()),
        }
    }

    /// Hands over a frame; `last`: the body ends with it.
    pub fn push(&self, frame: Frame<Bytes>, last: bool) {
        let mut p = self.0.borrow_mut();
        p.frame = Some(frame);
        p.ended |= last;
        p.wanted = false;
        if let Some(w) = p.consumer.take() {
            w.wake();
        }
    }

    /// The body is over.
    pub fn end(&self) {
        let mut p = self.0.borrow_mut();
        p.ended = true;
        if let Some(w) = p.consumer.take() {
            w.wake();
        }
    }

    /// The connection is done with this request (answered, or ending): a body not read to its
    /// end fails (as hyper's `Incoming` does when its connection goes), so that whoever
    /// still reads it (an upstream request) ends instead of waiting.
    pub fn close(&self) {
        let unfinished = {
            let p = self.0.borrow();
            !p.ended && p.failed.is_none()
        };
        if unfinished {
            self.fail(crate::h1::decode::BodyError::Truncated);
        }
    }

    /// The body failed.
    pub fn fail(&self, e: crate::h1::decode::BodyError) {
        let mut p = self.0.borrow_mut();
        p.failed = Some(e);
        if let Some(w) = p.consumer.take() {
            w.wake();
        }
    }
}

impl H1Body {
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut p = self.pipe.borrow_mut();
        if let Some(f) = p.frame.take() {
            if let (Some(d), Some(r)) = (f.data_ref(), p.remaining.as_mut()) {
                *r = r.saturating_sub(d.len() as u64);
            }
            return Poll::Ready(Some(Ok(f)));
        }
        if let Some(e) = p.failed.take() {
            p.ended = true;
            return Poll::Ready(Some(Err(Box::new(e))));
        }
        if p.ended {
            return Poll::Ready(None);
        }
        p.wanted = true;
        match &p.consumer {
            Some(c) if c.will_wake(cx.waker()) => {}
            _ => p.consumer = Some(cx.waker().clone()),
        }
        if let Some(d) = p.driver.take() {
            d.wake();
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        let p = self.pipe.borrow();
        p.ended && p.frame.is_none() && p.failed.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match self.pipe.borrow().remaining {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

impl Drop for H1Body {
    fn drop(&mut self) {
        let mut p = self.pipe.borrow_mut();
        p.dropped = true;
        if let Some(d) = p.driver.take() {
            d.wake();
        }
    }
}
