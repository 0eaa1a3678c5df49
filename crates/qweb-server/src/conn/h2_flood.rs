//! HTTP/2 control-frame flood budget (the 2019 HTTP/2 DoS advisories: ping, settings, reset,
//! empty-frames and priority floods, CVE-2019-9512/9515/9516/9518 and kin).
//!
//! h2 itself limits only rapid resets. This module reads the frame headers of what the client
//! sends (the plaintext under TLS, as hyper sees it) and charges one token for every frame that
//! costs the server work but carries neither a request nor data: SETTINGS, PING,
//! WINDOW_UPDATE, PRIORITY, RST_STREAM, unknown frame types, and DATA / HEADERS / CONTINUATION
//! frames with an empty payload (DATA that ends its stream is free). The budget refills at
//! `rate` tokens per second up to `rate` tokens (one second of burst), and every 4 KiB the
//! server sends adds a token: a client that downloads fast sends WINDOW_UPDATEs in proportion
//! (Envoy ties its WINDOW_UPDATE budget to the DATA frames it sent in the same way). A client
//! past the budget gets GOAWAY ENHANCE_YOUR_CALM and is closed, as nginx, h2o and Envoy do.

use tokio::time::Instant;

/// The client connection preface ("PRI * HTTP/2.0...").
const PREFACE_LEN: usize = 24;
/// Server bytes sent per extra token.
const CREDIT_BYTES: u64 = 4096;

/// A frame header as read off the wire.
#[derive(Debug, Clone, Copy)]
struct FrameHead {
    len: usize,
    kind: u8,
    flags: u8,
    stream: u32,
}

/// Splits a byte stream into HTTP/2 frame headers (payloads are skipped).
#[derive(Debug, Default)]
struct Splitter {
    head: [u8; 9],
    have: usize,
    skip: usize,
}

impl Splitter {
    /// Feeds `buf`; calls `on_head` for every complete frame header.
    fn feed(&mut self, mut buf: &[u8], mut on_head: impl FnMut(FrameHead)) {
        while !buf.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(buf.len());
                self.skip -= n;
                buf = &buf[n..];
                continue;
            }
            let n = (9 - self.have).min(buf.len());
            self.head[self.have..self.have + n].copy_from_slice(&buf[..n]);
            self.have += n;
            buf = &buf[n..];
            if self.have == 9 {
                let h = &self.head;
                let head = FrameHead {
                    len: (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]),
                    kind: h[3],
                    flags: h[4],
                    stream: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
                };
                self.have = 0;
                self.skip = head.len;
                on_head(head);
            }
        }
    }

    /// Bytes until the current frame ends (0: at a frame boundary). While a header is
    /// incomplete, the bytes until the header is complete.
    fn to_boundary(&self) -> usize {
        if self.have > 0 {
            9 - self.have
        } else {
            self.skip
        }
    }
}

/// The flood meter of one HTTP/2 connection: reads what the client sends, and what the server
/// sends (to credit the budget and to know where the server's frames end).
#[derive(Debug)]
pub(crate) struct FloodMeter {
    preface_left: usize,
    inbound: Splitter,
    outbound: Splitter,
    rate: f64,
    tokens: f64,
    refilled: Instant,
    written: u64,
    last_stream: u32,
    over: bool,
}

impl FloodMeter {
    /// A meter allowing `rate` control frames per second (and a burst of as many).
    pub(crate) fn new(rate: u32) -> Self {
        let rate = f64::from(rate.max(1));
        FloodMeter {
            preface_left: PREFACE_LEN,
            inbound: Splitter::default(),
            outbound: Splitter::default(),
            rate,
            tokens: rate,
            refilled: Instant::now(),
            written: 0,
            last_stream: 0,
            over: false,
        }
    }

    /// Bytes read from the client. Returns `true` once the client went over its budget.
    pub(crate) fn on_read(&mut self, mut buf: &[u8]) -> bool {
        if self.preface_left > 0 {
            let n = self.preface_left.min(buf.len());
            self.preface_left -= n;
            buf = &buf[n..];
        }
        let mut charged = 0u32;
        let last_stream = &mut self.last_stream;
        self.inbound.feed(buf, |h| {
            if chargeable(h) {
                charged += 1;
            }
            if h.kind == HEADERS {
                *last_stream = (*last_stream).max(h.stream);
            }
        });
        if charged > 0 && !self.over {
            let now = Instant::now();
            let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
            self.refilled = now;
            self.tokens = (self.tokens + elapsed * self.rate).min(self.rate);
            self.tokens -= f64::from(charged);
            if self.tokens < 0.0 {
                self.over = true;
            }
        }
        self.over
    }

