//! Rate limits for log lines that an attacker (or a resource shortage) can trigger at will:
//! one line per interval, with the count of lines suppressed in between.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use tokio::time::Instant;

/// At most one line per `every`.
pub struct Every {
    every: Duration,
    last: Cell<Option<Instant>>,
    suppressed: Cell<u64>,
}

impl Every {
    /// One line per `every`.
    pub fn new(every: Duration) -> Self {
        Every {
            every,
            last: Cell::new(None),
            suppressed: Cell::new(0),
        }
    }

    /// `Some(n)`: log now, `n` lines were suppressed since the last one. `None`: stay quiet.
    pub fn hit(&self) -> Option<u64> {
        let now = Instant::now();
        match self.last.get() {
            Some(t) if now.saturating_duration_since(t) < self.every => {
                self.suppressed.set(self.suppressed.get() + 1);
                None
            }
            _ => {
                self.last.set(Some(now));
                Some(self.suppressed.replace(0))
            }
        }
    }
}

/// Peers remembered at most (a flood from many addresses must not grow the table forever).
const MAX_PEERS: usize = 4096;

/// At most one line per peer address per `every`.
pub struct PerPeer {
    every: Duration,
    peers: RefCell<HashMap<IpAddr, (Instant, u64)>>,
}

impl PerPeer {
    /// One line per peer per `every`.
    pub fn new(every: Duration) -> Self {
        PerPeer {
            every,
            peers: RefCell::new(HashMap::new()),
        }
    }

    /// `Some(n)`: log now, `n` lines about this peer were suppressed since the last one.
    pub fn hit(&self, peer: IpAddr) -> Option<u64> {
        let now = Instant::now();
        let mut peers = self.peers.borrow_mut();
        if peers.len() >= MAX_PEERS && !peers.contains_key(&peer) {
            let every = self.every;
            peers.retain(|_, (t, _)| now.saturating_duration_since(*t) < every);
            if peers.len() >= MAX_PEERS {
                peers.clear();
            }
        }
        match peers.get_mut(&peer) {
            Some((t, n)) if now.saturating_duration_since(*t) < self.every => {
                *n += 1;
                None
            }
            Some((t, n)) => {
                *t = now;
                Some(std::mem::take(n))
            }
            None => {
                peers.insert(peer, (now, 0));
                Some(0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_with_the_count() {
        let e = Every::new(Duration::from_secs(3600));
        assert_eq!(e.hit(), Some(0));
        assert_eq!(e.hit(), None);
        assert_eq!(e.hit(), None);
        e.last.set(Some(Instant::now() - Duration::from_secs(7200)));
        assert_eq!(e.hit(), Some(2));
    }

    #[test]
    fn one_line_per_peer() {
        let p = PerPeer::new(Duration::from_secs(60));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        assert_eq!(p.hit(a), Some(0));
        assert_eq!(p.hit(a), None);
        assert_eq!(p.hit(b), Some(0));
        assert_eq!(p.hit(a), None);
    }
}
