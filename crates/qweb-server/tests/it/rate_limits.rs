//! `rate_limit` on routes (issue 39): the burst passes at once, then 429 with `Retry-After`;
//! one budget per key shared by the workers; `X-Forwarded-For` cannot buy a new budget; many
//! distinct keys keep the state at its cap; `dry_run` refuses nothing; over HTTP/1.1, HTTP/2
//! and HTTP/3.

use qweb_testkit as common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::h3::{aioquic, aioquic_available, H3Request};
use common::Proto;

const TIMEOUT: Duration = Duration::from_secs(10);

/// Status and `Retry-After` of one HTTP/1.1 request on its own connection.
async fn get(addr: SocketAddr, target: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut req = format!("GET {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for (n, v) in headers {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    req.push_str("\r\n");
    let out = common::raw_exchange(addr, req.as_bytes(), TIMEOUT).await;
    let text = String::from_utf8_lossy(&out);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let retry = text
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("retry-after: ")
                .map(str::to_owned)
        })
        .unwrap_or_default();
    (status, retry)
}

/// Status and `Retry-After` of an HTTP/2 GET of `path` as `X-User: user`.
async fn h2_get(
    client: &h2::client::SendRequest<bytes::Bytes>,
    path: &str,
    user: &str,
) -> (u16, Option<String>) {
    let req = http::Request::get(format!("https://localhost{path}"))
        .header("x-user", user)
        .body(())
        .unwrap();
    let mut send = client.clone().ready().await.expect("a stream");
    let (resp, _) = send.send_request(req, true).expect("sent");
    let resp = tokio::time::timeout(TIMEOUT, resp)
        .await
        .expect("an answer")
        .expect("a response");
    let retry = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap_or_default().to_owned());
    (resp.status().as_u16(), retry)
}

