//! Active health checks (`health_check = { path, interval, expect, timeout }`): every
//! `interval`, each upstream of the route gets a `GET path` on a new connection (TLS for an
//! `https://` upstream); an answer with the `expect`ed status within `timeout` keeps it up (or
//! brings it back), anything else takes it out until a check passes. Each worker checks for
//! its own balancer, as its pools and passive state are its own.

use std::rc::{Rc, Weak};

use http::header::{self, HeaderValue};
use http::{Method, Request};

use super::body::ClientBody;
use super::Proxy;

impl Proxy {
    /// Starts the route's health checks on this worker (none without `health_check`). They
    /// stop when the proxy is dropped.
    pub(crate) fn start_health_checks(self: &Rc<Self>) {
        let Some(hc) = &self.cfg.health_check else {
            return;
        };
        for idx in 0..self.cfg.upstreams.len() {
            let weak = Rc::downgrade(self);
            let interval = hc.interval;
            tokio::task::spawn_local(async move {
                let mut tick = tokio::time::interval(interval);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    if !check_once(&weak, idx).await {
                        return;
                    }
                }
            });
        }
    }

    /// One check of upstream `idx`: `true` when it answered the expected status in time.
    async fn probe(&self, idx: usize) -> bool {
        let Some(hc) = &self.cfg.health_check else {
            return true;
        };
        let up = &self.cfg.upstreams[idx];
        let check = async {
            let mut conn = self.connect(idx).await.ok()?;
            let host = HeaderValue::from_str(&up.name).ok()?;
            let (body, _) = ClientBody::buffered(bytes::Bytes::new());
            let mut req = Request::new(body);
            *req.method_mut() = Method::GET;
            *req.uri_mut() = hc.path.parse().ok()?;
            req.headers_mut().insert(header::HOST, host);
            req.headers_mut().insert(
                header::USER_AGENT,
                HeaderValue::from_static("qweb-health-check"),
            );
            req.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            let resp = conn.sender.send_request(req).await.ok()?;
            Some(resp.status().as_u16() == hc.expect)
        };
        matches!(
            tokio::time::timeout(hc.timeout, check).await,
            Ok(Some(true))
        )
    }
}

/// Checks upstream `idx` once; `false` when the proxy is gone.
async fn check_once(weak: &Weak<Proxy>, idx: usize) -> bool {
    let Some(proxy) = weak.upgrade() else {
        return false;
    };
    let healthy = proxy.probe(idx).await;
    proxy.balancer.checked(idx, healthy);
    true
}

/// Every proxy route's upstream gauges, for the metrics registry.
pub(crate) fn upstream_gauges(
    config: &crate::config::Config,
) -> Vec<(
    String,
    Vec<String>,
    std::sync::Arc<crate::config::UpstreamGauges>,
)> {
    config
        .routes
        .iter()
        .filter_map(|r| match &r.action {
            crate::config::RouteAction::Proxy(p) => Some((
                r.prefix.clone(),
                p.upstreams.iter().map(|u| u.name.clone()).collect(),
                p.gauges.clone(),
            )),
            crate::config::RouteAction::Static(_) => None,
        })
        .collect()
}

/// The upstream families of `/metrics`: `qweb_upstream_up` (1 when no worker skips it),
/// `qweb_upstream_down_workers`, `qweb_upstream_failures_total`.
pub(crate) fn write_upstream_metrics(
    out: &mut String,
    routes: &[(
        String,
        Vec<String>,
        std::sync::Arc<crate::config::UpstreamGauges>,
    )],
    workers: usize,
) {
    use std::fmt::Write;
    use std::sync::atomic::Ordering::Relaxed;
    if routes.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "# HELP qweb_upstream_up Proxy upstream up on every worker (health checks, passive failures).\n# TYPE qweb_upstream_up gauge"
    );
    let label = |route: &str, up: &str| {
        format!(
            "route=\"{}\",upstream=\"{}\"",
            route.replace(['\\', '"'], "_"),
            up.replace(['\\', '"'], "_")
        )
    };
    for (route, names, g) in routes {
        for (i, n) in names.iter().enumerate() {
            let down = g.down_workers.get(i).map_or(0, |d| d.load(Relaxed));
            let _ = writeln!(
                out,
                "qweb_upstream_up{{{}}} {}",
                label(route, n),
                i64::from(down <= 0)
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP qweb_upstream_down_workers Workers (of {workers}) that skip the upstream now.\n# TYPE qweb_upstream_down_workers gauge"
    );
    for (route, names, g) in routes {
        for (i, n) in names.iter().enumerate() {
            let down = g.down_workers.get(i).map_or(0, |d| d.load(Relaxed));
            let _ = writeln!(
                out,
                "qweb_upstream_down_workers{{{}}} {down}",
                label(route, n)
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP qweb_upstream_failures_total Upstream connect failures and failed health checks.\n# TYPE qweb_upstream_failures_total counter"
    );
    for (route, names, g) in routes {
        for (i, n) in names.iter().enumerate() {
            let f = g.failures.get(i).map_or(0, |d| d.load(Relaxed));
            let _ = writeln!(
                out,
                "qweb_upstream_failures_total{{{}}} {f}",
                label(route, n)
            );
        }
    }
}
