//! Choosing a certificate by the SNI name the client sent.

use std::collections::HashMap;
use std::sync::Arc;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{CipherSuite, SignatureAlgorithm, SignatureScheme, SupportedCipherSuite};

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

/// The certificates for one name: at most one per key algorithm (a name may have an ECDSA and
/// an RSA certificate, nginx's and h2o's "dual certificates"), cheapest signature first.
#[derive(Debug, Clone)]
struct Choices(Vec<Entry>);

/// Signing cost rank of a key algorithm: the cheapest usable certificate is offered first
/// (an ECDSA P-256 signature costs about 1/25 of an RSA-2048 one).
fn cost(alg: SignatureAlgorithm) -> u8 {
    match alg {
        SignatureAlgorithm::ED25519 => 0,
        SignatureAlgorithm::ECDSA => 1,
        SignatureAlgorithm::RSA => 2,
        _ => 3,
    }
}

impl Choices {
    fn of(cert: &LoadedCert) -> Choices {
        Choices(vec![Entry::of(cert)])
    }

    /// Adds `cert` unless a certificate with its key algorithm is there already (the first
    /// one given wins, as for two certificates of one name before).
    fn add(&mut self, cert: &LoadedCert) {
        let alg = cert.key.key.algorithm();
        if self.0.iter().all(|e| e.key.key.algorithm() != alg) {
            self.0.push(Entry::of(cert));
            self.0.sort_by_key(|e| cost(e.key.key.algorithm()));
        }
    }

    /// The cheapest certificate the client can take: one of its signature schemes fits the
    /// key, and (for TLS 1.2) it offers a cipher suite for the key's algorithm. A client that
    /// can take none gets the most widely usable one (the last: RSA where there is one).
    fn pick(&self, offer: &Offer<'_>) -> &Entry {
        if let [only] = &self.0[..] {
            return only;
        }
        self.0
            .iter()
            .find(|e| offer.takes(&e.key))
            .or(self.0.last())
            .unwrap_or(&self.0[0])
    }
}

/// What a ClientHello says the client can verify.
struct Offer<'a> {
    schemes: &'a [SignatureScheme],
    suites: &'a [CipherSuite],
}

impl Offer<'_> {
    fn takes(&self, key: &CertifiedKey) -> bool {
        let alg = key.key.algorithm();
        // a TLS 1.3 suite works with any key; a TLS 1.2 one names its key's algorithm
        let suite = provider_suites()
            .iter()
            .any(|s| self.suites.contains(&s.suite()) && s.usable_for_signature_algorithm(alg));
        suite && key.key.choose_scheme(self.schemes).is_some()
    }
}

/// The cipher suites qweb's servers support (those of [`crate::provider`]).
fn provider_suites() -> &'static [SupportedCipherSuite] {
    static SUITES: std::sync::OnceLock<Vec<SupportedCipherSuite>> = std::sync::OnceLock::new();
    SUITES.get_or_init(|| crate::provider().cipher_suites)
}

/// Picks a certificate by exact name, then by wildcard (`*.example.com` matches exactly one
/// label), then falls back to the default (the first certificate given). Clients that send no
/// SNI (for example when connecting to an IP address) get the default. A name with an ECDSA
/// and an RSA certificate gets the one the client can verify, ECDSA when it can take both.
#[derive(Debug)]
pub struct SniResolver {
    exact: HashMap<String, Choices>,
    wildcard: HashMap<String, Choices>,
    default: Choices,
}

impl SniResolver {
    /// Builds a resolver. Returns `None` when `certs` is empty. When two certificates with
    /// keys of one algorithm claim the same name, the first one wins; certificates with keys
    /// of different algorithms for one name are both kept. The default is the first
    /// certificate, with the later ones that have its names and another key algorithm.
    pub fn new(certs: &[LoadedCert]) -> Option<Self> {
        let first = certs.first()?;
        let mut default = Choices::of(first);
        let mut exact: HashMap<String, Choices> = HashMap::new();
        let mut wildcard: HashMap<String, Choices> = HashMap::new();
        for cert in certs {
            if !std::ptr::eq(cert, first) && same_names(cert, first) {
                default.add(cert);
            }
            for name in &cert.dns_names {
                let table = match name.strip_prefix("*.") {
                    Some(suffix) => wildcard.entry(suffix.to_owned()),
                    None => exact.entry(name.clone()),
                };
                table
                    .and_modify(|c| c.add(cert))
                    .or_insert_with(|| Choices::of(cert));
            }
        }
        Some(SniResolver {
            exact,
            wildcard,
            default,
        })
    }

