//! rustls glue for qweb.
//!
//! This crate loads certificates and private keys (PEM chains; PKCS#8, PKCS#1 and SEC1 keys),
//! chooses a certificate per connection by SNI, generates the self-signed default certificate
//! that lets `qweb serve` start with no configuration, and builds the rustls `ServerConfig`
//! (TLS 1.2 and 1.3 only, aws-lc-rs provider). With offload, the signing key is an
//! [`OffloadSigningKey`] and the [`handshake`] driver runs rustls' steps as jobs that pause at
//! the signature; after the handshake the connection is a [`TlsStream`]. Sessions resume
//! with tickets from one [`Ticketer`] per process (local, file or fleet keys; see [`ticket`]).

#![forbid(unsafe_code)]

mod certs;
pub mod client_auth;
pub mod der;
mod error;
pub mod handshake;
pub mod managed;
pub mod ocsp;
mod offload_key;
mod pinned;
mod selfsigned;
mod server_config;
mod session;
mod sni;
pub mod state_file;
mod stream;
pub mod ticket;
pub mod utc;

pub use certs::{
    cert_key_id, load_certified_key, load_certified_key_with, load_certs, load_offloaded,
    load_private_key, LoadedCert,
};
pub use client_auth::{ClientAuth, ClientCert, NamePattern, SitePolicies};
pub use error::TlsError;
pub use handshake::HandshakeError;
pub use managed::{Managed, ALPN_ACME};
pub use offload_key::{KeyOffload, OffloadSigningKey};
pub use pinned::PinnedAnchors;
pub use selfsigned::{ensure_self_signed, SelfSigned};
pub use server_config::{provider, server_config, ALPN_H2, ALPN_HTTP11};
pub use session::{apply_resumption, HandshakeStats, SessionResumption};
pub use sni::SniResolver;
pub use stream::TlsStream;
pub use ticket::{FleetKeys, TicketKeyMaterial, Ticketer};
