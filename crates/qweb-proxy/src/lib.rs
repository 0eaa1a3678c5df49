//! The reverse proxy: upstream HTTP/1.1 servers (plain or TLS) over a keep-alive pool per
//! worker and upstream, HTTP/2 upstreams (`h2c://`, or `https://` with ALPN h2) over one
//! multiplexed connection each (`h2`), balancing by weight, fewest requests in flight or a
//! consistent hash (`balance`), passive and active health (`health`), forwarded headers
//! (`headers`), request and response bodies streamed both ways (`body`), and upgrades and
//! extended CONNECT tunnels (`upgrade`). Imports `qweb-config`, `qweb-http`, `qweb-observe`
//! and `qweb-session`, nothing of the server above it.
//!
//! One exchange runs in named phases (as Pingora's proxy does):
//!
//! 1. `upstream_request`: the client's request rewritten for the upstream (path, `Host`,
//!    hop-by-hop and forwarding headers, body framing);
//! 2. `Proxy::forward`: pick an upstream (the route's `balance`), `Proxy::connection` (an idle pooled
//!    connection or a new one), `Proxy::exchange` (send, wait for the response head under
//!    the phase timeouts);
//! 3. each failure says whether another try is allowed (`Retry`): a request that was not
//!    sent may go to a fresh connection or the next upstream; one that was sent never goes
//!    twice;
//! 4. `Proxy::respond`: the response head checked and rewritten; its body
//!    (`response_body::UpstreamBody`) returns the connection to the pool when the exchange ended
//!    cleanly.
//!
//! Statuses: 502 when no upstream can be reached or one answers wrongly, 504 on upstream
//! timeouts, 400 for a malformed client body, 408 when the client's body stalls.

mod balance;
mod body;
mod connect;
mod h2;
mod headers;
mod health;
mod pool;
mod proxy_header;
mod response_body;
mod tls;
mod upgrade;

use std::net::SocketAddr;
use std::pin::pin;
use std::rc::Rc;

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use qweb_http::request_body::RequestBody;
use tokio::net::TcpStream;
use tokio::time::Instant;

pub use balance::cookie;
use balance::{Balancer, Load};
use body::{ClientBody, ClientBodyError, Progress};
use headers::Forwarding;
pub use health::upstream_gauges;
use pool::{Pool, SharedSocket, UpstreamConn};
use qweb_config::ProxyConfig;
use qweb_http::body::Body;
use qweb_http::fields::strip_hop_by_hop;
use qweb_http::response;
use response_body::UpstreamBody;

/// One proxy route on one worker.
pub struct Proxy {
    cfg: ProxyConfig,
    balancer: Balancer,
    pool: Pool,
    /// HTTP/2 upstreams' connections.
    h2: h2::H2Conns,
    /// "all upstreams of the route are down": once a second at most, not once a request.
    down_log: qweb_observe::log_limit::Every,
}

/// Facts about the client connection the upstream is told.
pub struct ClientInfo {
    /// The client's address (`X-Forwarded-For`, `Forwarded: for=`).
    pub addr: SocketAddr,
    /// The client came over TLS (`X-Forwarded-Proto`).
    pub tls: bool,
    /// The client connection (an accepted upgrade leaves its tunnel there).
    pub conn: Rc<qweb_session::ConnState>,
    /// The generation's tunnels and the shutdown signal: an HTTP/2 WebSocket registers there
    /// (kept past a reload's `shutdown_timeout`, told when to go away).
    pub tunnels: Rc<qweb_session::tunnel::Tunnels>,
    /// Becomes `true` when the server shuts down.
    pub shutdown: tokio::sync::watch::Receiver<bool>,
}

/// What the client asked for, after the request rules and path normalisation.
pub struct Target<'a> {
    /// Path and query to send upstream (normalised, or as sent with `pass_raw_path`).
    pub path_and_query: &'a str,
    /// The authority the client named (`Host`, `:authority`, or an absolute-form target's).
    pub authority: Option<&'a HeaderValue>,
}

