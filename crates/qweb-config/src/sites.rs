//! `[[site]]`: virtual hosts. Each site answers for its `server_names` (exact names and
//! `*.example.com` wildcards, matched on `Host`/`:authority` without the port) with its own
//! `[[site.route]]`s; its `certificates` join every TLS listener's SNI table. The top-level
//! `[[route]]`s are the default site (for names no site claims), unless a site says
//! `default = true`; without top-level routes the first site is the default.

use toml::Spanned;

use super::raw::{OneOrMany, RawConfig, RawHeaderEdits, RawRedirect, RawRewrite, RawRoute};
use super::{
    CertificateConfig, ConfigError, ListenerConfig, OffloadConfig, RouteConfig, Validator,
};

/// Longest server name (RFC 1035: 253 characters in text form).
const MAX_NAME: usize = 253;

/// `error_pages = { 404 = "/404.html", "5xx" = "/50x.html" }`: the page served (with the
/// original status) for an error response, exact codes before classes. A page is a path
/// served by one of the site's static routes.
#[derive(Debug, Clone, Default)]
pub struct ErrorPages {
    /// (status or class, page path): `404` or `5` for `5xx`.
    pub pages: Vec<(u16, String)>,
}

impl ErrorPages {
    /// The page for `status`.
    pub fn page(&self, status: u16) -> Option<&str> {
        self.pages
            .iter()
            .find(|(s, _)| *s == status)
            .or_else(|| self.pages.iter().find(|(s, _)| *s == status / 100))
            .map(|(_, p)| p.as_str())
    }
}

/// Longest `rewrite` pattern, and the most memory its compiled form may take.
const MAX_PATTERN: usize = 1024;
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// A path rewrite: the first rule whose `from` matches the normalised path replaces it with
/// `to` (`$1`, `$name` captures; `${name}` is written `$${name}` in the file, since `${` starts
/// an environment variable there), before routing; the result is normalised again.
#[derive(Debug, Clone)]
pub struct RewriteRule {
    /// The pattern.
    pub from: regex::Regex,
    /// The replacement (`regex` syntax: `$1`, `${name}`, `$$`).
    pub to: String,
}

/// Header edits: `remove` first, then `set` (replaces every value), then `add` (appends, so
/// a name may repeat).
#[derive(Debug, Clone, Default)]
pub struct HeaderEdits {
    /// Names and values that replace any present.
    pub set: Vec<(http::HeaderName, http::HeaderValue)>,
    /// Names and values appended.
    pub add: Vec<(http::HeaderName, http::HeaderValue)>,
    /// Names removed.
    pub remove: Vec<http::HeaderName>,
    /// `request_headers` `set` values with placeholders (`{tls_client_subject}`,
    /// `{tls_client_fingerprint}`), built per request; they replace any present too.
    pub set_placeholders: Vec<(http::HeaderName, Vec<ValuePart>)>,
}

/// A piece of a header value with placeholders.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ValuePart {
    /// Text as written.
    Text(String),
    /// `{tls_client_subject}`: the verified client certificate's subject (RFC 4514).
    ClientSubject,
    /// `{tls_client_fingerprint}`: its SHA-256 fingerprint (lower-case hex of the DER).
    ClientFingerprint,
}

/// The placeholders of header values, by what they are written as.
const HEADER_PLACEHOLDERS: &[(&str, ValuePart)] = &[
    ("{tls_client_subject}", ValuePart::ClientSubject),
    ("{tls_client_fingerprint}", ValuePart::ClientFingerprint),
];

/// `v` cut at its placeholders; `None`: it has none.
fn value_parts(v: &str) -> Option<Vec<ValuePart>> {
    let mut parts = Vec::new();
    let mut rest = v;
    while let Some((at, name, part)) = HEADER_PLACEHOLDERS
        .iter()
        .filter_map(|(n, p)| rest.find(n).map(|at| (at, *n, p)))
        .min_by_key(|(at, _, _)| *at)
    {
        if at > 0 {
            parts.push(ValuePart::Text(rest[..at].to_owned()));
        }
        parts.push(part.clone());
        rest = &rest[at + name.len()..];
    }
    if parts.is_empty() {
        return None;
    }
    if !rest.is_empty() {
        parts.push(ValuePart::Text(rest.to_owned()));
    }
    Some(parts)
}

