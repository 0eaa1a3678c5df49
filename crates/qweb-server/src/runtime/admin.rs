//! The admin listener: `GET /metrics` in the OpenMetrics text format, `/status.json` (the same
//! counters summed for people, `qweb_observe::status`) and `/status` (an HTML page that
//! shows them live, `crate::runtime::status_page`). Plain HTTP/1.1, on its own thread; off
//! unless `[admin]` is configured. Only GET and HEAD (405 otherwise), but for `POST
//! /cache/purge` (the proxy cache); every answer says `Cache-Control: no-store`.
//!
//! Clients holding connections cannot blind monitoring (issue 41): the connections are
//! bounded by `[admin]`'s [`AdminLimits`] (at most `max_connections` at once, at most
//! `connections_per_client` from one address: more are closed at once), a request head must
//! come within `header_timeout`, a kept-alive connection waits at most `idle_timeout` for its
//! next request, and each lives at most [`CONNECTION_LIFETIME`]. When every slot is taken a
//! new connection evicts the one that has waited longest for a head (idle, or sending its head
//! slowly) rather than being refused, so a scrape gets through while slow clients hold them all.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::convert::Infallible;
use std::net::IpAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::runtime::status_page::PAGE;
use qweb_config::AdminLimits;
use qweb_http::body::{full, Body, BoxError};
use qweb_http::response;
use qweb_observe::metrics::Metrics;

/// Longest life of one admin connection (a scrape takes milliseconds): an idle or slow client
/// cannot hold the connection's fd.
pub(crate) const CONNECTION_LIFETIME: Duration = Duration::from_secs(10);
/// How long an answer in progress at [`CONNECTION_LIFETIME`] may go on before its connection
/// is closed.
pub(crate) const LIFETIME_GRACE: Duration = Duration::from_secs(1);

/// What the admin listener answers from: the metrics, and the proxy cache for purges.
pub(crate) struct AdminState {
    /// Every counter (`/metrics`, `/status.json`).
    pub registry: Arc<Metrics>,
    /// The proxy cache's store (`POST /cache/purge`).
    pub cache: Option<Arc<qweb_cache::Store>>,
    /// The fleet client (`[fleet]`): purges are published to the other nodes, and
    /// `/status.json` lists the nodes.
    pub fleet: Option<Arc<crate::runtime::fleet::Fleet>>,
}

async fn handle(req: &Request<Incoming>, state: &AdminState) -> Response<Body> {
    let registry = &*state.registry;
    // the path alone: a query string changes nothing (but for a purge)
    let path = req.uri().path();
    if path == "/cache/purge" {
        let (r, published) = match purge(req, state.cache.as_deref()) {
            Ok((n, prefix, key)) => {
                // to the other nodes: a wait bounded by `fleet.timeout`
                let fleet = match &state.fleet {
                    Some(f) => Some(f.publish_purge(prefix, &key).await),
                    None => None,
                };
                (purged(n, fleet), fleet)
            }
            Err(r) => (*r, None),
        };
        if let Some(false) = published {
            tracing::warn!("cache purge done on this node only: the fleet's store is away");
        }
        return no_store(r);
    }
    if !matches!(path, "/metrics" | "/status.json" | "/status") {
        return no_store(response::status(StatusCode::NOT_FOUND));
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return no_store(response::method_not_allowed("GET, HEAD"));
    }
    let (body, content_type) = match path {
        "/status.json" => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            let mut doc = qweb_observe::status::document(&registry.render(), now);
            if let (Some(f), Some(o)) = (&state.fleet, doc.as_object_mut()) {
                // the nodes as the fleet thread last listed them: nothing waits on the store
                o.insert("fleet".into(), f.status());
            }
            (doc.to_string(), "application/json")
        }
        "/status" => (PAGE.html.clone(), "text/html; charset=utf-8"),
        _ => (registry.render(), qweb_observe::metrics::CONTENT_TYPE),
    };
    let mut r = no_store(Response::new(full(body)));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if path == "/status" {
        if let Ok(csp) = HeaderValue::from_str(&PAGE.csp) {
            h.insert(header::CONTENT_SECURITY_POLICY, csp);
        }
        h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
        h.insert(
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        );
    }
    r
}

