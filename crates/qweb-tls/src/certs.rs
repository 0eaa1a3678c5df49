//! Loading PEM certificate chains and private keys.

use std::path::Path;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::TlsError;

/// A certificate chain with its signing key, and the DNS names it is valid for.
#[derive(Debug, Clone)]
pub struct LoadedCert {
    /// The chain and key, ready for rustls.
    pub key: Arc<CertifiedKey>,
    /// DNS names (possibly wildcards such as `*.example.com`) from the leaf's subjectAltName,
    /// lower-cased.
    pub dns_names: Vec<String>,
    /// The OCSP staple holder, when the certificate is stapled (see [`LoadedCert::staple`]).
    pub ocsp: Option<Arc<crate::ocsp::OcspStaple>>,
}

impl LoadedCert {
    /// Makes the certificate stapled: its (empty) staple holder, to fill with
    /// [`OcspStaple::set`](crate::ocsp::OcspStaple::set). The resolver serves the staple
    /// while it is current.
    pub fn staple(&mut self) -> Arc<crate::ocsp::OcspStaple> {
        self.ocsp
            .get_or_insert_with(|| Arc::new(crate::ocsp::OcspStaple::new(self.key.clone())))
            .clone()
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Reads every certificate of a PEM file (leaf first, then intermediates).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.to_owned(),
            message: format!("invalid PEM certificate: {e}"),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_owned(),
            message: "no CERTIFICATE block found".into(),
        });
    }
    Ok(certs)
}

/// Reads the first private key of a PEM file: PKCS#8 (`PRIVATE KEY`), PKCS#1
/// (`RSA PRIVATE KEY`) or SEC1 (`EC PRIVATE KEY`).
pub fn load_private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| TlsError::Pem {
        path: path.to_owned(),
        message: format!("no usable private key (PKCS#8, PKCS#1 or SEC1 PEM expected): {e}"),
    })
}

/// Loads a certificate chain and its private key and checks that they belong together.
pub fn load_certified_key(
    cert_path: &Path,
    key_path: &Path,
    provider: &CryptoProvider,
) -> Result<LoadedCert, TlsError> {
    load_certified_key_with(cert_path, key_path, provider, None)
}

/// Like [`load_certified_key`]; with `offload`, the key's signatures go to its engine (see [`OffloadSigningKey`](crate::OffloadSigningKey)).
pub fn load_certified_key_with(
    cert_path: &Path,
    key_path: &Path,
    provider: &CryptoProvider,
    offload: Option<&crate::KeyOffload>,
) -> Result<LoadedCert, TlsError> {
    match offload {
        None => load_plain(cert_path, key_path, provider),
        Some(offload) => load_offloaded(cert_path, Some(key_path), provider, offload),
    }
}

fn load_plain(
    cert_path: &Path,
    key_path: &Path,
    provider: &CryptoProvider,
) -> Result<LoadedCert, TlsError> {
    let chain = load_certs(cert_path)?;
    let key_der = load_private_key(key_path)?;
    let signing_key = provider
        .key_provider
        .load_private_key(key_der)
        .map_err(|e| TlsError::Key {
            path: key_path.to_owned(),
            message: format!("unsupported private key: {e}"),
        })?;
    let certified = CertifiedKey::new(chain, signing_key);
    certified.keys_match().map_err(|e| TlsError::Key {
        path: key_path.to_owned(),
        message: format!(
            "private key does not match the certificate in {}: {e}",
            cert_path.display()
        ),
    })?;
    let dns_names = leaf_dns_names(&certified.cert[0]).map_err(|message| TlsError::Pem {
        path: cert_path.to_owned(),
        message,
    })?;
    Ok(LoadedCert {
        key: Arc::new(certified),
        dns_names,
        ocsp: None,
    })
}

