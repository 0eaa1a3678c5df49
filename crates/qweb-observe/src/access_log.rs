//! The access log: one line per request (target `qweb::access`; stdout, or `[log]
//! access_file`), written when the response is finished or abandoned, in one of three
//! formats (`[log] format`):
//!
//! - `qweb` (default): `<time> <client> "<method> <target> <protocol>" <status> <body bytes>
//!   <ms to last byte>ms[ aborted]`;
//! - `combined`: nginx's, plus the request time in seconds and the TLS version:
//!   `<ip> - - [<time>] "<method> <target> <protocol>" <status> <bytes> "<referer>"
//!   "<user agent>" <seconds> <tls|->[ aborted]`;
//! - `json`: one object per line with the same fields, `host` too.
//!
//! A tunnel (a WebSocket or other upgrade, an HTTP/2 extended CONNECT) is logged when it
//! ends: its status (101, or 200 on HTTP/2), the bytes it sent the client, the time from the
//! request to the tunnel's end, and ` received=<bytes from the client>` (JSON:
//! `"received"`).
//!
//! A response of a cached proxy route ends with ` cache=<HIT|STALE|MISS|REVALIDATED|BYPASS>`
//! (JSON: `"cache"`).
//!
//! A request on a connection with a verified client certificate (`[listener.tls]
//! client_auth`) ends with ` tls_client_subject="<RFC 4514 subject>"
//! tls_client_fingerprint=<SHA-256 hex>` (JSON: `"tls_client_subject"`,
//! `"tls_client_fingerprint"`; absent without a certificate).
//!
//! `aborted` marks a response whose body did not go out whole (the client went away, the send
//! timeout or an upstream error cut it); its byte count is what was handed to the connection.
//! Requests that the HTTP/1 parser (`http::h1::parse`) refused are logged with `-` as
//! the request (`refused`). Fields are escaped as nginx does (`escape=default`): `"`, `\`,
//! control bytes, DEL and non-ASCII bytes become `\xHH`, so a request cannot forge log fields
//! or lines (JSON: the same bytes as `\u00HH`).

use std::fmt::Write;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header;

use qweb_config::AccessFormat;

/// The request header fields the access log shows, taken before the request is consumed.
#[derive(Debug, Default)]
pub struct RequestFields {
    /// The target's authority, else `Host`.
    pub host: Option<String>,
    /// `User-Agent`.
    pub user_agent: Option<String>,
    /// `Referer`.
    pub referer: Option<String>,
}

impl RequestFields {
    /// `Host` (or the target's authority), `User-Agent` and `Referer` of `req`, lossily
    /// decoded (escaped when written).
    pub fn of<B>(req: &http::Request<B>) -> RequestFields {
        let get = |name: header::HeaderName| {
            req.headers()
                .get(name)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        };
        RequestFields {
            host: req
                .uri()
                .authority()
                .map(|a| a.as_str().to_owned())
                .or_else(|| get(header::HOST)),
            user_agent: get(header::USER_AGENT),
            referer: get(header::REFERER),
        }
    }
}

/// One finished (or abandoned) request.
pub struct Entry<'a> {
    /// The client's address.
    pub peer: SocketAddr,
    /// The request method.
    pub method: &'a str,
    /// The request target, already escaped.
    pub target: &'a str,
    /// `HTTP/1.1`, `HTTP/2.0`, `HTTP/3.0`.
    pub protocol: &'a str,
    /// The response status.
    pub status: u16,
    /// Response body bytes sent (a tunnel's: to the client).
    pub bytes: u64,
    /// From the request head to the last byte sent (or the abort).
    pub elapsed: Duration,
    /// The response was not sent to its end.
    pub aborted: bool,
    /// A tunnel's bytes from the client (`None`: not a tunnel).
    pub received: Option<u64>,
    /// `TLSv1.3`, `TLSv1.2`, or `None` on plain HTTP.
    pub tls: Option<&'a str>,
    /// `Host`, `User-Agent` and `Referer` (`None`: not taken, for formats without them).
    pub fields: Option<&'a RequestFields>,
    /// What the proxy cache did (`HIT`, `STALE`, `MISS`, `REVALIDATED`, `BYPASS`; `None`:
    /// the route is not cached).
    pub cache: Option<&'a str>,
    /// The connection's verified client certificate (`None`: none).
    pub client_cert: Option<&'a qweb_tls::ClientCert>,
}

/// Writes `e` in `format`.
pub fn write(format: AccessFormat, e: &Entry<'_>) {
    let line = format_entry(format, e, SystemTime::now());
    tracing::info!(target: "qweb::access", "{line}");
}

/// Logs a request refused by the parser (its head never reached the service).
pub fn refused(format: AccessFormat, peer: SocketAddr, status: u16) {
    let line = match format {
        AccessFormat::Qweb => format!(
            "{} {peer} \"-\" {status} 0 0.000ms refused",
            iso_time(SystemTime::now())
        ),
        _ => {
            format_entry(
                format,
                &Entry {
                    peer,
                    method: "-",
                    target: "",
                    protocol: "",
                    status,
                    bytes: 0,
                    elapsed: Duration::ZERO,
                    aborted: false,
                    received: None,
                    tls: None,
                    fields: None,
                    cache: None,
                    client_cert: None,
                },
                SystemTime::now(),
            ) + " refused"
        }
    };
    tracing::info!(target: "qweb::access", "{line}");
}

