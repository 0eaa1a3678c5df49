//! ACME through the fleet's store (`[fleet]`, issue 40): the nodes share the account and the
//! certificates through Redis instead of a shared state folder, and one node at a time
//! orders a certificate under a lock with a time to live.
//!
//! Keys, under `{prefix}acme:{DIR}:` (`DIR` as in the state folder: the CA's hash):
//! - `account`: the account's credentials (JSON, its private key included);
//! - `cert:{NAME}`: the saved file of the site whose first name is `NAME` (the chain, then
//!   its private key; the chain alone when a key server holds the key);
//! - `lock:{NAME}`: the order lock, a random token of its holder: `SET NX PX` [`LOCK_TTL`],
//!   renewed every [`LOCK_RENEW`] by its holder only ([`RENEW`], compare and `PEXPIRE`),
//!   released by compare and `DEL`. A holder that dies loses it when the store's time to
//!   live ends; no node's clock decides anything.
//!
//! The account and certificate values are sealed with the fleet's secret ([`Seal::acme`]:
//! AES-256-GCM, a key of its own derived from `fleet.secret`, the value's key name as
//! additional data: a value moved under another key does not open). A value that does not
//! open or does not load is refused, counted ([`REFUSED`], `qweb_fleet_acme_refused`) and
//! left alone: the node keeps serving its own copy.
//!
//! After writing a certificate, its node publishes `DIR:NAME` on `{prefix}acme`; every node
//! subscribes ([`FleetStore::watch`], reconnecting with the fleet client's backoff) and reads
//! the store again when a message comes, when it (re)subscribes, and every [`POLL`]. What it
//! reads is written to the state folder, which stays the node's last copy: a node that
//! starts while the store is away serves it, and offers it to a store that comes back empty.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use tokio::sync::Notify;
use zeroize::Zeroizing;

use crate::runtime::fleet::{bounded, BACKOFF_MAX, BACKOFF_MIN};
use crate::runtime::tls::fleet_tickets::{release_lock, take_lock, Seal};

/// How long an order lock lives unless its holder renews it.
pub(crate) const LOCK_TTL: Duration = Duration::from_secs(60);
/// How often the holder of an order lock renews it.
pub(crate) const LOCK_RENEW: Duration = Duration::from_secs(20);
/// How often a node reads the store without a message (a fallback for missed ones).
pub(crate) const POLL: Duration = Duration::from_secs(60);

/// Values of the store refused (they do not open with this node's secret, or do not load),
/// by every ACME job of the process: `/metrics` `qweb_fleet_acme_refused`.
pub(crate) static REFUSED: AtomicU64 = AtomicU64::new(0);

/// `KEYS[1]`'s time to live set to `ARGV[2]` ms only while it holds `ARGV[1]`: 1 then, else 0.
pub(crate) const RENEW: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0";

/// Why the store did not give what was asked.
#[derive(Debug)]
#[non_exhaustive]
pub(crate) enum FleetError {
    /// The store did not answer, or failed.
    Store(String),
    /// The value under this key does not open with this node's secret (another secret, or
    /// tampered with, or not qweb's).
    Refused(String),
    /// No random bytes.
    Random,
}

impl std::fmt::Display for FleetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FleetError::Store(e) => write!(f, "the fleet's store: {e}"),
            FleetError::Refused(k) => write!(
                f,
                "`{k}` in the fleet's store does not decrypt with this node's fleet.secret (another secret, or tampered with)"
            ),
            FleetError::Random => f.write_str("no random bytes"),
        }
    }
}

/// An order lock this node holds in the store.
#[derive(Debug)]
pub(crate) struct OrderLock {
    key: String,
    token: String,
}

/// One CA's part of the fleet's store.
pub(crate) struct FleetStore {
    client: redis::Client,
    /// The connection while it works (a cheap handle to clone).
    conn: Mutex<Option<MultiplexedConnection>>,
    timeout: Duration,
    seal: Seal,
    /// `{prefix}acme:{DIR}:`.
    base: String,
    /// `{prefix}acme`.
    channel: String,
    node: String,
}

impl FleetStore {
    /// The store of `fleet` for the CA at `directory`; `None` without a secret or a usable
    /// URL (the configuration refuses both before).
    pub(crate) fn new(fleet: &qweb_config::FleetConfig, directory: &str) -> Option<FleetStore> {
        let secret = fleet.secret.as_ref()?;
        let client = redis::Client::open(fleet.store.as_str()).ok()?;
        if fleet.store.starts_with("rediss://") {
            let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        }
        let ca = super::store::ca_name(directory);
        Some(FleetStore {
            client,
            conn: Mutex::new(None),
            timeout: fleet.timeout,
            seal: Seal::acme(secret.bytes())?,
            base: format!("{}acme:{ca}:", fleet.key_prefix),
            channel: format!("{}acme", fleet.key_prefix),
            node: fleet.node_name.clone(),
        })
    }

