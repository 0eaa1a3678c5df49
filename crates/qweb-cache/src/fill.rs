//! The body that fills the store while it streams: each data frame is passed on as it comes
//! and kept in the fill's [`Shared`] body; at the body's clean end the whole is stored. A body
//! that grows over the largest object size stops being kept (and streams on); one that ends
//! early, fails or is dropped (the client went away) stores nothing, and its fill guard,
//! dropped with it, lets the requests waiting on the key go to the origin themselves.
//!
//! **Streamed to the waiters.** A fill whose size is known and within the largest object size
//! (its `Content-Length`) is shared: [`Pending::share`] hands the response head and the
//! growing body to the requests waiting on the key ([`crate::Fill::Wait`]), which answer from
//! it at once, each a [`crate::Follower`] reading from its own offset; the filling client
//! reads it the same way, and the origin's body is read by [`FillBody::drive`], a task of
//! its own. So the filling client going away does not end the fill while a waiter reads
//! (the body is bounded by the largest object size); once the last reader left, it is given
//! up. A fill of unknown size is not shared (it may grow past the largest object size, and a
//! waiter that had its head could then not be given the rest): its waiters wait for its end.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::policy::Meta;
use crate::shared::{FillFailed, Follower, InFlight, Shared};
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
    /// The body kept so far, shared with the fill's followers.
    body: Arc<Shared>,
    /// Held until the fill ends.
    guard: Option<FillGuard>,
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
            body: Shared::new(),
            guard,
        }
    }

    /// Streams the fill to the requests waiting on its key: they are handed its head and
    /// growing body (the guard's [`FillGuard::publish`]); the filling client's own reader of
    /// it is returned. The body is then read by [`FillBody::drive`] while a reader is left.
    pub fn share(&self) -> Option<Follower> {
        let meta = self.meta.as_ref()?;
        let own = self.body.follow(self.length)?;
        if let Some(g) = &self.guard {
            g.publish(InFlight::new(
                Arc::new(meta.clone()),
                self.body.clone(),
                self.length,
                self.epoch,
            ));
        }
        Some(own)
    }
}

pin_project_lite::pin_project! {
    /// A response body teed into the store.
    pub struct FillBody<B> {
        #[pin]
        inner: B,
        pending: Option<Pending>,
    }
}

impl<B> FillBody<B> {
    /// `inner`, stored as `pending` says when it ends cleanly.
    pub fn new(inner: B, pending: Pending) -> FillBody<B> {
        FillBody {
            inner,
            pending: Some(pending),
        }
    }
}

impl<B> FillBody<B>
where
    B: Body<Data = Bytes>,
{
    /// Reads the body to its end for the readers of the shared body ([`Pending::share`]),
    /// with no client of its own: it ends at the body's end (stored), when the body fails
    /// (the followers get the error), or when no reader is left (given up, nothing stored).
    pub async fn drive(self) {
        let mut this = std::pin::pin!(self);
        poll_fn(|cx| this.as_mut().poll_drive(cx)).await;
    }

    fn poll_drive(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            match self.as_mut().project().pending.as_ref() {
                Some(p) if !p.body.hold(cx.waker()) => {
                    // dropped: counted as abandoned, its followers (none) ended
                    *self.as_mut().project().pending = None;
                    return Poll::Ready(());
                }
                Some(_) => {}
                None => return Poll::Ready(()),
            }
            match ready!(self.as_mut().poll_frame(cx)) {
                Some(Ok(_)) => continue,
                _ => return Poll::Ready(()),
            }
        }
    }
}

