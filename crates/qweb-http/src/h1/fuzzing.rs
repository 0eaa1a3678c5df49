//! Fuzz entry points for the HTTP/1.1 wire layer (the `cargo fuzz` targets in
//! `crates/qweb-server/fuzz` call them): arbitrary bytes through the head parser and the body
//! decoder, with the layer's rules checked by assertions, so that a broken rule is a crash, not
//! only a panic inside the parser. Not an API: re-exported as `qweb_server::fuzzing`, hidden.

use std::collections::BTreeMap;

use bytes::BytesMut;
use http::header::{self, HeaderMap, HeaderName};
use http::{Method, Version};

use super::decode::{BodyError, Decoded, Decoder};
use super::parse::{
    content_length, head_end, parse, skip_empty_lines, Framing, Head, HeadError, HeadLimits,
};

/// The first line-feed-terminated blank line of `buf`: the end of a head, computed the naive way.
fn naive_head_end(buf: &[u8]) -> Option<usize> {
    (0..buf.len()).find_map(|i| {
        if buf[i] != b'\n' {
            return None;
        }
        match (buf.get(i + 1), buf.get(i + 2)) {
            (Some(b'\n'), _) => Some(i + 2),
            (Some(b'\r'), Some(b'\n')) => Some(i + 3),
            _ => None,
        }
    })
}

/// The fields of an accepted head, read from its bytes independently of the parser: names
/// lowercased, values without the whitespace around them, in order per name.
fn raw_fields(head: &[u8]) -> BTreeMap<Vec<u8>, Vec<Vec<u8>>> {
    let mut fields: BTreeMap<Vec<u8>, Vec<Vec<u8>>> = BTreeMap::new();
    for line in head.split(|&b| b == b'\n').skip(1) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            break;
        }
        let colon = line
            .iter()
            .position(|&b| b == b':')
            .expect("an accepted field has a colon");
        let value = line[colon + 1..].trim_ascii_start();
        let value = value
            .iter()
            .rposition(|&b| b != b' ' && b != b'\t')
            .map_or(&[][..], |e| &value[..=e]);
        fields
            .entry(line[..colon].to_ascii_lowercase())
            .or_default()
            .push(value.to_vec());
    }
    fields
}

/// Head limits chosen by a byte: both limits small and large, and the field limit on both
/// sides of the parser's stack buffer (64).
fn limits(b: u8) -> HeadLimits {
    HeadLimits {
        max_size: if b & 0x40 != 0 { 200 } else { 64 * 1024 },
        max_fields: [3, 64, 65, 100][usize::from(b >> 4 & 3)],
    }
}

/// A request head from arbitrary bytes. `data[0]` chooses the piece size in which
/// `head_end` is fed (1 to 16 bytes) and the limits; the rest is the input. Checks:
/// empty lines are skipped and nothing else; `head_end` fed in pieces finds the end it finds
/// fed whole, which is the first blank line; `parse` does not panic, and what it accepts agrees
/// with the input's fields (framing, `Content-Length`, keep-alive, `Expect`, `Upgrade`,
/// limits), or its refusal is one the limits and the input explain.
pub fn head(data: &[u8]) {
    let Some((&first, input)) = data.split_first() else {
        return;
    };
    let step = usize::from(first & 0x0f) + 1;
    let limits = limits(first);

    let mut buf = BytesMut::from(input);
    let skipped = skip_empty_lines(&mut buf);
    assert!(input[..skipped].iter().all(|&b| b == b'\r' || b == b'\n'));
    assert!(!matches!(buf.first(), Some(b'\r' | b'\n')));

    let mut searched = 0;
    let whole = head_end(&buf, &mut searched);
    assert_eq!(
        whole,
        naive_head_end(&buf),
        "head_end finds the first blank line"
    );
    let mut searched = 0;
    let mut pieces = None;
    let mut n = 0;
    while n < buf.len() {
        n = (n + step).min(buf.len());
        let before = searched;
        pieces = head_end(&buf[..n], &mut searched);
        if pieces.is_some() {
            break;
        }
        assert!(
            before <= searched && searched <= n,
            "search resumes within what was read"
        );
    }
    assert_eq!(pieces, whole, "head_end fed {step} bytes at a time");
    let Some(end) = whole else {
        return;
    };

    let raw = buf[..end].to_vec();
    let len = buf.len();
    let result = parse(&mut buf, end, limits);
    match result {
        Err(HeadError::TooLarge(max)) => {
            assert_eq!(max, limits.max_size);
            assert!(end > max);
        }
        Err(HeadError::TooManyFields(max)) => assert_eq!(max, limits.max_fields),
        Err(e) => {
            assert!(end <= limits.max_size, "{e}");
            let want = if e == HeadError::Version { 505 } else { 400 };
            assert!(e.status() == want || e == HeadError::TargetTooLong, "{e}");
        }
        Ok(h) => {
            assert!(end <= limits.max_size);
            assert_eq!(
                buf.len(),
                len - end,
                "parse takes the head, and only the head"
            );
            check_accepted(&h, &raw, limits);
        }
    }
}

