//! `openssl s_client` runs: one real OpenSSL connection that sends a request, reads the whole
//! answer (TLS 1.3 tickets come after the handshake) and says whether the session resumed.
//!
//! ```no_run
//! use qweb_testkit::openssl::{SClient, TlsVersion};
//! # let addr: std::net::SocketAddr = "127.0.0.1:1".parse().unwrap();
//! let sess = std::path::Path::new("/tmp/x.sess");
//! let first = SClient::new(addr, TlsVersion::V13).sess_out(sess).run();
//! assert!(!first.resumed());
//! let again = SClient::new(addr, TlsVersion::V13).sess_in(sess).run();
//! assert!(again.resumed());
//! let ocsp = SClient::new(addr, TlsVersion::V12).arg("-status").run();
//! assert!(ocsp.stdout.contains("OCSP response"));
//! ```

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The TLS version a run is pinned to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsVersion {
    /// `-tls1_2`.
    V12,
    /// `-tls1_3`.
    V13,
}

impl TlsVersion {
    fn flag(self) -> &'static str {
        match self {
            TlsVersion::V12 => "-tls1_2",
            TlsVersion::V13 => "-tls1_3",
        }
    }

    /// How `s_client` names it (`TLSv1.2`).
    pub fn name(self) -> &'static str {
        match self {
            TlsVersion::V12 => "TLSv1.2",
            TlsVersion::V13 => "TLSv1.3",
        }
    }
}

/// The default request: `GET /` for localhost, then close.
pub const GET_ROOT: &[u8] = b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";

/// One `openssl s_client -connect ADDR -servername localhost -ign_eof -tls1_x` run (another
/// name with [`SClient::servername`]).
pub struct SClient {
    addr: SocketAddr,
    version: TlsVersion,
    args: Vec<String>,
    sess: Option<(&'static str, PathBuf)>,
    request: Vec<u8>,
    timeout: Duration,
    servername: String,
}

/// What a run printed.
pub struct SClientRun {
    /// Its stdout (the session summary, the answer).
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
    version: TlsVersion,
}

impl SClient {
    /// A run against `addr` pinned to `version`, sending [`GET_ROOT`].
    pub fn new(addr: SocketAddr, version: TlsVersion) -> SClient {
        SClient {
            addr,
            version,
            args: Vec::new(),
            sess: None,
            request: GET_ROOT.to_vec(),
            timeout: Duration::from_secs(20),
            servername: "localhost".into(),
        }
    }

    /// Saves the session to `path` (`-sess_out`).
    pub fn sess_out(mut self, path: &Path) -> Self {
        self.sess = Some(("-sess_out", path.to_owned()));
        self
    }

    /// Offers the session in `path` (`-sess_in`).
    pub fn sess_in(mut self, path: &Path) -> Self {
        self.sess = Some(("-sess_in", path.to_owned()));
        self
    }

    /// `-sess_out` when `save`, else `-sess_in`.
    pub fn sess(self, path: &Path, save: bool) -> Self {
        if save {
            self.sess_out(path)
        } else {
            self.sess_in(path)
        }
    }

    /// One more argument (`-status`, ...), placed before the others.
    pub fn arg(mut self, a: &str) -> Self {
        self.args.push(a.to_owned());
        self
    }

    /// Sends `name` as SNI instead of `localhost`.
    pub fn servername(mut self, name: &str) -> Self {
        self.servername = name.to_owned();
        self
    }

    /// Sends `request` instead of [`GET_ROOT`].
    pub fn request(mut self, request: &[u8]) -> Self {
        self.request = request.to_vec();
        self
    }

    /// Runs it to the end (up to 20 s; then it is killed and the test panics).
    pub fn run(self) -> SClientRun {
        let mut cmd = Command::new("openssl");
        cmd.arg("s_client")
            .args(&self.args)
            .args(["-connect", &self.addr.to_string()])
            .args(["-servername", &self.servername, "-ign_eof"])
            .arg(self.version.flag());
        if let Some((flag, path)) = &self.sess {
            cmd.arg(flag).arg(path);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("openssl is installed");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(&self.request)
            .expect("write to s_client");
        // the pipes are read after the exit: both outputs are far below a pipe's capacity
        let started = Instant::now();
        while child.try_wait().expect("try_wait").is_none() {
            if started.elapsed() > self.timeout {
                let _ = child.kill();
                panic!("s_client did not finish");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut stdout = String::new();
        child
            .stdout
            .take()
            .expect("stdout")
            .read_to_string(&mut stdout)
            .expect("read stdout");
        let mut stderr = String::new();
        let _ = child
            .stderr
            .take()
            .expect("stderr")
            .read_to_string(&mut stderr);
        SClientRun {
            stdout,
            stderr,
            version: self.version,
        }
    }
}

impl SClientRun {
    /// Asserts that the answer contains `text` (so the request was served).
    pub fn answered(&self, text: &str) -> &Self {
        assert!(
            self.stdout.contains(text),
            "no answer:\n{}\n{}",
            self.stdout,
            self.stderr
        );
        self
    }

    /// The signature type of the server's handshake signature, as `s_client` names it
    /// ("ECDSA", "RSA-PSS", "RSA"): which kind of certificate the server chose.
    pub fn peer_signature_type(&self) -> Option<&str> {
        self.stdout
            .lines()
            .find_map(|l| l.trim().strip_prefix("Peer signature type:"))
            .map(str::trim)
    }

    /// True when the session was resumed ("Reused, TLSv1.x"), false for a full handshake
    /// ("New, TLSv1.x"); panics when it was neither (or another version).
    pub fn resumed(&self) -> bool {
        let v = self.version.name();
        if self.stdout.contains(&format!("Reused, {v}")) {
            true
        } else if self.stdout.contains(&format!("New, {v}")) {
            false
        } else {
            panic!("which handshake?\n{}", self.stdout)
        }
    }
}
