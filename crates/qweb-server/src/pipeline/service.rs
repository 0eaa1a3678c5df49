//! The HTTP service of one connection: judges each request (request rules, path
//! normalisation), routes it to static files or the proxy, and wraps the response body for
//! the access log.

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Instant;

use http::{header, HeaderValue, Request, Response, StatusCode, Version};
use http_body::Body as _;
use qweb_http::request_body::RequestBody;

use crate::pipeline::ctx::WorkerCtx;
use crate::pipeline::routes::{Handler, Route};
use qweb_http::body::{Body, DrainAfter};
use qweb_http::path::PathError;
use qweb_http::request_rules;
use qweb_http::response;
use qweb_proxy::{ClientInfo, Target};
use qweb_session::logged::{AccessRecord, Logged};
use qweb_session::{ConnState, ReadAhead};

/// Per-connection service.
pub(crate) struct Service {
    worker: Rc<WorkerCtx>,
    conn: Rc<ConnState>,
    client: ClientInfo,
    /// The listener redirects every request.
    redirect: Option<Rc<crate::config::RedirectConfig>>,
    /// `Alt-Svc` of every response (the listener serves HTTP/3).
    alt_svc: Option<HeaderValue>,
}

impl Service {
    pub(crate) fn new(
        worker: Rc<WorkerCtx>,
        conn: Rc<ConnState>,
        tls: bool,
        _local: SocketAddr,
        redirect: Option<Rc<crate::config::RedirectConfig>>,
        alt_svc: Option<HeaderValue>,
    ) -> Self {
        let client = ClientInfo {
            addr: conn.peer,
            tls,
            conn: conn.clone(),
            tunnels: worker.tunnels.clone(),
            shutdown: worker.shutdown.clone(),
        };
        Service {
            worker,
            conn,
            client,
            redirect,
            alt_svc,
        }
    }

    /// Handles one request: the request rules, path normalisation, routing, then static files
    /// or the proxy; compression and the access log wrap the response.
    pub(crate) async fn handle(&self, mut req: Request<RequestBody>) -> Response<Logged> {
        let guard = self.conn.request_started_guard();
        self.worker
            .metrics
            .requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let start = Instant::now();
        let method = req.method().clone();
        let log_path = if self.worker.access_log {
            qweb_observe::access_log::escape(
                req.uri()
                    .path_and_query()
                    .map(|p| p.as_str())
                    .unwrap_or_else(|| req.uri().path()),
            )
        } else {
            String::new()
        };
        let version = req.version();
        let fields = self
            .worker
            .access_log
            .then(|| qweb_observe::access_log::RequestFields::of(&req));
        // Compression, part 1: negotiate, and map encoded ETags in If-None-Match.
        let negotiated =
            crate::pipeline::compress::begin(self.worker.compression.as_ref(), &mut req);
        // the route that serves the request (after rewrites) says which metrics count it
        let matched = std::cell::Cell::new(None);
        // The body travels apart: only the proxy takes it; what no handler took is drained
        // after an HTTP/2 response (see `DrainAfter`).
        let (parts, body) = req.into_parts();
        let mut body = Some(body);
        // static files say which file they are only when compression may look for it
        let identify = negotiated.as_ref().is_some_and(|n| n.wants_file());
        let resp = self
            .route(
                Request::from_parts(parts, ()),
                &mut body,
                &matched,
                identify,
            )
            .await;
        let route_metrics = matched
            .take()
            .unwrap_or_else(|| self.worker.unmatched.clone());
        // Compression, part 2: encode the response (or only mark it `Vary`).
        let mut resp =
            crate::pipeline::compress::finish(negotiated, resp, &ReadAhead::of(&self.conn));
        if let Some(body) = body.filter(|b| version == Version::HTTP_2 && !b.is_end_stream()) {
            resp = resp.map(|r| qweb_http::body::boxed(DrainAfter::new(r, body)));
        }
        // (`Server` and `Date` are the connection layer's: `qweb_http::response::SERVER`)
        if let Some(alt) = &self.alt_svc {
            resp.headers_mut().insert(header::ALT_SVC, alt.clone());
        }
        let record = AccessRecord {
            start,
            method,
            path: log_path,
            status: resp.status().as_u16(),
            log: self.worker.access_log,
            route: route_metrics,
            format: self.worker.log_format,
            fields,
            cache: resp
                .extensions()
                .get::<qweb_cache::CacheStatus>()
                .map(|c| c.word()),
        };
        let tunnel = resp
            .extensions_mut()
            .remove::<qweb_session::logged::TunnelTally>();
        resp.map(|b| Logged::new(b, record, guard, tunnel))
    }

