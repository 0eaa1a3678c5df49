//! Differential test of the head parser against an independent one, Python's `h11` (it comes
//! with httpx, which `.ci/run` installs). A seeded generator writes a few thousand request
//! heads, well-formed ones and mutations of them (duplicate or conflicting `Content-Length`,
//! `Transfer-Encoding` variants, whitespace before the colon, obs-fold, bare CR, bare LF, control
//! bytes, odd methods, targets and versions, long names); one `python3` process parses all of
//! them with h11. Both must accept or refuse alike and, when both accept, agree on the method,
//! target, version, fields (names lowercased, values) and body framing. Where the two differ by
//! design, the difference is a class listed in [`KNOWN`] with its reason; any other difference
//! fails the test.

use std::io::Write;
use std::process::{Command, Stdio};

use bytes::BytesMut;
use serde_json::{json, Value};

use super::parse::{head_end, parse, skip_empty_lines, Framing, HeadLimits};

/// Cases generated (deterministic: the seed is fixed).
const CASES: usize = 4000;

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// A head being generated: the request line, the field lines, each line's end.
struct Draft {
    prefix: Vec<u8>,
    method: Vec<u8>,
    target: Vec<u8>,
    version: Vec<u8>,
    /// Between method and target, and target and version.
    spaces: [&'static [u8]; 2],
    fields: Vec<Vec<u8>>,
    /// The line ends: request line, each field, the blank line.
    eol: Vec<&'static [u8]>,
}

impl Draft {
    fn render(&self) -> Vec<u8> {
        let mut out = self.prefix.clone();
        for part in [
            &self.method[..],
            self.spaces[0],
            &self.target,
            self.spaces[1],
            &self.version,
        ] {
            out.extend_from_slice(part);
        }
        let mut eol = self.eol.iter();
        out.extend_from_slice(eol.next().unwrap_or(&&b"\r\n"[..]));
        for f in &self.fields {
            out.extend_from_slice(f);
            out.extend_from_slice(eol.next().unwrap_or(&&b"\r\n"[..]));
        }
        out.extend_from_slice(eol.next().unwrap_or(&&b"\r\n"[..]));
        out
    }

