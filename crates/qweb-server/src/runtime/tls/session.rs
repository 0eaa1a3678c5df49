//! TLS session resumption of the listeners: each TLS listener's ticketer (local rotating
//! keys, a key file, or the fleet's keys from a key server), shared by every worker; the
//! threads that keep file and fleet keys fresh; the counters `/metrics` shows.

use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use qweb_tls::{HandshakeStats, SessionResumption, Ticketer};
use tokio::sync::watch;

use crate::config::{Config, EngineKind, ListenerConfig, TicketKeys};
use crate::runtime::error::ServerError;

/// One TLS listener's resumption state.
pub(crate) struct ListenerSession {
    /// Full and resumed handshakes.
    pub stats: Arc<HandshakeStats>,
    /// The listener's ticketer (`None`: resumption off).
    pub ticketer: Option<Arc<Ticketer>>,
    /// Fleet key fetches, when the keys come from a key server.
    pub fetch: Option<Arc<qweb_keyserver::tickets::FetchStats>>,
    /// Stapled certificates: a name (the first DNS name) and the staple.
    pub ocsp: Vec<(String, Arc<qweb_tls::ocsp::OcspStaple>)>,
    /// The settings this state was made for: a reload that keeps them keeps the ticketer
    /// and the session cache (see [`setup`]).
    pub settings: crate::config::SessionConfig,
    /// The TLS 1.2 session-id cache (or the no-cache storage).
    pub storage: Arc<dyn rustls::server::StoresServerSessions>,
}

/// What keeps a listener's keys, or a certificate's OCSP staple, fresh (started by
/// [`spawn`]).
pub(crate) enum Refresher {
    /// A ticket key file.
    KeyFile(PathBuf, Arc<Ticketer>),
    /// Fleet keys from a key server engine.
    Keyserver(
        String,
        qweb_keyserver::client::ClientConfig,
        Arc<Ticketer>,
        Arc<qweb_keyserver::tickets::FetchStats>,
    ),
    /// Fleet keys from the fleet's store.
    FleetRing(
        Box<crate::runtime::tls::fleet_tickets::FleetRing>,
        Arc<Ticketer>,
        Arc<qweb_keyserver::tickets::FetchStats>,
    ),
    /// An OCSP response file.
    Ocsp(PathBuf, Arc<qweb_tls::ocsp::OcspStaple>),
    /// OCSP responses fetched from the certificate's responder.
    OcspFetch(Arc<qweb_tls::ocsp::OcspStaple>),
    /// A site's certificate ordered and renewed from an ACME CA.
    Acme(Box<crate::runtime::tls::acme::Job>),
}

enum Refresh {
    File(PathBuf),
    Keyserver(String, qweb_keyserver::client::ClientConfig),
    FleetRing(Box<crate::runtime::tls::fleet_tickets::FleetRing>),
}

/// Staples the OCSP response files of `list` onto `certs` (same order). A response that
/// cannot be stapled (expired, for another certificate, malformed) is logged and the
/// certificate is served without a staple; the file is watched either way.
pub(crate) fn staple(
    list: &[crate::config::CertificateConfig],
    certs: &mut [qweb_tls::LoadedCert],
    refreshers: &mut Vec<Refresher>,
) {
    for (c, loaded) in list.iter().zip(certs.iter_mut()) {
        match &c.ocsp {
            None => {}
            Some(crate::config::OcspSource::File(path)) => {
                let holder = loaded.staple();
                load_ocsp(path, &holder);
                refreshers.push(Refresher::Ocsp(path.clone(), holder));
            }
            Some(crate::config::OcspSource::Fetch) => {
                refreshers.push(Refresher::OcspFetch(loaded.staple()));
            }
        }
    }
}

fn load_ocsp(path: &std::path::Path, holder: &qweb_tls::ocsp::OcspStaple) {
    let r = std::fs::read(path)
        .map_err(|e| e.to_string())
        .and_then(|der| {
            holder
                .set(der, SystemTime::now())
                .map_err(|e| e.to_string())
        });
    match r {
        Ok(_) => tracing::info!(file = %path.display(), "OCSP response stapled"),
        Err(e) => tracing::warn!(
            file = %path.display(),
            "OCSP response not stapled: {e}"
        ),
    }
}

