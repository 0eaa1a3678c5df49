//! Request heads: where one ends in the read buffer ([`head_end`]), then one `httparse` pass
//! that builds the request's parts and decides its framing, keep-alive and expectations
//! ([`parse`]). Nothing is scanned twice: a head trickled in byte by byte is searched for its
//! blank line from where the last search stopped, and parsed once, when it is complete.

use std::mem::MaybeUninit;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Uri, Version};

/// Why a request head was refused. Each is answered with [`HeadError::status`], and the
/// connection is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeadError {
    /// The head breaks the grammar of RFC 9112 (or a framing rule): 400.
    #[error("malformed request head: {0}")]
    Malformed(&'static str),
    /// The head is longer than the connection may buffer: 431.
    #[error("request head over {0} bytes")]
    TooLarge(usize),
    /// More header fields than allowed: 431.
    #[error("more than {0} header fields")]
    TooManyFields(usize),
    /// A request target longer than a URI may be (64 KiB): 414.
    #[error("request target too long")]
    TargetTooLong,
    /// A well-formed version other than HTTP/1.x (`HTTP/2.0`, `HTTP/9.9`): 505.
    #[error("HTTP version not supported")]
    Version,
}

impl HeadError {
    /// The status the client is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            HeadError::Malformed(_) => StatusCode::BAD_REQUEST,
            HeadError::TooLarge(_) | HeadError::TooManyFields(_) => {
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
            }
            HeadError::TargetTooLong => StatusCode::URI_TOO_LONG,
            HeadError::Version => StatusCode::HTTP_VERSION_NOT_SUPPORTED,
        }
    }
}

/// How a request's body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    Empty,
    /// `Content-Length` bytes (more than 0).
    Length(u64),
    /// The chunked coding.
    Chunked,
}

/// A parsed request head.
#[derive(Debug)]
pub struct Head {
    /// The request line and the fields.
    pub parts: http::request::Parts,
    /// The body's framing.
    pub framing: Framing,
    /// The connection may carry another request after this one: HTTP/1.1 without
    /// `Connection: close`, or HTTP/1.0 with `Connection: keep-alive`; never after a request
    /// whose framing is in doubt (`Transfer-Encoding` with `Content-Length`).
    pub keep_alive: bool,
    /// `Expect: 100-continue` (HTTP/1.1 with a body): the client waits for a 100 before it
    /// sends the body.
    pub expect_continue: bool,
    /// `TE: trailers`: the client accepts trailer fields in a chunked response.
    pub te_trailers: bool,
    /// `Upgrade` or `CONNECT`: after a 101 the bytes that follow are another protocol's.
    pub upgrade: bool,
}

/// The limits of a head.
#[derive(Debug, Clone, Copy)]
pub struct HeadLimits {
    /// Bytes from the request line to the blank line, inclusive.
    pub max_size: usize,
    /// Header fields.
    pub max_fields: usize,
}

/// `http::Uri`'s own limit.
const MAX_TARGET: usize = u16::MAX as usize - 1;

/// Fields parsed into a buffer on the stack; more go to the heap (up to the limit).
const STACK_FIELDS: usize = 64;

/// Removes the empty lines a client may send before a request line (RFC 9112 §2.2: a
/// server SHOULD ignore at least one). Returns how many bytes were removed.
pub fn skip_empty_lines(buf: &mut BytesMut) -> usize {
    let n = buf
        .iter()
        .take_while(|&&b| b == b'\r' || b == b'\n')
        .count();
    buf.advance(n);
    n
}

/// Where the head that starts `buf` ends (just past its blank line), looking for the blank
/// line from `*searched` on; when it is not there yet, `*searched` is moved to where the next
/// search resumes, so that a head trickled in byte by byte is not searched again and again.
pub fn head_end(buf: &[u8], searched: &mut usize) -> Option<usize> {
    let mut at = *searched;
    while let Some(i) = memchr::memchr(b'\n', &buf[at.min(buf.len())..]) {
        let lf = at + i;
        match (buf.get(lf + 1), buf.get(lf + 2)) {
            (Some(b'\n'), _) => return Some(lf + 2),
            (Some(b'\r'), Some(b'\n')) => return Some(lf + 3),
            // the next line's first bytes are not there yet: look at this LF again
            (None, _) | (Some(b'\r'), None) => {
                *searched = lf;
                return None;
            }
            _ => at = lf + 1,
        }
    }
    *searched = buf.len();
    None
}

