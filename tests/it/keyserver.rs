//! The key server end to end: a real `qweb keyserver` process and a real qweb that holds no
//! private key file, over the Unix socket and over mutual TLS; faults.
#![allow(unsafe_code)] // libc calls on test processes and files; each block has its SAFETY note

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use qweb_server::RunningServer;
use qweb_testkit::process::{cpu_seconds, rss_kib, Qweb, KEYSERVER_READY};
use qweb_testkit::start_file;
use qweb_testkit::tls::{connect, ClientTls};

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

/// A `qweb keyserver` child process (killed when dropped).
struct Keyserver {
    q: Qweb,
    tls_addr: Option<String>,
    admin_addr: Option<String>,
    /// Key ids (hex) in the order the key server printed them.
    key_ids: Vec<String>,
}

impl Keyserver {
    fn start(pki: &Pki, name: &str, tls: bool, latency_ms: u64) -> Keyserver {
        let mut extra = String::new();
        if tls {
            extra.push_str("[tls]\naddress = \"127.0.0.1:0\"\ncert = \"ks.crt\"\nkey = \"ks.key\"\nclient_ca = \"ca.crt\"\n");
        }
        Self::start_with(
            pki,
            name,
            "keys = [\"rsa.key\", \"ecdsa.key\"]\nthreads = 2\n",
            &extra,
            latency_ms,
            None,
        )
    }