    fn name(names: &[String]) -> &str {
        names.first().map_or("_", String::as_str)
    }

    /// The store key of the certificate of `names`.
    pub(crate) fn cert_key(&self, names: &[String]) -> String {
        format!("{}cert:{}", self.base, Self::name(names))
    }

    fn account_key(&self) -> String {
        format!("{}account", self.base)
    }

    fn lock_key(&self, names: &[String]) -> String {
        format!("{}lock:{}", self.base, Self::name(names))
    }

    async fn conn(&self) -> Result<MultiplexedConnection, FleetError> {
        if let Some(c) = self
            .conn
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
        {
            return Ok(c);
        }
        let cfg = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(self.timeout)
            .set_response_timeout(self.timeout);
        let c = bounded(
            self.timeout,
            self.client
                .get_multiplexed_async_connection_with_config(&cfg),
        )
        .await
        .map_err(FleetError::Store)?;
        *self.conn.lock().unwrap_or_else(PoisonError::into_inner) = Some(c.clone());
        Ok(c)
    }

    /// `cmd`'s answer, within `fleet.timeout`; a failure drops the connection, and on one
    /// made before (the store may have restarted since) `cmd` is tried once more on a new
    /// one. Every command here may be repeated: a lock taken twice answers "held" the
    /// second time and expires with its time to live.
    async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, FleetError> {
        let cached = self
            .conn
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some();
        match self.query_once(cmd).await {
            Err(FleetError::Store(_)) if cached => self.query_once(cmd).await,
            r => r,
        }
    }

