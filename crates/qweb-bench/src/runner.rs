//! The experiment runner (`qweb-bench run`): prepares certificates, files and configurations
//! in the output folder, starts qweb and nginx on 127.0.0.1, runs the matrix (A handshakes,
//! the engine-latency sweep, B throughput, C compression, D TLS + compression, E latency under
//! a handshake storm, F memory with idle connections) with A/B runs interleaved, checks every
//! run (client errors, qweb's handshake and offload counters), and writes `results.md`,
//! `results.json` and SVG charts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::certs::{self, CertFiles, KeyKind};
use crate::configs::{self, NginxSpec, Offload, OffloadMode, QwebSpec};
use crate::load::{run_load, IdleSet, LoadReport, LoadSpec, Mode};
use crate::procs::{self, parse_metric, ServerProc};
use crate::report::{ms, num, ratio, Table};
use crate::stats::median;
use crate::svg;
use crate::tls::{HttpVersion, TlsVersion};
use crate::{Error, Result};

/// Options of `qweb-bench run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Smoke profile (under 3 minutes): every experiment once, short; fails when a server
    /// does not answer or any request errs.
    #[arg(long, conflicts_with = "full")]
    pub quick: bool,
    /// The full matrix (default; under 20 minutes).
    #[arg(long)]
    pub full: bool,
    /// Results folder (default: target/qweb-bench/<profile>-<UTC time> in the workspace).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The qweb binary (default: target/release/qweb of the workspace, built with
    /// `cargo build --release --bin qweb` when missing).
    #[arg(long)]
    pub qweb: Option<PathBuf>,
    /// The nginx binary (default: `nginx` on PATH; installed with apt-get when missing).
    #[arg(long)]
    pub nginx: Option<PathBuf>,
    /// Do not install nginx when missing: its rows are skipped.
    #[arg(long)]
    pub no_install: bool,
    /// Server workers (qweb worker threads, nginx worker processes; default: one per CPU).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Only these experiments (comma-separated: A,sweep,B,C,D,E,F).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
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
    /// Idle connections of experiment F.
    pub idle_connections: usize,
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
            idle_connections: 1000,
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
            idle_connections: 10_000,
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
    },
    Nginx {
        gzip_level: Option<u32>,
    },
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
}

/// Runs the experiment matrix; returns the results folder. Fails (after writing the results)
/// when a server did not answer or any run counted errors.
pub fn run(args: RunArgs) -> Result<PathBuf> {
    let profile = if args.quick {
        Profile::quick()
    } else {
        Profile::full()
    };
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
    };
    type Experiment = fn(&mut Runner) -> Result<()>;
    let experiments: [(&str, Experiment); 7] = [
        ("A", Runner::exp_a),
        ("sweep", Runner::exp_sweep),
        ("B", Runner::exp_b),
        ("C", Runner::exp_c),
        ("D", Runner::exp_d),
        ("E", Runner::exp_e),
        ("F", Runner::exp_f),
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
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let s = secs % 86_400;
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

/// Days since 1970-01-01 to (year, month, day) (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn command_output(program: &Path, args: &[&str]) -> Option<String> {
    let o = Command::new(program).args(args).output().ok()?;
    let mut s = String::from_utf8_lossy(&o.stdout).into_owned();
    s.push_str(&String::from_utf8_lossy(&o.stderr));
    Some(s)
}

fn find_qweb(args: &RunArgs, workspace: &Path) -> Result<PathBuf> {
    if let Some(p) = &args.qweb {
        if !p.is_file() {
            return Err(Error::Arg(format!("--qweb {}: no such file", p.display())));
        }
        return p.canonicalize().map_err(|e| Error::path("resolve", p, e));
    }
    let bin = workspace.join("target/release/qweb");
    if !bin.is_file() {
        eprintln!("qweb-bench: building qweb: cargo build --release --bin qweb");
        let st = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["build", "--release", "--bin", "qweb"])
            .current_dir(workspace)
            .env_remove("CARGO_TARGET_DIR")
            .status()
            .map_err(|e| Error::io("run cargo build", e))?;
        if !st.success() || !bin.is_file() {
            return Err(Error::Other(format!(
                "cargo build --release --bin qweb failed ({st}); pass --qweb PATH"
            )));
        }
    }
    Ok(bin)
}

fn find_nginx(args: &RunArgs) -> Result<NginxInfo> {
    let bin = match &args.nginx {
        Some(p) => p.clone(),
        None => {
            let candidates = ["/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/bin/nginx"];
            match candidates.iter().map(PathBuf::from).find(|p| p.is_file()) {
                Some(p) => p,
                None if args.no_install => {
                    return Err(Error::Other("nginx not installed (--no-install)".into()))
                }
                None => {
                    eprintln!(
                        "qweb-bench: installing nginx: apt-get update && apt-get install -y nginx"
                    );
                    let st = Command::new("sh")
                        .args([
                            "-c",
                            "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q nginx",
                        ])
                        .status()
                        .map_err(|e| Error::io("run apt-get", e))?;
                    let p = candidates.iter().map(PathBuf::from).find(|p| p.is_file());
                    match p {
                        Some(p) if st.success() => p,
                        _ => {
                            return Err(Error::Other(format!(
                                "apt-get install nginx failed ({st})"
                            )))
                        }
                    }
                }
            }
        }
    };
    let text = command_output(&bin, &["-v"])
        .ok_or_else(|| Error::Other(format!("cannot run {} -v", bin.display())))?;
    let version = configs::parse_nginx_version(&text)
        .ok_or_else(|| Error::Other(format!("cannot parse nginx version from {text:?}")))?;
    Ok(NginxInfo {
        bin,
        version,
        version_text: text.trim().to_string(),
    })
}

/// Deterministic pseudo-random bytes (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Text that compresses like real prose/markup (about 3–4× with gzip): words drawn from a
/// vocabulary with a skewed distribution, in paragraphs.
pub fn text_corpus(len: usize, seed: u64, html: bool) -> Vec<u8> {
    const WORDS: &[&str] = &[
        "the",
        "of",
        "and",
        "to",
        "in",
        "server",
        "event",
        "loop",
        "handshake",
        "offload",
        "engine",
        "worker",
        "connection",
        "request",
        "response",
        "compression",
        "latency",
        "throughput",
        "asynchronous",
        "accelerator",
        "certificate",
        "signature",
        "is",
        "a",
        "that",
        "for",
        "on",
        "with",
        "as",
        "by",
        "queue",
        "thread",
        "resume",
        "pause",
        "job",
        "chunk",
        "pipeline",
        "cache",
        "header",
        "body",
        "stream",
        "client",
        "kernel",
        "socket",
        "buffer",
        "memory",
        "cipher",
        "key",
        "private",
        "public",
        "session",
    ];
    let mut rng = Rng(seed | 1);
    let mut out = Vec::with_capacity(len + 64);
    if html {
        out.extend_from_slice(
            b"<!doctype html>\n<html><head><title>qweb bench</title></head><body>\n",
        );
    }
    let mut n = 0u64;
    while out.len() < len {
        if html && n % 60 == 0 {
            out.extend_from_slice(b"</p>\n<p class=\"para\">");
        } else if !html && n % 15 == 14 {
            out.push(b'\n');
        }
        let r = rng.next();
        // Skewed choice: small indices much more often.
        let i = ((r % 1000) as f64 / 1000.0).powi(2) * WORDS.len() as f64;
        out.extend_from_slice(WORDS[(i as usize).min(WORDS.len() - 1)].as_bytes());
        if r >> 60 == 0 {
            out.extend_from_slice(format!(" {}", (r >> 20) % 100_000).as_bytes());
        }
        out.push(b' ');
        n += 1;
    }
    out.truncate(len);
    out
}

