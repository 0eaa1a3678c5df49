//! `[fleet]`: the store the nodes of a fleet share (Redis), this node's name in it and the
//! prefix of every key qweb writes there (see the server's `runtime::fleet`).

use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::units::Dur;
use super::{ConfigError, Validator};

/// Default `key_prefix`: every key and channel qweb uses starts with it.
pub const DEFAULT_FLEET_KEY_PREFIX: &str = "qweb:";
/// Default `timeout`: the longest wait for one answer of the store (a heartbeat, a publish,
/// a scan step), and for a connection to it.
pub const DEFAULT_FLEET_TIMEOUT: Duration = Duration::from_secs(1);
/// Largest `timeout`.
pub const MAX_FLEET_TIMEOUT: Duration = Duration::from_secs(30);

/// `[fleet]`: the shared store and this node's place in it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FleetConfig {
    /// The store's URL: `redis://[USER[:PASSWORD]@]HOST[:PORT][/DB]`, or `rediss://` (TLS).
    pub store: String,
    /// This node's name in the fleet (default: the host name).
    pub node_name: String,
    /// The prefix of every key and channel qweb uses (default [`DEFAULT_FLEET_KEY_PREFIX`]).
    pub key_prefix: String,
    /// The longest wait for one answer of the store or for a connection to it (default
    /// [`DEFAULT_FLEET_TIMEOUT`]).
    pub timeout: Duration,
    /// `secret`: what the key material the nodes put in the store is encrypted with (its
    /// bytes, from 64 or more hex characters); `None`: no key material goes through the store.
    pub secret: Option<FleetSecret>,
}

/// The fleet's secret: at least 32 bytes, written as hex (`openssl rand -hex 32`). Shown
/// as `***`, wiped when dropped.
#[derive(Clone, PartialEq, Eq)]
pub struct FleetSecret(zeroize::Zeroizing<Vec<u8>>);

impl FleetSecret {
    /// Fewest bytes of a secret.
    pub const MIN_LEN: usize = 32;

    /// The secret written in hex (at least [`Self::MIN_LEN`] bytes), or why not.
    pub fn from_hex(text: &str) -> Result<FleetSecret, &'static str> {
        let t = text.trim().as_bytes();
        if !t.len().is_multiple_of(2) || t.len() < 2 * Self::MIN_LEN {
            return Err("64 or more hex characters (32 bytes or more: `openssl rand -hex 32`)");
        }
        let nibble = |c: u8| (c as char).to_digit(16);
        let mut out = zeroize::Zeroizing::new(Vec::with_capacity(t.len() / 2));
        for pair in t.chunks_exact(2) {
            match (nibble(pair[0]), nibble(pair[1])) {
                (Some(h), Some(l)) => out.push((h * 16 + l) as u8),
                _ => return Err("hex characters only (0-9, a-f)"),
            }
        }
        Ok(FleetSecret(out))
    }

    /// The secret's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for FleetSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

impl FleetConfig {
    /// A fleet on `store` named `node_name`, with the default prefix and timeout.
    pub fn new(store: impl Into<String>, node_name: impl Into<String>) -> FleetConfig {
        FleetConfig {
            store: store.into(),
            node_name: node_name.into(),
            key_prefix: DEFAULT_FLEET_KEY_PREFIX.to_owned(),
            timeout: DEFAULT_FLEET_TIMEOUT,
            secret: None,
        }
    }

    /// The store's URL with its password (if any) replaced by `***`, for logs and pages.
    pub fn store_redacted(&self) -> String {
        redact(&self.store)
    }
}

/// `[fleet]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFleet {
    pub store: Spanned<String>,
    pub node_name: Option<Spanned<String>>,
    pub key_prefix: Option<Spanned<String>>,
    pub timeout: Option<Dur>,
    pub secret: Option<Spanned<String>>,
}

/// The host name (`/proc/sys/kernel/hostname`, then `$HOSTNAME`), else `qweb-PID`.
pub fn default_node_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| format!("qweb-{}", std::process::id()))
}

fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((user, host)) => match user.split_once(':') {
            Some((name, _)) => format!("{scheme}://{name}:***@{host}{tail}"),
            None => format!("{scheme}://{user}@{host}{tail}"),
        },
        None => url.to_owned(),
    }
}

/// Why a store URL is refused, if it is.
fn check_store(url: &str) -> Result<(), &'static str> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err("a URL: redis://HOST:PORT/DB or rediss://HOST:PORT/DB");
    };
    if scheme != "redis" && scheme != "rediss" {
        return Err("the scheme is redis:// or rediss://");
    }
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = if let Some(v6) = host_port.strip_prefix('[') {
        match v6.split_once(']') {
            Some((h, p)) => (h, p.strip_prefix(':')),
            None => return Err("an IPv6 host is written [ADDRESS]"),
        }
    } else {
        match host_port.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (host_port, None),
        }
    };
    if host.is_empty() {
        return Err("the URL names a host: redis://HOST:PORT/DB");
    }
    if let Some(p) = port {
        if p.parse::<u16>().map_or(true, |p| p == 0) {
            return Err("the port is a number from 1 to 65535");
        }
    }
    let db = path.trim_start_matches('/');
    let db = db.split_once('?').map_or(db, |(d, _)| d);
    if !db.is_empty() && db.parse::<u32>().is_err() {
        return Err("the path is a database number: redis://HOST:PORT/DB");
    }
    Ok(())
}

impl Validator<'_> {
    pub(super) fn fleet(&self, raw: Option<&RawFleet>) -> Result<Option<FleetConfig>, ConfigError> {
        let Some(raw) = raw else {
            return Ok(None);
        };
        let store = raw.store.get_ref().trim().to_owned();
        check_store(&store).map_err(|m| self.err(Some(raw.store.span()), "fleet.store", m))?;
        let node_name = match &raw.node_name {
            Some(n) => {
                let name = n.get_ref().trim();
                if name.is_empty() {
                    return Err(self.err(Some(n.span()), "fleet.node_name", "must not be empty"));
                }
                if name.len() > 255 || name.chars().any(|c| c.is_control() || c == ' ') {
                    return Err(self.err(
                        Some(n.span()),
                        "fleet.node_name",
                        "at most 255 characters, without spaces or control characters",
                    ));
                }
                name.to_owned()
            }
            None => default_node_name(),
        };
        let key_prefix = match &raw.key_prefix {
            Some(p) => {
                if p.get_ref().len() > 128 || p.get_ref().chars().any(|c| c.is_control()) {
                    return Err(self.err(
                        Some(p.span()),
                        "fleet.key_prefix",
                        "at most 128 characters, without control characters",
                    ));
                }
                p.get_ref().clone()
            }
            None => DEFAULT_FLEET_KEY_PREFIX.to_owned(),
        };
        let timeout = raw.timeout.map_or(DEFAULT_FLEET_TIMEOUT, |d| d.0);
        if timeout.is_zero() || timeout > MAX_FLEET_TIMEOUT {
            return Err(self.err(
                self.span_of_key("fleet.timeout"),
                "fleet.timeout",
                "must be between 1ms and 30s",
            ));
        }
        let secret = match &raw.secret {
            Some(s) => Some(
                FleetSecret::from_hex(s.get_ref())
                    .map_err(|m| self.err(Some(s.span()), "fleet.secret", m))?,
            ),
            None => None,
        };
        Ok(Some(FleetConfig {
            store,
            node_name,
            key_prefix,
            timeout,
            secret,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn a_password_is_not_shown() {
        assert_eq!(
            redact("redis://u:secret@h:6379/0"),
            "redis://u:***@h:6379/0"
        );
        assert_eq!(redact("redis://h:6379/0"), "redis://h:6379/0");
        assert_eq!(redact("rediss://u@h/1"), "rediss://u@h/1");
    }
}
