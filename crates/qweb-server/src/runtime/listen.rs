//! Binding listeners: one `SO_REUSEPORT` socket per worker, all on the same port, after
//! making sure no other process listens there (`SO_REUSEPORT` would otherwise let a second
//! qweb share the port silently and take part of the traffic).

use std::io;
use std::net::{SocketAddr, TcpListener};

use socket2::{Domain, Protocol, Socket, Type};

/// A non-blocking socket bound to `addr` with `SO_REUSEPORT` (and `SO_REUSEADDR`): TCP
/// listeners here, the UDP sockets of HTTP/3 in `runtime::quic`. See [`set_family`] for
/// `ipv6_only`.
pub(crate) fn bind_reusing_port(
    addr: SocketAddr,
    ipv6_only: bool,
    ty: Type,
    proto: Protocol,
) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), ty, Some(proto))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    set_family(&socket, addr, ipv6_only)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    Ok(socket)
}

/// `IPV6_V6ONLY` on an IPv6 socket: off only for the unspecified address `[::]` without
/// `ipv6_only`, which then takes IPv4 clients too (as `::ffff:a.b.c.d`, which
/// `conn::canonical_peer` turns back into `a.b.c.d`); set explicitly either way, whatever the
/// system's `net.ipv6.bindv6only` default says.
fn set_family(socket: &Socket, addr: SocketAddr, ipv6_only: bool) -> io::Result<()> {
    if addr.is_ipv6() {
        socket.set_only_v6(ipv6_only || !addr.ip().is_unspecified())?;
    }
    Ok(())
}

fn bind_one(addr: SocketAddr, ipv6_only: bool) -> io::Result<TcpListener> {
    let socket = bind_reusing_port(addr, ipv6_only, Type::STREAM, Protocol::TCP)?;
    socket.set_nodelay(true)?;
    socket.listen(4096)?;
    Ok(socket.into())
}

/// Is another process listening on `addr` (TCP), or bound to it (`udp`: HTTP/3's side)?
/// Binds it once without `SO_REUSEPORT` (TCP with `SO_REUSEADDR`, so that old connections in
/// TIME_WAIT do not count): that fails with `EADDRINUSE` exactly when some socket is there.
/// Port 0 needs no probe, nor an address inherited from the process this one replaces (a
/// binary upgrade: its TCP and UDP sockets are ours).
/// A dual-stack `[::]` (`ipv6_only` false) is probed dual-stack: IPv4 users of its port count.
pub(crate) fn in_use(addr: SocketAddr, ipv6_only: bool, udp: bool) -> io::Result<bool> {
    if addr.port() == 0 || crate::runtime::process::upgrade::has_inherited(addr) {
        return Ok(false);
    }
    let socket = if udp {
        Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?
    } else {
        let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        s.set_reuse_address(true)?;
        s
    };
    set_family(&socket, addr, ipv6_only)?;
    match socket.bind(&addr.into()) {
        Ok(()) => Ok(false),
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => Ok(true),
        Err(e) => Err(e),
    }
}

/// Binds `count` sockets on `addr`. When the port is 0, the first socket picks a free port and
/// the others join it, so all workers share one port.
pub(crate) fn bind_reuseport(
    addr: SocketAddr,
    ipv6_only: bool,
    count: usize,
) -> io::Result<Vec<TcpListener>> {
    // a binary upgrade handed us the old process's sockets: their accept queues carry on
    let mut out = crate::runtime::process::upgrade::take_inherited(addr, count);
    if let Some(first) = out.first() {
        let bound = first.local_addr()?;
        while out.len() < count {
            out.push(bind_one(bound, ipv6_only)?);
        }
        return Ok(out);
    }
    let first = bind_one(addr, ipv6_only)?;
    let bound = first.local_addr()?;
    let mut out = vec![first];
    for _ in 1..count {
        out.push(bind_one(bound, ipv6_only)?);
    }
    Ok(out)
}
