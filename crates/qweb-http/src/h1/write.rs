//! A response on its way out, sans I/O: the body's frames framed as its head said
//! ([`Writing`]: `Content-Length` held to, chunks and trailers, or read to the close) into a
//! queue of framing bytes and body chunks ([`Output`]) that leaves in vectored writes. The
//! HTTP/1 driver (`conn/h1/` in qweb-server) polls the body and the socket; nothing here
//! knows either.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::Body as HttpBody;
use tokio::io::AsyncWrite;

use super::encode::{self, Framing as Out};

/// Bytes of a response queued before they are written (a streamed body's chunks are written
/// as they come; this bounds what one write gathers).
pub const WRITE_BATCH: usize = 64 * 1024;

/// Why a response could not be completed: the connection ends (its client cannot tell a
/// cut response from a whole one otherwise).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    /// The body's source failed.
    #[error("response body failed: {0}")]
    Body(String),
    /// More bytes than the head's `Content-Length`: cut.
    #[error("response body longer than its Content-Length: cut")]
    TooLong,
    /// The body ended this many bytes short of its `Content-Length`.
    #[error("response body {0} bytes shorter than its Content-Length")]
    TooShort(u64),
}

/// A response body being framed.
pub struct Writing<B> {
    /// The body, until it ended (`None` also for a response without one).
    pub body: Option<B>,
    framing: Out,
    /// Bytes still owed under `Content-Length`.
    left: u64,
    /// The connection may carry another request after this response.
    pub keep_alive: bool,
    trailers: Option<http::HeaderMap>,
    /// A 101 went out: the socket is the tunnel's after this.
    pub switched: bool,
}

impl<B> Writing<B> {
    /// `body` framed as `framing` says (`Out::None`: no body is sent; drop it instead).
    pub fn new(body: Option<B>, framing: Out, keep_alive: bool, switched: bool) -> Self {
        let left = match framing {
            Out::Length(n) => n,
            _ => 0,
        };
        Writing {
            body,
            framing,
            left,
            keep_alive,
            trailers: None,
            switched,
        }
    }
}

