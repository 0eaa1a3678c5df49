//! Choosing a certificate by the SNI name the client sent.

use std::collections::HashMap;
use std::sync::Arc;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{CipherSuite, SignatureAlgorithm, SignatureScheme, SupportedCipherSuite};

use crate::managed::{Managed, ALPN_ACME};
use crate::ocsp::OcspStaple;
use crate::LoadedCert;

/// Where a name's certificate comes from.
enum Found<'a> {
    Files(&'a Choices),
    Managed(Arc<CertifiedKey>),
}

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
    /// `None`: no certificate file, only managed ones (a client without SNI, or with a name
    /// none covers, fails the handshake).
    default: Option<Choices>,
    /// Certificates ordered by ACME, after exact names and before wildcards; and the
    /// TLS-ALPN-01 challenge answers.
    managed: Option<Arc<Managed>>,
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
            default: Some(default),
            managed: None,
        })
    }

    /// A resolver for `certs` (possibly none) and the certificates in `managed`.
    pub fn with_managed(certs: &[LoadedCert], managed: Arc<Managed>) -> Self {
        let mut r = Self::new(certs).unwrap_or(SniResolver {
            exact: HashMap::new(),
            wildcard: HashMap::new(),
            default: None,
            managed: None,
        });
        r.managed = Some(managed);
        r
    }

    /// The certificates for a server name (already lower-case, as rustls gives it): files by
    /// exact name, a managed certificate, files by wildcard, the default.
    fn choices(&self, name: Option<&str>) -> Option<Found<'_>> {
        let Some(name) = name else {
            return self.default.as_ref().map(Found::Files);
        };
        let name = name.trim_end_matches('.');
        if let Some(k) = self.exact.get(name) {
            return Some(Found::Files(k));
        }
        if let Some(k) = self.managed.as_ref().and_then(|m| m.cert(name)) {
            return Some(Found::Managed(k));
        }
        if let Some((_, parent)) = name.split_once('.') {
            if let Some(k) = self.wildcard.get(parent) {
                return Some(Found::Files(k));
            }
        }
        self.default.as_ref().map(Found::Files)
    }

    /// The certificate for a server name and a client that offers `schemes` and `suites`
    /// (`None`: no certificate covers the name and there is no default).
    pub fn lookup_for(
        &self,
        name: Option<&str>,
        schemes: &[SignatureScheme],
        suites: &[CipherSuite],
    ) -> Option<Arc<CertifiedKey>> {
        Some(match self.choices(name)? {
            Found::Files(c) => c.pick(&Offer { schemes, suites }).key(),
            Found::Managed(k) => k,
        })
    }

    /// The certificate for a server name, for a client that can verify any of them (the
    /// cheapest to sign with).
    pub fn lookup(&self, name: Option<&str>) -> Option<Arc<CertifiedKey>> {
        Some(match self.choices(name)? {
            Found::Files(c) => c.0[0].key(),
            Found::Managed(k) => k,
        })
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
        if let Some(m) = &self.managed {
            // a CA validating TLS-ALPN-01 offers `acme-tls/1` alone (RFC 8737 section 3)
            if let Some(mut alpn) = hello.alpn() {
                if alpn.next() == Some(ALPN_ACME) && alpn.next().is_none() {
                    return hello.server_name().and_then(|n| m.alpn_cert(n));
                }
            }
        }
        self.lookup_for(
            hello.server_name(),
            hello.signature_schemes(),
            hello.cipher_suites(),
        )
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
        assert!(Arc::ptr_eq(&r.lookup(Some("a.test")).unwrap(), &a.key));
        assert!(Arc::ptr_eq(&r.lookup(Some("b.test")).unwrap(), &b.key));
        assert!(Arc::ptr_eq(&r.lookup(Some("x.b.test")).unwrap(), &b.key));
        // a wildcard covers one label only
        assert!(Arc::ptr_eq(&r.lookup(Some("y.x.b.test")).unwrap(), &a.key));
        assert!(Arc::ptr_eq(&r.lookup(Some("other.test")).unwrap(), &a.key));
        assert!(Arc::ptr_eq(&r.lookup(None).unwrap(), &a.key));
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
                r.lookup_for(Some("d.test"), schemes, suites).unwrap()
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
            let o = r.lookup_for(Some("o.test"), &pss, &[ECDHE_RSA]).unwrap();
            assert!(Arc::ptr_eq(&o, &other.key));
        }
        // the default (no SNI) has the first certificate's alternatives too
        let r = SniResolver::new(&[rsa.clone(), other.clone(), ec.clone()]).unwrap();
        assert!(Arc::ptr_eq(
            &r.lookup_for(None, &both, &[TLS13]).unwrap(),
            &ec.key
        ));
        assert!(Arc::ptr_eq(
            &r.lookup_for(None, &pss, &[TLS13]).unwrap(),
            &rsa.key
        ));
    }
    /// Managed (ACME) certificates come after file certificates of the exact name and before
    /// wildcards, are swapped without a new resolver, and without any file there is no
    /// default: a name nothing covers gets no certificate (the handshake fails).
    #[test]
    fn managed_certificates_between_exact_and_wildcard() {
        let file = cert(&["f.test", "*.w.test"]);
        let m = Arc::new(Managed::default());
        let r = SniResolver::with_managed(std::slice::from_ref(&file), m.clone());
        let acme = cert(&["f.test", "x.w.test", "new.test"]);
        assert!(Arc::ptr_eq(&r.lookup(Some("new.test")).unwrap(), &file.key));
        m.install(
            &["f.test".into(), "x.w.test".into(), "new.test".into()],
            acme.key.clone(),
        );
        assert!(Arc::ptr_eq(&r.lookup(Some("f.test")).unwrap(), &file.key));
        assert!(Arc::ptr_eq(&r.lookup(Some("x.w.test")).unwrap(), &acme.key));
        assert!(Arc::ptr_eq(&r.lookup(Some("new.test")).unwrap(), &acme.key));
        let renewed = cert(&["new.test"]);
        m.install(&["new.test".into()], renewed.key.clone());
        assert!(Arc::ptr_eq(
            &r.lookup(Some("new.test")).unwrap(),
            &renewed.key
        ));

        let only = SniResolver::with_managed(&[], m);
        assert!(only.lookup(None).is_none());
        assert!(only.lookup(Some("other.test")).is_none());
        assert!(Arc::ptr_eq(
            &only.lookup(Some("new.test")).unwrap(),
            &renewed.key
        ));
    }
}
