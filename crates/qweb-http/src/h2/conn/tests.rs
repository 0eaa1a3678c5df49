//! The connection without I/O, fed frames built by hand: the rules a client can break, and
//! random input (frames of every type with random flags, lengths and payloads, cut at random
//! places) that must never panic, grow the queue or the streams past their bounds, or go on
//! after a connection error.

use bytes::{BufMut, Bytes, BytesMut};
use h2::Reason;

use super::{Config, Connection};
use crate::h2::frame::{self, flag, kind, Head, HEAD_LEN, PREFACE};

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    frame::put_head(&mut b, payload.len(), kind, flags, stream);
    b.extend_from_slice(payload);
    b
}

/// A whole GET of `/` on stream `id`: one HEADERS frame, no body.
fn get_frame(id: u32) -> Vec<u8> {
    frame(
        kind::HEADERS,
        flag::END_HEADERS | flag::END_STREAM,
        id,
        &get_block("/"),
    )
}

/// A GET for `path` as an HPACK block (literal fields, no indexing, no Huffman).
fn get_block(path: &str) -> Vec<u8> {
    let mut b = Vec::new();
    for (n, v) in [
        (":method", "GET"),
        (":scheme", "https"),
        (":authority", "t"),
        (":path", path),
    ] {
        b.push(0x00);
        b.push(n.len() as u8);
        b.extend_from_slice(n.as_bytes());
        b.push(v.len() as u8);
        b.extend_from_slice(v.as_bytes());
    }
    b
}

fn open() -> (Connection, BytesMut) {
    let mut c = Connection::new(Config {
        max_concurrent_streams: 4,
        ..Config::default()
    });
    let mut input = BytesMut::new();
    input.extend_from_slice(PREFACE);
    input.extend_from_slice(&frame(kind::SETTINGS, 0, 0, &[]));
    c.recv(&mut input).expect("the preface and SETTINGS");
    (c, input)
}

/// The frames queued for the client so far (taken off the queue).
fn sent(c: &mut Connection) -> Vec<(Head, Vec<u8>)> {
    let mut bytes = Vec::new();
    let out = c.out();
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    let mut sink = Sink(&mut bytes);
    let _ = out.poll_write(&mut cx, &mut sink);
    let mut frames = Vec::new();
    let mut rest = &bytes[..];
    while rest.len() >= HEAD_LEN {
        let h = Head::parse(rest);
        let end = HEAD_LEN + h.len as usize;
        frames.push((h, rest[HEAD_LEN..end].to_vec()));
        rest = &rest[end..];
    }
    frames
}

struct Sink<'a>(&'a mut Vec<u8>);

impl tokio::io::AsyncWrite for Sink<'_> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.0.extend_from_slice(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

impl crate::h1::write::SendFile for Sink<'_> {
    fn can_send_file(&self) -> bool {
        false
    }
}

fn goaway_code(frames: &[(Head, Vec<u8>)]) -> Option<u32> {
    frames
        .iter()
        .find(|(h, _)| h.kind == kind::GOAWAY)
        .map(|(_, p)| u32::from_be_bytes([p[4], p[5], p[6], p[7]]))
}

#[test]
fn a_request_comes_out_once_its_header_block_is_complete() {
    let (mut c, mut input) = open();
    let block = get_block("/a");
    let (first, second) = block.split_at(10);
    input.extend_from_slice(&frame(kind::HEADERS, flag::END_STREAM, 1, first));
    c.recv(&mut input).unwrap();
    assert!(c.next_request().is_none());
    input.extend_from_slice(&frame(kind::CONTINUATION, flag::END_HEADERS, 1, second));
    c.recv(&mut input).unwrap();
    let r = c.next_request().expect("the request");
    assert_eq!(
        (r.id, r.request.uri().path(), r.end_stream),
        (1, "/a", true)
    );
    assert_eq!(r.request.uri().authority().map(|a| a.as_str()), Some("t"));
}

#[test]
fn a_stream_reset_in_the_read_that_opened_it_starts_no_work() {
    let (mut c, mut input) = open();
    for id in (1..200).step_by(2) {
        input.extend_from_slice(&get_frame(id));
        input.extend_from_slice(&frame(
            kind::RST_STREAM,
            0,
            id,
            &u32::from(Reason::CANCEL).to_be_bytes(),
        ));
    }
    c.recv(&mut input).unwrap();
    assert!(c.next_request().is_none());
    assert_eq!(c.open_streams(), 0);
    assert_eq!(c.resets_by_client, 100);
}

