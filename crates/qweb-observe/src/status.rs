//! `/status.json`: a small document for people (and the `/status` page), derived from the
//! very text `/metrics` serves. The registry is rendered, its OpenMetrics samples are parsed
//! back and summed by the labels a person looks at (worker, engine, codec, upstream): one
//! source of truth, no counter of its own, computed when asked for on the admin thread (never
//! on a worker). Long lists are cut ([`MAX_ROWS`]) and say how many rows they left out.

use std::collections::HashMap;

use serde_json::{json, Map, Value};

/// Rows of one list (workers, upstreams, engines, listeners) in the document; more are counted
/// in its `omitted`, so a configuration with thousands of upstreams gives a document of bounded
/// size. Down upstreams come first, so they are the ones shown.
pub const MAX_ROWS: usize = 100;

/// One sample line of the exposition: `name{labels} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The metric's name.
    pub name: String,
    /// Its labels, in exposition order.
    pub labels: Vec<(String, String)>,
    /// Its value.
    pub value: f64,
}

impl Sample {
    fn label(&self, key: &str) -> &str {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map_or("", |(_, v)| v.as_str())
    }
}

/// Parses one sample line; `None` for comments, blank lines and lines it does not understand
/// (the registry writes none of those).
fn parse_line(line: &str) -> Option<Sample> {
    if line.starts_with('#') || line.trim().is_empty() {
        return None;
    }
    let name_end = line.find(['{', ' '])?;
    let name = line[..name_end].to_owned();
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(r) = rest.strip_prefix('{') {
        rest = r;
        loop {
            if let Some(r) = rest.strip_prefix('}') {
                rest = r;
                break;
            }
            let r = rest.strip_prefix(',').unwrap_or(rest);
            let eq = r.find("=\"")?;
            let key = r[..eq].to_owned();
            let mut value = String::new();
            let mut chars = r[eq + 2..].char_indices();
            let end = loop {
                match chars.next()? {
                    (i, '"') => break i,
                    (_, '\\') => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        c => value.push(c),
                    },
                    (_, c) => value.push(c),
                }
            };
            labels.push((key, value));
            rest = &r[eq + 2 + end + 1..];
        }
    }
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// The samples of an OpenMetrics text.
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines().filter_map(parse_line).collect()
}

/// The samples, indexed by name.
struct Samples<'a>(HashMap<&'a str, Vec<&'a Sample>>);

impl<'a> Samples<'a> {
    fn new(samples: &'a [Sample]) -> Self {
        let mut by_name: HashMap<&str, Vec<&Sample>> = HashMap::new();
        for s in samples {
            by_name.entry(s.name.as_str()).or_default().push(s);
        }
        Samples(by_name)
    }

    fn of(&self, name: &str) -> &[&'a Sample] {
        self.0.get(name).map_or(&[], Vec::as_slice)
    }

    /// The sum of `name`'s samples whose label `key` is `value` (every sample when `key` is
    /// empty).
    fn sum(&self, name: &str, key: &str, value: &str) -> f64 {
        self.of(name)
            .iter()
            .filter(|s| key.is_empty() || s.label(key) == value)
            .map(|s| s.value)
            .sum()
    }

    /// `name`'s values summed by label `key`, in the order the label's values first appear.
    fn by(&self, name: &str, key: &str) -> Vec<(String, f64)> {
        let mut out: Vec<(String, f64)> = Vec::new();
        let mut index: HashMap<&str, usize> = HashMap::new();
        for s in self.of(name) {
            let k = s.label(key);
            match index.get(k) {
                Some(&i) => out[i].1 += s.value,
                None => {
                    index.insert(k, out.len());
                    out.push((k.to_owned(), s.value));
                }
            }
        }
        out
    }

    /// `name`'s values by label `key`, as a lookup.
    fn map(&self, name: &str, key: &str) -> HashMap<String, f64> {
        self.by(name, key).into_iter().collect()
    }

