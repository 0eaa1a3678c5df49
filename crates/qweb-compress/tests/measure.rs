//! A quick measurement, not a test of behaviour (ignored by default): time to compress one
//! 8 MiB text response in sync vs pipelined mode on a 2-thread pool engine.
//!
//! `cargo test --release -p qweb-compress --test measure -- --ignored --nocapture`

use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use qweb_compress::{Codec, CompressBody, CompressMetrics, EncodeParams};
use qweb_offload::Mode;
use qweb_offload::{BatchConfig, Engine, Offloader, PoolConfig, PoolEngine};
use qweb_testkit::corpus::text;

#[test]
#[ignore]
fn eight_mib_sync_vs_pipelined_on_a_two_thread_pool() {
    let data = Bytes::from(text(8 << 20));
    let engine: Arc<dyn Engine> = Arc::new(
        PoolEngine::new(
            "pool2",
            PoolConfig {
                threads: 2,
                ..Default::default()
            },
        )
        .unwrap(),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async {
        let off: Rc<Offloader> = Offloader::new(
            engine.clone(),
            BatchConfig::default(),
            Duration::from_secs(30),
        );
        for (codec, level) in [(Codec::Gzip, 4), (Codec::Brotli, 4), (Codec::Zstd, 3)] {
            for (mode, depth) in [(Mode::Sync, 1), (Mode::Async, 2), (Mode::Async, 4)] {
                let mut best = Duration::MAX;
                let mut size = 0;
                for _ in 0..7 {
                    let body = CompressBody::new(
                        Full::new(data.clone()),
                        EncodeParams {
                            codec,
                            level,
                            mode,
                            chunk_size: 64 * 1024,
                            depth,
                            flush_after: None,
                        },
                        off.clone(),
                        Arc::new(CompressMetrics::default()),
                    );
                    let start = Instant::now();
                    let out = body.collect().await.unwrap().to_bytes();
                    best = best.min(start.elapsed());
                    size = out.len();
                }
                println!(
                    "{:5} level {level:2} {mode:?} depth {depth}: {:7.1} ms  ({} -> {} bytes)",
                    codec.token(),
                    best.as_secs_f64() * 1000.0,
                    data.len(),
                    size
                );
            }
        }
    });
}
