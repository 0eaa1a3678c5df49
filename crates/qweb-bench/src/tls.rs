//! The benchmark's TLS client configuration: any certificate accepted (signatures are still
//! verified, as a real client would spend that CPU), no session resumption, one TLS version,
//! one cipher suite family and X25519 first so every server does the same work.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{
    ClientSessionStore, Resumption, Tls12ClientSessionValue, Tls13ClientSessionValue,
};
use rustls::crypto::{aws_lc_rs, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::NamedGroup;
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};

use crate::{Error, Result};

/// TLS protocol version offered by the client (only that one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum TlsVersion {
    /// TLS 1.2 (ECDHE key exchange, signature by the server's RSA or ECDSA key).
    #[value(name = "1.2")]
    #[serde(rename = "1.2")]
    Tls12,
    /// TLS 1.3.
    #[value(name = "1.3")]
    #[serde(rename = "1.3")]
    Tls13,
}

/// HTTP version, chosen by ALPN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum HttpVersion {
    /// HTTP/1.1 (ALPN "http/1.1").
    #[value(name = "1.1")]
    #[serde(rename = "1.1")]
    H1,
    /// HTTP/2 (ALPN "h2").
    #[value(name = "2")]
    #[serde(rename = "2")]
    H2,
    /// HTTP/3 over QUIC (ALPN "h3", TLS 1.3 only), to the URL's port over UDP.
    #[value(name = "3")]
    #[serde(rename = "3")]
    H3,
}

/// Accepts any server certificate: this is a benchmark client talking to servers it started
/// itself with certificates it generated (and the test kit's clients use it to see which
/// certificate a server presents). Handshake signatures are verified for real, so the server
/// must hold the private key of the certificate it presented. The one accept-any verifier of
/// the workspace.
#[derive(Debug)]
pub struct AcceptAnyCert {
    provider: Arc<CryptoProvider>,
    /// Offer only RSA signature schemes (a client that cannot verify ECDSA).
    rsa_only: bool,
    tally: Arc<SignatureTally>,
}

/// Server handshake signatures a client verified, by algorithm: which certificate the servers
/// chose (dual certificates). Whole runs, warm-up included.
#[derive(Debug, Default)]
pub struct SignatureTally {
    /// ECDSA signatures.
    pub ecdsa: std::sync::atomic::AtomicU64,
    /// RSA (PKCS#1 v1.5 or PSS) signatures.
    pub rsa: std::sync::atomic::AtomicU64,
}

impl SignatureTally {
    fn count(&self, scheme: SignatureScheme) {
        use std::sync::atomic::Ordering::Relaxed;
        match scheme {
            SignatureScheme::ECDSA_NISTP256_SHA256
            | SignatureScheme::ECDSA_NISTP384_SHA384
            | SignatureScheme::ECDSA_NISTP521_SHA512 => self.ecdsa.fetch_add(1, Relaxed),
            s if is_rsa(s) => self.rsa.fetch_add(1, Relaxed),
            _ => 0,
        };
    }
}

fn is_rsa(s: SignatureScheme) -> bool {
    matches!(
        s,
        SignatureScheme::RSA_PSS_SHA256
            | SignatureScheme::RSA_PSS_SHA384
            | SignatureScheme::RSA_PSS_SHA512
            | SignatureScheme::RSA_PKCS1_SHA256
            | SignatureScheme::RSA_PKCS1_SHA384
            | SignatureScheme::RSA_PKCS1_SHA512
    )
}

impl AcceptAnyCert {
    /// Verifies handshake signatures with `provider`'s algorithms.
    pub fn new(provider: Arc<CryptoProvider>) -> Self {
        AcceptAnyCert {
            provider,
            rsa_only: false,
            tally: Arc::default(),
        }
    }
}

impl ServerCertVerifier for AcceptAnyCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.tally.count(dss.scheme);
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.tally.count(dss.scheme);
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        let mut all = self
            .provider
            .signature_verification_algorithms
            .supported_schemes();
        if self.rsa_only {
            all.retain(|s| is_rsa(*s));
        }
        all
    }
}

