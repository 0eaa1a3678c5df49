//! A real `redis-server` for the fleet tests (Debian's `/usr/bin/redis-server`, or the one on
//! `PATH`): started on a free port without persistence, killed when dropped; and a store
//! that accepts connections but never answers.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The `redis-server` binary: `/usr/bin/redis-server` when it exists, else from `PATH`.
pub fn binary() -> String {
    if std::path::Path::new("/usr/bin/redis-server").exists() {
        "/usr/bin/redis-server".into()
    } else {
        "redis-server".into()
    }
}

/// A running `redis-server` (killed when dropped).
pub struct RedisServer {
    /// Its port on 127.0.0.1.
    pub port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts `redis-server` on a free port (below 32768), waits until it answers PING.
    pub fn start() -> RedisServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut r = RedisServer {
            port: crate::free_port(),
            child: None,
            dir,
        };
        r.spawn();
        r
    }

    fn spawn(&mut self) {
        let child = Command::new(binary())
            .args(["--save", "", "--appendonly", "no", "--bind", "127.0.0.1"])
            .args(["--port", &self.port.to_string()])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server (apt-get install redis-server)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.try_command(&["PING"]).is_some_and(|r| r == "+PONG") {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server on port {} did not answer PING", self.port);
    }

    /// `redis://127.0.0.1:PORT/0`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Kills it with SIGKILL (no goodbye to its clients but the kernel's).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops it with SIGSTOP: its connections stay open, nothing answers on them.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets it go on after [`RedisServer::pause`] (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            let ok = Command::new("kill")
                .arg(sig)
                .arg(c.id().to_string())
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "kill {sig} redis-server");
        }
    }

    /// Starts it again on the same port (after [`RedisServer::kill`]).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Runs one command and returns its reply's first line (`+OK`, `:1`, `$-1`, a bulk
    /// string's text), panicking when the server does not answer.
    pub fn command(&self, args: &[&str]) -> String {
        self.try_command(args)
            .unwrap_or_else(|| panic!("redis-server on port {} did not answer", self.port))
    }

    fn try_command(&self, args: &[&str]) -> Option<String> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        let mut req = format!("*{}\r\n", args.len());
        for a in args {
            req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        s.write_all(req.as_bytes()).ok()?;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let n = s.read(&mut chunk).ok()?;
            if n == 0 {
                return None;
            }
            buf.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&buf).into_owned();
            let mut lines = text.split("\r\n");
            let first = lines.next().unwrap_or("");
            if !text.contains("\r\n") {
                continue;
            }
            if let Some(len) = first.strip_prefix('$') {
                if len == "-1" {
                    return Some("$-1".into());
                }
                match lines.next() {
                    Some(body) if text.matches("\r\n").count() >= 2 => return Some(body.into()),
                    _ => continue,
                }
            }
            return Some(first.into());
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // a paused server dies of SIGKILL too
        self.kill();
    }
}

/// A store that accepts connections and reads what it is sent but never answers (until
/// dropped: its thread stops at the next connection or read after that).
pub struct SilentStore {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl SilentStore {
    /// Listens on a free port of 127.0.0.1.
    pub fn start() -> SilentStore {
        let l = TcpListener::bind(("127.0.0.1", crate::free_port())).expect("bind");
        let addr = l.local_addr().expect("addr");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        std::thread::spawn(move || {
            for c in l.incoming() {
                if s.load(std::sync::atomic::Ordering::Relaxed) {
                    return;
                }
                let Ok(mut c) = c else { continue };
                let s = s.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = c.read(&mut buf) {
                        if n == 0 || s.load(std::sync::atomic::Ordering::Relaxed) {
                            return;
                        }
                    }
                });
            }
        });
        SilentStore { addr, stop }
    }

    /// `redis://ADDR/0`.
    pub fn url(&self) -> String {
        format!("redis://{}/0", self.addr)
    }
}

impl Drop for SilentStore {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr);
    }
}
