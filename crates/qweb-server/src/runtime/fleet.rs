//! The fleet client (`[fleet]`): this node's link to the store the fleet's nodes share
//! (Redis). It runs on a thread of its own (`qweb-fleet`, one current-thread runtime), never on
//! a worker's event loop: it connects (a bounded wait, then a retry with backoff, so a store
//! that is down or silent never holds up the start), writes this node's heartbeat, keeps the
//! list of nodes seen, and applies the cache purges other nodes publish. The admin listener
//! publishes purges through [`Fleet::publish_purge`], a wait bounded by `fleet.timeout`.
//!
//! Keys and channels, under `key_prefix` (`qweb:` by default):
//! - `{prefix}node:{name}`: this node's heartbeat, JSON `{name, started, version, pid}`,
//!   written every [`HEARTBEAT_EVERY`] with a time to live of [`HEARTBEAT_TTL`];
//! - `{prefix}purge`: the purge channel, JSON `{kind: "url"|"prefix", value, origin}` (the
//!   value is the cache key, as the admin listener normalised it).
//! - `{prefix}rl:{route}:{hash}`: the GCRA state of `scope = "fleet"` rate limits, leased
//!   by the workers through this thread ([`limit`]);
//! - `{prefix}tickets:{ms}` and `{prefix}tickets:{ms}:lock`: the ticket key rings of
//!   `ticket_keys = "fleet"` listeners, read and rotated by their own refresher threads
//!   (`runtime::tls::fleet_tickets`), not by this client;
//! - `{prefix}acme:{DIR}:...` and the channel `{prefix}acme`: ACME's account, certificates
//!   and order locks, read and written by the ACME jobs' own threads
//!   (`runtime::tls::acme::fleet`), not by this client.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub(crate) mod limit;

use futures_util::StreamExt;
use qweb_config::FleetConfig;
use redis::aio::MultiplexedConnection;
use serde_json::{json, Value};
use tokio::sync::watch;

/// How often this node writes its heartbeat (and reads the list of nodes).
pub(crate) const HEARTBEAT_EVERY: Duration = Duration::from_secs(5);
/// The heartbeat key's time to live: a node that stops writing disappears after this long.
pub(crate) const HEARTBEAT_TTL: u64 = 15;
/// The first wait before connecting again after a failure; doubled after each failure.
pub(crate) const BACKOFF_MIN: Duration = Duration::from_millis(250);
/// The longest wait before connecting again.
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// At most this many nodes are listed (the SCAN stops there).
pub(crate) const MAX_NODES: usize = 1024;

/// Counters of the fleet client, for `/metrics`.
#[derive(Debug, Default)]
pub(crate) struct FleetStats {
    published: AtomicU64,
    received: AtomicU64,
    errors: AtomicU64,
    unpublished: AtomicU64,
    leases: AtomicU64,
    lease_failures: AtomicU64,
}

/// The store's health as last seen.
#[derive(Debug, Clone, Copy)]
struct Health {
    up: bool,
    /// When it went up or down (the start: down since then until first connected).
    since: SystemTime,
}

/// The fleet client, shared (an `Arc`) by the server, its admin listener and its thread.
pub(crate) struct Fleet {
    config: FleetConfig,
    started: u64,
    /// The connection commands go through while the store is up (a multiplexed connection is
    /// a cheap handle to clone).
    conn: Mutex<Option<MultiplexedConnection>>,
    health: Mutex<Health>,
    up: AtomicBool,
    /// The nodes last listed (their heartbeats), refreshed by the fleet thread.
    nodes: Mutex<Vec<Value>>,
    /// How many nodes were listed last (0 before the first list).
    nodes_seen: AtomicU64,
    stats: FleetStats,
    /// The rate limits' lease requests, for the fleet thread ([`limit`]).
    leases: tokio::sync::mpsc::Sender<qweb_config::LeaseRequest>,
    /// Ms after `epoch` until which the store counts as away for leases (one failed).
    lease_failed_until: AtomicU64,
    epoch: Instant,
    /// The running configuration has `scope = "fleet"` limits.
    has_limits: AtomicBool,
    cache: Arc<qweb_cache::Store>,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("store", &self.config.store_redacted())
            .field("node", &self.config.node_name)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A glob pattern (SCAN's MATCH) matching `s` literally.
fn glob_literal(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Why a session with the store ended.
enum Ended {
    /// The server is stopping.
    Stop,
    /// The store failed (it was up for a while when `was_up`).
    Lost { why: String, was_up: bool },
}

impl Fleet {
    /// Starts the fleet thread for `config`, applying received purges to `cache`; it stops
    /// when `shutdown` turns true (or its sender is dropped).
    pub(crate) fn start(
        config: FleetConfig,
        cache: Arc<qweb_cache::Store>,
        shutdown: watch::Receiver<bool>,
    ) -> std::io::Result<Arc<Fleet>> {
        let now = SystemTime::now();
        let (leases, lease_rx) = tokio::sync::mpsc::channel(limit::QUEUE);
        let fleet = Arc::new(Fleet {
            config,
            started: unix(now),
            conn: Mutex::new(None),
            health: Mutex::new(Health {
                up: false,
                since: now,
            }),
            up: AtomicBool::new(false),
            nodes: Mutex::new(Vec::new()),
            nodes_seen: AtomicU64::new(0),
            stats: FleetStats::default(),
            leases,
            lease_failed_until: AtomicU64::new(0),
            epoch: Instant::now(),
            has_limits: AtomicBool::new(false),
            cache,
        });
        let f = fleet.clone();
        std::thread::Builder::new()
            .name("qweb-fleet".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::error!("fleet: cannot start its runtime: {e}");
                        return;
                    }
                };
                rt.block_on(async {
                    tokio::spawn(limit::serve(f.clone(), lease_rx));
                    f.run(shutdown).await;
                });
            })?;
        Ok(fleet)
    }

