//! HTTP primitives, the bottom layer: response bodies, generated responses, request-path
//! normalisation, request rules, connection-specific and trailer fields (`fields`), and
//! HTTP/1.1 and HTTP/2 on the wire without I/O (`h1`, `h2`). Depends on no other qweb crate.

pub mod body;
pub mod fields;
pub mod h1;
pub mod h2;
pub mod path;
pub mod request_body;
pub mod request_rules;
pub mod response;

/// Standard base64 (RFC 4648, with padding): `Sec-WebSocket-Key`s, CSP hashes.
pub fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in data.chunks(3) {
        let b = [c[0], *c.get(1).unwrap_or(&0), *c.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for k in 0..4 {
            if k <= c.len() {
                out.push(T[(n >> (18 - 6 * k) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}
