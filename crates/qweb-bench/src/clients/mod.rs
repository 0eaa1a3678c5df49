//! External load generators and tracers the runner drives as child processes: `wrk`
//! (HTTP/1.1 keep-alive, plain and HTTPS with OpenSSL), `h2load` (HTTP/2 with many streams per
//! connection, from nghttp2) and `strace -c` (syscalls per request). Each module runs its tool
//! and parses the tool's own summary; every parse is unit tested against output captured from
//! the real tool (`fixtures/`).

pub mod h2load;
pub mod strace;
pub mod wrk;

use std::path::{Path, PathBuf};

/// What one external client run measured, after its checks.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ClientRun {
    /// The command line that ran.
    pub command: String,
    /// Requests completed (successful or not).
    pub requests: u64,
    /// Requests per second over the tool's own measured time.
    pub req_per_sec: f64,
    /// Response body MiB/s (h2load: data bytes; wrk: all bytes read, headers included).
    pub mib_per_sec: f64,
    /// Seconds the tool measured.
    pub secs: f64,
    /// What went wrong: non-2xx responses, socket errors, byte counts that do not add up.
    pub problems: Vec<String>,
}

/// `name` on PATH or in the usual system folders.
pub fn find_tool(name: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    for d in ["/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin"] {
        dirs.push(PathBuf::from(d));
    }
    dirs.into_iter().map(|d| d.join(name)).find(|p| is_exe(p))
}

fn is_exe(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// The first number in `s` (digits and one dot), e.g. "12.5k" → 12.5.
fn leading_number(s: &str) -> Option<f64> {
    let t: String = s
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    t.parse().ok()
}

/// The integer that follows `key` in `line` ("requests=12" with key "requests=").
fn int_after(line: &str, key: &str) -> Option<u64> {
    let rest = &line[line.find(key)? + key.len()..];
    let t: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    t.parse().ok()
}