    fn key(&self, rest: &str) -> String {
        format!("{}{rest}", self.config.key_prefix)
    }

    fn channel(&self) -> String {
        self.key("purge")
    }

    fn set_health(&self, up: bool) {
        let mut h = lock(&self.health);
        if h.up != up {
            *h = Health {
                up,
                since: SystemTime::now(),
            };
        }
        self.up.store(up, Relaxed);
    }

    async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let client = match redis::Client::open(self.config.store.as_str()) {
            Ok(c) => c,
            Err(e) => {
                self.stats.errors.fetch_add(1, Relaxed);
                tracing::error!(
                    store = %self.config.store_redacted(),
                    "fleet: the store's URL is not usable: {e}; the node runs alone"
                );
                return;
            }
        };
        if self.config.store.starts_with("rediss://") {
            // redis-rs builds its rustls client with the process's default provider: without
            // one (two are compiled in) that would panic at the first connection
            let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        }
        let mut backoff = BACKOFF_MIN;
        // logged once per outage: at the first failure, and again when the store is back
        let mut logged_down = false;
        loop {
            match self.session(&client, &mut shutdown).await {
                Ended::Stop => break,
                Ended::Lost { why, was_up } => {
                    self.stats.errors.fetch_add(1, Relaxed);
                    *lock(&self.conn) = None;
                    self.set_health(false);
                    if was_up {
                        backoff = BACKOFF_MIN;
                        logged_down = false;
                    }
                    if !logged_down {
                        tracing::warn!(
                            store = %self.config.store_redacted(),
                            "fleet: the store is unreachable ({why}); serving alone, retrying with backoff up to {BACKOFF_MAX:?}"
                        );
                        logged_down = true;
                    } else {
                        tracing::debug!("fleet: still unreachable ({why})");
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = stopped(&mut shutdown) => break,
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
        *lock(&self.conn) = None;
    }

    /// One connection to the store, until it fails or the server stops.
    async fn session(&self, client: &redis::Client, shutdown: &mut watch::Receiver<bool>) -> Ended {
        let t = self.config.timeout;
        let lost = |why: String| Ended::Lost { why, was_up: false };
        let cfg = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(t)
            .set_response_timeout(t);
        let mut conn =
            match bounded(t, client.get_multiplexed_async_connection_with_config(&cfg)).await {
                Ok(c) => c,
                Err(e) => return lost(e),
            };
        let mut pubsub = match bounded(t, client.get_async_pubsub()).await {
            Ok(p) => p,
            Err(e) => return lost(e),
        };
        if let Err(e) = bounded(t, pubsub.subscribe(self.channel())).await {
            return lost(e);
        }
        if let Err(e) = self.heartbeat(&mut conn).await {
            return lost(e);
        }
        *lock(&self.conn) = Some(conn.clone());
        self.set_health(true);
        tracing::info!(
            store = %self.config.store_redacted(),
            node = %self.config.node_name,
            "fleet: connected to the store"
        );
        let lost = |why: String| Ended::Lost { why, was_up: true };
        if let Err(e) = self.list_nodes(&mut conn).await {
            return lost(e);
        }
        let mut messages = pubsub.into_on_message();
        let mut tick = tokio::time::interval(HEARTBEAT_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = stopped(shutdown) => {
                    // leave the list at once (best effort, bounded)
                    let key = self.key(&format!("node:{}", self.config.node_name));
                    let _ = bounded(t, redis::cmd("DEL").arg(key).query_async::<()>(&mut conn)).await;
                    return Ended::Stop;
                }
                m = messages.next() => match m {
                    Some(msg) => self.received(&msg),
                    None => return lost("the subscription ended".into()),
                },
                _ = tick.tick() => {
                    if let Err(e) = self.heartbeat(&mut conn).await {
                        return lost(e);
                    }
                    if let Err(e) = self.list_nodes(&mut conn).await {
                        return lost(e);
                    }
                }
            }
        }
    }

    async fn heartbeat(&self, conn: &mut MultiplexedConnection) -> Result<(), String> {
        let key = self.key(&format!("node:{}", self.config.node_name));
        let value = json!({
            "name": self.config.node_name,
            "started": self.started,
            "version": env!("CARGO_PKG_VERSION"),
            "pid": std::process::id(),
        })
        .to_string();
        bounded(
            self.config.timeout,
            redis::cmd("SET")
                .arg(key)
                .arg(value)
                .arg("EX")
                .arg(HEARTBEAT_TTL)
                .query_async::<()>(conn),
        )
        .await
    }

    /// Lists the nodes' heartbeats (SCAN over `{prefix}node:*`, then MGET), at most
    /// [`MAX_NODES`], each step bounded by `fleet.timeout`.
    async fn list_nodes(&self, conn: &mut MultiplexedConnection) -> Result<(), String> {
        let t = self.config.timeout;
        let pattern = format!("{}node:*", glob_literal(&self.config.key_prefix));
        let mut keys: Vec<String> = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, batch): (u64, Vec<String>) = bounded(
                t,
                redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(256)
                    .query_async(conn),
            )
            .await?;
            keys.extend(batch);
            cursor = next;
            if cursor == 0 || keys.len() >= MAX_NODES {
                break;
            }
        }
        keys.sort();
        keys.dedup();
        keys.truncate(MAX_NODES);
        let mut nodes = Vec::with_capacity(keys.len());
        if !keys.is_empty() {
            let values: Vec<Option<String>> =
                bounded(t, redis::cmd("MGET").arg(&keys).query_async(conn)).await?;
            let skip = self.key("node:").len();
            for (key, v) in keys.iter().zip(values) {
                let Some(v) = v else { continue };
                let mut node = serde_json::from_str::<Value>(&v)
                    .ok()
                    .filter(Value::is_object)
                    .unwrap_or_else(|| json!({}));
                if let Some(o) = node.as_object_mut() {
                    o.insert("name".into(), Value::from(key.get(skip..).unwrap_or("")));
                }
                nodes.push(node);
            }
        }
        self.nodes_seen
            .store(u64::try_from(nodes.len()).unwrap_or(u64::MAX), Relaxed);
        *lock(&self.nodes) = nodes;
        Ok(())
    }

