//! Idle HTTP/1 keep-alive connections are parked between requests (hyper's buffers freed, see
//! `src/idle.rs`): nothing of an exchange may be lost, replayed or reordered across a park, and
//! every timeout still fires. Real sockets, real TLS (tokio-rustls), raw HTTP/1.1 bytes.

use qweb_testkit as common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

const LIMITS: &str = "[limits]\nkeepalive_timeout = \"1500ms\"\nheader_read_timeout = \"1s\"\n";

/// Long enough for the server to park the connection (at once after its first request, after
/// 10 ms idle once it has served more).
const IDLE: Duration = Duration::from_millis(150);

async fn tls(t: &common::TestServer) -> common::tls::TlsStream {
    let config = Arc::new(common::tls_client_config(&t.cert(), common::Proto::H1));
    common::tls::connect(t.addrs[0], &config).await.unwrap()
}

/// Reads until `n` complete responses (heads ending the `Content-Length` bodies) arrived, or
/// the connection closed, or `within` passed; returns the bytes.
async fn read_responses<S: AsyncRead + Unpin>(s: &mut S, n: usize, within: Duration) -> String {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + within;
    let mut buf = [0u8; 4096];
    while count_responses(&out) < n {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
            Ok(Ok(k)) => out.extend_from_slice(&buf[..k]),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Complete responses in `text` (each with a `content-length` body).
fn count_responses(bytes: &[u8]) -> usize {
    let text = String::from_utf8_lossy(bytes);
    let mut rest: &str = &text;
    let mut n = 0;
    while let Some(end) = rest.find("\r\n\r\n") {
        let head = &rest[..end];
        let len: usize = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().ok())?
            })
            .unwrap_or(0);
        if rest.len() < end + 4 + len {
            break;
        }
        rest = &rest[end + 4 + len..];
        n += 1;
    }
    n
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n")
}

fn site(t: &common::TestServer) {
    for (name, body) in [("a", "AAAA"), ("b", "BBBB"), ("c", "CCCC"), ("d", "DDDD")] {
        std::fs::write(t.site().join(name), body).unwrap();
    }
    std::fs::write(t.site().join("secret"), "SECRET").unwrap();
}

/// Requests pipelined into an idle connection, a head split across an idle spell, requests
/// after several idle spells: every one answered once, in order, over TLS and plain TCP.
#[tokio::test]
async fn pipelined_and_split_requests_across_idle_spells() {
    let t = common::start_with(LIMITS, |_| {});
    site(&t);
    async fn exercise<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S) {
        s.write_all(get("/a").as_bytes()).await.unwrap();
        let r = read_responses(s, 1, Duration::from_secs(5)).await;
        assert!(r.starts_with("HTTP/1.1 200") && r.ends_with("AAAA"), "{r}");
        tokio::time::sleep(IDLE).await;
        // two whole requests and half a third in one write, the rest after a pause
        let d = get("/d");
        let (d1, d2) = d.split_at(10);
        let burst = format!("{}{}{d1}", get("/b"), get("/c"));
        s.write_all(burst.as_bytes()).await.unwrap();
        tokio::time::sleep(IDLE).await;
        s.write_all(d2.as_bytes()).await.unwrap();
        let r = read_responses(s, 3, Duration::from_secs(5)).await;
        let order: Vec<usize> = ["BBBB", "CCCC", "DDDD"]
            .iter()
            .map(|b| r.find(b).unwrap_or_else(|| panic!("no {b} in {r}")))
            .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{r}");
        assert_eq!(r.matches("HTTP/1.1 200").count(), 3, "{r}");
        for _ in 0..3 {
            tokio::time::sleep(IDLE).await;
            s.write_all(get("/a").as_bytes()).await.unwrap();
            let r = read_responses(s, 1, Duration::from_secs(5)).await;
            assert!(r.ends_with("AAAA"), "{r}");
        }
    }
    let mut s = tls(&t).await;
    exercise(&mut s).await;
    let mut p = TcpStream::connect(t.addrs[1]).await.unwrap();
    exercise(&mut p).await;
}

/// A request body that looks like a request is never served as one, whether it arrives with
/// its head or after the response (while hyper drains it): the connection is not parked while
/// hyper may still hold or drain a body.
#[tokio::test]
async fn a_body_is_never_parsed_as_a_request() {
    let t = common::start_with(LIMITS, |_| {});
    site(&t);
    let smuggled = get("/secret");
    for method in ["POST", "GET"] {
        for late_body in [false, true] {
            let mut s = tls(&t).await;
            let head = format!(
                "{method} /a HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n",
                smuggled.len()
            );
            let mut all = String::new();
            if late_body {
                s.write_all(head.as_bytes()).await.unwrap();
                // the response may come before the body (the route does not read it)
                all += &read_responses(&mut s, 1, Duration::from_millis(700)).await;
                tokio::time::sleep(IDLE).await;
                s.write_all(smuggled.as_bytes()).await.unwrap();
            } else {
                s.write_all(format!("{head}{smuggled}").as_bytes())
                    .await
                    .unwrap();
            }
            all += &read_responses(&mut s, 1, Duration::from_millis(700)).await;
            tokio::time::sleep(IDLE).await;
            let _ = s.write_all(get("/b").as_bytes()).await;
            all += &read_responses(&mut s, 3, Duration::from_secs(2)).await;
            assert!(
                !all.contains("SECRET"),
                "{method}, late body {late_body}: the body was served: {all}"
            );
            assert!(
                all.matches("HTTP/1.1 ").count() <= 2,
                "{method}, late body {late_body}: one request too many answered: {all}"
            );
        }
    }
}

