//! The software chunk compressors: what an engine runs for one [`CompressOp`].
//!
//! Each function compresses one chunk into a piece that `StreamEncoder::join` (in the `stream` module) joins with
//! the others into ONE valid stream of the codec:
//!
//! - **gzip**: raw deflate, primed with the last 32 KiB of the preceding input
//!   (`deflateSetDictionary`, the pigz method), ended with a sync flush (byte-aligned, not
//!   final) or, for the last chunk, finished (final block). Concatenated, the pieces are one
//!   deflate stream; the chunk's CRC-32 is returned so that the framer combines them into the
//!   trailer's.
//! - **br**: a *bare catable* brotli stream (`catable` + `bare_stream` in the `brotli` crate,
//!   the mechanism of its own multi-threaded compressor): no stream header, no final empty
//!   metablock, byte-aligned at the end, no reference to the static dictionary, no use of
//!   distance-cache values from before the chunk, and the first two bytes stored uncompressed
//!   so that literal context modelling does not depend on bytes the chunk did not see. It is
//!   primed with the preceding input as a custom dictionary, whose bytes the decoder of the
//!   joined stream has in its window. The framer prepends the window-size header and appends
//!   the final empty metablock. Qualities 0 and 1 are raised to 2 (see [`brotli_quality`]).
//! - **zstd**: ONE frame per response. zstd blocks are not independent: a compressed block
//!   may reuse the previous block's entropy tables and refers to its last three offsets
//!   ("repeat offsets", RFC 8878 section 3.1.1.5), so blocks compressed by separate contexts
//!   cannot be joined into one frame (libzstd's own multi-threaded mode does it by
//!   invalidating repeat offsets, an internal function the public API does not offer). The
//!   response therefore owns one streaming context ([`ZstdStream`], carried by the ops in
//!   [`CompressOp::stream`]): each chunk is compressed on the engine with that context and
//!   flushed (`ZSTD_e_flush`: its blocks end, the decoder can output everything so far), the
//!   last one ends the frame (with its checksum). A response's zstd chunks go to the engine
//!   one at a time, in order (chunks of different responses still run in parallel); each
//!   chunk sees the whole window of what preceded it. Frames of several concatenated zstd
//!   frames are valid RFC 8878 data, but common decoders (python's `zstandard` decompressobj,
//!   which httpx uses) stop after the first frame.
//!
//!   The window is capped at 2^[`ZSTD_WINDOW_LOG_MAX`] bytes (RFC 9659 allows up to 8 MiB for
//!   the `zstd` content coding; a smaller window bounds the memory a slow client holds on
//!   the server, and on the client); a body of known length pledges it, so that libzstd sizes
//!   its tables to the body.

use std::cell::RefCell;

use qweb_offload::compress::{Codec, CompressOp, CompressedChunk};

