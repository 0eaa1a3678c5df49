//! The experiment runner (`qweb-bench run`): prepares certificates, files and configurations
//! in the output folder, starts qweb and its peers (nginx, h2o, Caddy) on 127.0.0.1, runs the
//! matrix (A handshakes, the engine-latency sweep, B throughput, C compression, D TLS +
//! compression, E latency under a handshake storm, F memory with idle connections, G
//! per-request cost with wrk/h2load/strace, H resumption, I two nodes sharing ticket keys,
//! J dual certificates)
//! with the rows of a table interleaved, checks every run (client errors, status and byte
//! counts, qweb's handshake, resumption and offload counters), and writes `results.md`,
//! `results.json` and SVG charts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::certs::{self, CertFiles, KeyKind};
use crate::clients;
use crate::configs::{self, Offload, OffloadMode, QwebSpec};
use crate::load::{run_load, IdleSet, LoadReport, LoadSpec, Mode};
use crate::peers::caddy::{caddy_json, CaddySpec};
use crate::peers::h2o::{h2o_conf, H2oSpec};
use crate::peers::nginx::{self as nginx_conf, NginxSpec};
use crate::peers::{self, Peer, PeerInfo};
use crate::procs::{self, parse_metric, ServerProc};
use crate::report::{ms, num, ratio, Table};
use crate::stats::median;
use crate::svg;
use crate::tls::{HttpVersion, TlsVersion};
use crate::{Error, Result};

mod compression;
mod dual;
mod handshakes;
mod http3;
mod latency;
mod measure;
mod memory;
mod output;
mod per_request;
mod resumption;
mod setup;
mod sweep;
mod throughput;

pub use output::machine_summary;
pub use setup::text_corpus;
use setup::{detect_compression, detect_keyserver, find_nginx, find_qweb, make_files};

/// Options of `qweb-bench run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Smoke profile (about 3 minutes): every experiment once, short; fails when a server
    /// does not answer or any request errs.
    #[arg(long, conflicts_with = "full")]
    pub quick: bool,
    /// The full matrix (default; about 20 minutes).
    #[arg(long)]
    pub full: bool,
    /// Results folder (default: `target/qweb-bench/<profile>-<UTC time>` in the workspace).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The qweb binary (default: target/release/qweb of the workspace, built with
    /// `cargo build --release --bin qweb` when missing).
    #[arg(long)]
    pub qweb: Option<PathBuf>,
    /// The nginx binary (default: `nginx` on PATH; installed with apt-get when missing).
    #[arg(long)]
    pub nginx: Option<PathBuf>,
    /// The h2o binary (default: /usr/bin/h2o; installed with apt-get when missing).
    #[arg(long)]
    pub h2o: Option<PathBuf>,
    /// The Caddy binary (default: /usr/bin/caddy; installed with apt-get when missing).
    #[arg(long)]
    pub caddy: Option<PathBuf>,
    /// Do not install nginx, h2o or Caddy when missing: their rows are skipped.
    #[arg(long)]
    pub no_install: bool,
    /// Server workers (qweb worker threads, nginx worker processes, h2o `num-threads`, Caddy
    /// `GOMAXPROCS`; default: one per CPU).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Only these experiments (comma-separated: A,sweep,B,C,D,E,F,G,H,I,J,K).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Interleaved rounds per row (default: the profile's; G takes at least 3 by default).
    #[arg(long)]
    pub rounds: Option<usize>,
    /// Seconds of one wrk run in G (default: the profile's).
    #[arg(long)]
    pub secs: Option<u64>,
}

/// Durations and sizes of a profile.
#[derive(Debug, Clone, Serialize)]
pub struct Profile {
    /// "quick" or "full".
    pub name: &'static str,
    /// Warm-up per run, seconds.
    pub warmup: f64,
    /// Measured time per run, seconds.
    pub duration: f64,
    /// Interleaved rounds per row (the median is reported).
    pub rounds: usize,
    /// Client connections of a handshake run.
    pub hs_connections: usize,
    /// Key types of experiment A.
    pub a_keys: Vec<KeyKind>,
    /// Engine latencies of the sweep, ms.
    pub sweep_latencies: Vec<u64>,
    /// Key types of the sweep.
    pub sweep_keys: Vec<KeyKind>,
    /// Idle connections of experiment F (one measure per count).
    pub idle_connections: Vec<usize>,
    /// Seconds of one wrk run (experiment G).
    pub wrk_secs: u64,
    /// Requests of one h2load run (experiment G).
    pub h2_requests: u64,
    /// Requests for the time-to-last-byte measure of the 8 MiB response.
    pub ttlb_count: u64,
}

