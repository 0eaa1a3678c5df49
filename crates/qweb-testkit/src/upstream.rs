//! A real upstream HTTP/1.1 server (hyper) for proxy tests.
//!
//! Paths:
//! - `/echo...`: 200, body = the request body; headers `x-up-method`, `x-up-uri`, and
//!   `x-up-h-<name>` for each request header received.
//! - `/slow/<ms>`: waits, then 200 "slow".
//! - `/stream/<n>/<ms>`: n chunks `"chunk<i>\n"`, one every ms, no Content-Length.
//! - `/big/<bytes>`: that many bytes of a repeating pattern.
//! - `/hop`: a response carrying hop-by-hop headers (and `Server: upstream`).
//! - `/gate`: sends "first\n", then waits until the test calls `gate.notify_one()`, then
//!   sends "second\n" (shows that a response is streamed, not buffered).
//! - `/text/<bytes>`: that many bytes of [`text`], `text/plain`, with a length.
//! - `/rand/<bytes>`: that many bytes of [`random`], `text/plain` (incompressible "text").
//! - `/textstream/<pieces>/<bytes>/<ms>`: [`text`] of pieces x bytes, sent one piece every
//!   ms, `text/plain`, no length.
//! - `/gatetext`: `text/plain` "first line\n", then waits for the gate, then
//!   "second line\n" (a streamed response that pauses).
//! - `/encoded`: `text/plain` with `Content-Encoding: gzip` (already encoded; the bytes are
//!   [`ENCODED`]).
//! - `/png/<bytes>`: `image/png`, that many bytes of [`text`].
//! - `/sse/<n>/<ms>`: `text/event-stream`, n events `data: event <i> ...` (with some text),
//!   one every ms.
//! - `/trailers`: `text/plain` "body\n" in two pieces, chunked, announcing (`Trailer`) and
//!   sending the trailer fields `x-checksum: abc123` and `x-status: done` (hyper sends them
//!   only when the request said `TE: trailers`).
//! - anything else: 200 with body `up:<name>:<path>`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

type UpBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// A running upstream.
pub struct Upstream {
    pub addr: SocketAddr,
    /// Connections accepted so far (to observe keep-alive reuse).
    pub connections: Arc<AtomicUsize>,
    /// Releases the second half of `/gate`.
    pub gate: Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub use crate::corpus::{pattern, random, text, ENCODED};

/// Starts the upstream; `name` is in its default answer (`up:<name>:<path>`).
pub async fn start(name: &'static str) -> Upstream {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let connections = Arc::new(AtomicUsize::new(0));
    let counter = connections.clone();
    let gate = Arc::new(tokio::sync::Notify::new());
    let g = gate.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            counter.fetch_add(1, Ordering::SeqCst);
            let g = g.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| handle(name, req, g.clone()));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Upstream {
        addr,
        connections,
        gate,
        task,
    }
}

fn full(b: impl Into<Bytes>) -> UpBody {
    Full::new(b.into()).boxed()
}

type FrameTx = tokio::sync::mpsc::Sender<Result<Frame<Bytes>, Infallible>>;

/// A body fed through the returned sender (one frame buffered); it ends when the sender is
/// dropped.
fn channel_body() -> (FrameTx, UpBody) {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(1);
    let stream =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|x| (x, rx)) });
    (tx, StreamBody::new(stream).boxed())
}

/// `first`, then `second` once `gate` is notified.
fn gated(gate: Arc<tokio::sync::Notify>, first: &'static str, second: &'static str) -> UpBody {
    let (tx, body) = channel_body();
    tokio::spawn(async move {
        let _ = tx.send(Ok(Frame::data(Bytes::from(first)))).await;
        gate.notified().await;
        let _ = tx.send(Ok(Frame::data(Bytes::from(second)))).await;
    });
    body
}