    /// The answer to an ACME HTTP-01 challenge (`GET /.well-known/acme-challenge/TOKEN`
    /// while an order of this configuration waits for it), before any redirect or route.
    fn acme_answer<B>(&self, req: &Request<B>) -> Option<Response<Body>> {
        let managed = self.worker.acme.as_ref()?;
        if req.method() != http::Method::GET && req.method() != http::Method::HEAD {
            return None;
        }
        let answer = managed.http_answer(req.uri().path())?;
        tracing::info!(peer = %self.conn.peer, path = req.uri().path(), "answered an ACME HTTP-01 challenge");
        let mut r = Response::new(qweb_http::body::full(answer));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
        Some(r)
    }

    /// The answer to a request the request rules refused (`route`: the one its path would
    /// take, for a 405's `Allow`).
    fn refused(&self, refusal: &request_rules::Refusal, route: Option<&Route>) -> Response<Body> {
        tracing::debug!(peer = %self.conn.peer, "refused request: {}", refusal.reason);
        let mut r = response::status(refusal.status);
        if refusal.status == StatusCode::METHOD_NOT_ALLOWED {
            let allow = match route.map(|r| &r.handler) {
                Some(Handler::Proxy(_)) => PROXY_METHODS,
                _ => "GET, HEAD",
            };
            r.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static(allow));
        }
        if refusal.close {
            r.extensions_mut().insert(response::EndsConnection);
        }
        r
    }

    fn find_route<'a>(routes: &'a [Route], path: &str) -> Option<&'a Route> {
        routes
            .iter()
            .find(|r| qweb_http::path::covers(&r.prefix, path))
    }

    /// The route of the normalised `path`, refused (400) when a case-insensitive upstream
    /// would read the path as another route's (`/ADMIN/x` beside an `/admin` route and a
    /// proxy route `/` in front of IIS), or Windows would, dropping a segment's trailing dots
    /// and spaces (`/admin.`, `/admin%2e`, `/admin%20/x`): two hops must agree on which rules
    /// apply. Path parameters are already read as Tomcat reads them by
    /// [`covers`](qweb_http::path::covers).
    #[inline]
    fn route_of<'a>(routes: &'a [Route], path: &str) -> Result<Option<&'a Route>, PathError> {
        use qweb_http::path::{covers_as, windows_trims, Case};
        let route = Self::find_route(routes, path);
        let case = if windows_trims(path) {
            Case::Windows
        } else {
            Case::Folded
        };
        let folded = routes.iter().find(|r| covers_as(&r.prefix, path, case));
        match (route, folded) {
            (Some(a), Some(b)) if std::ptr::eq(a, b) => Ok(route),
            (None, None) => Ok(None),
            _ => Err(PathError::CaseAmbiguous),
        }
    }

    /// A static route's answer: the file (or `try_files`' first that is not a 404), or the
    /// directory's listing where `autoindex` is on and there is no index. `at`: the mount, the
    /// path beneath it and the whole normalised path.
    #[inline]
    fn serve_static(
        files: &crate::files::StaticFiles,
        route: &Route,
        req: &Request<()>,
        (mount, sub, path): (&str, &str, &str),
        ahead: &ReadAhead,
        identify: bool,
    ) -> Response<Body> {
        let r = if route.rules.try_files.is_empty() {
            files.serve(
                req.method(),
                req.headers(),
                mount,
                sub,
                req.uri().query(),
                ahead,
                identify,
            )
        } else {
            crate::pipeline::rewrite::try_files(
                files,
                &route.rules.try_files,
                req,
                mount,
                sub,
                ahead,
                identify,
            )
        };
        match r.status() {
            StatusCode::FORBIDDEN if route.rules.autoindex => files
                .listing(req.method(), sub, path, req.uri().query())
                .unwrap_or(r),
            _ => r,
        }
    }

    /// Do the site's and then the route's `allow`/`deny` admit the client (deny wins)?
    #[inline]
    fn admitted(&self, site: Option<&crate::pipeline::sites::Site>, route: Option<&Route>) -> bool {
        let ip = self.conn.peer.ip();
        site.is_none_or(|s| s.access.permits(ip))
            && route.is_none_or(|r| r.rules.access.permits(ip))
    }

    /// Phases 6 to 8 before the handler: the route's `rate_limit` (429), the site's and
    /// route's `allow`/`deny` (403, after routing, so that they see the route the path takes
    /// as an upstream reads it), then `basic_auth` (401, 503): the refusal, if any.
    async fn gate(
        &self,
        site: Option<&crate::pipeline::sites::Site>,
        route: Option<&Route>,
        headers: &http::HeaderMap,
        path: &str,
    ) -> Option<Response<Body>> {
        if let Some(r) = route.and_then(|r| self.rate_limited(r, headers)) {
            return Some(r);
        }
        if !self.admitted(site, route) {
            tracing::debug!(peer = %self.conn.peer, path = %path, "refused by allow/deny");
            return Some(response::status(StatusCode::FORBIDDEN));
        }
        let auth = crate::pipeline::auth::applying(site, route)?;
        let metrics = route.and_then(|r| r.auth.as_ref());
        let Err(r) = crate::pipeline::auth::check(auth, headers, metrics).await else {
            return None;
        };
        tracing::debug!(peer = %self.conn.peer, path = %path, status = r.status().as_u16(), "refused by basic_auth");
        Some(r)
    }

    /// The route's `forward_auth` on `req` (`path`: as routed): the service's refusal, if
    /// any; else the request goes on with the service's fields.
    async fn forward_auth(
        &self,
        route: &Route,
        req: &mut Request<()>,
        path: &str,
        authority: request_rules::Authority,
    ) -> Option<Response<Body>> {
        let (Some(auth), Some(proxy)) = (&route.rules.forward_auth, &route.forward_auth) else {
            return None;
        };
        let authority = request_rules::authority(req, authority);
        let authority = authority.as_ref();
        let uri = match req.uri().query() {
            Some(q) => format!("{path}?{q}"),
            None => path.to_owned(),
        };
        let asked =
            crate::pipeline::forward_auth::check(auth, proxy, req, &uri, authority, &self.client);
        Box::pin(asked).await
    }

    /// A proxy route's request as it goes upstream: `Authorization` removed when it was for
    /// qweb (`basic_auth` without `forward_authorization`), the site's and route's
    /// `request_headers` (with the client certificate's placeholders); the path and query to
    /// send (`sub` and the query, or the target as sent with `pass_raw_path`).
    fn upstream_request(
        &self,
        site: Option<&crate::pipeline::sites::Site>,
        route: &Route,
        proxy: &qweb_proxy::Proxy,
        req: &mut Request<()>,
        sub: &str,
    ) -> String {
        let auth = crate::pipeline::auth::applying(site, Some(route));
        if auth.is_some_and(|a| !a.forward_authorization) {
            req.headers_mut().remove(header::AUTHORIZATION);
        }
        let cert = self.conn.client_cert.get().map(|c| &**c);
        crate::pipeline::headers_rules::forward(site, route, cert, req.headers_mut());
        if proxy.pass_raw_path() {
            return req
                .uri()
                .path_and_query()
                .map(|p| p.as_str().to_owned())
                .unwrap_or_else(|| "/".to_owned());
        }
        match req.uri().query() {
            Some(q) => format!("{sub}?{q}"),
            None => sub.to_owned(),
        }
    }

    /// Phase 6, the route's `rate_limit`: the 429 to answer, if any.
    fn rate_limited(&self, route: &Route, headers: &http::HeaderMap) -> Option<Response<Body>> {
        let ip = self.conn.peer.ip();
        crate::pipeline::traffic::rate_limit(route, headers, ip, &self.worker.peer_log)
    }

    /// A `pass_raw_path` route forwards the target as sent: refused (400) unless the path as
    /// an upstream that decodes `%2F` and `%5C` understands it is routed to this same route
    /// (`/files/..%2fsecret` is `/secret` there, a path outside the route).
    fn raw_path_stays(routes: &[Route], route: &Route, raw: &str) -> Result<(), PathError> {
        let decoded = qweb_http::path::normalize_decoding_separators(raw)?;
        match Self::find_route(routes, &decoded) {
            Some(r) if std::ptr::eq(r, route) => Ok(()),
            _ => Err(PathError::Forbidden),
        }
    }

    /// The normalised path; encoded separators pass only on their way to a route that
    /// forwards the raw path.
    fn normalize(routes: &[Route], raw: &str) -> Result<String, PathError> {
        match qweb_http::path::normalize(raw) {
            Err(PathError::Forbidden) => {
                let lenient = qweb_http::path::normalize_keeping_separators(raw)?;
                match Self::find_route(routes, &lenient).map(|r| &r.handler) {
                    Some(Handler::Proxy(p)) if p.pass_raw_path() => Ok(lenient),
                    _ => Err(PathError::Forbidden),
                }
            }
            r => r,
        }
    }

    /// Routes `req` (its body in `body`, taken by the proxy); `matched` gets the `/metrics`
    /// handles of the route that serves it (none: refused before routing, or no route covers
    /// the path). `identify`: static files attach which file they are (for compression).
    async fn route(
        &self,
        mut req: Request<()>,
        body: &mut Option<RequestBody>,
        matched: &std::cell::Cell<Option<std::rc::Rc<qweb_observe::metrics::RouteMetrics>>>,
        identify: bool,
    ) -> Response<Body> {
        let ahead = ReadAhead::of(&self.conn);
        if let Some(status) = head_too_large(&req, self.worker.limits.max_request_header_size) {
            let mut r = response::status(status);
            r.extensions_mut().insert(response::EndsConnection);
            return r;
        }
        let checked = request_rules::check(&req);
        let site = self
            .worker
            .sites
            .select(crate::pipeline::sites::host_of(&req));
        let routes = self.worker.sites.routes(site, &self.worker.routes);
        let path = Self::normalize(routes, req.uri().path());
        let authority = match checked {
            Ok(a) => a,
            Err(refusal) => {
                let route = path.as_ref().ok().and_then(|p| Self::find_route(routes, p));
                return self.refused(&refusal, route);
            }
        };
        if let Some(answer) = self.acme_answer(&req) {
            return answer;
        }
        if let Some(sni) = self.conn.sni.get() {
            if self.worker.sites.misdirected(sni, site) {
                tracing::debug!(peer = %self.conn.peer, %sni, "misdirected request");
                return response::status(StatusCode::MISDIRECTED_REQUEST);
            }
        }
        let sni = self.conn.sni.get().map(|s| &**s);
        if let Some(rd) = &self.redirect {
            return crate::pipeline::rewrite::redirect(rd, &req, path.as_deref().ok(), sni);
        }
        // a site with its own client_auth is served only on handshakes that ran its policy
        // (a listener's redirect, above, gives nothing away)
        if self
            .worker
            .sites
            .policy_mismatch(self.conn.tls_policy_site.get(), site)
        {
            tracing::debug!(peer = %self.conn.peer, "request for a site under another client_auth policy");
            return response::status(StatusCode::MISDIRECTED_REQUEST);
        }
        let site_ref = self.worker.sites.get(site);
        let path = match path
            .and_then(|p| crate::pipeline::rewrite::rewrite(self.worker.sites.rewrites(site), p))
        {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(peer = %self.conn.peer, "refused path: {e:?}");
                return response::status(e.status());
            }
        };
        let route = match Self::route_of(routes, &path) {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(peer = %self.conn.peer, "refused path: {e:?}");
                return response::status(e.status());
            }
        };
        matched.set(route.map(|r| r.metrics.clone()));
        let pages = self.worker.sites.error_pages(site);
        // phases 6 to 8: rate limit, access rules, basic authentication
        if let Some(r) = self.gate(site_ref, route, req.headers(), &path).await {
            let mut r = crate::pipeline::error_pages::apply(pages, routes, req.method(), r, &ahead);
            crate::pipeline::headers_rules::respond(site_ref, route, &mut r);
            return r;
        }
        let Some(route) = route else {
            let r = response::status(StatusCode::NOT_FOUND);
            let mut r = crate::pipeline::error_pages::apply(pages, routes, req.method(), r, &ahead);
            crate::pipeline::headers_rules::respond(site_ref, None, &mut r);
            return r;
        };
        // phase 8, then the route's `forward_auth` service decides (its refusal is the
        // answer, as it sent it)
        if let Some(mut r) = self.forward_auth(route, &mut req, &path, authority).await {
            crate::pipeline::headers_rules::respond(site_ref, Some(route), &mut r);
            return r;
        }
        let (mount, sub) = qweb_http::path::split_prefix(&route.prefix, route.strip_prefix, &path)
            .unwrap_or(("", path.as_str()));
        let method = req.method().clone();
        let resp = match &route.handler {
            Handler::Redirect(rd) => crate::pipeline::rewrite::redirect(rd, &req, Some(&path), sni),
            Handler::Static(_) if !mount.is_empty() && path == mount => {
                // `/static` -> `/static/`, so relative links resolve under the mount
                crate::files::redirect_to_dir(&path, req.uri().query())
            }
            Handler::Static(files) => {
                Self::serve_static(files, route, &req, (mount, sub, &path), &ahead, identify)
            }
            Handler::Proxy(proxy) => {
                if proxy.pass_raw_path() {
                    if let Err(e) = Self::raw_path_stays(routes, route, req.uri().path()) {
                        tracing::debug!(peer = %self.conn.peer, "refused raw path: {e:?}");
                        return response::status(e.status());
                    }
                }
                // (the authority as the client named it, before `request_headers`)
                let authority = request_rules::authority(&req, authority);
                let pq = self.upstream_request(site_ref, route, proxy, &mut req, sub);
                let target = Target {
                    path_and_query: &pq,
                    authority: authority.as_ref(),
                };
                // Boxed: the proxy's future is most of a request's state; inline, every
                // request's future (moved into its box by hyper's service call) would carry
                // its size, static files included (measured: ~11 000 instructions of memcpy
                // per 1 KiB static request).
                let Some(body) = body.take() else {
                    return response::status(StatusCode::INTERNAL_SERVER_ERROR);
                };
                let req = req.map(|()| body);
                if route.cached {
                    // phases 9 and 12: lookup, then the fill around the proxy
                    let normalised = (!proxy.pass_raw_path()).then_some(path.as_str());
                    self.cached_proxy(proxy, req, &pq, authority.as_ref(), normalised)
                        .await
                } else {
                    Box::pin(proxy.forward(req, &target, &self.client)).await
                }
            }
        };
        let mut resp = crate::pipeline::error_pages::apply(pages, routes, &method, resp, &ahead);
        crate::pipeline::headers_rules::charset(site_ref, route, &mut resp);
        if matches!(route.handler, Handler::Static(_)) {
            crate::pipeline::headers_rules::expires(&route.rules, &mut resp);
        }
        crate::pipeline::headers_rules::respond(site_ref, Some(route), &mut resp);
        resp
    }
}

