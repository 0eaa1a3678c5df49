//! The self-signed default certificate for `localhost` and `127.0.0.1`.

use std::path::{Path, PathBuf};

use crate::TlsError;

/// Where the default certificate lives, and whether this run created it.
#[derive(Debug, Clone)]
pub struct SelfSigned {
    /// PEM certificate.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8), readable by the owner only.
    pub key: PathBuf,
    /// True when this call generated a new certificate.
    pub created: bool,
}

/// Makes sure `dir` holds a self-signed RSA-2048 certificate for `localhost`, `127.0.0.1` and
/// `::1` (`selfsigned.crt` / `selfsigned.key`), generating it when missing. An existing pair is
/// reused untouched.
pub fn ensure_self_signed(dir: &Path) -> Result<SelfSigned, TlsError> {
    let cert = dir.join("selfsigned.crt");
    let key = dir.join("selfsigned.key");
    if cert.is_file() && key.is_file() {
        return Ok(SelfSigned {
            cert,
            key,
            created: false,
        });
    }
    std::fs::create_dir_all(dir).map_err(|source| TlsError::Write {
        path: dir.to_owned(),
        source,
    })?;
    let gen_err = |e: rcgen::Error| TlsError::Generate(e.to_string());
    let kp = rcgen::KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048)
        .map_err(gen_err)?;
    let mut params =
        rcgen::CertificateParams::new(vec!["localhost".to_string()]).map_err(gen_err)?;
    params.subject_alt_names.push(rcgen::SanType::IpAddress(
        std::net::Ipv4Addr::LOCALHOST.into(),
    ));
    params.subject_alt_names.push(rcgen::SanType::IpAddress(
        std::net::Ipv6Addr::LOCALHOST.into(),
    ));
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "qweb self-signed (localhost)");
    let now = std::time::SystemTime::now();
    params.not_before = (now - std::time::Duration::from_secs(86_400)).into();
    params.not_after = (now + std::time::Duration::from_secs(397 * 86_400)).into();
    let c = params.self_signed(&kp).map_err(gen_err)?;
    // each through a new file renamed into place: never written through a planted symlink
    write_new(&key, kp.serialize_pem().as_bytes(), 0o600)?;
    write_new(&cert, c.pem().as_bytes(), 0o644)?;
    Ok(SelfSigned {
        cert,
        key,
        created: true,
    })
}

fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), TlsError> {
    crate::state_file::write_replacing(path, bytes, mode, |_| Ok(()))
        .map(drop)
        .map_err(|source| TlsError::Write {
            path: path.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{load_certified_key, provider};

    #[test]
    fn generates_once_then_reuses() {
        let dir = tempfile::tempdir().unwrap();
        let first = ensure_self_signed(dir.path()).unwrap();
        assert!(first.created);
        let pem = std::fs::read(&first.cert).unwrap();
        let second = ensure_self_signed(dir.path()).unwrap();
        assert!(!second.created);
        assert_eq!(pem, std::fs::read(&second.cert).unwrap());
        let loaded = load_certified_key(&first.cert, &first.key, &provider()).unwrap();
        assert_eq!(loaded.dns_names, vec!["localhost"]);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&first.key).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    /// A key name planted as a symlink (by whoever can write the state folder) is replaced,
    /// not written through: the file it points at is untouched.
    #[cfg(unix)]
    #[test]
    fn planted_symlinks_are_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join("selfsigned.key")).unwrap();
        let ss = ensure_self_signed(dir.path()).unwrap();
        assert!(ss.created);
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        let loaded = load_certified_key(&ss.cert, &ss.key, &provider()).unwrap();
        assert_eq!(loaded.dns_names, vec!["localhost"]);
    }
}
