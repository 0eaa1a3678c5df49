//! The server side of one HTTP/2 connection, without I/O: bytes from the client go in
//! ([`Connection::recv`]), new requests come out ([`Connection::next_request`]), responses go
//! in ([`Connection::send_headers`], [`Connection::send_data`], [`Connection::send_trailers`]),
//! and the bytes to write wait in [`Connection::out`]. Flow control both ways, stream states,
//! SETTINGS, PING and GOAWAY are handled here; HPACK is the `h2` crate's codec.
//!
//! The driver owns the I/O and the stream tasks; it shares this state with them and with the
//! request bodies (`Rc<RefCell<Connection>>`, one thread), each call short and never
//! re-entrant. Wakers stored here are only woken, never polled.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::io::Cursor;
use std::ops::ControlFlow;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use bytes::{Buf, Bytes, BytesMut};
use h2::hpack;
use h2::Reason;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, StatusCode};

use super::frame::{self, flag, kind, setting, Head, HEAD_LEN};
use crate::h1::write::Output;

/// What a connection allows its client.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Streams the client may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS).
    pub max_concurrent_streams: u32,
    /// The largest header list (decoded, RFC 9113 section 6.5.2) a request may carry before
    /// it is answered 431 by the service; four times as much ends the connection.
    pub max_header_list_size: u32,
    /// The receive window of each stream (request body bytes the client may send ahead).
    pub stream_window: u32,
    /// The receive window of the connection (all its request bodies together).
    pub connection_window: u32,
    /// The largest DATA payload sent (16 375: a frame and its head fill one TLS record).
    pub max_data_frame: u32,
    /// RFC 8441: extended CONNECT (WebSocket over HTTP/2) is offered.
    pub connect_protocol: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_concurrent_streams: 128,
            max_header_list_size: 16 * 1024,
            stream_window: 1 << 20,
            connection_window: 1 << 20,
            max_data_frame: 16_375,
            connect_protocol: false,
        }
    }
}

/// What a stream's task is told when the stream ends before the task did (the client reset
/// it, or it broke a rule): it stops, dropping its response body.
pub trait Cancel {
    /// Stops the task.
    fn cancel(&self);
}

/// A request the client opened.
pub struct NewStream {
    /// The stream's id.
    pub id: u32,
    /// The request's head (the body comes through [`Connection::poll_body`]).
    pub request: Request<()>,
    /// The request has no body (END_STREAM on its HEADERS).
    pub end_stream: bool,
}

/// Why the connection ended from the server's side: a GOAWAY with this code is queued in
/// [`Connection::out`]; the driver writes it and closes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("HTTP/2 connection error {reason:?}: {why}")]
pub struct ConnError {
    /// The GOAWAY's error code.
    pub reason: Reason,
    /// What the client did (the GOAWAY's debug data).
    pub why: &'static str,
}

fn conn_err(reason: Reason, why: &'static str) -> ConnError {
    ConnError { reason, why }
}

