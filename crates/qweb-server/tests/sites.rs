//! `[[site]]`: virtual hosts over real TLS with SNI. Two sites (and a third sharing the first
//! one's certificate) on one listener answer different content by Host; wildcard names; the
//! top-level routes as the default site; 421 Misdirected Request when the Host names a site
//! the SNI's certificate is not for, on HTTP/1.1 and HTTP/2.

use qweb_testkit as common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use common::{Proto, TestServer, BOTH};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;

/// Writes a self-signed certificate for `names` to `<dir>/<file>.crt` and `.key`.
fn cert(dir: &Path, file: &str, names: &[&str]) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let params =
        rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap();
    let c = params.self_signed(&key).unwrap();
    std::fs::write(dir.join(format!("{file}.crt")), c.pem()).unwrap();
    std::fs::write(dir.join(format!("{file}.key")), key.serialize_pem()).unwrap();
}

fn page(dir: &Path, site: &str, text: &str) {
    std::fs::create_dir_all(dir.join(site)).unwrap();
    std::fs::write(dir.join(site).join("index.html"), text).unwrap();
}

/// Sites a (a.test, cert A), b (b.test and *.w.test, cert B), c (c.test, also cert A: A
/// names a.test and c.test); the top-level route is the default site. A TLS listener that
/// takes the sites' certificates, and a plain one.
fn start() -> TestServer {
    let config = r#"
[[listener]]
address = "127.0.0.1:0"
[listener.tls]
certificates = []
[[listener]]
address = "127.0.0.1:0"

[[route]]
prefix = "/"
root = "{dir}/default"

[[site]]
server_names = ["a.test"]
certificates = [{ cert = "{dir}/a.crt", key = "{dir}/a.key" }]
[[site.route]]
prefix = "/"
root = "{dir}/a"

[[site]]
server_names = ["B.test", "*.w.test"]
certificates = [{ cert = "{dir}/b.crt", key = "{dir}/b.key" }]
[[site.route]]
prefix = "/"
root = "{dir}/b"

[[site]]
server_names = ["c.test"]
certificates = [{ cert = "{dir}/a.crt", key = "{dir}/a.key" }]
[[site.route]]
prefix = "/"
root = "{dir}/c"
"#;
    common::start_with(config, |d| {
        cert(d, "a", &["a.test", "c.test"]);
        cert(d, "b", &["b.test", "*.w.test"]);
        page(d, "a", "site a");
        page(d, "b", "site b");
        page(d, "c", "site c");
        page(d, "default", "default site");
        std::fs::write(d.join("default/only-default.txt"), "only here").unwrap();
    })
}

/// A rustls client trusting certificates A and B.
fn tls_config(dir: &Path, proto: Proto) -> rustls::ClientConfig {
    common::tls::ClientTls::trusting_all(&[dir.join("a.crt"), dir.join("b.crt")])
        .proto(proto)
        .build()
}

/// reqwest resolving the test names to the TLS listener (SNI = the URL's host).
fn client(s: &TestServer, proto: Proto) -> reqwest::Client {
    let mut b = common::tls::proto_builder(tls_config(s.dir.path(), proto), proto)
        .redirect(reqwest::redirect::Policy::none());
    for n in ["a.test", "b.test", "c.test", "x.w.test"] {
        b = b.resolve(n, s.addrs[0]);
    }
    b.build().unwrap()
}

async fn get(c: &reqwest::Client, url: &str) -> (u16, String) {
    let r = c.get(url).send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sites_answer_by_host_over_tls_with_sni() {
    let s = start();
    let port = s.addrs[0].port();
    for proto in BOTH {
        let c = client(&s, proto);
        for (host, want) in [
            ("a.test", "site a"),
            ("b.test", "site b"),
            ("x.w.test", "site b"),
            ("c.test", "site c"),
        ] {
            let (st, body) = get(&c, &format!("https://{host}:{port}/")).await;
            assert_eq!((st, body.as_str()), (200, want), "{proto:?} {host}");
        }
        // a site's own routes only: no falling through to the default site
        let (st, _) = get(&c, &format!("https://b.test:{port}/only-default.txt")).await;
        assert_eq!(st, 404, "{proto:?}");
    }
}

/// Plain HTTP (no SNI): the Host alone picks the site, without port, case or trailing dot;
/// unknown names, a bare `w.test` (the wildcard needs a label) and two labels under it get
/// the default site.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_selects_site_and_unknown_names_get_default() {
    let s = start();
    let c = common::plain_client();
    for (host, want) in [
        ("a.test", "site a"),
        ("A.TEST:8080", "site a"),
        ("a.test.", "site a"),
        ("B.Test", "site b"),
        ("deep.w.test", "site b"),
        ("w.test", "default site"),
        ("y.x.w.test", "default site"),
        ("unknown.test", "default site"),
        ("127.0.0.1", "default site"),
        ("[::1]:80", "default site"),
    ] {
        let r = c
            .get(format!("{}/", s.http()))
            .header("host", host)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{host}");
        assert_eq!(r.text().await.unwrap(), want, "{host}");
    }
}

