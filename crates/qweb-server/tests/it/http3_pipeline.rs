//! The whole service over HTTP/3 (python's aioquic client, `http3 = true`): static files
//! (byte ranges, conditional requests, precompressed sidecars, compression on the fly), the
//! reverse proxy to HTTP/2 upstreams (h2c, and h2 over TLS by ALPN) and to an HTTP/1.1 TLS
//! upstream, response trailers as gRPC needs them, sites chosen by `:authority` (and 421 when
//! the SNI's site may not carry it), redirects, rewrites, header rules, error pages, and the
//! access log and metrics of HTTP/3 requests. (Plain GET/HEAD and the proxy to an HTTP/1.1
//! upstream: `http3.rs`.)

use qweb_testkit as common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use crate::compression::decode;
use crate::proxy_h2::Echo;
use common::h3::{aioquic, aioquic_available, aioquic_pingpong, H3Request, H3Response};
use common::{upstream, TestServer};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

/// A TLS listener with HTTP/3 (and `extra` listener keys), then a plain one.
fn h3_listeners(extra: &str) -> String {
    format!(
        "[[listener]]\naddress = \"127.0.0.1:0\"\nhttp3 = true\n{extra}\n[listener.tls]\nself_signed = true\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\n"
    )
}

/// A proxy route `/api` to `up` with `extra` keys.
fn api_route(up: &str, extra: &str) -> String {
    format!("[[route]]\nprefix = \"/api\"\n{extra}upstreams = [\"{up}\"]\n")
}

/// `false` (and a line saying why) where aioquic is missing; `.ci/run` installs it.
fn have_client() -> bool {
    let ok = aioquic_available();
    if !ok {
        eprintln!("SKIPPED: python3 with aioquic is needed (pip install aioquic)");
    }
    ok
}

/// `reqs` on one aioquic connection to the first listener (UDP); every answer, or a panic
/// naming the request that got none.
fn fetch_blocking(addr: SocketAddr, ca: &Path, reqs: &[H3Request]) -> Vec<H3Response> {
    let out = aioquic(addr, ca, reqs, false).expect("aioquic connects");
    assert_eq!(out.len(), reqs.len());
    out.into_iter()
        .zip(reqs)
        .map(|(r, q)| r.unwrap_or_else(|e| panic!("{} {}: {e}", q.method, q.path)))
        .collect()
}

/// [`fetch_blocking`] on tokio's blocking pool, so that upstreams on the test's runtime run.
async fn fetch(t: &TestServer, reqs: Vec<H3Request>) -> Vec<H3Response> {
    let (addr, ca) = (t.addrs[0], t.cert());
    tokio::task::spawn_blocking(move || fetch_blocking(addr, &ca, &reqs))
        .await
        .unwrap()
}

// ---------------------------------------------------------------------------------------------
// Static files

