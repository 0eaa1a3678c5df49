//! Cutting one body into chunk ops and joining their outputs into one stream.
//!
//! [`StreamEncoder`] is the synchronous core of the pipelined encoder: [`StreamEncoder::op`]
//! turns the next chunk of input into a [`CompressOp`] (primed with the input that precedes
//! it), and [`StreamEncoder::join`] turns each op's output, *in order*, into the bytes that
//! go on the wire: the codec's stream header before the first chunk, its trailer after the
//! last. See [`crate::kernel`] for how each codec's chunks form one stream.

use std::sync::Arc;

use bytes::Bytes;
use qweb_offload::compress::{Codec, CompressOp, CompressedChunk, StreamState};

use crate::kernel::{
    compress_chunk, compress_chunk_software, CompressError, ZstdStream, GZIP_HISTORY,
};

/// Preceding input a brotli chunk is primed with.
pub const BROTLI_HISTORY: usize = 64 * 1024;

/// The gzip member header: magic, deflate, no flags, no mtime, no extra flags, OS unknown.
const GZIP_HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];

/// Cuts a body into chunk ops and joins their outputs into one stream of `codec`.
#[derive(Debug)]
pub struct StreamEncoder {
    codec: Codec,
    level: u32,
    window_log: u8,
    /// The tail of the input handed out so far (what the next chunk is primed with).
    history: Arc<Vec<u8>>,
    history_max: usize,
    started: bool,
    finished: bool,
    crc: crc32fast::Hasher,
    /// zstd: the response's context (made at the first op); other codecs: `None`.
    zstd: Option<Arc<ZstdStream>>,
    /// The input length, when known (zstd pledges it).
    size: Option<u64>,
    /// Ops made so far.
    seq: u64,
}

/// The brotli window (log2) for chunks of `chunk_size` primed with [`BROTLI_HISTORY`] bytes:
/// large enough for both, between 18 and 24.
pub fn brotli_window_log(chunk_size: usize) -> u8 {
    let need = chunk_size + BROTLI_HISTORY + 16;
    let mut log = 18u8;
    while log < 24 && (1usize << log) < need {
        log += 1;
    }
    log
}

impl StreamEncoder {
    /// An encoder for chunks of at most `chunk_size` bytes.
    pub fn new(codec: Codec, level: u32, chunk_size: usize) -> Self {
        StreamEncoder {
            codec,
            level,
            window_log: brotli_window_log(chunk_size),
            history: Arc::new(Vec::new()),
            history_max: match codec {
                Codec::Gzip => GZIP_HISTORY,
                Codec::Brotli => BROTLI_HISTORY,
                Codec::Zstd => 0,
            },
            started: false,
            finished: false,
            crc: crc32fast::Hasher::new(),
            zstd: None,
            size: None,
            seq: 0,
        }
    }

    /// The same for an input of exactly `size` bytes, when known (zstd writes it in its
    /// frame header and sizes its context to it); call before the first [`StreamEncoder::op`].
    pub fn with_size(mut self, size: Option<u64>) -> Self {
        self.size = size;
        self
    }

    /// Must the chunks be compressed one at a time, in order? (zstd: they share the
    /// response's context; see [`crate::kernel`].)
    pub fn sequential(&self) -> bool {
        self.codec == Codec::Zstd
    }

    /// The codec.
    pub fn codec(&self) -> Codec {
        self.codec
    }

    /// The op that compresses the next chunk, `input` (`last`: no chunk follows). Chunks must
    /// be joined in the order their ops were made.
    pub fn op(&mut self, input: Vec<u8>, last: bool) -> CompressOp {
        let history = self.history.clone();
        if self.history_max > 0 && !last {
            let max = self.history_max;
            let next = if input.len() >= max {
                input[input.len() - max..].to_vec()
            } else {
                let keep = (max - input.len()).min(history.len());
                let mut v = Vec::with_capacity(keep + input.len());
                v.extend_from_slice(&history[history.len() - keep..]);
                v.extend_from_slice(&input);
                v
            };
            self.history = Arc::new(next);
        }
        if self.codec == Codec::Zstd && self.zstd.is_none() {
            // a context that cannot be made (out of memory) leaves the ops without one:
            // they fail, and so does their fallback, which ends the body with an error
            self.zstd = ZstdStream::new(self.level, self.size).ok().map(Arc::new);
        }
        let seq = self.seq;
        self.seq += 1;
        CompressOp {
            codec: self.codec,
            level: self.level,
            window_log: self.window_log,
            input: Arc::new(input),
            history,
            last,
            stream: self.zstd.clone().map(|z| -> StreamState { z }),
            seq,
            software: compress_chunk_software,
        }
    }

