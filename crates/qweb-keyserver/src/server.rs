//! The key server.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use qweb_offload::{KeyId, PoolConfig, PoolEngine};
use serde::Deserialize;
use tokio::sync::watch;

use crate::accept::AcceptErrors;
use crate::conn::serve_conn;
use crate::shutdown::stopped;
use crate::state::State;
pub use crate::state::{ConnLimits, ServerMetrics};

pub use crate::error::KeyserverError;
pub use crate::keys::load_keys;

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> KeyserverError {
    let what = what.into();
    move |source| KeyserverError::Io { what, source }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    keys: Vec<PathBuf>,
    generated_keys: Option<PathBuf>,
    threads: Option<usize>,
    queue: Option<usize>,
    max_answers_per_connection: Option<usize>,
    max_signing_per_connection: Option<usize>,
    frame_timeout: Option<String>,
    ticket_rotation: Option<String>,
    unix: Option<RawUnix>,
    tls: Option<RawTls>,
    admin: Option<RawAdmin>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUnix {
    path: PathBuf,
    allowed_uids: Option<Vec<u32>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    address: SocketAddr,
    cert: PathBuf,
    key: PathBuf,
    client_ca: PathBuf,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAdmin {
    address: SocketAddr,
}

/// A validated key server configuration.
#[derive(Debug, Clone)]
pub struct KeyserverConfig {
    /// PEM private keys.
    pub keys: Vec<PathBuf>,
    /// Where keys generated on request are kept (`None`: generation is off).
    pub generated_keys: Option<PathBuf>,
    /// Signing threads.
    pub threads: usize,
    /// Signing queue bound (beyond: `Overloaded`).
    pub queue: usize,
    /// Unix socket path and the peer uids allowed.
    pub unix: Option<(PathBuf, Vec<u32>)>,
    /// TCP address with mutual TLS: certificate, key, and the CA that client certificates
    /// must chain to.
    pub tls: Option<(SocketAddr, PathBuf, PathBuf, PathBuf)>,
    /// `/metrics` listener.
    pub admin: Option<SocketAddr>,
    /// Per-connection bounds: answers waiting, share of the signing pool, stall timeout.
    pub limits: ConnLimits,
    /// For measurement only: added to every answer.
    pub added_latency: Duration,
    /// How often the fleet's session ticket keys rotate (default 12 h).
    pub ticket_rotation: Duration,
}

/// Parses `"10s"`, `"500ms"`, `"2m"` (a whole number and a unit).
fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().ok()?;
    match unit.trim() {
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => n.checked_mul(60).map(Duration::from_secs),
        "h" => n.checked_mul(3600).map(Duration::from_secs),
        _ => None,
    }
}

impl KeyserverConfig {
    /// Reads and validates a configuration file; relative paths are relative to its folder.
    pub fn from_file(path: &Path) -> Result<Self, KeyserverError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| KeyserverError::Config(format!("{}: {e}", path.display())))?;
        let raw: RawConfig = toml::from_str(&text)
            .map_err(|e| KeyserverError::Config(format!("{}: {e}", path.display())))?;
        let base = path.parent().unwrap_or(Path::new("."));
        let abs = |p: &Path| base.join(p);
        if raw.keys.is_empty() && raw.generated_keys.is_none() {
            return Err(KeyserverError::Config(format!(
                "{}: key `keys`: at least one key is needed (or `generated_keys`)",
                path.display()
            )));
        }
        if raw.unix.is_none() && raw.tls.is_none() {
            return Err(KeyserverError::Config(format!(
                "{}: configure `[unix]` and/or `[tls]`",
                path.display()
            )));
        }
        let bad = |key: &str, why: &str| {
            KeyserverError::Config(format!("{}: key `{key}`: {why}", path.display()))
        };
        let defaults = ConnLimits::default();
        let at_least_one = |key: &str, v: Option<usize>, default: usize| match v {
            Some(0) => Err(bad(key, "must be at least 1")),
            Some(n) => Ok(n),
            None => Ok(default),
        };
        let frame_timeout = match &raw.frame_timeout {
            None => defaults.frame_timeout,
            Some(t) => match parse_duration(t) {
                Some(d) if !d.is_zero() => d,
                Some(_) => return Err(bad("frame_timeout", "must be more than zero")),
                None => {
                    return Err(bad(
                        "frame_timeout",
                        &format!("`{t}` is not a duration like \"10s\" or \"500ms\""),
                    ))
                }
            },
        };
        let ticket_rotation = match &raw.ticket_rotation {
            None => Duration::from_secs(12 * 3600),
            Some(t) => match parse_duration(t) {
                Some(d) if d >= Duration::from_secs(1) && d <= Duration::from_secs(84 * 3600) => d,
                _ => {
                    return Err(bad(
                        "ticket_rotation",
                        &format!("`{t}` is not a duration from \"1s\" to \"84h\""),
                    ))
                }
            },
        };
        let limits = ConnLimits {
            max_answers: at_least_one(
                "max_answers_per_connection",
                raw.max_answers_per_connection,
                defaults.max_answers,
            )?,
            max_signing: at_least_one(
                "max_signing_per_connection",
                raw.max_signing_per_connection,
                defaults.max_signing,
            )?,
            frame_timeout,
        };
        let me = rustix::process::getuid().as_raw();
        Ok(KeyserverConfig {
            keys: raw.keys.iter().map(|k| abs(k)).collect(),
            generated_keys: raw.generated_keys.as_deref().map(abs),
            threads: raw.threads.unwrap_or_else(|| {
                std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(1)
            }),
            queue: raw.queue.unwrap_or(4096).max(1),
            unix: raw
                .unix
                .map(|u| (abs(&u.path), u.allowed_uids.unwrap_or_else(|| vec![me]))),
            tls: raw
                .tls
                .map(|t| (t.address, abs(&t.cert), abs(&t.key), abs(&t.client_ca))),
            admin: raw.admin.map(|a| a.address),
            limits,
            added_latency: Duration::ZERO,
            ticket_rotation,
        })
    }
}

