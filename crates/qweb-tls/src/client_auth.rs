//! Client certificates (`[listener.tls] client_auth`): the rustls verifier that checks them
//! against the configured CA, and the identity a verified certificate gives the requests of
//! its connection ([`ClientCert`]: subject and SHA-256 fingerprint).
//!
//! rustls' [`WebPkiClientVerifier`] checks the chain (to one of the CA file's certificates),
//! the validity period and the key usage (`clientAuth`); what it refuses fails the handshake
//! with a TLS alert (`certificate_required` for no certificate where one is required,
//! `unknown_ca`, `certificate_expired`, `bad_certificate`, ...). With `required = false`
//! a client may send none; one that is sent is still checked.
//!
//! With `names`, [`NamesVerifier`] wraps it: a chain that verifies must also carry one of
//! the accepted names as a DNS subject alternative name, or the handshake fails with
//! `access_denied` (the certificate is valid, the site does not accept its holder).

use std::fmt::Write;
use std::path::Path;
use std::sync::Arc;

use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use rustls_pki_types::CertificateDer;

use crate::der::{cert_parts, Der, DerError};
use crate::TlsError;

/// A listener's client-certificate policy, ready for its `ServerConfig`.
#[derive(Clone)]
pub struct ClientAuth {
    /// The verifier rustls runs on the client's chain.
    pub verifier: Arc<dyn ClientCertVerifier>,
    /// A digest of the policy (the CA certificates and `required`): session tickets and
    /// cached sessions carry it, and only a listener with the same policy resumes them.
    pub tag: [u8; 32],
}

impl std::fmt::Debug for ClientAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientAuth")
            .field("tag", &hex(&self.tag))
            .finish_non_exhaustive()
    }
}

impl ClientAuth {
    /// The policy "certificates chaining to one in `ca` (PEM); none allowed unless
    /// `required`".
    pub fn from_ca_file(ca: &Path, required: bool) -> Result<ClientAuth, TlsError> {
        ClientAuth::with_names(ca, required, &[])
    }

    /// [`ClientAuth::from_ca_file`], and a certificate must carry one of `names` (lower
    /// case [`NamePattern`]s; empty: any name) as a DNS subject alternative name.
    pub fn with_names(
        ca: &Path,
        required: bool,
        names: &[NamePattern],
    ) -> Result<ClientAuth, TlsError> {
        let certs = crate::load_certs(ca)?;
        ClientAuth::new(ca, certs, required, names)
    }

    fn new(
        ca: &Path,
        certs: Vec<CertificateDer<'static>>,
        required: bool,
        names: &[NamePattern],
    ) -> Result<ClientAuth, TlsError> {
        let mut roots = RootCertStore::empty();
        let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
        ctx.update(b"qweb client_auth v2");
        ctx.update(&[u8::from(required)]);
        // the names are part of the policy: a session verified under other names (or none)
        // does not resume here
        ctx.update(&(names.len() as u64).to_be_bytes());
        for n in names {
            ctx.update(&(n.0.len() as u64).to_be_bytes());
            ctx.update(n.0.as_bytes());
        }
        for c in &certs {
            roots.add(c.clone()).map_err(|e| TlsError::Pem {
                path: ca.to_owned(),
                message: format!("not a usable CA certificate: {e}"),
            })?;
            ctx.update(&(c.len() as u64).to_be_bytes());
            ctx.update(c);
        }
        let builder = WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(crate::provider()),
        );
        let builder = if required {
            builder
        } else {
            builder.allow_unauthenticated()
        };
        let verifier = builder.build().map_err(|e| TlsError::Pem {
            path: ca.to_owned(),
            message: format!("cannot verify client certificates with it: {e}"),
        })?;
        let verifier: Arc<dyn ClientCertVerifier> = if names.is_empty() {
            verifier
        } else {
            Arc::new(NamesVerifier {
                inner: verifier,
                names: names.to_vec(),
            })
        };
        let mut tag = [0u8; 32];
        tag.copy_from_slice(ctx.finish().as_ref());
        Ok(ClientAuth { verifier, tag })
    }
}

