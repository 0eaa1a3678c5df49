//! What a connection that sends nothing more costs in memory, through the real binary
//! (mimalloc and all):
//!
//! - idle TLS keep-alive: 500 HTTP/1.1 connections over TLS 1.3 (ECDSA P-256, as
//!   docs/BENCHMARKS.md experiment F), one request each, then idle: the qweb process's
//!   resident memory grows by at most 10 KiB per connection plus a stated margin; and the
//!   idle connections still close at `keepalive_timeout`;
//! - an HTTP/2 client that opens 128 streams of a large file, grants every window and never
//!   reads its socket: what the streams hold waiting is bounded per connection (hostile round
//!   3, item 1), and every byte still arrives once the client reads;
//! - idle HTTP/2 over TLS: 500 connections (`QWEB_IDLE_H2_CONNS` for another count), one
//!   request each, then idle: at most 16 KiB each (issue 24; 31.2 before h2's buffers were
//!   released while idle), and they still serve a second request;
//! - an idle WebSocket tunnel (HTTP/1.1 client, WebSocket upstream): at most 12 KiB each over
//!   plain HTTP and 24 KiB over TLS (measured before lazy copy buffers: 19.5 and 30.7 KiB).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use qweb_testkit::process::{rss_kib, Qweb};
use qweb_testkit::tls::{ClientTls, Proto};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const BIN: &str = env!("CARGO_BIN_EXE_qweb");

/// Connections held idle.
const N: usize = 500;
/// KiB added per idle connection. The goal of issue 24 is 10; measured 5.9 (debug build)
/// since an idle TLS connection frees rustls' 4 KiB read buffer (vendor/rustls/QWEB.md), 9.3
/// before: 7 fails if that buffer comes back.
const KIB_PER_CONN: u64 = 7;
/// Allowance for what is not per connection and that the warm-up did not already allocate
/// (a few allocator pages, 64 KiB each per size class and worker thread; slab and timer pages):
/// 512 KiB, about 1 KiB per connection at N = 500, so that 8 KiB per connection fails.
const MARGIN_KIB: u64 = 512;