/// Why one chunk could not be compressed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CompressError {
    /// The codec panicked on this chunk (caught: the thread lives on, with its per-thread
    /// codec state reset).
    #[error("the {} compressor panicked", .0.token())]
    Panicked(Codec),
    /// zlib-rs refused the dictionary or the input.
    #[error("deflate: {0}")]
    Deflate(#[source] flate2::CompressError),
    /// The brotli encoder refused its parameters, or failed on the input.
    #[error("brotli: {0}")]
    Brotli(&'static str),
    /// libzstd refused the level or a parameter, or failed on the input.
    #[error("zstd: {0}")]
    Zstd(#[source] std::io::Error),
    /// This thread's codec state was not there after being set (a bug).
    #[error("{} state missing", .0.token())]
    StateMissing(Codec),
}

/// [`compress_chunk`] in the shape of [`qweb_offload::compress::CompressFn`]: engines
/// report the error as text.
pub fn compress_chunk_software(op: &CompressOp) -> Result<CompressedChunk, String> {
    compress_chunk(op).map_err(|e| e.to_string())
}

/// Most preceding input a gzip chunk is primed with: deflate's window.
pub const GZIP_HISTORY: usize = 32 * 1024;

/// Compresses one chunk in software (through [`compress_chunk_software`], the
/// [`qweb_offload::compress::CompressFn`] of every op this crate builds).
///
/// A panic inside a codec library is caught and reported as an error: it must not take an
/// engine thread (or a worker) down with it.
pub fn compress_chunk(op: &CompressOp) -> Result<CompressedChunk, CompressError> {
    let run = std::panic::AssertUnwindSafe(|| match op.codec {
        Codec::Gzip => gzip_chunk(op),
        Codec::Brotli => brotli_chunk(op),
        Codec::Zstd => zstd_chunk(op),
    });
    std::panic::catch_unwind(run).unwrap_or_else(|_| {
        // the per-thread codec state may be half-updated: start afresh next time
        DEFLATE.with(|c| c.replace(None));
        Err(CompressError::Panicked(op.codec))
    })
}

thread_local! {
    /// One deflate state per thread and level, reset between chunks (a fresh one costs
    /// ~300 KiB of allocation).
    static DEFLATE: RefCell<Option<(u32, flate2::Compress)>> = const { RefCell::new(None) };
}

fn gzip_chunk(op: &CompressOp) -> Result<CompressedChunk, CompressError> {
    use flate2::{Compress, Compression, FlushCompress, Status};
    let level = op.level.min(9);
    let input = op.input.as_slice();
    let crc32 = crc32fast::hash(input);
    DEFLATE.with(|cell| {
        let mut cell = cell.borrow_mut();
        let c = match &mut *cell {
            Some((l, c)) if *l == level => {
                c.reset();
                c
            }
            slot => {
                *slot = Some((level, Compress::new(Compression::new(level), false)));
                match slot {
                    Some((_, c)) => c,
                    None => return Err(CompressError::StateMissing(Codec::Gzip)),
                }
            }
        };
        let h = op.history.as_slice();
        let dict = &h[h.len().saturating_sub(GZIP_HISTORY)..];
        if !dict.is_empty() {
            c.set_dictionary(dict).map_err(CompressError::Deflate)?;
        }
        let flush = if op.last {
            FlushCompress::Finish
        } else {
            FlushCompress::Sync
        };
        let mut out = Vec::with_capacity(input.len() + input.len() / 16 + 64);
        let start = c.total_in();
        loop {
            let consumed = (c.total_in() - start) as usize;
            let status = c
                .compress_vec(&input[consumed..], &mut out, flush)
                .map_err(CompressError::Deflate)?;
            let consumed = (c.total_in() - start) as usize;
            let room = out.len() < out.capacity();
            let done = match flush {
                FlushCompress::Finish => status == Status::StreamEnd,
                _ => consumed == input.len() && room,
            };
            if done {
                break;
            }
            if !room {
                out.reserve(out.capacity() / 2 + 1024);
            }
        }
        Ok(CompressedChunk { data: out, crc32 })
    })
}

fn brotli_chunk(op: &CompressOp) -> Result<CompressedChunk, CompressError> {
    use brotli::enc::encode::BrotliEncoderStateStruct;
    use brotli::enc::encode::{BrotliEncoderOperation, BrotliEncoderParameter as P};
    use brotli::enc::StandardAlloc;
    let input = op.input.as_slice();
    let mut s = BrotliEncoderStateStruct::new(StandardAlloc::default());
    let ok = s.set_parameter(P::BROTLI_PARAM_QUALITY, brotli_quality(op.level))
        && s.set_parameter(P::BROTLI_PARAM_LGWIN, u32::from(op.window_log))
        && s.set_parameter(P::BROTLI_PARAM_CATABLE, 1)
        && s.set_parameter(P::BROTLI_PARAM_BARE_STREAM, 1)
        && s.set_parameter(P::BROTLI_PARAM_MAGIC_NUMBER, 0)
        && s.set_parameter(P::BROTLI_PARAM_SIZE_HINT, input.len() as u32);
    if !ok {
        return Err(CompressError::Brotli("parameters refused"));
    }
    let h = op.history.as_slice();
    // The dictionary and the chunk must fit in the declared window.
    let max_dict = (1usize << op.window_log)
        .saturating_sub(16)
        .saturating_sub(input.len());
    let dict = &h[h.len().saturating_sub(max_dict)..];
    if !dict.is_empty() {
        s.set_custom_dictionary(dict.len(), dict);
    }
    let mut out = vec![0u8; brotli::enc::encode::BrotliEncoderMaxCompressedSize(input.len()) + 64];
    let (mut in_off, mut out_off) = (0usize, 0usize);
    loop {
        let mut avail_in = input.len() - in_off;
        let mut avail_out = out.len() - out_off;
        let ok = s.compress_stream(
            BrotliEncoderOperation::BROTLI_OPERATION_FINISH,
            &mut avail_in,
            input,
            &mut in_off,
            &mut avail_out,
            &mut out,
            &mut out_off,
            &mut None,
            &mut |_, _, _, _| (),
        );
        if !ok {
            return Err(CompressError::Brotli("encoder failed"));
        }
        if s.is_finished() {
            break;
        }
        if avail_out == 0 {
            let more = out.len();
            out.resize(out.len() + more, 0);
        }
    }
    out.truncate(out_off);
    Ok(CompressedChunk {
        data: out,
        crc32: 0,
    })
}

/// Brotli's qualities 0 and 1 use one-pass compressors that do not honour catable streams
/// (their output of a primed chunk does not decode as part of the joined stream): they are
/// raised to 2.
pub fn brotli_quality(level: u32) -> u32 {
    level.clamp(2, 11)
}

/// Largest zstd window (log2): 512 KiB.
pub const ZSTD_WINDOW_LOG_MAX: u32 = 19;

/// One zstd response's compression context: its chunks are the flushed blocks of one frame.
/// Shared by the response's ops ([`CompressOp::stream`]); the chunks must be compressed in
/// order, one at a time.
pub struct ZstdStream {
    state: std::sync::Mutex<ZstdState>,
}

struct ZstdState {
    /// `None` once the frame ended, or after the context failed (the stream is then broken).
    cctx: Option<zstd::zstd_safe::CCtx<'static>>,
    /// The chunk the context expects next.
    next: u64,
    /// The last chunk's output, kept so that a chunk compressed on the engine and then again
    /// by the worker's fallback (after a timeout) gets the same bytes, not a second copy.
    done: Option<(u64, Vec<u8>)>,
}

impl std::fmt::Debug for ZstdStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ZstdStream")
    }
}