/// Single ranges (from the file cache and streamed from disk), a suffix, an open end,
/// several ranges (`multipart/byteranges`, byte for byte), HEAD with a range, If-Range, and
/// 416 with `Content-Range: bytes */LEN` when none is satisfiable.
#[test]
fn byte_ranges_over_h3() {
    if !have_client() {
        return;
    }
    let small: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
    let large = upstream::random(300_000, 11);
    let t = common::start_with(&h3_listeners(""), |_| {});
    std::fs::write(t.site().join("small.bin"), &small).unwrap();
    std::fs::write(t.site().join("large.bin"), &large).unwrap();
    let first = fetch_blocking(t.addrs[0], &t.cert(), &[H3Request::get("/small.bin")]);
    let etag = first[0].header("etag").expect("an ETag").to_owned();
    for (name, data) in [("small.bin", &small), ("large.bin", &large)] {
        let len = data.len();
        let path = format!("/{name}");
        let ranged = |range: &str| H3Request::get(&path).header("range", range);
        let singles = [
            ("bytes=100-199", 100, 199),
            ("bytes=-10", len - 10, len - 1),
            ("bytes=990-", 990, len - 1),
            ("bytes=0-0", 0, 0),
        ];
        let mut reqs: Vec<H3Request> = singles.iter().map(|(r, _, _)| ranged(r)).collect();
        reqs.push(ranged("bytes=0-1,5-6,-3"));
        reqs.push(H3Request::head(&path).header("range", "bytes=2-5"));
        reqs.push(ranged(&format!("bytes={len}-")));
        reqs.push(ranged("bytes=-0"));
        reqs.push(ranged("bytes=0-4").header("if-range", "\"stale\""));
        let out = fetch_blocking(t.addrs[0], &t.cert(), &reqs);
        for ((range, a, b), r) in singles.iter().zip(&out) {
            assert_eq!(r.status, 206, "{name} {range}");
            let want = format!("bytes {a}-{b}/{len}");
            assert_eq!(r.header("content-range"), Some(want.as_str()), "{range}");
            let n = (b - a + 1).to_string();
            assert_eq!(r.header("content-length"), Some(n.as_str()), "{range}");
            assert!(r.body[..] == data[*a..=*b], "{name} {range}: bytes differ");
        }
        // several ranges: the exact multipart body
        let multi = &out[4];
        assert_eq!(multi.status, 206, "{name} multipart");
        let ct = multi.header("content-type").unwrap();
        let boundary = ct
            .strip_prefix("multipart/byteranges; boundary=")
            .unwrap_or_else(|| panic!("{ct}"));
        let mut want = Vec::new();
        for (a, b) in [(0, 1), (5, 6), (len - 3, len - 1)] {
            want.extend_from_slice(
                format!(
                    "\r\n--{boundary}\r\nContent-Type: application/octet-stream\r\n\
                     Content-Range: bytes {a}-{b}/{len}\r\n\r\n"
                )
                .as_bytes(),
            );
            want.extend_from_slice(&data[a..=b]);
        }
        want.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        assert_eq!(
            String::from_utf8_lossy(&multi.body),
            String::from_utf8_lossy(&want),
            "{name}"
        );
        assert_eq!(
            multi.header("content-length"),
            Some(want.len().to_string().as_str())
        );
        assert!(multi.header("content-range").is_none());
        // HEAD: the partial headers, no body
        let head = &out[5];
        assert_eq!(head.status, 206);
        assert_eq!(
            head.header("content-range"),
            Some(format!("bytes 2-5/{len}").as_str())
        );
        assert_eq!(head.header("content-length"), Some("4"));
        assert!(head.body.is_empty());
        // none satisfiable: 416
        for r in &out[6..8] {
            assert_eq!(r.status, 416, "{name}");
            let want = format!("bytes */{len}");
            assert_eq!(r.header("content-range"), Some(want.as_str()));
            assert!(r.body.len() < 1000, "{name}: the file was sent");
        }
        // a stale If-Range: the whole file
        let whole = &out[8];
        assert_eq!(whole.status, 200, "{name} stale If-Range");
        assert!(whole.header("content-range").is_none());
        assert!(whole.body == *data, "{name}: whole body differs");
    }
    // the current validator in If-Range: the range
    let out = fetch_blocking(
        t.addrs[0],
        &t.cert(),
        &[H3Request::get("/small.bin")
            .header("range", "bytes=10-13")
            .header("if-range", &etag)],
    );
    assert_eq!(out[0].status, 206);
    assert_eq!(out[0].body, &small[10..14]);
}

/// If-None-Match and If-Modified-Since answer 304 with no body (and the validators), a
/// different tag or an older date the file; If-Match and If-Unmodified-Since that fail: 412.
#[test]
fn conditional_requests_over_h3() {
    if !have_client() {
        return;
    }
    let t = common::start_with(&h3_listeners(""), |_| {});
    let file = t.site().join("c.txt");
    std::fs::write(&file, "conditional body").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&file)
        .unwrap()
        .set_modified(UNIX_EPOCH + Duration::from_secs(1_600_000_000))
        .unwrap();
    let first = fetch_blocking(t.addrs[0], &t.cert(), &[H3Request::get("/c.txt")]);
    assert_eq!(first[0].status, 200);
    let etag = first[0].header("etag").expect("ETag").to_owned();
    let modified = first[0].header("last-modified").expect("Last-Modified");
    assert_eq!(modified, "Sun, 13 Sep 2020 12:26:40 GMT");
    let get = || H3Request::get("/c.txt");
    let reqs = [
        get().header("if-none-match", &etag),
        get().header("if-none-match", &format!("\"other\", {etag}")),
        get().header("if-modified-since", modified),
        get().header("if-modified-since", "Sat, 12 Sep 2020 00:00:00 GMT"),
        get().header("if-none-match", "\"other\""),
        get().header("if-match", "\"other\""),
        get().header("if-unmodified-since", "Sat, 12 Sep 2020 00:00:00 GMT"),
        get().header("if-match", &etag),
        H3Request::head("/c.txt").header("if-none-match", &etag),
    ];
    let out = fetch_blocking(t.addrs[0], &t.cert(), &reqs);
    for (i, r) in out.iter().enumerate() {
        let want = match i {
            0..=2 | 8 => 304,
            5 | 6 => 412,
            _ => 200,
        };
        assert_eq!(r.status, want, "request {i}: {:?}", reqs[i].headers);
        match want {
            304 => {
                assert!(r.body.is_empty(), "request {i}: a 304 has no body");
                assert_eq!(r.header("etag"), Some(etag.as_str()), "request {i}");
            }
            200 => assert_eq!(r.body, b"conditional body", "request {i}"),
            _ => assert!(!r.body.starts_with(b"conditional"), "request {i}"),
        }
    }
}