fn make_files(www: &Path) -> Result<Files> {
    std::fs::create_dir_all(www).map_err(|e| Error::path("create", www, e))?;
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut random = |n: usize| {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&rng.next().to_le_bytes());
        }
        v.truncate(n);
        v
    };
    let list: Vec<(&'static str, Vec<u8>)> = vec![
        ("1k.bin", random(1024)),
        ("100k.bin", random(100 * 1024)),
        ("1m.bin", random(1024 * 1024)),
        ("page.html", text_corpus(100 * 1024, 7, true)),
        ("8m.txt", text_corpus(8 * 1024 * 1024, 11, false)),
    ];
    let mut sizes = BTreeMap::new();
    for (name, data) in list {
        let p = www.join(name);
        std::fs::write(&p, &data).map_err(|e| Error::path("write", &p, e))?;
        sizes.insert(name, data.len() as u64);
    }
    Ok(Files {
        www: www.to_path_buf(),
        sizes,
    })
}

/// The key server is used when `qweb --help` lists `keyserver` and the generated key
/// server configuration starts.
fn detect_keyserver(qweb: &Path, out: &Path) -> Feature<KeyserverSetup> {
    let help = command_output(qweb, &["--help"]).unwrap_or_default();
    if !help
        .lines()
        .any(|l| l.trim_start().starts_with("keyserver"))
    {
        return Feature::Missing("`qweb --help` lists no keyserver command".into());
    }
    let dir = out.join("keyserver");
    if let Err(e) = std::fs::create_dir_all(&dir) {
        return Feature::Missing(format!("create {}: {e}", dir.display()));
    }
    let certs = out.join("certs");
    Feature::Available(KeyserverSetup {
        dir,
        keys: vec![certs.join("rsa2048.key"), certs.join("ecdsa-p256.key")],
    })
}

/// Compression is used when `qweb check-config` accepts a configuration with the
/// `[compression]` sections below.
fn detect_compression(
    qweb: &Path,
    out: &Path,
    cert: &CertFiles,
    files: &Files,
) -> Feature<CompressionSetup> {
    let mut sections = BTreeMap::new();
    // The compression engine: a pool with one thread per CPU. gzip at level 6 both here and
    // in nginx (`gzip_comp_level 6`).
    let engine = format!(
        "[offload.engines.zpool]\nkind = \"pool\"\nthreads = {}\nqueue = 65536\n\n",
        crate::cpus()
    );
    for (name, mode, cache) in [
        ("sync", "sync", "0"),
        ("pipelined", "pipelined", "0"),
        ("cached", "sync", "\"64MiB\""),
    ] {
        sections.insert(
            name,
            format!(
                "{engine}[compression]\nenabled = true\ncodecs = [\"gzip\", \"br\", \"zstd\"]\n\
                 types = [\"text/*\"]\nmode = \"{mode}\"\nengine = \"zpool\"\nchunk_size = \"64KiB\"\n\
                 depth = 4\ncache_size = {cache}\nprecompressed = false\n\n\
                 [compression.levels]\ngzip = 6\nbr = 4\nzstd = 3\n"
            ),
        );
    }
    let dir = out.join("configs");
    let _ = std::fs::create_dir_all(&dir);
    for (mode, section) in &sections {
        let spec = QwebSpec {
            workers: 1,
            port: 1,
            admin_port: 2,
            cert: cert.cert.clone(),
            key: Some(cert.key.clone()),
            root: files.www.clone(),
            offload: Offload::None,
            compression: Some(section.clone()),
            keepalive_secs: 75,
            max_connections_per_worker: 100,
        };
        let p = dir.join(format!("check-compression-{mode}.toml"));
        if let Err(e) = std::fs::write(&p, configs::qweb_toml(&spec)) {
            return Feature::Missing(format!("write {}: {e}", p.display()));
        }
        let o = Command::new(qweb).arg("check-config").arg(&p).output();
        match o {
            Ok(o) if o.status.success() => {}
            Ok(o) => {
                let msg = String::from_utf8_lossy(&o.stderr);
                return Feature::Missing(format!(
                    "`qweb check-config` refuses [compression] ({})",
                    msg.lines().next().unwrap_or("").trim()
                ));
            }
            Err(e) => return Feature::Missing(format!("run qweb check-config: {e}")),
        }
    }
    Feature::Available(CompressionSetup { sections })
}

impl Runner {
    fn base_spec(&self, port: u16, path: &str, mode: Mode) -> LoadSpec {
        let mut s = LoadSpec::new(format!("https://127.0.0.1:{port}/{path}"), mode);
        s.warmup = self.profile.warmup;
        s.duration = self.profile.duration;
        s
    }

