//! The benchmark certificates: one RSA-2048 and one ECDSA P-256 self-signed certificate for
//! `localhost` and `127.0.0.1`, written as PEM files that qweb and nginx both load.

use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// Key type of a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum KeyKind {
    /// RSA 2048-bit, PKCS#1 v1.5 / PSS signatures.
    Rsa2048,
    /// ECDSA on P-256 with SHA-256.
    EcdsaP256,
}

impl KeyKind {
    /// Short label used in tables and file names.
    pub fn label(self) -> &'static str {
        match self {
            KeyKind::Rsa2048 => "RSA-2048",
            KeyKind::EcdsaP256 => "ECDSA-P256",
        }
    }

    fn file_stem(self) -> &'static str {
        match self {
            KeyKind::Rsa2048 => "rsa2048",
            KeyKind::EcdsaP256 => "ecdsa-p256",
        }
    }
}

/// Paths of a certificate (PEM, leaf only) and its private key (PEM, PKCS#8).
#[derive(Debug, Clone)]
pub struct CertFiles {
    /// Key type.
    pub kind: KeyKind,
    /// Certificate.
    pub cert: PathBuf,
    /// Private key.
    pub key: PathBuf,
}

/// Generates the certificate of `kind` into `dir` (replacing an earlier one).
pub fn generate(dir: &Path, kind: KeyKind) -> Result<CertFiles> {
    let kp = match kind {
        KeyKind::Rsa2048 => {
            rcgen::KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048)
        }
        KeyKind::EcdsaP256 => rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256),
    }
    .map_err(|e| Error::Other(format!("generate a {} key: {e}", kind.label())))?;
    let params = rcgen::CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])
        .map_err(|e| Error::Other(format!("certificate parameters: {e}")))?;
    let cert = params
        .self_signed(&kp)
        .map_err(|e| Error::Other(format!("self-sign the {} certificate: {e}", kind.label())))?;
    std::fs::create_dir_all(dir).map_err(|e| Error::path("create", dir, e))?;
    let files = CertFiles {
        kind,
        cert: dir.join(format!("{}.crt", kind.file_stem())),
        key: dir.join(format!("{}.key", kind.file_stem())),
    };
    std::fs::write(&files.cert, cert.pem()).map_err(|e| Error::path("write", &files.cert, e))?;
    std::fs::write(&files.key, kp.serialize_pem())
        .map_err(|e| Error::path("write", &files.key, e))?;
    Ok(files)
}
