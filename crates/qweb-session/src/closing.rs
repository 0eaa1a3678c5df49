//! How a connection ends: one state for the HTTP/1, HTTP/2 and HTTP/3 drivers, kept on the
//! connection's [`ConnState`](crate::ConnState) beside its phases and deadlines.
//!
//! ```text
//!  Open ──drain(why)──▶ Draining { why, announced, drop_at } ──cut(at)──▶ Cutting { at }
//!    │                        │ (in flight done, or drop_at passed)          │ (at passed)
//!    └────────────────────────┴───────────────────── the driver returns ◀────┘
//! ```
//!
//! - *Draining*: no new requests; those in flight finish. HTTP/1 answers the request in
//!   flight with `Connection: close` (and, on [`Drain::Shutdown`], closes an idle
//!   connection at once); HTTP/2 and HTTP/3 send GOAWAY (`announced` once it is out; a
//!   retirement that finds an HTTP/2 connection before its first request waits for it, as
//!   hyper would drop a connection still in its handshake and lose that request).
//!   `drop_at`: a drain for idleness gives the client [`GRACE`] to close before the
//!   connection is dropped, should nothing be in flight.
//! - *Cutting*: whatever is in flight is closed at `at` (an HTTP/2 flood, or every stream
//!   stalled on a client that takes nothing).

use std::time::Duration;

use tokio::time::Instant;

/// How long a connection being cut, or drained after an idle GOAWAY (HTTP/2, HTTP/3), gets to
/// finish before it is dropped.
pub const GRACE: Duration = Duration::from_secs(1);

/// Why a connection takes no more requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Drain {
    /// The server shuts down (or a binary upgrade took over).
    Shutdown,
    /// A reload retired the connection's configuration: its next request goes on a new
    /// connection (an idle HTTP/1 connection is not cut, so no request races a close).
    Retired,
    /// No request for `keepalive_timeout` (HTTP/2, HTTP/3: GOAWAY first).
    Idle,
}

/// How a connection is ending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Closing {
    /// Serving.
    Open,
    /// No new requests; those in flight finish. `announced`: the client was told (GOAWAY
    /// sent). `drop_at`: dropped then if nothing is in flight.
    Draining {
        /// Why.
        why: Drain,
        /// GOAWAY is out (HTTP/2, HTTP/3).
        announced: bool,
        /// When an idle drain gives up on the client.
        drop_at: Option<Instant>,
    },
    /// Whatever is in flight is closed at `at`.
    Cutting {
        /// When.
        at: Instant,
    },
}

impl Closing {
    /// Still taking requests.
    pub fn is_open(self) -> bool {
        self == Closing::Open
    }

    /// The client was told, or everything is about to be cut: no second GOAWAY, and no
    /// idle or head deadline.
    pub fn announced(self) -> bool {
        matches!(
            self,
            Closing::Draining {
                announced: true,
                ..
            } | Closing::Cutting { .. }
        )
    }

    /// Draining for shutdown: an idle HTTP/1 connection closes now.
    pub fn shutting_down(self) -> bool {
        matches!(
            self,
            Closing::Draining {
                why: Drain::Shutdown,
                ..
            } | Closing::Cutting { .. }
        )
    }

    /// When the driver must look again whatever the connection does (`drop_at`, `at`).
    pub fn deadline(self) -> Option<Instant> {
        match self {
            Closing::Draining { drop_at, .. } => drop_at,
            Closing::Cutting { at } => Some(at),
            Closing::Open => None,
        }
    }

    /// The state after a drain for `why`: an open connection starts draining; one already
    /// draining keeps its state, but a shutdown outranks a retirement or idleness (an idle
    /// HTTP/1 connection must then close); a cut stays a cut.
    pub fn drain(self, why: Drain) -> Closing {
        match self {
            Closing::Open => Closing::Draining {
                why,
                announced: false,
                drop_at: None,
            },
            Closing::Draining {
                announced, drop_at, ..
            } if why == Drain::Shutdown => Closing::Draining {
                why,
                announced,
                drop_at,
            },
            other => other,
        }
    }

    /// The state once GOAWAY is out; `drop_at` as [`Closing::Draining`] says.
    pub fn announce(self, drop_at: Option<Instant>) -> Closing {
        match self {
            Closing::Open => Closing::Draining {
                why: Drain::Idle,
                announced: true,
                drop_at,
            },
            Closing::Draining { why, .. } => Closing::Draining {
                why,
                announced: true,
                drop_at,
            },
            cut => cut,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drains_announce_and_cuts_move_one_way() {
        let open = Closing::Open;
        assert!(open.is_open() && !open.announced() && open.deadline().is_none());
        let retired = open.drain(Drain::Retired);
        assert!(!retired.is_open() && !retired.announced() && !retired.shutting_down());
        // a retirement does not undo a shutdown; a shutdown outranks a retirement
        let shut = retired.drain(Drain::Shutdown);
        assert!(shut.shutting_down());
        assert_eq!(shut.drain(Drain::Retired), shut);
        let at = Instant::now() + GRACE;
        let told = shut.announce(Some(at));
        assert!(told.announced() && told.shutting_down());
        assert_eq!(told.deadline(), Some(at));
        let cut = Closing::Cutting { at };
        assert_eq!(cut.drain(Drain::Shutdown), cut);
        assert_eq!(cut.announce(None), cut);
        assert!(cut.announced());
        // an idle GOAWAY on an open connection
        assert_eq!(
            open.announce(None),
            Closing::Draining {
                why: Drain::Idle,
                announced: true,
                drop_at: None
            }
        );
    }
}
