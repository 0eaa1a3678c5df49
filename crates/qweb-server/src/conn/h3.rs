//! The HTTP/3 connection driver: one QUIC connection (quinn) from its handshake to its end,
//! its requests read with the `h3` crate and answered through the same [`Handle`] as HTTP/1.1
//! and HTTP/2. Like `h1.rs` and `h2.rs` it knows no routes.
//!
//! Each request runs as a task of its own on the worker's `LocalSet` (a `JoinSet` owned by
//! the connection's task, so aborting the connection aborts its requests). The response head
//! goes out with `send_response`, the body frame by frame with `send_data` (each write under
//! `send_timeout`: a client that stops reading loses the stream, not the worker's memory),
//! trailers with `send_trailers`.

use std::pin::pin;
use std::rc::Rc;

use bytes::Bytes;
use http_body_util::BodyExt;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::lazy_timer::LazyTimer;
use super::{handshake_outcome, sleep_or_never, Handle, Host};
use qweb_http::request_body::RequestBody;
use qweb_session::closing::{Closing, Drain, GRACE};
use qweb_session::{ConnState, Expiry, Timeouts};

/// The ALPN protocol id of HTTP/3.
pub(crate) const ALPN_H3: &[u8] = b"h3";

/// HTTP/3's error code for a peer generating excessive load (RFC 9114 section 8.1).
const H3_EXCESSIVE_LOAD: u32 = 0x0107;

/// One HTTP/3 connection of the driver.
type H3Conn = h3::server::Connection<h3_quinn::Connection, Bytes>;
/// A request's stream, both halves.
type H3Stream = h3::server::RequestStream<h3_quinn::BidiStream<Bytes>, Bytes>;
/// The sending half of a request's stream.
type H3Send = h3::server::RequestStream<h3_quinn::SendStream<Bytes>, Bytes>;

/// Serves one incoming QUIC connection to its end: the handshake under
/// `tls_handshake_timeout`, then HTTP/3 requests until the client closes, the connection has
/// no request for `keepalive_timeout` (QUIC's idle timeout, and a GOAWAY when the client
/// keeps QUIC busy with no request), or a shutdown or reload ends it (GOAWAY; requests in
/// flight finish).
pub(crate) async fn serve<H: Host, S: Handle>(
    incoming: quinn::Incoming,
    worker: &H,
    service: impl FnOnce(Rc<ConnState>) -> S,
) {
    let peer = crate::conn::canonical_peer(incoming.remote_address());
    let limits = worker.limits();
    let m = worker.metrics();
    // quinn runs the ClientHello's step (the signature, in modes `none` and `sync`) inside
    // `accept`: it takes the worker's handshake turn as a TCP handshake's step does, so that a
    // burst of new QUIC connections does not queue ahead of requests already ready
    let handshaking = Handshaking::new(m);
    let turns = crate::conn::handshake_turns();
    let turn = turns.take().await;
    let connecting = match incoming.accept() {
        Ok(c) => c,
        Err(e) => {
            handshake_outcome::<(), _>(m, peer, "QUIC handshake", Ok(Err(e)));
            return;
        }
    };
    drop(turn);
    let done = tokio::time::timeout(limits.tls_handshake_timeout, connecting).await;
    let Some(conn) = handshake_outcome(m, peer, "QUIC handshake", done) else {
        return;
    };
    drop(handshaking);
    // The client's slot under `connections_per_client`, taken only now: a completed
    // handshake proves the address (RFC 9000 section 8.1), so Initials from forged
    // addresses take no victim's slots. Past the limit: closed at once (H3_EXCESSIVE_LOAD).
    let Some(_slot) = super::client_slot(worker, peer) else {
        conn.close(H3_EXCESSIVE_LOAD.into(), b"connections_per_client");
        return;
    };
    let _open =
        qweb_observe::metrics::ProtocolOpen::new(m, qweb_observe::metrics::HttpProtocol::H3);
    let state = Rc::new(ConnState::new(peer));
    state.protocol.set("HTTP/3");
    state.tls_version.set(Some("TLSv1.3"));
    if let Some(name) = conn
        .handshake_data()
        .and_then(|d| d.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
        .and_then(|d| d.server_name)
    {
        let _ = state.sni.set(name.into());
    }
    // the chain rustls verified (`client_auth`), as over TCP
    let chain = conn.peer_identity().and_then(|p| {
        p.downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
            .ok()
    });
    if let Some(c) = qweb_tls::ClientCert::of_chain(chain.as_deref().map(Vec::as_slice)) {
        let _ = state.client_cert.set(std::sync::Arc::new(c));
    }
    let h3 = h3::server::builder()
        .max_field_section_size(limits.max_request_header_size as u64)
        .build::<_, Bytes>(h3_quinn::Connection::new(conn.clone()))
        .await;
    let h3 = match h3 {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(%peer, "HTTP/3 connection setup failed: {e}");
            return;
        }
    };
    let svc = Rc::new(service(state.clone()));
    requests(h3, worker, svc, &state).await;
    // The last responses may still be in flight (sent, not yet acknowledged: closing now
    // would drop them). The client closes once it has them, or it gets `CLOSE_GRACE`.
    let _ = tokio::time::timeout(GRACE, conn.closed()).await;
    conn.close(0u32.into(), b"");
}

