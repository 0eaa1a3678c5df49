//! `qweb-bench zipf`: the proxy cache's eviction policy on a synthetic trace. It drives
//! [`qweb_cache::Store`] directly (a lookup per request, an insert on a miss), with no server
//! and no network, for S3-FIFO (the server's policy) and plain LRU, and prints the object and
//! byte hit ratios as a markdown table.
//!
//! The trace: requests to `keys` keys drawn from a Zipf distribution of exponent α (rank 1
//! the most popular), interleaved with a share of requests to keys asked once and never again
//! (one-hit wonders, a scan). Each key's size is drawn once from a log-normal spread (median
//! 8 KiB, σ = 1.5, clamped to 100 B – 4 MiB). The cache sizes are shares of the Zipf keys'
//! bytes (the working set). The first quarter of the requests warms the cache and is not
//! counted. Everything follows from `--seed`: the same arguments print the same table.

use std::sync::atomic::Ordering::Relaxed;
use std::time::SystemTime;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use qweb_cache::{Entry, Eviction, Limits, Meta, Store};

use crate::{Error, Result};

/// The largest object of the trace.
const MAX_SIZE: usize = 4 << 20;

/// The bodies: slices of one static buffer (no allocation per stored entry).
static ZEROS: [u8; MAX_SIZE] = [0; MAX_SIZE];

/// Options of `qweb-bench zipf`.
#[derive(Debug, Clone, clap::Args)]
pub struct ZipfArgs {
    /// Distinct keys of the Zipf part.
    #[arg(long, default_value_t = 1_000_000)]
    pub keys: u32,
    /// Requests per trace.
    #[arg(long, default_value_t = 3_000_000)]
    pub requests: u32,
    /// Zipf exponents, one trace set each.
    #[arg(long, value_delimiter = ',', default_value = "0.8,1.0")]
    pub alpha: Vec<f64>,
    /// Percent of the requests that go to keys asked once, one trace each.
    #[arg(long, value_delimiter = ',', default_value = "0,30")]
    pub one_hit: Vec<u32>,
    /// Cache sizes, in percent of the working set's bytes.
    #[arg(long, value_delimiter = ',', default_value = "1,5,10")]
    pub sizes: Vec<f64>,
    /// The seed of every draw.
    #[arg(long, default_value_t = 38)]
    pub seed: u64,
}

/// splitmix64: small, fast, deterministic.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }
}

/// The size of key `id`: log-normal, median 8 KiB, σ 1.5, within 100 B – 4 MiB.
pub fn size_of(seed: u64, id: u32) -> usize {
    let mut r = Rng(seed ^ (u64::from(id) << 20) ^ 0x5133);
    r.next();
    let (u, v) = (r.unit(), r.unit());
    let normal = (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos();
    let size = (8192f64.ln() + 1.5 * normal).exp();
    (size as usize).clamp(100, MAX_SIZE)
}

/// A trace: key ids (`>= keys` for the one-time keys).
pub fn trace(keys: u32, requests: u32, alpha: f64, one_hit: u32, seed: u64) -> Vec<u32> {
    let mut cdf = Vec::with_capacity(keys as usize);
    let mut sum = 0.0;
    for rank in 1..=keys {
        sum += 1.0 / f64::from(rank).powf(alpha);
        cdf.push(sum);
    }
    let mut r = Rng(seed);
    let mut once = keys;
    (0..requests)
        .map(|_| {
            if r.next() % 100 < u64::from(one_hit) {
                once += 1;
                once
            } else {
                let u = r.unit() * sum;
                cdf.partition_point(|&c| c < u).min(keys as usize - 1) as u32
            }
        })
        .collect()
}

/// What one run counted.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ratios {
    /// Hits over requests.
    pub objects: f64,
    /// Bytes of the hits over bytes requested.
    pub bytes: f64,
}