/// Client TLS configurations of a run whose connections resume some of the time: both share one
/// session store; `resume` takes tickets (TLS 1.3) or sessions (TLS 1.2) from it, `full` only
/// puts what servers send into it and never offers a session, so its handshakes are full.
pub struct ResumingConfigs {
    /// Offers a stored session when there is one.
    pub resume: Arc<ClientConfig>,
    /// Never offers one (but stores what it gets).
    pub full: Arc<ClientConfig>,
}

/// The client's session store: per server name the key-exchange hint, the latest TLS 1.2
/// session and up to `per_server` TLS 1.3 tickets (newest taken first). rustls' own memory
/// cache keeps only 8 tickets per server, which a run of 128 concurrent connections empties
/// at once: most of them would then offer nothing and do full handshakes.
#[derive(Debug)]
pub struct SessionPool {
    per_server: usize,
    inner: std::sync::Mutex<std::collections::HashMap<ServerName<'static>, PoolEntry>>,
}

#[derive(Debug, Default)]
struct PoolEntry {
    kx_hint: Option<NamedGroup>,
    tls12: Option<Tls12ClientSessionValue>,
    tls13: std::collections::VecDeque<Tls13ClientSessionValue>,
}

impl SessionPool {
    /// A pool that keeps up to `per_server` TLS 1.3 tickets per server name.
    pub fn new(per_server: usize) -> Self {
        SessionPool {
            per_server: per_server.max(1),
            inner: Default::default(),
        }
    }

    fn with<R>(&self, name: &ServerName<'_>, f: impl FnOnce(&mut PoolEntry) -> R) -> R {
        let mut m = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(m.entry(name.to_owned()).or_default())
    }
}

impl ClientSessionStore for SessionPool {
    fn set_kx_hint(&self, server_name: ServerName<'static>, group: NamedGroup) {
        self.with(&server_name, |e| e.kx_hint = Some(group))
    }

    fn kx_hint(&self, server_name: &ServerName<'_>) -> Option<NamedGroup> {
        self.with(server_name, |e| e.kx_hint)
    }

    fn set_tls12_session(&self, server_name: ServerName<'static>, value: Tls12ClientSessionValue) {
        self.with(&server_name, |e| e.tls12 = Some(value))
    }

    fn tls12_session(&self, server_name: &ServerName<'_>) -> Option<Tls12ClientSessionValue> {
        self.with(server_name, |e| e.tls12.clone())
    }

    fn remove_tls12_session(&self, server_name: &ServerName<'static>) {
        self.with(server_name, |e| e.tls12 = None)
    }

    fn insert_tls13_ticket(
        &self,
        server_name: ServerName<'static>,
        value: Tls13ClientSessionValue,
    ) {
        let cap = self.per_server;
        self.with(&server_name, |e| {
            if e.tls13.len() >= cap {
                e.tls13.pop_front();
            }
            e.tls13.push_back(value);
        })
    }

    fn take_tls13_ticket(
        &self,
        server_name: &ServerName<'static>,
    ) -> Option<Tls13ClientSessionValue> {
        self.with(server_name, |e| e.tls13.pop_back())
    }
}

/// A session store that keeps what it is given and never hands anything out.
#[derive(Debug)]
struct WriteOnly(Arc<dyn ClientSessionStore>);

impl ClientSessionStore for WriteOnly {
    fn set_kx_hint(&self, server_name: ServerName<'static>, group: NamedGroup) {
        self.0.set_kx_hint(server_name, group)
    }

    fn kx_hint(&self, server_name: &ServerName<'_>) -> Option<NamedGroup> {
        self.0.kx_hint(server_name)
    }

    fn set_tls12_session(&self, server_name: ServerName<'static>, value: Tls12ClientSessionValue) {
        self.0.set_tls12_session(server_name, value)
    }

    fn tls12_session(&self, _server_name: &ServerName<'_>) -> Option<Tls12ClientSessionValue> {
        None
    }

    fn remove_tls12_session(&self, server_name: &ServerName<'static>) {
        self.0.remove_tls12_session(server_name)
    }

