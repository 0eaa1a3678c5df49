//! The proxy cache's phases (issue 38; docs/ARCHITECTURE.md, "The pipeline's phases"):
//! *lookup* (phase 9: after routing and the access rules, so nothing stored is served to a
//! client that may not see it) and *fill* (phase 12: the origin's response teed into the
//! store while it streams to the client). The policy and the store are the qweb-cache
//! crate's; this module holds what needs the request: the key, the client's conditionals,
//! the revalidation request, the stored response rebuilt as an answer, and `Cache-Status`.
//!
//! The fill stores the upstream's response as it comes from the proxy, before compression
//! (phase 11 runs around the route and encodes a hit as it encodes a miss): a stored object
//! per encoding is not done yet.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use qweb_cache::directives::{Directives, Seconds};
use qweb_cache::{policy, CacheStatus, Entry, Fill, FillBody, Pending, Reuse, Store};
use qweb_http::body::Body;
use qweb_http::request_body::RequestBody;

use super::cache_head::{bodiless, head, mark, to_not_modified, Conditionals};
use crate::files::range::RangeRequest;

/// What a worker's cached routes share: the server's store and how long a collapsed miss
/// waits.
pub(crate) struct CacheCtx {
    pub store: Arc<Store>,
    pub collapse_timeout: Duration,
}

/// The store's limits of a `[cache]`.
pub(crate) fn limits(c: &crate::config::CacheConfig) -> qweb_cache::Limits {
    let size = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
    qweb_cache::Limits::new(size(c.memory), size(c.max_object_size)).with_disk(c.disk)
}

/// The server's store of `config`: memory, and the disk tier in `[cache] path` (its index
/// rebuilt from the entry files there: called at start, before the workers run). A reload
/// keeps it and changes only its limits ([`limits`]); a new `path`, or a disk tier turned on
/// from `disk = "0"`, needs a restart.
pub(crate) fn open_store(config: &crate::config::Config) -> Arc<Store> {
    let dir = config.cache.disk_path(&config.state_dir);
    Store::open(limits(&config.cache), &dir)
}

/// The store's counters on `/metrics` (`qweb_proxy_cache_*`).
pub(crate) struct Collector(pub Arc<Store>);

impl std::fmt::Debug for Collector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("proxy cache collector")
    }
}

impl prometheus_client::collector::Collector for Collector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> std::fmt::Result {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        let s = self.0.stats();
        let counters = [
            ("qweb_proxy_cache_hits", "Requests of cached routes answered from the store without the upstream.", &s.hits),
            ("qweb_proxy_cache_misses", "Requests of cached routes that went to the upstream (nothing usable stored, or a revalidation).", &s.misses),
            ("qweb_proxy_cache_stale", "Stale stored responses served (allowed by the request, or stale-if-error).", &s.stale),
            ("qweb_proxy_cache_revalidated", "Stored responses the upstream confirmed with a 304.", &s.revalidated),
            ("qweb_proxy_cache_collapsed", "Requests that waited for another request's fill of the same key.", &s.collapsed),
            ("qweb_proxy_cache_bypass", "Requests of cached routes the cache does not take (methods other than GET and HEAD, upgrades).", &s.bypass),
            ("qweb_proxy_cache_stored", "Responses stored.", &s.stored),
            ("qweb_proxy_cache_too_large", "Storable responses not stored because their body is over cache.max_object_size.", &s.too_large),
            ("qweb_proxy_cache_abandoned", "Fills given up before the body's end (client gone, upstream error, short body).", &s.abandoned),
            ("qweb_proxy_cache_evictions", "Stored responses evicted to stay within cache.memory.", &s.evictions),
            ("qweb_proxy_cache_one_hit_evictions", "Of the evictions, responses that left the S3-FIFO small queue never hit since they were stored (one-hit wonders kept out of the main queue).", &s.one_hit_evictions),
            ("qweb_proxy_cache_invalidations", "Stored responses removed by unsafe methods, purges and replacements.", &s.invalidated),
            ("qweb_proxy_cache_superseded", "Fills not stored because their key was purged or invalidated while they were in flight.", &s.superseded),
            ("qweb_proxy_cache_disk_hits", "Requests answered from the disk tier (the entry read, checked and promoted to memory).", &s.disk_hits),
            ("qweb_proxy_cache_disk_stored", "Entries written to the disk tier.", &s.disk_stored),
            ("qweb_proxy_cache_disk_skipped", "Disk writes skipped because the disk writer's queue was full (the response stays in memory only).", &s.disk_skipped),
            ("qweb_proxy_cache_disk_dropped", "Disk entries removed and never served: corrupt, truncated or of another format version.", &s.disk_dropped),
            ("qweb_proxy_cache_disk_errors", "Disk tier errors (folder not made or read, a write, read or removal failed); the response is served and stays in memory only.", &s.disk_errors),
            ("qweb_proxy_cache_disk_evictions", "Disk entries evicted to stay within cache.disk.", &s.disk_evictions),
        ];
        for (name, help, v) in counters {
            let c = ConstCounter::new(v.load(Relaxed));
            c.encode(encoder.encode_descriptor(name, help, None, c.metric_type())?)?;
        }
        let gauges = [
            ("qweb_proxy_cache_objects", "Responses held in the proxy cache's memory store.", &s.objects),
            ("qweb_proxy_cache_bytes", "Bytes held in the proxy cache's memory store (bodies, fields, a fixed overhead per entry).", &s.bytes),
            ("qweb_proxy_cache_disk_objects", "Responses held in the proxy cache's disk tier.", &s.disk_objects),
            ("qweb_proxy_cache_disk_bytes", "Bytes of entry files in the proxy cache's disk tier (headers and bodies).", &s.disk_bytes),
        ];
        for (name, help, v) in gauges {
            let g = ConstGauge::new(i64::try_from(v.load(Relaxed)).unwrap_or(i64::MAX));
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        Ok(())
    }
}

