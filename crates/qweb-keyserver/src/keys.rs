//! The key server's key files: PEM private keys, named by the SHA-256 of their public key.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use qweb_offload::{KeyId, LocalKey};

use crate::error::KeyserverError;

/// Loads PEM private keys and names them by their SPKI SHA-256.
pub fn load_keys(paths: &[PathBuf]) -> Result<HashMap<KeyId, Arc<LocalKey>>, KeyserverError> {
    let provider = qweb_tls::provider();
    let mut keys = HashMap::new();
    for p in paths {
        let der = qweb_tls::load_private_key(p)?;
        let bad = |m: String| KeyserverError::Config(format!("{}: {m}", p.display()));
        let signing = provider
            .key_provider
            .load_private_key(der.clone_key())
            .map_err(|e| bad(format!("unsupported key: {e}")))?;
        let spki = signing
            .public_key()
            .ok_or_else(|| bad("cannot derive the public key".into()))?;
        let id = KeyId::of_spki(spki.as_ref());
        let local = LocalKey::from_der(der.secret_der()).map_err(|e| bad(e.to_string()))?;
        keys.insert(id, Arc::new(local));
    }
    Ok(keys)
}
