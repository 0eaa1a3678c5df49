use std::path::PathBuf;

/// Everything that can go wrong while loading certificates or building a TLS configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A PEM file did not contain what it should.
    #[error("{path}: {message}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// The private key does not match the certificate, or is of an unsupported type.
    #[error("{path}: {message}")]
    Key {
        /// The key file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// Generating the self-signed certificate failed.
    #[error("cannot generate the self-signed certificate: {0}")]
    Generate(String),
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}
