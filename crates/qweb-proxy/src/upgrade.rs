//! HTTP/1.1 `Upgrade` pass-through (RFC 9110 §7.8): WebSocket, and any other protocol token
//! the route lists in `upgrade`.
//!
//! 1. The client's request asks for an upgrade (`Upgrade` with `Connection: upgrade`) to a
//!    protocol the route allows: it goes to the upstream on a connection of its own (never
//!    pooled), with its `Upgrade` and `Connection: upgrade`. Any other upgrade is stripped
//!    (the request goes on as a plain one), so that an `Upgrade: h2c` never reaches an
//!    upstream.
//! 2. The upstream answers 101 switching to the protocol asked for: the 101 goes to the
//!    client, and the [`Tunnel`] waits in the client connection's
//!    [`TunnelSlot`](qweb_session::tunnel::TunnelSlot). Any other
//!    answer is an ordinary response (a 101 to another protocol is a 502).
//! 3. Once hyper has written the 101 and given the client connection back, the connection
//!    calls [`run`]: the bytes are copied both ways until both sides have closed, or one
//!    fails, or nothing moved for the route's `upgrade_idle_timeout`, or a write waits that
//!    long (a peer that stops reading does not hold the tunnel forever). The access-log
//!    line of the 101 is written then, with the bytes both ways ([`qweb_session::logged::TunnelTally`]).
//! 4. A reload does not cut it at `shutdown_timeout`: it goes on up to
//!    `upgrade_drain_timeout`; then, or at shutdown, it is told to go away ([`Ending`]): a
//!    WebSocket gets a close frame 1001 (going away) each way, put between two frames (the
//!    copy tracks where each direction's frames end), and the tunnel closes.

use std::cell::Cell;
use std::pin::pin;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Response, StatusCode};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use super::body::ClientBody;
use super::{
    client_status, strip_hop_by_hop, upstream_request, ClientInfo, Proxy, SendBody, Target,
};
use qweb_http::body::Body;
use qweb_http::response;

/// How long the upstream side of an accepted upgrade may take to be handed over by hyper.
const HANDOFF_TIMEOUT: Duration = Duration::from_secs(5);

/// Size of a direction's copy buffer while bytes flow.
const COPY_BUF: usize = 16 * 1024;
/// What a direction reads into while its traffic is small (chat messages, pings, an idle
/// tunnel): the large buffer is allocated only after a read filled this one, and given back
/// after a read that this one would have held, so an idle tunnel holds no copy buffer.
const SMALL_BUF: usize = 512;

/// How long a direction told to go away may take to reach the end of the frame it is in
/// before the tunnel is closed without a close frame.
const GOING_AWAY_GRACE: Duration = Duration::from_secs(1);

/// A WebSocket close frame with status 1001 (going away), server to client (unmasked).
const CLOSE_1001_TO_CLIENT: [u8; 4] = [0x88, 0x02, 0x03, 0xe9];

use qweb_session::tunnel::Ending;

/// Resolves when `e` says to end; never without one.
async fn ending(e: &mut Option<Ending>) {
    match e {
        Some(e) => e.wait().await,
        None => std::future::pending().await,
    }
}

/// Where one direction of a WebSocket is in its frames (RFC 6455 §5.2): a close frame can be
/// put in only between two frames (control frames may come between the fragments of a
/// message).
#[derive(Default)]
struct Frames {
    /// The header read so far of the next frame.
    head: [u8; 14],
    have: usize,
    /// Payload bytes of the current frame still to pass.
    left: u64,
    /// A close frame passed (then none is added).
    closed: bool,
}

impl Frames {
    fn at_boundary(&self) -> bool {
        self.have == 0 && self.left == 0
    }

    fn feed(&mut self, mut b: &[u8]) {
        while let Some((&first, rest)) = b.split_first() {
            if self.left > 0 {
                let n = usize::try_from(self.left)
                    .unwrap_or(usize::MAX)
                    .min(b.len());
                self.left -= n as u64;
                b = &b[n..];
                continue;
            }
            self.head[self.have] = first;
            self.have += 1;
            b = rest;
            if self.have < 2 {
                continue;
            }
            let len7 = self.head[1] & 0x7f;
            let ext = match len7 {
                126 => 2,
                127 => 8,
                _ => 0,
            };
            let mask = if self.head[1] & 0x80 != 0 { 4 } else { 0 };
            if self.have < 2 + ext + mask {
                continue;
            }
            self.left = match ext {
                2 => u64::from(u16::from_be_bytes([self.head[2], self.head[3]])),
                8 => {
                    let mut l = [0u8; 8];
                    l.copy_from_slice(&self.head[2..10]);
                    u64::from_be_bytes(l)
                }
                _ => u64::from(len7),
            };
            if self.head[0] & 0x0f == 0x8 {
                self.closed = true;
            }
            self.have = 0;
        }
    }
}

