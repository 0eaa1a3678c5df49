//! Reverse proxy against real upstream HTTP servers.

use qweb_testkit as common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{client, upstream, BOTH};

fn proxy_route(prefix: &str, ups: &[std::net::SocketAddr], extra: &str) -> String {
    let list: Vec<String> = ups.iter().map(|a| format!("\"{a}\"")).collect();
    format!(
        "[[route]]\nprefix = \"{prefix}\"\nupstreams = [{}]\n{extra}\n",
        list.join(", ")
    )
}

/// A port nothing listens on.
fn dead_addr() -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

#[tokio::test]
async fn forwards_with_forwarded_headers_over_h1_and_h2() {
    let up = upstream::start("u1").await;
    let t = common::start_with(&proxy_route("/api", &[up.addr], ""), |_| {});
    for proto in BOTH {
        let c = client(&t.cert(), proto);
        let r = c
            .get(format!("{}/api/echo/x?q=1", t.https()))
            .header("x-forwarded-for", "10.0.0.9")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let h = r.headers();
        assert_eq!(h["x-up-uri"], "/api/echo/x?q=1");
        assert_eq!(h["x-up-method"], "GET");
        assert_eq!(h["x-up-h-x-forwarded-for"], "10.0.0.9, 127.0.0.1");
        assert_eq!(h["x-up-h-x-forwarded-proto"], "https");
        let host = format!("{}", t.addrs[0]);
        assert_eq!(h["x-up-h-host"], host.as_str(), "{proto:?}");
        assert_eq!(h["x-up-h-x-forwarded-host"], host.as_str());
    }
    let r = common::plain_client()
        .get(format!("{}/api/echo", t.http()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-up-h-x-forwarded-proto"], "http");
    assert_eq!(r.headers()["x-up-h-x-forwarded-for"], "127.0.0.1");
    // the prefix covers path segments only
    let r = common::plain_client()
        .get(format!("{}/apix", t.http()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404, "/apix is not under /api");
}

#[tokio::test]
async fn strip_prefix() {
    let up = upstream::start("u1").await;
    let t = common::start_with(
        &proxy_route("/api/", &[up.addr], "strip_prefix = true"),
        |_| {},
    );
    let c = common::plain_client();
    let r = c
        .get(format!("{}/api/echo?a=b", t.http()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-up-uri"], "/echo?a=b");
    let r = c.get(format!("{}/api", t.http())).send().await.unwrap();
    assert_eq!(r.text().await.unwrap(), "up:u1:/");
}

#[tokio::test]
async fn hop_by_hop_headers_removed_both_ways() {
    let up = upstream::start("u1").await;
    let t = common::start_with(&proxy_route("/", &[up.addr], ""), |_| {});
    let c = common::plain_client();
    let r = c
        .get(format!("{}/echo", t.http()))
        .header("connection", "x-private")
        .header("x-private", "no")
        .header("proxy-authorization", "Basic eA==")
        .header("te", "gzip, trailers")
        .header("x-public", "yes")
        .send()
        .await
        .unwrap();
    let h = r.headers();
    assert_eq!(h["x-up-h-x-public"], "yes");
    // TE is hop-by-hop: qweb, which takes trailers, asks for them itself when the client
    // did (issue 26: trailers to HTTP/1.1 clients); the client's other codings do not pass
    assert_eq!(h["x-up-h-te"], "trailers");
    for gone in [
        "x-up-h-x-private",
        "x-up-h-proxy-authorization",
        "x-up-h-connection",
    ] {
        assert!(!h.contains_key(gone), "{gone} reached the upstream");
    }
    for proto in BOTH {
        let r = client(&t.cert(), proto)
            .get(format!("{}/hop", t.https()))
            .send()
            .await
            .unwrap();
        let h = r.headers();
        assert_eq!(h["x-kept"], "yes");
        // the upstream's Server is kept, and no second one added
        assert_eq!(h.get_all("server").iter().count(), 1, "{proto:?}");
        assert_eq!(h["server"], "upstream");
        assert!(!h.contains_key("x-secret"), "{proto:?}");
        assert!(!h.contains_key("keep-alive"), "{proto:?}");
        assert_eq!(r.text().await.unwrap(), "hop");
    }
}

#[tokio::test]
async fn large_bodies_stream_both_ways() {
    let up = upstream::start("u1").await;
    let t = common::start_with(&proxy_route("/", &[up.addr], ""), |_| {});
    for proto in BOTH {
        let c = client(&t.cert(), proto);
        let body: Vec<u8> = (0..3 * 1024 * 1024 + 7)
            .map(|i| (i * 7 % 256) as u8)
            .collect();
        let r = c
            .post(format!("{}/echo", t.https()))
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(
            r.bytes().await.unwrap().as_ref(),
            body.as_slice(),
            "{proto:?}"
        );
        let n = 4 * 1024 * 1024 + 3;
        let r = c
            .get(format!("{}/big/{n}", t.https()))
            .send()
            .await
            .unwrap();
        let got = r.bytes().await.unwrap();
        assert_eq!(got.len(), n);
        assert!(got
            .iter()
            .enumerate()
            .all(|(i, b)| *b == upstream::pattern(i)));
    }
}

#[tokio::test]
async fn responses_are_streamed_not_buffered() {
    let up = upstream::start("u1").await;
    let t = common::start_with(&proxy_route("/", &[up.addr], ""), |_| {});
    for proto in BOTH {
        let c = client(&t.cert(), proto);
        let mut r = c.get(format!("{}/gate", t.https())).send().await.unwrap();
        // The upstream holds the second half until we release it: the first half must
        // reach us on its own.
        let first = tokio::time::timeout(Duration::from_secs(10), r.chunk())
            .await
            .expect("first chunk was held back")
            .unwrap()
            .unwrap();
        assert_eq!(first.as_ref(), b"first\n");
        up.gate.notify_one();
        // the rest: "second\n" (an HTTP/2 stream may end with an empty DATA frame)
        let mut rest = Vec::new();
        while let Some(c) = r.chunk().await.unwrap() {
            rest.extend_from_slice(&c);
        }
        assert_eq!(rest, b"second\n", "{proto:?}");
    }
}

#[tokio::test]
async fn round_robin_and_keepalive_pool() {
    let a = upstream::start("a").await;
    let b = upstream::start("b").await;
    let t = common::start_with(&proxy_route("/", &[a.addr, b.addr], ""), |_| {});
    let c = common::plain_client();
    let mut seen = Vec::new();
    for _ in 0..10 {
        let r = c.get(format!("{}/who", t.http())).send().await.unwrap();
        seen.push(r.text().await.unwrap());
    }
    let from_a = seen.iter().filter(|s| *s == "up:a:/who").count();
    let from_b = seen.iter().filter(|s| *s == "up:b:/who").count();
    assert_eq!((from_a, from_b), (5, 5), "{seen:?}");
    for w in seen.windows(2) {
        assert_ne!(w[0], w[1], "not alternating: {seen:?}");
    }
    // one worker, sequential requests: each upstream saw a single kept-alive connection
    assert_eq!(a.connections.load(Ordering::SeqCst), 1);
    assert_eq!(b.connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn upstream_down_is_502_and_failover_works() {
    let dead = dead_addr();
    let t = common::start_with(&proxy_route("/", &[dead], ""), |_| {});
    for proto in BOTH {
        let r = client(&t.cert(), proto)
            .get(format!("{}/x", t.https()))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 502, "{proto:?}");
    }
    drop(t);
    let up = upstream::start("alive").await;
    let t = common::start_with(&proxy_route("/", &[dead, up.addr], ""), |_| {});
    let c = common::plain_client();
    for _ in 0..4 {
        let r = c.get(format!("{}/x", t.http())).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.text().await.unwrap(), "up:alive:/x");
    }
}

#[tokio::test]
async fn upstream_timeout_is_504_and_server_keeps_serving() {
    let up = upstream::start("slow").await;
    let t = common::start_with(&proxy_route("/", &[up.addr], "timeout = \"300ms\""), |_| {});
    for proto in BOTH {
        let c = client(&t.cert(), proto);
        let r = c
            .get(format!("{}/slow/3000", t.https()))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 504, "{proto:?}");
        let r = c.get(format!("{}/fast", t.https())).send().await.unwrap();
        assert_eq!(r.status(), 200);
    }
}

#[tokio::test]
async fn upstream_that_stalls_mid_body_ends_the_response() {
    let up = upstream::start("u").await;
    let t = common::start_with(&proxy_route("/", &[up.addr], "timeout = \"300ms\""), |_| {});
    // The gate is never opened: after "first", the upstream stalls longer than the timeout.
    let c = client(&t.cert(), common::Proto::H1);
    let r = c.get(format!("{}/gate", t.https())).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let res = tokio::time::timeout(Duration::from_secs(10), r.bytes())
        .await
        .expect("hung");
    assert!(
        res.is_err(),
        "a truncated body must be an error, got {res:?}"
    );
}
