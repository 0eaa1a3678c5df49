//! `wrk`: HTTP/1.1 keep-alive load, plain or HTTPS (OpenSSL). A Lua `done` hook prints exact
//! request and byte counts (wrk's human summary rounds bytes to "MB"); a script without a
//! `response` hook costs wrk nothing per request.

use std::path::PathBuf;
use std::process::Command;

use super::{int_after, leading_number, ClientRun};
use crate::{Error, Result};

/// The Lua script: one machine-readable summary line at the end of the run.
pub const DONE_SCRIPT: &str = r#"done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("qweb-bench: requests=%d bytes=%d duration_us=%d connect=%d read=%d write=%d status=%d timeout=%d\n",
    summary.requests, summary.bytes, summary.duration, e.connect, e.read, e.write, e.status, e.timeout))
end
"#;

/// One wrk run.
#[derive(Debug, Clone)]
pub struct WrkSpec {
    /// The wrk binary.
    pub bin: PathBuf,
    /// http:// or https:// URL.
    pub url: String,
    /// Open connections (`-c`).
    pub connections: usize,
    /// Threads (`-t`), at most `connections`.
    pub threads: usize,
    /// Seconds (`-d`).
    pub duration_secs: u64,
    /// Body bytes every response must carry.
    pub body_bytes: u64,
    /// Where the Lua script is written.
    pub script: PathBuf,
    /// Request headers (`-H`, "Name: value").
    pub headers: Vec<String>,
}

impl WrkSpec {
    /// The command line.
    pub fn command_line(&self) -> String {
        let headers: String = self.headers.iter().map(|h| format!(" -H '{h}'")).collect();
        format!(
            "wrk -t{} -c{} -d{}s{headers} -s {} {}",
            self.threads.min(self.connections).max(1),
            self.connections,
            self.duration_secs,
            self.script.display(),
            self.url
        )
    }
}

/// What wrk printed, parsed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WrkOutput {
    /// Requests completed (from the done hook; the human line otherwise).
    pub requests: u64,
    /// All bytes read, headers included.
    pub bytes: u64,
    /// Measured seconds.
    pub secs: f64,
    /// "Requests/sec:".
    pub req_per_sec: f64,
    /// "Non-2xx or 3xx responses:".
    pub non_2xx: u64,
    /// Socket errors: connect, read, write, timeout.
    pub socket_errors: [u64; 4],
    /// Whether the done hook's line was there (it is missing when wrk could not start).
    pub complete: bool,
}

/// Parses wrk's output (stdout and stderr together).
pub fn parse(out: &str) -> WrkOutput {
    let mut o = WrkOutput::default();
    for line in out.lines() {
        let l = line.trim();
        if let Some(rest) = l.strip_prefix("Non-2xx or 3xx responses:") {
            o.non_2xx = leading_number(rest).unwrap_or(0.0) as u64;
        } else if let Some(rest) = l.strip_prefix("Requests/sec:") {
            o.req_per_sec = leading_number(rest).unwrap_or(0.0);
        } else if let Some(rest) = l.strip_prefix("Socket errors:") {
            for (i, k) in ["connect ", "read ", "write ", "timeout "]
                .iter()
                .enumerate()
            {
                o.socket_errors[i] = int_after(rest, k).unwrap_or(0);
            }
        } else if l.starts_with("qweb-bench: requests=") {
            o.complete = true;
            o.requests = int_after(l, "requests=").unwrap_or(0);
            o.bytes = int_after(l, "bytes=").unwrap_or(0);
            o.secs = int_after(l, "duration_us=").unwrap_or(0) as f64 / 1e6;
            o.non_2xx = o.non_2xx.max(int_after(l, " status=").unwrap_or(0));
            for (i, k) in ["connect=", "read=", "write=", "timeout="]
                .iter()
                .enumerate()
            {
                o.socket_errors[i] = o.socket_errors[i].max(int_after(l, k).unwrap_or(0));
            }
        } else if l.contains(" requests in ") && o.requests == 0 {
            o.requests = leading_number(l).unwrap_or(0.0) as u64;
        }
    }
    o
}

/// The problems of a parsed run: no summary, non-2xx responses, socket errors, no requests,
/// or a byte count that is not `body_bytes` plus a plausible header per request (responses
/// still in flight at the end add up to one body per connection).
pub fn check(o: &WrkOutput, body_bytes: u64, connections: usize) -> Vec<String> {
    let mut p = Vec::new();
    if !o.complete {
        p.push("wrk printed no summary (it did not run to the end)".to_string());
        return p;
    }
    if o.requests == 0 {
        p.push("no request completed".into());
    }
    if o.non_2xx > 0 {
        p.push(format!("{} non-2xx/3xx responses", o.non_2xx));
    }
    if o.socket_errors.iter().any(|e| *e > 0) {
        let [c, r, w, t] = o.socket_errors;
        p.push(format!(
            "socket errors: connect {c}, read {r}, write {w}, timeout {t}"
        ));
    }
    let min = o.requests * body_bytes;
    let max = (o.requests + connections as u64) * (body_bytes + 1024);
    if o.requests > 0 && (o.bytes < min || o.bytes > max) {
        p.push(format!(
            "{} bytes read for {} responses of {body_bytes} body bytes (expected {min}..{max})",
            o.bytes, o.requests
        ));
    }
    p
}

