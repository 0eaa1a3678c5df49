//! Limits that protect the server: header size, timeouts, connection cap, malformed input.

use qweb_testkit as common;

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const LIMITS: &str = "[limits]\nheader_read_timeout = \"400ms\"\nkeepalive_timeout = \"400ms\"\ntls_handshake_timeout = \"400ms\"\n";

/// Reads until the server closes; returns what it sent and how long it took.
async fn read_until_closed(s: &mut TcpStream) -> (Vec<u8>, Duration) {
    let start = Instant::now();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("the server did not close the connection")
        .ok();
    (out, start.elapsed())
}

#[tokio::test]
async fn oversized_header_is_431() {
    let t = common::start();
    std::fs::write(t.site().join("a"), "a").unwrap();
    let big = "x".repeat(20 * 1024);
    let req = format!("GET /a HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n");
    let out = common::raw_exchange(t.addrs[1], req.as_bytes(), Duration::from_secs(10)).await;
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 431"), "{text}");
    // a header under the limit is fine
    let ok = "x".repeat(8 * 1024);
    let req = format!("GET /a HTTP/1.1\r\nHost: x\r\nX-Big: {ok}\r\nConnection: close\r\n\r\n");
    let out = common::raw_exchange(t.addrs[1], req.as_bytes(), Duration::from_secs(10)).await;
    assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 200"));
}

#[tokio::test]
async fn oversized_header_on_h2_is_refused() {
    let t = common::start();
    let c = common::client(&t.cert(), common::Proto::H2);
    let big = "x".repeat(40 * 1024);
    let r = c
        .get(format!("{}/", t.https()))
        .header("x-big", big)
        .send()
        .await;
    match r {
        Ok(r) => assert_eq!(r.status(), 431),
        Err(e) => assert!(e.is_request(), "{e}"), // stream refused / reset
    }
    // the connection-level refusal does not break the server
    let r = c.get(format!("{}/", t.https())).send().await;
    assert!(r.is_ok());
}

#[tokio::test]
async fn malformed_requests_get_400_and_close() {
    let t = common::start();
    for bad in [
        &b"GARBAGE\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nHost: x\r\nBad Header Name: y\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
        b"GET /\x01\x02 HTTP/1.1\r\n\r\n",
        b"GET / HTTP/9.9\r\n\r\n",
    ] {
        let mut s = TcpStream::connect(t.addrs[1]).await.unwrap();
        s.write_all(bad).await.unwrap();
        let (out, _) = read_until_closed(&mut s).await;
        let text = String::from_utf8_lossy(&out);
        assert!(
            text.starts_with("HTTP/1.1 400") || text.starts_with("HTTP/1.1 505"),
            "{:?} -> {text}",
            String::from_utf8_lossy(bad)
        );
    }
}

#[tokio::test]
async fn slow_request_head_is_cut_off() {
    let t = common::start_with(LIMITS, |_| {});
    let mut s = TcpStream::connect(t.addrs[1]).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let (_, took) = read_until_closed(&mut s).await;
    assert!(
        took >= Duration::from_millis(300),
        "closed too early: {took:?}"
    );
}

#[tokio::test]
async fn idle_keepalive_connection_is_closed() {
    let t = common::start_with(LIMITS, |_| {});
    std::fs::write(t.site().join("a"), "a").unwrap();
    let mut s = TcpStream::connect(t.addrs[1]).await.unwrap();
    s.write_all(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let (out, took) = read_until_closed(&mut s).await;
    assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 200"));
    assert!(
        took >= Duration::from_millis(300),
        "closed too early: {took:?}"
    );
}

#[tokio::test]
async fn idle_h2_connection_gets_goaway() {
    let t = common::start_with(LIMITS, |_| {});
    std::fs::write(t.site().join("a"), "a").unwrap();
    // A raw h2 connection through TLS: after the request, the server closes it when idle.
    let tls = t.tls(common::Proto::H2).await;
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tls),
    )
    .await
    .unwrap();
    let driver = tokio::spawn(conn);
    let req = http::Request::get("https://localhost/a")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let r = send.send_request(req).await.unwrap();
    assert_eq!(r.status(), 200);
    drop(r);
    let ended = tokio::time::timeout(Duration::from_secs(10), driver).await;
    assert!(ended.is_ok(), "idle HTTP/2 connection was not closed");
}