/// Replays `trace` on a store of `memory` bytes evicting by `eviction`.
pub fn replay(trace: &[u32], seed: u64, memory: usize, eviction: Eviction) -> Ratios {
    let store = Store::with_eviction(Limits::new(memory, MAX_SIZE), eviction);
    let (none, now) = (HeaderMap::new(), SystemTime::now());
    let warm = trace.len() / 4;
    let (mut asked, mut hits, mut bytes, mut hit_bytes) = (0u64, 0u64, 0u64, 0u64);
    let mut key = String::new();
    for (n, &id) in trace.iter().enumerate() {
        use std::fmt::Write as _;
        key.clear();
        let _ = write!(key, "https://bench.test/{id}");
        let size = size_of(seed, id);
        let hit = store.lookup(&key, &none).is_some();
        if !hit {
            let meta = Meta::new(StatusCode::OK, &none, &none, now, now);
            store.insert(&key, Entry::new(meta, Bytes::from_static(&ZEROS[..size])));
        }
        if n >= warm {
            asked += 1;
            bytes += size as u64;
            if hit {
                hits += 1;
                hit_bytes += size as u64;
            }
        }
    }
    debug_assert!(store.stats().bytes.load(Relaxed) <= memory as u64);
    Ratios {
        objects: hits as f64 / asked.max(1) as f64,
        bytes: hit_bytes as f64 / bytes.max(1) as f64,
    }
}

/// Runs every trace at every size under both policies (two threads) and prints the table.
pub fn run_zipf(args: &ZipfArgs) -> Result<String> {
    if args.keys == 0 || args.requests == 0 || args.one_hit.iter().any(|p| *p > 100) {
        return Err(Error::Arg(
            "zipf: --keys and --requests above 0, --one-hit within 0 to 100".into(),
        ));
    }
    let working: u64 = (0..args.keys).map(|id| size_of(args.seed, id) as u64).sum();
    let mut out = format!(
        "{} keys, {} requests per trace (the first quarter warms), working set {:.1} GiB, seed {}\n\n\
         | α | one-time requests | cache | LRU hits | S3-FIFO hits | LRU byte hits | S3-FIFO byte hits |\n\
         |---:|---:|---:|---:|---:|---:|---:|\n",
        args.keys,
        args.requests,
        working as f64 / f64::from(1u32 << 30),
        args.seed
    );
    for &alpha in &args.alpha {
        for &one_hit in &args.one_hit {
            let t = trace(args.keys, args.requests, alpha, one_hit, args.seed);
            for &size in &args.sizes {
                let memory = ((working as f64 * size / 100.0) as usize).max(2 * MAX_SIZE);
                let (lru, s3) = std::thread::scope(|s| {
                    let lru = s.spawn(|| replay(&t, args.seed, memory, Eviction::Lru));
                    let s3 = replay(&t, args.seed, memory, Eviction::S3Fifo);
                    (lru.join(), s3)
                });
                let lru = lru.map_err(|_| Error::Other("zipf: a replay panicked".into()))?;
                out += &format!(
                    "| {alpha} | {one_hit} % | {size} % | {:.3} | {:.3} | {:.3} | {:.3} |\n",
                    lru.objects, s3.objects, lru.bytes, s3.bytes
                );
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traces_and_sizes_are_deterministic_and_in_range() {
        assert_eq!(trace(1000, 500, 1.0, 30, 7), trace(1000, 500, 1.0, 30, 7));
        let t = trace(1000, 10_000, 1.0, 30, 7);
        let once = t.iter().filter(|&&id| id >= 1000).count();
        assert!((2500..3500).contains(&once), "{once}");
        let top = t.iter().filter(|&&id| id == 0).count();
        assert!(top > 700, "rank 1 is the most asked: {top}");
        for id in 0..10_000 {
            assert!((100..=MAX_SIZE).contains(&size_of(7, id)));
        }
    }

    /// On a small trace with one-time keys, S3-FIFO hits more than LRU.
    #[test]
    fn s3_fifo_beats_lru_with_one_time_keys() {
        let t = trace(10_000, 200_000, 1.0, 30, 7);
        let working: usize = (0..10_000).map(|id| size_of(7, id)).sum();
        let memory = working / 20;
        let lru = replay(&t, 7, memory, Eviction::Lru);
        let s3 = replay(&t, 7, memory, Eviction::S3Fifo);
        assert!(s3.objects > lru.objects, "{s3:?} {lru:?}");
    }
}
