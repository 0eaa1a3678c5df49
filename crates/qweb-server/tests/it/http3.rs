//! HTTP/3 (`http3 = true`): python's aioquic client against static files and the proxy,
//! `Alt-Svc` over HTTPS/TCP, headless Chromium over QUIC, and hostile QUIC input (a flood of garbage Initial packets, a
//! client opening more streams than allowed): the server stays up and serves another client.

use qweb_testkit as common;

use common::h3::{aioquic, aioquic_available, aioquic_get, initial_flood, H3Request};
use common::{client, upstream, Proto};

/// A TLS listener with HTTP/3 (and `extra` listener keys), then a plain one.
fn h3_listeners(extra: &str) -> String {
    format!(
        "[[listener]]\naddress = \"127.0.0.1:0\"\nhttp3 = true\n{extra}\n[listener.tls]\nself_signed = true\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\n"
    )
}

/// A proxy route `/api` to `up` with `extra` keys.
fn api_route(up: std::net::SocketAddr, extra: &str) -> String {
    format!("[[route]]\nprefix = \"/api\"\n{extra}upstreams = [\"{up}\"]\n")
}

/// `false` (and a line saying why) where aioquic is missing; `.ci/run` installs it.
fn have_client() -> bool {
    let ok = aioquic_available();
    if !ok {
        eprintln!("SKIPPED: python3 with aioquic is needed (pip install aioquic)");
    }
    ok
}

#[test]
fn static_get_head_and_404_over_h3() {
    if !have_client() {
        return;
    }
    let body = common::upstream::random(150_000, 7);
    let t = common::start_with(&h3_listeners(""), |_| {});
    std::fs::write(t.site().join("big.bin"), &body).unwrap();
    std::fs::write(t.site().join("a.txt"), "hello h3").unwrap();
    let reqs = [
        H3Request::get("/big.bin"),
        H3Request::head("/big.bin"),
        H3Request::get("/a.txt"),
        H3Request::get("/missing"),
    ];
    let out = aioquic(t.addrs[0], &t.cert(), &reqs, false).expect("aioquic connects");
    let big = out[0].as_ref().expect("GET");
    assert_eq!(big.status, 200);
    assert!(big.body == body, "body differs: {} bytes", big.body.len());
    assert_eq!(big.header("content-length"), Some("150000"));
    let head = out[1].as_ref().expect("HEAD");
    assert_eq!(head.status, 200);
    assert_eq!(head.header("content-length"), Some("150000"));
    assert!(head.body.is_empty());
    let small = out[2].as_ref().expect("GET a.txt");
    assert_eq!(small.body, b"hello h3");
    let port = t.addrs[0].port();
    assert_eq!(
        small.header("alt-svc"),
        Some(format!("h3=\":{port}\"; ma=86400").as_str())
    );
    assert_eq!(out[3].as_ref().expect("GET missing").status, 404);
}

#[tokio::test]
async fn proxy_to_an_http11_upstream_over_h3() {
    if !have_client() {
        return;
    }
    let up = upstream::start("u1").await;
    let route = api_route(up.addr, "");
    let t = common::start_with(&format!("{}\n{route}", h3_listeners("")), |_| {});
    let (addr, ca) = (t.addrs[0], t.cert());
    let out = tokio::task::spawn_blocking(move || {
        aioquic(
            addr,
            &ca,
            &[
                H3Request::get("/api/echo/x?q=1"),
                H3Request::get("/api/hello"),
            ],
            false,
        )
    })
    .await
    .unwrap()
    .expect("aioquic connects");
    let echo = out[0].as_ref().expect("echo");
    assert_eq!(echo.status, 200);
    assert_eq!(echo.header("x-up-uri"), Some("/api/echo/x?q=1"));
    assert_eq!(echo.header("x-up-h-x-forwarded-for"), Some("127.0.0.1"));
    let hello = out[1].as_ref().expect("hello");
    assert_eq!(hello.status, 200);
    assert_eq!(hello.body, b"up:u1:/api/hello");
    // a request body streamed from the QUIC stream to the upstream (RequestBody::H3), with
    // and without a Content-Length
    let body = common::upstream::random(200_000, 3);
    let sent = body.clone();
    let (addr, ca) = (t.addrs[0], t.cert());
    let out = tokio::task::spawn_blocking(move || {
        let with_length =
            H3Request::post("/api/echo", &sent).header("content-length", &sent.len().to_string());
        aioquic(
            addr,
            &ca,
            &[with_length, H3Request::post("/api/echo", &sent)],
            false,
        )
    })
    .await
    .unwrap()
    .expect("aioquic connects");
    for r in out {
        let r = r.expect("POST");
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-up-method"), Some("POST"));
        assert!(r.body == body, "echoed {} bytes", r.body.len());
    }
}

