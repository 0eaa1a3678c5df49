//! Hostile requests (issue 9): a table of malformed, ambiguous and smuggling requests sent as
//! raw bytes over plain HTTP/1.1 and TLS HTTP/1.1, and over HTTP/2 with the `h2` crate,
//! against static and proxy routes; each case asserts the status and what the upstream (a
//! recorder of the exact bytes it receives) got, or that nothing reached it. Then the proxy
//! findings that need a scenario: traversal against a real python upstream that resolves dot
//! segments, late upstream bytes and the pool, and the per-phase timeouts.

use qweb_testkit as common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::recorder::{self, Received};
use common::wire::Response as Resp;
use common::{Proto, TestServer};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

const TIMEOUT: Duration = Duration::from_secs(10);

fn server(up: &recorder::Recorder, extra: &str) -> TestServer {
    let a = up.addr;
    common::start_with(
        &format!(
            "{extra}\n\
             [[route]]\nprefix = \"/up\"\nupstreams = [\"{a}\"]\n\
             [[route]]\nprefix = \"/strip\"\nstrip_prefix = true\nupstreams = [\"{a}\"]\n\
             [[route]]\nprefix = \"/raw\"\npass_raw_path = true\nupstreams = [\"{a}\"]\n\
             [[route]]\nprefix = \"/slow\"\ntimeout = \"1s\"\nclient_body_timeout = \"1s\"\nupstreams = [\"{a}\"]\n"
        ),
        |d| {
            std::fs::create_dir_all(d.join("site/dir")).unwrap();
            std::fs::write(d.join("site/a.txt"), "file a").unwrap();
            std::fs::write(d.join("site/dir/b.txt"), "file b").unwrap();
        },
    )
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

#[derive(Clone, Copy, Debug)]
enum Transport {
    Plain,
    Tls,
}

async fn connect(ts: &TestServer, t: Transport) -> Box<dyn Io> {
    match t {
        Transport::Plain => Box::new(TcpStream::connect(ts.addrs[1]).await.unwrap()),
        Transport::Tls => Box::new(ts.tls(Proto::H1).await),
    }
}

/// Reads one response (see [`common::wire::read_response`]).
async fn read_response(s: &mut (impl AsyncRead + Unpin + ?Sized)) -> Option<Resp> {
    common::wire::read_response(s, TIMEOUT).await
}

/// What the upstream must have seen.
#[derive(Clone, Copy)]
enum Up {
    /// Nothing at all.
    Never,
    /// Exactly one request, for which the check holds.
    Got(fn(&Received) -> bool),
    /// Nothing complete (a request whose body never arrived whole may have started).
    NothingComplete,
}

struct Case {
    name: &'static str,
    /// The request; `\n` becomes CRLF. `{big}` becomes 20 KiB of `a`, `{many}` 120 headers.
    req: &'static str,
    status: u16,
    up: Up,
}

const fn case(name: &'static str, req: &'static str, status: u16, up: Up) -> Case {
    Case {
        name,
        req,
        status,
        up,
    }
}

fn h1_cases() -> Vec<Case> {
    use Up::*;
    vec![
        // path normalisation and route confinement
        case("plain proxy", "GET /up/x HTTP/1.1\nHost: localhost\n\n", 200, Got(|r| r.target() == "/up/x")),
        case("dot segment", "GET /up/./x HTTP/1.1\nHost: localhost\n\n", 200, Got(|r| r.target() == "/up/x")),
        case("double slash before route", "GET //up/x HTTP/1.1\nHost: localhost\n\n", 200, Got(|r| r.target() == "/up/x")),
        case("dotdot into route", "GET /t/../up/x HTTP/1.1\nHost: localhost\n\n", 200, Got(|r| r.target() == "/up/x")),
        case("encoded dotdot", "GET /up/%2e%2e/up/y HTTP/1.1\nHost: localhost\n\n", 200, Got(|r| r.target() == "/up/y")),
        case("encoded dotdot leaves route", "GET /up/%2e%2e/internal.txt HTTP/1.1\nHost: localhost\n\n", 404, Never),
        case("dotdot leaves route", "GET /up/../internal.txt HTTP/1.1\nHost: localhost\n\n", 404, Never),
        case("encoded slash", "GET /up/..%2finternal.txt HTTP/1.1\nHost: localhost\n\n", 400, Never),
        case("encoded backslash", "GET /up/..%5cinternal.txt HTTP/1.1\nHost: localhost\n\n", 400, Never),
        case("encoded NUL", "GET /up/a%00b HTTP/1.1\nHost: localhost\n\n", 400, Never),
        case("climb above root", "GET /up/../../etc/passwd HTTP/1.1\nHost: localhost\n\n", 400, Never),
        case("bad escape", "GET /up/%zz HTTP/1.1\nHost: localhost\n\n", 400, Never),
        case("unreserved decoded", "GET /up/%41bc%7e HTTP/1.1\nHost: localhost\n\n", 200, Got(|r| r.target() == "/up/Abc~")),
        case("query untouched", "GET /up/x?q=../../y HTTP/1.1\nHost: localhost\n\n", 200, Got(|r| r.target() == "/up/x?q=../../y")),
        case("strip_prefix normalised", "GET /strip/./a/../b HTTP/1.1\nHost: localhost\n\n", 200, Got(|r| r.target() == "/b")),
        case("pass_raw_path", "GET /raw/a%2fb/./c HTTP/1.1\nHost: localhost\n\n", 200, Got(|r| r.target() == "/raw/a%2fb/./c")),
        case("raw route left by dotdot", "GET /raw/../up/x HTTP/1.1\nHost: localhost\n\n", 200, Got(|r| r.target() == "/up/x")),
        // methods
        case("TRACE", "TRACE /up/x HTTP/1.1\nHost: localhost\n\n", 405, Never),
        case("CONNECT", "CONNECT localhost:443 HTTP/1.1\nHost: localhost:443\n\n", 405, Never),
        case("DELETE passes", "DELETE /up/x HTTP/1.1\nHost: localhost\n\n", 200, Got(|r| r.method() == "DELETE")),
        case("OPTIONS passes", "OPTIONS /up/x HTTP/1.1\nHost: localhost\n\n", 200, Got(|r| r.method() == "OPTIONS")),
        case("HEAD passes", "HEAD /up/x HTTP/1.1\nHost: localhost\n\n", 200, Got(|r| r.method() == "HEAD")),
        // Host
        case("no Host", "GET /up/x HTTP/1.1\n\n", 400, Never),
        case("two Hosts", "GET /up/x HTTP/1.1\nHost: localhost\nHost: evil.example\n\n", 400, Never),
        case("Host with userinfo", "GET /up/x HTTP/1.1\nHost: user@localhost\n\n", 400, Never),
        case("Host with space", "GET /up/x HTTP/1.1\nHost: local host\n\n", 400, Never),
        case("Host with path", "GET /up/x HTTP/1.1\nHost: localhost/x\n\n", 400, Never),
        case("IPv6 Host", "GET /up/x HTTP/1.1\nHost: [::1]:8443\n\n", 200, Got(|r| r.header("host").as_deref() == Some("[::1]:8443"))),
        case("HTTP/1.0 without Host", "GET /up/x HTTP/1.0\n\n", 200, Got(|r| r.header("host").is_some_and(|h| h.starts_with("127.0.0.1:")))),
        case("absolute-form wins", "GET http://abs.example/up/x HTTP/1.1\nHost: other.example\n\n", 200, Got(|r| r.header("host").as_deref() == Some("abs.example") && r.target() == "/up/x")),
        // framing
        case("TE gzip, chunked", "POST /up/x HTTP/1.1\nHost: localhost\nTransfer-Encoding: gzip, chunked\n\n5\r\nhello\r\n0\r\n\r\n", 501, Never),
        case("TE chunked, chunked", "POST /up/x HTTP/1.1\nHost: localhost\nTransfer-Encoding: chunked\nTransfer-Encoding: chunked\n\n5\r\nhello\r\n0\r\n\r\n", 501, Never),
        case("TE and CL", "POST /up/x HTTP/1.1\nHost: localhost\nTransfer-Encoding: chunked\nContent-Length: 5\n\n5\r\nhello\r\n0\r\n\r\n", 400, Never),
        case("malformed chunk", "POST /up/x HTTP/1.1\nHost: localhost\nTransfer-Encoding: chunked\n\nzz\r\nhello\r\n0\r\n\r\n", 400, NothingComplete),
        case("GET with chunked body", "GET /up/x HTTP/1.1\nHost: localhost\nTransfer-Encoding: chunked\n\n5\r\nhello\r\n0\r\n\r\n", 200, Got(|r| r.body == b"hello" && r.method() == "GET")),
        case("POST with length", "POST /up/x HTTP/1.1\nHost: localhost\nContent-Length: 5\n\nhello", 200, Got(|r| r.body == b"hello")),
        case("two lengths", "POST /up/x HTTP/1.1\nHost: localhost\nContent-Length: 5\nContent-Length: 6\n\nhello!", 400, Never),
        case("negative length", "POST /up/x HTTP/1.1\nHost: localhost\nContent-Length: -1\n\n", 400, Never),
        case("obs-fold", "GET /up/x HTTP/1.1\nHost: localhost\nX-A: a\n b\n\n", 400, Never),
        case("space before colon", "GET /up/x HTTP/1.1\nHost : localhost\n\n", 400, Never),
        // headers passed on
        case("underscore XFF dropped", "GET /up/x HTTP/1.1\nHost: localhost\nX_Forwarded_For: 6.6.6.6\n\n", 200, Got(|r| r.header("x_forwarded_for").is_none() && r.header("x-forwarded-for").as_deref() == Some("127.0.0.1"))),
        case("underscore CL dropped", "GET /up/x HTTP/1.1\nHost: localhost\nContent_Length: 5\n\n", 200, Got(|r| r.header("content_length").is_none())),
        case("underscore custom dropped", "GET /up/x HTTP/1.1\nHost: localhost\nX-Custom_Name: y\n\n", 200, Got(|r| r.header("x-custom_name").is_none())),
        case("Connection cannot strip auth", "GET /up/x HTTP/1.1\nHost: localhost\nConnection: Authorization, Cookie\nAuthorization: Bearer t\nCookie: a=b\n\n", 200, Got(|r| r.header("authorization").as_deref() == Some("Bearer t") && r.header("cookie").as_deref() == Some("a=b"))),
        case("Connection strips custom", "GET /up/x HTTP/1.1\nHost: localhost\nConnection: X-Hop\nX-Hop: 1\n\n", 200, Got(|r| r.header("x-hop").is_none())),
        case("X-Forwarded-Host replaced", "GET /up/x HTTP/1.1\nHost: localhost\nX-Forwarded-Host: evil.example\n\n", 200, Got(|r| r.header_all("x-forwarded-host") == ["localhost"])),
        case("X-Forwarded-For appended", "GET /up/x HTTP/1.1\nHost: localhost\nX-Forwarded-For: 10.0.0.1\nX-Forwarded-For: 10.0.0.2\n\n", 200, Got(|r| r.header_all("x-forwarded-for") == ["10.0.0.1, 10.0.0.2, 127.0.0.1"])),
        case("Forwarded dropped", "GET /up/x HTTP/1.1\nHost: localhost\nForwarded: for=6.6.6.6\n\n", 200, Got(|r| r.header("forwarded").is_none())),
        case("X-Real-IP replaced", "GET /up/x HTTP/1.1\nHost: localhost\nX-Real-IP: 6.6.6.6\n\n", 200, Got(|r| r.header_all("x-real-ip") == ["127.0.0.1"])),
        // (WebSocket upgrades pass by default since the proxy passes upgrades: see proxy_upgrade.rs)
        case("Upgrade h2c stripped", "GET /up/x HTTP/1.1\nHost: localhost\nUpgrade: h2c\nConnection: Upgrade, HTTP2-Settings\nHTTP2-Settings: AAMAAABkAAQAAP__\n\n", 200, Got(|r| r.header("upgrade").is_none() && r.header("connection").is_none() && r.header("http2-settings").is_none())),
        // (TE is hop-by-hop: only the proxy's own `TE: trailers` goes on, for a client that
        // asked for trailers, so the upstream's can be passed back)
        case("Proxy-Connection stripped", "GET /up/x HTTP/1.1\nHost: localhost\nProxy-Connection: keep-alive\nKeep-Alive: 300\nTE: trailers, gzip\n\n", 200, Got(|r| r.header("proxy-connection").is_none() && r.header("keep-alive").is_none() && r.header_all("te") == ["trailers"])),
        case("TE without trailers stripped", "GET /up/x HTTP/1.1\nHost: localhost\nTE: gzip\n\n", 200, Got(|r| r.header("te").is_none())),
        case("120 small headers", "GET /up/x HTTP/1.1\nHost: localhost\n{many}\n", 200, Got(|r| r.header_all("x-h").len() == 120)),
        // sizes
        case("long URI", "GET /up/{big} HTTP/1.1\nHost: localhost\n\n", 414, Never),
        case("long header", "GET /up/x HTTP/1.1\nHost: localhost\nX-Big: {big}\n\n", 431, Never),
        // upstream misbehaviour
        case("unasked 101", "GET /up/switch HTTP/1.1\nHost: localhost\n\n", 502, Got(|r| r.target() == "/up/switch")),
        case("100 KB upstream head", "GET /up/big-head HTTP/1.1\nHost: localhost\n\n", 502, Got(|r| r.target() == "/up/big-head")),
        // static routes
        case("static file", "GET /a.txt HTTP/1.1\nHost: localhost\n\n", 200, Never),
        case("static dotdot above root", "GET /../a.txt HTTP/1.1\nHost: localhost\n\n", 400, Never),
        case("static encoded dotdot", "GET /%2e%2e/a.txt HTTP/1.1\nHost: localhost\n\n", 400, Never),
        case("static dotdot inside", "GET /dir/../a.txt HTTP/1.1\nHost: localhost\n\n", 200, Never),
        case("static double slash", "GET //a.txt HTTP/1.1\nHost: localhost\n\n", 200, Never),
        case("static encoded slash", "GET /dir%2fb.txt HTTP/1.1\nHost: localhost\n\n", 400, Never),
        case("static POST", "POST /a.txt HTTP/1.1\nHost: localhost\nContent-Length: 0\n\n", 405, Never),
        case("static TRACE", "TRACE /a.txt HTTP/1.1\nHost: localhost\n\n", 405, Never),
        case("static no Host", "GET /a.txt HTTP/1.1\n\n", 400, Never),
    ]
}

fn render(req: &str) -> Vec<u8> {
    let many: String = (0..120).map(|i| format!("X-H: {i}\n")).collect();
    req.replace("{big}", &"a".repeat(20 * 1024))
        .replace("{many}", &many)
        .replace("\r\n", "\n")
        .replace('\n', "\r\n")
        .into_bytes()
}

fn check_upstream(name: &str, up: Up, got: &[Received]) -> Result<(), String> {
    match up {
        Up::Never if !got.is_empty() => {
            Err(format!("{name}: reached the upstream: {:?}", got[0].head))
        }
        Up::NothingComplete if got.iter().any(|r| r.complete) => {
            Err(format!("{name}: a complete request reached the upstream"))
        }
        Up::Got(f) => match got {
            [r] if f(r) => Ok(()),
            [r] => Err(format!(
                "{name}: upstream got {:?} body {:?}",
                r.head,
                String::from_utf8_lossy(&r.body)
            )),
            _ => Err(format!("{name}: upstream got {} requests", got.len())),
        },
        _ => Ok(()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_request_table_h1_plain_and_tls() {
    let up = recorder::start().await;
    let ts = server(&up, "");
    let mut failures = Vec::new();
    let mut n = 0;
    for t in [Transport::Plain, Transport::Tls] {
        for c in h1_cases() {
            n += 1;
            let mut s = connect(&ts, t).await;
            s.write_all(&render(c.req)).await.unwrap();
            let resp = read_response(&mut s).await;
            // let the proxy finish talking to the upstream before looking
            tokio::time::sleep(Duration::from_millis(30)).await;
            let got = up.take();
            let name = format!("{t:?} {}", c.name);
            match resp {
                None => failures.push(format!("{name}: no response")),
                Some(r) if r.status != c.status => failures.push(format!(
                    "{name}: status {} (want {}); {}",
                    r.status,
                    c.status,
                    String::from_utf8_lossy(&r.body)
                )),
                Some(r) => {
                    if (c.status == 414 || c.status == 431)
                        && !String::from_utf8_lossy(&r.body).contains(&c.status.to_string())
                    {
                        failures.push(format!("{name}: {} without a body", c.status));
                    }
                    if c.status == 405 && !r.head.to_ascii_lowercase().contains("\r\nallow:") {
                        failures.push(format!("{name}: 405 without Allow"));
                    }
                    if let Err(e) = check_upstream(&name, c.up, &got) {
                        failures.push(e);
                    }
                }
            }
        }
    }
    assert!(n >= 120, "{n} cases");
    assert!(
        failures.is_empty(),
        "{} of {n} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// One request over HTTP/2 (the `h2` crate, so that pseudo-headers and headers can disagree).
async fn h2_request(
    ts: &TestServer,
    req: http::Request<()>,
    body: Option<&'static [u8]>,
) -> Result<(u16, Vec<u8>), String> {
    let tls = ts.tls(Proto::H2).await;
    let (client, conn) = h2::client::handshake(tls)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let mut client = client.ready().await.map_err(|e| e.to_string())?;
    let (resp, mut stream) = client
        .send_request(req, body.is_none())
        .map_err(|e| e.to_string())?;
    if let Some(b) = body {
        stream
            .send_data(Bytes::from_static(b), true)
            .map_err(|e| e.to_string())?;
    }
    let resp = tokio::time::timeout(TIMEOUT, resp)
        .await
        .map_err(|_| "timeout".to_string())?
        .map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let mut body = resp.into_body();
    let mut out = Vec::new();
    while let Some(d) = body.data().await {
        let d = d.map_err(|e| e.to_string())?;
        let _ = body.flow_control().release_capacity(d.len());
        out.extend_from_slice(&d);
    }
    Ok((status, out))
}

fn h2_req(method: &str, uri: &str, headers: &[(&str, &str)]) -> http::Request<()> {
    let mut b = http::Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_request_table_h2() {
    use Up::*;
    let up = recorder::start().await;
    let ts = server(&up, "");
    let base = "https://localhost";
    type H2Case = (
        &'static str,
        http::Request<()>,
        Option<&'static [u8]>,
        u16,
        Up,
    );
    let cases: Vec<H2Case> = vec![
        (
            "plain",
            h2_req("GET", &format!("{base}/up/x"), &[]),
            None,
            200,
            Got(|r| r.target() == "/up/x"),
        ),
        (
            "dot segment",
            h2_req("GET", &format!("{base}/up/./x"), &[]),
            None,
            200,
            Got(|r| r.target() == "/up/x"),
        ),
        (
            "dotdot into route",
            h2_req("GET", &format!("{base}/t/../up/x"), &[]),
            None,
            200,
            Got(|r| r.target() == "/up/x"),
        ),
        (
            "dotdot leaves route",
            h2_req("GET", &format!("{base}/up/../internal.txt"), &[]),
            None,
            404,
            Never,
        ),
        (
            "encoded slash",
            h2_req("GET", &format!("{base}/up/..%2fx"), &[]),
            None,
            400,
            Never,
        ),
        (
            "climb above root",
            h2_req("GET", &format!("{base}/up/../../x"), &[]),
            None,
            400,
            Never,
        ),
        (
            "host differs from :authority",
            h2_req("GET", &format!("{base}/up/x"), &[("host", "evil.example")]),
            None,
            400,
            Never,
        ),
        (
            "host equals :authority",
            h2_req("GET", &format!("{base}/up/x"), &[("host", "localhost")]),
            None,
            200,
            Got(|r| r.header_all("host") == ["localhost"]),
        ),
        (
            "TRACE",
            h2_req("TRACE", &format!("{base}/up/x"), &[]),
            None,
            405,
            Never,
        ),
        (
            "CONNECT",
            h2_req("CONNECT", "localhost:443", &[]),
            None,
            405,
            Never,
        ),
        (
            "underscore dropped",
            h2_req(
                "GET",
                &format!("{base}/up/x"),
                &[("x_forwarded_for", "6.6.6.6")],
            ),
            None,
            200,
            Got(|r| r.header("x_forwarded_for").is_none()),
        ),
        (
            "GET with DATA, no length",
            h2_req("GET", &format!("{base}/up/x"), &[]),
            Some(b"hello"),
            200,
            Got(|r| r.body == b"hello"),
        ),
        (
            "POST with length",
            h2_req("POST", &format!("{base}/up/x"), &[("content-length", "5")]),
            Some(b"hello"),
            200,
            Got(|r| r.body == b"hello"),
        ),
        (
            "XFF appended",
            h2_req(
                "GET",
                &format!("{base}/up/x"),
                &[("x-forwarded-for", "10.0.0.1")],
            ),
            None,
            200,
            Got(|r| r.header_all("x-forwarded-for") == ["10.0.0.1, 127.0.0.1"]),
        ),
        (
            "XFH replaced",
            h2_req(
                "GET",
                &format!("{base}/up/x"),
                &[("x-forwarded-host", "evil.example")],
            ),
            None,
            200,
            Got(|r| r.header_all("x-forwarded-host") == ["localhost"]),
        ),
        (
            "static dotdot above root",
            h2_req("GET", &format!("{base}/../a.txt"), &[]),
            None,
            400,
            Never,
        ),
        (
            "static dotdot inside",
            h2_req("GET", &format!("{base}/dir/../a.txt"), &[]),
            None,
            200,
            Never,
        ),
        (
            "static TRACE",
            h2_req("TRACE", &format!("{base}/a.txt"), &[]),
            None,
            405,
            Never,
        ),
    ];
    let n = cases.len();
    let mut failures = Vec::new();
    for (name, req, body, status, want) in cases {
        let r = h2_request(&ts, req, body).await;
        tokio::time::sleep(Duration::from_millis(30)).await;
        let got = up.take();
        match r {
            Err(e) => failures.push(format!("h2 {name}: {e}")),
            Ok((s, b)) if s != status => failures.push(format!(
                "h2 {name}: status {s} (want {status}); {}",
                String::from_utf8_lossy(&b)
            )),
            Ok(_) => {
                if let Err(e) = check_upstream(name, want, &got) {
                    failures.push(format!("h2 {e}"));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {n} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Finding 1: against an upstream that resolves dot segments itself (python's http.server),
/// nothing outside the route's prefix can be reached through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_route_confines_clients_to_its_prefix() {
    let docs = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(docs.path().join("files")).unwrap();
    std::fs::write(docs.path().join("files/ok.txt"), "inside").unwrap();
    std::fs::write(docs.path().join("internal.txt"), "SECRET-OUTSIDE").unwrap();
    let mut py = std::process::Command::new("python3")
        .args([
            "-u",
            "-m",
            "http.server",
            "0",
            "--bind",
            "127.0.0.1",
            "--directory",
        ])
        .arg(docs.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("python3 is needed for this test");
    let mut out = py.stdout.take().unwrap();
    // the pipe stays open until the end: python dies of EPIPE if it is closed under a print
    let (port, _stdout) = tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let mut seen = Vec::new();
        let mut b = [0u8; 1];
        while out.read(&mut b).unwrap_or(0) == 1 {
            seen.push(b[0]);
            let s = String::from_utf8_lossy(&seen);
            if let Some(rest) = s.split(" port ").nth(1) {
                if let Some(p) = rest.split(' ').next().filter(|_| rest.contains(' ')) {
                    return (p.parse::<u16>().unwrap(), out);
                }
            }
        }
        panic!(
            "python http.server did not start: {}",
            String::from_utf8_lossy(&seen)
        );
    })
    .await
    .unwrap();
    let ts = common::start_with(
        &format!("[[route]]\nprefix = \"/files\"\nupstreams = [\"127.0.0.1:{port}\"]\n"),
        |_| {},
    );
    let mut s = TcpStream::connect(ts.addrs[1]).await.unwrap();
    s.write_all(b"GET /files/ok.txt HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let r = read_response(&mut s).await.unwrap();
    assert_eq!(
        (r.status, r.body.as_slice()),
        (200, &b"inside"[..]),
        "the route works"
    );
    for path in [
        "/files/../internal.txt",
        "/files/%2e%2e/internal.txt",
        "/files/%2E%2E/internal.txt",
        "/files/..%2finternal.txt",
        "/files/..%2Finternal.txt",
        "/files/.%2e/internal.txt",
        "/files/..\\internal.txt",
        "/files/%5c..%5cinternal.txt",
        "/files//../internal.txt",
        "/files/./../internal.txt",
    ] {
        let mut s = TcpStream::connect(ts.addrs[1]).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let r = read_response(&mut s).await;
        if let Some(r) = r {
            assert!(
                !String::from_utf8_lossy(&r.body).contains("SECRET-OUTSIDE"),
                "{path} escaped the route: {} {}",
                r.status,
                String::from_utf8_lossy(&r.body)
            );
            assert!(r.status == 400 || r.status == 404, "{path}: {}", r.status);
        }
    }
    let _ = py.kill();
    let _ = py.wait();
}

/// Finding 3: an upstream that sends stray bytes after a HEAD response never gets them read
/// as another client's response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_upstream_bytes_never_reach_another_client() {
    let up = recorder::start().await;
    let ts = server(&up, "");
    let client = common::plain_client();
    let base = ts.http();
    let mut wrong = Vec::new();
    for i in 0..30 {
        let h = client
            .head(format!("{base}/up/late-head"))
            .send()
            .await
            .unwrap();
        assert_eq!(h.status(), 200);
        // another client, at once: it must not get the previous exchange's stray bytes
        let other = common::plain_client();
        let r = other
            .get(format!("{base}/up/next{i}"))
            .send()
            .await
            .unwrap();
        let body = r.text().await.unwrap();
        if body != format!("up:/up/next{i}") {
            wrong.push(body);
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of 30 got another response: {wrong:?}",
        wrong.len()
    );
}

/// Upstream connections are still reused after clean GET exchanges (the fix for late bytes
/// must not turn pooling off).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_exchanges_still_reuse_upstream_connections() {
    let up = common::upstream::start("u").await;
    let ts = common::start_with(
        &format!(
            "[[route]]\nprefix = \"/api\"\nupstreams = [\"{}\"]\n",
            up.addr
        ),
        |_| {},
    );
    let client = common::plain_client();
    for _ in 0..10 {
        let r = client
            .get(format!("{}/api/x", ts.http()))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
    }
    let n = up.connections.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(n, 1, "10 sequential requests used {n} upstream connections");
}

/// Finding 4: the route `timeout` does not cut an active upload; a client that stops sending
/// gets 408 after `client_body_timeout`; an upstream that never answers gets 504 after
/// `timeout` once the body was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_timeouts_per_phase() {
    let up = recorder::start().await;
    let ts = server(&up, "");
    // 1. an upload that takes 3 s (route timeout 1 s), one piece every 300 ms
    let mut s = TcpStream::connect(ts.addrs[1]).await.unwrap();
    s.write_all(b"POST /slow/upload HTTP/1.1\r\nHost: localhost\r\nContent-Length: 50\r\n\r\n")
        .await
        .unwrap();
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        s.write_all(b"01234").await.unwrap();
    }
    let r = read_response(&mut s).await.unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let got = up.take();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].body.len(), 50);

    // 2. a client that stops in the middle of its body
    let mut s = TcpStream::connect(ts.addrs[1]).await.unwrap();
    s.write_all(b"POST /slow/stall HTTP/1.1\r\nHost: localhost\r\nContent-Length: 50\r\n\r\n01234")
        .await
        .unwrap();
    let t = Instant::now();
    let r = read_response(&mut s).await.unwrap();
    assert_eq!(r.status, 408);
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    up.take();

    // 3. an upstream that never answers
    let mut s = TcpStream::connect(ts.addrs[1]).await.unwrap();
    s.write_all(b"GET /slow/hang HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let t = Instant::now();
    let r = read_response(&mut s).await.unwrap();
    assert_eq!(r.status, 504);
    assert!(t.elapsed() >= Duration::from_millis(900) && t.elapsed() < Duration::from_secs(5));
}