/// A running key server (for tests and for `qweb keyserver`).
pub struct RunningKeyserver {
    /// The TLS listener's bound address.
    pub tls_addr: Option<SocketAddr>,
    /// The admin listener's bound address.
    pub admin_addr: Option<SocketAddr>,
    /// Key ids served.
    pub key_ids: Vec<KeyId>,
    shutdown: watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RunningKeyserver {
    /// Stops accepting and closes connections.
    pub fn shutdown(mut self) {
        self.stop();
    }
    fn stop(&mut self) {
        let _ = self.shutdown.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for RunningKeyserver {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The next accepted connection of an accept loop; after a failed accept, pauses as
/// [`AcceptErrors`] says (so that EMFILE cannot spin the loop). `None`: shutdown.
async fn next_conn<T, F>(
    mut accept: impl FnMut() -> F,
    errors: &mut AcceptErrors,
    state: &State,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<T>
where
    F: std::future::Future<Output = std::io::Result<T>>,
{
    loop {
        let r = tokio::select! {
            r = accept() => r,
            _ = stopped(shutdown) => return None,
        };
        match r {
            Ok(conn) => {
                errors.succeeded();
                return Some(conn);
            }
            Err(e) => {
                let pause = errors.failed(&e, &state.metrics.accept_errors);
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = stopped(shutdown) => return None,
                }
            }
        }
    }
}

/// Starts the key server on background threads.
pub fn start(config: KeyserverConfig) -> Result<RunningKeyserver, KeyserverError> {
    let keys = load_keys(&config.keys)?;
    let key_ids: Vec<KeyId> = keys.keys().copied().collect();
    let pool = PoolEngine::new(
        "keyserver",
        PoolConfig {
            threads: config.threads,
            queue: config.queue,
            added_latency: config.added_latency,
            inject_failures: false,
        },
    )
    .map_err(io_err("cannot start signing threads"))?;
    let state = Arc::new(State {
        keys,
        pool,
        metrics: ServerMetrics::default(),
        limits: config.limits,
        tickets: crate::tickets::TicketKeyRing::new(config.ticket_rotation)
            .map_err(|e| KeyserverError::Config(format!("ticket keys: {e}")))?,
        generated: match &config.generated_keys {
            Some(d) => Some(crate::generated::Generated::open(d)?),
            None => None,
        },
    });

    // Bind everything before returning, so errors are reported and clients can connect.
    let unix = match &config.unix {
        Some((path, uids)) => {
            if let Ok(meta) = std::fs::symlink_metadata(path) {
                use std::os::unix::fs::FileTypeExt;
                if meta.file_type().is_socket() {
                    let _ = std::fs::remove_file(path);
                }
            }
            let l = std::os::unix::net::UnixListener::bind(path)
                .map_err(io_err(format!("cannot listen on {}", path.display())))?;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                .map_err(io_err(format!("cannot chmod {}", path.display())))?;
            l.set_nonblocking(true).map_err(io_err("unix socket"))?;
            Some((l, uids.clone()))
        }
        None => None,
    };
    let tls = match &config.tls {
        Some((addr, cert, key, ca)) => {
            let l = std::net::TcpListener::bind(addr)
                .map_err(io_err(format!("cannot listen on {addr}")))?;
            l.set_nonblocking(true).map_err(io_err("tcp socket"))?;
            Some((l, server_tls(cert, key, ca)?))
        }
        None => None,
    };
    let admin = match config.admin {
        Some(addr) => {
            let l = std::net::TcpListener::bind(addr)
                .map_err(io_err(format!("cannot listen on {addr}")))?;
            l.set_nonblocking(true).map_err(io_err("tcp socket"))?;
            Some(l)
        }
        None => None,
    };
    let tls_addr = tls.as_ref().and_then(|(l, _)| l.local_addr().ok());
    let admin_addr = admin.as_ref().and_then(|l| l.local_addr().ok());
    let (tx, rx) = watch::channel(false);
    let thread = std::thread::Builder::new()
        .name("qweb-keyserver".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!("key server runtime: {e}");
                    return;
                }
            };
            rt.block_on(serve(state, unix, tls, admin, rx));
        })
        .map_err(io_err("cannot start the key server thread"))?;
    Ok(RunningKeyserver {
        tls_addr,
        admin_addr,
        key_ids,
        shutdown: tx,
        thread: Some(thread),
    })
}

fn server_tls(
    cert: &Path,
    key: &Path,
    ca: &Path,
) -> Result<Arc<rustls::ServerConfig>, KeyserverError> {
    let provider = Arc::new(qweb_tls::provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in qweb_tls::load_certs(ca)? {
        roots
            .add(c)
            .map_err(|e| KeyserverError::Config(format!("{}: {e}", ca.display())))?;
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .map_err(|e| KeyserverError::Config(format!("client CA {}: {e}", ca.display())))?;
    let ck = qweb_tls::load_certified_key(cert, key, &provider)?;
    let resolver = qweb_tls::SniResolver::new(std::slice::from_ref(&ck))
        .ok_or_else(|| KeyserverError::Config("no certificate".into()))?;
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| KeyserverError::Config(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(resolver));
    Ok(Arc::new(cfg))
}

async fn serve(
    state: Arc<State>,
    unix: Option<(std::os::unix::net::UnixListener, Vec<u32>)>,
    tls: Option<(std::net::TcpListener, Arc<rustls::ServerConfig>)>,
    admin: Option<std::net::TcpListener>,
    shutdown: watch::Receiver<bool>,
) {
    let mut tasks = Vec::new();
    if let Some((l, uids)) = unix {
        match tokio::net::UnixListener::from_std(l) {
            Ok(l) => tasks.push(tokio::spawn(accept_unix(
                l,
                uids,
                state.clone(),
                shutdown.clone(),
            ))),
            Err(e) => tracing::error!("unix listener: {e}"),
        }
    }
    if let Some((l, cfg)) = tls {
        match tokio::net::TcpListener::from_std(l) {
            Ok(l) => tasks.push(tokio::spawn(accept_tls(
                l,
                cfg,
                state.clone(),
                shutdown.clone(),
            ))),
            Err(e) => tracing::error!("tcp listener: {e}"),
        }
    }
    if let Some(l) = admin {
        match tokio::net::TcpListener::from_std(l) {
            Ok(l) => tasks.push(tokio::spawn(crate::server::admin(
                l,
                state.clone(),
                shutdown.clone(),
            ))),
            Err(e) => tracing::error!("admin listener: {e}"),
        }
    }
    for t in tasks {
        let _ = t.await;
    }
}

async fn accept_unix(
    l: tokio::net::UnixListener,
    uids: Vec<u32>,
    state: Arc<State>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut errors = AcceptErrors::new("unix");
    loop {
        let accepted = next_conn(|| l.accept(), &mut errors, &state, &mut shutdown).await;
        let Some((stream, _)) = accepted else {
            return;
        };
        let uid = stream.peer_cred().map(|c| c.uid());
        match uid {
            Ok(uid) if uids.contains(&uid) => {
                tokio::spawn(serve_conn(stream, state.clone(), shutdown.clone()));
            }
            other => {
                state.metrics.rejected_connections.fetch_add(1, Relaxed);
                tracing::warn!("unix peer refused (uid {other:?} not allowed)");
            }
        }
    }
}

async fn accept_tls(
    l: tokio::net::TcpListener,
    cfg: Arc<rustls::ServerConfig>,
    state: Arc<State>,
    mut shutdown: watch::Receiver<bool>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
    let mut errors = AcceptErrors::new("tls");
    loop {
        let accepted = next_conn(|| l.accept(), &mut errors, &state, &mut shutdown).await;
        let Some((tcp, peer)) = accepted else {
            return;
        };
        let _ = tcp.set_nodelay(true);
        let (acceptor, state, shutdown) = (acceptor.clone(), state.clone(), shutdown.clone());
        tokio::spawn(async move {
            match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => serve_conn(tls, state, shutdown).await,
                Ok(Err(e)) => {
                    state.metrics.rejected_connections.fetch_add(1, Relaxed);
                    tracing::warn!(%peer, "TLS client refused: {e}");
                }
                Err(_) => {
                    state.metrics.rejected_connections.fetch_add(1, Relaxed);
                    tracing::warn!(%peer, "TLS handshake timed out");
                }
            }
        });
    }
}

/// `GET /metrics` of the key server.
/// Longest life of one admin connection: an idle client cannot hold its fd.
const ADMIN_CONNECTION_LIFETIME: Duration = Duration::from_secs(10);
/// Admin connections served at once; more are closed at once.
const ADMIN_MAX_CONNECTIONS: usize = 64;

async fn admin(l: tokio::net::TcpListener, state: Arc<State>, mut shutdown: watch::Receiver<bool>) {
    use std::convert::Infallible;
    let mut errors = AcceptErrors::new("admin");
    let admin_slots = Arc::new(tokio::sync::Semaphore::new(ADMIN_MAX_CONNECTIONS));
    loop {
        let accepted = next_conn(|| l.accept(), &mut errors, &state, &mut shutdown).await;
        let Some((stream, _)) = accepted else {
            return;
        };
        // bounded: at most ADMIN_MAX_CONNECTIONS at once, each for ADMIN_CONNECTION_LIFETIME
        let Ok(permit) = admin_slots.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let svc =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let body = if req.uri().path() == "/metrics" {
                        Ok(crate::metrics::render(&state))
                    } else {
                        Err(())
                    };
                    async move {
                        let resp = match body {
                            Ok(b) => http::Response::builder()
                                .header(
                                    "content-type",
                                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                                )
                                .body(http_body_util::Full::new(bytes::Bytes::from(b))),
                            Err(()) => http::Response::builder().status(404).body(
                                http_body_util::Full::new(bytes::Bytes::from_static(
                                    b"404 Not Found\n",
                                )),
                            ),
                        };
                        Ok::<_, Infallible>(resp.unwrap_or_default())
                    }
                });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
            let _ = tokio::time::timeout(ADMIN_CONNECTION_LIFETIME, conn).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> Result<KeyserverConfig, KeyserverError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ks.toml");
        std::fs::write(
            &path,
            format!("keys = [\"k.pem\"]\n{extra}\n[unix]\npath = \"ks.sock\"\n"),
        )
        .unwrap();
        KeyserverConfig::from_file(&path)
    }

