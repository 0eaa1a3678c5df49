//! `h2load` (nghttp2): HTTP/2 load with many streams per connection. Run with a request count
//! (`-n`), never a duration: a server that closes connections after N requests (nginx's
//! default is 1000 per connection) would otherwise be measured by its reconnect gaps.

use std::path::PathBuf;
use std::process::Command;

use super::{int_after, leading_number, ClientRun};
use crate::{Error, Result};

/// One h2load run.
#[derive(Debug, Clone)]
pub struct H2loadSpec {
    /// The h2load binary.
    pub bin: PathBuf,
    /// https:// URL.
    pub url: String,
    /// Requests in all (`-n`).
    pub requests: u64,
    /// Connections (`-c`).
    pub connections: usize,
    /// Concurrent streams per connection (`-m`).
    pub streams: usize,
    /// Client threads (`-t`), at most `connections`.
    pub threads: usize,
    /// Body bytes every response must carry.
    pub body_bytes: u64,
    /// HTTP/1.1 instead of HTTP/2 (`--h1`).
    pub h1: bool,
}

impl H2loadSpec {
    fn args(&self) -> Vec<String> {
        let mut a: Vec<String> = if self.h1 { vec!["--h1".into()] } else { vec![] };
        a.extend([
            "-n".into(),
            self.requests.to_string(),
            "-c".into(),
            self.connections.to_string(),
            "-m".into(),
            self.streams.to_string(),
            "-t".into(),
            self.threads.min(self.connections).max(1).to_string(),
            self.url.clone(),
        ]);
        a
    }

    /// The command line.
    pub fn command_line(&self) -> String {
        format!("h2load {}", self.args().join(" "))
    }
}

/// What h2load printed, parsed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct H2loadOutput {
    /// "finished in X": seconds.
    pub secs: f64,
    /// "requests: N total, ..., S succeeded, F failed, E errored, T timeout".
    pub total: u64,
    /// Requests that got a 2xx/3xx answer.
    pub succeeded: u64,
    /// Failed + errored + timed out.
    pub failed: u64,
    /// "status codes: a 2xx, b 3xx, c 4xx, d 5xx".
    pub status: [u64; 4],
    /// Body bytes ("... (N) data").
    pub data_bytes: u64,
    /// Whether the summary lines were there.
    pub complete: bool,
    /// "TLS Protocol", "Cipher" and "Server Temp Key" (first word each), joined.
    pub tls: Option<String>,
}

/// Parses h2load's output.
pub fn parse(out: &str) -> H2loadOutput {
    let mut o = H2loadOutput::default();
    let mut seen = 0;
    for line in out.lines() {
        let l = line.trim();
        if let Some(v) = l.strip_prefix("TLS Protocol: ") {
            o.tls = Some(v.trim().to_string());
        } else if let Some(v) = l
            .strip_prefix("Cipher: ")
            .or_else(|| l.strip_prefix("Server Temp Key: "))
        {
            if let Some(t) = o.tls.as_mut() {
                t.push(' ');
                t.push_str(v.split_whitespace().next().unwrap_or(""));
            }
        } else if let Some(rest) = l.strip_prefix("finished in ") {
            let v = leading_number(rest).unwrap_or(0.0);
            o.secs = if rest
                .trim_start_matches(|c: char| c.is_ascii_digit() || c == '.')
                .starts_with("ms")
            {
                v / 1000.0
            } else if rest
                .trim_start_matches(|c: char| c.is_ascii_digit() || c == '.')
                .starts_with("us")
            {
                v / 1e6
            } else {
                v
            };
        } else if let Some(rest) = l.strip_prefix("requests: ") {
            seen += 1;
            o.total = leading_number(rest).unwrap_or(0.0) as u64;
            let word = |w: &str| -> u64 {
                rest.split(',')
                    .find(|p| p.trim().ends_with(w))
                    .and_then(|p| leading_number(p.trim()))
                    .unwrap_or(0.0) as u64
            };
            o.succeeded = word(" succeeded");
            o.failed = word(" failed") + word(" errored") + word(" timeout");
        } else if let Some(rest) = l.strip_prefix("status codes: ") {
            seen += 1;
            for (i, k) in ["2xx", "3xx", "4xx", "5xx"].iter().enumerate() {
                o.status[i] = rest
                    .split(',')
                    .find(|p| p.trim().ends_with(k))
                    .and_then(|p| leading_number(p.trim()))
                    .unwrap_or(0.0) as u64;
            }
        } else if let Some(rest) = l.strip_prefix("traffic: ") {
            seen += 1;
            // "... headers (space savings 91.57%), 195.31MB (204800000) data"
            if let Some(d) = rest.rsplit(',').next() {
                o.data_bytes = int_after(d, "(").unwrap_or(0);
            }
        }
    }
    o.complete = seen == 3;
    o
}