    /// The certificates for a server name (already lower-case, as rustls gives it).
    fn choices(&self, name: Option<&str>) -> &Choices {
        let Some(name) = name else {
            return &self.default;
        };
        let name = name.trim_end_matches('.');
        if let Some(k) = self.exact.get(name) {
            return k;
        }
        if let Some((_, parent)) = name.split_once('.') {
            if let Some(k) = self.wildcard.get(parent) {
                return k;
            }
        }
        &self.default
    }

    /// The certificate for a server name and a client that offers `schemes` and `suites`.
    pub fn lookup_for(
        &self,
        name: Option<&str>,
        schemes: &[SignatureScheme],
        suites: &[CipherSuite],
    ) -> Arc<CertifiedKey> {
        self.choices(name).pick(&Offer { schemes, suites }).key()
    }

    /// The certificate for a server name, for a client that can verify any of them (the
    /// cheapest to sign with).
    pub fn lookup(&self, name: Option<&str>) -> Arc<CertifiedKey> {
        self.choices(name).0[0].key()
    }
}

fn same_names(a: &LoadedCert, b: &LoadedCert) -> bool {
    let mut x = a.dns_names.clone();
    let mut y = b.dns_names.clone();
    x.sort();
    y.sort();
    x == y
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.lookup_for(
            hello.server_name(),
            hello.signature_schemes(),
            hello.cipher_suites(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{load_certified_key, provider};

    fn cert(names: &[&str]) -> LoadedCert {
        cert_with(names, &rcgen::PKCS_ECDSA_P256_SHA256)
    }

    fn cert_with(names: &[&str], alg: &'static rcgen::SignatureAlgorithm) -> LoadedCert {
        let dir = tempfile::tempdir().unwrap();
        let kp = rcgen::KeyPair::generate_for(alg).unwrap();
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

    const TLS13: CipherSuite = CipherSuite::TLS13_AES_128_GCM_SHA256;
    const ECDHE_RSA: CipherSuite = CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256;
    const ECDHE_ECDSA: CipherSuite = CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256;

    /// An RSA and an ECDSA certificate for one name: ECDSA to a client that can verify it
    /// (TLS 1.3, or TLS 1.2 with an ECDHE_ECDSA suite), RSA to one that cannot; the order the
    /// certificates were given in does not matter; a second ECDSA one for the name is ignored.
    #[test]
    fn dual_certificates_choose_by_what_the_client_verifies() {
        let rsa = cert_with(&["d.test"], &rcgen::PKCS_RSA_SHA256);
        let ec = cert(&["d.test"]);
        let ec2 = cert(&["d.test"]);
        let other = cert(&["o.test"]);
        let ecdsa = [SignatureScheme::ECDSA_NISTP256_SHA256];
        let pss = [
            SignatureScheme::RSA_PSS_SHA256,
            SignatureScheme::RSA_PKCS1_SHA256,
        ];
        let both = [
            SignatureScheme::RSA_PSS_SHA256,
            SignatureScheme::ECDSA_NISTP256_SHA256,
        ];
        for certs in [
            vec![rsa.clone(), ec.clone(), ec2.clone(), other.clone()],
            vec![other.clone(), ec.clone(), rsa.clone(), ec2.clone()],
        ] {
            let r = SniResolver::new(&certs).unwrap();
            let pick = |schemes: &[SignatureScheme], suites: &[CipherSuite]| {
                r.lookup_for(Some("d.test"), schemes, suites)
            };
            assert!(Arc::ptr_eq(&pick(&both, &[TLS13, ECDHE_RSA]), &ec.key));
            assert!(Arc::ptr_eq(&pick(&ecdsa, &[TLS13]), &ec.key));
            assert!(Arc::ptr_eq(&pick(&pss, &[TLS13, ECDHE_ECDSA]), &rsa.key));
            // TLS 1.2 only, RSA suites only: RSA, though ECDSA signatures are offered
            assert!(Arc::ptr_eq(&pick(&both, &[ECDHE_RSA]), &rsa.key));
            assert!(Arc::ptr_eq(&pick(&both, &[ECDHE_ECDSA]), &ec.key));
            // nothing fits: the most widely usable (RSA)
            assert!(Arc::ptr_eq(&pick(&[], &[]), &rsa.key));
            // the other name is unaffected
            let o = r.lookup_for(Some("o.test"), &pss, &[ECDHE_RSA]);
            assert!(Arc::ptr_eq(&o, &other.key));
        }
        // the default (no SNI) has the first certificate's alternatives too
        let r = SniResolver::new(&[rsa.clone(), other.clone(), ec.clone()]).unwrap();
        assert!(Arc::ptr_eq(&r.lookup_for(None, &both, &[TLS13]), &ec.key));
        assert!(Arc::ptr_eq(&r.lookup_for(None, &pss, &[TLS13]), &rsa.key));
    }
}