/// Accepts the connection's requests until it ends; a drain (shutdown, retirement, no request
/// for `keepalive_timeout`) sends GOAWAY and lets the requests in flight finish: the
/// session's [`Closing`], as HTTP/1 and HTTP/2 keep it.
async fn requests<H: Host, S: Handle>(
    mut h3: H3Conn,
    worker: &H,
    svc: Rc<S>,
    state: &Rc<ConnState>,
) {
    let limits = worker.limits();
    let mut shutdown = worker.shutdown();
    let mut retire = worker.retired();
    let mut shut = pin!(shutdown.wait_for(|s| *s));
    let mut retired = pin!(retire.wait_for(|r| *r));
    let mut tasks = JoinSet::new();
    // `keepalive_timeout` with no request in flight drains the connection, whatever else the
    // client sends: QUIC's own idle timeout restarts on every packet, so a client sending only
    // PINGs would otherwise hold it forever. (Each write has its own `send_timeout`, below.)
    let timeouts = Timeouts {
        per_response: false,
        ..Timeouts::multiplexed(limits)
    };
    let mut timer = LazyTimer::new();
    loop {
        if let Closing::Draining {
            announced: false, ..
        } = state.closing()
        {
            // GOAWAY: no new requests; those in flight finish (then `accept` says None)
            if let Err(e) = h3.shutdown(0).await {
                tracing::debug!(peer = %state.peer, "HTTP/3 GOAWAY failed: {e}");
                break;
            }
            // (h3 ends `accept` only when the client closes: once nothing is in flight, the
            // connection gets `GRACE` more, then closes)
            let drop_at = tasks.is_empty().then(|| Instant::now() + GRACE);
            state.set_closing(state.closing().announce(drop_at));
        }
        let closing = state.closing();
        timer.arm(
            state
                .deadline(timeouts)
                .filter(|_| !closing.announced())
                .map(|d| d.0),
        );
        tokio::select! {
            r = h3.accept() => match r {
                Ok(Some(resolver)) => {
                    let svc = svc.clone();
                    let head_timeout = limits.header_read_timeout;
                    let send_timeout = limits.send_timeout;
                    let peer = state.peer;
                    let refused = worker.refused_log();
                    tasks.spawn_local(async move {
                        let resolved = tokio::time::timeout(head_timeout, resolver.resolve_request()).await;
                        match resolved {
                            Ok(Ok((req, stream))) => exchange(svc, req, stream, send_timeout, (peer, refused)).await,
                            Ok(Err(e)) => {
                                tracing::debug!(%peer, "HTTP/3 request refused: {e}");
                                log_refused(refused, peer, http::StatusCode::BAD_REQUEST);
                            }
                            Err(_) => tracing::debug!(%peer, "HTTP/3 request head timed out"),
                        }
                    });
                }
                Ok(None) => break,
                Err(e) => {
                    if !e.is_h3_no_error() {
                        tracing::debug!(peer = %state.peer, "HTTP/3 connection ended: {e}");
                    }
                    break;
                }
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {
                if tasks.is_empty() && closing.announced() {
                    state.set_closing(closing.announce(Some(Instant::now() + GRACE)));
                }
            }
            _ = timer.fired(), if tasks.is_empty() => {
                if let Some((d, Expiry::Idle)) = state.deadline(timeouts) {
                    if d <= Instant::now() {
                        tracing::debug!(peer = %state.peer, "closing: {}", Expiry::Idle.as_str());
                        state.drain(Drain::Idle);
                    }
                }
            }
            // GOAWAY is out, nothing is in flight, and the client did not close
            _ = sleep_or_never(closing.deadline()), if tasks.is_empty() => break,
            // (each polled again only while its guard holds, never after it completed)
            _ = shut.as_mut(), if !state.closing().shutting_down() => state.drain(Drain::Shutdown),
            _ = retired.as_mut(), if state.closing().is_open() => state.drain(Drain::Retired),
        }
    }
    while tasks.join_next().await.is_some() {}
}

/// The access-log line of a refused request, when the log is on (as HTTP/1 writes it).
fn log_refused(
    format: Option<crate::config::AccessFormat>,
    peer: std::net::SocketAddr,
    status: http::StatusCode,
) {
    if let Some(format) = format {
        qweb_observe::access_log::refused(format, peer, status.as_u16());
    }
}

/// Answers one request on its stream: the handler's response head, then its body and
/// trailers, each write under `send_timeout`. A `Content-Length` that is not one number
/// (RFC 9110 §8.6, read as strictly as HTTP/1's) is refused with 400.
async fn exchange<S: Handle>(
    svc: Rc<S>,
    req: http::Request<()>,
    stream: H3Stream,
    send_timeout: std::time::Duration,
    (peer, refused): (std::net::SocketAddr, Option<crate::config::AccessFormat>),
) {
    let (mut send, recv) = stream.split();
    let mut lengths = req.headers().get_all(http::header::CONTENT_LENGTH).iter();
    let length = match (lengths.next(), lengths.next()) {
        (None, _) => Ok(None),
        (Some(v), None) => qweb_http::h1::parse::content_length(v.as_bytes())
            .map(Some)
            .ok_or(()),
        (Some(_), Some(_)) => Err(()),
    };
    let Ok(length) = length else {
        tracing::debug!(%peer, "HTTP/3 request refused: invalid Content-Length");
        log_refused(refused, peer, http::StatusCode::BAD_REQUEST);
        let resp = qweb_http::response::status(http::StatusCode::BAD_REQUEST);
        let (parts, body) = resp.into_parts();
        let head = http::Response::from_parts(parts, ());
        if timed(send_timeout, send.send_response(head)).await.is_ok() {
            if let Ok(data) = body.collect().await.map(|b| b.to_bytes()) {
                let _ = timed(send_timeout, send.send_data(data)).await;
            }
            let _ = timed(send_timeout, send.finish()).await;
        }
        return;
    };
    let req = req.map(|()| RequestBody::h3(recv, length));
    let resp = svc.call(req).await;
    let (mut parts, body) = resp.into_parts();
    qweb_http::fields::strip_connection_specific(&mut parts.headers);
    qweb_http::response::server_field(&mut parts.headers);
    let head = http::Response::from_parts(parts, ());
    match tokio::time::timeout(send_timeout, send.send_response(head)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::debug!("HTTP/3 response head not sent: {e}");
            return;
        }
        Err(_) => {
            send.stop_stream(h3::error::Code::H3_REQUEST_CANCELLED);
            return;
        }
    }
    if let Err(why) = send_body(&mut send, body, send_timeout).await {
        tracing::debug!("HTTP/3 response body ended early: {why}");
        send.stop_stream(h3::error::Code::H3_INTERNAL_ERROR);
    }
}

