//! The store's side of `scope = "fleet"` rate limits (issue 40; the node's side is
//! `qweb_config::FleetLimiter`). The workers queue lease requests ([`LeaseStore::lease`],
//! never a wait); a task on the fleet thread runs each as one `EVAL` of [`SCRIPT`] on the
//! fleet client's connection, at most [`IN_FLIGHT`] at once, each bounded by `fleet.timeout`,
//! and hands the answer back to the limiter.
//!
//! The script keeps one GCRA arrival time per key, in microseconds of the store's own clock
//! (`TIME`), under `{prefix}rl:{route}:{hash}` (the route's `/metrics` label; the first 16
//! bytes of the key's SHA-256, in hex) with a time to live of the time it is ahead plus a
//! second: a key at rest costs the store nothing, a million distinct keys expire as fast
//! as they came. It counts what the node owes first, then grants up to `want` permits.
//!
//! A lease that fails (no connection, late, a garbled answer) makes the store count as away
//! for [`FAILED_FOR`]: the limits fall back to `rate / nodes seen` on each node meanwhile.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use qweb_config::{Config, LeaseRequest, LeaseStore};
use tokio::sync::{mpsc, Semaphore};

use super::{bounded, lock, Fleet};

/// Lease requests queued for the fleet thread at most (past it a request is decided by the
/// per-node limit).
pub(crate) const QUEUE: usize = 4096;
/// Leases in flight at most.
pub(crate) const IN_FLIGHT: usize = 256;
/// After a failed lease, the store counts as away for this long.
pub(crate) const FAILED_FOR: Duration = Duration::from_secs(1);
/// The longest wait the store may name (a larger one is cut to it).
const MAX_WAIT_US: i64 = 60_000_000;

/// `KEYS[1]`: the key; `ARGV`: interval and tolerance (µs), owed requests, permits wanted.
/// Answers `{permits granted, µs until the next one when none}`.
pub(crate) const SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local tol = tonumber(ARGV[2])
local debt = tonumber(ARGV[3])
local want = tonumber(ARGV[4])
local tat = tonumber(redis.call('GET', KEYS[1])) or 0
if tat < now then tat = now end
tat = math.min(tat + debt * interval, now + tol + 60000000)
local n = 0
if tat - now <= tol then
  n = math.min(want, math.floor((now + tol - tat) / interval) + 1)
  tat = tat + n * interval
end
local wait = 0
if n == 0 then wait = tat - now - tol end
redis.call('SET', KEYS[1], string.format('%.0f', tat), 'PX', math.floor((tat - now) / 1000) + 1000)
return {n, wait}
";

impl LeaseStore for Fleet {
    fn lease(&self, req: LeaseRequest) -> bool {
        self.leases.try_send(req).is_ok()
    }

    fn available(&self) -> bool {
        self.up.load(Relaxed) && self.since_start_ms() >= self.lease_failed_until.load(Relaxed)
    }

    fn nodes(&self) -> u64 {
        self.nodes_seen.load(Relaxed).max(1)
    }
}

impl Fleet {
    fn since_start_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The store key of `req`'s key.
    fn lease_key(&self, req: &LeaseRequest) -> String {
        let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &req.key);
        let hex: String = d.as_ref()[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        self.key(&format!("rl:{}:{hex}", req.limiter.route()))
    }

    /// One lease: permits granted and the wait until the next one (when none).
    async fn lease_once(&self, req: &LeaseRequest) -> Result<(u32, Duration), String> {
        let conn = lock(&self.conn).clone();
        let mut conn = conn.ok_or("the store is not connected")?;
        let l = &req.limiter;
        let interval = (l.interval_ns() / 1000).max(1);
        let tolerance = interval.saturating_mul(u64::from(l.burst()));
        let reply: Vec<i64> = bounded(
            self.config.timeout,
            redis::cmd("EVAL")
                .arg(SCRIPT)
                .arg(1)
                .arg(self.lease_key(req))
                .arg(interval)
                .arg(tolerance)
                .arg(req.debt)
                .arg(req.want)
                .query_async(&mut conn),
        )
        .await?;
        let [n, wait] = reply[..] else {
            return Err(format!("a lease answered {} values", reply.len()));
        };
        let n = u32::try_from(n.clamp(0, i64::from(req.want))).unwrap_or(0);
        let wait = u64::try_from(wait.clamp(0, MAX_WAIT_US)).unwrap_or(0);
        Ok((n, Duration::from_micros(wait)))
    }
}

/// Runs the queued leases until the fleet thread stops.
pub(crate) async fn serve(fleet: Arc<Fleet>, mut rx: mpsc::Receiver<LeaseRequest>) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    while let Some(req) = rx.recv().await {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let fleet = fleet.clone();
        tokio::spawn(async move {
            let r = fleet.lease_once(&req).await;
            drop(slot);
            fleet.stats.leases.fetch_add(1, Relaxed);
            match r {
                Ok((n, wait)) => req.limiter.granted(req.slot, n, wait),
                Err(e) => {
                    fleet.stats.lease_failures.fetch_add(1, Relaxed);
                    let until = fleet.since_start_ms() + FAILED_FOR.as_millis() as u64;
                    fleet.lease_failed_until.store(until, Relaxed);
                    tracing::debug!("fleet: a rate limit lease failed: {e}");
                    req.limiter.failed(req.slot);
                }
            }
        });
    }
}

/// Puts `fleet` behind every `scope = "fleet"` limit of `config` (without a fleet client
/// they limit as one node alone).
pub(crate) fn attach(config: &Config, fleet: Option<&Arc<Fleet>>) {
    let Some(fleet) = fleet else { return };
    let mut any = false;
    let top = config.routes.iter().map(|r| ("", r));
    let sites = config.sites.sites.iter().flat_map(|s| {
        let label = s.server_names.first().map_or("", String::as_str);
        s.routes.iter().map(move |r| (label, r))
    });
    for (label, r) in top.chain(sites) {
        if let Some(f) = r.rules.rate_limit.as_ref().and_then(|l| l.fleet.as_ref()) {
            f.attach(fleet.clone(), format!("{label}{}", r.prefix));
            any = true;
        }
    }
    fleet.has_limits.store(any, Relaxed);
}
