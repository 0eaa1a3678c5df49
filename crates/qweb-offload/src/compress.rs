//! Compression ops: one chunk of a response body, compressed by an engine.
//!
//! The op is plain data (codec, level, the chunk, the input that precedes it, whether it is the
//! last chunk). Software engines run it with [`CompressOp::software`], a function supplied by
//! the crate that knows the codecs (`qweb-compress`), so that this crate needs no codec
//! library; a hardware engine would read the plain fields instead.

use std::sync::Arc;

/// A content coding an engine can produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Codec {
    /// gzip (RFC 1952): deflate with a CRC-32 trailer.
    Gzip,
    /// Brotli (RFC 7932).
    Brotli,
    /// Zstandard (RFC 8878).
    Zstd,
}

impl Codec {
    /// Every codec.
    pub const ALL: [Codec; 3] = [Codec::Gzip, Codec::Brotli, Codec::Zstd];

    /// The HTTP content-coding token (`gzip`, `br`, `zstd`).
    pub fn token(self) -> &'static str {
        match self {
            Codec::Gzip => "gzip",
            Codec::Brotli => "br",
            Codec::Zstd => "zstd",
        }
    }

    /// A small index (0, 1, 2) for per-codec arrays.
    pub fn index(self) -> usize {
        match self {
            Codec::Gzip => 0,
            Codec::Brotli => 1,
            Codec::Zstd => 2,
        }
    }
}

/// A codec's per-stream state (see [`CompressOp::stream`]): opaque here.
pub type StreamState = Arc<dyn std::any::Any + Send + Sync>;

/// Compresses one chunk in software on the calling thread; an error is a message.
pub type CompressFn = fn(&CompressOp) -> Result<CompressedChunk, String>;

/// Compress one chunk of a stream.
#[derive(Debug, Clone)]
pub struct CompressOp {
    /// The codec.
    pub codec: Codec,
    /// The codec's level.
    pub level: u32,
    /// log2 of the window the whole stream declares (brotli); others ignore it.
    pub window_log: u8,
    /// The chunk.
    pub input: Arc<Vec<u8>>,
    /// Input that precedes the chunk in the stream (its tail), used to prime the compressor
    /// where the format allows back-references across chunks; may be empty.
    pub history: Arc<Vec<u8>>,
    /// The last chunk of the stream (finish it) rather than one to be continued (flush it).
    pub last: bool,
    /// State the codec carries from one chunk of this stream to the next (zstd: the
    /// response's compression context, so that its chunks are the flushed blocks of ONE
    /// frame), owned by the crate that knows the codec; `None` where chunks are independent.
    /// Chunks with a state must be compressed in order, one at a time: [`CompressOp::seq`]
    /// says which one this is.
    pub stream: Option<StreamState>,
    /// This chunk's place in its stream (0 for the first).
    pub seq: u64,
    /// The software implementation.
    pub software: CompressFn,
}

/// A compressed chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompressedChunk {
    /// The chunk's compressed bytes (for gzip: raw deflate, without header or trailer).
    pub data: Vec<u8>,
    /// CRC-32 of the chunk's input (gzip's trailer needs it; 0 for other codecs).
    pub crc32: u32,
}