/// A WebSocket close frame with status 1001, client to server (masked, RFC 6455 §5.3).
fn close_1001_to_upstream() -> [u8; 8] {
    let k = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0x5a5a_5a5a)
        .to_be_bytes();
    [0x88, 0x82, k[0], k[1], k[2], k[3], 0x03 ^ k[0], 0xe9 ^ k[1]]
}

/// The client's side of an extended CONNECT: its stream, handed over by hyper's HTTP/2
/// connection or by qweb's own once the 200 went out.
pub(super) enum ClientStream {
    Hyper(hyper::upgrade::OnUpgrade),
    Own(qweb_http::h2::Upgrade),
}

impl ClientStream {
    pub(super) fn of(
        req: &mut http::Request<qweb_http::request_body::RequestBody>,
        conn: &qweb_session::ConnState,
    ) -> Self {
        let own = req.extensions_mut().remove::<qweb_http::h2::UpgradeId>();
        match own.zip(conn.h2.borrow().upgrade()) {
            Some((id, c)) => ClientStream::Own(qweb_http::h2::Upgrade::new(c, id.0)),
            None => ClientStream::Hyper(hyper::upgrade::on(req)),
        }
    }

    /// The stream, once the answer went out.
    pub(super) async fn open(self) -> Result<Box<dyn qweb_session::tunnel::TunnelIo>, String> {
        match self {
            ClientStream::Hyper(u) => match u.await {
                Ok(d) => Ok(Box::new(hyper_util::rt::TokioIo::new(d))),
                Err(e) => Err(e.to_string()),
            },
            ClientStream::Own(u) => match u.open().await {
                Ok(t) => Ok(Box::new(t)),
                Err(e) => Err(e.to_string()),
            },
        }
    }
}

/// An upgrade the upstream accepted, waiting for the client connection to be free.
pub struct Tunnel {
    pub(super) upstream: hyper::upgrade::OnUpgrade,
    pub(super) idle: Duration,
    pub(super) name: String,
    /// The bytes both ways, for the access-log line of the response that opened it.
    pub(super) tally: qweb_session::logged::TunnelTally,
    /// A WebSocket: told to go away, it sends close frames 1001.
    pub(super) websocket: bool,
}

impl qweb_session::tunnel::Tunnel for Tunnel {
    fn run<'a>(
        self: Box<Self>,
        client: Box<dyn qweb_session::tunnel::TunnelIo + 'a>,
        early: Bytes,
        ending: Option<Ending>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + 'a>> {
        Box::pin(run(client, early, *self, ending))
    }
}

/// The `Upgrade` value of a request that asks for an upgrade: `Upgrade` present and
/// `Connection` naming `upgrade`.
pub(super) fn requested(h: &HeaderMap) -> Option<HeaderValue> {
    let up = h.get(header::UPGRADE)?;
    let named = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    named.then(|| up.clone())
}

/// Every protocol in `value` (a comma-separated list of `name[/version]`) is allowed: its
/// `name/version` or its bare `name` is in `allow` (lowercase).
pub(super) fn allowed(value: &HeaderValue, allow: &[String]) -> bool {
    let Ok(v) = value.to_str() else {
        return false;
    };
    let mut any = false;
    for p in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        any = true;
        let p = p.to_ascii_lowercase();
        let name = p.split('/').next().unwrap_or("");
        if !allow.iter().any(|a| *a == p || a == name) {
            return false;
        }
    }
    any
}

/// The upstream's 101 switches to a protocol the client asked for.
pub(super) fn answer_matches(asked: &HeaderValue, answer: Option<&HeaderValue>) -> bool {
    let (Ok(asked), Some(Ok(answer))) = (asked.to_str(), answer.map(|a| a.to_str())) else {
        return false;
    };
    let answer = answer.trim();
    !answer.is_empty()
        && !answer.contains(',')
        && asked
            .split(',')
            .any(|p| p.trim().eq_ignore_ascii_case(answer))
}

