//! rustls glue for qweb.
//!
//! This crate loads certificates and private keys (PEM chains; PKCS#8, PKCS#1 and SEC1 keys),
//! chooses a certificate per connection by SNI, generates the self-signed default certificate
//! that lets `qweb serve` start with no configuration, and builds the rustls `ServerConfig`
//! (TLS 1.2 and 1.3 only, aws-lc-rs provider).

mod certs;
mod error;
mod selfsigned;
mod server_config;
mod sni;

pub use certs::{load_certified_key, load_certs, load_private_key, LoadedCert};
pub use error::TlsError;
pub use selfsigned::{ensure_self_signed, SelfSigned};
pub use server_config::{provider, server_config, ALPN_H2, ALPN_HTTP11};
pub use sni::SniResolver;
