//! What a load run is asked to do ([`LoadSpec`], [`Mode`]) and what it reports
//! ([`LoadReport`], [`ErrorCounts`]).

use super::*;

/// What each connection does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Connect, full handshake, (one request with --request), close; repeat.
    Handshake,
    /// One connection, many requests.
    Keepalive,
}

/// One load run. Also the arguments of `qweb-bench load`.
#[derive(Debug, Clone, clap::Args, Serialize)]
pub struct LoadSpec {
    /// Target, https://HOST:PORT/PATH.
    pub url: String,
    /// handshake: full handshakes per second; keepalive: requests on open connections.
    #[arg(long, value_enum, default_value = "keepalive")]
    pub mode: Mode,
    /// Concurrent client connections.
    #[arg(short = 'c', long, default_value_t = 64)]
    pub connections: usize,
    /// HTTP/2 only: concurrent requests per connection (keepalive mode).
    #[arg(long, default_value_t = 1)]
    pub streams: usize,
    /// Measured time in seconds (after the warm-up). Ignored with --count.
    #[arg(short = 'd', long, default_value_t = 5.0)]
    pub duration: f64,
    /// Measure exactly this many operations (handshakes or requests) after the warm-up
    /// instead of a fixed duration.
    #[arg(short = 'n', long)]
    pub count: Option<u64>,
    /// Warm-up in seconds: load runs, nothing is counted except errors.
    #[arg(short = 'w', long, default_value_t = 1.0)]
    pub warmup: f64,
    /// TLS version the client offers (only that one).
    #[arg(long, value_enum, default_value = "1.3")]
    pub tls: TlsVersion,
    /// HTTP version (by ALPN).
    #[arg(long, value_enum, default_value = "1.1")]
    pub http: HttpVersion,
    /// Accept-Encoding request header (none sent when absent).
    #[arg(long)]
    pub accept_encoding: Option<String>,
    /// Required Content-Encoding of every response ("identity": none).
    #[arg(long)]
    pub expect_encoding: Option<String>,
    /// Required body bytes of every response (as received, i.e. compressed). Without it the
    /// body must match Content-Length when the response has one.
    #[arg(long)]
    pub expect_bytes: Option<u64>,
    /// Allowed deviation of the body size from --expect-bytes, in percent (compressed bodies
    /// whose chunking depends on timing vary by a few bytes).
    #[arg(long, default_value_t = 0.0)]
    pub bytes_tolerance: f64,
    /// gzip responses: the decoded size the gzip trailer (ISIZE) must state, and the body
    /// must start with the gzip magic: a cheap check that the whole stream arrived.
    #[arg(long)]
    pub expect_gzip_size: Option<u64>,
    /// Required status of every response.
    #[arg(long, default_value_t = 200)]
    pub expect_status: u16,
    /// Handshake mode: send one request on each connection before closing it.
    #[arg(long)]
    pub request: bool,
    /// Keepalive mode: total requests per second, paced evenly over the connections (open
    /// loop); latency is measured from each request's scheduled time.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Client runtime threads (default: one per CPU).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Per-operation timeout in seconds (counted as an error).
    #[arg(long, default_value_t = 10.0)]
    pub timeout: f64,
    /// Handshake mode: each new connection tries, with this probability, to resume a session
    /// (TLS 1.3 ticket, TLS 1.2 ticket or session id) an earlier connection of the run got;
    /// the others offer none and must be full. 0: no session store at all. Whether each
    /// handshake resumed is read from rustls (`handshake_kind`) and counted.
    #[arg(long, default_value_t = 0.0)]
    pub resume_ratio: f64,
    /// More servers (the same path is requested): new connections go round-robin over the URL
    /// and these, like a load balancer; sessions from one may be offered to another.
    #[arg(long)]
    pub also: Vec<String>,
    /// Handshake mode: this fraction of new connections (drawn per connection) offer only
    /// RSA signature schemes (and, on TLS 1.2, only the ECDHE_RSA suite), as clients that
    /// cannot verify ECDSA: a server with dual certificates must give them its RSA one.
    #[arg(long, default_value_t = 0.0)]
    pub rsa_only_ratio: f64,
}

