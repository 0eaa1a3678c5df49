//! `[[listener]]`: the listening addresses, their TLS certificates and protocols.

use std::net::SocketAddr;
use std::path::PathBuf;

use toml::Spanned;

use super::raw::RawListener;
use super::{
    ConfigError, ListenerOffload, OcspSource, OffloadConfig, RedirectConfig, SessionConfig,
    Validator,
};

/// One listening address.
#[derive(Debug, Clone)]
pub struct ListenerConfig {
    /// Address and port; port 0 picks a free port (used by tests).
    pub address: SocketAddr,
    /// On the unspecified IPv6 address (`[::]`): IPv6 clients only (`IPV6_V6ONLY`). Default
    /// off: `[::]` takes IPv4 clients too (as Caddy and Go bind it; nginx's `ipv6only=on` is
    /// the opt-in here), unless another listener binds `0.0.0.0` on the same port. Always on
    /// for a specific IPv6 address, which no IPv4 client can reach anyway.
    pub ipv6_only: bool,
    /// TLS settings; `None` is plain HTTP/1.1.
    pub tls: Option<TlsConfig>,
    /// Offer HTTP/2 by ALPN (TLS listeners only).
    pub http2: bool,
    /// Serve HTTP/3 over QUIC on the same address, UDP (TLS listeners only; default off).
    pub http3: bool,
    /// `ma` of the `Alt-Svc: h3=":PORT"` header the listener's responses carry when `http3`
    /// is on, in seconds (default [`DEFAULT_ALT_SVC_MAX_AGE`]).
    pub alt_svc_max_age: u64,
    /// QUIC handshakes in progress on a worker past which a new connection from an address
    /// not yet validated gets a Retry (it must echo a token, proving its address, before the
    /// server spends a handshake on it); 0: every new connection (default
    /// [`DEFAULT_QUIC_RETRY_THRESHOLD`]).
    pub quic_retry_threshold: u32,
    /// Offload of the TLS private-key operations (`None`: rustls signs in place).
    pub offload: Option<ListenerOffload>,
    /// Every request on this listener is redirected (`redirect = { to = ... }`).
    pub redirect: Option<RedirectConfig>,
    /// TLS session resumption (tickets, session cache).
    pub session: SessionConfig,
    /// PROXY protocol (v1 or v2) from these balancers (`proxy_protocol = { trusted = [...] }`);
    /// `None`: no header is read.
    pub proxy_protocol: Option<ProxyProtocol>,
    /// Client certificates (`[listener.tls] client_auth`; `None`: none asked for).
    pub client_auth: Option<super::ClientAuthConfig>,
}

/// `proxy_protocol` of a TCP listener: a connection from a trusted address must begin with a
/// PROXY header (HAProxy's v1 or v2), whose source address is then the client's; one from
/// any other address is served with its own address, a PROXY header from it being a bad
/// request. HTTP/3 (UDP) on the same listener reads none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyProtocol {
    /// The balancers' addresses and blocks (at least one).
    pub trusted: Vec<ipnet::IpNet>,
}

impl ProxyProtocol {
    /// Must a connection from `ip` begin with a PROXY header? (An IPv4-mapped IPv6 address is
    /// judged as the IPv4 one.)
    pub fn trusts(&self, ip: std::net::IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.trusted.iter().any(|n| n.contains(&ip))
    }
}

/// Where a TLS listener's certificates come from.
#[derive(Debug, Clone)]
pub enum TlsConfig {
    /// The self-signed certificate in the state folder, generated on first use.
    SelfSigned,
    /// Certificate chains and keys; the first is the default, others are chosen by SNI.
    Certificates(Vec<CertificateConfig>),
}

/// One certificate chain and its private key.
#[derive(Debug, Clone)]
pub struct CertificateConfig {
    /// PEM chain, leaf first.
    pub cert: PathBuf,
    /// The OCSP response to staple: a DER file (`ocsp = "file.der"`, re-read when it
    /// changes) or fetched from the certificate's responder (`ocsp = "fetch"`).
    pub ocsp: Option<OcspSource>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1). `None`: a key server holds it (the
    /// listener's offload engine is a key server).
    pub key: Option<PathBuf>,
}

