//! Response heads and body framing (RFC 9112 §4, §6, §7).
//!
//! The status line is always `HTTP/1.1`, also to an HTTP/1.0 client: RFC 9110 §2.5 says a
//! server sends the highest version it conforms to whose major version the client sent
//! (nginx does the same; hyper answered `HTTP/1.0`). What such a client cannot read (chunked
//! coding) it is never sent: a body of unknown length is then delimited by closing the
//! connection.

use std::cell::RefCell;

use http::header::{self, HeaderMap, HeaderName};
use http::{Method, StatusCode, Version};

/// What the request said that shapes its response.
#[derive(Debug, Clone, Copy)]
pub struct Asked {
    /// `HEAD`: the head only.
    pub head: bool,
    /// The request's version.
    pub version: Version,
    /// The connection may carry another request after this response.
    pub keep_alive: bool,
    /// `TE: trailers`.
    pub te_trailers: bool,
}

impl Asked {
    /// From the request's method and the parsed head's flags.
    pub fn new(method: &Method, version: Version, keep_alive: bool, te_trailers: bool) -> Self {
        Asked {
            head: method == Method::HEAD,
            version,
            keep_alive,
            te_trailers,
        }
    }
}

/// How the response body goes out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Framing {
    /// No body bytes (HEAD, 1xx, 204, 304, or a known empty body).
    None,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked; the trailer fields the `Trailer` field announced, when the client accepts
    /// trailers.
    Chunked(Option<Box<[HeaderName]>>),
    /// Until the connection closes (HTTP/1.0 and an unknown length).
    Close,
}

/// The encoded head's consequences.
#[derive(Debug)]
pub struct Encoded {
    /// How the body is framed.
    pub framing: Framing,
    /// The connection is kept after this response.
    pub keep_alive: bool,
}

/// What the response's body says of itself.
#[derive(Debug, Clone, Copy)]
pub struct BodyHint {
    /// It is known to be empty.
    pub empty: bool,
    /// Its exact length, when known.
    pub exact: Option<u64>,
}

/// Writes the head of a response with `status` and `headers` to `dst`.
pub fn head(
    status: StatusCode,
    headers: &HeaderMap,
    body: BodyHint,
    asked: Asked,
    dst: &mut Vec<u8>,
) -> Encoded {
    let mut keep_alive = asked.keep_alive;
    // RFC 9110 §6.4.1: no content for HEAD, 1xx, 204, 304
    let no_content = status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let can_body = !no_content && !asked.head;
    let chunk_ok = can_body && asked.version == Version::HTTP_11;
    status_line(dst, status);
    // what the response's own `Connection` fields say
    let (mut said_close, mut said_keep) = (false, false);
    let mut length: Option<u64> = None;
    let (mut date, mut server) = (false, false);
    let mut trailer_names: Option<Vec<HeaderName>> = None;
    for (name, value) in headers {
        match *name {
            header::CONTENT_LENGTH => {
                // the first valid value is the length; others are dropped
                if length.is_none() && !no_content {
                    length = super::parse::content_length(value.as_bytes());
                }
                continue;
            }
            // framing and connection fields are this layer's to write
            header::TRANSFER_ENCODING => continue,
            header::CONNECTION => {
                for t in super::parse::tokens(value.as_bytes()) {
                    said_close |= t.eq_ignore_ascii_case(b"close");
                    said_keep |= t.eq_ignore_ascii_case(b"keep-alive");
                }
                keep_alive &= !said_close;
                continue;
            }
            header::DATE => date = true,
            header::SERVER => server = true,
            header::TRAILER => {
                if !chunk_ok {
                    continue;
                }
                let names = trailer_names.get_or_insert_with(Vec::new);
                if let Ok(v) = value.to_str() {
                    names.extend(
                        v.split(',')
                            .filter_map(|s| HeaderName::from_bytes(s.trim().as_bytes()).ok()),
                    );
                }
            }
            _ => {}
        }
        field(dst, name.as_str().as_bytes(), value.as_bytes());
    }
    // (101 is informational: no content, the bytes after its head are the tunnel's)
    let framing = if no_content {
        Framing::None
    } else if let Some(n) = length
        .or(body.exact)
        .filter(|_| !body.empty || length.is_some())
    {
        length_field(dst, n);
        if asked.head {
            Framing::None
        } else {
            Framing::Length(n)
        }
    } else if body.empty {
        if !asked.head {
            dst.extend_from_slice(b"content-length: 0\r\n");
        }
        Framing::None
    } else if asked.head {
        Framing::None
    } else if chunk_ok {
        dst.extend_from_slice(b"transfer-encoding: chunked\r\n");
        let allowed = trailer_names
            .filter(|_| asked.te_trailers)
            .map(|n| n.into_iter().filter(valid_trailer).collect());
        Framing::Chunked(allowed)
    } else {
        keep_alive = false;
        Framing::Close
    };
    if status != StatusCode::SWITCHING_PROTOCOLS {
        connection_fields(
            dst,
            headers,
            asked.version,
            keep_alive,
            (said_close, said_keep),
        );
    } else {
        for v in headers.get_all(header::CONNECTION) {
            field(dst, b"connection", v.as_bytes());
        }
    }
    if !server {
        field(dst, b"server", crate::response::SERVER.as_bytes());
    }
    if !date {
        with_date(|d| field(dst, b"date", d));
    }
    dst.extend_from_slice(b"\r\n");
    Encoded {
        framing,
        keep_alive,
    }
}

