//! Datagrams a worker's QUIC endpoint drops before quinn spends work on them (issue 41,
//! item 5: garbage datagrams to the HTTP/3 port).
//!
//! quinn answers every datagram of 1200 bytes or more that names a QUIC version it does not
//! support with a Version Negotiation packet (RFC 9000 §6), without any limit: each costs a
//! packet built and a `sendmsg`, towards a source address anyone can forge. [`Filter`] lets
//! through at most [`VERSION_NEGOTIATIONS_PER_SECOND`] of those a second per worker socket
//! (one second's worth as a burst; a real client with another version needs one) and drops
//! the rest here. It also drops what no client can send and quinn would only parse to throw
//! away, or answer at a cost: a Version Negotiation packet (servers never take one), a long
//! header with a connection ID longer than 20 bytes, a short header too short to carry our
//! connection ID and a header protection sample, and an Initial whose destination ID is
//! shorter than 8 bytes (RFC 9000 §7.2; quinn derives the Initial keys for it, then sends a
//! CONNECTION_CLOSE). nginx and quicly drop such packets as quietly.
//!
//! Every check reads the first bytes of the datagram only; a datagram that passes costs a few
//! comparisons more than before.

use std::time::Instant;

/// The length of the connection IDs qweb issues (quinn's default; `steer.rs` issues them).
pub(crate) const CID_LEN: usize = 8;

/// Version Negotiation answers a worker's QUIC socket sends a second at most, and as a
/// burst; datagrams with another QUIC version beyond that are dropped unanswered.
pub(crate) const VERSION_NEGOTIATIONS_PER_SECOND: u32 = 64;

/// The smallest datagram quinn answers with Version Negotiation, and the smallest a client's
/// Initial may come in (RFC 9000 §14.1).
const MIN_INITIAL: usize = 1200;
/// The longest connection ID QUIC v1 allows.
const MAX_CID: usize = 20;
/// The shortest client-chosen destination ID of a first Initial (RFC 9000 §7.2).
const MIN_INITIAL_DCID: usize = 8;
/// A short-header packet: the first byte, our connection ID, then at least 4 bytes before the
/// 16-byte header protection sample (RFC 9001 §5.4.2).
const MIN_SHORT: usize = 1 + CID_LEN + 4 + 16;

/// What [`Filter::keep`] decided about one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Handed to quinn.
    Keep,
    /// Not a packet a client could send this server: dropped.
    Malformed,
    /// Another QUIC version past the second's Version Negotiation budget: dropped.
    OverBudget,
}

/// One worker socket's filter: the Version Negotiation budget (a token bucket).
#[derive(Debug)]
pub(crate) struct Filter {
    tokens: f64,
    last: Instant,
    per_second: u32,
}

impl Filter {
    pub(crate) fn new(now: Instant) -> Filter {
        Filter::with_budget(now, VERSION_NEGOTIATIONS_PER_SECOND)
    }

    pub(crate) fn with_budget(now: Instant, per_second: u32) -> Filter {
        Filter {
            tokens: f64::from(per_second),
            last: now,
            per_second,
        }
    }

    /// Whether the datagram `d` (one datagram: a GRO buffer's segments are looked at one by
    /// one) goes to quinn.
    pub(crate) fn keep(&mut self, d: &[u8], now: Instant) -> Verdict {
        let Some(&first) = d.first() else {
            return Verdict::Malformed;
        };
        if first & 0x80 == 0 {
            return if d.len() >= MIN_SHORT {
                Verdict::Keep
            } else {
                Verdict::Malformed
            };
        }
        let Some(version) = d
            .get(1..5)
            .and_then(|v| <[u8; 4]>::try_from(v).ok())
            .map(u32::from_be_bytes)
        else {
            return Verdict::Malformed;
        };
        let dcid = d.get(5).map_or(usize::MAX, |&n| usize::from(n));
        let scid = d
            .get(6 + dcid.min(MAX_CID))
            .map_or(usize::MAX, |&n| usize::from(n));
        if version == 0 || dcid > MAX_CID || scid > MAX_CID {
            return Verdict::Malformed;
        }
        if !quinn_proto::DEFAULT_SUPPORTED_VERSIONS.contains(&version) {
            if d.len() < MIN_INITIAL {
                // quinn drops these too (no answer may be larger than what came)
                return Verdict::Malformed;
            }
            return self.take(now);
        }
        // long-header type 0 is Initial in QUIC v1 and its drafts
        if (first >> 4) & 0x3 == 0 && dcid < MIN_INITIAL_DCID {
            return Verdict::Malformed;
        }
        Verdict::Keep
    }

    /// One Version Negotiation from the budget.
    fn take(&mut self, now: Instant) -> Verdict {
        let rate = f64::from(self.per_second);
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(rate);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Verdict::Keep
        } else {
            Verdict::OverBudget
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn long(first: u8, version: u32, dcid: u8, len: usize) -> Vec<u8> {
        let mut d = vec![first];
        d.extend_from_slice(&version.to_be_bytes());
        d.push(dcid);
        d.resize(d.len() + usize::from(dcid), 7);
        d.push(8);
        d.resize(len, 0);
        d
    }

    #[test]
    fn what_a_client_sends_passes() {
        let now = Instant::now();
        let mut f = Filter::new(now);
        // a first Initial (v1), a Handshake packet, a short header to our 8-byte ID
        assert_eq!(f.keep(&long(0xc3, 1, 8, 1200), now), Verdict::Keep);
        assert_eq!(f.keep(&long(0xc3, 1, 20, 1252), now), Verdict::Keep);
        assert_eq!(f.keep(&long(0xe3, 1, 8, 60), now), Verdict::Keep);
        let mut short = vec![0x41];
        short.resize(MIN_SHORT, 1);
        assert_eq!(f.keep(&short, now), Verdict::Keep);
        // a draft version quinn speaks
        assert_eq!(
            f.keep(&long(0xc3, 0xff00_001d, 8, 1200), now),
            Verdict::Keep
        );
    }

    #[test]
    fn what_no_client_sends_is_dropped() {
        let now = Instant::now();
        let mut f = Filter::new(now);
        for d in [
            vec![],
            vec![0x41; MIN_SHORT - 1],
            vec![0xc3, 0, 0],
            long(0x80, 0, 8, 1200),      // Version Negotiation
            long(0xc3, 1, 21, 1200),     // destination ID too long
            long(0xc3, 1, 7, 1200),      // first Initial's ID too short
            long(0xc3, 0x1a2a, 8, 1199), // another version, too short to be answered
        ] {
            assert_eq!(f.keep(&d, now), Verdict::Malformed, "{d:?}");
        }
        let mut scid = long(0xc3, 1, 8, 1200);
        scid[14] = 21;
        assert_eq!(f.keep(&scid, now), Verdict::Malformed);
    }

    #[test]
    fn version_negotiation_is_budgeted_per_second() {
        let now = Instant::now();
        let mut f = Filter::with_budget(now, 10);
        let other = long(0xc3, 0x1a2a_3a4a, 8, 1200);
        let kept = (0..100)
            .filter(|_| f.keep(&other, now) == Verdict::Keep)
            .count();
        assert_eq!(kept, 10);
        // a tenth of a second later: one more
        let later = now + Duration::from_millis(100);
        assert_eq!(f.keep(&other, later), Verdict::Keep);
        assert_eq!(f.keep(&other, later), Verdict::OverBudget);
        // v1 is never budgeted
        assert_eq!(f.keep(&long(0xc3, 1, 8, 1200), later), Verdict::Keep);
    }
}
