//! Experiment B: secure transfer throughput of large files on keep-alive connections.

use super::*;

impl Runner {
    pub(super) fn exp_b(&mut self) -> Result<()> {
        let cert = self.rsa.clone();
        let kinds = [
            ("qweb none".to_string(), self.qweb_none()),
            ("nginx".to_string(), ServerKind::nginx(None)),
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
}