    fn field(&mut self, rng: &mut Rng, line: &[u8]) {
        let at = rng.below(self.fields.len() + 1);
        self.fields.insert(at, line.to_vec());
    }
}

const MUTATIONS: &[&str] = &[
    "cl-same-twice",
    "cl-conflict",
    "cl-odd",
    "te",
    "te-twice",
    "te-cl",
    "ws-colon",
    "obs-fold",
    "bare-cr",
    "bare-lf",
    "all-lf",
    "ctl-value",
    "method",
    "target",
    "version",
    "spaces",
    "long-name",
    "odd-name",
    "leading-empty",
    "no-host",
    "two-hosts",
    "value-ws",
    "no-colon",
    "http10",
];

fn generate(rng: &mut Rng) -> (Vec<u8>, Vec<&'static str>) {
    let mut d = Draft {
        prefix: Vec::new(),
        method: rng
            .pick(&[
                "GET", "POST", "PUT", "HEAD", "DELETE", "OPTIONS", "PATCH", "CONNECT",
            ])
            .as_bytes()
            .to_vec(),
        target: rng
            .pick(&[
                "/",
                "/index.html",
                "/a/b?c=d&e",
                "/%7Euser/",
                "*",
                "/a;b,c",
                "http://h.example/x",
                "h.example:443",
            ])
            .as_bytes()
            .to_vec(),
        version: b"HTTP/1.1".to_vec(),
        spaces: [b" ", b" "],
        fields: vec![rng
            .pick(&["Host: example.com", "host: h.example:8443", "HOST:x"])
            .as_bytes()
            .to_vec()],
        eol: Vec::new(),
    };
    for _ in 0..rng.below(5) {
        let f = rng.pick(&[
            "Accept: */*",
            "User-Agent: test/1.0 (x; y)",
            "Accept-Encoding: gzip, br",
            "Connection: close",
            "Connection: keep-alive",
            "Cookie: a=b; c=d",
            "X-Empty:",
            "x-lower: v",
            "Content-Length: 0",
            "Content-Length: 12",
            "content-length: 7",
            "Transfer-Encoding: chunked",
            "Expect: 100-continue",
            "Upgrade: websocket",
            "X-Tab:\tv\t",
            "If-None-Match: \"abc\"",
            "X-Obs: caf\u{e9}",
        ]);
        let f = f.as_bytes().to_vec();
        // latin-1, not UTF-8, for the obs-text byte
        let f = if f.ends_with("\u{e9}".as_bytes()) {
            [&f[..f.len() - 2], &[0xe9][..]].concat()
        } else {
            f
        };
        d.field(rng, &f);
    }
    let mut tags = Vec::new();
    let n = if rng.chance(20) { 0 } else { 1 + rng.below(2) };
    for _ in 0..n {
        let m = rng.pick(MUTATIONS);
        tags.push(m);
        match m {
            "cl-same-twice" => {
                let v = rng.pick(&["0", "5", "12"]);
                d.field(rng, format!("Content-Length: {v}").as_bytes());
                d.field(rng, format!("content-length: {v}").as_bytes());
            }
            "cl-conflict" => {
                d.field(rng, b"Content-Length: 5");
                d.field(rng, b"Content-Length: 6");
            }
            "cl-odd" => {
                let v = rng.pick(&[
                    "+5",
                    "-1",
                    "5 5",
                    "5, 5",
                    "5,6",
                    "05",
                    "0x5",
                    "  5  ",
                    "",
                    "99999999999999999999",
                    "1e3",
                    "5\t",
                    "18446744073709551615",
                    "9999999999999999999",
                    "\u{b3}",
                ]);
                d.field(rng, format!("Content-Length: {v}").as_bytes());
            }
            "te" | "te-twice" | "te-cl" => {
                let values = [
                    "chunked",
                    "Chunked",
                    "CHUNKED",
                    "  chunked",
                    "gzip, chunked",
                    "chunked, gzip",
                    "identity",
                    "gzip",
                    "chunked,",
                    ",chunked",
                    "chunked;q=1",
                    "x-custom, chunked",
                    "",
                    "chunked, chunked",
                ];
                let v = if m == "te" {
                    rng.pick(&values)
                } else {
                    "chunked"
                };
                d.field(rng, format!("Transfer-Encoding: {v}").as_bytes());
                if m == "te-twice" {
                    let v = rng.pick(&values);
                    d.field(rng, format!("Transfer-Encoding: {v}").as_bytes());
                }
                if m == "te-cl" {
                    d.field(rng, b"Content-Length: 5");
                }
            }
            "ws-colon" => {
                let f = rng.pick(&["X-A : v", "X-A\t: v", "Content-Length : 5", "Host :x"]);
                d.field(rng, f.as_bytes());
            }
            "obs-fold" => {
                let at = rng.below(d.fields.len() + 1);
                d.fields.insert(
                    at,
                    rng.pick(&[&b" folded"[..], b"\tfolded", b"  ", b" a: b"])
                        .to_vec(),
                );
            }
            "bare-cr" => {
                let f: &[u8] = rng.pick(&[&b"X-A: a\rb"[..], b"X-A: a\r", b"X\r-A: b"]);
                d.field(rng, f);
            }
            "bare-lf" => {
                let lines = 2 + d.fields.len();
                d.eol = vec![&b"\r\n"[..]; lines];
                d.eol[rng.below(lines)] = b"\n";
            }
            "all-lf" => d.eol = vec![&b"\n"[..]; 2 + d.fields.len()],
            "ctl-value" => {
                let c = rng.pick(&[
                    0x00u8, 0x01, 0x08, 0x0b, 0x0c, 0x1b, 0x1f, 0x7f, 0x80, 0xa0, 0xff,
                ]);
                let mut f = b"X-Ctl: a".to_vec();
                match rng.below(3) {
                    0 => f.push(c),
                    1 => f.extend_from_slice(&[c, b'b']),
                    _ => f.insert(7, c),
                }
                d.field(rng, &f);
            }
            "method" => {
                d.method = rng
                    .pick(&[
                        &b"get"[..],
                        b"G@T",
                        b"M-SEARCH",
                        b"PROPFIND",
                        b"X~Y!#$%&'*+.^_`|",
                        b"",
                        b"G\x01T",
                        b"\xc3\x80",
                        b"GET/",
                    ])
                    .to_vec();
            }
            "target" => {
                let long = format!("/{}", "a".repeat(9000));
                let t: &str = rng.pick(&[
                    "/a b",
                    "/\x7f",
                    "/\x01",
                    "/\u{e9}",
                    "http://h.example/x?y#z",
                    "/x#frag",
                    "//x",
                    "/%zz",
                    "/?#",
                    "",
                    "/a\\b",
                    "/{}|^`",
                    "/\"<>",
                    long.as_str(),
                    "ab",
                    "/a?b?c",
                ]);
                d.target = t.as_bytes().to_vec();
            }
            "version" => {
                d.version = rng
                    .pick(&[
                        &b"HTTP/1.2"[..],
                        b"HTTP/2.0",
                        b"HTTP/0.9",
                        b"http/1.1",
                        b"HTTP/1.1 ",
                        b"HTTP/1",
                        b"HTTP/10.1",
                        b"HTTP/1.10",
                        b"HTTP/1.1\t",
                        b"",
                        b"HTTP/3.0",
                        b"HTTP/1.0 x",
                    ])
                    .to_vec();
            }
            "spaces" => {
                let s: &[&[u8]] = &[b"  ", b"\t", b" \t"];
                d.spaces[rng.below(2)] = rng.pick(s);
            }
            "long-name" => {
                let n = rng.pick(&[100, 1000, 4000]);
                d.field(rng, format!("X-{}: v", "n".repeat(n)).as_bytes());
            }
            "odd-name" => {
                let f: &[u8] = rng.pick(&[
                    &b": v"[..],
                    b"X(a): v",
                    b"X\x01: v",
                    b"X/Y: v",
                    b"X{}: v",
                    b"\xe9: v",
                    b"X\"Y: v",
                    b"!#$%&'*+-.^_`|~: v",
                ]);
                d.field(rng, f);
            }
            "leading-empty" => d.prefix = rng.pick(&[&b"\r\n"[..], b"\n", b"\r\n\r\n"]).to_vec(),
            "no-host" => d
                .fields
                .retain(|f| !f.to_ascii_lowercase().starts_with(b"host:")),
            "two-hosts" => d.field(rng, b"Host: other.example"),
            "value-ws" => {
                let f: &[u8] = rng.pick(&[
                    &b"X-W:   v  "[..],
                    b"X-W:\t\tv\t",
                    b"X-W:",
                    b"X-W: a  b",
                    b"X-W: \t ",
                ]);
                d.field(rng, f);
            }
            "no-colon" => d.field(rng, b"Foo bar"),
            "http10" => d.version = b"HTTP/1.0".to_vec(),
            _ => unreachable!("{m}"),
        }
    }
    (d.render(), tags)
}

/// Bytes as a string, one char per byte (Latin-1), as the Python side writes them.
fn latin1(b: &[u8]) -> String {
    b.iter().map(|&b| char::from(b)).collect()
}

/// What our parser makes of a head.
fn ours(input: &[u8]) -> Value {
    let mut buf = BytesMut::from(input);
    skip_empty_lines(&mut buf);
    let Some(end) = head_end(&buf, &mut 0) else {
        return json!({"ok": false, "why": "incomplete"});
    };
    let limits = HeadLimits {
        max_size: 64 * 1024,
        max_fields: 100,
    };
    match parse(&mut buf, end, limits) {
        Err(e) => json!({"ok": false, "why": e.to_string()}),
        Ok(h) => {
            let mut headers: Vec<(String, String)> = h
                .parts
                .headers
                .iter()
                .map(|(n, v)| (n.as_str().to_owned(), latin1(v.as_bytes())))
                .collect();
            headers.sort_by(|a, b| a.0.cmp(&b.0));
            let framing = match h.framing {
                Framing::Empty => "length 0".to_owned(),
                Framing::Length(n) => format!("length {n}"),
                Framing::Chunked => "chunked".to_owned(),
            };
            json!({
                "ok": true,
                "method": h.parts.method.as_str(),
                "target": latin1(h.parts.uri.to_string().as_bytes()),
                "version": if h.parts.version == http::Version::HTTP_11 { "1.1" } else { "1.0" },
                "headers": headers,
                "framing": framing,
            })
        }
    }
}

/// Parses each line's hex-encoded head with h11 and writes one JSON line per head.
const H11: &str = r#"
import sys, json, h11
from h11._connection import _body_framing
def s(b):
    return bytes(b).decode("latin-1")
for line in sys.stdin:
    data = bytes.fromhex(line.strip())
    c = h11.Connection(h11.SERVER)
    try:
        c.receive_data(data)
        ev = c.next_event()
        if ev is h11.NEED_DATA:
            out = {"ok": False, "why": "NEED_DATA"}
        else:
            kind, args = _body_framing(ev.method, ev)
            headers = sorted(([s(n), s(v)] for n, v in ev.headers), key=lambda f: f[0])
            out = {
                "ok": True,
                "method": s(ev.method),
                "target": s(ev.target),
                "version": s(ev.http_version),
                "headers": headers,
                "framing": "chunked" if kind == "chunked" else "length %d" % args[0],
            }
    except h11.RemoteProtocolError as e:
        out = {"ok": False, "why": str(e)}
    print(json.dumps(out))
"#;

fn h11(cases: &[(Vec<u8>, Vec<&str>)]) -> Vec<Value> {
    let mut py = Command::new("python3")
        .args(["-c", H11])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python3 runs");
    let mut input = String::new();
    for (bytes, _) in cases {
        for b in bytes {
            input.push_str(&format!("{b:02x}"));
        }
        input.push('\n');
    }
    let mut stdin = py.stdin.take().expect("stdin");
    let writer =
        std::thread::spawn(move || stdin.write_all(input.as_bytes()).expect("write to python3"));
    let out = py.wait_with_output().expect("python3 output");
    writer.join().expect("writer");
    assert!(out.status.success(), "h11 script failed");
    String::from_utf8(out.stdout)
        .expect("JSON is UTF-8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

/// A difference both sides are meant to have.
struct Known {
    /// What differs.
    class: &'static str,
    /// Why it is so.
    reason: &'static str,
    /// This difference is of the class: the head, our result, h11's.
    is: fn(&[u8], &Value, &Value) -> bool,
}

fn ok(v: &Value) -> bool {
    v["ok"] == true
}

fn why(v: &Value) -> &str {
    v["why"].as_str().unwrap_or_default()
}

/// The lines of a head after its leading empty lines, without their line ends.
fn lines(head: &[u8]) -> Vec<&[u8]> {
    let start = head
        .iter()
        .position(|&b| b != b'\r' && b != b'\n')
        .unwrap_or(head.len());
    head[start..]
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .take_while(|l| !l.is_empty())
        .collect()
}

/// The request target: the request line's second token.
fn target(head: &[u8]) -> Vec<u8> {
    let lines = lines(head);
    let line = lines.first().copied().unwrap_or_default();
    line.split(|&b| b == b' ')
        .nth(1)
        .unwrap_or_default()
        .to_vec()
}

/// The values of the fields named `name` (any case).
fn values<'a>(head: &'a [u8], name: &str) -> Vec<&'a [u8]> {
    lines(head)
        .into_iter()
        .skip(1)
        .filter_map(|l| {
            let colon = l.iter().position(|&b| b == b':')?;
            l[..colon]
                .eq_ignore_ascii_case(name.as_bytes())
                .then(|| l[colon + 1..].trim_ascii())
        })
        .collect()
}

/// Both accept and agree but for the fields, and `fix` applied to ours makes them agree.
fn fields_differ_only(ours: &Value, theirs: &Value, fix: fn(&mut Vec<Value>)) -> bool {
    if !ok(ours) || !ok(theirs) {
        return false;
    }
    let mut ours = ours.clone();
    let headers = ours["headers"].as_array_mut().expect("a list");
    fix(headers);
    ours == *theirs
}

const KNOWN: &[Known] = &[
    Known {
        class: "empty lines before the request line: ours skips them, h11 refuses",
        reason: "RFC 9112 §2.2: a server SHOULD ignore at least one empty line before the request-line",
        is: |head, ours, theirs| {
            matches!(head.first(), Some(b'\r' | b'\n')) && ok(ours) && why(theirs) == "no request line received"
        },
    },
    Known {
        class: "HTTP/1.1 without Host: ours accepts, h11 refuses",
        reason: "checked after the parser by http/request_rules.rs (400), as for HTTP/2 and HTTP/3",
        is: |_, ours, theirs| ok(ours) && why(theirs) == "Missing mandatory Host: header",
    },
    Known {
        class: "several Host fields: ours accepts, h11 refuses",
        reason: "checked after the parser by http/request_rules.rs (400)",
        is: |head, ours, theirs| {
            ok(ours) && values(head, "host").len() > 1 && why(theirs) == "Found multiple Host: headers"
        },
    },
    Known {
        class: "Transfer-Encoding ending in chunked but not exactly `chunked` (`gzip, chunked`, `chunked,`, \
                several fields): ours frames it chunked, h11 refuses",
        reason: "the parser frames by the final coding (RFC 9112 §6.3); http/request_rules.rs then answers 501 and \
                 closes unless the codings are exactly one `chunked`",
        is: |_, ours, theirs| {
            ours["framing"] == "chunked"
                && (why(theirs) == "Only Transfer-Encoding: chunked is supported"
                    || why(theirs) == "multiple Transfer-Encoding headers")
        },
    },
    Known {
        class: "Transfer-Encoding in HTTP/1.0: ours refuses, h11 frames it chunked",
        reason: "RFC 9112 §6.1: an HTTP/1.0 message with Transfer-Encoding has a faulty framing; hyper and nginx \
                 refuse it too",
        is: |_, ours, theirs| why(ours).ends_with("Transfer-Encoding in HTTP/1.0") && ok(theirs),
    },
    Known {
        class: "obs-fold (a field line starting with SP or HTAB): ours refuses, h11 unfolds it",
        reason: "RFC 9112 §5.2: a server MAY refuse obs-fold with 400; unfolding is what two hops disagree on",
        is: |head, ours, theirs| {
            why(ours).ends_with("field name")
                && ok(theirs)
                && lines(head).iter().skip(1).any(|l| matches!(l.first(), Some(b' ' | b'\t')))
        },
    },
    Known {
        class: "control bytes (CTL but HTAB) in a field value: ours refuses, h11 accepts",
        reason: "RFC 9110 §5.5: field-vchar excludes CTL; h11 refuses only NUL and the whitespace controls",
        is: |head, ours, theirs| {
            why(ours).ends_with("field value")
                && ok(theirs)
                && lines(head).iter().skip(1).any(|l| l.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f))
        },
    },
    Known {
        class: "a target with bytes RFC 3986 excludes (`\"<>\\^`{|}`): ours refuses, h11 accepts",
        reason: "http::Uri refuses them (400); h11 takes any VCHAR",
        is: |head, ours, theirs| {
            why(ours).ends_with("request target") && ok(theirs) && target(head).iter().any(|b| b"\"<>\\^`{|}".contains(b))
        },
    },
    Known {
        class: "a target with bytes over 0x7F: ours accepts, h11 refuses",
        reason: "httparse and http::Uri admit them in a path, as under hyper (RFC 9112 §3.2 says VCHAR; left \
                 as it was, a decision for the path layer); h11 takes VCHAR only",
        is: |head, ours, theirs| {
            ok(ours) && why(theirs).starts_with("illegal request line") && target(head).iter().any(|&b| b >= 0x80)
        },
    },
    Known {
        class: "a target with a fragment (`/x#f`): ours drops the fragment, h11 keeps it",
        reason: "http::Uri parses and drops `#...`; RFC 9112 §3.2's request-target has no fragment, so refusing \
                 it (400) would be stricter still; left as hyper does it",
        is: |_, ours, theirs| {
            let (Some(o), Some(t)) = (ours["target"].as_str(), theirs["target"].as_str()) else {
                return false;
            };
            t.split_once('#').is_some_and(|(before, _)| before == o)
                && {
                    let mut ours = ours.clone();
                    ours["target"] = theirs["target"].clone();
                    ours == *theirs || fields_differ_only(&ours, theirs, merge_lengths)
                }
        },
    },
    Known {
        class: "a version other than HTTP/1.0 and HTTP/1.1 (`HTTP/1.2`, `HTTP/0.9`, `HTTP/2.0`): ours refuses, h11 \
                accepts",
        reason: "qweb speaks HTTP/1.0 and 1.1 on this path: 505 for another well-formed version, 400 for another \
                 1.x (httparse's grammar); h11 leaves the version to the application",
        is: |_, ours, theirs| {
            (why(ours).ends_with("version") || why(ours) == "HTTP version not supported")
                && ok(theirs)
                && !matches!(theirs["version"].as_str(), Some("1.0" | "1.1"))
        },
    },
    Known {
        class: "a 20-digit Content-Length: ours refuses, h11 accepts",
        reason: "ours takes at most 19 digits (always fits u64, no overflow check); h11 takes 20",
        is: |head, ours, theirs| {
            why(ours).ends_with("Content-Length")
                && ok(theirs)
                && values(head, "content-length").iter().any(|v| v.len() == 20 && v.iter().all(u8::is_ascii_digit))
        },
    },
    Known {
        class: "a Content-Length list (`5, 5`): ours refuses, h11 takes the one value",
        reason: "ours reads Content-Length as 1*DIGIT; RFC 9110 §8.6 lets a recipient refuse a list",
        is: |head, ours, theirs| {
            why(ours).ends_with("Content-Length") && ok(theirs) && values(head, "content-length").iter().any(|v| v.contains(&b','))
        },
    },
    Known {
        class: "Content-Length fields with the same number spelt differently (`5` and `05`): ours accepts, h11 \
                refuses",
        reason: "ours compares the values as numbers: both hops read the same length, so the framing is not in \
                 doubt",
        is: |head, ours, theirs| {
            let lengths: Vec<_> = values(head, "content-length").into_iter().map(super::parse::content_length).collect();
            ok(ours)
                && why(theirs) == "conflicting Content-Length headers"
                && lengths.iter().all(|l| l.is_some() && *l == lengths[0])
        },
    },
    Known {
        class: "equal Content-Length fields, or a Transfer-Encoding not in lower case: ours keeps the fields as \
                sent, h11 merges the lengths into one field and lowercases the coding",
        reason: "ours passes the fields on as they came; they frame the body alike",
        is: |_, ours, theirs| fields_differ_only(ours, theirs, merge_lengths),
    },
];

