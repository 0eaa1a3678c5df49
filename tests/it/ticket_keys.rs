//! Fleet-wide session ticket keys from a real `qweb keyserver` process: two qweb servers
//! (separate `Server`s, each with its own ticketer, as two nodes) that take their keys from
//! it resume each other's tickets (`openssl s_client -sess_out` on one, `-sess_in` on the
//! other); one with local keys does not; with the key server killed, full handshakes go on
//! and tickets issued before keep resuming, for two of the key server's periods at most.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use qweb_server::RunningServer;
use qweb_testkit::metrics;
use qweb_testkit::openssl::{SClient, TlsVersion};
use qweb_testkit::process::{Qweb, KEYSERVER_READY};
use qweb_testkit::start_text;

const BIN: &str = env!("CARGO_BIN_EXE_qweb");

/// A certificate for localhost, a key for the key server, a site.
pub(crate) fn setup() -> tempfile::TempDir {
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

/// A `qweb keyserver` child process on `<dir>/ks.sock` (killed when dropped).
struct Keyserver(Qweb);

impl Keyserver {
    fn start(dir: &Path, rotation: &str) -> Keyserver {
        let cfg = format!(
            "keys = [\"site.key\"]\nthreads = 1\nticket_rotation = \"{rotation}\"\n[unix]\npath = \"ks.sock\"\n"
        );
        let file = dir.join("ks.toml");
        std::fs::write(&file, cfg).unwrap();
        let mut cmd = Command::new(BIN);
        cmd.args(["keyserver", "--config"])
            .arg(&file)
            .stdout(Stdio::null());
        Keyserver(Qweb::spawn(cmd, KEYSERVER_READY))
    }

    fn kill(&mut self) {
        self.0.kill();
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
    start_text(dir, name, &text)
}

/// One `openssl s_client` connection (TLS 1.2 or 1.3) that sends a request and reads the
/// whole answer; true when the session was resumed.
pub(crate) fn s_client(addr: SocketAddr, tls13: bool, sess: &Path, save: bool) -> bool {
    let v = if tls13 {
        TlsVersion::V13
    } else {
        TlsVersion::V12
    };
    SClient::new(addr, v)
        .sess(sess, save)
        .run()
        .answered("hello")
        .resumed()
}

/// For TLS 1.2 and 1.3: the tickets saved in `dir` as `{tls13}{tag}.sess` offered to each
/// node of `on`, `(node, whether it must resume them, what is checked)`.
pub(crate) fn offer(dir: &Path, tag: &str, on: &[(SocketAddr, bool, &str)]) {
    for tls13 in [false, true] {
        let f = dir.join(format!("{tls13}{tag}.sess"));
        for &(node, resumes, what) in on {
            assert_eq!(
                s_client(node, tls13, &f, false),
                resumes,
                "tls13={tls13}: {what}"
            );
        }
    }
}

/// For TLS 1.2 and 1.3: a full handshake with `from`, its ticket saved in `dir` as
/// `{tls13}{tag}.sess`, then [`offer`]ed to `on`.
pub(crate) fn issue(dir: &Path, from: SocketAddr, tag: &str, on: &[(SocketAddr, bool, &str)]) {
    for tls13 in [false, true] {
        let f = dir.join(format!("{tls13}{tag}.sess"));
        assert!(
            !s_client(from, tls13, &f, true),
            "tls13={tls13}: a first handshake resumed"
        );
    }
    offer(dir, tag, on);
}

/// Two nodes sharing keys that rotate every `period` (from `t0`, tickets saved in `dir` by
/// the first period as `{tls13}.sess`): past the rotation the old tickets still resume on
/// `b` (the previous key), and a new ticket from `b` resumes on `a`.
pub(crate) fn shared_after_rotation(
    dir: &Path,
    t0: Instant,
    period: Duration,
    b: SocketAddr,
    a: SocketAddr,
) {
    assert!(
        t0.elapsed() < period,
        "the machine is too slow for this test's timeline"
    );
    std::thread::sleep(
        (t0 + period + Duration::from_millis(1_000)).saturating_duration_since(Instant::now()),
    );
    offer(dir, "", &[(b, true, "after rotation")]);
    issue(dir, b, "-2", &[(a, true, "B's new ticket on A")]);
}

pub(crate) fn fetches(server: &RunningServer, result: &str) -> u64 {
    let m = metrics::of(server);
    let v = m
        .matching("qweb_tls_ticket_key_fetches_total", &[("result", result)])
        .next()
        .unwrap_or_else(|| panic!("no fetch counter in\n{m}"))
        .value;
    v as u64
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
    let on = [
        (b_addr, true, "A's ticket on B"),
        (c_addr, false, "A's ticket on C (local keys)"),
    ];
    issue(d, a_addr, "", &on);
    // past a rotation: the nodes switched keys together; the old tickets still resume
    // (previous key) and new ones are shared too
    shared_after_rotation(d, t0, Duration::from_secs(10), b_addr, a_addr);
    assert!(t0.elapsed() < Duration::from_secs(20));
    assert!(fetches(&a, "ok") >= 2, "{}", metrics::of(&a));
    assert_eq!(fetches(&a, "failed"), 0);
    a.shutdown();
    b.shutdown();
    c.shutdown();
}

#[test]
fn with_the_key_server_down_handshakes_go_on_and_old_tickets_resume() {
    let dir = setup();
    let d = dir.path();
    // 20 s rotation: the nodes ask every 5 s, and the first key decrypts for 40 s (two
    // periods), longer than this test runs
    let mut ks = Keyserver::start(d, "20s");
    let (a, a_addr) = serve(d, "a", true);
    let (b, b_addr) = serve(d, "b", true);
    issue(d, a_addr, "", &[(b_addr, true, "A's ticket on B")]);
    ks.kill();
    // wait for a failed refresh (at most 10 s)
    let started = Instant::now();
    while fetches(&a, "failed") == 0 && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(fetches(&a, "failed") >= 1, "{}", metrics::of(&a));
    // full handshakes still work, and tickets from before (and from now) keep resuming
    // across nodes
    issue(d, b_addr, "-down", &[(a_addr, true, "new ticket")]);
    offer(d, "", &[(b_addr, true, "old ticket")]);
    // a node that starts while the key server is down still serves (local keys)
    let (c, c_addr) = serve(d, "c", true);
    let h = d.join("c.sess");
    assert!(!s_client(c_addr, true, &h, true));
    assert!(s_client(c_addr, true, &h, false));
    a.shutdown();
    b.shutdown();
    c.shutdown();
}

/// Fleet keys age out without the key server: a ticket stops resuming once its key is older
/// than two of the key server's periods (current, then previous), even though no newer key
/// arrives; the node then encrypts with keys of its own (resumption on this node goes on)
/// and full handshakes are unaffected.
#[test]
fn with_the_key_server_down_fleet_tickets_expire_after_two_periods() {
    let dir = setup();
    let d = dir.path();
    // 2 s periods: a ticket's key is at most 2 s old when the ticket is issued, so it is
    // retired at most 4 s after it; the listener's own `ticket_rotation` (12 h) makes the
    // lifetime hint a day, so s_client still offers the tickets
    let mut ks = Keyserver::start(d, "2s");
    let (a, a_addr) = serve(d, "a", true);
    let issued = Instant::now();
    issue(d, a_addr, "", &[(a_addr, true, "fresh")]);
    ks.kill();
    std::thread::sleep(
        (issued + Duration::from_millis(5_000)).saturating_duration_since(Instant::now()),
    );
    offer(d, "", &[(a_addr, false, "a ticket older than two periods")]);
    // still serving: full handshakes, and their tickets resume here
    issue(d, a_addr, "-local", &[(a_addr, true, "new")]);
    assert!(fetches(&a, "failed") >= 1, "{}", metrics::of(&a));
    a.shutdown();
}

/// `qweb serve` (the real binary) whose TLS listener signs on the key server (no key file)
/// and takes its ticket keys from it; `shutdown_timeout` 30 s.
fn serve_process(dir: &Path, name: &str) -> Qweb {
    let d = dir.display();
    let text = format!(
        "workers = 2\nshutdown_timeout = \"30s\"\nstate_dir = \"{d}/state-{name}\"\n\
         [admin]\naddress = \"127.0.0.1:0\"\n[log]\naccess = false\n\
         [offload.engines.ks]\nkind = \"keyserver\"\nservers = [\"unix:{d}/ks.sock\"]\ntimeout = \"1s\"\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\n[listener.tls]\n\
         certificates = [{{ cert = \"{d}/site.crt\" }}]\n\
         session_cache = 0\nticket_keys = \"keyserver:ks\"\n\
         [listener.offload]\nengine = \"ks\"\nmode = \"async\"\ntimeout = \"1s\"\n\
         [[route]]\nprefix = \"/\"\nroot = \"{d}/site\"\n"
    );
    let file = qweb_testkit::process::write_file(dir, &format!("{name}.toml"), &text);
    Qweb::serve(BIN, &file)
}

/// SIGTERM to `q`, which must exit successfully within `within` (`what`: the round, for
/// the messages).
pub(crate) fn sigterm_exits_within(q: &mut Qweb, what: &str, within: Duration) {
    let started = Instant::now();
    q.signal(libc::SIGTERM);
    let status = q.wait_exit(Duration::from_secs(40));
    let took = started.elapsed();
    eprintln!("{what}: SIGTERM to exit {took:?}");
    assert!(status.success(), "{what}: {status:?}: {:#?}", q.lines());
    assert!(
        took < within,
        "{what}: SIGTERM took {took:?}: {:#?}",
        q.lines()
    );
}

/// SIGTERM with the key server gone (killed, or stopped with SIGSTOP) and nothing in
/// flight: qweb exits at once, not after `shutdown_timeout` (30 s here). Nothing waits on
/// the dead key server: not the engine's reconnecting connections, not the ticket-key
/// refresher (which has failed at least once by then), not a handshake that failed on it.
#[test]
fn sigterm_with_the_key_server_gone_exits_at_once() {
    let dir = setup();
    let d = dir.path();
    for (round, how) in [libc::SIGKILL, libc::SIGSTOP].into_iter().enumerate() {
        // 4 s rotation: the refresher asks every second
        let ks = Keyserver::start(d, "4s");
        let mut q = serve_process(d, &format!("p{round}"));
        let addr: SocketAddr = q.addr("https").parse().unwrap();
        // a full handshake, signed by the key server
        let f = d.join(format!("p{round}.sess"));
        assert!(!s_client(addr, true, &f, true));
        ks.0.signal(how);
        q.wait_for_within(
            "ticket keys: no key server answers",
            1,
            Duration::from_secs(10),
        );
        // a handshake that needs the key server now fails (no key here), and ends
        let run = SClient::new(addr, TlsVersion::V13)
            .sess(&d.join(format!("p{round}-down.sess")), true)
            .run();
        assert!(!run.stdout.contains("hello"), "{}", run.stdout);
        sigterm_exits_within(&mut q, &format!("signal {how}"), Duration::from_secs(3));
        drop(ks); // SIGKILL (also for a stopped process)
    }
}
