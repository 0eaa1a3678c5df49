//! The soak's hostile TCP clients (HTTP/1.1 and HTTP/2 over TLS or plain), the QUIC ones
//! (`quic.rs`), and which of them run (`QWEB_SOAK_HOSTILE`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use qweb_testkit::h2frames::{frame, get, hello, read_frames};
use qweb_testkit::tls::{localhost, tls_client_config as tls_config, Proto};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use super::{client, quic, tls_connect, Server, BIG, SEND_TIMEOUT};

/// What the hostile clients did and saw.
#[derive(Default)]
pub struct Hostile {
    pub h1_stalled: AtomicU64,
    pub h1_cut: AtomicU64,
    pub h1_not_cut: AtomicU64,
    pub h2_zero_window_conns: AtomicU64,
    pub h2_zero_window_closed: AtomicU64,
    pub h2_zero_window_open: AtomicU64,
    pub floods: AtomicU64,
    pub floods_calmed: AtomicU64,
    pub floods_other: AtomicU64,
    pub vanished: AtomicU64,
    pub aborts: AtomicU64,
    pub abort_errors: AtomicU64,
    pub slowloris: AtomicU64,
    pub slowloris_cut: AtomicU64,
    pub rapid_resets: AtomicU64,
    pub rapid_resets_calmed: AtomicU64,
    pub pings: AtomicU64,
    pub ping_conns: AtomicU64,
    pub smuggles: AtomicU64,
    pub smuggles_refused: AtomicU64,
    pub smuggles_other: AtomicU64,
    pub quic_garbage: AtomicU64,
    pub quic_halfopen: AtomicU64,
    pub quic_errors: AtomicU64,
    pub connect_errors: AtomicU64,
}

