//! `autoindex = true`: an HTML listing of a directory without an index file. Names are
//! HTML-escaped in the text and percent-encoded in links (so no name becomes markup or a
//! `javascript:` URL), control characters (CR, ESC ...) replaced by U+FFFD in the text
//! (percent-encoded in links), sorted by name, directories with a trailing `/`; names
//! starting with `.` are not listed, nor symlinks the route's `symlinks` policy would not
//! serve (out of the root, absolute, dangling, or any with `"refuse"`).

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::os::unix::ffi::OsStrExt;

use http::{header, HeaderValue, Method, Response, StatusCode};
use percent_encoding::{percent_encode, AsciiSet, NON_ALPHANUMERIC};

use super::{resolve, StaticFiles};
use crate::http::body::{empty, full, Body};

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

impl StaticFiles {
    /// The listing of the directory `path` (ending in `/`) beneath the root; `shown` is the
    /// request path for the title. `None` when it is not a directory that opens.
    pub(crate) fn listing(
        &self,
        method: &Method,
        path: &str,
        shown: &str,
    ) -> Option<Response<Body>> {
        if !path.ends_with('/') {
            return None;
        }
        let rel = resolve::decode(path).ok()?;
        let dir = self.root.open(&rel).ok()?;
        if !dir.metadata().ok()?.is_dir() {
            return None;
        }
        let mut entries: Vec<(Vec<u8>, bool)> = Vec::new();
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
            use rustix::fs::FileType;
            let kind = match e.file_type() {
                FileType::Unknown => {
                    match rustix::fs::statat(
                        &dir,
                        e.file_name(),
                        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
                    ) {
                        Ok(st) => FileType::from_raw_mode(st.st_mode),
                        Err(_) => continue,
                    }
                }
                k => k,
            };
            let is_dir = match kind {
                FileType::Directory => true,
                // listed only when the route would serve it: opened as a request would be
                FileType::Symlink => match self.root.open(&rel.join(OsStr::from_bytes(name))) {
                    Ok(f) => f.metadata().is_ok_and(|m| m.is_dir()),
                    Err(_) => continue,
                },
                _ => false,
            };
            entries.push((name.to_vec(), is_dir));
        }
        entries.sort();
        let title = escape(shown);
        let mut html = format!(
            "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>Index of {title}</title></head>\n<body><h1>Index of {title}</h1>\n<ul>\n<li><a href=\"../\">../</a></li>\n"
        );
        for (name, is_dir) in &entries {
            let text = String::from_utf8_lossy(name);
            let slash = if *is_dir { "/" } else { "" };
            let _ = writeln!(
                html,
                "<li><a href=\"{}{slash}\">{}{slash}</a></li>",
                percent_encode(name, LINK),
                escape(&text)
            );
        }
        html.push_str("</ul>\n");
        if cut {
            let _ = writeln!(html, "<p>(only the first {MAX_ENTRIES} entries)</p>");
        }
        html.push_str("</body></html>\n");
        let len = html.len();
        let mut r = Response::new(if method == Method::HEAD {
            empty()
        } else {
            full(html)
        });
        *r.status_mut() = StatusCode::OK;
        let h = r.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        );
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
        Some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::escape;

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
