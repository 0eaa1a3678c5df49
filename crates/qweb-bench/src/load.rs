//! The load generator: many client connections on a multi-threaded tokio runtime, every
//! response checked, results over a measured window after a warm-up.
//!
//! Two modes:
//! - [`Mode::Handshake`]: each connection does connect → full TLS handshake (the client has no
//!   session cache and no tickets, and every connection's handshake kind is checked to be
//!   `Full`) → optionally one request → close, then starts over. Measures handshakes/s. Without
//!   a request the client sends close_notify and waits for the server to close, so the server
//!   has processed the whole handshake before the next one starts.
//! - [`Mode::Keepalive`]: each connection is opened once and sends requests back to back (or
//!   paced at `--rate`, latency then measured from the scheduled send time so a stalled server
//!   is not hidden). Measures requests/s, body bytes/s and latency percentiles.
//!
//! Client sockets close with `SO_LINGER` 0 so thousands of short connections leave no
//! TIME_WAIT entries behind to exhaust the ephemeral ports.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_LENGTH, HOST};
use http::{Request, Uri};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::stats::{summarize, LatencySummary};
use crate::tls::{
    client_config_signing, resuming_configs, HttpVersion, SignatureTally, TlsVersion,
};
use crate::{Error, Result};

mod quic;
mod spec;
pub use spec::{ErrorCounts, LoadReport, LoadSpec, Mode};

/// The parsed target.
#[derive(Debug, Clone)]
struct Target {
    addr: SocketAddr,
    server_name: ServerName<'static>,
    authority: String,
    path: String,
    uri: Uri,
}

fn parse_target(url: &str) -> Result<Target> {
    let uri: Uri = url
        .parse()
        .map_err(|e| Error::Arg(format!("URL {url:?}: {e}")))?;
    if uri.scheme_str() != Some("https") {
        return Err(Error::Arg(format!(
            "URL {url:?}: only https:// is supported"
        )));
    }
    let auth = uri
        .authority()
        .ok_or_else(|| Error::Arg(format!("URL {url:?}: no host")))?
        .clone();
    let host = auth.host().trim_start_matches('[').trim_end_matches(']');
    let port = auth.port_u16().unwrap_or(443);
    let addr = (host, port)
        .to_socket_addrs()
        .map_err(|e| Error::io(format!("resolve {host}"), e))?
        .next()
        .ok_or_else(|| Error::Arg(format!("URL {url:?}: {host} resolves to nothing")))?;
    let server_name = ServerName::try_from(host.to_string())
        .map_err(|e| Error::Arg(format!("URL {url:?}: server name: {e}")))?;
    let path = uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    Ok(Target {
        addr,
        server_name,
        authority: auth.as_str().to_string(),
        path,
        uri,
    })
}

/// State shared by all connection tasks of a run.
struct Shared {
    spec: LoadSpec,
    target: Target,
    /// `--also` targets; new connections go round-robin over `target` and these.
    others: Vec<Target>,
    next_target: AtomicU64,
    /// Offers no session (with --resume-ratio: stores what it gets).
    connector: TlsConnector,
    /// With --resume-ratio: offers a stored session.
    resume_connector: Option<TlsConnector>,
    /// With --rsa-only-ratio: offers only RSA signature schemes.
    rsa_connector: Option<TlsConnector>,
    /// With --http 3: the QUIC client configuration (same verifier and tally).
    quic: Option<quinn::ClientConfig>,
    /// Server signatures verified, by algorithm.
    tally: Arc<SignatureTally>,
    start: Instant,
    warmup_end: Instant,
    /// End of the measured window (far away in count mode).
    end: Instant,
    /// Count mode: operations still to measure.
    tickets: Option<AtomicI64>,
    /// Count mode: nanoseconds since `start` of the last counted completion.
    last_done: AtomicU64,
    stop: AtomicBool,
    timeout: Duration,
}

