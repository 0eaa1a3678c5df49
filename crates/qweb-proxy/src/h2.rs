//! HTTP/2 upstreams: `h2c://` (prior knowledge) and `https://` with `upstream_http2 = true`
//! (ALPN h2). One multiplexed connection per upstream and worker, opened on first use and
//! again once it closed. Requests go with `:scheme`/`:authority` from the URL and the
//! client's `Host`, no connection-specific headers, and `TE: trailers` when the client sent
//! it (gRPC needs it); response trailers (`grpc-status`) pass through, and both bodies
//! stream independently (a bidirectional stream flows both ways at once).

use std::cell::RefCell;
use std::rc::Rc;

use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioIo, TokioTimer};

use super::body::{ClientBody, Progress};
use super::{client_status, Failure, Proxy, Retry};

/// Runs hyper's HTTP/2 client tasks on the worker.
#[derive(Clone, Copy)]
struct Spawn;

impl<F> hyper::rt::Executor<F> for Spawn
where
    F: std::future::Future + 'static,
{
    fn execute(&self, fut: F) {
        tokio::task::spawn_local(fut);
    }
}

/// The HTTP/2 connection of each upstream (`None`: not open).
#[derive(Default)]
pub(super) struct H2Conns(Vec<RefCell<Option<SendRequest<ClientBody>>>>);

impl H2Conns {
    pub(super) fn new(n: usize) -> Self {
        H2Conns((0..n).map(|_| RefCell::new(None)).collect())
    }
}

/// The request asks for trailers (`TE: trailers`).
pub(super) fn wants_trailers(h: &http::HeaderMap) -> bool {
    h.get_all(header::TE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("trailers"))
}

impl Proxy {
    /// The open connection to HTTP/2 upstream `idx`, or a new one.
    async fn h2_sender(&self, idx: usize) -> Result<SendRequest<ClientBody>, Failure> {
        if let Some(s) = self.h2.0[idx].borrow().as_ref() {
            if !s.is_closed() {
                return Ok(s.clone());
            }
        }
        let up = &self.cfg.upstreams[idx];
        let tcp = self.dial(idx, None).await?;
        let sender = if up.tls {
            let tls = self.tls_handshake(idx, tcp).await?;
            if tls.get_ref().1.alpn_protocol() != Some(b"h2") {
                tracing::warn!(upstream = %up.name, "upstream did not agree to HTTP/2 (ALPN)");
                return Err(Failure::new(StatusCode::BAD_GATEWAY, Retry::NextUpstream));
            }
            self.h2_handshake(idx, TokioIo::new(tls)).await?
        } else {
            self.h2_handshake(idx, TokioIo::new(tcp)).await?
        };
        *self.h2.0[idx].borrow_mut() = Some(sender.clone());
        Ok(sender)
    }

    async fn h2_handshake<IO>(&self, idx: usize, io: IO) -> Result<SendRequest<ClientBody>, Failure>
    where
        IO: hyper::rt::Read + hyper::rt::Write + Unpin + 'static,
    {
        let up = &self.cfg.upstreams[idx];
        let handshake = hyper::client::conn::http2::Builder::new(Spawn)
            .timer(TokioTimer::new())
            .max_header_list_size(self.cfg.max_response_header_size as u32)
            .handshake::<_, ClientBody>(io);
        let (sender, conn) = match tokio::time::timeout(self.cfg.connect_timeout, handshake).await {
            Ok(Ok(h)) => h,
            Ok(Err(e)) => {
                tracing::warn!(upstream = %up.name, "upstream HTTP/2 handshake failed: {e}");
                return Err(Failure::new(StatusCode::BAD_GATEWAY, Retry::NextUpstream));
            }
            Err(_) => {
                tracing::warn!(upstream = %up.name, "upstream HTTP/2 handshake timed out");
                return Err(Failure::new(
                    StatusCode::GATEWAY_TIMEOUT,
                    Retry::NextUpstream,
                ));
            }
        };
        let name = up.name.clone();
        tokio::task::spawn_local(async move {
            if let Err(e) = conn.await {
                tracing::debug!(upstream = %name, "upstream HTTP/2 connection ended: {e}");
            }
        });
        Ok(sender)
    }

    /// Sends `req` to HTTP/2 upstream `idx` and waits for the response head, timed as
    /// HTTP/1.1 ([`Proxy::await_head`]).
    pub(super) async fn h2_exchange(
        &self,
        idx: usize,
        mut req: Request<ClientBody>,
        progress: &Rc<Progress>,
        trailers: bool,
    ) -> Result<Response<Incoming>, (Failure, Option<Request<ClientBody>>)> {
        let mut sender = match self.h2_sender(idx).await {
            Ok(s) => s,
            Err(f) => return Err((f, Some(req))),
        };
        let up = &self.cfg.upstreams[idx];
        let scheme = if up.tls { "https" } else { "http" };
        let authority = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .filter(|h| h.parse::<http::uri::Authority>().is_ok())
            .unwrap_or(&up.name)
            .to_owned();
        let pq = req.uri().path_and_query().map_or("/", |p| p.as_str());
        let Ok(uri) = Uri::try_from(format!("{scheme}://{authority}{pq}")) else {
            return Err((Failure::new(StatusCode::BAD_REQUEST, Retry::No), None));
        };
        *req.uri_mut() = uri;
        *req.version_mut() = Version::HTTP_2;
        let h = req.headers_mut();
        h.remove(header::HOST);
        h.remove(header::TRANSFER_ENCODING);
        h.remove(header::CONNECTION);
        if trailers {
            h.insert(header::TE, HeaderValue::from_static("trailers"));
        }
        let ready = tokio::time::timeout(self.cfg.connect_timeout, sender.ready()).await;
        if !matches!(ready, Ok(Ok(()))) {
            *self.h2.0[idx].borrow_mut() = None;
            return Err((
                Failure::new(StatusCode::BAD_GATEWAY, Retry::NextUpstream),
                Some(req),
            ));
        }
        let result = self
            .await_head(idx, sender.send_request(req), progress)
            .await
            .map_err(|timeout| (timeout, None))?;
        result.map_err(|e| {
            if let Some(c) = progress.client_error.get() {
                return (Failure::new(client_status(c), Retry::No), None);
            }
            tracing::warn!(upstream = %up.name, "upstream HTTP/2 request failed: {e}");
            (Failure::new(StatusCode::BAD_GATEWAY, Retry::No), None)
        })
    }
}
