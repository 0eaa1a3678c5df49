//! The proxy's HTTP/1.1 `Upgrade` pass-through, against a real WebSocket echo server and
//! client (tokio-tungstenite), and raw upstreams that misbehave.

use qweb_testkit as common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;

use common::upstream;
use common::ws::ws_echo;

fn proxy_route(ups: &[SocketAddr], extra: &str) -> String {
    let list: Vec<String> = ups.iter().map(|a| format!("\"{a}\"")).collect();
    format!(
        "[[route]]\nprefix = \"/\"\nupstreams = [{}]\n{extra}\n",
        list.join(", ")
    )
}

/// Reads an HTTP head (through the blank line); `None` on EOF first.
async fn read_head(s: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut b = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf[end + 4..].to_vec();
            return Some((String::from_utf8_lossy(&buf[..end + 4]).into_owned(), rest));
        }
        let n = s.read(&mut b).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&b[..n]);
    }
}

/// A raw upstream: records each request head, answers `reply`, then runs `after`.
async fn raw_upstream<F, Fut>(
    reply: &'static str,
    after: F,
) -> (SocketAddr, Arc<Mutex<Vec<String>>>)
where
    F: Fn(TcpStream, Vec<u8>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let h = heads.clone();
    let after = Arc::new(after);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let h = h.clone();
            let after = after.clone();
            tokio::spawn(async move {
                let Some((head, rest)) = read_head(&mut s).await else {
                    return;
                };
                h.lock().unwrap().push(head);
                if s.write_all(reply.as_bytes()).await.is_err() {
                    return;
                }
                after(s, rest).await;
            });
        }
    });
    (addr, heads)
}

const WS_REQUEST: &str = "GET /chat HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n\
    Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";

const SWITCH: &str =
    "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
    Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n";

#[tokio::test]
async fn websocket_echo_through_the_proxy_over_plain_and_tls() {
    let echo = ws_echo().await;
    let t = common::start_with(&proxy_route(&[echo], ""), |_| {});
    // plain HTTP/1.1
    let s = TcpStream::connect(t.addrs[1]).await.unwrap();
    let (mut ws, resp) = tokio_tungstenite::client_async(format!("ws://{}/chat", t.addrs[1]), s)
        .await
        .expect("websocket handshake through qweb");
    assert_eq!(resp.status(), 101);
    for i in 0..20 {
        ws.send(Message::text(format!("hello {i}"))).await.unwrap();
        let m = ws.next().await.unwrap().unwrap();
        assert_eq!(m.into_text().unwrap(), format!("hello {i}"));
    }
    let big = vec![7u8; 300_000];
    ws.send(Message::binary(big.clone())).await.unwrap();
    let m = ws.next().await.unwrap().unwrap();
    assert_eq!(m.into_data(), big);
    ws.close(None).await.unwrap();

    // over TLS (HTTP/1.1 by ALPN)
    let tls = t.tls(common::Proto::H1).await;
    let (mut ws, _) = tokio_tungstenite::client_async(format!("wss://{}/chat", t.addrs[0]), tls)
        .await
        .expect("websocket over TLS through qweb");
    ws.send(Message::text("over tls")).await.unwrap();
    let m = ws.next().await.unwrap().unwrap();
    assert_eq!(m.into_text().unwrap(), "over tls");
}

#[tokio::test]
async fn bytes_sent_with_the_request_head_reach_the_upstream() {
    // the client sends its first bytes before it sees the 101 (in the same segment)
    let (up, heads) = raw_upstream(SWITCH, |mut s, mut rest| async move {
        while rest.len() < 5 {
            let mut b = [0u8; 64];
            match s.read(&mut b).await {
                Ok(0) | Err(_) => return,
                Ok(n) => rest.extend_from_slice(&b[..n]),
            }
        }
        let _ = s.write_all(&rest).await;
    })
    .await;
    let t = common::start_with(&proxy_route(&[up], ""), |_| {});
    let mut c = TcpStream::connect(t.addrs[1]).await.unwrap();
    c.write_all(format!("{WS_REQUEST}early").as_bytes())
        .await
        .unwrap();
    let (head, mut rest) = tokio::time::timeout(Duration::from_secs(5), read_head(&mut c))
        .await
        .unwrap()
        .unwrap();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("upgrade: websocket"),
        "{head}"
    );
    while rest.len() < 5 {
        let mut b = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut b))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "closed before the echo");
        rest.extend_from_slice(&b[..n]);
    }
    assert_eq!(rest, b"early");
    let h = heads.lock().unwrap()[0].to_ascii_lowercase();
    assert!(h.contains("upgrade: websocket"), "{h}");
    assert!(h.contains("connection: upgrade"), "{h}");
    assert!(
        h.contains("sec-websocket-key: dghlihnhbxbszsbub25jzq=="),
        "{h}"
    );
}

