//! `Cache-Status` (RFC 9211): one member, `qweb`, on every response of a cached route.

use http::{HeaderValue, StatusCode};

/// What the cache did with one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CacheStatus {
    /// Served from the store without the origin (`collapsed`: after waiting on another
    /// request's fill, or from that fill's body while it is written).
    Hit {
        /// The request waited for another request's fill.
        collapsed: bool,
    },
    /// Served stale from the store (allowed by the request, or the origin failed).
    Stale,
    /// Went to the origin: nothing usable was stored (`stored`: the response is being
    /// stored).
    Miss {
        /// The response is stored.
        stored: bool,
    },
    /// The stored response was validated with the origin; `status` is the origin's answer
    /// (304: the stored body was served).
    Revalidated {
        /// The origin's status.
        status: StatusCode,
        /// The response is stored (a new one, or the updated stored one).
        stored: bool,
    },
    /// The request's method or form does not use the cache.
    Bypass,
}

impl CacheStatus {
    /// The field value (`qweb; hit`, `qweb; fwd=miss; stored`, ...).
    pub fn header(self) -> HeaderValue {
        let text = match self {
            CacheStatus::Hit { collapsed: false } => "qweb; hit".to_owned(),
            CacheStatus::Hit { collapsed: true } => "qweb; hit; collapsed".to_owned(),
            CacheStatus::Stale => "qweb; hit; detail=stale".to_owned(),
            CacheStatus::Miss { stored } => {
                format!("qweb; fwd=miss{}", if stored { "; stored" } else { "" })
            }
            CacheStatus::Revalidated { status, stored } => format!(
                "qweb; fwd=stale; fwd-status={}{}",
                status.as_u16(),
                if stored { "; stored" } else { "" }
            ),
            CacheStatus::Bypass => "qweb; fwd=bypass".to_owned(),
        };
        // only ASCII digits and fixed words
        HeaderValue::from_str(&text).unwrap_or(HeaderValue::from_static("qweb"))
    }

    /// The access log's word: HIT, STALE, MISS, REVALIDATED or BYPASS.
    pub fn word(self) -> &'static str {
        match self {
            CacheStatus::Hit { .. } => "HIT",
            CacheStatus::Stale => "STALE",
            CacheStatus::Miss { .. } => "MISS",
            CacheStatus::Revalidated { .. } => "REVALIDATED",
            CacheStatus::Bypass => "BYPASS",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values() {
        assert_eq!(CacheStatus::Hit { collapsed: false }.header(), "qweb; hit");
        assert_eq!(
            CacheStatus::Miss { stored: true }.header(),
            "qweb; fwd=miss; stored"
        );
        assert_eq!(
            CacheStatus::Revalidated {
                status: StatusCode::NOT_MODIFIED,
                stored: true
            }
            .header(),
            "qweb; fwd=stale; fwd-status=304; stored"
        );
        assert_eq!(CacheStatus::Bypass.word(), "BYPASS");
    }
}
