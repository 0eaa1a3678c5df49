//! Phase 0 of the pipeline (issue 39): a trusted L4 balancer's PROXY header (v1 or v2, read
//! before TLS) is the client's address for the access log, `allow`/`deny`, the proxy's
//! `X-Real-IP` and `X-Forwarded-For`; an untrusted client's header is a bad request, its
//! `X-Forwarded-For` decides nothing; bad, oversized or late headers close the connection;
//! `[limits] connections_per_client` holds one address (after the PROXY header) at its limit
//! across the workers and a reload while another address is served, over TCP and QUIC.
//!
//! Clients are real sockets writing raw bytes, then HTTP/1.1, or TLS with HTTP/2 (the h2
//! crate), or HTTP/3 (aioquic); a second client address is 127.0.0.2 (bound by the client).

use qweb_testkit as common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::h3::{aioquic, aioquic_available, H3Request};
use common::wire::{
    closed_within, connect_from, proxy_v1, proxy_v2, proxy_v2_raw, read_response, Response,
    PROXY_V2_SIGNATURE,
};
use common::Proto;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

const T: Duration = Duration::from_secs(10);

fn lo(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// qweb with a plain and a TLS listener (HTTP/3 too), both taking PROXY headers from
/// `trusted`; `/only` may be reached from 203.0.113.0/24 alone; everything goes to `up`.
/// `limits` is added to `[limits]` (`header_read_timeout` is 1 s).
fn server(trusted: &str, up: SocketAddr, limits: &str, workers: usize) -> common::TestServer {
    server_on(0, trusted, up, limits, workers)
}

/// [`server`] with its plain listener on `port` (a fixed port stays across a reload).
fn server_on(
    port: u16,
    trusted: &str,
    up: SocketAddr,
    limits: &str,
    workers: usize,
) -> common::TestServer {
    common::start_with(
        &format!(
            "workers = {workers}\n[admin]\naddress = \"127.0.0.1:0\"\n\
             [limits]\nheader_read_timeout = \"1s\"\n{limits}\
             [[listener]]\naddress = \"127.0.0.1:{port}\"\nproxy_protocol = {{ trusted = [{trusted}] }}\n\
             [[listener]]\naddress = \"127.0.0.1:0\"\nhttp3 = true\nproxy_protocol = {{ trusted = [{trusted}] }}\n\
             [listener.tls]\nself_signed = true\n\
             [[route]]\nprefix = \"/rl\"\nrate_limit = {{ rate = \"1/m\", burst = 0 }}\nupstreams = [\"{up}\"]\n\
             [[route]]\nprefix = \"/only\"\nallow = [\"203.0.113.0/24\"]\nupstreams = [\"{up}\"]\n\
             [[route]]\nprefix = \"/\"\nupstreams = [\"{up}\"]\n"
        ),
        |_| {},
    )
}

/// One keep-alive GET on `s` (extra header lines in `headers`).
async fn get<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    path: &str,
    headers: &str,
) -> Option<Response> {
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{headers}\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    read_response(s, T).await
}

/// The status of a GET on a new connection from `from` to `to` that first writes `header`.
async fn status_via(from: IpAddr, to: SocketAddr, header: &[u8], path: &str) -> u16 {
    let mut s = connect_from(from, to).await.expect("connect");
    s.write_all(header).await.expect("header");
    get(&mut s, path, "").await.map_or(0, |r| r.status)
}