impl Service {
    /// A cached proxy route's request: the cache's lookup and fill around the proxy
    /// (`pipeline/cache.rs`). `pq`: the path and query forwarded; `normalised`: the path the
    /// key holds (`None`: the raw path, for `pass_raw_path`).
    async fn cached_proxy(
        &self,
        proxy: &Rc<qweb_proxy::Proxy>,
        req: Request<RequestBody>,
        pq: &str,
        authority: Option<&HeaderValue>,
        normalised: Option<&str>,
    ) -> Response<Body> {
        let key = crate::pipeline::cache::key(
            self.client.tls,
            authority.and_then(|a| a.to_str().ok()),
            normalised.unwrap_or(req.uri().path()),
            req.uri().query(),
        );
        let target = Target {
            path_and_query: pq,
            authority,
        };
        let forward = |r| proxy.forward(r, &target, &self.client);
        let background = || -> crate::pipeline::cache::Background {
            let (proxy, pq) = (proxy.clone(), pq.to_owned());
            let authority = authority.cloned();
            let client = ClientInfo {
                addr: self.client.addr,
                tls: self.client.tls,
                conn: self.client.conn.clone(),
                tunnels: self.client.tunnels.clone(),
                shutdown: self.client.shutdown.clone(),
            };
            Box::new(move |r| {
                Box::pin(async move {
                    let target = Target {
                        path_and_query: &pq,
                        authority: authority.as_ref(),
                    };
                    proxy.forward(r, &target, &client).await
                })
            })
        };
        Box::pin(crate::pipeline::cache::serve(
            &self.worker.cache,
            key,
            req,
            forward,
            background,
        ))
        .await
    }
}

impl crate::conn::Handle for Service {
    async fn call(self: Rc<Self>, req: Request<RequestBody>) -> Response<Logged> {
        self.handle(req).await
    }
}

/// 414 when the request target alone is over `limit`, 431 when the header fields are (the
/// request line and fields as sent on HTTP/1; HPACK-decoded sizes on HTTP/2).
fn head_too_large<B>(req: &Request<B>, limit: usize) -> Option<StatusCode> {
    let target = req
        .uri()
        .path_and_query()
        .map_or(req.uri().path().len(), |p| p.as_str().len());
    if target > limit {
        return Some(StatusCode::URI_TOO_LONG);
    }
    let fields: usize = req
        .headers()
        .iter()
        .map(|(n, v)| n.as_str().len() + v.len() + 4)
        .sum();
    (target + fields > limit).then_some(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
}

/// What a proxy route answers in `Allow` (CONNECT and TRACE are never forwarded).
const PROXY_METHODS: &str = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS";
