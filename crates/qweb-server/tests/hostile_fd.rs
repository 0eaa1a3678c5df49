//! HTTP/2 clients that never read cannot take qweb's file descriptors: a streamed static file
//! (or precompressed sidecar) holds an open file between frames only within its worker's
//! `file_cache.held_fds`; the others are closed and opened again (the same file, or the
//! stream ends) when their client takes more. Real TLS, the `h2` crate's client with a
//! stream window of 0.

use qweb_testkit as common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::net::TcpStream;
use tokio::sync::oneshot;

/// The tests here count the process's file descriptors: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// `len` bytes that differ from one offset to the next (a misplaced chunk shows).
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i % 251) as u8).wrapping_add(seed).wrapping_mul(7))
        .collect()
}

/// An HTTP/2 connection over TLS whose streams get no window (SETTINGS_INITIAL_WINDOW_SIZE
/// 0) until `open` is sent, when every stream's window becomes 16 MiB.
struct Stalled {
    send: h2::client::SendRequest<Bytes>,
    open: Option<oneshot::Sender<()>>,
}

async fn stalled_conn(t: &common::TestServer) -> Stalled {
    let cfg = common::tls_client_config(&t.cert(), common::Proto::H2);
    let tcp = TcpStream::connect(t.addrs[0]).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(
            rustls::pki_types::ServerName::try_from("localhost").unwrap(),
            tcp,
        )
        .await
        .unwrap();
    let (send, mut conn) = h2::client::Builder::new()
        .initial_window_size(0)
        .initial_connection_window_size(64 << 20)
        .max_concurrent_reset_streams(0)
        .handshake::<_, Bytes>(tls)
        .await
        .unwrap();
    let (open, opened) = oneshot::channel::<()>();
    tokio::spawn(async move {
        tokio::select! {
            r = &mut conn => { let _ = r; return; }
            _ = opened => {}
        }
        conn.set_initial_window_size(16 << 20).unwrap();
        let _ = conn.await;
    });
    Stalled {
        send,
        open: Some(open),
    }
}

impl Stalled {
    /// `GET path` (with `accept-encoding`), its response head once it came.
    async fn get(&mut self, path: &str, ae: &str) -> http::Response<h2::RecvStream> {
        let req = http::Request::get(format!("https://localhost{path}"))
            .header("accept-encoding", ae)
            .body(())
            .unwrap();
        self.send = self.send.clone().ready().await.unwrap();
        let (resp, _) = self.send.send_request(req, true).unwrap();
        resp.await.unwrap()
    }

    fn open_windows(&mut self) {
        if let Some(o) = self.open.take() {
            let _ = o.send(());
        }
    }
}

/// A body read to its end (window released as it is read), or the error that ended it, with
/// what came before.
async fn read_body(mut body: h2::RecvStream) -> (Vec<u8>, Option<h2::Error>) {
    let mut out = Vec::new();
    while let Some(d) = body.data().await {
        match d {
            Ok(d) => {
                let _ = body.flow_control().release_capacity(d.len());
                out.extend_from_slice(&d);
            }
            Err(e) => return (out, Some(e)),
        }
    }
    (out, None)
}

/// 4 connections x 64 streams (half a 1 MiB file, half its 600 KiB gzip sidecar) whose client
/// grants no window: while they stall, qweb holds at most `held_fds` (16) files, not 256;
/// another client is served meanwhile; once the windows open, every stream completes with
/// the right bytes (the files whose fds were closed are opened again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_window_streams_hold_at_most_the_workers_budget_of_fds() {
    let _serial = SERIAL.lock().await;
    let big = pattern(1 << 20, 1);
    let gz = pattern(600 << 10, 2);
    let t = common::start_with(
        "[limits]\nsend_timeout = \"60s\"\n[file_cache]\nheld_fds = 16\n\
         [compression]\nmin_size = 0\n",
        |dir| {
            std::fs::write(dir.join("site/big.txt"), &big).unwrap();
            // written after: at least as new as the original
            std::fs::write(dir.join("site/big.txt.gz"), &gz).unwrap();
        },
    );
    let baseline = open_fds();
    let (conns, streams) = (4, 64);
    let mut stalled = Vec::new();
    let mut bodies = Vec::new();
    for _ in 0..conns {
        let mut c = stalled_conn(&t).await;
        for i in 0..streams {
            let (path, ae) = if i % 2 == 0 {
                ("/big.txt", "identity")
            } else {
                ("/big.txt", "gzip")
            };
            let r = c.get(path, ae).await;
            assert_eq!(r.status(), 200);
            let sidecar = r.headers().get("content-encoding").is_some();
            assert_eq!(sidecar, ae == "gzip", "{:?}", r.headers());
            bodies.push((sidecar, r.into_body()));
        }
        stalled.push(c);
    }
    // every response head is in (hyper read the first chunk of each and waits for window)
    let fds = open_fds();
    // client and server side of each connection, the budget, and some slack (the
    // runtime's and the test harness's own)
    let bound = baseline + 2 * conns + 16 + 16;
    eprintln!(
        "fds: baseline {baseline}, {conns} x {streams} stalled streams: {fds} (bound {bound})"
    );
    assert!(
        fds <= bound,
        "{fds} fds with {} stalled streams > {bound}",
        conns * streams
    );

    // another client is served, a large file included
    let c = common::client(&t.cert(), common::Proto::H2);
    let r = c
        .get(format!("{}/big.txt", t.https()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.bytes().await.unwrap() == big);
    assert!(open_fds() <= bound + 2);

    // the windows open: every stream completes, with the right content
    for c in &mut stalled {
        c.open_windows();
    }
    let mut readers = Vec::new();
    for (sidecar, body) in bodies {
        readers.push(tokio::spawn(
            async move { (sidecar, read_body(body).await) },
        ));
    }
    for r in readers {
        let (sidecar, (got, err)) = r.await.unwrap();
        assert!(err.is_none(), "{err:?}");
        let want = if sidecar { &gz } else { &big };
        assert!(got == *want, "{} bytes, want {}", got.len(), want.len());
    }
}

/// A file rewritten in place while its stream waits for window: the stream's fd was closed
/// (`held_fds = 0`), and when the client takes more the file opened again is not the file
/// the response began with, so the stream is reset: the client gets a prefix of the old
/// content, never a byte of the new. (A file held open and rewritten in place would send the
/// new bytes after the old, as before.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_rewritten_between_frames_of_a_reopened_stream_is_not_sent() {
    let _serial = SERIAL.lock().await;
    let old = pattern(512 << 10, 3);
    let new = vec![b'N'; 512 << 10];
    let t = common::start_with("[file_cache]\nheld_fds = 0\n", |dir| {
        std::fs::write(dir.join("site/f.bin"), &old).unwrap();
    });
    let mut c = stalled_conn(&t).await;
    let r = c.get("/f.bin", "identity").await;
    assert_eq!(r.status(), 200);
    // same size, rewritten in place (the same inode), with another modification time
    let path = t.site().join("f.bin");
    std::fs::write(&path, &new).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_modified(std::time::SystemTime::now() + Duration::from_secs(10))
        .unwrap();
    drop(f);
    c.open_windows();
    let (got, err) = tokio::time::timeout(Duration::from_secs(10), read_body(r.into_body()))
        .await
        .expect("the stream neither ended nor was reset");
    assert!(
        err.is_some(),
        "the stream ended normally with {} bytes",
        got.len()
    );
    assert!(got.len() < old.len());
    assert_eq!(
        &got[..],
        &old[..got.len()],
        "bytes other than the old file's were sent"
    );
}
