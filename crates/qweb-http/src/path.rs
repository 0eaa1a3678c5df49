//! Request-path normalisation, done once per request before routing, for static and proxy
//! routes alike (as nginx does): routes match the normalised path and upstreams receive it.
//!
//! - percent-encoded unreserved characters (RFC 3986 §2.3: `A-Z a-z 0-9 - . _ ~`) are decoded,
//!   so `%2e%2e` is the dot segment `..`; every other escape is kept, with upper-case hex;
//! - an encoded `/` (`%2F`), `\` (`%5C`) or NUL (`%00`), a raw `\` and control bytes are refused
//!   (400): each would mean one thing to qweb's router and another to a file system or an
//!   upstream that decodes it (`/files/..%2fsecret`);
//! - dot segments are removed (RFC 3986 §5.2.4) and runs of `/` merged; a path that would
//!   climb above `/` is refused (400), as nginx does;
//! - a dot segment with parameters (`..;x`, `.;`) is refused (400): Tomcat and Jetty read it
//!   as the dot segment, qweb's router would read it as a name.
//!
//! The result is still a valid URI path (nothing was decoded that needs encoding).
//!
//! Routes that forward the client's path as sent (`pass_raw_path`) are routed on
//! [`normalize_keeping_separators`] and checked against [`normalize_decoding_separators`],
//! the path as an upstream that decodes `%2F` understands it; [`split_prefix`] says whether a
//! route prefix covers a path and what is beneath it, for every caller.

use http::StatusCode;

/// Why a path was refused (always 400 Bad Request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathError {
    /// Not an origin-form path (does not start with `/`).
    NotAbsolute,
    /// A `%` not followed by two hex digits.
    BadEscape,
    /// `%2F`, `%5C`, `%00`, a raw backslash, a control byte, or a dot segment with
    /// parameters (`..;`).
    Forbidden,
    /// More `..` segments than there are segments to remove.
    AboveRoot,
    /// Another route covers the path when its case is folded, or when a segment's trailing
    /// dots and spaces are dropped as Windows does (the router's check, in
    /// pipeline/service.rs).
    CaseAmbiguous,
}

impl PathError {
    /// The status that refuses the request.
    pub fn status(self) -> StatusCode {
        StatusCode::BAD_REQUEST
    }
}

fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// What an encoded separator (`%2F`, `%5C`) does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Separators {
    /// Refused (400).
    Refuse,
    /// Kept encoded: part of one segment.
    Keep,
    /// Decoded to `/`: a segment boundary, as an upstream that decodes them reads it.
    Split,
}

/// Normalises an origin-form request path (without the query). See the module docs.
pub fn normalize(raw: &str) -> Result<String, PathError> {
    normalize_with(raw, Separators::Refuse)
}

/// [`normalize`], but `%2F` and `%5C` are kept encoded (one segment) instead of refused: for
/// routing requests to routes that forward the client's raw path (`pass_raw_path`).
pub fn normalize_keeping_separators(raw: &str) -> Result<String, PathError> {
    normalize_with(raw, Separators::Keep)
}

/// [`normalize`], but `%2F` and `%5C` are decoded to `/` before dot segments are removed: the
/// path as an upstream that decodes them understands a raw path (python's http.server, IIS),
/// so `/files/..%2fx` is `/x`. For checking where a raw path lands, never for forwarding.
pub fn normalize_decoding_separators(raw: &str) -> Result<String, PathError> {
    normalize_with(raw, Separators::Split)
}

/// Does a route's `prefix` (normalised, no trailing `/` unless it is `/`) cover the normalised
/// `path`, and how does the route see it? `None` when it does not cover it: `/api` covers
/// `/api` and `/api/...`, not `/apix`. Else `(mount, sub)`: with `strip` (and a prefix other
/// than `/`) the prefix and the path beneath it (`/` for the prefix itself), else `("",
/// path)`. The one prefix split of routing, rewrites, error pages and `pass_raw_path`.
///
/// Path parameters do not hide a segment from its prefix: `/api;x`, `/api;/y` and
/// `/api%3Bx/y` are beneath `/api`, as Tomcat, Jetty and Spring read them (each segment's
/// name ends at its first `;`), so that a route's rules see the path its upstream acts on.
/// With `strip`, the parameters of the prefix's own segments go with the prefix.
pub fn split_prefix<'a>(prefix: &'a str, strip: bool, path: &'a str) -> Option<(&'a str, &'a str)> {
    split_prefix_as(prefix, strip, path, Case::Sensitive)
}

