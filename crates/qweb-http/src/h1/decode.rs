//! Request bodies: `Content-Length` bytes, or the chunked coding (RFC 9112 §7.1) decoded
//! from the connection's read buffer. Data is split off the buffer, never copied.
//!
//! Chunked framing is read strictly: the size is 1 to 16 hex digits, an extension may follow
//! (`BWS ";" ...`, at most [`MAX_EXTENSIONS`] bytes over the whole body), and every line ends
//! in CRLF: a bare LF or CR is refused (two hops that disagree on line ends disagree on where
//! a request ends). Trailer fields are parsed as header fields, within the head's size limit.

use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};

use super::parse::Framing;

/// Chunk extensions a body may carry in all (they are read and dropped; hyper allows as
/// much).
pub const MAX_EXTENSIONS: usize = 16 * 1024;

/// Why a request body could not be read. The connection is closed after the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BodyError {
    /// The chunked framing is malformed.
    #[error("malformed chunked body: {0}")]
    Chunked(&'static str),
    /// The client closed the connection before the body's end.
    #[error("the client closed the connection before the body's end")]
    Truncated,
    /// The trailer section is over the head's size limit.
    #[error("trailer section too large")]
    TrailersTooLarge,
}

/// What [`Decoder::decode`] found.
#[derive(Debug)]
pub enum Decoded {
    /// Body bytes.
    Data(Bytes),
    /// The trailer fields (the body ends after them).
    Trailers(HeaderMap),
    /// The body is over.
    End,
    /// More bytes must be read.
    More,
}

/// The decoding state of one request body.
#[derive(Debug)]
pub enum Decoder {
    /// This many bytes are left.
    Length(u64),
    /// Chunked.
    Chunked(Box<Chunked>),
    /// Over.
    Done,
}

/// Where a chunked body stands.
#[derive(Debug)]
pub struct Chunked {
    at: At,
    /// The current chunk's size, then what is left of its data.
    size: u64,
    digits: u8,
    extensions: usize,
    max_trailers: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    Size,
    /// Whitespace after the size: only an extension may follow.
    SizeSpace,
    Extension,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    Trailers,
}

impl Decoder {
    /// A decoder for `framing`; `max_trailers`: the trailer section's size limit.
    pub fn new(framing: Framing, max_trailers: usize) -> Self {
        match framing {
            Framing::Empty | Framing::Length(0) => Decoder::Done,
            Framing::Length(n) => Decoder::Length(n),
            Framing::Chunked => Decoder::Chunked(Box::new(Chunked {
                at: At::Size,
                size: 0,
                digits: 0,
                extensions: 0,
                max_trailers,
            })),
        }
    }

    /// The body is over.
    pub fn is_done(&self) -> bool {
        matches!(self, Decoder::Done)
    }

    /// Bytes the body still announces (`Content-Length` only).
    pub fn remaining(&self) -> Option<u64> {
        match self {
            Decoder::Length(n) => Some(*n),
            Decoder::Done => Some(0),
            Decoder::Chunked(_) => None,
        }
    }

    /// Takes and drops what of the body `buf` already holds (for a body nobody reads), without
    /// waiting for more; `true` when the body is then over.
    pub fn skip_buffered(&mut self, buf: &mut BytesMut) -> bool {
        while let Ok(Decoded::Data(_) | Decoded::Trailers(_)) = self.decode(buf, false) {}
        self.is_done()
    }

    /// Decodes what `buf` holds. `eof`: the client closed its side; what is missing then is an
    /// error.
    pub fn decode(&mut self, buf: &mut BytesMut, eof: bool) -> Result<Decoded, BodyError> {
        let r = match self {
            Decoder::Done => return Ok(Decoded::End),
            Decoder::Length(left) => {
                if buf.is_empty() {
                    Ok(Decoded::More)
                } else {
                    let n = usize::try_from(*left).unwrap_or(usize::MAX).min(buf.len());
                    *left -= n as u64;
                    let data = buf.split_to(n).freeze();
                    if *left == 0 {
                        *self = Decoder::Done;
                    }
                    return Ok(Decoded::Data(data));
                }
            }
            Decoder::Chunked(c) => c.decode(buf),
        };
        match r {
            Ok(Decoded::More) if eof => Err(BodyError::Truncated),
            Ok(d @ (Decoded::End | Decoded::Trailers(_))) => {
                *self = Decoder::Done;
                Ok(d)
            }
            r => r,
        }
    }
}