    /// A message on the purge channel: applied unless this node sent it.
    fn received(&self, msg: &redis::Msg) {
        let Ok(payload) = msg.get_payload::<String>() else {
            self.stats.errors.fetch_add(1, Relaxed);
            return;
        };
        let Ok(v) = serde_json::from_str::<Value>(&payload) else {
            self.stats.errors.fetch_add(1, Relaxed);
            tracing::debug!("fleet: a purge message that is not JSON");
            return;
        };
        let field = |k: &str| v.get(k).and_then(Value::as_str);
        let (Some(kind), Some(value), Some(origin)) =
            (field("kind"), field("value"), field("origin"))
        else {
            self.stats.errors.fetch_add(1, Relaxed);
            return;
        };
        if origin == self.config.node_name {
            return;
        }
        let n = match kind {
            "url" => self.cache.invalidate(value),
            "prefix" => self.cache.purge_prefix(value),
            _ => {
                self.stats.errors.fetch_add(1, Relaxed);
                return;
            }
        };
        self.stats.received.fetch_add(1, Relaxed);
        tracing::info!(key = %value, kind, origin, purged = n, "fleet: cache purge from another node");
    }

    /// Publishes a purge this node made (`prefix`: of every key starting with `key`) to the
    /// other nodes; false when the store is down or did not answer within `fleet.timeout`.
    pub(crate) async fn publish_purge(&self, prefix: bool, key: &str) -> bool {
        let conn = lock(&self.conn).clone();
        let Some(mut conn) = conn else {
            self.stats.unpublished.fetch_add(1, Relaxed);
            return false;
        };
        let msg = json!({
            "kind": if prefix { "prefix" } else { "url" },
            "value": key,
            "origin": self.config.node_name,
        })
        .to_string();
        let r = bounded(
            self.config.timeout,
            redis::cmd("PUBLISH")
                .arg(self.channel())
                .arg(msg)
                .query_async::<i64>(&mut conn),
        )
        .await;
        match r {
            Ok(_) => {
                self.stats.published.fetch_add(1, Relaxed);
                true
            }
            Err(e) => {
                self.stats.errors.fetch_add(1, Relaxed);
                self.stats.unpublished.fetch_add(1, Relaxed);
                tracing::warn!("fleet: a purge was not published: {e}");
                false
            }
        }
    }