fn setup(dir: &Path, proto: Proto) -> (std::path::PathBuf, rustls::ClientConfig) {
    let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
        .unwrap()
        .self_signed(&kp)
        .unwrap();
    std::fs::write(dir.join("c.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("k.pem"), kp.serialize_pem()).unwrap();
    std::fs::create_dir_all(dir.join("www")).unwrap();
    std::fs::write(dir.join("www/1k.bin"), vec![b'x'; 1024]).unwrap();
    std::fs::write(dir.join("www/1m.bin"), vec![b'y'; 1 << 20]).unwrap();
    let d = dir.display();
    let config = dir.join("qweb.toml");
    std::fs::write(
        &config,
        format!(
            "workers = 2\nstate_dir = \"{d}/state\"\n\
             [limits]\nkeepalive_timeout = \"6s\"\n\
             [[listener]]\naddress = \"127.0.0.1:0\"\nhttp2 = true\n\
             [listener.tls]\ncertificates = [{{ cert = \"{d}/c.pem\", key = \"{d}/k.pem\" }}]\n\
             [[route]]\nprefix = \"/\"\nroot = \"{d}/www\"\n"
        ),
    )
    .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).unwrap();
    let client = ClientTls::with_roots(roots)
        .versions(&[&rustls::version::TLS13])
        .proto(proto)
        // every connection a full handshake, as in experiment F
        .no_resumption()
        .build();
    (config, client)
}

type Conn = tokio_rustls::client::TlsStream<TcpStream>;

/// One connection with one request answered in full.
async fn one(addr: &str, tls: &tokio_rustls::TlsConnector) -> Conn {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut s = tls.connect(name, tcp).await.unwrap();
    s.write_all(b"GET /1k.bin HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    // head + 1024-byte body
    let complete = |got: &[u8]| {
        got.windows(4)
            .position(|w| w == b"\r\n\r\n")
            .is_some_and(|p| got.len() >= p + 4 + 1024)
    };
    while !complete(&got) {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    assert!(got.starts_with(b"HTTP/1.1 200"));
    s
}

/// `n` connections with one request answered each, over HTTP/2 with `h2` (else HTTP/1.1).
async fn open(addr: &str, tls: &tokio_rustls::TlsConnector, n: usize, h2: bool) -> Vec<Conn> {
    let mut conns = Vec::with_capacity(n);
    // a few at a time, as a browser population would arrive
    for _ in 0..n / 10 {
        let batch = (0..10).map(|_| async move {
            if h2 {
                one_h2(addr, tls).await
            } else {
                one(addr, tls).await
            }
        });
        conns.extend(futures_util::future::join_all(batch).await);
    }
    conns
}

/// Asserts that `n` idle connections (`what`) added at most `kib_per_conn` each (plus
/// [`MARGIN_KIB`]) to the resident memory, `before` -> `after` KiB.
fn assert_idle_cost(before: u64, after: u64, n: usize, kib_per_conn: u64, what: &str) {
    let per_conn = (after.saturating_sub(before)) as f64 / n as f64;
    eprintln!("RSS {before} KiB -> {after} KiB with {n} idle {what}: {per_conn:.2} KiB each");
    assert!(
        after <= before + n as u64 * kib_per_conn + MARGIN_KIB,
        "{per_conn:.2} KiB per idle {what} (RSS {before} -> {after} KiB), over \
         {kib_per_conn} KiB + {MARGIN_KIB} KiB in all"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_tls_keepalive_connections_cost_at_most_7_kib_each() {
    let dir = tempfile::tempdir().unwrap();
    let (config, client) = setup(dir.path(), Proto::H1);
    let qweb = Qweb::serve(BIN, &config);
    let addr = qweb.addr("https");
    let pid = qweb.pid();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(client));

    // Warm up: one-time allocations (handshake tables, allocator pages, timer wheel levels)
    // are not per connection.
    let warm = open(&addr, &tls, 100, false).await;
    drop(warm);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = rss_kib(pid);

    let conns = open(&addr, &tls, N, false).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = rss_kib(pid);
    assert_idle_cost(before, after, N, KIB_PER_CONN, "TLS connections");

    // The parked connections still close at keepalive_timeout (6 s after their request).
    let since = Instant::now();
    let closed = conns.into_iter().map(|mut s| async move {
        let mut b = [0u8; 16];
        matches!(
            tokio::time::timeout(Duration::from_secs(30), s.read(&mut b)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    });
    let closed = futures_util::future::join_all(closed).await;
    assert!(
        closed.iter().all(|c| *c),
        "an idle connection was not closed"
    );
    assert!(
        since.elapsed() < Duration::from_secs(20),
        "idle connections closed late: {:?}",
        since.elapsed()
    );
}

/// Streams per hostile HTTP/2 connection (qweb's default `max_concurrent_streams`).
const STREAMS: u32 = 128;
/// Hostile HTTP/2 connections.
const H2_CONNS: usize = 2;
/// The bound per such connection: 128 streams x (32 KiB h2 send buffer + a 16 KiB chunk) is
/// 6 MiB; 10 MiB leaves room for TLS buffers and allocator slack. With hyper's defaults
/// (400 KiB per stream, 128 KiB chunks) it was about 66 MiB.
const MIB_PER_H2_CONN: u64 = 10;

/// An HTTP/2 connection whose client grants every window (stream and connection, 2^31-1),
/// asks for `1m.bin` on 128 streams, and reads nothing; its socket's receive buffer is small,
/// so what the server sends waits on the server's side.
async fn greedy_h2(addr: &str, tls: &tokio_rustls::TlsConnector) -> Conn {
    use qweb_testkit::h2frames::{frame, get, hello, WINDOW_UPDATE};
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let tcp = sock.connect(addr.parse().unwrap()).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut s = tls.connect(name, tcp).await.unwrap();
    let mut out = hello(&[(0x4, 0x7fff_ffff)]);
    out.extend(frame(
        WINDOW_UPDATE,
        0,
        0,
        &(0x7fff_ffff_u32 - 65_535).to_be_bytes(),
    ));
    for i in 0..STREAMS {
        out.extend(get(2 * i + 1, "/1m.bin"));
    }
    s.write_all(&out).await.unwrap();
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_streams_of_a_client_that_never_reads_hold_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let (config, client) = setup(dir.path(), Proto::H2);
    let qweb = Qweb::serve(BIN, &config);
    let addr = qweb.addr("https");
    let pid = qweb.pid();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(client));

    // Warm up (handshake tables, allocator pages): one connection that reads everything.
    let mut warm = greedy_h2(&addr, &tls).await;
    let seen = qweb_testkit::h2frames::read_frames(&mut warm, Duration::from_secs(2)).await;
    assert!(seen.data_bytes > 0, "{seen:?}");
    drop(warm);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = rss_kib(pid);

    let mut conns = Vec::new();
    for _ in 0..H2_CONNS {
        conns.push(greedy_h2(&addr, &tls).await);
    }
    // Let every stream fill what it may hold.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = rss_kib(pid);
    let per_conn_mib = after.saturating_sub(before) as f64 / 1024.0 / H2_CONNS as f64;
    eprintln!(
        "RSS {before} KiB -> {after} KiB with {H2_CONNS} connections of {STREAMS} unread \
         streams: {per_conn_mib:.1} MiB each"
    );
    assert!(
        after <= before + H2_CONNS as u64 * MIB_PER_H2_CONN * 1024,
        "{per_conn_mib:.1} MiB per connection whose client does not read (RSS {before} -> \
         {after} KiB), over {MIB_PER_H2_CONN} MiB"
    );

    // Nothing was thrown away to stay within the bound: once the client reads, every stream
    // delivers its whole file (the windows were granted at the start).
    let want = STREAMS as usize * (1 << 20);
    let reads = conns.into_iter().map(|mut s| async move {
        let mut got = 0usize;
        let mut buf = vec![0u8; 1 << 16];
        let mut pending = Vec::new();
        // count DATA payload bytes, frame by frame, until all arrived
        while got < want {
            let n = tokio::time::timeout(Duration::from_secs(20), s.read(&mut buf))
                .await
                .expect("the server keeps sending")
                .unwrap();
            assert!(n > 0, "closed after {got} of {want} bytes");
            pending.extend_from_slice(&buf[..n]);
            while pending.len() >= 9 {
                let len = (usize::from(pending[0]) << 16)
                    | (usize::from(pending[1]) << 8)
                    | usize::from(pending[2]);
                if pending.len() < 9 + len {
                    break;
                }
                if pending[3] == qweb_testkit::h2frames::DATA {
                    got += len;
                }
                assert_ne!(
                    pending[3],
                    qweb_testkit::h2frames::RST_STREAM,
                    "a stream was reset"
                );
                pending.drain(..9 + len);
            }
        }
        got
    });
    for got in futures_util::future::join_all(reads).await {
        assert_eq!(got, want);
    }
}

/// WebSocket tunnels held idle.
const TUNNELS: usize = 300;
/// The goal per idle tunnel (client connection, upstream connection, the tunnel's state):
/// plain, TLS.
const KIB_PER_TUNNEL: [u64; 2] = [12, 24];

/// One WebSocket through qweb (over TLS with `tls`), one message echoed, then left idle.
async fn websocket(
    addr: &str,
    tls: Option<&tokio_rustls::TlsConnector>,
) -> Result<Box<dyn AsyncStream>, String> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let mut s: Box<dyn AsyncStream> = match tls {
        Some(tls) => {
            let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
            Box::new(tls.connect(name, tcp).await.unwrap())
        }
        None => Box::new(tcp),
    };
    s.write_all(
        b"GET /chat HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
          Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    )
    .await
    .unwrap();
    // (a TLS stream may keep what was written until flushed)
    s.flush().await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut buf).await.map_err(|e| e.to_string())?;
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    assert!(
        got.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    // a masked text frame "hi" (mask 0), echoed unmasked
    s.write_all(&[0x81, 0x82, 0, 0, 0, 0, b'h', b'i'])
        .await
        .unwrap();
    s.flush().await.unwrap();
    let mut echo = [0u8; 4];
    s.read_exact(&mut echo).await.unwrap();
    assert_eq!(echo, [0x81, 0x02, b'h', b'i']);
    Ok(s)
}

trait AsyncStream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> AsyncStream for T {}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_websocket_tunnels_cost_at_most_12_kib_each_or_24_over_tls() {
    for tls in [false, true] {
        idle_websockets(tls).await;
    }
}

async fn idle_websockets(over_tls: bool) {
    let up = qweb_testkit::ws::ws_echo().await;
    let dir = tempfile::tempdir().unwrap();
    let (config, client) = setup(dir.path(), Proto::H1);
    let mut text = std::fs::read_to_string(&config).unwrap();
    text = text.replace("prefix = \"/\"\nroot", "prefix = \"/static\"\nroot");
    text.push_str(&format!(
        "[[listener]]\naddress = \"127.0.0.1:0\"\n\
         [[route]]\nprefix = \"/\"\nupstreams = [\"{up}\"]\n"
    ));
    std::fs::write(&config, text).unwrap();
    let qweb = Qweb::serve(BIN, &config);
    let addr = qweb.addr(if over_tls { "https" } else { "http" });
    let pid = qweb.pid();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(client));
    let tls = over_tls.then_some(&tls);

    let dump = |e: String| -> Box<dyn AsyncStream> { panic!("{e}\n{}", qweb.lines().join("\n")) };
    let warm: Vec<_> = futures_util::future::join_all((0..50).map(|_| websocket(&addr, tls)))
        .await
        .into_iter()
        .map(|r| r.unwrap_or_else(dump))
        .collect();
    drop(warm);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = rss_kib(pid);
    let mut held = Vec::with_capacity(TUNNELS);
    for _ in 0..TUNNELS / 10 {
        let batch = futures_util::future::join_all((0..10).map(|_| websocket(&addr, tls))).await;
        held.extend(batch.into_iter().map(|r| r.unwrap_or_else(dump)));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = rss_kib(pid);
    let per = after.saturating_sub(before) as f64 / TUNNELS as f64;
    eprintln!(
        "RSS {before} KiB -> {after} KiB with {TUNNELS} idle WebSockets (TLS: {over_tls}): \
         {per:.1} KiB each"
    );
    let goal = KIB_PER_TUNNEL[usize::from(over_tls)];
    assert!(
        after <= before + TUNNELS as u64 * goal + MARGIN_KIB,
        "{per:.1} KiB per idle WebSocket tunnel (TLS: {over_tls}; RSS {before} -> {after} \
         KiB), over {goal} KiB + {MARGIN_KIB} KiB in all"
    );
    // still tunnels: each echoes
    for s in held.iter_mut().take(20) {
        s.write_all(&[0x81, 0x82, 0, 0, 0, 0, b'h', b'o'])
            .await
            .unwrap();
        s.flush().await.unwrap();
        let mut echo = [0u8; 4];
        s.read_exact(&mut echo).await.unwrap();
        assert_eq!(echo, [0x81, 0x02, b'h', b'o']);
    }
}

/// KiB per idle HTTP/2 connection over TLS (the goal of issue 24 is 16). Measured 13.1-14.0 KiB
/// (1 000 and 2 000 connections, debug build) once the patched h2 (vendor/h2) freed its codec
/// buffers and stream slots while no stream is open (31.2 KiB before), and 9.5 KiB (500) once
/// the TLS stream also freed rustls' empty read buffer: 12 fails if either comes back.
const KIB_PER_H2_CONN: u64 = 12;

/// One HTTP/2 connection over TLS with one `GET /1k.bin` answered in full (its SETTINGS
/// acknowledged), then left idle.
async fn one_h2(addr: &str, tls: &tokio_rustls::TlsConnector) -> Conn {
    use qweb_testkit::h2frames::{frame, get, hello, DATA, SETTINGS};
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut s = tls.connect(name, tcp).await.unwrap();
    let mut out = hello(&[]);
    out.extend(get(1, "/1k.bin"));
    s.write_all(&out).await.unwrap();
    s.flush().await.unwrap();
    let mut data = 0usize;
    loop {
        let mut head = [0u8; 9];
        s.read_exact(&mut head).await.unwrap();
        let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
        let mut payload = vec![0u8; len];
        s.read_exact(&mut payload).await.unwrap();
        match (head[3], head[4]) {
            (SETTINGS, 0) => {
                s.write_all(&frame(SETTINGS, 0x1, 0, &[])).await.unwrap();
                s.flush().await.unwrap();
            }
            (DATA, flags) => {
                data += len;
                if flags & 0x1 != 0 {
                    break;
                }
            }
            _ => {}
        }
    }
    assert_eq!(data, 1024);
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_h2_connections_cost_at_most_12_kib_each() {
    let dir = tempfile::tempdir().unwrap();
    let (config, client) = setup(dir.path(), Proto::H2);
    // (the connections opened first must outlive the opening of the others)
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replace("keepalive_timeout = \"6s\"", "keepalive_timeout = \"120s\""),
    )
    .unwrap();
    let qweb = Qweb::serve(BIN, &config);
    let addr = qweb.addr("https");
    let pid = qweb.pid();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(client));
    let n: usize = std::env::var("QWEB_IDLE_H2_CONNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(N);

    let warm = open(&addr, &tls, 100, true).await;
    drop(warm);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = rss_kib(pid);

    let mut conns = open(&addr, &tls, n, true).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = rss_kib(pid);
    assert_idle_cost(before, after, n, KIB_PER_H2_CONN, "HTTP/2 TLS connections");

    // Still HTTP/2 connections that serve, with their buffers allocated again: a second
    // request on the 20 held longest.
    let again = conns.iter_mut().take(20).map(|s| async move {
        s.write_all(&qweb_testkit::h2frames::get(3, "/1k.bin"))
            .await
            .unwrap();
        s.flush().await.unwrap();
        qweb_testkit::h2frames::read_frames(s, Duration::from_millis(1500)).await
    });
    for (i, seen) in futures_util::future::join_all(again)
        .await
        .into_iter()
        .enumerate()
    {
        assert_eq!(seen.data_bytes, 1024, "connection {i}: {seen:?}");
        assert_eq!(seen.headers, 1, "connection {i}: {seen:?}");
    }
}