/// A forward the cache starts on its own once the client was answered (a revalidation in
/// the background, RFC 5861's `stale-while-revalidate`): it owns what it needs.
pub(crate) type Background =
    Box<dyn FnOnce(Request<RequestBody>) -> Pin<Box<dyn Future<Output = Response<Body>>>>>;

/// The cache key of a request: its absolute URL as qweb routes it (`scheme://authority`
/// and the normalised path and query), which is also what a purge names.
pub(crate) fn key(tls: bool, authority: Option<&str>, path: &str, query: Option<&str>) -> String {
    let scheme = if tls { "https" } else { "http" };
    let authority = authority.unwrap_or("").to_ascii_lowercase();
    match query {
        Some(q) => format!("{scheme}://{authority}{path}?{q}"),
        None => format!("{scheme}://{authority}{path}"),
    }
}

/// The key a `Location` or `Content-Location` value names when it is on the same origin
/// as `key` (RFC 9111 section 4.4): a path, or an absolute URL with the same scheme and
/// authority.
fn same_origin_key(key: &str, value: &HeaderValue) -> Option<String> {
    let v = value.to_str().ok()?.trim();
    let origin_end = key.find("://").map(|i| i + 3)?;
    let origin = &key[..origin_end
        + key[origin_end..]
            .find('/')
            .unwrap_or(key.len() - origin_end)];
    if v.starts_with('/') && !v.starts_with("//") {
        return Some(format!("{origin}{v}"));
    }
    let lower = v.to_ascii_lowercase();
    (lower.starts_with(&origin.to_ascii_lowercase()) && v[origin.len()..].starts_with('/'))
        .then(|| format!("{origin}{}", &v[origin.len()..]))
}

/// Methods that leave the origin's state unchanged (RFC 9110 section 9.2.1): no
/// invalidation.
fn safe(m: &Method) -> bool {
    matches!(
        *m,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    )
}

