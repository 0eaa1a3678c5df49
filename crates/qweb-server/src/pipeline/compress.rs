//! Response compression: decides whether a response is sent encoded, negotiates the codec,
//! and wraps the body in `qweb-compress`'s pipelined encoder on the configured engine.
//!
//! The service calls [`begin`] with the request (before routing) and [`finish`] with the
//! response. Rules:
//! - `Vary: Accept-Encoding` on every response whose representation could be encoded
//!   (compressible type, 200 or 206), whatever was chosen for this request;
//! - encoded: `Content-Encoding` set, `Content-Length` removed (or that of the stored variant),
//!   `Accept-Ranges` removed, the ETag suffixed inside its quotes and made weak (`W/"tag-gzip"`);
//! - sent as is: range requests and 206s, bodies known to be under `min_size`, types that are
//!   not compressible, responses that already have a `Content-Encoding` (proxied), responses
//!   with `Cache-Control: no-transform`, statuses other than 200;
//! - HEAD gets the headers GET would get (its body stays empty);
//! - conditional requests: an `If-None-Match` tag with the suffix of the codec chosen for
//!   this request is compared as the identity tag (the suffix is removed before the handler
//!   or the upstream sees it), and a 304 then carries the encoded tag.
//!
//! Static files (the handler attaches [`StaticFile`]) are served from a precompressed
//! sidecar (`x.gz`, `x.br`, `x.zst`, when at least as new as `x`) or from this worker's
//! variant cache; a miss is compressed as it streams and the result kept for the next
//! request.

use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body::Body as _;
use qweb_compress::{
    AcceptEncoding, CacheEvents, Codec, CompressBody, CompressMetrics, EncodeParams, Source,
    VariantCache, VariantKey,
};
use qweb_offload::{BatchConfig, Engine, Offloader};

use crate::config::{CompressionConfig, Config};
use crate::files::body::Reopen;
use crate::files::cache::Identity;
use crate::files::FileBody;
use qweb_http::body::{boxed, full, Body};
use qweb_session::ReadAhead;

pub(crate) use crate::files::StaticFile;

/// What every worker shares: the settings, the engine, the counters.
pub(crate) struct Shared {
    cfg: CompressionConfig,
    engine: Arc<dyn Engine>,
    batch: BatchConfig,
    pub(crate) metrics: Arc<CompressMetrics>,
}

/// The shared compression state, when compression is enabled (`engines` by name).
pub(crate) fn shared(
    config: &Config,
    engine: impl Fn(&str) -> Option<Arc<dyn Engine>>,
    metrics: &Arc<CompressMetrics>,
) -> Option<Arc<Shared>> {
    let cfg = &config.compression;
    if !cfg.enabled || cfg.codecs.is_empty() {
        return None;
    }
    let engine = engine(&cfg.engine)?;
    Some(Arc::new(Shared {
        cfg: cfg.clone(),
        engine,
        batch: BatchConfig {
            enabled: config.offload.batch,
            max: config.offload.batch_max,
        },
        metrics: metrics.clone(),
    }))
}

/// One worker's compressor: its handle on the engine and its variant cache.
pub(crate) struct Compressor {
    shared: Arc<Shared>,
    offloader: Rc<Offloader>,
    cache: RefCell<VariantCache>,
}

impl Compressor {
    /// This worker's compressor.
    pub(crate) fn new(shared: &Arc<Shared>) -> Rc<Self> {
        Rc::new(Compressor {
            offloader: Offloader::new(shared.engine.clone(), shared.batch, shared.cfg.timeout),
            cache: RefCell::new(VariantCache::new(shared.cfg.cache_size)),
            shared: shared.clone(),
        })
    }

    fn cfg(&self) -> &CompressionConfig {
        &self.shared.cfg
    }

    fn metrics(&self) -> &CompressMetrics {
        &self.shared.metrics
    }

