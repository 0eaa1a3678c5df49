//! The disk tier's entry file: one stored response per file, read back only when every byte
//! is as written.
//!
//! ```text
//! magic "QWEBCACH" (8) | version u32 | header length u32 | header | header CRC u32 |
//! body | file CRC u32
//! ```
//!
//! Integers are little-endian. The header holds the key, the status, the request and response
//! times (seconds and nanoseconds since the Unix epoch), the stored fields, the `Vary` values
//! and the body's length. Its CRC-32 (over the magic up to the header's end) lets the start-up
//! scan trust a header without reading the body; the file CRC-32 (over every byte before it)
//! is checked on each read, before anything is served. A file of any other length than its
//! header says, another magic or version, a field that is not a valid field, or a checksum
//! that differs is [`Corrupt`]: the caller removes it.
//!
//! The checksum is CRC-32 (IEEE, `crc32fast`, already in the lockfile): it detects every
//! error burst up to 32 bits and random damage with probability 1 - 2^-32, which is what a
//! torn write or a flipped sector needs; it is not a defence against someone who can write the
//! folder (they could write any response).

use std::io::Read;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, StatusCode};

use crate::policy::Meta;

/// The first bytes of every entry file.
pub const MAGIC: [u8; 8] = *b"QWEBCACH";

/// The format's version; a file of another version is dropped.
pub const VERSION: u32 = 1;

/// Magic, version and header length.
const PREFIX: usize = 16;

/// The largest header read (a corrupt length must not make the scan read a huge file).
pub const MAX_HEADER: usize = 1 << 20;

/// Why an entry file is not used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Corrupt {
    /// Not an entry file.
    #[error("not a qweb cache entry (magic)")]
    Magic,
    /// Another version of the format.
    #[error("format version {0}, not {VERSION}")]
    Version(u32),
    /// Shorter or longer than its header says.
    #[error("truncated or overlong")]
    Length,
    /// A checksum differs.
    #[error("checksum mismatch")]
    Checksum,
    /// The header does not parse (a field name or value that is not one, a bad status).
    #[error("malformed header: {0}")]
    Header(&'static str),
    /// Reading it failed.
    #[error("read: {0}")]
    Io(#[from] std::io::Error),
}

/// An entry file's header.
#[derive(Debug)]
#[non_exhaustive]
pub struct Header {
    /// The cache key.
    pub key: String,
    /// The stored head.
    pub meta: Meta,
    /// The body's length.
    pub body_len: u64,
}

impl Header {
    /// The whole file's length.
    pub fn file_len(&self, header_len: usize) -> u64 {
        (PREFIX + header_len + 4) as u64 + self.body_len + 4
    }
}

fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}
/// A length-prefixed byte string (`u32` length; callers keep to [`MAX_HEADER`]).
fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_u32(out, u32::try_from(b.len()).unwrap_or(u32::MAX));
    out.extend_from_slice(b);
}
fn put_time(out: &mut Vec<u8>, t: SystemTime) {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    put_u64(out, d.as_secs());
    put_u32(out, d.subsec_nanos());
}

/// The header's bytes; `None` when it would be over [`MAX_HEADER`] (not stored on disk).
fn header_bytes(key: &str, meta: &Meta, body_len: u64) -> Option<Vec<u8>> {
    let mut h = Vec::with_capacity(256);
    put_bytes(&mut h, key.as_bytes());
    put_u16(&mut h, meta.status.as_u16());
    put_time(&mut h, meta.request_time);
    put_time(&mut h, meta.response_time);
    put_u32(&mut h, u32::try_from(meta.headers.len()).ok()?);
    for (n, v) in &meta.headers {
        put_bytes(&mut h, n.as_str().as_bytes());
        put_bytes(&mut h, v.as_bytes());
    }
    put_u32(&mut h, u32::try_from(meta.vary.len()).ok()?);
    for (n, v) in &meta.vary {
        put_bytes(&mut h, n.as_bytes());
        match v {
            Some(v) => {
                h.push(1);
                put_bytes(&mut h, v);
            }
            None => h.push(0),
        }
    }
    put_u64(&mut h, body_len);
    (h.len() <= MAX_HEADER).then_some(h)
}