impl Proxy {
    /// Step 1 and 2: sends an upgrade request for `token` on a connection of its own, and
    /// answers the upstream's 101 with a 101 (the tunnel left in the client's slot), or
    /// passes any other answer on.
    ///
    /// With `h2_client` (an HTTP/2 extended CONNECT, RFC 8441), the client's side is its
    /// stream: the upstream's 101 becomes a 200 and the tunnel starts once hyper hands the
    /// stream over.
    pub(super) async fn upgrade(
        self: &Rc<Self>,
        req: Request<SendBody>,
        token: HeaderValue,
        target: &Target<'_>,
        client: &ClientInfo,
        order: &[usize],
        h2_client: Option<ClientStream>,
    ) -> Response<Body> {
        if order.is_empty() {
            return self.all_down();
        }
        let (mut req, progress) = match upstream_request(req, target, client, &self.cfg) {
            Ok(r) => r,
            Err(code) => return response::status(code),
        };
        if h2_client.is_some() {
            req.headers_mut().remove(header::CONTENT_LENGTH);
        }
        req.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        req.headers_mut().insert(header::UPGRADE, token.clone());
        let mut idx = order[0];
        let mut tcp = Err(StatusCode::BAD_GATEWAY);
        for &i in order {
            idx = i;
            match self.dial(i, Some(client.addr)).await {
                Ok(t) => {
                    tcp = Ok(t);
                    break;
                }
                Err(f) => {
                    self.balancer.failed(i);
                    tcp = Err(f.status);
                }
            }
        }
        let tcp = match tcp {
            Ok(t) => t,
            Err(status) => return response::status(status),
        };
        let name = self.cfg.upstreams[idx].name.clone();
        let max_buf = self.cfg.max_response_header_size;
        let handshake = if self.cfg.upstreams[idx].tls {
            match self.tls_handshake(idx, tcp).await {
                Ok(tls) => open(TokioIo::new(tls), max_buf, &name).await,
                Err(f) => return response::status(f.status),
            }
        } else {
            open(TokioIo::new(tcp), max_buf, &name).await
        };
        let Some(mut sender) = handshake else {
            return response::status(StatusCode::BAD_GATEWAY);
        };
        let sent = tokio::time::timeout(self.cfg.timeout, sender.send_request(req)).await;
        let mut resp = match sent {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                if let Some(c) = progress.client_error.get() {
                    return response::status(client_status(c));
                }
                tracing::warn!(upstream = %name, "upstream upgrade request failed: {e}");
                return response::status(StatusCode::BAD_GATEWAY);
            }
            Err(_) => {
                tracing::warn!(upstream = %name, "upstream upgrade response timed out");
                return response::status(StatusCode::GATEWAY_TIMEOUT);
            }
        };
        if h2_client.is_some() && resp.status().is_success() {
            // to an extended CONNECT a 2xx means "tunnel open", and this upstream did not switch
            tracing::warn!(upstream = %name, status = %resp.status(), "upstream answered an upgrade without switching protocols");
            return response::status(StatusCode::BAD_GATEWAY);
        }
        if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
            // declined (426, 200, 4xx...): an ordinary response on a connection not reused
            let asked = super::Asked {
                head: false,
                trailers: false,
            };
            return self.respond(resp, None, None, idx, asked, progress);
        }
        let Some(answer) = resp
            .headers()
            .get(header::UPGRADE)
            .filter(|a| answer_matches(&token, Some(a)))
            .cloned()
        else {
            tracing::warn!(upstream = %name, "upstream switched to a protocol not asked for");
            return response::status(StatusCode::BAD_GATEWAY);
        };
        let upstream = hyper::upgrade::on(&mut resp);
        let mut headers = std::mem::take(resp.headers_mut());
        strip_hop_by_hop(&mut headers);
        let tally = qweb_session::logged::TunnelTally::default();
        let tunnel = Tunnel {
            upstream,
            idle: self.cfg.upgrade_idle_timeout,
            name,
            tally: tally.clone(),
            websocket: answer.as_bytes().eq_ignore_ascii_case(b"websocket"),
        };
        if let Some(down) = h2_client {
            headers.remove("sec-websocket-accept");
            // The stream is a tunnel of its connection: the connection is busy while it runs
            // (not closed as idle at keepalive_timeout, nor at once by a reload's GOAWAY), its
            // task is kept past a reload's shutdown_timeout, and the tunnel is told when to go
            // away (close frames 1001), as an HTTP/1.1 upgrade's.
            let busy = client.conn.request_started_guard();
            let (registered, ending) = client
                .tunnels
                .started_on(client.conn.task, client.shutdown.clone());
            tokio::task::spawn_local(async move {
                let _held = (busy, registered);
                match tokio::time::timeout(HANDOFF_TIMEOUT, down.open()).await {
                    Ok(Ok(d)) => run(d, Bytes::new(), tunnel, Some(ending)).await,
                    _ => tracing::debug!(upstream = %tunnel.name, "client stream not handed over"),
                }
            });
            let mut r = Response::new(qweb_http::body::empty());
            *r.headers_mut() = headers;
            r.extensions_mut().insert(tally);
            return r;
        }
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, answer);
        client.conn.tunnel.set(Box::new(tunnel));
        let mut r = Response::new(qweb_http::body::empty());
        *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        *r.headers_mut() = headers;
        r.extensions_mut().insert(tally);
        r
    }
}

