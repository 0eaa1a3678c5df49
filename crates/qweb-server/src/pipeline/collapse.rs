//! Collapsed misses (issue 38): the requests for a key another request is filling wait for
//! that fill instead of going to the upstream, at most `[cache] collapse_timeout` for its
//! response head. A fill whose body is streamed ([`qweb_cache::Pending::share`]: storable,
//! with a `Content-Length` within `max_object_size`) hands them its head as soon as the
//! origin sent it, and its body as it comes: each waiter answers at once, a hit
//! (`Cache-Status: qweb; hit; collapsed`), its body a [`qweb_cache::Follower`] of the one
//! buffer the fill holds. Once streaming, a stalled origin is bounded by the route's `timeout`
//! (the longest pause between two body reads): the fill then fails and every waiter's body
//! ends with an error (a truncated response, its `Content-Length` honest). The fill is read by
//! a task of its own, so the filling client going away does not end it while a waiter reads.
//!
//! A waiter the streamed response does not answer (another `Vary` variant, a request that
//! asks the origin, a `Range`, a key purged since the fill's request went out) waits for the
//! fill's end and looks again, as do the waiters of a fill that is not streamed (no
//! `Content-Length`: it may grow past `max_object_size`); a fill that is not stored releases
//! them and they go to the upstream themselves.

use std::time::{Instant, SystemTime};

use http::{header, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use qweb_cache::{policy, CacheStatus, FillBody, InFlight, Pending, Reuse, Store};
use qweb_http::body::{Body, BoxError};
use qweb_http::request_body::RequestBody;

use super::cache_head::{head, mark, to_not_modified, Conditionals};

/// Waits on `rx`, the fill of `key` in flight, for its head (at most `bound`, the collapse
/// timeout):
/// the answer to `req` from its streamed body, or none once the fill ended (look again) or
/// the bound passed (go to the upstream).
pub(super) async fn wait(
    store: &Store,
    bound: std::time::Duration,
    key: &str,
    req: &Request<RequestBody>,
    rx: &mut tokio::sync::watch::Receiver<Option<InFlight>>,
) -> Option<Response<Body>> {
    let deadline = Instant::now() + bound;
    loop {
        let fill = rx.borrow_and_update().clone();
        if let Some(r) = fill.and_then(|f| follow(store, key, &f, req)) {
            return Some(r);
        }
        // woken when the head comes or the fill ends (stored or not); gone upstream at the bound
        match tokio::time::timeout_at(deadline.into(), rx.changed()).await {
            Ok(Ok(())) => continue,
            _ => return None,
        }
    }
}

/// The answer to `req` from the streamed fill `f`, when it may take it.
fn follow(
    store: &Store,
    key: &str,
    f: &InFlight,
    req: &Request<RequestBody>,
) -> Option<Response<Body>> {
    let now = SystemTime::now();
    if store.superseded(key, f.epoch)
        || !f.meta.vary_matches(req.headers())
        || !matches!(policy::reuse(&f.meta, req.headers(), now), Reuse::Fresh)
        || (req.method() == Method::GET && req.headers().contains_key(header::RANGE))
    {
        return None;
    }
    let headers = head(&f.meta, f.length, now);
    let conditional =
        f.meta.status == StatusCode::OK && Conditionals::of(req.headers()).not_modified(&headers);
    let no_body = req.method() == Method::HEAD || conditional;
    let body = if no_body {
        qweb_http::body::empty()
    } else {
        let follower = f.follow()?;
        qweb_http::body::boxed(follower.map_err(BoxError::from))
    };
    let mut r = Response::new(body);
    *r.status_mut() = f.meta.status;
    *r.headers_mut() = headers;
    store
        .stats()
        .hits
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    mark(&mut r, CacheStatus::Hit { collapsed: true });
    if conditional {
        to_not_modified(&mut r);
    }
    Some(r)
}

/// The body of a fill: one whose size is known (`sized`: its `Content-Length`, within the
/// largest object size) streams to its waiters: `origin` is read into the shared body by a
/// task of the worker's own while a reader is left, and the filling client reads it as the
/// waiters do; another is teed into the store as it streams to the filling client alone.
pub(super) fn fill(origin: Body, pending: Pending, sized: bool) -> Body {
    // (share hands the head to the waiters: only for a sized fill)
    if let Some(own) = sized.then(|| pending.share()).flatten() {
        tokio::task::spawn_local(FillBody::new(origin, pending).drive());
        return qweb_http::body::boxed(own.map_err(BoxError::from));
    }
    qweb_http::body::boxed(FillBody::new(origin, pending))
}
