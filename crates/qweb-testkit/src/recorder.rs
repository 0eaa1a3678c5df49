//! A raw HTTP/1.1 upstream that records the exact bytes of every request it receives, for
//! tests that assert what reached the upstream (and what never did). Hand-written on a plain
//! TCP socket so that it can also misbehave on purpose.
//!
//! Answers by the last path segment:
//! - `late-head`: to a HEAD, a head with `Content-Length: 5` and no body (as it should), then
//!   300 ms later a whole stray response `HTTP/1.1 200 OK ... STRAY!` on the same connection;
//! - `big-head`: a response head with a 100 KB header;
//! - `switch`: `101 Switching Protocols` although nobody asked;
//! - `hang`: never answers;
//! - `closes-reused`: on a connection's first request, as anything else; on a later one, the
//!   request is read whole (and recorded), then the connection is closed without an answer (an
//!   upstream whose keep-alive ended as the request arrived);
//! - `keep-alive-2`: as anything else, announcing `Keep-Alive: timeout=2`;
//! - anything else: 200 with body `up:<request target>`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One request as received.
#[derive(Clone, Debug)]
pub struct Received {
    /// The request line and header lines, as sent (CRLF-separated, without the blank line).
    pub head: String,
    /// The body (chunked bodies decoded).
    pub body: Vec<u8>,
    /// The body arrived whole (`false`: the connection ended in the middle of it).
    pub complete: bool,
}

impl Received {
    /// The request target of the request line.
    pub fn target(&self) -> &str {
        self.head.split(' ').nth(1).unwrap_or("")
    }
    /// The method.
    pub fn method(&self) -> &str {
        self.head.split(' ').next().unwrap_or("")
    }
    /// Every value of header `name` (case-insensitive), in order.
    pub fn header_all(&self, name: &str) -> Vec<String> {
        self.head
            .split("\r\n")
            .skip(1)
            .filter_map(|l| l.split_once(':'))
            .filter(|(n, _)| n.trim().eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim().to_owned())
            .collect()
    }
    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<String> {
        self.header_all(name).into_iter().next()
    }
}

/// A running recording upstream.
pub struct Recorder {
    pub addr: SocketAddr,
    log: Arc<Mutex<Vec<Received>>>,
    connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Recorder {
    /// Everything received so far, and forgets it.
    pub fn take(&self) -> Vec<Received> {
        std::mem::take(&mut *self.log.lock().unwrap())
    }
    /// How many connections it has accepted.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// Starts a recorder on 127.0.0.1:0 (on the current tokio runtime).
pub async fn start() -> Recorder {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let log = Arc::new(Mutex::new(Vec::new()));
    let connections = Arc::new(AtomicUsize::new(0));
    let (l2, c2) = (log.clone(), connections.clone());
    let task = tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                continue;
            };
            c2.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve(s, l2.clone()));
        }
    });
    Recorder {
        addr,
        log,
        connections,
        task,
    }
}

async fn serve(mut s: TcpStream, log: Arc<Mutex<Vec<Received>>>) {
    let mut buf: Vec<u8> = Vec::new();
    let mut nth = 0;
    loop {
        nth += 1;
        let head_end = loop {
            if let Some(i) = find(&buf, b"\r\n\r\n") {
                break i;
            }
            if !fill(&mut s, &mut buf).await {
                return;
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        buf.drain(..head_end + 4);
        let mut rec = Received {
            head,
            body: Vec::new(),
            complete: true,
        };
        let chunked = rec
            .header("transfer-encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
        let length: usize = rec
            .header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        if chunked {
            rec.complete = read_chunked(&mut s, &mut buf, &mut rec.body).await;
        } else {
            while buf.len() < length {
                if !fill(&mut s, &mut buf).await {
                    rec.complete = false;
                    break;
                }
            }
            let n = length.min(buf.len());
            rec.body = buf.drain(..n).collect();
        }
        let target = rec.target().to_owned();
        let method = rec.method().to_owned();
        let complete = rec.complete;
        log.lock().unwrap().push(rec);
        if !complete {
            return;
        }
        let last = target
            .split('?')
            .next()
            .unwrap_or("")
            .rsplit('/')
            .next()
            .unwrap_or("")
            .to_owned();
        let ok = match last.as_str() {
            "late-head" if method == "HEAD" => {
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n")
                    .await;
                tokio::time::sleep(Duration::from_millis(300)).await;
                s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nSTRAY!")
                    .await
                    .is_ok()
            }
            "big-head" => {
                let big = "b".repeat(100_000);
                let r = format!("HTTP/1.1 200 OK\r\nX-Big: {big}\r\nContent-Length: 2\r\n\r\nok");
                s.write_all(r.as_bytes()).await.is_ok()
            }
            "closes-reused" if nth > 1 => return,
            "hang" => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                return;
            }
            "switch" => {
                let _ = s
                    .write_all(
                        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: foo\r\nConnection: upgrade\r\n\r\n",
                    )
                    .await;
                return;
            }
            _ => {
                let body = format!("up:{target}");
                let hint = match last.as_str() {
                    "keep-alive-2" => "Keep-Alive: timeout=2\r\n",
                    _ => "",
                };
                let r = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n{hint}Content-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                s.write_all(r.as_bytes()).await.is_ok()
            }
        };
        if !ok {
            return;
        }
    }
}

async fn fill(s: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut tmp = [0u8; 16 * 1024];
    match s.read(&mut tmp).await {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            buf.extend_from_slice(&tmp[..n]);
            true
        }
    }
}

async fn read_chunked(s: &mut TcpStream, buf: &mut Vec<u8>, body: &mut Vec<u8>) -> bool {
    loop {
        let line_end = loop {
            if let Some(i) = find(buf, b"\r\n") {
                break i;
            }
            if !fill(s, buf).await {
                return false;
            }
        };
        let line = String::from_utf8_lossy(&buf[..line_end]).into_owned();
        buf.drain(..line_end + 2);
        let Ok(size) = usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16)
        else {
            return false;
        };
        while buf.len() < size + 2 {
            if !fill(s, buf).await {
                return false;
            }
        }
        body.extend(buf.drain(..size));
        buf.drain(..2);
        if size == 0 {
            return true;
        }
    }
}

fn find(h: &[u8], n: &[u8]) -> Option<usize> {
    h.windows(n.len()).position(|w| w == n)
}
