//! What the connection tasks of a run share (the spec, targets, connectors, the measured
//! window) and what each of them counts: completed operations, errors by kind.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_rustls::TlsConnector;

use super::spec::{ErrorCounts, LoadSpec, Mode};
use super::target::Target;
use crate::tls::SignatureTally;

/// State shared by all connection tasks of a run.
pub(super) struct Shared {
    pub(super) spec: LoadSpec,
    pub(super) target: Target,
    /// `--also` targets; new connections go round-robin over `target` and these.
    pub(super) others: Vec<Target>,
    pub(super) next_target: AtomicU64,
    /// Offers no session (with --resume-ratio: stores what it gets).
    pub(super) connector: TlsConnector,
    /// With --resume-ratio: offers a stored session.
    pub(super) resume_connector: Option<TlsConnector>,
    /// With --rsa-only-ratio: offers only RSA signature schemes.
    pub(super) rsa_connector: Option<TlsConnector>,
    /// With --http 3: the QUIC client configuration (same verifier and tally).
    pub(super) quic: Option<quinn::ClientConfig>,
    /// Server signatures verified, by algorithm.
    pub(super) tally: Arc<SignatureTally>,
    pub(super) start: Instant,
    pub(super) warmup_end: Instant,
    /// End of the measured window (far away in count mode).
    pub(super) end: Instant,
    /// Count mode: operations still to measure.
    pub(super) tickets: Option<AtomicI64>,
    /// Count mode: nanoseconds since `start` of the last counted completion.
    pub(super) last_done: AtomicU64,
    pub(super) stop: AtomicBool,
    pub(super) timeout: Duration,
}

impl Shared {
    /// The target of the next new connection: round-robin over `target` and `--also`.
    pub(super) fn next(&self) -> &Target {
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
pub(super) struct TaskStats {
    pub(super) samples: Vec<u64>,
    pub(super) ops: u64,
    pub(super) handshakes: u64,
    pub(super) handshakes_all: u64,
    pub(super) resumed: u64,
    pub(super) resumed_all: u64,
    pub(super) resume_asked: u64,
    pub(super) requests: u64,
    pub(super) bytes: u64,
    pub(super) errors: ErrorCounts,
    pub(super) messages: Vec<String>,
}

pub(super) type Stats = Arc<Mutex<TaskStats>>;

#[derive(Debug)]
pub(super) enum OpError {
    Connect(String),
    Tls(String),
    NotFull(String),
    Http(String),
    Status(String),
    Bytes(String),
    Encoding(String),
    Timeout,
}

pub(super) fn record_error(stats: &Stats, e: OpError) {
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
pub(super) fn admit(sh: &Shared) -> Option<bool> {
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
pub(super) struct HsKind {
    pub(super) asked: bool,
    pub(super) resumed: bool,
}

/// Records a completed operation when it is in the measured window.
pub(super) fn complete(
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
