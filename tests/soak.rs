//! Soak: the real `qweb serve` child process under normal load, then the same normal load
//! alongside a mix of hostile clients (non-reading HTTP/1.1 clients, zero-window HTTP/2
//! clients, control-frame floods, ClientHello-and-vanish, mid-response aborts, slowloris,
//! rapid reset, PING floods, smuggling attempts, QUIC garbage datagrams and half-open QUIC
//! handshakes), then a cool-down. Checks that normal clients keep their latency and see no
//! errors, and that the server's file descriptors and memory come back afterwards.
//!
//! Minutes long, so not run in CI:
//!
//! ```text
//! QWEB_SOAK_SECS=60 cargo test --release --test soak -- --ignored --nocapture soak_hostile
//! QWEB_SOAK_SECS=15 cargo test --release --test soak -- --ignored --nocapture soak_each_class
//! ```
//!
//! `QWEB_SOAK_SECS` (default 60) is the length of the baseline and of the hostile phase;
//! `QWEB_SOAK_RATE` (default 250) is each normal client's request rate per second (8
//! clients): the normal load is paced so that it does not saturate the machine on its own.
//! `QWEB_SOAK_HOSTILE` picks hostile classes (see `soak/hostile.rs`' `HOSTILE_CLASSES`;
//! `abort` is both aborters, `quic` both QUIC classes), `QWEB_SOAK_HOSTILE_NICE` (default 19)
//! their thread's nice value, `QWEB_SOAK_QUIC_RATE` (5000) and `QWEB_SOAK_HALFOPEN_RATE` (20)
//! the QUIC classes' datagrams and handshakes a second, and `QWEB_SOAK_LIMITS` adds
//! `[limits]` lines to qweb's config (e.g. `write_burst = "16KiB"`), to find which attack costs
//! the normal clients what. `soak_each_class` runs each chosen class alone, each after a quiet
//! phase of its own, `QWEB_SOAK_ROUNDS` times (default 1), then all of them together, and
//! prints the normal clients' p99 and the server's CPU time a second for each.
#![allow(unsafe_code)] // libc calls on test processes and files; each block has its SAFETY note

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use qweb_testkit::process::{rss_kib, serve_command, Qweb, BANNER_END};
use qweb_testkit::tls::{connect, proto_builder, tls_client_config as tls_config};
use qweb_testkit::tls::{Proto, TlsStream};

#[path = "soak/hostile.rs"]
mod hostile;
#[path = "soak/quic.rs"]
mod quic;

use hostile::{hostile_classes, hostile_nice, start_hostile, Hostile};

const BIN: &str = env!("CARGO_BIN_EXE_qweb");
const SEND_TIMEOUT: Duration = Duration::from_secs(5);
const BIG: u64 = 10 << 20;
/// Normal clients: 4 HTTP/1.1 over TLS, 4 HTTP/2, one keep-alive connection each.
const NORMAL_CLIENTS: usize = 8;
/// Slack added to the p99 bound: p99 on 2 shared cores jumps by milliseconds on a scheduler
/// hiccup.
const P99_SLACK: Duration = Duration::from_millis(5);
/// How many more descriptors than the baseline the server may hold after the cool-down.
const FD_SLACK: usize = 4;
/// How much more resident memory than the baseline the server may hold after the cool-down.
/// qweb runs on mimalloc, which gives freed pages back (the stalled HTTP/2 streams alone hold
/// 4 x 64 x 16 KiB at peak); glibc's malloc kept about 10 MiB of the peak for good.
const RSS_SLACK_KIB: u64 = 8 << 10;
/// How much the server's RSS may grow after the hostile load ends (over its sampled peak).
const RSS_AFTER_PEAK_SLACK_KIB: u64 = 4 << 10;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

// ---- the server process ----

