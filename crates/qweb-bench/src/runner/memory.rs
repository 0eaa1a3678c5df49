//! Experiment F: resident memory per idle TLS keep-alive connection, qweb, nginx, h2o and
//! Caddy, at each connection count of the profile (1 000 and 10 000 in the full one).

use super::*;

impl Runner {
    pub(super) fn exp_f(&mut self) -> Result<()> {
        let cert = self.ecdsa.clone();
        let counts = self.profile.idle_connections.clone();
        let kinds = self.four_servers();
        let mut headers: Vec<String> = vec!["server".into()];
        for n in &counts {
            headers.extend([
                format!("RSS before MiB ({n})"),
                format!("RSS with {n} conns MiB"),
                format!("PSS with {n} conns MiB"),
                format!("KiB per conn ({n})"),
                format!("vs nginx ({n})"),
                format!("vs h2o ({n})"),
            ]);
        }
        let h: Vec<&str> = headers.iter().map(|s| s.as_str()).collect();
        let mut t = Table::new(
            format!(
                "F. Resident memory with {} idle TLS connections (ECDSA P-256, TLS 1.3, HTTP/1.1, one request each)",
                counts
                    .iter()
                    .map(|n| n.to_string())
                    .collect::<Vec<_>>()
                    .join(" and ")
            ),
            &h,
        );
        // per_conn[server][count]
        let mut per_conn = vec![vec![f64::NAN; counts.len()]; kinds.len()];
        let mut rows: Vec<Vec<String>> = kinds.iter().map(|(l, _)| vec![l.clone()]).collect();
        for (si, (label, kind)) in kinds.iter().enumerate() {
            for (ci, &n) in counts.iter().enumerate() {
                // A fresh server per count: what one count left behind does not hide the next.
                let Some(s) = self.start(label, kind, &cert) else {
                    rows[si].extend(vec![String::new(); 6]);
                    continue;
                };
                let Idle {
                    rss0,
                    rss1,
                    pss1,
                    held,
                } = self.idle_memory(&format!("F {label}"), &s, HttpVersion::H1, n)?;
                let pc = (rss1 as f64 - rss0 as f64) / n as f64;
                per_conn[si][ci] = pc;
                rows[si].extend([
                    num(rss0 as f64 / 1024.0),
                    num(rss1 as f64 / 1024.0),
                    num(pss1 as f64 / 1024.0),
                    num(pc),
                    String::new(),
                    String::new(),
                ]);
                eprintln!(
                    "  {label:<10} {n:>6} conns: RSS {:.1} → {:.1} MiB ({:.1} KiB/conn), {held} held",
                    rss0 as f64 / 1024.0,
                    rss1 as f64 / 1024.0,
                    pc
                );
            }
        }
        for (si, mut r) in rows.into_iter().enumerate() {
            for ci in 0..counts.len() {
                let (ngx, h2o) = (per_conn[1][ci], per_conn[2][ci]);
                if r.len() > 1 + ci * 6 + 5 && !r[1 + ci * 6].is_empty() {
                    r[1 + ci * 6 + 4] = ratio(per_conn[si][ci], ngx);
                    r[1 + ci * 6 + 5] = ratio(per_conn[si][ci], h2o);
                }
            }
            t.row(r);
        }
        t.notes.push(
            "RSS summed over the server's processes (nginx: master + workers; h2o: the server and \
             its `neverbleed` key process; Caddy: one Go process), read from /proc; PSS counts \
             pages shared between processes once. A fresh server per count. \"vs nginx\"/\"vs \
             h2o\" compare the memory added per connection (lower is better)."
                .into(),
        );
        self.write_chart(
            "f-memory.svg",
            &svg::bar_chart(
                "F. Memory added per idle TLS connection",
                "KiB per connection",
                &counts
                    .iter()
                    .map(|n| format!("{n} connections"))
                    .collect::<Vec<_>>(),
                &kinds
                    .iter()
                    .zip(per_conn.iter())
                    .map(|((l, _), v)| (l.clone(), v.clone()))
                    .collect::<Vec<_>>(),
            ),
        );
        self.section(t, Some("f-memory.svg"));
        Ok(())
    }
}

/// Resident memory of a server before and with idle connections (KiB), and how many were held.
pub(super) struct Idle {
    pub rss0: u64,
    pub rss1: u64,
    pub pss1: u64,
    pub held: usize,
}

impl Runner {
    /// Opens `n` idle connections to `s` over `http` (one checked 1 KiB request each, 64 at a
    /// time) and reads the server's memory before and with them; a connection that did not
    /// open, or a qweb that counts fewer open connections than the client holds, is recorded
    /// as a failure under `what`. The connections close when this returns.
    pub(super) fn idle_memory(
        &mut self,
        what: &str,
        s: &ServerProc,
        http: HttpVersion,
        n: usize,
    ) -> Result<Idle> {
        std::thread::sleep(Duration::from_millis(300));
        let (rss0, _) = s.memory_kib();
        let mut spec = self.base_spec(s.port, "1k.bin", Mode::Keepalive);
        spec.http = http;
        spec.connections = 64;
        spec.expect_bytes = Some(self.files.sizes["1k.bin"]);
        spec.timeout = 30.0;
        let set = IdleSet::open(&spec, n)?;
        std::thread::sleep(Duration::from_millis(1000));
        let (rss1, pss1) = s.memory_kib();
        let held = set.len();
        if set.errors.total() > 0 || held != n {
            self.failures.push(format!(
                "{what}: {held} of {n} connections held; errors {:?} {:?}",
                set.errors, set.error_samples
            ));
        }
        if let Ok(m) = s.metrics() {
            let open = parse_metric(&m, "qweb_connections_open", &[]);
            if (open as usize) < held {
                self.failures.push(format!(
                    "{what}: server reports {open} open connections, client holds {held}"
                ));
            }
        }
        Ok(Idle {
            rss0,
            rss1,
            pss1,
            held,
        })
    }
}
