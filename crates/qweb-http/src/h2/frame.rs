//! HTTP/2 frames on the wire (RFC 9113 section 4 and 6): the 9-byte frame head, the frame
//! types and flags, and the writers of the frames a server sends.

use bytes::BufMut;

/// The length of a frame head.
pub const HEAD_LEN: usize = 9;

/// The client's connection preface (RFC 9113 section 3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The largest frame payload either side may send before SETTINGS_MAX_FRAME_SIZE says more,
/// and the largest qweb accepts (it never raises it).
pub const DEFAULT_MAX_FRAME: u32 = 16_384;

/// The initial flow-control window of a connection and of each stream.
pub const DEFAULT_WINDOW: u32 = 65_535;

/// The largest flow-control window (2^31 - 1).
pub const MAX_WINDOW: u32 = (1 << 31) - 1;

/// Frame types.
pub mod kind {
    #![allow(missing_docs)]
    pub const DATA: u8 = 0;
    pub const HEADERS: u8 = 1;
    pub const PRIORITY: u8 = 2;
    pub const RST_STREAM: u8 = 3;
    pub const SETTINGS: u8 = 4;
    pub const PUSH_PROMISE: u8 = 5;
    pub const PING: u8 = 6;
    pub const GOAWAY: u8 = 7;
    pub const WINDOW_UPDATE: u8 = 8;
    pub const CONTINUATION: u8 = 9;
}

/// Frame flags.
pub mod flag {
    #![allow(missing_docs)]
    /// DATA, HEADERS: the last frame of the stream from its sender.
    pub const END_STREAM: u8 = 0x1;
    /// SETTINGS, PING: an acknowledgement.
    pub const ACK: u8 = 0x1;
    /// HEADERS, CONTINUATION: the last frame of the header block.
    pub const END_HEADERS: u8 = 0x4;
    /// DATA, HEADERS: a pad length byte comes first, padding last.
    pub const PADDED: u8 = 0x8;
    /// HEADERS: a stream dependency and weight come first.
    pub const PRIORITY: u8 = 0x20;
}

/// SETTINGS identifiers.
pub mod setting {
    #![allow(missing_docs)]
    pub const HEADER_TABLE_SIZE: u16 = 0x1;
    pub const ENABLE_PUSH: u16 = 0x2;
    pub const MAX_CONCURRENT_STREAMS: u16 = 0x3;
    pub const INITIAL_WINDOW_SIZE: u16 = 0x4;
    pub const MAX_FRAME_SIZE: u16 = 0x5;
    pub const MAX_HEADER_LIST_SIZE: u16 = 0x6;
    /// RFC 8441: extended CONNECT.
    pub const ENABLE_CONNECT_PROTOCOL: u16 = 0x8;
}

/// A frame's head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// The payload's length.
    pub len: u32,
    /// The frame type ([`kind`]).
    pub kind: u8,
    /// Its flags ([`flag`]).
    pub flags: u8,
    /// The stream (the reserved bit cleared).
    pub stream: u32,
}

impl Head {
    /// The head at the start of `b` (at least [`HEAD_LEN`] bytes).
    pub fn parse(b: &[u8]) -> Head {
        Head {
            len: u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]),
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & MAX_WINDOW,
        }
    }

    /// Whether `flag` is set.
    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }
}

/// Appends a frame head.
pub fn put_head(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    debug_assert!(len < 1 << 24);
    let len = len as u32;
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
    out.put_u32(stream);
}

/// Appends a SETTINGS frame of `(id, value)` pairs.
pub fn put_settings(out: &mut Vec<u8>, settings: &[(u16, u32)]) {
    put_head(out, settings.len() * 6, kind::SETTINGS, 0, 0);
    for (id, v) in settings {
        out.put_u16(*id);
        out.put_u32(*v);
    }
}

/// Appends a SETTINGS acknowledgement.
pub fn put_settings_ack(out: &mut Vec<u8>) {
    put_head(out, 0, kind::SETTINGS, flag::ACK, 0);
}

/// Appends a PING acknowledgement of `payload`.
pub fn put_ping_ack(out: &mut Vec<u8>, payload: &[u8; 8]) {
    put_head(out, 8, kind::PING, flag::ACK, 0);
    out.extend_from_slice(payload);
}

/// Appends a WINDOW_UPDATE frame.
pub fn put_window_update(out: &mut Vec<u8>, stream: u32, increment: u32) {
    put_head(out, 4, kind::WINDOW_UPDATE, 0, stream);
    out.put_u32(increment);
}

/// Appends a RST_STREAM frame.
pub fn put_reset(out: &mut Vec<u8>, stream: u32, code: u32) {
    put_head(out, 4, kind::RST_STREAM, 0, stream);
    out.put_u32(code);
}

/// Appends a GOAWAY frame.
pub fn put_goaway(out: &mut Vec<u8>, last_stream: u32, code: u32, debug: &[u8]) {
    put_head(out, 8 + debug.len(), kind::GOAWAY, 0, 0);
    out.put_u32(last_stream);
    out.put_u32(code);
    out.extend_from_slice(debug);
}

/// Appends a header block as HEADERS and, past `max_frame` bytes, CONTINUATION frames.
pub fn put_header_block(
    out: &mut Vec<u8>,
    stream: u32,
    block: &[u8],
    end_stream: bool,
    max_frame: usize,
) {
    let mut chunks = block.chunks(max_frame.max(1)).peekable();
    let mut first = true;
    if block.is_empty() {
        let flags = flag::END_HEADERS | if end_stream { flag::END_STREAM } else { 0 };
        put_head(out, 0, kind::HEADERS, flags, stream);
        return;
    }
    while let Some(c) = chunks.next() {
        let last = chunks.peek().is_none();
        let (kind, mut flags) = if first {
            (kind::HEADERS, if end_stream { flag::END_STREAM } else { 0 })
        } else {
            (kind::CONTINUATION, 0)
        };
        if last {
            flags |= flag::END_HEADERS;
        }
        put_head(out, c.len(), kind, flags, stream);
        out.extend_from_slice(c);
        first = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_reads_back_as_written_with_the_reserved_bit_cleared() {
        let mut b = Vec::new();
        put_head(&mut b, 0x01_02_03, kind::HEADERS, flag::END_HEADERS, 7);
        assert_eq!(b.len(), HEAD_LEN);
        b[5] |= 0x80;
        let h = Head::parse(&b);
        assert_eq!(
            h,
            Head {
                len: 0x01_02_03,
                kind: kind::HEADERS,
                flags: flag::END_HEADERS,
                stream: 7
            }
        );
    }

    #[test]
    fn a_large_header_block_is_split_into_continuations() {
        let block = vec![0xAAu8; 40_000];
        let mut b = Vec::new();
        put_header_block(&mut b, 3, &block, true, 16_384);
        let mut rest = &b[..];
        let mut seen = Vec::new();
        while !rest.is_empty() {
            let h = Head::parse(rest);
            seen.push((h.kind, h.flags, h.len));
            rest = &rest[HEAD_LEN + h.len as usize..];
        }
        assert_eq!(
            seen,
            vec![
                (kind::HEADERS, flag::END_STREAM, 16_384),
                (kind::CONTINUATION, 0, 16_384),
                (kind::CONTINUATION, flag::END_HEADERS, 40_000 - 2 * 16_384),
            ]
        );
    }
}
