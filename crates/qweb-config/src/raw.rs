//! The configuration file as written: serde types that mirror the TOML, before validation.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;
use toml::Spanned;

use super::units::{Dur, Size};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    pub workers: Option<Spanned<Workers>>,
    pub state_dir: Option<Spanned<PathBuf>>,
    pub shutdown_timeout: Option<Dur>,
    pub upgrade_drain_timeout: Option<Dur>,
    #[serde(default)]
    pub limits: RawLimits,
    #[serde(default)]
    pub log: RawLog,
    #[serde(default, rename = "listener")]
    pub listeners: Option<Spanned<Vec<RawListener>>>,
    #[serde(default, rename = "route")]
    pub routes: Vec<Spanned<RawRoute>>,
    #[serde(default)]
    pub offload: RawOffload,
    pub admin: Option<RawAdmin>,
    pub compression: Option<Spanned<super::compression::RawCompression>>,
    #[serde(default)]
    pub file_cache: super::file_cache::RawFileCache,
    #[serde(default)]
    pub cache: super::cache::RawCache,
    pub fleet: Option<super::fleet::RawFleet>,
    #[serde(default, rename = "site")]
    pub sites: Vec<Spanned<RawSite>>,
    pub rewrite: Option<Spanned<Vec<RawRewrite>>>,
    pub error_pages: Option<Spanned<std::collections::BTreeMap<String, String>>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawOffload {
    pub batch: Option<bool>,
    pub batch_max: Option<usize>,
    pub max_jobs_per_worker: Option<usize>,
    #[serde(default)]
    pub engines: std::collections::BTreeMap<String, Spanned<RawEngine>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawEngine {
    pub kind: Spanned<String>,
    pub threads: Option<usize>,
    pub queue: Option<usize>,
    pub added_latency: Option<Dur>,
    pub inject_failures: Option<bool>,
    pub servers: Option<Spanned<Vec<Spanned<String>>>>,
    pub connections: Option<usize>,
    pub timeout: Option<Dur>,
    pub client_cert: Option<Spanned<PathBuf>>,
    pub client_key: Option<Spanned<PathBuf>>,
    pub server_ca: Option<Spanned<PathBuf>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAdmin {
    pub address: Spanned<SocketAddr>,
    pub max_connections: Option<usize>,
    pub connections_per_client: Option<usize>,
    pub header_timeout: Option<Dur>,
    pub idle_timeout: Option<Dur>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawListenerOffload {
    pub engine: Spanned<String>,
    pub mode: Option<Spanned<String>>,
    pub fallback: Option<Spanned<String>>,
    pub timeout: Option<Dur>,
}

/// `workers = "auto"` or a positive integer.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Workers {
    Auto,
    Count(usize),
}

impl<'de> Deserialize<'de> for Workers {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Workers;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("\"auto\" or a number of workers from 1 to 1024")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Workers, E> {
                match v {
                    1..=1024 => Ok(Workers::Count(v as usize)),
                    _ => Err(E::custom(format!(
                        "workers must be \"auto\" or 1..=1024, not {v}"
                    ))),
                }
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Workers, E> {
                match v {
                    "auto" => Ok(Workers::Auto),
                    // `workers = "${WORKERS}"` with a number in the variable
                    _ if v.parse::<i64>().is_ok() => self.visit_i64(v.parse().unwrap_or(0)),
                    _ => Err(E::custom(format!(
                        "workers must be \"auto\" or 1..=1024, not \"{v}\""
                    ))),
                }
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLimits {
    pub max_request_header_size: Option<Size>,
    pub header_read_timeout: Option<Dur>,
    pub keepalive_timeout: Option<Dur>,
    pub tls_handshake_timeout: Option<Dur>,
    pub max_connections_per_worker: Option<usize>,
    pub max_concurrent_streams: Option<u32>,
    pub send_timeout: Option<Dur>,
    pub h2_control_frames_per_second: Option<u32>,
    pub write_burst: Option<Size>,
    pub connections_per_client: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLog {
    pub access: Option<bool>,
    pub level: Option<Spanned<String>>,
    pub access_file: Option<Spanned<String>>,
    pub format: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawListener {
    pub address: Spanned<SocketAddr>,
    pub ipv6_only: Option<Spanned<bool>>,
    pub http2: Option<Spanned<bool>>,
    pub http3: Option<Spanned<bool>>,
    pub alt_svc_max_age: Option<Spanned<u64>>,
    pub quic_retry_threshold: Option<Spanned<u32>>,
    pub tls: Option<Spanned<RawTls>>,
    pub offload: Option<Spanned<RawListenerOffload>>,
    pub redirect: Option<Spanned<RawRedirect>>,
    pub proxy_protocol: Option<Spanned<RawProxyProtocol>>,
}

/// `proxy_protocol = { trusted = [...] }` on a listener.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawProxyProtocol {
    pub trusted: Spanned<Vec<Spanned<String>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTls {
    #[serde(default)]
    pub self_signed: bool,
    #[serde(default)]
    pub certificates: Vec<RawCertificate>,
    // session resumption (validated in config/tls.rs)
    pub resumption: Option<bool>,
    pub session_cache: Option<Spanned<usize>>,
    pub ticket_rotation: Option<Spanned<Dur>>,
    pub ticket_keys: Option<Spanned<String>>,
    // client certificates (validated in config/tls.rs)
    pub client_auth: Option<Spanned<RawClientAuth>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawClientAuth {
    pub ca: Spanned<PathBuf>,
    pub required: Option<bool>,
    pub names: Option<Spanned<Vec<Spanned<String>>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCertificate {
    pub cert: Spanned<PathBuf>,
    pub key: Option<Spanned<PathBuf>>,
    pub ocsp: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRoute {
    pub prefix: Spanned<String>,
    pub root: Option<Spanned<PathBuf>>,
    pub index: Option<String>,
    pub symlinks: Option<Spanned<String>>,
    pub upstreams: Option<Spanned<Vec<Spanned<String>>>>,
    pub strip_prefix: Option<bool>,
    pub connect_timeout: Option<Dur>,
    pub timeout: Option<Dur>,
    pub keepalive: Option<usize>,
    pub client_body_timeout: Option<Dur>,
    pub pass_raw_path: Option<bool>,
    pub underscores_in_headers: Option<bool>,
    pub trusted_proxies: Option<Vec<Spanned<String>>>,
    pub allow: Option<Vec<Spanned<String>>>,
    pub deny: Option<Vec<Spanned<String>>>,
    pub rate_limit: Option<Spanned<super::rate_limit::RawRateLimit>>,
    pub forward_auth: Option<Spanned<super::forward_auth::RawForwardAuth>>,
    pub basic_auth: Option<Spanned<super::basic_auth::RawBasicAuth>>,
    pub max_response_header_size: Option<Spanned<Size>>,
    pub headers: Option<Spanned<RawHeaderEdits>>,
    pub request_headers: Option<Spanned<RawHeaderEdits>>,
    pub expires: Option<Spanned<std::collections::BTreeMap<String, Dur>>>,
    pub redirect: Option<Spanned<RawRedirect>>,
    pub try_files: Option<Spanned<Vec<String>>>,
    pub charset: Option<Spanned<String>>,
    pub autoindex: Option<Spanned<bool>>,
    pub upgrade: Option<Spanned<Vec<Spanned<String>>>>,
    pub upgrade_idle_timeout: Option<Spanned<Dur>>,
    pub max_body_size: Option<Spanned<Size>>,
    pub buffer_request_body: Option<bool>,
    pub upstream_ca: Option<Spanned<PathBuf>>,
    pub upstream_server_name: Option<Spanned<String>>,
    pub upstream_proxy_protocol: Option<Spanned<String>>,
    pub upstream_client_cert: Option<Spanned<PathBuf>>,
    pub upstream_client_key: Option<Spanned<PathBuf>>,
    pub balance: Option<Spanned<String>>,
    pub hash_key: Option<Spanned<String>>,
    pub weights: Option<Spanned<Vec<Spanned<u32>>>>,
    pub max_fails: Option<u32>,
    pub fail_timeout: Option<Spanned<Dur>>,
    pub health_check: Option<Spanned<RawHealthCheck>>,
    pub upstream_http2: Option<Spanned<bool>>,
    pub cache: Option<Spanned<super::cache::RawRouteCache>>,
}

/// `[[site]]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSite {
    pub server_names: Option<Spanned<Vec<Spanned<String>>>>,
    pub default: Option<Spanned<bool>>,
    #[serde(default)]
    pub certificates: Vec<RawCertificate>,
    pub acme: Option<Spanned<super::acme::RawAcme>>,
    pub allow: Option<Vec<Spanned<String>>>,
    pub deny: Option<Vec<Spanned<String>>>,
    pub basic_auth: Option<Spanned<super::basic_auth::RawBasicAuth>>,
    #[serde(default, rename = "route")]
    pub routes: Vec<Spanned<RawRoute>>,
    pub headers: Option<Spanned<RawHeaderEdits>>,
    pub request_headers: Option<Spanned<RawHeaderEdits>>,
    pub rewrite: Option<Spanned<Vec<RawRewrite>>>,
    pub error_pages: Option<Spanned<std::collections::BTreeMap<String, String>>>,
    pub charset: Option<Spanned<String>>,
    // client certificates of the site's own TLS (validated in config/tls.rs)
    pub client_auth: Option<Spanned<RawClientAuth>>,
}

/// `rewrite = [{ from = "^/old/(.*)$", to = "/new/$1" }]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRewrite {
    pub from: String,
    pub to: String,
}

/// `headers = { set = {...}, add = {...}, remove = [...] }` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHeaderEdits {
    #[serde(default)]
    pub set: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub add: std::collections::BTreeMap<String, OneOrMany>,
    #[serde(default)]
    pub remove: Vec<String>,
}

/// A value or a list of values (`add = { Link = ["<a>", "<b>"] }`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// `redirect = { to = "https://{host}{uri}", status = 308 }` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRedirect {
    pub to: String,
    pub status: Option<u16>,
}

/// `health_check` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHealthCheck {
    pub path: Spanned<String>,
    pub interval: Option<Spanned<Dur>>,
    pub expect: Option<Spanned<u16>>,
    pub timeout: Option<Spanned<Dur>>,
}