/// Answers `req` on a cached route: from the store when RFC 9111 allows it, else through
/// `forward` (the proxy), revalidating a stale stored response, and storing what may be
/// stored while it streams to the client.
///
/// `background` makes the forward of a revalidation in the background, when a stale
/// response is served within its `stale-while-revalidate`.
pub(crate) async fn serve<F, Fut>(
    cache: &CacheCtx,
    key: String,
    mut req: Request<RequestBody>,
    forward: F,
    background: impl FnOnce() -> Background,
) -> Response<Body>
where
    F: FnOnce(Request<RequestBody>) -> Fut,
    Fut: Future<Output = Response<Body>>,
{
    let store = &cache.store;
    let stats = store.stats();
    let method = req.method().clone();
    let cacheable = matches!(method, Method::GET | Method::HEAD)
        && !req.headers().contains_key(header::UPGRADE);
    if !cacheable {
        return bypass(store, &key, req, forward).await;
    }
    // Phase 9, lookup: a stored response the request may take, else lead or join the fill.
    let (stored, mut guard) = match lookup(cache, &key, &req, background).await {
        Lookup::Answered(r) => return r,
        Lookup::Forward { stored, guard } => (stored, guard),
    };
    stats.misses.fetch_add(1, Relaxed);
    // Phase 10 through the proxy: a revalidation carries the stored validators instead of
    // the client's, which qweb then answers itself.
    let req_headers = req.headers().clone();
    let validators = stored
        .as_ref()
        .filter(|e| e.meta.etag().is_some() || e.meta.last_modified().is_some());
    let client_cond = match validators {
        Some(e) => {
            let c = Conditionals::take(req.headers_mut());
            let h = req.headers_mut();
            if let Some(etag) = e.meta.etag() {
                h.insert(header::IF_NONE_MATCH, etag.clone());
            }
            if let Some(lm) = e.meta.last_modified() {
                h.insert(header::IF_MODIFIED_SINCE, lm.clone());
            }
            Some(c)
        }
        None => None,
    };
    // a Surrogate-Control member may target qweb (W3C Edge Architecture)
    req.headers_mut().insert(
        HeaderName::from_static("surrogate-capability"),
        HeaderValue::from_static("qweb=\"Surrogate/1.0\""),
    );
    let request_time = SystemTime::now();
    let epoch = store.epoch();
    let resp = forward(req).await;
    let response_time = SystemTime::now();

    if let Some(e) = &stored {
        // Phase 12 for a revalidation: a 304 about the stored response updates it.
        // (one stored response was validated: a 304 to its validators is about it, even
        // with another ETag, which is then not taken: RFC 9111 section 3.2 keeps it)
        if resp.status() == StatusCode::NOT_MODIFIED && validators.is_some() {
            let mut meta = e.meta.clone();
            meta.update(resp.headers(), request_time, response_time);
            let keep = policy::storable(&Method::GET, &req_headers, meta.status, &meta.headers);
            let fresh = if keep.is_ok() {
                store.update(&key, e, meta)
            } else {
                store.invalidate(&key);
                Arc::new(Entry::reusing(meta, e))
            };
            stats.revalidated.fetch_add(1, Relaxed);
            let status = CacheStatus::Revalidated {
                status: StatusCode::NOT_MODIFIED,
                stored: keep.is_ok(),
            };
            let req = Request::from_parts(parts_of(&method, req_headers), ());
            let mut r = answer(&fresh, &req, response_time, status);
            if let Some(c) = &client_cond {
                not_modified_if(c, &mut r);
            }
            return r;
        }
        if resp.status().is_server_error() && stale_if_error(e, &req_headers, response_time) {
            stats.stale.fetch_add(1, Relaxed);
            let req = Request::from_parts(parts_of(&method, req_headers), ());
            return answer(e, &req, response_time, CacheStatus::Stale);
        }
    }

    // Phase 12, fill: a storable full response is teed into the store.
    let (parts, body) = resp.into_parts();
    let verdict = policy::storable(&method, &req_headers, parts.status, &parts.headers);
    let length = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let fits = length.is_none_or(|l| l <= store.limits().max_object_size as u64);
    if !fits && verdict.is_ok() {
        stats.too_large.fetch_add(1, Relaxed);
    }
    let stores = verdict.is_ok() && fits;
    if let (Some(e), false, false) = (&stored, stores, parts.status.is_server_error()) {
        // the origin's new response replaces the stored one even when it is not stored
        // (a stored one replaces it by its `Vary` values)
        store.remove_entry(&key, e);
    }
    let status = match &stored {
        Some(_) => CacheStatus::Revalidated {
            status: parts.status,
            stored: stores,
        },
        None => CacheStatus::Miss { stored: stores },
    };
    let bodiless = method == Method::HEAD
        || parts.status == StatusCode::NO_CONTENT
        || parts.status == StatusCode::NOT_MODIFIED;
    let body = if stores {
        let meta = policy::Meta::new(
            parts.status,
            &parts.headers,
            &req_headers,
            request_time,
            response_time,
        );
        if bodiless {
            // no body to tee (a driver does not poll one for 204): stored as the head comes
            store.insert(&key, Entry::new(meta, bytes::Bytes::new()));
            body
        } else {
            let pending = Pending::new(store.clone(), key, meta, length, epoch, guard.take());
            super::collapse::fill(body, pending, length.is_some())
        }
    } else {
        tracing::trace!(%key, "not stored: {verdict:?}");
        body
    };
    drop(guard);
    let mut r = Response::from_parts(parts, body);
    mark(&mut r, status);
    if let Some(c) = &client_cond {
        not_modified_if(c, &mut r);
    }
    r
}

