//! Experiment J: dual certificates. Full TLS handshakes/s with an ECDSA certificate only, an
//! RSA one only, and both for the same names (each client gets the one it can verify), with
//! every client able to verify ECDSA and with half the clients offering only RSA signature
//! schemes; qweb and nginx with the same certificates.

use super::*;

/// Share of the mixed clients that offer only RSA signature schemes.
const MIXED_RSA_ONLY: f64 = 0.5;

/// How far the measured share of ECDSA signatures may be from the expected one (the mix is
/// drawn per connection).
const SHARE_TOLERANCE: f64 = 0.1;

impl Runner {
    pub(super) fn exp_j(&mut self) -> Result<()> {
        let (rsa, ecdsa) = (self.rsa.clone(), self.ecdsa.clone());
        // (certificate setup, its certificates, share of RSA-only clients)
        let setups: [(&str, &CertFiles, Option<&CertFiles>, f64); 4] = [
            ("ECDSA only", &ecdsa, None, 0.0),
            ("RSA only", &rsa, None, 0.0),
            ("dual, ECDSA clients", &rsa, Some(&ecdsa), 0.0),
            ("dual, clients mixed", &rsa, Some(&ecdsa), MIXED_RSA_ONLY),
        ];
        let kinds = [
            ("qweb", self.qweb_none()),
            ("nginx", ServerKind::nginx(None)),
        ];
        // one server per (kind, certificate set): ECDSA, RSA, dual
        let mut servers = Vec::new();
        let mut server_of = BTreeMap::new();
        for (k, (name, kind)) in kinds.iter().enumerate() {
            for (s, (label, cert, twin, _)) in setups.iter().enumerate().take(3) {
                server_of.insert((k, s), servers.len());
                let label = label.split(',').next().unwrap_or(label);
                servers.push(self.start_dual(&format!("{name} {label}"), kind, cert, *twin));
            }
            server_of.insert((k, 3), server_of[&(k, 2)]);
        }
        let versions = [TlsVersion::Tls13, TlsVersion::Tls12];
        let mut rows = Vec::new();
        for v in versions {
            for (s, (label, _, _, rsa_share)) in setups.iter().enumerate() {
                for (k, (name, _)) in kinds.iter().enumerate() {
                    let si = server_of[&(k, s)];
                    let port = servers[si].as_ref().map(|p| p.port).unwrap_or(1);
                    let mut spec = self.base_spec(port, "", Mode::Handshake);
                    spec.tls = v;
                    spec.connections = self.profile.hs_connections;
                    spec.rsa_only_ratio = *rsa_share;
                    rows.push((
                        si,
                        spec,
                        None,
                        format!("{name} {label} TLS {}", tls_name(v)),
                    ));
                }
            }
        }
        let res = self.interleave("J", &servers, &rows);
        drop(servers);
        let mut t = Table::new(
            format!(
                "J. Dual certificates: full TLS handshakes/s ({} workers, {} client connections, no resumption)",
                self.workers, self.profile.hs_connections
            ),
            &[
                "certificates",
                "clients",
                "TLS",
                "qweb handshakes/s",
                "nginx handshakes/s",
                "qweb / nginx",
                "ECDSA signatures % (qweb, nginx)",
                "errors",
            ],
        );
        let mut i = 0;
        for v in versions {
            for (label, _, twin, rsa_share) in &setups {
                let (q, n) = (&res[i], &res[i + 1]);
                i += 2;
                let want = match (twin, *rsa_share > 0.0) {
                    (None, _) if label.starts_with("RSA") => 0.0,
                    (_, true) => 1.0 - rsa_share,
                    _ => 1.0,
                };
                let shares: Vec<f64> = [q, n].iter().map(|m| ecdsa_share(m)).collect();
                for (m, share) in [q, n].iter().zip(&shares) {
                    if share.is_finite() && (share - want).abs() > SHARE_TOLERANCE {
                        self.failures.push(format!(
                            "{}: {:.0}% of the server signatures were ECDSA, expected {:.0}%",
                            m.label,
                            share * 100.0,
                            want * 100.0
                        ));
                    }
                }
                let clients = if *rsa_share > 0.0 {
                    format!("{:.0}% offer RSA schemes only", rsa_share * 100.0)
                } else {
                    "all verify ECDSA".into()
                };
                let (label, _) = label.split_once(',').unwrap_or((label, ""));
                t.row(vec![
                    label.to_string(),
                    clients,
                    tls_name(v).into(),
                    num(q.ops_per_sec),
                    num(n.ops_per_sec),
                    ratio(q.ops_per_sec, n.ops_per_sec),
                    format!("{:.0}, {:.0}", shares[0] * 100.0, shares[1] * 100.0),
                    (q.errors + n.errors).to_string(),
                ]);
            }
        }
        t.notes.push(format!(
            "Certificates: RSA-2048 and ECDSA P-256 for the same names; \"dual\": both (qweb: \
             `certificates = [rsa, ecdsa]`; nginx: two `ssl_certificate` lines). Clients: rustls \
             (X25519, AES-128-GCM); \"RSA schemes only\" clients offer only RSA-PSS/PKCS#1 \
             signature schemes and, on TLS 1.2, only the ECDHE_RSA suite (`--rsa-only-ratio`, \
             drawn per connection). The ECDSA share is counted from the signatures the clients \
             verified (warm-up included) and checked against the mix (±{:.0} points). qweb signs \
             in place (no engine).",
            SHARE_TOLERANCE * 100.0
        ));
        self.section(t, None);
        Ok(())
    }
}

/// The share of a row's verified server signatures that were ECDSA (NaN without any).
fn ecdsa_share(m: &Measured) -> f64 {
    let (e, r) = m.rounds.iter().fold((0u64, 0u64), |(e, r), x| {
        (e + x.ecdsa_signed, r + x.rsa_signed)
    });
    if e + r == 0 {
        f64::NAN
    } else {
        e as f64 / (e + r) as f64
    }
}
