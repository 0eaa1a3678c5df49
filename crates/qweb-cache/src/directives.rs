//! `Cache-Control` (RFC 9111 section 5.2) and its kin: the directives of one message, read
//! with quoted strings respected (a `max-age=1` inside a quoted value is no directive).

use http::header::HeaderName;
use http::HeaderMap;

/// The largest delta-seconds a cache must represent (RFC 9111 section 1.2.2): larger values
/// are read as this one.
pub const MAX_DELTA: u64 = 2_147_483_648;

/// A directive's seconds: absent, a valid number, or present but not a valid number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Seconds {
    /// Not present.
    #[default]
    Absent,
    /// Present with a valid delta-seconds value (capped at [`MAX_DELTA`]).
    Valid(u64),
    /// Present without a value, or with one that is not delta-seconds.
    Invalid,
}

impl Seconds {
    /// Whether the directive appears at all.
    pub fn present(self) -> bool {
        self != Seconds::Absent
    }

    /// The value when valid.
    pub fn value(self) -> Option<u64> {
        match self {
            Seconds::Valid(v) => Some(v),
            _ => None,
        }
    }
}

/// The directives of one `Cache-Control` (or targeted) field, first occurrence wins.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Directives {
    /// `max-age`.
    pub max_age: Seconds,
    /// `s-maxage`.
    pub s_maxage: Seconds,
    /// `max-stale` (request): `Valid`, or `Invalid` meaning "any staleness" when it has no
    /// value.
    pub max_stale: Seconds,
    /// `min-fresh` (request).
    pub min_fresh: Seconds,
    /// `stale-while-revalidate` (RFC 5861).
    pub stale_while_revalidate: Seconds,
    /// `stale-if-error` (RFC 5861).
    pub stale_if_error: Seconds,
    /// `no-store`.
    pub no_store: bool,
    /// `no-cache` (with or without a field list: both are read as unqualified).
    pub no_cache: bool,
    /// Unqualified `private`.
    pub private: bool,
    /// The fields of a qualified `private="..."`: not stored by a shared cache.
    pub private_fields: Vec<String>,
    /// `public`.
    pub public: bool,
    /// `must-revalidate`.
    pub must_revalidate: bool,
    /// `proxy-revalidate`.
    pub proxy_revalidate: bool,
    /// `must-understand`.
    pub must_understand: bool,
    /// `only-if-cached` (request).
    pub only_if_cached: bool,
    /// `immutable` (RFC 8246).
    pub immutable: bool,
    /// Any directive at all was present.
    pub any: bool,
}

impl Directives {
    /// The directives of every `name` line of `headers`.
    pub fn of(headers: &HeaderMap, name: &HeaderName) -> Directives {
        let mut d = Directives::default();
        for value in headers.get_all(name) {
            // a field value that is not text has no directive qweb understands
            let Ok(text) = std::str::from_utf8(value.as_bytes()) else {
                continue;
            };
            for (k, v) in split(text) {
                d.any = true;
                d.apply(&k, v);
            }
        }
        d
    }

    /// The directives a shared cache named `qweb` follows for a response: those of
    /// `CDN-Cache-Control` (RFC 9213) when it has any, else the members of
    /// `Surrogate-Control` (W3C Edge Architecture) without a target or targeted at `qweb`
    /// (`max-age=60;qweb`) when there are any, else `Cache-Control`. A targeted field
    /// replaces `Cache-Control` whole for this cache.
    pub fn response(headers: &HeaderMap) -> Directives {
        let cdn = Directives::of(headers, &CDN_CACHE_CONTROL);
        if cdn.any {
            return cdn;
        }
        let mut sc = Directives::default();
        for value in headers.get_all(&SURROGATE_CONTROL) {
            let Ok(text) = std::str::from_utf8(value.as_bytes()) else {
                continue;
            };
            for element in elements(text) {
                let element = match split_outside_quotes(element, b';') {
                    (e, None) => e,
                    (e, Some(target)) if target.trim().eq_ignore_ascii_case(TARGET) => e,
                    _ => continue,
                };
                for (k, v) in split(element) {
                    sc.any = true;
                    sc.apply(&k, v);
                }
            }
        }
        if sc.any {
            return sc;
        }
        Directives::of(headers, &http::header::CACHE_CONTROL)
    }