/// A request the cache does not take (a method other than GET and HEAD, an upgrade): on to
/// the upstream; an unsafe method's success removes what is stored for its URL and for its
/// `Location` and `Content-Location` on the same origin.
async fn bypass<F, Fut>(
    store: &Store,
    key: &str,
    req: Request<RequestBody>,
    forward: F,
) -> Response<Body>
where
    F: FnOnce(Request<RequestBody>) -> Fut,
    Fut: Future<Output = Response<Body>>,
{
    store.stats().bypass.fetch_add(1, Relaxed);
    let method = req.method().clone();
    let mut resp = forward(req).await;
    if !safe(&method) && (resp.status().is_success() || resp.status().is_redirection()) {
        let mut n = store.invalidate(key);
        for name in [header::LOCATION, header::CONTENT_LOCATION] {
            if let Some(k) = resp
                .headers()
                .get(&name)
                .and_then(|v| same_origin_key(key, v))
            {
                n += store.invalidate(&k);
            }
        }
        tracing::debug!(%key, removed = n, "invalidated by {method}");
    }
    mark(&mut resp, CacheStatus::Bypass);
    resp
}

/// What the lookup found: an answer, or a forward (with the stale stored response to
/// revalidate, and the fill guard when this request leads the fill).
enum Lookup {
    Answered(Response<Body>),
    Forward {
        stored: Option<Arc<Entry>>,
        guard: Option<qweb_cache::FillGuard>,
    },
}

/// Phase 9: a stored response `req` may take (fresh, stale where allowed, stale while it
/// is revalidated in the background), else this request leads the key's fill or waits for
/// the one in flight (collapsed misses), then looks once more.
async fn lookup(
    cache: &CacheCtx,
    key: &str,
    req: &Request<RequestBody>,
    background: impl FnOnce() -> Background,
) -> Lookup {
    let store = &cache.store;
    let stats = store.stats();
    let mut waited = false;
    loop {
        let mut found = store.lookup(key, req.headers());
        if found.is_none() {
            // the disk tier: read in a blocking task, checked, promoted to memory
            found = store.lookup_disk(key, req.headers()).await;
        }
        let now = SystemTime::now();
        if let Some(e) = &found {
            match policy::reuse(&e.meta, req.headers(), now) {
                Reuse::Fresh => {
                    stats.hits.fetch_add(1, Relaxed);
                    return Lookup::Answered(answer(
                        e,
                        req,
                        now,
                        CacheStatus::Hit { collapsed: waited },
                    ));
                }
                Reuse::StaleAllowed => {
                    stats.stale.fetch_add(1, Relaxed);
                    return Lookup::Answered(answer(e, req, now, CacheStatus::Stale));
                }
                _ if while_revalidating(e, req.headers(), now) => {
                    stats.stale.fetch_add(1, Relaxed);
                    if let Fill::Lead(guard) = store.begin_fill(key) {
                        let headers = req.headers().clone();
                        let job = Revalidation {
                            store: store.clone(),
                            key: key.to_owned(),
                            entry: e.clone(),
                            guard,
                        };
                        tokio::task::spawn_local(job.run(headers, background()));
                    }
                    return Lookup::Answered(answer(e, req, now, CacheStatus::Stale));
                }
                _ => {}
            }
        }
        if Directives::of(req.headers(), &header::CACHE_CONTROL).only_if_cached {
            let mut r = qweb_http::response::status(StatusCode::GATEWAY_TIMEOUT);
            mark(&mut r, CacheStatus::Miss { stored: false });
            return Lookup::Answered(r);
        }
        if waited {
            return Lookup::Forward {
                stored: found,
                guard: None,
            };
        }
        match store.begin_fill(key) {
            Fill::Lead(g) => {
                return Lookup::Forward {
                    stored: found,
                    guard: Some(g),
                };
            }
            Fill::Wait(mut rx) => {
                stats.collapsed.fetch_add(1, Relaxed);
                // answered from the streamed fill, or look again once it ended (or the bound)
                let bound = cache.collapse_timeout;
                if let Some(r) = super::collapse::wait(store, bound, key, req, &mut rx).await {
                    return Lookup::Answered(r);
                }
                waited = true;
            }
        }
    }
}

