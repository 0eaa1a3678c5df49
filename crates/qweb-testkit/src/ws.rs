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
