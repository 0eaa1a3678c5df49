//! One request on an HTTP/1 connection: the service's answer, the request body read from the
//! socket as the service asks for it (100-continue owed until then), the response head and
//! body framed by [`mod@qweb_http::h1::write`] and written, and what the exchange leaves the
//! connection ([`Done`]: kept alive, switched to a tunnel, or closed with the body unread).

use std::future::Future;
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::task::{ready, Context, Poll};

use http::{Request, Response, StatusCode};
use http_body::{Body as _, Frame};
use tokio::io::{AsyncRead, AsyncWrite};

use super::super::idle::ReadReady;
use super::super::Handle;
use super::Conn;
use qweb_http::h1::decode::{BodyError, Decoded, Decoder};
use qweb_http::h1::encode::{self, Asked, BodyHint};
use qweb_http::h1::parse::{Framing, Head};
use qweb_http::h1::write::Writing;
use qweb_http::request_body::{BodyPipe, RequestBody};
use qweb_session::closing::Drain;
use qweb_session::logged::Logged;
use qweb_session::ConnState;

/// How an exchange ended, for what comes after it.
pub(super) struct Done {
    pub(super) keep_alive: bool,
    /// A 101 went out: the socket is the tunnel's.
    pub(super) switched: bool,
    /// The request body was not read to its end (the connection closes with a lingering
    /// read).
    pub(super) body_unread: bool,
}

/// One request: the service's answer, the request body as the service reads it, the
/// response written. `None`: the connection must end now (a deadline, a socket error, a
/// response that cannot be completed).
pub(super) async fn exchange<T, S: Handle, F>(
    c: &mut Conn<T>,
    state: &Rc<ConnState>,
    svc: &Rc<S>,
    head: Head,
    shut: &mut Pin<&mut F>,
) -> Option<Done>
where
    T: AsyncRead + AsyncWrite + ReadReady + Unpin,
    F: Future,
{
    let Head {
        parts,
        framing,
        keep_alive,
        expect_continue,
        te_trailers,
        upgrade,
    } = head;
    let asked = Asked::new(&parts.method, parts.version, keep_alive, te_trailers);
    let (pipe, body) = match framing {
        Framing::Empty => (None, RequestBody::Empty),
        Framing::Length(n) => {
            let (p, b) = BodyPipe::new(Some(n));
            (Some(p), b)
        }
        Framing::Chunked => {
            let (p, b) = BodyPipe::new(None);
            (Some(p), b)
        }
    };
    let mut ex = Exchange {
        asked,
        decoder: Decoder::new(framing, c.head_limits.max_size),
        pipe,
        expect_continue,
        body_failed: false,
        upgrade,
        stage: Stage::Calling,
    };
    let fut = svc.clone().call(Request::from_parts(parts, body));
    let mut fut = pin!(fut);
    loop {
        let r = tokio::select! {
            biased;
            r = std::future::poll_fn(|cx| ex.poll(cx, c, state, fut.as_mut())) => r,
            _ = shut.as_mut(), if !state.closing().shutting_down() => {
                state.drain(Drain::Shutdown);
                continue;
            }
        };
        return r;
    }
}

/// The request's state while it is answered.
struct Exchange {
    asked: Asked,
    decoder: Decoder,
    /// The body's other end, while the request has a body.
    pipe: Option<BodyPipe>,
    /// A 100 (Continue) is owed before the body is read.
    expect_continue: bool,
    /// The body's framing was broken: the connection cannot go on.
    body_failed: bool,
    upgrade: bool,
    stage: Stage,
}

impl Drop for Exchange {
    fn drop(&mut self) {
        if let Some(p) = &self.pipe {
            p.close();
        }
    }
}

enum Stage {
    /// The service is working.
    Calling,
    /// The response is going out.
    Writing(Box<Writing<Logged>>),
    /// Written; the flush is left.
    Flushing { keep_alive: bool, switched: bool },
}