/// `POST /cache/purge?url=ABSOLUTE_URL` (the stored responses of that URL, every variant) or
/// `?prefix=ABSOLUTE_URL_PREFIX` (of every URL starting with it): `{"purged": N}`. The URL is
/// read as the cache keys it: scheme and authority lowercased, the path normalised (for
/// `url`) as routing normalises it. With `[fleet]` the purge is also published to the other
/// nodes and the answer says whether it was: `{"purged": N, "fleet": true|false}`.
///
/// Done here: the count purged, whether by prefix, and the key (published by the caller);
/// else the answer.
fn purge(
    req: &Request<Incoming>,
    cache: Option<&qweb_cache::Store>,
) -> Result<(usize, bool, String), Box<Response<Body>>> {
    if req.method() != Method::POST {
        return Err(Box::new(response::method_not_allowed("POST")));
    }
    let Some(store) = cache else {
        return Err(Box::new(response::status(StatusCode::NOT_FOUND)));
    };
    let query = req.uri().query().unwrap_or("");
    let mut target = None;
    for pair in query.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_encoding::percent_decode_str(&v.replace('+', " "))
            .decode_utf8_lossy()
            .into_owned();
        match k {
            "url" if target.is_none() => target = Some((false, v)),
            "prefix" if target.is_none() => target = Some((true, v)),
            _ => {}
        }
    }
    let Some((prefix, url)) = target else {
        return Err(Box::new(bad_purge(
            "name the URL: ?url=ABSOLUTE_URL or ?prefix=ABSOLUTE_URL_PREFIX",
        )));
    };
    let Some(key) = purge_key(&url, prefix) else {
        return Err(Box::new(bad_purge(
            "the URL is absolute: http(s)://authority/path",
        )));
    };
    let n = if prefix {
        store.purge_prefix(&key)
    } else {
        store.invalidate(&key)
    };
    tracing::info!(%key, prefix, purged = n, "cache purge");
    Ok((n, prefix, key))
}

/// The purge's answer: the count purged here, and (with `[fleet]`) whether it was published.
fn purged(n: usize, fleet: Option<bool>) -> Response<Body> {
    let doc = match fleet {
        Some(f) => serde_json::json!({ "purged": n, "fleet": f }),
        None => serde_json::json!({ "purged": n }),
    };
    let mut r = Response::new(full(doc.to_string()));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn bad_purge(why: &'static str) -> Response<Body> {
    let mut r = Response::new(full(format!("{why}\n")));
    *r.status_mut() = StatusCode::BAD_REQUEST;
    r
}

/// The cache key of an absolute URL (a prefix: its path as written).
fn purge_key(url: &str, prefix: bool) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    if scheme != "http" && scheme != "https" {
        return None;
    }
    let (authority, pq) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, if prefix { "" } else { "/" }),
    };
    if authority.is_empty() {
        return None;
    }
    let authority = authority.to_ascii_lowercase();
    if prefix {
        return Some(format!("{scheme}://{authority}{pq}"));
    }
    let (path, query) = match pq.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (pq, None),
    };
    let path = qweb_http::path::normalize(path).ok()?;
    Some(match query {
        Some(q) => format!("{scheme}://{authority}{path}?{q}"),
        None => format!("{scheme}://{authority}{path}"),
    })
}

/// Every admin answer is live: no cache keeps it, no browser sniffs another type into it.
fn no_store(mut r: Response<Body>) -> Response<Body> {
    let h = r.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}

/// Runs the admin listener on the calling thread until shutdown, within `limits`.
pub(crate) fn run_with(
    socket: std::net::TcpListener,
    state: AdminState,
    shutdown: watch::Receiver<bool>,
    limits: AdminLimits,
) {
    let registry = Arc::new(state);
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("admin listener: cannot start its runtime: {e}");
            return;
        }
    };
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        match TcpListener::from_std(socket) {
            Ok(socket) => serve(socket, registry, shutdown, limits).await,
            Err(e) => tracing::error!("admin listener: {e}"),
        }
    });
}

/// Where an admin connection is.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Waiting for a request head since `since` (its accept, or the end of its last answer);
    /// `head`: since when the head is on its way (the accept for a first request, else the
    /// head's first byte).
    Waiting {
        since: Instant,
        head: Option<Instant>,
    },
    /// A request is being answered.
    Answering,
}

/// One admin connection's slot.
struct Slot {
    id: u64,
    client: IpAddr,
    phase: Cell<Phase>,
    /// Evicted in favour of a newer connection: the connection closes.
    evicted: Cell<bool>,
    /// Its phase changed or it was evicted: its deadline is looked at again.
    wake: Notify,
}

