//! `allow` and `deny` on a route or a site (issue 39): which client addresses may be served,
//! checked after routing (the route is chosen on the path as an upstream acts on it, see
//! docs/RELIABILITY.md) and before anything else of the route runs.

use std::net::IpAddr;

use ipnet::IpNet;
use toml::Spanned;

use super::{ConfigError, Validator};

/// Client address rules: `deny` wins over `allow`; an empty `allow` lets every address not
/// denied in. The address is the client's as qweb sees it (an IPv4 client of a dual-stack
/// socket as `a.b.c.d`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessRules {
    /// Addresses and blocks served (`allow = ["10.0.0.0/8", "::1"]`); empty: all.
    pub allow: Vec<IpNet>,
    /// Addresses and blocks refused with 403, whatever `allow` says.
    pub deny: Vec<IpNet>,
}

impl AccessRules {
    /// No rule: every address passes (and nothing is checked).
    pub fn is_empty(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }

    /// May `ip` be served? An IPv4-mapped IPv6 address is judged as the IPv4 one.
    #[inline]
    pub fn permits(&self, ip: IpAddr) -> bool {
        if self.deny.is_empty() && self.allow.is_empty() {
            return true;
        }
        let ip = ip.to_canonical();
        !self.deny.iter().any(|n| n.contains(&ip))
            && (self.allow.is_empty() || self.allow.iter().any(|n| n.contains(&ip)))
    }
}

impl Validator<'_> {
    /// `allow` and `deny` of `key` (a route's or a site's): each entry an address or a CIDR
    /// block, named by its index when it is not one.
    pub(super) fn access(
        &self,
        key: &str,
        allow: Option<&Vec<Spanned<String>>>,
        deny: Option<&Vec<Spanned<String>>>,
    ) -> Result<AccessRules, ConfigError> {
        let list = |name: &str, l: Option<&Vec<Spanned<String>>>| {
            let mut out = Vec::new();
            for (j, e) in l.into_iter().flatten().enumerate() {
                let net = super::proxy::parse_cidr(e.get_ref().trim())
                    .map_err(|m| self.err(Some(e.span()), format!("{key}.{name}[{j}]"), m))?;
                out.push(net);
            }
            Ok::<_, ConfigError>(out)
        };
        Ok(AccessRules {
            allow: list("allow", allow)?,
            deny: list("deny", deny)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deny_wins_and_an_empty_allow_lets_all_in() {
        let net = |s: &str| s.parse::<IpNet>().unwrap();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let open = AccessRules::default();
        assert!(open.is_empty() && open.permits(ip("203.0.113.9")));
        let office = AccessRules {
            allow: vec![net("10.0.0.0/8"), net("::1/128")],
            deny: vec![net("10.9.0.0/16")],
        };
        for (a, ok) in [
            ("10.1.2.3", true),
            ("::1", true),
            ("::ffff:10.1.2.3", true),
            ("10.9.1.1", false),
            ("::ffff:10.9.1.1", false),
            ("192.168.1.1", false),
            ("::2", false),
        ] {
            assert_eq!(office.permits(ip(a)), ok, "{a}");
        }
        let deny_only = AccessRules {
            allow: vec![],
            deny: vec![net("192.0.2.0/24")],
        };
        assert!(!deny_only.permits(ip("192.0.2.7")) && deny_only.permits(ip("192.0.3.7")));
    }
}
