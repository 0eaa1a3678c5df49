//! Errors of the load generator and the runner.

/// What went wrong, with enough context to act on it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or process operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done (names the path or command).
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A command-line argument or a URL is not usable.
    #[error("invalid argument: {0}")]
    Arg(String),
    /// TLS client configuration failed.
    #[error("TLS: {0}")]
    Tls(String),
    /// A server did not start or did not answer as expected.
    #[error("server {name}: {message} (log: {log})")]
    Server {
        /// Which server ("qweb none", "nginx").
        name: String,
        /// What happened.
        message: String,
        /// Its log file.
        log: String,
    },
    /// A measurement check failed (errors counted, metrics mismatch, smoke assertion).
    #[error("check failed: {0}")]
    Check(String),
    /// Anything else, with its message.
    #[error("{0}")]
    Other(String),
}

impl Error {
    /// An [`Error::Io`] with context.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// An [`Error::Io`] about a path.
    pub fn path(what: &str, path: &std::path::Path, source: std::io::Error) -> Self {
        Error::io(format!("{what} {}", path.display()), source)
    }

    /// An [`Error::Server`].
    pub fn server(name: &str, message: impl Into<String>, log: &std::path::Path) -> Self {
        Error::Server {
            name: name.to_string(),
            message: message.into(),
            log: log.display().to_string(),
        }
    }
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