/// Why a `client_auth` name is refused (`qweb -t` names the key).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// Empty, or with a character other than letters, digits, `-` and `.`.
    #[error("{0:?} is not a DNS name (letters, digits, `-` and `.` only, no spaces)")]
    NotDns(String),
    /// A `*` elsewhere than as the whole first label of a name of at least two more labels.
    #[error("{0:?}: a wildcard is `*.` before at least two labels (`*.ops.example`)")]
    Wildcard(String),
}

/// An accepted client name: `api-client.example` (that name) or `*.ops.example` (one label,
/// any, before `ops.example`; not `ops.example` itself, nor two labels), matched without
/// regard to case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamePattern(String);

impl NamePattern {
    /// Reads `s` (a trailing `.` is dropped).
    pub fn parse(s: &str) -> Result<NamePattern, NameError> {
        let n = s.strip_suffix('.').unwrap_or(s).to_ascii_lowercase();
        let rest = match n.strip_prefix("*.") {
            Some(rest) => {
                if rest.split('.').count() < 2 {
                    return Err(NameError::Wildcard(s.to_owned()));
                }
                rest
            }
            None => &n,
        };
        if rest.contains('*') {
            return Err(NameError::Wildcard(s.to_owned()));
        }
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        };
        if rest.len() > 253 || !rest.split('.').all(label_ok) {
            return Err(NameError::NotDns(s.to_owned()));
        }
        Ok(NamePattern(n))
    }

    /// The pattern as written (lower case).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `name` (a certificate's DNS name) is one this pattern accepts. A wildcard name in
    /// the certificate (`*.ops.example`) is never accepted: it names no one client.
    pub fn matches(&self, name: &str) -> bool {
        let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
        if name.contains('*') {
            return false;
        }
        match self.0.strip_prefix("*.") {
            Some(parent) => name
                .split_once('.')
                .is_some_and(|(first, rest)| !first.is_empty() && rest == parent),
            None => name == self.0,
        }
    }
}

/// The chain verifier of a policy with `names`: the inner verifier's checks, then the leaf's
/// DNS subject alternative names against the accepted names. The subject's CN is not read:
/// a name in the CN is not one the CA vouched for as a name (RFC 9525 and webpki read only
/// the SAN for servers, Envoy's `match_typed_subject_alt_names` likewise for clients).
#[derive(Debug)]
pub struct NamesVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    names: Vec<NamePattern>,
}

impl NamesVerifier {
    /// The leaf `der` carries a DNS name one of `names` accepts.
    fn accepts(names: &[NamePattern], der: &CertificateDer<'_>) -> bool {
        let Ok(ee) = webpki::EndEntityCert::try_from(der) else {
            return false;
        };
        ee.valid_dns_names()
            .any(|n| names.iter().any(|p| p.matches(n)))
    }
}

impl ClientCertVerifier for NamesVerifier {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        let ok = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        if NamesVerifier::accepts(&self.names, end_entity) {
            Ok(ok)
        } else {
            // rustls sends `access_denied` for this one: the chain is valid, its holder is
            // not one the policy lets in
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The verified certificate of a connection's client, as requests see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCert {
    /// The subject as an RFC 4514 string (`CN=alice,O=ops`: the last RDN first).
    pub subject: String,
    /// SHA-256 of the certificate's DER, lower-case hex.
    pub fingerprint: String,
}

impl ClientCert {
    /// The identity of the end-entity certificate `der` (already verified by rustls).
    pub fn of(der: &[u8]) -> ClientCert {
        let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, der);
        let subject = cert_parts(der)
            .and_then(|(name, _, _)| rfc4514(&name))
            .unwrap_or_default();
        ClientCert {
            subject,
            fingerprint: hex(digest.as_ref()),
        }
    }

