//! Listener address forms (issue 41, item 2): `[::]` serves IPv4 and IPv6 clients (as Caddy
//! and Go bind it), over TCP and QUIC, and logs, limits and `X-Forwarded-For` see an IPv4
//! client as `a.b.c.d`, not `::ffff:a.b.c.d`; `ipv6_only = true` keeps IPv4 out; `[::]`
//! beside `0.0.0.0` on the same port stays IPv6 only, each family to its own listener.

use qweb_testkit as common;

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use common::h3::{aioquic, aioquic_available, H3Request};
use common::recorder;

const TIMEOUT: Duration = Duration::from_secs(10);

/// `GET path` over plain HTTP/1.1 to `addr`: the status and what the upstream recorded as
/// the client (`X-Forwarded-For`), or `None` when the connection is refused.
async fn get(addr: SocketAddr, up: &recorder::Recorder) -> Option<(u16, Vec<String>)> {
    tokio::net::TcpStream::connect(addr).await.ok()?;
    let out = common::raw_exchange(
        addr,
        b"GET /who HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        TIMEOUT,
    )
    .await;
    let text = String::from_utf8_lossy(&out);
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let seen = up.take();
    Some((
        status,
        seen.iter()
            .flat_map(|r| r.header_all("x-forwarded-for"))
            .collect(),
    ))
}

fn at(ip: impl Into<std::net::IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(ip.into(), port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unspecified_ipv6_serves_both_families() {
    let up = recorder::start().await;
    let ts = common::start_with(
        &format!(
            "[[listener]]\naddress = \"[::]:0\"\nhttp3 = true\n[listener.tls]\nself_signed = true\n\
             [[listener]]\naddress = \"[::]:0\"\n\
             [[listener]]\naddress = \"[::]:0\"\nipv6_only = true\n\
             [[route]]\nprefix = \"/\"\nupstreams = [\"{}\"]\n",
            up.addr
        ),
        |_| {},
    );
    let (tls, dual, v6) = (ts.addrs[0].port(), ts.addrs[1].port(), ts.addrs[2].port());
    assert_eq!(
        get(at(Ipv4Addr::LOCALHOST, dual), &up).await,
        Some((200, vec!["127.0.0.1".to_owned()])),
        "an IPv4 client of [::], seen as itself"
    );
    assert_eq!(
        get(at(Ipv6Addr::LOCALHOST, dual), &up).await,
        Some((200, vec!["::1".to_owned()])),
        "an IPv6 client of [::]"
    );
    assert_eq!(
        get(at(Ipv6Addr::LOCALHOST, v6), &up).await,
        Some((200, vec!["::1".to_owned()])),
        "ipv6_only serves IPv6"
    );
    assert_eq!(
        get(at(Ipv4Addr::LOCALHOST, v6), &up).await,
        None,
        "ipv6_only = true keeps IPv4 out"
    );
    // HTTPS and HTTP/3 on the dual-stack TLS listener, from both families
    let client = common::tls::client(&ts.cert(), common::Proto::H1);
    for host in ["127.0.0.1", "[::1]"] {
        let r = client
            .get(format!("https://{host}:{tls}/who"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("HTTPS to {host}: {e}"));
        assert_eq!(r.status(), 200, "HTTPS to {host}");
    }
    up.take();
    if aioquic_available() {
        for ip in [
            std::net::IpAddr::from(Ipv4Addr::LOCALHOST),
            Ipv6Addr::LOCALHOST.into(),
        ] {
            let ca = ts.cert();
            let out = tokio::task::spawn_blocking(move || {
                aioquic(at(ip, tls), &ca, &[H3Request::get("/who")], false)
            })
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("HTTP/3 to {ip}: {e}"));
            let status = out[0].as_ref().map(|r| r.status).unwrap_or(0);
            assert_eq!(status, 200, "HTTP/3 to {ip}: {out:?}");
            let seen = up.take();
            let want = if ip.is_ipv4() { "127.0.0.1" } else { "::1" };
            assert_eq!(
                seen.iter()
                    .flat_map(|r| r.header_all("x-forwarded-for"))
                    .collect::<Vec<_>>(),
                [want],
                "HTTP/3 client {ip}"
            );
        }
    } else {
        eprintln!("SKIPPED (HTTP/3 part): python3 with aioquic is needed (pip install aioquic)");
    }
}

/// `0.0.0.0:P` and `[::]:P` in one configuration: each family reaches its own listener (the
/// `[::]` one is bound IPv6 only), and `ipv6_only = false` on it is refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unspecified_ipv6_beside_ipv4_keeps_to_ipv6() {
    let up = recorder::start().await;
    let port = common::free_port();
    let ts = common::start_with(
        &format!(
            "[[listener]]\naddress = \"0.0.0.0:{port}\"\nredirect = {{ to = \"/v4\", status = 302 }}\n\
             [[listener]]\naddress = \"[::]:{port}\"\n\
             [[route]]\nprefix = \"/\"\nupstreams = [\"{}\"]\n",
            up.addr
        ),
        |_| {},
    );
    let v4 = get(at(Ipv4Addr::LOCALHOST, port), &up).await;
    assert_eq!(v4, Some((302, vec![])), "IPv4 goes to 0.0.0.0's listener");
    let v6 = get(at(Ipv6Addr::LOCALHOST, port), &up).await;
    assert_eq!(v6, Some((200, vec!["::1".to_owned()])), "IPv6 to [::]'s");
    drop(ts);
    let text = format!(
        "[[listener]]\naddress = \"0.0.0.0:{port}\"\n[[listener]]\naddress = \"[::]:{port}\"\nipv6_only = false\n"
    );
    let err = qweb_server::config::Config::from_str_at(&text, None)
        .map(|_| ())
        .expect_err("refused")
        .to_string();
    assert!(err.contains("listener[1].ipv6_only"), "{err}");
}
