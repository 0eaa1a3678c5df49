//! Experiment A: full TLS handshakes/s per server, TLS 1.3 and 1.2, RSA-2048 and ECDSA P-256.

use super::*;

impl Runner {
    pub(super) fn exp_a(&mut self) -> Result<()> {
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
                                ServerKind::qweb(
                                    Offload::Keyserver {
                                        mode,
                                        engine_toml: ks.engine_toml(lat),
                                    },
                                    None,
                                ),
                                Some("ks"),
                            ));
                        }
                    }
                }
                Feature::Missing(why) => self
                    .skipped
                    .push(format!("A key server rows: skipped: not available ({why})")),
            }
            kinds.push(("nginx".into(), ServerKind::nginx(None), None));
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
}