fn server() -> common::TestServer {
    common::start_with(
        "workers = 2\n[admin]\naddress = \"127.0.0.1:0\"\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\nhttp3 = true\n[listener.tls]\nself_signed = true\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\n\
         [[route]]\nprefix = \"/login\"\nroot = \"{dir}/site\"\n\
         rate_limit = { rate = \"1/m\", burst = 2 }\n\
         [[route]]\nprefix = \"/user\"\nroot = \"{dir}/site\"\n\
         rate_limit = { rate = \"1/m\", burst = 2, key = \"header:X-User\" }\n\
         [[route]]\nprefix = \"/many\"\nroot = \"{dir}/site\"\n\
         rate_limit = { rate = \"1/m\", key = \"cookie:sid\", max_keys = 100 }\n\
         [[route]]\nprefix = \"/dry\"\nroot = \"{dir}/site\"\n\
         rate_limit = { rate = \"1/m\", dry_run = true }\n\
         [[route]]\nprefix = \"/\"\nroot = \"{dir}/site\"\n",
        |d| {
            for f in ["login", "user", "many", "dry", "open"] {
                std::fs::write(d.join("site").join(f), f).unwrap();
            }
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_burst_429_with_retry_after_and_forwarded_for_buys_nothing() {
    let ts = server();
    let plain = ts.addrs[1];
    // 1/m with burst 2: three at once (nginx's `burst=2 nodelay`), each on its own connection
    // (two workers: one budget), each claiming another client in X-Forwarded-For
    let mut got = Vec::new();
    for i in 0..5 {
        let xff = format!("203.0.113.{i}");
        got.push(
            get(
                plain,
                "/login",
                &[("X-Forwarded-For", &xff), ("X-Real-IP", &xff)],
            )
            .await,
        );
    }
    let statuses: Vec<u16> = got.iter().map(|g| g.0).collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429], "{got:?}");
    let retry: u64 = got[3].1.trim().parse().expect("Retry-After in seconds");
    assert!((58..=60).contains(&retry), "Retry-After {retry}");
    // other routes are not touched
    assert_eq!(get(plain, "/open", &[]).await.0, 200);
    let m = common::metrics::scrape(ts.admin.expect("admin")).await;
    let count = |r: &str| {
        m.value(
            "qweb_rate_limit_requests_total",
            &[("route", "/login"), ("result", r)],
        )
    };
    assert_eq!((count("allowed"), count("limited")), (3.0, 2.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_key_has_its_budget_on_http1_http2_and_http3() {
    let ts = server();
    let (tls, plain) = (ts.addrs[0], ts.addrs[1]);
    let want = [200, 200, 200, 429];
    // HTTP/1.1: user a
    let mut h1 = Vec::new();
    for _ in 0..4 {
        h1.push(get(plain, "/user", &[("X-User", "a")]).await.0);
    }
    assert_eq!(h1, want, "h1");
    // no X-User: not counted (nginx: an empty key is not limited)
    for _ in 0..4 {
        assert_eq!(get(plain, "/user", &[]).await.0, 200);
    }
    // HTTP/2: user b has its own budget; user a has none left
    let cfg = Arc::new(common::tls_client_config(&ts.cert(), Proto::H2));
    let io = common::tls::connect(tls, &cfg).await.unwrap();
    let client = common::h2client::handshake(io).await;
    let mut h2 = Vec::new();
    for _ in 0..4 {
        let (s, retry) = h2_get(&client, "/user", "b").await;
        assert_eq!(s == 429, retry.is_some(), "{s}: Retry-After {retry:?}");
        h2.push(s);
    }
    assert_eq!(h2, want, "h2");
    let (s, _, _) = common::h2client::get(&client, "/user", &[("x-user", "a")]).await;
    assert_eq!(s, 429, "h2, user a spent its budget on HTTP/1.1");
    // HTTP/3: user c
    if aioquic_available() {
        let ca = ts.cert();
        let reqs: Vec<H3Request> = (0..4)
            .map(|_| H3Request::get("/user").header("x-user", "c"))
            .chain([H3Request::get("/user").header("x-user", "b")])
            .collect();
        let out = tokio::task::spawn_blocking(move || aioquic(tls, &ca, &reqs, false))
            .await
            .unwrap()
            .expect("aioquic connects");
        let mut h3: Vec<u16> = out
            .iter()
            .map(|r| r.as_ref().map_or(0, |r| r.status))
            .collect();
        assert_eq!(h3.pop(), Some(429), "h3, user b spent its budget on HTTP/2");
        // (aioquic may send the four at once: which three pass is not fixed)
        h3.sort_unstable();
        assert_eq!(h3, want, "h3");
        let limited = out.iter().flatten().find(|r| r.status == 429).unwrap();
        assert!(limited.headers.iter().any(|(n, _)| n == "retry-after"));
    } else {
        eprintln!("SKIPPED (HTTP/3 part): python3 with aioquic is needed (pip install aioquic)");
    }
}

/// Hostile: every request with a key of its own. The state stays at `max_keys`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_distinct_keys_keep_the_state_at_its_cap() {
    let ts = server();
    let cfg = Arc::new(common::tls_client_config(&ts.cert(), Proto::H2));
    let io = common::tls::connect(ts.addrs[0], &cfg).await.unwrap();
    let client = common::h2client::handshake(io).await;
    for i in 0..1000 {
        let cookie = format!("sid={i}");
        let (s, _, _) = common::h2client::get(&client, "/many", &[("cookie", &cookie)]).await;
        assert_eq!(s, 200, "key {i} is new");
    }
    // the last keys are remembered: their second request is limited
    let (s, _, _) = common::h2client::get(&client, "/many", &[("cookie", "sid=999")]).await;
    assert_eq!(s, 429);
    let m = common::metrics::scrape(ts.admin.expect("admin")).await;
    assert_eq!(
        m.value("qweb_rate_limit_keys", &[("route", "/many")]),
        100.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_counts_and_refuses_nothing() {
    let ts = server();
    for _ in 0..3 {
        assert_eq!(get(ts.addrs[1], "/dry", &[]).await.0, 200);
    }
    let m = common::metrics::scrape(ts.admin.expect("admin")).await;
    let count = |r: &str| {
        m.value(
            "qweb_rate_limit_requests_total",
            &[("route", "/dry"), ("result", r)],
        )
    };
    assert_eq!((count("allowed"), count("limited")), (1.0, 2.0));
}

#[test]
fn bad_values_are_refused_by_key() {
    for (value, key) in [
        ("{ rate = \"10/h\" }", "route[0].rate_limit.rate"),
        (
            "{ rate = \"10/s\", burst = -1 }",
            "route[0].rate_limit.burst",
        ),
        (
            "{ rate = \"10/s\", key = \"ip\" }",
            "route[0].rate_limit.key",
        ),
        (
            "{ rate = \"10/s\", max_keys = 0 }",
            "route[0].rate_limit.max_keys",
        ),
        (
            "{ rate = \"10/s\", max_keys = 2000000 }",
            "route[0].rate_limit.max_keys",
        ),
    ] {
        let err = qweb_server::config::Config::from_str_at(
            &format!("[[route]]\nprefix = \"/\"\nroot = \"/tmp\"\nrate_limit = {value}\n"),
            None,
        )
        .map(|_| ())
        .expect_err(value)
        .to_string();
        assert!(err.contains(&format!("`{key}`")), "{value}: {err}");
    }
}
