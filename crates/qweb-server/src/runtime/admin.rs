//! The admin listener: `GET /metrics` in the OpenMetrics text format, `/status.json` (the same
//! counters summed for people, `qweb_observe::status`) and `/status` (an HTML page that
//! shows them live, `crate::runtime::status_page`). Plain HTTP/1.1, on its own thread; off
//! unless `[admin]` is configured. Only GET and HEAD (405 otherwise); every answer says
//! `Cache-Control: no-store`. At most [`MAX_CONNECTIONS`] connections, each
//! living at most [`CONNECTION_LIFETIME`].

use std::convert::Infallible;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::runtime::status_page::PAGE;
use qweb_http::body::{full, Body};
use qweb_http::response;
use qweb_observe::metrics::Metrics;

/// Longest life of one admin connection (a scrape takes milliseconds): an idle or slow client
/// cannot hold the connection's fd.
pub(crate) const CONNECTION_LIFETIME: Duration = Duration::from_secs(10);
/// How long an answer in progress at [`CONNECTION_LIFETIME`] may go on before its connection
/// is closed.
pub(crate) const LIFETIME_GRACE: Duration = Duration::from_secs(1);
/// Admin connections served at once; more are closed at once.
pub(crate) const MAX_CONNECTIONS: usize = 64;

fn handle(req: &Request<Incoming>, registry: &Metrics) -> Response<Body> {
    // the path alone: a query string changes nothing
    let path = req.uri().path();
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
            let doc = qweb_observe::status::document(&registry.render(), now);
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

/// Runs the admin listener on the calling thread until shutdown.
pub(crate) fn run(
    socket: std::net::TcpListener,
    registry: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
) {
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
            Ok(socket) => serve(socket, registry, shutdown).await,
            Err(e) => tracing::error!("admin listener: {e}"),
        }
    });
}

/// Serves the admin listener until shutdown.
async fn serve(socket: TcpListener, registry: Arc<Metrics>, mut shutdown: watch::Receiver<bool>) {
    let registry = Rc::new(registry);
    let open = Rc::new(std::cell::Cell::new(0usize));
    let errors = qweb_observe::log_limit::Every::new(Duration::from_secs(1));
    let addr = socket.local_addr().ok();
    let reserve = Rc::new(std::cell::RefCell::new(
        crate::runtime::fd_limit::FdReserve::new(),
    ));
    loop {
        let accepted = tokio::select! {
            r = socket.accept() => r,
            _ = shutdown.wait_for(|s| *s) => return,
        };
        let (stream, reserved) = match accepted {
            Ok((stream, _)) => (stream, false),
            Err(e) => {
                if let Some(suppressed) = errors.hit() {
                    tracing::error!(listener = ?addr, suppressed, "admin listener: accept failed: {e}");
                }
                // Out of fds (the workers' connections took them all): the reserve's fd is
                // given back and a scrape served in its place, one at a time.
                let retry =
                    crate::runtime::fd_limit::out_of_fds(&e) && reserve.borrow_mut().release();
                let got = match retry {
                    true => socket.accept().now_or_never().and_then(Result::ok),
                    false => None,
                };
                match got {
                    Some((stream, _)) => (stream, true),
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
        if open.get() >= MAX_CONNECTIONS {
            drop(stream);
            if reserved {
                reserve.borrow_mut().restore();
            }
            continue;
        }
        open.set(open.get() + 1);
        let (registry, open, reserve) = (registry.clone(), open.clone(), reserve.clone());
        tokio::task::spawn_local(async move {
            let svc = service_fn(move |req| {
                let r = handle(&req, &registry);
                async move { Ok::<_, Infallible>(r) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc);
            let mut conn = std::pin::pin!(conn);
            if tokio::time::timeout(CONNECTION_LIFETIME, conn.as_mut())
                .await
                .is_err()
            {
                // A keep-alive connection (the status page polls on one): the answer being
                // written may end, then it closes, so the page sees no failed fetch.
                conn.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout(LIFETIME_GRACE, conn).await;
            }
            open.set(open.get() - 1);
            if reserved {
                reserve.borrow_mut().restore();
            }
        });
    }
}
