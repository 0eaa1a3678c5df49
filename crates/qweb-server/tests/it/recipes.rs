//! The README's "Recipes": each config block is read from README.md, given test addresses,
//! folders and certificates, loaded, started, and exercised over real TLS with SNI.

use qweb_testkit as common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use qweb_server::{Config, RunningServer, Server};

/// The ```toml blocks of the README's "## Recipes" section, in order.
fn recipes() -> Vec<String> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
            .unwrap();
    let start = readme.find("\n## Recipes\n").expect("a Recipes section");
    let section = &readme[start + 1..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
    let mut out = Vec::new();
    let mut rest = section;
    while let Some(i) = rest.find("```toml\n") {
        let body = &rest[i + 8..];
        let end = body.find("```").unwrap();
        out.push(body[..end].to_owned());
        rest = &body[end..][3..];
    }
    out
}

fn cert(dir: &Path, name: &str, names: &[&str]) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let c = rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .unwrap()
        .self_signed(&key)
        .unwrap();
    std::fs::write(dir.join(format!("{name}.crt")), c.pem()).unwrap();
    std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
}

struct Recipe {
    server: Option<RunningServer>,
    addrs: Vec<SocketAddr>,
    dir: tempfile::TempDir,
}

impl Drop for Recipe {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            std::thread::spawn(move || s.shutdown());
        }
    }
}

/// Starts recipe `text` with its addresses on 127.0.0.1:0, `/srv` and `/etc/qweb` in a
/// temporary folder (with the files the tests fetch), and `upstream` for 127.0.0.1:3000.
fn start(text: &str, upstream: Option<SocketAddr>) -> Recipe {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("etc")).unwrap();
    cert(
        &d.join("etc"),
        "example.com",
        &["example.com", "www.example.com"],
    );
    cert(
        &d.join("etc"),
        "example.org",
        &["example.org", "*.example.org"],
    );
    // recipe 9's client CA (`client-ca.crt`) and the certificates its clients present
    common::tls::client_pki(&d.join("etc"));
    for (path, body) in [
        ("www/index.html", "www index"),
        ("www/assets/app.css", "p{}"),
        ("www/assets/logo.png", "png"),
        ("www/assets/data.bin", "bin"),
        ("app/dist/index.html", "spa shell"),
        ("app/dist/app.js", "js"),
        ("app/dist/50x.html", "down"),
        ("example.com/index.html", "example.com site"),
        ("example.org/index.html", "example.org site"),
    ] {
        let p = d.join("srv").join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, body).unwrap();
    }
    // recipe 7's users: alice, password "s3cret" (bcrypt at its lowest cost, for speed)
    std::fs::write(
        d.join("etc/admin.htpasswd"),
        format!("alice:{}\n", bcrypt::hash("s3cret", 4).unwrap()),
    )
    .unwrap();
    let mut text = text
        .replace("0.0.0.0:443", "127.0.0.1:0")
        .replace("0.0.0.0:80", "127.0.0.1:0")
        .replace("/srv/", &format!("{}/srv/", d.display()))
        .replace("/etc/qweb/", &format!("{}/etc/", d.display()));
    if let Some(u) = upstream {
        text = text.replace("127.0.0.1:3000", &u.to_string());
    }
    let text = format!("workers = 1\nstate_dir = \"{}/state\"\n{text}", d.display());
    let config = Config::from_str_at(&text, None).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let server = Server::start(config).unwrap();
    Recipe {
        addrs: server.local_addrs().to_vec(),
        server: Some(server),
        dir,
    }
}

/// A client TLS configuration that trusts the recipes' certificates (HTTP/1.1).
fn tls_config(r: &Recipe) -> rustls::ClientConfig {
    let etc = r.dir.path().join("etc");
    common::tls::ClientTls::trusting_all(&[
        etc.join("example.com.crt"),
        etc.join("example.org.crt"),
    ])
    .build()
}