fn format_entry(format: AccessFormat, e: &Entry<'_>, now: SystemTime) -> String {
    let field = |f: fn(&RequestFields) -> &Option<String>| e.fields.and_then(|r| f(r).as_deref());
    let request = if e.method == "-" {
        "-".to_owned()
    } else {
        format!("{} {} {}", e.method, e.target, e.protocol)
    };
    let mut aborted = if e.aborted { " aborted" } else { "" }.to_owned();
    if let (Some(n), false) = (e.received, format == AccessFormat::Json) {
        let _ = write!(aborted, " received={n}");
    }
    if let (Some(c), false) = (e.cache, format == AccessFormat::Json) {
        let _ = write!(aborted, " cache={c}");
    }
    if let (Some(c), false) = (e.client_cert, format == AccessFormat::Json) {
        let _ = write!(
            aborted,
            " tls_client_subject=\"{}\" tls_client_fingerprint={}",
            escape(&c.subject),
            c.fingerprint
        );
    }
    match format {
        AccessFormat::Qweb => format!(
            "{} {} \"{request}\" {} {} {:.3}ms{aborted}",
            iso_time(now),
            e.peer,
            e.status,
            e.bytes,
            e.elapsed.as_secs_f64() * 1000.0
        ),
        AccessFormat::Combined => {
            let quoted = |v: Option<&str>| v.map_or_else(|| "-".to_owned(), escape);
            format!(
                "{} - - [{}] \"{request}\" {} {} \"{}\" \"{}\" {:.3} {}{aborted}",
                e.peer.ip(),
                clf_time(now),
                e.status,
                e.bytes,
                quoted(field(|r| &r.referer)),
                quoted(field(|r| &r.user_agent)),
                e.elapsed.as_secs_f64(),
                e.tls.unwrap_or("-"),
            )
        }
        AccessFormat::Json => {
            let mut o = String::from("{");
            let mut put = |k: &str, v: Option<&str>| {
                let _ = write!(o, "\"{k}\":");
                match v {
                    Some(v) => json_str(&mut o, v),
                    None => o.push_str("null"),
                }
                o.push(',');
            };
            put("time", Some(&iso_time(now)));
            put("client", Some(&e.peer.to_string()));
            put("method", Some(e.method));
            put("target", Some(e.target));
            put("protocol", Some(e.protocol));
            put("host", field(|r| &r.host));
            put("user_agent", field(|r| &r.user_agent));
            put("referer", field(|r| &r.referer));
            put("tls", e.tls);
            if e.cache.is_some() {
                put("cache", e.cache);
            }
            if let Some(c) = e.client_cert {
                put("tls_client_subject", Some(&c.subject));
                put("tls_client_fingerprint", Some(&c.fingerprint));
            }
            if let Some(n) = e.received {
                let _ = write!(o, "\"received\":{n},");
            }
            let _ = write!(
                o,
                "\"status\":{},\"bytes\":{},\"request_time\":{:.6},\"aborted\":{}}}",
                e.status,
                e.bytes,
                e.elapsed.as_secs_f64(),
                e.aborted
            );
            o
        }
    }
}

/// `v` as a JSON string: `"`, `\\`, control bytes and DEL as escapes, the rest as is.
fn json_str(out: &mut String, v: &str) {
    out.push('"');
    for c in v.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Civil date and time (UTC) of `t`: (year, month, day, hour, minute, second, microsecond).
fn civil(t: SystemTime) -> (i64, u32, u32, u32, u32, u32, u32) {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (year, month, day) = qweb_tls::utc::civil_from_days(days);
    (
        year,
        month,
        day,
        (rem / 3600) as u32,
        (rem % 3600 / 60) as u32,
        (rem % 60) as u32,
        d.subsec_micros(),
    )
}

/// `2026-11-30T07:00:00.123456Z`.
fn iso_time(t: SystemTime) -> String {
    let (y, mo, d, h, mi, s, us) = civil(t);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{us:06}Z")
}

/// nginx's `$time_local` in UTC: `30/Nov/2026:07:00:00 +0000`.
fn clf_time(t: SystemTime) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let (y, mo, d, h, mi, s, _) = civil(t);
    let month = MONTHS[(mo as usize).clamp(1, 12) - 1];
    format!("{d:02}/{month}/{y:04}:{h:02}:{mi:02}:{s:02} +0000")
}

