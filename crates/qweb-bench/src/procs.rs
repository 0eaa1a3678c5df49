//! The servers under test as child processes: start, wait until they answer, read their
//! resident memory and CPU time from /proc, scrape qweb's /metrics, stop.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// A free TCP port on 127.0.0.1 (bound, then released).
pub fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| Error::io("bind 127.0.0.1:0", e))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| Error::io("local address", e))
}

/// A running server process. Stopped (SIGTERM, then SIGKILL) on drop; it also receives
/// SIGTERM if the runner dies (`PR_SET_PDEATHSIG`).
pub struct ServerProc {
    /// Name in tables and messages ("qweb async pool", "nginx").
    pub name: String,
    /// HTTPS port.
    pub port: u16,
    /// Admin port (/metrics), qweb only.
    pub admin_port: Option<u16>,
    /// Plain-HTTP port, when the server has a plain listener too.
    pub plain_port: Option<u16>,
    /// Log file (stdout and stderr).
    pub log: PathBuf,
    child: Option<Child>,
}

impl ServerProc {
    /// Starts `program args`, output to `log`, and waits until 127.0.0.1:`port` accepts.
    pub fn start(
        name: &str,
        program: &Path,
        args: &[String],
        port: u16,
        admin_port: Option<u16>,
        log: PathBuf,
    ) -> Result<ServerProc> {
        ServerProc::start_with_env(name, program, args, &[], port, admin_port, log)
    }

