//! The PROXY protocol header (HAProxy's v1 text line or v2 binary block) that a trusted L4
//! balancer writes before the client's bytes: read before TLS, its source address becomes
//! the connection's client address (issue 39, phase 0). Parsing is the `ppp` crate's; this
//! module reads exactly the header's bytes off the socket (peeking, so nothing after the
//! header is consumed: the TLS handshake or the HTTP/1.1 driver reads the rest as usual).
//!
//! Bounds: a v1 line is at most 107 bytes (the spec's); a v2 block's payload at most
//! [`MAX_V2_PAYLOAD`] bytes (refused as soon as its length field is read, before the payload
//! arrives). TLVs are skipped, not read (ALPN, authority, CRC32c: the connection's own TLS
//! handshake says as much). The caller bounds the time.

use std::io;
use std::net::SocketAddr;

use ppp::v2::PROTOCOL_PREFIX as V2_SIGNATURE;
use ppp::PartialResult;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// The largest v2 payload (addresses and TLVs) accepted: the addresses take at most 216
/// bytes (AF_UNIX), the TLVs a balancer sends (AWS's VPC endpoint id, Azure's link id, a
/// TLS summary) well under the rest.
pub(crate) const MAX_V2_PAYLOAD: usize = 1024;

/// Bytes of a v2 block before its payload.
const V2_HEAD: usize = 16;

/// The most bytes a header may take (a v2 block; a v1 line takes at most 107).
const MAX_HEADER: usize = V2_HEAD + MAX_V2_PAYLOAD;

/// Why a trusted connection's PROXY header was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum HeaderError {
    /// The connection ended (or failed) before the header did.
    #[error("connection ended before its PROXY header: {0}")]
    Io(#[from] io::Error),
    /// Not a PROXY header, or a malformed one.
    #[error("bad PROXY header: {0}")]
    Malformed(String),
    /// A v2 block announcing a payload over [`MAX_V2_PAYLOAD`].
    #[error("PROXY v2 header of {0} bytes (at most {MAX_V2_PAYLOAD})")]
    TooLong(usize),
}

/// What a complete header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Said {
    /// The client's address (a TCP source of v1 `TCP4`/`TCP6`, v2 `PROXY` over IPv4/IPv6).
    Client(SocketAddr),
    /// Keep the connection's own address: v1 `UNKNOWN`, v2 `LOCAL` (the balancer's health
    /// check), or a v2 address family without an IP address (unspecified, AF_UNIX).
    Keep,
}

/// The beginning of every v1 line.
const V1_PREFIX: &[u8] = b"PROXY ";

/// The longest v1 line, CRLF included (the spec's bound).
const V1_MAX: usize = 107;

/// The state of a header read so far: `Ok(Some((said, len)))` when `buf` holds a complete
/// header of `len` bytes, `Ok(None)` when more bytes are needed. Refused as soon as the
/// bytes seen cannot begin a header (so garbage closes at once, without waiting for more).
pub(crate) fn parse(buf: &[u8]) -> Result<Option<(Said, usize)>, HeaderError> {
    let sig = V2_SIGNATURE.len().min(buf.len());
    if buf[..sig] == V2_SIGNATURE[..sig] {
        if buf.len() >= V2_HEAD {
            let payload = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
            if payload > MAX_V2_PAYLOAD {
                return Err(HeaderError::TooLong(payload));
            }
        }
        let header = ppp::v2::Header::try_from(buf);
        if header.is_incomplete() {
            return Ok(None);
        }
        let h = header.map_err(|e| HeaderError::Malformed(format!("v2: {e}")))?;
        let said = match (h.command, h.addresses) {
            (ppp::v2::Command::Local, _) => Said::Keep,
            (_, ppp::v2::Addresses::IPv4(a)) => {
                Said::Client(SocketAddr::new(a.source_address.into(), a.source_port))
            }
            (_, ppp::v2::Addresses::IPv6(a)) => {
                Said::Client(SocketAddr::new(a.source_address.into(), a.source_port))
            }
            _ => Said::Keep,
        };
        return Ok(Some((said, h.len())));
    }
    let p = V1_PREFIX.len().min(buf.len());
    if buf[..p] != V1_PREFIX[..p] {
        return Err(HeaderError::Malformed(
            "neither a v1 line nor a v2 block".into(),
        ));
    }
    // ppp is given whole lines only (some prefixes of a valid line, one ending in the space
    // before the last port, read as complete errors)
    let Some(end) = buf.iter().position(|&b| b == b'\n') else {
        if buf.len() >= V1_MAX {
            return Err(HeaderError::Malformed(format!(
                "v1: no line end within {V1_MAX} bytes"
            )));
        }
        return Ok(None);
    };
    let line = &buf[..=end];
    if line.len() > V1_MAX {
        return Err(HeaderError::Malformed(format!(
            "v1: a line of {} bytes (at most {V1_MAX})",
            line.len()
        )));
    }
    let h =
        ppp::v1::Header::try_from(line).map_err(|e| HeaderError::Malformed(format!("v1: {e}")))?;
    let said = match h.addresses {
        ppp::v1::Addresses::Tcp4(a) => {
            Said::Client(SocketAddr::new(a.source_address.into(), a.source_port))
        }
        ppp::v1::Addresses::Tcp6(a) => {
            Said::Client(SocketAddr::new(a.source_address.into(), a.source_port))
        }
        ppp::v1::Addresses::Unknown => Said::Keep,
    };
    Ok(Some((said, line.len())))
}