/// How long a client may remember that a listener serves HTTP/3 (`Alt-Svc`'s `ma`): one day.
pub const DEFAULT_ALT_SVC_MAX_AGE: u64 = 86_400;

/// Default `quic_retry_threshold`: QUIC handshakes in progress per worker before new
/// connections must validate their address with a Retry. Far below the 1 024 half-open
/// connections a worker holds at most: a flood of Initial packets from spoofed addresses is
/// answered with stateless Retry packets (no state, no signature) long before that.
pub const DEFAULT_QUIC_RETRY_THRESHOLD: u32 = 128;

/// The listeners without a config: HTTPS on 127.0.0.1:8443 (self-signed), HTTP on
/// 127.0.0.1:8080.
pub(super) fn default_listeners() -> Vec<ListenerConfig> {
    vec![
        ListenerConfig {
            address: ([127, 0, 0, 1], 8443).into(),
            ipv6_only: true,
            tls: Some(TlsConfig::SelfSigned),
            http2: true,
            http3: false,
            alt_svc_max_age: DEFAULT_ALT_SVC_MAX_AGE,
            quic_retry_threshold: DEFAULT_QUIC_RETRY_THRESHOLD,
            offload: None,
            redirect: None,
            session: SessionConfig::default(),
            proxy_protocol: None,
            client_auth: None,
        },
        ListenerConfig {
            address: ([127, 0, 0, 1], 8080).into(),
            ipv6_only: true,
            tls: None,
            http2: false,
            http3: false,
            alt_svc_max_age: DEFAULT_ALT_SVC_MAX_AGE,
            quic_retry_threshold: DEFAULT_QUIC_RETRY_THRESHOLD,
            offload: None,
            redirect: None,
            session: SessionConfig::default(),
            proxy_protocol: None,
            client_auth: None,
        },
    ]
}

