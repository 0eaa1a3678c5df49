//! TLS resumption across a reload, through the real binary and a real client (`openssl
//! s_client -sess_out`, then `kill -HUP`, then `-sess_in`): a reload that leaves the
//! listener's resumption settings alone keeps its ticket keys (TLS 1.3 tickets) and its TLS
//! 1.2 session cache (session ids); one that changes them starts afresh.

use std::path::{Path, PathBuf};

use qweb_testkit::free_port;
use qweb_testkit::openssl::{SClient, TlsVersion, GET_ROOT};
use qweb_testkit::process::Qweb;

const BIN: &str = env!("CARGO_BIN_EXE_qweb");

fn pki(dir: &Path) {
    let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let c = rcgen::CertificateParams::new(vec!["localhost".into()])
        .unwrap()
        .self_signed(&kp)
        .unwrap();
    std::fs::write(dir.join("site.crt"), c.pem()).unwrap();
    std::fs::write(dir.join("site.key"), kp.serialize_pem()).unwrap();
    std::fs::create_dir_all(dir.join("site")).unwrap();
    std::fs::write(dir.join("site/index.html"), "hello").unwrap();
}

fn write_config(dir: &Path, port: u16, session: &str) -> PathBuf {
    let d = dir.display();
    let file = dir.join("qweb.toml");
    std::fs::write(
        &file,
        format!(
            "workers = 2\nstate_dir = \"{d}/state\"\n[log]\naccess = false\n\
             [[listener]]\naddress = \"127.0.0.1:{port}\"\n[listener.tls]\n\
             certificates = [{{ cert = \"{d}/site.crt\", key = \"{d}/site.key\" }}]\n{session}\n\
             [[route]]\nprefix = \"/\"\nroot = \"{d}/site\"\n"
        ),
    )
    .unwrap();
    file
}

/// `kill -HUP`, then waits for the reload's `n`th confirmation.
fn reload(q: &Qweb, n: usize) {
    q.signal(libc::SIGHUP);
    q.wait_for("configuration reloaded", n);
}

/// One `openssl s_client` connection (a request, the whole answer: TLS 1.3 tickets come
/// after the handshake); true when the session was resumed. `args`: the version and
/// `-no_ticket` (TLS 1.2 session ids).
fn s_client(port: u16, (version, no_ticket): (TlsVersion, bool), sess: &Path, save: bool) -> bool {
    let mut c = SClient::new(([127, 0, 0, 1], port).into(), version).sess(sess, save);
    if no_ticket {
        c = c.arg("-no_ticket");
    }
    let run = c.request(GET_ROOT).run();
    run.answered("hello");
    run.resumed()
}

const TLS13: (TlsVersion, bool) = (TlsVersion::V13, false);
/// TLS 1.2 with no ticket: resumes only from the server's session cache.
const TLS12_ID: (TlsVersion, bool) = (TlsVersion::V12, true);

#[test]
fn a_reload_keeps_ticket_keys_and_the_session_cache() {
    let dir = tempfile::tempdir().unwrap();
    pki(dir.path());
    let port = free_port();
    let config = write_config(dir.path(), port, "");
    let q = Qweb::serve(BIN, &config);
    let t13 = dir.path().join("t13.sess");
    let id12 = dir.path().join("id12.sess");
    assert!(!s_client(port, TLS13, &t13, true), "first: full");
    assert!(!s_client(port, TLS12_ID, &id12, true), "first: full");
    // before any reload: both resume
    assert!(s_client(port, TLS13, &t13, false), "1.3 ticket, no reload");
    assert!(s_client(port, TLS12_ID, &id12, false), "1.2 id, no reload");

    reload(&q, 1);
    assert!(
        s_client(port, TLS13, &t13, false),
        "1.3 ticket after a reload"
    );
    assert!(
        s_client(port, TLS12_ID, &id12, false),
        "1.2 id after a reload"
    );
    reload(&q, 2);
    assert!(s_client(port, TLS13, &t13, false), "1.3 ticket after two");
    assert!(s_client(port, TLS12_ID, &id12, false), "1.2 id after two");

    // other resumption settings: new keys, a new cache
    write_config(dir.path(), port, "session_cache = 500");
    reload(&q, 3);
    assert!(
        !s_client(port, TLS13, &t13, false),
        "1.3 ticket, settings changed"
    );
    assert!(
        !s_client(port, TLS12_ID, &id12, false),
        "1.2 id, settings changed"
    );
}
