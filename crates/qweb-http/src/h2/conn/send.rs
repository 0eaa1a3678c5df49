//! The other side of the streams: request bodies and tunnels taking the client's DATA,
//! responses queued as the windows allow.

use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{self, HeaderMap};
use http::StatusCode;

use super::{set_waker, Connection, Reason, StreamEnded, COPY_BELOW, OUT_HIGH};
use crate::h2::encode;
use crate::h2::frame::{self, flag, kind, HEAD_LEN};

impl Connection {
    // ----- the request body's side -----

    /// The next frame of stream `id`'s request body: data, then trailers; `None` at its end.
    pub fn poll_body(
        &mut self,
        id: u32,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, StreamEnded>>> {
        let Some(s) = self.streams.get_mut(&id) else {
            return Poll::Ready(Some(Err(StreamEnded("the stream was reset"))));
        };
        if s.body_done {
            return Poll::Ready(None);
        }
        if let Some(d) = s.recv.pop_front() {
            let n = d.len() as u32;
            self.release_stream(id, n);
            self.release_conn(n);
            return Poll::Ready(Some(Ok(http_body::Frame::data(d))));
        }
        if let Some(t) = s.trailers.take() {
            s.body_done = true;
            self.maybe_close(id);
            return Poll::Ready(Some(Ok(http_body::Frame::trailers(t))));
        }
        if !s.recv_open {
            s.body_done = true;
            self.maybe_close(id);
            return Poll::Ready(None);
        }
        if std::mem::take(&mut s.expect_continue) && !s.head_sent {
            self.put_block(id, false, |b, t| {
                encode::response_head(b, StatusCode::CONTINUE, &HeaderMap::new(), None, t)
            });
        }
        if let Some(s) = self.streams.get_mut(&id) {
            set_waker(&mut s.body_waker, cx);
        }
        Poll::Pending
    }

    /// Whether stream `id`'s body is over.
    pub fn body_ended(&self, id: u32) -> bool {
        self.streams.get(&id).is_none_or(|s| {
            s.body_done || !s.recv_open && s.recv.is_empty() && s.trailers.is_none()
        })
    }

    /// Request body bytes stream `id` announced and has not sent yet (`Content-Length`).
    pub fn body_remaining(&self, id: u32) -> Option<u64> {
        let s = self.streams.get(&id)?;
        let held: usize = s.recv.iter().map(Bytes::len).sum();
        s.content_length
            .map(|n| n.saturating_sub(s.received) + held as u64)
    }

    /// Stream `id`'s body was dropped: what it holds and what still comes is discarded (the
    /// window given back), and once the response is over the client is told to stop sending
    /// (RST_STREAM NO_ERROR, RFC 9113 section 8.1).
    pub fn drop_body(&mut self, id: u32) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        if s.body_done {
            return;
        }
        s.body_done = true;
        s.body_waker = None;
        let held: usize = s.recv.drain(..).map(|b| b.len()).sum();
        s.trailers = None;
        self.release_conn(held as u32);
        self.release_stream(id, held as u32);
        self.maybe_close(id);
    }

    // ----- the response's side -----

    /// Queues a header block of stream `id`, encoded by `encode` (given whether the block
    /// must start with a table-size update) straight into the queue: one HEADERS frame, or
    /// HEADERS and CONTINUATION frames when it is longer than the client's frame size.
    fn put_block(&mut self, id: u32, end: bool, encode: impl FnOnce(&mut Vec<u8>, bool)) {
        let max = self.peer_max_frame as usize;
        let table_update = std::mem::take(&mut self.table_update);
        let mut too_long = None;
        let flags = flag::END_HEADERS | if end { flag::END_STREAM } else { 0 };
        self.small(|b| {
            let at = b.len();
            frame::put_head(b, 0, kind::HEADERS, flags, id);
            encode(b, table_update);
            let len = b.len() - at - HEAD_LEN;
            if len <= max {
                b[at..at + 3].copy_from_slice(&(len as u32).to_be_bytes()[1..]);
            } else {
                too_long = Some(b.split_off(at + HEAD_LEN));
                b.truncate(at);
            }
        });
        if let Some(block) = too_long {
            self.small(|b| frame::put_header_block(b, id, &block, end, max));
        }
    }

    /// Queues the response head of stream `id` (`end`: it has no body). `length`: the
    /// body's exact length, sent as `Content-Length` when `fields` have none (`Server` and
    /// `Date` are added the same way, see `encode::response_head`). `false`: the stream is
    /// gone (reset), the response is dropped.
    pub fn send_headers(
        &mut self,
        id: u32,
        status: StatusCode,
        fields: HeaderMap,
        length: Option<u64>,
        end: bool,
    ) -> bool {
        let mut end = end;
        let mut length = length.filter(|_| !end);
        let mut fields = fields;
        match self.streams.get_mut(&id) {
            Some(s) if s.send_open && !s.head_sent => {
                s.head_sent = true;
                s.expect_continue = false;
                if s.tunnel {
                    if status.is_success() {
                        // the tunnel opens: the stream goes on, its DATA the tunnel's
                        s.tunnel_open = true;
                        end = false;
                        fields.remove(header::CONTENT_LENGTH);
                        length = None;
                    } else {
                        // refused: an ordinary answer, the client's DATA discarded
                        s.tunnel = false;
                        s.recv.clear();
                    }
                    if let Some(w) = s.tunnel_waker.take() {
                        w.wake();
                    }
                }
            }
            _ => return false,
        }
        self.put_block(id, end, |b, t| {
            encode::response_head(b, status, &fields, length, t)
        });
        if end {
            self.send_closed(id);
        }
        true
    }

