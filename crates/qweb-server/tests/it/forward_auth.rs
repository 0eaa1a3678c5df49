//! `forward_auth` on routes (issue 39, phase 8) against a real authentication service (a hyper
//! server on a socket) in front of the recording upstream: a 2xx lets the request through with
//! the copied fields (a client's own copies removed), any other answer is the client's and
//! nothing reaches the upstream; a service that hangs or is down is a 502, never a pass; an
//! endless or oversized answer is bounded; over HTTP/1.1, HTTP/2 and HTTP/3.

use qweb_testkit as common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::h3::{aioquic, aioquic_available, H3Request};
use common::recorder::Recorder;
use common::Proto;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

/// One subrequest as the service saw it: method, path, and the fields it looks at.
#[derive(Debug, Clone)]
struct Asked {
    method: String,
    path: String,
    fields: Vec<(String, String)>,
    body_len: usize,
}

impl Asked {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The service answers by the client's `Authorization`:
/// - `Bearer good`: 200, `X-User: alice`, `X-Role: admin`;
/// - `Bearer big-ok`: 200 with an endless body (which qweb must not read);
/// - `Bearer big-deny`: 403 with an endless body;
/// - `Bearer huge-length`: 401 announcing a 1 GiB body;
/// - `Bearer hang`: no answer, ever;
/// - anything else: 401, `WWW-Authenticate: Bearer realm="app"`, body `denied`.
struct Service {
    addr: SocketAddr,
    asked: Arc<Mutex<Vec<Asked>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Service {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type AnyBody = BoxBody<Bytes, Infallible>;

fn endless() -> AnyBody {
    let chunks = futures_util::stream::repeat_with(|| {
        Ok::<_, Infallible>(Frame::data(Bytes::from(vec![b'z'; 65536])))
    });
    StreamBody::new(chunks).boxed()
}

async fn answer(req: Request<Incoming>, asked: Arc<Mutex<Vec<Asked>>>) -> Response<AnyBody> {
    let (parts, body) = req.into_parts();
    let body_len = body
        .collect()
        .await
        .map(|b| b.to_bytes().len())
        .unwrap_or(0);
    asked.lock().unwrap().push(Asked {
        method: parts.method.to_string(),
        path: parts.uri.to_string(),
        fields: parts
            .headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap_or("").to_owned()))
            .collect(),
        body_len,
    });
    let auth = parts
        .headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let b = Response::builder();
    match auth {
        "Bearer good" => b
            .header("x-user", "alice")
            .header("x-role", "admin")
            .body(Full::new(Bytes::from("ok")).boxed()),
        "Bearer big-ok" => b.body(endless()),
        "Bearer big-deny" => b.status(403).body(endless()),
        "Bearer huge-length" => b
            .status(401)
            .header("content-length", (1u64 << 30).to_string())
            .body(endless()),
        "Bearer hang" => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            b.body(Full::new(Bytes::new()).boxed())
        }
        _ => b
            .status(401)
            .header("www-authenticate", "Bearer realm=\"app\"")
            .body(Full::new(Bytes::from("denied")).boxed()),
    }
    .unwrap()
}

