//! Collapsed misses that stream (issue 38): while one request fills a key from a real origin,
//! the requests that wait on it get the response head at once and the body as it is written,
//! from the one buffer the fill holds. The hostile cases: an origin that stalls mid-body (for
//! a while, or for good), a filling client that goes away after the head, an object over
//! `max_object_size` with waiters; over HTTP/1.1 and one over HTTP/2.

use qweb_testkit as common;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::corpus::pattern;
use futures_util::StreamExt as _;
use http_body_util::{combinators::BoxBody, BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

use crate::proxy_cache::cached;

/// The bodies' length: 4 MiB, half of it sent before the origin pauses.
const WHOLE: usize = 4 << 20;
const HALF: usize = WHOLE / 2;
/// The origin's frames.
const FRAME: usize = 64 << 10;

/// An origin of `max-age=60` responses whose bodies are [`pattern`] bytes, counting the
/// requests per path:
/// - `/gate/..`: a length of [`WHOLE`]; [`HALF`] of it, then the rest once the test opens the
///   gate ([`Origin::open`]);
/// - `/hang/..`: a length of [`WHOLE`]; the first request gets [`HALF`] and then nothing more
///   (an hour), later ones the whole body;
/// - `/headlate/<n>`: n bytes with a length; the first request's head comes after 3 s, later
///   ones at once;
/// - `/late/<n>`: n bytes with a length, the head after 300 ms; `/latechunked/<n>`: n bytes
///   without a length, a pause of 300 ms halfway.
struct Origin {
    addr: SocketAddr,
    counts: Arc<Mutex<HashMap<String, usize>>>,
    gate: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Origin {
    fn count(&self, path: &str) -> usize {
        self.counts.lock().unwrap().get(path).copied().unwrap_or(0)
    }

    fn open(&self) {
        self.gate.send_replace(true);
    }
}

type OriginBody = BoxBody<Bytes, Infallible>;

/// `[from, to)` of the pattern in frames of [`FRAME`], after `wait`.
fn frames(
    from: usize,
    to: usize,
    wait: impl std::future::Future<Output = ()> + Send + 'static,
) -> impl futures_util::Stream<Item = Result<Frame<Bytes>, Infallible>> + Send {
    let wait = futures_util::stream::once(wait)
        .filter_map(|()| async { None::<Result<Frame<Bytes>, Infallible>> });
    let data = futures_util::stream::iter((from..to).step_by(FRAME).map(move |start| {
        let end = (start + FRAME).min(to);
        let b: Vec<u8> = (start..end).map(pattern).collect();
        Ok(Frame::data(Bytes::from(b)))
    }));
    futures_util::StreamExt::chain(wait, data)
}

async fn answer(
    path: String,
    n: usize,
    mut gate: tokio::sync::watch::Receiver<bool>,
) -> Response<OriginBody> {
    let seg = |i: usize| path.split('/').nth(i).unwrap_or("").to_owned();
    let (kind, len) = (seg(1), seg(2).parse::<usize>().unwrap_or(0));
    let b = Response::builder().header("cache-control", "max-age=60");
    let body = match kind.as_str() {
        // (each arm with a length returns its own response)
        "gate" | "hang" => {
            let gated = kind == "gate";
            let rest = async move {
                if gated {
                    let _ = gate.wait_for(|open| *open).await;
                } else if n == 1 {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
            };
            let s = frames(0, HALF, std::future::ready(())).chain(frames(HALF, WHOLE, rest));
            return b
                .header("content-length", WHOLE)
                .body(BodyExt::boxed(StreamBody::new(s)))
                .unwrap();
        }
        "late" | "headlate" => {
            let wait = if kind == "late" {
                300
            } else if n == 1 {
                3000
            } else {
                0
            };
            tokio::time::sleep(Duration::from_millis(wait)).await;
            let b = b.header("content-length", len);
            return b
                .body(BodyExt::boxed(StreamBody::new(frames(
                    0,
                    len,
                    std::future::ready(()),
                ))))
                .unwrap();
        }
        "latechunked" => {
            let pause = tokio::time::sleep(Duration::from_millis(300));
            frames(0, len / 2, std::future::ready(())).chain(frames(len / 2, len, pause))
        }
        _ => frames(0, 0, std::future::ready(())).chain(frames(
            0,
            0,
            tokio::time::sleep(Duration::ZERO),
        )),
    };
    b.body(BodyExt::boxed(StreamBody::new(body))).unwrap()
}

async fn origin() -> Origin {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counts: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let (gate, _) = tokio::sync::watch::channel(false);
    let (c, g) = (counts.clone(), gate.clone());
    let task = tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                return;
            };
            let (c, g) = (c.clone(), g.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let path = req.uri().path().to_owned();
                    let n = {
                        let mut m = c.lock().unwrap();
                        let e = m.entry(path.clone()).or_insert(0);
                        *e += 1;
                        *e
                    };
                    let gate = g.subscribe();
                    async move { Ok::<_, Infallible>(answer(path, n, gate).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    Origin {
        addr,
        counts,
        gate,
        task,
    }
}

/// A GET of `url`: the status, the `Cache-Status` and the body (the pattern checked).
async fn get(url: &str) -> (u16, String, usize) {
    let r = common::plain_client().get(url).send().await.unwrap();
    let status = r.status().as_u16();
    let cs = r.headers()["cache-status"].to_str().unwrap().to_owned();
    (status, cs, read_rest(r, 0).await.expect("a whole body"))
}

/// Whether `b`, read from `offset`, is the pattern.
fn is_pattern(b: &[u8], offset: usize) -> bool {
    b.iter().enumerate().all(|(i, &x)| x == pattern(offset + i))
}

/// Reads `r` until it has `n` bytes: what it read (the pattern checked).
async fn read_at_least(r: &mut reqwest::Response, n: usize) -> usize {
    let mut got = 0;
    while got < n {
        let c = r
            .chunk()
            .await
            .expect("body bytes")
            .expect("not the end yet");
        assert!(is_pattern(&c, got), "the pattern at {got}");
        got += c.len();
    }
    got
}

/// Reads the rest of `r` from `offset`: whether it came whole (to [`WHOLE`], the pattern) or
/// ended with an error.
async fn read_rest(mut r: reqwest::Response, mut offset: usize) -> Result<usize, String> {
    loop {
        match r.chunk().await {
            Ok(Some(c)) => {
                assert!(is_pattern(&c, offset), "the pattern at {offset}");
                offset += c.len();
            }
            Ok(None) => return Ok(offset),
            Err(e) => return Err(format!("{e} after {offset} bytes")),
        }
    }
}

/// `n` requests of `url` that each read the head and the first half, which they must have
/// within 10 s (while the origin pauses there).
async fn waiters_with_first_half(
    client: &reqwest::Client,
    url: &str,
    n: usize,
) -> Vec<reqwest::Response> {
    let all = (0..n).map(|_| {
        let (client, url) = (client.clone(), url.to_owned());
        tokio::spawn(async move {
            let mut r = client.get(&url).send().await.unwrap();
            let got = read_at_least(&mut r, HALF).await;
            assert_eq!(got, HALF, "nothing past the pause before it ended");
            r
        })
    });
    let firsts = tokio::time::timeout(Duration::from_secs(10), futures_util::future::join_all(all))
        .await
        .expect("every waiter had the head and the first half while the origin paused");
    firsts.into_iter().map(|w| w.unwrap()).collect()
}

/// Reads the rest of each of `rs` (past the first half) at once (HTTP/2 streams share the
/// connection's flow-control window): each whole.
async fn all_whole(rs: Vec<reqwest::Response>) {
    let rests = rs.into_iter().map(|r| tokio::spawn(read_rest(r, HALF)));
    for r in futures_util::future::join_all(rests).await {
        assert_eq!(r.unwrap(), Ok(WHOLE));
    }
}

fn with_collapse(timeout: &str) -> String {
    format!("[cache]\ncollapse_timeout = \"{timeout}\"\nmax_object_size = \"8MiB\"\n")
}

/// The head and half of a 4 MiB body, then the origin pauses: 30 collapsed waiters each get
/// the head and that first half before the origin goes on (they do not wait for the whole, nor
/// for `collapse_timeout`, 30 s), then the rest; one request reached the origin, and the
/// response is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_fill_streams_to_every_collapsed_waiter_while_it_is_written() {
    let up = origin().await;
    let t = cached(up.addr, &with_collapse("30s"));
    let url = format!("{}/gate/a", t.http());
    let client = common::plain_client();
    let mut leader = client.get(&url).send().await.unwrap();
    assert_eq!(leader.headers()["cache-status"], "qweb; fwd=miss; stored");
    let mut waiters = waiters_with_first_half(&client, &url, 30).await;
    assert_eq!(read_at_least(&mut leader, HALF).await, HALF);
    assert_eq!(up.count("/gate/a"), 1, "one request reached the origin");
    for r in &waiters {
        assert_eq!(r.headers()["cache-status"], "qweb; hit; collapsed");
        assert_eq!(r.headers()["content-length"], WHOLE.to_string().as_str());
    }
    up.open();
    waiters.push(leader);
    all_whole(waiters).await;
    assert_eq!(get(&url).await, (200, "qweb; hit".into(), WHOLE));
    assert_eq!(up.count("/gate/a"), 1);
    let m = t.metrics().await;
    assert!(m.value("qweb_proxy_cache_collapsed_total", &[]) >= 30.0);
}

/// The origin sends half of a 4 MiB body and then stalls for good: every response (the
/// filling client's and 30 waiters') ends with an error at the route's `timeout` (1 s), none
/// hangs and none ends cleanly short of its `Content-Length`; nothing is stored, and the next
/// request goes to the origin and gets the whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_stalling_for_good_ends_every_waiter_with_an_error() {
    let up = origin().await;
    let t = common::start_with(
        &format!(
            "workers = 2\n{}[admin]\naddress = \"127.0.0.1:0\"\n\
             [[route]]\nprefix = \"/\"\nupstreams = [\"{}\"]\ntimeout = \"1s\"\ncache = {{}}\n",
            with_collapse("30s"),
            up.addr
        ),
        |_| {},
    );
    let url = format!("{}/hang/b", t.http());
    let client = common::plain_client();
    let mut leader = client.get(&url).send().await.unwrap();
    let start = Instant::now();
    let all = (0..31).map(|i| {
        let (client, url) = (client.clone(), url.clone());
        tokio::spawn(async move {
            let r = client.get(&url).send().await.unwrap();
            assert_eq!(r.headers()["content-length"], WHOLE.to_string(), "{i}");
            read_rest(r, 0).await
        })
    });
    let leader_got = read_at_least(&mut leader, HALF).await;
    let ends = tokio::time::timeout(Duration::from_secs(8), futures_util::future::join_all(all))
        .await
        .expect("nothing hangs");
    let took = start.elapsed();
    for e in ends {
        let e = e.unwrap();
        assert!(
            e.is_err(),
            "a truncated body ends with an error, not short: {e:?}"
        );
    }
    assert!(read_rest(leader, leader_got).await.is_err());
    assert!(
        took < Duration::from_secs(4),
        "the waiters ended at the route's 1 s timeout: {took:?}"
    );
    assert_eq!(up.count("/hang/b"), 1, "the waiters did not go upstream");
    let got = get(&url).await;
    assert_eq!(
        got,
        (200, "qweb; fwd=miss; stored".into(), WHOLE),
        "nothing was stored"
    );
    assert_eq!(up.count("/hang/b"), 2);
}

/// The filling client goes away after the head and a first chunk while waiters read: the
/// fill goes on for them, they get the whole body, and it is stored (one origin request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fill_goes_on_for_its_waiters_when_its_client_leaves() {
    let up = origin().await;
    let t = cached(up.addr, &with_collapse("30s"));
    let url = format!("{}/gate/c", t.http());
    let client = common::plain_client();
    let mut leader = client.get(&url).send().await.unwrap();
    leader.chunk().await.unwrap().unwrap();
    let waiters = waiters_with_first_half(&client, &url, 10).await;
    drop(leader);
    tokio::time::sleep(Duration::from_millis(200)).await;
    up.open();
    all_whole(waiters).await;
    assert_eq!(get(&url).await, (200, "qweb; hit".into(), WHOLE));
    assert_eq!(up.count("/gate/c"), 1);
    let m = t.metrics().await;
    assert_eq!(m.value("qweb_proxy_cache_abandoned_total", &[]), 0.0);
}

/// Objects over `max_object_size` (1 MiB) with collapsed waiters, with a length and without:
/// each of 10 concurrent requests gets the whole, correct body (the waiters are released to
/// the origin: nothing is kept for them), and nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_an_object_over_the_largest_size_get_the_whole_body() {
    let up = origin().await;
    let t = cached(
        up.addr,
        "[cache]\ncollapse_timeout = \"30s\"\nmax_object_size = \"1MiB\"\n",
    );
    let n = 2 << 20;
    for path in [format!("/late/{n}"), format!("/latechunked/{n}")] {
        let url = format!("{}{path}", t.http());
        let all = (0..10).map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                let r = common::plain_client().get(&url).send().await.unwrap();
                read_rest(r, 0).await
            })
        });
        for r in futures_util::future::join_all(all).await {
            assert_eq!(r.unwrap(), Ok(n), "{path}");
        }
        assert!(up.count(&path) >= 2, "{path}: released to the origin");
        let (_, cs, _) = get(&url).await;
        assert!(cs.starts_with("qweb; fwd=miss"), "{path}: not stored");
    }
    let m = t.metrics().await;
    assert_eq!(m.value("qweb_proxy_cache_objects", &[]), 0.0);
}