impl Shared {
    /// The target of the next new connection: round-robin over `target` and `--also`.
    fn next(&self) -> &Target {
        if self.others.is_empty() {
            return &self.target;
        }
        let i = self.next_target.fetch_add(1, Relaxed) as usize % (self.others.len() + 1);
        match i {
            0 => &self.target,
            _ => &self.others[i - 1],
        }
    }
}

#[derive(Default)]
struct TaskStats {
    samples: Vec<u64>,
    ops: u64,
    handshakes: u64,
    handshakes_all: u64,
    resumed: u64,
    resumed_all: u64,
    resume_asked: u64,
    requests: u64,
    bytes: u64,
    errors: ErrorCounts,
    messages: Vec<String>,
}

type Stats = Arc<Mutex<TaskStats>>;

#[derive(Debug)]
enum OpError {
    Connect(String),
    Tls(String),
    NotFull(String),
    Http(String),
    Status(String),
    Bytes(String),
    Encoding(String),
    Timeout,
}

fn record_error(stats: &Stats, e: OpError) {
    let mut s = stats.lock().unwrap_or_else(|p| p.into_inner());
    let msg = match e {
        OpError::Connect(m) => {
            s.errors.connect += 1;
            format!("connect: {m}")
        }
        OpError::Tls(m) => {
            s.errors.tls += 1;
            format!("tls: {m}")
        }
        OpError::NotFull(m) => {
            s.errors.not_full_handshake += 1;
            format!("not a full handshake: {m}")
        }
        OpError::Http(m) => {
            s.errors.http += 1;
            format!("http: {m}")
        }
        OpError::Status(m) => {
            s.errors.status += 1;
            format!("status: {m}")
        }
        OpError::Bytes(m) => {
            s.errors.bytes += 1;
            format!("body bytes: {m}")
        }
        OpError::Encoding(m) => {
            s.errors.encoding += 1;
            format!("content-encoding: {m}")
        }
        OpError::Timeout => {
            s.errors.timeout += 1;
            "timeout".to_string()
        }
    };
    if s.messages.len() < 5 {
        s.messages.push(msg);
    }
}

/// Whether an operation that started at `started` may start now and be counted; `None`: stop.
fn admit(sh: &Shared) -> Option<bool> {
    if sh.stop.load(Relaxed) {
        return None;
    }
    let now = Instant::now();
    if now < sh.warmup_end {
        return Some(false);
    }
    match &sh.tickets {
        Some(t) => (t.fetch_sub(1, Relaxed) > 0).then_some(true),
        None => (now < sh.end).then_some(true),
    }
}

/// How one handshake went: whether the client offered a session, whether it resumed.
#[derive(Debug, Clone, Copy, Default)]
struct HsKind {
    asked: bool,
    resumed: bool,
}

/// Records a completed operation when it is in the measured window.
fn complete(
    sh: &Shared,
    stats: &Stats,
    counted: bool,
    began: Instant,
    bytes: u64,
    hs: Option<HsKind>,
) {
    let now = Instant::now();
    let mut s = stats.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(k) = hs {
        s.handshakes_all += 1;
        s.resumed_all += k.resumed as u64;
    }
    let in_window = if sh.tickets.is_some() {
        counted
    } else {
        counted && now <= sh.end
    };
    if !in_window {
        return;
    }
    s.ops += 1;
    s.bytes += bytes;
    if let Some(k) = hs {
        s.handshakes += 1;
        s.resumed += k.resumed as u64;
        s.resume_asked += k.asked as u64;
    }
    if sh.spec.mode == Mode::Keepalive || sh.spec.request {
        s.requests += 1;
    }
    s.samples
        .push(now.saturating_duration_since(began).as_micros() as u64);
    sh.last_done
        .fetch_max(now.duration_since(sh.start).as_nanos() as u64, Relaxed);
}