async fn service() -> Service {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let asked: Arc<Mutex<Vec<Asked>>> = Arc::default();
    let a = asked.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else {
                return;
            };
            let a = a.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let a = a.clone();
                    async move { Ok::<_, Infallible>(answer(req, a).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    Service { addr, asked, task }
}

/// qweb: `/app` proxied to `up` behind the service; `/files` static behind it; `/down` behind
/// a service that is not there; listeners: HTTPS with HTTP/3, then plain.
fn server(auth: &Service, up: &Recorder) -> common::TestServer {
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let fa = |a: SocketAddr| {
        format!(
            "forward_auth = {{ upstream = \"{a}\", path = \"/check?from=qweb\", \
             copy_headers = [\"X-User\", \"X-Role\"], timeout = \"1s\" }}\n"
        )
    };
    common::start_with(
        &format!(
            "[[listener]]\naddress = \"127.0.0.1:0\"\nhttp3 = true\n[listener.tls]\nself_signed = true\n\
             [[listener]]\naddress = \"127.0.0.1:0\"\n\
             [[route]]\nprefix = \"/app\"\nupstreams = [\"{}\"]\n{}\
             [[route]]\nprefix = \"/files\"\nroot = \"{{dir}}/site\"\n{}\
             [[route]]\nprefix = \"/down\"\nupstreams = [\"{}\"]\n{}\
             [[route]]\nprefix = \"/\"\nroot = \"{{dir}}/site\"\n",
            up.addr,
            fa(auth.addr),
            fa(auth.addr),
            up.addr,
            fa(dead),
        ),
        |d| {
            std::fs::create_dir_all(d.join("site/files")).unwrap();
            std::fs::write(d.join("site/files/a.txt"), "file a").unwrap();
        },
    )
}

/// The statuses of `reqs` sent over one HTTP/3 connection to `tls` (0: no answer).
async fn h3_statuses(tls: SocketAddr, ca: std::path::PathBuf, reqs: Vec<H3Request>) -> Vec<u16> {
    let out = tokio::task::spawn_blocking(move || aioquic(tls, &ca, &reqs, false))
        .await
        .unwrap()
        .expect("aioquic connects");
    out.iter()
        .map(|r| r.as_ref().map_or(0, |r| r.status))
        .collect()
}

/// One HTTP/1.1 request: status, headers (lower-case names) and body.
async fn send(
    ts: &common::TestServer,
    method: &str,
    path: &str,
    fields: &[(&str, &str)],
    body: &'static str,
) -> (u16, http::HeaderMap, String) {
    let mut rb =
        common::plain_client().request(method.parse().unwrap(), format!("{}{path}", ts.http()));
    for (n, v) in fields {
        rb = rb.header(*n, *v);
    }
    let r = rb.body(body).send().await.unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    (status, headers, r.text().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2xx_lets_the_request_through_with_the_copied_fields_only() {
    let (auth, up) = (service().await, common::recorder::start().await);
    let ts = server(&auth, &up);
    let (s, _, body) = send(
        &ts,
        "POST",
        "/app/orders?id=7",
        &[
            ("authorization", "Bearer good"),
            ("x-user", "mallory"),
            ("x-role", "root"),
        ],
        "payload",
    )
    .await;
    assert_eq!((s, body.as_str()), (200, "up:/app/orders?id=7"));
    let got = up.take();
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].header_all("x-user"),
        ["alice"],
        "the client's copy removed"
    );
    assert_eq!(got[0].header_all("x-role"), ["admin"]);
    assert_eq!(
        got[0].body, b"payload",
        "the body goes to the upstream, not the service"
    );
    let asked = auth.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1);
    let a = &asked[0];
    assert_eq!(
        (a.method.as_str(), a.path.as_str()),
        ("POST", "/check?from=qweb")
    );
    assert_eq!(a.body_len, 0);
    assert_eq!(a.field("x-forwarded-method"), Some("POST"));
    assert_eq!(a.field("x-forwarded-uri"), Some("/app/orders?id=7"));
    assert_eq!(a.field("x-forwarded-for"), Some("127.0.0.1"));
    assert_eq!(a.field("authorization"), Some("Bearer good"));
    assert_eq!(
        a.field("x-user"),
        None,
        "the client's X-User never reaches the service"
    );
    // a static route behind the same service
    let (s, _, body) = send(
        &ts,
        "GET",
        "/files/a.txt",
        &[("authorization", "Bearer good")],
        "",
    )
    .await;
    assert_eq!((s, body.as_str()), (200, "file a"));
    let (s, _, _) = send(&ts, "GET", "/files/a.txt", &[], "").await;
    assert_eq!(s, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_is_the_clients_answer_and_nothing_reaches_the_upstream() {
    let (auth, up) = (service().await, common::recorder::start().await);
    let ts = server(&auth, &up);
    for (path, fields) in [
        ("/app/x", vec![]),
        ("/app/x", vec![("authorization", "Bearer wrong")]),
        // path tricks reach the same route, and its service
        ("/app;x/y", vec![]),
        ("/app/%2e%2e/app/x", vec![]),
        ("//app/x", vec![]),
    ] {
        let (s, h, body) = send(&ts, "GET", path, &fields, "").await;
        assert_eq!((s, body.as_str()), (401, "denied"), "{path}");
        assert_eq!(h["www-authenticate"], "Bearer realm=\"app\"", "{path}");
    }
    assert!(up.take().is_empty(), "nothing reached the upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_or_dead_service_is_a_502_never_a_pass() {
    let (auth, up) = (service().await, common::recorder::start().await);
    let ts = server(&auth, &up);
    let t = Instant::now();
    let (s, _, _) = send(
        &ts,
        "GET",
        "/app/x",
        &[("authorization", "Bearer hang")],
        "",
    )
    .await;
    assert_eq!(s, 502);
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    let (s, _, _) = send(
        &ts,
        "GET",
        "/down/x",
        &[("authorization", "Bearer good")],
        "",
    )
    .await;
    assert_eq!(s, 502);
    assert!(up.take().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_or_oversized_answer_is_bounded() {
    let (auth, up) = (service().await, common::recorder::start().await);
    let ts = server(&auth, &up);
    let t = Instant::now();
    // a refusal with an endless body: cut at max_response_size (64 KiB)
    let r = common::plain_client()
        .get(format!("{}/app/x", ts.http()))
        .header("authorization", "Bearer big-deny")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let mut got = 0usize;
    let mut r = r;
    while let Ok(Some(c)) = r.chunk().await {
        got += c.len();
    }
    assert!(got <= 64 * 1024, "{got} bytes passed on");
    // a refusal that announces 1 GiB: 502 at once
    let (s, _, _) = send(
        &ts,
        "GET",
        "/app/x",
        &[("authorization", "Bearer huge-length")],
        "",
    )
    .await;
    assert_eq!(s, 502);
    // a 2xx with an endless body: the body is not read, the request goes on
    let (s, _, body) = send(
        &ts,
        "GET",
        "/app/ok",
        &[("authorization", "Bearer big-ok")],
        "",
    )
    .await;
    assert_eq!((s, body.as_str()), (200, "up:/app/ok"));
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(up.take().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_decides_over_http2_and_http3() {
    let (auth, up) = (service().await, common::recorder::start().await);
    let ts = server(&auth, &up);
    let tls = ts.addrs[0];
    let cfg = Arc::new(common::tls_client_config(&ts.cert(), Proto::H2));
    let io = common::tls::connect(tls, &cfg).await.unwrap();
    let client = common::h2client::handshake(io).await;
    let (s, _, _) = common::h2client::get(
        &client,
        "/app/h2",
        &[("authorization", "Bearer good"), ("x-user", "mallory")],
    )
    .await;
    assert_eq!(s, 200);
    let (s, _, _) = common::h2client::get(&client, "/app/h2", &[]).await;
    assert_eq!(s, 401);
    let got = up.take();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].header_all("x-user"), ["alice"]);
    if aioquic_available() {
        let ca = ts.cert();
        let reqs = vec![
            H3Request::get("/app/h3")
                .header("authorization", "Bearer good")
                .header("x-user", "mallory"),
            H3Request::get("/app/h3"),
        ];
        let statuses = h3_statuses(tls, ca, reqs).await;
        assert_eq!(statuses, [200, 401]);
        let got = up.take();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].header_all("x-user"), ["alice"]);
    } else {
        eprintln!("SKIPPED (HTTP/3 part): python3 with aioquic is needed (pip install aioquic)");
    }
}

/// Hostile, over HTTP/2 and HTTP/3: a service that hangs is a 502 at `timeout` (1 s), one
/// that announces a 1 GiB refusal a 502 at once, one that answers a 2xx with an endless body
/// lets the request on; nothing reaches the upstream but the last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_or_oversized_service_is_bounded_over_http2_and_http3() {
    let (auth, up) = (service().await, common::recorder::start().await);
    let ts = server(&auth, &up);
    let tls = ts.addrs[0];
    let cases = [
        ("Bearer hang", 502),
        ("Bearer huge-length", 502),
        ("Bearer big-ok", 200),
    ];
    let cfg = Arc::new(common::tls_client_config(&ts.cert(), Proto::H2));
    let io = common::tls::connect(tls, &cfg).await.unwrap();
    let client = common::h2client::handshake(io).await;
    for (auth, want) in cases {
        let t = Instant::now();
        let (s, _, _) = common::h2client::get(&client, "/app/h2", &[("authorization", auth)]).await;
        assert_eq!(s, want, "h2 {auth}");
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "h2 {auth}: {:?}",
            t.elapsed()
        );
    }
    assert_eq!(up.take().len(), 1, "h2: only the 2xx reached the upstream");
    if aioquic_available() {
        let ca = ts.cert();
        let reqs: Vec<H3Request> = cases
            .iter()
            .map(|(a, _)| H3Request::get("/app/h3").header("authorization", a))
            .collect();
        let t = Instant::now();
        let statuses = h3_statuses(tls, ca, reqs).await;
        assert_eq!(statuses, [502, 502, 200]);
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "h3: {:?}",
            t.elapsed()
        );
        assert_eq!(up.take().len(), 1, "h3: only the 2xx reached the upstream");
    } else {
        eprintln!("SKIPPED (HTTP/3 part): python3 with aioquic is needed (pip install aioquic)");
    }
}
