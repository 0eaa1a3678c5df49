//! Certificates that change while qweb runs: those an ACME client orders and renews, swapped
//! in for new handshakes without a reload, and the answers to the CA's challenges while an
//! order is validated (HTTP-01 tokens, TLS-ALPN-01 certificates, RFC 8555 and RFC 8737).
//!
//! One [`Managed`] is shared by the configuration's TLS listeners (through their
//! [`SniResolver`](crate::SniResolver)), its HTTP services (which answer
//! `/.well-known/acme-challenge/`) and the ACME client that fills it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, PoisonError, RwLock};

use rustls::sign::CertifiedKey;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::ocsp::OcspStaple;
use crate::TlsError;

/// ALPN protocol id of the TLS-ALPN-01 challenge (RFC 8737).
pub const ALPN_ACME: &[u8] = b"acme-tls/1";

/// The HTTP-01 challenge path prefix (RFC 8555 8.3).
pub const HTTP_CHALLENGE_PREFIX: &str = "/.well-known/acme-challenge/";

/// Managed certificates by name, and the challenge answers outstanding.
#[derive(Debug, Default)]
pub struct Managed {
    /// By name: the certificate, with its OCSP staple while one is current.
    certs: RwLock<HashMap<String, Arc<OcspStaple>>>,
    alpn: RwLock<HashMap<String, Arc<CertifiedKey>>>,
    http: RwLock<HashMap<String, String>>,
    /// Any HTTP-01 token outstanding: requests look at the table only then.
    http_pending: AtomicBool,
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

impl Managed {
    /// Serves `key` for `names` (lower-case, exact) to new handshakes from now on; returns
    /// its (empty) OCSP staple holder, stapled once [`OcspStaple::set`] gets a response.
    pub fn install(&self, names: &[String], key: Arc<CertifiedKey>) -> Arc<OcspStaple> {
        let staple = Arc::new(OcspStaple::new(key));
        let mut certs = write(&self.certs);
        for n in names {
            certs.insert(n.clone(), staple.clone());
        }
        staple
    }

    /// The certificate for `name`, if one was installed (with its staple while current).
    pub fn cert(&self, name: &str) -> Option<Arc<CertifiedKey>> {
        let staple = read(&self.certs).get(name).cloned()?;
        Some(staple.key_at(std::time::SystemTime::now()))
    }

    /// Answers TLS-ALPN-01 for `name`: a self-signed certificate for it carrying the
    /// `acmeIdentifier` extension with `digest` (SHA-256 of the key authorization), served
    /// only to clients that offer `acme-tls/1` alone.
    pub fn set_alpn_challenge(&self, name: &str, digest: &[u8]) -> Result<(), TlsError> {
        let key = challenge_cert(name, digest)?;
        write(&self.alpn).insert(name.to_owned(), Arc::new(key));
        Ok(())
    }

    /// The TLS-ALPN-01 certificate for `name`, while its challenge is outstanding.
    pub fn alpn_cert(&self, name: &str) -> Option<Arc<CertifiedKey>> {
        read(&self.alpn).get(name).cloned()
    }

    /// Answers HTTP-01: `GET /.well-known/acme-challenge/{token}` gets `key_authorization`.
    pub fn set_http_challenge(&self, token: &str, key_authorization: &str) {
        write(&self.http).insert(token.to_owned(), key_authorization.to_owned());
        self.http_pending.store(true, Relaxed);
    }

    /// The HTTP-01 answer for a request path, when it asks for an outstanding token.
    pub fn http_answer(&self, path: &str) -> Option<String> {
        if !self.http_pending.load(Relaxed) {
            return None;
        }
        let token = path.strip_prefix(HTTP_CHALLENGE_PREFIX)?;
        read(&self.http).get(token).cloned()
    }

