//! Header blocks: a request's head decoded and checked (RFC 9113 sections 8.2 and 8.3), a
//! response's fields without the connection-specific ones, and frame padding.

use std::io::Cursor;
use std::ops::ControlFlow;

use bytes::{Buf, BytesMut};
use h2::hpack;
use h2::Reason;
use http::header::{self, HeaderMap};
use http::{Method, Request};

use super::error::{conn_err, ConnError};
use super::frame::{flag, Head};

/// Removes a padded frame's padding (and its length byte).
pub(crate) fn strip_padding(head: Head, payload: &mut BytesMut) -> Result<(), ConnError> {
    if !head.has(flag::PADDED) {
        return Ok(());
    }
    let Some(&pad) = payload.first() else {
        return Err(conn_err(
            Reason::PROTOCOL_ERROR,
            "padded frame without its pad length",
        ));
    };
    let pad = usize::from(pad);
    if pad >= payload.len() {
        return Err(conn_err(
            Reason::PROTOCOL_ERROR,
            "padding as long as the frame",
        ));
    }
    payload.advance(1);
    payload.truncate(payload.len() - pad);
    Ok(())
}

/// The pseudo-header fields of a request.
#[derive(Default)]
pub(crate) struct Pseudo {
    method: Option<Method>,
    scheme: Option<hpack::BytesStr>,
    authority: Option<hpack::BytesStr>,
    path: Option<hpack::BytesStr>,
    protocol: Option<h2::ext::Protocol>,
    status: bool,
}

impl Pseudo {
    pub(crate) fn any(&self) -> bool {
        self.method.is_some()
            || self.scheme.is_some()
            || self.authority.is_some()
            || self.path.is_some()
            || self.protocol.is_some()
            || self.status
    }
}

pub(crate) struct Decoded {
    pub(crate) pseudo: Pseudo,
    pub(crate) fields: HeaderMap,
    /// Broke a rule of RFC 9113 section 8.2 or 8.3 (a stream error).
    pub(crate) malformed: bool,
}

/// Decodes a whole header block. The block is always decoded to its end (the HPACK table is
/// the connection's); a header list over four times `limit` ends the connection.
pub(crate) fn decode_block(
    decoder: &mut hpack::Decoder,
    buf: &mut BytesMut,
    limit: usize,
) -> Result<Decoded, ConnError> {
    let mut d = Decoded {
        pseudo: Pseudo::default(),
        fields: HeaderMap::new(),
        malformed: false,
    };
    let mut size = 0usize;
    let mut regular = false;
    let mut too_large = false;
    let abuse = limit.saturating_mul(4);
    let mut cursor = Cursor::new(buf);
    let r = decoder.decode(&mut cursor, |h| {
        use hpack::Header::*;
        size += h.len();
        if size > abuse {
            too_large = true;
            return ControlFlow::Break(());
        }
        let p = &mut d.pseudo;
        let dup = match h {
            Field { name, value } => {
                regular = true;
                if crate::fields::is_connection_specific(&name)
                    && !(name == header::TE && value == "trailers")
                {
                    d.malformed = true;
                } else if d.fields.try_append(name, value).is_err() {
                    too_large = true;
                    return ControlFlow::Break(());
                }
                false
            }
            _ if regular => {
                d.malformed = true;
                false
            }
            Method(m) => p.method.replace(m).is_some(),
            Scheme(v) => p.scheme.replace(v).is_some(),
            Authority(v) => p.authority.replace(v).is_some(),
            Path(v) => p.path.replace(v).is_some(),
            Protocol(v) => p.protocol.replace(v).is_some(),
            Status(_) => std::mem::replace(&mut p.status, true),
        };
        if dup {
            d.malformed = true;
        }
        ControlFlow::Continue(())
    });
    if too_large {
        return Err(conn_err(Reason::ENHANCE_YOUR_CALM, "header list too large"));
    }
    if r.is_err() {
        return Err(conn_err(Reason::COMPRESSION_ERROR, "invalid HPACK block"));
    }
    Ok(d)
}

/// The request of a decoded header block (RFC 9113 section 8.3.1); `None`: malformed.
pub(crate) fn request(d: Decoded, connect_protocol: bool) -> Option<Request<()>> {
    use http::uri;
    let p = d.pseudo;
    let method = p.method?;
    if p.status {
        return None;
    }
    let connect = method == Method::CONNECT;
    let extended = p.protocol.is_some();
    if extended && (!connect || !connect_protocol) {
        return None;
    }
    let mut parts = uri::Parts::default();
    if let Some(a) = p.authority {
        parts.authority = Some(uri::Authority::from_maybe_shared(a.into_inner()).ok()?);
    }
    if connect && !extended {
        // CONNECT: only the authority (RFC 9113 section 8.5)
        if p.scheme.is_some() || p.path.is_some() || parts.authority.is_none() {
            return None;
        }
    } else {
        let scheme: uri::Scheme = p.scheme?.as_str().parse().ok()?;
        let path = p.path?;
        if path.is_empty() {
            return None;
        }
        if parts.authority.is_some() {
            parts.scheme = Some(scheme);
        }
        parts.path_and_query = Some(uri::PathAndQuery::from_maybe_shared(path.into_inner()).ok()?);
    }
    let uri = uri::Uri::from_parts(parts).ok()?;
    let mut req = Request::new(());
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    *req.version_mut() = http::Version::HTTP_2;
    *req.headers_mut() = d.fields;
    if let Some(proto) = p.protocol {
        req.extensions_mut()
            .insert(hyper::ext::Protocol::from(proto.as_str()));
    }
    Some(req)
}
