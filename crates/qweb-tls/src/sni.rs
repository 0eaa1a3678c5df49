//! Choosing a certificate by the SNI name the client sent.

use std::collections::HashMap;
use std::sync::Arc;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::ocsp::OcspStaple;
use crate::LoadedCert;

/// A certificate, and its OCSP staple holder when it is stapled.
#[derive(Debug, Clone)]
struct Entry {
    key: Arc<CertifiedKey>,
    ocsp: Option<Arc<OcspStaple>>,
}

impl Entry {
    fn of(cert: &LoadedCert) -> Entry {
        Entry {
            key: cert.key.clone(),
            ocsp: cert.ocsp.clone(),
        }
    }

    /// With the staple while it is current (checked now, at every handshake).
    fn key(&self) -> Arc<CertifiedKey> {
        match &self.ocsp {
            Some(s) => s.key_at(std::time::SystemTime::now()),
            None => self.key.clone(),
        }
    }
}

/// Picks a certificate by exact name, then by wildcard (`*.example.com` matches exactly one
/// label), then falls back to the default (the first certificate given). Clients that send no
/// SNI (for example when connecting to an IP address) get the default.
#[derive(Debug)]
pub struct SniResolver {
    exact: HashMap<String, Entry>,
    wildcard: HashMap<String, Entry>,
    default: Entry,
}

impl SniResolver {
    /// Builds a resolver. Returns `None` when `certs` is empty. When two certificates claim the
    /// same name, the first one wins.
    pub fn new(certs: &[LoadedCert]) -> Option<Self> {
        let default = Entry::of(certs.first()?);
        let mut exact = HashMap::new();
        let mut wildcard = HashMap::new();
        for cert in certs {
            for name in &cert.dns_names {
                match name.strip_prefix("*.") {
                    Some(suffix) => wildcard
                        .entry(suffix.to_owned())
                        .or_insert_with(|| Entry::of(cert)),
                    None => exact.entry(name.clone()).or_insert_with(|| Entry::of(cert)),
                };
            }
        }
        Some(SniResolver {
            exact,
            wildcard,
            default,
        })
    }

    /// The certificate for a server name (already lower-case, as rustls gives it).
    pub fn lookup(&self, name: Option<&str>) -> Arc<CertifiedKey> {
        let Some(name) = name else {
            return self.default.key();
        };
        let name = name.trim_end_matches('.');
        if let Some(k) = self.exact.get(name) {
            return k.key();
        }
        if let Some((_, parent)) = name.split_once('.') {
            if let Some(k) = self.wildcard.get(parent) {
                return k.key();
            }
        }
        self.default.key()
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.lookup(hello.server_name()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{load_certified_key, provider};

    fn cert(names: &[&str]) -> LoadedCert {
        let dir = tempfile::tempdir().unwrap();
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let params =
            rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        let c = params.self_signed(&kp).unwrap();
        std::fs::write(dir.path().join("c"), c.pem()).unwrap();
        std::fs::write(dir.path().join("k"), kp.serialize_pem()).unwrap();
        load_certified_key(&dir.path().join("c"), &dir.path().join("k"), &provider()).unwrap()
    }

    #[test]
    fn exact_wildcard_default() {
        let a = cert(&["a.test"]);
        let b = cert(&["*.b.test", "b.test"]);
        let r = SniResolver::new(&[a.clone(), b.clone()]).unwrap();
        assert!(Arc::ptr_eq(&r.lookup(Some("a.test")), &a.key));
        assert!(Arc::ptr_eq(&r.lookup(Some("b.test")), &b.key));
        assert!(Arc::ptr_eq(&r.lookup(Some("x.b.test")), &b.key));
        // a wildcard covers one label only
        assert!(Arc::ptr_eq(&r.lookup(Some("y.x.b.test")), &a.key));
        assert!(Arc::ptr_eq(&r.lookup(Some("other.test")), &a.key));
        assert!(Arc::ptr_eq(&r.lookup(None), &a.key));
        assert!(SniResolver::new(&[]).is_none());
    }
}
