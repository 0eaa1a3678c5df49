//! The admin listener's status page: `/status.json` (its shape, numbers that move under load,
//! the same counters as `/metrics`), `/status` rendered in headless Chromium (filled in by its
//! script, live, names from the configuration shown as text), and the listener's limits for
//! both (methods, query strings, slow clients, thousands of upstreams).

use qweb_testkit as common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{Proto, TestServer};
use serde_json::Value;

/// An engine name and a route prefix that would run script if the page took them as markup.
const EVIL_ENGINE: &str = "<img src=x onerror=document.title='pwned'>";
const EVIL_ROUTE: &str = "/<script>document.title='pwned'</script>";

/// Two workers, a pool engine signing the TLS listener's handshakes, compression, a static
/// root, a proxy route with one dead and one live upstream and one more route (never used);
/// `[admin]` on port 0.
async fn start() -> (TestServer, common::upstream::Upstream) {
    let up = common::upstream::start("a").await;
    let extra = format!(
        "workers = 2\n[admin]\naddress = \"127.0.0.1:0\"\n\
         [offload.engines.\"{EVIL_ENGINE}\"]\nkind = \"pool\"\nthreads = 1\n\
         [compression]\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\n[listener.tls]\nself_signed = true\n\
         [listener.offload]\nengine = \"{EVIL_ENGINE}\"\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\n\
         [[route]]\nprefix = \"/api\"\nupstreams = [\"127.0.0.1:1\", \"{}\"]\n\
         [[route]]\nprefix = \"{EVIL_ROUTE}\"\nupstreams = [\"127.0.0.1:2\"]\n",
        up.addr
    );
    let t = common::start_with(&extra, |dir| {
        let text = common::upstream::text(64 * 1024);
        std::fs::write(dir.join("site/big.txt"), text).unwrap();
    });
    (t, up)
}

async fn status(admin: SocketAddr) -> Value {
    let r = common::plain_client()
        .get(format!("http://{admin}/status.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/json");
    assert_eq!(r.headers()["cache-control"], "no-store");
    serde_json::from_slice(&r.bytes().await.unwrap()).unwrap()
}

fn n(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

fn engine<'a>(d: &'a Value, name: &str) -> &'a Value {
    d["engines"]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["engine"] == name)
        .unwrap_or_else(|| panic!("no engine {name}: {d}"))
}

/// Requests over HTTPS (HTTP/1.1 and HTTP/2, gzip), plain HTTP and the proxy route.
async fn load(t: &TestServer, rounds: usize) {
    let h1 = common::client(&t.cert(), Proto::H1);
    let h2 = common::client(&t.cert(), Proto::H2);
    let plain = common::plain_client();
    let proxied = format!("{}/api/x", t.http());
    for _ in 0..rounds {
        for c in [&h1, &h2] {
            let r = c
                .get(format!("{}/big.txt", t.https()))
                .header("accept-encoding", "gzip")
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            r.bytes().await.unwrap();
        }
        let r = plain.get(&proxied).send().await.unwrap();
        assert_eq!(r.status(), 200, "{proxied}");
        r.bytes().await.unwrap();
    }
}

