//! Why the server could not start ([`ServerError`]): shared by the start and reload steps
//! (`server`) and the TLS session setup (`tls_session`) and key-server clients below them.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A listening address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The error.
        source: std::io::Error,
    },
    /// Another process listens on the address already.
    #[error("{addr} is already in use by another process ({key})")]
    InUse {
        /// The address.
        addr: SocketAddr,
        /// The configuration key that names it, e.g. `listener[0].address`.
        key: String,
    },
    /// Certificates could not be loaded or generated.
    #[error(transparent)]
    Tls(#[from] qweb_tls::TlsError),
    /// The state folder could not be written.
    #[error("state folder {path}: {source}")]
    State {
        /// The folder.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A worker thread could not be started.
    #[error("cannot start a worker thread: {0}")]
    Thread(std::io::Error),
    /// An engine could not be started.
    #[error("cannot start offload engine `{name}`: {source}")]
    Engine {
        /// The engine.
        name: String,
        /// The error.
        source: std::io::Error,
    },
    /// Session ticket keys could not be set up (key file).
    #[error("ticket keys: {0}")]
    Tickets(String),
}
