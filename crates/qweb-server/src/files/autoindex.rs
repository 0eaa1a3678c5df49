//! `autoindex = true`: a listing of a directory without an index file, in HTML (a table of
//! name, size and modification time) or, with `?format=json` in the query (as Caddy's
//! browse), a JSON array of `{"name", "url", "is_dir", "size", "mod_time"}` objects. Names are
//! HTML-escaped in the text and percent-encoded in links (so no name becomes markup or a
//! `javascript:` URL), control characters (CR, ESC ...) replaced by U+FFFD in the text
//! (percent-encoded in links); in JSON, names are valid JSON strings (bytes that are not
//! UTF-8 become U+FFFD in `name`; `url` percent-encodes the exact bytes), with `<`, `>` and
//! `&` escaped too. Sorted by name (bytewise), directories with a trailing `/`; names
//! starting with `.` are not listed, nor symlinks the route's `symlinks` policy would not
//! serve (out of the root, absolute, dangling, or any with `"refuse"`). Times are UTC.

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;

use http::{header, HeaderValue, Method, Response, StatusCode};
use percent_encoding::{percent_encode, AsciiSet, NON_ALPHANUMERIC};

use super::{resolve, StaticFiles};
use qweb_http::body::{empty, full, Body};

/// Most entries listed; more are cut (and the listing says so).
const MAX_ENTRIES: usize = 10_000;

/// Everything but RFC 3986 unreserved characters is encoded in a link.
const LINK: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `&`, `<`, `>`, `"` and `'` as character references; control characters as U+FFFD.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            c if c.is_control() => out.push(char::REPLACEMENT_CHARACTER),
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// One listed entry.
struct Entry {
    name: Vec<u8>,
    is_dir: bool,
    /// Bytes (0 for directories).
    size: u64,
    /// Seconds since the epoch (UTC).
    mtime: i64,
}

/// `format=json` among the query's pairs.
fn wants_json(query: Option<&str>) -> bool {
    query.is_some_and(|q| q.split('&').any(|p| p == "format=json"))
}

/// `YYYY-MM-DD`, `HH:MM:SS` of `secs` since the epoch, UTC (proleptic Gregorian).
fn utc(secs: i64) -> (String, String) {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = qweb_tls::utc::civil_from_days(days);
    (
        format!("{y:04}-{m:02}-{d:02}"),
        format!("{:02}:{:02}:{:02}", rem / 3600, rem / 60 % 60, rem % 60),
    )
}

