//! Nothing a client does can pin qweb: clients that never read a response (HTTP/1.1, and
//! HTTP/2 streams that never grant flow-control window) are cut by `send_timeout`, and HTTP/2
//! control-frame floods get GOAWAY ENHANCE_YOUR_CALM. Real sockets, real TLS, raw HTTP/2
//! frames written by hand (a client that misbehaves on purpose).
#![allow(unsafe_code)] // libc calls on test processes and files; each block has its SAFETY note

use qweb_testkit as common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::h2frames::{frame, get, hello, read_frames};
use common::tls::TlsStream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The tests here count the process's file descriptors: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const SEND_TIMEOUT: Duration = Duration::from_secs(2);

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Resident memory of this process, KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit with a valid resource and a pointer to a local struct.
    unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 {
            r.rlim_cur = r.rlim_max.min(65536);
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

/// A file of `len` bytes (sparse: reads as zeros).
fn big_file(path: &std::path::Path, len: u64) {
    let f = std::fs::File::create(path).unwrap();
    f.set_len(len).unwrap();
}

/// 20 HTTP/1.1 clients ask for 64 MB and never read, with a cap of 20 connections: without a
/// send timeout nobody else is ever served. With one, the stalled connections are closed and a
/// new client is served within the send timeout plus a margin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h1_clients_that_never_read_are_cut_by_send_timeout() {
    let _serial = SERIAL.lock().await;
    let t = common::start_with(
        "[limits]\nmax_connections_per_worker = 20\nsend_timeout = \"2s\"\n",
        |_| {},
    );
    big_file(&t.site().join("big"), 64 << 20);
    std::fs::write(t.site().join("small"), "small").unwrap();
    let mut stalled = Vec::new();
    for _ in 0..20 {
        let mut s = TcpStream::connect(t.addrs[1]).await.unwrap();
        s.write_all(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        stalled.push(s);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let start = Instant::now();
    let mut s = TcpStream::connect(t.addrs[1]).await.unwrap();
    s.write_all(b"GET /small HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(
        SEND_TIMEOUT + Duration::from_secs(8),
        s.read_to_end(&mut out),
    )
    .await
    .expect("a new client was not served while 20 stalled clients held every slot")
    .unwrap();
    let took = start.elapsed();
    assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 200"));
    assert!(
        took >= SEND_TIMEOUT - Duration::from_millis(500),
        "{took:?}"
    );
    // every stalled connection was closed before its 64 MB were sent (reading one that is
    // still open would unstall it: give them all time to pass the send timeout first)
    tokio::time::sleep(SEND_TIMEOUT + Duration::from_secs(2)).await;
    for mut s in stalled {
        let mut n = 0u64;
        let mut buf = vec![0u8; 1 << 16];
        let end = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(k) => n += k as u64,
                }
            }
        })
        .await;
        assert!(end.is_ok(), "a stalled connection was left open");
        assert!(n < 64 << 20, "all {n} bytes were sent");
    }
}

/// A client that reads slowly but steadily (pauses shorter than the send timeout) gets its
/// whole response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_but_steady_reader_is_not_cut() {
    let _serial = SERIAL.lock().await;
    let t = common::start_with("[limits]\nsend_timeout = \"2s\"\n", |_| {});
    big_file(&t.site().join("big"), 8 << 20);
    let mut s = TcpStream::connect(t.addrs[1]).await.unwrap();
    s.write_all(b"GET /big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut total = 0usize;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        // read about 2 MB, then pause for less than the send timeout
        let mut chunk = 0;
        while chunk < 2 << 20 {
            match s.read(&mut buf).await.unwrap() {
                0 => break,
                k => chunk += k,
            }
        }
        if chunk == 0 {
            break;
        }
        total += chunk;
        tokio::time::sleep(Duration::from_millis(1200)).await;
    }
    assert!(total > 8 << 20, "got {total} bytes");
}

/// A real upstream that answers every request with 1 GB (never finishing) and reports when
/// qweb closes its connection.
async fn endless_upstream() -> (std::net::SocketAddr, Arc<tokio::sync::Notify>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let closed = Arc::new(tokio::sync::Notify::new());
    let c = closed.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let c = c.clone();
            tokio::spawn(async move {
                let mut head = vec![0u8; 4096];
                let _ = s.read(&mut head).await;
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1073741824\r\n\r\n")
                    .await;
                let chunk = vec![b'x'; 64 * 1024];
                while s.write_all(&chunk).await.is_ok() {}
                c.notify_one();
            });
        }
    });
    (addr, closed)
}

