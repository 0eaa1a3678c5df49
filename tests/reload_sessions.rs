//! TLS resumption across a reload, through the real binary and a real client (`openssl
//! s_client -sess_out`, then `kill -HUP`, then `-sess_in`): a reload that leaves the
//! listener's resumption settings alone keeps its ticket keys (TLS 1.3 tickets) and its TLS
//! 1.2 session cache (session ids); one that changes them starts afresh.
#![allow(unsafe_code)] // kill(2) on the test's own child; the block has its SAFETY note

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_qweb");

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

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

struct Qweb {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Qweb {
    fn start(config: &Path) -> Qweb {
        let mut child = Command::new(BIN)
            .args(["serve", "--config"])
            .arg(config)
            .env_remove("RUST_LOG")
            .env_remove("NOTIFY_SOCKET")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let reader = BufReader::new(child.stderr.take().unwrap());
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for l in reader.lines().map_while(Result::ok) {
                sink.lock().unwrap().push(l);
            }
        });
        let q = Qweb { child, lines };
        q.wait_for("worker(s)", 1);
        q
    }

    fn wait_for(&self, needle: &str, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self
            .lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
            < n
        {
            assert!(
                Instant::now() < deadline,
                "no {needle:?} #{n} in {:#?}",
                self.lines.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `kill -HUP`, then waits for the reload's `n`th confirmation.
    fn reload(&self, n: usize) {
        // SAFETY: kill(2) with the pid of our own child and a valid signal number.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGHUP) };
        assert_eq!(rc, 0);
        self.wait_for("configuration reloaded", n);
    }
}

impl Drop for Qweb {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One `openssl s_client` connection (a request, the whole answer: TLS 1.3 tickets come
/// after the handshake); true when the session was resumed. `args`: the version and
/// `-no_ticket` (TLS 1.2 session ids).
fn s_client(port: u16, args: &[&str], sess: &Path, save: bool) -> bool {
    let mut child = Command::new("openssl")
        .args(["s_client", "-connect", &format!("127.0.0.1:{port}")])
        .args(["-servername", "localhost", "-ign_eof"])
        .args(args)
        .arg(if save { "-sess_out" } else { "-sess_in" })
        .arg(sess)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl is installed");
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
    if out.contains("Reused, TLSv1.") {
        true
    } else if out.contains("New, TLSv1.") {
        false
    } else {
        panic!("which handshake?\n{out}")
    }
}

const TLS13: &[&str] = &["-tls1_3"];
/// TLS 1.2 with no ticket: resumes only from the server's session cache.
const TLS12_ID: &[&str] = &["-tls1_2", "-no_ticket"];

#[test]
fn a_reload_keeps_ticket_keys_and_the_session_cache() {
    let dir = tempfile::tempdir().unwrap();
    pki(dir.path());
    let port = free_port();
    let config = write_config(dir.path(), port, "");
    let q = Qweb::start(&config);
    let t13 = dir.path().join("t13.sess");
    let id12 = dir.path().join("id12.sess");
    assert!(!s_client(port, TLS13, &t13, true), "first: full");
    assert!(!s_client(port, TLS12_ID, &id12, true), "first: full");
    // before any reload: both resume
    assert!(s_client(port, TLS13, &t13, false), "1.3 ticket, no reload");
    assert!(s_client(port, TLS12_ID, &id12, false), "1.2 id, no reload");

    q.reload(1);
    assert!(
        s_client(port, TLS13, &t13, false),
        "1.3 ticket after a reload"
    );
    assert!(
        s_client(port, TLS12_ID, &id12, false),
        "1.2 id after a reload"
    );
    q.reload(2);
    assert!(s_client(port, TLS13, &t13, false), "1.3 ticket after two");
    assert!(s_client(port, TLS12_ID, &id12, false), "1.2 id after two");

    // other resumption settings: new keys, a new cache
    write_config(dir.path(), port, "session_cache = 500");
    q.reload(3);
    assert!(
        !s_client(port, TLS13, &t13, false),
        "1.3 ticket, settings changed"
    );
    assert!(
        !s_client(port, TLS12_ID, &id12, false),
        "1.2 id, settings changed"
    );
}
