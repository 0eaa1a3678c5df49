//! `Range: bytes=...`: one range (206 with `Content-Range`) or several (206
//! `multipart/byteranges`, RFC 9110 section 14.6), with the limits an attacker meets.
//!
//! Several ranges are sorted and those that overlap or touch are merged into one (RFC 9110
//! section 14.2 lets a server coalesce them), so that `bytes=0-,0-,0-` or a thousand small
//! overlapping ranges cannot make a response many times larger than the file. A request
//! with more than [`MAX_RANGES`] ranges is answered with the whole representation (200), as
//! nginx's `max_ranges` does. Ranges that select nothing are dropped; when none is left the
//! answer is 416.

use std::ops::RangeInclusive;

/// Most ranges one request may ask for; beyond it the Range header is ignored (200).
pub(crate) const MAX_RANGES: usize = 32;

/// What a Range header asks of a representation of `len` bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RangeRequest {
    /// No usable Range: serve the whole representation (absent, not `bytes`, malformed, or
    /// more than [`MAX_RANGES`] ranges).
    Full,
    /// Bytes `start..=end`.
    Partial { start: u64, end: u64 },
    /// Several disjoint ranges, in ascending order, none touching the next:
    /// `multipart/byteranges`.
    Multi(Vec<RangeInclusive<u64>>),
    /// A well-formed range set that selects nothing: 416.
    Unsatisfiable,
}

/// One `range-spec`, resolved against `len`: `Some(None)` when it selects nothing; `None`
/// when it is malformed.
fn spec(s: &str, len: u64) -> Option<Option<RangeInclusive<u64>>> {
    let (first, last) = s.trim().split_once('-')?;
    let (first, last) = (first.trim(), last.trim());
    let num = |s: &str| -> Option<u64> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    };
    if first.is_empty() {
        // suffix range: the last N bytes
        let n = num(last)?;
        if n == 0 || len == 0 {
            return Some(None);
        }
        return Some(Some(len - n.min(len)..=len - 1));
    }
    let start = num(first)?;
    let end = if last.is_empty() {
        None
    } else {
        match num(last) {
            Some(e) if e >= start => Some(e),
            _ => return None,
        }
    };
    if start >= len {
        return Some(None);
    }
    Some(Some(start..=end.map_or(len - 1, |e| e.min(len - 1))))
}

/// Parses a Range header value against a length.
pub(crate) fn parse(value: &str, len: u64) -> RangeRequest {
    let value = value.trim();
    let Some((unit, set)) = value.split_once('=') else {
        return RangeRequest::Full;
    };
    if !unit.trim().eq_ignore_ascii_case("bytes") {
        return RangeRequest::Full;
    }
    // empty list elements are allowed (RFC 9110 section 5.6.1) and skipped
    let specs: Vec<&str> = set.split(',').filter(|s| !s.trim().is_empty()).collect();
    if specs.is_empty() || specs.len() > MAX_RANGES {
        return RangeRequest::Full;
    }
    let mut ranges = Vec::with_capacity(specs.len());
    for s in specs {
        match spec(s, len) {
            None => return RangeRequest::Full,
            Some(None) => {}
            Some(Some(r)) => ranges.push(r),
        }
    }
    ranges.sort_by_key(|r| *r.start());
    let mut merged: Vec<RangeInclusive<u64>> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match merged.last_mut() {
            // overlapping or adjacent: one range
            Some(m) if *r.start() <= m.end().saturating_add(1) => {
                *m = *m.start()..=(*m.end()).max(*r.end());
            }
            _ => merged.push(r),
        }
    }
    match merged.len() {
        0 => RangeRequest::Unsatisfiable,
        1 => RangeRequest::Partial {
            start: *merged[0].start(),
            end: *merged[0].end(),
        },
        _ => RangeRequest::Multi(merged),
    }
}

