//! Why the key server cannot start.

/// Why the key server cannot start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyserverError {
    /// The configuration is invalid.
    #[error("{0}")]
    Config(String),
    /// A key or certificate could not be loaded.
    #[error(transparent)]
    Tls(#[from] qweb_tls::TlsError),
    /// A socket or thread could not be set up.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
}