/// Sets up listener `l`'s resumption on `sc`: its ticketer (fetching fleet keys once, here,
/// so that the first tickets are fleet-wide already when the key server answers).
///
/// `previous`: the same listener's state in the configuration a reload replaces. When its
/// resumption settings are unchanged, its local (or fleet) ticket keys and its TLS 1.2
/// session cache are kept, so that clients resume across a reload as they do between two
/// (nginx keeps its session cache across reloads too). Keys from a file are read again
/// (the same file gives the same keys).
pub(crate) fn setup(
    l: &ListenerConfig,
    config: &Config,
    certs: &[qweb_tls::LoadedCert],
    sc: &mut rustls::ServerConfig,
    previous: Option<&ListenerSession>,
) -> Result<(ListenerSession, Option<Refresher>), ServerError> {
    let s = &l.session;
    let previous = previous.filter(|p| p.settings == *s);
    let kept_ticketer = previous
        .filter(|_| !matches!(s.ticket_keys, TicketKeys::File(_)))
        .and_then(|p| p.ticketer.clone());
    let mut out = ListenerSession {
        stats: Arc::new(HandshakeStats::default()),
        ticketer: None,
        fetch: None,
        ocsp: certs
            .iter()
            .filter_map(|c| {
                let name = c.dns_names.first().cloned().unwrap_or_default();
                c.ocsp.clone().map(|o| (name, o))
            })
            .collect(),
        settings: s.clone(),
        storage: Arc::new(rustls::server::NoServerSessionStorage {}),
    };
    let mut refresh = None;
    let bad = |m: String| ServerError::Tickets(m);
    if s.resumption {
        let ticketer = match &s.ticket_keys {
            TicketKeys::Local => match kept_ticketer {
                Some(t) => t,
                None => Ticketer::local(s.ticket_rotation).map_err(|e| bad(e.to_string()))?,
            },
            TicketKeys::File(path) => {
                let keys = read_key_file(path)?;
                refresh = Some(Refresh::File(path.clone()));
                Ticketer::fixed(&keys, s.ticket_rotation).map_err(|e| bad(e.to_string()))?
            }
            TicketKeys::Keyserver(engine) => {
                let k = config
                    .offload
                    .engines
                    .iter()
                    .find_map(|e| match &e.kind {
                        EngineKind::Keyserver(k) if e.name == *engine => Some(k),
                        _ => None,
                    })
                    .ok_or_else(|| bad(format!("no keyserver engine `{engine}`")))?;
                let client = crate::runtime::tls::keyserver::keyserver_client(k)?;
                // local keys until the fleet's arrive (or the fleet keys the configuration
                // this one replaces had)
                let t = match kept_ticketer {
                    Some(t) => t,
                    None => Ticketer::local(s.ticket_rotation).map_err(|e| bad(e.to_string()))?,
                };
                let stats = Arc::new(qweb_keyserver::tickets::FetchStats::default());
                if let Err(e) = qweb_keyserver::tickets::fetch_blocking(&client, &t, &stats) {
                    tracing::warn!(
                        engine = %engine,
                        "ticket keys: no key server answers ({e}); local keys until one does"
                    );
                }
                out.fetch = Some(stats);
                refresh = Some(Refresh::Keyserver(engine.clone(), client));
                t
            }
            TicketKeys::Fleet => {
                let stats = Arc::new(qweb_keyserver::tickets::FetchStats::default());
                let mut ring = config
                    .fleet
                    .as_ref()
                    .and_then(|f| {
                        crate::runtime::tls::fleet_tickets::FleetRing::new(
                            f,
                            s.ticket_rotation,
                            stats.clone(),
                        )
                    })
                    .ok_or_else(
                        || bad("`ticket_keys = \"fleet\"`: no `fleet.secret`, or `fleet.store` is not usable".into()),
                    )?;
                // local keys until the fleet's arrive, as with a key server
                let t = match kept_ticketer {
                    Some(t) => t,
                    None => Ticketer::local(s.ticket_rotation).map_err(|e| bad(e.to_string()))?,
                };
                if let Err(e) = qweb_keyserver::tickets::fetch_blocking_from(&mut ring, &t, &stats)
                {
                    tracing::warn!(
                        "ticket keys: not from the fleet's store ({e}); local keys until they are"
                    );
                }
                // that connection lived on the start's runtime
                ring.disconnect();
                out.fetch = Some(stats);
                refresh = Some(Refresh::FleetRing(Box::new(ring)));
                t
            }
        };
        out.ticketer = Some(ticketer);
    }
    qweb_tls::apply_resumption(
        sc,
        &SessionResumption {
            enabled: s.resumption,
            cache_size: s.session_cache,
            ticketer: out.ticketer.clone(),
        },
    );
    if let Some(p) = previous {
        // the same cache: sessions cached before the reload resume after it
        sc.session_storage = p.storage.clone();
    }
    out.storage = sc.session_storage.clone();
    let refresher = match (refresh, &out.ticketer) {
        (Some(Refresh::File(p)), Some(t)) => Some(Refresher::KeyFile(p, t.clone())),
        (Some(Refresh::Keyserver(e, c)), Some(t)) => Some(Refresher::Keyserver(
            e,
            c,
            t.clone(),
            out.fetch.clone().unwrap_or_default(),
        )),
        (Some(Refresh::FleetRing(r)), Some(t)) => Some(Refresher::FleetRing(
            r,
            t.clone(),
            out.fetch.clone().unwrap_or_default(),
        )),
        _ => None,
    };
    Ok((out, refresher))
}