/// Reads the PROXY header at the start of `stream`, consuming its bytes and nothing after
/// them (a header split over many segments is waited for; the caller's deadline bounds it).
pub(crate) async fn read(stream: &mut TcpStream) -> Result<Said, HeaderError> {
    let mut buf = vec![0u8; MAX_HEADER];
    // bytes of the header consumed so far (`buf[..have]`)
    let mut have = 0;
    loop {
        // peek sees the consumed bytes no more: what it returns follows `buf[..have]`
        let n = stream.peek(&mut buf[have..]).await?;
        if n == 0 {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
        }
        let seen = have + n;
        match parse(&buf[..seen])? {
            Some((said, len)) => {
                stream.read_exact(&mut buf[have..len]).await?;
                return Ok(said);
            }
            None => {
                // every byte seen belongs to the header: take them, wait for more
                stream.read_exact(&mut buf[have..seen]).await?;
                have = seen;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v2(command: u8, family: u8, payload: &[u8]) -> Vec<u8> {
        let mut b = V2_SIGNATURE.to_vec();
        b.push(0x20 | command);
        b.push(family);
        b.extend_from_slice(&(payload.len() as u16).to_be_bytes());
        b.extend_from_slice(payload);
        b
    }

    #[test]
    fn v1_and_v2_give_the_source_address_and_their_length() {
        let line = b"PROXY TCP4 203.0.113.7 10.0.0.1 40000 443\r\nGET /";
        let (said, len) = parse(line).unwrap().unwrap();
        assert_eq!(said, Said::Client("203.0.113.7:40000".parse().unwrap()));
        assert_eq!(&line[len..], b"GET /");
        let line = b"PROXY TCP6 2001:db8::7 2001:db8::1 40000 443\r\n";
        let (said, _) = parse(line).unwrap().unwrap();
        assert_eq!(said, Said::Client("[2001:db8::7]:40000".parse().unwrap()));
        assert_eq!(parse(b"PROXY UNKNOWN\r\n").unwrap().unwrap().0, Said::Keep);
        let addrs = [198, 51, 100, 9, 10, 0, 0, 1, 0x9c, 0x40, 1, 187];
        let mut block = v2(1, 0x11, &addrs);
        let n = block.len();
        block.extend_from_slice(b"\x16\x03\x01");
        let (said, len) = parse(&block).unwrap().unwrap();
        assert_eq!(
            (said, len),
            (Said::Client("198.51.100.9:40000".parse().unwrap()), n)
        );
        // LOCAL: the balancer's own connection keeps its address
        assert_eq!(parse(&v2(0, 0, &[])).unwrap().unwrap().0, Said::Keep);
        // a TLV after the addresses is skipped
        let mut with_tlv = addrs.to_vec();
        with_tlv.extend_from_slice(&[0x01, 0, 2, b'h', b'2']);
        let block = v2(1, 0x11, &with_tlv);
        assert_eq!(parse(&block).unwrap().unwrap().1, block.len());
    }

    #[test]
    fn every_prefix_of_a_header_asks_for_more() {
        // ppp alone refuses "...40000 " as a complete error
        let line = b"PROXY TCP4 203.0.113.7 10.0.0.1 40000 443\r\n";
        let block = v2(1, 0x11, &[198, 51, 100, 9, 10, 0, 0, 1, 0x9c, 0x40, 1, 187]);
        for h in [&line[..], &block[..]] {
            for k in 1..h.len() {
                assert!(parse(&h[..k]).unwrap().is_none(), "{k} of {h:?}");
            }
            assert!(parse(h).unwrap().is_some());
        }
    }

    #[test]
    fn garbage_long_lines_bad_signatures_and_huge_v2_are_refused() {
        for bad in [
            &b"GET / HTTP/1.1\r\n"[..],
            b"PROXY TCP4 203.0.113.7 10.0.0.1 40000\r\n",
            b"PROXY TCP4 999.0.113.7 10.0.0.1 40000 443\r\n",
            b"\r\n\r\n\0\r\nQUIX\n\x21\x11\x00\x0c",
            b"\x16\x03\x01\x02\x00",
        ] {
            assert!(
                matches!(parse(bad), Err(HeaderError::Malformed(_))),
                "{bad:?}"
            );
        }
        let long = format!("PROXY TCP4 {}", "1".repeat(120));
        assert!(parse(long.as_bytes()).is_err());
        let mut huge = V2_SIGNATURE.to_vec();
        huge.extend_from_slice(&[0x21, 0x11, 0xff, 0xff]);
        assert!(matches!(parse(&huge), Err(HeaderError::TooLong(65535))));
    }
}