/// The problems of a parsed run: every one of `requests` must have succeeded with a 2xx
/// status, and the data bytes must be exactly `requests × body_bytes`.
pub fn check(o: &H2loadOutput, requests: u64, body_bytes: u64) -> Vec<String> {
    let mut p = Vec::new();
    if !o.complete {
        p.push("h2load printed no summary".to_string());
        return p;
    }
    if o.succeeded != requests || o.failed > 0 {
        p.push(format!(
            "{} of {requests} requests succeeded, {} failed/errored/timed out",
            o.succeeded, o.failed
        ));
    }
    if o.status[0] != requests {
        let [a, b, c, d] = o.status;
        p.push(format!(
            "status codes: {a} 2xx, {b} 3xx, {c} 4xx, {d} 5xx (expected {requests} 2xx)"
        ));
    }
    if o.data_bytes != requests * body_bytes {
        p.push(format!(
            "{} data bytes, expected {} ({requests} × {body_bytes})",
            o.data_bytes,
            requests * body_bytes
        ));
    }
    p
}

/// Runs h2load; the parsed and checked result.
pub fn run(spec: &H2loadSpec) -> Result<ClientRun> {
    let out = Command::new(&spec.bin)
        .args(spec.args())
        .output()
        .map_err(|e| Error::io(format!("run {}", spec.bin.display()), e))?;
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    let o = parse(&text);
    let mut problems = check(&o, spec.requests, spec.body_bytes);
    if !out.status.success() {
        problems.push(format!("h2load exited with {}", out.status));
    }
    let secs = o.secs.max(1e-9);
    Ok(ClientRun {
        command: spec.command_line(),
        requests: o.succeeded,
        req_per_sec: o.succeeded as f64 / secs,
        mib_per_sec: o.data_bytes as f64 / secs / 1048576.0,
        secs: o.secs,
        problems,
        tls: o.tls,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clean_run_parses_exactly() {
        let o = parse(include_str!("fixtures/h2load-ok.txt"));
        assert!(o.complete);
        assert_eq!(o.total, 2000);
        assert_eq!(o.succeeded, 2000);
        assert_eq!(o.failed, 0);
        assert_eq!(o.status, [2000, 0, 0, 0]);
        assert_eq!(o.data_bytes, 204_800_000);
        assert!((o.secs - 0.99968).abs() < 1e-9);
        assert_eq!(
            o.tls.as_deref(),
            Some("TLSv1.3 TLS_AES_128_GCM_SHA256 X25519")
        );
        assert_eq!(check(&o, 2000, 102_400), Vec::<String>::new());
        // A count that differs from what was asked for is a problem.
        assert!(!check(&o, 3000, 102_400).is_empty());
    }

    #[test]
    fn h1_runs_ask_for_http_1_1() {
        let mut spec = H2loadSpec {
            bin: "h2load".into(),
            url: "https://127.0.0.1:1/1k.bin".into(),
            requests: 2000,
            connections: 2000,
            streams: 1,
            threads: 1,
            body_bytes: 1024,
            h1: true,
        };
        assert_eq!(
            spec.command_line(),
            "h2load --h1 -n 2000 -c 2000 -m 1 -t 1 https://127.0.0.1:1/1k.bin"
        );
        spec.h1 = false;
        assert!(!spec.command_line().contains("--h1"));
    }

    #[test]
    fn a_run_cut_short_has_no_summary() {
        // h2load killed (or crashed) mid-run: the progress lines are there, the summary not.
        let full = include_str!("fixtures/h2load-ok.txt");
        let cut = &full[..full.find("finished in").unwrap()];
        let o = parse(cut);
        assert!(!o.complete);
        assert_eq!(
            o.tls.as_deref(),
            Some("TLSv1.3 TLS_AES_128_GCM_SHA256 X25519")
        );
        assert_eq!(check(&o, 2000, 102_400), vec!["h2load printed no summary"]);
    }

    #[test]
    fn short_bodies_are_caught_even_when_every_status_is_2xx() {
        let mut o = parse(include_str!("fixtures/h2load-ok.txt"));
        o.data_bytes -= 1;
        let p = check(&o, 2000, 102_400);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("204799999 data bytes"), "{p:?}");
    }

    #[test]
    fn not_found_is_reported() {
        let o = parse(include_str!("fixtures/h2load-404.txt"));
        assert_eq!(o.status, [0, 0, 100, 0]);
        assert_eq!(o.succeeded, 0);
        let p = check(&o, 100, 102_400);
        assert_eq!(p.len(), 3, "{p:?}");
    }

    #[test]
    fn a_refused_connection_fails_every_request() {
        let o = parse(include_str!("fixtures/h2load-refused.txt"));
        assert!(o.complete);
        assert_eq!(o.failed, 200); // 100 failed + 100 errored
        assert!(!check(&o, 100, 1024).is_empty());
    }
}
