//! Clients of a `keyserver` engine's key servers for ticket keys (`tls_session`) and ACME key
//! generation (`acme`): one connection each, with the engine's mutual-TLS configuration.

use std::sync::Arc;

use crate::runtime::error::ServerError;

/// A one-connection client of a `keyserver` engine's key servers (ticket keys, ACME key
/// generation), with its mutual-TLS configuration.
pub(crate) fn keyserver_client(
    k: &crate::config::KeyserverEngineConfig,
) -> Result<qweb_keyserver::client::ClientConfig, ServerError> {
    Ok(qweb_keyserver::client::ClientConfig {
        servers: k.servers.clone(),
        connections: 1,
        max_in_flight: 1,
        timeout: k.timeout,
        tls: keyserver_client_tls(k)?,
    })
}

/// The mutual-TLS client configuration for `tls://` key servers.
pub(crate) fn keyserver_client_tls(
    k: &crate::config::KeyserverEngineConfig,
) -> Result<Option<Arc<rustls::ClientConfig>>, ServerError> {
    let (Some(cert), Some(key), Some(ca)) = (&k.client_cert, &k.client_key, &k.server_ca) else {
        return Ok(None);
    };
    let provider = Arc::new(qweb_tls::provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in qweb_tls::load_certs(ca)? {
        roots.add(c).map_err(qweb_tls::TlsError::Rustls)?;
    }
    let chain = qweb_tls::load_certs(cert)?;
    let key = qweb_tls::load_private_key(key)?;
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(qweb_tls::TlsError::Rustls)?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(qweb_tls::TlsError::Rustls)?;
    Ok(Some(Arc::new(cfg)))
}
