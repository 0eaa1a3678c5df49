//! The listening sockets of a start or a reload: which listeners a new configuration keeps,
//! refusing ports another process holds, binding the new ones (one socket per worker), and
//! the duplicates kept for a binary upgrade.

use std::collections::HashMap;
use std::net::SocketAddr;

use super::{BoundListener, ServerError};
use crate::config::{Config, ListenerConfig};
use crate::runtime::listen::bind_reuseport;

/// The running listener that `l` keeps (same configured address, not port 0), if any.
pub(super) fn kept<'a>(
    l: &ListenerConfig,
    running: &'a [BoundListener],
) -> Option<&'a BoundListener> {
    (l.address.port() != 0)
        .then(|| running.iter().find(|r| r.configured == l.address))
        .flatten()
}

/// Refuses to share a port with another process, before binding anything. Addresses that
/// `running` listeners keep are ours; `admin` checks the admin address too.
pub(super) fn refuse_addresses_in_use(
    config: &Config,
    running: &[BoundListener],
    admin: bool,
) -> Result<(), ServerError> {
    // (address, ipv6_only, key naming it, UDP: HTTP/3's socket on the same address)
    let mut to_check: Vec<(SocketAddr, bool, String, bool)> = Vec::new();
    for (i, l) in config.listeners.iter().enumerate() {
        if kept(l, running).is_some() {
            continue;
        }
        to_check.push((
            l.address,
            l.ipv6_only,
            format!("listener[{i}].address"),
            false,
        ));
        if l.http3 {
            to_check.push((
                l.address,
                l.ipv6_only,
                format!("listener[{i}].address (UDP, http3)"),
                true,
            ));
        }
    }
    if let (true, Some(addr)) = (admin, config.admin) {
        to_check.push((addr, false, "admin.address".into(), false));
    }
    for (addr, ipv6_only, key, udp) in to_check {
        match crate::runtime::listen::in_use(addr, ipv6_only, udp) {
            Ok(false) => {}
            Ok(true) => return Err(ServerError::InUse { addr, key }),
            Err(source) => return Err(ServerError::Bind { addr, source }),
        }
    }
    Ok(())
}

/// Binds `workers` sockets for each listener of `config` that `running` does not keep.
/// Returns every listener of `config` (kept or new) and the new sockets by listener index.
#[allow(clippy::type_complexity)]
pub(super) fn bind_new_listeners(
    config: &Config,
    running: &[BoundListener],
    workers: usize,
) -> Result<
    (
        Vec<BoundListener>,
        HashMap<usize, Vec<std::net::TcpListener>>,
    ),
    ServerError,
> {
    let mut listeners = Vec::new();
    let mut sockets = HashMap::new();
    for (i, l) in config.listeners.iter().enumerate() {
        if let Some(k) = kept(l, running) {
            listeners.push(*k);
            continue;
        }
        let addr = l.address;
        let bound = bind_reuseport(addr, l.ipv6_only, workers)
            .map_err(|source| ServerError::Bind { addr, source })?;
        let local = bound[0]
            .local_addr()
            .map_err(|source| ServerError::Bind { addr, source })?;
        listeners.push(BoundListener {
            configured: addr,
            bound: local,
            ipv6_only: l.ipv6_only,
        });
        sockets.insert(i, bound);
    }
    Ok((listeners, sockets))
}

/// Duplicates of every listener's sockets: kept ones from `previous`, new ones cloned from
/// `sockets` (by listener index).
pub(super) fn clone_sockets(
    listeners: &[BoundListener],
    sockets: &HashMap<usize, Vec<std::net::TcpListener>>,
    mut previous: HashMap<SocketAddr, Vec<std::net::TcpListener>>,
) -> Result<HashMap<SocketAddr, Vec<std::net::TcpListener>>, ServerError> {
    let mut out = HashMap::new();
    for (i, l) in listeners.iter().enumerate() {
        let clones = match sockets.get(&i) {
            Some(new) => new
                .iter()
                .map(|s| s.try_clone())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|source| ServerError::Bind {
                    addr: l.bound,
                    source,
                })?,
            None => previous.remove(&l.bound).unwrap_or_default(),
        };
        out.insert(l.bound, clones);
    }
    Ok(out)
}