/// Parses the head that ends at `end` (from [`head_end`]) and takes it off the front of `buf`.
pub fn parse(buf: &mut BytesMut, end: usize, limits: HeadLimits) -> Result<Head, HeadError> {
    if end > limits.max_size {
        return Err(HeadError::TooLarge(limits.max_size));
    }
    let raw = buf.split_to(end).freeze();
    let mut stack = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; STACK_FIELDS];
    let mut req = httparse::Request::new(&mut []);
    match req.parse_with_uninit_headers(&raw, &mut stack) {
        // the stack buffer holds STACK_FIELDS whatever the limit: a lower limit is checked here
        Ok(httparse::Status::Complete(_)) if req.headers.len() > limits.max_fields => {
            Err(HeadError::TooManyFields(limits.max_fields))
        }
        Ok(httparse::Status::Complete(_)) => build(&raw, &req),
        Err(httparse::Error::TooManyHeaders) if limits.max_fields > STACK_FIELDS => {
            let mut heap = Vec::new();
            heap.resize_with(limits.max_fields, MaybeUninit::uninit);
            let mut req = httparse::Request::new(&mut []);
            match req.parse_with_uninit_headers(&raw, &mut heap) {
                Ok(httparse::Status::Complete(_)) => build(&raw, &req),
                Ok(httparse::Status::Partial) => Err(HeadError::Malformed("incomplete head")),
                Err(e) => Err(refusal(e, &raw, limits)),
            }
        }
        Ok(httparse::Status::Partial) => Err(HeadError::Malformed("incomplete head")),
        Err(e) => Err(refusal(e, &raw, limits)),
    }
}

fn refusal(e: httparse::Error, raw: &[u8], limits: HeadLimits) -> HeadError {
    match e {
        httparse::Error::TooManyHeaders => HeadError::TooManyFields(limits.max_fields),
        httparse::Error::Version if other_version(raw) => HeadError::Version,
        httparse::Error::Version => HeadError::Malformed("version"),
        httparse::Error::Token => HeadError::Malformed("method or target"),
        httparse::Error::HeaderName => HeadError::Malformed("field name"),
        httparse::Error::HeaderValue => HeadError::Malformed("field value"),
        httparse::Error::NewLine | httparse::Error::Status => HeadError::Malformed("line ending"),
    }
}

/// The request line ends in a well-formed version that is not HTTP/1.x (`HTTP/2.0`).
fn other_version(raw: &[u8]) -> bool {
    let line_end = memchr::memchr(b'\n', raw).unwrap_or(raw.len());
    let line = raw[..line_end]
        .strip_suffix(b"\r")
        .unwrap_or(&raw[..line_end]);
    let Some(sp) = memchr::memrchr(b' ', line) else {
        return false;
    };
    match &line[sp + 1..] {
        [b'H', b'T', b'T', b'P', b'/', major, b'.', minor] => {
            major.is_ascii_digit() && minor.is_ascii_digit() && *major != b'1'
        }
        _ => false,
    }
}

