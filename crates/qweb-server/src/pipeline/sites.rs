//! Site selection: which `[[site]]` answers a request, by its `Host`/`:authority` (without
//! the port), and whether a TLS connection may carry it (421 Misdirected Request when the
//! Host names another site than the SNI did and the two share no certificate).

use std::collections::HashMap;
use std::path::PathBuf;

use crate::config::{ErrorPages, HeaderEdits, RewriteRule, SitesConfig};
use crate::pipeline::routes::Route;

/// A site on this worker.
pub(crate) struct Site {
    /// Longest prefix first.
    pub routes: Vec<Route>,
    /// Its certificate files (empty: the listener's).
    certs: Vec<PathBuf>,
    /// Path rewrites before routing.
    rewrite: Vec<RewriteRule>,
    /// Error pages.
    error_pages: ErrorPages,
    /// `charset` for text responses.
    pub charset: Option<String>,
    /// Response header edits (before the route's).
    pub headers: HeaderEdits,
    /// Edits of forwarded requests (before the route's).
    pub request_headers: HeaderEdits,
    /// `allow`/`deny` (before the route's).
    pub access: crate::config::AccessRules,
    /// `basic_auth` of the routes without their own.
    pub basic_auth: Option<crate::config::BasicAuth>,
    /// It has a `client_auth` policy of its own.
    own_client_auth: bool,
}

/// Which site answers: `None` is the top-level routes.
pub(crate) type SiteId = Option<usize>;

/// The sites of one worker and their name tables.
#[derive(Default)]
pub(crate) struct Sites {
    list: Vec<Site>,
    exact: HashMap<String, usize>,
    /// `*.example.com` stored as `example.com`.
    wildcard: HashMap<String, usize>,
    default: SiteId,
    /// The top-level `rewrite` rules.
    top_rewrite: Vec<RewriteRule>,
    /// The top-level `error_pages`.
    top_error_pages: ErrorPages,
}

impl Sites {
    /// Opens every site's routes (static roots, upstream pools) for this worker.
    pub(crate) fn new(
        cfg: &SitesConfig,
        registry: &qweb_observe::metrics::Metrics,
    ) -> std::io::Result<Self> {
        let mut sites = Sites {
            default: cfg.default,
            top_rewrite: cfg.rewrite.clone(),
            top_error_pages: cfg.error_pages.clone(),
            ..Sites::default()
        };
        for (i, s) in cfg.sites.iter().enumerate() {
            // `/metrics` labels a site's routes with its first name: `example.com/api`
            let label = s.server_names.first().map_or("", String::as_str);
            let routes = s
                .routes
                .iter()
                .map(|r| {
                    crate::pipeline::routes::build_route(r, registry, label, s.basic_auth.is_some())
                })
                .collect::<std::io::Result<Vec<_>>>()?;
            for n in &s.server_names {
                match n.strip_prefix("*.") {
                    Some(parent) => sites.wildcard.insert(parent.to_owned(), i),
                    None => sites.exact.insert(n.clone(), i),
                };
            }
            sites.list.push(Site {
                charset: s.charset.clone(),
                error_pages: s.error_pages.clone(),
                rewrite: s.rewrite.clone(),
                routes,
                headers: s.headers.clone(),
                request_headers: s.request_headers.clone(),
                access: s.access.clone(),
                basic_auth: s.basic_auth.clone(),
                certs: s.certificates.iter().map(|c| c.cert.clone()).collect(),
                own_client_auth: s.client_auth.is_some(),
            });
        }
        Ok(sites)
    }

    /// The site for a `Host` value or SNI name (port, case and a trailing dot ignored);
    /// unknown and absent names get the default site.
    pub(crate) fn select(&self, host: Option<&[u8]>) -> SiteId {
        if self.list.is_empty() {
            return None;
        }
        let Some(name) = host.and_then(host_name) else {
            return self.default;
        };
        if let Some(&i) = self.exact.get(&name) {
            return Some(i);
        }
        if let Some((_, parent)) = name.split_once('.') {
            if let Some(&i) = self.wildcard.get(parent) {
                return Some(i);
            }
        }
        self.default
    }

