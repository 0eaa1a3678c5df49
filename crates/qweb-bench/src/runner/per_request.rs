//! Experiment G: what every request costs the server, with the external clients the peers are
//! usually measured with: 1 KiB over plain HTTP/1.1 and over HTTPS (wrk, keep-alive), 1 KiB
//! over HTTP/2 with 16 streams per connection and 100 KiB with 10 (h2load, a request count),
//! 1 MiB HTTPS transfers (wrk); qweb, nginx, h2o and Caddy interleaved.
//!
//! The pinned method of issue 37: every server runs one worker and its whole process tree is
//! pinned to CPU 0; the load generator (this process's main thread, inherited by wrk and
//! h2load) to CPU 1. The figure is the server's CPU time (user + system of the whole tree, from
//! /proc, read before and after each run) divided by the requests the client completed.
//! Then syscalls per request (`strace -c` during a wrk run) in a table of its own, since
//! strace slows the traced server.

use super::*;
use crate::clients::h2load::{self, H2loadSpec};
use crate::clients::strace::Tracer;
use crate::clients::wrk::{self, WrkSpec};
use crate::clients::ClientRun;

/// One row of G: which client, which file, how many connections.
#[derive(Debug, Clone, Copy)]
enum Load {
    /// wrk over plain HTTP/1.1.
    WrkPlain(&'static str, usize),
    /// wrk over HTTPS (HTTP/1.1).
    WrkTls(&'static str, usize),
    /// h2load over HTTPS h2: file, connections, streams per connection.
    H2(&'static str, usize, usize),
}

/// One measured run of G: the client's figures, server and client CPU %, and the server's
/// CPU µs per completed request.
struct GRun {
    run: ClientRun,
    server_pct: f64,
    client_pct: f64,
    server_us_per_req: f64,
}

/// The runs and problems of one (load, server) cell of G.
#[derive(Default)]
struct Cell {
    runs: Vec<GRun>,
    problems: Vec<String>,
}

/// The CPU G's servers are pinned to, and the one its load generator is pinned to.
const SERVER_CPU: usize = 0;
const CLIENT_CPU: usize = 1;
/// wrk's and h2load's threads in G (`-t`): one, on [`CLIENT_CPU`].
const CLIENT_THREADS: usize = 1;

impl Load {
    fn title(self) -> String {
        match self {
            Load::WrkPlain(f, c) => format!("{f} plain HTTP/1.1 keep-alive (wrk -t1 -c{c})"),
            Load::WrkTls(f, c) => format!("{f} HTTPS HTTP/1.1 keep-alive (wrk -t1 -c{c})"),
            Load::H2(f, c, m) => {
                format!("{f} HTTPS h2, {c} conns × {m} streams (h2load -t1 -c{c} -m{m})")
            }
        }
    }
}

/// CPU seconds used so far by this process's waited-for children (wrk, h2load).
#[allow(unsafe_code)]
fn children_cpu_secs() -> f64 {
    // SAFETY: getrusage writes the plain struct passed by pointer.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) != 0 {
            return 0.0;
        }
        let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
        t(ru.ru_utime) + t(ru.ru_stime)
    }
}

impl Cell {
    /// The median of `g` over the cell's runs (NaN when none).
    fn median(&self, g: fn(&GRun) -> f64) -> f64 {
        median(&self.runs.iter().map(g).collect::<Vec<_>>())
    }

    /// The median server CPU µs per request.
    fn median_us(&self) -> f64 {
        self.median(|r| r.server_us_per_req)
    }
}

impl Runner {
    /// Why a server of `label` has no numbers: its "skipped: not available" note, or that it
    /// did not start (the reason is under Problems).
    pub(super) fn why_missing(&self, label: &str) -> String {
        let prefix = format!("{label}: ");
        self.skipped
            .iter()
            .find_map(|s| s.strip_prefix(&prefix))
            .map(str::to_string)
            .unwrap_or_else(|| "did not run (see Problems)".into())
    }

    /// The four servers of G, H's peers and F, each with the RSA-2048 certificate's settings.
    pub(super) fn four_servers(&self) -> Vec<(String, ServerKind)> {
        vec![
            ("qweb".into(), self.qweb_none()),
            ("nginx".into(), ServerKind::nginx(None)),
            ("h2o".into(), ServerKind::H2o { resumption: false }),
            ("caddy".into(), ServerKind::Caddy),
        ]
    }