/// A certificate whose signatures go to an offload engine. `key_path` is optional: without
/// it (a key server holds the key) the key is named by the certificate's SPKI SHA-256, and
/// there is no software fallback.
pub fn load_offloaded(
    cert_path: &Path,
    key_path: Option<&Path>,
    provider: &CryptoProvider,
    offload: &crate::KeyOffload,
) -> Result<LoadedCert, TlsError> {
    let (chain, dns_names, local) = match key_path {
        Some(kp) => {
            let plain = load_plain(cert_path, kp, provider)?;
            let key_der = load_private_key(kp)?;
            let local = qweb_offload::LocalKey::from_der(key_der.secret_der()).map_err(|e| {
                TlsError::Key {
                    path: kp.to_owned(),
                    message: format!("cannot offload this key: {e}"),
                }
            })?;
            (
                plain.key.cert.clone(),
                plain.dns_names,
                Some(Arc::new(local)),
            )
        }
        None => {
            let chain = load_certs(cert_path)?;
            let names = leaf_dns_names(&chain[0]).map_err(|message| TlsError::Pem {
                path: cert_path.to_owned(),
                message,
            })?;
            (chain, names, None)
        }
    };
    let pem_err = |message: String| TlsError::Pem {
        path: cert_path.to_owned(),
        message,
    };
    let ee = webpki::EndEntityCert::try_from(&chain[0])
        .map_err(|e| pem_err(format!("cannot parse the leaf certificate: {e}")))?;
    let spki = ee.subject_public_key_info();
    let kind = qweb_offload::KeyKind::of_spki(spki.as_ref()).ok_or_else(|| {
        pem_err("the certificate's key is neither RSA nor ECDSA P-256/P-384".into())
    })?;
    let key = qweb_offload::KeyRef {
        id: qweb_offload::KeyId::of_spki(spki.as_ref()),
        local,
    };
    let signing = crate::OffloadSigningKey::new(key, kind, offload.clone());
    Ok(LoadedCert {
        key: Arc::new(CertifiedKey::new(chain, Arc::new(signing))),
        dns_names,
        ocsp: None,
    })
}

/// The key id (SPKI SHA-256) of a certificate file's leaf.
pub fn cert_key_id(cert_path: &Path) -> Result<qweb_offload::KeyId, TlsError> {
    let chain = load_certs(cert_path)?;
    let ee = webpki::EndEntityCert::try_from(&chain[0]).map_err(|e| TlsError::Pem {
        path: cert_path.to_owned(),
        message: format!("cannot parse the leaf certificate: {e}"),
    })?;
    Ok(qweb_offload::KeyId::of_spki(
        ee.subject_public_key_info().as_ref(),
    ))
}

fn leaf_dns_names(leaf: &CertificateDer<'_>) -> Result<Vec<String>, String> {
    let ee = webpki::EndEntityCert::try_from(leaf)
        .map_err(|e| format!("cannot parse the leaf certificate: {e}"))?;
    Ok(ee
        .valid_dns_names()
        .map(|n| n.to_ascii_lowercase())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider;

    fn write(dir: &Path, name: &str, body: &str) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        p
    }

    fn gen(alg: &'static rcgen::SignatureAlgorithm) -> (String, String) {
        let kp = rcgen::KeyPair::generate_for(alg).unwrap();
        let params =
            rcgen::CertificateParams::new(vec!["a.example".into(), "*.b.example".into()]).unwrap();
        let cert = params.self_signed(&kp).unwrap();
        (cert.pem(), kp.serialize_pem())
    }

    #[test]
    fn loads_ecdsa_pkcs8_and_names() {
        let dir = tempfile::tempdir().unwrap();
        let (c, k) = gen(&rcgen::PKCS_ECDSA_P256_SHA256);
        let cp = write(dir.path(), "c.pem", &c);
        let kp = write(dir.path(), "k.pem", &k);
        let loaded = load_certified_key(&cp, &kp, &provider()).unwrap();
        assert_eq!(loaded.dns_names, vec!["a.example", "*.b.example"]);
    }

    #[test]
    fn mismatched_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (c, _) = gen(&rcgen::PKCS_ECDSA_P256_SHA256);
        let (_, k2) = gen(&rcgen::PKCS_ECDSA_P256_SHA256);
        let cp = write(dir.path(), "c.pem", &c);
        let kp = write(dir.path(), "k.pem", &k2);
        let err = load_certified_key(&cp, &kp, &provider()).unwrap_err();
        assert!(err.to_string().contains("does not match"), "{err}");
    }

    #[test]
    fn empty_and_missing_files_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let cp = write(dir.path(), "c.pem", "hello\n");
        let err = load_certs(&cp).unwrap_err();
        assert!(err.to_string().contains("no CERTIFICATE"), "{err}");
        let err = load_private_key(&dir.path().join("nope.pem")).unwrap_err();
        assert!(err.to_string().contains("cannot read"), "{err}");
        let err = load_private_key(&cp).unwrap_err();
        assert!(err.to_string().contains("private key"), "{err}");
    }
}
