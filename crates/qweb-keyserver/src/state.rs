//! What every connection of the key server shares: its keys, signing pool, counters,
//! per-connection limits and the fleet's ticket keys.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64};
use std::sync::Arc;
use std::time::Duration;

use qweb_offload::{KeyId, LocalKey, PoolEngine};

/// Per-connection bounds of the key server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Requests read from one connection whose answers are not written yet; at the bound
    /// the connection is not read until answers drain. Default 256.
    pub max_answers: usize,
    /// Requests of one connection in the signing queue or being signed; more wait for
    /// their turn (fair share of the pool). Default 16.
    pub max_signing: usize,
    /// A frame begun must be complete, and answers must be written, within this. Default 10 s.
    pub frame_timeout: Duration,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            max_answers: 256,
            max_signing: 16,
            frame_timeout: Duration::from_secs(10),
        }
    }
}

/// Counters of the key server.
#[derive(Debug, Default)]
pub struct ServerMetrics {
    /// Requests received.
    pub requests: AtomicU64,
    /// Error answers sent.
    pub errors: AtomicU64,
    /// Connections refused or dropped for a protocol error or a bad peer.
    pub rejected_connections: AtomicU64,
    /// Connections closed because a frame or an answer stalled past `frame_timeout`.
    pub timed_out_connections: AtomicU64,
    /// Failed accepts (e.g. out of file descriptors), all listeners.
    pub accept_errors: AtomicU64,
    /// Connections open.
    pub connections: AtomicI64,
}

/// What every connection of the key server shares.
pub(crate) struct State {
    pub(crate) keys: HashMap<KeyId, Arc<LocalKey>>,
    pub(crate) pool: PoolEngine,
    pub(crate) metrics: ServerMetrics,
    pub(crate) limits: ConnLimits,
    /// The fleet's session ticket keys.
    pub(crate) tickets: crate::tickets::TicketKeyRing,
    /// Keys generated on request (`generated_keys`; `None`: generation is off).
    pub(crate) generated: Option<crate::generated::Generated>,
}

impl State {
    /// The key `id`: a configured one, or a generated one.
    pub(crate) fn key(&self, id: &KeyId) -> Option<Arc<LocalKey>> {
        match self.keys.get(id) {
            Some(k) => Some(k.clone()),
            None => self.generated.as_ref()?.get(id),
        }
    }
}
