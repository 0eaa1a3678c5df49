//! Experiments H (resumption: clients that resume 80% of the time, qweb vs nginx vs h2o) and
//! I (two qweb nodes behind the client's round-robin, resuming 80%, with ticket keys shared
//! through the key server or each node's own).
//!
//! Resumption is checked per connection: the load generator offers a stored session with
//! probability 0.8 and reads from rustls whether the handshake resumed; the measured
//! fraction is reported, and for a single node it must come within 5 points of the asked
//! one (a server that ignores sessions shows up, it is not measured as resuming). qweb's
//! `qweb_tls_session_handshakes_total{kind="resumed"}` must match the client's count.

use super::*;

/// The fraction of new connections that offer a session.
const RESUME_RATIO: f64 = 0.8;

impl Runner {
    pub(super) fn exp_h(&mut self) -> Result<()> {
        let cert = self.rsa.clone();
        let kinds: Vec<(String, ServerKind)> = vec![
            (
                "qweb".into(),
                ServerKind::Qweb {
                    offload: Offload::None,
                    compression: None,
                    resumption: true,
                    ticket_keyserver: None,
                },
            ),
            (
                "nginx".into(),
                ServerKind::Nginx {
                    gzip_level: None,
                    resumption: true,
                },
            ),
            (
                "h2o".into(),
                ServerKind::H2o {
                    resumption: true,
                    gzip_level: None,
                },
            ),
        ];
        let servers: Vec<Option<ServerProc>> =
            kinds.iter().map(|(l, k)| self.start(l, k, &cert)).collect();
        let versions = [TlsVersion::Tls13, TlsVersion::Tls12];
        let mut rows = Vec::new();
        for v in versions {
            for (i, (label, _)) in kinds.iter().enumerate() {
                let port = servers[i].as_ref().map(|s| s.port).unwrap_or(1);
                let mut spec = self.base_spec(port, "", Mode::Handshake);
                spec.tls = v;
                spec.connections = self.profile.hs_connections;
                spec.resume_ratio = RESUME_RATIO;
                rows.push((
                    i,
                    spec,
                    None,
                    format!("{label} TLS {} resume 80%", tls_name(v)),
                ));
            }
        }
        let res = self.interleave("H", &servers, &rows);
        drop(servers);
        let mut t = Table::new(
            format!(
                "H. Handshakes/s with clients that resume 80% of the time, RSA-2048 ({} workers, {} client connections)",
                self.workers, self.profile.hs_connections
            ),
            &[
                "server", "TLS", "handshakes/s", "vs nginx", "vs h2o", "asked %", "resumed %",
                "p50 ms", "p99 ms", "server CPU %", "client CPU %", "errors",
            ],
        );
        let mut series: Vec<(String, Vec<f64>)> =
            kinds.iter().map(|(l, _)| (l.clone(), vec![])).collect();
        let mut shortfalls = Vec::new();
        for (vi, v) in versions.iter().enumerate() {
            let chunk = &res[vi * kinds.len()..(vi + 1) * kinds.len()];
            let (ngx, h2o) = (chunk[1].ops_per_sec, chunk[2].ops_per_sec);
            for (k, m) in chunk.iter().enumerate() {
                let (asked, resumed) = fractions(m);
                let short = format!(
                    "{}: {:.1}% of handshakes offered a session but {:.1}% resumed",
                    m.label,
                    asked * 100.0,
                    resumed * 100.0
                );
                // qweb must resume what it is offered; a peer that does not is a property
                // of the peer (e.g. h2o 2.2 issues no new TLS 1.3 ticket on a resumed
                // connection, and tickets are used once), shown, not failed.
                if !m.rounds.is_empty() && (k == 0 || resumed > asked + 0.05) {
                    if (resumed - asked).abs() > 0.05 {
                        self.failures.push(format!("H {short}"));
                    }
                } else if !m.rounds.is_empty() && asked - resumed > 0.05 {
                    shortfalls.push(short);
                }
                series[k].1.push(m.ops_per_sec);
                t.row(vec![
                    if m.rounds.is_empty() {
                        format!("{} ({})", kinds[k].0, self.why_missing(&kinds[k].0))
                    } else {
                        kinds[k].0.clone()
                    },
                    tls_name(*v).into(),
                    num(m.ops_per_sec),
                    ratio(m.ops_per_sec, ngx),
                    ratio(m.ops_per_sec, h2o),
                    num(asked * 100.0),
                    num(resumed * 100.0),
                    ms(m.p50_us),
                    ms(m.p99_us),
                    num(m.server_cpu_pct),
                    num(m.client_cpu_pct),
                    m.errors.to_string(),
                ]);
            }
        }
        t.notes.push(format!(
            "Each new connection offers a session (TLS 1.3 ticket; TLS 1.2 ticket or session id) \
             from the client's store with probability {RESUME_RATIO}, else none; \"asked\" and \
             \"resumed\" are measured per connection from rustls' `handshake_kind()`. qweb: \
             default resumption (tickets and a session cache); nginx: `ssl_session_cache \
             shared:SSL:10m; ssl_session_tickets on;`; h2o: `ssl-session-resumption: mode: all`. \
             qweb's resumed-handshake counter is checked against the client's. Tickets are \
             used once (as browsers do). Full handshakes only: experiment A."
        ));
        for sf in shortfalls {
            t.notes.push(format!(
                "{sf}: the server did not resume every offered session (h2o 2.2.5 sends two \
                 TLS 1.3 tickets after a full handshake and none after a resumed one, so with \
                 single-use tickets at most 2/3 of handshakes can resume)."
            ));
        }
        self.write_chart(
            "h-resumption.svg",
            &svg::bar_chart(
                "H. Handshakes/s, 80% resumed",
                "handshakes/s",
                &versions
                    .iter()
                    .map(|v| format!("TLS {}", tls_name(*v)))
                    .collect::<Vec<_>>(),
                &series,
            ),
        );
        self.section(t, Some("h-resumption.svg"));
        Ok(())
    }

