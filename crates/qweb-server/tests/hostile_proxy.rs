//! Hostile round 3, proxy side: an upstream certificate pinned as its own CA (made by the real
//! `openssl req -x509`), hostile upstreams and clients around the proxy's edges.

use qweb_testkit as common;

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// Everything qweb logs in this test binary.
fn logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let b = buf.clone();
        let _ = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || Capture(b.clone()))
            .try_init();
        buf
    })
}

fn log_text() -> String {
    String::from_utf8_lossy(&logs().lock().unwrap()).into_owned()
}

struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

// ---- item 11: an upstream certificate pinned as its own CA --------------------------------

/// A self-signed certificate made the most common way, `openssl req -x509` (CA:TRUE, basic
/// constraints critical), for `DNS:san`: (cert PEM, key PEM).
fn openssl_selfsigned(dir: &Path, tag: &str, san: &str) -> (String, String) {
    let (c, k) = (
        dir.join(format!("{tag}.crt")),
        dir.join(format!("{tag}.key")),
    );
    let out = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec"])
        .args(["-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"])
        .arg("-keyout")
        .arg(&k)
        .arg("-out")
        .arg(&c)
        .args(["-days", "30", "-subj", "/CN=localhost"])
        .arg("-addext")
        .arg(format!("subjectAltName=DNS:{san}"))
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-text", "-in"])
        .arg(&c)
        .output()
        .expect("openssl x509");
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("CA:TRUE"),
        "openssl req -x509 makes a CA certificate"
    );
    (
        std::fs::read_to_string(&c).unwrap(),
        std::fs::read_to_string(&k).unwrap(),
    )
}