/// An HTTP/1.1 client connection on `io` that can be upgraded, its task spawned.
async fn open<IO>(io: IO, max_buf: usize, name: &str) -> Option<SendRequest<ClientBody>>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (sender, conn) = match hyper::client::conn::http1::Builder::new()
        .max_buf_size(max_buf)
        .handshake::<_, ClientBody>(io)
        .await
    {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!(upstream = %name, "upstream handshake failed: {e}");
            return None;
        }
    };
    let name = name.to_owned();
    tokio::task::spawn_local(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(upstream = %name, "upstream connection ended: {e}");
        }
    });
    Some(sender)
}

/// Runs an accepted upgrade: `down` is the client connection as hyper left it, `early` the
/// bytes hyper had read past the request head (the client may send before it sees the 101);
/// `end` says when to go away.
pub async fn run<D>(down: D, early: Bytes, t: Tunnel, end: Option<Ending>)
where
    D: AsyncRead + AsyncWrite + Unpin,
{
    let up = match tokio::time::timeout(HANDOFF_TIMEOUT, t.upstream).await {
        Ok(Ok(u)) => u,
        Ok(Err(e)) => {
            tracing::warn!(upstream = %t.name, "upgraded upstream connection lost: {e}");
            return;
        }
        Err(_) => {
            tracing::warn!(upstream = %t.name, "upgraded upstream connection not handed over");
            return;
        }
    };
    let mut up = TokioIo::new(up);
    let mut to_up = Frames::default();
    if !early.is_empty() {
        match tokio::time::timeout(t.idle, up.write_all(&early)).await {
            Ok(Ok(())) => to_up.feed(&early),
            _ => return,
        }
    }
    let frames = t.websocket.then(|| (to_up, Frames::default()));
    let (why, from_client, to_client) = splice(down, up, t.idle, frames, end).await;
    t.tally.set(early.len() as u64 + from_client, to_client);
    tracing::debug!(upstream = %t.name, "upgraded connection ended: {why}");
}

/// One direction's progress, shared with the watchdog.
struct Flow {
    /// Since when a write has been waiting for the peer to take bytes.
    blocked_since: Cell<Option<Instant>>,
    /// Bytes copied.
    moved: Cell<u64>,
}