    /// Starts one server; `None` (with a failure or skip recorded) when it cannot run.
    fn start(&mut self, label: &str, kind: &ServerKind, cert: &CertFiles) -> Option<ServerProc> {
        self.server_seq += 1;
        let seq = self.server_seq;
        let slug: String = label
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let name = format!("{seq:02}-{slug}");
        let res = (|| -> Result<ServerProc> {
            let port = procs::free_port()?;
            match kind {
                ServerKind::Qweb {
                    offload,
                    compression,
                } => {
                    let admin = procs::free_port()?;
                    let key = match offload {
                        Offload::Keyserver { .. } => None,
                        _ => Some(cert.key.clone()),
                    };
                    let spec = QwebSpec {
                        workers: self.workers,
                        port,
                        admin_port: admin,
                        cert: cert.cert.clone(),
                        key,
                        root: self.files.www.clone(),
                        offload: offload.clone(),
                        compression: compression.clone(),
                        keepalive_secs: 300,
                        max_connections_per_worker: 20_000,
                    };
                    let dir = self.out.join("configs");
                    std::fs::create_dir_all(&dir).map_err(|e| Error::path("create", &dir, e))?;
                    let cfg = dir.join(format!("{name}.toml"));
                    std::fs::write(&cfg, configs::qweb_toml(&spec))
                        .map_err(|e| Error::path("write", &cfg, e))?;
                    ServerProc::start(
                        label,
                        &self.qweb,
                        &[
                            "serve".into(),
                            "--config".into(),
                            cfg.to_string_lossy().into(),
                        ],
                        port,
                        Some(admin),
                        self.out.join("logs").join(format!("{name}.log")),
                    )
                }
                ServerKind::Nginx { gzip_level } => {
                    let Some(nginx) = &self.nginx else {
                        return Err(Error::Other(format!(
                            "skipped: nginx not available ({})",
                            self.nginx_missing
                        )));
                    };
                    let prefix = self.out.join("nginx").join(&name);
                    std::fs::create_dir_all(prefix.join("tmp"))
                        .map_err(|e| Error::path("create", &prefix, e))?;
                    // SAFETY: geteuid has no preconditions.
                    let root = unsafe { libc::geteuid() } == 0;
                    let spec = NginxSpec {
                        workers: self.workers,
                        port,
                        cert: cert.cert.clone(),
                        key: cert.key.clone(),
                        root: self.files.www.clone(),
                        prefix: prefix.clone(),
                        gzip_level: *gzip_level,
                        http2: configs::Http2Syntax::for_version(nginx.version),
                        keepalive_secs: 300,
                        // One fd per client connection (no upstreams), within our limit.
                        worker_connections: (self.fd_limit.saturating_sub(1100) as usize)
                            .clamp(1024, 20_000),
                        user_root: root,
                    };
                    let conf = prefix.join("nginx.conf");
                    std::fs::write(&conf, configs::nginx_conf(&spec))
                        .map_err(|e| Error::path("write", &conf, e))?;
                    ServerProc::start(
                        label,
                        &nginx.bin,
                        &[
                            "-p".into(),
                            prefix.to_string_lossy().into(),
                            "-c".into(),
                            conf.to_string_lossy().into(),
                            "-e".into(),
                            prefix.join("error.log").to_string_lossy().into(),
                        ],
                        port,
                        None,
                        self.out.join("logs").join(format!("{name}.log")),
                    )
                }
            }
        })();
        let p = match res {
            Ok(p) => p,
            Err(Error::Other(m)) if m.starts_with("skipped") => {
                self.skipped.push(format!("{label}: {m}"));
                return None;
            }
            Err(e) => {
                self.failures.push(format!("{label}: did not start: {e}"));
                return None;
            }
        };
        // It must answer a request before it is measured.
        let mut probe = self.base_spec(p.port, "1k.bin", Mode::Keepalive);
        probe.connections = 1;
        probe.count = Some(2);
        probe.warmup = 0.0;
        probe.expect_bytes = Some(self.files.sizes["1k.bin"]);
        match run_load(&probe) {
            Ok(r) if r.errors.total() == 0 && r.requests == 2 => Some(p),
            Ok(r) => {
                self.failures.push(format!(
                    "{label}: does not answer correctly: {:?} {:?}",
                    r.errors, r.error_samples
                ));
                None
            }
            Err(e) => {
                self.failures.push(format!("{label}: probe failed: {e}"));
                None
            }
        }
    }

    /// Runs `spec` against `server` once, with the checks: client errors, and for qweb the
    /// server's handshake counter (every client handshake was a full one the server counted)
    /// and, with an engine, that every handshake's signature went to the engine (no fallback).
    fn measure_once(
        &mut self,
        server: &ServerProc,
        spec: &LoadSpec,
        engine: Option<&str>,
        check_counters: bool,
    ) -> Result<(LoadReport, f64, f64)> {
        let m0 = server.metrics().ok();
        let (s0, c0, t0) = (server.cpu_secs(), procs::self_cpu_secs(), Instant::now());
        let rep = run_load(spec)?;
        let wall = t0.elapsed().as_secs_f64();
        let (s1, c1) = (server.cpu_secs(), procs::self_cpu_secs());
        let m1 = server.metrics().ok();
        let scpu = (s1 - s0) / wall * 100.0;
        let ccpu = (c1 - c0) / wall * 100.0;
        eprintln!(
            "  {:<28} {:>9.1}/s {:>8.1} MiB/s p50 {:>7}us p99 {:>7}us srv {:>4.0}% cli {:>4.0}% err {}",
            server.name,
            rep.ops_per_sec,
            rep.mib_per_sec,
            rep.latency.p50_us,
            rep.latency.p99_us,
            scpu,
            ccpu,
            rep.errors.total()
        );
        if rep.errors.total() > 0 {
            self.failures.push(format!(
                "{}: {} error(s) in `{}`: {:?}",
                server.name,
                rep.errors.total(),
                spec.command_line(),
                rep.error_samples
            ));
        }
        if let (Some(m0), Some(m1), true) = (m0, m1, check_counters) {
            let hs = parse_metric(&m1, "qweb_tls_handshakes_total", &[])
                - parse_metric(&m0, "qweb_tls_handshakes_total", &[]);
            let client = rep.handshakes_all as f64;
            // Handshakes the client abandoned at the end of the window may still complete on
            // the server: at most one per connection.
            let slack = (spec.connections + 2) as f64;
            if hs < client || hs > client + slack {
                self.failures.push(format!(
                    "{}: server counted {hs} handshakes, the client completed {client}",
                    server.name
                ));
            }
            if let Some(engine) = engine {
                let label = format!("engine=\"{engine}\"");
                let sub = parse_metric(&m1, "qweb_offload_ops_submitted_total", &[&label])
                    - parse_metric(&m0, "qweb_offload_ops_submitted_total", &[&label]);
                let fb = parse_metric(&m1, "qweb_offload_ops_fallback_total", &[&label])
                    - parse_metric(&m0, "qweb_offload_ops_fallback_total", &[&label]);
                if sub < hs || fb > 0.0 {
                    self.failures.push(format!(
                        "{}: {hs} handshakes but {sub} ops submitted to engine {engine}, {fb} fell back",
                        server.name
                    ));
                }
            }
        }
        Ok((rep, scpu, ccpu))
    }

    /// Interleaved rounds over `rows` (server index, spec, engine, label); ABBA order.
    fn interleave(
        &mut self,
        experiment: &str,
        servers: &[Option<ServerProc>],
        rows: &[(usize, LoadSpec, Option<&str>, String)],
    ) -> Vec<Measured> {
        let mut per_row: Vec<Vec<(LoadReport, f64, f64)>> = vec![vec![]; rows.len()];
        for round in 0..self.profile.rounds {
            let order: Vec<usize> = if round % 2 == 0 {
                (0..rows.len()).collect()
            } else {
                (0..rows.len()).rev().collect()
            };
            for i in order {
                let (si, spec, engine, label) = &rows[i];
                let Some(server) = servers.get(*si).and_then(|s| s.as_ref()) else {
                    continue;
                };
                match self.measure_once(server, spec, *engine, true) {
                    Ok(m) => per_row[i].push(m),
                    Err(e) => self.failures.push(format!("{label}: {e}")),
                }
            }
        }
        let mut out = Vec::new();
        for ((_, _, _, label), rounds) in rows.iter().zip(per_row) {
            let m = if rounds.is_empty() {
                Measured::missing(experiment, label)
            } else {
                Measured::from_rounds(experiment, label, rounds)
            };
            self.measured.push(m.clone());
            out.push(m);
        }
        out
    }

    fn pool(&self, mode: OffloadMode, latency_ms: u64) -> ServerKind {
        ServerKind::Qweb {
            offload: Offload::Pool {
                mode,
                threads: self.workers,
                added_latency_ms: latency_ms,
            },
            compression: None,
        }
    }

    fn qweb_none(&self) -> ServerKind {
        ServerKind::Qweb {
            offload: Offload::None,
            compression: None,
        }
    }

    fn cert(&self, k: KeyKind) -> CertFiles {
        match k {
            KeyKind::Rsa2048 => self.rsa.clone(),
            KeyKind::EcdsaP256 => self.ecdsa.clone(),
        }
    }