#[cfg(test)]
mod tests {
    use super::RangeRequest::*;
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(parse("bytes=0-0", 10), Partial { start: 0, end: 0 });
        assert_eq!(parse("bytes=2-5", 10), Partial { start: 2, end: 5 });
        assert_eq!(parse("bytes=2-50", 10), Partial { start: 2, end: 9 });
        assert_eq!(parse("bytes=7-", 10), Partial { start: 7, end: 9 });
        assert_eq!(parse("bytes=-3", 10), Partial { start: 7, end: 9 });
        assert_eq!(parse("bytes=-30", 10), Partial { start: 0, end: 9 });
        assert_eq!(parse("BYTES = 1-2", 10), Partial { start: 1, end: 2 });
        assert_eq!(parse("bytes=10-", 10), Unsatisfiable);
        assert_eq!(parse("bytes=-0", 10), Unsatisfiable);
        assert_eq!(parse("bytes=0-", 0), Unsatisfiable);
        assert_eq!(parse("bytes=5-2", 10), Full);
        assert_eq!(parse("items=0-1", 10), Full);
        assert_eq!(parse("bytes=x-1", 10), Full);
        assert_eq!(parse("bytes=+1-2", 10), Full);
        assert_eq!(parse("bytes=99999999999999999999999-", 10), Full);
        assert_eq!(parse("garbage", 10), Full);
        assert_eq!(parse("bytes=", 10), Full);
        assert_eq!(parse("bytes=,", 10), Full);
    }

    #[test]
    fn several_ranges() {
        assert_eq!(parse("bytes=0-1,5-6", 10), Multi(vec![0..=1, 5..=6]));
        // unsorted: sorted
        assert_eq!(parse("bytes=5-6, 0-1", 10), Multi(vec![0..=1, 5..=6]));
        // an empty element is skipped
        assert_eq!(parse("bytes=0-1,,5-6,", 10), Multi(vec![0..=1, 5..=6]));
        // suffix ranges among others
        assert_eq!(parse("bytes=0-0,-2", 10), Multi(vec![0..=0, 8..=9]));
        // one unsatisfiable range among satisfiable ones is dropped
        assert_eq!(parse("bytes=0-1,50-60", 10), Partial { start: 0, end: 1 });
        assert_eq!(parse("bytes=20-30,50-60", 10), Unsatisfiable);
        // one malformed range: the header is ignored
        assert_eq!(parse("bytes=0-1,x", 10), Full);
        assert_eq!(parse("bytes=0-1,3-2", 10), Full);
    }

    /// The amplification an attacker tries: overlapping or adjacent ranges are merged, so a
    /// response never carries a byte twice.
    #[test]
    fn overlapping_and_adjacent_ranges_are_merged() {
        assert_eq!(parse("bytes=0-,0-,0-", 10), Partial { start: 0, end: 9 });
        assert_eq!(parse("bytes=0-4,5-9", 10), Partial { start: 0, end: 9 });
        assert_eq!(parse("bytes=0-5,2-3,8-9", 10), Multi(vec![0..=5, 8..=9]));
        assert_eq!(parse("bytes=-5,0-", 10), Partial { start: 0, end: 9 });
        let many: Vec<String> = (0..MAX_RANGES as u64)
            .map(|i| format!("{i}-{}", i + 1))
            .collect();
        assert_eq!(
            parse(&format!("bytes={}", many.join(",")), 1000),
            Partial {
                start: 0,
                end: MAX_RANGES as u64
            }
        );
    }

    /// More than `MAX_RANGES` ranges: the header is ignored (the whole file, 200), whatever
    /// they select.
    #[test]
    fn too_many_ranges_get_the_whole_representation() {
        let at = |n: usize| -> String {
            let v: Vec<String> = (0..n).map(|i| format!("{}-{}", i * 3, i * 3)).collect();
            format!("bytes={}", v.join(","))
        };
        assert!(matches!(parse(&at(MAX_RANGES), 1000), Multi(v) if v.len() == MAX_RANGES));
        assert_eq!(parse(&at(MAX_RANGES + 1), 1000), Full);
        assert_eq!(parse(&at(10_000), 1000), Full);
    }
}
