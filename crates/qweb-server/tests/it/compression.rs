//! Response compression against a real server, real clients (HTTP/1.1 and HTTP/2 over TLS)
//! and a real upstream. Every encoded body is decoded with an independent decoder (flate2's
//! GzDecoder, the brotli decompressor, zstd's decoder) and compared byte for byte.

use qweb_testkit as common;

use std::io::Read;
use std::time::Duration;

use common::{client, upstream, Proto, BOTH};
use futures_util::StreamExt;

const CODECS: [&str; 3] = ["gzip", "br", "zstd"];
const CHUNK: usize = 4096;

/// Decodes a body sent with `Content-Encoding: coding`; panics when it is not ONE valid
/// stream of that coding. (Also used by `http3_pipeline`.)
pub(crate) fn decode(coding: &str, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    match coding {
        "gzip" => {
            let mut d = flate2::read::GzDecoder::new(data);
            d.read_to_end(&mut out).expect("gzip");
            assert!(d.into_inner().is_empty(), "bytes after the gzip member");
        }
        "br" => {
            brotli::Decompressor::new(data, 4096)
                .read_to_end(&mut out)
                .expect("br");
        }
        "zstd" => {
            zstd::stream::read::Decoder::new(data)
                .expect("zstd")
                .read_to_end(&mut out)
                .expect("zstd");
        }
        other => panic!("unexpected coding {other}"),
    }
    out
}

/// What a decoder can make of the start of a stream.
fn decode_prefix(coding: &str, data: &[u8]) -> Vec<u8> {
    let mut r: Box<dyn Read + '_> = match coding {
        "gzip" => Box::new(flate2::read::GzDecoder::new(data)),
        "br" => Box::new(brotli::Decompressor::new(data, 4096)),
        _ => Box::new(zstd::stream::read::Decoder::new(data).expect("zstd")),
    };
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = r.read(&mut buf) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    out
}

fn config(mode: &str, engine: &str, extra: &str) -> String {
    format!(
        "[offload.engines.zpool]\nkind = \"pool\"\nthreads = 2\n\n\
         [compression]\nmin_size = 0\nchunk_size = \"{CHUNK}\"\ndepth = 4\nmode = \"{mode}\"\n\
         engine = \"{engine}\"\nflush_interval = \"20ms\"\n{extra}\n"
    )
}

fn proxy(up: std::net::SocketAddr) -> String {
    format!("\n[[route]]\nprefix = \"/up\"\nupstreams = [\"{up}\"]\nstrip_prefix = true\n")
}

struct Got {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Vec<u8>,
}

