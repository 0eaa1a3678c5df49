//! Streaming a file from disk in chunks.
//!
//! Reads are synchronous on the worker thread, as nginx does without `aio`: files served are
//! expected to be in the page cache, and a read of one chunk is a memcpy. Memory per response
//! is one chunk. The first chunk is small ([`FIRST_CHUNK`]) and each next one twice the last,
//! up to [`CHUNK`]: HTTP/2 reads one chunk of a stream before it waits for the client's
//! flow-control window, so a stream whose client grants no window holds 16 KiB, not 128 KiB
//! (128 such streams on one connection: 2 MiB), while a stream that flows reaches full-size
//! chunks after three.

use std::fs::File;
use std::io::Read;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};

use crate::http::body::BoxError;

/// Largest read per frame.
pub(crate) const CHUNK: usize = 128 * 1024;
/// The first read of a body.
pub(crate) const FIRST_CHUNK: usize = 16 * 1024;

/// `remaining` bytes of `file` from its current position.
pub(crate) struct FileBody {
    file: File,
    remaining: u64,
    /// Size of the next read.
    next: usize,
}

impl FileBody {
    pub(crate) fn new(file: File, remaining: u64) -> Self {
        FileBody {
            file,
            remaining,
            next: FIRST_CHUNK,
        }
    }
}

impl Body for FileBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.remaining == 0 {
            return Poll::Ready(None);
        }
        let want = (self.remaining.min(self.next as u64)) as usize;
        self.next = (self.next * 2).min(CHUNK);
        let mut buf = BytesMut::zeroed(want);
        let mut filled = 0;
        while filled < want {
            match self.file.read(&mut buf[filled..]) {
                Ok(0) => {
                    return Poll::Ready(Some(Err("file shrank while it was being sent".into())))
                }
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Poll::Ready(Some(Err(e.into()))),
            }
        }
        self.remaining -= want as u64;
        Poll::Ready(Some(Ok(Frame::data(buf.freeze()))))
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn chunks_start_small_and_grow_to_the_cap() {
        let mut f = tempfile::tempfile().unwrap();
        let len = 1024 * 1024 + 5;
        std::io::Write::write_all(&mut f, &vec![1u8; len]).unwrap();
        std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(0)).unwrap();
        let mut body = FileBody::new(f, len as u64);
        let mut sizes = Vec::new();
        while let Some(frame) = body.frame().await {
            sizes.push(frame.unwrap().into_data().unwrap().len());
        }
        assert_eq!(&sizes[..4], &[FIRST_CHUNK, 32 * 1024, 64 * 1024, CHUNK]);
        assert!(sizes[3..sizes.len() - 1].iter().all(|&s| s == CHUNK));
        assert_eq!(sizes.iter().sum::<usize>(), len);
    }
}