#[tokio::test]
async fn stalled_tls_handshake_is_cut_off() {
    let t = common::start_with(LIMITS, |_| {});
    let mut s = TcpStream::connect(t.addrs[0]).await.unwrap();
    let (_, took) = read_until_closed(&mut s).await;
    assert!(
        took >= Duration::from_millis(300),
        "closed too early: {took:?}"
    );
}

#[tokio::test]
async fn connection_cap_queues_new_connections() {
    let t = common::start_with("[limits]\nmax_connections_per_worker = 2\n", |_| {});
    std::fs::write(t.site().join("a"), "a").unwrap();
    let req = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(t.addrs[1]).await.unwrap();
        s.write_all(req).await.unwrap();
        let mut buf = [0u8; 512];
        let n = s.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        held.push(s);
    }
    // A third connection is queued: TCP connects (backlog) but nobody answers...
    let mut third = TcpStream::connect(t.addrs[1]).await.unwrap();
    third.write_all(req).await.unwrap();
    let mut buf = [0u8; 512];
    let early = tokio::time::timeout(Duration::from_millis(500), third.read(&mut buf)).await;
    assert!(early.is_err(), "a third connection was served past the cap");
    // ...until one of the first two goes away.
    drop(held.pop());
    let n = tokio::time::timeout(Duration::from_secs(10), third.read(&mut buf))
        .await
        .expect("queued connection never served")
        .unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
}

#[tokio::test]
async fn garbage_never_takes_the_server_down() {
    let t = common::start();
    std::fs::write(t.site().join("a"), "alive").unwrap();
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for i in 0..60 {
        let len = (next() % 2048) as usize;
        let mut junk: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        if i % 3 == 0 {
            // plausible-looking prefixes reach deeper into the parsers
            let mut p = b"GET /a HTTP/1.1\r\nHost: x\r\n".to_vec();
            p.append(&mut junk);
            junk = p;
        }
        let addr = t.addrs[i % 2]; // TLS and plain listeners
        let _ = common::raw_exchange(addr, &junk, Duration::from_millis(200)).await;
    }
    // h2 preface then garbage frames over TLS
    let r = common::client(&t.cert(), common::Proto::H2)
        .get(format!("{}/a", t.https()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), "alive");
    let r = common::plain_client()
        .get(format!("{}/a", t.http()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), "alive");
}

/// Idle clients cannot pin the admin listener: one address holds at most
/// `connections_per_client` (8) connections (more are closed at once), and one that sends no
/// request head is closed at `header_timeout` (2 s); then /metrics answers again. (The
/// listener's eviction and many addresses: `admin_listener.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_admin_connections_are_bounded() {
    let t = common::start_with("[admin]\naddress = \"127.0.0.1:0\"\n", |_| {});
    let admin = t.admin.expect("admin listener");
    let mut held = Vec::new();
    let start = Instant::now();
    for _ in 0..8 {
        held.push(TcpStream::connect(admin).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // one more from the same address: closed at once
    let mut extra = TcpStream::connect(admin).await.unwrap();
    let mut b = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(1), extra.read(&mut b))
        .await
        .expect("the 9th admin connection of one address is closed at once");
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    // the held ones are closed at the head timeout
    for s in &mut held {
        let n = tokio::time::timeout(Duration::from_secs(15), s.read(&mut b))
            .await
            .expect("an idle admin connection outlived its head timeout");
        assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    }
    let held_for = start.elapsed();
    assert!(
        held_for >= Duration::from_millis(1500) && held_for < Duration::from_secs(6),
        "{held_for:?}"
    );
    // answers (with a strict-parsing scrape) after the rest
    common::metrics::scrape(admin).await;
}
