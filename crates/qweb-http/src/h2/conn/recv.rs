//! The frames a client sends, one handler each (RFC 9113 section 6): what they change in
//! the streams, the windows and the settings, and what is answered.

use bytes::{Buf, BytesMut};
use http::header;
use http::Method;

use super::{conn_err, Block, ConnError, Connection, NewStream, Reason, Stream};
use crate::h2::frame::{self, flag, setting, Head};
use crate::h2::head::{decode_block, request, strip_padding};

impl Connection {
    pub(super) fn data(&mut self, head: Head, mut payload: BytesMut) -> Result<(), ConnError> {
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
        let discard = s.body_done && !s.tunnel;
        if discard || keep == 0 {
            // nobody reads it: the window goes back at once
            let back = if discard { len as u32 } else { padding as u32 };
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

    pub(super) fn headers(&mut self, head: Head, mut payload: BytesMut) -> Result<(), ConnError> {
        if head.stream == 0 {
            return Err(conn_err(Reason::PROTOCOL_ERROR, "HEADERS on stream 0"));
        }
        if head.stream.is_multiple_of(2) {
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

    pub(super) fn continuation(&mut self, head: Head, payload: BytesMut) -> Result<(), ConnError> {
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
        let tunnel = request.method() == Method::CONNECT
            && request.extensions().get::<hyper::ext::Protocol>().is_some();
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
                // (a tunnel's DATA is kept for the tunnel: no body takes it)
                body_done: block.end_stream || tunnel,
                expect_continue: expect_continue && !block.end_stream && !tunnel,
                tunnel: tunnel && !block.end_stream,
                ..Stream::default()
            },
        );
        self.requests.push_back(NewStream {
            id,
            request,
            end_stream: block.end_stream || tunnel,
            tunnel: tunnel && !block.end_stream,
        });
        Ok(())
    }

    pub(super) fn priority(&mut self, head: Head, payload: &[u8]) -> Result<(), ConnError> {
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

    pub(super) fn rst_stream(&mut self, head: Head, payload: &[u8]) -> Result<(), ConnError> {
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

    pub(super) fn settings(&mut self, head: Head, payload: &[u8]) -> Result<(), ConnError> {
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
        if !payload.len().is_multiple_of(6) {
            return Err(conn_err(
                Reason::FRAME_SIZE_ERROR,
                "SETTINGS not a multiple of 6 bytes",
            ));
        }
        for s in payload.chunks_exact(6) {
            let id = u16::from_be_bytes([s[0], s[1]]);
            let v = u32::from_be_bytes([s[2], s[3], s[4], s[5]]);
            match id {
                setting::HEADER_TABLE_SIZE => self.table_update = true,
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

    pub(super) fn ping(&mut self, head: Head, payload: &[u8]) -> Result<(), ConnError> {
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

    pub(super) fn window_update(&mut self, head: Head, payload: &[u8]) -> Result<(), ConnError> {
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
}