    /// Histogram `base` (its `_bucket`, `_sum`, `_count`) summed over the samples whose label
    /// `key` is `value` (all when `key` is empty).
    fn latency(&self, base: &str, key: &str, value: &str) -> Value {
        let mut buckets: Vec<(f64, f64)> = Vec::new();
        for s in self.of(&format!("{base}_bucket")) {
            if !key.is_empty() && s.label(key) != value {
                continue;
            }
            let le = match s.label("le") {
                "+Inf" => f64::INFINITY,
                l => l.parse().unwrap_or(f64::INFINITY),
            };
            match buckets.iter_mut().find(|(b, _)| *b == le) {
                Some(b) => b.1 += s.value,
                None => buckets.push((le, s.value)),
            }
        }
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        let count = self.sum(&format!("{base}_count"), key, value);
        let sum = self.sum(&format!("{base}_sum"), key, value);
        json!({
            "count": num(count),
            "sum_seconds": sum,
            "mean_seconds": if count > 0.0 { Value::from(sum / count) } else { Value::Null },
            "p50_seconds": quantile(&buckets, 0.5),
            "p99_seconds": quantile(&buckets, 0.99),
            // cumulative counts by upper bound; the last (`null`) is +Inf
            "buckets": buckets
                .iter()
                .map(|(le, c)| json!([if le.is_finite() { Value::from(*le) } else { Value::Null }, num(*c)]))
                .collect::<Vec<_>>(),
        })
    }
}

/// A JSON number: an integer when the value is one (counters), else the float.
fn num(v: f64) -> Value {
    if v.fract() == 0.0 && v.abs() < 9.0e15 {
        Value::from(v as i64)
    } else if v.is_finite() {
        Value::from(v)
    } else {
        Value::Null
    }
}

/// The `q` quantile of cumulative `buckets` (upper bound, count), interpolated inside its
/// bucket as Prometheus' `histogram_quantile` does; `null` without observations, the highest
/// finite bound when it falls in `+Inf`.
fn quantile(buckets: &[(f64, f64)], q: f64) -> Value {
    let Some(&(_, total)) = buckets.last() else {
        return Value::Null;
    };
    if total <= 0.0 {
        return Value::Null;
    }
    let rank = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for &(le, count) in buckets {
        if count >= rank {
            if !le.is_finite() {
                return Value::from(lower);
            }
            let inside = count - below;
            let share = if inside > 0.0 {
                (rank - below) / inside
            } else {
                1.0
            };
            return Value::from(lower + (le - lower) * share);
        }
        (lower, below) = (le, count);
    }
    Value::from(lower)
}

/// A list of at most [`MAX_ROWS`] rows, with the count it left out.
fn rows(mut list: Vec<Value>) -> Value {
    let omitted = list.len().saturating_sub(MAX_ROWS);
    list.truncate(MAX_ROWS);
    json!({ "rows": list, "omitted": omitted })
}

/// Per worker: connections (by protocol), requests, handshakes.
fn workers(s: &Samples) -> Value {
    let conns = s.by("qweb_connections_open", "worker");
    let get = |name: &str| s.map(name, "worker");
    let (requests, ok, failed, paused) = (
        get("qweb_http_requests_total"),
        get("qweb_tls_handshakes_total"),
        get("qweb_tls_handshakes_failed_total"),
        get("qweb_jobs_paused"),
    );
    let mut h1 = HashMap::new();
    let mut h2 = HashMap::new();
    let mut h3 = HashMap::new();
    for x in s.of("qweb_http_connections_open") {
        let into = match x.label("protocol") {
            "h2" => &mut h2,
            "h3" => &mut h3,
            _ => &mut h1,
        };
        into.insert(x.label("worker").to_owned(), x.value);
    }
    let at = |m: &HashMap<String, f64>, w: &str| num(m.get(w).copied().unwrap_or(0.0));
    rows(
        conns
            .iter()
            .map(|(w, open)| {
                json!({
                    "worker": w,
                    "connections": num(*open),
                    "http1": at(&h1, w),
                    "h2": at(&h2, w),
                    "h3": at(&h3, w),
                    "requests": at(&requests, w),
                    "handshakes": at(&ok, w),
                    "handshakes_failed": at(&failed, w),
                    "jobs_paused": at(&paused, w),
                })
            })
            .collect(),
    )
}

