//! `Accept-Encoding` negotiation (RFC 9110, section 12.5.3).

use qweb_offload::compress::Codec;

/// A parsed `Accept-Encoding`: the weight (q-value, in thousandths) the client gives each
/// coding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptEncoding {
    /// Per codec ([`Codec::index`]): the explicit weight, if the coding was named.
    codecs: [Option<u16>; 3],
    identity: Option<u16>,
    star: Option<u16>,
}

/// Parses a q-value (`0`, `0.5`, `1.000`) into thousandths; `None` when malformed.
fn qvalue(v: &str) -> Option<u16> {
    let v = v.trim();
    let (int, frac) = v.split_once('.').unwrap_or((v, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole = match int {
        "0" => 0u16,
        "1" => 1,
        _ => return None,
    };
    let mut thousandths = 0u16;
    for (i, b) in frac.bytes().enumerate() {
        thousandths += u16::from(b - b'0') * [100, 10, 1][i];
    }
    let q = whole * 1000 + thousandths;
    (q <= 1000).then_some(q)
}

impl AcceptEncoding {
    /// Parses the header's values (several header lines are one list). An element with a
    /// malformed weight is ignored.
    pub fn parse<'a>(values: impl IntoIterator<Item = &'a str>) -> Self {
        let mut ae = AcceptEncoding {
            codecs: [None; 3],
            identity: None,
            star: None,
        };
        for value in values {
            for element in value.split(',') {
                let mut parts = element.split(';');
                let coding = parts.next().unwrap_or("").trim().to_ascii_lowercase();
                if coding.is_empty() {
                    continue;
                }
                let mut q = Some(1000);
                for p in parts {
                    if let Some((k, v)) = p.split_once('=') {
                        if k.trim().eq_ignore_ascii_case("q") {
                            q = qvalue(v);
                        }
                    }
                }
                let Some(q) = q else { continue };
                let slot = match coding.as_str() {
                    "gzip" | "x-gzip" => &mut ae.codecs[Codec::Gzip.index()],
                    "br" => &mut ae.codecs[Codec::Brotli.index()],
                    "zstd" => &mut ae.codecs[Codec::Zstd.index()],
                    "identity" => &mut ae.identity,
                    "*" => &mut ae.star,
                    _ => continue,
                };
                // a coding listed twice: the higher weight
                *slot = Some(slot.map_or(q, |o| o.max(q)));
            }
        }
        ae
    }

    /// The weight of `codec`: its own, else that of `*`, else 0 (not acceptable).
    pub fn weight(&self, codec: Codec) -> u16 {
        self.codecs[codec.index()].or(self.star).unwrap_or(0)
    }

    /// The weight of `identity`: its own, else that of `*` when `*` refuses it, else
    /// acceptable (RFC 9110: identity is acceptable unless excluded).
    pub fn identity_weight(&self) -> u16 {
        match (self.identity, self.star) {
            (Some(q), _) => q,
            (None, Some(0)) => 0,
            _ => 1000,
        }
    }

    /// The codecs the client accepts, best first: by the client's weight, ties broken by
    /// the server's `preference` order. Codecs not in `preference` are never chosen.
    pub fn ranked(&self, preference: &[Codec]) -> Vec<Codec> {
        let mut v: Vec<(u16, usize, Codec)> = preference
            .iter()
            .enumerate()
            .map(|(i, &c)| (self.weight(c), i, c))
            .filter(|(w, _, _)| *w > 0)
            .collect();
        v.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        v.into_iter().map(|(_, _, c)| c).collect()
    }

    /// The coding to send: the best acceptable codec, unless the client gives `identity`
    /// (by name or through `*`) a higher weight (or accepts no codec). `None`: send the
    /// identity. An identity that is only implicitly acceptable does not compete: a client
    /// that lists `br;q=0.8` and nothing else still prefers br.
    pub fn choose(&self, preference: &[Codec]) -> Option<Codec> {
        let best = *self.ranked(preference).first()?;
        let identity = self.identity.or(self.star).unwrap_or(0);
        (self.weight(best) >= identity).then_some(best)
    }
}

/// Negotiates from the request's `Accept-Encoding` values: `None` (no header, or nothing
/// acceptable) means identity.
pub fn negotiate<'a>(
    values: impl IntoIterator<Item = &'a str>,
    preference: &[Codec],
) -> Option<Codec> {
    AcceptEncoding::parse(values).choose(preference)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Codec::*;

    const PREF: [Codec; 3] = [Zstd, Brotli, Gzip];

    fn n(h: &str) -> Option<Codec> {
        negotiate([h], &PREF)
    }

    #[test]
    fn plain_lists_follow_server_preference() {
        assert_eq!(n("gzip"), Some(Gzip));
        assert_eq!(n("gzip, deflate, br"), Some(Brotli));
        assert_eq!(n("gzip, deflate, br, zstd"), Some(Zstd));
        assert_eq!(n("GZIP"), Some(Gzip));
        assert_eq!(n("x-gzip"), Some(Gzip));
        assert_eq!(n("deflate"), None);
        assert_eq!(n(""), None);
        assert_eq!(negotiate([], &PREF), None);
        assert_eq!(negotiate(["gzip, br"], &[Gzip, Brotli]), Some(Gzip));
        // a codec the server does not offer is never chosen
        assert_eq!(negotiate(["br"], &[Gzip]), None);
    }

    #[test]
    fn q_values() {
        assert_eq!(n("gzip;q=1.0, br;q=0.5"), Some(Gzip));
        assert_eq!(n("gzip;q=0.2, br;q=0.8, zstd;q=0.5"), Some(Brotli));
        assert_eq!(n("gzip; q=0.999, zstd;Q=1"), Some(Zstd));
        assert_eq!(n("br;q=0, gzip"), Some(Gzip));
        assert_eq!(n("gzip;q=0"), None);
        // malformed weights: the element is ignored
        assert_eq!(n("br;q=2, gzip;q=0.5"), Some(Gzip));
        assert_eq!(n("br;q=abc"), None);
        assert_eq!(n("br;q=0.1234"), None);
        // listed twice: the higher weight wins
        assert_eq!(n("gzip;q=0, gzip;q=0.5"), Some(Gzip));
    }

    #[test]
    fn star_and_identity() {
        assert_eq!(n("*"), Some(Zstd));
        assert_eq!(n("*;q=0.5, zstd;q=0"), Some(Brotli));
        assert_eq!(n("*;q=0"), None);
        assert_eq!(n("identity"), None);
        assert_eq!(n("identity;q=1, gzip;q=0.5"), None);
        assert_eq!(n("identity;q=0.5, gzip;q=1"), Some(Gzip));
        assert_eq!(n("identity;q=0, gzip"), Some(Gzip));
        // equal weights: compression is preferred
        assert_eq!(n("identity, gzip"), Some(Gzip));
        let ae = AcceptEncoding::parse(["*;q=0"]);
        assert_eq!(ae.identity_weight(), 0);
        let ae = AcceptEncoding::parse(["*;q=0, identity"]);
        assert_eq!(ae.identity_weight(), 1000);
        assert_eq!(AcceptEncoding::parse(["gzip"]).identity_weight(), 1000);
    }

    #[test]
    fn ranking_and_multiple_header_lines() {
        let ae = AcceptEncoding::parse(["gzip;q=0.5", "br;q=0.9, zstd;q=0.5"]);
        assert_eq!(ae.ranked(&PREF), vec![Brotli, Zstd, Gzip]);
        assert_eq!(ae.weight(Gzip), 500);
    }
}
