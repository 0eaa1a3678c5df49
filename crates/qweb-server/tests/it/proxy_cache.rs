//! The proxy cache (`cache = {}`) against a real origin on a socket: hits, `Age` and
//! `Cache-Status`, and the hostile cases (an object over the largest size, a client that
//! aborts mid-fill, request fields the key does not hold, `Set-Cookie`, many keys, collapsed
//! misses, invalidation).

use qweb_testkit as common;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

/// An origin whose answers the path picks, counting the requests it sees per path:
/// - `/fresh/..`: `max-age=60`, body `fresh:<count>`;
/// - `/swr/..`: `max-age=2, stale-while-revalidate=60`, body `swr:<count>` (2 s, not 1: the
///   origin's `Date` has whole seconds, so a stored answer can be up to 1 s old at once);
/// - `/cookie`: `Set-Cookie` on a response only heuristically cacheable (`Last-Modified`,
///   no `Cache-Control`); `/cookie-explicit`: `Set-Cookie` with `max-age=60`;
/// - `/vary/..`: `max-age=60`, `Vary: X-Variant`, body `variant:<the request's X-Variant>`;
/// - `/big/<n>`: `max-age=60`, n bytes with a length (`/bigchunked/<n>`: without);
/// - `/pattern/<n>`: `max-age=60`, `text/html`, the n bytes of [`pattern`];
/// - `/stall/..`: `max-age=60`, 4 KiB, a pause of 300 ms, then 4 KiB and 2 MiB more (no
///   length);
/// - `/slow/..`: `max-age=60` after 300 ms (`/slownostore/..`: `no-store`);
/// - `/etag/..`: `max-age=0` with an ETag, 304 to a matching `If-None-Match`;
/// - `/tiny/..`: `max-age=60`, a body of 2 bytes;
/// - `/html/..`: `max-age=60`, 20 KiB of `text/html`.
pub(crate) struct Origin {
    pub(crate) addr: SocketAddr,
    counts: Arc<Mutex<HashMap<String, usize>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Origin {
    pub(crate) fn count(&self, path: &str) -> usize {
        self.counts.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

type OriginBody = BoxBody<Bytes, Infallible>;

fn full(b: impl Into<Bytes>) -> OriginBody {
    Full::new(b.into()).boxed()
}

async fn answer(req: Request<Incoming>, n: usize) -> Response<OriginBody> {
    let path = req.uri().path().to_owned();
    let mut b = Response::builder().header("cache-control", "max-age=60");
    let seg = |i: usize| path.split('/').nth(i).unwrap_or("").to_owned();
    let body = match seg(1).as_str() {
        "fresh" => full(format!("fresh:{n}")),
        "swr" => {
            b = Response::builder().header("cache-control", "max-age=2, stale-while-revalidate=60");
            full(format!("swr:{n}"))
        }
        "cookie" => {
            b = Response::builder()
                .header("last-modified", "Wed, 01 Jan 2020 00:00:00 GMT")
                .header("set-cookie", format!("session={n}"));
            full(format!("cookie:{n}"))
        }
        "cookie-explicit" => {
            b = b.header("set-cookie", format!("session={n}"));
            full(format!("cookie:{n}"))
        }
        "vary" => {
            let v = req
                .headers()
                .get("x-variant")
                .map(|v| v.to_str().unwrap_or("?").to_owned())
                .unwrap_or_else(|| "none".into());
            b = b.header("vary", "X-Variant");
            full(format!("variant:{v}"))
        }
        "big" => {
            let len: usize = seg(2).parse().unwrap_or(0);
            full(vec![b'b'; len])
        }
        "pattern" => {
            b = b.header("content-type", "text/html");
            full(pattern(seg(2).parse().unwrap_or(0)))
        }
        "bigchunked" => {
            let len: usize = seg(2).parse().unwrap_or(0);
            let frames = (0..len.div_ceil(8192)).map(move |i| {
                let size = 8192.min(len - i * 8192);
                Ok::<_, Infallible>(Frame::data(Bytes::from(vec![b'c'; size])))
            });
            StreamBody::new(futures_util::stream::iter(frames)).boxed()
        }
        "stall" => {
            let first = futures_util::stream::once(async {
                Ok::<_, Infallible>(Frame::data(Bytes::from(vec![b'1'; 4096])))
            });
            let pause = futures_util::stream::once(async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok::<_, Infallible>(Frame::data(Bytes::from(vec![b'2'; 4096])))
            });
            // more than the sockets buffer: writing it to a client that left fails
            let rest = futures_util::stream::iter(
                (0..32).map(|_| Ok::<_, Infallible>(Frame::data(Bytes::from(vec![b'2'; 65536])))),
            );
            let first = futures_util::StreamExt::chain(first, pause);
            StreamBody::new(futures_util::StreamExt::chain(first, rest)).boxed()
        }
        "slow" | "slownostore" => {
            tokio::time::sleep(Duration::from_millis(300)).await;
            if seg(1) == "slownostore" {
                b = b.header("cache-control", "no-store");
            }
            full(format!("slow:{n}"))
        }
        "etag" => {
            b = Response::builder()
                .header("cache-control", "max-age=0")
                .header("etag", "\"v1\"");
            if req
                .headers()
                .get("if-none-match")
                .is_some_and(|v| v == "\"v1\"")
            {
                return b.status(304).body(full("")).unwrap();
            }
            full(format!("etag:{n}"))
        }
        "tiny" => full("ok"),
        "html" => {
            b = b.header("content-type", "text/html");
            full(html())
        }
        _ => full(format!("other:{n}")),
    };
    b.body(body).unwrap()
}

/// The body of `/pattern/<n>`: no two neighbouring KiB alike (a byte out of place shows).
pub(crate) fn pattern(n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| b'a' + ((i * 7 + i / 1024) % 26) as u8)
        .collect()
}

/// The body of `/html/..`.
fn html() -> String {
    (0..400)
        .map(|i| format!("<p>paragraph {i} of the page</p>\n"))
        .collect()
}

pub(crate) async fn origin() -> Origin {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counts: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let c = counts.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                return;
            };
            let c = c.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let n = {
                        let mut m = c.lock().unwrap();
                        let e = m.entry(req.uri().path().to_owned()).or_insert(0);
                        *e += 1;
                        *e
                    };
                    async move { Ok::<_, Infallible>(answer(req, n).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    Origin { addr, counts, task }
}

/// qweb with an admin listener and `/` proxied to `up` with `cache = {}`; `extra` is added
/// to the configuration (a `[cache]` table).
pub(crate) fn cached(up: SocketAddr, extra: &str) -> common::server::TestServer {
    common::start_with(
        &format!(
            "workers = 2\n{extra}\n[admin]\naddress = \"127.0.0.1:0\"\n\
             [[route]]\nprefix = \"/\"\nupstreams = [\"{up}\"]\ncache = {{}}\n"
        ),
        |_| {},
    )
}

pub(crate) async fn get(url: &str) -> (u16, HashMap<String, String>, String) {
    get_with(url, &[]).await
}

pub(crate) async fn get_with(
    url: &str,
    fields: &[(&str, &str)],
) -> (u16, HashMap<String, String>, String) {
    let mut rb = common::plain_client().get(url);
    for (n, v) in fields {
        rb = rb.header(*n, *v);
    }
    let r = rb.send().await.unwrap();
    let status = r.status().as_u16();
    let h = r
        .headers()
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    (status, h, r.text().await.unwrap())
}

#[tokio::test]
async fn a_fresh_response_is_served_from_the_cache_with_age_and_cache_status() {
    let up = origin().await;
    let t = cached(up.addr, "");
    let url = format!("{}/fresh/a", t.http());
    let (s, h, body) = get(&url).await;
    assert_eq!((s, body.as_str()), (200, "fresh:1"));
    assert_eq!(h["cache-status"], "qweb; fwd=miss; stored");
    // both workers share one store: every later request is a hit, whichever takes it
    for _ in 0..4 {
        let (s, h, body) = get(&url).await;
        assert_eq!((s, body.as_str()), (200, "fresh:1"));
        assert_eq!(h["cache-status"], "qweb; hit");
        assert!(h["age"].parse::<u64>().unwrap() < 60, "{h:?}");
    }
    assert_eq!(up.count("/fresh/a"), 1);
    // HEAD from the stored GET: the head, its length, no body
    let r = common::plain_client().head(&url).send().await.unwrap();
    assert_eq!(r.headers()["cache-status"], "qweb; hit");
    assert_eq!(r.headers()["content-length"], "7");
    assert_eq!(r.bytes().await.unwrap().len(), 0);
    // a range of the stored whole
    let (s, h, body) = get_with(&url, &[("range", "bytes=1-3")]).await;
    assert_eq!((s, body.as_str()), (206, "res"));
    assert_eq!(h["content-range"], "bytes 1-3/7");
    assert_eq!(up.count("/fresh/a"), 1);
    // the request's no-cache goes to the origin
    let (_, h, body) = get_with(&url, &[("cache-control", "no-cache")]).await;
    assert_eq!(body, "fresh:2");
    assert_eq!(h["cache-status"], "qweb; fwd=stale; fwd-status=200; stored");
    let m = t.metrics().await;
    assert!(m.value("qweb_proxy_cache_hits_total", &[]) >= 6.0);
    assert_eq!(m.value("qweb_proxy_cache_misses_total", &[]), 2.0);
    assert_eq!(m.value("qweb_proxy_cache_objects", &[]), 1.0);
}

#[tokio::test]
async fn a_stale_response_is_revalidated_with_its_etag() {
    let up = origin().await;
    let t = cached(up.addr, "");
    let url = format!("{}/etag/x", t.http());
    assert_eq!(get(&url).await.2, "etag:1");
    let (s, h, body) = get(&url).await;
    assert_eq!(
        (s, body.as_str()),
        (200, "etag:1"),
        "the stored body after a 304"
    );
    assert_eq!(h["cache-status"], "qweb; fwd=stale; fwd-status=304; stored");
    // the client's own If-None-Match is answered by qweb
    let (s, _, _) = get_with(&url, &[("if-none-match", "\"v1\"")]).await;
    assert_eq!(s, 304);
    assert_eq!(up.count("/etag/x"), 3);
    let m = t.metrics().await;
    assert_eq!(m.value("qweb_proxy_cache_revalidated_total", &[]), 2.0);
}

#[tokio::test]
async fn set_cookie_is_stored_only_when_the_origin_says_it_may_be_cached() {
    let up = origin().await;
    let t = cached(up.addr, "");
    // heuristically cacheable (a Last-Modified years old) but for its cookie: not stored
    let url = format!("{}/cookie", t.http());
    let (_, h1, b1) = get(&url).await;
    let (_, h2, b2) = get(&url).await;
    assert_eq!((b1.as_str(), b2.as_str()), ("cookie:1", "cookie:2"));
    assert_eq!(h1["set-cookie"], "session=1");
    assert_eq!(
        h2["set-cookie"], "session=2",
        "one client's cookie never goes to another by heuristics"
    );
    assert_eq!(h2["cache-status"], "qweb; fwd=miss");
    // explicit freshness: RFC 9111 section 7.3, Set-Cookie does not inhibit storing
    let url = format!("{}/cookie-explicit", t.http());
    get(&url).await;
    let (_, h, b) = get(&url).await;
    assert_eq!(b, "cookie:1", "max-age: the origin said it may be cached");
    assert_eq!(h["set-cookie"], "session=1", "stored with its fields");
    assert_eq!(h["cache-status"], "qweb; hit");
}

#[tokio::test]
async fn request_fields_the_response_varies_on_cannot_poison_other_clients() {
    let up = origin().await;
    let t = cached(up.addr, "");
    let url = format!("{}/vary/p", t.http());
    let (_, _, evil) = get_with(&url, &[("x-variant", "evil")]).await;
    assert_eq!(evil, "variant:evil");
    // the stored variant answers only requests with the same X-Variant
    assert_eq!(get(&url).await.2, "variant:none");
    assert_eq!(
        get_with(&url, &[("x-variant", "good")]).await.2,
        "variant:good"
    );
    let (_, h, again) = get_with(&url, &[("x-variant", "evil")]).await;
    assert_eq!(
        (again.as_str(), h["cache-status"].as_str()),
        ("variant:evil", "qweb; hit")
    );
    assert_eq!(get(&url).await.2, "variant:none");
    assert_eq!(up.count("/vary/p"), 3, "one origin request per variant");
}

#[tokio::test]
async fn an_object_over_the_largest_size_streams_through_unstored() {
    let up = origin().await;
    let t = cached(
        up.addr,
        "[cache]\nmemory = \"4MiB\"\nmax_object_size = \"64KiB\"\n",
    );
    for path in ["/big/100000", "/bigchunked/100000"] {
        let url = format!("{}{path}", t.http());
        for _ in 0..2 {
            let (s, h, body) = get(&url).await;
            assert_eq!((s, body.len()), (200, 100_000), "{path}");
            // (a body without a length is announced `stored`, then given up past the size)
            assert!(h["cache-status"].starts_with("qweb; fwd=miss"), "{path}");
        }
        assert_eq!(up.count(path), 2, "{path}: not stored");
    }
    // one just under the limit is stored
    let url = format!("{}/big/60000", t.http());
    get(&url).await;
    assert_eq!(get(&url).await.1["cache-status"], "qweb; hit");
    let m = t.metrics().await;
    assert_eq!(m.value("qweb_proxy_cache_too_large_total", &[]), 4.0);
    assert!(m.value("qweb_proxy_cache_bytes", &[]) < 64.0 * 1024.0 + 4096.0);
}

#[tokio::test]
async fn a_client_aborting_mid_fill_leaves_no_truncated_entry() {
    let up = origin().await;
    let t = cached(up.addr, "");
    let url = format!("{}/stall/a", t.http());
    let mut r = common::plain_client().get(&url).send().await.unwrap();
    let first = r.chunk().await.unwrap().unwrap();
    assert_eq!(first[0], b'1');
    drop(r);
    // the fill ended with the client: the next request goes to the origin, whole
    tokio::time::sleep(Duration::from_millis(100)).await;
    const WHOLE: usize = 8192 + 32 * 65536;
    let (_, h, body) = get(&url).await;
    assert_eq!(body.len(), WHOLE);
    assert!(body.starts_with('1') && body.ends_with('2'));
    assert_eq!(h["cache-status"], "qweb; fwd=miss; stored");
    let (_, h, body) = get(&url).await;
    assert_eq!(
        (body.len(), h["cache-status"].as_str()),
        (WHOLE, "qweb; hit")
    );
    assert_eq!(up.count("/stall/a"), 2);
    let m = t.metrics().await;
    assert_eq!(m.value("qweb_proxy_cache_abandoned_total", &[]), 1.0);
}

#[tokio::test]
async fn concurrent_misses_collapse_into_one_upstream_request() {
    let up = origin().await;
    let t = cached(up.addr, "");
    let url = format!("{}/slow/c", t.http());
    let all = (0..20).map(|_| {
        let url = url.clone();
        tokio::spawn(async move { get(&url).await })
    });
    let results = futures_util::future::join_all(all).await;
    for r in results {
        assert_eq!(r.unwrap().2, "slow:1");
    }
    assert_eq!(up.count("/slow/c"), 1);
    let m = t.metrics().await;
    assert!(m.value("qweb_proxy_cache_collapsed_total", &[]) >= 1.0);
    // a response that is not stored releases the waiters at once: each goes upstream
    let url = format!("{}/slownostore/c", t.http());
    let start = Instant::now();
    let all = (0..5).map(|_| {
        let url = url.clone();
        tokio::spawn(async move { get(&url).await })
    });
    futures_util::future::join_all(all).await;
    assert_eq!(up.count("/slownostore/c"), 5);
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn memory_stays_within_the_limit_with_many_keys() {
    let up = origin().await;
    let t = cached(
        up.addr,
        "[cache]\nmemory = \"1MiB\"\nmax_object_size = \"64KiB\"\n",
    );
    for i in 0..300 {
        let (s, _, body) = get(&format!("{}/big/8000?k={i}", t.http())).await;
        assert_eq!((s, body.len()), (200, 8000));
    }
    let m = t.metrics().await;
    assert!(m.value("qweb_proxy_cache_bytes", &[]) <= (1 << 20) as f64);
    let objects = m.value("qweb_proxy_cache_objects", &[]);
    assert!((50.0..=130.0).contains(&objects), "{objects}");
    assert!(m.value("qweb_proxy_cache_evictions_total", &[]) >= 170.0);
    // the most recent keys are the ones kept
    let (_, h, _) = get(&format!("{}/big/8000?k=299", t.http())).await;
    assert_eq!(h["cache-status"], "qweb; hit");
}

#[tokio::test]
async fn unsafe_methods_invalidate_the_stored_response() {
    let up = origin().await;
    let t = cached(up.addr, "");
    let url = format!("{}/fresh/inv", t.http());
    get(&url).await;
    assert_eq!(get(&url).await.1["cache-status"], "qweb; hit");
    let r = common::plain_client()
        .post(&url)
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["cache-status"], "qweb; fwd=bypass");
    assert_eq!(
        get(&url).await.2,
        "fresh:3",
        "the POST's success invalidated it"
    );
}

#[tokio::test]
async fn the_admin_listener_purges_a_url_and_a_prefix() {
    let up = origin().await;
    let t = cached(up.addr, "");
    let base = t.http();
    let authority = base.trim_start_matches("http://").to_owned();
    for p in ["/fresh/p/a", "/fresh/p/b", "/fresh/q"] {
        get(&format!("{base}{p}")).await;
    }
    let vary = format!("{base}/vary/p");
    get_with(&vary, &[("x-variant", "1")]).await;
    get_with(&vary, &[("x-variant", "2")]).await;
    let admin = t.admin.unwrap();
    let purge = |q: String| async move {
        let r = common::plain_client()
            .post(format!("http://{admin}/cache/purge?{q}"))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.text().await.unwrap())
    };
    // one URL, every variant (its path normalised as routing does)
    let url = format!("http://{authority}/vary/./p");
    let (s, body) = purge(format!("url={url}")).await;
    assert_eq!((s, body.as_str()), (200, "{\"purged\":2}"));
    let prefix = format!(
        "http%3A%2F%2F{}%2Ffresh%2Fp%2F",
        authority.replace(':', "%3A")
    );
    let (s, body) = purge(format!("prefix={prefix}")).await;
    assert_eq!((s, body.as_str()), (200, "{\"purged\":2}"));
    assert_eq!(get(&format!("{base}/fresh/p/a")).await.2, "fresh:2");
    assert_eq!(
        get(&format!("{base}/fresh/q")).await.1["cache-status"],
        "qweb; hit"
    );
    assert_eq!(
        get_with(&vary, &[("x-variant", "1")]).await.1["cache-status"],
        "qweb; fwd=miss; stored"
    );
    // refused: no URL, a relative one, another method
    assert_eq!(purge("x=1".into()).await.0, 400);
    assert_eq!(purge("url=/fresh/q".into()).await.0, 400);
    let r = common::plain_client()
        .get(format!("http://{admin}/cache/purge?url={url}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
}

#[tokio::test]
async fn the_store_survives_a_reload_and_takes_its_new_limits() {
    let up = origin().await;
    // a fixed port, which a reload keeps
    let port = common::free_port();
    let mut t = common::start_with(
        &format!(
            "workers = 2\n[admin]\naddress = \"127.0.0.1:0\"\n\
             [[listener]]\naddress = \"127.0.0.1:{port}\"\n\
             [[route]]\nprefix = \"/\"\nupstreams = [\"{}\"]\ncache = {{}}\n",
            up.addr
        ),
        |_| {},
    );
    let url = format!("http://127.0.0.1:{port}/big/300000");
    get(&url).await;
    assert_eq!(get(&url).await.1["cache-status"], "qweb; hit");
    let file = t.dir.path().join("qweb.toml");
    let text = std::fs::read_to_string(&file).unwrap();
    // the same routes: the entry is still there after the reload
    let config = qweb_server::Config::from_str_at(&text, Some(&file)).unwrap();
    t.server.as_mut().unwrap().reload(config).unwrap();
    assert_eq!(get(&url).await.1["cache-status"], "qweb; hit");
    // a smaller largest size evicts what is over it
    let smaller = text.replace("[admin]", "[cache]\nmax_object_size = \"100KiB\"\n[admin]");
    let config = qweb_server::Config::from_str_at(&smaller, Some(&file)).unwrap();
    t.server.as_mut().unwrap().reload(config).unwrap();
    assert_eq!(get(&url).await.1["cache-status"], "qweb; fwd=miss");
    assert_eq!(up.count("/big/300000"), 2);
}

#[tokio::test]
async fn stale_while_revalidate_serves_stale_and_refreshes_in_the_background() {
    let up = origin().await;
    let t = cached(up.addr, "");
    let url = format!("{}/swr/a", t.http());
    assert_eq!(get(&url).await.2, "swr:1");
    tokio::time::sleep(Duration::from_millis(2300)).await;
    let (_, h, body) = get(&url).await;
    assert_eq!(body, "swr:1", "stale, at once");
    assert_eq!(h["cache-status"], "qweb; hit; detail=stale");
    let up = &up;
    common::poll_until_async(
        "the background revalidation",
        Duration::from_secs(5),
        Duration::from_millis(20),
        || async move { (up.count("/swr/a") == 2).then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (_, h, body) = get(&url).await;
    assert_eq!(
        (body.as_str(), h["cache-status"].as_str()),
        ("swr:2", "qweb; hit")
    );
    // a request that asks the origin is not served stale
    tokio::time::sleep(Duration::from_millis(2300)).await;
    let (_, _, body) = get_with(&url, &[("cache-control", "max-age=0")]).await;
    assert_eq!(body, "swr:3");
}

/// Many keys of tiny bodies under a byte limit: each entry counts its key, fields and a fixed
/// overhead, not just its 2-byte body, so 3000 keys of 2 KiB each in 1 MiB keep the store
/// within its bytes and hold a few hundred entries (counting bodies alone would keep them all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_keys_of_tiny_bodies_stay_within_the_byte_limit() {
    let up = origin().await;
    let t = cached(
        up.addr,
        "[cache]\nmemory = \"1MiB\"\nmax_object_size = \"64KiB\"\n",
    );
    let pad = "p".repeat(2000);
    let client = common::plain_client();
    for i in 0..3000 {
        let r = client
            .get(format!("{}/tiny/{i}?{pad}", t.http()))
            .send()
            .await
            .unwrap();
        assert_eq!(r.text().await.unwrap(), "ok");
    }
    let m = t.metrics().await;
    let bytes = m.value("qweb_proxy_cache_bytes", &[]);
    let objects = m.value("qweb_proxy_cache_objects", &[]);
    assert!(bytes <= 1024.0 * 1024.0, "{bytes}");
    assert!((150.0..=800.0).contains(&objects), "{objects} objects");
    assert!(m.value("qweb_proxy_cache_evictions_total", &[]) >= 2200.0);
}

/// A purge while a fill of the same URL is in flight: the response the origin produced before
/// the purge is not stored when its body ends after it, so once the purge has answered nothing
/// fetched before it is served. A fill of another URL is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_during_a_fill_keeps_the_old_response_out_of_the_store() {
    let up = origin().await;
    let t = cached(up.addr, "");
    let base = t.http();
    let authority = base.trim_start_matches("http://").to_owned();
    let url = format!("{base}/stall/purged");
    let other = format!("{base}/stall/kept");
    let fills = [url.clone(), other.clone()].map(|u| {
        tokio::spawn(async move {
            let r = common::plain_client().get(&u).send().await.unwrap();
            r.bytes().await.unwrap().len()
        })
    });
    // both fills are in their 300 ms pause
    tokio::time::sleep(Duration::from_millis(120)).await;
    let admin = t.admin.unwrap();
    let r = common::plain_client()
        .post(format!(
            "http://{admin}/cache/purge?url=http://{authority}/stall/purged"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    const WHOLE: usize = 8192 + 32 * 65536;
    for f in fills {
        assert_eq!(f.await.unwrap(), WHOLE);
    }
    let (_, h, _) = get(&url).await;
    assert_eq!(
        h["cache-status"], "qweb; fwd=miss; stored",
        "not stored after the purge"
    );
    assert_eq!(up.count("/stall/purged"), 2);
    assert_eq!(get(&other).await.1["cache-status"], "qweb; hit");
    let m = t.metrics().await;
    assert_eq!(m.value("qweb_proxy_cache_superseded_total", &[]), 1.0);
}

/// A stored compressible response asked for in gzip: the miss is compressed on its way, the
/// first hit is compressed and its variant kept, and later hits are served from the kept
/// variant (no compression work; `qweb_compression_cache_hits_total`), every body decoding to
/// the origin's. A client that takes no encoding gets the stored identity body.
#[tokio::test]
async fn a_cached_response_is_compressed_once_per_encoding() {
    let up = origin().await;
    let t = cached(up.addr, "[compression]\nmin_size = 0\n");
    let url = format!("{}/html/a", t.http());
    let client = common::plain_client();
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let r = client
            .get(&url)
            .header("accept-encoding", "gzip")
            .send()
            .await
            .unwrap();
        assert_eq!(r.headers()["content-encoding"], "gzip");
        statuses.push(r.headers()["cache-status"].to_str().unwrap().to_owned());
        let gz = r.bytes().await.unwrap();
        let mut plain = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&gz[..]), &mut plain)
            .unwrap();
        assert_eq!(plain, html());
    }
    assert_eq!(
        statuses,
        [
            "qweb; fwd=miss; stored",
            "qweb; hit",
            "qweb; hit",
            "qweb; hit"
        ]
    );
    assert_eq!(up.count("/html/a"), 1);
    let m = t.metrics().await;
    assert_eq!(m.value("qweb_compression_cache_hits_total", &[]), 2.0);
    let r = client
        .get(&url)
        .header("accept-encoding", "identity")
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("content-encoding").is_none());
    assert_eq!(r.text().await.unwrap(), html());
}

/// `/status.json` (and so the `/status` page) shows the proxy cache: hits, misses, the hit
/// ratio, what it holds.
#[tokio::test]
async fn the_status_document_shows_the_cache() {
    let up = origin().await;
    let t = cached(up.addr, "");
    let url = format!("{}/fresh/status", t.http());
    for _ in 0..4 {
        get(&url).await;
    }
    let admin = t.admin.unwrap();
    let text = common::plain_client()
        .get(format!("http://{admin}/status.json"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let c = &doc["cache"];
    assert_eq!(
        (c["hits"].as_f64(), c["misses"].as_f64()),
        (Some(3.0), Some(1.0)),
        "{c}"
    );
    assert_eq!(c["hit_ratio"].as_f64(), Some(0.75), "{c}");
    assert_eq!(c["objects"].as_f64(), Some(1.0), "{c}");
    assert!(c["bytes"].as_f64().unwrap_or(0.0) > 0.0, "{c}");
}
