//! Deterministic test bodies shared by the tests and the upstreams: compressible text,
//! incompressible bytes, the `/big` byte pattern.
//!
//! ```
//! let t = qweb_testkit::corpus::text(5000);
//! assert_eq!(t.len(), 5000);
//! assert_eq!(qweb_testkit::corpus::random(16, 7), qweb_testkit::corpus::random(16, 7));
//! ```

/// `n` bytes of English-like text (compressible; deterministic).
pub fn text(n: usize) -> Vec<u8> {
    let words = [
        "alpha",
        "bravo",
        "charlie",
        "delta",
        "echo",
        "foxtrot",
        "golf",
        "hotel",
        "india",
        "<li class=\"x\">",
        "</li>",
        "offload",
        "engine",
        "stream",
        "chunk",
        "worker",
    ];
    let mut out = Vec::with_capacity(n + 32);
    let mut x: u64 = 0x2545f4914f6cdd1d;
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(words[(x % words.len() as u64) as usize].as_bytes());
        out.push(match x % 9 {
            0 => b'\n',
            _ => b' ',
        });
    }
    out.truncate(n);
    out
}

/// `n` pseudo-random bytes (incompressible; deterministic per `seed`).
pub fn random(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// The body of `/encoded`.
pub const ENCODED: &[u8] = b"already-encoded-bytes-from-the-upstream";

/// The byte at `i` of the `/big` pattern.
pub fn pattern(i: usize) -> u8 {
    (i % 251) as u8
}
