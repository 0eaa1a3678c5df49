//! The logged-request record: the wrapper around a response body that counts the bytes sent,
//! tells the connection's watchdog what the response waits for, and writes the access-log
//! line when the response ends.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};

use crate::http::body::{Body, BoxError};
use crate::session::RequestGuard;

/// What the access log says about one request.
pub(crate) struct AccessRecord {
    pub start: Instant,
    pub method: http::Method,
    pub path: String,
    pub status: u16,
    pub log: bool,
    /// The route's request counters and latency histogram.
    pub route: std::rc::Rc<crate::observe::metrics::RouteMetrics>,
    /// The access-log line format.
    pub format: crate::config::AccessFormat,
    /// Host, User-Agent, Referer (when the log is on).
    pub fields: Option<crate::observe::access_log::RequestFields>,
}

/// Counts the body bytes sent and tells the connection's watchdog whether the response waits
/// for the client (a chunk handed over, not yet taken) or for its source; on drop (body
/// finished, the client went away, or the send timeout reset it) writes the access-log line
/// and marks the request as no longer in flight on its connection.
pub(crate) struct Logged {
    inner: Body,
    bytes: u64,
    /// The body went out whole (end of stream reached).
    ended: bool,
    record: AccessRecord,
    guard: RequestGuard,
}

impl Logged {
    pub(crate) fn new(inner: Body, record: AccessRecord, guard: RequestGuard) -> Self {
        // The head goes out now; the body is polled once the client can take more.
        guard.waiting_for_client();
        Logged {
            inner,
            bytes: 0,
            ended: false,
            record,
            guard,
        }
    }
}

impl HttpBody for Logged {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        this.guard.body_polled();
        let r = this.inner.as_mut().poll_frame(cx);
        match &r {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref() {
                    this.bytes += d.len() as u64;
                }
                this.ended = this.inner.is_end_stream();
                this.guard.waiting_for_client();
            }
            Poll::Ready(None) => this.ended = true,
            _ => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        self.record
            .route
            .observe(self.record.status, self.record.start.elapsed());
        if self.record.log {
            let r = &self.record;
            // HEAD responses and empty bodies are never polled: they went out whole
            let whole = self.ended || self.inner.is_end_stream() || r.method == http::Method::HEAD;
            let conn = self.guard.conn();
            crate::observe::access_log::write(
                r.format,
                &crate::observe::access_log::Entry {
                    peer: conn.peer,
                    method: r.method.as_str(),
                    target: &r.path,
                    protocol: conn.protocol.get(),
                    status: r.status,
                    bytes: self.bytes,
                    elapsed: r.start.elapsed(),
                    aborted: !whole,
                    tls: conn.tls_version.get(),
                    fields: r.fields.as_ref(),
                },
            );
        }
    }
}