    /// The wire bytes for the next chunk's output (`input_len`: the size of its input;
    /// `last`: as given to [`StreamEncoder::op`]).
    pub fn join(&mut self, out: CompressedChunk, input_len: usize, last: bool) -> Bytes {
        let first = !self.started;
        self.started = true;
        if last {
            self.finished = true;
        }
        match self.codec {
            Codec::Zstd => Bytes::from(out.data),
            Codec::Gzip => {
                self.crc.combine(&crc32fast::Hasher::new_with_initial_len(
                    out.crc32,
                    input_len as u64,
                ));
                if !first && !last {
                    return Bytes::from(out.data);
                }
                let mut v = Vec::with_capacity(out.data.len() + 18);
                if first {
                    v.extend_from_slice(&GZIP_HEADER);
                }
                v.extend_from_slice(&out.data);
                if last {
                    v.extend_from_slice(&self.crc.clone().finalize().to_le_bytes());
                    // ISIZE: the input length modulo 2^32
                    v.extend_from_slice(&(self.crc.total_len() as u32).to_le_bytes());
                }
                Bytes::from(v)
            }
            Codec::Brotli => {
                if !first && !last {
                    return Bytes::from(out.data);
                }
                let mut v = Vec::with_capacity(out.data.len() + 3);
                if first {
                    v.extend_from_slice(&brotli_header(self.window_log));
                }
                v.extend_from_slice(&out.data);
                if last {
                    // ISLAST = 1, ISLASTEMPTY = 1, padding
                    v.push(0x03);
                }
                Bytes::from(v)
            }
        }
    }

    /// Has the last chunk been joined?
    pub fn is_finished(&self) -> bool {
        self.finished
    }
}

/// A brotli stream header for a window of 2^`window_log` bytes (18..=24), followed by an
/// empty metadata block so that it ends on a byte boundary, where the first bare chunk
/// starts.
fn brotli_header(window_log: u8) -> [u8; 2] {
    // WBITS for 18..=24: `1` then (WBITS - 17) in 3 bits, least significant bit first.
    let wbits = 1u16 | (u16::from(window_log.clamp(18, 24) - 17) << 1);
    // Metadata block: ISLAST = 0, MNIBBLES = 0b11 (metadata), reserved 0, MSKIPBYTES = 0,
    // then zero bits to the byte boundary.
    let meta = 0b11u16 << 1;
    let bits = wbits | (meta << 4);
    [bits as u8, (bits >> 8) as u8]
}