/// A stream's body ended with an error: the stream was reset, or broke the framing rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("HTTP/2 request stream ended: {0}")]
pub struct StreamEnded(pub &'static str);

/// Responses queued beyond this many bytes wait for the driver to write (a client that does
/// not read holds this much per connection, whatever the windows it grants).
const OUT_HIGH: usize = 128 * 1024;

/// DATA payloads under this size are copied beside the framing; larger ones are queued as
/// they are (each its own buffer of the vectored write).
const COPY_BELOW: usize = 4096;

/// Recently closed stream ids kept to tell "closed" (STREAM_CLOSED) from "never used"
/// (PROTOCOL_ERROR) for a frame on a stream id at or below the highest seen.
const RECENT_CLOSED: usize = 64;

/// Hashes a stream id as itself (ids are the client's, but a map keyed by them holds at
/// most `max_concurrent_streams` entries; odd ids spread over the buckets' low bits once
/// shifted).
#[derive(Default)]
struct IdHash(u64);

impl Hasher for IdHash {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n >> 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type Streams = HashMap<u32, Stream, BuildHasherDefault<IdHash>>;

#[derive(Default)]
struct Stream {
    /// The client may still send on it (no END_STREAM yet).
    recv_open: bool,
    /// The server may still send on it.
    send_open: bool,
    /// The response's HEADERS went out (later ones are trailers).
    head_sent: bool,
    send_window: i64,
    /// Bytes the client may still send.
    recv_window: i64,
    /// Bytes the body took that were not yet granted back.
    unreleased: u32,
    recv: VecDeque<Bytes>,
    trailers: Option<HeaderMap>,
    received: u64,
    content_length: Option<u64>,
    /// The body took its end, or was dropped: nothing more is kept for it.
    body_done: bool,
    body_waker: Option<Waker>,
    send_waker: Option<Waker>,
    /// `Expect: 100-continue`: a 100 goes out when the body is first asked for data.
    expect_continue: bool,
    task: Option<Rc<dyn Cancel>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The client's preface is awaited.
    Preface,
    /// The client's first SETTINGS is awaited.
    Settings,
    Open,
    /// A connection error was sent: nothing more is read.
    Failed,
}

/// A header block being received (HEADERS without END_HEADERS, then CONTINUATIONs).
struct Block {
    stream: u32,
    end_stream: bool,
    /// The HEADERS frame carried a priority that makes the stream depend on itself.
    bad_priority: bool,
    buf: BytesMut,
}

/// The server side of one HTTP/2 connection.
pub struct Connection {
    config: Config,
    phase: Phase,
    decoder: hpack::Decoder,
    encoder: hpack::Encoder,
    /// Scratch space for an encoded header block.
    scratch: BytesMut,
    streams: Streams,
    /// The highest stream id the client opened.
    last_id: u32,
    recent_closed: VecDeque<u32>,
    send_window: i64,
    recv_window: i64,
    /// Connection-level bytes taken (or discarded) and not yet granted back.
    unreleased: u32,
    peer_initial_window: u32,
    peer_max_frame: u32,
    block: Option<Block>,
    out: Output,
    requests: VecDeque<NewStream>,
    /// GOAWAY went out saying this stream was the last one served.
    goaway: Option<u32>,
    /// The client sent GOAWAY: it opens no more streams.
    peer_goaway: bool,
    /// Streams waiting for send window or for the queue to drain.
    blocked: Vec<u32>,
    /// The driver's waker, woken when bytes are queued outside its turn.
    driver: Option<Waker>,
    in_turn: bool,
    /// Streams the client reset (counted: a client that opens and resets streams without end
    /// is the rapid-reset attack, CVE-2023-44487).
    pub resets_by_client: u64,
}

impl Connection {
    /// A connection that has just been accepted: the server's SETTINGS (and the connection
    /// window's raise) are queued at once, before the client's preface is in.
    pub fn new(config: Config) -> Self {
        let mut c = Connection {
            config,
            phase: Phase::Preface,
            decoder: hpack::Decoder::new(4096),
            encoder: hpack::Encoder::new(4096, 0),
            scratch: BytesMut::new(),
            streams: Streams::default(),
            last_id: 0,
            recent_closed: VecDeque::new(),
            send_window: i64::from(frame::DEFAULT_WINDOW),
            recv_window: i64::from(frame::DEFAULT_WINDOW),
            unreleased: 0,
            peer_initial_window: frame::DEFAULT_WINDOW,
            peer_max_frame: frame::DEFAULT_MAX_FRAME,
            block: None,
            out: Output::default(),
            requests: VecDeque::new(),
            goaway: None,
            peer_goaway: false,
            blocked: Vec::new(),
            driver: None,
            in_turn: true,
            resets_by_client: 0,
        };
        let mut settings = vec![
            (
                setting::MAX_CONCURRENT_STREAMS,
                config.max_concurrent_streams,
            ),
            (setting::INITIAL_WINDOW_SIZE, config.stream_window),
            (setting::MAX_HEADER_LIST_SIZE, config.max_header_list_size),
        ];
        if config.connect_protocol {
            settings.push((setting::ENABLE_CONNECT_PROTOCOL, 1));
        }
        let raise = config
            .connection_window
            .saturating_sub(frame::DEFAULT_WINDOW);
        c.small(|b| {
            frame::put_settings(b, &settings);
            if raise > 0 {
                frame::put_window_update(b, 0, raise);
            }
        });
        c.recv_window += i64::from(raise);
        c
    }

    fn small(&mut self, f: impl FnOnce(&mut Vec<u8>)) {
        self.out.small(f);
        if !self.in_turn {
            if let Some(w) = &self.driver {
                w.wake_by_ref();
            }
        }
    }

    /// What is queued for the client.
    pub fn out(&mut self) -> &mut Output {
        &mut self.out
    }

    /// Bytes queued for the client.
    pub fn queued(&self) -> usize {
        self.out.queued()
    }

    /// The driver wrote some of [`Connection::out`]: streams waiting for the queue to drain
    /// are woken once it is under its mark.
    pub fn wrote(&mut self) {
        if self.queued() < OUT_HIGH / 2 {
            self.wake_blocked();
        }
    }

    /// The driver's turn starts (`Some`: its waker) or ends (`None`): bytes queued outside
    /// its turn (by a request body in another task) wake it.
    pub fn turn(&mut self, driver: Option<&Waker>) {
        match driver {
            Some(w) => {
                self.in_turn = true;
                if !self.driver.as_ref().is_some_and(|d| d.will_wake(w)) {
                    self.driver = Some(w.clone());
                }
            }
            None => self.in_turn = false,
        }
    }

    /// Streams open now (a request in flight, or its body not yet taken).
    pub fn open_streams(&self) -> usize {
        self.streams.len()
    }

    /// The client said GOAWAY, or the server did and every stream it serves is over.
    pub fn is_done(&self) -> bool {
        (self.peer_goaway || self.goaway.is_some()) && self.streams.is_empty()
            || self.phase == Phase::Failed
    }

    /// Whether a connection error ended the connection.
    pub fn failed(&self) -> bool {
        self.phase == Phase::Failed
    }

    /// The next request the client opened.
    pub fn next_request(&mut self) -> Option<NewStream> {
        self.requests.pop_front()
    }

    /// Sets the task that serves stream `id` (cancelled when the stream ends early).
    pub fn set_task(&mut self, id: u32, task: Rc<dyn Cancel>) {
        if let Some(s) = self.streams.get_mut(&id) {
            s.task = Some(task);
        } else {
            // (reset before its task started)
            task.cancel();
        }
    }

    /// Frees what an idle connection does not need (the HPACK decoder's scratch buffer and
    /// the encoder's); the queue is the driver's.
    pub fn release_idle_buffers(&mut self) {
        if self.streams.is_empty() {
            self.decoder.release_buffer();
            self.scratch = BytesMut::new();
            if self.out.is_empty() {
                self.out = Output::default();
            }
        }
    }

    /// A graceful GOAWAY: streams opened so far are served, later ones refused.
    pub fn graceful_shutdown(&mut self) {
        if self.goaway.is_none() && self.phase != Phase::Failed {
            let last = self.last_id;
            self.goaway = Some(last);
            self.small(|b| frame::put_goaway(b, last, Reason::NO_ERROR.into(), b""));
        }
    }

    /// Ends the connection with GOAWAY `reason` (every stream's task cancelled).
    pub fn abort(&mut self, reason: Reason, why: &'static str) -> ConnError {
        self.fail(conn_err(reason, why))
    }

    fn fail(&mut self, e: ConnError) -> ConnError {
        if self.phase != Phase::Failed {
            self.phase = Phase::Failed;
            let last = self.last_id;
            self.small(|b| frame::put_goaway(b, last, e.reason.into(), e.why.as_bytes()));
            for (_, s) in self.streams.drain() {
                if let Some(t) = &s.task {
                    t.cancel();
                }
                if let Some(w) = s.body_waker {
                    w.wake();
                }
                if let Some(w) = s.send_waker {
                    w.wake();
                }
            }
        }
        e
    }

    /// Reads the frames complete in `buf` (consumed as they are read). `Err`: a connection
    /// error; its GOAWAY is queued.
    pub fn recv(&mut self, buf: &mut BytesMut) -> Result<(), ConnError> {
        let r = self.recv_frames(buf);
        match r {
            Err(e) => Err(self.fail(e)),
            Ok(()) => Ok(()),
        }
    }

    fn recv_frames(&mut self, buf: &mut BytesMut) -> Result<(), ConnError> {
        if self.phase == Phase::Failed {
            buf.clear();
            return Ok(());
        }
        if self.phase == Phase::Preface {
            let n = buf.len().min(frame::PREFACE.len());
            if buf[..n] != frame::PREFACE[..n] {
                return Err(conn_err(
                    Reason::PROTOCOL_ERROR,
                    "invalid connection preface",
                ));
            }
            if n < frame::PREFACE.len() {
                return Ok(());
            }
            buf.advance(n);
            self.phase = Phase::Settings;
        }
        while buf.len() >= HEAD_LEN {
            let head = Head::parse(buf);
            if head.len > frame::DEFAULT_MAX_FRAME {
                return Err(conn_err(
                    Reason::FRAME_SIZE_ERROR,
                    "frame larger than SETTINGS_MAX_FRAME_SIZE",
                ));
            }
            let total = HEAD_LEN + head.len as usize;
            if buf.len() < total {
                buf.reserve(total - buf.len());
                break;
            }
            let mut payload = buf.split_to(total);
            payload.advance(HEAD_LEN);
            self.frame(head, payload)?;
            if self.phase == Phase::Failed {
                break;
            }
        }
        Ok(())
    }

    fn frame(&mut self, head: Head, payload: BytesMut) -> Result<(), ConnError> {
        if self.phase == Phase::Settings {
            if head.kind != kind::SETTINGS || head.has(flag::ACK) {
                return Err(conn_err(
                    Reason::PROTOCOL_ERROR,
                    "the first frame was not SETTINGS",
                ));
            }
            self.phase = Phase::Open;
        }
        if let Some(b) = &self.block {
            if head.kind != kind::CONTINUATION || head.stream != b.stream {
                return Err(conn_err(
                    Reason::PROTOCOL_ERROR,
                    "a header block was interrupted",
                ));
            }
        }
        match head.kind {
            kind::DATA => self.data(head, payload),
            kind::HEADERS => self.headers(head, payload),
            kind::PRIORITY => self.priority(head, &payload),
            kind::RST_STREAM => self.rst_stream(head, &payload),
            kind::SETTINGS => self.settings(head, &payload),
            kind::PUSH_PROMISE => Err(conn_err(
                Reason::PROTOCOL_ERROR,
                "PUSH_PROMISE from a client",
            )),
            kind::PING => self.ping(head, &payload),
            kind::GOAWAY => {
                if head.stream != 0 {
                    return Err(conn_err(Reason::PROTOCOL_ERROR, "GOAWAY on a stream"));
                }
                if payload.len() < 8 {
                    return Err(conn_err(
                        Reason::FRAME_SIZE_ERROR,
                        "GOAWAY shorter than 8 bytes",
                    ));
                }
                self.peer_goaway = true;
                Ok(())
            }
            kind::WINDOW_UPDATE => self.window_update(head, &payload),
            kind::CONTINUATION => self.continuation(head, payload),
            // (unknown frame types are ignored, RFC 9113 section 4.1)
            _ => Ok(()),
        }
    }

    /// Whether `id`, a client stream id at or below the highest seen and not open, was used
    /// (closed) rather than skipped.
    fn was_closed(&self, id: u32) -> bool {
        self.recent_closed.contains(&id)
    }

    fn closed(&mut self, id: u32) {
        if self.recent_closed.len() == RECENT_CLOSED {
            self.recent_closed.pop_front();
        }
        self.recent_closed.push_back(id);
    }

    /// Resets stream `id` with `reason` (a stream error): RST_STREAM is queued, its task
    /// cancelled, its body told.
    fn reset(&mut self, id: u32, reason: Reason) {
        self.small(|b| frame::put_reset(b, id, reason.into()));
        self.drop_stream(id);
    }

    fn drop_stream(&mut self, id: u32) {
        if let Some(s) = self.streams.remove(&id) {
            // bytes it held are the connection's again
            let held: usize = s.recv.iter().map(Bytes::len).sum();
            self.release_conn(held as u32);
            if let Some(t) = &s.task {
                t.cancel();
            }
            if let Some(w) = s.body_waker {
                w.wake();
            }
            if let Some(w) = s.send_waker {
                w.wake();
            }
            self.closed(id);
        }
    }

    /// Removes stream `id` once both sides are over and its body took its end.
    fn maybe_close(&mut self, id: u32) {
        let over = self
            .streams
            .get(&id)
            .is_some_and(|s| !s.recv_open && !s.send_open && s.body_done);
        if over {
            self.streams.remove(&id);
            self.closed(id);
        }
    }

    fn data(&mut self, head: Head, mut payload: BytesMut) -> Result<(), ConnError> {
        if head.stream == 0 {
            return Err(conn_err(Reason::PROTOCOL_ERROR, "DATA on stream 0"));
        }
        let len = payload.len() as i64;
        // the whole payload counts against the windows, padding included
        if len > self.recv_window {
            return Err(conn_err(
                Reason::FLOW_CONTROL_ERROR,
                "DATA beyond the connection's window",
            ));
        }
        self.recv_window -= len;
        strip_padding(head, &mut payload)?;
        let padding = len as usize - payload.len();
        let Some(s) = self.streams.get_mut(&head.stream) else {
            self.release_conn(len as u32);
            if head.stream > self.last_id {
                return Err(conn_err(Reason::PROTOCOL_ERROR, "DATA on an idle stream"));
            }
            self.small(|b| frame::put_reset(b, head.stream, Reason::STREAM_CLOSED.into()));
            return Ok(());
        };
        if !s.recv_open {
            self.release_conn(len as u32);
            self.reset(head.stream, Reason::STREAM_CLOSED);
            return Ok(());
        }
        if len > s.recv_window {
            return Err(conn_err(
                Reason::FLOW_CONTROL_ERROR,
                "DATA beyond the stream's window",
            ));
        }
        s.recv_window -= len;
        s.received += payload.len() as u64;
        let end = head.has(flag::END_STREAM);
        let bad_length = s
            .content_length
            .is_some_and(|n| s.received > n || end && s.received != n);
        if bad_length {
            self.release_conn(len as u32);
            self.reset(head.stream, Reason::PROTOCOL_ERROR);
            return Ok(());
        }
        if end {
            s.recv_open = false;
        }
        let keep = payload.len();
        if s.body_done || keep == 0 {
            // nobody reads it: the window goes back at once
            let back = if s.body_done {
                len as u32
            } else {
                padding as u32
            };
            let id = head.stream;
            self.release_stream(id, back);
            self.release_conn(back);
            if end {
                if let Some(w) = self.streams.get_mut(&id).and_then(|s| s.body_waker.take()) {
                    w.wake();
                }
                self.maybe_close(id);
            }
            return Ok(());
        }
        s.recv.push_back(payload.freeze());
        if let Some(w) = s.body_waker.take() {
            w.wake();
        }
        if padding > 0 {
            let id = head.stream;
            self.release_stream(id, padding as u32);
            self.release_conn(padding as u32);
        }
        Ok(())
    }

    /// `n` bytes of the connection's window are free again: granted back once a quarter of
    /// the window is (fewer WINDOW_UPDATE frames).
    fn release_conn(&mut self, n: u32) {
        self.unreleased = self.unreleased.saturating_add(n);
        if self.unreleased >= self.config.connection_window / 4 && self.phase != Phase::Failed {
            let n = self.unreleased;
            self.unreleased = 0;
            self.recv_window += i64::from(n);
            self.small(|b| frame::put_window_update(b, 0, n));
        }
    }

    fn release_stream(&mut self, id: u32, n: u32) {
        let quarter = self.config.stream_window / 4;
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        if !s.recv_open {
            return;
        }
        s.unreleased = s.unreleased.saturating_add(n);
        if s.unreleased >= quarter {
            let n = s.unreleased;
            s.unreleased = 0;
            s.recv_window += i64::from(n);
            self.small(|b| frame::put_window_update(b, id, n));
        }
    }

    fn headers(&mut self, head: Head, mut payload: BytesMut) -> Result<(), ConnError> {
        if head.stream == 0 {
            return Err(conn_err(Reason::PROTOCOL_ERROR, "HEADERS on stream 0"));
        }
        if head.stream % 2 == 0 {
            return Err(conn_err(
                Reason::PROTOCOL_ERROR,
                "HEADERS on a server stream id",
            ));
        }
        strip_padding(head, &mut payload)?;
        let mut bad_priority = false;
        if head.has(flag::PRIORITY) {
            if payload.len() < 5 {
                return Err(conn_err(
                    Reason::FRAME_SIZE_ERROR,
                    "HEADERS too short for its priority",
                ));
            }
            let dep = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]])
                & frame::MAX_WINDOW;
            bad_priority = dep == head.stream;
            payload.advance(5);
        }
        let block = Block {
            stream: head.stream,
            end_stream: head.has(flag::END_STREAM),
            bad_priority,
            buf: payload,
        };
        if head.has(flag::END_HEADERS) {
            self.header_block(block)
        } else {
            self.check_block_size(block.buf.len())?;
            self.block = Some(block);
            Ok(())
        }
    }

    /// A header block may not grow past four times the header list limit (encoded): the
    /// CONTINUATION flood (a block that never ends) stops there.
    fn check_block_size(&self, n: usize) -> Result<(), ConnError> {
        if n > (self.config.max_header_list_size as usize)
            .saturating_mul(4)
            .max(64 * 1024)
        {
            return Err(conn_err(
                Reason::ENHANCE_YOUR_CALM,
                "header block too large",
            ));
        }
        Ok(())
    }

    fn continuation(&mut self, head: Head, payload: BytesMut) -> Result<(), ConnError> {
        let Some(mut block) = self.block.take() else {
            return Err(conn_err(
                Reason::PROTOCOL_ERROR,
                "CONTINUATION without a header block",
            ));
        };
        self.check_block_size(block.buf.len() + payload.len())?;
        block.buf.extend_from_slice(&payload);
        if head.has(flag::END_HEADERS) {
            self.header_block(block)
        } else {
            self.block = Some(block);
            Ok(())
        }
    }

    /// A complete header block: a new request, or trailers.
    fn header_block(&mut self, mut block: Block) -> Result<(), ConnError> {
        let id = block.stream;
        let limit = self.config.max_header_list_size as usize;
        let decoded = decode_block(&mut self.decoder, &mut block.buf, limit)?;
        if let Some(s) = self.streams.get_mut(&id) {
            // trailers, or a second head on a stream whose client is done
            if !s.recv_open {
                self.reset(id, Reason::STREAM_CLOSED);
                return Ok(());
            }
            if !block.end_stream || decoded.malformed || decoded.pseudo.any() {
                self.reset(id, Reason::PROTOCOL_ERROR);
                return Ok(());
            }
            s.recv_open = false;
            if s.content_length.is_some_and(|n| n != s.received) {
                self.reset(id, Reason::PROTOCOL_ERROR);
                return Ok(());
            }
            if s.body_done {
                self.maybe_close(id);
            } else {
                s.trailers = Some(decoded.fields);
                if let Some(w) = s.body_waker.take() {
                    w.wake();
                }
            }
            return Ok(());
        }
        if id <= self.last_id {
            if self.was_closed(id) {
                return Err(conn_err(
                    Reason::STREAM_CLOSED,
                    "HEADERS on a closed stream",
                ));
            }
            return Err(conn_err(
                Reason::PROTOCOL_ERROR,
                "stream id below one already used",
            ));
        }
        self.last_id = id;
        if self.goaway.is_some_and(|last| id > last) || self.peer_goaway {
            // (after GOAWAY: neither served nor answered, RFC 9113 section 6.8)
            return Ok(());
        }
        if block.bad_priority {
            self.small(|b| frame::put_reset(b, id, Reason::PROTOCOL_ERROR.into()));
            self.closed(id);
            return Ok(());
        }
        if self.streams.len() >= self.config.max_concurrent_streams as usize {
            self.small(|b| frame::put_reset(b, id, Reason::REFUSED_STREAM.into()));
            self.closed(id);
            return Ok(());
        }
        let request = if decoded.malformed {
            None
        } else {
            request(decoded, self.config.connect_protocol)
        };
        let Some(request) = request else {
            self.small(|b| frame::put_reset(b, id, Reason::PROTOCOL_ERROR.into()));
            self.closed(id);
            return Ok(());
        };
        let content_length = match request.headers().get(header::CONTENT_LENGTH) {
            None => None,
            Some(v) => match v.to_str().ok().and_then(|v| v.parse::<u64>().ok()) {
                Some(n) => Some(n),
                None => {
                    self.small(|b| frame::put_reset(b, id, Reason::PROTOCOL_ERROR.into()));
                    self.closed(id);
                    return Ok(());
                }
            },
        };
        if block.end_stream && content_length.is_some_and(|n| n != 0) {
            self.small(|b| frame::put_reset(b, id, Reason::PROTOCOL_ERROR.into()));
            self.closed(id);
            return Ok(());
        }
        let expect_continue = request
            .headers()
            .get(header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        self.streams.insert(
            id,
            Stream {
                recv_open: !block.end_stream,
                send_open: true,
                send_window: i64::from(self.peer_initial_window),
                recv_window: i64::from(self.config.stream_window),
                content_length,
                body_done: block.end_stream,
                expect_continue: expect_continue && !block.end_stream,
                ..Stream::default()
            },
        );
        self.requests.push_back(NewStream {
            id,
            request,
            end_stream: block.end_stream,
        });
        Ok(())
    }

    fn priority(&mut self, head: Head, payload: &[u8]) -> Result<(), ConnError> {
        if head.stream == 0 {
            return Err(conn_err(Reason::PROTOCOL_ERROR, "PRIORITY on stream 0"));
        }
        let dep = <[u8; 5]>::try_from(payload)
            .map(|p| u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & frame::MAX_WINDOW);
        let error = match dep {
            Err(_) => Reason::FRAME_SIZE_ERROR,
            Ok(dep) if dep == head.stream => Reason::PROTOCOL_ERROR,
            Ok(_) => return Ok(()),
        };
        if self.streams.contains_key(&head.stream) {
            self.reset(head.stream, error);
        } else {
            self.small(|b| frame::put_reset(b, head.stream, error.into()));
        }
        // (priorities are otherwise ignored, as RFC 9113 section 5.3.2 allows)
        Ok(())
    }

    fn rst_stream(&mut self, head: Head, payload: &[u8]) -> Result<(), ConnError> {
        if head.stream == 0 {
            return Err(conn_err(Reason::PROTOCOL_ERROR, "RST_STREAM on stream 0"));
        }
        if payload.len() != 4 {
            return Err(conn_err(Reason::FRAME_SIZE_ERROR, "RST_STREAM not 4 bytes"));
        }
        if head.stream > self.last_id {
            return Err(conn_err(
                Reason::PROTOCOL_ERROR,
                "RST_STREAM on an idle stream",
            ));
        }
        if self.streams.contains_key(&head.stream) {
            self.resets_by_client += 1;
            self.drop_stream(head.stream);
        }
        Ok(())
    }

    fn settings(&mut self, head: Head, payload: &[u8]) -> Result<(), ConnError> {
        if head.stream != 0 {
            return Err(conn_err(Reason::PROTOCOL_ERROR, "SETTINGS on a stream"));
        }
        if head.has(flag::ACK) {
            if !payload.is_empty() {
                return Err(conn_err(
                    Reason::FRAME_SIZE_ERROR,
                    "SETTINGS ACK with a payload",
                ));
            }
            return Ok(());
        }
        if payload.len() % 6 != 0 {
            return Err(conn_err(
                Reason::FRAME_SIZE_ERROR,
                "SETTINGS not a multiple of 6 bytes",
            ));
        }
        for s in payload.chunks_exact(6) {
            let id = u16::from_be_bytes([s[0], s[1]]);
            let v = u32::from_be_bytes([s[2], s[3], s[4], s[5]]);
            match id {
                setting::HEADER_TABLE_SIZE => self.encoder.update_max_size(v.min(65_536) as usize),
                setting::ENABLE_PUSH | setting::ENABLE_CONNECT_PROTOCOL if v > 1 => {
                    return Err(conn_err(
                        Reason::PROTOCOL_ERROR,
                        "a boolean setting not 0 or 1",
                    ));
                }
                setting::INITIAL_WINDOW_SIZE => {
                    if v > frame::MAX_WINDOW {
                        return Err(conn_err(
                            Reason::FLOW_CONTROL_ERROR,
                            "SETTINGS_INITIAL_WINDOW_SIZE over 2^31-1",
                        ));
                    }
                    let delta = i64::from(v) - i64::from(self.peer_initial_window);
                    self.peer_initial_window = v;
                    for s in self.streams.values_mut() {
                        s.send_window += delta;
                        if s.send_window > i64::from(frame::MAX_WINDOW) {
                            return Err(conn_err(
                                Reason::FLOW_CONTROL_ERROR,
                                "a stream's window over 2^31-1",
                            ));
                        }
                    }
                    if delta > 0 {
                        self.wake_blocked();
                    }
                }
                setting::MAX_FRAME_SIZE => {
                    if !(frame::DEFAULT_MAX_FRAME..=(1 << 24) - 1).contains(&v) {
                        return Err(conn_err(
                            Reason::PROTOCOL_ERROR,
                            "SETTINGS_MAX_FRAME_SIZE out of range",
                        ));
                    }
                    self.peer_max_frame = v;
                }
                // (MAX_CONCURRENT_STREAMS: the server opens none; MAX_HEADER_LIST_SIZE:
                // advisory; unknown settings are ignored)
                _ => {}
            }
        }
        self.small(frame::put_settings_ack);
        Ok(())
    }

    fn ping(&mut self, head: Head, payload: &[u8]) -> Result<(), ConnError> {
        if head.stream != 0 {
            return Err(conn_err(Reason::PROTOCOL_ERROR, "PING on a stream"));
        }
        let Ok(p) = <[u8; 8]>::try_from(payload) else {
            return Err(conn_err(Reason::FRAME_SIZE_ERROR, "PING not 8 bytes"));
        };
        if !head.has(flag::ACK) {
            self.small(|b| frame::put_ping_ack(b, &p));
        }
        Ok(())
    }

    fn window_update(&mut self, head: Head, payload: &[u8]) -> Result<(), ConnError> {
        let Ok(p) = <[u8; 4]>::try_from(payload) else {
            return Err(conn_err(
                Reason::FRAME_SIZE_ERROR,
                "WINDOW_UPDATE not 4 bytes",
            ));
        };
        let inc = i64::from(u32::from_be_bytes(p) & frame::MAX_WINDOW);
        if head.stream == 0 {
            if inc == 0 {
                return Err(conn_err(Reason::PROTOCOL_ERROR, "WINDOW_UPDATE of 0"));
            }
            self.send_window += inc;
            if self.send_window > i64::from(frame::MAX_WINDOW) {
                return Err(conn_err(
                    Reason::FLOW_CONTROL_ERROR,
                    "the connection's window over 2^31-1",
                ));
            }
            self.wake_blocked();
            return Ok(());
        }
        if head.stream > self.last_id {
            return Err(conn_err(
                Reason::PROTOCOL_ERROR,
                "WINDOW_UPDATE on an idle stream",
            ));
        }
        let Some(s) = self.streams.get_mut(&head.stream) else {
            return Ok(());
        };
        if inc == 0 {
            self.reset(head.stream, Reason::PROTOCOL_ERROR);
            return Ok(());
        }
        s.send_window += inc;
        if s.send_window > i64::from(frame::MAX_WINDOW) {
            self.reset(head.stream, Reason::FLOW_CONTROL_ERROR);
            return Ok(());
        }
        if let Some(w) = s.send_waker.take() {
            w.wake();
        }
        Ok(())
    }

    fn wake_blocked(&mut self) {
        for id in std::mem::take(&mut self.blocked) {
            if let Some(w) = self.streams.get_mut(&id).and_then(|s| s.send_waker.take()) {
                w.wake();
            }
        }
    }

    // ----- the request body's side -----

    /// The next frame of stream `id`'s request body: data, then trailers; `None` at its end.
    pub fn poll_body(
        &mut self,
        id: u32,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, StreamEnded>>> {
        let Some(s) = self.streams.get_mut(&id) else {
            return Poll::Ready(Some(Err(StreamEnded("the stream was reset"))));
        };
        if s.body_done {
            return Poll::Ready(None);
        }
        if let Some(d) = s.recv.pop_front() {
            let n = d.len() as u32;
            self.release_stream(id, n);
            self.release_conn(n);
            return Poll::Ready(Some(Ok(http_body::Frame::data(d))));
        }
        if let Some(t) = s.trailers.take() {
            s.body_done = true;
            self.maybe_close(id);
            return Poll::Ready(Some(Ok(http_body::Frame::trailers(t))));
        }
        if !s.recv_open {
            s.body_done = true;
            self.maybe_close(id);
            return Poll::Ready(None);
        }
        if std::mem::take(&mut s.expect_continue) && !s.head_sent {
            let block = self.encode(StatusCode::CONTINUE, HeaderMap::new());
            let max = self.peer_max_frame as usize;
            self.small(|b| frame::put_header_block(b, id, &block, false, max));
        }
        if let Some(s) = self.streams.get_mut(&id) {
            if !s
                .body_waker
                .as_ref()
                .is_some_and(|w| w.will_wake(cx.waker()))
            {
                s.body_waker = Some(cx.waker().clone());
            }
        }
        Poll::Pending
    }

    /// Whether stream `id`'s body is over.
    pub fn body_ended(&self, id: u32) -> bool {
        self.streams.get(&id).is_none_or(|s| {
            s.body_done || !s.recv_open && s.recv.is_empty() && s.trailers.is_none()
        })
    }

    /// Request body bytes stream `id` announced and has not sent yet (`Content-Length`).
    pub fn body_remaining(&self, id: u32) -> Option<u64> {
        let s = self.streams.get(&id)?;
        let held: usize = s.recv.iter().map(Bytes::len).sum();
        s.content_length
            .map(|n| n.saturating_sub(s.received) + held as u64)
    }

    /// Stream `id`'s body was dropped: what it holds and what still comes is discarded (the
    /// window given back), and once the response is over the client is told to stop sending
    /// (RST_STREAM NO_ERROR, RFC 9113 section 8.1).
    pub fn drop_body(&mut self, id: u32) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        if s.body_done {
            return;
        }
        s.body_done = true;
        s.body_waker = None;
        let held: usize = s.recv.drain(..).map(|b| b.len()).sum();
        s.trailers = None;
        self.release_conn(held as u32);
        self.release_stream(id, held as u32);
        self.maybe_close(id);
    }

    // ----- the response's side -----

    fn encode(&mut self, status: StatusCode, fields: HeaderMap) -> BytesMut {
        let mut block = std::mem::take(&mut self.scratch);
        block.clear();
        let fields = Fields {
            inner: fields.into_iter(),
            skipping: false,
        };
        let headers = std::iter::once(hpack::Header::Status(status)).chain(fields);
        self.encoder.encode(headers, &mut block);
        block
    }

    /// Queues the response head of stream `id` (`end`: it has no body). `false`: the stream
    /// is gone (reset), the response is dropped.
    pub fn send_headers(
        &mut self,
        id: u32,
        status: StatusCode,
        fields: HeaderMap,
        end: bool,
    ) -> bool {
        match self.streams.get_mut(&id) {
            Some(s) if s.send_open && !s.head_sent => {
                s.head_sent = true;
                s.expect_continue = false;
            }
            _ => return false,
        }
        let block = self.encode(status, fields);
        let max = self.peer_max_frame as usize;
        self.small(|b| frame::put_header_block(b, id, &block, end, max));
        self.scratch = block;
        if end {
            self.send_closed(id);
        }
        true
    }

    /// Queues trailers, which end stream `id`'s response.
    pub fn send_trailers(&mut self, id: u32, fields: HeaderMap) -> bool {
        if !self
            .streams
            .get(&id)
            .is_some_and(|s| s.send_open && s.head_sent)
        {
            return false;
        }
        let mut block = std::mem::take(&mut self.scratch);
        block.clear();
        let fields = Fields {
            inner: fields.into_iter(),
            skipping: false,
        };
        self.encoder.encode(fields, &mut block);
        let max = self.peer_max_frame as usize;
        self.small(|b| frame::put_header_block(b, id, &block, true, max));
        self.scratch = block;
        self.send_closed(id);
        true
    }

    fn send_closed(&mut self, id: u32) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        s.send_open = false;
        s.task = None;
        if s.recv_open && s.body_done {
            // the response is complete and nobody reads the request: stop the client
            self.reset(id, Reason::NO_ERROR);
            return;
        }
        self.maybe_close(id);
    }

    /// Room for stream `id`'s next DATA: `Ready(Ok(n))` with `n > 0` bytes of window and
    /// queue; `Ready(Err)` when the stream is gone.
    pub fn poll_capacity(
        &mut self,
        id: u32,
        cx: &mut Context<'_>,
    ) -> Poll<Result<usize, StreamEnded>> {
        let conn_window = self.send_window;
        let queue_full = self.queued() >= OUT_HIGH;
        let Some(s) = self.streams.get_mut(&id) else {
            return Poll::Ready(Err(StreamEnded("the stream was reset")));
        };
        if !s.send_open {
            return Poll::Ready(Err(StreamEnded("the response is over")));
        }
        let n = s.send_window.min(conn_window);
        if n > 0 && !queue_full {
            return Poll::Ready(Ok(n as usize));
        }
        if !s
            .send_waker
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            s.send_waker = Some(cx.waker().clone());
        }
        if !self.blocked.contains(&id) {
            self.blocked.push(id);
        }
        Poll::Pending
    }

    /// Queues what the windows allow of `data` as DATA frames of stream `id` (what is sent is
    /// taken off `data`); `end`: the last frame ends the stream once `data` is all out (an
    /// empty `data` with `end` sends an empty DATA frame with END_STREAM). `false`: the stream
    /// is gone.
    pub fn send_data(&mut self, id: u32, data: &mut Bytes, end: bool) -> bool {
        let max = (self.config.max_data_frame.min(self.peer_max_frame)) as usize;
        loop {
            let full = self.out.queued() >= OUT_HIGH;
            let Some(s) = self.streams.get_mut(&id) else {
                return false;
            };
            if !s.send_open {
                return false;
            }
            let room = s.send_window.min(self.send_window).max(0) as usize;
            let n = data.len().min(room).min(max);
            if n == 0 && !(data.is_empty() && end) {
                return true;
            }
            if full && !data.is_empty() {
                return true;
            }
            s.send_window -= n as i64;
            self.send_window -= n as i64;
            let chunk = data.split_to(n);
            let last = end && data.is_empty();
            let flags = if last { flag::END_STREAM } else { 0 };
            if n < COPY_BELOW {
                self.small(|b| {
                    frame::put_head(b, n, kind::DATA, flags, id);
                    b.extend_from_slice(&chunk);
                });
            } else {
                self.small(|b| frame::put_head(b, n, kind::DATA, flags, id));
                self.out.data(chunk);
            }
            if last {
                self.send_closed(id);
                return true;
            }
            if data.is_empty() {
                return true;
            }
        }
    }

    /// The stream's task ended without ending its response (its body failed, or it was
    /// cancelled): RST_STREAM INTERNAL_ERROR (or CANCEL).
    pub fn task_ended(&mut self, id: u32, reason: Reason) {
        if self.streams.get(&id).is_some_and(|s| s.send_open) {
            self.reset(id, reason);
        }
    }
}

