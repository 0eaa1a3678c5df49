//! TLS listeners with configured certificates (`[listener.tls] certificates = [...]`),
//! generated here with rcgen: RSA-2048 with PKCS#8 and PKCS#1 keys, ECDSA P-256 with PKCS#8
//! and SEC1 keys, a chain with an intermediate, and SNI selection between several
//! certificates with the first as the default.

use qweb_testkit as common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::tls::ClientTls;
use common::{Proto, TestServer, BOTH};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::ClientConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

// ---------------------------------------------------------------------------------------------
// Certificates and keys

/// A generated certificate with its key.
struct Generated {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

impl Generated {
    fn der(&self) -> CertificateDer<'static> {
        self.cert.der().clone()
    }
}

fn params(names: &[&str], cn: &str) -> rcgen::CertificateParams {
    let mut p =
        rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap();
    p.distinguished_name = rcgen::DistinguishedName::new();
    p.distinguished_name.push(rcgen::DnType::CommonName, cn);
    p
}

fn rsa_key() -> rcgen::KeyPair {
    rcgen::KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048).unwrap()
}

fn ecdsa_key() -> rcgen::KeyPair {
    rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap()
}

fn self_signed(names: &[&str], key: rcgen::KeyPair) -> Generated {
    let cert = params(names, names[0]).self_signed(&key).unwrap();
    Generated { cert, key }
}

fn ca_params(cn: &str) -> rcgen::CertificateParams {
    let mut p = params(&[], cn);
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    p.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    p
}

/// One DER element at the start of `b`: its tag, its whole encoding and what follows it.
fn der_element(b: &[u8]) -> (u8, &[u8], &[u8]) {
    let tag = b[0];
    let (len, header) = if b[1] < 0x80 {
        (b[1] as usize, 2)
    } else {
        let n = (b[1] & 0x7f) as usize;
        let len = b[2..2 + n]
            .iter()
            .fold(0usize, |acc, &x| (acc << 8) | x as usize);
        (len, 2 + n)
    };
    (tag, &b[..header + len], &b[header + len..])
}

/// The contents of a DER element (without tag and length).
fn der_contents(element: &[u8]) -> &[u8] {
    let header = if element[1] < 0x80 {
        2
    } else {
        2 + (element[1] & 0x7f) as usize
    };
    &element[header..]
}

/// The elements of a DER SEQUENCE (or other constructed value).
fn der_children(element: &[u8]) -> Vec<(u8, &[u8])> {
    let mut rest = der_contents(element);
    let mut out = Vec::new();
    while !rest.is_empty() {
        let (tag, el, r) = der_element(rest);
        out.push((tag, el));
        rest = r;
    }
    out
}

fn der_encode(tag: u8, contents: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = contents.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes: Vec<u8> = len
            .to_be_bytes()
            .into_iter()
            .skip_while(|&b| b == 0)
            .collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend_from_slice(&bytes);
    }
    out.extend_from_slice(contents);
    out
}

/// Splits a PKCS#8 PrivateKeyInfo into its AlgorithmIdentifier and the contents of its
/// privateKey OCTET STRING (for RSA: a PKCS#1 RSAPrivateKey; for EC: a SEC1 ECPrivateKey).
fn pkcs8_parts(pkcs8: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let (tag, outer, rest) = der_element(pkcs8);
    assert_eq!((tag, rest.len()), (0x30, 0), "not a PKCS#8 SEQUENCE");
    let children = der_children(outer);
    assert_eq!(children[0].0, 0x02, "PKCS#8 version");
    assert_eq!(children[1].0, 0x30, "PKCS#8 algorithm");
    assert_eq!(children[2].0, 0x04, "PKCS#8 privateKey");
    (children[1].1.to_vec(), der_contents(children[2].1).to_vec())
}

/// A PKCS#1 `RSAPrivateKey` DER, taken out of the PKCS#8 key rcgen generated.
fn rsa_pkcs1_der(key: &rcgen::KeyPair) -> Vec<u8> {
    let (_, inner) = pkcs8_parts(&key.serialize_der());
    // RSAPrivateKey ::= SEQUENCE { version 0, modulus, publicExponent, ... } (9 integers)
    let (tag, _, _) = der_element(&inner);
    assert_eq!(tag, 0x30);
    let fields = der_children(&inner);
    assert_eq!(fields.len(), 9, "RSAPrivateKey has 9 fields");
    assert!(fields.iter().all(|(t, _)| *t == 0x02));
    inner
}

