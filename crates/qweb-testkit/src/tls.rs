//! TLS and HTTP clients for the test CA: a rustls [`ClientConfig`] builder ([`ClientTls`]),
//! reqwest clients (hyper underneath) for HTTPS and plain HTTP, a raw TLS connect, and the
//! one accept-any certificate verifier of the tests.
//!
//! ```no_run
//! use qweb_testkit::tls::{client, ClientTls, Proto};
//! # async fn f(ca: &std::path::Path, addr: std::net::SocketAddr) {
//! // reqwest over h2, trusting exactly `ca`
//! let c = client(ca, Proto::H2);
//! // a raw TLS 1.3 stream without resumption
//! let cfg = ClientTls::trusting(ca)
//!     .versions(&[&rustls::version::TLS13])
//!     .proto(Proto::H1)
//!     .no_resumption()
//!     .arc();
//! let tls = qweb_testkit::tls::connect(addr, &cfg).await.unwrap();
//! # }
//! ```

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};

/// The HTTP protocol a client speaks (its ALPN, and reqwest's mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    /// HTTP/1.1 (`http/1.1`).
    H1,
    /// HTTP/2 (`h2`, prior knowledge).
    H2,
}

/// Both protocols, for tests that run once per protocol.
pub const BOTH: [Proto; 2] = [Proto::H1, Proto::H2];

impl Proto {
    /// The ALPN id.
    pub fn alpn(self) -> Vec<u8> {
        match self {
            Proto::H1 => b"http/1.1".to_vec(),
            Proto::H2 => b"h2".to_vec(),
        }
    }
}

/// reqwest asks for a process-wide default rustls provider, even for plain HTTP.
pub fn install_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

/// A builder of a rustls client config on qweb's crypto provider.
pub struct ClientTls {
    roots: RootCertStore,
    accept_any: bool,
    versions: Option<Vec<&'static rustls::SupportedProtocolVersion>>,
    alpn: Vec<Vec<u8>>,
    resumption: bool,
    client_auth: Option<(
        Vec<CertificateDer<'static>>,
        rustls::pki_types::PrivateKeyDer<'static>,
    )>,
}

impl ClientTls {
    /// Trusts exactly the certificates in the PEM file `ca`.
    pub fn trusting(ca: &Path) -> Self {
        Self::trusting_all(&[ca])
    }

    /// Trusts the certificates of every PEM file in `cas`.
    pub fn trusting_all<P: AsRef<Path>>(cas: &[P]) -> Self {
        let mut roots = RootCertStore::empty();
        for ca in cas {
            let ca = ca.as_ref();
            for c in qweb_tls::load_certs(ca).unwrap_or_else(|e| panic!("CA {}: {e}", ca.display()))
            {
                roots.add(c).expect("add root");
            }
        }
        Self::with_roots(roots)
    }

    /// Trusts `roots`.
    pub fn with_roots(roots: RootCertStore) -> Self {
        ClientTls {
            roots,
            accept_any: false,
            versions: None,
            alpn: Vec::new(),
            resumption: true,
            client_auth: None,
        }
    }

    /// Accepts any certificate chain ([`AcceptAnyCert`]): for tests that look at what the
    /// server sent, not at whether it verifies.
    pub fn accept_any() -> Self {
        ClientTls {
            accept_any: true,
            ..Self::with_roots(RootCertStore::empty())
        }
    }

