//! `https://` upstreams: real TLS upstream servers (tokio-rustls + hyper) with their own CA, a
//! bad certificate, a wrong name, and one that asks for a client certificate.

use qweb_testkit as common;

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;

/// Everything qweb logs in this test binary.
fn logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let b = buf.clone();
        let _ = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .with_writer(move || Capture(b.clone()))
            .try_init();
        buf
    })
}

struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

fn ca() -> Ca {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let key = KeyPair::generate().unwrap();
    let cert = p.self_signed(&key).unwrap();
    Ca { cert, key }
}

/// A leaf certificate for `names`, signed by `ca` (or self-signed when `None`): (cert PEM,
/// key PEM).
fn leaf(names: &[&str], ca: Option<&Ca>) -> (String, String) {
    let p =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = match ca {
        Some(ca) => p.signed_by(&key, &ca.cert, &ca.key).unwrap(),
        None => p.self_signed(&key).unwrap(),
    };
    (cert.pem(), key.serialize_pem())
}

fn der(cert_pem: &str, key_pem: &str) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
    let dir = tempfile::tempdir().unwrap();
    let (c, k) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
    std::fs::write(&c, cert_pem).unwrap();
    std::fs::write(&k, key_pem).unwrap();
    (
        qweb_tls::load_certs(&c).unwrap(),
        qweb_tls::load_private_key(&k).unwrap(),
    )
}

struct TlsUpstream {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
}

