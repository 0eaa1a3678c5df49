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
use crate::body::FileBytes;

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
    /// The body's bytes are also this file's: chunks from it are sent from the file where the
    /// transport can ([`SendFile`]).
    pub file: Option<FileBytes>,
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
            file: None,
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
                self.body_bytes(d, out);
            }
            Out::Chunked(_) => {
                out.small(|b| encode::chunk_size(b, d.len()));
                self.body_bytes(d, out);
                out.small(|b| b.extend_from_slice(b"\r\n"));
            }
            Out::Close => self.body_bytes(d, out),
            Out::None => {}
        }
        Ok(())
    }

    /// Queues a body chunk: from the file when it is a part of [`Writing::file`].
    fn body_bytes(&self, d: Bytes, out: &mut Output) {
        match self.file.as_ref().and_then(|f| Some((f, f.offset_of(&d)?))) {
            Some((f, offset)) if d.len() >= SEND_FILE_MIN => out.file(d, f, offset),
            _ => out.data(d),
        }
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
    /// Bytes that are also `file`'s from `offset` on (sent from the file where the transport
    /// can, else as `Data`).
    File(Bytes, std::sync::Arc<std::fs::File>, u64),
}

impl Piece {
    fn len(&self) -> usize {
        match self {
            Piece::Small(s, e) => e - s,
            Piece::Data(d) | Piece::File(d, ..) => d.len(),
        }
    }
}

/// Body chunks smaller than this are written with the framing even when a file holds them
/// (a `sendfile` call of its own costs more than copying a few KiB).
pub const SEND_FILE_MIN: usize = 16 * 1024;

impl<T: SendFile + ?Sized> SendFile for Box<T> {
    fn can_send_file(&self) -> bool {
        (**self).can_send_file()
    }

    fn poll_send_file(
        &mut self,
        cx: &mut Context<'_>,
        file: &std::fs::File,
        offset: u64,
        len: usize,
    ) -> Option<Poll<io::Result<usize>>> {
        (**self).poll_send_file(cx, file, offset, len)
    }

    fn poll_write_more(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Option<Poll<io::Result<usize>>> {
        (**self).poll_write_more(cx, bufs)
    }
}

/// A transport that may send a file's bytes without copying them through user space.
pub trait SendFile: AsyncWrite + Unpin {
    /// Whether [`SendFile::poll_send_file`] can send (else file pieces are written as bytes,
    /// with the pieces around them).
    fn can_send_file(&self) -> bool {
        false
    }

    /// Sends up to `len` bytes of `file` from `offset` (`sendfile(2)`); `None` when this
    /// transport cannot (TLS, a test pipe): the bytes are written as usual.
    fn poll_send_file(
        &mut self,
        _cx: &mut Context<'_>,
        _file: &std::fs::File,
        _offset: u64,
        _len: usize,
    ) -> Option<Poll<io::Result<usize>>> {
        None
    }

    /// A vectored write that tells the kernel more follows at once (`MSG_MORE`: the head
    /// before a body sent from a file leaves in the body's first segment, not in a packet of
    /// its own); `None`: written as usual.
    fn poll_write_more(
        &mut self,
        _cx: &mut Context<'_>,
        _bufs: &[io::IoSlice<'_>],
    ) -> Option<Poll<io::Result<usize>>> {
        None
    }
}

/// Body chunks up to this size are copied next to the framing (one buffer less to write).
const COPY_BELOW: usize = 512;

impl Output {
    /// Nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// Bytes queued.
    pub fn queued(&self) -> usize {
        self.queued
    }

