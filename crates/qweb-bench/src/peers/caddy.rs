//! Caddy as a peer: its JSON configuration, generated from the same parameters as qweb's.
//! Caddy is one Go process; its parallelism is set with `GOMAXPROCS` = workers (the runner
//! sets it in the environment). No admin endpoint, no automatic HTTPS, no access log (none is
//! configured), certificates loaded from files, session tickets off (Go's TLS server keeps no
//! session-ID cache, so without tickets there is no resumption at all).

use std::path::PathBuf;

use serde_json::json;

/// Everything a generated Caddy configuration depends on.
#[derive(Debug, Clone)]
pub struct CaddySpec {
    /// HTTPS port on 127.0.0.1.
    pub port: u16,
    /// A plain-HTTP listener on this port too.
    pub plain_port: Option<u16>,
    /// Certificate (PEM).
    pub cert: PathBuf,
    /// Private key (PEM).
    pub key: PathBuf,
    /// Document root.
    pub root: PathBuf,
    /// Caddy's storage folder (it writes nothing there with this configuration, but wants one).
    pub prefix: PathBuf,
    /// Keep-alive idle timeout in seconds.
    pub keepalive_secs: u64,
    /// Session tickets on (Caddy's default) or off.
    pub tickets: bool,
    /// HTTP/3 too (`h3` among the TLS server's protocols; Caddy then sends `Alt-Svc`).
    pub http3: bool,
    /// On-the-fly gzip at this level (an `encode` handler before the file server); none
    /// when `None`.
    pub gzip_level: Option<u32>,
}

/// The Caddy JSON configuration for `spec`.
pub fn caddy_json(spec: &CaddySpec) -> String {
    let files = json!({ "handler": "file_server", "root": spec.root });
    // `encode` compresses the types of its default matcher (text/* among them) from 512
    // bytes; the file server's `precompressed` stays off.
    let route = match spec.gzip_level {
        Some(level) => json!([{ "handle": [
            { "handler": "encode", "encodings": { "gzip": { "level": level } }, "prefer": ["gzip"] },
            files
        ] }]),
        None => json!([{ "handle": [files] }]),
    };
    let idle = format!("{}s", spec.keepalive_secs);
    let mut servers = serde_json::Map::new();
    servers.insert(
        "tls".into(),
        json!({
            "listen": [format!("127.0.0.1:{}", spec.port)],
            "routes": route,
            "idle_timeout": idle,
            // The client connects by IP (no SNI): the loaded certificate is the default.
            "tls_connection_policies": [{
                "certificate_selection": { "any_tag": ["qweb-bench"] },
                "default_sni": "localhost"
            }],
            "automatic_https": { "disable": true },
            "protocols": if spec.http3 { json!(["h1", "h2", "h3"]) } else { json!(["h1", "h2"]) }
        }),
    );
    if let Some(p) = spec.plain_port {
        servers.insert(
            "plain".into(),
            json!({
                "listen": [format!("127.0.0.1:{p}")],
                "routes": route,
                "idle_timeout": idle,
                "automatic_https": { "disable": true },
                "protocols": ["h1"]
            }),
        );
    }
    let cfg = json!({
        "admin": { "disabled": true, "config": { "persist": false } },
        "logging": { "logs": { "default": { "level": "ERROR" } } },
        "storage": { "module": "file_system", "root": spec.prefix.join("data") },
        "apps": {
            "http": { "servers": servers },
            "tls": {
                "certificates": { "load_files": [{
                    "certificate": spec.cert, "key": spec.key, "tags": ["qweb-bench"]
                }] },
                "session_tickets": { "disabled": !spec.tickets }
            }
        }
    });
    serde_json::to_string_pretty(&cfg).unwrap_or_default()
}

/// Parses `caddy version` ("v2.6.2 h1:..." or "2.6.2").
pub fn parse_version(out: &str) -> Option<String> {
    let w = out.split_whitespace().next()?.trim_start_matches('v');
    w.chars()
        .next()
        .filter(|c| c.is_ascii_digit())
        .map(|_| w.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caddy_json_serves_files_with_tickets_off() {
        let c = caddy_json(&CaddySpec {
            port: 9443,
            plain_port: Some(9080),
            cert: "/d/c.crt".into(),
            key: "/d/k.key".into(),
            root: "/d/www".into(),
            prefix: "/d/caddy".into(),
            keepalive_secs: 300,
            tickets: false,
            http3: false,
            gzip_level: None,
        });
        let v: serde_json::Value = serde_json::from_str(&c).unwrap();
        assert_eq!(v["admin"]["disabled"], true);
        assert_eq!(v["apps"]["tls"]["session_tickets"]["disabled"], true);
        let tls = &v["apps"]["http"]["servers"]["tls"];
        assert_eq!(tls["listen"][0], "127.0.0.1:9443");
        assert_eq!(
            tls["protocols"],
            serde_json::json!(["h1", "h2"]),
            "no HTTP/3 unless asked"
        );
        assert_eq!(tls["routes"][0]["handle"][0]["root"], "/d/www");
        assert_eq!(
            tls["routes"][0]["handle"].as_array().map(|a| a.len()),
            Some(1)
        );
        assert_eq!(tls["automatic_https"]["disable"], true);
        let plain = &v["apps"]["http"]["servers"]["plain"];
        assert_eq!(plain["listen"][0], "127.0.0.1:9080");
        assert!(plain.get("tls_connection_policies").is_none());
        assert_eq!(
            v["apps"]["tls"]["certificates"]["load_files"][0]["certificate"],
            "/d/c.crt"
        );
    }

    #[test]
    fn caddy_gzip_encodes_before_the_file_server() {
        let c = caddy_json(&CaddySpec {
            port: 9443,
            plain_port: None,
            cert: "/d/c.crt".into(),
            key: "/d/k.key".into(),
            root: "/d/www".into(),
            prefix: "/d/caddy".into(),
            keepalive_secs: 300,
            tickets: false,
            http3: false,
            gzip_level: Some(1),
        });
        let v: serde_json::Value = serde_json::from_str(&c).unwrap();
        let h = &v["apps"]["http"]["servers"]["tls"]["routes"][0]["handle"];
        assert_eq!(h[0]["handler"], "encode");
        assert_eq!(h[0]["encodings"]["gzip"]["level"], 1);
        assert_eq!(h[1]["handler"], "file_server");
        assert!(h[1].get("precompressed").is_none());
    }

    #[test]
    fn caddy_versions() {
        assert_eq!(
            parse_version("v2.6.2 h1:wKoFIxpmOJLGl3QXoo6PNbYvGW4xLEgo32GPBEjWL8o=\n"),
            Some("2.6.2".into())
        );
        assert_eq!(parse_version("2.6.2\n"), Some("2.6.2".into()));
        assert_eq!(parse_version("bash: caddy: not found"), None);
    }
}
