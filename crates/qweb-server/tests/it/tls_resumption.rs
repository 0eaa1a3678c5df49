//! TLS session resumption with a real client (`openssl s_client -sess_out` then `-sess_in`)
//! against real qweb servers on 127.0.0.1:0: tickets on TLS 1.2 and 1.3, `resumption =
//! false`, key rotation, and two servers (separate `Server`s, each its own ticketer, as two
//! processes would be) sharing a key file, or not.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use qweb_server::RunningServer;
use qweb_testkit::metrics;
use qweb_testkit::openssl::{SClient, TlsVersion as Tls};
use qweb_testkit::start_text;

/// A folder with a certificate for localhost, shared by the servers of a test.
fn pki() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let c = rcgen::CertificateParams::new(vec!["localhost".into()])
        .unwrap()
        .self_signed(&kp)
        .unwrap();
    std::fs::write(dir.path().join("site.crt"), c.pem()).unwrap();
    std::fs::write(dir.path().join("site.key"), kp.serialize_pem()).unwrap();
    std::fs::create_dir_all(dir.path().join("site")).unwrap();
    std::fs::write(dir.path().join("site/index.html"), "hello").unwrap();
    dir
}

/// Starts a server with one TLS listener; `tls` is added to its `[listener.tls]`.
fn serve(dir: &Path, name: &str, tls: &str) -> (RunningServer, SocketAddr) {
    let d = dir.display();
    let text = format!(
        "workers = 2\nstate_dir = \"{d}/state-{name}\"\n[log]\naccess = false\n\
         [admin]\naddress = \"127.0.0.1:0\"\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\n[listener.tls]\n\
         certificates = [{{ cert = \"{d}/site.crt\", key = \"{d}/site.key\" }}]\n{tls}\n\
         [[route]]\nprefix = \"/\"\nroot = \"{d}/site\"\n"
    );
    start_text(dir, name, &text)
}

/// One `openssl s_client` connection that sends a request and reads the whole answer
/// (TLS 1.3 tickets come after the handshake). True when the session was resumed.
fn s_client(addr: SocketAddr, v: Tls, sess: &Path, save: bool) -> bool {
    SClient::new(addr, v)
        .sess(sess, save)
        .run()
        .answered("hello")
        .resumed()
}

fn sess(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.sess"))
}

#[test]
fn tls12_tickets_and_tls13_resume_and_are_counted() {
    let dir = pki();
    // no session cache: TLS 1.2 can only resume with a ticket
    let (server, addr) = serve(dir.path(), "a", "session_cache = 0");
    for v in [Tls::V12, Tls::V13] {
        let f = sess(dir.path(), &format!("{v:?}"));
        assert!(
            !s_client(addr, v, &f, true),
            "{v:?}: first handshake is full"
        );
        assert!(s_client(addr, v, &f, false), "{v:?}: the ticket resumes");
        assert!(s_client(addr, v, &f, false), "{v:?}: and again");
    }
    let m = metrics::of(&server);
    let listener = addr.to_string();
    let handshakes = |version: &str, kind: &str| {
        let labels = [
            ("listener", listener.as_str()),
            ("version", version),
            ("kind", kind),
        ];
        m.value("qweb_tls_session_handshakes_total", &labels) as u64
    };
    assert_eq!(handshakes("1.2", "full"), 1, "{m}");
    assert_eq!(handshakes("1.2", "resumed"), 2);
    assert_eq!(handshakes("1.3", "full"), 1);
    assert_eq!(handshakes("1.3", "resumed"), 2);
    let age = m.value(
        "qweb_tls_ticket_key_age_seconds",
        &[("listener", listener.as_str())],
    );
    assert!(age < 60.0, "{age}");
    server.shutdown();
}

