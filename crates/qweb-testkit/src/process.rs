//! The real `qweb` binary in a child process: spawned from a config, its stderr collected by a
//! reader thread (so that it never blocks on a full pipe), started once its banner is out,
//! killed when dropped.
//!
//! ```no_run
//! use qweb_testkit::process::{qweb_bin, Qweb};
//! let dir = tempfile::tempdir().unwrap();
//! // in the root package's tests: env!("CARGO_BIN_EXE_qweb"); elsewhere: qweb_bin()
//! let q = Qweb::serve_text(qweb_bin(), dir.path(), "workers = 1\n...");
//! let https = q.addr("https"); // "127.0.0.1:PORT" from "listening on https://..."
//! q.signal(libc::SIGHUP);
//! q.wait_for("reloaded", 1);
//! ```
#![allow(unsafe_code)] // kill(2) and sysconf on test processes; each block has its SAFETY note

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The line that ends `qweb serve`'s start-up banner ("N worker(s) ...").
pub const BANNER_END: &str = "worker(s)";
/// The line that ends `qweb keyserver`'s start-up banner.
pub const KEYSERVER_READY: &str = "qweb keyserver: ready";
/// How long [`Qweb::spawn`] and [`Qweb::wait_for`] wait.
pub const WAIT: Duration = Duration::from_secs(30);