/// Per engine: ops in flight, queue depth, outcomes (fallbacks), latency, key servers.
fn engines(s: &Samples) -> Value {
    const COUNTS: [(&str, &str); 8] = [
        ("submitted", "qweb_offload_ops_submitted_total"),
        ("completed", "qweb_offload_ops_completed_total"),
        ("failed", "qweb_offload_ops_failed_total"),
        ("timed_out", "qweb_offload_ops_timed_out_total"),
        ("cancelled", "qweb_offload_ops_cancelled_total"),
        ("fallback", "qweb_offload_ops_fallback_total"),
        ("saturated", "qweb_offload_ops_saturated_total"),
        ("batches", "qweb_offload_batches_total"),
    ];
    const GAUGES: [(&str, &str); 3] = [
        ("in_flight", "qweb_offload_in_flight"),
        ("in_flight_peak", "qweb_offload_in_flight_peak"),
        ("queue_depth", "qweb_offload_queue_depth"),
    ];
    let list = s
        .by("qweb_offload_ops_submitted_total", "engine")
        .into_iter()
        .map(|(engine, _)| {
            let mut e = Map::new();
            e.insert("engine".into(), Value::from(engine.as_str()));
            for (key, name) in COUNTS.iter().chain(GAUGES.iter()) {
                e.insert((*key).into(), num(s.sum(name, "engine", &engine)));
            }
            let latency = s.latency("qweb_offload_op_latency_seconds", "engine", &engine);
            e.insert("latency".into(), latency);
            let servers: Vec<Value> = s
                .of("qweb_keyserver_up")
                .iter()
                .filter(|x| x.label("engine") == engine)
                .map(|x| json!({ "server": x.label("server"), "up": x.value > 0.0 }))
                .collect();
            e.insert("servers".into(), rows(servers));
            Value::Object(e)
        })
        .collect();
    rows(list)
}

/// Bytes in and out per codec, and the pipeline's live state.
fn compression(s: &Samples) -> Value {
    let (bytes_out, responses) = (
        s.map("qweb_compression_bytes_out_total", "codec"),
        s.map("qweb_compression_responses_total", "codec"),
    );
    let codecs: Vec<Value> = s
        .by("qweb_compression_bytes_in_total", "codec")
        .into_iter()
        .map(|(codec, bytes_in)| {
            let out = bytes_out.get(&codec).copied().unwrap_or(0.0);
            json!({
                "codec": codec,
                "responses": num(responses.get(&codec).copied().unwrap_or(0.0)),
                "bytes_in": num(bytes_in),
                "bytes_out": num(out),
                // in per out: 3 means a third of the size
                "ratio": if out > 0.0 { Value::from(bytes_in / out) } else { Value::Null },
            })
        })
        .collect();
    json!({
        "codecs": codecs,
        "chunks_in_flight": num(s.sum("qweb_compression_chunks_in_flight", "", "")),
        "fallbacks": num(s.sum("qweb_compression_fallbacks_total", "", "")),
        "cache_hits": num(s.sum("qweb_compression_cache_hits_total", "", "")),
        "cache_misses": num(s.sum("qweb_compression_cache_misses_total", "", "")),
        "sidecar_hits": num(s.sum("qweb_compression_sidecar_hits_total", "", "")),
    })
}

