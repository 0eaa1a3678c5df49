//! A plain HTTP request on a TLS port gets nginx's answer, a 400 page saying so, instead of a
//! TLS alert the client cannot show. A TLS connection starts with a handshake record (byte
//! `0x16`); an HTTP/1 request starts with a method token (ASCII letters).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The page, as nginx words it.
const PAGE: &str = "<html>\r\n<head><title>400 The plain HTTP request was sent to HTTPS port</title></head>\r\n<body>\r\n<center><h1>400 Bad Request</h1></center>\r\n<center>The plain HTTP request was sent to HTTPS port</center>\r\n<hr><center>qweb</center>\r\n</body>\r\n</html>\r\n";

/// Most bytes of the request read before answering (the rest is not waited for).
const MAX_HEAD: usize = 16 * 1024;

/// Does the connection start with plain HTTP? Waits for its first byte (bounded by the
/// caller's handshake timeout).
pub(crate) async fn starts_with_plain_http(stream: &TcpStream) -> bool {
    let mut first = [0u8; 1];
    match stream.peek(&mut first).await {
        Ok(1) => first[0].is_ascii_uppercase(),
        _ => false,
    }
}

/// Reads the request head (so that closing does not reset the connection before the client
/// read the answer), answers 400 with the page and closes.
pub(crate) async fn answer(mut stream: TcpStream) {
    let mut head = Vec::new();
    let mut buf = [0u8; 2048];
    let read = async {
        while head.len() < MAX_HEAD && !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), read).await;
    let response = format!(
        "HTTP/1.1 400 Bad Request\r\nServer: qweb\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{PAGE}",
        PAGE.len()
    );
    let write = async {
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), write).await;
}