/// Connects with SNI `sni`, sends one GET for `https://{host}/` (HTTP/1.1: `Host: host`;
/// HTTP/2: `:authority` = host) and returns the status and body.
async fn get_with_sni(
    s: &TestServer,
    addr: SocketAddr,
    sni: &str,
    host: &str,
    proto: Proto,
) -> (u16, String) {
    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls_config(s.dir.path(), proto)));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = connector
        .connect(ServerName::try_from(sni.to_owned()).unwrap(), tcp)
        .await
        .unwrap();
    let io = TokioIo::new(tls);
    let resp = match proto {
        Proto::H1 => {
            let (mut send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
            tokio::spawn(conn);
            let req = http::Request::get("/")
                .header("host", host)
                .body(Empty::<bytes::Bytes>::new())
                .unwrap();
            send.send_request(req).await.unwrap()
        }
        Proto::H2 => {
            let (mut send, conn) =
                hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                    .await
                    .unwrap();
            tokio::spawn(conn);
            let req = http::Request::get(format!("https://{host}/"))
                .body(Empty::<bytes::Bytes>::new())
                .unwrap();
            send.send_request(req).await.unwrap()
        }
    };
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_naming_another_site_than_sni_is_misdirected() {
    let s = start();
    let addr = s.addrs[0];
    for proto in BOTH {
        // SNI a.test, Host b.test: certificate A is not B's: 421
        let (st, _) = get_with_sni(&s, addr, "a.test", "b.test", proto).await;
        assert_eq!(st, 421, "{proto:?}");
        let (st, _) = get_with_sni(&s, addr, "a.test", "B.TEST.:443", proto).await;
        assert_eq!(st, 421, "{proto:?} case, dot and port");
        let (st, _) = get_with_sni(&s, addr, "x.w.test", "a.test", proto).await;
        assert_eq!(st, 421, "{proto:?} wildcard SNI");
        // the default site has no certificate of its own: not A's
        let (st, _) = get_with_sni(&s, addr, "a.test", "unknown.test", proto).await;
        assert_eq!(st, 421, "{proto:?} default site");
        // a and c share certificate A: c is answered on a's connection
        let (st, body) = get_with_sni(&s, addr, "a.test", "c.test", proto).await;
        assert_eq!((st, body.as_str()), (200, "site c"), "{proto:?}");
        // same site by another name
        let (st, body) = get_with_sni(&s, addr, "y.w.test", "b.test", proto).await;
        assert_eq!((st, body.as_str()), (200, "site b"), "{proto:?}");
    }
}

/// Without sites nothing changes: any Host, any SNI, the top-level routes answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_sites_every_host_gets_the_routes() {
    let s = common::start_with("", |d| {
        std::fs::write(d.join("site/index.html"), "routes").unwrap();
    });
    let c = common::client(&s.cert(), Proto::H1);
    let r = c
        .get(format!("{}/", s.https()))
        .header("host", "anything.test")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "routes");
}

// ---------------------------------------------------------------------------------------------
// Header rules, expires, redirects

/// A TLS listener, a plain one, and a plain one that redirects everything to HTTPS. The
/// top-level routes: `/` static with header edits, `/assets` static with `expires`, `/old`
/// a redirect, `/api` a proxy to `upstream` with request header edits. Site `h.test` with
/// site-level edits under its route's.
fn start_rules(upstream: SocketAddr) -> TestServer {
    let config = format!(
        r#"
[[listener]]
address = "127.0.0.1:0"
[listener.tls]
self_signed = true
[[listener]]
address = "127.0.0.1:0"
[[listener]]
address = "127.0.0.1:0"
redirect = {{ to = "https://{{host}}{{uri}}", status = 308 }}

[[route]]
prefix = "/"
root = "{{dir}}/site"
headers = {{ set = {{ "Strict-Transport-Security" = "max-age=63072000" }}, add = {{ "X-Multi" = ["one", "two"] }}, remove = ["Last-Modified"] }}

[[route]]
prefix = "/assets"
root = "{{dir}}/site"
expires = {{ "text/css" = "720h", "image/*" = "1h", "*" = "0s" }}

[[route]]
prefix = "/old"
redirect = {{ to = "https://{{host}}/new{{query}}", status = 301 }}

[[route]]
prefix = "/api"
upstreams = ["{upstream}"]
request_headers = {{ set = {{ "X-Env" = "test" }}, add = {{ "X-Tag" = ["a", "b"] }}, remove = ["Cookie"] }}
headers = {{ set = {{ "Access-Control-Allow-Origin" = "*" }} }}

[[site]]
server_names = ["h.test"]
headers = {{ set = {{ "X-Site" = "site", "Cache-Control" = "no-store" }}, add = {{ "X-Multi" = "site" }} }}
[[site.route]]
prefix = "/"
root = "{{dir}}/site"
headers = {{ set = {{ "X-Site" = "route" }}, add = {{ "X-Multi" = ["one", "two"] }} }}
"#
    );
    common::start_with(&config, |d| {
        std::fs::write(d.join("site/index.html"), "<p>hi</p>").unwrap();
        std::fs::create_dir_all(d.join("site/assets")).unwrap();
        std::fs::write(d.join("site/assets/a.css"), "p{}").unwrap();
        std::fs::write(d.join("site/assets/a.png"), "png").unwrap();
        std::fs::write(d.join("site/assets/a.txt"), "txt").unwrap();
    })
}

