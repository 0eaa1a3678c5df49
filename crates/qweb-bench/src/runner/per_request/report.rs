//! G's tables: the summary (µs per request, a column per server), one table per row with
//! its medians and ratios, the method's note, and syscalls per request (`strace -c`).

use super::super::*;
use super::{Cell, GRun, Load, CLIENT_CPU, CLIENT_THREADS, GZIP_LEVEL, HANDSHAKES, SERVER_CPU};
use crate::clients::strace::Tracer;

impl Runner {
    /// G's first table: server CPU µs per request, a row per load, a column per server, and
    /// qweb's figure over the best peer's.
    pub(super) fn g_summary(
        &self,
        loads: &[Load],
        kinds: &[(String, ServerKind)],
        cells: &[Cell],
    ) -> Table {
        let mut headers: Vec<&str> = vec!["row (client)"];
        headers.extend(kinds.iter().map(|(l, _)| l.as_str()));
        headers.push("qweb / best peer");
        let mut t = Table::new(
            "G. Server CPU per request, µs (one pinned worker; lower is better)",
            &headers,
        );
        for (li, load) in loads.iter().enumerate() {
            let row = &cells[li * kinds.len()..(li + 1) * kinds.len()];
            let us: Vec<f64> = row.iter().map(Cell::median_us).collect();
            let best_peer = us[1..]
                .iter()
                .copied()
                .filter(|x| x.is_finite())
                .fold(f64::INFINITY, f64::min);
            let mut cells_txt = vec![load.title()];
            cells_txt.extend(us.iter().map(|&x| num(x)));
            cells_txt.push(if best_peer.is_finite() {
                ratio(us[0], best_peer)
            } else {
                "—".into()
            });
            t.row(cells_txt);
        }
        t.notes.push(format!(
            "Server CPU = user + system time of the server's whole process tree (/proc/PID/stat \
             of it and every descendant, read before and after each run) divided by the requests \
             the client completed; medians of {} interleaved rounds (order alternating) after \
             one warm-up round. Every server: one worker (qweb `workers = 1`, nginx \
             `worker_processes 1`, h2o `num-threads: 1`, Caddy `GOMAXPROCS=1`), its process \
             tree pinned to CPU {SERVER_CPU}; wrk, h2load (`-t1`) and this crate's HTTP/3 \
             client (one runtime thread) pinned to CPU {CLIENT_CPU}. The handshake row is \
             per connection (one request each); the gzip row's servers compress at level \
             {GZIP_LEVEL} on the fly, the HTTP/3 row's serve HTTP/3 too, each a server of its \
             own beside G's others (idle meanwhile). Requests/s, server CPU % and errors of \
             each cell, and what limits each row, are in the tables below.",
            self.g_rounds_n()
        ));
        t
    }

    /// G's table for one load: a row per server (medians of its runs, ratios vs h2o and
    /// nginx), each also recorded as a [`Measured`] and a bar of `chart`.
    pub(super) fn g_table(
        &mut self,
        load: Load,
        kinds: &[(String, ServerKind)],
        cells: &[Cell],
        chart: &mut [(String, Vec<f64>)],
    ) -> Table {
        let meds: Vec<f64> = cells
            .iter()
            .map(|c| c.median(|r| r.run.req_per_sec))
            .collect();
        let (ngx, h2o) = (meds[1], meds[2]);
        let mut t = Table::new(
            format!("G. {} ({} workers)", load.title(), self.workers),
            &[
                "server",
                "server CPU µs / request",
                "requests/s",
                "MiB/s",
                "vs h2o",
                "vs nginx",
                "server CPU %",
                "client CPU %",
                "requests checked",
                "client TLS",
                "problems",
            ],
        );
        let mut sizes = Vec::new();
        for (si, (label, _)) in kinds.iter().enumerate() {
            let cell = &cells[si];
            let Cell {
                runs,
                problems,
                missing,
                body,
                tls_seen,
            } = cell;
            let f = |g: fn(&GRun) -> f64| cell.median(g);
            chart[si].1.push(meds[si]);
            let skipped = problems.iter().any(|p| p.starts_with("skipped"));
            let real: Vec<&String> = problems
                .iter()
                .filter(|p| !p.starts_with("skipped"))
                .collect();
            if let (Load::WrkGzip(..), Some(b)) = (load, body) {
                sizes.push(format!("{label} {b}"));
            }
            for p in &real {
                self.failures
                    .push(format!("G {label} {}: {p}", load.title()));
            }
            let note = if let (Some(why), true) = (missing, runs.is_empty()) {
                if why.starts_with("skipped") {
                    self.skipped
                        .push(format!("G {label} {}: {why}", load.title()));
                }
                why.clone()
            } else if skipped && runs.is_empty() {
                let why = problems[0].clone();
                self.skipped
                    .push(format!("G {label} {}: {why}", load.title()));
                why
            } else if runs.is_empty() {
                self.why_missing(label)
            } else if real.is_empty() {
                "none".into()
            } else {
                format!("{} (see Problems)", real.len())
            };
            t.row(vec![
                label.clone(),
                num(cell.median_us()),
                num(meds[si]),
                num(f(|r| r.run.mib_per_sec)),
                ratio(meds[si], h2o),
                ratio(meds[si], ngx),
                num(f(|r| r.server_pct)),
                num(f(|r| r.client_pct)),
                runs.iter().map(|r| r.run.requests).sum::<u64>().to_string(),
                match load {
                    Load::WrkPlain(..) => "—".into(),
                    Load::WrkTls(..) | Load::WrkGzip(..) => tls_seen.clone().unwrap_or_default(),
                    Load::H2(..) | Load::Handshakes(..) | Load::H3(..) => runs
                        .first()
                        .and_then(|r| r.run.tls.clone())
                        .unwrap_or_default(),
                },
                note,
            ]);
            let mut m = Measured::missing("G", &format!("{label} {}", load.title()));
            m.ops_per_sec = meds[si];
            m.mib_per_sec = f(|r| r.run.mib_per_sec);
            m.server_cpu_pct = f(|r| r.server_pct);
            m.client_cpu_pct = f(|r| r.client_pct);
            m.errors = real.len() as u64;
            m.commands = runs.iter().map(|r| r.run.command.clone()).collect();
            self.measured.push(m);
        }
        t.notes.push(load.limits());
        if !sizes.is_empty() {
            t.notes.push(format!(
                "gzip body bytes per response (compressed from {} B): {}.",
                self.files.sizes.get(load.file()).copied().unwrap_or(0),
                sizes.join(", ")
            ));
        }
        t
    }

