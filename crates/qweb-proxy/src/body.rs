//! The client's request body on its way up ([`ClientBody`]): its progress, which times the
//! upstream, and its limits. The response body on its way down is `response_body.rs`.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use qweb_http::request_body::RequestBody;
use tokio::time::{Instant, Sleep};

use qweb_http::body::BoxError;

/// What went wrong on the client's side of a request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ClientBodyError {
    /// Malformed framing (bad chunked encoding, a length that lied) or the client went away.
    Malformed,
    /// No body bytes for `client_body_timeout`.
    Timeout,
    /// More than the route's `max_body_size`.
    TooLarge,
}

/// How the request body is moving, shared between [`ClientBody`] (inside hyper's client
/// connection) and the proxy's exchange (which times the upstream).
pub(super) struct Progress {
    /// Last time hyper took a piece of the body (the upstream accepted more), or the
    /// request started.
    pub last: Cell<Instant>,
    /// The whole body was handed to hyper.
    pub finished: Cell<bool>,
    /// hyper is waiting for the client to send more.
    pub waiting_on_client: Cell<bool>,
    /// Set when the client's body failed.
    pub client_error: Cell<Option<ClientBodyError>>,
}

impl Progress {
    fn new(finished: bool) -> Rc<Self> {
        Rc::new(Progress {
            last: Cell::new(Instant::now()),
            finished: Cell::new(finished),
            waiting_on_client: Cell::new(false),
            client_error: Cell::new(None),
        })
    }
}

/// The client's request body as sent upstream: reports progress, and fails when the client
/// pauses longer than `client_body_timeout` between two reads (an active upload is never cut:
/// each piece restarts the clock), or when it grows past the route's `max_body_size` (the
/// piece that crosses the limit is not passed on).
pub struct ClientBody {
    inner: Source,
    progress: Rc<Progress>,
    idle: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
    limit: Option<u64>,
    seen: u64,
}

/// Where the body's bytes come from.
enum Source {
    /// Streamed from the client as it arrives.
    Stream(RequestBody),
    /// Read whole beforehand (`buffer_request_body`); `None` once sent.
    Buffered(Option<Bytes>),
}

impl ClientBody {
    pub(super) fn new(
        inner: RequestBody,
        idle: Duration,
        limit: Option<u64>,
    ) -> (Self, Rc<Progress>) {
        let progress = Progress::new(inner.is_end_stream());
        let body = ClientBody {
            inner: Source::Stream(inner),
            progress: progress.clone(),
            idle,
            sleep: None,
            limit,
            seen: 0,
        };
        (body, progress)
    }

    /// A body read whole beforehand.
    pub(super) fn buffered(data: Bytes) -> (Self, Rc<Progress>) {
        let progress = Progress::new(data.is_empty());
        let body = ClientBody {
            inner: Source::Buffered((!data.is_empty()).then_some(data)),
            progress: progress.clone(),
            idle: Duration::MAX,
            sleep: None,
            limit: None,
            seen: 0,
        };
        (body, progress)
    }
}

/// A frame as the next hop gets it: trailers lose the fields that may not be trailers (RFC
/// 9110 §6.5.1: framing, routing, authentication, response control, `Content-*`,
/// `Set-Cookie`, `Location`; [`qweb_http::fields::allowed_in_trailers`]), in both directions
/// and whatever the protocols of the two hops; data frames pass as they are.
pub(super) fn hop_frame(f: Frame<Bytes>) -> Frame<Bytes> {
    match f.into_trailers() {
        Ok(mut t) => {
            let dropped = qweb_http::fields::strip_forbidden_trailers(&mut t);
            if dropped > 0 {
                tracing::debug!(dropped, "trailer fields that may not be trailers removed");
            }
            Frame::trailers(t)
        }
        Err(f) => f,
    }
}

/// Reads the client's whole body (`buffer_request_body`): at most `limit` bytes, no pause
/// longer than `idle`.
pub(super) async fn read_whole(
    mut body: RequestBody,
    limit: u64,
    idle: Duration,
) -> Result<Bytes, ClientBodyError> {
    use http_body_util::BodyExt;
    let mut out = bytes::BytesMut::new();
    loop {
        let frame = match tokio::time::timeout(idle, body.frame()).await {
            Err(_) => return Err(ClientBodyError::Timeout),
            Ok(None) => return Ok(out.freeze()),
            Ok(Some(Err(_))) => return Err(ClientBodyError::Malformed),
            Ok(Some(Ok(f))) => f,
        };
        if let Some(d) = frame.data_ref() {
            if out.len() as u64 + d.len() as u64 > limit {
                return Err(ClientBodyError::TooLarge);
            }
            out.extend_from_slice(d);
        }
    }
}

impl HttpBody for ClientBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let p = &this.progress;
        let inner = match &mut this.inner {
            Source::Buffered(data) => {
                p.last.set(Instant::now());
                p.finished.set(true);
                return Poll::Ready(data.take().map(|d| Ok(Frame::data(d))));
            }
            Source::Stream(inner) => inner,
        };
        match Pin::new(&mut *inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(f))) => {
                if let (Some(limit), Some(d)) = (this.limit, f.data_ref()) {
                    this.seen += d.len() as u64;
                    if this.seen > limit {
                        p.client_error.set(Some(ClientBodyError::TooLarge));
                        return Poll::Ready(Some(Err("request body over max_body_size".into())));
                    }
                }
                p.last.set(Instant::now());
                p.waiting_on_client.set(false);
                this.sleep = None;
                if inner.is_end_stream() {
                    p.finished.set(true);
                }
                Poll::Ready(Some(Ok(hop_frame(f))))
            }
            Poll::Ready(None) => {
                p.last.set(Instant::now());
                p.waiting_on_client.set(false);
                p.finished.set(true);
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                p.client_error.set(Some(ClientBodyError::Malformed));
                Poll::Ready(Some(Err(e)))
            }
            Poll::Pending => {
                p.waiting_on_client.set(true);
                let idle = this.idle;
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
                if sleep.as_mut().poll(cx).is_ready() {
                    p.client_error.set(Some(ClientBodyError::Timeout));
                    return Poll::Ready(Some(Err("client request body timed out".into())));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Source::Stream(i) => i.is_end_stream(),
            Source::Buffered(d) => d.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Source::Stream(i) => i.size_hint(),
            Source::Buffered(d) => SizeHint::with_exact(d.as_ref().map_or(0, |d| d.len() as u64)),
        }
    }
}