    /// The identity of a handshake's peer chain (its first certificate); `None`: no chain.
    pub fn of_chain(chain: Option<&[CertificateDer<'_>]>) -> Option<ClientCert> {
        chain.and_then(|c| c.first()).map(|c| ClientCert::of(c))
    }
}

/// The configurations of sites with a client-certificate policy of their own, by the server
/// names that choose them (SNI): a handshake whose ClientHello names one of them runs with its
/// configuration; the others with the listener's. Names are lower case; `*.example.com`
/// matches one label before `example.com`, as sites' `server_names` do.
#[derive(Debug, Default)]
pub struct SitePolicies {
    exact: std::collections::HashMap<String, (usize, Arc<rustls::ServerConfig>)>,
    wildcard: std::collections::HashMap<String, (usize, Arc<rustls::ServerConfig>)>,
}

impl SitePolicies {
    /// Adds site `site`'s configuration for `names` (a name already taken keeps its first).
    pub fn add(&mut self, site: usize, names: &[String], config: Arc<rustls::ServerConfig>) {
        for n in names {
            let n = n.to_ascii_lowercase();
            let entry = (site, config.clone());
            match n.strip_prefix("*.") {
                Some(parent) => self.wildcard.entry(parent.to_owned()).or_insert(entry),
                None => self.exact.entry(n).or_insert(entry),
            };
        }
    }

    /// No site has a policy of its own.
    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.wildcard.is_empty()
    }

    /// The site and configuration for the ClientHello's server name (`None`: the
    /// listener's).
    pub fn pick(&self, sni: Option<&str>) -> Option<&(usize, Arc<rustls::ServerConfig>)> {
        let name = sni?.trim_end_matches('.').to_ascii_lowercase();
        if let Some(e) = self.exact.get(&name) {
            return Some(e);
        }
        let (_, parent) = name.split_once('.')?;
        self.wildcard.get(parent)
    }
}

/// Binds `config`'s resumption to `tag` (a [`ClientAuth::tag`]): its tickets carry the tag
/// inside their encryption and its cached sessions are kept under it, so that a session
/// resumes only where the policy that verified (or did not ask for) its client certificate is
/// the same. A ticket of another listener, of a reload that changed the CA or `required`, or
/// of another server sharing the ticket keys does not resume here: the handshake is full and
/// the client's certificate is verified again.
pub fn bind_sessions(config: &mut rustls::ServerConfig, tag: [u8; 32]) {
    config.ticketer = Arc::new(BoundTickets {
        inner: config.ticketer.clone(),
        tag,
    });
    config.session_storage = Arc::new(BoundSessions {
        inner: config.session_storage.clone(),
        tag,
    });
}

/// The first bytes of a bound ticket's plaintext. Read as rustls' session value they say
/// "a server name, empty", which rustls refuses: a listener without `client_auth` that shares
/// the ticket keys never resumes a bound ticket (nor takes its client certificate).
const BOUND: [u8; 2] = [1, 0];

#[derive(Debug)]
struct BoundTickets {
    inner: Arc<dyn rustls::server::ProducesTickets>,
    tag: [u8; 32],
}

impl rustls::server::ProducesTickets for BoundTickets {
    fn enabled(&self) -> bool {
        self.inner.enabled()
    }

    fn lifetime(&self) -> u32 {
        self.inner.lifetime()
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        let mut v = Vec::with_capacity(BOUND.len() + self.tag.len() + plain.len());
        v.extend_from_slice(&BOUND);
        v.extend_from_slice(&self.tag);
        v.extend_from_slice(plain);
        self.inner.encrypt(&v)
    }

    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        let plain = self.inner.decrypt(cipher)?;
        plain
            .strip_prefix(&BOUND[..])?
            .strip_prefix(&self.tag[..])
            .map(<[u8]>::to_vec)
    }
}

#[derive(Debug)]
struct BoundSessions {
    inner: Arc<dyn rustls::server::StoresServerSessions>,
    tag: [u8; 32],
}

impl BoundSessions {
    fn key(&self, key: &[u8]) -> Vec<u8> {
        let mut k = self.tag.to_vec();
        k.extend_from_slice(key);
        k
    }
}

impl rustls::server::StoresServerSessions for BoundSessions {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        self.inner.put(self.key(&key), value)
    }

    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.inner.get(&self.key(key))
    }

    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.inner.take(&self.key(key))
    }

    fn can_cache(&self) -> bool {
        self.inner.can_cache()
    }
}

fn hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    s
}

const SEQ: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;