#[test]
fn header_section_over_the_limit_is_refused_and_the_connection_serves_on() {
    if !have_client() {
        return;
    }
    let t = common::start_with(
        &format!(
            "[limits]\nmax_request_header_size = 8192\n{}",
            h3_listeners("")
        ),
        |_| {},
    );
    std::fs::write(t.site().join("a.txt"), "a").unwrap();
    let big = "x".repeat(12_000);
    let reqs = [
        H3Request::get("/a.txt").header("x-big", &big),
        H3Request::get("/a.txt"),
    ];
    let out = aioquic(t.addrs[0], &t.cert(), &reqs, false).expect("aioquic connects");
    assert_eq!(out[0].as_ref().expect("an answer").status, 431);
    assert_eq!(out[1].as_ref().expect("the next request").status, 200);
}

#[tokio::test]
async fn alt_svc_over_https_only_where_http3_is_on() {
    let t = common::start_with(&h3_listeners("alt_svc_max_age = 60"), |_| {});
    std::fs::write(t.site().join("a.txt"), "a").unwrap();
    let port = t.addrs[0].port();
    for proto in [Proto::H1, Proto::H2] {
        let r = client(&t.cert(), proto)
            .get(format!("{}/a.txt", t.https()))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(
            r.headers()["alt-svc"],
            format!("h3=\":{port}\"; ma=60").as_str()
        );
    }
    // the plain listener beside it, and a TLS listener without http3: none
    let r = common::plain_client()
        .get(format!("{}/a.txt", t.http()))
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("alt-svc").is_none());
    let plain = common::start();
    std::fs::write(plain.site().join("a.txt"), "a").unwrap();
    let r = client(&plain.cert(), Proto::H2)
        .get(format!("{}/a.txt", plain.https()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("alt-svc").is_none());
}

#[test]
fn garbage_initial_flood_then_another_client_is_served() {
    if !have_client() {
        return;
    }
    let t = common::start_with(&h3_listeners(""), |_| {});
    std::fs::write(t.site().join("a.txt"), "still here").unwrap();
    initial_flood(t.addrs[0], 5_000);
    let out = aioquic(t.addrs[0], &t.cert(), &[H3Request::get("/a.txt")], false)
        .expect("served after the flood");
    let r = out[0].as_ref().expect("GET");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"still here"[..]));
}

#[test]
fn more_streams_than_allowed_ends_that_connection_only() {
    if !have_client() {
        return;
    }
    let t = common::start_with(
        &format!("[limits]\nmax_concurrent_streams = 4\n{}", h3_listeners("")),
        |_| {},
    );
    std::fs::write(t.site().join("a.txt"), "a").unwrap();
    let many: Vec<H3Request> = (0..40).map(|_| H3Request::get("/a.txt")).collect();
    // past the limit the server closes the connection with STREAM_LIMIT_ERROR (0x4)
    let greedy = aioquic(t.addrs[0], &t.cert(), &many, true);
    let closed = greedy.as_ref().is_ok_and(|list| {
        list.iter().any(|r| {
            r.as_ref()
                .is_err_and(|e| e.contains("connection closed: 4 "))
        })
    });
    assert!(closed, "40 streams over a limit of 4: {greedy:?}");
    // a client keeping to the limit gets every answer, on one connection
    let out = aioquic(t.addrs[0], &t.cert(), &many, false).expect("a polite client connects");
    assert!(
        out.iter()
            .all(|r| r.as_ref().is_ok_and(|r| r.status == 200)),
        "{out:?}"
    );
}