impl Got {
    fn h(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
    fn vary(&self) -> bool {
        self.headers.get_all("vary").iter().any(|v| {
            v.to_str()
                .unwrap()
                .to_ascii_lowercase()
                .contains("accept-encoding")
        })
    }
}

async fn get(c: &reqwest::Client, url: &str, headers: &[(&str, &str)]) -> Got {
    let mut r = c.get(url);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    let r = r.send().await.unwrap_or_else(|e| panic!("{url}: {e}"));
    Got {
        status: r.status().as_u16(),
        headers: r.headers().clone(),
        body: r.bytes().await.expect("body").to_vec(),
    }
}

fn sizes() -> Vec<usize> {
    vec![0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 10 * CHUNK + 3]
}

#[tokio::test]
async fn static_and_proxied_bodies_round_trip_for_every_codec_mode_engine_and_protocol() {
    let up = upstream::start("u").await;
    for (mode, engine) in [
        ("sync", "inline"),
        ("sync", "zpool"),
        ("pipelined", "inline"),
        ("pipelined", "zpool"),
    ] {
        let t = common::start_with(&(config(mode, engine, "") + &proxy(up.addr)), |dir| {
            for n in sizes() {
                std::fs::write(dir.join(format!("site/t{n}.txt")), upstream::text(n)).unwrap();
                std::fs::write(dir.join(format!("site/r{n}.txt")), upstream::random(n, 99))
                    .unwrap();
            }
        });
        for proto in BOTH {
            let c = client(&t.cert(), proto);
            for coding in CODECS {
                for n in sizes() {
                    for (path, want) in [
                        (format!("/t{n}.txt"), upstream::text(n)),
                        (format!("/r{n}.txt"), upstream::random(n, 99)),
                        (format!("/up/text/{n}"), upstream::text(n)),
                        (format!("/up/rand/{n}"), upstream::random(n, 99)),
                    ] {
                        let what = format!("{mode}/{engine} {proto:?} {coding} {path}");
                        let g = get(
                            &c,
                            &format!("{}{path}", t.https()),
                            &[("accept-encoding", coding)],
                        )
                        .await;
                        assert_eq!(g.status, 200, "{what}");
                        assert_eq!(g.h("content-encoding"), Some(coding), "{what}");
                        assert!(g.vary(), "{what}");
                        if let Some(len) = g.h("content-length") {
                            assert_eq!(len.parse::<usize>().unwrap(), g.body.len(), "{what}");
                        }
                        assert!(decode(coding, &g.body) == want, "{what}: body differs");
                    }
                }
            }
        }
    }
}

#[tokio::test]
async fn many_chunks_of_a_large_body_in_pipelined_mode_on_a_pool() {
    let up = upstream::start("u").await;
    let extra = "[admin]\naddress = \"127.0.0.1:0\"\n";
    let t = common::start_with(
        &(config("pipelined", "zpool", "cache_size = 0") + &proxy(up.addr) + extra),
        |dir| std::fs::write(dir.join("site/big.html"), upstream::text(1 << 20)).unwrap(),
    );
    for proto in BOTH {
        let c = client(&t.cert(), proto);
        for coding in CODECS {
            for path in ["/big.html", "/up/text/1048576"] {
                let g = get(
                    &c,
                    &format!("{}{path}", t.https()),
                    &[("accept-encoding", coding)],
                )
                .await;
                assert_eq!(g.h("content-encoding"), Some(coding));
                assert!(g.h("content-length").is_none(), "streamed: no length");
                assert!(
                    decode(coding, &g.body) == upstream::text(1 << 20),
                    "{proto:?} {coding} {path}"
                );
                assert!(g.body.len() < (1 << 20) / 2, "text compresses");
            }
        }
    }
    let m = t.metrics().await;
    // 1 MiB in 4 KiB chunks: 256 chunks per response, 12 responses
    assert!(
        m.value("qweb_compression_chunks_total", &[]) as i64 >= 12 * 256,
        "{m}"
    );
    assert_eq!(m.value("qweb_compression_chunks_in_flight", &[]) as i64, 0);
    assert_eq!(m.value("qweb_compression_fallbacks_total", &[]) as i64, 0);
    for coding in CODECS {
        let codec = [("codec", coding)];
        let name = "qweb_compression_bytes_in_total";
        assert_eq!(m.value(name, &codec), (4 << 20) as f64, "{name} {coding}");
        let name = "qweb_compression_bytes_out_total";
        assert!(m.value(name, &codec) > 0.0, "{name} {coding}");
    }
    // the chunks ran on the pool engine
    assert!(
        m.value("qweb_offload_ops_submitted_total", &[("engine", "zpool")]) >= (12 * 256) as f64
    );
}

#[tokio::test]
async fn negotiation() {
    let t = common::start_with("[compression]\n", |dir| {
        std::fs::write(dir.join("site/a.txt"), upstream::text(5000)).unwrap();
    });
    let c = client(&t.cert(), Proto::H2);
    let url = format!("{}/a.txt", t.https());
    for (ae, want) in [
        (Some("gzip"), Some("gzip")),
        (Some("gzip, deflate, br"), Some("br")),
        (Some("gzip, br, zstd"), Some("zstd")),
        (Some("gzip;q=1, br;q=0.5, zstd;q=0.1"), Some("gzip")),
        (Some("br;q=0, gzip;q=0.3"), Some("gzip")),
        (Some("*"), Some("zstd")),
        (Some("*;q=0.5, zstd;q=0"), Some("br")),
        (Some("identity"), None),
        (Some("identity;q=1, gzip;q=0.5"), None),
        (Some("gzip;q=0"), None),
        (Some("*;q=0"), None),
        (Some("deflate, compress"), None),
        (Some(""), None),
        (None, None),
    ] {
        let headers: Vec<(&str, &str)> = ae.map(|v| ("accept-encoding", v)).into_iter().collect();
        let g = get(&c, &url, &headers).await;
        assert_eq!(g.status, 200);
        assert_eq!(g.h("content-encoding"), want, "{ae:?}");
        assert!(g.vary(), "Vary on every negotiable response ({ae:?})");
        match want {
            Some(coding) => assert!(decode(coding, &g.body) == upstream::text(5000)),
            None => {
                assert!(g.body == upstream::text(5000));
                assert_eq!(g.h("content-length"), Some("5000"));
            }
        }
    }
    // the server's preference order breaks ties
    let t = common::start_with("[compression]\ncodecs = [\"gzip\", \"br\"]\n", |dir| {
        std::fs::write(dir.join("site/a.txt"), upstream::text(5000)).unwrap();
    });
    let c = client(&t.cert(), Proto::H1);
    let g = get(
        &c,
        &format!("{}/a.txt", t.https()),
        &[("accept-encoding", "zstd, br, gzip")],
    )
    .await;
    assert_eq!(g.h("content-encoding"), Some("gzip"));
    let g = get(
        &c,
        &format!("{}/a.txt", t.https()),
        &[("accept-encoding", "zstd")],
    )
    .await;
    assert_eq!(g.h("content-encoding"), None, "zstd is not offered");
}

#[tokio::test]
async fn responses_that_are_not_compressed() {
    let up = upstream::start("u").await;
    let t = common::start_with(&("[compression]\n".to_owned() + &proxy(up.addr)), |dir| {
        let s = dir.join("site");
        std::fs::write(s.join("small.txt"), upstream::text(1000)).unwrap();
        std::fs::write(s.join("big.txt"), upstream::text(20_000)).unwrap();
        std::fs::write(s.join("pic.png"), upstream::text(20_000)).unwrap();
        std::fs::write(s.join("font.woff2"), upstream::text(20_000)).unwrap();
        std::fs::write(s.join("arch.zip"), upstream::text(20_000)).unwrap();
        std::fs::write(s.join("clip.mp4"), upstream::text(20_000)).unwrap();
    });
    for proto in BOTH {
        let c = client(&t.cert(), proto);
        let base = t.https();
        let ae = [("accept-encoding", "gzip, br, zstd")];
        // under min_size (1 KiB by default): as is, still Vary
        let g = get(&c, &format!("{base}/small.txt"), &ae).await;
        assert_eq!(g.h("content-encoding"), None);
        assert!(g.vary());
        assert_eq!(g.body, upstream::text(1000));
        // types already compressed: as is, not negotiable (no Vary)
        for f in ["pic.png", "font.woff2", "arch.zip", "clip.mp4"] {
            let g = get(&c, &format!("{base}/{f}"), &ae).await;
            assert_eq!(g.h("content-encoding"), None, "{f}");
            assert!(!g.vary(), "{f}");
            assert_eq!(g.body, upstream::text(20_000));
        }
        let g = get(&c, &format!("{base}/up/png/20000"), &ae).await;
        assert_eq!(g.h("content-encoding"), None);
        // a range request: 206 of the identity
        let g = get(
            &c,
            &format!("{base}/big.txt"),
            &[ae[0], ("range", "bytes=10-19")],
        )
        .await;
        assert_eq!(g.status, 206);
        assert_eq!(g.h("content-encoding"), None);
        assert_eq!(g.body, &upstream::text(20_000)[10..20]);
        assert!(g.vary());
        // already encoded upstream response: passed through untouched
        let g = get(&c, &format!("{base}/up/encoded"), &ae).await;
        assert_eq!(g.h("content-encoding"), Some("gzip"));
        assert_eq!(g.body, upstream::ENCODED);
        // errors are not touched
        let g = get(&c, &format!("{base}/missing.txt"), &ae).await;
        assert_eq!(g.status, 404);
        assert_eq!(g.h("content-encoding"), None);
    }
}

#[tokio::test]
async fn head_answers_with_the_headers_of_get() {
    let up = upstream::start("u").await;
    let t = common::start_with(&("[compression]\n".to_owned() + &proxy(up.addr)), |dir| {
        std::fs::write(dir.join("site/a.html"), upstream::text(30_000)).unwrap();
    });
    for proto in BOTH {
        let c = client(&t.cert(), proto);
        for coding in CODECS {
            for path in ["/a.html", "/up/text/30000"] {
                let url = format!("{}{path}", t.https());
                let head = c
                    .head(&url)
                    .header("accept-encoding", coding)
                    .send()
                    .await
                    .unwrap();
                let get = get(&c, &url, &[("accept-encoding", coding)]).await;
                for name in [
                    "content-encoding",
                    "vary",
                    "etag",
                    "content-type",
                    "accept-ranges",
                ] {
                    assert_eq!(
                        head.headers().get(name).map(|v| v.to_str().unwrap()),
                        get.h(name),
                        "{proto:?} {coding} {path}: {name}"
                    );
                }
                assert_eq!(head.headers()["content-encoding"], coding);
                // a length only when the variant is stored (then the same as GET's)
                if let Some(len) = head.headers().get("content-length") {
                    assert_eq!(len.to_str().unwrap(), get.h("content-length").unwrap());
                }
                assert!(head.bytes().await.unwrap().is_empty());
                assert!(decode(coding, &get.body) == upstream::text(30_000));
            }
        }
    }
}

#[tokio::test]
async fn encoded_etags_and_conditional_requests() {
    // the open-file cache sees the change below within `valid`
    let extra = "[compression]\n[file_cache]\nvalid = \"50ms\"\n";
    let t = common::start_with(extra, |dir| {
        std::fs::write(dir.join("site/a.css"), upstream::text(30_000)).unwrap();
    });
    let c = client(&t.cert(), Proto::H1);
    let url = format!("{}/a.css", t.https());
    let plain = get(&c, &url, &[]).await;
    let tag = plain.h("etag").unwrap().to_owned();
    assert!(tag.starts_with('"') && tag.ends_with('"'));
    let gz = get(&c, &url, &[("accept-encoding", "gzip")]).await;
    let gz_tag = gz.h("etag").unwrap().to_owned();
    assert_eq!(gz_tag, format!("W/{}-gzip\"", &tag[..tag.len() - 1]));
    let br_tag = get(&c, &url, &[("accept-encoding", "br")])
        .await
        .h("etag")
        .unwrap()
        .to_owned();
    assert_ne!(br_tag, gz_tag);
    assert_ne!(br_tag, tag);
    // the gzip variant revalidates with its own tag: 304 carrying that tag and Vary
    let g = get(
        &c,
        &url,
        &[("accept-encoding", "gzip"), ("if-none-match", &gz_tag)],
    )
    .await;
    assert_eq!(g.status, 304);
    assert_eq!(g.h("etag"), Some(gz_tag.as_str()));
    assert!(g.vary());
    let list = format!("\"nope\", {gz_tag}");
    let g = get(
        &c,
        &url,
        &[("accept-encoding", "gzip"), ("if-none-match", &list)],
    )
    .await;
    assert_eq!(g.status, 304);
    // ... but not for a client that now gets br: it needs the br variant
    let g = get(
        &c,
        &url,
        &[("accept-encoding", "br"), ("if-none-match", &gz_tag)],
    )
    .await;
    assert_eq!(g.status, 200);
    assert_eq!(g.h("content-encoding"), Some("br"));
    // nor for a client that asks for the identity
    let g = get(&c, &url, &[("if-none-match", &gz_tag)]).await;
    assert_eq!(g.status, 200);
    assert_eq!(g.h("content-encoding"), None);
    // the identity tag still revalidates the identity
    let g = get(&c, &url, &[("if-none-match", &tag)]).await;
    assert_eq!(g.status, 304);
    assert_eq!(g.h("etag"), Some(tag.as_str()));
    // after a change of the file the old encoded tag no longer matches
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(t.site().join("a.css"), upstream::text(30_001)).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let g = get(
        &c,
        &url,
        &[("accept-encoding", "gzip"), ("if-none-match", &gz_tag)],
    )
    .await;
    assert_eq!(g.status, 200);
    assert!(decode("gzip", &g.body) == upstream::text(30_001));
}

#[tokio::test]
async fn variant_cache_hits_invalidates_and_evicts() {
    let extra = "[admin]\naddress = \"127.0.0.1:0\"\n";
    let t = common::start_with(
        &(config("pipelined", "zpool", "cache_size = \"64KiB\"") + extra),
        |dir| {
            let s = dir.join("site");
            std::fs::write(s.join("page.html"), upstream::text(100_000)).unwrap();
            for i in 0..3 {
                std::fs::write(s.join(format!("r{i}.txt")), upstream::random(30_000, i)).unwrap();
            }
        },
    );
    let c = client(&t.cert(), Proto::H2);
    let base = t.https();
    let ae = [("accept-encoding", "gzip")];
    // miss: compressed while streaming, no length
    let g1 = get(&c, &format!("{base}/page.html"), &ae).await;
    assert!(g1.h("content-length").is_none());
    assert!(decode("gzip", &g1.body) == upstream::text(100_000));
    // hit: the stored variant, with its length, the same bytes
    let g2 = get(&c, &format!("{base}/page.html"), &ae).await;
    assert_eq!(
        g2.h("content-length"),
        Some(g2.body.len().to_string().as_str())
    );
    assert_eq!(g2.body, g1.body);
    assert_eq!(g2.h("etag"), g1.h("etag"));
    let m = t.metrics().await;
    assert_eq!(
        m.value("qweb_compression_cache_misses_total", &[]) as i64,
        1
    );
    assert_eq!(m.value("qweb_compression_cache_hits_total", &[]) as i64, 1);
    assert_eq!(
        m.value("qweb_compression_cache_bytes", &[]) as i64,
        g1.body.len() as i64
    );
    // another codec is another variant
    let b = get(
        &c,
        &format!("{base}/page.html"),
        &[("accept-encoding", "br")],
    )
    .await;
    assert!(decode("br", &b.body) == upstream::text(100_000));
    // the file changes: the stored variant is not served
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(t.site().join("page.html"), upstream::text(99_999)).unwrap();
    let g3 = get(&c, &format!("{base}/page.html"), &ae).await;
    assert!(decode("gzip", &g3.body) == upstream::text(99_999));
    assert_ne!(g3.h("etag"), g1.h("etag"));
    let m = t.metrics().await;
    assert_eq!(
        m.value("qweb_compression_cache_invalidations_total", &[]) as i64,
        1
    );
    assert_eq!(m.value("qweb_compression_cache_hits_total", &[]) as i64, 1);
    let g4 = get(&c, &format!("{base}/page.html"), &ae).await;
    assert_eq!(g4.body, g3.body);
    assert_eq!(
        t.metrics()
            .await
            .value("qweb_compression_cache_hits_total", &[]) as i64,
        2
    );
    // eviction: three ~30 KiB variants do not fit in 64 KiB with the others
    for i in 0..3 {
        let g = get(&c, &format!("{base}/r{i}.txt"), &ae).await;
        assert!(decode("gzip", &g.body) == upstream::random(30_000, i));
    }
    let m = t.metrics().await;
    assert!(
        m.value("qweb_compression_cache_evictions_total", &[]) as i64 >= 2,
        "{m}"
    );
    assert!((m.value("qweb_compression_cache_bytes", &[]) as i64) <= 64 * 1024);
    // the oldest was evicted: a miss again, then a hit
    let misses = m.value("qweb_compression_cache_misses_total", &[]) as i64;
    let g = get(&c, &format!("{base}/page.html"), &ae).await;
    assert!(g.h("content-length").is_none());
    assert!(decode("gzip", &g.body) == upstream::text(99_999));
    let m = t.metrics().await;
    assert_eq!(
        m.value("qweb_compression_cache_misses_total", &[]) as i64,
        misses + 1
    );
    let r2 = get(&c, &format!("{base}/r2.txt"), &ae).await;
    assert!(
        r2.h("content-length").is_some(),
        "the newest is still stored"
    );
}

#[tokio::test]
async fn precompressed_sidecars_are_served_when_fresh() {
    use std::io::Write;
    let t = common::start_with("[compression]\n", |dir| {
        let s = dir.join("site");
        std::fs::write(s.join("x.html"), upstream::text(50_000)).unwrap();
        // sidecars made by another encoder (and at another level): served byte for byte
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(&upstream::text(50_000)).unwrap();
        std::fs::write(s.join("x.html.gz"), e.finish().unwrap()).unwrap();
        let mut br = Vec::new();
        brotli::BrotliCompress(
            &mut &upstream::text(50_000)[..],
            &mut br,
            &brotli::enc::BrotliEncoderParams::default(),
        )
        .unwrap();
        std::fs::write(s.join("x.html.br"), br).unwrap();
    });
    let c = client(&t.cert(), Proto::H1);
    let url = format!("{}/x.html", t.https());
    let sidecar_gz = std::fs::read(t.site().join("x.html.gz")).unwrap();
    let g = get(&c, &url, &[("accept-encoding", "gzip")]).await;
    assert_eq!(g.h("content-encoding"), Some("gzip"));
    assert_eq!(g.body, sidecar_gz);
    assert_eq!(
        g.h("content-length"),
        Some(sidecar_gz.len().to_string().as_str())
    );
    let g = get(&c, &url, &[("accept-encoding", "br")]).await;
    assert_eq!(g.body, std::fs::read(t.site().join("x.html.br")).unwrap());
    // zstd preferred, but only br and gzip sidecars: the best sidecar the client accepts
    let g = get(
        &c,
        &url,
        &[("accept-encoding", "zstd, br;q=0.9, gzip;q=0.8")],
    )
    .await;
    assert_eq!(g.h("content-encoding"), Some("br"));
    // HEAD knows the sidecar's length too
    let h = c
        .head(&url)
        .header("accept-encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(
        h.headers()["content-length"].to_str().unwrap(),
        sidecar_gz.len().to_string()
    );
    // the original is newer than its sidecars: they are stale, it is compressed instead
    let f = std::fs::File::options()
        .write(true)
        .open(t.site().join("x.html.gz"))
        .unwrap();
    f.set_modified(std::time::SystemTime::now() - Duration::from_secs(3600))
        .unwrap();
    let g = get(&c, &url, &[("accept-encoding", "gzip")]).await;
    assert_ne!(g.body, sidecar_gz);
    assert!(decode("gzip", &g.body) == upstream::text(50_000));
}

#[tokio::test]
async fn a_streamed_upstream_response_is_flushed_when_the_upstream_pauses() {
    let up = upstream::start("u").await;
    for (mode, engine) in [("pipelined", "zpool"), ("sync", "inline")] {
        let t = common::start_with(&(config(mode, engine, "") + &proxy(up.addr)), |_| {});
        for proto in BOTH {
            let c = client(&t.cert(), proto);
            for coding in CODECS {
                let what = format!("{mode} {proto:?} {coding}");
                let r = c
                    .get(format!("{}/up/gatetext", t.https()))
                    .header("accept-encoding", coding)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.headers()["content-encoding"], coding);
                let mut stream = r.bytes_stream();
                let mut wire = Vec::new();
                // the upstream waits at the gate after the first line: it must arrive, decodable
                while decode_prefix(coding, &wire) != b"first line\n" {
                    let next = tokio::time::timeout(Duration::from_secs(10), stream.next())
                        .await
                        .unwrap_or_else(|_| panic!("{what}: the first line was held back"));
                    wire.extend_from_slice(&next.expect("more").expect("bytes"));
                }
                up.gate.notify_one();
                while let Some(b) = stream.next().await {
                    wire.extend_from_slice(&b.unwrap());
                }
                assert_eq!(
                    decode(coding, &wire),
                    b"first line\nsecond line\n",
                    "{what}"
                );
            }
        }
    }
}