#[test]
fn resumption_off_means_every_handshake_is_full() {
    let dir = pki();
    let (server, addr) = serve(dir.path(), "a", "resumption = false");
    for v in [Tls::V12, Tls::V13] {
        let f = sess(dir.path(), &format!("{v:?}"));
        assert!(!s_client(addr, v, &f, true));
        // s_client writes no file when the server gave nothing to resume with
        if f.exists() {
            assert!(
                !s_client(addr, v, &f, false),
                "{v:?}: resumed with resumption off"
            );
        }
    }
    let m = metrics::of(&server);
    assert!(!m.text.contains("kind=\"resumed\"} 1"), "{m}");
    assert!(
        !m.text.contains("qweb_tls_ticket_key_age_seconds{"),
        "no ticketer: {m}"
    );
    server.shutdown();
}

/// Rotation every 3 s: a ticket issued in the first period resumes in the second (its key
/// is the previous one) and not in the third (its key is gone). TLS 1.2 has no ticket age
/// check, so there the key rotation alone decides.
#[test]
fn rotation_keeps_old_tickets_for_one_period_then_refuses_them() {
    let dir = pki();
    let t0 = Instant::now();
    let (server, addr) = serve(
        dir.path(),
        "a",
        "session_cache = 0\nticket_rotation = \"3s\"",
    );
    let until = |secs: f64| {
        let at = t0 + Duration::from_secs_f64(secs);
        if let Some(d) = at.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
    };
    for v in [Tls::V12, Tls::V13] {
        assert!(!s_client(
            addr,
            v,
            &sess(dir.path(), &format!("{v:?}")),
            true
        ));
    }
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "the machine is too slow for this test's timeline"
    );
    until(3.8);
    for v in [Tls::V12, Tls::V13] {
        assert!(
            s_client(addr, v, &sess(dir.path(), &format!("{v:?}")), false),
            "{v:?}: the previous key still decrypts"
        );
    }
    assert!(t0.elapsed() < Duration::from_secs(6));
    until(6.8);
    for v in [Tls::V12, Tls::V13] {
        assert!(
            !s_client(addr, v, &sess(dir.path(), &format!("{v:?}")), false),
            "{v:?}: a ticket two rotations old must not resume"
        );
    }
    server.shutdown();
}

fn key_file(path: &Path, fill: u8) {
    let mut k = vec![fill; 16];
    k.extend((0..64u8).map(|i| i ^ fill));
    std::fs::write(path, k).unwrap();
}

#[test]
fn two_servers_resume_each_others_tickets_with_a_shared_key_file_only() {
    let dir = pki();
    let d = dir.path();
    key_file(&d.join("a.bin"), 1);
    std::fs::copy(d.join("a.bin"), d.join("b.bin")).unwrap();
    let (a, a_addr) = serve(d, "a", "session_cache = 0\nticket_keys = \"a.bin\"");
    let (b, b_addr) = serve(d, "b", "session_cache = 0\nticket_keys = \"b.bin\"");
    let (c, c_addr) = serve(d, "c", "session_cache = 0");
    for v in [Tls::V12, Tls::V13] {
        let f = sess(d, &format!("{v:?}"));
        assert!(!s_client(a_addr, v, &f, true));
        assert!(s_client(b_addr, v, &f, false), "{v:?}: A's ticket on B");
        assert!(
            !s_client(c_addr, v, &f, false),
            "{v:?}: A's ticket on C (own keys)"
        );
    }
    // A's key file changes: A's old tickets still resume there, its new ones are not B's
    key_file(&d.join("a.bin"), 2);
    std::thread::sleep(Duration::from_millis(2500));
    for v in [Tls::V12, Tls::V13] {
        let f = sess(d, &format!("{v:?}"));
        assert!(
            s_client(a_addr, v, &f, false),
            "{v:?}: replaced key still decrypts"
        );
        let g = sess(d, &format!("{v:?}-new"));
        assert!(!s_client(a_addr, v, &g, true));
        assert!(
            !s_client(b_addr, v, &g, false),
            "{v:?}: B does not know A's new key"
        );
    }
    // a broken file is logged and the keys in use stay
    std::fs::write(d.join("a.bin"), b"short").unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    let g = sess(d, "V12-new");
    assert!(s_client(a_addr, Tls::V12, &g, false));
    a.shutdown();
    b.shutdown();
    c.shutdown();
}