/// Whether a failed attempt may be tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// Not sent, on a reused connection that turned out stale: another connection to the same
    /// upstream (does not count as a try).
    SameUpstream,
    /// Not sent (connect failed, or a fresh connection failed before the request went out):
    /// the next upstream.
    NextUpstream,
    /// Sent on a reused connection that the upstream closed (or reset) before any answer: the
    /// close crossed the request (an upstream's keep-alive ended just as qweb reused it). An
    /// idempotent request whose body qweb still has ([`Replay`]) goes again, once, on a new
    /// connection to the same upstream (as nginx retries a request that failed on a cached
    /// keep-alive connection, unless it is POST, LOCK or PATCH); any other request: 502.
    Replay,
    /// The request (or part of its body) went out: never sent twice.
    No,
}

/// The largest request body of an idempotent method that is read whole before it goes upstream,
/// so that it can be sent again ([`Retry::Replay`]) when a reused connection turns out closed.
const REPLAY_BODY_MAX: u64 = 64 * 1024;

/// A copy of an upstream request that can be sent again: an idempotent method (RFC 9110
/// section 9.2.2) and a body qweb holds whole (none, `buffer_request_body`, or one of at most
/// [`REPLAY_BODY_MAX`]).
struct Replay {
    method: Method,
    uri: Uri,
    headers: http::HeaderMap,
    body: bytes::Bytes,
}

impl Replay {
    fn of(req: &Request<SendBody>) -> Option<Self> {
        if !req.method().is_idempotent() {
            return None;
        }
        let body = match req.body() {
            SendBody::Whole(b) => b.clone(),
            SendBody::Stream(b) if http_body::Body::is_end_stream(b) => bytes::Bytes::new(),
            SendBody::Stream(_) => return None,
        };
        Some(Replay {
            method: req.method().clone(),
            uri: req.uri().clone(),
            headers: req.headers().clone(),
            body,
        })
    }

    /// The request again, as [`upstream_request`] first made it.
    fn request(
        &self,
        target: &Target<'_>,
        client: &ClientInfo,
        cfg: &ProxyConfig,
    ) -> Result<(Request<ClientBody>, Rc<Progress>), StatusCode> {
        let mut req = Request::new(SendBody::Whole(self.body.clone()));
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = self.uri.clone();
        *req.headers_mut() = self.headers.clone();
        upstream_request(req, target, client, cfg)
    }
}

/// Why an attempt failed.
#[derive(Debug)]
struct Failure {
    status: StatusCode,
    retry: Retry,
}

impl Failure {
    fn new(status: StatusCode, retry: Retry) -> Self {
        Failure { status, retry }
    }
}

/// A successful exchange's response head, with what its body needs.
struct Answer {
    resp: Response<Incoming>,
    /// The pooled HTTP/1.1 connection (`None` for HTTP/2, whose connection is shared).
    conn: Option<UpstreamConn>,
}

impl Proxy {
    /// The proxy of one route: its upstreams, balancer, pools and health state.
    pub fn new(cfg: &ProxyConfig) -> Rc<Self> {
        Rc::new(Proxy {
            // a connection that began with a client's PROXY header is that client's: not
            // pooled for the next one
            pool: Pool::new(
                cfg.upstreams.len(),
                if cfg.upstream_proxy_protocol.is_some() {
                    0
                } else {
                    cfg.keepalive
                },
            ),
            cfg: cfg.clone(),
            balancer: Balancer::new(cfg),
            h2: h2::H2Conns::new(cfg.upstreams.len()),
            down_log: qweb_observe::log_limit::Every::new(std::time::Duration::from_secs(1)),
        })
    }

