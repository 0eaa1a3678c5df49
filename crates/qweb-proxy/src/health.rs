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
    pub fn start_health_checks(self: &Rc<Self>) {
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
            let mut conn = self.connect(idx, None).await.ok()?;
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

/// Every proxy route's upstream gauges, for the metrics registry: top-level routes labelled by
/// prefix, a site's by its first server name and prefix (as the request metrics).
pub fn upstream_gauges(config: &qweb_config::Config) -> Vec<qweb_observe::metrics::UpstreamRoute> {
    let top = config.routes.iter().map(|r| ("", r));
    let sites = config.sites.sites.iter().flat_map(|s| {
        let label = s.server_names.first().map_or("", String::as_str);
        s.routes.iter().map(move |r| (label, r))
    });
    top.chain(sites)
        .filter_map(|(label, r)| match &r.action {
            qweb_config::RouteAction::Proxy(p) => Some((
                format!("{label}{}", r.prefix),
                p.upstreams.iter().map(|u| u.name.clone()).collect(),
                p.gauges.clone(),
            )),
            _ => None,
        })
        .collect()
}