    /// How G was run, under its first table.
    pub(super) fn g_note(&self) -> String {
        format!(
            "Every server: {} worker (qweb worker threads, nginx worker processes, h2o \
             `num-threads`, Caddy `GOMAXPROCS`) pinned to CPU {SERVER_CPU}, the client on CPU \
             {CLIENT_CPU}, access logs off, no TLS session resumption \
             (qweb `resumption = false`, nginx cache and tickets off, h2o \
             `ssl-session-resumption: off`, Caddy `session_tickets.disabled`), the same \
             RSA-2048 certificate and files, `keepalive_requests 10000000` in nginx. wrk: \
             {} s per round, `-t{}`; its byte count (exact, from a Lua `done` hook) must be \
             one body plus a header per request, every status 2xx/3xx, no socket error. \
             h2load: a request count per round (not a duration): the warm-up's rate × {} s, \
             at least {}; every one 2xx and exactly n × size data bytes. The handshake row: \
             `h2load --h1 -n{HANDSHAKES} -c{HANDSHAKES}` (a tenth in the warm-up), every \
             connection new, one request, TLS as h2load's OpenSSL negotiates it (the client \
             TLS column). The gzip row: wrk with `-H 'Accept-Encoding: gzip'`, each server's \
             compressed size taken from a probe (which checks gzip and the trailer's length) \
             as the body of the byte check. The HTTP/3 row: `qweb-bench load --http 3` with \
             `--threads {CLIENT_THREADS}`, a count as h2load's, no warm-up within a run, every \
             body checked. Medians over {} interleaved round(s) after one warm-up round.",
            self.workers,
            self.profile.wrk_secs,
            CLIENT_THREADS,
            self.profile.wrk_secs,
            self.profile.h2_requests,
            self.g_rounds_n()
        )
    }

    /// Syscalls per request of each server (strace -c -f during a wrk run).
    pub(super) fn exp_g_syscalls(&mut self, cert: &CertFiles) {
        let Some(strace) = self.strace.clone() else {
            self.skip_section("G. Syscalls per request", "strace not installed");
            return;
        };
        let mut t = Table::new(
            "G. Syscalls per request under strace -c -f (not a speed measure: strace slows the server)",
            &["server", "load", "requests", "syscalls", "per request", "failed per request", "top syscalls per request"],
        );
        let kinds = self.four_servers();
        for (label, kind) in &kinds {
            let Some(server) = self.start(label, kind, cert) else {
                continue;
            };
            for load in [Load::WrkPlain("1k.bin", 8), Load::WrkTls("1k.bin", 8)] {
                let pids = server.pids();
                let out = self.out.join("logs").join(format!(
                    "strace-{label}-{}.txt",
                    matches!(load, Load::WrkTls(..))
                ));
                let tracer = match Tracer::attach(&strace, &pids, &out) {
                    Ok(t) => t,
                    Err(e) => {
                        self.failures.push(format!("G strace {label}: {e}"));
                        continue;
                    }
                };
                let body = self.files.sizes.get(load.file()).copied().unwrap_or(0);
                let run = self.run_client(&server, load, self.profile.wrk_secs.min(2), 0, body);
                let sum = tracer.finish();
                match (run, sum) {
                    (Ok(GRun { run, .. }), Ok(sum))
                        if run.problems.is_empty() && run.requests > 0 =>
                    {
                        let n = run.requests as f64;
                        let mut rows = sum.rows.clone();
                        rows.sort_by_key(|r| std::cmp::Reverse(r.calls));
                        let top: Vec<String> = rows
                            .iter()
                            .take(6)
                            .map(|r| format!("{} {:.1}", r.name, r.calls as f64 / n))
                            .collect();
                        t.row(vec![
                            label.clone(),
                            load.title(),
                            run.requests.to_string(),
                            sum.calls.to_string(),
                            num(sum.calls as f64 / n),
                            num(sum.errors as f64 / n),
                            top.join(", "),
                        ]);
                    }
                    (Ok(GRun { run, .. }), _) if !run.problems.is_empty() => self
                        .failures
                        .push(format!("G strace {label}: {}", run.problems.join("; "))),
                    (Err(e), _) | (_, Err(e)) => {
                        self.failures.push(format!("G strace {label}: {e}"))
                    }
                    _ => self
                        .failures
                        .push(format!("G strace {label}: no request completed")),
                }
            }
        }
        t.notes.push(
            "`strace -c -f -p PID` attached to the server (all threads; nginx: master and workers) \
             during a wrk run (2 s; 1 s in the quick profile) with 8 connections; syscalls counted by strace divided by the \
             requests wrk completed; the six most frequent per request. Connection setup is \
             included (8 connections per run)."
                .into(),
        );
        self.section(t, None);
    }
}
