//! Ops: the units of work engines execute.

use std::sync::Arc;

use crate::key::LocalKey;
pub use crate::key::SignScheme;

/// Identifies a key everywhere (qweb, key servers): SHA-256 of its DER
/// SubjectPublicKeyInfo, so that a holder of only the certificate can name it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId(pub [u8; 32]);

impl KeyId {
    /// The id of a DER SubjectPublicKeyInfo.
    pub fn of_spki(spki_der: &[u8]) -> KeyId {
        let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, spki_der);
        let mut id = [0u8; 32];
        id.copy_from_slice(d.as_ref());
        KeyId(id)
    }

    /// Lower-case hex.
    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl std::fmt::Debug for KeyId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyId({}..)", &self.hex()[..16])
    }
}

/// The key an op signs with: always its id; the key itself when this process holds it.
#[derive(Debug, Clone)]
pub struct KeyRef {
    /// SPKI SHA-256.
    pub id: KeyId,
    /// The private key, when held locally (software engines and the software fallback need
    /// it; a key server engine needs only the id).
    pub local: Option<Arc<LocalKey>>,
}

/// A private-key signature: sign `message` (the whole message; the engine hashes it) with
/// `key` under `scheme`.
#[derive(Debug, Clone)]
pub struct SignOp {
    /// The key. Software engines sign with its local part; a remote engine sends its id.
    pub key: KeyRef,
    /// The scheme.
    pub scheme: SignScheme,
    /// The message to sign.
    pub message: Vec<u8>,
}

/// A yes-or-no check of the caller's own, run on an engine thread (a password hash
/// verification: tens to hundreds of milliseconds of CPU that must not run on an event
/// loop). The closure holds what it checks; nothing of it is printed by `Debug`.
#[derive(Clone)]
pub struct CheckOp {
    /// A short name for logs and metrics (`"password_verify"`).
    pub kind: &'static str,
    /// The check.
    pub check: Arc<dyn Fn() -> bool + Send + Sync>,
}

impl std::fmt::Debug for CheckOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckOp").field("kind", &self.kind).finish()
    }
}

/// One unit of offloadable work.
#[derive(Debug, Clone)]
pub enum Op {
    /// A private-key signature.
    Sign(SignOp),
    /// One chunk of a compressed response body.
    Compress(crate::compress::CompressOp),
    /// A check of the caller's own (software engines only: a key server refuses it).
    Check(CheckOp),
}

impl Op {
    /// Executes the op in software on the calling thread.
    pub fn execute(&self) -> OpResult {
        match self {
            Op::Sign(s) => match &s.key.local {
                Some(k) => k
                    .sign(s.scheme, &s.message)
                    .map(OpOutput::Signature)
                    .map_err(|e| OpError::Failed(e.to_string())),
                None => Err(OpError::Failed(
                    "this engine needs the private key, and this process does not hold it".into(),
                )),
            },
            Op::Compress(c) => (c.software)(c)
                .map(OpOutput::Compressed)
                .map_err(OpError::Failed),
            Op::Check(c) => Ok(OpOutput::Checked((c.check)())),
        }
    }

    /// A short name for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Op::Sign(s) if s.scheme.is_rsa() => "rsa_sign",
            Op::Sign(_) => "ecdsa_sign",
            Op::Compress(c) => match c.codec {
                crate::compress::Codec::Gzip => "compress_gzip",
                crate::compress::Codec::Brotli => "compress_br",
                crate::compress::Codec::Zstd => "compress_zstd",
            },
            Op::Check(c) => c.kind,
        }
    }
}

/// What an op produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpOutput {
    /// A signature.
    Signature(Vec<u8>),
    /// A compressed chunk.
    Compressed(crate::compress::CompressedChunk),
    /// The answer of a [`CheckOp`].
    Checked(bool),
}

/// Why an op did not produce a result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
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