/// The response's own `Connection` values, with `close` added when the connection ends
/// (HTTP/1.1) or `keep-alive` when an HTTP/1.0 client's connection is kept.
/// `said`: whether those fields already say `close`, `keep-alive`.
fn connection_fields(
    dst: &mut Vec<u8>,
    headers: &HeaderMap,
    version: Version,
    keep_alive: bool,
    (said_close, said_keep): (bool, bool),
) {
    for v in headers.get_all(header::CONNECTION) {
        if keep_alive
            || !v
                .as_bytes()
                .trim_ascii()
                .eq_ignore_ascii_case(b"keep-alive")
        {
            field(dst, b"connection", v.as_bytes());
        }
    }
    if !keep_alive && version == Version::HTTP_11 && !said_close {
        dst.extend_from_slice(b"connection: close\r\n");
    } else if keep_alive && version == Version::HTTP_10 && !said_keep {
        dst.extend_from_slice(b"connection: keep-alive\r\n");
    }
}

/// `HTTP/1.1 <code> <reason>` and its CRLF.
fn status_line(dst: &mut Vec<u8>, status: StatusCode) {
    if status == StatusCode::OK {
        dst.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
        return;
    }
    dst.extend_from_slice(b"HTTP/1.1 ");
    dst.extend_from_slice(status.as_str().as_bytes());
    dst.push(b' ');
    dst.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    dst.extend_from_slice(b"\r\n");
}

fn field(dst: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    dst.extend_from_slice(name);
    dst.extend_from_slice(b": ");
    dst.extend_from_slice(value);
    dst.extend_from_slice(b"\r\n");
}

fn length_field(dst: &mut Vec<u8>, n: u64) {
    dst.extend_from_slice(b"content-length: ");
    dst.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    dst.extend_from_slice(b"\r\n");
}

/// Fields that never go in a trailer (RFC 9110 §6.5.1; hyper's list).
fn valid_trailer(name: &HeaderName) -> bool {
    !matches!(
        *name,
        header::AUTHORIZATION
            | header::CACHE_CONTROL
            | header::CONTENT_ENCODING
            | header::CONTENT_LENGTH
            | header::CONTENT_RANGE
            | header::CONTENT_TYPE
            | header::HOST
            | header::MAX_FORWARDS
            | header::SET_COOKIE
            | header::TRAILER
            | header::TRANSFER_ENCODING
            | header::TE
    )
}

/// A chunk's size line.
pub fn chunk_size(dst: &mut Vec<u8>, n: usize) {
    let mut digits = [0u8; 16];
    let mut i = digits.len();
    let mut v = n;
    loop {
        i -= 1;
        digits[i] = b"0123456789abcdef"[v & 15];
        v >>= 4;
        if v == 0 {
            break;
        }
    }
    dst.extend_from_slice(&digits[i..]);
    dst.extend_from_slice(b"\r\n");
}

/// The last chunk with the trailer fields `allowed` lets through (those the `Trailer` field
/// announced), none of them a field that may not be a trailer
/// ([`crate::fields::allowed_in_trailers`]).
pub fn last_chunk(dst: &mut Vec<u8>, trailers: Option<&HeaderMap>, allowed: Option<&[HeaderName]>) {
    dst.extend_from_slice(b"0\r\n");
    if let (Some(t), Some(allowed)) = (trailers, allowed) {
        for (name, value) in t {
            if allowed.contains(name) && crate::fields::allowed_in_trailers(name) {
                field(dst, name.as_str().as_bytes(), value.as_bytes());
            }
        }
    }
    dst.extend_from_slice(b"\r\n");
}

/// The head of an answer the connection gives by itself (a refused head): no body but the
/// status, and the connection closes.
pub fn refusal(status: StatusCode, dst: &mut Vec<u8>) {
    let mut body = Vec::with_capacity(32);
    crate::response::status_text(status, &mut body);
    status_line(dst, status);
    dst.extend_from_slice(b"content-type: text/plain; charset=utf-8\r\n");
    length_field(dst, body.len() as u64);
    dst.extend_from_slice(b"connection: close\r\n");
    field(dst, b"server", crate::response::SERVER.as_bytes());
    with_date(|d| field(dst, b"date", d));
    dst.extend_from_slice(b"\r\n");
    dst.extend_from_slice(&body);
}

thread_local! {
    /// The `Date` value of the current second (IMF-fixdate, 29 bytes), rendered once a second.
    static DATE: RefCell<(u64, [u8; 29])> = const { RefCell::new((u64::MAX, [0; 29])) };
}

