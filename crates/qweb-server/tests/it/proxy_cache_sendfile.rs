//! Large cached bodies live in sealed memfds and go out with `sendfile(2)` on plain HTTP/1.1
//! (`qweb-cache`'s `memfd.rs`, `qweb-http`'s `h1::write`): the bytes a client gets must be the
//! stored ones on every transport, whole, as a range, to a client that reads slowly (partial
//! sends), and never the stored identity bytes where compression replaced the body.

use qweb_testkit as common;

use std::io::Read;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

use super::proxy_cache::{cached, origin, pattern};

const LEN: usize = 300_000;

/// Descriptors of this process (the server runs in it) that are qweb-cache memfds.
fn memfds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    std::fs::read_link(e.path())
                        .is_ok_and(|l| l.to_string_lossy().contains("memfd:qweb-cache"))
                })
                .count()
        })
        .unwrap_or(0)
}

/// One HTTP/1.1 request over plain TCP from a client with a small receive buffer that reads
/// in small steps with pauses (the server's sends stop short and wait): the answer, raw.
async fn slow_get(addr: std::net::SocketAddr, path: &str, extra: &str) -> Vec<u8> {
    let sock = TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut s = sock.connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 8192];
    let mut reads = 0;
    loop {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .expect("the answer stalled")
            .unwrap();
        if n == 0 {
            return got;
        }
        got.extend_from_slice(&buf[..n]);
        reads += 1;
        if reads % 8 == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// Splits a raw HTTP/1.1 answer into its head and body.
fn split(raw: &[u8]) -> (String, &[u8]) {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head");
    (
        String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase(),
        &raw[end + 4..],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_cached_body_is_the_stored_bytes_on_every_transport() {
    let up = origin().await;
    let t = cached(up.addr, "[compression]\nmin_size = 0\n");
    let path = format!("/pattern/{LEN}");
    let want = pattern(LEN);
    let before = memfds();
    // the miss fills the store
    let (head, body) = {
        let raw = slow_get(t.addrs[1], &path, "").await;
        let (h, b) = split(&raw);
        (h, b.to_vec())
    };
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(body == want, "the miss's body differs");
    assert_eq!(memfds(), before + 1, "the stored body is in a memfd");
    // hits over plain HTTP/1.1, read slowly: sent from the memfd in many partial sends
    for _ in 0..3 {
        let raw = slow_get(t.addrs[1], &path, "").await;
        let (head, body) = split(&raw);
        assert!(head.contains("cache-status: qweb; hit"), "{head}");
        assert!(body == want, "a hit's body differs ({} bytes)", body.len());
    }
    // a range of it: the slice of the mapping goes from the file at its offset
    let raw = slow_get(t.addrs[1], &path, "Range: bytes=1000-200999\r\n").await;
    let (head, body) = split(&raw);
    assert!(head.starts_with("http/1.1 206"), "{head}");
    assert!(body == &want[1000..201_000], "the range differs");
    // over TLS (HTTP/1.1 and HTTP/2): the same bytes, written as usual
    for proto in [common::Proto::H1, common::Proto::H2] {
        let c = common::client(&t.cert(), proto);
        let r = c.get(format!("{}{path}", t.https())).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert!(r.bytes().await.unwrap() == want, "{proto:?}");
    }
    // compressed on the way out: the gzip body, not the stored identity bytes
    let raw = slow_get(t.addrs[1], &path, "Accept-Encoding: gzip\r\n").await;
    let (head, body) = split(&raw);
    assert!(head.contains("content-encoding: gzip"), "{head}");
    let body = if head.contains("transfer-encoding: chunked") {
        dechunk(body)
    } else {
        body.to_vec()
    };
    let mut plain = Vec::new();
    flate2::read::GzDecoder::new(&body[..])
        .read_to_end(&mut plain)
        .unwrap();
    assert!(
        plain == want,
        "the gzip body does not decode to the stored one"
    );
    // (the https key is another entry: its first request was a miss)
    assert_eq!(up.count(&path), 2, "every other request was a hit");
    assert_eq!(
        memfds(),
        before + 2,
        "each stored body in a memfd of its own"
    );
}

/// The data of a chunked body.
fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("a size line");
        let size = usize::from_str_radix(
            std::str::from_utf8(&b[..line])
                .unwrap()
                .split(';')
                .next()
                .unwrap()
                .trim(),
            16,
        )
        .unwrap();
        b = &b[line + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
}