/// The short names of RFC 4514 section 3, and `emailAddress`, by their OID's DER.
const NAMES: &[(&[u8], &str)] = &[
    (&[0x55, 0x04, 0x03], "CN"),
    (&[0x55, 0x04, 0x07], "L"),
    (&[0x55, 0x04, 0x08], "ST"),
    (&[0x55, 0x04, 0x0a], "O"),
    (&[0x55, 0x04, 0x0b], "OU"),
    (&[0x55, 0x04, 0x06], "C"),
    (&[0x55, 0x04, 0x09], "STREET"),
    (
        &[0x09, 0x92, 0x26, 0x89, 0x93, 0xf2, 0x2c, 0x64, 0x01, 0x19],
        "DC",
    ),
    (
        &[0x09, 0x92, 0x26, 0x89, 0x93, 0xf2, 0x2c, 0x64, 0x01, 0x01],
        "UID",
    ),
];

/// A Name (the DER of its SEQUENCE) as RFC 4514 writes it: RDNs last first, joined by `,`;
/// the attributes of a multi-valued RDN joined by `+`; known types by their short names,
/// others by dotted OID with the value as `#` and its DER in hex; `,+"\<>;`, a leading
/// `#` or space, a trailing space escaped with `\`, control and non-ASCII characters as
/// `\` and the hex of each UTF-8 byte.
fn rfc4514(name: &[u8]) -> Result<String, DerError> {
    let bad = DerError::Certificate;
    let mut seq = Der(Der(name).expect(SEQ, "name").map_err(|_| bad("subject"))?);
    let mut rdns = Vec::new();
    while !seq.is_empty() {
        let mut set = Der(seq.expect(SET, "rdn").map_err(|_| bad("subject RDN"))?);
        let mut parts = Vec::new();
        while !set.is_empty() {
            let mut atv = Der(set
                .expect(SEQ, "atv")
                .map_err(|_| bad("subject attribute"))?);
            let oid = atv.expect(OID, "type").map_err(|_| bad("attribute type"))?;
            let (tag, value, whole) = atv.next().map_err(|_| bad("attribute value"))?;
            let mut s = String::new();
            match NAMES.iter().find(|(o, _)| *o == oid) {
                Some((_, short)) => s.push_str(short),
                None => s.push_str(&dotted(oid)),
            }
            s.push('=');
            match (NAMES.iter().any(|(o, _)| *o == oid), text(tag, value)) {
                (true, Some(v)) => escape(&mut s, &v),
                _ => {
                    s.push('#');
                    s.push_str(&hex(whole));
                }
            }
            parts.push(s);
        }
        rdns.push(parts.join("+"));
    }
    rdns.reverse();
    Ok(rdns.join(","))
}

/// A directory string's text: UTF8String, PrintableString, IA5String, TeletexString
/// (read as Latin-1), BMPString, UniversalString.
fn text(tag: u8, v: &[u8]) -> Option<String> {
    match tag {
        0x0c | 0x13 | 0x16 => std::str::from_utf8(v).ok().map(str::to_owned),
        0x14 => Some(v.iter().map(|&b| char::from(b)).collect()),
        0x1e if v.len().is_multiple_of(2) => {
            let units = v.chunks(2).map(|c| u16::from_be_bytes([c[0], c[1]]));
            char::decode_utf16(units)
                .collect::<Result<String, _>>()
                .ok()
        }
        0x1c if v.len().is_multiple_of(4) => v
            .chunks(4)
            .map(|c| char::from_u32(u32::from_be_bytes([c[0], c[1], c[2], c[3]])))
            .collect(),
        _ => None,
    }
}

fn escape(out: &mut String, v: &str) {
    let last = v.chars().count().saturating_sub(1);
    for (i, c) in v.chars().enumerate() {
        match c {
            ',' | '+' | '"' | '\\' | '<' | '>' | ';' => {
                out.push('\\');
                out.push(c);
            }
            '#' | ' ' if i == 0 => {
                out.push('\\');
                out.push(c);
            }
            ' ' if i == last => out.push_str("\\ "),
            '\0' => out.push_str("\\00"),
            // hex pairs (RFC 4514 section 2.4) for control and non-ASCII characters: the
            // subject is printable ASCII, fit for a header value and a log line
            c if c.is_control() || !c.is_ascii() => {
                let mut b = [0u8; 4];
                for x in c.encode_utf8(&mut b).bytes() {
                    let _ = write!(out, "\\{x:02x}");
                }
            }
            c => out.push(c),
        }
    }
}