/// A `.gz` and a `.br` sidecar next to the file (`[compression]`, `precompressed` on by
/// default) are sent byte for byte with their own length, HEAD included; `zstd` preferred
/// but without a sidecar: the best sidecar the client takes.
#[test]
fn precompressed_sidecars_over_h3() {
    use std::io::Write;
    if !have_client() {
        return;
    }
    let original = upstream::text(50_000);
    let t = common::start_with(
        &format!("[compression]\nprecompressed = true\n{}", h3_listeners("")),
        |_| {},
    );
    let s = t.site();
    std::fs::write(s.join("x.html"), &original).unwrap();
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(&original).unwrap();
    let gz = e.finish().unwrap();
    let mut br = Vec::new();
    brotli::BrotliCompress(
        &mut &original[..],
        &mut br,
        &brotli::enc::BrotliEncoderParams::default(),
    )
    .unwrap();
    // the sidecars at least as new as the file
    std::fs::write(s.join("x.html.gz"), &gz).unwrap();
    std::fs::write(s.join("x.html.br"), &br).unwrap();
    let get = |ae: &str| H3Request::get("/x.html").header("accept-encoding", ae);
    let reqs = [
        get("gzip"),
        get("br"),
        get("zstd, br;q=0.9, gzip;q=0.8"),
        H3Request::head("/x.html").header("accept-encoding", "gzip"),
        H3Request::get("/x.html"),
    ];
    let out = fetch_blocking(t.addrs[0], &t.cert(), &reqs);
    for (r, coding, sidecar) in [
        (&out[0], "gzip", &gz),
        (&out[1], "br", &br),
        (&out[2], "br", &br),
    ] {
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-encoding"), Some(coding));
        assert_eq!(r.header("content-type"), Some("text/html"));
        assert_eq!(r.header("vary"), Some("Accept-Encoding"));
        assert!(r.body == *sidecar, "{coding}: not the sidecar's bytes");
        assert_eq!(
            r.header("content-length"),
            Some(sidecar.len().to_string().as_str())
        );
        assert!(decode(coding, &r.body) == original);
    }
    let head = &out[3];
    assert_eq!(head.header("content-encoding"), Some("gzip"));
    assert_eq!(
        head.header("content-length"),
        Some(gz.len().to_string().as_str())
    );
    assert!(head.body.is_empty());
    // no Accept-Encoding: the file itself
    assert!(out[4].header("content-encoding").is_none());
    assert!(out[4].body == original);
}

/// Compression on the fly, each codec: a static file (from the cache and streamed from
/// disk) and a proxied response (with a length, and streamed in pieces); `Vary`, the weak
/// ETag with the codec (If-None-Match with it: 304), a range never encoded; every body
/// decoded equals the original.
#[tokio::test]
async fn compression_on_the_fly_over_h3() {
    if !have_client() {
        return;
    }
    let up = upstream::start("u1").await;
    let route = api_route(&up.addr.to_string(), "strip_prefix = true\n");
    let t = common::start_with(
        &format!(
            "[compression]\nprecompressed = false\nmin_size = 0\n{}\n{route}",
            h3_listeners("")
        ),
        |_| {},
    );
    let small = upstream::text(20_000);
    let large = upstream::text(200_000);
    std::fs::write(t.site().join("s.txt"), &small).unwrap();
    std::fs::write(t.site().join("l.txt"), &large).unwrap();
    let streamed = upstream::text(8 * 4000);
    let proxied = upstream::text(30_000);
    let cases: [(&str, &[u8]); 4] = [
        ("/s.txt", &small),
        ("/l.txt", &large),
        ("/api/text/30000", &proxied),
        ("/api/textstream/8/4000/10", &streamed),
    ];
    for coding in ["gzip", "br", "zstd"] {
        let reqs = cases
            .iter()
            .map(|(p, _)| H3Request::get(p).header("accept-encoding", coding))
            .collect();
        let out = fetch(&t, reqs).await;
        for ((path, original), r) in cases.iter().zip(&out) {
            assert_eq!(r.status, 200, "{coding} {path}");
            assert_eq!(r.header("content-encoding"), Some(coding), "{path}");
            assert_eq!(r.header("vary"), Some("Accept-Encoding"), "{path}");
            assert!(
                r.body.len() < original.len() / 2,
                "{coding} {path}: {} bytes",
                r.body.len()
            );
            assert!(
                decode(coding, &r.body) == *original,
                "{coding} {path}: the decoded body differs"
            );
        }
        // the static file's ETag, weak with the codec, validates the encoded variant
        let etag = out[0].header("etag").expect("ETag").to_owned();
        assert!(
            etag.starts_with("W/\"") && etag.ends_with(&format!("-{coding}\"")),
            "{etag}"
        );
        let again = fetch(
            &t,
            vec![H3Request::get("/s.txt")
                .header("accept-encoding", coding)
                .header("if-none-match", &etag)],
        )
        .await;
        assert_eq!(again[0].status, 304, "{coding}");
        assert!(again[0].body.is_empty());
    }
    // a range is never encoded; identity only: not encoded
    let out = fetch(
        &t,
        vec![
            H3Request::get("/s.txt")
                .header("accept-encoding", "gzip")
                .header("range", "bytes=0-99"),
            H3Request::get("/s.txt").header("accept-encoding", "identity"),
        ],
    )
    .await;
    assert_eq!(out[0].status, 206);
    assert!(out[0].header("content-encoding").is_none());
    assert_eq!(out[0].body, &small[..100]);
    assert!(out[1].header("content-encoding").is_none());
    assert!(out[1].body == small);
}

