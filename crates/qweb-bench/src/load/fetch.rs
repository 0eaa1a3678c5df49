//! One request over HTTP/1.1 or HTTP/2, and the checks every response passes (HTTP/3's
//! requests are in `quic.rs`; their responses pass the same checks).

use bytes::Bytes;
use http::header::{ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_LENGTH, HOST};
use http::{Request, Uri};
use http_body_util::{BodyExt, Empty};

use super::shared::{OpError, Shared};
use super::Sender;

/// A response as the checks need it: status, Content-Encoding, Content-Length, body size and
/// its first two and last four bytes (gzip magic and ISIZE trailer).
#[derive(Default)]
pub(super) struct Fetched {
    status: u16,
    encoding: Option<String>,
    content_length: Option<u64>,
    bytes: u64,
    head: [u8; 2],
    tail: [u8; 4],
}

impl Fetched {
    pub(super) fn headers(status: http::StatusCode, headers: &http::HeaderMap) -> Self {
        Fetched {
            status: status.as_u16(),
            encoding: headers
                .get(CONTENT_ENCODING)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            content_length: headers
                .get(CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok()),
            ..Fetched::default()
        }
    }

    /// Counts a piece of the body.
    pub(super) fn data(&mut self, d: &[u8]) {
        let n = self.bytes;
        for (i, b) in d.iter().take(2).enumerate() {
            if n + (i as u64) < 2 {
                self.head[n as usize + i] = *b;
            }
        }
        let k = d.len().min(4);
        self.tail.rotate_left(k);
        self.tail[4 - k..].copy_from_slice(&d[d.len() - k..]);
        self.bytes += d.len() as u64;
    }
}

/// One request over HTTP/1.1 or HTTP/2.
pub(super) async fn fetch(sh: &Shared, sender: &mut Sender) -> Result<Fetched, OpError> {
    let mut b = Request::get(match sender {
        Sender::H1(_) => {
            Uri::try_from(sh.target.path.as_str()).map_err(|e| OpError::Http(e.to_string()))?
        }
        Sender::H2(_) | Sender::H3(_) => sh.target.uri.clone(),
    });
    if matches!(sender, Sender::H1(_)) {
        b = b.header(HOST, sh.target.authority.as_str());
    }
    if let Some(ae) = &sh.spec.accept_encoding {
        b = b.header(ACCEPT_ENCODING, ae.as_str());
    }
    let req = b
        .body(Empty::<Bytes>::new())
        .map_err(|e| OpError::Http(e.to_string()))?;
    let resp = match sender {
        Sender::H1(s) => {
            s.ready().await.map_err(|e| OpError::Http(e.to_string()))?;
            s.send_request(req).await
        }
        Sender::H2(s) => {
            s.ready().await.map_err(|e| OpError::Http(e.to_string()))?;
            s.send_request(req).await
        }
        Sender::H3(_) => unreachable!("HTTP/3 requests go through quic::fetch"),
    }
    .map_err(|e| OpError::Http(e.to_string()))?;
    let mut got = Fetched::headers(resp.status(), resp.headers());
    let mut body = resp.into_body();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| OpError::Http(e.to_string()))?;
        if let Some(d) = frame.data_ref() {
            got.data(d);
        }
    }
    Ok(got)
}

/// The checks every response passes: status, encoding, gzip trailer, body size.
pub(super) fn check(sh: &Shared, got: Fetched) -> Result<u64, OpError> {
    let Fetched {
        status,
        encoding: enc,
        content_length: clen,
        bytes: n,
        head,
        tail,
    } = got;
    if status != sh.spec.expect_status {
        return Err(OpError::Status(format!(
            "{status}, expected {}",
            sh.spec.expect_status
        )));
    }
    if let Some(want) = &sh.spec.expect_encoding {
        let got = enc.as_deref().unwrap_or("identity");
        if !got.eq_ignore_ascii_case(want) {
            return Err(OpError::Encoding(format!("{got}, expected {want}")));
        }
    }
    if let Some(want) = sh.spec.expect_gzip_size {
        let isize = u32::from_le_bytes(tail) as u64;
        if head != [0x1f, 0x8b] || n < 18 || isize != want % (1 << 32) {
            return Err(OpError::Bytes(format!(
                "gzip stream of {n} bytes states {isize} decoded bytes, expected {want}"
            )));
        }
    }
    let tol = sh.spec.bytes_tolerance / 100.0;
    match (sh.spec.expect_bytes, clen) {
        (Some(want), _) if (n as f64 - want as f64).abs() > want as f64 * tol => {
            return Err(OpError::Bytes(format!("{n}, expected {want}")));
        }
        (None, Some(cl)) if cl != n => {
            return Err(OpError::Bytes(format!("{n}, Content-Length {cl}")));
        }
        _ => {}
    }
    Ok(n)
}