/// Streams `body` on `send`: DATA frames, trailers, then the stream's end.
async fn send_body(
    send: &mut H3Send,
    mut body: qweb_session::logged::Logged,
    send_timeout: std::time::Duration,
) -> Result<(), String> {
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("response body failed: {e}"))?;
        let frame = match frame.into_data() {
            Ok(data) => {
                if data.is_empty() {
                    continue;
                }
                timed(send_timeout, send.send_data(data)).await?;
                continue;
            }
            Err(f) => f,
        };
        if let Ok(trailers) = frame.into_trailers() {
            timed(send_timeout, send.send_trailers(trailers)).await?;
            break;
        }
    }
    timed(send_timeout, send.finish()).await
}

/// One write under `send_timeout`.
async fn timed(
    limit: std::time::Duration,
    write: impl std::future::Future<Output = Result<(), h3::error::StreamError>>,
) -> Result<(), String> {
    match tokio::time::timeout(limit, write).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("send_timeout: the client took nothing".into()),
    }
}

/// Counts a QUIC handshake in progress on the worker while it lives (the accept loop's Retry
/// threshold reads the count).
struct Handshaking<'a>(&'a qweb_observe::metrics::WorkerMetrics);

impl<'a> Handshaking<'a> {
    fn new(m: &'a qweb_observe::metrics::WorkerMetrics) -> Self {
        m.quic_handshaking
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Handshaking(m)
    }
}

impl Drop for Handshaking<'_> {
    fn drop(&mut self) {
        self.0
            .quic_handshaking
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}
