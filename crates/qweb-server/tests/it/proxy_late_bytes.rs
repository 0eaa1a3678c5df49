//! Late upstream bytes and the keep-alive pool (issue 41, item 6): an upstream that writes a
//! stray complete response `D` ms after each answer, on the same connection. A stray that
//! lands while the connection sits in the pool ends it (hyper reads idle connections); one
//! that lands while a follow-up request is in flight on the connection is read as that
//! request's answer. Once an upstream was seen doing this, its connections are reused only
//! after a cooling period longer than `D` (`qweb-proxy`'s `pool`), so no follow-up gets a
//! stray. Before that, the first stray can still land in flight: `measure_first_contact`
//! measures that case (nginx's level).

use qweb_testkit as common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::TestServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const STRAY: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nSTRAY!";

/// A raw HTTP/1.1 upstream: answers each GET `up:<target>` after `think`, then (with `stray`)
/// writes [`STRAY`] that long after the answer, on the same connection, while it goes on
/// reading and answering requests.
struct StrayUpstream {
    addr: std::net::SocketAddr,
    connections: Arc<AtomicUsize>,
    strays: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for StrayUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn stray_upstream(stray: Option<Duration>, think: Duration) -> StrayUpstream {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let strays = Arc::new(AtomicUsize::new(0));
    let (c2, s2) = (connections.clone(), strays.clone());
    let task = tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else {
                continue;
            };
            c2.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve(s, stray, think, s2.clone()));
        }
    });
    StrayUpstream {
        addr,
        connections,
        strays,
        task,
    }
}