#[tokio::test]
async fn upgrade_to_a_token_not_allowed_is_stripped() {
    // h2c (request smuggling past the proxy) and a token the route does not list
    let up = upstream::start("u1").await;
    let t = common::start_with(&proxy_route(&[up.addr], ""), |_| {});
    for token in ["h2c", "foo", "websocket, h2c"] {
        let req = format!(
            "GET /echo HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n\
             Upgrade: {token}\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n"
        );
        let mut c = TcpStream::connect(t.addrs[1]).await.unwrap();
        c.write_all(req.as_bytes()).await.unwrap();
        let (head, _) = read_head(&mut c).await.unwrap();
        let h = head.to_ascii_lowercase();
        assert!(h.starts_with("http/1.1 200"), "{token}: {head}");
        assert!(
            !h.contains("x-up-h-upgrade"),
            "{token} reached the upstream: {head}"
        );
        assert!(!h.contains("x-up-h-http2-settings"), "{head}");
    }
    // an upstream that switches anyway (to a protocol nobody asked for) is a 502
    let (bad, heads) = raw_upstream(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n",
        |_s, _| async {},
    )
    .await;
    let t = common::start_with(&proxy_route(&[bad], ""), |_| {});
    let req = "GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n";
    let out = common::raw_exchange(t.addrs[1], req.as_bytes(), Duration::from_secs(3)).await;
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 502"), "{out}");
    assert!(!heads.lock().unwrap()[0]
        .to_ascii_lowercase()
        .contains("upgrade"));
    // asked for websocket, switched to h2c: 502
    let out = common::raw_exchange(t.addrs[1], WS_REQUEST.as_bytes(), Duration::from_secs(3)).await;
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 502"), "{out}");
}

#[tokio::test]
async fn route_allows_other_tokens_and_can_refuse_websocket() {
    let (up, heads) = raw_upstream(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: foo/2\r\nConnection: Upgrade\r\n\r\n",
        |mut s, _| async move {
            let _ = s.write_all(b"tunnel").await;
        },
    )
    .await;
    let t = common::start_with(&proxy_route(&[up], "upgrade = [\"foo/2\"]"), |_| {});
    let req = "GET / HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: foo/2\r\n\r\n";
    let out = common::raw_exchange(t.addrs[1], req.as_bytes(), Duration::from_secs(3)).await;
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 101"), "{out}");
    assert!(out.ends_with("tunnel"), "{out}");
    // websocket is not in this route's list: stripped
    let _ = common::raw_exchange(t.addrs[1], WS_REQUEST.as_bytes(), Duration::from_secs(2)).await;
    let h = heads.lock().unwrap()[1].to_ascii_lowercase();
    assert!(!h.contains("upgrade: websocket"), "{h}");
}

#[tokio::test]
async fn upstream_answering_200_instead_of_101() {
    let (up, _) = raw_upstream(
        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        |mut s, _| async move {
            // anything the proxy sent after the request would show up here
            let mut b = [0u8; 64];
            if let Ok(n) = s.read(&mut b).await {
                if n > 0 {
                    let _ = s.write_all(b"LEAKED").await;
                }
            }
        },
    )
    .await;
    let t = common::start_with(&proxy_route(&[up], ""), |_| {});
    let s = TcpStream::connect(t.addrs[1]).await.unwrap();
    let e = tokio_tungstenite::client_async(format!("ws://{}/chat", t.addrs[1]), s).await;
    match e {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 200),
        other => panic!("expected the upstream's 200, got {other:?}"),
    }
    // raw: bytes after the head are not tunneled to the upstream
    let mut c = TcpStream::connect(t.addrs[1]).await.unwrap();
    c.write_all(format!("{WS_REQUEST}GARBAGE").as_bytes())
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(3), c.read_to_end(&mut out)).await;
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(!out.contains("LEAKED"), "{out}");
    assert!(!out.contains("101"), "{out}");
}