fn build(raw: &Bytes, req: &httparse::Request<'_, '_>) -> Result<Head, HeadError> {
    let (Some(method), Some(target), Some(minor)) = (req.method, req.path, req.version) else {
        return Err(HeadError::Malformed("request line"));
    };
    let method =
        Method::from_bytes(method.as_bytes()).map_err(|_| HeadError::Malformed("method"))?;
    if target.len() > MAX_TARGET {
        return Err(HeadError::TargetTooLong);
    }
    let uri = Uri::from_maybe_shared(raw.slice_ref(target.as_bytes()))
        .map_err(|_| HeadError::Malformed("request target"))?;
    let version = if minor == 1 {
        Version::HTTP_11
    } else {
        Version::HTTP_10
    };
    let mut headers = HeaderMap::with_capacity(req.headers.len());
    let mut length: Option<u64> = None;
    // `Some(chunked is the final coding)` once a Transfer-Encoding field was seen
    let mut coding: Option<bool> = None;
    let (mut close, mut keep) = (false, false);
    let (mut expect_continue, mut te_trailers) = (false, false);
    let mut upgrade = method == Method::CONNECT;
    for f in req.headers.iter() {
        let name = HeaderName::from_bytes(f.name.as_bytes())
            .map_err(|_| HeadError::Malformed("field name"))?;
        let value = HeaderValue::from_maybe_shared(raw.slice_ref(f.value))
            .map_err(|_| HeadError::Malformed("field value"))?;
        match name {
            header::CONTENT_LENGTH => {
                let n = content_length(f.value).ok_or(HeadError::Malformed("Content-Length"))?;
                if length.is_some_and(|l| l != n) {
                    return Err(HeadError::Malformed("Content-Length values differ"));
                }
                length = Some(n);
            }
            header::TRANSFER_ENCODING => {
                if version == Version::HTTP_10 {
                    // RFC 9112 §6.1: framing in doubt; hyper and nginx refuse it too
                    return Err(HeadError::Malformed("Transfer-Encoding in HTTP/1.0"));
                }
                let last = f
                    .value
                    .rsplit(|&b| b == b',')
                    .map(|t| t.trim_ascii())
                    .find(|t| !t.is_empty());
                coding = Some(last.is_some_and(|t| t.eq_ignore_ascii_case(b"chunked")));
            }
            header::CONNECTION => {
                for t in tokens(f.value) {
                    close |= t.eq_ignore_ascii_case(b"close");
                    keep |= t.eq_ignore_ascii_case(b"keep-alive");
                }
            }
            header::EXPECT => {
                expect_continue |= f.value.trim_ascii().eq_ignore_ascii_case(b"100-continue");
            }
            header::TE => {
                te_trailers |= tokens(f.value).any(|t| t.eq_ignore_ascii_case(b"trailers"))
            }
            header::UPGRADE => upgrade = true,
            _ => {}
        }
        headers.append(name, value);
    }
    let mut keep_alive = !close && (version == Version::HTTP_11 || keep);
    let framing = match (coding, length) {
        // RFC 9112 §6.3 (4): chunked not final: the length cannot be known; 400 and close
        (Some(false), _) => {
            return Err(HeadError::Malformed(
                "Transfer-Encoding not ending in chunked",
            ))
        }
        (Some(true), cl) => {
            if cl.is_some() {
                // RFC 9112 §6.3 (3): chunked wins, and the connection MUST close after this
                // response; the request rules answer 400 (the field is kept for them)
                keep_alive = false;
            }
            Framing::Chunked
        }
        (None, Some(0) | None) => Framing::Empty,
        (None, Some(n)) => Framing::Length(n),
    };
    let mut parts = http::Request::new(()).into_parts().0;
    parts.method = method;
    parts.uri = uri;
    parts.version = version;
    parts.headers = headers;
    Ok(Head {
        parts,
        framing,
        keep_alive,
        expect_continue: expect_continue
            && version == Version::HTTP_11
            && framing != Framing::Empty,
        te_trailers,
        upgrade,
    })
}

/// The comma-separated tokens of a field value, trimmed, empty ones left out.
pub fn tokens(v: &[u8]) -> impl Iterator<Item = &[u8]> {
    v.split(|&b| b == b',')
        .map(|t| t.trim_ascii())
        .filter(|t| !t.is_empty())
}

