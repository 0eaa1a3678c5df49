//! Response header blocks in HPACK (RFC 7541) without the dynamic table, as nginx writes
//! them: `:status` indexed when the static table has it, every field a literal "without
//! indexing" (never indexed for cookies and credentials) whose name is the static table's
//! where it has one, values as they are (no Huffman). The encoder keeps no state but one
//! pending table-size update, so a response's block costs a copy of its fields: h2's
//! encoder, which indexes, cost 5 300 instructions a response of a static file's 8 fields
//! (issue 37), for some 150 bytes less on the wire.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::StatusCode;

/// Appends `value` as an HPACK integer with an `n`-bit prefix, the prefix's other bits
/// being `first`'s (RFC 7541 section 5.1).
#[inline]
fn put_int(dst: &mut Vec<u8>, n: u32, first: u8, value: usize) {
    let max = (1usize << n) - 1;
    if value < max {
        dst.push(first | value as u8);
        return;
    }
    dst.push(first | max as u8);
    let mut rest = value - max;
    while rest >= 128 {
        dst.push((rest % 128) as u8 | 0x80);
        rest /= 128;
    }
    dst.push(rest as u8);
}

/// A string literal, not Huffman-coded.
#[inline]
fn put_str(dst: &mut Vec<u8>, s: &[u8]) {
    put_int(dst, 7, 0, s.len());
    dst.extend_from_slice(s);
}

/// The static table's index of `name` (RFC 7541 appendix A), for the fields a response
/// carries.
fn static_name(name: &HeaderName) -> Option<usize> {
    Some(match *name {
        header::ACCEPT_RANGES => 18,
        header::ACCESS_CONTROL_ALLOW_ORIGIN => 20,
        header::AGE => 21,
        header::ALLOW => 22,
        header::CACHE_CONTROL => 24,
        header::CONTENT_DISPOSITION => 25,
        header::CONTENT_ENCODING => 26,
        header::CONTENT_LANGUAGE => 27,
        header::CONTENT_LENGTH => 28,
        header::CONTENT_LOCATION => 29,
        header::CONTENT_RANGE => 30,
        header::CONTENT_TYPE => 31,
        header::DATE => 33,
        header::ETAG => 34,
        header::EXPIRES => 36,
        header::LAST_MODIFIED => 44,
        header::LINK => 45,
        header::LOCATION => 46,
        header::PROXY_AUTHENTICATE => 48,
        header::REFRESH => 52,
        header::RETRY_AFTER => 53,
        header::SERVER => 54,
        header::SET_COOKIE => 55,
        header::STRICT_TRANSPORT_SECURITY => 56,
        header::VARY => 59,
        header::VIA => 60,
        header::WWW_AUTHENTICATE => 61,
        _ => return None,
    })
}

/// One field: a literal without indexing, or never indexed for what must not be kept by
/// an intermediary's table (RFC 7541 section 7.1.3).
fn put_field(dst: &mut Vec<u8>, name: &HeaderName, value: &HeaderValue) {
    let never = matches!(
        *name,
        header::SET_COOKIE | header::AUTHORIZATION | header::PROXY_AUTHORIZATION
    ) || value.is_sensitive();
    let first = if never { 0x10 } else { 0x00 };
    match static_name(name) {
        Some(i) => put_int(dst, 4, first, i),
        None => {
            dst.push(first);
            put_str(dst, name.as_str().as_bytes());
        }
    }
    put_str(dst, value.as_bytes());
}

/// A response's header block (`status` then `fields`, without the connection-specific
/// ones, RFC 9113 section 8.2.2) into `dst`, with what this layer writes unless `fields`
/// have it (as the HTTP/1 encoder does): `Server`, `Date` and, when the body's exact length
/// is known (`length`), `Content-Length`; none of them on a 1xx. `table_update`: the block
/// starts by setting the (unused) dynamic table's size to 0, as it must once after the
/// client lowered SETTINGS_HEADER_TABLE_SIZE.
pub(crate) fn response_head(
    dst: &mut Vec<u8>,
    status: StatusCode,
    fields: &HeaderMap,
    length: Option<u64>,
    table_update: bool,
) {
    if table_update {
        dst.push(0x20);
    }
    match status.as_u16() {
        200 => dst.push(0x80 | 8),
        204 => dst.push(0x80 | 9),
        206 => dst.push(0x80 | 10),
        304 => dst.push(0x80 | 11),
        400 => dst.push(0x80 | 12),
        404 => dst.push(0x80 | 13),
        500 => dst.push(0x80 | 14),
        _ => {
            put_int(dst, 4, 0, 8);
            put_str(dst, status.as_str().as_bytes());
        }
    }
    let seen = put_fields(dst, fields);
    if status.is_informational() {
        return;
    }
    if let (Some(n), false) = (length, seen.length) {
        put_int(dst, 4, 0, 28);
        put_str(dst, itoa::Buffer::new().format(n).as_bytes());
    }
    if !seen.server {
        put_int(dst, 4, 0, 54);
        put_str(dst, crate::response::SERVER.as_bytes());
    }
    if !seen.date {
        put_int(dst, 4, 0, 33);
        crate::h1::encode::with_date(|d| put_str(dst, d));
    }
}