// ---------------------------------------------------------------------------------------------
// Reverse proxy: HTTP/2 and TLS upstreams, trailers

/// A gRPC-shaped answer: `application/grpc`, the request's version, `TE` and path in
/// headers, the body echoed, then `grpc-status` trailers (HTTP/1.1: sent only when the
/// request said `TE: trailers`, and announced by `Trailer`).
fn grpc_echo(
    req: hyper::Request<Incoming>,
) -> std::future::Ready<Result<hyper::Response<Echo>, Infallible>> {
    let te = req
        .headers()
        .get("te")
        .map(|v| v.to_str().unwrap_or("").to_owned())
        .unwrap_or_default();
    let resp = hyper::Response::builder()
        .header("content-type", "application/grpc")
        .header("trailer", "grpc-status, grpc-message")
        .header("x-up-version", format!("{:?}", req.version()))
        .header("x-up-te", te)
        .header("x-up-path", req.uri().path())
        .body(Echo {
            inner: req.into_body(),
            done: false,
        })
        .unwrap();
    std::future::ready(Ok(resp))
}

async fn serve_h2<IO>(io: IO)
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .serve_connection(io, hyper::service::service_fn(grpc_echo))
        .await;
}

async fn serve_h1<IO>(io: IO)
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(io, hyper::service::service_fn(grpc_echo))
        .await;
}

/// An h2c (prior knowledge) upstream.
async fn h2c_upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(serve_h2(TokioIo::new(s)));
        }
    });
    addr
}

/// A TLS upstream for `upstream.test` (certificate from its own CA) speaking h2 or
/// HTTP/1.1, as ALPN chose; returns its address and the CA's PEM.
async fn tls_upstream() -> (SocketAddr, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    common::install_provider();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().unwrap();
    let ca = p.self_signed(&ca_key).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["upstream.test".to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &ca, &ca_key)
        .unwrap();
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(qweb_tls::provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
        )
        .unwrap();
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(s).await else {
                    return;
                };
                if tls.get_ref().1.alpn_protocol() == Some(b"h2") {
                    serve_h2(TokioIo::new(tls)).await;
                } else {
                    serve_h1(TokioIo::new(tls)).await;
                }
            });
        }
    });
    (addr, ca.pem())
}

/// A gRPC-shaped POST: `application/grpc`, `TE: trailers`, `body`.
fn grpc_post(path: &str, body: &[u8]) -> H3Request {
    H3Request::post(path, body)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
}

/// What every gRPC-shaped exchange through an HTTP/2 upstream gets: the upstream's head, the
/// body echoed, and its trailers as a trailing HEADERS frame.
fn assert_grpc_echo(r: &H3Response, body: &[u8], version: &str) {
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("content-type"), Some("application/grpc"));
    assert_eq!(r.header("x-up-version"), Some(version));
    assert_eq!(r.header("x-up-te"), Some("trailers"), "TE: trailers passes");
    assert!(r.body == body, "echoed {} bytes", r.body.len());
    assert_eq!(r.trailer("grpc-status"), Some("0"), "{r:?}");
    assert_eq!(r.trailer("grpc-message"), Some("ok"), "{r:?}");
    assert!(r.header("grpc-status").is_none(), "trailers, not headers");
}

/// An `h2c://` upstream behind HTTP/3: gRPC-shaped unary calls (small and a body of several
/// DATA frames, several at once on one connection) get the echo and the upstream's
/// `grpc-status` trailers; a GET as well.
#[tokio::test]
async fn proxy_to_an_h2c_upstream_with_trailers_over_h3() {
    if !have_client() {
        return;
    }
    let up = h2c_upstream().await;
    let route = api_route(&format!("h2c://{up}"), "");
    let t = common::start_with(&format!("{}\n{route}", h3_listeners("")), |_| {});
    let big = upstream::random(150_000, 5);
    let out = fetch(
        &t,
        vec![
            grpc_post("/api/pkg.Svc/Unary", b"hello"),
            grpc_post("/api/pkg.Svc/Big", &big),
            grpc_post("/api/pkg.Svc/Unary", b"again"),
            H3Request::get("/api/plain?x=1"),
        ],
    )
    .await;
    assert_grpc_echo(&out[0], b"hello", "HTTP/2.0");
    assert_eq!(out[0].header("x-up-path"), Some("/api/pkg.Svc/Unary"));
    assert_grpc_echo(&out[1], &big, "HTTP/2.0");
    assert_grpc_echo(&out[2], b"again", "HTTP/2.0");
    let get = &out[3];
    assert_eq!(get.status, 200);
    assert_eq!(get.header("x-up-version"), Some("HTTP/2.0"));
    assert!(get.body.is_empty());
}

