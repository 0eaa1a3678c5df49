//! Private keys that software engines sign with (aws-lc-rs).

use std::fmt;

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::rsa::KeyPair as RsaKeyPair;
use aws_lc_rs::signature::{self, EcdsaKeyPair, EcdsaSigningAlgorithm};

use crate::op::SignScheme;

/// Why a key could not be loaded or used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// Not an RSA, P-256 or P-384 key in PKCS#8, PKCS#1 or SEC1 DER.
    #[error("unsupported or malformed private key")]
    Unsupported,
    /// The scheme does not fit the key.
    #[error("scheme {0:?} does not fit this key")]
    WrongScheme(SignScheme),
    /// The signature operation failed.
    #[error("signing failed")]
    Sign,
}

/// A private key held in this process.
pub enum LocalKey {
    /// RSA (any size aws-lc-rs accepts).
    Rsa(RsaKeyPair),
    /// ECDSA P-256.
    EcdsaP256(EcdsaKeyPair),
    /// ECDSA P-384.
    EcdsaP384(EcdsaKeyPair),
}

impl fmt::Debug for LocalKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self {
            LocalKey::Rsa(_) => "Rsa",
            LocalKey::EcdsaP256(_) => "EcdsaP256",
            LocalKey::EcdsaP384(_) => "EcdsaP384",
        };
        write!(f, "LocalKey::{kind}(..)")
    }
}

impl LocalKey {
    /// Loads a key from DER: PKCS#8 (RSA or EC), PKCS#1 (RSA) or SEC1 (EC).
    pub fn from_der(der: &[u8]) -> Result<Self, KeyError> {
        if let Ok(k) = RsaKeyPair::from_pkcs8(der) {
            return Ok(LocalKey::Rsa(k));
        }
        if let Ok(k) = RsaKeyPair::from_der(der) {
            return Ok(LocalKey::Rsa(k));
        }
        let ec = |alg: &'static EcdsaSigningAlgorithm| {
            EcdsaKeyPair::from_pkcs8(alg, der)
                .or_else(|_| EcdsaKeyPair::from_private_key_der(alg, der))
                .ok()
        };
        if let Some(k) = ec(&signature::ECDSA_P256_SHA256_ASN1_SIGNING) {
            return Ok(LocalKey::EcdsaP256(k));
        }
        if let Some(k) = ec(&signature::ECDSA_P384_SHA384_ASN1_SIGNING) {
            return Ok(LocalKey::EcdsaP384(k));
        }
        Err(KeyError::Unsupported)
    }

    /// The schemes this key can sign with, most preferred first.
    pub fn schemes(&self) -> &'static [SignScheme] {
        match self {
            LocalKey::Rsa(_) => &[
                SignScheme::RsaPssSha512,
                SignScheme::RsaPssSha384,
                SignScheme::RsaPssSha256,
                SignScheme::RsaPkcs1Sha512,
                SignScheme::RsaPkcs1Sha384,
                SignScheme::RsaPkcs1Sha256,
            ],
            LocalKey::EcdsaP256(_) => &[SignScheme::EcdsaP256Sha256],
            LocalKey::EcdsaP384(_) => &[SignScheme::EcdsaP384Sha384],
        }
    }

    /// Signs `message` (hashing it as the scheme says).
    pub fn sign(&self, scheme: SignScheme, message: &[u8]) -> Result<Vec<u8>, KeyError> {
        let rng = SystemRandom::new();
        match self {
            LocalKey::Rsa(k) => {
                let enc: &'static dyn signature::RsaEncoding = match scheme {
                    SignScheme::RsaPkcs1Sha256 => &signature::RSA_PKCS1_SHA256,
                    SignScheme::RsaPkcs1Sha384 => &signature::RSA_PKCS1_SHA384,
                    SignScheme::RsaPkcs1Sha512 => &signature::RSA_PKCS1_SHA512,
                    SignScheme::RsaPssSha256 => &signature::RSA_PSS_SHA256,
                    SignScheme::RsaPssSha384 => &signature::RSA_PSS_SHA384,
                    SignScheme::RsaPssSha512 => &signature::RSA_PSS_SHA512,
                    other => return Err(KeyError::WrongScheme(other)),
                };
                let mut sig = vec![0; k.public_modulus_len()];
                k.sign(enc, &rng, message, &mut sig)
                    .map_err(|_| KeyError::Sign)?;
                Ok(sig)
            }
            LocalKey::EcdsaP256(k) | LocalKey::EcdsaP384(k) => {
                let ok = matches!(
                    (self, scheme),
                    (LocalKey::EcdsaP256(_), SignScheme::EcdsaP256Sha256)
                        | (LocalKey::EcdsaP384(_), SignScheme::EcdsaP384Sha384)
                );
                if !ok {
                    return Err(KeyError::WrongScheme(scheme));
                }
                k.sign(&rng, message)
                    .map(|s| s.as_ref().to_vec())
                    .map_err(|_| KeyError::Sign)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_lc_rs::signature::{KeyPair, UnparsedPublicKey};

    #[test]
    fn ecdsa_and_rsa_sign_and_verify() {
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let key = LocalKey::from_der(&kp.serialize_der()).unwrap();
        assert!(matches!(key, LocalKey::EcdsaP256(_)));
        let sig = key.sign(SignScheme::EcdsaP256Sha256, b"hello").unwrap();
        let LocalKey::EcdsaP256(inner) = &key else {
            unreachable!()
        };
        UnparsedPublicKey::new(
            &signature::ECDSA_P256_SHA256_ASN1,
            inner.public_key().as_ref(),
        )
        .verify(b"hello", &sig)
        .unwrap();
        assert_eq!(
            key.sign(SignScheme::RsaPssSha256, b"x"),
            Err(KeyError::WrongScheme(SignScheme::RsaPssSha256))
        );

        let kp =
            rcgen::KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048)
                .unwrap();
        let key = LocalKey::from_der(&kp.serialize_der()).unwrap();
        let LocalKey::Rsa(inner) = &key else {
            panic!("not rsa")
        };
        for (scheme, params) in [
            (
                SignScheme::RsaPssSha256,
                &signature::RSA_PSS_2048_8192_SHA256,
            ),
            (
                SignScheme::RsaPkcs1Sha384,
                &signature::RSA_PKCS1_2048_8192_SHA384,
            ),
        ] {
            let sig = key.sign(scheme, b"msg").unwrap();
            UnparsedPublicKey::new(params, inner.public_key().as_ref())
                .verify(b"msg", &sig)
                .unwrap();
        }
        assert_eq!(
            LocalKey::from_der(b"junk").unwrap_err(),
            KeyError::Unsupported
        );
    }
}
