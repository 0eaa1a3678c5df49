//! The key server end to end: a real `qweb keyserver` process and a real qweb that holds no
//! private key file, over the Unix socket and over mutual TLS; faults.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use qweb_server::{Config, RunningServer, Server};

const BIN: &str = env!("CARGO_BIN_EXE_qweb");

struct Pki {
    dir: tempfile::TempDir,
}

fn write(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    p
}

impl Pki {
    /// Site certificates (RSA and ECDSA, for localhost) with their keys, a CA, a key server
    /// certificate and a qweb client certificate signed by it, and a rogue client certificate.
    fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for (name, kp) in [
            (
                "rsa",
                rcgen::KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048)
                    .unwrap(),
            ),
            (
                "ecdsa",
                rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap(),
            ),
            (
                "orphan",
                rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap(),
            ),
        ] {
            let c = rcgen::CertificateParams::new(vec!["localhost".into()])
                .unwrap()
                .self_signed(&kp)
                .unwrap();
            write(d, &format!("{name}.crt"), &c.pem());
            write(d, &format!("{name}.key"), &kp.serialize_pem());
        }
        let ca_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "test key CA");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        write(d, "ca.crt", &ca.pem());
        for (name, san) in [("ks", "localhost"), ("client", "qweb-client")] {
            let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
            let c = rcgen::CertificateParams::new(vec![san.into()])
                .unwrap()
                .signed_by(&kp, &ca, &ca_key)
                .unwrap();
            write(d, &format!("{name}.crt"), &c.pem());
            write(d, &format!("{name}.key"), &kp.serialize_pem());
        }
        let rogue = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let c = rcgen::CertificateParams::new(vec!["qweb-client".into()])
            .unwrap()
            .self_signed(&rogue)
            .unwrap();
        write(d, "rogue.crt", &c.pem());
        write(d, "rogue.key", &rogue.serialize_pem());
        Pki { dir }
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// A `qweb keyserver` child process.
struct Keyserver {
    child: Child,
    tls_addr: Option<String>,
}

