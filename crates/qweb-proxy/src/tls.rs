//! TLS to `https://` upstreams (rustls): the route's roots (`upstream_ca` or the system's),
//! the server name from the URL or `upstream_server_name` (sent as SNI and verified), the
//! optional client certificate. A handshake that fails (a certificate that does not verify,
//! a wrong name) is logged and answered 502; the next upstream is tried.

use std::sync::Arc;

use http::StatusCode;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use super::{Failure, Proxy, Retry};

impl Proxy {
    /// The TLS handshake with upstream `idx` on `io`, within the route's `connect_timeout`.
    pub(super) async fn tls_handshake<IO>(
        &self,
        idx: usize,
        io: IO,
    ) -> Result<TlsStream<IO>, Failure>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        let up = &self.cfg.upstreams[idx];
        let refused = || Failure::new(StatusCode::BAD_GATEWAY, Retry::NextUpstream);
        let Some(cfg) = &self.cfg.upstream_tls else {
            tracing::warn!(upstream = %up.name, "no TLS configuration for an https upstream");
            return Err(refused());
        };
        let name = self.cfg.upstream_server_name.as_deref().unwrap_or(&up.host);
        let Ok(server_name) = ServerName::try_from(name.to_owned()) else {
            tracing::warn!(upstream = %up.name, "`{name}` is not a TLS server name");
            return Err(refused());
        };
        let connect = TlsConnector::from(Arc::clone(cfg)).connect(server_name, io);
        match tokio::time::timeout(self.cfg.connect_timeout, connect).await {
            Ok(Ok(s)) => Ok(s),
            Ok(Err(e)) => {
                tracing::warn!(upstream = %up.name, server_name = %name, "upstream TLS handshake failed: {e}");
                Err(refused())
            }
            Err(_) => {
                tracing::warn!(upstream = %up.name, "upstream TLS handshake timed out");
                Err(Failure::new(
                    StatusCode::GATEWAY_TIMEOUT,
                    Retry::NextUpstream,
                ))
            }
        }
    }
}
