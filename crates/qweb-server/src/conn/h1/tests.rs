//! The HTTP/1 driver over in-memory I/O (see `conn/test_kit.rs`), with the clock paused:
//! pipelining, keep-alive decisions, 100-continue, early responses, body framing, drains
//! and every deadline, without a socket (as tokio-rustls' `test_stream.rs` and Pingora's
//! HTTP/1 server tests do).

use std::rc::Rc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::time::Instant;

use super::super::test_kit::{local, parts, Svc, TestHost};
use crate::config::Limits;

/// A connection being served, and the client's end of it.
struct Conn {
    client: DuplexStream,
    host: Rc<TestHost>,
    svc: Rc<Svc>,
    served: tokio::task::JoinHandle<()>,
    buf: Vec<u8>,
}

/// One response as the client read it.
#[derive(Debug)]
struct Resp {
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.head
            .split("\r\n")
            .skip(1)
            .filter_map(|l| l.split_once(':'))
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim())
    }
    fn text(&self) -> &str {
        std::str::from_utf8(&self.body).unwrap_or("<not utf-8>")
    }
}

/// Starts the driver on a new in-memory connection (`pipe`: bytes each direction holds),
/// in the current `LocalSet`.
fn connect(limits: Limits, pipe: usize) -> Conn {
    let (p, client) = parts(limits, pipe);
    let (host, svc) = (p.host.clone(), p.svc.clone());
    let served = tokio::task::spawn_local(async move {
        super::serve(p.io, p.state, &*p.host, p.svc, false).await;
    });
    Conn {
        client,
        host,
        svc,
        served,
        buf: Vec::new(),
    }
}

impl Conn {
    async fn send(&mut self, bytes: &[u8]) {
        self.client
            .write_all(bytes)
            .await
            .expect("the driver reads");
    }

    /// Reads until `buf` holds `n` bytes (`false`: the connection ended first).
    async fn fill(&mut self, n: usize) -> bool {
        while self.buf.len() < n {
            let mut chunk = [0u8; 8192];
            match self.client.read(&mut chunk).await {
                Ok(0) | Err(_) => return false,
                Ok(k) => self.buf.extend_from_slice(&chunk[..k]),
            }
        }
        true
    }

    /// The next response; `head_only`: a HEAD's or a 1xx (no body).
    async fn response_as(&mut self, head_only: bool) -> Option<Resp> {
        let end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let want = self.buf.len() + 1;
            if !self.fill(want).await {
                return None;
            }
        };
        let head = String::from_utf8_lossy(&self.buf[..end]).into_owned();
        self.buf.drain(..end);
        let status = head.split(' ').nth(1)?.parse().ok()?;
        let mut r = Resp {
            status,
            head,
            body: Vec::new(),
        };
        if head_only || status < 200 {
            return Some(r);
        }
        if let Some(n) = r.header("content-length") {
            let n: usize = n.parse().ok()?;
            if !self.fill(n).await {
                return None;
            }
            r.body = self.buf.drain(..n).collect();
        } else if r.header("transfer-encoding") == Some("chunked") {
            loop {
                let line = loop {
                    if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                        break i;
                    }
                    let want = self.buf.len() + 1;
                    if !self.fill(want).await {
                        return None;
                    }
                };
                let size =
                    usize::from_str_radix(std::str::from_utf8(&self.buf[..line]).ok()?.trim(), 16)
                        .ok()?;
                self.buf.drain(..line + 2);
                if !self.fill(size + 2).await {
                    return None;
                }
                r.body.extend(self.buf.drain(..size));
                self.buf.drain(..2);
                if size == 0 {
                    break;
                }
            }
        } else {
            // read to the close
            while self.fill(self.buf.len() + 1).await {}
            r.body = std::mem::take(&mut self.buf);
        }
        Some(r)
    }

    async fn response(&mut self) -> Option<Resp> {
        self.response_as(false).await
    }

    /// `true` when the server ended the connection (end of stream, nothing more sent).
    async fn closed(&mut self) -> bool {
        let more = self.buf.len() + 1;
        !self.fill(more).await && self.buf.is_empty()
    }

    /// The driver's task ended.
    async fn ended(self) -> bool {
        drop(self.client);
        tokio::time::timeout(Duration::from_secs(600), self.served)
            .await
            .is_ok()
    }
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n")
}