    /// Forgets the challenges of `names` and `tokens` (the order was validated, or failed).
    pub fn clear_challenges(&self, names: &[String], tokens: &[String]) {
        let mut alpn = write(&self.alpn);
        for n in names {
            alpn.remove(n);
        }
        let mut http = write(&self.http);
        for t in tokens {
            http.remove(t);
        }
        self.http_pending.store(!http.is_empty(), Relaxed);
    }
}

/// The TLS-ALPN-01 certificate of RFC 8737 section 3: `name` as its only subjectAltName, the
/// critical `acmeIdentifier` extension holding `digest`, a fresh P-256 key.
fn challenge_cert(name: &str, digest: &[u8]) -> Result<CertifiedKey, TlsError> {
    let gen = |e: rcgen::Error| TlsError::Generate(format!("TLS-ALPN-01 certificate: {e}"));
    let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(gen)?;
    let mut params = rcgen::CertificateParams::new(vec![name.to_owned()]).map_err(gen)?;
    params
        .custom_extensions
        .push(rcgen::CustomExtension::new_acme_identifier(digest));
    let cert = params.self_signed(&kp).map_err(gen)?;
    let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(kp.serialize_der()));
    let signing = crate::provider()
        .key_provider
        .load_private_key(der)
        .map_err(|e| TlsError::Generate(format!("TLS-ALPN-01 key: {e}")))?;
    Ok(CertifiedKey::new(
        vec![CertificateDer::from(cert.der().to_vec())],
        signing,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_answers_only_outstanding_tokens() {
        let m = Managed::default();
        assert_eq!(m.http_answer("/.well-known/acme-challenge/t1"), None);
        m.set_http_challenge("t1", "t1.thumb");
        assert_eq!(
            m.http_answer("/.well-known/acme-challenge/t1").as_deref(),
            Some("t1.thumb")
        );
        assert_eq!(m.http_answer("/.well-known/acme-challenge/t2"), None);
        assert_eq!(m.http_answer("/t1"), None);
        m.clear_challenges(&[], &["t1".into()]);
        assert_eq!(m.http_answer("/.well-known/acme-challenge/t1"), None);
    }

    /// An installed certificate is served with its staple once the holder has a current
    /// response (the ACME runtime fetches it when the certificate names a responder).
    #[test]
    fn installed_certificates_are_stapled_once_a_response_is_set() {
        use std::time::{Duration, SystemTime};
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["s.test".into()]).unwrap();
        params.serial_number = Some(rcgen::SerialNumber::from(vec![0x21]));
        let cert = params.self_signed(&kp).unwrap();
        let signing = crate::provider()
            .key_provider
            .load_private_key(PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
                kp.serialize_der(),
            )))
            .unwrap();
        let key = Arc::new(CertifiedKey::new(
            vec![CertificateDer::from(cert.der().to_vec())],
            signing,
        ));
        let m = Managed::default();
        let holder = m.install(&["s.test".into()], key);
        assert!(m.cert("s.test").unwrap().ocsp.is_none());
        let now = SystemTime::now();
        let response = crate::ocsp::tests::response(
            cert.der(),
            &[0x80, 0x00],
            &crate::ocsp::tests::generalized(now - Duration::from_secs(3600)),
            Some(&crate::ocsp::tests::generalized(
                now + Duration::from_secs(86400),
            )),
            false,
        );
        holder.set(response.clone(), now).unwrap();
        assert_eq!(
            m.cert("s.test").unwrap().ocsp.as_deref(),
            Some(&response[..])
        );
    }

    #[test]
    fn alpn_certificate_carries_the_digest_in_a_critical_extension() {
        let m = Managed::default();
        let digest = [7u8; 32];
        m.set_alpn_challenge("a.test", &digest).unwrap();
        let k = m.alpn_cert("a.test").unwrap();
        let der = k.cert[0].as_ref();
        // id-pe-acmeIdentifier (1.3.6.1.5.5.7.1.31), critical, OCTET STRING (32 bytes)
        let ext = [
            &[0x06, 0x08, 0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x01, 0x1f][..],
            &[0x01, 0x01, 0xff, 0x04, 0x22, 0x04, 0x20],
            &digest,
        ]
        .concat();
        assert!(der.windows(ext.len()).any(|w| w == ext));
        m.clear_challenges(&["a.test".into()], &[]);
        assert!(m.alpn_cert("a.test").is_none());
    }
}
