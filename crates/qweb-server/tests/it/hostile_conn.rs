//! Hostile round 3, item 5: a client that pipelines requests and never reads what it is sent.
//! Its answers fill its own receive buffer and wait in qweb's send queue; qweb must not take
//! such a connection for an idle keep-alive one (held for `keepalive_timeout`): the send
//! timeout runs while the kernel still holds bytes the client has not taken (`SIOCOUTQ`).

use qweb_testkit as common;

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

/// A pipelining client with a small receive buffer that sends `n` requests for `path`, reads
/// nothing, and returns its socket.
async fn pipeline_without_reading(
    addr: std::net::SocketAddr,
    path: &str,
    n: usize,
) -> tokio::net::TcpStream {
    let sock = TcpSocket::new_v4().unwrap();
    // a small window: the answers stay in qweb's send queue rather than in this socket
    sock.set_recv_buffer_size(4096).unwrap();
    let mut s = sock.connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
    let all = req.repeat(n);
    s.write_all(all.as_bytes()).await.unwrap();
    s
}

/// After `wait`, reads whatever the server sent: `true` when the connection then ends
/// (qweb closed it), `false` when it stays open past `grace`.
async fn closed_by_server<S: tokio::io::AsyncRead + Unpin>(
    s: &mut S,
    wait: Duration,
    grace: Duration,
) -> bool {
    tokio::time::sleep(wait).await;
    let mut buf = vec![0u8; 64 * 1024];
    let end = Instant::now() + grace;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelining_client_that_never_reads_is_cut_by_send_timeout_not_kept_alive() {
    let ts = common::start_with(
        "[limits]\nsend_timeout = \"2s\"\nkeepalive_timeout = \"120s\"\n",
        |d| {
            // larger than the file cache's limit is not needed: any answer counts
            std::fs::write(d.join("site/f.txt"), vec![b'x'; 8 * 1024]).unwrap();
        },
    );
    let plain = ts.addrs[1];
    // 100 answers of 8 KiB: 800 KiB, which the kernel's send buffer takes whole (writes
    // complete, so no write ever waits), while the client's 4 KiB window takes almost none.
    let mut s = pipeline_without_reading(plain, "/f.txt", 100).await;
    let started = Instant::now();
    let closed = closed_by_server(&mut s, Duration::from_secs(6), Duration::from_secs(4)).await;
    assert!(
        closed,
        "connection still open {:?} after the client stopped reading (send_timeout 2s, keepalive 120s)",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reads_its_answers_late_but_within_send_timeout_keeps_its_connection() {
    let ts = common::start_with(
        "[limits]\nsend_timeout = \"5s\"\nkeepalive_timeout = \"120s\"\n",
        |d| {
            std::fs::write(d.join("site/f.txt"), vec![b'x'; 8 * 1024]).unwrap();
        },
    );
    let plain = ts.addrs[1];
    // the length of one answer, from another connection
    let mut one = tokio::net::TcpStream::connect(plain).await.unwrap();
    one.write_all(b"GET /f.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut whole = Vec::new();
    one.read_to_end(&mut whole).await.unwrap();
    let len = whole.len() - "Connection: close\r\n".len();
    let mut s = pipeline_without_reading(plain, "/f.txt", 20).await;
    // reads after 1 s (well within send_timeout): everything arrives, the connection stays
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut got = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    while got < 20 * len {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .expect("answers arrive")
            .unwrap();
        assert!(n > 0, "closed early after {got} bytes");
        got += n;
    }
    // and it still serves a request afterwards
    s.write_all(b"GET /f.txt HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("answer")
        .unwrap();
    assert!(
        n > 0 && buf.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        &buf[..n.min(40)]
    );
}

/// The HTTP/2 sibling: a client that sends ten requests on one connection and reads nothing.
/// Their answers (4 KiB each, within its flow-control windows) all leave hyper, so nothing is
/// in flight and the connection looks idle; but the client's small receive buffer took
/// almost none of them and the rest waits in qweb's send queue. It is closed once that queue
/// has not shrunk for `send_timeout`, not kept to `keepalive_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_client_that_never_reads_its_answers_is_cut_by_send_timeout_not_kept_alive() {
    use common::h2frames::{get, hello};
    let ts = common::start_with(
        "[limits]\nsend_timeout = \"2s\"\nkeepalive_timeout = \"120s\"\n",
        |d| {
            std::fs::write(d.join("site/f.txt"), vec![b'x'; 4 * 1024]).unwrap();
        },
    );
    let sock = TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let tcp = sock.connect(ts.addrs[0]).await.unwrap();
    let cfg = common::tls_client_config(&ts.cert(), common::Proto::H2);
    let mut s = tokio_rustls::TlsConnector::from(std::sync::Arc::new(cfg))
        .connect(
            rustls::pki_types::ServerName::try_from("localhost").unwrap(),
            tcp,
        )
        .await
        .unwrap();
    let mut out = hello(&[]);
    for i in 0..10 {
        out.extend(get(2 * i + 1, "/f.txt"));
    }
    s.write_all(&out).await.unwrap();
    s.flush().await.unwrap();
    let started = Instant::now();
    let closed = closed_by_server(&mut s, Duration::from_secs(6), Duration::from_secs(4)).await;
    assert!(
        closed,
        "HTTP/2 connection still open {:?} after the client stopped reading (send_timeout 2s, \
         keepalive 120s)",
        started.elapsed()
    );
}

/// The TLS sibling of `exhaustion.rs`'s `h1_clients_that_never_read_are_cut_by_send_timeout`
/// (plain TCP): a client with a small window asks for 4 MiB and reads nothing. The answer
/// stalls in the socket and in rustls' buffer; the connection is cut at `send_timeout`, not
/// kept once the client reads at last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_client_that_never_reads_a_large_answer_is_cut_by_send_timeout() {
    let ts = common::start_with(
        "[limits]\nsend_timeout = \"2s\"\nkeepalive_timeout = \"120s\"\n",
        |d| std::fs::write(d.join("site/big.bin"), vec![b'x'; 4 << 20]).unwrap(),
    );
    let sock = TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let tcp = sock.connect(ts.addrs[0]).await.unwrap();
    let cfg = std::sync::Arc::new(common::tls_client_config(&ts.cert(), common::Proto::H1));
    let mut s = tokio_rustls::TlsConnector::from(cfg)
        .connect(common::tls::localhost(), tcp)
        .await
        .unwrap();
    s.write_all(b"GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    s.flush().await.unwrap();
    let started = Instant::now();
    let closed = closed_by_server(&mut s, Duration::from_secs(6), Duration::from_secs(10)).await;
    assert!(
        closed,
        "connection still open {:?} after the client stopped reading (send_timeout 2s)",
        started.elapsed()
    );
}

/// The sibling that must not be cut: an HTTP/2 client that asks for a small file every 4 ms
/// and reads each answer keeps its one connection past several `send_timeout`s. Its answers
/// are always briefly unacknowledged (the client's delayed ACK rides on its next request), so
/// the send queue is rarely empty when looked at; the check must see that the client keeps
/// taking what it is sent (each answer read, new requests coming). Before the fix the loop
/// took such a connection for a stalled one and closed it every `send_timeout` (the soak's
/// normal clients saw `UnexpectedEof` when a request raced the close).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_client_that_reads_every_answer_keeps_its_connection_past_send_timeout() {
    let ts = common::start_with(
        "[limits]\nsend_timeout = \"1s\"\nkeepalive_timeout = \"120s\"\n",
        |d| std::fs::write(d.join("site/f.txt"), vec![b'x'; 1024]).unwrap(),
    );
    let tls = ts.tls(common::Proto::H2).await;
    let (client, conn) = h2::client::handshake(tls).await.unwrap();
    let ended = tokio::spawn(conn);
    let started = Instant::now();
    let mut n = 0;
    while started.elapsed() < Duration::from_secs(6) {
        let req = http::Request::get("https://localhost/f.txt")
            .body(())
            .unwrap();
        let mut ready = match client.clone().ready().await {
            Ok(r) => r,
            Err(e) => panic!(
                "connection ended after {n} requests, {:?}: {e}",
                started.elapsed()
            ),
        };
        let (resp, _) = ready.send_request(req, true).unwrap();
        let resp = match tokio::time::timeout(Duration::from_secs(5), resp).await {
            Ok(Ok(r)) => r,
            other => panic!(
                "request {n} failed after {:?}: {other:?}",
                started.elapsed()
            ),
        };
        assert_eq!(resp.status(), 200);
        let mut body = resp.into_body();
        let mut got = 0;
        while let Some(d) = body.data().await {
            let d = d.unwrap();
            let _ = body.flow_control().release_capacity(d.len());
            got += d.len();
        }
        assert_eq!(got, 1024, "request {n}");
        n += 1;
        tokio::time::sleep(Duration::from_millis(4)).await;
    }
    assert!(n > 300, "{n} requests");
    assert!(!ended.is_finished(), "the connection ended");
}
