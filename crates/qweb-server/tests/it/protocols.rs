//! HTTP/1.1 and HTTP/2 over real TLS (ALPN), plain HTTP/1.1, TLS versions, keep-alive.

use qweb_testkit as common;

use common::{client, Proto, BOTH};

#[tokio::test]
async fn https_h1_and_h2_by_alpn() {
    let t = common::start();
    std::fs::write(t.site().join("index.html"), "hello").unwrap();
    for proto in BOTH {
        let c = client(&t.cert(), proto);
        let r = c.get(format!("{}/", t.https())).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let want = match proto {
            Proto::H1 => reqwest::Version::HTTP_11,
            Proto::H2 => reqwest::Version::HTTP_2,
        };
        assert_eq!(r.version(), want);
        assert_eq!(r.headers()["content-type"], "text/html");
        // written by the connection layers, once each (qweb_http::response::SERVER)
        assert_eq!(r.headers().get_all("server").iter().count(), 1, "{proto:?}");
        assert_eq!(r.headers()["server"], "qweb");
        assert_eq!(r.headers().get_all("date").iter().count(), 1, "{proto:?}");
        assert_eq!(r.headers()["content-length"], "5");
        assert_eq!(r.text().await.unwrap(), "hello");
    }
    let r = common::plain_client()
        .get(format!("{}/", t.http()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.version(), reqwest::Version::HTTP_11);
    assert_eq!(r.headers()["server"], "qweb");
    assert_eq!(r.text().await.unwrap(), "hello");
}

#[tokio::test]
async fn keep_alive_reuses_one_connection() {
    let t = common::start();
    std::fs::write(t.site().join("a.txt"), "a").unwrap();
    // 20 sequential requests on one raw connection: all answered on it.
    let mut req = Vec::new();
    for _ in 0..19 {
        req.extend_from_slice(b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n");
    }
    req.extend_from_slice(b"GET /a.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let out = common::raw_exchange(t.addrs[1], &req, std::time::Duration::from_secs(10)).await;
    let text = String::from_utf8_lossy(&out);
    assert_eq!(text.matches("HTTP/1.1 200 OK").count(), 20, "{text}");
}

#[tokio::test]
async fn tls12_and_tls13_both_work() {
    let t = common::start();
    std::fs::write(t.site().join("index.html"), "v").unwrap();
    for version in [&rustls::version::TLS12, &rustls::version::TLS13] {
        let cfg = common::tls::ClientTls::trusting(&t.cert())
            .versions(&[version])
            .arc();
        let mut tls = common::tls::connect(t.addrs[0], &cfg).await.unwrap();
        let (_, conn) = tls.get_ref();
        assert_eq!(conn.protocol_version(), Some(version.version));
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        tls.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        let _ = tls.read_to_end(&mut out).await;
        let text = String::from_utf8_lossy(&out);
        assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
        assert!(text.ends_with("\r\n\r\nv"), "{text}");
    }
}

#[tokio::test]
async fn tls10_and_tls11_are_refused() {
    // rustls cannot even offer TLS 1.0/1.1, so send a raw TLS 1.1-only ClientHello.
    let t = common::start();
    let hello = tls11_client_hello();
    let out = common::raw_exchange(t.addrs[0], &hello, std::time::Duration::from_secs(5)).await;
    // The answer is an alert record (content type 21), never a ServerHello (22).
    assert!(!out.is_empty(), "no answer");
    assert_eq!(out[0], 21, "{out:?}");
}

/// A minimal ClientHello whose highest version is TLS 1.1 (0x0302).
fn tls11_client_hello() -> Vec<u8> {
    let mut body = vec![0x03, 0x02];
    body.extend_from_slice(&[7u8; 32]); // random
    body.push(0); // session id
    body.extend_from_slice(&[0x00, 0x02, 0x00, 0x2f]); // TLS_RSA_WITH_AES_128_CBC_SHA
    body.extend_from_slice(&[0x01, 0x00]); // null compression
    let mut hs = vec![0x01];
    hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    hs.extend_from_slice(&body);
    let mut rec = vec![0x16, 0x03, 0x01];
    rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
    rec.extend_from_slice(&hs);
    rec
}

/// Small HTTP/2 answers asked for together leave in a few TLS records, not one record each
/// (issue 37: h2 chained every DATA frame over 256 bytes to the socket on its own, so the
/// 32 answers below were sealed as 32 or more records; h2o packs them).
#[tokio::test]
async fn small_http2_answers_asked_together_share_tls_records() {
    let t = common::start();
    std::fs::write(t.site().join("1k.txt"), vec![b'x'; 1024]).unwrap();
    let cfg = std::sync::Arc::new(common::tls_client_config(&t.cert(), Proto::H2));
    let (tls, counts) = common::records::connect(t.addrs[0], &cfg).await.unwrap();
    let send = common::h2client::handshake(tls).await;
    let (status, body, _) = common::h2client::get(&send, "/1k.txt", &[]).await;
    assert_eq!((status.as_u16(), body.len()), (200, 1024));
    let before = counts.application_data();
    const N: usize = 32;
    let answers = futures_util::future::join_all(
        (0..N).map(|_| common::h2client::get(&send, "/1k.txt", &[])),
    )
    .await;
    for (status, body, _) in answers {
        assert_eq!((status.as_u16(), body.len()), (200, 1024));
    }
    let records = counts.application_data() - before;
    assert!(
        records <= N / 4,
        "{N} answers of 1 KiB came in {records} TLS records"
    );
}