    pub(super) fn exp_i(&mut self) -> Result<()> {
        let ks = match self.keyserver.clone() {
            Feature::Available(ks) => ks,
            Feature::Missing(why) => {
                self.skip_section("I. Two nodes, shared ticket keys", &why);
                return Ok(());
            }
        };
        let Some(keyserver) = self.start_keyserver(&ks, 0) else {
            self.skip_section(
                "I. Two nodes, shared ticket keys",
                "the key server did not start",
            );
            return Ok(());
        };
        let cert = self.rsa.clone();
        let node = |tk: Option<String>| ServerKind::Qweb {
            offload: Offload::None,
            compression: None,
            resumption: true,
            ticket_keyserver: tk,
        };
        let variants: Vec<(String, ServerKind)> = vec![
            (
                "keys from the key server".into(),
                node(Some(ks.engine_toml(0))),
            ),
            ("each node its own keys".into(), node(None)),
        ];
        // Two nodes per variant.
        let mut nodes: Vec<[Option<ServerProc>; 2]> = Vec::new();
        for (label, kind) in &variants {
            nodes.push([
                self.start(&format!("qweb node A, {label}"), kind, &cert),
                self.start(&format!("qweb node B, {label}"), kind, &cert),
            ]);
        }
        let versions = [TlsVersion::Tls13, TlsVersion::Tls12];
        // rows: (variant, version)
        let rows: Vec<(usize, TlsVersion)> = versions
            .iter()
            .flat_map(|v| (0..variants.len()).map(move |i| (i, *v)))
            .collect();
        let mut per_row: Vec<Vec<(LoadReport, f64, f64)>> = vec![vec![]; rows.len()];
        for round in 0..self.profile.rounds {
            for i in measure::abba(round, rows.len()) {
                let (vi, tls) = rows[i];
                let [Some(a), Some(b)] = &nodes[vi] else {
                    continue;
                };
                let mut spec = self.base_spec(a.port, "", Mode::Handshake);
                spec.tls = tls;
                spec.connections = self.profile.hs_connections;
                spec.resume_ratio = RESUME_RATIO;
                spec.also = vec![format!("https://127.0.0.1:{}/", b.port)];
                match self.measure_nodes(&[a, b], &spec) {
                    Ok(m) => per_row[i].push(m),
                    Err(e) => self.failures.push(format!("I {}: {e}", variants[vi].0)),
                }
            }
        }
        drop(nodes);
        drop(keyserver);
        let mut t = Table::new(
            format!(
                "I. Two qweb nodes behind the client's round-robin, clients resuming 80%, RSA-2048 ({} workers each, {} client connections)",
                self.workers, self.profile.hs_connections
            ),
            &[
                "ticket keys", "TLS", "handshakes/s", "vs own keys", "asked %", "resumed %",
                "p50 ms", "p99 ms", "server CPU % (both)", "errors",
            ],
        );
        for (vpos, v) in versions.iter().enumerate() {
            let ms_: Vec<Measured> = (0..variants.len())
                .map(|k| {
                    let i = vpos * variants.len() + k;
                    let label = format!("{} TLS {}", variants[k].0, tls_name(*v));
                    if per_row[i].is_empty() {
                        Measured::missing("I", &label)
                    } else {
                        Measured::from_rounds("I", &label, per_row[i].clone())
                    }
                })
                .collect();
            let own = ms_[1].ops_per_sec;
            for (k, m) in ms_.iter().enumerate() {
                let (asked, resumed) = fractions(m);
                // With shared keys every offered ticket must resume on either node.
                if k == 0 && !m.rounds.is_empty() && (resumed - asked).abs() > 0.05 {
                    self.failures.push(format!(
                        "I {}: {:.1}% offered a session but {:.1}% resumed across nodes sharing keys",
                        m.label,
                        asked * 100.0,
                        resumed * 100.0
                    ));
                }
                t.row(vec![
                    variants[k].0.clone(),
                    tls_name(*v).into(),
                    num(m.ops_per_sec),
                    ratio(m.ops_per_sec, own),
                    num(asked * 100.0),
                    num(resumed * 100.0),
                    ms(m.p50_us),
                    ms(m.p99_us),
                    num(m.server_cpu_pct),
                    m.errors.to_string(),
                ]);
                self.measured.push(m.clone());
            }
        }
        t.notes.push(
            "Two qweb processes with resumption on (tickets; TLS 1.2 also a session cache per \
             process); the client sends each new connection to the next node in turn and offers \
             a stored session (from either node) with probability 0.8. \"keys from the key \
             server\": `ticket_keys = \"keyserver:tickets\"`, both nodes take the fleet's keys \
             from one `qweb keyserver`; \"own keys\": each node its own random keys, so a \
             ticket from the other node gives a full handshake. Both nodes' handshake and \
             resumed counters are checked against the client's."
                .into(),
        );
        self.section(t, None);
        Ok(())
    }