/// How a prefix is compared with a path's segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Case {
    /// Byte for byte, as RFC 3986 says paths compare and qweb routes.
    Sensitive,
    /// ASCII case folded: how a case-insensitive upstream (IIS, a Windows or macOS file
    /// system) reads the path; for checking that it would not land elsewhere.
    Folded,
    /// As Windows reads a path: case folded, each segment from its first colon on ignored
    /// (an NTFS stream: `/admin::$DATA` is `/admin`'s file), and its trailing dots and spaces
    /// (`%20`) ignored (`/admin.` and `/admin%20/x` are `/admin`'s to IIS or a Windows file
    /// system). For paths [`windows_trims`] finds something in.
    Windows,
}

/// Does a segment of `path` (a normalised one: spaces are `%20`) end with a dot or a space,
/// or name an NTFS stream (a colon, `%3A`), which Windows drops? Then [`Case::Windows`] may
/// read it as another route's.
pub fn windows_trims(path: &str) -> bool {
    path.split('/')
        .any(|seg| windows_name(segment_name(seg)).len() != segment_name(seg).len())
}

/// A segment's name as Windows reads it: without an NTFS stream (from the first colon) and
/// without its trailing dots and spaces.
fn windows_name(name: &str) -> &str {
    let stream = [":", "%3A", "%3a"]
        .iter()
        .filter_map(|c| name.find(c))
        .min();
    let mut name = stream.map_or(name, |i| &name[..i]);
    loop {
        if let Some(n) = name.strip_suffix('.').or_else(|| name.strip_suffix(' ')) {
            name = n;
        } else if let Some(n) = name.strip_suffix("%20") {
            name = n;
        } else {
            return name;
        }
    }
}

/// [`split_prefix`], comparing as `case` says.
pub fn split_prefix_as<'a>(
    prefix: &'a str,
    strip: bool,
    path: &'a str,
    case: Case,
) -> Option<(&'a str, &'a str)> {
    if prefix == "/" {
        return Some(("", path));
    }
    let rest = beneath(prefix, path, case)?;
    Some(match (strip, rest) {
        (false, _) => ("", path),
        (true, "") => (prefix, "/"),
        (true, rest) => (prefix, rest),
    })
}

/// What of `path` lies beneath `prefix` (not `/`): `Some("")` for the prefix itself, `/...`
/// below it, `None` when `prefix` does not cover `path`. See [`split_prefix`].
fn beneath<'a>(prefix: &str, path: &'a str, case: Case) -> Option<&'a str> {
    let same = |a: &str, b: &str| match case {
        Case::Sensitive => a == b,
        Case::Folded => a.eq_ignore_ascii_case(b),
        Case::Windows => windows_name(a).eq_ignore_ascii_case(windows_name(b)),
    };
    if let Some(head) = path.get(..prefix.len()) {
        let rest = &path[prefix.len()..];
        if same(head, prefix) && (rest.is_empty() || rest.starts_with('/')) {
            return Some(rest);
        }
    }
    if case != Case::Windows && !has_parameters(path) {
        return None;
    }
    // segment by segment, each path segment's name without its parameters
    let mut rest = path;
    for want in prefix.strip_prefix('/')?.split('/') {
        rest = rest.strip_prefix('/')?;
        let end = rest.find('/').unwrap_or(rest.len());
        if !same(segment_name(&rest[..end]), want) {
            return None;
        }
        rest = &rest[end..];
    }
    Some(rest)
}

/// Does `path` carry a path parameter (a `;`, raw or encoded as `%3B`)?
pub fn has_parameters(path: &str) -> bool {
    let b = path.as_bytes();
    b.contains(&b';')
        || b.windows(3)
            .any(|w| w[0] == b'%' && w[1] == b'3' && (w[2] | 0x20) == b'b')
}

/// A segment's name: what comes before its first parameter (`;` or `%3B`).
fn segment_name(segment: &str) -> &str {
    let b = segment.as_bytes();
    let end = (0..b.len())
        .find(|&i| {
            b[i] == b';'
                || (b[i] == b'%'
                    && b.get(i + 1) == Some(&b'3')
                    && b.get(i + 2).is_some_and(|c| (c | 0x20) == b'b'))
        })
        .unwrap_or(b.len());
    &segment[..end]
}

