//! The rustls `ServerConfig` qweb uses.

use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::server::ResolvesServerCert;
use rustls::ServerConfig;

use crate::TlsError;

/// ALPN protocol id of HTTP/2.
pub const ALPN_H2: &[u8] = b"h2";
/// ALPN protocol id of HTTP/1.1.
pub const ALPN_HTTP11: &[u8] = b"http/1.1";

/// The crypto provider: aws-lc-rs with rustls' default cipher suites.
pub fn provider() -> CryptoProvider {
    rustls::crypto::aws_lc_rs::default_provider()
}

/// A server configuration: TLS 1.2 and 1.3, certificates from `resolver`, ALPN `h2` (when
/// `http2` is set) then `http/1.1`.
pub fn server_config(
    resolver: Arc<dyn ResolvesServerCert>,
    http2: bool,
) -> Result<ServerConfig, TlsError> {
    let mut config = ServerConfig::builder_with_provider(Arc::new(provider()))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    if http2 {
        config.alpn_protocols.push(ALPN_H2.to_vec());
    }
    config.alpn_protocols.push(ALPN_HTTP11.to_vec());
    Ok(config)
}