struct Server {
    q: Qweb,
    https: SocketAddr,
    http: SocketAddr,
    cert: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start() -> Server {
        let dir = tempfile::tempdir().unwrap();
        let site = dir.path().join("site");
        std::fs::create_dir(&site).unwrap();
        std::fs::write(site.join("small"), vec![b'x'; 1024]).unwrap();
        std::fs::write(site.join("big"), vec![b'y'; BIG as usize]).unwrap();
        let state = dir.path().join("state");
        let cfg = dir.path().join("q.toml");
        std::fs::write(
            &cfg,
            format!(
                "workers = 2\nstate_dir = \"{}\"\nshutdown_timeout = \"5s\"\n\
                 [log]\naccess = false\n\
                 [limits]\nsend_timeout = \"5s\"\n{}\n\
                 [[listener]]\naddress = \"127.0.0.1:0\"\nhttp3 = true\n\
                 [listener.tls]\nself_signed = true\n\
                 [[listener]]\naddress = \"127.0.0.1:0\"\n\
                 [[route]]\nprefix = \"/\"\nroot = \"{}\"\n",
                state.display(),
                // extra `[limits]` lines, e.g. `write_burst = "16KiB"`, to compare settings
                std::env::var("QWEB_SOAK_LIMITS").unwrap_or_default(),
                site.display()
            ),
        )
        .unwrap();
        let mut cmd = serve_command(BIN, &cfg);
        cmd.current_dir(dir.path());
        // `QWEB_SOAK_SERVER_LOG=debug`: the server's own log filter (the kit removes RUST_LOG)
        if let Ok(filter) = std::env::var("QWEB_SOAK_SERVER_LOG") {
            cmd.env("RUST_LOG", filter);
        }
        // the kit's reader keeps draining stderr (the server must never block on a full
        // pipe) and keeps what it says under load for the report
        let q = Qweb::spawn(cmd, BANNER_END);
        let (https, http) = (q.socket_addr("https"), q.socket_addr("http"));
        Server {
            q,
            https,
            http,
            cert: state.join("selfsigned.crt"),
            _dir: dir,
        }
    }

    fn pid(&self) -> u32 {
        self.q.pid()
    }

    /// Resident memory, KiB.
    fn rss_kib(&self) -> u64 {
        rss_kib(self.pid())
    }

    /// What it wrote on stderr after its banner.
    fn stderr_lines(&self) -> Vec<String> {
        self.q.lines().split_off(self.q.banner.len())
    }

    fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .unwrap()
            .count()
    }

    fn alive(&mut self) -> bool {
        self.q.child().try_wait().unwrap().is_none()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.q.terminate(Duration::from_secs(10));
    }
}

// ---- TLS and clients ----

fn client(ca: &Path, proto: Proto) -> reqwest::Client {
    proto_builder(tls_config(ca, proto), proto)
        .pool_idle_timeout(Duration::from_secs(600))
        .build()
        .unwrap()
}

type Tls = TlsStream;

async fn tls_connect(addr: SocketAddr, cfg: &Arc<rustls::ClientConfig>) -> std::io::Result<Tls> {
    connect(addr, cfg).await
}

// ---- normal load ----

#[derive(Default)]
struct Normal {
    /// Request latencies, microseconds.
    lat_us: Vec<u32>,
    errors: u64,
    first_errors: Vec<String>,
    elapsed: Duration,
    /// The server's CPU time (user + system) over the phase, milliseconds a second.
    cpu_ms_s: f64,
}

impl Normal {
    fn pct(&self, p: f64) -> Duration {
        let mut v = self.lat_us.clone();
        v.sort_unstable();
        if v.is_empty() {
            return Duration::ZERO;
        }
        let i = ((v.len() - 1) as f64 * p / 100.0).round() as usize;
        Duration::from_micros(u64::from(v[i]))
    }
    fn rate(&self) -> f64 {
        self.lat_us.len() as f64 / self.elapsed.as_secs_f64()
    }
}

/// Runs the normal clients for `len`: each fetches the 1 KiB file `rate` times per second
/// (or as fast as it can, if slower), on its own keep-alive connection.
async fn normal_load(clients: &[reqwest::Client], url: &str, len: Duration, rate: u64) -> Normal {
    let start = Instant::now();
    let end = start + len;
    let mut tasks = Vec::new();
    for c in clients {
        let c = c.clone();
        let url = url.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut out = Normal::default();
            let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / rate.max(1)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            while Instant::now() < end {
                tick.tick().await;
                let t0 = Instant::now();
                let r = async {
                    let r = c.get(&url).send().await?.error_for_status()?;
                    r.bytes().await
                }
                .await;
                let took = t0.elapsed();
                match r {
                    Ok(b) if b.len() == 1024 => out
                        .lat_us
                        .push(took.as_micros().min(u32::MAX as u128) as u32),
                    Ok(b) => {
                        out.errors += 1;
                        if out.first_errors.len() < 5 {
                            out.first_errors
                                .push(format!("short body: {} bytes", b.len()));
                        }
                    }
                    Err(e) => {
                        out.errors += 1;
                        if out.first_errors.len() < 5 {
                            out.first_errors.push(format!("{e:?}"));
                        }
                    }
                }
            }
            out
        }));
    }
    let mut all = Normal::default();
    for t in tasks {
        let n = t.await.unwrap();
        all.lat_us.extend(n.lat_us);
        all.errors += n.errors;
        all.first_errors.extend(n.first_errors);
    }
    all.elapsed = start.elapsed();
    all
}

