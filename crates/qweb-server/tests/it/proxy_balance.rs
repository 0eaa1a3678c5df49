//! Balancing policies, weights and health (passive and active) against real upstreams; the
//! distributions are asserted by count.

use qweb_testkit as common;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// An upstream answering its name (after `delay`), and `/healthz` with `health`.
struct Named {
    addr: SocketAddr,
    health: Arc<AtomicU16>,
    requests: Arc<AtomicUsize>,
}

async fn named(name: &'static str, delay: Duration) -> Named {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let health = Arc::new(AtomicU16::new(200));
    let requests = Arc::new(AtomicUsize::new(0));
    let (h, n) = (health.clone(), requests.clone());
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let (h, n) = (h.clone(), n.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: hyper::Request<_>| {
                    let (h, n) = (h.clone(), n.clone());
                    async move {
                        if req.uri().path() == "/healthz" {
                            let mut r = hyper::Response::new(Full::new(Bytes::from("hc")));
                            *r.status_mut() =
                                hyper::StatusCode::from_u16(h.load(Ordering::SeqCst)).unwrap();
                            return Ok::<_, Infallible>(r);
                        }
                        n.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(delay).await;
                        Ok(hyper::Response::new(Full::new(Bytes::from(name))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    Named {
        addr,
        health,
        requests,
    }
}

fn route(ups: &[SocketAddr], extra: &str) -> String {
    let list: Vec<String> = ups.iter().map(|a| format!("\"{a}\"")).collect();
    format!(
        "[[route]]\nprefix = \"/\"\nupstreams = [{}]\n{extra}\n",
        list.join(", ")
    )
}

async fn get(c: &reqwest::Client, url: String, header: Option<(&str, &str)>) -> (u16, String) {
    let mut b = c.get(url);
    if let Some((k, v)) = header {
        b = b.header(k, v);
    }
    let r = b.send().await.unwrap();
    let s = r.status().as_u16();
    (s, r.text().await.unwrap())
}

fn tally(v: &[String]) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for s in v {
        *m.entry(s.clone()).or_insert(0) += 1;
    }
    m
}

#[tokio::test]
async fn round_robin_by_weight() {
    let a = named("a", Duration::ZERO).await;
    let b = named("b", Duration::ZERO).await;
    let t = common::start_with(&route(&[a.addr, b.addr], "weights = [3, 1]"), |_| {});
    let c = common::plain_client();
    let mut got = Vec::new();
    for _ in 0..40 {
        got.push(get(&c, format!("{}/", t.http()), None).await.1);
    }
    let m = tally(&got);
    assert_eq!((m["a"], m["b"]), (30, 10), "{m:?}");
}

#[tokio::test]
async fn least_conn_avoids_the_busy_upstream() {
    // a answers after 1.5 s, b at once: requests 50 ms apart
    let a = named("a", Duration::from_millis(1500)).await;
    let b = named("b", Duration::ZERO).await;
    let run = |balance: &'static str| {
        let (a, b) = (a.addr, b.addr);
        async move {
            let t = common::start_with(&route(&[a, b], balance), |_| {});
            let c = common::plain_client();
            let mut tasks = Vec::new();
            for _ in 0..10 {
                let c = c.clone();
                let url = format!("{}/", t.http());
                tasks.push(tokio::spawn(async move { get(&c, url, None).await.1 }));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let mut got = Vec::new();
            for task in tasks {
                got.push(task.await.unwrap());
            }
            tally(&got)
        }
    };
    let least = run("balance = \"least_conn\"").await;
    // one request finds both idle and may go to a; a is busy from then on
    assert!(least.get("a").copied().unwrap_or(0) <= 1, "{least:?}");
    assert!(least["b"] >= 9, "{least:?}");
    let rr = run("").await;
    assert_eq!((rr["a"], rr["b"]), (5, 5), "the control: round-robin");
}

#[tokio::test]
async fn hash_is_sticky_spread_and_consistent() {
    let ups = [
        named("a", Duration::ZERO).await,
        named("b", Duration::ZERO).await,
        named("c", Duration::ZERO).await,
        named("d", Duration::ZERO).await,
    ];
    let addrs: Vec<SocketAddr> = ups.iter().map(|u| u.addr).collect();
    let extra = "balance = \"hash\"\nhash_key = \"header:X-User\"";
    let three = common::start_with(&route(&addrs[..3], extra), |_| {});
    let four = common::start_with(&route(&addrs, extra), |_| {});
    let c = common::plain_client();
    let users = 300;
    let mut before = Vec::new();
    for u in 0..users {
        let user = format!("user{u}");
        let first = get(&c, format!("{}/", three.http()), Some(("x-user", &user)))
            .await
            .1;
        for _ in 0..2 {
            let again = get(&c, format!("{}/", three.http()), Some(("x-user", &user)))
                .await
                .1;
            assert_eq!(again, first, "{user} moved without a change");
        }
        before.push(first);
    }
    let spread = tally(&before);
    for name in ["a", "b", "c"] {
        // 100 expected each
        assert!((60..=140).contains(&spread[name]), "{spread:?}");
    }
    // one upstream more: only the keys the new one wins move, and only to it
    let mut moved = 0;
    for (u, was) in before.iter().enumerate() {
        let now = get(
            &c,
            format!("{}/", four.http()),
            Some(("x-user", &format!("user{u}"))),
        )
        .await
        .1;
        if &now != was {
            assert_eq!(now, "d", "user{u} moved from {was} to {now}");
            moved += 1;
        }
    }
    // 75 expected (1/4)
    assert!((40..=110).contains(&moved), "{moved} of {users} moved");
    // a cookie key
    let t = common::start_with(
        &route(&addrs, "balance = \"hash\"\nhash_key = \"cookie:session\""),
        |_| {},
    );
    let mut seen = Vec::new();
    for _ in 0..5 {
        seen.push(
            get(
                &c,
                format!("{}/", t.http()),
                Some(("cookie", "x=1; session=s42")),
            )
            .await
            .1,
        );
    }
    assert_eq!(tally(&seen).len(), 1, "{seen:?}");
}

/// A listener whose accept queue is full: connects to it hang (their SYNs are dropped).
fn blackhole() -> (socket2::Socket, Vec<std::net::TcpStream>, SocketAddr) {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
        .unwrap();
    s.listen(0).unwrap();
    let addr = s.local_addr().unwrap().as_socket().unwrap();
    let mut fill = Vec::new();
    for _ in 0..4 {
        let Ok(c) = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
            break;
        };
        fill.push(c);
    }
    (s, fill, addr)
}

#[tokio::test]
async fn passive_health_skips_a_failing_upstream_for_fail_timeout() {
    let (_hole, _fill, dead) = blackhole();
    let alive = named("alive", Duration::ZERO).await;
    let t = common::start_with(
        &route(
            &[dead, alive.addr],
            "connect_timeout = \"400ms\"\nmax_fails = 1\nfail_timeout = \"3s\"",
        ),
        |_| {},
    );
    let c = common::plain_client();
    // the first request tries dead (400 ms), then alive
    let start = Instant::now();
    let (s, body) = get(&c, format!("{}/", t.http()), None).await;
    assert_eq!((s, body.as_str()), (200, "alive"));
    assert!(
        start.elapsed() >= Duration::from_millis(350),
        "{:?}",
        start.elapsed()
    );
    // within fail_timeout: dead is not tried again
    let start = Instant::now();
    for _ in 0..6 {
        let (s, body) = get(&c, format!("{}/", t.http()), None).await;
        assert_eq!((s, body.as_str()), (200, "alive"));
    }
    assert!(
        start.elapsed() < Duration::from_millis(350),
        "{:?}",
        start.elapsed()
    );
    // after it: tried again (one of the next two requests starts with it)
    tokio::time::sleep(Duration::from_millis(3100)).await;
    let start = Instant::now();
    for _ in 0..2 {
        get(&c, format!("{}/", t.http()), None).await;
    }
    assert!(
        start.elapsed() >= Duration::from_millis(350),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn active_health_checks_take_out_and_bring_back_and_all_down_is_502_at_once() {
    let a = named("a", Duration::ZERO).await;
    let b = named("b", Duration::ZERO).await;
    let t = common::start_with(
        &format!(
            "[admin]\naddress = \"127.0.0.1:0\"\n{}",
            route(
                &[a.addr, b.addr],
                "health_check = { path = \"/healthz\", interval = \"200ms\", expect = 200 }",
            )
        ),
        |_| {},
    );
    let c = common::plain_client();
    let url = format!("{}/", t.http());
    let admin = t.admin.expect("admin");
    let up = |m: &common::metrics::Metrics, up: SocketAddr| {
        let up = up.to_string();
        m.value("qweb_upstream_up", &[("route", "/"), ("upstream", &up)])
    };
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(get(&c, url.clone(), None).await.1);
    }
    assert_eq!(tally(&got).len(), 2, "both up: {got:?}");

    // a fails its check: out within two intervals (asserted with a margin: 1.5 s)
    a.health.store(503, Ordering::SeqCst);
    let start = Instant::now();
    let mut run = 0;
    while run < 6 {
        assert!(
            start.elapsed() < Duration::from_millis(1500),
            "a never taken out"
        );
        let (_, body) = get(&c, url.clone(), None).await;
        run = if body == "b" { run + 1 } else { 0 };
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let out_after = start.elapsed();
    let before = a.requests.load(Ordering::SeqCst);
    for _ in 0..6 {
        assert_eq!(get(&c, url.clone(), None).await.1, "b");
    }
    assert_eq!(a.requests.load(Ordering::SeqCst), before);
    let m = common::metrics::scrape(admin).await;
    assert_eq!(up(&m, a.addr), 0.0, "{m}");
    assert_eq!(up(&m, b.addr), 1.0, "{m}");

    // a passes again: back within 1.5 s
    a.health.store(200, Ordering::SeqCst);
    let start = Instant::now();
    loop {
        assert!(
            start.elapsed() < Duration::from_millis(1500),
            "a never came back"
        );
        if get(&c, url.clone(), None).await.1 == "a" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "taken out after {out_after:?}, back after {:?}",
        start.elapsed()
    );

    // both down: 502 at once
    a.health.store(500, Ordering::SeqCst);
    b.health.store(500, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(800)).await;
    let start = Instant::now();
    let (s, _) = get(&c, url.clone(), None).await;
    assert_eq!(s, 502);
    assert!(
        start.elapsed() < Duration::from_millis(200),
        "{:?}",
        start.elapsed()
    );
}