    /// Starts the key server with `added_latency_ms`; `None` (recorded) when it fails.
    fn start_keyserver(&mut self, ks: &KeyserverSetup, latency_ms: u64) -> Option<ServerProc> {
        let socket = ks.socket(latency_ms);
        let _ = std::fs::remove_file(&socket);
        let config = ks.dir.join(format!("keyserver-{latency_ms}ms.toml"));
        if let Err(e) = std::fs::write(&config, ks.config_text(latency_ms)) {
            self.failures
                .push(format!("write {}: {e}", config.display()));
            return None;
        }
        let args = vec![
            "keyserver".to_string(),
            "--config".to_string(),
            config.to_string_lossy().into_owned(),
            "--added-latency-ms".to_string(),
            latency_ms.to_string(),
        ];
        self.server_seq += 1;
        let log = self.out.join("logs").join(format!(
            "{:02}-keyserver-{latency_ms}ms.log",
            self.server_seq
        ));
        match ServerProc::start_unix(
            &format!("keyserver {latency_ms}ms"),
            &self.qweb,
            &args,
            &socket,
            log,
        ) {
            Ok(p) => Some(p),
            Err(e) => {
                self.skipped.push(format!(
                    "key server rows: skipped: not available (the key server did not start with the generated config: {e})"
                ));
                None
            }
        }
    }

    // ---------------------------------------------------------------- A: handshakes/s

    fn exp_a(&mut self) -> Result<()> {
        for key in self.profile.a_keys.clone() {
            let cert = self.cert(key);
            let mut kinds: Vec<(String, ServerKind, Option<&'static str>)> = vec![
                ("qweb none".into(), self.qweb_none(), None),
                (
                    "qweb sync pool".into(),
                    self.pool(OffloadMode::Sync, 0),
                    Some("pool"),
                ),
                (
                    "qweb async pool".into(),
                    self.pool(OffloadMode::Async, 0),
                    Some("pool"),
                ),
            ];
            let mut keyservers = Vec::new();
            match self.keyserver.clone() {
                Feature::Available(ks) => {
                    for lat in [0u64, 1] {
                        let Some(p) = self.start_keyserver(&ks, lat) else {
                            break;
                        };
                        keyservers.push(p);
                        for mode in [OffloadMode::Sync, OffloadMode::Async] {
                            kinds.push((
                                format!("qweb {} keyserver {lat}ms", mode.as_str()),
                                ServerKind::Qweb {
                                    offload: Offload::Keyserver {
                                        mode,
                                        engine_toml: ks.engine_toml(lat),
                                    },
                                    compression: None,
                                },
                                Some("ks"),
                            ));
                        }
                    }
                }
                Feature::Missing(why) => self
                    .skipped
                    .push(format!("A key server rows: skipped: not available ({why})")),
            }
            kinds.push(("nginx".into(), ServerKind::Nginx { gzip_level: None }, None));
            let mut servers = Vec::new();
            for (label, kind, _) in &kinds {
                servers.push(self.start(label, kind, &cert));
            }
            let versions: Vec<TlsVersion> = vec![TlsVersion::Tls13, TlsVersion::Tls12];
            let mut rows = Vec::new();
            for v in &versions {
                for (i, (label, _, engine)) in kinds.iter().enumerate() {
                    let port = servers[i].as_ref().map(|s| s.port).unwrap_or(1);
                    let mut spec = self.base_spec(port, "", Mode::Handshake);
                    spec.tls = *v;
                    spec.connections = self.profile.hs_connections;
                    rows.push((i, spec, *engine, format!("{label} TLS {}", tls_name(*v))));
                }
            }
            let res = self.interleave("A", &servers, &rows);
            drop(servers);
            drop(keyservers);
            // Table and chart.
            let mut t = Table::new(
                format!(
                    "A. Full TLS handshakes/s, {} ({} workers, {} client connections, no resumption)",
                    key.label(),
                    self.workers,
                    self.profile.hs_connections
                ),
                &[
                    "server", "TLS", "handshakes/s", "vs qweb none", "vs nginx", "p50 ms",
                    "p99 ms", "server CPU %", "client CPU %", "errors",
                ],
            );
            let mut chart_series: Vec<(String, Vec<f64>)> = kinds
                .iter()
                .map(|(l, _, _)| (l.clone(), vec![f64::NAN; versions.len()]))
                .collect();
            for (vi, v) in versions.iter().enumerate() {
                let base = res[vi * kinds.len()].ops_per_sec;
                let ngx = res[vi * kinds.len() + kinds.len() - 1].ops_per_sec;
                for (ki, (label, _, _)) in kinds.iter().enumerate() {
                    let m = &res[vi * kinds.len() + ki];
                    chart_series[ki].1[vi] = m.ops_per_sec;
                    t.row(row_cells(label, tls_name(*v), m, base, ngx));
                }
            }
            t.notes.push(format!(
                "Handshake = TCP connect + full TLS handshake (X25519, AES-128-GCM, {} signature) + close_notify; \
                 the client offers no session resumption and checks every handshake is full; qweb's \
                 /metrics handshake counter is checked against the client's count. Pool engine: {} \
                 threads, 0 ms added latency.",
                key.label(),
                self.workers
            ));
            let slug = key_slug(key);
            let chart = format!("a-handshakes-{slug}.svg");
            self.write_chart(
                &chart,
                &svg::bar_chart(
                    &format!("A. Full handshakes/s, {}", key.label()),
                    "handshakes/s",
                    &versions
                        .iter()
                        .map(|v| format!("TLS {}", tls_name(*v)))
                        .collect::<Vec<_>>(),
                    &chart_series,
                ),
            );
            self.section(t, Some(&chart));
        }
        Ok(())
    }

    // ---------------------------------------------------------------- sweep