    /// `top`: top-level keys (`keys`, limits); `tables`: more tables after `[unix]`;
    /// `nofile`: the process's RLIMIT_NOFILE.
    fn start_with(
        pki: &Pki,
        name: &str,
        top: &str,
        tables: &str,
        latency_ms: u64,
        nofile: Option<u64>,
    ) -> Keyserver {
        let cfg = format!("{top}[unix]\npath = \"{name}.sock\"\n{tables}");
        let file = write(pki.dir.path(), &format!("{name}.toml"), &cfg);
        let mut cmd = Command::new(BIN);
        cmd.args(["keyserver", "--config"])
            .arg(&file)
            .arg("--added-latency-ms")
            .arg(latency_ms.to_string())
            .stdout(Stdio::null());
        if let Some(n) = nofile {
            use std::os::unix::process::CommandExt;
            // SAFETY: the closure runs in the child between fork and exec and only calls
            // setrlimit(2), which is async-signal-safe; `lim` lives on the child's stack.
            unsafe {
                cmd.pre_exec(move || {
                    let lim = libc::rlimit {
                        rlim_cur: n,
                        rlim_max: n,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let q = Qweb::spawn(cmd, KEYSERVER_READY);
        let mut tls_addr = None;
        let mut admin_addr = None;
        let mut key_ids = Vec::new();
        for l in &q.banner {
            if let Some(a) = l.trim().strip_prefix("qweb keyserver: listening on tls://") {
                tls_addr = a.split(' ').next().map(str::to_owned);
            }
            if let Some(a) = l.trim().strip_prefix("qweb keyserver: metrics on http://") {
                admin_addr = a.split('/').next().map(str::to_owned);
            }
            if let Some(k) = l.trim().strip_prefix("qweb keyserver: key ") {
                key_ids.push(k.to_owned());
            }
        }
        Keyserver {
            q,
            tls_addr,
            admin_addr,
            key_ids,
        }
    }

    /// The stderr lines printed after "ready".
    fn log(&self) -> Vec<String> {
        self.q.lines().split_off(self.q.banner.len())
    }

    fn pid(&self) -> u32 {
        self.q.pid()
    }

    fn kill(&mut self) {
        self.q.kill();
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
    start_file(&write(pki.dir.path(), "qweb.toml", &cfg))
}

fn client(
    ca: &Path,
    version: &'static rustls::SupportedProtocolVersion,
) -> Arc<rustls::ClientConfig> {
    ClientTls::trusting(ca)
        .versions(&[version])
        .no_resumption()
        .arc()
}

/// A full handshake and one request; the body.
async fn fetch(
    addr: std::net::SocketAddr,
    cfg: Arc<rustls::ClientConfig>,
) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tls = connect(addr, &cfg).await?;
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
        let b = ClientTls::trusting(&pki.path("ca.crt"));
        let cfg = match who {
            None => b,
            Some(n) => b.client_cert(
                &pki.path(&format!("{n}.crt")),
                &pki.path(&format!("{n}.key")),
            ),
        }
        .arc();
        // TLS 1.3: the client may think it is done before the server checked its certificate;
        // either the handshake fails or the first read does, and no answer ever comes.
        if let Ok(mut s) = connect(addr, &cfg).await {
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
    let mut restarted: Option<Duration> = None;
    // until 4 s after the restart: the engine's reconnect backoff (100 ms doubling, so its
    // next try comes within ~2 s of the restart here), then a second of handshakes checked
    while restarted.is_none_or(|r| start.elapsed() < r + Duration::from_secs(4)) {
        let t = start.elapsed();
        if t > Duration::from_millis(800)
            && restarted.is_none()
            && ks.q.child().try_wait().unwrap().is_none()
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
    // the last second must be all successes
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

// ---- Hostile peers of the key server itself (bounds, fair share, timeouts, accept errors) ----

/// A request frame of docs/KEYSERVER_PROTOCOL.md, written by hand (the test is the peer).
fn request_frame(id: u64, opcode: u8, key_hex: &str, message: &[u8]) -> Vec<u8> {
    let key: Vec<u8> = (0..32)
        .map(|i| u8::from_str_radix(&key_hex[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let mut f = Vec::new();
    f.extend_from_slice(&((10 + 1 + 32 + message.len()) as u32).to_be_bytes());
    f.extend_from_slice(&[qweb_keyserver::protocol::VERSION, 1]);
    f.extend_from_slice(&id.to_be_bytes());
    f.push(opcode);
    f.extend_from_slice(&key);
    f.extend_from_slice(message);
    f
}

/// Reads one frame; returns its kind (2 response, 3 error) and request id.
fn read_frame(s: &mut impl std::io::Read) -> std::io::Result<(u8, u64)> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut body)?;
    let id = u64::from_be_bytes(body[2..10].try_into().unwrap());
    Ok((body[1], id))
}

/// A peer floods sign requests and never reads an answer: the key server stops reading
/// from it (backpressure) instead of queueing answers, its memory stays bounded, another
/// peer is still served meanwhile, and memory is back near the baseline once the peer left.
#[test]
fn a_peer_that_floods_and_never_reads_is_bounded() {
    let pki = Pki::new();
    let ks = Keyserver::start_with(
        &pki,
        "flood",
        "keys = [\"ecdsa.key\"]\nthreads = 1\nmax_answers_per_connection = 64\n\
         max_signing_per_connection = 4\nframe_timeout = \"60s\"\n",
        "",
        0,
        None,
    );
    let key = ks.key_ids[0].clone();
    let pid = ks.pid();
    std::thread::sleep(Duration::from_millis(300));
    let base = rss_kib(pid);
    let sock = pki.path("flood.sock");
    let mut flood = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    flood
        .set_write_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let batch: Vec<u8> = (0..512u64)
        .flat_map(|i| request_frame(i, 0x07, &key, b"flood"))
        .collect();
    let (mut off, mut sent, mut peak) = (0usize, 0u64, base);
    let start = Instant::now();
    let mut sampled = Instant::now();
    let mut other_served = None;
    while start.elapsed() < Duration::from_secs(6) {
        use std::io::Write;
        match flood.write(&batch[off..]) {
            Ok(n) => {
                sent += n as u64;
                off = (off + n) % batch.len();
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => panic!("flooding peer: {e}"),
        }
        if sampled.elapsed() > Duration::from_millis(200) {
            peak = peak.max(rss_kib(pid));
            sampled = Instant::now();
        }
        if other_served.is_none() && start.elapsed() > Duration::from_secs(3) {
            // another peer, meanwhile
            use std::io::Write;
            let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let t = Instant::now();
            s.write_all(&request_frame(7, 0x07, &key, b"hello"))
                .unwrap();
            other_served = Some((read_frame(&mut s).unwrap(), t.elapsed()));
        }
    }
    peak = peak.max(rss_kib(pid));
    let grown_mib = (peak.saturating_sub(base)) as f64 / 1024.0;
    eprintln!(
        "flood: baseline {base} KiB, peak {peak} KiB (+{grown_mib:.1} MiB), {sent} bytes sent, other peer {other_served:?}"
    );
    assert!(
        grown_mib < 64.0,
        "key server grew by {grown_mib:.1} MiB under a non-reading flood"
    );
    // backpressure: the key server stopped reading, so the peer could not write much more
    // than the socket buffers hold (old behaviour: it read everything, many MiB)
    assert!(
        sent < 4 << 20,
        "{sent} bytes accepted from a peer that never reads"
    );
    let ((kind, id), took) = other_served.unwrap();
    assert_eq!((kind, id), (2, 7), "the other peer was not answered");
    assert!(
        took < Duration::from_secs(2),
        "the other peer waited {took:?}"
    );
    drop(flood);
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut after = rss_kib(pid);
    while after > base + 16 * 1024 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        after = rss_kib(pid);
    }
    eprintln!("flood: {after} KiB after the peer left");
    assert!(
        after <= base + 16 * 1024,
        "memory not returned: baseline {base} KiB, after {after} KiB"
    );
}

/// One peer keeps the signing pool busy (it floods and reads its answers); another peer's
/// requests are still answered quickly: each connection has only a small share of the
/// signing queue (default limits).
#[test]
fn a_flooding_peer_does_not_starve_another() {
    use std::io::Write;
    let pki = Pki::new();
    let ks = Keyserver::start_with(
        &pki,
        "fair",
        "keys = [\"rsa.key\"]\nthreads = 1\n",
        "",
        0,
        None,
    );
    let key = ks.key_ids[0].clone();
    let sock = pki.path("fair.sock");
    let flood = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    let mut rd = flood.try_clone().unwrap();
    let answered = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let a = answered.clone();
    let reader = std::thread::spawn(move || {
        while read_frame(&mut rd).is_ok() {
            a.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    });
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let st = stop.clone();
    let mut wr = flood.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let batch: Vec<u8> = (0..64u64)
            .flat_map(|i| request_frame(i, 0x04, &key, b"flood"))
            .collect();
        while !st.load(std::sync::atomic::Ordering::Relaxed) {
            if wr.write_all(&batch).is_err() {
                return;
            }
        }
    });
    std::thread::sleep(Duration::from_secs(1));
    let key = ks.key_ids[0].clone();
    let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut worst = Duration::ZERO;
    for i in 0..10u64 {
        let t = Instant::now();
        s.write_all(&request_frame(1000 + i, 0x04, &key, b"mine"))
            .unwrap();
        let got = read_frame(&mut s).unwrap();
        worst = worst.max(t.elapsed());
        assert_eq!(got, (2, 1000 + i), "request {i} not signed");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = flood.shutdown(std::net::Shutdown::Both);
    let _ = writer.join();
    let _ = reader.join();
    let flooded = answered.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "fair share: worst {worst:?} for the quiet peer; the flooding peer got {flooded} answers"
    );
    assert!(
        flooded > 10,
        "the flood did not keep the pool busy ({flooded})"
    );
    assert!(
        worst < Duration::from_secs(1),
        "the quiet peer waited {worst:?} behind the flood"
    );
}

/// A frame begun and not finished within `frame_timeout` closes that connection; an idle
/// connection (no partial frame) stays open and is served.
#[test]
fn a_half_sent_frame_times_out() {
    use std::io::{Read, Write};
    let pki = Pki::new();
    let ks = Keyserver::start_with(
        &pki,
        "half",
        "keys = [\"ecdsa.key\"]\nframe_timeout = \"1s\"\n",
        "",
        0,
        None,
    );
    let key = ks.key_ids[0].clone();
    let sock = pki.path("half.sock");
    let mut idle = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    let mut half = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    let frame = request_frame(1, 0x07, &key, b"half");
    half.write_all(&frame[..20]).unwrap();
    half.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let t = Instant::now();
    let mut b = [0u8; 64];
    let r = half.read(&mut b);
    let took = t.elapsed();
    assert!(
        matches!(r, Ok(0))
            || matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "half a frame: {r:?} after {took:?}"
    );
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(4),
        "closed after {took:?}, frame_timeout is 1 s"
    );
    // the idle connection outlived the timeout and still works
    idle.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    idle.write_all(&frame).unwrap();
    assert_eq!(read_frame(&mut idle).unwrap(), (2, 1));
}

/// Accept fails with EMFILE (file descriptor limit reached, connections held open): every
/// accept loop backs off instead of spinning, and logs rarely. Once descriptors are free,
/// the listeners accept again.
#[test]
fn accept_errors_back_off_and_log_rarely() {
    use std::io::{Read, Write};
    let pki = Pki::new();
    let ks = Keyserver::start_with(
        &pki,
        "emfile",
        "keys = [\"ecdsa.key\"]\nthreads = 1\n",
        "[admin]\naddress = \"127.0.0.1:0\"\n",
        0,
        Some(32),
    );
    let pid = ks.pid();
    let admin: std::net::SocketAddr = ks.admin_addr.as_ref().unwrap().parse().unwrap();
    let sock = pki.path("emfile.sock");
    // hold more connections than the key server has descriptors; the rest wait in the
    // backlogs, so the listeners stay readable and accept keeps failing
    let mut held = Vec::new();
    for _ in 0..48 {
        held.push(std::net::TcpStream::connect(admin).unwrap());
    }
    let mut held_unix = Vec::new();
    for _ in 0..16 {
        held_unix.push(std::os::unix::net::UnixStream::connect(&sock).unwrap());
    }
    std::thread::sleep(Duration::from_millis(500));
    let lines_before = ks.log().len();
    let (cpu0, t0) = (cpu_seconds(pid), Instant::now());
    std::thread::sleep(Duration::from_secs(3));
    let (cpu, wall) = (cpu_seconds(pid) - cpu0, t0.elapsed().as_secs_f64());
    let log: Vec<String> = ks.log();
    let accept_lines: Vec<&String> = log.iter().filter(|l| l.contains("accept")).collect();
    let during = log.len() - lines_before;
    eprintln!(
        "EMFILE: {cpu:.3} s CPU in {wall:.1} s; {} accept log lines in all, {during} during the window: {accept_lines:?}",
        accept_lines.len()
    );
    assert!(
        accept_lines
            .iter()
            .any(|l| l.contains("Too many open files") || l.contains("os error 24")),
        "EMFILE was not reached or not logged: {log:?}"
    );
    assert!(
        cpu < 0.1 * wall,
        "{cpu:.3} s CPU in {wall:.1} s while accept fails"
    );
    // first error of each listener, at most one more each
    assert!(
        accept_lines.len() <= 4,
        "accept errors logged too often: {accept_lines:?}"
    );
    // descriptors free again: the admin listener serves
    drop(held);
    drop(held_unix);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut s = std::net::TcpStream::connect(admin).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        if out.contains("qweb_keyserver_requests_total") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "admin listener did not recover: {out:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