    async fn query_once<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
    ) -> Result<T, FleetError> {
        let mut c = self.conn().await?;
        match bounded(self.timeout, cmd.query_async(&mut c)).await {
            Ok(v) => Ok(v),
            Err(e) => {
                *self.conn.lock().unwrap_or_else(PoisonError::into_inner) = None;
                Err(FleetError::Store(e))
            }
        }
    }

    /// The value under `key`, opened; [`FleetError::Refused`] (and counted) when it does
    /// not open.
    pub(crate) async fn get(&self, key: &str) -> Result<Option<Zeroizing<Vec<u8>>>, FleetError> {
        let v: Option<Vec<u8>> = self.query(redis::cmd("GET").arg(key)).await?;
        let Some(v) = v else { return Ok(None) };
        match self.seal.open(key, &v) {
            Ok(plain) => Ok(Some(plain)),
            Err(_) => {
                REFUSED.fetch_add(1, Relaxed);
                Err(FleetError::Refused(key.to_owned()))
            }
        }
    }

    /// Seals `plain` under `key` (`only_new`: unless the key exists); whether it was written.
    pub(crate) async fn put(
        &self,
        key: &str,
        plain: &[u8],
        only_new: bool,
    ) -> Result<bool, FleetError> {
        let value = self.seal.seal(key, plain).map_err(|_| FleetError::Random)?;
        let mut cmd = redis::cmd("SET");
        cmd.arg(key).arg(value);
        if only_new {
            cmd.arg("NX");
        }
        let r: Option<String> = self.query(&cmd).await?;
        Ok(r.is_some())
    }

    /// The account's credentials (JSON), if the store has them.
    pub(crate) async fn account(&self) -> Result<Option<Zeroizing<Vec<u8>>>, FleetError> {
        self.get(&self.account_key()).await
    }

    /// Saves the account's credentials (`only_new`: unless the store has some already);
    /// whether they were written.
    pub(crate) async fn save_account(
        &self,
        json: &[u8],
        only_new: bool,
    ) -> Result<bool, FleetError> {
        self.put(&self.account_key(), json, only_new).await
    }

    /// The saved file of `names` in the store, if any.
    pub(crate) async fn certificate(
        &self,
        names: &[String],
    ) -> Result<Option<Zeroizing<Vec<u8>>>, FleetError> {
        self.get(&self.cert_key(names)).await
    }

    /// Writes the saved file of `names` (`only_new`: unless the store has one) and, when
    /// written, tells the other nodes; whether it was written.
    pub(crate) async fn share(
        &self,
        names: &[String],
        file: &[u8],
        only_new: bool,
    ) -> Result<bool, FleetError> {
        if !self.put(&self.cert_key(names), file, only_new).await? {
            return Ok(false);
        }
        let msg = format!("{}{}", self.base, Self::name(names));
        let _: i64 = self
            .query(redis::cmd("PUBLISH").arg(&self.channel).arg(msg))
            .await?;
        Ok(true)
    }

    /// Takes the order lock of `names` for `ttl`; `None` while another node holds it.
    pub(crate) async fn lock(
        &self,
        names: &[String],
        ttl: Duration,
    ) -> Result<Option<OrderLock>, FleetError> {
        let mut random = [0u8; 16];
        aws_lc_rs::rand::fill(&mut random).map_err(|_| FleetError::Random)?;
        let hex: String = random.iter().map(|b| format!("{b:02x}")).collect();
        let lock = OrderLock {
            key: self.lock_key(names),
            token: format!("{}:{}:{hex}", self.node, std::process::id()),
        };
        let got: Option<String> = self
            .query(&take_lock(&lock.key, &lock.token, ms(ttl)))
            .await?;
        Ok(got.map(|_| lock))
    }

    /// Gives `lock` another `ttl` if this node still holds it: whether it does.
    pub(crate) async fn renew(&self, lock: &OrderLock, ttl: Duration) -> Result<bool, FleetError> {
        let n: i64 = self
            .query(
                redis::cmd("EVAL")
                    .arg(RENEW)
                    .arg(1)
                    .arg(&lock.key)
                    .arg(&lock.token)
                    .arg(ms(ttl)),
            )
            .await?;
        Ok(n == 1)
    }

    /// Releases `lock` if this node still holds it (best effort: else it expires).
    pub(crate) async fn release(&self, lock: OrderLock) {
        let r: Result<i64, _> = self.query(&release_lock(&lock.key, &lock.token)).await;
        if let Err(e) = r {
            tracing::debug!(lock = %lock.key, "ACME: the order lock was not released ({e}); it expires");
        }
    }

    /// Keeps `lock` renewed every `every` (for `ttl`); resolves when another node holds it
    /// (it expired while the store was away), with why. A renewal the store does not answer
    /// is tried again at the next tick: the lock lasts its time to live meanwhile.
    pub(crate) async fn hold(&self, lock: &OrderLock, every: Duration, ttl: Duration) -> String {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            match self.renew(lock, ttl).await {
                Ok(true) => {}
                Ok(false) => return format!("`{}` is no longer this node's", lock.key),
                Err(e) => {
                    tracing::warn!(lock = %lock.key, "ACME: the order lock was not renewed ({e}); trying again")
                }
            }
        }
    }

    /// Wakes `notify` whenever a node publishes on `{prefix}acme` and whenever the
    /// subscription is made (again: what was published meanwhile is read then); reconnects
    /// with the fleet client's backoff. Runs until its runtime stops.
    pub(crate) async fn watch(
        client: redis::Client,
        channel: String,
        timeout: Duration,
        notify: Arc<Notify>,
    ) {
        let mut backoff = BACKOFF_MIN;
        loop {
            let subscribed = async {
                let mut p = bounded(timeout, client.get_async_pubsub()).await?;
                bounded(timeout, p.subscribe(&channel)).await?;
                Ok::<_, String>(p)
            };
            match subscribed.await {
                Ok(p) => {
                    backoff = BACKOFF_MIN;
                    notify.notify_one();
                    let mut messages = p.into_on_message();
                    while messages.next().await.is_some() {
                        notify.notify_one();
                    }
                    tracing::debug!("ACME: the fleet's subscription ended; subscribing again");
                }
                Err(e) => tracing::debug!("ACME: no subscription to the fleet's store ({e})"),
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    /// What [`FleetStore::watch`] needs (it runs apart from the job that owns the store).
    pub(crate) fn watch_args(&self) -> (redis::Client, String, Duration) {
        (self.client.clone(), self.channel.clone(), self.timeout)
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl super::Job {
    /// The account's credentials: the store's (copied to the state folder), else those of
    /// the state folder (shared then: made before `[fleet]` was set); without `[fleet]`,
    /// the state folder's.
    pub(super) async fn account_json(&self) -> Result<Option<Zeroizing<Vec<u8>>>, String> {
        let local = self.store.account().map(Zeroizing::new);
        let Some(f) = &self.fleet else {
            return Ok(local);
        };
        if let Some(json) = f.account().await.map_err(|e| e.to_string())? {
            if local.as_ref().map(|l| &l[..]) != Some(&json[..]) {
                if let Err(e) = self.store.save_account(&json) {
                    tracing::warn!("ACME: the fleet's account not copied to the state folder: {e}");
                }
            }
            return Ok(Some(json));
        }
        let Some(json) = local else { return Ok(None) };
        if !f
            .save_account(&json, true)
            .await
            .map_err(|e| e.to_string())?
        {
            // another node shared one meanwhile
            return f.account().await.map_err(|e| e.to_string());
        }
        Ok(Some(json))
    }

    /// Saves a new account's credentials in the state folder and, with `[fleet]`, the store.
    pub(super) async fn save_account_json(&self, json: &[u8]) -> Result<(), String> {
        self.store.save_account(json).map_err(|e| e.to_string())?;
        if let Some(f) = &self.fleet {
            f.save_account(json, false)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// With `[fleet]`, puts the certificate just saved in the store and tells the other
    /// nodes (a failure is logged: this node serves it anyway, the others order theirs when
    /// the lock is free).
    pub(super) async fn share_saved(&self) {
        let (Some(f), Some(file)) = (&self.fleet, self.store.saved_bytes(&self.names)) else {
            return;
        };
        if let Err(e) = f.share(&self.names, &file, false).await {
            tracing::warn!(names = ?self.names, "ACME: the certificate is served here but not shared with the fleet: {e}");
        }
    }

    /// With `[fleet]`: the store's certificate written to the state folder when newer than
    /// the one there; when the store has none, the one there (if valid) offered to it (the
    /// store came back empty). Failures are logged; the state folder's copy stays.
    pub(super) async fn sync_from_fleet(&mut self) {
        let Some(f) = &self.fleet else { return };
        let keyless = self.keyless.as_ref().map(|k| &k.offload);
        match f.certificate(&self.names).await {
            Ok(Some(file)) => match self.store.adopt(&self.names, &file, keyless) {
                Ok(Some(_)) => {
                    tracing::debug!(names = ?self.names, "ACME: the fleet's certificate copied to the state folder");
                }
                Ok(None) => {}
                Err(e) => {
                    REFUSED.fetch_add(1, Relaxed);
                    tracing::warn!(names = ?self.names, key = %f.cert_key(&self.names), "ACME: the fleet's certificate does not load ({e}); refused, the state folder's copy stays");
                }
            },
            Ok(None) => {
                let valid = matches!(self.store.load(&self.names, keyless), Ok(Some(_)));
                let Some(file) = self.store.saved_bytes(&self.names).filter(|_| valid) else {
                    return;
                };
                match f.share(&self.names, &file, true).await {
                    Ok(true) => {
                        tracing::info!(names = ?self.names, "ACME: the fleet's store had no certificate; this node's copy offered to it")
                    }
                    Ok(false) => {}
                    Err(e) => tracing::debug!("ACME: {e}"),
                }
            }
            Err(e @ FleetError::Refused(_)) => {
                tracing::warn!(names = ?self.names, "ACME: {e}; refused, the state folder's copy stays");
            }
            Err(e) => {
                tracing::debug!(names = ?self.names, "ACME: serving the state folder's copy ({e})")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qweb_testkit::redis::RedisServer;

    const NAMES: &[&str] = &["a.test"];

    fn names() -> Vec<String> {
        NAMES.iter().map(|n| (*n).to_owned()).collect()
    }

    /// A node `node` of the fleet on `url` with the secret `byte` repeated.
    fn store(url: &str, node: &str, byte: u8) -> FleetStore {
        let mut c = qweb_config::FleetConfig::new(url, node);
        c.secret =
            Some(qweb_config::FleetSecret::from_hex(&format!("{byte:02x}").repeat(32)).unwrap());
        FleetStore::new(&c, "https://ca.test/directory").unwrap()
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    }

    /// One holder at a time; only the holder renews or releases; a lock its holder left
    /// (it died: no renewal, no release) expires by the store's clock and another node takes
    /// it, and the dead holder's renewal then fails (its `hold` ends).
    #[test]
    fn the_order_lock_is_exclusive_renewed_by_its_holder_and_taken_over_from_a_dead_one() {
        let r = RedisServer::start();
        let (a, b) = (store(&r.url(), "a", 1), store(&r.url(), "b", 1));
        let names = names();
        block_on(async {
            let ttl = Duration::from_millis(400);
            let la = a.lock(&names, ttl).await.unwrap().expect("free");
            assert!(b.lock(&names, ttl).await.unwrap().is_none(), "held");
            // another node's token neither renews nor releases it
            let fake = OrderLock {
                key: la.key.clone(),
                token: "b:1:00".into(),
            };
            assert!(!b.renew(&fake, LOCK_TTL).await.unwrap());
            b.release(fake).await;
            // the holder renews: it outlives its first time to live
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(a.renew(&la, Duration::from_secs(5)).await.unwrap());
            tokio::time::sleep(Duration::from_millis(400)).await;
            assert!(b.lock(&names, ttl).await.unwrap().is_none(), "renewed");
            let pttl: i64 = r
                .command(&["PTTL", &la.key])
                .trim_start_matches(':')
                .parse()
                .unwrap();
            assert!(pttl > 3000, "{pttl}");
            // released by its holder: free
            a.release(la).await;
            let lb = b.lock(&names, ttl).await.unwrap().expect("released");
            // b dies holding it (nothing renews it): it expires, a takes over
            std::mem::drop(lb);
            assert!(a.lock(&names, ttl).await.unwrap().is_none());
            tokio::time::sleep(Duration::from_millis(500)).await;
            let la = a.lock(&names, LOCK_TTL).await.unwrap().expect("expired");
            assert!(la.token.starts_with("a:"));
            // a holder whose lock another node took sees it at its next renewal
            let dead = OrderLock {
                key: la.key.clone(),
                token: "b:2:ff".into(),
            };
            let why = tokio::time::timeout(
                Duration::from_secs(2),
                b.hold(&dead, Duration::from_millis(50), LOCK_TTL),
            )
            .await
            .expect("hold ends");
            assert!(why.contains("no longer"), "{why}");
            // and a's hold keeps renewing
            let renewing = tokio::time::timeout(
                Duration::from_millis(300),
                a.hold(&la, Duration::from_millis(50), Duration::from_millis(200)),
            )
            .await;
            assert!(renewing.is_err(), "still held");
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(a.renew(&la, LOCK_TTL).await.unwrap(), "kept alive by hold");
        });
    }

    /// A sealed value opens with its key name and the fleet's secret only; another secret,
    /// a value moved under another key, garbage: refused and counted, never a panic. A store
    /// that is down is an error, not a hang.
    #[test]
    fn sealed_values_open_with_their_secret_only_and_garbage_is_refused_and_counted() {
        let r = RedisServer::start();
        let a = store(&r.url(), "a", 1);
        let other = store(&r.url(), "o", 2);
        let names = names();
        block_on(async {
            assert!(a.save_account(b"{\"id\":1}", true).await.unwrap());
            assert!(!a.save_account(b"{\"id\":2}", true).await.unwrap(), "NX");
            assert_eq!(&a.account().await.unwrap().unwrap()[..], b"{\"id\":1}");
            // the key's bytes are not in the store in the clear
            assert!(!r.command(&["GET", &a.account_key()]).contains("id"));
            let before = REFUSED.load(Relaxed);
            assert!(matches!(other.account().await, Err(FleetError::Refused(_))));
            assert!(REFUSED.load(Relaxed) > before);
            // moved under the certificate's key: does not open there
            let cert = a.cert_key(&names);
            r.command(&[
                "EVAL",
                "return redis.call('SET', KEYS[2], redis.call('GET', KEYS[1]))",
                "2",
                &a.account_key(),
                &cert,
            ]);
            let before = REFUSED.load(Relaxed);
            assert!(matches!(
                a.certificate(&names).await,
                Err(FleetError::Refused(_))
            ));
            for garbage in ["", "x", "garbage garbage garbage garbage"] {
                r.command(&["SET", &cert, garbage]);
                let e = a.certificate(&names).await.unwrap_err();
                assert!(e.to_string().contains("fleet.secret"), "{e}");
            }
            assert!(REFUSED.load(Relaxed) >= before + 4);
            // shared and read back
            assert!(a.share(&names, b"chain and key", false).await.unwrap());
            assert_eq!(
                &a.certificate(&names).await.unwrap().unwrap()[..],
                b"chain and key"
            );
            assert!(!a.share(&names, b"other", true).await.unwrap(), "NX");
        });
        drop(r);
        let down = store(
            &format!("redis://127.0.0.1:{}/0", qweb_testkit::free_port()),
            "d",
            1,
        );
        block_on(async {
            assert!(matches!(
                down.lock(&names, LOCK_TTL).await,
                Err(FleetError::Store(_))
            ));
            assert!(matches!(down.account().await, Err(FleetError::Store(_))));
        });
    }
}
