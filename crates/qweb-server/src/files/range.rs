//! `Range: bytes=...` for a single range.

/// What a Range header asks of a representation of `len` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RangeRequest {
    /// No usable Range: serve the whole representation (absent, not `bytes`, malformed, or
    /// several ranges, which qweb answers with the full body as RFC 9110 allows).
    Full,
    /// Bytes `start..=end`.
    Partial { start: u64, end: u64 },
    /// A well-formed range that selects nothing: 416.
    Unsatisfiable,
}

/// Parses a Range header value against a length.
pub(crate) fn parse(value: &str, len: u64) -> RangeRequest {
    let value = value.trim();
    let Some((unit, spec)) = value.split_once('=') else {
        return RangeRequest::Full;
    };
    if !unit.trim().eq_ignore_ascii_case("bytes") || spec.contains(',') {
        return RangeRequest::Full;
    }
    let Some((first, last)) = spec.trim().split_once('-') else {
        return RangeRequest::Full;
    };
    let (first, last) = (first.trim(), last.trim());
    let num = |s: &str| -> Option<u64> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    };
    if first.is_empty() {
        // suffix range: the last N bytes
        let Some(n) = num(last) else {
            return RangeRequest::Full;
        };
        if n == 0 || len == 0 {
            return RangeRequest::Unsatisfiable;
        }
        return RangeRequest::Partial {
            start: len - n.min(len),
            end: len - 1,
        };
    }
    let Some(start) = num(first) else {
        return RangeRequest::Full;
    };
    let end = if last.is_empty() {
        None
    } else {
        match num(last) {
            Some(e) if e >= start => Some(e),
            _ => return RangeRequest::Full,
        }
    };
    if start >= len {
        return RangeRequest::Unsatisfiable;
    }
    RangeRequest::Partial {
        start,
        end: end.map_or(len - 1, |e| e.min(len - 1)),
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
        assert_eq!(parse("bytes=0-1,3-4", 10), Full);
        assert_eq!(parse("items=0-1", 10), Full);
        assert_eq!(parse("bytes=x-1", 10), Full);
        assert_eq!(parse("bytes=+1-2", 10), Full);
        assert_eq!(parse("bytes=99999999999999999999999-", 10), Full);
        assert_eq!(parse("garbage", 10), Full);
    }
}