/// The document's shape, and its numbers moving with requests, handshakes, engine ops,
/// compressed bytes and upstream failures; its totals equal `/metrics`' sums.
#[tokio::test]
async fn status_json_has_its_shape_and_moves_under_load() {
    let (t, _up) = start().await;
    let admin = t.admin.unwrap();
    let before = status(admin).await;
    for key in [
        "version",
        "config_hash",
        "uptime_seconds",
        "generation",
        "reloads",
        "connections",
        "requests",
        "responses",
        "request_latency",
        "handshakes",
        "workers",
        "engines",
        "compression",
        "upstreams",
    ] {
        assert!(before.get(key).is_some(), "no {key}: {before}");
    }
    assert_eq!(before["generation"], 1);
    assert_eq!(before["workers"]["rows"].as_array().unwrap().len(), 2);
    assert_eq!(before["upstreams"]["total"], 3);

    // connections by protocol, while a client holds one of each open
    let h1 = common::client(&t.cert(), Proto::H1);
    let h2 = common::client(&t.cert(), Proto::H2);
    for c in [&h1, &h2] {
        c.get(format!("{}/big.txt", t.https()))
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
    }
    let held = status(admin).await;
    let sum = |d: &Value, k: &str| -> f64 {
        d["workers"]["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| n(&w[k]))
            .sum()
    };
    assert!(
        sum(&held, "http1") >= 1.0 && sum(&held, "h2") >= 1.0,
        "{held}"
    );
    assert!(n(&held["connections"]) >= 2.0, "{held}");

    load(&t, 10).await;
    let after = status(admin).await;
    assert!(
        n(&after["requests"]) >= n(&before["requests"]) + 30.0,
        "{after}"
    );
    assert!(n(&after["responses"]["2xx"]) >= n(&before["responses"]["2xx"]) + 30.0);
    assert!(n(&after["request_latency"]["count"]) >= 30.0);
    assert!(
        after["request_latency"]["p99_seconds"].is_number(),
        "{after}"
    );
    let hs = &after["handshakes"];
    assert!(n(&hs["total"]) >= 2.0 && n(&hs["full"]) >= 2.0, "{after}");
    assert_eq!(hs["resumed"], 0);
    let pool = engine(&after, EVIL_ENGINE);
    assert!(n(&pool["submitted"]) >= 2.0, "{pool}");
    assert!(n(&pool["completed"]) >= 2.0, "{pool}");
    assert_eq!(pool["fallback"], 0);
    assert_eq!(pool["in_flight"], 0);
    assert!(n(&pool["latency"]["count"]) >= 2.0 && pool["latency"]["mean_seconds"].is_number());
    let gzip = after["compression"]["codecs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["codec"] == "gzip")
        .unwrap();
    assert!(n(&gzip["bytes_in"]) >= 64.0 * 1024.0, "{gzip}");
    assert!(n(&gzip["ratio"]) > 1.5, "{gzip}");
    // the dead upstream failed and is down; the live one answered; nothing left in flight
    let ups = &after["upstreams"];
    assert_eq!(ups["down"], 1, "{ups}");
    let first = &ups["rows"][0];
    assert_eq!(
        (&first["upstream"], &first["up"]),
        (&Value::from("127.0.0.1:1"), &Value::from(false))
    );
    assert_eq!(first["route"], "/api");
    let rows = ups["rows"].as_array().unwrap();
    assert!(
        rows.iter()
            .any(|r| r["route"] == EVIL_ROUTE && r["up"] == true),
        "{ups}"
    );
    assert!(n(&first["failures"]) >= 1.0);
    assert_eq!(ups["in_flight"], 0, "{ups}");

    // one source of truth: the document's totals are /metrics' sums
    let m = t.metrics().await;
    let again = status(admin).await;
    assert_eq!(
        n(&again["requests"]),
        m.sum("qweb_http_requests_total", &[])
    );
    assert_eq!(
        n(&again["handshakes"]["total"]),
        m.sum("qweb_tls_handshakes_total", &[])
    );
    assert_eq!(
        n(&engine(&again, EVIL_ENGINE)["submitted"]),
        m.value(
            "qweb_offload_ops_submitted_total",
            &[("engine", EVIL_ENGINE)]
        )
    );
    assert_eq!(
        n(&again["compression"]["codecs"][0]["bytes_out"]),
        m.value("qweb_compression_bytes_out_total", &[("codec", "gzip")])
    );
}

/// The same rules as `/metrics`: GET and HEAD only (405 with `Allow`), the query ignored, no
/// other path, `no-store` everywhere, and the page's headers.
#[tokio::test]
async fn status_endpoints_refuse_other_methods_and_ignore_queries() {
    let (t, _up) = start().await;
    let admin = t.admin.unwrap();
    let c = common::plain_client();
    for path in ["/status", "/status.json", "/metrics"] {
        for method in ["POST", "PUT", "DELETE", "OPTIONS", "PATCH"] {
            let r = c
                .request(method.parse().unwrap(), format!("http://{admin}{path}"))
                .body("x")
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 405, "{method} {path}");
            assert_eq!(r.headers()["allow"], "GET, HEAD");
            assert_eq!(r.headers()["cache-control"], "no-store");
        }
        let r = c
            .head(format!("http://{admin}{path}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "HEAD {path}");
        assert!(r.bytes().await.unwrap().is_empty());
    }
    for path in ["/status/", "/status.json/x", "/", "/status.html", "/STATUS"] {
        let r = c.get(format!("http://{admin}{path}")).send().await.unwrap();
        assert_eq!(r.status(), 404, "{path}");
        assert_eq!(r.headers()["cache-control"], "no-store");
    }
    let r = c
        .get(format!(
            "http://{admin}/status.json?x=%3Cscript%3E&format=html"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/json");
    let d: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    assert_eq!(d["generation"], 1);

    let r = c
        .get(format!("http://{admin}/status?refresh=0"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let h = r.headers().clone();
    assert_eq!(h["content-type"], "text/html; charset=utf-8");
    assert_eq!(h["cache-control"], "no-store");
    assert_eq!(h["x-content-type-options"], "nosniff");
    let csp = h["content-security-policy"].to_str().unwrap();
    assert!(
        csp.starts_with("default-src 'none'; script-src 'sha256-"),
        "{csp}"
    );
    assert!(
        csp.contains("connect-src 'self'") && !csp.contains("unsafe"),
        "{csp}"
    );
    let page = r.text().await.unwrap();
    // self-contained: no URL but its own JSON
    for external in ["src=", "http://", "https://", "@import", "url("] {
        assert!(!page.contains(external), "{external} in the page");
    }
}

/// Slow clients cannot hold the admin listener: beyond its connection cap new ones are closed
/// at once, and each connection ends at its lifetime; then the status page answers again.
#[tokio::test]
async fn slow_clients_cannot_hold_the_status_page() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (t, _up) = start().await;
    let admin = t.admin.unwrap();
    let started = Instant::now();
    let mut slow = Vec::new();
    // one address holds at most `connections_per_client` (8) admin connections
    for _ in 0..8 {
        let mut s = tokio::net::TcpStream::connect(admin).await.unwrap();
        s.write_all(b"GET /status HTTP/1.1\r\nHost: a\r\n")
            .await
            .unwrap();
        slow.push(s);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // a 9th from the same address is closed without an answer
    let mut extra = tokio::net::TcpStream::connect(admin).await.unwrap();
    let _ = extra
        .write_all(b"GET /status.json HTTP/1.1\r\nHost: a\r\n\r\n")
        .await;
    let mut buf = Vec::new();
    let got = tokio::time::timeout(Duration::from_secs(5), extra.read_to_end(&mut buf)).await;
    assert!(
        matches!(got, Ok(Ok(0)) | Ok(Err(_))),
        "{got:?} {:?}",
        String::from_utf8_lossy(&buf)
    );
    // each slow one is closed at the head timeout (`[admin] header_timeout`, 2 s)
    for mut s in slow {
        let mut buf = Vec::new();
        let r = tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut buf)).await;
        assert!(r.is_ok(), "a slow admin client was never closed");
    }
    let held = started.elapsed();
    assert!(
        held >= Duration::from_millis(1500) && held < Duration::from_secs(6),
        "{held:?}"
    );
    assert_eq!(status(admin).await["generation"], 1);
}

/// Thousands of upstreams: the document stays small and counts them all.
#[tokio::test]
async fn thousands_of_upstreams_give_a_bounded_document() {
    let upstreams: Vec<String> = (0..3000)
        .map(|i| format!("\"127.0.0.1:{}\"", 1 + i))
        .collect();
    let extra = format!(
        "[admin]\naddress = \"127.0.0.1:0\"\n\
         [[route]]\nprefix = \"/many\"\nupstreams = [{}]\n",
        upstreams.join(", ")
    );
    let t = common::start_with(&extra, |_| {});
    let admin = t.admin.unwrap();
    let r = common::plain_client()
        .get(format!("http://{admin}/status.json"))
        .send()
        .await
        .unwrap();
    let body = r.bytes().await.unwrap();
    assert!(body.len() < 64 * 1024, "{} bytes", body.len());
    let d: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(d["upstreams"]["total"], 3000);
    assert_eq!(d["upstreams"]["rows"].as_array().unwrap().len(), 100);
    assert_eq!(d["upstreams"]["omitted"], 2900);
}

/// The value the page's script wrote into element `id` (its `data-value`).
fn dom_value(dom: &str, id: &str) -> f64 {
    let at = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id} in {dom}"));
    let tag = &dom[at..at + dom[at..].find('>').unwrap()];
    let v = tag
        .split("data-value=\"")
        .nth(1)
        .unwrap_or_else(|| panic!("#{id} was not filled in: {tag}"));
    v[..v.find('"').unwrap()].parse().unwrap()
}

/// The page in a real browser: its script (allowed by the CSP's hash) fills every number in
/// from `/status.json`, names from the configuration are text, and the numbers move under
/// load between two loads of the page.
#[test]
fn status_page_renders_live_in_headless_chromium() {
    let Some(browser) = common::browser::Chromium::find() else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (t, _up) = rt.block_on(start());
    let url = format!("http://{}/status", t.admin.unwrap());
    rt.block_on(load(&t, 2));
    let first = browser.dump_dom(&url, Some(3000));
    assert!(
        first.contains("<span id=\"state\" class=\"pill ok\">live</span>"),
        "{first}"
    );
    assert!(
        first.contains("<title>qweb status</title>"),
        "the title was changed: {first}"
    );
    let requests = dom_value(&first, "requests");
    assert!(requests >= 6.0, "{requests}");
    assert!(dom_value(&first, "hs-full") >= 2.0);
    assert_eq!(dom_value(&first, "generation"), 1.0);
    // one row per worker; the engine card and the upstream rows, names as text
    assert_eq!(
        first.matches("<tr><td>").count() - first.matches("<tr><td>/").count(),
        2
    );
    assert!(first.contains("<h3>&lt;img src=x onerror=document.title='pwned'&gt;</h3>"));
    assert!(first.contains("<td>/&lt;script&gt;document.title='pwned'&lt;/script&gt;</td>"));
    assert!(
        !first.contains("<img"),
        "markup from the configuration: {first}"
    );
    assert!(first.contains("<span class=\"pill bad\">down</span>"));
    assert!(first.contains("<tr data-codec=\"gzip\"><td>gzip</td><td class=\"n\">"));

    rt.block_on(load(&t, 5));
    let second = browser.dump_dom(&url, Some(3000));
    assert!(
        dom_value(&second, "requests") >= requests + 15.0,
        "{second}"
    );
    assert!(dom_value(&second, "hs-full") > dom_value(&first, "hs-full"));
    // while load runs, the rates it computes from deltas are above zero
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (stop, h) = {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (s, d) = (stop.clone(), done.clone());
        let target = t.http();
        let h = std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(async {
                let c = common::plain_client();
                while !s.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = c.get(format!("{target}/big.txt")).send().await;
                    d.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            })
        });
        (stop, h)
    };
    // the load is under way before the page looks (on a busy machine the page's polls, in
    // headless Chromium's virtual time, could otherwise all come before its first request)
    let waited = std::time::Instant::now();
    while done.load(std::sync::atomic::Ordering::Relaxed) < 5
        && waited.elapsed() < std::time::Duration::from_secs(10)
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let busy = browser.dump_dom(&url, Some(3000));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    h.join().unwrap();
    assert!(dom_value(&busy, "req-rate") > 0.0, "{busy}");
}
