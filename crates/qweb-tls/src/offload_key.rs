//! A rustls signing key whose signatures go to an offload engine.
//!
//! rustls calls [`Signer::sign`] synchronously inside `process_new_packets`. Inside a job
//! (async mode) the signer pauses the job with the op; the handshake driver has the engine
//! execute it and resumes the job with the result. Outside a job (sync mode) the signer
//! submits the op to the engine itself and blocks the thread until the result arrives: the
//! paper's "straight" offload, kept as the baseline.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use qweb_offload::job;
use qweb_offload::{
    run_blocking, Engine, Fallback, KeyKind, KeyRef, Op, OpOutput, Policy, SignOp, SignScheme,
};
use rustls::sign::{Signer, SigningKey};
use rustls::{SignatureAlgorithm, SignatureScheme};

/// Where a signing key's signatures go, and on what terms: the engine and the shared offload
/// [`Policy`] (its mode is the listener's; the signer itself pauses when it runs inside a job
/// and blocks otherwise).
#[derive(Clone)]
pub struct KeyOffload {
    /// The engine (also used directly in sync mode).
    pub engine: Arc<dyn Engine>,
    /// Mode, fallback, and the per-op timeout that sync mode applies (async mode applies the
    /// worker offloader's timeout).
    pub policy: Policy,
}

/// A signing key that offloads its signatures. The private key itself is optional: with a
/// key server engine, qweb needs only the certificate (the key is named by its id).
pub struct OffloadSigningKey {
    key: KeyRef,
    kind: KeyKind,
    offload: KeyOffload,
}

impl std::fmt::Debug for OffloadSigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OffloadSigningKey")
            .field("key", &self.key.id)
            .field("local", &self.key.local.is_some())
            .field("engine", &self.offload.engine.name())
            .finish()
    }
}

impl OffloadSigningKey {
    /// A key of type `kind`, named by `key.id`, held locally when `key.local` is set.
    pub fn new(key: KeyRef, kind: KeyKind, offload: KeyOffload) -> Self {
        OffloadSigningKey { key, kind, offload }
    }
}

fn to_rustls(s: SignScheme) -> SignatureScheme {
    match s {
        SignScheme::RsaPkcs1Sha256 => SignatureScheme::RSA_PKCS1_SHA256,
        SignScheme::RsaPkcs1Sha384 => SignatureScheme::RSA_PKCS1_SHA384,
        SignScheme::RsaPkcs1Sha512 => SignatureScheme::RSA_PKCS1_SHA512,
        SignScheme::RsaPssSha256 => SignatureScheme::RSA_PSS_SHA256,
        SignScheme::RsaPssSha384 => SignatureScheme::RSA_PSS_SHA384,
        SignScheme::RsaPssSha512 => SignatureScheme::RSA_PSS_SHA512,
        SignScheme::EcdsaP256Sha256 => SignatureScheme::ECDSA_NISTP256_SHA256,
        SignScheme::EcdsaP384Sha384 => SignatureScheme::ECDSA_NISTP384_SHA384,
    }
}

impl SigningKey for OffloadSigningKey {
    fn choose_scheme(&self, offered: &[SignatureScheme]) -> Option<Box<dyn Signer>> {
        let scheme = self
            .kind
            .schemes()
            .iter()
            .copied()
            .find(|s| offered.contains(&to_rustls(*s)))?;
        Some(Box::new(OffloadSigner {
            key: self.key.clone(),
            offload: self.offload.clone(),
            scheme,
        }))
    }

    fn algorithm(&self) -> SignatureAlgorithm {
        match self.kind {
            KeyKind::Rsa => SignatureAlgorithm::RSA,
            KeyKind::EcdsaP256 | KeyKind::EcdsaP384 => SignatureAlgorithm::ECDSA,
        }
    }
}

struct OffloadSigner {
    key: KeyRef,
    offload: KeyOffload,
    scheme: SignScheme,
}

impl std::fmt::Debug for OffloadSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OffloadSigner({:?})", self.scheme)
    }
}

impl Signer for OffloadSigner {
    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, rustls::Error> {
        let op = Op::Sign(SignOp {
            key: self.key.clone(),
            scheme: self.scheme,
            message: message.to_vec(),
        });
        let result = match job::pause(op) {
            Ok(r) => r, // async: the driver had it executed
            Err(op) => run_blocking(&*self.offload.engine, op, self.offload.policy.timeout), // sync
        };
        match result {
            Ok(OpOutput::Signature(sig)) => Ok(sig),
            Ok(_) => Err(rustls::Error::General(
                "the engine returned no signature".into(),
            )),
            Err(e) => match (self.offload.policy.fallback, &self.key.local) {
                (Fallback::Software, Some(local)) => {
                    self.offload
                        .engine
                        .metrics()
                        .fallen_back
                        .fetch_add(1, Relaxed);
                    tracing::debug!(
                        engine = self.offload.engine.name(),
                        "offload failed ({e}); signing in software"
                    );
                    local
                        .sign(self.scheme, message)
                        .map_err(|e| rustls::Error::General(format!("signing failed: {e}")))
                }
                (Fallback::Software, None) => {
                    tracing::warn!(
                        engine = self.offload.engine.name(),
                        key = %self.key.id.hex(),
                        "offloaded signature failed ({e}) and the key is not held here; failing the handshake"
                    );
                    Err(rustls::Error::General(format!(
                        "offloaded signature failed: {e}"
                    )))
                }
                (Fallback::Fail, _) => {
                    tracing::warn!(
                        engine = self.offload.engine.name(),
                        "offloaded signature failed ({e}); failing the handshake"
                    );
                    Err(rustls::Error::General(format!(
                        "offloaded signature failed: {e}"
                    )))
                }
            },
        }
    }

    fn scheme(&self) -> SignatureScheme {
        to_rustls(self.scheme)
    }
}