impl Exchange {
    fn poll<T, F>(
        &mut self,
        cx: &mut Context<'_>,
        c: &mut Conn<T>,
        state: &ConnState,
        mut fut: Pin<&mut F>,
    ) -> Poll<Option<Done>>
    where
        T: AsyncRead + AsyncWrite + ReadReady + Unpin,
        F: Future<Output = Response<Logged>>,
    {
        loop {
            let mut progress = false;
            // the request body, when the service asks for it
            if let Some(pipe) = self.pipe.as_ref().filter(|p| {
                p.register(cx.waker());
                p.wanted()
            }) {
                let pipe = pipe.clone();
                {
                    match self.pump(cx, c, &pipe) {
                        Poll::Ready(Ok(())) => progress = true,
                        Poll::Ready(Err(())) => return Poll::Ready(None),
                        Poll::Pending => {}
                    }
                }
            }
            if let Stage::Calling = self.stage {
                if let Poll::Ready(resp) = fut.as_mut().poll(cx) {
                    self.start(resp, c, state);
                    progress = true;
                }
            }
            if let Stage::Writing(w) = &mut self.stage {
                match w.fill(cx, &mut c.out) {
                    Ok(p) => progress |= p,
                    Err(e @ qweb_http::h1::write::WriteError::Body(_)) => {
                        tracing::debug!(peer = %state.peer, "{e}");
                        return Poll::Ready(None);
                    }
                    Err(e) => {
                        tracing::warn!(peer = %state.peer, "{e}");
                        return Poll::Ready(None);
                    }
                }
            }
            if !c.out.is_empty() {
                match c.out.poll_write(cx, &mut c.io) {
                    Poll::Ready(Ok(())) => {
                        progress = true;
                        c.out.unflushed = true;
                    }
                    Poll::Ready(Err(e)) => {
                        tracing::debug!(peer = %state.peer, "HTTP/1 write failed: {e}");
                        return Poll::Ready(None);
                    }
                    Poll::Pending => {}
                }
            }
            if c.out.unflushed && c.out.is_empty() && !matches!(self.stage, Stage::Flushing { .. })
            {
                // what was written goes out now (TLS: its records), while the body waits for
                // its source (or the client for its 100); a flush that waits for the socket is
                // polled again
                match Pin::new(&mut *c.io).poll_flush(cx) {
                    Poll::Ready(Ok(())) => c.out.unflushed = false,
                    Poll::Ready(Err(e)) => {
                        tracing::debug!(peer = %state.peer, "HTTP/1 flush failed: {e}");
                        return Poll::Ready(None);
                    }
                    Poll::Pending => {}
                }
            }
            if let Stage::Writing(w) = &mut self.stage {
                if w.body.is_none() && c.out.is_empty() {
                    self.stage = Stage::Flushing {
                        keep_alive: w.keep_alive,
                        switched: w.switched,
                    };
                }
            }
            if let Stage::Flushing {
                keep_alive,
                switched,
            } = self.stage
            {
                match Pin::new(&mut *c.io).poll_flush(cx) {
                    Poll::Ready(Ok(())) => c.out.unflushed = false,
                    Poll::Ready(Err(e)) => {
                        tracing::debug!(peer = %state.peer, "HTTP/1 flush failed: {e}");
                        return Poll::Ready(None);
                    }
                    // the last records wait for the client's window: the send timeout runs
                    Poll::Pending if c.poll_deadline(cx, state).is_some() => {
                        return Poll::Ready(None)
                    }
                    Poll::Pending => return Poll::Pending,
                }
                let mut body_unread = false;
                if !self.decoder.is_done() && !self.body_failed && !switched {
                    // what of the body is already buffered is taken; the rest is not waited for
                    body_unread = !self.decoder.skip_buffered(&mut c.buf);
                }
                return Poll::Ready(Some(Done {
                    keep_alive: keep_alive && !body_unread && !self.body_failed,
                    switched,
                    body_unread,
                }));
            }
            if !progress {
                // waiting: for the service, the body's source, the client's bytes or its
                // window; a write that just stalled has started the send timeout
                if c.poll_deadline(cx, state).is_some() {
                    return Poll::Ready(None);
                }
                return Poll::Pending;
            }
        }
    }

