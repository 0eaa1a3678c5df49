//! OCSP stapling from a file, seen by a real client (`openssl s_client -status`), with the
//! PKI and the responses made by the `openssl` command (`openssl ocsp` answering from an
//! index file): a good response is stapled on TLS 1.2 and 1.3; an expired one, or one for
//! another certificate, never is (the server serves without a staple); a new file is picked
//! up while running. A site's certificate staples the same way.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use qweb_server::RunningServer;
use qweb_testkit::metrics;
use qweb_testkit::openssl::{SClient, TlsVersion};
use qweb_testkit::start_text;

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

/// A self-signed ECDSA certificate for `dflt.test` (`dflt.crt`, `dflt.key`): the listener's
/// own, when `localhost` is a site's.
fn dflt_cert(d: &Path) {
    openssl(
        d,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "dflt.key",
            "-out",
            "dflt.crt",
            "-subj",
            "/CN=dflt.test",
            "-addext",
            "subjectAltName=DNS:dflt.test",
            "-days",
            "5",
        ],
    );
}

/// Serves `dflt.crt` on the listener and `<name>.crt` (with `<name>.key`, stapling `ocsp`)
/// as the certificate of a site for `localhost`.
fn serve_site(dir: &Path, name: &str, ocsp: &str) -> (RunningServer, SocketAddr) {
    let d = dir.display();
    let text = format!(
        "workers = 1\nstate_dir = \"{d}/state-site-{name}\"\n[log]\naccess = false\n\
         [admin]\naddress = \"127.0.0.1:0\"\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\n[listener.tls]\n\
         certificates = [{{ cert = \"dflt.crt\", key = \"dflt.key\" }}]\n\
         [[route]]\nprefix = \"/\"\nroot = \"site\"\n\
         [[site]]\nserver_names = [\"localhost\"]\n\
         certificates = [{{ cert = \"{name}.crt\", key = \"{name}.key\", ocsp = \"{ocsp}\" }}]\n\
         [[site.route]]\nprefix = \"/\"\nroot = \"site\"\n"
    );
    start_text(
        dir,
        &format!("site-{name}-{}", ocsp.replace('.', "-")),
        &text,
    )
}

/// The listener's own name (`dflt.test`): its certificate has no staple.
fn dflt_unstapled(addr: SocketAddr) {
    for v in [TlsVersion::V12, TlsVersion::V13] {
        let run = SClient::new(addr, v)
            .servername("dflt.test")
            .arg("-status")
            .request(b"GET / HTTP/1.1\r\nHost: dflt.test\r\nConnection: close\r\n\r\n")
            .run();
        run.answered("hello");
        assert!(
            run.stdout.contains("subject=CN = dflt.test"),
            "{}",
            run.stdout
        );
        assert!(!stapled(&run.stdout), "{}", run.stdout);
    }
}

fn serve(dir: &Path, ocsp: &str) -> (RunningServer, SocketAddr) {
    serve_cert(dir, "leaf", ocsp)
}

/// Serves `<name>.crt` (with `<name>.key`).
fn serve_cert(dir: &Path, name: &str, ocsp: &str) -> (RunningServer, SocketAddr) {
    let d = dir.display();
    let text = format!(
        "workers = 1\nstate_dir = \"{d}/state-{name}\"\n[log]\naccess = false\n\
         [admin]\naddress = \"127.0.0.1:0\"\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\n[listener.tls]\n\
         certificates = [{{ cert = \"{name}.crt\", key = \"{name}.key\", ocsp = \"{ocsp}\" }}]\n\
         [[route]]\nprefix = \"/\"\nroot = \"site\"\n"
    );
    start_text(dir, &format!("{name}-{}", ocsp.replace('.', "-")), &text)
}