fn read_key_file(path: &std::path::Path) -> Result<Vec<qweb_tls::TicketKeyMaterial>, ServerError> {
    // the file's bytes are key material too: wiped once parsed
    let bytes = zeroize::Zeroizing::new(
        std::fs::read(path)
            .map_err(|e| ServerError::Tickets(format!("cannot read {}: {e}", path.display())))?,
    );
    qweb_tls::ticket::parse_key_file(&bytes)
        .map_err(|e| ServerError::Tickets(format!("{}: {e}", path.display())))
}

/// Starts the threads that keep key files and fleet keys fresh; they end on `shutdown`.
pub(crate) fn spawn(
    refreshers: Vec<Refresher>,
    shutdown: &watch::Receiver<bool>,
) -> Result<Vec<JoinHandle<()>>, ServerError> {
    let mut threads = Vec::new();
    for r in refreshers {
        let rx = shutdown.clone();
        let t = match r {
            Refresher::KeyFile(path, ticketer) => std::thread::Builder::new()
                .name("qweb-ticket-file".into())
                .spawn(move || {
                    watch_file(path, rx, |p| {
                        match read_key_file(p).and_then(|k| {
                            ticketer
                                .reload_fixed(&k)
                                .map_err(|e| ServerError::Tickets(e.to_string()))
                        }) {
                            Ok(()) => tracing::info!(file = %p.display(), "ticket keys reloaded"),
                            Err(e) => {
                                tracing::warn!("ticket keys not reloaded, the old keys stay: {e}")
                            }
                        }
                    })
                }),
            Refresher::Ocsp(path, holder) => std::thread::Builder::new()
                .name("qweb-ocsp-file".into())
                .spawn(move || watch_file(path, rx, |p| load_ocsp(p, &holder))),
            Refresher::OcspFetch(holder) => std::thread::Builder::new()
                .name("qweb-ocsp-fetch".into())
                .spawn(move || crate::runtime::tls::ocsp_fetch::run(holder, rx)),
            Refresher::Acme(job) => std::thread::Builder::new()
                .name("qweb-acme".into())
                .spawn(move || crate::runtime::tls::acme::run(*job, rx)),
            Refresher::Keyserver(engine, client, ticketer, fetch) => {
                qweb_keyserver::tickets::spawn_refresher(engine, client, ticketer, fetch, rx)
            }
            Refresher::FleetRing(ring, ticketer, fetch) => {
                qweb_keyserver::tickets::spawn_refresher_from(
                    "fleet".into(),
                    *ring,
                    ticketer,
                    fetch,
                    rx,
                )
            }
        };
        threads.push(t.map_err(ServerError::Thread)?);
    }
    Ok(threads)
}