    /// Only these protocol versions (default: rustls's safe defaults, TLS 1.2 and 1.3).
    pub fn versions(mut self, v: &[&'static rustls::SupportedProtocolVersion]) -> Self {
        self.versions = Some(v.to_vec());
        self
    }

    /// ALPN for `proto`.
    pub fn proto(self, proto: Proto) -> Self {
        self.alpn(&[&proto.alpn()])
    }

    /// These ALPN ids (default: none).
    pub fn alpn(mut self, ids: &[&[u8]]) -> Self {
        self.alpn = ids.iter().map(|a| a.to_vec()).collect();
        self
    }

    /// No session resumption: every connection a full handshake.
    pub fn no_resumption(mut self) -> Self {
        self.resumption = false;
        self
    }

    /// Presents the certificate chain in the PEM file `cert` with the key in `key` when the
    /// server asks for one (mutual TLS).
    pub fn client_cert(mut self, cert: &Path, key: &Path) -> Self {
        let chain = qweb_tls::load_certs(cert)
            .unwrap_or_else(|e| panic!("client cert {}: {e}", cert.display()));
        let key = qweb_tls::load_private_key(key)
            .unwrap_or_else(|e| panic!("client key {}: {e}", key.display()));
        self.client_auth = Some((chain, key));
        self
    }

    /// The config.
    pub fn build(self) -> ClientConfig {
        let b = ClientConfig::builder_with_provider(Arc::new(qweb_tls::provider()));
        let b = match &self.versions {
            Some(v) => b.with_protocol_versions(v),
            None => b.with_safe_default_protocol_versions(),
        }
        .expect("versions");
        let b = if self.accept_any {
            b.dangerous()
                .with_custom_certificate_verifier(Arc::new(AcceptAnyCert::new(Arc::new(
                    qweb_tls::provider(),
                ))))
        } else {
            b.with_root_certificates(self.roots)
        };
        let mut cfg = match self.client_auth {
            Some((chain, key)) => b
                .with_client_auth_cert(chain, key)
                .expect("client certificate and key"),
            None => b.with_no_client_auth(),
        };
        cfg.alpn_protocols = self.alpn;
        if !self.resumption {
            cfg.resumption = rustls::client::Resumption::disabled();
        }
        cfg
    }

    /// The config in an `Arc`, as tokio-rustls and hyper take it.
    pub fn arc(self) -> Arc<ClientConfig> {
        Arc::new(self.build())
    }
}

/// A rustls client config that trusts exactly the certificate(s) in `ca_pem`, with ALPN for
/// `proto`.
pub fn tls_client_config(ca_pem: &Path, proto: Proto) -> ClientConfig {
    ClientTls::trusting(ca_pem).proto(proto).build()
}

/// A reqwest builder with `tls` and a 20 s timeout (and the process-wide provider installed);
/// redirects are followed (reqwest's default). Add `http1_only`, `pool_max_idle_per_host(0)`
/// and the rest as a test needs.
pub fn https_builder(tls: ClientConfig) -> reqwest::ClientBuilder {
    install_provider();
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .timeout(Duration::from_secs(20))
}

/// [`https_builder`] in `proto`'s mode (HTTP/1.1 only, or h2 with prior knowledge).
pub fn proto_builder(tls: ClientConfig, proto: Proto) -> reqwest::ClientBuilder {
    let b = https_builder(tls);
    match proto {
        Proto::H1 => b.http1_only(),
        Proto::H2 => b.http2_prior_knowledge(),
    }
}

/// A reqwest client (hyper underneath) for `proto` that verifies qweb's certificate against
/// `ca_pem`. Redirects are not followed.
pub fn client(ca_pem: &Path, proto: Proto) -> reqwest::Client {
    proto_builder(tls_client_config(ca_pem, proto), proto)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

/// A plain-HTTP/1.1 client. Redirects are not followed.
pub fn plain_client() -> reqwest::Client {
    install_provider();
    reqwest::Client::builder()
        .http1_only()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(20))
        .build()
        .expect("client")
}

/// A TLS client stream over TCP.
pub type TlsStream = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

/// The name the test certificates carry.
pub fn localhost() -> ServerName<'static> {
    ServerName::try_from("localhost").expect("server name")
}

/// TCP connect to `addr`, then a TLS handshake for `localhost` with `cfg`.
pub async fn connect(addr: SocketAddr, cfg: &Arc<ClientConfig>) -> std::io::Result<TlsStream> {
    connect_as(addr, cfg, localhost()).await
}

/// [`connect`] with another server name (SNI).
pub async fn connect_as(
    addr: SocketAddr,
    cfg: &Arc<ClientConfig>,
    name: ServerName<'static>,
) -> std::io::Result<TlsStream> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    tokio_rustls::TlsConnector::from(cfg.clone())
        .connect(name, tcp)
        .await
}

/// The workspace's one accept-any verifier (any chain; handshake signatures still checked):
/// the benchmark client's.
pub use qweb_bench::tls::AcceptAnyCert;

/// Writes a self-signed ECDSA P-256 certificate for `names` to `<dir>/<stem>.crt` and its key
/// to `<dir>/<stem>.key` (PEM); returns the certificate's DER.
pub fn write_self_signed(dir: &Path, stem: &str, names: &[&str]) -> Vec<u8> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let params =
        rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .expect("names");
    let c = params.self_signed(&key).expect("certificate");
    std::fs::write(dir.join(format!("{stem}.crt")), c.pem()).expect("write certificate");
    std::fs::write(dir.join(format!("{stem}.key")), key.serialize_pem()).expect("write key");
    c.der().to_vec()
}

/// `GET url` with `c`: the status and the body as text.
pub async fn get_text(c: &reqwest::Client, url: &str) -> (u16, String) {
    let r = c.get(url).send().await.expect("response");
    (r.status().as_u16(), r.text().await.expect("body"))
}