impl Validator<'_> {
    /// Validates the `[[listener]]` tables (the default listeners when there are none).
    pub(super) fn listeners(
        &self,
        raw: Option<&Spanned<Vec<RawListener>>>,
        offload: &OffloadConfig,
    ) -> Result<Vec<ListenerConfig>, ConfigError> {
        let Some(ls) = raw else {
            return Ok(default_listeners());
        };
        if ls.get_ref().is_empty() {
            return Err(self.err(
                Some(ls.span()),
                "listener",
                "at least one listener is needed",
            ));
        }
        let mut out: Vec<ListenerConfig> = Vec::new();
        for (i, l) in ls.get_ref().iter().enumerate() {
            let cfg = self.listener(i, l, offload)?;
            if cfg.address.port() != 0 && out.iter().any(|o| o.address == cfg.address) {
                return Err(self.err(
                    Some(l.address.span()),
                    format!("listener[{i}].address"),
                    format!("{} is already used by another listener", cfg.address),
                ));
            }
            out.push(cfg);
        }
        for (i, l) in ls.get_ref().iter().enumerate() {
            out[i].ipv6_only = self.ipv6_only(i, l, &out)?;
        }
        Ok(out)
    }

    /// `ipv6_only` of listener `i` (see [`ListenerConfig::ipv6_only`]): only on an IPv6
    /// address; `false` on `[::]` refused where another listener binds `0.0.0.0` on its port.
    fn ipv6_only(
        &self,
        i: usize,
        l: &RawListener,
        all: &[ListenerConfig],
    ) -> Result<bool, ConfigError> {
        let addr = *l.address.get_ref();
        let key = format!("listener[{i}].ipv6_only");
        let v4_beside = addr.port() != 0
            && all.iter().any(|o| {
                o.address.port() == addr.port() && o.address.ip() == std::net::Ipv4Addr::UNSPECIFIED
            });
        match (&l.ipv6_only, addr) {
            (Some(v), SocketAddr::V4(_)) => Err(self.err(
                Some(v.span()),
                key,
                format!("ipv6_only applies to IPv6 addresses, not {addr}"),
            )),
            (Some(v), SocketAddr::V6(a)) if !*v.get_ref() && !a.ip().is_unspecified() => {
                Err(self.err(
                    Some(v.span()),
                    key,
                    format!("ipv6_only = false needs the unspecified address [::], not {addr}"),
                ))
            }
            (Some(v), _) if !*v.get_ref() && v4_beside => Err(self.err(
                Some(v.span()),
                key,
                format!(
                    "[::]:{} with ipv6_only = false would also take IPv4 port {}, which another listener binds on 0.0.0.0",
                    addr.port(),
                    addr.port()
                ),
            )),
            (Some(v), _) => Ok(*v.get_ref()),
            (None, SocketAddr::V6(a)) => Ok(!a.ip().is_unspecified() || v4_beside),
            (None, SocketAddr::V4(_)) => Ok(false),
        }
    }

    /// Validates listener `i` (its TLS, offload, HTTP/2 and redirect).
    /// `quic_retry_threshold` of listener `i` (only with `http3 = true`).
    fn quic_retry_threshold(
        &self,
        i: usize,
        l: &RawListener,
        http3: bool,
    ) -> Result<u32, ConfigError> {
        match &l.quic_retry_threshold {
            None => Ok(DEFAULT_QUIC_RETRY_THRESHOLD),
            Some(t) if http3 => Ok(*t.get_ref()),
            Some(t) => Err(self.err(
                Some(t.span()),
                format!("listener[{i}].quic_retry_threshold"),
                "quic_retry_threshold needs http3 = true on this listener",
            )),
        }
    }

    fn listener(
        &self,
        i: usize,
        l: &RawListener,
        engines: &OffloadConfig,
    ) -> Result<ListenerConfig, ConfigError> {
        let offload = match &l.offload {
            None => None,
            Some(o) => Some(self.listener_offload(i, o, engines, l.tls.is_some())?),
        };
        let keyserver = super::offload::signs_on_keyserver(offload.as_ref(), engines);
        let tls = match &l.tls {
            None => None,
            Some(t) => {
                let key = format!("listener[{i}].tls");
                let tr = t.get_ref();
                match (tr.self_signed, tr.certificates.is_empty()) {
                    (true, true) => Some(TlsConfig::SelfSigned),
                    (true, false) => {
                        return Err(self.err(
                            Some(t.span()),
                            key,
                            "use either `self_signed = true` or `certificates`, not both",
                        ))
                    }
                    (false, true) if self.site_certs => Some(TlsConfig::Certificates(Vec::new())),
                    (false, true) => {
                        return Err(self.err(
                            Some(t.span()),
                            key,
                            "a TLS listener needs `certificates = [{ cert = \"...\", key = \"...\" }]` or `self_signed = true`",
                        ))
                    }
                    (false, false) => {
                        let keyless = if keyserver {
                            Ok(())
                        } else {
                            Err("missing: only a listener whose offload engine is a key server (mode sync or async) may omit the key")
                        };
                        let mut certs = Vec::new();
                        for (j, c) in tr.certificates.iter().enumerate() {
                            certs.push(self.certificate(
                                &format!("{key}.certificates[{j}]"),
                                c,
                                keyless,
                            )?);
                        }
                        Some(TlsConfig::Certificates(certs))
                    }
                }
            }
        };
        let session = match &l.tls {
            Some(t) => self.session(i, t.get_ref(), engines)?,
            None => SessionConfig::default(),
        };
        let client_auth = match l
            .tls
            .as_ref()
            .and_then(|t| t.get_ref().client_auth.as_ref())
        {
            Some(c) => Some(self.client_auth(&format!("listener[{i}].tls.client_auth"), c)?),
            None => None,
        };
        // h2c is not served: an explicit `http2 = true` on a plain listener is a mistake
        if let (Some(h), None) = (&l.http2, &tls) {
            if *h.get_ref() {
                return Err(self.err(
                    Some(h.span()),
                    format!("listener[{i}].http2"),
                    "HTTP/2 needs TLS here (h2c is not served): add [listener.tls] or remove http2",
                ));
            }
        }
        let http2 = l.http2.as_ref().map(|h| *h.get_ref()).unwrap_or(true);
        // HTTP/3 is QUIC, always TLS 1.3: on a plain listener it is a mistake
        let http3 = l.http3.as_ref().is_some_and(|h| *h.get_ref());
        if let (Some(h), None) = (&l.http3, &tls) {
            if *h.get_ref() {
                return Err(self.err(
                    Some(h.span()),
                    format!("listener[{i}].http3"),
                    "HTTP/3 needs TLS: add [listener.tls] or remove http3",
                ));
            }
        }
        Ok(ListenerConfig {
            address: *l.address.get_ref(),
            // set once every listener is known (`ipv6_only`)
            ipv6_only: true,
            http2: http2 && tls.is_some(),
            http3,
            alt_svc_max_age: l
                .alt_svc_max_age
                .as_ref()
                .map_or(DEFAULT_ALT_SVC_MAX_AGE, |m| *m.get_ref()),
            quic_retry_threshold: self.quic_retry_threshold(i, l, http3)?,
            tls,
            offload,
            redirect: match &l.redirect {
                Some(r) => Some(self.redirect(&format!("listener[{i}].redirect"), r)?),
                None => None,
            },
            session,
            proxy_protocol: match &l.proxy_protocol {
                Some(p) => Some(self.proxy_protocol(i, p)?),
                None => None,
            },
            client_auth,
        })
    }

    /// `proxy_protocol` of listener `i`: each `trusted` entry an address or a CIDR block.
    fn proxy_protocol(
        &self,
        i: usize,
        p: &Spanned<super::raw::RawProxyProtocol>,
    ) -> Result<ProxyProtocol, ConfigError> {
        let key = format!("listener[{i}].proxy_protocol.trusted");
        let list = &p.get_ref().trusted;
        if list.get_ref().is_empty() {
            return Err(self.err(
                Some(list.span()),
                key,
                "name the balancers that send PROXY headers (e.g. [\"10.0.0.0/8\"]), or remove proxy_protocol",
            ));
        }
        let mut trusted = Vec::new();
        for (j, e) in list.get_ref().iter().enumerate() {
            let net = super::proxy::parse_cidr(e.get_ref().trim())
                .map_err(|m| self.err(Some(e.span()), format!("{key}[{j}]"), m))?;
            trusted.push(net);
        }
        Ok(ProxyProtocol { trusted })
    }
}

