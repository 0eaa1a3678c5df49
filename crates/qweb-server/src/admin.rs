//! The admin listener: `GET /metrics` in Prometheus text format. Plain HTTP/1.1, served by
//! worker 0; off unless `[admin]` is configured.

use std::convert::Infallible;
use std::rc::Rc;
use std::sync::Arc;

use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::body::{full, Body};
use crate::metrics::Registry;
use crate::response;

fn handle(req: &Request<Incoming>, registry: &Registry) -> Response<Body> {
    if req.uri().path() != "/metrics" {
        return response::status(StatusCode::NOT_FOUND);
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return response::method_not_allowed("GET, HEAD");
    }
    let mut r = Response::new(full(registry.render()));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}

/// Serves the admin listener until shutdown.
pub(crate) async fn serve(
    socket: TcpListener,
    registry: Arc<Registry>,
    mut shutdown: watch::Receiver<bool>,
) {
    let registry = Rc::new(registry);
    loop {
        let accepted = tokio::select! {
            r = socket.accept() => r,
            _ = shutdown.wait_for(|s| *s) => return,
        };
        let Ok((stream, _)) = accepted else { continue };
        let registry = registry.clone();
        tokio::task::spawn_local(async move {
            let svc = service_fn(move |req| {
                let r = handle(&req, &registry);
                async move { Ok::<_, Infallible>(r) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}
