//! Experiment F: resident memory per idle TLS keep-alive connection.

use super::*;

impl Runner {
    pub(super) fn exp_f(&mut self) -> Result<()> {
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
}