/// Runs wrk; the parsed and checked result.
pub fn run(spec: &WrkSpec) -> Result<ClientRun> {
    if !spec.script.is_file() {
        std::fs::write(&spec.script, DONE_SCRIPT)
            .map_err(|e| Error::path("write", &spec.script, e))?;
    }
    let mut cmd = Command::new(&spec.bin);
    cmd.arg(format!("-t{}", spec.threads.min(spec.connections).max(1)))
        .arg(format!("-c{}", spec.connections))
        .arg(format!("-d{}s", spec.duration_secs));
    for h in &spec.headers {
        cmd.arg("-H").arg(h);
    }
    let out = cmd
        .arg("-s")
        .arg(&spec.script)
        .arg(&spec.url)
        .output()
        .map_err(|e| Error::io(format!("run {}", spec.bin.display()), e))?;
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    let o = parse(&text);
    let mut problems = check(&o, spec.body_bytes, spec.connections);
    if !out.status.success() {
        problems.push(format!(
            "wrk exited with {}: {}",
            out.status,
            text.lines().last().unwrap_or("")
        ));
    }
    Ok(ClientRun {
        command: spec.command_line(),
        requests: o.requests,
        req_per_sec: if o.secs > 0.0 {
            o.requests as f64 / o.secs
        } else {
            o.req_per_sec
        },
        mib_per_sec: if o.secs > 0.0 {
            o.bytes as f64 / o.secs / 1048576.0
        } else {
            0.0
        },
        secs: o.secs,
        problems,
        tls: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clean_run_parses_exactly() {
        let o = parse(include_str!("fixtures/wrk-ok.txt"));
        assert!(o.complete);
        assert_eq!(o.requests, 21838);
        assert_eq!(o.bytes, 27843450);
        assert_eq!(o.non_2xx, 0);
        assert_eq!(o.socket_errors, [0; 4]);
        assert!((o.secs - 1.004047).abs() < 1e-9);
        assert!((o.req_per_sec - 21749.98).abs() < 1e-6);
        assert_eq!(check(&o, 1024, 32), Vec::<String>::new());
    }

    #[test]
    fn not_found_responses_are_reported() {
        let o = parse(include_str!("fixtures/wrk-404.txt"));
        assert_eq!(o.non_2xx, 14817);
        let p = check(&o, 1024, 4);
        assert!(p.iter().any(|p| p.contains("14817 non-2xx")), "{p:?}");
        // 404 pages are not 1 KiB bodies either.
        assert!(p.iter().any(|p| p.contains("bytes read")), "{p:?}");
    }

    #[test]
    fn a_run_cut_short_or_without_the_hook_is_no_result() {
        // Without the done hook's line (wrk killed, or the script not loaded) the rounded
        // human summary is not trusted.
        let full = include_str!("fixtures/wrk-ok.txt");
        let o = parse(&full[..full.find("qweb-bench:").unwrap()]);
        assert!(!o.complete);
        assert_eq!(o.requests, 21838);
        assert_eq!(check(&o, 1024, 32).len(), 1);
    }

    #[test]
    fn extra_bytes_beyond_a_plausible_header_are_caught() {
        let mut o = parse(include_str!("fixtures/wrk-ok.txt"));
        o.bytes = (o.requests + 32) * (1024 + 1024) + 1;
        assert!(check(&o, 1024, 32)[0].contains("bytes read"));
    }

    #[test]
    fn headers_are_in_the_command_line() {
        let mut spec = WrkSpec {
            bin: "wrk".into(),
            url: "https://127.0.0.1:1/page.html".into(),
            connections: 16,
            threads: 1,
            duration_secs: 3,
            body_bytes: 1,
            script: "/o/wrk-done.lua".into(),
            headers: vec!["Accept-Encoding: gzip".into()],
        };
        assert_eq!(
            spec.command_line(),
            "wrk -t1 -c16 -d3s -H 'Accept-Encoding: gzip' -s /o/wrk-done.lua https://127.0.0.1:1/page.html"
        );
        spec.headers.clear();
        assert!(!spec.command_line().contains("-H"));
    }

    #[test]
    fn a_refused_connection_is_no_result() {
        let o = parse(include_str!("fixtures/wrk-refused.txt"));
        assert!(!o.complete);
        assert_eq!(check(&o, 1024, 4).len(), 1);
    }

    #[test]
    fn short_bodies_and_socket_errors_are_caught() {
        let o = WrkOutput {
            requests: 1000,
            bytes: 1000 * 900,
            secs: 1.0,
            req_per_sec: 1000.0,
            non_2xx: 0,
            socket_errors: [0, 3, 0, 1],
            complete: true,
        };
        let p = check(&o, 1024, 8);
        assert!(p.iter().any(|p| p.contains("read 3")), "{p:?}");
        assert!(p.iter().any(|p| p.contains("bytes read")), "{p:?}");
        let parsed = parse("  Socket errors: connect 0, read 12, write 1, timeout 7\n");
        assert_eq!(parsed.socket_errors, [0, 12, 1, 7]);
    }
}