    /// Makes room for `n` bytes of framing at once (HTTP/2 queues many small frames a turn:
    /// one allocation rather than a chain of reallocations, each copying what was queued).
    pub fn reserve_small(&mut self, n: usize) {
        self.small.reserve(n);
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

    /// Appends a body chunk that `file` also holds from `offset`.
    pub fn file(&mut self, d: Bytes, file: &FileBytes, offset: u64) {
        self.queued += d.len();
        self.pieces
            .push_back(Piece::File(d, file.file.clone(), offset));
    }

    /// Writes until everything queued is out (or the socket is full).
    pub fn poll_write<T: SendFile>(
        &mut self,
        cx: &mut Context<'_>,
        io: &mut T,
    ) -> Poll<io::Result<()>> {
        while let Some(front) = self.pieces.front() {
            let sent = match front {
                Piece::File(d, file, offset) if io.can_send_file() => {
                    let at = self.front;
                    io.poll_send_file(cx, file, offset + at as u64, d.len() - at)
                }
                _ => None,
            };
            let mut n = match sent {
                Some(r) => ready!(r)?,
                None => ready!(self.poll_vectored(cx, io))?,
            };
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.queued = self.queued.saturating_sub(n);
            while n > 0 {
                let Some(p) = self.pieces.front() else { break };
                let len = p.len() - self.front;
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

    /// One vectored write of the pieces in front, up to the next one [`SendFile`] may send
    /// from its file (a file piece in front goes as bytes: the transport cannot send files).
    fn poll_vectored<T: SendFile>(
        &self,
        cx: &mut Context<'_>,
        io: &mut T,
    ) -> Poll<io::Result<usize>> {
        let mut slices = [io::IoSlice::new(&[]); 16];
        let mut k = 0;
        let files = io.can_send_file();
        let mut file_next = false;
        for (i, p) in self.pieces.iter().take(slices.len()).enumerate() {
            let bytes = match p {
                Piece::Small(s, e) => &self.small[*s..*e],
                Piece::Data(d) => &d[..],
                // (sent from its file once it is in front)
                Piece::File(..) if i > 0 && files => {
                    file_next = true;
                    break;
                }
                Piece::File(d, ..) => &d[..],
            };
            let skip = if i == 0 { self.front } else { 0 };
            slices[k] = io::IoSlice::new(&bytes[skip..]);
            k += 1;
        }
        if file_next {
            if let Some(r) = io.poll_write_more(cx, &slices[..k]) {
                return r;
            }
        }
        Pin::new(&mut *io).poll_write_vectored(cx, &slices[..k])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::{boxed, full, Body};
    use http::header::HeaderName;
    use http_body::Frame;

    /// A writer that takes at most `step` bytes a call, and records them; with `files`, it
    /// also sends from files (reading them, as `sendfile` would), counting those bytes.
    struct Trickle {
        step: usize,
        got: Vec<u8>,
        writes: usize,
        files: bool,
        from_files: usize,
    }

    impl SendFile for Trickle {
        fn can_send_file(&self) -> bool {
            self.files
        }

        fn poll_send_file(
            &mut self,
            _: &mut Context<'_>,
            file: &std::fs::File,
            offset: u64,
            len: usize,
        ) -> Option<Poll<io::Result<usize>>> {
            use std::os::unix::fs::FileExt;
            if !self.files {
                return None;
            }
            let mut buf = vec![0; len.min(self.step)];
            let n = match file.read_at(&mut buf, offset) {
                Ok(n) => n,
                Err(e) => return Some(Poll::Ready(Err(e))),
            };
            self.got.extend_from_slice(&buf[..n]);
            self.from_files += n;
            self.writes += 1;
            Some(Poll::Ready(Ok(n)))
        }
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
        let (r, writes, _) = wire_with(body, framing, step, None);
        (r, writes)
    }

    /// [`wire`], the body's bytes also in `file` (and the writer able to send files then);
    /// also the bytes sent from the file.
    fn wire_with(
        body: Body,
        framing: Out,
        step: usize,
        file: Option<FileBytes>,
    ) -> (Result<Vec<u8>, WriteError>, usize, usize) {
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut w = Writing::new(Some(body), framing, true, false);
        let mut out = Output::default();
        let mut io = Trickle {
            step,
            got: Vec::new(),
            writes: 0,
            files: file.is_some(),
            from_files: 0,
        };
        w.file = file;
        while w.body.is_some() {
            if let Err(e) = w.fill(&mut cx, &mut out) {
                return (Err(e), io.writes, io.from_files);
            }
            match out.poll_write(&mut cx, &mut io) {
                Poll::Ready(Ok(())) => {}
                other => panic!("{other:?}"),
            }
        }
        (Ok(io.got), io.writes, io.from_files)
    }

    /// A body whose bytes a file also holds: its chunks of at least [`SEND_FILE_MIN`] go
    /// from the file (each part, however the writer splits it), the framing and small chunks
    /// as bytes, and the wire is the same as without the file. A body with the same content
    /// at another address (a phase replaced it) is never sent from the file.
    #[test]
    fn chunks_of_a_file_backed_body_go_from_the_file() {
        let content: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let path = std::env::temp_dir().join(format!("qweb-write-{}", std::process::id()));
        std::fs::write(&path, &content).unwrap();
        let file = FileBytes {
            file: std::sync::Arc::new(std::fs::File::open(&path).unwrap()),
            bytes: Bytes::from(content.clone()),
        };
        std::fs::remove_file(&path).unwrap();
        let parts = |b: &Bytes| {
            frames(vec![
                Frame::data(b.slice(..40_000)),
                Frame::data(b.slice(40_000..40_100)),
                Frame::data(b.slice(40_100..)),
            ])
        };
        for framing in [Out::Length(100_000), Out::Chunked(None)] {
            let (plain, _, _) = wire_with(parts(&file.bytes), framing.clone(), 7000, None);
            let (sent, _, from_file) = wire_with(
                parts(&file.bytes),
                framing.clone(),
                7000,
                Some(file.clone()),
            );
            assert_eq!(sent, plain);
            assert_eq!(from_file, 100_000 - 100, "{framing:?}");
            let copy = Bytes::from(content.clone());
            let (sent, _, from_file) = wire_with(parts(&copy), framing, 7000, Some(file.clone()));
            assert_eq!(sent, plain);
            assert_eq!(from_file, 0);
        }
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