/// An HTTPS upstream answering `tls-up:<path>` (and `client-cert` when the client showed
/// one), asking for a client certificate signed by `client_ca` when given.
async fn tls_upstream(cert_pem: &str, key_pem: &str, client_ca: Option<&Ca>) -> TlsUpstream {
    common::install_provider();
    let (certs, key) = der(cert_pem, key_pem);
    let provider = Arc::new(qweb_tls::provider());
    let b = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let b = match client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(ca.cert.der().clone()).unwrap();
            let v = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .unwrap();
            b.with_client_cert_verifier(v)
        }
        None => b.with_no_client_auth(),
    };
    let mut cfg = b.with_single_cert(certs, key).unwrap();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let n = connections.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            n.fetch_add(1, Ordering::SeqCst);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(s).await else {
                    return;
                };
                let client_cert = tls.get_ref().1.peer_certificates().is_some();
                let svc = hyper::service::service_fn(move |req: hyper::Request<_>| async move {
                    let body = format!(
                        "tls-up:{}{}",
                        req.uri().path(),
                        if client_cert { " client-cert" } else { "" }
                    );
                    Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from(body))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    TlsUpstream { addr, connections }
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

async fn get(t: &common::TestServer, path: &str) -> (u16, String) {
    let r = common::plain_client()
        .get(format!("{}{path}", t.http()))
        .send()
        .await
        .unwrap();
    let s = r.status().as_u16();
    (s, r.text().await.unwrap())
}

#[tokio::test]
async fn https_upstream_with_its_own_ca_is_verified_and_pooled() {
    logs();
    let ca = ca();
    let (c, k) = leaf(&["upstream.test"], Some(&ca));
    let up = tls_upstream(&c, &k, None).await;
    let ca_pem = ca.cert.pem();
    let t = common::start_with(
        &format!(
            "[[route]]\nprefix = \"/\"\nupstreams = [\"https://{}\"]\n\
             upstream_ca = \"{{dir}}/ca.pem\"\nupstream_server_name = \"upstream.test\"\n",
            up.addr
        ),
        |d| {
            write(d, "ca.pem", &ca_pem);
        },
    );
    for i in 0..3 {
        let (s, body) = get(&t, &format!("/x{i}")).await;
        assert_eq!(s, 200);
        assert_eq!(body, format!("tls-up:/x{i}"));
    }
    assert_eq!(
        up.connections.load(Ordering::SeqCst),
        1,
        "kept alive and reused"
    );
}

#[tokio::test]
async fn bad_upstream_certificates_are_refused_502_and_logged() {
    logs();
    let ca = ca();
    let ca_pem = ca.cert.pem();
    // self-signed, not by the route's CA
    let (c, k) = leaf(&["upstream.test"], None);
    let selfsigned = tls_upstream(&c, &k, None).await;
    // by the CA, for another name
    let (c, k) = leaf(&["other.test"], Some(&ca));
    let wrong_name = tls_upstream(&c, &k, None).await;
    for (up, why) in [(selfsigned, "self-signed"), (wrong_name, "wrong name")] {
        let t = common::start_with(
            &format!(
                "[[route]]\nprefix = \"/\"\nupstreams = [\"https://{}\"]\n\
                 upstream_ca = \"{{dir}}/ca.pem\"\nupstream_server_name = \"upstream.test\"\n",
                up.addr
            ),
            |d| {
                write(d, "ca.pem", &ca_pem);
            },
        );
        let (s, body) = get(&t, "/secret").await;
        assert_eq!(s, 502, "{why}: {body}");
        assert!(!body.contains("tls-up"), "{why}");
        assert_eq!(up.connections.load(Ordering::SeqCst), 1, "{why}: one try");
    }
    let text = String::from_utf8_lossy(&logs().lock().unwrap()).into_owned();
    assert!(text.contains("upstream TLS handshake failed"), "{text}");
    assert!(text.contains("invalid peer certificate"), "{text}");
    assert!(
        text.contains("not valid for name \"upstream.test\""),
        "{text}"
    );
}

#[tokio::test]
async fn client_certificate_for_an_upstream_that_asks_for_one() {
    logs();
    let ca = ca();
    let ca_pem = ca.cert.pem();
    let (c, k) = leaf(&["upstream.test"], Some(&ca));
    let up = tls_upstream(&c, &k, Some(&ca)).await;
    let (cc, ck) = leaf(&["qweb.client"], Some(&ca));
    let route = |client: bool| {
        format!(
            "[[route]]\nprefix = \"/\"\nupstreams = [\"https://{}\"]\n\
             upstream_ca = \"{{dir}}/ca.pem\"\nupstream_server_name = \"upstream.test\"\n{}",
            up.addr,
            if client {
                "upstream_client_cert = \"{dir}/cc.pem\"\nupstream_client_key = \"{dir}/ck.pem\"\n"
            } else {
                ""
            }
        )
    };
    let prepare = |d: &Path| {
        write(d, "ca.pem", &ca_pem);
        write(d, "cc.pem", &cc);
        write(d, "ck.pem", &ck);
    };
    let t = common::start_with(&route(false), prepare);
    let (s, _) = get(&t, "/m").await;
    assert_eq!(s, 502, "no client certificate");
    let t = common::start_with(&route(true), prepare);
    let (s, body) = get(&t, "/m").await;
    assert_eq!(s, 200);
    assert_eq!(body, "tls-up:/m client-cert");
}

#[test]
fn tls_keys_are_validated_with_their_names() {
    let check = |route: &str, want: &str| {
        let text = format!("[[route]]\nprefix = \"/api\"\n{route}\n");
        let e = qweb_server::Config::from_str_at(&text, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{e}");
    };
    check(
        "upstreams = [\"https://127.0.0.1:9\"]\nupstream_ca = \"/nonexistent/ca.pem\"",
        "key `route[0].upstream_ca`",
    );
    check(
        "upstreams = [\"127.0.0.1:9\"]\nupstream_ca = \"/nonexistent/ca.pem\"",
        "`upstream_ca` is for https:// upstreams",
    );
    check(
        "upstreams = [\"https://127.0.0.1:9\"]\nupstream_server_name = \"bad name!\"",
        "key `route[0].upstream_server_name`",
    );
    check(
        "upstreams = [\"https://127.0.0.1:9\"]\nupstream_client_cert = \"/x.pem\"",
        "key `route[0].upstream_client_key`",
    );
    check(
        "upstreams = [\"ftp://127.0.0.1:9\"]",
        "key `route[0].upstreams[0]`",
    );
}
