//! The HTTP/3 side of the load generator (`--http 3`): QUIC connections with quinn, requests
//! with the `h3` crate. Each connection task has its own client endpoint (its own UDP port),
//! as separate clients would, so a server with one socket per worker sees them spread.
//!
//! A handshake operation is: a new QUIC connection with a full TLS 1.3 handshake (the client
//! keeps no session and offers no 0-RTT), then one request with `--request`, or else the wait
//! for the server's first unidirectional stream (its HTTP/3 control stream, which a server
//! opens once its side of the handshake is complete, as TCP's mode waits for the server's
//! close), then an immediate close.

use super::*;

/// A connection's request sender.
pub(super) type H3Sender = h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>;

/// The QUIC client configuration of a run: `tls` (ALPN h3, TLS 1.3, no resumption).
pub(super) fn client_config(tls: Arc<rustls::ClientConfig>) -> Result<quinn::ClientConfig> {
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls)
        .map_err(|e| Error::Tls(format!("QUIC client configuration: {e}")))?;
    Ok(quinn::ClientConfig::new(Arc::new(crypto)))
}

/// A client endpoint on its own UDP port.
pub(super) fn endpoint(sh: &Shared) -> Result<quinn::Endpoint, OpError> {
    let bind: SocketAddr = if sh.target.addr.is_ipv6() {
        (std::net::Ipv6Addr::LOCALHOST, 0).into()
    } else {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    };
    let mut ep = quinn::Endpoint::client(bind).map_err(|e| OpError::Connect(e.to_string()))?;
    if let Some(c) = &sh.quic {
        ep.set_default_client_config(c.clone());
    }
    Ok(ep)
}

/// A QUIC connection to the next target with a full handshake.
async fn connect(sh: &Shared, ep: &quinn::Endpoint) -> Result<quinn::Connection, OpError> {
    let target = sh.next();
    let name = match &target.server_name {
        ServerName::DnsName(n) => n.as_ref().to_string(),
        _ => "localhost".to_string(),
    };
    let connecting = ep
        .connect(target.addr, &name)
        .map_err(|e| OpError::Connect(e.to_string()))?;
    connecting.await.map_err(|e| OpError::Tls(e.to_string()))
}

/// An HTTP/3 session on `conn`: its request sender and the task driving the connection.
async fn h3_session(
    conn: quinn::Connection,
) -> Result<(Sender, tokio::task::JoinHandle<()>), OpError> {
    let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn))
        .await
        .map_err(|e| OpError::Http(e.to_string()))?;
    let task = tokio::spawn(async move {
        let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
    });
    Ok((Sender::H3(send), task))
}

/// A connection ready for requests (keep-alive mode).
pub(super) async fn open(
    sh: &Shared,
    ep: &quinn::Endpoint,
) -> Result<(Sender, tokio::task::JoinHandle<()>), OpError> {
    h3_session(connect(sh, ep).await?).await
}

/// One handshake-mode operation over QUIC (see the module's comment).
pub(super) async fn handshake_op(sh: &Shared, ep: &quinn::Endpoint) -> Result<u64, OpError> {
    let conn = connect(sh, ep).await?;
    let n = if sh.spec.request {
        let (mut sender, task) = h3_session(conn.clone()).await?;
        let n = request(sh, &mut sender).await;
        drop(sender);
        task.abort();
        n?
    } else {
        conn.accept_uni()
            .await
            .map_err(|e| OpError::Http(format!("no control stream from the server: {e}")))?;
        0
    };
    conn.close(0u32.into(), b"");
    Ok(n)
}

/// One request over HTTP/3.
pub(super) async fn fetch(sh: &Shared, send: &mut H3Sender) -> Result<Fetched, OpError> {
    let mut b = Request::get(sh.target.uri.clone());
    if let Some(ae) = &sh.spec.accept_encoding {
        b = b.header(ACCEPT_ENCODING, ae.as_str());
    }
    let req = b.body(()).map_err(|e| OpError::Http(e.to_string()))?;
    let http = |e: &dyn std::fmt::Display| OpError::Http(e.to_string());
    let mut stream = send.send_request(req).await.map_err(|e| http(&e))?;
    stream.finish().await.map_err(|e| http(&e))?;
    let resp = stream.recv_response().await.map_err(|e| http(&e))?;
    let mut got = Fetched::headers(resp.status(), resp.headers());
    while let Some(mut chunk) = stream.recv_data().await.map_err(|e| http(&e))? {
        use bytes::Buf;
        while chunk.has_remaining() {
            let piece = chunk.chunk();
            got.data(piece);
            let k = piece.len();
            chunk.advance(k);
        }
    }
    Ok(got)
}