/// May a stale `e` answer a request with fields `req` because the origin failed (RFC 5861
/// section 4: the response's or the request's `stale-if-error`)?
fn stale_if_error(e: &Entry, req: &HeaderMap, now: SystemTime) -> bool {
    let rc = e.meta.directives();
    if rc.must_revalidate || rc.proxy_revalidate || rc.no_cache || rc.s_maxage.present() {
        return false;
    }
    let staleness = e.meta.staleness(now);
    let within = |s: Seconds| {
        s.value()
            .is_some_and(|v| staleness <= Duration::from_secs(v))
    };
    within(rc.stale_if_error) || within(Directives::of(req, &header::CACHE_CONTROL).stale_if_error)
}

/// May a stale `e` answer a request with fields `req` while it is revalidated in the
/// background (RFC 5861 section 3)? Not when the request asks the origin (`no-cache`,
/// `max-age`, `min-fresh`), nor when the stored response forbids serving it stale.
fn while_revalidating(e: &Entry, req: &HeaderMap, now: SystemTime) -> bool {
    let rc = e.meta.directives();
    let Some(window) = rc.stale_while_revalidate.value() else {
        return false;
    };
    if rc.must_revalidate || rc.proxy_revalidate || rc.no_cache || rc.s_maxage.present() {
        return false;
    }
    let rq = Directives::of(req, &header::CACHE_CONTROL);
    let pragma = !rq.any
        && req
            .get_all(header::PRAGMA)
            .iter()
            .any(|v| v.as_bytes().eq_ignore_ascii_case(b"no-cache"));
    if rq.no_cache || rq.max_age.present() || rq.min_fresh.present() || pragma {
        return false;
    }
    e.meta.staleness(now) <= Duration::from_secs(window)
}

/// A revalidation in the background: the stored response's validators to the origin; a
/// 304 updates it, a storable response replaces it (read whole, bounded by the largest
/// object size, with no client), anything else but an error removes it. The fill guard keeps
/// one at a time per key.
struct Revalidation {
    store: Arc<Store>,
    key: String,
    entry: Arc<Entry>,
    guard: qweb_cache::FillGuard,
}

impl Revalidation {
    async fn run(self, mut headers: HeaderMap, forward: Background) {
        let Revalidation {
            store,
            key,
            entry,
            guard,
        } = self;
        let client = headers.clone();
        Conditionals::take(&mut headers);
        if let Some(etag) = entry.meta.etag() {
            headers.insert(header::IF_NONE_MATCH, etag.clone());
        }
        if let Some(lm) = entry.meta.last_modified() {
            headers.insert(header::IF_MODIFIED_SINCE, lm.clone());
        }
        headers.remove(header::RANGE);
        headers.insert(
            HeaderName::from_static("surrogate-capability"),
            HeaderValue::from_static("qweb=\"Surrogate/1.0\""),
        );
        let mut req = Request::new(RequestBody::Empty);
        *req.headers_mut() = headers;
        let request_time = SystemTime::now();
        let epoch = store.epoch();
        let resp = forward(req).await;
        let response_time = SystemTime::now();
        let status = resp.status();
        if status == StatusCode::NOT_MODIFIED {
            let mut meta = entry.meta.clone();
            meta.update(resp.headers(), request_time, response_time);
            if policy::storable(&Method::GET, &client, meta.status, &meta.headers).is_ok() {
                store.update(&key, &entry, meta);
                store.stats().revalidated.fetch_add(1, Relaxed);
            } else {
                store.remove_entry(&key, &entry);
            }
            return;
        }
        let (parts, body) = resp.into_parts();
        if policy::storable(&Method::GET, &client, parts.status, &parts.headers).is_ok() {
            let length = parts
                .headers
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok());
            let meta = policy::Meta::new(
                parts.status,
                &parts.headers,
                &client,
                request_time,
                response_time,
            );
            let pending =
                Pending::new(store.clone(), key.clone(), meta, length, epoch, Some(guard));
            // read to its end with no client: FillBody stores it there (or gives up past
            // the largest size); the frames are not gathered a second time
            let mut fill = std::pin::pin!(FillBody::new(body, pending));
            while let Some(Ok(_)) = http_body_util::BodyExt::frame(&mut fill).await {}
        } else if !parts.status.is_server_error() {
            store.remove_entry(&key, &entry);
        }
    }
}