fn hex(b: u8) -> Option<u64> {
    match b {
        b'0'..=b'9' => Some(u64::from(b - b'0')),
        b'a'..=b'f' => Some(u64::from(b - b'a' + 10)),
        b'A'..=b'F' => Some(u64::from(b - b'A' + 10)),
        _ => None,
    }
}

impl Chunked {
    fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, BodyError> {
        use BodyError::Chunked as Bad;
        loop {
            if self.at == At::Data {
                if buf.is_empty() {
                    return Ok(Decoded::More);
                }
                let n = usize::try_from(self.size)
                    .unwrap_or(usize::MAX)
                    .min(buf.len());
                self.size -= n as u64;
                if self.size == 0 {
                    self.at = At::DataCr;
                }
                return Ok(Decoded::Data(buf.split_to(n).freeze()));
            }
            if self.at == At::Trailers {
                return self.trailers(buf);
            }
            if self.at == At::Extension {
                // everything up to the CR is the extension (no bare LF inside)
                let end = memchr::memchr2(b'\r', b'\n', buf);
                let taken = end.unwrap_or(buf.len());
                self.extensions += taken;
                if self.extensions > MAX_EXTENSIONS {
                    return Err(Bad("chunk extensions too long"));
                }
                buf.advance(taken);
                match end.map(|_| buf.get_u8()) {
                    None => return Ok(Decoded::More),
                    Some(b'\r') => self.at = At::SizeLf,
                    Some(_) => return Err(Bad("bare LF in a chunk extension")),
                }
                continue;
            }
            let Some(&b) = buf.first() else {
                return Ok(Decoded::More);
            };
            buf.advance(1);
            self.at = match (self.at, b) {
                (At::Size, _) if hex(b).is_some() => {
                    if self.digits == 16 {
                        return Err(Bad("chunk size too large"));
                    }
                    self.digits += 1;
                    self.size = self.size << 4 | hex(b).unwrap_or(0);
                    At::Size
                }
                (At::Size, _) if self.digits == 0 => return Err(Bad("chunk size")),
                (At::Size | At::SizeSpace, b' ' | b'\t') => At::SizeSpace,
                (At::Size | At::SizeSpace, b';') => At::Extension,
                (At::Size, b'\r') => At::SizeLf,
                (At::SizeLf, b'\n') => {
                    self.digits = 0;
                    if self.size == 0 {
                        At::Trailers
                    } else {
                        At::Data
                    }
                }
                (At::DataCr, b'\r') => At::DataLf,
                (At::DataLf, b'\n') => At::Size,
                (At::SizeSpace, _) => return Err(Bad("space after a chunk size")),
                (At::Size | At::SizeLf, _) => return Err(Bad("chunk size line")),
                (At::DataCr | At::DataLf, _) => return Err(Bad("no CRLF after chunk data")),
                (At::Extension | At::Data | At::Trailers, _) => return Err(Bad("state")),
            };
        }
    }

