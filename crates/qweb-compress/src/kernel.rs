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
//! - **zstd**: one complete frame per chunk (with content size and checksum). RFC 8878
//!   (section 3.1) defines zstd-coded data as one or more frames whose decoded contents are
//!   concatenated, so the frames are one valid `zstd` content coding. A frame cannot refer to
//!   the data of the previous frame without a dictionary the decoder would not have, so zstd
//!   chunks are not primed; and the public libzstd API has no way to produce the blocks of one
//!   frame in independent pieces (its own multi-threaded mode does that internally).

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
        ZSTD.with(|c| c.replace(None));
        Err(CompressError::Panicked(op.codec))
    })
}

thread_local! {
    /// One deflate state per thread and level, reset between chunks (a fresh one costs
    /// ~300 KiB of allocation).
    static DEFLATE: RefCell<Option<(u32, flate2::Compress)>> = const { RefCell::new(None) };
    /// One zstd context per thread.
    static ZSTD: RefCell<Option<(u32, zstd::bulk::Compressor<'static>)>> =
        const { RefCell::new(None) };
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

fn zstd_chunk(op: &CompressOp) -> Result<CompressedChunk, CompressError> {
    let level = op.level.min(22);
    ZSTD.with(|cell| {
        let mut cell = cell.borrow_mut();
        if !matches!(&*cell, Some((l, _)) if *l == level) {
            let mut c = zstd::bulk::Compressor::new(level as i32).map_err(CompressError::Zstd)?;
            c.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))
                .map_err(CompressError::Zstd)?;
            *cell = Some((level, c));
        }
        let Some((_, c)) = &mut *cell else {
            return Err(CompressError::StateMissing(Codec::Zstd));
        };
        let data = c
            .compress(op.input.as_slice())
            .map_err(CompressError::Zstd)?;
        Ok(CompressedChunk { data, crc32: 0 })
    })
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
        for codec in [Codec::Gzip, Codec::Zstd, Codec::Brotli] {
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
