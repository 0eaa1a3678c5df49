//! Trailer fields from an upstream (issue 41, item 3): RFC 9110 §6.5.1 forbids sending, or
//! acting on, framing, routing, authentication, response-control and content fields as
//! trailers. An upstream's chunked trailers reach the client without them, over HTTP/1.1,
//! HTTP/2 and HTTP/3 alike; what gRPC and timing need (`grpc-status`, `x-*`) passes.

use qweb_testkit as common;

use std::time::Duration;

use common::h3::{aioquic, aioquic_available, H3Request};
use common::Proto;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const TIMEOUT: Duration = Duration::from_secs(10);

/// Trailers the upstream sends: (name, value, passes).
const SENT: [(&str, &str, bool); 9] = [
    ("x-t", "ok", true),
    ("grpc-status", "0", true),
    ("location", "//evil.example/", false),
    ("set-cookie", "session=stolen", false),
    ("content-type", "text/evil", false),
    ("content-length", "999", false),
    ("www-authenticate", "Basic realm=x", false),
    ("cache-control", "public, max-age=99999", false),
    ("host", "evil.example", false),
];

/// An HTTP/1.1 upstream that answers every request with a chunked body and the [`SENT`]
/// trailers, all announced in `Trailer`.
async fn trailing_upstream() -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let n = match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    buf.extend_from_slice(&chunk[..n]);
                    while let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.drain(..i + 4);
                        let names: Vec<&str> = SENT.iter().map(|t| t.0).collect();
                        let mut out = format!(
                            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: {}\r\n\r\n5\r\nhello\r\n0\r\n",
                            names.join(", ")
                        );
                        for (n, v, _) in SENT {
                            out.push_str(&format!("{n}: {v}\r\n"));
                        }
                        out.push_str("\r\n");
                        if s.write_all(out.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

/// The names among `got` that should not have passed, and those that should have and did not.
fn judge(proto: &str, got: &[(String, String)]) -> Vec<String> {
    let mut bad = Vec::new();
    for (n, v, passes) in SENT {
        let seen = got
            .iter()
            .any(|(gn, gv)| gn.eq_ignore_ascii_case(n) && gv == v);
        if seen != passes {
            bad.push(format!(
                "{proto}: {n} {}",
                if seen { "passed" } else { "was lost" }
            ));
        }
    }
    bad
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forbidden_trailer_fields_never_reach_the_client() {
    let up = trailing_upstream().await;
    let ts = common::start_with(
        &format!(
            "[[listener]]\naddress = \"127.0.0.1:0\"\nhttp3 = true\n[listener.tls]\nself_signed = true\n\
             [[listener]]\naddress = \"127.0.0.1:0\"\n\
             [[route]]\nprefix = \"/\"\nupstreams = [\"{up}\"]\n"
        ),
        |_| {},
    );
    let (tls, plain) = (ts.addrs[0], ts.addrs[1]);
    let mut bad = Vec::new();
    // HTTP/1.1, asking for trailers
    let out = common::raw_exchange(
        plain,
        b"GET /t HTTP/1.1\r\nHost: localhost\r\nTE: trailers\r\nConnection: close\r\n\r\n",
        TIMEOUT,
    )
    .await;
    let text = String::from_utf8_lossy(&out);
    let tail = text.rsplit_once("\r\n0\r\n").map(|t| t.1).unwrap_or("");
    assert!(text.contains("hello"), "{text}");
    let got: Vec<(String, String)> = tail
        .split("\r\n")
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    bad.extend(judge("h1", &got));
    // HTTP/2
    let client = common::h2client::handshake(ts.tls(Proto::H2).await).await;
    let (_, _, trailers) = common::h2client::get(&client, "/t", &[("te", "trailers")]).await;
    let got: Vec<(String, String)> = trailers
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    bad.extend(judge("h2", &got));
    // HTTP/3
    if aioquic_available() {
        let ca = ts.cert();
        let req = H3Request::get("/t").header("te", "trailers");
        let out = tokio::task::spawn_blocking(move || aioquic(tls, &ca, &[req], false))
            .await
            .unwrap()
            .expect("aioquic connects");
        let r = out[0].as_ref().expect("an answer");
        assert_eq!(r.body, b"hello");
        bad.extend(judge("h3", &r.trailers));
    } else {
        eprintln!("SKIPPED (HTTP/3 part): python3 with aioquic is needed (pip install aioquic)");
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}