#[test]
fn streams_past_the_limit_are_refused() {
    let (mut c, mut input) = open();
    for id in (1..=11).step_by(2) {
        input.extend_from_slice(&get_frame(id));
    }
    c.recv(&mut input).unwrap();
    let mut n = 0;
    while c.next_request().is_some() {
        n += 1;
    }
    assert_eq!(n, 4);
    let refused: Vec<u32> = sent(&mut c)
        .iter()
        .filter(|(h, _)| h.kind == kind::RST_STREAM)
        .map(|(h, _)| h.stream)
        .collect();
    assert_eq!(refused, vec![9, 11]);
}

#[test]
fn a_header_block_that_never_ends_ends_the_connection() {
    let (mut c, mut input) = open();
    input.extend_from_slice(&frame(kind::HEADERS, 0, 1, &get_block("/")));
    let junk = vec![0u8; 16_000];
    let mut failed = None;
    for _ in 0..100 {
        input.extend_from_slice(&frame(kind::CONTINUATION, 0, 1, &junk));
        if let Err(e) = c.recv(&mut input) {
            failed = Some(e);
            break;
        }
    }
    let e = failed.expect("the CONTINUATION flood is cut");
    assert_eq!(e.reason, Reason::ENHANCE_YOUR_CALM);
    assert_eq!(
        goaway_code(&sent(&mut c)),
        Some(u32::from(Reason::ENHANCE_YOUR_CALM))
    );
}

#[test]
fn data_past_the_window_is_a_flow_control_error() {
    let (mut c, mut input) = open();
    input.extend_from_slice(&frame(kind::HEADERS, flag::END_HEADERS, 1, &get_block("/")));
    c.recv(&mut input).unwrap();
    let chunk = vec![1u8; 16_384];
    let mut r = Ok(());
    // the connection's window is 1 MiB: the 65th full frame is over it
    for _ in 0..65 {
        input.extend_from_slice(&frame(kind::DATA, 0, 1, &chunk));
        r = c.recv(&mut input);
        if r.is_err() {
            break;
        }
    }
    assert_eq!(r.unwrap_err().reason, Reason::FLOW_CONTROL_ERROR);
}

/// xorshift64*: the same input every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A frame of a random type (mostly the known ones), flags, stream and payload; HEADERS
/// often carry a valid block, so that streams open.
fn random_frame(r: &mut Rng) -> Vec<u8> {
    let kind = match r.below(12) {
        k @ 0..=9 => k as u8,
        _ => r.below(256) as u8,
    };
    let flags = r.below(256) as u8;
    let stream = match r.below(4) {
        0 => 0,
        1 => r.below(1 << 31) as u32,
        _ => r.below(40) as u32,
    };
    let mut payload: Vec<u8> = match (kind, r.below(3)) {
        (kind::HEADERS, 0 | 1) => get_block("/x"),
        (kind::WINDOW_UPDATE | kind::RST_STREAM, 0 | 1) => (r.next() as u32).to_be_bytes().to_vec(),
        (kind::SETTINGS, 0 | 1) => {
            let mut p = Vec::new();
            for _ in 0..r.below(4) {
                p.put_u16(r.below(10) as u16);
                p.put_u32(r.next() as u32);
            }
            p
        }
        (kind::PING, 0 | 1) => vec![7; 8],
        _ => (0..r.below(64)).map(|_| r.next() as u8).collect(),
    };
    if r.below(20) == 0 {
        payload = vec![0; r.below(20_000) as usize];
    }
    frame(kind, flags, stream, &payload)
}

#[test]
fn random_frames_never_panic_and_stay_bounded() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for _ in 0..2_000 {
        let (mut c, mut input) = open();
        let mut wire = Vec::new();
        for _ in 0..rng.below(40) {
            wire.extend_from_slice(&random_frame(&mut rng));
        }
        let mut at = 0;
        let mut failed = false;
        while at < wire.len() {
            let n = (rng.below(3000) as usize + 1).min(wire.len() - at);
            input.extend_from_slice(&wire[at..at + n]);
            at += n;
            let r = c.recv(&mut input);
            if failed {
                assert!(
                    r.is_ok() && c.failed(),
                    "input read after a connection error"
                );
            }
            failed |= r.is_err();
            while let Some(req) = c.next_request() {
                // answer some at once, leave some open
                if req.id % 3 == 0 {
                    c.send_headers(
                        req.id,
                        http::StatusCode::OK,
                        http::HeaderMap::new(),
                        None,
                        false,
                    );
                    let mut body = Bytes::from_static(b"hello");
                    c.send_data(req.id, &mut body, true);
                }
            }
            assert!(c.open_streams() <= 4, "{} streams open", c.open_streams());
            assert!(c.queued() < 1 << 20, "{} bytes queued", c.queued());
            let _ = sent(&mut c);
        }
        assert!(
            input.len() < 20_000 + HEAD_LEN,
            "{} bytes held",
            input.len()
        );
    }
}