impl LoadSpec {
    /// A spec with the defaults of the command line.
    pub fn new(url: impl Into<String>, mode: Mode) -> Self {
        LoadSpec {
            url: url.into(),
            mode,
            connections: 64,
            streams: 1,
            duration: 5.0,
            count: None,
            warmup: 1.0,
            tls: TlsVersion::Tls13,
            http: HttpVersion::H1,
            accept_encoding: None,
            expect_encoding: None,
            expect_bytes: None,
            bytes_tolerance: 0.0,
            expect_gzip_size: None,
            expect_status: 200,
            request: false,
            rate: None,
            threads: None,
            timeout: 10.0,
            resume_ratio: 0.0,
            also: vec![],
            rsa_only_ratio: 0.0,
        }
    }

    /// The `qweb-bench load` command line that runs this spec.
    pub fn command_line(&self) -> String {
        let mut a = vec!["qweb-bench load".to_string(), self.url.clone()];
        a.push(format!(
            "--mode {}",
            match self.mode {
                Mode::Handshake => "handshake",
                Mode::Keepalive => "keepalive",
            }
        ));
        a.push(format!("-c {}", self.connections));
        if self.streams != 1 {
            a.push(format!("--streams {}", self.streams));
        }
        match self.count {
            Some(n) => a.push(format!("-n {n}")),
            None => a.push(format!("-d {}", self.duration)),
        }
        a.push(format!("-w {}", self.warmup));
        a.push(format!(
            "--tls {}",
            match self.tls {
                TlsVersion::Tls12 => "1.2",
                TlsVersion::Tls13 => "1.3",
            }
        ));
        a.push(format!(
            "--http {}",
            match self.http {
                HttpVersion::H1 => "1.1",
                HttpVersion::H2 => "2",
                HttpVersion::H3 => "3",
            }
        ));
        if let Some(e) = &self.accept_encoding {
            a.push(format!("--accept-encoding {e}"));
        }
        if let Some(e) = &self.expect_encoding {
            a.push(format!("--expect-encoding {e}"));
        }
        if let Some(b) = self.expect_bytes {
            a.push(format!("--expect-bytes {b}"));
        }
        if self.bytes_tolerance > 0.0 {
            a.push(format!("--bytes-tolerance {}", self.bytes_tolerance));
        }
        if let Some(b) = self.expect_gzip_size {
            a.push(format!("--expect-gzip-size {b}"));
        }
        if self.request {
            a.push("--request".into());
        }
        if let Some(r) = self.rate {
            a.push(format!("--rate {r}"));
        }
        if let Some(t) = self.threads {
            a.push(format!("--threads {t}"));
        }
        if self.resume_ratio > 0.0 {
            a.push(format!("--resume-ratio {}", self.resume_ratio));
        }
        for u in &self.also {
            a.push(format!("--also {u}"));
        }
        if self.rsa_only_ratio > 0.0 {
            a.push(format!("--rsa-only-ratio {}", self.rsa_only_ratio));
        }
        a.join(" ")
    }
}

/// Errors by kind, over the whole run (warm-up included: nothing is hidden).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ErrorCounts {
    /// TCP connect failed.
    pub connect: u64,
    /// TLS handshake failed.
    pub tls: u64,
    /// The handshake was not a full one (resumption happened although disabled).
    pub not_full_handshake: u64,
    /// HTTP protocol error (connection reset, malformed response...).
    pub http: u64,
    /// Unexpected status.
    pub status: u64,
    /// Body bytes differ from the expected count or from Content-Length.
    pub bytes: u64,
    /// Unexpected Content-Encoding.
    pub encoding: u64,
    /// The operation timed out.
    pub timeout: u64,
}

