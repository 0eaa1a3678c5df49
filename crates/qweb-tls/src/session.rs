//! Session resumption settings of a listener's `ServerConfig`, and its full-versus-resumed
//! handshake counters.
//!
//! - TLS 1.3: tickets from the [`Ticketer`] (stateless, shared by every worker, fleet-wide
//!   with shared keys); no 0-RTT (early data stays off: replayable).
//! - TLS 1.2: tickets (RFC 5077) from the same ticketer, and session ids from a stateful
//!   cache of `cache_size` sessions (shared by the workers of the process).
//! - `enabled = false`: no tickets, no cache, every handshake is full.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use rustls::server::{NoServerSessionStorage, ServerSessionMemoryCache};
use rustls::{HandshakeKind, ProtocolVersion, ServerConfig, ServerConnection};

use crate::Ticketer;

/// How a listener resumes sessions.
#[derive(Debug, Clone)]
pub struct SessionResumption {
    /// Off: every handshake is full.
    pub enabled: bool,
    /// Sessions kept for TLS 1.2 session-id resumption (0: no cache, tickets only).
    pub cache_size: usize,
    /// The process's ticketer (`None`: no tickets).
    pub ticketer: Option<Arc<Ticketer>>,
}

/// Sets `config`'s session storage and ticketer; early data (0-RTT) stays off.
pub fn apply_resumption(config: &mut ServerConfig, r: &SessionResumption) {
    config.max_early_data_size = 0;
    if !r.enabled {
        config.session_storage = Arc::new(NoServerSessionStorage {});
        config.send_tls13_tickets = 0;
        return;
    }
    config.session_storage = if r.cache_size == 0 {
        Arc::new(NoServerSessionStorage {})
    } else {
        ServerSessionMemoryCache::new(r.cache_size)
    };
    if let Some(t) = &r.ticketer {
        config.ticketer = t.clone();
    }
}

/// Full and resumed handshakes of one listener, by TLS version.
#[derive(Debug, Default)]
pub struct HandshakeStats {
    /// Full TLS 1.2 handshakes.
    pub full_tls12: AtomicU64,
    /// Resumed TLS 1.2 handshakes (ticket or session id).
    pub resumed_tls12: AtomicU64,
    /// Full TLS 1.3 handshakes (with or without HelloRetryRequest).
    pub full_tls13: AtomicU64,
    /// Resumed TLS 1.3 handshakes (PSK from a ticket).
    pub resumed_tls13: AtomicU64,
}

impl HandshakeStats {
    /// Counts a finished handshake.
    pub fn record(&self, conn: &ServerConnection) {
        let resumed = conn.handshake_kind() == Some(HandshakeKind::Resumed);
        let counter = match (conn.protocol_version(), resumed) {
            (Some(ProtocolVersion::TLSv1_2), false) => &self.full_tls12,
            (Some(ProtocolVersion::TLSv1_2), true) => &self.resumed_tls12,
            (_, false) => &self.full_tls13,
            (_, true) => &self.resumed_tls13,
        };
        counter.fetch_add(1, Relaxed);
    }

    /// `(version, kind, count)` rows: versions `1.2`/`1.3`, kinds `full`/`resumed`.
    pub fn rows(&self) -> [(&'static str, &'static str, u64); 4] {
        [
            ("1.2", "full", self.full_tls12.load(Relaxed)),
            ("1.2", "resumed", self.resumed_tls12.load(Relaxed)),
            ("1.3", "full", self.full_tls13.load(Relaxed)),
            ("1.3", "resumed", self.resumed_tls13.load(Relaxed)),
        ]
    }
}