/// A self-signed CA:TRUE certificate for `localhost` that expired yesterday (openssl 3.0's
/// `req` cannot back-date, so rcgen makes it).
fn expired_selfsigned() -> (String, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let mut p = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.not_before = rcgen::date_time_ymd(2020, 1, 1);
    p.not_after = rcgen::date_time_ymd(2021, 1, 1);
    let key = KeyPair::generate().unwrap();
    let cert = p.self_signed(&key).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// An HTTPS upstream (tokio-rustls + hyper) presenting `cert_pem`, answering `tls-up:<path>`.
async fn tls_upstream(cert_pem: &str, key_pem: &str) -> SocketAddr {
    common::install_provider();
    let dir = tempfile::tempdir().unwrap();
    let (c, k) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
    std::fs::write(&c, cert_pem).unwrap();
    std::fs::write(&k, key_pem).unwrap();
    let certs = qweb_tls::load_certs(&c).unwrap();
    let key = qweb_tls::load_private_key(&k).unwrap();
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(qweb_tls::provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(s).await else {
                    return;
                };
                let svc = hyper::service::service_fn(|req: hyper::Request<_>| async move {
                    let body = format!("tls-up:{}", req.uri().path());
                    Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from(body))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    addr
}

/// qweb proxying `/` to `up` with `upstream_ca` = `pinned_pem` and the server name
/// `localhost`.
fn pinned_route(up: SocketAddr, pinned_pem: &str) -> common::TestServer {
    let pinned = pinned_pem.to_owned();
    common::start_with(
        &format!(
            "[[route]]\nprefix = \"/\"\nupstreams = [\"https://{up}\"]\n\
             upstream_ca = \"{{dir}}/up.crt\"\nupstream_server_name = \"localhost\"\n"
        ),
        move |d| std::fs::write(d.join("up.crt"), pinned).unwrap(),
    )
}

async fn get(t: &common::TestServer, path: &str) -> (u16, String) {
    let r = common::plain_client()
        .get(format!("{}{path}", t.http()))
        .send()
        .await
        .unwrap();
    let s = r.status().as_u16();
    (s, r.text().await.unwrap())
}

#[tokio::test]
async fn a_selfsigned_upstream_certificate_pinned_as_its_own_ca_is_accepted() {
    logs();
    let dir = tempfile::tempdir().unwrap();
    let (c, k) = openssl_selfsigned(dir.path(), "up", "localhost");
    let up = tls_upstream(&c, &k).await;
    let t = pinned_route(up, &c);
    let (s, body) = get(&t, "/pinned").await;
    assert_eq!(
        (s, body.as_str()),
        (200, "tls-up:/pinned"),
        "{}",
        log_text()
    );
}

#[tokio::test]
async fn a_pinned_selfsigned_certificate_is_still_checked_for_name_expiry_and_identity() {
    logs();
    let dir = tempfile::tempdir().unwrap();
    // expired, pinned and presented
    let (c, k) = expired_selfsigned();
    let expired = tls_upstream(&c, &k).await;
    let t = pinned_route(expired, &c);
    assert_eq!(get(&t, "/expired").await.0, 502, "an expired pin");
    drop(t);
    // for another name, pinned and presented
    let (c, k) = openssl_selfsigned(dir.path(), "other", "other.test");
    let wrong_name = tls_upstream(&c, &k).await;
    let t = pinned_route(wrong_name, &c);
    assert_eq!(get(&t, "/name").await.0, 502, "a pin for another name");
    drop(t);
    // the upstream presents a different self-signed certificate than the one pinned
    let (pinned, _) = openssl_selfsigned(dir.path(), "a", "localhost");
    let (c, k) = openssl_selfsigned(dir.path(), "b", "localhost");
    let impostor = tls_upstream(&c, &k).await;
    let t = pinned_route(impostor, &pinned);
    assert_eq!(
        get(&t, "/impostor").await.0,
        502,
        "another self-signed cert"
    );
    let logged = log_text();
    for why in [
        "certificate expired",
        "certificate not valid for name \"localhost\"",
        // not an anchor: webpki's verdict stands
        "CaUsedAsEndEntity",
    ] {
        assert!(logged.contains(why), "{why}: {logged}");
    }
}

// ---- item 10 d: a route whose upstreams are all down ---------------------------------------

/// An address nothing listens on (bound, then closed: connection refused).
async fn dead_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap()
}

#[tokio::test]
async fn a_route_with_every_upstream_down_warns_once_a_second_not_once_a_request() {
    logs();
    let ups: Vec<String> = [dead_addr().await, dead_addr().await, dead_addr().await]
        .iter()
        .map(|a| format!("\"http://{a}\""))
        .collect();
    let t = common::start_with(
        &format!(
            "[[route]]\nprefix = \"/\"\nupstreams = [{}]\nfail_timeout = \"60s\"\n",
            ups.join(", ")
        ),
        |_| {},
    );
    for i in 0..30 {
        assert_eq!(get(&t, &format!("/down{i}")).await.0, 502);
    }
    let lines = log_text()
        .lines()
        .filter(|l| l.contains("all upstreams of the route are down") && l.contains("upstreams=3"))
        .count();
    // the first request marks the three down; the 29 after it find them all down
    assert!((1..=2).contains(&lines), "{lines} lines: {}", log_text());
}

// ---- item 10 c: an extended CONNECT the upstream answers 200 ------------------------------

/// An HTTP/2 connection to qweb's TLS listener (ALPN h2).
async fn h2_connection(
    t: &common::TestServer,
) -> hyper::client::conn::http2::SendRequest<http_body_util::Empty<Bytes>> {
    common::install_provider();
    let cfg = common::tls_client_config(&t.cert(), common::Proto::H2);
    let tcp = tokio::net::TcpStream::connect(t.addrs[0]).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect("localhost".try_into().unwrap(), tcp)
        .await
        .unwrap();
    let (sender, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .handshake(TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    sender
}

#[tokio::test]
async fn an_extended_connect_the_upstream_answers_200_is_a_502_not_a_reset() {
    logs();
    // the recording upstream answers every request 200 `up:<target>`, an upgrade too
    let up = common::recorder::start().await;
    let t = common::start_with(
        &format!(
            "[[route]]\nprefix = \"/\"\nupstreams = [\"http://{}\"]\n",
            up.addr
        ),
        |_| {},
    );
    let mut c = h2_connection(&t).await;
    let mut req = hyper::Request::builder()
        .method("CONNECT")
        .uri("https://localhost/chat")
        .header("sec-websocket-version", "13")
        .body(http_body_util::Empty::new())
        .unwrap();
    req.extensions_mut()
        .insert(hyper::ext::Protocol::from_static("websocket"));
    let resp = c.send_request(req).await;
    let resp = resp.unwrap_or_else(|e| panic!("the stream was reset: {e:?}"));
    assert_eq!(resp.status(), 502);
    let got = up.take();
    assert_eq!(got.len(), 1, "the upgrade request reached the upstream");
    assert_eq!(got[0].header("upgrade").as_deref(), Some("websocket"));
}

// ---- item 10 b: a hostile h2c upstream -----------------------------------------------------

/// What the hostile HTTP/2 upstream does after a 200 head and 5 body bytes.
#[derive(Clone, Copy)]
enum Hostile {
    /// GOAWAY (INTERNAL_ERROR) and close, mid-response.
    GoAway,
    /// 1 MB of trailers.
    HugeTrailers,
}

/// An h2c upstream (the `h2` crate's server) that sends a head and `hello`, then misbehaves
/// once `go` is notified (the client has the head: the response is under way).
async fn hostile_h2c(how: Hostile, go: Arc<tokio::sync::Notify>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let go = go.clone();
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(s).await else {
                    return;
                };
                while let Some(Ok((_req, mut respond))) = conn.accept().await {
                    let head = http::Response::builder().status(200).body(()).unwrap();
                    let mut send = respond.send_response(head, false).unwrap();
                    send.send_data(Bytes::from_static(b"hello"), false).unwrap();
                    // keep the connection going (flushing) until the client has the head
                    let flushed = async { while let Some(Ok(_)) = conn.accept().await {} };
                    tokio::select! {
                        _ = go.notified() => {}
                        _ = flushed => return,
                    }
                    match how {
                        Hostile::GoAway => {
                            conn.abrupt_shutdown(h2::Reason::INTERNAL_ERROR);
                        }
                        Hostile::HugeTrailers => {
                            let mut t = http::HeaderMap::new();
                            let v = http::HeaderValue::from_str(&"t".repeat(1000)).unwrap();
                            for i in 0..1024 {
                                let name = http::HeaderName::try_from(format!("x-t{i}")).unwrap();
                                t.insert(name, v.clone());
                            }
                            let _ = send.send_trailers(t);
                        }
                    }
                }
                // drive the connection until it is over (the GOAWAY, the trailers flushed)
                std::future::poll_fn(|cx| conn.poll_closed(cx)).await.ok();
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_hostile_h2c_upstream_gives_an_aborted_response_not_a_clean_one() {
    logs();
    for proto in common::BOTH {
        for (how, name) in [
            (Hostile::GoAway, "h2-goaway"),
            (Hostile::HugeTrailers, "h2-trailers"),
        ] {
            let path = format!("/{name}-{proto:?}");
            let go = Arc::new(tokio::sync::Notify::new());
            let up = hostile_h2c(how, go.clone()).await;
            let t = common::start_with(
                &format!("[[route]]\nprefix = \"/\"\nupstreams = [\"h2c://{up}\"]\n"),
                |_| {},
            );
            let (client, base) = match proto {
                common::Proto::H1 => (common::plain_client(), t.http()),
                common::Proto::H2 => (common::client(&t.cert(), proto), t.https()),
            };
            let r = client
                .get(format!("{base}{path}"))
                .send()
                .await
                .unwrap_or_else(|e| panic!("{path}: {e}"));
            assert_eq!(r.status(), 200);
            go.notify_one();
            // the client must not take it for a whole response
            let whole = r.text().await.ok();
            assert_eq!(whole, None, "{path}: a clean response");
            // the access line is written when the response is dropped
            let line = wait_for_log(&format!("\"GET {path} ")).await;
            assert!(line.ends_with(" aborted"), "{path}: {line}");
        }
    }
}

/// The first log line that contains `needle`, waiting for it up to 10 s.
async fn wait_for_log(needle: &str) -> String {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if let Some(l) = log_text().lines().find(|l| l.contains(needle)) {
            return l.to_owned();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no log line with {needle}: {}",
            log_text()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

// ---- item 10 a: tunnels logged when they end -----------------------------------------------

/// `(status, bytes to the client, ms, received)` of an access line in qweb's format.
fn tunnel_fields(line: &str) -> (u16, u64, f64, Option<u64>) {
    let tail = line.rsplit_once("\" ").map_or("", |(_, t)| t);
    let mut f = tail.split(' ');
    let status = f.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    let bytes = f.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    let ms = f
        .next()
        .and_then(|s| s.strip_suffix("ms"))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.0);
    let received = f
        .find_map(|s| s.strip_prefix("received="))
        .and_then(|s| s.parse().ok());
    (status, bytes, ms, received)
}

#[tokio::test]
async fn websocket_tunnels_are_logged_when_they_end_with_bytes_both_ways() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    logs();
    let echo = common::ws::ws_echo().await;
    let t = common::start_with(
        &format!("[[route]]\nprefix = \"/\"\nupstreams = [\"{echo}\"]\n"),
        |_| {},
    );
    // HTTP/1.1 upgrade
    let s = tokio::net::TcpStream::connect(t.addrs[1]).await.unwrap();
    let (mut ws, _) = tokio_tungstenite::client_async(format!("ws://{}/ws-log", t.addrs[1]), s)
        .await
        .unwrap();
    for i in 0..3 {
        ws.send(Message::text(format!("hello {i}"))).await.unwrap();
        ws.next().await.unwrap().unwrap();
    }
    // the tunnel stays open a while: its line must say how long it lived
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    ws.close(None).await.unwrap();
    while let Some(Ok(_)) = ws.next().await {}
    drop(ws);
    let line = wait_for_log("\"GET /ws-log HTTP/1.1\"").await;
    let (status, to_client, ms, received) = tunnel_fields(&line);
    assert_eq!(status, 101, "{line}");
    // three echoes and a close frame each way (the client's frames are masked: 4 more each)
    assert!(to_client >= 3 * 9, "{line}");
    assert!(received.is_some_and(|r| r >= 3 * 13 + 6), "{line}");
    assert!(ms >= 300.0, "{line}");

    // HTTP/2 extended CONNECT
    let mut c = h2_connection(&t).await;
    let mut ws = common::ws::h2_websocket(&mut c, "https://localhost/ws-h2-log").await;
    ws.send(Message::text("over h2")).await.unwrap();
    ws.next().await.unwrap().unwrap();
    ws.close(None).await.unwrap();
    while let Some(Ok(_)) = ws.next().await {}
    drop(ws);
    let line = wait_for_log("\"CONNECT /ws-h2-log ").await;
    let (status, to_client, _, received) = tunnel_fields(&line);
    assert_eq!(status, 200, "{line}");
    assert!(to_client >= 9, "{line}");
    assert!(received.is_some_and(|r| r >= 13), "{line}");
}

// ---- item 10 e: a malformed request body -----------------------------------------------------

/// Streamed, the head and the good part of the body are already upstream when the bad chunk
/// arrives: the upstream's request is cut (never complete), the client gets 400. With
/// `buffer_request_body`, nothing reaches the upstream.
#[tokio::test]
async fn a_malformed_chunked_body_is_a_400_and_never_a_complete_upstream_request() {
    logs();
    for buffered in [false, true] {
        let up = common::recorder::start().await;
        let extra = if buffered {
            "max_body_size = \"64KiB\"\nbuffer_request_body = true\n"
        } else {
            ""
        };
        let t = common::start_with(
            &format!(
                "[[route]]\nprefix = \"/\"\nupstreams = [\"http://{}\"]\n{extra}",
                up.addr
            ),
            |_| {},
        );
        let out = common::raw_exchange(
            t.addrs[1],
            b"POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
              5\r\nhello\r\nZZ\r\nmore\r\n0\r\n\r\n",
            std::time::Duration::from_secs(10),
        )
        .await;
        let out = String::from_utf8_lossy(&out);
        assert!(
            out.starts_with("HTTP/1.1 400 "),
            "buffered {buffered}: {out}"
        );
        // the upstream's side ends when qweb cuts it; wait for the recorder to see that
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        let got = loop {
            let got = up.take();
            if !got.is_empty() || buffered || tokio::time::Instant::now() > deadline {
                break got;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        };
        if buffered {
            assert!(got.is_empty(), "{got:?}");
        } else {
            assert_eq!(got.len(), 1, "{got:?}");
            assert!(
                !got[0].complete,
                "the upstream saw a complete request: {got:?}"
            );
        }
    }
}