impl Profile {
    /// The smoke profile.
    pub fn quick() -> Self {
        Profile {
            name: "quick",
            warmup: 0.5,
            duration: 1.5,
            rounds: 1,
            hs_connections: 64,
            a_keys: vec![KeyKind::Rsa2048],
            sweep_latencies: vec![5],
            sweep_keys: vec![KeyKind::EcdsaP256],
            idle_connections: vec![1000],
            wrk_secs: 1,
            h2_requests: 4000,
            ttlb_count: 3,
        }
    }

    /// The full matrix.
    pub fn full() -> Self {
        Profile {
            name: "full",
            warmup: 1.0,
            duration: 4.0,
            rounds: 2,
            hs_connections: 128,
            a_keys: vec![KeyKind::Rsa2048, KeyKind::EcdsaP256],
            sweep_latencies: vec![0, 1, 5, 20],
            sweep_keys: vec![KeyKind::Rsa2048, KeyKind::EcdsaP256],
            idle_connections: vec![1000, 10_000],
            wrk_secs: 4,
            h2_requests: 30_000,
            ttlb_count: 10,
        }
    }
}

/// The numbers of one row (median over its rounds).
#[derive(Debug, Clone, Serialize)]
pub struct Measured {
    /// Experiment ("A", "sweep", ...).
    pub experiment: String,
    /// Row label.
    pub label: String,
    /// Operations per second (handshakes or requests).
    pub ops_per_sec: f64,
    /// Body MiB/s.
    pub mib_per_sec: f64,
    /// Latency percentiles, µs.
    pub p50_us: f64,
    /// 90th percentile, µs.
    pub p90_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// Mean latency, µs.
    pub mean_us: f64,
    /// Server CPU, percent of one core (200 = two cores busy).
    pub server_cpu_pct: f64,
    /// Load generator CPU, percent of one core.
    pub client_cpu_pct: f64,
    /// Client errors over all rounds.
    pub errors: u64,
    /// The command lines of the rounds.
    pub commands: Vec<String>,
    /// Every round's report.
    pub rounds: Vec<LoadReport>,
}

impl Measured {
    fn from_rounds(experiment: &str, label: &str, rounds: Vec<(LoadReport, f64, f64)>) -> Self {
        let f = |g: &dyn Fn(&(LoadReport, f64, f64)) -> f64| {
            median(&rounds.iter().map(g).collect::<Vec<_>>())
        };
        Measured {
            experiment: experiment.into(),
            label: label.into(),
            ops_per_sec: f(&|r| r.0.ops_per_sec),
            mib_per_sec: f(&|r| r.0.mib_per_sec),
            p50_us: f(&|r| r.0.latency.p50_us as f64),
            p90_us: f(&|r| r.0.latency.p90_us as f64),
            p99_us: f(&|r| r.0.latency.p99_us as f64),
            mean_us: f(&|r| r.0.latency.mean_us),
            server_cpu_pct: f(&|r| r.1),
            client_cpu_pct: f(&|r| r.2),
            errors: rounds.iter().map(|r| r.0.errors.total()).sum(),
            commands: rounds.iter().map(|r| r.0.spec.command_line()).collect(),
            rounds: rounds.into_iter().map(|r| r.0).collect(),
        }
    }

    fn missing(experiment: &str, label: &str) -> Self {
        Measured::from_rounds(experiment, label, vec![])
    }
}

/// A server the matrix can start.
#[derive(Debug, Clone)]
enum ServerKind {
    Qweb {
        offload: Offload,
        compression: Option<String>,
        /// TLS session resumption (qweb's default: on); off in rows of full handshakes.
        resumption: bool,
        /// Body of the `[offload.engines.tickets]` key server table the ticket keys come from.
        ticket_keyserver: Option<String>,
    },
    Nginx {
        gzip_level: Option<u32>,
        resumption: bool,
    },
    H2o {
        resumption: bool,
        /// On-the-fly gzip at this quality (`compress`).
        gzip_level: Option<u32>,
    },
    Caddy {
        /// On-the-fly gzip at this level (`encode`).
        gzip_level: Option<u32>,
    },
}

