//! Streaming a file from disk in chunks.
//!
//! Reads are synchronous on the worker thread, as nginx does without `aio`: files served are
//! expected to be in the page cache, and a read of one chunk is a memcpy. Memory per response
//! is one chunk.

use std::fs::File;
use std::io::Read;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};

use crate::body::BoxError;

/// Bytes read per frame.
pub(crate) const CHUNK: usize = 128 * 1024;

/// `remaining` bytes of `file` from its current position.
pub(crate) struct FileBody {
    file: File,
    remaining: u64,
}

impl FileBody {
    pub(crate) fn new(file: File, remaining: u64) -> Self {
        FileBody { file, remaining }
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
        let want = (self.remaining.min(CHUNK as u64)) as usize;
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
