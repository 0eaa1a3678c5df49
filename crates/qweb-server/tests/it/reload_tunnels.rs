//! WebSocket tunnels across a reload and a shutdown, with a real WebSocket client and
//! upstream (tokio-tungstenite): a reload does not cut a tunnel at `shutdown_timeout` (it
//! goes on up to `upgrade_drain_timeout`), and when a tunnel is ended (that deadline, or a
//! shutdown) both sides get a close frame 1001 (going away), not a bare TCP close (1006).

use qweb_testkit as common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;

/// A WebSocket echo upstream that reports the close code of each close frame it receives.
async fn ws_upstream() -> (SocketAddr, mpsc::UnboundedReceiver<Option<u16>>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(s).await else {
                    return;
                };
                while let Some(Ok(m)) = ws.next().await {
                    if let Message::Close(f) = m {
                        let _ = tx.send(f.map(|f| u16::from(f.code)));
                        return;
                    }
                    if m.is_text() && ws.send(m).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, rx)
}

type Client = tokio_tungstenite::WebSocketStream<TcpStream>;
/// Either kind of client WebSocket (over TCP, or over an HTTP/2 stream).
type Ws<S> = tokio_tungstenite::WebSocketStream<S>;

async fn connect(addr: SocketAddr) -> Client {
    let s = TcpStream::connect(addr).await.unwrap();
    let (ws, resp) = tokio_tungstenite::client_async(format!("ws://{addr}/chat"), s)
        .await
        .expect("websocket handshake through qweb");
    assert_eq!(resp.status(), 101);
    ws
}

async fn echo<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(ws: &mut Ws<S>, text: &str) {
    ws.send(Message::text(text)).await.expect("send");
    let m = tokio::time::timeout(Duration::from_secs(5), ws.next())
        .await
        .expect("an answer")
        .expect("the tunnel is open")
        .expect("a message");
    assert_eq!(m.into_text().unwrap(), text);
}

/// Waits for the close frame qweb sends; its code.
async fn close_code<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    ws: &mut Ws<S>,
    within: Duration,
) -> CloseCode {
    match tokio::time::timeout(within, ws.next()).await {
        Ok(Some(Ok(Message::Close(Some(f))))) => f.code,
        other => panic!("no close frame with a code: {other:?}"),
    }
}