#[tokio::test]
async fn a_slowly_streaming_upstream_round_trips() {
    let up = upstream::start("u").await;
    let t = common::start_with(
        &(config("pipelined", "zpool", "") + &proxy(up.addr)),
        |_| {},
    );
    for proto in BOTH {
        let c = client(&t.cert(), proto);
        for coding in CODECS {
            // 30 pieces of 1000 bytes, 5 ms apart: chunks are cut by size and by pauses
            let g = get(
                &c,
                &format!("{}/up/textstream/30/1000/5", t.https()),
                &[("accept-encoding", coding)],
            )
            .await;
            assert_eq!(g.h("content-encoding"), Some(coding));
            assert!(g.h("content-length").is_none());
            assert!(
                decode(coding, &g.body) == upstream::text(30_000),
                "{proto:?} {coding}"
            );
        }
    }
}

#[tokio::test]
async fn plain_http_listener_compresses_too() {
    let t = common::start_with("[compression]\nmode = \"sync\"\n", |dir| {
        std::fs::write(dir.join("site/a.js"), upstream::text(70_000)).unwrap();
    });
    let g = get(
        &common::plain_client(),
        &format!("{}/a.js", t.http()),
        &[("accept-encoding", "br")],
    )
    .await;
    assert_eq!(g.h("content-encoding"), Some("br"));
    assert!(decode("br", &g.body) == upstream::text(70_000));
}