impl<B> Writing<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    /// Queues what the body has ready, up to [`WRITE_BATCH`]. `Ok(true)`: something was
    /// queued or the body ended; `Err`: the response cannot be completed (the connection
    /// ends).
    pub fn fill(&mut self, cx: &mut Context<'_>, out: &mut Output) -> Result<bool, WriteError> {
        let mut progress = false;
        while out.queued < WRITE_BATCH {
            let Some(body) = self.body.as_mut() else {
                break;
            };
            match Pin::new(body).poll_frame(cx) {
                Poll::Pending => break,
                Poll::Ready(Some(Err(e))) => return Err(WriteError::Body(e.to_string())),
                Poll::Ready(Some(Ok(frame))) => {
                    progress = true;
                    match frame.into_data() {
                        Ok(d) => self.data(d, out)?,
                        Err(f) => {
                            if let Ok(t) = f.into_trailers() {
                                self.trailers = Some(t);
                            }
                        }
                    }
                }
                Poll::Ready(None) => {
                    progress = true;
                    self.end(out)?;
                    self.body = None;
                }
            }
        }
        Ok(progress)
    }

    fn data(&mut self, d: Bytes, out: &mut Output) -> Result<(), WriteError> {
        if d.is_empty() {
            return Ok(());
        }
        match &self.framing {
            Out::Length(_) => {
                if d.len() as u64 > self.left {
                    return Err(WriteError::TooLong);
                }
                self.left -= d.len() as u64;
                out.data(d);
            }
            Out::Chunked(_) => {
                out.small(|b| encode::chunk_size(b, d.len()));
                out.data(d);
                out.small(|b| b.extend_from_slice(b"\r\n"));
            }
            Out::Close => out.data(d),
            Out::None => {}
        }
        Ok(())
    }

    fn end(&mut self, out: &mut Output) -> Result<(), WriteError> {
        match &self.framing {
            Out::Length(_) if self.left > 0 => Err(WriteError::TooShort(self.left)),
            Out::Chunked(allowed) => {
                let t = self.trailers.take();
                out.small(|b| encode::last_chunk(b, t.as_ref(), allowed.as_deref()));
                Ok(())
            }
            Out::Close => {
                self.keep_alive = false;
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

/// What is queued for the client: framing bytes in one reused buffer, body chunks as they
/// came, written with vectored writes.
#[derive(Default)]
pub struct Output {
    small: Vec<u8>,
    pieces: VecDeque<Piece>,
    /// Bytes of the front piece already written.
    front: usize,
    /// Bytes queued.
    queued: usize,
    /// Bytes were written since the last completed flush (the driver flushes before it
    /// waits).
    pub unflushed: bool,
}

enum Piece {
    /// `small[start..end]`.
    Small(usize, usize),
    Data(Bytes),
}

/// Body chunks up to this size are copied next to the framing (one buffer less to write).
const COPY_BELOW: usize = 512;

impl Output {
    /// Nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// Appends framing bytes.
    #[inline]
    pub fn small(&mut self, f: impl FnOnce(&mut Vec<u8>)) {
        let start = self.small.len();
        f(&mut self.small);
        let end = self.small.len();
        self.queued += end - start;
        match self.pieces.back_mut() {
            Some(Piece::Small(_, e)) if *e == start => *e = end,
            _ => self.pieces.push_back(Piece::Small(start, end)),
        }
    }

    /// Appends a body chunk (copied beside the framing when small).
    #[inline]
    pub fn data(&mut self, d: Bytes) {
        if d.len() < COPY_BELOW {
            self.small(|b| b.extend_from_slice(&d));
            return;
        }
        self.queued += d.len();
        self.pieces.push_back(Piece::Data(d));
    }

    /// Writes until everything queued is out (or the socket is full).
    pub fn poll_write<T: AsyncWrite + Unpin>(
        &mut self,
        cx: &mut Context<'_>,
        io: &mut T,
    ) -> Poll<io::Result<()>> {
        while !self.pieces.is_empty() {
            let mut slices = [io::IoSlice::new(&[]); 16];
            let mut k = 0;
            for (i, p) in self.pieces.iter().take(slices.len()).enumerate() {
                let bytes = match p {
                    Piece::Small(s, e) => &self.small[*s..*e],
                    Piece::Data(d) => &d[..],
                };
                let skip = if i == 0 { self.front } else { 0 };
                slices[k] = io::IoSlice::new(&bytes[skip..]);
                k += 1;
            }
            let mut n = ready!(Pin::new(&mut *io).poll_write_vectored(cx, &slices[..k]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.queued = self.queued.saturating_sub(n);
            while n > 0 {
                let Some(p) = self.pieces.front() else { break };
                let len = match p {
                    Piece::Small(s, e) => e - s,
                    Piece::Data(d) => d.len(),
                } - self.front;
                if n >= len {
                    n -= len;
                    self.front = 0;
                    self.pieces.pop_front();
                } else {
                    self.front += n;
                    n = 0;
                }
            }
        }
        self.small.clear();
        self.queued = 0;
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::{boxed, full, Body};
    use http::header::HeaderName;
    use http_body::Frame;

    /// A writer that takes at most `step` bytes a call, and records them.
    struct Trickle {
        step: usize,
        got: Vec<u8>,
        writes: usize,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let n = buf.len().min(self.step);
            self.got.extend_from_slice(&buf[..n]);
            self.writes += 1;
            Poll::Ready(Ok(n))
        }
        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[io::IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let mut left = self.step;
            let mut n = 0;
            for b in bufs {
                let k = b.len().min(left);
                self.got.extend_from_slice(&b[..k]);
                (left, n) = (left - k, n + k);
                if left == 0 {
                    break;
                }
            }
            self.writes += 1;
            Poll::Ready(Ok(n))
        }
        fn is_write_vectored(&self) -> bool {
            true
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// Frames `body` as `framing` into what a writer taking `step` bytes a call receives.
    fn wire(body: Body, framing: Out, step: usize) -> (Result<Vec<u8>, WriteError>, usize) {
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut w = Writing::new(Some(body), framing, true, false);
        let mut out = Output::default();
        let mut io = Trickle {
            step,
            got: Vec::new(),
            writes: 0,
        };
        while w.body.is_some() {
            if let Err(e) = w.fill(&mut cx, &mut out) {
                return (Err(e), io.writes);
            }
            match out.poll_write(&mut cx, &mut io) {
                Poll::Ready(Ok(())) => {}
                other => panic!("{other:?}"),
            }
        }
        (Ok(io.got), io.writes)
    }

    fn frames(parts: Vec<Frame<Bytes>>) -> Body {
        boxed(http_body_util::StreamBody::new(futures_util::stream::iter(
            parts.into_iter().map(Ok::<_, crate::body::BoxError>),
        )))
    }

    #[test]
    fn lengths_are_held_to() {
        assert_eq!(
            wire(full("hello"), Out::Length(5), 2).0,
            Ok(b"hello".to_vec())
        );
        assert_eq!(
            wire(full("hello!"), Out::Length(5), 64).0,
            Err(WriteError::TooLong)
        );
        assert_eq!(
            wire(full("hell"), Out::Length(5), 64).0,
            Err(WriteError::TooShort(1))
        );
    }

    /// Chunks, small and large, survive writes cut anywhere; trailers go out only when
    /// announced and allowed as trailers.
    #[test]
    fn chunks_and_trailers_survive_short_writes() {
        let big = Bytes::from(vec![b'x'; 2000]);
        let mut t = http::HeaderMap::new();
        t.insert("grpc-status", "0".parse().unwrap());
        t.insert("location", "//evil.example/".parse().unwrap());
        t.insert("x-unannounced", "1".parse().unwrap());
        let body = || {
            frames(vec![
                Frame::data(Bytes::from_static(b"ab")),
                Frame::data(big.clone()),
                Frame::trailers(t.clone()),
            ])
        };
        let allowed: Box<[HeaderName]> = [
            HeaderName::from_static("grpc-status"),
            HeaderName::from_static("location"),
        ]
        .into();
        let mut want = b"2\r\nab\r\n7d0\r\n".to_vec();
        want.extend_from_slice(&big);
        want.extend_from_slice(b"\r\n0\r\ngrpc-status: 0\r\n\r\n");
        for step in [1, 7, 512, 1 << 20] {
            let (got, writes) = wire(body(), Out::Chunked(Some(allowed.clone())), step);
            assert_eq!(got, Ok(want.clone()), "step {step}");
            if step == 1 << 20 {
                assert_eq!(writes, 1, "one vectored write for the whole response");
            }
        }
    }
}
