//! The HTTP/3 driver without a socket: quinn endpoints over an in-memory datagram pipe (an
//! `AsyncUdpSocket` of this file), the `h3` crate's client, the worker and service of
//! `test_kit.rs`. The driver, quinn, h3 and the session are the real ones.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::test_kit::{host, local, Svc, TestHost};
use crate::config::Limits;

/// One end of an in-memory datagram pipe.
#[derive(Debug)]
struct Pipe {
    addr: SocketAddr,
    out: mpsc::UnboundedSender<(SocketAddr, Vec<u8>)>,
    incoming: Mutex<mpsc::UnboundedReceiver<(SocketAddr, Vec<u8>)>>,
}

/// Two connected ends, `a` and `b`.
fn pipe(a: SocketAddr, b: SocketAddr) -> (Pipe, Pipe) {
    let (to_b, from_a) = mpsc::unbounded_channel();
    let (to_a, from_b) = mpsc::unbounded_channel();
    (
        Pipe {
            addr: a,
            out: to_b,
            incoming: Mutex::new(from_b),
        },
        Pipe {
            addr: b,
            out: to_a,
            incoming: Mutex::new(from_a),
        },
    )
}

#[derive(Debug)]
struct Writable;

impl UdpPoller for Writable {
    fn poll_writable(self: Pin<&mut Self>, _: &mut Context) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl AsyncUdpSocket for Pipe {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Box::pin(Writable)
    }