    /// Runs one external load (one client thread) against `server`; the run, server/client
    /// CPU % and server CPU µs per completed request.
    fn run_client(
        &self,
        server: &ServerProc,
        load: Load,
        secs: u64,
        requests: u64,
    ) -> Result<GRun> {
        let threads = CLIENT_THREADS;
        let tls_port = server.port;
        let plain_port = server.plain_port.unwrap_or(1);
        let (s0, c0, t0) = (server.cpu_secs(), children_cpu_secs(), Instant::now());
        let run = match load {
            Load::WrkPlain(file, conns) | Load::WrkTls(file, conns) => {
                let url = match load {
                    Load::WrkPlain(..) => format!("http://127.0.0.1:{plain_port}/{file}"),
                    _ => format!("https://127.0.0.1:{tls_port}/{file}"),
                };
                let bin = self
                    .wrk
                    .clone()
                    .ok_or_else(|| Error::Other("skipped: wrk not installed".into()))?;
                wrk::run(&WrkSpec {
                    bin,
                    url,
                    connections: conns,
                    threads,
                    duration_secs: secs,
                    body_bytes: self.files.sizes[file],
                    script: self.out.join("wrk-done.lua"),
                })?
            }
            Load::H2(file, conns, streams) => {
                let bin = self
                    .h2load
                    .clone()
                    .ok_or_else(|| Error::Other("skipped: h2load not installed".into()))?;
                h2load::run(&H2loadSpec {
                    bin,
                    url: format!("https://127.0.0.1:{tls_port}/{file}"),
                    requests,
                    connections: conns,
                    streams,
                    threads,
                    body_bytes: self.files.sizes[file],
                })?
            }
        };
        let wall = t0.elapsed().as_secs_f64().max(1e-9);
        let server_secs = server.cpu_secs() - s0;
        let scpu = server_secs / wall * 100.0;
        let ccpu = (children_cpu_secs() - c0) / wall * 100.0;
        let us = if run.requests > 0 {
            server_secs * 1e6 / run.requests as f64
        } else {
            f64::NAN
        };
        eprintln!(
            "  {:<12} {:<48} {:>9.0} req/s {:>7.1} µs/req srv {:>4.0}% cli {:>4.0}% {}",
            server.name,
            load.title(),
            run.req_per_sec,
            us,
            scpu,
            ccpu,
            if run.problems.is_empty() {
                "ok".to_string()
            } else {
                run.problems.join("; ")
            }
        );
        Ok(GRun {
            run,
            server_pct: scpu,
            client_pct: ccpu,
            server_us_per_req: us,
        })
    }

    pub(super) fn exp_g(&mut self) -> Result<()> {
        let workers = std::mem::replace(&mut self.workers, 1);
        let r = self.exp_g_pinned();
        self.workers = workers;
        r
    }

    /// G with one worker per server: servers on [`SERVER_CPU`], clients on [`CLIENT_CPU`].
    fn exp_g_pinned(&mut self) -> Result<()> {
        let cert = self.rsa.clone();
        let kinds = self.four_servers();
        let mut servers: Vec<Option<ServerProc>> =
            kinds.iter().map(|(l, k)| self.start(l, k, &cert)).collect();
        for slot in servers.iter_mut() {
            if let Some(s) = slot.as_ref() {
                if let Err(e) = s.pin_to(SERVER_CPU) {
                    self.failures.push(format!("G {}: {e}", s.name));
                    *slot = None;
                }
            }
        }
        // wrk and h2load are spawned from this thread and inherit its affinity.
        crate::procs::pin_thread(0, CLIENT_CPU)
            .map_err(|e| Error::io("pin the load generator to CPU 1", e))?;
        // What wrk's OpenSSL negotiates with each server (openssl s_client, default settings).
        let tls_seen: Vec<Option<String>> = servers
            .iter()
            .map(|s| s.as_ref().and_then(|s| clients::openssl_negotiates(s.port)))
            .collect();
        let loads = [
            Load::WrkPlain("1k.bin", 32),
            Load::WrkTls("1k.bin", 32),
            Load::H2("1k.bin", 8, 16),
            Load::H2("100k.bin", 8, 10),
            Load::WrkTls("1m.bin", 8),
        ];
        let cells = self.g_rounds(&servers, &loads);
        drop(servers);
        if let Err(e) = crate::procs::unpin_thread(0) {
            self.failures.push(format!("G: unpin the runner: {e}"));
        }
        self.section(self.g_summary(&loads, &kinds, &cells), None);
        // One table per load, a row per server, ratios vs h2o and vs nginx.
        let mut tables = Vec::new();
        let mut chart_cats = Vec::new();
        let mut chart: Vec<(String, Vec<f64>)> =
            kinds.iter().map(|(l, _)| (l.clone(), vec![])).collect();
        for (li, load) in loads.iter().enumerate() {
            let row = &cells[li * kinds.len()..(li + 1) * kinds.len()];
            chart_cats.push(load.title());
            tables.push(self.g_table(*load, &kinds, row, &tls_seen, &mut chart));
        }
        if let Some(t) = tables.first_mut() {
            t.notes.push(self.g_note());
        }
        for t in tables {
            self.section(t, None);
        }
        self.write_chart(
            "g-per-request.svg",
            &svg::bar_chart(
                "G. Requests/s per server",
                "requests/s",
                &chart_cats,
                &chart,
            ),
        );
        self.sections.push("![G](g-per-request.svg)\n".into());
        self.exp_g_syscalls(&cert);
        Ok(())
    }

