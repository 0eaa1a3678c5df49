//! Finding the servers and preparing what every run serves: the qweb and nginx binaries,
//! the files, and the optional features (key server, compression) detected at run time.

use super::*;

pub(super) fn find_qweb(args: &RunArgs, workspace: &Path) -> Result<PathBuf> {
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

pub(super) fn find_nginx(args: &RunArgs) -> Result<NginxInfo> {
    let info = peers::find(Peer::Nginx, args.nginx.as_deref(), !args.no_install)?;
    let version = nginx_conf::parse_nginx_version(&info.version_text).ok_or_else(|| {
        Error::Other(format!(
            "cannot parse nginx version from {:?}",
            info.version_text
        ))
    })?;
    Ok(NginxInfo {
        bin: info.bin,
        version,
        version_text: info.version_text,
    })
}

/// Deterministic pseudo-random bytes (xorshift64*).
struct Rng(u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
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

pub(super) fn make_files(www: &Path) -> Result<Files> {
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
pub(super) fn detect_keyserver(qweb: &Path, out: &Path) -> Feature<KeyserverSetup> {
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
pub(super) fn detect_compression(
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
            twin: None,
            key: Some(cert.key.clone()),
            root: files.www.clone(),
            offload: Offload::None,
            compression: Some(section.clone()),
            keepalive_secs: 75,
            max_connections_per_worker: 100,
            plain_port: None,
            resumption: false,
            ticket_keyserver: None,
            http3: false,
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
