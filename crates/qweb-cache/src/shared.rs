//! The body of a fill in flight, held once and read by many: the filler ([`crate::FillBody`])
//! appends the origin's data frames to it, and every request that joined the fill (the
//! filling client's own response included, once the fill is streamed) reads it from its own
//! offset as a [`Follower`], while it grows. Nothing is copied per reader: a follower's frames
//! are slices of the chunks held here (frames under [`MIN_CHUNK`] are first gathered into one
//! chunk, so a body of tiny frames holds few chunks). At the clean end the chunks become the
//! one contiguous body that is stored, which the followers then read.
//!
//! A fill that fails (the origin's body errs or stalls past the proxy's read timeout, ends
//! short, grows over the largest object size, or is given up because no reader is left)
//! drops what it held and ends every follower with a [`FillFailed`] error: their clients see
//! a truncated response (their `Content-Length` was announced), never a short one that looks
//! whole, and never a hang.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};

use crate::policy::Meta;

/// Data frames shorter than this are gathered into one chunk of at least this many bytes
/// before the followers share it (a follower reading the gathering chunk gets a copy of its
/// part); longer ones are held as they came.
pub const MIN_CHUNK: usize = 16 << 10;

/// Why a shared body ended before its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FillFailed {
    /// The origin's body failed (an error, a reset, the proxy's read timeout).
    #[error("the origin's body failed before its end")]
    Upstream,
    /// The origin's body ended shorter than its `Content-Length`.
    #[error("the origin's body ended before its announced length")]
    Short,
    /// The body grew over the largest object size.
    #[error("the origin's body grew over the largest object size")]
    TooLarge,
    /// The fill was given up before its end (no reader was left, or it was dropped).
    #[error("the fill was given up before its end")]
    Abandoned,
}

/// How far the body came.
#[derive(Debug, Clone, Copy, Default)]
enum End {
    #[default]
    Open,
    Done,
    Failed(FillFailed),
}

#[derive(Debug, Default)]
struct State {
    /// Sealed chunks, each with the offset of its first byte.
    chunks: Vec<(usize, Bytes)>,
    /// Frames under [`MIN_CHUNK`] being gathered; its first byte is at `sealed`.
    open: BytesMut,
    /// Bytes in `chunks`.
    sealed: usize,
    end: End,
    /// Followers alive.
    readers: usize,
    next_id: u64,
    /// The followers waiting for more, by id.
    wakers: HashMap<u64, Waker>,
    /// The task that reads the origin for the followers ([`crate::FillBody::drive`]), woken
    /// when the last follower left.
    driver: Option<Waker>,
}

impl State {
    fn len(&self) -> usize {
        self.sealed + self.open.len()
    }

    fn seal(&mut self) {
        if !self.open.is_empty() {
            let chunk = self.open.split().freeze();
            self.chunks.push((self.sealed, chunk.clone()));
            self.sealed += chunk.len();
        }
    }

    fn wake(&mut self) {
        for (_, w) in self.wakers.drain() {
            w.wake();
        }
    }

    /// The bytes held from `offset` on, up to a chunk's end (none when it has them all).
    fn read(&self, offset: usize) -> Option<Bytes> {
        if offset >= self.len() {
            return None;
        }
        if offset >= self.sealed {
            return Some(Bytes::copy_from_slice(&self.open[offset - self.sealed..]));
        }
        let i = self
            .chunks
            .partition_point(|(start, b)| start + b.len() <= offset);
        let (start, b) = self.chunks.get(i)?;
        Some(b.slice(offset - start..))
    }
}

/// One body shared by its filler and its followers.
#[derive(Debug, Default)]
pub struct Shared {
    state: Mutex<State>,
}

