//! Reverse proxy to upstream HTTP/1.1 servers: a keep-alive connection pool per worker and
//! upstream, round-robin, streaming bodies both ways, hop-by-hop header removal,
//! X-Forwarded-For/-Proto/-Host. 502 when no upstream can be reached, 504 on timeouts.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use crate::body::{Body, BoxError};
use crate::config::ProxyConfig;
use crate::response;

/// Idle upstream connections older than this are not reused.
const IDLE_MAX: Duration = Duration::from_secs(30);

struct Idle {
    sender: SendRequest<Incoming>,
    since: Instant,
}

/// One proxy route on one worker.
pub(crate) struct Proxy {
    cfg: ProxyConfig,
    next: Cell<usize>,
    idle: Vec<RefCell<VecDeque<Idle>>>,
}

/// Facts about the client request the upstream is told.
pub(crate) struct ClientInfo {
    pub addr: SocketAddr,
    pub tls: bool,
}

enum Failure {
    Unreachable,
    Timeout,
}

impl Failure {
    fn status(&self) -> StatusCode {
        match self {
            Failure::Unreachable => StatusCode::BAD_GATEWAY,
            Failure::Timeout => StatusCode::GATEWAY_TIMEOUT,
        }
    }
}

impl Proxy {
    pub(crate) fn new(cfg: &ProxyConfig) -> Rc<Self> {
        Rc::new(Proxy {
            idle: cfg
                .upstreams
                .iter()
                .map(|_| RefCell::new(VecDeque::new()))
                .collect(),
            cfg: cfg.clone(),
            next: Cell::new(0),
        })
    }

    fn checkout(&self, idx: usize) -> Option<SendRequest<Incoming>> {
        let mut q = self.idle[idx].borrow_mut();
        while let Some(i) = q.pop_back() {
            if !i.sender.is_closed() && i.since.elapsed() < IDLE_MAX {
                return Some(i.sender);
            }
        }
        None
    }

    fn checkin(&self, idx: usize, sender: SendRequest<Incoming>) {
        if sender.is_closed() {
            return;
        }
        let mut q = self.idle[idx].borrow_mut();
        if q.len() < self.cfg.keepalive {
            q.push_back(Idle {
                sender,
                since: Instant::now(),
            });
        }
    }

    async fn connect(&self, idx: usize) -> Result<SendRequest<Incoming>, Failure> {
        let up = &self.cfg.upstreams[idx];
        let tcp = match tokio::time::timeout(self.cfg.connect_timeout, TcpStream::connect(up.addr))
            .await
        {
            Err(_) => {
                tracing::warn!(upstream = %up.name, "upstream connect timed out");
                return Err(Failure::Timeout);
            }
            Ok(Err(e)) => {
                tracing::warn!(upstream = %up.name, "upstream connect failed: {e}");
                return Err(Failure::Unreachable);
            }
            Ok(Ok(t)) => t,
        };
        let _ = tcp.set_nodelay(true);
        let (sender, conn) = hyper::client::conn::http1::Builder::new()
            .handshake::<_, Incoming>(TokioIo::new(tcp))
            .await
            .map_err(|e| {
                tracing::warn!(upstream = %up.name, "upstream handshake failed: {e}");
                Failure::Unreachable
            })?;
        let name = up.name.clone();
        tokio::task::spawn_local(async move {
            if let Err(e) = conn.await {
                tracing::debug!(upstream = %name, "upstream connection ended: {e}");
            }
        });
        Ok(sender)
    }

    /// Forwards `req`, whose path (after any prefix stripping) is `path_and_query`.
    pub(crate) async fn forward(
        self: &Rc<Self>,
        req: Request<Incoming>,
        path_and_query: &str,
        client: &ClientInfo,
    ) -> Response<Body> {
        let mut req = match upstream_request(req, path_and_query, client) {
            Ok(r) => r,
            Err(code) => return response::status(code),
        };
        let n = self.cfg.upstreams.len();
        let mut idx = self.next.get() % n;
        self.next.set((idx + 1) % n);
        let mut tried = 0;
        let mut failure = Failure::Unreachable;
        while tried < n {
            let (mut sender, pooled) = match self.checkout(idx) {
                Some(s) => (s, true),
                None => match self.connect(idx).await {
                    Ok(s) => (s, false),
                    Err(f) => {
                        failure = f;
                        tried += 1;
                        idx = (idx + 1) % n;
                        continue;
                    }
                },
            };
            if pooled && sender.ready().await.is_err() {
                continue; // stale pooled connection: take another or connect
            }
            match tokio::time::timeout(self.cfg.timeout, sender.try_send_request(req)).await {
                Err(_) => {
                    tracing::warn!(upstream = %self.cfg.upstreams[idx].name, "upstream response timed out");
                    return response::status(StatusCode::GATEWAY_TIMEOUT);
                }
                Ok(Ok(resp)) => return self.respond(resp, sender, idx),
                Ok(Err(mut e)) => match e.take_message() {
                    Some(r) => {
                        // not sent: a stale pooled connection, or a fresh one that failed
                        req = r;
                        if !pooled {
                            tracing::warn!(upstream = %self.cfg.upstreams[idx].name, "upstream request failed: {}", e.error());
                            failure = Failure::Unreachable;
                            tried += 1;
                            idx = (idx + 1) % n;
                        }
                    }
                    None => {
                        tracing::warn!(upstream = %self.cfg.upstreams[idx].name, "upstream request failed: {}", e.error());
                        return response::status(StatusCode::BAD_GATEWAY);
                    }
                },
            }
        }
        response::status(failure.status())
    }

