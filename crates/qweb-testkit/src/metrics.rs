//! A strict `/metrics` scrape: every sample line is parsed (name, labels, value) and a line
//! that does not parse fails the test; lookup by sample name and labels. The python
//! `prometheus_client` OpenMetrics parser is there too ([`python_strict_parse`]), for the
//! tests that check the exposition format itself.
//!
//! ```no_run
//! # async fn f(admin: std::net::SocketAddr) {
//! use qweb_testkit::metrics;
//! let m = metrics::scrape(admin).await; // or metrics::scrape_blocking(admin)
//! let hits = m.value("qweb_file_cache_hits_total", &[]);
//! let fallbacks = m.sum("qweb_offload_ops_fallback_total", &[("engine", "bad")]);
//! let reloads = m.get("qweb_config_reloads_total", &[("result", "ok")]);
//! # }
//! ```

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::{Command, Stdio};

/// One sample line: `name{labels} value`.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The sample name (`qweb_tls_handshakes_total`, `..._bucket`).
    pub name: String,
    /// The labels in their order on the line, values unescaped.
    pub labels: Vec<(String, String)>,
    /// The value.
    pub value: f64,
}

impl Sample {
    /// The value of label `name`.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn matches(&self, name: &str, labels: &[(&str, &str)]) -> bool {
        self.name == name && labels.iter().all(|(k, v)| self.label(k) == Some(*v))
    }
}

/// A parsed scrape.
#[derive(Clone, Debug)]
pub struct Metrics {
    /// The response's `Content-Type` (empty when parsed from text).
    pub content_type: String,
    /// The exposition text.
    pub text: String,
    /// Every sample, in order.
    pub samples: Vec<Sample>,
}

impl Metrics {
    /// Parses `text`; panics (with the text) on a sample line that does not parse.
    pub fn parse(text: &str) -> Metrics {
        let samples = text
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
            .map(|l| {
                parse_sample(l)
                    .unwrap_or_else(|e| panic!("bad metrics line {l:?}: {e}\n---\n{text}"))
            })
            .collect();
        Metrics {
            content_type: String::new(),
            text: text.to_owned(),
            samples,
        }
    }

    /// The samples named `name` that carry (at least) `labels`.
    pub fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| s.matches(name, labels))
    }

    /// The value of the one sample named `name` that carries `labels`; `None` when there is
    /// none. Panics when several match (name more labels).
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut it = self.matching(name, labels);
        let first = it.next()?;
        if let Some(second) = it.next() {
            panic!(
                "{name} {labels:?} is ambiguous: {first:?} and {second:?}\n---\n{}",
                self.text
            );
        }
        Some(first.value)
    }

    /// [`Metrics::get`] that panics (with the text) when the sample is missing.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels)
            .unwrap_or_else(|| panic!("no {name} {labels:?} in\n{}", self.text))
    }

    /// The sum over every sample named `name` that carries `labels` (0 when none does), e.g.
    /// a counter over all workers or listeners.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).map(|s| s.value).sum()
    }

    /// Whether the text has a `# TYPE <family> <kind>` line.
    pub fn has_type(&self, family: &str, kind: &str) -> bool {
        let want = format!("# TYPE {family} {kind}");
        self.text.lines().any(|l| l == want)
    }
}

