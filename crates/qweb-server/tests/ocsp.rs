//! OCSP stapling from a file, seen by a real client (`openssl s_client -status`), with the
//! PKI and the responses made by the `openssl` command (`openssl ocsp` answering from an
//! index file): a good response is stapled on TLS 1.2 and 1.3; an expired one, or one for
//! another certificate, never is (the server serves without a staple); a new file is picked
//! up while running.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use qweb_server::{Config, RunningServer, Server};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl is installed");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, a leaf for localhost (serial 0x1234) signed by it, and a good OCSP response for
/// the leaf (`good.der`, next update in a day) and one for another serial (`other.der`).
fn pki() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-subj",
        "/CN=Test CA",
        "-days",
        "10",
    ]);
    openssl(d, &ca);
    for (name, serial) in [("leaf", "0x1234"), ("other", "0x9999")] {
        let mut req = vec!["req"];
        req.extend(ec);
        let (key, csr, crt) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
        );
        req.extend(["-keyout", &key, "-out", &csr, "-subj", "/CN=localhost"]);
        openssl(d, &req);
        std::fs::write(d.join("san.ext"), "subjectAltName=DNS:localhost\n").unwrap();
        openssl(
            d,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-set_serial",
                serial,
                "-out",
                &crt,
                "-days",
                "5",
                "-extfile",
                "san.ext",
            ],
        );
    }
    std::fs::write(
        d.join("index.txt"),
        "V\t301231235959Z\t\t1234\tunknown\t/CN=localhost\nV\t301231235959Z\t\t9999\tunknown\t/CN=other\n",
    )
    .unwrap();
    for (cert, out) in [("leaf.crt", "good.der"), ("other.crt", "other.der")] {
        openssl(
            d,
            &[
                "ocsp",
                "-issuer",
                "ca.crt",
                "-cert",
                cert,
                "-reqout",
                "req.der",
                "-no_nonce",
            ],
        );
        openssl(
            d,
            &[
                "ocsp",
                "-index",
                "index.txt",
                "-rsigner",
                "ca.crt",
                "-rkey",
                "ca.key",
                "-CA",
                "ca.crt",
                "-reqin",
                "req.der",
                "-respout",
                out,
                "-ndays",
                "1",
            ],
        );
    }
    // an expired copy of the good response: every GeneralizedTime set to 2020 (the
    // signature no longer matches, which qweb does not check; the dates are what matter)
    let mut der = std::fs::read(d.join("good.der")).unwrap();
    let mut i = 0;
    while i + 17 <= der.len() {
        if der[i] == 0x18 && der[i + 1] == 15 && der[i + 16] == b'Z' {
            der[i + 2..i + 16].copy_from_slice(b"20200101000000");
            i += 17;
        } else {
            i += 1;
        }
    }
    std::fs::write(d.join("expired.der"), der).unwrap();
    std::fs::create_dir_all(d.join("site")).unwrap();
    std::fs::write(d.join("site/index.html"), "hello").unwrap();
    dir
}

fn serve(dir: &Path, ocsp: &str) -> (RunningServer, SocketAddr) {
    let d = dir.display();
    let text = format!(
        "workers = 1\nstate_dir = \"{d}/state\"\n[log]\naccess = false\n\
         [admin]\naddress = \"127.0.0.1:0\"\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\n[listener.tls]\n\
         certificates = [{{ cert = \"leaf.crt\", key = \"leaf.key\", ocsp = \"{ocsp}\" }}]\n\
         [[route]]\nprefix = \"/\"\nroot = \"site\"\n"
    );
    let file = dir.join("qweb.toml");
    std::fs::write(&file, &text).unwrap();
    let config = Config::from_file(&file).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let server = Server::start(config).unwrap();
    let addr = server.local_addrs()[0];
    (server, addr)
}

/// `openssl s_client -status`: the OCSP part of its output.
fn status(addr: SocketAddr, tls13: bool) -> String {
    let mut child = Command::new("openssl")
        .args(["s_client", "-status", "-connect", &addr.to_string()])
        .args(["-servername", "localhost", "-ign_eof"])
        .arg(if tls13 { "-tls1_3" } else { "-tls1_2" })
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("s_client did not finish");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(out.contains("hello"), "no answer:\n{out}");
    out
}

fn stapled(out: &str) -> bool {
    if out.contains("OCSP response: no response sent") {
        return false;
    }
    assert!(
        out.contains("OCSP Response Status: successful") && out.contains("Cert Status: good"),
        "{out}"
    );
    assert!(out.contains("Serial Number: 1234"), "{out}");
    true
}

fn metrics(server: &RunningServer) -> String {
    let mut s = std::net::TcpStream::connect(server.admin_addr().unwrap()).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn a_good_response_file_is_stapled_on_tls12_and_tls13() {
    let dir = pki();
    let (server, addr) = serve(dir.path(), "good.der");
    for tls13 in [false, true] {
        assert!(stapled(&status(addr, tls13)), "tls13={tls13}");
    }
    let m = metrics(&server);
    assert!(
        m.contains("qweb_tls_ocsp_staple_age_seconds{"),
        "no staple age:\n{m}"
    );
    assert!(
        m.lines()
            .any(|l| l.starts_with("qweb_tls_ocsp_failures_total{") && l.ends_with("} 0")),
        "{m}"
    );
    server.shutdown();
}

#[test]
fn expired_and_foreign_responses_are_never_stapled_and_a_new_file_is_picked_up() {
    let dir = pki();
    let d = dir.path();
    std::fs::copy(d.join("expired.der"), d.join("live.der")).unwrap();
    let (server, addr) = serve(d, "live.der");
    for tls13 in [false, true] {
        assert!(
            !stapled(&status(addr, tls13)),
            "expired stapled, tls13={tls13}"
        );
    }
    let m = metrics(&server);
    assert!(!m.contains("qweb_tls_ocsp_staple_age_seconds{"), "{m}");
    assert!(
        m.contains("cert=\"localhost\"} 1"),
        "one failure counted:\n{m}"
    );
    // a response for another certificate (same issuer) is refused too
    std::fs::copy(d.join("other.der"), d.join("live.der")).unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    assert!(!stapled(&status(addr, true)), "foreign response stapled");
    // a good one is picked up while running
    std::fs::copy(d.join("good.der"), d.join("live.der")).unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    assert!(stapled(&status(addr, false)));
    // and a bad file after it does not remove the good staple
    std::fs::write(d.join("live.der"), b"not DER").unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    assert!(stapled(&status(addr, true)));
    server.shutdown();
}