/// The files of [`client_pki`]: a CA and the client certificates tests present (each
/// `<stem>.crt` and `<stem>.key` in the folder).
pub struct ClientPki {
    /// The client CA's certificate (what `client_auth`'s `ca` names).
    pub ca: std::path::PathBuf,
    /// The folder.
    pub dir: std::path::PathBuf,
}

impl ClientPki {
    /// The certificate and key of client `stem` (`alice`, `stranger`, `expired`,
    /// `server_only`, `api`, `ops_box`, `deep_ops`, `other_name`, `cn_named`).
    pub fn client(&self, stem: &str) -> (std::path::PathBuf, std::path::PathBuf) {
        (
            self.dir.join(format!("{stem}.crt")),
            self.dir.join(format!("{stem}.key")),
        )
    }
}

/// Writes a client PKI to `dir`: `client-ca.crt` (CA `qweb test client CA`), `other-ca.crt`
/// (the CA of `stranger`), and client
/// certificates `alice` (`CN=alice,O=ops`, from that CA, clientAuth), `stranger` (from
/// another CA), `expired` (from the CA, valid 2020 only) and `server_only` (from the CA,
/// extended key usage serverAuth only); from the CA too, with DNS subject alternative names:
/// `api` (`api-client.example`), `ops_box` (`box1.ops.example`), `deep_ops`
/// (`a.box1.ops.example`), `other_name` (`db.example`), and `cn_named` (no SAN,
/// `CN=api-client.example`).
pub fn client_pki(dir: &Path) -> ClientPki {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
        KeyUsagePurpose,
    };
    let new_key = || KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let ca = |cn: &str| {
        let key = new_key();
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
        p.distinguished_name.push(DnType::CommonName, cn);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = p.self_signed(&key).expect("CA");
        (cert, key)
    };
    let (ca_cert, ca_key) = ca("qweb test client CA");
    let (other_cert, other_key) = ca("another CA");
    std::fs::write(dir.join("client-ca.crt"), ca_cert.pem()).expect("write CA");
    std::fs::write(dir.join("other-ca.crt"), other_cert.pem()).expect("write CA");
    let client = |stem: &str,
                  cn: &str,
                  issuer: (&rcgen::Certificate, &KeyPair),
                  eku: ExtendedKeyUsagePurpose,
                  expired: bool,
                  sans: &[&str]| {
        let key = new_key();
        let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let mut p = CertificateParams::new(sans).expect("params");
        // O first, CN last: RFC 4514 writes it `CN=...,O=ops`
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(DnType::OrganizationName, "ops");
        p.distinguished_name.push(DnType::CommonName, cn);
        p.extended_key_usages = vec![eku];
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        if expired {
            p.not_before = rcgen::date_time_ymd(2020, 1, 1);
            p.not_after = rcgen::date_time_ymd(2020, 12, 31);
        }
        let cert = p.signed_by(&key, issuer.0, issuer.1).expect("client cert");
        std::fs::write(dir.join(format!("{stem}.crt")), cert.pem()).expect("write cert");
        std::fs::write(dir.join(format!("{stem}.key")), key.serialize_pem()).expect("write key");
    };
    let ours = (&ca_cert, &ca_key);
    client(
        "alice",
        "alice",
        ours,
        ExtendedKeyUsagePurpose::ClientAuth,
        false,
        &[],
    );
    client(
        "stranger",
        "mallory",
        (&other_cert, &other_key),
        ExtendedKeyUsagePurpose::ClientAuth,
        false,
        &[],
    );
    client(
        "expired",
        "alice",
        ours,
        ExtendedKeyUsagePurpose::ClientAuth,
        true,
        &[],
    );
    client(
        "server_only",
        "alice",
        ours,
        ExtendedKeyUsagePurpose::ServerAuth,
        false,
        &[],
    );
    // for `client_auth.names`: DNS names in the subject alternative names, or only in the CN
    for (stem, cn, sans) in [
        ("api", "api", &["api-client.example"][..]),
        ("ops_box", "box1", &["box1.ops.example"][..]),
        ("deep_ops", "deep", &["a.box1.ops.example"][..]),
        ("other_name", "db", &["db.example"][..]),
        ("cn_named", "api-client.example", &[][..]),
    ] {
        client(
            stem,
            cn,
            ours,
            ExtendedKeyUsagePurpose::ClientAuth,
            false,
            sans,
        );
    }
    ClientPki {
        ca: dir.join("client-ca.crt"),
        dir: dir.to_owned(),
    }
}