    /// Bytes the server wrote: credits the budget and follows the server's frame boundaries.
    pub(crate) fn on_write(&mut self, buf: &[u8]) {
        self.outbound.feed(buf, |_| {});
        self.written += buf.len() as u64;
        if self.written >= CREDIT_BYTES {
            let credit = (self.written / CREDIT_BYTES) as f64;
            self.written %= CREDIT_BYTES;
            self.tokens = (self.tokens + credit).min(self.rate);
        }
    }

    /// Bytes the server must still write to end the frame it is in the middle of (0: at a
    /// frame boundary, where a GOAWAY can be written).
    pub(crate) fn write_to_boundary(&self) -> usize {
        self.outbound.to_boundary()
    }

    /// The GOAWAY ENHANCE_YOUR_CALM frame to send, naming the last stream the client opened.
    pub(crate) fn goaway(&self) -> [u8; 17] {
        let mut f = [0u8; 17];
        f[2] = 8; // length
        f[3] = GOAWAY;
        f[9..13].copy_from_slice(&self.last_stream.to_be_bytes());
        f[13..17].copy_from_slice(&ENHANCE_YOUR_CALM.to_be_bytes());
        f
    }
}

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const GOAWAY: u8 = 0x7;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const ENHANCE_YOUR_CALM: u32 = 0xb;

/// Does this frame cost a token?
fn chargeable(h: FrameHead) -> bool {
    match h.kind {
        DATA => h.len == 0 && h.flags & END_STREAM == 0,
        HEADERS | CONTINUATION => h.len == 0,
        GOAWAY => false,
        // PRIORITY (2), RST_STREAM (3), SETTINGS (4), PUSH_PROMISE (5, a protocol error from a
        // client anyway), PING (6), WINDOW_UPDATE (8), and unknown extension frames.
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn counts_control_frames_split_anywhere() {
        let mut m = FloodMeter::new(10);
        let mut wire = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        wire.extend(frame(4, 0, 0, &[0; 6])); // SETTINGS
        wire.extend(frame(1, 4, 1, &[0x82; 20])); // HEADERS, stream 1: free
        wire.extend(frame(0, 0, 1, &[7; 100])); // DATA with payload: free
        wire.extend(frame(0, 1, 1, &[])); // empty DATA ending the stream: free
        for _ in 0..9 {
            wire.extend(frame(6, 0, 0, &[0; 8])); // PING
        }
        // one byte at a time: headers split across reads are still seen
        for b in &wire {
            assert!(!m.on_read(std::slice::from_ref(b)));
        }
        assert_eq!(m.last_stream, 1);
        // the budget (10) is spent: one more control frame is over
        assert!(m.on_read(&frame(8, 0, 0, &[0, 0, 1, 0])));
    }

    #[test]
    fn empty_frames_are_charged_and_data_written_credits() {
        let mut m = FloodMeter::new(2);
        m.on_read(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
        assert!(!m.on_read(&frame(0, 0, 1, &[])));
        assert!(!m.on_read(&frame(9, 0, 1, &[])));
        // the server sends 8 KiB: two more tokens
        m.on_write(&frame(0, 0, 1, &[0; 8192]));
        assert!(!m.on_read(&frame(8, 0, 1, &[0, 0, 1, 0])));
        assert!(!m.on_read(&frame(8, 0, 0, &[0, 0, 1, 0])));
        assert!(m.on_read(&frame(2, 0, 3, &[0; 5])));
    }

    #[test]
    fn knows_where_the_servers_frames_end() {
        let mut m = FloodMeter::new(2);
        assert_eq!(m.write_to_boundary(), 0);
        let f = frame(0, 0, 1, &[0; 100]);
        m.on_write(&f[..4]);
        assert_eq!(m.write_to_boundary(), 5);
        m.on_write(&f[4..50]);
        assert_eq!(m.write_to_boundary(), 59);
        m.on_write(&f[50..]);
        assert_eq!(m.write_to_boundary(), 0);
        let g = m.goaway();
        assert_eq!(&g[..9], &[0, 0, 8, 7, 0, 0, 0, 0, 0]);
        assert_eq!(&g[13..], &[0, 0, 0, 0xb]);
    }
}
