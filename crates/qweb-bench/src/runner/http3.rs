//! Experiment K: HTTP/3 against Caddy (the one peer here that serves HTTP/3): full QUIC
//! handshakes/s with the signature in software, waited on in place (`sync`) and offloaded
//! asynchronously (`async`) behind a pool engine adding 20 ms (the paper's ratio, now over
//! QUIC), and requests/s of 1 KiB and 100 KiB files over HTTP/3.

use super::*;

/// The engine latency of the handshake rows, ms.
const ENGINE_MS: u64 = 20;

impl Runner {
    pub(super) fn exp_k(&mut self) -> Result<()> {
        self.http3 = true;
        let r = self.exp_k_rows().and_then(|()| self.exp_k_memory());
        self.http3 = false;
        r
    }

    /// K4: small HTTP/3 requests during a storm of full QUIC handshakes, on `servers` (qweb
    /// none, qweb async behind the engine, Caddy).
    fn exp_k_storm(&mut self, servers: &[Option<ServerProc>], labels: &[String]) -> Result<()> {
        let rows = self.storm_rounds("K", servers, labels, HttpVersion::H3)?;
        let mut t = Table::new(
            format!(
                "K4. Latency of small HTTP/3 requests (1 KiB, {:.0} req/s over 8 connections) during a storm of full QUIC handshakes ({} connections, ECDSA P-256)",
                super::latency::PROBE_RATE,
                self.profile.hs_connections
            ),
            &[
                "server", "idle p50 ms", "idle p99 ms", "storm p50 ms", "storm p99 ms",
                "storm p99 vs caddy", "storm handshakes/s", "errors",
            ],
        );
        self.storm_table_rows(&mut t, &rows, "caddy");
        t.notes.push(
            "As E, over HTTP/3: the probe's 8 QUIC connections stay open and send 1 KiB requests at \
             a fixed schedule (latency from the scheduled time, so a stalled server is not hidden), \
             while 128 other client endpoints open QUIC connections back to back."
                .into(),
        );
        self.section(t, None);
        Ok(())
    }

    /// K3: resident memory per idle HTTP/3 connection (one request each), qweb and Caddy.
    fn exp_k_memory(&mut self) -> Result<()> {
        let cert = self.cert(KeyKind::EcdsaP256);
        let n = self
            .profile
            .idle_connections
            .first()
            .copied()
            .unwrap_or(1000);
        let kinds = [
            ("qweb".to_string(), self.qweb_none()),
            ("caddy".to_string(), ServerKind::caddy()),
        ];
        let mut t = Table::new(
            format!("K3. Resident memory with {n} idle HTTP/3 connections (ECDSA P-256, one request each)"),
            &["server", "RSS before MiB", "RSS with conns MiB", "KiB per conn", "vs caddy"],
        );
        let mut per_conn = Vec::new();
        let mut rows = Vec::new();
        for (label, kind) in &kinds {
            let Some(s) = self.start(label, kind, &cert) else {
                per_conn.push(f64::NAN);
                rows.push(vec![
                    label.clone(),
                    String::new(),
                    String::new(),
                    String::new(),
                ]);
                continue;
            };
            let super::memory::Idle {
                rss0, rss1, held, ..
            } = self.idle_memory(&format!("K3 {label}"), &s, HttpVersion::H3, n)?;
            let pc = (rss1 as f64 - rss0 as f64) / n as f64;
            eprintln!(
                "  {label:<10} {n:>6} HTTP/3 conns: RSS {:.1} → {:.1} MiB ({pc:.1} KiB/conn), {held} held",
                rss0 as f64 / 1024.0,
                rss1 as f64 / 1024.0,
            );
            per_conn.push(pc);
            rows.push(vec![
                label.clone(),
                num(rss0 as f64 / 1024.0),
                num(rss1 as f64 / 1024.0),
                num(pc),
            ]);
        }
        for (mut r, pc) in rows.into_iter().zip(&per_conn) {
            r.push(ratio(*pc, per_conn[1]));
            t.row(r);
        }
        t.notes.push(
            "Each connection from a client endpoint of its own, one checked 1 KiB request, then \
             idle (qweb's QUIC idle timeout is keepalive_timeout, 300 s here; quic-go's default is \
             30 s, longer than the measurement). A fresh server; RSS read from /proc."
                .into(),
        );
        self.section(t, None);
        Ok(())
    }