impl Slot {
    /// When the connection is cut unless something happens first; `None` while it answers.
    fn deadline(&self, limits: &AdminLimits) -> Option<Instant> {
        match self.phase.get() {
            Phase::Answering => None,
            Phase::Waiting { head: Some(h), .. } => Some(h + limits.header_timeout),
            Phase::Waiting { since, head: None } => Some(since + limits.idle_timeout),
        }
    }

    /// Since when it waits for a head (older goes first when a slot is needed); `None` while
    /// it answers (never evicted).
    fn waiting_since(&self) -> Option<Instant> {
        match self.phase.get() {
            Phase::Answering => None,
            Phase::Waiting { since, head } => Some(head.unwrap_or(since)),
        }
    }

    fn set(&self, phase: Phase) {
        self.phase.set(phase);
        self.wake.notify_one();
    }
}

/// The admin connections open, by id, and how many each client address holds.
#[derive(Default)]
struct Slots {
    open: HashMap<u64, Rc<Slot>>,
    per_client: HashMap<IpAddr, usize>,
    next_id: u64,
}

/// What [`Slots::admit`] made of a new connection.
enum Admit {
    Yes(Rc<Slot>),
    /// Its address holds `connections_per_client` already.
    ClientFull,
    /// Every slot is answering a request.
    Full,
}

impl Slots {
    /// A slot for a connection from `client`, evicting the connection that has waited
    /// longest for a head when all are taken.
    fn admit(&mut self, client: IpAddr, limits: &AdminLimits) -> (Admit, bool) {
        if self.per_client.get(&client).copied().unwrap_or(0) >= limits.connections_per_client {
            return (Admit::ClientFull, false);
        }
        let mut evicted = false;
        if self.open.len() >= limits.max_connections {
            let oldest = self
                .open
                .values()
                .filter_map(|s| s.waiting_since().map(|t| (t, s.id)))
                .min();
            let Some((_, id)) = oldest else {
                return (Admit::Full, false);
            };
            if let Some(s) = self.remove(id) {
                s.evicted.set(true);
                s.wake.notify_one();
                evicted = true;
            }
        }
        self.next_id += 1;
        let now = Instant::now();
        let slot = Rc::new(Slot {
            id: self.next_id,
            client,
            phase: Cell::new(Phase::Waiting {
                since: now,
                head: Some(now),
            }),
            evicted: Cell::new(false),
            wake: Notify::new(),
        });
        self.open.insert(slot.id, slot.clone());
        *self.per_client.entry(client).or_default() += 1;
        (Admit::Yes(slot), evicted)
    }

    /// Frees slot `id` (nothing when it was evicted already).
    fn remove(&mut self, id: u64) -> Option<Rc<Slot>> {
        let s = self.open.remove(&id)?;
        if let Some(n) = self.per_client.get_mut(&s.client) {
            *n -= 1;
            if *n == 0 {
                self.per_client.remove(&s.client);
            }
        }
        Some(s)
    }
}

/// The connection's socket: the first byte of a head after an idle wait starts the head's
/// clock.
struct Watched {
    io: TcpStream,
    slot: Rc<Slot>,
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            if let Phase::Waiting { since, head: None } = this.slot.phase.get() {
                this.slot.set(Phase::Waiting {
                    since,
                    head: Some(Instant::now()),
                });
            }
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// An answer's body: when hyper is done with it (all of it taken, or dropped unsent), the
/// connection waits for its next request.
struct Answered {
    body: Body,
    slot: Rc<Slot>,
}

impl hyper::body::Body for Answered {
    type Data = Bytes;
    type Error = BoxError;
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.get_mut().body.as_mut().poll_frame(cx)
    }
    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }
    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Answered {
    fn drop(&mut self) {
        self.slot.set(Phase::Waiting {
            since: Instant::now(),
            head: None,
        });
    }
}