/// `Content-Length = 1*DIGIT` (RFC 9110 §8.6), at most 19 digits (no overflow); no sign, no
/// list.
pub fn content_length(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(v.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0')))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: HeadLimits = HeadLimits {
        max_size: 32 * 1024,
        max_fields: 100,
    };

    fn head(s: &str) -> Result<Head, HeadError> {
        let mut b = BytesMut::from(s);
        skip_empty_lines(&mut b);
        let mut searched = 0;
        let end = head_end(&b, &mut searched).expect("complete head");
        parse(&mut b, end, LIMITS)
    }

    #[test]
    fn finds_the_end_of_a_head_trickled_in_byte_by_byte() {
        let full = b"GET / HTTP/1.1\r\nHost: a\r\n\r\nrest";
        let mut searched = 0;
        for n in 0..full.len() {
            let got = head_end(&full[..n], &mut searched);
            if n < 27 {
                assert_eq!(got, None, "{n}");
                assert!(searched <= n);
            } else {
                assert_eq!(got, Some(27), "{n}");
            }
        }
        let mut s = 0;
        assert_eq!(head_end(b"GET / HTTP/1.1\nHost: a\n\nx", &mut s), Some(24));
    }

    #[test]
    fn a_simple_request() {
        let h = head("\r\nGET /a?b HTTP/1.1\r\nHost: x\r\nX-A: 1\r\nX-A: 2\r\n\r\n").unwrap();
        assert_eq!(h.parts.method, Method::GET);
        assert_eq!(h.parts.uri, "/a?b");
        assert_eq!(h.parts.version, Version::HTTP_11);
        assert_eq!(h.parts.headers.get_all("x-a").iter().count(), 2);
        assert_eq!(h.framing, Framing::Empty);
        assert!(h.keep_alive && !h.expect_continue && !h.upgrade);
    }

    #[test]
    fn framing_and_keep_alive() {
        let h = head("POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n").unwrap();
        assert_eq!(h.framing, Framing::Length(5));
        let h = head("POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n").unwrap();
        assert_eq!(h.framing, Framing::Chunked);
        let h = head("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n")
            .unwrap();
        assert_eq!(h.framing, Framing::Chunked);
        assert!(!h.keep_alive, "TE with CL never keeps the connection");
        assert!(
            h.parts.headers.contains_key("content-length"),
            "kept for the rules"
        );
        let h = head("GET / HTTP/1.0\r\n\r\n").unwrap();
        assert!(!h.keep_alive);
        let h = head("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").unwrap();
        assert!(h.keep_alive);
        let h = head("GET / HTTP/1.1\r\nConnection: keep-alive, close\r\n\r\n").unwrap();
        assert!(!h.keep_alive);
        let h =
            head("PUT / HTTP/1.1\r\nContent-Length: 1\r\nExpect: 100-Continue\r\n\r\n").unwrap();
        assert!(h.expect_continue);
        let h = head("GET / HTTP/1.1\r\nExpect: 100-continue\r\n\r\n").unwrap();
        assert!(!h.expect_continue, "no body, nothing to wait for");
        let h = head("GET / HTTP/1.1\r\nTE: gzip, trailers\r\nUpgrade: websocket\r\n\r\n").unwrap();
        assert!(h.te_trailers && h.upgrade);
    }

    #[test]
    fn refusals() {
        use HeadError::*;
        for (req, want) in [
            ("GARBAGE\r\n\r\n", Malformed("")),
            ("GET / HTTP/1.1\r\nBad Name: y\r\n\r\n", Malformed("")),
            ("GET / HTTP/1.1\r\nHost : y\r\n\r\n", Malformed("")),
            ("GET / HTTP/1.1\r\nX: a\r\n b\r\n\r\n", Malformed("")),
            ("GET / HTTP/1.1\r\nX: a\rb\r\n\r\n", Malformed("")),
            ("GET /\x01 HTTP/1.1\r\n\r\n", Malformed("")),
            (
                "GET / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
                Malformed(""),
            ),
            (
                "GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
                Malformed(""),
            ),
            (
                "GET / HTTP/1.1\r\nContent-Length: +1\r\n\r\n",
                Malformed(""),
            ),
            (
                "GET / HTTP/1.1\r\nContent-Length: 1, 1\r\n\r\n",
                Malformed(""),
            ),
            (
                "GET / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
                Malformed(""),
            ),
            (
                "POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
                Malformed(""),
            ),
            (
                "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n\r\n",
                Malformed(""),
            ),
            (
                "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
                Malformed(""),
            ),
            ("GET / HTTP/9.9\r\n\r\n", Version),
            ("PRI * HTTP/2.0\r\n\r\n", Version),
            ("GET / HTTP/1.1x\r\n\r\n", Malformed("")),
        ] {
            let got = head(req).expect_err(req);
            assert_eq!(
                std::mem::discriminant(&got),
                std::mem::discriminant(&want),
                "{req:?}: {got}"
            );
        }
    }

    #[test]
    fn limits_of_size_and_fields() {
        let many: String = (0..101).map(|i| format!("X-{i}: v\r\n")).collect();
        let got = head(&format!("GET / HTTP/1.1\r\n{many}\r\n")).unwrap_err();
        assert_eq!(got, HeadError::TooManyFields(100));
        let ok: String = (0..100).map(|i| format!("X-{i}: v\r\n")).collect();
        assert_eq!(
            head(&format!("GET / HTTP/1.1\r\n{ok}\r\n"))
                .unwrap()
                .parts
                .headers
                .len(),
            100
        );
        // a limit under the parser's stack buffer (64 fields) holds too (found by fuzzing)
        let few = HeadLimits {
            max_size: 1024,
            max_fields: 3,
        };
        let mut b = BytesMut::from("GET / HTTP/1.1\r\na:1\r\nb:1\r\nc:1\r\nd:1\r\n\r\n");
        let end = b.len();
        assert_eq!(
            parse(&mut b, end, few).unwrap_err(),
            HeadError::TooManyFields(3)
        );
        let mut b = BytesMut::from("GET / HTTP/1.1\r\na:1\r\nb:1\r\nc:1\r\n\r\n");
        let end = b.len();
        assert_eq!(parse(&mut b, end, few).unwrap().parts.headers.len(), 3);
        let big = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(40 * 1024));
        assert_eq!(head(&big).unwrap_err(), HeadError::TooLarge(32 * 1024));
    }
}