/// The head of a request for [`answer`], from its method and fields.
fn parts_of(method: &Method, headers: HeaderMap) -> http::request::Parts {
    let (mut parts, ()) = Request::new(()).into_parts();
    parts.method = method.clone();
    parts.headers = headers;
    parts
}

/// Turns a full response into a `304` when the client's own conditionals say so.
fn not_modified_if(c: &Conditionals, r: &mut Response<Body>) {
    if r.status() == StatusCode::OK && c.not_modified(r.headers()) {
        to_not_modified(r);
    }
}

/// A stored response as the answer to `req` at `now`: its fields with `Age`, its body
/// (none for HEAD), `Cache-Status`, or a `304` for the client's own conditionals.
fn answer<B>(e: &Entry, req: &Request<B>, now: SystemTime, status: CacheStatus) -> Response<Body> {
    let mut headers = head(&e.meta, Some(e.body.len() as u64), now);
    let no_body = bodiless(e.meta.status);
    let mut code = e.meta.status;
    let mut bytes = e.body.clone();
    let cond = Conditionals::of(req.headers());
    let conditional = e.meta.status == StatusCode::OK && cond.not_modified(&headers);
    if let Some(range) = range_of(req, e).filter(|_| !conditional) {
        let len = e.body.len() as u64;
        match crate::files::range::parse(range, len) {
            RangeRequest::Partial { start, end } => {
                code = StatusCode::PARTIAL_CONTENT;
                bytes = e.body.slice(start as usize..=end as usize);
                headers.insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
                if let Ok(v) = HeaderValue::from_str(&format!("bytes {start}-{end}/{len}")) {
                    headers.insert(header::CONTENT_RANGE, v);
                }
            }
            RangeRequest::Unsatisfiable => {
                code = StatusCode::RANGE_NOT_SATISFIABLE;
                bytes = bytes::Bytes::new();
                headers.insert(header::CONTENT_LENGTH, HeaderValue::from(0));
                if let Ok(v) = HeaderValue::from_str(&format!("bytes */{len}")) {
                    headers.insert(header::CONTENT_RANGE, v);
                }
            }
            // several ranges, or none usable: the whole response
            _ => {}
        }
    }
    let body = if req.method() == Method::HEAD || no_body {
        qweb_http::body::empty()
    } else {
        qweb_http::body::full(bytes)
    };
    let mut r = Response::new(body);
    *r.status_mut() = code;
    *r.headers_mut() = headers;
    if code == StatusCode::OK && !conditional {
        // the whole stored body: compression keeps its encoded variants
        r.extensions_mut().insert(qweb_cache::StoredBody::of(e));
    }
    if let Some(f) = &e.file {
        // (the HTTP/1.1 writer sends only chunks that are parts of this mapping from the
        // file: a range is one; a body compression replaced is not)
        r.extensions_mut().insert(f.clone());
    }
    mark(&mut r, status);
    if conditional {
        to_not_modified(&mut r);
    }
    r
}

/// The `Range` a hit answers with a `206` from the stored whole `e`: GET of a stored
/// `200`, without `If-Range` (which qweb does not evaluate: the whole is served then).
fn range_of<'a, B>(req: &'a Request<B>, e: &Entry) -> Option<&'a str> {
    if req.method() != Method::GET
        || e.meta.status != StatusCode::OK
        || req.headers().contains_key(header::IF_RANGE)
    {
        return None;
    }
    req.headers().get(header::RANGE)?.to_str().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_same_origin_locations() {
        let k = key(false, Some("Example.COM:8080"), "/a/b", Some("x=1"));
        assert_eq!(k, "http://example.com:8080/a/b?x=1");
        let v = |s: &'static str| HeaderValue::from_static(s);
        assert_eq!(
            same_origin_key(&k, &v("/c")).as_deref(),
            Some("http://example.com:8080/c")
        );
        assert_eq!(
            same_origin_key(&k, &v("http://example.com:8080/d")).as_deref(),
            Some("http://example.com:8080/d")
        );
        assert_eq!(same_origin_key(&k, &v("http://other/d")), None);
        assert_eq!(same_origin_key(&k, &v("//other/d")), None);
        assert_eq!(same_origin_key(&k, &v("http://example.com:80801/d")), None);
    }
}
