//! Paths understood differently by two hops (issue 22, items 2-4 and the autoindex finding):
//! a `pass_raw_path` route against an upstream that decodes `%2F` (python's http.server),
//! `..;` segments, redirect templates filled from the request target, HTTP/2 cookies split
//! over several fields on their way to an HTTP/1.1 upstream, and directory listings of
//! symlinks that lead out of the root or names with control bytes.

use qweb_testkit as common;

use std::sync::Arc;
use std::time::Duration;

use common::{recorder, Proto, TestServer};
use tokio::net::TcpStream;

const TIMEOUT: Duration = Duration::from_secs(10);

/// A response read until the server closed the connection (`Connection: close`).
struct Raw {
    status: u16,
    head: String,
    body: String,
}

impl Raw {
    fn header(&self, name: &str) -> Option<&str> {
        self.head
            .split("\r\n")
            .skip(1)
            .filter_map(|l| l.split_once(':'))
            .find(|(n, _)| n.trim().eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim())
    }
}

/// `GET target` on a fresh plain connection to `addr`, read to the end.
async fn get(addr: std::net::SocketAddr, target: &str) -> Raw {
    let req = format!("GET {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    let out = common::raw_exchange(addr, req.as_bytes(), TIMEOUT).await;
    let out = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Raw {
        status,
        head: head.to_owned(),
        body: body.to_owned(),
    }
}

/// python's http.server serving `dir` on 127.0.0.1; killed on drop.
struct Python {
    child: std::process::Child,
    port: u16,
    _stdout: std::process::ChildStdout,
}

impl Drop for Python {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn python(dir: &std::path::Path) -> Python {
    let mut child = std::process::Command::new("python3")
        .args(["-u", "-m", "http.server", "0", "--bind", "127.0.0.1"])
        .arg("--directory")
        .arg(dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("python3 is needed for this test");
    let mut out = child.stdout.take().expect("stdout");
    // the banner names the port; the pipe stays open (python dies of EPIPE under a print)
    let (port, out) = tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let mut seen = Vec::new();
        let mut b = [0u8; 1];
        while out.read(&mut b).unwrap_or(0) == 1 {
            seen.push(b[0]);
            let s = String::from_utf8_lossy(&seen);
            if let Some(rest) = s.split(" port ").nth(1) {
                if let Some(p) = rest.split(' ').next().filter(|_| rest.contains(' ')) {
                    return (p.parse::<u16>().expect("port"), out);
                }
            }
        }
        panic!(
            "python http.server did not start: {}",
            String::from_utf8_lossy(&seen)
        );
    })
    .await
    .expect("banner");
    Python {
        child,
        port,
        _stdout: out,
    }
}

/// Item 2: on a `pass_raw_path` route the upstream decodes `%2F` (and climbs with the `..`
/// that it makes); every target whose decoded form leaves the route's prefix is refused
/// with 400 and never reaches the upstream. An encoded slash that stays inside the prefix
/// still passes as sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pass_raw_path_route_confines_clients_to_its_prefix() {
    let docs = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(docs.path().join("files/x/y")).unwrap();
    std::fs::create_dir_all(docs.path().join("files/a")).unwrap();
    std::fs::write(docs.path().join("files/ok.txt"), "inside").unwrap();
    std::fs::write(docs.path().join("files/a/b.txt"), "inside-ab").unwrap();
    std::fs::write(docs.path().join("internal.txt"), "SECRET-OUTSIDE").unwrap();
    let py = python(docs.path()).await;
    let ts = common::start_with(
        &format!(
            "[[route]]\nprefix = \"/files\"\npass_raw_path = true\nupstreams = [\"127.0.0.1:{}\"]\n",
            py.port
        ),
        |_| {},
    );
    let plain = ts.addrs[1];
    let r = get(plain, "/files/ok.txt").await;
    assert_eq!(
        (r.status, r.body.as_str()),
        (200, "inside"),
        "the route works"
    );
    let r = get(plain, "/files/a%2fb.txt").await;
    assert_eq!(
        (r.status, r.body.as_str()),
        (200, "inside-ab"),
        "an encoded slash inside the prefix passes"
    );
    let mut failures = Vec::new();
    for path in [
        "/files/..%2finternal.txt",
        "/files/..%2Finternal.txt",
        "/files/%2e%2e%2finternal.txt",
        "/files/%2E%2E%2Finternal.txt",
        "/files/.%2e%2finternal.txt",
        "/files/x/..%2f..%2finternal.txt",
        "/files/x/y/..%2f..%2f..%2finternal.txt",
        "/files/x/..%2f..%2f..%2finternal.txt",
        "/files/..%5cinternal.txt",
        "/files/..%5Cinternal.txt",
        "/files/x/..%5c..%5cinternal.txt",
        "/files/..;/internal.txt",
        "/files/..;x=1/internal.txt",
        "/files/%2e%2e;/internal.txt",
        "/files/.;/../internal.txt",
        "/files/..%2finternal.txt?x=1",
    ] {
        let r = get(plain, path).await;
        if r.body.contains("SECRET-OUTSIDE") || r.status != 400 {
            failures.push(format!("{path}: {} {:?}", r.status, r.body));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    drop(py);
}

/// The `..;` sibling (Tomcat and Jetty read `..;x` as `..`) is refused on every route:
/// static, proxy and raw proxy alike, and never reaches an upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dot_segments_with_parameters_are_refused_everywhere() {
    let up = recorder::start().await;
    let a = up.addr;
    let ts = common::start_with(
        &format!(
            "[[route]]\nprefix = \"/up\"\nupstreams = [\"{a}\"]\n\
             [[route]]\nprefix = \"/raw\"\npass_raw_path = true\nupstreams = [\"{a}\"]\n"
        ),
        |d| std::fs::write(d.join("site/a.txt"), "a").unwrap(),
    );
    let plain = ts.addrs[1];
    assert_eq!(get(plain, "/up/a;b/c").await.status, 200, "params pass");
    assert_eq!(get(plain, "/raw/x;v=1/c").await.status, 200, "params pass");
    up.take();
    for path in [
        "/a/..;/a.txt",
        "/up/..;/x",
        "/up/x/..;a=b/y",
        "/up/.;/x",
        "/raw/..;/x",
        "/raw/%2e%2e;/x",
        "/raw/.%2E;/x",
    ] {
        let r = get(plain, path).await;
        assert_eq!(r.status, 400, "{path}: {}", r.head);
    }
    assert!(up.take().is_empty(), "nothing reached the upstream");
}

/// Item 3: a redirect template that starts with `{uri}` or `{path}` is filled from the
/// normalised path, and `Location` is never scheme-relative (`//host`), for a listener's
/// redirect and a route's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_never_point_off_site() {
    let ts = common::start_with(
        "[[listener]]\naddress = \"127.0.0.1:0\"\nredirect = { to = \"{uri}\", status = 301 }\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\n\
         [[route]]\nprefix = \"/\"\nredirect = { to = \"{path}{query}\", status = 302 }\n",
        |_| {},
    );
    for (addr, status) in [(ts.addrs[0], 301), (ts.addrs[1], 302)] {
        for (target, want) in [
            ("//evil.com/../rel/x", "/rel/x"),
            ("//evil.com/%2e%2e/rel/x?q=1", "/rel/x?q=1"),
            ("///evil.com/x", "/evil.com/x"),
            ("/./evil.com/x", "/evil.com/x"),
            ("/a/./b/../c?x=1", "/a/c?x=1"),
        ] {
            let r = get(addr, target).await;
            assert_eq!(
                (r.status, r.header("location")),
                (status, Some(want)),
                "{target}: {}",
                r.head
            );
        }
        // a target that does not normalise is not redirected anywhere
        let r = get(addr, "/../evil").await;
        assert_eq!((r.status, r.header("location")), (400, None), "{}", r.head);
    }
}

