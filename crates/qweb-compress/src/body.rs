//! [`CompressBody`]: a response body compressed chunk by chunk on an offload engine.
//!
//! The identity body is read only as fast as the compressed body is read: input is pulled
//! from the inner body only while fewer than `depth` chunks are in flight, and chunks are
//! submitted only when the consumer polls. A slow client therefore stops the pipeline
//! (hyper polls a body only when it can write), and memory per response stays about
//! `depth` x `chunk_size` (the chunks in flight, their outputs, and one partial chunk).
//!
//! The mode is the shared offload [`Mode`] (see [`qweb_offload::policy`]):
//!
//! - [`Mode::Sync`] (config `sync`): one chunk at a time; the worker submits it straight to
//!   the engine and blocks until it is done (the baseline the paper compares against).
//! - [`Mode::Async`] (config `pipelined`): up to `depth` chunks in flight through the
//!   worker's [`Offloader`] (batched submissions); outputs are joined strictly in order.
//! - [`Mode::InPlace`] (not offered by the config): one chunk at a time, compressed on the
//!   worker without an engine.
//!
//! A chunk whose op fails, times out or finds the engine full is compressed in software on
//! the worker (counted in `fallbacks`): compression's fallback is always
//! [`Fallback::Software`](qweb_offload::Fallback::Software), the kernels being available
//! everywhere. When the inner body pauses with a partial chunk
//! buffered, the partial chunk is compressed and sent after `flush_after` (a streamed
//! upstream response is never held back waiting for a full chunk).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use qweb_offload::compress::{Codec, CompressOp};
use qweb_offload::{run_blocking, Mode, Offloader, Op, OpError, OpOutput, OpResult, Timed};

use crate::kernel::compress_chunk;
use crate::metrics::CompressMetrics;
use crate::stream::StreamEncoder;

/// Errors a body can yield.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How a body is encoded.
#[derive(Debug, Clone)]
pub struct EncodeParams {
    /// The codec.
    pub codec: Codec,
    /// Its level.
    pub level: u32,
    /// How chunks wait ([`Mode::Async`] is the pipelined mode).
    pub mode: Mode,
    /// Input bytes per chunk (the last, and flushed ones, may be shorter).
    pub chunk_size: usize,
    /// Most chunks in flight ([`Mode::Async`]; see [`Mode::in_flight`]).
    pub depth: usize,
    /// Compress and send a partial chunk when the inner body has paused this long
    /// (`None`: wait for a full chunk or the end).
    pub flush_after: Option<Duration>,
}

/// Receives the whole encoded body once it is complete (used to fill the variant cache).
pub type Sink = Box<dyn FnOnce(Bytes)>;

struct Tee {
    buf: Vec<u8>,
    limit: usize,
    done: Sink,
}

enum Wait {
    Engine(Pin<Box<Timed>>),
    Done(OpResult),
}

struct InFlight {
    op: CompressOp,
    wait: Wait,
}

/// A body compressed chunk by chunk (see the module documentation).
pub struct CompressBody<B> {
    inner: Option<Pin<Box<B>>>,
    params: EncodeParams,
    offloader: Rc<Offloader>,
    enc: StreamEncoder,
    pending: VecDeque<Bytes>,
    pending_len: usize,
    in_flight: VecDeque<InFlight>,
    last_submitted: bool,
    finished: bool,
    flush_timer: Option<Pin<Box<tokio::time::Sleep>>>,
    metrics: Arc<CompressMetrics>,
    tee: Option<Tee>,
    /// The inner body's trailers, sent after the last compressed bytes.
    trailers: Option<http::HeaderMap>,
}

