//! Offload policy: how a caller waits for an op ([`Mode`]), what happens when the engine
//! fails, times out or is saturated ([`Fallback`]), and how long an op may take
//! ([`Policy::timeout`]).
//!
//! This is the one vocabulary that TLS (`qweb-tls`'s offloading signing key and handshake
//! driver), compression (`qweb-compress`'s `CompressBody`) and the server's configuration
//! share. The configuration words differ per subsystem; they map onto the same types:
//!
//! | [`Mode`]          | TLS: `[listener.offload] mode`                         | compression: `[compression] mode`                          |
//! |-------------------|--------------------------------------------------------|------------------------------------------------------------|
//! | [`Mode::InPlace`] | `"none"`: rustls signs with the local key, no engine    | not configurable; the body compresses on the worker        |
//! | [`Mode::Sync`]    | `"sync"`: the signer blocks the worker on the engine   | `"sync"`: one chunk at a time, the worker blocked on each  |
//! | [`Mode::Async`]   | `"async"`: the handshake job pauses at the signature   | `"pipelined"`: up to `depth` chunks in flight              |
//!
//! | [`Fallback`]          | TLS: `[listener.offload] fallback`                       | compression                          |
//! |-----------------------|----------------------------------------------------------|--------------------------------------|
//! | [`Fallback::Software`]| `"software"`: sign with the local key (when it is held)  | always: the chunk is compressed here |
//! | [`Fallback::Fail`]    | `"fail"`: fail the handshake                             | not offered                          |
//!
//! Nothing here parses configuration: the server's config reads its words into these types
//! (and keeps its own error messages and defaults).

use std::time::Duration;

/// How a caller waits for an offloaded op.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// No offload: the work runs in place on the caller's thread (TLS `none`).
    InPlace,
    /// Submit the op straight to the engine and block the caller's thread until it completes
    /// or times out ([`run_blocking`](crate::run_blocking)): the paper's "straight" offload,
    /// kept as the baseline (TLS and compression `sync`).
    Sync,
    /// Submit the op through the worker's [`Offloader`](crate::Offloader) and serve other
    /// connections meanwhile: TLS `async` (the handshake runs as a [`job`](crate::job) that
    /// pauses at the signature and resumes on completion), compression `pipelined` (up to
    /// `depth` chunks of one body in flight, joined in order).
    Async,
}

impl Mode {
    /// Whether ops go to an engine at all (every mode but [`Mode::InPlace`]).
    pub fn offloads(self) -> bool {
        self != Mode::InPlace
    }

    /// The most ops of one caller (one handshake, one response body) in flight at once, given
    /// the configured pipeline `depth`: 1 unless the mode is [`Mode::Async`], then `depth`
    /// (at least 1).
    pub fn in_flight(self, depth: usize) -> usize {
        match self {
            Mode::InPlace | Mode::Sync => 1,
            Mode::Async => depth.max(1),
        }
    }
}

/// What happens to an op whose engine failed, timed out or was saturated. Either way a
/// connection never hangs on a broken engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fallback {
    /// Redo the op in software on the caller's thread, where that is possible (TLS: the
    /// private key is held here, not only on a key server; compression: always).
    Software,
    /// Give up on the op: the handshake fails (with a log line).
    Fail,
}

/// The offload policy of one kind of op: how it waits, what a failure does, how long it may
/// take. The engine is named or held by the caller alongside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// How the caller waits.
    pub mode: Mode,
    /// What a failed, timed-out or refused op does.
    pub fallback: Fallback,
    /// How long one op may take on the engine before it counts as failed (in sync mode the
    /// blocked wait; in async mode the worker's [`Offloader`](crate::Offloader) applies it).
    pub timeout: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_in_place_runs_without_an_engine() {
        assert!(!Mode::InPlace.offloads());
        assert!(Mode::Sync.offloads());
        assert!(Mode::Async.offloads());
    }

    #[test]
    fn depth_applies_to_async_only() {
        for depth in [0, 1, 4, 64] {
            assert_eq!(Mode::InPlace.in_flight(depth), 1);
            assert_eq!(Mode::Sync.in_flight(depth), 1);
        }
        assert_eq!(Mode::Async.in_flight(0), 1);
        assert_eq!(Mode::Async.in_flight(1), 1);
        assert_eq!(Mode::Async.in_flight(4), 4);
        assert_eq!(Mode::Async.in_flight(64), 64);
    }
}