/// What h11 does to the framing fields: equal `content-length` fields merged, the
/// `transfer-encoding` value lowercased.
fn merge_lengths(headers: &mut Vec<Value>) {
    let mut seen = false;
    headers.retain(|f| {
        if f[0] != "content-length" {
            return true;
        }
        !std::mem::replace(&mut seen, true)
    });
    for f in headers.iter_mut() {
        if f[0] == "transfer-encoding" {
            f[1] = Value::from(f[1].as_str().unwrap_or_default().to_ascii_lowercase());
        }
    }
}

#[test]
fn the_head_parser_agrees_with_h11() {
    if !Command::new("python3")
        .args(["-c", "import h11"])
        .status()
        .is_ok_and(|s| s.success())
    {
        // (qweb_testkit::tools::require says the same, but qweb-testkit depends on this crate)
        assert!(
            std::env::var_os("CI").is_none_or(|v| v.is_empty()),
            "CI is set and python3 with h11 is missing: .ci/run installs it (pip install 'httpx[zstd]')"
        );
        eprintln!("SKIPPED: python3 with h11 is needed (it comes with httpx: pip install httpx; see .ci/run)");
        return;
    }
    let mut rng = Rng(0x5eed_0011_d1ff_2026);
    let cases: Vec<_> = (0..CASES).map(|_| generate(&mut rng)).collect();
    let theirs = h11(&cases);
    assert_eq!(theirs.len(), cases.len());
    let mut seen = vec![0usize; KNOWN.len()];
    let mut unexplained: std::collections::BTreeMap<String, (usize, String)> = Default::default();
    let (mut accepted, mut agreed) = (0, 0);
    for ((bytes, tags), theirs) in cases.iter().zip(&theirs) {
        let ours = ours(bytes);
        accepted += usize::from(ours["ok"] == true);
        // both refuse: alike, whatever the reasons
        if ours == *theirs || (ours["ok"] == false && theirs["ok"] == false) {
            agreed += 1;
            continue;
        }
        if let Some(k) = KNOWN.iter().position(|k| (k.is)(bytes, &ours, theirs)) {
            seen[k] += 1;
            continue;
        }
        let short = |v: &Value| {
            if v["ok"] == true {
                "accepts".to_owned()
            } else {
                let why = v["why"].as_str().unwrap_or_default();
                why.split(':').next().unwrap_or_default().to_owned()
            }
        };
        let fields: Vec<&str> = ["method", "target", "version", "headers", "framing"]
            .into_iter()
            .filter(|f| ours[f] != theirs[f])
            .collect();
        let key = format!("ours {} | h11 {} | {fields:?}", ours["why"], short(theirs));
        let e = unexplained.entry(key).or_insert((0, String::new()));
        e.0 += 1;
        if e.1.is_empty() {
            e.1 = format!(
                "{:?} {tags:?}\n  ours {ours}\n  h11  {theirs}",
                latin1(bytes)
            );
        }
    }
    eprintln!(
        "{} heads: {accepted} accepted by ours, {agreed} alike",
        cases.len()
    );
    for (k, n) in KNOWN.iter().zip(&seen) {
        eprintln!("{n:5} {}: {}", k.class, k.reason);
    }
    let report: Vec<String> = unexplained
        .iter()
        .map(|(k, (n, ex))| format!("{n:5} {k}\n  {ex}"))
        .collect();
    assert!(
        unexplained.is_empty(),
        "differences of no known class:\n{}",
        report.join("\n")
    );
}