#[test]
fn two_workers_serve_http3_before_and_after_a_reload() {
    if !have_client() {
        return;
    }
    let mut t = common::start_with(&format!("workers = 2\n{}", h3_listeners("")), |_| {});
    std::fs::write(t.site().join("a.txt"), "a").unwrap();
    let reqs: Vec<H3Request> = (0..4).map(|_| H3Request::get("/a.txt")).collect();
    for _ in 0..4 {
        // several connections (source ports): both workers' sockets take some
        let out = aioquic(t.addrs[0], &t.cert(), &reqs, false).expect("before the reload");
        assert!(out.iter().all(|r| r.as_ref().is_ok_and(|r| r.body == b"a")));
    }
    let config = qweb_server::Config::from_file(&t.dir.path().join("qweb.toml")).unwrap();
    let server = t.server.as_mut().unwrap();
    server.reload(config).unwrap();
    // port 0 listeners are bound anew by a reload: the new address serves HTTP/3 and says so
    let addr = server.local_addrs()[0];
    let out = aioquic(addr, &t.cert(), &reqs, false).expect("after the reload");
    for r in out {
        let r = r.expect("GET");
        assert_eq!(r.body, b"a");
        let want = format!("h3=\":{}\"; ma=86400", addr.port());
        assert_eq!(r.header("alt-svc"), Some(want.as_str()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_lets_an_http3_request_in_flight_finish() {
    if !have_client() {
        return;
    }
    let up = upstream::start("u1").await;
    let route = api_route(up.addr, "strip_prefix = true\n");
    let mut t = common::start_with(&format!("{}\n{route}", h3_listeners("")), |_| {});
    let (addr, ca) = (t.addrs[0], t.cert());
    let client = aioquic_get(addr, &ca, "/api/slow/1000");
    // shut down once the request is at the upstream (python takes a while to start)
    common::poll_until_async(
        "the request at the upstream",
        std::time::Duration::from_secs(20),
        std::time::Duration::from_millis(20),
        || async { (up.connections.load(std::sync::atomic::Ordering::SeqCst) > 0).then_some(()) },
    )
    .await;
    let started = std::time::Instant::now();
    let server = t.server.take().unwrap();
    tokio::task::spawn_blocking(move || server.shutdown())
        .await
        .unwrap();
    let out = client.await.unwrap().expect("aioquic connects");
    let r = out[0].as_ref().expect("the slow request is answered");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"slow"[..]));
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
}

/// A QUIC handshake's signature goes to the listener's engine (a pool adding 2 s): in mode
/// `async` the worker pauses that handshake and meanwhile answers a plain request at once;
/// in `sync` the same request waits for the signature (the baseline the test tells apart).
/// Either way the handshake completes with one signature op and the request over HTTP/3 is
/// answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quic_handshake_signatures_go_through_the_listeners_offload_engine() {
    if !have_client() {
        return;
    }
    const LATENCY: std::time::Duration = std::time::Duration::from_secs(2);
    for mode in ["sync", "async"] {
        let extra = format!(
            "[admin]\naddress = \"127.0.0.1:0\"\n\
             [offload.engines.pool]\nkind = \"pool\"\nthreads = 1\nadded_latency = \"2s\"\n\
             [[listener]]\naddress = \"127.0.0.1:0\"\nhttp3 = true\n\
             [listener.tls]\nself_signed = true\n\
             [listener.offload]\nengine = \"pool\"\nmode = \"{mode}\"\n\
             [[listener]]\naddress = \"127.0.0.1:0\"\n"
        );
        let t = common::start_with(&extra, |_| {});
        std::fs::write(t.site().join("a.txt"), "signed").unwrap();
        let (addr, ca) = (t.addrs[0], t.cert());
        let started = std::time::Instant::now();
        let h3 = aioquic_get(addr, &ca, "/a.txt");
        // the signature is out (the admin listener answers on its own thread)
        let submitted = || async {
            let m = t.metrics().await;
            m.sum("qweb_offload_ops_submitted_total", &[("engine", "pool")])
        };
        common::poll_until_async(
            "the handshake's signature op",
            std::time::Duration::from_secs(10),
            std::time::Duration::from_millis(20),
            || async { (submitted().await >= 1.0).then_some(()) },
        )
        .await;
        // a plain request to the same (only) worker meanwhile
        let asked = std::time::Instant::now();
        let (status, body) = common::tls::get_text(
            &common::plain_client(),
            &format!("http://{}/a.txt", t.addrs[1]),
        )
        .await;
        let waited = asked.elapsed();
        assert_eq!((status, body.as_str()), (200, "signed"), "{mode}");
        let paused = t.metrics().await.sum("qweb_jobs_paused", &[]);
        let out = h3.await.unwrap().expect("aioquic connects");
        assert_eq!(out[0].as_ref().expect("GET").body, b"signed", "{mode}");
        assert!(
            started.elapsed() >= LATENCY,
            "{mode}: the handshake waited for the engine"
        );
        match mode {
            "async" => {
                assert!(
                    waited < LATENCY / 2,
                    "async: the worker answered other requests while the QUIC handshake was paused ({waited:?})"
                );
                assert_eq!(paused, 1.0, "async: one handshake job paused meanwhile");
            }
            _ => assert!(
                waited >= LATENCY / 2,
                "sync: the worker waited in place for the signature ({waited:?})"
            ),
        }
        assert_eq!(
            submitted().await,
            1.0,
            "{mode}: one signature for one QUIC handshake"
        );
        assert_eq!(
            t.metrics().await.sum("qweb_jobs_paused", &[]),
            0.0,
            "{mode}: none left paused"
        );
    }
}

/// A listener in mode `async` whose pool engine never answers (`added_latency = "1h"`).
fn stuck_engine(offload_timeout: &str) -> String {
    format!(
        "[admin]\naddress = \"127.0.0.1:0\"\n\
         [limits]\ntls_handshake_timeout = \"1s\"\n\
         [offload.engines.stuck]\nkind = \"pool\"\nthreads = 1\nadded_latency = \"1h\"\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\nhttp3 = true\n\
         [listener.tls]\nself_signed = true\n\
         [listener.offload]\nengine = \"stuck\"\nmode = \"async\"\ntimeout = \"{offload_timeout}\"\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\n"
    )
}

/// An engine that never answers, past the offload `timeout`: the paused QUIC handshake is
/// resumed with the timeout and signs in software (`fallback`, as over TCP); the client is
/// served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quic_handshake_whose_engine_never_answers_falls_back_to_software() {
    if !have_client() {
        return;
    }
    let t = common::start_with(&stuck_engine("200ms"), |_| {});
    std::fs::write(t.site().join("a.txt"), "fallback").unwrap();
    let (addr, ca) = (t.addrs[0], t.cert());
    let out = aioquic_get(addr, &ca, "/a.txt")
        .await
        .unwrap()
        .expect("aioquic connects");
    assert_eq!(out[0].as_ref().expect("GET").body, b"fallback");
    let m = t.metrics().await;
    assert_eq!(
        m.sum("qweb_offload_ops_fallback_total", &[("engine", "stuck")]),
        1.0,
        "{m}"
    );
    assert_eq!(m.sum("qweb_jobs_paused", &[]), 0.0, "{m}");
}

