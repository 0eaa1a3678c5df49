//! Access-log field escaping, as nginx does (`escape=default`): `"`, `\`, control bytes,
//! DEL and non-ASCII bytes become `\xHH`, so a request cannot forge log fields or lines.

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