    /// One run against several nodes; the checks of `measure_once` with the nodes' counters
    /// summed.
    fn measure_nodes(
        &mut self,
        nodes: &[&ServerProc],
        spec: &LoadSpec,
    ) -> Result<(LoadReport, f64, f64)> {
        let sum = |name: &str, label: &[&str]| -> Option<f64> {
            let mut t = 0.0;
            for n in nodes {
                t += parse_metric(&n.metrics().ok()?, name, label);
            }
            Some(t)
        };
        let resumed_label = ["kind=\"resumed\""];
        let h0 = sum("qweb_tls_handshakes_total", &[]);
        let r0 = sum("qweb_tls_session_handshakes_total", &resumed_label);
        let s0: f64 = nodes.iter().map(|n| n.cpu_secs()).sum();
        let (c0, t0) = (procs::self_cpu_secs(), Instant::now());
        let rep = run_load(spec)?;
        let wall = t0.elapsed().as_secs_f64();
        let s1: f64 = nodes.iter().map(|n| n.cpu_secs()).sum();
        let scpu = (s1 - s0) / wall * 100.0;
        let ccpu = (procs::self_cpu_secs() - c0) / wall * 100.0;
        let h1 = sum("qweb_tls_handshakes_total", &[]);
        let r1 = sum("qweb_tls_session_handshakes_total", &resumed_label);
        eprintln!(
            "  {:<40} {:>9.1}/s resumed {:.1}% (asked {:.1}%) srv {:>4.0}% err {}",
            format!("{} + 1 node", nodes[0].name),
            rep.ops_per_sec,
            rep.resumed_fraction() * 100.0,
            rep.resume_asked as f64 / rep.handshakes.max(1) as f64 * 100.0,
            scpu,
            rep.errors.total()
        );
        if rep.errors.total() > 0 {
            self.failures.push(format!(
                "{}: {} error(s) in `{}`: {:?}",
                nodes[0].name,
                rep.errors.total(),
                spec.command_line(),
                rep.error_samples
            ));
        }
        let slack = (spec.connections + 2) as f64;
        if let (Some(h0), Some(h1), Some(r0), Some(r1)) = (h0, h1, r0, r1) {
            let (hs, res) = (h1 - h0, r1 - r0);
            let (ch, cr) = (rep.handshakes_all as f64, rep.resumed_all as f64);
            if hs < ch || hs > ch + slack || res < cr || res > cr + slack {
                self.failures.push(format!(
                    "{}: the nodes counted {hs} handshakes ({res} resumed), the client {ch} ({cr})",
                    nodes[0].name
                ));
            }
        } else {
            self.failures
                .push(format!("{}: /metrics unreadable", nodes[0].name));
        }
        Ok((rep, scpu, ccpu))
    }
}

/// Medians over the rounds of (asked, resumed) fractions of the handshakes in the window.
fn fractions(m: &Measured) -> (f64, f64) {
    let asked: Vec<f64> = m
        .rounds
        .iter()
        .map(|r| r.resume_asked as f64 / r.handshakes.max(1) as f64)
        .collect();
    let resumed: Vec<f64> = m.rounds.iter().map(|r| r.resumed_fraction()).collect();
    (median(&asked), median(&resumed))
}