    /// Gives the body its next frame: from the buffer, or after a read. `Err`: the connection
    /// failed.
    fn pump<T>(
        &mut self,
        cx: &mut Context<'_>,
        c: &mut Conn<T>,
        pipe: &BodyPipe,
    ) -> Poll<Result<(), ()>>
    where
        T: AsyncRead + AsyncWrite + ReadReady + Unpin,
    {
        loop {
            match self.decoder.decode(&mut c.buf, c.eof) {
                Ok(Decoded::Data(d)) => {
                    pipe.push(Frame::data(d), self.decoder.is_done());
                    return Poll::Ready(Ok(()));
                }
                Ok(Decoded::Trailers(t)) => {
                    pipe.push(Frame::trailers(t), true);
                    return Poll::Ready(Ok(()));
                }
                Ok(Decoded::End) => {
                    pipe.end();
                    return Poll::Ready(Ok(()));
                }
                Err(e) => {
                    tracing::debug!("HTTP/1 request body: {e}");
                    self.body_failed = true;
                    pipe.fail(e);
                    return Poll::Ready(Ok(()));
                }
                Ok(Decoded::More) => {}
            }
            if self.expect_continue {
                self.expect_continue = false;
                if matches!(self.stage, Stage::Calling) {
                    c.out
                        .small(|b| b.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n"));
                    return Poll::Ready(Ok(()));
                }
            }
            match ready!(c.poll_read_more(cx)) {
                Ok(()) => {}
                Err(e) => {
                    tracing::debug!("HTTP/1 request body read failed: {e}");
                    self.body_failed = true;
                    pipe.fail(BodyError::Truncated);
                    return Poll::Ready(Err(()));
                }
            }
        }
    }

    /// The service answered: the head is queued, the body follows.
    fn start<T>(&mut self, resp: Response<Logged>, c: &mut Conn<T>, state: &ConnState) {
        let (parts, body) = resp.into_parts();
        if *c.retired.borrow() {
            state.drain(Drain::Retired);
        }
        let mut asked = self.asked;
        let abandoned = self.pipe.as_ref().is_some_and(|p| p.abandoned());
        if abandoned && !self.body_failed {
            // what of the body is already buffered is taken: a small body that came with its
            // head does not cost the connection
            self.decoder.skip_buffered(&mut c.buf);
        }
        let unread = abandoned && !self.decoder.is_done();
        // The connection ends after this response when it drains (shutdown, retirement),
        // when the response says so (a refusal that leaves the connection unusable), when
        // the request's body is left unread (nobody will read it: its bytes cannot be told
        // from the next request's), or when its framing broke.
        let ends = parts
            .extensions
            .get::<qweb_http::response::EndsConnection>()
            .is_some();
        asked.keep_alive &= state.closing().is_open() && !ends && !unread && !self.body_failed;
        let hint = BodyHint {
            empty: body.is_end_stream(),
            exact: body.size_hint().exact(),
        };
        let switched = parts.status == StatusCode::SWITCHING_PROTOCOLS && self.upgrade;
        let mut enc = None;
        c.out
            .small(|dst| enc = Some(encode::head(parts.status, &parts.headers, hint, asked, dst)));
        let Some(enc) = enc else {
            return;
        };
        let body = match enc.framing {
            // the body is not polled: dropping it logs the request
            encode::Framing::None => None,
            _ => Some(body),
        };
        let mut writing = Writing::new(body, enc.framing, enc.keep_alive, switched);
        // a cached body in a memfd: sent from it where the transport can (plain TCP)
        writing.file = parts
            .extensions
            .get::<qweb_http::body::FileBytes>()
            .cloned();
        self.stage = Stage::Writing(Box::new(writing));
    }
}
