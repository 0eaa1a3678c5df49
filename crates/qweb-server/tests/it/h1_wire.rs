//! qweb's own HTTP/1.1 codec (`http::h1`, `conn::h1`) on the wire, with raw bytes over plain
//! TCP and TLS: `Expect: 100-continue`, request bodies nobody reads, chunked bodies that hide
//! a request, pipelining after bodies and trailers, heads sent a byte at a time, HTTP/1.0
//! keep-alive and close-delimited answers, and HEAD. The request table of `hostile.rs` covers
//! the refusals; these are the exchanges the driver must carry through.

use qweb_testkit as common;

use std::time::Duration;

use common::recorder;
use common::wire::{read_response, Response, ResponseReader};
use common::{Proto, TestServer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

const TIMEOUT: Duration = Duration::from_secs(10);

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

fn server(up: &recorder::Recorder) -> TestServer {
    let a = up.addr;
    common::start_with(
        &format!("[[route]]\nprefix = \"/up\"\nupstreams = [\"{a}\"]\n"),
        |d| std::fs::write(d.join("site/a.txt"), "file a").unwrap(),
    )
}

/// A plain and a TLS connection, in turn.
async fn both(ts: &TestServer) -> [Box<dyn Io>; 2] {
    [
        Box::new(TcpStream::connect(ts.addrs[1]).await.unwrap()),
        Box::new(ts.tls(Proto::H1).await),
    ]
}

async fn response(s: &mut (impl AsyncRead + Unpin + ?Sized)) -> Response {
    read_response(s, TIMEOUT).await.expect("a response")
}

/// The connection ends (EOF or reset) within `TIMEOUT`, after whatever bytes are left.
async fn ends(s: &mut (impl AsyncRead + Unpin + ?Sized)) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(TIMEOUT, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
            Err(_) => return false,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_100_continue_is_answered_before_the_body_is_read() {
    let up = recorder::start().await;
    let ts = server(&up);
    for mut s in both(&ts).await {
        s.write_all(
            b"POST /up/e HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
        )
        .await
        .unwrap();
        // the client waits for the 100 before it sends the body
        let interim = response(&mut s).await;
        assert_eq!(interim.status, 100, "{}", interim.head);
        s.write_all(b"hello").await.unwrap();
        let r = response(&mut s).await;
        assert_eq!(r.status, 200, "{}", r.head);
        let got = up.take();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].body, b"hello");
        assert!(
            got[0].header("expect").is_none(),
            "Expect is hop-by-hop here"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_with_expect_gets_its_answer_and_no_100() {
    let up = recorder::start().await;
    let ts = server(&up);
    for mut s in both(&ts).await {
        s.write_all(
            b"POST /a.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\nExpect: 100-continue\r\n\r\n",
        )
        .await
        .unwrap();
        let r = response(&mut s).await;
        assert_eq!(r.status, 405, "{}", r.head);
        // the body was never asked for: the connection cannot carry another request
        assert_eq!(
            r.header("connection").as_deref(),
            Some("close"),
            "{}",
            r.head
        );
        assert!(ends(&mut s).await);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unread_body_still_arriving_does_not_reset_the_answer() {
    let up = recorder::start().await;
    let ts = server(&up);
    for mut s in both(&ts).await {
        // 4 MiB announced, and the client keeps sending while the server answers 405
        s.write_all(b"POST /a.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 4194304\r\n\r\n")
            .await
            .unwrap();
        let (mut rd, mut wr) = tokio::io::split(s);
        let writer = tokio::spawn(async move {
            let chunk = vec![b'x'; 64 * 1024];
            for _ in 0..64 {
                if wr.write_all(&chunk).await.is_err() {
                    break;
                }
            }
        });
        let r = response(&mut rd).await;
        assert_eq!(r.status, 405, "{}", r.head);
        assert_eq!(r.header("connection").as_deref(), Some("close"));
        assert!(
            ends(&mut rd).await,
            "the server closes after its lingering read"
        );
        writer.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_body_that_hides_a_request_stays_one_request() {
    let up = recorder::start().await;
    let ts = server(&up);
    let hidden = "GET /up/admin HTTP/1.1\r\nHost: x\r\n\r\n";
    for mut s in both(&ts).await {
        let req = format!(
            "POST /up/p HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{hidden}\r\n0\r\nX-Sum: 7\r\n\r\nGET /up/next HTTP/1.1\r\nHost: x\r\n\r\n",
            hidden.len()
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut rd = ResponseReader::new(&mut s, TIMEOUT);
        let first = rd.next().await.expect("a response");
        let second = rd.next().await.expect("a response");
        assert_eq!((first.status, second.status), (200, 200));
        assert_eq!(first.body, b"up:/up/p");
        assert_eq!(second.body, b"up:/up/next");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let got = up.take();
        let targets: Vec<&str> = got.iter().map(|r| r.target()).collect();
        assert_eq!(
            targets,
            ["/up/p", "/up/next"],
            "nothing hidden reached the upstream"
        );
        assert_eq!(got[0].body, hidden.as_bytes());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_body_with_bare_lf_is_refused_and_the_connection_closed() {
    let up = recorder::start().await;
    let ts = server(&up);
    for mut s in both(&ts).await {
        // a bare LF after the chunk size: another parser may end the chunk elsewhere
        s.write_all(
            b"POST /up/p HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\nGET /up/smuggled HTTP/1.1\r\nHost: x\r\n\r\n",
        )
        .await
        .unwrap();
        let r = response(&mut s).await;
        assert!(r.status == 400 || r.status == 502, "{}", r.head);
        assert!(ends(&mut s).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            up.take()
                .iter()
                .all(|r| r.target() != "/up/smuggled" && !r.complete),
            "nothing complete reached the upstream"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_sent_a_byte_at_a_time_is_served_then_pipelining_goes_on() {
    let up = recorder::start().await;
    let ts = server(&up);
    for mut s in both(&ts).await {
        let req = b"\r\nGET /a.txt HTTP/1.1\r\nHost: x\r\nX-Long: aaaaaaaaaaaaaaaaaaaa\r\n\r\n";
        for b in req {
            s.write_all(std::slice::from_ref(b)).await.unwrap();
            s.flush().await.unwrap();
        }
        let r = response(&mut s).await;
        assert_eq!((r.status, &r.body[..]), (200, &b"file a"[..]));
        // three pipelined requests in one write, the second a HEAD
        s.write_all(
            b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\nHEAD /a.txt HTTP/1.1\r\nHost: x\r\n\r\nGET /up/z HTTP/1.1\r\nHost: x\r\n\r\n",
        )
        .await
        .unwrap();
        let mut rd = ResponseReader::new(&mut s, TIMEOUT);
        let a = rd.next().await.expect("a response");
        let head = rd.next_to_head().await.expect("a response");
        let z = rd.next().await.expect("a response");
        assert_eq!(a.body, b"file a");
        assert_eq!(head.status, 200);
        assert_eq!(
            head.header("content-length").as_deref(),
            Some("6"),
            "{}",
            head.head
        );
        assert!(head.body.is_empty());
        assert_eq!(z.body, b"up:/up/z");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_1_0_clients_get_keep_alive_only_when_they_ask() {
    let up = recorder::start().await;
    let ts = server(&up);
    for mut s in both(&ts).await {
        s.write_all(b"GET /a.txt HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            .await
            .unwrap();
        let r = response(&mut s).await;
        // RFC 9110 section 2.5: the highest version of the client's major one
        assert!(r.head.starts_with("HTTP/1.1 200"), "{}", r.head);
        assert_eq!(r.header("connection").as_deref(), Some("keep-alive"));
        s.write_all(b"GET /a.txt HTTP/1.0\r\n\r\n").await.unwrap();
        let r = response(&mut s).await;
        assert_eq!(r.body, b"file a");
        assert!(ends(&mut s).await, "HTTP/1.0 without keep-alive: closed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_unknown_length_is_chunked_for_1_1_and_close_delimited_for_1_0() {
    let up = common::upstream::start("u").await;
    let a = up.addr;
    let ts = common::start_with(
        &format!("[[route]]\nprefix = \"/\"\nupstreams = [\"{a}\"]\n"),
        |_| {},
    );
    for (version, chunked) in [("1.1", true), ("1.0", false)] {
        let mut s = TcpStream::connect(ts.addrs[1]).await.unwrap();
        s.write_all(format!("GET /stream/3/10 HTTP/{version}\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let r = response(&mut s).await;
        assert_eq!(r.status, 200, "{}", r.head);
        assert_eq!(
            r.header("transfer-encoding").is_some(),
            chunked,
            "HTTP/{version}: {}",
            r.head
        );
        assert!(!r.body.is_empty());
        if !chunked {
            assert!(r.header("content-length").is_none());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_unread_body_that_came_with_its_head_keeps_the_connection() {
    let up = recorder::start().await;
    let ts = server(&up);
    for mut s in both(&ts).await {
        // the 405 does not read the body, but all of it is already in the read buffer
        s.write_all(b"POST /a.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloGET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut rd = ResponseReader::new(&mut s, TIMEOUT);
        let refused = rd.next().await.expect("a response");
        assert_eq!(refused.status, 405, "{}", refused.head);
        assert!(refused.header("connection").is_none(), "{}", refused.head);
        let next = rd.next().await.expect("a response");
        assert_eq!(
            next.body, b"file a",
            "the body's bytes were not taken for a request"
        );
    }
}
