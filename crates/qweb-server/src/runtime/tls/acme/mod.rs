//! Automatic certificates: `acme = { ... }` on a `[[site]]` orders a certificate for the
//! site's `server_names` from an ACME CA (RFC 8555), keeps it in the state folder, serves it
//! on every TLS listener with `certificates` (or `tls = {}`) without a reload, and renews it
//! when a third of its lifetime is left (`renew_before`), retrying a failed order after
//! `retry_after`, doubling to 6 hours.
//!
//! Each configuration has one [`qweb_tls::Managed`], filled at start from the certificates
//! the state folder already holds (a restart or a reload serves them at once), and one thread
//! per site with `acme` that orders when the certificate is missing or due. A reload stops
//! those threads (an order in progress is abandoned; the new configuration's thread starts
//! over from the state folder).
//!
//! Nodes share certificates through their shared state folder (an `O_EXCL` lock file,
//! `store`), or, with `[fleet]`, through the fleet's store (`fleet`: a lock with a time to
//! live, the keys sealed with `fleet.secret`, a message to every node when a certificate is
//! written); the state folder stays each node's own last copy then.

mod client;
mod fleet;
mod order;
mod store;

pub(crate) use fleet::REFUSED as FLEET_REFUSED;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

use crate::config::{AcmeConfig, Config, MAX_ACME_RETRY};
use store::{Store, Stored};

/// Longest an order may take from start to certificate.
const ORDER_TIMEOUT: Duration = Duration::from_secs(300);

/// How often a node waiting for another node's order looks for its certificate.
const LOCK_POLL: Duration = Duration::from_secs(5);

/// One site's automatic certificate.
pub(crate) struct Job {
    names: Vec<String>,
    config: AcmeConfig,
    store: Store,
    managed: Arc<qweb_tls::Managed>,
    /// When to order: `None` at once (no usable certificate saved).
    due: Option<SystemTime>,
    /// `notAfter` of the certificate served (`None`: none yet).
    current: Option<SystemTime>,
    /// Another node holds the order lock (logged once).
    waiting: bool,
    /// Stops the OCSP fetcher of the certificate served (when dropped: the certificate was
    /// replaced, or this configuration).
    ocsp: Option<watch::Sender<bool>>,
    /// `key = "keyserver:ENGINE"`: the key server makes and keeps the key.
    keyless: Option<Keyless>,
    /// `[fleet]`: the account and certificates go through the fleet's store.
    fleet: Option<fleet::FleetStore>,
    /// The fleet's store was away at the last order lock (logged once).
    away: bool,
}

/// A certificate whose key only a key server holds.
pub(crate) struct Keyless {
    /// For the key's generation and the certificate request's signature.
    client: qweb_keyserver::client::ClientConfig,
    /// Signs handshakes with the key: the engine, with the policy of the first TLS listener
    /// that offloads to it (else sync, no fallback: there is no local key).
    offload: qweb_tls::KeyOffload,
}

/// The key server side of `acme`'s `key = "keyserver:ENGINE"`.
fn keyless(
    config: &Config,
    engine: &str,
    engines: &std::collections::HashMap<&str, Arc<dyn qweb_offload::Engine>>,
) -> Result<Keyless, String> {
    let k = config
        .offload
        .engines
        .iter()
        .find_map(|e| match &e.kind {
            crate::config::EngineKind::Keyserver(k) if e.name == engine => Some(k),
            _ => None,
        })
        .ok_or_else(|| format!("no keyserver engine `{engine}`"))?;
    let client = crate::runtime::tls::keyserver::keyserver_client(k).map_err(|e| e.to_string())?;
    let engine_ref = engines
        .get(engine)
        .cloned()
        .ok_or_else(|| format!("engine `{engine}` did not start"))?;
    let policy = config
        .listeners
        .iter()
        .filter_map(|l| l.offload.as_ref())
        .find(|o| o.engine == engine && o.policy.mode.offloads())
        .map(|o| o.policy)
        .unwrap_or(qweb_offload::Policy {
            mode: qweb_offload::Mode::Sync,
            fallback: qweb_offload::Fallback::Fail,
            timeout: k.timeout,
        });
    Ok(Keyless {
        client,
        offload: qweb_tls::KeyOffload {
            engine: engine_ref,
            policy,
        },
    })
}

