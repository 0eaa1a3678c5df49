//! Keys the key server generates on request (`generated_keys = "DIR"`): ECDSA P-256 keys for
//! certificates that qweb orders by ACME, so that the private key never exists outside the
//! key server. Each is written to `DIR/LABEL-ID.key` (PKCS#8 PEM, mode 0600, under a fresh
//! name then renamed) before it is announced, and every key in `DIR` is loaded at start.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use qweb_offload::{KeyId, LocalKey};

use crate::error::KeyserverError;
use crate::protocol::ErrorCode;

/// Most keys kept in `generated_keys`: beyond it, generate requests are refused.
pub const MAX_GENERATED_KEYS: usize = 10_000;

/// The generated keys.
pub(crate) struct Generated {
    dir: PathBuf,
    keys: RwLock<HashMap<KeyId, Arc<LocalKey>>>,
}

impl Generated {
    /// Opens `dir` (created 0700 when missing) and loads its keys.
    pub(crate) fn open(dir: &Path) -> Result<Generated, KeyserverError> {
        use std::os::unix::fs::DirBuilderExt;
        let io = |e: std::io::Error| {
            KeyserverError::Config(format!("generated_keys {}: {e}", dir.display()))
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io)?;
        let mut files = Vec::new();
        for e in std::fs::read_dir(dir).map_err(io)? {
            let p = e.map_err(io)?.path();
            if p.extension().is_some_and(|x| x == "key") {
                files.push(p);
            }
        }
        files.sort();
        let keys = crate::keys::load_keys(&files)?;
        Ok(Generated {
            dir: dir.to_owned(),
            keys: RwLock::new(keys),
        })
    }

    /// The generated key `id`.
    pub(crate) fn get(&self, id: &KeyId) -> Option<Arc<LocalKey>> {
        self.keys
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .cloned()
    }

    /// Ids of the keys (for the start-up banner).
    pub(crate) fn len(&self) -> usize {
        self.keys
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Generates a key named `label`, saves it, and returns its id and public key.
    pub(crate) fn generate(&self, label: &str) -> Result<(KeyId, Vec<u8>), (ErrorCode, String)> {
        let ok = !label.is_empty()
            && label.len() <= 253
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
            && !label.starts_with('.');
        if !ok {
            return Err((
                ErrorCode::BadRequest,
                "a label is a lower-case DNS name".into(),
            ));
        }
        if self.len() >= MAX_GENERATED_KEYS {
            return Err((
                ErrorCode::Overloaded,
                format!("{MAX_GENERATED_KEYS} generated keys are kept already"),
            ));
        }
        let internal = |m: String| (ErrorCode::Internal, m);
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(|e| internal(format!("key generation: {e}")))?;
        let spki = kp.public_key_der();
        let id = KeyId::of_spki(&spki);
        let local = LocalKey::from_der(&kp.serialize_der())
            .map_err(|e| internal(format!("key generation: {e}")))?;
        let hex: String = id.0[..8].iter().map(|b| format!("{b:02x}")).collect();
        let path = self.dir.join(format!("{label}-{hex}.key"));
        let pem = zeroize::Zeroizing::new(kp.serialize_pem());
        qweb_tls::state_file::write_replacing(&path, pem.as_bytes(), 0o600, |_| Ok(()))
            .map_err(|e| internal(format!("saving {}: {e}", path.display())))?;
        self.keys
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, Arc::new(local));
        tracing::info!(key = %hex, label, "generated a key");
        Ok((id, spki))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A generated key is saved privately, found by its id, and loaded again by the next
    /// start; labels that are not DNS names are refused.
    #[test]
    fn generated_keys_are_saved_private_and_reloaded() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("gen");
        let g = Generated::open(&dir).unwrap();
        let (id, spki) = g.generate("a.example").unwrap();
        assert_eq!(KeyId::of_spki(&spki), id);
        assert!(g.get(&id).is_some());
        for bad in ["", "../x", "A.example", ".x", "a/b"] {
            assert_eq!(
                g.generate(bad).unwrap_err().0,
                ErrorCode::BadRequest,
                "{bad}"
            );
        }
        let files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap())
            .collect();
        assert_eq!(files.len(), 1);
        let mode =
            std::os::unix::fs::PermissionsExt::mode(&files[0].metadata().unwrap().permissions());
        assert_eq!(mode & 0o777, 0o600);
        let again = Generated::open(&dir).unwrap();
        assert!(again.get(&id).is_some());
    }
}
