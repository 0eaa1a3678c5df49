//! Experiments C (compression per request, time to last byte of 8 MiB) and D (new
//! connection + one compressed page: TLS and compression together).

use super::*;

impl Runner {
    pub(super) fn exp_c(&mut self) -> Result<()> {
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
                ServerKind::qweb(Offload::None, Some(section.clone())),
                "gzip",
            ));
        }
        if let Some(sync) = comp.sections.get("sync") {
            for enc in ["br", "zstd"] {
                kinds.push((
                    format!("qweb {enc} sync"),
                    ServerKind::qweb(Offload::None, Some(sync.clone())),
                    enc,
                ));
            }
        }
        kinds.push(("nginx gzip".into(), ServerKind::nginx(Some(6)), "gzip"));
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
    pub(super) fn probe_encoded(&mut self, s: &ServerProc, path: &str, enc: &str) -> Option<u64> {
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

    pub(super) fn exp_d(&mut self) -> Result<()> {
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
                ServerKind::qweb(Offload::None, sync),
                None,
            ),
            (
                "qweb async pool + gzip pipelined".into(),
                ServerKind::qweb(
                    Offload::Pool {
                        mode: OffloadMode::Async,
                        threads: self.workers,
                        added_latency_ms: 0,
                    },
                    piped,
                ),
                Some("pool"),
            ),
            ("nginx gzip".into(), ServerKind::nginx(Some(6)), None),
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
}
