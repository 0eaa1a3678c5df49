//! `[[site]]`: virtual hosts over real TLS with SNI. Two sites (and a third sharing the first
//! one's certificate) on one listener answer different content by Host; wildcard names; the
//! top-level routes as the default site; 421 Misdirected Request when the Host names a site
//! the SNI's certificate is not for, on HTTP/1.1 and HTTP/2.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use common::{Proto, TestServer, BOTH};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;

/// Writes a self-signed certificate for `names` to `<dir>/<file>.crt` and `.key`.
fn cert(dir: &Path, file: &str, names: &[&str]) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let params =
        rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap();
    let c = params.self_signed(&key).unwrap();
    std::fs::write(dir.join(format!("{file}.crt")), c.pem()).unwrap();
    std::fs::write(dir.join(format!("{file}.key")), key.serialize_pem()).unwrap();
}

fn page(dir: &Path, site: &str, text: &str) {
    std::fs::create_dir_all(dir.join(site)).unwrap();
    std::fs::write(dir.join(site).join("index.html"), text).unwrap();
}

/// Sites a (a.test, cert A), b (b.test and *.w.test, cert B), c (c.test, also cert A: A
/// names a.test and c.test); the top-level route is the default site. A TLS listener that
/// takes the sites' certificates, and a plain one.
fn start() -> TestServer {
    let config = r#"
[[listener]]
address = "127.0.0.1:0"
[listener.tls]
certificates = []
[[listener]]
address = "127.0.0.1:0"

[[route]]
prefix = "/"
root = "{dir}/default"

[[site]]
server_names = ["a.test"]
certificates = [{ cert = "{dir}/a.crt", key = "{dir}/a.key" }]
[[site.route]]
prefix = "/"
root = "{dir}/a"

[[site]]
server_names = ["B.test", "*.w.test"]
certificates = [{ cert = "{dir}/b.crt", key = "{dir}/b.key" }]
[[site.route]]
prefix = "/"
root = "{dir}/b"

[[site]]
server_names = ["c.test"]
certificates = [{ cert = "{dir}/a.crt", key = "{dir}/a.key" }]
[[site.route]]
prefix = "/"
root = "{dir}/c"
"#;
    common::start_with(config, |d| {
        cert(d, "a", &["a.test", "c.test"]);
        cert(d, "b", &["b.test", "*.w.test"]);
        page(d, "a", "site a");
        page(d, "b", "site b");
        page(d, "c", "site c");
        page(d, "default", "default site");
        std::fs::write(d.join("default/only-default.txt"), "only here").unwrap();
    })
}