/// A QUIC handshake paused on a signature that does not come back within
/// `tls_handshake_timeout` (the offload timeout is longer): the connection is closed, its
/// paused job unwound (the gauge goes back to 0: nothing pinned), the client told, and the
/// worker serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quic_handshake_paused_past_its_timeout_is_dropped_with_its_job() {
    if !have_client() {
        return;
    }
    let t = common::start_with(&stuck_engine("60s"), |_| {});
    std::fs::write(t.site().join("a.txt"), "served").unwrap();
    let (addr, ca) = (t.addrs[0], t.cert());
    let h3 = aioquic_get(addr, &ca, "/a.txt");
    let paused = || async { t.metrics().await.sum("qweb_jobs_paused", &[]) };
    let every = std::time::Duration::from_millis(20);
    common::poll_until_async(
        "a paused handshake",
        std::time::Duration::from_secs(10),
        every,
        || async { (paused().await == 1.0).then_some(()) },
    )
    .await;
    let out = h3.await.unwrap();
    assert!(out.is_err(), "the client's handshake fails: {out:?}");
    common::poll_until_async(
        "the job unwound",
        std::time::Duration::from_secs(10),
        every,
        || async { (paused().await == 0.0).then_some(()) },
    )
    .await;
    let m = t.metrics().await;
    assert_eq!(m.sum("qweb_tls_handshakes_failed_total", &[]), 1.0, "{m}");
    let (status, body) = common::tls::get_text(
        &common::plain_client(),
        &format!("http://{}/a.txt", t.addrs[1]),
    )
    .await;
    assert_eq!((status, body.as_str()), (200, "served"));
}