/// The managed certificates of `config`'s sites with `acme` (those saved already are
/// installed) and their jobs; `None` when no site has `acme`.
pub(crate) fn prepare(
    config: &Config,
    engines: &std::collections::HashMap<&str, Arc<dyn qweb_offload::Engine>>,
) -> Option<(Arc<qweb_tls::Managed>, Vec<Job>)> {
    let managed = Arc::new(qweb_tls::Managed::default());
    let mut jobs = Vec::new();
    for site in &config.sites.sites {
        let Some(acme) = &site.acme else { continue };
        let store = Store::new(&config.state_dir, &acme.directory);
        let names = site.server_names.clone();
        let fleet = match &config.fleet {
            None => None,
            Some(f) => match fleet::FleetStore::new(f, &acme.directory) {
                Some(s) => Some(s),
                None => {
                    tracing::error!(names = ?names, "ACME with [fleet]: no `fleet.secret` or no usable `fleet.store`; no certificate is ordered");
                    continue;
                }
            },
        };
        let keyless = match acme
            .keyserver
            .as_deref()
            .map(|e| keyless(config, e, engines))
        {
            None => None,
            Some(Ok(k)) => Some(k),
            Some(Err(e)) => {
                tracing::error!(names = ?names, "ACME with a key server key: {e}; no certificate is ordered");
                continue;
            }
        };
        let (due, current, ocsp) = match store.load(&names, keyless.as_ref().map(|k| &k.offload)) {
            Ok(Some(saved)) => (
                Some(renew_at(acme, &saved)),
                Some(saved.not_after),
                staple(managed.install(&names, saved.key.clone())),
            ),
            Ok(None) => (None, None, None),
            Err(e) => {
                tracing::warn!(names = ?names, "the saved certificate does not load ({e}); ordering a new one");
                (None, None, None)
            }
        };
        jobs.push(Job {
            names,
            config: acme.clone(),
            store,
            managed: managed.clone(),
            due,
            current,
            waiting: false,
            ocsp,
            keyless,
            fleet,
            away: false,
        });
    }
    (!jobs.is_empty()).then_some((managed, jobs))
}

/// Keeps `holder` stapled when its certificate names an `http://` OCSP responder and its
/// chain holds the issuer (the same fetcher as `ocsp = "fetch"`, on a thread of its own);
/// the fetcher stops when the returned sender is dropped. Let's Encrypt's certificates name
/// no responder since 2025: then nothing is fetched.
fn staple(holder: Arc<qweb_tls::ocsp::OcspStaple>) -> Option<watch::Sender<bool>> {
    let (leaf, issuer) = holder.chain();
    let url = qweb_tls::ocsp::responder_url(leaf).ok().flatten()?;
    issuer?;
    let (tx, rx) = watch::channel(false);
    let spawned = std::thread::Builder::new()
        .name("qweb-acme-ocsp".into())
        .spawn(move || crate::runtime::tls::ocsp_fetch::run(holder, rx));
    match spawned {
        Ok(_) => {
            tracing::info!(%url, "stapling OCSP responses to an ACME certificate");
            Some(tx)
        }
        Err(e) => {
            tracing::warn!("no OCSP stapling for an ACME certificate: {e}");
            None
        }
    }
}

/// When `saved` is due for renewal.
fn renew_at(config: &AcmeConfig, saved: &Stored) -> SystemTime {
    let life = saved
        .not_after
        .duration_since(saved.not_before)
        .unwrap_or_default();
    let before = config.renew_before.unwrap_or(life / 3);
    saved
        .not_after
        .checked_sub(before)
        .unwrap_or(saved.not_before)
}