    /// Records one directive (names compared without case; the first of each wins).
    fn apply(&mut self, name: &str, value: Option<Value>) {
        let secs = |v: &Option<Value>| match v {
            Some(v) => delta_seconds(v),
            None => Seconds::Invalid,
        };
        let set = |slot: &mut Seconds, v: &Option<Value>| {
            if !slot.present() {
                *slot = secs(v);
            }
        };
        match name {
            "max-age" => set(&mut self.max_age, &value),
            "s-maxage" => set(&mut self.s_maxage, &value),
            "max-stale" => set(&mut self.max_stale, &value),
            "min-fresh" => set(&mut self.min_fresh, &value),
            "stale-while-revalidate" => set(&mut self.stale_while_revalidate, &value),
            "stale-if-error" => set(&mut self.stale_if_error, &value),
            "no-store" => self.no_store = true,
            "no-cache" => self.no_cache = true,
            "private" => match value {
                Some(v) if !v.text.trim().is_empty() => self.private_fields.extend(
                    v.text
                        .split(',')
                        .map(|f| f.trim().to_ascii_lowercase())
                        .filter(|f| !f.is_empty()),
                ),
                _ => self.private = true,
            },
            "public" => self.public = true,
            "must-revalidate" => self.must_revalidate = true,
            "proxy-revalidate" => self.proxy_revalidate = true,
            "must-understand" => self.must_understand = true,
            "only-if-cached" => self.only_if_cached = true,
            "immutable" => self.immutable = true,
            _ => {}
        }
    }
}

/// A directive's value: its text (a quoted string's without its quotes and escapes).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Value {
    text: String,
}

/// delta-seconds (RFC 9111 section 1.2.2): digits only, a quoted string of digits accepted
/// as the RFC's section 5.2 asks of recipients, capped at [`MAX_DELTA`].
fn delta_seconds(v: &Value) -> Seconds {
    let t = v.text.as_str();
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Seconds::Invalid;
    }
    // digits only: a parse failure is an overflow
    Seconds::Valid(t.parse::<u64>().map_or(MAX_DELTA, |n| n.min(MAX_DELTA)))
}

/// The name `Surrogate-Control` members target (`;qweb`), and that qweb announces in
/// `Surrogate-Capability`.
pub const TARGET: &str = "qweb";

static CDN_CACHE_CONTROL: HeaderName = HeaderName::from_static("cdn-cache-control");
static SURROGATE_CONTROL: HeaderName = HeaderName::from_static("surrogate-control");

/// `text` cut at the first `sep` outside a quoted string: before it, and after it.
fn split_outside_quotes(text: &str, sep: u8) -> (&str, Option<&str>) {
    let bytes = text.as_bytes();
    let mut in_quote = false;
    let mut escaped = false;
    for (i, &b) in bytes.iter().enumerate() {
        if in_quote {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_quote = false;
            }
        } else if b == b'"' {
            in_quote = true;
        } else if b == sep {
            return (&text[..i], Some(&text[i + 1..]));
        }
    }
    (text, None)
}

/// The comma-separated elements of a field value, commas inside quoted strings kept,
/// trimmed, empty ones dropped.
fn elements(mut text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    loop {
        let (element, rest) = split_outside_quotes(text, b',');
        let element = element.trim();
        if !element.is_empty() {
            out.push(element);
        }
        match rest {
            Some(r) => text = r,
            None => return out,
        }
    }
}

/// Splits a `Cache-Control` value into lowercase directive names and their values, commas
/// inside quoted strings kept. A directive with a space around its `=` is not a directive
/// (`max-age =5` is skipped: RFC 9110's `token "=" ( token / quoted-string )` has none).
fn split(text: &str) -> Vec<(String, Option<Value>)> {
    let mut out = Vec::new();
    for element in elements(text) {
        let (name, value) = match element.split_once('=') {
            None => (element, None),
            Some((n, v)) => {
                if n.ends_with(char::is_whitespace) || v.starts_with(char::is_whitespace) {
                    continue;
                }
                (n, Some(unquote(v)))
            }
        };
        if name.is_empty() || !name.bytes().all(is_tchar) {
            continue;
        }
        out.push((name.to_ascii_lowercase(), value));
    }
    out
}