/// `quic_retry_threshold = 0`: every new connection first gets a Retry and must come back
/// with its token (aioquic does); it is then served, and the Retry is counted.
#[tokio::test]
async fn a_retry_threshold_of_zero_validates_every_new_address() {
    if !have_client() {
        return;
    }
    let t = common::start_with(
        &format!(
            "[admin]\naddress = \"127.0.0.1:0\"\n{}",
            h3_listeners("quic_retry_threshold = 0")
        ),
        |_| {},
    );
    std::fs::write(t.site().join("a.txt"), "validated").unwrap();
    let (addr, ca) = (t.addrs[0], t.cert());
    let out = aioquic_get(addr, &ca, "/a.txt")
        .await
        .unwrap()
        .expect("aioquic connects after the Retry");
    assert_eq!(out[0].as_ref().expect("GET").body, b"validated");
    let m = t.metrics().await;
    assert_eq!(m.sum("qweb_quic_retries_total", &[]), 1.0, "{m}");
    assert_eq!(m.sum("qweb_tls_handshakes_total", &[]), 1.0, "{m}");
    assert_eq!(m.sum("qweb_quic_handshakes_in_progress", &[]), 0.0, "{m}");
}

/// Past the threshold only: with `quic_retry_threshold = 1`, a first handshake paused on a
/// slow engine (2 s) is in progress, so a second client is sent a Retry; both are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_connections_get_a_retry_once_handshakes_in_progress_reach_the_threshold() {
    if !have_client() {
        return;
    }
    let t = common::start_with(
        "[admin]\naddress = \"127.0.0.1:0\"\n\
         [offload.engines.pool]\nkind = \"pool\"\nthreads = 2\nadded_latency = \"2s\"\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\nhttp3 = true\nquic_retry_threshold = 1\n\
         [listener.tls]\nself_signed = true\n\
         [listener.offload]\nengine = \"pool\"\nmode = \"async\"\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\n",
        |_| {},
    );
    std::fs::write(t.site().join("a.txt"), "both").unwrap();
    let (addr, ca) = (t.addrs[0], t.cert());
    let client = || aioquic_get(addr, &ca, "/a.txt");
    let first = client();
    common::poll_until_async(
        "the first handshake in progress",
        std::time::Duration::from_secs(10),
        std::time::Duration::from_millis(20),
        || async {
            let m = t.metrics().await;
            (m.sum("qweb_quic_handshakes_in_progress", &[]) == 1.0).then_some(())
        },
    )
    .await;
    assert_eq!(t.metrics().await.sum("qweb_quic_retries_total", &[]), 0.0);
    let second = client();
    for c in [first, second] {
        let out = c.await.unwrap().expect("aioquic connects");
        assert_eq!(out[0].as_ref().expect("GET").body, b"both");
    }
    let m = t.metrics().await;
    assert_eq!(
        m.sum("qweb_quic_retries_total", &[]),
        1.0,
        "the second client only\n{m}"
    );
    assert_eq!(m.sum("qweb_tls_handshakes_total", &[]), 2.0, "{m}");
}

/// The flow-control limits qweb advertises, read by a real client from the server's transport
/// parameters: 1 MiB per request stream and 2 MiB per connection of unread request body (quinn
/// alone would allow an unlimited connection total: 128 streams x 1.25 MB parked on a slow
/// upstream).
#[test]
fn the_flow_control_windows_advertised_bound_unread_request_bodies() {
    if !have_client() {
        return;
    }
    let t = common::start_with(&h3_listeners(""), |_| {});
    let script = r#"
import asyncio, sys
from aioquic.asyncio.client import connect
from aioquic.h3.connection import H3_ALPN
from aioquic.quic.configuration import QuicConfiguration
async def main():
    cfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name="localhost")
    cfg.load_verify_locations(sys.argv[3])
    async with connect(sys.argv[1], int(sys.argv[2]), configuration=cfg) as c:
        q = c._quic
        print(q._remote_max_data, q._remote_max_stream_data_bidi_remote, flush=True)
