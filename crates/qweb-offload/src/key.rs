//! Private keys that software engines sign with (aws-lc-rs).

use std::fmt;

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::rsa::KeyPair as RsaKeyPair;
use aws_lc_rs::signature::{self, EcdsaKeyPair, EcdsaSigningAlgorithm};

/// A signature scheme, named as TLS names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SignScheme {
    /// RSASSA-PKCS1-v1_5 with SHA-256.
    RsaPkcs1Sha256,
    /// RSASSA-PKCS1-v1_5 with SHA-384.
    RsaPkcs1Sha384,
    /// RSASSA-PKCS1-v1_5 with SHA-512.
    RsaPkcs1Sha512,
    /// RSASSA-PSS with SHA-256 (MGF1 SHA-256, salt = hash length).
    RsaPssSha256,
    /// RSASSA-PSS with SHA-384.
    RsaPssSha384,
    /// RSASSA-PSS with SHA-512.
    RsaPssSha512,
    /// ECDSA on P-256 with SHA-256 (DER signature).
    EcdsaP256Sha256,
    /// ECDSA on P-384 with SHA-384 (DER signature).
    EcdsaP384Sha384,
}

impl SignScheme {
    /// Is this an RSA scheme?
    pub fn is_rsa(self) -> bool {
        !matches!(
            self,
            SignScheme::EcdsaP256Sha256 | SignScheme::EcdsaP384Sha384
        )
    }
}

/// Why a key could not be loaded or used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
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

/// The type of a key, known from its public half alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    /// RSA.
    Rsa,
    /// ECDSA P-256.
    EcdsaP256,
    /// ECDSA P-384.
    EcdsaP384,
}

impl KeyKind {
    /// The type of the key in a DER SubjectPublicKeyInfo (by its algorithm identifier).
    pub fn of_spki(spki_der: &[u8]) -> Option<KeyKind> {
        const RSA: &[u8] = &[
            0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01,
        ];
        const P256: &[u8] = &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
        const P384: &[u8] = &[0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x22];
        // The AlgorithmIdentifier comes first: look only at the head.
        let head = &spki_der[..spki_der.len().min(40)];
        let has = |pat: &[u8]| head.windows(pat.len()).any(|w| w == pat);
        if has(RSA) {
            Some(KeyKind::Rsa)
        } else if has(P256) {
            Some(KeyKind::EcdsaP256)
        } else if has(P384) {
            Some(KeyKind::EcdsaP384)
        } else {
            None
        }
    }

    /// The schemes a key of this type signs with, most preferred first.
    pub fn schemes(self) -> &'static [SignScheme] {
        match self {
            KeyKind::Rsa => &[
                SignScheme::RsaPssSha512,
                SignScheme::RsaPssSha384,
                SignScheme::RsaPssSha256,
                SignScheme::RsaPkcs1Sha512,
                SignScheme::RsaPkcs1Sha384,
                SignScheme::RsaPkcs1Sha256,
            ],
            KeyKind::EcdsaP256 => &[SignScheme::EcdsaP256Sha256],
            KeyKind::EcdsaP384 => &[SignScheme::EcdsaP384Sha384],
        }
    }
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

    /// The key's type.
    pub fn kind(&self) -> KeyKind {
        match self {
            LocalKey::Rsa(_) => KeyKind::Rsa,
            LocalKey::EcdsaP256(_) => KeyKind::EcdsaP256,
            LocalKey::EcdsaP384(_) => KeyKind::EcdsaP384,
        }
    }

    /// The schemes this key can sign with, most preferred first.
    pub fn schemes(&self) -> &'static [SignScheme] {
        self.kind().schemes()
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
