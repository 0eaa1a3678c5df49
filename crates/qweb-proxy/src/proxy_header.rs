//! `upstream_proxy_protocol`: the PROXY header (HAProxy's v1 line or v2 block, built by the
//! `ppp` crate) qweb writes first on each new connection to an upstream, naming the client
//! (source) and the upstream (destination). A health check's connection names no client: v1
//! `UNKNOWN`, v2 `LOCAL`. An IPv4 client of an IPv6 upstream (or the other way) is sent as
//! two IPv6 addresses, the IPv4 one mapped.

use std::net::{IpAddr, SocketAddr};

use ppp::v2::{Builder, Command, Protocol, Version};
use qweb_config::UpstreamProxyProtocol;

/// Both addresses of one family.
fn same_family(a: SocketAddr, b: SocketAddr) -> (SocketAddr, SocketAddr) {
    let v6 = |s: SocketAddr| match s.ip() {
        IpAddr::V4(ip) => SocketAddr::new(IpAddr::V6(ip.to_ipv6_mapped()), s.port()),
        IpAddr::V6(_) => s,
    };
    if a.is_ipv4() == b.is_ipv4() {
        (a, b)
    } else {
        (v6(a), v6(b))
    }
}

/// The header for a connection to `upstream` on behalf of `client` (`None`: qweb's own, a
/// health check).
pub(crate) fn header(
    version: UpstreamProxyProtocol,
    client: Option<SocketAddr>,
    upstream: SocketAddr,
) -> Vec<u8> {
    let addrs = client.map(|c| same_family(c, upstream));
    match version {
        UpstreamProxyProtocol::V1 => match addrs {
            Some(a) => ppp::v1::Addresses::from(a).to_string().into_bytes(),
            None => ppp::v1::Addresses::Unknown.to_string().into_bytes(),
        },
        UpstreamProxyProtocol::V2 => {
            let built = match addrs {
                Some(a) => {
                    Builder::with_addresses(Version::Two | Command::Proxy, Protocol::Stream, a)
                }
                None => Builder::with_addresses(
                    Version::Two | Command::Local,
                    Protocol::Unspecified,
                    ppp::v2::Addresses::Unspecified,
                ),
            }
            .build();
            // addresses alone never pass u16::MAX bytes: the builder cannot fail here
            built.unwrap_or_default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn v1_and_v2_name_the_client_and_the_upstream() {
        let up = a("10.0.0.5:8080");
        let v1 = header(UpstreamProxyProtocol::V1, Some(a("203.0.113.7:40000")), up);
        assert_eq!(v1, b"PROXY TCP4 203.0.113.7 10.0.0.5 40000 8080\r\n");
        assert_eq!(
            header(UpstreamProxyProtocol::V1, None, up),
            b"PROXY UNKNOWN\r\n"
        );
        let v6 = header(UpstreamProxyProtocol::V1, Some(a("[2001:db8::7]:1")), up);
        assert_eq!(v6, b"PROXY TCP6 2001:db8::7 ::ffff:10.0.0.5 1 8080\r\n");
        let v2 = header(UpstreamProxyProtocol::V2, Some(a("203.0.113.7:40000")), up);
        let parsed = ppp::v2::Header::try_from(&v2[..]).unwrap();
        assert_eq!(parsed.command, Command::Proxy);
        assert_eq!(
            parsed.addresses,
            ppp::v2::Addresses::from((a("203.0.113.7:40000"), up))
        );
        let local = header(UpstreamProxyProtocol::V2, None, up);
        let parsed = ppp::v2::Header::try_from(&local[..]).unwrap();
        assert_eq!((parsed.command, parsed.len()), (Command::Local, 16));
    }
}