/// The CPU time (user + system) process `pid` has used, in milliseconds.
fn cpu_ms(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // after the command's `(...)`: state is field 3, utime 14, stime 15
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    // SAFETY: sysconf(3) reads a constant; no memory is passed.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
    ticks as f64 * 1000.0 / hz as f64
}

/// [`normal_load`], with the server's CPU time over it.
async fn measured(s: &Server, clients: &[reqwest::Client], url: &str, len: Duration) -> Normal {
    let rate = env_u64("QWEB_SOAK_RATE", 250);
    let before = cpu_ms(s.pid());
    let mut n = normal_load(clients, url, len, rate).await;
    n.cpu_ms_s = (cpu_ms(s.pid()) - before) / n.elapsed.as_secs_f64();
    n
}

// ---- hostile clients: soak/hostile.rs, soak/quic.rs ----

// ---- the soak ----

struct Row {
    phase: &'static str,
    normal: Option<Normal>,
    rss_kib: u64,
    fds: usize,
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn table(rows: &[Row]) -> String {
    let mut t = String::from(
        "| phase | normal req/s | p50 | p99 | errors | server CPU | server RSS | server fds |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let (rate, p50, p99, errors, cpu) = match &r.normal {
            Some(n) => (
                format!("{:.0}", n.rate()),
                ms(n.pct(50.0)),
                ms(n.pct(99.0)),
                n.errors.to_string(),
                format!("{:.0} ms/s", n.cpu_ms_s),
            ),
            None => ("-".into(), "-".into(), "-".into(), "-".into(), "-".into()),
        };
        t.push_str(&format!(
            "| {} | {rate} | {p50} | {p99} | {errors} | {cpu} | {:.1} MiB | {} |\n",
            r.phase,
            r.rss_kib as f64 / 1024.0,
            r.fds
        ));
    }
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes long: QWEB_SOAK_SECS=60 cargo test --release --test soak -- --ignored --nocapture soak_hostile"]
async fn soak_hostile_clients_alongside_normal_load() {
    let secs = env_u64("QWEB_SOAK_SECS", 60);
    let rate = env_u64("QWEB_SOAK_RATE", 250);
    let phase_len = Duration::from_secs(secs);
    let cool_down = Duration::from_secs(15);
    let classes = hostile_classes();
    let mut s = Server::start();
    eprintln!(
        "soak: qweb pid {} on https://{} and http://{}; {secs} s per phase, {NORMAL_CLIENTS} \
         normal clients at up to {rate} req/s each; hostile classes {classes:?} at nice {}",
        s.pid(),
        s.https,
        s.http,
        hostile_nice(),
    );
    let clients: Vec<reqwest::Client> = (0..NORMAL_CLIENTS)
        .map(|i| client(&s.cert, if i % 2 == 0 { Proto::H1 } else { Proto::H2 }))
        .collect();
    let url = format!("https://localhost:{}/small", s.https.port());
    // warm-up: every normal client holds its connection
    let warm = normal_load(&clients, &url, Duration::from_secs(2), rate).await;
    assert_eq!(warm.errors, 0, "warm-up errors: {:?}", warm.first_errors);
    let mut rows = vec![Row {
        phase: "start (after 2 s warm-up)",
        normal: None,
        rss_kib: s.rss_kib(),
        fds: s.fds(),
    }];

    // A: baseline
    let a = measured(&s, &clients, &url, phase_len).await;
    rows.push(Row {
        phase: "A: normal load only",
        normal: Some(a),
        rss_kib: s.rss_kib(),
        fds: s.fds(),
    });

    // B: the same normal load with hostile clients
    let hostile = Arc::new(Hostile::default());
    let hostile_rt = start_hostile(&s, &hostile, &classes);
    let sampler = {
        let pid = s.pid();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = stop.clone();
        let t = std::thread::spawn(move || {
            let (mut peak_rss, mut peak_fds) = (0u64, 0usize);
            while !stop2.load(Ordering::Relaxed) {
                if let Ok(st) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
                    let rss = st
                        .lines()
                        .find_map(|l| l.strip_prefix("VmRSS:"))
                        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                        .unwrap_or(0);
                    peak_rss = peak_rss.max(rss);
                }
                if let Ok(d) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
                    peak_fds = peak_fds.max(d.count());
                }
                std::thread::sleep(Duration::from_millis(250));
            }
            (peak_rss, peak_fds)
        });
        (stop, t)
    };
    let b = measured(&s, &clients, &url, phase_len).await;
    let (rss_b, fds_b) = (s.rss_kib(), s.fds());
    // drops every hostile task and with it its sockets
    hostile_rt.shutdown_background();
    sampler.0.store(true, Ordering::Relaxed);
    let (peak_rss, peak_fds) = sampler.1.join().unwrap();
    rows.push(Row {
        phase: "B: normal + hostile",
        normal: Some(b),
        rss_kib: rss_b,
        fds: fds_b,
    });
    rows.push(Row {
        phase: "B: peak (sampled every 250 ms)",
        normal: None,
        rss_kib: peak_rss,
        fds: peak_fds,
    });

    // C: cool-down, normal load only
    let c = measured(&s, &clients, &url, cool_down).await;
    rows.push(Row {
        phase: "C: cool-down (normal load only)",
        normal: Some(c),
        rss_kib: s.rss_kib(),
        fds: s.fds(),
    });
    let alive = s.alive();

    eprintln!("\n{}", table(&rows));
    eprintln!("hostile clients in phase B: {}", hostile.report());
    {
        let lines = s.stderr_lines();
        eprintln!("qweb wrote {} stderr lines under load", lines.len());
        for l in lines.iter().take(10) {
            eprintln!("  {l}");
        }
    }

    assert!(alive, "qweb exited during the soak");
    if classes.contains(&"flood") {
        // floods are logged, at most once per peer address per minute per worker
        let lines = s.stderr_lines();
        let floods = lines
            .iter()
            .filter(|l| l.contains("control-frame flood"))
            .count();
        assert!(
            floods >= 1,
            "no flood was logged: {:?}",
            &lines[..lines.len().min(10)]
        );
    }
    let n = |i: usize| rows[i].normal.as_ref().unwrap();
    let (a, b, c) = (n(1), n(2), n(4));
    for (name, p) in [("A", a), ("B", b), ("C", c)] {
        assert_eq!(
            p.errors, 0,
            "phase {name}: normal clients saw {} errors, first: {:?}",
            p.errors, p.first_errors
        );
    }
    let bound = a.pct(99.0) * 2 + P99_SLACK;
    assert!(
        b.pct(99.0) <= bound,
        "normal clients' p99 under hostile load {:?} > 2 x baseline p99 {:?} + {:?}",
        b.pct(99.0),
        a.pct(99.0),
        P99_SLACK
    );
    let (start, end) = (&rows[0], &rows[4]);
    assert!(
        end.fds <= start.fds + FD_SLACK,
        "server fds after the cool-down {} > baseline {} + {FD_SLACK}",
        end.fds,
        start.fds
    );
    assert!(
        end.rss_kib <= rows[3].rss_kib + RSS_AFTER_PEAK_SLACK_KIB,
        "server RSS grew after the hostile load ended: {} KiB after the cool-down, {} KiB peak \
         under load",
        end.rss_kib,
        rows[3].rss_kib
    );
    assert!(
        end.rss_kib <= start.rss_kib + RSS_SLACK_KIB,
        "server RSS after the cool-down {} KiB > baseline {} KiB + {} KiB",
        end.rss_kib,
        start.rss_kib,
        RSS_SLACK_KIB
    );
    let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
    assert_eq!(
        g(&hostile.h1_not_cut),
        0,
        "non-reading HTTP/1.1 clients the server did not cut: {}",
        hostile.report()
    );
    assert_eq!(
        g(&hostile.h2_zero_window_open),
        0,
        "zero-window HTTP/2 connections left open: {}",
        hostile.report()
    );
    assert_eq!(
        g(&hostile.floods_other),
        0,
        "floods that did not end with ENHANCE_YOUR_CALM: {}",
        hostile.report()
    );
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Each hostile class alone, then all together: for each, a quiet phase (normal load only),
/// then the class's phase, then `QWEB_SOAK_SETTLE` seconds (12) for what it left to end (not
/// measured). Prints the normal
/// clients' p99 in both, their ratio and the server's CPU time a second; with
/// `QWEB_SOAK_ROUNDS` > 1 the medians over the rounds. Asserts only, at the end, that the
/// normal clients saw no errors: this is a measurement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes long: QWEB_SOAK_SECS=15 cargo test --release --test soak -- --ignored --nocapture soak_each_class"]
async fn soak_each_class() {
    let secs = env_u64("QWEB_SOAK_SECS", 15);
    let rounds = env_u64("QWEB_SOAK_ROUNDS", 1);
    let len = Duration::from_secs(secs);
    let classes = hostile_classes();
    let mut s = Server::start();
    eprintln!(
        "soak_each_class: qweb pid {}; {secs} s per phase, {rounds} round(s), classes \
         {classes:?} at nice {}",
        s.pid(),
        hostile_nice()
    );
    let clients: Vec<reqwest::Client> = (0..NORMAL_CLIENTS)
        .map(|i| client(&s.cert, if i % 2 == 0 { Proto::H1 } else { Proto::H2 }))
        .collect();
    let url = format!("https://localhost:{}/small", s.https.port());
    let warm = measured(&s, &clients, &url, Duration::from_secs(2)).await;
    assert_eq!(warm.errors, 0, "warm-up errors: {:?}", warm.first_errors);
    let mut sets: Vec<(String, Vec<&str>)> =
        classes.iter().map(|c| (c.to_string(), vec![*c])).collect();
    if classes.len() > 1 {
        sets.push(("all".into(), classes.clone()));
    }
    // `QWEB_SOAK_ALL_ONLY=1`: only every class at once (the figure issue 41 item 5 is about)
    if std::env::var_os("QWEB_SOAK_ALL_ONLY").is_some() && sets.len() > 1 {
        sets.drain(..sets.len() - 1);
    }
    // per set: quiet p99 (ms), hostile p99, quiet CPU, hostile CPU (ms/s)
    let mut got: Vec<[Vec<f64>; 4]> = sets.iter().map(|_| Default::default()).collect();
    let mut errors = Vec::new();
    for round in 0..rounds {
        for (i, (name, set)) in sets.iter().enumerate() {
            let q = measured(&s, &clients, &url, len).await;
            let hostile = Arc::new(Hostile::default());
            let rt = start_hostile(&s, &hostile, set);
            let b = measured(&s, &clients, &url, len).await;
            rt.shutdown_background();
            for (phase, n) in [("quiet", &q), (name.as_str(), &b)] {
                if n.errors > 0 {
                    eprintln!("{phase}: {} normal errors: {:?}", n.errors, n.first_errors);
                    // what the server said about connections it ended (RUST_LOG=debug)
                    for l in s.stderr_lines().iter().filter(|l| {
                        l.contains("qweb_server") && !l.contains("Connection reset by peer")
                    }) {
                        eprintln!("  server: {l}");
                    }
                    errors.push(format!(
                        "{phase}: {} errors, {:?}",
                        n.errors, n.first_errors
                    ));
                }
            }
            let p99 = |n: &Normal| n.pct(99.0).as_secs_f64() * 1000.0;
            eprintln!(
                "round {round} {name}: p99 {:.2} -> {:.2} ms ({:.1}x), server CPU {:.0} -> \
                 {:.0} ms/s; {}",
                p99(&q),
                p99(&b),
                p99(&b) / p99(&q),
                q.cpu_ms_s,
                b.cpu_ms_s,
                hostile.report()
            );
            for (v, x) in got[i]
                .iter_mut()
                .zip([p99(&q), p99(&b), q.cpu_ms_s, b.cpu_ms_s])
            {
                v.push(x);
            }
            // what the class left (half-open handshakes, heads never finished) ends within the
            // 10 s handshake and header timeouts: the next quiet phase starts after them
            tokio::time::sleep(Duration::from_secs(env_u64("QWEB_SOAK_SETTLE", 12))).await;
        }
    }
    let mut t = String::from(
        "| hostile classes | p99 quiet | p99 with them | ratio | server CPU quiet | with them | \
         added |\n|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for ((name, _), g) in sets.iter().zip(got.iter_mut()) {
        let [q, b, qc, bc] = g;
        let (q, b, qc, bc) = (median(q), median(b), median(qc), median(bc));
        t.push_str(&format!(
            "| `{name}` | {q:.2} ms | {b:.2} ms | {:.1}x | {qc:.0} ms/s | {bc:.0} ms/s | {:.0} ms/s |\n",
            b / q,
            bc - qc
        ));
    }
    eprintln!("\nmedians over {rounds} round(s), {secs} s phases:\n{t}");
    assert!(s.alive(), "qweb exited during the soak");
    assert!(errors.is_empty(), "normal clients saw errors: {errors:?}");
}
