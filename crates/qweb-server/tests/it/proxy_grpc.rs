//! gRPC through the proxy to an `h2c://` upstream, with tonic's client and server (over
//! hyper's HTTP/2 connections, without tonic's transport): unary calls, an error status, and
//! a bidirectional stream where each reply arrives before the next message is sent.
// tonic's API returns its own (large) `Status` in results
#![allow(clippy::result_large_err)]

use qweb_testkit as common;

use std::convert::Infallible;
use std::future::{ready, Ready};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use http::uri::PathAndQuery;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tonic::body::BoxBody;
use tonic::codec::ProstCodec;
use tonic::{Code, Status};

#[derive(Clone, PartialEq, prost::Message)]
struct Msg {
    #[prost(string, tag = "1")]
    text: String,
}

struct Hello;

impl tonic::server::UnaryService<Msg> for Hello {
    type Response = Msg;
    type Future = Ready<Result<tonic::Response<Msg>, Status>>;
    fn call(&mut self, r: tonic::Request<Msg>) -> Self::Future {
        let text = r.into_inner().text;
        if text == "nobody" {
            return ready(Err(Status::not_found("no such person")));
        }
        ready(Ok(tonic::Response::new(Msg {
            text: format!("hello {text}"),
        })))
    }
}

struct Chat;

type Replies = Pin<Box<dyn Stream<Item = Result<Msg, Status>> + Send>>;

impl tonic::server::StreamingService<Msg> for Chat {
    type Response = Msg;
    type ResponseStream = Replies;
    type Future = Ready<Result<tonic::Response<Replies>, Status>>;
    fn call(&mut self, r: tonic::Request<tonic::Streaming<Msg>>) -> Self::Future {
        let replies = r.into_inner().map(|m| {
            m.map(|m| Msg {
                text: format!("echo {}", m.text),
            })
        });
        ready(Ok(tonic::Response::new(Box::pin(replies) as Replies)))
    }
}

/// A gRPC server (tonic's server side) on an h2c listener.
async fn grpc_upstream() -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let svc = hyper::service::service_fn(
                |req: http::Request<hyper::body::Incoming>| async move {
                    let resp = match req.uri().path() {
                        "/demo.Greeter/Hello" => {
                            tonic::server::Grpc::new(ProstCodec::<Msg, Msg>::default())
                                .unary(Hello, req)
                                .await
                        }
                        "/demo.Greeter/Chat" => {
                            tonic::server::Grpc::new(ProstCodec::<Msg, Msg>::default())
                                .streaming(Chat, req)
                                .await
                        }
                        _ => Status::unimplemented("").into_http(),
                    };
                    Ok::<_, Infallible>(resp)
                },
            );
            tokio::spawn(
                hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(s), svc),
            );
        }
    });
    addr
}

/// tonic's client service over a hyper HTTP/2 connection to qweb's TLS listener.
#[derive(Clone)]
struct Channel(hyper::client::conn::http2::SendRequest<BoxBody>);

impl tonic::codegen::Service<http::Request<BoxBody>> for Channel {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = hyper::Error;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, hyper::Error>> + Send>>;
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), hyper::Error>> {
        self.0.poll_ready(cx)
    }
    fn call(&mut self, mut req: http::Request<BoxBody>) -> Self::Future {
        let pq = req
            .uri()
            .path_and_query()
            .map_or("/".to_owned(), |p| p.to_string());
        *req.uri_mut() = format!("https://localhost{pq}").parse().unwrap();
        let fut = self.0.send_request(req);
        Box::pin(fut)
    }
}

async fn channel(t: &common::TestServer) -> tonic::client::Grpc<Channel> {
    let tls = t.tls(common::Proto::H2).await;
    let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    tonic::client::Grpc::new(Channel(sender))
}

#[tokio::test]
async fn grpc_unary_error_and_bidirectional_streaming_through_the_proxy() {
    let up = grpc_upstream().await;
    let t = common::start_with(
        &format!("[[route]]\nprefix = \"/\"\nupstreams = [\"h2c://{up}\"]\n"),
        |_| {},
    );
    let mut g = channel(&t).await;

    // unary
    g.ready().await.unwrap();
    let r = g
        .unary(
            tonic::Request::new(Msg { text: "ann".into() }),
            PathAndQuery::from_static("/demo.Greeter/Hello"),
            ProstCodec::<Msg, Msg>::default(),
        )
        .await
        .expect("unary call");
    assert_eq!(r.into_inner().text, "hello ann");

    // an error status (grpc-status in the trailers-only response)
    g.ready().await.unwrap();
    let e = g
        .unary(
            tonic::Request::new(Msg {
                text: "nobody".into(),
            }),
            PathAndQuery::from_static("/demo.Greeter/Hello"),
            ProstCodec::<Msg, Msg>::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert_eq!(e.message(), "no such person");

    // bidirectional streaming: each reply before the next message
    let (tx, rx) = tokio::sync::mpsc::channel::<Msg>(4);
    let outbound =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    tx.send(Msg { text: "m0".into() }).await.unwrap();
    g.ready().await.unwrap();
    let mut replies = tokio::time::timeout(
        Duration::from_secs(5),
        g.streaming(
            tonic::Request::new(outbound),
            PathAndQuery::from_static("/demo.Greeter/Chat"),
            ProstCodec::<Msg, Msg>::default(),
        ),
    )
    .await
    .expect("stream opened")
    .expect("streaming call")
    .into_inner();
    for i in 0..5 {
        if i > 0 {
            tx.send(Msg {
                text: format!("m{i}"),
            })
            .await
            .unwrap();
        }
        let m = tokio::time::timeout(Duration::from_secs(5), replies.message())
            .await
            .expect("reply held back")
            .unwrap()
            .expect("a reply");
        assert_eq!(m.text, format!("echo m{i}"));
    }
    drop(tx);
    let end = tokio::time::timeout(Duration::from_secs(5), replies.message())
        .await
        .unwrap();
    assert!(
        matches!(end, Ok(None)),
        "clean end with grpc-status 0: {end:?}"
    );
}