    /// Forwards `req` to an upstream and returns the response to send to the client.
    pub async fn forward(
        self: &Rc<Self>,
        req: Request<RequestBody>,
        target: &Target<'_>,
        client: &ClientInfo,
    ) -> Response<Body> {
        let head = req.method() == Method::HEAD;
        let order = self
            .balancer
            .order(self.balancer.key(req.headers(), client.addr.ip()));
        if let Some(r) = self.body_too_large(&req) {
            return r;
        }
        // an upgrade needs an HTTP/1.1 upstream
        let h1_first = order.first().is_some_and(|&i| !self.cfg.upstreams[i].h2);
        let upgrade = if req.version() == Version::HTTP_11 && h1_first {
            upgrade::requested(req.headers()).filter(|t| upgrade::allowed(t, &self.cfg.upgrade))
        } else {
            None
        };
        let trailers = h2::wants_trailers(req.headers());
        if let Some(token) = upgrade {
            let req = req.map(SendBody::Stream);
            return self.upgrade(req, token, target, client, &order, None).await;
        }
        if req.method() == Method::CONNECT {
            return self.extended_connect(req, target, client, &order).await;
        }
        let req = match self.buffer_body(req).await {
            Ok(r) => r,
            Err(r) => return r,
        };
        let mut replay = Replay::of(&req);
        let te = |req: &mut Request<ClientBody>| {
            if trailers {
                // the client takes trailers, and so does qweb: the upstream may send them
                req.headers_mut()
                    .insert(header::TE, HeaderValue::from_static("trailers"));
            }
        };
        let (mut req, mut progress) = match upstream_request(req, target, client, &self.cfg) {
            Ok(r) => r,
            Err(code) => return response::status(code),
        };
        te(&mut req);
        let Some((&first, _)) = order.split_first() else {
            return self.all_down();
        };
        let mut idx = first;
        let mut tries = 0;
        let mut fresh = false;
        let mut last = Failure::new(StatusCode::BAD_GATEWAY, Retry::No);
        while tries < order.len() {
            let load = Load::new(self, idx);
            let attempt = if self.cfg.upstreams[idx].h2 {
                self.h2_exchange(idx, req, &progress, trailers)
                    .await
                    .map(|resp| Answer { resp, conn: None })
            } else {
                match self.connection(idx, client.addr, fresh).await {
                    Ok((conn, reused)) => self.exchange(conn, reused, req, idx, &progress).await,
                    Err(f) => Err((f, Some(req))),
                }
            };
            match attempt {
                Ok(answer) => {
                    self.balancer.succeeded(idx);
                    let conn = answer.conn;
                    let asked = Asked { head, trailers };
                    return self.respond(answer.resp, conn, Some(load), idx, asked, progress);
                }
                Err((failure, unsent)) => {
                    let retry = failure.retry;
                    last = failure;
                    if retry == Retry::NextUpstream {
                        self.balancer.failed(idx);
                    }
                    req = match (retry, unsent) {
                        (Retry::Replay, _) => {
                            // once, and on a new connection: another pooled one may be as old
                            let Some(again) = replay.take() else { break };
                            let Ok((mut r, p)) = again.request(target, client, &self.cfg) else {
                                break;
                            };
                            tracing::debug!(upstream = %self.cfg.upstreams[idx].name, "request sent again: the reused connection was closed before an answer");
                            te(&mut r);
                            progress = p;
                            fresh = true;
                            r
                        }
                        (Retry::No, _) | (_, None) => break,
                        (Retry::SameUpstream, Some(r)) => r,
                        (Retry::NextUpstream, Some(r)) => {
                            tries += 1;
                            match order.get(tries) {
                                Some(&i) => idx = i,
                                None => break,
                            }
                            r
                        }
                    };
                }
            }
        }
        let mut r = response::status(last.status);
        if matches!(
            last.status,
            StatusCode::BAD_REQUEST | StatusCode::REQUEST_TIMEOUT | StatusCode::PAYLOAD_TOO_LARGE
        ) {
            // the client's body framing is broken or abandoned: do not read on
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        r
    }

    /// Every upstream is down (health checks, or passive time-outs): 502 at once.
    fn all_down(&self) -> Response<Body> {
        if let Some(suppressed) = self.down_log.hit() {
            tracing::warn!(
                upstreams = self.cfg.upstreams.len(),
                suppressed,
                "all upstreams of the route are down"
            );
        }
        response::status(StatusCode::BAD_GATEWAY)
    }

    /// An idle pooled connection to upstream `idx` (`true`: reused), or a new one for
    /// `client` (always a new one when `fresh`).
    async fn connection(
        &self,
        idx: usize,
        client: SocketAddr,
        fresh: bool,
    ) -> Result<(UpstreamConn, bool), Failure> {
        if let Some(c) = self.pool.checkout(idx).filter(|_| !fresh) {
            return Ok((c, true));
        }
        self.connect(idx, Some(client)).await.map(|c| (c, false))
    }

    /// A TCP connection to upstream `idx` (`TCP_NODELAY` set: requests and small writes of a
    /// streamed body go out at once, whatever the upstream's own Nagle does), its PROXY
    /// header for `client` written first under `upstream_proxy_protocol`.
    async fn dial(&self, idx: usize, client: Option<SocketAddr>) -> Result<TcpStream, Failure> {
        let up = &self.cfg.upstreams[idx];
        let tcp = match tokio::time::timeout(self.cfg.connect_timeout, TcpStream::connect(up.addr))
            .await
        {
            Err(_) => {
                tracing::warn!(upstream = %up.name, "upstream connect timed out");
                return Err(Failure::new(
                    StatusCode::GATEWAY_TIMEOUT,
                    Retry::NextUpstream,
                ));
            }
            Ok(Err(e)) => {
                tracing::warn!(upstream = %up.name, "upstream connect failed: {e}");
                return Err(Failure::new(StatusCode::BAD_GATEWAY, Retry::NextUpstream));
            }
            Ok(Ok(t)) => t,
        };
        let _ = tcp.set_nodelay(true);
        if let Some(v) = self.cfg.upstream_proxy_protocol {
            let mut tcp = tcp;
            let h = proxy_header::header(v, client, up.addr);
            let write = tokio::io::AsyncWriteExt::write_all(&mut tcp, &h);
            if !matches!(
                tokio::time::timeout(self.cfg.connect_timeout, write).await,
                Ok(Ok(()))
            ) {
                tracing::warn!(upstream = %up.name, "upstream PROXY header not written");
                return Err(Failure::new(StatusCode::BAD_GATEWAY, Retry::NextUpstream));
            }
            return Ok(tcp);
        }
        Ok(tcp)
    }

    /// A new pooled connection to upstream `idx` for `client` (`None`: a health check), TLS
    /// first for an `https://` upstream.
    async fn connect(
        &self,
        idx: usize,
        client: Option<SocketAddr>,
    ) -> Result<UpstreamConn, Failure> {
        let socket = Rc::new(self.dial(idx, client).await?);
        let io = SharedSocket(socket.clone());
        let sender = if self.cfg.upstreams[idx].tls {
            let tls = self.tls_handshake(idx, io).await?;
            self.http1(idx, TokioIo::new(tls)).await?
        } else {
            self.http1(idx, TokioIo::new(io)).await?
        };
        Ok(UpstreamConn {
            sender,
            socket,
            idle_max: pool::IDLE_MAX,
        })
    }

    /// An HTTP/1.1 client connection on `io`, its task spawned on the worker.
    async fn http1<IO>(&self, idx: usize, io: IO) -> Result<SendRequest<ClientBody>, Failure>
    where
        IO: hyper::rt::Read + hyper::rt::Write + Unpin + 'static,
    {
        let up = &self.cfg.upstreams[idx];
        let (sender, conn) = hyper::client::conn::http1::Builder::new()
            .max_buf_size(self.cfg.max_response_header_size)
            .handshake::<_, ClientBody>(io)
            .await
            .map_err(|e| {
                tracing::warn!(upstream = %up.name, "upstream handshake failed: {e}");
                Failure::new(StatusCode::BAD_GATEWAY, Retry::NextUpstream)
            })?;
        let name = up.name.clone();
        let late = self.pool.late(idx);
        tokio::task::spawn_local(async move {
            if let Err(e) = conn.await {
                late.ended(&e, &name);
                tracing::debug!(upstream = %name, "upstream connection ended: {e}");
            }
        });
        Ok(sender)
    }

    /// Sends `req` on `conn` and waits for the response head ([`Proxy::await_head`]).
    async fn exchange(
        &self,
        mut conn: UpstreamConn,
        reused: bool,
        req: Request<ClientBody>,
        idx: usize,
        progress: &Rc<Progress>,
    ) -> Result<Answer, (Failure, Option<Request<ClientBody>>)> {
        let name = &self.cfg.upstreams[idx].name;
        let ready = tokio::time::timeout(self.cfg.connect_timeout, conn.sender.ready()).await;
        if !matches!(ready, Ok(Ok(()))) {
            let retry = if reused {
                Retry::SameUpstream
            } else {
                Retry::NextUpstream
            };
            return Err((Failure::new(StatusCode::BAD_GATEWAY, retry), Some(req)));
        }
        let send = conn.sender.try_send_request(req);
        let result = match self.await_head(idx, send, progress).await {
            Ok(r) => r,
            Err(timeout) => return Err((timeout, None)),
        };
        match result {
            Ok(resp) => Ok(Answer {
                resp,
                conn: Some(conn),
            }),
            Err(mut e) => {
                let unsent = e.take_message();
                if let Some(client) = progress.client_error.get() {
                    let status = client_status(client);
                    tracing::debug!(upstream = %name, "client request body failed: {}", e.error());
                    return Err((Failure::new(status, Retry::No), None));
                }
                let retry = match (&unsent, reused) {
                    (None, true) if closed_before_answer(e.error()) => Retry::Replay,
                    (None, _) => Retry::No,
                    (Some(_), true) => Retry::SameUpstream,
                    (Some(_), false) => Retry::NextUpstream,
                };
                if !matches!(retry, Retry::SameUpstream | Retry::Replay) {
                    tracing::warn!(upstream = %name, "upstream request failed: {}", e.error());
                }
                Err((Failure::new(StatusCode::BAD_GATEWAY, retry), unsent))
            }
        }
    }

    /// Waits for `send` (a request on its way to upstream `idx`, HTTP/1.1 or HTTP/2) to give
    /// the response head. Timing: while the request body flows, the clock restarts with every
    /// piece the upstream takes; once it was all sent, the upstream has the route's `timeout`
    /// to answer. Pauses of the client are the client's (`client_body_timeout`, in
    /// [`ClientBody`]). `Err`: the upstream timed out (504, never retried).
    async fn await_head<T>(
        &self,
        idx: usize,
        send: impl std::future::Future<Output = T>,
        progress: &Progress,
    ) -> Result<T, Failure> {
        progress.last.set(Instant::now());
        let mut send = pin!(send);
        loop {
            let deadline = progress.last.get() + self.cfg.timeout;
            tokio::select! {
                r = send.as_mut() => return Ok(r),
                _ = tokio::time::sleep_until(deadline) => {
                    if progress.waiting_on_client.get() && !progress.finished.get() {
                        // the client is slow, not the upstream: ClientBody times the client
                        progress.last.set(Instant::now());
                        continue;
                    }
                    if progress.last.get() + self.cfg.timeout <= Instant::now() {
                        tracing::warn!(upstream = %self.cfg.upstreams[idx].name, "upstream response timed out");
                        return Err(Failure::new(StatusCode::GATEWAY_TIMEOUT, Retry::No));
                    }
                }
            }
        }
    }

    /// Checks and rewrites the response head; wraps the body.
    fn respond(
        self: &Rc<Self>,
        resp: Response<Incoming>,
        mut conn: Option<UpstreamConn>,
        load: Option<Load>,
        idx: usize,
        asked: Asked,
        request: Rc<Progress>,
    ) -> Response<Body> {
        let (mut parts, body) = resp.into_parts();
        if parts.status == StatusCode::SWITCHING_PROTOCOLS {
            // qweb never asks for an upgrade (it strips Upgrade): a 101 is a broken upstream
            tracing::warn!(upstream = %self.cfg.upstreams[idx].name, "upstream switched protocols unasked");
            return response::status(StatusCode::BAD_GATEWAY);
        }
        // the trailer fields the upstream announced: passed on to a client that takes
        // trailers (an HTTP/1.1 connection sends only the fields announced, and only
        // to a client that sent `TE: trailers`)
        let announced: Vec<HeaderValue> = match asked.trailers {
            true => parts
                .headers
                .get_all(header::TRAILER)
                .iter()
                .cloned()
                .collect(),
            false => Vec::new(),
        };
        if let Some(c) = conn.as_mut() {
            c.idle_max = pool::announced_idle(&parts.headers);
        }
        strip_hop_by_hop(&mut parts.headers);
        for v in announced {
            parts.headers.append(header::TRAILER, v);
        }
        if unbuffered(&mut parts.headers) {
            parts.extensions.insert(Unbuffered);
        }
        parts.version = Version::HTTP_11;
        let body = UpstreamBody {
            inner: body,
            conn,
            _load: load,
            proxy: self.clone(),
            idx,
            request,
            reusable: !asked.head,
            timeout: self.cfg.timeout,
            sleep: Box::pin(tokio::time::sleep(self.cfg.timeout)),
            done: false,
        };
        Response::from_parts(parts, qweb_http::body::boxed(body))
    }
}

/// What the client's request asked of the response.
#[derive(Debug, Clone, Copy)]
struct Asked {
    /// A HEAD request (no body comes).
    head: bool,
    /// `TE: trailers`: the client takes trailer fields.
    trailers: bool,
}

/// Phase 1: the upstream's request. The body is wrapped to time the client and report
/// progress; a body of unknown length is sent chunked whatever the method (hyper would
/// otherwise send a GET's body as empty).
fn upstream_request(
    req: Request<SendBody>,
    target: &Target<'_>,
    client: &ClientInfo,
    cfg: &ProxyConfig,
) -> Result<(Request<ClientBody>, Rc<Progress>), StatusCode> {
    let (mut parts, body) = req.into_parts();
    let from = Forwarding {
        peer: client.addr.ip(),
        tls: client.tls,
        authority: target.authority,
    };
    // hyper names the upstream by address when the config gave no name
    let name = cfg.upstreams.first().map(|u| u.name.as_str()).unwrap_or("");
    headers::rewrite_request(&mut parts.headers, cfg, &from, name);
    let unknown_length = match &body {
        SendBody::Stream(b) => {
            !http_body::Body::is_end_stream(b) && http_body::Body::size_hint(b).exact().is_none()
        }
        SendBody::Whole(_) => false,
    };
    if unknown_length {
        parts.headers.remove(header::CONTENT_LENGTH);
        parts.headers.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
    }
    parts.uri = Uri::try_from(target.path_and_query).map_err(|_| StatusCode::BAD_REQUEST)?;
    parts.version = Version::HTTP_11;
    let (body, progress) = match body {
        SendBody::Stream(b) => ClientBody::new(b, cfg.client_body_timeout, cfg.max_body_size),
        SendBody::Whole(b) => {
            parts.headers.remove(header::TRANSFER_ENCODING);
            parts
                .headers
                .insert(header::CONTENT_LENGTH, HeaderValue::from(b.len()));
            ClientBody::buffered(b)
        }
    };
    Ok((Request::from_parts(parts, body), progress))
}

/// Marks a proxied response that must reach the client as the upstream writes it (an event
/// stream, or `X-Accel-Buffering: no`): compression, when it applies, flushes at every pause
/// of the upstream instead of waiting for `flush_interval`.
#[derive(Debug, Clone, Copy)]
pub struct Unbuffered;

/// A response of type `text/event-stream` or with `X-Accel-Buffering: no` (the header is
/// for qweb, as for nginx: removed).
fn unbuffered(h: &mut http::HeaderMap) -> bool {
    let accel = h
        .remove("x-accel-buffering")
        .is_some_and(|v| v.as_bytes().trim_ascii().eq_ignore_ascii_case(b"no"));
    let events = h
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("text/event-stream"));
    accel || events
}