    /// Applies a cache operation and accounts its effects.
    fn with_cache<T>(&self, f: impl FnOnce(&mut VariantCache, &mut CacheEvents) -> T) -> T {
        let mut cache = self.cache.borrow_mut();
        let mut ev = CacheEvents::default();
        let before = cache.used() as i64;
        let r = f(&mut cache, &mut ev);
        let m = self.metrics();
        m.cache_bytes
            .fetch_add(cache.used() as i64 - before, Relaxed);
        m.cache_evictions.fetch_add(ev.evicted, Relaxed);
        m.cache_invalidations.fetch_add(ev.invalidated, Relaxed);
        r
    }
}

impl Drop for Compressor {
    fn drop(&mut self) {
        let used = self.cache.borrow().used() as i64;
        self.shared.metrics.cache_bytes.fetch_sub(used, Relaxed);
    }
}

/// What [`begin`] learned from the request.
pub(crate) struct Negotiated {
    comp: Rc<Compressor>,
    /// The codec to encode with (`None`: the client prefers or needs the identity).
    codec: Option<Codec>,
    /// Acceptable codecs, best first (for sidecars).
    ranked: Vec<Codec>,
    head: bool,
    range: bool,
    /// An `If-None-Match` tag of the chosen codec's variant was rewritten to the identity tag.
    stripped: bool,
}

impl Negotiated {
    /// Whether [`finish`] may look for the response's file (`StaticFile`: its sidecars, its
    /// cached variants): only when a codec was chosen.
    pub(crate) fn wants_file(&self) -> bool {
        self.codec.is_some()
    }
}

/// Negotiates for a request and rewrites its `If-None-Match` (see the module documentation).
/// `None` when compression is off.
pub(crate) fn begin<B>(comp: Option<&Rc<Compressor>>, req: &mut Request<B>) -> Option<Negotiated> {
    let comp = comp?;
    let values = req
        .headers()
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok());
    let ae = AcceptEncoding::parse(values);
    let codec = ae.choose(&comp.cfg().codecs);
    let ranked = match codec {
        Some(_) => ae.ranked(&comp.cfg().codecs),
        None => Vec::new(),
    };
    let mut stripped = false;
    if let Some(c) = codec {
        let inm: Vec<HeaderValue> = req
            .headers()
            .get_all(header::IF_NONE_MATCH)
            .iter()
            .cloned()
            .collect();
        if !inm.is_empty() {
            let mut out = Vec::new();
            for v in &inm {
                match v.to_str().ok().and_then(|s| strip_suffix_in_list(s, c)) {
                    Some(new) => {
                        stripped = true;
                        match HeaderValue::from_str(&new) {
                            Ok(h) => out.push(h),
                            Err(_) => out.push(v.clone()),
                        }
                    }
                    None => out.push(v.clone()),
                }
            }
            if stripped {
                req.headers_mut().remove(header::IF_NONE_MATCH);
                for v in out {
                    req.headers_mut().append(header::IF_NONE_MATCH, v);
                }
            }
        }
    }
    Some(Negotiated {
        comp: comp.clone(),
        codec,
        ranked,
        head: req.method() == Method::HEAD,
        range: req.headers().contains_key(header::RANGE),
        stripped,
    })
}

/// The tag list with `codec`'s suffix removed from every tag that has it; `None` when no tag
/// has it (or the list is malformed).
fn strip_suffix_in_list(list: &str, codec: Codec) -> Option<String> {
    let suffix = format!("-{}\"", codec.token());
    let mut changed = false;
    let out: Vec<String> = crate::files::entity_tags(list)?
        .into_iter()
        .map(|t| match t.strip_suffix(&suffix) {
            Some(base) if base.ends_with(|c| c != '"') && base.contains('"') => {
                changed = true;
                format!("{base}\"")
            }
            _ => t.to_owned(),
        })
        .collect();
    changed.then(|| out.join(", "))
}

