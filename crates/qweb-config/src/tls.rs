//! `[listener.tls]` session resumption keys (`resumption`, `session_cache`,
//! `ticket_rotation`, `ticket_keys`) and client certificates (`client_auth`).

use std::path::PathBuf;
use std::time::Duration;

use toml::Spanned;

use super::raw::{RawClientAuth, RawTls};
use super::{ConfigError, EngineKind, OffloadConfig, Validator};

/// Default `session_cache`.
pub const DEFAULT_SESSION_CACHE: usize = 20_000;
/// Default `ticket_rotation`.
pub const DEFAULT_TICKET_ROTATION: Duration = Duration::from_secs(12 * 3600);
/// Largest `session_cache`.
const MAX_SESSION_CACHE: usize = 10_000_000;
/// Longest `ticket_rotation`: tickets live two periods, and TLS 1.3 caps that at 7 days.
const MAX_TICKET_ROTATION: Duration = Duration::from_secs(84 * 3600);

/// How a TLS listener resumes sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionConfig {
    /// Session tickets and the session cache (off: every handshake is full).
    pub resumption: bool,
    /// Sessions kept for TLS 1.2 session-id resumption, shared by the workers.
    pub session_cache: usize,
    /// How often local ticket keys rotate (the previous key decrypts for one more period).
    pub ticket_rotation: Duration,
    /// Where ticket keys come from.
    pub ticket_keys: TicketKeys,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            resumption: true,
            session_cache: DEFAULT_SESSION_CACHE,
            ticket_rotation: DEFAULT_TICKET_ROTATION,
            ticket_keys: TicketKeys::Local,
        }
    }
}

/// `client_auth = { ca = "ca.pem", required = true }`: the listener asks clients for a
/// certificate and verifies it against `ca`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientAuthConfig {
    /// PEM file of the CA certificates a client certificate must chain to.
    pub ca: PathBuf,
    /// A client without a certificate fails the handshake (default `true`); `false`: it is
    /// let through without an identity (a certificate it sends is still verified).
    pub required: bool,
    /// `names`: a certificate must carry one of these as a DNS subject alternative name
    /// (`*.ops.example`: any one label before `ops.example`); empty: any name the CA signed.
    pub names: Vec<qweb_tls::NamePattern>,
}

/// `ocsp` of a certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OcspSource {
    /// A DER OCSP response file.
    File(PathBuf),
    /// Fetched from the certificate's OCSP responder (its Authority Information Access URL),
    /// refreshed at half-life.
    Fetch,
}

/// `ticket_keys`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TicketKeys {
    /// Random keys of this process, rotated every `ticket_rotation` (the default).
    Local,
    /// A key file (nginx's `ssl_session_ticket_key` layout), re-read when it changes.
    File(PathBuf),
    /// The fleet's keys from the key servers of this `kind = "keyserver"` engine.
    Keyserver(String),
    /// The fleet's keys from the fleet's store (`[fleet]`, encrypted with its `secret`).
    Fleet,
}