/// Connects to the next target and does the TLS handshake, offering a stored session when
/// `resume` (and there is a resume connector). A connection that offered none must have had
/// a full handshake; one that offered a session may still get a full one (the server did
/// not accept it), which is counted, not an error.
async fn connect_tls(
    sh: &Shared,
    resume: bool,
    rsa_only: bool,
) -> Result<(TlsStream<TcpStream>, HsKind), OpError> {
    let target = sh.next();
    let tcp = TcpStream::connect(target.addr)
        .await
        .map_err(|e| OpError::Connect(e.to_string()))?;
    let _ = tcp.set_nodelay(true);
    let _ = socket2::SockRef::from(&tcp).set_linger(Some(Duration::ZERO));
    let (connector, asked) = match (&sh.resume_connector, resume, &sh.rsa_connector) {
        (Some(c), true, _) => (c, true),
        (_, _, Some(c)) if rsa_only => (c, false),
        _ => (&sh.connector, false),
    };
    let tls = connector
        .connect(target.server_name.clone(), tcp)
        .await
        .map_err(|e| OpError::Tls(e.to_string()))?;
    let kind = tls.get_ref().1.handshake_kind();
    let resumed = kind == Some(rustls::HandshakeKind::Resumed);
    if !asked && kind != Some(rustls::HandshakeKind::Full) {
        return Err(OpError::NotFull(format!("{kind:?}")));
    }
    Ok((tls, HsKind { asked, resumed }))
}

enum Sender {
    H1(http1::SendRequest<Empty<Bytes>>),
    H2(http2::SendRequest<Empty<Bytes>>),
    H3(quic::H3Sender),
}

impl Clone for Sender {
    fn clone(&self) -> Self {
        match self {
            // HTTP/1.1 senders are not shared between streams; see `keepalive_conn`.
            Sender::H1(_) => unreachable!("HTTP/1.1 senders are never cloned"),
            Sender::H2(s) => Sender::H2(s.clone()),
            Sender::H3(s) => Sender::H3(s.clone()),
        }
    }
}

async fn http_handshake(
    sh: &Shared,
    tls: TlsStream<TcpStream>,
) -> Result<(Sender, tokio::task::JoinHandle<()>), OpError> {
    let io = TokioIo::new(tls);
    match sh.spec.http {
        HttpVersion::H1 => {
            let (s, c) = http1::handshake(io)
                .await
                .map_err(|e| OpError::Http(e.to_string()))?;
            Ok((
                Sender::H1(s),
                tokio::spawn(async move {
                    let _ = c.await;
                }),
            ))
        }
        HttpVersion::H3 => Err(OpError::Http(
            "HTTP/3 runs over QUIC, not over a TLS stream".into(),
        )),
        HttpVersion::H2 => {
            let (s, c) = http2::handshake(TokioExecutor::new(), io)
                .await
                .map_err(|e| OpError::Http(e.to_string()))?;
            Ok((
                Sender::H2(s),
                tokio::spawn(async move {
                    let _ = c.await;
                }),
            ))
        }
    }
}

/// A response as the checks need it: status, Content-Encoding, Content-Length, body size and
/// its first two and last four bytes (gzip magic and ISIZE trailer).
#[derive(Default)]
struct Fetched {
    status: u16,
    encoding: Option<String>,
    content_length: Option<u64>,
    bytes: u64,
    head: [u8; 2],
    tail: [u8; 4],
}

impl Fetched {
    fn headers(status: http::StatusCode, headers: &http::HeaderMap) -> Self {
        Fetched {
            status: status.as_u16(),
            encoding: headers
                .get(CONTENT_ENCODING)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            content_length: headers
                .get(CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok()),
            ..Fetched::default()
        }
    }

    /// Counts a piece of the body.
    fn data(&mut self, d: &[u8]) {
        let n = self.bytes;
        for (i, b) in d.iter().take(2).enumerate() {
            if n + (i as u64) < 2 {
                self.head[n as usize + i] = *b;
            }
        }
        let k = d.len().min(4);
        self.tail.rotate_left(k);
        self.tail[4 - k..].copy_from_slice(&d[d.len() - k..]);
        self.bytes += d.len() as u64;
    }
}

