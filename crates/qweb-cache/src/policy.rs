//! RFC 9111 for a shared cache: whether a response may be stored (section 3), how fresh a
//! stored one is (section 4.2), whether a request may take it (sections 4 and 5.2.1), and
//! how a `304` updates it (section 4.3.4).

use std::time::{Duration, SystemTime};

use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue, Method, StatusCode};

use crate::directives::{Directives, Seconds, MAX_DELTA};

/// Statuses heuristically cacheable (RFC 9110 section 15.1).
const HEURISTIC: [u16; 12] = [200, 203, 204, 206, 300, 301, 308, 404, 405, 410, 414, 501];

/// Statuses qweb's cache understands (for `must-understand`).
const UNDERSTOOD: [u16; 16] = [
    200, 203, 204, 300, 301, 302, 303, 307, 308, 400, 403, 404, 405, 410, 414, 501,
];

/// Response fields a `304` never replaces in the stored response (RFC 9111 section 3.2
/// lets a cache keep these; the stored body is what they describe).
const KEEP_ON_UPDATE: [&str; 5] = [
    "content-encoding",
    "content-length",
    "content-md5",
    "content-range",
    "etag",
];

/// Connection-specific and proxy fields never stored (RFC 9111 section 3.1).
const NOT_STORED: [&str; 10] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authentication-info",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "transfer-encoding",
    "upgrade",
    "trailer",
];

/// Why a response is not stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NotStorable {
    /// Only responses to GET are stored.
    #[error("the request method is not GET")]
    Method,
    /// The request said `no-store`.
    #[error("the request says no-store")]
    RequestNoStore,
    /// The response said `no-store` (and no `must-understand` for a status understood).
    #[error("the response says no-store")]
    NoStore,
    /// `private`, for a shared cache.
    #[error("the response is private")]
    Private,
    /// The request had `Authorization` and the response did not allow sharing it.
    #[error("the request was authorized and the response does not say it may be shared")]
    Authorization,
    /// A status the cache does not store (partial content, 304, 1xx, `must-understand`
    /// with a status it does not understand).
    #[error("a status that is not stored")]
    Status,
    /// No explicit freshness, no validator-based heuristic and no `public`.
    #[error("nothing makes the response storable")]
    NoFreshness,
    /// `Set-Cookie` on a response only heuristically cacheable (no explicit freshness,
    /// `public` or `no-cache` from the origin).
    #[error("the response sets a cookie and the origin did not say it may be cached")]
    SetCookie,
    /// `Vary: *`.
    #[error("the response varies on everything")]
    VaryStar,
}

/// Whether a response to `method` with the request's `req` fields may be stored.
pub fn storable(
    method: &Method,
    req: &HeaderMap,
    status: StatusCode,
    resp: &HeaderMap,
) -> Result<(), NotStorable> {
    if method != Method::GET {
        return Err(NotStorable::Method);
    }
    if Directives::of(req, &header::CACHE_CONTROL).no_store {
        return Err(NotStorable::RequestNoStore);
    }
    let cc = Directives::response(resp);
    let code = status.as_u16();
    if code < 200 || code == 206 || code == 304 {
        return Err(NotStorable::Status);
    }
    let understood = UNDERSTOOD.contains(&code);
    if cc.must_understand && !understood {
        return Err(NotStorable::Status);
    }
    if cc.no_store && !(cc.must_understand && understood) {
        return Err(NotStorable::NoStore);
    }
    if cc.private {
        return Err(NotStorable::Private);
    }
    if req.contains_key(header::AUTHORIZATION)
        && !(cc.public || cc.must_revalidate || cc.s_maxage.present())
    {
        return Err(NotStorable::Authorization);
    }
    if vary_names(resp).any(|n| n == "*") {
        return Err(NotStorable::VaryStar);
    }
    let explicit = resp.contains_key(header::EXPIRES)
        || cc.max_age.present()
        || cc.s_maxage.present()
        || cc.public
        || cc.no_cache;
    // RFC 9111 section 7.3: Set-Cookie does not inhibit storing; the origin controls it
    // with Cache-Control. qweb stores such a response only when the origin said how
    // (explicit freshness, public or no-cache), never by heuristics alone.
    if resp.contains_key(header::SET_COOKIE) && !explicit {
        return Err(NotStorable::SetCookie);
    }
    // heuristic freshness needs a Last-Modified; without it and without an ETag the
    // response could never be used, fresh or revalidated: not worth its memory
    let heuristic = HEURISTIC.contains(&code)
        && (resp.contains_key(header::LAST_MODIFIED) || resp.contains_key(header::ETAG));
    if explicit || heuristic {
        Ok(())
    } else {
        Err(NotStorable::NoFreshness)
    }
}

