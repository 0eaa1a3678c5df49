//! HTTP/2 upstreams, `h2c://` and h2 over TLS (ALPN), against real hyper HTTP/2 servers: a
//! gRPC-shaped exchange (`application/grpc`, `TE: trailers`, `grpc-status` trailers), unary
//! and a bidirectional stream where each message is echoed before the next is sent.

use qweb_testkit as common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Body, Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use tokio::net::TcpListener;

/// The request body echoed frame by frame, then `grpc-status: 0` trailers (also the
/// upstream of `http3_pipeline`'s gRPC-shaped tests).
pub(crate) struct Echo {
    pub(crate) inner: Incoming,
    pub(crate) done: bool,
}

impl Body for Echo {
    type Data = Bytes;
    type Error = hyper::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        loop {
            if self.done {
                return Poll::Ready(None);
            }
            return match Pin::new(&mut self.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(f))) => match f.into_data() {
                    Ok(d) => Poll::Ready(Some(Ok(Frame::data(d)))),
                    Err(_) => continue, // the client's trailers
                },
                Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => {
                    self.done = true;
                    let mut t = http::HeaderMap::new();
                    t.insert("grpc-status", "0".parse().unwrap());
                    t.insert("grpc-message", "ok".parse().unwrap());
                    Poll::Ready(Some(Ok(Frame::trailers(t))))
                }
                Poll::Pending => Poll::Pending,
            };
        }
    }
}

async fn serve_h2<IO>(io: IO)
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(|req: hyper::Request<Incoming>| async move {
        let te = req
            .headers()
            .get("te")
            .map(|v| v.to_str().unwrap_or("").to_owned())
            .unwrap_or_default();
        let version = format!("{:?}", req.version());
        let authority = req
            .uri()
            .authority()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let resp = hyper::Response::builder()
            .header("content-type", "application/grpc")
            .header("x-up-version", version)
            .header("x-up-te", te)
            .header("x-up-authority", authority)
            .body(Echo {
                inner: req.into_body(),
                done: false,
            })
            .unwrap();
        Ok::<_, Infallible>(resp)
    });
    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .serve_connection(io, svc)
        .await;
}

/// An h2c (prior knowledge) upstream; counts connections.
async fn h2c_upstream() -> (SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let n = Arc::new(AtomicUsize::new(0));
    let c = n.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            c.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve_h2(TokioIo::new(s)));
        }
    });
    (addr, n)
}

/// An h2-over-TLS upstream (ALPN h2 only) with a certificate for `upstream.test` from its
/// own CA; returns the CA's PEM.
async fn h2_tls_upstream() -> (SocketAddr, Arc<AtomicUsize>, String) {
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
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let n = Arc::new(AtomicUsize::new(0));
    let c = n.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            c.fetch_add(1, Ordering::SeqCst);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(s).await {
                    serve_h2(TokioIo::new(tls)).await;
                }
            });
        }
    });
    (addr, n, ca.pem())
}

type Sender = hyper::client::conn::http2::SendRequest<
    http_body_util::combinators::BoxBody<Bytes, Infallible>,
>;