/// A quick measurement, not a test of behaviour (ignored by default): requests per second for
/// a 100 KiB HTML page with gzip, from the variant cache vs compressed per request.
/// `cargo test --release -p qweb-server --test compression -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn measure_requests_per_second_cached_vs_per_request() {
    let page = upstream::text(100 * 1024);
    for (label, cache) in [("from the cache", "\"16MiB\""), ("per request", "0")] {
        let p = page.clone();
        let t = common::start_with(
            &format!(
                "[log]\naccess = false\n[compression]\ncodecs = [\"gzip\"]\n\
                 cache_size = {cache}\nprecompressed = false\n"
            ),
            move |dir| std::fs::write(dir.join("site/page.html"), p).unwrap(),
        );
        let c = client(&t.cert(), Proto::H2);
        let url = format!("{}/page.html", t.https());
        let run = |n: usize| {
            let (c, url) = (c.clone(), url.clone());
            async move {
                futures_util::stream::iter(0..n)
                    .map(|_| {
                        let (c, url) = (c.clone(), url.clone());
                        async move { get(&c, &url, &[("accept-encoding", "gzip")]).await }
                    })
                    .buffer_unordered(16)
                    .for_each(|g| {
                        assert_eq!(g.h("content-encoding"), Some("gzip"));
                        async {}
                    })
                    .await;
            }
        };
        run(100).await;
        let n = 3000;
        let start = std::time::Instant::now();
        run(n).await;
        let secs = start.elapsed().as_secs_f64();
        println!(
            "100 KiB page, gzip level 4, 1 worker, h2, 16 concurrent: {label}: {:.0} req/s",
            n as f64 / secs
        );
    }
}