/// The order lock this node holds, if any.
enum Held {
    Folder(store::OrderLock),
    Fleet(fleet::OrderLock),
    None,
}

/// What the job does after its wait.
enum Wake {
    Stop,
    /// The certificate is due.
    Due,
    /// A certificate may be in the fleet's store (a message, a (re)subscription, the poll).
    Check,
}

/// Keeps the job's certificate ordered and fresh until `shutdown` (a thread of its own).
pub(crate) fn run(mut job: Job, shutdown: watch::Receiver<bool>) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("ACME: {e}");
            return;
        }
    };
    rt.block_on(async move {
        let notify = job.fleet.as_ref().map(|f| {
            let n = Arc::new(tokio::sync::Notify::new());
            let (client, channel, timeout) = f.watch_args();
            tokio::spawn(fleet::FleetStore::watch(client, channel, timeout, n.clone()));
            n
        });
        let mut backoff = job.config.retry_after;
        loop {
            if let Some(at) = job.due {
                match wait_until(at, shutdown.clone(), notify.as_deref()).await {
                    Wake::Stop => return,
                    Wake::Check => {
                        job.pick_up(SystemTime::now()).await;
                        continue;
                    }
                    Wake::Due => {}
                }
            }
            if job.pick_up(SystemTime::now()).await {
                continue;
            }
            // one node of those sharing the state folder (or the fleet) orders; the others
            // pick it up
            let Some(held) = job.lock().await else {
                job.due = Some(SystemTime::now() + LOCK_POLL);
                continue;
            };
            // read again under the fleet's lock: the node that held it may have written its
            // certificate just before letting go
            if matches!(held, Held::Fleet(_)) && job.pick_up(SystemTime::now()).await {
                job.release(held).await;
                continue;
            }
            job.waiting = false;
            let mut stop = shutdown.clone();
            let hold = async {
                match (&job.fleet, &held) {
                    (Some(f), Held::Fleet(l)) => f.hold(l, fleet::LOCK_RENEW, fleet::LOCK_TTL).await,
                    _ => std::future::pending().await,
                }
            };
            // `None`: told to stop
            let got = tokio::select! {
                r = tokio::time::timeout(ORDER_TIMEOUT, order::order(&job)) => {
                    Some(r.unwrap_or_else(|_| Err(format!("no certificate within {ORDER_TIMEOUT:?}"))))
                }
                why = hold => Some(Err(format!("the order lock was lost ({why}); another node may be ordering"))),
                _ = stop.wait_for(|s| *s) => None,
            };
            job.release(held).await;
            let Some(got) = got else { return };
            match got {
                Ok(saved) => {
                    job.issued(&saved);
                    backoff = job.config.retry_after;
                }
                Err(e) => {
                    tracing::warn!(names = ?job.names, "ACME order failed, next try in {backoff:?}: {e}");
                    job.due = Some(SystemTime::now() + backoff);
                    backoff = (backoff * 2).min(MAX_ACME_RETRY);
                }
            }
        }
    });
}

impl Job {
    /// Serves a certificate this node ordered.
    fn issued(&mut self, saved: &Stored) {
        let now = SystemTime::now();
        self.ocsp = staple(self.managed.install(&self.names, saved.key.clone()));
        self.current = Some(saved.not_after);
        let next = renew_at(&self.config, saved);
        tracing::info!(
            names = ?self.names,
            valid_until = %httpdate::fmt_http_date(saved.not_after),
            renew_at = %httpdate::fmt_http_date(next),
            "ACME certificate issued and served"
        );
        if next <= now {
            // a renewal window as long as the lifetime would order again at once
            tracing::warn!(names = ?self.names, "renew_before is not shorter than the certificate's lifetime: renewing every retry_after ({:?})", self.config.retry_after);
        }
        self.due = Some(next.max(now + self.config.retry_after));
    }

