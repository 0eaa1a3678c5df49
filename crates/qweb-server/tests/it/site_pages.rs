//! Rewrites and try_files, error pages and charset (with a legacy page rendered in headless
//! Chromium), autoindex, and where site certificates may be configured: the pipeline's phases
//! after site selection (split from `sites.rs`, which holds site selection and header rules).

use qweb_testkit as common;

use std::path::Path;

use common::{Proto, TestServer};

fn cert(dir: &Path, file: &str, names: &[&str]) {
    common::tls::write_self_signed(dir, file, names);
}

// ---------------------------------------------------------------------------------------------
// Rewrites and try_files

fn start_rewrites() -> TestServer {
    let config = r#"
rewrite = [
  { from = "^/old/(.*)$", to = "/new/$1" },
  { from = "^/named/(?P<rest>.*)$", to = "/new/$${rest}" },
  { from = "^/up/(.*)$", to = "/$1/%2e%2e/%2e%2e/%2e%2e" },
  { from = "^/dots/(.*)$", to = "/$1/../.." },
  { from = "^/dbl/(.*)$", to = "//new//$1" },
  { from = "^/enc/(.*)$", to = "/new/$1%2F" },
]

[[route]]
prefix = "/"
root = "{dir}/site"

[[route]]
prefix = "/spa"
root = "{dir}/spa"
strip_prefix = true
try_files = ["{path}", "/../../secret.txt", "{path}/index.html", "/index.html"]
"#;
    common::start_with(config, |d| {
        std::fs::create_dir_all(d.join("site/new")).unwrap();
        std::fs::write(d.join("site/new/page.html"), "new page").unwrap();
        std::fs::create_dir_all(d.join("spa/docs")).unwrap();
        std::fs::write(d.join("spa/index.html"), "spa shell").unwrap();
        std::fs::write(d.join("spa/app.js"), "js").unwrap();
        std::fs::write(d.join("spa/docs/index.html"), "docs").unwrap();
        std::fs::write(d.join("secret.txt"), "SECRET").unwrap();
    })
}