/// Encoded variants carry a weak ETag (their bytes may differ from one response to the next:
/// pipelined chunks are not always encoded identically) and every response decodes to the
/// file; an If-None-Match with that weak tag gets 304.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encoded_variants_have_weak_etags_and_always_decode() {
    let t = common::start_with(&config("pipelined", "zpool", "cache_size = 0"), |dir| {
        let text: String = (0..10_000)
            .map(|i| format!("line {i} of a text file\n"))
            .collect();
        std::fs::write(dir.join("site/big.txt"), text).unwrap();
    });
    let orig = std::fs::read(t.site().join("big.txt")).unwrap();
    let c = common::client(&t.cert(), common::Proto::H2);
    let url = format!("{}/big.txt", t.https());
    for coding in CODECS {
        let hdr = [("accept-encoding", coding)];
        let rounds: Vec<_> = (0..6).map(|_| get(&c, &url, &hdr)).collect();
        let got = futures_util::future::join_all(rounds).await;
        let etag = got[0].h("etag").unwrap().to_owned();
        assert!(
            etag.starts_with("W/\"") && etag.ends_with(&format!("-{coding}\"")),
            "{etag}"
        );
        for g in &got {
            assert_eq!(g.h("content-encoding"), Some(coding));
            assert_eq!(g.h("etag"), Some(etag.as_str()));
            assert!(
                decode(coding, &g.body) == orig,
                "{coding}: body does not decode to the file"
            );
        }
        let r = get(
            &c,
            &url,
            &[("accept-encoding", coding), ("if-none-match", &etag)],
        )
        .await;
        assert_eq!(r.status, 304, "{coding}");
        assert_eq!(r.h("etag"), Some(etag.as_str()));
    }
}
