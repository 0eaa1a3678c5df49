//! Verifying an upstream's certificate against configured trust anchors (a proxy route's
//! `upstream_ca`), where an anchor may be the upstream's own self-signed certificate.
//!
//! `openssl req -x509`, the most common way to make a self-signed certificate, marks it
//! `CA:TRUE`. Pinned as its own anchor, webpki refuses it as an end entity
//! (`CaUsedAsEndEntity`); OpenSSL (nginx) and Go (Caddy) accept it. [`PinnedAnchors`]
//! accepts such a certificate when it is byte for byte one of the anchors, and still checks
//! its dates and the server name; everything else is webpki's verdict.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{verify_server_name, VerifierBuilderError, WebPkiServerVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{CertificateError, DigitallySignedStruct, Error, OtherError, RootCertStore};

/// webpki's verifier over `anchors`, which also accepts an end-entity certificate that is
/// exactly one of `anchors` (DER equal) although it says `CA:TRUE`.
#[derive(Debug)]
pub struct PinnedAnchors {
    webpki: Arc<WebPkiServerVerifier>,
    anchors: Vec<CertificateDer<'static>>,
}

impl PinnedAnchors {
    /// A verifier over `anchors` with qweb's crypto provider. An anchor rustls cannot use
    /// is an error ([`RootCertStore::add`]'s).
    pub fn new(anchors: Vec<CertificateDer<'static>>) -> Result<Arc<Self>, Error> {
        let mut roots = RootCertStore::empty();
        for c in &anchors {
            roots.add(c.clone())?;
        }
        let webpki = WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(crate::provider()),
        )
        .build()
        .map_err(|e: VerifierBuilderError| Error::General(e.to_string()))?;
        Ok(Arc::new(PinnedAnchors { webpki, anchors }))
    }

    fn is_anchor(&self, cert: &CertificateDer<'_>) -> bool {
        self.anchors.iter().any(|a| a.as_ref() == cert.as_ref())
    }
}

/// webpki's `CaUsedAsEndEntity`, as rustls passes it on.
fn ca_used_as_end_entity(e: &Error) -> bool {
    match e {
        Error::InvalidCertificate(CertificateError::Other(OtherError(inner))) => matches!(
            inner.downcast_ref::<webpki::Error>(),
            Some(webpki::Error::CaUsedAsEndEntity)
        ),
        _ => false,
    }
}

impl ServerCertVerifier for PinnedAnchors {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        match self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            // webpki checks an end entity's validity dates before its basic constraints: a
            // `CaUsedAsEndEntity` means the dates were good (the test with an expired pin
            // guards this order). The certificate is trusted as configured; its name is
            // checked here, as webpki would have after the chain.
            Err(e) if ca_used_as_end_entity(&e) && self.is_anchor(end_entity) => {
                verify_server_name(&ParsedCertificate::try_from(end_entity)?, server_name)?;
                Ok(ServerCertVerified::assertion())
            }
            r => r,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}