/// Removes a padded frame's padding (and its length byte).
fn strip_padding(head: Head, payload: &mut BytesMut) -> Result<(), ConnError> {
    if !head.has(flag::PADDED) {
        return Ok(());
    }
    let Some(&pad) = payload.first() else {
        return Err(conn_err(
            Reason::PROTOCOL_ERROR,
            "padded frame without its pad length",
        ));
    };
    let pad = usize::from(pad);
    if pad >= payload.len() {
        return Err(conn_err(
            Reason::PROTOCOL_ERROR,
            "padding as long as the frame",
        ));
    }
    payload.advance(1);
    payload.truncate(payload.len() - pad);
    Ok(())
}

/// Fields of a response, without the connection-specific ones (RFC 9113 section 8.2.2).
struct Fields {
    inner: header::IntoIter<HeaderValue>,
    skipping: bool,
}

impl Iterator for Fields {
    type Item = hpack::Header<Option<HeaderName>>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let (name, value) = self.inner.next()?;
            match name {
                Some(n) => {
                    self.skipping = crate::fields::CONNECTION_SPECIFIC.contains(&n.as_str());
                    if !self.skipping {
                        return Some(hpack::Header::Field {
                            name: Some(n),
                            value,
                        });
                    }
                }
                None if self.skipping => {}
                None => return Some(hpack::Header::Field { name: None, value }),
            }
        }
    }
}