#[cfg(test)]
mod plain_http2 {
    use crate::Config;
    use std::path::Path;

    #[test]
    fn http2_on_a_plain_listener_is_refused_with_its_place() {
        let text = "[[listener]]\naddress = \"127.0.0.1:0\"\nhttp2 = true\n";
        let e = Config::from_str_at(text, Some(Path::new("q.toml")))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("q.toml:3:9") && e.contains("listener[0].http2"),
            "{e}"
        );
        assert!(e.contains("h2c is not served"), "{e}");
        // said false, or left out: fine
        let text = "[[listener]]\naddress = \"127.0.0.1:0\"\nhttp2 = false\n";
        assert!(Config::from_str_at(text, None).is_ok());
    }
}

#[cfg(test)]
mod http3 {
    use crate::Config;
    use std::path::Path;

    #[test]
    fn http3_on_a_plain_listener_is_refused_with_its_place() {
        let text = "[[listener]]\naddress = \"127.0.0.1:0\"\nhttp3 = true\n";
        let e = Config::from_str_at(text, Some(Path::new("q.toml")))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("q.toml:3:9") && e.contains("listener[0].http3"),
            "{e}"
        );
        assert!(e.contains("HTTP/3 needs TLS"), "{e}");
    }

    #[test]
    fn http3_is_off_by_default_and_alt_svc_max_age_defaults_to_a_day() {
        let text = "[[listener]]\naddress = \"127.0.0.1:0\"\ntls = { self_signed = true }\n";
        let c = Config::from_str_at(text, None).unwrap();
        assert!(!c.listeners[0].http3);
        assert_eq!(c.listeners[0].alt_svc_max_age, 86_400);
        let text = "[[listener]]\naddress = \"127.0.0.1:0\"\nhttp3 = true\nalt_svc_max_age = 60\ntls = { self_signed = true }\n";
        let c = Config::from_str_at(text, None).unwrap();
        assert!(c.listeners[0].http3);
        assert_eq!(c.listeners[0].alt_svc_max_age, 60);
        assert_eq!(c.listeners[0].quic_retry_threshold, 128);
    }

    #[test]
    fn quic_retry_threshold_is_read_and_refused_without_http3() {
        let text = "[[listener]]\naddress = \"127.0.0.1:0\"\nhttp3 = true\nquic_retry_threshold = 0\ntls = { self_signed = true }\n";
        let c = Config::from_str_at(text, None).unwrap();
        assert_eq!(c.listeners[0].quic_retry_threshold, 0);
        let text = "[[listener]]\naddress = \"127.0.0.1:0\"\nquic_retry_threshold = 4\ntls = { self_signed = true }\n";
        let e = Config::from_str_at(text, Some(Path::new("q.toml")))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("q.toml:3:24") && e.contains("listener[0].quic_retry_threshold"),
            "{e}"
        );
        assert!(e.contains("needs http3 = true"), "{e}");
    }
}