impl ZstdStream {
    /// A context for one frame at `level` (1..=22); `size`: the whole input's length, when
    /// known (written in the frame header; libzstd sizes its tables to it).
    pub fn new(level: u32, size: Option<u64>) -> Result<Self, CompressError> {
        use zstd::zstd_safe::CParameter;
        let err = |code: usize| {
            CompressError::Zstd(std::io::Error::other(zstd::zstd_safe::get_error_name(code)))
        };
        let mut c = zstd::zstd_safe::CCtx::try_create()
            .ok_or_else(|| CompressError::Zstd(std::io::Error::other("out of memory")))?;
        c.set_parameter(CParameter::CompressionLevel(level.clamp(1, 22) as i32))
            .map_err(err)?;
        c.set_parameter(CParameter::ChecksumFlag(true))
            .map_err(err)?;
        // window and tables no larger than the cap (libzstd sizes them to the level alone
        // when the input length is unknown: 86 MB at level 19)
        let (window, chain, hash) = zstd_logs(level);
        c.set_parameter(CParameter::WindowLog(window.min(ZSTD_WINDOW_LOG_MAX)))
            .map_err(err)?;
        c.set_parameter(CParameter::ChainLog(chain.min(ZSTD_WINDOW_LOG_MAX)))
            .map_err(err)?;
        c.set_parameter(CParameter::HashLog(hash.min(ZSTD_WINDOW_LOG_MAX)))
            .map_err(err)?;
        c.set_pledged_src_size(size).map_err(err)?;
        Ok(ZstdStream {
            state: std::sync::Mutex::new(ZstdState {
                cctx: Some(c),
                next: 0,
                done: None,
            }),
        })
    }

    /// Bytes the context holds (its tables, window and buffers).
    pub fn memory(&self) -> usize {
        match self.state.lock() {
            Ok(s) => s.cctx.as_ref().map_or(0, |c| c.sizeof()),
            Err(_) => 0,
        }
    }

    /// Compresses chunk `seq` (`last`: end the frame, else flush it).
    fn chunk(&self, seq: u64, input: &[u8], last: bool) -> Result<Vec<u8>, CompressError> {
        use zstd::zstd_safe::zstd_sys::ZSTD_EndDirective;
        use zstd::zstd_safe::{InBuffer, OutBuffer};
        let broken = |what: &str| CompressError::Zstd(std::io::Error::other(what.to_owned()));
        // a poisoned lock: a panic mid-chunk left the context half-updated
        let mut s = self.state.lock().map_err(|_| broken("context poisoned"))?;
        if let Some((n, out)) = &s.done {
            if *n == seq {
                return Ok(out.clone());
            }
        }
        if s.next != seq {
            return Err(broken("chunk out of order"));
        }
        let Some(c) = s.cctx.as_mut() else {
            return Err(broken("frame already ended"));
        };
        let directive = if last {
            ZSTD_EndDirective::ZSTD_e_end
        } else {
            ZSTD_EndDirective::ZSTD_e_flush
        };
        let mut out: Vec<u8> =
            Vec::with_capacity(zstd::zstd_safe::compress_bound(input.len()) + 32);
        let mut inb = InBuffer::around(input);
        let r = loop {
            if out.capacity() - out.len() < 1024 {
                out.reserve(out.capacity() / 2 + 1024);
            }
            let pos = out.len();
            let mut outb = OutBuffer::around_pos(&mut out, pos);
            match c.compress_stream2(&mut outb, &mut inb, directive) {
                Ok(0) if inb.pos == input.len() => break Ok(()),
                Ok(_) => {}
                Err(code) => break Err(code),
            }
        };
        if let Err(code) = r {
            s.cctx = None;
            return Err(CompressError::Zstd(std::io::Error::other(
                zstd::zstd_safe::get_error_name(code),
            )));
        }
        if last {
            // the frame is complete: free the context now, not when the last op is dropped
            s.cctx = None;
        }
        s.next = seq + 1;
        s.done = Some((seq, out.clone()));
        Ok(out)
    }
}