/// A bidirectional stream through an `h2c://` upstream, as a streaming gRPC call: each
/// message's echo reaches the HTTP/3 client before it sends the next (neither body is held
/// back by the proxy), then the upstream's `grpc-status` trailers.
#[tokio::test]
async fn bidirectional_stream_through_an_h2c_upstream_over_h3() {
    if !have_client() {
        return;
    }
    let up = h2c_upstream().await;
    let route = api_route(&format!("h2c://{up}"), "");
    let t = common::start_with(&format!("{}\n{route}", h3_listeners("")), |_| {});
    let (addr, ca) = (t.addrs[0], t.cert());
    let messages: Vec<Vec<u8>> = (0..5).map(|i| format!("ping{i}").into_bytes()).collect();
    let all = messages.concat();
    let r = tokio::task::spawn_blocking(move || {
        let refs: Vec<&[u8]> = messages.iter().map(Vec::as_slice).collect();
        aioquic_pingpong(addr, &ca, &grpc_post("/api/pkg.Svc/Chat", b""), &refs)
    })
    .await
    .unwrap()
    .expect("each echo before the next message");
    assert_grpc_echo(&r, &all, "HTTP/2.0");
}

/// `https://` upstreams behind HTTP/3: with `upstream_http2 = true` in HTTP/2 (ALPN h2,
/// trailers through), without it in HTTP/1.1 over TLS (verified against `upstream_ca` for
/// `upstream_server_name`), and a CA that does not match: 502.
#[tokio::test]
async fn proxy_to_tls_upstreams_over_h3() {
    if !have_client() {
        return;
    }
    let (up, ca) = tls_upstream().await;
    let tls = "upstream_ca = \"{dir}/ca.pem\"\nupstream_server_name = \"upstream.test\"\n";
    let wrong = "upstream_ca = \"{dir}/other.crt\"\nupstream_server_name = \"upstream.test\"\n";
    let routes = format!(
        "[[route]]\nprefix = \"/h2\"\n{tls}upstream_http2 = true\nupstreams = [\"https://{up}\"]\n\
         [[route]]\nprefix = \"/h1\"\n{tls}upstreams = [\"https://{up}\"]\n\
         [[route]]\nprefix = \"/bad\"\n{wrong}upstreams = [\"https://{up}\"]\n"
    );
    let t = common::start_with(&format!("{}\n{routes}", h3_listeners("")), |d| {
        std::fs::write(d.join("ca.pem"), &ca).unwrap();
        // another certificate for the same name, from no CA of the upstream's
        common::tls::write_self_signed(d, "other", &["upstream.test"]);
    });
    let body = upstream::random(70_000, 9);
    let out = fetch(
        &t,
        vec![
            grpc_post("/h2/pkg.Svc/Unary", b"over tls"),
            grpc_post("/h2/pkg.Svc/Big", &body),
            H3Request::post("/h1/echo", &body),
            grpc_post("/h1/pkg.Svc/Unary", b"h1 trailers"),
            H3Request::get("/bad/x"),
        ],
    )
    .await;
    assert_grpc_echo(&out[0], b"over tls", "HTTP/2.0");
    assert_grpc_echo(&out[1], &body, "HTTP/2.0");
    let h1 = &out[2];
    assert_eq!(h1.status, 200);
    assert_eq!(h1.header("x-up-version"), Some("HTTP/1.1"));
    assert_eq!(h1.header("x-up-path"), Some("/h1/echo"));
    assert!(h1.body == body, "echoed {} bytes", h1.body.len());
    // an HTTP/1.1 upstream's trailers (chunked, announced) reach the HTTP/3 client too
    assert_grpc_echo(&out[3], b"h1 trailers", "HTTP/1.1");
    assert_eq!(out[4].status, 502, "a certificate the CA did not sign");
}

/// An HTTP/1.1 upstream's trailer fields (`/trailers`, announced by `Trailer`) reach an
/// HTTP/3 client that sent `TE: trailers`, as HTTP/2 clients get them.
#[tokio::test]
async fn http11_upstream_trailers_reach_the_h3_client() {
    if !have_client() {
        return;
    }
    let up = upstream::start("u1").await;
    let route = api_route(&up.addr.to_string(), "strip_prefix = true\n");
    let t = common::start_with(&format!("{}\n{route}", h3_listeners("")), |_| {});
    let out = fetch(
        &t,
        vec![H3Request::get("/api/trailers").header("te", "trailers")],
    )
    .await;
    let r = &out[0];
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"body\n");
    assert_eq!(r.trailer("x-checksum"), Some("abc123"), "{r:?}");
    assert_eq!(r.trailer("x-status"), Some("done"), "{r:?}");
}

