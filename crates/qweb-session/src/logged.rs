//! The logged-request record: the wrapper around a response body that counts the bytes sent,
//! tells the connection's watchdog what the response waits for, and writes the access-log
//! line when the response ends.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};

use crate::RequestGuard;
use qweb_http::body::{Body, BoxError};

/// What the access log says about one request.
pub struct AccessRecord {
    /// When the request head was read.
    pub start: Instant,
    /// The request method.
    pub method: http::Method,
    /// The request target, as the log shows it.
    pub path: String,
    /// The response status.
    pub status: u16,
    /// Whether the access log is on (else only the route's metrics are counted).
    pub log: bool,
    /// The route's request counters and latency histogram.
    pub route: std::rc::Rc<qweb_observe::metrics::RouteMetrics>,
    /// The access-log line format.
    pub format: qweb_config::AccessFormat,
    /// Host, User-Agent, Referer (when the log is on).
    pub fields: Option<qweb_observe::access_log::RequestFields>,
    /// What the proxy cache did (a cached route's requests only).
    pub cache: Option<&'static str>,
}

/// A tunnel's byte counts (an upgrade's, an extended CONNECT's), shared by the tunnel and the
/// response that opened it (as an extension): that response's access-log line waits until
/// both are gone, i.e. the tunnel ended, and then says the bytes both ways and the duration.
#[derive(Clone, Default)]
pub struct TunnelTally(std::sync::Arc<Tally>);

/// An access-log line waiting for a tunnel's byte counts (from the client, to it).
type DeferredLine = Box<dyn FnOnce(u64, u64) + Send>;

#[derive(Default)]
struct Tally {
    /// Bytes from the client through the tunnel, and bytes to it.
    from_client: AtomicU64,
    to_client: AtomicU64,
    /// The access-log line, written when the last holder is gone.
    line: Mutex<Option<DeferredLine>>,
}

impl TunnelTally {
    /// The tunnel moved `from_client` and `to_client` bytes (so far).
    pub fn set(&self, from_client: u64, to_client: u64) {
        self.0.from_client.store(from_client, Ordering::Relaxed);
        self.0.to_client.store(to_client, Ordering::Relaxed);
    }

    fn defer(&self, line: DeferredLine) {
        if let Ok(mut l) = self.0.line.lock() {
            *l = Some(line);
        }
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        let line = self.line.get_mut().ok().and_then(|l| l.take());
        if let Some(line) = line {
            line(
                self.from_client.load(Ordering::Relaxed),
                self.to_client.load(Ordering::Relaxed),
            );
        }
    }
}

/// Counts the body bytes sent and tells the connection's watchdog whether the response waits
/// for the client (a chunk handed over, not yet taken) or for its source; on drop (body
/// finished, the client went away, or the send timeout reset it) writes the access-log line
/// and marks the request as no longer in flight on its connection.
pub struct Logged {
    inner: Body,
    bytes: u64,
    /// The body went out whole (end of stream reached).
    ended: bool,
    record: AccessRecord,
    guard: RequestGuard,
    /// The response opened a tunnel: its line is written when the tunnel ends.
    tunnel: Option<TunnelTally>,
}

impl Logged {
    /// `inner`, logged as `record` when it ends or is dropped; `guard` keeps the request
    /// counted in its connection's phase; `tunnel`: the response opened one.
    #[inline]
    pub fn new(
        inner: Body,
        record: AccessRecord,
        guard: RequestGuard,
        tunnel: Option<TunnelTally>,
    ) -> Self {
        // The head goes out now; the body is polled once the client can take more.
        guard.waiting_for_client();
        Logged {
            inner,
            bytes: 0,
            ended: false,
            record,
            guard,
            tunnel,
        }
    }
}

impl HttpBody for Logged {
    type Data = Bytes;
    type Error = BoxError;

    #[inline]
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

    #[inline]
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        self.record
            .route
            .observe(self.record.status, self.record.start.elapsed());
        if !self.record.log {
            return;
        }
        let r = &mut self.record;
        let conn = self.guard.conn();
        let line = Line {
            format: r.format,
            peer: conn.peer,
            method: r.method.clone(),
            target: std::mem::take(&mut r.path),
            protocol: conn.protocol.get(),
            status: r.status,
            start: r.start,
            tls: conn.tls_version.get(),
            fields: r.fields.take(),
            cache: r.cache,
            client_cert: conn.client_cert.get().cloned(),
        };
        if let Some(tunnel) = self.tunnel.take() {
            tunnel.defer(Box::new(move |from, to| line.write(to, false, Some(from))));
            return;
        }
        // HEAD responses and empty bodies are never polled: they went out whole
        let whole = self.ended || self.inner.is_end_stream() || line.method == http::Method::HEAD;
        line.write(self.bytes, !whole, None);
    }
}

/// An access-log line waiting for its byte counts.
struct Line {
    format: qweb_config::AccessFormat,
    peer: std::net::SocketAddr,
    method: http::Method,
    target: String,
    protocol: &'static str,
    status: u16,
    start: Instant,
    tls: Option<&'static str>,
    fields: Option<qweb_observe::access_log::RequestFields>,
    cache: Option<&'static str>,
    client_cert: Option<std::sync::Arc<qweb_tls::ClientCert>>,
}

impl Line {
    fn write(&self, bytes: u64, aborted: bool, received: Option<u64>) {
        qweb_observe::access_log::write(
            self.format,
            &qweb_observe::access_log::Entry {
                peer: self.peer,
                method: self.method.as_str(),
                target: &self.target,
                protocol: self.protocol,
                status: self.status,
                bytes,
                elapsed: self.start.elapsed(),
                aborted,
                received,
                tls: self.tls,
                fields: self.fields.as_ref(),
                cache: self.cache,
                client_cert: self.client_cert.as_deref(),
            },
        );
    }
}
