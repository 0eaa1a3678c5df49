//! Fleet-wide session ticket keys.
//!
//! - [`TicketKeyRing`]: the key server's keys: previous, current and next, rotated every
//!   `ticket_rotation`; every authenticated client may ask for them (frame kinds 4 and 5,
//!   docs/KEYSERVER_PROTOCOL.md).
//! - [`fetch`], [`fetch_blocking`], [`spawn_refresher`]: qweb's side: ask a key server (the
//!   servers of a `keyserver` engine, in order, first answer wins) and install the keys in
//!   the listener's [`Ticketer`]. The refresher asks again every quarter period (at most
//!   every 5 minutes, at least every second); when no key server answers, the ticketer keeps
//!   its last keys for their time (and switches to the next key on time by itself), so
//!   tickets issued before keep resuming and full handshakes are unaffected; the keys still
//!   retire by their age, then the ticketer uses local keys until the key server answers
//!   (see `qweb_tls::ticket`).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use qweb_tls::{FleetKeys, Ticketer};
use tokio::sync::watch;

use crate::client::{ClientConfig, ClientError};
use crate::protocol::Frame;

/// The key server's ticket keys.
pub struct TicketKeyRing {
    rotation: Duration,
    state: Mutex<Ring>,
}

struct Ring {
    keys: FleetKeys,
    current_since: Instant,
}

impl std::fmt::Debug for TicketKeyRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TicketKeyRing")
            .field("rotation", &self.rotation)
            .finish_non_exhaustive()
    }
}

impl TicketKeyRing {
    /// Random keys, rotated every `rotation` (at least 1 s).
    pub fn new(rotation: Duration) -> Result<TicketKeyRing, qweb_tls::ticket::TicketError> {
        Ok(TicketKeyRing {
            rotation: rotation.max(Duration::from_secs(1)),
            state: Mutex::new(Ring {
                keys: FleetKeys::random(rotation.max(Duration::from_secs(1)))?,
                current_since: Instant::now(),
            }),
        })
    }

    /// The keys now (rotating first when a period is over).
    pub fn snapshot(&self) -> Result<FleetKeys, qweb_tls::ticket::TicketError> {
        let mut r = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        r.keys.current_age = now.duration_since(r.current_since);
        r.keys.advance()?;
        r.current_since = now.checked_sub(r.keys.current_age).unwrap_or(now);
        Ok(r.keys.clone())
    }
}

/// Asks one key server for the fleet's ticket keys (a connection of its own, closed after).
/// The ticket keys frame is wiped by `decode` as it is parsed.
pub async fn fetch(
    server: &crate::client::Endpoint,
    cfg: &ClientConfig,
) -> Result<FleetKeys, ClientError> {
    match crate::once::ask(server, cfg, &Frame::TicketKeysRequest { id: 1 }).await? {
        Frame::TicketKeys { keys, .. } => Ok(keys),
        _ => Err(ClientError::UnexpectedAnswer),
    }
}

/// The first answer of the engine's key servers, in order.
async fn fetch_any(cfg: &ClientConfig) -> Result<FleetKeys, String> {
    match crate::once::ask_any(cfg, &Frame::TicketKeysRequest { id: 1 }).await? {
        Frame::TicketKeys { keys, .. } => Ok(keys),
        _ => Err("the key server's answer is not ticket keys".into()),
    }
}

/// Fetch outcomes, for `/metrics`.
#[derive(Debug, Default)]
pub struct FetchStats {
    /// Successful fetches.
    pub ok: AtomicU64,
    /// Failed fetches (no key server answered, the store down).
    pub failed: AtomicU64,
    /// Values refused (the fleet's store: not decryptable with this node's secret, or
    /// tampered with).
    pub refused: AtomicU64,
}

/// One fetch at start, on a runtime of its own (qweb is not running yet). On failure the
/// ticketer keeps its local keys until the refresher gets the fleet's.
pub fn fetch_blocking(
    cfg: &ClientConfig,
    ticketer: &Ticketer,
    stats: &FetchStats,
) -> Result<(), String> {
    fetch_blocking_from(&mut Keyservers(cfg.clone()), ticketer, stats)
}

/// [`fetch_blocking`] from any [`KeySource`].
pub fn fetch_blocking_from<S: KeySource>(
    source: &mut S,
    ticketer: &Ticketer,
    stats: &FetchStats,
) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let keys = rt.block_on(source.fetch());
    install(keys, ticketer, stats)
}

