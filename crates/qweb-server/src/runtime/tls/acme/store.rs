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
//! Nodes that share the state folder (NFS, a shared volume) share the certificates: while one
//! orders, `NAME.lock` exists (created with `O_EXCL`, which NFS v3+ honours) and the others
//! wait and then pick the certificate up. The lock is a file rather than a key-server lock
//! because the nodes must share the folder anyway to share the certificate; a lock older than
//! an order can last ([`STALE_LOCK`]) was left by a node that died and is taken over.
//!
//! With `[fleet]` the nodes share through the fleet's store instead (`super::fleet`), and
//! the folder is each node's own last copy: no lock file then.
//!
//! `DIR` names the CA (a hash of its directory URL), so that a certificate of a test CA is
//! never served for a production one; `NAME` is the site's first server name.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use rustls::sign::CertifiedKey;
use zeroize::Zeroizing;

/// Where one CA's account and certificates are kept.
#[derive(Debug, Clone)]
pub(crate) struct Store {
    dir: PathBuf,
}

/// A lock file older than this was left by a node that died mid-order (an order gives up
/// after 5 minutes).
pub(crate) const STALE_LOCK: std::time::Duration = std::time::Duration::from_secs(360);

/// An order in progress on this node: the lock file, removed when dropped.
pub(crate) struct OrderLock(PathBuf);