#[cfg(test)]
mod ipv6_only {
    use crate::Config;

    fn listeners(text: &str) -> Result<Vec<bool>, String> {
        Config::from_str_at(text, None)
            .map(|c| c.listeners.iter().map(|l| l.ipv6_only).collect())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn unspecified_ipv6_is_dual_stack_unless_ipv4_shares_its_port() {
        let l = |a: &str| format!("[[listener]]\naddress = \"{a}\"\n");
        assert_eq!(listeners(&l("[::]:0")), Ok(vec![false]));
        assert_eq!(listeners(&l("[::1]:0")), Ok(vec![true]));
        assert_eq!(listeners(&l("127.0.0.1:0")), Ok(vec![false]));
        assert_eq!(
            listeners(&format!("{}ipv6_only = true\n", l("[::]:0"))),
            Ok(vec![true])
        );
        assert_eq!(
            listeners(&format!("{}{}", l("0.0.0.0:8000"), l("[::]:8000"))),
            Ok(vec![false, true])
        );
        assert_eq!(
            listeners(&format!("{}{}", l("0.0.0.0:8000"), l("[::]:8001"))),
            Ok(vec![false, false])
        );
    }

    #[test]
    fn ipv6_only_where_it_means_nothing_is_refused_by_name() {
        for (text, key) in [
            (
                "[[listener]]\naddress = \"127.0.0.1:0\"\nipv6_only = true\n",
                "listener[0].ipv6_only",
            ),
            (
                "[[listener]]\naddress = \"[::1]:0\"\nipv6_only = false\n",
                "listener[0].ipv6_only",
            ),
            (
                "[[listener]]\naddress = \"0.0.0.0:8000\"\n[[listener]]\naddress = \"[::]:8000\"\nipv6_only = false\n",
                "listener[1].ipv6_only",
            ),
        ] {
            let err = listeners(text).expect_err(text);
            assert!(err.contains(key), "{text}: {err}");
        }
    }
}

#[cfg(test)]
mod proxy_protocol {
    use crate::Config;
    use std::path::Path;