    /// Queues trailers, which end stream `id`'s response.
    pub fn send_trailers(&mut self, id: u32, fields: HeaderMap) -> bool {
        if !self
            .streams
            .get(&id)
            .is_some_and(|s| s.send_open && s.head_sent)
        {
            return false;
        }
        self.put_block(id, true, |b, t| encode::trailers(b, &fields, t));
        self.send_closed(id);
        true
    }

    fn send_closed(&mut self, id: u32) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        s.send_open = false;
        s.task = None;
        if s.recv_open && s.body_done && !s.tunnel_open {
            // the response is complete and nobody reads the request: stop the client (a
            // tunnel's server side ended: its client side goes on, RFC 8441 half-close)
            self.reset(id, Reason::NO_ERROR);
            return;
        }
        self.maybe_close(id);
    }

    /// Room for stream `id`'s next DATA: `Ready(Ok(n))` with `n > 0` bytes of window and
    /// queue; `Ready(Err)` when the stream is gone.
    pub fn poll_capacity(
        &mut self,
        id: u32,
        cx: &mut Context<'_>,
    ) -> Poll<Result<usize, StreamEnded>> {
        let conn_window = self.send_window;
        let queue_full = self.queued() >= OUT_HIGH;
        let Some(s) = self.streams.get_mut(&id) else {
            return Poll::Ready(Err(StreamEnded("the stream was reset")));
        };
        if !s.send_open {
            return Poll::Ready(Err(StreamEnded("the response is over")));
        }
        let n = s.send_window.min(conn_window);
        if n > 0 && !queue_full {
            return Poll::Ready(Ok(n as usize));
        }
        set_waker(&mut s.send_waker, cx);
        if !self.blocked.contains(&id) {
            self.blocked.push(id);
        }
        Poll::Pending
    }

    /// Queues what the windows allow of `data` as DATA frames of stream `id` (what is sent is
    /// taken off `data`); `end`: the last frame ends the stream once `data` is all out (an
    /// empty `data` with `end` sends an empty DATA frame with END_STREAM). `false`: the stream
    /// is gone.
    pub fn send_data(&mut self, id: u32, data: &mut Bytes, end: bool) -> bool {
        let max = (self.config.max_data_frame.min(self.peer_max_frame)) as usize;
        loop {
            let full = self.out.queued() >= OUT_HIGH;
            let Some(s) = self.streams.get_mut(&id) else {
                return false;
            };
            if !s.send_open {
                return false;
            }
            let room = s.send_window.min(self.send_window).max(0) as usize;
            let n = data.len().min(room).min(max);
            if n == 0 && !(data.is_empty() && end) {
                return true;
            }
            if full && !data.is_empty() {
                return true;
            }
            s.send_window -= n as i64;
            self.send_window -= n as i64;
            let chunk = data.split_to(n);
            let last = end && data.is_empty();
            let flags = if last { flag::END_STREAM } else { 0 };
            if n < COPY_BELOW {
                self.small(|b| {
                    frame::put_head(b, n, kind::DATA, flags, id);
                    b.extend_from_slice(&chunk);
                });
            } else {
                self.small(|b| frame::put_head(b, n, kind::DATA, flags, id));
                self.out.data(chunk);
                self.queued_more();
            }
            if last {
                self.send_closed(id);
                return true;
            }
            if data.is_empty() {
                return true;
            }
        }
    }

    // ----- a tunnel's side (RFC 8441) -----

    /// `Ready(Ok)` once stream `id`'s 2xx went out (the tunnel is open); `Err` when it was
    /// refused or the stream is gone.
    pub fn poll_tunnel(&mut self, id: u32, cx: &mut Context<'_>) -> Poll<Result<(), StreamEnded>> {
        let Some(s) = self.streams.get_mut(&id) else {
            return Poll::Ready(Err(StreamEnded("the stream was reset")));
        };
        if s.tunnel_open {
            return Poll::Ready(Ok(()));
        }
        if !s.tunnel {
            return Poll::Ready(Err(StreamEnded("the extended CONNECT was refused")));
        }
        set_waker(&mut s.tunnel_waker, cx);
        Poll::Pending
    }

    /// The next bytes the client sent into tunnel `id`: `None` once it ended its side.
    pub fn poll_tunnel_read(
        &mut self,
        id: u32,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, StreamEnded>>> {
        let Some(s) = self.streams.get_mut(&id) else {
            return Poll::Ready(Some(Err(StreamEnded("the stream was reset"))));
        };
        if let Some(d) = s.recv.pop_front() {
            let n = d.len() as u32;
            self.release_stream(id, n);
            self.release_conn(n);
            return Poll::Ready(Some(Ok(d)));
        }
        if !s.recv_open {
            return Poll::Ready(None);
        }
        set_waker(&mut s.body_waker, cx);
        Poll::Pending
    }

    /// The tunnel of stream `id` is dropped: a stream still open either way is reset
    /// (CANCEL), else it is closed.
    pub fn tunnel_closed(&mut self, id: u32) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        s.recv.clear();
        if s.recv_open || s.send_open {
            self.reset(id, Reason::CANCEL);
        } else {
            self.maybe_close(id);
        }
    }

    /// The stream's task ended without ending its response (its body failed, or it was
    /// cancelled): RST_STREAM INTERNAL_ERROR (or CANCEL).
    pub fn task_ended(&mut self, id: u32, reason: Reason) {
        if self
            .streams
            .get(&id)
            .is_some_and(|s| s.send_open && !s.tunnel_open)
        {
            self.reset(id, reason);
        }
    }
}