/// The pseudo-header fields of a request.
#[derive(Default)]
struct Pseudo {
    method: Option<Method>,
    scheme: Option<hpack::BytesStr>,
    authority: Option<hpack::BytesStr>,
    path: Option<hpack::BytesStr>,
    protocol: Option<h2::ext::Protocol>,
    status: bool,
}

impl Pseudo {
    fn any(&self) -> bool {
        self.method.is_some()
            || self.scheme.is_some()
            || self.authority.is_some()
            || self.path.is_some()
            || self.protocol.is_some()
            || self.status
    }
}

struct Decoded {
    pseudo: Pseudo,
    fields: HeaderMap,
    /// Broke a rule of RFC 9113 section 8.2 or 8.3 (a stream error).
    malformed: bool,
}

/// Decodes a whole header block. The block is always decoded to its end (the HPACK table is
/// the connection's); a header list over four times `limit` ends the connection.
fn decode_block(
    decoder: &mut hpack::Decoder,
    buf: &mut BytesMut,
    limit: usize,
) -> Result<Decoded, ConnError> {
    let mut d = Decoded {
        pseudo: Pseudo::default(),
        fields: HeaderMap::new(),
        malformed: false,
    };
    let mut size = 0usize;
    let mut regular = false;
    let mut too_large = false;
    let abuse = limit.saturating_mul(4);
    let mut cursor = Cursor::new(buf);
    let r = decoder.decode(&mut cursor, |h| {
        use hpack::Header::*;
        size += h.len();
        if size > abuse {
            too_large = true;
            return ControlFlow::Break(());
        }
        let p = &mut d.pseudo;
        let dup = match h {
            Field { name, value } => {
                regular = true;
                if crate::fields::CONNECTION_SPECIFIC.contains(&name.as_str())
                    && !(name == header::TE && value == "trailers")
                {
                    d.malformed = true;
                } else if d.fields.try_append(name, value).is_err() {
                    too_large = true;
                    return ControlFlow::Break(());
                }
                false
            }
            _ if regular => {
                d.malformed = true;
                false
            }
            Method(m) => p.method.replace(m).is_some(),
            Scheme(v) => p.scheme.replace(v).is_some(),
            Authority(v) => p.authority.replace(v).is_some(),
            Path(v) => p.path.replace(v).is_some(),
            Protocol(v) => p.protocol.replace(v).is_some(),
            Status(_) => std::mem::replace(&mut p.status, true),
        };
        if dup {
            d.malformed = true;
        }
        ControlFlow::Continue(())
    });
    if too_large {
        return Err(conn_err(Reason::ENHANCE_YOUR_CALM, "header list too large"));
    }
    if r.is_err() {
        return Err(conn_err(Reason::COMPRESSION_ERROR, "invalid HPACK block"));
    }
    Ok(d)
}

