//! Experiment G: what every request costs the server, with the external clients the peers are
//! usually measured with: 1 KiB over plain HTTP/1.1 and over HTTPS (wrk, keep-alive), 1 KiB
//! over HTTP/2 with 16 streams per connection and 100 KiB with 10 (h2load, a request count),
//! 1 MiB HTTPS transfers (wrk), a 100 KiB HTML page gzipped at level 1 on the fly (wrk with
//! `Accept-Encoding: gzip`, servers configured for it), full TLS 1.3 handshakes with one
//! request each (h2load `--h1`, one connection per request) and 1 KiB over HTTP/3 (this
//! crate's own client: h2load here has no QUIC); qweb, nginx, h2o and Caddy interleaved.
//!
//! The pinned method of issue 37: every server runs one worker and its whole process tree is
//! pinned to CPU 0; the load generator (this process's main thread, inherited by wrk and
//! h2load) to CPU 1. The figure is the server's CPU time (user + system of the whole tree, from
//! /proc, read before and after each run) divided by the requests the client completed.
//! Then syscalls per request (`strace -c` during a wrk run) in a table of its own, since
//! strace slows the traced server.

use super::*;
use crate::clients::h2load::{self, H2loadSpec};
use crate::clients::wrk::{self, WrkSpec};
use crate::clients::ClientRun;

mod report;

