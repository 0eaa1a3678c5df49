//! What ends a connection or a stream.

use h2::Reason;

/// Why the connection ended from the server's side: a GOAWAY with this code is queued in
/// [`Connection::out`](super::Connection::out); the driver writes it and closes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("HTTP/2 connection error {reason:?}: {why}")]
pub struct ConnError {
    /// The GOAWAY's error code.
    pub reason: Reason,
    /// What the client did (the GOAWAY's debug data).
    pub why: &'static str,
}

pub(crate) fn conn_err(reason: Reason, why: &'static str) -> ConnError {
    ConnError { reason, why }
}

/// A stream's body ended with an error: the stream was reset, or broke the framing rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("HTTP/2 request stream ended: {0}")]
pub struct StreamEnded(pub &'static str);