    /// The trailer section: an empty line, or fields and an empty line.
    fn trailers(&mut self, buf: &mut BytesMut) -> Result<Decoded, BodyError> {
        match buf.first() {
            None => return Ok(Decoded::More),
            Some(b'\r') => match buf.get(1) {
                None => return Ok(Decoded::More),
                Some(b'\n') => {
                    buf.advance(2);
                    return Ok(Decoded::End);
                }
                Some(_) => return Err(BodyError::Chunked("bare CR in the trailer section")),
            },
            Some(_) => {}
        }
        let Some(end) = memchr::memmem::find(buf, b"\r\n\r\n") else {
            if buf.len() > self.max_trailers {
                return Err(BodyError::TrailersTooLarge);
            }
            return Ok(Decoded::More);
        };
        if end + 4 > self.max_trailers {
            return Err(BodyError::TrailersTooLarge);
        }
        let raw = buf.split_to(end + 4).freeze();
        let mut fields = [httparse::EMPTY_HEADER; 64];
        let parsed = httparse::parse_headers(&raw, &mut fields)
            .map_err(|_| BodyError::Chunked("trailer fields"))?;
        let httparse::Status::Complete((_, fields)) = parsed else {
            return Err(BodyError::Chunked("trailer fields"));
        };
        let mut map = HeaderMap::with_capacity(fields.len());
        for f in fields {
            let name = HeaderName::from_bytes(f.name.as_bytes())
                .map_err(|_| BodyError::Chunked("trailer field name"))?;
            let value = HeaderValue::from_maybe_shared(raw.slice_ref(f.value))
                .map_err(|_| BodyError::Chunked("trailer field value"))?;
            map.append(name, value);
        }
        Ok(Decoded::Trailers(map))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `input` fed in pieces of `step` bytes: the body, the trailers, or the error.
    fn run(input: &[u8], step: usize) -> Result<(Vec<u8>, Option<HeaderMap>, usize), BodyError> {
        let mut d = Decoder::new(Framing::Chunked, 1024);
        let mut buf = BytesMut::new();
        let (mut body, mut trailers) = (Vec::new(), None);
        let mut fed = 0;
        loop {
            match d.decode(&mut buf, fed == input.len())? {
                Decoded::Data(b) => body.extend_from_slice(&b),
                Decoded::Trailers(t) => trailers = Some(t),
                Decoded::End => return Ok((body, trailers, buf.len() + input.len() - fed)),
                Decoded::More => {
                    let n = step.min(input.len() - fed);
                    buf.extend_from_slice(&input[fed..fed + n]);
                    fed += n;
                }
            }
        }
    }

    #[test]
    fn chunked_bodies_in_any_pieces() {
        let input = b"5\r\nhello\r\n1;ext=\"a b\"\r\n!\r\nA \t;x\r\n0123456789\r\n0\r\n\r\nNEXT";
        for step in [1, 2, 3, 7, 100] {
            let (body, trailers, left) = run(input, step).unwrap();
            assert_eq!(body, b"hello!0123456789", "step {step}");
            assert!(trailers.is_none());
            assert_eq!(left, 4, "the next request's bytes stay in the buffer");
        }
        let (body, trailers, _) = run(b"3\r\nabc\r\n0\r\nX-Sum: 1\r\nX-B: 2\r\n\r\n", 1).unwrap();
        assert_eq!(body, b"abc");
        let t = trailers.unwrap();
        assert_eq!(t["x-sum"], "1");
        assert_eq!(t["x-b"], "2");
    }

    #[test]
    fn malformed_chunked_framing_is_refused() {
        for bad in [
            &b"zz\r\nhello\r\n0\r\n\r\n"[..],
            b"\r\n0\r\n\r\n",
            b"5\nhello\r\n0\r\n\r\n",
            b"5\r\nhello\n0\r\n\r\n",
            b"5\r\nhelloXX0\r\n\r\n",
            b"5 \r\nhello\r\n0\r\n\r\n",
            b"5;a\nb\r\nhello\r\n0\r\n\r\n",
            b"0x5\r\nhello\r\n0\r\n\r\n",
            b"-5\r\nhello\r\n0\r\n\r\n",
            b"10000000000000000\r\n",
            b"3\r\nabc\r\n0\r\n\rX\r\n\r\n",
            b"3\r\nabc\r\n0\r\nBad Name: 1\r\n\r\n",
            b"5\r\nhel",
        ] {
            assert!(run(bad, 1).is_err(), "{:?}", String::from_utf8_lossy(bad));
            assert!(run(bad, 64).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        let ext = format!("1;{}\r\na\r\n0\r\n\r\n", "e".repeat(MAX_EXTENSIONS + 1));
        assert_eq!(
            run(ext.as_bytes(), 4096).unwrap_err(),
            BodyError::Chunked("chunk extensions too long")
        );
        let big = format!("1\r\na\r\n0\r\nX: {}\r\n\r\n", "v".repeat(2000));
        assert_eq!(
            run(big.as_bytes(), 100).unwrap_err(),
            BodyError::TrailersTooLarge
        );
    }

    #[test]
    fn a_length_body_stops_at_its_length() {
        let mut d = Decoder::new(Framing::Length(5), 0);
        let mut buf = BytesMut::from(&b"hel"[..]);
        assert!(matches!(d.decode(&mut buf, false), Ok(Decoded::Data(b)) if b == "hel"));
        assert!(matches!(d.decode(&mut buf, false), Ok(Decoded::More)));
        assert_eq!(d.decode(&mut buf, true).unwrap_err(), BodyError::Truncated);
        let mut d = Decoder::new(Framing::Length(2), 0);
        let mut buf = BytesMut::from(&b"loGET"[..]);
        assert!(matches!(d.decode(&mut buf, false), Ok(Decoded::Data(b)) if b == "lo"));
        assert!(d.is_done());
        assert_eq!(&buf[..], b"GET");
    }
}
