//! Fleet-wide session ticket keys from a real `qweb keyserver` process: two qweb servers
//! (separate `Server`s, each with its own ticketer, as two nodes) that take their keys from
//! it resume each other's tickets (`openssl s_client -sess_out` on one, `-sess_in` on the
//! other); one with local keys does not; with the key server killed, full handshakes go on
//! and tickets issued before keep resuming.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use qweb_server::{Config, RunningServer, Server};

const BIN: &str = env!("CARGO_BIN_EXE_qweb");

/// A certificate for localhost, a key for the key server, a site.
fn setup() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let c = rcgen::CertificateParams::new(vec!["localhost".into()])
        .unwrap()
        .self_signed(&kp)
        .unwrap();
    std::fs::write(d.join("site.crt"), c.pem()).unwrap();
    std::fs::write(d.join("site.key"), kp.serialize_pem()).unwrap();
    std::fs::create_dir_all(d.join("site")).unwrap();
    std::fs::write(d.join("site/index.html"), "hello").unwrap();
    dir
}

/// A `qweb keyserver` child process on `<dir>/ks.sock`.
struct Keyserver(Child);

impl Keyserver {
    fn start(dir: &Path, rotation: &str) -> Keyserver {
        let cfg = format!(
            "keys = [\"site.key\"]\nthreads = 1\nticket_rotation = \"{rotation}\"\n[unix]\npath = \"ks.sock\"\n"
        );
        let file = dir.join("ks.toml");
        std::fs::write(&file, cfg).unwrap();
        let mut child = Command::new(BIN)
            .args(["keyserver", "--config"])
            .arg(&file)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut reader = BufReader::new(child.stderr.take().unwrap());
        let mut lines = Vec::new();
        loop {
            let mut l = String::new();
            if reader.read_line(&mut l).unwrap() == 0 {
                panic!("keyserver exited: {lines:?}");
            }
            let ready = l.contains("qweb keyserver: ready");
            lines.push(l);
            if ready {
                break;
            }
        }
        std::thread::spawn(move || for _ in reader.lines() {});
        Keyserver(child)
    }

    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Keyserver {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A qweb with one TLS listener; `fleet`: ticket keys from the key server.
fn serve(dir: &Path, name: &str, fleet: bool) -> (RunningServer, SocketAddr) {
    let d = dir.display();
    let (engine, keys) = if fleet {
        (
            format!("[offload.engines.ks]\nkind = \"keyserver\"\nservers = [\"unix:{d}/ks.sock\"]\ntimeout = \"1s\"\n"),
            "ticket_keys = \"keyserver:ks\"\n",
        )
    } else {
        (String::new(), "")
    };
    let text = format!(
        "workers = 1\nstate_dir = \"{d}/state-{name}\"\n[log]\naccess = false\n\
         [admin]\naddress = \"127.0.0.1:0\"\n{engine}\
         [[listener]]\naddress = \"127.0.0.1:0\"\n[listener.tls]\n\
         certificates = [{{ cert = \"{d}/site.crt\", key = \"{d}/site.key\" }}]\n\
         session_cache = 0\n{keys}\
         [[route]]\nprefix = \"/\"\nroot = \"{d}/site\"\n"
    );
    let file = dir.join(format!("{name}.toml"));
    std::fs::write(&file, &text).unwrap();
    let config = Config::from_file(&file).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let server = Server::start(config).unwrap();
    let addr = server.local_addrs()[0];
    (server, addr)
}

/// One `openssl s_client` connection (TLS 1.2 or 1.3) that sends a request and reads the
/// whole answer; true when the session was resumed.
fn s_client(addr: SocketAddr, tls13: bool, sess: &Path, save: bool) -> bool {
    let mut child = Command::new("openssl")
        .args(["s_client", "-connect", &addr.to_string()])
        .args(["-servername", "localhost", "-ign_eof"])
        .arg(if tls13 { "-tls1_3" } else { "-tls1_2" })
        .arg(if save { "-sess_out" } else { "-sess_in" })
        .arg(sess)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
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
    let v = if tls13 { "TLSv1.3" } else { "TLSv1.2" };
    if out.contains(&format!("Reused, {v}")) {
        true
    } else if out.contains(&format!("New, {v}")) {
        false
    } else {
        panic!("which handshake?\n{out}")
    }
}

fn metrics(server: &RunningServer) -> String {
    let mut s = std::net::TcpStream::connect(server.admin_addr().unwrap()).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn fetches(server: &RunningServer, result: &str) -> u64 {
    let m = metrics(server);
    m.lines()
        .find(|l| {
            l.starts_with("qweb_tls_ticket_key_fetches_total{")
                && l.contains(&format!("result=\"{result}\""))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no fetch counter in\n{m}"))
}

#[test]
fn a_ticket_from_node_a_resumes_on_node_b_through_the_key_server() {
    let dir = setup();
    let d = dir.path();
    // 10 s rotation: tickets are made in the first period and checked in the second
    let t0 = Instant::now();
    let _ks = Keyserver::start(d, "10s");
    let (a, a_addr) = serve(d, "a", true);
    let (b, b_addr) = serve(d, "b", true);
    let (c, c_addr) = serve(d, "c", false);
    for tls13 in [false, true] {
        let f = d.join(format!("{tls13}.sess"));
        assert!(!s_client(a_addr, tls13, &f, true));
        assert!(
            s_client(b_addr, tls13, &f, false),
            "tls13={tls13}: A's ticket on B"
        );
        assert!(
            !s_client(c_addr, tls13, &f, false),
            "tls13={tls13}: A's ticket on C (local keys)"
        );
    }
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "the machine is too slow for this test's timeline"
    );
    // past a rotation: the nodes switched keys together; the old tickets still resume
    // (previous key) and new ones are shared too
    std::thread::sleep(
        (t0 + Duration::from_millis(10_500)).saturating_duration_since(Instant::now()),
    );
    for tls13 in [false, true] {
        let f = d.join(format!("{tls13}.sess"));
        assert!(
            s_client(b_addr, tls13, &f, false),
            "tls13={tls13}: after rotation"
        );
        let g = d.join(format!("{tls13}-2.sess"));
        assert!(!s_client(b_addr, tls13, &g, true));
        assert!(
            s_client(a_addr, tls13, &g, false),
            "tls13={tls13}: B's new ticket on A"
        );
    }
    assert!(t0.elapsed() < Duration::from_secs(20));
    assert!(fetches(&a, "ok") >= 2, "{}", metrics(&a));
    assert_eq!(fetches(&a, "failed"), 0);
    a.shutdown();
    b.shutdown();
    c.shutdown();
}

#[test]
fn with_the_key_server_down_handshakes_go_on_and_old_tickets_resume() {
    let dir = setup();
    let d = dir.path();
    // 8 s rotation: the nodes ask every 2 s
    let mut ks = Keyserver::start(d, "8s");
    let (a, a_addr) = serve(d, "a", true);
    let (b, b_addr) = serve(d, "b", true);
    for tls13 in [false, true] {
        let f = d.join(format!("{tls13}.sess"));
        assert!(!s_client(a_addr, tls13, &f, true));
        assert!(s_client(b_addr, tls13, &f, false));
    }
    ks.kill();
    // wait for a failed refresh (at most 10 s)
    let started = Instant::now();
    while fetches(&a, "failed") == 0 && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(fetches(&a, "failed") >= 1, "{}", metrics(&a));
    for tls13 in [false, true] {
        // full handshakes still work
        let g = d.join(format!("{tls13}-down.sess"));
        assert!(!s_client(b_addr, tls13, &g, true));
        // and tickets from before (and from now) keep resuming across nodes
        let f = d.join(format!("{tls13}.sess"));
        assert!(
            s_client(b_addr, tls13, &f, false),
            "tls13={tls13}: old ticket"
        );
        assert!(
            s_client(a_addr, tls13, &g, false),
            "tls13={tls13}: new ticket"
        );
    }
    // a node that starts while the key server is down still serves (local keys)
    let (c, c_addr) = serve(d, "c", true);
    let h = d.join("c.sess");
    assert!(!s_client(c_addr, true, &h, true));
    assert!(s_client(c_addr, true, &h, false));
    a.shutdown();
    b.shutdown();
    c.shutdown();
}
