//! The HTTPS client the ACME protocol runs on: one HTTP/1.1 connection per request (an order
//! makes a dozen), over rustls with the system's roots or the configured `ca_root`, each
//! request bounded in time and in the size of its answer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Request, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use instant_acme::{BodyWrapper, BytesResponse, HttpClient};

/// Longest a request may take, connection and answer included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest answer read (a certificate chain is a few KiB).
const MAX_ANSWER: usize = 1024 * 1024;

/// An HTTPS client for the CA's directory.
pub(crate) struct Client {
    tls: tokio_rustls::TlsConnector,
}

impl Client {
    /// Trusts `roots` (the configured `ca_root`, or the system's).
    pub(crate) fn new(roots: rustls::RootCertStore) -> Result<Client, String> {
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(qweb_tls::provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Client {
            tls: tokio_rustls::TlsConnector::from(Arc::new(config)),
        })
    }

    async fn send(
        tls: tokio_rustls::TlsConnector,
        req: Request<BodyWrapper<Bytes>>,
    ) -> Result<BytesResponse, String> {
        let uri = req.uri().clone();
        if uri.scheme_str() != Some("https") {
            return Err(format!("{uri}: the CA's URLs must be https://"));
        }
        let host = uri
            .host()
            .ok_or_else(|| format!("{uri}: no host"))?
            .to_owned();
        let port = uri.port_u16().unwrap_or(443);
        let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| format!("cannot connect to {host}:{port}: {e}"))?;
        let name = rustls::pki_types::ServerName::try_from(host.clone())
            .map_err(|e| format!("{host}: {e}"))?;
        let stream = tls
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS with {host}:{port}: {e}"))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        // origin form, with Host
        let (mut parts, body) = req.into_parts();
        let authority = uri
            .authority()
            .map(|a| a.as_str())
            .unwrap_or(&host)
            .to_owned();
        parts.uri = Uri::builder()
            .path_and_query(uri.path_and_query().map(|p| p.as_str()).unwrap_or("/"))
            .build()
            .map_err(|e| e.to_string())?;
        parts.headers.insert(
            header::HOST,
            header::HeaderValue::from_str(&authority).map_err(|e| e.to_string())?,
        );
        let rsp = sender
            .send_request(Request::from_parts(parts, body))
            .await
            .map_err(|e| format!("{uri}: {e}"))?;
        let (parts, body) = rsp.into_parts();
        let bytes = Limited::new(body, MAX_ANSWER)
            .collect()
            .await
            .map_err(|e| format!("{uri}: reading the answer: {e}"))?
            .to_bytes();
        Ok(BytesResponse::from(http::Response::from_parts(
            parts,
            Full::new(bytes),
        )))
    }
}

impl HttpClient for Client {
    fn request(
        &self,
        req: Request<BodyWrapper<Bytes>>,
    ) -> Pin<Box<dyn Future<Output = Result<BytesResponse, instant_acme::Error>> + Send>> {
        let tls = self.tls.clone();
        Box::pin(async move {
            match tokio::time::timeout(REQUEST_TIMEOUT, Self::send(tls, req)).await {
                Ok(Ok(r)) => Ok(r),
                Ok(Err(e)) => Err(instant_acme::Error::Other(e.into())),
                Err(_) => Err(instant_acme::Error::Other(
                    format!("no answer within {REQUEST_TIMEOUT:?}").into(),
                )),
            }
        })
    }
}

/// The roots the client trusts: `ca_root`'s certificates, or the system's.
pub(crate) fn roots(ca_root: Option<&std::path::Path>) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_root {
        Some(p) => {
            for c in qweb_tls::load_certs(p).map_err(|e| e.to_string())? {
                roots.add(c).map_err(|e| format!("{}: {e}", p.display()))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err("no system root certificates found (set `acme.ca_root`)".into());
            }
        }
    }
    Ok(roots)
}