    fn exp_k_rows(&mut self) -> Result<()> {
        let cert = self.cert(KeyKind::EcdsaP256);
        let kinds: Vec<(String, ServerKind, Option<&'static str>)> = vec![
            ("qweb none".into(), self.qweb_none(), None),
            (
                format!("qweb sync pool {ENGINE_MS}ms"),
                self.pool(OffloadMode::Sync, ENGINE_MS),
                Some("pool"),
            ),
            (
                format!("qweb async pool {ENGINE_MS}ms"),
                self.pool(OffloadMode::Async, ENGINE_MS),
                Some("pool"),
            ),
            ("caddy".into(), ServerKind::caddy(), None),
        ];
        let servers: Vec<Option<ServerProc>> = kinds
            .iter()
            .map(|(l, k, _)| self.start(l, k, &cert))
            .collect();
        let h3_spec = |r: &Runner, port: u16, path: &str, mode: Mode| {
            let mut s = r.base_spec(port, path, mode);
            s.http = HttpVersion::H3;
            s
        };
        // full QUIC handshakes
        let mut rows = Vec::new();
        for (i, (label, _, engine)) in kinds.iter().enumerate() {
            let port = servers[i].as_ref().map(|s| s.port).unwrap_or(1);
            let mut spec = h3_spec(self, port, "", Mode::Handshake);
            spec.connections = self.profile.hs_connections;
            rows.push((i, spec, *engine, format!("{label} QUIC handshakes")));
        }
        let hs = self.interleave("K", &servers, &rows);
        let mut t = Table::new(
            format!(
                "K1. Full QUIC handshakes/s, ECDSA P-256 ({} workers, {} client connections, no resumption)",
                self.workers, self.profile.hs_connections
            ),
            &[
                "server", "handshakes/s", "vs qweb sync", "vs caddy", "p50 ms", "p99 ms",
                "server CPU %", "client CPU %", "errors",
            ],
        );
        let sync = hs[1].ops_per_sec;
        let caddy = hs[3].ops_per_sec;
        for (m, (label, _, _)) in hs.iter().zip(&kinds) {
            t.row(vec![
                label.clone(),
                num(m.ops_per_sec),
                ratio(m.ops_per_sec, sync),
                ratio(m.ops_per_sec, caddy),
                ms(m.p50_us),
                ms(m.p99_us),
                num(m.server_cpu_pct),
                num(m.client_cpu_pct),
                m.errors.to_string(),
            ]);
        }
        t.notes.push(format!(
            "Handshake = a new QUIC connection from a client endpoint of its own (UDP port), full \
             TLS 1.3 handshake (X25519, AES-128-GCM, ECDSA P-256 signature, no session, no 0-RTT), \
             then the wait for the server's HTTP/3 control stream (the server's side of the \
             handshake is complete) and an immediate close. qweb's /metrics handshake counter is \
             checked against the client's count, and with the engine every signature went to it \
             (`fallback = \"fail\"`). Pool engine: {} threads adding {ENGINE_MS} ms per \
             signature; `sync` waits for it on the worker, `async` pauses the handshake and \
             serves on.",
            self.workers
        ));
        self.section(t, None);
        // requests over HTTP/3: qweb none and Caddy
        let req_servers = [0usize, 3];
        let files: [(&str, usize, usize); 2] = [("1k.bin", 16, 4), ("100k.bin", 16, 1)];
        let mut rows = Vec::new();
        for (file, conns, streams) in files {
            for &i in &req_servers {
                let port = servers[i].as_ref().map(|s| s.port).unwrap_or(1);
                let mut spec = h3_spec(self, port, file, Mode::Keepalive);
                spec.connections = conns;
                spec.streams = streams;
                spec.expect_bytes = Some(self.files.sizes[file]);
                rows.push((i, spec, None, format!("{} {file} HTTP/3", kinds[i].0)));
            }
        }
        let res = self.interleave("K", &servers, &rows);
        // K4 on qweb none, qweb async and Caddy
        let storm_at = [0usize, 2, 3];
        let mut servers = servers;
        let storm_servers: Vec<Option<ServerProc>> =
            storm_at.iter().map(|&i| servers[i].take()).collect();
        let storm_labels: Vec<String> = storm_at.iter().map(|&i| kinds[i].0.clone()).collect();
        drop(servers);
        let mut t = Table::new(
            format!(
                "K2. Requests over HTTP/3, keep-alive ({} workers)",
                self.workers
            ),
            &[
                "file",
                "server",
                "requests/s",
                "MiB/s",
                "vs caddy",
                "p50 ms",
                "p99 ms",
                "server CPU %",
                "client CPU %",
                "errors",
            ],
        );
        for (j, (file, conns, streams)) in files.iter().enumerate() {
            let pair = &res[j * 2..j * 2 + 2];
            for (k, m) in pair.iter().enumerate() {
                t.row(vec![
                    format!("{file} ({conns} conns x {streams} streams)"),
                    kinds[req_servers[k]].0.clone(),
                    num(m.ops_per_sec),
                    num(m.mib_per_sec),
                    ratio(m.ops_per_sec, pair[1].ops_per_sec),
                    ms(m.p50_us),
                    ms(m.p99_us),
                    num(m.server_cpu_pct),
                    num(m.client_cpu_pct),
                    m.errors.to_string(),
                ]);
            }
        }
        t.notes.push(
            "qweb-bench's own HTTP/3 client (quinn + h3), every body's byte count checked; each \
             connection has its own UDP port. Caddy 2.6 serves HTTP/3 with quic-go."
                .into(),
        );
        self.section(t, None);
        self.exp_k_storm(&storm_servers, &storm_labels)
    }
}