async fn metric(t: &common::TestServer, name: &str) -> f64 {
    t.metrics().await.sum(name, &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_balancers_header_is_the_client_address_everywhere() {
    let up = common::recorder::start().await;
    let t = server("\"127.0.0.1\"", up.addr, "", 1);
    let (plain, tls) = (t.addrs[0], t.addrs[1]);
    // v1, then HTTP/1.1 on the same connection: the access rule sees the header's address
    let mut s = TcpStream::connect(plain).await.unwrap();
    s.write_all(&proxy_v1(addr("203.0.113.7:40001"), plain))
        .await
        .unwrap();
    let r = get(&mut s, "/only/a", "").await.expect("an answer");
    assert_eq!(r.status, 200, "{}", r.head);
    // a second request on the connection keeps it
    assert_eq!(get(&mut s, "/only/a2", "").await.unwrap().status, 200);
    // v2 from outside the allowed block: 403
    let v2 = proxy_v2(addr("198.51.100.9:40002"), plain, &[]);
    assert_eq!(status_via(lo(1), plain, &v2, "/only/b").await, 403);
    // the proxy tells the upstream the header's address (X-Real-IP, X-Forwarded-For)
    let seen = up.take();
    let a = seen
        .iter()
        .find(|r| r.target() == "/only/a")
        .expect("forwarded");
    assert_eq!(a.header("x-real-ip").as_deref(), Some("203.0.113.7"));
    assert_eq!(a.header("x-forwarded-for").as_deref(), Some("203.0.113.7"));
    assert!(!seen.iter().any(|r| r.target() == "/only/b"));
    // rate limits are kept per header address: the balancer's clients have a budget each
    let (c1, c2) = (addr("203.0.113.1:1"), addr("203.0.113.2:1"));
    for (who, status) in [(c1, 200), (c1, 429), (c2, 200), (c2, 429)] {
        let s = status_via(lo(1), plain, &proxy_v1(who, plain), "/rl").await;
        assert_eq!(s, status, "{who}");
    }
    up.take();
    // TLS: the header before the handshake (a v2 block with a TLV, which is skipped), then
    // HTTP/2 by ALPN, from an IPv6 client
    let mut tcp = TcpStream::connect(tls).await.unwrap();
    let alpn_tlv = [0x01, 0x00, 0x02, b'h', b'2'];
    tcp.write_all(&proxy_v2(addr("[2001:db8::7]:40003"), tls, &alpn_tlv))
        .await
        .unwrap();
    let cfg = Arc::new(common::tls_client_config(&t.cert(), Proto::H2));
    let stream = tokio_rustls::TlsConnector::from(cfg)
        .connect(common::tls::localhost(), tcp)
        .await
        .expect("TLS after the PROXY header");
    let h2 = common::h2client::handshake(stream).await;
    let (status, _, _) = common::h2client::get(&h2, "/v6", &[]).await;
    assert_eq!(status, 200);
    let seen = up.take();
    assert_eq!(
        seen[0].header("x-real-ip").as_deref(),
        Some("2001:db8::7"),
        "{}",
        seen[0].head
    );
    // TLS with HTTP/1.1, the header and the ClientHello in one write
    let v1 = proxy_v1(addr("203.0.113.8:40004"), tls);
    let cfg = Arc::new(common::tls_client_config(&t.cert(), Proto::H1));
    let tcp = TcpStream::connect(tls).await.unwrap();
    let mut stream = tokio_rustls::TlsConnector::from(cfg)
        .connect_with(common::tls::localhost(), Prefixed::new(tcp, v1), |_| {})
        .await
        .expect("TLS after the PROXY header");
    assert_eq!(get(&mut stream, "/only/tls", "").await.unwrap().status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_header_from_an_untrusted_address_is_not_honoured() {
    let up = common::recorder::start().await;
    // 127.0.0.1 is no balancer here
    let t = server("\"10.0.0.0/8\", \"127.0.0.2\"", up.addr, "", 1);
    let (plain, tls) = (t.addrs[0], t.addrs[1]);
    let spoof = addr("203.0.113.7:40001");
    for header in [proxy_v1(spoof, plain), proxy_v2(spoof, plain, &[])] {
        let s = status_via(lo(1), plain, &header, "/only/x").await;
        assert_eq!(s, 400, "{header:?}");
        // on the TLS port: the plain-HTTP-on-TLS answer, or a closed connection
        let mut c = TcpStream::connect(tls).await.unwrap();
        c.write_all(&header).await.unwrap();
        c.write_all(b"GET /only/x HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .await
            .unwrap();
        let r = read_response(&mut c, T).await;
        assert!(r.as_ref().is_none_or(|r| r.status == 400), "{r:?}");
    }
    // served with its own address without a header
    assert_eq!(status_via(lo(1), plain, b"", "/plain").await, 200);
    let seen = up.take();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].header("x-real-ip").as_deref(), Some("127.0.0.1"));
    assert_eq!(metric(&t, "qweb_proxy_protocol_refused_total").await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spoofed_x_forwarded_for_is_not_the_client_address() {
    let up = common::recorder::start().await;
    let t = server("\"127.0.0.2\"", up.addr, "", 1);
    let plain = t.addrs[0];
    let spoof =
        "X-Forwarded-For: 203.0.113.7\r\nX-Real-IP: 203.0.113.7\r\nForwarded: for=203.0.113.7\r\n";
    // an untrusted client
    let mut s = connect_from(lo(1), plain).await.unwrap();
    assert_eq!(get(&mut s, "/only/x", spoof).await.unwrap().status, 403);
    assert_eq!(get(&mut s, "/seen", spoof).await.unwrap().status, 200);
    // behind the trusted balancer: its header decides, not the client's fields
    let mut s = connect_from(lo(2), plain).await.unwrap();
    s.write_all(&proxy_v1(addr("198.51.100.1:5000"), plain))
        .await
        .unwrap();
    assert_eq!(get(&mut s, "/only/y", spoof).await.unwrap().status, 403);
    assert_eq!(get(&mut s, "/seen2", spoof).await.unwrap().status, 200);
    let seen = up.take();
    assert_eq!(seen.len(), 2, "{seen:?}");
    for (r, ip) in seen.iter().zip(["127.0.0.1", "198.51.100.1"]) {
        assert_eq!(r.header("x-real-ip").as_deref(), Some(ip), "{}", r.head);
        let xff = r.header("x-forwarded-for").unwrap_or_default();
        assert!(xff.ends_with(&format!(", {ip}")), "{xff}");
        assert_eq!(r.header("forwarded"), None);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_header_written_byte_by_byte_or_with_the_request_is_read_exactly() {
    let up = common::recorder::start().await;
    let t = server("\"127.0.0.1\"", up.addr, "", 1);
    let plain = t.addrs[0];
    let src = addr("203.0.113.9:40000");
    for header in [proxy_v1(src, plain), proxy_v2(src, plain, &[])] {
        let mut s = TcpStream::connect(plain).await.unwrap();
        s.set_nodelay(true).unwrap();
        for b in &header {
            s.write_all(std::slice::from_ref(b)).await.unwrap();
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        let r = get(&mut s, "/only/trickled", "").await.expect("an answer");
        assert_eq!(r.status, 200, "{}", r.head);
        // the header and the request in one write: not a byte of the request is lost
        let mut s = TcpStream::connect(plain).await.unwrap();
        let mut all = header.clone();
        all.extend_from_slice(b"GET /only/together HTTP/1.1\r\nHost: localhost\r\n\r\n");
        s.write_all(&all).await.unwrap();
        let r = read_response(&mut s, T).await.expect("an answer");
        assert_eq!(r.status, 200, "{}", r.head);
    }
    let seen = up.take();
    assert_eq!(seen.len(), 4);
    assert!(seen
        .iter()
        .all(|r| r.header("x-real-ip").as_deref() == Some("203.0.113.9")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_connection_that_never_finishes_its_header_is_closed_at_header_read_timeout() {
    let up = common::recorder::start().await;
    let t = server("\"127.0.0.1\"", up.addr, "", 1);
    let (plain, tls) = (t.addrs[0], t.addrs[1]);
    for (to, start) in [
        (plain, &b"PROXY TCP4 203.0.113.7"[..]),
        (tls, &PROXY_V2_SIGNATURE[..]),
        (plain, b""),
    ] {
        let mut s = TcpStream::connect(to).await.unwrap();
        s.write_all(start).await.unwrap();
        let began = Instant::now();
        assert!(
            closed_within(&mut s, Duration::from_secs(5)).await,
            "{start:?}"
        );
        let took = began.elapsed();
        assert!(
            (Duration::from_millis(900)..Duration::from_secs(3)).contains(&took),
            "{start:?}: closed after {took:?}"
        );
    }
    assert_eq!(metric(&t, "qweb_proxy_protocol_refused_total").await, 3.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_proxy_headers_close_the_connection_at_once_and_are_counted() {
    let up = common::recorder::start().await;
    let t = server("\"127.0.0.1\"", up.addr, "", 1);
    let (plain, tls) = (t.addrs[0], t.addrs[1]);
    let mut huge_v2 = PROXY_V2_SIGNATURE.to_vec();
    huge_v2.extend_from_slice(&[0x21, 0x11, 0xea, 0x60]); // 60 000 bytes announced
    let long_v1 = format!("PROXY TCP4 203.0.113.7 {} 1 2\r\n", "1".repeat(100));
    let bad: [(&str, Vec<u8>); 6] = [
        (
            "no header",
            b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n".to_vec(),
        ),
        ("a v1 line over 107 bytes", long_v1.into_bytes()),
        (
            "a v1 line without CRLF",
            format!("PROXY UNKNOWN{}", " x".repeat(100)).into_bytes(),
        ),
        ("a bad v2 signature", {
            let mut b = proxy_v2(addr("203.0.113.7:1"), plain, &[]);
            b[11] = b'X';
            b
        }),
        ("a v2 length past the bound", huge_v2),
        ("a bad v2 version", proxy_v2_raw(0x31, 0x11, &[0; 12])),
    ];
    for (what, bytes) in &bad {
        for to in [plain, tls] {
            let mut s = TcpStream::connect(to).await.unwrap();
            let _ = s.write_all(bytes).await;
            let began = Instant::now();
            let mut got = Vec::new();
            let read = tokio::time::timeout(
                Duration::from_millis(700),
                tokio::io::AsyncReadExt::read_to_end(&mut s, &mut got),
            )
            .await;
            // closed before the header timeout (1 s), with nothing said
            assert!(
                read.is_ok(),
                "{what} on {to}: still open after {:?}",
                began.elapsed()
            );
            assert!(
                got.is_empty(),
                "{what} on {to}: {}",
                String::from_utf8_lossy(&got)
            );
        }
    }
    let m = t.metrics().await;
    assert_eq!(m.sum("qweb_proxy_protocol_refused_total", &[]), 12.0);
    // nothing pinned: every connection is gone, the upstream saw nothing
    common::poll_until_async(
        "no connection open",
        T,
        Duration::from_millis(20),
        || async { (t.metrics().await.sum("qweb_connections_open", &[]) == 0.0).then_some(()) },
    )
    .await;
    assert!(up.take().is_empty());
    // and the listener serves a good header as before
    let ok = proxy_v1(addr("203.0.113.7:1"), plain);
    assert_eq!(status_via(lo(1), plain, &ok, "/only/after").await, 200);
}

/// Opens `n` connections from `from` to `to` and shows each is served (one request).
async fn hold(from: IpAddr, to: SocketAddr, header: &[u8], n: usize) -> Vec<TcpStream> {
    let mut held = Vec::new();
    for i in 0..n {
        let mut s = connect_from(from, to).await.expect("connect");
        s.write_all(header).await.unwrap();
        let r = get(&mut s, "/held", "").await;
        assert_eq!(r.map(|r| r.status), Some(200), "connection {i} of {n}");
        held.push(s);
    }
    held
}

/// A new connection from `from` is closed at once, nothing answered.
async fn refused(from: IpAddr, to: SocketAddr, header: &[u8]) -> bool {
    let Ok(mut s) = connect_from(from, to).await else {
        return true;
    };
    let _ = s.write_all(header).await;
    let _ = s
        .write_all(b"GET /refused HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await;
    let mut got = Vec::new();
    let read = tokio::time::timeout(
        Duration::from_secs(2),
        tokio::io::AsyncReadExt::read_to_end(&mut s, &mut got),
    )
    .await;
    matches!(read, Ok(Ok(_)) | Ok(Err(_))) && got.is_empty()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_client_holds_at_connections_per_client_across_workers_while_another_is_served() {
    let up = common::recorder::start().await;
    let t = server("\"10.0.0.0/8\"", up.addr, "connections_per_client = 3\n", 4);
    let plain = t.addrs[0];
    let held = hold(lo(1), plain, b"", 3).await;
    // as fast as it can: 40 more connections at once, every one closed unanswered
    let flood: Vec<_> = (0..40)
        .map(|_| tokio::spawn(refused(lo(1), plain, b"")))
        .collect();
    // meanwhile another address is served
    let other = hold(lo(2), plain, b"", 3).await;
    for f in flood {
        assert!(f.await.unwrap(), "a connection past the limit was served");
    }
    assert!(up.take().iter().all(|r| r.target() == "/held"));
    let m = t.metrics().await;
    assert_eq!(
        m.sum("qweb_connections_refused_per_client_total", &[]),
        40.0
    );
    assert_eq!(m.value("qweb_client_addresses", &[]), 2.0);
    // closed connections give their slots back: 3 again
    drop(held);
    drop(other);
    common::poll_until_async(
        "no connection open",
        T,
        Duration::from_millis(20),
        || async { (t.metrics().await.sum("qweb_connections_open", &[]) == 0.0).then_some(()) },
    )
    .await;
    assert_eq!(t.metrics().await.value("qweb_client_addresses", &[]), 0.0);
    let again = hold(lo(1), plain, b"", 3).await;
    assert!(refused(lo(1), plain, b"").await);
    drop(again);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_per_client_counts_the_proxy_headers_address_and_survives_a_reload() {
    let up = common::recorder::start().await;
    let port = common::free_port();
    let mut t = server_on(
        port,
        "\"127.0.0.1\"",
        up.addr,
        "connections_per_client = 2\n",
        2,
    );
    let plain = t.addrs[0];
    let a = proxy_v1(addr("203.0.113.7:1000"), plain);
    let b = proxy_v2(addr("203.0.113.8:1000"), plain, &[]);
    // the balancer's own address holds nothing: its clients do
    let held = hold(lo(1), plain, &a, 2).await;
    assert!(refused(lo(1), plain, &a).await);
    let other = hold(lo(1), plain, &b, 2).await;
    // a reload keeps the count: the held connections still hold their slots
    let file = t.dir.path().join("qweb.toml");
    let text = std::fs::read_to_string(&file).unwrap();
    let config = qweb_server::Config::from_str_at(&text, Some(&file)).unwrap();
    t.server.as_mut().unwrap().reload(config).unwrap();
    assert!(refused(lo(1), plain, &a).await);
    assert!(refused(lo(1), plain, &b).await);
    drop(held);
    common::poll_until_async(
        "no connection open",
        T,
        Duration::from_millis(20),
        || async { (t.metrics().await.sum("qweb_connections_open", &[]) == 2.0).then_some(()) },
    )
    .await;
    let again = hold(lo(1), plain, &a, 2).await;
    drop((again, other));
}

#[test]
fn http3_connections_count_with_tcp_against_connections_per_client() {
    if !aioquic_available() {
        eprintln!("skipped: python3 with aioquic is not installed");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let up = rt.block_on(common::recorder::start());
    let t = server("\"10.0.0.0/8\"", up.addr, "connections_per_client = 2\n", 1);
    let tls = t.addrs[1];
    let h3 = |t: &common::TestServer| aioquic(tls, &t.cert(), &[H3Request::get("/h3")], false);
    // two TCP connections take both slots: a QUIC connection is closed after its handshake
    let mut held = rt.block_on(async {
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut s = TcpStream::connect(t.addrs[0]).await.unwrap();
            assert_eq!(get(&mut s, "/held", "").await.unwrap().status, 200);
            held.push(s);
        }
        held
    });
    let r = h3(&t);
    assert!(
        r.as_ref()
            .map_or(true, |reqs| reqs.iter().all(|r| r.is_err())),
        "{r:?}"
    );
    // one slot free: HTTP/3 is served
    drop(held.pop());
    rt.block_on(common::poll_until_async(
        "a TCP connection gone",
        T,
        Duration::from_millis(20),
        || async { (metric(&t, "qweb_connections_open").await == 1.0).then_some(()) },
    ));
    let r = h3(&t).expect("served over HTTP/3");
    assert_eq!(r[0].as_ref().map(|r| r.status), Ok(200));
    drop(held);
    rt.block_on(async {
        assert!(metric(&t, "qweb_connections_refused_per_client_total").await >= 1.0);
    });
}

/// A TCP stream whose first write is prefixed by `prefix`: the PROXY header and the
/// ClientHello leave in one segment.
struct Prefixed {
    inner: TcpStream,
    prefix: Option<Vec<u8>>,
}

impl Prefixed {
    fn new(inner: TcpStream, prefix: Vec<u8>) -> Self {
        Prefixed {
            inner,
            prefix: Some(prefix),
        }
    }
}

impl AsyncRead for Prefixed {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if let Some(p) = self.prefix.take() {
            let mut all = p.clone();
            all.extend_from_slice(buf);
            // loopback takes a few hundred bytes whole
            return match std::pin::Pin::new(&mut self.inner).poll_write(cx, &all) {
                std::task::Poll::Ready(Ok(n)) if n == all.len() => {
                    std::task::Poll::Ready(Ok(buf.len()))
                }
                std::task::Poll::Ready(Ok(_)) => std::task::Poll::Ready(Err(
                    std::io::Error::other("short write of the prefixed ClientHello"),
                )),
                other => {
                    self.prefix = Some(p);
                    other
                }
            };
        }
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// An upstream that expects a PROXY header on each connection (v1 or v2), then requests
/// (kept alive), and answers each with what the header said: a v1 line as written, a v2 block's source address, or
/// `LOCAL`; each answer is also kept in the returned list.
async fn header_upstream() -> (
    SocketAddr,
    Arc<std::sync::Mutex<Vec<String>>>,
    tokio::task::JoinHandle<()>,
) {
    use tokio::io::AsyncReadExt;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                continue;
            };
            let seen = seen2.clone();
            tokio::spawn(async move {
                let _: Option<()> = async move {
                    let mut first = [0u8; 1];
                    s.read_exact(&mut first).await.ok()?;
                    let said = if first[0] == b'P' {
                        let mut line = vec![first[0]];
                        while !line.ends_with(b"\r\n") {
                            line.push(s.read_u8().await.ok()?);
                        }
                        String::from_utf8_lossy(&line[..line.len() - 2]).into_owned()
                    } else {
                        let mut head = [0u8; 15];
                        s.read_exact(&mut head).await.ok()?;
                        let mut payload =
                            vec![0u8; usize::from(u16::from_be_bytes([head[13], head[14]]))];
                        s.read_exact(&mut payload).await.ok()?;
                        match (head[11] & 0x0f, head[12] >> 4) {
                            (0, _) => "LOCAL".to_owned(),
                            (_, 1) => {
                                let ip =
                                    Ipv4Addr::new(payload[0], payload[1], payload[2], payload[3]);
                                format!("{ip}:{}", u16::from_be_bytes([payload[8], payload[9]]))
                            }
                            _ => {
                                let ip: [u8; 16] = payload[..16].try_into().ok()?;
                                let ip = std::net::Ipv6Addr::from(ip);
                                let port = u16::from_be_bytes([payload[32], payload[33]]);
                                SocketAddr::new(ip.into(), port).to_string()
                            }
                        }
                    };
                    // keep-alive: a proxy that reused this connection for another client would
                    // get this header's answer
                    loop {
                        let mut req = Vec::new();
                        while common::wire::find(&req, b"\r\n\r\n").is_none() {
                            req.push(s.read_u8().await.ok()?);
                        }
                        seen.lock().unwrap().push(said.clone());
                        let resp = format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{said}",
                            said.len()
                        );
                        s.write_all(resp.as_bytes()).await.ok()?;
                    }
                }
                .await;
            });
        }
    });
    (addr, seen, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_proxy_protocol_tells_the_upstream_the_client_on_every_connection() {
    let (up, seen, _task) = header_upstream().await;
    let t = common::start_with(
        &format!(
            "[[listener]]\naddress = \"127.0.0.1:0\"\nproxy_protocol = {{ trusted = [\"127.0.0.1\"] }}\n\
             [[route]]\nprefix = \"/v1\"\nupstreams = [\"{up}\"]\nupstream_proxy_protocol = \"v1\"\n\
             [[route]]\nprefix = \"/\"\nupstreams = [\"{up}\"]\nupstream_proxy_protocol = \"v2\"\n\
             health_check = {{ path = \"/healthz\", interval = \"200ms\", expect = 200 }}\n"
        ),
        |_| {},
    );
    let plain = t.addrs[0];
    // behind the balancer: the header's client, on each request of the connection (an
    // upstream connection that named one client is not reused for another)
    let mut s = TcpStream::connect(plain).await.unwrap();
    s.write_all(&proxy_v1(addr("203.0.113.7:40001"), plain))
        .await
        .unwrap();
    for _ in 0..2 {
        let r = get(&mut s, "/x", "").await.expect("an answer");
        assert_eq!((r.status, &r.body[..]), (200, &b"203.0.113.7:40001"[..]));
    }
    let r = get(&mut s, "/v1/x", "").await.expect("an answer");
    assert_eq!(
        String::from_utf8_lossy(&r.body),
        format!("PROXY TCP4 203.0.113.7 127.0.0.1 40001 {}", up.port())
    );
    // another client at once: its own address
    let mut s2 = TcpStream::connect(plain).await.unwrap();
    s2.write_all(&proxy_v2(addr("[2001:db8::5]:7"), plain, &[]))
        .await
        .unwrap();
    let r = get(&mut s2, "/x", "").await.expect("an answer");
    let said = String::from_utf8_lossy(&r.body).into_owned();
    assert_eq!(said, "[2001:db8::5]:7");
    let r = get(&mut s, "/x", "").await.expect("an answer");
    assert_eq!(&r.body[..], b"203.0.113.7:40001");
    // health checks name no client: v2 LOCAL
    common::poll_until("a health check", T, Duration::from_millis(50), || {
        seen.lock()
            .unwrap()
            .iter()
            .any(|s| s == "LOCAL")
            .then_some(())
    });
}
