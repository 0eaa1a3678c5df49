//! Soak: the real `qweb serve` child process under normal load, then the same normal load
//! alongside a mix of hostile clients (non-reading HTTP/1.1 clients, zero-window HTTP/2
//! clients, control-frame floods, ClientHello-and-vanish, mid-response aborts), then a
//! cool-down. Checks that normal clients keep their latency and see no errors, and that the
//! server's file descriptors and memory come back afterwards.
//!
//! Minutes long, so not run in CI:
//!
//! ```text
//! QWEB_SOAK_SECS=60 cargo test --release --test soak -- --ignored --nocapture
//! ```
//!
//! `QWEB_SOAK_SECS` (default 60) is the length of the baseline and of the hostile phase;
//! `QWEB_SOAK_RATE` (default 250) is each normal client's request rate per second (8
//! clients): the normal load is paced so that it does not saturate the machine on its own.
//! `QWEB_SOAK_HOSTILE` picks hostile classes (`nonread,zerowindow,flood,vanish,abort_h1,
//! abort_h2`; `abort` is both aborters), `QWEB_SOAK_HOSTILE_NICE` (default 19) their thread's
//! nice value, and `QWEB_SOAK_LIMITS` adds `[limits]` lines to qweb's config (e.g.
//! `write_burst = "16KiB"`), to find which attack costs the normal clients what.
#![allow(unsafe_code)] // libc calls on test processes and files; each block has its SAFETY note

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use qweb_testkit::h2frames::{frame, get, hello, read_frames};
use qweb_testkit::process::{rss_kib, serve_command, Qweb, BANNER_END};
use qweb_testkit::tls::{connect, localhost, proto_builder, tls_client_config as tls_config};
use qweb_testkit::tls::{Proto, TlsStream};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

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
                 [[listener]]\naddress = \"127.0.0.1:0\"\n[listener.tls]\nself_signed = true\n\
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

// ---- hostile clients ----

#[derive(Default)]
struct Hostile {
    h1_stalled: AtomicU64,
    h1_cut: AtomicU64,
    h1_not_cut: AtomicU64,
    h2_zero_window_conns: AtomicU64,
    h2_zero_window_closed: AtomicU64,
    h2_zero_window_open: AtomicU64,
    floods: AtomicU64,
    floods_calmed: AtomicU64,
    floods_other: AtomicU64,
    vanished: AtomicU64,
    aborts: AtomicU64,
    abort_errors: AtomicU64,
    connect_errors: AtomicU64,
}