    fn exp_sweep(&mut self) -> Result<()> {
        for key in self.profile.sweep_keys.clone() {
            let cert = self.cert(key);
            let lats = self.profile.sweep_latencies.clone();
            let mut none_rate = f64::NAN;
            {
                let kind = self.qweb_none();
                let s = self.start("qweb none", &kind, &cert);
                if let Some(server) = &s {
                    let mut spec = self.base_spec(server.port, "", Mode::Handshake);
                    spec.connections = self.profile.hs_connections;
                    let r = self.interleave(
                        "sweep",
                        std::slice::from_ref(&s),
                        &[(0, spec, None, format!("qweb none {}", key.label()))],
                    );
                    none_rate = r[0].ops_per_sec;
                }
            }
            let mut sync = Vec::new();
            let mut asyn = Vec::new();
            for &lat in &lats {
                let servers = vec![
                    self.start(
                        &format!("qweb sync pool {lat}ms"),
                        &self.pool(OffloadMode::Sync, lat),
                        &cert,
                    ),
                    self.start(
                        &format!("qweb async pool {lat}ms"),
                        &self.pool(OffloadMode::Async, lat),
                        &cert,
                    ),
                ];
                let mut rows = Vec::new();
                for (i, mode) in ["sync", "async"].iter().enumerate() {
                    let port = servers[i].as_ref().map(|s| s.port).unwrap_or(1);
                    let mut spec = self.base_spec(port, "", Mode::Handshake);
                    spec.connections = self.profile.hs_connections;
                    rows.push((
                        i,
                        spec,
                        Some("pool"),
                        format!("qweb {mode} pool {lat}ms {}", key.label()),
                    ));
                }
                let r = self.interleave("sweep", &servers, &rows);
                sync.push(r[0].ops_per_sec);
                asyn.push(r[1].ops_per_sec);
            }
            let mut t = Table::new(
                format!(
                    "Engine latency sweep, {} (TLS 1.3, pool engine with added latency, {} workers, {} client connections)",
                    key.label(),
                    self.workers,
                    self.profile.hs_connections
                ),
                &[
                    "added latency", "sync hs/s", "async hs/s", "async / sync",
                    "sync bound W/latency", "async vs qweb none",
                ],
            );
            let mut bound = Vec::new();
            for (i, &lat) in lats.iter().enumerate() {
                let b = if lat == 0 {
                    f64::NAN
                } else {
                    self.workers as f64 * 1000.0 / lat as f64
                };
                bound.push(b);
                t.row(vec![
                    format!("{lat} ms"),
                    num(sync[i]),
                    num(asyn[i]),
                    ratio(asyn[i], sync[i]),
                    num(b),
                    ratio(asyn[i], none_rate),
                ]);
            }
            t.notes.push(format!(
                "qweb none (in-process signing) on the same run: {} handshakes/s. In sync mode a worker \
                 waits for each op, so W workers reach at most W / latency; async mode keeps many ops in \
                 flight per worker.",
                num(none_rate)
            ));
            let slug = key_slug(key);
            let chart = format!("sweep-{slug}.svg");
            let xl: Vec<String> = lats.iter().map(|l| format!("{l} ms")).collect();
            self.write_chart(
                &chart,
                &svg::line_chart(
                    &format!("Handshakes/s vs engine latency, {}", key.label()),
                    "added engine latency",
                    "handshakes/s",
                    &xl,
                    &[
                        ("sync".into(), sync.clone(), false),
                        ("async".into(), asyn.clone(), false),
                        ("W / latency".into(), bound, true),
                        ("qweb none".into(), vec![none_rate; lats.len()], true),
                    ],
                ),
            );
            self.section(t, Some(&chart));
        }
        Ok(())
    }

    // ---------------------------------------------------------------- B: throughput

    fn exp_b(&mut self) -> Result<()> {
        let cert = self.rsa.clone();
        let kinds = [
            ("qweb none".to_string(), self.qweb_none()),
            ("nginx".to_string(), ServerKind::Nginx { gzip_level: None }),
        ];
        let servers: Vec<Option<ServerProc>> =
            kinds.iter().map(|(l, k)| self.start(l, k, &cert)).collect();
        let files: Vec<(&str, usize)> = if self.profile.name == "quick" {
            vec![("100k.bin", 16)]
        } else {
            vec![("1m.bin", 8), ("100k.bin", 16)]
        };
        let https = if self.profile.name == "quick" {
            vec![HttpVersion::H1]
        } else {
            vec![HttpVersion::H1, HttpVersion::H2]
        };
        let mut rows = Vec::new();
        let mut keys = Vec::new();
        for (file, conns) in &files {
            for h in &https {
                for (i, (label, _)) in kinds.iter().enumerate() {
                    let port = servers[i].as_ref().map(|s| s.port).unwrap_or(1);
                    let mut spec = self.base_spec(port, file, Mode::Keepalive);
                    spec.connections = *conns;
                    spec.http = *h;
                    spec.expect_bytes = Some(self.files.sizes[file]);
                    rows.push((
                        i,
                        spec,
                        None,
                        format!("{label} {file} HTTP/{}", http_name(*h)),
                    ));
                    keys.push((file.to_string(), *h, label.clone()));
                }
            }
        }
        let res = self.interleave("B", &servers, &rows);
        drop(servers);
        let mut t = Table::new(
            format!(
                "B. Secure transfer throughput, keep-alive, TLS 1.3 RSA-2048 ({} workers)",
                self.workers
            ),
            &[
                "file",
                "HTTP",
                "server",
                "MiB/s",
                "requests/s",
                "vs nginx",
                "p50 ms",
                "p99 ms",
                "server CPU %",
                "client CPU %",
                "errors",
            ],
        );
        let mut cats = Vec::new();
        let mut series: Vec<(String, Vec<f64>)> =
            kinds.iter().map(|(l, _)| (l.clone(), vec![])).collect();
        for (j, chunk) in res.chunks(kinds.len()).enumerate() {
            let ngx = chunk[kinds.len() - 1].mib_per_sec;
            let (file, h, _) = &keys[j * kinds.len()];
            cats.push(format!("{file} h{}", http_name(*h)));
            for (k, m) in chunk.iter().enumerate() {
                series[k].1.push(m.mib_per_sec);
                t.row(vec![
                    file.clone(),
                    http_name(*h).into(),
                    kinds[k].0.clone(),
                    num(m.mib_per_sec),
                    num(m.ops_per_sec),
                    ratio(m.mib_per_sec, ngx),
                    ms(m.p50_us),
                    ms(m.p99_us),
                    num(m.server_cpu_pct),
                    num(m.client_cpu_pct),
                    m.errors.to_string(),
                ]);
            }
        }
        t.notes.push(
            "Files are random bytes (incompressible), served from the page cache; every body's \
             byte count is checked. Connections per run: 8 for 1 MiB, 16 for 100 KiB; HTTP/2 uses \
             one stream per connection. nginx runs without kTLS, so `sendfile` does not apply to TLS."
                .into(),
        );
        self.write_chart(
            "b-throughput.svg",
            &svg::bar_chart("B. Secure transfer throughput", "MiB/s", &cats, &series),
        );
        self.section(t, Some("b-throughput.svg"));
        Ok(())
    }

    // ---------------------------------------------------------------- C: compression