    /// [`ServerProc::start`] with extra environment variables.
    pub fn start_with_env(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(&str, String)],
        port: u16,
        admin_port: Option<u16>,
        log: PathBuf,
    ) -> Result<ServerProc> {
        let mut p = ServerProc::spawn(name, program, args, env, port, admin_port, log)?;
        p.wait_ready(Duration::from_secs(20))?;
        Ok(p)
    }

    fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(&str, String)],
        port: u16,
        admin_port: Option<u16>,
        log: PathBuf,
    ) -> Result<ServerProc> {
        let out = std::fs::File::create(&log).map_err(|e| Error::path("create", &log, e))?;
        let err = out.try_clone().map_err(|e| Error::path("dup", &log, e))?;
        let mut cmd = Command::new(program);
        cmd.args(args).stdin(Stdio::null()).stdout(out).stderr(err);
        for (k, v) in env {
            cmd.env(k, v);
        }
        #[allow(unsafe_code)]
        // SAFETY: the closure runs in the child between fork and exec and only calls
        // prctl, which is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .map_err(|e| Error::io(format!("start {name} ({})", program.display()), e))?;
        Ok(ServerProc {
            name: name.to_string(),
            port,
            admin_port,
            plain_port: None,
            log,
            child: Some(child),
        })
    }

    /// The same as [`ServerProc::start`] for a process that listens on the Unix socket
    /// `socket` (the key server): waits until the socket accepts.
    pub fn start_unix(
        name: &str,
        program: &Path,
        args: &[String],
        socket: &Path,
        log: PathBuf,
    ) -> Result<ServerProc> {
        let mut p = ServerProc::spawn(name, program, args, &[], 0, None, log)?;
        let t0 = Instant::now();
        loop {
            if let Some(c) = p.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    return Err(Error::server(
                        name,
                        format!("exited at start ({st}): {}", p.log_tail()),
                        &p.log,
                    ));
                }
            }
            if std::os::unix::net::UnixStream::connect(socket).is_ok() {
                return Ok(p);
            }
            if t0.elapsed() > Duration::from_secs(10) {
                return Err(Error::server(
                    name,
                    format!("no socket {} after 10s", socket.display()),
                    &p.log,
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn wait_ready(&mut self, limit: Duration) -> Result<()> {
        let t0 = Instant::now();
        let addr: SocketAddr = ([127, 0, 0, 1], self.port).into();
        loop {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    return Err(Error::server(
                        &self.name,
                        format!("exited at start ({st}): {}", self.log_tail()),
                        &self.log,
                    ));
                }
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                // Every worker binds its own SO_REUSEPORT socket: give them a moment.
                std::thread::sleep(Duration::from_millis(300));
                return Ok(());
            }
            if t0.elapsed() > limit {
                return Err(Error::server(
                    &self.name,
                    format!("no listener on {addr} after {limit:?}"),
                    &self.log,
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Last lines of the log.
    pub fn log_tail(&self) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }

    /// Process id of the main process.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// The main process and all its descendants (nginx master and workers, h2o's helpers).
    pub fn pids(&self) -> Vec<u32> {
        self.pid().map(process_tree).unwrap_or_default()
    }

    /// Pins every thread of the process tree to CPU `cpu` (children forked later inherit it).
    pub fn pin_to(&self, cpu: usize) -> Result<()> {
        for p in self.pids() {
            let tasks = std::fs::read_dir(format!("/proc/{p}/task"))
                .map_err(|e| Error::io(format!("list threads of {p}"), e))?;
            for t in tasks.flatten() {
                if let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) {
                    pin_thread(tid, cpu)
                        .map_err(|e| Error::io(format!("pin {} thread {tid}", self.name), e))?;
                }
            }
        }
        Ok(())
    }

    /// Resident memory of the process tree, KiB: (RSS sum, PSS sum). PSS counts pages shared
    /// between nginx's master and workers once.
    pub fn memory_kib(&self) -> (u64, u64) {
        let mut rss = 0;
        let mut pss = 0;
        for p in self.pids() {
            rss += proc_status_kib(p, "VmRSS:").unwrap_or(0);
            pss += smaps_rollup_kib(p, "Pss:").unwrap_or(0);
        }
        (rss, pss)
    }

    /// CPU seconds (user + system) used so far by the whole process tree, read from
    /// /proc/PID/stat of the main process and every descendant.
    pub fn cpu_secs(&self) -> f64 {
        self.pids().into_iter().map(proc_cpu_secs).sum()
    }

    /// GET /metrics from the admin listener (qweb).
    pub fn metrics(&self) -> Result<String> {
        let port = self
            .admin_port
            .ok_or_else(|| Error::Other(format!("{} has no admin listener", self.name)))?;
        http_get_plain(port, "/metrics")
            .map_err(|e| Error::server(&self.name, format!("GET /metrics: {e}"), &self.log))
    }

    /// Whether the process still runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// SIGTERM, wait up to 5 s, then SIGKILL.
    #[allow(unsafe_code)]
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) with the pid of our own child, which we have not reaped yet.
            unsafe {
                libc::kill(c.id() as libc::pid_t, libc::SIGTERM);
            }
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(5) {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `pid` and every descendant of it (one scan of /proc, parent ids followed down).
fn process_tree(pid: u32) -> Vec<u32> {
    let mut parent_of: Vec<(u32, u32)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) {
                if let Some(pp) = stat_field(&stat, 4).and_then(|f| f.parse::<u32>().ok()) {
                    parent_of.push((p, pp));
                }
            }
        }
    }
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let cur = tree[i];
        tree.extend(
            parent_of
                .iter()
                .filter(|(_, pp)| *pp == cur)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    tree
}

/// Restricts thread `tid` (0: the calling thread) to CPU `cpu`.
pub fn pin_thread(tid: u32, cpu: usize) -> std::io::Result<()> {
    set_affinity(tid, Some(cpu))
}

/// Lets thread `tid` (0: the calling thread) run on every CPU again.
pub fn unpin_thread(tid: u32) -> std::io::Result<()> {
    set_affinity(tid, None)
}

/// sched_setaffinity of `tid` to `cpu`, or to every CPU (the kernel drops absent ones).
#[allow(unsafe_code)]
fn set_affinity(tid: u32, cpu: Option<usize>) -> std::io::Result<()> {
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
    if cpu.is_some_and(|c| c >= max) {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: cpu_set_t is plain data and zeroed is its empty set; CPU_SET writes only bits
    // below `max` (checked above), inside the set; sched_setaffinity only reads it.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        match cpu {
            Some(c) => libc::CPU_SET(c, &mut set),
            None => (0..max).for_each(|c| libc::CPU_SET(c, &mut set)),
        }
        libc::sched_setaffinity(
            tid as libc::pid_t,
            std::mem::size_of::<libc::cpu_set_t>(),
            &set,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Field `n` (1-based, as in proc(5)) of a /proc/PID/stat line; the command name in
/// parentheses may contain spaces.
pub fn stat_field(stat: &str, n: usize) -> Option<&str> {
    if n <= 2 {
        return None;
    }
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(n - 3)
}

fn proc_cpu_secs(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    let utime: f64 = stat_field(&stat, 14)
        .and_then(|f| f.parse().ok())
        .unwrap_or(0.0);
    let stime: f64 = stat_field(&stat, 15)
        .and_then(|f| f.parse().ok())
        .unwrap_or(0.0);
    #[allow(unsafe_code)]
    // SAFETY: sysconf has no memory effects.
    let tck = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (utime + stime) / tck
}

fn kib_line(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with(key))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn proc_status_kib(pid: u32, key: &str) -> Option<u64> {
    kib_line(
        &std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?,
        key,
    )
}

fn smaps_rollup_kib(pid: u32, key: &str) -> Option<u64> {
    kib_line(
        &std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?,
        key,
    )
}

/// CPU seconds (user + system) this process used so far (the load generator's side).
pub fn self_cpu_secs() -> f64 {
    proc_cpu_secs(std::process::id())
}

/// Plain-HTTP GET on 127.0.0.1 (the admin listener); the body.
pub fn http_get_plain(port: u16, path: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(
        &SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_secs(2),
    )?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    match text.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.1 200") => Ok(body.to_string()),
        _ => Err(std::io::Error::other(format!(
            "unexpected answer: {}",
            text.lines().next().unwrap_or("")
        ))),
    }
}

/// Sum of the samples of metric `name` whose labels contain every `label` (e.g.
/// `engine="pool"`), in Prometheus text format. 0 when absent.
pub fn parse_metric(text: &str, name: &str, labels: &[&str]) -> f64 {
    let mut sum = 0.0;
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (label_part, value) = if let Some(r) = rest.strip_prefix('{') {
            let Some((l, v)) = r.split_once('}') else {
                continue;
            };
            (l, v)
        } else if rest.starts_with(' ') {
            ("", rest)
        } else {
            continue; // a longer name with the same prefix
        };
        if !labels.iter().all(|l| label_part.contains(l)) {
            continue;
        }
        if let Some(v) = value
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        {
            sum += v;
        }
    }
    sum
}

/// The load average line of /proc/loadavg (how busy the shared machine was).
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: &str = "# HELP qweb_tls_handshakes_total TLS handshakes completed.\n\
# TYPE qweb_tls_handshakes_total counter\n\
qweb_tls_handshakes_total{worker=\"0\"} 10\n\
qweb_tls_handshakes_total{worker=\"1\"} 32\n\
qweb_tls_handshakes_total_extra{worker=\"1\"} 1000\n\
qweb_offload_ops_submitted_total{engine=\"pool\"} 40\n\
qweb_offload_ops_submitted_total{engine=\"inline\"} 2\n\
plain_metric 3.5\n";

    #[test]
    fn metrics_are_summed_by_name_and_label() {
        assert_eq!(parse_metric(M, "qweb_tls_handshakes_total", &[]), 42.0);
        assert_eq!(
            parse_metric(M, "qweb_offload_ops_submitted_total", &["engine=\"pool\""]),
            40.0
        );
        assert_eq!(
            parse_metric(M, "qweb_offload_ops_submitted_total", &[]),
            42.0
        );
        assert_eq!(parse_metric(M, "plain_metric", &[]), 3.5);
        assert_eq!(parse_metric(M, "missing", &[]), 0.0);
    }

    #[test]
    fn stat_fields_skip_the_command_name() {
        let s = "1234 (nginx: worker (x)) S 1200 1234 1234 0 -1 4194560 10 0 0 0 7 3 0 0";
        assert_eq!(stat_field(s, 3), Some("S"));
        assert_eq!(stat_field(s, 4), Some("1200"));
        assert_eq!(stat_field(s, 14), Some("7"));
        assert_eq!(stat_field(s, 15), Some("3"));
        assert_eq!(stat_field(s, 1), None);
    }

    /// What G counts: a descendant that is not a direct child (nginx's workers, h2o's
    /// `neverbleed`) is in the tree, and so is its CPU time.
    #[test]
    fn the_tree_holds_grandchildren_and_their_cpu() {
        // sh (our child) starts a busy loop in the background (our grandchild) and waits.
        let mut child = Command::new("sh")
            .args(["-c", "sh -c 'while :; do :; done' & wait"])
            .spawn()
            .unwrap();
        let pid = child.id();
        let t0 = Instant::now();
        let mut tree = process_tree(pid);
        while tree.len() < 2 && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
            tree = process_tree(pid);
        }
        let below: Vec<u32> = tree.iter().copied().filter(|&p| p != pid).collect();
        let mut cpu = 0.0;
        while cpu < 0.05 && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(50));
            cpu = process_tree(pid)
                .into_iter()
                .map(proc_cpu_secs)
                .sum::<f64>();
        }
        let own = proc_cpu_secs(pid);
        for p in below.iter().chain([&pid]) {
            #[allow(unsafe_code)]
            // SAFETY: kill(2) of processes this test started (the child, not reaped yet, and
            // its descendants, which the child waits for).
            unsafe {
                libc::kill(*p as libc::pid_t, libc::SIGKILL);
            }
        }
        let _ = child.wait();
        assert_eq!(tree.first(), Some(&pid));
        assert!(!below.is_empty(), "no descendant of {pid} found: {tree:?}");
        // The busy loop's time is the grandchild's, not the waiting shell's.
        assert!(cpu >= 0.05, "tree CPU {cpu} s");
        assert!(own < cpu, "shell {own} s of tree {cpu} s");
    }

    #[test]
    fn own_process_is_readable() {
        assert!(self_cpu_secs() >= 0.0);
        assert!(proc_status_kib(std::process::id(), "VmRSS:").unwrap_or(0) > 0);
    }
}
