//! The proxy's request body limits (`max_body_size`, `buffer_request_body`) and streamed
//! responses that are never held back (event streams, `X-Accel-Buffering: no`), against real
//! upstreams and clients.

use qweb_testkit as common;

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::StreamBody;
use hyper::body::Frame;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use common::{client, upstream, Proto, BOTH};

fn proxy_route(ups: &[SocketAddr], extra: &str) -> String {
    let list: Vec<String> = ups.iter().map(|a| format!("\"{a}\"")).collect();
    format!(
        "[[route]]\nprefix = \"/\"\nupstreams = [{}]\n{extra}\n",
        list.join(", ")
    )
}

/// An upstream that records every byte it receives and never answers.
async fn recording_upstream() -> (SocketAddr, Arc<Mutex<Vec<u8>>>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let got = Arc::new(Mutex::new(Vec::new()));
    let g = got.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let g = g.clone();
            tokio::spawn(async move {
                let mut b = [0u8; 8192];
                while let Ok(n) = s.read(&mut b).await {
                    if n == 0 {
                        return;
                    }
                    g.lock().unwrap().extend_from_slice(&b[..n]);
                }
            });
        }
    });
    (addr, got)
}

fn stream_body(pieces: usize, size: usize) -> reqwest::Body {
    let chunks: Vec<Result<Vec<u8>, Infallible>> =
        (0..pieces).map(|_| Ok(vec![b'~'; size])).collect();
    reqwest::Body::wrap_stream(futures_util::stream::iter(chunks))
}

#[tokio::test]
async fn content_length_over_max_body_size_is_413_before_the_upstream() {
    let up = upstream::start("u1").await;
    let t = common::start_with(&proxy_route(&[up.addr], "max_body_size = \"1KiB\""), |_| {});
    for proto in BOTH {
        let c = client(&t.cert(), proto);
        let r = c
            .post(format!("{}/echo", t.https()))
            .body(vec![b'x'; 1025])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 413, "{proto:?}");
        if proto == Proto::H1 {
            assert_eq!(r.headers()["connection"], "close");
        }
        // exactly at the limit passes
        let r = c
            .post(format!("{}/echo", t.https()))
            .body(vec![b'x'; 1024])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{proto:?}");
        assert_eq!(r.bytes().await.unwrap().len(), 1024);
    }
    // the refused requests never reached the upstream: one connection per accepted request
    // at most (h1 and h2 each sent one)
    assert!(up.connections.load(Ordering::SeqCst) <= 2);
    // a lying, huge Content-Length is refused at once, without waiting for the body
    let start = Instant::now();
    let out = common::raw_exchange(
        t.addrs[1],
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 50000000\r\n\r\nabc",
        Duration::from_secs(5),
    )
    .await;
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 413"), "{out}");
    assert!(start.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn streamed_body_crossing_max_body_size_is_cut_before_the_upstream_gets_the_excess() {
    let (up, got) = recording_upstream().await;
    let t = common::start_with(
        &proxy_route(&[up], "max_body_size = \"1KiB\"\ntimeout = \"5s\""),
        |_| {},
    );
    // raw chunked upload over HTTP/1.1: 4 chunks of 400 bytes (the third crosses 1 KiB)
    let mut c = TcpStream::connect(t.addrs[1]).await.unwrap();
    c.write_all(b"POST /up HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    for _ in 0..4 {
        let mut chunk = b"190\r\n".to_vec();
        chunk.extend_from_slice(&[b'~'; 400]);
        chunk.extend_from_slice(b"\r\n");
        if c.write_all(&chunk).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = c.write_all(b"0\r\n\r\n").await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut out)).await;
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 413"), "{out}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let got = got.lock().unwrap().clone();
    let body_bytes = got.iter().filter(|&&b| b == b'~').count();
    assert!(
        body_bytes <= 1024,
        "the upstream received {body_bytes} body bytes"
    );
    assert!(
        !got.windows(5).any(|w| w == b"0\r\n\r\n"),
        "the upstream saw a complete (truncated) body"
    );

    // the same over h2 (no length: DATA frames)
    let c = client(&t.cert(), Proto::H2);
    let r = c
        .post(format!("{}/up", t.https()))
        .body(stream_body(8, 400))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
}

