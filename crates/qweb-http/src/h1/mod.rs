//! HTTP/1.1 on the wire, without I/O (RFC 9112): request heads parsed in one pass over the
//! connection's read buffer ([`parse`]), request bodies decoded from it ([`decode`]),
//! response heads and body framing encoded ([`encode`]), and a response body framed into a
//! queue of vectored writes ([`mod@write`]). The connection driver (`conn/h1/` in qweb-server)
//! owns the socket and the buffers; this layer only reads and writes bytes, so each rule is
//! written once and tested without a socket.
//!
//! Where RFC 9112 leaves a choice, the stricter reading is taken: bare CR is refused
//! everywhere, chunked framing needs CRLF (a bare LF in a chunk line is refused, as the
//! "funky chunks" smuggling research recommends), `Content-Length` is digits only, and a
//! request whose framing two hops could read differently (`Transfer-Encoding` with
//! `Content-Length`, or a coding list that does not end in `chunked`) is never kept alive.

pub mod decode;
pub mod encode;
#[doc(hidden)]
pub mod fuzzing;
#[cfg(test)]
mod h11_diff;
pub mod parse;
pub mod write;