/// A parked connection still closes at `keepalive_timeout` (measured from its last
/// response), over TLS and plain TCP, also after several requests.
#[tokio::test]
async fn parked_connections_close_at_the_keepalive_timeout() {
    let t = common::start_with(LIMITS, |_| {});
    site(&t);
    async fn check<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S) {
        for _ in 0..2 {
            s.write_all(get("/a").as_bytes()).await.unwrap();
            let r = read_responses(s, 1, Duration::from_secs(5)).await;
            assert!(r.ends_with("AAAA"), "{r}");
            tokio::time::sleep(IDLE).await;
        }
        let since = Instant::now();
        let mut b = [0u8; 64];
        let r = tokio::time::timeout(Duration::from_secs(10), s.read(&mut b)).await;
        let took = since.elapsed() + IDLE;
        assert!(matches!(r, Ok(Ok(0)) | Ok(Err(_))), "not closed: {r:?}");
        assert!(
            took >= Duration::from_millis(1300) && took < Duration::from_secs(6),
            "closed after {took:?}"
        );
    }
    let mut s = tls(&t).await;
    check(&mut s).await;
    let mut p = TcpStream::connect(t.addrs[1]).await.unwrap();
    check(&mut p).await;
}

/// A request head started on a parked connection and never finished is cut at
/// `header_read_timeout`, not at the (longer) keep-alive timeout.
#[tokio::test]
async fn a_head_started_after_an_idle_spell_is_timed() {
    let t = common::start_with(
        "[limits]\nkeepalive_timeout = \"20s\"\nheader_read_timeout = \"700ms\"\n",
        |_| {},
    );
    site(&t);
    let mut s = tls(&t).await;
    s.write_all(get("/a").as_bytes()).await.unwrap();
    let r = read_responses(&mut s, 1, Duration::from_secs(5)).await;
    assert!(r.ends_with("AAAA"), "{r}");
    tokio::time::sleep(IDLE).await;
    s.write_all(b"GET /b HTTP/1.1\r\nHo").await.unwrap();
    s.flush().await.unwrap();
    let since = Instant::now();
    let mut b = [0u8; 64];
    let r = tokio::time::timeout(Duration::from_secs(10), s.read(&mut b)).await;
    let took = since.elapsed();
    assert!(matches!(r, Ok(Ok(0)) | Ok(Err(_))), "not closed: {r:?}");
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_secs(5),
        "closed after {took:?}"
    );
}

/// A client that closes (close_notify) or vanishes while its connection is parked frees
/// it: the server's open-connection count goes back down.
#[tokio::test]
async fn parked_connections_of_clients_that_leave_are_freed() {
    let t = common::start_with(
        &format!("{LIMITS}[admin]\naddress = \"127.0.0.1:0\"\n"),
        |_| {},
    );
    site(&t);
    let admin = t.admin.unwrap();
    let open = || async move {
        common::metrics::scrape(admin)
            .await
            .sum("qweb_connections_open", &[])
    };
    let mut clients = Vec::new();
    for _ in 0..6 {
        let mut s = tls(&t).await;
        s.write_all(get("/a").as_bytes()).await.unwrap();
        let r = read_responses(&mut s, 1, Duration::from_secs(5)).await;
        assert!(r.ends_with("AAAA"), "{r}");
        clients.push(s);
    }
    tokio::time::sleep(IDLE).await;
    assert!(open().await >= 6.0);
    for (i, mut s) in clients.into_iter().enumerate() {
        if i % 2 == 0 {
            s.shutdown().await.unwrap(); // close_notify
        }
        drop(s);
    }
    let deadline = Instant::now() + Duration::from_secs(1);
    while open().await >= 1.0 {
        assert!(
            Instant::now() < deadline,
            "parked connections outlive their clients"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A reload retires the old generation: its idle (parked) connections and a connection with a
/// head half sent are closed once the old `shutdown_timeout` passes, though their own
/// timeouts are much longer. (The test's listeners are on port 0, so the new generation
/// listens elsewhere: its own connections are `tests/reload.rs`'s subject.)
#[tokio::test]
async fn a_retired_generations_connections_are_closed_at_its_deadline() {
    let limits = "shutdown_timeout = \"1s\"\n[limits]\nkeepalive_timeout = \"60s\"\nheader_read_timeout = \"60s\"\n";
    let mut t = common::start_with(limits, |_| {});
    site(&t);
    let mut idle = TcpStream::connect(t.addrs[1]).await.unwrap();
    for _ in 0..2 {
        idle.write_all(get("/a").as_bytes()).await.unwrap();
        let r = read_responses(&mut idle, 1, Duration::from_secs(5)).await;
        assert!(r.ends_with("AAAA"), "{r}");
    }
    let mut half = tls(&t).await;
    half.write_all(b"GET /a HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    half.flush().await.unwrap();
    tokio::time::sleep(IDLE).await;
    t.server
        .as_mut()
        .unwrap()
        .reload_from(None)
        .expect("reload");
    let since = Instant::now();
    // (the first to close is read first; the other is then already closed or closes soon)
    let mut b = [0u8; 64];
    let r = tokio::time::timeout(Duration::from_secs(10), idle.read(&mut b)).await;
    let took = since.elapsed();
    assert!(
        matches!(r, Ok(Ok(0)) | Ok(Err(_))),
        "idle: not closed: {r:?}"
    );
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(5),
        "idle: closed after {took:?}"
    );
    let r = tokio::time::timeout(Duration::from_secs(10), half.read(&mut b)).await;
    let took = since.elapsed();
    assert!(
        matches!(r, Ok(Ok(0)) | Ok(Err(_))),
        "half head: not closed: {r:?}"
    );
    assert!(
        took < Duration::from_secs(5),
        "half head: closed after {took:?}"
    );
}