#[tokio::test]
async fn buffer_request_body_sends_a_length() {
    let up = upstream::start("u1").await;
    let t = common::start_with(
        &proxy_route(
            &[up.addr],
            "max_body_size = \"64KiB\"\nbuffer_request_body = true",
        ),
        |_| {},
    );
    for proto in BOTH {
        let c = client(&t.cert(), proto);
        let r = c
            .post(format!("{}/echo", t.https()))
            .body(stream_body(10, 1000))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{proto:?}");
        let h = r.headers().clone();
        assert_eq!(h["x-up-h-content-length"], "10000", "{proto:?}");
        assert!(!h.contains_key("x-up-h-transfer-encoding"), "{proto:?}");
        assert_eq!(r.bytes().await.unwrap().len(), 10_000);
    }
    let before = up.connections.load(Ordering::SeqCst);
    let r = client(&t.cert(), Proto::H1)
        .post(format!("{}/echo", t.https()))
        .body(stream_body(100, 1000))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    assert_eq!(
        up.connections.load(Ordering::SeqCst),
        before,
        "an upstream was contacted"
    );
}

/// An upstream of `content_type` responses whose writes the test drives: each message on the
/// channel is written as one piece; the time of each write is recorded.
async fn driven_upstream(
    content_type: &'static str,
    accel: Option<&'static str>,
) -> (
    SocketAddr,
    tokio::sync::mpsc::UnboundedSender<Bytes>,
    Arc<Mutex<Vec<Instant>>>,
) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
    let rx = Arc::new(tokio::sync::Mutex::new(Some(rx)));
    let written = Arc::new(Mutex::new(Vec::new()));
    let w = written.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let rx = rx.clone();
            let w = w.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |_req| {
                    let rx = rx.clone();
                    let w = w.clone();
                    async move {
                        let rx = rx.lock().await.take().expect("one stream");
                        let stream = futures_util::stream::unfold(rx, move |mut rx| {
                            let w = w.clone();
                            async move {
                                let b = rx.recv().await?;
                                w.lock().unwrap().push(Instant::now());
                                Some((Ok::<_, Infallible>(Frame::data(b)), rx))
                            }
                        });
                        let mut r = hyper::Response::builder()
                            .header("content-type", content_type)
                            .header("cache-control", "no-cache");
                        if let Some(a) = accel {
                            r = r.header("x-accel-buffering", a);
                        }
                        Ok::<_, Infallible>(r.body(StreamBody::new(stream)).unwrap())
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    (addr, tx, written)
}

/// Sends 10 events 100 ms apart through qweb with gzip on, and returns for each the delay
/// between the upstream's write and the client decoding it, with the response headers.
async fn event_delays(
    content_type: &'static str,
    accel: Option<&'static str>,
    proto: Proto,
) -> (Vec<Duration>, reqwest::header::HeaderMap) {
    let (up, tx, written) = driven_upstream(content_type, accel).await;
    let t = common::start_with(
        &format!(
            "[offload.engines.zpool]\nkind = \"pool\"\nthreads = 2\n\
             [compression]\nmin_size = 0\nengine = \"zpool\"\nflush_interval = \"200ms\"\n\
             types = [\"text/*\"]\n{}",
            proxy_route(&[up], "")
        ),
        |_| {},
    );
    let c = client(&t.cert(), proto);
    let mut r = c
        .get(format!("{}/events", t.https()))
        .header("accept-encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let headers = r.headers().clone();
    let gz = headers.get("content-encoding").is_some_and(|v| v == "gzip");
    let mut dec = flate2::write::GzDecoder::new(Vec::new());
    let mut plain = Vec::new();
    let mut delays = Vec::new();
    for i in 0..10 {
        let event = format!("id: {i}\ndata: event number {i} {}\n\n", "x".repeat(40));
        tx.send(Bytes::from(event.clone())).unwrap();
        // read until the event is decodable
        loop {
            let chunk = tokio::time::timeout(Duration::from_secs(5), r.chunk())
                .await
                .expect("event never arrived")
                .unwrap()
                .expect("stream ended");
            let text = if gz {
                dec.write_all(&chunk).unwrap();
                dec.flush().unwrap();
                String::from_utf8_lossy(dec.get_ref()).into_owned()
            } else {
                plain.extend_from_slice(&chunk);
                String::from_utf8_lossy(&plain).into_owned()
            };
            if text.contains(&format!("id: {i}\n")) && text.ends_with("\n\n") {
                let at = Instant::now();
                let sent = *written.lock().unwrap().last().unwrap();
                delays.push(at - sent);
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (delays, headers)
}

fn check_delays(delays: &[Duration], what: &str) {
    let mut sorted = delays.to_vec();
    sorted.sort();
    let median = sorted[sorted.len() / 2];
    let max = *sorted.last().unwrap();
    eprintln!("{what}: median {median:?}, max {max:?}, all {delays:?}");
    // flush_interval is 200 ms: anything held for it would show here. (The median bound was
    // 5 ms, which a loaded 2-core machine missed once at 5.9 ms with every event flushed: 50 ms
    // is still a quarter of the interval.)
    assert!(
        median < Duration::from_millis(50),
        "{what}: median {median:?}"
    );
    assert!(max < Duration::from_millis(150), "{what}: max {max:?}");
}

#[tokio::test]
async fn event_stream_events_arrive_at_once_with_compression_on() {
    for proto in BOTH {
        let (delays, h) = event_delays("text/event-stream", None, proto).await;
        assert_eq!(h["content-type"], "text/event-stream");
        assert_eq!(
            h["content-encoding"], "gzip",
            "compressed, flushed per write"
        );
        check_delays(&delays, &format!("text/event-stream {proto:?}"));
    }
}

#[tokio::test]
async fn x_accel_buffering_no_flushes_at_once_and_is_not_passed_on() {
    let (delays, h) = event_delays("text/plain", Some("no"), Proto::H1).await;
    assert!(!h.contains_key("x-accel-buffering"));
    assert_eq!(h["content-encoding"], "gzip", "still compressed");
    check_delays(&delays, "X-Accel-Buffering: no");
}

#[tokio::test]
async fn ordinary_streamed_text_still_waits_for_flush_interval() {
    // the control: without the marker a pause is flushed after flush_interval (200 ms)
    let (delays, h) = event_delays("text/plain", Some("yes"), Proto::H1).await;
    assert!(!h.contains_key("x-accel-buffering"));
    let mut sorted = delays.clone();
    sorted.sort();
    assert!(
        sorted[sorted.len() / 2] >= Duration::from_millis(150),
        "{delays:?}"
    );
}

/// python's http.server as a keep-alive upstream (HTTP/1.1): it writes a response's head and
/// body in two `send`s with Nagle on, so the body waits for the ACK of the head.
// the child goes to the caller, who kills and waits for it
#[allow(clippy::zombie_processes)]
fn python_upstream(dir: &std::path::Path) -> (std::process::Child, u16) {
    use std::io::Read;
    let mut py = std::process::Command::new("python3")
        .args(["-u", "-m", "http.server", "0", "--bind", "127.0.0.1"])
        .args(["--protocol", "HTTP/1.1", "--directory"])
        .arg(dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("python3 is needed for this test");
    let mut out = py.stdout.take().unwrap();
    let mut seen = Vec::new();
    let mut b = [0u8; 1];
    while out.read(&mut b).unwrap_or(0) == 1 {
        seen.push(b[0]);
        let s = String::from_utf8_lossy(&seen);
        if let Some(rest) = s.split(" port ").nth(1) {
            if let Some(p) = rest.split(' ').next().filter(|_| rest.contains(' ')) {
                let port = p.parse::<u16>().unwrap();
                // the pipe stays open: python dies of EPIPE if it is closed under a print
                std::mem::forget(out);
                return (py, port);
            }
        }
    }
    panic!(
        "python http.server did not start: {}",
        String::from_utf8_lossy(&seen)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_connections_to_a_nagle_upstream_are_not_delayed() {
    let docs = tempfile::tempdir().unwrap();
    std::fs::write(docs.path().join("a.txt"), "small").unwrap();
    let dir = docs.path().to_owned();
    let (mut py, port) = tokio::task::spawn_blocking(move || python_upstream(&dir))
        .await
        .unwrap();
    let up: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let t = common::start_with(&proxy_route(&[up], ""), |_| {});
    let c = common::plain_client();
    let mut times = Vec::new();
    for _ in 0..20 {
        let start = Instant::now();
        let r = c.get(format!("{}/a.txt", t.http())).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.text().await.unwrap(), "small");
        times.push(start.elapsed());
    }
    let _ = py.kill();
    let _ = py.wait();
    let mut sorted = times.clone();
    sorted.sort();
    let median = sorted[sorted.len() / 2];
    eprintln!("python upstream through qweb: median {median:?}, all {times:?}");
    // a delayed ACK costs 40 ms per request
    assert!(
        median < Duration::from_millis(20),
        "median {median:?}: {times:?}"
    );
}