impl std::fmt::Display for Metrics {
    /// The exposition text, for assertion messages.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// Parses `name{k="v",...} value [timestamp] [# exemplar]`.
fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line.find(['{', ' ']).ok_or("no value")?;
    let name = &line[..name_end];
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        || name.starts_with(|c: char| c.is_ascii_digit())
    {
        return Err(format!("bad name {name:?}"));
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(r) = rest.strip_prefix('{') {
        rest = r;
        loop {
            if let Some(r) = rest.strip_prefix('}') {
                rest = r;
                break;
            }
            let eq = rest.find('=').ok_or("label without =")?;
            let key = &rest[..eq];
            if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!("bad label name {key:?}"));
            }
            let r = rest[eq + 1..]
                .strip_prefix('"')
                .ok_or("label value without quote")?;
            let mut value = String::new();
            let mut chars = r.char_indices();
            let end = loop {
                match chars.next() {
                    Some((i, '"')) => break i,
                    Some((_, '\\')) => match chars.next() {
                        Some((_, 'n')) => value.push('\n'),
                        Some((_, '"')) => value.push('"'),
                        Some((_, '\\')) => value.push('\\'),
                        other => return Err(format!("bad escape {other:?}")),
                    },
                    Some((_, c)) => value.push(c),
                    None => return Err("unterminated label value".into()),
                }
            };
            labels.push((key.to_owned(), value));
            rest = &r[end + 1..];
            if let Some(r) = rest.strip_prefix(',') {
                rest = r;
            } else if !rest.starts_with('}') {
                return Err("expected , or } after a label".into());
            }
        }
    }
    let rest = rest.strip_prefix(' ').ok_or("no space before the value")?;
    let value_text = rest.split(' ').next().unwrap_or("");
    let value = value_text
        .parse::<f64>()
        .map_err(|e| format!("bad value {value_text:?}: {e}"))?;
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// `GET /metrics` from `admin` over plain HTTP/1.1 (reqwest); asserts a 200 and parses it.
pub async fn scrape(admin: SocketAddr) -> Metrics {
    let r = crate::tls::plain_client()
        .get(format!("http://{admin}/metrics"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET http://{admin}/metrics: {e}"));
    assert_eq!(r.status(), 200, "GET http://{admin}/metrics");
    let content_type = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let text = r.text().await.expect("metrics body");
    Metrics {
        content_type,
        ..Metrics::parse(&text)
    }
}

/// [`scrape`] for tests without a runtime: a raw HTTP/1.0 request on a std socket (the answer
/// is not chunked and ends at close).
pub fn scrape_blocking(admin: SocketAddr) -> Metrics {
    let mut s =
        std::net::TcpStream::connect(admin).unwrap_or_else(|e| panic!("connect {admin}: {e}"));
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .expect("write");
    let mut out = Vec::new();
    s.read_to_end(&mut out).expect("read");
    let out = String::from_utf8(out).expect("utf-8 metrics");
    let (head, body) = out
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no response head: {out:?}"));
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "GET /metrics: {head}"
    );
    let content_type = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_owned())
        })
        .unwrap_or_default();
    Metrics {
        content_type,
        ..Metrics::parse(body)
    }
}

/// [`scrape_blocking`] of an in-process server's admin listener.
pub fn of(server: &qweb_server::RunningServer) -> Metrics {
    scrape_blocking(server.admin_addr().expect("an [admin] listener"))
}

/// The strict parser: every family once, every sample in its family, labels and histograms
/// valid, `# EOF` at the end. Prints one `family<TAB>type` line per family, then one
/// `sample<TAB>name<TAB>labels as JSON<TAB>value` line per sample.
const CHECK: &str = r#"
import json, sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
text = sys.stdin.read()
seen = set()
for f in text_string_to_metric_families(text):
    if f.name in seen:
        sys.exit("family %s twice" % f.name)
    seen.add(f.name)
    print("family\t%s\t%s" % (f.name, f.type))
    for s in f.samples:
        print("sample\t%s\t%s\t%r" % (s.name, json.dumps(s.labels, sort_keys=True), s.value))
"#;

/// The python interpreter that has the Debian package's modules.
fn python() -> &'static str {
    if std::path::Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

/// Runs python's strict OpenMetrics parser (`python3-prometheus-client`) on `text`; panics
/// with its message when it refuses the text. Returns what it read: one
/// `family\t<name>\t<type>` line per family and one
/// `sample\t<name>\t<labels as sorted JSON>\t<value>` line per sample.
pub fn python_strict_parse(text: &str) -> String {
    let mut child = Command::new(python())
        .args(["-c", CHECK])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 (apt-get install python3-prometheus-client)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write to python");
    let out = child.wait_with_output().expect("python");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("No module named"),
        "the OpenMetrics parser is missing: apt-get install python3-prometheus-client\n{stderr}"
    );
    assert!(
        out.status.success(),
        "the strict parser refused /metrics: {stderr}\n---\n{text}"
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_labels_escapes_and_values() {
        let m = Metrics::parse(
            "# TYPE a counter\na_total 3\nb{x=\"1\",y=\"q\\\"\\\\\\n\"} 2.5\n\
             b{x=\"2\"} 1 1700000000\nc{le=\"+Inf\"} +Inf\n# EOF\n",
        );
        assert_eq!(m.value("a_total", &[]), 3.0);
        assert_eq!(m.value("b", &[("y", "q\"\\\n")]), 2.5);
        assert_eq!(m.sum("b", &[]), 3.5);
        assert_eq!(m.get("b", &[("x", "3")]), None);
        assert!(m.value("c", &[]).is_infinite());
        assert!(m.has_type("a", "counter"));
    }

    #[test]
    #[should_panic(expected = "bad metrics line")]
    fn a_line_that_does_not_parse_fails() {
        Metrics::parse("a{x=\"1\" 2\n");
    }

    #[test]
    #[should_panic(expected = "ambiguous")]
    fn an_ambiguous_lookup_fails() {
        Metrics::parse("b{x=\"1\"} 1\nb{x=\"2\"} 2\n").get("b", &[]);
    }
}