impl<B> CompressBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    /// Compresses `inner` on `offloader`'s engine.
    pub fn new(
        inner: B,
        params: EncodeParams,
        offloader: Rc<Offloader>,
        metrics: Arc<CompressMetrics>,
    ) -> Self {
        let params = EncodeParams {
            chunk_size: params.chunk_size.max(1),
            depth: params.depth.max(1),
            ..params
        };
        metrics.responses[params.codec.index()].fetch_add(1, Relaxed);
        let size = inner.size_hint().exact();
        CompressBody {
            inner: Some(Box::pin(inner)),
            enc: StreamEncoder::new(params.codec, params.level, params.chunk_size).with_size(size),
            params,
            offloader,
            pending: VecDeque::new(),
            pending_len: 0,
            in_flight: VecDeque::new(),
            last_submitted: false,
            finished: false,
            flush_timer: None,
            metrics,
            tee: None,
            trailers: None,
        }
    }

    /// Also collects the encoded body, and hands it to `done` when it is complete and at most
    /// `limit` bytes long (a body that errs or is dropped early never reaches `done`).
    pub fn with_sink(mut self, limit: usize, done: Sink) -> Self {
        self.tee = Some(Tee {
            buf: Vec::new(),
            limit,
            done,
        });
        self
    }

    /// Takes up to `n` buffered input bytes as one chunk.
    fn take_chunk(&mut self, n: usize) -> Vec<u8> {
        let n = n.min(self.pending_len);
        let mut v = Vec::with_capacity(n);
        while v.len() < n {
            let Some(front) = self.pending.front_mut() else {
                break;
            };
            let want = n - v.len();
            if front.len() <= want {
                v.extend_from_slice(front);
                self.pending.pop_front();
            } else {
                v.extend_from_slice(&front[..want]);
                front.advance(want);
            }
        }
        self.pending_len -= v.len();
        v
    }

    fn submit(&mut self, input: Vec<u8>, last: bool) {
        if last {
            self.last_submitted = true;
        }
        self.flush_timer = None;
        let op = self.enc.op(input, last);
        self.metrics.chunks.fetch_add(1, Relaxed);
        self.metrics.chunks_in_flight.fetch_add(1, Relaxed);
        let wait = match self.params.mode {
            Mode::Async => {
                // a timeout gives the chunk up and counts it once as timed out
                Wait::Engine(Box::pin(
                    self.offloader.submit_timed(Op::Compress(op.clone())),
                ))
            }
            Mode::Sync => {
                // Straight to the engine (no batching), and block this thread until done.
                Wait::Done(run_blocking(
                    &**self.offloader.engine(),
                    Op::Compress(op.clone()),
                    self.offloader.timeout(),
                ))
            }
            // No engine: compressed right here (a kernel error is then retried once by the
            // software fallback, and reported).
            Mode::InPlace => Wait::Done(
                compress_chunk(&op)
                    .map(OpOutput::Compressed)
                    .map_err(|e| OpError::Failed(e.to_string())),
            ),
        };
        self.in_flight.push_back(InFlight { op, wait });
    }

    /// Reads input and submits chunks while the pipeline has room.
    fn fill(&mut self, cx: &mut Context<'_>) -> Result<(), BoxError> {
        let cap = match self.enc.sequential() {
            // zstd: one context per response, its chunks one after the other
            true => 1,
            false => self.params.mode.in_flight(self.params.depth),
        };
        let chunk = self.params.chunk_size;
        loop {
            if self.last_submitted || self.in_flight.len() >= cap {
                return Ok(());
            }
            let Some(inner) = self.inner.as_mut() else {
                // the input is complete
                if self.pending_len > chunk {
                    let c = self.take_chunk(chunk);
                    self.submit(c, false);
                } else {
                    let c = self.take_chunk(chunk);
                    self.submit(c, true);
                }
                continue;
            };
            if self.pending_len >= chunk {
                let c = self.take_chunk(chunk);
                self.submit(c, false);
                if self.pending_len > 0 {
                    self.arm_timer();
                }
                continue;
            }
            match inner.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    let data = match frame.into_data() {
                        Ok(data) => data,
                        Err(frame) => {
                            if let Ok(t) = frame.into_trailers() {
                                self.trailers = Some(t);
                            }
                            Bytes::new()
                        }
                    };
                    {
                        if !data.is_empty() {
                            self.metrics.bytes_in[self.params.codec.index()]
                                .fetch_add(data.len() as u64, Relaxed);
                            let was_empty = self.pending_len == 0;
                            self.pending_len += data.len();
                            self.pending.push_back(data);
                            if was_empty {
                                self.arm_timer();
                            }
                        }
                    }
                    if self.inner.as_ref().is_some_and(|i| i.is_end_stream()) {
                        self.inner = None;
                    }
                }
                Poll::Ready(Some(Err(e))) => return Err(e.into()),
                Poll::Ready(None) => self.inner = None,
                Poll::Pending => {
                    if self.pending_len > 0 {
                        if let Some(t) = self.flush_timer.as_mut() {
                            if t.as_mut().poll(cx).is_ready() {
                                let c = self.take_chunk(chunk);
                                self.submit(c, false);
                                continue;
                            }
                        }
                    }
                    return Ok(());
                }
            }
        }
    }

    fn arm_timer(&mut self) {
        self.flush_timer = self
            .params
            .flush_after
            .map(|d| Box::pin(tokio::time::sleep(d)));
    }

    fn output(&mut self, r: OpResult, op: &CompressOp) -> Result<Bytes, BoxError> {
        self.metrics.chunks_in_flight.fetch_sub(1, Relaxed);
        let chunk = match r {
            Ok(OpOutput::Compressed(c)) => c,
            // failed, timed out, refused (or a foreign output): compress it here
            _ => {
                self.metrics.fallbacks.fetch_add(1, Relaxed);
                compress_chunk(op).map_err(|e| -> BoxError { e.into() })?
            }
        };
        let bytes = self.enc.join(chunk, op.input.len(), op.last);
        self.metrics.bytes_out[self.params.codec.index()].fetch_add(bytes.len() as u64, Relaxed);
        if let Some(t) = &mut self.tee {
            if t.buf.len() + bytes.len() <= t.limit {
                t.buf.extend_from_slice(&bytes);
            } else {
                self.tee = None;
            }
        }
        if op.last {
            self.finished = true;
            if let Some(t) = self.tee.take() {
                (t.done)(Bytes::from(t.buf));
            }
        }
        Ok(bytes)
    }
}