/// HTTP/2 waiters stream too: 5 streams on one connection get the first half while the origin
/// pauses, then the whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_waiters_stream_while_the_fill_is_written() {
    let up = origin().await;
    let t = cached(up.addr, &with_collapse("30s"));
    let tls = common::tls_client_config(&t.cert(), common::Proto::H2);
    let client = common::tls::proto_builder(tls, common::Proto::H2)
        .resolve("localhost", t.addrs[0])
        .build()
        .unwrap();
    let url = format!("https://localhost:{}/gate/h2", t.addrs[0].port());
    let mut leader = client.get(&url).send().await.unwrap();
    assert_eq!(leader.version(), reqwest::Version::HTTP_2);
    let mut waiters = waiters_with_first_half(&client, &url, 5).await;
    for r in &waiters {
        assert_eq!(r.headers()["cache-status"], "qweb; hit; collapsed");
        assert_eq!(r.version(), reqwest::Version::HTTP_2);
    }
    assert_eq!(read_at_least(&mut leader, HALF).await, HALF);
    up.open();
    waiters.push(leader);
    all_whole(waiters).await;
    assert_eq!(up.count("/gate/h2"), 1);
}

/// The waiting bound is for the head: an origin that takes 3 s to answer the filling request
/// releases its 30 waiters at `collapse_timeout` (300 ms), and they go to the origin themselves
/// (or find what one of them stored) and get whole answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_released_at_the_collapse_timeout_when_no_head_came() {
    let up = origin().await;
    let t = cached(up.addr, &with_collapse("300ms"));
    let url = format!("{}/headlate/1000", t.http());
    let leader = tokio::spawn(get_owned(url.clone()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let start = Instant::now();
    let all = (0..30).map(|_| tokio::spawn(get_owned(url.clone())));
    for r in futures_util::future::join_all(all).await {
        assert_eq!(r.unwrap().2, 1000);
    }
    let waited = start.elapsed();
    assert!(
        waited < Duration::from_secs(2),
        "released at collapse_timeout, not at the leader's 3 s: {waited:?}"
    );
    // released, they go upstream (and later ones may find what an earlier one stored)
    assert!(up.count("/headlate/1000") >= 2);
    assert_eq!(
        leader.await.unwrap(),
        (200, "qweb; fwd=miss; stored".into(), 1000)
    );
    assert_eq!(get(&url).await.1, "qweb; hit");
}

async fn get_owned(url: String) -> (u16, String, usize) {
    get(&url).await
}

/// A purge of the key while its fill streams: a request after the purge is not handed the
/// fill's body (fetched before the purge); it waits for the fill, and at `collapse_timeout`
/// goes to the origin itself. The filling client still gets its whole answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_after_a_purge_is_not_handed_the_older_fill() {
    let up = origin().await;
    let t = cached(up.addr, &with_collapse("300ms"));
    let authority = t.http().trim_start_matches("http://").to_owned();
    let url = format!("{}/gate/p", t.http());
    let client = common::plain_client();
    let mut leader = client.get(&url).send().await.unwrap();
    assert_eq!(read_at_least(&mut leader, HALF).await, HALF);
    let admin = t.admin.unwrap();
    let r = client
        .post(format!(
            "http://{admin}/cache/purge?url=http://{authority}/gate/p"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let after = tokio::spawn(async move { get(&url).await });
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        up.count("/gate/p"),
        2,
        "the later request went to the origin"
    );
    up.open();
    let (s, cs, len) = after.await.unwrap();
    assert_eq!((s, len), (200, WHOLE));
    assert!(cs.starts_with("qweb; fwd=miss"), "{cs}");
    all_whole(vec![leader]).await;
}
