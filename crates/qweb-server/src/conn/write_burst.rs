//! Write bursts: how many bytes one connection may write before its worker turns to its other
//! connections (`[limits] write_burst`, nginx's `sendfile_max_chunk`).
//!
//! A client that reads as fast as the server writes (a big download on loopback or a fast
//! link) never makes its socket return `WouldBlock`, so its connection task would keep the
//! worker thread for as long as hyper keeps finding body chunks to encrypt and send; every
//! other connection on that worker waits. After `limit` bytes without the socket pushing back,
//! the connection yields with [`tokio::task::yield_now`], which wakes it again only after the
//! worker has polled its sockets and timers, so the other connections' ready requests run
//! first.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// One connection's write burst counter.
pub(crate) struct WriteBurst {
    limit: usize,
    written: usize,
    yielding: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl WriteBurst {
    /// A counter that yields after `limit` bytes written in a row.
    pub(crate) fn new(limit: usize) -> Self {
        WriteBurst {
            limit: limit.max(1),
            written: 0,
            yielding: None,
        }
    }

    /// Called before a write: `Ready` when the connection may write, `Pending` while it gives
    /// the worker to the others (its waker fires after the worker's next I/O poll).
    pub(crate) fn poll_turn(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.written < self.limit {
            return Poll::Ready(());
        }
        let turn = self
            .yielding
            .get_or_insert_with(|| Box::pin(tokio::task::yield_now()));
        match turn.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.yielding = None;
                self.written = 0;
                Poll::Ready(())
            }
            Poll::Pending => Poll::Pending,
        }
    }

    /// `n` bytes were written.
    pub(crate) fn wrote(&mut self, n: usize) {
        self.written = self.written.saturating_add(n);
    }

    /// The socket pushed back (the write returned `Pending`): the task yields anyway, so the
    /// burst starts over.
    pub(crate) fn pushed_back(&mut self) {
        self.written = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;

    #[tokio::test(flavor = "current_thread")]
    async fn yields_once_per_limit_bytes_and_then_goes_on() {
        let mut b = WriteBurst::new(100);
        let mut pending = 0;
        let mut written = 0;
        // a writer that never blocks: 10 writes of 30 bytes
        for _ in 0..10 {
            poll_fn(|cx| match b.poll_turn(cx) {
                Poll::Ready(()) => Poll::Ready(()),
                Poll::Pending => {
                    pending += 1;
                    Poll::Pending
                }
            })
            .await;
            b.wrote(30);
            written += 30;
        }
        assert_eq!(written, 300);
        // turns after 120, 240 bytes (each burst stops at the first write past 100)
        assert_eq!(pending, 2);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_socket_that_pushes_back_resets_the_burst() {
        let mut b = WriteBurst::new(100);
        b.wrote(90);
        b.pushed_back();
        b.wrote(90);
        let r = poll_fn(|cx| Poll::Ready(b.poll_turn(cx))).await;
        assert_eq!(r, Poll::Ready(()));
        b.wrote(20);
        let r = poll_fn(|cx| Poll::Ready(b.poll_turn(cx))).await;
        assert_eq!(r, Poll::Pending, "110 bytes in a row: the worker's turn");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn other_tasks_run_before_the_yielding_connection_goes_on() {
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let order = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
                let o = order.clone();
                let writer = tokio::task::spawn_local(async move {
                    let mut b = WriteBurst::new(10);
                    for _ in 0..3 {
                        poll_fn(|cx| b.poll_turn(cx)).await;
                        b.wrote(10);
                        o.borrow_mut().push("write");
                    }
                });
                let o = order.clone();
                let other = tokio::task::spawn_local(async move {
                    o.borrow_mut().push("other");
                });
                writer.await.unwrap();
                other.await.unwrap();
                let order = order.borrow();
                let first_other = order.iter().position(|s| *s == "other").unwrap();
                assert!(
                    first_other < 2,
                    "the other task waited for the burst: {order:?}"
                );
            })
            .await;
    }
}