asyncio.run(asyncio.wait_for(main(), 20))
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(t.addrs[0].ip().to_string())
        .arg(t.addrs[0].port().to_string())
        .arg(t.cert())
        .output()
        .expect("python3 runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.split_whitespace().collect::<Vec<_>>(),
        ["2097152", "1048576"],
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Headless Chromium forced onto QUIC for the listener's origin (`--origin-to-force-quic-on`,
/// the self-signed certificate pinned by its public key) loads a static page and, from its
/// script, a proxied response: the browser's own timing entries say both came over `h3`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_loads_a_static_page_and_a_proxied_response_over_h3() {
    let Some(browser) = common::browser::Chromium::find() else {
        return;
    };
    let up = upstream::start("u1").await;
    let route = api_route(up.addr, "");
    // its QUIC handshakes' signatures offloaded asynchronously: Chromium's ClientHello (with
    // a post-quantum key share) comes in several CRYPTO frames, the signature pauses on the last
    let offload = "[listener.offload]\nengine = \"pool\"\nmode = \"async\"";
    let t = common::start_with(
        &format!(
            "[admin]\naddress = \"127.0.0.1:0\"\n\
             [offload.engines.pool]\nkind = \"pool\"\nthreads = 1\nadded_latency = \"20ms\"\n\
             {}\n{route}",
            h3_listeners(offload)
        ),
        |_| {},
    );
    std::fs::write(
        t.site().join("h3.html"),
        "<!doctype html><html><body><p id=\"nav\">pending</p><p id=\"api\">pending</p><script>\n\
         const nav = performance.getEntriesByType('navigation')[0];\n\
         document.getElementById('nav').textContent = 'nav:' + nav.nextHopProtocol;\n\
         fetch('/api/hello').then(r => r.text()).then(text => {\n\
           const e = performance.getEntriesByName(location.origin + '/api/hello')[0];\n\
           document.getElementById('api').textContent = 'api:' + (e ? e.nextHopProtocol : 'none') + ':' + text;\n\
         });\n\
         </script></body></html>\n",
    )
    .unwrap();
    let addr = t.addrs[0];
    let args = common::browser::Chromium::quic_to(addr, &t.cert());
    let url = format!("https://{addr}/h3.html");
    let dom = tokio::task::spawn_blocking(move || browser.dump_dom_with(&url, Some(3000), &args))
        .await
        .unwrap();
    assert!(dom.contains("nav:h3<"), "{dom}");
    assert!(dom.contains("api:h3:up:u1:/api/hello<"), "{dom}");
    let m = t.metrics().await;
    assert!(
        m.sum("qweb_offload_ops_submitted_total", &[("engine", "pool")]) >= 1.0,
        "the browser's QUIC handshake signed through the engine\n{m}"
    );
    assert_eq!(m.sum("qweb_offload_ops_fallback_total", &[]), 0.0, "{m}");
    assert_eq!(m.sum("qweb_jobs_paused", &[]), 0.0, "{m}");
}

/// A listener's UDP port held by another socket (bound without `SO_REUSEPORT`). At start,
/// qweb refuses to start and names the listener and UDP, as for a TCP port in use. A reload
/// that turns `http3` on for a listener it keeps (its TCP sockets are ours, so the start-up
/// probe does not run): no worker gets a QUIC endpoint, the TCP side serves, and its responses
/// advertise no HTTP/3 that nothing would answer.
#[tokio::test]
async fn a_udp_port_held_by_another_socket_is_refused_at_start_and_not_advertised_after_a_reload() {
    // a port below the kernel's range for client sockets (32768 and up), so that no client
    // socket of another test takes its TCP side: held for UDP, free for TCP a moment ago
    let start = 20_000 + (std::process::id() % 1_000) as u16 * 7;
    let (holder, port) = (start..32_000)
        .find_map(|p| {
            let udp = std::net::UdpSocket::bind(("127.0.0.1", p)).ok()?;
            std::net::TcpListener::bind(("127.0.0.1", p)).ok()?;
            Some((udp, p))
        })
        .expect("a port free for TCP and UDP below 32000");
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "state_dir = \"{}\"\n[[listener]]\naddress = \"127.0.0.1:{port}\"\nhttp3 = true\n\
         [listener.tls]\nself_signed = true\n",
        dir.path().display()
    );
    let config = qweb_server::Config::from_str_at(&text, None).unwrap();
    let e = match qweb_server::Server::start(config) {
        Ok(_) => panic!("started on a UDP port another socket holds"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains(&format!("127.0.0.1:{port} is already in use"))
            && e.contains("listener[0].address (UDP, http3)"),
        "{e}"
    );
    let mut t = common::start_with(
        &format!(
            "workers = 2\n[[listener]]\naddress = \"127.0.0.1:{port}\"\n\
             [listener.tls]\nself_signed = true\n[[listener]]\naddress = \"127.0.0.1:0\"\n"
        ),
        |_| {},
    );
    let file = t.dir.path().join("qweb.toml");
    let listener = format!("address = \"127.0.0.1:{port}\"\n");
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(
        &file,
        text.replace(&listener, &format!("{listener}http3 = true\n")),
    )
    .unwrap();
    let config = qweb_server::Config::from_file(&file).unwrap();
    assert!(config.listeners[0].http3);
    t.server.as_mut().unwrap().reload(config).unwrap();
    std::fs::write(t.site().join("a.txt"), "a").unwrap();
    for proto in [Proto::H1, Proto::H2, Proto::H1, Proto::H2] {
        let r = client(&t.cert(), proto)
            .get(format!("{}/a.txt", t.https()))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert!(r.headers().get("alt-svc").is_none(), "{:?}", r.headers());
    }
    drop(holder);
}