    /// The fleet's part of `/status.json`: this node, the store's health, the nodes seen.
    pub(crate) fn status(&self) -> Value {
        let h = *lock(&self.health);
        let nodes = lock(&self.nodes).clone();
        json!({
            "node": self.config.node_name,
            "store": self.config.store_redacted(),
            "connected": h.up,
            "since": unix(h.since),
            "down_since": if h.up { Value::Null } else { Value::from(unix(h.since)) },
            "nodes": nodes,
        })
    }
}

/// Resolves when `shutdown` turns true or its sender is gone.
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    loop {
        if *shutdown.borrow_and_update() {
            return;
        }
        if shutdown.changed().await.is_err() {
            return;
        }
    }
}

/// `fut` within `t`, its error as text.
pub(crate) async fn bounded<T>(
    t: Duration,
    fut: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> Result<T, String> {
    match tokio::time::timeout(t, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {t:?}")),
    }
}

/// `/metrics`: the fleet client's gauge and counters.
pub(crate) struct FleetCollector(pub Arc<Fleet>);

impl std::fmt::Debug for FleetCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("fleet collector")
    }
}

impl prometheus_client::collector::Collector for FleetCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> std::fmt::Result {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        let f = &self.0;
        let g = ConstGauge::new(i64::from(f.up.load(Relaxed)));
        g.encode(encoder.encode_descriptor(
            "qweb_fleet_store_up",
            "1 while the fleet's store (Redis) is connected, 0 while it is not.",
            None,
            g.metric_type(),
        )?)?;
        let away = !qweb_config::LeaseStore::available(&**f);
        let fallback = ConstGauge::new(i64::from(away && f.has_limits.load(Relaxed)));
        fallback.encode(encoder.encode_descriptor(
            "qweb_rate_limit_fleet_fallback",
            "1 while scope = \"fleet\" rate limits are decided by each node alone, at rate / nodes seen (the store away or failing leases), 0 while the store counts them.",
            None,
            fallback.metric_type(),
        )?)?;
        let s = &f.stats;
        let counters = [
            ("qweb_fleet_purges_published", "Cache purges of this node published to the fleet.", &s.published),
            ("qweb_fleet_purges_received", "Cache purges of other nodes applied here.", &s.received),
            ("qweb_fleet_purges_unpublished", "Cache purges of this node done locally only (the store down or silent).", &s.unpublished),
            ("qweb_fleet_rate_limit_leases", "Leases of scope = \"fleet\" rate limit permits asked of the store (one round trip each, off the workers).", &s.leases),
            ("qweb_fleet_rate_limit_lease_failures", "Leases of rate limit permits the store did not answer in time or answered with garbage.", &s.lease_failures),
            ("qweb_fleet_errors", "Failures of the fleet's store: connections lost or refused, answers late or malformed.", &s.errors),
            ("qweb_fleet_acme_refused", "ACME values of the fleet's store refused: they do not decrypt with this node's fleet.secret, or do not load (the node keeps its own copy).", &crate::runtime::tls::acme::FLEET_REFUSED),
        ];
        for (name, help, v) in counters {
            let c = ConstCounter::new(v.load(Relaxed));
            c.encode(encoder.encode_descriptor(name, help, None, c.metric_type())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::glob_literal;
    use std::sync::atomic::Ordering::Relaxed;
    use std::time::{Duration, Instant};

    #[test]
    fn a_rediss_store_needs_no_tls_provider_installed_beforehand() {
        // a peer that accepts and hangs up: the TLS client is built (the provider needed),
        // the handshake fails, the failure is counted (a panic would end the thread first)
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for c in l.incoming() {
                drop(c);
            }
        });
        let cache = qweb_cache::Store::new(crate::pipeline::cache::limits(
            &qweb_config::CacheConfig::default(),
        ));
        let (tx, rx) = tokio::sync::watch::channel(false);
        let config = qweb_config::FleetConfig::new(format!("rediss://{addr}/0"), "t");
        let f = super::Fleet::start(config, cache, rx).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while f.stats.errors.load(Relaxed) < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(f.stats.errors.load(Relaxed) >= 2);
        let _ = tx.send(true);
    }

    #[test]
    fn a_prefix_is_matched_literally() {
        assert_eq!(glob_literal("qweb:"), "qweb:");
        assert_eq!(glob_literal("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
