//! Experiment G: what every request costs, with the external clients the peers are usually
//! measured with: 1 KiB over plain HTTP/1.1 and over HTTPS (wrk, keep-alive), 100 KiB over
//! HTTP/2 with 10 streams per connection (h2load, a request count), 1 MiB HTTPS transfers
//! (wrk); qweb, nginx, h2o and Caddy interleaved. Then syscalls per request (`strace -c`
//! during a wrk run) in a table of its own, since strace slows the traced server.

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

/// The runs (with server and client CPU %) and problems of one (load, server) cell of G.
#[derive(Default)]
struct Cell {
    runs: Vec<(ClientRun, f64, f64)>,
    problems: Vec<String>,
}

impl Load {
    fn title(self) -> String {
        match self {
            Load::WrkPlain(f, c) => format!("{f} plain HTTP/1.1 keep-alive (wrk -c{c})"),
            Load::WrkTls(f, c) => format!("{f} HTTPS HTTP/1.1 keep-alive (wrk -c{c})"),
            Load::H2(f, c, m) => format!("{f} HTTPS h2, {c} conns × {m} streams (h2load)"),
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

    /// Runs one external load against `server`; the run and server/client CPU %.
    fn run_client(
        &self,
        server: &ServerProc,
        load: Load,
        secs: u64,
        requests: u64,
    ) -> Result<(ClientRun, f64, f64)> {
        let threads = crate::cpus();
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
        let scpu = (server.cpu_secs() - s0) / wall * 100.0;
        let ccpu = (children_cpu_secs() - c0) / wall * 100.0;
        eprintln!(
            "  {:<12} {:<48} {:>9.0} req/s {:>8.1} MiB/s srv {:>4.0}% cli {:>4.0}% {}",
            server.name,
            load.title(),
            run.req_per_sec,
            run.mib_per_sec,
            scpu,
            ccpu,
            if run.problems.is_empty() {
                "ok".to_string()
            } else {
                run.problems.join("; ")
            }
        );
        Ok((run, scpu, ccpu))
    }

    pub(super) fn exp_g(&mut self) -> Result<()> {
        let cert = self.rsa.clone();
        let kinds = self.four_servers();
        let servers: Vec<Option<ServerProc>> =
            kinds.iter().map(|(l, k)| self.start(l, k, &cert)).collect();
        // What wrk's OpenSSL negotiates with each server (openssl s_client, default settings).
        let tls_seen: Vec<Option<String>> = servers
            .iter()
            .map(|s| s.as_ref().and_then(|s| clients::openssl_negotiates(s.port)))
            .collect();
        let loads = [
            Load::WrkPlain("1k.bin", 32),
            Load::WrkTls("1k.bin", 32),
            Load::H2("100k.bin", 8, 10),
            Load::WrkTls("1m.bin", 8),
        ];
        let cells = self.g_rounds(&servers, &loads);
        drop(servers);
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
        for round in 0..=self.profile.rounds {
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
                let (s, count) = if warm { (1, h2n / 10) } else { (secs, h2n) };
                let cell = &mut cells[i];
                match self.run_client(server, loads[li], s, count) {
                    Ok((run, scpu, ccpu)) => {
                        cell.problems.extend(run.problems.iter().cloned());
                        if !warm {
                            cell.runs.push((run, scpu, ccpu));
                        }
                    }
                    Err(Error::Other(m)) if m.starts_with("skipped") => cell.problems.push(m),
                    Err(e) => cell.problems.push(e.to_string()),
                }
            }
        }
        cells
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
            .map(|c| median(&c.runs.iter().map(|r| r.0.req_per_sec).collect::<Vec<_>>()))
            .collect();
        let (ngx, h2o) = (meds[1], meds[2]);
        let mut t = Table::new(
            format!("G. {} ({} workers)", load.title(), self.workers),
            &[
                "server",
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
            let Cell { runs, problems } = &cells[si];
            let f = |g: fn(&(ClientRun, f64, f64)) -> f64| {
                median(&runs.iter().map(g).collect::<Vec<_>>())
            };
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
                num(meds[si]),
                num(f(|r| r.0.mib_per_sec)),
                ratio(meds[si], h2o),
                ratio(meds[si], ngx),
                num(f(|r| r.1)),
                num(f(|r| r.2)),
                runs.iter().map(|r| r.0.requests).sum::<u64>().to_string(),
                match load {
                    Load::WrkPlain(..) => "—".into(),
                    Load::WrkTls(..) => tls_seen[si].clone().unwrap_or_default(),
                    Load::H2(..) => runs
                        .first()
                        .and_then(|r| r.0.tls.clone())
                        .unwrap_or_default(),
                },
                note,
            ]);
            let mut m = Measured::missing("G", &format!("{label} {}", load.title()));
            m.ops_per_sec = meds[si];
            m.mib_per_sec = f(|r| r.0.mib_per_sec);
            m.server_cpu_pct = f(|r| r.1);
            m.client_cpu_pct = f(|r| r.2);
            m.errors = real.len() as u64;
            m.commands = runs.iter().map(|r| r.0.command.clone()).collect();
            self.measured.push(m);
        }
        t
    }

    /// How G was run, under its first table.
    fn g_note(&self) -> String {
        format!(
            "Every server: {} workers (qweb worker threads, nginx worker processes, h2o \
             `num-threads`, Caddy `GOMAXPROCS`), access logs off, no TLS session resumption \
             (qweb `resumption = false`, nginx cache and tickets off, h2o \
             `ssl-session-resumption: off`, Caddy `session_tickets.disabled`), the same \
             RSA-2048 certificate and files, `keepalive_requests 10000000` in nginx. wrk: \
             {} s per round, `-t{}`; its byte count (exact, from a Lua `done` hook) must be \
             one body plus a header per request, every status 2xx/3xx, no socket error. \
             h2load: `-n {}` requests per round (a count, not a duration), every one 2xx and \
             exactly n × size data bytes. Medians over {} interleaved round(s) after one \
             warm-up round.",
            self.workers,
            self.profile.wrk_secs,
            crate::cpus(),
            self.profile.h2_requests,
            self.profile.rounds
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
                    (Ok((run, _, _)), Ok(sum)) if run.problems.is_empty() && run.requests > 0 => {
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
                    (Ok((run, _, _)), _) if !run.problems.is_empty() => self
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