/// An OID's DER contents in dotted decimal.
fn dotted(oid: &[u8]) -> String {
    let mut arcs: Vec<u128> = Vec::new();
    let mut v: u128 = 0;
    for &b in oid {
        v = (v << 7) | u128::from(b & 0x7f);
        if b & 0x80 == 0 {
            if arcs.is_empty() {
                let first = (v / 40).min(2);
                arcs.push(first);
                arcs.push(v - first * 40);
            } else {
                arcs.push(v);
            }
            v = 0;
        }
    }
    arcs.iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(".")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_patterns_parse_and_match() {
        let p = |s: &str| NamePattern::parse(s).unwrap();
        assert!(p("API-client.example.").matches("api-client.EXAMPLE"));
        assert!(!p("api-client.example").matches("x.api-client.example"));
        let w = p("*.ops.example");
        assert!(w.matches("a.ops.example"));
        assert!(!w.matches("ops.example"));
        assert!(!w.matches("a.b.ops.example"));
        assert!(!w.matches("*.ops.example"));
        for bad in ["", "a b.example", "a..b", "-a.example", "x.ex ample"] {
            assert!(
                matches!(NamePattern::parse(bad), Err(NameError::NotDns(_))),
                "{bad}"
            );
        }
        for bad in ["*", "*.example", "a*.ops.example", "x.*.example", "**.a.b"] {
            assert!(
                matches!(NamePattern::parse(bad), Err(NameError::Wildcard(_))),
                "{bad}"
            );
        }
    }

    fn cert(dn: &[(rcgen::DnType, &str)]) -> Vec<u8> {
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name = rcgen::DistinguishedName::new();
        for (t, v) in dn {
            p.distinguished_name.push(t.clone(), *v);
        }
        p.self_signed(&kp).unwrap().der().to_vec()
    }

    #[test]
    fn subject_is_rfc4514_last_rdn_first_and_escaped() {
        let der = cert(&[
            (rcgen::DnType::CountryName, "FR"),
            (rcgen::DnType::OrganizationName, "ops, inc"),
            (rcgen::DnType::CommonName, " alice+bob"),
        ]);
        let c = ClientCert::of(&der);
        assert_eq!(c.subject, "CN=\\ alice\\+bob,O=ops\\, inc,C=FR");
        let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &der);
        assert_eq!(c.fingerprint, hex(digest.as_ref()));
        assert_eq!(c.fingerprint.len(), 64);
        assert!(c
            .fingerprint
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    }

    #[test]
    fn unknown_types_are_dotted_with_hex_values() {
        let der = cert(&[(
            rcgen::DnType::CustomDnType(vec![1, 2, 840, 113549, 1, 9, 1]),
            "a@b",
        )]);
        let s = ClientCert::of(&der).subject;
        assert!(s.starts_with("1.2.840.113549.1.9.1=#"), "{s}");
    }

    #[test]
    fn a_bound_ticket_opens_only_under_its_tag() {
        use rustls::server::ProducesTickets;
        let keys = crate::Ticketer::local(std::time::Duration::from_secs(3600)).unwrap();
        let bound = |tag: u8| BoundTickets {
            inner: keys.clone(),
            tag: [tag; 32],
        };
        let t = bound(1).encrypt(b"session").unwrap();
        assert_eq!(bound(1).decrypt(&t).as_deref(), Some(&b"session"[..]));
        assert_eq!(bound(2).decrypt(&t), None);
        // the unbound listener sharing the keys sees the marker first
        assert!(keys.decrypt(&t).unwrap().starts_with(&BOUND));
        let plain = keys.encrypt(b"session").unwrap();
        assert_eq!(bound(1).decrypt(&plain), None);
    }

    #[test]
    fn non_ascii_is_escaped_as_utf8_hex_pairs() {
        let der = cert(&[(rcgen::DnType::CommonName, "José")]);
        let s = ClientCert::of(&der).subject;
        assert_eq!(s, "CN=Jos\\c3\\a9");
        assert!(s.bytes().all(|b| (0x20..0x7f).contains(&b)));
    }

    #[test]
    fn control_bytes_never_reach_the_subject() {
        let der = cert(&[(rcgen::DnType::CommonName, "a\r\nb\0")]);
        assert_eq!(ClientCert::of(&der).subject, "CN=a\\0d\\0ab\\00");
    }
}