/// Calls `f` with the current `Date` value.
pub(crate) fn with_date(f: impl FnOnce(&[u8])) {
    let now = std::time::SystemTime::now();
    let secs = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    DATE.with(|d| {
        let mut d = d.borrow_mut();
        if d.0 != secs {
            let s = httpdate::fmt_http_date(now);
            if s.len() == 29 {
                d.1.copy_from_slice(s.as_bytes());
                d.0 = secs;
            }
        }
        f(&d.1)
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::HeaderValue;

    fn enc(
        status: u16,
        headers: &[(&str, &str)],
        body: BodyHint,
        asked: Asked,
    ) -> (String, Encoded) {
        let mut h = HeaderMap::new();
        for (n, v) in headers {
            h.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        let mut dst = Vec::new();
        let e = head(
            StatusCode::from_u16(status).unwrap(),
            &h,
            body,
            asked,
            &mut dst,
        );
        (String::from_utf8(dst).unwrap(), e)
    }

    const GET11: Asked = Asked {
        head: false,
        version: Version::HTTP_11,
        keep_alive: true,
        te_trailers: false,
    };
    const SIZED: BodyHint = BodyHint {
        empty: false,
        exact: Some(5),
    };
    const STREAM: BodyHint = BodyHint {
        empty: false,
        exact: None,
    };
    const EMPTY: BodyHint = BodyHint {
        empty: true,
        exact: Some(0),
    };

    #[test]
    fn framing_follows_the_body_and_the_request() {
        let (s, e) = enc(200, &[("x-a", "1")], SIZED, GET11);
        assert!(
            s.starts_with(
                "HTTP/1.1 200 OK\r\nx-a: 1\r\ncontent-length: 5\r\nserver: qweb\r\ndate: "
            ),
            "{s}"
        );
        assert!(s.ends_with("\r\n\r\n"));
        assert_eq!(e.framing, Framing::Length(5));
        assert!(e.keep_alive);
        let (s, e) = enc(200, &[], STREAM, GET11);
        assert!(s.contains("transfer-encoding: chunked\r\n"));
        assert_eq!(e.framing, Framing::Chunked(None));
        let old = Asked {
            version: Version::HTTP_10,
            keep_alive: false,
            ..GET11
        };
        let (s, e) = enc(200, &[], STREAM, old);
        assert!(
            s.starts_with("HTTP/1.1 200") && !s.contains("chunked") && !s.contains("connection"),
            "{s}"
        );
        assert_eq!((e.framing, e.keep_alive), (Framing::Close, false));
        let old_ka = Asked {
            keep_alive: true,
            ..old
        };
        let (s, _) = enc(200, &[], SIZED, old_ka);
        assert!(s.contains("connection: keep-alive\r\n"), "{s}");
        let head_req = Asked {
            head: true,
            ..GET11
        };
        let (s, e) = enc(200, &[("content-length", "42")], EMPTY, head_req);
        assert!(s.contains("content-length: 42\r\n"), "{s}");
        assert_eq!(e.framing, Framing::None);
        let (s, e) = enc(304, &[("content-length", "42")], EMPTY, GET11);
        assert!(!s.contains("content-length"), "{s}");
        assert_eq!(e.framing, Framing::None);
        let (s, _) = enc(404, &[], EMPTY, GET11);
        assert!(s.starts_with("HTTP/1.1 404 Not Found\r\n") && s.contains("content-length: 0\r\n"));
        let (s, e) = enc(
            200,
            &[("connection", "close"), ("transfer-encoding", "gzip")],
            SIZED,
            GET11,
        );
        assert_eq!(s.matches("connection").count(), 1, "{s}");
        assert!(!s.contains("gzip") && !e.keep_alive);
        let closing = Asked {
            keep_alive: false,
            ..GET11
        };
        let (s, _) = enc(200, &[], SIZED, closing);
        assert!(s.contains("connection: close\r\n"));
    }

    #[test]
    fn trailers_only_as_announced_and_asked() {
        let asked = Asked {
            te_trailers: true,
            ..GET11
        };
        let (_, e) = enc(
            200,
            &[("trailer", "grpc-status, content-type")],
            STREAM,
            asked,
        );
        let Framing::Chunked(Some(allowed)) = e.framing else {
            panic!()
        };
        assert_eq!(&allowed[..], &[HeaderName::from_static("grpc-status")]);
        let (_, e) = enc(200, &[("trailer", "grpc-status")], STREAM, GET11);
        assert_eq!(e.framing, Framing::Chunked(None));
        let mut t = HeaderMap::new();
        t.insert("grpc-status", HeaderValue::from_static("0"));
        t.insert("x-not", HeaderValue::from_static("1"));
        let mut dst = Vec::new();
        last_chunk(&mut dst, Some(&t), Some(&allowed));
        assert_eq!(dst, b"0\r\ngrpc-status: 0\r\n\r\n");
        let mut dst = Vec::new();
        chunk_size(&mut dst, 0x1a2b);
        assert_eq!(dst, b"1a2b\r\n");
    }
}
