//! `[[site]]`: virtual hosts over real TLS with SNI. Two sites (and a third sharing the first
//! one's certificate) on one listener answer different content by Host; wildcard names; the
//! top-level routes as the default site; 421 Misdirected Request when the Host names a site
//! the SNI's certificate is not for, on HTTP/1.1 and HTTP/2. Then header rules (set, add,
//! remove, expires) and redirects per site and route. (Rewrites, error pages, charset,
//! autoindex and site certificates: `site_pages.rs`.)

use qweb_testkit as common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use common::{Proto, TestServer, BOTH};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;

fn cert(dir: &Path, file: &str, names: &[&str]) {
    common::tls::write_self_signed(dir, file, names);
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

use common::tls::get_text as get;

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
    // HTTP/1.0 without Host, no SNI: no host to redirect to (answered as HTTP/1.1, the
    // highest version of the client's major one: RFC 9110 section 2.5, as nginx does)
    let out = common::raw_exchange(
        s.addrs[2],
        b"GET /p HTTP/1.0\r\n\r\n",
        std::time::Duration::from_secs(5),
    )
    .await;
    assert!(
        String::from_utf8_lossy(&out).starts_with("HTTP/1.1 400"),
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