fn start(up: SocketAddr, extra: &str) -> common::TestServer {
    common::start_with(
        &format!("{extra}\n[[route]]\nprefix = \"/\"\nupstreams = [\"{up}\"]\n"),
        |_| {},
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_outlives_a_reloads_shutdown_timeout_then_goes_away_with_1001() {
    let (up, mut closes) = ws_upstream().await;
    let mut t = start(
        up,
        "shutdown_timeout = \"1s\"\nupgrade_drain_timeout = \"3s\"",
    );
    let mut ws = connect(t.addrs[1]).await;
    echo(&mut ws, "before").await;
    let reloaded = Instant::now();
    let config = qweb_server::Config::from_file(&t.dir.path().join("qweb.toml")).unwrap();
    let mut server = t.server.take().unwrap();
    let server = tokio::task::spawn_blocking(move || {
        server.reload(config).unwrap();
        server
    })
    .await
    .unwrap();
    // past the replaced configuration's shutdown_timeout: still open
    tokio::time::sleep_until((reloaded + Duration::from_millis(1500)).into()).await;
    echo(&mut ws, "after shutdown_timeout").await;
    // at upgrade_drain_timeout: a close frame 1001 each way
    assert_eq!(
        close_code(&mut ws, Duration::from_secs(6)).await,
        CloseCode::Away
    );
    let waited = reloaded.elapsed();
    assert!(waited >= Duration::from_millis(2900), "{waited:?}");
    let upstream = tokio::time::timeout(Duration::from_secs(5), closes.recv())
        .await
        .expect("the upstream got a close frame");
    assert_eq!(upstream, Some(Some(1001)));
    tokio::task::spawn_blocking(move || server.shutdown())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_sends_1001_to_both_sides_of_a_websocket() {
    let (up, mut closes) = ws_upstream().await;
    let mut t = start(up, "shutdown_timeout = \"10s\"");
    let mut ws = connect(t.addrs[1]).await;
    echo(&mut ws, "hello").await;
    let server = t.server.take().unwrap();
    let started = Instant::now();
    let stopping = tokio::task::spawn_blocking(move || server.shutdown());
    assert_eq!(
        close_code(&mut ws, Duration::from_secs(5)).await,
        CloseCode::Away
    );
    let upstream = tokio::time::timeout(Duration::from_secs(5), closes.recv())
        .await
        .expect("the upstream got a close frame");
    assert_eq!(upstream, Some(Some(1001)));
    stopping.await.unwrap();
    // at once, not at shutdown_timeout
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

// ---- the same over HTTP/2 (RFC 8441 extended CONNECT) ------------------------------------

/// A WebSocket over an HTTP/2 stream of qweb's TLS listener.
async fn connect_h2(t: &common::TestServer) -> common::ws::H2WebSocket {
    let tls = t.tls(common::Proto::H2).await;
    let (mut sender, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .handshake::<_, http_body_util::Empty<bytes::Bytes>>(hyper_util::rt::TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    common::ws::h2_websocket(&mut sender, "https://localhost/chat").await
}

/// An HTTP/2 WebSocket is a tunnel as an HTTP/1.1 one is: it is not cut as an idle
/// connection at `keepalive_timeout`, a reload keeps it past `shutdown_timeout` until
/// `upgrade_drain_timeout`, and then both sides get a close frame 1001. Before: the
/// connection looked idle once the 200 was sent (cut at `keepalive_timeout`, or at once by a
/// reload's GOAWAY), with no close frame.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_websocket_outlives_keepalive_and_a_reload_then_goes_away_with_1001() {
    let (up, mut closes) = ws_upstream().await;
    let mut t = start(
        up,
        "shutdown_timeout = \"1s\"\nupgrade_drain_timeout = \"3s\"\n\
         [limits]\nkeepalive_timeout = \"1s\"",
    );
    let mut ws = connect_h2(&t).await;
    echo(&mut ws, "before").await;
    // quiet for twice keepalive_timeout: still a tunnel
    tokio::time::sleep(Duration::from_millis(2200)).await;
    echo(&mut ws, "after keepalive_timeout").await;
    let reloaded = Instant::now();
    let config = qweb_server::Config::from_file(&t.dir.path().join("qweb.toml")).unwrap();
    let mut server = t.server.take().unwrap();
    let server = tokio::task::spawn_blocking(move || {
        server.reload(config).unwrap();
        server
    })
    .await
    .unwrap();
    tokio::time::sleep_until((reloaded + Duration::from_millis(1500)).into()).await;
    echo(&mut ws, "after shutdown_timeout").await;
    assert_eq!(
        close_code(&mut ws, Duration::from_secs(6)).await,
        CloseCode::Away
    );
    let waited = reloaded.elapsed();
    assert!(waited >= Duration::from_millis(2900), "{waited:?}");
    let upstream = tokio::time::timeout(Duration::from_secs(5), closes.recv())
        .await
        .expect("the upstream got a close frame");
    assert_eq!(upstream, Some(Some(1001)));
    tokio::task::spawn_blocking(move || server.shutdown())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_sends_1001_to_both_sides_of_an_http2_websocket() {
    let (up, mut closes) = ws_upstream().await;
    let mut t = start(up, "shutdown_timeout = \"10s\"");
    let mut ws = connect_h2(&t).await;
    echo(&mut ws, "hello").await;
    let server = t.server.take().unwrap();
    let started = Instant::now();
    let stopping = tokio::task::spawn_blocking(move || server.shutdown());
    assert_eq!(
        close_code(&mut ws, Duration::from_secs(5)).await,
        CloseCode::Away
    );
    let upstream = tokio::time::timeout(Duration::from_secs(5), closes.recv())
        .await
        .expect("the upstream got a close frame");
    assert_eq!(upstream, Some(Some(1001)));
    stopping.await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}