/// Does `prefix` cover `path`? See [`split_prefix`].
pub fn covers(prefix: &str, path: &str) -> bool {
    split_prefix(prefix, false, path).is_some()
}

/// Does `prefix` cover `path` as `case` compares? See [`split_prefix_as`].
pub fn covers_as(prefix: &str, path: &str, case: Case) -> bool {
    split_prefix_as(prefix, false, path, case).is_some()
}

fn normalize_with(raw: &str, separators: Separators) -> Result<String, PathError> {
    if already_normal(raw.as_bytes()) {
        return Ok(raw.to_owned());
    }
    normalize_fully(raw, separators)
}

/// A path that normalisation leaves as it is (most paths): printable ASCII without escapes or
/// backslashes, no empty segment inside it and no segment that starts with a dot (dot
/// segments, `.;` tricks; dotfiles take the full path too). One pass, no allocation but the
/// result: the full normalisation allocated three buffers.
fn already_normal(b: &[u8]) -> bool {
    b.first() == Some(&b'/')
        && b.iter()
            .all(|&c| (0x21..0x7f).contains(&c) && c != b'%' && c != b'\\')
        && !b
            .windows(2)
            .any(|w| w[0] == b'/' && (w[1] == b'/' || w[1] == b'.'))
}

/// [`normalize_with`] for any path: decodes, refuses, removes dot and empty segments.
fn normalize_fully(raw: &str, separators: Separators) -> Result<String, PathError> {
    let bytes = raw.as_bytes();
    if bytes.first() != Some(&b'/') {
        return Err(PathError::NotAbsolute);
    }
    // Pass 1: decode unreserved escapes, refuse the dangerous ones.
    let mut decoded: Vec<u8> = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let (h, l) = match (bytes.get(i + 1), bytes.get(i + 2)) {
                (Some(&h), Some(&l)) => (h, l),
                _ => return Err(PathError::BadEscape),
            };
            let v = match (hex(h), hex(l)) {
                (Some(h), Some(l)) => h << 4 | l,
                _ => return Err(PathError::BadEscape),
            };
            let separator = matches!(v, b'/' | b'\\');
            if v == 0 || (separator && separators == Separators::Refuse) {
                return Err(PathError::Forbidden);
            }
            if separator && separators == Separators::Split {
                decoded.push(b'/');
            } else if unreserved(v) {
                decoded.push(v);
            } else {
                decoded.extend_from_slice(&[b'%', HEX[(v >> 4) as usize], HEX[(v & 15) as usize]]);
            }
            i += 3;
            continue;
        }
        if b == b'\\' || b < 0x20 || b == 0x7f {
            return Err(PathError::Forbidden);
        }
        decoded.push(b);
        i += 1;
    }
    // Pass 2: remove dot segments and empty segments.
    let mut out: Vec<&[u8]> = Vec::new();
    let mut trailing_slash = false;
    for seg in decoded[1..].split(|&b| b == b'/') {
        trailing_slash = false;
        match seg {
            b"" | b"." => trailing_slash = true,
            b".." => {
                if out.pop().is_none() {
                    return Err(PathError::AboveRoot);
                }
                trailing_slash = true;
            }
            s if s.starts_with(b"..;") || s.starts_with(b".;") => return Err(PathError::Forbidden),
            s => out.push(s),
        }
    }
    let mut path = Vec::with_capacity(decoded.len());
    for seg in &out {
        path.push(b'/');
        path.extend_from_slice(seg);
    }
    if trailing_slash || path.is_empty() {
        path.push(b'/');
    }
    // Only ASCII bytes of the (ASCII) input and hex digits were written.
    String::from_utf8(path).map_err(|_| PathError::Forbidden)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fast path answers exactly as the full normalisation, for every path made of
    /// up to four pieces of a hostile alphabet (escapes, dots, `;`, separators, controls).
    #[test]
    fn paths_left_as_they_are_match_the_full_normalisation() {
        let pieces = [
            "/", "a", ".", "..", ";", "%2e", "%2f", "%5C", "\\", "%41", "~", "\u{7f}", " ", "é",
            ".;", "%", "b/",
        ];
        let mut paths = vec![String::new()];
        let mut last = paths.clone();
        for _ in 0..4 {
            last = last
                .iter()
                .flat_map(|p| pieces.iter().map(move |piece| format!("{p}{piece}")))
                .collect();
            paths.extend(last.iter().cloned());
        }
        let mut fast = 0;
        for p in &paths {
            for sep in [Separators::Refuse, Separators::Keep, Separators::Split] {
                assert_eq!(
                    normalize_with(p, sep),
                    normalize_fully(p, sep),
                    "{p:?} {sep:?}"
                );
            }
            fast += usize::from(already_normal(p.as_bytes()));
        }
        assert!(
            fast > 200,
            "the fast path took {fast} of {} paths",
            paths.len()
        );
    }

    #[test]
    fn normalises_like_rfc3986_and_nginx() {
        for (raw, want) in [
            ("/", "/"),
            ("/a/b", "/a/b"),
            ("/a/b/", "/a/b/"),
            ("//up/x", "/up/x"),
            ("/up//x//", "/up/x/"),
            ("/up/./x", "/up/x"),
            ("/t/../up/x", "/up/x"),
            ("/a/b/..", "/a/"),
            ("/a/b/.", "/a/b/"),
            ("/a/%2e%2E/b", "/b"),
            ("/a/%2e/b", "/a/b"),
            ("/%41%7e%5f", "/A~_"),
            ("/a%20b", "/a%20b"),
            ("/a%3fb", "/a%3Fb"),
            ("/%e2%82%ac", "/%E2%82%AC"),
            ("/..a/b..", "/..a/b.."),
            ("/files/..", "/"),
        ] {
            assert_eq!(normalize(raw).as_deref(), Ok(want), "{raw}");
        }
    }

    #[test]
    fn refuses_escapes_and_climbs() {
        for (raw, why) in [
            ("/..", PathError::AboveRoot),
            ("/../x", PathError::AboveRoot),
            ("/files/../../x", PathError::AboveRoot),
            ("/%2e%2e/x", PathError::AboveRoot),
            ("/files/..%2finternal.txt", PathError::Forbidden),
            ("/files/..%2Finternal.txt", PathError::Forbidden),
            ("/a%5c..%5cb", PathError::Forbidden),
            ("/a\\b", PathError::Forbidden),
            ("/a%00b", PathError::Forbidden),
            ("/a\tb", PathError::Forbidden),
            ("/a%zz", PathError::BadEscape),
            ("/a%2", PathError::BadEscape),
            ("/a%", PathError::BadEscape),
            ("/files/..;/internal.txt", PathError::Forbidden),
            ("/files/..;x=1/y", PathError::Forbidden),
            ("/files/%2e%2e;/y", PathError::Forbidden),
            ("/files/.;/y", PathError::Forbidden),
            ("/a/.%2E;/y", PathError::Forbidden),
            ("a/b", PathError::NotAbsolute),
            ("*", PathError::NotAbsolute),
            ("", PathError::NotAbsolute),
        ] {
            assert_eq!(normalize(raw), Err(why), "{raw}");
        }
    }

    #[test]
    fn separators_kept_for_raw_routes() {
        assert_eq!(
            normalize_keeping_separators("/raw/a%2fb/./c").as_deref(),
            Ok("/raw/a%2Fb/c")
        );
        assert_eq!(
            normalize_keeping_separators("/a%00"),
            Err(PathError::Forbidden)
        );
    }

    #[test]
    fn decoded_separators_are_segment_boundaries() {
        for (raw, want) in [
            ("/files/a%2fb", Ok("/files/a/b")),
            ("/files/..%2finternal.txt", Ok("/internal.txt")),
            ("/files/%2e%2e%2Finternal.txt", Ok("/internal.txt")),
            ("/files/x/..%2f..%2fy", Ok("/y")),
            ("/files/..%5cy", Ok("/y")),
            ("/files/x/..%2f..%2f..%2fy", Err(PathError::AboveRoot)),
            ("/files/..%2f..;/y", Err(PathError::Forbidden)),
            ("/a%00", Err(PathError::Forbidden)),
        ] {
            assert_eq!(
                normalize_decoding_separators(raw)
                    .as_deref()
                    .map_err(|e| *e),
                want,
                "{raw}"
            );
        }
    }

    #[test]
    fn prefix_split_covers_whole_segments() {
        for (prefix, strip, path, want) in [
            ("/", false, "/anything", Some(("", "/anything"))),
            ("/", true, "/anything", Some(("", "/anything"))),
            ("/api", false, "/api", Some(("", "/api"))),
            ("/api", true, "/api", Some(("/api", "/"))),
            ("/api", false, "/api/x", Some(("", "/api/x"))),
            ("/api", true, "/api/x/y", Some(("/api", "/x/y"))),
            ("/api", true, "/api/", Some(("/api", "/"))),
            ("/api", true, "/apix", None),
            ("/api", false, "/apix/y", None),
            ("/api", false, "/", None),
            ("/a/b", true, "/a/b/c", Some(("/a/b", "/c"))),
            ("/a/b", true, "/a/bc", None),
        ] {
            assert_eq!(split_prefix(prefix, strip, path), want, "{prefix} {path}");
            assert_eq!(covers(prefix, path), want.is_some(), "{prefix} {path}");
        }
    }

    /// Issue 41, item 1: a segment's `;` parameters (raw or `%3B`, any case of the hex) do
    /// not take it out of its prefix, as Tomcat, Jetty and Spring read it.
    #[test]
    fn parameters_stay_beneath_their_prefix() {
        for (path, strip, want) in [
            ("/admin;x", true, Some(("/admin", "/"))),
            ("/admin;", true, Some(("/admin", "/"))),
            (
                "/admin;jsessionid=1",
                false,
                Some(("", "/admin;jsessionid=1")),
            ),
            ("/admin;/", true, Some(("/admin", "/"))),
            ("/admin;x/", true, Some(("/admin", "/"))),
            ("/admin;/x", true, Some(("/admin", "/x"))),
            ("/admin%3Bx/y", true, Some(("/admin", "/y"))),
            ("/admin%3bx/y", true, Some(("/admin", "/y"))),
            ("/admin/x;y", true, Some(("/admin", "/x;y"))),
            ("/adminx;y", true, None),
            ("/admi;n", true, None),
            ("/;admin", true, None),
            ("/admin%3Ax", true, None),
        ] {
            assert_eq!(split_prefix("/admin", strip, path), want, "{path}");
        }
        assert_eq!(
            split_prefix("/a/b", true, "/a;x/b;y/c"),
            Some(("/a/b", "/c"))
        );
        assert_eq!(split_prefix("/a/b", true, "/a;x/bc"), None);
        assert_eq!(split_prefix("/a/b", true, "/a;x"), None);
    }

    #[test]
    fn folded_case_compares_without_case() {
        for (path, sensitive, folded) in [
            ("/admin", true, true),
            ("/ADMIN", false, true),
            ("/Admin/x", false, true),
            ("/aDmIn;x/y", false, true),
            ("/ADMINX", false, false),
            ("/", false, false),
        ] {
            assert_eq!(
                covers_as("/admin", path, Case::Sensitive),
                sensitive,
                "{path}"
            );
            assert_eq!(covers_as("/admin", path, Case::Folded), folded, "{path}");
        }
    }

    #[test]
    fn windows_reads_trailing_dots_and_spaces_away() {
        for (path, trims, windows) in [
            ("/admin", false, true),
            ("/admin.", true, true),
            ("/ADMIN../x", true, true),
            ("/admin%20", true, true),
            ("/admin.%20.;x/y", true, true),
            ("/adminx.", true, false),
            ("/x/admin.", true, false),
            ("/admin.x", false, false),
            ("/admin::$DATA", true, true),
            ("/admin%3A%3A$DATA/x", true, true),
            ("/admin:stream.", true, true),
            ("/adminx::$DATA", true, false),
            ("/", false, false),
        ] {
            assert_eq!(windows_trims(path), trims, "{path}");
            assert_eq!(covers_as("/admin", path, Case::Windows), windows, "{path}");
        }
        assert!(covers_as("/a/b", "/a./B%20/c", Case::Windows));
        assert!(!covers_as("/a/b", "/a./c", Case::Windows));
    }

    #[test]
    fn output_is_a_fixed_point() {
        for raw in ["/a/./b/../c//d/", "/%41/%2e%2e/x%20y", "/x/y/z/../../w"] {
            let once = normalize(raw).unwrap();
            assert_eq!(normalize(&once).unwrap(), once, "{raw}");
        }
    }
}