/// `openssl s_client -status`: the OCSP part of its output.
fn status(addr: SocketAddr, tls13: bool) -> String {
    let v = if tls13 {
        TlsVersion::V13
    } else {
        TlsVersion::V12
    };
    let run = SClient::new(addr, v).arg("-status").run();
    run.answered("hello");
    run.stdout
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

#[test]
fn a_good_response_file_is_stapled_on_tls12_and_tls13() {
    let dir = pki();
    let (server, addr) = serve(dir.path(), "good.der");
    for tls13 in [false, true] {
        assert!(stapled(&status(addr, tls13)), "tls13={tls13}");
    }
    let m = metrics::of(&server);
    assert!(
        m.text.contains("qweb_tls_ocsp_staple_age_seconds{"),
        "no staple age:\n{m}"
    );
    assert!(
        m.matching("qweb_tls_ocsp_failures_total", &[])
            .any(|s| !s.labels.is_empty() && s.value == 0.0),
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
    let m = metrics::of(&server);
    assert!(!m.text.contains("qweb_tls_ocsp_staple_age_seconds{"), "{m}");
    assert!(
        m.text.contains("cert=\"localhost\"} 1"),
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

/// A leaf for localhost (serial 0x1234 again, known to the index) whose Authority
/// Information Access names an OCSP responder on 127.0.0.1:`port`: `<name>.crt` holds the
/// leaf then the CA, `<name>.key` its key.
fn aia_leaf(d: &Path, port: u16, name: &str) {
    let key = format!("{name}.key");
    openssl(
        d,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            "aia.csr",
            "-subj",
            "/CN=localhost",
        ],
    );
    std::fs::write(
        d.join("aia.ext"),
        format!(
            "subjectAltName=DNS:localhost\nauthorityInfoAccess=OCSP;URI:http://127.0.0.1:{port}/\n"
        ),
    )
    .unwrap();
    openssl(
        d,
        &[
            "x509",
            "-req",
            "-in",
            "aia.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-set_serial",
            "0x1234",
            "-out",
            "aia-leaf.crt",
            "-days",
            "5",
            "-extfile",
            "aia.ext",
        ],
    );
    let mut chain = std::fs::read(d.join("aia-leaf.crt")).unwrap();
    chain.extend(std::fs::read(d.join("ca.crt")).unwrap());
    std::fs::write(d.join(format!("{name}.crt")), chain).unwrap();
}

fn wait_for(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let (limit, every) = (Duration::from_secs(secs), Duration::from_millis(250));
    qweb_testkit::poll_until(what, limit, every, || f().then_some(()));
}

/// `aia.crt` (see [`aia_leaf`]) and `openssl ocsp` answering for it on the port its AIA
/// names, listening when this returns.
fn responder_for_aia_leaf(d: &Path) -> std::process::Child {
    // below the kernel's range for client sockets: a port taken from `:0` is in it, and
    // another test's client socket took it before openssl bound it (seen in CI: "the
    // responder listens: not within 10s")
    let port = qweb_testkit::free_port();
    aia_leaf(d, port, "aia");
    let responder = Command::new("openssl")
        .args(["ocsp", "-index", "index.txt", "-port", &port.to_string()])
        .args([
            "-rsigner", "ca.crt", "-rkey", "ca.key", "-CA", "ca.crt", "-ndays", "1",
        ])
        .current_dir(d)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(d.join("responder.log")).unwrap())
        .spawn()
        .unwrap();
    // (a probe connection would hold the single-threaded responder: wait for its log line)
    wait_for("the responder listens", 10, || {
        std::fs::read_to_string(d.join("responder.log"))
            .is_ok_and(|l| l.contains("waiting for OCSP client connections"))
    });
    responder
}

fn failures(server: &RunningServer) -> u64 {
    let m = metrics::of(server);
    let v = m
        .matching("qweb_tls_ocsp_failures_total", &[])
        .next()
        .unwrap_or_else(|| panic!("{m}"))
        .value;
    v as u64
}

/// `ocsp = "fetch"` against `openssl ocsp` run as a local responder: stapled on both
/// versions; with the responder killed, a server that had a staple keeps it (valid for a
/// day) and a server that starts then serves without one, logs and counts the failures.
#[test]
fn fetched_from_a_local_openssl_responder_and_served_without_one_when_it_is_down() {
    let dir = pki();
    let d = dir.path();
    let mut responder = responder_for_aia_leaf(d);
    let (a, a_addr) = serve_cert(d, "aia", "fetch");
    wait_for("a fetched staple", 15, || stapled(&status(a_addr, false)));
    assert!(stapled(&status(a_addr, true)));
    assert_eq!(failures(&a), 0);
    let _ = responder.kill();
    let _ = responder.wait();
    let (b, b_addr) = serve_cert(d, "aia", "fetch");
    wait_for("a failed fetch counted", 10, || failures(&b) >= 1);
    for tls13 in [false, true] {
        assert!(!stapled(&status(b_addr, tls13)), "nothing to staple yet");
        assert!(
            stapled(&status(a_addr, tls13)),
            "the fetched staple stays while valid"
        );
    }
    a.shutdown();
    b.shutdown();
}

/// Responders that lie: an HTTP error, a 200 with garbage, a truncated answer, no head at
/// all. Nothing is stapled, every failure is counted, the server serves.
#[test]
fn lying_responders_are_counted_and_nothing_is_stapled() {
    let dir = pki();
    let d = dir.path();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    aia_leaf(d, port, "liar");
    let good = std::fs::read(d.join("good.der")).unwrap();
    let answers: Vec<Vec<u8>> = vec![
        b"HTTP/1.0 500 Internal Server Error\r\n\r\n".to_vec(),
        b"HTTP/1.0 200 OK\r\n\r\nnot an OCSP response".to_vec(),
        [&b"HTTP/1.0 200 OK\r\n\r\n"[..], &good[..good.len() / 2]].concat(),
        b"garbage without a head".to_vec(),
    ];
    std::thread::spawn(move || {
        let mut i = 0;
        for conn in listener.incoming() {
            let Ok(mut c) = conn else { continue };
            let mut buf = [0u8; 4096];
            let _ = c.read(&mut buf);
            let _ = c.write_all(&answers[i % answers.len()]);
            i += 1;
        }
    });
    let (server, addr) = serve_cert(d, "liar", "fetch");
    // the fetcher retries after 5 s: two failures within 12 s
    wait_for("failures counted", 12, || failures(&server) >= 2);
    for tls13 in [false, true] {
        assert!(!stapled(&status(addr, tls13)));
    }
    server.shutdown();
}

/// A site's certificate (chosen by SNI `localhost`, the listener holding another) staples
/// like a listener's: a response for another certificate is refused and counted, a good
/// file replacing it is picked up, TLS 1.2 and 1.3; the listener's own name gets none.
#[test]
fn a_site_certificate_staples_its_file_and_refuses_a_foreign_response() {
    let dir = pki();
    let d = dir.path();
    dflt_cert(d);
    std::fs::copy(d.join("other.der"), d.join("site.der")).unwrap();
    let (server, addr) = serve_site(d, "leaf", "site.der");
    for tls13 in [false, true] {
        assert!(!stapled(&status(addr, tls13)), "foreign, tls13={tls13}");
    }
    assert!(
        metrics::of(&server).text.contains("cert=\"localhost\"} 1"),
        "the foreign response is counted:\n{}",
        metrics::of(&server)
    );
    std::fs::copy(d.join("good.der"), d.join("site.der")).unwrap();
    wait_for("the good file picked up", 10, || {
        stapled(&status(addr, false))
    });
    assert!(stapled(&status(addr, true)));
    dflt_unstapled(addr);
    server.shutdown();
}

/// `ocsp = "fetch"` on a site's certificate: asked of the certificate's own responder (a
/// local `openssl ocsp`) and stapled for the site's name.
#[test]
fn a_site_certificate_fetches_its_staple() {
    let dir = pki();
    let d = dir.path();
    dflt_cert(d);
    let mut responder = responder_for_aia_leaf(d);
    let (server, addr) = serve_site(d, "aia", "fetch");
    wait_for("a fetched staple", 15, || stapled(&status(addr, false)));
    assert!(stapled(&status(addr, true)));
    assert_eq!(failures(&server), 0);
    dflt_unstapled(addr);
    let _ = responder.kill();
    let _ = responder.wait();
    server.shutdown();
}

/// A certificate ordered by ACME that names an OCSP responder is stapled like
/// `ocsp = "fetch"`: here a certificate already saved in the ACME store (its CA is not
/// reachable, and not needed: the certificate is not due) is served at start, with the
/// staple `openssl ocsp` answers.
#[test]
fn an_acme_certificate_naming_a_responder_is_stapled() {
    let dir = pki();
    let d = dir.path();
    let mut responder = responder_for_aia_leaf(d);
    let text = format!(
        "workers = 1\nstate_dir = \"{}/state-acme\"\n[log]\naccess = false\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\ntls = {{}}\n\
         [[site]]\nserver_names = [\"localhost\"]\n\
         acme = {{ directory = \"https://acme.invalid/directory\", retry_after = \"1h\" }}\n\
         [[site.route]]\nprefix = \"/\"\nroot = \"site\"\n",
        d.display()
    );
    // a first start makes the store's folder for that CA (its order fails at once)
    let (first, _) = start_text(d, "acme-first", &text);
    let store = d.join("state-acme/acme");
    wait_for("the ACME store", 10, || {
        std::fs::read_dir(&store).is_ok_and(|mut e| e.next().is_some())
    });
    first.shutdown();
    let folder = std::fs::read_dir(&store)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let chain = std::fs::read_to_string(d.join("aia.crt")).unwrap();
    let key = std::fs::read_to_string(d.join("aia.key")).unwrap();
    std::fs::write(folder.join("localhost.pem"), format!("{chain}{key}")).unwrap();
    let (server, addr) = start_text(d, "acme-saved", &text);
    wait_for("a fetched staple on the ACME certificate", 15, || {
        stapled(&status(addr, false))
    });
    assert!(stapled(&status(addr, true)));
    server.shutdown();
    let _ = responder.kill();
    let _ = responder.wait();
}