/// A client trusting both test certificates, resolving the example names to `addr`.
fn client(r: &Recipe, addr: SocketAddr) -> reqwest::Client {
    let mut b =
        common::tls::https_builder(tls_config(r)).redirect(reqwest::redirect::Policy::none());
    for n in [
        "example.com",
        "www.example.com",
        "example.org",
        "blog.example.org",
    ] {
        b = b.resolve(n, addr);
    }
    b.build().unwrap()
}

fn header(r: &reqwest::Response, name: &str) -> String {
    r.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

#[test]
fn readme_has_ten_recipes() {
    assert_eq!(recipes().len(), 10);
}

/// Recipe 10's SSO service: 200 with `X-User: alice` to a request with the cookie
/// `session=ok`, else 302 to the login page.
async fn sso() -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    |req: hyper::Request<hyper::body::Incoming>| async move {
                        let ok = req
                            .headers()
                            .get("cookie")
                            .is_some_and(|c| c.as_bytes() == b"session=ok");
                        let b = hyper::Response::builder();
                        let r = if ok {
                            b.header("x-user", "alice")
                        } else {
                            b.status(302)
                                .header("location", "https://sso.example.com/login")
                        };
                        Ok::<_, std::convert::Infallible>(
                            r.body(http_body_util::Empty::<bytes::Bytes>::new())
                                .unwrap(),
                        )
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recipe_10_office_only_admin_and_single_sign_on() {
    let up = common::recorder::start().await;
    let auth = sso().await;
    let text = recipes()[9].replace("127.0.0.1:4181", &auth.to_string());
    let r = start(&text, Some(up.addr));
    let c = client(&r, r.addrs[0]);
    let port = r.addrs[0].port();
    let app = format!("https://example.com:{port}/app");
    // no session: the SSO's redirect to its login page, nothing reaches the app
    let resp = c.get(&app).send().await.unwrap();
    assert_eq!(resp.status(), 302);
    assert_eq!(header(&resp, "location"), "https://sso.example.com/login");
    assert!(up.take().is_empty());
    // a session: the app sees the SSO's user, not the client's
    let resp = c
        .get(&app)
        .header("cookie", "session=ok")
        .header("x-user", "mallory")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(up.take()[0].header_all("x-user"), ["alice"]);
    // the admin pages: 127.0.0.1 is not the office
    for path in ["/admin", "/admin;x", "//admin/users"] {
        let resp = c
            .get(format!("https://example.com:{port}{path}"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 403, "{path}");
    }
    assert!(up.take().is_empty());
    // from the office (here: this machine), served
    let office = recipes()[9]
        .replace("127.0.0.1:4181", &auth.to_string())
        .replace("\"192.0.2.0/24\"", "\"127.0.0.0/8\"");
    let r = start(&office, Some(up.addr));
    let c = client(&r, r.addrs[0]);
    let resp = c
        .get(format!("https://example.com:{}/admin", r.addrs[0].port()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recipe_9_internal_api_with_client_certificates() {
    let up = common::recorder::start().await;
    let r = start(&recipes()[8], Some(up.addr));
    let port = r.addrs[0].port();
    let etc = r.dir.path().join("etc");
    let with = |stem: Option<&str>| {
        let mut tls = common::tls::ClientTls::trusting(&etc.join("example.com.crt"));
        if let Some(s) = stem {
            tls = tls.client_cert(&etc.join(format!("{s}.crt")), &etc.join(format!("{s}.key")));
        }
        common::tls::https_builder(tls.build())
            .resolve("example.com", r.addrs[0])
            .build()
            .unwrap()
    };
    // ops_box: `box1.ops.example`, a name `*.ops.example` accepts
    let resp = with(Some("ops_box"))
        .get(format!("https://example.com:{port}/orders"))
        .header("x-client-subject", "CN=admin")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let got = up.take();
    assert_eq!(got[0].header_all("x-client-subject"), ["CN=box1,O=ops"]);
    assert_eq!(
        got[0].header("x-client-fingerprint").map(|f| f.len()),
        Some(64)
    );
    // alice: the CA's, without a name; api: another name of the CA's
    for stem in [
        None,
        Some("stranger"),
        Some("expired"),
        Some("alice"),
        Some("api"),
    ] {
        let r = with(stem)
            .get(format!("https://example.com:{port}/orders"))
            .send()
            .await;
        assert!(r.is_err(), "{stem:?}: {r:?}");
    }
    assert!(
        up.take().is_empty(),
        "no request without a good certificate reached the app"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recipe_8_behind_an_l4_load_balancer() {
    use tokio::io::AsyncWriteExt;
    let up = common::recorder::start().await;
    // the test's balancer is 127.0.0.1
    let text = recipes()[7].replace("10.0.0.0/8", "127.0.0.1");
    let r = start(&text, Some(up.addr));
    let addr = r.addrs[0];
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let header = common::wire::proxy_v2("203.0.113.7:51000".parse().unwrap(), addr, &[]);
    tcp.write_all(&header).await.unwrap();
    let cfg = Arc::new(tls_config(&r));
    let name = rustls::pki_types::ServerName::try_from("example.com").unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(cfg)
        .connect(name, tcp)
        .await
        .expect("TLS after the PROXY header");
    tls.write_all(b"GET / HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let resp = common::wire::read_response(&mut tls, std::time::Duration::from_secs(10))
        .await
        .expect("an answer");
    assert_eq!(resp.status, 200, "{}", resp.head);
    let seen = up.take();
    assert_eq!(seen[0].header("x-real-ip").as_deref(), Some("203.0.113.7"));
    // the balancer's address without a header: closed, nothing served
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let _ = tcp
        .write_all(b"GET / HTTP/1.1\r\nHost: example.com\r\n\r\n")
        .await;
    assert!(
        common::wire::closed_within(&mut tcp, std::time::Duration::from_secs(5)).await,
        "a connection from the balancer without a header is closed"
    );
    assert!(up.take().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recipe_6_rate_limit_on_a_login_page() {
    let up = common::recorder::start().await;
    let r = start(&recipes()[5], Some(up.addr));
    let port = r.addrs[0].port();
    let c = client(&r, r.addrs[0]);
    let mut got = Vec::new();
    for _ in 0..6 {
        let resp = c
            .post(format!("https://example.com:{port}/login"))
            .send()
            .await
            .unwrap();
        got.push((resp.status().as_u16(), header(&resp, "retry-after")));
    }
    let statuses: Vec<u16> = got.iter().map(|g| g.0).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429], "{got:?}");
    assert_eq!(got[5].1, "12");
    assert_eq!(up.take().len(), 5, "the sixth never reached the app");
    let resp = c
        .get(format!("https://example.com:{port}/"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "other paths are not limited");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recipe_7_login_protected_admin_path_with_a_rate_limit() {
    use base64::Engine as _;
    let up = common::recorder::start().await;
    let r = start(&recipes()[6], Some(up.addr));
    let port = r.addrs[0].port();
    let c = client(&r, r.addrs[0]);
    let basic = |p: &str| {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("alice:{p}"))
        )
    };
    let url = format!("https://example.com:{port}/admin;x/users");
    let resp = c.get(&url).send().await.unwrap();
    assert_eq!(resp.status(), 401);
    assert_eq!(
        header(&resp, "www-authenticate"),
        "Basic realm=\"admin\", charset=\"UTF-8\""
    );
    let resp = c
        .get(&url)
        .header("authorization", basic("s3cret"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let got = up.take();
    assert_eq!(
        got.len(),
        1,
        "only the authenticated request reached the app"
    );
    assert!(got[0].header("authorization").is_none(), "{}", got[0].head);
    // 10 at once, then 429 before any password is checked
    let mut statuses = Vec::new();
    for _ in 0..10 {
        let resp = c
            .get(&url)
            .header("authorization", basic("guess"))
            .send()
            .await
            .unwrap();
        statuses.push(resp.status().as_u16());
    }
    assert_eq!(statuses, [401, 401, 401, 401, 401, 401, 401, 401, 429, 429]);
    let resp = c
        .get(format!("https://example.com:{port}/"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "the rest of the site asks for nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recipe_1_static_site_with_https_redirect_and_hsts() {
    let r = start(&recipes()[0], None);
    let port = r.addrs[0].port();
    let c = client(&r, r.addrs[0]);
    let resp = c
        .get(format!("https://example.com:{port}/"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        header(&resp, "strict-transport-security"),
        "max-age=63072000; includeSubDomains"
    );
    assert_eq!(resp.text().await.unwrap(), "www index");
    let resp = common::plain_client()
        .get(format!("http://{}/docs/a?x=1&y=2", r.addrs[1]))
        .header("host", "example.com")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 308);
    assert_eq!(
        header(&resp, "location"),
        "https://example.com/docs/a?x=1&y=2"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recipe_2_single_page_app() {
    let r = start(&recipes()[1], None);
    let port = r.addrs[0].port();
    let c = client(&r, r.addrs[0]);
    for (path, want) in [
        ("/", "spa shell"),
        ("/users/42", "spa shell"),
        ("/app.js", "js"),
    ] {
        let resp = c
            .get(format!("https://example.com:{port}{path}"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        assert_eq!(resp.text().await.unwrap(), want, "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recipe_3_reverse_proxy() {
    let up = common::recorder::start().await;
    let r = start(&recipes()[2], Some(up.addr));
    let port = r.addrs[0].port();
    let c = client(&r, r.addrs[0]);
    let resp = c
        .get(format!("https://example.com:{port}/api/items?page=2"))
        .header("x-env", "dev")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(header(&resp, "x-frame-options"), "DENY");
    let got = up.take();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].target(), "/api/items?page=2");
    assert_eq!(got[0].header_all("x-env"), ["production"]);
    assert_eq!(got[0].header("x-forwarded-proto").as_deref(), Some("https"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recipe_3_passes_websocket() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let up = common::ws::ws_echo().await;
    let r = start(&recipes()[2], Some(up));
    let tcp = tokio::net::TcpStream::connect(r.addrs[0]).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(tls_config(&r)))
        .connect("example.com".try_into().unwrap(), tcp)
        .await
        .unwrap();
    let url = format!("wss://example.com:{}/chat", r.addrs[0].port());
    let (mut ws, _) = tokio_tungstenite::client_async(url, tls)
        .await
        .expect("a WebSocket through recipe 3");
    ws.send(Message::text("hello")).await.unwrap();
    let m = ws.next().await.unwrap().unwrap();
    assert_eq!(m.into_text().unwrap(), "hello");
    ws.close(None).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recipe_4_two_sites_on_one_ip() {
    let r = start(&recipes()[3], None);
    let port = r.addrs[0].port();
    let c = client(&r, r.addrs[0]);
    for (host, want) in [
        ("example.com", "example.com site"),
        ("www.example.com", "example.com site"),
        ("example.org", "example.org site"),
        ("blog.example.org", "example.org site"),
    ] {
        let resp = c
            .get(format!("https://{host}:{port}/"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{host}");
        assert_eq!(resp.text().await.unwrap(), want, "{host}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recipe_5_caching_headers_for_assets() {
    let r = start(&recipes()[4], None);
    let port = r.addrs[0].port();
    let c = client(&r, r.addrs[0]);
    for (path, want) in [
        ("/", "no-cache"),
        ("/assets/app.css", "max-age=31536000"),
        ("/assets/logo.png", "max-age=2592000"),
        ("/assets/data.bin", "max-age=3600"),
    ] {
        let resp = c
            .get(format!("https://example.com:{port}{path}"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        assert_eq!(header(&resp, "cache-control"), want, "{path}");
    }
}