/// An HTTP/2 client connection to qweb's TLS listener.
async fn h2_client(t: &common::TestServer) -> Sender {
    let tls = t.tls(common::Proto::H2).await;
    let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

fn grpc_request(
    path: &str,
    body: http_body_util::combinators::BoxBody<Bytes, Infallible>,
) -> hyper::Request<http_body_util::combinators::BoxBody<Bytes, Infallible>> {
    hyper::Request::builder()
        .method("POST")
        .uri(format!("https://localhost{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(body)
        .unwrap()
}

async fn unary(c: &mut Sender) {
    let r = c
        .send_request(grpc_request(
            "/pkg.Svc/Unary",
            Full::new(Bytes::from("hello")).boxed(),
        ))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-up-version"], "HTTP/2.0");
    assert_eq!(r.headers()["x-up-te"], "trailers");
    assert_eq!(r.headers()["content-type"], "application/grpc");
    let all = r.into_body().collect().await.unwrap();
    let trailers = all.trailers().cloned().expect("trailers");
    assert_eq!(all.to_bytes(), "hello");
    assert_eq!(trailers["grpc-status"], "0");
    assert_eq!(trailers["grpc-message"], "ok");
}

async fn bidi(c: &mut Sender) {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
    let stream = tokio_stream_from(rx);
    let req = grpc_request("/pkg.Svc/Chat", StreamBody::new(stream).boxed());
    let resp_fut = c.send_request(req);
    tx.send(Ok(Frame::data(Bytes::from("ping0"))))
        .await
        .unwrap();
    let r = tokio::time::timeout(Duration::from_secs(5), resp_fut)
        .await
        .expect("response head while the request streams")
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut body = r.into_body();
    for i in 0..5 {
        if i > 0 {
            tx.send(Ok(Frame::data(Bytes::from(format!("ping{i}")))))
                .await
                .unwrap();
        }
        // the echo of message i arrives before message i+1 is sent
        let mut got = Vec::new();
        while got.len() < 5 {
            let f = tokio::time::timeout(Duration::from_secs(5), body.frame())
                .await
                .expect("echo did not arrive: the stream is held back")
                .unwrap()
                .unwrap();
            got.extend_from_slice(&f.into_data().unwrap());
        }
        assert_eq!(got, format!("ping{i}").as_bytes());
    }
    drop(tx);
    let rest = body.collect().await.unwrap();
    assert_eq!(rest.trailers().expect("trailers")["grpc-status"], "0");
}

/// A stream of the channel's items.
fn tokio_stream_from<T: Send + 'static>(
    rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> + Send {
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|v| (v, rx)) })
}

#[tokio::test]
async fn h2c_upstream_unary_and_bidirectional_stream_with_trailers() {
    let (up, conns) = h2c_upstream().await;
    let t = common::start_with(
        &format!("[[route]]\nprefix = \"/\"\nupstreams = [\"h2c://{up}\"]\n"),
        |_| {},
    );
    let mut c = h2_client(&t).await;
    unary(&mut c).await;
    bidi(&mut c).await;
    unary(&mut c).await;
    assert_eq!(
        conns.load(Ordering::SeqCst),
        1,
        "one multiplexed upstream connection"
    );
    // an HTTP/1.1 client reaches the same upstream
    let r = common::plain_client()
        .post(format!("{}/x", t.http()))
        .body("plain")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-up-version"], "HTTP/2.0");
    assert_eq!(r.text().await.unwrap(), "plain");
}

#[tokio::test]
async fn h2_over_tls_upstream_by_alpn() {
    let (up, conns, ca) = h2_tls_upstream().await;
    let t = common::start_with(
        &format!(
            "[[route]]\nprefix = \"/\"\nupstreams = [\"https://{up}\"]\nupstream_http2 = true\n\
             upstream_ca = \"{{dir}}/ca.pem\"\nupstream_server_name = \"upstream.test\"\n"
        ),
        |d| std::fs::write(d.join("ca.pem"), &ca).unwrap(),
    );
    let mut c = h2_client(&t).await;
    unary(&mut c).await;
    bidi(&mut c).await;
    assert_eq!(conns.load(Ordering::SeqCst), 1);
    // without upstream_http2 the upstream (h2 only) refuses the ALPN: 502
    let t = common::start_with(
        &format!(
            "[[route]]\nprefix = \"/\"\nupstreams = [\"https://{up}\"]\n\
             upstream_ca = \"{{dir}}/ca.pem\"\nupstream_server_name = \"upstream.test\"\n"
        ),
        |d| std::fs::write(d.join("ca.pem"), &ca).unwrap(),
    );
    let r = common::plain_client()
        .get(format!("{}/x", t.http()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 502);
}