impl HeaderEdits {
    /// Applies the edits to `h` (a response's: there are no placeholders in them).
    pub fn apply(&self, h: &mut http::HeaderMap) {
        self.apply_request(h, None);
    }

    /// Applies the edits to a request forwarded upstream whose connection's client
    /// certificate is `cert`: a value with placeholders replaces the client's header of its
    /// name, and without a certificate the header is removed (absent, not empty).
    pub fn apply_request(&self, h: &mut http::HeaderMap, cert: Option<&qweb_tls::ClientCert>) {
        for n in &self.remove {
            h.remove(n);
        }
        for (n, v) in &self.set {
            h.insert(n.clone(), v.clone());
        }
        for (n, parts) in &self.set_placeholders {
            h.remove(n);
            let Some(c) = cert else { continue };
            let mut v = String::new();
            for p in parts {
                v.push_str(match p {
                    ValuePart::Text(t) => t,
                    ValuePart::ClientSubject => &c.subject,
                    ValuePart::ClientFingerprint => &c.fingerprint,
                });
            }
            // the subject is escaped (no control bytes): only an odd certificate fails here
            if let Ok(v) = http::HeaderValue::from_str(&v) {
                h.insert(n.clone(), v);
            }
        }
        for (n, v) in &self.add {
            h.append(n.clone(), v.clone());
        }
    }

    /// No edits.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
            && self.add.is_empty()
            && self.remove.is_empty()
            && self.set_placeholders.is_empty()
    }
}

/// What a route does around its handler (`headers`, `request_headers`, `expires`).
#[derive(Debug, Clone, Default)]
pub struct RouteRules {
    /// Response header edits (after the site's).
    pub headers: HeaderEdits,
    /// Edits of the request forwarded upstream (proxy routes; after the site's).
    pub request_headers: HeaderEdits,
    /// Static routes: `Cache-Control: max-age` by content type (`"image/*"`, `"text/css"`,
    /// `"*"`), most specific first; only where the response has no `Cache-Control`.
    pub expires: Vec<(String, std::time::Duration)>,
    /// Static routes: the paths tried in turn (`{path}` is the request's), the last answering
    /// whatever it answers.
    pub try_files: Vec<String>,
    /// `charset` added to text responses without one (over the site's).
    pub charset: Option<String>,
    /// Static routes: list directories without an index file.
    pub autoindex: bool,
    /// `allow`/`deny`: the client addresses served (after the site's).
    pub access: super::AccessRules,
    /// `rate_limit`: requests per key, checked before `allow`/`deny`.
    pub rate_limit: Option<super::RateLimit>,
    /// `forward_auth`: an authentication service asked first (after `allow`/`deny`).
    pub forward_auth: Option<super::ForwardAuth>,
    /// `basic_auth`: the credentials asked for, after `allow`/`deny` (over the site's).
    pub basic_auth: Option<super::BasicAuth>,
}

/// A redirect (a route's or a whole listener's).
#[derive(Debug, Clone)]
pub struct RedirectConfig {
    /// The `Location` template: `{host}` (the request's host without port), `{uri}` (the
    /// normalised path and the query), `{path}` (the normalised path: dot segments removed,
    /// `//` merged, so never another host) and `{query}` (`?` and the query, or nothing).
    pub to: String,
    /// 301, 302, 303, 307 or 308.
    pub status: http::StatusCode,
}

/// Headers a rule may not touch: they frame the message or belong to one connection.
const FRAMING: [&str; 9] = [
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "proxy-connection",
    "host",
];

/// The placeholders a redirect's `to` may use.
const PLACEHOLDERS: [&str; 4] = ["host", "uri", "path", "query"];