/// Request bodies over HTTP/3 that no handler reads whole: a POST to a static file (405 with
/// `Allow`, a small body and one past the stream's flow-control window), a body over the
/// proxy route's `max_body_size` with and without a `Content-Length` (413, the upstream never
/// called); the connection then serves a GET.
#[tokio::test]
async fn request_bodies_no_handler_takes_over_h3() {
    if !have_client() {
        return;
    }
    let up = upstream::start("u1").await;
    let route = api_route(&up.addr.to_string(), "max_body_size = \"1KiB\"\n");
    let t = common::start_with(&format!("{}\n{route}", h3_listeners("")), |_| {});
    std::fs::write(t.site().join("a.txt"), "a file").unwrap();
    let over = upstream::random(10_000, 4);
    let out = fetch(
        &t,
        vec![
            H3Request::post("/a.txt", b"small"),
            H3Request::post("/api/echo", &over).header("content-length", "10000"),
            H3Request::post("/api/echo", &over),
            H3Request::post("/api/echo", b"fits"),
        ],
    )
    .await;
    assert_eq!(out[0].status, 405);
    assert_eq!(out[0].header("allow"), Some("GET, HEAD"));
    assert_eq!(out[1].status, 413, "{:?}", out[1]);
    assert_eq!(out[2].status, 413, "{:?}", out[2]);
    assert_eq!(out[3].status, 200);
    assert_eq!(out[3].body, b"fits");
    // a body larger than the stream's window (1 MiB) to a handler that reads none of it
    let big = upstream::random(3 << 20, 8);
    let out = fetch(
        &t,
        vec![H3Request::post("/a.txt", &big), H3Request::get("/a.txt")],
    )
    .await;
    assert_eq!(out[0].status, 405);
    assert_eq!(out[1].status, 200);
    assert_eq!(out[1].body, b"a file");
}

// ---------------------------------------------------------------------------------------------
// Sites, redirects, rewrites, header rules, error pages

/// `:authority` picks the site (exact name, port and case ignored; a wildcard), unknown names
/// get the top-level routes; a site with certificates of its own, asked for on a connection
/// whose SNI (`localhost`, the listener's certificate) chose another site: 421.
#[test]
fn sites_are_chosen_by_authority_over_h3() {
    if !have_client() {
        return;
    }
    let config = r#"
[[listener]]
address = "127.0.0.1:0"
http3 = true
[listener.tls]
certificates = [{ cert = "{dir}/localhost.crt", key = "{dir}/localhost.key" }]
[[listener]]
address = "127.0.0.1:0"

[[route]]
prefix = "/"
root = "{dir}/default"

[[site]]
server_names = ["a.test"]
[[site.route]]
prefix = "/"
root = "{dir}/a"

[[site]]
server_names = ["*.w.test"]
[[site.route]]
prefix = "/"
root = "{dir}/b"

[[site]]
server_names = ["own.test"]
certificates = [{ cert = "{dir}/own.crt", key = "{dir}/own.key" }]
[[site.route]]
prefix = "/"
root = "{dir}/own"
"#;
    let t = common::start_with(config, |d| {
        common::tls::write_self_signed(d, "localhost", &["localhost"]);
        common::tls::write_self_signed(d, "own", &["own.test"]);
        for (site, text) in [
            ("default", "default site"),
            ("a", "site a"),
            ("b", "site b"),
            ("own", "own site"),
        ] {
            std::fs::create_dir_all(d.join(site)).unwrap();
            std::fs::write(d.join(site).join("index.html"), text).unwrap();
        }
        std::fs::write(d.join("default/only-default.txt"), "only here").unwrap();
    });
    let at = |host: &str, path: &str| H3Request::get(path).authority(host);
    let reqs = [
        at("a.test", "/"),
        at("A.Test:8443", "/"),
        at("x.w.test", "/"),
        at("w.test", "/"),
        at("unknown.test", "/"),
        H3Request::get("/"),
        at("a.test", "/only-default.txt"),
        at("own.test", "/"),
    ];
    let ca = t.dir.path().join("localhost.crt");
    let out = fetch_blocking(t.addrs[0], &ca, &reqs);
    let got: Vec<(u16, String)> = out
        .iter()
        .map(|r| (r.status, String::from_utf8_lossy(&r.body).into_owned()))
        .collect();
    let want = [
        (200, "site a"),
        (200, "site a"),
        (200, "site b"),
        (200, "default site"),
        (200, "default site"),
        (200, "default site"),
        (404, ""),
        (421, ""),
    ];
    for (i, ((st, body), (want_st, want_body))) in got.iter().zip(want).enumerate() {
        assert_eq!(*st, want_st, "request {i} ({:?}): {body}", reqs[i].headers);
        if want_st == 200 {
            assert_eq!(body, want_body, "request {i}");
        }
    }
}