/// The ETag of `codec`'s variant of a representation tagged `etag`: the codec appended
/// inside the quotes, and weak (as nginx does): the encoded bytes are semantically, not
/// byte-for-byte, the same from one response to the next (pipelined chunks may be encoded
/// differently), and ranges are never served from an encoded variant.
fn encoded_etag(etag: &HeaderValue, codec: Codec) -> Option<HeaderValue> {
    let s = etag.to_str().ok()?;
    let base = s.strip_suffix('"')?;
    if !base.contains('"') {
        return None;
    }
    let weak = if base.starts_with("W/") { "" } else { "W/" };
    HeaderValue::from_str(&format!("{weak}{base}-{}\"", codec.token())).ok()
}

fn add_vary(h: &mut HeaderMap) {
    let present = h.get_all(header::VARY).iter().any(|v| {
        v.to_str().is_ok_and(|s| {
            s.split(',')
                .any(|t| t.trim() == "*" || t.trim().eq_ignore_ascii_case("accept-encoding"))
        })
    });
    if !present {
        h.append(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    }
}

/// Headers of `codec`'s variant: encoding set, ETag suffixed, length of the variant when
/// known (else none), no range support.
fn encode_headers(h: &mut HeaderMap, codec: Codec, len: Option<u64>) {
    h.insert(
        header::CONTENT_ENCODING,
        HeaderValue::from_static(codec.token()),
    );
    match len {
        Some(n) => {
            h.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
        }
        None => {
            h.remove(header::CONTENT_LENGTH);
        }
    }
    h.remove(header::ACCEPT_RANGES);
    if let Some(e) = h.get(header::ETAG).and_then(|e| encoded_etag(e, codec)) {
        h.insert(header::ETAG, e);
    }
}

/// Wraps `resp` according to the negotiation (see the module documentation).
pub(crate) fn finish(
    neg: Option<Negotiated>,
    mut resp: Response<Body>,
    ahead: &ReadAhead,
) -> Response<Body> {
    let Some(neg) = neg else {
        return resp;
    };
    let comp = neg.comp.clone();
    let cfg = comp.cfg();
    let status = resp.status();
    if status == StatusCode::NOT_MODIFIED {
        add_vary(resp.headers_mut());
        if let (true, Some(c)) = (neg.stripped, neg.codec) {
            if let Some(e) = resp
                .headers()
                .get(header::ETAG)
                .and_then(|e| encoded_etag(e, c))
            {
                resp.headers_mut().insert(header::ETAG, e);
            }
        }
        return resp;
    }
    if status != StatusCode::OK && status != StatusCode::PARTIAL_CONTENT {
        return resp;
    }
    if !may_encode(resp.headers(), cfg) {
        return resp;
    }
    add_vary(resp.headers_mut());
    let Some(codec) = neg.codec else {
        return resp;
    };
    if neg.range || status == StatusCode::PARTIAL_CONTENT {
        return resp;
    }
    let len = resp
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .or_else(|| resp.body().size_hint().exact());
    if len.is_some_and(|n| n < cfg.min_size) {
        return resp;
    }
    let file = resp.extensions().get::<StaticFile>().cloned();
    if let Some(f) = &file {
        if cfg.precompressed {
            for &c in &neg.ranked {
                if let Some(sidecar) = open_sidecar(f, c, ahead) {
                    let slen = sidecar.size_hint().exact().unwrap_or(0);
                    comp.metrics().sidecar_hits.fetch_add(1, Relaxed);
                    encode_headers(resp.headers_mut(), c, Some(slen));
                    let m = comp.metrics();
                    m.responses[c.index()].fetch_add(1, Relaxed);
                    if !neg.head {
                        m.bytes_in[c.index()].fetch_add(f.len, Relaxed);
                        m.bytes_out[c.index()].fetch_add(slen, Relaxed);
                        *resp.body_mut() = boxed(sidecar);
                    }
                    return resp;
                }
            }
        }
    }
    let level = cfg.level(codec);
    let mut fill = None;
    // a static file, or a body the proxy cache holds (a hit): its variants are kept
    let stored = resp.extensions().get::<qweb_cache::StoredBody>().copied();
    let source = match (&file, stored) {
        (Some(f), _) => Some((Source::File(f.path.to_path_buf()), f.len, f.mtime)),
        (None, Some(s)) => Some((Source::Stored(s.id), s.len, UNIX_EPOCH)),
        (None, None) => None,
    };
    if let (Some((source, len, mtime)), true) = (source, cfg.cache_size > 0) {
        let key = VariantKey {
            source,
            codec,
            level,
        };
        let hit = comp.with_cache(|c, ev| c.get(&key, len, mtime, ev));
        let m = comp.metrics();
        match hit {
            Some(data) => {
                encode_headers(resp.headers_mut(), codec, Some(data.len() as u64));
                if !neg.head {
                    m.cache_hits.fetch_add(1, Relaxed);
                    m.responses[codec.index()].fetch_add(1, Relaxed);
                    m.bytes_in[codec.index()].fetch_add(len, Relaxed);
                    m.bytes_out[codec.index()].fetch_add(data.len() as u64, Relaxed);
                    *resp.body_mut() = full(data);
                }
                return resp;
            }
            None if !neg.head => {
                m.cache_misses.fetch_add(1, Relaxed);
                fill = Some((key, len, mtime));
            }
            None => {}
        }
    }
    encode_headers(resp.headers_mut(), codec, None);
    if neg.head {
        return resp;
    }
    let params = EncodeParams {
        codec,
        level,
        mode: cfg.mode,
        chunk_size: cfg.chunk_size,
        depth: cfg.depth,
        // Static files and stored bodies never pause on I/O: flushing on a timer would only
        // make the chunk boundaries (so the encoded bytes behind one ETag) depend on timing.
        flush_after: if file.is_some() || stored.is_some() {
            None
        } else if resp.extensions().get::<qweb_proxy::Unbuffered>().is_some() {
            // an event stream: every pause of the upstream is a flush
            Some(std::time::Duration::ZERO)
        } else {
            Some(cfg.flush_interval)
        },
    };
    let offloader = comp.offloader.clone();
    let metrics = comp.shared.metrics.clone();
    resp.map(|b| {
        let body = CompressBody::new(b, params, offloader, metrics);
        match fill {
            Some((key, size, mtime)) => {
                let limit = comp.cfg().cache_size;
                let c = comp.clone();
                boxed(body.with_sink(
                    limit,
                    Box::new(move |data| {
                        c.with_cache(|cache, ev| cache.insert(key, size, mtime, data, ev));
                    }),
                ))
            }
            None => boxed(body),
        }
    })
}

/// Whether a response with headers `h` may be encoded: not already encoded (a proxied
/// encoding passes through), of a compressible type, and without `Cache-Control:
/// no-transform`.
fn may_encode(h: &HeaderMap, cfg: &CompressionConfig) -> bool {
    let encoded = h
        .get(header::CONTENT_ENCODING)
        .is_some_and(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
    let compressible = h
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| cfg.compressible(t));
    let no_transform = h.get_all(header::CACHE_CONTROL).iter().any(|v| {
        v.to_str().is_ok_and(|s| {
            s.split(',')
                .any(|d| d.trim().eq_ignore_ascii_case("no-transform"))
        })
    });
    !encoded && compressible && !no_transform
}

/// `path` + `.gz`/`.br`/`.zst`, when it is a regular file at least as new as the original
/// (`gzip -k` keeps the original's mtime), as a body (of its length). Opened beneath the
/// route's root like the original (a sidecar symlink is followed only as the route's
/// `symlinks` allows), and streamed by the static handler's own [`FileBody`] (the same
/// chunk sizes, the same per-worker bound on held files).
fn open_sidecar(f: &StaticFile, codec: Codec, ahead: &ReadAhead) -> Option<FileBody> {
    let ext = match codec {
        Codec::Gzip => "gz",
        Codec::Brotli => "br",
        Codec::Zstd => "zst",
    };
    let mut name = f.rel.as_os_str().to_owned();
    name.push(".");
    name.push(ext);
    let file = f.root.open(Path::new(&name)).ok()?;
    let meta = file.metadata().ok()?;
    let smtime = meta.modified().unwrap_or(UNIX_EPOCH);
    if !meta.is_file() || smtime < f.mtime {
        return None;
    }
    let source = Reopen {
        root: f.root.clone(),
        rel: Path::new(&name).into(),
        identity: Identity::of(&meta),
    };
    Some(FileBody::new(file, source, 0, meta.len(), ahead.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entity_tag_lists() {
        assert_eq!(
            strip_suffix_in_list("\"x-gzip\", W/\"y-gzip\", \"z-br\"", Codec::Gzip).unwrap(),
            "\"x\", W/\"y\", \"z-br\""
        );
        assert!(strip_suffix_in_list("\"x-br\"", Codec::Gzip).is_none());
        // a tag that is only the suffix is not stripped to an empty tag
        assert!(strip_suffix_in_list("\"-gzip\"", Codec::Gzip).is_none());
        let e = HeaderValue::from_static("W/\"abc\"");
        assert_eq!(encoded_etag(&e, Codec::Zstd).unwrap(), "W/\"abc-zstd\"");
        let e = HeaderValue::from_static("\"abc\"");
        assert_eq!(encoded_etag(&e, Codec::Gzip).unwrap(), "W/\"abc-gzip\"");
        assert!(encoded_etag(&HeaderValue::from_static("abc"), Codec::Zstd).is_none());
    }

    /// Sidecars are streamed by the static handler's `FileBody` (issue 21: a copy of it read
    /// fixed 64 KiB frames and so held 64 KiB, and an fd, per stalled HTTP/2 stream).
    #[tokio::test]
    async fn a_sidecar_is_streamed_as_a_static_file_is() {
        use crate::config::{OpenMethod, Symlinks};
        use crate::files::body::FIRST_CHUNK;
        use http_body_util::BodyExt;
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("x.txt"), "original").unwrap();
        let gz: Vec<u8> = (0..200 * 1024).map(|i| (i % 253) as u8).collect();
        std::fs::write(t.path().join("x.txt.gz"), &gz).unwrap();
        let root =
            crate::files::Root::open_dir(t.path(), Symlinks::InsideRoot, OpenMethod::Auto).unwrap();
        let f = StaticFile {
            path: t.path().join("x.txt").into(),
            root: Arc::new(root),
            rel: Path::new("x.txt").into(),
            len: 8,
            mtime: UNIX_EPOCH,
        };
        let mut body: FileBody = open_sidecar(&f, Codec::Gzip, &ReadAhead::default()).unwrap();
        assert!(open_sidecar(&f, Codec::Brotli, &ReadAhead::default()).is_none());
        assert_eq!(body.size_hint().exact(), Some(gz.len() as u64));
        let mut frames = Vec::new();
        while let Some(fr) = body.frame().await {
            frames.push(fr.unwrap().into_data().unwrap());
        }
        assert_eq!(frames[0].len(), FIRST_CHUNK);
        assert_eq!(frames.concat(), gz);
    }

    #[test]
    fn vary_is_added_once() {
        let mut h = HeaderMap::new();
        add_vary(&mut h);
        add_vary(&mut h);
        assert_eq!(h.get_all(header::VARY).iter().count(), 1);
        let mut h = HeaderMap::new();
        h.insert(header::VARY, HeaderValue::from_static("Origin"));
        add_vary(&mut h);
        assert_eq!(h.get_all(header::VARY).iter().count(), 2);
        let mut h = HeaderMap::new();
        h.insert(header::VARY, HeaderValue::from_static("*"));
        add_vary(&mut h);
        assert_eq!(h.get_all(header::VARY).iter().count(), 1);
    }
}