/// Calls `changed` when the file changes (checked every second; nginx re-reads such files on
/// reload). For ticket keys: the new first key encrypts, the replaced one still decrypts; a
/// file that becomes unreadable or invalid is logged and the keys in use stay. For OCSP: the
/// new response is stapled once checked; a bad one is logged and the old one stays until its
/// own `nextUpdate`.
fn watch_file(
    path: PathBuf,
    mut shutdown: watch::Receiver<bool>,
    changed: impl Fn(&std::path::Path),
) {
    let stamp = |p: &PathBuf| {
        std::fs::metadata(p)
            .ok()
            .map(|m| (m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len()))
    };
    let mut last = stamp(&path);
    loop {
        // sleeps in small steps so that shutdown is prompt
        for _ in 0..10 {
            if *shutdown.borrow_and_update() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let now = stamp(&path);
        if now == last {
            continue;
        }
        last = now;
        changed(&path);
    }
}

/// A guard that stops a configuration's refresher threads when it is dropped (the
/// configuration was replaced by a reload, or the server stopped).
pub(crate) struct RefresherStop(watch::Sender<bool>);

impl RefresherStop {
    /// A guard and the receiver to hand to [`spawn`].
    pub(crate) fn new() -> (Self, watch::Receiver<bool>) {
        let (tx, rx) = watch::channel(false);
        (RefresherStop(tx), rx)
    }
}

impl Drop for RefresherStop {
    fn drop(&mut self) {
        self.0.send_replace(true);
    }
}

/// One TLS listener's session state for `/metrics`, labelled by its bound address.
pub(crate) type LabelledSession = (String, Arc<ListenerSession>);

/// The resumption and OCSP families of `/metrics`, read at each scrape; the listeners are
/// replaced on reload.
#[derive(Default)]
pub(crate) struct TlsSessionsCollector(std::sync::Mutex<Vec<LabelledSession>>);

impl std::fmt::Debug for TlsSessionsCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsSessionsCollector")
    }
}

impl TlsSessionsCollector {
    /// The TLS listeners of the configuration now in use.
    pub(crate) fn set(&self, sessions: Vec<LabelledSession>) {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = sessions;
    }
}

impl prometheus_client::collector::Collector for TlsSessionsCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> std::fmt::Result {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        use prometheus_client::metrics::MetricType;
        use std::sync::atomic::Ordering::Relaxed;
        let sessions = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if sessions.is_empty() {
            return Ok(());
        }
        let mut f = encoder.encode_descriptor(
            "qweb_tls_session_handshakes",
            "TLS handshakes by listener, version and kind (full or resumed).",
            None,
            MetricType::Counter,
        )?;
        for (label, s) in sessions.iter() {
            for (version, kind, n) in s.stats.rows() {
                let labels = [
                    ("listener", label.as_str()),
                    ("version", version),
                    ("kind", kind),
                ];
                ConstCounter::new(n).encode(f.encode_family(&labels)?)?;
            }
        }
        let mut f = encoder.encode_descriptor(
            "qweb_tls_ticket_key_age_seconds",
            "How long the listener's ticket encryption key has been in use.",
            None,
            MetricType::Gauge,
        )?;
        for (label, s) in sessions.iter() {
            if let Some(t) = &s.ticketer {
                let age = i64::try_from(t.key_age().as_secs()).unwrap_or(i64::MAX);
                ConstGauge::new(age).encode(f.encode_family(&[("listener", label.as_str())])?)?;
            }
        }
        let mut f = encoder.encode_descriptor(
            "qweb_tls_ticket_key_fetches",
            "Fleet ticket key fetches (from the key server or the fleet's store), by result.",
            None,
            MetricType::Counter,
        )?;
        for (label, s) in sessions.iter() {
            if let Some(fetch) = &s.fetch {
                let results = [
                    ("ok", &fetch.ok),
                    ("failed", &fetch.failed),
                    ("refused", &fetch.refused),
                ];
                for (result, n) in results {
                    let labels = [("listener", label.as_str()), ("result", result)];
                    ConstCounter::new(n.load(Relaxed)).encode(f.encode_family(&labels)?)?;
                }
            }
        }
        if sessions.iter().all(|(_, s)| s.ocsp.is_empty()) {
            return Ok(());
        }
        let now = SystemTime::now();
        let mut f = encoder.encode_descriptor(
            "qweb_tls_ocsp_staple_age_seconds",
            "Age (since thisUpdate) of the OCSP response stapled; absent while none is.",
            None,
            MetricType::Gauge,
        )?;
        for (label, s) in sessions.iter() {
            for (name, o) in &s.ocsp {
                if let Some(st) = o.status_at(now) {
                    let age = now.duration_since(st.this_update).unwrap_or_default();
                    let labels = [("listener", label.as_str()), ("cert", name.as_str())];
                    let age = i64::try_from(age.as_secs()).unwrap_or(i64::MAX);
                    ConstGauge::new(age).encode(f.encode_family(&labels)?)?;
                }
            }
        }
        let mut f = encoder.encode_descriptor(
            "qweb_tls_ocsp_failures",
            "OCSP responses refused (unreadable, malformed, expired, for another certificate).",
            None,
            MetricType::Counter,
        )?;
        for (label, s) in sessions.iter() {
            for (name, o) in &s.ocsp {
                let labels = [("listener", label.as_str()), ("cert", name.as_str())];
                ConstCounter::new(o.failures.load(Relaxed)).encode(f.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}
