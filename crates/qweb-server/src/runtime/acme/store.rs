//! What ACME keeps in the state folder, all of it private to qweb's user (folders 0700,
//! files 0600, written under a fresh name and renamed, see `qweb_tls::state_file`):
//!
//! ```text
//! STATE/acme/DIR/account.json     the account (its key included)
//! STATE/acme/DIR/NAME.pem          the chain, leaf first, then its private key (none
//!                                  when a key server holds it)
//! ```
//!
//! The chain and its key are one file, so that replacing it (one rename) never pairs a
//! chain with another key.
//!
//! `DIR` names the CA (a hash of its directory URL), so that a certificate of a test CA is
//! never served for a production one; `NAME` is the site's first server name.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use rustls::sign::CertifiedKey;

/// Where one CA's account and certificates are kept.
#[derive(Debug, Clone)]
pub(crate) struct Store {
    dir: PathBuf,
}

/// A certificate found in the store.
pub(crate) struct Stored {
    pub key: Arc<CertifiedKey>,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

impl Store {
    pub(crate) fn new(state_dir: &Path, directory: &str) -> Store {
        let hash = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, directory.as_bytes());
        let hex: String = hash.as_ref()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Store {
            dir: state_dir.join("acme").join(hex),
        }
    }

    fn file(&self, names: &[String]) -> PathBuf {
        let first = names.first().map(String::as_str).unwrap_or("_");
        self.dir.join(format!("{first}.pem"))
    }

    fn ensure(dir: &Path) -> std::io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
    }

    /// The account's credentials (JSON), if saved.
    pub(crate) fn account(&self) -> Option<Vec<u8>> {
        std::fs::read(self.dir.join("account.json")).ok()
    }

    pub(crate) fn save_account(&self, json: &[u8]) -> std::io::Result<()> {
        Self::ensure(&self.dir)?;
        qweb_tls::state_file::write_replacing(&self.dir.join("account.json"), json, 0o600, |_| {
            Ok(())
        })
        .map(drop)
    }

    /// The saved certificate for `names`, when it loads, covers every name and is not
    /// expired.
    /// With `keyless`, the file holds no key: the key server of that engine signs.
    pub(crate) fn load(
        &self,
        names: &[String],
        keyless: Option<&qweb_tls::KeyOffload>,
    ) -> Result<Option<Stored>, String> {
        let file = self.file(names);
        if !file.exists() {
            return Ok(None);
        }
        let provider = qweb_tls::provider();
        let loaded = match keyless {
            None => qweb_tls::load_certified_key(&file, &file, &provider),
            Some(k) => qweb_tls::load_offloaded(&file, None, &provider, k),
        }
        .map_err(|e| e.to_string())?;
        if !names.iter().all(|n| loaded.dns_names.contains(n)) {
            return Ok(None);
        }
        let leaf = loaded.key.cert.first().ok_or("empty chain")?;
        let (not_before, not_after) =
            qweb_tls::der::validity(leaf.as_ref()).map_err(|e| e.to_string())?;
        if not_after <= SystemTime::now() {
            return Ok(None);
        }
        Ok(Some(Stored {
            key: loaded.key,
            not_before,
            not_after,
        }))
    }

    /// Saves a new certificate for `names` with its key (none: a key server holds it),
    /// replacing the old one.
    pub(crate) fn save(
        &self,
        names: &[String],
        chain_pem: &str,
        key_pem: Option<&str>,
    ) -> std::io::Result<()> {
        Self::ensure(&self.dir)?;
        let mut bytes = chain_pem.trim_end().as_bytes().to_vec();
        bytes.push(b'\n');
        bytes.extend_from_slice(key_pem.unwrap_or_default().as_bytes());
        let file =
            qweb_tls::state_file::write_replacing(&self.file(names), &bytes, 0o600, |_| Ok(()));
        bytes.fill(0);
        file.map(drop)
    }
}
