//! The access log through the real binary: `[log] access_file` in JSON and combined formats,
//! reopened on SIGUSR1 after a logrotate-style move, format switched by a reload; and a plain
//! HTTP request on a TLS port answered with nginx's 400 page; a cached proxy route's lines
//! saying what the cache did.

use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use qweb_testkit::free_port;
use qweb_testkit::process::Qweb;
use qweb_testkit::tls::{proto_builder, tls_client_config, Proto};

const BIN: &str = env!("CARGO_BIN_EXE_qweb");

/// Waits until `path` has `n` lines; returns them.
fn lines_of(path: &Path, n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<String> = text.lines().map(str::to_owned).collect();
        if lines.len() >= n {
            return lines;
        }
        assert!(
            Instant::now() < deadline,
            "{} has {lines:?}, wanted {n} lines",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn client(ca: &Path) -> reqwest::Client {
    proto_builder(tls_client_config(ca, Proto::H2), Proto::H2)
        .build()
        .unwrap()
}

/// A TLS listener on `port` (fixed, so that a reload keeps it).
fn config(d: &Path, port: u16, format: &str) -> String {
    let d = d.display();
    format!(
        "workers = 1\nstate_dir = \"{d}/state\"\n[log]\naccess_file = \"logs/access.log\"\n\
         format = \"{format}\"\n[[listener]]\naddress = \"127.0.0.1:{port}\"\nhttp2 = true\n\
         [listener.tls]\nself_signed = true\n\
         [[route]]\nprefix = \"/\"\nroot = \"{d}/site\"\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_file_json_reopen_on_sigusr1_and_combined_after_reload() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("site")).unwrap();
    std::fs::create_dir_all(d.join("logs")).unwrap();
    std::fs::write(d.join("site/hello.txt"), "hello").unwrap();
    let file = d.join("qweb.toml");
    let port = free_port();
    std::fs::write(&file, config(d, port, "json")).unwrap();
    let qweb = Qweb::serve(BIN, &file);
    let c = client(&d.join("state/selfsigned.crt"));
    let url = format!(
        "https://localhost:{}",
        qweb.addrs()[0].rsplit(':').next().unwrap()
    );
    let get = |path: &str, ua: &str| {
        c.get(format!("{url}{path}"))
            .header("user-agent", ua)
            .header("referer", "https://ref.example/\"x")
            .send()
    };
    let r = get("/hello.txt", "ua-one \"q\"").await.unwrap();
    assert_eq!(r.status(), 200);
    let log = d.join("logs/access.log");
    let first = lines_of(&log, 1);
    let v: serde_json::Value = serde_json::from_str(&first[0]).unwrap();
    assert_eq!(v["target"], "/hello.txt");
    assert_eq!(v["status"], 200);
    assert_eq!(v["bytes"], 5);
    assert_eq!(v["protocol"], "HTTP/2");
    assert_eq!(v["tls"], "TLSv1.3");
    assert_eq!(v["user_agent"], "ua-one \"q\"");
    assert_eq!(v["referer"], "https://ref.example/\"x");
    assert!(v["host"].as_str().unwrap().starts_with("localhost:"), "{v}");
    assert!(v["request_time"].as_f64().unwrap() >= 0.0);

    // logrotate: move the file away, SIGUSR1, the next line goes to a new file
    std::fs::rename(&log, d.join("logs/access.log.1")).unwrap();
    qweb.signal(libc::SIGUSR1);
    qweb.wait_for_within("access log reopened", 1, Duration::from_secs(20));
    assert_eq!(get("/missing", "ua-two").await.unwrap().status(), 404);
    let second = lines_of(&log, 1);
    assert!(second[0].contains("\"status\":404"), "{second:?}");
    assert_eq!(lines_of(&d.join("logs/access.log.1"), 1).len(), 1);

    // a reload switches the format for new requests
    std::fs::write(&file, config(d, port, "combined")).unwrap();
    qweb.signal(libc::SIGHUP);
    qweb.wait_for_within("configuration reloaded", 1, Duration::from_secs(20));
    let c2 = client(&d.join("state/selfsigned.crt"));
    let r = c2
        .get(format!("{url}/hello.txt"))
        .header("user-agent", "ua-three")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let lines = lines_of(&log, 2);
    // 127.0.0.1 - - [30/Nov/2026:07:00:00 +0000] "GET /hello.txt HTTP/2" 200 5 "-" "ua-three" 0.001 TLSv1.3
    let l = &lines[1];
    assert!(l.starts_with("127.0.0.1 - - ["), "{l}");
    assert!(
        l.contains("] \"GET /hello.txt HTTP/2\" 200 5 \"-\" \"ua-three\" "),
        "{l}"
    );
    assert!(l.ends_with(" TLSv1.3"), "{l}");
}

#[test]
fn plain_http_on_a_tls_port_gets_the_400_page() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("site")).unwrap();
    std::fs::create_dir_all(d.join("logs")).unwrap();
    let file = d.join("qweb.toml");
    std::fs::write(&file, config(d, free_port(), "qweb")).unwrap();
    let qweb = Qweb::serve(BIN, &file);
    let mut s = std::net::TcpStream::connect(&qweb.addrs()[0]).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nUser-Agent: curl\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{out}");
    assert!(
        out.contains("The plain HTTP request was sent to HTTPS port"),
        "{out}"
    );
    // TLS still works on the port (an empty site without index: 403)
    let rt = tokio::runtime::Runtime::new().unwrap();
    let port = qweb.addrs()[0].rsplit(':').next().unwrap().to_owned();
    let ca = d.join("state/selfsigned.crt");
    let r = rt
        .block_on(async {
            client(&ca)
                .get(format!("https://localhost:{port}/"))
                .send()
                .await
        })
        .unwrap();
    assert_eq!(r.status(), 403);
}

/// An origin that answers everything with `Cache-Control: max-age=60`.
async fn cacheable_origin() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|_req| async {
                    let r = hyper::Response::builder()
                        .header("cache-control", "max-age=60")
                        .body(http_body_util::Full::new(bytes::Bytes::from_static(b"x")))
                        .unwrap();
                    Ok::<_, std::convert::Infallible>(r)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_route_logs_what_the_cache_did() {
    let up = cacheable_origin().await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("logs")).unwrap();
    let file = d.join("qweb.toml");
    let port = free_port();
    std::fs::write(
        &file,
        format!(
            "workers = 1\nstate_dir = \"{}/state\"\n[log]\naccess_file = \"logs/access.log\"\n\
             [[listener]]\naddress = \"127.0.0.1:{port}\"\n\
             [[route]]\nprefix = \"/\"\nupstreams = [\"{up}\"]\ncache = {{}}\n",
            d.display()
        ),
    )
    .unwrap();
    let _qweb = Qweb::serve(BIN, &file);
    let c = qweb_testkit::plain_client();
    let url = format!("http://127.0.0.1:{port}/a");
    for _ in 0..2 {
        assert_eq!(c.get(&url).send().await.unwrap().text().await.unwrap(), "x");
    }
    c.post(&url).body("b").send().await.unwrap();
    let lines = lines_of(&d.join("logs/access.log"), 3);
    let ends: Vec<&str> = lines
        .iter()
        .map(|l| l.rsplit(' ').next().unwrap_or(""))
        .collect();
    assert_eq!(
        ends,
        ["cache=MISS", "cache=HIT", "cache=BYPASS"],
        "{lines:?}"
    );
}

/// Behind a trusted L4 balancer (`proxy_protocol`), the access log names the address of the
/// PROXY header (v1 and v2, plain and TLS), not the balancer's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_names_the_proxy_headers_client() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("site")).unwrap();
    std::fs::create_dir_all(d.join("logs")).unwrap();
    std::fs::write(d.join("site/hello.txt"), "hello").unwrap();
    let (plain, tls) = (free_port(), free_port());
    let text = format!(
        "workers = 1\nstate_dir = \"{dd}/state\"\n[log]\naccess_file = \"logs/access.log\"\n\
         format = \"combined\"\n\
         [[listener]]\naddress = \"127.0.0.1:{plain}\"\nproxy_protocol = {{ trusted = [\"127.0.0.1\"] }}\n\
         [[listener]]\naddress = \"127.0.0.1:{tls}\"\nproxy_protocol = {{ trusted = [\"127.0.0.1\"] }}\n\
         [listener.tls]\nself_signed = true\n\
         [[route]]\nprefix = \"/\"\nroot = \"{dd}/site\"\n",
        dd = d.display()
    );
    let qweb = Qweb::serve_text(BIN, d, &text);
    let plain: std::net::SocketAddr = ([127, 0, 0, 1], plain).into();
    let tls: std::net::SocketAddr = ([127, 0, 0, 1], tls).into();
    let src = |s: &str| s.parse::<std::net::SocketAddr>().unwrap();
    let mut s = tokio::net::TcpStream::connect(plain).await.unwrap();
    let mut req = qweb_testkit::wire::proxy_v1(src("203.0.113.7:40000"), plain);
    req.extend_from_slice(b"GET /hello.txt HTTP/1.1\r\nHost: localhost\r\n\r\n");
    s.write_all(&req).await.unwrap();
    let r = qweb_testkit::wire::read_response(&mut s, Duration::from_secs(10)).await;
    assert_eq!(r.map(|r| r.status), Some(200));
    let mut tcp = tokio::net::TcpStream::connect(tls).await.unwrap();
    tcp.write_all(&qweb_testkit::wire::proxy_v2(
        src("[2001:db8::9]:40001"),
        tls,
        &[],
    ))
    .await
    .unwrap();
    let cfg = std::sync::Arc::new(tls_client_config(
        &d.join("state/selfsigned.crt"),
        Proto::H1,
    ));
    let mut t = tokio_rustls::TlsConnector::from(cfg)
        .connect(qweb_testkit::tls::localhost(), tcp)
        .await
        .unwrap();
    t.write_all(b"GET /hello.txt HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let r = qweb_testkit::wire::read_response(&mut t, Duration::from_secs(10)).await;
    assert_eq!(r.map(|r| r.status), Some(200));
    let lines = lines_of(&d.join("logs/access.log"), 2);
    assert!(lines[0].starts_with("203.0.113.7 - - ["), "{lines:?}");
    assert!(lines[1].starts_with("2001:db8::9 - - ["), "{lines:?}");
    assert!(lines[1].ends_with(" TLSv1.3"), "{lines:?}");
    drop(qweb);
}

/// `[listener.tls] client_auth`: a request on a connection with a verified client
/// certificate logs its subject and fingerprint (JSON fields; absent for an anonymous one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_logged_by_subject_and_fingerprint() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("site")).unwrap();
    std::fs::create_dir_all(d.join("logs")).unwrap();
    std::fs::write(d.join("site/hello.txt"), "hello").unwrap();
    qweb_testkit::tls::write_self_signed(d, "server", &["localhost"]);
    let pki = qweb_testkit::tls::client_pki(d);
    let file = d.join("qweb.toml");
    let port = free_port();
    let text = config(d, port, "json").replace(
        "self_signed = true\n",
        &format!(
            "certificates = [{{ cert = \"{0}/server.crt\", key = \"{0}/server.key\" }}]\n\
             client_auth = {{ ca = \"{1}\", required = false }}\n",
            d.display(),
            pki.ca.display()
        ),
    );
    std::fs::write(&file, text).unwrap();
    let qweb = Qweb::serve(BIN, &file);
    let url = format!(
        "https://localhost:{}/hello.txt",
        qweb.addrs()[0].rsplit(':').next().unwrap()
    );
    let (cert, key) = pki.client("alice");
    let tls = qweb_testkit::tls::ClientTls::trusting(&d.join("server.crt"))
        .proto(Proto::H2)
        .client_cert(&cert, &key)
        .build();
    let alice = proto_builder(tls, Proto::H2).build().unwrap();
    assert_eq!(alice.get(&url).send().await.unwrap().status(), 200);
    let anon = client(&d.join("server.crt"));
    assert_eq!(anon.get(&url).send().await.unwrap().status(), 200);
    let lines = lines_of(&d.join("logs/access.log"), 2);
    let v: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(v["tls_client_subject"], "CN=alice,O=ops");
    let fp = v["tls_client_fingerprint"].as_str().unwrap();
    assert_eq!(fp.len(), 64, "{fp}");
    let v: serde_json::Value = serde_json::from_str(&lines[1]).unwrap();
    assert!(v.get("tls_client_subject").is_none(), "{v}");
}