/// What [`head`] checks of a head `parse` accepted: its fields, request line, framing,
/// keep-alive, `Expect` and `Upgrade` agree with the raw head `raw`.
fn check_accepted(h: &Head, raw: &[u8], limits: HeadLimits) {
    let fields = raw_fields(raw);
    let count: usize = fields.values().map(Vec::len).sum();
    assert!(count <= limits.max_fields);
    assert_eq!(h.parts.headers.len(), count, "every field is kept");
    for (name, values) in &fields {
        let got: Vec<&[u8]> = h
            .parts
            .headers
            .get_all(HeaderName::from_bytes(name).expect("a field name"))
            .iter()
            .map(|v| v.as_bytes())
            .collect();
        assert_eq!(
            got,
            values.iter().map(Vec::as_slice).collect::<Vec<_>>(),
            "{name:?}"
        );
    }
    let line = raw.split(|&b| b == b'\n').next().unwrap_or_default();
    assert!(
        line.starts_with(h.parts.method.as_str().as_bytes()),
        "the method is the line's first token"
    );
    assert!(
        matches!(h.parts.version, Version::HTTP_10 | Version::HTTP_11),
        "only HTTP/1.x is accepted"
    );

    let get = |n: &str| fields.get(n.as_bytes());
    let te = get("transfer-encoding").is_some();
    let cl = get("content-length");
    assert_eq!(
        h.framing == Framing::Chunked,
        te,
        "chunked iff Transfer-Encoding"
    );
    if te {
        assert_eq!(
            h.parts.version,
            Version::HTTP_11,
            "Transfer-Encoding only in HTTP/1.1"
        );
        if cl.is_some() {
            assert!(
                !h.keep_alive,
                "Transfer-Encoding with Content-Length never kept alive"
            );
        }
    } else {
        let n = match cl {
            None => 0,
            Some(values) => {
                let n = content_length(&values[0]).expect("an accepted Content-Length is digits");
                assert!(
                    values.iter().all(|v| content_length(v) == Some(n)),
                    "one length"
                );
                n
            }
        };
        let want = if n == 0 {
            Framing::Empty
        } else {
            Framing::Length(n)
        };
        assert_eq!(h.framing, want);
    }
    let tokens = |n: &str| -> Vec<Vec<u8>> {
        get(n)
            .into_iter()
            .flatten()
            .flat_map(|v| v.split(|&b| b == b','))
            .map(|t| t.trim_ascii().to_ascii_lowercase())
            .collect()
    };
    let connection = tokens("connection");
    let close = connection.iter().any(|t| t == b"close");
    let keep = connection.iter().any(|t| t == b"keep-alive");
    let want_keep =
        !close && (h.parts.version == Version::HTTP_11 || keep) && !(te && cl.is_some());
    assert_eq!(h.keep_alive, want_keep, "keep-alive");
    let expect =
        get("expect").is_some_and(|v| v.iter().any(|v| v.eq_ignore_ascii_case(b"100-continue")));
    assert_eq!(
        h.expect_continue,
        expect && h.parts.version == Version::HTTP_11 && h.framing != Framing::Empty,
        "expect_continue"
    );
    assert_eq!(h.te_trailers, tokens("te").iter().any(|t| t == b"trailers"));
    assert_eq!(
        h.upgrade,
        h.parts.method == Method::CONNECT || h.parts.headers.contains_key(header::UPGRADE)
    );
}

/// What decoding one body gave: its data, its trailers, and how it ended (the bytes left
/// after it, or the error).
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    data: Vec<u8>,
    trailers: Option<Vec<(String, Vec<u8>)>>,
    end: Result<usize, BodyError>,
}

fn trailer_list(map: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    map.iter()
        .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
        .collect()
}

