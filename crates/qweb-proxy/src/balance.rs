//! Choosing an upstream: the route's policy (`round_robin` by weight, `least_conn`, `hash`)
//! over the upstreams that are up, in order of preference (the first is tried, the others
//! are the failover order).
//!
//! An upstream is down while its active health check fails, or for `fail_timeout` after
//! `max_fails` connect failures in a row (passive); once that time is over it is tried again,
//! and its next failure takes it out again. State is per worker, as the pools are.

use std::cell::Cell;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderMap};
use tokio::time::Instant;

use super::Proxy;
use qweb_config::{Balance, HashKey, ProxyConfig, UpstreamGauges};

#[derive(Default)]
struct UpState {
    /// Smooth weighted round-robin's running score.
    current: Cell<i64>,
    /// Requests in flight to it (from the first try until the response body ends).
    active: Cell<u32>,
    /// Connect failures in a row.
    fails: Cell<u32>,
    down_until: Cell<Option<Instant>>,
    /// The last active health check failed.
    check_down: Cell<bool>,
    /// This worker counts it in the shared `down_workers` gauge.
    reported_down: Cell<bool>,
}

/// The balancing and health state of one route on one worker.
pub(super) struct Balancer {
    policy: Balance,
    weights: Vec<u32>,
    names: Vec<String>,
    max_fails: u32,
    fail_timeout: Duration,
    state: Vec<UpState>,
    /// Rotates the ties of `least_conn`.
    turn: Cell<usize>,
    gauges: Arc<UpstreamGauges>,
}

impl Balancer {
    pub(super) fn new(cfg: &ProxyConfig) -> Self {
        let n = cfg.upstreams.len();
        let mut weights = cfg.weights.clone();
        weights.resize(n, 1);
        Balancer {
            policy: cfg.balance.clone(),
            weights,
            names: cfg.upstreams.iter().map(|u| u.name.clone()).collect(),
            max_fails: cfg.max_fails,
            fail_timeout: cfg.fail_timeout,
            state: (0..n).map(|_| UpState::default()).collect(),
            turn: Cell::new(0),
            gauges: cfg.gauges.clone(),
        }
    }

    /// Brings the shared gauge in line with this worker's view of upstream `i`.
    fn report(&self, i: usize, now: Instant) {
        let down = !self.is_up(i, now);
        let s = &self.state[i];
        if down != s.reported_down.get() {
            s.reported_down.set(down);
            if let Some(g) = self.gauges.down_workers.get(i) {
                g.fetch_add(if down { 1 } else { -1 }, Relaxed);
            }
        }
    }

    fn count_failure(&self, i: usize) {
        if let Some(g) = self.gauges.failures.get(i) {
            g.fetch_add(1, Relaxed);
        }
    }

    /// Up: its health check passes and it is not in a passive time-out.
    pub(super) fn is_up(&self, i: usize, now: Instant) -> bool {
        let s = &self.state[i];
        !s.check_down.get() && s.down_until.get().is_none_or(|t| t <= now)
    }

    /// The hash key of a request, for `balance = "hash"` (`None`: the request has none; it is
    /// then balanced round-robin).
    pub(super) fn key(&self, headers: &HeaderMap, client: IpAddr) -> Option<u64> {
        let Balance::Hash(k) = &self.policy else {
            return None;
        };
        let mut h = std::hash::DefaultHasher::new();
        match k {
            HashKey::ClientIp => client.hash(&mut h),
            HashKey::Header(name) => headers.get(name)?.as_bytes().hash(&mut h),
            HashKey::Cookie(name) => cookie(headers, name)?.hash(&mut h),
        }
        Some(h.finish())
    }

    /// The upstreams that are up, best first. Empty when all are down.
    pub(super) fn order(&self, key: Option<u64>) -> Vec<usize> {
        let now = Instant::now();
        for i in 0..self.state.len() {
            self.report(i, now);
        }
        let up: Vec<usize> = (0..self.state.len())
            .filter(|&i| self.is_up(i, now))
            .collect();
        if up.is_empty() {
            return up;
        }
        match (&self.policy, key) {
            (Balance::Hash(_), Some(k)) => {
                let mut scored: Vec<(f64, usize)> =
                    up.iter().map(|&i| (self.rendezvous(k, i), i)).collect();
                scored.sort_by(|a, b| b.0.total_cmp(&a.0));
                scored.into_iter().map(|(_, i)| i).collect()
            }
            (Balance::LeastConn, _) => {
                let n = self.state.len();
                let start = self.turn.get();
                self.turn.set((start + 1) % n);
                let mut v = up;
                // fewest in flight per unit of weight; ties in turn
                v.sort_by_key(|&i| {
                    let load = u64::from(self.state[i].active.get()) * 1_000_000
                        / u64::from(self.weights[i]);
                    (load, (i + n - start) % n)
                });
                v
            }
            _ => self.weighted_round_robin(up),
        }
    }

    /// nginx's smooth weighted round-robin: the chosen one first, then the others in index
    /// order after it.
    fn weighted_round_robin(&self, up: Vec<usize>) -> Vec<usize> {
        let total: i64 = up.iter().map(|&i| i64::from(self.weights[i])).sum();
        let mut best = up[0];
        for &i in &up {
            let s = &self.state[i];
            s.current.set(s.current.get() + i64::from(self.weights[i]));
            if s.current.get() > self.state[best].current.get() {
                best = i;
            }
        }
        let b = &self.state[best];
        b.current.set(b.current.get() - total);
        let pos = up.iter().position(|&i| i == best).unwrap_or(0);
        up[pos..].iter().chain(&up[..pos]).copied().collect()
    }

