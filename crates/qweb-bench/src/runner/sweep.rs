//! The engine-latency sweep: handshakes/s of sync vs async offload as the engine gets slower.

use super::*;

impl Runner {
    pub(super) fn exp_sweep(&mut self) -> Result<()> {
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
}