impl Hostile {
    pub fn report(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "non-reading h1 connections: {} (cut by the server: {}, not cut: {}); \
             zero-window h2 connections: {} (closed by the server: {}, still open after 15 s: {}); \
             control-frame floods: {} (GOAWAY ENHANCE_YOUR_CALM: {}, other ending: {}); \
             ClientHello/TCP-and-vanish: {}; mid-response aborts: {} (failed before the abort: {}); \
             slowloris connections: {} (cut: {}); rapid-reset bursts: {} (GOAWAY \
             ENHANCE_YOUR_CALM: {}); PINGs: {} on {} connections; smuggling attempts: {} \
             (refused 400: {}, other answer: {}); QUIC garbage datagrams: {}; QUIC half-open \
             handshakes: {} (send errors: {}); connect/handshake errors: {}",
            g(&self.h1_stalled),
            g(&self.h1_cut),
            g(&self.h1_not_cut),
            g(&self.h2_zero_window_conns),
            g(&self.h2_zero_window_closed),
            g(&self.h2_zero_window_open),
            g(&self.floods),
            g(&self.floods_calmed),
            g(&self.floods_other),
            g(&self.vanished),
            g(&self.aborts),
            g(&self.abort_errors),
            g(&self.slowloris),
            g(&self.slowloris_cut),
            g(&self.rapid_resets),
            g(&self.rapid_resets_calmed),
            g(&self.pings),
            g(&self.ping_conns),
            g(&self.smuggles),
            g(&self.smuggles_refused),
            g(&self.smuggles_other),
            g(&self.quic_garbage),
            g(&self.quic_halfopen),
            g(&self.quic_errors),
            g(&self.connect_errors),
        )
    }
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// Asks for the 10 MB file and never reads; after the send timeout (plus a margin) drains
/// what the kernel buffered and checks that the server closed the connection.
async fn non_reading_h1(addr: SocketAddr, tls: Option<Arc<rustls::ClientConfig>>, h: &Hostile) {
    loop {
        let sock = TcpSocket::new_v4().unwrap();
        // a small receive buffer: the 10 MB must not fit in the socket buffers
        let _ = sock.set_recv_buffer_size(64 << 10);
        let tcp = match sock.connect(addr).await {
            Ok(t) => t,
            Err(_) => {
                h.connect_errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let mut s: Box<dyn Io> = match &tls {
            None => Box::new(tcp),
            Some(cfg) => {
                match tokio_rustls::TlsConnector::from(cfg.clone())
                    .connect(localhost(), tcp)
                    .await
                {
                    Ok(t) => Box::new(t),
                    Err(_) => {
                        h.connect_errors.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                }
            }
        };
        if s.write_all(b"GET /big HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .await
            .is_err()
        {
            h.connect_errors.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        h.h1_stalled.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(SEND_TIMEOUT + Duration::from_secs(2)).await;
        let mut n = 0u64;
        let mut buf = vec![0u8; 1 << 16];
        let ended = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(k) => n += k as u64,
                }
            }
        })
        .await;
        if ended.is_ok() && n < BIG {
            h.h1_cut.fetch_add(1, Ordering::Relaxed);
        } else {
            h.h1_not_cut.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// 64 streams for the 10 MB file with an initial window of 0; waits for the server to reset
/// them and close the connection, then reconnects.
async fn zero_window_h2(addr: SocketAddr, cfg: Arc<rustls::ClientConfig>, h: &Hostile) {
    loop {
        let Ok(mut tls) = tls_connect(addr, &cfg).await else {
            h.connect_errors.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut out = hello(&[(0x4, 0)]);
        for i in 0..64u32 {
            out.extend(get(1 + 2 * i, "/big"));
        }
        if tls.write_all(&out).await.is_err() {
            h.connect_errors.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        h.h2_zero_window_conns.fetch_add(1, Ordering::Relaxed);
        let seen = read_frames(&mut tls, SEND_TIMEOUT * 3).await;
        if seen.eof {
            h.h2_zero_window_closed.fetch_add(1, Ordering::Relaxed);
        } else {
            h.h2_zero_window_open.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Bursts of 3000 PINGs, SETTINGS or WINDOW_UPDATEs (in turn) on a fresh connection; expects
/// GOAWAY ENHANCE_YOUR_CALM.
async fn control_flood(addr: SocketAddr, cfg: Arc<rustls::ClientConfig>, h: &Hostile) {
    let kinds = [
        frame(0x6, 0, 0, &[7; 8]),
        frame(0x4, 0, 0, &[]),
        frame(0x8, 0, 0, &1u32.to_be_bytes()),
    ];
    for round in 0.. {
        let Ok(tls) = tls_connect(addr, &cfg).await else {
            h.connect_errors.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut burst = hello(&[]);
        for _ in 0..3000 {
            burst.extend_from_slice(&kinds[round % kinds.len()]);
        }
        let (mut rd, mut wr) = tokio::io::split(tls);
        let reader =
            tokio::spawn(async move { read_frames(&mut rd, Duration::from_secs(10)).await });
        let _ = wr.write_all(&burst).await;
        let seen = reader.await.unwrap();
        h.floods.fetch_add(1, Ordering::Relaxed);
        if seen.goaway == Some(0xb) && seen.eof {
            h.floods_calmed.fetch_add(1, Ordering::Relaxed);
        } else {
            h.floods_other.fetch_add(1, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A real ClientHello then close; a TCP connect with a few bytes then close; a bare TCP
/// connect and close: in turn, 50 a second.
async fn vanish(https: SocketAddr, http: SocketAddr, cfg: Arc<rustls::ClientConfig>, h: &Hostile) {
    for round in 0u64.. {
        let target = if round % 3 == 2 { http } else { https };
        if let Ok(mut s) = TcpStream::connect(target).await {
            match round % 3 {
                0 => {
                    let mut conn = rustls::ClientConnection::new(cfg.clone(), localhost())
                        .expect("client connection");
                    let mut ch = Vec::new();
                    while conn.wants_write() {
                        conn.write_tls(&mut ch).unwrap();
                    }
                    let _ = s.write_all(&ch).await;
                }
                1 => {
                    let _ = s.write_all(b"\x16\x03\x01\x00").await;
                }
                _ => {
                    let _ = s.write_all(b"GET /sm").await;
                }
            }
            drop(s);
            h.vanished.fetch_add(1, Ordering::Relaxed);
        } else {
            h.connect_errors.fetch_add(1, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Starts downloading the 10 MB file, reads about 1 MB, drops the response (HTTP/1.1: the
/// connection is closed; HTTP/2: the stream is reset).
async fn abort_mid_response(url: String, c: reqwest::Client, h: &Hostile) {
    loop {
        let ok = async {
            let mut r = c.get(&url).send().await.ok()?;
            let mut n = 0;
            while n < 1 << 20 {
                n += r.chunk().await.ok()??.len();
            }
            Some(())
        }
        .await;
        h.aborts.fetch_add(1, Ordering::Relaxed);
        if ok.is_none() {
            h.abort_errors.fetch_add(1, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A head sent a byte a second (plain or TLS); counts the connections the server cut (at
/// `header_read_timeout`), then reconnects.
async fn slowloris(addr: SocketAddr, tls: Option<Arc<rustls::ClientConfig>>, h: &Hostile) {
    loop {
        let Ok(tcp) = TcpStream::connect(addr).await else {
            h.connect_errors.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let s: Box<dyn Io> = match &tls {
            None => Box::new(tcp),
            Some(cfg) => match tokio_rustls::TlsConnector::from(cfg.clone())
                .connect(localhost(), tcp)
                .await
            {
                Ok(t) => Box::new(t),
                Err(_) => {
                    h.connect_errors.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        h.slowloris.fetch_add(1, Ordering::Relaxed);
        let (mut rd, mut wr) = tokio::io::split(s);
        let drip = async {
            let _ = wr
                .write_all(b"GET /small HTTP/1.1\r\nHost: localhost\r\nX-a: ")
                .await;
            for _ in 0..120 {
                tokio::time::sleep(Duration::from_secs(1)).await;
                if wr.write_all(b"a").await.is_err() {
                    return;
                }
            }
        };
        let mut buf = [0u8; 1024];
        let closed = async {
            loop {
                match rd.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        };
        tokio::select! {
            _ = closed => { h.slowloris_cut.fetch_add(1, Ordering::Relaxed); }
            _ = drip => {}
        }
    }
}

/// Bursts of 2000 HEADERS + RST_STREAM pairs (CVE-2023-44487) on a fresh connection; expects
/// GOAWAY ENHANCE_YOUR_CALM, then pauses 200 ms.
async fn rapid_reset(addr: SocketAddr, cfg: Arc<rustls::ClientConfig>, h: &Hostile) {
    loop {
        let Ok(tls) = tls_connect(addr, &cfg).await else {
            h.connect_errors.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut burst = hello(&[]);
        for i in 0..2000u32 {
            let id = 1 + 2 * i;
            burst.extend(get(id, "/small"));
            burst.extend(frame(0x3, 0, id, &8u32.to_be_bytes()));
        }
        let (mut rd, mut wr) = tokio::io::split(tls);
        let reader =
            tokio::spawn(async move { read_frames(&mut rd, Duration::from_secs(10)).await });
        let _ = wr.write_all(&burst).await;
        let seen = reader.await.ok();
        h.rapid_resets.fetch_add(1, Ordering::Relaxed);
        if seen.is_some_and(|s| s.goaway == Some(0xb)) {
            h.rapid_resets_calmed.fetch_add(1, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// PINGs at 800 a second (under `h2_control_frames_per_second`'s 1000: never calmed), on one
/// HTTP/2 connection that reads their ACKs; reconnects when the server ends it (it is idle:
/// `keepalive_timeout`).
async fn ping_flood(addr: SocketAddr, cfg: Arc<rustls::ClientConfig>, h: &Hostile) {
    loop {
        let Ok(tls) = tls_connect(addr, &cfg).await else {
            h.connect_errors.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        h.ping_conns.fetch_add(1, Ordering::Relaxed);
        let (mut rd, mut wr) = tokio::io::split(tls);
        let reader = async {
            let mut buf = vec![0u8; 16 << 10];
            loop {
                match rd.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        };
        let writer = async {
            if wr.write_all(&hello(&[])).await.is_err() {
                return;
            }
            let ping = frame(0x6, 0, 0, &[7; 8]);
            let batch: Vec<u8> = ping.iter().copied().cycle().take(ping.len() * 8).collect();
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            loop {
                tick.tick().await;
                if wr.write_all(&batch).await.is_err() {
                    return;
                }
                h.pings.fetch_add(8, Ordering::Relaxed);
            }
        };
        tokio::select! { _ = reader => {}, _ = writer => {} }
    }
}

/// Request smuggling attempts over plain HTTP/1.1, one per fresh connection, 20 a second: each
/// frames its body two ways (CL and TE, obfuscated TE, two lengths, bare LF in a chunk line).
async fn smuggle(addr: SocketAddr, h: &Hostile) {
    const ATTEMPTS: [&[u8]; 6] = [
        b"POST /small HTTP/1.1\r\nHost: l\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /big HTTP/1.1\r\n\r\n",
        b"POST /small HTTP/1.1\r\nHost: l\r\nTransfer-Encoding: xchunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"POST /small HTTP/1.1\r\nHost: l\r\nContent-Length: 5\r\nContent-Length: 40\r\n\r\nhello",
        b"POST /small HTTP/1.1\r\nHost: l\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n",
        b"GET /small HTTP/1.1\r\nHost: l\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
        b"POST /small HTTP/1.1\r\nHost: l\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
    ];
    for round in 0usize.. {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let Ok(mut s) = TcpStream::connect(addr).await else {
            h.connect_errors.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        h.smuggles.fetch_add(1, Ordering::Relaxed);
        if s.write_all(ATTEMPTS[round % ATTEMPTS.len()]).await.is_err() {
            continue;
        }
        let mut head = [0u8; 12];
        let got = tokio::time::timeout(Duration::from_secs(2), s.read_exact(&mut head)).await;
        if matches!(got, Ok(Ok(_))) && head.starts_with(b"HTTP/1.1 4") {
            h.smuggles_refused.fetch_add(1, Ordering::Relaxed);
        } else {
            h.smuggles_other.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The hostile classes `QWEB_SOAK_HOSTILE` (a comma-separated list) may name; all by default.
/// (`abort` is `abort_h1` and `abort_h2`; `quic` is `quic_garbage` and `quic_halfopen`).
pub const HOSTILE_CLASSES: [&str; 12] = [
    "nonread",
    "zerowindow",
    "flood",
    "vanish",
    "abort_h1",
    "abort_h2",
    "slowloris",
    "rapid_reset",
    "ping_flood",
    "smuggle",
    "quic_garbage",
    "quic_halfopen",
];

/// Which hostile classes run: `QWEB_SOAK_HOSTILE=nonread,flood` runs only those two (to see
/// which one costs the normal clients what); unset or `all`: every class.
pub fn hostile_classes() -> Vec<&'static str> {
    match std::env::var("QWEB_SOAK_HOSTILE") {
        Ok(v) if v != "all" => {
            let want: Vec<&str> = v
                .split(',')
                .map(str::trim)
                .flat_map(|c| match c {
                    "abort" => vec!["abort_h1", "abort_h2"],
                    "quic" => vec!["quic_garbage", "quic_halfopen"],
                    c => vec![c],
                })
                .collect();
            for w in &want {
                assert!(
                    HOSTILE_CLASSES.contains(w),
                    "QWEB_SOAK_HOSTILE: unknown class {w:?}; known: {HOSTILE_CLASSES:?}"
                );
            }
            HOSTILE_CLASSES
                .into_iter()
                .filter(|c| want.contains(c))
                .collect()
        }
        _ => HOSTILE_CLASSES.to_vec(),
    }
}

/// Nice value of the hostile clients' thread (`QWEB_SOAK_HOSTILE_NICE`, default 19). The
/// attackers share the server's two cores here; in the field their CPU is theirs. At the lowest
/// priority their own TLS and framing work does not delay the normal clients' threads, so the
/// normal clients' latency measures what qweb's handling of the attack costs them. `0` runs
/// them at the normal clients' priority.
pub fn hostile_nice() -> i32 {
    std::env::var("QWEB_SOAK_HOSTILE_NICE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(19)
}

/// Garbage datagrams a second (`QWEB_SOAK_QUIC_RATE`, default 5000) and half-open QUIC
/// handshakes a second (`QWEB_SOAK_HALFOPEN_RATE`, default 20).
fn quic_rates() -> (u64, u64) {
    (
        super::env_u64("QWEB_SOAK_QUIC_RATE", 5000),
        super::env_u64("QWEB_SOAK_HALFOPEN_RATE", 20),
    )
}

/// Starts every hostile client of the chosen classes on a runtime of its own (one thread, at
/// [`hostile_nice`], so that the hostile clients' work does not queue up in front of the normal
/// clients' tasks); they run until the runtime is shut down.
pub fn start_hostile(s: &Server, h: &Arc<Hostile>, classes: &[&str]) -> tokio::runtime::Runtime {
    let nice = hostile_nice();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .on_thread_start(move || {
            // SAFETY: setpriority(2) on the calling thread (who = 0: on Linux the nice value
            // is per thread); no memory is passed.
            let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) };
            assert_eq!(rc, 0, "setpriority({nice}) for the hostile thread failed");
        })
        .enable_all()
        .build()
        .unwrap();
    let on = |c: &str| classes.contains(&c);
    let h1 = Arc::new(tls_config(&s.cert, Proto::H1));
    let h2 = Arc::new(tls_config(&s.cert, Proto::H2));
    // 8 non-reading HTTP/1.1 clients: 4 plain, 4 over TLS
    for i in (0..8).filter(|_| on("nonread")) {
        let (h, addr) = (h.clone(), if i % 2 == 0 { s.http } else { s.https });
        let tls = (i % 2 == 1).then(|| h1.clone());
        rt.spawn(async move { non_reading_h1(addr, tls, &h).await });
    }
    // 4 zero-window HTTP/2 connections of 64 streams each
    for _ in (0..4).filter(|_| on("zerowindow")) {
        let (h, cfg, addr) = (h.clone(), h2.clone(), s.https);
        rt.spawn(async move { zero_window_h2(addr, cfg, &h).await });
    }
    // 2 flooders
    for _ in (0..2).filter(|_| on("flood")) {
        let (h, cfg, addr) = (h.clone(), h2.clone(), s.https);
        rt.spawn(async move { control_flood(addr, cfg, &h).await });
    }
    // 1 ClientHello-and-vanish loop
    if on("vanish") {
        let (h, cfg, https, http) = (h.clone(), h1.clone(), s.https, s.http);
        rt.spawn(async move { vanish(https, http, cfg, &h).await });
    }
    // 2 mid-response aborters: one HTTP/1.1, one HTTP/2
    let aborters = [(Proto::H1, "abort_h1"), (Proto::H2, "abort_h2")];
    for (proto, _) in aborters.into_iter().filter(|(_, c)| on(c)) {
        let h = h.clone();
        let c = client(&s.cert, proto);
        let url = format!("https://localhost:{}/big", s.https.port());
        rt.spawn(async move { abort_mid_response(url, c, &h).await });
    }
    start_new_classes(&rt, s, h, classes, (&h1, &h2));
    rt
}

/// The classes added for issue 41's soak: slowloris, rapid reset, PING flood, smuggling, QUIC.
fn start_new_classes(
    rt: &tokio::runtime::Runtime,
    s: &Server,
    h: &Arc<Hostile>,
    classes: &[&str],
    (h1, h2): (&Arc<rustls::ClientConfig>, &Arc<rustls::ClientConfig>),
) {
    let on = |c: &str| classes.contains(&c);
    // 16 slowloris connections: 8 plain, 8 over TLS
    for i in (0..16).filter(|_| on("slowloris")) {
        let (h, addr) = (h.clone(), if i % 2 == 0 { s.http } else { s.https });
        let tls = (i % 2 == 1).then(|| h1.clone());
        rt.spawn(async move { slowloris(addr, tls, &h).await });
    }
    if on("rapid_reset") {
        let (h, cfg, addr) = (h.clone(), h2.clone(), s.https);
        rt.spawn(async move { rapid_reset(addr, cfg, &h).await });
    }
    for _ in (0..2).filter(|_| on("ping_flood")) {
        let (h, cfg, addr) = (h.clone(), h2.clone(), s.https);
        rt.spawn(async move { ping_flood(addr, cfg, &h).await });
    }
    if on("smuggle") {
        let (h, addr) = (h.clone(), s.http);
        rt.spawn(async move { smuggle(addr, &h).await });
    }
    let (garbage_rate, halfopen_rate) = quic_rates();
    if on("quic_garbage") {
        let (h, addr) = (h.clone(), s.https);
        rt.spawn(async move {
            quic::quic_garbage(addr, garbage_rate, &h.quic_garbage, &h.quic_errors).await
        });
    }
    if on("quic_halfopen") {
        let (h, addr) = (h.clone(), s.https);
        let mut cfg = (**h1).clone();
        cfg.alpn_protocols = vec![b"h3".to_vec()];
        let cfg = Arc::new(cfg);
        rt.spawn(async move {
            quic::quic_halfopen(addr, cfg, halfopen_rate, &h.quic_halfopen, &h.quic_errors).await
        });
    }
}
