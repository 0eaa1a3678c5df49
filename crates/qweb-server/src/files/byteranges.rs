//! `multipart/byteranges` (RFC 9110 section 14.6): the 206 for several ranges, as nginx
//! sends it. Each part has its `Content-Type` and `Content-Range`; parts from memory are one
//! buffer, parts from a streamed file are [`FileBody`]s (the first on the opened file, the
//! others reopening it, checked to be the same file, when their turn comes: no extra fd).

use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher};
use std::ops::RangeInclusive;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue};
use http_body::{Body as HttpBody, Frame, SizeHint};

use super::body::{FileBody, Reopen};
use qweb_http::body::{boxed, full, Body, BoxError};

/// A boundary no file is likely to hold: 32 random hex digits.
fn boundary() -> String {
    let a = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(a);
    format!("{a:016x}{:016x}", h.finish())
}

/// Where the parts' bytes come from.
pub(crate) enum PartSource {
    /// The whole representation in memory.
    Memory(Bytes),
    /// A file streamed from disk: makes the body of `offset..offset + count`; `first`: the
    /// first part (it may use the opened file).
    File(Box<dyn FnMut(u64, u64, bool) -> FileBody>),
}

/// The `multipart/byteranges` response's headers (`Content-Type`, `Content-Length`) into `h`
/// and its body (`None` for HEAD).
pub(crate) fn respond(
    h: &mut HeaderMap,
    content_type: &HeaderValue,
    ranges: &[RangeInclusive<u64>],
    len: u64,
    source: Option<PartSource>,
) -> Option<Body> {
    let b = boundary();
    let ct = content_type.to_str().unwrap_or("application/octet-stream");
    let heads: Vec<Bytes> = ranges
        .iter()
        .map(|r| {
            Bytes::from(format!(
                "\r\n--{b}\r\nContent-Type: {ct}\r\nContent-Range: bytes {}-{}/{len}\r\n\r\n",
                r.start(),
                r.end()
            ))
        })
        .collect();
    let tail = Bytes::from(format!("\r\n--{b}--\r\n"));
    let total: u64 = heads.iter().map(|x| x.len() as u64).sum::<u64>()
        + ranges.iter().map(|r| r.end() - r.start() + 1).sum::<u64>()
        + tail.len() as u64;
    if let Ok(v) = HeaderValue::from_str(&format!("multipart/byteranges; boundary={b}")) {
        h.insert(header::CONTENT_TYPE, v);
    }
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(total));
    match source? {
        PartSource::Memory(bytes) => {
            let mut v = Vec::with_capacity(total as usize);
            for (head, r) in heads.iter().zip(ranges) {
                v.extend_from_slice(head);
                let (s, e) = (
                    *r.start() as usize,
                    (*r.end() as usize + 1).min(bytes.len()),
                );
                v.extend_from_slice(&bytes[s.min(e)..e]);
            }
            v.extend_from_slice(&tail);
            Some(full(v))
        }
        PartSource::File(mut part) => {
            let mut parts: VecDeque<Body> = VecDeque::with_capacity(ranges.len() * 2 + 1);
            for (i, (head, r)) in heads.into_iter().zip(ranges).enumerate() {
                parts.push_back(full(head));
                let count = r.end() - r.start() + 1;
                parts.push_back(boxed(part(*r.start(), count, i == 0)));
            }
            parts.push_back(full(tail));
            Some(boxed(Chain { parts, left: total }))
        }
    }
}

/// The first part on `file`, the others reopening it from `source`.
pub(crate) fn file_parts(
    file: std::fs::File,
    source: impl Fn() -> Reopen + 'static,
    ahead: qweb_session::ReadAhead,
) -> PartSource {
    let mut file = Some(file);
    PartSource::File(Box::new(move |offset, count, first| {
        match (first, file.take()) {
            (true, Some(f)) => FileBody::new(f, source(), offset, count, ahead.clone()),
            _ => FileBody::reopened(source(), offset, count, ahead.clone()),
        }
    }))
}

/// Bodies one after the other.
struct Chain {
    parts: VecDeque<Body>,
    /// Bytes still to come (the parts' lengths are exact).
    left: u64,
}

impl HttpBody for Chain {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            let Some(front) = self.parts.front_mut() else {
                return Poll::Ready(None);
            };
            match front.as_mut().poll_frame(cx) {
                Poll::Ready(None) => {
                    self.parts.pop_front();
                }
                Poll::Ready(Some(Ok(f))) => {
                    if let Some(d) = f.data_ref() {
                        self.left = self.left.saturating_sub(d.len() as u64);
                    }
                    return Poll::Ready(Some(Ok(f)));
                }
                other => return other,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.parts.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left)
    }
}