impl Validator<'_> {
    /// Validates listener `i`'s resumption keys.
    pub(super) fn session(
        &self,
        i: usize,
        raw: &RawTls,
        engines: &OffloadConfig,
    ) -> Result<SessionConfig, ConfigError> {
        let key = |k: &str| format!("listener[{i}].tls.{k}");
        let mut cfg = SessionConfig {
            resumption: raw.resumption.unwrap_or(true),
            ..SessionConfig::default()
        };
        if let Some(n) = &raw.session_cache {
            if *n.get_ref() > MAX_SESSION_CACHE {
                return Err(self.err(
                    Some(n.span()),
                    key("session_cache"),
                    format!("at most {MAX_SESSION_CACHE} sessions"),
                ));
            }
            cfg.session_cache = *n.get_ref();
        }
        if let Some(d) = &raw.ticket_rotation {
            let v = d.get_ref().0;
            if v < Duration::from_secs(1) || v > MAX_TICKET_ROTATION {
                return Err(self.err(
                    Some(d.span()),
                    key("ticket_rotation"),
                    "must be from 1s to 84h (a ticket lives two periods; TLS 1.3 allows 7 days)",
                ));
            }
            cfg.ticket_rotation = v;
        }
        if let Some(tk) = &raw.ticket_keys {
            if !cfg.resumption {
                return Err(self.err(
                    Some(tk.span()),
                    key("ticket_keys"),
                    "has no effect with `resumption = false`",
                ));
            }
            cfg.ticket_keys = self.ticket_keys(tk, &key("ticket_keys"), engines)?;
        }
        Ok(cfg)
    }

    /// Validates a `client_auth` table at `key`: its CA file is read and must hold
    /// certificates rustls can verify with.
    pub(super) fn client_auth(
        &self,
        key: &str,
        raw: &Spanned<RawClientAuth>,
    ) -> Result<ClientAuthConfig, ConfigError> {
        let r = raw.get_ref();
        let path = self.path(r.ca.get_ref(), r.ca.span());
        qweb_tls::ClientAuth::from_ca_file(&path, true)
            .map_err(|e| self.err(Some(r.ca.span()), format!("{key}.ca"), e.to_string()))?;
        let mut names = Vec::new();
        if let Some(list) = &r.names {
            if list.get_ref().is_empty() {
                return Err(self.err(
                    Some(list.span()),
                    format!("{key}.names"),
                    "is empty: no certificate would be accepted (leave `names` out to accept any name the CA signed)",
                ));
            }
            for n in list.get_ref() {
                names.push(qweb_tls::NamePattern::parse(n.get_ref()).map_err(|e| {
                    self.err(Some(n.span()), format!("{key}.names"), e.to_string())
                })?);
            }
        }
        Ok(ClientAuthConfig {
            ca: path,
            required: r.required.unwrap_or(true),
            names,
        })
    }

    fn ticket_keys(
        &self,
        tk: &Spanned<String>,
        key: &str,
        engines: &OffloadConfig,
    ) -> Result<TicketKeys, ConfigError> {
        let v = tk.get_ref().trim();
        if v == "fleet" {
            // `[fleet]` and its secret are checked once the whole file is read
            return Ok(TicketKeys::Fleet);
        }
        if let Some(name) = v.strip_prefix("keyserver:") {
            return match engines.engines.iter().find(|e| e.name == name) {
                Some(e) if matches!(e.kind, EngineKind::Keyserver(_)) => {
                    Ok(TicketKeys::Keyserver(name.to_owned()))
                }
                Some(_) => Err(self.err(
                    Some(tk.span()),
                    key,
                    format!("engine `{name}` is not a `kind = \"keyserver\"` engine"),
                )),
                None => Err(self.err(
                    Some(tk.span()),
                    key,
                    format!("no engine named `{name}` (define `[offload.engines.{name}]` with `kind = \"keyserver\"`)"),
                )),
            };
        }
        if v.is_empty() {
            return Err(self.err(
                Some(tk.span()),
                key,
                "a key file path, \"keyserver:ENGINE\" or \"fleet\"",
            ));
        }
        let path = self.path(std::path::Path::new(v), tk.span());
        let bytes = std::fs::read(&path).map_err(|e| {
            self.err(
                Some(tk.span()),
                key,
                format!("cannot read {}: {e}", path.display()),
            )
        })?;
        qweb_tls::ticket::parse_key_file(&bytes)
            .map_err(|e| self.err(Some(tk.span()), key, format!("{}: {e}", path.display())))?;
        Ok(TicketKeys::File(path))
    }
}

impl Validator<'_> {
    /// `ticket_keys = "fleet"` needs `[fleet]` with a `secret`.
    pub(super) fn fleet_ticket_keys(
        &self,
        listeners: &[super::ListenerConfig],
        fleet: Option<&super::FleetConfig>,
    ) -> Result<(), ConfigError> {
        if fleet.is_some_and(|f| f.secret.is_some()) {
            return Ok(());
        }
        let Some(i) = listeners
            .iter()
            .position(|l| l.session.ticket_keys == TicketKeys::Fleet)
        else {
            return Ok(());
        };
        let key = format!("listener[{i}].tls.ticket_keys");
        let why = if fleet.is_none() {
            "`ticket_keys = \"fleet\"` needs a `[fleet]` section with a `secret`"
        } else {
            "`ticket_keys = \"fleet\"` needs `fleet.secret` (the keys are encrypted in the store)"
        };
        Err(self.err(self.span_of_key(&key), key, why))
    }
}