    fn err(text: &str) -> String {
        Config::from_str_at(text, Some(Path::new("q.toml")))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn trusted_balancers_are_read_and_bad_values_named_by_key() {
        let text = "[[listener]]\naddress = \"127.0.0.1:0\"\nproxy_protocol = { trusted = [\"10.0.0.0/8\", \"127.0.0.1\"] }\n";
        let c = Config::from_str_at(text, None).unwrap();
        let p = c.listeners[0].proxy_protocol.as_ref().unwrap();
        assert_eq!(p.trusted.len(), 2);
        for (a, ok) in [
            ("10.1.2.3", true),
            ("127.0.0.1", true),
            ("::ffff:127.0.0.1", true),
            ("127.0.0.2", false),
        ] {
            assert_eq!(p.trusts(a.parse().unwrap()), ok, "{a}");
        }
        assert!(
            Config::from_str_at("[[listener]]\naddress = \"127.0.0.1:0\"\n", None)
                .unwrap()
                .listeners[0]
                .proxy_protocol
                .is_none()
        );
        let e = err("[[listener]]\naddress = \"127.0.0.1:0\"\nproxy_protocol = { trusted = [\"10.0.0.0/8\", \"10.0.0.0/33\"] }\n");
        assert!(e.contains("listener[0].proxy_protocol.trusted[1]"), "{e}");
        assert!(e.contains("q.toml:3:"), "{e}");
        let e = err("[[listener]]\naddress = \"127.0.0.1:0\"\nproxy_protocol = { trusted = [] }\n");
        assert!(e.contains("listener[0].proxy_protocol.trusted"), "{e}");
        let e = err("[[listener]]\naddress = \"127.0.0.1:0\"\nproxy_protocol = { trusted = \"10.0.0.0/8\" }\n");
        assert!(e.contains("trusted"), "{e}");
        let e = err("[[listener]]\naddress = \"127.0.0.1:0\"\nproxy_protocol = { trust = [\"10.0.0.0/8\"] }\n");
        assert!(e.contains("trust"), "{e}");
    }

    #[test]
    fn connections_per_client_defaults_to_unlimited_and_must_be_a_number() {
        let c = Config::from_str_at("", None).unwrap();
        assert_eq!(c.limits.connections_per_client, 0);
        let c = Config::from_str_at("[limits]\nconnections_per_client = 16\n", None).unwrap();
        assert_eq!(c.limits.connections_per_client, 16);
        for bad in ["\"many\"", "-1", "1.5", "99999999999"] {
            let e = err(&format!("[limits]\nconnections_per_client = {bad}\n"));
            assert!(e.contains("connections_per_client"), "{bad}: {e}");
        }
    }
}

#[cfg(test)]
mod upstream_proxy_protocol {
    use crate::{Config, RouteAction, UpstreamProxyProtocol};

    fn route(extra: &str) -> Result<Option<UpstreamProxyProtocol>, String> {
        let text = format!("[[route]]\nprefix = \"/\"\n{extra}");
        let c = Config::from_str_at(&text, None).map_err(|e| e.to_string())?;
        match &c.routes[0].action {
            RouteAction::Proxy(p) => Ok(p.upstream_proxy_protocol),
            _ => Err("not a proxy route".into()),
        }
    }

    #[test]
    fn versions_are_read_and_http2_upstreams_refused_by_key() {
        let up = "upstreams = [\"127.0.0.1:9\"]\n";
        assert_eq!(route(up), Ok(None));
        assert_eq!(
            route(&format!("{up}upstream_proxy_protocol = \"v2\"\n")),
            Ok(Some(UpstreamProxyProtocol::V2))
        );
        assert_eq!(
            route(&format!("{up}upstream_proxy_protocol = \"v1\"\n")),
            Ok(Some(UpstreamProxyProtocol::V1))
        );
        for bad in [
            format!("{up}upstream_proxy_protocol = \"v3\"\n"),
            "upstreams = [\"h2c://127.0.0.1:9\"]\nupstream_proxy_protocol = \"v2\"\n".into(),
            "root = \"/srv\"\nupstream_proxy_protocol = \"v2\"\n".into(),
        ] {
            let e = route(&bad).unwrap_err();
            assert!(e.contains("upstream_proxy_protocol"), "{bad}: {e}");
        }
    }
}