/// The `qweb` binary of this build: `target/<profile>/qweb`, found from the test executable's
/// own path (`target/<profile>/deps/<test>-<hash>`). The root package's tests can use
/// `env!("CARGO_BIN_EXE_qweb")` instead (Cargo builds the binary for them); tests of other
/// packages need `cargo build --bin qweb` first, and this panics with that advice.
pub fn qweb_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps/<test>");
    let bin = profile_dir.join("qweb");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --bin qweb` first",
        bin.display()
    );
    bin
}

/// `qweb serve --config <config>` with `RUST_LOG` and `NOTIFY_SOCKET` removed and stdout
/// discarded, ready for more arguments or environment before [`Qweb::spawn`].
pub fn serve_command(bin: impl AsRef<OsStr>, config: &Path) -> Command {
    let mut cmd = Command::new(bin);
    cmd.args(["serve", "--config"])
        .arg(config)
        .env_remove("RUST_LOG")
        .env_remove("NOTIFY_SOCKET")
        .stdout(Stdio::null());
    cmd
}

/// Writes `text` to `<dir>/<name>` and returns the path.
pub fn write_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
    p
}

#[derive(Default)]
struct Log {
    lines: Vec<String>,
    /// The reader saw end of file: the process (and every child that inherited its stderr)
    /// closed it.
    closed: bool,
}

/// A child process (`qweb serve`, `qweb keyserver`, ...) whose stderr lines are collected.
/// Dropping it kills the process (SIGKILL) and reaps it.
pub struct Qweb {
    child: Child,
    log: Arc<(Mutex<Log>, Condvar)>,
    /// The stderr lines up to and including the banner's last line.
    pub banner: Vec<String>,
}

impl Qweb {
    /// `qweb serve --config <config>` ([`serve_command`]), started: its banner is out.
    pub fn serve(bin: impl AsRef<OsStr>, config: &Path) -> Qweb {
        Self::spawn(serve_command(bin, config), BANNER_END)
    }

    /// Writes `text` to `<dir>/qweb.toml`, then [`Qweb::serve`].
    pub fn serve_text(bin: impl AsRef<OsStr>, dir: &Path, text: &str) -> Qweb {
        Self::serve(bin, &write_file(dir, "qweb.toml", text))
    }

    /// Spawns `cmd` with stderr piped and waits (up to [`WAIT`]) until a stderr line contains
    /// `ready`; panics with what it printed when it exits first.
    pub fn spawn(cmd: Command, ready: &str) -> Qweb {
        let mut q = Self::spawn_unready(cmd);
        q.wait_for(ready, 1);
        let log = q.log.0.lock().unwrap();
        let end = log
            .lines
            .iter()
            .position(|l| l.contains(ready))
            .expect("ready line");
        let banner = log.lines[..=end].to_vec();
        drop(log);
        q.banner = banner;
        q
    }

    /// Spawns `cmd` with stderr piped and returns at once (for a process that is expected
    /// to fail, or whose start is checked with [`Qweb::wait_for`]).
    pub fn spawn_unready(mut cmd: Command) -> Qweb {
        let mut child = cmd
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new((Mutex::new(Log::default()), Condvar::new()));
        let sink = log.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(stderr).lines() {
                let Ok(l) = l else { break };
                sink.0.lock().unwrap().lines.push(l.trim_end().to_owned());
                sink.1.notify_all();
            }
            sink.0.lock().unwrap().closed = true;
            sink.1.notify_all();
        });
        Qweb {
            child,
            log,
            banner: Vec::new(),
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The child, to wait for it or check its exit.
    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Every stderr line so far.
    pub fn lines(&self) -> Vec<String> {
        self.log.0.lock().unwrap().lines.clone()
    }

    /// How many stderr lines so far contain `needle`.
    pub fn count(&self, needle: &str) -> usize {
        let log = self.log.0.lock().unwrap();
        log.lines.iter().filter(|l| l.contains(needle)).count()
    }

    /// Waits (up to [`WAIT`]) until `needle` was printed `n` times; returns the `n`th such
    /// line. Panics with every line when it was not, or when stderr closed first.
    pub fn wait_for(&self, needle: &str, n: usize) -> String {
        self.wait_for_within(needle, n, WAIT)
    }

    /// [`Qweb::wait_for`] with its own deadline.
    pub fn wait_for_within(&self, needle: &str, n: usize, within: Duration) -> String {
        let deadline = Instant::now() + within;
        let (lock, cv) = &*self.log;
        let mut log = lock.lock().unwrap();
        loop {
            let hits: Vec<&String> = log.lines.iter().filter(|l| l.contains(needle)).collect();
            if hits.len() >= n {
                return hits[n - 1].clone();
            }
            let now = Instant::now();
            assert!(
                !log.closed && now < deadline,
                "no {needle:?} #{n} ({}) in {:#?}",
                if log.closed {
                    "stderr closed"
                } else {
                    "timed out"
                },
                log.lines
            );
            log = cv.wait_timeout(log, deadline - now).unwrap().0;
        }
    }

    /// Waits (up to `within`) until stderr is closed (the process, and every process that
    /// inherited its stderr, exited); returns every line. Panics when it stays open.
    pub fn wait_closed(&self, within: Duration) -> Vec<String> {
        let deadline = Instant::now() + within;
        let (lock, cv) = &*self.log;
        let mut log = lock.lock().unwrap();
        while !log.closed {
            let now = Instant::now();
            assert!(now < deadline, "stderr still open: {:#?}", log.lines);
            log = cv.wait_timeout(log, deadline - now).unwrap().0;
        }
        log.lines.clone()
    }

    /// The `host:port` of the banner's "listening on `scheme`://host:port/" line (the first
    /// one for that scheme).
    pub fn addr(&self, scheme: &str) -> String {
        listen_addr(&self.banner, scheme)
    }

    /// The same as a socket address.
    pub fn socket_addr(&self, scheme: &str) -> SocketAddr {
        let a = self.addr(scheme);
        a.parse()
            .unwrap_or_else(|e| panic!("{a:?} is not a socket address: {e}"))
    }

    /// Every `host:port` the banner lists, in its order (any scheme).
    pub fn addrs(&self) -> Vec<String> {
        self.banner
            .iter()
            .filter_map(|l| l.split("://").nth(1))
            .filter_map(|a| a.split('/').next())
            .map(str::to_owned)
            .collect()
    }

    /// Sends `sig`; asserts that kill(2) succeeded.
    pub fn signal(&self, sig: libc::c_int) {
        signal(self.child.id(), sig);
    }

    /// Waits for the process to exit; kills it and panics after `within`.
    pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        wait_exit(&mut self.child, within)
    }

    /// SIGTERM, then up to `within` for the exit, then SIGKILL. Returns the exit status when
    /// it exited by itself.
    pub fn terminate(&mut self, within: Duration) -> Option<ExitStatus> {
        // SAFETY: kill(2) with the pid of our own child and a valid signal number.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let start = Instant::now();
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            if start.elapsed() > within {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL and reap (what dropping does).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Qweb {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The `host:port` of the first "listening on `scheme`://host:port/" line in `lines`.
pub fn listen_addr(lines: &[String], scheme: &str) -> String {
    lines
        .iter()
        .find_map(|l| l.split_once(&format!("listening on {scheme}://")))
        .map(|(_, rest)| rest.split('/').next().unwrap_or(rest).to_owned())
        .unwrap_or_else(|| panic!("no {scheme} listener in {lines:?}"))
}

/// Sends `sig` to `pid`; asserts that kill(2) succeeded.
pub fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) with a pid the test started and a valid signal number.
    let rc = unsafe { libc::kill(pid as libc::pid_t, sig) };
    assert_eq!(rc, 0, "kill({pid}, {sig})");
}

/// Waits for `child` to exit; kills it and panics after `within`.
pub fn wait_exit(child: &mut Child, within: Duration) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            return s;
        }
        if start.elapsed() > within {
            let _ = child.kill();
            panic!("the process did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A process's resident memory (`VmRSS`), KiB.
pub fn rss_kib(pid: u32) -> u64 {
    proc_status_kib(pid, "VmRSS:")
}

/// A KiB field (`VmRSS:`, `VmHWM:`, ...) of `/proc/<pid>/status`.
pub fn proc_status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// A process's user + system CPU time so far, seconds (`/proc/<pid>/stat`).
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc stat");
    // the fields after the command name (which may hold spaces) start after the last ')'
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat(5), 12 and 13 after the state field's 3
    let ticks: u64 = f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime");
    // SAFETY: sysconf(3) has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks as f64 / hz
}