impl ServerKind {
    /// qweb without resumption (every handshake full, as the peers without it).
    fn qweb(offload: Offload, compression: Option<String>) -> Self {
        ServerKind::Qweb {
            offload,
            compression,
            resumption: false,
            ticket_keyserver: None,
        }
    }

    /// h2o without resumption or compression.
    fn h2o() -> Self {
        ServerKind::H2o {
            resumption: false,
            gzip_level: None,
        }
    }

    /// Caddy without compression.
    fn caddy() -> Self {
        ServerKind::Caddy { gzip_level: None }
    }

    /// nginx without session cache and tickets.
    fn nginx(gzip_level: Option<u32>) -> Self {
        ServerKind::Nginx {
            gzip_level,
            resumption: false,
        }
    }
}

/// Whether an optional feature of qweb is there, and how to configure it.
#[derive(Debug, Clone)]
enum Feature<T> {
    Available(T),
    Missing(String),
}

/// How to run qweb's key server: one process per added latency, each on its own socket.
#[derive(Debug, Clone)]
struct KeyserverSetup {
    /// Folder of the sockets and configurations.
    dir: PathBuf,
    /// Private keys it serves.
    keys: Vec<PathBuf>,
}

impl KeyserverSetup {
    fn socket(&self, latency_ms: u64) -> PathBuf {
        self.dir.join(format!("ks-{latency_ms}ms.sock"))
    }

    /// The key server configuration (format of examples/keyserver.toml).
    fn config_text(&self, latency_ms: u64) -> String {
        let keys: Vec<String> = self
            .keys
            .iter()
            .map(|k| configs::toml_str(&k.to_string_lossy()))
            .collect();
        format!(
            "# Generated by qweb-bench.\nkeys = [{}]\nqueue = 65536\n\n[unix]\npath = {}\n",
            keys.join(", "),
            configs::toml_str(&self.socket(latency_ms).to_string_lossy())
        )
    }

    /// Lines of qweb's `[offload.engines.ks]` table.
    fn engine_toml(&self, latency_ms: u64) -> String {
        format!(
            "servers = [{}]\nqueue = 65536\ntimeout = \"10s\"",
            configs::toml_str(&format!("unix:{}", self.socket(latency_ms).display()))
        )
    }
}

/// A `[compression]` section per mode.
#[derive(Debug, Clone)]
struct CompressionSetup {
    /// mode -> whole section text ("sync", "pipelined", "cached").
    sections: BTreeMap<&'static str, String>,
}

struct NginxInfo {
    bin: PathBuf,
    version: (u32, u32, u32),
    version_text: String,
}

/// The files served.
struct Files {
    www: PathBuf,
    sizes: BTreeMap<&'static str, u64>,
}

struct Runner {
    args: RunArgs,
    profile: Profile,
    out: PathBuf,
    workspace: PathBuf,
    qweb: PathBuf,
    nginx: Option<NginxInfo>,
    nginx_missing: String,
    /// h2o and Caddy, or why not.
    h2o: std::result::Result<PeerInfo, String>,
    caddy: std::result::Result<PeerInfo, String>,
    /// wrk, h2load and strace, when installed.
    wrk: Option<PathBuf>,
    h2load: Option<PathBuf>,
    strace: Option<PathBuf>,
    workers: usize,
    rsa: CertFiles,
    ecdsa: CertFiles,
    files: Files,
    keyserver: Feature<KeyserverSetup>,
    compression: Feature<CompressionSetup>,
    sections: Vec<String>,
    measured: Vec<Measured>,
    failures: Vec<String>,
    skipped: Vec<String>,
    server_seq: usize,
    started: Instant,
    /// Open-file limit in force (children inherit it).
    fd_limit: u64,
    /// Servers started while this is set serve HTTP/3 too (qweb `http3 = true`, Caddy's
    /// `h3`): only in experiment K, so that no other row carries an `Alt-Svc` header.
    http3: bool,
}