/// Copies bytes both ways until both directions ended, one failed, or the idle or stall
/// limit passed, or `end` said to go away; returns why it ended, and the bytes copied from `a` and to it. `frames`: a WebSocket's
/// frame positions (`a` to `b`, `b` to `a`), to add close frames when going away.
async fn splice<A, B>(
    a: A,
    b: B,
    idle: Duration,
    frames: Option<(Frames, Frames)>,
    end: Option<Ending>,
) -> (&'static str, u64, u64)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let (mut ar, mut aw) = tokio::io::split(a);
    let (mut br, mut bw) = tokio::io::split(b);
    let last = Cell::new(Instant::now());
    let up = Flow {
        blocked_since: Cell::new(None),
        moved: Cell::new(0),
    };
    let down = Flow {
        blocked_since: Cell::new(None),
        moved: Cell::new(0),
    };
    let (to_b_frames, to_a_frames) = match frames {
        Some((ab, ba)) => (Some(ab), Some(ba)),
        None => (None, None),
    };
    let close_up = close_1001_to_upstream();
    let mut to_b = pin!(pump(
        &mut ar,
        &mut bw,
        &last,
        &up,
        to_b_frames.map(|f| (f, &close_up[..])),
        end.clone()
    ));
    let mut to_a = pin!(pump(
        &mut br,
        &mut aw,
        &last,
        &down,
        to_a_frames.map(|f| (f, &CLOSE_1001_TO_CLIENT[..])),
        end
    ));
    let mut went_away = false;
    let (mut a_done, mut b_done) = (false, false);
    let why = 'run: loop {
        let mut deadline = last.get() + idle;
        for f in [&up, &down] {
            if let Some(s) = f.blocked_since.get() {
                deadline = deadline.min(s + idle);
            }
        }
        tokio::select! {
            r = to_b.as_mut(), if !a_done => {
                match r {
                    Err(_) => break 'run "client side failed",
                    Ok(gone) => went_away |= gone,
                }
                a_done = true;
            }
            r = to_a.as_mut(), if !b_done => {
                match r {
                    Err(_) => break 'run "upstream side failed",
                    Ok(gone) => went_away |= gone,
                }
                b_done = true;
            }
            _ = tokio::time::sleep_until(deadline) => {
                let now = Instant::now();
                if last.get() + idle <= now {
                    break 'run "idle";
                }
                if [&up, &down]
                    .iter()
                    .any(|f| f.blocked_since.get().is_some_and(|s| s + idle <= now))
                {
                    break 'run "a peer stopped reading";
                }
            }
        }
        if a_done && b_done {
            break if went_away { "going away" } else { "closed" };
        }
    };
    (why, up.moved.get(), down.moved.get())
}

