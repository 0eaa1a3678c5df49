//! `[limits]`: what protects the server from clients (request head size, timeouts,
//! connections per worker, HTTP/2 streams and control frames, write bursts).

use std::time::Duration;

use super::raw::{RawAdmin, RawLimits};
use super::{ConfigError, Validator};

/// Limits that protect the server from clients.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest request head (request line and headers) accepted; larger gets 431.
    pub max_request_header_size: usize,
    /// Time a client has to send a complete request head once it started one.
    pub header_read_timeout: Duration,
    /// Time an idle keep-alive connection is kept open.
    pub keepalive_timeout: Duration,
    /// Time a client has to complete the TLS handshake.
    pub tls_handshake_timeout: Duration,
    /// Open connections per worker; more wait in the listen backlog.
    pub max_connections_per_worker: usize,
    /// HTTP/2 streams per connection.
    pub max_concurrent_streams: u32,
    /// A response that makes no progress (the client takes nothing) for this long is cut:
    /// the HTTP/1 connection is closed, the HTTP/2 stream reset (the connection closed with
    /// GOAWAY when all its streams stalled).
    pub send_timeout: Duration,
    /// HTTP/2 control frames (SETTINGS, PING, WINDOW_UPDATE, PRIORITY, RST_STREAM, empty
    /// frames) a client may send per second (and in one burst); more gets GOAWAY
    /// ENHANCE_YOUR_CALM.
    pub h2_control_frames_per_second: u32,
    /// Bytes one connection may write in a row before its worker turns to its other
    /// connections (as nginx's `sendfile_max_chunk`): a fast download cannot hold a worker
    /// for longer than it takes to encrypt and send this much.
    pub write_burst: usize,
    /// Connections one client address may hold at once, across every worker (TCP and QUIC;
    /// the address after a trusted PROXY header, IPv6 by its /64); a new one beyond is
    /// closed at once. 0 (the default): unlimited, as nginx's `limit_conn` is until set.
    pub connections_per_client: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_request_header_size: 16 * 1024,
            header_read_timeout: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(75),
            tls_handshake_timeout: Duration::from_secs(10),
            max_connections_per_worker: 10_000,
            max_concurrent_streams: 128,
            send_timeout: Duration::from_secs(60),
            h2_control_frames_per_second: 1000,
            write_burst: 256 << 10,
            connections_per_client: 0,
        }
    }
}

impl Validator<'_> {
    /// Validates `[limits]`; a key left out takes its default.
    pub(super) fn limits(&self, l: &RawLimits) -> Result<Limits, ConfigError> {
        let defaults = Limits::default();
        let limits = Limits {
            max_request_header_size: l
                .max_request_header_size
                .map(|s| s.0 as usize)
                .unwrap_or(defaults.max_request_header_size),
            header_read_timeout: l
                .header_read_timeout
                .map(|d| d.0)
                .unwrap_or(defaults.header_read_timeout),
            keepalive_timeout: l
                .keepalive_timeout
                .map(|d| d.0)
                .unwrap_or(defaults.keepalive_timeout),
            tls_handshake_timeout: l
                .tls_handshake_timeout
                .map(|d| d.0)
                .unwrap_or(defaults.tls_handshake_timeout),
            max_connections_per_worker: l
                .max_connections_per_worker
                .unwrap_or(defaults.max_connections_per_worker)
                .max(1),
            max_concurrent_streams: l
                .max_concurrent_streams
                .unwrap_or(defaults.max_concurrent_streams)
                .max(1),
            send_timeout: l.send_timeout.map(|d| d.0).unwrap_or(defaults.send_timeout),
            h2_control_frames_per_second: l
                .h2_control_frames_per_second
                .unwrap_or(defaults.h2_control_frames_per_second),
            write_burst: l
                .write_burst
                .map(|s| s.0 as usize)
                .unwrap_or(defaults.write_burst),
            connections_per_client: l
                .connections_per_client
                .unwrap_or(defaults.connections_per_client),
        };
        if !(16 << 10..=64 << 20).contains(&limits.write_burst) {
            let key = "limits.write_burst";
            return Err(self.err(
                self.span_of_key(key),
                key,
                "must be between 16KiB and 64MiB",
            ));
        }
        if limits.h2_control_frames_per_second == 0 {
            let key = "limits.h2_control_frames_per_second";
            return Err(self.err(self.span_of_key(key), key, "must be greater than 0"));
        }
        if !(8192..=1 << 24).contains(&limits.max_request_header_size) {
            let key = "limits.max_request_header_size";
            return Err(self.err(self.span_of_key(key), key, "must be between 8KiB and 16MiB"));
        }
        for (key, d) in [
            ("limits.header_read_timeout", limits.header_read_timeout),
            ("limits.keepalive_timeout", limits.keepalive_timeout),
            ("limits.tls_handshake_timeout", limits.tls_handshake_timeout),
            ("limits.send_timeout", limits.send_timeout),
        ] {
            if d.is_zero() {
                return Err(self.err(self.span_of_key(key), key, "must be greater than 0"));
            }
        }
        Ok(limits)
    }
}

/// `[admin]`: what bounds the admin listener's connections, so that clients holding slots
/// cannot blind monitoring (issue 41).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminLimits {
    /// Admin connections served at once. When all are taken, a new connection evicts the
    /// connection that has waited longest for a request head (idle, or sending its head
    /// slowly); when every one is answering a request, the new one is closed at once.
    pub max_connections: usize,
    /// Admin connections one client address may hold; a new one beyond is closed at once.
    pub connections_per_client: usize,
    /// Time a client has to send a complete request head: from the connection's accept for
    /// its first request, from the head's first byte for the next ones.
    pub header_timeout: Duration,
    /// Time a kept-alive admin connection may wait for its next request.
    pub idle_timeout: Duration,
}

impl Default for AdminLimits {
    fn default() -> Self {
        AdminLimits {
            max_connections: 64,
            connections_per_client: 8,
            header_timeout: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(5),
        }
    }
}

impl Validator<'_> {
    /// Validates the bounds of `[admin]`; a key left out takes its default.
    pub(super) fn admin_limits(&self, a: Option<&RawAdmin>) -> Result<AdminLimits, ConfigError> {
        let defaults = AdminLimits::default();
        let Some(a) = a else {
            return Ok(defaults);
        };
        let limits = AdminLimits {
            max_connections: a.max_connections.unwrap_or(defaults.max_connections),
            connections_per_client: a
                .connections_per_client
                .unwrap_or(defaults.connections_per_client),
            header_timeout: a
                .header_timeout
                .map(|d| d.0)
                .unwrap_or(defaults.header_timeout),
            idle_timeout: a.idle_timeout.map(|d| d.0).unwrap_or(defaults.idle_timeout),
        };
        if !(1..=65536).contains(&limits.max_connections) {
            let key = "admin.max_connections";
            return Err(self.err(self.span_of_key(key), key, "must be between 1 and 65536"));
        }
        if !(1..=limits.max_connections).contains(&limits.connections_per_client) {
            let key = "admin.connections_per_client";
            return Err(self.err(
                self.span_of_key(key),
                key,
                format!(
                    "must be between 1 and max_connections ({})",
                    limits.max_connections
                ),
            ));
        }
        for (key, d) in [
            ("admin.header_timeout", limits.header_timeout),
            ("admin.idle_timeout", limits.idle_timeout),
        ] {
            if d.is_zero() {
                return Err(self.err(self.span_of_key(key), key, "must be greater than 0"));
            }
        }
        Ok(limits)
    }
}