/// `s` with every byte outside printable ASCII, and `"` and `\`, written as `\xHH`.
pub fn escape(s: &str) -> String {
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
    use super::*;

    fn entry<'a>(fields: &'a RequestFields) -> Entry<'a> {
        Entry {
            peer: "192.0.2.7:5555".parse().unwrap(),
            method: "GET",
            target: "/a?b",
            protocol: "HTTP/1.1",
            status: 200,
            bytes: 11,
            elapsed: Duration::from_micros(1500),
            aborted: false,
            received: None,
            tls: Some("TLSv1.3"),
            fields: Some(fields),
            cache: None,
            client_cert: None,
        }
    }

    #[test]
    fn a_client_certificate_is_named_by_subject_and_fingerprint() {
        let f = RequestFields::default();
        let t = UNIX_EPOCH + Duration::from_secs(1_796_022_489);
        let cert = qweb_tls::ClientCert {
            subject: "CN=alice \"x\",O=ops".into(),
            fingerprint: "ab01".into(),
        };
        let mut e = entry(&f);
        e.client_cert = Some(&cert);
        let line = format_entry(AccessFormat::Qweb, &e, t);
        assert!(
            line.ends_with(
                " 1.500ms tls_client_subject=\"CN=alice \\x22x\\x22,O=ops\" tls_client_fingerprint=ab01"
            ),
            "{line}"
        );
        let v: serde_json::Value =
            serde_json::from_str(&format_entry(AccessFormat::Json, &e, t)).unwrap();
        assert_eq!(v["tls_client_subject"], "CN=alice \"x\",O=ops");
        assert_eq!(v["tls_client_fingerprint"], "ab01");
        e.client_cert = None;
        assert!(!format_entry(AccessFormat::Json, &e, t).contains("tls_client"));
    }

    #[test]
    fn times_are_civil_utc() {
        // 2026-11-30T07:08:09.000123Z
        let t = UNIX_EPOCH + Duration::new(1_796_022_489, 123_000);
        assert_eq!(iso_time(t), "2026-11-30T07:08:09.000123Z");
        assert_eq!(clf_time(t), "30/Nov/2026:07:08:09 +0000");
        assert_eq!(
            iso_time(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00.000000Z"
        );
    }

    #[test]
    fn combined_is_nginx_with_request_time_and_tls() {
        let f = RequestFields {
            host: Some("example.com".into()),
            user_agent: Some("curl/8 \"evil\"\n".into()),
            referer: None,
        };
        let t = UNIX_EPOCH + Duration::from_secs(1_796_022_489);
        let line = format_entry(AccessFormat::Combined, &entry(&f), t);
        assert_eq!(
            line,
            "192.0.2.7 - - [30/Nov/2026:07:08:09 +0000] \"GET /a?b HTTP/1.1\" 200 11 \"-\" \"curl/8 \\x22evil\\x22\\x0A\" 0.002 TLSv1.3"
        );
    }

    #[test]
    fn json_is_one_object_per_line_with_escapes() {
        let f = RequestFields {
            host: Some("h\"x".into()),
            user_agent: Some("a\nb\\".into()),
            referer: Some("https://r/".into()),
        };
        let t = UNIX_EPOCH + Duration::from_secs(1_796_022_489);
        let line = format_entry(AccessFormat::Json, &entry(&f), t);
        assert!(!line.contains('\n'));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["host"], "h\"x");
        assert_eq!(v["user_agent"], "a\nb\\");
        assert_eq!(v["referer"], "https://r/");
        assert_eq!(v["tls"], "TLSv1.3");
        assert_eq!(v["status"], 200);
        assert_eq!(v["aborted"], false);
        assert_eq!(v["time"], "2026-11-30T07:08:09.000000Z");
    }

    #[test]
    fn a_cached_route_says_what_the_cache_did() {
        let f = RequestFields::default();
        let t = UNIX_EPOCH + Duration::from_secs(1_796_022_489);
        let mut e = entry(&f);
        e.cache = Some("HIT");
        let line = format_entry(AccessFormat::Qweb, &e, t);
        assert!(line.ends_with(" 200 11 1.500ms cache=HIT"), "{line}");
        let line = format_entry(AccessFormat::Combined, &e, t);
        assert!(line.ends_with(" TLSv1.3 cache=HIT"), "{line}");
        let v: serde_json::Value =
            serde_json::from_str(&format_entry(AccessFormat::Json, &e, t)).unwrap();
        assert_eq!(v["cache"], "HIT");
        e.cache = None;
        assert!(!format_entry(AccessFormat::Json, &e, t).contains("cache"));
    }

    #[test]
    fn a_tunnel_says_what_it_received() {
        let f = RequestFields::default();
        let t = UNIX_EPOCH + Duration::from_secs(1_796_022_489);
        let mut e = entry(&f);
        e.status = 101;
        e.received = Some(42);
        let line = format_entry(AccessFormat::Qweb, &e, t);
        assert!(line.ends_with(" 101 11 1.500ms received=42"), "{line}");
        let v: serde_json::Value =
            serde_json::from_str(&format_entry(AccessFormat::Json, &e, t)).unwrap();
        assert_eq!(v["received"], 42);
    }

    #[test]
    fn escapes_quotes_backslashes_and_controls() {
        assert_eq!(super::escape("/a b?c=d"), "/a b?c=d");
        assert_eq!(super::escape("/\"x\\y\n"), "/\\x22x\\x5Cy\\x0A");
        assert_eq!(super::escape("/é"), "/\\xC3\\xA9");
    }
}