/// A client that sets SETTINGS_HEADER_TABLE_SIZE gets the table's size update (to 0) at the
/// start of the next header block, once: a decoder such as nghttp2's requires it.
#[test]
fn a_lowered_header_table_size_is_acknowledged_in_the_next_block() {
    let (mut c, mut input) = open();
    let mut settings = Vec::new();
    settings.put_u16(frame::setting::HEADER_TABLE_SIZE);
    settings.put_u32(0);
    input.extend_from_slice(&frame(kind::SETTINGS, 0, 0, &settings));
    for id in [1, 3] {
        input.extend_from_slice(&get_frame(id));
    }
    c.recv(&mut input).unwrap();
    for id in [1, 3] {
        assert!(c.next_request().is_some());
        assert!(c.send_headers(
            id,
            http::StatusCode::NOT_FOUND,
            http::HeaderMap::new(),
            None,
            true
        ));
    }
    let blocks: Vec<Vec<u8>> = sent(&mut c)
        .into_iter()
        .filter(|(h, _)| h.kind == kind::HEADERS)
        .map(|(_, p)| p)
        .collect();
    // the update once, then `:status: 404` (the layer's Server and Date follow)
    assert_eq!(blocks.len(), 2);
    assert_eq!(blocks[0][..2], [0x20, 0x80 | 13]);
    assert_eq!(blocks[1][0], 0x80 | 13);
    assert_eq!(blocks[0].len(), blocks[1].len() + 1);
}

/// An extended CONNECT answered 200 is a tunnel: the server's side may end (END_STREAM) while
/// the client's goes on sending, and the tunnel still reads it (no RST_STREAM).
#[test]
fn a_tunnel_half_closed_by_the_server_still_reads_the_client() {
    let mut c = Connection::new(Config {
        connect_protocol: true,
        ..Config::default()
    });
    let mut input = BytesMut::new();
    input.extend_from_slice(PREFACE);
    input.extend_from_slice(&frame(kind::SETTINGS, 0, 0, &[]));
    let mut block = Vec::new();
    for (n, v) in [
        (":method", "CONNECT"),
        (":protocol", "websocket"),
        (":scheme", "https"),
        (":authority", "t"),
        (":path", "/ws"),
    ] {
        block.push(0x00);
        block.push(n.len() as u8);
        block.extend_from_slice(n.as_bytes());
        block.push(v.len() as u8);
        block.extend_from_slice(v.as_bytes());
    }
    input.extend_from_slice(&frame(kind::HEADERS, flag::END_HEADERS, 1, &block));
    c.recv(&mut input).unwrap();
    let r = c.next_request().expect("the CONNECT");
    assert!(r.tunnel && r.end_stream);
    assert!(c.send_headers(1, http::StatusCode::OK, http::HeaderMap::new(), None, true));
    assert!(c.send_data(1, &mut Bytes::new(), true));
    input.extend_from_slice(&frame(kind::DATA, 0, 1, b"still here"));
    c.recv(&mut input).unwrap();
    let frames = sent(&mut c);
    assert!(
        frames.iter().all(|(h, _)| h.kind != kind::RST_STREAM),
        "reset"
    );
    let heads: Vec<u8> = frames
        .iter()
        .filter(|(h, _)| h.stream == 1)
        .map(|(h, _)| h.flags & flag::END_STREAM)
        .collect();
    assert_eq!(
        heads,
        vec![0, flag::END_STREAM],
        "HEADERS open, then an empty DATA ending the server's side"
    );
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    match c.poll_tunnel_read(1, &mut cx) {
        std::task::Poll::Ready(Some(Ok(d))) => assert_eq!(&d[..], b"still here"),
        _ => panic!("the client's bytes are the tunnel's"),
    }
}
