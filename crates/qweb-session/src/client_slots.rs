//! `[limits] connections_per_client` (issue 39, phase 0): how many connections one client
//! address holds, counted across every worker of the process.
//!
//! One table per server (created at start, kept across reloads like the proxy cache's store,
//! so a reload does not give a client a fresh budget beside the connections it still holds),
//! in [`SHARDS`] shards each behind a short lock. A connection takes a [`Slot`] once its
//! client address is known (after a PROXY header; a QUIC connection once its handshake has
//! validated its address) and gives it back when it ends; an address whose count drops to 0
//! has no entry, so the table never holds more entries than open connections (at most
//! `workers` x `max_connections_per_worker`).
//!
//! The key: an IPv4 address (an IPv4-mapped IPv6 address counts as its IPv4 address); an
//! IPv6 address by its /64, the block a single subscriber is given (RFC 6177), since one host
//! can pick any address of it.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex, PoisonError};

/// Shards of the table (independent locks).
pub const SHARDS: usize = 16;

/// The connections each client address holds, shared by the workers.
#[derive(Debug)]
pub struct ClientSlots {
    shards: [Mutex<HashMap<IpAddr, u32>>; SHARDS],
    hasher: RandomState,
}

impl Default for ClientSlots {
    fn default() -> Self {
        ClientSlots {
            shards: std::array::from_fn(|_| Mutex::default()),
            hasher: RandomState::new(),
        }
    }
}

/// What a connection holds while it counts against its address; dropping it gives the slot
/// back. An unlimited listener's slot counts nothing.
#[derive(Debug)]
#[must_use = "the slot is given back when this is dropped"]
pub struct Slot(Option<(Arc<ClientSlots>, IpAddr)>);

/// The address already holds its `connections_per_client`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Full;

/// The table's key for `ip`: IPv4 as itself (mapped IPv6 included), IPv6 by its /64.
pub fn client_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(Ipv6Addr::from(bits))
        }
        v4 => v4,
    }
}

impl ClientSlots {
    fn shard(&self, key: &IpAddr) -> &Mutex<HashMap<IpAddr, u32>> {
        let h = self.hasher.hash_one(key) as usize;
        &self.shards[h % SHARDS]
    }

    /// A slot of `ip` under `limit` (0: unlimited, nothing is counted); `Err(Full)` when
    /// the address holds `limit` connections already.
    pub fn take(self: &Arc<Self>, ip: IpAddr, limit: u32) -> Result<Slot, Full> {
        if limit == 0 {
            return Ok(Slot(None));
        }
        let key = client_key(ip);
        let mut shard = self
            .shard(&key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let n = shard.entry(key).or_insert(0);
        if *n >= limit {
            return Err(Full);
        }
        *n += 1;
        Ok(Slot(Some((self.clone(), key))))
    }

    /// Connections `ip` holds now (its key's).
    pub fn held(&self, ip: IpAddr) -> u32 {
        let key = client_key(ip);
        let shard = self
            .shard(&key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        shard.get(&key).copied().unwrap_or(0)
    }

    /// Addresses holding at least one connection.
    pub fn addresses(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }

    fn give_back(&self, key: IpAddr) {
        let mut shard = self
            .shard(&key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = shard.get_mut(&key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                shard.remove(&key);
            }
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some((table, key)) = self.0.take() {
            table.give_back(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_address_holds_at_most_its_limit_and_its_entry_goes_at_zero() {
        let t = Arc::new(ClientSlots::default());
        let a: Vec<Slot> = (0..3)
            .map(|_| t.take(ip("192.0.2.1"), 3).unwrap())
            .collect();
        assert_eq!(t.take(ip("192.0.2.1"), 3).unwrap_err(), Full);
        // the same client through a dual-stack socket
        assert_eq!(t.take(ip("::ffff:192.0.2.1"), 3).unwrap_err(), Full);
        let other = t.take(ip("192.0.2.2"), 3).unwrap();
        assert_eq!((t.held(ip("192.0.2.1")), t.addresses()), (3, 2));
        drop(a);
        drop(other);
        assert_eq!(t.addresses(), 0);
        let again: Vec<Slot> = (0..3)
            .map(|_| t.take(ip("192.0.2.1"), 3).unwrap())
            .collect();
        assert_eq!(again.len(), 3);
    }

    #[test]
    fn ipv6_counts_per_64_and_zero_is_unlimited() {
        let t = Arc::new(ClientSlots::default());
        let _a = t.take(ip("2001:db8:1:2::1"), 2).unwrap();
        let _b = t.take(ip("2001:db8:1:2:ffff::9"), 2).unwrap();
        assert!(t.take(ip("2001:db8:1:2::77"), 2).is_err());
        assert!(t.take(ip("2001:db8:1:3::1"), 2).is_ok());
        let many: Vec<Slot> = (0..100)
            .map(|_| t.take(ip("192.0.2.1"), 0).unwrap())
            .collect();
        assert_eq!((many.len(), t.held(ip("192.0.2.1"))), (100, 0));
    }
}