#[cfg(test)]
mod tests {
    use super::super::Config;
    use super::*;
    use std::path::Path;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::from_str_at(text, Some(Path::new("/etc/qweb/test.toml")))
    }

    const HEAD: &str =
        "[[listener]]\naddress = \"127.0.0.1:0\"\n[listener.tls]\nself_signed = true\n";

    #[test]
    fn defaults() {
        let c = parse(HEAD).unwrap();
        assert_eq!(c.listeners[0].session, SessionConfig::default());
        assert_eq!(c.listeners[0].session.session_cache, 20_000);
        assert_eq!(
            c.listeners[0].session.ticket_rotation,
            Duration::from_secs(43_200)
        );
    }

    #[test]
    fn values_and_located_errors() {
        let c = parse(&format!(
            "{HEAD}resumption = false\nsession_cache = 5\nticket_rotation = \"2s\"\n"
        ))
        .unwrap();
        let s = &c.listeners[0].session;
        assert!(!s.resumption);
        assert_eq!(s.session_cache, 5);
        assert_eq!(s.ticket_rotation, Duration::from_secs(2));

        let e = parse(&format!("{HEAD}ticket_rotation = \"0s\"\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(":5:19: key `listener[0].tls.ticket_rotation`"),
            "{e}"
        );
        let e = parse(&format!("{HEAD}session_cache = 99999999\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(":5:") && e.contains("listener[0].tls.session_cache"),
            "{e}"
        );
        let e = parse(&format!("{HEAD}ticket_keys = \"/nonexistent/keys.bin\"\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(":5:15: key `listener[0].tls.ticket_keys`") && e.contains("cannot read"),
            "{e}"
        );
        let e = parse(&format!("{HEAD}ticket_keys = \"keyserver:nope\"\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no engine named `nope`"), "{e}");
        let e = parse(&format!(
            "[offload.engines.p]\nkind = \"pool\"\n{HEAD}ticket_keys = \"keyserver:p\"\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("not a `kind = \"keyserver\"` engine"), "{e}");
        let e = parse(&format!(
            "{HEAD}resumption = false\nticket_keys = \"keyserver:x\"\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("no effect with `resumption = false`"), "{e}");
    }

    #[test]
    fn ocsp_files_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let c = rcgen::CertificateParams::new(vec!["localhost".into()])
            .unwrap()
            .self_signed(&kp)
            .unwrap();
        std::fs::write(dir.path().join("c.pem"), c.pem()).unwrap();
        std::fs::write(dir.path().join("k.pem"), kp.serialize_pem()).unwrap();
        std::fs::write(dir.path().join("r.der"), b"x").unwrap();
        let file = dir.path().join("q.toml");
        let cfg = |ocsp: &str| {
            format!(
                "[[listener]]\naddress = \"127.0.0.1:0\"\n[listener.tls]\ncertificates = [{{ cert = \"c.pem\", key = \"k.pem\", ocsp = \"{ocsp}\" }}]\n"
            )
        };
        let c = Config::from_str_at(&cfg("r.der"), Some(&file)).unwrap();
        match &c.listeners[0].tls {
            Some(super::super::TlsConfig::Certificates(list)) => {
                assert_eq!(
                    list[0].ocsp,
                    Some(OcspSource::File(dir.path().join("r.der")))
                )
            }
            other => panic!("{other:?}"),
        }
        let e = Config::from_str_at(&cfg("missing.der"), Some(&file))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(":4:") && e.contains("key `listener[0].tls.certificates[0].ocsp`"),
            "{e}"
        );
        let e = Config::from_str_at(&cfg("fetch"), Some(&file))
            .unwrap_err()
            .to_string();
        assert!(e.contains("has no http:// OCSP responder"), "{e}");
    }

    #[test]
    fn client_auth_is_read_and_its_errors_name_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        std::fs::write(dir.path().join("ca.pem"), p.self_signed(&kp).unwrap().pem()).unwrap();
        std::fs::write(dir.path().join("empty.pem"), "not a certificate\n").unwrap();
        let file = dir.path().join("q.toml");
        let with =
            |v: &str| Config::from_str_at(&format!("{HEAD}client_auth = {v}\n"), Some(&file));
        let c = with("{ ca = \"ca.pem\" }").unwrap();
        assert_eq!(
            c.listeners[0].client_auth,
            Some(ClientAuthConfig {
                ca: dir.path().join("ca.pem"),
                required: true,
                names: Vec::new(),
            })
        );
        let c = with("{ ca = \"ca.pem\", names = [\"API.example\", \"*.ops.example\"] }").unwrap();
        let names: Vec<&str> = c.listeners[0]
            .client_auth
            .as_ref()
            .unwrap()
            .names
            .iter()
            .map(|n| n.as_str())
            .collect();
        assert_eq!(names, ["api.example", "*.ops.example"]);
        for (v, want) in [
            ("[]", "is empty"),
            ("[\"a b.example\"]", "no spaces"),
            ("[\"*.example\"]", "a wildcard is"),
            ("[\"a.*.example\"]", "a wildcard is"),
        ] {
            let e = with(&format!("{{ ca = \"ca.pem\", names = {v} }}"))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("key `listener[0].tls.client_auth.names`") && e.contains(want),
                "{v}: {e}"
            );
        }
        let c = with("{ ca = \"ca.pem\", required = false }").unwrap();
        assert!(!c.listeners[0].client_auth.as_ref().unwrap().required);
        assert_eq!(parse(HEAD).unwrap().listeners[0].client_auth, None);
        let e = with("{ ca = \"missing.pem\" }").unwrap_err().to_string();
        assert!(
            e.contains(":5:22: key `listener[0].tls.client_auth.ca`") && e.contains("cannot read"),
            "{e}"
        );
        let e = with("{ ca = \"empty.pem\" }").unwrap_err().to_string();
        assert!(
            e.contains("key `listener[0].tls.client_auth.ca`")
                && e.contains("no CERTIFICATE block found"),
            "{e}"
        );
        let e = with("{ ca = \"ca.pem\", require = true }")
            .unwrap_err()
            .to_string();
        assert!(e.contains("require"), "{e}");
        // on a plain listener there is no [listener.tls] to put it in
        let e = Config::from_str_at(
            "[[listener]]\naddress = \"127.0.0.1:0\"\nclient_auth = { ca = \"ca.pem\" }\n",
            Some(&file),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("client_auth"), "{e}");
        // a site's own policy needs the site's own certificates
        let site = |extra: &str| {
            Config::from_str_at(
                &format!(
                    "{HEAD}[[site]]\nserver_names = [\"a.test\"]\n{extra}client_auth = {{ ca = \"ca.pem\" }}\n[[site.route]]\nprefix = \"/\"\nupstreams = [\"127.0.0.1:1\"]\n"
                ),
                Some(&file),
            )
        };
        let e = site("").unwrap_err().to_string();
        assert!(
            e.contains(":7:15: key `site[0].client_auth`") && e.contains("own `certificates`"),
            "{e}"
        );
    }

    #[test]
    fn client_placeholders_only_in_request_headers_set() {
        let route = |k: &str, edits: &str| {
            parse(&format!(
                "[[route]]\nprefix = \"/\"\nupstreams = [\"127.0.0.1:1\"]\n{k} = {edits}\n"
            ))
        };
        let c = route(
            "request_headers",
            "{ set = { \"X-Client\" = \"cn {tls_client_subject} fp {tls_client_fingerprint}\" } }",
        )
        .unwrap();
        let edits = &c.routes[0].rules.request_headers;
        assert!(edits.set.is_empty());
        use crate::ValuePart::*;
        assert_eq!(
            edits.set_placeholders[0].1,
            [
                Text("cn ".into()),
                ClientSubject,
                Text(" fp ".into()),
                ClientFingerprint
            ]
        );
        let e = route(
            "request_headers",
            "{ add = { \"X-Client\" = \"{tls_client_subject}\" } }",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("request_headers.add") && e.contains("placeholders go in `set`"),
            "{e}"
        );
        let e = route(
            "headers",
            "{ set = { \"X-Client\" = \"{tls_client_subject}\" } }",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("routes") || e.contains("headers.set"), "{e}");
        assert!(e.contains("are for `request_headers`"), "{e}");
        // other braces are text, as before
        let c = route("request_headers", "{ set = { \"X-A\" = \"{x}\" } }").unwrap();
        assert_eq!(c.routes[0].rules.request_headers.set.len(), 1);
    }

    #[test]
    fn key_files_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("good.bin"), [7u8; 80]).unwrap();
        std::fs::write(dir.path().join("bad.bin"), [7u8; 50]).unwrap();
        let file = dir.path().join("q.toml");
        let c = Config::from_str_at(&format!("{HEAD}ticket_keys = \"good.bin\"\n"), Some(&file))
            .unwrap();
        assert_eq!(
            c.listeners[0].session.ticket_keys,
            TicketKeys::File(dir.path().join("good.bin"))
        );
        let e = Config::from_str_at(&format!("{HEAD}ticket_keys = \"bad.bin\"\n"), Some(&file))
            .unwrap_err()
            .to_string();
        assert!(e.contains("50 bytes") && e.contains("ticket_keys"), "{e}");
        let ks = Config::from_str_at(
            &format!(
                "[offload.engines.ks]\nkind = \"keyserver\"\nservers = [\"unix:/tmp/x.sock\"]\n{HEAD}ticket_keys = \"keyserver:ks\"\n"
            ),
            Some(&file),
        )
        .unwrap();
        assert_eq!(
            c.listeners[0].session.ticket_keys,
            TicketKeys::File(dir.path().join("good.bin"))
        );
        assert_eq!(
            ks.listeners[0].session.ticket_keys,
            TicketKeys::Keyserver("ks".into())
        );
    }
}