/// The field names a response's `Vary` lists, lowercase.
pub fn vary_names(resp: &HeaderMap) -> impl Iterator<Item = String> + '_ {
    resp.get_all(header::VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase())
        .filter(|n| !n.is_empty())
}

/// A request field's value as a `Vary` comparison sees it (RFC 9111 section 4.1 lets the
/// cache normalise): the lines joined, whitespace around each comma-separated member
/// removed; for the `Accept` fields, whose members' order and case carry no meaning beyond
/// their weights, members lowercased and sorted by weight, then name. `None` when absent.
pub fn vary_value(req: &HeaderMap, name: &str) -> Option<Vec<u8>> {
    let mut members: Vec<&[u8]> = Vec::new();
    let mut present = false;
    for v in req.get_all(name) {
        present = true;
        members.extend(
            v.as_bytes()
                .split(|b| *b == b',')
                .map(<[u8]>::trim_ascii)
                .filter(|m| !m.is_empty()),
        );
    }
    if !present {
        return None;
    }
    if name.starts_with("accept") {
        let mut weighted: Vec<(u16, Vec<u8>)> = members
            .iter()
            .map(|m| {
                let lower = m.to_ascii_lowercase();
                let (token, q) = weight(&lower);
                (q, token)
            })
            .collect();
        weighted.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        let mut out = Vec::new();
        for (q, token) in weighted {
            if !out.is_empty() {
                out.push(b',');
            }
            out.extend_from_slice(&token);
            if q != 1000 {
                out.extend_from_slice(format!(";q={q}").as_bytes());
            }
        }
        return Some(out);
    }
    Some(members.join(&b","[..]))
}

/// An `Accept*` member's token (its parameters other than `q` kept) and its weight in
/// thousandths (1000 without `q`; 0 when `q` is not a number).
fn weight(member: &[u8]) -> (Vec<u8>, u16) {
    let mut token = Vec::new();
    let mut q = 1000;
    for (i, part) in member.split(|b| *b == b';').enumerate() {
        let part = part.trim_ascii();
        if i > 0 {
            if let Some(v) = part.strip_prefix(b"q=") {
                q = std::str::from_utf8(v)
                    .ok()
                    .and_then(|v| v.parse::<f32>().ok())
                    .map_or(0, |f| (f.clamp(0.0, 1.0) * 1000.0).round() as u16);
                continue;
            }
            token.push(b';');
        }
        token.extend_from_slice(part);
    }
    (token, q)
}

/// The request's most preferred language (highest weight, first of equals), lowercase.
fn preferred_language(req: &HeaderMap) -> Option<Vec<u8>> {
    let mut best: Option<(u16, Vec<u8>)> = None;
    for v in req.get_all(header::ACCEPT_LANGUAGE) {
        for m in v.as_bytes().split(|b| *b == b',') {
            let (token, q) = weight(&m.trim_ascii().to_ascii_lowercase());
            if q > 0 && best.as_ref().is_none_or(|(bq, _)| q > *bq) {
                best = Some((q, token));
            }
        }
    }
    best.map(|(_, t)| t)
}

/// The stored response head and what its age and freshness are computed from.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Meta {
    /// The stored status.
    pub status: StatusCode,
    /// The stored response fields (connection-specific ones removed).
    pub headers: HeaderMap,
    /// When the request that brought it was sent.
    pub request_time: SystemTime,
    /// When its head arrived.
    pub response_time: SystemTime,
    /// The request's values of the fields its `Vary` names (secondary key).
    pub vary: Vec<(String, Option<Vec<u8>>)>,
}

