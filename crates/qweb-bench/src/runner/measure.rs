//! The shared measuring machinery: start a server and check it answers, run one load with
//! its checks (client errors, qweb's handshake and offload counters), and interleave rows
//! over rounds in ABBA order.

use super::*;

impl Runner {
    pub(super) fn base_spec(&self, port: u16, path: &str, mode: Mode) -> LoadSpec {
        let mut s = LoadSpec::new(format!("https://127.0.0.1:{port}/{path}"), mode);
        s.warmup = self.profile.warmup;
        s.duration = self.profile.duration;
        s
    }

    /// Starts one server; `None` (with a failure or skip recorded) when it cannot run.
    pub(super) fn start(
        &mut self,
        label: &str,
        kind: &ServerKind,
        cert: &CertFiles,
    ) -> Option<ServerProc> {
        self.start_dual(label, kind, cert, None)
    }

    /// [`Runner::start`] with a `twin` certificate for the same names (dual certificates;
    /// qweb and nginx only).
    pub(super) fn start_dual(
        &mut self,
        label: &str,
        kind: &ServerKind,
        cert: &CertFiles,
        twin: Option<&CertFiles>,
    ) -> Option<ServerProc> {
        self.server_seq += 1;
        let seq = self.server_seq;
        let slug: String = label
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let name = format!("{seq:02}-{slug}");
        let res = (|| -> Result<ServerProc> {
            #[allow(unsafe_code)]
            // SAFETY: geteuid has no preconditions.
            let root = unsafe { libc::geteuid() } == 0;
            let at = Slot {
                label,
                port: procs::free_port()?,
                plain: procs::free_port()?,
                log: self.out.join("logs").join(format!("{name}.log")),
                name,
                root,
                twin,
            };
            let mut p = match kind {
                ServerKind::Qweb {
                    offload,
                    compression,
                    resumption,
                    ticket_keyserver,
                } => self.launch_qweb(
                    &at,
                    cert,
                    offload,
                    compression,
                    *resumption,
                    ticket_keyserver,
                )?,
                ServerKind::Nginx {
                    gzip_level,
                    resumption,
                } => self.launch_nginx(&at, cert, *gzip_level, *resumption)?,
                ServerKind::H2o {
                    resumption,
                    gzip_level,
                } => self.launch_h2o(&at, cert, *resumption, *gzip_level)?,
                ServerKind::Caddy { gzip_level } => self.launch_caddy(&at, cert, *gzip_level)?,
            };
            p.plain_port = Some(at.plain);
            Ok(p)
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
        self.answers(label, p)
    }

    /// `p` if it answers a request correctly (it must before it is measured), else `None`
    /// with the failure recorded.
    fn answers(&mut self, label: &str, p: ServerProc) -> Option<ServerProc> {
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

    fn launch_qweb(
        &self,
        at: &Slot<'_>,
        cert: &CertFiles,
        offload: &Offload,
        compression: &Option<String>,
        resumption: bool,
        ticket_keyserver: &Option<String>,
    ) -> Result<ServerProc> {
        let admin = procs::free_port()?;
        let key = match offload {
            Offload::Keyserver { .. } => None,
            _ => Some(cert.key.clone()),
        };
        let spec = QwebSpec {
            workers: self.workers,
            port: at.port,
            admin_port: admin,
            cert: cert.cert.clone(),
            twin: at.twin.map(|t| {
                let k = key.as_ref().map(|_| t.key.clone());
                (t.cert.clone(), k)
            }),
            key,
            root: self.files.www.clone(),
            offload: offload.clone(),
            compression: compression.clone(),
            keepalive_secs: 300,
            max_connections_per_worker: 20_000,
            plain_port: Some(at.plain),
            resumption,
            ticket_keyserver: ticket_keyserver.clone(),
            http3: self.http3,
        };
        let cfg = write_conf(
            &self.out.join("configs"),
            &format!("{}.toml", at.name),
            &configs::qweb_toml(&spec),
        )?;
        ServerProc::start(
            at.label,
            &self.qweb,
            &[
                "serve".into(),
                "--config".into(),
                cfg.to_string_lossy().into(),
            ],
            at.port,
            Some(admin),
            at.log.clone(),
        )
    }

    fn launch_nginx(
        &self,
        at: &Slot<'_>,
        cert: &CertFiles,
        gzip_level: Option<u32>,
        resumption: bool,
    ) -> Result<ServerProc> {
        let Some(nginx) = &self.nginx else {
            return Err(Error::Other(format!(
                "skipped: nginx not available ({})",
                self.nginx_missing
            )));
        };
        let prefix = self.out.join("nginx").join(&at.name);
        std::fs::create_dir_all(prefix.join("tmp"))
            .map_err(|e| Error::path("create", &prefix, e))?;
        let spec = NginxSpec {
            workers: self.workers,
            port: at.port,
            cert: cert.cert.clone(),
            key: cert.key.clone(),
            twin: at.twin.map(|t| (t.cert.clone(), t.key.clone())),
            root: self.files.www.clone(),
            prefix: prefix.clone(),
            gzip_level,
            http2: nginx_conf::Http2Syntax::for_version(nginx.version),
            keepalive_secs: 300,
            // One fd per client connection (no upstreams), within our limit.
            worker_connections: (self.fd_limit.saturating_sub(1100) as usize).clamp(1024, 20_000),
            user_root: at.root,
            plain_port: Some(at.plain),
            resumption,
        };
        let conf = write_conf(&prefix, "nginx.conf", &nginx_conf::nginx_conf(&spec))?;
        ServerProc::start(
            at.label,
            &nginx.bin,
            &[
                "-p".into(),
                prefix.to_string_lossy().into(),
                "-c".into(),
                conf.to_string_lossy().into(),
                "-e".into(),
                prefix.join("error.log").to_string_lossy().into(),
            ],
            at.port,
            None,
            at.log.clone(),
        )
    }

    fn launch_h2o(
        &self,
        at: &Slot<'_>,
        cert: &CertFiles,
        resumption: bool,
        gzip_level: Option<u32>,
    ) -> Result<ServerProc> {
        let info = self
            .h2o
            .as_ref()
            .map_err(|why| Error::Other(format!("skipped: h2o not available ({why})")))?;
        let prefix = self.out.join("h2o").join(&at.name);
        let spec = H2oSpec {
            workers: self.workers,
            port: at.port,
            plain_port: Some(at.plain),
            cert: cert.cert.clone(),
            key: cert.key.clone(),
            root: self.files.www.clone(),
            prefix: prefix.clone(),
            max_connections: (self.fd_limit.saturating_sub(1100) as usize).clamp(1024, 40_000),
            keepalive_secs: 300,
            resumption,
            user_root: at.root,
            gzip_level,
        };
        let conf = write_conf(&prefix, "h2o.conf", &h2o_conf(&spec))?;
        ServerProc::start(
            at.label,
            &info.bin,
            &["-c".into(), conf.to_string_lossy().into()],
            at.port,
            None,
            at.log.clone(),
        )
    }

    fn launch_caddy(
        &self,
        at: &Slot<'_>,
        cert: &CertFiles,
        gzip_level: Option<u32>,
    ) -> Result<ServerProc> {
        let info = self
            .caddy
            .as_ref()
            .map_err(|why| Error::Other(format!("skipped: caddy not available ({why})")))?;
        let prefix = self.out.join("caddy").join(&at.name);
        let spec = CaddySpec {
            port: at.port,
            plain_port: Some(at.plain),
            cert: cert.cert.clone(),
            key: cert.key.clone(),
            root: self.files.www.clone(),
            prefix: prefix.clone(),
            keepalive_secs: 300,
            tickets: false,
            http3: self.http3,
            gzip_level,
        };
        let conf = write_conf(&prefix, "caddy.json", &caddy_json(&spec))?;
        // Caddy's own state (autosave, locks) goes to its prefix, not $HOME; its
        // parallelism is GOMAXPROCS = workers.
        let home = prefix.to_string_lossy().into_owned();
        ServerProc::start_with_env(
            at.label,
            &info.bin,
            &[
                "run".into(),
                "--config".into(),
                conf.to_string_lossy().into(),
            ],
            &[
                ("GOMAXPROCS", self.workers.to_string()),
                ("HOME", home.clone()),
                ("XDG_DATA_HOME", home.clone()),
                ("XDG_CONFIG_HOME", home),
            ],
            at.port,
            None,
            at.log.clone(),
        )
    }

    /// Runs `spec` against `server` once, with the checks: client errors, and for qweb the
    /// server's handshake counter (every client handshake was a full one the server counted)
    /// and, with an engine, that every handshake's signature went to the engine (no fallback).
    pub(super) fn measure_once(
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
            if spec.resume_ratio > 0.0 {
                let res = parse_metric(
                    &m1,
                    "qweb_tls_session_handshakes_total",
                    &["kind=\"resumed\""],
                ) - parse_metric(
                    &m0,
                    "qweb_tls_session_handshakes_total",
                    &["kind=\"resumed\""],
                );
                let client = rep.resumed_all as f64;
                if res < client || res > client + slack {
                    self.failures.push(format!(
                        "{}: server counted {res} resumed handshakes, the client {client}",
                        server.name
                    ));
                }
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
    pub(super) fn interleave(
        &mut self,
        experiment: &str,
        servers: &[Option<ServerProc>],
        rows: &[(usize, LoadSpec, Option<&str>, String)],
    ) -> Vec<Measured> {
        let mut per_row: Vec<Vec<(LoadReport, f64, f64)>> = vec![vec![]; rows.len()];
        for round in 0..self.profile.rounds {
            for i in abba(round, rows.len()) {
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

    pub(super) fn pool(&self, mode: OffloadMode, latency_ms: u64) -> ServerKind {
        ServerKind::qweb(
            Offload::Pool {
                mode,
                threads: self.workers,
                added_latency_ms: latency_ms,
            },
            None,
        )
    }

    pub(super) fn qweb_none(&self) -> ServerKind {
        ServerKind::qweb(Offload::None, None)
    }

    pub(super) fn cert(&self, k: KeyKind) -> CertFiles {
        match k {
            KeyKind::Rsa2048 => self.rsa.clone(),
            KeyKind::EcdsaP256 => self.ecdsa.clone(),
        }
    }

    /// Starts the key server with `added_latency_ms`; `None` (recorded) when it fails.
    pub(super) fn start_keyserver(
        &mut self,
        ks: &KeyserverSetup,
        latency_ms: u64,
    ) -> Option<ServerProc> {
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
}

/// The order of `n` rows in round `round` of an interleaved run: forwards in even rounds,
/// backwards in odd ones (ABBA), so no row always runs first or last.
pub(super) fn abba(round: usize, n: usize) -> Vec<usize> {
    if round % 2 == 0 {
        (0..n).collect()
    } else {
        (0..n).rev().collect()
    }
}

/// Creates `dir` and writes a server's configuration `text` to `dir/file`; returns its path.
fn write_conf(dir: &Path, file: &str, text: &str) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(|e| Error::path("create", dir, e))?;
    let path = dir.join(file);
    std::fs::write(&path, text).map_err(|e| Error::path("write", &path, e))?;
    Ok(path)
}

/// Where one server of a run is started: its label and file name, ports and log.
struct Slot<'a> {
    label: &'a str,
    name: String,
    port: u16,
    plain: u16,
    log: PathBuf,
    /// Running as root (nginx and h2o then need a `user` line).
    root: bool,
    /// A second certificate for the same names (dual certificates; qweb and nginx).
    twin: Option<&'a CertFiles>,
}