impl Hostile {
    fn report(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "non-reading h1 connections: {} (cut by the server: {}, not cut: {}); \
             zero-window h2 connections: {} (closed by the server: {}, still open after 15 s: {}); \
             control-frame floods: {} (GOAWAY ENHANCE_YOUR_CALM: {}, other ending: {}); \
             ClientHello/TCP-and-vanish: {}; mid-response aborts: {} (failed before the abort: {}); \
             connect/handshake errors: {}",
            g(&self.h1_stalled),
            g(&self.h1_cut),
            g(&self.h1_not_cut),
            g(&self.h2_zero_window_conns),
            g(&self.h2_zero_window_closed),
            g(&self.h2_zero_window_open),
            g(&self.floods),
            g(&self.floods_calmed),
            g(&self.floods_other),
            g(&self.vanished),
            g(&self.aborts),
            g(&self.abort_errors),
            g(&self.connect_errors),
        )
    }
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// Asks for the 10 MB file and never reads; after the send timeout (plus a margin) drains
/// what the kernel buffered and checks that the server closed the connection.
async fn non_reading_h1(addr: SocketAddr, tls: Option<Arc<rustls::ClientConfig>>, h: &Hostile) {
    loop {
        let sock = TcpSocket::new_v4().unwrap();
        // a small receive buffer: the 10 MB must not fit in the socket buffers
        let _ = sock.set_recv_buffer_size(64 << 10);
        let tcp = match sock.connect(addr).await {
            Ok(t) => t,
            Err(_) => {
                h.connect_errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let mut s: Box<dyn Io> = match &tls {
            None => Box::new(tcp),
            Some(cfg) => {
                match tokio_rustls::TlsConnector::from(cfg.clone())
                    .connect(localhost(), tcp)
                    .await
                {
                    Ok(t) => Box::new(t),
                    Err(_) => {
                        h.connect_errors.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                }
            }
        };
        if s.write_all(b"GET /big HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .await
            .is_err()
        {
            h.connect_errors.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        h.h1_stalled.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(SEND_TIMEOUT + Duration::from_secs(2)).await;
        let mut n = 0u64;
        let mut buf = vec![0u8; 1 << 16];
        let ended = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(k) => n += k as u64,
                }
            }
        })
        .await;
        if ended.is_ok() && n < BIG {
            h.h1_cut.fetch_add(1, Ordering::Relaxed);
        } else {
            h.h1_not_cut.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// 64 streams for the 10 MB file with an initial window of 0; waits for the server to reset
/// them and close the connection, then reconnects.
async fn zero_window_h2(addr: SocketAddr, cfg: Arc<rustls::ClientConfig>, h: &Hostile) {
    loop {
        let Ok(mut tls) = tls_connect(addr, &cfg).await else {
            h.connect_errors.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut out = hello(&[(0x4, 0)]);
        for i in 0..64u32 {
            out.extend(get(1 + 2 * i, "/big"));
        }
        if tls.write_all(&out).await.is_err() {
            h.connect_errors.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        h.h2_zero_window_conns.fetch_add(1, Ordering::Relaxed);
        let seen = read_frames(&mut tls, SEND_TIMEOUT * 3).await;
        if seen.eof {
            h.h2_zero_window_closed.fetch_add(1, Ordering::Relaxed);
        } else {
            h.h2_zero_window_open.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Bursts of 3000 PINGs, SETTINGS or WINDOW_UPDATEs (in turn) on a fresh connection; expects
/// GOAWAY ENHANCE_YOUR_CALM.
async fn control_flood(addr: SocketAddr, cfg: Arc<rustls::ClientConfig>, h: &Hostile) {
    let kinds = [
        frame(0x6, 0, 0, &[7; 8]),
        frame(0x4, 0, 0, &[]),
        frame(0x8, 0, 0, &1u32.to_be_bytes()),
    ];
    for round in 0.. {
        let Ok(tls) = tls_connect(addr, &cfg).await else {
            h.connect_errors.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut burst = hello(&[]);
        for _ in 0..3000 {
            burst.extend_from_slice(&kinds[round % kinds.len()]);
        }
        let (mut rd, mut wr) = tokio::io::split(tls);
        let reader =
            tokio::spawn(async move { read_frames(&mut rd, Duration::from_secs(10)).await });
        let _ = wr.write_all(&burst).await;
        let seen = reader.await.unwrap();
        h.floods.fetch_add(1, Ordering::Relaxed);
        if seen.goaway == Some(0xb) && seen.eof {
            h.floods_calmed.fetch_add(1, Ordering::Relaxed);
        } else {
            h.floods_other.fetch_add(1, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A real ClientHello then close; a TCP connect with a few bytes then close; a bare TCP
/// connect and close: in turn, 50 a second.
async fn vanish(https: SocketAddr, http: SocketAddr, cfg: Arc<rustls::ClientConfig>, h: &Hostile) {
    for round in 0u64.. {
        let target = if round % 3 == 2 { http } else { https };
        if let Ok(mut s) = TcpStream::connect(target).await {
            match round % 3 {
                0 => {
                    let mut conn = rustls::ClientConnection::new(cfg.clone(), localhost())
                        .expect("client connection");
                    let mut ch = Vec::new();
                    while conn.wants_write() {
                        conn.write_tls(&mut ch).unwrap();
                    }
                    let _ = s.write_all(&ch).await;
                }
                1 => {
                    let _ = s.write_all(b"\x16\x03\x01\x00").await;
                }
                _ => {
                    let _ = s.write_all(b"GET /sm").await;
                }
            }
            drop(s);
            h.vanished.fetch_add(1, Ordering::Relaxed);
        } else {
            h.connect_errors.fetch_add(1, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Starts downloading the 10 MB file, reads about 1 MB, drops the response (HTTP/1.1: the
/// connection is closed; HTTP/2: the stream is reset).
async fn abort_mid_response(url: String, c: reqwest::Client, h: &Hostile) {
    loop {
        let ok = async {
            let mut r = c.get(&url).send().await.ok()?;
            let mut n = 0;
            while n < 1 << 20 {
                n += r.chunk().await.ok()??.len();
            }
            Some(())
        }
        .await;
        h.aborts.fetch_add(1, Ordering::Relaxed);
        if ok.is_none() {
            h.abort_errors.fetch_add(1, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The hostile classes `QWEB_SOAK_HOSTILE` (a comma-separated list) may name; all by default.
/// (`abort` is `abort_h1` and `abort_h2`).
const HOSTILE_CLASSES: [&str; 6] = [
    "nonread",
    "zerowindow",
    "flood",
    "vanish",
    "abort_h1",
    "abort_h2",
];

/// Which hostile classes run: `QWEB_SOAK_HOSTILE=nonread,flood` runs only those two (to see
/// which one costs the normal clients what); unset or `all`: every class.
fn hostile_classes() -> Vec<&'static str> {
    match std::env::var("QWEB_SOAK_HOSTILE") {
        Ok(v) if v != "all" => {
            let want: Vec<&str> = v
                .split(',')
                .map(str::trim)
                .flat_map(|c| match c {
                    "abort" => vec!["abort_h1", "abort_h2"],
                    c => vec![c],
                })
                .collect();
            for w in &want {
                assert!(
                    HOSTILE_CLASSES.contains(w),
                    "QWEB_SOAK_HOSTILE: unknown class {w:?}; known: {HOSTILE_CLASSES:?}"
                );
            }
            HOSTILE_CLASSES
                .into_iter()
                .filter(|c| want.contains(c))
                .collect()
        }
        _ => HOSTILE_CLASSES.to_vec(),
    }
}

/// Nice value of the hostile clients' thread (`QWEB_SOAK_HOSTILE_NICE`, default 19). The
/// attackers share the server's two cores here; in the field their CPU is theirs. At the lowest
/// priority their own TLS and framing work does not delay the normal clients' threads, so the
/// normal clients' latency measures what qweb's handling of the attack costs them. `0` runs
/// them at the normal clients' priority.
fn hostile_nice() -> i32 {
    std::env::var("QWEB_SOAK_HOSTILE_NICE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(19)
}

/// Starts every hostile client of the chosen classes on a runtime of its own (one thread, at
/// [`hostile_nice`], so that the hostile clients' work does not queue up in front of the normal
/// clients' tasks); they run until the runtime is shut down.
fn start_hostile(s: &Server, h: &Arc<Hostile>, classes: &[&str]) -> tokio::runtime::Runtime {
    let nice = hostile_nice();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .on_thread_start(move || {
            // SAFETY: setpriority(2) on the calling thread (who = 0: on Linux the nice value
            // is per thread); no memory is passed.
            let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) };
            assert_eq!(rc, 0, "setpriority({nice}) for the hostile thread failed");
        })
        .enable_all()
        .build()
        .unwrap();
    let on = |c: &str| classes.contains(&c);
    let h1 = Arc::new(tls_config(&s.cert, Proto::H1));
    let h2 = Arc::new(tls_config(&s.cert, Proto::H2));
    // 8 non-reading HTTP/1.1 clients: 4 plain, 4 over TLS
    for i in (0..8).filter(|_| on("nonread")) {
        let (h, addr) = (h.clone(), if i % 2 == 0 { s.http } else { s.https });
        let tls = (i % 2 == 1).then(|| h1.clone());
        rt.spawn(async move { non_reading_h1(addr, tls, &h).await });
    }
    // 4 zero-window HTTP/2 connections of 64 streams each
    for _ in (0..4).filter(|_| on("zerowindow")) {
        let (h, cfg, addr) = (h.clone(), h2.clone(), s.https);
        rt.spawn(async move { zero_window_h2(addr, cfg, &h).await });
    }
    // 2 flooders
    for _ in (0..2).filter(|_| on("flood")) {
        let (h, cfg, addr) = (h.clone(), h2.clone(), s.https);
        rt.spawn(async move { control_flood(addr, cfg, &h).await });
    }
    // 1 ClientHello-and-vanish loop
    if on("vanish") {
        let (h, cfg, https, http) = (h.clone(), h1.clone(), s.https, s.http);
        rt.spawn(async move { vanish(https, http, cfg, &h).await });
    }
    // 2 mid-response aborters: one HTTP/1.1, one HTTP/2
    let aborters = [(Proto::H1, "abort_h1"), (Proto::H2, "abort_h2")];
    for (proto, _) in aborters.into_iter().filter(|(_, c)| on(c)) {
        let h = h.clone();
        let c = client(&s.cert, proto);
        let url = format!("https://localhost:{}/big", s.https.port());
        rt.spawn(async move { abort_mid_response(url, c, &h).await });
    }
    rt
}

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
        "| phase | normal req/s | p50 | p99 | errors | server RSS | server fds |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let (rate, p50, p99, errors) = match &r.normal {
            Some(n) => (
                format!("{:.0}", n.rate()),
                ms(n.pct(50.0)),
                ms(n.pct(99.0)),
                n.errors.to_string(),
            ),
            None => ("-".into(), "-".into(), "-".into(), "-".into()),
        };
        t.push_str(&format!(
            "| {} | {rate} | {p50} | {p99} | {errors} | {:.1} MiB | {} |\n",
            r.phase,
            r.rss_kib as f64 / 1024.0,
            r.fds
        ));
    }
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes long: QWEB_SOAK_SECS=60 cargo test --release --test soak -- --ignored --nocapture"]
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
    let a = normal_load(&clients, &url, phase_len, rate).await;
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
    let b = normal_load(&clients, &url, phase_len, rate).await;
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
    let c = normal_load(&clients, &url, cool_down, rate).await;
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
