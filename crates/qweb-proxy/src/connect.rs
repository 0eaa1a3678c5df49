//! WebSocket over HTTP/2 (RFC 8441): a client's extended CONNECT (`:protocol = websocket`,
//! allowed because the server advertises SETTINGS_ENABLE_CONNECT_PROTOCOL) becomes an
//! HTTP/1.1 upgrade to the upstream (`GET` with `Upgrade`, a fresh `Sec-WebSocket-Key`), and
//! the upstream's 101 a 200 on the client's stream; then the bytes are copied as for any
//! upgrade ([`super::upgrade`]). A protocol the route does not allow, or an HTTP/2 upstream,
//! is refused (501); a plain CONNECT never gets here (405 in the request rules).

use std::hash::{BuildHasher, Hasher};
use std::rc::Rc;

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode, Version};
use qweb_http::request_body::RequestBody;

use super::{ClientInfo, Proxy, SendBody, Target};
use qweb_http::body::Body;
use qweb_http::response;

impl Proxy {
    /// An extended CONNECT from an HTTP/2 client.
    pub(super) async fn extended_connect(
        self: &Rc<Self>,
        mut req: Request<RequestBody>,
        target: &Target<'_>,
        client: &ClientInfo,
        order: &[usize],
    ) -> Response<Body> {
        let protocol = req
            .extensions()
            .get::<hyper::ext::Protocol>()
            .map(|p| p.as_str().to_ascii_lowercase());
        let Some(protocol) = protocol else {
            return response::status(StatusCode::METHOD_NOT_ALLOWED);
        };
        let Ok(token) = HeaderValue::from_str(&protocol) else {
            return response::status(StatusCode::BAD_REQUEST);
        };
        let h1_first = order.first().is_some_and(|&i| !self.cfg.upstreams[i].h2);
        if protocol != "websocket"
            || !super::upgrade::allowed(&token, &self.cfg.upgrade)
            || !h1_first
        {
            tracing::debug!(%protocol, "extended CONNECT refused");
            return response::status(StatusCode::NOT_IMPLEMENTED);
        }
        let down = super::upgrade::ClientStream::of(&mut req, &client.conn);
        let (mut parts, _tunnel_body) = req.into_parts();
        parts.method = Method::GET;
        parts.version = Version::HTTP_11;
        parts.extensions = http::Extensions::new();
        let h = &mut parts.headers;
        h.remove("sec-websocket-key");
        h.insert("sec-websocket-key", websocket_key());
        if !h.contains_key("sec-websocket-version") {
            h.insert("sec-websocket-version", HeaderValue::from_static("13"));
        }
        h.remove(header::CONTENT_LENGTH);
        let req = Request::from_parts(parts, SendBody::Whole(bytes::Bytes::new()));
        self.upgrade(req, token, target, client, order, Some(down))
            .await
    }
}

/// A fresh `Sec-WebSocket-Key`: 16 unpredictable bytes, base64.
fn websocket_key() -> HeaderValue {
    let mut raw = [0u8; 16];
    for (i, half) in raw.chunks_mut(8).enumerate() {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_usize(i);
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        half.copy_from_slice(&h.finish().to_le_bytes());
    }
    HeaderValue::from_str(&qweb_http::base64(&raw))
        .unwrap_or(HeaderValue::from_static("dGhlIHNhbXBsZSBub25jZQ=="))
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_of_a_websocket_key() {
        assert_eq!(
            qweb_http::base64(b"the sample nonce"),
            "dGhlIHNhbXBsZSBub25jZQ=="
        );
        assert_eq!(super::websocket_key().len(), 24);
        assert_ne!(super::websocket_key(), super::websocket_key());
    }
}