    /// A warm-up round, then `rounds` interleaved rounds (alternating direction) of every
    /// (load, server) cell; cell `li * servers + si` holds its runs and problems.
    fn g_rounds(&mut self, servers: &[Option<ServerProc>], loads: &[Load]) -> Vec<Cell> {
        let secs = self.profile.wrk_secs;
        let h2n = self.profile.h2_requests;
        let n = loads.len() * servers.len();
        let mut cells: Vec<Cell> = (0..n).map(|_| Cell::default()).collect();
        let mut rate = vec![0.0f64; n];
        for round in 0..=self.g_rounds_n() {
            // Warm-up: one short run per server and load (checked like any other).
            let warm = round == 0;
            let order: Vec<usize> = if round % 2 == 1 {
                (0..n).collect()
            } else {
                (0..n).rev().collect()
            };
            for i in order {
                let (li, si) = (i / servers.len(), i % servers.len());
                let Some(server) = servers[si].as_ref() else {
                    continue;
                };
                // h2load runs by count: sized from the warm-up's rate to last about `secs`
                // (at least the profile's count), so CPU ticks (10 ms) stay a small error.
                let (s, count) = if warm {
                    (1, h2n / 10)
                } else {
                    (secs, h2n.max((rate[i] * secs as f64) as u64))
                };
                let cell = &mut cells[i];
                match self.run_client(server, loads[li], s, count) {
                    Ok(g) => {
                        cell.problems.extend(g.run.problems.iter().cloned());
                        if warm {
                            rate[i] = g.run.req_per_sec;
                        } else {
                            cell.runs.push(g);
                        }
                    }
                    Err(Error::Other(m)) if m.starts_with("skipped") => cell.problems.push(m),
                    Err(e) => cell.problems.push(e.to_string()),
                }
            }
        }
        cells
    }

    /// Measured rounds of G: the profile's, at least 3 outside the quick profile.
    fn g_rounds_n(&self) -> usize {
        if self.profile.name == "quick" {
            self.profile.rounds
        } else {
            self.profile.rounds.max(3)
        }
    }

    /// G's first table: server CPU µs per request, a row per load, a column per server, and
    /// qweb's figure over the best peer's.
    fn g_summary(&self, loads: &[Load], kinds: &[(String, ServerKind)], cells: &[Cell]) -> Table {
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
             tree pinned to CPU {SERVER_CPU}; wrk and h2load (`-t1`) pinned to CPU \
             {CLIENT_CPU}. Requests/s, server CPU % and errors of each cell are in the \
             tables below.",
            self.g_rounds_n()
        ));
        t
    }

    /// G's table for one load: a row per server (medians of its runs, ratios vs h2o and
    /// nginx), each also recorded as a [`Measured`] and a bar of `chart`.
    fn g_table(
        &mut self,
        load: Load,
        kinds: &[(String, ServerKind)],
        cells: &[Cell],
        tls_seen: &[Option<String>],
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
        for (si, (label, _)) in kinds.iter().enumerate() {
            let cell = &cells[si];
            let Cell { runs, problems } = cell;
            let f = |g: fn(&GRun) -> f64| cell.median(g);
            chart[si].1.push(meds[si]);
            let skipped = problems.iter().any(|p| p.starts_with("skipped"));
            let real: Vec<&String> = problems
                .iter()
                .filter(|p| !p.starts_with("skipped"))
                .collect();
            for p in &real {
                self.failures
                    .push(format!("G {label} {}: {p}", load.title()));
            }
            let note = if skipped && runs.is_empty() {
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
                    Load::WrkTls(..) => tls_seen[si].clone().unwrap_or_default(),
                    Load::H2(..) => runs
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
        t
    }

    /// How G was run, under its first table.
    fn g_note(&self) -> String {
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
             at least {}; every one 2xx and exactly n × size data bytes. Medians over {} interleaved round(s) after one \
             warm-up round.",
            self.workers,
            self.profile.wrk_secs,
            CLIENT_THREADS,
            self.profile.wrk_secs,
            self.profile.h2_requests,
            self.g_rounds_n()
        )
    }

    /// Syscalls per request of each server (strace -c -f during a wrk run).
    fn exp_g_syscalls(&mut self, cert: &CertFiles) {
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
                let run = self.run_client(&server, load, self.profile.wrk_secs.min(2), 0);
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
