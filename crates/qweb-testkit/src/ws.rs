//! A real WebSocket echo upstream (tokio-tungstenite).

use std::net::SocketAddr;

use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpListener;

/// A WebSocket echo server: every text or binary message comes back as sent.
pub async fn ws_echo() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(s).await else {
                    return;
                };
                while let Some(Ok(m)) = ws.next().await {
                    if m.is_text() || m.is_binary() {
                        if ws.send(m).await.is_err() {
                            return;
                        }
                    } else if m.is_close() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A WebSocket over an HTTP/2 stream (RFC 8441).
pub type H2WebSocket =
    tokio_tungstenite::WebSocketStream<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>>;

/// An extended CONNECT for `uri` with `:protocol = protocol` (RFC 8441).
pub fn extended_connect(
    uri: &str,
    protocol: &'static str,
) -> hyper::Request<http_body_util::Empty<bytes::Bytes>> {
    let mut req = hyper::Request::builder()
        .method("CONNECT")
        .uri(uri)
        .header("sec-websocket-version", "13")
        .body(http_body_util::Empty::new())
        .expect("request");
    req.extensions_mut()
        .insert(hyper::ext::Protocol::from_static(protocol));
    req
}

/// Opens a WebSocket to `uri` on the HTTP/2 connection `sender` (the answer must be 200).
pub async fn h2_websocket(
    sender: &mut hyper::client::conn::http2::SendRequest<http_body_util::Empty<bytes::Bytes>>,
    uri: &str,
) -> H2WebSocket {
    let mut resp = sender
        .send_request(extended_connect(uri, "websocket"))
        .await
        .expect("an answer to the extended CONNECT");
    assert_eq!(resp.status(), 200, "{resp:?}");
    let stream = hyper::upgrade::on(&mut resp).await.expect("the stream");
    tokio_tungstenite::WebSocketStream::from_raw_socket(
        hyper_util::rt::TokioIo::new(stream),
        tokio_tungstenite::tungstenite::protocol::Role::Client,
        None,
    )
    .await
}
