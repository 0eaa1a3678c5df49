//! An HTTP/2 client (the `h2` crate's) for tests: a handshake over any transport, its
//! connection driven on the test's runtime, and one GET that reads the whole answer.

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};

/// The HTTP/2 handshake over `io` (a TLS stream with ALPN h2, or an in-memory pipe); the
/// connection runs in a task of its own until either side ends it.
pub async fn handshake<T>(io: T) -> h2::client::SendRequest<Bytes>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (send, conn) = h2::client::handshake(io)
        .await
        .expect("the HTTP/2 handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    send
}

/// `GET https://localhost{path}` with `headers` on a new stream: the status, the body and the
/// trailers (empty when none came).
pub async fn get(
    send: &h2::client::SendRequest<Bytes>,
    path: &str,
    headers: &[(&str, &str)],
) -> (http::StatusCode, Vec<u8>, http::HeaderMap) {
    let mut req = http::Request::builder().uri(format!("https://localhost{path}"));
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    let req = req.body(()).expect("a request");
    let mut send = send.clone().ready().await.expect("a stream");
    let (resp, _) = send.send_request(req, true).expect("sent");
    let resp = tokio::time::timeout(std::time::Duration::from_secs(10), resp)
        .await
        .expect("an answer within 10 s")
        .expect("a response");
    let status = resp.status();
    let mut body = resp.into_body();
    let mut got = Vec::new();
    while let Some(d) = body.data().await {
        let d = d.expect("data");
        let _ = body.flow_control().release_capacity(d.len());
        got.extend_from_slice(&d);
    }
    let trailers = body.trailers().await.ok().flatten().unwrap_or_default();
    (status, got, trailers)
}