/// The named sites (`[[site]]`).
#[derive(Debug, Clone, Default)]
pub struct SitesConfig {
    /// Sites in file order.
    pub sites: Vec<SiteConfig>,
    /// The top-level `rewrite` rules (for the top-level routes).
    pub rewrite: Vec<RewriteRule>,
    /// The top-level `error_pages` (for the top-level routes).
    pub error_pages: ErrorPages,
    /// The site that answers names no site claims: `None` is the top-level `[[route]]`s.
    pub default: Option<usize>,
}

/// One site.
#[derive(Debug, Clone)]
pub struct SiteConfig {
    /// Response header edits for every route of the site (before the route's own).
    pub headers: HeaderEdits,
    /// Edits of requests the site's proxy routes forward (before the route's own).
    pub request_headers: HeaderEdits,
    /// Lower-case names without a trailing dot; `*.example.com` matches one label before
    /// `example.com` (not `example.com` itself, not `a.b.example.com`).
    pub server_names: Vec<String>,
    /// The site's own certificates (also offered by SNI on every TLS listener with
    /// `certificates`). Two sites whose lists share a file may answer each other's names on
    /// one connection; sites with none share the listener's.
    pub certificates: Vec<CertificateConfig>,
    /// A certificate for `server_names` ordered and renewed from an ACME CA (offered by SNI
    /// like `certificates`, which a site with `acme` has none of).
    pub acme: Option<super::AcmeConfig>,
    /// Routes, longest prefix first.
    pub routes: Vec<RouteConfig>,
    /// Path rewrites before routing.
    pub rewrite: Vec<RewriteRule>,
    /// Error pages.
    pub error_pages: ErrorPages,
    /// `charset` added to text responses without one (`None`: nothing added).
    pub charset: Option<String>,
    /// `allow`/`deny` for every route of the site (checked before the route's own).
    pub access: super::AccessRules,
    /// `basic_auth` for every route of the site without one of its own.
    pub basic_auth: Option<super::BasicAuth>,
    /// The site's own client-certificate policy (`client_auth`; `None`: the listener's):
    /// handshakes whose SNI names the site use it, and its requests are served only on them.
    pub client_auth: Option<super::ClientAuthConfig>,
}

/// Does the file have a site with certificates or `acme` (then a TLS listener may name
/// none)?
pub(crate) fn any_certificates(raw: &RawConfig) -> bool {
    raw.sites.iter().any(|s| {
        let s = s.get_ref();
        !s.certificates.is_empty() || s.acme.is_some()
    })
}

/// `name` lower-cased and checked: ASCII letters, digits, `-` and `.` in labels of 1 to 63
/// characters, optionally after `*.`; no port.
fn server_name(raw: &str) -> Result<String, String> {
    let name = raw.trim_end_matches('.').to_ascii_lowercase();
    let labels = name.strip_prefix("*.").unwrap_or(&name);
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(format!(
            "`{raw}` is not a server name (1 to {MAX_NAME} characters)"
        ));
    }
    let ok = labels.split('.').all(|l| {
        (1..=63).contains(&l.len())
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    });
    if !ok {
        return Err(format!(
            "`{raw}` is not a server name: use letters, digits, `-` and `.` (IDNs in their \
             xn-- form), a leading `*.` for a wildcard, and no port"
        ));
    }
    if name.starts_with("*.") && !labels.contains('.') {
        return Err(format!(
            "`{raw}`: a wildcard needs at least two labels after `*.` (`*.example.com`)"
        ));
    }
    Ok(name)
}