/// An HTTP/3 connection counts in `qweb_connections_open` and in
/// `qweb_http_connections_open{protocol="h3"}` while it lives (here: while a proxied request
/// waits 2 s on its upstream), and `/status.json` shows it as `h3`; both go back to 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http3_connection_is_counted_while_it_lives() {
    if !have_client() {
        return;
    }
    let up = upstream::start("u1").await;
    let route = api_route(up.addr, "strip_prefix = true\n");
    let t = common::start_with(
        &format!(
            "workers = 1\n[admin]\naddress = \"127.0.0.1:0\"\n{}\n{route}",
            h3_listeners("")
        ),
        |_| {},
    );
    let admin = t.admin.unwrap();
    let (addr, ca) = (t.addrs[0], t.cert());
    let slow = aioquic_get(addr, &ca, "/api/slow/2000");
    let h3 =
        |m: &common::metrics::Metrics| m.sum("qweb_http_connections_open", &[("protocol", "h3")]);
    let m = common::poll_until_async(
        "the HTTP/3 connection counted",
        std::time::Duration::from_secs(10),
        std::time::Duration::from_millis(50),
        || async {
            let m = common::metrics::scrape(admin).await;
            (h3(&m) == 1.0).then_some(m)
        },
    )
    .await;
    assert!(m.sum("qweb_connections_open", &[]) >= 1.0, "{m}");
    let status: serde_json::Value = serde_json::from_str(
        &reqwest::get(format!("http://{admin}/status.json"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(status["workers"]["rows"][0]["h3"], 1, "{status}");
    let out = slow.await.unwrap().expect("aioquic connects");
    assert_eq!(out[0].as_ref().expect("slow").status, 200);
    common::poll_until_async(
        "the HTTP/3 connection no longer counted after it ended",
        std::time::Duration::from_secs(6),
        std::time::Duration::from_millis(100),
        || async {
            let m = common::metrics::scrape(admin).await;
            (h3(&m) == 0.0 && m.sum("qweb_connections_open", &[]) == 0.0).then_some(())
        },
    )
    .await;
}

/// A client that sends no request, only QUIC PINGs (each restarts QUIC's idle timeout): the
/// connection still ends after `keepalive_timeout` without a request, as an idle HTTP/1.1 or
/// HTTP/2 connection does, instead of holding its memory for as long as the client likes.
#[test]
fn a_client_sending_only_pings_is_closed_after_keepalive_timeout() {
    if !have_client() {
        return;
    }
    let t = common::start_with(
        &format!("[limits]\nkeepalive_timeout = \"1s\"\n{}", h3_listeners("")),
        |_| {},
    );
    let every = std::time::Duration::from_millis(200);
    let ended = common::h3::aioquic_pinger(
        t.addrs[0],
        &t.cert(),
        every,
        std::time::Duration::from_secs(8),
    );
    let ended = ended.expect("the connection was still open after 8 s of PINGs");
    // 1 s without a request, then GOAWAY and up to 1 s for the client to close
    assert!(
        ended < std::time::Duration::from_secs(5),
        "ended after {ended:?}"
    );
}