impl Shared {
    /// An empty body.
    pub fn new() -> Arc<Shared> {
        Arc::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // a panic under the lock leaves chunks that are whole: go on
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes held so far.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Followers alive.
    pub fn readers(&self) -> usize {
        self.lock().readers
    }

    /// Appends a data frame and wakes the followers.
    pub(crate) fn push(&self, data: &Bytes) {
        if data.is_empty() {
            return;
        }
        let mut s = self.lock();
        if !matches!(s.end, End::Open) {
            return;
        }
        if data.len() >= MIN_CHUNK {
            s.seal();
            let start = s.sealed;
            s.chunks.push((start, data.clone()));
            s.sealed += data.len();
        } else {
            s.open.extend_from_slice(data);
            if s.open.len() >= MIN_CHUNK {
                s.seal();
            }
        }
        s.wake();
    }

    /// The clean end: the whole body, one contiguous buffer (what is stored), which the
    /// followers read from now on.
    pub(crate) fn finish(&self) -> Bytes {
        let mut s = self.lock();
        s.seal();
        let whole = match s.chunks.as_slice() {
            [] => Bytes::new(),
            [(_, one)] => one.clone(),
            many => {
                let mut all = BytesMut::with_capacity(s.sealed);
                for (_, b) in many {
                    all.extend_from_slice(b);
                }
                all.freeze()
            }
        };
        s.chunks = vec![(0, whole.clone())];
        s.end = End::Done;
        s.wake();
        whole
    }

    /// Ends the body before its end: what was held is dropped and every follower ends with
    /// `why` (a body already ended stays as it is).
    pub(crate) fn fail(&self, why: FillFailed) {
        let mut s = self.lock();
        if !matches!(s.end, End::Open) {
            return;
        }
        s.end = End::Failed(why);
        s.chunks = Vec::new();
        s.open = BytesMut::new();
        s.sealed = 0;
        s.wake();
    }

    /// Whether a follower is left; the driver's `waker` is woken when the last one leaves.
    pub(crate) fn hold(&self, waker: &Waker) -> bool {
        let mut s = self.lock();
        if s.readers == 0 {
            return false;
        }
        s.driver = Some(waker.clone());
        true
    }

    /// A reader from the first byte, announced `length` long; none once the body failed.
    pub fn follow(self: &Arc<Self>, length: Option<u64>) -> Option<Follower> {
        let mut s = self.lock();
        if matches!(s.end, End::Failed(_)) {
            return None;
        }
        s.readers += 1;
        let id = s.next_id;
        s.next_id += 1;
        Some(Follower {
            shared: self.clone(),
            id,
            offset: 0,
            length,
        })
    }
}

/// A fill in flight whose response head is known, as the requests that join it see it: the
/// stored response's head and its growing body.
#[derive(Debug, Clone)]
pub struct InFlight {
    /// The response's head as it is being stored.
    pub meta: Arc<Meta>,
    /// The store's epoch when its request went to the origin ([`crate::Store::superseded`]).
    pub epoch: u64,
    /// The announced `Content-Length`.
    pub length: Option<u64>,
    body: Arc<Shared>,
}

impl InFlight {
    /// `meta` with `body`, announced `length` long, requested at `epoch`.
    pub fn new(meta: Arc<Meta>, body: Arc<Shared>, length: Option<u64>, epoch: u64) -> InFlight {
        InFlight {
            meta,
            epoch,
            length,
            body,
        }
    }

    /// A reader of its body from the first byte; none once the fill failed.
    pub fn follow(&self) -> Option<Follower> {
        self.body.follow(self.length)
    }
}

/// One reader of a [`Shared`] body: its frames are the body's chunks from its own offset, as
/// they come; it ends with the body, or with the body's [`FillFailed`].
#[derive(Debug)]
pub struct Follower {
    shared: Arc<Shared>,
    id: u64,
    offset: usize,
    length: Option<u64>,
}

impl Drop for Follower {
    fn drop(&mut self) {
        let mut s = self.shared.lock();
        s.readers = s.readers.saturating_sub(1);
        s.wakers.remove(&self.id);
        if s.readers == 0 {
            if let Some(w) = s.driver.take() {
                w.wake();
            }
        }
    }
}

impl Body for Follower {
    type Data = Bytes;
    type Error = FillFailed;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, FillFailed>>> {
        let this = &mut *self;
        let mut s = this.shared.lock();
        if let End::Failed(why) = s.end {
            return Poll::Ready(Some(Err(why)));
        }
        if let Some(b) = s.read(this.offset) {
            this.offset += b.len();
            return Poll::Ready(Some(Ok(Frame::data(b))));
        }
        if let End::Done = s.end {
            return Poll::Ready(None);
        }
        s.wakers.insert(this.id, cx.waker().clone());
        Poll::Pending
    }

