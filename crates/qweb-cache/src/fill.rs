//! The body that fills the store while it streams to the client: each data frame is passed
//! on as it comes and kept; at the body's clean end the whole is stored. A body that grows
//! over the largest object size stops being kept (and streams on); one that ends early, fails
//! or is dropped (the client went away) stores nothing, and its fill guard, dropped with it,
//! lets the requests waiting on the key go to the origin themselves.

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};

use crate::policy::Meta;
use crate::store::{Entry, FillGuard, Store};

/// What is stored at the body's end.
#[derive(Debug)]
pub struct Pending {
    store: Arc<Store>,
    key: String,
    /// Taken when stored or given up for a known reason; still here when dropped: the
    /// fill was abandoned.
    meta: Option<Meta>,
    /// The body's `Content-Length`: a body that ends shorter is not stored.
    length: Option<u64>,
    /// The store's epoch when the request went to the origin ([`Store::insert_since`]).
    epoch: u64,
    /// Held until the fill ends.
    _guard: Option<FillGuard>,
}

impl Pending {
    /// Stores `meta` and the body under `key` at its end (`length`: its announced length)
    /// unless the key was purged after `epoch` (the store's [`Store::epoch`] when the request
    /// went to the origin); `guard` is released when the fill ends.
    pub fn new(
        store: Arc<Store>,
        key: String,
        meta: Meta,
        length: Option<u64>,
        epoch: u64,
        guard: Option<FillGuard>,
    ) -> Pending {
        Pending {
            store,
            key,
            meta: Some(meta),
            length,
            epoch,
            _guard: guard,
        }
    }
}

pin_project_lite::pin_project! {
    /// A response body teed into the store.
    pub struct FillBody<B> {
        #[pin]
        inner: B,
        kept: BytesMut,
        pending: Option<Pending>,
    }
}

impl<B> FillBody<B> {
    /// `inner`, stored as `pending` says when it ends cleanly.
    pub fn new(inner: B, pending: Pending) -> FillBody<B> {
        FillBody {
            inner,
            kept: BytesMut::new(),
            pending: Some(pending),
        }
    }
}

impl Pending {
    /// Stores `body` when it has the announced length.
    fn finish(mut self, body: Bytes) {
        let Some(meta) = self.meta.take() else {
            return;
        };
        if self.length.is_none_or(|l| l == body.len() as u64) {
            self.store
                .insert_since(&self.key, Entry::new(meta, body), self.epoch);
        } else {
            self.store.stats().abandoned.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Gives up: the body is over the largest object size.
    fn too_large(mut self) {
        self.meta = None;
        self.store.stats().too_large.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.meta.is_some() {
            self.store.stats().abandoned.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl<B> Body for FillBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        match &frame {
            Some(Ok(f)) => {
                if let (Some(data), Some(p)) = (f.data_ref(), this.pending.as_ref()) {
                    if this.kept.len() + data.len() > p.store.limits().max_object_size {
                        if let Some(p) = this.pending.take() {
                            p.too_large();
                        }
                        *this.kept = BytesMut::new();
                    } else {
                        this.kept.extend_from_slice(data);
                    }
                }
            }
            Some(Err(_)) => {
                // dropped: counted as abandoned
                *this.pending = None;
                *this.kept = BytesMut::new();
            }
            None => {
                if let Some(p) = this.pending.take() {
                    p.finish(std::mem::take(this.kept).freeze());
                }
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        // never reported early: the end is seen by poll_frame returning None, which stores
        false
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Limits;
    use http::{HeaderMap, StatusCode};
    use http_body_util::BodyExt;
    use std::time::SystemTime;

    fn pending(store: &Arc<Store>, length: Option<u64>) -> Pending {
        let now = SystemTime::now();
        let meta = Meta::new(
            StatusCode::OK,
            &HeaderMap::new(),
            &HeaderMap::new(),
            now,
            now,
        );
        Pending::new(store.clone(), "k".into(), meta, length, store.epoch(), None)
    }

    /// `n` data frames of `size` bytes, each ready at once.
    struct Chunks(std::collections::VecDeque<Bytes>);

    impl Body for Chunks {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
        }
    }

    fn chunks(n: usize, size: usize) -> Chunks {
        Chunks((0..n).map(|_| Bytes::from(vec![b'a'; size])).collect())
    }

    #[tokio::test]
    async fn a_whole_body_is_stored_and_streamed() {
        let store = Store::new(Limits::new(1 << 20, 1 << 16));
        let body = FillBody::new(chunks(4, 100), pending(&store, Some(400)));
        let got = body.collect().await.unwrap().to_bytes();
        assert_eq!(got.len(), 400);
        let e = store.lookup("k", &HeaderMap::new()).expect("stored");
        assert_eq!(e.body.len(), 400);
    }

    #[tokio::test]
    async fn an_object_over_the_limit_streams_through_unstored() {
        let store = Store::new(Limits::new(1 << 20, 250));
        let body = FillBody::new(chunks(4, 100), pending(&store, None));
        assert_eq!(body.collect().await.unwrap().to_bytes().len(), 400);
        assert!(store.lookup("k", &HeaderMap::new()).is_none());
        assert_eq!(store.stats().too_large.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn a_body_dropped_midway_or_short_stores_nothing() {
        let store = Store::new(Limits::new(1 << 20, 1 << 16));
        let mut body = Box::pin(FillBody::new(chunks(4, 100), pending(&store, Some(400))));
        body.frame().await.unwrap().unwrap();
        drop(body);
        assert!(store.lookup("k", &HeaderMap::new()).is_none());
        assert_eq!(store.stats().abandoned.load(Ordering::Relaxed), 1);
        let short = FillBody::new(chunks(3, 100), pending(&store, Some(400)));
        short.collect().await.unwrap();
        assert!(store.lookup("k", &HeaderMap::new()).is_none());
    }
}