/// A rustls client trusting certificates A and B.
fn tls_config(dir: &Path, proto: Proto) -> rustls::ClientConfig {
    common::install_provider();
    let mut roots = rustls::RootCertStore::empty();
    for f in ["a.crt", "b.crt"] {
        for c in qweb_tls::load_certs(&dir.join(f)).unwrap() {
            roots.add(c).unwrap();
        }
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(qweb_tls::provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = match proto {
        Proto::H1 => vec![b"http/1.1".to_vec()],
        Proto::H2 => vec![b"h2".to_vec()],
    };
    cfg
}

/// reqwest resolving the test names to the TLS listener (SNI = the URL's host).
fn client(s: &TestServer, proto: Proto) -> reqwest::Client {
    let mut b = reqwest::Client::builder()
        .use_preconfigured_tls(tls_config(s.dir.path(), proto))
        .redirect(reqwest::redirect::Policy::none());
    for n in ["a.test", "b.test", "c.test", "x.w.test"] {
        b = b.resolve(n, s.addrs[0]);
    }
    let b = match proto {
        Proto::H1 => b.http1_only(),
        Proto::H2 => b.http2_prior_knowledge(),
    };
    b.build().unwrap()
}

async fn get(c: &reqwest::Client, url: &str) -> (u16, String) {
    let r = c.get(url).send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sites_answer_by_host_over_tls_with_sni() {
    let s = start();
    let port = s.addrs[0].port();
    for proto in BOTH {
        let c = client(&s, proto);
        for (host, want) in [
            ("a.test", "site a"),
            ("b.test", "site b"),
            ("x.w.test", "site b"),
            ("c.test", "site c"),
        ] {
            let (st, body) = get(&c, &format!("https://{host}:{port}/")).await;
            assert_eq!((st, body.as_str()), (200, want), "{proto:?} {host}");
        }
        // a site's own routes only: no falling through to the default site
        let (st, _) = get(&c, &format!("https://b.test:{port}/only-default.txt")).await;
        assert_eq!(st, 404, "{proto:?}");
    }
}

/// Plain HTTP (no SNI): the Host alone picks the site, without port, case or trailing dot;
/// unknown names, a bare `w.test` (the wildcard needs a label) and two labels under it get
/// the default site.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_selects_site_and_unknown_names_get_default() {
    let s = start();
    let c = common::plain_client();
    for (host, want) in [
        ("a.test", "site a"),
        ("A.TEST:8080", "site a"),
        ("a.test.", "site a"),
        ("B.Test", "site b"),
        ("deep.w.test", "site b"),
        ("w.test", "default site"),
        ("y.x.w.test", "default site"),
        ("unknown.test", "default site"),
        ("127.0.0.1", "default site"),
        ("[::1]:80", "default site"),
    ] {
        let r = c
            .get(format!("{}/", s.http()))
            .header("host", host)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{host}");
        assert_eq!(r.text().await.unwrap(), want, "{host}");
    }
}

/// Connects with SNI `sni`, sends one GET for `https://{host}/` (HTTP/1.1: `Host: host`;
/// HTTP/2: `:authority` = host) and returns the status and body.
async fn get_with_sni(
    s: &TestServer,
    addr: SocketAddr,
    sni: &str,
    host: &str,
    proto: Proto,
) -> (u16, String) {
    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls_config(s.dir.path(), proto)));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = connector
        .connect(ServerName::try_from(sni.to_owned()).unwrap(), tcp)
        .await
        .unwrap();
    let io = TokioIo::new(tls);
    let resp = match proto {
        Proto::H1 => {
            let (mut send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
            tokio::spawn(conn);
            let req = http::Request::get("/")
                .header("host", host)
                .body(Empty::<bytes::Bytes>::new())
                .unwrap();
            send.send_request(req).await.unwrap()
        }
        Proto::H2 => {
            let (mut send, conn) =
                hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                    .await
                    .unwrap();
            tokio::spawn(conn);
            let req = http::Request::get(format!("https://{host}/"))
                .body(Empty::<bytes::Bytes>::new())
                .unwrap();
            send.send_request(req).await.unwrap()
        }
    };
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_naming_another_site_than_sni_is_misdirected() {
    let s = start();
    let addr = s.addrs[0];
    for proto in BOTH {
        // SNI a.test, Host b.test: certificate A is not B's: 421
        let (st, _) = get_with_sni(&s, addr, "a.test", "b.test", proto).await;
        assert_eq!(st, 421, "{proto:?}");
        let (st, _) = get_with_sni(&s, addr, "a.test", "B.TEST.:443", proto).await;
        assert_eq!(st, 421, "{proto:?} case, dot and port");
        let (st, _) = get_with_sni(&s, addr, "x.w.test", "a.test", proto).await;
        assert_eq!(st, 421, "{proto:?} wildcard SNI");
        // the default site has no certificate of its own: not A's
        let (st, _) = get_with_sni(&s, addr, "a.test", "unknown.test", proto).await;
        assert_eq!(st, 421, "{proto:?} default site");
        // a and c share certificate A: c is answered on a's connection
        let (st, body) = get_with_sni(&s, addr, "a.test", "c.test", proto).await;
        assert_eq!((st, body.as_str()), (200, "site c"), "{proto:?}");
        // same site by another name
        let (st, body) = get_with_sni(&s, addr, "y.w.test", "b.test", proto).await;
        assert_eq!((st, body.as_str()), (200, "site b"), "{proto:?}");
    }
}

/// Without sites nothing changes: any Host, any SNI, the top-level routes answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_sites_every_host_gets_the_routes() {
    let s = common::start_with("", |d| {
        std::fs::write(d.join("site/index.html"), "routes").unwrap();
    });
    let c = common::client(&s.cert(), Proto::H1);
    let r = c
        .get(format!("{}/", s.https()))
        .header("host", "anything.test")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "routes");
}