fn install(
    keys: Result<FleetKeys, String>,
    ticketer: &Ticketer,
    stats: &FetchStats,
) -> Result<(), String> {
    match keys.and_then(|k| {
        ticketer
            .install_fleet(&k)
            .map_err(|e| e.to_string())
            .map(|_| k)
    }) {
        Ok(_) => {
            stats.ok.fetch_add(1, Relaxed);
            Ok(())
        }
        Err(e) => {
            stats.failed.fetch_add(1, Relaxed);
            Err(e)
        }
    }
}

/// Where a refresher gets the fleet's keys: the key servers of an engine, or the fleet's
/// store (the server's `ticket_keys = "fleet"`).
pub trait KeySource: Send + 'static {
    /// The refresher's warning when the keys stop coming (`"no key server answers"`): the
    /// line operators and tests look for, so each source keeps its own.
    const DOWN: &'static str;
    /// Its note when they come again (`"the key server answers again"`).
    const BACK: &'static str;
    /// The keys now, or why there are none.
    fn fetch(&mut self) -> impl std::future::Future<Output = Result<FleetKeys, String>>;
}

/// The key servers of an engine, in order, as a [`KeySource`].
pub struct Keyservers(pub ClientConfig);

impl KeySource for Keyservers {
    const DOWN: &'static str = "no key server answers";
    const BACK: &'static str = "the key server answers again";
    async fn fetch(&mut self) -> Result<FleetKeys, String> {
        fetch_any(&self.0).await
    }
}

/// Keeps `ticketer` on the fleet's keys from the key servers of `cfg` until `shutdown`; a
/// thread of its own.
pub fn spawn_refresher(
    name: String,
    cfg: ClientConfig,
    ticketer: Arc<Ticketer>,
    stats: Arc<FetchStats>,
    shutdown: watch::Receiver<bool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    spawn_refresher_from(name, Keyservers(cfg), ticketer, stats, shutdown)
}