impl Keyserver {
    fn start(pki: &Pki, name: &str, tls: bool, latency_ms: u64) -> Keyserver {
        let mut cfg = format!(
            "keys = [\"rsa.key\", \"ecdsa.key\"]\nthreads = 2\n[unix]\npath = \"{name}.sock\"\n"
        );
        if tls {
            cfg.push_str("[tls]\naddress = \"127.0.0.1:0\"\ncert = \"ks.crt\"\nkey = \"ks.key\"\nclient_ca = \"ca.crt\"\n");
        }
        let file = write(pki.dir.path(), &format!("{name}.toml"), &cfg);
        let mut child = Command::new(BIN)
            .args(["keyserver", "--config"])
            .arg(&file)
            .arg("--added-latency-ms")
            .arg(latency_ms.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut reader = BufReader::new(child.stderr.take().unwrap());
        let mut tls_addr = None;
        let mut lines = Vec::new();
        loop {
            let mut l = String::new();
            if reader.read_line(&mut l).unwrap() == 0 {
                panic!("keyserver exited: {lines:?}");
            }
            if let Some(a) = l.trim().strip_prefix("qweb keyserver: listening on tls://") {
                tls_addr = a.split(' ').next().map(str::to_owned);
            }
            let ready = l.contains("qweb keyserver: ready");
            lines.push(l);
            if ready {
                break;
            }
        }
        std::thread::spawn(move || for _ in reader.lines() {});
        Keyserver { child, tls_addr }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Keyserver {
    fn drop(&mut self) {
        self.kill();
    }
}

/// qweb (in process) with one TLS listener per site certificate, no key files, signing on
/// the key servers at `servers`.
fn start_qweb(
    pki: &Pki,
    servers: &[String],
    sites: &[&str],
    mode: &str,
    timeout: &str,
) -> RunningServer {
    let list: Vec<String> = servers.iter().map(|s| format!("\"{s}\"")).collect();
    let mut cfg = format!(
        "workers = 1\nstate_dir = \"state\"\n[log]\naccess = false\n\
         [offload.engines.ks]\nkind = \"keyserver\"\nservers = [{}]\ntimeout = \"{timeout}\"\n\
         client_cert = \"client.crt\"\nclient_key = \"client.key\"\nserver_ca = \"ca.crt\"\n",
        list.join(", ")
    );
    for site in sites {
        cfg.push_str(&format!(
            "[[listener]]\naddress = \"127.0.0.1:0\"\n[listener.tls]\ncertificates = [{{ cert = \"{site}.crt\" }}]\n\
             [listener.offload]\nengine = \"ks\"\nmode = \"{mode}\"\ntimeout = \"{timeout}\"\n"
        ));
    }
    cfg.push_str(
        "[[listener]]\naddress = \"127.0.0.1:0\"\n[[route]]\nprefix = \"/\"\nroot = \"site\"\n",
    );
    std::fs::create_dir_all(pki.path("site")).unwrap();
    std::fs::write(pki.path("site/index.html"), "kept-away").unwrap();
    let file = write(pki.dir.path(), "qweb.toml", &cfg);
    let config = Config::from_file(&file).unwrap_or_else(|e| panic!("{e}"));
    Server::start(config).unwrap()
}

fn client(
    ca: &Path,
    version: &'static rustls::SupportedProtocolVersion,
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in qweb_tls::load_certs(ca).unwrap() {
        roots.add(c).unwrap();
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(qweb_tls::provider()))
        .with_protocol_versions(&[version])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.resumption = rustls::client::Resumption::disabled();
    Arc::new(cfg)
}

/// A full handshake and one request; the body.
async fn fetch(
    addr: std::net::SocketAddr,
    cfg: Arc<rustls::ClientConfig>,
) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(cfg)
        .connect(name, tcp)
        .await?;
    tls.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await?;
    let mut out = Vec::new();
    let _ = tls.read_to_end(&mut out).await;
    let text = String::from_utf8_lossy(&out).into_owned();
    match text.split_once("\r\n\r\n") {
        Some((_, body)) => Ok(body.to_owned()),
        None => Err(std::io::Error::other(format!("no response: {text:?}"))),
    }
}

async fn fetch_within(
    addr: std::net::SocketAddr,
    cfg: Arc<rustls::ClientConfig>,
) -> std::io::Result<String> {
    tokio::time::timeout(Duration::from_secs(10), fetch(addr, cfg))
        .await
        .map_err(|_| std::io::Error::other("handshake hung"))?
}

fn unix(pki: &Pki, name: &str) -> String {
    format!("unix:{}", pki.path(&format!("{name}.sock")).display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshakes_without_a_key_file_over_unix_and_mutual_tls() {
    let pki = Pki::new();
    let ks = Keyserver::start(&pki, "ks1", true, 0);
    let tls = format!(
        "tls://localhost:{}",
        ks.tls_addr.as_ref().unwrap().rsplit(':').next().unwrap()
    );
    for server in [unix(&pki, "ks1"), tls] {
        for mode in ["async", "sync"] {
            let q = start_qweb(
                &pki,
                std::slice::from_ref(&server),
                &["rsa", "ecdsa"],
                mode,
                "5s",
            );
            let addrs = q.local_addrs().to_vec();
            for (i, site) in ["rsa", "ecdsa"].iter().enumerate() {
                for version in [&rustls::version::TLS12, &rustls::version::TLS13] {
                    let body =
                        fetch_within(addrs[i], client(&pki.path(&format!("{site}.crt")), version))
                            .await
                            .unwrap_or_else(|e| panic!("{server} {mode} {site} {version:?}: {e}"));
                    assert_eq!(body, "kept-away");
                }
            }
            tokio::task::spawn_blocking(move || q.shutdown())
                .await
                .unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyserver_refuses_clients_without_a_valid_certificate() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let pki = Pki::new();
    let ks = Keyserver::start(&pki, "ks1", true, 0);
    let addr: std::net::SocketAddr = ks.tls_addr.as_ref().unwrap().parse().unwrap();
    for who in [None, Some("rogue")] {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(qweb_tls::load_certs(&pki.path("ca.crt")).unwrap().remove(0))
            .unwrap();
        let b = rustls::ClientConfig::builder_with_provider(Arc::new(qweb_tls::provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let cfg = match who {
            None => b.with_no_client_auth(),
            Some(n) => b
                .with_client_auth_cert(
                    qweb_tls::load_certs(&pki.path(&format!("{n}.crt"))).unwrap(),
                    qweb_tls::load_private_key(&pki.path(&format!("{n}.key"))).unwrap(),
                )
                .unwrap(),
        };
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        // TLS 1.3: the client may think it is done before the server checked its certificate;
        // either the handshake fails or the first read does, and no answer ever comes.
        if let Ok(mut s) = tokio_rustls::TlsConnector::from(Arc::new(cfg))
            .connect(name, tcp)
            .await
        {
            let frame = [0u8, 0, 0, 43, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 7];
            let _ = s.write_all(&frame).await;
            let _ = s.write_all(&[0u8; 32]).await;
            let mut out = Vec::new();
            let r = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
            assert!(r.is_ok(), "{who:?}: connection not closed");
            assert!(out.is_empty(), "{who:?} got an answer");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_key_and_timeout_fail_cleanly() {
    let pki = Pki::new();
    let _ks = Keyserver::start(&pki, "ks1", false, 0);
    // `orphan`'s key is not on the key server
    let q = start_qweb(&pki, &[unix(&pki, "ks1")], &["orphan"], "async", "2s");
    let addr = q.local_addrs()[0];
    let plain = q.local_addrs()[1];
    let start = Instant::now();
    let r = fetch_within(
        addr,
        client(&pki.path("orphan.crt"), &rustls::version::TLS13),
    )
    .await;
    assert!(r.is_err(), "a handshake with an unknown key succeeded");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "unknown key should fail fast, took {:?}",
        start.elapsed()
    );
    tokio::task::spawn_blocking(move || q.shutdown())
        .await
        .unwrap();

    // a key server slower than the timeout
    let _slow = Keyserver::start(&pki, "slow", false, 3000);
    let q = start_qweb(&pki, &[unix(&pki, "slow")], &["ecdsa"], "async", "300ms");
    let addr = q.local_addrs()[0];
    let plain2 = q.local_addrs()[1];
    let start = Instant::now();
    let r = fetch_within(
        addr,
        client(&pki.path("ecdsa.crt"), &rustls::version::TLS13),
    )
    .await;
    assert!(r.is_err(), "a timed-out handshake succeeded");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "took {:?}",
        start.elapsed()
    );
    // the worker keeps serving
    let body = reqwest_plain(plain2).await;
    assert_eq!(body, "kept-away");
    let _ = plain;
    tokio::task::spawn_blocking(move || q.shutdown())
        .await
        .unwrap();
}

async fn reqwest_plain(addr: std::net::SocketAddr) -> String {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    reqwest::get(format!("http://{addr}/"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// Kill the key server during a stream of handshakes, restart it: every handshake either
/// succeeds or fails cleanly, and success resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyserver_killed_and_restarted_mid_load() {
    let pki = Pki::new();
    let mut ks = Keyserver::start(&pki, "ks1", false, 0);
    let q = start_qweb(&pki, &[unix(&pki, "ks1")], &["ecdsa"], "async", "1s");
    let addr = q.local_addrs()[0];
    let cfg = client(&pki.path("ecdsa.crt"), &rustls::version::TLS13);
    let mut results = Vec::new();
    let start = Instant::now();
    let mut restarted = None;
    while start.elapsed() < Duration::from_secs(6) {
        let t = start.elapsed();
        if t > Duration::from_millis(800)
            && restarted.is_none()
            && ks.child.try_wait().unwrap().is_none()
        {
            ks.kill();
        }
        if t > Duration::from_millis(2000) && restarted.is_none() {
            ks = Keyserver::start(&pki, "ks1", false, 0);
            restarted = Some(start.elapsed());
        }
        let r = fetch_within(addr, cfg.clone()).await; // panics never: errors are results
        results.push((start.elapsed(), r.is_ok()));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let restarted = restarted.unwrap();
    let before = results
        .iter()
        .filter(|(t, _)| *t < Duration::from_millis(800))
        .all(|(_, ok)| *ok);
    assert!(before, "handshakes failed before the kill: {results:?}");
    assert!(
        results.iter().any(|(_, ok)| !ok),
        "no failure while the key server was down?"
    );
    // reconnect backoff is at most 5 s, and the last second must be all successes
    let tail: Vec<_> = results
        .iter()
        .filter(|(t, _)| *t > restarted + Duration::from_secs(3))
        .collect();
    assert!(
        !tail.is_empty() && tail.iter().all(|(_, ok)| *ok),
        "success did not resume: {results:?}"
    );
    tokio::task::spawn_blocking(move || q.shutdown())
        .await
        .unwrap();
}

/// Two key servers: killing one loses nothing that the other can serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_keyserver_takes_over() {
    let pki = Pki::new();
    let mut a = Keyserver::start(&pki, "ka", false, 0);
    let _b = Keyserver::start(&pki, "kb", false, 0);
    let q = start_qweb(
        &pki,
        &[unix(&pki, "ka"), unix(&pki, "kb")],
        &["rsa"],
        "async",
        "2s",
    );
    let addr = q.local_addrs()[0];
    let cfg = client(&pki.path("rsa.crt"), &rustls::version::TLS12);
    for _ in 0..4 {
        fetch_within(addr, cfg.clone()).await.unwrap();
    }
    a.kill();
    let mut ok = 0;
    for _ in 0..10 {
        if fetch_within(addr, cfg.clone()).await.is_ok() {
            ok += 1;
        }
    }
    // at most the ops caught on the dead connection could fail; they are retried once on
    // the other server, so all succeed
    assert_eq!(ok, 10);
    tokio::task::spawn_blocking(move || q.shutdown())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_drops_only_that_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let pki = Pki::new();
    let _ks = Keyserver::start(&pki, "ks1", false, 0);
    let q = start_qweb(&pki, &[unix(&pki, "ks1")], &["ecdsa"], "async", "2s");
    let addr = q.local_addrs()[0];
    let cfg = client(&pki.path("ecdsa.crt"), &rustls::version::TLS13);
    fetch_within(addr, cfg.clone()).await.unwrap();
    let mut s = tokio::net::UnixStream::connect(pki.path("ks1.sock"))
        .await
        .unwrap();
    s.write_all(&[0xff; 64]).await.unwrap();
    let mut out = Vec::new();
    let r = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    assert!(r.is_ok(), "garbage connection not closed");
    assert!(out.is_empty());
    // qweb's own connections are unaffected
    for _ in 0..3 {
        fetch_within(addr, cfg.clone()).await.unwrap();
    }
    // the socket is private
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(pki.path("ks1.sock"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    tokio::task::spawn_blocking(move || q.shutdown())
        .await
        .unwrap();
}
