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
use std::rc::Rc;
use std::task::Waker;

use bytes::{Buf, Bytes, BytesMut};
use h2::hpack;
use h2::Reason;
use http::header::HeaderMap;
use http::Request;

pub(crate) use super::error::conn_err;
pub use super::error::{ConnError, StreamEnded};
use super::frame::{self, flag, kind, setting, Head, HEAD_LEN};

mod recv;
mod send;
#[cfg(test)]
mod tests;
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
    /// An extended CONNECT (RFC 8441): a 2xx answer makes the stream a tunnel, whose bytes
    /// are the client's DATA both ways ([`super::Upgrade`]); its request body is empty.
    pub tunnel: bool,
}

/// Responses queued beyond this many bytes wait for the driver to write (a client that does
/// not read holds this much per connection, whatever the windows it grants).
const OUT_HIGH: usize = 128 * 1024;

/// The write queue's framing buffer when it is allocated again: room for the frames of a
/// turn's small answers (16 answers of 1 KiB with their heads) without growing.
const SMALL_START: usize = 24 * 1024;

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
    /// An extended CONNECT: the client's DATA is the tunnel's, not a request body.
    tunnel: bool,
    /// The tunnel is open: the 2xx went out, its DATA is the tunnel's both ways.
    tunnel_open: bool,
    /// Who waits for the tunnel to open.
    tunnel_waker: Option<Waker>,
}

impl Stream {
    /// The stream ended early: its task is cancelled, its body and its sender woken (they
    /// find it gone).
    fn ended(self) {
        if let Some(t) = &self.task {
            t.cancel();
        }
        for w in [self.body_waker, self.send_waker, self.tunnel_waker]
            .into_iter()
            .flatten()
        {
            w.wake();
        }
    }
}

/// Keeps `cx`'s waker in `slot` (cloned only when it is another task's).
fn set_waker(slot: &mut Option<Waker>, cx: &std::task::Context<'_>) {
    if !slot.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
        *slot = Some(cx.waker().clone());
    }
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
    /// The next header block starts with a dynamic table size update (to 0): the client
    /// set SETTINGS_HEADER_TABLE_SIZE, and qweb's encoder uses no table
    /// ([`super::encode`]).
    table_update: bool,
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
            table_update: false,
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
        if self.out.is_empty() {
            // (a queue freed while idle starts again at a size for a turn's frames)
            self.out.reserve_small(SMALL_START);
        }
        self.out.small(f);
        self.queued_more();
    }

    /// Bytes were queued: outside the driver's turn (a tunnel or a request body in another
    /// task), the driver is woken to write them.
    fn queued_more(&mut self) {
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
    /// A request the client reset in the same read it opened it is skipped: no work starts
    /// for it (the rapid-reset attack, CVE-2023-44487, opens and resets streams in pairs).
    pub fn next_request(&mut self) -> Option<NewStream> {
        while let Some(r) = self.requests.pop_front() {
            if self.streams.contains_key(&r.id) {
                return Some(r);
            }
        }
        None
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
    /// an empty queue's buffers).
    pub fn release_idle_buffers(&mut self) {
        if self.streams.is_empty() {
            self.decoder.release_buffer();
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
                s.ended();
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
            s.ended();
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

    fn wake_blocked(&mut self) {
        for id in std::mem::take(&mut self.blocked) {
            if let Some(w) = self.streams.get_mut(&id).and_then(|s| s.send_waker.take()) {
                w.wake();
            }
        }
    }
}