/// A proxied response the client never reads: the send timeout closes the client connection
/// and with it the upstream connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_proxied_response_releases_its_upstream_connection() {
    let _serial = SERIAL.lock().await;
    let (up, closed) = endless_upstream().await;
    let t = common::start_with(
        &format!(
            "[limits]\nsend_timeout = \"2s\"\n[[route]]\nprefix = \"/\"\nupstreams = [\"http://{up}\"]\n"
        ),
        |_| {},
    );
    let mut s = TcpStream::connect(t.addrs[1]).await.unwrap();
    s.write_all(b"GET /forever HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let start = Instant::now();
    tokio::time::timeout(SEND_TIMEOUT + Duration::from_secs(8), closed.notified())
        .await
        .expect("the upstream connection of a stalled response was never released");
    assert!(start.elapsed() >= SEND_TIMEOUT - Duration::from_millis(500));
    drop(s);
}

// ---- raw HTTP/2 ----

/// A TLS connection with ALPN h2, the preface and our SETTINGS already sent.
async fn h2_raw(t: &common::TestServer, settings: &[(u16, u32)]) -> TlsStream {
    let cfg = Arc::new(common::tls_client_config(&t.cert(), common::Proto::H2));
    let mut tls = common::tls::connect(t.addrs[0], &cfg).await.unwrap();
    tls.write_all(&hello(settings)).await.unwrap();
    tls
}

/// 8 HTTP/2 clients open 128 streams each for a 10 MB file and never grant flow-control
/// window. While they stall, qweb holds one read-ahead chunk per stream (and at most
/// `file_cache.held_fds` files per worker: `hostile_fd.rs`); the send timeout resets the
/// streams and closes the connections, and the descriptors come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_zero_window_streams_are_reset_and_connections_closed() {
    let _serial = SERIAL.lock().await;
    raise_fd_limit();
    let t = common::start_with(
        "[limits]\nmax_connections_per_worker = 8\nsend_timeout = \"2s\"\n",
        |_| {},
    );
    big_file(&t.site().join("big"), 10 << 20);
    std::fs::write(t.site().join("small"), "small").unwrap();
    let baseline = open_fds();
    let rss_before = rss_kib();
    let mut readers = Vec::new();
    let start = Instant::now();
    for _ in 0..8 {
        // SETTINGS_INITIAL_WINDOW_SIZE = 0: no stream may send a byte of DATA.
        let mut tls = h2_raw(&t, &[(0x4, 0)]).await;
        let mut reqs = Vec::new();
        for i in 0..128u32 {
            reqs.extend(get(1 + 2 * i, "/big"));
        }
        tls.write_all(&reqs).await.unwrap();
        readers.push(tokio::spawn(async move {
            let seen = read_frames(&mut tls, Duration::from_secs(30)).await;
            (seen, tls)
        }));
    }
    // while stalled: one descriptor per connection, and the worker's held files
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let stalled_fds = open_fds();
    let bound = baseline + 8 * (128 + 1) + 32;
    let rss_stalled = rss_kib();
    eprintln!(
        "fds: baseline {baseline}, while stalled {stalled_fds} (bound {bound}); \
         RSS {rss_before} KiB -> {rss_stalled} KiB ({} KiB per stalled stream)",
        rss_stalled.saturating_sub(rss_before) / (8 * 128)
    );
    assert!(stalled_fds <= bound, "{stalled_fds} fds > {bound}");
    // one 16 KiB first chunk per stalled stream (files/body.rs), plus h2 and client state;
    // 128 KiB chunks (about 135 KiB per stream) fail this
    let per_stream = rss_stalled.saturating_sub(rss_before) / (8 * 128);
    assert!(
        per_stream <= 64,
        "{per_stream} KiB of RSS per stalled stream"
    );
    // a new client (past the cap of 8 connections) is served once the stalled ones are cut
    let c = common::client(&t.cert(), common::Proto::H2);
    let r = tokio::time::timeout(
        SEND_TIMEOUT + Duration::from_secs(8),
        c.get(format!("{}/small", t.https())).send(),
    )
    .await
    .expect("a new client was not served in time")
    .unwrap();
    assert_eq!(r.text().await.unwrap(), "small");
    assert!(start.elapsed() >= SEND_TIMEOUT - Duration::from_millis(500));
    for r in readers {
        let (seen, _tls) = r.await.unwrap();
        assert_eq!(seen.headers, 128, "{seen:?}");
        assert_eq!(seen.data_bytes, 0, "{seen:?}");
        assert!(seen.eof, "a stalled connection was left open: {seen:?}");
        assert!(seen.goaway.is_some() || seen.resets > 0, "{seen:?}");
    }
    drop(c);
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut now_fds = open_fds();
    while now_fds > baseline + 16 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        now_fds = open_fds();
    }
    eprintln!(
        "fds after the send timeout: {now_fds}; RSS {} KiB",
        rss_kib()
    );
    assert!(
        now_fds <= baseline + 16,
        "{now_fds} fds, baseline {baseline}"
    );
}