impl Meta {
    /// The stored form of a response to a request with fields `req`.
    pub fn new(
        status: StatusCode,
        resp: &HeaderMap,
        req: &HeaderMap,
        request_time: SystemTime,
        response_time: SystemTime,
    ) -> Meta {
        let vary = vary_names(resp)
            .map(|n| {
                let v = vary_value(req, &n);
                (n, v)
            })
            .collect();
        Meta {
            status,
            headers: stored_fields(resp),
            request_time,
            response_time,
            vary,
        }
    }

    /// The stored response's directives for qweb (its targeted field, else
    /// `Cache-Control`: [`Directives::response`]).
    pub fn directives(&self) -> Directives {
        Directives::response(&self.headers)
    }

    /// Whether a request with fields `req` selects this response (its `Vary` fields match).
    ///
    /// `Accept-Language` also matches when the stored response's `Content-Language` is the
    /// request's most preferred language (the origin would select the same response).
    pub fn vary_matches(&self, req: &HeaderMap) -> bool {
        self.vary.iter().all(|(name, v)| {
            name != "*" && (vary_value(req, name) == *v || self.language_selected(name, req))
        })
    }

    fn language_selected(&self, name: &str, req: &HeaderMap) -> bool {
        if name != "accept-language" {
            return false;
        }
        let Some(lang) = self.headers.get(header::CONTENT_LANGUAGE) else {
            return false;
        };
        let lang = lang.as_bytes().trim_ascii().to_ascii_lowercase();
        !lang.contains(&b',') && preferred_language(req).is_some_and(|p| p == lang)
    }

    /// The `Age` the origin or a cache before qweb sent: `None` when it is not one
    /// non-negative integer (then the response is stale).
    fn age_value(&self) -> Option<u64> {
        let mut all = self.headers.get_all(header::AGE).iter();
        let Some(first) = all.next() else {
            return Some(0);
        };
        if all.next().is_some() {
            return None;
        }
        let t = first.to_str().ok()?.trim();
        if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(t.parse::<u64>().map_or(MAX_DELTA, |n| n.min(MAX_DELTA)))
    }

    /// The origin's `Date`, else when the response arrived.
    fn date(&self) -> SystemTime {
        single_date(&self.headers, &header::DATE).unwrap_or(self.response_time)
    }

    /// RFC 9111 section 4.2.3: `current_age`.
    pub fn current_age(&self, now: SystemTime) -> Duration {
        let Some(age_value) = self.age_value() else {
            return Duration::from_secs(MAX_DELTA);
        };
        let apparent = self
            .response_time
            .duration_since(self.date())
            .unwrap_or_default();
        let delay = self
            .response_time
            .duration_since(self.request_time)
            .unwrap_or_default();
        let corrected = Duration::from_secs(age_value) + delay;
        let initial = apparent.max(corrected);
        initial + now.duration_since(self.response_time).unwrap_or_default()
    }

    /// RFC 9111 section 4.2.1 for a shared cache: `s-maxage`, `max-age`, `Expires` minus
    /// `Date`, else 10% of the time since `Last-Modified` where heuristics are allowed.
    pub fn freshness_lifetime(&self) -> Duration {
        let cc = self.directives();
        if cc.no_cache || cc.proxy_revalidate && !cc.s_maxage.present() {
            // no-cache: always revalidated; proxy-revalidate: a shared cache treats it as
            // must-revalidate, and qweb reads it as zero freshness (safe)
            return Duration::ZERO;
        }
        for s in [cc.s_maxage, cc.max_age] {
            match s {
                Seconds::Valid(v) => return Duration::from_secs(v),
                Seconds::Invalid => return Duration::ZERO,
                Seconds::Absent => {}
            }
        }
        if self.headers.contains_key(header::EXPIRES) {
            return match single_date(&self.headers, &header::EXPIRES) {
                Some(exp) => exp.duration_since(self.date()).unwrap_or_default(),
                None => Duration::ZERO,
            };
        }
        let code = self.status.as_u16();
        if !(HEURISTIC.contains(&code) || cc.public) {
            return Duration::ZERO;
        }
        match single_date(&self.headers, &header::LAST_MODIFIED) {
            Some(lm) => self.date().duration_since(lm).unwrap_or_default() / 10,
            None => Duration::ZERO,
        }
    }