    /// The order lock (`Held::None`: the state folder's could not be made, ordering
    /// anyway); `None` while another node holds it, or while the fleet's store is away (no
    /// order without its lock: every node would order).
    async fn lock(&mut self) -> Option<Held> {
        let Some(f) = &self.fleet else {
            return match self.store.lock(&self.names) {
                Ok(Some(l)) => Some(Held::Folder(l)),
                Ok(None) => {
                    self.wait_for_other("the state folder");
                    None
                }
                Err(e) => {
                    tracing::warn!(names = ?self.names, "no order lock ({e}); ordering anyway");
                    Some(Held::None)
                }
            };
        };
        match f.lock(&self.names, fleet::LOCK_TTL).await {
            Ok(Some(l)) => {
                self.away = false;
                Some(Held::Fleet(l))
            }
            Ok(None) => {
                self.away = false;
                self.wait_for_other("the fleet's store");
                None
            }
            Err(e) => {
                if !self.away {
                    tracing::warn!(names = ?self.names, "ACME: no order lock from the fleet's store ({e}); not ordering until it answers (the certificate saved here is served)");
                    self.away = true;
                }
                None
            }
        }
    }

    fn wait_for_other(&mut self, shared: &str) {
        if !self.waiting {
            tracing::info!(names = ?self.names, "another node sharing {shared} is ordering this certificate; waiting for it");
            self.waiting = true;
        }
    }

    /// Lets go of `held`.
    async fn release(&self, held: Held) {
        match (held, &self.fleet) {
            (Held::Fleet(l), Some(f)) => f.release(l).await,
            // the lock file is removed when dropped
            (Held::Folder(l), _) => drop(l),
            (Held::Fleet(_) | Held::None, _) => {}
        }
    }

    /// Serves a certificate another node sharing the state folder (or the fleet's store)
    /// saved since, when it is not due itself; `true` then.
    async fn pick_up(&mut self, now: SystemTime) -> bool {
        self.sync_from_fleet().await;
        let keyless = self.keyless.as_ref().map(|k| &k.offload);
        let Ok(Some(saved)) = self.store.load(&self.names, keyless) else {
            return false;
        };
        let next = renew_at(&self.config, &saved);
        if Some(saved.not_after) == self.current || next <= now {
            return false;
        }
        self.ocsp = staple(self.managed.install(&self.names, saved.key.clone()));
        self.current = Some(saved.not_after);
        self.due = Some(next);
        self.waiting = false;
        let valid_until = httpdate::fmt_http_date(saved.not_after);
        if self.fleet.is_some() {
            tracing::info!(names = ?self.names, %valid_until, "ACME certificate picked up from the fleet's store (ordered by another node)");
        } else {
            tracing::info!(names = ?self.names, %valid_until, "ACME certificate picked up from the state folder (ordered by another node)");
        }
        true
    }
}

/// Sleeps until `at` (wall clock, checked at least hourly): [`Wake::Due`]; with the fleet's
/// `notify`, [`Wake::Check`] first when it is woken or after [`fleet::POLL`].
async fn wait_until(
    at: SystemTime,
    mut shutdown: watch::Receiver<bool>,
    notify: Option<&tokio::sync::Notify>,
) -> Wake {
    loop {
        let left = at
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO);
        if left.is_zero() {
            return if *shutdown.borrow() {
                Wake::Stop
            } else {
                Wake::Due
            };
        }
        let nap = match notify {
            Some(_) => left.min(fleet::POLL),
            None => left.min(Duration::from_secs(3600)),
        };
        let woken = async {
            match notify {
                Some(n) => n.notified().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(nap) => {
                if notify.is_some() && nap < left {
                    return Wake::Check;
                }
            }
            _ = woken => return Wake::Check,
            _ = shutdown.wait_for(|s| *s) => return Wake::Stop,
        }
    }
}