impl Drop for OrderLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A certificate found in the store.
pub(crate) struct Stored {
    pub key: Arc<CertifiedKey>,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

/// `DIR`: the CA's name in the state folder and in the fleet's store (the first 8 bytes of
/// the SHA-256 of its directory URL, in hex).
pub(crate) fn ca_name(directory: &str) -> String {
    let hash = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, directory.as_bytes());
    hash.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Store {
    pub(crate) fn new(state_dir: &Path, directory: &str) -> Store {
        Store {
            dir: state_dir.join("acme").join(ca_name(directory)),
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

    /// Takes the order lock of `names`; `None` while another node holds it.
    pub(crate) fn lock(&self, names: &[String]) -> std::io::Result<Option<OrderLock>> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        Self::ensure(&self.dir)?;
        let first = names.first().map(String::as_str).unwrap_or("_");
        let path = self.dir.join(format!("{first}.lock"));
        for _ in 0..2 {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
            {
                Ok(mut f) => {
                    let _ = writeln!(f, "{}", std::process::id());
                    return Ok(Some(OrderLock(path)));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let age = std::fs::metadata(&path)
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.elapsed().ok());
                    if age.is_some_and(|a| a > STALE_LOCK) {
                        tracing::warn!(lock = %path.display(), "taking over a stale order lock");
                        let _ = std::fs::remove_file(&path);
                        continue;
                    }
                    return Ok(None);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(None)
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
        self.load_file(&self.file(names), names, keyless)
    }

    /// [`Store::load`] from `file`.
    fn load_file(
        &self,
        file: &Path,
        names: &[String],
        keyless: Option<&qweb_tls::KeyOffload>,
    ) -> Result<Option<Stored>, String> {
        if !file.exists() {
            return Ok(None);
        }
        let provider = qweb_tls::provider();
        let loaded = match keyless {
            None => qweb_tls::load_certified_key(file, file, &provider),
            Some(k) => {
                // ordered with a key of qweb's own before `key = "keyserver:..."` was set:
                // the key server does not have that key, so order anew
                if qweb_tls::load_private_key(file).is_ok() {
                    return Ok(None);
                }
                qweb_tls::load_offloaded(file, None, &provider, k)
            }
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

impl Store {
    /// The saved file of `names` as it is (chain and key), if any.
    pub(crate) fn saved_bytes(&self, names: &[String]) -> Option<Zeroizing<Vec<u8>>> {
        std::fs::read(self.file(names)).ok().map(Zeroizing::new)
    }

    /// Makes `bytes` (a saved file's, from the fleet's store) the saved file of `names` when
    /// they load and are newer than the file saved here: then the certificate, else `None`
    /// (the same, older, expired, not covering every name). What does not load is refused
    /// and the file here stays.
    pub(crate) fn adopt(
        &self,
        names: &[String],
        bytes: &[u8],
        keyless: Option<&qweb_tls::KeyOffload>,
    ) -> Result<Option<Stored>, String> {
        if self.saved_bytes(names).is_some_and(|b| b[..] == *bytes) {
            return Ok(None);
        }
        Self::ensure(&self.dir).map_err(|e| e.to_string())?;
        let file = self.file(names);
        let candidate = file.with_extension("fleet");
        qweb_tls::state_file::write_replacing(&candidate, bytes, 0o600, |_| Ok(()))
            .map_err(|e| e.to_string())?;
        let loaded = self.load_file(&candidate, names, keyless);
        let newer = match &loaded {
            Ok(Some(s)) => match self.load(names, keyless) {
                Ok(Some(here)) => s.not_after > here.not_after,
                _ => true,
            },
            _ => false,
        };
        if !newer {
            let _ = std::fs::remove_file(&candidate);
            return loaded.map(|_| None);
        }
        std::fs::rename(&candidate, &file).map_err(|e| e.to_string())?;
        loaded
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One holder at a time; released when dropped; a lock older than an order can last is
    /// taken over.
    #[test]
    fn the_order_lock_is_exclusive_released_and_stale_after_an_order_timeout() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::new(d.path(), "https://ca.test/directory");
        let names = ["a.test".to_owned()];
        let first = store.lock(&names).unwrap().expect("free");
        assert!(store.lock(&names).unwrap().is_none(), "held");
        assert!(
            store.lock(&["b.test".to_owned()]).unwrap().is_some(),
            "per name"
        );
        drop(first);
        let again = store.lock(&names).unwrap().expect("released");
        let file = std::fs::File::options().write(true).open(&again.0).unwrap();
        file.set_modified(SystemTime::now() - STALE_LOCK - std::time::Duration::from_secs(1))
            .unwrap();
        let taken = store.lock(&names).unwrap();
        assert!(taken.is_some(), "a stale lock is taken over");
        std::mem::forget(again);
    }
    /// A saved certificate loads as it was ordered: with its key for a local key; for a
    /// key-server key, never from a file that holds a key (it was ordered with a local key
    /// before `key = "keyserver:..."` was set: the key server lacks it), and a chain alone
    /// does not load as a local-key certificate.
    #[test]
    fn saved_certificates_load_only_as_they_were_ordered() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::new(d.path(), "https://ca.test/directory");
        let names = vec!["s.test".to_owned()];
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let cert = rcgen::CertificateParams::new(names.clone())
            .unwrap()
            .self_signed(&kp)
            .unwrap();
        let keyless = qweb_tls::KeyOffload {
            engine: Arc::new(qweb_offload::InlineEngine::new("ks")),
            policy: qweb_offload::Policy {
                mode: qweb_offload::Mode::Sync,
                fallback: qweb_offload::Fallback::Fail,
                timeout: std::time::Duration::from_secs(1),
            },
        };
        store
            .save(&names, &cert.pem(), Some(&kp.serialize_pem()))
            .unwrap();
        assert!(store.load(&names, None).unwrap().is_some());
        assert!(store.load(&names, Some(&keyless)).unwrap().is_none());
        store.save(&names, &cert.pem(), None).unwrap();
        assert!(store.load(&names, Some(&keyless)).unwrap().is_some());
        assert!(store.load(&names, None).is_err());
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(store.file(&names)).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        // another name is not covered
        assert!(store.load(&["t.test".to_owned()], None).unwrap().is_none());
    }
    /// A file from the fleet's store replaces the one here only when it loads and is newer;
    /// what does not load is refused and the file here stays.
    #[test]
    fn a_file_from_the_fleet_is_adopted_only_when_it_loads_and_is_newer() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::new(d.path(), "https://ca.test/directory");
        let names = vec!["s.test".to_owned()];
        let file = |year: i32| {
            let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
            let mut p = rcgen::CertificateParams::new(names.clone()).unwrap();
            p.not_after = rcgen::date_time_ymd(year, 1, 1);
            let cert = p.self_signed(&kp).unwrap();
            format!("{}\n{}", cert.pem(), kp.serialize_pem()).into_bytes()
        };
        let (old, new) = (file(2040), file(2045));
        assert!(
            store.adopt(&names, &old, None).unwrap().is_some(),
            "none here"
        );
        assert_eq!(&store.saved_bytes(&names).unwrap()[..], &old[..]);
        assert!(
            store.adopt(&names, &old, None).unwrap().is_none(),
            "the same"
        );
        assert!(store.adopt(&names, b"garbage", None).is_err());
        assert!(store.adopt(&names, &new, None).unwrap().is_some(), "newer");
        assert!(store.adopt(&names, &old, None).unwrap().is_none(), "older");
        assert_eq!(&store.saved_bytes(&names).unwrap()[..], &new[..]);
        assert!(!store.file(&names).with_extension("fleet").exists());
    }
}