/// Keeps `ticketer` on the keys of `source` until `shutdown`, on a thread of its own (one
/// current-thread runtime): asked every quarter period (1 s to 5 min), every second while
/// it fails; while it fails the ticketer keeps its last keys and retires them by age.
pub fn spawn_refresher_from<S: KeySource>(
    name: String,
    mut source: S,
    ticketer: Arc<Ticketer>,
    stats: Arc<FetchStats>,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("qweb-ticket-keys".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!("ticket key refresher: {e}");
                    return;
                }
            };
            rt.block_on(async move {
                let mut healthy = true;
                let mut wait = Duration::from_secs(1);
                loop {
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = crate::shutdown::stopped(&mut shutdown) => return,
                    }
                    // a request stuck on a hanging source ends with the stop too, not up
                    // to the source's timeout later (installing, after a reload, keys
                    // its successor has replaced)
                    let got = tokio::select! {
                        got = source.fetch() => got,
                        _ = crate::shutdown::stopped(&mut shutdown) => return,
                    };
                    let rotation = got.as_ref().map(|k| k.rotation).ok();
                    match install(got, &ticketer, &stats) {
                        Ok(()) => {
                            if !healthy {
                                tracing::info!(source = %name, "ticket keys: {}", S::BACK);
                            }
                            healthy = true;
                            let every = rotation.unwrap_or(Duration::from_secs(4)) / 4;
                            wait = every.clamp(Duration::from_secs(1), Duration::from_secs(300));
                        }
                        Err(e) => {
                            if healthy {
                                tracing::warn!(source = %name, "ticket keys: {} ({e}); resuming with the last keys for their time", S::DOWN);
                            }
                            healthy = false;
                            wait = Duration::from_secs(1);
                        }
                    }
                }
            });
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_rotates_and_keeps_the_previous_key() {
        // what the ring replaces is dropped, and so wiped (tested on the type in qweb-tls)
        fn wiped_on_drop<T: zeroize::ZeroizeOnDrop>(_: &T) {}
        let ring = TicketKeyRing::new(Duration::from_secs(1)).unwrap();
        let a = ring.snapshot().unwrap();
        wiped_on_drop(&a.current);
        assert!(a.previous.is_none());
        assert!(a.next_in <= Duration::from_secs(1));
        std::thread::sleep(Duration::from_millis(1100));
        let b = ring.snapshot().unwrap();
        assert_eq!(b.previous.as_ref(), Some(&a.current));
        assert_eq!(b.current, a.next);
        assert_ne!(b.next, a.next);
        std::thread::sleep(Duration::from_millis(3100));
        let c = ring.snapshot().unwrap();
        // idle past two periods: all new
        assert!(c.previous.is_none());
        assert_ne!(c.current, b.current);
        assert_ne!(c.current, b.next);
    }

    fn client(servers: Vec<crate::client::Endpoint>) -> ClientConfig {
        ClientConfig {
            servers,
            connections: 1,
            max_in_flight: 16,
            timeout: Duration::from_secs(1),
            tls: None,
        }
    }

    fn keyserver(dir: &std::path::Path, rotation: Duration) -> crate::server::RunningKeyserver {
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let key = dir.join("k.pem");
        std::fs::write(&key, kp.serialize_pem()).unwrap();
        crate::server::start(crate::server::KeyserverConfig {
            generated_keys: None,
            keys: vec![key],
            threads: 1,
            queue: 16,
            unix: Some((
                dir.join("ks.sock"),
                vec![rustix::process::getuid().as_raw()],
            )),
            tls: None,
            admin: None,
            limits: Default::default(),
            added_latency: Duration::ZERO,
            ticket_rotation: rotation,
        })
        .unwrap()
    }

    #[test]
    fn two_ticketers_get_the_same_keys_from_a_key_server() {
        let dir = tempfile::tempdir().unwrap();
        let _ks = keyserver(dir.path(), Duration::from_secs(3600));
        let cfg = client(vec![
            // a dead server first: the next one answers
            crate::client::Endpoint::Unix(dir.path().join("nobody.sock")),
            crate::client::Endpoint::Unix(dir.path().join("ks.sock")),
        ]);
        let stats = FetchStats::default();
        let a = Ticketer::local(Duration::from_secs(3600)).unwrap();
        let b = Ticketer::local(Duration::from_secs(3600)).unwrap();
        let t = rustls::server::ProducesTickets::encrypt(&*a, b"state").unwrap();
        assert_eq!(rustls::server::ProducesTickets::decrypt(&*b, &t), None);
        fetch_blocking(&cfg, &a, &stats).unwrap();
        fetch_blocking(&cfg, &b, &stats).unwrap();
        assert_eq!(a.current_key_name(), b.current_key_name());
        let t = rustls::server::ProducesTickets::encrypt(&*a, b"state").unwrap();
        assert_eq!(
            rustls::server::ProducesTickets::decrypt(&*b, &t).unwrap(),
            b"state"
        );
        assert_eq!(stats.ok.load(Relaxed), 2);
    }

    /// Hostile key servers: one that answers garbage, one that never answers, one that
    /// closes at once. Each is an error in bounded time; nothing is installed.
    #[test]
    fn lying_stalling_and_vanishing_key_servers_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let answers: [(&str, &[u8]); 3] = [
            (
                "garbage.sock",
                &[0, 0, 0, 12, 2, 5, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0],
            ),
            ("stall.sock", &[]),
            ("close.sock", b"x"),
        ];
        let mut listeners = Vec::new();
        for (name, _) in &answers {
            listeners.push(std::os::unix::net::UnixListener::bind(dir.path().join(name)).unwrap());
        }
        let ticketer = Ticketer::local(Duration::from_secs(3600)).unwrap();
        let before = ticketer.current_key_name();
        for ((name, answer), l) in answers.iter().zip(listeners) {
            let answer = answer.to_vec();
            let stall = answer.is_empty();
            std::thread::spawn(move || {
                use std::io::{Read, Write};
                if let Ok((mut s, _)) = l.accept() {
                    let mut b = [0u8; 64];
                    let _ = s.read(&mut b);
                    let _ = s.write_all(&answer);
                    if stall {
                        std::thread::sleep(Duration::from_secs(5));
                    }
                }
            });
            let cfg = client(vec![crate::client::Endpoint::Unix(dir.path().join(name))]);
            let started = Instant::now();
            let r = rt.block_on(fetch_any(&cfg));
            assert!(r.is_err(), "{name}: {r:?}");
            assert!(started.elapsed() < Duration::from_secs(4), "{name}");
            let stats = FetchStats::default();
            assert!(install(r, &ticketer, &stats).is_err());
            assert_eq!(stats.failed.load(Relaxed), 1);
        }
        assert_eq!(ticketer.current_key_name(), before);
    }

    #[test]
    fn ticket_rotation_has_a_default_and_is_validated() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("ks.toml");
        let parse = |extra: &str| {
            std::fs::write(
                &file,
                format!("keys = [\"k.pem\"]\n{extra}[unix]\npath = \"ks.sock\"\n"),
            )
            .unwrap();
            crate::server::KeyserverConfig::from_file(&file)
        };
        assert_eq!(
            parse("").unwrap().ticket_rotation,
            Duration::from_secs(12 * 3600)
        );
        assert_eq!(
            parse("ticket_rotation = \"2s\"\n").unwrap().ticket_rotation,
            Duration::from_secs(2)
        );
        for bad in ["0s", "85h", "soon"] {
            let e = parse(&format!("ticket_rotation = \"{bad}\"\n"))
                .unwrap_err()
                .to_string();
            assert!(e.contains("key `ticket_rotation`"), "{bad}: {e}");
        }
    }

    /// A fake key server on the other end of a pipe reads the request, then answers with
    /// `answer` (or closes without answering).
    async fn ask_fake(answer: Option<Frame>) -> Result<FleetKeys, ClientError> {
        use bytes::BytesMut;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (client, mut server) = tokio::io::duplex(4096);
        let fake = async move {
            let mut buf = BytesMut::new();
            let req = loop {
                if let Some(f) = Frame::decode(&mut buf).expect("a valid request") {
                    break f;
                }
                assert!(server.read_buf(&mut buf).await.expect("read") > 0);
            };
            assert_eq!(req, Frame::TicketKeysRequest { id: 1 });
            if let Some(a) = answer {
                let mut out = BytesMut::new();
                a.encode(&mut out);
                server.write_all(&out).await.expect("write");
            }
            // dropped here: the pipe closes
        };
        let ask = crate::once::exchange(client, &Frame::TicketKeysRequest { id: 1 });
        let (got, ()) = tokio::join!(ask, fake);
        match got? {
            Frame::TicketKeys { keys, .. } => Ok(keys),
            _ => Err(ClientError::UnexpectedAnswer),
        }
    }

    #[tokio::test]
    async fn a_key_server_refusal_is_the_refused_variant() {
        let refusal = Frame::Error {
            id: 1,
            code: crate::protocol::ErrorCode::Internal,
            message: "no ticket keys here".into(),
        };
        match ask_fake(Some(refusal)).await {
            Err(ClientError::Refused { code, message }) => {
                assert_eq!(code, crate::protocol::ErrorCode::Internal);
                assert_eq!(message, "no ticket keys here");
            }
            other => panic!("{:?}", other.err()),
        }
        // the same, seen through io::Error: the typed error is its source
        let e = std::io::Error::from(
            ask_fake(Some(Frame::Error {
                id: 1,
                code: crate::protocol::ErrorCode::Overloaded,
                message: String::new(),
            }))
            .await
            .expect_err("an error"),
        );
        let inner = e.get_ref().and_then(|s| s.downcast_ref::<ClientError>());
        assert!(matches!(inner, Some(ClientError::Refused { .. })), "{e:?}");
    }

    #[tokio::test]
    async fn a_wrong_answer_or_none_are_their_variants() {
        let wrong = Frame::Response {
            id: 1,
            signature: vec![1, 2, 3],
        };
        let e = ask_fake(Some(wrong)).await.expect_err("an error");
        assert!(matches!(e, ClientError::UnexpectedAnswer), "{e:?}");
        let e = ask_fake(None).await.expect_err("an error");
        assert!(matches!(e, ClientError::Closed), "{e:?}");
    }

    #[tokio::test]
    async fn a_tls_key_server_without_client_tls_is_not_configured() {
        let cfg = ClientConfig {
            servers: vec![],
            connections: 1,
            max_in_flight: 1,
            timeout: Duration::from_secs(1),
            tls: None,
        };
        let ep = crate::client::Endpoint::parse("tls://127.0.0.1:1").expect("an endpoint");
        let e = fetch(&ep, &cfg).await.expect_err("an error");
        assert!(matches!(e, ClientError::TlsNotConfigured), "{e:?}");
    }
}