/// The whole entry file of `meta` and `body` under `key`; `None` when its header would be
/// over [`MAX_HEADER`].
pub fn encode(key: &str, meta: &Meta, body: &[u8]) -> Option<Vec<u8>> {
    let h = header_bytes(key, meta, body.len() as u64)?;
    let mut out = Vec::with_capacity(PREFIX + h.len() + body.len() + 8);
    out.extend_from_slice(&MAGIC);
    put_u32(&mut out, VERSION);
    put_u32(&mut out, u32::try_from(h.len()).ok()?);
    out.extend_from_slice(&h);
    let crc = crc32fast::hash(&out);
    put_u32(&mut out, crc);
    out.extend_from_slice(body);
    let crc = crc32fast::hash(&out);
    put_u32(&mut out, crc);
    Some(out)
}

/// A cursor over header bytes that fails instead of reading past them.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Corrupt> {
        if self.0.len() < n {
            return Err(Corrupt::Header("short"));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, Corrupt> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, Corrupt> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, Corrupt> {
        let mut a = [0; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }
    fn u64(&mut self) -> Result<u64, Corrupt> {
        let mut a = [0; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn bytes(&mut self) -> Result<&'a [u8], Corrupt> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn time(&mut self) -> Result<SystemTime, Corrupt> {
        let secs = self.u64()?;
        let nanos = self.u32()?;
        if nanos >= 1_000_000_000 {
            return Err(Corrupt::Header("time"));
        }
        UNIX_EPOCH
            .checked_add(Duration::new(secs, nanos))
            .ok_or(Corrupt::Header("time"))
    }
}

/// Parses header bytes (after their checksum was checked).
fn parse_header(h: &[u8]) -> Result<Header, Corrupt> {
    let mut c = Cursor(h);
    let key = std::str::from_utf8(c.bytes()?)
        .map_err(|_| Corrupt::Header("key"))?
        .to_owned();
    let status = StatusCode::from_u16(c.u16()?).map_err(|_| Corrupt::Header("status"))?;
    let request_time = c.time()?;
    let response_time = c.time()?;
    let n = c.u32()? as usize;
    let mut headers = HeaderMap::with_capacity(n.min(256));
    for _ in 0..n {
        let name = HeaderName::from_bytes(c.bytes()?).map_err(|_| Corrupt::Header("name"))?;
        let value = HeaderValue::from_bytes(c.bytes()?).map_err(|_| Corrupt::Header("value"))?;
        headers.append(name, value);
    }
    let n = c.u32()? as usize;
    let mut vary = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        let name = std::str::from_utf8(c.bytes()?)
            .map_err(|_| Corrupt::Header("vary"))?
            .to_owned();
        let v = match c.u8()? {
            0 => None,
            1 => Some(c.bytes()?.to_vec()),
            _ => return Err(Corrupt::Header("vary")),
        };
        vary.push((name, v));
    }
    let body_len = c.u64()?;
    if !c.0.is_empty() {
        return Err(Corrupt::Header("trailing bytes"));
    }
    Ok(Header {
        key,
        meta: Meta {
            status,
            headers,
            request_time,
            response_time,
            vary,
        },
        body_len,
    })
}

/// Magic, version and header length of `prefix`.
fn parse_prefix(prefix: &[u8; PREFIX]) -> Result<usize, Corrupt> {
    if prefix[..8] != MAGIC {
        return Err(Corrupt::Magic);
    }
    let version = u32::from_le_bytes([prefix[8], prefix[9], prefix[10], prefix[11]]);
    if version != VERSION {
        return Err(Corrupt::Version(version));
    }
    let len = u32::from_le_bytes([prefix[12], prefix[13], prefix[14], prefix[15]]) as usize;
    if len > MAX_HEADER {
        return Err(Corrupt::Header("over the largest header"));
    }
    Ok(len)
}

/// The header of the entry file `r` of `file_len` bytes, reading only the header (the
/// start-up scan): its checksum and the file's length are checked, the body's is not.
pub fn read_header(r: &mut impl Read, file_len: u64) -> Result<Header, Corrupt> {
    let mut prefix = [0u8; PREFIX];
    r.read_exact(&mut prefix).map_err(eof_is_length)?;
    let len = parse_prefix(&prefix)?;
    let mut buf = vec![0u8; len + 4];
    r.read_exact(&mut buf).map_err(eof_is_length)?;
    let (h, crc) = buf.split_at(len);
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&prefix);
    hasher.update(h);
    if hasher.finalize().to_le_bytes() != crc {
        return Err(Corrupt::Checksum);
    }
    let header = parse_header(h)?;
    if header.file_len(len) != file_len {
        return Err(Corrupt::Length);
    }
    Ok(header)
}