/// Sends one request and checks the response; returns the body bytes.
async fn request(sh: &Shared, sender: &mut Sender) -> Result<u64, OpError> {
    let got = match sender {
        Sender::H3(s) => quic::fetch(sh, s).await?,
        _ => fetch(sh, sender).await?,
    };
    check(sh, got)
}

/// One request over HTTP/1.1 or HTTP/2.
async fn fetch(sh: &Shared, sender: &mut Sender) -> Result<Fetched, OpError> {
    let mut b = Request::get(match sender {
        Sender::H1(_) => {
            Uri::try_from(sh.target.path.as_str()).map_err(|e| OpError::Http(e.to_string()))?
        }
        Sender::H2(_) | Sender::H3(_) => sh.target.uri.clone(),
    });
    if matches!(sender, Sender::H1(_)) {
        b = b.header(HOST, sh.target.authority.as_str());
    }
    if let Some(ae) = &sh.spec.accept_encoding {
        b = b.header(ACCEPT_ENCODING, ae.as_str());
    }
    let req = b
        .body(Empty::<Bytes>::new())
        .map_err(|e| OpError::Http(e.to_string()))?;
    let resp = match sender {
        Sender::H1(s) => {
            s.ready().await.map_err(|e| OpError::Http(e.to_string()))?;
            s.send_request(req).await
        }
        Sender::H2(s) => {
            s.ready().await.map_err(|e| OpError::Http(e.to_string()))?;
            s.send_request(req).await
        }
        Sender::H3(_) => unreachable!("HTTP/3 requests go through quic::fetch"),
    }
    .map_err(|e| OpError::Http(e.to_string()))?;
    let mut got = Fetched::headers(resp.status(), resp.headers());
    let mut body = resp.into_body();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| OpError::Http(e.to_string()))?;
        if let Some(d) = frame.data_ref() {
            got.data(d);
        }
    }
    Ok(got)
}

/// The checks every response passes: status, encoding, gzip trailer, body size.
fn check(sh: &Shared, got: Fetched) -> Result<u64, OpError> {
    let Fetched {
        status,
        encoding: enc,
        content_length: clen,
        bytes: n,
        head,
        tail,
    } = got;
    if status != sh.spec.expect_status {
        return Err(OpError::Status(format!(
            "{status}, expected {}",
            sh.spec.expect_status
        )));
    }
    if let Some(want) = &sh.spec.expect_encoding {
        let got = enc.as_deref().unwrap_or("identity");
        if !got.eq_ignore_ascii_case(want) {
            return Err(OpError::Encoding(format!("{got}, expected {want}")));
        }
    }
    if let Some(want) = sh.spec.expect_gzip_size {
        let isize = u32::from_le_bytes(tail) as u64;
        if head != [0x1f, 0x8b] || n < 18 || isize != want % (1 << 32) {
            return Err(OpError::Bytes(format!(
                "gzip stream of {n} bytes states {isize} decoded bytes, expected {want}"
            )));
        }
    }
    let tol = sh.spec.bytes_tolerance / 100.0;
    match (sh.spec.expect_bytes, clen) {
        (Some(want), _) if (n as f64 - want as f64).abs() > want as f64 * tol => {
            return Err(OpError::Bytes(format!("{n}, expected {want}")));
        }
        (None, Some(cl)) if cl != n => {
            return Err(OpError::Bytes(format!("{n}, Content-Length {cl}")));
        }
        _ => {}
    }
    Ok(n)
}