    /// Fresh at `now`.
    pub fn is_fresh(&self, now: SystemTime) -> bool {
        self.freshness_lifetime() > self.current_age(now)
    }

    /// How long past its freshness lifetime it is at `now` (zero while fresh).
    pub fn staleness(&self, now: SystemTime) -> Duration {
        self.current_age(now)
            .saturating_sub(self.freshness_lifetime())
    }

    /// The stored `ETag`.
    pub fn etag(&self) -> Option<&HeaderValue> {
        self.headers.get(header::ETAG)
    }

    /// The stored `Last-Modified`.
    pub fn last_modified(&self) -> Option<&HeaderValue> {
        self.headers.get(header::LAST_MODIFIED)
    }

    /// Whether a `304` (fields `resp`) is about this stored response (RFC 9111 section
    /// 4.3.4): the same strong validator, else the same weak one, else the same
    /// `Last-Modified`, else neither carries a validator.
    pub fn validated_by(&self, resp: &HeaderMap) -> bool {
        let new_etag = resp.get(header::ETAG).map(|v| v.as_bytes());
        let old_etag = self.etag().map(|v| v.as_bytes());
        let strip = |e: &[u8]| {
            e.strip_prefix(b"W/")
                .map(<[u8]>::to_vec)
                .unwrap_or(e.to_vec())
        };
        match (new_etag, old_etag) {
            (Some(n), Some(o)) => strip(n) == strip(o),
            (Some(_), None) => false,
            (None, _) => match (resp.get(header::LAST_MODIFIED), self.last_modified()) {
                (Some(n), Some(o)) => n == o,
                (Some(_), None) => false,
                (None, _) => true,
            },
        }
    }

    /// Applies a `304`'s fields (RFC 9111 section 3.2): each field it carries replaces the
    /// stored one, except those that describe the stored body; the times restart.
    pub fn update(
        &mut self,
        resp: &HeaderMap,
        request_time: SystemTime,
        response_time: SystemTime,
    ) {
        let fresh = stored_fields(resp);
        for name in fresh.keys() {
            if KEEP_ON_UPDATE.contains(&name.as_str()) {
                continue;
            }
            self.headers.remove(name);
        }
        for (name, value) in fresh.iter() {
            if KEEP_ON_UPDATE.contains(&name.as_str()) {
                continue;
            }
            self.headers.append(name.clone(), value.clone());
        }
        self.request_time = request_time;
        self.response_time = response_time;
    }
}

/// The fields of `resp` a cache stores: connection-specific ones (and those `Connection`
/// names) removed, and those of a qualified `private`.
fn stored_fields(resp: &HeaderMap) -> HeaderMap {
    let named: Vec<String> = resp
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase())
        .collect();
    let private = Directives::response(resp).private_fields;
    let mut out = HeaderMap::with_capacity(resp.len());
    for (name, value) in resp.iter() {
        let n = name.as_str();
        if NOT_STORED.contains(&n) || named.iter().any(|c| c == n) || private.iter().any(|p| p == n)
        {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    out
}

/// A date field present exactly once and in one of HTTP's three formats.
fn single_date(h: &HeaderMap, name: &HeaderName) -> Option<SystemTime> {
    let mut all = h.get_all(name).iter();
    let first = all.next()?;
    if all.next().is_some() {
        return None;
    }
    httpdate::parse_http_date(first.to_str().ok()?.trim()).ok()
}

/// What a request's own `Cache-Control` (and `Pragma`) allows of a stored response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reuse {
    /// Served as stored.
    Fresh,
    /// Stale, served because the request allows that staleness (`max-stale`).
    StaleAllowed,
    /// Must be validated with the origin first.
    Revalidate,
}

