//! `acme = { ... }` on a `[[site]]`: certificates for the site's `server_names`, ordered from
//! an ACME CA (RFC 8555) and renewed by qweb itself (see qweb-server's `runtime::acme`).

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::units::Dur;
use super::{ConfigError, ListenerConfig, Validator};

/// Let's Encrypt's production directory, the default CA.
pub const DEFAULT_ACME_DIRECTORY: &str = "https://acme-v02.api.letsencrypt.org/directory";

/// Default first wait after a failed order (doubling to [`MAX_ACME_RETRY`]).
pub const DEFAULT_ACME_RETRY: Duration = Duration::from_secs(60);

/// Longest wait between two tries of a failing order.
pub const MAX_ACME_RETRY: Duration = Duration::from_secs(6 * 3600);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAcme {
    pub directory: Option<Spanned<String>>,
    pub email: Option<Spanned<String>>,
    pub ca_root: Option<Spanned<PathBuf>>,
    pub challenge: Option<Spanned<String>>,
    pub renew_before: Option<Spanned<Dur>>,
    pub retry_after: Option<Spanned<Dur>>,
    pub key: Option<Spanned<String>>,
}

/// How the CA checks that qweb answers for a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AcmeChallenge {
    /// `http-01`: `GET http://NAME/.well-known/acme-challenge/TOKEN` on port 80, answered by
    /// every plain HTTP listener (before its `redirect`).
    Http01,
    /// `tls-alpn-01`: a TLS handshake to NAME:443 offering ALPN `acme-tls/1`, answered by
    /// every TLS listener with a challenge certificate.
    TlsAlpn01,
}

/// A site's automatic certificate.
#[derive(Debug, Clone)]
pub struct AcmeConfig {
    /// The CA's directory URL (`https://`).
    pub directory: String,
    /// The account's contact address, if any.
    pub email: Option<String>,
    /// A PEM file with the root that the CA's own HTTPS certificate chains to (a private
    /// CA); `None`: the system's roots.
    pub ca_root: Option<PathBuf>,
    /// The challenge answered.
    pub challenge: AcmeChallenge,
    /// Renew this long before expiry (`None`: when a third of the lifetime is left).
    pub renew_before: Option<Duration>,
    /// First wait after a failed order; doubles up to [`MAX_ACME_RETRY`].
    pub retry_after: Duration,
    /// `key = "keyserver:ENGINE"`: the key server of that engine generates and keeps the
    /// certificate's key and signs with it (`None`: qweb generates the key and keeps it in
    /// the state folder).
    pub keyserver: Option<String>,
}

impl Validator<'_> {
    /// With `[fleet]`, ACME keeps its account and certificates in the fleet's store, their
    /// private keys sealed with `fleet.secret`: a site with `acme` needs that secret.
    pub(super) fn fleet_acme(
        &self,
        sites: &super::SitesConfig,
        fleet: Option<&super::FleetConfig>,
    ) -> Result<(), ConfigError> {
        let Some(fleet) = fleet else { return Ok(()) };
        if fleet.secret.is_some() {
            return Ok(());
        }
        let Some(i) = sites.sites.iter().position(|s| s.acme.is_some()) else {
            return Ok(());
        };
        Err(self.err(
            self.span_of_key("fleet.store"),
            "fleet.secret",
            format!(
                "`site[{i}].acme` with `[fleet]` keeps its account and certificate keys in the fleet's store, encrypted with `fleet.secret`: set `secret` (`openssl rand -hex 32`)"
            ),
        ))
    }
}

