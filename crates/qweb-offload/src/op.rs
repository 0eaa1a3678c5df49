//! Ops: the units of work engines execute.

use std::sync::Arc;

use crate::key::LocalKey;

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

/// A private-key signature: sign `message` (the whole message; the engine hashes it) with
/// `key` under `scheme`.
#[derive(Debug, Clone)]
pub struct SignOp {
    /// The key. Software engines sign with it; a remote engine identifies it by its id.
    pub key: Arc<LocalKey>,
    /// The scheme.
    pub scheme: SignScheme,
    /// The message to sign.
    pub message: Vec<u8>,
}

/// One unit of offloadable work.
#[derive(Debug, Clone)]
pub enum Op {
    /// A private-key signature.
    Sign(SignOp),
}

impl Op {
    /// Executes the op in software on the calling thread.
    pub fn execute(&self) -> OpResult {
        match self {
            Op::Sign(s) => s
                .key
                .sign(s.scheme, &s.message)
                .map(OpOutput::Signature)
                .map_err(|e| OpError::Failed(e.to_string())),
        }
    }

    /// A short name for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Op::Sign(s) if s.scheme.is_rsa() => "rsa_sign",
            Op::Sign(_) => "ecdsa_sign",
        }
    }
}

/// What an op produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpOutput {
    /// A signature.
    Signature(Vec<u8>),
}

/// Why an op did not produce a result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpError {
    /// The engine's queue is full.
    #[error("engine saturated")]
    Saturated,
    /// The op did not complete within the configured timeout.
    #[error("engine timed out")]
    Timeout,
    /// The engine went away before completing the op.
    #[error("engine dropped the op")]
    Dropped,
    /// The engine (or the crypto) failed.
    #[error("engine error: {0}")]
    Failed(String),
}

/// The outcome of an op.
pub type OpResult = Result<OpOutput, OpError>;