async fn serve(s: TcpStream, stray: Option<Duration>, think: Duration, strays: Arc<AtomicUsize>) {
    let (mut r, w) = s.into_split();
    let w = Arc::new(tokio::sync::Mutex::new(w));
    let mut buf = Vec::new();
    loop {
        let end = loop {
            if let Some(i) = common::wire::find(&buf, b"\r\n\r\n") {
                break i;
            }
            let mut tmp = [0u8; 4096];
            match r.read(&mut tmp).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&tmp[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        buf.drain(..end + 4);
        let target = head.split(' ').nth(1).unwrap_or("").to_owned();
        tokio::time::sleep(think).await;
        let body = format!("up:{target}");
        let resp = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if w.lock().await.write_all(resp.as_bytes()).await.is_err() {
            return;
        }
        if let Some(d) = stray {
            let (w, strays) = (w.clone(), strays.clone());
            tokio::spawn(async move {
                tokio::time::sleep(d).await;
                if w.lock().await.write_all(STRAY).await.is_ok() {
                    strays.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
    }
}

fn server(up: &StrayUpstream) -> TestServer {
    common::start_with(
        &format!(
            "[[route]]\nprefix = \"/late\"\nupstreams = [\"{}\"]\n",
            up.addr
        ),
        |_| {},
    )
}

/// What the follow-ups got.
#[derive(Debug, Default, PartialEq)]
struct Counts {
    /// The stray response's body.
    stray: usize,
    /// Another request's answer.
    wrong: usize,
    /// Not a 200.
    failed: usize,
}

/// `n` GETs one after the other on one client connection (a new one if qweb closed it),
/// `gap` between an answer and the next request.
async fn follow_ups(ts: &TestServer, from: usize, n: usize, gap: Duration) -> Counts {
    let mut c = TcpStream::connect(ts.addrs[1]).await.unwrap();
    let mut counts = Counts::default();
    for i in from..from + n {
        let req = format!("GET /late/n{i} HTTP/1.1\r\nHost: x\r\n\r\n");
        if c.write_all(req.as_bytes()).await.is_err() {
            c = TcpStream::connect(ts.addrs[1]).await.unwrap();
            c.write_all(req.as_bytes()).await.unwrap();
        }
        let r = common::wire::read_response(&mut c, Duration::from_secs(10))
            .await
            .expect("a response");
        if r.status != 200 {
            counts.failed += 1;
        } else if r.body == b"STRAY!" {
            counts.stray += 1;
        } else if r.body != format!("up:/late/n{i}").as_bytes() {
            counts.wrong += 1;
        }
        if r.header("connection").is_some_and(|v| v == "close") {
            c = TcpStream::connect(ts.addrs[1]).await.unwrap();
        }
        if !gap.is_zero() {
            tokio::time::sleep(gap).await;
        }
    }
    counts
}

/// The goal of item 6: an upstream (answering after 10 ms) that writes a stray response `D` ms
/// after every answer, once seen doing it (the stray of a first exchange arrives while its
/// connection is in the pool), gets none of its strays read as one of 20 back-to-back
/// follow-ups' answers, for `D` from 10 ms to 500 ms. Before the fix, the follow-ups'
/// connections were reused at once and strays landed in flight (3 runs, stray bodies of 20:
/// 10 ms: 7-8, 30 ms: 9, 80 ms: 4, 150 ms: 4, 500 ms: 0 as the loop takes ~240 ms; and 1-8
/// more follow-ups got the previous request's answer, the connection one answer behind).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_bytes_never_answer_pooled_follow_ups() {
    let mut report = Vec::new();
    for d in [10u64, 30, 80, 150, 500] {
        let delay = Duration::from_millis(d);
        let up = stray_upstream(Some(delay), Duration::from_millis(10)).await;
        let ts = server(&up);
        // the first exchange; its stray arrives while the connection is idle in the pool
        let first = follow_ups(&ts, 0, 1, Duration::ZERO).await;
        assert_eq!(first, Counts::default());
        tokio::time::sleep(delay + Duration::from_millis(100)).await;
        assert_eq!(
            up.strays.load(Ordering::SeqCst),
            1,
            "D = {d} ms: the first stray"
        );
        let t = Instant::now();
        let counts = follow_ups(&ts, 1, 20, Duration::ZERO).await;
        let verdict = if counts == Counts::default() {
            "ok"
        } else {
            "POISONED"
        };
        report.push(format!(
            "{verdict}: D = {d} ms: {counts:?} of 20 in {:?}; upstream connections {}, strays written {}",
            t.elapsed(),
            up.connections.load(Ordering::SeqCst),
            up.strays.load(Ordering::SeqCst)
        ));
    }
    let text = report.join("\n");
    eprintln!("{text}");
    assert!(!text.contains("POISONED"), "{text}");
}

/// The normal keep-alive path is unchanged: an upstream that never sends late bytes serves 21
/// sequential requests on one pooled connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_upstream_keeps_its_one_pooled_connection() {
    let up = stray_upstream(None, Duration::ZERO).await;
    let ts = server(&up);
    let counts = follow_ups(&ts, 0, 21, Duration::ZERO).await;
    assert_eq!(counts, Counts::default());
    assert_eq!(up.connections.load(Ordering::SeqCst), 1);
}

/// A measurement, not a check (`--run-ignored only`): strays of an upstream qweb has not yet
/// seen sending any, with follow-ups from the first exchange on, for a few upstream latencies
/// (`think`) and client pauses (`gap`). The first stray that lands while a follow-up is in
/// flight is that follow-up's answer, and the connection stays one answer behind until it
/// ends; from then on the upstream is distrusted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement"]
async fn measure_first_contact() {
    for (think, gap) in [(0, 5), (5, 5), (5, 20), (10, 0)] {
        for d in [10u64, 30, 80, 150, 500] {
            let up =
                stray_upstream(Some(Duration::from_millis(d)), Duration::from_millis(think)).await;
            let ts = server(&up);
            let counts = follow_ups(&ts, 0, 21, Duration::from_millis(gap)).await;
            eprintln!(
                "think {think} ms, gap {gap} ms, D = {d} ms: {counts:?} of 21; upstream connections {}",
                up.connections.load(Ordering::SeqCst)
            );
        }
    }
}
