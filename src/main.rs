//! The `qweb` command: `serve`, `reload`, `upgrade`, `keyserver`, `check-config` (and `-t`).

mod access_sink;
mod profiling;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use qweb_server::{Config, Server};
use tracing_subscriber::filter::{filter_fn, EnvFilter};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

/// mimalloc instead of glibc's malloc: after a burst (an attack, a traffic peak) freed pages go
/// back to the system, and large buffers (file chunks, TLS records) are reused rather than
/// mmapped and unmapped each time. docs/RELIABILITY.md has the soak figures.
#[cfg(not(feature = "alloc-count"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Measurement builds: mimalloc, counted (see `profiling`).
#[cfg(feature = "alloc-count")]
#[global_allocator]
static ALLOCATOR: profiling::alloc_count::Counting = profiling::alloc_count::Counting;

/// qweb: an event-driven HTTPS web server and reverse proxy.
#[derive(Parser)]
#[command(version, about, long_about = None, args_conflicts_with_subcommands = true)]
struct Cli {
    /// Check the configuration and exit (as nginx -t): 0 when valid, 1 with the file, line,
    /// column and key of the first error. Reads --config, else $QWEB_CONFIG or
    /// /etc/qweb/qweb.toml when it exists, else checks the built-in default.
    #[arg(short = 't', long = "test-config")]
    test: bool,
    /// The configuration file for -t.
    #[arg(short, long, value_name = "FILE", requires = "test")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server. Without --config it reads $QWEB_CONFIG, else /etc/qweb/qweb.toml, when
    /// that file exists; else it serves HTTPS on https://127.0.0.1:8443 (a self-signed
    /// certificate is generated on first run and kept in the state folder) and HTTP on
    /// http://127.0.0.1:8080, serving ./public when it exists, else a built-in welcome page.
    Serve {
        /// TOML configuration file (see examples/qweb.toml for every key).
        #[arg(short, long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Check the configuration (includes and environment variables too) and exit: 0
        /// when valid, 1 with the error.
        #[arg(long)]
        check: bool,
    },
    /// Run a key server: holds private keys outside the web server process and signs for
    /// qweb's `keyserver` engine over a Unix socket (0600, peer uid checked) and/or TCP with
    /// mutual TLS. See examples/keyserver.toml and docs/KEYSERVER_PROTOCOL.md.
    Keyserver {
        /// TOML configuration file.
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
        /// For measurement only: delay every answer by this many milliseconds, to stand in
        /// for a remote key server or a slow device. Never use in production.
        #[arg(long, value_name = "MS", default_value_t = 0)]
        added_latency_ms: u64,
    },
    /// Reload the running `qweb serve` (as SIGHUP does): it reads and validates its
    /// configuration file again; on an error it keeps serving the old one and logs where the
    /// error is. The instance is found through its pid file in the state folder (of the
    /// configuration's `state_dir`, else the default one). Exits 1 when no instance runs (or,
    /// before signalling, when the configuration file is invalid).
    Reload {
        /// The configuration file the instance runs with (to find its state folder).
        #[arg(short, long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Upgrade the running `qweb serve` to the binary now installed (as SIGUSR2 does): it
    /// starts that binary with its listening sockets, and once the new process serves, stops
    /// accepting, drains and exits. No connection is refused meanwhile. Exits 1 when no
    /// instance runs.
    Upgrade {
        /// The configuration file the instance runs with (to find its state folder).
        #[arg(short, long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Validate a configuration file and exit: 0 when valid, 1 with the file, line and key of
    /// the first error otherwise. Certificates and keys are loaded to check them. Without
    /// FILE: $QWEB_CONFIG, else /etc/qweb/qweb.toml when it exists, else the built-in default.
    CheckConfig {
        /// TOML configuration file.
        #[arg(value_name = "FILE")]
        file: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    // Held pending until `qweb serve` has its handlers (see `Signals`): by their default
    // action SIGHUP and SIGUSR1/2 would end a process that a reload, a log rotation or an
    // upgrade signals while it starts.
    startup_signals(libc::SIG_BLOCK);
    let cli = Cli::parse();
    let command = match (cli.test, cli.command) {
        (true, _) => Command::CheckConfig { file: cli.config },
        (false, Some(c)) => c,
        (false, None) => {
            // `qweb` alone: the usage, as for any wrong invocation
            let _ = <Cli as clap::CommandFactory>::command().print_help();
            return ExitCode::from(2);
        }
    };
    if !matches!(
        command,
        Command::Serve { check: false, .. } | Command::Keyserver { .. }
    ) {
        startup_signals(libc::SIG_UNBLOCK);
    }
    match command {
        Command::CheckConfig { file: config }
        | Command::Serve {
            config,
            check: true,
        } => check(config),
        Command::Serve { config, .. } => serve(config),
        Command::Reload { config } => signal_instance(config, qweb_server::control::RELOAD),
        Command::Upgrade { config } => signal_instance(config, qweb_server::control::UPGRADE),
        Command::Keyserver {
            config,
            added_latency_ms,
        } => keyserver(&config, added_latency_ms),
    }
}

fn keyserver(path: &std::path::Path, added_latency_ms: u64) -> ExitCode {
    let mut cfg = match qweb_keyserver::server::KeyserverConfig::from_file(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    cfg.added_latency = std::time::Duration::from_millis(added_latency_ms);
    let exposed: Vec<String> = cfg
        .keys
        .iter()
        .filter_map(|k| qweb_server::control::exposed(k, true))
        .collect();
    let log = qweb_server::config::LogConfig {
        access: false,
        ..Default::default()
    };
    init_logging(&log, None);
    let signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let unix = cfg.unix.clone();
    let limits = cfg.limits;
    let server = match qweb_keyserver::server::start(cfg) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some((p, uids)) = &unix {
        eprintln!(
            "qweb keyserver: listening on unix:{} (uids {uids:?})",
            p.display()
        );
    }
    if let Some(a) = server.tls_addr {
        eprintln!("qweb keyserver: listening on tls://{a} (mutual TLS)");
    }
    if let Some(a) = server.admin_addr {
        eprintln!("qweb keyserver: metrics on http://{a}/metrics");
    }
    eprintln!(
        "qweb keyserver: per connection: at most {} answers waiting, {} requests signing, frame timeout {:?}",
        limits.max_answers, limits.max_signing, limits.frame_timeout
    );
    for id in &server.key_ids {
        eprintln!("qweb keyserver: key {}", id.hex());
    }
    if added_latency_ms > 0 {
        eprintln!(
            "qweb keyserver: adding {added_latency_ms} ms to every answer (measurement only)"
        );
    }
    for w in exposed {
        tracing::warn!("{w}");
    }
    eprintln!("qweb keyserver: ready");
    signals.wait(move || server.shutdown())
}

/// Logs to stderr; access-log lines (target `qweb::access`, already formatted with their
/// time) to `access` when given.
fn init_logging(config: &qweb_server::config::LogConfig, access: Option<access_sink::AccessSink>) {
    subscriber(config, access).init();
}

/// The subscriber [`init_logging`] installs.
fn subscriber(
    config: &qweb_server::config::LogConfig,
    access: Option<access_sink::AccessSink>,
) -> impl tracing::Subscriber + Send + Sync {
    let directives = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| EnvFilter::try_new(v).is_ok())
        .unwrap_or_else(|| {
            // h2 warns once per misbehaving connection (rapid reset); qweb logs those itself,
            // once per peer per minute.
            if config.level.contains("h2") {
                config.level.clone()
            } else {
                format!("{},h2=error", config.level)
            }
        });
    use std::io::IsTerminal;
    let errors = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_filter(EnvFilter::new(&directives))
        .with_filter(filter_fn(|m| m.target() != "qweb::access"));
    let access = access.map(|sink| {
        tracing_subscriber::fmt::layer()
            .with_writer(sink)
            .with_ansi(false)
            .with_target(false)
            .with_level(false)
            .without_time()
            .with_filter(filter_fn(|m| m.target() == "qweb::access"))
    });
    // The same directives (plus the access lines) as a global filter first: what no layer
    // wants is refused at its call site, once. Without it the per-layer filters above leave
    // every call site "sometimes" enabled, and each of h2's trace spans (several per frame)
    // was created and dropped in the registry: 13-20 % of a worker's time on HTTP/2.
    let global = EnvFilter::new(format!("{directives},qweb::access=info"));
    tracing_subscriber::registry()
        .with(global)
        .with(errors)
        .with(access)
}

/// The configuration to use: `--config`'s file, else the default file when it exists
/// (`$QWEB_CONFIG`, else /etc/qweb/qweb.toml), else the built-in default.
enum Chosen {
    File(PathBuf),
    /// No file: the path looked at, which does not exist.
    BuiltIn(PathBuf),
}

impl Chosen {
    fn new(config: Option<PathBuf>) -> Chosen {
        match config {
            Some(p) => Chosen::File(p),
            None => {
                let p = qweb_server::config::default_config_path();
                if p.exists() {
                    Chosen::File(p)
                } else {
                    Chosen::BuiltIn(p)
                }
            }
        }
    }

    fn load(&self) -> Result<Config, qweb_server::ConfigError> {
        match self {
            Chosen::File(p) => Config::from_file(p),
            Chosen::BuiltIn(_) => Ok(Config::default_config()),
        }
    }

    /// What the banner and `check` say: "FILE" (and how many it includes), or the built-in
    /// default and why.
    fn describe(&self, config: &Config) -> String {
        match self {
            Chosen::File(p) => match config.files.len() {
                0 | 1 => p.display().to_string(),
                n => format!("{} (and {} included file(s))", p.display(), n - 1),
            },
            Chosen::BuiltIn(p) => {
                let why = match std::env::var_os("QWEB_CONFIG").filter(|v| !v.is_empty()) {
                    Some(_) => format!("QWEB_CONFIG={} does not exist", p.display()),
                    None => format!("no {}", p.display()),
                };
                format!("the built-in default ({why})")
            }
        }
    }
}

/// `qweb -t`, `qweb serve --check`, `qweb check-config`: validates and says so.
fn check(config: Option<PathBuf>) -> ExitCode {
    let chosen = Chosen::new(config);
    match chosen.load() {
        Ok(c) => {
            println!(
                "{}: ok ({} listener(s), {} route(s), {} worker(s))",
                chosen.describe(&c),
                c.listeners.len(),
                c.routes.len(),
                c.workers
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn serve(path: Option<PathBuf>) -> ExitCode {
    // First of all: until the handlers are installed, SIGHUP and SIGUSR2 (`qweb reload`,
    // `qweb upgrade`, a service manager) would kill the process by their default action.
    // A signal that comes while the configuration loads is acted on once serving starts.
    let signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let chosen = Chosen::new(path);
    let config = match chosen.load() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let described = chosen.describe(&config);
    // always installed: a reload may turn the access log on, or move it
    let sink = match access_sink::AccessSink::new(config.log.access_file.as_deref()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!(
                "error: log.access_file {}: {e}",
                config
                    .log
                    .access_file
                    .as_deref()
                    .unwrap_or(std::path::Path::new("-"))
                    .display()
            );
            return ExitCode::FAILURE;
        }
    };
    init_logging(&config.log, Some(sink.clone()));
    #[cfg(feature = "alloc-count")]
    profiling::alloc_count::register();
    #[cfg(feature = "profile")]
    let profiler = profiling::Profiler::from_env();
    match qweb_server::fd_limit::raise_fd_limit() {
        Ok((old, new)) if old != new => {
            tracing::debug!("open-file limit raised from {old:?} to {new:?}");
        }
        Ok(_) => {}
        Err(e) => tracing::warn!("cannot raise the open-file limit: {e}"),
    }
    let listeners = config.listeners.clone();
    let workers = config.workers;
    eprintln!("qweb: configuration {described}");
    let server = match Server::start(config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    for (l, addr) in listeners.iter().zip(server.local_addrs()) {
        let (scheme, protos) = match (&l.tls, l.http2) {
            (Some(_), true) => ("https", "HTTP/2, HTTP/1.1"),
            (Some(_), false) => ("https", "HTTP/1.1"),
            (None, _) => ("http", "HTTP/1.1"),
        };
        eprintln!("qweb: listening on {scheme}://{addr}/ ({protos})");
    }
    let info = server.start_info();
    if let Some(ss) = &info.self_signed {
        eprintln!(
            "qweb: self-signed certificate {} ({}); key {}",
            ss.cert.display(),
            if ss.created {
                "generated now"
            } else {
                "reused"
            },
            ss.key.display()
        );
    }
    if let Some(w) = &info.welcome {
        eprintln!(
            "qweb: no ./public folder: serving the built-in welcome site from {}",
            w.display()
        );
    }
    if let Some(a) = server.admin_addr() {
        eprintln!("qweb: metrics on http://{a}/metrics");
    }
    for w in qweb_server::control::exposed_files(server.config()) {
        tracing::warn!("{w}");
    }
    let pid_file = match qweb_server::control::PidFile::write(&server.config().state_dir) {
        Ok(f) => Some(f),
        Err(e) => {
            tracing::warn!(
                "cannot write the pid file (`qweb reload` will not find this instance): {e}"
            );
            None
        }
    };
    let unadopted = qweb_server::upgrade::close_unadopted();
    if unadopted > 0 {
        tracing::info!(
            "upgrade: closed {unadopted} inherited socket(s) the configuration does not use"
        );
    }
    eprintln!("qweb: {workers} worker(s); Ctrl-C or SIGTERM stops, SIGHUP or `qweb reload` reloads, SIGUSR2 or `qweb upgrade` upgrades");
    qweb_server::notify::ready();
    // started by a binary upgrade: the old process may now drain
    qweb_server::upgrade::signal_ready();

    let code = signals.serve(server, sink);
    drop(pid_file);
    #[cfg(feature = "profile")]
    if let Some(p) = profiler {
        p.finish();
    }
    code
}

/// `qweb reload`, `qweb upgrade`: signals the running instance through its pid file.
fn signal_instance(config: Option<PathBuf>, signal: qweb_server::control::Signal) -> ExitCode {
    let state_dir = match Chosen::new(config).load() {
        Ok(c) => c.state_dir,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match qweb_server::control::signal_instance(&state_dir, signal) {
        Ok(pid) => {
            eprintln!("qweb: signalled process {pid}; it logs the result");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Blocks (`SIG_BLOCK`) or unblocks (`SIG_UNBLOCK`) SIGHUP, SIGUSR1 and SIGUSR2 for the
/// calling thread, and so for the threads it starts afterwards. A signal blocked stays
/// pending and is delivered when unblocked.
fn startup_signals(how: libc::c_int) {
    #[allow(unsafe_code)]
    // SAFETY: `set` is a local sigset_t initialised by sigemptyset before use; sigaddset gets
    // valid signal numbers; pthread_sigmask reads `set` and takes a null old-set pointer,
    // which it allows. None of these calls keeps a pointer past its return.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGHUP, libc::SIGUSR1, libc::SIGUSR2] {
            libc::sigaddset(&mut set, sig);
        }
        libc::pthread_sigmask(how, &set, std::ptr::null_mut());
    }
}

/// SIGINT, SIGTERM and SIGHUP handlers, installed before the process says it is ready (so
/// that a signal sent right after the ready line is never the default, fatal one). They are
/// installed first thing in `qweb serve`, on the main thread, before any other thread starts;
/// SIGHUP, SIGUSR1 and SIGUSR2, blocked since `main` began, are unblocked once they are.
struct Signals {
    rt: tokio::runtime::Runtime,
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    usr1: tokio::signal::unix::Signal,
    usr2: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Signals, String> {
        use tokio::signal::unix::{signal, SignalKind};
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the signal handler: {e}"))?;
        let (int, term, hup, usr1, usr2) = rt.block_on(async {
            (
                signal(SignalKind::interrupt()),
                signal(SignalKind::terminate()),
                signal(SignalKind::hangup()),
                signal(SignalKind::user_defined1()),
                signal(SignalKind::user_defined2()),
            )
        });
        let int = int.map_err(|e| format!("cannot install the SIGINT handler: {e}"))?;
        let term = term.map_err(|e| format!("cannot install the SIGTERM handler: {e}"))?;
        let hup = hup.map_err(|e| format!("cannot install the SIGHUP handler: {e}"))?;
        let usr1 = usr1.map_err(|e| format!("cannot install the SIGUSR1 handler: {e}"))?;
        let usr2 = usr2.map_err(|e| format!("cannot install the SIGUSR2 handler: {e}"))?;
        // A signal that came meanwhile is delivered now, to the handler.
        startup_signals(libc::SIG_UNBLOCK);
        Ok(Signals {
            rt,
            int,
            term,
            hup,
            usr1,
            usr2,
        })
    }

    /// Serves until SIGINT/SIGTERM, reloading on SIGHUP and reopening the access log on
    /// SIGUSR1, then stops gracefully (a second stop signal exits at once).
    fn serve(
        self,
        mut server: qweb_server::RunningServer,
        sink: access_sink::AccessSink,
    ) -> ExitCode {
        let Signals {
            rt,
            mut int,
            mut term,
            mut hup,
            mut usr1,
            mut usr2,
        } = self;
        let mut upgraded = false;
        rt.block_on(async {
            loop {
                tokio::select! {
                    _ = int.recv() => break,
                    _ = term.recv() => break,
                    _ = usr2.recv() => {
                        // argv[0], not /proc/self/exe: the binary at that path may be new
                        let mut args = std::env::args_os();
                        let exe = PathBuf::from(args.next().unwrap_or_else(|| "qweb".into()));
                        let args: Vec<std::ffi::OsString> = args.collect();
                        eprintln!("qweb: upgrade: starting {} with the listening sockets", exe.display());
                        match server.upgrade(&exe, &args, std::time::Duration::from_secs(30)) {
                            Ok(pid) => {
                                eprintln!(
                                    "qweb: upgrade: process {pid} serves; this one ({}) stops accepting, drains and exits",
                                    std::process::id()
                                );
                                upgraded = true;
                                break;
                            }
                            Err(e) => eprintln!("qweb: upgrade failed, this process serves on: {e}"),
                        }
                    }
                    _ = usr1.recv() => match sink.reopen() {
                        Ok(()) => tracing::info!("access log reopened"),
                        Err(e) => tracing::error!("cannot reopen the access log (the old file stays in use): {e}"),
                    },
                    _ = hup.recv() => {
                        qweb_server::notify::reloading();
                        // blocks this (signal) thread only: workers serve meanwhile
                        match server.reload_from(None) {
                            Ok(()) => {
                                if let Err(e) = sink.set_path(server.config().log.access_file.as_deref()) {
                                    tracing::error!("log.access_file: {e}; the access log stays where it was");
                                }
                                eprintln!(
                                "qweb: configuration reloaded; new connections use it ({} listener(s): {})",
                                server.local_addrs().len(),
                                server
                                    .local_addrs()
                                    .iter()
                                    .map(|a| a.to_string())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                                )
                            }
                            Err(e) => eprintln!(
                                "qweb: reload refused, the running configuration stays: {e}"
                            ),
                        }
                        qweb_server::notify::ready();
                    }
                }
            }
        });
        if upgraded {
            // no STOPPING=1: the service goes on, in the new process
            return Signals::stop_gracefully(rt, int, term, move || {
                server.hand_over();
                let (sent, received) = qweb_server::upgrade::quic_forwarding();
                if sent + received > 0 {
                    eprintln!("qweb: upgrade: HTTP/3: {received} datagram(s) of this process's connections came through the new process ({sent} sent the other way)");
                }
            });
        }
        qweb_server::notify::stopping();
        Signals::stop_gracefully(rt, int, term, move || server.shutdown())
    }

    /// Waits for SIGINT/SIGTERM, then runs `stop` (a graceful shutdown); a second signal
    /// exits at once.
    fn wait(self, stop: impl FnOnce() + Send + 'static) -> ExitCode {
        let Signals {
            rt,
            mut int,
            mut term,
            ..
        } = self;
        rt.block_on(async {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        });
        Signals::stop_gracefully(rt, int, term, stop)
    }

    /// Runs `stop` (a graceful shutdown); a second SIGINT/SIGTERM exits at once.
    fn stop_gracefully(
        rt: tokio::runtime::Runtime,
        mut int: tokio::signal::unix::Signal,
        mut term: tokio::signal::unix::Signal,
        stop: impl FnOnce() + Send + 'static,
    ) -> ExitCode {
        rt.block_on(async move {
            tracing::info!("shutting down: no new connections; waiting for in-flight requests");
            let mut stopping = tokio::task::spawn_blocking(stop);
            let code = tokio::select! {
                _ = &mut stopping => {
                    tracing::info!("stopped");
                    return ExitCode::SUCCESS;
                }
                _ = int.recv() => 130,
                _ = term.recv() => 130,
            };
            tracing::warn!("second signal: exiting now");
            // Not a return: the runtime would wait for the graceful stop (a blocking task)
            // and for in-flight requests before the process could end.
            std::process::exit(code)
        })
    }
}

#[cfg(test)]
mod tests {
    /// Spans below the log level (h2 opens several per frame) are refused at their call site,
    /// never created; access lines still pass at any level.
    #[test]
    fn disabled_spans_are_not_created() {
        let config = qweb_server::config::LogConfig {
            level: "warn".into(),
            ..Default::default()
        };
        tracing::subscriber::with_default(super::subscriber(&config, None), || {
            assert!(tracing::trace_span!(target: "h2::proto", "poll").is_disabled());
            assert!(tracing::debug_span!("qweb").is_disabled());
            assert!(!tracing::warn_span!("qweb").is_disabled());
            assert!(tracing::enabled!(target: "qweb::access", tracing::Level::INFO));
        });
    }
}