impl Validator<'_> {
    /// Validates `site[s].acme` for a site with `names` and no certificate files.
    pub(super) fn acme(
        &self,
        key: &str,
        raw: &Spanned<RawAcme>,
        names: &[String],
        has_files: bool,
        listeners: &[ListenerConfig],
        engines: &super::OffloadConfig,
    ) -> Result<AcmeConfig, ConfigError> {
        let a = raw.get_ref();
        let key = format!("{key}.acme");
        let at = |k: &str| format!("{key}.{k}");
        if has_files {
            return Err(self.err(
                Some(raw.span()),
                key,
                "use either `acme` or `certificates`, not both",
            ));
        }
        if names.is_empty() {
            return Err(self.err(
                Some(raw.span()),
                key,
                "`acme` orders a certificate for the site's `server_names`: name at least one",
            ));
        }
        if let Some(w) = names.iter().find(|n| n.starts_with("*.")) {
            return Err(self.err(
                Some(raw.span()),
                key,
                format!("`{w}`: HTTP-01 and TLS-ALPN-01 cannot validate a wildcard name; give this site certificate files"),
            ));
        }
        let directory = match &a.directory {
            None => DEFAULT_ACME_DIRECTORY.to_owned(),
            Some(d) if d.get_ref().starts_with("https://") && d.get_ref().len() > 8 => {
                d.get_ref().clone()
            }
            Some(d) => {
                return Err(self.err(
                    Some(d.span()),
                    at("directory"),
                    "an https:// URL (RFC 8555 requires HTTPS)",
                ))
            }
        };
        let email = match &a.email {
            None => None,
            Some(e) => {
                let v = e.get_ref();
                let ok = v.split_once('@').is_some_and(|(l, d)| {
                    !l.is_empty() && d.contains('.') && !v.chars().any(|c| c.is_whitespace())
                });
                if !ok {
                    return Err(self.err(Some(e.span()), at("email"), "an e-mail address"));
                }
                Some(v.clone())
            }
        };
        let ca_root = match &a.ca_root {
            None => None,
            Some(p) => {
                let path = self.path(p.get_ref(), p.span());
                if let Err(e) = qweb_tls::load_certs(&path) {
                    return Err(self.err(Some(p.span()), at("ca_root"), e.to_string()));
                }
                Some(path)
            }
        };
        let plain = listeners.iter().any(|l| l.tls.is_none());
        // the sites' certificates join the listeners with `certificates` (or `tls = {}`),
        // not those with `self_signed`
        let tls = listeners
            .iter()
            .any(|l| matches!(l.tls, Some(super::TlsConfig::Certificates(_))));
        if !tls {
            return Err(self.err(
                Some(raw.span()),
                key,
                "no TLS listener would serve the certificate: add one with `tls = {}` or `certificates` (a `self_signed` listener serves only its own)",
            ));
        }
        let challenge = match a.challenge.as_ref().map(|c| (c, c.get_ref().as_str())) {
            None if plain => AcmeChallenge::Http01,
            None => AcmeChallenge::TlsAlpn01,
            Some((c, "http-01")) => {
                if !plain {
                    return Err(self.err(
                        Some(c.span()),
                        at("challenge"),
                        "http-01 needs a plain HTTP listener (the CA connects to port 80)",
                    ));
                }
                AcmeChallenge::Http01
            }
            Some((_, "tls-alpn-01")) => AcmeChallenge::TlsAlpn01,
            Some((c, _)) => {
                return Err(self.err(
                    Some(c.span()),
                    at("challenge"),
                    "`http-01` or `tls-alpn-01`",
                ))
            }
        };
        let positive = |d: &Option<Spanned<Dur>>, k: &str| match d {
            Some(v) if v.get_ref().0.is_zero() => {
                Err(self.err(Some(v.span()), at(k), "a duration above zero"))
            }
            Some(v) => Ok(Some(v.get_ref().0)),
            None => Ok(None),
        };
        let keyserver = match &a.key {
            None => None,
            Some(k) => {
                let name = k.get_ref().strip_prefix("keyserver:").unwrap_or("");
                let is_keyserver = engines
                    .engines
                    .iter()
                    .any(|e| e.name == name && matches!(e.kind, super::EngineKind::Keyserver(_)));
                if !is_keyserver {
                    return Err(self.err(
                        Some(k.span()),
                        at("key"),
                        "`keyserver:ENGINE`, naming an [offload.engines.ENGINE] of kind \"keyserver\"",
                    ));
                }
                Some(name.to_owned())
            }
        };
        let renew_before = positive(&a.renew_before, "renew_before")?;
        let retry_after = positive(&a.retry_after, "retry_after")?.unwrap_or(DEFAULT_ACME_RETRY);
        Ok(AcmeConfig {
            directory,
            email,
            ca_root,
            challenge,
            renew_before,
            retry_after: retry_after.min(MAX_ACME_RETRY),
            keyserver,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::{AcmeChallenge, Config, DEFAULT_ACME_DIRECTORY, DEFAULT_ACME_RETRY};
    use std::time::Duration;

    const LISTENERS: &str = r#"
[[listener]]
address = "127.0.0.1:0"
tls = {}
[[listener]]
address = "127.0.0.1:0"
"#;

    fn parse(text: &str) -> Result<Config, String> {
        Config::from_str_at(text, Some(std::path::Path::new("/etc/qweb/test.toml")))
            .map_err(|e| e.to_string())
    }

    fn site(acme: &str) -> String {
        format!(
            "{LISTENERS}\n[[site]]\nserver_names = [\"a.example\", \"www.a.example\"]\nacme = {acme}\nroute = [{{ prefix = \"/\", root = \"/tmp\" }}]\n"
        )
    }

    /// Six lines give a site a certificate from Let's Encrypt by HTTP-01 (a plain listener
    /// exists), renewed at a third of its life, retried after a minute; the TLS listener
    /// needs no certificate of its own.
    #[test]
    fn defaults_and_a_listener_with_no_certificate() {
        let c = parse(&site("{ email = \"ops@a.example\" }")).unwrap();
        let a = c.sites.sites[0].acme.as_ref().unwrap();
        assert_eq!(a.directory, DEFAULT_ACME_DIRECTORY);
        assert_eq!(a.email.as_deref(), Some("ops@a.example"));
        assert_eq!(a.challenge, AcmeChallenge::Http01);
        assert_eq!(a.renew_before, None);
        assert_eq!(a.retry_after, DEFAULT_ACME_RETRY);
        let c = parse(&site(
            "{ challenge = \"tls-alpn-01\", renew_before = \"240h\", retry_after = \"5s\", directory = \"https://ca.test/dir\" }",
        ))
        .unwrap();
        let a = c.sites.sites[0].acme.as_ref().unwrap();
        assert_eq!(a.challenge, AcmeChallenge::TlsAlpn01);
        assert_eq!(a.renew_before, Some(Duration::from_secs(10 * 86400)));
        assert_eq!(a.retry_after, Duration::from_secs(5));
        assert_eq!(a.directory, "https://ca.test/dir");
        // TLS only: TLS-ALPN-01 is the default, HTTP-01 is refused
        let tls_only = "[[listener]]\naddress = \"127.0.0.1:0\"\ntls = {}\n[[site]]\nserver_names = [\"a.example\"]\nacme = {}\nroute = [{ prefix = \"/\", root = \"/tmp\" }]\n";
        let c = parse(tls_only).unwrap();
        assert_eq!(
            c.sites.sites[0].acme.as_ref().unwrap().challenge,
            AcmeChallenge::TlsAlpn01
        );
        let e = parse(&tls_only.replace("acme = {}", "acme = { challenge = \"http-01\" }"))
            .unwrap_err();
        assert!(
            e.contains("site[0].acme.challenge") && e.contains("plain HTTP listener"),
            "{e}"
        );
    }

    #[test]
    fn refusals_name_the_key() {
        for (acme, key, says) in [
            (
                "{ directory = \"http://ca.test/\" }",
                "site[0].acme.directory",
                "https://",
            ),
            ("{ email = \"nobody\" }", "site[0].acme.email", "e-mail"),
            (
                "{ challenge = \"dns-01\" }",
                "site[0].acme.challenge",
                "tls-alpn-01",
            ),
            (
                "{ renew_before = \"0s\" }",
                "site[0].acme.renew_before",
                "above zero",
            ),
            (
                "{ ca_root = \"/nonexistent.pem\" }",
                "site[0].acme.ca_root",
                "nonexistent",
            ),
            ("{ bogus = 1 }", "site[0].acme", "unknown field"),
            (
                "{ key = \"keyserver:nope\" }",
                "site[0].acme.key",
                "keyserver:ENGINE",
            ),
            (
                "{ key = \"/etc/k.pem\" }",
                "site[0].acme.key",
                "keyserver:ENGINE",
            ),
        ] {
            let e = parse(&site(acme)).unwrap_err();
            assert!(e.contains(key) && e.contains(says), "{acme}: {e}");
        }
        let wild = site("{}").replace("\"www.a.example\"", "\"*.a.example\"");
        let e = parse(&wild).unwrap_err();
        assert!(e.contains("wildcard"), "{e}");
        let both = site("{}").replace(
            "acme = {}",
            "acme = {}\ncertificates = [{ cert = \"/c.pem\", key = \"/k.pem\" }]",
        );
        let e = parse(&both).unwrap_err();
        assert!(e.contains("not both"), "{e}");
        let no_tls = "[[listener]]\naddress = \"127.0.0.1:0\"\n[[site]]\nserver_names = [\"a.example\"]\nacme = {}\nroute = [{ prefix = \"/\", root = \"/tmp\" }]\n";
        let e = parse(no_tls).unwrap_err();
        assert!(e.contains("no TLS listener"), "{e}");
        let self_signed = no_tls.replace(
            "address = \"127.0.0.1:0\"\n",
            "address = \"127.0.0.1:0\"\ntls = { self_signed = true }\n",
        );
        let e = parse(&self_signed).unwrap_err();
        assert!(
            e.contains("no TLS listener") && e.contains("self_signed"),
            "{e}"
        );
    }
    /// The README's recipe is a valid configuration: TLS-ALPN-01 (no plain listener), both
    /// names, Let's Encrypt.
    #[test]
    fn the_readme_recipe_is_valid() {
        let readme = include_str!("../../../README.md");
        let section = readme.split("## Automatic HTTPS (ACME)").nth(1).unwrap();
        let block = section.split("```toml\n").nth(1).unwrap();
        let block = block.split("```").next().unwrap();
        let c = parse(&block.replace("/srv/www", "/tmp")).unwrap();
        let site = &c.sites.sites[0];
        assert_eq!(site.server_names, ["example.com", "www.example.com"]);
        let a = site.acme.as_ref().unwrap();
        assert_eq!(a.challenge, AcmeChallenge::TlsAlpn01);
        assert_eq!(a.directory, DEFAULT_ACME_DIRECTORY);
    }
    /// With `[fleet]`, a site with `acme` needs `fleet.secret` (its keys are sealed in the
    /// store); without `acme`, or with the secret, `[fleet]` is fine.
    #[test]
    fn acme_with_a_fleet_needs_its_secret() {
        let fleet = "[fleet]\nstore = \"redis://h\"\n";
        let e = parse(&format!("{}{fleet}", site("{}"))).unwrap_err();
        assert!(
            e.contains("key `fleet.secret`") && e.contains("site[0].acme"),
            "{e}"
        );
        let hex = "ab".repeat(32);
        let c = parse(&format!("{}{fleet}secret = \"{hex}\"\n", site("{}"))).unwrap();
        assert!(c.fleet.unwrap().secret.is_some());
        assert!(parse(fleet).is_ok(), "no acme: no secret needed");
    }
}
