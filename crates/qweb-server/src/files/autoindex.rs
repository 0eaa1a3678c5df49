//! `autoindex = true`: an HTML listing of a directory without an index file. Names are
//! HTML-escaped in the text and percent-encoded in links (so no name becomes markup or a
//! `javascript:` URL), sorted by name, directories with a trailing `/`; names starting with
//! `.` are not listed.

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

/// `&`, `<`, `>`, `"` and `'` as character references.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
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
            let is_dir = match e.file_type() {
                rustix::fs::FileType::Directory => true,
                rustix::fs::FileType::Unknown => {
                    rustix::fs::statat(&dir, e.file_name(), rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
                        .is_ok_and(|st| {
                            rustix::fs::FileType::from_raw_mode(st.st_mode)
                                == rustix::fs::FileType::Directory
                        })
                }
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
                percent_encode(std::ffi::OsStr::from_bytes(name).as_bytes(), LINK),
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
}