/// Item 4: two `cookie` fields on an HTTP/2 request reach an HTTP/1.1 upstream as one
/// `Cookie` header joined with "; " (RFC 9113 §8.2.3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_cookie_fields_are_joined_for_an_http1_upstream() {
    let up = recorder::start().await;
    let ts = common::start_with(
        &format!(
            "[[route]]\nprefix = \"/up\"\nupstreams = [\"{}\"]\n",
            up.addr
        ),
        |_| {},
    );
    let cfg = common::tls_client_config(&ts.cert(), Proto::H2);
    let c = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let tcp = TcpStream::connect(ts.addrs[0]).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = c.connect(name, tcp).await.unwrap();
    let (client, conn) = h2::client::handshake(tls).await.unwrap();
    tokio::spawn(conn);
    let mut client = client.ready().await.unwrap();
    let req = http::Request::builder()
        .uri(format!("https://localhost:{}/up/c", ts.addrs[0].port()))
        .header("cookie", "a=1")
        .header("cookie", "b=2; c=3")
        .header("cookie", "d=4")
        .body(())
        .unwrap();
    let (resp, _) = client.send_request(req, true).unwrap();
    let resp = tokio::time::timeout(TIMEOUT, resp).await.unwrap().unwrap();
    assert_eq!(resp.status(), 200);
    let got = up.take();
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].header_all("cookie"),
        ["a=1; b=2; c=3; d=4"],
        "{}",
        got[0].head
    );
}