/// Compresses `data` in one go, on this thread, the way the pipelined encoder does (chunks
/// of `chunk_size`, joined into one stream). For tests, tools and cache fills.
pub fn compress_all(
    codec: Codec,
    level: u32,
    chunk_size: usize,
    data: &[u8],
) -> Result<Vec<u8>, CompressError> {
    let chunk_size = chunk_size.max(1);
    let mut enc = StreamEncoder::new(codec, level, chunk_size).with_size(Some(data.len() as u64));
    let mut out = Vec::new();
    let mut chunks = data.chunks(chunk_size).peekable();
    if chunks.peek().is_none() {
        let op = enc.op(Vec::new(), true);
        out.extend_from_slice(&enc.join(compress_chunk(&op)?, 0, true));
        return Ok(out);
    }
    while let Some(c) = chunks.next() {
        let last = chunks.peek().is_none();
        let op = enc.op(c.to_vec(), last);
        out.extend_from_slice(&enc.join(compress_chunk(&op)?, c.len(), last));
    }
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::Read;

    /// A text corpus: varied English-like lines (compressible, not trivially).
    pub(crate) fn text(n: usize) -> Vec<u8> {
        let words = [
            "the",
            "quick",
            "brown",
            "fox",
            "jumps",
            "over",
            "lazy",
            "dog",
            "server",
            "event",
            "loop",
            "offload",
            "engine",
            "chunk",
            "stream",
            "compress",
            "pipeline",
            "worker",
            "<div class=\"item\">",
            "</div>",
            "<p>",
            "</p>",
            "request",
            "response",
            "header",
        ];
        let mut out = Vec::with_capacity(n + 64);
        let mut x: u64 = 0x9e3779b97f4a7c15;
        let mut line = 0u64;
        while out.len() < n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            out.extend_from_slice(words[(x % words.len() as u64) as usize].as_bytes());
            out.push(match x % 11 {
                0 => b'\n',
                _ => b' ',
            });
            if x % 97 < 1 {
                line += 1;
                out.extend_from_slice(format!("line {line}\n").as_bytes());
            }
        }
        out.truncate(n);
        out
    }

    /// Pseudo-random bytes (incompressible).
    pub(crate) fn random(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 32) as u8
            })
            .collect()
    }

    /// Decodes with each codec's independent reference decoder.
    pub(crate) fn decode(codec: Codec, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        match codec {
            Codec::Gzip => {
                let mut d = flate2::read::GzDecoder::new(data);
                d.read_to_end(&mut out).expect("gzip decode");
                // exactly one member, nothing after it
                assert!(
                    d.into_inner().is_empty(),
                    "trailing bytes after the gzip member"
                );
            }
            Codec::Brotli => {
                brotli::Decompressor::new(data, 4096)
                    .read_to_end(&mut out)
                    .expect("brotli decode");
            }
            Codec::Zstd => {
                zstd::stream::read::Decoder::new(data)
                    .expect("zstd")
                    .read_to_end(&mut out)
                    .expect("zstd decode");
            }
        }
        out
    }

    fn sizes(chunk: usize) -> Vec<usize> {
        vec![
            0,
            1,
            2,
            chunk - 1,
            chunk,
            chunk + 1,
            2 * chunk + 3,
            7 * chunk + 5,
        ]
    }

    #[test]
    fn every_codec_round_trips_text_and_random_at_chunk_boundaries() {
        let chunk = 4096;
        for codec in Codec::ALL {
            for n in sizes(chunk) {
                for (kind, data) in [("text", text(n)), ("random", random(n, n as u64 + 7))] {
                    let z = compress_all(codec, 5, chunk, &data).unwrap();
                    assert!(
                        decode(codec, &z) == data,
                        "{codec:?} {kind} {n} bytes did not round-trip"
                    );
                }
            }
        }
    }

    #[test]
    fn every_level_round_trips() {
        let data = text(50_000);
        for (codec, levels) in [
            (Codec::Gzip, 0..=9),
            (Codec::Brotli, 0..=11),
            (Codec::Zstd, 1..=19),
        ] {
            for level in levels {
                let z = compress_all(codec, level, 16 * 1024, &data).unwrap();
                assert!(decode(codec, &z) == data, "{codec:?} level {level}");
            }
        }
    }

    #[test]
    fn pipelined_gzip_is_within_one_percent_of_single_stream_gzip() {
        use std::io::Write;
        let data = text(2 * 1024 * 1024);
        for level in [1, 6, 9] {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(level));
            e.write_all(&data).unwrap();
            let single = e.finish().unwrap().len();
            let piped = compress_all(Codec::Gzip, level, 64 * 1024, &data).unwrap();
            assert_eq!(decode(Codec::Gzip, &piped), data);
            let ratio = piped.len() as f64 / single as f64;
            assert!(
                ratio <= 1.01,
                "level {level}: pipelined {} vs single {single} ({ratio:.4})",
                piped.len()
            );
        }
    }

    #[test]
    fn priming_makes_a_difference() {
        // Without the dictionary, each 4 KiB chunk starts from scratch: much larger output.
        // (Guards against a history that is silently never passed.)
        let data = text(256 * 1024);
        let primed = compress_all(Codec::Gzip, 6, 4096, &data).unwrap().len();
        let mut unprimed = 0;
        for c in data.chunks(4096) {
            let op = CompressOp {
                codec: Codec::Gzip,
                level: 6,
                window_log: 18,
                input: Arc::new(c.to_vec()),
                history: Arc::new(Vec::new()),
                last: false,
                stream: None,
                seq: 0,
                software: compress_chunk_software,
            };
            unprimed += compress_chunk(&op).unwrap().data.len();
        }
        assert!(
            primed * 100 < unprimed * 90,
            "primed {primed}, unprimed {unprimed}"
        );
    }

    #[test]
    fn brotli_header_decodes_for_every_window() {
        for chunk in [1024, 64 * 1024, 1 << 20, 4 << 20] {
            let data = text(3 * chunk / 2);
            let z = compress_all(Codec::Brotli, 4, chunk, &data).unwrap();
            assert_eq!(decode(Codec::Brotli, &z), data, "chunk {chunk}");
        }
    }

    /// A zstd body is ONE frame whatever its number of chunks (decoders such as python's
    /// `zstandard` decompressobj, used by httpx, read only the first frame), with its content
    /// size when known, and a window within the cap.
    #[test]
    fn zstd_is_one_frame() {
        let data = text(300_000);
        let z = compress_all(Codec::Zstd, 3, 4096, &data).unwrap();
        let first = zstd::zstd_safe::find_frame_compressed_size(&z).unwrap();
        assert_eq!(first, z.len(), "one frame");
        assert_eq!(
            zstd::zstd_safe::get_frame_content_size(&z).unwrap(),
            Some(data.len() as u64)
        );
        assert_eq!(zstd::bulk::decompress(&z, data.len()).unwrap(), data);
        // the window declared is at most the cap
        let mut d = zstd::zstd_safe::DCtx::create();
        d.set_parameter(zstd::zstd_safe::DParameter::WindowLogMax(
            crate::kernel::ZSTD_WINDOW_LOG_MAX,
        ))
        .unwrap();
        let mut out = Vec::with_capacity(data.len());
        d.decompress(&mut out, &z).unwrap();
        assert_eq!(out, data);
    }

    /// Flushed chunks (a streamed response) decode as far as they go before the frame ends,
    /// and a level 19 context stays within the window cap (memory bounded per response).
    #[test]
    fn zstd_flushed_chunks_decode_before_the_end() {
        let data = text(200_000);
        for level in [1, 3, 9, 19] {
            let mut enc = StreamEncoder::new(Codec::Zstd, level, 1000);
            let mut wire = Vec::new();
            for (i, c) in data.chunks(10_000).enumerate() {
                let op = enc.op(c.to_vec(), false);
                wire.extend_from_slice(&enc.join(compress_chunk(&op).unwrap(), c.len(), false));
                // all of it so far decodes, though the frame is not finished
                let mut got = Vec::new();
                let mut d = zstd::stream::read::Decoder::new(&wire[..]).unwrap();
                let _ = d.read_to_end(&mut got);
                assert_eq!(got, &data[..(i + 1) * 10_000], "level {level} chunk {i}");
            }
            let mem = enc.zstd.as_ref().map(|z| z.memory()).unwrap();
            eprintln!("zstd level {level}: context {mem} bytes");
            assert!(mem < 12 << 20, "level {level}: context {mem} bytes");
            let op = enc.op(Vec::new(), true);
            wire.extend_from_slice(&enc.join(compress_chunk(&op).unwrap(), 0, true));
            assert_eq!(
                zstd::zstd_safe::find_frame_compressed_size(&wire).unwrap(),
                wire.len()
            );
            assert_eq!(decode(Codec::Zstd, &wire), data);
        }
    }

    /// A chunk compressed twice (on the engine, then by the fallback after a timeout) gives
    /// the same bytes once; a chunk out of order is refused, never compressed into the frame.
    #[test]
    fn zstd_chunk_twice_is_the_same_chunk_and_out_of_order_is_refused() {
        let data = text(30_000);
        let mut enc = StreamEncoder::new(Codec::Zstd, 3, 10_000);
        let a = enc.op(data[..10_000].to_vec(), false);
        let b = enc.op(data[10_000..20_000].to_vec(), false);
        let c = enc.op(data[20_000..].to_vec(), true);
        assert!(compress_chunk(&b).is_err(), "b before a");
        let a1 = compress_chunk(&a).unwrap();
        assert_eq!(compress_chunk(&a).unwrap(), a1);
        let b1 = compress_chunk(&b).unwrap();
        let c1 = compress_chunk(&c).unwrap();
        assert!(compress_chunk(&a).is_err(), "a after b");
        let wire = [a1.data, b1.data, c1.data].concat();
        assert_eq!(decode(Codec::Zstd, &wire), data);
    }
}
