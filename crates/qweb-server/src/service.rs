//! The HTTP service of one connection: routes each request to static files or the proxy and
//! wraps the response body for the access log.

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Instant;

use http::{header, HeaderValue, Request, Response};
use hyper::body::Incoming;

use crate::body::{AccessRecord, Logged};
use crate::conn_state::ConnState;
use crate::proxy::ClientInfo;
use crate::worker::{Handler, WorkerCtx};

/// Per-connection service.
pub(crate) struct Service {
    worker: Rc<WorkerCtx>,
    conn: Rc<ConnState>,
    client: ClientInfo,
}

/// Does `prefix` cover `path`? `/api` covers `/api` and `/api/...`, not `/apix`.
fn covers(prefix: &str, path: &str) -> bool {
    prefix == "/"
        || (path.starts_with(prefix)
            && matches!(path.as_bytes().get(prefix.len()), None | Some(b'/')))
}

impl Service {
    pub(crate) fn new(
        worker: Rc<WorkerCtx>,
        conn: Rc<ConnState>,
        tls: bool,
        _local: SocketAddr,
    ) -> Self {
        let client = ClientInfo {
            addr: conn.peer,
            tls,
        };
        Service {
            worker,
            conn,
            client,
        }
    }

    /// Handles one request.
    pub(crate) async fn handle(&self, mut req: Request<Incoming>) -> Response<Logged> {
        let guard = self.conn.request_started_guard();
        self.worker
            .metrics
            .requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let start = Instant::now();
        let method = req.method().clone();
        let path = req.uri().path().to_owned();
        let log_path = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_else(|| path.clone());
        // Compression, part 1: negotiate, and map encoded ETags in If-None-Match.
        let negotiated = crate::compress::begin(self.worker.compression.as_ref(), &mut req);
        let route = self.worker.routes.iter().find(|r| covers(&r.prefix, &path));
        let resp = match route {
            None => crate::response::status(http::StatusCode::NOT_FOUND),
            Some(route) => {
                let sub = if route.strip_prefix && route.prefix != "/" {
                    let rest = &path[route.prefix.len()..];
                    if rest.is_empty() {
                        "/".to_owned()
                    } else {
                        rest.to_owned()
                    }
                } else {
                    path.clone()
                };
                match &route.handler {
                    Handler::Static(_)
                        if route.strip_prefix && path == route.prefix && route.prefix != "/" =>
                    {
                        // `/static` -> `/static/`, so relative links resolve under the mount
                        crate::files::redirect_to_dir(&path, req.uri().query())
                    }
                    Handler::Static(files) => {
                        let mount = if route.strip_prefix && route.prefix != "/" {
                            route.prefix.as_str()
                        } else {
                            ""
                        };
                        files.serve(req.method(), req.headers(), mount, &sub, req.uri().query())
                    }
                    Handler::Proxy(proxy) => {
                        let pq = match req.uri().query() {
                            Some(q) => format!("{sub}?{q}"),
                            None => sub,
                        };
                        proxy.forward(req, &pq, &self.client).await
                    }
                }
            }
        };
        // Compression, part 2: encode the response (or only mark it `Vary`).
        let mut resp = crate::compress::finish(negotiated, resp);
        resp.headers_mut()
            .entry(header::SERVER)
            .or_insert(HeaderValue::from_static("qweb"));
        let record = AccessRecord {
            start,
            method,
            path: log_path,
            status: resp.status().as_u16(),
            log: self.worker.access_log,
        };
        resp.map(|b| Logged::new(b, record, guard))
    }
}

#[cfg(test)]
mod tests {
    use super::covers;

    #[test]
    fn prefix_covers_segments() {
        assert!(covers("/", "/anything"));
        assert!(covers("/api", "/api"));
        assert!(covers("/api", "/api/x"));
        assert!(!covers("/api", "/apix"));
        assert!(!covers("/api", "/"));
    }
}