#[tokio::test]
async fn idle_tunnel_is_closed() {
    let (up, _) = raw_upstream(SWITCH, |mut s, _| async move {
        // holds the connection, says nothing
        let mut b = [0u8; 64];
        while let Ok(n) = s.read(&mut b).await {
            if n == 0 {
                return;
            }
        }
    })
    .await;
    let t = common::start_with(&proxy_route(&[up], "upgrade_idle_timeout = \"1s\""), |_| {});
    let mut c = TcpStream::connect(t.addrs[1]).await.unwrap();
    c.write_all(WS_REQUEST.as_bytes()).await.unwrap();
    let (head, _) = read_head(&mut c).await.unwrap();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let start = Instant::now();
    let mut b = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(10), c.read(&mut b))
        .await
        .expect("the idle tunnel was not closed")
        .unwrap_or(0);
    assert_eq!(n, 0);
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(6),
        "{took:?}"
    );
}

#[tokio::test]
async fn client_that_never_reads_does_not_hold_the_tunnel() {
    // the upstream writes as fast as it can; the client reads the 101 and nothing more
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<(u64, Duration)>();
    let done_tx = Arc::new(Mutex::new(Some(done_tx)));
    let (up, _) = raw_upstream(SWITCH, move |mut s, _| {
        let done_tx = done_tx.clone();
        async move {
            let start = Instant::now();
            let chunk = vec![b'x'; 64 * 1024];
            let mut sent = 0u64;
            while s.write_all(&chunk).await.is_ok() {
                sent += chunk.len() as u64;
            }
            if let Some(tx) = done_tx.lock().unwrap().take() {
                let _ = tx.send((sent, start.elapsed()));
            }
        }
    })
    .await;
    let t = common::start_with(&proxy_route(&[up], "upgrade_idle_timeout = \"1s\""), |_| {});
    let mut c = TcpStream::connect(t.addrs[1]).await.unwrap();
    c.write_all(WS_REQUEST.as_bytes()).await.unwrap();
    let (head, _) = read_head(&mut c).await.unwrap();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    // keep talking upstream-wards so that the tunnel is never idle, but never read
    let talker = tokio::spawn(async move {
        for _ in 0..100 {
            if c.write_all(b"ping").await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        c
    });
    let (sent, took) = tokio::time::timeout(Duration::from_secs(10), done_rx)
        .await
        .expect("the upstream's writes were never cut off")
        .unwrap();
    assert!(took < Duration::from_secs(8), "{took:?}");
    // what went to the stalled client is bounded by the socket buffers and one copy buffer
    assert!(sent < 64 * 1024 * 1024, "{sent}");
    talker.abort();
}

/// An HTTP/2 connection to qweb's TLS listener (ALPN h2).
async fn h2_connection(
    t: &common::TestServer,
) -> hyper::client::conn::http2::SendRequest<http_body_util::Empty<bytes::Bytes>> {
    let tls = t.tls(common::Proto::H2).await;
    let (sender, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    sender
}

fn extended_connect(protocol: &'static str) -> hyper::Request<http_body_util::Empty<bytes::Bytes>> {
    common::ws::extended_connect("https://localhost/chat", protocol)
}

#[tokio::test]
async fn websocket_over_http2_extended_connect_to_an_http1_upstream() {
    let echo = ws_echo().await;
    let t = common::start_with(&proxy_route(&[echo], ""), |_| {});
    let mut c = h2_connection(&t).await;
    let mut resp = c.send_request(extended_connect("websocket")).await.unwrap();
    assert_eq!(resp.status(), 200, "{resp:?}");
    assert!(!resp.headers().contains_key("sec-websocket-accept"));
    let stream = hyper::upgrade::on(&mut resp).await.unwrap();
    let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
        hyper_util::rt::TokioIo::new(stream),
        tokio_tungstenite::tungstenite::protocol::Role::Client,
        None,
    )
    .await;
    for i in 0..5 {
        ws.send(Message::text(format!("h2 {i}"))).await.unwrap();
        let m = tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(m.into_text().unwrap(), format!("h2 {i}"));
    }
    // the same connection still serves other streams
    let mut c2 = c.clone();
    let mut other = c2
        .send_request(extended_connect("websocket"))
        .await
        .unwrap();
    assert_eq!(other.status(), 200);
    drop(hyper::upgrade::on(&mut other));
    // a protocol the route does not allow, and a plain CONNECT
    let r = c.send_request(extended_connect("foo")).await.unwrap();
    assert_eq!(r.status(), 501);
    let plain = hyper::Request::builder()
        .method("CONNECT")
        .uri("localhost:443")
        .body(http_body_util::Empty::new())
        .unwrap();
    let r = c.send_request(plain).await.unwrap();
    assert_eq!(r.status(), 405);
}