/// The value of a directive: a quoted string's content (escapes removed), else the token.
fn unquote(v: &str) -> Value {
    if v.len() >= 2 && v.starts_with('"') && v.ends_with('"') {
        let mut text = String::with_capacity(v.len());
        let mut chars = v[1..v.len() - 1].chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => text.extend(chars.next()),
                c => text.push(c),
            }
        }
        Value { text }
    } else {
        Value { text: v.to_owned() }
    }
}

/// RFC 9110's tchar.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::CACHE_CONTROL;
    use http::HeaderValue;

    fn cc(lines: &[&str]) -> Directives {
        let mut h = HeaderMap::new();
        for l in lines {
            h.append(CACHE_CONTROL, HeaderValue::from_str(l).unwrap());
        }
        Directives::of(&h, &CACHE_CONTROL)
    }

    #[test]
    fn max_age_forms() {
        assert_eq!(cc(&["max-age=3600"]).max_age, Seconds::Valid(3600));
        assert_eq!(cc(&["MAX-AGE=003600"]).max_age, Seconds::Valid(3600));
        assert_eq!(cc(&["max-age=\"3600\""]).max_age, Seconds::Valid(3600));
        assert_eq!(cc(&["max-age='3600'"]).max_age, Seconds::Invalid);
        assert_eq!(cc(&["max-age=3600.0"]).max_age, Seconds::Invalid);
        assert_eq!(cc(&["max-age=-1"]).max_age, Seconds::Invalid);
        assert_eq!(cc(&["max-age=a3600"]).max_age, Seconds::Invalid);
        assert_eq!(cc(&["max-age =3600"]).max_age, Seconds::Absent);
        assert_eq!(
            cc(&["max-age=99999999999999999999"]).max_age,
            Seconds::Valid(MAX_DELTA)
        );
    }

    #[test]
    fn quoted_strings_hide_directives() {
        let d = cc(&["foo=\"max-age=8, no-store\", max-age=1"]);
        assert_eq!(d.max_age, Seconds::Valid(1));
        assert!(!d.no_store);
        let d = cc(&["max-age=1, foo=\"max-age=8\""]);
        assert_eq!(d.max_age, Seconds::Valid(1));
    }

    #[test]
    fn first_occurrence_wins_across_lines() {
        assert_eq!(
            cc(&["max-age=1", "max-age=3600"]).max_age,
            Seconds::Valid(1)
        );
        assert_eq!(cc(&["max-age=1, max-age=3600"]).max_age, Seconds::Valid(1));
    }

    #[test]
    fn targeted_fields_replace_cache_control() {
        let mut h = HeaderMap::new();
        h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        h.insert(
            "surrogate-control",
            HeaderValue::from_static("max-age=10;other, no-store;other, max-age=60;qweb"),
        );
        let d = Directives::response(&h);
        assert_eq!(d.max_age, Seconds::Valid(60));
        assert!(!d.no_store);
        h.insert(
            "surrogate-control",
            HeaderValue::from_static("max-age=60;other"),
        );
        assert!(
            Directives::response(&h).no_store,
            "nothing for qweb: Cache-Control"
        );
        h.insert("cdn-cache-control", HeaderValue::from_static("max-age=5"));
        assert_eq!(Directives::response(&h).max_age, Seconds::Valid(5));
    }

    #[test]
    fn flags_and_qualified_private() {
        let d = cc(&["private=\"set-cookie, x-a\", no-cache=\"x\", must-revalidate"]);
        assert!(!d.private);
        assert_eq!(d.private_fields, vec!["set-cookie", "x-a"]);
        assert!(d.no_cache && d.must_revalidate);
        assert!(cc(&["Private"]).private);
        assert_eq!(cc(&["max-stale"]).max_stale, Seconds::Invalid);
    }
}
