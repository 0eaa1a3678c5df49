//! The `keyserver` offload engine: qweb's client of one or more key servers.
//!
//! The engine runs its own thread (a current-thread tokio runtime). [`Engine::submit`] never
//! blocks: it hands submissions to that thread over a channel. There, a dispatcher sends each
//! op on a live connection (round-robin over servers and connections); every connection keeps
//! its requests in flight by id and completes them as answers arrive, in any order. Dead
//! connections reconnect with exponential backoff (100 ms to 5 s). When a connection dies
//! with requests in flight, each is retried once on another server when several are
//! configured, else failed. Ops older than the engine timeout (waiting for a connection or
//! for their answer) are failed, so nothing waits forever.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use qweb_offload::{Engine, EngineMetrics, Op, OpError, OpOutput, Submission};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::protocol::{ErrorCode, Frame};

/// Where a key server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A Unix socket path.
    Unix(PathBuf),
    /// TCP with mutual TLS.
    Tls {
        /// `host:port`.
        addr: String,
        /// Name to verify the server certificate against.
        server_name: String,
    },
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
            Endpoint::Tls { addr, .. } => write!(f, "tls://{addr}"),
        }
    }
}

impl Endpoint {
    /// Parses `unix:/path` or `tls://host:port`.
    pub fn parse(s: &str) -> Result<Endpoint, String> {
        if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err("`unix:` needs a path".into());
            }
            return Ok(Endpoint::Unix(PathBuf::from(p)));
        }
        if let Some(a) = s.strip_prefix("tls://") {
            let host = a
                .rsplit_once(':')
                .map(|(h, _)| h.trim_matches(|c| c == '[' || c == ']'))
                .filter(|h| !h.is_empty())
                .ok_or_else(|| format!("`{s}`: expected tls://host:port"))?;
            return Ok(Endpoint::Tls {
                addr: a.to_owned(),
                server_name: host.to_owned(),
            });
        }
        Err(format!(
            "`{s}`: a key server is `unix:/path` or `tls://host:port`"
        ))
    }
}

/// Parameters of a [`KeyserverEngine`].
#[derive(Clone)]
pub struct ClientConfig {
    /// Key servers.
    pub servers: Vec<Endpoint>,
    /// Connections per server.
    pub connections: usize,
    /// Most ops submitted and not completed; more are refused (saturation).
    pub max_in_flight: usize,
    /// An op not answered within this is failed (the caller falls back or fails).
    pub timeout: Duration,
    /// TLS client configuration (with the client certificate) for `tls://` servers.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

struct Pending {
    sub: Submission,
    retried: bool,
    server: usize,
}

impl Pending {
    /// Older than the engine timeout, or nobody waits for it any more.
    fn expired(&self, now: Instant, timeout: Duration) -> bool {
        now.duration_since(self.sub.submitted_at) >= timeout || !self.sub.completer.is_wanted()
    }
}

/// The engine.
pub struct KeyserverEngine {
    name: String,
    tx: mpsc::UnboundedSender<Submission>,
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

struct Shared {
    metrics: EngineMetrics,
    in_flight: AtomicI64,
    max_in_flight: i64,
    /// Connections up now.
    connected: AtomicI64,
    /// Per server (as configured): its name and its connections up now.
    servers: Vec<(String, AtomicI64)>,
}

impl KeyserverEngine {
    /// Starts the engine's thread; connections are made in the background.
    pub fn new(name: impl Into<String>, cfg: ClientConfig) -> std::io::Result<Self> {
        let name = name.into();
        let shared = Arc::new(Shared {
            metrics: EngineMetrics::default(),
            in_flight: AtomicI64::new(0),
            max_in_flight: cfg.max_in_flight.max(1) as i64,
            connected: AtomicI64::new(0),
            servers: cfg
                .servers
                .iter()
                .map(|ep| (ep.to_string(), AtomicI64::new(0)))
                .collect(),
        });
        let (tx, rx) = mpsc::unbounded_channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("qweb-engine-{name}"))
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::error!("keyserver engine runtime: {e}");
                        return;
                    }
                };
                let local = tokio::task::LocalSet::new();
                local.block_on(&rt, async move {
                    tokio::select! {
                        _ = run(cfg, rx, s) => {}
                        _ = stop_rx => {}
                    }
                });
            })?;
        Ok(KeyserverEngine {
            name,
            tx,
            shared,
            thread: Some(thread),
            stop: Some(stop_tx),
        })
    }

    /// Connections up now (for tests and metrics).
    pub fn connected(&self) -> i64 {
        self.shared.connected.load(Relaxed)
    }
}

