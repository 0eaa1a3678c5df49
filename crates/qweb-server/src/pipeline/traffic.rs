//! Traffic control of a routed request (issue 39): phase 6, the route's `rate_limit` (before
//! the access rules of phase 7, as nginx's `limit_req` runs before `allow`, so that a guessing
//! client spends its budget before it costs an authentication).

use std::net::IpAddr;

use http::{header, HeaderMap, HeaderValue, Response, StatusCode};

use crate::config::{FleetLimiter, HashKey, Verdict};
use crate::pipeline::routes::Route;
use qweb_http::body::Body;
use qweb_http::response;
use qweb_observe::log_limit::PerPeer;

/// The route's `rate_limit` on one request from `client`: `None` lets it through (within the
/// rate, no limit, no key, or `dry_run`); `Some` is the 429 to answer, with `Retry-After`.
pub(crate) fn rate_limit(
    route: &Route,
    headers: &HeaderMap,
    client: IpAddr,
    peer_log: &PerPeer,
) -> Option<Response<Body>> {
    let (limit, metrics) = route.rules.rate_limit.as_ref().zip(route.rate.as_ref())?;
    let (verdict, keys) = match &limit.fleet {
        None => (
            match &limit.key {
                HashKey::ClientIp => limit.state.check(client.to_canonical()),
                HashKey::Header(name) => limit.state.check(headers.get(name)?.as_bytes()),
                HashKey::Cookie(name) => limit.state.check(qweb_proxy::cookie(headers, name)?),
            },
            limit.state.keys(),
        ),
        Some(fleet) => (
            fleet_check(fleet, &limit.key, headers, client, route)?,
            fleet.keys(),
        ),
    };
    metrics.keys.set(i64::try_from(keys).unwrap_or(i64::MAX));
    let Verdict::Limited { retry_after } = verdict else {
        metrics.allowed.inc();
        return None;
    };
    metrics.limited.inc();
    if let Some(suppressed) = peer_log.hit(client) {
        tracing::info!(
            peer = %client,
            route = %route.prefix,
            dry_run = limit.dry_run,
            suppressed,
            "rate limit exceeded"
        );
    }
    if limit.dry_run {
        return None;
    }
    let mut r = response::status(StatusCode::TOO_MANY_REQUESTS);
    // whole seconds, rounded up: a client that waits that long gets through
    let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
    Some(r)
}

/// A `scope = "fleet"` limit on one request (`None`: no key to count), logging when its
/// decisions move to this node alone or back to the store.
fn fleet_check(
    fleet: &std::sync::Arc<FleetLimiter>,
    key: &HashKey,
    headers: &HeaderMap,
    client: IpAddr,
    route: &Route,
) -> Option<Verdict> {
    let ip = match client.to_canonical() {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    };
    let verdict = fleet.check(match key {
        HashKey::ClientIp => &ip,
        HashKey::Header(name) => headers.get(name)?.as_bytes(),
        HashKey::Cookie(name) => qweb_proxy::cookie(headers, name)?.as_bytes(),
    });
    match fleet.transition() {
        Some(true) => tracing::warn!(
            route = %route.prefix,
            "rate limit: the fleet's store is away; limiting on this node at its share of the rate (rate / nodes seen)"
        ),
        Some(false) => tracing::info!(
            route = %route.prefix,
            "rate limit: the fleet's store counts this route's requests again"
        ),
        None => {}
    }
    Some(verdict)
}