    fn exp_c(&mut self) -> Result<()> {
        let comp = match self.compression.clone() {
            Feature::Available(c) => c,
            Feature::Missing(why) => {
                self.skip_section("C. Compression", &why);
                return Ok(());
            }
        };
        let cert = self.rsa.clone();
        let mut kinds: Vec<(String, ServerKind, &str)> = Vec::new();
        for (mode, section) in &comp.sections {
            kinds.push((
                format!("qweb gzip {mode}"),
                ServerKind::Qweb {
                    offload: Offload::None,
                    compression: Some(section.clone()),
                },
                "gzip",
            ));
        }
        if let Some(sync) = comp.sections.get("sync") {
            for enc in ["br", "zstd"] {
                kinds.push((
                    format!("qweb {enc} sync"),
                    ServerKind::Qweb {
                        offload: Offload::None,
                        compression: Some(sync.clone()),
                    },
                    enc,
                ));
            }
        }
        kinds.push((
            "nginx gzip".into(),
            ServerKind::Nginx {
                gzip_level: Some(6),
            },
            "gzip",
        ));
        let servers: Vec<Option<ServerProc>> = kinds
            .iter()
            .map(|(l, k, _)| self.start(l, k, &cert))
            .collect();
        let mut rows = Vec::new();
        for (i, (label, _, enc)) in kinds.iter().enumerate() {
            let Some(s) = &servers[i] else { continue };
            let Some(bytes) = self.probe_encoded(s, "page.html", enc) else {
                continue;
            };
            let mut spec = self.base_spec(s.port, "page.html", Mode::Keepalive);
            spec.connections = 16;
            spec.accept_encoding = Some(enc.to_string());
            spec.expect_encoding = Some(enc.to_string());
            spec.expect_bytes = Some(bytes);
            spec.bytes_tolerance = 1.0;
            if *enc == "gzip" {
                spec.expect_gzip_size = Some(self.files.sizes["page.html"]);
            }
            rows.push((i, spec, None, label.clone()));
        }
        let res = self.interleave("C", &servers, &rows);
        let ngx = res
            .iter()
            .find(|m| m.label == "nginx gzip")
            .map(|m| m.ops_per_sec)
            .unwrap_or(f64::NAN);
        let base = res
            .iter()
            .find(|m| m.label == "qweb gzip sync")
            .map(|m| m.ops_per_sec)
            .unwrap_or(f64::NAN);
        let mut t = Table::new(
            "C. Compression: 100 KiB HTML page per request, keep-alive, 16 connections",
            &[
                "server",
                "requests/s",
                "vs qweb gzip sync",
                "vs nginx",
                "p50 ms",
                "p99 ms",
                "server CPU %",
                "client CPU %",
                "errors",
            ],
        );
        for m in &res {
            t.row(vec![
                m.label.clone(),
                num(m.ops_per_sec),
                ratio(m.ops_per_sec, base),
                ratio(m.ops_per_sec, ngx),
                ms(m.p50_us),
                ms(m.p99_us),
                num(m.server_cpu_pct),
                num(m.client_cpu_pct),
                m.errors.to_string(),
            ]);
        }
        self.write_chart(
            "c-compression.svg",
            &svg::bar_chart(
                "C. Compressed 100 KiB page, requests/s",
                "requests/s",
                &["page.html".to_string()],
                &res.iter()
                    .map(|m| (m.label.clone(), vec![m.ops_per_sec]))
                    .collect::<Vec<_>>(),
            ),
        );
        self.section(t, Some("c-compression.svg"));
        // Time to last byte of one 8 MiB response.
        let mut t2 = Table::new(
            "C. Time to last byte of one 8 MiB text response (gzip, one connection)",
            &["server", "mean ms", "p50 ms", "max ms", "errors"],
        );
        let mut ttlb_rows = Vec::new();
        for (i, (label, _, enc)) in kinds.iter().enumerate() {
            if *enc != "gzip" || label.contains("cached") {
                continue;
            }
            let Some(s) = &servers[i] else { continue };
            let Some(bytes) = self.probe_encoded(s, "8m.txt", "gzip") else {
                continue;
            };
            let mut spec = self.base_spec(s.port, "8m.txt", Mode::Keepalive);
            spec.connections = 1;
            spec.warmup = 0.0;
            spec.count = Some(self.profile.ttlb_count);
            spec.accept_encoding = Some("gzip".into());
            spec.expect_encoding = Some("gzip".into());
            spec.expect_bytes = Some(bytes);
            spec.bytes_tolerance = 1.0;
            spec.expect_gzip_size = Some(self.files.sizes["8m.txt"]);
            spec.timeout = 60.0;
            ttlb_rows.push((i, spec, None, format!("{label} 8 MiB")));
        }
        for m in self.interleave("C-ttlb", &servers, &ttlb_rows) {
            t2.row(vec![
                m.label.clone(),
                ms(m.mean_us),
                ms(m.p50_us),
                ms(m.rounds
                    .first()
                    .map(|r| r.latency.max_us as f64)
                    .unwrap_or(f64::NAN)),
                m.errors.to_string(),
            ]);
        }
        self.section(t2, None);
        Ok(())
    }

    /// One request with `Accept-Encoding: enc`; the encoded body length when the response is
    /// encoded with `enc`.
    fn probe_encoded(&mut self, s: &ServerProc, path: &str, enc: &str) -> Option<u64> {
        let mut spec = self.base_spec(s.port, path, Mode::Keepalive);
        spec.connections = 1;
        spec.warmup = 0.0;
        spec.count = Some(1);
        spec.accept_encoding = Some(enc.into());
        spec.expect_encoding = Some(enc.into());
        spec.timeout = 60.0;
        match run_load(&spec) {
            Ok(r) if r.errors.total() == 0 && r.requests == 1 => Some(r.body_bytes),
            Ok(r) => {
                self.failures.push(format!(
                    "{}: {path} with Accept-Encoding {enc}: {:?}",
                    s.name, r.error_samples
                ));
                None
            }
            Err(e) => {
                self.failures.push(format!("{}: probe {path}: {e}", s.name));
                None
            }
        }
    }

    // ---------------------------------------------------------------- D: TLS + compression

    fn exp_d(&mut self) -> Result<()> {
        let comp = match self.compression.clone() {
            Feature::Available(c) => c,
            Feature::Missing(why) => {
                self.skip_section("D. TLS + compression", &why);
                return Ok(());
            }
        };
        let cert = self.rsa.clone();
        let sync = comp.sections.get("sync").cloned();
        let piped = comp
            .sections
            .get("pipelined")
            .cloned()
            .or_else(|| sync.clone());
        let kinds: Vec<(String, ServerKind, Option<&str>)> = vec![
            (
                "qweb none + gzip sync".into(),
                ServerKind::Qweb {
                    offload: Offload::None,
                    compression: sync,
                },
                None,
            ),
            (
                "qweb async pool + gzip pipelined".into(),
                ServerKind::Qweb {
                    offload: Offload::Pool {
                        mode: OffloadMode::Async,
                        threads: self.workers,
                        added_latency_ms: 0,
                    },
                    compression: piped,
                },
                Some("pool"),
            ),
            (
                "nginx gzip".into(),
                ServerKind::Nginx {
                    gzip_level: Some(6),
                },
                None,
            ),
        ];
        let servers: Vec<Option<ServerProc>> = kinds
            .iter()
            .map(|(l, k, _)| self.start(l, k, &cert))
            .collect();
        let mut rows = Vec::new();
        for (i, (label, _, engine)) in kinds.iter().enumerate() {
            let Some(s) = &servers[i] else { continue };
            let Some(bytes) = self.probe_encoded(s, "page.html", "gzip") else {
                continue;
            };
            let mut spec = self.base_spec(s.port, "page.html", Mode::Handshake);
            spec.connections = self.profile.hs_connections;
            spec.request = true;
            spec.accept_encoding = Some("gzip".into());
            spec.expect_encoding = Some("gzip".into());
            spec.expect_bytes = Some(bytes);
            spec.bytes_tolerance = 1.0;
            spec.expect_gzip_size = Some(self.files.sizes["page.html"]);
            rows.push((i, spec, *engine, label.clone()));
        }
        let res = self.interleave("D", &servers, &rows);
        let base = res.first().map(|m| m.ops_per_sec).unwrap_or(f64::NAN);
        let ngx = res.last().map(|m| m.ops_per_sec).unwrap_or(f64::NAN);
        let mut t = Table::new(
            "D. TLS + compression: new connection (full RSA-2048 handshake, TLS 1.3) + one gzip 100 KiB page",
            &[
                "server", "connections/s", "vs qweb none", "vs nginx", "p50 ms", "p99 ms",
                "server CPU %", "client CPU %", "errors",
            ],
        );
        for m in &res {
            t.row(
                row_cells(&m.label, "", m, base, ngx)
                    .into_iter()
                    .enumerate()
                    .filter(|(i, _)| *i != 1)
                    .map(|(_, c)| c)
                    .collect(),
            );
        }
        self.section(t, None);
        Ok(())
    }