/// One handshake-mode operation.
async fn handshake_op(sh: &Shared, resume: bool, rsa_only: bool) -> Result<(u64, HsKind), OpError> {
    let (mut tls, kind) = connect_tls(sh, resume, rsa_only).await?;
    if sh.spec.request {
        let (mut sender, conn) = http_handshake(sh, tls).await?;
        let n = request(sh, &mut sender).await;
        drop(sender);
        conn.abort();
        n.map(|n| (n, kind))
    } else {
        // close_notify + FIN, then wait for the server to close: it has then read our
        // Finished, i.e. completed its side of the handshake.
        let _ = tls.shutdown().await;
        let mut buf = [0u8; 4096];
        loop {
            match tls.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        Ok((0, kind))
    }
}

async fn handshake_task(sh: Arc<Shared>, stats: Stats, index: usize) {
    let ep = match quic_endpoint(&sh, &stats) {
        Ok(ep) => ep,
        Err(()) => return,
    };
    // Whether each connection offers a session: a per-task xorshift, so runs are repeatable.
    let mut rng = (index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while let Some(counted) = admit(&sh) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let draw = (rng >> 11) as f64 / (1u64 << 53) as f64;
        // one draw for both: the two options are not used together
        let resume = draw < sh.spec.resume_ratio;
        let rsa_only = draw < sh.spec.rsa_only_ratio;
        let began = Instant::now();
        let op = async {
            match &ep {
                Some(ep) => quic::handshake_op(&sh, ep)
                    .await
                    .map(|n| (n, HsKind::default())),
                None => handshake_op(&sh, resume, rsa_only).await,
            }
        };
        match tokio::time::timeout(sh.timeout, op).await {
            Ok(Ok((n, kind))) => complete(&sh, &stats, counted, began, n, Some(kind)),
            Ok(Err(e)) => {
                record_error(&stats, e);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(_) => record_error(&stats, OpError::Timeout),
        }
    }
}

/// Requests on one open connection until it fails or the run stops.
async fn request_loop(
    sh: &Shared,
    stats: &Stats,
    sender: &mut Sender,
    pace: Option<(Instant, Duration)>,
) -> bool {
    let mut next = pace.map(|(t, _)| t);
    loop {
        if let (Some(t), Some((_, iv))) = (next, pace) {
            tokio::time::sleep_until(t.into()).await;
            next = Some(t + iv);
        }
        let Some(counted) = admit(sh) else {
            return true;
        };
        let began = match (next, pace) {
            (Some(t), Some((_, iv))) => t - iv,
            _ => Instant::now(),
        };
        match tokio::time::timeout(sh.timeout, request(sh, sender)).await {
            Ok(Ok(n)) => complete(sh, stats, counted, began, n, None),
            Ok(Err(e)) => {
                record_error(stats, e);
                return false;
            }
            Err(_) => {
                record_error(stats, OpError::Timeout);
                return false;
            }
        }
    }
}

/// This task's QUIC client endpoint with `--http 3` (`None` otherwise); `Err` (recorded) when
/// it cannot bind.
fn quic_endpoint(sh: &Shared, stats: &Stats) -> Result<Option<quinn::Endpoint>, ()> {
    if sh.spec.http != HttpVersion::H3 {
        return Ok(None);
    }
    quic::endpoint(sh)
        .map(Some)
        .map_err(|e| record_error(stats, e))
}

async fn keepalive_task(sh: Arc<Shared>, stats: Stats, index: usize) {
    let streams = match sh.spec.http {
        HttpVersion::H1 => 1,
        HttpVersion::H2 | HttpVersion::H3 => sh.spec.streams.max(1),
    };
    let ep = match quic_endpoint(&sh, &stats) {
        Ok(ep) => ep,
        Err(()) => return,
    };
    let interval = sh
        .spec
        .rate
        .map(|r| Duration::from_secs_f64((sh.spec.connections * streams) as f64 / r.max(0.001)));
    loop {
        if sh.stop.load(Relaxed) {
            return;
        }
        let setup = async {
            if let Some(ep) = &ep {
                return quic::open(&sh, ep).await;
            }
            let (tls, _) = connect_tls(&sh, false, false).await?;
            http_handshake(&sh, tls).await
        };
        let (mut sender, conn) = match tokio::time::timeout(sh.timeout, setup).await {
            Ok(Ok(x)) => x,
            Ok(Err(e)) => {
                record_error(&stats, e);
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            Err(_) => {
                record_error(&stats, OpError::Timeout);
                continue;
            }
        };
        {
            let mut s = stats.lock().unwrap_or_else(|p| p.into_inner());
            s.handshakes_all += 1;
        }
        let pace = |k: usize| {
            interval.map(|iv| {
                // Stagger the connections' schedules over one interval.
                let total = (sh.spec.connections * streams) as u32;
                let slot = (index * streams + k) as u32;
                (Instant::now() + iv / total.max(1) * slot, iv)
            })
        };
        let finished = if streams == 1 {
            request_loop(&sh, &stats, &mut sender, pace(0)).await
        } else {
            let mut set = tokio::task::JoinSet::new();
            for k in 0..streams {
                let (sh, stats, mut s, p) = (sh.clone(), stats.clone(), sender.clone(), pace(k));
                set.spawn(async move { request_loop(&sh, &stats, &mut s, p).await });
            }
            let mut all = true;
            while let Some(r) = set.join_next().await {
                all &= r.unwrap_or(false);
            }
            all
        };
        drop(sender);
        conn.abort();
        if finished {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Runs `spec` on its own multi-threaded runtime and returns the report.
pub fn run_load(spec: &LoadSpec) -> Result<LoadReport> {
    if spec.connections == 0 {
        return Err(Error::Arg("--connections must be at least 1".into()));
    }
    if !(spec.duration > 0.0 && spec.warmup >= 0.0 && spec.timeout > 0.0) {
        return Err(Error::Arg(
            "--duration and --timeout must be > 0, --warmup >= 0".into(),
        ));
    }
    if !(0.0..=1.0).contains(&spec.resume_ratio) {
        return Err(Error::Arg("--resume-ratio must be within 0..=1".into()));
    }
    if spec.resume_ratio > 0.0 && spec.mode != Mode::Handshake {
        return Err(Error::Arg("--resume-ratio needs --mode handshake".into()));
    }
    if !(0.0..=1.0).contains(&spec.rsa_only_ratio) {
        return Err(Error::Arg("--rsa-only-ratio must be within 0..=1".into()));
    }
    if spec.rsa_only_ratio > 0.0 && (spec.mode != Mode::Handshake || spec.resume_ratio > 0.0) {
        return Err(Error::Arg(
            "--rsa-only-ratio needs --mode handshake and no --resume-ratio".into(),
        ));
    }
    if spec.http == HttpVersion::H3
        && (spec.tls != TlsVersion::Tls13 || spec.resume_ratio > 0.0 || spec.rsa_only_ratio > 0.0)
    {
        return Err(Error::Arg(
            "--http 3 needs --tls 1.3 and no --resume-ratio or --rsa-only-ratio".into(),
        ));
    }
    let tally = Arc::new(SignatureTally::default());
    let target = parse_target(&spec.url)?;
    let others = spec
        .also
        .iter()
        .map(|u| parse_target(u))
        .collect::<Result<Vec<_>>>()?;
    let (connector, resume_connector) = if spec.resume_ratio > 0.0 {
        // Enough tickets for every connection to hold one while the others come back.
        let c = resuming_configs(spec.tls, spec.http, (spec.connections * 4).max(64))?;
        (
            TlsConnector::from(c.full),
            Some(TlsConnector::from(c.resume)),
        )
    } else {
        (
            TlsConnector::from(client_config_signing(
                spec.tls,
                spec.http,
                false,
                tally.clone(),
            )?),
            None,
        )
    };
    let rsa_connector = if spec.rsa_only_ratio > 0.0 {
        Some(TlsConnector::from(client_config_signing(
            spec.tls,
            spec.http,
            true,
            tally.clone(),
        )?))
    } else {
        None
    };
    let quic = match spec.http {
        HttpVersion::H3 => Some(quic::client_config(client_config_signing(
            spec.tls,
            spec.http,
            false,
            tally.clone(),
        )?)?),
        _ => None,
    };
    crate::raise_fd_limit(spec.connections as u64 * 2 + 1024);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(spec.threads.unwrap_or_else(crate::cpus).max(1))
        .enable_all()
        .build()
        .map_err(|e| Error::io("start the client runtime", e))?;
    rt.block_on(run_async(
        spec.clone(),
        target,
        others,
        connector,
        (resume_connector, rsa_connector, quic),
        tally,
    ))
}

async fn run_async(
    spec: LoadSpec,
    target: Target,
    others: Vec<Target>,
    connector: TlsConnector,
    (resume_connector, rsa_connector, quic): (
        Option<TlsConnector>,
        Option<TlsConnector>,
        Option<quinn::ClientConfig>,
    ),
    tally: Arc<SignatureTally>,
) -> Result<LoadReport> {
    let start = Instant::now();
    let warmup_end = start + Duration::from_secs_f64(spec.warmup);
    let end = match spec.count {
        Some(_) => warmup_end + Duration::from_secs(365 * 24 * 3600),
        None => warmup_end + Duration::from_secs_f64(spec.duration),
    };
    let sh = Arc::new(Shared {
        timeout: Duration::from_secs_f64(spec.timeout),
        tickets: spec.count.map(|n| AtomicI64::new(n as i64)),
        spec,
        target,
        others,
        next_target: AtomicU64::new(0),
        connector,
        resume_connector,
        rsa_connector,
        quic,
        tally,
        start,
        warmup_end,
        end,
        last_done: AtomicU64::new(0),
        stop: AtomicBool::new(false),
    });
    let mut all_stats = Vec::new();
    let mut handles = Vec::new();
    for i in 0..sh.spec.connections {
        let stats: Stats = Arc::default();
        all_stats.push(stats.clone());
        let sh = sh.clone();
        handles.push(tokio::spawn(async move {
            match sh.spec.mode {
                Mode::Handshake => handshake_task(sh, stats, i).await,
                Mode::Keepalive => keepalive_task(sh, stats, i).await,
            }
        }));
    }
    let measured = if sh.spec.count.is_some() {
        for h in handles {
            let _ = h.await;
        }
        let last = Duration::from_nanos(sh.last_done.load(Relaxed));
        (start + last).saturating_duration_since(warmup_end)
    } else {
        tokio::time::sleep_until(end.into()).await;
        sh.stop.store(true, Relaxed);
        for h in &handles {
            h.abort();
        }
        for h in handles {
            let _ = h.await;
        }
        end - warmup_end
    };
    let mut total = TaskStats::default();
    for s in all_stats {
        let mut s = s.lock().unwrap_or_else(|p| p.into_inner());
        total.samples.append(&mut s.samples);
        total.ops += s.ops;
        total.handshakes += s.handshakes;
        total.handshakes_all += s.handshakes_all;
        total.resumed += s.resumed;
        total.resumed_all += s.resumed_all;
        total.resume_asked += s.resume_asked;
        total.requests += s.requests;
        total.bytes += s.bytes;
        total.errors.add(&s.errors);
        for m in s.messages.drain(..) {
            if total.messages.len() < 5 {
                total.messages.push(m);
            }
        }
    }
    let secs = measured.as_secs_f64().max(1e-9);
    Ok(LoadReport {
        spec: sh.spec.clone(),
        measured_secs: secs,
        ops: total.ops,
        ops_per_sec: total.ops as f64 / secs,
        handshakes: total.handshakes,
        handshakes_all: total.handshakes_all,
        resumed: total.resumed,
        resumed_all: total.resumed_all,
        resume_asked: total.resume_asked,
        requests: total.requests,
        body_bytes: total.bytes,
        mib_per_sec: total.bytes as f64 / secs / (1024.0 * 1024.0),
        latency: summarize(&mut total.samples),
        errors: total.errors,
        error_samples: total.messages,
        ecdsa_signed: sh.tally.ecdsa.load(Relaxed),
        rsa_signed: sh.tally.rsa.load(Relaxed),
    })
}

mod idle;
pub use idle::IdleSet;

#[cfg(test)]
mod tests;