/// One row of G: which client, which file, how many connections.
#[derive(Debug, Clone, Copy)]
enum Load {
    /// wrk over plain HTTP/1.1.
    WrkPlain(&'static str, usize),
    /// wrk over HTTPS (HTTP/1.1).
    WrkTls(&'static str, usize),
    /// h2load over HTTPS h2: file, connections, streams per connection.
    H2(&'static str, usize, usize),
    /// wrk over HTTPS (HTTP/1.1) with `Accept-Encoding: gzip`: file, connections; the servers
    /// of [`Setup::Gzip`] compress every response anew at gzip level 1.
    WrkGzip(&'static str, usize),
    /// h2load `--h1` over HTTPS: this many connections, each a full TLS handshake (no
    /// resumption) and one request of the file, then closed.
    Handshakes(&'static str, usize),
    /// This crate's load generator over HTTP/3: file, connections, streams per connection.
    H3(&'static str, usize, usize),
}

/// How the servers of a row are configured: G's own servers, the same with gzip level 1 on
/// the fly, or with HTTP/3 on too (qweb's and Caddy's responses then carry `Alt-Svc`, so
/// only the HTTP/3 row runs against those).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Setup {
    Plain,
    Gzip,
    Http3,
}

/// G's servers of one [`Setup`]: per server (qweb, nginx, h2o, Caddy), the process, or why
/// there is none; and what wrk's OpenSSL negotiates with it.
struct GSet {
    setup: Setup,
    servers: Vec<Option<ServerProc>>,
    why: Vec<Option<String>>,
    tls_seen: Vec<Option<String>>,
}

/// One measured run of G: the client's figures, server and client CPU %, and the server's
/// CPU µs per completed request.
struct GRun {
    run: ClientRun,
    server_pct: f64,
    client_pct: f64,
    server_us_per_req: f64,
}

/// The runs and problems of one (load, server) cell of G; why it has no server (n/a, skipped,
/// did not start), and the body bytes each response must carry.
#[derive(Default)]
struct Cell {
    runs: Vec<GRun>,
    problems: Vec<String>,
    missing: Option<String>,
    body: Option<u64>,
    /// What wrk's OpenSSL negotiates with the cell's server.
    tls_seen: Option<String>,
}

/// The CPU G's servers are pinned to, and the one its load generator is pinned to.
const SERVER_CPU: usize = 0;
const CLIENT_CPU: usize = 1;
/// wrk's and h2load's threads in G (`-t`), and the runtime threads of this crate's client
/// (HTTP/3 row): one, on [`CLIENT_CPU`].
const CLIENT_THREADS: usize = 1;
/// Connections of the handshake row, each one full handshake and one request.
const HANDSHAKES: usize = 2000;
/// The gzip level of the gzip row, in every server.
const GZIP_LEVEL: u32 = 1;
/// qweb's `[compression]` for the gzip row: gzip only, at [`GZIP_LEVEL`], on the worker
/// (`engine = "inline"`, `sync`), no cache of compressed variants and no precompressed files,
/// so every response is compressed anew as nginx, h2o and Caddy do.
fn qweb_gzip_section() -> String {
    format!(
        "[compression]\nenabled = true\ncodecs = [\"gzip\"]\ntypes = [\"text/*\"]\n\
         mode = \"sync\"\nengine = \"inline\"\ncache_size = 0\nprecompressed = false\n\n\
         [compression.levels]\ngzip = {GZIP_LEVEL}\n"
    )
}

impl Load {
    fn title(self) -> String {
        match self {
            Load::WrkPlain(f, c) => format!("{f} plain HTTP/1.1 keep-alive (wrk -t1 -c{c})"),
            Load::WrkTls(f, c) => format!("{f} HTTPS HTTP/1.1 keep-alive (wrk -t1 -c{c})"),
            Load::H2(f, c, m) => {
                format!("{f} HTTPS h2, {c} conns × {m} streams (h2load -t1 -c{c} -m{m})")
            }
            Load::WrkGzip(f, c) => format!(
                "{f} gzip level {GZIP_LEVEL} on the fly, HTTPS HTTP/1.1 (wrk -t1 -c{c}, Accept-Encoding: gzip)"
            ),
            Load::Handshakes(f, n) => format!(
                "full TLS 1.3 handshake RSA-2048 + 1 request of {f}, per connection (h2load --h1 -t1 -n{n} -c{n})"
            ),
            Load::H3(f, c, m) => format!(
                "{f} HTTP/3, {c} conns × {m} streams (qweb-bench load --http 3 --threads 1)"
            ),
        }
    }

    /// The servers this row runs against.
    fn setup(self) -> Setup {
        match self {
            Load::WrkGzip(..) => Setup::Gzip,
            Load::H3(..) => Setup::Http3,
            _ => Setup::Plain,
        }
    }

    /// The file every request asks for.
    fn file(self) -> &'static str {
        match self {
            Load::WrkPlain(f, _)
            | Load::WrkTls(f, _)
            | Load::H2(f, ..)
            | Load::WrkGzip(f, _)
            | Load::Handshakes(f, _)
            | Load::H3(f, ..) => f,
        }
    }

    /// What bounds the row's figures, under its table.
    fn limits(self) -> String {
        match self {
            Load::WrkTls("1m.bin", _) => "What limits it: bytes: AES-GCM over 1 MiB per response \
                 and the copies into the socket (no sendfile under TLS without kTLS); the kernel's \
                 TCP send path over loopback is a large share of every server's system time."
                .into(),
            Load::WrkPlain(..) | Load::WrkTls(..) => "What limits it: one wrk thread on CPU 1 \
                 drives every connection; a server cheaper than wrk per request leaves CPU 0 idle \
                 (server CPU % under 100) and its requests/s is wrk's, while its µs per request \
                 still holds. HTTPS adds the TLS records of one 1 KiB response each way; the \
                 suite each server chose with wrk's OpenSSL is in the client TLS column."
                .into(),
            Load::H2("1k.bin", ..) => {
                "What limits it: HTTP/2 framing, HPACK and the scheduling of \
                 16 concurrent streams per connection, not bytes (1 KiB bodies); one h2load \
                 thread, which can be the bottleneck for the cheaper servers (client CPU %)."
                    .into()
            }
            Load::H2(..) => "What limits it: bytes: AES-GCM over 100 KiB per response and the \
                 copies to the socket (no sendfile under TLS without kTLS); flow-control \
                 windows (each server's own) set how many DATA frames and WINDOW_UPDATEs a \
                 response takes."
                .into(),
            Load::WrkGzip(..) => format!(
                "What limits it: deflate of the 100 KiB page at level {GZIP_LEVEL} (zlib in \
                 nginx and h2o, Go's compress/flate in Caddy, zlib-rs through flate2 in qweb), \
                 hundreds of µs against a few µs for the TLS records of the compressed body. The \
                 same level is not the same work: zlib-rs, like zlib-ng, runs a quicker, less \
                 thorough matcher at level 1 than zlib's, so qweb's output is larger (the sizes \
                 below); qweb's 64 KiB chunks, each primed with the previous 32 KiB, cost little. \
                 Every response is compressed anew: qweb `cache_size = 0` and \
                 `precompressed = false`, nginx `gzip_static` off (its default), h2o without \
                 `file.send-compressed`, Caddy without `precompressed`. The byte check allows \
                 each response the size the server sent to a probe, plus headers and chunk \
                 framing (under 1 KiB)."
            ),
            Load::Handshakes(..) => "What limits it: the server's RSA-2048 signature, most of \
                 the figure (`openssl speed rsa2048` gives its own cost on the machine; Go's is \
                 slower), then the X25519 exchange, the certificate, one request and the \
                 close; per connection, as every connection makes exactly one request. h2load opens all connections \
                 at once and the kernel retransmits some of their SYNs (on the 2-vCPU machine of \
                 docs/BENCHMARKS.md, 730 to 860 TcpExtTCPSynRetrans per run of 2000, with no \
                 listen-queue overflow), and neither CPU is saturated in this row: requests/s \
                 here is not a handshake rate (experiment A measures that), the CPU per \
                 connection is the figure. No resumption anywhere (G's servers have it off, \
                 and each h2load connection is a new client); qweb's handshake counter must match the \
                 requests and its resumed counter stay 0."
                .into(),
            Load::H3(..) => "What limits it: QUIC in user space: packet protection and UDP \
                 sends of one or two packets per response, acknowledgements and stream \
                 bookkeeping (quinn in qweb, quic-go in Caddy); this crate's client (quinn + h3, \
                 one runtime thread on CPU 1) is heavier per request than h2load, so it may \
                 bound requests/s (client CPU %). nginx and h2o: n/a (their cells say why)."
                .into(),
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
            ("h2o".into(), ServerKind::h2o()),
            ("caddy".into(), ServerKind::caddy()),
        ]
    }

    /// G's four servers as configured for `setup`, each a kind or why it has none ("n/a: ..."
    /// or "skipped: ...").
    fn g_kinds(&self, setup: Setup) -> Vec<(String, std::result::Result<ServerKind, String>)> {
        let mut kinds: Vec<(String, std::result::Result<ServerKind, String>)> = self
            .four_servers()
            .into_iter()
            .map(|(l, k)| (l, Ok(k)))
            .collect();
        let set = |kinds: &mut Vec<(String, _)>, i: usize, k| {
            if let Some(slot) = kinds.get_mut(i) {
                slot.1 = k;
            }
        };
        match setup {
            Setup::Plain => {}
            Setup::Gzip => {
                let qweb = match &self.compression {
                    Feature::Available(_) => {
                        Ok(ServerKind::qweb(Offload::None, Some(qweb_gzip_section())))
                    }
                    Feature::Missing(why) => Err(format!("skipped: not available ({why})")),
                };
                set(&mut kinds, 0, qweb);
                set(&mut kinds, 1, Ok(ServerKind::nginx(Some(GZIP_LEVEL))));
                set(
                    &mut kinds,
                    2,
                    Ok(ServerKind::H2o {
                        resumption: false,
                        gzip_level: Some(GZIP_LEVEL),
                    }),
                );
                set(
                    &mut kinds,
                    3,
                    Ok(ServerKind::Caddy {
                        gzip_level: Some(GZIP_LEVEL),
                    }),
                );
            }
            Setup::Http3 => {
                let nginx = match &self.nginx {
                    Some(n) if n.version < (1, 25, 0) => format!(
                        "n/a: nginx {}.{}.{} has no HTTP/3 (it came in 1.25)",
                        n.version.0, n.version.1, n.version.2
                    ),
                    _ => "n/a: nginx's HTTP/3 is not configured here".into(),
                };
                set(&mut kinds, 1, Err(nginx));
                let h2o_version = self
                    .h2o
                    .as_ref()
                    .ok()
                    .and_then(|i| crate::peers::h2o::parse_version(&i.version_text));
                let h2o = match h2o_version {
                    Some(v) if ["2.0", "2.1", "2.2"].iter().any(|p| v.starts_with(p)) => {
                        format!("n/a: h2o {v} has no HTTP/3 (it came in 2.3)")
                    }
                    _ => "n/a: h2o's HTTP/3 is not configured here".into(),
                };
                set(&mut kinds, 2, Err(h2o));
            }
        }
        kinds
    }

    /// Starts G's servers of `setup`, each pinned to [`SERVER_CPU`], and asks each TLS
    /// listener what wrk's OpenSSL negotiates.
    fn g_start(&mut self, setup: Setup, cert: &CertFiles) -> GSet {
        let mut set = GSet {
            setup,
            servers: vec![],
            why: vec![],
            tls_seen: vec![],
        };
        let suffix = match setup {
            Setup::Plain => "",
            Setup::Gzip => " gzip",
            Setup::Http3 => " http3",
        };
        for (label, kind) in self.g_kinds(setup) {
            let start_label = format!("{label}{suffix}");
            let (server, why) = match kind {
                Err(why) => (None, Some(why)),
                Ok(kind) => {
                    self.http3 = setup == Setup::Http3;
                    let s = self.start(&start_label, &kind, cert);
                    self.http3 = false;
                    match s {
                        None => (None, Some(self.why_missing(&start_label))),
                        Some(s) => match s.pin_to(SERVER_CPU) {
                            Ok(()) => (Some(s), None),
                            Err(e) => {
                                self.failures.push(format!("G {}: {e}", s.name));
                                (None, Some("did not run (see Problems)".into()))
                            }
                        },
                    }
                }
            };
            // What wrk's OpenSSL negotiates (openssl s_client, default settings).
            let tls = match (&server, setup) {
                (Some(s), Setup::Plain | Setup::Gzip) => clients::openssl_negotiates(s.port),
                _ => None,
            };
            set.servers.push(server);
            set.why.push(why);
            set.tls_seen.push(tls);
        }
        set
    }

    /// The size of `file` gzipped by `server` (one request with `Accept-Encoding: gzip`, whose
    /// answer must be gzip with the file's length in its trailer), or why not.
    fn g_gzip_size(&self, server: &ServerProc, file: &str) -> std::result::Result<u64, String> {
        let mut spec = self.base_spec(server.port, file, Mode::Keepalive);
        spec.connections = 1;
        spec.warmup = 0.0;
        spec.count = Some(1);
        spec.threads = Some(CLIENT_THREADS);
        spec.accept_encoding = Some("gzip".into());
        spec.expect_encoding = Some("gzip".into());
        spec.expect_gzip_size = self.files.sizes.get(file).copied();
        match run_load(&spec) {
            Ok(r) if r.errors.total() == 0 && r.requests == 1 => Ok(r.body_bytes),
            Ok(r) => Err(format!(
                "{file} with Accept-Encoding gzip: {:?}",
                r.error_samples
            )),
            Err(e) => Err(format!("probe {file} with Accept-Encoding gzip: {e}")),
        }
    }

    /// Runs one load (one client thread) against `server`, every response carrying
    /// `body_bytes`; the run, server/client CPU % and server CPU µs per completed request.
    /// `requests` is the count of the h2load and HTTP/3 rows (wrk runs `secs`).
    fn run_client(
        &self,
        server: &ServerProc,
        load: Load,
        secs: u64,
        requests: u64,
        body_bytes: u64,
    ) -> Result<GRun> {
        let threads = CLIENT_THREADS;
        let tls_port = server.port;
        let plain_port = server.plain_port.unwrap_or(1);
        let file = load.file();
        let m0 = match load {
            Load::Handshakes(..) => server.metrics().ok(),
            _ => None,
        };
        let client_cpu = || children_cpu_secs() + procs::self_cpu_secs();
        let (s0, c0, t0) = (server.cpu_secs(), client_cpu(), Instant::now());
        let mut run = match load {
            Load::WrkPlain(_, conns) | Load::WrkTls(_, conns) | Load::WrkGzip(_, conns) => {
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
                    body_bytes,
                    script: self.out.join("wrk-done.lua"),
                    headers: match load {
                        Load::WrkGzip(..) => vec!["Accept-Encoding: gzip".into()],
                        _ => vec![],
                    },
                })?
            }
            Load::H2(_, conns, streams) => {
                self.run_h2load(tls_port, file, conns, streams, requests, body_bytes, false)?
            }
            // One request per connection: as many connections as requests.
            Load::Handshakes(..) => self.run_h2load(
                tls_port,
                file,
                requests as usize,
                1,
                requests,
                body_bytes,
                true,
            )?,
            Load::H3(_, conns, streams) => {
                self.run_h3(tls_port, file, conns, streams, requests, body_bytes)?
            }
        };
        let wall = t0.elapsed().as_secs_f64().max(1e-9);
        let server_secs = server.cpu_secs() - s0;
        let scpu = server_secs / wall * 100.0;
        let ccpu = (client_cpu() - c0) / wall * 100.0;
        if let (Some(m0), Ok(m1)) = (&m0, server.metrics()) {
            // qweb counts its handshakes: one full handshake per request, none resumed.
            let d = |name: &str, labels: &[&str]| {
                parse_metric(&m1, name, labels) - parse_metric(m0, name, labels)
            };
            let hs = d("qweb_tls_handshakes_total", &[]);
            let resumed = d("qweb_tls_session_handshakes_total", &["kind=\"resumed\""]);
            if hs != run.requests as f64 || resumed != 0.0 {
                run.problems.push(format!(
                    "qweb counted {hs} handshakes ({resumed} resumed) for {} requests",
                    run.requests
                ));
            }
        }
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

    /// h2load (`--h1` when `h1`) with `requests` requests of `file` over `conns` connections.
    #[allow(clippy::too_many_arguments)]
    fn run_h2load(
        &self,
        port: u16,
        file: &str,
        conns: usize,
        streams: usize,
        requests: u64,
        body_bytes: u64,
        h1: bool,
    ) -> Result<ClientRun> {
        let bin = self
            .h2load
            .clone()
            .ok_or_else(|| Error::Other("skipped: h2load not installed".into()))?;
        h2load::run(&H2loadSpec {
            bin,
            url: format!("https://127.0.0.1:{port}/{file}"),
            requests,
            connections: conns,
            streams,
            threads: CLIENT_THREADS,
            body_bytes,
            h1,
        })
    }

    /// `requests` requests of `file` over HTTP/3 with this crate's load generator (one
    /// runtime thread, spawned from this thread so on [`CLIENT_CPU`]), as a [`ClientRun`]:
    /// every response checked (status, `body_bytes`), every request completed.
    fn run_h3(
        &self,
        port: u16,
        file: &str,
        conns: usize,
        streams: usize,
        requests: u64,
        body_bytes: u64,
    ) -> Result<ClientRun> {
        let mut spec = self.base_spec(port, file, Mode::Keepalive);
        spec.http = HttpVersion::H3;
        spec.connections = conns;
        spec.streams = streams;
        spec.count = Some(requests);
        spec.warmup = 0.0;
        spec.threads = Some(CLIENT_THREADS);
        spec.expect_bytes = Some(body_bytes);
        let rep = run_load(&spec)?;
        let mut problems = Vec::new();
        if rep.errors.total() > 0 {
            problems.push(format!(
                "{} error(s): {:?} {:?}",
                rep.errors.total(),
                rep.errors,
                rep.error_samples
            ));
        }
        if rep.requests != requests {
            problems.push(format!("{} of {requests} requests completed", rep.requests));
        }
        Ok(ClientRun {
            command: spec.command_line(),
            requests: rep.requests,
            req_per_sec: rep.ops_per_sec,
            mib_per_sec: rep.mib_per_sec,
            secs: rep.measured_secs,
            problems,
            // The client offers only these (crate::tls).
            tls: Some("TLSv1.3 (QUIC) TLS_AES_128_GCM_SHA256 X25519".into()),
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
        let loads = [
            Load::WrkPlain("1k.bin", 32),
            Load::WrkTls("1k.bin", 32),
            Load::H2("1k.bin", 8, 16),
            Load::H2("100k.bin", 8, 10),
            Load::WrkTls("1m.bin", 8),
            Load::WrkGzip("page.html", 16),
            Load::Handshakes("1k.bin", HANDSHAKES),
            Load::H3("1k.bin", 8, 16),
        ];
        // Every setup's servers run side by side (idle but for their rows).
        let mut sets: Vec<GSet> = Vec::new();
        for load in loads {
            if !sets.iter().any(|s| s.setup == load.setup()) {
                let set = self.g_start(load.setup(), &cert);
                sets.push(set);
            }
        }
        // wrk and h2load are spawned from this thread and inherit its affinity, and so do
        // the runtime threads of this crate's client.
        crate::procs::pin_thread(0, CLIENT_CPU)
            .map_err(|e| Error::io("pin the load generator to CPU 1", e))?;
        let cells = self.g_rounds(&sets, &loads);
        drop(sets);
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
            tables.push(self.g_table(*load, &kinds, row, &mut chart));
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
    /// (load, server) cell; cell `li * servers + si` holds its runs and problems. Each load
    /// runs against the servers of its setup in `sets`.
    fn g_rounds(&mut self, sets: &[GSet], loads: &[Load]) -> Vec<Cell> {
        let secs = self.profile.wrk_secs;
        let h2n = self.profile.h2_requests;
        let per = self.four_servers().len();
        let n = loads.len() * per;
        let set_of: Vec<Option<&GSet>> = loads
            .iter()
            .map(|l| sets.iter().find(|s| s.setup == l.setup()))
            .collect();
        let server = |i: usize| -> Option<&ServerProc> {
            set_of[i / per]
                .and_then(|s| s.servers.get(i % per))
                .and_then(Option::as_ref)
        };
        let mut cells: Vec<Cell> = (0..n).map(|_| Cell::default()).collect();
        // Why a cell has no server, and the body each response must carry (the gzip row:
        // what the server sent a probe).
        for (i, cell) in cells.iter_mut().enumerate() {
            let load = loads[i / per];
            cell.missing = set_of[i / per].and_then(|s| s.why.get(i % per).cloned().flatten());
            cell.tls_seen =
                set_of[i / per].and_then(|s| s.tls_seen.get(i % per).cloned().flatten());
            let Some(s) = server(i) else {
                continue;
            };
            cell.body = match load {
                Load::WrkGzip(f, _) => match self.g_gzip_size(s, f) {
                    Ok(b) => Some(b),
                    Err(e) => {
                        cell.problems.push(e);
                        None
                    }
                },
                _ => self.files.sizes.get(load.file()).copied(),
            };
        }
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
                let load = loads[i / per];
                let (Some(server), Some(body)) = (server(i), cells[i].body) else {
                    continue;
                };
                // h2load and the HTTP/3 client run by count: sized from the warm-up's rate to
                // last about `secs` (at least the profile's count), so CPU ticks (10 ms) stay
                // a small error. The handshake row: one connection per request, a fixed count.
                let (s, count) = match (load, warm) {
                    (Load::Handshakes(_, n), true) => (1, (n as u64 / 10).max(1)),
                    (Load::Handshakes(_, n), false) => (secs, n as u64),
                    (_, true) => (1, h2n / 10),
                    (_, false) => (secs, h2n.max((rate[i] * secs as f64) as u64)),
                };
                let cell = &mut cells[i];
                match self.run_client(server, load, s, count, body) {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_run_against_their_setup() {
        assert_eq!(Load::WrkTls("1k.bin", 32).setup(), Setup::Plain);
        assert_eq!(Load::Handshakes("1k.bin", 2000).setup(), Setup::Plain);
        assert_eq!(Load::WrkGzip("page.html", 16).setup(), Setup::Gzip);
        assert_eq!(Load::H3("1k.bin", 8, 16).setup(), Setup::Http3);
        assert_eq!(Load::H3("1k.bin", 8, 16).file(), "1k.bin");
        assert!(Load::Handshakes("1k.bin", 2000)
            .title()
            .contains("h2load --h1 -t1 -n2000 -c2000"));
    }

    #[test]
    fn qweb_gzips_every_response_anew_at_level_1() {
        let s = qweb_gzip_section();
        for want in [
            "codecs = [\"gzip\"]",
            "engine = \"inline\"",
            "cache_size = 0",
            "precompressed = false",
            "[compression.levels]\ngzip = 1\n",
        ] {
            assert!(s.contains(want), "{want} not in {s}");
        }
    }
}
