//! A qweb out of file descriptors still answers: `qweb serve` in a child process with
//! `RLIMIT_NOFILE` = 64, its fds taken by idle connections; a new plain connection gets a 503
//! (or a prompt close), a new TLS connection a prompt close, `/metrics` on the admin listener
//! is served, and the process does not spin; once fds are free again, requests are served.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_qweb");
const LIMIT: u64 = 64;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Qweb(Child);

impl Drop for Qweb {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn fds_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// User plus system CPU time of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // fields after the command name (which ends with the last ')'): utime is the 12th
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

fn start(dir: &Path) -> (Qweb, u16, u16, u16) {
    let (plain, tls, admin) = (free_port(), free_port(), free_port());
    let d = dir.display();
    std::fs::create_dir_all(dir.join("site")).unwrap();
    std::fs::write(dir.join("site/index.html"), "hello").unwrap();
    let config = format!(
        "workers = 1\nstate_dir = \"{d}/state\"\n\
         [admin]\naddress = \"127.0.0.1:{admin}\"\n\
         [limits]\nheader_read_timeout = \"60s\"\nkeepalive_timeout = \"60s\"\n\
         [[listener]]\naddress = \"127.0.0.1:{plain}\"\n\
         [[listener]]\naddress = \"127.0.0.1:{tls}\"\n[listener.tls]\nself_signed = true\n\
         [[route]]\nprefix = \"/\"\nroot = \"{d}/site\"\n"
    );
    std::fs::write(dir.join("qweb.toml"), config).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--config"])
        .arg(dir.join("qweb.toml"))
        .env_remove("RUST_LOG")
        .env_remove("NOTIFY_SOCKET")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: setrlimit is async-signal-safe; it only changes the child's own limit.
    unsafe {
        cmd.pre_exec(|| {
            let r = libc::rlimit {
                rlim_cur: LIMIT,
                rlim_max: LIMIT,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &r) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let mut reader = BufReader::new(child.stderr.take().unwrap());
    let mut seen = Vec::new();
    loop {
        let mut l = String::new();
        if reader.read_line(&mut l).unwrap() == 0 {
            panic!("qweb exited early: {seen:?}");
        }
        let done = l.contains("worker(s)");
        seen.push(l);
        if done {
            break;
        }
    }
    // keep reading its log (a full pipe would block it)
    std::thread::spawn(move || {
        for l in reader.lines().map_while(Result::ok) {
            eprintln!("qweb: {l}");
        }
    });
    (Qweb(child), plain, tls, admin)
}

/// Sends `request` on a new connection to `port` and reads until the server closes or
/// `within` passed: (what came, whether the server ended the connection).
fn exchange(port: u16, request: &[u8], within: Duration) -> (Vec<u8>, bool) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(within)).unwrap();
    let _ = s.write_all(request);
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (out, true),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                return (out, false)
            }
            // reset: ended too
            Err(_) => return (out, true),
        }
    }
}

const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";

#[test]
fn a_worker_out_of_fds_still_answers_and_metrics_still_work() {
    let dir = tempfile::tempdir().unwrap();
    let (q, plain, tls, admin) = start(dir.path());
    let pid = q.0.id();
    // idle connections until qweb has no fd left (and some more, waiting in the backlog)
    let mut held = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while fds_of(pid) < LIMIT as usize {
        assert!(Instant::now() < deadline, "qweb at {} fds", fds_of(pid));
        for _ in 0..4 {
            held.push(TcpStream::connect(("127.0.0.1", plain)).unwrap());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for _ in 0..8 {
        held.push(TcpStream::connect(("127.0.0.1", plain)).unwrap());
    }
    eprintln!(
        "qweb at {} fds with {} connections open",
        fds_of(pid),
        held.len()
    );

    // a new plain connection: 503, or at least closed at once (not left in the backlog)
    let (got, ended) = exchange(plain, GET, Duration::from_secs(5));
    let text = String::from_utf8_lossy(&got);
    eprintln!("plain, out of fds: {text:?} (ended: {ended})");
    assert!(
        ended,
        "a connection to a worker out of fds was left hanging"
    );
    assert!(got.is_empty() || text.starts_with("HTTP/1.1 503"), "{text}");
    // usually the 503 itself: try a few times for it (a request that arrives after the
    // answer is closed with a reset, which may lose the answer)
    let got_503 = (0..5).any(|_| {
        let (got, _) = exchange(plain, GET, Duration::from_secs(5));
        got.starts_with(b"HTTP/1.1 503")
    });
    assert!(got_503, "no 503 in 5 tries");

    // a TLS connection: closed at once (a ClientHello gets no answer but the close)
    let (_, ended) = exchange(tls, b"\x16\x03\x01\x00\x05hello", Duration::from_secs(5));
    assert!(
        ended,
        "a TLS connection to a worker out of fds was left hanging"
    );

    // the admin listener still serves /metrics
    let (got, ended) = exchange(
        admin,
        b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    );
    let text = String::from_utf8_lossy(&got);
    assert!(ended && text.starts_with("HTTP/1.1 200"), "{text:?}");
    assert!(text.contains("qweb_"), "{text}");

    // out of fds, qweb does not spin: less than a quarter of a CPU over a second
    let before = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(1));
    let ticks = cpu_ticks(pid) - before;
    // SAFETY: sysconf with a valid name.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    assert!(
        ticks * 4 < hz,
        "{ticks} ticks of CPU in a second (at {hz} a second)"
    );

    // fds free again: served as usual
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (got, _) = exchange(plain, GET, Duration::from_secs(5));
        if got.starts_with(b"HTTP/1.1 200") {
            assert!(got.ends_with(b"hello"));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{:?}",
            String::from_utf8_lossy(&got)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