    /// The routes of `site` (`top`: the top-level routes).
    /// Every site's routes.
    pub(crate) fn all_routes(&self) -> impl Iterator<Item = &Route> {
        self.list.iter().flat_map(|s| s.routes.iter())
    }

    pub(crate) fn routes<'a>(&'a self, site: SiteId, top: &'a [Route]) -> &'a [Route] {
        match site.and_then(|i| self.list.get(i)) {
            Some(s) => &s.routes,
            None => top,
        }
    }

    /// The rewrite rules of `site`.
    pub(crate) fn rewrites(&self, site: SiteId) -> &[RewriteRule] {
        match site.and_then(|i| self.list.get(i)) {
            Some(s) => &s.rewrite,
            None => &self.top_rewrite,
        }
    }

    /// The error pages of `site`.
    pub(crate) fn error_pages(&self, site: SiteId) -> &ErrorPages {
        match site.and_then(|i| self.list.get(i)) {
            Some(s) => &s.error_pages,
            None => &self.top_error_pages,
        }
    }

    /// The site itself (`None`: the top-level routes, which have no site settings).
    pub(crate) fn get(&self, site: SiteId) -> Option<&Site> {
        site.and_then(|i| self.list.get(i))
    }

    /// A request for `host_site` arrived on a connection whose handshake ran with the
    /// `client_auth` policy of site `policy_site` (`None`: the listener's, or plain HTTP): is
    /// it misdirected? When the request's site has a policy of its own and the handshake did
    /// not run with it, or the handshake ran with a site's policy and the request is for
    /// another site: a request is answered only under the policy of its site.
    pub(crate) fn policy_mismatch(&self, policy_site: Option<usize>, host_site: SiteId) -> bool {
        let own = host_site.filter(|&i| self.list.get(i).is_some_and(|s| s.own_client_auth));
        own != policy_site
    }

    /// A request for `host_site` arrived on a TLS connection whose client asked (by SNI) for
    /// `sni`: is it misdirected? Only when the names select different sites that share no
    /// certificate file (sites without certificates share the listener's).
    pub(crate) fn misdirected(&self, sni: &str, host_site: SiteId) -> bool {
        let sni_site = self.select(Some(sni.as_bytes()));
        if sni_site == host_site {
            return false;
        }
        let certs = |s: SiteId| -> &[PathBuf] {
            s.and_then(|i| self.list.get(i))
                .map_or(&[], |s| s.certs.as_slice())
        };
        let (a, b) = (certs(sni_site), certs(host_site));
        let shared = match (a.is_empty(), b.is_empty()) {
            (true, true) => true,
            (false, false) => a.iter().any(|c| b.contains(c)),
            _ => false,
        };
        !shared
    }
}

/// What names the request's site: the target's authority (HTTP/2 `:authority`, HTTP/1
/// absolute-form), else `Host`.
pub(crate) fn host_of<B>(req: &http::Request<B>) -> Option<&[u8]> {
    match req.uri().authority() {
        Some(a) if !a.as_str().is_empty() => Some(a.as_str().as_bytes()),
        _ => req.headers().get(http::header::HOST).map(|h| h.as_bytes()),
    }
}

/// The name in a `Host` value: no port, no trailing dot, lower case. `None` for an empty
/// value or one that is not UTF-8.
pub(crate) fn host_name(v: &[u8]) -> Option<String> {
    let s = std::str::from_utf8(v).ok()?;
    let name = if s.starts_with('[') {
        // IP literal: up to and including `]`
        &s[..s.find(']').map_or(s.len(), |i| i + 1)]
    } else {
        s.rsplit_once(':').map_or(s, |(h, _)| h)
    };
    let name = name.trim_end_matches('.');
    (!name.is_empty()).then(|| name.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::host_name;

    #[test]
    fn host_without_port_case_or_dot() {
        assert_eq!(host_name(b"A.Test:8443").as_deref(), Some("a.test"));
        assert_eq!(host_name(b"a.test.").as_deref(), Some("a.test"));
        assert_eq!(host_name(b"[::1]:443").as_deref(), Some("[::1]"));
        assert_eq!(host_name(b"").as_deref(), None);
        assert_eq!(host_name(b":443").as_deref(), None);
        assert_eq!(host_name(b"\xff").as_deref(), None);
    }
}