    /// Weighted rendezvous score of upstream `i` for key `k` (higher wins).
    fn rendezvous(&self, k: u64, i: usize) -> f64 {
        let mut h = std::hash::DefaultHasher::new();
        k.hash(&mut h);
        self.names[i].hash(&mut h);
        // uniform in (0, 1)
        let u = ((h.finish() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        -f64::from(self.weights[i]) / u.ln()
    }

    /// A connect failure of upstream `i` (passive health).
    pub(super) fn failed(&self, i: usize) {
        if self.max_fails == 0 {
            return;
        }
        self.count_failure(i);
        let s = &self.state[i];
        s.fails.set(s.fails.get().saturating_add(1));
        if s.fails.get() >= self.max_fails {
            s.down_until.set(Some(Instant::now() + self.fail_timeout));
            tracing::warn!(upstream = %self.names[i], fails = s.fails.get(), "upstream down for {:?}", self.fail_timeout);
        }
        self.report(i, Instant::now());
    }

    /// Upstream `i` answered.
    pub(super) fn succeeded(&self, i: usize) {
        let s = &self.state[i];
        s.fails.set(0);
        s.down_until.set(None);
        self.report(i, Instant::now());
    }

    /// The result of an active health check of upstream `i`.
    pub(super) fn checked(&self, i: usize, healthy: bool) {
        let s = &self.state[i];
        if s.check_down.get() == healthy {
            if healthy {
                tracing::info!(upstream = %self.names[i], "upstream passed its health check: up");
            } else {
                tracing::warn!(upstream = %self.names[i], "upstream failed its health check: down");
            }
        }
        s.check_down.set(!healthy);
        if healthy {
            self.succeeded(i);
        } else {
            self.count_failure(i);
        }
        self.report(i, Instant::now());
    }
}

/// A request in flight to an upstream (for `least_conn`, and the shared `in_flight` gauge);
/// released on drop.
pub struct Load {
    proxy: Rc<Proxy>,
    idx: usize,
}

impl Load {
    pub(super) fn new(proxy: &Rc<Proxy>, idx: usize) -> Self {
        let s = &proxy.balancer.state[idx];
        s.active.set(s.active.get() + 1);
        if let Some(g) = proxy.balancer.gauges.in_flight.get(idx) {
            g.fetch_add(1, Relaxed);
        }
        Load {
            proxy: proxy.clone(),
            idx,
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        let s = &self.proxy.balancer.state[self.idx];
        s.active.set(s.active.get().saturating_sub(1));
        if let Some(g) = self.proxy.balancer.gauges.in_flight.get(self.idx) {
            g.fetch_sub(1, Relaxed);
        }
    }
}

/// The value of cookie `name` in the request's `Cookie` headers.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use qweb_config::Upstream;

    fn cfg(n: usize, balance: Balance, weights: Vec<u32>) -> ProxyConfig {
        let mut c = qweb_config::Config::from_str_at(
            "[[route]]\nprefix = \"/\"\nupstreams = [\"127.0.0.1:9\"]\n",
            None,
        )
        .unwrap();
        let qweb_config::RouteAction::Proxy(mut p) = c.routes.remove(0).action else {
            panic!("proxy route");
        };
        p.upstreams = (0..n)
            .map(|i| Upstream {
                name: format!("10.0.0.{i}:80"),
                addr: "127.0.0.1:9".parse().unwrap(),
                tls: false,
                host: String::new(),
                h2: false,
            })
            .collect();
        p.balance = balance;
        p.weights = weights;
        p
    }

    #[test]
    fn weighted_round_robin_is_smooth_and_by_weight() {
        let b = Balancer::new(&cfg(3, Balance::RoundRobin, vec![5, 1, 1]));
        let picks: Vec<usize> = (0..7).map(|_| b.order(None)[0]).collect();
        assert_eq!(picks.iter().filter(|&&i| i == 0).count(), 5);
        assert_eq!(picks, vec![0, 0, 1, 0, 2, 0, 0], "nginx's smooth sequence");
    }

    #[test]
    fn rendezvous_moves_few_keys_when_an_upstream_is_added() {
        let b4 = Balancer::new(&cfg(4, Balance::Hash(HashKey::ClientIp), vec![1; 4]));
        let b5 = Balancer::new(&cfg(5, Balance::Hash(HashKey::ClientIp), vec![1; 5]));
        let mut moved = 0;
        let mut counts = [0usize; 4];
        for k in 0..10_000u64 {
            let a = b4.order(Some(k))[0];
            let b = b5.order(Some(k))[0];
            counts[a] += 1;
            if a != b {
                moved += 1;
                assert_eq!(b, 4, "a key only moves to the new upstream");
            }
        }
        // about 1/5 of the keys move; each of 4 gets about 1/4
        assert!((1500..2500).contains(&moved), "{moved}");
        for c in counts {
            assert!((2200..2800).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn passive_health_takes_out_and_brings_back() {
        let mut c = cfg(2, Balance::RoundRobin, vec![1, 1]);
        c.max_fails = 2;
        c.fail_timeout = Duration::from_millis(50);
        let b = Balancer::new(&c);
        b.failed(0);
        assert_eq!(b.order(None).len(), 2, "one failure of two allowed");
        b.failed(0);
        assert_eq!(b.order(None), vec![1]);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(b.order(None).len(), 2, "tried again after fail_timeout");
        b.checked(1, false);
        b.failed(0);
        assert!(b.order(None).is_empty(), "all down");
    }

    #[test]
    fn cookie_values() {
        let mut h = HeaderMap::new();
        h.append(header::COOKIE, "a=1; session=abc".parse().unwrap());
        assert_eq!(cookie(&h, "session"), Some("abc"));
        assert_eq!(cookie(&h, "sess"), None);
    }
}