/// A trailer block (no pseudo-fields).
pub(crate) fn trailers(dst: &mut Vec<u8>, fields: &HeaderMap, table_update: bool) {
    if table_update {
        dst.push(0x20);
    }
    put_fields(dst, fields);
}

/// Which of the fields this layer adds a block had.
#[derive(Default)]
struct Seen {
    date: bool,
    server: bool,
    length: bool,
}

fn put_fields(dst: &mut Vec<u8>, fields: &HeaderMap) -> Seen {
    let mut seen = Seen::default();
    for (name, value) in fields {
        match *name {
            header::DATE => seen.date = true,
            header::SERVER => seen.server = true,
            header::CONTENT_LENGTH => seen.length = true,
            _ => {}
        }
        if !crate::fields::is_connection_specific(name) {
            put_field(dst, name, value);
        }
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;

    /// What h2's decoder reads back.
    fn decode(block: &[u8]) -> Vec<(String, String)> {
        let mut d = h2::hpack::Decoder::new(4096);
        let mut buf = BytesMut::from(block);
        let mut got = Vec::new();
        d.decode(&mut std::io::Cursor::new(&mut buf), |h| {
            let name = String::from_utf8_lossy(h.name().as_slice()).into_owned();
            let value = String::from_utf8_lossy(h.value_slice()).into_owned();
            got.push((name, value));
            std::ops::ControlFlow::Continue(())
        })
        .expect("a valid block");
        got
    }

    #[test]
    fn a_response_reads_back_whole_without_its_connection_fields() {
        let mut fields = HeaderMap::new();
        fields.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        fields.insert(header::CONNECTION, HeaderValue::from_static("close"));
        fields.append(header::SET_COOKIE, HeaderValue::from_static("a=1"));
        fields.append(header::SET_COOKIE, HeaderValue::from_static("b=2"));
        fields.insert("x-long-name-of-a-field", HeaderValue::from_static("v"));
        let long = "x".repeat(300);
        fields.insert(header::ETAG, HeaderValue::from_str(&long).unwrap());
        for (status, table, length) in [
            (200, false, Some(42)),
            (418, true, None),
            (404, false, None),
        ] {
            let mut b = Vec::new();
            response_head(
                &mut b,
                StatusCode::from_u16(status).unwrap(),
                &fields,
                length,
                table,
            );
            let got = decode(&b);
            assert_eq!(got[0], (":status".into(), status.to_string()));
            let mut want: Vec<(String, String)> = vec![
                ("content-type".into(), "text/plain".into()),
                ("set-cookie".into(), "a=1".into()),
                ("set-cookie".into(), "b=2".into()),
                ("x-long-name-of-a-field".into(), "v".into()),
                ("etag".into(), long.clone()),
            ];
            if let Some(n) = length {
                want.push(("content-length".into(), n.to_string()));
            }
            want.push(("server".into(), "qweb".into()));
            assert_eq!(got[1..got.len() - 1].to_vec(), want);
            let (name, date) = &got[got.len() - 1];
            assert_eq!(name, "date");
            assert!(httpdate::parse_http_date(date).is_ok(), "{date}");
        }
    }

    /// `Server`, `Date` and `Content-Length` are added only where the fields lack them,
    /// and never to an interim response.
    #[test]
    fn the_layers_own_fields_are_added_once_and_not_to_a_1xx() {
        let mut fields = HeaderMap::new();
        fields.insert(header::SERVER, HeaderValue::from_static("upstream"));
        fields.insert(
            header::DATE,
            HeaderValue::from_static("Thu, 01 Jan 1970 00:00:00 GMT"),
        );
        fields.insert(header::CONTENT_LENGTH, HeaderValue::from_static("7"));
        let mut b = Vec::new();
        response_head(&mut b, StatusCode::OK, &fields, Some(9), false);
        let got = decode(&b);
        assert_eq!(
            got[1..].to_vec(),
            vec![
                ("server".to_string(), "upstream".to_string()),
                ("date".into(), "Thu, 01 Jan 1970 00:00:00 GMT".into()),
                ("content-length".into(), "7".into()),
            ]
        );
        let mut b = Vec::new();
        response_head(&mut b, StatusCode::CONTINUE, &HeaderMap::new(), None, false);
        assert_eq!(decode(&b), vec![(":status".to_string(), "100".to_string())]);
    }

    #[test]
    fn integers_past_their_prefix_continue_in_septets() {
        // RFC 7541 appendix C.1.2: 1337 with a 5-bit prefix
        let mut b = Vec::new();
        put_int(&mut b, 5, 0, 1337);
        assert_eq!(b, [31, 154, 10]);
    }
}