/// A SEC1 `ECPrivateKey` DER (RFC 5915) with the named curve in its parameters, as
/// `openssl ec` writes it, taken out of the PKCS#8 key rcgen generated.
fn ec_sec1_der(key: &rcgen::KeyPair) -> Vec<u8> {
    let (alg, inner) = pkcs8_parts(&key.serialize_der());
    // AlgorithmIdentifier ::= SEQUENCE { id-ecPublicKey, namedCurve OID }
    let alg_fields = der_children(&alg);
    let curve_oid = alg_fields[1].1;
    assert_eq!(
        curve_oid,
        // 1.2.840.10045.3.1.7 (prime256v1)
        &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07]
    );
    // ECPrivateKey ::= SEQUENCE { version 1, privateKey OCTET STRING,
    //                             [0] parameters OPTIONAL, [1] publicKey OPTIONAL }
    let fields = der_children(&inner);
    assert_eq!(fields[0].1, &[0x02, 0x01, 0x01], "ECPrivateKey version");
    assert_eq!(fields[1].0, 0x04);
    let mut body = Vec::new();
    body.extend_from_slice(fields[0].1);
    body.extend_from_slice(fields[1].1);
    let has_params = fields.iter().any(|(t, _)| *t == 0xa0);
    if !has_params {
        body.extend_from_slice(&der_encode(0xa0, curve_oid));
    }
    for (_, f) in &fields[2..] {
        body.extend_from_slice(f);
    }
    der_encode(0x30, &body)
}

fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn pem(label: &str, der: &[u8]) -> String {
    let b64 = base64(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

fn write(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    p
}

// ---------------------------------------------------------------------------------------------
// Server and client

/// Starts qweb with one TLS listener serving `certs` (chain file, key file) in this order.
fn start_tls(certs: &[(PathBuf, PathBuf)]) -> TestServer {
    let list: Vec<String> = certs
        .iter()
        .map(|(c, k)| {
            format!(
                "{{ cert = {:?}, key = {:?} }}",
                c.display().to_string(),
                k.display().to_string()
            )
        })
        .collect();
    let extra = format!(
        "[[listener]]\naddress = \"127.0.0.1:0\"\n[listener.tls]\ncertificates = [{}]\n",
        list.join(", ")
    );
    let t = common::start_with(&extra, |_| {});
    std::fs::write(t.site().join("index.html"), "tls ok").unwrap();
    t
}

/// A client that trusts exactly `roots` (full WebPKI verification, including the name);
/// TLS 1.2 and 1.3 unless `version` pins one.
fn strict_client(
    roots: &[CertificateDer<'static>],
    version: Option<&'static rustls::SupportedProtocolVersion>,
) -> Arc<ClientConfig> {
    let mut store = rustls::RootCertStore::empty();
    for r in roots {
        store.add(r.clone()).unwrap();
    }
    let b = ClientTls::with_roots(store).proto(Proto::H1);
    match version {
        Some(v) => b.versions(&[v]),
        None => b,
    }
    .arc()
}

/// A client that accepts whatever certificate the server presents (but checks the handshake
/// signatures: the server must hold the key of the certificate it presented).
fn lenient_client() -> Arc<ClientConfig> {
    ClientTls::accept_any().proto(Proto::H1).arc()
}

/// What one HTTPS exchange showed.
struct Seen {
    chain: Vec<CertificateDer<'static>>,
    version: rustls::ProtocolVersion,
    answer: String,
}

/// Connects to `addr` sending `name` as SNI (nothing when `name` is an IP address), does one
/// HTTP/1.1 `GET /`, and returns the presented chain and the answer.
async fn exchange(
    addr: std::net::SocketAddr,
    name: &str,
    cfg: Arc<ClientConfig>,
) -> std::io::Result<Seen> {
    let connector = tokio_rustls::TlsConnector::from(cfg);
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let server_name = ServerName::try_from(name.to_owned()).unwrap();
    let mut tls =
        tokio::time::timeout(Duration::from_secs(10), connector.connect(server_name, tcp))
            .await
            .expect("handshake timed out")?;
    let (_, conn) = tls.get_ref();
    let chain = conn.peer_certificates().unwrap_or_default().to_vec();
    let version = conn.protocol_version().unwrap();
    tls.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await?;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut out)).await;
    Ok(Seen {
        chain,
        version,
        answer: String::from_utf8_lossy(&out).into_owned(),
    })
}

/// Checks a served certificate with every TLS version: the handshake verifies against `root`
/// for `name`, the leaf presented is `leaf`, and a request is answered.
async fn check_served(
    t: &TestServer,
    name: &str,
    root: &CertificateDer<'static>,
    leaf: &CertificateDer<'static>,
) {
    for version in [&rustls::version::TLS12, &rustls::version::TLS13] {
        let seen = exchange(
            t.addrs[0],
            name,
            strict_client(std::slice::from_ref(root), Some(version)),
        )
        .await
        .unwrap_or_else(|e| panic!("{name} {:?}: {e}", version.version));
        assert_eq!(seen.version, version.version);
        assert_eq!(
            &seen.chain[0], leaf,
            "{name}: another certificate was presented"
        );
        assert!(
            seen.answer.starts_with("HTTP/1.1 200 OK"),
            "{}",
            seen.answer
        );
        assert!(seen.answer.ends_with("\r\n\r\ntls ok"), "{}", seen.answer);
    }
}

// ---------------------------------------------------------------------------------------------
// Tests

#[tokio::test]
async fn rsa_2048_with_pkcs8_and_pkcs1_keys() {
    let dir = tempfile::tempdir().unwrap();
    let g = self_signed(&["rsa.test"], rsa_key());
    let cert = write(dir.path(), "rsa.crt", &g.cert.pem());
    let pkcs8 = write(dir.path(), "rsa-pkcs8.key", &g.key.serialize_pem());
    let pkcs1 = write(
        dir.path(),
        "rsa-pkcs1.key",
        &pem("RSA PRIVATE KEY", &rsa_pkcs1_der(&g.key)),
    );
    // the files really are in the formats under test
    assert!(std::fs::read_to_string(&pkcs8)
        .unwrap()
        .starts_with("-----BEGIN PRIVATE KEY-----"));
    assert!(matches!(
        qweb_tls::load_private_key(&pkcs8).unwrap(),
        PrivateKeyDer::Pkcs8(_)
    ));
    assert!(matches!(
        qweb_tls::load_private_key(&pkcs1).unwrap(),
        PrivateKeyDer::Pkcs1(_)
    ));
    for key in [pkcs8, pkcs1] {
        let t = start_tls(&[(cert.clone(), key.clone())]);
        check_served(&t, "rsa.test", &g.der(), &g.der()).await;
        // the certificate does not cover other names: full verification refuses them
        let err = exchange(t.addrs[0], "other.test", strict_client(&[g.der()], None)).await;
        assert!(err.is_err(), "{}: a wrong name was accepted", key.display());
    }
}

#[tokio::test]
async fn ecdsa_p256_with_pkcs8_and_sec1_keys() {
    let dir = tempfile::tempdir().unwrap();
    let g = self_signed(&["ec.test"], ecdsa_key());
    let cert = write(dir.path(), "ec.crt", &g.cert.pem());
    let pkcs8 = write(dir.path(), "ec-pkcs8.key", &g.key.serialize_pem());
    let sec1 = write(
        dir.path(),
        "ec-sec1.key",
        &pem("EC PRIVATE KEY", &ec_sec1_der(&g.key)),
    );
    assert!(matches!(
        qweb_tls::load_private_key(&pkcs8).unwrap(),
        PrivateKeyDer::Pkcs8(_)
    ));
    assert!(matches!(
        qweb_tls::load_private_key(&sec1).unwrap(),
        PrivateKeyDer::Sec1(_)
    ));
    for key in [pkcs8, sec1] {
        let t = start_tls(&[(cert.clone(), key.clone())]);
        check_served(&t, "ec.test", &g.der(), &g.der()).await;
    }
}

#[tokio::test]
async fn chain_with_intermediate_verifies_against_the_root_only() {
    let dir = tempfile::tempdir().unwrap();
    let root_key = ecdsa_key();
    let root = ca_params("qweb test root").self_signed(&root_key).unwrap();
    let inter_key = ecdsa_key();
    let inter = ca_params("qweb test intermediate")
        .signed_by(&inter_key, &root, &root_key)
        .unwrap();
    let leaf_key = ecdsa_key();
    let mut leaf_params = params(&["chain.test", "localhost"], "chain.test");
    leaf_params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let leaf = leaf_params
        .signed_by(&leaf_key, &inter, &inter_key)
        .unwrap();

    let chain = write(
        dir.path(),
        "chain.crt",
        &format!("{}{}", leaf.pem(), inter.pem()),
    );
    let leaf_only = write(dir.path(), "leaf.crt", &leaf.pem());
    let key = write(dir.path(), "leaf.key", &leaf_key.serialize_pem());
    let root_pem = write(dir.path(), "root.crt", &root.pem());

    let t = start_tls(&[(chain.clone(), key.clone())]);
    check_served(&t, "chain.test", root.der(), leaf.der()).await;
    let seen = exchange(
        t.addrs[0],
        "chain.test",
        strict_client(&[root.der().clone()], None),
    )
    .await
    .unwrap();
    assert_eq!(
        seen.chain,
        vec![leaf.der().clone(), inter.der().clone()],
        "the served chain is leaf then intermediate"
    );

    // over reqwest too, with HTTP/1.1 and HTTP/2 chosen by ALPN
    for proto in BOTH {
        let c = common::tls::proto_builder(common::tls_client_config(&root_pem, proto), proto)
            .resolve("chain.test", t.addrs[0])
            .build()
            .unwrap();
        let port = t.addrs[0].port();
        let r = c
            .get(format!("https://chain.test:{port}/"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let want = match proto {
            Proto::H1 => reqwest::Version::HTTP_11,
            Proto::H2 => reqwest::Version::HTTP_2,
        };
        assert_eq!(r.version(), want);
        assert_eq!(r.text().await.unwrap(), "tls ok");
    }

    // Control: without the intermediate in the file, a client that trusts only the root
    // cannot verify the leaf, so the check above really depends on the served intermediate.
    let t2 = start_tls(&[(leaf_only, key)]);
    let seen = exchange(t2.addrs[0], "chain.test", lenient_client())
        .await
        .unwrap();
    assert_eq!(seen.chain, vec![leaf.der().clone()]);
    let err = exchange(
        t2.addrs[0],
        "chain.test",
        strict_client(&[root.der().clone()], None),
    )
    .await;
    assert!(err.is_err(), "a chain without its intermediate verified");
}

/// Names a presented chain for readable failures: "a", "b", or its length and first bytes.
fn label(chain: &[CertificateDer<'static>], a: &Generated, b: &Generated) -> String {
    match chain {
        [c] if *c == a.der() => "a".into(),
        [c] if *c == b.der() => "b".into(),
        other => format!("{} unknown certificate(s)", other.len()),
    }
}

#[tokio::test]
async fn sni_selects_the_certificate_and_defaults_to_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let a = self_signed(&["a.test"], ecdsa_key());
    let b = self_signed(&["*.b.test"], rsa_key());
    let a_files = (
        write(dir.path(), "a.crt", &a.cert.pem()),
        write(dir.path(), "a.key", &a.key.serialize_pem()),
    );
    let b_files = (
        write(dir.path(), "b.crt", &b.cert.pem()),
        write(dir.path(), "b.key", &b.key.serialize_pem()),
    );

    // a first: a is the default
    let t = start_tls(&[a_files.clone(), b_files.clone()]);
    for (name, want, what) in [
        ("a.test", &a, "a"),
        ("x.b.test", &b, "b"),
        ("other.b.test", &b, "b"),
        ("A.TEST", &a, "a"),
        ("X.B.TEST", &b, "b"),
        ("unknown.test", &a, "a (default)"),
        (
            "b.test",
            &a,
            "a (the wildcard does not cover b.test itself)",
        ),
        ("y.x.b.test", &a, "a (the wildcard covers one label only)"),
        ("127.0.0.1", &a, "a (no SNI)"),
    ] {
        let seen = exchange(t.addrs[0], name, lenient_client())
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            label(&seen.chain, &a, &b),
            label(&[want.der()], &a, &b),
            "{name}: expected {what}"
        );
        assert!(seen.answer.ends_with("tls ok"), "{name}: {}", seen.answer);
    }
    // and the chosen certificates verify fully for their names
    let both = [a.der(), b.der()];
    for name in ["a.test", "x.b.test"] {
        let seen = exchange(t.addrs[0], name, strict_client(&both, None))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(seen.answer.ends_with("tls ok"), "{name}: {}", seen.answer);
    }
    drop(t);

    // b first: b is the default, names still pick their own certificate
    let t = start_tls(&[b_files, a_files]);
    for (name, want, what) in [
        ("a.test", &a, "a"),
        ("x.b.test", &b, "b"),
        ("unknown.test", &b, "b (default)"),
        ("127.0.0.1", &b, "b (no SNI)"),
    ] {
        let seen = exchange(t.addrs[0], name, lenient_client())
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            label(&seen.chain, &a, &b),
            label(&[want.der()], &a, &b),
            "{name}: expected {what}"
        );
    }
}

#[tokio::test]
async fn a_key_that_does_not_match_is_refused_at_startup() {
    let dir = tempfile::tempdir().unwrap();
    let a = self_signed(&["a.test"], ecdsa_key());
    let other = ecdsa_key();
    let cert = write(dir.path(), "a.crt", &a.cert.pem());
    let key = write(dir.path(), "other.key", &other.serialize_pem());
    let toml = format!(
        "state_dir = {:?}\n[[listener]]\naddress = \"127.0.0.1:0\"\n[listener.tls]\n\
         certificates = [{{ cert = {:?}, key = {:?} }}]\n\
         [[route]]\nprefix = \"/\"\nroot = {:?}\n",
        dir.path().join("state").display().to_string(),
        cert.display().to_string(),
        key.display().to_string(),
        dir.path().display().to_string(),
    );
    let file = write(dir.path(), "qweb.toml", &toml);
    let err = qweb_server::Config::from_file(&file)
        .map(|_| ())
        .expect_err("a mismatched key was accepted");
    let msg = err.to_string();
    assert!(msg.contains("does not match"), "{msg}");
    assert!(msg.contains("certificates[0].key"), "{msg}");

    // the matching key is accepted (so the refusal above is about the mismatch)
    let good = write(dir.path(), "a.key", &a.key.serialize_pem());
    let toml = toml.replace(&key.display().to_string(), &good.display().to_string());
    std::fs::write(&file, toml).unwrap();
    qweb_server::Config::from_file(&file).expect("matching key refused");
}

/// What OpenSSL's `s_client` says the server signed with, for `name`, pinned to `version`,
/// with `args` (`-sigalgs`, `-cipher`); and that the request was answered.
fn signed_with(
    addr: std::net::SocketAddr,
    name: &str,
    version: common::openssl::TlsVersion,
    args: &[&str],
) -> String {
    let mut c = common::openssl::SClient::new(addr, version).servername(name);
    for a in args {
        c = c.arg(a);
    }
    let run = c
        .request(format!("GET / HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n").as_bytes())
        .run();
    run.answered("HTTP/1.1 200");
    run.peer_signature_type()
        .unwrap_or_else(|| panic!("no peer signature:\n{}\n{}", run.stdout, run.stderr))
        .to_owned()
}

/// Dual certificates (nginx's and h2o's setup): an RSA and an ECDSA certificate for the same
/// names, on the listener and on a site. OpenSSL gets ECDSA when it offers ECDSA signature
/// schemes (TLS 1.3), or an ECDHE_ECDSA suite (TLS 1.2), and RSA when it offers only RSA
/// schemes or only ECDHE_RSA suites, whichever order the certificates are listed in.
#[tokio::test]
async fn dual_rsa_and_ecdsa_certificates_choose_by_what_the_client_verifies() {
    use common::openssl::TlsVersion::{V12, V13};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut files = Vec::new();
    for (stem, names, key) in [
        ("l-rsa", ["localhost"], rsa_key()),
        ("l-ec", ["localhost"], ecdsa_key()),
        ("s-ec", ["dual.test"], ecdsa_key()),
        ("s-rsa", ["dual.test"], rsa_key()),
    ] {
        let g = self_signed(&names, key);
        let c = write(d, &format!("{stem}.crt"), &g.cert.pem());
        let k = write(d, &format!("{stem}.key"), &g.key.serialize_pem());
        files.push((c.display().to_string(), k.display().to_string()));
    }
    let cert = |i: usize| format!("{{ cert = {:?}, key = {:?} }}", files[i].0, files[i].1);
    let extra = format!(
        "[[listener]]\naddress = \"127.0.0.1:0\"\n[listener.tls]\ncertificates = [{}, {}]\n\
         [[site]]\nserver_names = [\"dual.test\"]\ncertificates = [{}, {}]\n\
         [[site.route]]\nprefix = \"/\"\nroot = \"{{dir}}/site\"\n",
        cert(0),
        cert(1),
        cert(2),
        cert(3)
    );
    let t = common::start_with(&extra, |dir| {
        std::fs::write(dir.join("site/index.html"), "dual").unwrap()
    });
    let addr = t.addrs[0];
    for name in ["localhost", "dual.test"] {
        let both = ["-sigalgs", "RSA-PSS+SHA256:ECDSA+SHA256"];
        assert_eq!(signed_with(addr, name, V13, &both), "ECDSA", "{name}");
        assert_eq!(signed_with(addr, name, V13, &[]), "ECDSA", "{name}");
        let rsa_only = ["-sigalgs", "RSA-PSS+SHA256:RSA+SHA256"];
        assert_eq!(signed_with(addr, name, V13, &rsa_only), "RSA-PSS", "{name}");
        assert_eq!(signed_with(addr, name, V12, &[]), "ECDSA", "{name}");
        let rsa_suite = ["-cipher", "ECDHE-RSA-AES128-GCM-SHA256"];
        assert_ne!(signed_with(addr, name, V12, &rsa_suite), "ECDSA", "{name}");
        let ec_suite = ["-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256"];
        assert_eq!(signed_with(addr, name, V12, &ec_suite), "ECDSA", "{name}");
        assert_ne!(signed_with(addr, name, V12, &rsa_only), "ECDSA", "{name}");
    }
}

/// A site's certificates without key files, their keys on a key server (in process, on a
/// real Unix socket): an RSA and an ECDSA certificate for `dual.test`, chosen by what
/// OpenSSL offers as for listener certificates; every handshake was signed by the key
/// server (qweb holds no key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn site_certificates_with_keys_on_a_key_server_choose_by_what_the_client_verifies() {
    use common::openssl::TlsVersion::{V12, V13};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut keys = Vec::new();
    for (stem, key) in [("s-rsa", rsa_key()), ("s-ec", ecdsa_key())] {
        let g = self_signed(&["dual.test"], key);
        write(d, &format!("{stem}.crt"), &g.cert.pem());
        keys.push(write(d, &format!("{stem}.key"), &g.key.serialize_pem()));
    }
    let sock = d.join("ks.sock");
    let _ks = in_process_keyserver(keys, &sock);
    let p = d.display();
    let extra = format!(
        "[admin]\naddress = \"127.0.0.1:0\"\n\
         [offload.engines.ks]\nkind = \"keyserver\"\nservers = [\"unix:{}\"]\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\n[listener.tls]\ncertificates = []\n\
         [listener.offload]\nengine = \"ks\"\n\
         [[site]]\nserver_names = [\"dual.test\"]\n\
         certificates = [{{ cert = \"{p}/s-rsa.crt\" }}, {{ cert = \"{p}/s-ec.crt\" }}]\n\
         [[site.route]]\nprefix = \"/\"\nroot = \"{{dir}}/site\"\n",
        sock.display()
    );
    let t = common::start_with(&extra, |dir| {
        std::fs::write(dir.join("site/index.html"), "dual").unwrap()
    });
    let addr = t.addrs[0];
    let name = "dual.test";
    let rsa_only = ["-sigalgs", "RSA-PSS+SHA256:RSA+SHA256"];
    let ec_suite = ["-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256"];
    let rsa_suite = ["-cipher", "ECDHE-RSA-AES128-GCM-SHA256"];
    let tries: [(_, &[&str], &str); 5] = [
        (V13, &[], "ECDSA"),
        (V13, &rsa_only, "RSA"),
        (V12, &[], "ECDSA"),
        (V12, &ec_suite, "ECDSA"),
        (V12, &rsa_suite, "RSA"),
    ];
    for (v, args, want) in tries {
        let got = signed_with(addr, name, v, args);
        assert!(got.starts_with(want), "{v:?} {args:?}: {got}");
    }
    let m = common::metrics::scrape(t.admin.unwrap()).await;
    let signed = m.sum("qweb_offload_ops_completed_total", &[("engine", "ks")]);
    assert!(
        signed >= tries.len() as f64,
        "{signed} key server ops:\n{m}"
    );
}

/// A key server in this process holding `keys`, on the Unix socket `sock` (for this user,
/// the owner of the socket's folder), one signing thread.
pub(crate) fn in_process_keyserver(
    keys: Vec<PathBuf>,
    sock: &Path,
) -> qweb_keyserver::server::RunningKeyserver {
    use std::os::unix::fs::MetadataExt;
    let folder = sock.parent().expect("a socket in a folder");
    qweb_keyserver::server::start(qweb_keyserver::server::KeyserverConfig {
        generated_keys: None,
        keys,
        threads: 1,
        queue: 64,
        unix: Some((
            sock.to_owned(),
            vec![std::fs::metadata(folder).unwrap().uid()],
        )),
        tls: None,
        admin: None,
        limits: Default::default(),
        added_latency: Duration::ZERO,
        ticket_rotation: Duration::from_secs(12 * 3600),
    })
    .unwrap()
}