/// Whether a request with fields `req` may take `meta` at `now` without contacting the
/// origin (RFC 9111 sections 4.2.4 and 5.2.1).
pub fn reuse(meta: &Meta, req: &HeaderMap, now: SystemTime) -> Reuse {
    let rq = Directives::of(req, &header::CACHE_CONTROL);
    let pragma_no_cache = !rq.any
        && req
            .get_all(header::PRAGMA)
            .iter()
            .any(|v| v.as_bytes().eq_ignore_ascii_case(b"no-cache"));
    if rq.no_cache || pragma_no_cache {
        return Reuse::Revalidate;
    }
    let age = meta.current_age(now);
    let lifetime = meta.freshness_lifetime();
    if let Seconds::Valid(max) = rq.max_age {
        if age > Duration::from_secs(max) {
            return Reuse::Revalidate;
        }
    } else if rq.max_age == Seconds::Invalid {
        return Reuse::Revalidate;
    }
    if let Seconds::Valid(min) = rq.min_fresh {
        if lifetime.saturating_sub(age) < Duration::from_secs(min) {
            return Reuse::Revalidate;
        }
    }
    if lifetime > age {
        return Reuse::Fresh;
    }
    let rc = meta.directives();
    if rc.must_revalidate || rc.proxy_revalidate || rc.no_cache || rc.s_maxage.present() {
        // s-maxage: a shared cache treats it as proxy-revalidate (section 5.2.2.10)
        return Reuse::Revalidate;
    }
    match rq.max_stale {
        Seconds::Invalid => Reuse::StaleAllowed,
        Seconds::Valid(s) if age - lifetime <= Duration::from_secs(s) => Reuse::StaleAllowed,
        _ => Reuse::Revalidate,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(fields: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (n, v) in fields {
            m.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        m
    }

    fn meta(fields: &[(&str, &str)], now: SystemTime) -> Meta {
        Meta::new(StatusCode::OK, &h(fields), &HeaderMap::new(), now, now)
    }

    #[test]
    fn storability() {
        let get = Method::GET;
        let none = HeaderMap::new();
        let ok = |r: &HeaderMap| storable(&get, &none, StatusCode::OK, r);
        assert_eq!(ok(&h(&[("cache-control", "max-age=60")])), Ok(()));
        assert_eq!(
            ok(&h(&[("cache-control", "no-store")])),
            Err(NotStorable::NoStore)
        );
        assert_eq!(
            ok(&h(&[("cache-control", "private")])),
            Err(NotStorable::Private)
        );
        assert_eq!(
            ok(&h(&[
                ("last-modified", "Wed, 01 Jan 2020 00:00:00 GMT"),
                ("set-cookie", "a=b")
            ])),
            Err(NotStorable::SetCookie)
        );
        assert_eq!(
            ok(&h(&[("last-modified", "Wed, 01 Jan 2020 00:00:00 GMT")])),
            Ok(())
        );
        assert_eq!(
            ok(&h(&[
                ("cache-control", "max-age=60"),
                ("set-cookie", "a=b")
            ])),
            Ok(())
        );
        let auth = h(&[("authorization", "Basic x")]);
        assert_eq!(
            storable(
                &get,
                &auth,
                StatusCode::OK,
                &h(&[("cache-control", "max-age=60")])
            ),
            Err(NotStorable::Authorization)
        );
        assert_eq!(
            storable(
                &get,
                &none,
                StatusCode::from_u16(599).unwrap(),
                &HeaderMap::new()
            ),
            Err(NotStorable::NoFreshness)
        );
        assert_eq!(
            storable(
                &Method::POST,
                &none,
                StatusCode::OK,
                &h(&[("cache-control", "max-age=60")])
            ),
            Err(NotStorable::Method)
        );
    }

    #[test]
    fn age_and_freshness() {
        let now = SystemTime::now();
        let m = meta(&[("cache-control", "max-age=60")], now);
        assert!(m.is_fresh(now + Duration::from_secs(59)));
        assert!(!m.is_fresh(now + Duration::from_secs(61)));
        let old = meta(&[("cache-control", "max-age=60"), ("age", "100")], now);
        assert!(!old.is_fresh(now));
        for bad in ["-1", "1.5", "a", "0, 0"] {
            let m = meta(&[("cache-control", "max-age=60"), ("age", bad)], now);
            assert!(!m.is_fresh(now), "Age: {bad}");
        }
        let s = meta(&[("cache-control", "max-age=1, s-maxage=60")], now);
        assert_eq!(s.freshness_lifetime(), Duration::from_secs(60));
        let date = httpdate::fmt_http_date(now);
        let exp = httpdate::fmt_http_date(now + Duration::from_secs(100));
        let e = meta(&[("date", &date), ("expires", &exp)], now);
        assert!(e.is_fresh(now + Duration::from_secs(90)));
        let bad = meta(&[("date", &date), ("expires", "0")], now);
        assert!(!bad.is_fresh(now));
        let lm = httpdate::fmt_http_date(now - Duration::from_secs(1000));
        let heur = meta(&[("date", &date), ("last-modified", &lm)], now);
        assert_eq!(heur.freshness_lifetime(), Duration::from_secs(100));
    }

    #[test]
    fn request_directives() {
        let now = SystemTime::now();
        let m = meta(&[("cache-control", "max-age=10")], now);
        let later = now + Duration::from_secs(20);
        assert_eq!(reuse(&m, &HeaderMap::new(), now), Reuse::Fresh);
        assert_eq!(reuse(&m, &HeaderMap::new(), later), Reuse::Revalidate);
        let stale_ok = h(&[("cache-control", "max-stale=15")]);
        assert_eq!(reuse(&m, &stale_ok, later), Reuse::StaleAllowed);
        assert_eq!(
            reuse(&m, &h(&[("cache-control", "no-cache")]), now),
            Reuse::Revalidate
        );
        assert_eq!(
            reuse(&m, &h(&[("pragma", "no-cache")]), now),
            Reuse::Revalidate
        );
        assert_eq!(
            reuse(&m, &h(&[("cache-control", "min-fresh=20")]), now),
            Reuse::Revalidate
        );
        let must = meta(&[("cache-control", "max-age=10, must-revalidate")], now);
        assert_eq!(reuse(&must, &stale_ok, later), Reuse::Revalidate);
    }

    #[test]
    fn vary_and_update() {
        let now = SystemTime::now();
        let req = h(&[("accept-language", "en, fr")]);
        let resp = h(&[("vary", "Accept-Language"), ("etag", "\"a\""), ("x-a", "1")]);
        let mut m = Meta::new(StatusCode::OK, &resp, &req, now, now);
        assert!(m.vary_matches(&h(&[("accept-language", "en,fr")])));
        assert!(m.vary_matches(&h(&[("accept-language", "FR, en")])));
        assert!(!m.vary_matches(&h(&[("accept-language", "fr;q=0.5, en")])));
        assert!(!m.vary_matches(&h(&[("accept-language", "de")])));
        let chosen = h(&[("vary", "Accept-Language"), ("content-language", "de")]);
        let c = Meta::new(StatusCode::OK, &chosen, &req, now, now);
        assert!(c.vary_matches(&h(&[("accept-language", "fr;q=0.5, de;q=1.0")])));
        assert!(!c.vary_matches(&h(&[("accept-language", "fr, de;q=0.9")])));
        assert!(!m.vary_matches(&HeaderMap::new()));
        let not_mod = h(&[("etag", "\"a\""), ("x-a", "2"), ("content-length", "0")]);
        assert!(m.validated_by(&not_mod));
        assert!(!m.validated_by(&h(&[("etag", "\"b\"")])));
        m.update(&not_mod, now, now);
        assert_eq!(m.headers["x-a"], "2");
        assert!(!m.headers.contains_key("content-length"));
    }
}