/// One configuration with each rule: a top-level `rewrite` (captures, the query kept), a
/// redirect route (`{host}` from `:authority`, the query), `headers` on a static and a proxy
/// route (set, add, remove, also on a 404), `error_pages` (the page, the original status; an
/// upstream's 5xx replaced, HEAD without a body).
#[tokio::test]
async fn redirects_rewrites_headers_and_error_pages_over_h3() {
    if !have_client() {
        return;
    }
    let up = upstream::start("u1").await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let config = format!(
        r#"
rewrite = [{{ from = "^/old/(.*)$", to = "/new/$1" }}]
error_pages = {{ 404 = "/errors/404.html", "5xx" = "/errors/50x.html" }}
{}
[[route]]
prefix = "/"
root = "{{dir}}/site"
headers = {{ set = {{ "X-Frame-Options" = "DENY" }}, add = {{ "X-Multi" = ["one", "two"] }}, remove = ["Last-Modified"] }}

[[route]]
prefix = "/moved"
redirect = {{ to = "https://{{host}}/new{{query}}", status = 301 }}

[[route]]
prefix = "/api"
upstreams = ["{up}"]
strip_prefix = true
headers = {{ set = {{ "Access-Control-Allow-Origin" = "*" }}, remove = ["X-Up-Method"] }}

[[route]]
prefix = "/down"
upstreams = ["{dead}"]
connect_timeout = "2s"
"#,
        h3_listeners(""),
        up = up.addr
    );
    let t = common::start_with(&config, |d| {
        std::fs::create_dir_all(d.join("site/new")).unwrap();
        std::fs::create_dir_all(d.join("site/errors")).unwrap();
        std::fs::write(d.join("site/new/page.html"), "new page").unwrap();
        std::fs::write(d.join("site/errors/404.html"), "custom 404").unwrap();
        std::fs::write(d.join("site/errors/50x.html"), "custom 50x").unwrap();
    });
    let reqs = vec![
        H3Request::get("/old/page.html?x=1"),
        H3Request::get("/moved/x?a=1").authority("example.test:8443"),
        H3Request::get("/new/page.html"),
        H3Request::get("/api/echo/h"),
        H3Request::get("/nope"),
        H3Request::head("/nope"),
        H3Request::get("/down/x"),
        H3Request::get("/old/missing.html"),
    ];
    let out = fetch(&t, reqs).await;
    // rewrite
    assert_eq!(out[0].status, 200);
    assert_eq!(out[0].body, b"new page");
    // redirect
    let r = &out[1];
    assert_eq!(r.status, 301);
    assert_eq!(r.header("location"), Some("https://example.test/new?a=1"));
    // header rules on a static file
    let r = &out[2];
    assert_eq!(r.status, 200);
    assert_eq!(r.header_all("x-frame-options"), ["DENY"]);
    assert_eq!(r.header_all("x-multi"), ["one", "two"]);
    assert!(r.header("last-modified").is_none(), "removed");
    assert!(r.header("etag").is_some(), "the others stay");
    // ... and on a proxied response
    let r = &out[3];
    assert_eq!(r.status, 200);
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    assert!(r.header("x-up-method").is_none(), "removed: {r:?}");
    assert_eq!(r.header("x-up-uri"), Some("/echo/h"));
    // error pages: the page with the original status, the route's header rules too
    let r = &out[4];
    assert_eq!(r.status, 404);
    assert_eq!(r.body, b"custom 404");
    assert_eq!(r.header("content-type"), Some("text/html"));
    assert_eq!(r.header_all("x-frame-options"), ["DENY"]);
    let r = &out[5];
    assert_eq!(r.status, 404);
    assert_eq!(r.header("content-type"), Some("text/html"));
    assert!(r.body.is_empty());
    let r = &out[6];
    assert_eq!(r.status, 502);
    assert_eq!(r.body, b"custom 50x");
    let r = &out[7];
    assert_eq!(r.status, 404);
    assert_eq!(r.body, b"custom 404");
}

// ---------------------------------------------------------------------------------------------
// Access log and metrics

/// Set in the environment of the child process that runs [`access_log_child`].
const CHILD: &str = "QWEB_TEST_H3_ACCESS_LOG_CHILD";

/// The access log of HTTP/3 requests names the protocol (`HTTP/3`) in each format, and the
/// TLS version where the format has it. The log is read through a global log subscriber, so
/// the test runs in a process of its own: this test binary again, running only
/// [`access_log_child`].
#[test]
fn access_log_lines_name_http3() {
    if !have_client() {
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "http3_pipeline::access_log_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .expect("the test binary runs");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the child failed:\n{text}");
    assert!(text.contains("1 passed"), "the child did not run:\n{text}");
}