fn listing_server() -> TestServer {
    common::start_with(
        "[[route]]\nprefix = \"/list\"\nroot = \"{dir}/site\"\nstrip_prefix = true\nautoindex = true\n",
        |d| {
            use std::os::unix::fs::symlink;
            let f = d.join("site/files");
            std::fs::create_dir_all(f.join("sub")).unwrap();
            std::fs::write(d.join("outside.txt"), "SECRET").unwrap();
            std::fs::write(f.join("plain.txt"), "x").unwrap();
            std::fs::write(f.join("cr\rname"), "x").unwrap();
            std::fs::write(f.join("esc\x1b[31mred"), "x").unwrap();
            symlink("plain.txt", f.join("link-inside")).unwrap();
            symlink("sub", f.join("link-dir")).unwrap();
            symlink("../../outside.txt", f.join("link-out")).unwrap();
            symlink(d.join("outside.txt"), f.join("link-abs")).unwrap();
            symlink("missing", f.join("link-dangling")).unwrap();
        },
    )
}

/// The autoindex finding: a listing shows only what the route would serve (no symlink out of
/// the root, no absolute or dangling one under `symlinks = "inside_root"`), and no raw
/// control byte of a file name reaches the page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn autoindex_lists_only_what_it_serves_and_no_control_bytes() {
    let ts = listing_server();
    let r = get(ts.addrs[1], "/list/files/").await;
    assert_eq!(r.status, 200, "{}", r.head);
    let html = r.body;
    assert!(
        !html.bytes().any(|b| b < 0x20 && b != b'\n' || b == 0x7f),
        "{html:?}"
    );
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
            "<tr><td><a href=\"cr%0Dname\">cr\u{fffd}name</a>",
            "<tr><td><a href=\"esc%1B%5B31mred\">esc\u{fffd}[31mred</a>",
            "<tr><td><a href=\"link-dir/\">link-dir/</a>",
            "<tr><td><a href=\"link-inside\">link-inside</a>",
            "<tr><td><a href=\"plain.txt\">plain.txt</a>",
            "<tr><td><a href=\"sub/\">sub/</a>",
        ],
        "{html}"
    );
    // what is listed is served, what is not is not
    assert_eq!(
        get(ts.addrs[1], "/list/files/link-inside").await.status,
        200
    );
    for gone in ["link-out", "link-abs", "link-dangling"] {
        let r = get(ts.addrs[1], &format!("/list/files/{gone}")).await;
        assert_ne!(r.status, 200, "{gone}");
    }
}

