//! HTTP/1.1 on the wire for tests that send raw bytes: one response read off a socket
//! exactly as it came (head, then a body framed by `Content-Length`, chunks, or the end of
//! the stream).

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

/// A response as read off the wire.
#[derive(Debug)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The head, without its blank line.
    pub head: String,
    /// The body, unframed.
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of the header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<String> {
        self.head
            .split("\r\n")
            .filter_map(|l| l.split_once(':'))
            .find(|(n, _)| n.trim().eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim().to_owned())
    }
}

/// Where `n` first occurs in `h`.
pub fn find(h: &[u8], n: &[u8]) -> Option<usize> {
    h.windows(n.len()).position(|w| w == n)
}

/// Reads one response (Content-Length, chunked, or until EOF; none for 1xx, 204, 304),
/// each read within `timeout`; `None` if the connection closed without one.
pub async fn read_response(
    s: &mut (impl AsyncRead + Unpin + ?Sized),
    timeout: Duration,
) -> Option<Response> {
    read(s, timeout, false, &mut Vec::new()).await
}

/// Reads the response to a `HEAD` request: its head only, whatever it says of a body.
pub async fn read_head_response(
    s: &mut (impl AsyncRead + Unpin + ?Sized),
    timeout: Duration,
) -> Option<Response> {
    read(s, timeout, true, &mut Vec::new()).await
}

/// Reads responses one after the other off one connection, keeping the bytes a read took
/// past one response for the next (pipelined answers arrive together).
pub struct ResponseReader<'a, S: ?Sized> {
    s: &'a mut S,
    timeout: Duration,
    carry: Vec<u8>,
}

impl<'a, S: AsyncRead + Unpin + ?Sized> ResponseReader<'a, S> {
    /// A reader of `s`, each read within `timeout`.
    pub fn new(s: &'a mut S, timeout: Duration) -> Self {
        ResponseReader {
            s,
            timeout,
            carry: Vec::new(),
        }
    }

    /// The next response.
    pub async fn next(&mut self) -> Option<Response> {
        read(self.s, self.timeout, false, &mut self.carry).await
    }

    /// The next response, to a `HEAD` request.
    pub async fn next_to_head(&mut self) -> Option<Response> {
        read(self.s, self.timeout, true, &mut self.carry).await
    }
}

async fn read(
    s: &mut (impl AsyncRead + Unpin + ?Sized),
    timeout: Duration,
    to_head: bool,
    carry: &mut Vec<u8>,
) -> Option<Response> {
    let mut buf = std::mem::take(carry);
    let mut tmp = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i;
        }
        let n = tokio::time::timeout(timeout, s.read(&mut tmp))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut rest = buf[head_end + 4..].to_vec();
    let status = head.split(' ').nth(1)?.parse().ok()?;
    let header = |name: &str| {
        head.split("\r\n")
            .filter_map(|l| l.split_once(':'))
            .find(|(n, _)| n.trim().eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim().to_owned())
    };
    let mut more = async |rest: &mut Vec<u8>| -> bool {
        match tokio::time::timeout(timeout, s.read(&mut tmp)).await {
            Ok(Ok(n)) if n > 0 => {
                rest.extend_from_slice(&tmp[..n]);
                true
            }
            _ => false,
        }
    };
    let body = if to_head || status == 304 || status == 204 || status / 100 == 1 {
        *carry = rest;
        Vec::new()
    } else if let Some(len) = header("content-length").and_then(|v| v.parse::<usize>().ok()) {
        while rest.len() < len {
            if !more(&mut rest).await {
                break;
            }
        }
        *carry = rest.split_off(len.min(rest.len()));
        rest
    } else if header("transfer-encoding").is_some() {
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(i) = find(&rest, b"\r\n") {
                    break i;
                }
                if !more(&mut rest).await {
                    return Some(Response { status, head, body });
                }
            };
            let size = usize::from_str_radix(String::from_utf8_lossy(&rest[..line_end]).trim(), 16)
                .unwrap_or(0);
            rest.drain(..line_end + 2);
            while rest.len() < size + 2 {
                if !more(&mut rest).await {
                    break;
                }
            }
            if size == 0 {
                // the trailer section (or none), up to its empty line
                let end = if rest.starts_with(b"\r\n") {
                    Some(2)
                } else {
                    find(&rest, b"\r\n\r\n").map(|i| i + 4)
                };
                *carry = rest.split_off(end.unwrap_or(rest.len()).min(rest.len()));
                break;
            }
            body.extend(rest.drain(..size.min(rest.len())));
            rest.drain(..2.min(rest.len()));
        }
        body
    } else {
        while more(&mut rest).await {}
        rest
    };
    Some(Response { status, head, body })
}

/// A PROXY protocol v1 line (HAProxy's text form) saying the connection comes from `src`
/// to `dst` (both of one family).
pub fn proxy_v1(src: std::net::SocketAddr, dst: std::net::SocketAddr) -> Vec<u8> {
    let family = if src.is_ipv4() { "TCP4" } else { "TCP6" };
    format!(
        "PROXY {family} {} {} {} {}\r\n",
        src.ip(),
        dst.ip(),
        src.port(),
        dst.port()
    )
    .into_bytes()
}

/// The 12-byte signature that starts a PROXY protocol v2 block.
pub const PROXY_V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";

/// A PROXY protocol v2 block: command PROXY over TCP from `src` to `dst` (both of one
/// family), followed by `tlvs` (raw type-length-value bytes).
pub fn proxy_v2(src: std::net::SocketAddr, dst: std::net::SocketAddr, tlvs: &[u8]) -> Vec<u8> {
    let mut payload = Vec::new();
    let family = match (src.ip(), dst.ip()) {
        (std::net::IpAddr::V4(s), std::net::IpAddr::V4(d)) => {
            payload.extend_from_slice(&s.octets());
            payload.extend_from_slice(&d.octets());
            0x11
        }
        (s, d) => {
            let v6 = |a: std::net::IpAddr| match a {
                std::net::IpAddr::V4(a) => a.to_ipv6_mapped(),
                std::net::IpAddr::V6(a) => a,
            };
            payload.extend_from_slice(&v6(s).octets());
            payload.extend_from_slice(&v6(d).octets());
            0x21
        }
    };
    payload.extend_from_slice(&src.port().to_be_bytes());
    payload.extend_from_slice(&dst.port().to_be_bytes());
    payload.extend_from_slice(tlvs);
    proxy_v2_raw(0x21, family, &payload)
}

/// A PROXY protocol v2 block of any version-command byte, family-protocol byte and payload
/// (its length field is the payload's length).
pub fn proxy_v2_raw(version_command: u8, family: u8, payload: &[u8]) -> Vec<u8> {
    let mut b = PROXY_V2_SIGNATURE.to_vec();
    b.push(version_command);
    b.push(family);
    b.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    b.extend_from_slice(payload);
    b
}

/// A TCP connection to `to` from the local address `from` (a loopback address other than
/// 127.0.0.1 gives a test a second client address).
pub async fn connect_from(
    from: std::net::IpAddr,
    to: std::net::SocketAddr,
) -> std::io::Result<tokio::net::TcpStream> {
    let s = match from {
        std::net::IpAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        std::net::IpAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    s.bind(std::net::SocketAddr::new(from, 0))?;
    s.connect(to).await
}

/// Whether the peer closed `s` within `within` (a read gives 0 or an error); whatever it
/// sent before is read and dropped.
pub async fn closed_within(s: &mut (impl AsyncRead + Unpin + ?Sized), within: Duration) -> bool {
    let mut b = [0u8; 1024];
    let end = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(end, s.read(&mut b)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
        }
    }
}