    fn size_hint(&self) -> SizeHint {
        match self.length {
            Some(l) => SizeHint::with_exact(l.saturating_sub(self.offset as u64)),
            None => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::time::Duration;

    fn data(n: usize, b: u8) -> Bytes {
        Bytes::from(vec![b; n])
    }

    /// Two followers read the same chunks (slices of one buffer, not copies), each from its
    /// own offset, and both see the clean end.
    #[tokio::test]
    async fn followers_share_one_buffer_and_read_as_it_grows() {
        let shared = Shared::new();
        let mut a = shared.follow(Some(2 * MIN_CHUNK as u64)).unwrap();
        let mut b = shared.follow(Some(2 * MIN_CHUNK as u64)).unwrap();
        let first = data(MIN_CHUNK, b'x');
        shared.push(&first);
        let fa = a.frame().await.unwrap().unwrap().into_data().unwrap();
        let fb = b.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(fa.as_ptr(), first.as_ptr(), "a slice of the chunk held");
        assert_eq!(fb.as_ptr(), first.as_ptr(), "the same for every follower");
        assert_eq!(a.size_hint().exact(), Some(MIN_CHUNK as u64));
        // b waits for more; a push wakes it
        let waiting = tokio::spawn(async move {
            let f = b.frame().await.unwrap().unwrap().into_data().unwrap();
            (f.len(), b.frame().await.is_none())
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "nothing to read yet");
        shared.push(&data(MIN_CHUNK, b'y'));
        let whole = shared.finish();
        assert_eq!(whole.len(), 2 * MIN_CHUNK);
        assert_eq!(waiting.await.unwrap(), (MIN_CHUNK, true));
        let rest = a.collect().await.unwrap().to_bytes();
        assert_eq!(&rest[..], &whole[MIN_CHUNK..]);
        // a follower that comes after the end reads the stored whole
        let late = shared.follow(None).unwrap();
        let got = late.collect().await.unwrap().to_bytes();
        assert_eq!(got.as_ptr(), whole.as_ptr());
    }

    /// Tiny frames are gathered into chunks of MIN_CHUNK, not held one by one; a follower
    /// reading the gathering part gets what is there.
    #[tokio::test]
    async fn tiny_frames_are_gathered() {
        let shared = Shared::new();
        let mut f = shared.follow(None).unwrap();
        for _ in 0..(3 * MIN_CHUNK / 16 + 1) {
            shared.push(&data(16, b'z'));
        }
        assert_eq!(shared.lock().chunks.len(), 3);
        let mut got = 0;
        while got < shared.len() {
            got += f.frame().await.unwrap().unwrap().into_data().unwrap().len();
        }
        assert_eq!(got, 3 * MIN_CHUNK + 16);
    }

    /// A failure drops what was held and ends every follower with its error, one waiting
    /// included; a follower asked for afterwards is refused.
    #[tokio::test]
    async fn a_failure_ends_every_follower_with_an_error() {
        let shared = Shared::new();
        let mut a = shared.follow(Some(100)).unwrap();
        shared.push(&data(10, b'x'));
        a.frame().await.unwrap().unwrap();
        let waiting = tokio::spawn(async move { a.frame().await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        shared.fail(FillFailed::Upstream);
        let got = waiting.await.unwrap();
        assert!(matches!(got, Some(Err(FillFailed::Upstream))), "{got:?}");
        assert!(shared.follow(Some(100)).is_none());
        assert_eq!(shared.len(), 0);
        // a failure after the end changes nothing
        let done = Shared::new();
        done.push(&data(10, b'x'));
        done.finish();
        done.fail(FillFailed::Abandoned);
        assert!(done.follow(None).is_some());
    }

    /// The driver is told when the last follower leaves.
    #[test]
    fn the_last_follower_leaving_wakes_the_driver() {
        struct Flag(std::sync::atomic::AtomicBool);
        impl std::task::Wake for Flag {
            fn wake(self: Arc<Self>) {
                self.0.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let flag = Arc::new(Flag(false.into()));
        let waker = Waker::from(flag.clone());
        let shared = Shared::new();
        assert!(!shared.hold(&waker), "no follower yet");
        let a = shared.follow(None).unwrap();
        let b = shared.follow(None).unwrap();
        assert!(shared.hold(&waker));
        drop(a);
        assert!(!flag.0.load(std::sync::atomic::Ordering::SeqCst));
        drop(b);
        assert!(flag.0.load(std::sync::atomic::Ordering::SeqCst));
        assert!(!shared.hold(&waker));
    }
}