/// A JSON string literal of `s`: `"`, `\` and control characters escaped, and `<`, `>`,
/// `&` too (no listing can be read as markup by a browser that sniffs).
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || matches!(c, '<' | '>' | '&' | '\u{2028}' | '\u{2029}') => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl StaticFiles {
    /// The listing of the directory `path` (ending in `/`) beneath the root; `shown` is the
    /// request path for the title; `query`: the request's (`format=json`). `None` when it is
    /// not a directory that opens.
    pub(crate) fn listing(
        &self,
        method: &Method,
        path: &str,
        shown: &str,
        query: Option<&str>,
    ) -> Option<Response<Body>> {
        if !path.ends_with('/') {
            return None;
        }
        let rel = resolve::decode(path).ok()?;
        let (entries, cut) = self.entries(&rel)?;
        let (text, content_type) = match wants_json(query) {
            true => (json(&entries), "application/json"),
            false => (html(&entries, shown, cut), "text/html; charset=utf-8"),
        };
        let len = text.len();
        let mut r = Response::new(if method == Method::HEAD {
            empty()
        } else {
            full(text)
        });
        *r.status_mut() = StatusCode::OK;
        let h = r.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
        Some(r)
    }

    /// The directory `rel`'s entries, sorted by name, at most [`MAX_ENTRIES`] (`true`: more
    /// were cut). `None` when it is not a directory that opens.
    fn entries(&self, rel: &std::path::Path) -> Option<(Vec<Entry>, bool)> {
        use rustix::fs::{AtFlags, FileType};
        let dir = self.root.open(rel).ok()?;
        if !dir.metadata().ok()?.is_dir() {
            return None;
        }
        let mut entries: Vec<Entry> = Vec::new();
        let mut cut = false;
        for e in rustix::fs::Dir::read_from(&dir).ok()? {
            let Ok(e) = e else { break };
            let name = e.file_name().to_bytes();
            if name.first() == Some(&b'.') {
                continue;
            }
            if entries.len() == MAX_ENTRIES {
                cut = true;
                break;
            }
            let Ok(st) = rustix::fs::statat(&dir, e.file_name(), AtFlags::SYMLINK_NOFOLLOW) else {
                continue;
            };
            let (is_dir, size, mtime) = match FileType::from_raw_mode(st.st_mode) {
                FileType::Directory => (true, 0, st.st_mtime),
                // listed only when the route would serve it: opened as a request would be
                FileType::Symlink => match self.root.open(&rel.join(OsStr::from_bytes(name))) {
                    Ok(f) => match f.metadata() {
                        Ok(m) => (m.is_dir(), if m.is_dir() { 0 } else { m.len() }, m.mtime()),
                        Err(_) => continue,
                    },
                    Err(_) => continue,
                },
                _ => (false, st.st_size as u64, st.st_mtime),
            };
            entries.push(Entry {
                name: name.to_vec(),
                is_dir,
                size,
                mtime,
            });
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Some((entries, cut))
    }
}

fn html(entries: &[Entry], shown: &str, cut: bool) -> String {
    let title = escape(shown);
    let mut html = format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>Index of {title}</title></head>\n<body><h1>Index of {title}</h1>\n<table>\n<tr><th>Name</th><th>Size</th><th>Modified (UTC)</th></tr>\n<tr><td><a href=\"../\">../</a></td><td></td><td></td></tr>\n"
    );
    for e in entries {
        let text = String::from_utf8_lossy(&e.name);
        let slash = if e.is_dir { "/" } else { "" };
        let size = if e.is_dir {
            "-".to_owned()
        } else {
            e.size.to_string()
        };
        let (day, time) = utc(e.mtime);
        let _ = writeln!(
            html,
            "<tr><td><a href=\"{}{slash}\">{}{slash}</a></td><td>{size}</td><td>{day} {time}</td></tr>",
            percent_encode(&e.name, LINK),
            escape(&text)
        );
    }
    html.push_str("</table>\n");
    if cut {
        let _ = writeln!(html, "<p>(only the first {MAX_ENTRIES} entries)</p>");
    }
    html.push_str("</body></html>\n");
    html
}

fn json(entries: &[Entry]) -> String {
    let mut out = String::from("[");
    for (i, e) in entries.iter().enumerate() {
        let slash = if e.is_dir { "/" } else { "" };
        let (day, time) = utc(e.mtime);
        let _ = write!(
            out,
            "{}\n{{\"name\":{},\"url\":{},\"is_dir\":{},\"size\":{},\"mod_time\":\"{day}T{time}Z\"}}",
            if i == 0 { "" } else { "," },
            json_string(&format!("{}{slash}", String::from_utf8_lossy(&e.name))),
            json_string(&format!("{}{slash}", percent_encode(&e.name, LINK))),
            e.is_dir,
            e.size,
        );
    }
    out.push_str("\n]\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_strings_escape_quotes_controls_and_markup() {
        assert_eq!(
            json_string("a\"b\\c\nd\u{1}<s>&\u{2028}é"),
            "\"a\\\"b\\\\c\\nd\\u0001\\u003cs\\u003e\\u0026\\u2028é\""
        );
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), ("1970-01-01".into(), "00:00:00".into()));
        assert_eq!(utc(951_782_400), ("2000-02-29".into(), "00:00:00".into()));
        assert_eq!(utc(1_700_000_000), ("2023-11-14".into(), "22:13:20".into()));
        assert_eq!(utc(-1), ("1969-12-31".into(), "23:59:59".into()));
    }

    #[test]
    fn json_format_is_asked_by_the_query() {
        assert!(wants_json(Some("format=json")));
        assert!(wants_json(Some("a=1&format=json")));
        assert!(!wants_json(Some("format=jsonx")));
        assert!(!wants_json(None));
    }

    #[test]
    fn escapes_markup() {
        assert_eq!(
            escape("<script>&\"'.html"),
            "&lt;script&gt;&amp;&quot;&#39;.html"
        );
    }

    #[test]
    fn control_characters_are_replaced() {
        assert_eq!(
            escape("a\rb\x1b[31m\u{7f}\u{9b}c"),
            "a\u{fffd}b\u{fffd}[31m\u{fffd}\u{fffd}c"
        );
    }
}