impl<B> Body for CompressBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        // Every field is Unpin (the inner body and the timers are boxed).
        let this = self.get_mut();
        loop {
            if this.finished {
                return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))));
            }
            if let Err(e) = this.fill(cx) {
                this.finished = true;
                this.trailers = None;
                return Poll::Ready(Some(Err(e)));
            }
            let Some(front) = this.in_flight.front_mut() else {
                // nothing in flight: fill() is waiting for input (waker registered)
                return Poll::Pending;
            };
            let r = match &mut front.wait {
                Wait::Done(_) => None,
                Wait::Engine(f) => match f.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(r) => Some(r),
                },
            };
            let Some(done) = this.in_flight.pop_front() else {
                return Poll::Pending;
            };
            let r = match (r, done.wait) {
                (Some(r), _) => r,
                (None, Wait::Done(r)) => r,
                (None, Wait::Engine(_)) => Err(OpError::Dropped),
            };
            match this.output(r, &done.op) {
                Ok(bytes) if bytes.is_empty() => continue,
                Ok(bytes) => return Poll::Ready(Some(Ok(Frame::data(bytes)))),
                Err(e) => {
                    this.finished = true;
                    this.trailers = None;
                    return Poll::Ready(Some(Err(e)));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.finished && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

impl<B> Drop for CompressBody<B> {
    fn drop(&mut self) {
        // Chunks still in flight when the client went away: no longer in flight for us (the
        // engine skips the ones nobody waits for).
        let n = self.in_flight.len() as i64;
        if n > 0 {
            self.metrics.chunks_in_flight.fetch_sub(n, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::tests::{decode, random, text};
    use http_body_util::BodyExt;
    use qweb_offload::{BatchConfig, Engine, InlineEngine, PoolConfig, PoolEngine};
    use std::cell::Cell;
    use std::io::Read;

    /// An inner body of fixed frames that counts the bytes pulled from it.
    struct Frames {
        frames: VecDeque<Bytes>,
        pulled: Rc<Cell<usize>>,
    }

    impl Frames {
        fn new(data: &[u8], frame: usize) -> (Self, Rc<Cell<usize>>) {
            let pulled = Rc::new(Cell::new(0));
            let frames = data
                .chunks(frame.max(1))
                .map(Bytes::copy_from_slice)
                .collect();
            (
                Frames {
                    frames,
                    pulled: pulled.clone(),
                },
                pulled,
            )
        }
    }

    impl Body for Frames {
        type Data = Bytes;
        type Error = BoxError;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            match self.frames.pop_front() {
                Some(b) => {
                    self.pulled.set(self.pulled.get() + b.len());
                    Poll::Ready(Some(Ok(Frame::data(b))))
                }
                None => Poll::Ready(None),
            }
        }
    }

    /// An inner body fed by a channel: pauses when nothing was sent.
    struct Channel(tokio::sync::mpsc::UnboundedReceiver<Bytes>);

    impl Body for Channel {
        type Data = Bytes;
        type Error = BoxError;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            self.0.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
        }
    }

    fn engines() -> Vec<Arc<dyn Engine>> {
        vec![
            Arc::new(InlineEngine::new("inline")),
            Arc::new(
                PoolEngine::new(
                    "pool",
                    PoolConfig {
                        threads: 2,
                        ..Default::default()
                    },
                )
                .unwrap(),
            ),
        ]
    }

    fn offloader(e: &Arc<dyn Engine>) -> Rc<Offloader> {
        Offloader::new(e.clone(), BatchConfig::default(), Duration::from_secs(10))
    }

    fn params(codec: Codec, mode: Mode, chunk: usize, depth: usize) -> EncodeParams {
        EncodeParams {
            codec,
            level: 4,
            mode,
            chunk_size: chunk,
            depth,
            flush_after: Some(Duration::from_millis(20)),
        }
    }

    fn local<F: Future>(f: F) -> F::Output {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        tokio::task::LocalSet::new().block_on(&rt, f)
    }

    /// Reads what a decoder can produce from a possibly unfinished stream.
    fn decode_prefix(codec: Codec, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        let mut r: Box<dyn Read + '_> = match codec {
            Codec::Gzip => Box::new(flate2::read::GzDecoder::new(data)),
            Codec::Brotli => Box::new(brotli::Decompressor::new(data, 4096)),
            Codec::Zstd => Box::new(zstd::stream::read::Decoder::new(data).unwrap()),
        };
        while let Ok(n) = r.read(&mut buf) {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        out
    }

    #[test]
    fn round_trips_every_codec_mode_and_engine() {
        let chunk = 8192;
        local(async {
            for engine in engines() {
                let off = offloader(&engine);
                for codec in Codec::ALL {
                    for mode in [Mode::InPlace, Mode::Sync, Mode::Async] {
                        for n in [0, 1, chunk - 1, chunk, chunk + 1, 9 * chunk + 17] {
                            for data in [text(n), random(n, 3)] {
                                // odd frame sizes: chunks straddle frames
                                let (inner, _) = Frames::new(&data, 3001);
                                let m = Arc::new(CompressMetrics::default());
                                let body = CompressBody::new(
                                    inner,
                                    params(codec, mode, chunk, 4),
                                    off.clone(),
                                    m.clone(),
                                );
                                let z = body.collect().await.unwrap().to_bytes();
                                assert!(
                                    decode(codec, &z) == data,
                                    "{} {codec:?} {mode:?} {n}",
                                    engine.name()
                                );
                                assert_eq!(m.chunks_in_flight.load(Relaxed), 0);
                                assert_eq!(m.bytes_in[codec.index()].load(Relaxed), n as u64);
                                assert_eq!(
                                    m.bytes_out[codec.index()].load(Relaxed),
                                    z.len() as u64
                                );
                                assert_eq!(m.fallbacks.load(Relaxed), 0);
                            }
                        }
                    }
                }
            }
        });
    }

    #[test]
    fn a_consumer_that_stops_reading_stops_the_pipeline() {
        let chunk = 4096;
        let depth = 3;
        local(async {
            let engine: Arc<dyn Engine> = Arc::new(
                PoolEngine::new(
                    "p",
                    PoolConfig {
                        threads: 2,
                        ..Default::default()
                    },
                )
                .unwrap(),
            );
            let data = text(1 << 20);
            let (inner, pulled) = Frames::new(&data, 1000);
            let m = Arc::new(CompressMetrics::default());
            let mut body = CompressBody::new(
                inner,
                params(Codec::Gzip, Mode::Async, chunk, depth),
                offloader(&engine),
                m.clone(),
            );
            let first = body.frame().await.unwrap().unwrap();
            assert!(first.is_data());
            // only what the pipeline holds was read: depth chunks + one partial chunk
            let bound = (depth + 1) * chunk + 1000;
            assert!(pulled.get() <= bound, "pulled {} > {bound}", pulled.get());
            assert!(m.chunks_in_flight.load(Relaxed) <= depth as i64);
            // the consumer is idle: nothing more is read or submitted
            let (p, c) = (pulled.get(), m.chunks.load(Relaxed));
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert_eq!((pulled.get(), m.chunks.load(Relaxed)), (p, c));
            // and reading on finishes the stream correctly, still bounded at every step
            let mut out = first.into_data().unwrap().to_vec();
            while let Some(f) = body.frame().await {
                out.extend_from_slice(&f.unwrap().into_data().unwrap());
                let ahead = pulled.get() - m.bytes_in[0].load(Relaxed) as usize;
                assert_eq!(ahead, 0);
                assert!(m.chunks_in_flight.load(Relaxed) <= depth as i64);
            }
            assert!(decode(Codec::Gzip, &out) == data);
            drop(body);
            assert_eq!(m.chunks_in_flight.load(Relaxed), 0);
        });
    }

    #[test]
    fn pipelined_mode_keeps_depth_chunks_in_flight_and_sync_mode_one() {
        local(async {
            let engine: Arc<dyn Engine> = Arc::new(
                PoolEngine::new(
                    "slow",
                    PoolConfig {
                        threads: 1,
                        added_latency: Duration::from_millis(30),
                        ..Default::default()
                    },
                )
                .unwrap(),
            );
            let data = text(64 * 1024);
            for (mode, want) in [(Mode::Async, 6), (Mode::Sync, 1)] {
                let (inner, _) = Frames::new(&data, 4096);
                let body = CompressBody::new(
                    inner,
                    params(Codec::Gzip, mode, 4096, 6),
                    offloader(&engine),
                    Arc::new(CompressMetrics::default()),
                );
                let before = engine.metrics().in_flight_peak.load(Relaxed);
                let z = body.collect().await.unwrap().to_bytes();
                assert!(decode(Codec::Gzip, &z) == data);
                let peak = engine.metrics().in_flight_peak.load(Relaxed);
                if mode == Mode::Async {
                    assert_eq!(peak, want, "{mode:?}");
                } else {
                    // the peak from the pipelined run stays; sync never raised it past 1
                    assert_eq!(peak, before);
                }
            }
        });
    }

    /// zstd chunks share their response's context (one frame): one at a time on the
    /// engine whatever `depth`, and two responses still overlap on it.
    #[test]
    fn zstd_chunks_of_one_response_go_one_at_a_time() {
        local(async {
            let engine: Arc<dyn Engine> = Arc::new(
                PoolEngine::new(
                    "slow",
                    PoolConfig {
                        threads: 2,
                        added_latency: Duration::from_millis(20),
                        ..Default::default()
                    },
                )
                .unwrap(),
            );
            let data = text(64 * 1024);
            let body = |d: &[u8]| {
                let (inner, _) = Frames::new(d, 4096);
                CompressBody::new(
                    inner,
                    params(Codec::Zstd, Mode::Async, 4096, 6),
                    offloader(&engine),
                    Arc::new(CompressMetrics::default()),
                )
            };
            let z = body(&data).collect().await.unwrap().to_bytes();
            assert_eq!(engine.metrics().in_flight_peak.load(Relaxed), 1);
            assert_eq!(
                zstd::zstd_safe::find_frame_compressed_size(&z).unwrap(),
                z.len()
            );
            assert!(decode(Codec::Zstd, &z) == data);
            let (a, b) = tokio::join!(body(&data).collect(), body(&data).collect());
            assert_eq!(engine.metrics().in_flight_peak.load(Relaxed), 2);
            for z in [a.unwrap().to_bytes(), b.unwrap().to_bytes()] {
                assert!(decode(Codec::Zstd, &z) == data);
            }
        });
    }

    #[test]
    fn sync_mode_never_has_two_chunks_on_the_engine() {
        local(async {
            let engine: Arc<dyn Engine> = Arc::new(
                PoolEngine::new(
                    "slow",
                    PoolConfig {
                        threads: 2,
                        added_latency: Duration::from_millis(5),
                        ..Default::default()
                    },
                )
                .unwrap(),
            );
            let data = text(40 * 1024);
            let (inner, _) = Frames::new(&data, 4096);
            let body = CompressBody::new(
                inner,
                params(Codec::Gzip, Mode::Sync, 4096, 8),
                offloader(&engine),
                Arc::new(CompressMetrics::default()),
            );
            let z = body.collect().await.unwrap().to_bytes();
            assert!(decode(Codec::Gzip, &z) == data);
            assert_eq!(engine.metrics().in_flight_peak.load(Relaxed), 1);
            assert_eq!(engine.metrics().submitted.load(Relaxed), 11);
        });
    }

    #[test]
    fn a_paused_stream_is_flushed_after_the_time_bound() {
        local(async {
            for codec in Codec::ALL {
                for engine in engines() {
                    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                    let mut body = CompressBody::new(
                        Channel(rx),
                        params(codec, Mode::Async, 64 * 1024, 4),
                        offloader(&engine),
                        Arc::new(CompressMetrics::default()),
                    );
                    let mut wire = Vec::new();
                    for piece in ["first line\n", "second line\n"] {
                        tx.send(Bytes::from(piece)).unwrap();
                        // far less than a chunk, and the stream stays open: the flush
                        // must still deliver it, decodable
                        let want = wire.len();
                        let mut got = Vec::new();
                        while !String::from_utf8_lossy(&got).ends_with(piece) {
                            let f = tokio::time::timeout(Duration::from_secs(5), body.frame())
                                .await
                                .unwrap_or_else(|_| panic!("{codec:?}: no flush"))
                                .unwrap()
                                .unwrap();
                            wire.extend_from_slice(&f.into_data().unwrap());
                            got = decode_prefix(codec, &wire);
                        }
                        assert!(wire.len() > want);
                    }
                    drop(tx);
                    while let Some(f) = body.frame().await {
                        wire.extend_from_slice(&f.unwrap().into_data().unwrap());
                    }
                    assert_eq!(decode(codec, &wire), b"first line\nsecond line\n");
                }
            }
        });
    }

    #[test]
    fn failing_engine_falls_back_to_software() {
        local(async {
            let engine: Arc<dyn Engine> = Arc::new(
                PoolEngine::new(
                    "bad",
                    PoolConfig {
                        inject_failures: true,
                        ..Default::default()
                    },
                )
                .unwrap(),
            );
            for mode in [Mode::Sync, Mode::Async] {
                let data = text(50_000);
                let (inner, _) = Frames::new(&data, 7000);
                let m = Arc::new(CompressMetrics::default());
                let body = CompressBody::new(
                    inner,
                    params(Codec::Brotli, mode, 8192, 4),
                    offloader(&engine),
                    m.clone(),
                );
                let z = body.collect().await.unwrap().to_bytes();
                assert!(decode(Codec::Brotli, &z) == data);
                assert_eq!(m.fallbacks.load(Relaxed), 7);
            }
        });
    }

    #[test]
    fn in_place_mode_never_touches_the_engine() {
        local(async {
            let engine: Arc<dyn Engine> = Arc::new(
                PoolEngine::new(
                    "failing",
                    PoolConfig {
                        inject_failures: true,
                        ..Default::default()
                    },
                )
                .unwrap(),
            );
            let data = text(50_000);
            let (inner, _) = Frames::new(&data, 7000);
            let m = Arc::new(CompressMetrics::default());
            let body = CompressBody::new(
                inner,
                params(Codec::Gzip, Mode::InPlace, 8192, 4),
                offloader(&engine),
                m.clone(),
            );
            let z = body.collect().await.unwrap().to_bytes();
            assert!(decode(Codec::Gzip, &z) == data);
            assert_eq!(m.chunks.load(Relaxed), 7);
            assert_eq!(m.fallbacks.load(Relaxed), 0);
            assert_eq!(engine.metrics().submitted.load(Relaxed), 0);
        });
    }

    #[test]
    fn the_sink_gets_the_whole_body_only_when_it_fits() {
        local(async {
            let engine: Arc<dyn Engine> = Arc::new(InlineEngine::new("inline"));
            let data = text(100_000);
            for (limit, expect) in [(1 << 20, true), (100, false)] {
                let got: Rc<Cell<Option<Bytes>>> = Rc::new(Cell::new(None));
                let g = got.clone();
                let (inner, _) = Frames::new(&data, 5000);
                let body = CompressBody::new(
                    inner,
                    params(Codec::Gzip, Mode::Async, 16384, 4),
                    offloader(&engine),
                    Arc::new(CompressMetrics::default()),
                )
                .with_sink(limit, Box::new(move |b| g.set(Some(b))));
                let z = body.collect().await.unwrap().to_bytes();
                match got.take() {
                    Some(b) => {
                        assert!(expect);
                        assert_eq!(b, z);
                    }
                    None => assert!(!expect),
                }
            }
        });
    }
}