    // ---------------------------------------------------------------- E: latency under load

    fn exp_e(&mut self) -> Result<()> {
        let cert = self.rsa.clone();
        let kinds: Vec<(String, ServerKind, Option<&'static str>)> = vec![
            ("qweb none".into(), self.qweb_none(), None),
            (
                "qweb async pool".into(),
                self.pool(OffloadMode::Async, 0),
                Some("pool"),
            ),
            ("nginx".into(), ServerKind::Nginx { gzip_level: None }, None),
        ];
        let servers: Vec<Option<ServerProc>> = kinds
            .iter()
            .map(|(l, k, _)| self.start(l, k, &cert))
            .collect();
        let probe_rate = 200.0;
        // Per server: label, idle probe rounds, storm probe rounds, storm handshake rates.
        type ERow = (String, Vec<Measured>, Vec<Measured>, Vec<f64>);
        let mut results: Vec<ERow> = kinds
            .iter()
            .map(|(l, _, _)| (l.clone(), vec![], vec![], vec![]))
            .collect();
        for round in 0..self.profile.rounds {
            let order: Vec<usize> = if round % 2 == 0 {
                (0..kinds.len()).collect()
            } else {
                (0..kinds.len()).rev().collect()
            };
            for i in order {
                let Some(s) = &servers[i] else { continue };
                let mut probe = self.base_spec(s.port, "1k.bin", Mode::Keepalive);
                probe.connections = 8;
                probe.rate = Some(probe_rate);
                probe.expect_bytes = Some(self.files.sizes["1k.bin"]);
                // Idle: the probe alone.
                match self.measure_once(s, &probe, None, true) {
                    Ok(m) => results[i]
                        .1
                        .push(Measured::from_rounds("E", &kinds[i].0, vec![m])),
                    Err(e) => self.failures.push(format!("E {}: {e}", kinds[i].0)),
                }
                // Storm: handshakes on other connections during the probe.
                let mut storm = self.base_spec(s.port, "", Mode::Handshake);
                storm.connections = self.profile.hs_connections;
                storm.warmup = probe.warmup;
                storm.duration = probe.duration + 1.0;
                let storm_thread = std::thread::spawn(move || run_load(&storm));
                std::thread::sleep(Duration::from_millis(500));
                // The storm's handshakes land in the server's counter too: no counter check.
                let pr = self.measure_once(s, &probe, None, false);
                let st = storm_thread
                    .join()
                    .map_err(|_| Error::Other("storm thread panicked".into()))?;
                match (pr, st) {
                    (Ok(m), Ok(st)) => {
                        if st.errors.total() > 0 {
                            self.failures.push(format!(
                                "E {} storm: {} errors {:?}",
                                kinds[i].0,
                                st.errors.total(),
                                st.error_samples
                            ));
                        }
                        results[i]
                            .2
                            .push(Measured::from_rounds("E", &kinds[i].0, vec![m]));
                        results[i].3.push(st.ops_per_sec);
                    }
                    (Err(e), _) | (_, Err(e)) => {
                        self.failures.push(format!("E {}: {e}", kinds[i].0))
                    }
                }
            }
        }
        drop(servers);
        let med =
            |v: &[Measured], f: fn(&Measured) -> f64| median(&v.iter().map(f).collect::<Vec<_>>());
        let mut t = Table::new(
            format!(
                "E. Latency of small keep-alive requests (1 KiB, {probe_rate:.0} req/s over 8 connections) \
                 during a handshake storm ({} connections of full RSA-2048 TLS 1.3 handshakes)",
                self.profile.hs_connections
            ),
            &[
                "server", "idle p50 ms", "idle p99 ms", "storm p50 ms", "storm p99 ms",
                "storm p99 vs nginx", "storm handshakes/s", "errors",
            ],
        );
        let ngx_p99 = results
            .last()
            .map(|r| med(&r.2, |m| m.p99_us))
            .unwrap_or(f64::NAN);
        let mut series = vec![
            ("idle p50".to_string(), vec![]),
            ("idle p99".to_string(), vec![]),
            ("storm p50".to_string(), vec![]),
            ("storm p99".to_string(), vec![]),
        ];
        let mut cats = vec![];
        for (label, idle, storm, rates) in &results {
            let errs: u64 = idle.iter().chain(storm.iter()).map(|m| m.errors).sum();
            let vals = [
                med(idle, |m| m.p50_us),
                med(idle, |m| m.p99_us),
                med(storm, |m| m.p50_us),
                med(storm, |m| m.p99_us),
            ];
            for (k, v) in vals.iter().enumerate() {
                series[k].1.push(v / 1000.0);
            }
            cats.push(label.clone());
            t.row(vec![
                label.clone(),
                ms(vals[0]),
                ms(vals[1]),
                ms(vals[2]),
                ms(vals[3]),
                ratio(vals[3], ngx_p99),
                num(median(rates)),
                errs.to_string(),
            ]);
            for (what, v) in [("idle", idle), ("during storm", storm)] {
                for m in v {
                    let mut m = m.clone();
                    m.label = format!("{label} probe {what}");
                    self.measured.push(m);
                }
            }
        }
        t.notes.push(
            "Latency is measured from each request's scheduled send time (open loop), so time a \
             request waits behind a busy worker counts. \"storm p99 vs nginx\": lower is better."
                .into(),
        );
        self.write_chart(
            "e-latency.svg",
            &svg::bar_chart(
                "E. Small-request latency, idle vs during a handshake storm",
                "ms",
                &cats,
                &series,
            ),
        );
        self.section(t, Some("e-latency.svg"));
        Ok(())
    }

    // ---------------------------------------------------------------- F: memory