/// `pieces` of `size` bytes each, `ms` apart.
fn paced(pieces: Vec<Bytes>, ms: u64) -> UpBody {
    let (tx, body) = channel_body();
    tokio::spawn(async move {
        for piece in pieces {
            if tx.send(Ok(Frame::data(piece))).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    });
    body
}

fn text_plain(body: UpBody) -> Response<UpBody> {
    Response::builder()
        .header("content-type", "text/plain")
        .body(body)
        .expect("resp")
}

/// The streamed answers: `/stream/N/MS`, `/gate`, `/textstream/PIECES/SIZE/MS`, `/gatetext`,
/// `/sse/N/MS`, `/trailers`.
fn streamed(parts: &[&str], gate: Arc<tokio::sync::Notify>) -> Option<Response<UpBody>> {
    Some(match parts {
        ["stream", n, ms] => {
            let n: usize = n.parse().unwrap_or(3);
            let chunks = (0..n).map(|i| Bytes::from(format!("chunk{i}\n"))).collect();
            Response::new(paced(chunks, ms.parse().unwrap_or(100)))
        }
        ["gate"] => Response::new(gated(gate, "first\n", "second\n")),
        ["textstream", pieces, size, ms] => {
            let (pieces, size): (usize, usize) =
                (pieces.parse().unwrap_or(1), size.parse().unwrap_or(1));
            let all = Bytes::from(text(pieces * size));
            let chunks = (0..pieces)
                .map(|i| all.slice(i * size..(i + 1) * size))
                .collect();
            text_plain(paced(chunks, ms.parse().unwrap_or(10)))
        }
        ["gatetext"] => text_plain(gated(gate, "first line\n", "second line\n")),
        ["sse", n, ms] => {
            let n: usize = n.parse().unwrap_or(3);
            let ms: u64 = ms.parse().unwrap_or(50);
            let stream = futures_util::stream::unfold(0usize, move |i| async move {
                if i == n {
                    return None;
                }
                if i > 0 {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
                let words = String::from_utf8_lossy(&text(300)).replace('\n', " ");
                let event = format!("data: event {i} {words}\n\n");
                Some((Ok::<_, Infallible>(Frame::data(Bytes::from(event))), i + 1))
            });
            Response::builder()
                .header("content-type", "text/event-stream")
                .header("cache-control", "no-cache")
                .body(StreamBody::new(stream).boxed())
                .expect("resp")
        }
        ["trailers"] => {
            let mut t = hyper::HeaderMap::new();
            t.insert(
                "x-checksum",
                hyper::header::HeaderValue::from_static("abc123"),
            );
            t.insert("x-status", hyper::header::HeaderValue::from_static("done"));
            let frames = vec![
                Ok::<_, Infallible>(Frame::data(Bytes::from("bo"))),
                Ok(Frame::data(Bytes::from("dy\n"))),
                Ok(Frame::trailers(t)),
            ];
            let mut r = text_plain(StreamBody::new(futures_util::stream::iter(frames)).boxed());
            r.headers_mut().insert(
                "trailer",
                hyper::header::HeaderValue::from_static("x-checksum, x-status"),
            );
            r
        }
        _ => return None,
    })
}

async fn handle(
    name: &'static str,
    req: Request<Incoming>,
    gate: Arc<tokio::sync::Notify>,
) -> Result<Response<UpBody>, Infallible> {
    let path = req.uri().path().to_owned();
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    if !parts.contains(&"echo") {
        if let Some(r) = streamed(&parts, gate) {
            return Ok(r);
        }
    }
    let resp = match parts.as_slice() {
        _ if parts.contains(&"echo") => {
            let mut b = Response::builder()
                .header("x-up-method", req.method().as_str())
                .header("x-up-uri", req.uri().to_string());
            for (k, v) in req.headers() {
                b = b.header(format!("x-up-h-{k}"), v.clone());
            }
            let body = req
                .into_body()
                .collect()
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            b.body(full(body)).expect("resp")
        }
        ["slow", ms] => {
            tokio::time::sleep(Duration::from_millis(ms.parse().unwrap_or(1000))).await;
            Response::new(full("slow"))
        }
        ["big", n] => {
            let n: usize = n.parse().unwrap_or(0);
            let body: Vec<u8> = (0..n).map(pattern).collect();
            Response::new(full(body))
        }
        ["text", n] => Response::builder()
            .header("content-type", "text/plain; charset=utf-8")
            .body(full(text(n.parse().unwrap_or(0))))
            .expect("resp"),
        ["rand", n] => Response::builder()
            .header("content-type", "text/plain")
            .body(full(random(n.parse().unwrap_or(0), 99)))
            .expect("resp"),
        ["png", n] => Response::builder()
            .header("content-type", "image/png")
            .body(full(text(n.parse().unwrap_or(0))))
            .expect("resp"),
        ["encoded"] => Response::builder()
            .header("content-type", "text/plain")
            .header("content-encoding", "gzip")
            .body(full(ENCODED))
            .expect("resp"),
        ["hop"] => Response::builder()
            .header("connection", "x-secret, keep-alive")
            .header("x-secret", "hop")
            .header("keep-alive", "timeout=5")
            .header("x-kept", "yes")
            .header("server", "upstream")
            .body(full("hop"))
            .expect("resp"),
        _ => Response::new(full(format!("up:{name}:{path}"))),
    };
    Ok(resp)
}
