//! Opening a connection: TCP, the TLS handshake (its kind checked), then the HTTP/1.1 or
//! HTTP/2 handshake.

use std::time::Duration;

use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::shared::{HsKind, OpError, Shared};
use super::Sender;
use crate::tls::HttpVersion;

/// Connects to the next target and does the TLS handshake, offering a stored session when
/// `resume` (and there is a resume connector). A connection that offered none must have had
/// a full handshake; one that offered a session may still get a full one (the server did
/// not accept it), which is counted, not an error.
pub(super) async fn connect_tls(
    sh: &Shared,
    resume: bool,
    rsa_only: bool,
) -> Result<(TlsStream<TcpStream>, HsKind), OpError> {
    let target = sh.next();
    let tcp = TcpStream::connect(target.addr)
        .await
        .map_err(|e| OpError::Connect(e.to_string()))?;
    let _ = tcp.set_nodelay(true);
    let _ = socket2::SockRef::from(&tcp).set_linger(Some(Duration::ZERO));
    let (connector, asked) = match (&sh.resume_connector, resume, &sh.rsa_connector) {
        (Some(c), true, _) => (c, true),
        (_, _, Some(c)) if rsa_only => (c, false),
        _ => (&sh.connector, false),
    };
    let tls = connector
        .connect(target.server_name.clone(), tcp)
        .await
        .map_err(|e| OpError::Tls(e.to_string()))?;
    let kind = tls.get_ref().1.handshake_kind();
    let resumed = kind == Some(rustls::HandshakeKind::Resumed);
    if !asked && kind != Some(rustls::HandshakeKind::Full) {
        return Err(OpError::NotFull(format!("{kind:?}")));
    }
    Ok((tls, HsKind { asked, resumed }))
}

pub(super) async fn http_handshake(
    sh: &Shared,
    tls: TlsStream<TcpStream>,
) -> Result<(Sender, tokio::task::JoinHandle<()>), OpError> {
    let io = TokioIo::new(tls);
    match sh.spec.http {
        HttpVersion::H1 => {
            let (s, c) = http1::handshake(io)
                .await
                .map_err(|e| OpError::Http(e.to_string()))?;
            Ok((
                Sender::H1(s),
                tokio::spawn(async move {
                    let _ = c.await;
                }),
            ))
        }
        HttpVersion::H3 => Err(OpError::Http(
            "HTTP/3 runs over QUIC, not over a TLS stream".into(),
        )),
        HttpVersion::H2 => {
            let (s, c) = http2::handshake(TokioExecutor::new(), io)
                .await
                .map_err(|e| OpError::Http(e.to_string()))?;
            Ok((
                Sender::H2(s),
                tokio::spawn(async move {
                    let _ = c.await;
                }),
            ))
        }
    }
}
