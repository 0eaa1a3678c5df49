//! Experiment E: latency of paced small requests, idle and during a handshake storm.

use super::*;

impl Runner {
    pub(super) fn exp_e(&mut self) -> Result<()> {
        let cert = self.rsa.clone();
        let kinds: Vec<(String, ServerKind, Option<&'static str>)> = vec![
            ("qweb none".into(), self.qweb_none(), None),
            (
                "qweb async pool".into(),
                self.pool(OffloadMode::Async, 0),
                Some("pool"),
            ),
            ("nginx".into(), ServerKind::nginx(None), None),
            // the issue 24 goal compares qweb none's p99 with h2o's
            ("h2o".into(), ServerKind::h2o(), None),
        ];
        let servers: Vec<Option<ServerProc>> = kinds
            .iter()
            .map(|(l, k, _)| self.start(l, k, &cert))
            .collect();
        let probe_rate = PROBE_RATE;
        let labels: Vec<String> = kinds.iter().map(|(l, _, _)| l.clone()).collect();
        let results = self.storm_rounds("E", &servers, &labels, HttpVersion::H1)?;
        drop(servers);
        let mut t = Table::new(
            format!(
                "E. Latency of small keep-alive requests (1 KiB, {probe_rate:.0} req/s over 8 connections) \
                 during a handshake storm ({} connections of full RSA-2048 TLS 1.3 handshakes)",
                self.profile.hs_connections
            ),
            &[
                "server", "idle p50 ms", "idle p99 ms", "storm p50 ms", "storm p99 ms",
                "storm p99 vs nginx", "storm handshakes/s", "errors",
            ],
        );
        let vals = self.storm_table_rows(&mut t, &results, "nginx");
        let series: Vec<(String, Vec<f64>)> = ["idle p50", "idle p99", "storm p50", "storm p99"]
            .iter()
            .enumerate()
            .map(|(k, name)| {
                (
                    name.to_string(),
                    vals.iter().map(|v| v[k] / 1000.0).collect(),
                )
            })
            .collect();
        let cats: Vec<String> = results.iter().map(|r| r.0.clone()).collect();
        t.notes.push(
            "Latency is measured from each request's scheduled send time (open loop), so time a \
             request waits behind a busy worker counts. \"storm p99 vs nginx\": lower is better."
                .into(),
        );
        self.write_chart(
            "e-latency.svg",
            &svg::bar_chart(
                "E. Small-request latency, idle vs during a handshake storm",
                "ms",
                &cats,
                &series,
            ),
        );
        self.section(t, Some("e-latency.svg"));
        Ok(())
    }
}

/// Requests per second of the latency probe (E and K4).
pub(super) const PROBE_RATE: f64 = 200.0;

/// Per server: label, idle probe rounds, storm probe rounds, storm handshake rates.
pub(super) type StormRow = (String, Vec<Measured>, Vec<Measured>, Vec<f64>);

impl Runner {
    /// Adds a row per server to `t` (idle p50/p99, storm p50/p99 as medians over the rounds,
    /// storm p99 against the row labelled `base`, storm handshakes/s, errors), records each
    /// probe run in the results, and returns the four latencies per row (µs).
    pub(super) fn storm_table_rows(
        &mut self,
        t: &mut Table,
        results: &[StormRow],
        base: &str,
    ) -> Vec<[f64; 4]> {
        let med =
            |v: &[Measured], f: fn(&Measured) -> f64| median(&v.iter().map(f).collect::<Vec<_>>());
        let base_p99 = results
            .iter()
            .find(|r| r.0 == base)
            .map(|r| med(&r.2, |m| m.p99_us))
            .unwrap_or(f64::NAN);
        let mut out = Vec::new();
        for (label, idle, storm, rates) in results {
            let errs: u64 = idle.iter().chain(storm.iter()).map(|m| m.errors).sum();
            let vals = [
                med(idle, |m| m.p50_us),
                med(idle, |m| m.p99_us),
                med(storm, |m| m.p50_us),
                med(storm, |m| m.p99_us),
            ];
            t.row(vec![
                label.clone(),
                ms(vals[0]),
                ms(vals[1]),
                ms(vals[2]),
                ms(vals[3]),
                ratio(vals[3], base_p99),
                num(median(rates)),
                errs.to_string(),
            ]);
            for (what, v) in [("idle", idle), ("during storm", storm)] {
                for m in v {
                    let mut m = m.clone();
                    m.label = format!("{label} probe {what}");
                    self.measured.push(m);
                }
            }
            out.push(vals);
        }
        out
    }

    /// The rounds of a latency-under-storm experiment: per server (ABBA order), the probe
    /// (1 KiB requests paced at [`PROBE_RATE`] over 8 keep-alive connections over `http`)
    /// alone, then during a storm of full handshakes (`hs_connections` connections, same
    /// protocol: TLS over TCP, or QUIC for HTTP/3).
    pub(super) fn storm_rounds(
        &mut self,
        exp: &str,
        servers: &[Option<ServerProc>],
        labels: &[String],
        http: HttpVersion,
    ) -> Result<Vec<StormRow>> {
        let mut results: Vec<StormRow> = labels
            .iter()
            .map(|l| (l.clone(), vec![], vec![], vec![]))
            .collect();
        for round in 0..self.profile.rounds {
            for i in measure::abba(round, labels.len()) {
                let Some(s) = &servers[i] else { continue };
                let mut probe = self.base_spec(s.port, "1k.bin", Mode::Keepalive);
                probe.connections = 8;
                probe.rate = Some(PROBE_RATE);
                probe.http = http;
                probe.expect_bytes = Some(self.files.sizes["1k.bin"]);
                // Idle: the probe alone.
                match self.measure_once(s, &probe, None, true) {
                    Ok(m) => results[i]
                        .1
                        .push(Measured::from_rounds(exp, &labels[i], vec![m])),
                    Err(e) => self.failures.push(format!("{exp} {}: {e}", labels[i])),
                }
                // Storm: handshakes on other connections during the probe.
                let mut storm = self.base_spec(s.port, "", Mode::Handshake);
                storm.connections = self.profile.hs_connections;
                storm.warmup = probe.warmup;
                storm.duration = probe.duration + 1.0;
                if http == HttpVersion::H3 {
                    storm.http = http;
                }
                let storm_thread = std::thread::spawn(move || run_load(&storm));
                std::thread::sleep(Duration::from_millis(500));
                // The storm's handshakes land in the server's counter too: no counter check.
                let pr = self.measure_once(s, &probe, None, false);
                let st = storm_thread
                    .join()
                    .map_err(|_| Error::Other("storm thread panicked".into()))?;
                match (pr, st) {
                    (Ok(m), Ok(st)) => {
                        if st.errors.total() > 0 {
                            self.failures.push(format!(
                                "{exp} {} storm: {} errors {:?}",
                                labels[i],
                                st.errors.total(),
                                st.error_samples
                            ));
                        }
                        results[i]
                            .2
                            .push(Measured::from_rounds(exp, &labels[i], vec![m]));
                        results[i].3.push(st.ops_per_sec);
                    }
                    (Err(e), _) | (_, Err(e)) => {
                        self.failures.push(format!("{exp} {}: {e}", labels[i]))
                    }
                }
            }
        }
        Ok(results)
    }
}