/// libzstd's window, chain and hash table logs for `level` on inputs over 256 KiB
/// (`clevels.h` of zstd 1.5): [`ZstdStream`] caps them, never raises them.
fn zstd_logs(level: u32) -> (u32, u32, u32) {
    const LOGS: [(u32, u32, u32); 22] = [
        (19, 13, 14),
        (20, 15, 16),
        (21, 16, 17),
        (21, 18, 18),
        (21, 18, 19),
        (21, 18, 19),
        (21, 19, 20),
        (21, 19, 20),
        (22, 20, 21),
        (22, 21, 22),
        (22, 21, 22),
        (22, 22, 23),
        (22, 22, 22),
        (22, 22, 23),
        (22, 23, 23),
        (22, 22, 22),
        (23, 23, 22),
        (23, 23, 22),
        (23, 24, 22),
        (25, 25, 23),
        (26, 27, 25),
        (27, 29, 27),
    ];
    LOGS[(level.clamp(1, 22) - 1) as usize]
}

fn zstd_chunk(op: &CompressOp) -> Result<CompressedChunk, CompressError> {
    let stream = op
        .stream
        .as_ref()
        .and_then(|s| s.downcast_ref::<ZstdStream>())
        .ok_or(CompressError::StateMissing(Codec::Zstd))?;
    let data = stream.chunk(op.seq, op.input.as_slice(), op.last)?;
    Ok(CompressedChunk { data, crc32: 0 })
}

#[cfg(test)]
mod determinism {
    use super::*;
    use crate::StreamEncoder;

    /// The per-thread codec state is reset between chunks: the same op gives the same bytes
    /// whatever ran on this thread before it.
    #[test]
    fn same_op_same_bytes_after_other_ops() {
        let text: Vec<u8> = (0..20_000)
            .flat_map(|i| format!("line {i} of some text\n").into_bytes())
            .collect();
        // (zstd chunks share their response's context: `stream::tests::zstd_*`)
        for codec in [Codec::Gzip, Codec::Brotli] {
            let mut enc = StreamEncoder::new(codec, 4, 4096);
            let ops: Vec<_> = text
                .chunks(4096)
                .take(40)
                .map(|c| enc.op(c.to_vec(), false))
                .collect();
            let first: Vec<_> = ops
                .iter()
                .map(|o| compress_chunk(o).unwrap().data)
                .collect();
            // interleave: other streams' chunks, other levels, in between
            let mut other = StreamEncoder::new(codec, 9, 1000);
            for (i, o) in ops.iter().enumerate().rev() {
                let noise = other.op(text[i * 100..i * 100 + 3000].to_vec(), i % 3 == 0);
                let _ = compress_chunk(&noise).unwrap();
                assert_eq!(
                    compress_chunk(o).unwrap().data,
                    first[i],
                    "{codec:?} chunk {i}"
                );
            }
        }
    }

    /// A codec that panics on a chunk is the `Panicked` variant (not a crash, not a string),
    /// and the thread's next chunk compresses normally. The panic: a brotli window far past
    /// its 24 bits overflows the window-size shift (overflow checks are on in test builds).
    #[cfg(debug_assertions)]
    #[test]
    fn a_panicking_codec_is_the_panicked_variant() {
        let mut enc = StreamEncoder::new(Codec::Brotli, 4, 4096);
        let mut op = enc.op(b"some text".to_vec(), true);
        op.window_log = 200;
        let e = compress_chunk(&op).expect_err("a panic");
        assert!(matches!(e, CompressError::Panicked(Codec::Brotli)), "{e:?}");
        assert_eq!(e.to_string(), "the br compressor panicked");
        // through the engines' text form, and after: the thread still compresses
        assert_eq!(
            compress_chunk_software(&op).err().as_deref(),
            Some("the br compressor panicked")
        );
        op.window_log = 22;
        assert!(compress_chunk(&op).is_ok());
    }
}