/// Issue 41, item 1: path parameters around route rules. Tomcat, Jetty and Spring read
/// `/admin;x` as `/admin` with a parameter, so an `/admin` route's rules must apply to it and
/// a proxy route `/` in front of such an upstream must never see it; a path that a
/// case-insensitive upstream would read as another route's is refused. Over HTTP/1.1,
/// HTTP/2 and HTTP/3 alike, with `%3b`/`%3B`, `//` and unreserved-escape variants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_parameters_do_not_take_a_path_out_of_its_route() {
    use common::h3::{aioquic, aioquic_available, H3Request};
    let up = recorder::start().await;
    let ts = common::start_with(
        &format!(
            "[[listener]]\naddress = \"127.0.0.1:0\"\nhttp3 = true\n[listener.tls]\nself_signed = true\n\
             [[listener]]\naddress = \"127.0.0.1:0\"\n\
             [[route]]\nprefix = \"/admin\"\nstrip_prefix = true\nroot = \"{{dir}}/adm\"\n\
             [[route]]\nprefix = \"/\"\nupstreams = [\"{}\"]\n",
            up.addr
        ),
        |d| {
            std::fs::create_dir_all(d.join("adm/x")).unwrap();
            std::fs::write(d.join("adm/index.html"), "ADMIN-ROUTE").unwrap();
            std::fs::write(d.join("adm/x/index.html"), "ADMIN-ROUTE").unwrap();
        },
    );
    let (tls, plain) = (ts.addrs[0], ts.addrs[1]);
    let parameters = [
        "/admin;x",
        "/admin;",
        "/admin;jsessionid=1",
        "/admin;/",
        "/admin;x/",
        "/admin;/x/",
        "/admin%3bx",
        "/admin%3Bx/x/",
        "//admin;x",
        "/%61dmin;x",
        "/./admin;x/",
    ];
    let case = ["/ADMIN", "/Admin;x", "/aDmin/x/", "/ADMIN%3B/x/"];
    let mut failures = Vec::new();
    // HTTP/1.1
    for path in parameters {
        let r = get(plain, path).await;
        if r.status != 200 || !r.body.contains("ADMIN-ROUTE") {
            failures.push(format!("h1 {path}: {} {}", r.status, r.body));
        }
    }
    for path in case {
        let r = get(plain, path).await;
        if r.status != 400 {
            failures.push(format!("h1 {path}: {} (want 400)", r.status));
        }
    }
    // the upstream still gets what is its own
    assert_eq!(get(plain, "/app;jsessionid=1/x").await.status, 200);
    assert_eq!(up.take().len(), 1, "the proxy route works");
    // HTTP/2
    let client = common::h2client::handshake(ts.tls(Proto::H2).await).await;
    for (path, want) in parameters
        .iter()
        .map(|p| (p, 200))
        .chain(case.iter().map(|p| (p, 400)))
    {
        let (status, _, _) = common::h2client::get(&client, path, &[]).await;
        if status != want {
            failures.push(format!("h2 {path}: {status} (want {want})"));
        }
    }
    // HTTP/3
    if aioquic_available() {
        let reqs: Vec<H3Request> = parameters
            .iter()
            .chain(case.iter())
            .map(|p| H3Request::get(p))
            .collect();
        let ca = ts.cert();
        let out = tokio::task::spawn_blocking(move || aioquic(tls, &ca, &reqs, false))
            .await
            .unwrap()
            .expect("aioquic connects");
        for (i, r) in out.iter().enumerate() {
            let want = if i < parameters.len() { 200 } else { 400 };
            let (path, status) = (
                parameters.iter().chain(case.iter()).nth(i).unwrap(),
                r.as_ref().map(|r| r.status).unwrap_or(0),
            );
            if status != want {
                failures.push(format!("h3 {path}: {status} (want {want})"));
            }
        }
    } else {
        eprintln!("SKIPPED (HTTP/3 part): python3 with aioquic is needed (pip install aioquic)");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let leaked = up.take();
    assert!(
        leaked.is_empty(),
        "reached the upstream: {:?}",
        leaked
            .iter()
            .map(|r| r.target().to_owned())
            .collect::<Vec<_>>()
    );
}