impl ErrorCounts {
    /// All errors.
    pub fn total(&self) -> u64 {
        self.connect
            + self.tls
            + self.not_full_handshake
            + self.http
            + self.status
            + self.bytes
            + self.encoding
            + self.timeout
    }

    pub(super) fn add(&mut self, o: &ErrorCounts) {
        self.connect += o.connect;
        self.tls += o.tls;
        self.not_full_handshake += o.not_full_handshake;
        self.http += o.http;
        self.status += o.status;
        self.bytes += o.bytes;
        self.encoding += o.encoding;
        self.timeout += o.timeout;
    }
}

/// The result of one run.
#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    /// The spec that ran.
    pub spec: LoadSpec,
    /// Length of the measured window, seconds.
    pub measured_secs: f64,
    /// Operations completed in the window (handshakes in handshake mode, else requests).
    pub ops: u64,
    /// `ops / measured_secs`.
    pub ops_per_sec: f64,
    /// Handshakes completed in the window (full or, with --resume-ratio, resumed).
    pub handshakes: u64,
    /// Handshakes completed over the whole run, warm-up included (to compare with the
    /// server's handshake counter).
    pub handshakes_all: u64,
    /// Resumed handshakes in the window (rustls' `HandshakeKind::Resumed`).
    pub resumed: u64,
    /// Resumed handshakes over the whole run, warm-up included.
    pub resumed_all: u64,
    /// Connections in the window that offered a session (asked to resume).
    pub resume_asked: u64,
    /// Requests completed in the window.
    pub requests: u64,
    /// Response body bytes received in the window (as sent: compressed when compressed).
    pub body_bytes: u64,
    /// `body_bytes` per second, in MiB/s.
    pub mib_per_sec: f64,
    /// Per-operation latency in the window (handshake mode: connect to close; keepalive:
    /// request sent, or scheduled with --rate, to last body byte).
    pub latency: LatencySummary,
    /// Errors.
    pub errors: ErrorCounts,
    /// The first few error messages.
    pub error_samples: Vec<String>,
    /// Server handshake signatures verified with ECDSA, whole run (warm-up included).
    #[serde(default)]
    pub ecdsa_signed: u64,
    /// Server handshake signatures verified with RSA, whole run (warm-up included).
    #[serde(default)]
    pub rsa_signed: u64,
}

impl LoadReport {
    /// Resumed handshakes / handshakes in the window (NaN without handshakes).
    pub fn resumed_fraction(&self) -> f64 {
        if self.handshakes == 0 {
            f64::NAN
        } else {
            self.resumed as f64 / self.handshakes as f64
        }
    }

    /// A human-readable summary.
    pub fn human(&self) -> String {
        let what = match self.spec.mode {
            Mode::Handshake => "handshakes",
            Mode::Keepalive => "requests",
        };
        let mut s = format!(
            "{}: {} {what} in {:.2}s = {:.1} {what}/s, {:.1} MiB/s\n\
             latency us: mean {:.0}  p50 {}  p90 {}  p99 {}  max {}\n\
             full handshakes: {} in window, {} in all; requests: {}; errors: {}",
            self.spec.url,
            self.ops,
            self.measured_secs,
            self.ops_per_sec,
            self.mib_per_sec,
            self.latency.mean_us,
            self.latency.p50_us,
            self.latency.p90_us,
            self.latency.p99_us,
            self.latency.max_us,
            self.handshakes,
            self.handshakes_all,
            self.requests,
            self.errors.total()
        );
        if self.spec.resume_ratio > 0.0 {
            s.push_str(&format!(
                "\nresumption: {} of {} handshakes offered a session, {} resumed ({:.1}%)",
                self.resume_asked,
                self.handshakes,
                self.resumed,
                self.resumed_fraction() * 100.0
            ));
        }
        if self.errors.total() > 0 {
            s.push_str(&format!("\nerrors by kind: {:?}", self.errors));
            for m in &self.error_samples {
                s.push_str(&format!("\n  error: {m}"));
            }
        }
        s
    }
}
