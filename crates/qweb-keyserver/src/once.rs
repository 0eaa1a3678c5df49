//! Requests on a connection of their own, closed after the answer: the fleet's ticket keys,
//! key generation and the one signature of a certificate request (ACME), none of which goes
//! through the engine's pooled connections (those carry handshake signatures).

use std::time::Duration;

use bytes::BytesMut;
use qweb_offload::{KeyId, SignScheme};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::client::{connect, ClientConfig, ClientError, Endpoint, Stream};
use crate::protocol::Frame;

/// Sends `request` to `server` and returns its answer (an error frame is
/// [`ClientError::Refused`]), within the engine's timeout (at least 1 s).
pub async fn ask(
    server: &Endpoint,
    cfg: &ClientConfig,
    request: &Frame,
) -> Result<Frame, ClientError> {
    let limit = cfg.timeout.max(Duration::from_secs(1));
    let work = async {
        match connect(server, cfg).await? {
            Stream::Unix(s) => exchange(s, request).await,
            Stream::Tls(s) => exchange(*s, request).await,
        }
    };
    tokio::time::timeout(limit, work)
        .await
        .map_err(|_| ClientError::AnswerTimeout)?
}

pub(crate) async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    request: &Frame,
) -> Result<Frame, ClientError> {
    let mut out = BytesMut::new();
    request.encode(&mut out);
    s.write_all(&out).await?;
    let mut buf = BytesMut::with_capacity(1024);
    loop {
        match Frame::decode(&mut buf) {
            Ok(Some(Frame::Error { code, message, .. })) => {
                return Err(ClientError::Refused { code, message })
            }
            Ok(Some(f)) if f.id() == request.id() => return Ok(f),
            Ok(Some(_)) => return Err(ClientError::UnexpectedAnswer),
            Err(e) => return Err(e.into()),
            Ok(None) => {}
        }
        if s.read_buf(&mut buf).await? == 0 {
            return Err(ClientError::Closed);
        }
    }
}

/// [`ask`] the engine's key servers in order; the first answer wins. The error names every
/// server's failure.
pub async fn ask_any(cfg: &ClientConfig, request: &Frame) -> Result<Frame, String> {
    let mut errors = Vec::new();
    for server in &cfg.servers {
        match ask(server, cfg, request).await {
            Ok(f) => return Ok(f),
            Err(e) => errors.push(format!("{server}: {e}")),
        }
    }
    if errors.is_empty() {
        errors.push("no key server configured".into());
    }
    Err(errors.join("; "))
}

/// Has a key server generate an ECDSA P-256 key named `label` and keep it: its id and
/// SubjectPublicKeyInfo DER.
pub async fn generate_key(cfg: &ClientConfig, label: &str) -> Result<(KeyId, Vec<u8>), String> {
    let request = Frame::GenerateKey {
        id: 1,
        label: label.to_owned(),
    };
    match ask_any(cfg, &request).await? {
        Frame::KeyGenerated { key, spki, .. } if KeyId::of_spki(&spki) == key => Ok((key, spki)),
        _ => Err("the key server's answer is not the key it generated".into()),
    }
}

/// One signature of `message` with key `key` under `scheme`.
pub async fn sign(
    cfg: &ClientConfig,
    key: KeyId,
    scheme: SignScheme,
    message: Vec<u8>,
) -> Result<Vec<u8>, String> {
    let request = Frame::Request {
        id: 1,
        scheme,
        key,
        message,
    };
    match ask_any(cfg, &request).await? {
        Frame::Response { signature, .. } => Ok(signature),
        _ => Err("the key server's answer is not a signature".into()),
    }
}