/// The child half of [`access_log_lines_name_http3`] (nothing without [`CHILD`] set).
#[test]
#[ignore = "run by access_log_lines_name_http3 in a process of its own"]
fn access_log_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let log = Capture::install();
    for format in ["qweb", "combined", "json"] {
        let t = common::start_with(
            &format!("[log]\nformat = \"{format}\"\n{}", h3_listeners("")),
            |_| {},
        );
        std::fs::write(t.site().join(format!("{format}.txt")), "12345").unwrap();
        let path = format!("/{format}.txt");
        let out = fetch_blocking(
            t.addrs[0],
            &t.cert(),
            &[
                H3Request::get(&format!("{path}?q=1")),
                H3Request::get(&format!("/missing-{format}")),
            ],
        );
        assert_eq!(out[0].status, 200);
        assert_eq!(out[1].status, 404);
        let port = t.addrs[0].port();
        match format {
            "qweb" => {
                let line = log.wait_for(&format!("\"GET {path}?q=1 HTTP/3\" 200 5 "));
                assert!(line.contains(" 127.0.0.1:"), "{line}");
                assert!(line.ends_with("ms"), "{line}");
                log.wait_for(&format!("\"GET /missing-{format} HTTP/3\" 404 "));
            }
            "combined" => {
                let line = log.wait_for(&format!("\"GET {path}?q=1 HTTP/3\" 200 5 "));
                assert!(line.contains("\"-\" \"aioquic\" "), "{line}");
                assert!(line.ends_with(" TLSv1.3"), "{line}");
            }
            _ => {
                let line = log.wait_for(&format!("\"target\":\"{path}?q=1\""));
                for field in [
                    "\"method\":\"GET\"".to_owned(),
                    "\"protocol\":\"HTTP/3\"".to_owned(),
                    format!("\"host\":\"localhost:{port}\""),
                    "\"user_agent\":\"aioquic\"".to_owned(),
                    "\"tls\":\"TLSv1.3\"".to_owned(),
                    "\"status\":200".to_owned(),
                    "\"bytes\":5".to_owned(),
                    "\"aborted\":false".to_owned(),
                ] {
                    assert!(line.contains(&field), "{field} in {line}");
                }
            }
        }
    }
}

/// Every line the process logs (a global subscriber: only in [`access_log_child`]'s own
/// process).
#[derive(Clone)]
struct Capture(Arc<std::sync::Mutex<Vec<u8>>>);

impl Capture {
    fn install() -> Capture {
        let c = Capture(Arc::default());
        let writer = c.clone();
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || writer.clone())
            .init();
        c
    }

    /// The first line holding `needle`, waited for up to 10 s.
    fn wait_for(&self, needle: &str) -> String {
        common::poll_until(
            needle,
            Duration::from_secs(10),
            Duration::from_millis(20),
            || {
                let text = String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned();
                text.lines()
                    .find(|l| l.contains(needle))
                    .map(|l| l.trim_end().to_owned())
            },
        )
    }
}

impl std::io::Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// HTTP/3 requests are counted on `/metrics` as others are: per route and status class, in
/// the workers' request count, the compressed responses per codec; the connection under
/// `protocol="h3"` while it lives (`http3.rs`), and no HTTP/1.1 or h2 connection meanwhile.
#[tokio::test]
async fn http3_requests_are_counted_in_metrics() {
    if !have_client() {
        return;
    }
    let up = upstream::start("u1").await;
    let route = api_route(&up.addr.to_string(), "strip_prefix = true\n");
    let t = common::start_with(
        &format!(
            "[admin]\naddress = \"127.0.0.1:0\"\n[compression]\nmin_size = 0\n{}\n{route}",
            h3_listeners("")
        ),
        |_| {},
    );
    std::fs::write(t.site().join("a.txt"), upstream::text(5000)).unwrap();
    let out = fetch(
        &t,
        vec![
            H3Request::get("/a.txt"),
            H3Request::get("/a.txt").header("accept-encoding", "gzip"),
            H3Request::get("/missing"),
            H3Request::get("/api/hello"),
        ],
    )
    .await;
    let statuses: Vec<u16> = out.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 200, 404, 200]);
    let m = t.metrics().await;
    let route = |r: &str, class: &str| {
        m.sum(
            "qweb_http_route_requests_total",
            &[("route", r), ("class", class)],
        )
    };
    assert_eq!(route("/", "2xx"), 2.0, "{m}");
    assert_eq!(route("/", "4xx"), 1.0, "{m}");
    assert_eq!(route("/api", "2xx"), 1.0, "{m}");
    assert_eq!(m.sum("qweb_http_requests_total", &[]), 4.0, "{m}");
    assert_eq!(
        m.sum("qweb_compression_responses_total", &[("codec", "gzip")]),
        1.0,
        "{m}"
    );
    for protocol in ["http/1.1", "h2"] {
        assert_eq!(
            m.sum("qweb_http_connections_open", &[("protocol", protocol)]),
            0.0,
            "{m}"
        );
    }
}