impl Drop for KeyserverEngine {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Engine for KeyserverEngine {
    fn name(&self) -> &str {
        &self.name
    }

    fn submit(&self, batch: Vec<Submission>) -> Vec<Submission> {
        let s = &self.shared;
        let mut rejected = Vec::new();
        let mut accepted = 0;
        for sub in batch {
            if s.in_flight.load(Relaxed) >= s.max_in_flight {
                rejected.push(sub);
                continue;
            }
            s.in_flight.fetch_add(1, Relaxed);
            if let Err(e) = self.tx.send(sub) {
                s.in_flight.fetch_sub(1, Relaxed);
                rejected.push(e.0);
            } else {
                accepted += 1;
            }
        }
        if accepted > 0 {
            s.metrics.on_submit(accepted);
        }
        if !rejected.is_empty() {
            s.metrics
                .saturated
                .fetch_add(rejected.len() as u64, Relaxed);
        }
        rejected
    }

    fn metrics(&self) -> &EngineMetrics {
        &self.shared.metrics
    }

    fn servers_up(&self) -> Vec<(String, bool)> {
        self.shared
            .servers
            .iter()
            .map(|(name, up)| (name.clone(), up.load(Relaxed) > 0))
            .collect()
    }
}

/// A live connection as the dispatcher sees it.
struct ConnHandle {
    server: usize,
    tx: mpsc::UnboundedSender<Pending>,
}

struct Dispatcher {
    conns: RefCell<Vec<Rc<ConnHandle>>>,
    next: Cell<usize>,
    backlog: RefCell<VecDeque<Pending>>,
    shared: Arc<Shared>,
    servers: usize,
}

impl Dispatcher {
    /// Ends an op: counted once (completed, failed, timed out, or cancelled when its
    /// waiter left; not at all here when its waiter already gave up and counted it).
    fn complete(&self, p: Pending, result: Result<OpOutput, OpError>) {
        self.shared.in_flight.fetch_sub(1, Relaxed);
        self.shared
            .metrics
            .finish(p.sub.completer, result, p.sub.submitted_at);
    }

    /// Sends `p` on a live connection, preferring a server other than `avoid`.
    fn dispatch(&self, mut p: Pending, avoid: Option<usize>) {
        let conns = self.conns.borrow();
        if conns.is_empty() {
            drop(conns);
            self.backlog.borrow_mut().push_back(p);
            return;
        }
        let n = conns.len();
        let start = self.next.get();
        self.next.set(start.wrapping_add(1));
        let pick = (0..n)
            .map(|i| &conns[(start + i) % n])
            .find(|c| Some(c.server) != avoid)
            .unwrap_or(&conns[start % n]);
        p.server = pick.server;
        if let Err(e) = pick.tx.send(p) {
            drop(conns);
            self.backlog.borrow_mut().push_back(e.0);
        }
    }

    fn flush_backlog(&self) {
        let items: Vec<Pending> = self.backlog.borrow_mut().drain(..).collect();
        for p in items {
            self.dispatch(p, None);
        }
    }

    fn expire_backlog(&self, timeout: Duration) {
        let now = Instant::now();
        let mut expired = Vec::new();
        {
            let mut b = self.backlog.borrow_mut();
            let mut keep = VecDeque::new();
            while let Some(p) = b.pop_front() {
                if p.expired(now, timeout) {
                    expired.push(p);
                } else {
                    keep.push_back(p);
                }
            }
            *b = keep;
        }
        for p in expired {
            self.complete(p, Err(OpError::Timeout));
        }
    }