/// The proxy cache: what it answered, what it holds (`qweb_proxy_cache_*`).
fn cache(s: &Samples) -> Value {
    let sum = |name: &str| s.sum(name, "", "");
    let (hits, misses, stale) = (
        sum("qweb_proxy_cache_hits_total"),
        sum("qweb_proxy_cache_misses_total"),
        sum("qweb_proxy_cache_stale_total"),
    );
    let asked = hits + misses + stale;
    json!({
        "hits": num(hits),
        "misses": num(misses),
        "stale": num(stale),
        // served without the origin, of what the cache was asked
        "hit_ratio": if asked > 0.0 { Value::from((hits + stale) / asked) } else { Value::Null },
        "revalidated": num(sum("qweb_proxy_cache_revalidated_total")),
        "collapsed": num(sum("qweb_proxy_cache_collapsed_total")),
        "bypass": num(sum("qweb_proxy_cache_bypass_total")),
        "stored": num(sum("qweb_proxy_cache_stored_total")),
        "evictions": num(sum("qweb_proxy_cache_evictions_total")),
        "one_hit_evictions": num(sum("qweb_proxy_cache_one_hit_evictions_total")),
        "invalidations": num(sum("qweb_proxy_cache_invalidations_total")),
        "objects": num(sum("qweb_proxy_cache_objects")),
        "bytes": num(sum("qweb_proxy_cache_bytes")),
    })
}

/// Per proxy upstream: up or down, in flight, failures; the down ones first.
fn upstreams(s: &Samples) -> Value {
    let key = |x: &Sample| (x.label("route").to_owned(), x.label("upstream").to_owned());
    let lookup = |name: &str| -> HashMap<(String, String), f64> {
        s.of(name).iter().map(|x| (key(x), x.value)).collect()
    };
    let (down, failures, in_flight) = (
        lookup("qweb_upstream_down_workers"),
        lookup("qweb_upstream_failures_total"),
        lookup("qweb_upstream_in_flight"),
    );
    let mut list: Vec<(bool, Value)> = s
        .of("qweb_upstream_up")
        .iter()
        .map(|x| {
            let k = key(x);
            let at = |m: &HashMap<(String, String), f64>| num(m.get(&k).copied().unwrap_or(0.0));
            let up = x.value > 0.0;
            let row = json!({
                "route": k.0,
                "upstream": k.1,
                "up": up,
                "down_workers": at(&down),
                "in_flight": at(&in_flight),
                "failures": at(&failures),
            });
            (up, row)
        })
        .collect();
    let total = list.len();
    let down_count = list.iter().filter(|(up, _)| !up).count();
    // stable: config order within the down ones and within the up ones
    list.sort_by_key(|(up, _)| *up);
    let mut out = rows(list.into_iter().map(|(_, v)| v).collect());
    if let Value::Object(o) = &mut out {
        o.insert("total".into(), Value::from(total));
        o.insert("down".into(), Value::from(down_count));
        o.insert(
            "in_flight".into(),
            num(s.sum("qweb_upstream_in_flight", "", "")),
        );
    }
    out
}