async fn plain_get(s: &TestServer, path: &str) -> (u16, String) {
    // raw, so the client sends the path exactly as written
    let req = format!("GET {path} HTTP/1.1\r\nHost: x.test\r\nConnection: close\r\n\r\n");
    let out = common::raw_exchange(
        s.addrs[1],
        req.as_bytes(),
        std::time::Duration::from_secs(5),
    )
    .await;
    let out = String::from_utf8_lossy(&out).into_owned();
    let status = out.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewrites_apply_captures_and_stay_beneath_the_root() {
    let s = start_rewrites();
    for (path, want) in [
        ("/old/page.html", (200, "new page")),
        ("/old/page.html?x=1", (200, "new page")),
        ("/named/page.html", (200, "new page")),
        ("/dbl/page.html", (200, "new page")),
        ("/old/missing.html", (404, "")),
    ] {
        let (st, body) = plain_get(&s, path).await;
        assert_eq!(st, want.0, "{path}: {body}");
        if want.0 == 200 {
            assert_eq!(body, want.1, "{path}");
        }
    }
    // rewrites that climb above `/` or produce a forbidden escape are refused, as request
    // paths are; a hostile request never reaches the secret next to the root
    for path in [
        "/up/a",
        "/dots/a",
        "/enc/a",
        "/old/%2e%2e/%2e%2e/secret.txt",
        "/old/..%2f..%2fsecret.txt",
    ] {
        let (st, body) = plain_get(&s, path).await;
        assert_eq!(st, 400, "{path}: {body}");
        assert!(!body.contains("SECRET"), "{path}");
    }
    let (st, body) = plain_get(&s, "/old/%2e%2e/secret.txt").await;
    assert_eq!(st, 404, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_files_falls_back_for_single_page_apps() {
    let s = start_rewrites();
    for (path, want) in [
        ("/spa/app.js", (200, "js")),
        ("/spa/some/client/route", (200, "spa shell")),
        ("/spa/docs/", (200, "docs")),
        ("/spa/", (200, "spa shell")),
        // the candidate climbing out of the root is skipped
        ("/spa/secret.txt", (200, "spa shell")),
        ("/spa/%2e%2e/secret.txt", (404, "")),
    ] {
        let (st, body) = plain_get(&s, path).await;
        assert_eq!(st, want.0, "{path}: {body}");
        assert!(!body.contains("SECRET"), "{path}");
        if want.0 == 200 {
            assert_eq!(body, want.1, "{path}");
        }
    }
}

#[test]
fn rewrite_and_try_files_keys_are_validated() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let long = "a".repeat(2000);
    let bad = [
        (
            "rewrite = [{ from = \"^/(\", to = \"/x\" }]\n".to_owned(),
            "rewrite[0].from",
        ),
        (
            format!("rewrite = [{{ from = \"{long}\", to = \"/x\" }}]\n"),
            "rewrite[0].from",
        ),
        (
            "rewrite = [{ from = \"(a{1000}){1000}\", to = \"/x\" }]\n".to_owned(),
            "rewrite[0].from",
        ),
        (
            "rewrite = [{ from = \"^/a\", to = \"x\" }]\n".to_owned(),
            "rewrite[0].to",
        ),
        (
            "rewrite = [{ from = \"^/a\", to = \"/x?y=1\" }]\n".to_owned(),
            "rewrite[0].to",
        ),
        (
            format!("[[route]]\nprefix = \"/\"\nroot = \"{d}\"\ntry_files = []\n"),
            "route[0].try_files",
        ),
        (
            format!("[[route]]\nprefix = \"/\"\nroot = \"{d}\"\ntry_files = [\"index.html\"]\n"),
            "route[0].try_files",
        ),
        (
            "[[route]]\nprefix = \"/\"\nupstreams = [\"127.0.0.1:1\"]\ntry_files = [\"/\"]\n"
                .to_owned(),
            "route[0].try_files",
        ),
    ];
    for (text, key) in bad {
        let e = qweb_server::Config::from_str_at(&text, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("key `{key}`")),
            "want {key}: {e}\n{text}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Error pages and charset

/// Top-level error pages (404 and 5xx) for the top-level routes, one of which proxies to a
/// port nobody listens on (502); site `e.test` with its own 404 page and `charset`.
fn start_errors() -> TestServer {
    // an upstream that answers every request with its own 404 page
    let own_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let own = own_listener.local_addr().unwrap();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for s in own_listener.incoming() {
            let Ok(mut s) = s else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let mut seen = Vec::new();
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        return;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    while let Some(i) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                        seen.drain(..i + 4);
                        let _ = s.write_all(
                            b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: 17\r\n\r\n{\"error\":\"nope!\"}",
                        );
                    }
                }
            });
        }
    });
    // a port that refuses connections: bind, learn it, close
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let config = format!(
        r#"
error_pages = {{ 404 = "/errors/404.html", "5xx" = "/errors/50x.html", 403 = "/errors/missing.html" }}

[[route]]
prefix = "/"
root = "{{dir}}/site"

[[route]]
prefix = "/legacy-utf8"
root = "{{dir}}/site"
strip_prefix = true
charset = "utf-8"

[[route]]
prefix = "/app"
upstreams = ["{dead}"]
connect_timeout = "2s"

[[route]]
prefix = "/own"
upstreams = ["{own}"]

[[site]]
server_names = ["e.test"]
error_pages = {{ 404 = "/site404.html" }}
charset = "UTF-8"
[[site.route]]
prefix = "/"
root = "{{dir}}/site"
"#
    );
    common::start_with(&config, |d| {
        std::fs::create_dir_all(d.join("site/errors")).unwrap();
        std::fs::write(d.join("site/errors/404.html"), "custom 404").unwrap();
        std::fs::write(d.join("site/errors/50x.html"), "custom 50x").unwrap();
        std::fs::write(d.join("site/site404.html"), "site 404").unwrap();
        std::fs::write(d.join("site/page.html"), "<p>page</p>").unwrap();
        std::fs::write(d.join("site/data.json"), "{}").unwrap();
        // windows-1252: "café" with é as the single byte 0xE9
        std::fs::write(
            d.join("site/legacy.html"),
            b"<!doctype html><html><head><meta charset=\"windows-1252\"></head><body><p id=\"t\">caf\xe9</p></body></html>",
        )
        .unwrap();
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_pages_keep_the_original_status() {
    let s = start_errors();
    let c = common::client(&s.cert(), Proto::H1);
    let r = c.get(format!("{}/nope", s.https())).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(r.text().await.unwrap(), "custom 404");
    let r = c.get(format!("{}/app/x", s.https())).send().await.unwrap();
    assert_eq!(r.status(), 502);
    assert_eq!(r.text().await.unwrap(), "custom 50x");
    // HEAD: the status and the page's type, no body
    let r = c.head(format!("{}/nope", s.https())).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(r.headers()["content-type"], "text/html");
    // a 405 keeps its Allow
    let r = c
        .post(format!("{}/page.html", s.https()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    assert!(r.headers().get("allow").is_some());
    // an upstream's own 404 passes untouched (its body is the API's answer)
    let r = c.get(format!("{}/own/x", s.https())).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(r.headers()["content-type"], "application/json");
    assert_eq!(r.text().await.unwrap(), "{\"error\":\"nope!\"}");
    // a site's own pages
    let r = common::plain_client()
        .get(format!("{}/nope", s.http()))
        .header("host", "e.test")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(r.text().await.unwrap(), "site 404");
    // the page itself missing: the plain error stays (no loop)
    let r = common::plain_client()
        .get(format!("{}/errors/missing.html", s.http()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(r.text().await.unwrap(), "custom 404");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn charset_is_off_by_default_and_added_by_option() {
    let s = start_errors();
    let c = common::plain_client();
    let ct = |r: &reqwest::Response| r.headers()["content-type"].to_str().unwrap().to_owned();
    let r = c
        .get(format!("{}/page.html", s.http()))
        .send()
        .await
        .unwrap();
    assert_eq!(ct(&r), "text/html");
    let r = c
        .get(format!("{}/legacy-utf8/page.html", s.http()))
        .send()
        .await
        .unwrap();
    assert_eq!(ct(&r), "text/html; charset=utf-8");
    let r = c
        .get(format!("{}/legacy-utf8/data.json", s.http()))
        .send()
        .await
        .unwrap();
    assert_eq!(ct(&r), "application/json; charset=utf-8");
    let r = c
        .get(format!("{}/data.json", s.http()))
        .header("host", "e.test")
        .send()
        .await
        .unwrap();
    assert_eq!(ct(&r), "application/json; charset=utf-8", "the site's");
}

/// The browser's view: a windows-1252 page with `<meta charset>` renders as intended when
/// qweb names no charset, and as U+FFFD when `charset = "utf-8"` overrides the meta tag.
#[test]
fn legacy_page_renders_in_headless_chromium() {
    let Some(browser) = common::browser::Chromium::find() else {
        return;
    };
    let s = start_errors();
    let dom = |path: &str| browser.dump_dom(&format!("{}{path}", s.http()), None);
    let d = dom("/legacy.html");
    assert!(d.contains("<p id=\"t\">café</p>"), "{d}");
    let d = dom("/legacy-utf8/legacy.html");
    assert!(d.contains("<p id=\"t\">caf\u{fffd}</p>"), "{d}");
}

#[test]
fn error_page_and_charset_keys_are_validated() {
    for (text, key) in [
        ("error_pages = { 200 = \"/a.html\" }\n", "error_pages.200"),
        ("error_pages = { \"6xx\" = \"/a.html\" }\n", "error_pages.6xx"),
        ("error_pages = { 404 = \"a.html\" }\n", "error_pages.404"),
        ("error_pages = { 404 = \"/../a.html\" }\n", "error_pages.404"),
        (
            "[[route]]\nprefix = \"/\"\nupstreams = [\"127.0.0.1:1\"]\ncharset = \"utf 8\"\n",
            "route[0].charset",
        ),
        (
            "[[route]]\nprefix = \"/\"\nupstreams = [\"127.0.0.1:1\"]\ncharset = \"utf-8\\r\\nX: y\"\n",
            "route[0].charset",
        ),
    ] {
        let e = qweb_server::Config::from_str_at(text, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("key `{key}`")), "want {key}: {e}\n{text}");
    }
}

// ---------------------------------------------------------------------------------------------
// Directory listing

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn autoindex_lists_sorted_and_escaped_and_is_off_by_default() {
    let config = r#"
[[route]]
prefix = "/"
root = "{dir}/site"

[[route]]
prefix = "/list"
root = "{dir}/site"
strip_prefix = true
autoindex = true
"#;
    let s = common::start_with(config, |d| {
        let f = d.join("site/files");
        std::fs::create_dir_all(f.join("sub dir")).unwrap();
        for n in [
            "<script>.html",
            "b.txt",
            "A.txt",
            ".hidden",
            "javascript:alert(1)",
            "q'\"&.txt",
        ] {
            std::fs::write(f.join(n), "x").unwrap();
        }
    });
    let c = common::plain_client();
    // off by default: a directory without an index is refused
    let r = c.get(format!("{}/files/", s.http())).send().await.unwrap();
    assert_eq!(r.status(), 403);
    let r = c
        .get(format!("{}/list/files/", s.http()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/html; charset=utf-8");
    let html = r.text().await.unwrap();
    assert!(!html.contains("<script>"), "{html}");
    assert!(!html.contains(".hidden"), "{html}");
    // the name cell of each row (size and time follow in cells of their own)
    let items: Vec<&str> = html
        .lines()
        .filter(|l| l.starts_with("<tr><td>"))
        .filter_map(|l| l.split("</td>").next())
        .collect();
    assert_eq!(
        items,
        [
            "<tr><td><a href=\"../\">../</a>",
            "<tr><td><a href=\"%3Cscript%3E.html\">&lt;script&gt;.html</a>",
            "<tr><td><a href=\"A.txt\">A.txt</a>",
            "<tr><td><a href=\"b.txt\">b.txt</a>",
            "<tr><td><a href=\"javascript%3Aalert%281%29\">javascript:alert(1)</a>",
            "<tr><td><a href=\"q%27%22%26.txt\">q&#39;&quot;&amp;.txt</a>",
            "<tr><td><a href=\"sub%20dir/\">sub dir/</a>",
        ],
        "{html}"
    );
    // the links work
    let r = c
        .get(format!("{}/list/files/%3Cscript%3E.html", s.http()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // a path through the listing cannot leave the root (raw: reqwest would resolve the dots)
    let (st, body) = plain_get(&s, "/list/files/%2e%2e/%2e%2e/%2e%2e/").await;
    assert_eq!(st, 400, "{body}");
    let (st, body) = plain_get(&s, "/list/files/%2e%2e/").await;
    assert_eq!(st, 200, "the listing of the root itself");
    assert!(body.contains("files/") && !body.contains("site/"), "{body}");
}

/// Site certificates need a TLS listener with `certificates` (an empty list takes the
/// sites'); an empty list without any site certificate is still refused.
#[test]
fn site_certificates_need_a_listener_with_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    cert(d, "a", &["a.test"]);
    let site = format!(
        "[[site]]\nserver_names = [\"a.test\"]\ncertificates = [{{ cert = \"{0}/a.crt\", key = \"{0}/a.key\" }}]\n[[site.route]]\nprefix = \"/\"\nroot = \"{0}\"\n",
        d.display()
    );
    let text = format!(
        "[[listener]]\naddress = \"127.0.0.1:0\"\n[listener.tls]\nself_signed = true\n{site}"
    );
    let e = qweb_server::Config::from_str_at(&text, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("key `site[0].certificates`") && e.contains("listener[0]"),
        "{e}"
    );
    let text = "[[listener]]\naddress = \"127.0.0.1:0\"\n[listener.tls]\ncertificates = []\n";
    let e = qweb_server::Config::from_str_at(text, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("key `listener[0].tls`"), "{e}");
    // an empty list with site certificates: the sites' are the listener's
    let text = format!(
        "[[listener]]\naddress = \"127.0.0.1:0\"\n[listener.tls]\ncertificates = []\n{site}"
    );
    let c = qweb_server::Config::from_str_at(&text, None).unwrap();
    match &c.listeners[0].tls {
        Some(qweb_server::config::TlsConfig::Certificates(list)) => {
            assert_eq!(list.len(), 1);
            assert_eq!(list[0].cert, d.join("a.crt"));
        }
        other => panic!("{other:?}"),
    }
}