    /// A connection died with these requests in flight: retry each once on another server
    /// (when there are several), else fail it.
    fn orphaned(&self, pending: Vec<Pending>) {
        for mut p in pending {
            if !p.retried && self.servers > 1 && p.sub.completer.is_wanted() {
                p.retried = true;
                let avoid = p.server;
                self.dispatch(p, Some(avoid));
            } else {
                self.complete(p, Err(OpError::Failed("key server connection lost".into())));
            }
        }
    }
}

async fn run(cfg: ClientConfig, mut rx: mpsc::UnboundedReceiver<Submission>, shared: Arc<Shared>) {
    let d = Rc::new(Dispatcher {
        conns: RefCell::new(Vec::new()),
        next: Cell::new(0),
        backlog: RefCell::new(VecDeque::new()),
        shared,
        servers: cfg.servers.len(),
    });
    for (server, ep) in cfg.servers.iter().enumerate() {
        for _ in 0..cfg.connections.max(1) {
            tokio::task::spawn_local(connection_manager(
                server,
                ep.clone(),
                cfg.clone(),
                d.clone(),
            ));
        }
    }
    let mut sweep = tokio::time::interval(Duration::from_millis(50));
    loop {
        tokio::select! {
            sub = rx.recv() => match sub {
                Some(sub) => d.dispatch(Pending { sub, retried: false, server: usize::MAX }, None),
                None => return,
            },
            _ = sweep.tick() => d.expire_backlog(cfg.timeout),
        }
    }
}

/// Keeps one connection to `ep` up: connect, serve, reconnect with backoff.
async fn connection_manager(server: usize, ep: Endpoint, cfg: ClientConfig, d: Rc<Dispatcher>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match connect(&ep, &cfg).await {
            Ok(stream) => {
                backoff = Duration::from_millis(100);
                let (tx, rx) = mpsc::unbounded_channel();
                let handle = Rc::new(ConnHandle { server, tx });
                d.conns.borrow_mut().push(handle.clone());
                d.shared.connected.fetch_add(1, Relaxed);
                if let Some((_, up)) = d.shared.servers.get(server) {
                    up.fetch_add(1, Relaxed);
                }
                tracing::info!(server = %ep, "connected to key server");
                d.flush_backlog();
                let leftover = match stream {
                    Stream::Unix(s) => serve(s, rx, &d, cfg.timeout).await,
                    Stream::Tls(s) => serve(*s, rx, &d, cfg.timeout).await,
                };
                d.conns.borrow_mut().retain(|c| !Rc::ptr_eq(c, &handle));
                d.shared.connected.fetch_sub(1, Relaxed);
                if let Some((_, up)) = d.shared.servers.get(server) {
                    up.fetch_sub(1, Relaxed);
                }
                tracing::warn!(server = %ep, in_flight = leftover.len(), "key server connection lost");
                d.orphaned(leftover);
            }
            Err(e) => {
                tracing::debug!(server = %ep, "cannot connect to key server: {e}");
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// Why qweb could not get an answer from a key server (connecting, or asking it for the
/// fleet's ticket keys).
///
/// Converts into an [`std::io::Error`] that carries this error as its source (an I/O error
/// converts as itself), so a caller holding only the `io::Error` can still downcast it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// Connecting (and for `tls://`, the TLS handshake) took longer than 5 s.
    #[error("connect timed out")]
    ConnectTimeout,
    /// A `tls://` key server, but no client certificate, key and CA to reach it with.
    #[error("a tls:// key server needs client_cert, client_key and server_ca")]
    TlsNotConfigured,
    /// The `tls://` endpoint's server name is not a DNS name or an IP address.
    #[error("invalid key server name: {0}")]
    ServerName(#[source] rustls::pki_types::InvalidDnsNameError),
    /// The key server did not answer within the engine's timeout (at least 1 s).
    #[error("no answer in time")]
    AnswerTimeout,
    /// The key server refused the request with an error frame.
    #[error("key server refused: {code:?}: {message}")]
    Refused {
        /// Why, as the key server coded it.
        code: ErrorCode,
        /// The key server's details.
        message: String,
    },
    /// The key server answered with a well-formed frame that does not answer the request.
    #[error("key server: unexpected answer")]
    UnexpectedAnswer,
    /// The key server's bytes are not valid frames.
    #[error("key server: {0}")]
    Protocol(#[from] crate::protocol::ProtocolError),
    /// The key server closed the connection before answering.
    #[error("key server closed the connection before answering")]
    Closed,
    /// Reading from or writing to the connection failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl From<ClientError> for std::io::Error {
    fn from(e: ClientError) -> std::io::Error {
        use std::io::ErrorKind;
        let kind = match e {
            ClientError::Io(io) => return io,
            ClientError::ConnectTimeout | ClientError::AnswerTimeout => ErrorKind::TimedOut,
            ClientError::ServerName(_) => ErrorKind::InvalidInput,
            ClientError::Protocol(_) => ErrorKind::InvalidData,
            ClientError::Closed => ErrorKind::UnexpectedEof,
            _ => ErrorKind::Other,
        };
        std::io::Error::new(kind, e)
    }
}

pub(crate) enum Stream {
    Unix(tokio::net::UnixStream),
    Tls(Box<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>),
}

pub(crate) async fn connect(ep: &Endpoint, cfg: &ClientConfig) -> Result<Stream, ClientError> {
    let limit = Duration::from_secs(5);
    match ep {
        Endpoint::Unix(p) => Ok(
            tokio::time::timeout(limit, tokio::net::UnixStream::connect(p))
                .await
                .map_err(|_| ClientError::ConnectTimeout)?
                .map(Stream::Unix)?,
        ),
        Endpoint::Tls { addr, server_name } => {
            let tls = cfg.tls.clone().ok_or(ClientError::TlsNotConfigured)?;
            let name = rustls::pki_types::ServerName::try_from(server_name.clone())
                .map_err(ClientError::ServerName)?;
            let fut = async {
                let tcp = tokio::net::TcpStream::connect(addr.as_str()).await?;
                let _ = tcp.set_nodelay(true);
                tokio_rustls::TlsConnector::from(tls)
                    .connect(name, tcp)
                    .await
            };
            let s = tokio::time::timeout(limit, fut)
                .await
                .map_err(|_| ClientError::ConnectTimeout)??;
            Ok(Stream::Tls(Box::new(s)))
        }
    }
}

/// Runs one connection until it fails; returns the requests still in flight.
async fn serve<S>(
    stream: S,
    mut rx: mpsc::UnboundedReceiver<Pending>,
    d: &Dispatcher,
    timeout: Duration,
) -> Vec<Pending>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (mut rd, mut wr) = tokio::io::split(stream);
    let mut in_flight: HashMap<u64, Pending> = HashMap::new();
    let mut next_id: u64 = 1;
    let mut buf = BytesMut::with_capacity(8 * 1024);
    let mut out = BytesMut::new();
    let mut sweep = tokio::time::interval(Duration::from_millis(50));
    loop {
        tokio::select! {
            p = rx.recv() => {
                let Some(p) = p else { break };
                let mut batch = vec![p];
                while let Ok(p) = rx.try_recv() {
                    batch.push(p);
                }
                for p in batch {
                    let Op::Sign(op) = &p.sub.op else {
                        d.complete(p, Err(OpError::Failed("a key server engine only signs".into())));
                        continue;
                    };
                    let id = next_id;
                    next_id += 1;
                    Frame::Request { id, scheme: op.scheme, key: op.key.id, message: op.message.clone() }.encode(&mut out);
                    in_flight.insert(id, p);
                }
                if wr.write_all(&out).await.is_err() {
                    break;
                }
                out.clear();
            }
            n = rd.read_buf(&mut buf) => {
                match n {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                loop {
                    match Frame::decode(&mut buf) {
                        Ok(Some(Frame::Response { id, signature })) => {
                            if let Some(p) = in_flight.remove(&id) {
                                d.complete(p, Ok(OpOutput::Signature(signature)));
                            }
                        }
                        Ok(Some(Frame::Error { id, code, message })) => {
                            if let Some(p) = in_flight.remove(&id) {
                                let what = match code {
                                    ErrorCode::UnknownKey => "unknown key",
                                    ErrorCode::BadRequest => "bad request",
                                    ErrorCode::Internal => "internal error",
                                    ErrorCode::Overloaded => "overloaded",
                                };
                                d.complete(p, Err(OpError::Failed(format!("key server: {what}: {message}"))));
                            }
                        }
                        Ok(Some(_)) | Err(_) => {
                            tracing::warn!("key server sent a malformed frame; reconnecting");
                            return in_flight.into_values().collect();
                        }
                        Ok(None) => break,
                    }
                }
            }
            _ = sweep.tick() => {
                let now = Instant::now();
                let expired: Vec<u64> = in_flight
                    .iter()
                    .filter(|(_, p)| p.expired(now, timeout))
                    .map(|(id, _)| *id)
                    .collect();
                for id in expired {
                    if let Some(p) = in_flight.remove(&id) {
                        d.complete(p, Err(OpError::Timeout));
                    }
                }
            }
        }
    }
    // whatever the dispatcher queued on this connection but was not sent yet
    rx.close();
    let mut left: Vec<Pending> = in_flight.into_values().collect();
    while let Ok(p) = rx.try_recv() {
        left.push(p);
    }
    left
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse() {
        assert_eq!(
            Endpoint::parse("unix:/run/ks.sock").unwrap(),
            Endpoint::Unix("/run/ks.sock".into())
        );
        assert_eq!(
            Endpoint::parse("tls://keys.example:9443").unwrap(),
            Endpoint::Tls {
                addr: "keys.example:9443".into(),
                server_name: "keys.example".into()
            }
        );
        assert!(Endpoint::parse("http://x").is_err());
        assert!(Endpoint::parse("unix:").is_err());
        assert!(Endpoint::parse("tls://nohost").is_err());
    }
}