    #[test]
    fn connection_limits_have_defaults_and_are_validated() {
        let c = config("").unwrap();
        assert_eq!(c.limits, ConnLimits::default());
        assert_eq!(c.limits.max_answers, 256);
        assert_eq!(c.limits.max_signing, 16);
        assert_eq!(c.limits.frame_timeout, Duration::from_secs(10));
        let c = config(
            "max_answers_per_connection = 8\nmax_signing_per_connection = 2\nframe_timeout = \"500ms\"",
        )
        .unwrap();
        assert_eq!(
            c.limits,
            ConnLimits {
                max_answers: 8,
                max_signing: 2,
                frame_timeout: Duration::from_millis(500)
            }
        );
        for (extra, want) in [
            (
                "max_answers_per_connection = 0",
                "ks.toml: key `max_answers_per_connection`: must be at least 1",
            ),
            (
                "max_signing_per_connection = 0",
                "ks.toml: key `max_signing_per_connection`: must be at least 1",
            ),
            (
                "frame_timeout = \"0s\"",
                "ks.toml: key `frame_timeout`: must be more than zero",
            ),
            (
                "frame_timeout = \"soon\"",
                "ks.toml: key `frame_timeout`: `soon` is not a duration",
            ),
            // a wrong type is located by line and column
            ("frame_timeout = 10", "line 2, column 17"),
            ("max_answers_per_connection = -1", "line 2"),
        ] {
            let e = config(extra).unwrap_err().to_string();
            assert!(e.contains(want), "{extra}: {e}");
        }
    }
}