    fn try_send(&self, t: &Transmit) -> io::Result<()> {
        let size = t.segment_size.unwrap_or(t.contents.len()).max(1);
        for d in t.contents.chunks(size) {
            // a closed other end: the datagram is lost, as on a network
            let _ = self.out.send((self.addr, d.to_vec()));
        }
        Ok(())
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [io::IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        let mut rx = self.incoming.lock().expect("not poisoned");
        match rx.poll_recv(cx) {
            Poll::Ready(Some((from, d))) => {
                let n = d.len().min(bufs[0].len());
                bufs[0][..n].copy_from_slice(&d[..n]);
                meta[0] = RecvMeta {
                    addr: from,
                    len: n,
                    stride: n,
                    ..RecvMeta::default()
                };
                Poll::Ready(Ok(1))
            }
            Poll::Ready(None) => Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
            Poll::Pending => Poll::Pending,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.addr)
    }
}

/// A QUIC server endpoint and a client endpoint connected through a [`Pipe`]; the client's
/// TLS trusts the server's self-signed certificate for `localhost`.
fn endpoints(limits: &Limits) -> (quinn::Endpoint, quinn::Endpoint, SocketAddr) {
    let provider = Arc::new(qweb_tls::provider());
    let key = rcgen::KeyPair::generate().expect("a key");
    let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
        .expect("params")
        .self_signed(&key)
        .expect("a certificate");
    let der = cert.der().clone();
    let mut tls = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_no_client_auth()
        .with_single_cert(
            vec![der.clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .expect("the key fits");
    tls.alpn_protocols = vec![super::h3::ALPN_H3.to_vec()];
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(Arc::new(tls)).expect("QUIC");
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let mut transport = quinn::TransportConfig::default();
    transport.max_idle_timeout(Some(
        (limits.keepalive_timeout * 4).try_into().expect("idle"),
    ));
    server.transport_config(Arc::new(transport));
    let mut roots = rustls::RootCertStore::empty();
    roots.add(der).expect("a root");
    let mut client_tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_root_certificates(roots)
        .with_no_client_auth();
    client_tls.alpn_protocols = vec![super::h3::ALPN_H3.to_vec()];
    let client_crypto =
        quinn::crypto::rustls::QuicClientConfig::try_from(Arc::new(client_tls)).expect("QUIC");
    let (s_addr, c_addr): (SocketAddr, SocketAddr) =
        (([127, 0, 0, 1], 443).into(), ([127, 0, 0, 1], 5000).into());
    let (s, c) = pipe(s_addr, c_addr);
    let runtime = Arc::new(quinn::TokioRuntime);
    let server_ep = quinn::Endpoint::new_with_abstract_socket(
        quinn::EndpointConfig::default(),
        Some(server),
        Arc::new(s),
        runtime.clone(),
    )
    .expect("the server endpoint");
    let mut client_ep = quinn::Endpoint::new_with_abstract_socket(
        quinn::EndpointConfig::default(),
        None,
        Arc::new(c),
        runtime,
    )
    .expect("the client endpoint");
    client_ep.set_default_client_config(quinn::ClientConfig::new(Arc::new(client_crypto)));
    (server_ep, client_ep, s_addr)
}

/// The driver serving one connection from a client of `endpoints`, and the client's request
/// sender; the driver's task ends with the connection.
async fn connect(
    limits: Limits,
) -> (
    Rc<TestHost>,
    h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>,
    tokio::task::JoinHandle<()>,
    (quinn::Endpoint, quinn::Endpoint),
) {
    let (server_ep, client_ep, addr) = endpoints(&limits);
    let host = host(limits);
    let (h, ep) = (host.clone(), server_ep.clone());
    let served = tokio::task::spawn_local(async move {
        let incoming = ep.accept().await.expect("a connection");
        super::h3::serve(incoming, &*h, Svc::new).await;
    });
    let conn = client_ep
        .connect(addr, "localhost")
        .expect("connect")
        .await
        .expect("the QUIC handshake");
    let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn))
        .await
        .expect("HTTP/3 set up");
    tokio::task::spawn_local(async move {
        let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
    });
    (host, send, served, (server_ep, client_ep))
}

/// `GET path` (with `headers`): the status and the body.
async fn get(
    send: &mut h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<(u16, Vec<u8>), String> {
    let mut req = http::Request::builder().uri(format!("https://localhost{path}"));
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    let mut stream = send
        .send_request(req.body(()).expect("a request"))
        .await
        .map_err(|e| e.to_string())?;
    stream.finish().await.map_err(|e| e.to_string())?;
    let resp = stream.recv_response().await.map_err(|e| e.to_string())?;
    let mut body = Vec::new();
    while let Some(mut chunk) = stream.recv_data().await.map_err(|e| e.to_string())? {
        while chunk.has_remaining() {
            let c = chunk.chunk();
            body.extend_from_slice(c);
            let n = c.len();
            chunk.advance(n);
        }
    }
    Ok((resp.status().as_u16(), body))
}

fn limits() -> Limits {
    Limits {
        keepalive_timeout: Duration::from_secs(5),
        ..Limits::default()
    }
}

#[tokio::test(flavor = "current_thread")]
async fn requests_are_answered_and_an_idle_connection_drained() {
    local(async {
        let (_host, mut send, served, _eps) = connect(limits()).await;
        assert_eq!(get(&mut send, "/", &[]).await, Ok((200, b"hello".to_vec())));
        assert_eq!(
            get(&mut send, "/stream", &[]).await,
            Ok((200, b"one two three".to_vec()))
        );
        // a Content-Length that is not one number: 400, as HTTP/1 refuses it
        let (status, _) = get(&mut send, "/", &[("content-length", "+5")])
            .await
            .expect("answered");
        assert_eq!(status, 400);
        // no request for keepalive_timeout: GOAWAY, and the connection ends after its grace
        let t0 = Instant::now();
        tokio::time::timeout(Duration::from_secs(30), served)
            .await
            .expect("the driver ended")
            .expect("without a panic");
        let t = t0.elapsed();
        assert!(
            t >= Duration::from_secs(4) && t <= Duration::from_secs(8),
            "ended after {t:?}"
        );
    })
    .await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_shutdown_lets_the_request_in_flight_finish() {
    local(async {
        let (host, send, served, _eps) = connect(Limits {
            keepalive_timeout: Duration::from_secs(60),
            ..Limits::default()
        })
        .await;
        let slow = tokio::task::spawn_local({
            let mut send = send.clone();
            async move { get(&mut send, "/slow", &[]).await }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        host.shutdown.send_replace(true);
        assert_eq!(slow.await.unwrap(), Ok((200, b"slow".to_vec())));
        let t0 = Instant::now();
        tokio::time::timeout(Duration::from_secs(10), served)
            .await
            .expect("the driver ended after the request")
            .expect("without a panic");
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
        drop(send);
    })
    .await;
}
