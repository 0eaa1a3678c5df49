//! The access log: one line per request on stdout (target `qweb::access`), written when the
//! response is finished or abandoned:
//!
//! `<client> "<method> <target> <protocol>" <status> <body bytes> <ms to last byte>[ aborted]`
//!
//! `aborted` marks a response whose body did not go out whole (the client went away, the send
//! timeout or an upstream error cut it); its byte count is what was handed to the connection.
//! Requests that hyper's HTTP/1 parser refused before qweb saw them are logged as
//! `<client> "-" <status> 0 0.000ms refused`. Fields are escaped as nginx does
//! (`escape=default`): `"`, `\`, control bytes, DEL and non-ASCII bytes become `\xHH`, so a
//! request cannot forge log fields or lines.

use std::net::SocketAddr;

/// Logs a request refused by the parser (its head never reached the service).
pub(crate) fn refused(peer: SocketAddr, status: u16) {
    tracing::info!(target: "qweb::access", "{peer} \"-\" {status} 0 0.000ms refused");
}

/// `s` with every byte outside printable ASCII, and `"` and `\`, written as `\xHH`.
pub(crate) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\' {
            out.push(b as char);
        } else {
            out.push_str(&format!("\\x{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn escapes_quotes_backslashes_and_controls() {
        assert_eq!(super::escape("/a b?c=d"), "/a b?c=d");
        assert_eq!(super::escape("/\"x\\y\n"), "/\\x22x\\x5Cy\\x0A");
        assert_eq!(super::escape("/é"), "/\\xC3\\xA9");
    }
}
