//! Latency samples and their summary (exact nearest-rank percentiles).

use serde::Serialize;

/// Summary of a set of latency samples, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    /// Number of samples.
    pub count: u64,
    /// Arithmetic mean.
    pub mean_us: f64,
    /// Median.
    pub p50_us: u64,
    /// 90th percentile.
    pub p90_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// Largest sample.
    pub max_us: u64,
}

/// The nearest-rank percentile `p` (0 < p <= 100) of `sorted` (ascending); 0 when empty.
///
/// Nearest rank: the smallest sample such that at least p% of the samples are <= it.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let n = sorted.len();
    let rank = ((p / 100.0) * n as f64).ceil() as usize;
    sorted[rank.clamp(1, n) - 1]
}

/// Sorts `samples` in place and summarises them.
pub fn summarize(samples: &mut [u64]) -> LatencySummary {
    if samples.is_empty() {
        return LatencySummary::default();
    }
    samples.sort_unstable();
    let sum: u128 = samples.iter().map(|&s| s as u128).sum();
    LatencySummary {
        count: samples.len() as u64,
        mean_us: sum as f64 / samples.len() as f64,
        p50_us: percentile(samples, 50.0),
        p90_us: percentile(samples, 90.0),
        p99_us: percentile(samples, 99.0),
        max_us: samples[samples.len() - 1],
    }
}

/// The median of `values` (mean of the middle two for an even count); NaN when empty.
pub fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), 50);
        assert_eq!(percentile(&v, 90.0), 90);
        assert_eq!(percentile(&v, 99.0), 99);
        assert_eq!(percentile(&v, 100.0), 100);
        assert_eq!(percentile(&v, 0.1), 1);
        assert_eq!(percentile(&[7], 99.0), 7);
        assert_eq!(percentile(&[], 50.0), 0);
        // 10 samples: p99 is the largest, p50 the 5th.
        let w: Vec<u64> = (10..20).collect();
        assert_eq!(percentile(&w, 99.0), 19);
        assert_eq!(percentile(&w, 50.0), 14);
    }

    #[test]
    fn summary_sorts_and_averages() {
        let mut v = vec![5, 1, 4, 2, 3];
        let s = summarize(&mut v);
        assert_eq!(s.count, 5);
        assert_eq!(s.mean_us, 3.0);
        assert_eq!(s.p50_us, 3);
        assert_eq!(s.p99_us, 5);
        assert_eq!(s.max_us, 5);
        assert_eq!(summarize(&mut []), LatencySummary::default());
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }
}