fn all(r: &reqwest::Response, name: &str) -> Vec<String> {
    r.headers()
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_headers_set_add_remove_per_site_and_route() {
    let up = common::recorder::start().await;
    let s = start_rules(up.addr);
    for proto in BOTH {
        let c = common::client(&s.cert(), proto);
        let r = c.get(format!("{}/", s.https())).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(all(&r, "strict-transport-security"), ["max-age=63072000"]);
        assert_eq!(
            all(&r, "x-multi"),
            ["one", "two"],
            "{proto:?}: add keeps both"
        );
        assert!(
            r.headers().get("last-modified").is_none(),
            "{proto:?}: removed"
        );
        assert!(r.headers().get("etag").is_some(), "{proto:?}: others stay");
    }
    // the site's edits, then the route's: `set` replaces, `add` appends
    let c = common::plain_client();
    let r = c
        .get(format!("{}/", s.http()))
        .header("host", "h.test")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(all(&r, "x-site"), ["route"]);
    assert_eq!(all(&r, "x-multi"), ["site", "one", "two"]);
    assert_eq!(all(&r, "cache-control"), ["no-store"]);
    // the site's edits also on its 404s
    let r = c
        .get(format!("{}/missing", s.http()))
        .header("host", "h.test")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(all(&r, "x-site"), ["route"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_headers_edit_what_the_upstream_gets() {
    let up = common::recorder::start().await;
    let s = start_rules(up.addr);
    let c = common::plain_client();
    let r = c
        .get(format!("{}/api/x", s.http()))
        .header("cookie", "secret=1")
        .header("x-env", "prod")
        .header("x-tag", "client")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(all(&r, "access-control-allow-origin"), ["*"]);
    let got = up.take();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].header_all("x-env"), ["test"], "set replaces");
    assert_eq!(
        got[0].header_all("x-tag"),
        ["client", "a", "b"],
        "add appends"
    );
    assert!(got[0].header("cookie").is_none(), "removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expires_sets_max_age_by_content_type() {
    let up = common::recorder::start().await;
    let s = start_rules(up.addr);
    let c = common::plain_client();
    for (file, want) in [
        ("a.css", "max-age=2592000"),
        ("a.png", "max-age=3600"),
        ("a.txt", "max-age=0"),
    ] {
        let r = c
            .get(format!("{}/assets/{file}", s.http()))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{file}");
        assert_eq!(all(&r, "cache-control"), [want], "{file}");
    }
    // not on errors
    let r = c
        .get(format!("{}/assets/missing.css", s.http()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert!(r.headers().get("cache-control").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_keep_the_query_and_refuse_hostile_hosts() {
    let up = common::recorder::start().await;
    let s = start_rules(up.addr);
    let c = common::plain_client();
    let redirecting = format!("http://{}", s.addrs[2]);
    let r = c
        .post(format!("{redirecting}/a/b%20c?x=1&y=%2F"))
        .header("host", "Example.test:8080")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 308);
    assert_eq!(
        all(&r, "location"),
        ["https://example.test/a/b%20c?x=1&y=%2F"]
    );
    // a route's redirect
    let r = c
        .get(format!("{}/old/page?q=1", s.http()))
        .header("host", "www.test")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 301);
    assert_eq!(all(&r, "location"), ["https://www.test/new?q=1"]);
    // hostile Host values never reach Location
    for host in ["evil.test/x", "a@evil.test", "evil.test\\x", "a b"] {
        let req = format!("GET /p HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        let out = common::raw_exchange(
            s.addrs[2],
            req.as_bytes(),
            std::time::Duration::from_secs(5),
        )
        .await;
        let out = String::from_utf8_lossy(&out);
        assert!(out.starts_with("HTTP/1.1 400"), "{host:?}: {out}");
        assert!(
            !out.to_ascii_lowercase().contains("location"),
            "{host:?}: {out}"
        );
    }
    // HTTP/1.0 without Host, no SNI: no host to redirect to
    let out = common::raw_exchange(
        s.addrs[2],
        b"GET /p HTTP/1.0\r\n\r\n",
        std::time::Duration::from_secs(5),
    )
    .await;
    assert!(
        String::from_utf8_lossy(&out).starts_with("HTTP/1.0 400"),
        "{}",
        String::from_utf8_lossy(&out)
    );
}

/// Header rules and redirects are checked when the file is loaded, naming the key.
#[test]
fn header_and_redirect_keys_are_validated() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let bad = [
        (
            format!("[[route]]\nprefix = \"/\"\nroot = \"{d}\"\nheaders = {{ set = {{ \"X-A\" = \"a\\r\\nInjected: 1\" }} }}\n"),
            "route[0].headers.set",
        ),
        (
            format!("[[route]]\nprefix = \"/\"\nroot = \"{d}\"\nheaders = {{ set = {{ \"Content-Length\" = \"0\" }} }}\n"),
            "route[0].headers.set",
        ),
        (
            format!("[[route]]\nprefix = \"/\"\nroot = \"{d}\"\nheaders = {{ remove = [\"Transfer-Encoding\"] }}\n"),
            "route[0].headers.remove",
        ),
        (
            format!("[[route]]\nprefix = \"/\"\nroot = \"{d}\"\nheaders = {{ add = {{ \"Bad Name\" = \"x\" }} }}\n"),
            "route[0].headers.add",
        ),
        (
            format!("[[route]]\nprefix = \"/\"\nroot = \"{d}\"\nrequest_headers = {{ set = {{ \"X\" = \"y\" }} }}\n"),
            "route[0].request_headers",
        ),
        (
            format!("[[route]]\nprefix = \"/\"\nroot = \"{d}\"\nexpires = {{ \"css\" = \"1h\" }}\n"),
            "route[0].expires",
        ),
        (
            "[[route]]\nprefix = \"/\"\nredirect = { to = \"https://{host}{nope}\" }\n".to_owned(),
            "route[0].redirect.to",
        ),
        (
            "[[route]]\nprefix = \"/\"\nredirect = { to = \"https://x/\", status = 200 }\n".to_owned(),
            "route[0].redirect.status",
        ),
        (
            format!("[[route]]\nprefix = \"/\"\nroot = \"{d}\"\nredirect = {{ to = \"https://x/\" }}\n"),
            "route[0].redirect",
        ),
        (
            "[[listener]]\naddress = \"127.0.0.1:0\"\nredirect = { to = \"https://{host\" }\n".to_owned(),
            "listener[0].redirect.to",
        ),
        (
            format!("[[site]]\nserver_names = [\"a.test\"]\nheaders = {{ set = {{ \"Connection\" = \"close\" }} }}\n[[site.route]]\nprefix = \"/\"\nroot = \"{d}\"\n"),
            "site[0].headers.set",
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
// Rewrites and try_files

fn start_rewrites() -> TestServer {
    let config = r#"
rewrite = [
  { from = "^/old/(.*)$", to = "/new/$1" },
  { from = "^/named/(?P<rest>.*)$", to = "/new/${rest}" },
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
    let browser = std::env::var("QWEB_CHROMIUM").ok().or_else(|| {
        ["chromium", "chromium-browser", "google-chrome"]
            .into_iter()
            .find(|b| {
                std::process::Command::new(b)
                    .arg("--version")
                    .output()
                    .is_ok_and(|o| o.status.success())
            })
            .map(str::to_owned)
    });
    let Some(browser) = browser else {
        eprintln!("SKIPPED: no chromium (apt-get install chromium, or set QWEB_CHROMIUM)");
        return;
    };
    let s = start_errors();
    let profile = tempfile::tempdir().unwrap();
    let dom = |path: &str| -> String {
        let out = std::process::Command::new("timeout")
            .arg("90")
            .arg(&browser)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--ignore-certificate-errors",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("--dump-dom")
            .arg(format!("{}{path}", s.http()))
            .output()
            .expect("run chromium");
        assert!(
            out.status.success(),
            "chromium failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("dom is utf-8")
    };
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
    let items: Vec<&str> = html.lines().filter(|l| l.starts_with("<li>")).collect();
    assert_eq!(
        items,
        [
            "<li><a href=\"../\">../</a></li>",
            "<li><a href=\"%3Cscript%3E.html\">&lt;script&gt;.html</a></li>",
            "<li><a href=\"A.txt\">A.txt</a></li>",
            "<li><a href=\"b.txt\">b.txt</a></li>",
            "<li><a href=\"javascript%3Aalert%281%29\">javascript:alert(1)</a></li>",
            "<li><a href=\"q%27%22%26.txt\">q&#39;&quot;&amp;.txt</a></li>",
            "<li><a href=\"sub%20dir/\">sub dir/</a></li>",
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
