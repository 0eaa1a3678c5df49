//! qweb's HTTP response compression (see DESIGN.md: pipelined offload).
//!
//! - [`negotiate()`]: `Accept-Encoding` with q-values, `identity`, `*` and `q=0`, against a
//!   server preference order.
//! - [`kernel`]: the software chunk compressors (gzip on flate2/zlib-rs, brotli, zstd) that
//!   engines run for a [`CompressOp`]; the module documentation says how each codec's chunks
//!   form ONE valid stream.
//! - [`stream`]: [`StreamEncoder`] cuts a body into chunk ops and joins their outputs, in
//!   order, with the codec's header and trailer.
//! - [`body`]: [`CompressBody`], a response body compressed on an offload engine in `sync`
//!   or `pipelined` mode (the shared [`qweb_offload::Mode`]: `Sync` or `Async`), with
//!   backpressure and time-bound flushing of streamed input.
//! - [`cache`]: [`VariantCache`], the bounded LRU cache of encoded static files.
//! - [`metrics`]: [`CompressMetrics`] for `/metrics`.
//!
//! Nothing here knows about the server's configuration or routes; `qweb-server` decides
//! *whether* a response is compressed, this crate does the compressing.

#![forbid(unsafe_code)]

pub mod body;
pub mod cache;
pub mod kernel;
pub mod metrics;
pub mod negotiate;
pub mod stream;

pub use body::{BoxError, CompressBody, EncodeParams, Sink};
pub use cache::{CacheEvents, Source, VariantCache, VariantKey};
pub use kernel::CompressError;
pub use metrics::CompressMetrics;
pub use negotiate::{negotiate, AcceptEncoding};
pub use qweb_offload::compress::{Codec, CompressOp, CompressedChunk};
pub use stream::{compress_all, StreamEncoder};