fn eof_is_length(e: std::io::Error) -> Corrupt {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        Corrupt::Length
    } else {
        Corrupt::Io(e)
    }
}

/// The header and the body's place in `file`, a whole entry file: every check of
/// [`read_header`] and the file's checksum.
pub fn decode(file: &[u8]) -> Result<(Header, std::ops::Range<usize>), Corrupt> {
    let prefix: &[u8; PREFIX] = file
        .get(..PREFIX)
        .and_then(|p| p.try_into().ok())
        .ok_or(Corrupt::Length)?;
    let len = parse_prefix(prefix)?;
    let header_end = PREFIX + len;
    let crc_at = |at: usize| -> Result<[u8; 4], Corrupt> {
        file.get(at..at + 4)
            .and_then(|c| c.try_into().ok())
            .ok_or(Corrupt::Length)
    };
    let header_crc = crc_at(header_end)?;
    if crc32fast::hash(&file[..header_end]).to_le_bytes() != header_crc {
        return Err(Corrupt::Checksum);
    }
    let header = parse_header(&file[PREFIX..header_end])?;
    if header.file_len(len) != file.len() as u64 {
        return Err(Corrupt::Length);
    }
    let body_start = header_end + 4;
    let body_end = file.len() - 4;
    if crc32fast::hash(&file[..body_end]).to_le_bytes() != crc_at(body_end)? {
        return Err(Corrupt::Checksum);
    }
    Ok((header, body_start..body_end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header;

    fn meta() -> Meta {
        let mut resp = HeaderMap::new();
        resp.insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static("max-age=60"),
        );
        resp.append("x-many", HeaderValue::from_static("1"));
        resp.append("x-many", HeaderValue::from_static("2"));
        resp.insert(header::VARY, HeaderValue::from_static("x-v, accept"));
        let mut req = HeaderMap::new();
        req.insert("x-v", HeaderValue::from_static("a"));
        let t = UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789);
        Meta::new(
            StatusCode::NOT_FOUND,
            &resp,
            &req,
            t,
            t + Duration::from_millis(5),
        )
    }

    #[test]
    fn an_entry_reads_back_as_written() {
        let m = meta();
        let file = encode("http://h/k", &m, b"the body").unwrap();
        let (h, body) = decode(&file).unwrap();
        assert_eq!(&file[body], b"the body");
        assert_eq!(h.key, "http://h/k");
        assert_eq!(h.meta.status, m.status);
        assert_eq!(h.meta.headers, m.headers);
        assert_eq!(h.meta.vary, m.vary);
        assert_eq!(h.meta.request_time, m.request_time);
        assert_eq!(h.meta.response_time, m.response_time);
        let h = read_header(&mut &file[..], file.len() as u64).unwrap();
        assert_eq!(h.body_len, 8);
    }

    /// Every single flipped byte anywhere in the file is caught by a whole read; every one in
    /// the prefix or header is caught by the scan too.
    #[test]
    fn any_flipped_byte_is_caught() {
        let file = encode("http://h/k", &meta(), b"the body").unwrap();
        let header_end = file.len() - 8 - 4;
        for i in 0..file.len() {
            let mut bad = file.clone();
            bad[i] ^= 0x20;
            assert!(decode(&bad).is_err(), "byte {i}");
            if i < header_end {
                assert!(
                    read_header(&mut &bad[..], bad.len() as u64).is_err(),
                    "byte {i}"
                );
            }
        }
    }

    #[test]
    fn a_truncated_or_overlong_file_is_caught() {
        let file = encode("http://h/k", &meta(), b"the body").unwrap();
        for n in 0..file.len() {
            assert!(decode(&file[..n]).is_err(), "{n}");
            // the scan sees the file's length on disk
            assert!(read_header(&mut &file[..], n as u64).is_err(), "{n}");
        }
        let mut long = file.clone();
        long.push(0);
        assert!(decode(&long).is_err());
        assert!(read_header(&mut &long[..], long.len() as u64).is_err());
    }

    #[test]
    fn another_version_is_refused() {
        let mut file = encode("http://h/k", &meta(), b"b").unwrap();
        file[8] = 2;
        assert!(matches!(decode(&file), Err(Corrupt::Version(2))));
        assert!(matches!(
            read_header(&mut &file[..], file.len() as u64),
            Err(Corrupt::Version(2))
        ));
    }
}
