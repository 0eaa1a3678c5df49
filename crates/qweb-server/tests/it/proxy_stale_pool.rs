//! A pooled upstream connection the upstream closes just as qweb reuses it: the upstream's
//! keep-alive ends (Node.js and Apache close an idle connection after 5 s) while qweb's request
//! is on its way, so the request meets a closed connection and gets no answer. Two guards:
//! the upstream's announced `Keep-Alive: timeout=N` ends reuse a second before N, and an
//! idempotent request whose body qweb holds is sent again on a new connection when a reused
//! one closes before answering (as nginx retries a request that failed on a cached keep-alive
//! connection). A POST is never sent twice. The upstream is the test kit's recorder
//! (`closes-reused`, `keep-alive-2`).

use qweb_testkit as common;

use std::time::Duration;

use common::recorder::Recorder;
use common::TestServer;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

fn server(up: &Recorder) -> TestServer {
    common::start_with(
        &format!(
            "[[route]]\nprefix = \"/up\"\nupstreams = [\"{}\"]\n",
            up.addr
        ),
        |_| {},
    )
}

/// One request on a new client connection: status and body.
async fn request(ts: &TestServer, method: &str, target: &str, body: &str) -> (u16, String) {
    let mut c = TcpStream::connect(ts.addrs[1]).await.unwrap();
    let req = format!(
        "{method} {target} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    c.write_all(req.as_bytes()).await.unwrap();
    let r = common::wire::read_response(&mut c, Duration::from_secs(10))
        .await
        .expect("a response");
    (r.status, String::from_utf8_lossy(&r.body).into_owned())
}

/// Idempotent methods with and without a body (GET, PUT, DELETE): the second request of each
/// pair goes out on the pooled connection, which the upstream closes without answering; qweb
/// sends it again on a new connection and the client gets the answer. Before the replay, each
/// got a 502.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_request_that_crosses_the_upstreams_close_is_sent_again() {
    for (method, body) in [("GET", ""), ("PUT", "{\"a\":1}"), ("DELETE", "")] {
        let up = common::recorder::start().await;
        let ts = server(&up);
        let first = request(&ts, method, "/up/1/closes-reused", body).await;
        assert_eq!(first, (200, "up:/up/1/closes-reused".into()), "{method}");
        let second = request(&ts, method, "/up/2/closes-reused", body).await;
        assert_eq!(
            second,
            (200, "up:/up/2/closes-reused".into()),
            "{method}: sent again on a new connection"
        );
        assert_eq!(up.connections(), 2, "{method}");
        let got: Vec<_> = up
            .take()
            .into_iter()
            .map(|r| (r.method().to_owned(), r.target().to_owned(), r.body))
            .collect();
        let two = (method.to_owned(), "/up/2/closes-reused".to_owned());
        let twice: Vec<_> = got
            .iter()
            .filter(|(m, t, _)| (m, t) == (&two.0, &two.1))
            .collect();
        assert_eq!(
            twice.len(),
            2,
            "{method}: the upstream read it twice: {got:?}"
        );
        assert!(
            twice.iter().all(|(_, _, b)| b == body.as_bytes()),
            "{method}: with its body both times: {got:?}"
        );
    }
}

/// A POST that meets the closed connection is not sent twice (it may have been acted on):
/// the client gets 502, the upstream read it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_that_crosses_the_upstreams_close_is_not_sent_again() {
    let up = common::recorder::start().await;
    let ts = server(&up);
    assert_eq!(
        request(&ts, "POST", "/up/1/closes-reused", "x=1").await.0,
        200
    );
    assert_eq!(
        request(&ts, "POST", "/up/2/closes-reused", "x=2").await.0,
        502
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let got: Vec<_> = up
        .take()
        .into_iter()
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .collect();
    assert_eq!(got, ["x=1", "x=2"], "each POST read once");
}

/// An upstream that announces `Keep-Alive: timeout=2` (and would close at 2 s) has its
/// connection reused within a second, and not after: a request 1.3 s later opens a new
/// connection. Before, the connection was reused for 30 s whatever the upstream said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_announced_keep_alive_ends_reuse_a_second_before_it() {
    let up = common::recorder::start().await;
    let ts = server(&up);
    assert_eq!(request(&ts, "GET", "/up/a/keep-alive-2", "").await.0, 200);
    assert_eq!(request(&ts, "GET", "/up/b/keep-alive-2", "").await.0, 200);
    assert_eq!(up.connections(), 1, "reused at once");
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert_eq!(request(&ts, "GET", "/up/c/keep-alive-2", "").await.0, 200);
    assert_eq!(up.connections(), 2, "not reused 1.3 s later");
}