/// hyper's error for a request that went out on a connection the upstream then closed or reset
/// before any answer came.
fn closed_before_answer(e: &hyper::Error) -> bool {
    use std::error::Error as _;
    let io = e
        .source()
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .map(std::io::Error::kind);
    e.is_incomplete_message()
        || matches!(
            io,
            Some(
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::ConnectionAborted
            )
        )
}

/// The client's request body, streamed or read whole beforehand.
enum SendBody {
    Stream(RequestBody),
    Whole(bytes::Bytes),
}

/// The status for a client body that failed.
fn client_status(e: ClientBodyError) -> StatusCode {
    match e {
        ClientBodyError::Malformed => StatusCode::BAD_REQUEST,
        ClientBodyError::Timeout => StatusCode::REQUEST_TIMEOUT,
        ClientBodyError::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
    }
}

/// A refusal of the client's request that also ends its HTTP/1 connection (the rest of the
/// request body is not read).
fn refuse_closing(status: StatusCode, version: Version) -> Response<Body> {
    let mut r = response::status(status);
    if version <= Version::HTTP_11 {
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    r
}

impl Proxy {
    /// 413 when the request's `Content-Length` is over `max_body_size`, before anything is
    /// read or sent upstream.
    fn body_too_large(&self, req: &Request<RequestBody>) -> Option<Response<Body>> {
        let limit = self.cfg.max_body_size?;
        let declared = http_body::Body::size_hint(req.body()).exact().or_else(|| {
            req.headers()
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
        });
        if declared.is_some_and(|n| n > limit) {
            tracing::debug!("request body over max_body_size: {declared:?} > {limit}");
            return Some(refuse_closing(StatusCode::PAYLOAD_TOO_LARGE, req.version()));
        }
        None
    }

    /// With `buffer_request_body`, the whole body read before an upstream is chosen.
    async fn buffer_body(
        &self,
        req: Request<RequestBody>,
    ) -> Result<Request<SendBody>, Response<Body>> {
        let (parts, body) = req.into_parts();
        let small = http_body::Body::size_hint(&body)
            .exact()
            .is_some_and(|n| n <= REPLAY_BODY_MAX);
        let limit = match self.cfg.max_body_size {
            _ if http_body::Body::is_end_stream(&body) => None,
            Some(limit) if self.cfg.buffer_request_body => Some(limit),
            // small enough to keep for a replay ([`Retry::Replay`])
            limit if small && parts.method.is_idempotent() => {
                Some(limit.unwrap_or(REPLAY_BODY_MAX).min(REPLAY_BODY_MAX))
            }
            _ => None,
        };
        let Some(limit) = limit else {
            return Ok(Request::from_parts(parts, SendBody::Stream(body)));
        };
        match body::read_whole(body, limit, self.cfg.client_body_timeout).await {
            Ok(b) => Ok(Request::from_parts(parts, SendBody::Whole(b))),
            Err(e) => Err(refuse_closing(client_status(e), parts.version)),
        }
    }

    /// The route forwards the client's path as sent (`pass_raw_path`).
    pub fn pass_raw_path(&self) -> bool {
        self.cfg.pass_raw_path
    }
}