    fn respond(
        self: &Rc<Self>,
        resp: Response<Incoming>,
        sender: SendRequest<Incoming>,
        idx: usize,
    ) -> Response<Body> {
        let (mut parts, body) = resp.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        parts.version = Version::HTTP_11;
        let body = UpstreamBody {
            inner: body,
            sender: Some(sender),
            proxy: self.clone(),
            idx,
            timeout: self.cfg.timeout,
            sleep: Box::pin(tokio::time::sleep(self.cfg.timeout)),
            done: false,
        };
        Response::from_parts(parts, crate::body::boxed(body))
    }
}

const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-authorization",
];

/// Removes hop-by-hop headers: the fixed list, and every header named in `Connection`.
pub(crate) fn strip_hop_by_hop(h: &mut HeaderMap) {
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for n in named {
        h.remove(n);
    }
    for n in HOP_BY_HOP {
        h.remove(n);
    }
    h.remove("proxy-authenticate");
}

fn upstream_request(
    req: Request<Incoming>,
    path_and_query: &str,
    client: &ClientInfo,
) -> Result<Request<Incoming>, StatusCode> {
    let (mut parts, body) = req.into_parts();
    let host = parts.headers.get(header::HOST).cloned().or_else(|| {
        parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    });
    strip_hop_by_hop(&mut parts.headers);
    let h = &mut parts.headers;
    if let Some(host) = host {
        h.insert(header::HOST, host.clone());
        if !h.contains_key("x-forwarded-host") {
            h.insert("x-forwarded-host", host);
        }
    }
    let ip = client.addr.ip().to_string();
    let xff = match h.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
        Some(prev) if !prev.trim().is_empty() => format!("{prev}, {ip}"),
        _ => ip,
    };
    h.insert(
        "x-forwarded-for",
        HeaderValue::from_str(&xff).map_err(|_| StatusCode::BAD_REQUEST)?,
    );
    h.insert(
        "x-forwarded-proto",
        HeaderValue::from_static(if client.tls { "https" } else { "http" }),
    );
    parts.uri = Uri::try_from(path_and_query).map_err(|_| StatusCode::BAD_REQUEST)?;
    parts.version = Version::HTTP_11;
    Ok(Request::from_parts(parts, body))
}

/// The upstream's response body: streamed to the client; the upstream connection goes back
/// to the pool once the body has been read to its end. A pause longer than the route's
/// timeout between two reads ends the response with an error.
struct UpstreamBody {
    inner: Incoming,
    sender: Option<SendRequest<Incoming>>,
    proxy: Rc<Proxy>,
    idx: usize,
    timeout: Duration,
    sleep: Pin<Box<Sleep>>,
    done: bool,
}

impl HttpBody for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            return match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(None) => {
                    this.done = true;
                    Poll::Ready(None)
                }
                Poll::Ready(Some(Ok(f))) => {
                    this.sleep.as_mut().reset(Instant::now() + this.timeout);
                    if this.inner.is_end_stream() {
                        this.done = true;
                    }
                    if f.data_ref().is_some_and(|d| d.is_empty()) {
                        continue; // an empty chunk would become an empty DATA frame
                    }
                    Poll::Ready(Some(Ok(f)))
                }
                Poll::Ready(Some(Err(e))) => {
                    this.sender = None;
                    Poll::Ready(Some(Err(e.into())))
                }
                Poll::Pending => {
                    if this.sleep.as_mut().poll(cx).is_ready() {
                        this.sender = None;
                        tracing::warn!(upstream = %this.proxy.cfg.upstreams[this.idx].name, "upstream body read timed out");
                        return Poll::Ready(Some(Err("upstream read timed out".into())));
                    }
                    Poll::Pending
                }
            };
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for UpstreamBody {
    fn drop(&mut self) {
        if let Some(s) = self.sender.take() {
            if self.done || self.inner.is_end_stream() {
                self.proxy.checkin(self.idx, s);
            }
        }
    }
}