#[tokio::test(start_paused = true)]
async fn pipelined_requests_are_answered_in_order_and_the_connection_kept() {
    local(async {
        let mut c = connect(Limits::default(), 64 << 10);
        c.send(format!("{}{}{}", get("/a"), get("/stream"), get("/c")).as_bytes())
            .await;
        for (path, body) in [
            ("/a", "hello"),
            ("/stream", "one two three"),
            ("/c", "hello"),
        ] {
            let r = c.response().await.expect("a response");
            assert_eq!(
                (r.status, r.header("x-path"), r.text()),
                (200, Some(path), body)
            );
            assert_eq!(r.header("connection"), None, "{}", r.head);
        }
        // one more on the same connection, later
        tokio::time::sleep(Duration::from_secs(1)).await;
        c.send(get("/d").as_bytes()).await;
        assert_eq!(c.response().await.expect("kept alive").text(), "hello");
        assert_eq!(c.svc.seen.borrow().len(), 4);
        assert!(c.ended().await, "the client's close ends the driver");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn keep_alive_follows_the_request_and_the_body_framing() {
    local(async {
        // HTTP/1.1 with `Connection: close`: answered, then closed
        let mut c = connect(Limits::default(), 64 << 10);
        c.send(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            .await;
        let r = c.response().await.expect("a response");
        assert_eq!(r.header("connection"), Some("close"));
        assert!(c.closed().await);
        // HTTP/1.0 without keep-alive: a streamed body of unknown length is read to the close
        let mut c = connect(Limits::default(), 64 << 10);
        c.send(b"GET /stream HTTP/1.0\r\n\r\n").await;
        let r = c.response().await.expect("a response");
        assert_eq!(r.header("transfer-encoding"), None, "{}", r.head);
        assert_eq!(r.text(), "one two three");
        // HEAD: the length of the GET, no body, the connection kept
        let mut c = connect(Limits::default(), 64 << 10);
        c.send(b"HEAD /big HTTP/1.1\r\nHost: t\r\n\r\n").await;
        let r = c.response_as(true).await.expect("a response");
        assert_eq!(r.header("content-length"), Some("1048576"));
        c.send(get("/").as_bytes()).await;
        assert_eq!(c.response().await.expect("kept alive").text(), "hello");
        // a refusal that ends the connection says so, and does
        let mut c = connect(Limits::default(), 64 << 10);
        c.send(get("/ends").as_bytes()).await;
        let r = c.response().await.expect("a response");
        assert_eq!((r.status, r.header("connection")), (400, Some("close")));
        assert!(c.closed().await);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn continue_is_sent_only_when_the_body_is_read() {
    local(async {
        // the service reads the body: 100 first, then the answer
        let mut c = connect(Limits::default(), 64 << 10);
        c.send(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
            .await;
        let r = c.response().await.expect("100");
        assert_eq!(r.status, 100);
        c.send(b"12345").await;
        let r = c.response().await.expect("the answer");
        assert_eq!((r.status, r.text()), (200, "5"));
        c.send(get("/").as_bytes()).await;
        assert_eq!(c.response().await.expect("kept alive").text(), "hello");
        // an early response: no 100; the body never sent cannot be told from the next
        // request, so the connection closes after the answer
        let mut c = connect(Limits::default(), 64 << 10);
        c.send(b"POST /early HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
            .await;
        let r = c.response().await.expect("the answer");
        assert_eq!((r.status, r.text()), (200, "hello"));
        assert_eq!(r.header("connection"), Some("close"));
        // a small body that came with its head is skipped, and the connection kept
        let mut c = connect(Limits::default(), 64 << 10);
        c.send(b"POST /early HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nabcde")
            .await;
        let r = c.response().await.expect("the answer");
        assert_eq!(r.header("connection"), None, "{}", r.head);
        c.send(get("/").as_bytes()).await;
        assert_eq!(c.response().await.expect("kept alive").text(), "hello");
        // a chunked body is decoded for the service
        let mut c = connect(Limits::default(), 64 << 10);
        c.send(b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n")
            .await;
        assert_eq!(c.response().await.expect("the answer").text(), "7");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn every_wait_has_its_deadline() {
    local(async {
        let limits = Limits {
            keepalive_timeout: Duration::from_secs(30),
            header_read_timeout: Duration::from_secs(10),
            send_timeout: Duration::from_secs(20),
            ..Limits::default()
        };
        // idle: closed after keepalive_timeout, not before
        let mut c = connect(limits.clone(), 64 << 10);
        let t0 = Instant::now();
        assert!(c.closed().await);
        assert_eq!(t0.elapsed().as_secs(), 30, "keepalive_timeout");
        // a head that never ends: closed after header_read_timeout from its first byte
        let mut c = connect(limits.clone(), 64 << 10);
        tokio::time::sleep(Duration::from_secs(5)).await;
        c.send(b"GET / HTTP/1.1\r\nHost: t\r\n").await;
        let t0 = Instant::now();
        assert!(c.closed().await);
        assert_eq!(t0.elapsed().as_secs(), 10, "header_read_timeout");
        // a client that takes nothing of a large response: cut after send_timeout
        let mut c = connect(limits.clone(), 4096);
        c.send(get("/big").as_bytes()).await;
        let t0 = Instant::now();
        let served = c.served;
        let _client = c.client; // open, never read
        assert!(tokio::time::timeout(Duration::from_secs(600), served)
            .await
            .is_ok());
        assert_eq!(t0.elapsed().as_secs(), 20, "send_timeout");
        // a slow service is not a stalled client: no deadline while it works
        let mut c = connect(limits, 64 << 10);
        c.send(get("/slow").as_bytes()).await;
        assert_eq!(c.response().await.expect("answered").text(), "slow");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn drains_end_the_connection_after_the_request_in_flight() {
    local(async {
        // shutdown while a request is in flight: it is answered with `Connection: close`
        let mut c = connect(Limits::default(), 64 << 10);
        c.send(get("/slow").as_bytes()).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        c.host.shutdown.send_replace(true);
        let r = c.response().await.expect("answered");
        assert_eq!((r.text(), r.header("connection")), ("slow", Some("close")));
        assert!(c.closed().await);
        // shutdown finds the connection idle: closed at once
        let mut c = connect(Limits::default(), 64 << 10);
        c.send(get("/").as_bytes()).await;
        c.response().await.expect("answered");
        let t0 = Instant::now();
        c.host.shutdown.send_replace(true);
        assert!(c.closed().await);
        assert!(t0.elapsed() < Duration::from_secs(1));
        // a retirement is not a shutdown: the idle connection stays, its next answer says
        // `Connection: close`
        let mut c = connect(Limits::default(), 64 << 10);
        c.send(get("/").as_bytes()).await;
        c.response().await.expect("answered");
        c.host.retire.send_replace(true);
        tokio::time::sleep(Duration::from_secs(10)).await;
        c.send(get("/").as_bytes()).await;
        let r = c.response().await.expect("still served");
        assert_eq!(r.header("connection"), Some("close"));
        assert!(c.closed().await);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_malformed_head_is_refused_and_the_connection_closed() {
    local(async {
        for bad in [
            &b"GET / HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\n",
            b"GET /\rx HTTP/1.1\r\nHost: t\r\n\r\n",
        ] {
            let mut c = connect(Limits::default(), 64 << 10);
            c.send(bad).await;
            let r = c.response().await.expect("a refusal");
            assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(bad));
            assert_eq!(r.header("connection"), Some("close"));
            assert_eq!(r.text(), "400 Bad Request\n");
            assert!(c.svc.seen.borrow().is_empty(), "the service saw nothing");
            assert!(c.closed().await);
        }
    })
    .await;
}