/// Runs the experiment matrix; returns the results folder. Fails (after writing the results)
/// when a server did not answer or any run counted errors.
pub fn run(args: RunArgs) -> Result<PathBuf> {
    let mut profile = if args.quick {
        Profile::quick()
    } else {
        Profile::full()
    };
    if let Some(r) = args.rounds {
        profile.rounds = r.max(1);
    }
    if let Some(s) = args.secs {
        profile.wrk_secs = s.max(1);
    }
    let started = Instant::now();
    let workspace = workspace_root();
    let out = match &args.out {
        Some(o) => o.clone(),
        None => workspace.join("target/qweb-bench").join(format!(
            "{}-{}",
            profile.name,
            utc_stamp(now_secs())
        )),
    };
    std::fs::create_dir_all(out.join("logs")).map_err(|e| Error::path("create", &out, e))?;
    let out = out
        .canonicalize()
        .map_err(|e| Error::path("resolve", &out, e))?;
    eprintln!("qweb-bench: profile {} → {}", profile.name, out.display());
    let limit = crate::raise_fd_limit(65_536);
    eprintln!("qweb-bench: open-file limit {limit}");
    let workers = args.workers.unwrap_or_else(crate::cpus).max(1);
    let qweb = find_qweb(&args, &workspace)?;
    let (nginx, nginx_missing) = match find_nginx(&args) {
        Ok(n) => (Some(n), String::new()),
        Err(e) => {
            eprintln!("qweb-bench: nginx rows skipped: {e}");
            (None, e.to_string())
        }
    };
    let peer = |p: Peer, explicit: &Option<PathBuf>| match peers::find(
        p,
        explicit.as_deref(),
        !args.no_install,
    ) {
        Ok(i) => Ok(i),
        Err(e) => {
            eprintln!("qweb-bench: {} rows skipped: {e}", p.name());
            Err(e.to_string())
        }
    };
    let h2o = peer(Peer::H2o, &args.h2o);
    let caddy = peer(Peer::Caddy, &args.caddy);
    let wrk = clients::find_tool("wrk");
    let h2load = clients::find_tool("h2load");
    let strace = clients::find_tool("strace");
    let certs_dir = out.join("certs");
    let rsa = certs::generate(&certs_dir, KeyKind::Rsa2048)?;
    let ecdsa = certs::generate(&certs_dir, KeyKind::EcdsaP256)?;
    let files = make_files(&out.join("www"))?;
    let keyserver = detect_keyserver(&qweb, &out);
    let compression = detect_compression(&qweb, &out, &rsa, &files);
    for (name, f) in [
        ("key server", feature_note(&keyserver)),
        ("compression", feature_note(&compression)),
    ] {
        eprintln!("qweb-bench: {name}: {f}");
    }
    let mut r = Runner {
        args,
        profile,
        out,
        workspace,
        qweb,
        nginx,
        nginx_missing,
        h2o,
        caddy,
        wrk,
        h2load,
        strace,
        workers,
        rsa,
        ecdsa,
        files,
        keyserver,
        compression,
        sections: vec![],
        measured: vec![],
        failures: vec![],
        skipped: vec![],
        server_seq: 0,
        started,
        fd_limit: limit,
        http3: false,
    };
    type Experiment = fn(&mut Runner) -> Result<()>;
    let experiments: [(&str, Experiment); 12] = [
        ("A", Runner::exp_a),
        ("sweep", Runner::exp_sweep),
        ("B", Runner::exp_b),
        ("C", Runner::exp_c),
        ("D", Runner::exp_d),
        ("E", Runner::exp_e),
        ("F", Runner::exp_f),
        ("G", Runner::exp_g),
        ("H", Runner::exp_h),
        ("I", Runner::exp_i),
        ("J", Runner::exp_j),
        ("K", Runner::exp_k),
    ];
    for (name, f) in experiments {
        if !r.args.only.is_empty() && !r.args.only.iter().any(|o| o.eq_ignore_ascii_case(name)) {
            continue;
        }
        let t0 = Instant::now();
        eprintln!(
            "qweb-bench: experiment {name} (load average {})",
            procs::loadavg()
        );
        if let Err(e) = f(&mut r) {
            r.failures.push(format!("experiment {name}: {e}"));
            eprintln!("qweb-bench: experiment {name} failed: {e}");
        }
        eprintln!(
            "qweb-bench: experiment {name} took {:.0}s",
            t0.elapsed().as_secs_f64()
        );
    }
    r.write_results()?;
    eprintln!(
        "qweb-bench: done in {:.0}s; results in {}",
        r.started.elapsed().as_secs_f64(),
        r.out.display()
    );
    if !r.failures.is_empty() {
        return Err(Error::Check(format!(
            "{} problem(s):\n  {}",
            r.failures.len(),
            r.failures.join("\n  ")
        )));
    }
    Ok(r.out.clone())
}