    fn exp_f(&mut self) -> Result<()> {
        let cert = self.ecdsa.clone();
        let n = self.profile.idle_connections;
        let kinds: Vec<(String, ServerKind)> = vec![
            ("qweb none".into(), self.qweb_none()),
            ("nginx".into(), ServerKind::Nginx { gzip_level: None }),
        ];
        let mut t = Table::new(
            format!(
                "F. Resident memory with {n} idle TLS connections (ECDSA P-256, TLS 1.3, HTTP/1.1, one request each)"
            ),
            &[
                "server", "RSS before MiB", "RSS with conns MiB", "PSS with conns MiB",
                "KiB per conn (RSS)", "vs nginx", "connections held",
            ],
        );
        let mut per_conn = Vec::new();
        let mut rows = Vec::new();
        for (label, kind) in &kinds {
            let Some(s) = self.start(label, kind, &cert) else {
                rows.push(vec![label.clone()]);
                per_conn.push(f64::NAN);
                continue;
            };
            std::thread::sleep(Duration::from_millis(300));
            let (rss0, _) = s.memory_kib();
            let mut spec = self.base_spec(s.port, "1k.bin", Mode::Keepalive);
            spec.connections = 64;
            spec.expect_bytes = Some(self.files.sizes["1k.bin"]);
            spec.timeout = 30.0;
            let set = IdleSet::open(&spec, n)?;
            std::thread::sleep(Duration::from_millis(1000));
            let (rss1, pss1) = s.memory_kib();
            let held = set.len();
            if set.errors.total() > 0 || held != n {
                self.failures.push(format!(
                    "F {label}: {held} of {n} connections held; errors {:?} {:?}",
                    set.errors, set.error_samples
                ));
            }
            if let Ok(m) = s.metrics() {
                let open = parse_metric(&m, "qweb_connections_open", &[]);
                if (open as usize) < held {
                    self.failures.push(format!(
                        "F {label}: server reports {open} open connections, client holds {held}"
                    ));
                }
            }
            drop(set);
            let pc = (rss1 as f64 - rss0 as f64) / n as f64;
            per_conn.push(pc);
            rows.push(vec![
                label.clone(),
                num(rss0 as f64 / 1024.0),
                num(rss1 as f64 / 1024.0),
                num(pss1 as f64 / 1024.0),
                num(pc),
                String::new(),
                held.to_string(),
            ]);
            eprintln!(
                "  {label:<28} RSS {:.1} → {:.1} MiB ({:.1} KiB/conn), {held} held",
                rss0 as f64 / 1024.0,
                rss1 as f64 / 1024.0,
                pc
            );
        }
        let ngx = per_conn.last().copied().unwrap_or(f64::NAN);
        for (mut r, pc) in rows.into_iter().zip(per_conn.iter()) {
            if r.len() > 5 {
                r[5] = ratio(*pc, ngx);
            }
            t.row(r);
        }
        t.notes.push(
            "RSS summed over the server's processes (nginx: master + workers), read from /proc; PSS \
             counts pages shared between nginx's processes once. \"vs nginx\" compares the memory \
             added per connection (lower is better)."
                .into(),
        );
        self.write_chart(
            "f-memory.svg",
            &svg::bar_chart(
                &format!("F. Memory added per idle TLS connection ({n} connections)"),
                "KiB per connection",
                &["per connection".to_string()],
                &kinds
                    .iter()
                    .zip(per_conn.iter())
                    .map(|((l, _), v)| (l.clone(), vec![*v]))
                    .collect::<Vec<_>>(),
            ),
        );
        self.section(t, Some("f-memory.svg"));
        Ok(())
    }

    // ---------------------------------------------------------------- output

    fn section(&mut self, t: Table, chart: Option<&str>) {
        let mut s = t.to_markdown();
        if let Some(c) = chart {
            s.push_str(&format!("\n![{}]({c})\n", t.title));
        }
        self.sections.push(s);
    }

    fn skip_section(&mut self, title: &str, why: &str) {
        self.skipped
            .push(format!("{title}: skipped: not available ({why})"));
        self.sections
            .push(format!("### {title}\n\nskipped: not available ({why})\n"));
    }

    fn write_chart(&mut self, name: &str, svg: &str) {
        let p = self.out.join(name);
        if let Err(e) = std::fs::write(&p, svg) {
            self.failures.push(format!("write {}: {e}", p.display()));
        }
    }

    fn write_results(&self) -> Result<()> {
        let mut md = String::new();
        md.push_str(&format!(
            "# qweb-bench results ({} profile)\n\n",
            self.profile.name
        ));
        md.push_str("## Setup\n\n");
        md.push_str(&format!("- Date (UTC): {}\n", utc_stamp(now_secs())));
        md.push_str(&format!("- Machine: {}\n", machine_summary()));
        md.push_str(&format!(
            "- Load average at the end: {}\n",
            procs::loadavg()
        ));
        md.push_str(&format!(
            "- qweb: {} ({})\n",
            command_output(&self.qweb, &["--version"])
                .unwrap_or_default()
                .trim(),
            self.qweb.display()
        ));
        md.push_str(&format!(
            "- nginx: {}\n",
            self.nginx
                .as_ref()
                .map(|n| n.version_text.clone())
                .unwrap_or_else(|| format!("not available ({})", self.nginx_missing))
        ));
        md.push_str(&format!(
            "- Client: qweb-bench {} (tokio multi-thread, {} threads per load, rustls {} + aws-lc-rs)\n",
            env!("CARGO_PKG_VERSION"),
            crate::cpus(),
            "0.23"
        ));
        md.push_str(&format!(
            "- Workers: {} (qweb worker threads = nginx worker processes); profile: warm-up {} s, \
             {} s measured, {} interleaved round(s) per row (median reported)\n",
            self.workers, self.profile.warmup, self.profile.duration, self.profile.rounds
        ));
        md.push_str(&format!(
            "- Key server: {}; compression: {}\n",
            feature_note(&self.keyserver),
            feature_note(&self.compression)
        ));
        md.push_str(&format!(
            "- Command: `qweb-bench run --{}` (run took {:.0} s; workspace {})\n\n",
            self.profile.name,
            self.started.elapsed().as_secs_f64(),
            self.workspace.display()
        ));
        md.push_str("## Results\n\n");
        for s in &self.sections {
            md.push_str(s);
            md.push('\n');
        }
        if !self.skipped.is_empty() {
            md.push_str("## Skipped\n\n");
            for s in &self.skipped {
                md.push_str(&format!("- {s}\n"));
            }
            md.push('\n');
        }
        md.push_str("## Problems\n\n");
        if self.failures.is_empty() {
            md.push_str("None: every server answered, no request or handshake failed, and qweb's counters matched the client's.\n");
        } else {
            for f in &self.failures {
                md.push_str(&format!("- {f}\n"));
            }
        }
        md.push_str("\n## Commands of every run\n\n```\n");
        for m in &self.measured {
            for c in &m.commands {
                md.push_str(&format!("# {} / {}\n{c}\n", m.experiment, m.label));
            }
        }
        md.push_str("```\n");
        let p = self.out.join("results.md");
        std::fs::write(&p, md).map_err(|e| Error::path("write", &p, e))?;
        let json = serde_json::json!({
            "profile": self.profile,
            "workers": self.workers,
            "machine": machine_summary(),
            "measured": self.measured,
            "skipped": self.skipped,
            "failures": self.failures,
        });
        let p = self.out.join("results.json");
        let text = serde_json::to_string_pretty(&json)
            .map_err(|e| Error::Other(format!("serialize results: {e}")))?;
        std::fs::write(&p, text).map_err(|e| Error::path("write", &p, e))?;
        Ok(())
    }
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
    }
}

fn key_slug(k: KeyKind) -> &'static str {
    match k {
        KeyKind::Rsa2048 => "rsa2048",
        KeyKind::EcdsaP256 => "ecdsa-p256",
    }
}

/// CPU model, CPUs, memory and kernel, from /proc.
pub fn machine_summary() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_else(|| "unknown CPU".into());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map(|kib| format!("{:.1} GiB RAM", kib as f64 / 1024.0 / 1024.0))
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    format!(
        "{model}, {} CPUs available, {mem}, Linux {kernel}",
        crate::cpus()
    )
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
            requests: 0,
            body_bytes: 0,
            mib_per_sec: 0.0,
            latency: Default::default(),
            errors: Default::default(),
            error_samples: vec![],
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