    fn insert_tls13_ticket(
        &self,
        server_name: ServerName<'static>,
        value: Tls13ClientSessionValue,
    ) {
        self.0.insert_tls13_ticket(server_name, value)
    }

    fn take_tls13_ticket(
        &self,
        _server_name: &ServerName<'static>,
    ) -> Option<Tls13ClientSessionValue> {
        None
    }
}

/// The pair of configurations for a run that resumes (see [`ResumingConfigs`]); the store
/// keeps up to `tickets` TLS 1.3 tickets per server name ([`SessionPool`]).
pub fn resuming_configs(
    version: TlsVersion,
    http: HttpVersion,
    tickets: usize,
) -> Result<ResumingConfigs> {
    let store: Arc<dyn ClientSessionStore> = Arc::new(SessionPool::new(tickets));
    // Both from one configuration: rustls resumes a session only with the certificate
    // verifier (the same `Arc`) that verified it.
    let base = client_config(version, http)?;
    let mut resume = (*base).clone();
    resume.resumption = Resumption::store(store.clone());
    let mut full = (*base).clone();
    full.resumption = Resumption::store(Arc::new(WriteOnly(store)));
    Ok(ResumingConfigs {
        resume: Arc::new(resume),
        full: Arc::new(full),
    })
}

/// The client configuration: `version` only, AES-128-GCM suites, X25519 (P-256 also
/// offered), no resumption (no
/// session cache, no tickets: every connection is a full handshake), ALPN for `http`.
pub fn client_config(version: TlsVersion, http: HttpVersion) -> Result<Arc<ClientConfig>> {
    client_config_signing(version, http, false, Arc::default())
}

/// [`client_config`], offering only RSA signature schemes (and, on TLS 1.2, only the
/// ECDHE_RSA suite) when `rsa_only`: a client that cannot verify ECDSA, which a server with
/// dual certificates must give its RSA one. The server signatures it verifies are counted
/// in `tally`.
pub fn client_config_signing(
    version: TlsVersion,
    http: HttpVersion,
    rsa_only: bool,
    tally: Arc<SignatureTally>,
) -> Result<Arc<ClientConfig>> {
    let mut provider = aws_lc_rs::default_provider();
    // ECDHE_ECDSA first, as browsers list it: a TLS 1.2 server that follows the client's
    // suite order (nginx by default) then gives a dual-certificate client its ECDSA one
    provider.cipher_suites = vec![aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256];
    if !rsa_only {
        provider
            .cipher_suites
            .push(aws_lc_rs::cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256);
    }
    provider
        .cipher_suites
        .push(aws_lc_rs::cipher_suite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256);
    // X25519 is preferred for the key exchange; P-256 is listed too because in TLS 1.2 the
    // client's groups also name the curves it accepts for ECDSA certificates (RFC 8422), and
    // OpenSSL refuses an ECDSA P-256 certificate to a client that does not list P-256.
    provider.kx_groups = vec![aws_lc_rs::kx_group::X25519, aws_lc_rs::kx_group::SECP256R1];
    let provider = Arc::new(provider);
    let versions: &[&'static rustls::SupportedProtocolVersion] = match version {
        TlsVersion::Tls12 => &[&rustls::version::TLS12],
        TlsVersion::Tls13 => &[&rustls::version::TLS13],
    };
    let mut cfg = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(|e| Error::Tls(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyCert {
            provider,
            rsa_only,
            tally,
        }))
        .with_no_client_auth();
    cfg.resumption = Resumption::disabled();
    cfg.enable_early_data = false;
    cfg.alpn_protocols = match http {
        HttpVersion::H1 => vec![b"http/1.1".to_vec()],
        HttpVersion::H2 => vec![b"h2".to_vec()],
        HttpVersion::H3 => vec![b"h3".to_vec()],
    };
    Ok(Arc::new(cfg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_disables_resumption_and_offers_one_version() {
        let c = client_config(TlsVersion::Tls12, HttpVersion::H2).unwrap();
        assert_eq!(c.alpn_protocols, vec![b"h2".to_vec()]);
        assert!(!c.enable_early_data);
    }
}