fn feature_note<T>(f: &Feature<T>) -> String {
    match f {
        Feature::Available(_) => "available".into(),
        Feature::Missing(why) => format!("skipped: not available ({why})"),
    }
}

/// The workspace root: two levels above this crate when built from the workspace, else the
/// current directory.
fn workspace_root() -> PathBuf {
    let from_build = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    if from_build.join("Cargo.toml").is_file() {
        if let Ok(p) = from_build.canonicalize() {
            return p;
        }
    }
    std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."))
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `secs` since the epoch as "YYYYmmdd-HHMMSS" (UTC).
pub fn utc_stamp(secs: u64) -> String {
    let (y, m, d) = qweb_tls::utc::civil_from_days((secs / 86_400) as i64);
    let s = secs % 86_400;
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

fn command_output(program: &Path, args: &[&str]) -> Option<String> {
    let o = Command::new(program).args(args).output().ok()?;
    let mut s = String::from_utf8_lossy(&o.stdout).into_owned();
    s.push_str(&String::from_utf8_lossy(&o.stderr));
    Some(s)
}

fn row_cells(label: &str, tls: &str, m: &Measured, base: f64, ngx: f64) -> Vec<String> {
    vec![
        label.to_string(),
        tls.to_string(),
        num(m.ops_per_sec),
        ratio(m.ops_per_sec, base),
        ratio(m.ops_per_sec, ngx),
        ms(m.p50_us),
        ms(m.p99_us),
        num(m.server_cpu_pct),
        num(m.client_cpu_pct),
        m.errors.to_string(),
    ]
}

fn tls_name(v: TlsVersion) -> &'static str {
    match v {
        TlsVersion::Tls12 => "1.2",
        TlsVersion::Tls13 => "1.3",
    }
}

fn http_name(v: HttpVersion) -> &'static str {
    match v {
        HttpVersion::H1 => "1.1",
        HttpVersion::H2 => "2",
        HttpVersion::H3 => "3",
    }
}

fn key_slug(k: KeyKind) -> &'static str {
    match k {
        KeyKind::Rsa2048 => "rsa2048",
        KeyKind::EcdsaP256 => "ecdsa-p256",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_stamps() {
        assert_eq!(utc_stamp(0), "19700101-000000");
        assert_eq!(utc_stamp(951_782_400 + 3661), "20000229-010101");
        assert_eq!(utc_stamp(1_700_000_000), "20231114-221320");
    }

    #[test]
    fn corpus_is_deterministic_text() {
        let a = text_corpus(10_000, 3, true);
        assert_eq!(a.len(), 10_000);
        assert_eq!(a, text_corpus(10_000, 3, true));
        assert!(a.starts_with(b"<!doctype html>"));
        assert!(a.iter().all(|b| b.is_ascii()));
    }

    #[test]
    fn measured_takes_medians() {
        let mut r = LoadReport {
            spec: LoadSpec::new("https://127.0.0.1:1/", Mode::Handshake),
            measured_secs: 1.0,
            ops: 10,
            ops_per_sec: 10.0,
            handshakes: 10,
            handshakes_all: 12,
            resumed: 0,
            resumed_all: 0,
            resume_asked: 0,
            requests: 0,
            body_bytes: 0,
            mib_per_sec: 0.0,
            latency: Default::default(),
            errors: Default::default(),
            error_samples: vec![],
            ecdsa_signed: 0,
            rsa_signed: 0,
        };
        let a = r.clone();
        r.ops_per_sec = 30.0;
        r.errors.tls = 1;
        let b = r.clone();
        r.ops_per_sec = 20.0;
        let m = Measured::from_rounds(
            "A",
            "x",
            vec![(a, 50.0, 10.0), (b, 70.0, 30.0), (r, 60.0, 20.0)],
        );
        assert_eq!(m.ops_per_sec, 20.0);
        assert_eq!(m.server_cpu_pct, 60.0);
        assert_eq!(m.errors, 2);
        assert_eq!(m.commands.len(), 3);
    }
}
