//! The response body type and its constructors (the wrapper that counts bytes and logs the
//! request is `session::logged`, a layer above).

use std::pin::Pin;

use bytes::Bytes;
use http_body::Body as HttpBody;
use http_body_util::{BodyExt, Empty, Full};

/// Errors a body can yield.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Every response body qweb produces. Bodies live on their worker, so they need not be
/// `Send` (an upstream body holds the worker's connection pool).
pub(crate) type Body = Pin<Box<dyn HttpBody<Data = Bytes, Error = BoxError>>>;

/// Boxes a body.
pub(crate) fn boxed<B>(b: B) -> Body
where
    B: HttpBody<Data = Bytes, Error = BoxError> + 'static,
{
    Box::pin(b)
}

/// A body of known bytes.
pub(crate) fn full(b: impl Into<Bytes>) -> Body {
    boxed(Full::new(b.into()).map_err(|never| match never {}))
}

/// An empty body.
pub(crate) fn empty() -> Body {
    boxed(Empty::new().map_err(|never| match never {}))
}