/// Decodes `input` with a decoder for `framing`, fed `step` bytes at a time (the client's
/// end of stream with the last piece).
fn decode_in_pieces(framing: Framing, max_trailers: usize, input: &[u8], step: usize) -> Outcome {
    let mut d = Decoder::new(framing, max_trailers);
    let mut buf = BytesMut::new();
    let mut out = Outcome {
        data: Vec::new(),
        trailers: None,
        end: Ok(0),
    };
    let mut fed = 0;
    // every call takes bytes, asks for more, or ends: bounded by the input
    for _ in 0..=4 * input.len() + 8 {
        let eof = fed == input.len();
        match d.decode(&mut buf, eof) {
            Err(e) => {
                out.end = Err(e);
                return out;
            }
            Ok(Decoded::Data(b)) => {
                assert!(!b.is_empty(), "no empty data");
                out.data.extend_from_slice(&b);
                assert!(out.data.len() <= fed, "data never exceeds the input read");
                if let Framing::Length(n) = framing {
                    assert!(out.data.len() as u64 <= n, "never more than Content-Length");
                    assert_eq!(d.remaining(), Some(n - out.data.len() as u64));
                }
            }
            Ok(Decoded::Trailers(t)) => {
                assert_eq!(framing, Framing::Chunked, "trailers only in chunked bodies");
                assert!(d.is_done());
                out.trailers = Some(trailer_list(&t));
                out.end = Ok(buf.len() + input.len() - fed);
                return out;
            }
            Ok(Decoded::End) => {
                assert!(d.is_done());
                out.end = Ok(buf.len() + input.len() - fed);
                return out;
            }
            Ok(Decoded::More) => {
                assert!(!eof, "More at the end of stream is an error");
                let n = step.min(input.len() - fed);
                buf.extend_from_slice(&input[fed..fed + n]);
                fed += n;
            }
        }
    }
    panic!("the decoder made no progress");
}

/// A request body from arbitrary bytes. `data[0]` chooses the framing (chunked, or a length
/// from `data[1..3]`, sometimes huge), `data[3]` the piece size and the trailer limit; the rest
/// is the body. Fed whole, in pieces and byte by byte, the decoder gives the same data, trailers,
/// bytes left over and error; data never exceeds the input; a length body gives at most its
/// length, exactly its bytes, and ends where they end.
pub fn body(data: &[u8]) {
    let [mode, a, b, c, input @ ..] = data else {
        return;
    };
    let n = u64::from(u16::from_le_bytes([*a, *b]));
    let framing = match mode % 4 {
        0 | 1 => Framing::Chunked,
        2 => Framing::Length(n),
        _ => Framing::Length(u64::MAX - n),
    };
    let step = usize::from(c & 0x1f) + 1;
    let max_trailers = [16, 64, 1024, 16 * 1024][usize::from(c >> 5 & 3)];
    let framing = if framing == Framing::Length(0) {
        Framing::Empty
    } else {
        framing
    };

    let whole = decode_in_pieces(framing, max_trailers, input, input.len().max(1));
    for step in [step, 1] {
        let got = decode_in_pieces(framing, max_trailers, input, step);
        assert_eq!(got, whole, "fed {step} bytes at a time");
    }
    assert!(whole.data.len() <= input.len());
    match framing {
        Framing::Length(n) => {
            let take = usize::try_from(n).unwrap_or(usize::MAX).min(input.len());
            assert_eq!(whole.data, &input[..take], "a length body is its bytes");
            let want = if take as u64 == n {
                Ok(input.len() - take)
            } else {
                Err(BodyError::Truncated)
            };
            assert_eq!(whole.end, want);
        }
        Framing::Empty => assert_eq!(
            whole,
            Outcome {
                data: Vec::new(),
                trailers: None,
                end: Ok(input.len())
            }
        ),
        Framing::Chunked => {
            if let Ok(left) = whole.end {
                assert!(whole.data.len() + left <= input.len());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_entry_points_take_what_the_fuzzer_may_send() {
        for h in [
            &b"\x00GET / HTTP/1.1\r\nHost: a\r\n\r\n"[..],
            b"\x0f\r\n\nPOST /x HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
            b"\x31POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
            b"\x45GET / HTTP/1.0\nConnection: keep-alive\nExpect: 100-continue\n\n",
            b"\x02GET / HTTP/1.1\r\nA: b\r\n c\r\n\r\n",
            b"",
            b"\x00",
            // the fuzzer's first find: 4 fields passed a limit of 3 (limits under the parser's
            // stack buffer of 64 fields were not checked)
            b"AGET / HTTP/1.0\nConnection: keep-alivm\nTE: trailers\nUpgon: keep-alivm\nTE: trailerrade: x\n\n",
        ] {
            head(h);
        }
        for b in [
            &b"\x00\x00\x00\x005\r\nhello\r\n0\r\nX-T: 1\r\n\r\nNEXT"[..],
            b"\x00\x00\x00\x07",
            b"\x02\x05\x00\x02helloGET",
            b"\x02\x05\x00\x02hel",
            b"\x03\x00\x00\x00abc",
            b"\x01\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\r\n",
        ] {
            body(b);
        }
    }
}
