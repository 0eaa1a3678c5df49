//! What the drivers' tests over in-memory I/O share: the transport (tokio's `DuplexStream`,
//! no socket), the worker as a [`Host`], and a small service as a [`Handle`]. The drivers,
//! the codecs and the session under test are the real ones.

use std::cell::RefCell;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::BodyExt;
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};
use tokio::sync::watch;

use super::idle::ReadReady;
use super::{Handle, Host, Tracked};
use crate::config::{AccessFormat, Limits};
use qweb_http::body::{full, Body};
use qweb_http::request_body::RequestBody;
use qweb_observe::log_limit::PerPeer;
use qweb_observe::metrics::{RouteMetrics, WorkerMetrics};
use qweb_session::logged::{AccessRecord, Logged};
use qweb_session::tunnel::Tunnels;
use qweb_session::ConnState;

/// The server's end of the connection: a duplex stream, always "readable" (a parked
/// connection's wait for readiness then goes straight to its read, which waits).
pub(super) struct Mock(pub(super) DuplexStream);

impl AsyncRead for Mock {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Mock {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl ReadReady for Mock {
    fn poll_read_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn unsent(&self) -> usize {
        0
    }
    fn socket_fd(&self) -> std::os::fd::RawFd {
        -1
    }
}

/// The worker, as the driver sees it.
pub(super) struct TestHost {
    pub(super) limits: Limits,
    pub(super) metrics: WorkerMetrics,
    pub(super) peer_log: PerPeer,
    pub(super) shutdown: watch::Sender<bool>,
    pub(super) retire: watch::Sender<bool>,
    pub(super) tunnels: Rc<Tunnels>,
    pub(super) client_slots: std::sync::Arc<qweb_session::client_slots::ClientSlots>,
}

impl Host for TestHost {
    fn limits(&self) -> &Limits {
        &self.limits
    }
    fn metrics(&self) -> &WorkerMetrics {
        &self.metrics
    }
    fn peer_log(&self) -> &PerPeer {
        &self.peer_log
    }
    fn shutdown(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }
    fn retired(&self) -> watch::Receiver<bool> {
        self.retire.subscribe()
    }
    fn refused_log(&self) -> Option<AccessFormat> {
        None
    }
    fn tunnels(&self) -> &Rc<Tunnels> {
        &self.tunnels
    }
    fn client_slots(&self) -> &std::sync::Arc<qweb_session::client_slots::ClientSlots> {
        &self.client_slots
    }
}

/// Answers by path: `/echo` reads the body and answers its length; `/early` answers without
/// reading it; `/stream` streams three chunks of unknown length; `/ends` is a refusal that
/// ends the connection; `/slow` answers after 5 s; `/big` is 1 MiB in one piece, `/bigstream`
/// 1 MiB in 16 KiB chunks; anything else `hello`.
pub(super) struct Svc {
    pub(super) state: Rc<ConnState>,
    /// The paths of the requests it was called for.
    pub(super) seen: RefCell<Vec<String>>,
}

impl Handle for Svc {
    async fn call(self: Rc<Self>, req: Request<RequestBody>) -> Response<Logged> {
        {
            let guard = self.state.request_started_guard();
            let (parts, body) = req.into_parts();
            let path = parts.uri.path().to_owned();
            self.seen.borrow_mut().push(path.clone());
            let mut r: Response<Body> = match path.as_str() {
                "/echo" => {
                    let n = match body.collect().await {
                        Ok(b) => b.to_bytes().len().to_string(),
                        Err(e) => format!("body error: {e}"),
                    };
                    Response::new(full(n))
                }
                "/stream" => {
                    let chunks = ["one ", "two ", "three"]
                        .map(|c| Ok::<_, qweb_http::body::BoxError>(Frame::data(Bytes::from(c))));
                    Response::new(qweb_http::body::boxed(http_body_util::StreamBody::new(
                        futures_util::stream::iter(chunks),
                    )))
                }
                "/ends" => {
                    let mut r = qweb_http::response::status(StatusCode::BAD_REQUEST);
                    r.extensions_mut()
                        .insert(qweb_http::response::EndsConnection);
                    r
                }
                "/slow" => {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    Response::new(full("slow"))
                }
                "/big" => Response::new(full(vec![b'x'; 1 << 20])),
                "/bigstream" => {
                    let chunks = (0..64).map(|_| {
                        Ok::<_, qweb_http::body::BoxError>(Frame::data(Bytes::from(vec![
                            b'y';
                            16 << 10
                        ])))
                    });
                    Response::new(qweb_http::body::boxed(http_body_util::StreamBody::new(
                        futures_util::stream::iter(chunks),
                    )))
                }
                _ => Response::new(full("hello")),
            };
            r.headers_mut()
                .insert("x-path", path.parse().expect("a path is a field value"));
            let record = AccessRecord {
                start: std::time::Instant::now(),
                method: parts.method,
                path,
                status: r.status().as_u16(),
                log: false,
                route: Rc::new(RouteMetrics::unregistered()),
                format: AccessFormat::default(),
                fields: None,
                cache: None,
            };
            r.map(|b| Logged::new(b, record, guard, None))
        }
    }
}

impl Svc {
    /// The service of the connection `state`.
    pub(super) fn new(state: Rc<ConnState>) -> Self {
        Svc {
            state,
            seen: RefCell::default(),
        }
    }
}

/// A worker as the drivers see it, with `limits`.
pub(super) fn host(limits: Limits) -> Rc<TestHost> {
    Rc::new(TestHost {
        limits,
        metrics: WorkerMetrics::default(),
        peer_log: PerPeer::new(Duration::from_secs(1)),
        shutdown: watch::channel(false).0,
        retire: watch::channel(false).0,
        tunnels: Rc::new(Tunnels::default()),
        client_slots: Default::default(),
    })
}

/// A connection's parts: the worker, the connection's state, its service and the driver's
/// end of the transport (`pipe`: bytes each direction holds); the client's end comes back.
pub(super) struct Parts {
    pub(super) host: Rc<TestHost>,
    pub(super) state: Rc<ConnState>,
    pub(super) svc: Rc<Svc>,
    pub(super) io: Box<Tracked<Mock>>,
}

/// New parts and the client's end of the transport.
pub(super) fn parts(limits: Limits, pipe: usize) -> (Parts, DuplexStream) {
    let (client, server) = tokio::io::duplex(pipe);
    let host = host(limits);
    let state = Rc::new(ConnState::new(([127, 0, 0, 1], 4000).into()));
    let svc = Rc::new(Svc::new(state.clone()));
    let io = Box::new(Tracked::new(Mock(server), &state, 256 << 10));
    (
        Parts {
            host,
            state,
            svc,
            io,
        },
        client,
    )
}

/// Runs `f` in a `LocalSet` (the drivers are `!Send`, as on a worker).
pub(super) async fn local<F: std::future::Future>(f: F) -> F::Output {
    tokio::task::LocalSet::new().run_until(f).await
}