/// The request of a decoded header block (RFC 9113 section 8.3.1); `None`: malformed.
fn request(d: Decoded, connect_protocol: bool) -> Option<Request<()>> {
    use http::uri;
    let p = d.pseudo;
    let method = p.method?;
    if p.status {
        return None;
    }
    let connect = method == Method::CONNECT;
    let extended = p.protocol.is_some();
    if extended && (!connect || !connect_protocol) {
        return None;
    }
    let mut parts = uri::Parts::default();
    if let Some(a) = p.authority {
        parts.authority = Some(uri::Authority::from_maybe_shared(a.into_inner()).ok()?);
    }
    if connect && !extended {
        // CONNECT: only the authority (RFC 9113 section 8.5)
        if p.scheme.is_some() || p.path.is_some() || parts.authority.is_none() {
            return None;
        }
    } else {
        let scheme: uri::Scheme = p.scheme?.as_str().parse().ok()?;
        let path = p.path?;
        if path.is_empty() {
            return None;
        }
        if parts.authority.is_some() {
            parts.scheme = Some(scheme);
        }
        parts.path_and_query = Some(uri::PathAndQuery::from_maybe_shared(path.into_inner()).ok()?);
    }
    let uri = uri::Uri::from_parts(parts).ok()?;
    let mut req = Request::new(());
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    *req.version_mut() = http::Version::HTTP_2;
    *req.headers_mut() = d.fields;
    if let Some(proto) = p.protocol {
        req.extensions_mut()
            .insert(hyper::ext::Protocol::from(proto.as_str()));
    }
    Some(req)
}