/// Copies `r` to `w` until `r` ends (then shuts `w` down for writing), or `end` says to go
/// away: then, with `ws` (the direction's frames and the close frame to send), at the next
/// frame boundary (within [`GOING_AWAY_GRACE`]) the close frame is sent, then `w` is shut
/// down. `Ok(true)`: it went away.
async fn pump<R, W>(
    r: &mut R,
    w: &mut W,
    last: &Cell<Instant>,
    flow: &Flow,
    mut ws: Option<(Frames, &[u8])>,
    mut end: Option<Ending>,
) -> std::io::Result<bool>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut small = [0u8; SMALL_BUF];
    let mut large: Option<Box<[u8]>> = None;
    let mut going: Option<Instant> = None;
    loop {
        if going.is_some() {
            match &ws {
                Some((f, _)) if !f.at_boundary() => {}
                _ => {
                    flow.blocked_since.set(Some(Instant::now()));
                    if let Some((f, close)) = &ws {
                        if !f.closed {
                            w.write_all(close).await?;
                            w.flush().await?;
                        }
                    }
                    let _ = w.shutdown().await;
                    flow.blocked_since.set(None);
                    return Ok(true);
                }
            }
        }
        let grace = going.map(|g| g + GOING_AWAY_GRACE);
        let n = tokio::select! {
            // first: when the other side's end (its answer to our going away) is ready in the
            // same turn, the close frame still goes out before this side is shut down
            biased;
            _ = ending(&mut end), if going.is_none() => {
                going = Some(Instant::now());
                continue;
            }
            _ = async { if let Some(g) = grace { tokio::time::sleep_until(g).await } }, if grace.is_some() => {
                // mid-frame for too long: closed without a close frame
                let _ = w.shutdown().await;
                return Ok(true);
            }
            n = r.read(match &mut large {
                Some(b) => &mut b[..],
                None => &mut small[..],
            }) => n?,
        };
        let buf: &[u8] = match &large {
            Some(b) => &b[..n],
            None => &small[..n],
        };
        last.set(Instant::now());
        if n == 0 && going.is_none() && end.as_ref().is_some_and(Ending::said) {
            // the source ended after we were told to go away (the peer answered the close
            // frame sent its way by closing): the close frame is still owed to this side
            going = Some(Instant::now());
            continue;
        }
        if n == 0 {
            flow.blocked_since.set(Some(Instant::now()));
            let r = w.shutdown().await;
            flow.blocked_since.set(None);
            return r.map(|()| false);
        }
        if let Some((f, _)) = &mut ws {
            f.feed(buf);
        }
        flow.blocked_since.set(Some(Instant::now()));
        w.write_all(buf).await?;
        flow.moved.set(flow.moved.get() + n as u64);
        w.flush().await?;
        flow.blocked_since.set(None);
        last.set(Instant::now());
        match &large {
            None if n == SMALL_BUF => large = Some(vec![0u8; COPY_BUF].into_boxed_slice()),
            Some(_) if n < SMALL_BUF => large = None,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Told to go away in the same turn as its source ended (the peer answered the close frame
    /// sent its way by closing at once): the close frame still goes to this side, then it is
    /// shut down. Before: `select!` could take the end of stream first (about one run in
    /// twelve of `reload_tunnels` under load), and the client got no close frame.
    #[tokio::test]
    async fn going_away_as_the_source_ends_still_sends_the_close_frame() {
        for _ in 0..64 {
            let shutdown = tokio::sync::watch::channel(true);
            let away = tokio::sync::watch::channel(false);
            let end = Ending::new(shutdown.1.clone(), away.1.clone());
            let mut source: &[u8] = &[];
            let mut sink = Vec::new();
            let flow = Flow {
                blocked_since: Cell::new(None),
                moved: Cell::new(0),
            };
            let last = Cell::new(Instant::now());
            let ws = Some((Frames::default(), &CLOSE_1001_TO_CLIENT[..]));
            let went = pump(&mut source, &mut sink, &last, &flow, ws, Some(end))
                .await
                .unwrap();
            assert!(went);
            assert_eq!(sink, CLOSE_1001_TO_CLIENT);
        }
    }

    fn hv(s: &str) -> HeaderValue {
        HeaderValue::from_str(s).unwrap()
    }

    #[test]
    fn requested_needs_connection_upgrade() {
        let mut h = HeaderMap::new();
        h.insert(header::UPGRADE, hv("websocket"));
        assert!(
            requested(&h).is_none(),
            "Upgrade without Connection: upgrade"
        );
        h.insert(header::CONNECTION, hv("keep-alive, Upgrade"));
        assert_eq!(requested(&h).unwrap(), "websocket");
    }

    #[test]
    fn allowed_tokens() {
        let allow = vec!["websocket".to_owned(), "foo/2".to_owned()];
        assert!(allowed(&hv("WebSocket"), &allow));
        assert!(allowed(&hv("websocket/13"), &allow));
        assert!(allowed(&hv("foo/2"), &allow));
        assert!(!allowed(&hv("foo/3"), &allow));
        assert!(!allowed(&hv("foo"), &allow));
        assert!(!allowed(&hv("h2c"), &allow));
        assert!(
            !allowed(&hv("websocket, h2c"), &allow),
            "every protocol listed"
        );
        assert!(!allowed(&hv(""), &allow));
    }

    #[test]
    fn answer_must_be_one_asked_for() {
        assert!(answer_matches(&hv("websocket"), Some(&hv("WebSocket"))));
        assert!(!answer_matches(&hv("websocket"), Some(&hv("h2c"))));
        assert!(!answer_matches(&hv("websocket"), None));
        assert!(!answer_matches(
            &hv("websocket"),
            Some(&hv("websocket, h2c"))
        ));
    }

    #[test]
    fn frame_boundaries_are_tracked_across_reads() {
        let mut f = Frames::default();
        assert!(f.at_boundary());
        // a masked text frame of 5 bytes, split anywhere
        let frame = [
            0x81,
            0x85,
            1,
            2,
            3,
            4,
            b'h' ^ 1,
            b'e' ^ 2,
            b'l' ^ 3,
            b'l' ^ 4,
            b'o' ^ 1,
        ];
        for split in 0..frame.len() {
            f.feed(&frame[..split]);
            assert_eq!(f.at_boundary(), split == 0, "{split}");
            f.feed(&frame[split..]);
            assert!(f.at_boundary());
        }
        // 16-bit and 64-bit lengths
        let mut long = vec![0x82, 126, 0x01, 0x00];
        long.resize(long.len() + 256, 0);
        long.extend([0x82, 127, 0, 0, 0, 0, 0, 1, 0, 0]);
        f.feed(&long);
        assert!(!f.at_boundary());
        let payload = [0u8; 65536];
        f.feed(&payload);
        assert!(f.at_boundary());
        assert!(!f.closed);
        f.feed(&CLOSE_1001_TO_CLIENT);
        assert!(f.at_boundary() && f.closed);
    }
}