impl Pending {
    /// Stores the body when it has the announced length.
    fn finish(mut self) {
        let Some(meta) = self.meta.take() else {
            return;
        };
        if self.length.is_none_or(|l| l == self.body.len() as u64) {
            let body = self.body.finish();
            self.store
                .insert_since(&self.key, Entry::new(meta, body), self.epoch);
        } else {
            self.body.fail(FillFailed::Short);
            self.store.stats().abandoned.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Gives up: the body is over the largest object size.
    fn too_large(mut self) {
        self.meta = None;
        self.body.fail(FillFailed::TooLarge);
        self.store.stats().too_large.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.meta.is_some() {
            self.body.fail(FillFailed::Abandoned);
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
                    if p.body.len() + data.len() > p.store.limits().max_object_size {
                        if let Some(p) = this.pending.take() {
                            p.too_large();
                        }
                    } else {
                        p.body.push(data);
                    }
                }
            }
            Some(Err(_)) => {
                // dropped: counted as abandoned
                if let Some(p) = this.pending.take() {
                    p.body.fail(FillFailed::Upstream);
                }
            }
            None => {
                if let Some(p) = this.pending.take() {
                    p.finish();
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

    /// A body whose frames the test sends, one at a time.
    struct Channel(tokio::sync::mpsc::UnboundedReceiver<Result<Bytes, &'static str>>);

    impl Body for Channel {
        type Data = Bytes;
        type Error = &'static str;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            self.0.poll_recv(cx).map(|f| f.map(|r| r.map(Frame::data)))
        }
    }

    type Sender = tokio::sync::mpsc::UnboundedSender<Result<Bytes, &'static str>>;

    /// A streamed fill of `length` with the guard of key `k`: the origin's sender, the
    /// filling client's reader, the driver's task.
    fn streamed(
        store: &Arc<Store>,
        length: u64,
    ) -> (Sender, Follower, tokio::task::JoinHandle<()>) {
        let crate::Fill::Lead(guard) = store.begin_fill("k") else {
            panic!("leads");
        };
        let mut p = pending(store, Some(length));
        p.guard = Some(guard);
        let own = p.share().expect("a reader");
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(FillBody::new(Channel(rx), p).drive());
        (tx, own, task)
    }

    /// A waiter joining a streamed fill gets its head at once and its body as it comes; the
    /// filling client going away does not end the fill while the waiter reads, and the whole
    /// is stored at the end.
    #[tokio::test]
    async fn a_streamed_fill_goes_on_for_its_waiters_and_is_stored() {
        let store = Store::new(Limits::new(1 << 20, 1 << 16));
        let (tx, own, task) = streamed(&store, 300);
        let crate::Fill::Wait(rx) = store.begin_fill("k") else {
            panic!("waits");
        };
        let fill = rx.borrow().clone().expect("the head is handed over");
        assert_eq!(fill.length, Some(300));
        let mut waiter = fill.follow().expect("a reader");
        tx.send(Ok(Bytes::from(vec![b'a'; 100]))).unwrap();
        let first = waiter.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first.len(), 100, "the first bytes before the body's end");
        drop(own);
        tx.send(Ok(Bytes::from(vec![b'b'; 200]))).unwrap();
        drop(tx);
        let rest = waiter.collect().await.unwrap().to_bytes();
        assert_eq!(rest.len(), 200);
        task.await.unwrap();
        let e = store.lookup("k", &HeaderMap::new()).expect("stored");
        assert_eq!(e.body.len(), 300);
        assert!(
            matches!(store.begin_fill("k"), crate::Fill::Lead(_)),
            "ended"
        );
    }

    /// Once the last reader left, a stalled streamed fill is given up at once: nothing is
    /// stored and the key's fill ends; an origin error ends every reader with an error.
    #[tokio::test]
    async fn a_streamed_fill_ends_with_its_readers_or_its_origin() {
        let store = Store::new(Limits::new(1 << 20, 1 << 16));
        let (tx, own, task) = streamed(&store, 300);
        tx.send(Ok(Bytes::from(vec![b'a'; 100]))).unwrap();
        drop(own);
        tokio::time::timeout(std::time::Duration::from_secs(5), task)
            .await
            .expect("given up with no reader")
            .unwrap();
        assert!(store.lookup("k", &HeaderMap::new()).is_none());
        assert_eq!(store.stats().abandoned.load(Ordering::Relaxed), 1);
        let (tx, mut own, task) = streamed(&store, 300);
        tx.send(Ok(Bytes::from(vec![b'a'; 100]))).unwrap();
        own.frame().await.unwrap().unwrap();
        tx.send(Err("reset")).unwrap();
        task.await.unwrap();
        let end = own.frame().await;
        assert!(matches!(end, Some(Err(FillFailed::Upstream))), "{end:?}");
        assert!(store.lookup("k", &HeaderMap::new()).is_none());
    }
}