/// The status document of the exposition `text`, `now` seconds since the Unix epoch.
pub fn document(text: &str, now: f64) -> Value {
    let samples = parse(text);
    let s = Samples::new(&samples);
    let sum = |name: &str| num(s.sum(name, "", ""));
    let kind = |k: &str| num(s.sum("qweb_tls_session_handshakes_total", "kind", k));
    let started = s.sum("qweb_start_time_seconds", "", "");
    let reloads = s.map("qweb_config_reloads_total", "result");
    let reloads_ok = reloads.get("ok").copied().unwrap_or(0.0);
    let classes = s.map("qweb_http_route_requests_total", "class");
    let by_class: Map<String, Value> = ["1xx", "2xx", "3xx", "4xx", "5xx"]
        .into_iter()
        .map(|c| (c.to_owned(), num(classes.get(c).copied().unwrap_or(0.0))))
        .collect();
    let version = |name: &str, label: &str| {
        s.of(name)
            .first()
            .map_or(String::new(), |x| x.label(label).to_owned())
    };
    json!({
        "version": version("qweb_build_info", "version"),
        "config_hash": version("qweb_config_info", "hash"),
        "uptime_seconds": (now - started).max(0.0).round(),
        // the configuration's generation: 1 at start, one more per reload that took
        "generation": num(1.0 + reloads_ok),
        "reloads": { "ok": num(reloads_ok), "failed": num(reloads.get("failed").copied().unwrap_or(0.0)) },
        "connections": sum("qweb_connections_open"),
        "requests": sum("qweb_http_requests_total"),
        "responses": by_class,
        "request_latency": s.latency("qweb_http_request_duration_seconds", "", ""),
        "handshakes": {
            "total": sum("qweb_tls_handshakes_total"),
            "failed": sum("qweb_tls_handshakes_failed_total"),
            "full": kind("full"),
            "resumed": kind("resumed"),
            "jobs_paused": sum("qweb_jobs_paused"),
        },
        "workers": workers(&s),
        "engines": engines(&s),
        "compression": compression(&s),
        "cache": cache(&s),
        "upstreams": upstreams(&s),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_lines_parse_with_escaped_labels() {
        let s = parse_line(r#"a_total{route="/a\"b\\c\nd",class="2xx"} 3"#).unwrap();
        assert_eq!(s.name, "a_total");
        assert_eq!(s.label("route"), "/a\"b\\c\nd");
        assert_eq!(s.label("class"), "2xx");
        assert_eq!(s.value, 3.0);
        let s = parse_line(r#"h_bucket{le="+Inf"} 1.5e3"#).unwrap();
        assert_eq!((s.label("le"), s.value), ("+Inf", 1500.0));
        assert_eq!(parse_line("x 0.25").unwrap().value, 0.25);
        assert_eq!(parse_line("x{a=\"}\"} +Inf").unwrap().label("a"), "}");
        for bad in ["# TYPE x counter", "", "x", "x{a=\"b\"", "x{a=\"b\"} y"] {
            assert_eq!(parse_line(bad), None, "{bad}");
        }
    }

    #[test]
    fn quantiles_interpolate_inside_their_bucket() {
        let b = [(0.1, 50.0), (0.2, 100.0), (f64::INFINITY, 100.0)];
        assert_eq!(quantile(&b, 0.5), Value::from(0.1));
        let p99 = quantile(&b, 0.99).as_f64().unwrap();
        assert!((p99 - 0.198).abs() < 1e-9, "{p99}");
        assert_eq!(
            quantile(&[(1.0, 0.0), (f64::INFINITY, 0.0)], 0.5),
            Value::Null
        );
        assert_eq!(
            quantile(&[(1.0, 0.0), (f64::INFINITY, 4.0)], 0.5),
            Value::from(1.0)
        );
    }

    /// Thousands of workers and upstreams give a document of bounded size that still counts
    /// them all.
    #[test]
    fn long_lists_are_cut_and_counted() {
        let mut text = String::new();
        for w in 0..1000 {
            text.push_str(&format!("qweb_connections_open{{worker=\"{w}\"}} 1\n"));
        }
        for u in 0..5000 {
            let up = u32::from(u != 4321);
            text.push_str(&format!(
                "qweb_upstream_up{{route=\"/r\",upstream=\"<u{u}>\"}} {up}\n"
            ));
        }
        let d = document(&text, 0.0);
        assert_eq!(d["connections"], 1000);
        assert_eq!(d["workers"]["rows"].as_array().unwrap().len(), MAX_ROWS);
        assert_eq!(d["workers"]["omitted"], 900);
        assert_eq!(d["upstreams"]["total"], 5000);
        assert_eq!(d["upstreams"]["down"], 1);
        assert_eq!(d["upstreams"]["rows"][0]["upstream"], "<u4321>");
        assert_eq!(d["upstreams"]["omitted"], 5000 - MAX_ROWS);
        assert!(d.to_string().len() < 64 * 1024);
    }
}
