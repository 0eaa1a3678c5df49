//! Hand-built HTTP/2 frames for hostile clients (a client that never grants window, floods
//! control frames, ...), where the `h2` crate would be too well-behaved, and a reader that
//! tallies what the server sent back.
//!
//! ```no_run
//! use qweb_testkit::h2frames::{frame, get, hello, read_frames, SETTINGS};
//! # async fn f(mut tls: qweb_testkit::tls::TlsStream) {
//! use tokio::io::AsyncWriteExt;
//! // SETTINGS_INITIAL_WINDOW_SIZE = 0, then GET /big on stream 1
//! tls.write_all(&hello(&[(0x4, 0)])).await.unwrap();
//! tls.write_all(&get(1, "/big")).await.unwrap();
//! tls.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
//! let seen = read_frames(&mut tls, std::time::Duration::from_secs(5)).await;
//! assert!(seen.resets > 0 || seen.goaway.is_some());
//! # }
//! ```

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

/// The client connection preface.
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Frame types.
pub const DATA: u8 = 0x0;
/// HEADERS.
pub const HEADERS: u8 = 0x1;
/// RST_STREAM.
pub const RST_STREAM: u8 = 0x3;
/// SETTINGS.
pub const SETTINGS: u8 = 0x4;
/// PING.
pub const PING: u8 = 0x6;
/// GOAWAY.
pub const GOAWAY: u8 = 0x7;
/// WINDOW_UPDATE.
pub const WINDOW_UPDATE: u8 = 0x8;

/// One frame: 9-byte head (length, type, flags, stream id) and `payload`.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// HEADERS for `GET path` on `stream` for `localhost` (HPACK without Huffman or indexing),
/// END_STREAM | END_HEADERS.
pub fn get(stream: u32, path: &str) -> Vec<u8> {
    let mut block = vec![0x82, 0x87]; // :method GET, :scheme https
    block.push(0x04); // :path, literal without indexing
    block.push(path.len() as u8);
    block.extend_from_slice(path.as_bytes());
    block.push(0x01); // :authority
    block.push(9);
    block.extend_from_slice(b"localhost");
    frame(HEADERS, 0x5, stream, &block)
}

/// The preface and a SETTINGS frame with `settings` (id, value).
pub fn hello(settings: &[(u16, u32)]) -> Vec<u8> {
    let mut payload = Vec::new();
    for (id, v) in settings {
        payload.extend_from_slice(&id.to_be_bytes());
        payload.extend_from_slice(&v.to_be_bytes());
    }
    let mut out = PREFACE.to_vec();
    out.extend(frame(SETTINGS, 0, 0, &payload));
    out
}

/// What a raw client saw from the server.
#[derive(Debug, Default)]
pub struct Seen {
    /// The error code of the GOAWAY, if one came.
    pub goaway: Option<u32>,
    /// RST_STREAM frames.
    pub resets: usize,
    /// HEADERS frames.
    pub headers: usize,
    /// DATA payload bytes.
    pub data_bytes: usize,
    /// The server closed the connection.
    pub eof: bool,
}

/// Reads frames until EOF (or `until` passed); records GOAWAY codes, resets, responses.
pub async fn read_frames<R: AsyncRead + Unpin>(r: &mut R, until: Duration) -> Seen {
    let mut seen = Seen::default();
    let _ = tokio::time::timeout(until, async {
        loop {
            let mut head = [0u8; 9];
            if r.read_exact(&mut head).await.is_err() {
                seen.eof = true;
                return;
            }
            let len =
                (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
            let mut payload = vec![0u8; len];
            if r.read_exact(&mut payload).await.is_err() {
                seen.eof = true;
                return;
            }
            match head[3] {
                DATA => seen.data_bytes += len,
                HEADERS => seen.headers += 1,
                RST_STREAM => seen.resets += 1,
                GOAWAY if len >= 8 => {
                    seen.goaway = Some(u32::from_be_bytes([
                        payload[4], payload[5], payload[6], payload[7],
                    ]));
                }
                _ => {}
            }
        }
    })
    .await;
    seen
}
