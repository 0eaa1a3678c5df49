//! The route table of a worker: each route's prefix, its handler (static files, proxy,
//! redirect), its rules and its `/metrics` handles.

use std::rc::Rc;

use crate::config::RouteAction;
use crate::files::StaticFiles;
use qweb_observe::metrics::RouteMetrics;
use qweb_proxy::Proxy;

/// What serves a route on this worker.
pub(crate) enum Handler {
    Static(StaticFiles),
    Proxy(Rc<Proxy>),
    Redirect(crate::config::RedirectConfig),
}

/// A route on this worker.
pub(crate) struct Route {
    pub prefix: String,
    pub strip_prefix: bool,
    pub handler: Handler,
    /// Requests by status class and latency of this route (`/metrics`).
    pub metrics: Rc<RouteMetrics>,
    /// Header edits and `expires`.
    pub rules: crate::config::RouteRules,
    /// The proxy's responses go through the cache (`cache = {}`).
    pub cached: bool,
    /// The `rate_limit` counters (`/metrics`), where the route has one.
    pub rate: Option<qweb_observe::metrics::RateLimitMetrics>,
    /// The proxy to the `forward_auth` service, where the route has one.
    pub forward_auth: Option<Rc<Proxy>>,
    /// The `basic_auth` counters (`/metrics`), where the route or its site has one.
    pub auth: Option<qweb_observe::metrics::BasicAuthMetrics>,
}

/// Builds a route of this worker; its `/metrics` label is `label_prefix` (a site's first
/// server name; empty for top-level routes) followed by the route's prefix. `site_auth`: its
/// site has a `basic_auth`.
pub(crate) fn build_route(
    r: &crate::config::RouteConfig,
    registry: &qweb_observe::metrics::Metrics,
    label_prefix: &str,
    site_auth: bool,
) -> std::io::Result<Route> {
    let handler = match &r.action {
        RouteAction::Static(s) => Handler::Static(StaticFiles::new(s)?),
        RouteAction::Proxy(p) => Handler::Proxy(Proxy::new(p)),
        RouteAction::Redirect(d) => Handler::Redirect(d.clone()),
    };
    let label = format!("{label_prefix}{}", r.prefix);
    Ok(Route {
        prefix: r.prefix.clone(),
        strip_prefix: r.strip_prefix,
        handler,
        metrics: Rc::new(registry.route(&label)),
        rules: r.rules.clone(),
        cached: r.cache.is_some() && matches!(r.action, RouteAction::Proxy(_)),
        rate: r
            .rules
            .rate_limit
            .as_ref()
            .map(|_| registry.rate_limit(&label)),
        forward_auth: r.rules.forward_auth.as_ref().map(|f| Proxy::new(&f.proxy)),
        auth: (site_auth || r.rules.basic_auth.is_some()).then(|| registry.basic_auth(&label)),
    })
}