/// One stream stalled while another waits on a slow upstream: only the stalled stream is
/// reset, the connection stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_one_stalled_stream_is_reset_alone() {
    let _serial = SERIAL.lock().await;
    let up = common::upstream::start("slow").await;
    let t = common::start_with(
        &format!(
            "[limits]\nsend_timeout = \"1s\"\n[[route]]\nprefix = \"/up\"\nstrip_prefix = true\nupstreams = [\"http://{}\"]\n",
            up.addr
        ),
        |_| {},
    );
    big_file(&t.site().join("big"), 1 << 20);
    let mut tls = h2_raw(&t, &[(0x4, 0)]).await;
    tls.write_all(&get(1, "/big")).await.unwrap();
    tls.write_all(&get(3, "/up/slow/5000")).await.unwrap();
    let seen = read_frames(&mut tls, Duration::from_secs(4)).await;
    assert_eq!(seen.resets, 1, "{seen:?}");
    assert_eq!(seen.goaway, None, "{seen:?}");
    assert!(!seen.eof, "{seen:?}");
    assert_eq!(seen.headers, 1, "{seen:?}");
}

/// Control-frame floods get GOAWAY ENHANCE_YOUR_CALM and the connection is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_control_frame_floods_get_enhance_your_calm() {
    let _serial = SERIAL.lock().await;
    let t = common::start_with("[limits]\nh2_control_frames_per_second = 100\n", |_| {});
    std::fs::write(t.site().join("a"), "a").unwrap();
    let floods: [(&str, Vec<u8>); 6] = [
        ("PING", frame(0x6, 0, 0, &[1; 8])),
        ("SETTINGS", frame(0x4, 0, 0, &[])),
        ("WINDOW_UPDATE", frame(0x8, 0, 0, &1u32.to_be_bytes())),
        ("PRIORITY", frame(0x2, 0, 1, &[0, 0, 0, 0, 16])),
        ("empty DATA", frame(0x0, 0, 1, &[])),
        ("empty HEADERS", Vec::new()),
    ];
    for (name, f) in floods {
        let tls = h2_raw(&t, &[]).await;
        let mut burst = Vec::new();
        if name == "empty DATA" {
            // an open stream (request body not finished) to send empty DATA on
            let mut h = get(1, "/a");
            h[4] = 0x4; // END_HEADERS only
            burst.extend(h);
        }
        for i in 0..2000u32 {
            if f.is_empty() {
                burst.extend(frame(0x1, 0x4, 1 + 2 * i, &[])); // each on a new stream
            } else {
                burst.extend_from_slice(&f);
            }
        }
        let (mut rd, mut wr) = tokio::io::split(tls);
        let reader =
            tokio::spawn(async move { read_frames(&mut rd, Duration::from_secs(10)).await });
        let _ = wr.write_all(&burst).await;
        let seen = reader.await.unwrap();
        assert_eq!(seen.goaway, Some(0xb), "{name}: {seen:?}");
        assert!(seen.eof, "{name}: connection left open: {seen:?}");
        let _ = wr.shutdown().await;
    }
}

/// A well-behaved HTTP/2 client is not cut: a few PINGs and a SETTINGS ACK, a request, then a
/// 10 MB download by a real client (its WINDOW_UPDATEs are paid for by the data it receives),
/// all with a small budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_normal_client_with_pings_is_not_affected() {
    let _serial = SERIAL.lock().await;
    let t = common::start_with("[limits]\nh2_control_frames_per_second = 20\n", |_| {});
    std::fs::write(t.site().join("a"), "a").unwrap();
    big_file(&t.site().join("big"), 10 << 20);
    let tls = h2_raw(&t, &[]).await;
    let (mut rd, mut wr) = tokio::io::split(tls);
    let reader = tokio::spawn(async move { read_frames(&mut rd, Duration::from_secs(3)).await });
    for i in 0..5u8 {
        wr.write_all(&frame(0x6, 0, 0, &[i; 8])).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wr.write_all(&frame(0x4, 0x1, 0, &[])).await.unwrap(); // SETTINGS ACK
    wr.write_all(&get(1, "/a")).await.unwrap();
    let seen = reader.await.unwrap();
    assert_eq!(seen.goaway, None, "{seen:?}");
    assert_eq!(seen.headers, 1, "{seen:?}");
    assert_eq!(seen.data_bytes, 1, "{seen:?}");
    // a real client downloading 10 MB sends many WINDOW_UPDATEs
    let c = common::client(&t.cert(), common::Proto::H2);
    let body = c
        .get(format!("{}/big", t.https()))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(body.len(), 10 << 20);
}