/// Serves the admin listener until shutdown.
async fn serve(
    socket: TcpListener,
    registry: Arc<AdminState>,
    mut shutdown: watch::Receiver<bool>,
    limits: AdminLimits,
) {
    let limits = Rc::new(limits);
    let slots = Rc::new(RefCell::new(Slots::default()));
    let errors = qweb_observe::log_limit::Every::new(Duration::from_secs(1));
    let (refusals, evictions) = (
        qweb_observe::log_limit::Every::new(Duration::from_secs(10)),
        qweb_observe::log_limit::Every::new(Duration::from_secs(10)),
    );
    let addr = socket.local_addr().ok();
    let reserve = Rc::new(RefCell::new(
        crate::runtime::process::fd_limit::FdReserve::new(),
    ));
    loop {
        let accepted = tokio::select! {
            r = socket.accept() => r,
            _ = shutdown.wait_for(|s| *s) => return,
        };
        let (stream, peer, reserved) = match accepted {
            Ok((stream, peer)) => (stream, peer, false),
            Err(e) => {
                if let Some(suppressed) = errors.hit() {
                    tracing::error!(listener = ?addr, suppressed, "admin listener: accept failed: {e}");
                }
                // Out of fds (the workers' connections took them all): the reserve's fd is
                // given back and a scrape served in its place, one at a time.
                let retry = crate::runtime::process::fd_limit::out_of_fds(&e)
                    && reserve.borrow_mut().release();
                let got = match retry {
                    true => socket.accept().now_or_never().and_then(Result::ok),
                    false => None,
                };
                match got {
                    Some((stream, peer)) => (stream, peer, true),
                    None => {
                        reserve.borrow_mut().restore();
                        // EMFILE/ENFILE and the like: the pending connection stays queued and
                        // accept would fail again at once. Back off instead of spinning.
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_millis(50)) => continue,
                            _ = shutdown.wait_for(|s| *s) => return,
                        }
                    }
                }
            }
        };
        let client = peer.ip().to_canonical();
        let (admit, evicted) = slots.borrow_mut().admit(client, &limits);
        let slot = match admit {
            Admit::Yes(slot) => slot,
            refused => {
                if let Some(suppressed) = refusals.hit() {
                    let why = match refused {
                        Admit::ClientFull => "its address holds connections_per_client already",
                        _ => "every connection is answering a request",
                    };
                    tracing::warn!(listener = ?addr, %client, suppressed, "admin listener: connection closed at once: {why}");
                }
                drop(stream);
                if reserved {
                    reserve.borrow_mut().restore();
                }
                continue;
            }
        };
        if evicted {
            if let Some(suppressed) = evictions.hit() {
                tracing::warn!(listener = ?addr, %client, suppressed, "admin listener: all {} connections taken: the one waiting longest for a request head was closed for a new one", limits.max_connections);
            }
        }
        let (registry, slots, reserve, limits) = (
            registry.clone(),
            slots.clone(),
            reserve.clone(),
            limits.clone(),
        );
        tokio::task::spawn_local(async move {
            connection(stream, slot.clone(), registry, &limits).await;
            slots.borrow_mut().remove(slot.id);
            if reserved {
                reserve.borrow_mut().restore();
            }
        });
        // The new connection reads its head (a scrape's is there already) before the next
        // accept can evict it.
        tokio::task::yield_now().await;
    }
}