impl Validator<'_> {
    /// Validates `[[site]]`, and adds the sites' certificates to the TLS listeners that have
    /// `certificates` (the default site's first, so clients without SNI get it).
    pub(super) fn sites(
        &self,
        raw: &RawConfig,
        listeners: &mut [ListenerConfig],
        engines: &OffloadConfig,
    ) -> Result<SitesConfig, ConfigError> {
        let mut out = SitesConfig::default();
        // name -> the key that claimed it
        let mut claimed: std::collections::HashMap<String, String> = Default::default();
        let mut default_key: Option<String> = None;
        for (s, site) in raw.sites.iter().enumerate() {
            let sr = site.get_ref();
            let key = format!("site[{s}]");
            let client_auth = match &sr.client_auth {
                Some(_) if sr.certificates.is_empty() => {
                    return Err(self.err(
                        sr.client_auth.as_ref().map(|c| c.span()),
                        format!("{key}.client_auth"),
                        "a site's client_auth needs the site's own `certificates` (its handshake is chosen by SNI); or set `[listener.tls] client_auth`",
                    ))
                }
                Some(c) => Some(self.client_auth(&format!("{key}.client_auth"), c)?),
                None => None,
            };
            let mut names = Vec::new();
            if let Some(list) = &sr.server_names {
                for (j, n) in list.get_ref().iter().enumerate() {
                    let nkey = format!("{key}.server_names[{j}]");
                    let name = server_name(n.get_ref())
                        .map_err(|m| self.err(Some(n.span()), nkey.clone(), m))?;
                    if let Some(other) = claimed.get(&name) {
                        return Err(self.err(
                            Some(n.span()),
                            nkey,
                            format!("`{name}` is already claimed by {other}"),
                        ));
                    }
                    claimed.insert(name.clone(), nkey);
                    names.push(name);
                }
            }
            if let Some(d) = sr.default.as_ref().filter(|d| *d.get_ref()) {
                let dkey = format!("{key}.default");
                if let Some(other) = &default_key {
                    return Err(self.err(
                        Some(d.span()),
                        dkey,
                        format!("only one site may be the default; {other} already is"),
                    ));
                }
                if !raw.routes.is_empty() {
                    return Err(self.err(
                        Some(d.span()),
                        dkey,
                        "the top-level [[route]]s are the default site; move them into a [[site]] or drop `default = true`",
                    ));
                }
                default_key = Some(dkey);
                out.default = Some(s);
            } else if names.is_empty() {
                return Err(self.err(
                    Some(site.span()),
                    format!("{key}.server_names"),
                    "a site needs `server_names = [\"example.com\", \"*.example.com\"]` (or `default = true`)",
                ));
            }
            let routes = self.site_routes(&key, site)?;
            let acme = match &sr.acme {
                Some(a) => Some(self.acme(
                    &key,
                    a,
                    &names,
                    !sr.certificates.is_empty(),
                    listeners,
                    engines,
                )?),
                None => None,
            };
            let mut certificates = Vec::new();
            for (j, c) in sr.certificates.iter().enumerate() {
                certificates.push(self.certificate(
                    &format!("{key}.certificates[{j}]"),
                    c,
                    Ok(()),
                )?);
            }
            let headers = match &sr.headers {
                Some(h) => self.header_edits(&format!("{key}.headers"), h, false)?,
                None => HeaderEdits::default(),
            };
            let request_headers = match &sr.request_headers {
                Some(h) => self.header_edits(&format!("{key}.request_headers"), h, true)?,
                None => HeaderEdits::default(),
            };
            let rewrite = match &sr.rewrite {
                Some(r) => self.rewrite(&format!("{key}.rewrite"), r)?,
                None => Vec::new(),
            };
            let error_pages = match &sr.error_pages {
                Some(p) => self.error_pages(&format!("{key}.error_pages"), p)?,
                None => ErrorPages::default(),
            };
            let charset = match &sr.charset {
                Some(c) => Some(self.charset(&format!("{key}.charset"), c)?),
                None => None,
            };
            let access = self.access(&key, sr.allow.as_ref(), sr.deny.as_ref())?;
            let basic_auth = match &sr.basic_auth {
                Some(b) => Some(self.basic_auth(&key, b)?),
                None => None,
            };
            out.sites.push(SiteConfig {
                access,
                basic_auth,
                charset,
                error_pages,
                rewrite,
                headers,
                request_headers,
                server_names: names,
                certificates,
                acme,
                routes,
                client_auth,
            });
        }
        if let Some(p) = &raw.error_pages {
            out.error_pages = self.error_pages("error_pages", p)?;
        }
        if let Some(r) = &raw.rewrite {
            out.rewrite = self.rewrite("rewrite", r)?;
        }
        if out.default.is_none() && raw.routes.is_empty() && !out.sites.is_empty() {
            out.default = Some(0);
        }
        self.add_site_certificates(raw, &out, listeners, engines)?;
        Ok(out)
    }

    /// Validates header edits under `key`.
    /// `request`: edits of requests forwarded upstream, whose `set` values may hold
    /// placeholders.
    pub(super) fn header_edits(
        &self,
        key: &str,
        raw: &Spanned<RawHeaderEdits>,
        request: bool,
    ) -> Result<HeaderEdits, ConfigError> {
        let r = raw.get_ref();
        let span = || Some(raw.span());
        let name = |part: &str, n: &str| -> Result<http::HeaderName, ConfigError> {
            let k = format!("{key}.{part}");
            let hn = http::HeaderName::from_bytes(n.as_bytes())
                .map_err(|_| self.err(span(), k.clone(), format!("`{n}` is not a header name")))?;
            if FRAMING.contains(&hn.as_str()) {
                return Err(self.err(
                    span(),
                    k,
                    format!("`{n}` frames the message or belongs to the connection: qweb sets it"),
                ));
            }
            Ok(hn)
        };
        let value = |part: &str, n: &str, v: &str| -> Result<http::HeaderValue, ConfigError> {
            http::HeaderValue::from_str(v).map_err(|_| {
                self.err(
                    span(),
                    format!("{key}.{part}"),
                    format!("the value for `{n}` is not a header value (control characters?)"),
                )
            })
        };
        let placeholder = |part: &str, n: &str, v: &str| -> Result<(), ConfigError> {
            if value_parts(v).is_none() {
                return Ok(());
            }
            let why = if request {
                "placeholders go in `set`, which replaces a header of that name the client sent (`add` would let the client add its own)"
            } else {
                "placeholders (`{tls_client_subject}`, `{tls_client_fingerprint}`) are for `request_headers`"
            };
            Err(self.err(span(), format!("{key}.{part}"), format!("`{n}`: {why}")))
        };
        let mut out = HeaderEdits::default();
        for (n, v) in &r.set {
            let hn = name("set", n)?;
            let parts = value_parts(v).filter(|_| request);
            match parts {
                Some(parts) => {
                    // checked with the placeholders as written
                    value("set", n, v)?;
                    out.set_placeholders.push((hn, parts));
                }
                None => {
                    placeholder("set", n, v)?;
                    out.set.push((hn, value("set", n, v)?));
                }
            }
        }
        for (n, vs) in &r.add {
            let hn = name("add", n)?;
            let list = match vs {
                OneOrMany::One(v) => std::slice::from_ref(v),
                OneOrMany::Many(v) => v.as_slice(),
            };
            for v in list {
                placeholder("add", n, v)?;
                out.add.push((hn.clone(), value("add", n, v)?));
            }
        }
        for n in &r.remove {
            out.remove.push(name("remove", n)?);
        }
        Ok(out)
    }

    /// Validates a redirect under `key`.
    pub(super) fn redirect(
        &self,
        key: &str,
        raw: &Spanned<RawRedirect>,
    ) -> Result<RedirectConfig, ConfigError> {
        let r = raw.get_ref();
        let status = match r.status.unwrap_or(308) {
            s @ (301 | 302 | 303 | 307 | 308) => {
                http::StatusCode::from_u16(s).unwrap_or(http::StatusCode::PERMANENT_REDIRECT)
            }
            s => {
                return Err(self.err(
                    Some(raw.span()),
                    format!("{key}.status"),
                    format!("{s} is not a redirect status (use 301, 302, 303, 307 or 308)"),
                ))
            }
        };
        let mut rest = r.to.as_str();
        let mut literal = String::new();
        while let Some(open) = rest.find('{') {
            literal.push_str(&rest[..open]);
            let Some(close) = rest[open..].find('}') else {
                return Err(self.err(
                    Some(raw.span()),
                    format!("{key}.to"),
                    "a `{` without its `}`",
                ));
            };
            let name = &rest[open + 1..open + close];
            if !PLACEHOLDERS.contains(&name) {
                return Err(self.err(
                    Some(raw.span()),
                    format!("{key}.to"),
                    format!("unknown placeholder `{{{name}}}` (use {{host}}, {{uri}}, {{path}}, {{query}})"),
                ));
            }
            rest = &rest[open + close + 1..];
        }
        literal.push_str(rest);
        if r.to.is_empty() || http::HeaderValue::from_str(&literal).is_err() {
            return Err(self.err(
                Some(raw.span()),
                format!("{key}.to"),
                "not a Location value (empty, or control characters)",
            ));
        }
        Ok(RedirectConfig {
            to: r.to.clone(),
            status,
        })
    }

    /// Validates a `charset` under `key` (a token, e.g. `utf-8`, `windows-1252`).
    fn charset(&self, key: &str, raw: &Spanned<String>) -> Result<String, ConfigError> {
        let c = raw.get_ref();
        let ok = (1..=40).contains(&c.len())
            && c.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'));
        if !ok {
            return Err(self.err(
                Some(raw.span()),
                key,
                format!("`{c}` is not a charset name (e.g. \"utf-8\")"),
            ));
        }
        Ok(c.to_ascii_lowercase())
    }

    /// Validates `error_pages` under `key`.
    fn error_pages(
        &self,
        key: &str,
        raw: &Spanned<std::collections::BTreeMap<String, String>>,
    ) -> Result<ErrorPages, ConfigError> {
        let mut out = ErrorPages::default();
        for (code, page) in raw.get_ref() {
            let k = format!("{key}.{code}");
            let status = match code.as_str() {
                "4xx" => 4,
                "5xx" => 5,
                c => match c.parse::<u16>() {
                    Ok(n @ 400..=599) => n,
                    _ => {
                        return Err(self.err(
                            Some(raw.span()),
                            k,
                            format!(
                                "`{code}` is not an error status (400 to 599, \"4xx\" or \"5xx\")"
                            ),
                        ))
                    }
                },
            };
            if !page.starts_with('/') || page.contains('?') || page.contains("..") {
                return Err(self.err(
                    Some(raw.span()),
                    k,
                    "an error page is a path served by a static route of the site: `/404.html`",
                ));
            }
            out.pages.push((status, page.clone()));
        }
        Ok(out)
    }

    /// Validates `rewrite` rules under `key`.
    fn rewrite(
        &self,
        key: &str,
        raw: &Spanned<Vec<RawRewrite>>,
    ) -> Result<Vec<RewriteRule>, ConfigError> {
        let mut out = Vec::new();
        for (j, r) in raw.get_ref().iter().enumerate() {
            let k = format!("{key}[{j}]");
            if r.from.len() > MAX_PATTERN {
                return Err(self.err(
                    Some(raw.span()),
                    format!("{k}.from"),
                    format!("longer than {MAX_PATTERN} characters"),
                ));
            }
            let from = regex::RegexBuilder::new(&r.from)
                .size_limit(REGEX_SIZE_LIMIT)
                .build()
                .map_err(|e| self.err(Some(raw.span()), format!("{k}.from"), e.to_string()))?;
            if !r.to.starts_with('/') || r.to.contains('?') || r.to.contains('#') {
                return Err(self.err(
                    Some(raw.span()),
                    format!("{k}.to"),
                    "a rewrite's `to` is a path: it starts with `/` and has no `?` or `#` (the query is kept)",
                ));
            }
            out.push(RewriteRule {
                from,
                to: r.to.clone(),
            });
        }
        Ok(out)
    }

    /// The redirect of route `i`.
    pub(super) fn route_redirect(
        &self,
        i: usize,
        r: &Spanned<RawRoute>,
    ) -> Result<RedirectConfig, ConfigError> {
        let key = format!("route[{i}].redirect");
        match &r.get_ref().redirect {
            Some(rd) => self.redirect(&key, rd),
            None => Err(self.err(Some(r.span()), key, "missing")),
        }
    }

    /// `headers`, `request_headers` and `expires` of route `i` (a static route for
    /// `expires`, a proxy route for `request_headers`).
    pub(super) fn route_rules(
        &self,
        i: usize,
        r: &Spanned<RawRoute>,
        action: &super::RouteAction,
    ) -> Result<RouteRules, ConfigError> {
        let rr = r.get_ref();
        let key = format!("route[{i}]");
        let mut out = RouteRules::default();
        if let Some(h) = &rr.headers {
            out.headers = self.header_edits(&format!("{key}.headers"), h, false)?;
        }
        if let Some(h) = &rr.request_headers {
            if !matches!(action, super::RouteAction::Proxy(_)) {
                return Err(self.err(
                    Some(h.span()),
                    format!("{key}.request_headers"),
                    "`request_headers` is for proxy routes (with `upstreams`)",
                ));
            }
            out.request_headers = self.header_edits(&format!("{key}.request_headers"), h, true)?;
        }
        if let Some(a) = &rr.autoindex {
            if *a.get_ref() && !matches!(action, super::RouteAction::Static(_)) {
                return Err(self.err(
                    Some(a.span()),
                    format!("{key}.autoindex"),
                    "`autoindex` is for static routes (with `root`)",
                ));
            }
            out.autoindex = *a.get_ref();
        }
        if let Some(c) = &rr.charset {
            out.charset = Some(self.charset(&format!("{key}.charset"), c)?);
        }
        out.access = self.access(&key, rr.allow.as_ref(), rr.deny.as_ref())?;
        if let Some(r) = &rr.rate_limit {
            out.rate_limit = Some(self.rate_limit(&key, r)?);
        }
        out.forward_auth = rr
            .forward_auth
            .as_ref()
            .map(|x| self.forward_auth(&key, x))
            .transpose()?;
        out.basic_auth = rr
            .basic_auth
            .as_ref()
            .map(|x| self.basic_auth(&key, x))
            .transpose()?;
        if let Some(t) = &rr.try_files {
            if !matches!(action, super::RouteAction::Static(_)) {
                return Err(self.err(
                    Some(t.span()),
                    format!("{key}.try_files"),
                    "`try_files` is for static routes (with `root`)",
                ));
            }
            let bad = |c: &String| !c.starts_with('/') && !c.starts_with("{path}");
            if t.get_ref().is_empty() || t.get_ref().iter().any(bad) {
                return Err(self.err(
                    Some(t.span()),
                    format!("{key}.try_files"),
                    "list paths that start with `/` or `{path}`, e.g. [\"{path}\", \"{path}/index.html\", \"/index.html\"]",
                ));
            }
            out.try_files = t.get_ref().clone();
        }
        if let Some(e) = &rr.expires {
            if !matches!(action, super::RouteAction::Static(_)) {
                return Err(self.err(
                    Some(e.span()),
                    format!("{key}.expires"),
                    "`expires` is for static routes (with `root`)",
                ));
            }
            for (t, d) in e.get_ref() {
                let ok = t == "*"
                    || t.split_once('/').is_some_and(|(a, b)| {
                        !a.is_empty() && !b.is_empty() && !a.contains('*') && !t.contains(';')
                    });
                if !ok {
                    return Err(self.err(
                        Some(e.span()),
                        format!("{key}.expires"),
                        format!("`{t}` is not a content type (`text/css`, `image/*` or `*`)"),
                    ));
                }
                out.expires.push((t.to_ascii_lowercase(), d.0));
            }
            // exact types, then `type/*`, then `*`
            out.expires
                .sort_by_key(|(t, _)| (t == "*", t.ends_with("/*")));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