/// Serves one admin connection until it ends, is cut (head or idle timeout, eviction) or
/// reaches its lifetime.
async fn connection(
    stream: TcpStream,
    slot: Rc<Slot>,
    registry: Arc<AdminState>,
    limits: &AdminLimits,
) {
    let answering = slot.clone();
    let svc = service_fn(move |req| {
        answering.set(Phase::Answering);
        let registry = registry.clone();
        let answering = answering.clone();
        async move {
            let r = handle(&req, &registry).await.map(|body| -> Body {
                Box::pin(Answered {
                    body,
                    slot: answering.clone(),
                })
            });
            Ok::<_, Infallible>(r)
        }
    });
    let io = Watched {
        io: stream,
        slot: slot.clone(),
    };
    let conn = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(io), svc);
    let mut conn = std::pin::pin!(conn);
    let lifetime = tokio::time::sleep(CONNECTION_LIFETIME);
    let mut lifetime = std::pin::pin!(lifetime);
    loop {
        let deadline = slot.deadline(limits);
        let timer = async move {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            _ = conn.as_mut() => return,
            _ = slot.wake.notified() => {
                if slot.evicted.get() {
                    return;
                }
            }
            _ = timer => {
                // a head that did not come in time, or an idle wait that ran out: closed
                if slot.deadline(limits).is_some_and(|d| d <= Instant::now()) {
                    return;
                }
            }
            _ = lifetime.as_mut() => {
                // A keep-alive connection (the status page polls on one): the answer being
                // written may end, then it closes, so the page sees no failed fetch.
                conn.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout(LIFETIME_GRACE, conn).await;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{Ipv4Addr, SocketAddr};

    /// An admin listener on 127.0.0.1:0 with `limits`, on a thread of its own; stops when the
    /// sender is dropped.
    fn start(limits: AdminLimits) -> (SocketAddr, watch::Sender<bool>) {
        let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        socket.set_nonblocking(true).unwrap();
        let addr = socket.local_addr().unwrap();
        let registry = Arc::new(Metrics::new(
            Vec::new(),
            qweb_offload::EngineSet::default(),
            Default::default(),
            String::new(),
            Vec::new(),
        ));
        let (tx, rx) = watch::channel(false);
        let state = AdminState {
            registry,
            cache: None,
            fleet: None,
        };
        std::thread::spawn(move || run_with(socket, state, rx, limits));
        (addr, tx)
    }

    fn connect_from(last: u8, addr: SocketAddr) -> std::net::TcpStream {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        let from = SocketAddr::from((Ipv4Addr::new(127, 0, 0, last), 0));
        s.bind(&from.into()).unwrap();
        s.connect(&addr.into()).unwrap();
        let s: std::net::TcpStream = s.into();
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        s
    }

    /// Reads until the server closes `s`: what came, and how long it took (`None`: still
    /// open after `within`).
    fn until_closed(s: &mut std::net::TcpStream, within: Duration) -> Option<(Vec<u8>, Duration)> {
        s.set_read_timeout(Some(within)).unwrap();
        let since = std::time::Instant::now();
        let mut out = Vec::new();
        let mut b = [0u8; 4096];
        loop {
            match s.read(&mut b) {
                Ok(0) => return Some((out, since.elapsed())),
                Ok(n) => out.extend_from_slice(&b[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return None,
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return None,
                Err(_) => return Some((out, since.elapsed())),
            }
        }
    }

    const GET: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";

    fn answered(s: &mut std::net::TcpStream) -> bool {
        s.write_all(GET).unwrap();
        let (out, _) = until_closed(s, Duration::from_secs(2)).expect("an answer and a close");
        out.starts_with(b"HTTP/1.1 200")
    }

    #[test]
    fn configured_connections_per_client_and_max_connections() {
        let (addr, _stop) = start(AdminLimits {
            max_connections: 3,
            connections_per_client: 2,
            ..AdminLimits::default()
        });
        let mut a1 = connect_from(31, addr);
        std::thread::sleep(Duration::from_millis(30));
        let mut a2 = connect_from(31, addr);
        std::thread::sleep(Duration::from_millis(30));
        // a third from the same address: closed at once
        let mut a3 = connect_from(31, addr);
        let (_, took) = until_closed(&mut a3, Duration::from_secs(1)).expect("closed at once");
        assert!(took < Duration::from_millis(500), "{took:?}");
        let mut b1 = connect_from(32, addr);
        std::thread::sleep(Duration::from_millis(30));
        // all 3 taken: a fourth (another address) evicts the oldest, a1
        let mut c1 = connect_from(33, addr);
        assert!(answered(&mut c1));
        assert!(until_closed(&mut a1, Duration::from_millis(500)).is_some());
        // the others are open and answer
        assert!(answered(&mut a2));
        assert!(answered(&mut b1));
    }

    #[test]
    fn configured_head_and_idle_timeouts() {
        let (addr, _stop) = start(AdminLimits {
            header_timeout: Duration::from_millis(300),
            idle_timeout: Duration::from_millis(600),
            ..AdminLimits::default()
        });
        // a head that never ends: cut at 300 ms from the accept
        let mut slow = connect_from(41, addr);
        slow.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
        let (_, took) = until_closed(&mut slow, Duration::from_secs(2)).expect("cut");
        assert!(
            took >= Duration::from_millis(250) && took < Duration::from_millis(900),
            "{took:?}"
        );
        // kept alive after an answer: closed after 600 ms without a request
        let mut idle = connect_from(42, addr);
        idle.write_all(b"GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n")
            .unwrap();
        let mut b = [0u8; 4096];
        assert!(idle.read(&mut b).unwrap() > 0);
        let (_, took) = until_closed(&mut idle, Duration::from_secs(2)).expect("closed");
        assert!(
            took >= Duration::from_millis(500) && took < Duration::from_millis(1200),
            "{took:?}"
        );
    }
}
